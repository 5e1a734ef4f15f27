"""A fake LLM provider on loopback: requests and tokens limited at once, both announced.

``POST /v1/complete`` with ``{"prompt_tokens": p, "max_tokens": m}`` spends one
request and ``p + m`` tokens from two token buckets (each full at its limit,
refilled continuously over *window* seconds, as the providers describe theirs).
With room in both it answers 200 with ``{"usage": {"prompt_tokens": p,
"completion_tokens": c, "total_tokens": p + c}}``, where ``c`` is ``m`` less a
quarter (the unused part of the tokens is given back to its bucket, as real
providers settle on the usage); without, 429 with ``retry-after-ms``. Every
answer carries the buckets in OpenAI's ``x-ratelimit-*`` fields (Go
durations), Anthropic's ``anthropic-ratelimit-*`` fields (RFC 3339 resets), or
both (*family*). ``GET /counts`` says what it admitted and refused, and over how long.

Run it with `provider` (a subprocess, its base URL while it runs), or as
``python tests/llm_provider.py PORT REQUESTS TOKENS WINDOW FAMILY``.
"""

from __future__ import annotations

import datetime
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from loopback import free_port, listening

NS = 1_000_000_000


class Bucket:
    """A token bucket of *limit*, refilled in *window_ns*, in exact integer ns."""

    def __init__(self, limit: int, window_ns: int) -> None:
        self.limit = limit
        self.per_token = window_ns // limit  # ns a token takes to refill
        self.tat = 0  # when it is full again (ns of the monotonic clock)

    def left(self, now: int) -> int:
        return self.limit - -(-max(0, self.tat - now) // self.per_token)

    def full_in(self, now: int) -> int:
        return max(0, self.tat - now)

    def spend(self, now: int, cost: int) -> None:
        self.tat = max(self.tat, now) + cost * self.per_token

    def give_back(self, cost: int) -> None:
        self.tat -= cost * self.per_token


def go_duration(ns: int) -> str:
    """*ns* as a Go duration, whole ms rounded up (``1.234s``, ``0s``)."""
    ms = -(-ns // 1_000_000)
    return f"{ms // 1000}.{ms % 1000:03d}s" if ms else "0s"


def rfc3339(wall_ns: int) -> str:
    whole, frac = divmod(wall_ns, NS)
    stamp = datetime.datetime.fromtimestamp(whole, datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


class Provider:
    """The two buckets and the counts, under one lock."""

    def __init__(self, requests: int, tokens: int, window: float, family: str) -> None:
        window_ns = round(window * NS)
        self.buckets = {
            "requests": Bucket(requests, window_ns),
            "tokens": Bucket(tokens, window_ns),
        }
        self.family = family
        self.lock = threading.Lock()
        # What it admitted and refused, and the ms from its first admission to its last.
        self.counts = {"ok": 0, "refused": 0, "tokens": 0, "span_ms": 0}
        self.first = -1

    def answer(self, prompt: int, most: int) -> tuple[int, dict[str, str], dict[str, object]]:
        with self.lock:
            now = time.monotonic_ns()
            wall = time.time_ns()
            requests, tokens = self.buckets["requests"], self.buckets["tokens"]
            cost = prompt + most
            if requests.left(now) >= 1 and tokens.left(now) >= cost:
                requests.spend(now, 1)
                tokens.spend(now, cost)
                used = most - most // 4
                tokens.give_back(most - used)
                self.counts["ok"] += 1
                self.counts["tokens"] += prompt + used
                self.first = now if self.first < 0 else self.first
                self.counts["span_ms"] = (now - self.first) // 1_000_000
                status = 200
                body: dict[str, object] = {"usage": {
                    "prompt_tokens": prompt, "completion_tokens": used,
                    "total_tokens": prompt + used,
                }}  # fmt: skip
            else:
                self.counts["refused"] += 1
                status, body = 429, {"error": "rate limited"}
            headers: dict[str, str] = {}
            wait = 0
            for name, bucket in self.buckets.items():
                left, full_in = bucket.left(now), bucket.full_in(now)
                need = 1 if name == "requests" else cost
                wait = max(wait, bucket.tat - now - (bucket.limit - need) * bucket.per_token)
                if self.family in {"openai", "both"}:
                    headers[f"x-ratelimit-limit-{name}"] = str(bucket.limit)
                    headers[f"x-ratelimit-remaining-{name}"] = str(left)
                    headers[f"x-ratelimit-reset-{name}"] = go_duration(full_in)
                if self.family in {"anthropic", "both"}:
                    headers[f"anthropic-ratelimit-{name}-limit"] = str(bucket.limit)
                    headers[f"anthropic-ratelimit-{name}-remaining"] = str(left)
                    headers[f"anthropic-ratelimit-{name}-reset"] = rfc3339(wall + full_in)
            if status == 429:
                headers["retry-after-ms"] = str(-(-max(wait, 0) // 1_000_000))
            return status, headers, body


def handler_for(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, headers: dict[str, str], body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            # No Date: its whole seconds would blur the RFC 3339 resets, which the
            # client then reads against its own clock (the same machine's).
            self.send_response_only(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            asked = json.loads(self.rfile.read(int(self.headers["content-length"])))
            self._send(*provider.answer(int(asked["prompt_tokens"]), int(asked["max_tokens"])))

        def do_GET(self) -> None:
            with provider.lock:
                counts: dict[str, object] = dict(provider.counts)
            self._send(200, {}, counts)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet

    return Handler


def serve(port: int, requests: int, tokens: int, window: float, family: str) -> None:
    provider = Provider(requests, tokens, window, family)
    server = ThreadingHTTPServer(("127.0.0.1", port), handler_for(provider))
    server.daemon_threads = True
    server.serve_forever()


@contextmanager
def provider(requests: int, tokens: int, window: float, family: str = "both") -> Iterator[str]:
    """The provider's base URL while it runs in a subprocess on loopback."""
    port = free_port()
    argv = [sys.executable, str(Path(__file__)), str(port), str(requests), str(tokens)]
    with listening([*argv, str(window), family], port) as url:
        yield url


if __name__ == "__main__":
    port, requests, tokens, window, family = sys.argv[1:6]
    serve(int(port), int(requests), int(tokens), float(window), family)

"""Outbound CPU: what the pacing adds to each request, over httpx's MockTransport.

    PYTHONPATH=src python benchmarks/bench_outbound_cpu.py [--n 20000 --runs 5]
    PYTHONPATH=src python benchmarks/bench_outbound_cpu.py --callgrind [--requests 2000]

Per run, the same GETs through a plain client and through
`RateLimitedTransport` / `AsyncRateLimitedTransport` at a limit never
reached (so no wait): the difference is the key, the ticket, the send loop
and the reading of the answer's fields. Printed: µs added per request, the
median of the runs, then each run. Compare two trees by running it with
each on PYTHONPATH, alternately.

``--callgrind`` counts instructions instead (valgrind, as
benchmarks/callgrind.py does: ``(I(2N) - I(N)) / N`` after a warm-up, with
``PYTHONHASHSEED=0``), for sync requests through: a plain client; a minimal
transport of six lines that calls ``TokenBucket.allow()``; ours. Each is
answered with four ordinary fields (a server's usual), and again with
``RateLimit-Policy`` and ``RateLimit`` beside them (a limit never reached):
httpx's own work per field counts in every case alike; last, with a
``RateLimit`` whose remaining changes with every answer. Printed:
instructions per request, and what each adds over the plain client and
over the minimal transport with the same answers; and answered with
``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` alone, a remaining that
changes every time (a rate learned, not announced); and with an LLM provider's
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (Go durations), all
but the limits changing every time. Two floors beside them (cases ``keyed``,
``keyed_names``): the minimal transport with the default key (`host_key`), and
with one look at the answer's names through httpx's public API as well (its
``Headers.raw``, the names joined, a dict lookup): what any pacing by host that
reads the answer pays before it decides anything.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from nanobucket.httpx import AsyncRateLimitedTransport, RateLimitedTransport

UNREACHED = {"rate": 10**9, "capacity": 10**9}


def _ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200)


def _sync_us(n: int) -> float:
    plain = httpx.Client(transport=httpx.MockTransport(_ok))
    paced = httpx.Client(transport=RateLimitedTransport(httpx.MockTransport(_ok), **UNREACHED))
    times = []
    for client in (plain, paced):
        start = time.perf_counter()
        for _ in range(n):
            client.get("http://h/")
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) / n * 1e6


async def _async_us(n: int) -> float:
    plain = httpx.AsyncClient(transport=httpx.MockTransport(_ok))
    transport = AsyncRateLimitedTransport(httpx.MockTransport(_ok), **UNREACHED)
    paced = httpx.AsyncClient(transport=transport)
    times = []
    for client in (plain, paced):
        start = time.perf_counter()
        for _ in range(n):
            await client.get("http://h/")
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) / n * 1e6


# One program per case: *n* requests after a warm-up of 200 (argv[1] is n).
PROGRAM = """
import sys
from operator import itemgetter
import httpx
from nanobucket import TokenBucket
from nanobucket.httpx import RateLimitedTransport, host_key

USUAL = [("content-type", "application/json"), ("content-length", "2"),
         ("date", "Wed, 21 Oct 2015 07:28:00 GMT"), ("server", "uvicorn")]
LIMITS = [("ratelimit-policy", '"default";q=1000000;w=1'),
          ("ratelimit", '"default";r=500000;t=1')]
FIELDS = USUAL + LIMITS if "{kind}" == "fields" else USUAL
VARYING = [USUAL + [LIMITS[0], ("ratelimit", f'"default";r={{r}};t=1')]
           for r in range(401000, 400000, -1)]  # a remaining that falls, 1000 texts
# X-RateLimit-* alone (no rate said): a remaining that falls from 999 to 500, twice
LEGACY = [USUAL + [("x-ratelimit-limit", "1000"), ("x-ratelimit-remaining", str(999 - r % 500)),
                   ("x-ratelimit-reset", "1")] for r in range(1000)]
# An LLM provider's budgets, OpenAI-style (Go durations): requests and tokens, never
# exhausted, every field but the limits changing with every answer
LLM = [USUAL + [("x-ratelimit-limit-requests", "500"), ("x-ratelimit-limit-tokens", "30000"),
                ("x-ratelimit-remaining-requests", str(499 - r % 250)),
                ("x-ratelimit-remaining-tokens", str(29963 - 37 * (r % 250))),
                ("x-ratelimit-reset-requests", f"{{120 + r % 250 * 4}}ms"),
                ("x-ratelimit-reset-tokens", f"{{r % 250 // 60}}m{{r % 60}}.{{r % 1000:03d}}s")]
       for r in range(1000)]
# Anthropic-style: four budgets, RFC 3339 resets in whole seconds (each text sent for 25
# answers, as a server answering 25 a second sends it), read against the Date; made for
# its case alone (a larger heap costs every case's collections more)
ANTHROPIC = "{kind}" == "anthropic" and [USUAL + [
    (f"anthropic-ratelimit-{{budget}}-{{field}}", value)
    for budget, limit, used, reset in [
        ("requests", 500, 1, f"2015-10-21T07:28:{{r // 25 % 60:02d}}Z"),
        ("tokens", 30000, 37, f"2015-10-21T07:29:{{(r // 25 + 7) % 60:02d}}Z"),
        ("input-tokens", 20000, 30, f"2015-10-21T07:29:{{(r // 25 + 7) % 60:02d}}Z"),
        ("output-tokens", 10000, 7, f"2015-10-21T07:29:{{(r // 25 + 7) % 60:02d}}Z")]
    for field, value in [("limit", str(limit)), ("remaining", str(limit - 1 - used * (r % 250))),
                         ("reset", reset)]]
    for r in range(1000)]
CHANGING = {{"varying": VARYING, "legacy": LEGACY, "llm": LLM, "anthropic": ANTHROPIC}}.get(
    "{kind}")
turn = 0


def answer(request):
    global turn
    if CHANGING is not None:
        turn += 1
        return httpx.Response(200, headers=CHANGING[turn % 1000])
    return httpx.Response(200, headers=FIELDS)


class Minimal(httpx.BaseTransport):
    def __init__(self, inner):
        self.inner, self.bucket = inner, TokenBucket(10**9, 10**9)

    def handle_request(self, request):
        if not self.bucket.allow():
            raise RuntimeError("limited")
        return self.inner.handle_request(request)


# The floor of a key's pacing: its default key, then allow() and send
class Keyed(Minimal):
    def handle_request(self, request):
        host_key(request)
        if not self.bucket.allow():
            raise RuntimeError("limited")
        return self.inner.handle_request(request)


# and one look at the answer's names through httpx's public API, remembered
class KeyedNames(Minimal):
    def handle_request(self, request):
        host_key(request)
        if not self.bucket.allow():
            raise RuntimeError("limited")
        answer = self.inner.handle_request(request)
        SEEN.get(b"\\n".join(map(itemgetter(0), answer.headers.raw)))
        return answer


SEEN = {{}}
mock = httpx.MockTransport(answer)
transport = {transport}
client = httpx.Client(transport=transport)
for _ in range(200):
    client.get("http://h/")
for _ in range(int(sys.argv[1])):
    client.get("http://h/")
"""
OURS = "RateLimitedTransport(mock, rate=10**9, capacity=1000)"
# name -> (what, transport, answered with: "" no rate-limit fields, "_fields" the same
# ones every time, "_varying" a remaining that changes with every answer, "_legacy" one
# in X-RateLimit-* fields alone, "_llm" an LLM provider's budgets, OpenAI-style, and
# "_anthropic" Anthropic-style)
CASES = {
    "plain": ("plain client over MockTransport", "mock", ""),
    "minimal": ("minimal transport: allow() then send", "Minimal(mock)", ""),
    "ours": ("RateLimitedTransport, no rate-limit fields", OURS, ""),
    "keyed": ("floor: host_key, then allow() and send", "Keyed(mock)", ""),
    "keyed_names": ("floor: and the answer's names read", "KeyedNames(mock)", ""),
    "plain_fields": ("plain client, answers with RateLimit fields", "mock", "_fields"),
    "minimal_fields": ("minimal transport, the same answers", "Minimal(mock)", "_fields"),
    "ours_fields": ("RateLimitedTransport, the same answers", OURS, "_fields"),
    "minimal_varying": ("minimal, RateLimit r= changing each time", "Minimal(mock)", "_varying"),
    "ours_varying": ("RateLimitedTransport, the same answers", OURS, "_varying"),
    "minimal_legacy": ("minimal, X-RateLimit-* only, changing", "Minimal(mock)", "_legacy"),
    "ours_legacy": ("RateLimitedTransport, the same answers", OURS, "_legacy"),
    "minimal_llm": ("minimal, x-ratelimit-*-requests/-tokens", "Minimal(mock)", "_llm"),
    "ours_llm": ("RateLimitedTransport, the same answers", OURS, "_llm"),
    "minimal_anthropic": (
        "minimal, anthropic-ratelimit-*, 4 budgets",
        "Minimal(mock)",
        "_anthropic",
    ),
    "ours_anthropic": ("RateLimitedTransport, the same answers", OURS, "_anthropic"),
}


def _callgrind(requests: int, cases: list[str]) -> None:
    from callgrind import instructions  # benchmarks/callgrind.py, beside this file

    counts = {}
    for name, (_, transport, fields) in CASES.items():
        if name not in cases:
            continue
        code = PROGRAM.format(transport=transport, kind=fields[1:])
        counts[name] = (instructions(code, 2 * requests) - instructions(code, requests)) / requests
    print(f"instructions per sync request, (I(2N) - I(N)) / N with N = {requests:,}")
    print(f"  {'':44} {'total':>9} {'over plain':>11} {'over minimal':>13}")
    for name, (what, _, fields) in CASES.items():
        if name not in counts:
            continue
        n = counts[name]
        plain, minimal = counts.get("plain" + fields), counts.get("minimal" + fields)
        over = f"{n - plain:11.0f}" if plain is not None else f"{'':11}"
        more = (
            f"{n - minimal:13.0f}"
            if minimal is not None and name.startswith(("ours", "keyed"))
            else ""
        )
        print(f"  {what:44} {n:9.0f} {over} {more}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true", help="count instructions")
    parser.add_argument("--requests", type=int, default=2000, help="N for --callgrind")
    parser.add_argument("--cases", default=",".join(CASES), help="for --callgrind")
    args = parser.parse_args()
    if args.callgrind:
        _callgrind(args.requests, args.cases.split(","))
        return
    runs: dict[str, list[float]] = {"sync": [], "async": []}
    for _ in range(args.runs):
        runs["sync"].append(_sync_us(args.n))
        runs["async"].append(asyncio.run(_async_us(args.n)))
    for kind, added in runs.items():
        each = " ".join(f"{x:.2f}" for x in added)
        print(f"{kind:5} +{statistics.median(added):.2f} µs/request  ({each})")


if __name__ == "__main__":
    main()

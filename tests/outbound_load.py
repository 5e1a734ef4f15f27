"""A real limited API on loopback and a client that calls it with wrong limits.

`api_server` starts ``apps/outbound_app.py`` (50 req/s, bursts of 10, per
``X-API-Key``) under uvicorn; `drive` runs *workers* threads (or asyncio
tasks) of a client configured at 500/s for *seconds*, through
`nanobucket.httpx`, or `nanobucket.requests` with ``kind="requests"``, and
counts what came back. Shared by tests/test_httpx_transport.py and
benchmarks/bench_outbound.py.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import requests
from loopback import free_port, listening

from nanobucket.httpx import AsyncRateLimitedTransport, RateLimitedTransport
from nanobucket.requests import RateLimitedAdapter

APPS = Path(__file__).parent / "apps"
SERVER_RATE, SERVER_BURST = 50, 10
CLIENT_RATE, CLIENT_CAPACITY = 500, 50  # the wrong local limit


@contextmanager
def api_server(fields: str, log: Path, rate: int = SERVER_RATE) -> Iterator[str]:
    """The API's base URL while it runs (``fields``: ietf, retry-after, x-ratelimit, or
    sliding: a sliding window of *rate* per second instead of a bucket of *rate*/s)."""
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "outbound_app:app", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    env = {**os.environ, "NB_OUT_FIELDS": fields, "NB_OUT_RATE": str(rate)}
    with (
        open(log, "wb") as out,
        listening(argv, port, log.read_text, cwd=APPS, env=env, stdout=out, stderr=out) as url,
    ):
        yield url


@dataclass
class Run:
    """What one run of the client saw."""

    seconds: float = 0.0  # from the first request sent to the last answer
    statuses: list[tuple[float, int]] = field(default_factory=list)  # (time answered, status)
    sent: list[float] = field(default_factory=list)  # when each request left the client
    errors: list[BaseException] = field(default_factory=list)

    @property
    def admitted(self) -> int:
        return sum(1 for _, s in self.statuses if s == 200)

    @property
    def limited(self) -> int:
        return sum(1 for _, s in self.statuses if s == 429)

    @property
    def limited_after_first(self) -> int:
        """429s answered after the first one (that one not counted)."""
        return max(0, self.limited - 1)

    @property
    def answered_after_first(self) -> int:
        """Answers after the first 429 (all of them when there was none)."""
        times = [t for t, s in self.statuses if s == 429]
        if not times:
            return len(self.statuses)
        return sum(1 for t, _ in self.statuses if t > times[0])


class _Recorder(httpx.BaseTransport):
    """The inner transport, noting when each request really leaves."""

    def __init__(self, run: Run, lock: threading.Lock) -> None:
        self.inner = httpx.HTTPTransport()
        self.run, self.lock = run, lock

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.run.sent.append(time.monotonic())
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


class _AsyncRecorder(httpx.AsyncBaseTransport):
    def __init__(self, run: Run) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.run = run

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.run.sent.append(time.monotonic())
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def drive(url: str, api_key: str, kind: str, workers: int, seconds: float) -> Run:
    """*workers* callers of *url* for *seconds*: ``kind`` is sync, async or requests."""
    if kind == "async":
        return asyncio.run(_drive_async(url, api_key, workers, seconds))
    run, lock = Run(), threading.Lock()
    headers = {"X-API-Key": api_key}
    if kind == "requests":
        session = requests.Session()
        adapter = RateLimitedAdapter(
            rate=CLIENT_RATE, capacity=CLIENT_CAPACITY, pool_maxsize=workers
        )
        session.mount("http://", adapter)

        def call() -> int:
            with lock:
                run.sent.append(time.monotonic())
            return session.get(url + "/", headers=headers, timeout=10).status_code

        close = session.close
    else:
        transport = RateLimitedTransport(
            _Recorder(run, lock), rate=CLIENT_RATE, capacity=CLIENT_CAPACITY
        )
        client = httpx.Client(
            transport=transport, headers=headers, timeout=10,
            limits=httpx.Limits(max_connections=workers),
        )  # fmt: skip

        def call() -> int:
            return client.get(url + "/").status_code

        close = client.close
    t0 = time.monotonic()
    stop = t0 + seconds

    def worker() -> None:
        try:
            while time.monotonic() < stop:
                status = call()
                with lock:
                    run.statuses.append((time.monotonic(), status))
        except BaseException as exc:  # reported in run.errors
            run.errors.append(exc)

    pool = [threading.Thread(target=worker) for _ in range(workers)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(seconds + 60)
    run.seconds = time.monotonic() - t0
    close()
    return run


async def _drive_async(url: str, api_key: str, workers: int, seconds: float) -> Run:
    run = Run()
    transport = AsyncRateLimitedTransport(
        _AsyncRecorder(run), rate=CLIENT_RATE, capacity=CLIENT_CAPACITY
    )
    async with httpx.AsyncClient(
        transport=transport, headers={"X-API-Key": api_key}, timeout=10
    ) as client:
        t0 = time.monotonic()
        stop = t0 + seconds

        async def worker() -> None:
            try:
                while time.monotonic() < stop:
                    status = (await client.get(url + "/")).status_code
                    run.statuses.append((time.monotonic(), status))
            except Exception as exc:  # reported in run.errors
                run.errors.append(exc)

        await asyncio.gather(*(worker() for _ in range(workers)))
        run.seconds = time.monotonic() - t0
    return run


def server_counts(url: str) -> dict[str, int]:
    """The server's own counters (admitted, limited, ...)."""
    counts: dict[str, int] = httpx.get(url + "/stats", timeout=10).json()
    return counts

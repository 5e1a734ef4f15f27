"""Limited APIs as exact models, and clients of them run in virtual time.

Three servers enforce *q* requests per *w* seconds and announce it as
``RateLimit-Policy: "p";q=<q>;w=<w>`` with ``RateLimit: "p";r=<left>;t=<reset>``
and, on a 429, ``Retry-After`` (whole seconds, at least 1, as most servers
send it); or, made with ``legacy=True``, only ``X-RateLimit-Limit`` (the
capacity), ``-Remaining`` and ``-Reset`` (whole seconds until full), as a
server that never says its rate:

* `SlidingWindow`: at most *q* in any window ``(t - w, t]`` (a sliding log).
* `FixedWindow`: at most *q* in each ``[k*w, (k+1)*w)``; reset at its end.
* `TokenBucketServer`: capacity *burst*, *rate* per second, announced as
  nanobucket's own middleware does (``w`` = the time to fill, at least 1 s;
  ``q = floor(rate * w)``).

`simulate` runs *workers* asyncio tasks of an `AsyncRateLimitedTransport`
against one of them on a `VirtualLoop`, whose clock moves only when every
task waits: a run of minutes takes a fraction of a second, and the same
arguments give the same answers, request for request. Each request takes
*latency* ns (a seeded random draw in a range) to reach the server and as
long to come back. Shared by tests/test_window_pacing.py and
benchmarks/bench_outbound.py's servers.
"""

from __future__ import annotations

import asyncio
import math
import random
import selectors
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, TypeVar

import httpx

NS = 1_000_000_000
T = TypeVar("T")


def _seconds_up(ns: int) -> int:
    return -(-ns // NS)


class Server:
    """A limited API: ``decide(now)`` is its answer to a request arriving at *now* (ns)."""

    name = "p"
    q: int
    w: int  # whole seconds
    legacy = False  # True: ``X-RateLimit-Limit/Remaining/Reset`` only, no Retry-After

    @property
    def limit(self) -> int:
        """What ``X-RateLimit-Limit`` says: the most admitted at once."""
        return self.q

    def decide(self, now: int) -> tuple[int, dict[str, str]]:
        raise NotImplementedError

    def _fields(self, left: int, reset_ns: int, retry_ns: int | None) -> dict[str, str]:
        if self.legacy:
            # As nanobucket's middleware with ``headers="legacy"`` sends them: the
            # capacity, the tokens left, whole seconds until full; no rate at all.
            return {
                "X-RateLimit-Limit": str(self.limit),
                "X-RateLimit-Remaining": str(left),
                "X-RateLimit-Reset": str(_seconds_up(max(reset_ns, 0))),
            }
        fields = {
            "RateLimit-Policy": f'"{self.name}";q={self.q};w={self.w}',
            "RateLimit": f'"{self.name}";r={left};t={_seconds_up(max(reset_ns, 0))}',
        }
        if retry_ns is not None:
            fields["Retry-After"] = str(max(1, _seconds_up(retry_ns)))
        return fields


class SlidingWindow(Server):
    """At most *q* requests admitted in any ``(t - w, t]``; a 429 waits for the oldest."""

    def __init__(self, q: int, w: int, legacy: bool = False) -> None:
        self.q, self.w, self.legacy = q, w, legacy
        self.log: deque[int] = deque()

    def decide(self, now: int) -> tuple[int, dict[str, str]]:
        window = self.w * NS
        while self.log and self.log[0] <= now - window:
            self.log.popleft()
        if len(self.log) < self.q:
            self.log.append(now)
            return 200, self._fields(self.q - len(self.log), self.log[0] + window - now, None)
        free_at = self.log[0] + window - now  # when the oldest leaves the window
        return 429, self._fields(0, free_at, free_at)


class FixedWindow(Server):
    """At most *q* requests in each ``[k*w, (k+1)*w)`` of the server's clock."""

    def __init__(self, q: int, w: int, legacy: bool = False) -> None:
        self.q, self.w, self.legacy = q, w, legacy
        self.window, self.count = -1, 0

    def decide(self, now: int) -> tuple[int, dict[str, str]]:
        window = self.w * NS
        k = now // window
        if k != self.window:
            self.window, self.count = k, 0
        reset = (k + 1) * window - now
        if self.count < self.q:
            self.count += 1
            return 200, self._fields(self.q - self.count, reset, None)
        return 429, self._fields(0, reset, reset)


class TokenBucketServer(Server):
    """A token bucket of *burst* tokens refilled at *rate* per second, exact (Fractions)."""

    def __init__(self, rate: int, burst: int, legacy: bool = False) -> None:
        self.rate, self.burst, self.legacy = Fraction(rate), burst, legacy
        self.w = max(1, math.ceil(burst / self.rate))
        self.q = max(1, math.floor(self.rate * self.w))
        self.tokens, self.at = Fraction(burst), 0

    def decide(self, now: int) -> tuple[int, dict[str, str]]:
        self.tokens = min(Fraction(self.burst), self.tokens + self.rate * (now - self.at) / NS)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 200, self._fields(math.floor(self.tokens), self._to_full(), None)
        retry = math.ceil((1 - self.tokens) / self.rate * NS)
        return 429, self._fields(0, self._to_full(), retry)

    @property
    def limit(self) -> int:
        return self.burst

    def _to_full(self) -> int:
        return math.ceil((self.burst - self.tokens) / self.rate * NS)


# --------------------------------------------------------------------------
# Virtual time


class VirtualClock:
    """Int ns that the `VirtualLoop` moves when every task waits."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class _Selector(selectors.DefaultSelector):
    """Never blocks: a wait of *timeout* moves the clock by it instead."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready:
            if timeout is None:
                raise RuntimeError("every task waits for something that never comes")
            self.clock.now += math.ceil(timeout * NS)
        return ready


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on a `VirtualClock`: ``asyncio.sleep`` takes no real time."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(_Selector(clock))
        self.clock = clock

    def time(self) -> float:
        return self.clock.now / NS


def run_virtual(clock: VirtualClock, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``main()`` run to its end on a `VirtualLoop` of *clock*."""
    loop = VirtualLoop(clock)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@dataclass
class Simulated:
    """What a simulated client saw: statuses by code, and the times (ns) the server
    admitted and refused requests."""

    seconds: float
    counts: dict[int, int] = field(default_factory=dict)
    admitted_at: list[int] = field(default_factory=list)
    limited_at: list[int] = field(default_factory=list)

    @property
    def admitted(self) -> int:
        return self.counts.get(200, 0)

    @property
    def limited(self) -> int:
        return self.counts.get(429, 0)


def simulate(
    server: Server,
    *,
    workers: int,
    seconds: float,
    latency: tuple[int, int] = (2_000_000, 8_000_000),
    seed: int = 1,
    rate: int = 500,
    capacity: int = 50,
    make: Callable[..., Any] | None = None,
    stall: tuple[int, int] | None = None,
    processes: int = 1,
) -> Simulated:
    """*workers* tasks calling *server* through one transport for *seconds* of virtual time.

    With *processes*, that many transports (each *make*'s, each its own
    client), *workers* tasks each: several processes calling one server.

    *latency*: the range (ns) of each way's delay, drawn with *seed*. *make*
    builds the transport from ``(api, clock=...)``: default an
    `AsyncRateLimitedTransport` at *rate* / *capacity* with no timeout.
    *stall* ``(ns, every)``: the whole process stops for *ns* every *every*
    ns (as a descheduled process or a long GC pause do): the timers due
    meanwhile fire late, together.
    """
    from nanobucket.httpx import AsyncRateLimitedTransport

    clock = VirtualClock(10 * NS)
    draw = random.Random(seed)
    out = Simulated(seconds)
    start = clock.now
    end = start + round(seconds * NS)

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(draw.randint(*latency) / NS)
        status, headers = server.decide(clock.now)
        (out.admitted_at if status == 200 else out.limited_at).append(clock.now - start)
        await asyncio.sleep(draw.randint(*latency) / NS)
        return httpx.Response(status, headers=headers)

    async def stalls(ns: int, every: int) -> None:
        while True:
            await asyncio.sleep(every / NS)
            clock.now += ns  # no task runs meanwhile

    async def main() -> None:
        stalling = asyncio.ensure_future(stalls(*stall)) if stall else None
        api = httpx.MockTransport(handler)
        clients = []
        for _ in range(processes):
            if make is None:
                transport = AsyncRateLimitedTransport(
                    api, rate=rate, capacity=capacity, timeout=None, clock=clock
                )
            else:
                transport = make(api, clock=clock)
            clients.append(httpx.AsyncClient(transport=transport))

        async def worker(client: httpx.AsyncClient) -> None:
            while clock.now < end:
                status = (await client.get("http://api/")).status_code
                out.counts[status] = out.counts.get(status, 0) + 1

        await asyncio.gather(*(worker(c) for c in clients for _ in range(workers)))
        for client in clients:
            await client.aclose()
        if stalling is not None:
            stalling.cancel()

    run_virtual(clock, main)
    return out


def most_in_window(times: list[int], window: int) -> int:
    """The most of *times* (sorted ns) in any ``(t - window, t]``."""
    most, first = 0, 0
    for i, t in enumerate(times):
        while times[first] <= t - window:
            first += 1
        most = max(most, i - first + 1)
    return most

"""Pacing by an announced window: ``q`` per ``w`` never becomes ``2q`` in a window.

Every run here is an exact simulation (tests/server_models.py): a server
model enforcing 50 requests per second, a client configured ten times too
fast, and a virtual clock that moves only when every task waits, so a
minute of traffic takes under a second and each count below is exact.
The client's pacing keeps every 1 s span at <= 50 requests: a sliding
window, fixed windows and a token bucket (10 at 50/s, announced as 50 per
1 s by nanobucket's middleware) all admit every request after the first
answer, at 48/s (96%: 2 at once, then 48 per second).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanobucket.httpx import RateLimitedTransport

from server_models import (
    NS,
    FixedWindow,
    Server,
    SlidingWindow,
    TokenBucketServer,
    most_in_window,
    simulate,
)

SERVERS: dict[str, Callable[[], Server]] = {
    "sliding": lambda: SlidingWindow(50, 1),
    "fixed": lambda: FixedWindow(50, 1),
    "token-bucket": lambda: TokenBucketServer(50, 10),
}


@pytest.mark.parametrize(
    ("server", "workers", "admitted"),
    [
        ("sliding", 1, 2882),
        ("sliding", 8, 2889),
        ("fixed", 1, 2882),
        ("fixed", 8, 2889),
        ("token-bucket", 1, 2882),
        ("token-bucket", 8, 2889),
    ],
)
def test_a_minute_against_50_per_second(server: str, workers: int, admitted: int) -> None:
    run = simulate(SERVERS[server](), workers=workers, seconds=60)
    # Before: rate q/w and capacity q admitted up to 2q a window; against the
    # sliding window that was 25.5/s and a 429 (and a 1 s pause) every 2 s.
    assert run.counts == {200: admitted}
    assert admitted >= 0.95 * 50 * 60
    # What the client's pacing promises, whatever the server counts with.
    assert most_in_window(run.admitted_at, NS) <= 50


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_stalled_process_does_not_bunch_its_requests(server: str) -> None:
    # The process stops 60 ms every 1.3 s: the waiters due meanwhile wake
    # together. Sent as they woke, 3 of them would start a window that ends
    # with the 48 paced after them; before: 21 429s and 31.2/s against the
    # sliding window. Past the burst by the times they really leave, they
    # queue again: no 429, 47.1/s (the stalls take 4.4% of the time).
    run = simulate(SERVERS[server](), workers=8, seconds=60, stall=(60_000_000, 1_300_000_000))
    assert run.counts == {200: 2828}
    assert most_in_window(run.admitted_at, NS) <= 50


def test_sync_one_request_at_a_time_against_each_server() -> None:
    # The sync transport, answered at once: the first request learns the
    # window, its burst of 2 leaves with it, then one every 1/48 s.
    for make in SERVERS.values():
        server, now = make(), [10 * NS]

        def handler(request: httpx.Request, server: Server = server) -> httpx.Response:
            status, headers = server.decide(now[0])
            return httpx.Response(status, headers=headers)

        def sleep(seconds: float) -> None:
            now[0] += round(seconds * NS)

        t = RateLimitedTransport(
            httpx.MockTransport(handler), rate=500, capacity=50,
            clock=lambda: now[0], sleep=sleep,
        )  # fmt: skip
        with httpx.Client(transport=t) as client:
            statuses = [client.get("http://api/").status_code for _ in range(500)]
        assert statuses == [200] * 500
        token = NS // 48 + 1
        assert now[0] == 10 * NS + (500 - 2) * token  # 48/s after the first two


def test_more_callers_than_the_quota_are_refused_only_before_the_first_answer() -> None:
    # 32 requests leave at once, before any answer can say the limit: 10 of
    # a quota of 10 admitted, 22 refused and paused by Retry-After. None
    # after: 9/s (90% of 10/s; one token of 10 is the burst).
    for make in (lambda: SlidingWindow(10, 1), lambda: FixedWindow(10, 1)):
        run = simulate(make(), workers=32, seconds=60, latency=(2_000_000, 40_000_000))
        assert run.counts == {200: 550, 429: 22}
        assert max(run.limited_at) < 50_000_000  # all in the first round trip
        assert most_in_window(run.admitted_at, NS) <= 10


def test_a_window_another_client_filled_costs_one_429() -> None:
    # 40 of the 50 used half a second before the client starts: it learns
    # the window from the first answer (9 left) and paces at 48/s; the
    # window fills after 10 more, one 429 pauses it until the old 40 expire.
    for workers in (1, 8):
        server = SlidingWindow(50, 1)
        server.log.extend(range(10 * NS - NS // 2, 10 * NS - NS // 2 + 40))
        run = simulate(server, workers=workers, seconds=60)
        assert run.limited == 1
        assert run.admitted >= 0.95 * 48 * 59


def test_a_long_window() -> None:
    # 1000 per 10 s (100/s): 50 at once and 95/s, 32 callers.
    for server in (SlidingWindow(1000, 10), FixedWindow(1000, 10)):
        run = simulate(server, workers=32, seconds=60)
        assert run.counts == {200: 5779}  # 96.3/s: the burst of 50, then 95/s
        assert most_in_window(run.admitted_at, 10 * NS) <= 1000


@settings(max_examples=12, deadline=None)
@given(
    quota=st.integers(2, 200),
    window=st.integers(1, 4),
    workers=st.integers(1, 12),
    latency_ms=st.integers(0, 30),
    sliding=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_no_429_after_the_first_round_trip(
    quota: int, window: int, workers: int, latency_ms: int, sliding: bool, seed: int
) -> None:
    """Against either window, any quota, callers and latency: every 429 is an answer to
    a request sent before the first answer came back, and no window ever holds more."""
    server = SlidingWindow(quota, window) if sliding else FixedWindow(quota, window)
    latency = latency_ms * 1_000_000
    run = simulate(
        server, workers=workers, seconds=10, latency=(latency // 2, latency + 1), seed=seed
    )
    assert all(t <= 2 * latency + 1 for t in run.limited_at)
    assert most_in_window(run.admitted_at, window * NS) <= quota

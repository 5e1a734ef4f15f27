"""An outage as a team lives it, on a real redis-server stopped or frozen (SIGSTOP).

* A Redis limiter built without ``on_error`` keeps a limit through an
  outage: a table of its own limit in each process decides (``source``
  ``"fallback"``), so a middleware over it answers 200 and 429, never 500;
  the outage is logged once and every decision it made is counted by the
  metrics.
* What a fallback admits is charged to Redis when it answers again, so
  windows spanning any number of outages (flapping: five 1 s freezes) stay
  within ``capacity + rate * T``, exactly, on the injected clock of the
  ``*_at`` verbs; the charge stops at an empty bucket, never in debt.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry
from werkzeug.test import Client as WerkzeugClient

import nanobucket as nb
from nanobucket import asgi, wsgi
from nanobucket import redis as nbr
from nanobucket.metrics import PrometheusMetrics
from nanobucket.redis import _outage

from conftest import ManualClock
from http_checks import MakeClient, asgi_client
from redis_server import RedisServer
from server_models import most_in_window

__all__ = ("asgi_client",)  # a fixture

S = 1_000_000_000
MS = 1_000_000


def _prefix() -> str:
    return f"outage-{uuid.uuid4().hex}"


def _held(breaker_clock: ManualClock) -> nbr.CircuitBreaker:
    """A breaker on *breaker_clock*: open through an outage until the test moves it 1 s."""
    return nbr.CircuitBreaker(backoff=1.0, max_backoff=1.0, clock=breaker_clock)


class _WsgiClient(WerkzeugClient):
    """Werkzeug's test client, each request from one client address."""

    def get(self, *args: Any, **kw: Any) -> Any:
        return super().get(*args, environ_overrides={"REMOTE_ADDR": "1.2.3.4"}, **kw)


def _wsgi_ok(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [("content-type", "text/plain")])
    return [b"ok"]


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "nanobucket" and r.levelno == logging.WARNING
    ]


# -- the default: a local limit, never a 500 ---------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_middleware_over_a_default_redis_limiter_limits_through_an_outage(
    own_redis_server: RedisServer,
    asgi_client: MakeClient,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    # Built without on_error: it answered 500 (RedisUnavailable) for every request
    # while Redis was down. Now the limit holds in this process: the 2 tokens Redis
    # left, then 429, logged once, every decision counted as the fallback's. The
    # sync limiter behind the WSGI middleware (ASGI refuses it: it would block the loop).
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    cls: Any = nbr.RedisTokenBucket if kind == "sync" else nbr.AsyncRedisTokenBucket
    limiter = cls.from_url(
        own_redis_server.url,
        rate=0.001,  # no refill within the test
        capacity=3,
        prefix=_prefix(),
        breaker=nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0),  # open for the test
    )
    http: Any
    if kind == "sync":
        http = _WsgiClient(wsgi.RateLimitMiddleware(_wsgi_ok, limiter, on_decision=metrics.hook))
    else:
        http = asgi_client(asgi.RateLimitMiddleware(_ok, limiter, on_decision=metrics.hook))
    caplog.set_level(logging.INFO, logger="nanobucket")
    assert http.get("/").status_code == 200  # Redis: 2 left
    own_redis_server.stop()
    responses = [http.get("/") for _ in range(5)]
    assert [r.status_code for r in responses] == [200, 200, 429, 429, 429]
    assert responses[2].headers["retry-after"] == "1000"  # one token of 0.001/s
    assert _warnings(caplog) == [
        f"nanobucket: {limiter!r} cannot decide in Redis (connection): each process "
        "applies the limit by itself (N processes: up to N times the limit) until Redis "
        "answers again"
    ]
    value = registry.get_sample_value
    labels = {"route": "*", "source": "fallback"}
    assert value("nanobucket_redis_fallback_total", {**labels, "reason": "connection"}) == 1.0
    assert value("nanobucket_redis_fallback_total", {**labels, "reason": "breaker-open"}) == 4.0
    assert metrics.value("*", "admitted") == 3.0
    assert metrics.value("*", "limited") == 3.0
    if kind == "asyncio":
        http.loop.run_until_complete(limiter.aclose())
    else:
        limiter.close()


def test_the_policies_chosen_stay_and_bad_ones_are_refused() -> None:
    down = nbr.CircuitBreaker(clock=lambda: 0)
    down.record_failure()
    default = nbr.RedisTokenBucket(redis.Redis(), 1, 2, breaker=down)
    local = nbr.RedisTokenBucket(redis.Redis(), 1, 2, on_error="local", breaker=down)
    for limiter in (default, local):
        assert [limiter.allow_at("a", 0) for _ in range(3)] == [True, True, False]
        assert limiter.check_at("a", 0).source == "fallback"
    assert nbr.RedisTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down).allow("a")
    assert not nbr.RedisTokenBucket(redis.Redis(), 1, 2, on_error="closed", breaker=down).allow("a")
    with pytest.raises(nbr.RedisUnavailable):
        nbr.RedisTokenBucket(redis.Redis(), 1, 2, on_error="raise", breaker=down).allow("a")
    with pytest.raises(ValueError, match="'local', 'open', 'closed' or 'raise'"):
        nbr.RedisTokenBucket(redis.Redis(), 1, 2, on_error="local!", breaker=down)  # type: ignore[arg-type]
    # The local table keeps the limiter's limit when it changes (as a KeyedTokenBucket
    # does: a full bucket keeps the old capacity's 2 tokens and refills to 5).
    default.reconfigure(rate=1, capacity=5, migrate=False)
    d = default.check("b")
    assert (d.remaining, d.limit) == (1, 5)


# -- charged on Redis's return: flapping stays within the bound ---------------------------------

RATE = 10  # tokens/s: one every 100 ms, a whole number of microseconds
CAPACITY = 10
STEP = 10 * MS  # two requests every 10 ms: 200/s asked of a 10/s limit
OUTAGES = 5


class _Flapping:
    """Requests at 200/s on one key, on the clock of the ``*_at`` verbs, through outages."""

    def __init__(self, allow_at: Callable[[int], Any]) -> None:
        self.allow_at = allow_at
        self.now = 0
        self.admitted: list[int] = []

    async def run(self, duration: int) -> None:
        for _ in range(duration // STEP):
            for _ in range(2):
                allowed = self.allow_at(self.now)
                if not isinstance(allowed, bool):
                    allowed = await allowed
                if allowed:
                    self.admitted.append(self.now)
            self.now += STEP


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
@pytest.mark.parametrize("fallback", ["default", "given"])
def test_flapping_outages_stay_within_capacity_plus_rate_times_t(
    own_redis_server: RedisServer, caplog: pytest.LogCaptureFixture, kind: str, fallback: str
) -> None:
    # Five 1 s freezes, 1 s apart. Each fallback admission used to be a gift: Redis
    # refilled its bucket meanwhile, and each outage added about min(capacity,
    # rate * 1 s) = 10 to any window spanning it (a given fallback; the default
    # raised). Charged on Redis's return, the whole run admits what one bucket would.
    breaker_clock = ManualClock()
    kwargs: dict[str, Any] = {"prefix": _prefix(), "breaker": _held(breaker_clock)}
    if fallback == "given":
        kwargs["fallback"] = nb.KeyedTokenBucket(rate=RATE, capacity=CAPACITY)
    caplog.set_level(logging.INFO, logger="nanobucket")

    async def main() -> list[int]:
        cls: Any = nbr.RedisTokenBucket if kind == "sync" else nbr.AsyncRedisTokenBucket
        limiter = cls.from_url(own_redis_server.url, RATE, CAPACITY, socket_timeout=0.25, **kwargs)
        trace = _Flapping(lambda now: limiter.allow_at("k", now))
        await trace.run(S)
        for _ in range(OUTAGES):
            own_redis_server.pause()
            try:
                await trace.run(S)  # the first call waits out the timeout, then the breaker
            finally:
                own_redis_server.resume()
            breaker_clock.advance(S)  # the back-off is over: the next call probes Redis
            await trace.run(S)
        if kind == "asyncio":
            await limiter.aclose()
        else:
            limiter.close()
        return trace.admitted

    admitted = asyncio.run(main())
    total = (2 * OUTAGES + 1) * S
    for window in (S, 2 * S, 3 * S, 5 * S, total):
        assert most_in_window(admitted, window) <= CAPACITY + RATE * window // S, window
    # The run admits exactly one bucket's (10 + 10/s for 11 s less the last step): the
    # bucket is empty whenever an outage starts, so the request left frozen in Redis's
    # socket, which runs on its return, is refused there and charges nothing.
    assert len(admitted) == CAPACITY + RATE * (total - STEP) // S
    warned = _warnings(caplog)
    assert len(warned) == OUTAGES  # once per outage, not per request
    charged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(charged) == OUTAGES
    assert all("; 1 keys charged" in m for m in charged), charged


def test_a_charge_stops_at_an_empty_bucket(own_redis_server: RedisServer) -> None:
    # Two processes' worth, each with the default local table (the whole limit each):
    # while Redis is frozen each admits alice's 5. On Redis's return the first charges
    # her bucket 5 (empty), the second's 5 find it empty and go no further: no debt,
    # so her next token comes one interval on, as for any empty bucket.
    breaker_clock = ManualClock()
    prefix = _prefix()
    interval = 100 * MS
    limiters = [
        nbr.RedisTokenBucket.from_url(
            own_redis_server.url,
            10,
            5,
            prefix=prefix,
            socket_timeout=0.25,
            breaker=_held(breaker_clock),
        )
        for _ in range(2)
    ]
    own_redis_server.pause()
    try:
        for limiter in limiters:
            assert [limiter.allow_at("alice", 0) for _ in range(6)] == [True] * 5 + [False]
    finally:
        own_redis_server.resume()
    breaker_clock.advance(S)
    first, second = limiters
    d = first.peek_at("alice", 0)  # charged 5 first: empty
    assert (d.allowed, d.remaining, d.retry_after_ns, d.source) == (False, 0, interval, "redis")
    d = second.peek_at("alice", 0)  # its 5 find the bucket empty: no further
    assert (d.allowed, d.retry_after_ns, d.source) == (False, interval, "redis")
    assert second.check_at("alice", interval).allowed
    for limiter in limiters:
        limiter.close()


def test_an_outage_notes_a_bounded_number_of_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_outage, "MAX_KEYS", 3)
    monkeypatch.setattr(_outage, "BATCH", 2)
    outages = _outage.Outages()
    breaker = nbr.CircuitBreaker()
    fallback = nb.KeyedTokenBucket(rate=1, capacity=10)
    for key in "abcde":
        assert fallback.allow_at(key, 0, cost=4)
        outages.note(breaker, key, 4, 0)
    assert fallback.allow_at("a", 0, cost=2)
    outages.note(breaker, "a", 2, 0)
    # The first 3 keys only, 2 before a call and 1 before the next; each the lesser of
    # what it admitted and what its fallback owes at its last admission.
    assert outages.take(breaker, fallback) == [("a", 6, 0), ("b", 4, 0)]
    assert outages.owed
    assert outages.take(breaker, fallback) == [("c", 4, 0)]
    assert not outages.owed  # all taken: owed no more
    assert outages.take(breaker, fallback) == []


def test_a_leased_limiter_charges_what_its_fallback_admitted(own_redis_server: RedisServer) -> None:
    breaker_clock = ManualClock()
    client = nbr.client_from_url(own_redis_server.url, socket_timeout=0.25)
    limiter = nbr.LeasedTokenBucket(
        client,
        rate=0.001,  # no refill within the test
        capacity=4,
        prefix=_prefix(),
        max_lease=1,
        timeout=0.25,
        breaker=_held(breaker_clock),
    )
    own_redis_server.pause()
    try:  # the local table of the default admits the whole capacity
        assert [limiter.allow_at("k", 0) for _ in range(5)] == [True] * 4 + [False]
    finally:
        own_redis_server.resume()
    breaker_clock.advance(S)
    d = limiter.check_at("k", 0)  # Redis's bucket took the 4 first: empty
    assert (d.allowed, d.source) == (False, "redis")
    limiter.close()


def test_many_keys_are_charged_a_round_trip_of_them_before_each_call(
    own_redis_server: RedisServer,
) -> None:
    # 300 keys spent in the outage: the first call back charges 256 of them first
    # (one round trip), the next the other 44, then decides: every bucket is empty.
    breaker_clock = ManualClock()
    limiter = nbr.RedisTokenBucket.from_url(
        own_redis_server.url,
        rate=0.001,
        capacity=1,
        prefix=_prefix(),
        socket_timeout=0.25,
        breaker=_held(breaker_clock),
    )
    keys = [f"user-{i}" for i in range(300)]
    own_redis_server.pause()
    try:
        assert limiter.allow_many_at(keys, 0) == bytearray([1]) * 300  # the local table
    finally:
        own_redis_server.resume()
    breaker_clock.advance(S)
    assert _outage.BATCH == 256
    d = limiter.peek_at(keys[0], 0)
    assert (d.allowed, d.source) == (False, "redis")
    assert len(limiter._outage.owed[limiter.breaker]) == 300 - 256
    assert limiter.allow_many_at(keys, 0) == bytearray(300)  # every one charged first
    assert not limiter._outage.owed
    limiter.close()


def test_an_outage_is_told_once_from_when_its_breaker_opens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outages = _outage.Outages()
    breaker = nbr.CircuitBreaker(failures=2, clock=ManualClock())

    def tell() -> None:
        outages.tell(breaker, "limiter", "timeout", "the local table decides")

    tell()  # closed: a call that waited too long on a busy loop, no outage
    breaker.record_failure()
    tell()  # one failure of two: still closed
    breaker.record_failure()
    tell()
    tell()
    breaker.record_success()  # the outage is over
    breaker.record_failure()
    breaker.record_failure()
    tell()
    assert (
        _warnings(caplog)
        == [
            "nanobucket: 'limiter' cannot decide in Redis (timeout): the local table decides "
            "until Redis answers again"
        ]
        * 2
    )


def test_two_instances_with_a_share_each_stay_within_the_bound_through_flapping(
    own_redis_server: RedisServer,
) -> None:
    # Two instances of one limit, each with half of it as its fallback (the setting
    # the docs recommend for N instances), the requests alternating between them:
    # through five freezes they admit together what one bucket would.
    breaker_clock = ManualClock()
    prefix = _prefix()
    limiters = [
        nbr.RedisTokenBucket.from_url(
            own_redis_server.url,
            RATE,
            CAPACITY,
            prefix=prefix,
            socket_timeout=0.25,
            breaker=_held(breaker_clock),
            fallback=nb.KeyedTokenBucket(rate=RATE / 2, capacity=CAPACITY // 2),
        )
        for _ in range(2)
    ]
    turn = iter(range(1 << 30))
    trace = _Flapping(lambda now: limiters[next(turn) % 2].allow_at("k", now))

    async def main() -> None:
        await trace.run(S)
        for _ in range(OUTAGES):
            own_redis_server.pause()
            try:
                await trace.run(S)
            finally:
                own_redis_server.resume()
            breaker_clock.advance(S)
            await trace.run(S)

    asyncio.run(main())
    total = (2 * OUTAGES + 1) * S
    for window in (S, 2 * S, 3 * S, 5 * S, total):
        assert most_in_window(trace.admitted, window) <= CAPACITY + RATE * window // S, window
    for limiter in limiters:
        limiter.close()

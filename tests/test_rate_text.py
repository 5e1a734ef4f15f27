"""A rate written as text ("100/minute"): its grammar, its exact interval, every entry point."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import nanobucket as nb
from nanobucket._core._params import NS_PER_S
from nanobucket.decorator import RateLimited, limit
from nanobucket.tiered import tiered
from nanobucket.wsgi import Route

from conftest import ManualClock
from http_checks import MakeClient, asgi_client

__all__ = ("asgi_client",)  # a fixture, re-exported

S = NS_PER_S
MINUTE = 60 * S
EXAMPLES = "e.g. '100/minute', '10 per second', '5/s' or '2 per 5 seconds'"

# text -> (exact rate, interval_ns, capacity): the interval is ceil(1e9 / rate),
# as for a rate given as a number, with no float on the way.
GRAMMAR = [
    ("100/minute", Fraction(5, 3), 600_000_000, 100),
    ("100/min", Fraction(5, 3), 600_000_000, 100),
    ("100 per minute", Fraction(5, 3), 600_000_000, 100),
    ("100/minutes", Fraction(5, 3), 600_000_000, 100),
    ("100/m", Fraction(5, 3), 600_000_000, 100),
    ("10 per second", Fraction(10), 100_000_000, 10),
    ("5/s", Fraction(5), 200_000_000, 5),
    ("5/sec", Fraction(5), 200_000_000, 5),
    ("5/second", Fraction(5), 200_000_000, 5),
    ("1000/hour", Fraction(5, 18), 3_600_000_000, 1000),
    ("1000/h", Fraction(5, 18), 3_600_000_000, 1000),
    ("1000/hr", Fraction(5, 18), 3_600_000_000, 1000),
    ("10000/day", Fraction(25, 216), 8_640_000_000, 10000),
    ("10000/d", Fraction(25, 216), 8_640_000_000, 10000),
    ("7/week", Fraction(1, 86400), 86_400 * S, 7),
    ("2/5s", Fraction(2, 5), 2_500_000_000, 2),
    ("2/5 seconds", Fraction(2, 5), 2_500_000_000, 2),
    ("2 per 5 seconds", Fraction(2, 5), 2_500_000_000, 2),
    ("1/3s", Fraction(1, 3), 3 * S, 1),  # exact: 3 s, not 3.0000000003
    ("1 per 3 seconds", Fraction(1, 3), 3 * S, 1),
    ("3 per 2 hours", Fraction(1, 2400), 2400 * S, 3),
    ("7/minute", Fraction(7, 60), 8_571_428_572, 7),  # 60/7 s, rounded up (conservative)
    ("  100 / MINUTE  ", Fraction(5, 3), 600_000_000, 100),
    ("100Per Minute", Fraction(5, 3), 600_000_000, 100),
    ("100 PER 1 Minutes", Fraction(5, 3), 600_000_000, 100),
    ("1000000000/s", Fraction(10**9), 1, 10**9),
]


@pytest.mark.parametrize(("text", "rate", "interval", "capacity"), GRAMMAR)
def test_the_grammar_gives_the_exact_interval_and_the_count_as_capacity(
    impl: ModuleType, text: str, rate: Fraction, interval: int, capacity: int
) -> None:
    for make in (impl.TokenBucket, impl.KeyedTokenBucket):
        b = make(text)
        assert (b.rate, b.interval_ns, b.capacity) == (rate, interval, capacity)
        # The same bucket as the number it stands for.
        same = make(rate, capacity)
        assert (same.interval_ns, same.capacity) == (b.interval_ns, b.capacity)


def test_rate_reads_back_as_the_number_it_stands_for(impl: ModuleType) -> None:
    # An int when whole, else the exact Fraction.
    seen = [impl.TokenBucket(t).rate for t in ("5/s", "1/2s", "100/minute")]
    assert [(r, type(r)) for r in seen] == [
        (5, int),
        (Fraction(1, 2), Fraction),
        (Fraction(5, 3), Fraction),
    ]


def test_a_capacity_given_wins_over_the_count(impl: ModuleType) -> None:
    clock = ManualClock()
    t = impl.KeyedTokenBucket("10 per second", capacity=20, clock=clock)
    assert (t.capacity, t.interval_ns) == (20, 100_000_000)
    assert sum(t.allow("alice") for _ in range(30)) == 20
    clock.now = 100_000_000
    assert [t.allow("alice"), t.allow("alice")] == [True, False]


def test_100_per_minute_admits_199_in_a_minute_and_200_counting_both_ends(
    impl: ModuleType,
) -> None:
    # What the docs tell a newcomer: the full bucket, then a minute's refill.
    b = impl.TokenBucket("100/minute")
    at_start = sum(b.allow_at(0) for _ in range(150))
    refills = [b.allow_at(k * 600_000_000) for k in range(1, 100)]  # every 0.6 s to 59.4 s
    assert (at_start, sum(refills)) == (100, 99)
    assert b.allow_at(MINUTE - 1) is False  # [0, 60 s): 199
    assert b.allow_at(MINUTE) is True  # [0, 60 s]: 200
    d = b.check_at(MINUTE)
    assert (d.allowed, d.retry_after_ns) == (False, 600_000_000)


def admitted_times(limiter: Any, until: int) -> list[int]:
    """The times (ns) of every request a client that sends as soon as it may gets admitted."""
    times: list[int] = []
    t = 0
    while t <= until:
        d = limiter.check_at("alice", t)
        if d.allowed:
            times.append(t)
        else:
            t += d.retry_after_ns
    return times


def test_the_caps_the_docs_show(impl: ModuleType) -> None:
    # Figures as `python -m nanobucket explain` gives them (both ends counted),
    # and in a clock minute [t, t + 60 s).
    def most(limiter: Any, within: int) -> tuple[int, int]:
        times = admitted_times(limiter, within)
        return sum(t < within for t in times), len(times)

    assert most(impl.KeyedTokenBucket("100/minute"), MINUTE) == (199, 200)
    assert most(impl.KeyedTokenBucket("100/minute", capacity=1), MINUTE) == (100, 101)
    assert most(impl.KeyedTokenBucket("80/minute", capacity=20), MINUTE) == (99, 100)
    # A slower second layer holds the hour as well: 20 at once, 100 a minute, 1000 an hour.
    layered = nb.all_of(
        impl.KeyedTokenBucket("80/minute", capacity=20),
        impl.KeyedTokenBucket("900/hour", capacity=100),
    )
    times = admitted_times(layered, 3600 * S)
    assert sum(t == 0 for t in times) == 20
    assert sum(t <= MINUTE for t in times) == 100
    assert (sum(t < 3600 * S for t in times), len(times)) == (999, 1000)


BAD = [
    (
        "100/fortnight",
        "rate '100/fortnight' cannot be read: write a whole count, '/' or 'per', and a unit "
        "(second, minute, hour, day, week, or s, sec, m, min, h, hr, d, w), " + EXAMPLES,
    ),
    (
        "1.5/s",
        "rate '1.5/s' cannot be read: write a whole count, '/' or 'per', and a unit "
        "(second, minute, hour, day, week, or s, sec, m, min, h, hr, d, w), " + EXAMPLES,
    ),
    (
        "fast",
        "rate 'fast' cannot be read: write a whole count, '/' or 'per', and a unit "
        "(second, minute, hour, day, week, or s, sec, m, min, h, hr, d, w), " + EXAMPLES,
    ),
    (
        "",
        "rate '' cannot be read: write a whole count, '/' or 'per', and a unit "
        "(second, minute, hour, day, week, or s, sec, m, min, h, hr, d, w), " + EXAMPLES,
    ),
    (
        "100",
        "rate '100' cannot be read: it has no time unit, e.g. '100/second' or '100/minute'",
    ),
    (
        "10000/month",
        "rate '10000/month' cannot be read: a month or a year has no fixed length; "
        "write it in days, e.g. '10000 per 30 days'",
    ),
    (
        "5 per year",
        "rate '5 per year' cannot be read: a month or a year has no fixed length; "
        "write it in days, e.g. '10000 per 30 days'",
    ),
    (
        "10/second;100/minute",
        "rate '10/second;100/minute' cannot be read: it holds several rates; give one, and "
        "for several limits at once use all_of(KeyedTokenBucket('10/second'), "
        "KeyedTokenBucket('100/minute'))",
    ),
    (
        "0/s",
        "rate '0/s' admits nothing: the count and the time must both be at least 1, " + EXAMPLES,
    ),
    (
        "1/0s",
        "rate '1/0s' admits nothing: the count and the time must both be at least 1, " + EXAMPLES,
    ),
    ("2000000000/s", "rate must be at most 1e9 per second, got '2000000000/s'"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[t for t, _ in BAD])
def test_unreadable_text_is_a_value_error_quoting_it(
    impl: ModuleType, text: str, message: str
) -> None:
    made: list[Callable[[], object]] = [
        lambda: impl.TokenBucket(text),
        lambda: impl.KeyedTokenBucket(text, capacity=5),
        lambda: impl.TokenBucket(1, 1).reconfigure(rate=text),
    ]
    for make in made:
        with pytest.raises(ValueError) as info:
            make()
        assert str(info.value) == message


@pytest.mark.parametrize("rate", [b"100/s", None, [100], 1 + 2j])
def test_other_types_are_a_type_error_naming_both_forms(impl: ModuleType, rate: object) -> None:
    want = (
        "rate must be a real number of tokens per second (an int, float, Fraction, Decimal "
        "or other numbers.Real) or a rate written as text such as "
        f"'100/minute', '10 per second', '5/s' or '2 per 5 seconds', not {type(rate).__name__}"
    )
    with pytest.raises(TypeError) as info:
        impl.TokenBucket(rate, 1)
    assert str(info.value) == want


def test_a_number_still_needs_a_capacity(impl: ModuleType) -> None:
    for make in (impl.TokenBucket, impl.KeyedTokenBucket):
        with pytest.raises(TypeError) as info:
            make(100)
        assert str(info.value) == (
            "capacity is missing: give the burst a bucket holds (capacity=...), or write the "
            "rate as text, whose count is the capacity ('100/minute': 100)"
        )


def test_reconfigure_to_text_brings_its_count_unless_a_capacity_is_given(
    impl: ModuleType,
) -> None:
    for make in (impl.TokenBucket, impl.KeyedTokenBucket):
        b = make("100/minute")
        b.reconfigure(rate="200/minute", now=0)
        assert (b.rate, b.capacity, b.interval_ns) == (Fraction(10, 3), 200, 300_000_000)
        b.reconfigure(rate="10/s", capacity=3, now=0)
        assert (b.rate, b.capacity) == (10, 3)
        b.reconfigure(rate=20, now=0)  # a number: the capacity stays
        assert (b.rate, b.capacity) == (20, 3)


UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}
SHORT = {"second": "s", "minute": "min", "hour": "h", "day": "d", "week": "w"}


@st.composite
def written(draw: st.DrawFn) -> tuple[str, int, int]:
    """A rate as someone might write it, with its count and its period in seconds."""
    unit = draw(st.sampled_from(sorted(UNITS)))
    count = draw(st.integers(1, 10**6))
    multiple = draw(st.integers(1, 1000))
    name = draw(st.sampled_from([unit, unit + "s", SHORT[unit]]))
    name = "".join(c.upper() if draw(st.booleans()) else c for c in name)
    space = draw(st.sampled_from(["", " ", "  "]))
    shown = "" if multiple == 1 and draw(st.booleans()) else str(multiple)
    sep = draw(st.sampled_from(["/", " per ", "per", " / "]))
    text = f"{space}{count}{sep}{shown}{space}{name}{space}"
    return text, count, multiple * UNITS[unit]


@given(rate=written())
def test_text_and_the_number_it_stands_for_make_the_same_bucket(
    impl: ModuleType, rate: tuple[str, int, int]
) -> None:
    text, count, seconds = rate
    from_text = impl.TokenBucket(text)
    exact = Fraction(count, seconds)
    assert from_text.interval_ns == math.ceil(Fraction(seconds * S, count))
    assert from_text.interval_ns == impl.TokenBucket(exact, count).interval_ns
    assert (from_text.rate, from_text.capacity) == (exact, count)


# -------------------------------------------------------------- entry points


def test_decorator_takes_text_with_no_capacity() -> None:
    @limit("2/minute")
    def ping() -> str:
        return "pong"

    @limit(rate="1 per day", key=lambda user: user)
    def upload(user: str) -> str:
        return user

    assert [ping(), ping()] == ["pong", "pong"]
    with pytest.raises(RateLimited):
        ping()
    assert [upload("alice"), upload("bob")] == ["alice", "bob"]
    with pytest.raises(RateLimited):
        upload("alice")
    made = (ping.limiter, upload.limiter)  # type: ignore[attr-defined]
    assert [(type(m).__name__, m.capacity, m.interval_ns) for m in made] == [
        ("TokenBucket", 2, 30 * S),
        ("KeyedTokenBucket", 1, 86400 * S),
    ]
    with pytest.raises(TypeError, match="takes a rate once"):
        limit("2/minute", rate="2/minute")
    with pytest.raises(TypeError, match="rate='100/minute', whose count is the capacity"):
        limit(rate=100)


def test_tiered_plans_written_as_text() -> None:
    limiter = tiered(
        {"free": "2/minute", "pro": "5 per minute"}, tier={"alice": "pro"}.get, default="free"
    )
    plans = limiter.plans
    assert {n: (p.capacity, p.interval_ns, p.keyed) for n, p in plans.items()} == {
        "free": (2, 30 * S, True),
        "pro": (5, 12 * S, True),
    }
    assert sum(limiter.allow_at("alice", 0) for _ in range(9)) == 5
    assert sum(limiter.allow_at("bob", 0) for _ in range(9)) == 2


def test_shared_table_takes_text() -> None:
    pytest.importorskip("nanobucket._core._shared_c")
    with nb.SharedKeyedTokenBucket.create_anonymous(rate="3 per minute") as t:
        assert (t.rate, t.capacity, t.interval_ns) == (Fraction(1, 20), 3, 20 * S)
        assert sum(t.allow_at("a", 0) for _ in range(5)) == 3


def test_redis_limiters_take_text(redis_url: str) -> None:
    redis = pytest.importorskip("redis")
    from nanobucket.redis import AsyncRedisTokenBucket, LeasedTokenBucket, RedisTokenBucket

    limiter = RedisTokenBucket.from_url(redis_url, rate="2 per minute", prefix="rate-text")
    try:
        assert (limiter.rate, limiter.capacity, limiter.interval_ns) == (
            Fraction(1, 30),
            2,
            30 * S,
        )
        decisions = [limiter.check("alice") for _ in range(3)]
        assert [d.allowed for d in decisions] == [True, True, False]
        limiter.reconfigure(rate="4/minute", migrate=False)
        assert (limiter.capacity, limiter.interval_ns) == (4, 15 * S)
    finally:
        limiter.close()
    leased = LeasedTokenBucket(redis.Redis(), "1000/s")
    assert (leased.capacity, leased.interval_ns) == (1000, 1_000_000)
    async_one = AsyncRedisTokenBucket(redis.asyncio.Redis(), "10/s", capacity=4)
    assert (async_one.capacity, async_one.interval_ns) == (4, 100_000_000)


def test_outbound_clients_take_text() -> None:
    pytest.importorskip("httpx")
    from nanobucket.httpx import RateLimitedTransport
    from nanobucket.requests import RateLimitedAdapter

    for made in (RateLimitedTransport(rate="5/second"), RateLimitedAdapter(rate="5/second")):
        got = made.limit("api.example.com")
        assert (got.rate, got.capacity) == (5, 5)


def test_a_route_and_the_middleware_take_text() -> None:
    from werkzeug.test import Client
    from werkzeug.wrappers import Response

    from nanobucket.wsgi import RateLimitMiddleware

    app = RateLimitMiddleware(
        Response("hello"),
        "100/minute",
        routes=[Route("/login", "1 per day", methods={"POST"})],
    )
    c = Client(app)
    peer = {"REMOTE_ADDR": "127.0.0.1"}
    first, second = c.post("/login", environ_base=peer), c.post("/login", environ_base=peer)
    assert (first.status_code, second.status_code) == (200, 429)
    assert first.headers["RateLimit-Policy"] == '"/login";q=1;w=86400'
    page = c.get("/", environ_base=peer)
    assert (page.status_code, page.headers["RateLimit-Policy"]) == (
        200,
        '"default";q=100;w=60',
    )
    with pytest.raises(ValueError, match="rate '5/fortnight' cannot be read"):
        Route("/x", "5/fortnight")


def test_django_settings_take_text() -> None:
    from django.test import Client as DjangoClient
    from django.test import override_settings

    config: dict[str, Any] = {
        "limiter": "100 per minute",
        "routes": [Route("/hello", "1/day")],
    }
    middleware = ["nanobucket.django.RateLimitMiddleware"]
    with override_settings(MIDDLEWARE=middleware, NANOBUCKET=config):
        client = DjangoClient()
        first, second = client.get("/hello"), client.get("/hello")
        assert (first.status_code, second.status_code) == (200, 429)
        assert first["RateLimit-Policy"] == '"/hello";q=1;w=86400'
        bare = client.get("/bare")
        assert bare["RateLimit-Policy"] == '"default";q=100;w=60'
    bad = {"limiter": "100/fortnight"}
    with (
        override_settings(MIDDLEWARE=middleware, NANOBUCKET=bad),
        pytest.raises(ValueError, match="rate '100/fortnight' cannot be read"),
    ):
        DjangoClient().get("/bare")


def test_fastapi_dependency_takes_text(asgi_client: MakeClient) -> None:
    from fastapi import Depends, FastAPI

    from nanobucket.fastapi import RateLimit, RateLimited, rate_limited_handler

    app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})

    @app.get("/", dependencies=[Depends(RateLimit("1/day"))])
    async def root() -> str:
        return "ok"

    http = asgi_client(app)
    first, second = http.get("/"), http.get("/")
    assert (first.status_code, second.status_code) == (200, 429)
    assert first.headers["ratelimit-policy"] == '"default";q=1;w=86400'


def test_a_leaky_bucket_takes_text_and_keeps_its_capacity_of_one() -> None:
    shaper = nb.LeakyBucket("100/minute", clock=lambda: 0, sleep=lambda s: None)
    assert (shaper.rate, shaper.capacity, shaper.interval_ns) == (Fraction(5, 3), 1, 600_000_000)


def test_a_long_text_is_refused_as_unreadable(impl: ModuleType) -> None:
    for text in ("1" * 5000 + "/s", "1/" + " " * 5000 + "1" + " " * 5000):
        with pytest.raises(ValueError) as info:
            impl.TokenBucket(text)
        assert str(info.value).startswith(f"rate {text!r} cannot be read: write a whole count")


def test_explain_takes_text_and_its_count(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from nanobucket.cli import main
    from nanobucket.explain import explain

    assert main(["explain", "--rate", "100/minute", "--window", "3600", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["rate"], doc["capacity"], doc["interval_ns"]) == ("5/3", 100, 600_000_000)
    assert [(w["seconds"], w["requests"]) for w in doc["max_admitted"]][-2:] == [
        (60, 200),
        (3600, 6100),
    ]
    assert main(["explain", "--rate", "10 per second", "--capacity", "30", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["capacity"] == 30
    assert main(["explain", "--rate", "10"]) == 2
    assert capsys.readouterr().err == (
        "nanobucket explain: error: the following arguments are required: --capacity "
        "(or give --rate as text, such as 100/minute, whose count is the capacity)\n"
    )
    assert main(["explain", "--rate", "100/fortnight"]) == 2
    assert "argument --rate: rate 100/fortnight cannot be read" in capsys.readouterr().err
    assert (explain("900/hour", 100).max_admitted[-1]) == (60, 115)


def test_a_drf_throttle_takes_text() -> None:
    from django.test import override_settings
    from django.test.client import RequestFactory

    from nanobucket.django import NanobucketThrottle

    import django_urls

    class Own(NanobucketThrottle):
        limiter = "1 per day"

    class FromSettings(NanobucketThrottle):
        pass  # its limiter from NANOBUCKET["throttle"]

    factory = RequestFactory()
    own = django_urls.Api.as_view(throttle_classes=[Own])
    assert [own(factory.get("/api")).status_code for _ in range(2)] == [200, 429]
    view = django_urls.Api.as_view(throttle_classes=[FromSettings])
    with override_settings(NANOBUCKET={"throttle": {"limiter": "2/day"}}):
        assert [view(factory.get("/api")).status_code for _ in range(3)] == [200, 200, 429]


def test_a_bucket_from_text_pickles_as_the_same_limit(impl: ModuleType) -> None:
    import pickle

    b = impl.TokenBucket("100/minute", per_process=True)
    assert b.allow_at(0, cost=30)
    copy = pickle.loads(pickle.dumps(b))
    assert (copy.rate, copy.capacity, copy.interval_ns) == (Fraction(5, 3), 100, 600_000_000)
    assert copy.tokens_at(0) == 70.0

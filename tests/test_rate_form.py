"""Every limiter reports ``.rate`` in one form: the kind of number given, of the value checked."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from types import ModuleType
from typing import Any

import pytest

import nanobucket as nb

# (given, what .rate reads back): an int as an int, a float as a float, a
# Decimal as a Decimal, a Fraction as the exact Fraction.
RATES = [
    (100, 100),
    (2.5, 2.5),
    (0.1, 0.1),
    (Decimal("0.5"), Decimal("0.5")),
    (Fraction(1, 3), Fraction(1, 3)),
    (Fraction(100, 1), Fraction(100)),
]


def _redis_limiters() -> Iterator[tuple[str, Callable[[Any], Any]]]:
    redis = pytest.importorskip("redis")
    redis_asyncio = pytest.importorskip("redis.asyncio")
    from nanobucket.redis import AsyncRedisTokenBucket, LeasedTokenBucket, RedisTokenBucket

    # No command is sent: building a limiter does not reach the server.
    yield "RedisTokenBucket", lambda r: RedisTokenBucket(redis.Redis(), rate=r, capacity=10)
    yield (
        "AsyncRedisTokenBucket",
        lambda r: AsyncRedisTokenBucket(redis_asyncio.Redis(), rate=r, capacity=10),
    )
    yield "LeasedTokenBucket", lambda r: LeasedTokenBucket(redis.Redis(), rate=r, capacity=10)


def _outbound_limiters() -> Iterator[tuple[str, Callable[[Any], Any]]]:
    pytest.importorskip("httpx")
    from nanobucket.httpx import RateLimitedTransport

    yield "RateLimitedTransport", lambda r: RateLimitedTransport(rate=r, capacity=10).limit("k")


def _limiters(impl: ModuleType) -> list[tuple[str, Callable[[Any], Any]]]:
    made: list[tuple[str, Callable[[Any], Any]]] = [
        ("TokenBucket", lambda r: impl.TokenBucket(rate=r, capacity=10)),
        ("KeyedTokenBucket", lambda r: impl.KeyedTokenBucket(rate=r, capacity=10)),
    ]
    if impl.__name__.endswith("_c") and hasattr(nb, "SharedKeyedTokenBucket"):
        made.append(("SharedKeyedTokenBucket", _shared))
    return [*made, *_redis_limiters(), *_outbound_limiters()]


def _shared(rate: Any) -> Any:
    pytest.importorskip("nanobucket._core._shared_c")
    with (
        tempfile.TemporaryDirectory() as d,
        nb.SharedKeyedTokenBucket.create(path=os.path.join(d, "t"), rate=rate, capacity=10) as t,
    ):
        return t  # .rate is read from the object, closed or not


@pytest.mark.parametrize(("given", "want"), RATES, ids=[repr(g) for g, _ in RATES])
def test_every_limiter_reports_the_rate_in_the_form_given(
    impl: ModuleType, given: object, want: object
) -> None:
    seen = {name: make(given).rate for name, make in _limiters(impl)}
    assert {name: (rate, type(rate)) for name, rate in seen.items()} == {
        name: (want, type(want)) for name in seen
    }


def test_a_redis_limiter_keeps_the_form_across_reconfigure() -> None:
    redis = pytest.importorskip("redis")
    from nanobucket.redis import RedisTokenBucket

    limiter = RedisTokenBucket(redis.Redis(), rate=100, capacity=200)
    limiter.reconfigure(capacity=300, migrate=False)
    assert (limiter.rate, type(limiter.rate)) == (100, int)
    limiter.reconfigure(rate=0.1, migrate=False)
    assert (limiter.rate, limiter.interval_ns) == (0.1, 10 * 10**9)

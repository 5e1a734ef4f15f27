"""How a wrapper knows a limiter: its class's ``keyed``, and nothing else."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

import nanobucket as nb
from nanobucket import redis as nbr
from nanobucket._core._limiter import is_keyed
from nanobucket.asgi import RateLimitMiddleware
from nanobucket.shared import SharedKeyedTokenBucket


def test_every_limiter_of_the_package_says_whether_it_is_keyed(impl: ModuleType) -> None:
    bucket, table = impl.TokenBucket(rate=1, capacity=1), impl.KeyedTokenBucket(rate=1, capacity=1)
    unkeyed = [bucket, nb.Concurrency(1), nb.Waiting(bucket), nb.LeakyBucket(1)]
    keyed = [
        table,
        nb.KeyedConcurrency(1),
        nb.all_of(bucket),
        nb.all_of(table, bucket),
        nb.tiered({"free": table}, tier=lambda key: "free"),
        nb.Waiting(table),
        nb.Waiting(nb.all_of(bucket)),
    ]
    assert [is_keyed(limiter) for limiter in unkeyed] == [False] * len(unkeyed)
    assert [is_keyed(limiter) for limiter in keyed] == [True] * len(keyed)
    backends = (
        SharedKeyedTokenBucket,
        nbr.RedisTokenBucket,
        nbr.AsyncRedisTokenBucket,
        nbr.LeasedTokenBucket,
        nb.AsyncTiered,
    )
    assert [cls.keyed for cls in backends] == [True] * len(backends)


@pytest.mark.c_extension
def test_the_cython_all_of_fast_path_says_it_too() -> None:
    from nanobucket._core import _bucket_c

    t = _bucket_c.KeyedTokenBucket(rate=1, capacity=1)
    fast = _bucket_c.AllowAll.of((t, _bucket_c.TokenBucket(rate=1, capacity=1)), None)
    assert is_keyed(fast) is True


class PerUser:
    """A limiter of one's own: ``keyed`` and the verbs, as `nanobucket._core._limiter` says."""

    keyed = True

    def __init__(self) -> None:
        self.inner = nb.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)

    def allow(self, key: Any, cost: int = 1) -> bool:
        return self.inner.allow(key, cost)

    def check(self, key: Any, cost: int = 1) -> Any:
        return self.inner.check(key, cost)

    def peek(self, key: Any, cost: int = 1) -> Any:
        return self.inner.peek(key, cost)


class Unsaid:
    """The same verbs, no ``keyed``: no wrapper guesses from the signature."""

    def allow(self, key: Any, cost: int = 1) -> bool:  # pragma: no cover - never called
        return True

    def check(self, key: Any, cost: int = 1) -> Any:  # pragma: no cover - never called
        return None

    def peek(self, key: Any, cost: int = 1) -> Any:  # pragma: no cover - never called
        return None


async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never called
    pass


def test_a_limiter_of_ones_own_declares_keyed() -> None:
    assert is_keyed(PerUser())

    def echo(user: str) -> str:
        return user

    limited = nb.limit(PerUser(), key=lambda user: user)(echo)
    assert limited("alice") == "alice"
    with pytest.raises(nb.RateLimited):
        limited("alice")
    layered = nb.all_of(PerUser())
    assert [layered.allow("bob"), layered.allow("bob")] == [True, False]
    message = "Unsaid is not a limiter: its class declares no keyed = True/False"
    for wrap in (
        lambda: nb.limit(Unsaid(), key=lambda user: user),  # type: ignore[arg-type]
        lambda: nb.all_of(Unsaid()),  # type: ignore[arg-type]
        lambda: RateLimitMiddleware(app, Unsaid()),
    ):
        with pytest.raises(TypeError, match=message):
            wrap()


def test_keyed_must_be_a_bool() -> None:
    class Truthy(PerUser):
        keyed = 1  # type: ignore[assignment]

    with pytest.raises(TypeError, match="Truthy is not a limiter"):
        is_keyed(Truthy())
    with pytest.raises(TypeError, match="int is not a limiter"):
        is_keyed(3)

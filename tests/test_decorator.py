"""@limit: raise RateLimited with retry_after, or wait; sync and async; key and cost functions."""

from __future__ import annotations

import asyncio
from types import ModuleType

import pytest

from nanobucket.decorator import RateLimited, limit
from nanobucket.layered import all_of
from nanobucket.waiting import Waiting

from conftest import ManualClock

S = 1_000_000_000


def test_sync_raises_with_the_time_to_wait(impl: ModuleType, clock: ManualClock) -> None:
    @limit(impl.TokenBucket(rate=2, capacity=2, clock=clock))
    def ping(x: int) -> int:
        return x + 1

    assert (ping(1), ping(2)) == (2, 3)
    with pytest.raises(RateLimited) as err:
        ping(3)
    assert (err.value.retry_after_ns, err.value.retry_after) == (S // 2, 0.5)
    assert "retry after 0.500 s" in str(err.value)
    assert not err.value.decision.allowed
    clock.advance(S // 2)
    assert ping(4) == 5
    assert ping.__name__ == "ping"


def test_key_and_cost_functions(impl: ModuleType, clock: ManualClock) -> None:
    table = impl.KeyedTokenBucket(rate=1, capacity=5, clock=clock)

    @limit(table, key=lambda user, n: user, cost=lambda user, n: n)
    def upload(user: str, n: int) -> str:
        return f"{user}:{n}"

    assert upload("alice", 3) == "alice:3"
    with pytest.raises(RateLimited) as err:
        upload("alice", 3)
    assert err.value.retry_after_ns == S
    assert upload("bob", 5) == "bob:5"
    assert table.tokens("alice") == 2.0  # the refused call spent nothing


def test_async_function(impl: ModuleType, clock: ManualClock) -> None:
    @limit(impl.TokenBucket(rate=1, capacity=1, clock=clock))
    async def handler() -> str:
        return "ok"

    async def main() -> None:
        assert await handler() == "ok"
        with pytest.raises(RateLimited) as err:
            await handler()
        assert err.value.retry_after_ns == S

    asyncio.run(main())


def test_wait_instead_of_raising(impl: ModuleType, clock: ManualClock) -> None:
    waits: list[int] = []
    w = Waiting(
        impl.TokenBucket(rate=4, capacity=1, clock=clock),
        sleep=lambda s: waits.append(round(s * S)),
    )

    @limit(w, wait=True, timeout=0.6)
    def work() -> int:
        return 1

    assert work() + work() + work() == 3
    assert waits == [S // 4, S // 2]
    with pytest.raises(RateLimited) as err:  # the fourth would wait 0.75 s > 0.6 s
        work()
    assert err.value.retry_after_ns == 3 * S // 4
    assert waits == [S // 4, S // 2]


def test_async_wait_with_an_all_of(impl: ModuleType, clock: ManualClock) -> None:
    waits: list[int] = []

    async def sleep(seconds: float) -> None:
        waits.append(round(seconds * S))

    layers = all_of(
        impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock),
        impl.TokenBucket(rate=10, capacity=10, clock=clock),
    )

    @limit(Waiting(layers, async_sleep=sleep), key=lambda user: user, wait=True)
    async def handler(user: str) -> str:
        return user

    async def main() -> None:
        assert [await handler("a"), await handler("a"), await handler("b")] == ["a", "a", "b"]

    asyncio.run(main())
    assert waits == [S]


def test_built_from_rate_and_capacity() -> None:
    @limit(rate=1, capacity=2, key=lambda user: user)
    def f(user: str) -> str:
        return user

    assert [f("a"), f("a"), f("b")] == ["a", "a", "b"]
    with pytest.raises(RateLimited):
        f("a")
    assert type(f.limiter).__name__ == "KeyedTokenBucket"  # type: ignore[attr-defined]


def test_bad_arguments(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=1, capacity=1)
    t = impl.KeyedTokenBucket(rate=1, capacity=1)
    with pytest.raises(TypeError, match="is keyed"):
        limit(t)
    with pytest.raises(TypeError, match="not keyed"):
        limit(b, key=lambda: "k")
    with pytest.raises(TypeError, match="not both"):
        limit(b, rate=1, capacity=1)
    with pytest.raises(TypeError, match="needs a limiter"):
        limit(rate=1)
    with pytest.raises(TypeError, match="cost must be an int or a callable"):
        limit(b, cost=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        limit(b, wait=True, timeout=-1)
    with pytest.raises(ValueError, match="rate must be > 0"):
        limit(rate=0, capacity=1)

    @limit(b, cost=2)
    def f() -> None: ...

    with pytest.raises(ValueError, match="exceeds capacity"):
        f()

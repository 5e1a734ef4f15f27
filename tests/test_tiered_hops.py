"""`tiered`: hopping between plans never gains a token, on every backend it takes.

The bound: over any window ``[t0, t1]`` a key is admitted at most
``C + R * (t1 - t0)``, where ``C`` is the largest capacity and ``R`` the
fastest rate among the plans it was served on up to ``t1``. Random hops,
costs and times (and a plan memory small enough to forget keys) run
through the in-process table (both twins), the shared-memory table and
Redis (sync and asyncio, a real redis-server), and every window of every
key is checked against that bound exactly.
"""

from __future__ import annotations

import asyncio
import inspect
import secrets
from collections.abc import Callable
from fractions import Fraction
from types import ModuleType
from typing import Any, NamedTuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nanobucket as nb
from nanobucket import redis as nbr

from conftest import NEEDS_SHARED_TABLE
from redis_server import redis_session_server, redis_url

__all__ = ("redis_session_server", "redis_url")  # fixtures, re-exported

S = 1_000_000_000
MS = 1_000_000


async def _v(value: Any) -> Any:
    """A sync verb's result as it is; an asyncio verb's, awaited."""
    return await value if inspect.isawaitable(value) else value


class Plan(NamedTuple):
    rate: int  # tokens per second: whole, so every backend's interval is exact
    capacity: int


class Step(NamedTuple):
    after_ms: int  # time since the step before
    key: int
    plan: int  # index into the plans
    cost: int  # at most the plan's capacity


#: These tests count tokens, not time: a Redis timeout long enough that a
#: machine slowed by line tracing (coverage) never turns a slow connect into
#: a failure of the decision under test.
REDIS_TIMEOUT = 5.0


def over_the_bound(
    plans: list[Plan], steps: list[Step], admitted: list[bool]
) -> list[tuple[int, int, int, Fraction]]:
    """The windows ``(key, t0, t1, admitted - bound)`` of each key over its bound."""
    over = []
    now = 0
    # Per key: (time, cost admitted, largest capacity and rate served on so far).
    events: dict[int, list[tuple[int, int, int, int]]] = {}
    used: dict[int, tuple[int, int]] = {}
    for step, ok in zip(steps, admitted):
        now += step.after_ms * MS
        plan = plans[step.plan]
        c, r = used.get(step.key, (0, 0))
        used[step.key] = c, r = max(c, plan.capacity), max(r, plan.rate)
        if ok:
            events.setdefault(step.key, []).append((now, step.cost, c, r))
    for key, seen in events.items():
        for i, (t0, _, _, _) in enumerate(seen):
            total = 0
            for t1, cost, c, r in seen[i:]:
                total += cost
                excess = total - c - Fraction(r * (t1 - t0), S)
                if excess > 0:
                    over.append((key, t0, t1, excess))
    return over


Made = Callable[[list[Plan]], dict[str, Any]]


def run(make: Made, trace: tuple[list[Plan], list[Step], int]) -> list[bool]:
    """The decisions of a trace's steps through `tiered` over ``make(plans)``'s tables
    (sync or asyncio; made, and closed, in the event loop that decides)."""
    plans, steps, max_keys = trace

    async def main() -> list[bool]:
        made = make(plans)
        limiter = nb.tiered(made, tier=lambda key: f"p{plan_of[key]}", max_keys=max_keys)
        out = []
        now = 0
        try:
            for step in steps:
                now += step.after_ms * MS
                plan_of[step.key] = step.plan
                out.append(bool(await _v(limiter.allow_at(step.key, now, step.cost))))
        finally:
            for table in made.values():  # a shared table or a Redis client (in-process: none)
                close = getattr(table, "aclose", None) or getattr(table, "close", None)
                if close is not None:
                    await _v(close())
        return out

    plan_of: dict[int, int] = {}
    return asyncio.run(main())


PLANS = st.lists(
    st.builds(Plan, st.sampled_from([1, 2, 5, 10, 50, 100]), st.integers(1, 60)),
    min_size=2,
    max_size=4,
)


@st.composite
def traces(draw: st.DrawFn) -> tuple[list[Plan], list[Step], int]:
    """Plans, steps of up to 5 keys, and a plan memory of 1 to 8 keys."""
    plans = draw(PLANS)
    keys = draw(st.integers(1, 5))
    steps = []
    for _ in range(draw(st.integers(1, 120))):
        plan = draw(st.integers(0, len(plans) - 1))
        cost = draw(st.integers(0, plans[plan].capacity))
        after = draw(st.sampled_from([0, 0, 0, 1, 10, 100, 500, 3000]))
        steps.append(Step(after, draw(st.integers(0, keys - 1)), plan, cost))
    return plans, steps, draw(st.integers(1, 8))


def check(make: Made, trace: tuple[list[Plan], list[Step], int]) -> None:
    assert over_the_bound(trace[0], trace[1], run(make, trace)) == []


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces())
def test_random_hops_stay_within_the_most_generous_plan_in_process(
    impl: ModuleType, trace: tuple[list[Plan], list[Step], int]
) -> None:
    def make(plans: list[Plan]) -> dict[str, Any]:
        return {f"p{i}": impl.KeyedTokenBucket(p.rate, p.capacity) for i, p in enumerate(plans)}

    check(make, trace)


@NEEDS_SHARED_TABLE[0]
@NEEDS_SHARED_TABLE[1]
@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces())
def test_random_hops_stay_within_the_most_generous_plan_in_shared_memory(
    trace: tuple[list[Plan], list[Step], int],
) -> None:
    from nanobucket.shared import SharedKeyedTokenBucket

    def make(plans: list[Plan]) -> dict[str, Any]:
        return {
            f"p{i}": SharedKeyedTokenBucket.create_anonymous(rate=p.rate, capacity=p.capacity)
            for i, p in enumerate(plans)
        }

    check(make, trace)


def _prefix() -> str:
    # Not `random`: hypothesis seeds it alike for each example, and plans of
    # different limits would meet on one prefix (which Redis refuses).
    return f"hops-{secrets.token_hex(6)}"


@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces())
def test_random_hops_stay_within_the_most_generous_plan_in_redis(
    redis_url: str, trace: tuple[list[Plan], list[Step], int]
) -> None:
    def make(plans: list[Plan]) -> dict[str, Any]:
        return {
            f"p{i}": nbr.RedisTokenBucket.from_url(
                redis_url, p.rate, p.capacity, prefix=_prefix(), socket_timeout=REDIS_TIMEOUT
            )
            for i, p in enumerate(plans)
        }

    check(make, trace)


@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces())
def test_random_hops_stay_within_the_most_generous_plan_in_redis_asyncio(
    redis_url: str, trace: tuple[list[Plan], list[Step], int]
) -> None:
    def make(plans: list[Plan]) -> dict[str, Any]:
        return {
            f"p{i}": nbr.AsyncRedisTokenBucket.from_url(
                redis_url, p.rate, p.capacity, prefix=_prefix(), socket_timeout=REDIS_TIMEOUT
            )
            for i, p in enumerate(plans)
        }

    check(make, trace)


async def hops(plans: dict[str, Any]) -> None:
    """Hops that gained tokens when a move carried only what the plan left had spent.

    *plans*: ``free`` (1/s of 20), ``team`` (1/s of 50), ``pro`` (1/s of 200),
    ``burst`` (100/s of 20) and ``big`` (100/s of 200).
    """
    plan_of: dict[str, str] = {}
    t = nb.tiered(plans, tier=plan_of.__getitem__)

    async def spend(key: str, plan: str, now: int, tries: int, cost: int = 1) -> int:
        plan_of[key] = plan
        return sum([bool(await _v(t.allow_at(key, now, cost))) * cost for _ in range(tries)])

    # Through a smaller plan: free held 20 of pro's 200 spent, and team was carried only
    # those 20 (30 of its 50 given); pro's own bucket was empty. 200 in all at 0, not 230.
    assert await spend("alice", "pro", 0, 1, cost=200) == 200
    assert await spend("alice", "free", 0, 1) == 0
    assert await spend("alice", "team", 0, 100) == 0
    assert await spend("alice", "pro", 0, 100) == 0
    # At 1 s pro has refilled one token, 199 still spent: team, charged those, is empty
    # (as a downgrade leaves it), its next token one of its intervals later.
    assert await spend("alice", "team", S, 5) == 0
    assert await spend("alice", "team", 2 * S, 5) == 1
    # Back to a larger plan after a smaller, faster one refilled: burst, empty at 0,
    # admits the 20 it refilled by 0.2 s; big, which counted only its own 200, has
    # refilled 20 too but may not give them again: 220 by 0.2 s, not 240.
    assert await spend("bob", "big", 0, 1, cost=200) == 200
    assert await spend("bob", "burst", 0, 1) == 0
    assert await spend("bob", "burst", 200 * MS, 30) == 20
    assert await spend("bob", "big", 200 * MS, 30) == 0
    assert await spend("bob", "big", 210 * MS, 30) == 1


def hop_plans(make: Callable[[int, int], Any]) -> dict[str, Any]:
    return {
        name: make(rate, capacity)
        for name, (rate, capacity) in {
            "free": (1, 20),
            "team": (1, 50),
            "pro": (1, 200),
            "burst": (100, 20),
            "big": (100, 200),
        }.items()
    }


def test_hops_in_process(impl: ModuleType) -> None:
    asyncio.run(hops(hop_plans(impl.KeyedTokenBucket)))


@NEEDS_SHARED_TABLE[0]
@NEEDS_SHARED_TABLE[1]
def test_hops_in_shared_memory() -> None:
    from nanobucket.shared import SharedKeyedTokenBucket

    plans = hop_plans(
        lambda rate, capacity: SharedKeyedTokenBucket.create_anonymous(rate=rate, capacity=capacity)
    )
    asyncio.run(hops(plans))
    for table in plans.values():
        table.close()


def test_hops_in_redis(redis_url: str) -> None:
    plans = hop_plans(
        lambda rate, capacity: nbr.RedisTokenBucket.from_url(
            redis_url, rate, capacity, prefix=_prefix(), socket_timeout=REDIS_TIMEOUT
        )
    )
    asyncio.run(hops(plans))
    for plan in plans.values():
        plan.close()


def test_hops_in_redis_asyncio(redis_url: str) -> None:
    async def main() -> None:
        plans = hop_plans(
            lambda rate, capacity: nbr.AsyncRedisTokenBucket.from_url(
                redis_url, rate, capacity, prefix=_prefix(), socket_timeout=REDIS_TIMEOUT
            )
        )
        await hops(plans)
        for plan in plans.values():
            await plan.aclose()

    asyncio.run(main())

"""`nanobucket.tiered`: per-plan limits, the carry-over between plans, every backend.

One scenario of exact numbers (at explicit times) runs on the in-process
table (both twins), the shared-memory table, and Redis (sync and asyncio,
a real redis-server); then all_of, Waiting, the decorator, the ASGI
middleware and the FastAPI dependency with the plan in the headers; then
bad input.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import redis
import redis.asyncio
from fastapi import Depends, FastAPI
from starlette.responses import PlainTextResponse

import nanobucket as nb
from nanobucket import redis as nbr
from nanobucket._core._limiter import Refundable, Reservable
from nanobucket._http import header
from nanobucket.asgi import RateLimitMiddleware
from nanobucket.fastapi import RateLimit, RateLimited, rate_limited_handler
from nanobucket.shared import SharedKeyedTokenBucket

from conftest import ManualClock
from http_checks import MakeClient, asgi_client
from redis_server import redis_session_server, redis_url

__all__ = ("asgi_client", "redis_session_server", "redis_url")  # fixtures, re-exported

S = 1_000_000_000
MS = 1_000_000
FREE, PRO = (10, 20), (100, 200)  # rate, capacity: a free token every 100 ms, a pro one every 10


def plans_of(impl: ModuleType, clock: ManualClock | None = None) -> dict[str, Any]:
    """The free and the pro plan as in-process tables of *impl*."""
    return {
        "free": impl.KeyedTokenBucket(*FREE, clock=clock),
        "pro": impl.KeyedTokenBucket(*PRO, clock=clock),
    }


async def _v(value: Any) -> Any:
    """A sync verb's result as it is; an asyncio verb's, awaited."""
    return await value if inspect.isawaitable(value) else value


def _fields(d: Any) -> tuple[Any, ...]:
    return (d.plan, d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)


async def scenario(plans: dict[str, Any]) -> None:
    """The exact numbers every backend gives (free 10/s of 20, pro 100/s of 200)."""
    plan_of = {"alice": "free", "bob": "pro", "carol": "free"}
    t = nb.tiered(plans, tier=plan_of.__getitem__)
    # Per plan: a burst at one instant admits the plan's capacity.
    assert sum([await _v(t.allow_at("carol", 0)) for _ in range(25)]) == 20
    assert (await _v(t.allow_many_at(["bob"] * 210, 0))).count(1) == 200
    # Upgrade: alice spent 15 of 20 on free; on pro she has 185 of 200, not 200.
    assert (await _v(t.allow_at("alice", 0, cost=15))) is True
    assert _fields(await _v(t.peek_at("alice", 0, cost=0))) == ("free", True, 5, 0, 1500 * MS, 20)
    plan_of["alice"] = "pro"
    assert _fields(await _v(t.peek_at("alice", 0, cost=0))) == (
        "pro",
        True,
        185,
        0,
        150 * MS,
        200,
    )
    assert sum([await _v(t.allow_at("alice", 0)) for _ in range(200)]) == 185
    # Downgrade with 200 spent: free holds at most 20 spent, so it is empty:
    # the next token in one free interval (100 ms), full in 2 s.
    plan_of["alice"] = "free"
    d = await _v(t.check_at("alice", 0))
    assert _fields(d) == ("free", False, 0, 100 * MS, 2 * S, 20)
    # Back to pro at once: pro still holds its own 200 spent, so the hop gains nothing.
    plan_of["alice"] = "pro"
    assert _fields(await _v(t.peek_at("alice", 0, cost=0))) == ("pro", True, 0, 0, 2 * S, 200)
    # A fraction of a token refilled counts as spent: carol's free bucket holds
    # 0.5 at 50 ms, so 20 are carried and pro has 180 at that instant.
    plan_of["carol"] = "pro"
    assert _fields(await _v(t.peek_at("carol", 50 * MS, cost=0))) == (
        "pro",
        True,
        180,
        0,
        200 * MS,
        200,
    )
    # Downgrade of bob (200 spent at 0) at 1 s: 100 refilled on pro, 100 spent: free is empty.
    plan_of["bob"] = "free"
    assert _fields(await _v(t.peek_at("bob", S))) == ("free", False, 0, 100 * MS, 2 * S, 20)
    assert (await _v(t.allow_at("bob", S + 100 * MS))) is True
    assert (await _v(t.allow_at("bob", S + 100 * MS))) is False


# -- in process, both twins -------------------------------------------------------


def test_in_process(impl: ModuleType) -> None:
    asyncio.run(scenario(plans_of(impl)))


def test_default_plan_for_unknown_names_and_plan_of(impl: ModuleType) -> None:
    plans = plans_of(impl)
    t = nb.tiered(plans, tier={"alice": "pro"}.get, default="free")
    assert (t.plan("alice"), t.plan("anonymous"), t.default) == ("pro", "free", "free")
    assert sum(t.allow_at("anonymous", 0) for _ in range(30)) == 20
    assert t.check_at("anonymous", 0).plan == "free"
    assert sorted(t.plans) == ["free", "pro"] and t.plans["pro"] is plans["pro"]
    strict = nb.tiered(plans, tier={"alice": "pro"}.get)
    with pytest.raises(ValueError, match=r"tier\('mallory'\) returned None, which is not a plan"):
        strict.allow("mallory")
    with pytest.raises(ValueError, match="returned \\['pro'\\], which is not a plan"):
        nb.tiered(plans, tier=lambda key: ["pro"]).allow("alice")


def test_the_memory_is_bounded_and_forgetting_loses_nothing(impl: ModuleType) -> None:
    plans = plans_of(impl)
    plan_of = {f"user-{i}": "free" for i in range(20)}
    t = nb.tiered(plans, tier=plan_of.__getitem__, max_keys=8)
    assert t.allow_at("user-0", 0, cost=15) is True
    for i in range(1, 20):
        assert t.allow_at(f"user-{i}", 0) is True
        assert len(t) <= 8
    assert len(t) == 8 and t.max_keys == 8
    # user-0 is forgotten; on its upgrade every other plan is read: 15 spent, carried.
    plan_of["user-0"] = "pro"
    assert t.peek_at("user-0", 0, cost=0).remaining == 185


def test_two_threads_moving_one_key_carry_it_once(impl: ModuleType) -> None:
    plans = plans_of(impl)
    plan_of = {"alice": "free"}
    t = nb.tiered(plans, tier=plan_of.__getitem__)
    assert t.allow_at("alice", 0, cost=15)
    plan_of["alice"] = "pro"
    start = threading.Barrier(8)
    seen: list[int] = []

    def move() -> None:
        start.wait()
        seen.append(t.peek_at("alice", 0, cost=0).remaining)

    threads = [threading.Thread(target=move) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert seen == [185] * 8


def test_refund_reset_tokens_and_the_decision(impl: ModuleType, clock: ManualClock) -> None:
    plans = plans_of(impl, clock)
    plan_of = {"alice": "free"}
    t = nb.tiered(plans, tier=plan_of.__getitem__)
    assert t.allow("alice", cost=10) and t.tokens("alice") == 10.0
    t.refund("alice", cost=4)
    assert t.tokens_at("alice", 0) == 14.0
    t.refund_at("alice", 0, cost=1)
    d = t.check("alice", cost=5)
    assert _fields(d) == ("free", True, 10, 0, 1000 * MS, 20)
    assert d.decision == plans["free"].peek_at("alice", 0, cost=0)  # the plan's own
    assert repr(d).endswith(", limit=20, plan='free')")
    assert t.peek("alice", cost=10).remaining == 0
    plan_of["alice"] = "pro"
    assert t.tokens("alice") == 190.0
    t.reset("alice")  # every plan forgets it
    assert (plans["free"].tokens("alice"), plans["pro"].tokens("alice")) == (20.0, 200.0)
    assert "tiered({'free': KeyedTokenBucket(rate=10, capacity=20" in repr(t)


def test_a_tiered_decision_is_a_decision_equal_on_its_five_fields(impl: ModuleType) -> None:
    t = nb.tiered({"free": impl.KeyedTokenBucket(*FREE)}, tier=lambda key: "free")
    d = t.check_at("alice", 0, cost=5)
    plain = nb.Decision(True, 15, 0, 500 * MS, 20)
    assert d == plain and plain == d and d != nb.Decision(True, 14, 0, 500 * MS, 20)
    assert hash(d) == hash(plain) == hash((True, 15, 0, 500 * MS, 20))
    assert "__eq__" not in vars(nb.TieredDecision) and "__hash__" not in vars(nb.TieredDecision)
    assert d.plan == "free" and isinstance(d, nb.Decision)


# -- with the other parts ---------------------------------------------------------


def test_in_all_of_with_a_global_limit(impl: ModuleType) -> None:
    plans = plans_of(impl)
    t = nb.tiered(plans, tier={"alice": "pro", "bob": "free"}.__getitem__)
    instance = impl.TokenBucket(rate=1000, capacity=25)
    limit = nb.all_of(t, instance)
    # bob's plan binds (20), and his refusals give the global layer its tokens back.
    assert sum(limit.allow_at("bob", 0) for _ in range(30)) == 20
    d = limit.check_at("bob", 0)
    assert (d.allowed, d.layer, d.decisions[0].plan, d.retry_after_ns) == (
        False,
        0,
        "free",
        100 * MS,
    )
    # Then the global layer binds alice's pro plan: 5 left of 25.
    assert sum(limit.allow_at("alice", 0) for _ in range(30)) == 5
    assert limit.check_at("alice", 0).layer == 1
    assert t.peek_at("alice", 0, cost=0).remaining == 195


def test_waiting_and_acquire_wait_the_plans_exact_time(impl: ModuleType) -> None:
    clock = ManualClock()
    plans = {
        "free": impl.KeyedTokenBucket(rate=10, capacity=1, clock=clock),
        "pro": impl.KeyedTokenBucket(rate=100, capacity=1, clock=clock),
    }
    t = nb.tiered(plans, tier={"alice": "free", "bob": "pro"}.__getitem__)
    slept: list[float] = []
    w = nb.Waiting(t, sleep=slept.append)
    assert [w.acquire("alice"), w.acquire("alice"), w.acquire("bob"), w.acquire("bob")] == [
        True
    ] * 4
    assert slept == [0.1, 0.01]
    # In all_of with a global limit: the plan's wait, as the plan binds.
    layered = nb.Waiting(
        nb.all_of(t, impl.TokenBucket(rate=1000, capacity=100, clock=clock)), sleep=slept.append
    )
    assert layered.acquire("alice") and slept[-1] == 0.2  # behind the reservation above
    # The limiter's own acquire is its plan's (a wait over the timeout: refused at once).
    assert t.acquire("bob", timeout=0) is False
    assert t.acquire("bob", timeout=1.0) is True
    assert asyncio.run(t.acquire_async("bob", timeout=0)) is False


def test_the_decorator(impl: ModuleType, clock: ManualClock) -> None:
    plans = {
        "free": impl.KeyedTokenBucket(rate=10, capacity=1, clock=clock),
        "pro": impl.KeyedTokenBucket(rate=100, capacity=2, clock=clock),
    }
    plan_of = {"alice": "free"}

    @nb.limit(nb.tiered(plans, tier=plan_of.__getitem__), key=lambda user: user)
    def work(user: str) -> str:
        return user

    assert work("alice") == "alice"
    with pytest.raises(nb.RateLimited) as refused:
        work("alice")
    assert (refused.value.retry_after_ns, refused.value.decision.plan) == (100 * MS, "free")
    plan_of["alice"] = "pro"  # 1 spent of 2 on pro: one more now, then 10 ms
    assert work("alice") == "alice"
    with pytest.raises(nb.RateLimited) as refused:
        work("alice")
    assert (refused.value.retry_after_ns, refused.value.decision.plan) == (10 * MS, "pro")


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    await PlainTextResponse("hello")(scope, receive, send)


def test_asgi_middleware_headers_name_the_plan(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient
) -> None:
    plans = plans_of(impl, clock)
    plan_of = {"header:k-alice": "free"}
    t = nb.tiered(plans, tier=plan_of.__getitem__)
    c = asgi_client(RateLimitMiddleware(_hello, t, key=header("X-API-Key")))
    alice = {"X-API-Key": "k-alice"}
    first = c.get("/", headers=alice)
    assert first.status_code == 200
    assert first.headers["ratelimit-policy"] == '"free";q=20;w=2'
    assert first.headers["ratelimit"] == '"free";r=19;t=1'
    for _ in range(19):
        c.get("/", headers=alice)
    refused = c.get("/", headers=alice)
    assert (refused.status_code, refused.headers["retry-after"]) == (429, "1")
    assert refused.headers["ratelimit-policy"] == '"free";q=20;w=2'
    assert refused.headers["ratelimit"] == '"free";r=0;t=2'
    assert refused.json()["detail"] == "Rate limit 'free' exceeded; retry after 1 s."
    plan_of["header:k-alice"] = "pro"  # 20 spent, carried: 180 left, one of them spent now
    up = c.get("/", headers=alice)
    assert up.status_code == 200
    assert up.headers["ratelimit-policy"] == '"pro";q=200;w=2'
    assert up.headers["ratelimit"] == '"pro";r=179;t=1'
    # Legacy headers: the plan's capacity.
    legacy = asgi_client(RateLimitMiddleware(_hello, t, key=header("X-API-Key"), headers="legacy"))
    assert legacy.get("/", headers=alice).headers["x-ratelimit-limit"] == "200"
    # In all_of with a global limit: the binding layer's policy, a plan's or the global one's,
    # this named by what it is: one bucket shared by every key.
    instance = impl.TokenBucket(rate=1, capacity=200, clock=clock)
    both = asgi_client(RateLimitMiddleware(_hello, nb.all_of(t, instance), key=header("X-API-Key")))
    r = both.get("/", headers=alice)
    assert r.headers["ratelimit-policy"] == '"pro";q=200;w=2'
    assert r.headers["ratelimit"] == '"pro";r=177;t=1'
    for _ in range(30):
        instance.allow()
    r = both.get("/", headers=alice)
    assert r.headers["ratelimit-policy"] == '"default:shared";q=200;w=200'
    assert r.headers["ratelimit"] == '"default:shared";r=168;t=32'


def current_user(request: Any) -> str:
    return str(request.headers.get("authorization", "")).removeprefix("Bearer ")


def test_fastapi_dependency_headers_name_the_plan(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient
) -> None:
    plans = plans_of(impl, clock)
    plan_of = {"alice": "free"}
    limit = RateLimit(nb.tiered(plans, tier=plan_of.__getitem__), key=current_user)
    app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})

    @app.get("/items", dependencies=[Depends(limit)])
    async def items() -> list[str]:
        return ["a"]

    http = asgi_client(app)
    alice = {"Authorization": "Bearer alice"}
    got = [http.get("/items", headers=alice) for _ in range(21)]
    assert [r.status_code for r in got] == [200] * 20 + [429]
    assert got[0].headers["ratelimit-policy"] == '"free";q=20;w=2'
    assert got[19].headers["ratelimit"] == '"free";r=0;t=2'
    assert got[20].headers["retry-after"] == "1"
    plan_of["alice"] = "pro"
    up = http.get("/items", headers=alice)
    assert up.status_code == 200
    assert up.headers["ratelimit-policy"] == '"pro";q=200;w=2'
    assert up.headers["ratelimit"] == '"pro";r=179;t=1'


# -- shared memory ----------------------------------------------------------------


@pytest.fixture
def shared_plans() -> Iterator[dict[str, Any]]:
    pytest.importorskip("nanobucket._core._shared_c")
    free = SharedKeyedTokenBucket.create_anonymous(rate=FREE[0], capacity=FREE[1])
    pro = SharedKeyedTokenBucket.create_anonymous(rate=PRO[0], capacity=PRO[1])
    yield {"free": free, "pro": pro}
    free.close()
    pro.close()


@pytest.mark.c_extension
def test_shared_memory(shared_plans: dict[str, Any]) -> None:
    asyncio.run(scenario(shared_plans))


@pytest.mark.c_extension
def test_shared_memory_refunds_reserves_and_waits_but_has_no_reset(
    shared_plans: dict[str, Any],
) -> None:
    t = nb.tiered(shared_plans, tier=lambda key: "free")
    assert all(isinstance(t, contract) for contract in (Reservable, Refundable))
    assert t.allow_at("alice", 0, cost=20) and t.refund_at("alice", 0, cost=5) is None
    assert t.tokens_at("alice", 0) == 5.0
    assert t.reserve("alice", cost=10, max_wait_ns=S, now=0) == S // 2  # 5 owed: 0.5 s
    with pytest.raises(TypeError, match=r"plan .free. .* has no reset"):
        t.reset("alice")
    limit = nb.all_of(t, nb.TokenBucket(rate=1, capacity=30))
    assert sum(limit.allow_at("bob", 0) for _ in range(30)) == 20
    assert limit.layers[1].tokens_at(0) == 10.0  # the refusals cost the global layer nothing
    clock = ManualClock()
    plan = SharedKeyedTokenBucket.create_anonymous(rate=FREE[0], capacity=FREE[1], clock=clock)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(round(seconds * S))

    waiting = nb.Waiting(nb.tiered({"free": plan}, tier=lambda key: "free"), sleep=sleep)
    assert waiting.acquire("carol", cost=20) and waiting.acquire("carol", cost=2, timeout=1)
    assert slept == [0.2] and clock.now == 200 * MS  # reserved in the table, then slept
    assert not waiting.acquire("carol", cost=20, timeout=1)  # 2 s: refused, nothing reserved
    assert plan.peek_at("carol", 200 * MS).retry_after_ns == 100 * MS
    plan.close()


# -- Redis: sync and asyncio, a real redis-server -----------------------------------


def _prefix(name: str) -> str:
    return f"tiered-{name}-{random.getrandbits(40):x}"


def test_redis(redis_url: str) -> None:
    plans = {
        "free": nbr.RedisTokenBucket.from_url(redis_url, *FREE, prefix=_prefix("free")),
        "pro": nbr.RedisTokenBucket.from_url(redis_url, *PRO, prefix=_prefix("pro")),
    }
    asyncio.run(scenario(plans))
    for plan in plans.values():
        plan.close()


def test_redis_asyncio(redis_url: str) -> None:
    async def main() -> None:
        plans = {
            "free": nbr.AsyncRedisTokenBucket.from_url(redis_url, *FREE, prefix=_prefix("free")),
            "pro": nbr.AsyncRedisTokenBucket.from_url(redis_url, *PRO, prefix=_prefix("pro")),
        }
        await scenario(plans)
        for plan in plans.values():
            await plan.aclose()

    asyncio.run(main())


def test_redis_asyncio_one_loop(redis_url: str) -> None:
    async def main() -> None:
        plans = {
            "free": nbr.AsyncRedisTokenBucket.from_url(redis_url, *FREE, prefix=_prefix("free")),
            "pro": nbr.AsyncRedisTokenBucket.from_url(redis_url, *PRO, prefix=_prefix("pro")),
        }
        plan_of = {"alice": "free", "bob": "pro"}
        t = nb.tiered(plans, tier=plan_of.__getitem__)
        assert isinstance(t, nb.AsyncTiered)
        assert sum([await t.allow_at("bob", 0) for _ in range(210)]) == 200
        assert list(await t.allow_many_at(["alice"] * 25, 0)) == [1] * 20 + [0] * 5
        assert await t.allow_at("alice", 0) is False
        d = await t.check_at("alice", 0)
        assert _fields(d) == ("free", False, 0, 100 * MS, 2 * S, 20)
        assert d.source == "redis"
        await t.refund_at("alice", 0, cost=5)
        assert (await t.peek_at("alice", 0, cost=0)).remaining == 5
        # Eight tasks see the upgrade at once: the 15 spent are carried once.
        plan_of["alice"] = "pro"
        seen = await asyncio.gather(*(t.peek_at("alice", 0, cost=0) for _ in range(8)))
        assert [d.remaining for d in seen] == [185] * 8
        assert (await t.peek_at("alice", 0)).plan == "pro"
        await t.reset("alice")
        assert (await plans["pro"].peek_at("alice", 0, cost=0)).remaining == 200
        assert (await plans["free"].peek_at("alice", 0, cost=0)).remaining == 20
        # With Redis's clock, and waiting: a rate of one an hour keeps it exact.
        slow = {
            "free": nbr.AsyncRedisTokenBucket.from_url(redis_url, 1 / 3600, 1, prefix=_prefix("s")),
        }
        s = nb.tiered(slow, tier=lambda key: "free")
        assert [await s.allow("carol"), await s.allow("carol")] == [True, False]
        assert -(-(await s.check("carol")).retry_after_ns // S) == 3600  # Redis time moves
        assert (await s.peek("carol")).plan == "free"
        assert list(await s.allow_many(["dave", "dave"])) == [1, 0]
        assert await s.acquire_async("erin") is True
        assert await s.acquire_async("erin", timeout=0.1) is False
        assert await s.reserve("frank", cost=1) == 0
        await s.refund("frank")
        assert await s.allow("frank") is True
        for plan in (*plans.values(), *slow.values()):
            await plan.aclose()

    asyncio.run(main())


def test_redis_plans_in_one_prefix_and_a_redis_that_cannot_answer(redis_url: str) -> None:
    same = _prefix("same")
    with pytest.raises(ValueError, match="'free' and 'trial' share their Redis buckets"):
        nb.tiered(
            {
                "free": nbr.RedisTokenBucket(redis.Redis(), *FREE, prefix=same),
                "trial": nbr.RedisTokenBucket(redis.Redis(), *FREE, prefix=same),
            },
            tier=lambda key: "free",
        )
    # Two limits on one prefix keep their buckets apart (a key space each): accepted.
    apart = nb.tiered(
        {
            "free": nbr.RedisTokenBucket.from_url(redis_url, *FREE, prefix=same),
            "pro": nbr.RedisTokenBucket.from_url(redis_url, *PRO, prefix=same),
        },
        tier=lambda key: "pro",
    )
    assert apart.check_at("alice", 0, cost=150).remaining == 50
    # Redis down: the policy decides, the move is not made nor remembered (tried again).
    down = nbr.CircuitBreaker(clock=lambda: 0)
    down.record_failure()
    plans = {
        "free": nbr.RedisTokenBucket(
            redis.Redis(), *FREE, on_error="open", breaker=down, prefix="a"
        ),
        "pro": nbr.RedisTokenBucket(redis.Redis(), *PRO, on_error="open", breaker=down, prefix="b"),
    }
    t = nb.tiered(plans, tier=lambda key: "pro")
    d = t.check_at("alice", 0)
    assert (d.plan, d.allowed, d.source, len(t)) == ("pro", True, "policy:open", 0)
    # A sync Redis plan waits through its own acquire; Waiting over it reserves in Redis.
    live = nb.tiered(
        {"free": nbr.RedisTokenBucket.from_url(redis_url, 1 / 3600, 1, prefix=_prefix("w"))},
        tier=lambda key: "free",
    )
    assert live.acquire("alice") is True and live.acquire("alice", timeout=0.1) is False
    assert nb.Waiting(live).acquire("bob", timeout=0.1) is True
    assert nb.Waiting(live).acquire("bob", timeout=0.1) is False


# -- bad input --------------------------------------------------------------------


def test_bad_input_is_a_clear_error(impl: ModuleType) -> None:
    free, pro = impl.KeyedTokenBucket(*FREE), impl.KeyedTokenBucket(*PRO)
    async_plan = nbr.AsyncRedisTokenBucket(redis.asyncio.Redis(), *PRO)
    with pytest.raises(TypeError, match=r"all sync or all asyncio: \['free'\] are sync, \['pro'\]"):
        nb.tiered({"free": free, "pro": async_plan}, tier=lambda key: "free")
    with pytest.raises(ValueError, match="at least one plan"):
        nb.tiered({}, tier=lambda key: "free")
    with pytest.raises(TypeError, match="must be a mapping"):
        nb.tiered([free], tier=lambda key: "free")  # type: ignore[arg-type]
    for plan in (impl.TokenBucket(1, 1), nb.all_of(free), object()):
        with pytest.raises(TypeError, match="a plan must be one keyed table"):
            nb.tiered({"free": plan}, tier=lambda key: "free")
    for name in ("", 'say "hi"', "back\\slash", "caf\u00e9", 7):
        with pytest.raises(ValueError, match="a plan name must be a non-empty string"):
            nb.tiered({name: free}, tier=lambda key: "free")  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="'free' and 'pro' are the same limiter"):
        nb.tiered({"free": free, "pro": free}, tier=lambda key: "free")
    with pytest.raises(TypeError, match="tier must be a callable"):
        nb.tiered({"free": free}, tier="free")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="default 'gold' is not a plan"):
        nb.tiered({"free": free}, tier=lambda key: "free", default="gold")
    with pytest.raises(ValueError, match="max_keys"):
        nb.tiered({"free": free}, tier=lambda key: "free", max_keys=0)
    with pytest.raises(TypeError, match="asyncio plans: use AsyncTiered"):
        nb.Tiered({"pro": async_plan}, tier=lambda key: "pro")
    with pytest.raises(TypeError, match="sync plans: use Tiered"):
        nb.AsyncTiered({"pro": pro}, tier=lambda key: "pro")
    t = nb.tiered({"free": free, "pro": pro}, tier=lambda key: "gold")
    with pytest.raises(ValueError, match=r"tier\('alice'\) returned 'gold', which is not a plan"):
        t.check("alice")
    ok = nb.tiered({"free": free}, tier=lambda key: "free")
    with pytest.raises(TypeError, match="not a single str"):
        ok.allow_many("alice")
    with pytest.raises(ValueError):
        ok.allow("alice", cost=21)  # over the plan's capacity: the plan's own error
    with pytest.raises(TypeError, match="unhashable"):
        ok.allow(["alice"])
    assert isinstance(nb.tiered({"pro": async_plan}, tier=lambda key: "pro"), nb.AsyncTiered)

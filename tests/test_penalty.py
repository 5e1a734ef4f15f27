"""The penalty box: strikes, bans to the nanosecond, hammering, many keys, on every backend.

The in-process tests run on both implementations (`impl`); the shared-memory
ones across real forked processes; the Redis ones on the session's
redis-server. Times are explicit (``*_at``) or an injected clock's.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import warnings
from collections.abc import Callable
from fractions import Fraction
from types import ModuleType
from typing import Any

import pytest

import nanobucket as nb
from nanobucket import redis as nbr
from nanobucket.penalty import AsyncPenaltyBox, Banned, PenaltyBox, penalty_box
from nanobucket.shared import SharedKeyedTokenBucket

from conftest import NEEDS_SHARED_TABLE, ManualClock, run_threads
from http_checks import MakeClient, asgi_client

__all__ = ("asgi_client",)  # a fixture, used by name

S = 1_000_000_000
WITHIN = 60 * S
BAN = 900 * S
#: A limiter that refuses a key once it has spent its one token (none back for a day).
SLOW = Fraction(1, 86400)


def fields(d: Any) -> tuple[Any, ...]:
    return (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)


def banned(wait: int, limit: int) -> tuple[Any, ...]:
    return (False, 0, wait, wait, limit)


# -- in process: both implementations -----------------------------------------------


def test_the_strikes_th_refusal_bans_to_the_nanosecond(impl: ModuleType) -> None:
    inner = impl.KeyedTokenBucket(rate=1, capacity=2)
    box = penalty_box(inner, strikes=3, within=60, ban=900)
    assert [box.allow_at("ip", 0) for _ in range(2)] == [True, True]
    for _ in range(2):  # strikes 1 and 2: the limiter's own refusal
        d = box.check_at("ip", 0)
        assert type(d) is not Banned and fields(d) == (False, 0, S, 2 * S, 2)
    d = box.check_at("ip", 0)  # strike 3: the ban starts with this refusal
    assert isinstance(d, Banned) and fields(d) == banned(BAN, 2)
    assert (d.retry_after, d.reset_after) == (900.0, 900.0)
    d = box.check_at("ip", BAN - 1)
    assert fields(d) == banned(1, 2)
    assert box.allow_at("ip", BAN - 1) is False
    assert box.tokens_at("ip", BAN - 1) == 0.0
    assert fields(box.check_at("ip", BAN)) == (True, 1, 0, S, 2)  # over: the limiter decides


def test_strikes_closer_than_within_ban_and_one_per_within_never(impl: ModuleType) -> None:
    def box() -> Any:
        return penalty_box(impl.KeyedTokenBucket(SLOW, 1), strikes=2, within=60, ban=900)

    near = box()
    assert near.allow_at("ip", 0)
    assert type(near.check_at("ip", 0)) is not Banned  # strike 1
    assert isinstance(near.check_at("ip", WITHIN - 1), Banned)  # strike 2, a ns too soon
    far = box()
    assert far.allow_at("ip", 0)
    for k in range(20):  # a refusal every `within`, forever: each strike forgiven in time
        d = far.check_at("ip", k * WITHIN)
        assert type(d) is not Banned and d.allowed is False
    # Five refusals within a minute with strikes=5: banned, however they are spread.
    five = penalty_box(impl.KeyedTokenBucket(SLOW, 1), strikes=5, within=60, ban=900)
    assert five.allow_at("ip", 0)
    got = [type(five.check_at("ip", k * 14 * S)) is Banned for k in range(5)]
    assert got == [False, False, False, False, True]
    # Six refusals 20 s apart (no minute holds more than 3): banned by the 6th, not before.
    spread = penalty_box(impl.KeyedTokenBucket(SLOW, 1), strikes=5, within=60, ban=900)
    assert spread.allow_at("ip", 0)
    got = [type(spread.check_at("ip", k * 20 * S)) is Banned for k in range(6)]
    assert got == [False] * 5 + [True]
    # 24 s apart (6 over exactly 2 minutes): 2 of the 6 strikes forgiven, 1 left: no ban.
    even = penalty_box(impl.KeyedTokenBucket(SLOW, 1), strikes=5, within=60, ban=900)
    assert even.allow_at("ip", 0)
    assert {type(even.check_at("ip", k * 24 * S)) is Banned for k in range(6)} == {False}


def test_an_admitted_request_clears_no_strike(impl: ModuleType) -> None:
    box = penalty_box(impl.KeyedTokenBucket(rate=1, capacity=1), strikes=2, within=3600)
    assert box.allow_at("ip", 0)
    assert box.allow_at("ip", 0) is False  # strike 1
    assert box.allow_at("ip", S)  # admitted: a token came back
    assert isinstance(box.check_at("ip", S), Banned)  # strike 2: banned all the same


def test_a_banned_key_hammering_touches_nothing(impl: ModuleType) -> None:
    inner = impl.KeyedTokenBucket(rate=1, capacity=5)
    box = penalty_box(inner, strikes=1, within=60, ban=900)
    assert inner.allow_at("ip", 0, cost=5)
    assert isinstance(box.check_at("ip", 0), Banned)
    t = 10 * S
    before = [
        (part.peek_at("ip", t, 0), part.tokens_at("ip", t))
        for part in (inner, box.strikes, box.bans)
    ]
    for i in range(1000):
        assert fields(box.check_at("ip", t, cost=i % 6)) == banned(BAN - t, 5)
        assert box.allow_at("ip", t) is False
        assert fields(box.peek_at("ip", t)) == banned(BAN - t, 5)
    assert list(box.allow_many_at(["ip"] * 100, t)) == [0] * 100
    after = [
        (part.peek_at("ip", t, 0), part.tokens_at("ip", t))
        for part in (inner, box.strikes, box.bans)
    ]
    assert after == before
    assert inner.tokens_at("ip", t) == 5.0  # refilled as time passed, never spent
    with pytest.raises(
        ValueError, match=r"^cost 6 exceeds capacity 5: it could never be admitted$"
    ):
        box.check_at("ip", t, cost=6)  # banned or not, a bad cost is refused


def test_a_short_ban_leaves_strikes_unforgiven(impl: ModuleType) -> None:
    box = penalty_box(impl.KeyedTokenBucket(SLOW, 1), strikes=3, within=60, ban=10)
    assert box.allow_at("ip", 0)
    assert [type(box.check_at("ip", 0)) is Banned for _ in range(3)] == [False, False, True]
    # 10 s later the ban is over, but only a sixth of a strike is forgiven: banned again.
    assert fields(box.check_at("ip", 10 * S)) == banned(10 * S, 1)
    # After `strikes * within` every strike is forgiven: two refusals before a ban.
    later = 10 * S + 180 * S
    assert [type(box.check_at("ip", later)) is Banned for _ in range(3)] == [False, False, True]


def test_many_keys_each_banned_alone(impl: ModuleType) -> None:
    inner = impl.KeyedTokenBucket(SLOW, 1)
    box = penalty_box(inner, strikes=2, within=60, ban=900)
    keys = [f"10.0.{i // 256}.{i % 256}" for i in range(3000)]
    assert list(box.allow_many_at(keys, 0)) == [1] * 3000
    assert list(box.allow_many_at(keys, 0)) == [0] * 3000  # strike 1 each
    assert list(box.allow_many_at(keys * 2, S)) == [0] * 6000  # strike 2: banned, then banned
    assert {fields(box.check_at(k, 2 * S)) for k in keys} == {banned(BAN - S, 1)}
    assert box.allow_at("innocent", 2 * S)
    d = box.check_at("innocent", 2 * S)
    assert type(d) is not Banned and d.allowed is False  # its own first strike
    assert {box.allow_at(k, BAN + S) for k in keys} == {False}  # the limiter's refusal again
    assert type(box.check_at(keys[0], BAN + S)) is Banned  # strikes left: the next bans


def test_a_key_banned_in_a_batch_is_refused_by_the_rest_of_it(impl: ModuleType) -> None:
    box = penalty_box(impl.KeyedTokenBucket(rate=1, capacity=1), strikes=1, within=60)
    assert list(box.allow_many_at(["a", "a", "b", "a"], 0)) == [1, 0, 1, 0]
    assert type(box.peek_at("a", 0)) is Banned and type(box.peek_at("b", 0)) is not Banned
    with pytest.raises(TypeError, match=r"^unhashable type: 'list'$"):
        box.allow_many_at(["b", ["x"]], 0)
    assert box.tokens_at("b", 0) == 0.0 and box.peek_at("b", S).allowed  # b not charged twice


def test_unban_ends_the_ban_and_forgives_the_strikes(impl: ModuleType, clock: ManualClock) -> None:
    inner = impl.KeyedTokenBucket(SLOW, 1, clock=clock)
    box = penalty_box(inner, strikes=2, within=60, ban=900)
    assert box.allow("ip") and not box.allow("ip") and not box.allow("ip")
    clock.advance(S)
    assert fields(box.check("ip")) == banned(BAN - S, 1)  # the tables run on the limiter's clock
    box.unban("ip")
    assert type(box.check("ip")) is not Banned  # strike 1 of 2 again
    assert isinstance(box.check("ip"), Banned)


def test_refund_gives_the_limiters_tokens_back_and_keeps_the_strikes(impl: ModuleType) -> None:
    box = penalty_box(impl.KeyedTokenBucket(SLOW, 2), strikes=2, within=60)
    assert box.allow_at("ip", 0, cost=2) and not box.allow_at("ip", 0)  # strike 1
    box.refund_at("ip", 0, cost=2)
    assert box.tokens_at("ip", 0) == 2.0 and box.strikes.tokens_at("ip", 0) == 1.0


def test_it_is_a_keyed_limiter_with_the_limiters_limit(impl: ModuleType) -> None:
    inner = impl.KeyedTokenBucket(rate=3, capacity=7)
    box: Any = penalty_box(inner)
    assert (box.keyed, box.rate, box.capacity, box.blocking) == (True, 3, 7, False)
    protocols = (nb.KeyedLimiter, nb.Refundable, nb.Reservable, nb.Composite)
    assert [isinstance(box, p) for p in protocols] == [True, True, False, False]
    assert (box.strikes.capacity, box.strikes.interval_ns) == (5, WITHIN)
    assert (box.bans.capacity, box.bans.interval_ns) == (1, BAN)
    assert type(box.strikes) is type(inner) and box.limiter is inner
    assert penalty_box(inner, within=0.25, ban=1e-9).strikes.interval_ns == S // 4
    # all_of takes it, as a layer beside an instance-wide bucket.
    both = nb.all_of(penalty_box(impl.KeyedTokenBucket(SLOW, 1), strikes=1), impl.TokenBucket(1, 9))
    assert both.allow_at("ip", 0) and not both.allow_at("ip", 0)
    assert isinstance(both.check_at("ip", 0).decisions[0], Banned)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"strikes": 0}, ValueError, "strikes must be >= 1, got 0"),
        ({"strikes": True}, TypeError, "strikes must be an int, not bool"),
        ({"within": 0}, ValueError, "within must be > 0 seconds, got 0"),
        ({"ban": -1.5}, ValueError, "ban must be > 0 seconds, got -1.5"),
        ({"ban": math.nan}, ValueError, "ban must be a finite number of seconds, got nan"),
        ({"within": "60"}, TypeError, "within must be a number of seconds, not str"),
        (
            {"prefix": "x"},
            TypeError,
            "prefix= names the tables in Redis: give it with a Redis limiter only",
        ),
    ],
)
def test_bad_arguments_are_refused(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        penalty_box(nb.KeyedTokenBucket(1, 1), **kwargs)


def test_limiters_and_tables_it_cannot_hold_are_refused() -> None:
    table = nb.KeyedTokenBucket(1, 1)
    with pytest.raises(TypeError, match=r"^limiter is TokenBucket: a penalty box needs a keyed"):
        penalty_box(nb.TokenBucket(1, 1))
    with pytest.raises(TypeError, match=r"^limiter is AllOf, made of others: put the penalty box"):
        penalty_box(nb.all_of(table))
    with pytest.raises(TypeError, match=r"^limiter is KeyedConcurrency, an in-flight limit"):
        penalty_box(nb.KeyedConcurrency(2))
    with pytest.raises(
        TypeError, match=r"^penalty_box\(\) makes its tables for a KeyedTokenBucket"
    ):
        penalty_box(_OwnLimiter())
    with pytest.raises(ValueError, match=r"^bans must have capacity 1"):
        PenaltyBox(table, strikes=nb.KeyedTokenBucket(1, 5), bans=nb.KeyedTokenBucket(1, 2))
    with pytest.raises(ValueError, match=r"^the limiter, strikes and bans must be three different"):
        PenaltyBox(table, strikes=table, bans=nb.KeyedTokenBucket(1, 1))
    with pytest.raises(TypeError, match=r"^strikes is TokenBucket: it must be one keyed table"):
        PenaltyBox(table, strikes=nb.TokenBucket(1, 1), bans=nb.KeyedTokenBucket(1, 1))
    with pytest.raises(TypeError, match=r"^a sync limiter: use PenaltyBox"):
        AsyncPenaltyBox(table, strikes=nb.KeyedTokenBucket(1, 5), bans=nb.KeyedTokenBucket(1, 1))


class _OwnLimiter:
    """A keyed limiter of one's own: penalty_box cannot make tables of its kind."""

    keyed = True
    capacity = 1

    def allow(self, key: Any, cost: int = 1) -> bool:
        return True

    allow_at = check = check_at = peek = peek_at = allow


@pytest.mark.gil_atomic  # threads inserting keys into C tables: a coverage run crashed here
def test_threads_racing_one_key_get_exactly_strikes_minus_one_plain_refusals(
    impl: ModuleType,
) -> None:
    inner = impl.KeyedTokenBucket(SLOW, 10, clock=lambda: 0)
    box = penalty_box(inner, strikes=4, within=60, ban=900)
    got: list[list[Any]] = [[] for _ in range(8)]

    def hammer(i: int) -> None:
        got[i] = [box.check("ip") for _ in range(200)]

    run_threads(8, hammer)
    decisions = [d for mine in got for d in mine]
    admitted = [d for d in decisions if d.allowed]
    plain = [d for d in decisions if not d.allowed and type(d) is not Banned]
    bans = {fields(d) for d in decisions if type(d) is Banned}
    # The strikes table is atomic: the 4th strike bans, whoever spends it.
    assert (len(admitted), len(plain), bans) == (10, 3, {banned(BAN, 10)})
    assert box.strikes.tokens_at("ip", 0) == 0.0 and inner.tokens_at("ip", 0) == 0.0


def test_tables_of_a_per_process_limiter_are_per_process_too(impl: ModuleType) -> None:
    box = penalty_box(impl.KeyedTokenBucket(1, 1, per_process=True), strikes=1)
    assert (box.strikes.per_process, box.bans.per_process) == (True, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a forked copy's warning would fail the child
        assert _in_child(lambda: sum(box.allow_at("ip", 0) for _ in range(3))) == 1
    assert type(box.check_at("ip", 0)) is not Banned  # the child's ban was its own copy's


# -- in front of a web API -------------------------------------------------------------


def test_the_asgi_middleware_answers_a_ban_with_its_time(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient
) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route as StarletteRoute

    from nanobucket.asgi import RateLimitMiddleware

    async def login(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    box = penalty_box(impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock), strikes=2)
    login_app = Starlette(routes=[StarletteRoute("/login", login, methods=["POST"])])
    client = asgi_client(RateLimitMiddleware(login_app, limiter=box))
    assert [client.post("/login").status_code for _ in range(4)] == [200, 200, 429, 429]
    clock.advance(100 * S)  # the limiter refilled long ago; the ban has 800 s to go
    r = client.post("/login")
    assert r.status_code == 429
    assert (r.headers["retry-after"], r.headers["ratelimit"]) == ("800", '"default";r=0;t=800')
    assert r.headers["ratelimit-policy"] == '"default";q=2;w=2'  # the limiter's own limit
    assert r.json()["retry_after"] == 800


# -- shared memory: one ban for every process ---------------------------------------------


def _in_child(body: Callable[[], int]) -> int:
    """Run *body* in a forked child; its result (0..255) as the child's exit code."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 255
        try:
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize(
    "named",
    [
        pytest.param(False, marks=NEEDS_SHARED_TABLE, id="anonymous"),
        pytest.param(True, marks=NEEDS_SHARED_TABLE, id="named"),
    ],
)
def test_a_ban_in_one_process_holds_in_another(named: bool, tmp_path: Any) -> None:
    if named:
        inner = SharedKeyedTokenBucket.create(path=tmp_path / "login", rate=SLOW, capacity=1)
    else:
        inner = SharedKeyedTokenBucket.create_anonymous(rate=SLOW, capacity=1)
    box = penalty_box(inner, strikes=2, within=60, ban=900)
    assert box.strikes.path == (str(tmp_path / "login-strikes") if named else None)

    def offend() -> int:  # a worker: the key's token, then two refusals
        return sum(1 << i for i, ok in enumerate(box.allow_at("ip", 0) for _ in range(3)) if ok)

    assert _in_child(offend) == 0b001
    assert fields(box.check_at("ip", S)) == banned(BAN - S, 1)  # this process sees the ban

    def hammer() -> int:  # another worker, during the ban: every request refused outright
        return sum(box.allow_at("ip", S) for _ in range(500))

    assert _in_child(hammer) == 0
    assert box.strikes.tokens_at("ip", 0) == 0.0 and inner.tokens_at("ip", 0) == 0.0
    if named:  # a worker that opens the tables by name shares them too
        again = penalty_box(
            SharedKeyedTokenBucket.open(path=tmp_path / "login"), strikes=2, within=60, ban=900
        )
        assert fields(again.check_at("ip", BAN - 1)) == banned(1, 1)
        assert fields(again.check_at("other", 0)) == (True, 0, 0, 86400 * S, 1)
    assert type(box.check_at("ip", BAN)) is not Banned  # over, to the ns, everywhere


# -- Redis -----------------------------------------------------------------------------------


@pytest.fixture
def redis_client(redis_url: str) -> Any:
    client = nbr.client_from_url(redis_url, socket_timeout=2.0)
    yield client
    client.close()


def test_redis_bans_to_the_nanosecond(redis_client: Any) -> None:
    prefix = f"penalty-test-{os.urandom(4).hex()}"
    inner = nbr.RedisTokenBucket(redis_client, rate=1, capacity=2, prefix=prefix, timeout=2.0)
    box = penalty_box(inner, strikes=2, within=60, ban=900, prefix=prefix)
    t0 = 10**15
    assert [box.allow_at("ip", t0) for _ in range(3)] == [True, True, False]  # strike 1
    assert fields(box.check_at("ip", t0 + 1000)) == banned(BAN, 2)  # strike 2
    assert fields(box.check_at("ip", t0 + 1000 + BAN - 1000)) == banned(1000, 2)
    assert sum(box.allow_at("ip", t0 + S) for _ in range(200)) == 0
    assert inner.peek_at("ip", t0 + S, 0).remaining == 1  # the hammering spent nothing
    assert box.strikes.key("ip") == f"{prefix}:strikes:60000000:2:{{ip}}".encode()
    assert box.blocking is True
    assert box.check_at("ip", t0 + 1000 + BAN).allowed  # over, to the microsecond Redis keeps
    for table in (box.strikes, box.bans, inner):
        table.close()


def test_asyncio_redis_bans_alike(redis_url: str) -> None:
    async def main() -> None:
        prefix = f"penalty-test-{os.urandom(4).hex()}"
        client = nbr.client_from_url(redis_url, socket_timeout=2.0, asyncio=True)
        inner = nbr.AsyncRedisTokenBucket(client, rate=1, capacity=1, prefix=prefix, timeout=2.0)
        box = penalty_box(inner, strikes=1, within=60, ban=900, prefix=prefix)
        assert type(box) is AsyncPenaltyBox
        t0 = 10**15
        assert await box.allow_at("ip", t0) and not await box.allow_at("ip", t0)
        assert fields(await box.check_at("ip", t0 + S)) == banned(BAN - S, 1)
        await box.unban_at("ip", t0 + S)
        d = await box.check_at("ip", t0 + S)
        assert type(d) is not Banned and d.allowed  # unbanned: the limiter's token is back
        for table in (box.strikes, box.bans, inner):
            await table.aclose()

    asyncio.run(main())


def test_a_redis_outage_bans_no_one(redis_client: Any) -> None:
    prefix = f"penalty-test-{os.urandom(4).hex()}"
    inner = nbr.RedisTokenBucket(redis_client, rate=SLOW, capacity=1, prefix=prefix, timeout=2.0)
    box = penalty_box(inner, strikes=1, within=60, ban=900, prefix=prefix)
    for table in (box.strikes, box.bans):
        table.breaker.record_failure()  # the penalty tables' Redis is down: they fail open
        assert table.breaker.state == "open"
    assert box.allow_at("ip", 10**15) and not box.allow_at("ip", 10**15)
    d = box.check_at("ip", 10**15)
    assert type(d) is not Banned and d.allowed is False  # the limiter's refusal, no ban

"""A penalty box: a key refused too often is refused outright for a while, as fail2ban bans.

Written here; documented and imported as ``nanobucket.penalty`` (whose `penalty_box` makes
the tables of a limiter's kind).
"""

from __future__ import annotations

from collections.abc import Generator, Hashable, Iterable
from typing import Any

from .._core._bucket import Decision
from .._core._limiter import Composite, is_async
from .._core._params import validated_cost, validated_now
from .drive import Call, drive, drive_async
from .verbs import AsyncKeyedVerbs, KeyedBatch, KeyedVerbs

__all__ = ("AsyncPenaltyBox", "Banned", "PenaltyBox")

_TABLE_VERBS = ("check", "check_at", "peek", "peek_at", "refund", "refund_at")
_VERBS = ("allow", "allow_at", *_TABLE_VERBS[:4])


class Banned(Decision):
    """The decision for a key in the penalty box: refused, until its ban ends.

    ``retry_after_ns`` and ``reset_after_ns`` are the ns left of the ban,
    ``remaining`` is 0, ``limit`` the limiter's capacity. Equality compares
    the five fields, as for every decision.

    >>> from nanobucket import KeyedTokenBucket
    >>> box = penalty_box(KeyedTokenBucket(rate=1, capacity=1), strikes=1, within=60, ban=900)
    >>> box.check_at("mallory", 0).allowed
    True
    >>> box.check_at("mallory", 0)       # refused: the one strike, and the ban starts
    Banned(allowed=False, remaining=0, retry_after_ns=900000000000, \
reset_after_ns=900000000000, limit=1)
    """

    __slots__ = ()


def _table_kind_error(name: str, what: str, table: object) -> TypeError:
    return TypeError(
        f"{what} is {type(table).__name__}: it must be one keyed table with check, peek "
        f"(and their _at forms) and refund (KeyedTokenBucket, SharedKeyedTokenBucket, "
        f"RedisTokenBucket...) of {name}"
    )


def _check_limiter(limiter: object) -> None:
    """Refuse a limiter a penalty box cannot hold (TypeError)."""
    kind = type(limiter).__name__
    if isinstance(limiter, Composite):
        raise TypeError(
            f"limiter is {kind}, made of others: put the penalty box inside it "
            "(all_of(penalty_box(per_client, ...), instance)), around one keyed table"
        )
    if getattr(limiter, "releases", False) is True:
        raise TypeError(f"limiter is {kind}, an in-flight limit: a refusal there is no strike")
    if (
        getattr(limiter, "keyed", None) is not True
        or type(getattr(limiter, "capacity", None)) is not int
        or any(not callable(getattr(limiter, v, None)) for v in _VERBS)
    ):
        raise TypeError(
            f"limiter is {kind}: a penalty box needs a keyed limiter with a capacity, "
            "allow, check and peek (KeyedTokenBucket, SharedKeyedTokenBucket, "
            "RedisTokenBucket...)"
        )


def _check_parts(limiter: object, strikes: object, bans: object) -> None:
    """Refuse a limiter or tables a penalty box cannot be made of (TypeError, ValueError)."""
    _check_limiter(limiter)
    for what, table in (("strikes", strikes), ("bans", bans)):
        if (
            getattr(table, "keyed", None) is not True
            or type(getattr(table, "capacity", None)) is not int
            or any(not callable(getattr(table, v, None)) for v in _TABLE_VERBS)
            or isinstance(table, Composite)
        ):
            raise _table_kind_error("its own", what, table)
    if strikes is bans or strikes is limiter or bans is limiter:
        raise ValueError("the limiter, strikes and bans must be three different tables")
    if bans.capacity != 1:  # type: ignore[attr-defined]
        raise ValueError(
            f"bans must have capacity 1 (one ban, refilling in the ban's time), not {bans.capacity}"  # type: ignore[attr-defined]
        )
    kinds = [is_async(x) for x in (limiter, strikes, bans)]
    if len(set(kinds)) > 1:
        raise TypeError("the limiter, strikes and bans must be all sync or all asyncio")


def _at(table: Any, verb: str, key: Hashable, now: int | None, cost: object) -> Call:
    """The call of *table*'s *verb* on *key*: at *now*, or on its own clock."""
    if now is None:
        return getattr(table, verb), (key, cost)
    return getattr(table, verb + "_at"), (key, now, cost)


class _Box:
    """What the sync and asyncio penalty boxes share: the parts, and their steps."""

    keyed = True  # the verbs take the key first
    _asyncio = False
    _wrong_kind = "an asyncio limiter: use AsyncPenaltyBox (penalty_box() picks it)"

    def __init__(self, limiter: Any, *, strikes: Any, bans: Any) -> None:
        _check_parts(limiter, strikes, bans)
        if is_async(limiter) is not self._asyncio:
            raise TypeError(self._wrong_kind)
        self._limiter = limiter
        self._strikes = strikes
        self._bans = bans

    @property
    def limiter(self) -> Any:
        """The limiter that decides every key not banned.

        >>> from nanobucket import KeyedTokenBucket
        >>> per_ip = KeyedTokenBucket(rate=1, capacity=5)
        >>> penalty_box(per_ip).limiter is per_ip
        True
        """
        return self._limiter

    @property
    def strikes(self) -> Any:
        """The strikes table: ``capacity`` strikes ban a key, one forgiven per interval.

        >>> from nanobucket import KeyedTokenBucket
        >>> box = penalty_box(KeyedTokenBucket(rate=1, capacity=5), strikes=3, within=60)
        >>> box.strikes.capacity, box.strikes.interval_ns
        (3, 60000000000)
        """
        return self._strikes

    @property
    def bans(self) -> Any:
        """The bans table: one token per key, taken by a ban; its interval is the ban's time.

        >>> from nanobucket import KeyedTokenBucket
        >>> penalty_box(KeyedTokenBucket(rate=1, capacity=5), ban=900).bans.interval_ns
        900000000000
        """
        return self._bans

    @property
    def rate(self) -> Any:
        """The limiter's rate (the header fields show the limiter's limit).

        >>> from nanobucket import KeyedTokenBucket
        >>> penalty_box(KeyedTokenBucket(rate=2, capacity=5)).rate
        2
        """
        return self._limiter.rate

    @property
    def capacity(self) -> int:
        """The limiter's capacity (the ``limit`` of every decision, a ban's too).

        >>> from nanobucket import KeyedTokenBucket
        >>> penalty_box(KeyedTokenBucket(rate=2, capacity=5)).capacity
        5
        """
        capacity: int = self._limiter.capacity
        return capacity

    @property
    def blocking(self) -> bool:
        """Whether a verb waits on the network in the calling thread (a sync Redis part).

        >>> from nanobucket import KeyedTokenBucket
        >>> penalty_box(KeyedTokenBucket(rate=2, capacity=5)).blocking
        False
        """
        parts = (self._limiter, self._strikes, self._bans)
        return any(getattr(part, "blocking", False) is True for part in parts)

    def _banned(self, key: Hashable, now: int | None) -> Generator[Call, Any, int]:
        """The ns left of *key*'s ban (0: not banned), as the call it makes."""
        d = yield _at(self._bans, "peek", key, now, 1)
        return 0 if d.allowed else int(d.retry_after_ns)

    def _ban(self, wait: int, cost: object) -> Banned:
        validated_cost(cost, self.capacity)  # what the limiter would have refused, refused
        return Banned(False, 0, wait, wait, self.capacity)

    def _strike(self, key: Hashable, now: int | None) -> Generator[Call, Any, int]:
        """Count a refusal of *key*; the ns of the ban it started (0: none)."""
        s = yield _at(self._strikes, "check", key, now, 1)
        if s.allowed and s.remaining > 0:
            return 0
        b = yield _at(self._bans, "check", key, now, 1)
        # Taken: the ban runs until the token is back. Refused: another request started
        # it a moment ago. A Redis outage answers with no wait (on_error="open"): no ban.
        return int(b.reset_after_ns if b.allowed else b.retry_after_ns)

    def _deciding(
        self, key: Hashable, cost: object, now: int | None, consume: bool
    ) -> Generator[Call, Any, Any]:
        """`_decide`'s calls: the ban, then the limiter, then a strike if it refused."""
        wait = yield from self._banned(key, now)
        if wait > 0:
            return self._ban(wait, cost)
        d = yield _at(self._limiter, "check" if consume else "peek", key, now, cost)
        if d.allowed or not consume:
            return d
        wait = yield from self._strike(key, now)
        return self._ban(wait, cost) if wait > 0 else d

    def _admitting(
        self, key: Hashable, cost: object, now: int | None
    ) -> Generator[Call, Any, bool]:
        """`_admit`'s calls: as `_deciding`, with the limiter's ``allow``."""
        wait = yield from self._banned(key, now)
        if wait > 0:
            validated_cost(cost, self.capacity)
            return False
        if (yield _at(self._limiter, "allow", key, now, cost)):
            return True
        yield from self._strike(key, now)
        return False

    def _counting(self, key: Hashable, now: int | None) -> Generator[Call, Any, float]:
        """`_tokens`'s calls: 0.0 while banned, else the limiter's tokens."""
        if (yield from self._banned(key, now)) > 0:
            return 0.0
        if now is None:
            tokens = yield self._limiter.tokens, (key,)
        else:
            tokens = yield self._limiter.tokens_at, (key, now)
        return float(tokens)

    def _batch(
        self, keys: Iterable[Hashable], cost: object, now: int | None
    ) -> Generator[Call, Any, bytearray]:
        """`_many`'s calls: each key in turn, as `_admitting` (a key banned by an earlier one
        of the batch is refused); every key and the cost checked before any is charged."""
        if isinstance(keys, (str, bytes)):
            raise TypeError("keys must be a sequence of keys, not a single str or bytes")
        keys = list(keys)
        validated_cost(cost, self.capacity)
        for key in keys:  # the ban table reads each key as the limiter would
            yield _at(self._bans, "peek", key, now, 0)
        out = bytearray(len(keys))
        for i, key in enumerate(keys):
            out[i] = yield from self._admitting(key, cost, now)
        return out

    def _unbanning(self, key: Hashable, now: int | None) -> Generator[Call, Any, None]:
        yield _at(self._bans, "refund", key, now, 1)  # never above full: the ban is over
        yield _at(self._strikes, "refund", key, now, self._strikes.capacity)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self._limiter!r}, strikes={self._strikes!r}, "
            f"bans={self._bans!r})"
        )


class PenaltyBox(_Box, KeyedVerbs[Any, Any], KeyedBatch[Any, Any]):
    """A keyed limiter that bans a key refused too often; build it with `penalty_box`.

    Or give it the tables (any keyed ones, of the limiter's kind): *strikes*,
    whose capacity is the strikes that ban and whose refill forgives them,
    and *bans*, of capacity 1, whose refill interval is the ban's time.

    >>> from fractions import Fraction
    >>> from nanobucket import KeyedTokenBucket
    >>> box = PenaltyBox(KeyedTokenBucket(rate=1, capacity=1),
    ...                  strikes=KeyedTokenBucket(rate=Fraction(1, 60), capacity=2),
    ...                  bans=KeyedTokenBucket(rate=Fraction(1, 900), capacity=1))
    >>> [box.allow_at("mallory", 0) for _ in range(3)], box.check_at("mallory", 10**9).retry_after
    ([True, False, False], 899.0)
    """

    # `_decide` and `_admit` are `_deciding` and `_admitting` written out (the hot path:
    # no generator to drive), and `check` and `allow` them on the tables' clocks.

    def _decide(self, key: Hashable, cost: object, now: int | None, consume: bool) -> Any:
        bans, lr = self._bans, self._limiter
        b = bans.peek(key, 1) if now is None else bans.peek_at(key, now, 1)
        if not b.allowed and b.retry_after_ns > 0:
            return self._ban(b.retry_after_ns, cost)
        if not consume:
            return lr.peek(key, cost) if now is None else lr.peek_at(key, now, cost)
        d = lr.check(key, cost) if now is None else lr.check_at(key, now, cost)
        if d.allowed:
            return d
        wait = drive(self._strike(key, now))
        return self._ban(wait, cost) if wait > 0 else d

    def _admit(self, key: Hashable, cost: object, now: int | None) -> bool:
        bans, lr = self._bans, self._limiter
        b = bans.peek(key, 1) if now is None else bans.peek_at(key, now, 1)
        if not b.allowed and b.retry_after_ns > 0:
            validated_cost(cost, self.capacity)
            return False
        if lr.allow(key, cost) if now is None else lr.allow_at(key, now, cost):
            return True
        drive(self._strike(key, now))
        return False

    def check(self, key: Hashable, cost: int = 1) -> Any:
        """Spend *cost* of *key*'s limit now, unless it is banned: the limiter's decision, or a
        `Banned` (this refusal may start the ban).

        >>> from nanobucket import KeyedTokenBucket
        >>> box = penalty_box(KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0), strikes=1)
        >>> box.check("alice").allowed, type(box.check("alice")).__name__
        (True, 'Banned')
        """
        b = self._bans.peek(key, 1)
        if not b.allowed and b.retry_after_ns > 0:
            return self._ban(b.retry_after_ns, cost)
        d = self._limiter.check(key, cost)
        if d.allowed:
            return d
        wait = drive(self._strike(key, None))
        return self._ban(wait, cost) if wait > 0 else d

    def allow(self, key: Hashable, cost: int = 1) -> bool:
        """`check`, as True if admitted.

        >>> from nanobucket import KeyedTokenBucket
        >>> box = penalty_box(KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0), strikes=1)
        >>> box.allow("alice"), box.allow("alice"), box.allow("alice", cost=0)  # banned: even 0
        (True, False, False)
        """
        b = self._bans.peek(key, 1)
        if not b.allowed and b.retry_after_ns > 0:
            validated_cost(cost, self.capacity)
            return False
        if self._limiter.allow(key, cost):
            return True
        drive(self._strike(key, None))
        return False

    def _tokens(self, key: Hashable, now: int | None) -> float:
        return drive(self._counting(key, now))

    def _many(self, keys: Iterable[Hashable], cost: object, now: int | None) -> bytearray:
        return drive(self._batch(keys, cost, now))

    def _give(self, key: Hashable, cost: object, now: int | None) -> Any:
        lr = self._limiter
        return lr.refund(key, cost) if now is None else lr.refund_at(key, now, cost)

    def unban(self, key: Hashable) -> None:
        """End *key*'s ban and forgive its strikes: its next request is the limiter's to decide.

        >>> from nanobucket import KeyedTokenBucket
        >>> box = penalty_box(KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0), strikes=1)
        >>> box.allow("alice"), box.allow("alice"), box.unban("alice"), box.peek("alice").allowed
        (True, False, None, False)
        >>> type(box.peek("alice")).__name__   # refused by the limiter, no longer banned
        'Decision'
        """
        drive(self._unbanning(key, None))

    def unban_at(self, key: Hashable, now: int) -> None:
        """`unban` at an explicit time *now* (int ns), the time the tables were used at.

        >>> from nanobucket import KeyedTokenBucket
        >>> box = penalty_box(KeyedTokenBucket(rate=1, capacity=1), strikes=1)
        >>> box.allow_at("alice", 0), box.allow_at("alice", 0), box.unban_at("alice", 0)
        (True, False, None)
        >>> box.peek_at("alice", 10**9).allowed   # a token back: the limiter admits
        True
        """
        drive(self._unbanning(key, validated_now(now)))


class AsyncPenaltyBox(_Box, AsyncKeyedVerbs[Any, Any]):
    """`PenaltyBox` over an asyncio limiter (``AsyncRedisTokenBucket``): the same verbs, awaited.

    ``penalty_box`` builds it for an asyncio limiter, with asyncio tables.

    >>> import redis.asyncio
    >>> from nanobucket.redis import AsyncRedisTokenBucket
    >>> per_ip = AsyncRedisTokenBucket(redis.asyncio.Redis(), rate=1, capacity=5, prefix="login")
    >>> box = penalty_box(per_ip, strikes=5, within=60, ban=900)   # no connection made yet
    >>> type(box).__name__, box.strikes.key("mallory")
    ('AsyncPenaltyBox', b'nanobucket-penalty:strikes:60000000:5:{mallory}')
    """

    _asyncio = True
    _wrong_kind = "a sync limiter: use PenaltyBox (penalty_box() picks it)"

    async def _decide(self, key: Hashable, cost: object, now: int | None, consume: bool) -> Any:
        return await drive_async(self._deciding(key, cost, now, consume))

    async def _admit(self, key: Hashable, cost: object, now: int | None) -> bool:
        return await drive_async(self._admitting(key, cost, now))

    async def _tokens(self, key: Hashable, now: int | None) -> float:
        return await drive_async(self._counting(key, now))

    async def _many(self, keys: Iterable[Hashable], cost: object, now: int | None) -> bytearray:
        return await drive_async(self._batch(keys, cost, now))

    async def _give(self, key: Hashable, cost: object, now: int | None) -> Any:
        lr = self._limiter
        return await (lr.refund(key, cost) if now is None else lr.refund_at(key, now, cost))

    async def unban(self, key: Hashable) -> None:
        """End *key*'s ban and forgive its strikes (see `PenaltyBox.unban`).

        >>> import asyncio, redis.asyncio
        >>> from nanobucket.redis import AsyncRedisTokenBucket, CircuitBreaker
        >>> down = CircuitBreaker(clock=lambda: 0)   # Redis has just failed: not reached
        >>> down.record_failure()
        >>> def table(capacity, prefix):
        ...     return AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, capacity, prefix=prefix,
        ...                                  on_error="open", breaker=down)
        >>> box = AsyncPenaltyBox(table(5, "login"), strikes=table(5, "s"), bans=table(1, "b"))
        >>> asyncio.run(box.unban("alice"))
        """
        await drive_async(self._unbanning(key, None))

    async def unban_at(self, key: Hashable, now: int) -> None:
        """`unban` at an explicit time *now* (int ns).

        >>> import asyncio, redis.asyncio
        >>> from nanobucket.redis import AsyncRedisTokenBucket, CircuitBreaker
        >>> down = CircuitBreaker(clock=lambda: 0)   # Redis has just failed: not reached
        >>> down.record_failure()
        >>> def table(capacity, prefix):
        ...     return AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, capacity, prefix=prefix,
        ...                                  on_error="open", breaker=down)
        >>> box = AsyncPenaltyBox(table(5, "login"), strikes=table(5, "s"), bans=table(1, "b"))
        >>> asyncio.run(box.unban_at("alice", 0))
        """
        await drive_async(self._unbanning(key, validated_now(now)))

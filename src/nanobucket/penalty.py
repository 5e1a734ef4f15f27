"""A penalty box: a key refused too often is refused outright for a while, as fail2ban bans.

``penalty_box(limiter, strikes=5, within=60, ban=900)`` wraps a keyed
limiter (a login endpoint's, say)::

    login = penalty_box(KeyedTokenBucket(rate=1, capacity=5), strikes=5, within=60, ban=900)
    login.allow(client_ip)      # the limiter's decision, unless the key is banned

Every refusal of the limiter is a strike against its key. A key refused
``strikes`` times in less than ``within`` seconds is banned for ``ban``
seconds: each of its requests is then refused without reaching the limiter
(its tokens stay as they are), with ``retry_after`` the time left of the
ban, to the nanosecond. The refusal that starts a ban is already answered
as a ban.

**Strikes are forgiven one per ``within`` seconds**, as tokens refill: the
strikes are a token bucket of ``strikes`` tokens refilling one per
``within``, and the ban a bucket of one token refilling one per ``ban``,
both tables of the limiter's own kind. So ``strikes`` refusals closer
together than ``within`` always ban the key; refusals at most one per
``within`` never do; and a key refused more often than that is banned once
its refusals outrun the forgiving by ``strikes`` (fail2ban counts only the
last ``within`` seconds: 6 refusals 20 s apart ban here with ``strikes=5,
within=60``, but no minute holds more than 3 of them). A ban shorter than
``strikes * within`` leaves strikes unforgiven: a key refused again soon
after its ban is banned again sooner (as fail2ban's "recidive" jail does).

**An admitted request does not clear strikes** (fail2ban forgets none on
success either): a client guessing passwords between refusals gains
nothing. `unban` clears a key's ban and strikes (a support desk letting a
user back in).

The kind of table follows the limiter: a `KeyedTokenBucket` gets in-process
tables on its clock; a `SharedKeyedTokenBucket` shared tables (anonymous if
it is, else files beside it named ``<its path>-strikes`` and ``-bans``), so
that every worker sees one ban (they read the monotonic clock: a table made
with ``clock=`` takes explicit times, the ``_at`` verbs); a ``RedisTokenBucket`` or
``AsyncRedisTokenBucket`` tables on its Redis under ``prefix`` (their
``on_error="open"``: an outage bans no one, and the limiter's own policy
still decides). Any other keyed limiter takes tables given to `PenaltyBox`.

It is a keyed limiter: ``allow``, ``check``, ``peek``, ``tokens``,
``allow_many``, ``refund`` (the limiter's; strikes stay) and their ``_at``
forms, so it goes wherever its limiter goes (``all_of``, ``@limit``, the
middlewares, the FastAPI dependency); its ``rate`` and ``capacity`` are the
limiter's, and so are its header fields. A ban's decision is a `Banned`
(``allowed=False, remaining=0``, ``retry_after`` and ``reset_after`` the ban
left). ``peek`` spends no strike, and does not foresee the ban a ``check``
would start.

Bounds and races. Each request of a key not banned costs one more lookup
(a ``peek`` of its ban: on Redis one more round trip), a refused one two
more, and the one that starts a ban three. The tables hold as many keys as
the limiter's (``max_keys``): past it an in-process table forgives the
bans nearest their end first, and a shared table admits (a new key's ban
is not kept: the tables fail open, so a flood of keys can never ban anyone
else). A request decided while another starts its key's ban may still
reach the limiter once.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Generator, Hashable, Iterable
from fractions import Fraction
from typing import Any

from . import _bucket_py
from ._bucket import Decision, KeyedTokenBucket
from ._drive import Call, drive, drive_async
from ._limiter import Composite, is_async
from ._params import NS_PER_S, int_at_least, real_seconds, validated_cost, validated_now
from ._verbs import AsyncKeyedVerbs, KeyedBatch, KeyedVerbs
from .shared import SharedKeyedTokenBucket

__all__ = ("AsyncPenaltyBox", "Banned", "PenaltyBox", "penalty_box")

DEFAULT_PREFIX = "nanobucket-penalty"
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


def _ns(seconds: object, name: str) -> int:
    """*seconds* (an int or float > 0) as whole ns, rounded up."""
    value = real_seconds(seconds, name)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {seconds!r}")
    # A float as the decimal written (0.1 s is 100 ms), an int exactly.
    exact = Fraction(value) if isinstance(value, int) else Fraction(float.__repr__(float(value)))
    if exact <= 0:
        raise ValueError(f"{name} must be > 0 seconds, got {seconds!r}")
    return -(-exact.numerator * NS_PER_S // exact.denominator)


def _tables_like(
    limiter: Any, limits: tuple[tuple[Fraction, int], ...], prefix: str | None
) -> list[Any]:
    """A table per ``(rate, capacity)`` of *limits*, of *limiter*'s kind (see the module)."""
    redis = sys.modules.get("nanobucket.redis")  # imported if the limiter is one of its
    if redis is not None and isinstance(
        limiter, (redis.RedisTokenBucket, redis.AsyncRedisTokenBucket)
    ):
        base = DEFAULT_PREFIX if prefix is None else prefix
        return [
            type(limiter)(
                limiter.client,
                rate,
                capacity,
                prefix=f"{base}:{part}",
                timeout=limiter.timeout,
                on_error="open",
                none_key=limiter.none_key,
            )
            for (rate, capacity), part in zip(limits, ("strikes", "bans"))
        ]
    if prefix is not None:
        raise TypeError("prefix= names the tables in Redis: give it with a Redis limiter only")
    if isinstance(limiter, SharedKeyedTokenBucket):
        path = limiter.path
        opts: dict[str, Any] = {
            "max_keys": limiter.max_keys,
            "when_full": "admit",  # fail open: a flood of keys never bans one
            "none_key": limiter.none_key,
        }
        if path is None:
            return [
                SharedKeyedTokenBucket.create_anonymous(rate=rate, capacity=capacity, **opts)
                for rate, capacity in limits
            ]
        return [
            SharedKeyedTokenBucket.open_or_create(
                path=f"{path}-{part}", rate=rate, capacity=capacity, **opts
            )
            for (rate, capacity), part in zip(limits, ("strikes", "bans"))
        ]
    if isinstance(limiter, (KeyedTokenBucket, _bucket_py.KeyedTokenBucket)):
        return [
            type(limiter)(
                rate,
                capacity,
                max_keys=limiter.max_keys,
                clock=limiter.clock_ns,
                none_key=limiter.none_key,
                per_process=limiter.per_process,  # a copy in a forked child: as the limiter
            )
            for rate, capacity in limits
        ]
    raise TypeError(
        f"penalty_box() makes its tables for a KeyedTokenBucket, SharedKeyedTokenBucket, "
        f"RedisTokenBucket or AsyncRedisTokenBucket, not {type(limiter).__name__}: "
        "give PenaltyBox(limiter, strikes=..., bans=...) tables of its kind"
    )


def penalty_box(
    limiter: Any,
    *,
    strikes: int = 5,
    within: float = 60,
    ban: float = 900,
    prefix: str | None = None,
) -> Any:  # a PenaltyBox or an AsyncPenaltyBox: which one depends on the limiter
    """*limiter*, banning for *ban* seconds a key refused *strikes* times within *within* s.

    Strikes are forgiven one per *within* seconds (see the module). The
    tables are of *limiter*'s kind; *prefix* (Redis only, default
    ``"nanobucket-penalty"``) is where they live in Redis: give each penalty
    box on one Redis its own. A `PenaltyBox`, or an `AsyncPenaltyBox` for an
    asyncio limiter.

    >>> from nanobucket import KeyedTokenBucket
    >>> login = penalty_box(KeyedTokenBucket(rate=1, capacity=3), strikes=2, within=60, ban=900)
    >>> [login.allow_at("mallory", 0) for _ in range(6)]
    [True, True, True, False, False, False]
    >>> login.check_at("mallory", 899 * 10**9).retry_after, login.allow_at("mallory", 900 * 10**9)
    (1.0, True)
    """
    count = int_at_least(strikes, "strikes", 1)
    limits = (
        (Fraction(NS_PER_S, _ns(within, "within")), count),
        (Fraction(NS_PER_S, _ns(ban, "ban")), 1),
    )
    # The limiter is checked before any table is made (a shared one is a file).
    _check_limiter(limiter)
    made = _tables_like(limiter, limits, prefix)
    box = AsyncPenaltyBox if is_async(limiter) else PenaltyBox
    return box(limiter, strikes=made[0], bans=made[1])

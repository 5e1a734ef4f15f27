"""The public verbs of the Python-level limiters, written once and derived from a few steps.

As Go's ``x/time/rate`` derives ``Allow``, ``Reserve`` and ``Wait`` from one
``reserveN``, a limiter written in Python (`KeyedConcurrency`, the tiered
and Redis limiters) defines its steps, and these mixins give it every verb
of the contract, the ``_at`` forms checking *now* first:

* ``_decide(key, cost, now, consume)``: the decision of a request of *cost*
  for *key* (spent if *consume*, else a peek), at *now* (int ns, or None:
  the limiter's own clock); *cost* as the caller gave it, checked here;
* ``_admit(key, cost, now)``: ``_decide(...).allowed``, which a limiter may
  answer faster without building the decision (the default builds it);
* ``_tokens(key, now)``, ``_many(keys, cost, now)``, ``_give(key, cost, now)``:
  behind ``tokens``, ``allow_many`` and ``refund``.

`Verbs` is for a limiter of one bucket (the steps get key None),
`KeyedVerbs` for a keyed one (`KeyedDecide` alone for one that cannot
peek), `OptionalKeyVerbs` for one whose key may be None (``all_of``),
`KeyedBatch` adds ``allow_many``, and `AsyncKeyedVerbs` is all of
them for an asyncio limiter, whose steps are awaited. `Reserving` derives
``reservation`` from a limiter's ``reserve`` and ``refund``. The Cython core and
its pure-Python twin keep their own verbs: there each one is the hot path.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from .._core._limiter import Reservation
from .._core._params import validated_now

__all__ = (
    "AsyncKeyedVerbs",
    "KeyedBatch",
    "KeyedDecide",
    "KeyedVerbs",
    "OptionalKeyVerbs",
    "Reserving",
    "Verbs",
)

D = TypeVar("D")  # the decision a limiter returns
R = TypeVar("R")  # what its refund returns


class _Steps(Generic[D, R]):
    """The steps a limiter defines (see the module)."""

    __slots__ = ()

    def _decide(self, key: Hashable, cost: object, now: int | None, consume: bool) -> D:
        raise NotImplementedError

    def _admit(self, key: Hashable, cost: object, now: int | None) -> bool:
        return bool(self._decide(key, cost, now, True).allowed)  # type: ignore[attr-defined]

    def _tokens(self, key: Hashable, now: int | None) -> float:
        raise NotImplementedError

    def _many(self, keys: Iterable[Hashable], cost: object, now: int | None) -> bytearray:
        raise NotImplementedError

    def _give(self, key: Hashable, cost: object, now: int | None) -> R:
        raise NotImplementedError


class KeyedDecide(_Steps[D, R]):
    """The verbs that spend, of a keyed limiter: ``allow``, ``check``, ``refund``."""

    __slots__ = ()

    def allow(self, key: Hashable, cost: int = 1) -> bool:
        """Spend *cost* of *key*'s limit now: True if admitted, else False (nothing spent).

        >>> from nanobucket import KeyedConcurrency
        >>> limit = KeyedConcurrency(1)
        >>> limit.allow("alice"), limit.allow("alice"), limit.allow("bob")
        (True, False, True)
        """
        return self._admit(key, cost, None)

    def allow_at(self, key: Hashable, now: int, cost: int = 1) -> bool:
        """`allow` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedConcurrency
        >>> KeyedConcurrency(1).allow_at("alice", 0)
        True
        """
        return self._admit(key, cost, validated_now(now))

    def check(self, key: Hashable, cost: int = 1) -> D:
        """Like `allow`, but return the whole decision.

        >>> from nanobucket import KeyedConcurrency
        >>> d = KeyedConcurrency(3).check("alice", cost=2)
        >>> d.allowed, d.remaining, d.limit
        (True, 1, 3)
        """
        return self._decide(key, cost, None, True)

    def check_at(self, key: Hashable, now: int, cost: int = 1) -> D:
        """`check` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedConcurrency
        >>> KeyedConcurrency(3).check_at("alice", 0).remaining
        2
        """
        return self._decide(key, cost, validated_now(now), True)

    def refund(self, key: Hashable, cost: int = 1) -> R:
        """Give back *cost* that *key* spent on a request that did not go ahead.

        >>> from nanobucket import KeyedConcurrency
        >>> limit = KeyedConcurrency(1)
        >>> limit.allow("alice"), limit.refund("alice"), limit.allow("alice")
        (True, None, True)
        """
        return self._give(key, cost, None)

    def refund_at(self, key: Hashable, now: int, cost: int = 1) -> R:
        """`refund` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedConcurrency
        >>> limit = KeyedConcurrency(1)
        >>> limit.allow_at("alice", 0), limit.refund_at("alice", 0), limit.in_flight("alice")
        (True, None, 0)
        """
        return self._give(key, cost, validated_now(now))


class KeyedVerbs(KeyedDecide[D, R]):
    """The verbs of a keyed limiter, from its steps: `KeyedDecide`, ``peek`` and ``tokens``."""

    __slots__ = ()

    def peek(self, key: Hashable, cost: int = 1) -> D:
        """The decision `check` would return now, without spending anything.

        >>> from nanobucket import KeyedConcurrency
        >>> limit = KeyedConcurrency(3)
        >>> limit.peek("alice", cost=2).remaining, limit.peek("alice", cost=2).remaining
        (1, 1)
        """
        return self._decide(key, cost, None, False)

    def peek_at(self, key: Hashable, now: int, cost: int = 1) -> D:
        """`peek` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedConcurrency
        >>> KeyedConcurrency(3).peek_at("alice", 0, cost=3).allowed
        True
        """
        return self._decide(key, cost, validated_now(now), False)

    def tokens(self, key: Hashable) -> float:
        """What *key* may still spend now.

        >>> from nanobucket import KeyedConcurrency
        >>> limit = KeyedConcurrency(3)
        >>> limit.allow("alice"), limit.tokens("alice")
        (True, 2.0)
        """
        return self._tokens(key, None)

    def tokens_at(self, key: Hashable, now: int) -> float:
        """`tokens` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedConcurrency
        >>> KeyedConcurrency(3).tokens_at("alice", 0)
        3.0
        """
        return self._tokens(key, validated_now(now))


class KeyedBatch(_Steps[D, R]):
    """``allow_many``: a batch of keys in one call (beside `KeyedVerbs`)."""

    __slots__ = ()

    def allow_many(self, keys: Iterable[Hashable], cost: int = 1) -> bytearray:
        """Decide a batch of keys in order, as `allow` one after another: 1 / 0 each.

        >>> from nanobucket import KeyedTokenBucket, tiered
        >>> t = tiered({"free": KeyedTokenBucket(1, 1, clock=lambda: 0)}, tier=lambda key: "free")
        >>> list(t.allow_many(["alice", "bob", "alice"]))
        [1, 1, 0]
        """
        return self._many(keys, cost, None)

    def allow_many_at(self, keys: Iterable[Hashable], now: int, cost: int = 1) -> bytearray:
        """`allow_many` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedTokenBucket, tiered
        >>> t = tiered({"free": KeyedTokenBucket(rate=1, capacity=2)}, tier=lambda key: "free")
        >>> list(t.allow_many_at(["alice"] * 3, 0)), list(t.allow_many_at(["alice"], 10**9))
        ([1, 1, 0], [1])
        """
        return self._many(keys, cost, validated_now(now))


class Verbs(_Steps[D, R]):
    """The verbs of a limiter of one bucket, from its steps (given key None)."""

    __slots__ = ()

    def allow(self, cost: int = 1) -> bool:
        """Spend *cost* now: True if admitted, else False (nothing spent).

        >>> from nanobucket import Concurrency
        >>> pool = Concurrency(1)
        >>> pool.allow(), pool.allow()
        (True, False)
        """
        return self._admit(None, cost, None)

    def allow_at(self, now: int, cost: int = 1) -> bool:
        """`allow` at an explicit time *now* (int ns).

        >>> from nanobucket import Concurrency
        >>> Concurrency(1).allow_at(0)
        True
        """
        return self._admit(None, cost, validated_now(now))

    def check(self, cost: int = 1) -> D:
        """Like `allow`, but return the whole decision.

        >>> from nanobucket import Concurrency
        >>> d = Concurrency(3).check(cost=2)
        >>> d.allowed, d.remaining, d.limit, d.retry_after_ns
        (True, 1, 3, 0)
        """
        return self._decide(None, cost, None, True)

    def check_at(self, now: int, cost: int = 1) -> D:
        """`check` at an explicit time *now* (int ns).

        >>> from nanobucket import Concurrency
        >>> Concurrency(3).check_at(0).remaining
        2
        """
        return self._decide(None, cost, validated_now(now), True)

    def peek(self, cost: int = 1) -> D:
        """The decision `check` would return now, without spending anything.

        >>> from nanobucket import Concurrency
        >>> pool = Concurrency(3)
        >>> pool.peek(cost=3).allowed, pool.in_flight
        (True, 0)
        """
        return self._decide(None, cost, None, False)

    def peek_at(self, now: int, cost: int = 1) -> D:
        """`peek` at an explicit time *now* (int ns).

        >>> from nanobucket import Concurrency
        >>> Concurrency(3).peek_at(0, cost=2).remaining
        1
        """
        return self._decide(None, cost, validated_now(now), False)

    def tokens(self) -> float:
        """What may still be spent now.

        >>> from nanobucket import Concurrency
        >>> pool = Concurrency(3)
        >>> pool.allow(), pool.tokens()
        (True, 2.0)
        """
        return self._tokens(None, None)

    def tokens_at(self, now: int) -> float:
        """`tokens` at an explicit time *now* (int ns).

        >>> from nanobucket import Concurrency
        >>> Concurrency(3).tokens_at(0)
        3.0
        """
        return self._tokens(None, validated_now(now))

    def refund(self, cost: int = 1) -> R:
        """Give back *cost* spent on a request that did not go ahead.

        >>> from nanobucket import Concurrency
        >>> pool = Concurrency(1)
        >>> pool.allow(), pool.refund(), pool.allow()
        (True, None, True)
        """
        return self._give(None, cost, None)

    def refund_at(self, now: int, cost: int = 1) -> R:
        """`refund` at an explicit time *now* (int ns).

        >>> from nanobucket import Concurrency
        >>> pool = Concurrency(1)
        >>> pool.allow_at(0), pool.refund_at(0), pool.in_flight
        (True, None, 0)
        """
        return self._give(None, cost, validated_now(now))


class OptionalKeyVerbs(_Steps[D, R]):
    """The verbs of a limiter whose key may be None (``all_of``: layers without a key
    take none), from its steps: `KeyedVerbs` with ``key=None`` by default. ``allow``
    is the limiter's own (its hot path); ``allow_at`` is derived."""

    __slots__ = ()

    def allow_at(self, key: Hashable | None, now: int, cost: int = 1) -> bool:
        """``allow`` at an explicit time *now* (int ns); *key* may be None without keyed layers.

        >>> from nanobucket import KeyedTokenBucket, all_of
        >>> limit = all_of(KeyedTokenBucket(rate=1, capacity=1))
        >>> [limit.allow_at("alice", now) for now in (0, 0, 1_000_000_000)]
        [True, False, True]
        """
        return self._admit(key, cost, validated_now(now))

    def check(self, key: Hashable | None = None, cost: int = 1) -> D:
        """Like ``allow``, but return the decision (an ``all_of``'s names the binding layer).

        >>> from nanobucket import TokenBucket, all_of
        >>> limit = all_of(TokenBucket(rate=100, capacity=200), TokenBucket(rate=1, capacity=5))
        >>> d = limit.check(cost=5)
        >>> (d.allowed, d.layer, d.remaining)   # layer 1 has the fewest tokens left
        (True, 1, 0)
        """
        return self._decide(key, cost, None, True)

    def check_at(self, key: Hashable | None, now: int, cost: int = 1) -> D:
        """`check` at an explicit time *now* (int ns).

        >>> from nanobucket import TokenBucket, all_of
        >>> limit = all_of(TokenBucket(rate=100, capacity=200), TokenBucket(rate=1, capacity=5))
        >>> limit.allow_at(None, 0, cost=5)
        True
        >>> d = limit.check_at(None, 0)
        >>> (d.allowed, d.layer, d.retry_after_ns)
        (False, 1, 1000000000)
        """
        return self._decide(key, cost, validated_now(now), True)

    def peek(self, key: Hashable | None = None, cost: int = 1) -> D:
        """The decision `check` would return now, without spending anything.

        >>> from nanobucket import TokenBucket, all_of
        >>> limit = all_of(TokenBucket(rate=1, capacity=2))
        >>> limit.peek(cost=2).allowed, limit.peek(cost=2).allowed   # nothing spent
        (True, True)
        """
        return self._decide(key, cost, None, False)

    def peek_at(self, key: Hashable | None, now: int, cost: int = 1) -> D:
        """`peek` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedTokenBucket, all_of
        >>> limit = all_of(KeyedTokenBucket(rate=1, capacity=2))
        >>> limit.allow_at("alice", 0, cost=2), limit.peek_at("alice", 500_000_000).retry_after_ns
        (True, 500000000)
        """
        return self._decide(key, cost, validated_now(now), False)

    def tokens(self, key: Hashable | None = None) -> float:
        """What *key* may still spend now (an ``all_of``: the fewest any layer holds).

        >>> from nanobucket import TokenBucket, all_of
        >>> all_of(TokenBucket(rate=1, capacity=5), TokenBucket(rate=1, capacity=3)).tokens()
        3.0
        """
        return self._tokens(key, None)

    def tokens_at(self, key: Hashable | None, now: int) -> float:
        """`tokens` at *now* (int ns).

        >>> from nanobucket import KeyedTokenBucket, all_of
        >>> limit = all_of(KeyedTokenBucket(rate=2, capacity=4))
        >>> limit.allow_at("alice", 0, cost=4), limit.tokens_at("alice", 500_000_000)
        (True, 1.0)
        """
        return self._tokens(key, validated_now(now))

    def refund(self, key: Hashable | None = None, cost: int = 1) -> R:
        """Give *cost* back (an ``all_of``: to every layer, never above any capacity).

        >>> from nanobucket import TokenBucket, all_of
        >>> limit = all_of(TokenBucket(rate=1, capacity=2), TokenBucket(rate=1, capacity=3))
        >>> limit.allow(cost=2)
        True
        >>> limit.refund(cost=2)   # the work was not done after all
        >>> limit.tokens()
        2.0
        """
        return self._give(key, cost, None)

    def refund_at(self, key: Hashable | None, now: int, cost: int = 1) -> R:
        """`refund` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedTokenBucket, all_of
        >>> limit = all_of(KeyedTokenBucket(rate=1, capacity=2))
        >>> limit.allow_at("alice", 0, cost=2), limit.refund_at("alice", 0, cost=1)
        (True, None)
        >>> limit.tokens_at("alice", 0)
        1.0
        """
        return self._give(key, cost, validated_now(now))


class Reserving:
    """``reservation``: ``reserve`` as a `nanobucket.Reservation` (with ``reserve``, ``refund``)."""

    __slots__ = ()

    def reservation(
        self,
        *key: Hashable,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> Reservation:
        """``reserve(*key, ...)`` as a `nanobucket.Reservation`: ``ok``, ``delay_ns``, ``cancel()``.

        >>> from nanobucket import KeyedTokenBucket, tiered
        >>> t = tiered({"free": KeyedTokenBucket(1, 1)}, tier=lambda key: "free")
        >>> r = t.reservation("alice", now=0)
        >>> r.ok, t.tokens_at("alice", 0), r.cancel_at(0), t.tokens_at("alice", 0)
        (True, 0.0, True, 1.0)
        """
        return Reservation.take(self, key, cost, max_wait_ns, shape, now)


class _AsyncSteps(Generic[D, R]):
    """The steps of an asyncio limiter: `_Steps`, awaited."""

    __slots__ = ()

    async def _decide(self, key: Hashable, cost: object, now: int | None, consume: bool) -> D:
        raise NotImplementedError

    async def _admit(self, key: Hashable, cost: object, now: int | None) -> bool:
        return bool((await self._decide(key, cost, now, True)).allowed)  # type: ignore[attr-defined]

    async def _tokens(self, key: Hashable, now: int | None) -> float:
        raise NotImplementedError

    async def _many(self, keys: Iterable[Hashable], cost: object, now: int | None) -> bytearray:
        raise NotImplementedError

    async def _give(self, key: Hashable, cost: object, now: int | None) -> R:
        raise NotImplementedError


class AsyncKeyedVerbs(_AsyncSteps[D, R]):
    """The verbs of a keyed asyncio limiter, from its steps: `KeyedVerbs`, awaited.

    The examples run offline: an `AsyncRedisTokenBucket` whose Redis has just
    failed (``down``, a breaker that refuses to try it), so its in-process
    ``fallback`` decides.
    """

    __slots__ = ()

    async def allow(self, key: Hashable, cost: int = 1) -> bool:
        """`KeyedVerbs.allow`, awaited: True if admitted, else False (nothing spent).

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 fallback=KeyedTokenBucket(1, 1), breaker=down)
        >>> asyncio.run(limiter.allow("alice")), asyncio.run(limiter.allow("alice"))
        (True, False)
        """
        return await self._admit(key, cost, None)

    async def allow_at(self, key: Hashable, now: int, cost: int = 1) -> bool:
        """`allow` at an explicit time *now* (int ns).

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 fallback=KeyedTokenBucket(1, 1), breaker=down)
        >>> asyncio.run(limiter.allow_at("alice", 0)), asyncio.run(limiter.allow_at("alice", 0))
        (True, False)
        """
        return await self._admit(key, cost, validated_now(now))

    async def check(self, key: Hashable, cost: int = 1) -> D:
        """Like `allow`, but return the whole decision.

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 on_error="open", breaker=down)
        >>> asyncio.run(limiter.check("alice")).source
        'policy:open'
        """
        return await self._decide(key, cost, None, True)

    async def check_at(self, key: Hashable, now: int, cost: int = 1) -> D:
        """`check` at an explicit time *now* (int ns).

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 fallback=KeyedTokenBucket(1, 2), breaker=down)
        >>> asyncio.run(limiter.check_at("alice", 0)).remaining   # the fallback's bucket
        1
        """
        return await self._decide(key, cost, validated_now(now), True)

    async def peek(self, key: Hashable, cost: int = 1) -> D:
        """The decision `check` would return now, without spending anything.

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 on_error="closed", breaker=down)
        >>> asyncio.run(limiter.peek("alice")).retry_after   # when the breaker next tries Redis
        0.1
        """
        return await self._decide(key, cost, None, False)

    async def peek_at(self, key: Hashable, now: int, cost: int = 1) -> D:
        """`peek` at an explicit time *now* (int ns).

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 fallback=KeyedTokenBucket(1, 2), breaker=down)
        >>> [asyncio.run(limiter.peek_at("alice", 0)).remaining for _ in range(2)]   # nothing spent
        [1, 1]
        """
        return await self._decide(key, cost, validated_now(now), False)

    async def tokens(self, key: Hashable) -> float:
        """What *key* may still spend now.

        Only the store knows: an `AsyncRedisTokenBucket` whose Redis is
        unreachable raises `RedisUnavailable`, whatever its ``on_error`` and
        ``fallback`` say.

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 fallback=KeyedTokenBucket(1, 2), breaker=down)
        >>> asyncio.run(limiter.tokens("alice"))
        Traceback (most recent call last):
        ...
        nanobucket.redis.RedisUnavailable: Redis unavailable: cannot read tokens
        """
        return await self._tokens(key, None)

    async def tokens_at(self, key: Hashable, now: int) -> float:
        """`tokens` at an explicit time *now* (int ns).

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 on_error="open", breaker=down)
        >>> asyncio.run(limiter.tokens_at("alice", 0))
        Traceback (most recent call last):
        ...
        nanobucket.redis.RedisUnavailable: Redis unavailable: cannot read tokens
        """
        return await self._tokens(key, validated_now(now))

    async def allow_many(self, keys: Iterable[Hashable], cost: int = 1) -> bytearray:
        """Decide a batch of keys in order, as `allow` one after another: 1 / 0 each.

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 on_error="closed", breaker=down)
        >>> list(asyncio.run(limiter.allow_many(["alice", "bob"])))
        [0, 0]
        """
        return await self._many(keys, cost, None)

    async def allow_many_at(self, keys: Iterable[Hashable], now: int, cost: int = 1) -> bytearray:
        """`allow_many` at an explicit time *now* (int ns).

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 fallback=KeyedTokenBucket(1, 1), breaker=down)
        >>> list(asyncio.run(limiter.allow_many_at(["alice", "alice", "bob"], 0)))
        [1, 0, 1]
        """
        return await self._many(keys, cost, validated_now(now))

    async def refund(self, key: Hashable, cost: int = 1) -> R:
        """Give back *cost* that *key* spent on a request that did not go ahead.

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, 2, on_error="open",
        ...                                 breaker=down)
        >>> asyncio.run(limiter.refund("alice"))   # not delivered: lost, never queued
        False
        """
        return await self._give(key, cost, None)

    async def refund_at(self, key: Hashable, now: int, cost: int = 1) -> R:
        """`refund` at an explicit time *now* (int ns).

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, 2, on_error="open",
        ...                                 breaker=down)
        >>> asyncio.run(limiter.refund_at("alice", 0))
        False
        """
        return await self._give(key, cost, validated_now(now))

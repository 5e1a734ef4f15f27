"""One key of a keyed limiter as a limiter of its own: ``OneKey(table, key)``.

Written here; documented and imported as ``nanobucket.one_key``."""

from __future__ import annotations

from collections.abc import Awaitable, Hashable
from typing import Any

from .._core import _acquire
from .._core._limiter import is_async, is_keyed
from .verbs import Reserving

__all__ = ("OneKey",)


class OneKey(Reserving):
    """The bucket of *key* in the keyed limiter *table*, with verbs that take no key.

    ``allow``, ``check``, ``peek``, ``tokens``, ``refund``, ``reserve`` and
    their ``_at`` forms, as a `TokenBucket`'s: each is the table's own verb
    for *key* (so a verb the table lacks is missing here too). ``rate``,
    ``capacity`` and ``interval_ns`` are the table's.

    >>> from nanobucket import KeyedTokenBucket, all_of
    >>> everyone = OneKey(KeyedTokenBucket(rate=1, capacity=3), "all")
    >>> limit = all_of(KeyedTokenBucket(rate=1, capacity=2), everyone)
    >>> [limit.allow_at(user, 0) for user in ("alice", "alice", "alice", "bob", "bob")]
    [True, True, False, True, False]
    """

    keyed = False  # the verbs take no key

    __slots__ = ("key", "table")

    def __init__(self, table: Any, key: Hashable) -> None:
        if not is_keyed(table):
            raise TypeError(
                f"{type(table).__name__} takes no key: use it as it is, not in a OneKey"
            )
        if is_async(table):
            # Its verbs would hand back coroutines, which every sync caller (all_of,
            # Waiting) reads as admitted.
            raise TypeError(
                f"{type(table).__name__} is an asyncio limiter, and OneKey's verbs are "
                "sync: give OneKey a sync table"
            )
        hash(key)  # an unhashable key fails here, not at the first request
        self.table = table
        self.key = key

    @property
    def rate(self) -> Any:
        """The table's rate.

        >>> from nanobucket import KeyedTokenBucket
        >>> OneKey(KeyedTokenBucket(rate=5, capacity=10), "all").rate
        5
        """
        return self.table.rate

    @property
    def capacity(self) -> int:
        """The table's capacity.

        >>> from nanobucket import KeyedTokenBucket
        >>> OneKey(KeyedTokenBucket(rate=5, capacity=10), "all").capacity
        10
        """
        capacity: int = self.table.capacity
        return capacity

    @property
    def interval_ns(self) -> int:
        """The table's ns per token.

        >>> from nanobucket import KeyedTokenBucket
        >>> OneKey(KeyedTokenBucket(rate=4, capacity=10), "all").interval_ns
        250000000
        """
        interval: int = self.table.interval_ns
        return interval

    def allow(self, cost: int = 1) -> Any:
        """``table.allow(key, cost)``.

        >>> from nanobucket import KeyedTokenBucket
        >>> b = OneKey(KeyedTokenBucket(rate=1, capacity=1), "all")
        >>> b.allow(), b.allow()
        (True, False)
        """
        return self.table.allow(self.key, cost)

    def allow_at(self, now: int, cost: int = 1) -> Any:
        """``table.allow_at(key, now, cost)``.

        >>> from nanobucket import KeyedTokenBucket
        >>> b = OneKey(KeyedTokenBucket(rate=1, capacity=1), "all")
        >>> b.allow_at(0), b.allow_at(0), b.allow_at(10**9)
        (True, False, True)
        """
        return self.table.allow_at(self.key, now, cost)

    def check(self, cost: int = 1) -> Any:
        """``table.check(key, cost)``: the decision.

        >>> from nanobucket import KeyedTokenBucket
        >>> OneKey(KeyedTokenBucket(rate=1, capacity=2), "all").check().remaining
        1
        """
        return self.table.check(self.key, cost)

    def check_at(self, now: int, cost: int = 1) -> Any:
        """``table.check_at(key, now, cost)``.

        >>> from nanobucket import KeyedTokenBucket
        >>> OneKey(KeyedTokenBucket(rate=1, capacity=2), "all").check_at(0, cost=2).remaining
        0
        """
        return self.table.check_at(self.key, now, cost)

    def peek(self, cost: int = 1) -> Any:
        """``table.peek(key, cost)``: the decision, nothing spent.

        >>> from nanobucket import KeyedTokenBucket
        >>> b = OneKey(KeyedTokenBucket(rate=1, capacity=2), "all")
        >>> b.peek().remaining, b.peek().remaining
        (1, 1)
        """
        return self.table.peek(self.key, cost)

    def peek_at(self, now: int, cost: int = 1) -> Any:
        """``table.peek_at(key, now, cost)``.

        >>> from nanobucket import KeyedTokenBucket
        >>> OneKey(KeyedTokenBucket(rate=1, capacity=2), "all").peek_at(0, cost=2).allowed
        True
        """
        return self.table.peek_at(self.key, now, cost)

    def tokens(self) -> float:
        """``table.tokens(key)``.

        >>> from nanobucket import KeyedTokenBucket
        >>> OneKey(KeyedTokenBucket(rate=1, capacity=2), "all").tokens()
        2.0
        """
        tokens: float = self.table.tokens(self.key)
        return tokens

    def tokens_at(self, now: int) -> float:
        """``table.tokens_at(key, now)``.

        >>> from nanobucket import KeyedTokenBucket
        >>> b = OneKey(KeyedTokenBucket(rate=1, capacity=2), "all")
        >>> b.allow_at(0, cost=2), b.tokens_at(500_000_000)
        (True, 0.5)
        """
        tokens: float = self.table.tokens_at(self.key, now)
        return tokens

    def refund(self, cost: int = 1) -> Any:
        """``table.refund(key, cost)``: tokens back, never above capacity.

        >>> from nanobucket import KeyedTokenBucket
        >>> b = OneKey(KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0), "all")
        >>> b.allow(cost=2), b.refund(), b.tokens()
        (True, None, 1.0)
        """
        return self.table.refund(self.key, cost)

    def refund_at(self, now: int, cost: int = 1) -> Any:
        """``table.refund_at(key, now, cost)``.

        >>> from nanobucket import KeyedTokenBucket
        >>> b = OneKey(KeyedTokenBucket(rate=1, capacity=2), "all")
        >>> b.allow_at(0, cost=2), b.refund_at(0), b.tokens_at(0)
        (True, None, 1.0)
        """
        return self.table.refund_at(self.key, now, cost)

    def reserve(
        self,
        *,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> Any:
        """``table.reserve(key, ...)`` (see `nanobucket.Reservable`).

        >>> from nanobucket import KeyedTokenBucket
        >>> b = OneKey(KeyedTokenBucket(rate=1, capacity=1), "all")
        >>> b.reserve(now=0), b.reserve(now=0, max_wait_ns=10**9)
        (0, 1000000000)
        """
        return self.table.reserve(
            self.key, cost=cost, max_wait_ns=max_wait_ns, shape=shape, now=now
        )

    def __enter__(self) -> OneKey:
        """``with one:``: the table's ``acquire(key)``, one token with no timeout, in line;
        `RateLimited` when its line of waiters is full. Leaving gives nothing back.

        >>> from nanobucket import KeyedTokenBucket
        >>> one = OneKey(KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0), "all")
        >>> with one:
        ...     one.tokens()
        0.0
        """
        _acquire.enter(self.table, (self.key,))
        return self

    def __exit__(self, *exc: object) -> None:
        return None  # a spent token stays spent

    def __aenter__(self) -> Awaitable[OneKey]:
        """``async with one:``: the table's ``acquire_async(key)``, as ``with one:`` does.

        >>> import asyncio
        >>> from nanobucket import KeyedTokenBucket
        >>> one = OneKey(KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0), "all")
        >>> async def enter():
        ...     async with one:
        ...         return one.tokens()
        >>> asyncio.run(enter())
        1.0
        """
        return _acquire.enter_async(self.table, (self.key,), self)

    def __aexit__(self, *exc: object) -> Awaitable[None]:
        return _acquire.exit_async()

    def __repr__(self) -> str:
        return f"OneKey({self.table!r}, {self.key!r})"

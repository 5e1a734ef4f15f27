"""What every limiter's ``acquire`` is built on: the timeout, the bound on waiters, the wait.

The core classes (`TokenBucket`, `KeyedTokenBucket`, ``all_of``, the Redis
limiters) call `acquire_slow` / `acquire_async` once a plain take has
failed; `nanobucket.waiting.Waiting` adds its own bound and shaping on top.
The line the waiters stand in is `_wait`'s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable
from typing import Any

from . import _wait
from ._params import FOREVER_NS, NS_PER_S, validated_timeout

__all__ = (
    "DEFAULT_MAX_WAITERS",
    "Gate",
    "RateLimited",
    "acquire_async",
    "acquire_slow",
    "enter",
    "enter_async",
    "enter_default",
    "exit_async",
    "leave_default",
    "max_wait_ns",
    "waiters",
)

DEFAULT_MAX_WAITERS = 1024


class RateLimited(Exception):
    """Raised by a function decorated with `limit` when the call is not admitted
    (and by a ``with`` block on a limiter whose line of waiters is full).

    ``retry_after`` (float seconds) and ``retry_after_ns`` (int) say when
    the same call would be admitted; ``decision`` is the limiter's own.

    >>> from nanobucket import TokenBucket, limit
    >>> ping = limit(TokenBucket(rate=1, capacity=1, clock=lambda: 0))(lambda: "pong")
    >>> try:
    ...     ping(), ping()
    ... except RateLimited as e:
    ...     print(e.retry_after_ns, e.decision.allowed)
    1000000000 False
    """

    # Defined here so that the core limiters' ``with`` blocks can raise it; named
    # (in tracebacks and pickles) where users import it from.
    __module__ = "nanobucket.decorator"

    def __init__(self, retry_after_ns: int, decision: Any = None) -> None:
        self.retry_after_ns = int(retry_after_ns)
        self.decision = decision
        super().__init__(f"rate limited: retry after {self.retry_after:.3f} s")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its own arguments, not from the message Exception keeps:
        # a call refused in a process pool's worker reaches the caller as itself.
        return type(self), (self.retry_after_ns, self.decision)

    @property
    def retry_after(self) -> float:
        """Seconds until the same call would be admitted.

        >>> RateLimited(250_000_000).retry_after
        0.25
        """
        return self.retry_after_ns / NS_PER_S


def enter(limiter: Any, key: tuple[Hashable, ...] = ()) -> None:
    """``with limiter:``: wait for one token as long as it takes (no timeout), first in,
    first out; `RateLimited` when the line of waiters is already full.

    >>> from nanobucket import TokenBucket
    >>> b = TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    >>> enter(b), b.tokens()
    (None, 0.0)
    """
    if not limiter.acquire(*key):
        decision = limiter.peek(*key)
        raise RateLimited(decision.retry_after_ns, decision)


async def enter_async(limiter: Any, key: tuple[Hashable, ...] = (), value: Any = None) -> Any:
    """``async with limiter:``: `enter` for asyncio (cancelled, it reserves nothing); *value*.

    >>> from nanobucket import TokenBucket
    >>> b = TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    >>> asyncio.run(enter_async(b, (), "entered")), b.tokens()
    ('entered', 0.0)
    """
    if not await limiter.acquire_async(*key):
        decision = limiter.peek(*key)
        if asyncio.iscoroutine(decision):
            decision = await decision
        raise RateLimited(decision.retry_after_ns, decision)
    return value


async def exit_async(*exc: object) -> None:
    """``async with limiter:`` leaving: nothing to give back for a rate limit."""


def max_wait_ns(timeout: object) -> int:
    seconds = validated_timeout(timeout)
    if seconds is None or seconds * NS_PER_S >= FOREVER_NS:
        return FOREVER_NS
    return int(seconds * NS_PER_S)  # rounded down: never wait past the timeout


class Gate:
    """Counts the waiters of one limiter and refuses past its bound."""

    __slots__ = ("count", "limit", "lock")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.lock = threading.Lock()

    def enter(self) -> bool:
        with self.lock:
            if self.count >= self.limit:
                return False
            self.count += 1
            return True

    def leave(self) -> None:
        with self.lock:
            self.count -= 1


# Gates of the core classes' own acquire(): a core object has no room for
# one, so it lives here, keyed by id(), only while the object has waiters
# (the object is alive while its method runs, so the id cannot be reused).
_gates: dict[int, Gate] = {}
_gates_lock = threading.Lock()


def enter_default(limiter: object) -> bool:
    with _gates_lock:
        gate = _gates.get(id(limiter))
        if gate is None:
            gate = _gates[id(limiter)] = Gate(DEFAULT_MAX_WAITERS)
        if gate.count >= gate.limit:
            return False
        gate.count += 1
        return True


def leave_default(limiter: object) -> None:
    with _gates_lock:
        gate = _gates[id(limiter)]
        gate.count -= 1
        if not gate.count:
            del _gates[id(limiter)]


def waiters(limiter: object) -> int:
    """Callers of *limiter*'s own ``acquire`` waiting now (0 when none)."""
    with _gates_lock:
        gate = _gates.get(id(limiter))
        return gate.count if gate is not None else 0


def acquire_slow(limiter: Any, key: tuple[Hashable, ...], cost: int, timeout: float | None) -> bool:
    """The waiting part of the core classes' ``acquire`` (after a rejected ``allow``).

    >>> from nanobucket import TokenBucket
    >>> b = TokenBucket(rate=1, capacity=1)
    >>> b.allow(), acquire_slow(b, (), 1, timeout=0.5)   # would wait ~1 s: refused at once
    (True, False)
    """
    max_wait = max_wait_ns(timeout)
    if not enter_default(limiter):
        return False
    try:
        return _wait.wait_sync(limiter, key, cost, max_wait, False).ok
    finally:
        leave_default(limiter)


async def acquire_async(
    limiter: Any, key: tuple[Hashable, ...], cost: object, timeout: object
) -> bool:
    """The core classes' ``acquire_async``: reserve, then sleep in asyncio.

    >>> from nanobucket import KeyedTokenBucket
    >>> t = KeyedTokenBucket(rate=1, capacity=1)
    >>> [asyncio.run(acquire_async(t, ("alice",), 1, 0.5)) for _ in range(2)]
    [True, False]
    """
    max_wait = max_wait_ns(timeout)
    if limiter.allow(*key, cost):  # validates cost, too
        return True
    if not enter_default(limiter):
        return False
    try:
        return (await _wait.wait_async(limiter, key, cost, max_wait, False, asyncio.sleep)).ok
    finally:
        leave_default(limiter)

"""``@limit(...)``: rate-limit a function, sync or async, by raising or by waiting.

Written here; documented and imported as ``nanobucket.decorator``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from .._core._acquire import RateLimited
from .._core._bucket import KeyedTokenBucket, TokenBucket
from .._core._limiter import KeyedLimiter, Limiter, is_keyed, traits
from .._core._params import RateArg, validated_timeout
from . import switch
from .hooks import Hook, LimitEvent, make_hooks

__all__ = ("RateLimited", "limit")

F = TypeVar("F", bound=Callable[..., Any])


def limit(
    limiter: Limiter | KeyedLimiter | str | None = None,
    *,
    rate: RateArg | None = None,
    capacity: int | None = None,
    key: Callable[..., Hashable] | None = None,
    cost: int | Callable[..., int] = 1,
    wait: bool = False,
    timeout: float | None = None,
    on_decision: Hook | None = None,
    on_limited: Hook | None = None,
) -> Callable[[F], F]:
    """Decorate a sync or async function so that each call spends *cost* tokens of *limiter*.

    *limiter* is any in-process limiter (``TokenBucket``, ``KeyedTokenBucket``,
    ``all_of``, ``Waiting``...), or give ``rate=`` and ``capacity=`` to build
    one (a ``KeyedTokenBucket`` when *key* is given). A rate written as text
    (``rate="5/minute"``, or ``@limit("5/minute")``) needs no capacity: it
    is the count. *key* and *cost*, when callables, get the call's
    arguments. By default a refused call raises
    `RateLimited`; with ``wait=True`` it waits (at most *timeout* seconds,
    in a bounded FIFO line: ``acquire`` / ``acquire_async``) and raises
    `RateLimited` only if it still is not admitted. An in-flight limit
    (``Concurrency``, or an ``all_of`` with one) is released when the call
    returns or raises.

    *on_decision* / *on_limited* are hooks (`nanobucket.hooks`) called with
    a `LimitEvent` whose ``route`` is the function's qualified name; an
    ``async def`` hook only for an ``async def`` function. They need
    ``wait=False``: a call that waits has no single decision to report.

    >>> @limit(rate=1, capacity=2, key=lambda user, body: user)   # a bucket per user
    ... def upload(user: str, body: bytes) -> int:
    ...     return len(body)
    >>> [upload("alice", b"abc"), upload("alice", b"de"), upload("bob", b"f")]
    [3, 2, 1]
    >>> @limit("2/minute")   # one bucket for every call
    ... def ping() -> str:
    ...     return "pong"
    >>> ping(), ping(), ping.limiter.capacity
    ('pong', 'pong', 2)
    """
    chosen: Any = _make_limiter(limiter, rate, capacity, key)
    keyed = is_keyed(chosen)
    learnt = traits(chosen)
    if keyed and key is None and not learnt.key_optional:
        raise TypeError(f"{type(chosen).__name__} is keyed: pass key=<callable returning the key>")
    if not keyed and key is not None:
        raise TypeError(f"{type(chosen).__name__} is not keyed: key= has no bucket to pick")
    if key is not None and not callable(key):
        raise TypeError(f"key must be a callable, not {type(key).__name__}")
    if not isinstance(wait, bool):
        raise TypeError(f"wait must be a bool, not {type(wait).__name__}")
    validated_timeout(timeout)
    if wait and not learnt.acquires:
        raise TypeError(f"{type(chosen).__name__} cannot wait (no acquire())")
    if not callable(cost) and (isinstance(cost, bool) or not isinstance(cost, int)):
        raise TypeError(f"cost must be an int or a callable, not {type(cost).__name__}")
    hooks = make_hooks(on_decision, on_limited, allow_async=True)
    if hooks is not None and wait:
        raise TypeError("on_decision/on_limited need wait=False (a wait has no one decision)")

    def prefix(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], Any]:
        k = () if not keyed else ((key(*args, **kwargs) if key is not None else None),)
        c = cost(*args, **kwargs) if callable(cost) else cost
        return k, c

    holds = learnt.releases  # slots to give back after the call

    def refused(k: tuple[Any, ...], c: Any) -> RateLimited:
        d = chosen.peek(*k, c)
        return RateLimited(d.retry_after_ns, d)

    def decorate(fn: F) -> F:
        name = getattr(fn, "__qualname__", None) or repr(fn)
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if switch.off:  # limits turned off (a test run)
                    return await fn(*args, **kwargs)
                k, c = prefix(args, kwargs)
                if wait:
                    if not await chosen.acquire_async(*k, cost=c, timeout=timeout):
                        raise refused(k, c)
                else:
                    d = chosen.check(*k, c)
                    if hooks is not None:
                        event = LimitEvent(k[0] if k else None, name, c, d)
                        if hooks.awaited:
                            await hooks.emit_async(event)
                        else:
                            hooks.emit(event)
                    if not d.allowed:
                        raise RateLimited(d.retry_after_ns, d)
                if not holds:
                    return await fn(*args, **kwargs)
                try:
                    return await fn(*args, **kwargs)
                finally:
                    chosen.release(*k, c)

            async_wrapper.limiter = chosen  # type: ignore[attr-defined]
            return async_wrapper  # type: ignore[return-value]

        if hooks is not None and hooks.awaited:
            raise TypeError(f"{name} is not async: its hooks must be plain functions")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if switch.off:  # limits turned off (a test run)
                return fn(*args, **kwargs)
            k, c = prefix(args, kwargs)
            if wait:
                if not chosen.acquire(*k, cost=c, timeout=timeout):
                    raise refused(k, c)
            else:
                d = chosen.check(*k, c)
                if hooks is not None:
                    hooks.emit(LimitEvent(k[0] if k else None, name, c, d))
                if not d.allowed:
                    raise RateLimited(d.retry_after_ns, d)
            if not holds:
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                chosen.release(*k, c)

        wrapper.limiter = chosen  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def _make_limiter(
    limiter: Any, rate: RateArg | None, capacity: int | None, key: Callable[..., Hashable] | None
) -> Any:
    if isinstance(limiter, str):  # @limit("5/minute"): the rate, as text
        if rate is not None:
            raise TypeError("limit() takes a rate once: as text or as rate=, not both")
        limiter, rate = None, limiter
    if limiter is not None:
        if rate is not None or capacity is not None:
            raise TypeError("limit() takes a limiter or rate=/capacity=, not both")
        if not traits(limiter).checks:
            raise TypeError(f"{type(limiter).__name__} is not a limiter (no check())")
        return limiter
    if rate is None or (capacity is None and not isinstance(rate, str)):
        raise TypeError(
            "limit() needs a limiter, both rate= and capacity=, or a rate written as "
            "text (rate='100/minute', whose count is the capacity)"
        )
    if key is not None:
        return KeyedTokenBucket(rate, capacity)
    return TokenBucket(rate, capacity)

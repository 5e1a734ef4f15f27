"""What a limiter is to the wrappers: its verbs, and whether they take a key.

Every limiter class says whether its verbs take a key first with a class
attribute ``keyed``: ``False`` for ``allow(cost=1)`` (`TokenBucket`,
`Concurrency`), ``True`` for ``allow(key, cost=1)`` (`KeyedTokenBucket`,
the shared and Redis tables, ``all_of``, ``tiered``). The wrappers
(``all_of``, `Waiting`, ``@limit``, the middlewares, the executor, the Celery
task) read it once, when they are built; nothing reads a signature.

A limiter of your own provides ``keyed`` and the verbs of `Limiter` or
`KeyedLimiter`, and for the wrappers that use them: ``refund`` (`Refundable`:
an ``all_of`` with more than one such layer), ``reserve`` (`Reservable`, with
``refund``: ``Waiting``, ``acquire``, ``LimitedExecutor``, ``charge=``),
``acquire`` / ``acquire_async`` (``@limit(..., wait=True)``), ``release``
with ``releases = True`` (an in-flight limit: the wrappers release it when
the call ends), ``key_optional = True`` (a keyed limiter whose verbs also
take key None), ``blocking = True`` (verbs that wait on the network in the
calling thread: the asyncio integrations refuse it). A decision is a
`nanobucket.Decision`, or any object with its fields::

    class PerUser:
        keyed = True

        def allow(self, key, cost=1): ...
        def check(self, key, cost=1): ...   # a nanobucket.Decision
        def peek(self, key, cost=1): ...

The wrappers ask these protocols (``isinstance(limiter, Reservable)``), never
for private names. `Clocked` marks a limiter whose state is in nanoseconds of
a clock of its own (the in-process buckets): waiters stand in its line and
move with it. `Composite` is a limiter made of others (``all_of``,
``tiered``): the wrappers see through it to the single limiters that decide.
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._decision_py import Decision

__all__ = (
    "Clocked",
    "Composite",
    "KeyedLimiter",
    "Limiter",
    "Refundable",
    "Reservable",
    "Reservation",
    "Traits",
    "is_keyed",
    "traits",
)


@runtime_checkable
class Limiter(Protocol):
    """A limiter whose verbs take no key: ``allow(cost=1)``, ``keyed = False``.

    >>> import nanobucket as nb
    >>> isinstance(nb.TokenBucket(1, 1), Limiter), nb.TokenBucket(1, 1).keyed
    (True, False)
    """

    keyed: bool

    def allow(self, cost: int = 1) -> bool: ...
    def check(self, cost: int = 1) -> Decision: ...
    def peek(self, cost: int = 1) -> Decision: ...


@runtime_checkable
class KeyedLimiter(Protocol):
    """A limiter whose verbs take the key first: ``allow(key, cost=1)``, ``keyed = True``.

    >>> import nanobucket as nb
    >>> isinstance(nb.KeyedTokenBucket(1, 1), KeyedLimiter), nb.KeyedTokenBucket(1, 1).keyed
    (True, True)
    """

    keyed: bool

    # key: Any, so that a limiter of str keys (``allow(self, key: str, ...)``) is one.
    def allow(self, key: Any, cost: int = 1) -> bool: ...
    def check(self, key: Any, cost: int = 1) -> Decision: ...
    def peek(self, key: Any, cost: int = 1) -> Decision: ...


@runtime_checkable
class Reservable(Protocol):
    """A limiter that reserves: ``reserve(*key, cost=1, max_wait_ns=0, shape=False, now=None)``.

    Reserve *cost* tokens for a caller that will wait for them: the bucket may
    go past empty, into debt, by at most *max_wait_ns* ns of waiting. Returns
    the ns to wait before using them (0: at once), or -1 with nothing
    written. With *shape* the wait ends at the start of the caller's slot
    (``cost / rate`` long), not when the bucket could hold the burst: a
    leaky bucket. *now* (int ns) is an explicit time, as in ``allow_at``.
    Every waiting, charging and pooling wrapper is built on it, as Go's
    ``ReserveN`` is behind ``Wait``.

    >>> import nanobucket as nb
    >>> b = nb.TokenBucket(rate=1, capacity=1)
    >>> isinstance(b, Reservable)
    True
    >>> b.reserve(now=0), b.reserve(now=0, max_wait_ns=5 * 10**9), b.reserve(now=0)
    (0, 1000000000, -1)
    """

    def reserve(
        self,
        *key: Hashable,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> Any: ...  # int, or an awaitable of one (an asyncio limiter)


@runtime_checkable
class Refundable(Protocol):
    """A limiter that takes tokens back: ``refund(*key, cost=1)``, ``refund_at(*key, now, cost=1)``
    (never above capacity).

    >>> import nanobucket as nb
    >>> b = nb.TokenBucket(rate=1, capacity=2)
    >>> isinstance(b, Refundable), b.allow_at(0, cost=2), b.refund_at(0), b.tokens_at(0)
    (True, True, None, 1.0)
    """

    def refund(self, *args: Any, **kwargs: Any) -> Any: ...
    def refund_at(self, *args: Any, **kwargs: Any) -> Any: ...


class Reservation:
    """Tokens reserved for later, which know how to give themselves back (Go's
    ``rate.Reservation``): ``ok``, ``delay_ns``, ``cancel()``.

    `Reservation.take` reserves through any `Reservable` limiter (the one
    that builds it needs `Refundable` too); a limiter's ``reservation(...)``
    is the same call. ``ok`` is False when nothing was reserved (the wait
    would pass *max_wait_ns*); ``delay_ns`` is the ns to wait before using
    the tokens (0: at once; -1 when not ``ok``). The rule of ``cancel()``:
    the whole cost goes back through the limiter's ``refund`` (never above
    its capacity), once. Whether the delay has passed or not makes no
    difference -- the limiter cannot tell whether the tokens were used, so
    cancel only those that were not. A second cancel, and the cancel of a
    reservation that is not ``ok``, give nothing back: they return False.

    >>> import nanobucket as nb
    >>> b = nb.TokenBucket(rate=1, capacity=2)
    >>> r = Reservation.take(b, (), cost=2, now=0)
    >>> r.ok, r.delay_ns, b.tokens_at(0)
    (True, 0, 0.0)
    >>> r.cancel_at(0), r.cancel_at(0), b.tokens_at(0)
    (True, False, 2.0)
    """

    __slots__ = ("_cost", "_delay_ns", "_held", "_key", "_limiter")

    def __init__(self, limiter: Any, key: tuple[Hashable, ...], cost: Any, delay_ns: int) -> None:
        """*delay_ns* as *limiter*'s ``reserve(*key, cost=cost, ...)`` returned it."""
        self._limiter = limiter
        self._key = key
        self._cost = cost
        self._delay_ns = delay_ns
        # Popped by the one cancel that gives back: list.pop is atomic, so two
        # threads cancelling at once give the tokens back once.
        self._held = [True] if delay_ns >= 0 else []

    @classmethod
    def take(
        cls,
        limiter: Any,
        key: tuple[Hashable, ...],
        cost: Any = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> Reservation:
        """Reserve through *limiter*'s ``reserve(*key, ...)`` (see `Reservable`).

        >>> import nanobucket as nb
        >>> t = nb.KeyedTokenBucket(rate=1, capacity=1)
        >>> [Reservation.take(t, ("alice",), now=0, max_wait_ns=10**9).delay_ns for _ in "ab"]
        [0, 1000000000]
        """
        wait = limiter.reserve(*key, cost=cost, max_wait_ns=max_wait_ns, shape=shape, now=now)
        return cls(limiter, key, cost, wait)

    @property
    def ok(self) -> bool:
        """Whether the tokens were reserved.

        >>> import nanobucket as nb
        >>> b = nb.TokenBucket(rate=1, capacity=1)
        >>> b.reservation(now=0).ok, b.reservation(now=0).ok
        (True, False)
        """
        return self._delay_ns >= 0

    @property
    def delay_ns(self) -> int:
        """Ns to wait, from when it was reserved, before using the tokens; -1 when not `ok`.

        >>> import nanobucket as nb
        >>> b = nb.TokenBucket(rate=2, capacity=1)
        >>> [b.reservation(now=0, max_wait_ns=10**9).delay_ns for _ in range(4)]
        [0, 500000000, 1000000000, -1]
        """
        return self._delay_ns

    def cancel(self) -> bool:
        """Give the tokens back now, once (see the class): True if this call did.

        >>> import nanobucket as nb
        >>> b = nb.TokenBucket(rate=1, capacity=3, clock=lambda: 0)
        >>> r, refused = b.reservation(cost=2), b.reservation(cost=2)
        >>> r.cancel(), r.cancel(), refused.cancel(), b.tokens()
        (True, False, False, 3.0)
        """
        return self._give(None)

    def cancel_at(self, now: int) -> bool:
        """`cancel` at an explicit time *now* (int ns), as ``refund_at``.

        >>> import nanobucket as nb
        >>> t = nb.KeyedTokenBucket(rate=1, capacity=2)
        >>> r = t.reservation("alice", cost=2, now=0)
        >>> t.tokens_at("alice", 0), r.cancel_at(0), t.tokens_at("alice", 0)
        (0.0, True, 2.0)
        """
        return self._give(now)

    def _give(self, now: int | None) -> bool:
        try:
            self._held.pop()
        except IndexError:
            return False
        try:
            if now is None:
                self._limiter.refund(*self._key, self._cost)
            else:
                self._limiter.refund_at(*self._key, now, self._cost)
        except BaseException:
            self._held.append(True)  # not given back (a bad now, a backend down): still held
            raise
        return True

    def __repr__(self) -> str:
        state = "ok" if self.ok else "refused"
        if self.ok and not self._held:
            state = "cancelled"
        return f"<Reservation {state} delay_ns={self._delay_ns}>"


@runtime_checkable
class Clocked(Protocol):
    """A limiter whose state is in ns of a clock of its own: ``clock_ns()`` reads it, and
    one token refills in ``interval_ns``. Its waiters stand in a line that moves with it.

    >>> import nanobucket as nb
    >>> b = nb.TokenBucket(rate=4, capacity=1, clock=lambda: 7)
    >>> isinstance(b, Clocked), b.clock_ns(), b.interval_ns
    (True, 7, 250000000)
    """

    @property
    def interval_ns(self) -> int: ...
    def clock_ns(self) -> int: ...


@runtime_checkable
class Composite(Protocol):
    """A limiter made of others (``all_of``, ``tiered``).

    ``leaves()``: every single limiter behind it (those with a rate and a
    capacity); ``leaf_names()``: the name of each leaf in header fields (a
    plan's, a layer's given name), None where it has none; ``parts(*key)``:
    the single limiters that decide *key*, each with the key arguments its
    verbs take; ``binding(decision)``: the name (as ``leaf_names()`` gives
    it) and the single limiter whose limit one of its decisions shows (the
    layer that bound it, the plan that decided it).

    >>> import nanobucket as nb
    >>> per_client, instance = nb.KeyedTokenBucket(1, 2), nb.TokenBucket(10, 5)
    >>> limit = nb.all_of(per_client, instance)
    >>> isinstance(limit, Composite), limit.leaves() == (per_client, instance)
    (True, True)
    >>> limit.parts("alice") == ((per_client, ("alice",)), (instance, ()))
    True
    >>> limit.binding(limit.check_at("alice", 0, cost=2)) == (None, per_client)
    True
    """

    def leaves(self) -> tuple[Any, ...]: ...
    def leaf_names(self) -> tuple[str | None, ...]: ...
    def parts(self, *key: Hashable) -> tuple[tuple[Any, tuple[Hashable, ...]], ...]: ...
    def binding(self, decision: Any) -> tuple[str | None, Any]: ...


class Traits(NamedTuple):
    """What a wrapper learns of a limiter beyond its verbs, once, when it wraps it: the
    contract's optional attributes (see the module), each False or None when absent.

    ``keyed``: its ``keyed`` (None: it declares none); ``key_optional``,
    ``releases``, ``blocking``: its flags of those names, True only when
    declared True; ``capacity``: its ``capacity`` when an int (the largest
    cost), else None; ``bucket``: a single limit of its own, with a ``rate``
    beside that capacity (what ``RateLimit-Policy`` shows; both are read live
    later, as a reconfigure changes them); ``checks``, ``acquires``,
    ``acquires_async``: whether it has ``check``, ``acquire``, ``acquire_async``.

    >>> import nanobucket as nb
    >>> t = traits(nb.all_of(nb.Concurrency(2)))
    >>> t.keyed, t.key_optional, t.releases, t.blocking, t.capacity, t.bucket
    (True, True, True, False, None, False)
    >>> traits(nb.TokenBucket(1, 5))[4:]
    (5, True, True, True, True)
    """

    keyed: bool | None
    key_optional: bool
    releases: bool
    blocking: bool
    capacity: int | None
    bucket: bool
    checks: bool
    acquires: bool
    acquires_async: bool


def traits(limiter: object) -> Traits:
    """*limiter*'s `Traits` (for a wrapper being built: never per request).

    >>> import nanobucket as nb
    >>> traits(nb.KeyedTokenBucket(1, 2)).capacity, traits(object()).checks
    (2, False)
    """
    keyed = getattr(limiter, "keyed", None)
    capacity = getattr(limiter, "capacity", None)
    capacity = capacity if type(capacity) is int else None
    return Traits(
        keyed if type(keyed) is bool else None,
        getattr(limiter, "key_optional", False) is True,
        getattr(limiter, "releases", False) is True,
        getattr(limiter, "blocking", False) is True,
        capacity,
        capacity is not None and getattr(limiter, "rate", None) is not None,
        callable(getattr(limiter, "check", None)),
        callable(getattr(limiter, "acquire", None)),
        callable(getattr(limiter, "acquire_async", None)),
    )


def is_async(limiter: object) -> bool:
    """Whether *limiter*'s verbs are coroutines to await (an asyncio limiter).

    Every wrapper that calls verbs without awaiting them refuses such a
    limiter through this one test: a coroutine is truthy, so each call would
    admit.

    >>> import nanobucket as nb
    >>> class Remote:
    ...     keyed = True
    ...     async def check(self, key, cost=1): ...
    >>> is_async(nb.KeyedTokenBucket(1, 1)), is_async(Remote())
    (False, True)
    """
    return any(
        inspect.iscoroutinefunction(getattr(limiter, verb, None))
        for verb in ("check", "allow", "reserve")
    )


def is_keyed(limiter: object) -> bool:
    """*limiter*'s ``keyed``: True if its verbs take a key first.

    >>> import nanobucket as nb
    >>> is_keyed(nb.TokenBucket(1, 1)), is_keyed(nb.KeyedTokenBucket(1, 1))
    (False, True)
    >>> is_keyed(object())
    Traceback (most recent call last):
    ...
    TypeError: object is not a limiter: its class declares no keyed = True/False
    """
    keyed = getattr(limiter, "keyed", None)
    if type(keyed) is not bool:
        raise TypeError(
            f"{type(limiter).__name__} is not a limiter: its class declares no keyed = True/False"
        )
    return keyed

"""Several limits as one: ``all_of(*limiters)`` admits a request only if every layer does.

Written here; documented and imported as ``nanobucket.layered``."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import Any

from .._core import _acquire
from .._core._bucket import Decision
from .._core._limiter import (
    Composite,
    KeyedLimiter,
    Limiter,
    Refundable,
    Reservable,
    Reservation,
    is_async,
    is_keyed,
    traits,
)
from .._core._params import validated_name, validated_timeout
from .concurrency import Slot
from .verbs import OptionalKeyVerbs

try:  # the one-call fast path for layers that are all Cython buckets on one clock
    from .._core._bucket_c import AllowAll as _AllowAll
except ImportError:  # pragma: no cover - a pure-Python install
    _AllowAll = None  # type: ignore[assignment,misc]

__all__ = ("AllOf", "LayeredDecision", "all_of")

_PLAIN, _KEYED, _NESTED = 0, 1, 2  # how a layer takes the key


class LayeredDecision(Decision):
    """The `Decision` of an ``all_of``: the binding layer's numbers, and which layer binds.

    The binding layer is, for a refused request, the refusing layer with the
    longest wait; for an admitted one, the layer with the fewest tokens left;
    a tie goes to the layer with the longest ``reset_after_ns``, then to the
    first. ``layer`` is its index (in the order given to ``all_of``), and
    ``remaining``, ``retry_after_ns``, ``reset_after_ns`` and ``limit`` are
    its own, so the five fields describe one bucket: the one to wait for
    (``retry_after_ns`` is when every layer admits the request again). The
    HTTP integrations send that bucket's header fields. ``decisions`` holds
    every layer's own. Equality compares the five Decision fields only, as
    for every decision.

    >>> from nanobucket import TokenBucket
    >>> limit = all_of(TokenBucket(rate=1, capacity=5), TokenBucket(rate=2, capacity=2))
    >>> d = limit.check_at(None, 0)
    >>> (d.allowed, d.layer, d.limit, d.remaining, d.reset_after_ns)
    (True, 1, 2, 1, 500000000)
    """

    __slots__ = {
        "decisions": """Every layer's own decision, in the order given to ``all_of``.

        >>> from nanobucket import TokenBucket
        >>> limit = all_of(TokenBucket(rate=1, capacity=5), TokenBucket(rate=2, capacity=2))
        >>> [d.remaining for d in limit.check_at(None, 0).decisions]
        [4, 1]
        """,
        "layer": """The index of the binding layer (in the order given to ``all_of``).

        >>> from nanobucket import TokenBucket
        >>> limit = all_of(TokenBucket(rate=4, capacity=1), TokenBucket(rate=1, capacity=1))
        >>> limit.allow_at(None, 0), limit.check_at(None, 0).layer   # the slower one binds
        (True, 1)
        """,
    }

    decisions: tuple[Any, ...]
    layer: int

    def __init__(self, allowed: bool, decisions: Sequence[Any]) -> None:
        layer = _binding(allowed, decisions)
        d = decisions[layer]
        super().__init__(allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)
        self.decisions = tuple(decisions)
        self.layer = layer

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, layer={self.layer})"


def _binding(allowed: bool, decisions: Sequence[Any]) -> int:
    """The index of the binding layer among *decisions* (see `LayeredDecision`)."""
    best = -1
    b: Any = None
    if allowed:  # the fewest tokens left, then the longest reset
        for i, d in enumerate(decisions):
            if (
                b is None
                or d.remaining < b.remaining
                or (d.remaining == b.remaining and d.reset_after_ns > b.reset_after_ns)
            ):
                best, b = i, d
        return best
    for i, d in enumerate(decisions):  # refusing layers: the longest wait, then reset
        if not d.allowed and (
            b is None
            or d.retry_after_ns > b.retry_after_ns
            or (d.retry_after_ns == b.retry_after_ns and d.reset_after_ns > b.reset_after_ns)
        ):
            best, b = i, d
    if best < 0:
        raise ValueError("a refused LayeredDecision needs a layer that refused")
    return best


def _names(
    names: object, layers: tuple[Any, ...], composite: tuple[bool, ...]
) -> tuple[str | None, ...]:
    """Validated ``names=`` of an ``all_of``: one per layer, None where a layer has none."""
    if names is None:
        return (None,) * len(layers)
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise TypeError(
            f"names must be a sequence of layer names, one per layer, not {type(names).__name__}"
        )
    found = tuple(names)
    if len(found) != len(layers):
        raise ValueError(
            f"names has {len(found)} names for {len(layers)} layers: give one per layer "
            "(None for a layer without one)"
        )
    for name, inner in zip(found, composite):
        if name is None:
            continue
        validated_name(name, "a layer name")
        if inner:
            raise ValueError(
                f"layer name {name!r} is given to an all_of or a tiered limiter, which names "
                "its own buckets (its names=, or its plans): give None for that layer"
            )
    # Every bucket's name, the nested layers' and plans' included: a name says which binds.
    owner: dict[str, int] = {}
    for layer, name, inner in zip(layers, found, composite):
        named = zip(layer.leaves(), layer.leaf_names()) if inner else ((layer, name),)
        for leaf, leaf_name in named:
            if leaf_name is not None and owner.setdefault(leaf_name, id(leaf)) != id(leaf):
                raise ValueError(f"two buckets of this all_of are named {leaf_name!r}")
    return found


def _style(layer: object) -> int:
    if isinstance(layer, AllOf):
        return _NESTED
    keyed = is_keyed(layer)
    name = type(layer).__name__
    if is_async(layer):
        raise TypeError(
            f"{name} is an asyncio limiter, and all_of calls its layers' verbs without "
            "awaiting them: give all_of sync limiters"
        )
    missing = [v for v in ("allow", "check", "peek") if not callable(getattr(layer, v, None))]
    if missing:
        raise TypeError(f"{name} has no {missing[0]}(): all_of needs allow, check and peek")
    return _KEYED if keyed else _PLAIN


class AllOf(OptionalKeyVerbs[LayeredDecision, None]):
    """One limiter made of several; build it with `all_of`.

    Verbs take an optional key first -- ``allow(key=None, cost=1)``,
    ``allow_at(key, now, cost=1)``, ``check``, ``peek``, ``refund``,
    ``acquire``, ``acquire_async`` -- and pass it to the keyed layers only.
    ``names`` holds the layers' names (``names=``), None for a layer without.

    >>> from nanobucket import KeyedTokenBucket, TokenBucket
    >>> per_client, instance = KeyedTokenBucket(rate=1, capacity=2), TokenBucket(rate=1, capacity=3)
    >>> limit = all_of(per_client, instance)
    >>> [limit.allow_at(user, 0) for user in ("alice", "alice", "alice", "bob", "bob")]
    [True, True, False, True, False]
    """

    keyed = True  # the verbs take the key first (it may be None)
    key_optional = True

    def __init__(self, *layers: Any, names: Iterable[str | None] | None = None) -> None:
        if not layers:
            raise ValueError("all_of() needs at least one limiter")
        styles = tuple(_style(layer) for layer in layers)
        # Which layers are made of others: learnt once (`binding` runs per request).
        self._composite = tuple(isinstance(layer, Composite) for layer in layers)
        self.names: tuple[str | None, ...] = _names(names, layers, self._composite)
        undoable = [isinstance(layer, Refundable) for layer in layers]
        if undoable.count(False) > 1:
            kinds = ", ".join(type(lr).__name__ for lr, ok in zip(layers, undoable) if not ok)
            raise TypeError(
                f"all_of() takes at most one layer without refund() (it is charged last); "
                f"got {kinds}"
            )
        self.layers: tuple[Any, ...] = tuple(layers)
        # What the layers can do, learnt once: refund and reserve ask on every call.
        self._no_refund = next((lr for lr, ok in zip(layers, undoable) if not ok), None)
        self._no_reserve = next((lr for lr in layers if not isinstance(lr, Reservable)), None)
        # Charging order: every refundable layer as given, then the one that is not.
        order = sorted(range(len(layers)), key=lambda i: not undoable[i])
        self._order = tuple(order)
        self._needs_key = _KEYED in styles
        self._steps = tuple(
            (layers[i].allow, styles[i], layers[i].refund if undoable[i] else None) for i in order
        )
        self._styles = styles
        # In-flight layers hold slots until release(); acquire waits for them
        # first, then for the other layers' tokens (an all_of of those).
        holds = [traits(layer).releases for layer in layers]
        self.releases = any(holds)
        self._holding = tuple(i for i in range(len(layers)) if holds[i])
        rates = [layer for layer, held in zip(layers, holds) if not held]
        self._rates = AllOf(*rates) if self.releases and rates else None
        # The hot path: in one Cython call when every layer is a Cython bucket
        # on the same clock (one clock reading for all); else Python code
        # unrolled for these layers (no loop, no per-layer branch).
        fast = (
            None
            if _AllowAll is None
            else _AllowAll.of([layers[i] for i in order], _missing_key, LayeredDecision)
        )
        self.allow = (  # type: ignore[method-assign]
            fast.allow if fast is not None else _compile_allow(self._steps, self._needs_key)
        )
        # Its check too, when the charging order is the order given (the
        # decisions are listed by it): every such bucket refunds, so it is.
        if fast is not None and self._order == tuple(range(len(layers))):
            self.check = fast.check  # type: ignore[method-assign]

    def _key(self, key: Hashable | None) -> None:
        if key is None and self._needs_key:
            raise TypeError("this all_of has a keyed layer: pass a key, e.g. allow(key)")

    # -- allow ---------------------------------------------------------------

    def allow(self, key: Hashable | None = None, cost: int = 1) -> bool:
        """Admit (True) only if every layer admits *cost*; a rejection charges no layer.

        >>> from nanobucket import TokenBucket
        >>> limit = all_of(TokenBucket(rate=1, capacity=2), TokenBucket(rate=1, capacity=1))
        >>> limit.allow(), limit.allow()   # the second layer is empty
        (True, False)
        >>> int(limit.layers[0].tokens())  # and the first was not charged for the refusal
        1
        """
        # Never reached on an all_of that __init__ built: it puts code made for
        # its layers in this method's place (`_compile_allow`, or `AllowAll`).
        raise TypeError("this AllOf was not initialised: build it with all_of(...)")

    # -- the steps of the verbs (`OptionalKeyVerbs`) ---------------------------

    def _admit(self, key: Hashable | None, cost: object, now: int | None) -> bool:
        # allow_at only: allow is the code __init__ made for these layers.
        self._key(key)
        done: list[int] = []
        try:
            for i in self._order:
                if not self._call(i, "allow_at", key, (now, cost)):
                    break
                done.append(i)
            else:
                return True
        finally:
            if len(done) < len(self._order):
                for j in done:
                    self._call(j, "refund_at", key, (now, cost))
        return False

    def _decide(
        self, key: Hashable | None, cost: object, now: int | None, consume: bool
    ) -> LayeredDecision:
        self._key(key)
        if now is None:
            if consume:
                return self._check(key, (cost,), "check", "refund", "peek")
            return self._peek(key, "peek", (cost,))
        if consume:
            return self._check(key, (now, cost), "check_at", "refund_at", "peek_at")
        return self._peek(key, "peek_at", (now, cost))

    def _tokens(self, key: Hashable | None, now: int | None) -> float:
        self._key(key)
        verb, args = ("tokens", ()) if now is None else ("tokens_at", (now,))
        return float(min(self._call(i, verb, key, args) for i in range(len(self.layers))))

    def _give(self, key: Hashable | None, cost: object, now: int | None) -> None:
        self._key(key)
        verb, args = ("refund", (cost,)) if now is None else ("refund_at", (now, cost))
        self._require(self._no_refund, verb)
        for i in range(len(self.layers)):
            self._call(i, verb, key, args)

    def _call(self, i: int, verb: str, key: Hashable | None, args: tuple[Any, ...]) -> Any:
        fn = getattr(self.layers[i], verb)
        return fn(*args) if self._styles[i] == _PLAIN else fn(key, *args)

    def _check(
        self, key: Hashable | None, args: tuple[Any, ...], check: str, refund: str, peek: str
    ) -> LayeredDecision:
        decisions: list[Any] = [None] * len(self.layers)
        done: list[int] = []
        rejected = -1
        try:
            for i in self._order:
                d = self._call(i, check, key, args)
                decisions[i] = d
                if not d.allowed:
                    rejected = i
                    break
                done.append(i)
        finally:
            if len(done) < len(self._order):
                for j in done:
                    self._call(j, refund, key, args)
        if rejected < 0:
            return LayeredDecision(True, decisions)
        # Every other layer as it stands now that nothing is charged.
        for i in range(len(self.layers)):
            if i != rejected:
                decisions[i] = self._call(i, peek, key, args)
        return LayeredDecision(False, decisions)

    def _peek(self, key: Hashable | None, verb: str, args: tuple[Any, ...]) -> LayeredDecision:
        decisions = [self._call(i, verb, key, args) for i in range(len(self.layers))]
        return LayeredDecision(all(d.allowed for d in decisions), decisions)

    # -- waiting -------------------------------------------------------------

    def _require(self, missing: object, verb: str) -> None:
        """Raise unless *missing* (the first layer without *verb*, learnt once) is None."""
        if missing is not None:
            raise TypeError(
                f"{type(missing).__name__} has no {verb}(): this all_of cannot "
                f"{'refund' if verb.startswith('refund') else 'wait'}"
            )

    def reserve(
        self,
        key: Hashable | None = None,
        *,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> int:
        """Reserve *cost* on every layer, or on none: the longest wait, or -1 (see
        `Reservable`). A caller that waits should ``acquire``: it holds only its
        slowest layer while it waits (see ``waiting``).

        >>> from nanobucket import TokenBucket
        >>> limit = all_of(TokenBucket(rate=1, capacity=1), TokenBucket(rate=2, capacity=1))
        >>> limit.reserve(now=0), limit.reserve(now=0, max_wait_ns=10**9)
        (0, 1000000000)
        >>> limit.reserve(now=0, max_wait_ns=10**9)   # the first layer: 2 s
        -1
        """
        self._key(key)
        self._require(self._no_reserve, "reserve")
        done: list[Reservation] = []
        longest = 0
        try:
            for layer, k in self.parts(key):
                r = Reservation.take(layer, k, cost, max_wait_ns, shape, now)
                if not r.ok:
                    return -1
                done.append(r)
                longest = max(longest, r.delay_ns)
            return longest
        finally:
            if len(done) < len(self.layers):  # refused or failed: undo the others
                for r in done:
                    r.cancel() if now is None else r.cancel_at(now)

    def reservation(
        self,
        key: Hashable | None = None,
        *,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> Reservation:
        """`reserve`, as a `nanobucket.Reservation`: ``cancel()`` gives back to every layer.

        >>> from nanobucket import TokenBucket
        >>> limit = all_of(TokenBucket(rate=1, capacity=1), TokenBucket(rate=2, capacity=2))
        >>> r = limit.reservation(now=0)
        >>> r.ok, limit.tokens_at(None, 0), r.cancel_at(0), limit.tokens_at(None, 0)
        (True, 0.0, True, 1.0)
        """
        return Reservation.take(self, (key,), cost, max_wait_ns, shape, now)

    def parts(self, key: Hashable | None = None) -> tuple[tuple[Any, tuple[Hashable, ...]], ...]:
        """Each layer with the key arguments its verbs take for *key* (see `Composite`).

        >>> from nanobucket import KeyedTokenBucket, TokenBucket
        >>> per_client, instance = KeyedTokenBucket(1, 2), TokenBucket(10, 5)
        >>> all_of(per_client, instance).parts("alice")[1] == (instance, ())
        True
        """
        self._key(key)
        return tuple(
            (layer, () if style == _PLAIN else (key,))
            for layer, style in zip(self.layers, self._styles)
        )

    def leaves(self) -> tuple[Any, ...]:
        """Every single limiter behind the layers, in order (a composite layer's, flattened).

        >>> from nanobucket import TokenBucket
        >>> a, b, c = TokenBucket(1, 1), TokenBucket(2, 2), TokenBucket(3, 3)
        >>> all_of(a, all_of(b, c)).leaves() == (a, b, c)
        True
        """
        found: list[Any] = []
        for layer, inner in zip(self.layers, self._composite):
            found += layer.leaves() if inner else (layer,)
        return tuple(found)

    def leaf_names(self) -> tuple[str | None, ...]:
        """The name of each of `leaves` in header fields, None where none is given:
        a layer's from ``names=``, a nested one's or a plan's (see `Composite`).

        >>> from nanobucket import KeyedTokenBucket, TokenBucket
        >>> limit = all_of(KeyedTokenBucket(1, 2), TokenBucket(10, 5), names=("client", "all"))
        >>> limit.leaf_names(), all_of(TokenBucket(1, 1)).leaf_names()
        (('client', 'all'), (None,))
        """
        found: list[str | None] = []
        for layer, name, inner in zip(self.layers, self.names, self._composite):
            found += layer.leaf_names() if inner else (name,)
        return tuple(found)

    def binding(self, decision: Any) -> tuple[str | None, Any]:
        """The name (None where none is given) and single limiter whose limit *decision*
        (one of this all_of's) shows: the binding layer's (see `Composite`).

        >>> from nanobucket import TokenBucket
        >>> fast, slow = TokenBucket(10, 10), TokenBucket(1, 1)
        >>> limit = all_of(fast, slow, names=("burst", "steady"))
        >>> limit.binding(limit.check_at(None, 0, cost=1)) == ("steady", slow)
        True
        """
        i = decision.layer
        if self._composite[i]:
            return self.layers[i].binding(decision.decisions[i])  # type: ignore[no-any-return]
        return self.names[i], self.layers[i]

    def acquire(
        self, key: Hashable | None = None, cost: int = 1, timeout: float | None = None
    ) -> bool:
        """Block until every layer admits *cost* (True), or refuse (False) -- see `waiting`.

        >>> from nanobucket import TokenBucket
        >>> limit = all_of(TokenBucket(rate=1, capacity=1), TokenBucket(rate=100, capacity=10))
        >>> limit.acquire(timeout=0.5), limit.acquire(timeout=0.5)   # the 2nd would wait ~1 s
        (True, False)
        """
        if timeout is not None:
            validated_timeout(timeout)
        if self.allow(key, cost):
            return True
        if self.releases:
            return self._hold(key, cost, timeout)
        return _acquire.acquire_slow(self, (key,), cost, timeout)

    def _hold(self, key: Hashable | None, cost: int, timeout: float | None) -> bool:
        """`acquire` with in-flight layers: their slots in order, then the tokens."""
        deadline = None if timeout is None else time.monotonic() + timeout
        held: list[int] = []
        try:
            for i in self._holding:
                if not self._call(i, "acquire", key, (cost, _left(deadline))):
                    return False
                held.append(i)
            if self._rates is None or self._rates.acquire(key, cost, _left(deadline)):
                held = []  # the request holds them now
                return True
            return False
        finally:
            for i in held:
                self._call(i, "release", key, (cost,))

    async def _hold_async(self, key: Hashable | None, cost: int, timeout: float | None) -> bool:
        """`_hold` for asyncio: a cancelled waiter releases what it held."""
        validated_timeout(timeout)
        if self.allow(key, cost):
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        held: list[int] = []
        try:
            for i in self._holding:
                if not await self._call(i, "acquire_async", key, (cost, _left(deadline))):
                    return False
                held.append(i)
            if self._rates is None or await self._rates.acquire_async(key, cost, _left(deadline)):
                held = []
                return True
            return False
        finally:
            for i in held:
                self._call(i, "release", key, (cost,))

    def acquire_async(
        self, key: Hashable | None = None, cost: int = 1, timeout: float | None = None
    ) -> Awaitable[bool]:
        """`acquire` for asyncio; a cancelled waiter gives its tokens back to every layer.

        >>> import asyncio
        >>> from nanobucket import TokenBucket
        >>> limit = all_of(TokenBucket(rate=1, capacity=1))
        >>> [asyncio.run(limit.acquire_async(timeout=0.5)) for _ in range(2)]
        [True, False]
        """
        self._key(key)
        if self.releases:
            return self._hold_async(key, cost, timeout)
        return _acquire.acquire_async(self, (key,), cost, timeout)

    def _in_flight(self) -> None:
        if not self.releases:
            raise TypeError(
                "this all_of has no in-flight layer (Concurrency, KeyedConcurrency): "
                "it holds nothing to release"
            )

    def release(self, key: Hashable | None = None, cost: int = 1) -> None:
        """Give back the slots of a finished request to every in-flight layer (tokens stay spent).

        >>> from nanobucket import Concurrency, TokenBucket
        >>> limit = all_of(Concurrency(1), TokenBucket(rate=1, capacity=2))
        >>> limit.allow(), limit.allow(), limit.release(), limit.allow(), limit.allow()
        (True, False, None, True, False)
        """
        self._key(key)
        self._in_flight()
        for i in self._holding:
            self._call(i, "release", key, (cost,))

    def slot(
        self, key: Hashable | None = None, cost: int = 1, timeout: float | None = None
    ) -> Slot:
        """`acquire` for a ``with`` / ``async with`` block, `release` at its end.

        Entering raises `nanobucket.RateLimited` when refused (after at most
        *timeout* seconds).

        >>> from nanobucket import Concurrency, TokenBucket
        >>> limit = all_of(Concurrency(10), TokenBucket(rate=100, capacity=20))
        >>> with limit.slot(timeout=1.0):
        ...     limit.layers[0].in_flight, limit.layers[1].tokens() < 20
        (1, True)
        >>> limit.layers[0].in_flight
        0
        """
        self._key(key)
        self._in_flight()
        return Slot(self, (key,), cost, timeout)

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        names = "" if not any(self.names) else f", names={self.names!r}"
        return f"all_of({', '.join(repr(layer) for layer in self.layers)}{names})"


def _compile_allow(steps: tuple[Any, ...], needs_key: bool) -> Callable[..., bool]:
    """`AllOf.allow` as straight-line code for these layers (see `AllOf.allow`).

    Layer i is charged only after layers 0..i-1 admitted; on a refusal or an
    error every layer already charged is refunded, latest first.
    """
    env: dict[str, Any] = {"_missing": _missing_key}
    lines = ["def allow(key=None, cost=1):"]
    if needs_key:
        lines += ["    if key is None:", "        _missing()"]
    for i, (allow, style, refund) in enumerate(steps):
        env[f"a{i}"], env[f"r{i}"] = allow, refund
        args = "cost" if style == _PLAIN else "key, cost"
        undo = "; ".join(
            f"r{j}({'cost' if steps[j][1] == _PLAIN else 'key, cost'})" for j in reversed(range(i))
        )
        if not undo:
            lines += [f"    if not a{i}({args}):", "        return False"]
            continue
        lines += [
            "    try:",
            f"        ok = a{i}({args})",
            "    except BaseException:",
            f"        {undo}",
            "        raise",
            "    if not ok:",
            f"        {undo}",
            "        return False",
        ]
    lines.append("    return True")
    exec("\n".join(lines), env)  # code built from the fixed template above
    fn: Callable[..., bool] = env["allow"]
    fn.__doc__ = AllOf.allow.__doc__
    return fn


def _left(deadline: float | None) -> float | None:
    """Seconds left until *deadline* (a `time.monotonic` reading), or None for no limit."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _missing_key() -> None:
    raise TypeError("this all_of has a keyed layer: pass a key, e.g. allow(key)")


def all_of(*limiters: Limiter | KeyedLimiter, names: Iterable[str | None] | None = None) -> AllOf:
    """One limiter admitting a request only if every one of *limiters* does.

    *names*, one per limiter (None for one without), name the layers in the
    HTTP integrations' header fields and 429 bodies: a client reads which
    limit binds it. Each is printable ASCII without ``"`` or ``\\``, and no
    two buckets share one; a nested ``all_of`` or a ``tiered`` layer names
    its own buckets (give None for it). Unnamed layers are named by the
    integration (see the web guide).

    >>> from nanobucket import KeyedTokenBucket, TokenBucket
    >>> limit = all_of(
    ...     KeyedTokenBucket(rate=100, capacity=200), TokenBucket(rate=1000, capacity=1000)
    ... )
    >>> limit.allow_at("alice", 0, cost=5)
    True
    >>> d = limit.check_at("alice", 0, cost=200)
    >>> (d.allowed, d.layer, d.remaining)
    (False, 0, 195)
    >>> named = all_of(KeyedTokenBucket(10, 20), TokenBucket(100, 100), names=("client", "all"))
    >>> named.check_at("alice", 0, cost=20).layer, named.names   # a client sends "client"
    (0, ('client', 'all'))
    """
    return AllOf(*limiters, names=names)

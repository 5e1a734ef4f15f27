"""Per-plan limits: one keyed limiter whose rate and capacity come from each caller's plan.

Written here; documented and imported as ``nanobucket.tiered``."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Awaitable, Callable, Generator, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

from .._core import _acquire
from .._core._bucket import Decision, limiter_or_text
from .._core._limiter import Composite, is_async, traits
from .._core._params import validated_max_keys, validated_name, validated_timeout
from .carry import Owed, Unread, carry, settle
from .drive import Call, drive, drive_async
from .verbs import AsyncKeyedVerbs, KeyedBatch, KeyedVerbs, Reserving

__all__ = ("AsyncTiered", "Tiered", "TieredDecision", "tiered", "using_plan")

DEFAULT_MAX_KEYS = 1_000_000

#: The plan the caller named for the decisions it makes now (`using_plan`); None: ``tier``'s.
#: A context variable: each thread and each asyncio task names its own.
_named: ContextVar[Any] = ContextVar("nanobucket_plan", default=None)


@contextmanager
def using_plan(name: str | None) -> Iterator[None]:
    """Every tiered limiter decides in the block on plan *name*, not on what ``tier`` says.

    For a plan the caller already knows (the user object an authentication
    step found): the FastAPI dependency's ``plan=`` is this. None leaves the
    choice to ``tier`` (or ``default``). Per thread and per asyncio task.

    >>> from nanobucket import KeyedTokenBucket
    >>> t = tiered({"free": KeyedTokenBucket(1, 2), "pro": KeyedTokenBucket(10, 20)},
    ...            default="free")
    >>> with using_plan("pro"):
    ...     t.check_at("alice", 0).plan
    'pro'
    >>> t.check_at("alice", 0).plan, t.plan("bob")
    ('free', 'free')
    """
    token = _named.set(name)
    try:
        yield
    finally:
        _named.reset(token)


_VERBS = ("allow", "allow_at", "check", "check_at", "peek", "peek_at")


class TieredDecision(Decision):
    """The `Decision` of a tiered limiter: the plan's own fields, and the plan's name.

    ``decision`` is the plan's own decision (a Redis one keeps its ``source``
    and ``reason``, read through this one too). Equality compares the five
    Decision fields only, as for every decision.

    >>> from nanobucket import KeyedTokenBucket
    >>> t = tiered({"free": KeyedTokenBucket(rate=10, capacity=20)}, tier=lambda key: "free")
    >>> d = t.check_at("alice", 0, cost=5)
    >>> d.plan, d.allowed, d.remaining, d.limit
    ('free', True, 15, 20)
    """

    __slots__ = {
        "decision": """The plan's own decision.

        >>> from nanobucket import KeyedTokenBucket
        >>> t = tiered({"free": KeyedTokenBucket(rate=1, capacity=2)}, tier=lambda key: "free")
        >>> t.check_at("alice", 0).decision
        Decision(allowed=True, remaining=1, retry_after_ns=0, reset_after_ns=1000000000, limit=2)
        """,
        "plan": """The name of the plan that decided.

        >>> from nanobucket import KeyedTokenBucket
        >>> t = tiered({"pro": KeyedTokenBucket(rate=1, capacity=2)}, tier=lambda key: "pro")
        >>> t.peek_at("alice", 0).plan
        'pro'
        """,
    }

    plan: str
    decision: Any

    def __init__(self, decision: Any, plan: str) -> None:
        d = decision
        # Decision's own __init__, named: one is made for every request (no super()).
        Decision.__init__(self, d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)
        self.decision = decision
        self.plan = plan

    def __getattr__(self, name: str) -> Any:
        if name in ("decision", "plan") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.decision, name)  # a Redis decision's source, reason

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, plan={self.plan!r})"


def _decided(decision: Any, plan: str) -> TieredDecision:
    """*plan*'s *decision* as a `TieredDecision`: its fields copied in one call (one is
    made for every request), or read one by one from a limiter's own decision type."""
    try:
        made = decision.copy_as(TieredDecision)
    except (AttributeError, TypeError):  # a decision of another type: any object with the
        return TieredDecision(decision, plan)  # five fields (the other twin's, your own)
    made.decision = decision
    made.plan = plan
    return made  # type: ignore[no-any-return]


def _check_plans(plans: object) -> dict[str, tuple[str, Any]]:
    """Validated plans: each name to ``(name, limiter)``, the name kept as one object."""
    if not isinstance(plans, Mapping):
        raise TypeError(f"plans must be a mapping of plan name to limiter, not {plans!r}")
    if not plans:
        raise ValueError("tiered() needs at least one plan")
    found: dict[str, tuple[str, Any]] = {}
    seen: dict[int, str] = {}
    for name, given in plans.items():
        validated_name(name, "a plan name")
        limiter = limiter_or_text(given)  # "100/minute": a KeyedTokenBucket of its own
        learnt = traits(limiter)
        missing = [v for v in _VERBS if not callable(getattr(limiter, v, None))]
        if (
            learnt.keyed is not True
            or learnt.capacity is None
            or missing
            or isinstance(limiter, Composite)
        ):
            raise TypeError(
                f"plan {name!r} is {type(limiter).__name__}: a plan must be one keyed table "
                "(KeyedTokenBucket, SharedKeyedTokenBucket, RedisTokenBucket...), "
                "not an unkeyed bucket, an all_of or a tiered limiter"
            )
        if id(limiter) in seen:
            raise ValueError(f"plans {seen[id(limiter)]!r} and {name!r} are the same limiter")
        seen[id(limiter)] = name
        found[name] = (name, limiter)
    kinds = {name: is_async(lr) for name, (_, lr) in found.items()}
    if len(set(kinds.values())) > 1:
        sync = [n for n, a in kinds.items() if not a]
        asyncio_ = [n for n, a in kinds.items() if a]
        raise TypeError(
            f"plans must be all sync or all asyncio: {sync} are sync, {asyncio_} asyncio"
        )
    _check_redis_keys(found)
    return found


def _check_redis_keys(plans: dict[str, tuple[str, Any]]) -> None:
    """Plans in one Redis must not share their buckets (one prefix and one limit): each is
    its own bucket of a key."""
    owner: dict[object, str] = {}
    for name, (_, limiter) in plans.items():
        to_key = getattr(limiter, "key", None)
        if not callable(to_key):
            continue
        stored = to_key("k")
        if stored in owner:
            raise ValueError(
                f"plans {owner[stored]!r} and {name!r} share their Redis buckets (the same "
                "prefix and limit): give each plan its own prefix="
            )
        owner[stored] = name


class _Plans:
    """What the sync and asyncio tiered limiters share: plans, the choice, the memory."""

    keyed = True  # the verbs take the key first
    _asyncio = False  # whether the plans' verbs are awaited
    _wrong_kind = "asyncio plans: use AsyncTiered (tiered() picks it)"
    _pick: Callable[..., Any]  # key, now -> (name, plan): a subclass's, sync or a coroutine

    def __init__(
        self,
        plans: Mapping[str, Any],
        tier: Callable[[Any], Any] | None = None,
        *,
        default: str | None = None,
        max_keys: int = DEFAULT_MAX_KEYS,
    ) -> None:
        found = _check_plans(plans)
        if tier is not None and not callable(tier):
            raise TypeError(f"tier must be a callable key -> plan name, not {tier!r}")
        if default is not None and default not in found:
            raise ValueError(f"default {default!r} is not a plan (plans: {list(found)})")
        self._max_keys = validated_max_keys(max_keys)
        self._plans = found
        self._view = MappingProxyType({name: lr for name, (_, lr) in found.items()})
        self._tier = tier
        self._default = None if default is None else found[default]
        if any(is_async(lr) is not self._asyncio for lr in self._view.values()):
            raise TypeError(self._wrong_kind)
        self._last: dict[Hashable, str] = {}  # key -> the plan it was last served on
        self._owed: dict[Hashable, Owed] = {}  # key -> what it owes (few keys: see `Owed`)
        self._largest = max(self._view.values(), key=lambda lr: lr.capacity)
        self._lock = threading.Lock()
        # Moves in progress: a sync one holds the lock, an asyncio one leaves a future per key.
        self._move_lock = threading.Lock()
        self._moves: dict[Hashable, asyncio.Future[None]] = {}

    @property
    def plans(self) -> Mapping[str, Any]:
        """The plans by name (read-only).

        >>> from nanobucket import KeyedTokenBucket
        >>> t = tiered({"free": KeyedTokenBucket(10, 20)}, tier=lambda key: "free")
        >>> list(t.plans), t.plans["free"].capacity
        (['free'], 20)
        """
        return self._view

    @property
    def default(self) -> str | None:
        """The plan of a key whose ``tier`` names no plan, or None (then that raises).

        >>> from nanobucket import KeyedTokenBucket
        >>> t = tiered({"free": KeyedTokenBucket(10, 20)}, tier=lambda key: None, default="free")
        >>> t.default, t.plan("anonymous")
        ('free', 'free')
        """
        return None if self._default is None else self._default[0]

    @property
    def max_keys(self) -> int:
        """The most keys whose plan is remembered (the oldest eighth is then forgotten).

        >>> from nanobucket import KeyedTokenBucket
        >>> tiered({"free": KeyedTokenBucket(10, 20)}, tier=lambda k: "free", max_keys=8).max_keys
        8
        """
        return self._max_keys

    def plan(self, key: Hashable) -> str:
        """The name of the plan ``tier`` picks for *key* now (``default`` applied).

        >>> from nanobucket import KeyedTokenBucket
        >>> plans = {"free": KeyedTokenBucket(10, 20), "pro": KeyedTokenBucket(100, 200)}
        >>> t = tiered(plans, tier=lambda user: "pro" if user == "alice" else "free")
        >>> t.plan("alice"), t.plan("bob")
        ('pro', 'free')
        """
        return self._choose(key)[0]

    def _choose(self, key: Hashable) -> tuple[str, Any]:
        name = _named.get()
        if name is None and self._tier is not None:
            name = self._tier(key)
        try:
            found = self._plans.get(name)
        except TypeError:  # an unhashable name
            found = None
        return self._fallback(key, name) if found is None else found

    def _fallback(self, key: Hashable, name: object) -> tuple[str, Any]:
        """The default plan of *key*, whose ``tier`` named *name*, not a plan."""
        if self._default is None:
            if name is None and self._tier is None:
                raise ValueError(
                    f"no plan for {key!r}: decide it inside using_plan(name), or give "
                    "tier= or default="
                )
            said = (
                f"using_plan({name!r}) named"
                if _named.get() is not None
                else f"tier({key!r}) returned"
            )
            raise ValueError(
                f"{said} {name!r}, which is not a plan "
                f"(plans: {list(self._plans)}; or give default=)"
            )
        return self._default

    def _carrying(
        self, key: Hashable, now: int | None, found: tuple[str, Any]
    ) -> Generator[Call, Any, bool]:
        """The move of *key* to the plan *found* as the calls it makes (see `carry`),
        remembered at its end; False when a plan could not be read (nothing is charged
        nor remembered: the next request tries again)."""
        name, plan = found
        last = self._last.get(key)
        left = None if last is None else self._plans[last][1]
        others = [lr for n, (_, lr) in self._plans.items() if n != name]
        try:
            owed = yield from carry(
                key, now, plan, left, self._owed.get(key), others, self._largest.capacity
            )
        except Unread:
            return False
        forgotten = self._remember(key, name, owed)
        yield from settle(forgotten, self._largest, now)
        return True

    def _remember(
        self, key: Hashable, name: str, owed: Owed | None
    ) -> list[tuple[Hashable, Any, Owed]]:
        """Remember *key*'s plan (and what it owes); the keys forgotten for room that owed."""
        last = self._last
        forgotten: list[tuple[Hashable, Any, Owed]] = []
        with self._lock:
            if key in last:
                del last[key]  # inserted again: the newest
            elif len(last) >= self._max_keys:
                for old in list(itertools.islice(last, max(1, self._max_keys // 8))):
                    plan = self._plans[last.pop(old)][1]
                    if (was := self._owed.pop(old, None)) is not None:
                        forgotten.append((old, plan, was))
            last[key] = name
            if owed is None:
                self._owed.pop(key, None)
            else:
                self._owed[key] = owed
        return forgotten

    def _batch_steps(
        self, keys: Iterable[Hashable], cost: object, now: int | None
    ) -> Generator[Call, Any, bytearray]:
        """A batch as the calls it makes (one `_pick` per distinct key, one
        ``allow_many`` per plan), for `drive` or `drive_async` to run."""
        if isinstance(keys, (str, bytes)):
            raise TypeError("keys must be a sequence of keys, not a single str or bytes")
        keys = list(keys)
        picked: dict[Hashable, tuple[str, Any]] = {}  # one tier() per distinct key
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            found = picked.get(key)
            if found is None:
                found = picked[key] = yield (self._pick, (key, now))
            groups.setdefault(found[0], []).append(i)
        out = bytearray(len(keys))
        for name, where in groups.items():
            plan = self._plans[name][1]
            batch = [keys[i] for i in where]
            got = yield (
                (plan.allow_many, (batch, cost))
                if now is None
                else (plan.allow_many_at, (batch, now, cost))
            )
            for i, admitted in zip(where, got):
                out[i] = admitted
        return out

    def _resettable(self) -> None:
        for name, (_, plan) in self._plans.items():
            if not callable(getattr(plan, "reset", None)):
                raise TypeError(f"plan {name!r} ({type(plan).__name__}) has no reset()")

    def leaves(self) -> tuple[Any, ...]:
        """The plans' limiters (see `Composite`).

        >>> from nanobucket import KeyedTokenBucket
        >>> free, pro = KeyedTokenBucket(10, 20), KeyedTokenBucket(100, 200)
        >>> tiered({"free": free, "pro": pro}, tier=lambda k: "free").leaves() == (free, pro)
        True
        """
        return tuple(self._view.values())

    def leaf_names(self) -> tuple[str | None, ...]:
        """The plans' names, in the order of `leaves` (see `Composite`).

        >>> from nanobucket import KeyedTokenBucket
        >>> free, pro = KeyedTokenBucket(10, 20), KeyedTokenBucket(100, 200)
        >>> tiered({"free": free, "pro": pro}, tier=lambda k: "free").leaf_names()
        ('free', 'pro')
        """
        return tuple(self._view)

    def binding(self, decision: Any) -> tuple[str | None, Any]:
        """The plan that made *decision* (a `TieredDecision`): its name and limiter.

        >>> from nanobucket import KeyedTokenBucket
        >>> free = KeyedTokenBucket(rate=10, capacity=20)
        >>> t = tiered({"free": free}, tier=lambda k: "free")
        >>> t.binding(t.peek_at("alice", 0)) == ("free", free)
        True
        """
        return self._plans[decision.plan]  # (name, limiter), as the plans were given

    def __len__(self) -> int:
        """Keys whose plan this limiter remembers now.

        >>> from nanobucket import KeyedTokenBucket
        >>> t = tiered({"free": KeyedTokenBucket(10, 20)}, tier=lambda key: "free")
        >>> t.allow_at("alice", 0), t.allow_at("bob", 0), len(t)
        (True, True, 2)
        """
        return len(self._last)

    def __repr__(self) -> str:
        plans = ", ".join(f"{n!r}: {lr!r}" for n, lr in self._view.items())
        return f"tiered({{{plans}}}, tier={self._tier!r})"


class Tiered(_Plans, KeyedVerbs[TieredDecision, Any], KeyedBatch[TieredDecision, Any], Reserving):
    """A keyed limiter whose buckets come from each key's plan; build it with `tiered`.

    The verbs of a keyed table, each forwarded to the plan ``tier(key)``
    names, after carrying the key's spent tokens if its plan changed:
    ``allow``, ``allow_at``, ``check``, ``check_at``, ``peek``, ``peek_at``,
    ``tokens``, ``tokens_at``, ``allow_many``, ``allow_many_at``,
    ``refund``, ``refund_at``, ``reserve``, ``acquire`` and ``acquire_async``
    (waiting in the line of the key's bucket of its plan), and ``reset``
    when every plan has one (not shared memory).

    >>> from nanobucket import KeyedTokenBucket
    >>> plan_of = {"alice": "free"}
    >>> t = Tiered({"free": KeyedTokenBucket(rate=10, capacity=20),
    ...             "pro": KeyedTokenBucket(rate=100, capacity=200)}, tier=plan_of.get)
    >>> t.allow_at("alice", 0, cost=15)
    True
    >>> plan_of["alice"] = "pro"        # an upgrade keeps the 15 spent
    >>> t.check_at("alice", 0, cost=0).remaining
    185
    """

    def _pick(self, key: Hashable, now: int | None = None) -> tuple[str, Any]:
        found = self._choose(key)
        if self._last.get(key) is not found[0]:
            self._move(key, found, now)
        return found

    def _move(self, key: Hashable, found: tuple[str, Any], now: int | None) -> None:
        with self._move_lock:  # one move at a time: a second caller finds it done
            if self._last.get(key) is not found[0]:
                drive(self._carrying(key, now, found))

    # The steps the verbs are derived from (`nanobucket._compose.verbs`): the plan's own verbs.

    def _decide(
        self, key: Hashable, cost: object, now: int | None, consume: bool
    ) -> TieredDecision:
        name, plan = self._pick(key, now)
        if now is None:
            d = plan.check(key, cost) if consume else plan.peek(key, cost)
        else:
            d = plan.check_at(key, now, cost) if consume else plan.peek_at(key, now, cost)
        return _decided(d, name)

    def _admit(self, key: Hashable, cost: object, now: int | None) -> bool:
        plan = self._pick(key, now)[1]
        return bool(plan.allow(key, cost) if now is None else plan.allow_at(key, now, cost))

    def allow(self, key: Hashable, cost: int = 1) -> bool:
        """Spend *cost* tokens from *key*'s bucket of its plan now; True if admitted.

        Written out (not derived from `_admit`): the hot path, one call fewer.

        >>> from nanobucket import KeyedTokenBucket
        >>> plans = {"free": KeyedTokenBucket(1, 1, clock=lambda: 0),
        ...          "pro": KeyedTokenBucket(1, 3, clock=lambda: 0)}
        >>> t = tiered(plans, tier=lambda user: "pro" if user == "alice" else "free")
        >>> [t.allow("alice") for _ in range(4)], [t.allow("bob") for _ in range(2)]
        ([True, True, True, False], [True, False])
        """
        return bool(self._pick(key)[1].allow(key, cost))

    def check(self, key: Hashable, cost: int = 1) -> TieredDecision:
        """Like `allow`, but return the `TieredDecision` (naming the plan).

        Written out too: what an HTTP integration calls for every request.

        >>> from nanobucket import KeyedTokenBucket
        >>> t = tiered({"free": KeyedTokenBucket(10, 20, clock=lambda: 0)}, tier=lambda k: "free")
        >>> t.check("alice", cost=5)
        TieredDecision(allowed=True, remaining=15, retry_after_ns=0, reset_after_ns=500000000, \
limit=20, plan='free')
        """
        name = _named.get()  # `_pick`, inlined: what every request runs
        if name is None and self._tier is not None:
            name = self._tier(key)
        try:
            found = self._plans.get(name)
        except TypeError:  # an unhashable name
            found = None
        if found is None:
            found = self._fallback(key, name)
        if self._last.get(key) is not found[0]:
            self._move(key, found, None)
        return _decided(found[1].check(key, cost), found[0])

    def _tokens(self, key: Hashable, now: int | None) -> float:
        plan = self._pick(key, now)[1]
        return float(plan.tokens(key) if now is None else plan.tokens_at(key, now))

    def _many(self, keys: Iterable[Hashable], cost: object, now: int | None) -> bytearray:
        return drive(self._batch_steps(keys, cost, now))

    def _give(self, key: Hashable, cost: object, now: int | None) -> Any:
        plan = self._pick(key, now)[1]
        return plan.refund(key, cost) if now is None else plan.refund_at(key, now, cost)

    def reset(self, key: Hashable) -> None:
        """Forget *key*'s bucket in every plan: the next decision sees it full
        (``TypeError`` when a plan cannot: a shared-memory table).

        >>> from nanobucket import KeyedTokenBucket
        >>> t = tiered({"free": KeyedTokenBucket(rate=10, capacity=20)}, tier=lambda k: "free")
        >>> t.allow_at("alice", 0, cost=20), t.reset("alice"), t.tokens_at("alice", 0)
        (True, None, 20.0)
        """
        self._resettable()
        for _, plan in self._plans.values():
            plan.reset(key)
        self._owed.pop(key, None)  # full in every plan: it owes nothing

    def reserve(
        self,
        key: Hashable,
        *,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> int:
        """The plan's ``reserve`` (see `nanobucket.Reservable`).

        >>> from nanobucket import KeyedTokenBucket
        >>> t = tiered({"free": KeyedTokenBucket(rate=1, capacity=1)}, tier=lambda k: "free")
        >>> t.reserve("alice", now=0), t.reserve("alice", now=0, max_wait_ns=10**9)
        (0, 1000000000)
        """
        plan = self._pick(key, now)[1]
        wait: int = plan.reserve(key, cost=cost, max_wait_ns=max_wait_ns, shape=shape, now=now)
        return wait

    def parts(self, key: Hashable) -> tuple[tuple[Any, tuple[Hashable, ...]], ...]:
        """The plan that decides *key* (its move made first), with *key* (see `Composite`).

        >>> from nanobucket import KeyedTokenBucket
        >>> free = KeyedTokenBucket(rate=10, capacity=20)
        >>> tiered({"free": free}, tier=lambda k: "free").parts("alice") == ((free, ("alice",)),)
        True
        """
        return ((self._pick(key)[1], (key,)),)

    def acquire(self, key: Hashable, cost: int = 1, timeout: float | None = None) -> bool:
        """Wait (block the thread) until *key*'s plan admits *cost*, or refuse: in the line
        of its bucket of that plan (see `nanobucket.waiting`).

        >>> from nanobucket import KeyedTokenBucket
        >>> t = tiered({"free": KeyedTokenBucket(rate=10, capacity=1)}, tier=lambda k: "free")
        >>> t.acquire("alice"), t.acquire("alice", timeout=0), t.acquire("alice", timeout=1.0)
        (True, False, True)
        """
        if timeout is not None:
            validated_timeout(timeout)
        if self.allow(key, cost):
            return True
        return _acquire.acquire_slow(self, (key,), cost, timeout)

    def acquire_async(
        self, key: Hashable, cost: int = 1, timeout: float | None = None
    ) -> Awaitable[bool]:
        """`acquire` for asyncio: ``await t.acquire_async(key)``.

        >>> import asyncio
        >>> from nanobucket import KeyedTokenBucket
        >>> t = tiered({"free": KeyedTokenBucket(rate=1, capacity=1)}, tier=lambda k: "free")
        >>> asyncio.run(t.acquire_async("alice")), asyncio.run(t.acquire_async("alice", timeout=0))
        (True, False)
        """
        return _acquire.acquire_async(self, (key,), cost, timeout)


class AsyncTiered(_Plans, AsyncKeyedVerbs[TieredDecision, Any]):
    """`Tiered` over asyncio plans (``AsyncRedisTokenBucket``): the same verbs, awaited.

    ``allow``, ``check``, ``peek``, ``tokens``, ``allow_many``, ``refund``
    (and their ``_at`` forms), ``reset`` and ``acquire_async``; two tasks
    switching one key at once carry it once.
    (In the examples of its verbs, ``example_plan()`` is an asyncio Redis plan
    whose Redis has just failed, with ``on_error="open"``: they run offline.)

    >>> import asyncio
    >>> from nanobucket.redis import AsyncRedisTokenBucket
    >>> url = "redis://127.0.0.1:6379/0"   # no connection is made until a verb runs
    >>> t = tiered({"free": AsyncRedisTokenBucket.from_url(url, 10, 20, prefix="free"),
    ...             "pro": AsyncRedisTokenBucket.from_url(url, 100, 200, prefix="pro")},
    ...            tier=lambda user: "free")
    >>> type(t).__name__, t.plan("alice")
    ('AsyncTiered', 'free')
    """

    _asyncio = True
    _wrong_kind = "sync plans: use Tiered (tiered() picks it)"

    def parts(self, key: Hashable) -> tuple[tuple[Any, tuple[Hashable, ...]], ...]:
        """The plan ``tier`` names for *key* now, with *key* (see `Composite`); a move
        to it is made by the key's next verb.

        >>> import asyncio
        >>> plan = example_plan()
        >>> tiered({"free": plan}, tier=lambda key: "free").parts("alice") == ((plan, ("alice",)),)
        True
        """
        return ((self._choose(key)[1], (key,)),)

    async def _pick(self, key: Hashable, now: int | None = None) -> tuple[str, Any]:
        found = self._choose(key)
        if self._last.get(key) is not found[0]:
            await self._move(key, found, now)
        return found

    async def _move(self, key: Hashable, found: tuple[str, Any], now: int | None) -> None:
        while (pending := self._moves.get(key)) is not None:
            await asyncio.shield(pending)  # another task is moving this key
        if self._last.get(key) is found[0]:
            return
        done = self._moves[key] = asyncio.get_running_loop().create_future()
        try:
            await drive_async(self._carrying(key, now, found))
        finally:
            del self._moves[key]
            done.set_result(None)

    # The steps the verbs are derived from (`nanobucket._compose.verbs`): the plan's own, awaited.

    async def _decide(
        self, key: Hashable, cost: object, now: int | None, consume: bool
    ) -> TieredDecision:
        name, plan = await self._pick(key, now)
        if now is None:
            d = await (plan.check(key, cost) if consume else plan.peek(key, cost))
        else:
            d = await (plan.check_at(key, now, cost) if consume else plan.peek_at(key, now, cost))
        return _decided(d, name)

    async def _admit(self, key: Hashable, cost: object, now: int | None) -> bool:
        plan = (await self._pick(key, now))[1]
        return bool(await (plan.allow(key, cost) if now is None else plan.allow_at(key, now, cost)))

    async def _tokens(self, key: Hashable, now: int | None) -> float:
        plan = (await self._pick(key, now))[1]
        return float(await (plan.tokens(key) if now is None else plan.tokens_at(key, now)))

    async def _many(self, keys: Iterable[Hashable], cost: object, now: int | None) -> bytearray:
        return await drive_async(self._batch_steps(keys, cost, now))

    async def _give(self, key: Hashable, cost: object, now: int | None) -> Any:
        plan = (await self._pick(key, now))[1]
        return await (plan.refund(key, cost) if now is None else plan.refund_at(key, now, cost))

    async def reset(self, key: Hashable) -> None:
        """Forget *key*'s bucket in every plan: the next decision sees it full.

        >>> import asyncio
        >>> t = tiered({"free": example_plan()}, tier=lambda key: "free")
        >>> asyncio.run(t.reset("alice"))
        """
        self._resettable()
        for _, plan in self._plans.values():
            await plan.reset(key)
        self._owed.pop(key, None)

    async def reserve(
        self,
        key: Hashable,
        *,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> int:
        """The plan's ``reserve``, awaited.

        >>> import asyncio
        >>> t = tiered({"free": example_plan()}, tier=lambda key: "free")
        >>> asyncio.run(t.reserve("alice"))   # Redis is not reached: the policy admits
        0
        """
        plan = (await self._pick(key, now))[1]
        wait: int = await plan.reserve(
            key, cost=cost, max_wait_ns=max_wait_ns, shape=shape, now=now
        )
        return wait

    async def acquire_async(
        self, key: Hashable, cost: int = 1, timeout: float | None = None
    ) -> bool:
        """Wait until *key*'s plan admits *cost*, or refuse: the plan's own ``acquire_async``.

        >>> import asyncio
        >>> t = tiered({"free": example_plan()}, tier=lambda key: "free")
        >>> asyncio.run(t.acquire_async("alice"))
        True
        """
        plan = (await self._pick(key))[1]
        return bool(await plan.acquire_async(key, cost, timeout))


def tiered(
    plans: Mapping[str, Any],
    tier: Callable[[Any], Any] | None = None,
    *,
    default: str | None = None,
    max_keys: int = DEFAULT_MAX_KEYS,
) -> Any:  # a Tiered or an AsyncTiered: which one depends on the plans
    """One keyed limiter over *plans* (name -> keyed limiter), each key decided by ``tier(key)``'s.

    A `Tiered`, or an `AsyncTiered` when the plans are asyncio ones.
    *default* names the plan of keys whose ``tier`` names none (else
    ``ValueError``); *max_keys* bounds the plans remembered (see the module).
    A plan written as a rate in text (``{"free": "10/minute"}``) is a
    `KeyedTokenBucket` of it, its capacity the count.
    Without *tier*, each decision's plan is the one its caller names with
    `using_plan` (the FastAPI dependency's ``plan=`` does), else *default*.

    >>> from nanobucket import KeyedTokenBucket
    >>> plan_of = {"alice": "pro"}
    >>> limiter = tiered(
    ...     {"free": KeyedTokenBucket(rate=10, capacity=20),
    ...      "pro": KeyedTokenBucket(rate=100, capacity=200)},
    ...     tier=plan_of.get, default="free")
    >>> sum(limiter.allow_at("alice", 0) for _ in range(300)), sum(
    ...     limiter.allow_at("bob", 0) for _ in range(300))
    (200, 20)
    >>> tiered({"free": "10/minute", "pro": "100/minute"}, tier=plan_of.get,
    ...        default="free").plans["pro"].capacity
    100
    """
    if isinstance(plans, Mapping) and any(is_async(lr) for lr in plans.values()):
        return AsyncTiered(plans, tier, default=default, max_keys=max_keys)
    return Tiered(plans, tier, default=default, max_keys=max_keys)

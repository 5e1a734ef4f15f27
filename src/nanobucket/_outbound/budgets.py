"""Pacing an API by several budgets at once: requests and tokens per minute, as LLM
providers announce them on every answer.

Two header families are read (`nanobucket._outbound.budget_fields`): OpenAI-style
``x-ratelimit-*-{requests,tokens}`` and Anthropic-style ``anthropic-ratelimit-*``,
each budget's limit, remaining and reset; and ``retry-after-ms``, else
``retry-after``, on a 429 or a 503: no request to the key leaves before it ends.

`Ledger` keeps, per key and per budget, what the server has left: a request
leaves when every budget it spends from has room for its cost (its
*estimate*, a callable on the request; one unit of a budget it does not
name), and waits for the latest reset among those that lack it. An answer
sets each budget it announces to the server's word, less what the requests
still out were charged; *settle*, a callable on the response, says what a
request really spent, and the difference is given back or charged in the
budgets that answer did not announce (an announced one already counts it as
the server did). Between answers a budget refills to its limit at its reset,
and from then on every window-long span (the time the server's last answer
says it takes to refill all of it) may refill it again.

No answer holds a key past a day (`MAX_WAIT_S`). Nothing here imports an HTTP
client: the adapters pass a request to *estimate*, a response to *settle*, and
a header getter (`Get`) to `Ledger.answered`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NamedTuple

from .._core._params import NS_PER_S, Clock
from .budget_fields import BUDGETS, Budget, parse_budgets, parse_pause
from .fields import MAX_WAIT_S, Get
from .pacer import WaitTooLong

__all__ = ("ANNOUNCING_MARKS", "Charge", "Ledger", "validated_costs")

_MAX_WAIT_NS = MAX_WAIT_S * NS_PER_S
_NO_WINDOW = NS_PER_S  # a refill's period before any answer said one (a second)
#: An answer that has none of these announces no budget (most answers of most APIs).
_ANNOUNCING = tuple(f"x-ratelimit-limit-{name}" for name in ("requests", "tokens")) + tuple(
    f"anthropic-ratelimit-{name}-limit" for name in BUDGETS
)
#: One of these is in the name of every `_ANNOUNCING` field: an answer whose lower-cased
#: names hold neither announces no budget (the adapters' one look at the names says so).
ANNOUNCING_MARKS = ("ratelimit-limit-", "anthropic-ratelimit-")


def validated_costs(costs: object, what: str) -> dict[str, int]:
    """*costs* (what an *estimate* or *settle* callable returned) as a dict of budget name
    to a whole count >= 0, else ``TypeError`` / ``ValueError``.

    >>> validated_costs({"tokens": 1200}, "estimate")
    {'tokens': 1200}
    >>> validated_costs({"tokens": -1}, "settle")
    Traceback (most recent call last):
    ValueError: settle must return whole counts >= 0 by budget name, got {'tokens': -1}
    """
    if not isinstance(costs, Mapping):
        raise TypeError(f"{what} must return a mapping of budget name to count, not {costs!r}")
    for name, count in costs.items():
        if not isinstance(name, str):
            raise TypeError(f"{what} must name budgets by str, got {name!r}")
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"{what} must return int counts, got {count!r} for {name!r}")
        if count < 0:
            raise ValueError(f"{what} must return whole counts >= 0 by budget name, got {costs!r}")
    return dict(costs)


class _Budget:
    """One budget of a key, as this process sees it."""

    __slots__ = ("left", "limit", "out", "refilled", "reset_at", "window")

    def __init__(self) -> None:
        self.limit = 0
        self.left = 0  # what the server has left, less what was charged since it said so
        self.out = 0  # charged to requests still out
        self.reset_at: int | None = None  # ns of the clock: full again then
        self.refilled = 0  # when it last filled (ns of the clock)
        self.window = 0  # ns the server takes to refill all of it (0: not said yet)

    def due(self, now: int) -> int:
        """When it is next full (ns of the clock)."""
        if self.reset_at is not None:
            return self.reset_at
        return max(now, self.refilled + (self.window or _NO_WINDOW))

    def refresh(self, now: int) -> None:
        if self.reset_at is not None:
            if now < self.reset_at:
                return
            self.reset_at = None
        elif now < self.refilled + (self.window or _NO_WINDOW) or self.left >= self.limit:
            return
        self.left, self.refilled = self.limit, now


class _Account:
    """A key's budgets, and the pause its server asked for."""

    __slots__ = ("budgets", "lock", "paused_until")

    def __init__(self) -> None:
        self.budgets: dict[str, _Budget] = {}
        self.lock = threading.Lock()
        self.paused_until = 0


class Charge(NamedTuple):
    """What `Ledger.claim` charged a request: its key's account, and its cost per budget."""

    account: _Account
    costs: dict[str, int]


_charge = tuple.__new__  # a Charge from its fields, without NamedTuple's Python __new__


def _due(account: _Account, costs: Mapping[str, int], now: int) -> int:
    """Under *account*'s lock: when (ns of the clock) a request of *costs* may be charged
    (at most *now*: at once): the pause's end, or the latest reset among the budgets
    without room (a budget *costs* does not name costs one unit)."""
    due = account.paused_until
    for name, budget in account.budgets.items():
        budget.refresh(now)
        need = costs.get(name, 1)
        if need > budget.left and budget.left < budget.limit:
            due = max(due, budget.due(now))
    return due


class Ledger:
    """A key's budgets as its server announces them; see the module.

    >>> now = [0]
    >>> ledger = Ledger(clock=lambda: now[0])
    >>> wait, charge = ledger.claim("api", {"tokens": 500})   # nothing announced yet: it goes
    >>> ledger.answered(charge, 200, {"x-ratelimit-limit-tokens": "600",
    ...     "x-ratelimit-remaining-tokens": "100", "x-ratelimit-reset-tokens": "2s"}.get)
    >>> ledger.claim("api", {"tokens": 200})   # 100 left until the reset, 2 s on
    (2000000000, None)
    """

    def __init__(
        self,
        *,
        clock: Clock,
        estimate: Callable[[Any], Mapping[str, int]] | None = None,
        settle: Callable[[Any], Any] | None = None,
        max_keys: int = 1024,
        wall_clock: Callable[[], int] = time.time_ns,
    ) -> None:
        for name, value in (("estimate", estimate), ("settle", settle)):
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be a callable, not {value!r}")
        self.clock = clock
        self.estimate = estimate
        self.settle = settle
        self.max_keys = max_keys
        self.wall_clock = wall_clock
        self._accounts: OrderedDict[Hashable, _Account] = OrderedDict()
        # No budget announced and no pause heard yet, so every key is `idle`: what the
        # adapters look at first (an attribute, not a call) on every request of a
        # client that no answer has told of a budget or a pause.
        self.unannounced = True
        self._last: _Account | None = None  # the account `_account` last moved to the end
        self._lock = threading.Lock()

    def _account(self, key: Hashable) -> _Account:
        account = self._accounts.get(key)  # one C call: no lock needed to read
        if account is not None and account is self._last:
            return account  # already the most recently used (or nearly, threads racing)
        with self._lock:
            account = self._accounts.get(key)
            if account is None:
                if len(self._accounts) >= self.max_keys:
                    self._accounts.popitem(last=False)
                account = self._accounts[key] = _Account()
            else:
                self._accounts.move_to_end(key)
            self._last = account
            return account

    def idle(self, key: Hashable) -> bool:
        """Whether *key* has no budget announced and was never paused: a request of it
        with no estimate is charged nothing (`heard` learns from its answer).

        >>> ledger = Ledger(clock=lambda: 0)
        >>> ledger.idle("api"), ledger.unannounced
        (True, True)
        >>> ledger.heard("api", 200, {"x-ratelimit-limit-requests": "60",
        ...     "x-ratelimit-remaining-requests": "59", "x-ratelimit-reset-requests": "1s"}.get)
        >>> ledger.idle("api"), ledger.idle("other"), ledger.unannounced
        (False, True, False)
        """
        account = self._accounts.get(key)  # one C call: no lock needed to read
        return account is None or not (account.budgets or account.paused_until)

    def heard(
        self, key: Hashable, status: int, get: Get, budgets: dict[str, Budget] | None = None
    ) -> None:
        """Learn from an answer (its *status*, its headers by *get*, its *budgets* if read
        already) to a request of *key* that was charged nothing (see `idle`)."""
        self.answered(_charge(Charge, (self._account(key), {})), status, get, None, budgets)

    def costs(self, request: Any) -> dict[str, int]:
        """*request*'s estimated cost per budget (none without an *estimate*)."""
        if self.estimate is None:
            return {}
        return validated_costs(self.estimate(request), "estimate")

    def claim(self, key: Hashable, costs: Mapping[str, int]) -> tuple[int, Charge | None]:
        """Charge a request of *costs* to *key*'s budgets now: ``(0, charge)``; or, when a
        budget lacks room or the key is paused, ``(ns to wait, None)`` with nothing
        charged. A budget *costs* does not name costs one unit; one a request needs
        more of than its limit lets it go when full."""
        account = self._account(key)
        if not costs and not account.budgets and not account.paused_until:
            # Nothing announced, nothing estimated: no lock (and no NamedTuple __new__).
            return 0, _charge(Charge, (account, {}))
        with account.lock:
            now = self.clock()
            charged: dict[str, int] = {}
            if account.paused_until <= now:
                # Each budget charged as it is found to have room (`_due`'s test, one pass):
                # the first without room gives back what was charged before it.
                for name, budget in account.budgets.items():
                    budget.refresh(now)
                    need = charged[name] = costs.get(name, 1)
                    if need > budget.left and budget.left < budget.limit:
                        del charged[name]
                        for given, back in charged.items():
                            account.budgets[given].left += back
                            account.budgets[given].out -= back
                        break
                    budget.left -= need
                    budget.out += need
                else:
                    # What the estimate said of budgets not announced yet, for settle's
                    # difference.
                    for name, need in costs.items():
                        charged.setdefault(name, need)
                    return 0, _charge(Charge, (account, charged))
            # Past *now*: a budget without room is full again only later (`_Budget.due`).
            return min(_due(account, costs, now) - now, _MAX_WAIT_NS), None

    def waiting(self, key: Hashable) -> int:
        """ns until a request of *key* with no estimate (one unit of every budget) may be
        charged: its pause, or the latest reset among the budgets with no room; 0 now.

        >>> ledger = Ledger(clock=lambda: 0)
        >>> ledger.waiting("api")
        0
        >>> ledger.heard("api", 200, {"x-ratelimit-limit-requests": "60",
        ...     "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s"}.get)
        >>> ledger.waiting("api")
        1500000000
        """
        account = self._accounts.get(key)  # one C call: no lock needed to read
        if account is None:
            return 0
        with account.lock:
            now = self.clock()
            return min(max(_due(account, {}, now) - now, 0), _MAX_WAIT_NS)

    def failed(self, charge: Charge) -> None:
        """The request of *charge* got no answer: what it was charged goes back."""
        account = charge.account
        with account.lock:
            for name, cost in charge.costs.items():
                budget = account.budgets.get(name)
                if budget is not None:
                    budget.out = max(0, budget.out - cost)
                    budget.left = min(budget.limit, budget.left + cost)

    def answered(
        self,
        charge: Charge,
        status: int,
        get: Get,
        spent: Mapping[str, int] | None = None,
        budgets: dict[str, Budget] | None = None,
    ) -> None:
        """Learn from the answer to *charge*'s request (its *status*, its headers by *get*,
        the *budgets* they announce if an adapter read them already, as `parse_budgets`
        does), and settle what it *spent* (by budget) against what it was charged. Only
        a 429 or a 503 pauses the key."""
        account = charge.account
        if budgets is not None:
            announced = budgets
        elif (
            not charge.costs
            and not spent
            and status not in {429, 503}
            and all(get(name) is None for name in _ANNOUNCING)
        ):
            return  # charged nothing, and learns nothing
        else:
            announced = parse_budgets(get, self.wall_clock)
        pause = parse_pause(get, self.wall_clock) if status in {429, 503} else None
        with account.lock:
            now = self.clock()
            kept = account.budgets
            for name, cost in charge.costs.items():
                budget = kept.get(name)
                if budget is not None:
                    out = budget.out - cost
                    budget.out = out if out > 0 else 0
            for name, (limit, remaining, reset_ns) in announced.items():
                budget = kept.get(name)
                if budget is None:
                    self.unannounced = False  # before the budget is there: never too late
                    budget = kept[name] = _Budget()
                budget.limit = limit
                # The server's word, less what the requests still out were charged:
                # some may be in it already, which errs on the side of waiting.
                budget.left = remaining - budget.out
                budget.refilled = now
                if remaining < limit and reset_ns:
                    budget.reset_at = now + reset_ns
                    budget.window = min(-(-reset_ns * limit // (limit - remaining)), _MAX_WAIT_NS)
                else:
                    budget.reset_at = None
            for name, used in (spent or {}).items():
                budget = kept.get(name)
                if budget is not None and name not in announced and name in charge.costs:
                    budget.left = min(budget.limit, budget.left + charge.costs[name] - used)
            if pause is not None and now + pause > account.paused_until:
                self.unannounced = False
                account.paused_until = now + pause

    def wait(
        self,
        key: Hashable,
        costs: Mapping[str, int],
        deadline: int | None,
        sleep: Callable[[float], object],
    ) -> Charge:
        """`claim`, sleeping (*sleep*, seconds) until it charges; past *deadline* (ns of
        the clock) raises `WaitTooLong` with nothing charged."""
        while True:
            wait, charge = self.claim(key, costs)
            if charge is not None:
                return charge
            self._check(key, wait, deadline)
            sleep(wait / NS_PER_S)

    async def wait_async(
        self,
        key: Hashable,
        costs: Mapping[str, int],
        deadline: int | None,
        sleep: Callable[[float], Any],
    ) -> Charge:
        """`wait` for asyncio: *sleep* is awaited."""
        while True:
            wait, charge = self.claim(key, costs)
            if charge is not None:
                return charge
            self._check(key, wait, deadline)
            await sleep(wait / NS_PER_S)

    def _check(self, key: Hashable, wait: int, deadline: int | None) -> None:
        if deadline is not None and self.clock() + wait > deadline:
            raise WaitTooLong(
                f"a budget of {key!r} has no room for {wait / NS_PER_S:.3f} s", key, wait
            )

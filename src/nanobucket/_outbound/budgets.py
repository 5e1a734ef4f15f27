"""Pacing an API by several budgets at once: requests and tokens per minute, as LLM
providers announce them on every answer.

Two header families are read (`parse_budgets`), each into a `Budget` (limit,
remaining, ns until its reset) per budget name (`BUDGETS`):

* OpenAI-style ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, the
  reset a Go duration (``1s``, ``6m0s``, ``12ms``, ``1h2m3.5s``:
  `parse_go_duration`);
* Anthropic-style ``anthropic-ratelimit-{requests,tokens,input-tokens,
  output-tokens}-{limit,remaining,reset}``, the reset an RFC 3339 time
  (`parse_rfc3339`), read against the answer's ``Date`` (the server's clock),
  else this machine's;
* ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date), on a 429
  or a 503: no request to the key leaves before it ends.

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

import calendar
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from fractions import Fraction
from typing import Any, NamedTuple

from .._core._params import NS_PER_S, Clock
from .fields import MAX_WAIT_S, Get, _wall_now, parse_retry_after
from .pacer import WaitTooLong

__all__ = (
    "BUDGETS",
    "Budget",
    "Charge",
    "Ledger",
    "parse_budgets",
    "parse_go_duration",
    "parse_rfc3339",
    "validated_costs",
)

#: The budgets a provider announces, by the names an estimate and a settle use.
BUDGETS = ("requests", "tokens", "input-tokens", "output-tokens")
_OPENAI = ("requests", "tokens")  # x-ratelimit-*-requests, x-ratelimit-*-tokens
_MAX_WAIT_NS = MAX_WAIT_S * NS_PER_S
_MAX_TEXT = 64  # longer values are not read
_NO_WINDOW = NS_PER_S  # a refill's period before any answer said one (a second)

_GO_UNIT = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": NS_PER_S}
_GO_UNIT |= {"m": 60 * NS_PER_S, "h": 3600 * NS_PER_S}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(\.\d{1,9})?([Zz]|[+-]\d\d:\d\d)\Z"
)


class Budget(NamedTuple):
    """One budget as an answer announces it: its limit, what is left, and ns until reset."""

    limit: int
    remaining: int
    reset_ns: int


def parse_go_duration(text: str) -> int | None:
    """A Go duration (``1h2m3.5s``, ``6m0s``, ``12ms``, ``0``) in ns, rounded up, at most
    a day; None if it is not one (or is negative).

    >>> parse_go_duration("6m0s"), parse_go_duration("12ms"), parse_go_duration("1h2m3.5s")
    (360000000000, 12000000, 3723500000000)
    >>> parse_go_duration("1.5us"), parse_go_duration("0"), parse_go_duration("-1s")
    (1500, 0, None)
    """
    text = text.strip()
    if text == "0":
        return 0
    if not text or len(text) > _MAX_TEXT:
        return None
    total = Fraction(0)
    at = 0
    for match in _GO_PART.finditer(text):
        if match.start() != at:
            return None
        at = match.end()
        total += Fraction(match[1]) * _GO_UNIT[match[2]]
    if at != len(text) or at == 0:
        return None
    return min(math.ceil(total), _MAX_WAIT_NS)


def parse_rfc3339(text: str) -> int | None:
    """An RFC 3339 time (``2026-12-06T19:00:30.5Z``, ``...+02:00``) in ns since the Unix
    epoch, exact to the ns written; None if it is not one.

    >>> parse_rfc3339("1970-01-01T00:00:01.25Z"), parse_rfc3339("1970-01-01T02:00:00+02:00")
    (1250000000, 0)
    >>> parse_rfc3339("yesterday") is None
    True
    """
    match = _RFC3339.match(text.strip()) if len(text) <= _MAX_TEXT else None
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        whole = calendar.timegm((year, month, day, hour, minute, min(second, 59), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        return None
    if hour > 23 or minute > 59 or second > 60:
        return None
    zone = match[8]
    if zone not in {"Z", "z"}:
        sign = -1 if zone[0] == "+" else 1  # +02:00 is two hours ahead of UTC
        whole += sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    fraction = int((match[7] or ".")[1:].ljust(9, "0"))
    return (whole + (second == 60)) * NS_PER_S + fraction


def _count(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit() or not text.isascii() or len(text) > 18:
        return None
    return int(text)


def parse_budgets(get: Get, wall_ns: int | None = None) -> dict[str, Budget]:
    """The budgets an answer announces (by name of `BUDGETS`); a budget whose limit,
    remaining or reset is missing or does not parse is left out. *wall_ns* is the
    server's time of the answer in ns since the epoch (default: its ``Date``, else
    this machine's clock), against which an RFC 3339 reset is read.

    >>> parse_budgets({"x-ratelimit-limit-tokens": "600", "x-ratelimit-remaining-tokens": "0",
    ...                "x-ratelimit-reset-tokens": "1.5s"}.get)
    {'tokens': Budget(limit=600, remaining=0, reset_ns=1500000000)}
    >>> parse_budgets({"anthropic-ratelimit-requests-limit": "50",
    ...                "anthropic-ratelimit-requests-remaining": "49",
    ...                "anthropic-ratelimit-requests-reset": "1970-01-01T00:00:02Z"}.get, 0)
    {'requests': Budget(limit=50, remaining=49, reset_ns=2000000000)}
    """
    found: dict[str, Budget] = {}
    for name in _OPENAI:
        limit = _count(get(f"x-ratelimit-limit-{name}"))
        remaining = _count(get(f"x-ratelimit-remaining-{name}"))
        reset = get(f"x-ratelimit-reset-{name}")
        if limit is None or remaining is None or reset is None:
            continue
        reset_ns = parse_go_duration(reset)
        if reset_ns is not None:
            found[name] = Budget(limit, min(remaining, limit), reset_ns)
    for name in BUDGETS:
        limit = _count(get(f"anthropic-ratelimit-{name}-limit"))
        remaining = _count(get(f"anthropic-ratelimit-{name}-remaining"))
        reset = get(f"anthropic-ratelimit-{name}-reset")
        if limit is None or remaining is None or reset is None:
            continue
        at = parse_rfc3339(reset)
        if at is None:
            continue
        if wall_ns is None:
            wall_ns = int(Fraction(_wall_now(get)) * NS_PER_S)
        reset_ns = min(max(at - wall_ns, 0), _MAX_WAIT_NS)
        found[name] = Budget(limit, min(remaining, limit), reset_ns)
    return found


def parse_pause(get: Get) -> int | None:
    """``retry-after-ms``, else ``retry-after``, in ns from now (at most a day); else None.

    >>> parse_pause({"retry-after-ms": "250", "retry-after": "1"}.get)
    250000000
    >>> parse_pause({"retry-after": "2"}.get), parse_pause({}.get)
    (2000000000, None)
    """
    text = get("retry-after-ms")
    if text is not None and len(text) <= _MAX_TEXT:
        try:
            ms = Fraction(text.strip())
        except (ValueError, ZeroDivisionError):
            ms = None
        if ms is not None and ms >= 0:
            return min(math.ceil(ms * 10**6), _MAX_WAIT_NS)
    return parse_retry_after(get)


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
        wall: Callable[[], int] | None = None,
    ) -> None:
        for name, value in (("estimate", estimate), ("settle", settle)):
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be a callable, not {value!r}")
        self.clock = clock
        self.estimate = estimate
        self.settle = settle
        self.max_keys = max_keys
        self._wall = wall
        self._accounts: OrderedDict[Hashable, _Account] = OrderedDict()
        self._lock = threading.Lock()

    def _account(self, key: Hashable) -> _Account:
        with self._lock:
            account = self._accounts.get(key)
            if account is None:
                if len(self._accounts) >= self.max_keys:
                    self._accounts.popitem(last=False)
                account = self._accounts[key] = _Account()
            else:
                self._accounts.move_to_end(key)
            return account

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
        with account.lock:
            now = self.clock()
            due = account.paused_until
            for name, budget in account.budgets.items():
                budget.refresh(now)
                need = costs.get(name, 1)
                if need > budget.left and budget.left < budget.limit:
                    due = max(due, budget.due(now))
            if due > now:
                return min(due - now, _MAX_WAIT_NS), None
            charged = {}
            for name, budget in account.budgets.items():
                need = charged[name] = costs.get(name, 1)
                budget.left -= need
                budget.out += need
            # What the estimate said of budgets not announced yet, for settle's difference.
            for name, need in costs.items():
                charged.setdefault(name, need)
            return 0, Charge(account, charged)

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
        self, charge: Charge, status: int, get: Get, spent: Mapping[str, int] | None = None
    ) -> None:
        """Learn from the answer to *charge*'s request (its *status*, its headers by *get*),
        and settle what it *spent* (by budget) against what it was charged. Only a 429
        or a 503 pauses the key."""
        account = charge.account
        announced = parse_budgets(get, None if self._wall is None else self._wall())
        pause = parse_pause(get) if status in {429, 503} else None
        with account.lock:
            now = self.clock()
            budgets = account.budgets
            for name, cost in charge.costs.items():
                budget = budgets.get(name)
                if budget is not None:
                    budget.out = max(0, budget.out - cost)
            for name, (limit, remaining, reset_ns) in announced.items():
                budget = budgets.get(name)
                if budget is None:
                    budget = budgets[name] = _Budget()
                budget.limit = limit
                # The server's word, less what the requests still out were charged:
                # some may be in it already, which errs on the side of waiting.
                budget.left = remaining - budget.out
                budget.refilled = now
                budget.reset_at = now + reset_ns if remaining < limit and reset_ns else None
                if remaining < limit and reset_ns:
                    budget.window = min(-(-reset_ns * limit // (limit - remaining)), _MAX_WAIT_NS)
            for name, used in (spent or {}).items():
                budget = budgets.get(name)
                if budget is not None and name not in announced and name in charge.costs:
                    budget.left = min(budget.limit, budget.left + charge.costs[name] - used)
            if pause is not None and now + pause > account.paused_until:
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

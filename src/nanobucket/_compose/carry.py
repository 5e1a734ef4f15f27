"""Moving a key between the plans of a `tiered` limiter without gaining a token.

A move is written once, as a generator of the calls it makes (`_drive`):
the sync limiter drives it, the asyncio one awaits each call. See `_carry`
for the bound it keeps and how.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Generator, Hashable
from fractions import Fraction
from typing import Any

from .drive import Call

__all__ = ("Owed", "Unread", "carry", "settle")

# Decisions that are not the stored bucket's (the Redis limiters' failure path).
_NOT_STORED = frozenset({"fallback", "policy:open", "policy:closed"})
_TRIES = 8  # charges of a move that a concurrent spender may make fail
# What a tiered limiter knows of a key beyond its plan, while that is not what a
# key served on that plan alone would have: see `carry`.
Owed = tuple[int, int, Fraction]


def _peek(plan: Any, key: Hashable, now: int | None) -> Call:
    return (plan.peek, (key, 0)) if now is None else (plan.peek_at, (key, now, 0))


def _stored(decision: Any) -> bool:
    return getattr(decision, "source", None) not in _NOT_STORED


def _tokens(plan: Any, decision: Any) -> Fraction:
    """The exact tokens *plan*'s bucket holds, as a decision of it shows them."""
    interval: int = plan.interval_ns
    return Fraction(plan.capacity * interval - decision.reset_after_ns, interval)


class Unread(Exception):
    """A plan could not be read (Redis down: a fallback or policy decision)."""


def _read(plan: Any, key: Hashable, now: int | None) -> Generator[Call, Any, Any]:
    d = yield _peek(plan, key, now)
    if not _stored(d):
        raise Unread
    return d


def _charge_down(
    plan: Any, key: Hashable, now: int | None, most: Fraction
) -> Generator[Call, Any, Fraction]:
    """Charge *key*'s bucket of *plan* until it holds at most *most* (>= 0) tokens; what
    it holds then. A fraction of a token is charged as a whole one, which the bucket
    owes (a reservation of less than one interval's wait), so the move is exact."""
    tokens = Fraction(0)
    for _ in range(_TRIES):
        tokens = _tokens(plan, (yield from _read(plan, key, now)))
        charge = math.ceil(tokens - most)
        if charge <= 0:
            return tokens
        reserve = functools.partial(
            plan.reserve, key, cost=charge, max_wait_ns=plan.interval_ns, now=now
        )
        if (yield reserve, ()) >= 0:
            return tokens - charge
    return tokens  # spent meanwhile by others each time: it holds less than this now


def _least(plan: Any, tokens: Fraction, owed: Owed | None) -> Fraction:
    """The fewest tokens the key's model bucket (see `carry`) can hold, given the
    *tokens* of its bucket of *plan*, the plan it is on, and what is known (*owed*)."""
    if owed is not None:
        low, _, gap = owed
        tokens += min(gap, low - plan.capacity)
    return max(tokens, Fraction(0))  # a bucket owing a fraction (see `_charge_down`)


def carry(
    key: Hashable,
    now: int | None,
    plan: Any,
    left: Any | None,
    owed: Owed | None,
    others: list[Any],
    largest: int,
) -> Generator[Call, Any, Owed | None]:
    """The move of *key* onto *plan*, as the calls it makes (the driver calls or
    awaits each and sends back its result); what is then known of the key (None:
    what a key served on *plan* alone would have). Raises `Unread` when a plan
    could not be read (nothing charged; the move is tried again later).

    *left* is the plan the key leaves and *owed* what was known of it there.
    A key not known (*left* None) is carried from every plan in *others*.

    The bound kept: the key is admitted no more than one bucket would admit
    it, a model of the capacity of the largest plan it was served on and the
    rate of the fastest, fed every request the key is admitted. Its bucket
    of the plan it is on never holds more than the model; a move charges the
    plan it comes to down to the least the model can hold. That least is the
    bucket left's tokens plus a *gap*: the model's lead over the bucket,
    which only grows while the key stays on one plan (the model refills at
    least as fast) but to the model's capacity less the bucket's. So *owed*
    is ``(low, high, gap)``: bounds of the model's capacity (the largest
    plan the key was served on; a forgotten key's is known only to be
    between the plan it comes back to and the largest plan of all) and the
    gap when it came to its plan. A move to a plan above ``high`` grows the
    model by the difference. A key that moved down with more spent than its
    new plan holds keeps its debt in *owed*, and is not forgotten without it
    (`settle`).
    """
    capacity = plan.capacity
    if left is None:
        spent = 0
        for source in others:
            d = yield from _read(source, key, now)
            spent = max(spent, source.capacity - d.remaining)
        target = Fraction(capacity - min(capacity, spent))
        tokens = yield from _charge_down(plan, key, now, target)
        if not spent and tokens == capacity:
            return None  # full in every plan: new, or as good as new
        return None if capacity == largest else (capacity, largest, target - tokens)
    d = yield from _read(left, key, now)
    low, high, _ = owed if owed is not None else (left.capacity, left.capacity, 0)
    least = _least(left, _tokens(left, d), owed)
    if capacity > high:  # a larger plan than the model's: it grows by the difference
        least += capacity - high
    low, high = max(low, capacity), max(high, capacity)
    spent = left.capacity - d.remaining  # whole tokens: a fraction refilled counts as spent
    tokens = yield from _charge_down(
        plan, key, now, min(Fraction(capacity - min(capacity, spent)), least)
    )
    gap = least - tokens
    return None if low == high and gap >= low - capacity else (low, high, gap)


def settle(
    forgotten: list[tuple[Hashable, Any, Owed]], largest: Any, now: int | None
) -> Generator[Call, Any, None]:
    """Before keys known to owe more than their bucket shows are forgotten, charge
    their bucket of the *largest* plan down to the least their model holds: a key
    not known is carried from it (keys whose plan cannot be read go as they are)."""
    for key, plan, owed in forgotten:
        if plan is largest:
            continue  # its bucket is the model's least already
        try:
            least = _least(plan, _tokens(plan, (yield from _read(plan, key, now))), owed)
            yield from _charge_down(largest, key, now, least)
        except Unread:
            continue

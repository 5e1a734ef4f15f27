"""Charging after the response: the integrations' ``charge=`` (a cost known only at the end).

``charge(request, status) -> int`` runs once the handler has answered an
admitted request and returns the request's real cost. The up-front ``cost``
was taken when the request was admitted; the difference is settled now:

* more: the extra tokens are debited at once, even from a bucket that holds
  fewer (it goes into debt, and refuses until it has refilled past it). The
  request was served already, so it cannot be refused; what it used is not
  forgotten either. Each request can owe at most ``capacity`` in all, so
  the debt is bounded by what the requests in flight together were charged.
* less: the difference is refunded (never above capacity).
* equal: nothing happens.

A request that was refused (429, or shadow-limited) is never charged. A
*charge* that raises, returns something other than an int >= 0, or a
backend that fails while settling is logged (logger ``"nanobucket"``) and
the up-front charge stands: the response is never broken by its accounting.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable
from typing import Any

from .._compose.hooks import logger
from .._core._limiter import Refundable, Reservable

# No wait bound for a debit: the request already ran, its tokens are owed.
# (2**62 ns is 146 years: within every backend's range, Redis's us included.)
_FOREVER = 1 << 62

Charge = Callable[[Any, int], int]


class Settler:
    """The refund and debit verbs of one limiter, for settling a final cost."""

    __slots__ = ("awaited", "capacity", "debit", "refund")

    def __init__(self, limiter: object, keyed: bool, capacity: int | None) -> None:
        if not isinstance(limiter, Reservable) or not isinstance(limiter, Refundable):
            raise TypeError(
                f"charge= needs a limiter that can refund and debit tokens; "
                f"{type(limiter).__name__} cannot"
            )
        refund, reserve = limiter.refund, limiter.reserve
        self.capacity = capacity
        self.awaited = inspect.iscoroutinefunction(reserve)
        if keyed:
            self.refund: Callable[[Hashable, int], Any] = refund
            self.debit: Callable[[Hashable, int], Any] = lambda key, n: reserve(
                key, cost=n, max_wait_ns=_FOREVER
            )
        else:
            self.refund = lambda key, n: refund(n)
            self.debit = lambda key, n: reserve(cost=n, max_wait_ns=_FOREVER)

    def delta(self, charge: Charge, request: Any, status: int, cost: int) -> int:
        """The final cost less the up-front *cost*; 0 (logged) when *charge* fails."""
        try:
            final = charge(request, status)
        except Exception:
            logger.exception("nanobucket: charge= raised; the up-front cost %d stands", cost)
            return 0
        if isinstance(final, bool) or not isinstance(final, int) or final < 0:
            logger.error("nanobucket: charge= returned %r, not an int >= 0; %d stands", final, cost)
            return 0
        if self.capacity is not None and final > self.capacity:
            final = self.capacity  # the most one request can cost
        return final - cost

    def settle(self, charge: Charge, key: Hashable, cost: int, request: Any, status: int) -> None:
        """Debit or refund the difference between the final and the up-front cost."""
        delta = self.delta(charge, request, status, cost)
        try:
            if delta > 0:
                self.debit(key, delta)
            elif delta < 0:
                self.refund(key, -delta)
        except Exception:
            logger.exception("nanobucket: settling a charge of %+d for %r failed", delta, key)

    async def settle_async(
        self, charge: Charge, key: Hashable, cost: int, request: Any, status: int
    ) -> None:
        """`settle`, awaiting an asyncio limiter's verbs."""
        delta = self.delta(charge, request, status, cost)
        try:
            if delta > 0:
                result = self.debit(key, delta)
            elif delta < 0:
                result = self.refund(key, -delta)
            else:
                return
            if self.awaited:
                await result
        except Exception:
            logger.exception("nanobucket: settling a charge of %+d for %r failed", delta, key)


class Due:
    """What an admitted request owes once answered: its up-front *cost*, to settle
    against ``charge(request, status)`` with its limiter's `Settler`."""

    __slots__ = ("charge", "cost", "key", "settler")

    def __init__(self, charge: Charge, settler: Settler, key: Hashable, cost: int) -> None:
        self.charge = charge
        self.settler = settler
        self.key = key
        self.cost = cost

    def settle(self, request: Any, status: int) -> None:
        """Debit or refund the difference (a synchronous limiter)."""
        self.settler.settle(self.charge, self.key, self.cost, request, status)

    async def settle_async(self, request: Any, status: int) -> None:
        """`settle`, awaiting an asyncio limiter's verbs."""
        if self.settler.awaited:
            await self.settler.settle_async(self.charge, self.key, self.cost, request, status)
        else:
            self.settler.settle(self.charge, self.key, self.cost, request, status)


def check_charge(charge: object) -> Charge | None:
    """Validate ``charge=``: None, or a callable ``(request, status) -> int``."""
    if charge is not None and not callable(charge):
        raise TypeError(f"charge must be a callable (request, status) -> int, not {charge!r}")
    return charge


def settlers(router: Any) -> dict[int, Settler]:
    """A `Settler` for each policy of a gate's router, by ``id(policy)``."""
    return {id(p): Settler(p.limiter, p.keyed, p.capacity) for p in router.policies()}

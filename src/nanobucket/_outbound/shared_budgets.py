"""Several processes spending one API's budgets as one client: each budget paced in the keyed
limiter they share (``shared=`` of the outbound adapters, with `nanobucket._outbound.budgets`).

A budget's server refills its *limit* in a *window* (what its answers say: the
time to refill what was spent, scaled to all of it), so one unit of it is worth
``window / limit`` of time. A request charged *c* units of a budget takes ``c *
window / limit`` of that time in the shared limiter (in its tokens, rounded up,
at most its capacity), under the key ``"<key>|budget:<name>"``, shaped: it
leaves when its slot starts in every budget it spends from, so the processes
together spend each budget no faster than its server refills it. A wait past
the timeout takes nothing (what was taken goes back). What *settle* says a
request really spent is given back (less) or owed (more) there too.

A budget no answer sized yet costs nothing shared: the first requests of each
process go at once, and the answers size it. Make the shared limiter fine and
deep: its interval small beside a unit's time, its capacity the burst the
processes may send at once (in its tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from .._core._limiter import is_async
from .._core._params import NS_PER_S, Clock
from .budgets import Charge
from .pacer import WaitTooLong

__all__ = ("SharedBudgets",)

Prices = list[tuple[str, int, int, int]]  # (shared key, shared tokens, window ns, limit)


class SharedBudgets:
    """The budgets of every key paced in *shared* too; see the module."""

    def __init__(self, shared: Any, clock: Clock) -> None:
        self.shared = shared
        self.clock = clock
        self.interval_ns: int = shared.interval_ns
        self.capacity: int = shared.capacity
        self.awaits = is_async(shared)

    def prices(self, key: Hashable, charge: Charge) -> Prices:
        """What *charge*'s request takes in the shared limiter, per budget sized so far."""
        prices: Prices = []
        account = charge.account
        with account.lock:
            for name, cost in charge.costs.items():
                budget = account.budgets.get(name)
                if budget is None or not budget.window or not budget.limit or not cost:
                    continue
                window, limit = budget.window, budget.limit
                tokens = -(-cost * window // (limit * self.interval_ns))
                prices.append((f"{key}|budget:{name}", min(tokens, self.capacity), window, limit))
        return prices

    def _left(self, deadline: int | None) -> int:
        return (1 << 62) if deadline is None else max(0, deadline - self.clock())

    def _refused(self, key: Hashable) -> WaitTooLong:
        return WaitTooLong(f"a budget of {key!r}, shared by every process, is spent", key, 0)

    def wait(
        self,
        key: Hashable,
        charge: Charge,
        deadline: int | None,
        sleep: Callable[[float], object],
    ) -> Prices:
        """Take the request's shared tokens in every budget, sleeping (the thread) until
        its slot starts in all of them: what it took; past *deadline*, `WaitTooLong`
        with nothing taken."""
        shared, prices = self.shared, self.prices(key, charge)
        taken: Prices = []
        try:
            longest = 0
            left = self._left(deadline)
            for price in prices:
                wait = shared.reserve(price[0], cost=price[1], max_wait_ns=left, shape=True)
                if wait < 0:
                    raise self._refused(key)
                taken.append(price)
                longest = max(longest, wait)
            if longest:
                sleep(longest / NS_PER_S)
        except BaseException:
            for skey, tokens, _, _ in taken:
                shared.refund(skey, tokens)  # not sent: the others may have them
            raise
        return taken

    async def wait_async(
        self,
        key: Hashable,
        charge: Charge,
        deadline: int | None,
        sleep: Callable[[float], Any],
    ) -> Prices:
        """`wait` in asyncio (a cancelled waiter gives its tokens back)."""
        shared, awaits, prices = self.shared, self.awaits, self.prices(key, charge)
        taken: Prices = []
        try:
            longest = 0
            left = self._left(deadline)
            for price in prices:
                wait = shared.reserve(price[0], cost=price[1], max_wait_ns=left, shape=True)
                if awaits:
                    wait = await wait
                if wait < 0:
                    raise self._refused(key)
                taken.append(price)
                longest = max(longest, wait)
            if longest:
                await sleep(longest / NS_PER_S)
        except BaseException:
            for skey, tokens, _, _ in taken:
                refunded = shared.refund(skey, tokens)
                if awaits:
                    await refunded
            raise
        return taken

    def _differences(
        self, charge: Charge, taken: Prices, spent: Mapping[str, int]
    ) -> list[tuple[str, int]]:
        """Per shared key, the tokens to give back (> 0) or to owe (< 0) once *spent* is known."""
        out = []
        for skey, tokens, window, limit in taken:
            name = skey.rpartition("|budget:")[2]
            if name in spent:
                used = -(-spent[name] * window // (limit * self.interval_ns))
                if used != tokens:
                    out.append((skey, tokens - min(used, self.capacity)))
        return out

    def settle(self, charge: Charge, taken: Prices, spent: Mapping[str, int]) -> None:
        """Give back what the request was charged past what it *spent*, or owe the rest."""
        shared = self.shared
        for skey, back in self._differences(charge, taken, spent):
            if back > 0:
                shared.refund(skey, back)
            else:
                shared.reserve(skey, cost=-back, max_wait_ns=1 << 62)  # owed: later ones wait

    async def settle_async(self, charge: Charge, taken: Prices, spent: Mapping[str, int]) -> None:
        """`settle` with a store that may be awaited."""
        shared = self.shared
        for skey, back in self._differences(charge, taken, spent):
            if back > 0:
                done = shared.refund(skey, back)
            else:
                done = shared.reserve(skey, cost=-back, max_wait_ns=1 << 62)
            if self.awaits:
                await done

"""Several processes calling one server as one client: an outbound key's pacing kept in a
keyed limiter they all use (``shared=`` of the outbound adapters).

Each process's `nanobucket._outbound.pacer.Pacer` learns from the answers it gets;
alone, N processes run at N times what each learned. With ``shared=`` a
keyed limiter every process reaches (`SharedKeyedTokenBucket` on one
machine, a Redis table across machines), what a process learns reaches the
others through that bucket:

* **Pacing.** A request that its process let go takes its key's tokens in
  the shared bucket, shaped (no burst across processes), and leaves when
  its slot there starts: no two processes' requests leave closer than the
  shared rate allows. A wait past the timeout sends nothing (the token its
  process gave it goes back).
* **The rate.** A key whose own bucket runs slower than the shared one
  (the server announced less, or your *rate* is lower) spends ``own
  interval / shared interval`` shared tokens per request, paid ahead in
  whole tokens (at most the shared capacity): together the processes keep
  the slowest rate any of them learned.
* **A rate no field announces.** Against ``X-RateLimit-*`` fields alone,
  what one process learns from its own answers misses the others'
  requests. There each request spends one shared token, and each process
  runs at its own share instead, which it moves by what the server has
  left, the same for every process (`nanobucket._outbound.pacer._probed`):
  their rates add up, and the sum follows the server, up and down. A
  warning is logged once.
* **A pause.** A ``Retry-After`` (or a window with nothing left until its
  reset) holds the shared bucket until the pause ends (in whole shared
  tokens, rounded up), so no process sends into it. Processes that heard
  the same pause at once may each add up to one shared capacity past its
  end; a pause longer than 64 shared capacities is held that long (the
  process that heard it holds all of it). The hold is best effort: a store
  that fails meanwhile is logged, and the answer still goes to the caller.

The shared bucket's own rate is the most all the processes together send.
Made at yours (the transport's), its tokens are small beside a learned
rate, which divides them finely; made at the server's limit, a learned rate
close to it costs a fraction of a token that each process pays ahead in
whole ones, so together they may send up to one request each over that
rate in a window.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Generator, Hashable
from typing import TYPE_CHECKING, Any

from .._compose.drive import Call, drive, drive_async
from .._compose.hooks import logger
from .._core._limiter import KeyedLimiter, Refundable, Reservable, is_async, traits
from .._core._params import NS_PER_S
from .pacer import WaitTooLong

if TYPE_CHECKING:
    from .pacer import Pacer, _Key

__all__ = ("SharedPace", "validated_shared")

HOLD_STEPS = 64  # reservations at most to hold a pause: a long one costs no more round trips


def validated_shared(shared: object, allow_async: bool) -> object:
    """*shared* if it is a keyed limiter that reserves and refunds (awaited only when
    *allow_async*), else ``TypeError``.

    >>> import nanobucket as nb
    >>> validated_shared(nb.KeyedTokenBucket(1, 1), False)
    KeyedTokenBucket(rate=1, capacity=1, max_keys=1000000)
    >>> validated_shared(nb.TokenBucket(1, 1), False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: shared must be a keyed limiter that reserves and refunds (...), not TokenBucket(...)
    """
    if not (
        isinstance(shared, KeyedLimiter)
        and isinstance(shared, Reservable)
        and isinstance(shared, Refundable)
        and traits(shared).keyed is True
        and isinstance(getattr(shared, "interval_ns", None), int)
        and traits(shared).capacity is not None
    ):
        raise TypeError(
            "shared must be a keyed limiter that reserves and refunds "
            f"(SharedKeyedTokenBucket, RedisTokenBucket), not {shared!r}"
        )
    if is_async(shared) and not allow_async:
        raise TypeError(
            f"shared {shared!r} is an asyncio limiter: give it to AsyncRateLimitedTransport, "
            "or give this adapter a synchronous one"
        )
    return shared


class SharedPace:
    """A `Pacer`'s keys paced in *shared* too; see the module."""

    def __init__(self, shared: Any, pacer: Pacer) -> None:
        self.shared = shared
        self.pacer = pacer
        pacer.probing = True  # its lower bounds miss the other processes' requests
        self.interval_ns: int = shared.interval_ns
        self.capacity: int = shared.capacity
        self.awaits = is_async(shared)
        # The sleeps the pacer's line uses: a test's, or the real ones.
        self.sleep: Callable[[float], object] = pacer.sleep or time.sleep
        self.async_sleep: Callable[[float], Any] = pacer.async_sleep or asyncio.sleep

    def steps(self, in_asyncio: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The wait and the hold a request's steps call (`nanobucket._compose.drive`): awaited
        ones *in_asyncio*."""
        return (self.wait_async, self.hold_async) if in_asyncio else (self.wait, self.hold)

    def cost(self, state: _Key, now: int) -> int:
        """The shared tokens *state*'s next request spends, sent at *now* (clock ns; under
        the key's lock): its price (its own interval, at least one shared token's),
        paid ahead in whole tokens, what was paid ahead a credit the next requests spend
        first, at most the shared capacity at once. In ns of the shared timeline: ints.

        When the price rises (a window learned), the requests sent within that window
        at the old price owe the difference: paid with the next request, the window
        that holds them holds no more than the new price allows."""
        unit = self.interval_ns
        # A probed rate is this process's share of the server's: its sum with the
        # others' is paced by the server's remaining, one token a request here.
        own = 0 if state.probe else state.interval
        price = own if own > unit else unit
        recent = state.shared_recent
        if price == unit == state.shared_price and not state.shared_carry:
            recent.append((now, price))  # the common case: one token, nothing owed
            return 1
        if price > state.shared_price and state.policy is not None and recent:
            horizon = now - state.policy[1] * NS_PER_S
            state.shared_carry -= sum(price - paid for sent, paid in recent if sent > horizon)
            for i, (sent, _) in enumerate(recent):
                recent[i] = (sent, price)
        state.shared_price = price
        extra = price - unit
        paid = min(max(-(-(extra - state.shared_carry) // unit), 0), self.capacity - 1)
        # A debt past one capacity is forgiven: a price over the capacity cannot be paid.
        state.shared_carry = max(state.shared_carry + paid * unit - extra, -self.capacity * unit)
        recent.append((now, price))
        return 1 + paid

    def _refused(self, key: Hashable, decision: Any) -> Exception:
        wait = max(int(decision.retry_after_ns), 0)
        return WaitTooLong(
            f"rate limit of {key!r}, shared by every process: the next request may start "
            f"in {wait / NS_PER_S:.3f} s; that is more than the timeout of "
            f"{self.pacer.timeout} s",
            key,
            wait,
        )

    def _priced(self, state: _Key, deadline: int | None) -> tuple[int, int]:
        """The shared cost of *state*'s request and the longest it may wait for it (ns)."""
        now = self.pacer.clock()
        with state.lock:
            cost = self.cost(state, now)
        return cost, (1 << 62) if deadline is None else max(0, deadline - now)

    def wait(self, state: _Key, key: Hashable, deadline: int | None) -> int:
        """Take *key*'s shared tokens (*state* its pacer's), sleeping (the thread) until
        they are due: how many; past *deadline* (clock ns), `WaitTooLong` with nothing
        taken."""
        cost, left = self._priced(state, deadline)
        shared = self.shared
        wait = shared.reserve(key, cost=cost, max_wait_ns=left, shape=True)
        if wait < 0:
            raise self._refused(key, shared.peek(key, cost))
        if wait:
            try:
                self.sleep(wait / NS_PER_S)
            except BaseException:
                shared.refund(key, cost)  # not sent: the others may have them
                raise
        return cost

    async def wait_async(self, state: _Key, key: Hashable, deadline: int | None) -> int:
        """`wait` in asyncio (a cancelled waiter gives its tokens back)."""
        cost, left = self._priced(state, deadline)
        shared, awaits = self.shared, self.awaits
        wait = shared.reserve(key, cost=cost, max_wait_ns=left, shape=True)
        if awaits:
            wait = await wait
        if wait < 0:
            decision = shared.peek(key, cost)
            raise self._refused(key, await decision if awaits else decision)
        if wait:
            try:
                await self.async_sleep(wait / NS_PER_S)
            except BaseException:
                refunded = shared.refund(key, cost)  # not sent: the others may have them
                if awaits:
                    await refunded
                raise
        return cost

    def hold(self, state: _Key, key: Hashable) -> None:
        """Hold *key*'s shared bucket empty until its own pause (*state*'s) ends, if any.

        Best effort: the answer that told of the pause is the caller's, so a store
        that fails here (Redis down, ``on_error="raise"``) is logged, never raised;
        this process keeps the pause, and the next request meets the store's error."""
        pause = max(0, state.paused_until - self.pacer.clock())
        if pause:
            try:
                drive(self._holding(key, pause))
            except Exception:
                _hold_failed(key)

    async def hold_async(self, state: _Key, key: Hashable) -> None:
        """`hold` in asyncio."""
        pause = max(0, state.paused_until - self.pacer.clock())
        if pause:
            steps = self._holding(key, pause)
            try:
                await drive_async(steps) if self.awaits else drive(steps)
            except Exception:
                _hold_failed(key)

    def _holding(self, key: Hashable, pause: int) -> Generator[Call, Any, None]:
        """The calls that leave *key*'s next shared slot *pause* ns away, or later: how far
        the bucket is from full (a peek), then reservations of at most its capacity, each
        of which says where the bucket stood (`HOLD_STEPS` at most)."""
        shared, interval, capacity = self.shared, self.interval_ns, self.capacity
        decision = yield shared.peek, (key, 0)  # cost 0: the bucket as it stands
        # A shaped reservation waits until the bucket is full (its tat): the pause is
        # held once the tat is pause ns away.
        short = pause - max(int(decision.reset_after_ns), 0)
        for _ in range(HOLD_STEPS):
            if short <= 0:
                return
            cost = min(capacity, -(-short // interval))
            reserve = functools.partial(shared.reserve, cost=cost, max_wait_ns=pause, shape=True)
            stood = yield reserve, (key,)
            if stood < 0:
                return  # held further already (another process heard it too)
            # Where the bucket stood counts another process's hold: racing ones stop
            # short of twice the pause.
            short = pause - stood - cost * interval


def _hold_failed(key: Hashable) -> None:
    logger.exception(
        "nanobucket: the shared limiter failed while holding %r's pause for every process; "
        "the answer goes to the caller",
        key,
    )

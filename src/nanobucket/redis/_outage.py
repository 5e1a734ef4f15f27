"""An outage as a limiter lives it: told once, and what its fallback admitted charged after.

While Redis cannot decide, a local limiter (the fallback) decides in each
process, and Redis never sees what it admits. On Redis's return a key
whose fallback admitted a burst would find its Redis bucket refilled
meanwhile and admit the burst again: each outage would add up to one
capacity to any window spanning it. So every request the fallback admits
is noted per key (`Outages.note`), and before its calls to a Redis that
answers again (`Outages.take`) the limiter charges each key's Redis bucket
with:

* the lesser of what the fallback admitted for the key since Redis last
  answered and what the fallback's bucket owes then (its capacity less its
  tokens). The fallback took up the key where Redis left it (see
  `_FailurePolicy._resume`), so in one process the charge leaves Redis's
  bucket as the fallback's is: the outage costs nothing, whatever its
  length and however many there are.
* as a forced consume that goes no further than empty (a lease "take" with
  no minimum, ``lua/lease.lua``): never into debt. Debt past empty is a
  reservation a request holds; here no request would, and with N processes
  each admitting its own limit through the outage, it would refuse a busy
  key for N - 1 capacities' worth of time after Redis came back, clients
  paying for an outage they did not cause. Empty is as far as one limit
  goes, so a window spanning outages admits what N local limits admitted
  during them plus ``capacity + rate * T`` for the rest, never one more
  capacity per outage.

Bounded: at most `MAX_KEYS` keys are noted per outage (one count and one
time each; the keys past them are not charged), and each call to Redis
carries the charges of at most `BATCH` keys first, in one pipelined round
trip, until none is left: a call waits for one round trip more, never for
the whole outage's (which, under the asyncio limiter's deadline, could fail
every probe). A charge Redis does not take stays noted for the next call.

Told: the first answer of the policy or the fallback in each outage (each
breaker's, from when it opens: a Redis Cluster node's) is logged as a warning on the
``"nanobucket"`` logger, and the charge on Redis's return as info; every
answer is counted by the metrics (``source`` and ``reason``).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Hashable
from typing import Any

from ._breaker import CircuitBreaker

__all__ = ("BATCH", "MAX_KEYS", "Charge", "Outages")

logger = logging.getLogger("nanobucket")

#: The most keys one outage charges (per breaker).
MAX_KEYS = 1 << 14
#: The most keys charged before one call (one pipelined round trip).
BATCH = 256

#: ``(key, tokens, now_ns)``: charge *key*'s bucket *tokens* at *now_ns* (None: Redis's time).
Charge = tuple[Hashable, int, "int | None"]


class Outages:
    """The outages of one limiter: told once each, and each key's fallback admissions noted."""

    __slots__ = ("_lock", "_told", "owed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Per breaker, the keys the fallback admitted since Redis last answered:
        #: ``[tokens, now_ns of the last one]`` each. Empty when nothing is owed.
        self.owed: dict[CircuitBreaker, dict[Hashable, list[Any]]] = {}
        self._told: dict[CircuitBreaker, int] = {}  # the outage last told, by its breaker

    def tell(self, breaker: CircuitBreaker, limiter: object, reason: str, answer: str) -> None:
        """Log that Redis cannot decide for *limiter*, once per outage of *breaker*: from
        the answer that finds the breaker open (a call that only waited too long behind
        others on a busy event loop is no outage)."""
        outage = breaker.recoveries  # the same until Redis answers again
        if self._told.get(breaker) == outage or breaker.state == "closed":
            return
        with self._lock:
            if self._told.get(breaker) == outage:
                return
            self._told[breaker] = outage
        logger.warning(
            "nanobucket: %r cannot decide in Redis (%s): %s until Redis answers again",
            limiter,
            reason,
            answer,
        )

    def note(self, breaker: CircuitBreaker, key: Hashable, cost: int, now_ns: int | None) -> None:
        """The fallback admitted *cost* tokens of *key* (at *now_ns*) while *breaker*'s Redis
        could not decide."""
        with self._lock:
            keys = self.owed.get(breaker)
            if keys is None:
                keys = self.owed[breaker] = {}
            entry = keys.get(key)
            if entry is not None:
                entry[0] += cost
                entry[1] = now_ns
            elif len(keys) < MAX_KEYS:
                keys[key] = [cost, now_ns]

    def take(self, breaker: CircuitBreaker, fallback: Any) -> list[Charge]:
        """The charges owed to *breaker*'s Redis of the `BATCH` keys noted first, no longer
        noted (see the module): each key's admissions, at most what *fallback*'s bucket
        owes when it last admitted."""
        with self._lock:
            keys = self.owed.get(breaker)
            if keys is None:
                return []
            if len(keys) <= BATCH:
                del self.owed[breaker]
            else:
                keys = {key: keys.pop(key) for key in list(itertools.islice(keys, BATCH))}
        charges: list[Charge] = []
        for key, (admitted, now_ns) in keys.items():
            d = fallback.peek(key, 0) if now_ns is None else fallback.peek_at(key, now_ns, 0)
            tokens = min(admitted, d.limit - d.remaining)
            if tokens > 0:
                charges.append((key, tokens, now_ns))
        return charges

    def restore(self, breaker: CircuitBreaker, charges: list[Charge]) -> None:
        """*charges* Redis did not take: noted again, for its next return."""
        for key, tokens, now_ns in charges:
            self.note(breaker, key, tokens, now_ns)

    @staticmethod
    def charged(limiter: object, charges: list[Charge]) -> None:
        """Log the charges Redis took on its return."""
        logger.info(
            "nanobucket: Redis decides again for %r; %d keys charged %d tokens the fallback "
            "admitted meanwhile",
            limiter,
            len(charges),
            sum(tokens for _, tokens, _ in charges),
        )

"""The leased limiter: a Redis-shared limit whose fast path spends leased tokens locally."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from .._compose.verbs import KeyedDecide
from .._core._params import (
    NS_PER_S,
    Clock,
    RateArg,
    clock_or_monotonic,
    exact_int,
    real_seconds,
    validated_max_keys,
    validated_now,
)
from . import _clients
from ._bounded import DEFAULT_SOCKET_TIMEOUT
from ._breaker import CircuitBreaker
from ._limits import EXPLICIT_TTL_SLACK_MS, NS_PER_US, drive, evalsha_pipeline
from ._policy import Fallback, Policy, RedisDecision
from ._sync import _SyncLimits

__all__ = ("LeasedTokenBucket",)


class _Lease:
    __slots__ = ("balance", "denied_full", "denied_need", "denied_until", "size", "taken_at")

    def __init__(self, size: int, taken_at: int) -> None:
        self.balance = 0
        self.size = size
        self.taken_at = taken_at
        # After Redis refused `denied_need` tokens, requests needing as many
        # are refused locally until `denied_until`: a rejected burst costs
        # one round trip, not one per request.
        self.denied_need = 0
        self.denied_until = 0
        self.denied_full = 0  # when Redis said the bucket would be full again


class LeasedTokenBucket(_SyncLimits, KeyedDecide[RedisDecision, bool]):
    """A Redis-shared limit whose fast path stays local, spending leased tokens.

    When a key's local balance cannot pay for a request, one round trip takes
    a lease of up to ``size`` tokens from the shared Redis bucket (the same
    GCRA state as :class:`RedisTokenBucket`, so both can share a prefix);
    requests then spend it in process with no network. ``size`` adapts per
    key: it doubles (up to ``max_lease``) when a lease lasted less than
    ``lease_period`` seconds and halves (down to ``min_lease``) when it
    lasted more than four. Unspent tokens go back to Redis on :meth:`close`.

    The bound. Every admitted token was taken from Redis first, so over a
    whole run the total admitted never exceeds ``capacity + rate * T``. Over
    a window that starts later, tokens leased *before* it can be spent in it:
    each instance holds at most ``max_lease - 1`` unspent tokens between
    requests, so N instances admit at most
    ``capacity + rate * T + N * (max_lease - 1)`` in any window of T seconds.
    That holds for any number of threads: one lease per key is in flight per
    instance at a time; threads that miss the local balance meanwhile wait for
    it (at most ``timeout``, then the failure policy decides) and spend from it.
    Round trips: about ``1000 / size`` per 1000 decisions on a busy key; a
    refusal from Redis is remembered locally until its ``retry_after``, so a
    rejected burst costs one round trip. Lease state is kept for at most
    ``max_keys`` keys; past that the oldest eighth is dropped and its unspent
    tokens forfeited (an under-admission, never an over-admission).
    `reconfigure` gives every lease back first (leased tokens were counted in
    the old terms) and caps ``min_lease`` and ``max_lease`` at the new capacity.
    A decision's ``remaining`` is this instance's lease balance. ``refund``
    gives tokens back to this instance's lease while it stays under
    ``max_lease`` unspent (the bound holds), the rest to Redis as
    `RedisTokenBucket.refund` does: False if a part for Redis was lost.

    >>> with LeasedTokenBucket(client, rate=1000, capacity=2000) as limiter:  # doctest: +SKIP
    ...     limiter.allow("alice")
    True

    >>> limiter = LeasedTokenBucket(redis.Redis(), rate=1000, capacity=2000)
    >>> limiter.max_lease, limiter.held("alice")   # capacity / 16 by default; none held yet
    (125, 0)
    >>> limiter.reconfigure(capacity=20, migrate=False); limiter.capacity, limiter.max_lease
    (20, 20)
    """

    def __init__(
        self,
        client: Any,  # redis-py or valkey-py, plain or cluster
        rate: RateArg,
        capacity: int | None = None,
        *,
        prefix: str = "nanobucket",
        min_lease: int = 1,
        max_lease: int | None = None,
        lease_period: float = 0.1,
        on_error: Policy = "local",
        fallback: Fallback | None = None,
        breaker: CircuitBreaker | None = None,
        clock: Clock | None = None,
        max_keys: int = 100_000,
        timeout: float = DEFAULT_SOCKET_TIMEOUT,
        none_key: bool = False,
    ) -> None:
        super().__init__(
            rate,
            capacity,
            prefix,
            on_error,
            fallback,
            breaker,
            timeout,
            none_key=none_key,
            clock=clock,
        )
        self._connect(client)
        self._script = self._give_script  # lua/lease.lua: take and give
        self._max_keys = validated_max_keys(max_keys)
        if max_lease is None:
            max_lease = max(1, self._capacity // 16)
        for name, value in (("min_lease", min_lease), ("max_lease", max_lease)):
            if not 1 <= exact_int(value, name) <= self._capacity:
                raise ValueError(f"{name} must be in [1, capacity={self._capacity}], got {value!r}")
        if min_lease > max_lease:
            raise ValueError(f"min_lease {min_lease} > max_lease {max_lease}")
        if not 0 < real_seconds(lease_period, "lease_period") < 86_400:
            raise ValueError(f"lease_period must be in (0, 86400) seconds, got {lease_period!r}")
        self._min_lease = min_lease
        self._max_lease = max_lease
        self._period_ns = int(lease_period * NS_PER_S)
        self._clock: Clock = clock_or_monotonic(clock)
        self._leases: dict[bytes, _Lease] = {}
        #: Keys whose lease a thread is taking now, with the event it sets when
        #: done (made by the first thread to wait: none on an uncontended key).
        self._in_flight: dict[bytes, threading.Event | None] = {}
        self._lock = threading.Lock()
        #: Round trips to Redis so far (leases taken, plus one per close).
        self.round_trips = 0

    @property
    def max_lease(self) -> int:
        """The most tokens one lease takes (the over-admission bound is instances x this).

        >>> LeasedTokenBucket(redis.Redis(), rate=1000, capacity=2000, max_lease=50).max_lease
        50
        """
        return self._max_lease

    def held(self, key: Hashable) -> int:
        """Tokens this instance holds for *key*: leased, not yet spent.

        >>> limiter = LeasedTokenBucket(redis.Redis(), rate=1000, capacity=2000)
        >>> limiter.held("alice")   # no lease taken yet
        0
        """
        lease = self._leases.get(self.key(key))
        return lease.balance if lease is not None else 0

    # The steps the verbs are derived from (`nanobucket._compose.verbs`): a lease never peeks.

    def _admit(self, key: Hashable, cost: object, now_ns: int | None) -> bool:
        rkey, cost = self.key(key), self._cost(cost)
        if now_ns is None:
            with self._lock:  # the fast path: no clock, no Decision object
                lease = self._leases.get(rkey)
                if lease is not None and lease.balance >= cost:
                    lease.balance -= cost
                    return True
        return self._leased(rkey, key, cost, now_ns).allowed

    def _decide(
        self, key: Hashable, cost: object, now_ns: int | None, consume: bool
    ) -> RedisDecision:
        return self._leased(self.key(key), key, self._cost(cost), now_ns)

    def _leased(self, rkey: bytes, key: Hashable, cost: int, now_ns: int | None) -> RedisDecision:
        wait_until = 0  # monotonic ns past which a waiter stops waiting for a lease in flight
        while True:
            t = self._clock() if now_ns is None else now_ns
            with self._lock:
                lease = self._leases.get(rkey)
                if lease is not None and lease.balance >= cost:
                    lease.balance -= cost
                    return RedisDecision(True, lease.balance, 0, 0, self._capacity, "lease")
                if cost == 0:
                    return RedisDecision(True, 0, 0, 0, self._capacity, "lease")
                if (
                    lease is not None
                    and lease.denied_need
                    and cost - lease.balance >= lease.denied_need
                    and lease.denied_until > t
                ):
                    # Redis's refusal, told for this request: more tokens, more intervals.
                    extra = (cost - lease.balance - lease.denied_need) * self._interval_ns
                    return RedisDecision(
                        False,
                        lease.balance,
                        lease.denied_until - t + extra,
                        max(lease.denied_full - t, 0),
                        self._capacity,
                        "lease",
                    )
                if rkey not in self._in_flight:
                    # This thread takes the key's lease; others wait for it.
                    self._in_flight[rkey] = None
                    size, need = self._lease_size(lease, cost, t)
                    break
                in_flight = self._in_flight[rkey]
                if in_flight is None:  # the first waiter makes the event
                    in_flight = self._in_flight[rkey] = threading.Event()
            # Another thread's lease of this key is in flight: one lease at a
            # time keeps the instance's unspent tokens under max_lease. Its
            # round trip is bounded by the timeout, and so is this wait.
            now = self._clock()
            if not wait_until:
                wait_until = now + int(self._timeout * NS_PER_S)
            if not in_flight.wait((wait_until - now) / NS_PER_S):
                err = RedisTimeoutError("timed out waiting for a lease in flight")
                return self._policy(key, cost, now_ns, True, err)
        try:
            return self._take(rkey, key, cost, now_ns, t, size, need)
        finally:
            with self._lock:
                waiters = self._in_flight.pop(rkey)
            if waiters is not None:
                waiters.set()

    def _lease_size(self, lease: _Lease | None, cost: int, t: int) -> tuple[int, int]:
        """(size of the next lease, tokens it must bring at least); called with the lock held."""
        if lease is None:
            return self._min_lease, cost
        elapsed = t - lease.taken_at
        size = lease.size
        if elapsed < self._period_ns:
            size = min(self._max_lease, size * 2)
        elif elapsed > 4 * self._period_ns:
            size = max(self._min_lease, size // 2)
        return size, cost - lease.balance

    def _take(
        self,
        rkey: bytes,
        key: Hashable,
        cost: int,
        now_ns: int | None,
        t: int,
        size: int,
        need: int,
    ) -> RedisDecision:
        # Called by the one thread taking *rkey*'s lease. The round trip runs
        # without the lock: other keys (and this one's balance) stay usable.
        now_arg: int | bytes = b"" if now_ns is None else now_ns // NS_PER_US
        args = (*self._head, b"take", max(size, need), need, now_arg, EXPLICIT_TTL_SLACK_MS)
        ok, reply = self._send(self._counted, self._script, (rkey,), args)
        if not ok:
            return self._policy(key, cost, now_ns, True, reply)
        granted, retry_us, reset_us = reply
        with self._lock:
            lease = self._leases.get(rkey)
            if lease is None:
                if len(self._leases) >= self._max_keys:
                    self._evict()
                lease = self._leases[rkey] = _Lease(size, t)
            if granted:
                lease.balance += granted
                lease.size = size
                lease.taken_at = t
                lease.denied_need = 0
            if lease.balance >= cost:
                lease.balance -= cost
                return RedisDecision(
                    True, lease.balance, 0, int(reset_us) * NS_PER_US, self._capacity, "redis"
                )
            retry_ns = max(1, int(retry_us)) * NS_PER_US
            if not granted:
                lease.denied_need = need
                lease.denied_until = t + retry_ns
                lease.denied_full = t + int(reset_us) * NS_PER_US
            return RedisDecision(
                False, lease.balance, retry_ns, int(reset_us) * NS_PER_US, self._capacity, "redis"
            )

    def _evict(self) -> None:
        # Called with the lock held and the table full: drop the oldest
        # eighth of the keys. Their unspent tokens are forfeited, not given
        # back (no round trip under the lock): that only ever under-admits,
        # and Redis refills them within max_lease intervals.
        for rkey in list(self._leases)[: max(1, self._max_keys // 8)]:
            del self._leases[rkey]

    def __len__(self) -> int:
        """Keys this instance keeps lease state for (at most ``max_keys``)."""
        return len(self._leases)

    def close(self) -> None:
        """Give every unspent leased token back to Redis (one round trip) and forget the leases.

        Then close the limiter's own connections, if it made a pool of its own
        (the client it was given stays open); a later call opens a new one.

        >>> limiter = LeasedTokenBucket(redis.Redis(), rate=1000, capacity=2000)
        >>> limiter.close(); limiter.round_trips   # nothing held: nothing to send
        0
        """
        self._give_back(None)
        super().close()

    def close_at(self, now: int) -> None:
        """`close` at an explicit time *now* (int ns).

        >>> limiter = LeasedTokenBucket(redis.Redis(), rate=1000, capacity=2000)
        >>> limiter.close_at(0); len(limiter)   # no lease state is left
        0
        """
        self._give_back(validated_now(now))

    def _counted(self, call: Any, *args: Any) -> Any:
        """``call(*args)``, one round trip more in `round_trips`."""
        with self._lock:
            self.round_trips += 1
        return call(*args)

    def _give_back(self, now_ns: int | None) -> None:
        with self._lock:
            leases = [(k, v.balance) for k, v in self._leases.items() if v.balance]
            self._leases.clear()
        if not leases:
            return
        calls = [(k, self._give_args(n, now_ns)) for k, n in leases]
        # Redis gone: the tokens return by themselves as the buckets refill.
        with contextlib.suppress(*_clients.UNAVAILABLE):
            self._counted(drive, evalsha_pipeline(self._client, self._script, calls))

    # -- refund, reset, waiting, reconfigure ------------------------------------

    def _give(self, key: Hashable, cost: object, now_ns: int | None) -> bool:
        cost = self._cost(cost)
        rkey = self.key(key)
        with self._lock:
            lease = self._leases.get(rkey)
            if lease is not None:
                lease.denied_need = 0  # tokens came back: a refusal seen before no longer holds
                local = min(cost, max(self._max_lease - 1 - lease.balance, 0))
                lease.balance += local
                cost -= local
        if not cost:
            return True
        args = self._give_args(cost, now_ns)
        ok, err = self._send(self._counted, self._script, (rkey,), args)
        return True if ok else self._refund_lost(key, cost, now_ns, err)

    def reset(self, key: Hashable) -> bool:
        """Forget *key*: this instance's lease (unspent tokens forfeited) and its Redis bucket.

        The next decision sees a full bucket. False if Redis could not take it
        (the lease is dropped all the same; see `RedisTokenBucket.reset`).

        >>> limiter = LeasedTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down)
        >>> limiter.reset("alice"), limiter.held("alice")
        (False, 0)
        """
        rkey = self.key(key)
        with self._lock:
            self._leases.pop(rkey, None)
        return self._reset(key, rkey)

    def reserve(
        self,
        key: Hashable,
        *,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> int:
        """Spend from the lease when it pays (0), else reserve in Redis as
        `RedisTokenBucket.reserve` does (the lease is not touched).

        >>> LeasedTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down).reserve("a")
        0
        """
        cost, max_wait, shape, now_ns = self._reserve_params(cost, max_wait_ns, shape, now)
        rkey = self.key(key)
        if not shape:
            with self._lock:
                lease = self._leases.get(rkey)
                if lease is not None and lease.balance >= cost:
                    lease.balance -= cost
                    return 0
        return self._reserve_in_redis(rkey, key, cost, now_ns, max_wait, shape)

    def _reconfigure(self, params: tuple[Any, int, int], now: int | None, migrate: bool) -> None:
        # Leased tokens were counted in the old terms: they go back first.
        self._give_back(None if now is None else validated_now(now))
        super()._reconfigure(params, now, migrate)
        self._max_lease = min(self._max_lease, params[1])
        self._min_lease = min(self._min_lease, self._max_lease)

    def __enter__(self) -> LeasedTokenBucket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"LeasedTokenBucket(rate={self._rate!r}, capacity={self._capacity}, "
            f"max_lease={self._max_lease})"
        )

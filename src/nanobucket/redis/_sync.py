"""The sync limiter: one round trip per decision, through a thin runner (`_SyncLimits._send`)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any

from .._compose.verbs import KeyedBatch, KeyedVerbs, Reserving
from .._core import _acquire
from .._core._params import RateArg, validated_now, validated_timeout
from . import _clients
from ._bounded import DEFAULT_SOCKET_TIMEOUT
from ._breaker import CircuitBreaker
from ._limits import (
    _GCRA,
    _GCRA_MANY,
    _RedisLimits,
    _sleep_reserved,
    drive,
)
from ._policy import Fallback, Policy, RedisDecision
from ._wire import Wire

__all__ = ("RedisTokenBucket",)


class _SyncLimits(_RedisLimits, Reserving):
    """The sync runner, and the verbs the sync limiters share (reserve, wait, reset, migrate)."""

    _wire: Wire | None = None

    def _connect(self, client: Any) -> None:
        super()._connect(client)
        # Script calls on connections of the limiter's own, past redis-py's
        # command layer, where the client allows (see _wire.py).
        self._wire = Wire.of(self._client)
        self._give_script = self._wired(self._give_script)
        self._reserve_script = self._wired(self._reserve_script)

    def _wired(self, script: Any) -> Any:
        """*script* (a redis-py ``Script``) through the limiter's `Wire`, if it has one."""
        return script if self._wire is None else self._wire.script(script)

    def close(self) -> None:
        """Close the limiter's own connections (the client it was given stays open).

        >>> RedisTokenBucket(redis.Redis(), rate=100, capacity=200).close()
        """
        if self._wire is not None:
            self._wire.close()
        if self._client is not self._user_client:
            self._client.close()

    def _send(self, call: Any, *args: Any) -> tuple[bool, Any]:
        """``call(*args)`` guarded by the breaker: ``(True, reply)``, or ``(False, error)``
        when Redis could not answer (the error None: the breaker let no call through)."""
        breaker = self._breaker_of_call(args)
        if not breaker.allow_request():
            return False, None
        try:
            if self._outage.owed:  # Redis is back: its buckets first take what was admitted
                self._charge(breaker)
            reply = call(*args)
        except _clients.UNAVAILABLE as err:
            breaker.record_failure()
            return False, err
        breaker.record_success()
        return True, reply

    def _charge(self, breaker: CircuitBreaker) -> None:
        """Charge *breaker*'s Redis with what the fallback admitted in an outage (`_outage`)."""
        charges = self._outage.take(breaker, self._fallback)
        if not charges:
            return
        try:
            drive(self._charge_steps(charges))
        except BaseException:
            self._outage.restore(breaker, charges)
            raise
        self._outage.charged(self, charges)

    def reserve(
        self,
        key: Hashable,
        *,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> int:
        """Reserve *cost* tokens in Redis; the ns to wait before using them, or -1.

        The in-process ``reserve``: the bucket may go past empty (a place in
        line every instance sees), nothing is reserved past *max_wait_ns*.
        When Redis cannot decide, the failure policy answers 0 or -1.

        >>> RedisTokenBucket(redis.Redis(), 1, 2, on_error="closed", breaker=down).reserve("a")
        -1
        """
        cost, max_wait, shape, now_ns = self._reserve_params(cost, max_wait_ns, shape, now)
        rkey = self.key(key)
        return self._reserve_in_redis(rkey, key, cost, now_ns, max_wait, shape)

    def _reserve_in_redis(
        self, rkey: bytes, key: Hashable, cost: int, now_ns: int | None, max_wait: int, shape: bool
    ) -> int:
        args = self._reserve_args(cost, now_ns, max_wait, shape)
        ok, reply = self._send(self._reserve_script, (rkey,), args)
        return self._waited(reply) if ok else self._reserve_policy(key, cost, now_ns, reply)

    def acquire(self, key: Hashable, cost: int = 1, timeout: float | None = None) -> bool:
        """Wait (block the thread) until *cost* tokens of *key* are spent, or refuse.

        One round trip reserves the tokens in Redis (every instance then sees
        them owed), and the thread sleeps until they exist. False at once,
        with nothing reserved, when the wait would exceed *timeout* seconds
        or 1024 callers already wait on this limiter; an interrupted wait
        gives the reservation back (`refund`). A :class:`LeasedTokenBucket`
        spends its lease first when it pays.

        >>> RedisTokenBucket(redis.Redis(), 100, 200, on_error="closed", breaker=down).acquire("a")
        False
        """
        cost = self._cost(cost)
        self.key(key)
        return _acquire.acquire_slow(self, (key,), cost, validated_timeout(timeout))

    async def acquire_async(
        self, key: Hashable, cost: int = 1, timeout: float | None = None
    ) -> bool:
        """`acquire` for asyncio: the round trips run in a worker thread, the wait on the loop.

        A cancelled waiter gives its reservation back.

        >>> limiter = RedisTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down)
        >>> asyncio.run(limiter.acquire_async("alice"))   # the policy admits at once
        True
        """
        cost = self._cost(cost)
        self.key(key)
        max_wait = _acquire.max_wait_ns(timeout)
        r = await asyncio.to_thread(self.reservation, key, cost=cost, max_wait_ns=max_wait)
        return await _sleep_reserved(self, r.delay_ns, lambda: asyncio.to_thread(r.cancel))

    if TYPE_CHECKING:

        def refund(self, key: Hashable, cost: int = 1) -> bool: ...

    def _reset(self, key: Hashable, rkey: bytes) -> bool:
        ok, err = self._send(self._client.delete, rkey)
        return True if ok else self._lost("reset", key, (), err)

    def reconfigure(
        self,
        rate: RateArg | None = None,
        capacity: int | None = None,
        *,
        now: int | None = None,
        migrate: bool = True,
    ) -> None:
        """Change this instance's rate and/or capacity; with *migrate*, carry its buckets over.

        Rate and capacity travel with each call, so they are this instance's.
        Each limit keeps its buckets in a key space of its own under the prefix
        (see `key`), so after the change this instance decides on the new
        limit's buckets, beside instances still on the old limit (on the old
        buckets, untouched) and those already on the new one (on the same
        new buckets): nothing else needs telling. Without *migrate* a key the
        new limit has not seen starts full. With *migrate* (the default)
        every stored bucket of the old limit is carried over first, as the
        in-process ``reconfigure`` does: the tokens it holds at *now*
        (default: Redis time) carry over as they are, capped at the new
        capacity, the new debt rounded up to a whole microsecond; a bucket
        the new limit already holds keeps the stricter of the two (a
        decision made meanwhile is never undone). One difference: a full
        bucket is a missing key, so it stays full under a larger capacity (in
        process it keeps the old capacity's tokens and refills the rest).
        Carrying over scans the prefix once; Redis errors raise.

        >>> limiter = RedisTokenBucket(redis.Redis(), rate=100, capacity=200)
        >>> limiter.reconfigure(rate=50, migrate=False)   # start the new limit full
        >>> limiter.rate, limiter.capacity, limiter.interval_ns
        (50, 200, 20000000)
        """
        self._reconfigure(self._new_params(rate, capacity, migrate), now, migrate)

    def _reconfigure(self, params: tuple[Any, int, int], now: int | None, migrate: bool) -> None:
        if migrate and params[1:] != (self._capacity, self._interval_us):
            self._migrate(params, now)
        self._set_params(params)

    def _migrate(self, params: tuple[Any, int, int], now: int | None) -> None:
        """Carry every stored bucket of this limit over to *params* (see `reconfigure`)."""
        now_ns = None if now is None else validated_now(now)
        client = self._client
        for rkey in client.scan_iter(match=self._pattern(), count=1000, _type="string"):
            drive(self._migrate_key(client, self._carry_script, rkey, params, now_ns))


class RedisTokenBucket(
    _SyncLimits, KeyedVerbs[RedisDecision, bool], KeyedBatch[RedisDecision, bool]
):
    """A token bucket per key, held in Redis and shared by every client.

    Same verbs and :class:`Decision` as :class:`nanobucket.KeyedTokenBucket`;
    decisions are :class:`RedisDecision` (with ``source``). One round trip
    per decision, one per batch for ``allow_many``.

    A call waits for Redis at most ``timeout`` seconds (0.1 by default),
    whatever *client*'s own timeouts and retries: the limiter uses a pool of
    its own to the same server (:func:`bounded_client`; :meth:`close` closes
    it). While the breaker is open no call touches the network.

    >>> limiter = RedisTokenBucket.from_url(url, rate=100, capacity=200)  # doctest: +SKIP
    >>> limiter.check("alice").remaining                                  # doctest: +SKIP
    199

    While Redis is unreachable, the failure policy (or ``fallback``) decides
    (``tokens`` excepted: only Redis knows, so it raises `RedisUnavailable`).
    By default (``on_error="local"``) the limit itself, in this process; what
    it admitted is charged to Redis when Redis answers again:

    >>> limiter = RedisTokenBucket(redis.Redis(), 1, 2, breaker=down)
    >>> [limiter.allow_at("alice", 0) for _ in range(3)], limiter.check("bob").source
    ([True, True, False], 'fallback')
    >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down)
    >>> limiter.check("alice").source, limiter.peek("alice").remaining
    ('policy:open', 199)
    >>> local = KeyedTokenBucket(rate=1, capacity=1)
    >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, fallback=local, breaker=down)
    >>> limiter.allow_at("alice", 0), limiter.allow_at("alice", 0)   # the fallback decides
    (True, False)

    ``refund`` works as in process: a full bucket gets nothing, and the
    bucket ends where it would be had the tokens not been spent, or full.
    True if Redis took it; when Redis cannot, the refund goes to the
    ``fallback`` (if it has ``refund``) or is lost -- never queued, never
    raised except under ``on_error="raise"`` -- and the result is False:

    >>> RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down).refund("alice")
    False
    """

    # Its verbs wait for Redis in the calling thread: the asyncio integrations
    # refuse it (an event loop would stall on every decision), naming the twin.
    blocking = True

    def __init__(
        self,
        client: Any,  # redis-py or valkey-py, plain or cluster
        rate: RateArg,
        capacity: int | None = None,
        *,
        prefix: str = "nanobucket",
        on_error: Policy = "local",
        fallback: Fallback | None = None,
        breaker: CircuitBreaker | None = None,
        timeout: float = DEFAULT_SOCKET_TIMEOUT,
        none_key: bool = False,
    ) -> None:
        super().__init__(
            rate, capacity, prefix, on_error, fallback, breaker, timeout, none_key=none_key
        )
        self._connect(client)
        self._script = self._wired(self._client.register_script(_GCRA))
        self._many_script = self._wired(self._client.register_script(_GCRA_MANY))

    # The steps the verbs are derived from (`nanobucket._compose.verbs`).

    def _decide(
        self, key: Hashable, cost: object, now_ns: int | None, consume: bool
    ) -> RedisDecision:
        cost = self._cost(cost)
        ok, reply = self._send(self._script, (self.key(key),), self._args(cost, now_ns, consume))
        if not ok:
            return self._policy(key, cost, now_ns, consume, reply)
        self._saw(key, reply, cost if consume else 0, now_ns)
        return self._decision(reply, cost)

    def _admit(self, key: Hashable, cost: object, now_ns: int | None) -> bool:
        # `_decide(...).allowed` without building the decision.
        cost = self._cost(cost)
        ok, reply = self._send(self._script, (self.key(key),), self._args(cost, now_ns, True))
        if not ok:
            return self._policy(key, cost, now_ns, True, reply).allowed
        self._saw(key, reply, cost, now_ns)
        return self._admits(reply, cost)

    def _tokens(self, key: Hashable, now_ns: int | None) -> float:
        # Only Redis knows: with Redis unreachable it raises `RedisUnavailable`,
        # whatever ``on_error`` and ``fallback`` say.
        return self._tokens_in(self._decide(key, 0, now_ns, False))

    def _many(self, keys: Iterable[Hashable], cost: object, now_ns: int | None) -> bytearray:
        cost = self._cost(cost)
        keys, rkeys = self._batch(keys)
        if not keys:
            return bytearray()
        ok, reply = self._send(*self._many_call(rkeys, cost, now_ns, drive))
        return self._many_reply(reply, cost) if ok else self._policy_many(keys, cost, now_ns, reply)

    # -- refund, reset -----------------------------------------------------------

    def _give(self, key: Hashable, cost: object, now_ns: int | None) -> bool:
        cost = self._cost(cost)
        rkey = self.key(key)
        ok, err = self._send(self._give_script, (rkey,), self._give_args(cost, now_ns))
        return True if ok else self._refund_lost(key, cost, now_ns, err)

    def reset(self, key: Hashable) -> bool:
        """Forget *key*'s bucket: the next decision sees it full. True if Redis took it.

        A failed Redis is handled as for `refund` (the fallback's ``reset``, or lost).

        >>> RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down).reset("alice")
        False
        """
        return self._reset(key, self.key(key))

    def __repr__(self) -> str:
        return f"RedisTokenBucket(rate={self._rate!r}, capacity={self._capacity})"

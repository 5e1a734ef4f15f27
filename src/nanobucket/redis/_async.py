"""The asyncio limiter: the same requests and replies, awaited, and decisions coalesced."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any

from .._compose.verbs import AsyncKeyedVerbs
from .._core import _acquire
from .._core._params import RateArg, validated_now
from . import _clients, _coalesce
from ._bounded import DEFAULT_SOCKET_TIMEOUT, _deadline_client
from ._breaker import CircuitBreaker
from ._deadline import Deadline, ceiling
from ._limits import (
    _GCRA,
    _GCRA_BATCH,
    _GCRA_MANY,
    EXPLICIT_TTL_SLACK_MS,
    NS_PER_US,
    _late,
    _RedisLimits,
    _sleep_reserved,
    drive_async,
)
from ._policy import Fallback, Policy, RedisDecision

__all__ = ("AsyncRedisTokenBucket",)

#: One deadline around a round trip (Python >= 3.11: it needs ``Task.uncancel``),
#: instead of redis.asyncio's costly socket timeout; the loop's own lag is not
#: counted against Redis (see `_deadline`). On 3.10 the asyncio limiter keeps
#: the socket timeout.
_timeout_at: Callable[[float, float], contextlib.AbstractAsyncContextManager[Any]] | None = (
    Deadline if hasattr(asyncio.Task, "uncancel") else None
)
#: No deadline of the limiter's own: the client's socket timeout bounds the call.
_UNBOUNDED: contextlib.AbstractAsyncContextManager[Any] = contextlib.nullcontext()


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Mark a discovery's failure seen: its caller may have stopped waiting (the next retries)."""
    if not task.cancelled():
        task.exception()


class AsyncRedisTokenBucket(_RedisLimits, AsyncKeyedVerbs[RedisDecision, bool]):
    """:class:`RedisTokenBucket` on ``redis.asyncio.Redis``: the same verbs, awaited.

    Decisions coalesce (``coalesce=True``, the default): one that finds no
    round trip of the loop in flight is sent at once, alone; those that
    arrive while one is in flight are sent together when it completes, as one
    script call (``lua/gcra_batch.lua``, at most 512 per call), each
    caller getting the very decision it would have got alone at that Redis
    time, in arrival order. So hundreds of tasks deciding at once make one
    round trip per batch, on one connection. ``allow``, ``check``, ``peek``
    and their ``_at`` forms coalesce (a batch holds one clock: Redis's, or
    one explicit ``now``); ``allow_many`` and the other verbs do not. A
    caller cancelled while queued spends nothing; one cancelled while its
    batch is in flight does not cancel the batch. On a Redis Cluster
    decisions are not coalesced (keys of different slots cannot share a
    script), and ``coalesce=False`` turns it off.

    Each decision round trip is bounded by one deadline (``timeout`` after
    the oldest caller of the batch queued) instead of a socket timeout
    (Python >= 3.11; on 3.10 the socket timeout; a cluster keeps its socket
    timeouts under the deadline). Time the event loop spends blocked or
    busy with other tasks moves the deadline (it is not Redis's), but never
    past ``max(10 * timeout, 1 s)`` after the call: then the policy answers,
    however busy the loop. A caller
    that waited past its deadline behind a slow round trip gets the policy
    (reason ``"timeout"``) without being sent. When
    Redis cannot decide a batch, every caller in it gets the policy's (or the
    fallback's) answer, and the breaker counts one failure: one round trip
    failed, however many callers it carried.

    >>> limiter = AsyncRedisTokenBucket.from_url(url, rate=100, capacity=200)  # doctest: +SKIP
    >>> await limiter.allow("alice")                                           # doctest: +SKIP
    True

    Outside a running loop, ``asyncio.run`` it:

    >>> limiter = AsyncRedisTokenBucket.from_url("redis://127.0.0.1:6379/0", rate=100, capacity=200)
    >>> limiter.interval_ns, asyncio.run(limiter.aclose())
    (10000000, None)
    """

    _asyncio = True

    def __init__(
        self,
        client: Any,  # redis-py or valkey-py asyncio, plain or cluster
        rate: RateArg,
        capacity: int | None = None,
        *,
        prefix: str = "nanobucket",
        on_error: Policy = "local",
        fallback: Fallback | None = None,
        breaker: CircuitBreaker | None = None,
        timeout: float = DEFAULT_SOCKET_TIMEOUT,
        none_key: bool = False,
        coalesce: bool = True,
    ) -> None:
        super().__init__(
            rate, capacity, prefix, on_error, fallback, breaker, timeout, none_key=none_key
        )
        self._connect(client)
        if not isinstance(coalesce, bool):
            raise TypeError(f"coalesce must be a bool, not {type(coalesce).__name__}")
        # Decisions go through a client whose reads have no timeout of their
        # own, each round trip under one deadline (`_deadline`); the other
        # verbs keep the socket timeout. A cluster keeps its socket timeouts
        # and gets the deadline too: a fresh cluster client's first call also
        # discovers the topology, node by node, each step under its own
        # socket timeout. Python 3.10: the socket timeout alone.
        deadline = _timeout_at is not None and not self._cluster
        self._fast = _deadline_client(client, self._timeout) if deadline else self._client
        self._script = self._fast.register_script(_GCRA)
        self._many_script = self._fast.register_script(_GCRA_MANY)
        self._batch_script = self._fast.register_script(_GCRA_BATCH)
        self._coalesce = coalesce and not self._cluster
        self._discovery: asyncio.Future[Any] | None = None
        # The queue of the loop last used, and of every loop not closed (a
        # limiter shared by loops in several threads keeps one queue per loop).
        self._coalescer: _coalesce.Coalescer | None = None
        self._coalescers: dict[asyncio.AbstractEventLoop, _coalesce.Coalescer] = {}

    def _deadline(
        self, at: float | None = None, hard: float | None = None
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        """The bound of one decision round trip: loop time *at*, moved by the loop's lag
        up to loop time *hard* (default: ``timeout`` and `ceiling` from now)."""
        if _timeout_at is None:
            return contextlib.nullcontext()  # the client's socket timeout bounds it
        if at is None or hard is None:
            now = asyncio.get_running_loop().time()
            at, hard = now + self._timeout, now + ceiling(self._timeout)
        return _timeout_at(at, hard)

    async def _send(
        self, bound: contextlib.AbstractAsyncContextManager[Any], call: Any, *args: Any
    ) -> tuple[bool, Any]:
        """`RedisTokenBucket._send`, awaited within *bound* (a deadline, or `_UNBOUNDED`)."""
        breaker = self._breaker_of_call(args)
        if not breaker.allow_request():
            return False, None
        err: BaseException
        try:
            async with bound:
                if self._cluster and getattr(self._client, "_initialize", False):
                    await self._discovered()
                if self._outage.owed:  # Redis is back: its buckets first take what was admitted
                    await self._charge(breaker)
                reply = await call(*args)
        except _clients.UNAVAILABLE as e:
            err = e
        except TimeoutError:
            if bound is _UNBOUNDED:
                raise  # not the limiter's deadline
            err = _late()
        else:
            breaker.record_success()
            return True, reply
        breaker.record_failure()  # once: one round trip failed, whatever it carried
        return False, err

    async def _charge(self, breaker: CircuitBreaker) -> None:
        """`RedisTokenBucket._charge`, awaited."""
        charges = self._outage.take(breaker, self._fallback)
        if not charges:
            return
        try:
            await drive_async(self._charge_steps(charges))
        except BaseException:  # a deadline's cancel too: charged again next time
            self._outage.restore(breaker, charges)
            raise
        self._outage.charged(self, charges)

    async def _discovered(self) -> None:
        """Wait for the cluster client to learn the topology, in a task a deadline cannot cancel.

        A cluster client's first call fetches the slots and the command table
        (redis-py parses ~10,000 lines of COMMAND: 0.1-0.3 s of CPU). Under a
        deadline shorter than that, a cancelled discovery would start over on
        every call and the limiter would never decide; shielded, it finishes
        in the background while the callers that could not wait get the policy.
        """
        task = self._discovery
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            task = self._discovery = asyncio.ensure_future(self._client.initialize())
            task.add_done_callback(_retrieved)
        await asyncio.shield(task)

    # The steps the verbs are derived from (`nanobucket._compose.verbs`).

    async def _decide(
        self, key: Hashable, cost: object, now_ns: int | None, consume: bool
    ) -> RedisDecision:
        cost = self._cost(cost)  # checked before the key, as by every limiter
        call = _coalesce.Call(self.key(key), key, cost, now_ns, consume)
        result: RedisDecision = await self._submit(call)
        return result

    async def _admit(self, key: Hashable, cost: object, now_ns: int | None) -> bool:
        """`_decide` for `allow`: a decision Redis made is answered as a bool, not built."""
        cost = self._cost(cost)
        call = _coalesce.Call(self.key(key), key, cost, now_ns, True, False)
        d = await self._submit(call)
        return d if d.__class__ is bool else d.allowed

    async def _tokens(self, key: Hashable, now_ns: int | None) -> float:
        # Only Redis knows: with Redis unreachable it raises `RedisUnavailable`.
        return self._tokens_in(await self._decide(key, 0, now_ns, False))

    def _submit(self, call: _coalesce.Call) -> Awaitable[Any]:
        if not self._coalesce:
            return self._one(call)
        loop = asyncio.get_running_loop()
        coalescer = self._coalescer
        if coalescer is None or coalescer.loop is not loop:  # each loop its own queue
            coalescer = self._coalescers.get(loop)
            if coalescer is None:
                for lp in list(self._coalescers):  # forget the queues of closed loops
                    if lp.is_closed():
                        self._coalescers.pop(lp, None)
                coalescer = self._coalescers[loop] = _coalesce.Coalescer(
                    loop, self._timeout, self._one, self._send_batch, self._expired
                )
            self._coalescer = coalescer
        return coalescer.decide(call)

    async def _one(self, call: _coalesce.Call) -> Any:
        """One decision alone: the single script, as without coalescing."""
        key, cost, now_ns, consume = call.key, call.cost, call.now_ns, call.consume
        args = self._args(cost, now_ns, consume)
        ok, reply = await self._send(self._deadline(), self._script, (call.rkey,), args)
        if not ok:
            return self._policy(key, cost, now_ns, consume, reply)
        self._saw(key, reply, cost if consume else 0, now_ns)
        if call.full:
            return self._decision(reply, cost)
        return self._admits(reply, cost)

    async def _send_batch(
        self, calls: list[_coalesce.Call], deadline: float, hard: float
    ) -> list[Any]:
        """Decide coalesced *calls* (one clock) in one script call before loop time *deadline*
        (moved by the loop's lag, up to *hard*).

        Answers every call, raising nothing: a decision each, or when Redis
        cannot decide, the policy's answer each (its exception, for "raise").
        """
        now_ns = calls[0].now_ns
        interval = self._interval_us
        args: list[bytes | int] = (
            [self._head[1], b"", 0]
            if now_ns is None
            else [self._head[1], now_ns // NS_PER_US, EXPLICIT_TTL_SLACK_MS]
        )
        # A peek goes as -cost_us - 1; one code for all when they share it (see the script).
        codes = [c.cost * interval if c.consume else -c.cost * interval - 1 for c in calls]
        first = codes[0]
        if codes.count(first) == len(codes):
            args.append(first)
        else:
            args.append(b"")
            args += codes
        rkeys = [c.rkey for c in calls]
        ok, reply = await self._send(
            self._deadline(deadline, hard), self._batch_script, rkeys, args
        )
        if not ok:
            return [self._policy_answer(c.key, c.cost, c.now_ns, c.consume, reply) for c in calls]
        decision, tau = self._decision, self._tau_us
        owed_each = list(map(int, reply.split(b",")))
        if self._fallback is not None:
            for c, owed in zip(calls, owed_each):
                self._saw(c.key, owed, c.cost if c.consume else 0, c.now_ns)
        return [
            decision(owed, c.cost) if c.full else owed <= tau - c.cost * interval
            for c, owed in zip(calls, owed_each)
        ]

    def _expired(self, call: _coalesce.Call) -> RedisDecision:
        """A call that waited past its deadline: the policy answers, the breaker is not told
        (the round trip before it was slow and counted already)."""
        return self._policy(call.key, call.cost, call.now_ns, call.consume, _late())

    async def _many(self, keys: Iterable[Hashable], cost: object, now_ns: int | None) -> bytearray:
        cost = self._cost(cost)
        keys, rkeys = self._batch(keys)
        if not keys:
            return bytearray()
        call = self._many_call(rkeys, cost, now_ns, drive_async)
        ok, reply = await self._send(self._deadline(), *call)
        return self._many_reply(reply, cost) if ok else self._policy_many(keys, cost, now_ns, reply)

    async def aclose(self) -> None:
        """Close the client's connections and the limiter's own.

        >>> url = "redis://127.0.0.1:6379/0"
        >>> limiter = AsyncRedisTokenBucket.from_url(url, rate=100, capacity=200)
        >>> asyncio.run(limiter.aclose())   # at shutdown
        """
        if self._discovery is not None:
            self._discovery.cancel()  # no topology to learn for a closed client
        clients = (self._fast, self._client, self._user_client)
        for client in {id(c): c for c in clients}.values():
            close = getattr(client, "aclose", None) or client.close  # redis-py 5.0: close
            await close()

    # -- refund, reset, waiting, reconfigure (as RedisTokenBucket's) -------------

    async def _give(self, key: Hashable, cost: object, now_ns: int | None) -> bool:
        cost = self._cost(cost)
        rkey = self.key(key)
        args = self._give_args(cost, now_ns)
        ok, err = await self._send(_UNBOUNDED, self._give_script, (rkey,), args)
        return True if ok else self._refund_lost(key, cost, now_ns, err)

    async def reset(self, key: Hashable) -> bool:
        """`RedisTokenBucket.reset`, awaited: forget *key*'s bucket (next decision: full).

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, 2, on_error="open",
        ...                                 breaker=down)
        >>> asyncio.run(limiter.reset("alice"))
        False
        """
        rkey = self.key(key)
        ok, err = await self._send(_UNBOUNDED, self._client.delete, rkey)
        return True if ok else self._lost("reset", key, (), err)

    async def reserve(
        self,
        key: Hashable,
        *,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> int:
        """`RedisTokenBucket.reserve`, awaited.

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, 2, on_error="closed",
        ...                                 breaker=down)
        >>> asyncio.run(limiter.reserve("alice"))   # the policy refuses
        -1
        """
        cost, max_wait, shape, now_ns = self._reserve_params(cost, max_wait_ns, shape, now)
        args = self._reserve_args(cost, now_ns, max_wait, shape)
        ok, reply = await self._send(_UNBOUNDED, self._reserve_script, (self.key(key),), args)
        return self._waited(reply) if ok else self._reserve_policy(key, cost, now_ns, reply)

    async def acquire_async(
        self, key: Hashable, cost: int = 1, timeout: float | None = None
    ) -> bool:
        """`RedisTokenBucket.acquire` on the loop: reserve in Redis, sleep, never block.

        A cancelled waiter gives its reservation back.

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, 2, on_error="open",
        ...                                 breaker=down)
        >>> asyncio.run(limiter.acquire_async("alice"))   # the policy admits at once
        True
        """
        cost = self._cost(cost)
        self.key(key)
        wait = await self.reserve(key, cost=cost, max_wait_ns=_acquire.max_wait_ns(timeout))
        return await _sleep_reserved(self, wait, lambda: self.refund(key, cost))

    acquire = acquire_async

    async def reconfigure(
        self,
        rate: RateArg | None = None,
        capacity: int | None = None,
        *,
        now: int | None = None,
        migrate: bool = True,
    ) -> None:
        """`RedisTokenBucket.reconfigure`, awaited.

        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), rate=100, capacity=200)
        >>> asyncio.run(limiter.reconfigure(capacity=50, migrate=False)); limiter.capacity
        50
        """
        params = self._new_params(rate, capacity, migrate)
        if migrate and params[1:] != (self._capacity, self._interval_us):
            now_ns = None if now is None else validated_now(now)
            client = self._client
            async for rkey in client.scan_iter(match=self._pattern(), count=1000, _type="string"):
                await drive_async(
                    self._migrate_key(client, self._carry_script, rkey, params, now_ns)
                )
        self._set_params(params)

    def __repr__(self) -> str:
        return f"AsyncRedisTokenBucket(rate={self._rate!r}, capacity={self._capacity})"

"""What every Redis limiter shares: parameters, keys, each script's request and reply.

Each verb's request (script, keys, arguments) and the meaning of its reply
are written here once; the sync limiters send them through a thin runner
(`_sync`), the asyncio one through an awaiting one (`_async`). A sequence of
round trips (a pipelined batch, a migration) is a generator of client calls,
driven by `drive` (each call's result sent back) or `drive_async` (each
call's coroutine awaited first).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Generator, Hashable, Iterable
from importlib.resources import files
from typing import Any, TypeVar

from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core import _acquire
from .._core._params import (
    NOW_MAX,
    NS_PER_S,
    Clock,
    RateArg,
    RateLike,
    bucket_params,
    kept_capacity,
    none_key_error,
    public_rate,
    real_seconds,
    validated_cost,
    validated_flag,
    validated_max_wait,
    validated_now,
    validated_shape,
)
from . import _clients, _prefix
from ._bounded import DEFAULT_SOCKET_TIMEOUT, bounded_client, client_from_url
from ._breaker import CircuitBreaker
from ._outage import Charge
from ._policy import _MAX_SEEN, Fallback, Policy, RedisDecision, RedisUnavailable, _FailurePolicy

NS_PER_US = 1000
#: Largest tau in us: tat = now + tau must stay below 2**53 for every now.
TAU_US_MAX = (1 << 53) - 1 - NOW_MAX // NS_PER_US
#: Keys written at explicit times live this much longer than their debt: an
#: explicit clock is not Redis's, so Redis cannot tell when such a bucket is
#: full; without the slack a slow replay would lose state mid-trace.
EXPLICIT_TTL_SLACK_MS = 86_400_000
#: The bytes of key None (``none_key=True``) in its Redis key: not UTF-8, so no
#: str or int key has them (only the bytes key ``b"\xff"``).
NONE_KEY = b"\xff"

_LUA = files(__package__).joinpath("lua")
#: The shared Lua library (lua/lib.lua): its head (locals every part uses)
#: and its parts by name, each starting with a line ``--- name``.
_LIB_HEAD, *_parts = re.split(r"(?m)^--- ", _LUA.joinpath("lib.lua").read_text(encoding="utf-8"))
_LIB_PARTS = {part.partition("\n")[0]: "--- " + part for part in _parts}


def _script(name: str) -> str:
    """A script's text: the library's head and the parts its first line names
    (``-- lib: clock digits``), then the script, each line ``-- use: read decide``
    replaced by those parts (blocks pasted in, not functions called)."""
    text = _LUA.joinpath(name).read_text(encoding="utf-8")
    first = text.partition("\n")[0]
    if first.startswith("-- lib:"):
        text = "".join([_LIB_HEAD, *(_LIB_PARTS[part] for part in first[7:].split())]) + text
    return re.sub(
        r"(?m)^ *-- use: (.*)\n", lambda use: "".join(_LIB_PARTS[p] for p in use[1].split()), text
    )


_GCRA = _script("gcra.lua")
_GCRA_MANY = _script("gcra_many.lua")
_GCRA_BATCH = _script("gcra_batch.lua")
_LEASE = _script("lease.lua")
_RESERVE = _script("reserve.lua")
_CARRY = _script("carry.lua")

Steps = Generator[Any, Any, Any]
_Limits = TypeVar("_Limits", bound="_RedisLimits")


def drive(steps: Steps) -> Any:
    """Run *steps* on a sync client: each yielded call's result goes back in."""
    try:
        result = next(steps)
        while True:
            result = steps.send(result)
    except StopIteration as stop:
        return stop.value


async def drive_async(steps: Steps) -> Any:
    """Run *steps* on an asyncio client: each yielded coroutine is awaited, its result goes back."""
    try:
        pending = next(steps)
        while True:
            pending = steps.send(await pending)
    except StopIteration as stop:
        return stop.value


def evalsha_pipeline(client: Any, script: Any, calls: list[tuple[bytes, tuple[Any, ...]]]) -> Steps:
    """Run ``script`` once per (key, args) in one pipelined round trip (steps: see `drive`).

    redis-py's own pipeline support sends ``SCRIPT EXISTS`` first (a second
    round trip on every batch); instead send ``EVALSHA`` and, should Redis have
    lost the script (restart, ``SCRIPT FLUSH``), load it and re-run only the
    calls that got ``NOSCRIPT``: those ran nothing, so none is applied twice.
    """
    results: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for _ in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            key, args = calls[i]
            # Not pipe.evalsha: cluster pipelines refuse that name, not the command.
            pipe.execute_command("EVALSHA", script.sha, 1, key, *args)
        replies = yield pipe.execute(raise_on_error=False)
        missing = []
        for i, reply in zip(todo, replies):
            if isinstance(reply, Exception) and _clients.class_reason(reply) == "noscript":
                missing.append(i)
            elif isinstance(reply, Exception):
                raise reply
            else:
                results[i] = reply
        if not missing:
            return results
        script.sha = yield client.script_load(script.script)
        todo = missing
    raise NoScriptError("script vanished twice while running a batch")


def _timeout_seconds(timeout: object) -> float:
    seconds = real_seconds(timeout, "timeout")
    if not 0 < seconds <= 3600:
        raise ValueError(f"timeout must be in (0, 3600] seconds, got {timeout!r}")
    return float(seconds)


def _redis_params(rate: RateArg, capacity: int | None) -> tuple[RateLike, int, int]:
    """Validated ``(rate as reported, capacity, interval_us)`` of a Redis limiter."""
    exact, cap, interval_ns, _ = bucket_params(rate, capacity)
    # ceil(ceil(1e9/r) / 1000) == ceil(1e6/r): whole us, rounded up.
    interval_us = -(-interval_ns // NS_PER_US)
    if cap * interval_us > TAU_US_MAX:
        raise ValueError(
            f"capacity / rate is {cap * interval_us / 1e6 / 86400 / 365.25:.0f} years to refill: "
            f"more than Redis's microsecond state can hold exactly"
        )
    return public_rate(rate, exact), cap, interval_us


class _RedisLimits(_FailurePolicy):
    """Parameters, key encoding, requests and replies shared by the Redis limiters."""

    keyed = True  # the verbs take the key first
    _asyncio = False  # whether the limiter takes a redis.asyncio client
    _client: Any
    _cluster: bool
    _script: Any
    _many_script: Any
    _rate: RateLike

    def __init__(
        self,
        rate: RateArg,
        capacity: int | None,
        prefix: str,
        on_error: Policy,
        fallback: Fallback | None,
        breaker: CircuitBreaker | None,
        timeout: float,
        *,
        none_key: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self._timeout = _timeout_seconds(timeout)
        self._none_key = validated_flag(none_key, "none_key")
        params = _redis_params(rate, capacity)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain '{' or '}': the key is the hash tag")
        self._prefix = prefix.encode("utf-8")
        self._set_params(params)
        super().__init__(on_error, fallback, breaker, clock)

    def _connect(self, client: Any) -> None:
        """Take *client*: keep it, make the limiter's own bounded client to its server,
        and register there the scripts no decision runs."""
        if not hasattr(client, "register_script"):
            kind = "redis.asyncio.Redis" if self._asyncio else "redis.Redis"
            raise TypeError(f"client must be a {kind}, not {type(client).__name__}")
        if _clients.is_asyncio(client) is (not self._asyncio):
            # Refused here: taken, its first decision would fail far from here
            # ("'>' not supported between instances of 'coroutine' and 'int'").
            raise TypeError(_clients.wrong_kind(type(self).__name__, client, self._asyncio))
        self._user_client = client
        self._client = bounded_client(client, self._timeout)
        self._cluster = _clients.is_cluster(self._client)
        self._give_script = self._client.register_script(_LEASE)
        self._reserve_script = self._client.register_script(_RESERVE)
        self._carry_script = self._client.register_script(_CARRY)

    @classmethod
    def from_url(
        cls: type[_Limits],
        url: str,
        rate: RateArg,
        capacity: int | None = None,
        *,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        **kwargs: Any,
    ) -> _Limits:
        """Build on a new client for *url* (an asyncio one for the asyncio limiter) with a
        short timeout and no retries; *socket_timeout* is the limiter's ``timeout`` too.

        >>> limiter = RedisTokenBucket.from_url("redis://127.0.0.1:6379/0", rate=100, capacity=200)
        >>> limiter.client.get_connection_kwargs()["socket_timeout"]   # no connection made yet
        0.1
        >>> limiter = AsyncRedisTokenBucket.from_url("redis://127.0.0.1:6379/0", 100, 200)
        >>> type(limiter.client).__module__
        'redis.asyncio.client'
        """
        if "timeout" in kwargs:
            raise TypeError(
                "from_url takes socket_timeout= (the limiter's timeout too), not timeout="
            )
        client = client_from_url(url, socket_timeout=socket_timeout, asyncio=cls._asyncio)
        make: Any = cls  # a limiter class: the client first, as every one takes it
        limiter: _Limits = make(client, rate, capacity, timeout=socket_timeout, **kwargs)
        return limiter

    @property
    def none_key(self) -> bool:
        """Whether None is a key (``none_key=True``); else a verb given None raises.

        >>> RedisTokenBucket(redis.Redis(), rate=1, capacity=2, none_key=True).key(None)
        b'nanobucket:1000000:2:{\\xff}'
        """
        return self._none_key

    @property
    def client(self) -> Any:
        """The redis-py client it was given (calls go through a bounded pool to its server).

        >>> client = redis.Redis()
        >>> RedisTokenBucket(client, rate=100, capacity=200).client is client
        True
        >>> client = redis.asyncio.Redis()
        >>> AsyncRedisTokenBucket(client, rate=100, capacity=200).client is client
        True
        """
        return self._user_client

    @property
    def rate(self) -> RateLike:
        """Tokens per second, the number given (Redis applies ``interval_us``).

        >>> RedisTokenBucket(redis.Redis(), rate=2.5, capacity=10).rate
        2.5
        """
        return self._rate

    @property
    def capacity(self) -> int:
        """The most tokens a bucket holds.

        >>> RedisTokenBucket(redis.Redis(), rate=100, capacity=200).capacity
        200
        """
        return self._capacity

    @property
    def interval_ns(self) -> int:
        """Nanoseconds per token as Redis applies it: a whole number of microseconds.

        >>> RedisTokenBucket(redis.Redis(), rate=3, capacity=3).interval_ns   # 1/3 s, rounded up
        333334000
        """
        return self._interval_ns

    @property
    def timeout(self) -> float:
        """The longest a call waits for Redis, in seconds (socket and connect timeout).

        >>> RedisTokenBucket(redis.Redis(), rate=100, capacity=200).timeout
        0.1
        """
        return self._timeout

    def _breaker_of(self, key: Hashable) -> CircuitBreaker:
        """The breaker that decides for *key*: on a cluster, its node's (see
        `CircuitBreaker.node`); elsewhere, or before the topology is known, the limiter's."""
        return self._breaker_for(self.key(key)) if self._cluster else self._breaker

    def _breaker_for(self, rkey: bytes | None) -> CircuitBreaker:
        """`_breaker_of` a stored key."""
        if rkey is None or not self._cluster:
            return self._breaker
        name = _clients.node_of(self._client, rkey)
        return self._breaker if name is None else self._breaker.node(name)

    def _breaker_of_call(self, args: tuple[Any, ...]) -> CircuitBreaker:
        """The breaker of a call `_send` makes: its first key's node's on a cluster."""
        if not self._cluster or not args:
            return self._breaker
        first = args[0]
        if isinstance(first, (tuple, list)) and first:
            first = first[0]
        return self._breaker_for(first if isinstance(first, bytes) else None)

    @property
    def breaker(self) -> CircuitBreaker:
        """The circuit breaker guarding calls to Redis.

        >>> RedisTokenBucket(redis.Redis(), rate=100, capacity=200).breaker.state
        'closed'
        """
        return self._breaker

    def key(self, key: Hashable) -> bytes:
        """The Redis key of *key*'s bucket: ``<prefix>:<interval_us>:<capacity>:{<key>}``,
        a key space of this limit's own (another limit on the prefix has another).

        >>> limiter = RedisTokenBucket(redis.Redis(), rate=100, capacity=200, prefix="api")
        >>> limiter.key("alice"), limiter.key(42)
        (b'api:10000:200:{alice}', b'api:10000:200:{42}')
        """
        if isinstance(key, str):
            raw = key.encode("utf-8")
        elif isinstance(key, bytes):
            raw = key
        elif isinstance(key, int) and not isinstance(key, bool):
            raw = str(key).encode()
        elif key is None:
            if not self._none_key:
                raise none_key_error(type(self).__name__)
            raw = NONE_KEY
        else:
            raise TypeError(
                f"a Redis limiter key must be str, bytes or int, not {type(key).__name__}"
            )
        return self._space + raw + b"}"

    def _cost(self, cost: object) -> int:
        if cost.__class__ is int and 0 <= cost <= self._capacity:
            return cost
        return validated_cost(cost, self._capacity)

    def _args(self, cost: int, now_ns: int | None, consume: bool) -> tuple[bytes | int, ...]:
        # lua/gcra.lua: the TTL slack of explicit times is written in the script.
        return (
            self._head[1],
            cost * self._interval_us,
            b"" if now_ns is None else now_ns // NS_PER_US,
            b"1" if consume else b"0",
        )

    def _many_args(self, cost: int, now_ns: int | None) -> tuple[bytes | int, ...]:
        if now_ns is None:
            return (*self._head, cost, b"", b"0")
        return (*self._head, cost, now_ns // NS_PER_US, EXPLICIT_TTL_SLACK_MS)

    def _admits(self, owed_us: int, cost: int) -> bool:
        """Whether a bucket owing *owed_us* (the script's reply) admits *cost* tokens."""
        return owed_us <= self._tau_us - cost * self._interval_us

    def _saw(self, key: Hashable, owed_us: int, cost: int, now_ns: int | None) -> None:
        """Note Redis's decision of *key* (its script's reply *owed_us*, at *now_ns*) for
        the fallback (see `_FailurePolicy._resume`)."""
        if self._fallback is None:
            return
        cost_us = cost * self._interval_us
        if owed_us <= self._tau_us - cost_us:
            owed_us += cost_us  # admitted: its cost is owed too
        if now_ns is None:
            seen, full_at = self._seen, self._breaker.clock() + owed_us * NS_PER_US
        else:  # Redis's now was the whole microseconds of now_ns
            seen, full_at = self._seen_at, (now_ns // NS_PER_US + owed_us) * NS_PER_US
        if seen.pop(key, None) is None and len(seen) >= _MAX_SEEN:
            del seen[next(iter(seen))]  # the least recent
        seen[key] = full_at  # the most recent last

    def _decision(self, owed_us: int, cost: int) -> RedisDecision:
        # The script returns only the debt before the decision (Redis's CPU
        # is shared by every client); the rest is the same GCRA, here.
        cost_us = cost * self._interval_us
        room = self._tau_us - cost_us
        if owed_us > room:
            retry_us, debt = owed_us - room, owed_us
        else:
            retry_us, debt = 0, owed_us + cost_us
        remaining = max(self._tau_us - debt, 0) // self._interval_us
        return RedisDecision(
            owed_us <= room,
            remaining,
            retry_us * NS_PER_US,
            debt * NS_PER_US,
            self._capacity,
            "redis",
        )

    def _batch(self, keys: Iterable[Hashable]) -> tuple[list[Hashable], list[bytes]]:
        if isinstance(keys, (str, bytes)):
            raise TypeError("keys must be a sequence of keys, not a single str or bytes")
        keys = list(keys)
        return keys, [self.key(k) for k in keys]  # a bad key fails the batch before any call

    # -- refund, reset, reserve, reconfigure: the in-process table's verbs ------

    def _set_params(self, params: tuple[Any, int, int]) -> None:
        self._rate, self._capacity, self._interval_us = params
        self._tau_us = self._capacity * self._interval_us
        self._interval_ns = self._interval_us * NS_PER_US
        self._tau_ns = self._tau_us * NS_PER_US
        self._head = (str(self._interval_us).encode(), str(self._tau_us).encode())
        self._space = _prefix.space(self._prefix, self._interval_us, self._capacity)
        if self._local is not None:  # the local table keeps the limiter's limit
            self._local.reconfigure(self._rate, self._capacity)

    def _give_args(self, cost: int, now_ns: int | None) -> tuple[bytes | int, ...]:
        # The lease script's "give": tat -= cost * interval, never below now.
        now_arg: int | bytes = b"" if now_ns is None else now_ns // NS_PER_US
        return (*self._head, b"give", cost, 0, now_arg, EXPLICIT_TTL_SLACK_MS)

    def _charge_steps(self, charges: list[Charge]) -> Steps:
        """Charge each key's bucket what its fallback admitted in an outage (see `_outage`):
        the lease script's "take" with no minimum, a consume that stops at empty; one
        pipelined round trip (steps: see `drive`)."""
        calls = [
            (self.key(key), (*self._head, b"take", tokens, 0, now_arg, EXPLICIT_TTL_SLACK_MS))
            for key, tokens, now_ns in charges
            for now_arg in (b"" if now_ns is None else now_ns // NS_PER_US,)
        ]
        return evalsha_pipeline(self._client, self._give_script, calls)

    def _reserve_params(
        self, cost: object, max_wait_ns: object, shape: object, now: object
    ) -> tuple[int, int, bool, int | None]:
        """`reserve`'s arguments, checked: ``(cost, max_wait_ns, shape, now_ns)``."""
        return (
            self._cost(cost),
            validated_max_wait(max_wait_ns),
            validated_shape(shape),
            None if now is None else validated_now(now),
        )

    def _reserve_args(
        self, cost: int, now_ns: int | None, max_wait: int, shape: bool
    ) -> tuple[bytes | int, ...]:
        now_arg: int | bytes = b"" if now_ns is None else now_ns // NS_PER_US
        return (
            self._head[1],
            cost * self._interval_us,
            now_arg,
            max(max_wait, 0) // NS_PER_US,  # floor: never wait past the caller's bound
            b"1" if shape else b"0",
            EXPLICIT_TTL_SLACK_MS,
        )

    @staticmethod
    def _waited(wait_us: int) -> int:
        """The reserve script's reply in ns to wait, or -1 (nothing reserved)."""
        return -1 if wait_us < 0 else int(wait_us) * NS_PER_US

    def _refund_lost(self, key: Hashable, cost: int, now_ns: int | None, err: Any) -> bool:
        """A refund Redis could not take (see `_lost`)."""
        if now_ns is None:
            return self._lost("refund", key, (cost,), err)
        return self._lost("refund_at", key, (now_ns, cost), err)

    def _many_call(
        self, rkeys: list[bytes], cost: int, now_ns: int | None, run: Callable[[Steps], Any]
    ) -> tuple[Any, ...]:
        """The call deciding a batch, and its arguments (for `_send`): one script on one
        Redis; on a cluster (keys of different slots cannot share a script) one per key,
        pipelined, run by *run* (`drive` or `drive_async`)."""
        if self._cluster:
            args = self._args(cost, now_ns, True)
            return run, evalsha_pipeline(self._client, self._script, [(k, args) for k in rkeys])
        return self._many_script, rkeys, self._many_args(cost, now_ns)

    def _many_reply(self, reply: Any, cost: int) -> bytearray:
        if self._cluster:
            return bytearray([self._admits(owed, cost) for owed in reply])
        return bytearray(reply)

    def _tokens_in(self, d: RedisDecision) -> float:
        """The tokens decision *d* (of cost 0) read in Redis; raises if another source made it."""
        if d.source != "redis":
            raise RedisUnavailable("Redis unavailable: cannot read tokens")
        if d.reset_after_ns >= self._tau_ns:
            return 0.0
        return (self._tau_us - d.reset_after_ns // NS_PER_US) / self._interval_us

    def _new_params(
        self, rate: RateArg | None, capacity: int | None, migrate: object
    ) -> tuple[Any, int, int]:
        """The parameters `reconfigure` moves to, checked before anything changes."""
        rate = self._rate if rate is None else rate
        params = _redis_params(rate, kept_capacity(rate, capacity, self._capacity))
        if not isinstance(migrate, bool):
            raise TypeError(f"migrate must be a bool, not {type(migrate).__name__}")
        return params

    def _new_tat(
        self, raw: bytes, now_us: int, params: tuple[Any, int, int], slack_ms: int
    ) -> tuple[bytes, int] | None:
        """*raw* re-expressed under *params*: ``(value or b"" for full, TTL ms)``, or
        None to leave it (full, or not a bucket). The in-process carry-over in ns,
        the new debt rounded up to whole us (never a fraction of a token gained)."""
        try:
            tat = int(raw)
        except ValueError:
            return None
        if not 0 <= tat <= (1 << 53) - 1 or tat <= now_us:
            return None  # not a bucket (an empty one until replaced), or full: stays full
        interval, tau = self._interval_ns, self._tau_ns
        new_interval = params[2] * NS_PER_US
        new_tau = params[1] * new_interval
        debt = (tat - now_us) * NS_PER_US
        new_debt = new_tau - ((tau - debt) * new_interval) // interval
        if new_debt <= 0:
            return b"", 0
        debt_us = -(-new_debt // NS_PER_US)
        return str(now_us + debt_us).encode(), debt_us // 1000 + 1 + slack_ms

    def _migrate_key(
        self, client: Any, carry: Any, rkey: bytes, params: tuple[Any, int, int], now: int | None
    ) -> Steps:
        """Carry one stored bucket over to *params*'s key space (see `reconfigure`; steps:
        see `drive`). The old bucket stays as it is, for limiters still on the old limit."""
        if now is None:
            pipe = client.pipeline(transaction=False)
            (secs, us), raw = yield pipe.time().get(rkey).execute()
            now_us, slack = int(secs) * 1_000_000 + int(us), 0
        else:
            now_us, slack = now // NS_PER_US, EXPLICIT_TTL_SLACK_MS
            raw = yield client.get(rkey)
        new = None if raw is None else self._new_tat(raw, now_us, params, slack)
        if new is not None and new[0]:  # a debt to carry (a full bucket carries nothing)
            target = _prefix.space(self._prefix, params[2], params[1]) + rkey[len(self._space) :]
            yield carry(keys=(target,), args=new)

    def _pattern(self) -> bytes:
        # SCAN's glob: every byte of this limit's key space literal, then the key.
        return b"".join(b"\\" + bytes([c]) for c in self._space) + b"*"


def _late() -> RedisTimeoutError:
    """The error of a decision past its deadline (its reason: ``"timeout"``)."""
    return RedisTimeoutError("Timeout: no reply within the limiter's timeout")


async def _sleep_reserved(
    limiter: Any, wait: int, give_back: Callable[[], Awaitable[object]]
) -> bool:
    """Sleep out a reservation of *wait* ns on the loop; a cancelled sleep gives it back."""
    if wait <= 0:
        return wait == 0
    if not _acquire.enter_default(limiter):  # the bound on waiters, as in process
        await give_back()
        return False
    try:
        await asyncio.sleep(wait / NS_PER_S)
    except BaseException:
        # Shielded: cancelled again meanwhile, the give-back still finishes.
        with contextlib.suppress(RedisUnavailable):
            await asyncio.shield(asyncio.ensure_future(give_back()))
        raise
    finally:
        _acquire.leave_default(limiter)
    return True

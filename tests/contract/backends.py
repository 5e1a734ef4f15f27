"""The limiters of the contract, one `Backend` entry each, and the `Subject` every test drives.

Every entry builds its limiter with `RATE` and `CAPACITY` (one token every
100 ms, a whole number of microseconds as Redis needs) and, where it takes
one, a clock standing at `T0`, the explicit time the tests start from. Its
``features`` say which properties apply (each test names the ones it needs:
``@pytest.mark.applies(...)``), and its ``protocols`` which of
`nanobucket._core._limiter`'s protocols it offers; `test_protocols` checks both
against the limiter itself, so the matrix cannot drift from the code.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import os
import secrets
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

import nanobucket as nb
from nanobucket import redis as nbr
from nanobucket._core import _bucket_py
from nanobucket._core._limiter import (
    Clocked,
    Composite,
    KeyedLimiter,
    Limiter,
    Refundable,
    Reservable,
)
from nanobucket.shared import SharedKeyedTokenBucket

from conftest import NEEDS_SHARED_TABLE

try:
    from nanobucket._core import _bucket_c
except ImportError:  # pragma: no cover - a pure-Python install
    _bucket_c = None  # type: ignore[assignment]

S = 1_000_000_000
MS = 1_000_000
US = 1_000
RATE = 10  # tokens per second: one every T
CAPACITY = 5
T = S // RATE  # 100 ms
T0 = 10**15  # ns: the explicit time every test starts from, well past 0, whole microseconds
K = "alice"  # the key a test uses when it needs one
#: How long a Redis call may wait (a loaded test machine is slow; nothing here times out).
REDIS_TIMEOUT = 2.0

# -- features: which properties apply ---------------------------------------------
KEYED = "keyed"  # the verbs take the key first
TOKENS = "tokens"  # a token bucket (tokens refill at RATE), not an in-flight limit
EXACT = "exact"  # every Decision field is the documented one (else: see LEASED)
PEEK = "peek"  # peek / peek_at
BATCH = "batch"  # allow_many / allow_many_at
RESERVE = "reserve"  # the Reservable verb
RESERVATION = "reservation"  # reservation(): reserve as a Reservation (a synchronous limiter)
REFUND = "refund"  # refund / refund_at
RESET = "reset"
RECONFIGURE = "reconfigure"

# -- families: where the documented behaviour differs ------------------------------
MEMORY = "memory"  # the in-process buckets and tables (and composites of them)
SHARED = "shared"  # the shared-memory table: keys are str, bytes or int
REDIS = "redis"  # Redis: keys are str, bytes or int, as bytes; a full bucket is no key
LEASED = "leased"  # Redis through a local lease: remaining is the lease's balance
INFLIGHT = "inflight"  # Concurrency / KeyedConcurrency: slots, no refill

PROTOCOLS = (Reservable, Refundable, Clocked, Composite)


async def settle(value: Any) -> Any:
    """A sync verb's result as it is; an asyncio verb's, awaited."""
    return await value if inspect.isawaitable(value) else value


def fields(d: Any) -> tuple[Any, ...]:
    """A decision's five fields, in the order `nanobucket.Decision` takes them."""
    return (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)


def frozen_clock() -> int:
    """The clock of the in-process limiters: it stands at `T0` (their ``allow()`` is exact)."""
    return T0


class Subject:
    """One limiter under test, with the verbs at explicit times, each awaited if asyncio.

    Keys go to a keyed limiter's verbs and are dropped for an unkeyed one (all
    keys are then its one bucket). `state` is the bucket as a cost-0 peek
    shows it; for the leased limiter, which has no ``peek``, a
    ``RedisTokenBucket`` on the same prefix (the same state) shows it.
    """

    def __init__(
        self,
        backend: Backend,
        limiter: Any,
        *,
        observer: Any = None,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.backend = backend
        self.limiter = limiter
        self._observer = limiter if observer is None else observer
        self._close = close

    def key(self, key: Hashable) -> tuple[Hashable, ...]:
        """The key arguments of a verb: ``(key,)``, or none for an unkeyed limiter."""
        return (key,) if self.backend.keyed else ()

    async def allow(self, key: Hashable, now: int, cost: Any = 1) -> bool:
        result: bool = await settle(self.limiter.allow_at(*self.key(key), now, cost))
        return result

    async def check(self, key: Hashable, now: int, cost: Any = 1) -> Any:
        return await settle(self.limiter.check_at(*self.key(key), now, cost))

    async def peek(self, key: Hashable, now: int, cost: Any = 1) -> Any:
        return await settle(self.limiter.peek_at(*self.key(key), now, cost))

    async def state(self, key: Hashable, now: int) -> tuple[Any, ...]:
        """The fields of a cost-0 peek at *now*: what the bucket holds, spending nothing."""
        return fields(await settle(self._observer.peek_at(*self.key(key), now, 0)))

    async def many(self, keys: Iterable[Hashable], now: int, cost: Any = 1) -> bytearray:
        result: bytearray = await settle(self.limiter.allow_many_at(keys, now, cost))
        return result

    async def reserve(
        self, key: Hashable, *, cost: Any = 1, max_wait_ns: Any = 0, now: Any, shape: Any = False
    ) -> int:
        wait: int = await settle(
            self.limiter.reserve(
                *self.key(key), cost=cost, max_wait_ns=max_wait_ns, shape=shape, now=now
            )
        )
        return wait

    def reservation(
        self, key: Hashable, *, cost: Any = 1, max_wait_ns: Any = 0, now: Any
    ) -> nb.Reservation:
        """The limiter's own ``reservation(...)`` (a synchronous limiter's)."""
        r: nb.Reservation = self.limiter.reservation(
            *self.key(key), cost=cost, max_wait_ns=max_wait_ns, now=now
        )
        return r

    async def refund(self, key: Hashable, now: int, cost: Any = 1) -> Any:
        return await settle(self.limiter.refund_at(*self.key(key), now, cost))

    async def reset(self, key: Hashable) -> Any:
        return await settle(self.limiter.reset(*self.key(key)))

    async def reconfigure(self, *, now: int, **params: int) -> None:
        await settle(self.limiter.reconfigure(now=now, **params))
        if self._observer is not self.limiter:  # it reads the same state: new terms, no migration
            self._observer.reconfigure(migrate=False, **params)

    async def drain(self, key: Hashable, now: int) -> int:
        """Requests of cost 1 admitted at *now* until the first refusal (at most 100)."""
        admitted = 0
        while admitted < 100 and await self.allow(key, now):
            admitted += 1
        return admitted

    async def close(self) -> None:
        if self._close is not None:
            await self._close()


@dataclass(frozen=True)
class Env:
    """What the builders need from the session: the Redis server, when one runs."""

    redis_url: str = ""
    redis_port: int = 0

    def prefix(self, name: str) -> str:
        """A Redis key prefix of this build alone (the server lives for the session).

        From `secrets`: hypothesis seeds `random` alike for every example.
        """
        return f"contract-{name}-{secrets.token_hex(6)}"


Build = Callable[["Backend", Env], Awaitable[Subject]]


@dataclass(frozen=True)
class Backend:
    """One entry of the contract: how to build the limiter, and what it offers."""

    name: str
    family: str
    build: Build  # called in the test's event loop (asyncio clients belong to one loop)
    features: frozenset[str]
    protocols: frozenset[type]
    asyncio: bool = False
    needs_redis: bool = False
    marks: tuple[Any, ...] = ()
    #: The class its decisions are instances of (the pure-Python twin has its own).
    decision_type: type[Any] = nb.Decision

    @property
    def keyed(self) -> bool:
        return KEYED in self.features

    def has(self, *features: str) -> bool:
        return set(features) <= self.features


class Case:
    """A `Backend` in this session: `run` builds a fresh limiter and awaits a test body on it."""

    def __init__(self, backend: Backend, env: Env) -> None:
        self.backend = backend
        self.env = env

    def run(self, body: Callable[[Subject], Awaitable[None]]) -> None:
        asyncio.run(self._main(body))

    async def _main(self, body: Callable[[Subject], Awaitable[None]]) -> None:
        subject = await self.backend.build(self.backend, self.env)
        try:
            await body(subject)
        finally:
            await subject.close()


# -- the builders -------------------------------------------------------------------


def _in_process(make: Callable[[], Any]) -> Build:
    async def build(backend: Backend, env: Env) -> Subject:
        return Subject(backend, make())

    return build


async def _shared(backend: Backend, env: Env) -> Subject:
    table = SharedKeyedTokenBucket.create_anonymous(
        rate=RATE, capacity=CAPACITY, max_keys=64, clock=frozen_clock
    )

    async def close() -> None:
        table.close()

    return Subject(backend, table, close=close)


def _redis_client(env: Env) -> Any:
    return nbr.client_from_url(env.redis_url, socket_timeout=REDIS_TIMEOUT)


def _async_redis_client(env: Env) -> Any:
    return nbr.client_from_url(env.redis_url, socket_timeout=REDIS_TIMEOUT, asyncio=True)


def _valkey_client(env: Env, asyncio: bool) -> Any:
    import valkey
    import valkey.asyncio

    cls = valkey.asyncio.Valkey if asyncio else valkey.Valkey
    return cls(host="127.0.0.1", port=env.redis_port)  # valkey-py's defaults: the limiter bounds


def _sync_redis(client_of: Callable[[Env], Any]) -> Build:
    async def build(backend: Backend, env: Env) -> Subject:
        client = client_of(env)
        limiter = nbr.RedisTokenBucket(
            client, RATE, CAPACITY, prefix=env.prefix(backend.name), timeout=REDIS_TIMEOUT
        )

        async def close() -> None:
            limiter.close()
            client.close()

        return Subject(backend, limiter, close=close)

    return build


def _async_redis(client_of: Callable[[Env], Any]) -> Build:
    async def build(backend: Backend, env: Env) -> Subject:
        limiter = nbr.AsyncRedisTokenBucket(
            client_of(env), RATE, CAPACITY, prefix=env.prefix(backend.name), timeout=REDIS_TIMEOUT
        )
        return Subject(backend, limiter, close=limiter.aclose)

    return build


async def _leased(backend: Backend, env: Env) -> Subject:
    # Leases of one token: every admission is Redis's own, so the decisions are
    # exact but for ``remaining`` (the lease's balance, 0).
    client = _redis_client(env)
    prefix = env.prefix(backend.name)
    limiter = nbr.LeasedTokenBucket(
        client, RATE, CAPACITY, prefix=prefix, min_lease=1, max_lease=1, timeout=REDIS_TIMEOUT
    )
    observer = nbr.RedisTokenBucket(client, RATE, CAPACITY, prefix=prefix, timeout=REDIS_TIMEOUT)

    async def close() -> None:
        limiter.close()
        client.close()

    return Subject(backend, limiter, observer=observer, close=close)


#: A penalty box's strikes in the contract: more than any test is refused, so none is banned
#: (its bans are tests/test_penalty.py's): every decision is its limiter's.
PENALTY: dict[str, Any] = {"strikes": 10**6, "within": 1, "ban": 900}


async def _penalty_shared(backend: Backend, env: Env) -> Subject:
    inner = await _shared(backend, env)
    box = nb.penalty_box(inner.limiter, **PENALTY)

    async def close() -> None:
        for table in (box.strikes, box.bans, inner.limiter):
            table.close()

    return Subject(backend, box, close=close)


def _penalty_redis(asyncio: bool) -> Build:
    make = _async_redis(_async_redis_client) if asyncio else _sync_redis(_redis_client)

    async def build(backend: Backend, env: Env) -> Subject:
        inner = await make(backend, env)
        box = nb.penalty_box(inner.limiter, prefix=env.prefix(backend.name), **PENALTY)

        async def close() -> None:
            for table in (box.strikes, box.bans):
                await settle(table.aclose() if asyncio else table.close())
            await inner.close()

        return Subject(backend, box, close=close)

    return build


def _table() -> Any:
    return nb.KeyedTokenBucket(rate=RATE, capacity=CAPACITY, clock=frozen_clock)


def _tiered_two_plans() -> Any:
    # Every key is on "std"; "big" is there so that a key's first request is
    # carried from another plan (full: nothing to carry), as with real plans.
    big = nb.KeyedTokenBucket(rate=4 * RATE, capacity=4 * CAPACITY, clock=frozen_clock)
    return nb.tiered({"std": _table(), "big": big}, tier=lambda key: "std")


# -- the entries: a new backend joins with one more ----------------------------------

_C = pytest.mark.c_extension
_NO_C = pytest.mark.skipif(
    _bucket_c is None and not os.environ.get("CI"), reason="the Cython extension is not built"
)
_HAS_VALKEY = importlib.util.find_spec("valkey") is not None

_TABLE = frozenset(
    {KEYED, TOKENS, EXACT, PEEK, BATCH, RESERVE, RESERVATION, REFUND, RESET, RECONFIGURE}
)
_BUCKET = _TABLE - {KEYED, BATCH}
_PENALTY = _TABLE - {RESERVE, RESERVATION, RESET, RECONFIGURE}
_REDIS = _TABLE
_ASYNC_REDIS = _TABLE - {RESERVATION}
_KEYED_PROTOCOLS = frozenset({KeyedLimiter, Reservable, Refundable})


def _backends() -> list[Backend]:
    c = _bucket_c  # built only when the extension is (its entries are skipped otherwise)
    entries = [
        Backend(
            "c",
            MEMORY,
            _in_process(lambda: c.KeyedTokenBucket(RATE, CAPACITY, clock=frozen_clock)),
            _TABLE,
            _KEYED_PROTOCOLS | {Clocked},
            marks=(_C, _NO_C),
        ),
        Backend(
            "py",
            MEMORY,
            _in_process(lambda: _bucket_py.KeyedTokenBucket(RATE, CAPACITY, clock=frozen_clock)),
            _TABLE,
            _KEYED_PROTOCOLS | {Clocked},
            decision_type=_bucket_py.Decision,
        ),
        Backend(
            "shared",
            SHARED,
            _shared,
            _TABLE - {RESET, RECONFIGURE},
            _KEYED_PROTOCOLS,
            marks=tuple(NEEDS_SHARED_TABLE),
        ),
        Backend(
            "redis",
            REDIS,
            _sync_redis(_redis_client),
            _REDIS,
            _KEYED_PROTOCOLS,
            needs_redis=True,
        ),
        Backend(
            "redis-async",
            REDIS,
            _async_redis(_async_redis_client),
            _ASYNC_REDIS,
            _KEYED_PROTOCOLS,
            asyncio=True,
            needs_redis=True,
        ),
    ]
    if _HAS_VALKEY:
        entries += [
            Backend(
                "valkey",
                REDIS,
                _sync_redis(lambda env: _valkey_client(env, asyncio=False)),
                _REDIS,
                _KEYED_PROTOCOLS,
                needs_redis=True,
            ),
            Backend(
                "valkey-async",
                REDIS,
                _async_redis(lambda env: _valkey_client(env, asyncio=True)),
                _ASYNC_REDIS,
                _KEYED_PROTOCOLS,
                asyncio=True,
                needs_redis=True,
            ),
        ]
    entries += [
        Backend(
            "leased",
            LEASED,
            _leased,
            _TABLE - {EXACT, PEEK, BATCH},
            frozenset({Reservable, Refundable}),  # no peek: no KeyedLimiter
            needs_redis=True,
        ),
        Backend(
            "tiered",
            MEMORY,
            _in_process(lambda: nb.tiered({"std": _table()}, tier=lambda key: "std")),
            _TABLE - {RECONFIGURE},
            _KEYED_PROTOCOLS | {Composite},
        ),
        Backend(
            "tiered-2",
            MEMORY,
            _in_process(_tiered_two_plans),
            _TABLE - {RECONFIGURE},
            _KEYED_PROTOCOLS | {Composite},
        ),
        Backend(
            "all_of",
            MEMORY,
            _in_process(lambda: nb.all_of(_table())),
            _TABLE - {BATCH, RESET, RECONFIGURE},
            _KEYED_PROTOCOLS | {Composite},
        ),
        Backend(
            "penalty",
            MEMORY,
            _in_process(lambda: nb.penalty_box(_table(), **PENALTY)),
            _PENALTY,
            frozenset({KeyedLimiter, Refundable}),
        ),
        Backend(
            "penalty-shared",
            SHARED,
            _penalty_shared,
            _PENALTY,
            frozenset({KeyedLimiter, Refundable}),
            marks=tuple(NEEDS_SHARED_TABLE),
        ),
        Backend(
            "penalty-redis",
            REDIS,
            _penalty_redis(asyncio=False),
            _PENALTY,
            frozenset({KeyedLimiter, Refundable}),
            needs_redis=True,
        ),
        Backend(
            "penalty-redis-async",
            REDIS,
            _penalty_redis(asyncio=True),
            _PENALTY,
            frozenset({KeyedLimiter, Refundable}),
            asyncio=True,
            needs_redis=True,
        ),
        Backend(
            "bucket-c",
            MEMORY,
            _in_process(lambda: c.TokenBucket(RATE, CAPACITY, clock=frozen_clock)),
            _BUCKET,
            frozenset({Limiter, Reservable, Refundable, Clocked}),
            marks=(_C, _NO_C),
        ),
        Backend(
            "bucket-py",
            MEMORY,
            _in_process(lambda: _bucket_py.TokenBucket(RATE, CAPACITY, clock=frozen_clock)),
            _BUCKET,
            frozenset({Limiter, Reservable, Refundable, Clocked}),
            decision_type=_bucket_py.Decision,
        ),
        Backend(
            "concurrency",
            INFLIGHT,
            _in_process(lambda: nb.Concurrency(CAPACITY)),
            frozenset({EXACT, PEEK, REFUND}),
            frozenset({Limiter, Refundable}),
        ),
        Backend(
            "keyed-concurrency",
            INFLIGHT,
            _in_process(lambda: nb.KeyedConcurrency(CAPACITY)),
            frozenset({KEYED, EXACT, PEEK, REFUND}),
            frozenset({KeyedLimiter, Refundable}),
        ),
    ]
    return entries


BACKENDS: list[Backend] = _backends()

"""Token buckets shared through Redis: one limit across many machines.

Each decision is one Lua script (``lua/gcra.lua``) run by Redis: the same
GCRA as the in-process table, one ``tat`` per key, so a rejected request
writes nothing and a full bucket is a missing key (``SET ... PX`` makes the
key expire when its bucket is full again, so idle clients cost nothing).

Units. Lua numbers are doubles, exact only below 2**53, so Redis keeps time
in **microseconds**: ``interval_us = ceil(1e6 / rate)``. That rounding is
conservative (the bucket refills a hair slower, never faster) and costs at
most 1 us per token: a relative rate error below ``rate / 1e6`` (0.1 % at
1000/s, 1e-6 at 1/s; rates whose ``1e6 / rate`` is whole, such as 1, 4, 100,
1000/s, are exact) and caps the usable rate at 1e6 tokens/s per key. By
default time is the Redis server's ``TIME``, so clients with skewed clocks
share one limit. The ``*_at`` forms take an explicit ``now`` in int ns (for
tests and replays) and pass ``now // 1000`` us to Redis (floor: a partial
microsecond never counts, conservative); their returned times are us * 1000.
With times that are whole microseconds and a whole-microsecond interval, a
trace gives the very same decisions as :class:`nanobucket.KeyedTokenBucket`.

Keys are ``b"<prefix>:<interval_us>:<capacity>:{<key>}"``: each limit on a
prefix has a key space of its own, so limiters of two limits (the old and the
new release of a rolling deploy) each decide exactly under their own, and a
key starts full once under a new limit. The user key is the Redis Cluster hash
tag, so every limit on one key (different prefixes, one layered decision)
lives in one slot. Keys may be ``str``, ``bytes`` or ``int`` (``1`` and ``"1"``
are the same bucket).

No call waits longer than the limiter's ``timeout`` (0.1 s by default),
whatever client it is given: the limiter talks to the client's server through
a connection pool of its own, with the client's connection parameters but
``timeout`` as socket and connect timeout and no retries (redis-py's default
client retries with back-off, which would hold a request for seconds on a
dead Redis and for a minute on a hung one). A client already built that way
(:func:`client_from_url`) is used as it is. A ``RedisCluster`` gets a cluster
client of its own to the same nodes, bounded the same way (redis-py's retries
10 times, refreshing the topology each time). valkey-py's clients, plain and
cluster, sync and asyncio, are taken like redis-py's (:func:`bounded_client`);
their errors are "cannot decide" and get the same reasons. The sync
limiters send their script calls on connections of their own, made as the
client's, past redis-py's command layer (about a quarter of the client CPU);
a cluster, RESP3, client-side caching or connection class of another kind
goes through redis-py.

When Redis cannot decide, the failure policy decides: ``on_error="local"``
(the default) has a :class:`nanobucket.KeyedTokenBucket` of the limiter's
own rate and capacity decide in this process (so N processes admit at most
N times the limit), ``"open"`` admits, ``"closed"`` rejects, ``"raise"``
raises :class:`RedisUnavailable`; a ``fallback`` limiter (any object with
``check``/``check_at``/``peek``/``peek_at``/``allow_many``/``allow_many_at``
taking the key first, e.g. a :class:`nanobucket.KeyedTokenBucket` with
``rate / instances``) decides instead of the policy when given. An outage
is logged once (logger ``"nanobucket"``), and what the local table or the
fallback admitted during it is charged to each key's Redis bucket when
Redis answers again (down to empty, never into debt), so windows spanning
outages keep ``capacity + rate * T`` in each process. "Cannot
decide" is every error redis-py raises: refused, timed out, ``LOADING``,
``BUSY`` (a long script), ``OOM`` (maxmemory with noeviction), ``READONLY`` (a
replica), ``MASTERDOWN``, ``CLUSTERDOWN``, ``TRYAGAIN``, ``MOVED``/``ASK``,
an error reply of any kind. A :class:`CircuitBreaker` counts each and stops
calling a failing Redis for a back-off that doubles on every failed probe, so
only the first call pays the timeout. Every :class:`RedisDecision` says who
decided in ``source`` and why Redis did not in ``reason``.

A key of the limiter's prefix that holds no bucket (another type, a string
that is not a number, ``inf``, ``nan``, a negative or huge number) is an
empty bucket: refused until it refills, and replaced by a real bucket on the
first consuming call. Never an error, never a token it did not have.

>>> import nanobucket.redis as nbr
>>> limiter = nbr.RedisTokenBucket.from_url("redis://127.0.0.1:6379", rate=100, capacity=200)
>>> limiter.allow("client-42")                                 # doctest: +SKIP
True

The examples of this package's classes need no Redis: they use ``down``, a
breaker that has just seen Redis fail, so no call reaches the network and the
failure policy (or the fallback) decides; and they take ``redis``,
``asyncio``, ``KeyedTokenBucket`` and this package's names as imported:

>>> down = nbr.CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
>>> nbr.RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down).check("a").source
'policy:open'
"""

from __future__ import annotations

from typing import Any

# The names users, tests and benchmarks import from nanobucket.redis (as X: re-exported).
from . import _clients
from ._async import AsyncRedisTokenBucket as AsyncRedisTokenBucket
from ._bounded import DEFAULT_SOCKET_TIMEOUT as DEFAULT_SOCKET_TIMEOUT
from ._bounded import _retries as _retries
from ._bounded import bounded_client as bounded_client
from ._bounded import client_from_url as client_from_url
from ._breaker import CircuitBreaker as CircuitBreaker
from ._lease import LeasedTokenBucket as LeasedTokenBucket
from ._limits import _GCRA as _GCRA
from ._limits import _GCRA_BATCH as _GCRA_BATCH
from ._limits import _GCRA_MANY as _GCRA_MANY
from ._limits import EXPLICIT_TTL_SLACK_MS as EXPLICIT_TTL_SLACK_MS
from ._limits import TAU_US_MAX as TAU_US_MAX
from ._policy import Fallback as Fallback
from ._policy import Policy as Policy
from ._policy import RedisDecision as RedisDecision
from ._policy import RedisUnavailable as RedisUnavailable
from ._policy import Source as Source
from ._policy import failure_reason as failure_reason
from ._prefix import PrefixConflict as PrefixConflict
from ._sync import RedisTokenBucket as RedisTokenBucket

__all__ = (
    "AsyncRedisTokenBucket",
    "CircuitBreaker",
    "LeasedTokenBucket",
    "PrefixConflict",
    "RedisDecision",
    "RedisTokenBucket",
    "RedisUnavailable",
)


def __getattr__(name: str) -> Any:
    # UNAVAILABLE grows when a limiter is first given a valkey-py client:
    # read it where it lives, not a copy made at import.
    if name == "UNAVAILABLE":
        return _clients.UNAVAILABLE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Two limits on one prefix: each limiter decides exactly under its own, with no step by hand.

Against a real redis-server, at explicit times (``*_at``): the limiters of a
rolling deploy, release N (rate 1/s, capacity 4) and release N+1 (rate 2/s,
capacity 8), serve at once on one prefix; each keeps its own buckets
(``<prefix>:<interval_us>:<capacity>:{<key>}``), so neither reads the other's,
and a key starts full once under the new limit.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any

import pytest

from nanobucket import redis as nbr

S = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * S  # explicit times: decisions do not depend on how long the test takes
TIMEOUT = 2.0  # generous: these tests are about the buckets, not about time
OLD = (1, 4)  # release N: rate 1/s, capacity 4
NEW = (2, 8)  # release N+1: rate 2/s, capacity 8


def _fresh() -> str:
    return f"prefix-{secrets.token_hex(6)}"


@pytest.fixture
def client(redis_url: str) -> Any:
    c = nbr.client_from_url(redis_url, socket_timeout=TIMEOUT)
    yield c
    c.close()


def _sync(client: Any, limit: tuple[int, int], prefix: str) -> nbr.RedisTokenBucket:
    return nbr.RedisTokenBucket(client, *limit, prefix=prefix, timeout=TIMEOUT)


def _interleave(old: Callable[[int], bool], new: Callable[[int], bool]) -> tuple[int, int]:
    """Admitted of 10 old and 10 new decisions, alternating, at T0 then at T0 + 1 s."""
    admitted = []
    for now in (T0, T0 + S):
        results = [(old(now), new(now)) for _ in range(10)]
        admitted.append((sum(r[0] for r in results), sum(r[1] for r in results)))
    # Each full at first under its own limit, then refilled by its own rate.
    assert admitted == [(4, 8), (1, 2)]
    return admitted[0]


def test_an_old_and_a_new_limit_on_one_prefix_each_decide_exactly(client: Any) -> None:
    prefix = _fresh()
    # The record a limiter of an earlier version left (another limit): it changes nothing.
    client.set(f"{prefix}:params", b"20000 1000000")
    old, new = _sync(client, OLD, prefix), _sync(client, NEW, prefix)
    _interleave(lambda now: old.allow_at("alice", now), lambda now: new.allow_at("alice", now))
    assert old.key("alice") == f"{prefix}:1000000:4:{{alice}}".encode()
    assert new.key("alice") == f"{prefix}:500000:8:{{alice}}".encode()
    # Batches and reads take their own limit's buckets too.
    assert old.allow_many_at(["alice", "bob"], T0 + S) == bytearray([0, 1])
    assert new.allow_many_at(["alice", "bob"], T0 + S) == bytearray([0, 1])
    assert (old.tokens_at("bob", T0 + S), new.tokens_at("bob", T0 + S)) == (3.0, 7.0)
    assert client.get(f"{prefix}:params") == b"20000 1000000"  # neither wrote a record


def test_a_leased_and_an_asyncio_limiter_keep_to_their_own_limit(
    client: Any, redis_url: str
) -> None:
    prefix = _fresh()
    old = nbr.LeasedTokenBucket(client, *OLD, prefix=prefix, max_lease=1, timeout=TIMEOUT)

    async def main() -> None:
        new = nbr.AsyncRedisTokenBucket.from_url(
            redis_url, *NEW, prefix=prefix, socket_timeout=TIMEOUT
        )
        admitted = []
        for now in (T0, T0 + S):
            results = [
                (old.allow_at("alice", now), await new.allow_at("alice", now)) for _ in range(10)
            ]
            admitted.append((sum(r[0] for r in results), sum(r[1] for r in results)))
        assert admitted == [(4, 8), (1, 2)]
        # Coalesced decisions of the asyncio limiter: the same bucket.
        assert await asyncio.gather(*(new.allow_at("bob", T0) for _ in range(9))) == [True] * 8 + [
            False
        ]
        await new.aclose()

    asyncio.run(main())
    old.close()


def test_a_limiter_of_one_limit_reads_the_buckets_of_its_limit_only(client: Any) -> None:
    # Three instances: two on the old limit share every bucket, the new one has its own.
    prefix = _fresh()
    a, b, new = _sync(client, OLD, prefix), _sync(client, OLD, prefix), _sync(client, NEW, prefix)
    turns = [limiter.allow_at("alice", T0) for _ in range(3) for limiter in (a, b)]
    assert turns == [True] * 4 + [False] * 2
    assert new.check_at("alice", T0).remaining == 7


def test_reconfigure_carries_the_buckets_over_and_leaves_the_old_ones(client: Any) -> None:
    prefix = _fresh()
    mover, staying = _sync(client, OLD, prefix), _sync(client, OLD, prefix)
    assert mover.allow_at("alice", T0, cost=3)  # 1 token of 4 left
    assert mover.allow_at("bob", T0, cost=1)  # 3 of 4 left
    started_new = _sync(client, NEW, prefix)
    assert started_new.allow_at("bob", T0, cost=6)  # 2 of 8 left under the new limit already
    mover.reconfigure(*NEW, now=T0)  # migrate=True, the default
    # The tokens held carry over as they are; a bucket the new limit spent keeps the stricter.
    assert (mover.tokens_at("alice", T0), started_new.tokens_at("alice", T0)) == (1.0, 1.0)
    assert mover.tokens_at("bob", T0) == 2.0
    assert mover.tokens_at("carol", T0) == 8.0  # full: stays full
    # The instance still on the old limit keeps its own buckets, untouched.
    assert [staying.allow_at("alice", T0) for _ in range(2)] == [True, False]
    assert mover.tokens_at("alice", T0) == 1.0
    # Back to the old limit without migrating: the old buckets as the old limit left them.
    mover.reconfigure(*OLD, migrate=False)
    assert mover.tokens_at("alice", T0) == 0.0


def test_reconfigure_without_migrate_starts_the_new_limit_full(client: Any) -> None:
    prefix = _fresh()
    limiter = _sync(client, OLD, prefix)
    assert limiter.allow_at("alice", T0, cost=4)
    limiter.reconfigure(*NEW, migrate=False)
    assert [limiter.allow_at("alice", T0) for _ in range(9)] == [True] * 8 + [False]
    limiter.reconfigure(*NEW, now=T0)  # the same limit: nothing to carry, nothing changes
    assert limiter.tokens_at("alice", T0) == 0.0


def test_asyncio_reconfigure_carries_over_alike(client: Any, redis_url: str) -> None:
    prefix = _fresh()

    async def main() -> None:
        limiter = nbr.AsyncRedisTokenBucket.from_url(
            redis_url, *OLD, prefix=prefix, socket_timeout=TIMEOUT
        )
        assert await limiter.allow_at("alice", T0, cost=3)
        await limiter.reconfigure(*NEW, now=T0)
        assert await limiter.tokens_at("alice", T0) == 1.0
        await limiter.aclose()

    asyncio.run(main())
    assert _sync(client, NEW, prefix).tokens_at("alice", T0) == 1.0
    assert _sync(client, OLD, prefix).tokens_at("alice", T0) == 1.0  # left for the old limit


def test_the_conflict_error_is_still_importable() -> None:
    # Code written to catch it keeps importing; nothing raises it.
    assert issubclass(nbr.PrefixConflict, ValueError)


def test_carrying_over_never_replaces_a_key_that_holds_no_bucket(client: Any) -> None:
    # Such a key is an empty bucket (refused until replaced by a decision): nothing
    # carried over is stricter, so it stays, and migrating raises nothing.
    prefix = _fresh()
    limiter, new = _sync(client, OLD, prefix), _sync(client, NEW, prefix)
    assert limiter.allow_at("alice", T0) and limiter.allow_at("bob", T0)
    client.set(new.key("alice"), b"not a number")
    client.rpush(new.key("bob"), b"a list")
    limiter.reconfigure(*NEW, now=T0)
    assert (client.get(new.key("alice")), client.type(new.key("bob"))) == (b"not a number", b"list")
    assert (limiter.tokens_at("alice", T0), limiter.tokens_at("bob", T0)) == (0.0, 0.0)

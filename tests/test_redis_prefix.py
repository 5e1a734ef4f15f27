"""One limit per prefix: a Redis limiter refuses a prefix that holds another limit's buckets.

Against a real redis-server: the first limiter records its terms under
``<prefix>:params``, the others compare theirs before their first decision.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest

from nanobucket import redis as nbr
from nanobucket.redis import _prefix

from redis_server import RedisServer, threads_within

TIMEOUT = 2.0  # generous: these tests are about the check, not about time


def _fresh() -> str:
    return f"prefix-{secrets.token_hex(6)}"


def _conflict(prefix: str, there: str, here: str) -> str:
    return (
        f"prefix {prefix!r} in Redis holds the buckets of another limit ({there}, in "
        f"{(prefix + ':params').encode()!r}), not this limiter's ({here}): limiters with "
        f"different limits must not share a prefix. Give this one a prefix of its own "
        f"(prefix=...), or, to change the limit of every limiter on {prefix!r}, call "
        f"reconfigure(rate=..., capacity=..., migrate=True) on one of the stored limit"
    )


def _sync(url: str, rate: int, capacity: int, prefix: str, **kwargs: Any) -> nbr.RedisTokenBucket:
    return nbr.RedisTokenBucket.from_url(
        url, rate, capacity, prefix=prefix, socket_timeout=TIMEOUT, **kwargs
    )


def test_a_second_limit_on_a_prefix_is_refused_at_its_first_decision(redis_url: str) -> None:
    prefix = _fresh()
    first = _sync(redis_url, 100, 200, prefix)
    assert first.allow("alice")  # records "10000 2000000" under <prefix>:params
    admin = first.client
    assert admin.get(f"{prefix}:params") == b"10000 2000000"
    assert not isinstance(first._script, _prefix.Checked)  # checked once: plain scripts now
    other = _sync(redis_url, 50, 50, prefix)
    for call in (lambda: other.allow("alice"), lambda: other.allow_many(["a", "b"])):
        with pytest.raises(nbr.PrefixConflict) as info:
            call()
        assert str(info.value) == _conflict(
            prefix, "rate 100/s, capacity 200", "rate 50/s, capacity 50"
        )
    assert first.tokens("alice") > 198  # the refused limiter spent nothing
    # With a prefix of its own it works, and LeasedTokenBucket is held to the same rule.
    assert _sync(redis_url, 50, 50, _fresh()).allow("alice")
    leased = nbr.LeasedTokenBucket(admin, 100, 100, prefix=prefix, timeout=TIMEOUT)
    with pytest.raises(nbr.PrefixConflict, match="rate 100/s, capacity 100"):
        leased.allow("alice")
    for limiter in (first, other, leased):
        limiter.close()


def test_limiters_starting_together_with_one_limit_all_pass(redis_url: str) -> None:
    prefix = _fresh()
    limiters = [_sync(redis_url, 100, 200, prefix) for _ in range(8)]
    results = threads_within(8, lambda i: limiters[i].allow(f"k{i}"), 10.0)
    assert results == [True] * 8
    assert limiters[0].client.get(f"{prefix}:params") == b"10000 2000000"


def test_asyncio_refuses_alike(redis_url: str) -> None:
    prefix = _fresh()
    _sync(redis_url, 100, 200, prefix).allow("alice")

    async def main() -> None:
        limiter = nbr.AsyncRedisTokenBucket.from_url(
            redis_url, 10, 20, prefix=prefix, socket_timeout=TIMEOUT
        )
        # Alone, and coalesced: every caller of the batch gets the error.
        results = await asyncio.gather(
            *(limiter.allow(f"k{i}") for i in range(5)), return_exceptions=True
        )
        assert [type(r) for r in results] == [nbr.PrefixConflict] * 5
        assert str(results[0]) == _conflict(
            prefix, "rate 100/s, capacity 200", "rate 10/s, capacity 20"
        )
        same = nbr.AsyncRedisTokenBucket.from_url(
            redis_url, 100, 200, prefix=prefix, socket_timeout=TIMEOUT
        )
        assert await same.allow("alice")
        await limiter.aclose()
        await same.aclose()

    asyncio.run(main())


def test_reconfigure_with_migrate_records_the_new_limit(redis_url: str) -> None:
    # A rolling change of limit: one instance migrates (and records the new
    # terms); the others follow with migrate=False; new instances start on it.
    prefix = _fresh()
    a, b = _sync(redis_url, 100, 200, prefix), _sync(redis_url, 100, 200, prefix)
    assert a.allow("alice") and b.allow("bob")
    a.reconfigure(rate=50, capacity=100)  # migrate=True, the default
    assert a.client.get(f"{prefix}:params") == b"20000 2000000"
    assert a.allow("alice")
    b.reconfigure(rate=50, capacity=100, migrate=False)  # checked again before its next use
    assert b.allow("bob")
    assert _sync(redis_url, 50, 100, prefix).allow("carol")
    old = _sync(redis_url, 100, 200, prefix)  # an instance started with the old limit
    with pytest.raises(nbr.PrefixConflict, match=r"another limit \(rate 50/s, capacity 100"):
        old.allow("dave")
    b.reconfigure(rate=25, capacity=100, migrate=False)  # a limit nobody recorded
    with pytest.raises(nbr.PrefixConflict, match=r"not this limiter.s \(rate 25/s, capacity 100"):
        b.allow("bob")


def test_a_check_redis_cannot_answer_gets_the_policy_and_is_tried_again(
    own_redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prefix, "RETRY_S", 0.0)
    prefix = _fresh()
    limiter = nbr.RedisTokenBucket.from_url(
        own_redis_server.url,
        100,
        200,
        prefix=prefix,
        socket_timeout=0.5,
        on_error="open",
        breaker=nbr.CircuitBreaker(failures=10**6),  # every call asks Redis
    )
    own_redis_server.stop()
    d = limiter.check("alice")
    assert (d.allowed, d.source, d.reason) == (True, "policy:open", "connection")
    assert isinstance(limiter._script, _prefix.Checked)  # not checked: still guarded
    own_redis_server.start()
    admin = own_redis_server.client()
    admin.set(f"{prefix}:params", b"20000 1000000")  # meanwhile, another limit took the prefix
    with pytest.raises(nbr.PrefixConflict, match="rate 50/s, capacity 50"):
        limiter.check("alice")
    admin.delete(f"{prefix}:params")
    assert limiter.check("alice").source == "redis"
    assert admin.get(f"{prefix}:params") == b"10000 2000000"
    admin.close()
    limiter.close()

"""`OneKey`: one key of a keyed limiter as an unkeyed bucket, on every keyed backend.

The machine-wide limit of a pre-fork pool: one key of a shared-memory table,
beside a per-client table in an ``all_of``, shared by forked processes.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Hashable
from types import ModuleType
from typing import cast

import pytest

import nanobucket as nb

from conftest import NEEDS_SHARED_TABLE

S = 1_000_000_000


def test_the_verbs_are_the_tables_for_the_key(impl: ModuleType) -> None:
    table = impl.KeyedTokenBucket(rate=2, capacity=4)
    b = nb.OneKey(table, "all")
    assert (b.keyed, b.rate, b.capacity, b.interval_ns) == (False, 2, 4, S // 2)
    assert [b.allow_at(0) for _ in range(5)] == [True] * 4 + [False]
    assert b.check_at(0).retry_after_ns == S // 2
    assert (b.peek_at(S).remaining, b.tokens_at(S)) == (1, 2.0)
    b.refund_at(S, 2)
    assert table.tokens_at("all", S) == 4.0 and table.tokens_at("other", S) == 4.0
    assert b.reserve(cost=4, now=S) == 0 and b.reserve(cost=1, max_wait_ns=S, now=S) == S // 2
    assert isinstance(b, nb.Reservable) and isinstance(b, nb.Limiter)
    assert repr(b).startswith("OneKey(KeyedTokenBucket(rate=2, capacity=4")


def test_per_client_and_everyone_in_an_all_of(impl: ModuleType) -> None:
    per_client = impl.KeyedTokenBucket(rate=1, capacity=2)
    everyone = nb.OneKey(impl.KeyedTokenBucket(rate=1, capacity=3), "all")
    limit = nb.all_of(per_client, everyone)
    users = ("alice", "alice", "alice", "bob", "bob", "carol")
    assert [limit.allow_at(u, 0) for u in users] == [True, True, False, True, False, False]
    assert everyone.tokens_at(0) == 0.0 and per_client.tokens_at("bob", 0) == 1.0


def test_bad_input_is_a_clear_error(impl: ModuleType) -> None:
    with pytest.raises(TypeError, match="TokenBucket takes no key: use it as it is"):
        nb.OneKey(impl.TokenBucket(rate=1, capacity=1), "all")
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        nb.OneKey(impl.KeyedTokenBucket(rate=1, capacity=1), cast(Hashable, []))


def test_an_asyncio_table_is_refused() -> None:
    # Its verbs return coroutines, which all_of and Waiting read as admitted:
    # all_of(per_client, OneKey(async_table, "all")) admitted every request.
    redis_asyncio = pytest.importorskip("redis.asyncio")
    nbr = pytest.importorskip("nanobucket.redis")
    table = nbr.AsyncRedisTokenBucket(redis_asyncio.Redis(port=1), rate=1, capacity=1)
    with pytest.raises(TypeError, match="AsyncRedisTokenBucket is an asyncio limiter, and "):
        nb.OneKey(table, "all")


def _spend(limit: nb.AllOf, user: str, out: multiprocessing.Queue[int]) -> None:
    out.put(sum(limit.allow_at(user, 0) for _ in range(50)))


@NEEDS_SHARED_TABLE[0]
@NEEDS_SHARED_TABLE[1]
def test_forked_workers_share_the_machine_wide_bucket() -> None:
    # Four workers, each its own client: 10 each per client, 25 for the machine.
    per_client = nb.SharedKeyedTokenBucket.create_anonymous(rate=0.001, capacity=10)
    everyone = nb.OneKey(nb.SharedKeyedTokenBucket.create_anonymous(rate=0.001, capacity=25), "all")
    limit = nb.all_of(per_client, everyone)
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[int] = ctx.Queue()
    workers = [ctx.Process(target=_spend, args=(limit, f"user-{i}", out)) for i in range(4)]
    for w in workers:
        w.start()
    admitted = sorted(out.get(timeout=30) for _ in workers)
    for w in workers:
        w.join(30)
    assert sum(admitted) == 25 and all(n <= 10 for n in admitted)
    assert everyone.tokens_at(0) == 0.0
    per_client.close()
    everyone.table.close()

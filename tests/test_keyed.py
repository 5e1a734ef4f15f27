"""KeyedTokenBucket: independent keys, bounded memory, the overflow policy."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType

import pytest
from test_bucket import five_fields

import nanobucket as nb

from fuzz_values import Colliding

S = 1_000_000_000


def test_keys_are_independent(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=2, none_key=True)
    keys = ["alice", b"alice", 7, ("tenant", 7), 7.5, None, frozenset({1})]
    for key in keys:
        assert [t.allow_at(key, S) for _ in range(3)] == [True, True, False]
    assert t.allow_at("bob", S)
    d = t.check_at("alice", S + S // 2)
    assert (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns) == (
        False,
        0,
        S // 2,
        3 * S // 2,
    )
    assert t.check_at("alice", 2 * S).allowed


def test_equal_keys_share_a_bucket(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=2)
    assert t.allow_at("".join(["ab", "c"]), 0)
    assert t.allow_at("abc", 0)
    assert not t.allow_at("a" + "bc", 0)
    assert t.allow_at(1, 0) and t.allow_at(1.0, 0) and not t.allow_at(True if False else 1, 0)


def test_decision_values_per_key(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=100, capacity=200)
    d = t.check_at("k", S, cost=5)
    assert five_fields(d) == (True, 195, 0, 50_000_000, 200)
    assert t.peek_at("k", S, cost=196).retry_after_ns == 10_000_000
    assert t.peek_at("other", S, cost=200).allowed
    assert t.tokens_at("k", S) == 195.0
    assert t.tokens_at("other", S) == 200.0


def test_peek_of_a_missing_key_does_not_store_it(impl: ModuleType, clock) -> None:  # type: ignore[no-untyped-def]
    t = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    for i in range(100):
        assert t.peek(i).allowed
        assert t.tokens(i) == 2.0
    assert len(t) == 0
    assert t.allow("x")
    assert len(t) == 1


def test_len_counts_buckets_that_are_not_full(impl: ModuleType, clock) -> None:  # type: ignore[no-untyped-def]
    t = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    for key in "abc":
        assert t.allow(key)
    assert t.allow("a")
    assert len(t) == 3
    clock.advance(S)
    assert len(t) == 1  # b and c are full again; a still owes one token
    clock.advance(S)
    assert len(t) == 0


def _table_bytes(t: object) -> int:
    tats = getattr(t, "_tats", None)  # the pure-Python table is a dict
    return sys.getsizeof(tats) if tats is not None else sys.getsizeof(t)


def test_memory_stays_bounded_while_keys_churn(impl: ModuleType, clock) -> None:  # type: ignore[no-untyped-def]
    t = impl.KeyedTokenBucket(rate=1, capacity=10, max_keys=1000, clock=clock)
    sizes = []
    for i in range(100_000):
        # every key stays in debt (full again only after 10 s): the bound must hold
        clock.now = i * 1000
        assert t.allow(f"client-{i}", cost=10)
        if i % 10_000 == 9_999:
            assert len(t) <= 1000
            sizes.append(_table_bytes(t))
    assert len(set(sizes)) == 1, sizes
    assert sizes[0] < 1000 * 80


def test_full_buckets_are_dropped_without_loss(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=1, max_keys=4)
    assert t.allow_at("old", 0)
    for i in range(1_000):  # the old key is full again from 1 s on
        assert t.allow_at(i, S + i)
    assert t.check_at("old", S + 1_000).allowed
    assert not t.check_at("old", S + 1_000).allowed


def test_overflow_forgives_the_keys_closest_to_full(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=100, max_keys=16)
    for i in range(16):  # key i owes 20 + i tokens
        assert t.allow_at(i, 0, cost=20 + i)
    # A 17th key: no bucket is full, so the 16 // 8 = 2 least indebted go.
    assert t.allow_at("new", 0, cost=50)
    assert [t.tokens_at(i, 0) for i in range(16)] == [100.0, 100.0] + [
        float(100 - 20 - i) for i in range(2, 16)
    ]
    assert t.tokens_at("new", 0) == 50.0
    # The table now has room for one more before it forgives again.
    assert t.allow_at("newer", 0, cost=1)
    assert t.tokens_at(2, 0) == 78.0


def test_a_table_of_one_key(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=3, max_keys=1)
    assert t.allow_at("a", 0, cost=3)
    assert t.allow_at("b", 0, cost=3)  # "a" is forgiven to make room
    assert t.allow_at("a", 0, cost=3)
    assert not t.allow_at("a", 0)


def test_allow_many_decides_in_order_at_one_instant(impl: ModuleType, clock) -> None:  # type: ignore[no-untyped-def]
    t = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    result = t.allow_many(["a", "b", "a", "a", "b", "c"])
    assert isinstance(result, bytearray)
    assert list(result) == [1, 1, 1, 0, 1, 1]
    assert list(t.allow_many(iter(["c", "c", "c"]))) == [1, 0, 0]
    assert list(t.allow_many_at(["a"], S, cost=1)) == [1]
    assert t.allow_many([]) == bytearray()


def test_keys_with_equal_hashes_stay_apart(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=1, max_keys=64)
    keys = [Colliding(str(i)) for i in range(40)]
    assert all(t.allow_at(k, 0) for k in keys)
    assert not any(t.allow_at(Colliding(str(i)), 0) for i in range(40))


def test_an_eq_that_mutates_the_table_is_survived(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=1, max_keys=8)

    class Evil:
        def __hash__(self) -> int:
            return 7

        def __eq__(self, other: object) -> bool:
            for i in range(20):  # forces sweeps and rebuilds mid-lookup
                t.allow_at(("filler", i), 10 * S + i)
            return other is self

    e1, e2 = Evil(), Evil()
    assert t.allow_at(e1, 0)
    assert t.allow_at(e2, S)
    assert t.tokens_at(e2, S) == 0.0


def test_allow_many_takes_a_buffer_of_uint64(impl: ModuleType) -> None:
    from array import array

    t = impl.KeyedTokenBucket(rate=1, capacity=2)
    assert t.allow_at(1.0, 0)  # 1.0 == 1: the same bucket as the int 1
    keys = array("Q", [1, 1, 2**64 - 1, 2**64 - 1, 2**64 - 1, 5])
    assert list(t.allow_many_at(keys, 0)) == [1, 0, 1, 1, 0, 1]
    assert [t.tokens_at(k, 0) for k in (1, 2**64 - 1, 5)] == [0.0, 0.0, 1.0]
    assert list(t.allow_many_at(array("q", [5, 5]), 0)) == [1, 0]  # signed: a sequence of ints
    refs = sys.getrefcount(int)
    for _ in range(1000):  # the batch compares stored ints without touching refcounts
        t.allow_many_at(keys, 0)
    assert sys.getrefcount(int) == refs


def test_a_uint64_batch_finds_only_equal_keys_whatever_their_hash(impl: ModuleType) -> None:
    # The Cython table matches a uint64 without reading the stored key (by
    # value, see `slot_set`): keys of other types or out-of-range
    # ints that share a hash with the batch's ints must stay apart, and
    # equal keys of other types must still be found.
    from array import array

    class Hashed:  # equal only to itself, with a chosen hash
        def __init__(self, h: int) -> None:
            self.h = h

        def __hash__(self) -> int:
            return self.h

    m = 2**61 - 1  # CPython: hash(n) == n % m for n >= 0
    t = impl.KeyedTokenBucket(rate=1, capacity=1)
    taken = [Hashed(7), Hashed(8), 2**64 + 7, m + 7, -(m - 7), True]
    for key in taken:
        assert t.allow_at(key, 0)
    assert [hash(k) for k in taken] == [7, 8, (2**64 + 7) % m, 7, -(m - 7), 1]
    # 7 and 8 share hashes with taken keys yet are new; 1 == True is not.
    assert list(t.allow_many_at(array("Q", [7, 8, (2**64 + 7) % m, 1, 7]), 0)) == [1, 1, 1, 0, 0]
    assert [t.tokens_at(k, 0) for k in (2**64 + 7, m + 7, Hashed(7))] == [0.0, 0.0, 1.0]
    # Int keys kept by value are rehashed by their hash when the table grows.
    t = impl.KeyedTokenBucket(rate=1, capacity=3)
    ints = [2**64 - 1, m + 5, 5, 2**63, 0]
    assert list(t.allow_many_at(array("Q", ints), 0, cost=2)) == [1] * 5
    for i in range(200):  # grows the table several times
        assert t.allow_at(f"k{i}", 0)
    assert [t.tokens_at(k, 0) for k in ints] == [1.0] * 5
    assert list(t.allow_many_at(array("Q", ints * 2), 0)) == [1] * 5 + [0] * 5


@pytest.mark.gil_atomic
def test_a_uint64_batch_and_single_calls_racing_on_a_small_table(impl: ModuleType) -> None:
    # The batch charges with the GIL released while other threads insert
    # keys, force sweeps of the table and spend on the same keys: at a frozen
    # time every key still gives exactly its capacity.
    import threading
    from array import array

    t = impl.KeyedTokenBucket(rate=1, capacity=500, max_keys=4096)
    spent = [0] * 64
    lock = threading.Lock()
    batch = array("Q", [k % 64 for k in range(20_000)])

    def batches() -> None:
        for _ in range(3):
            result = t.allow_many_at(batch, 10**9)
            with lock:
                for k, ok in zip(batch, result):
                    spent[k] += ok

    def singles(offset: int) -> None:
        for n in range(20_000):
            if t.allow_at(n % 64, 10**9):
                with lock:
                    spent[n % 64] += 1
            t.allow_at(("churn", offset, n), 10**9)  # new keys: sweeps and growth

    threads = [
        threading.Thread(target=batches),
        threading.Thread(target=singles, args=(1,)),
        threading.Thread(target=singles, args=(2,)),
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert spent == [500] * 64


NONE_REFUSED = (
    "key is None: KeyedTokenBucket refuses it, as every request whose key is missing "
    "(an absent header, an anonymous user) would share one bucket; pass a key, or build it "
    "with none_key=True to give None a bucket of its own"
)


def test_none_is_refused_unless_the_table_takes_it(impl: ModuleType) -> None:
    # A key function returns None for a value that is missing (a header not
    # sent): taken as a key, every such request would share one bucket.
    t = impl.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)
    assert t.none_key is False
    calls: list[Callable[[], object]] = [
        lambda: t.allow(None),
        lambda: t.allow(None, cost=0),
        lambda: t.allow_at(None, 0),
        lambda: t.check(None),
        lambda: t.peek_at(None, 0),
        lambda: t.tokens(None),
        lambda: t.refund(None),
        lambda: t.reset(None),
        lambda: t.reserve(None),
        lambda: t.acquire(None),
        lambda: t.allow_many(["a", None]),
    ]
    for call in calls:
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == NONE_REFUSED
    assert (t.tokens("a"), len(t)) == (1.0, 0)  # the batch failed before spending
    # Built to take it, None is a key like any other.
    u = impl.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0, none_key=True)
    assert u.none_key is True
    assert [u.allow(None), u.allow(None), u.allow("None")] == [True, False, True]
    assert repr(u) == "KeyedTokenBucket(rate=1, capacity=1, max_keys=1000000, none_key=True)"
    with pytest.raises(TypeError, match=r"^none_key must be a bool, not int$"):
        impl.KeyedTokenBucket(rate=1, capacity=1, none_key=1)


def test_all_of_still_passes_no_key_to_unkeyed_layers(impl: ModuleType) -> None:
    keyed = impl.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)
    plain = impl.TokenBucket(rate=1, capacity=2, clock=lambda: 0)
    assert nb.all_of(plain).allow() is True  # key None, for no keyed layer
    with pytest.raises(TypeError, match=r"^this all_of has a keyed layer: pass a key"):
        nb.all_of(keyed, plain).allow()
    assert nb.all_of(keyed, plain).allow("alice") is True

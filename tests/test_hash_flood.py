"""Keys an attacker chooses do not degrade the keyed table.

CPython's hashes of ints, floats, negative ints and tuples are public: the
multiples of 2**21 share the low 21 bits of their hash, the multiples of
2**61 - 1 all hash to 0. The Cython table places keys by a secret-keyed
mix of a key hash (ints by value), so such keys cost what random ones do.
Counted, not timed: the table counts the entries its lookups examine
(``_probes``), and a key class counts its ``__eq__`` calls.
"""

from __future__ import annotations

from array import array
from decimal import Decimal
from fractions import Fraction
from types import ModuleType
from typing import Any

import pytest

from nanobucket._core import _bucket_py

_bucket_c = pytest.importorskip("nanobucket._core._bucket_c")

M = 2**61 - 1  # CPython: hash(n) == n % M for n >= 0
N = 4_000

AIMED: dict[str, list[Any]] = {
    "int": [i << 21 for i in range(1, N + 1)],
    "negative int": [-(i << 21) for i in range(1, N + 1)],
    "float": [float(i << 21) for i in range(1, N + 1)],
    "int, equal hashes": [(i + 1) * M for i in range(N)],
    "int in uint64, equal hashes": [i + k * M for i in range(1, N // 8 + 1) for k in range(8)],
    "negative int, equal hashes": [-(i + 1) * M for i in range(N)],
    "float, equal hashes": [float(2**62 + i * 2**21) for i in range(N)],
}


def probes_per_op(keys: list[Any], max_keys: int = 10**6) -> float:
    """Entries examined per call: each key charged once, then looked up once."""
    t = _bucket_c.KeyedTokenBucket(rate=1, capacity=10, max_keys=max_keys)
    for k in keys:
        assert t.allow_at(k, 0)
    for k in keys:
        t.tokens_at(k, 0)
    return float(t._probes) / (2 * len(keys))


@pytest.mark.parametrize("kind", AIMED)
def test_aimed_keys_examine_few_entries(kind: str) -> None:
    keys = AIMED[kind]
    assert len(set(keys)) == len(keys)
    # Random keys examine about 4 entries a call here (two lookups for a
    # new key, index rebuilds as the table grows); linear probing from the
    # CPython hash examined hundreds to thousands for these.
    assert probes_per_op(keys) < 6


@pytest.mark.parametrize("kind", ["int", "int, equal hashes"])
def test_aimed_keys_through_sweeps_examine_few_entries(kind: str) -> None:
    # Three times max_keys keys at one instant: every sweep forgives an
    # eighth of the table and rebuilds its index.
    assert probes_per_op(AIMED[kind], max_keys=N // 3) < 12


def test_an_aimed_uint64_batch_examines_few_entries() -> None:
    t = _bucket_c.KeyedTokenBucket(rate=1, capacity=10)
    batch = array("Q", AIMED["int"] + AIMED["int in uint64, equal hashes"])
    assert list(t.allow_many_at(batch, 0)) == [1] * len(batch)
    assert list(t.allow_many_at(batch, 0, cost=10)) == [0] * len(batch)  # 9 left each
    assert t._probes / (2 * len(batch)) < 6


class Counted(int):
    """An int whose comparisons are counted; it hashes as the int it is."""

    calls = 0

    def __eq__(self, other: object) -> bool:
        Counted.calls += 1
        return int(self) == other

    __hash__ = int.__hash__


def test_ints_with_one_cpython_hash_are_not_compared_with_each_other() -> None:
    keys = [Counted((i + 1) * M) for i in range(N)]
    assert {hash(k) for k in keys} == {0}
    t = _bucket_c.KeyedTokenBucket(rate=1, capacity=10)
    Counted.calls = 0
    for k in keys:
        assert t.allow_at(k, 0, cost=3)
    for k in keys:
        assert t.tokens_at(k, 0) == 7.0
    # Linear probing from the hash compared each key with every one before it.
    assert Counted.calls <= 2 * N


@pytest.mark.parametrize("impl", [_bucket_c, _bucket_py], ids=["c", "py"])
@pytest.mark.parametrize(
    "key, equal",
    [
        (2**70, [float(2**70), Fraction(2**70), Decimal(2**70), complex(2**70), Counted(2**70)]),
        (-(2**70), [float(-(2**70)), Fraction(-(2**70)), Counted(-(2**70))]),
        (2**62, [float(2**62), Fraction(2**62), Decimal(2**62), Counted(2**62)]),
        (-(2**62), [float(-(2**62)), Decimal(-(2**62))]),
        (M, [Fraction(M), Counted(M)]),
        (2**64 - 1, [Fraction(2**64 - 1), Decimal(2**64 - 1)]),
        (5, [5.0, Fraction(5), Decimal(5), complex(5), Counted(5)]),
        (-1, [-1.0, Fraction(-1)]),
        (1, [True, 1.0]),
    ],
)
def test_equal_keys_of_other_types_share_a_bucket(
    impl: ModuleType, key: int, equal: list[Any]
) -> None:
    for other in equal:
        assert other == key and hash(other) == hash(key)
        t = impl.KeyedTokenBucket(rate=1, capacity=len(equal) + 1)
        assert t.allow_at(key, 0)
        assert all(t.allow_at(e, 0) for e in equal)
        assert not t.allow_at(key, 0) and not t.allow_at(other, 0)
        t = impl.KeyedTokenBucket(rate=1, capacity=2)  # the other first, then the int
        assert t.allow_at(other, 0, cost=2)
        assert not t.allow_at(key, 0)
        if 0 <= key < 2**64:  # and a uint64 batch finds it by value
            assert list(t.allow_many_at(array("Q", [key]), 0)) == [0]


@pytest.mark.parametrize("impl", [_bucket_c, _bucket_py], ids=["c", "py"])
def test_ints_that_share_a_cpython_hash_stay_apart(impl: ModuleType) -> None:
    keys = [7, 7 + M, 7 + 2 * M, 7 + 7 * M, 7 + 40 * M, -(2**64) + 7, float(7 + 2**62)]
    t = impl.KeyedTokenBucket(rate=1, capacity=2)
    for k in keys:
        assert t.allow_at(k, 0)
    assert [t.tokens_at(k, 0) for k in keys] == [1.0] * len(keys)
    assert list(t.allow_many_at(array("Q", [7, 7 + M, 7 + 7 * M]), 0)) == [1, 1, 1]
    assert [t.tokens_at(k, 0) for k in keys] == [0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("impl", [_bucket_c, _bucket_py], ids=["c", "py"])
def test_ties_at_the_bound_forgive_the_earliest_arrival(impl: ModuleType) -> None:
    # Every bucket owes the same: the sweep forgives the 2 that came first,
    # whatever their hashes (both twins; an attacker cannot pick by hash).
    t = impl.KeyedTokenBucket(rate=1, capacity=10, max_keys=16)
    keys = [(15 - i) << 40 for i in range(16)]  # largest hash first
    for k in keys:
        assert t.allow_at(k, 0, cost=5)
    assert t.allow_at("new", 0, cost=5)
    assert [t.tokens_at(k, 0) for k in keys] == [10.0, 10.0] + [5.0] * 14


def test_two_tables_place_keys_apart() -> None:
    # The secret is per table: the same keys collide in neither, and each
    # table's positions differ (checked through what rebuilds examine).
    a = _bucket_c.KeyedTokenBucket(rate=1, capacity=10)
    b = _bucket_c.KeyedTokenBucket(rate=1, capacity=10)
    keys = AIMED["int"]
    for t in (a, b):
        for k in keys:
            t.allow_at(k, 0)
    assert a._probes / len(keys) < 12 and b._probes / len(keys) < 12

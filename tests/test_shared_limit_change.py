"""A named shared table opened by a release with another limit: the new limit applies.

``open_or_create`` attaches to the table at the name when it holds the limit
asked for, and otherwise puts a new table of that limit there in one step:
processes of the old release keep the old table (and its limit) until they
attach again, new ones get the new table, every key full once. Two opens in
one process, then real forked processes racing to replace the table.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_shared_procs import run_children

from nanobucket.shared import BadTableError, SharedKeyedTokenBucket

from conftest import NEEDS_SHARED_TABLE

pytestmark = NEEDS_SHARED_TABLE

S = 1_000_000_000


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "limits"


def test_a_release_with_another_limit_gets_it_and_the_old_keeps_its_own(path: Path) -> None:
    old = SharedKeyedTokenBucket.create(path=path, rate=1, capacity=2)  # release N
    assert [old.allow_at("alice", 0) for _ in range(2)] == [True, True]
    with pytest.raises(FileExistsError, match=r"open_or_create\(\) to apply this limit"):
        SharedKeyedTokenBucket.create(path=path, rate=2, capacity=4)  # says what to call
    new = SharedKeyedTokenBucket.open_or_create(path=path, rate=2, capacity=4)  # release N+1
    assert (new.rate, new.capacity, old.rate, old.capacity) == (2, 4, 1, 2)
    # Interleaved, each exact under its own limit: the new table starts full.
    for now, admitted in ((0, (0, 4)), (S, (1, 2))):
        results = [(old.allow_at("alice", now), new.allow_at("alice", now)) for _ in range(6)]
        assert (sum(r[0] for r in results), sum(r[1] for r in results)) == admitted
    # The name holds the new table: a process opening it now shares the new buckets.
    with SharedKeyedTokenBucket.open(path=path) as later:
        assert (later.capacity, later.tokens_at("alice", S)) == (4, 0.0)
    assert [p.name for p in path.parent.iterdir()] == ["limits"]  # no temp file left
    # The old release's exit removes its own file only: the new table stays at the name.
    old.unlink()
    assert SharedKeyedTokenBucket.open(path=path).capacity == 4
    new.unlink()
    assert not path.exists()
    old.close()
    new.close()


def test_the_same_limit_attaches_to_the_table_as_it_is(path: Path) -> None:
    a = SharedKeyedTokenBucket.open_or_create(path=path, rate=1, capacity=2)  # nothing there
    b = SharedKeyedTokenBucket.open_or_create(path=path, rate=1.0, capacity=2)  # the same rate
    assert [a.allow_at("k", 0), b.allow_at("k", 0), a.allow_at("k", 0)] == [True, True, False]
    # max_keys and when_full are the table's too: another value is another table.
    c = SharedKeyedTokenBucket.open_or_create(path=path, rate=1, capacity=2, max_keys=10)
    d = SharedKeyedTokenBucket.open_or_create(path=path, rate=1, capacity=2, when_full="admit")
    assert (c.max_keys, c.tokens_at("k", 0), d.when_full, d.tokens_at("k", 0)) == (
        10,
        2.0,
        "admit",
        2.0,
    )
    for t in (a, b, c, d):
        t.close()


def test_a_file_open_refuses_is_left_alone_and_bad_input_touches_nothing(path: Path) -> None:
    with pytest.raises(ValueError, match="capacity"):
        SharedKeyedTokenBucket.open_or_create(path=path, rate=1, capacity=0)
    with pytest.raises(ValueError, match="mode"):
        SharedKeyedTokenBucket.open_or_create(path=path, rate=1, capacity=1, mode=0o666)
    assert not path.exists()
    path.write_bytes(b"not a table" * 20)
    path.chmod(0o600)
    with pytest.raises(BadTableError, match="not a nanobucket shared table"):
        SharedKeyedTokenBucket.open_or_create(path=path, rate=1, capacity=1)
    assert path.read_bytes() == b"not a table" * 20


def test_workers_of_two_releases_each_keep_their_limit(path: Path) -> None:
    # Release N's table, inherited by a worker still serving; four workers of release
    # N+1 start at once and race to replace it: they all land on one new table.
    old = SharedKeyedTokenBucket.create(path=path, rate=1, capacity=3)

    def worker(i: int) -> object:
        if i == 4:  # release N's worker: its inherited table, under its limit
            return sum(old.allow_at("k", 0) for _ in range(10))
        t = SharedKeyedTokenBucket.open_or_create(path=path, rate=2, capacity=6)
        return [t.capacity, sum(t.allow_at("k", 0) for _ in range(10))]

    results = run_children(5, worker)
    assert [r[0] for r in results[:4]] == [6] * 4
    assert sum(r[1] for r in results[:4]) == 6  # one new table: its capacity, once
    assert results[4] == 3
    with SharedKeyedTokenBucket.open(path=path) as t:
        assert (t.capacity, t.tokens_at("k", 0)) == (6, 0.0)
    assert old.tokens_at("k", 0) == 0.0
    old.close()
    assert sorted(os.listdir(path.parent)) == ["limits"]


def test_unlink_leaves_a_table_put_at_the_name_since(path: Path, tmp_path: Path) -> None:
    old = SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1)
    with SharedKeyedTokenBucket.create(path=tmp_path / "next", rate=2, capacity=2):
        os.rename(tmp_path / "next", path)  # as a deploy script or open_or_create would
    old.unlink()
    with SharedKeyedTokenBucket.open(path=path) as t:
        assert t.capacity == 2
    old.close()

"""SharedKeyedTokenBucket in one process: semantics, files, keys, parameters."""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import struct
import uuid
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest

import nanobucket
from nanobucket import shared
from nanobucket._core import _bucket_py
from nanobucket._core._params import RateLike
from nanobucket.shared import BadTableError, SharedKeyedTokenBucket

from conftest import NEEDS_SHARED_TABLE, shared_c

pytestmark = NEEDS_SHARED_TABLE

S = 1_000_000_000


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "table"


@pytest.fixture
def name() -> Iterator[str]:
    """A unique table name under /dev/shm, removed after the test."""
    n = f"nanobucket-test-{uuid.uuid4().hex}"
    yield n
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(shared.default_directory(), n))


# -- the table itself -----------------------------------------------------------


def test_create_by_name_under_dev_shm_then_open(name: str) -> None:
    with SharedKeyedTokenBucket.create(name, rate=1, capacity=2) as t:
        assert t.path == os.path.join(shared.default_directory(), name)
        assert oct(os.stat(t.path).st_mode & 0o777) == "0o600"
        assert [t.allow_at("alice", 0) for _ in range(3)] == [True, True, False]
        with SharedKeyedTokenBucket.open(name) as u:
            assert (u.rate, u.capacity, u.max_keys, u.when_full) == (1, 2, 100_000, "reject")
            assert u.allow_at("alice", 0) is False  # the same bucket
            assert u.allow_at("alice", S) is True
        assert t.allow_at("alice", S) is False
        assert u.closed and not t.closed
    assert t.closed


def test_rate_round_trips_exactly(path: Path) -> None:
    cases: list[tuple[RateLike, RateLike]] = [
        (100, 100),
        (Fraction(7, 2), 3.5),  # opened, a rate is known by value: a float if one says it
        (0.1, 0.1),
        (3, 3),
        (Fraction(1, 3), Fraction(1, 3)),
    ]
    for rate, back in cases:
        p = path.with_suffix(f".{len(str(rate))}.{back}".replace("/", "_"))
        with SharedKeyedTokenBucket.create(path=p, rate=rate, capacity=5) as t:
            ref = _bucket_py.KeyedTokenBucket(rate=rate, capacity=5)
            assert t.rate == ref.rate and t.interval_ns == ref.interval_ns
            with SharedKeyedTokenBucket.open(path=p) as u:
                assert u.rate == back and u.interval_ns == ref.interval_ns
                assert type(u.rate) is type(back)


def test_create_refuses_an_existing_file_and_leaves_it_alone(path: Path) -> None:
    with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=3) as t:
        t.allow_at("k", 0, cost=3)
        with pytest.raises(FileExistsError):
            SharedKeyedTokenBucket.create(path=path, rate=5, capacity=9)
        with SharedKeyedTokenBucket.open(path=path) as u:
            assert (u.capacity, u.allow_at("k", 0)) == (3, False)
    assert [p.name for p in path.parent.iterdir()] == ["table"]  # no temp file left


def test_mode_and_unlink(path: Path) -> None:
    t = SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1, mode=0o640)
    assert os.stat(path).st_mode & 0o777 == 0o640
    t.unlink()
    assert not path.exists()
    assert t.allow_at("still mapped", 0) is True  # unlink keeps attached tables working
    t.close()
    t.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        t.allow("k")
    with pytest.raises(ValueError, match="closed"):
        t.check_at("k", 0)


def test_cannot_be_constructed_or_pickled(path: Path) -> None:
    with pytest.raises(TypeError, match="create"):
        SharedKeyedTokenBucket(rate=1, capacity=1)
    with (
        SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1) as t,
        pytest.raises(TypeError, match="pickled"),
    ):
        pickle.dumps(t)


def test_file_size_is_header_plus_slots(path: Path) -> None:
    with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1, max_keys=1000) as t:
        assert t.slot_count == 2048
        assert os.path.getsize(path) == 128 + 2048 * 16


# -- semantics: a differential trace against the in-process table --------------------


KEYS: list[object] = [
    "alice",
    "bob",
    "",
    "ключ",
    b"alice",
    b"\x00",
    0,
    1,
    -1,
    2**63,
    -(2**70),
    "a" * 300,
]


@pytest.mark.parametrize(
    ("rate", "capacity", "seed"),
    [
        (1, 3, 1),
        (3, 10, 2),
        (Fraction(7, 2), 1, 3),
        (1000, 50, 4),
        (0.5, 7, 5),
    ],
)
def test_same_decisions_as_keyed_token_bucket(
    path: Path, rate: RateLike, capacity: int, seed: int
) -> None:
    ref = _bucket_py.KeyedTokenBucket(rate=rate, capacity=capacity)
    rng = random.Random(seed)
    now = 0
    with SharedKeyedTokenBucket.create(
        path=path,
        rate=rate,
        capacity=capacity,
        max_keys=64,
    ) as t:
        for _ in range(3000):
            now += rng.choice([0, 0, 1, ref.interval_ns // 3, ref.interval_ns, 5 * S])
            key = rng.choice(KEYS)
            cost = rng.choice([0, 1, 1, 1, capacity])
            op = rng.randrange(6)
            if op == 0:
                assert t.allow_at(key, now, cost) == ref.allow_at(key, now, cost)
            elif op == 1:
                assert t.check_at(key, now, cost) == ref.check_at(key, now, cost)
            elif op == 2:
                assert t.peek_at(key, now, cost) == ref.peek_at(key, now, cost)
            elif op == 3:
                assert t.tokens_at(key, now) == ref.tokens_at(key, now)
            elif op == 4:
                batch = rng.choices(KEYS, k=5)
                assert t.allow_many_at(batch, now, cost) == ref.allow_many_at(batch, now, cost)
            else:
                d = t.check_at(key, now, cost)
                assert type(d) is nanobucket.Decision and d == ref.check_at(key, now, cost)


def test_time_going_backwards_matches_and_creates_nothing(path: Path) -> None:
    ref = _bucket_py.KeyedTokenBucket(rate=2, capacity=4)
    rng = random.Random(7)
    with SharedKeyedTokenBucket.create(path=path, rate=2, capacity=4) as t:
        for _ in range(2000):
            now = rng.randrange(0, 20 * S)
            cost = rng.choice([0, 1, 2])
            assert t.check_at("k", now, cost) == ref.check_at("k", now, cost)


def test_real_clock_and_injected_clock(path: Path) -> None:
    ticks = iter([0, 0, 0, S // 2, S])
    with SharedKeyedTokenBucket.create(
        path=path, rate=2, capacity=2, clock=lambda: next(ticks)
    ) as t:
        assert [t.allow("k"), t.allow("k"), t.allow("k")] == [True, True, False]
        assert t.tokens("k") == 1.0
        assert t.check("k") == _bucket_py.Decision(True, 1, 0, S // 2, 2)
    with SharedKeyedTokenBucket.open(path=path) as u:  # the monotonic clock
        assert u.allow("other") is True
        assert u.peek("other").remaining == 0  # after the peeked request
        assert u.peek("other", 0).remaining == 1
        assert u.allow_many(["a", "b", "a", "a"], cost=1) == bytearray([1, 1, 1, 0])
        assert len(u) == 3  # "other", "a", "b" owe tokens; "k" is full again


# -- keys -------------------------------------------------------------------------


def test_str_bytes_and_int_are_distinct_keys(path: Path) -> None:
    with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1) as t:
        assert t.allow_at("1", 0) and not t.allow_at("1", 0)
        assert t.allow_at(b"1", 0) and not t.allow_at(b"1", 0)
        assert t.allow_at(1, 0) and not t.allow_at(1, 0)
        assert t.allow_at(2**64, 0) and not t.allow_at(2**64, 0)
        assert t.allow_at(-(2**64), 0)


def test_keys_hash_the_same_in_every_process_attached(path: Path) -> None:
    with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1) as t:
        for key in KEYS:
            assert t.allow_at(key, 0)
        with SharedKeyedTokenBucket.open(path=path) as u:
            assert [u.allow_at(key, 0) for key in KEYS] == [False] * len(KEYS)


@pytest.mark.parametrize("key", [1.0, ("a",), True, bytearray(b"x"), object()])
def test_other_key_types_are_a_type_error(path: Path, key: object) -> None:
    with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1) as t:
        with pytest.raises(TypeError, match="str, bytes or int"):
            t.allow(key)
        with pytest.raises(TypeError):
            t.check_at(key, 0)


NONE_REFUSED = (
    "key is None: SharedKeyedTokenBucket refuses it, as every request whose key is missing "
    "(an absent header, an anonymous user) would share one bucket; pass a key, or build it "
    "with none_key=True to give None a bucket of its own"
)


def test_none_is_refused_unless_the_handle_takes_it(path: Path) -> None:
    with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1) as t:
        assert t.none_key is False
        for call in (
            lambda: t.allow(None),
            lambda: t.check_at(None, 0),
            lambda: t.peek(None),
            lambda: t.tokens(None),
            lambda: t.refund(None),
            lambda: t.allow_many_at(["a", None], 0),
        ):
            with pytest.raises(TypeError) as info:
                call()
            assert str(info.value) == NONE_REFUSED
        assert t.tokens_at("a", 0) == 1.0  # the batch failed before spending
        # A handle that takes None: its bucket is every such handle's, and not "" nor b"".
        with SharedKeyedTokenBucket.open(path=path, none_key=True) as u:
            assert u.none_key is True
            assert [u.allow_at(None, 0), u.allow_at(None, 0)] == [True, False]
            assert u.allow_at("", 0) and u.allow_at(b"", 0)
            with SharedKeyedTokenBucket.open(path=path, none_key=True) as v:
                assert not v.allow_at(None, 0)
    with pytest.raises(TypeError, match=r"^none_key must be a bool, not int$"):
        SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=1, none_key=1)  # type: ignore[arg-type]


def test_unencodable_str_is_a_value_error(path: Path) -> None:
    with (
        SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1) as t,
        pytest.raises(UnicodeEncodeError),
    ):
        t.allow("\ud800")


def test_allow_many_checks_every_key_before_spending(path: Path) -> None:
    with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1) as t:
        with pytest.raises(TypeError):
            t.allow_many_at(["a", 1.5], 0)
        assert t.tokens_at("a", 0) == 1.0
        with pytest.raises(TypeError, match="single str"):
            t.allow_many("abc")
        assert t.allow_many_at([], 0) == bytearray()
        assert t.allow_many_at(iter(["a", "a"]), 0) == bytearray([1, 0])


# -- a full probe window -------------------------------------------------------------


def test_full_window_rejects_new_keys_until_a_bucket_fills(path: Path) -> None:
    # max_keys=1: two slots, and every key's window is both of them.
    with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=2, max_keys=1) as t:
        assert (t.slot_count, t.when_full) == (2, "reject")
        assert t.allow_at("a", 0) and t.allow_at("b", 0, cost=2)
        assert t.allow_at("c", 0) is False
        # Retry when the soonest probed bucket ("a", tat = 1 s) is full again.
        assert t.check_at("c", 0) == _bucket_py.Decision(False, 0, S, S, 2)
        assert t.peek_at("c", 0) == _bucket_py.Decision(False, 0, S, S, 2)
        assert t.allow_at("c", 0, cost=0) is False
        assert t.tokens_at("c", 0) == 2.0  # its own bucket, were it tracked, is full
        assert t.allow_at("a", 0) is True  # a tracked key goes on
        assert t.allow_at("c", S - 1) is False
        # At 2 s "a" (tat 2 s) is full: "c" reclaims its slot, losslessly for "a".
        assert t.check_at("c", 2 * S) == _bucket_py.Decision(True, 1, 0, S, 2)
        # "a" comes back: its slot is gone, and "b" (tat 2 s) is full, so it takes that.
        assert t.check_at("a", 2 * S) == _bucket_py.Decision(True, 1, 0, S, 2)
        assert t.allow_at("b", 2 * S) is False  # now the window is full again
        assert t.allow_at("c", 2 * S) is True and t.allow_at("c", 2 * S) is False


def test_full_window_admits_untracked_when_asked(path: Path) -> None:
    with SharedKeyedTokenBucket.create(
        path=path, rate=1, capacity=2, max_keys=1, when_full="admit"
    ) as t:
        assert t.allow_at("a", 0, cost=2) and t.allow_at("b", 0, cost=2)
        # Fail open: each request of "c" is decided on a full bucket, and not recorded.
        assert [t.allow_at("c", 0) for _ in range(5)] == [True] * 5
        assert t.check_at("c", 0, cost=2) == _bucket_py.Decision(True, 0, 0, 2 * S, 2)
        assert t.tokens_at("c", 0) == 2.0
        assert t.allow_at("a", 0) is False
        with SharedKeyedTokenBucket.open(path=path) as u:
            assert u.when_full == "admit"


# -- parameters ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rate": 0, "capacity": 1}, ValueError, "rate"),
        ({"rate": float("nan"), "capacity": 1}, ValueError, "finite"),
        ({"rate": "1", "capacity": 1}, ValueError, "no time unit"),
        ({"rate": True, "capacity": 1}, TypeError, "rate"),
        ({"rate": 1, "capacity": 0}, ValueError, "capacity"),
        ({"rate": 1, "capacity": 1.5}, TypeError, "capacity"),
        ({"rate": 1, "capacity": 1, "max_keys": 0}, ValueError, "max_keys"),
        ({"rate": 1, "capacity": 1, "max_keys": 1.0}, TypeError, "max_keys"),
        ({"rate": 1, "capacity": 1, "when_full": "maybe"}, ValueError, "when_full"),
        ({"rate": 1, "capacity": 1, "mode": "rw"}, ValueError, "mode"),
        ({"rate": 1, "capacity": 1, "clock": 5}, TypeError, "clock"),
        ({"rate": Fraction(2**64 + 1, 2**64), "capacity": 1}, ValueError, "fraction"),
        ({"rate": 1, "capacity": 1, "max_keys": 1 << 41}, ValueError, "max_keys"),
    ],
)
def test_bad_parameters(path: Path, kwargs: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SharedKeyedTokenBucket.create(path=path, **kwargs)  # type: ignore[arg-type]
    assert not path.exists()


def test_bad_names(path: Path) -> None:
    for name, error in [("a/b", ValueError), ("", ValueError), ("..", ValueError), (5, TypeError)]:
        with pytest.raises(error):
            SharedKeyedTokenBucket.create(name, rate=1, capacity=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exactly one"):
        SharedKeyedTokenBucket.create("x", path=path, rate=1, capacity=1)
    with pytest.raises(TypeError, match="exactly one"):
        SharedKeyedTokenBucket.open()


def test_bad_arguments_to_the_verbs(path: Path) -> None:
    with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=3) as t:
        for cost, error in [
            (-1, ValueError),
            (4, ValueError),
            (True, TypeError),
            (1.0, TypeError),
            (2**64, ValueError),
        ]:
            with pytest.raises(error, match="cost"):
                t.allow("k", cost)  # type: ignore[arg-type]  # a float on purpose
            with pytest.raises(error, match="cost"):
                t.peek_at("k", 0, cost)  # type: ignore[arg-type]  # a float on purpose
        for now, error in [
            (-1, ValueError),
            (2**62, ValueError),
            (1.0, TypeError),
            (False, TypeError),
        ]:
            with pytest.raises(error, match="now"):
                t.allow_at("k", now)  # type: ignore[arg-type]  # a float on purpose
            with pytest.raises(error, match="now"):
                t.tokens_at("k", now)  # type: ignore[arg-type]  # a float on purpose
        assert t.tokens_at("k", 0) == 3.0  # nothing was spent


# -- files that are not tables -------------------------------------------------------


def _valid_header(path: Path) -> bytes:
    SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1, max_keys=4).close()
    return path.read_bytes()


def _rewrite(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    import hashlib

    raw = bytearray(data)
    struct.pack_into(fmt, raw, offset, value)
    raw[112:120] = hashlib.blake2b(bytes(raw[:112]), digest_size=8).digest()
    return bytes(raw)


@pytest.mark.parametrize(
    ("mangle", "match"),
    [
        (lambda d: b"", "not a nanobucket shared table"),
        (lambda d: b"hello world\n" * 100, "not a nanobucket shared table"),
        (lambda d: d[:60], "truncated"),
        (lambda d: d[:-16], "truncated"),
        (lambda d: d + b"\0" * 16, "unexpected bytes"),
        (lambda d: _rewrite(d, 16, "=Q", 1), "layout version 1"),  # an older file
        (lambda d: _rewrite(d, 8, "=Q", 0x0807060504030201), "byte order"),
        (lambda d: d[:40] + b"\x07" + d[41:], "corrupt"),
        (lambda d: _rewrite(d, 64, "=q", 1 << 40), "truncated"),  # slot count past the file
        (lambda d: _rewrite(d, 64, "=q", 3), "corrupt"),
        (lambda d: _rewrite(d, 56, "=q", 5), "corrupt"),  # interval disagrees with the rate
        (lambda d: _rewrite(d, 40, "=q", 0), "corrupt"),  # rate denominator 0
        (lambda d: _rewrite(d, 80, "=q", 99), "corrupt"),  # probe longer than the table
        (lambda d: _rewrite(d, 72, "=q", 0), "corrupt"),  # max_keys
        (lambda d: _rewrite(d, 88, "=q", 7), "corrupt"),  # policy
    ],
)
def test_open_rejects_files_that_are_not_tables(path: Path, mangle: object, match: str) -> None:
    data = mangle(_valid_header(path))  # type: ignore[operator]
    path.write_bytes(data)
    with pytest.raises(BadTableError, match=match):
        SharedKeyedTokenBucket.open(path=path)


def test_open_of_missing_directory_and_device(path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        SharedKeyedTokenBucket.open(path=path)
    with pytest.raises(IsADirectoryError):
        SharedKeyedTokenBucket.open(path=path.parent)
    with pytest.raises(BadTableError, match="regular file"):
        SharedKeyedTokenBucket.open(path="/dev/null")


# -- the keyed hash ------------------------------------------------------------------


def _siphash_ref(data: bytes, k0: int, k1: int, c: int, d: int, tweak: int = 0) -> int:
    """A plain-Python SipHash, to check the C one (and itself checked on the 2-4 vectors)."""
    m64 = (1 << 64) - 1

    def rotl(x: int, b: int) -> int:
        return ((x << b) | (x >> (64 - b))) & m64

    v = [
        0x736F6D6570736575 ^ k0,
        0x646F72616E646F6D ^ k1 ^ tweak,
        0x6C7967656E657261 ^ k0,
        0x7465646279746573 ^ k1,
    ]

    def rounds(n: int) -> None:
        for _ in range(n):
            v[0] = (v[0] + v[1]) & m64
            v[1] = rotl(v[1], 13) ^ v[0]
            v[0] = rotl(v[0], 32)
            v[2] = (v[2] + v[3]) & m64
            v[3] = rotl(v[3], 16) ^ v[2]
            v[0] = (v[0] + v[3]) & m64
            v[3] = rotl(v[3], 21) ^ v[0]
            v[2] = (v[2] + v[1]) & m64
            v[1] = rotl(v[1], 17) ^ v[2]
            v[2] = rotl(v[2], 32)

    tail = len(data) - len(data) % 8
    for i in range(0, tail, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v[3] ^= m
        rounds(c)
        v[0] ^= m
    b = (len(data) << 56) & m64 | int.from_bytes(data[tail:], "little")
    v[3] ^= b
    rounds(c)
    v[0] ^= b
    v[2] ^= 0xFF
    rounds(d)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def test_siphash_matches_the_published_vectors_and_the_reference() -> None:
    k0, k1 = struct.unpack("<QQ", bytes(range(16)))
    # SipHash-2-4 test vectors from the paper's reference code (key 00..0f, message 00..n-1).
    vectors = {
        0: 0x726FDB47DD0E0E31,
        1: 0x74F839C593DC67FD,
        2: 0x0D6C8009D9A94F5A,
        3: 0x85676696D7FB7E2D,
        15: 0xA129CA6149BE45E5,
    }
    for n, want in vectors.items():
        assert shared_c.siphash(bytes(range(n)), k0, k1, 2) == want
        assert _siphash_ref(bytes(range(n)), k0, k1, 2, 4) == want
    rng = random.Random(3)
    for n in range(40):
        data = rng.randbytes(n)
        a, b, tweak = rng.getrandbits(64), rng.getrandbits(64), rng.choice([0, 0x73, 0x69])
        assert shared_c.siphash(data, a, b, 1, tweak) == _siphash_ref(data, a, b, 1, 3, tweak)


def test_without_the_extension_create_and_open_say_why(
    monkeypatch: pytest.MonkeyPatch, path: Path
) -> None:
    monkeypatch.setattr(shared, "_Base", None)  # as on a pure-Python install
    with pytest.raises(RuntimeError, match="Cython extension"):
        SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1)
    with pytest.raises(RuntimeError, match="Cython extension"):
        SharedKeyedTokenBucket.open(path=path)

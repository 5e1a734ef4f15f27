"""What the benchmarks measure: groups of contenders, each called the same way.

A *group* asks one question (single ``allow()`` admitting, keyed ``allow(key)``
over 100k keys, ...). Its *cases* answer it for the Cython implementation,
the pure-Python twin, the naive token bucket, a no-op floor, a bare-dict
baseline where one makes sense, and each installed peer library. Every case
builds a `Trial` whose ``run`` executes one timed round through one of the
loop shapes below, so the only thing that differs between two cases of a
group is the callable inside the loop: the ratios are fair.

Both the pytest-benchmark suite (``benchmarks/``) and ``python -m nanobucket
bench`` (`nanobucket.bench`) time these same trials.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import os
import random
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from importlib import metadata
from typing import Any

from .._core import _bucket_py
from ..reference import MonotonicNaiveBucket


def _optional(name: str) -> Any:
    """The extension module *name*, or None in a pure-Python install."""
    try:
        return importlib.import_module(name)
    except ImportError:  # pragma: no cover - a pure-Python install
        return None


class _PyFloor:
    """Pure-Python stand-in when the extension is not built (a higher floor)."""

    def allow(self, cost: int = 1) -> bool:
        return True

    def allow_clock(self, cost: int = 1) -> bool:
        time.monotonic_ns()
        return True

    def allow_key(self, key: object, cost: int = 1) -> bool:
        return True

    def check(self, cost: int = 1) -> bool:
        return True

    def allow_many(self, keys: object, cost: int = 1) -> None:
        return None


_bucket_c: Any = _optional("nanobucket._core._bucket_c")
_floor: Any = _optional("nanobucket.bench._floor")
Floor: Any = _PyFloor if _floor is None else _floor.Floor
FLOOR_IS_CYTHON = _floor is not None

# Peer libraries: display name -> distribution name.
PEERS = {
    "token-bucket": "token-bucket",
    "limits-fixed": "limits",
    "limits-sliding": "limits",
    "pyrate-limiter": "pyrate-limiter",
    "throttled-py": "throttled-py",
}

# Limiter settings. ALLOWING never runs dry at any call rate a benchmark
# reaches; REJECTING, once drained, stays empty for 1000 s. KEYED refills
# slowly into a deep bucket: a touched key owes tokens (is tracked, not
# droppable) for 100 s, and no key is refused within a run. With a fast
# refill the table would rightly drop keys whose buckets are full again, and
# the keyed groups would time re-insertion instead of lookups.
ALLOWING = (10**9, 10**6)
REJECTING = (0.001, 1)
KEYED = (0.01, 10_000)
# Eviction: a key's bucket is full (idle, droppable) 1 us after its request.
IDLE_FAST = (10**6, 1)


class Unavailable(Exception):
    """This case cannot run here (a peer not installed, a rejected buffer, ...)."""


@dataclass
class Trial:
    """One contender, ready: ``run()`` is one timed round of ``calls`` calls (or keys).

    ``reset`` runs untimed before every round (a fresh table, fresh keys);
    ``close`` once at the end (stops a peer's background timer). ``warmed``
    says the set-up already ran the timed work once (filled the table), so
    a runner need not spend a warm-up round.
    """

    run: Callable[[], object]
    calls: int
    reset: Callable[[], object] | None = None
    close: Callable[[], object] | None = None
    warmed: bool = False


@dataclass(frozen=True)
class Case:
    """A named contender of a group; ``build()`` may raise `Unavailable`."""

    name: str
    role: str  # floor | ours | twin | naive | baseline | peer
    build: Callable[[], Trial]


@dataclass(frozen=True)
class Group:
    """One question, with the cases that answer it and the floor they are read against."""

    id: str
    title: str
    unit: str  # "call" or "key": what ns/... is per
    cases: tuple[Case, ...]
    floor: str = "floor"


@dataclass(frozen=True)
class Sizes:
    """Work per group: `FULL` (the defaults) for the real figures, `QUICK` for a smoke run."""

    calls: int = 10_000  # calls per round, single-bucket groups
    keyed_small: int = 100_000
    keyed_large: int = 1_000_000
    keyed_chunk: int = 10_000  # calls per round, keyed groups (consecutive slices, round-robin)
    first_touch: int = 20_000  # new keys per round
    evict_max_keys: int = 10_000
    evict_stream: int = 20_000  # new keys per round into a full table
    many_str: int = 100_000  # keys per allow_many batch (str)
    many_u64: int = 1_000_000  # keys per allow_many batch (uint64 buffer)
    memory_keys: int = 1_000_000
    aimed: int = 60_000  # new keys per round, hash-flooding group


FULL = Sizes()
QUICK = Sizes(
    calls=2_000,
    keyed_small=10_000,
    keyed_large=40_000,
    keyed_chunk=2_000,
    first_touch=2_000,
    evict_max_keys=1_000,
    evict_stream=2_000,
    many_str=5_000,
    many_u64=20_000,
    memory_keys=50_000,
    aimed=3_000,
)


# --- the loop shapes: every case of a group runs the same bytecode ----------


def loop_calls(f: Callable[[], object], calls: int) -> Trial:
    """``for _ in r: f()`` -- single-bucket verbs."""
    r = range(calls)

    def run() -> None:
        for _ in r:
            f()

    return Trial(run, calls)


def loop_keys(f: Callable[[Any], object], chunks: Sequence[Sequence[object]]) -> Trial:
    """``for k in chunk: f(k)`` over consecutive chunks, round-robin across rounds."""
    cycle = itertools.cycle(chunks)

    def run() -> None:
        for k in next(cycle):
            f(k)

    return Trial(run, len(chunks[0]))


def loop_fresh(
    make: Callable[[], Callable[[Any], object]], fresh_keys: Callable[[], list[str]], calls: int
) -> Trial:
    """``for k in keys: f(k)`` with *f* from *make()* and never-seen keys every round."""
    # Built once now, so that a contender that cannot be built (no Cython
    # extension, a peer not installed) is Unavailable here, not mid-run.
    box: list[Any] = [make(), None]

    def reset() -> None:
        box[0] = None  # drop the old table before building the next one
        box[0] = make()
        box[1] = fresh_keys()

    def run() -> None:
        f = box[0]
        for k in box[1]:
            f(k)

    return Trial(run, calls, reset)


def loop_stream(
    f: Callable[[Any], object], fresh_keys: Callable[[], list[str]], calls: int
) -> Trial:
    """``for k in keys: f(k)`` into one long-lived table, never-seen keys every round."""
    box: list[Any] = [None]

    def reset() -> None:
        box[0] = fresh_keys()

    def run() -> None:
        for k in box[0]:
            f(k)

    return Trial(run, calls, reset)


def batch(f: Callable[[Any], object], keys: object, n: int) -> Trial:
    """``f(keys)``: one call decides *n* keys (timed per key)."""

    def run() -> None:
        f(keys)

    return Trial(run, n)


# --- keys ------------------------------------------------------------------


class Keys:
    """Key lists shared by the groups, built once (1M str keys take ~70 MB)."""

    def __init__(self) -> None:
        self._str: dict[int, list[str]] = {}
        self._fresh = itertools.count()

    def str_keys(self, n: int) -> list[str]:
        if n not in self._str:
            self._str[n] = [f"user:{i:07d}" for i in range(n)]
        return self._str[n]

    def chunks(self, n: int, size: int, shuffled: bool = False) -> list[list[str]]:
        """Consecutive slices of the *n* keys, in insertion order or a fixed shuffle."""
        keys = self.str_keys(n)
        if shuffled:
            keys = keys[:]
            random.Random(n).shuffle(keys)  # the key objects stay where they were made
        return [keys[i : i + size] for i in range(0, n - size + 1, size)]

    def fresh(self, n: int) -> Callable[[], list[str]]:
        """A maker of *n* never-seen str keys (new objects, hashes not cached yet)."""

        def make() -> list[str]:
            prefix = f"new{next(self._fresh)}:"
            return [f"{prefix}{i}" for i in range(n)]

        return make


# --- the contenders --------------------------------------------------------


def _impl(name: str) -> Any:
    if name == "c":
        if _bucket_c is None:
            raise Unavailable("the Cython extension is not built")
        return _bucket_c
    return _bucket_py


class NaiveKeyed:
    """The naive token bucket per key: a dict of `MonotonicNaiveBucket`, created on first use."""

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.buckets: dict[object, MonotonicNaiveBucket] = {}

    def allow(self, key: object) -> bool:
        b = self.buckets.get(key)
        if b is None:
            b = self.buckets[key] = MonotonicNaiveBucket(self.rate, self.capacity)
        return b.allow()


def _need(module: str, peer: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise Unavailable("not installed (pip install 'nanobucket[bench]')") from None


def peer_keyed(
    peer: str,
    rate: float,
    capacity: int,
    max_keys: int = 10**7,
) -> tuple[Callable[[Any], object], Callable[[object], bool], Callable[[], None]]:
    """``(f, admitted, close)`` with ``f(key)`` the peer's per-key limit call.

    ``admitted(result)`` reads f's result as a bool; ``close()`` stops any
    background thread the peer started. Each peer is configured the way its
    documentation suggests for an in-process limiter.
    """
    nothing: Callable[[], None] = lambda: None  # noqa: E731
    truthy: Callable[[object], bool] = bool
    if peer == "token-bucket":
        tb = _need("token_bucket", peer)
        return tb.Limiter(rate, capacity, tb.MemoryStorage()).consume, truthy, nothing
    if peer in ("limits-fixed", "limits-sliding"):
        limits = _need("limits", peer)
        storage = limits.storage.MemoryStorage()
        strategies = limits.strategies
        cls = (
            strategies.FixedWindowRateLimiter
            if peer == "limits-fixed"
            else strategies.SlidingWindowCounterRateLimiter
        )
        # `limits` counts hits per window: capacity hits per capacity/rate seconds
        # is the nearest to a bucket of `capacity` refilled at `rate`/s.
        seconds = max(1, round(capacity / rate))
        item = limits.RateLimitItemPerSecond(max(1, round(rate * seconds)), seconds)

        def close_limits() -> None:
            storage.timer.cancel()  # its expiry timer would run during the next case

        return functools.partial(cls(storage).hit, item), truthy, close_limits
    if peer == "pyrate-limiter":
        return _pyrate_keyed(rate, capacity), truthy, nothing
    if peer == "throttled-py":
        th = _need("throttled", peer)
        limiter = th.Throttled(
            using=th.RateLimiterType.TOKEN_BUCKET.value,
            quota=th.per_duration(
                timedelta(seconds=_period(rate)),
                max(1, round(rate * _period(rate))),
                burst=capacity,
            ),
            store=th.MemoryStore(options={"MAX_SIZE": max_keys}),
        )
        not_limited: Callable[[Any], bool] = lambda r: not r.limited  # noqa: E731
        return limiter.limit, not_limited, nothing
    raise ValueError(f"unknown peer {peer!r}")


def _period(rate: float) -> int:
    """Whole seconds that hold at least one token at *rate* (peers take int periods)."""
    return max(1, round(1 / rate)) if rate < 1 else 1


def _pyrate_keyed(rate: float, capacity: int) -> Callable[[Any], object]:
    pl = _need("pyrate_limiter", "pyrate-limiter")
    period_ms = _period(rate) * 1000
    spec = pl.Rate(max(1, round(rate * _period(rate))), period_ms, burst=capacity)

    class KeyedFactory(pl.BucketFactory):  # type: ignore[misc,name-defined]
        """One GCRA `StateBucket` per name, as pyrate-limiter's docs route keys."""

        def __init__(self) -> None:
            self.buckets: dict[str, Any] = {}
            self.clock = pl.MonotonicClock()

        def wrap_item(self, name: str, weight: int = 1) -> Any:
            return pl.RateItem(name, self.clock.now(), weight=weight)

        def get(self, item: Any) -> Any:
            b = self.buckets.get(item.name)
            if b is None:
                # State buckets have nothing to leak: no Leaker thread needed.
                b = self.buckets[item.name] = pl.StateBucket([spec], algorithm=pl.TokenBucket())
            return b

    return functools.partial(pl.Limiter(KeyedFactory()).try_acquire, blocking=False)


def _single(
    f: Callable[[], object],
    admitted: Callable[[object], bool],
    want: bool,
    calls: int,
    close: Callable[[], None] | None = None,
    drain: bool = False,
) -> Trial:
    """A single-bucket trial, after checking the bucket is in the intended state."""
    if drain:
        for _ in range(3):
            f()
    if admitted(f()) != want:
        raise AssertionError(f"set-up error: expected {'admission' if want else 'rejection'}")
    trial = loop_calls(f, calls)
    trial.close = close
    return trial


def single_cases(
    calls: int, config: tuple[float, int], want: bool, verb: str = "allow"
) -> tuple[Case, ...]:
    """Cases for one bucket, ``f()`` per call; *want* is the admission they must give."""
    rate, capacity = config
    drain = not want

    def ours(name: str) -> Callable[[], Trial]:
        def build() -> Trial:
            b = _impl(name).TokenBucket(rate, capacity)
            return _single(getattr(b, verb), bool, want, calls, drain=drain)

        return build

    def floor() -> Trial:
        return loop_calls(getattr(Floor(), verb), calls)

    def naive() -> Trial:
        b = MonotonicNaiveBucket(rate, capacity)
        return _single(b.allow, bool, want, calls, drain=drain)

    def peer(p: str) -> Callable[[], Trial]:
        def build() -> Trial:
            f, admitted, close = peer_keyed(p, rate, capacity)
            return _single(functools.partial(f, "client"), admitted, want, calls, close, drain)

        return build

    cases = [
        Case("floor", "floor", floor),
        # The call and one read of the monotonic clock: all a limiter must spend.
        Case("floor+clock", "baseline", lambda: loop_calls(Floor().allow_clock, calls)),
        Case("nanobucket-c", "ours", ours("c")),
        Case("nanobucket-py", "twin", ours("py")),
        Case("naive", "naive", naive),
    ]
    peers = PEERS if verb == "allow" else {"throttled-py": ""}  # only it returns a decision
    cases += [Case(p, "peer", peer(p)) for p in peers]
    return tuple(cases)


def keyed_cases(
    keys: Keys, n: int, chunk: int, with_peers: bool, shuffled: bool = False
) -> tuple[Case, ...]:
    """Cases for ``f(key)`` round-robin over *n* existing keys (*shuffled*: in random order).

    Shuffled, each call finds its key, its index position and its entry in
    memory the previous call did not touch: the cache misses a real server
    with many clients pays, which insertion order hides.
    """
    rate, capacity = KEYED

    def warm(f: Callable[[Any], object]) -> Trial:
        chunks = keys.chunks(n, chunk, shuffled)
        for part in chunks:  # every key present before timing: steady state
            for k in part:
                f(k)
        trial = loop_keys(f, chunks)
        trial.warmed = True
        return trial

    def ours(name: str) -> Callable[[], Trial]:
        return lambda: warm(_impl(name).KeyedTokenBucket(rate, capacity, max_keys=max(n, 1)).allow)

    def dict_get() -> Trial:
        return loop_keys(dict.fromkeys(keys.str_keys(n), 0).get, keys.chunks(n, chunk, shuffled))

    def peer(p: str) -> Callable[[], Trial]:
        def build() -> Trial:
            f, _, close = peer_keyed(p, rate, capacity, max_keys=n)
            trial = warm(f)
            trial.close = close
            return trial

        return build

    cases = [
        Case(
            "floor", "floor", lambda: loop_keys(Floor().allow_key, keys.chunks(n, chunk, shuffled))
        ),
        Case("nanobucket-c", "ours", ours("c")),
        Case("nanobucket-py", "twin", ours("py")),
        Case("dict.get", "baseline", dict_get),
        Case("naive", "naive", lambda: warm(NaiveKeyed(rate, capacity).allow)),
    ]
    if with_peers:
        cases += [Case(p, "peer", peer(p)) for p in PEERS]
    return tuple(cases)


def first_touch_cases(keys: Keys, n: int) -> tuple[Case, ...]:
    """Cases for ``f(key)`` with a key the table has never seen, into a fresh table."""
    rate, capacity = KEYED
    fresh = keys.fresh(n)

    def ours(name: str) -> Callable[[], Trial]:
        return lambda: loop_fresh(
            lambda: _impl(name).KeyedTokenBucket(rate, capacity).allow, fresh, n
        )

    def peer(p: str) -> Callable[[], Trial]:
        def build() -> Trial:
            closers: list[Callable[[], None]] = []

            def make() -> Callable[[Any], object]:
                for c in closers:
                    c()
                f, _, close = peer_keyed(p, rate, capacity)
                closers[:] = [close]
                return f

            trial = loop_fresh(make, fresh, n)
            trial.close = lambda: [c() for c in closers] and None
            return trial

        return build

    cases = [
        Case("floor", "floor", lambda: loop_fresh(lambda: Floor().allow_key, fresh, n)),
        Case("nanobucket-c", "ours", ours("c")),
        Case("nanobucket-py", "twin", ours("py")),
        Case("dict.setdefault", "baseline", lambda: loop_fresh(lambda: {}.setdefault, fresh, n)),
        Case(
            "naive", "naive", lambda: loop_fresh(lambda: NaiveKeyed(rate, capacity).allow, fresh, n)
        ),
    ]
    cases += [Case(p, "peer", peer(p)) for p in PEERS]
    return tuple(cases)


def eviction_cases(keys: Keys, max_keys: int, stream: int) -> tuple[Case, ...]:
    """Cases for new keys streaming into a table held at *max_keys* by dropping idle keys."""
    rate, capacity = IDLE_FAST
    fresh = keys.fresh(stream)

    def full(f: Callable[[Any], object]) -> Trial:
        for k in keys.fresh(max_keys)():  # the table starts at its bound
            f(k)
        return loop_stream(f, fresh, stream)

    def ours(name: str) -> Callable[[], Trial]:
        return lambda: full(_impl(name).KeyedTokenBucket(rate, capacity, max_keys=max_keys).allow)

    def throttled() -> Trial:
        f, _, close = peer_keyed("throttled-py", rate, capacity, max_keys=max_keys)
        trial = full(f)
        trial.close = close
        return trial

    return (
        Case("floor", "floor", lambda: loop_stream(Floor().allow_key, fresh, stream)),
        Case("nanobucket-c", "ours", ours("c")),
        Case("nanobucket-py", "twin", ours("py")),
        Case("throttled-py", "peer", throttled),
    )  # the only peer with a bounded table


def _between_loops(
    keys: Callable[[], list[Any]], n: int, *batched: Case, loop: str
) -> tuple[Case, ...]:
    """*batched* (``allow_many``) cases between the floor and the ``allow(key)`` loop they
    replace, both over the same *n* keys."""

    def c_loop() -> Trial:
        t = _impl("c").KeyedTokenBucket(*KEYED, max_keys=max(n, 1))
        return loop_keys(t.allow, [keys()])

    return (
        Case("floor", "floor", lambda: loop_keys(Floor().allow_key, [keys()])),
        *batched,
        Case(loop, "ours", c_loop),
    )


def many_str_cases(keys: Keys, n: int) -> tuple[Case, ...]:
    """``allow_many(list of n str keys)`` beside the per-key loop it replaces.

    The floor is the no-op method called once per key: the least the loop
    that ``allow_many`` replaces can cost.
    """
    rate, capacity = KEYED
    ks = keys.str_keys(n)

    def ours(name: str) -> Callable[[], Trial]:
        def build() -> Trial:
            t = _impl(name).KeyedTokenBucket(rate, capacity, max_keys=max(n, 1))
            t.allow_many(ks)  # warm: every key present
            trial = batch(t.allow_many, ks, n)
            trial.warmed = True
            return trial

        return build

    return _between_loops(
        lambda: ks,
        n,
        Case("nanobucket-c", "ours", ours("c")),
        Case("nanobucket-py", "twin", ours("py")),
        loop="nanobucket-c allow(key) loop",
    )


GOLDEN = 0x9E3779B97F4A7C15  # odd, so i -> i * GOLDEN mod 2**64 is a bijection


def u64_keys(n: int) -> list[int]:
    """*n* distinct uint64 keys spread over the whole range, as ids and hashes are.

    Consecutive ints would land in consecutive slots of a table indexed by
    the int's own hash: a best case no real key set gives.
    """
    return [(i * GOLDEN) & 0xFFFF_FFFF_FFFF_FFFF for i in range(n)]


def u64_buffer(n: int, kind: str) -> object:
    """`u64_keys` as ``array('Q')`` or a numpy ``uint64`` array; "sequential": 0..n-1; "random"."""
    if kind == "sequential":
        return array("Q", range(n))
    if kind == "random":
        rnd = random.Random(n)
        return array("Q", [rnd.getrandbits(64) for _ in range(n)])
    keys = u64_keys(n)
    if kind == "numpy":
        try:
            import numpy
        except ImportError:
            raise Unavailable("numpy is not installed") from None
        return numpy.array(keys, dtype=numpy.uint64)
    return array("Q", keys)


def many_u64_cases(n: int) -> tuple[Case, ...]:
    """``allow_many(uint64 buffer of n keys)``: ``array('Q')`` and numpy.

    The keys are spread over the 64-bit range (`u64_keys`); one case also
    shows the flattering 0..n-1, for comparison with figures quoted that way,
    and one random keys (the spread keys are a golden-ratio sequence, which
    a table indexed by CPython's hash of an int spreads with no collision).
    """
    rate, capacity = KEYED

    def ours(name: str, kind: str) -> Callable[[], Trial]:
        def build() -> Trial:
            buf = u64_buffer(n, kind)
            t = _impl(name).KeyedTokenBucket(rate, capacity, max_keys=max(n, 1))
            try:
                first = t.allow_many(buf)
            except TypeError as exc:
                raise Unavailable(f"allow_many rejects a {kind} buffer: {exc}") from None
            if len(first) != n:
                raise AssertionError("allow_many returned the wrong length")
            trial = batch(t.allow_many, buf, n)
            trial.warmed = True
            return trial

        return build

    return _between_loops(
        lambda: u64_keys(n),
        n,
        Case("nanobucket-c array('Q')", "ours", ours("c", "array")),
        Case("nanobucket-c numpy.uint64", "ours", ours("c", "numpy")),
        Case("nanobucket-c array('Q') 0..n-1", "ours", ours("c", "sequential")),
        Case("nanobucket-c array('Q') random", "ours", ours("c", "random")),
        Case("nanobucket-py array('Q')", "twin", ours("py", "array")),
        loop="nanobucket-c allow(int) loop",
    )


MERSENNE = 2**61 - 1  # CPython: hash(n) == n % MERSENNE for n >= 0


def aimed_keys(kind: str, n: int) -> tuple[list[Any], list[Any]]:
    """*n* keys of *kind* an attacker aims at one slot, and *n* random ones of the same type.

    CPython's hash of an int is the int itself (mod 2**61 - 1), so multiples
    of 2**21 all start at slot 0 of any table of up to 2**21 slots; the
    multiples of 2**61 - 1 all hash to 0.
    """
    rnd = random.Random(kind)
    if kind == "int":
        return [i << 21 for i in range(1, n + 1)], u64_keys(n)
    if kind == "negative int":
        return [-(i << 21) for i in range(1, n + 1)], [-k - 1 for k in u64_keys(n)]
    if kind == "float":
        return [float(i << 21) for i in range(1, n + 1)], [float(k >> 11) for k in u64_keys(n)]
    if kind == "int, equal hashes":
        return [(i + 1) * MERSENNE for i in range(n)], [rnd.getrandbits(77) for _ in range(n)]
    if kind == "tuple":
        return [(1, i << 21) for i in range(1, n + 1)], [(1, k) for k in u64_keys(n)]
    raise ValueError(kind)


AIMED_KINDS = ("int", "negative int", "float", "int, equal hashes", "tuple")


def aimed_cases(n: int, sweep_max_keys: int) -> tuple[Case, ...]:
    """Hash flooding: *n* new keys into a fresh table, aimed at one slot beside random ones.

    Each kind is timed with random keys of the same type and with aimed
    keys: the ratio of the two is what an attacker gains. ``sweep`` streams
    the keys through a table bounded at *sweep_max_keys* (every bucket still
    owes tokens, so each sweep forgives), ``allow_many`` decides them as one
    ``array('Q')`` batch.
    """
    rate, capacity = KEYED

    def table(max_keys: int = 10**6) -> Any:
        return _impl("c").KeyedTokenBucket(rate, capacity, max_keys=max_keys)

    def per_call(ks: list[Any], max_keys: int = 10**6) -> Callable[[], Trial]:
        return lambda: loop_fresh(lambda: table(max_keys).allow, lambda: ks, len(ks))

    def many(ks: list[int]) -> Callable[[], Trial]:
        def build() -> Trial:
            buf = array("Q", ks)
            box: list[Any] = [table()]  # now: Unavailable here without the extension

            def reset() -> None:
                box[0] = None
                box[0] = table()

            def run() -> None:
                box[0].allow_many(buf)

            return Trial(run, len(ks), reset)

        return build

    cases = [Case("floor", "floor", lambda: loop_keys(Floor().allow_key, [list(range(n))]))]
    for kind in AIMED_KINDS:
        aimed, rnd = aimed_keys(kind, n)
        cases += [
            Case(f"{kind}: random", "baseline", per_call(rnd)),
            Case(f"{kind}: aimed", "ours", per_call(aimed)),
        ]
    aimed, rnd = aimed_keys("int", n)
    twin = _impl("py").KeyedTokenBucket  # a dict: it probes with every bit of the hash
    cases += [
        Case(
            "int: aimed, pure-Python twin",
            "twin",
            lambda: loop_fresh(lambda: twin(rate, capacity).allow, lambda: aimed, n),
        ),
        Case("int sweep: random", "baseline", per_call(rnd, sweep_max_keys)),
        Case("int sweep: aimed", "ours", per_call(aimed, sweep_max_keys)),
        Case("allow_many u64: random", "baseline", many(rnd)),
        Case("allow_many u64: aimed", "ours", many(aimed)),
    ]
    return tuple(cases)


def groups(sizes: Sizes = FULL, keys: Keys | None = None) -> list[Group]:
    """Every group, in the order they are reported."""
    keys = keys or Keys()
    s = sizes
    return [
        Group(
            "allow_allowing",
            "single allow(), admitted",
            "call",
            single_cases(s.calls, ALLOWING, True),
        ),
        Group(
            "allow_rejecting",
            "single allow(), rejected",
            "call",
            single_cases(s.calls, REJECTING, False),
        ),
        Group(
            "check",
            "single check() -> Decision, admitted",
            "call",
            single_cases(s.calls, ALLOWING, True, verb="check"),
        ),
        Group(
            "keyed_small",
            f"keyed allow(key), {s.keyed_small:,} str keys round-robin",
            "call",
            keyed_cases(keys, s.keyed_small, s.keyed_chunk, with_peers=True),
        ),
        Group(
            "keyed_large",
            f"keyed allow(key), {s.keyed_large:,} str keys round-robin",
            "call",
            keyed_cases(
                keys, s.keyed_large, min(s.keyed_large, 5 * s.keyed_chunk), with_peers=False
            ),
        ),
        Group(
            "first_touch",
            "keyed allow(key), first touch of a new key",
            "call",
            first_touch_cases(keys, s.first_touch),
        ),
        Group(
            "eviction",
            f"new keys into a table at max_keys={s.evict_max_keys:,} (idle keys dropped)",
            "call",
            eviction_cases(keys, s.evict_max_keys, s.evict_stream),
        ),
        Group(
            "allow_many_str",
            f"allow_many, list of {s.many_str:,} str keys",
            "key",
            many_str_cases(keys, s.many_str),
        ),
        Group(
            "allow_many_u64",
            f"allow_many, {s.many_u64:,} int keys in a uint64 buffer",
            "key",
            many_u64_cases(s.many_u64),
        ),
        Group(
            "keyed_shuffled",
            f"keyed allow(key), {s.keyed_large:,} str keys in random order",
            "call",
            keyed_cases(
                keys,
                s.keyed_large,
                min(s.keyed_large, 5 * s.keyed_chunk),
                with_peers=False,
                shuffled=True,
            ),
        ),
        Group(
            "aimed",
            f"hash flooding: {s.aimed:,} new keys aimed at one slot, beside random ones",
            "call",
            aimed_cases(s.aimed, s.aimed // 3),
        ),
    ]


def peer_versions() -> dict[str, str | None]:
    """The installed version of each peer library (None when not installed)."""
    out: dict[str, str | None] = {}
    for name, dist in PEERS.items():
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def pytest_functions(group_id: str) -> dict[str, Callable[..., None]]:
    """One pytest-benchmark test per case of *group_id*, named ``test_<group>__<case>``.

    The benchmarks modules put these in their namespace, so each case is a
    test of its own with a name that says which it is (no parametrize ids).
    ``NANOBUCKET_BENCH_QUICK=1`` picks the `QUICK` sizes and 3 rounds;
    ``NANOBUCKET_BENCH_ROUNDS`` sets the rounds (default 9).
    """
    quick = os.environ.get("NANOBUCKET_BENCH_QUICK", "") not in ("", "0")
    rounds = int(os.environ.get("NANOBUCKET_BENCH_ROUNDS", "3" if quick else "9"))
    (group,) = [g for g in groups(QUICK if quick else FULL) if g.id == group_id]
    out: dict[str, Callable[..., None]] = {}
    for case in group.cases:
        slug = "".join(ch if ch.isalnum() else "_" for ch in case.name).strip("_")
        name = f"test_{group.id}__{slug}"

        def test(benchmark: Any, group: Group = group, case: Case = case) -> None:
            _pytest_run(benchmark, group, case, rounds)

        test.__name__ = test.__qualname__ = name
        test.__doc__ = f"{group.title}: {case.name} ({case.role})"
        out[name] = test
    return out


def _pytest_run(benchmark: Any, group: Group, case: Case, rounds: int) -> None:
    import gc

    import pytest

    try:
        trial = case.build()
    except Unavailable as exc:
        pytest.skip(str(exc))
    benchmark.group = f"{group.id}: {group.title} (per round: see calls_per_round)"
    benchmark.extra_info.update(
        calls_per_round=trial.calls, unit=group.unit, role=case.role, case=case.name
    )
    gc.collect()
    try:
        benchmark.pedantic(
            trial.run,
            setup=trial.reset,
            rounds=rounds,
            warmup_rounds=0 if trial.warmed else 1,
            iterations=1,
        )
    finally:
        if trial.close is not None:
            trial.close()
    stats = benchmark.stats.stats if benchmark.stats is not None else None
    if stats is not None:
        benchmark.extra_info["ns_per_" + group.unit] = stats.median * 1e9 / trial.calls

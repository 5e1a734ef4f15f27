"""Every entry point holds: objects not (or no longer) initialised, lying numbers, the GC.

* An extension object made with ``cls.__new__(cls)``, or whose ``__init__``
  raised, or that the garbage collector cleared, raises on every verb (or
  returns a defined value): it never crashes. Each type is probed in a
  subprocess, so a segfault fails its test instead of ending the run.
* A number is read once, as the value it holds: an int subclass whose
  ``__int__`` / ``__index__`` say otherwise, or an object that claims to be
  an int, cannot pass the checks with one value and be used with another.
* A key that refers back to its table is freed by the garbage collector, in
  both implementations.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import importlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
import threading
import weakref
from collections.abc import Callable
from fractions import Fraction
from types import ModuleType
from typing import Any, TypeVar

import pytest

import nanobucket as nb
from nanobucket._core import _bucket_py, _params

from conftest import run_threads

try:
    from nanobucket._core import _bucket_c
except ImportError:  # pragma: no cover - a pure-Python install
    _bucket_c = None  # type: ignore[assignment]

F = TypeVar("F", bound=Callable[..., object])


def needs_c(test: F) -> F:
    """A test of the extension: deselected by --no-c-extensions, skipped when not built."""
    skip = pytest.mark.skipif(_bucket_c is None, reason="the Cython extension is not built")
    marked: F = pytest.mark.c_extension(skip(test))
    return marked


# -- objects whose __init__ never ran, raised, or was undone by the collector --

# Run in a fresh interpreter: ``python -c PROBE subject class``. Prints one
# JSON object, expression -> "raise:<type>" or "value:<repr>".
PROBE = textwrap.dedent(
    """
    import asyncio, ctypes, json, sys
    from array import array
    import nanobucket as nb
    from nanobucket import shared
    from nanobucket._core import _bucket_c as C, _shared_c as S
    from nanobucket.bench import _floor as F
    from nanobucket.shared import SharedKeyedTokenBucket

    subject, name = sys.argv[1], sys.argv[2]
    cls = {"SharedKeyedTokenBucket": SharedKeyedTokenBucket,
           **{k: v for m in (C, S, F) for k, v in vars(m).items()
              if isinstance(v, type) and v.__module__ == m.__name__}}[name]
    run = asyncio.run


    def gc_clear(o):
        # The type's tp_clear, as the collector calls it: found as the slot
        # two after tp_flags (tp_doc, tp_traverse, tp_clear) in the type object.
        words = (ctypes.c_ulong * 64).from_address(id(type(o)))
        at = list(words).index(type(o).__flags__)
        clear = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)(words[at + 3])
        assert clear(o) == 0


    def make():
        o = cls.__new__(cls)
        if subject == "failed":  # an __init__ that raised after its first arguments were good
            bad = {"TokenBucket": ((1, 2), {"clock": 5}),
                   "KeyedTokenBucket": ((1, 2), {"max_keys": 0}),
                   "_Limits": ((1, 2, 5), {})}.get(name)
            if bad is not None:
                try:
                    o.__init__(*bad[0], **bad[1])
                except (TypeError, ValueError):
                    pass
                else:
                    raise AssertionError("__init__ accepted bad arguments")
        elif subject == "cleared":  # a table the garbage collector cleared
            o = C.KeyedTokenBucket(rate=1, capacity=5, max_keys=1000)
            for i in range(20):
                o.allow_at(f"k{i}", 0)
                o.allow_at(i, 0)
            gc_clear(o)
        return o


    out = {}
    for expr in json.loads(sys.argv[3]):
        o = make()
        try:
            value = eval(expr)
        except Exception as exc:
            out[expr] = "raise:" + type(exc).__name__
        else:
            out[expr] = "value:" + repr(value)
        del o
    print(json.dumps(out))
    """
)

RAISE = "raise:RuntimeError"
CLOSED = "raise:ValueError"

TOKEN_BUCKET_VERBS = [
    "o.allow()",
    "o.allow(cost=0)",
    "o.allow(cost=2)",
    "o.allow_at(0)",
    "o.allow_at(0, cost=0)",
    "o.check()",
    "o.check(0)",
    "o.check_at(0)",
    "o.check_at(0, 0)",
    "o.peek()",
    "o.peek_at(0)",
    "o.peek_at(0, 0)",
    "o.tokens()",
    "o.tokens_at(0)",
    "o.refund()",
    "o.refund_at(0)",
    "o.refund_at(0, 0)",
    "o.reset()",
    "o.reserve(cost=1)",
    "o.reserve(cost=0, shape=True, now=0)",
    "o.reservation(cost=1)",
    "o.reservation(now=0, max_wait_ns=10)",
    "o.reconfigure(rate=2)",
    "o.reconfigure(capacity=2, now=0)",
    "o.acquire()",
    "o.acquire(cost=0, timeout=0)",
    "run(o.acquire_async())",
    "o.rate",
    "o.clock_ns()",
    "nb.all_of(o).allow()",
    "nb.all_of(o, C.TokenBucket(1, 5)).allow(cost=0)",
    "nb.all_of(C.TokenBucket(1, 5), o).allow(cost=0)",
]
KEYED_VERBS = [
    "o.allow('k')",
    "o.allow('k', 0)",
    "o.allow('k', 2)",
    "o.allow(7)",
    "o.allow_at('k', 0)",
    "o.allow_at('k', 0, 0)",
    "o.allow_many(['k', 7])",
    "o.allow_many(['k'], 0)",
    "o.allow_many(array('Q', [7, 8]))",
    "o.allow_many_at(['k'], 0)",
    "o.allow_many_at(array('Q', [7]), 0, 2)",
    "o.check('k')",
    "o.check('k', 0)",
    "o.check_at('k', 0)",
    "o.check_at('k', 0, 0)",
    "o.peek('k')",
    "o.peek_at('k', 0)",
    "o.peek_at('k', 0, 0)",
    "o.tokens('k')",
    "o.tokens_at('k', 0)",
    "o.refund('k')",
    "o.refund_at('k', 0)",
    "o.refund_at('k', 0, 0)",
    "o.reset('k')",
    "o.reset([])",
    "o.reserve('k', cost=1)",
    "o.reserve('k', cost=0, shape=True, now=0)",
    "o.reservation('k', cost=1)",
    "o.reservation('k', now=0, shape=True)",
    "o.reconfigure(rate=2)",
    "o.reconfigure(capacity=2, now=0)",
    "o.acquire('k')",
    "o.acquire('k', cost=0, timeout=0)",
    "run(o.acquire_async('k'))",
    "len(o)",
    "o.rate",
    "o.clock_ns()",
    "nb.all_of(o).allow('k')",
    "nb.all_of(C.TokenBucket(1, 5), o).allow('k')",
    "nb.all_of(C.TokenBucket(1, 5), o).allow('k', 0)",
]
SHARED_VERBS = [
    "o.allow('k')",
    "o.allow_at('k', 0)",
    "o.allow_at('k', 0, 0)",
    "o.allow_many(['k'])",
    "o.allow_many_at(['k'], 0)",
    "o.check('k')",
    "o.check_at('k', 0)",
    "o.peek('k')",
    "o.peek_at('k', 0)",
    "o.tokens('k')",
    "o.tokens_at('k', 0)",
    "o.refund('k')",
    "o.refund_at('k', 0)",
    "o.reserve('k', cost=1, now=0)",
    "len(o)",
    "o.__enter__()",
]
SHARED_VALUES = {
    "o.close()": "value:None",
    "o.closed": "value:True",
    "o.when_full": "value:'reject'",
    "o.rate": "value:None",
    "o.capacity": "value:0",
    "o.interval_ns": "value:0",
    "o.max_keys": "value:0",
    "o.slot_count": "value:0",
    "o.path": "value:None",
    "o.none_key": "value:False",
    "o.__exit__(None, None, None)": "value:None",
}

# class -> expression -> the outcome on an object made with __new__ (or whose __init__ raised)
EXPECTED: dict[str, dict[str, str]] = {
    "Decision": {
        "o.allowed": "value:False",
        "o.remaining": "value:0",
        "o.retry_after_ns": "value:0",
        "o.reset_after_ns": "value:0",
        "o.limit": "value:0",
        "o.retry_after": "value:0.0",
        "o.reset_after": "value:0.0",
        "bool(o)": "value:False",
        "o._fields()": "value:(False, 0, 0, 0, 0)",
        "o == o": "value:True",
        "o.copy_as(type(o)) == o": "value:True",
        "hash(o) == hash((False, 0, 0, 0, 0))": "value:True",
        "repr(o)": (
            "value:'Decision(allowed=False, remaining=0, retry_after_ns=0, "
            "reset_after_ns=0, limit=0)'"
        ),
    },
    "_Limits": {
        "o.rate": RAISE,
        "o.clock_ns()": RAISE,
        "o.capacity": "value:0",
        "o.interval_ns": "value:0",
        "o.per_process": "value:False",
    },
    "TokenBucket": {
        **dict.fromkeys(TOKEN_BUCKET_VERBS, RAISE),
        "o.capacity": "value:0",
        "o.interval_ns": "value:0",
        "o.keyed": "value:False",
        "o.per_process": "value:False",
        "repr(o)": "value:'<TokenBucket, not initialised>'",
        "C.AllowAll.of((o,), None)": "value:None",
    },
    "KeyedTokenBucket": {
        **dict.fromkeys(KEYED_VERBS, RAISE),
        "o.capacity": "value:0",
        "o.interval_ns": "value:0",
        "o.max_keys": "value:0",
        "o.none_key": "value:False",
        "o.per_process": "value:False",
        "o.keyed": "value:True",
        "o.__sizeof__() > 0": "value:True",
        "repr(o)": "value:'<KeyedTokenBucket, not initialised>'",
        "C.AllowAll.of((o,), None)": "value:None",
    },
    "AllowAll": {
        "o.allow()": RAISE,
        "o.allow('k')": RAISE,
        "o.allow('k', 0)": RAISE,
        "o.check()": RAISE,
        "o.check('k', 0)": RAISE,
        "o.of((C.TokenBucket(1, 5),), None).allow()": "value:True",
        "o.of((C.TokenBucket(1, 5),), None).check()": "raise:TypeError",
        "o.keyed": "value:True",
    },
    "SharedTable": {**dict.fromkeys(SHARED_VERBS, CLOSED), **SHARED_VALUES},
    "SharedKeyedTokenBucket": {
        **dict.fromkeys(SHARED_VERBS, CLOSED),
        **SHARED_VALUES,
        "o.keyed": "value:True",
        "o.unlink()": "raise:ValueError",
        "o.reservation('k', now=0)": CLOSED,
    },
    "Floor": {
        "o.allow()": "value:True",
        "o.allow_clock()": "value:True",
        "o.allow_at(0)": "value:True",
        "o.allow_key('k')": "value:True",
        "o.check()": "value:True",
        "o.check_key('k')": "value:True",
        "o.allow_many(['k'])": "value:None",
    },
}
# After the collector's clear the table keeps its parameters but not its keys.
CLEARED = {
    **EXPECTED["KeyedTokenBucket"],
    "o.interval_ns": "value:1000000000",
    "o.max_keys": "value:1000",
}


def probe(subject: str, name: str, exprs: dict[str, str]) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, subject, name, json.dumps(list(exprs))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"the probe died ({proc.returncode}): {proc.stderr[-2000:]}"
    result: dict[str, str] = json.loads(proc.stdout)
    return result


@needs_c
def test_every_extension_type_and_public_name_is_probed() -> None:
    from nanobucket.shared import SharedKeyedTokenBucket

    _floor = importlib.import_module("nanobucket.bench._floor")
    _shared_c = importlib.import_module("nanobucket._core._shared_c")

    types: dict[str, type] = {"SharedKeyedTokenBucket": SharedKeyedTokenBucket}
    for module in (_bucket_c, _floor, _shared_c):
        for key, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == module.__name__:
                types[key] = value
    assert set(types) == set(EXPECTED)
    for key, cls in types.items():
        named = {n for n in dir(cls) if not n.startswith("_")} - {
            "of",
            "create",
            "create_anonymous",
            "open",
            "open_or_create",
        }
        probed = " ".join(EXPECTED[key])
        assert {n for n in named if f".{n}" not in probed} == set(), key


@needs_c
@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("subject", ["new", "failed"])
def test_an_object_not_initialised_raises(subject: str, name: str) -> None:
    assert probe(subject, name, EXPECTED[name]) == EXPECTED[name]


@needs_c
def test_a_table_the_collector_cleared_raises() -> None:
    assert probe("cleared", "KeyedTokenBucket", CLEARED) == CLEARED


def test_the_twin_not_initialised_raises() -> None:
    # Its fields are unset slots; it says so as the Cython classes do: RuntimeError.
    b = _bucket_py.TokenBucket.__new__(_bucket_py.TokenBucket)
    t = _bucket_py.KeyedTokenBucket.__new__(_bucket_py.KeyedTokenBucket)
    calls: list[Callable[[], object]] = [
        b.allow,
        b.check,
        b.tokens,
        lambda: b.allow_at(0),
        lambda: b.refund_at(0),
        lambda: t.allow("k"),
        lambda: t.allow_at("k", 0, 0),
        lambda: t.allow_many(["k"]),
        lambda: t.tokens_at("k", 0),
        lambda: len(t),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="its __init__ did not complete"):
            call()
    with pytest.raises(AttributeError, match="'TokenBucket' object has no attribute 'nope'"):
        b.nope  # type: ignore[attr-defined]  # noqa: B018  # not a slot: an ordinary one


def test_an_init_that_raised_can_be_retried(impl: ModuleType) -> None:
    # (Its verbs in between raise: see the probes above, in a subprocess.)
    t = impl.KeyedTokenBucket.__new__(impl.KeyedTokenBucket)
    with pytest.raises(ValueError, match="max_keys"):
        t.__init__(rate=1, capacity=2, max_keys=0)
    t.__init__(rate=1, capacity=2, max_keys=10)
    assert [t.allow_at("k", 0) for _ in range(3)] == [True, True, False]
    assert (t.capacity, t.max_keys, t.rate) == (2, 10, 1)

    b = impl.TokenBucket.__new__(impl.TokenBucket)
    with pytest.raises(TypeError, match="clock"):
        b.__init__(rate=1, capacity=2, clock=5)
    if impl is _bucket_c:
        assert b.capacity == 0
    else:
        with pytest.raises(RuntimeError, match="its __init__ did not complete"):
            b.capacity  # noqa: B018
    b.__init__(rate=1, capacity=3)
    assert [b.allow_at(0) for _ in range(4)] == [True, True, True, False]


def test_a_second_init_raises_and_changes_nothing(impl: ModuleType) -> None:
    clock = lambda: 0  # noqa: E731
    b = impl.TokenBucket(rate=1, capacity=2, clock=clock)
    t = impl.KeyedTokenBucket(rate=1, capacity=2, max_keys=10, clock=clock)
    assert b.allow() and t.allow("k")
    with pytest.raises(RuntimeError, match="already initialised"):
        b.__init__(rate=1000, capacity=1000)
    with pytest.raises(RuntimeError, match="already initialised"):
        t.__init__(rate=1000, capacity=1000, max_keys=5)
    assert (b.rate, b.capacity, t.rate, t.capacity, t.max_keys) == (1, 2, 1, 2, 10)
    assert (b.tokens(), t.tokens("k"), len(t)) == (1.0, 1.0, 1)
    assert [b.allow(), b.allow(), t.allow("k"), t.allow("k")] == [True, False, True, False]


@needs_c
def test_a_bucket_pickles_and_copies_through_its_init() -> None:
    b = _bucket_c.TokenBucket(rate=Fraction(1, 2), capacity=4)
    assert b.allow_at(0, cost=3)
    for twin in (pickle.loads(pickle.dumps(b)), copy.copy(b), copy.deepcopy(b)):
        assert (twin.rate, twin.capacity, twin.tokens_at(0)) == (Fraction(1, 2), 4, 1.0)
        assert [twin.allow_at(0), twin.allow_at(0)] == [True, False]
    assert b.tokens_at(0) == 1.0
    with pytest.raises(RuntimeError, match="not usable"):
        pickle.dumps(_bucket_c.TokenBucket.__new__(_bucket_c.TokenBucket))


@pytest.mark.gil_atomic
def test_verbs_racing_reconfigure_see_one_configuration(impl: ModuleType) -> None:
    # At one instant (a frozen clock), every decision is made with one of the
    # configurations, never a mix: its limit is one of them, and a probe
    # (cost 0) is admitted with 0 <= remaining <= limit.
    clock = lambda: 0  # noqa: E731
    b = impl.TokenBucket(rate=1, capacity=2, clock=clock)
    t = impl.KeyedTokenBucket(rate=1, capacity=2, max_keys=64, clock=clock)
    configs = [(1, 2), (1000, 1000)]
    stop = threading.Event()
    limits: set[int] = set()

    def work(i: int) -> None:
        if i == 0:
            for n in range(400):
                rate, cap = configs[n % 2]
                b.reconfigure(rate=rate, capacity=cap)
                t.reconfigure(rate=rate, capacity=cap)
            stop.set()
            return
        n = 0
        while not stop.is_set():
            n += 1
            b.allow()
            t.allow(f"k{n % 80}")
            for d in (b.check(cost=0), t.check(f"k{n % 80}", cost=0)):
                limits.add(d.limit)
                assert d.allowed and 0 <= d.remaining <= d.limit, d
            assert 0.0 <= t.tokens("k1") <= 1000.0

    run_threads(3, work)
    assert limits <= {2, 1000}
    assert (b.capacity, t.capacity, b.interval_ns, t.interval_ns) == (1000, 1000, 10**6, 10**6)


# -- numbers that lie ---------------------------------------------------------


class Liar(int):
    """An int whose __int__ and __index__ (and float()) give another value."""

    says: int = 0

    def __new__(cls, value: int, says: int) -> Liar:
        self = super().__new__(cls, value)
        self.says = says
        return self

    def __int__(self) -> int:
        return self.says

    def __index__(self) -> int:
        return self.says

    def __float__(self) -> float:
        return float(self.says)


class FloatLiar(float):
    """A float whose __float__ and __repr__ give another value."""

    def __float__(self) -> float:
        return -1.0

    def __repr__(self) -> str:
        return "1e-9"


class ClaimsInt:
    """Not an int, but claims to be one (``__class__``), with comparisons that pass."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return int

    def __index__(self) -> int:
        return -5

    __int__ = __index__

    def __lt__(self, other: object) -> bool:
        return False

    __gt__ = __lt__

    def __le__(self, other: object) -> bool:
        return True

    __ge__ = __le__

    def __mul__(self, other: object) -> int:
        return -5 * other  # type: ignore[operator]

    __rmul__ = __mul__


def test_a_cost_is_used_as_it_was_checked(impl: ModuleType) -> None:
    # Claims 1 (its value), then says 0: admits exactly what cost 1 admits.
    b = impl.TokenBucket(rate=1, capacity=2)
    t = impl.KeyedTokenBucket(rate=1, capacity=2)
    one = Liar(1, says=0)
    assert [b.allow_at(0, cost=one) for _ in range(3)] == [True, True, False]
    assert [t.allow_at("k", 0, cost=one) for _ in range(3)] == [True, True, False]
    assert list(t.allow_many_at(["j", "j", "j"], 0, one)) == [1, 1, 0]
    assert b.check_at(0, one).retry_after_ns == t.check_at("k", 0, one).retry_after_ns == 10**9
    assert b.peek_at(0, one).remaining == 0
    # A refund of 1 that says -5 gives back 1 token, never takes 5.
    b.refund_at(0, Liar(1, says=-5))
    t.refund_at("k", 0, Liar(1, says=-5))
    assert (b.tokens_at(0), t.tokens_at("k", 0)) == (1.0, 1.0)
    # Says 10**30 (an OverflowError, or a SystemError, once): cost 2 is cost 2.
    b2 = impl.TokenBucket(rate=1, capacity=2)
    assert b2.allow_at(0, Liar(2, says=10**30)) and b2.tokens_at(0) == 0.0


def test_a_cost_that_only_claims_to_be_an_int_is_refused(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=1, capacity=2)
    t = impl.KeyedTokenBucket(rate=1, capacity=2)
    calls: list[Callable[[], object]] = [
        lambda: b.allow(ClaimsInt()),
        lambda: b.allow_at(0, ClaimsInt()),
        lambda: b.refund_at(0, ClaimsInt()),
        lambda: t.allow("k", ClaimsInt()),
        lambda: t.check_at("k", 0, ClaimsInt()),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="cost must be an int, not ClaimsInt"):
            call()
    with pytest.raises(TypeError, match="now must be an int of nanoseconds, not ClaimsInt"):
        b.allow_at(ClaimsInt())
    with pytest.raises(TypeError, match="capacity must be an int, not ClaimsInt"):
        impl.TokenBucket(rate=1, capacity=ClaimsInt())
    assert (b.tokens_at(0), t.tokens_at("k", 0)) == (2.0, 2.0)


def test_a_time_is_used_as_it_was_checked(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=1, capacity=1)
    assert b.allow_at(Liar(0, says=10**30))
    # 0.5 s later by its value (says 10 s): half a token, not a full bucket.
    assert not b.allow_at(Liar(5 * 10**8, says=10 * 10**9))
    assert b.tokens_at(Liar(5 * 10**8, says=-1)) == 0.5
    assert b.allow_at(Liar(10**9, says=0))
    # The clock's reading, too.
    now = [Liar(0, says=10**30)]
    c = impl.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: now[0])
    assert [c.allow("k"), c.allow("k")] == [True, False]
    now[0] = Liar(10**9, says=0)
    assert [c.allow("k"), c.tokens("k")] == [True, 0.0]


def test_rate_capacity_and_max_keys_are_used_as_they_were_checked(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=Liar(1, says=10**9), capacity=Liar(2, says=10**6))
    assert (b.rate, b.capacity, b.interval_ns) == (1, 2, 10**9)
    assert (type(b.rate), type(b.capacity)) == (int, int)
    assert [b.allow_at(0) for _ in range(3)] == [True, True, False]
    b.reconfigure(capacity=Liar(4, says=1), now=0)  # the stored rate is re-read: still 1
    assert (b.rate, b.capacity, b.interval_ns, b.tokens_at(0)) == (1, 4, 10**9, 0.0)
    t = impl.KeyedTokenBucket(rate=1, capacity=1, max_keys=Liar(1, says=10**6))
    assert t.max_keys == 1 and type(t.max_keys) is int
    f = impl.TokenBucket(rate=FloatLiar(2.0), capacity=1)
    assert (f.rate, f.interval_ns) == (Fraction(2), 5 * 10**8)


class Shifty(Fraction):
    """A Fraction whose numerator reads 1 the first time and 1000 after."""

    reads = 0

    @property
    def numerator(self) -> int:
        Shifty.reads += 1
        return 1 if Shifty.reads == 1 else 1000


class BadDenominator(Fraction):
    @property
    def denominator(self) -> int:
        return -1


def test_a_rational_rate_is_read_once(impl: ModuleType) -> None:
    Shifty.reads = 0
    b = impl.TokenBucket(rate=Shifty(1), capacity=2)
    assert (b.rate, type(b.rate), b.interval_ns) == (Fraction(1), Fraction, 10**9)
    b.reconfigure(capacity=3, now=0)
    assert (b.rate, b.interval_ns, Shifty.reads) == (Fraction(1), 10**9, 1)
    # Fraction(x) would keep x's parts as they are: -1 as the denominator
    # of a positive-looking rate, and a negative refill interval.
    with pytest.raises(ValueError, match="denominator"):
        impl.TokenBucket(rate=BadDenominator(5), capacity=1)


def test_timeout_and_max_waiters_are_used_as_they_were_checked(impl: ModuleType) -> None:
    assert _params.validated_timeout(Liar(2, says=-1)) == 2.0
    assert _params.validated_timeout(FloatLiar(0.5)) == 0.5
    assert type(_params.validated_timeout(FloatLiar(0.5))) is float
    with pytest.raises(TypeError, match="timeout"):
        _params.validated_timeout(ClaimsInt())
    assert nb.Waiting(impl.TokenBucket(1, 1), max_waiters=Liar(0, says=5)).max_waiters == 0
    # timeout 0 (says 10**6): the wait for the next token (1 s) is refused at once.
    b = impl.TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    assert b.acquire() is True
    assert b.acquire(timeout=Liar(0, says=10**6)) is False
    assert asyncio.run(b.acquire_async(timeout=Liar(0, says=10**6))) is False


@needs_c
def test_the_shared_table_uses_numbers_as_they_were_checked() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t")
        with nb.SharedKeyedTokenBucket.create(
            path=path, rate=Liar(1, says=10**9), capacity=Liar(2, says=10**6)
        ) as t:
            assert (t.rate, t.capacity, t.interval_ns) == (1, 2, 10**9)
            assert (type(t.rate), type(t.capacity)) == (int, int)
            one = Liar(1, says=0)
            assert [t.allow_at("k", Liar(0, says=10**30), one) for _ in range(3)] == [
                True,
                True,
                False,
            ]
            assert t.tokens_at("k", Liar(5 * 10**8, says=0)) == 0.5
            with pytest.raises(TypeError, match="cost must be an int, not ClaimsInt"):
                t.allow_at("k", 0, ClaimsInt())  # type: ignore[arg-type]
            # A key past int64 is fingerprinted by its value, whatever __int__ says.
            big = [Liar(2**70, says=i) for i in range(3)]
            assert [t.allow_at(k, 0) for k in big] + [t.allow_at(2**70, 0)] == [
                True,
                True,
                False,
                False,
            ]


# -- the garbage collector ------------------------------------------------------


class Owner:
    """A key that holds its table: a cycle through the table's key storage."""

    def __init__(self, table: Any) -> None:
        self.table = table


class Marker:
    pass


INSERTS: dict[str, Callable[[Any, Any], object]] = {
    "allow": lambda t, key: t.allow_at(key, 0),
    "allow_many": lambda t, key: t.allow_many_at(["other", key, 7], 0),
    "check": lambda t, key: t.check_at(key, 0),
    "acquire": lambda t, key: t.acquire(key),
    "reserve": lambda t, key: t.reserve(key, cost=1, now=0),
}


@pytest.mark.parametrize("insert", sorted(INSERTS))
def test_a_key_that_holds_its_table_is_collected(impl: ModuleType, insert: str) -> None:
    # Each way a key gets into the table, after str and int keys (which
    # cannot be in a cycle) came first.
    gc.collect()
    t = impl.KeyedTokenBucket(rate=1, capacity=5, clock=lambda: 0)
    t.allow_many_at(["a", "b", 1, 2], 0)
    key = Owner(t)
    alive = weakref.ref(key)
    INSERTS[insert](t, key)
    assert t.tokens_at(key, 0) == 4.0
    del t, key
    gc.collect()
    assert alive() is None


def test_a_cycle_is_seen_after_the_collector_untracked_every_key(impl: ModuleType) -> None:
    # Tuples of ints are untracked by the collector, after which there is
    # nothing to visit; a key that can be in a cycle, arriving later, is.
    t = impl.KeyedTokenBucket(rate=1, capacity=5)
    for i in range(100):
        t.allow_at((i, "x"), 0)
    gc.collect()
    gc.collect()
    key = Owner(t)
    alive = weakref.ref(key)
    t.allow_at(key, 0)
    del t, key
    gc.collect()
    assert alive() is None


def test_a_tuple_key_that_holds_its_table_is_collected(impl: ModuleType) -> None:
    # A tuple cannot be cleared: only the table's own clear breaks this cycle.
    gc.collect()
    t = impl.KeyedTokenBucket(rate=1, capacity=5)
    marker = Marker()
    alive = weakref.ref(marker)
    assert t.allow_at((t, marker), 0)
    del t, marker
    gc.collect()
    assert alive() is None


def test_the_collector_sees_every_key(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=5)
    keys = [Owner(None) for _ in range(50)]
    for key in keys:
        t.allow_at(key, 0)
    t.allow_at("plain", 0)
    referents = gc.get_referents(t)
    if impl is _bucket_py:  # the twin's keys are in its dict
        referents = [r for d in referents if isinstance(d, dict) for r in d]
    assert {id(k) for k in keys} <= {id(r) for r in referents}

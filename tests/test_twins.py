"""The Cython core and its pure-Python twin: one API, one text, one rule.

Behaviour is compared elsewhere (every behaviour test runs on both, and
test_differential replays random traces through both). Here: the twins
document the same members with the same docstrings, and the twin's verbs
that inline its `step` for speed decide exactly as `step` does.
"""

from __future__ import annotations

import inspect
import re
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanobucket._core import _bucket_py, _decision_py
from nanobucket._core._gcra_py import step
from nanobucket._core._params import RateLike

# Names only the Cython core has: its entry counter (for tests), Decision's
# field tuple (the twin's is a module function), and AllowAll (all_of's
# one-call path over Cython buckets).
C_ONLY = {"KeyedTokenBucket._probes", "Decision._fields", "AllowAll"}
# The Cython build embeds a signature line in a docstring (embedsignature),
# unless Python moves it to __text_signature__: not part of the text.
SIGNATURE = re.compile(r"\A\w+\(.*\)\n--\n\n")


def _doc(member: object) -> str | None:
    doc = getattr(member, "__doc__", None)
    if not isinstance(doc, str):
        doc = inspect.getdoc(member)  # a slot's: the value in its class's __slots__ dict
    return None if doc is None else inspect.cleandoc(SIGNATURE.sub("", doc))


def _documented(module: ModuleType) -> dict[str, str | None]:
    """Docstrings by name: each class of *module*, and every method, property and
    attribute of it (inherited ones too) but special methods and the private
    ones only one twin has (its helpers, fields and slots)."""
    found: dict[str, str | None] = {}
    for name, cls in vars(module).items():
        if not inspect.isclass(cls) or cls.__module__ != module.__name__:
            continue
        found[name] = _doc(cls)
        for attr in dir(cls):
            member = inspect.getattr_static(cls, attr)
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if attr.startswith("__") or not (
                inspect.isroutine(member) or inspect.isdatadescriptor(member)
            ):
                continue
            found[f"{name}.{attr}"] = _doc(member)
    return found


@pytest.fixture(scope="module")
def twins() -> tuple[dict[str, str | None], dict[str, str | None]]:
    c = pytest.importorskip("nanobucket._core._bucket_c")
    return _documented(c), {**_documented(_bucket_py), **_documented(_decision_py)}


def _public(names: set[str]) -> set[str]:
    return {n for n in names if not any(part.startswith("_") for part in n.split("."))}


def _shared(names: set[str]) -> set[str]:
    return {n for n in names if n not in C_ONLY and n.split(".")[0] not in C_ONLY}


@pytest.mark.c_extension
def test_the_twins_have_the_same_public_members(
    twins: tuple[dict[str, str | None], dict[str, str | None]],
) -> None:
    c, py = twins
    assert _shared(_public(set(c))) == _public(set(py))
    assert "Decision.allowed" in c  # the walk sees the extension's attributes


@pytest.mark.c_extension
def test_the_private_names_the_cython_core_shows_are_the_twins(
    twins: tuple[dict[str, str | None], dict[str, str | None]],
) -> None:
    """``_Limits`` (the common base), by the same name."""
    c, py = twins
    private = _shared(set(c)) - _public(set(c))
    assert "_Limits" in private
    assert private <= set(py)
    assert {"TokenBucket.reserve", "KeyedTokenBucket.clock_ns"} <= _public(set(c))


@pytest.mark.c_extension
def test_the_twins_have_the_same_docstrings(
    twins: tuple[dict[str, str | None], dict[str, str | None]],
) -> None:
    c, py = twins
    shared = sorted(set(c) & set(py))
    assert len(shared) > 40
    assert all(py[name] for name in _public(set(shared)))  # nothing undocumented matches
    assert [name for name in shared if c[name] != py[name]] == []


# -- the inlined `step` ----------------------------------------------------------
#
# `TokenBucket.allow` and `KeyedTokenBucket._allow` (under `allow`,
# `allow_at`, `allow_many`, `acquire`) write `step` out instead of calling it.
# From any state they must decide and store exactly what `step` does.

RATES: list[RateLike] = [1, 3, 7, 100, 10**9, 0.3]  # whole and rounded token intervals


@st.composite
def states(draw: st.DrawFn) -> tuple[RateLike, int, int, int, int]:
    """``(rate, capacity, cost, tat, now)``, tat often near the admission edge."""
    rate = draw(st.sampled_from(RATES))
    capacity = draw(st.integers(1, 50))
    cost = draw(st.integers(0, capacity))
    interval = _bucket_py.TokenBucket(rate=rate, capacity=capacity).interval_ns
    now = draw(st.integers(0, 2**62 - 1))
    edge = capacity * interval - cost * interval  # the slack: tat - now at the edge
    offset = draw(
        st.one_of(
            st.integers(-2, 2).map(lambda d: edge + d),
            st.integers(-2 * capacity * interval, 2 * capacity * interval),
        )
    )
    return rate, capacity, cost, max(0, now + offset), now


def _expected(rate: RateLike, capacity: int, cost: int, tat: int, now: int) -> int:
    b = _bucket_py.TokenBucket(rate=rate, capacity=capacity)
    cost_t = cost * b.interval_ns
    return step(tat, now, cost_t, capacity * b.interval_ns - cost_t)


@settings(max_examples=300, deadline=None)
@given(states())
def test_token_bucket_allow_is_step(state: tuple[RateLike, int, int, int, int]) -> None:
    rate, capacity, cost, tat, now = state
    b = _bucket_py.TokenBucket(rate=rate, capacity=capacity, clock=lambda: now)
    b._tat = tat
    after = _expected(rate, capacity, cost, tat, now)
    assert (b.allow(cost), b._tat) == (after >= 0, after if after >= 0 else tat)


@settings(max_examples=300, deadline=None)
@given(states(), st.booleans())
def test_keyed_allow_is_step(state: tuple[RateLike, int, int, int, int], missing: bool) -> None:
    rate, capacity, cost, tat, now = state
    t = _bucket_py.KeyedTokenBucket(rate=rate, capacity=capacity, clock=lambda: now)
    if missing:
        t._floor = tat  # a missing key starts from the floor
    else:
        t._tats["alice"] = tat
    after = _expected(rate, capacity, cost, tat, now)
    stored = after if after >= 0 and cost else None if missing else tat
    assert (t.allow("alice", cost), t._tats.get("alice")) == (after >= 0, stored)


def test_step_is_the_only_rule_in_the_twin() -> None:
    """The admission test is written in `step` and the two verbs above, nowhere else."""
    written = set()
    for owner in (_bucket_py, _bucket_py.TokenBucket, _bucket_py.KeyedTokenBucket):
        for member in vars(owner).values():
            if inspect.isfunction(member) and "base - now >" in inspect.getsource(member):
                written.add(member.__qualname__)
    assert written == {"step", "TokenBucket.allow", "KeyedTokenBucket._allow"}

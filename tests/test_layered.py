"""all_of: all or nothing (also under threads), the binding layer, the seed's two limits."""

from __future__ import annotations

import functools
import threading
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import nanobucket as nb
from nanobucket.layered import LayeredDecision, all_of
from nanobucket.reference import ExactBucket

from conftest import ManualClock

S = 1_000_000_000


def test_a_rejected_request_charges_no_layer(impl: ModuleType) -> None:
    big = impl.TokenBucket(rate=1, capacity=10)
    small = impl.TokenBucket(rate=1, capacity=3)
    both = all_of(big, small)
    assert both.allow_at(None, 0, cost=2)
    assert not both.allow_at(None, 0, cost=2)  # big admits, small refuses: big is refunded
    assert (big.tokens_at(0), small.tokens_at(0)) == (8.0, 1.0)
    assert not all_of(small, big).allow_at(None, 0, cost=2)
    assert (big.tokens_at(0), small.tokens_at(0)) == (8.0, 1.0)
    assert both.allow_at(None, 0)
    assert (big.tokens_at(0), small.tokens_at(0)) == (7.0, 0.0)


def test_allow_with_the_clock_and_keyed_layers(impl: ModuleType, clock: ManualClock) -> None:
    per_key = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    instance = impl.TokenBucket(rate=1, capacity=3, clock=clock)
    limit = all_of(per_key, instance)
    assert [limit.allow("a"), limit.allow("a"), limit.allow("a")] == [True, True, False]
    assert [limit.allow("b"), limit.allow("b")] == [True, False]
    assert (per_key.tokens("a"), per_key.tokens("b"), instance.tokens()) == (0.0, 1.0, 0.0)
    with pytest.raises(TypeError, match="pass a key"):
        limit.allow()
    clock.advance(S)
    assert limit.allow("b") and not limit.allow("c")


def test_a_layered_decision_is_a_decision_equal_on_its_five_fields(impl: ModuleType) -> None:
    limit = all_of(impl.TokenBucket(rate=1, capacity=5), impl.TokenBucket(rate=2, capacity=2))
    d = limit.check_at(None, 0)
    plain = nb.Decision(True, 1, 0, S // 2, 2)
    assert d == plain and plain == d and d != nb.Decision(True, 0, 0, S // 2, 2)
    assert hash(d) == hash(plain) == hash((True, 1, 0, S // 2, 2))
    assert "__eq__" not in vars(LayeredDecision) and "__hash__" not in vars(LayeredDecision)
    assert isinstance(d, nb.Decision) and (d.layer, len(d.decisions)) == (1, 2)
    assert repr(d) == (
        "LayeredDecision(allowed=True, remaining=1, retry_after_ns=0, "
        f"reset_after_ns={S // 2}, limit=2, layer=1)"
    )


def test_unkeyed_layers_need_no_key(impl: ModuleType, clock: ManualClock) -> None:
    limit = all_of(
        impl.TokenBucket(rate=1, capacity=1, clock=clock),
        impl.TokenBucket(rate=2, capacity=5, clock=clock),
    )
    assert limit.allow() and not limit.allow()
    assert limit.check().retry_after_ns == S


def test_the_decision_names_the_binding_layer(impl: ModuleType) -> None:
    a = impl.TokenBucket(rate=10, capacity=10)
    b = impl.TokenBucket(rate=1, capacity=8)
    limit = all_of(a, b)
    d = limit.check_at(None, 0, cost=5)
    assert isinstance(d, LayeredDecision)
    assert (d.allowed, d.layer, d.remaining, d.limit, d.retry_after_ns) == (True, 1, 3, 8, 0)
    assert d.reset_after_ns == 5 * S  # b's own: full again in 5 s (a in 0.5 s)
    # a would admit (and is refunded), b refuses: b binds
    d = limit.check_at(None, 0, cost=4)
    assert (d.allowed, d.layer, d.limit, d.retry_after_ns) == (False, 1, 8, S)
    assert d.retry_after == 1.0 and not d
    assert [x.allowed for x in d.decisions] == [True, False]
    assert [x.remaining for x in d.decisions] == [1, 3]
    assert (d.remaining, d.reset_after_ns) == (3, 5 * S)  # b's own, not a's
    # a refuses first (0.1 s) but b's wait (3 s) is the binding one
    d = limit.check_at(None, 0, cost=6)
    assert (d.allowed, d.layer, d.retry_after_ns) == (False, 1, 3 * S)
    assert [x.retry_after_ns for x in d.decisions] == [S // 10, 3 * S]
    assert (a.tokens_at(0), b.tokens_at(0)) == (5.0, 3.0)
    assert limit.peek_at(None, 0, cost=0).allowed
    assert limit.tokens_at(None, 0) == 3.0


def test_several_bandwidths_on_one_object_match_the_exact_model(impl: ModuleType) -> None:
    # 100/s with bursts of 200 AND 3000 per minute (50/s, a minute's worth of burst)
    limit = all_of(
        impl.TokenBucket(rate=100, capacity=200), impl.TokenBucket(rate=50, capacity=3000)
    )
    exact = (ExactBucket(rate=100, capacity=200), ExactBucket(rate=50, capacity=3000))
    times = [k * S // 1000 for k in range(90_000)]  # 1000 req/s for 90 s
    ours = [limit.allow_at(None, t) for t in times]

    def model(t: int) -> bool:
        if all(e.tokens_at(t) >= 1 for e in exact):
            return all(e.allow_at(t) for e in exact)
        return False

    assert ours == [model(t) for t in times]
    # The minute layer binds in the end: its 3000 plus 50/s over 89.999 s.
    assert sum(ours) == 3000 + 4499
    assert sum(ours[:10_000]) == 200 + 999  # the first 10 s: 100/s after the 200 burst


def test_the_seed_case_one_greedy_client_cannot_starve_the_others(impl: ModuleType) -> None:
    def run(limit: object, keyed: bool) -> dict[str, int]:
        admitted = {"greedy": 0, "c1": 0, "c2": 0}
        for ms in range(10_000):  # 10 s
            t = ms * S // 1000
            traffic = ["greedy"] + (["c1", "c2"] if ms % 20 == 0 else [])  # 1000/s and 50/s each
            for who in traffic:
                if keyed:
                    admitted[who] += limit.allow_at(who, t)  # type: ignore[attr-defined]
                else:
                    admitted[who] += limit.allow_at(t)  # type: ignore[attr-defined]
        return admitted

    layered = run(
        all_of(
            impl.KeyedTokenBucket(rate=100, capacity=200), impl.TokenBucket(rate=300, capacity=300)
        ),
        keyed=True,
    )
    greedy_alone = ExactBucket(rate=100, capacity=200)
    assert layered == {
        "greedy": sum(greedy_alone.allow_at(ms * S // 1000) for ms in range(10_000)),
        "c1": 500,
        "c2": 500,
    }
    only_global = run(impl.TokenBucket(rate=300, capacity=300), keyed=False)
    assert only_global["greedy"] > 2000 and only_global["c1"] + only_global["c2"] < 500


@pytest.mark.gil_atomic
def test_all_or_nothing_under_threads(impl: ModuleType, clock: ManualClock) -> None:
    # Time stands still: exactly the small layer's capacity gets in, and the
    # big layer is charged for those only (every rejection is refunded).
    big = impl.TokenBucket(rate=1, capacity=1000, clock=clock)
    small = impl.KeyedTokenBucket(rate=1, capacity=100, clock=clock)
    limit = all_of(big, small)
    counts = [0] * 4

    def hammer(i: int) -> None:
        for _ in range(300):
            counts[i] += limit.allow("k")

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 100
    assert (big.tokens(), small.tokens("k")) == (900.0, 0.0)


def test_an_error_in_a_later_layer_refunds_the_earlier_ones(impl: ModuleType) -> None:
    big = impl.TokenBucket(rate=1, capacity=10)
    limit = all_of(big, impl.TokenBucket(rate=1, capacity=3))
    with pytest.raises(ValueError, match="exceeds capacity"):
        limit.allow_at(None, 0, cost=5)
    with pytest.raises(ValueError, match="exceeds capacity"):
        limit.check_at(None, 0, cost=5)
    assert big.tokens_at(0) == 10.0


def test_refund_reaches_every_layer(impl: ModuleType) -> None:
    a = impl.KeyedTokenBucket(rate=1, capacity=4)
    b = impl.TokenBucket(rate=1, capacity=4)
    limit = all_of(a, b)
    assert limit.allow_at("k", 0, cost=3)
    limit.refund_at("k", 0, cost=2)
    assert (a.tokens_at("k", 0), b.tokens_at(0)) == (3.0, 3.0)


class _NoRefund:
    """A keyed limiter without refund(): the kind all_of charges last."""

    keyed = True

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.capacity, self.rate = inner.capacity, inner.rate

    def allow(self, key: str, cost: int = 1) -> bool:
        return bool(self._inner.allow(key, cost))

    def allow_at(self, key: str, now: int, cost: int = 1) -> bool:
        return bool(self._inner.allow_at(key, now, cost))

    def check(self, key: str, cost: int = 1) -> Any:
        return self._inner.check(key, cost)

    def check_at(self, key: str, now: int, cost: int = 1) -> Any:
        return self._inner.check_at(key, now, cost)

    def peek(self, key: str, cost: int = 1) -> Any:
        return self._inner.peek(key, cost)

    def peek_at(self, key: str, now: int, cost: int = 1) -> Any:
        return self._inner.peek_at(key, now, cost)


def test_a_layer_without_refund_is_charged_last(impl: ModuleType) -> None:
    stubborn = _NoRefund(impl.KeyedTokenBucket(rate=1, capacity=2))
    local = impl.TokenBucket(rate=1, capacity=10)
    limit = all_of(stubborn, local)  # given first, but charged last
    assert [limit.allow_at("k", 0) for _ in range(3)] == [True, True, False]
    assert local.tokens_at(0) == 8.0  # the third was refunded
    d = limit.check_at("k", 0)
    assert (d.allowed, d.layer, d.retry_after_ns) == (False, 0, S)
    with pytest.raises(TypeError, match="at most one layer without refund"):
        all_of(stubborn, stubborn)
    with pytest.raises(TypeError, match="no refund"):
        limit.refund("k")
    # What the layers can do was learnt when the all_of was built; the errors name the layer.
    with pytest.raises(
        TypeError, match=r"^_NoRefund has no refund_at\(\): this all_of cannot refund$"
    ):
        limit.refund_at("k", 0)
    with pytest.raises(TypeError, match=r"^_NoRefund has no reserve\(\): this all_of cannot wait"):
        limit.reserve("k")
    assert local.tokens_at(0) == 8.0  # and charged nothing


@pytest.mark.c_extension
def test_shared_layers_refund(tmp_path: Path) -> None:
    pytest.importorskip("nanobucket._core._shared_c")
    from nanobucket.shared import SharedKeyedTokenBucket

    a = SharedKeyedTokenBucket.create(path=tmp_path / f"a-{uuid.uuid4().hex}", rate=1, capacity=2)
    b = SharedKeyedTokenBucket.create(path=tmp_path / f"b-{uuid.uuid4().hex}", rate=1, capacity=3)
    try:
        limit = all_of(a, b)  # two shared tables: both refund, all or nothing
        assert [limit.allow_at("k", 0) for _ in range(3)] == [True, True, False]
        assert (a.tokens_at("k", 0), b.tokens_at("k", 0)) == (0.0, 1.0)  # b got its 1 back
        limit.refund_at("k", 0, cost=2)
        assert (a.tokens_at("k", 0), b.tokens_at("k", 0)) == (2.0, 3.0)
    finally:
        a.unlink()
        b.unlink()


def test_bad_layers(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="at least one"):
        all_of()
    with pytest.raises(TypeError, match="not a limiter"):
        all_of(impl.TokenBucket(rate=1, capacity=1), object())  # type: ignore[arg-type]


def test_nested_all_of(impl: ModuleType) -> None:
    inner = all_of(impl.TokenBucket(rate=1, capacity=2))
    outer = all_of(inner, impl.KeyedTokenBucket(rate=1, capacity=5))
    assert [outer.allow_at("k", 0) for _ in range(3)] == [True, True, False]
    assert outer.tokens_at("k", 0) == 0.0


def _three_c_layers(c: Any, clock: ManualClock, same_clock: bool) -> tuple[Any, list[Any]]:
    """all_of over three Cython tables on *clock* (one clock: its compiled path;
    equal clocks that are not the same object: its Python path), with its layers."""
    other = clock if same_clock else functools.partial(clock)  # equal, not the same object
    layers = [
        c.KeyedTokenBucket(rate=3, capacity=4, max_keys=8, clock=clock),
        c.TokenBucket(rate=5, capacity=6, clock=other),
        c.KeyedTokenBucket(rate=1, capacity=3, max_keys=8, clock=other),
    ]
    return all_of(*layers), layers


@pytest.mark.c_extension
def test_the_cython_fast_path_decides_as_the_general_path() -> None:
    # all_of over Cython buckets on one clock decides in one Cython call
    # (AllowAll); on different clocks it runs the general Python path. Both
    # must give the same answers, errors and layer states, step by step.
    import random

    c = pytest.importorskip("nanobucket._core._bucket_c")

    clock = ManualClock(10 * S)
    fast, fast_layers = _three_c_layers(c, clock, True)
    slow, slow_layers = _three_c_layers(c, clock, False)
    assert type(fast.allow).__name__ == "builtin_function_or_method"
    assert type(slow.allow).__name__ == "function"
    rng = random.Random(7)
    keys: list[object] = [f"k{i}" for i in range(12)] + [None, ["unhashable"]]
    costs: list[object] = [0, 1, 1, 1, 2, 3, 4, 5, 7, -1, 1.0, True]

    def outcome(limit: Any, key: object, cost: object) -> object:
        try:
            return limit.allow(key, cost)
        except (TypeError, ValueError) as exc:
            return type(exc)

    for _ in range(5_000):
        clock.advance(rng.choice([0, 0, 0, 1, 50_000_000, 400_000_000]))
        key, cost = rng.choice(keys), rng.choice(costs)
        assert outcome(fast, key, cost) == outcome(slow, key, cost), (key, cost)
        probe = f"k{rng.randrange(12)}"
        assert [
            fast_layers[0].tokens(probe),
            fast_layers[1].tokens(),
            fast_layers[2].tokens(probe),
        ] == [
            slow_layers[0].tokens(probe),
            slow_layers[1].tokens(),
            slow_layers[2].tokens(probe),
        ]


@pytest.mark.c_extension
def test_the_cython_check_decides_as_the_general_path() -> None:
    # check too: one Cython call (AllowAll.check) on one clock, the Python
    # path on two. The same decisions (every field, the binding layer, every
    # layer's own), the same errors and the same layer states, step by step.
    import random

    c = pytest.importorskip("nanobucket._core._bucket_c")

    clock = ManualClock(10 * S)
    fast, fast_layers = _three_c_layers(c, clock, True)
    slow, slow_layers = _three_c_layers(c, clock, False)
    assert type(fast.check).__name__ == "builtin_function_or_method"
    assert type(slow.check).__name__ == "method"
    rng = random.Random(11)
    keys: list[object] = [f"k{i}" for i in range(12)] + [None, ["unhashable"]]
    costs: list[object] = [0, 1, 1, 1, 2, 3, 4, 5, 7, -1, 1.0, True]

    def outcome(limit: Any, key: object, cost: object) -> object:
        try:
            d = limit.check(key, cost)
        except (TypeError, ValueError) as exc:
            return type(exc)
        assert type(d) is LayeredDecision
        return (d, d.allowed, d.layer, d.limit, d.decisions, repr(d))

    for _ in range(5_000):
        clock.advance(rng.choice([0, 0, 0, 1, 50_000_000, 400_000_000]))
        key, cost = rng.choice(keys), rng.choice(costs)
        assert outcome(fast, key, cost) == outcome(slow, key, cost), (key, cost)
        probe = f"k{rng.randrange(12)}"
        assert [
            fast_layers[0].tokens(probe),
            fast_layers[1].tokens(),
            fast_layers[2].tokens(probe),
        ] == [
            slow_layers[0].tokens(probe),
            slow_layers[1].tokens(),
            slow_layers[2].tokens(probe),
        ]

"""refund and reconfigure on both implementations: exact tokens, caps, carried-over state.

What every limiter with refund / reconfigure does alike is tests/contract's
(test_give_back); here, what only the in-process buckets do.
"""

from __future__ import annotations

import threading
from types import ModuleType

import pytest

from conftest import ManualClock

S = 1_000_000_000


def test_refund_uses_the_injected_clock(impl: ModuleType, clock: ManualClock) -> None:
    b = impl.TokenBucket(rate=10, capacity=10, clock=clock)
    assert b.allow(cost=10)
    clock.advance(S // 10)  # one token back by refill
    b.refund(cost=4)
    assert b.tokens() == 5.0


def test_keyed_refund_and_a_missing_key_refunds_nothing(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=5)
    t.refund_at("ghost", 0, cost=5)
    assert len(t) == 0
    assert t.allow_at("a", 0, cost=5)
    assert not t.allow_at("a", 0)
    t.refund_at("a", 0, cost=2)
    assert t.tokens_at("a", 0) == 2.0
    assert [t.allow_at("a", 0) for _ in range(3)] == [True, True, False]
    t.refund_at("a", 0, cost=5)
    assert t.tokens_at("a", 0) == 5.0
    assert t.tokens_at("ghost", 0) == 5.0


def test_refund_rejects_bad_cost(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=1, capacity=5)
    with pytest.raises(ValueError, match="exceeds capacity"):
        b.refund(cost=6)
    with pytest.raises(TypeError, match="cost must be an int"):
        b.refund(cost=True)
    with pytest.raises(ValueError, match="cost must be >= 0"):
        impl.KeyedTokenBucket(rate=1, capacity=5).refund("k", cost=-1)


def test_reconfigure_never_hands_out_a_fresh_full_bucket(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=100, capacity=200)
    b.reconfigure(capacity=1000, now=0)
    assert b.tokens_at(0) == 200.0
    assert b.tokens_at(8 * S) == 1000.0
    empty = impl.TokenBucket(rate=1, capacity=5)
    assert empty.allow_at(0, cost=5)
    empty.reconfigure(rate=1000, capacity=5, now=0)
    assert empty.tokens_at(0) == 0.0
    assert empty.tokens_at(S // 1000) == 1.0


def test_keyed_reconfigure_keeps_every_key_including_missing_ones(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=100, capacity=200)
    assert t.allow_at("a", 0, cost=150)
    t.reconfigure(capacity=400, now=0)
    assert t.tokens_at("a", 0) == 50.0
    assert t.tokens_at("b", 0) == 200.0  # never seen: it was full, it keeps 200
    assert t.tokens_at("b", 2 * S) == 400.0
    assert t.allow_at("b", 0, cost=200) and not t.allow_at("b", 0)
    t.reconfigure(rate=50, capacity=20, now=0)
    assert (t.tokens_at("a", 0), t.tokens_at("c", 0)) == (20.0, 20.0)
    assert t.tokens_at("b", 0) == 0.0
    assert t.tokens_at("b", S) == 20.0


def test_reconfigure_rounds_against_the_caller(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=3, capacity=3)  # interval 333_333_334 ns
    assert b.allow_at(0, cost=2)
    b.reconfigure(rate=7, now=0)
    assert b.tokens_at(0) <= 1.0
    assert b.peek_at(0).allowed and not b.peek_at(0, cost=2).allowed


def test_rate_and_capacity_stay_read_only(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=1, capacity=5)
    for name in ("rate", "capacity"):
        with pytest.raises(AttributeError):
            setattr(b, name, 10)


def test_bad_reconfigure_changes_nothing(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=10, capacity=10)
    assert b.allow_at(0, cost=4)
    with pytest.raises(ValueError, match="rate must be > 0"):
        b.reconfigure(rate=0)
    with pytest.raises(TypeError, match="capacity must be an int"):
        b.reconfigure(capacity=True)
    with pytest.raises(TypeError, match="now must be an int"):
        b.reconfigure(capacity=5, now=1.5)
    assert (b.rate, b.capacity, b.tokens_at(0)) == (10, 10, 6.0)


@pytest.mark.gil_atomic
def test_reconfigure_under_threads_never_creates_tokens(
    impl: ModuleType, clock: ManualClock
) -> None:
    # Time stands still: no refill, so whatever the interleaving, the tokens
    # admitted plus the tokens left can only be <= the first capacity.
    b = impl.TokenBucket(rate=1000, capacity=300, clock=clock)
    admitted = [0] * 4
    stop = threading.Event()

    def spend(i: int) -> None:
        for _ in range(2000):
            admitted[i] += b.allow()

    def flip() -> None:
        caps = (300, 150, 400, 250)
        k = 0
        while not stop.is_set():
            b.reconfigure(capacity=caps[k % 4], rate=(1000, 500)[k % 2])
            k += 1

    threads = [threading.Thread(target=spend, args=(i,)) for i in range(4)]
    flipper = threading.Thread(target=flip)
    flipper.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    flipper.join()
    assert 0 < sum(admitted) <= 300
    assert sum(admitted) + b.tokens() <= 300

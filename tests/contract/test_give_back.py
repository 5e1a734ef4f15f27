"""The verbs that write past a decision: reserve, refund, reset, reconfigure."""

from __future__ import annotations

import pytest

from .backends import (
    CAPACITY,
    INFLIGHT,
    LEASED,
    MEMORY,
    MS,
    RECONFIGURE,
    REDIS,
    REFUND,
    RESERVATION,
    RESERVE,
    RESET,
    T0,
    TOKENS,
    US,
    Case,
    K,
    S,
    Subject,
    T,
)

#: What refund and reset return: True where Redis took it, None in process.
DELIVERED = {REDIS: True, LEASED: True}


@pytest.mark.applies(RESERVE)
def test_reserve_waits_exactly_and_writes_nothing_past_max_wait(backend: Case) -> None:
    async def body(s: Subject) -> None:
        assert await s.reserve(K, cost=CAPACITY, now=T0) == 0  # full: no wait, now empty
        # Two more tokens are 200 ms away: a shorter bound reserves nothing.
        assert await s.reserve(K, cost=2, max_wait_ns=200 * MS - US, now=T0) == -1
        assert await s.state(K, T0) == (True, 0, 0, 500 * MS, 5)
        assert await s.reserve(K, cost=2, max_wait_ns=200 * MS, now=T0) == 200 * MS
        # Two tokens of debt past empty: even a probe waits for them.
        assert await s.state(K, T0) == (False, 0, 200 * MS, 700 * MS, 5)
        # The reserved tokens are the reserver's at T0 + 200 ms; the next, 100 ms later.
        assert await s.allow(K, T0 + 200 * MS) is False
        assert await s.state(K, T0 + 200 * MS) == (True, 0, 0, 500 * MS, 5)
        assert await s.allow(K, T0 + 300 * MS)
        assert await s.reserve(K, cost=1, max_wait_ns=S, now=T0 + 300 * MS) == 100 * MS

    backend.run(body)


@pytest.mark.applies(RESERVE)
def test_reserve_with_shape_spaces_callers_one_slot_apart(backend: Case) -> None:
    async def body(s: Subject) -> None:
        waits = [await s.reserve(K, max_wait_ns=S, shape=True, now=T0) for _ in range(3)]
        assert waits == [0, T, 2 * T]  # no burst: each waits for its slot
        assert await s.reserve(K, max_wait_ns=3 * T - US, shape=True, now=T0) == -1
        assert await s.state(K, T0) == (True, 2, 0, 300 * MS, 5)

    backend.run(body)


@pytest.mark.applies(RESERVATION, TOKENS)
def test_a_reservation_cancels_itself_exactly_once(backend: Case) -> None:
    async def body(s: Subject) -> None:
        r = s.reservation(K, cost=4, now=T0)
        assert (r.ok, r.delay_ns) == (True, 0)
        assert await s.state(K, T0) == (True, 1, 0, 400 * MS, 5)
        late = s.reservation(K, cost=3, max_wait_ns=S, now=T0)  # 2 tokens short: 200 ms
        assert (late.ok, late.delay_ns) == (True, 200 * MS)
        assert late.cancel_at(T0) is True  # its 3 tokens back, and no more
        assert await s.state(K, T0) == (True, 1, 0, 400 * MS, 5)
        assert late.cancel_at(T0) is False  # once: a second cancel gives nothing
        assert await s.state(K, T0) == (True, 1, 0, 400 * MS, 5)
        # Cancelled after its time, the whole cost goes back, never past full.
        assert r.cancel_at(T0 + 200 * MS) is True
        assert await s.state(K, T0 + 200 * MS) == (True, 5, 0, 0, 5)
        assert r.cancel_at(T0 + 200 * MS) is False
        assert await s.drain(K, T0 + 200 * MS) == CAPACITY

    backend.run(body)


@pytest.mark.applies(RESERVATION, TOKENS)
def test_a_refused_reservation_holds_nothing_to_cancel(backend: Case) -> None:
    async def body(s: Subject) -> None:
        assert await s.allow(K, T0, CAPACITY)
        r = s.reservation(K, cost=2, max_wait_ns=200 * MS - US, now=T0)
        assert (r.ok, r.delay_ns) == (False, -1)
        assert r.cancel_at(T0) is False  # nothing was written: nothing goes back
        assert await s.state(K, T0) == (True, 0, 0, 500 * MS, 5)

    backend.run(body)


@pytest.mark.applies(TOKENS, REFUND)
def test_refund_gives_back_exactly_and_never_past_full(backend: Case) -> None:
    async def body(s: Subject) -> None:
        delivered = DELIVERED.get(s.backend.family)
        assert await s.refund(K, T0, 3) is delivered  # a full bucket gets nothing
        assert await s.state(K, T0) == (True, 5, 0, 0, 5)
        assert await s.allow(K, T0, 4)
        assert await s.refund(K, T0, 2) is delivered
        assert await s.state(K, T0) == (True, 3, 0, 200 * MS, 5)
        assert await s.refund(K, T0 + 50 * MS, 3) is delivered  # 3.5 + 3: capped at 5
        assert await s.state(K, T0 + 50 * MS) == (True, 5, 0, 0, 5)
        assert await s.drain(K, T0 + 50 * MS) == CAPACITY  # a refund is not a credit

    backend.run(body)


@pytest.mark.applies(REFUND)
def test_refund_of_slots_gives_back_exactly(backend: Case) -> None:
    # An in-flight limit's refund is its release: the slots come back exactly,
    # and more than are held is an error, not a cap (`Concurrency.release`).
    async def body(s: Subject) -> None:
        assert await s.allow(K, T0, 4)
        assert await s.refund(K, T0, 2) is DELIVERED.get(s.backend.family)
        want = (True, 3, 0, 200 * MS if s.backend.has(TOKENS) else 0, 5)
        assert await s.state(K, T0) == want
        if s.backend.family == INFLIGHT:
            key = f" for key {K!r}" if s.backend.keyed else ""
            with pytest.raises(ValueError, match=f"^release of 3 slot\\(s\\), but 2 held{key}$"):
                await s.refund(K, T0, 3)
            assert await s.state(K, T0) == want
        assert await s.drain(K, T0) == 3

    backend.run(body)


@pytest.mark.applies(TOKENS, REFUND)
def test_a_refund_after_a_refusal_counts_at_once(backend: Case) -> None:
    async def body(s: Subject) -> None:
        assert await s.allow(K, T0, CAPACITY)
        assert await s.allow(K, T0) is False
        await s.refund(K, T0, CAPACITY)
        assert await s.state(K, T0) == (True, 5, 0, 0, 5)
        assert await s.drain(K, T0) == CAPACITY

    backend.run(body)


@pytest.mark.applies(RESET)
def test_reset_makes_the_bucket_full(backend: Case) -> None:
    async def body(s: Subject) -> None:
        assert await s.allow(K, T0, CAPACITY)
        assert await s.allow(K, T0) is False
        assert await s.reset(K) is DELIVERED.get(s.backend.family)
        assert await s.state(K, T0) == (True, 5, 0, 0, 5)
        assert await s.drain(K, T0) == CAPACITY

    backend.run(body)


@pytest.mark.applies(RECONFIGURE)
def test_reconfigure_carries_the_tokens_over(backend: Case) -> None:
    async def body(s: Subject) -> None:
        lim = s.limiter
        assert await s.allow(K, T0, 1)
        await s.reconfigure(rate=20, capacity=3, now=T0)
        assert (lim.rate, lim.capacity, lim.interval_ns) == (20, 3, 50 * MS)
        assert await s.state(K, T0) == (True, 3, 0, 0, 3)  # 4 held: capped at 3
        assert await s.allow(K, T0, 2)
        await s.reconfigure(capacity=8, now=T0)
        assert await s.state(K, T0) == (True, 1, 0, 350 * MS, 8)  # more room, not more tokens
        d = await s.check(K, T0, 3)
        assert (d.allowed, d.retry_after_ns, d.reset_after_ns, d.limit) == (
            False,
            100 * MS,
            350 * MS,
            8,
        )
        assert await s.drain(K, T0 + 350 * MS) == 8  # at the new rate, to the new capacity

    backend.run(body)


@pytest.mark.applies(RECONFIGURE)
def test_reconfigure_of_a_full_bucket_to_a_larger_capacity(backend: Case) -> None:
    # Documented apart: in process a full bucket keeps its tokens and refills
    # the rest; in Redis a full bucket is no key, so it stays full.
    async def body(s: Subject) -> None:
        await s.reconfigure(capacity=8, now=T0)
        if s.backend.family == MEMORY:
            assert await s.state(K, T0) == (True, 5, 0, 300 * MS, 8)
        else:
            assert await s.state(K, T0) == (True, 8, 0, 0, 8)

    backend.run(body)

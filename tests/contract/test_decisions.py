"""Deciding: the Decision arithmetic, bursts and refill, peek, the cost-0 probe, refusals, time.

Rate 10/s (T = 100 ms a token), capacity 5, every time explicit from T0.
"""

from __future__ import annotations

import pytest

from .backends import (
    CAPACITY,
    EXACT,
    MS,
    PEEK,
    T0,
    TOKENS,
    US,
    Case,
    K,
    S,
    Subject,
    T,
    fields,
)

# (verb, time after T0, cost, the decision's five fields), on one bucket in turn.
SCRIPT = [
    ("check", 0, 2, (True, 3, 0, 200 * MS, 5)),
    ("check", 0, 4, (False, 3, 100 * MS, 200 * MS, 5)),  # 3 held: 1 more in 100 ms
    ("check", 50 * MS, 3, (True, 0, 0, 450 * MS, 5)),  # 3.5 held
    ("peek", 50 * MS, 1, (False, 0, 50 * MS, 450 * MS, 5)),  # 0.5 held
    ("check", 100 * MS, 1, (True, 0, 0, 500 * MS, 5)),
    ("check", 250 * MS, 2, (False, 1, 50 * MS, 350 * MS, 5)),  # 1.5 held
    ("peek", 250 * MS, 1, (True, 0, 0, 450 * MS, 5)),  # as if spent: 0.5 left
    ("check", 1100 * MS, 0, (True, 5, 0, 0, 5)),  # full again
]
# The same for an in-flight limit: remaining is the slots left free, and no
# wait is known (a slot frees when a request ends), so both times are 0.
SLOTS_SCRIPT = [
    ("check", 0, 2, (True, 3, 0, 0, 5)),
    ("check", 0, 4, (False, 3, 0, 0, 5)),
    ("peek", 50 * MS, 3, (True, 0, 0, 0, 5)),  # as if taken
    ("check", 50 * MS, 3, (True, 0, 0, 0, 5)),
    ("check", 1100 * MS, 0, (True, 0, 0, 0, 5)),  # slots come back by release, not by time
    ("peek", 1100 * MS, 1, (False, 0, 0, 0, 5)),
]


def test_decisions_have_the_documented_arithmetic(backend: Case) -> None:
    async def body(s: Subject) -> None:
        for verb, dt, cost, want in SCRIPT if s.backend.has(TOKENS) else SLOTS_SCRIPT:
            if verb == "peek" and not s.backend.has(PEEK):
                continue
            d = await (s.peek if verb == "peek" else s.check)(K, T0 + dt, cost)
            assert isinstance(d, s.backend.decision_type)
            if s.backend.has(EXACT):
                assert fields(d) == want
            else:  # leased: remaining is the lease's balance (documented), the rest exact
                assert fields(d) == (want[0], s.limiter.held(K), *want[2:])
            assert bool(d) is d.allowed
            assert (d.retry_after, d.reset_after) == (want[2] / S, want[3] / S)

    backend.run(body)


def test_a_burst_at_one_instant_admits_exactly_capacity(backend: Case) -> None:
    async def body(s: Subject) -> None:
        burst = [await s.allow(K, T0) for _ in range(CAPACITY + 3)]
        assert burst == [True] * CAPACITY + [False] * 3

    backend.run(body)


@pytest.mark.applies(TOKENS)
def test_k_intervals_later_exactly_k_more_are_admitted(backend: Case) -> None:
    async def body(s: Subject) -> None:
        assert await s.allow(K, T0, CAPACITY)
        assert await s.drain(K, T0) == 0
        assert await s.drain(K, T0 + 3 * T) == 3
        assert await s.drain(K, T0 + 5 * T - US) == 1  # two intervals but a microsecond: one
        assert await s.drain(K, T0 + 5 * T) == 1
        assert await s.drain(K, T0 + 100 * T) == CAPACITY  # never more than full

    backend.run(body)


@pytest.mark.applies(TOKENS)
def test_a_refusal_says_when_the_same_request_is_admitted(backend: Case) -> None:
    async def body(s: Subject) -> None:
        assert await s.allow(K, T0, 3)  # 2 left, the bucket owes 300 ms
        for now, cost, wait in ((T0, 4, 200 * MS), (T0 + 50 * MS, 5, 250 * MS)):
            d = await s.check(K, now, cost)
            assert (d.allowed, d.retry_after_ns) == (False, wait)
        assert await s.allow(K, T0 + 300 * MS - US, 5) is False
        assert await s.allow(K, T0 + 300 * MS, 5)

    backend.run(body)


@pytest.mark.applies(PEEK)
def test_peek_spends_nothing(backend: Case) -> None:
    async def body(s: Subject) -> None:
        want = (True, 3, 0, 200 * MS if s.backend.has(TOKENS) else 0, 5)
        for _ in range(3):
            assert fields(await s.peek(K, T0, 2)) == want
        assert fields(await s.check(K, T0, 2)) == want  # what check then decides
        assert await s.allow(K, T0, 3)
        refused = fields(await s.peek(K, T0, 1))
        assert refused[0] is False
        assert [fields(await s.peek(K, T0, 1)) for _ in range(3)] == [refused] * 3

    backend.run(body)


def test_cost_zero_is_a_probe(backend: Case) -> None:
    async def body(s: Subject) -> None:
        assert await s.allow(K, T0, 0)
        assert (await s.check(K, T0, 0)).allowed
        assert await s.state(K, T0) == (True, 5, 0, 0, 5)
        assert await s.allow(K, T0, CAPACITY)
        empty = await s.state(K, T0)
        # Admitted, even by an empty bucket, and spending nothing.
        assert await s.allow(K, T0, 0)
        d = await s.check(K, T0, 0)
        assert d.allowed
        if s.backend.has(EXACT):
            assert fields(d) == empty
        assert await s.state(K, T0) == empty
        assert await s.allow(K, T0) is False

    backend.run(body)


def test_a_rejected_request_changes_nothing(backend: Case) -> None:
    async def body(s: Subject) -> None:
        assert await s.allow(K, T0, 4)
        now = T0 + 10 * MS
        before = await s.state(K, now)
        for _ in range(3):
            assert await s.allow(K, now, 2) is False
            assert (await s.check(K, now, 2)).allowed is False
            assert await s.state(K, now) == before
        assert await s.allow(K, now, 1)  # the one token left was there all along

    backend.run(body)


def test_time_going_back_creates_no_tokens(backend: Case) -> None:
    async def body(s: Subject) -> None:
        later = T0 + S
        assert await s.allow(K, later, CAPACITY)
        empty = await s.state(K, later)
        tat = later + CAPACITY * T  # when the bucket is full again
        for older in (T0, T0 + 500 * MS, later - US):
            assert await s.allow(K, older) is False
            d = await s.check(K, older)
            assert d.allowed is False
            if s.backend.has(TOKENS, EXACT):  # the wait counts from the older time
                assert fields(d) == (False, 0, tat - older - (CAPACITY - 1) * T, tat - older, 5)
            if s.backend.has(TOKENS):  # owing more than a full bucket: no token, even for a probe
                debt = tat - older
                assert await s.state(K, older) == (False, 0, debt - CAPACITY * T, debt, 5)
        assert await s.state(K, later) == empty
        if s.backend.has(TOKENS):
            assert await s.drain(K, later + T) == 1

    backend.run(body)

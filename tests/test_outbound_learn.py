"""The refill rate learned from ``X-RateLimit-*`` answers, read incrementally, is the
bound the full reading of the last answers gives; and such answers, read on their own
short path (`Pacer._bound`), pace and learn as the general reading does.

`Refill.bound` reads only the remembered answers that no later one dominates
(sent no earlier, with no more to refill); `_Scan` below reads all of the last
`WINDOW`, as the learner did before. Sequences of answers (hypothesis), with
clocks that stand still, go back or jump, forgotten bounds, requests in flight
and 429s, must give the same bound after every answer.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanobucket._core._params import NS_PER_S
from nanobucket._outbound.learn import WINDOW, Refill
from nanobucket._outbound.pacer import Pacer
from nanobucket.httpx import RateLimitedTransport


class _Scan:
    """The bound as the whole window's reading gives it: every remembered answer, each time."""

    def __init__(self) -> None:
        self.answers: deque[tuple[int, int]] = deque(maxlen=WINDOW)
        self.admitted = 0
        self.rate: Fraction | None = None

    def forget(self) -> None:
        self.answers.clear()
        self.rate = None

    def bound(
        self, sent: int, answered: int, seen: int, low: int, high: int | None, inflight: int
    ) -> Fraction | None:
        best: Fraction | None = None
        for first_sent, spent in self.answers:
            num, den = low + seen - spent, answered - first_sent
            if num > 0 and den > 0 and (best is None or Fraction(num, den) > best):
                best = Fraction(num, den)
        if high is not None:
            self.answers.append((sent, high + self.admitted + inflight))
        if best is not None and (self.rate is None or best * NS_PER_S > self.rate):
            self.rate = best * NS_PER_S
        return self.rate


# One answer: how far the clock moved before its request left (maybe back), how long
# it took, its 200s, what the server said it had left, whether it said so of the top
# too (not: a 429 that says nothing more), requests in flight, 200s answered after it
# left; and now and then the bound is forgotten first.
STEP = st.tuples(
    st.sampled_from([0, 0, 1, 3, 1000, -5, 10**9, -(10**6)]),
    st.sampled_from([0, 0, 1, 7, 10**6]),
    st.integers(0, 3),
    st.one_of(st.integers(0, 20), st.integers(0, 1200)),
    st.integers(0, 5).map(bool),
    st.integers(0, 2),
    st.integers(0, 2),
    st.integers(0, 30).map(lambda n: n == 0),
)
# Servers whose remaining falls as it is spent (the usual answers), with refills between.
FALLING = st.lists(
    st.tuples(st.integers(1, 70), st.integers(0, 600), st.sampled_from([1, 10**3, 10**6])),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(STEP, max_size=200))
def test_the_frontier_bounds_as_the_whole_window_reads(
    steps: list[tuple[int, int, int, int, bool, int, int, bool]],
) -> None:
    new, old = Refill(), _Scan()
    clock = 10**12
    for moved, took, oks, left, top, inflight, later, forget in steps:
        if forget:
            new.forget()
            old.forget()
        clock += moved
        sent = clock
        new.admitted += oks
        old.admitted = new.admitted
        seen = max(new.admitted - later, 0)
        high = left + 1 if top else None
        got = new.bound(sent, clock + took, seen, left, high, inflight)
        assert got == old.bound(sent, clock + took, seen, left, high, inflight)
        clock += took


@settings(max_examples=200, deadline=None)
@given(runs=FALLING)
def test_a_remaining_that_falls_as_spent_keeps_the_frontier_short(
    runs: list[tuple[int, int, int]],
) -> None:
    new, old = Refill(), _Scan()
    clock, left = 0, 1000
    for length, refilled, gap in runs:
        left = min(1000, left + refilled)
        for _ in range(length):
            sent, clock = clock, clock + gap
            left = max(left - 1, 0)
            new.admitted += 1
            old.admitted = new.admitted
            seen = new.admitted
            assert new.bound(sent, clock, seen, left, left + 1, 0) == old.bound(
                sent, clock, seen, left, left + 1, 0
            )
            assert len(new._frontier) <= len(runs) + 1


def test_a_refill_seen_after_a_falling_run_is_learned_from_the_run_s_last_answer() -> None:
    r = Refill()
    for i in range(100):  # 100 answers 1 ms apart, the server down 1 each time
        r.admitted += 1
        assert r.bound(i * 10**6, i * 10**6 + 10**5, i + 1, 899 - i, 900 - i, 0) is None
    assert len(r._frontier) == 1 and len(r._answers) == WINDOW
    r.admitted += 1  # 10 ms after the last left, one more and 999 left: 199 refilled
    assert r.bound(109 * 10**6, 109 * 10**6, 101, 999, 1000, 0) == Fraction(199 * NS_PER_S, 10**7)


class _Clock:
    """Moved by the server's answers (a step each) and by the sleeps."""

    def __init__(self) -> None:
        self.now = 10 * NS_PER_S

    def __call__(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += round(seconds * NS_PER_S)


def _the_general_reading(
    self: Pacer, state: Any, sent: int, before: int, announced: Any, now: int
) -> int:
    # Any status but 429 and 503 reads as 200 does there.
    return self._done(state, (state, sent, before), before, 200, announced, None, now)


Answer = tuple[int, "str | None", int, "str | None", int]


def _trace(answers: list[Answer], general: bool) -> list[tuple[int, float, Any, Any]]:
    clock = _Clock()
    replies = iter(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        status, limit, remaining, reset, step = next(replies)
        clock.now += step
        headers = {"X-RateLimit-Remaining": str(remaining)}
        if limit is not None:
            headers["X-RateLimit-Limit"] = limit
        if reset is not None:
            headers["X-RateLimit-Reset"] = reset
        return httpx.Response(status, headers=headers)

    t = RateLimitedTransport(
        httpx.MockTransport(handler), rate=500, capacity=50, clock=clock, sleep=clock.sleep,
        timeout=None,
    )  # fmt: skip
    out = []
    with pytest.MonkeyPatch.context() as mp, httpx.Client(transport=t) as client:
        if general:
            mp.setattr(Pacer, "_bound", _the_general_reading)
        for _ in answers:
            client.get("http://h/")
            state = t.pacer._keys["h"]
            now = clock.now
            out.append((now, state.bucket.tokens_at(now), t.limit("h"), state.refill.rate))
    return out


@settings(max_examples=60, deadline=None)
@given(
    answers=st.lists(
        st.tuples(
            st.sampled_from([200, 200, 200, 429, 500]),
            st.sampled_from(["50", "1000", None]),
            st.one_of(st.sampled_from([0, 1, 49]), st.integers(0, 60)),
            st.sampled_from(["0", "1", "60", None]),
            st.sampled_from([0, 10**6, 10**8, 10**9]),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_x_ratelimit_answers_learn_as_the_general_reading_does(answers: list[Answer]) -> None:
    assert _trace(answers, general=False) == _trace(answers, general=True)

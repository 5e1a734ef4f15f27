"""Learning a server's refill rate from its answers, when it does not announce one.

Two servers leave the rate unsaid: one that sends ``X-RateLimit-Limit`` /
``-Remaining`` / ``-Reset`` (the capacity, the tokens left, the whole
seconds until full: at a refill time under a second the reset only ever
says 0 or 1), and one that sends nothing but ``Retry-After`` on a 429.

`Refill.bound` is a lower bound that cannot be wrong for a token bucket:
the server held fewer than *high* tokens after answer *i* and at least
*low* after a later answer *j*, and admitted at least *n* requests in
between: the 200s answered after *i* and before *j* was sent, less the
requests in flight when *i* was answered (they may have been decided
before it), and *j* itself. It refilled at
least ``low - high + n`` tokens in at most ``answered_j - sent_i``, so its
rate is at least that quotient; a capped bucket or another client only
make the true rate higher. The bound is the largest over the last
`WINDOW` answers. A 200 says its tokens were >= 0 (>= Remaining); a 429
says they were < 1 (< Remaining + 1), so both kinds of server feed it.

Against ``Retry-After`` alone that bound is slow: every 429 pauses the
key for the whole ``Retry-After`` (whole seconds), during which the
server's bucket fills and stops counting. `Refill.episode` bounds the rate
from above instead. The first 429 shows the server's burst: *burst* 200s
in *first* ns from a full bucket, so its capacity is at least ``burst -
rate * first``. Each later span from the end of a pause (the bucket full
again) to the next 429 admitted *n* and then found less than one token, so
``rate * (span - first) < n + 1 - burst``, with the span counted from the
first answer to the 429's sending (the shortest it can have been). The
key then runs at 97% of that upper end: a rate still above the server's
ends in one more 429 after a longer, more exact span; once within 3% it
sends none. From the first 429 on the key sends one request at a time (a
capacity of 1), so that few are in flight to meet the next 429, and a span
too short to bound anything (at most *first*) halves
the rate instead (down to 1/1000 token/s): the decrease of AIMD, and like AIMD's the halved guess
grows again, by a tenth of itself each second without a 429, so that a
guess below the server does not stay there. A bound does not grow: a probe
above the server costs a whole pause, more than it could win.
"""

from __future__ import annotations

import math
from collections import deque
from fractions import Fraction

from .._core._params import NS_PER_S

__all__ = ("GROWTH", "MARGIN", "WINDOW", "Refill")

WINDOW = 64  # answers remembered as a bound's first end
MARGIN = Fraction(97, 100)  # of an episode's upper end: below a server just under it
GROWTH = Fraction(1, 10)  # of a halved guess, per second without a 429


class Refill:
    """What one key's answers prove about its server's refill rate (see the module)."""

    __slots__ = (
        "_answers", "_count", "_episode", "_frontier", "_latest", "admitted", "burst",
        "estimate", "first", "guessed", "quiet", "rate", "unsent",
    )  # fmt: skip

    def __init__(self) -> None:
        # (sent, high + admitted up to it + in flight when answered, its number in
        # `_count`) of the last WINDOW answers remembered
        self._answers: deque[tuple[int, int, int]] = deque(maxlen=WINDOW)
        # The same less those a later one dominates (see `bound`): few where
        # `_answers` holds WINDOW when the server's remaining falls as it is spent.
        self._frontier: deque[tuple[int, int, int]] = deque()
        self._count = 0
        self._latest = -1  # the latest send remembered (ns)
        self.admitted = 0  # 200s answered so far
        self.rate: Fraction | None = None  # the best lower bound, tokens/s
        self.burst: int | None = None  # the 200s before the first 429
        self.first = 0  # ns from the first request to the first 429's answer
        self.estimate: Fraction | None = None  # the rate to run at, tokens/s
        self.guessed = -1  # ns when the estimate was halved, not bounded (-1: it was bounded)
        # (first sent, 200s before it, its answer or -1); -1 first: none sent since a pause
        self._episode = (-1, 0, -1)
        self.unsent = True  # none sent since a pause: the next `sent` starts an episode
        # True while an answer with no limit field teaches nothing but that it was
        # admitted, and a request sent starts nothing: no rate is being run at and
        # the episode's first request was answered. The adapters' fast path reads it.
        self.quiet = False

    def forget(self) -> None:
        """Relearn the bound from here on (the server's limit changed, or a 429 came)."""
        self._answers.clear()
        self._frontier.clear()
        self._latest = -1
        self.rate = None

    def sent(self, now: int) -> None:
        """A request left at *now* (ns): the first after a pause starts an episode."""
        if self._episode[0] < 0:
            self._episode = (now, self.admitted, -1)
            self.unsent = False

    def answered(self, sent: int, now: int) -> None:
        """The request sent at *sent* was answered at *now* (ns), and counted.

        >>> r = Refill()
        >>> r.sent(5); r.quiet, r.answered(5, 7), r.quiet
        (False, None, True)
        """
        start, before, first = self._episode
        if sent == start and first < 0:
            self._episode = (start, before, now)
            self.quiet = self.estimate is None

    def bound(
        self, sent: int, answered: int, seen: int, low: int, high: int | None, inflight: int
    ) -> Fraction | None:
        """Add an answer, already counted in `admitted`: the server held >= *low* and
        < *high* tokens after it.

        *sent* and *answered* are ns of one clock; *seen*: the 200s answered
        before it was sent, and itself if it is one; *inflight*: requests
        still unanswered. Returns the bound (tokens/s).

        >>> r = Refill()
        >>> r.bound(0, 10**6, 0, 0, 1, 0)          # a 429: it held < 1 token
        >>> r.admitted += 1
        >>> r.bound(10**9, 10**9 + 10**6, 1, 4, 5, 0)  # 1 s on, 4 left after one more
        Fraction(4000, 1001)
        """
        best_num, best_den = 0, 1
        reach = low + seen
        frontier = self._frontier
        oldest = self._count - WINDOW
        while frontier and frontier[0][2] < oldest:
            frontier.popleft()  # out of the window
        # Each remembered answer as (when its request was sent, what it had to refill
        # to reach *low*: its high, its 200s, its requests in flight): one subtraction
        # each. An answer sent no earlier than another, with no more to refill, and
        # remembered after it (so forgotten after it) bounds at least as high whenever
        # it bounds at all, which it does once the clock is past its send: only the
        # answers no later one dominates are read then, all of them otherwise.
        answers = frontier if answered > self._latest else self._answers
        for first_sent, spent, _ in answers:
            num = reach - spent
            den = answered - first_sent
            if num > 0 and den > 0 and num * best_den > best_num * den:
                best_num, best_den = num, den
        if high is not None:
            spent = high + self.admitted + inflight
            while frontier and frontier[-1][0] <= sent and frontier[-1][1] >= spent:
                frontier.pop()  # dominated by this one
            entry = (sent, spent, self._count)
            self._answers.append(entry)
            frontier.append(entry)
            self._count += 1
            self._latest = max(self._latest, sent)
        if best_num:
            rate = self.rate
            # Compared as integers: a Fraction is made only for a new best.
            if rate is None or best_num * NS_PER_S * rate.denominator > rate.numerator * best_den:
                self.rate = Fraction(best_num * NS_PER_S, best_den)
        return self.rate

    def episode(
        self, sent: int, before: int, answered: int, rate: Fraction, pause: int = 0
    ) -> Fraction | None:
        """A 429 that starts a pause: sent at *sent* after *before* 200s, answered at
        *answered*, while the key ran at *rate*; *pause* ns long. The rate after it.

        >>> r = Refill()
        >>> r.sent(0); r.admitted = 10; r.episode(0, 0, 10**7, Fraction(500))  # a burst
        Fraction(500, 1)
        >>> r.sent(10**9); r.answered(10**9, 10**9); r.admitted += 58
        >>> r.episode(2 * 10**9, 68, 2 * 10**9, Fraction(250))   # 97% of (58 + 1 - 10) / 0.99 s
        Fraction(4753, 99)
        """
        start, before_start, first = self._episode
        if start < 0:
            return self.estimate  # answered while paused: sent before the pause
        self._episode = (-1, 0, -1)
        self.unsent = True
        self.quiet = False
        if self.burst is None:
            self.burst, self.first = self.admitted - before_start, answered - start
            self.estimate = rate  # one at a time from here: fewer in flight at the next 429
            return rate
        span = sent - first - self.first
        gained = before - before_start + 1 - self.burst
        if first >= 0 and span > 0 and gained > 0:
            self.estimate, self.guessed = MARGIN * Fraction(gained * NS_PER_S, span), -1
            return self.estimate
        self.estimate, self.guessed = rate / 2, answered + pause
        return self.estimate

    def pace(self, now: int) -> Fraction | None:
        """The rate to run at *now* (ns): the estimate, grown since if it was a guess.

        >>> r = Refill()
        >>> r.sent(0); r.episode(0, 0, 0, Fraction(500))   # the first 429: the burst
        Fraction(500, 1)
        >>> r.sent(10); r.episode(10, 0, 10, Fraction(500)), r.pace(2 * 10**9 + 10)
        (Fraction(250, 1), Fraction(300, 1))
        """
        if self.estimate is None or self.guessed < 0:
            return self.estimate
        grown = self.estimate * (1 + GROWTH * Fraction(max(now - self.guessed, 0), NS_PER_S))
        # Down to 1/1000 token/s: kept small, and never 0 (a guess halved many times).
        return Fraction(max(math.floor(grown * 1000), 1), 1000)

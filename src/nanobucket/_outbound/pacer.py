"""What the outbound adapters share: pacing each key by the limits its server announces.

``Pacer`` holds one `TokenBucket` per key (a host, by default), at the
rate and capacity the user configured, and lowers them to what the server
announces (the fields are read by `nanobucket._outbound.fields`); the adapters run
each request through it (`nanobucket._outbound.adapter`). Nothing here imports an
HTTP client.

What a response teaches, per key:

* ``Retry-After`` on a 429 or 503 (seconds, or an HTTP date read against the
  response's ``Date``): no request to the key starts before then, and the
  bucket holds one token at that moment, so the requests that waited leave
  at the rate, not in one burst.
* ``RateLimit-Policy: "name";q=<quota>;w=<window>`` (IETF httpapi draft): no
  ``w``-long span may hold more than ``q`` (a sliding window's rule, which
  fixed windows and token buckets also keep), so the capacity becomes ``c``,
  a twentieth of ``q``, and the rate ``(q - c) / w`` (`window_pace`). The
  requests let go before the policy was known start the bucket in debt.
  With several policies, the one the ``RateLimit`` field names with the
  least remaining (the binding one), else the slowest.
* ``RateLimit: "name";r=<remaining>;t=<reset>``, or ``X-RateLimit-Remaining``
  / ``-Limit`` / ``-Reset`` (also without the ``X-``): the bucket never holds
  more tokens than the server has left (less the requests still in flight),
  and never more capacity than ``Limit`` nor than the most the server has
  been seen to hold. A reset above 10**9 is a Unix time (as some APIs
  send), else seconds.
* No rate announced (``X-RateLimit-*`` alone, or only ``Retry-After``): the
  rate is learned from the answers (`nanobucket._outbound.learn`). Until it is, a
  remaining of 0 waits for the reset; after, the key runs at the learned
  rate, which a reset too far for it (a fixed window) makes it forget.
  With ``shared=``, where that bound misses the other processes' requests,
  each process runs at a share of the server's rate that it moves by what
  the server has left (`_probed`).

With ``shared=``, whatever the fields, a key's first request in each
process goes alone: the others wait for its answer (`PROBE_FIRST_NS` at
most), so each process starts from what the server said, not at your rate
(which, in every process at once, would spend the server's many times).

The bucket's rate and capacity never exceed the user's and follow the
server up and down again: what a key owes (its bucket's tokens, its
window's departures) carries over to a new rate in tokens, so the next
request waits what the new rate says. A 429 forgets what the server was
seen to hold. Fields that do not parse are ignored, as if absent. No
answer holds a key past a day (`MAX_WAIT_S`): a wait announced past a day
is one day, and a rate slower than one request a day (a window of a year,
or of 10**15 s) is one a day, so the request sent then hears what the
server says by then. `Pacer.limit` tells what the next request waits, when
none other is out or waiting: its pause, or at most one token's time at
its rate if that is longer. Whatever the numbers, an answer is learned
from in a bounded number of steps.

Memory: at most *max_keys* keys (default 1024) are remembered, least
recently used dropped first (threads racing may swap two neighbours), a
paused one last; a dropped key starts again from the user's limits.

Cost: most requests take one path, written for it (`Pacer.take`, then
``Outbound._paced`` without its generator, in `nanobucket._outbound.adapter`): the bucket
has a token at hand, the answer carries no limit field (the adapter looks in one pass
over its client's header list), or the same IETF fields as the last one
followed, or another remaining of the same form. A key whose server has
said nothing yet (no field, no 429, no 503) is bare: its requests are
counted by two atomic counters, with no lock and no clock, and the first
answer that says something reads them (`_fold`).
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from fractions import Fraction
from typing import Any, NamedTuple

from .._compose.hooks import logger
from .._compose.waiting import Waiting
from .._core._bucket import TokenBucket
from .._core._gcra_py import INT64_MAX, carry_over
from .._core._params import (
    NOW_MAX,
    NS_PER_S,
    TAU_MAX,
    Clock,
    RateArg,
    RateLike,
    bucket_params,
    clock_or_monotonic,
    int_at_least,
    public_rate,
    rate_fraction,
    validated_max_keys,
    validated_timeout,
)
from .fields import (
    MAX_WAIT_S,
    Announced,
    Get,
    WallClock,
    one_state,
    parse_limits,
    parse_retry_after,
    remaining_after,
    told,
)
from .learn import Refill

__all__ = (
    "Announced",
    "KeyLimit",
    "Pacer",
    "Ticket",
    "WaitTooLong",
    "parse_limits",
    "parse_retry_after",
    "window_pace",
)

_ONE_A_DAY = Fraction(1, MAX_WAIT_S)  # the slowest rate a key follows (tokens/s)
_MAX_WAIT_NS = MAX_WAIT_S * NS_PER_S
RECENT = 512  # requests of a key remembered with their shared price (`SharedPace.cost`)
PROBE_SPAN = 4 * NS_PER_S  # the longest a probe's rate moves for at once (`_probed`)
# How a probe moves (`_probed`), per second of what an answer says: a full server grows it
# by 1x its rate, an empty one cuts it by 16x (so by 3/4, the most one answer cuts), a
# remaining of R of the capacity moves it by 2 * (R - 1/PROBE_KEEP); and the remaining
# gaining R of the capacity since the key's last answer moves it by R at once.
PROBE_GROWTH, PROBE_CUT, PROBE_LEVEL, PROBE_SLOPE, PROBE_KEEP = 1, 16, 2, 1, 8
# Run with others (``shared=``), a key's first request goes alone: the next waits for
# its answer, looking every PROBE_POLL_NS, at most PROBE_FIRST_NS (`Pacer._sent`).
PROBE_FIRST_NS, PROBE_POLL_NS = 100_000_000, 5_000_000
BURST_SHARE = 20  # a window's quota per token of the burst paced within it (`window_pace`)


# --------------------------------------------------------------------------
# Pacing


class KeyLimit(NamedTuple):
    """A key's limit now: the rate and capacity its bucket has, the seconds its next
    request waits before that rate applies (a pause the server asked for, or the reset
    of an announced budget with no room left), and whether the key is known.

    Known: a request for it went out, so what the server's answers said
    applies. An unknown key (none yet, or forgotten past ``max_keys``) has
    ``known=False`` and your own rate and capacity: what its first request
    gets, nothing learned.

    >>> KeyLimit(rate=50, capacity=10, paused_for=0.0).known
    True
    """

    rate: RateLike
    capacity: int
    paused_for: float
    known: bool = True


def window_pace(quota: int, window: int, capacity: int) -> tuple[Fraction, int]:
    """The rate (tokens/s) and capacity that keep every *window*-long span at most *quota*.

    A server's ``q`` per ``w`` may be a sliding window, which admits at most
    ``q`` in any ``w`` s, or a fixed one, or a token bucket; pacing that keeps
    every ``w``-long span at most ``q`` suits all three. A bucket of capacity
    ``c`` and rate ``r`` admits at most ``c + r * w`` in a closed span of
    ``w``, so ``r = (q - c) / w`` holds it to ``q``, with one token's time to
    spare against jitter. ``c`` is a twentieth of ``q`` (at least 1, at most
    *capacity*): the rate stays at >= 95% of ``q / w`` (``q`` >= 20; a small
    ``q`` loses one token, 90% at ``q`` = 10), and a caller idle for a while
    still finds a burst that grows with the quota. The rate is never below
    half of ``q / w``: with ``q`` = 1 the bound leaves nothing, and half keeps
    a whole window of slack.

    >>> window_pace(50, 1, 500), window_pace(1000, 60, 10), window_pace(1, 1, 5)
    ((Fraction(48, 1), 2), (Fraction(33, 2), 10), (Fraction(1, 2), 1))
    """
    c = max(1, min(capacity, quota // BURST_SHARE))
    return Fraction(max(2 * (quota - c), quota), 2 * window), c


_window_pace = functools.lru_cache(maxsize=64)(window_pace)  # one Fraction per policy


class _Key:
    """One key's bucket, its line of waiters, and what the server said."""

    __slots__ = (
        "bare", "bare_counted", "bare_ended", "bare_oks", "bare_open", "bare_sends",
        "bare_ticket", "bucket", "departed", "first_held", "first_sent", "follow_args",
        "followed", "inflight", "interval", "lock", "paused_until", "policy", "probe",
        "probe_gap", "probe_left", "probed_at", "refill", "said", "said_texts", "seen",
        "shared_carry", "shared_price", "shared_recent", "slack", "waiting",
    )  # fmt: skip

    def __init__(self, pacer: Pacer) -> None:
        # One per process by design: processes pace together through ``shared=``.
        self.bucket = TokenBucket(pacer.rate, pacer.capacity, clock=pacer.clock, per_process=True)
        self.waiting = Waiting(
            self.bucket,
            max_waiters=pacer.max_waiters,
            sleep=pacer.sleep,
            async_sleep=pacer.async_sleep,
        )
        self.lock = threading.Lock()
        self.paused_until = 0  # ns of the clock: no request starts before it
        self.inflight = 0  # requests sent and not yet answered
        self.policy: tuple[int, int] | None = None  # the last (q, w) announced
        self.seen = 0  # the most tokens the server was seen to hold (r + 1)
        self.refill = Refill()  # the rate learned when none is announced
        # The rate (tokens per 1000 s) a key run with others probes at (`_probed`).
        self.probe = 0
        self.probed_at = 0  # and when it last moved (ns)
        self.probe_left = -1  # what the server had left then (-1: not yet)
        self.probe_gap = 0  # ns between the key's answers, averaged (0: none yet)
        self.first_sent = 0  # when the first request left, run with others (ns)
        self.first_held = False  # and others were held for its answer
        self.departed = 0  # the bucket's tat, by the times requests really left (ns)
        self.interval = self.slack = 0  # the bucket's, for departures (`_Key.measure`)
        self.measure()
        self.said: Announced | None = None  # the last answer's, when `_done` followed it
        # and the IETF fields that said it, when they alone did: the same texts are
        # the same announcement, not read again (`Pacer.done`)
        self.said_texts: tuple[str | None, str, Announced, str | None] | None = None
        self.followed: tuple[Any, ...] = ()  # what `Pacer._follow` last set the bucket by
        self.follow_args: tuple[Any, ...] = ()  # and what it was last called with
        # Bare while its server has sent no limit field, no 429 and no 503: then a
        # request is only counted, by two counters that need no lock (`Pacer.take`).
        self.bare = True
        self.bare_open = True  # bare requests may still be out: `_fold` reads the counters
        self.bare_sends = itertools.count()  # bare requests sent
        self.bare_oks = itertools.count()  # and answered with nothing to learn
        self.bare_ended = 0  # and otherwise (an error, or an answer `done` read)
        self.bare_counted = 0  # bare oks already in refill.admitted
        self.bare_ticket: Ticket = (self, -1, -1)  # the ticket of every bare request
        # With a shared limit (`SharedPace.cost`), in ns of its timeline: what was paid
        # ahead (below 0: owed), a request's price (0: none yet), and the recent
        # requests' times and prices.
        self.shared_carry = 0
        self.shared_price = 0
        self.shared_recent: deque[tuple[int, int]] = deque(maxlen=RECENT)

    def measure(self) -> None:
        """Note the bucket's interval, and how early a departure may be by the times
        requests really left: ``(capacity - 1)`` tokens and half of one."""
        interval = self.interval = self.bucket.interval_ns
        self.slack = (self.bucket.capacity - 1) * interval + interval // 2


def _count(counter: itertools.count[int]) -> int:
    """How many times ``next`` was called on *counter* (made as ``itertools.count()``)."""
    return int(repr(counter)[6:-1])


def _fold(state: _Key) -> int:
    """Under the key's lock: its bare 200s counted into ``refill.admitted``; the bare
    requests still out."""
    if not state.bare_open:
        return 0
    # The answers first: each was sent before it was answered, so a request sent and
    # answered between the two reads is counted as still out (the next fold sees it
    # answered), never an answered one as not sent.
    oks = _count(state.bare_oks)
    sends = _count(state.bare_sends)
    state.refill.admitted += oks - state.bare_counted
    state.bare_counted = oks
    out = sends - oks - state.bare_ended
    if not out and not state.bare:
        state.bare_open = False  # none out and none to come: no more counting
    return out


#: A request `Pacer.start` or `Pacer.take` let go: its key's state, when it left
#: (ns), and the key's 200s answered before it left. A plain tuple: one is made
#: per request.
Ticket = tuple[_Key, int, int]


class WaitTooLong(Exception):
    """Raised by `Pacer.start`: the wait would pass the timeout (or the line is full)."""

    def __init__(self, message: str, key: Hashable, retry_after_ns: int) -> None:
        super().__init__(message)
        self.key = key
        self.retry_after_ns = retry_after_ns


class Pacer:
    """Buckets per key at the user's limits, lowered to the server's; see the module."""

    def __init__(
        self,
        rate: RateArg,
        capacity: int | None = None,
        *,
        timeout: float | None,
        max_keys: int,
        max_waiters: int,
        clock: Clock | None,
        wall_clock: WallClock | None = None,
        sleep: Callable[[float], object] | None,
        async_sleep: Callable[[float], Any] | None,
    ) -> None:
        exact, self.capacity, _, _ = bucket_params(rate, capacity)
        self.rate: RateLike = public_rate(rate, exact)
        self._exact = exact
        self.timeout = validated_timeout(timeout)
        self.max_keys = validated_max_keys(max_keys)
        self.max_waiters = int_at_least(max_waiters, "max_waiters", 0)
        self.clock: Clock = clock_or_monotonic(clock)
        if wall_clock is not None and not callable(wall_clock):
            kind = type(wall_clock).__name__
            raise TypeError(f"wall_clock must be a callable returning int ns, not {kind}")
        self.wall_clock: WallClock = time.time_ns if wall_clock is None else wall_clock
        self.sleep = sleep
        self.async_sleep = async_sleep
        self._keys: OrderedDict[Hashable, _Key] = OrderedDict()
        self._last: _Key | None = None  # the key `take` last moved to the end
        self._lock = threading.Lock()
        # Set by `SharedPace`: a learned rate is probed above (`_probed`).
        self.probing = False
        self._probe_most = math.ceil(exact * 1000)  # no probe passes your rate
        self._warned = False  # `_warn_learned` said it
        Waiting(TokenBucket(1, 1), sleep=sleep, async_sleep=async_sleep)  # checks them now

    def _state(self, key: Hashable) -> _Key:
        with self._lock:
            state = self._keys.get(key)
            if state is not None:
                self._keys.move_to_end(key)
                self._last = state
                return state
            if len(self._keys) >= self.max_keys:
                now = self.clock()
                # A copy made in one C call: `take` moves keys without this lock, and
                # would break an iteration that a thread switch interrupts.
                victim = next(
                    (k for k, s in list(self._keys.items()) if s.paused_until <= now),
                    next(iter(self._keys)),
                )
                del self._keys[victim]
            state = self._keys[key] = self._last = _Key(self)
            return state

    def limit(self, key: Hashable) -> KeyLimit:
        """*key*'s rate, capacity and pause left now; unknown: the user's, ``known=False``."""
        with self._lock:
            state = self._keys.get(key)
        if state is None:
            return KeyLimit(self.rate, self.capacity, 0.0, known=False)
        left = max(0, state.paused_until - self.clock())
        return KeyLimit(state.bucket.rate, state.bucket.capacity, left / NS_PER_S)

    def _deadline(self) -> int | None:
        if self.timeout is None:
            return None
        return self.clock() + min(int(self.timeout * NS_PER_S), MAX_WAIT_S * NS_PER_S)

    def _left(self, deadline: int | None) -> float | None:
        return None if deadline is None else max(0, deadline - self.clock()) / NS_PER_S

    def _sent(self, state: _Key, now: int | None = None) -> Ticket | None:
        """Count the request as sent, unless a pause began while it waited; with *now*,
        the caller holds the key's lock and read the clock."""
        if now is None:
            # acquire / release: on every request, and half the cost of `with`.
            lock = state.lock
            lock.acquire()
            try:
                return self._sent(state, self.clock())
            finally:
                lock.release()
        if now < state.paused_until:
            # Its token predates the pause: it queues again behind it. The
            # bucket may hold tokens before the pause's end again (a faster
            # rate, a refund since): emptied to it, the wait is one sleep,
            # not one per token of the pause.
            _hold(state.bucket, state.paused_until)
            return None
        if state.policy is not None:
            # A window counts the times requests really leave. A thread or
            # task woken late (a stalled process) would leave together with
            # the ones due after it, more than the burst at once, and the
            # window that starts then would hold more than q: past the
            # burst by their real times, it queues again, and the bucket
            # owes until the departures have a token. Half a token's time
            # early is on time (a timer may fire a little early), and
            # still no window holds more than c + r * w + 1/2: q.
            departed = state.departed
            due = departed - state.slack
            if now < due:
                _hold(state.bucket, due)
                return None
            state.departed = (departed if departed > now else now) + state.interval
        if self.probing and state.bare and not state.refill.admitted:
            # Run with other processes, a key whose server has not answered yet sends
            # one request and waits for its answer (up to PROBE_FIRST_NS): each
            # process starting a burst at your rate would spend the server's many times.
            if state.inflight:
                end = state.first_sent + PROBE_FIRST_NS
                if now < end:
                    state.first_held = True
                    _hold(state.bucket, min(end, now + PROBE_POLL_NS))
                    return None
            else:
                state.first_sent = now
        state.inflight += 1
        if state.bare_open:
            _fold(state)  # the bare 200s answered before it left: not while it is out
        refill = state.refill
        if refill.unsent:  # else it starts nothing
            refill.sent(now)
        return state, now, refill.admitted

    def _refused(self, key: Hashable, state: _Key, timeout: float | None) -> WaitTooLong:
        now = self.clock()
        wait = max(state.bucket.peek().retry_after_ns, state.paused_until - now, 0)
        if timeout is not None and wait <= timeout * NS_PER_S:
            reason = f"{self.max_waiters} requests are already waiting for it"
        else:
            reason = f"that is more than the timeout of {self.timeout} s"
        return WaitTooLong(
            f"rate limit of {key!r}: the next request may start in {wait / NS_PER_S:.3f} s; "
            + reason,
            key,
            wait,
        )

    def take(self, key: Hashable) -> Ticket | None:
        """*key*'s ticket if its bucket holds a token now: the path of most requests.

        None when the request must wait (`start` then waits in line), a
        pause or the window's departures hold it, or the key is new.
        """
        keys = self._keys
        state = keys.get(key)
        if state is None:
            return None
        if state is not self._last:  # else already the most recently used, or nearly
            self._last = state
            try:
                keys.move_to_end(key)  # one call, atomic
            except KeyError:  # dropped by another thread meanwhile
                return None
        if not state.bucket.allow():
            return None
        if state.bare:
            # Nothing to learn, no pause, no window: counted (one atomic call), no lock,
            # no clock. `done` reads such a ticket as one of unknown time.
            next(state.bare_sends)
            return state.bare_ticket
        lock = state.lock
        lock.acquire()
        try:
            # `_sent`'s common case, written out: no pause, the window's departures
            # on time.
            now = self.clock()
            if now < state.paused_until:
                return self._sent(state, now)
            if state.policy is not None:
                departed = state.departed
                if now < departed - state.slack:
                    return self._sent(state, now)
                state.departed = (departed if departed > now else now) + state.interval
            state.inflight += 1
            if state.bare_open:
                _fold(state)  # the bare 200s answered before it left: not while it is out
            refill = state.refill
            if refill.unsent:  # else it starts nothing
                refill.sent(now)
            return state, now, refill.admitted
        finally:
            lock.release()

    def start(self, key: Hashable, deadline: int | None = None) -> Ticket:
        """Wait (block the thread) for *key*'s token; the ticket for `done`. The wait ends
        by *deadline* (clock ns; default: the timeout from now)."""
        if deadline is None:
            deadline = self._deadline()
        while True:
            state = self._state(key)
            left = self._left(deadline)
            if not state.waiting.acquire(timeout=left):
                raise self._refused(key, state, left)
            if (ticket := self._sent(state)) is not None:
                return ticket

    async def start_async(self, key: Hashable, deadline: int | None = None) -> Ticket:
        """`start` for asyncio."""
        if deadline is None:
            deadline = self._deadline()
        while True:
            state = self._state(key)
            left = self._left(deadline)
            if not await state.waiting.acquire_async(timeout=left):
                raise self._refused(key, state, left)
            if (ticket := self._sent(state)) is not None:
                return ticket

    def failed(self, ticket: Ticket) -> None:
        """The request of *ticket* raised before an answer: nothing is learned."""
        state = ticket[0]
        with state.lock:
            if ticket[1] < 0:
                state.bare_ended += 1
            else:
                state.inflight -= 1

    def unsent(self, ticket: Ticket) -> None:
        """The request of *ticket* was not sent after all (the processes' shared limit
        refused it): no longer out, and its token goes back to the key's bucket."""
        self.failed(ticket)
        ticket[0].bucket.refund()

    def plain(self, ticket: Ticket) -> bool:
        """Count an answer of *ticket* with no `TRIGGERS` field, neither 429 nor 503, if
        that is all it teaches (True); False when `done` must read it (a rate is run
        at, or an episode's first answer is awaited: see `Refill.quiet`)."""
        state, sent, _ = ticket
        if sent < 0:  # a bare request: counted without a lock
            next(state.bare_oks)
            return True
        refill = state.refill
        lock = state.lock
        lock.acquire()
        try:
            if not refill.quiet:
                return False
            state.inflight -= 1
            refill.admitted += 1
            return True
        finally:
            lock.release()

    def done(self, ticket: Ticket, status: int, get: Get) -> int:
        """Learn from the answer of a request `start` let go; ns until the key's pause ends."""
        state, sent, before = ticket
        said = state.said_texts
        remaining = None
        if said is not None and status not in {429, 503} and get("ratelimit-policy") == said[0]:
            text = get("ratelimit")
            if text == said[1]:
                remaining = said[2].remaining
            elif text is not None and said[3] is not None:
                # The same policy's state in the same form, another remaining.
                remaining = remaining_after(said[3], text)
        if remaining is not None:
            announced: Announced | None = said[2]  # type: ignore[index]
            pause = None
        else:
            try:
                announced = parse_limits(get, self.wall_clock)
                pause = parse_retry_after(get, self.wall_clock) if status in (429, 503) else None
            except BaseException:
                self.failed(ticket)  # answered all the same: no longer in flight
                raise
        now = self.clock()
        lock = state.lock
        lock.acquire()
        try:
            if (
                remaining is not None
                and announced is state.said
                and remaining < state.seen
                and not state.bare_open
            ):
                # What the last answer said, and it was followed: only the counts
                # and the tokens left move (the common case of a server's fields).
                refill = state.refill
                if sent < 0:
                    state.bare_ended += 1
                    unseen = 0
                else:
                    state.inflight -= 1
                    unseen = refill.admitted - before
                refill.admitted += 1
                left = remaining - state.inflight - unseen
                if left < state.bucket.capacity:
                    _lower(state.bucket, now, left)
                left_ns = state.paused_until - now
                return left_ns if left_ns > 0 else 0
            if (
                remaining is None
                and announced is not None
                and announced.rate is None
                and announced.remaining is not None
                and status not in {429, 503}
                and sent >= 0
                and state.policy is None
                and not state.bare_open
                and not self.probing
            ):
                return self._bound(state, sent, before, announced, now)
            if remaining is not None and remaining != announced.remaining:  # type: ignore[union-attr]
                announced = parse_limits(
                    get, self.wall_clock
                )  # it says more than the last one: read it all
            left_ns = self._done(state, ticket, before, status, announced, pause, now)
            if announced is not None and state.said is announced:
                policy_text, state_text = get("ratelimit-policy"), get("ratelimit")
                # The IETF fields alone said it: the same texts next time say it again.
                if state_text and told(policy_text, state_text) is announced:
                    state.said_texts = (policy_text, state_text, announced, one_state(state_text))
            return left_ns
        finally:
            lock.release()

    def _done(
        self,
        state: _Key,
        ticket: Ticket,
        before: int,
        status: int,
        announced: Announced | None,
        pause: int | None,
        now: int,
    ) -> int:
        """`done` under the key's lock."""
        out = _fold(state)
        ok = status not in {429, 503}
        refill = state.refill
        if ticket[1] < 0:  # bare: sent before the server said anything, at a time unknown
            state.bare_ended += 1
            out -= 1
            unseen = 0
        else:
            state.inflight -= 1
            # Answered while it was out: maybe decided after it, so not in its fields.
            unseen = refill.admitted - before
        inflight = state.inflight + out
        bucket = state.bucket
        if state.first_held:
            # The requests held while the first was out (`_sent`) owe nothing for the
            # hold, whatever rate its answer sets: the key's bucket is full again, as
            # it is once the first's own token refilled (its answer took that long).
            state.first_held = False
            bucket.refund_at(now, bucket.capacity)
        if announced is not None or not ok:
            state.bare = False
        if status == 429:
            state.seen = 0  # our picture was too generous: relearn it
        refill.admitted += ok
        learned = None
        if announced is None or announced.rate is None:
            learned = self._learn(ticket, ok, status, announced, pause, now, inflight)
        if announced is not None:
            rate, limit, remaining, reset_ns, policy = announced
            adopted = policy is not None and policy != state.policy
            if policy != state.policy:
                state.policy, state.seen = policy, 0
            if remaining is not None and remaining >= state.seen:
                state.seen = remaining + 1
            pace: Fraction | None
            most: int | None
            if policy is not None:
                pace, most = _window_pace(policy[0], policy[1], self.capacity)
            else:
                if remaining is not None and self.probing:
                    most = limit if limit is not None else state.seen
                    learned = _probed(state, remaining, most, now, self._probe_most)
                    if not self._warned:
                        self._warned = True
                        _warn_learned()
                pace, most = learned or _spread(announced, self.capacity), limit
            self._follow(state, pace, most, now)
            if adopted and most is not None:
                # The requests let go before the window was known left at the
                # user's limits: this one, those still out and those answered
                # meanwhile count against the window the bucket starts now.
                _owe(bucket, now, most - 1 - inflight - unseen)
            if remaining is not None:
                left = remaining - inflight - unseen
                # (With as much left as its capacity, the bucket holds no more anyway.)
                lowered = left < bucket.capacity and _lower(bucket, now, left)
                if learned is not None and not self.probing and not lowered:
                    # Spend what the server says it has: paced at a lower bound
                    # alone, the key would stay below the server's rate (a probe
                    # follows it instead: each process spending it all would
                    # spend it many times over). Lowered, it has it already.
                    _raise(bucket, now, left - state.waiting.waiters)
                if (
                    not remaining
                    and rate is None
                    and learned is None
                    and reset_ns is not None
                    and pause is None
                ):
                    pause = reset_ns
        else:
            if learned is not None:
                self._follow(state, learned, 1, now)  # a small burst: the server's is unsaid
            if status == 429:
                _lower(bucket, now, 0)
        if pause is not None and now + pause > state.paused_until:
            state.paused_until = now + pause
            _hold(bucket, state.paused_until)
        # Followed as it says, the same fields next time change only the counts.
        followed = announced is not None and announced.rate is not None and ok and pause is None
        state.said = announced if followed else None
        state.said_texts = None
        left_ns = state.paused_until - now
        return left_ns if left_ns > 0 else 0

    def _bound(self, state: _Key, sent: int, before: int, announced: Announced, now: int) -> int:
        """`_done` for a 200 that says what the server has left and no rate (``X-RateLimit-*``),
        to a key that follows no policy, with no bare request out, not probing: the
        common case of such a server's answers, its branches taken as `_done` takes them."""
        _, limit, remaining, reset_ns, _ = announced
        assert remaining is not None  # for mypy: `done` checked it
        refill = state.refill
        state.bare = False
        state.inflight -= 1
        inflight = state.inflight
        unseen = refill.admitted - before
        refill.admitted += 1
        # `_learn`: a bound from what it has left, forgotten at a window's reset
        learned = refill.bound(sent, now, before + 1, remaining, remaining + 1, inflight)
        if (
            learned is not None
            and limit is not None
            and reset_ns is not None
            and reset_ns > NS_PER_S  # else it never is: a reset of 1 s is most answers'
            and (reset_ns - NS_PER_S) * learned.numerator
            > max(limit - remaining, 0) * NS_PER_S * learned.denominator
        ):
            refill.forget()
            learned = None
        if remaining >= state.seen:
            state.seen = remaining + 1
        # A bound is never 0: no Fraction's truth is asked.
        pace = learned if learned is not None else _spread(announced, self.capacity)
        self._follow(state, pace, limit, now)
        bucket = state.bucket
        left = remaining - inflight - unseen
        lowered = left < bucket.capacity and _lower(bucket, now, left)
        if learned is not None:
            if not lowered:
                _raise(bucket, now, left - state.waiting.waiters)
        elif not remaining and reset_ns is not None and now + reset_ns > state.paused_until:
            state.paused_until = now + reset_ns
            _hold(bucket, state.paused_until)
        state.said = state.said_texts = None
        left_ns = state.paused_until - now
        return left_ns if left_ns > 0 else 0

    def _learn(
        self,
        ticket: Ticket,
        ok: bool,
        status: int,
        announced: Announced | None,
        pause: int | None,
        now: int,
        inflight: int,
    ) -> Fraction | None:
        """The rate learned for a key whose server announces none (None: none yet).

        A bare ticket (`Pacer.take`) was sent before any of this: at an unknown
        time, after unknown 200s. It bounds no rate (a guess could overstate it);
        as a 429 it ends an episode as if sent when answered (a later send: a
        slower estimate).
        """
        if announced is not None and announced.rate is not None:
            return None
        state, sent, before = ticket
        refill = state.refill
        bare = sent < 0
        if bare:
            sent, before = now, refill.admitted - ok
        seen = before + ok
        if status == 429:
            refill.forget()  # the bound was too generous, or the server changed
        if announced is None or announced.remaining is None:
            refill.answered(sent, now)
            if status == 429 and pause is not None:
                # The lower bound would hold the key below the server for good: see _learn.
                running = rate_fraction(state.bucket.rate)
                refill.episode(sent, before, now, running, pause)
            return refill.pace(now)
        left = announced.remaining
        if bare:
            return refill.rate
        rate = refill.bound(sent, now, seen, left, left + 1, inflight)
        limit, reset = announced.limit, announced.reset_ns
        if (
            rate is not None
            and limit is not None
            and reset is not None
            and reset > NS_PER_S
            # (reset - 1 s) * rate > (limit - left) tokens, in integers: no Fraction made
            and (reset - NS_PER_S) * rate.numerator
            > max(limit - left, 0) * NS_PER_S * rate.denominator
        ):
            refill.forget()  # a token bucket at this rate is full sooner: a window's reset
            return None
        return rate

    def _follow(
        self, state: _Key, rate_bound: Fraction | None, limit: int | None, now: int
    ) -> None:
        """Set the bucket's rate and capacity to the server's, within the user's.

        A rate slower than one request a day (`MAX_WAIT_S`) is one a day, as
        a wait announced past a day is a day: no answer holds the key longer,
        and the request sent then hears what the server says by then. The
        departures the window owes carry over as the bucket's tokens do, so
        a faster rate owes them at its own spacing, not at the old one's.
        """
        called = (rate_bound, limit, state.seen)
        if called == state.follow_args:
            return  # called as last time (most answers): the bucket has them
        state.follow_args = called
        capacity = self.capacity
        for bound in (limit, state.seen or None):
            if bound is not None:
                capacity = max(1, min(capacity, bound))
        followed = (rate_bound, capacity)
        if followed == state.followed:
            return  # as last time: the bucket has them
        state.followed = followed
        rate: RateLike = self.rate
        if rate_bound is not None and rate_bound < self._exact:
            # A bucket holds at most 2**62 ns: a larger capacity's slowest rate is faster.
            slowest = max(_ONE_A_DAY, Fraction(NS_PER_S, TAU_MAX // capacity))
            if slowest < self._exact:  # else your own rate is the slower
                rate = max(rate_bound, slowest)
        bucket = state.bucket
        if rate != bucket.rate or capacity != bucket.capacity:
            interval, tau = state.interval, state.interval * bucket.capacity
            bucket.reconfigure(rate, capacity, now=now)
            state.measure()
            state.departed = carry_over(
                state.departed, now, interval, tau, state.interval, state.interval * capacity
            )


def _probed(state: _Key, remaining: int, most: int, now: int, ceiling: int) -> Fraction:
    """The rate to run *state* at, one process of several, after an answer that leaves
    the server *remaining* of *most* tokens (at *now*, ns); *ceiling*: your rate, in
    tokens per 1000 s, as the probe.

    What the server has left is the same for every process, and the
    processes' rates add up (each pays one shared token a request:
    `nanobucket._outbound.shared`). So each moves its own rate by what it
    sees, in proportion to it and to the time since its last answer (see
    `PROBE_GROWTH`): full (or one short), the processes together send
    slower than the server refills, and each speeds up; empty, they send
    faster, and each slows down, fast; in between, each moves by what the
    remaining gained since its last answer and by how far it is above an
    eighth of the capacity (below it: a slowdown). Every process moves
    alike, so their sum follows the server, a bucket (whose remaining
    rises while they send slower than it refills) or a sliding window
    (whose remaining is what the last window left). A lower bound one
    process learned misses the others' requests, so it is no floor here;
    the floor is a quarter of what this process really sends (its
    answers' spacing, averaged), the ceiling one and a half times that: a
    rate it does not use moves nothing, and no run of empty answers drives
    it to nothing at once.

    >>> state = _Key(Pacer(500, 50, timeout=None, max_keys=1, max_waiters=0, clock=None,
    ...                    sleep=None, async_sleep=None))
    >>> _probed(state, 9, 10, 0, 500_000)  # full at first: your rate
    Fraction(500, 1)
    >>> _probed(state, 0, 10, 10**8, 500_000)  # empty 0.1 s on: 1.5 x 10/s sent, less 3/4
    Fraction(15, 4)
    """
    most = max(most, 1)
    probe = state.probe or ceiling  # from your rate: the server's answers bring it down
    # Not counting a pause: the server filled then, whatever the rate.
    since = min(max(now - max(state.probed_at, state.paused_until), 0), PROBE_SPAN)
    last = state.probe_left
    if last >= 0:
        gap = now - state.probed_at
        average = state.probe_gap
        state.probe_gap = average + (gap - average) // 8 if average else gap
    else:
        last = remaining
    # What this process sends, in tokens per 1000 s, as the probe (0: not known yet).
    sends = 1000 * NS_PER_S // state.probe_gap if state.probe_gap > 0 else 0
    if sends:
        probe = min(probe, 3 * sends // 2)
    # The change, in millionths of the rate.
    if remaining + 1 >= most:
        change = PROBE_GROWTH * since // 1000
    elif remaining == 0:
        change = -PROBE_CUT * since // 1000
    else:
        slope = PROBE_SLOPE * (remaining - last) * 10**6 // most
        keep = PROBE_KEEP * remaining - most  # above an eighth, in eighths of tokens
        level = PROBE_LEVEL * keep * since // (PROBE_KEEP * most * 1000)
        change = slope + level
    probe += probe * min(max(change, -3 * 10**6 // 4), 10**6) // 10**6
    probe = min(max(probe, sends // 4, 1), max(ceiling, 1))
    state.probe, state.probed_at, state.probe_left = probe, now, remaining
    return Fraction(probe, 1000)


def _warn_learned() -> None:
    logger.warning(
        "nanobucket: a server answers with X-RateLimit-* fields, which say no rate; the "
        "processes sharing a limit follow it together by what the server has left, and may "
        "meet 429s while they start or when it slows down (a server that sends "
        "RateLimit-Policy is followed exactly)"
    )


def _lower(bucket: TokenBucket, at: int, most: int) -> bool:
    """Spend what *bucket* holds at *at* (ns) beyond *most* tokens (never below none);
    whether it spent any. It then holds more than ``most - 1``: no `_raise` to
    *most* or less gives any back."""
    most = max(most, 0)
    for _ in range(8):  # a waiter may take tokens in between: look again
        tokens = bucket.tokens_at(at)
        excess = math.ceil(tokens - most)
        if excess <= 0:
            return False
        if excess > tokens:
            # None left, and a fraction of a token beside whole ones: more whole tokens
            # than it holds cannot be spent, so it is held empty from *at* instead.
            _hold(bucket, at + bucket.interval_ns)
            return True
        if bucket.allow_at(at, excess):
            return True
    return False


def _owe(bucket: TokenBucket, at: int, most: int) -> None:
    """Leave *bucket* at most *most* tokens at *at* (ns); below none, a debt it refills
    first, within a day (`MAX_WAIT_S`), as any wait one answer asks for."""
    if most >= 0:
        _lower(bucket, at, most)
    else:
        # Its first token is due once the debt is refilled: at a day a token, a debt of
        # two is two days, and it is owed by one day on.
        _hold(bucket, min(at + (1 - most) * bucket.interval_ns, at + _MAX_WAIT_NS))


def _hold(bucket: TokenBucket, end: int) -> None:
    """Empty *bucket* one token's time before *end* (ns): its first token is due at *end*,
    whatever fraction of one it holds before; a bucket owing past *end* keeps its debt."""
    interval, capacity = bucket.interval_ns, bucket.capacity
    tat = min(end + (capacity - 1) * interval, INT64_MAX)  # the bucket's, held
    # Whole tokens only, given back and taken at a time of our choosing, *take* tokens'
    # time before that tat: one, or more where it lies past the clock's range (a
    # capacity of many slow tokens). A tat short of the held one by less than *take*
    # tokens is at most *at* once they are given back there, and exactly the held
    # one once they are taken there (spending whole tokens now would hold it a
    # fraction too long, or not at all).
    take = min(max(1, -((NOW_MAX - tat) // interval)), capacity)
    at = max(tat - take * interval, 0)
    if bucket.peek_at(at, 0).reset_after_ns < take * interval:  # not held that long yet
        bucket.refund_at(at, take)
        bucket.reserve(cost=take, now=at)


def _spread(announced: Announced, most: int) -> Fraction | None:
    """With no rate known, fewer than *most* tokens left are spread over the reset.

    A fixed window is then not emptied early, and a token bucket, answered
    a little at a time, shows its refill before it is empty.
    """
    left, reset = announced.remaining, announced.reset_ns
    if left is None or not reset or not 0 < left < most:
        return None
    return Fraction(left * NS_PER_S, reset)


def _raise(bucket: TokenBucket, at: int, least: int) -> None:
    """Give *bucket* at least *least* tokens at *at* (ns), owed ones counted.

    The tokens owed to callers asleep in its line count as spent: they still
    leave at their own times, so only the rest is given back. One refund of
    at most the capacity, whatever the server says it has left: the bucket
    never holds more, and more would only cancel what it owes to its line or
    to a pause.
    """
    capacity, interval = bucket.capacity, bucket.interval_ns
    # The bucket's debt at *at*, by a probe of cost 1 (a cost of 0 is validated the
    # long way): one it admits counts its own token in the debt, so that is taken off.
    probe = bucket.peek_at(at, 1)
    debt = probe.reset_after_ns - interval if probe.allowed else probe.reset_after_ns
    free = capacity - debt / interval
    lack = min(math.floor(least - free), least, capacity)
    if lack > 0:
        bucket.refund_at(at, lack)

"""What the outbound adapters share: reading a server's limits, and pacing each key by them.

``Pacer`` holds one `TokenBucket` per key (a host, by default), at the
rate and capacity the user configured, and lowers them to what the server
announces. ``Outbound``, the base of the `nanobucket.httpx` transports and
the `nanobucket.requests` adapter, takes their keywords and runs each request
through the pacer (and again after a 429). Nothing here imports an HTTP client.

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
  rate is learned from the answers (`nanobucket._learn`). Until it is, a
  remaining of 0 waits for the reset; after, the key runs at the learned
  rate, which a reset too far for it (a fixed window) makes it forget.

The bucket's rate and capacity never exceed the user's and follow the
server up and down again. A 429 forgets what the server was seen to hold.
Fields that do not parse are ignored, as if absent; a wait announced past
a day is one day, and a rate slower than a bucket can hold (its capacity
refilled in more than 146 years) is that slowest one: the key waits and
`LimitTimeout` says so. Whatever the numbers, an answer is learned from in
a bounded number of steps.

Memory: at most *max_keys* keys (default 1024) are remembered, least
recently used dropped first, a paused one last; a dropped key starts again
from the user's limits.
"""

from __future__ import annotations

import email.utils
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Hashable, Iterable, Mapping
from fractions import Fraction
from typing import Any, NamedTuple, Protocol, TypedDict, TypeVar

from ._bucket import TokenBucket
from ._drive import Call, drive, drive_async
from ._learn import Refill
from ._params import (
    NS_PER_S,
    TAU_MAX,
    Clock,
    RateLike,
    bucket_params,
    clock_or_monotonic,
    int_at_least,
    public_rate,
    rate_fraction,
    validated_max_keys,
    validated_timeout,
)
from .waiting import DEFAULT_MAX_WAITERS, Waiting

__all__ = (
    "IDEMPOTENT",
    "Announced",
    "KeyLimit",
    "LimitTimeout",
    "Options",
    "Outbound",
    "Pacer",
    "Retries",
    "Ticket",
    "parse_limits",
    "parse_retry_after",
    "window_pace",
)

Get = Callable[[str], "str | None"]  # a response's header by name, case-insensitive

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
MAX_FIELD = 4096  # longer fields are not read
MAX_WAIT_S = 86_400  # a server asking for longer is heard as one day
_EPOCH = 10**9  # a reset above this is a Unix time (2001-09-09), not a delta
_MAX_DIGITS = 15
BURST_SHARE = 20  # a window's quota per token of the burst paced within it (`window_pace`)


# --------------------------------------------------------------------------
# Reading the fields


def _number(text: str) -> Fraction | None:
    """A non-negative decimal (``"2"``, ``"1.5"``) as an exact Fraction, else None."""
    text = text.strip()
    whole, _, frac = text.partition(".")
    if not whole.isdigit() or not whole.isascii() or len(whole) > _MAX_DIGITS:
        return None
    if frac and (not frac.isdigit() or not frac.isascii() or len(frac) > 9):
        return None
    return Fraction(int(whole)) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)


def _whole(text: str) -> int | None:
    value = _number(text)
    return value.numerator if value is not None and value.denominator == 1 else None


def _split(text: str, sep: str) -> list[str] | None:
    """*text* split at *sep* outside double quotes; None if a quote is left open."""
    parts, start, quoted, escaped = [], 0, False, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            parts.append(text[start:i])
            start = i + 1
    if quoted:
        return None
    parts.append(text[start:])
    return parts


def _items(field: str | None) -> list[tuple[str | int, dict[str, int]]]:
    """The members of a structured-field list: ``(name or integer, integer parameters)``.

    A member that does not parse is left out; a quoted name keeps its text.
    """
    if not field or len(field) > MAX_FIELD:
        return []
    members = _split(field, ",")
    out: list[tuple[str | int, dict[str, int]]] = []
    for member in members or []:
        parts = _split(member, ";")
        if not parts or not parts[0].strip():
            continue
        head = parts[0].strip()
        item: str | int
        if len(head) >= 2 and head[0] == head[-1] == '"':
            item = head[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        elif (number := _whole(head)) is not None:
            item = number
        elif head.replace("_", "").replace("-", "").isalnum():
            item = head
        else:
            continue
        params: dict[str, int] = {}
        for param in parts[1:]:
            name, eq, value = param.partition("=")
            number = _whole(value) if eq else None
            if number is not None:
                params[name.strip().lower()] = number
        out.append((item, params))
    return out


# What reading an HTTP date may raise: OSError from a local time out of the
# platform's range (a zone of "-0000" is local time; Windows stops at 3000).
_BAD_DATE = (TypeError, ValueError, IndexError, OverflowError, OSError)


def _wall_now(get: Get) -> float:
    """The server's time of the response: its ``Date``, else this machine's clock."""
    date = get("date")
    if date and len(date) < 64:
        try:
            return email.utils.parsedate_to_datetime(date).timestamp()
        except _BAD_DATE:
            pass
    return time.time()


def _seconds_ns(seconds: Fraction) -> int:
    return min(math.ceil(seconds * NS_PER_S), MAX_WAIT_S * NS_PER_S)


def parse_retry_after(get: Get) -> int | None:
    """``Retry-After`` in ns from now (seconds or an HTTP date), else None.

    A date is read against the response's ``Date`` (the server's clock), or
    this machine's clock when there is none; a date in the past is 0.

    >>> parse_retry_after({"retry-after": "2"}.get)
    2000000000
    >>> parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:05 GMT",
    ...                    "date": "Wed, 21 Oct 2015 07:28:00 GMT"}.get)
    5000000000
    >>> parse_retry_after({"retry-after": "soon"}.get) is None
    True
    """
    value = get("retry-after")
    if not value or len(value) > 64:
        return None
    seconds = _number(value)
    if seconds is not None:
        return _seconds_ns(seconds)
    try:
        when = email.utils.parsedate_to_datetime(value.strip()).timestamp()
    except _BAD_DATE:
        return None
    delta = Fraction(when) - Fraction(_wall_now(get))
    return _seconds_ns(max(delta, Fraction(0)))


class Announced(NamedTuple):
    """What a response says of its key's limit; None where it says nothing."""

    rate: Fraction | None  # tokens per second (a policy's q / w)
    limit: int | None  # the most the capacity may be (q, or X-RateLimit-Limit)
    remaining: int | None  # tokens the server has left
    reset_ns: int | None  # ns until the reset
    policy: tuple[int, int] | None  # (q, w) of the policy followed


def _reset_ns(value: int, get: Get) -> int:
    if value > _EPOCH:
        return _seconds_ns(max(Fraction(value) - Fraction(_wall_now(get)), Fraction(0)))
    return _seconds_ns(Fraction(value))


def parse_limits(get: Get) -> Announced | None:
    """The limit a response announces (IETF fields first, then ``X-RateLimit-*``), or None.

    >>> a = parse_limits({"ratelimit-policy": '"default";q=50;w=1',
    ...                   "ratelimit": '"default";r=7;t=1'}.get)
    >>> a.rate, a.limit, a.remaining, a.reset_ns
    (Fraction(50, 1), 50, 7, 1000000000)
    >>> parse_limits({"x-ratelimit-limit": "10", "x-ratelimit-remaining": "0"}.get).remaining
    0
    >>> parse_limits({"ratelimit-policy": "q=oops"}.get) is None
    True
    """
    policies = {
        (item if isinstance(item, str) else ""): (
            p.get("q", item if isinstance(item, int) else 0),
            p.get("w", 0),
        )
        for item, p in _items(get("ratelimit-policy"))
    }
    policies = {name: (q, w) for name, (q, w) in policies.items() if q >= 1 and w >= 1}
    states = [(item, p) for item, p in _items(get("ratelimit")) if "r" in p]
    policy: tuple[int, int] | None = None
    remaining = reset = None
    if states:
        item, p = min(states, key=lambda s: s[1]["r"])
        remaining, reset = p["r"], p.get("t")
        policy = policies.get(item if isinstance(item, str) else "")
    if policy is None and policies:
        policy = min(policies.values(), key=lambda qw: Fraction(qw[0], qw[1]))
    limit = policy[0] if policy is not None else None
    if remaining is None:
        for prefix in ("ratelimit-", "x-ratelimit-"):
            found = [_first_int(get(prefix + name)) for name in ("limit", "remaining", "reset")]
            if any(v is not None for v in found):
                if limit is None and found[0] is not None and found[0] >= 1:
                    limit = found[0]
                remaining, reset = found[1], found[2]
                break
    if policy is None and limit is None and remaining is None:
        return None
    return Announced(
        Fraction(policy[0], policy[1]) if policy is not None else None,
        limit,
        remaining,
        _reset_ns(reset, get) if reset is not None else None,
        policy,
    )


def _first_int(field: str | None) -> int | None:
    """The first member of *field* when it is a whole number (``"100"``, ``"100, 100;w=60"``)."""
    items = _items(field)
    return items[0][0] if items and isinstance(items[0][0], int) else None


# --------------------------------------------------------------------------
# Pacing


class KeyLimit(NamedTuple):
    """A key's limit now: the rate and capacity its bucket has, and the pause left (s).

    >>> KeyLimit(rate=50, capacity=10, paused_for=0.0).capacity
    10
    """

    rate: RateLike
    capacity: int
    paused_for: float


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


class _Key:
    """One key's bucket, its line of waiters, and what the server said."""

    __slots__ = (
        "bucket", "departed", "inflight", "lock", "paused_until", "policy", "refill", "seen",
        "waiting",
    )  # fmt: skip

    def __init__(self, pacer: Pacer) -> None:
        self.bucket = TokenBucket(pacer.rate, pacer.capacity, clock=pacer.clock)
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
        self.departed = 0  # the bucket's tat, by the times requests really left (ns)


class Ticket(NamedTuple):
    """A request `Pacer.start` let go: its key's state and when it left (ns)."""

    state: _Key
    sent: int
    before: int  # the key's 200s answered before it left


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
        rate: RateLike,
        capacity: int,
        *,
        timeout: float | None,
        max_keys: int,
        max_waiters: int,
        clock: Clock | None,
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
        self.sleep = sleep
        self.async_sleep = async_sleep
        self._keys: OrderedDict[Hashable, _Key] = OrderedDict()
        self._lock = threading.Lock()
        Waiting(TokenBucket(1, 1), sleep=sleep, async_sleep=async_sleep)  # checks them now

    def _state(self, key: Hashable) -> _Key:
        with self._lock:
            state = self._keys.get(key)
            if state is not None:
                self._keys.move_to_end(key)
                return state
            if len(self._keys) >= self.max_keys:
                now = self.clock()
                victim = next(
                    (k for k, s in self._keys.items() if s.paused_until <= now),
                    next(iter(self._keys)),
                )
                del self._keys[victim]
            state = self._keys[key] = _Key(self)
            return state

    def limit(self, key: Hashable) -> KeyLimit:
        """*key*'s rate, capacity and pause left now (the user's limits for a new key)."""
        with self._lock:
            state = self._keys.get(key)
        if state is None:
            return KeyLimit(self.rate, self.capacity, 0.0)
        left = max(0, state.paused_until - self.clock())
        return KeyLimit(state.bucket.rate, state.bucket.capacity, left / NS_PER_S)

    def _deadline(self) -> int | None:
        if self.timeout is None:
            return None
        return self.clock() + min(int(self.timeout * NS_PER_S), MAX_WAIT_S * NS_PER_S)

    def _left(self, deadline: int | None) -> float | None:
        return None if deadline is None else max(0, deadline - self.clock()) / NS_PER_S

    def _sent(self, state: _Key) -> Ticket | None:
        """Count the request as sent, unless a pause began while it waited."""
        with state.lock:
            now = self.clock()
            if now < state.paused_until:
                # Its token predates the pause: it queues again behind it. The
                # bucket may hold tokens before the pause's end again (a faster
                # rate, a refund since): emptied to it, the wait is one sleep,
                # not one per token of the pause.
                _hold(state.bucket, now, state.paused_until)
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
                bucket = state.bucket
                interval = bucket.interval_ns
                due = state.departed - (bucket.capacity - 1) * interval - interval // 2
                if now < due:
                    _hold(bucket, now, due)
                    return None
                state.departed = max(state.departed, now) + interval
            state.inflight += 1
            state.refill.sent(now)
            return Ticket(state, now, state.refill.admitted)

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

    def start(self, key: Hashable) -> Ticket:
        """Wait (block the thread) for *key*'s token; the ticket for `done`."""
        deadline = self._deadline()
        while True:
            state = self._state(key)
            left = self._left(deadline)
            if not state.waiting.acquire(timeout=left):
                raise self._refused(key, state, left)
            if (ticket := self._sent(state)) is not None:
                return ticket

    async def start_async(self, key: Hashable) -> Ticket:
        """`start` for asyncio."""
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
        with ticket.state.lock:
            ticket.state.inflight -= 1

    def done(self, ticket: Ticket, status: int, get: Get) -> int:
        """Learn from the answer of a request `start` let go; ns until the key's pause ends."""
        try:
            announced = parse_limits(get)
            pause = parse_retry_after(get) if status in (429, 503) else None
        except BaseException:
            self.failed(ticket)  # answered all the same: no longer in flight
            raise
        now = self.clock()
        state = ticket.state
        with state.lock:
            state.inflight -= 1
            bucket = state.bucket
            if status == 429:
                state.seen = 0  # our picture was too generous: relearn it
            ok = status not in (429, 503)
            refill = state.refill
            # Answered while it was out: maybe decided after it, so not in its fields.
            unseen = refill.admitted - ticket.before
            refill.admitted += ok
            learned = self._learn(ticket, ok, status, announced, pause, now)
            if announced is not None:
                policy = announced.policy
                adopted = policy is not None and policy != state.policy
                if policy != state.policy:
                    state.policy, state.seen = policy, 0
                if announced.remaining is not None:
                    state.seen = max(state.seen, announced.remaining + 1)
                pace: Fraction | None
                most: int | None
                if policy is not None:
                    pace, most = window_pace(policy[0], policy[1], self.capacity)
                else:
                    pace, most = learned or _spread(announced, self.capacity), announced.limit
                self._follow(state, pace, most, now)
                if adopted and most is not None:
                    # The requests let go before the window was known left at the
                    # user's limits: this one, those still out and those answered
                    # meanwhile count against the window the bucket starts now.
                    _owe(bucket, now, most - 1 - state.inflight - unseen)
                if announced.remaining is not None:
                    left = announced.remaining - state.inflight - unseen
                    _lower(bucket, now, left)
                    if learned is not None:
                        # Spend what the server says it has: paced at a lower bound
                        # alone, the key would stay below the server's rate.
                        _raise(bucket, now, left - state.waiting.waiters)
                    if (
                        not announced.remaining
                        and announced.rate is None
                        and learned is None
                        and announced.reset_ns is not None
                        and pause is None
                    ):
                        pause = announced.reset_ns
            else:
                if learned is not None:
                    self._follow(state, learned, 1, now)  # a small burst: the server's is unsaid
                if status == 429:
                    _lower(bucket, now, 0)
            if pause is not None and now + pause > state.paused_until:
                state.paused_until = now + pause
                _hold(bucket, now, state.paused_until)
            return max(0, state.paused_until - now)

    def _learn(
        self,
        ticket: Ticket,
        ok: bool,
        status: int,
        announced: Announced | None,
        pause: int | None,
        now: int,
    ) -> Fraction | None:
        """The rate learned for a key whose server announces none (None: none yet)."""
        refill = ticket.state.refill
        if announced is not None and announced.rate is not None:
            return None
        seen = ticket.before + ok
        if status == 429:
            refill.forget()  # the bound was too generous, or the server changed
        if announced is None or announced.remaining is None:
            refill.answered(ticket.sent, now)
            if status == 429 and pause is not None:
                # The lower bound would hold the key below the server for good: see _learn.
                running = rate_fraction(ticket.state.bucket.rate)
                refill.episode(ticket.sent, ticket.before, now, running, pause)
            return refill.pace(now)
        left = announced.remaining
        rate = refill.bound(ticket.sent, now, seen, left, left + 1, ticket.state.inflight)
        limit, reset = announced.limit, announced.reset_ns
        if (
            rate is not None
            and limit is not None
            and reset is not None
            and (reset - NS_PER_S) * rate > max(limit - left, 0) * NS_PER_S
        ):
            refill.forget()  # a token bucket at this rate is full sooner: a window's reset
            return None
        return rate

    def _follow(
        self, state: _Key, rate_bound: Fraction | None, limit: int | None, now: int
    ) -> None:
        """Set the bucket's rate and capacity to the server's, within the user's.

        A rate slower than the bucket can hold at that capacity (a refill
        past 146 years) is that slowest one: the key waits as long as the
        server asks, and `LimitTimeout` says so.
        """
        capacity = self.capacity
        for bound in (limit, state.seen or None):
            if bound is not None:
                capacity = max(1, min(capacity, bound))
        rate: RateLike = self.rate
        if rate_bound is not None and rate_bound < self._exact:
            rate = max(rate_bound, Fraction(NS_PER_S, TAU_MAX // capacity))
        bucket = state.bucket
        if rate != bucket.rate or capacity != bucket.capacity:
            bucket.reconfigure(rate, capacity, now=now)


class Retries:
    """When a 429 is sent again: at most *retries* times, for *methods*, within *budget* s."""

    def __init__(self, retries: int, budget: float, methods: Iterable[str] | None) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        seconds = validated_timeout(budget)
        if seconds is None:
            raise ValueError("retry_budget must be a number of seconds, not None")
        methods = IDEMPOTENT if methods is None else methods
        if isinstance(methods, str) or not all(isinstance(m, str) for m in methods):
            raise TypeError("retry_methods must be an iterable of method names")
        self.retries = retries
        self.budget = seconds
        self.methods = frozenset(m.upper() for m in methods)
        self._budget_ns = int(min(seconds, MAX_WAIT_S) * NS_PER_S)

    def deadline(self, pacer: Pacer) -> int:
        """The clock's ns by which every retry of a request must have started."""
        return pacer.clock() + self._budget_ns

    def again(
        self,
        pacer: Pacer,
        status: int,
        method: str,
        replayable: bool,
        tries: int,
        pause: int,
        end: int,
    ) -> bool:
        """Whether to send the request again, *pause* ns from now, after *tries* retries."""
        if status != 429 or tries >= self.retries or method.upper() not in self.methods:
            return False
        if not replayable:
            return False  # a streamed body cannot be sent twice
        if pacer.timeout is not None and pause > pacer.timeout * NS_PER_S:
            return False
        return pacer.clock() + pause <= end


# --------------------------------------------------------------------------
# What the adapters share


class Options(TypedDict, total=False):
    """The keywords every outbound adapter takes (`nanobucket.httpx.RateLimitedTransport`
    says what each does; the defaults are `Outbound._configure`'s). *sleep* is for
    the adapters that block a thread, *async_sleep* for the asyncio transport."""

    timeout: float | None  # 30.0
    retries: int  # 0
    retry_budget: float  # 60.0
    retry_methods: Iterable[str] | None  # IDEMPOTENT
    max_keys: int  # 1024
    max_waiters: int  # DEFAULT_MAX_WAITERS
    clock: Clock | None
    sleep: Callable[[float], object] | None
    async_sleep: Callable[[float], Any] | None


class LimitTimeout(Exception):
    """The base of the adapters' ``RateLimitTimeout``: the wait for a token would pass
    the timeout. ``key`` is the request's key; ``retry_after_ns`` says when a request
    of that key may start, as far as is known now. Other keywords (``request=``) go
    to the HTTP client's exception, the other base.

    >>> err = LimitTimeout("wait", key="api.example.com", retry_after_ns=1_500_000_000)
    >>> err.key, err.retry_after_ns
    ('api.example.com', 1500000000)
    """

    def __init__(self, message: str, *, key: Hashable, retry_after_ns: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.key = key
        self.retry_after_ns = retry_after_ns

    @property
    def retry_after(self) -> float:
        """Seconds until a request of the key may start.

        >>> LimitTimeout("wait", key="h", retry_after_ns=250_000_000).retry_after
        0.25
        """
        return self.retry_after_ns / NS_PER_S


class Answer(Protocol):
    """A response as the retry loop reads it (httpx's and requests' alike)."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def close(self) -> None: ...


class AsyncAnswer(Answer, Protocol):
    """An `Answer` that an asyncio client closes."""

    async def aclose(self) -> None: ...


_Request = TypeVar("_Request")
_Answer = TypeVar("_Answer", bound=Answer)
_AsyncAnswer = TypeVar("_AsyncAnswer", bound=AsyncAnswer)


class Outbound:
    """What the outbound adapters share: a `Pacer`, `Retries` and key function set from
    their `Options`, and the loop that paces a request and sends it again after a 429.

    A subclass names its `LimitTimeout` (``_timeout_error``) and whether it waits
    in asyncio (``_async``: it takes *async_sleep*, not *sleep*).
    """

    _timeout_error: type[LimitTimeout] = LimitTimeout
    _async = False
    pacer: Pacer
    retry: Retries
    _key: Callable[[Any], Hashable]

    def _configure(
        self,
        rate: RateLike,
        capacity: int,
        key: Callable[[Any], Hashable] | None,
        default_key: Callable[[Any], Hashable],
        options: Mapping[str, Any],
    ) -> None:
        """Check *options* (an `Options`) and set the pacer, key and retries from them.

        >>> o = Outbound()
        >>> o._configure(5, 10, None, str, {"retries": 2})
        >>> o.retry.retries, o.pacer.timeout, o.limit("api.example.com")
        (2, 30.0, KeyLimit(rate=5, capacity=10, paused_for=0.0))
        >>> o._configure(5, 10, None, str, {"async_sleep": None})
        Traceback (most recent call last):
        TypeError: unexpected keyword argument 'async_sleep'
        """
        not_taken = "sleep" if self._async else "async_sleep"
        unknown = options.keys() - (Options.__optional_keys__ - {not_taken})
        if unknown:
            raise TypeError(f"unexpected keyword argument {min(unknown)!r}")
        if key is not None and not callable(key):
            raise TypeError(f"key must be a callable taking the request, not {key!r}")
        self.pacer = Pacer(
            rate,
            capacity,
            timeout=options.get("timeout", 30.0),
            max_keys=options.get("max_keys", 1024),
            max_waiters=options.get("max_waiters", DEFAULT_MAX_WAITERS),
            clock=options.get("clock"),
            sleep=options.get("sleep"),
            async_sleep=options.get("async_sleep"),
        )
        self._key = key if key is not None else default_key
        self.retry = Retries(
            options.get("retries", 0),
            options.get("retry_budget", 60.0),
            options.get("retry_methods"),
        )

    def limit(self, key: Hashable) -> KeyLimit:
        """*key*'s rate and capacity now, and the seconds left of its pause.

        >>> from nanobucket.httpx import RateLimitedTransport
        >>> RateLimitedTransport(rate=5, capacity=10).limit("api.example.com")
        KeyLimit(rate=5, capacity=10, paused_for=0.0)
        """
        return self.pacer.limit(key)

    def _timeout(self, err: WaitTooLong, request: object) -> LimitTimeout:
        return self._timeout_error(
            str(err), key=err.key, retry_after_ns=err.retry_after_ns, request=request
        )

    def _again(
        self, ticket: Ticket, answer: Answer, method: str, replayable: bool, tries: int, end: int
    ) -> bool:
        """Learn from *answer*; whether to send its request again (see `Retries`)."""
        pacer = self.pacer
        status = answer.status_code
        pause = pacer.done(ticket, status, answer.headers.get)
        return self.retry.again(pacer, status, method, replayable, tries, pause, end)

    def _paced(
        self,
        request: _Request,
        send: Callable[[_Request], _Answer],
        method: str,
        replayable: bool,
    ) -> _Answer:
        """Wait (block the thread) for *request*'s token, then ``send(request)``; again
        after a 429 while `Retries` allow (*replayable*: its body can go twice).

        >>> class Answered(NamedTuple):
        ...     status_code: int
        ...     headers: dict
        ...     def close(self): pass
        >>> o = Outbound()   # 10/s, 1 at once, and a clock that stands still
        >>> o._configure(10, 1, None, str, {"clock": lambda: 0, "sleep": print})
        >>> [o._paced("h", lambda r: Answered(204, {}), "GET", True).status_code for _ in "ab"]
        0.1
        [204, 204]
        """
        try:
            answer: _Answer = drive(
                self._tries(request, send, method, replayable, self.pacer.start, "close")
            )
        except WaitTooLong as err:
            raise self._timeout(err, request) from None
        return answer

    async def _paced_async(
        self,
        request: _Request,
        send: Callable[[_Request], Awaitable[_AsyncAnswer]],
        method: str,
        replayable: bool,
    ) -> _AsyncAnswer:
        """`_paced` for asyncio: waits in the event loop (a cancelled waiter gives its
        place back) and awaits *send*."""
        start = self.pacer.start_async
        try:
            answer: _AsyncAnswer = await drive_async(
                self._tries(request, send, method, replayable, start, "aclose")
            )
        except WaitTooLong as err:
            raise self._timeout(err, request) from None
        return answer

    def _tries(
        self,
        request: _Request,
        send: Callable[[_Request], Any],
        method: str,
        replayable: bool,
        start: Callable[[Hashable], Any],
        close: str,
    ) -> Generator[Call, Any, Any]:
        """The loop of `_paced` and `_paced_async`, as the calls it makes (see `drive`):
        *start* waits for a ticket (or raises `WaitTooLong`), *send* sends, and the
        answer's *close* method closes an answer whose request is sent again."""
        key = self._key(request)
        pacer = self.pacer
        end = self.retry.deadline(pacer)
        tries = 0
        while True:
            ticket = yield start, (key,)
            try:
                answer = yield send, (request,)
            except BaseException:  # GeneratorExit: send raised, or its caller gave up
                pacer.failed(ticket)
                raise
            try:
                again = self._again(ticket, answer, method, replayable, tries, end)
            except BaseException:
                yield getattr(answer, close), ()  # the caller never sees it: not left open
                raise
            if not again:
                return answer
            yield getattr(answer, close), ()
            tries += 1


def _lower(bucket: TokenBucket, at: int, most: int) -> None:
    """Spend what *bucket* holds at *at* (ns) beyond *most* tokens (never below none)."""
    most = max(most, 0)
    for _ in range(8):  # a waiter may take tokens in between: look again
        excess = math.ceil(bucket.tokens_at(at) - most)
        if excess <= 0 or bucket.allow_at(at, excess):
            return


def _owe(bucket: TokenBucket, at: int, most: int) -> None:
    """Leave *bucket* at most *most* tokens at *at* (ns); below none, a debt it refills first."""
    if most >= 0:
        _lower(bucket, at, most)
    else:
        _lower(bucket, at - most * bucket.interval_ns, 0)


def _hold(bucket: TokenBucket, now: int, end: int) -> None:
    """Empty *bucket* one token's time before *end* (ns): its first token is due at *end*."""
    _lower(bucket, max(now, end - bucket.interval_ns), 0)


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
    capacity = bucket.capacity
    # A probe of cost 0: one of cost 1 would count its own token as spent.
    free = capacity - bucket.peek_at(at, 0).reset_after_ns / bucket.interval_ns
    lack = min(math.floor(least - free), least, capacity)
    if lack > 0:
        bucket.refund_at(at, lack)

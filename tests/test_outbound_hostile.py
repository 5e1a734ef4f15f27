"""Hostile answers to the outbound clients: whatever numbers the fields hold, each
request returns the server's answer or raises the client's ``RateLimitTimeout``.

The three clients (httpx over ``MockTransport``, its asyncio twin, and the
``requests`` adapter over a canned ``HTTPAdapter``) run on a clock that only
the injected sleep moves, so nothing really sleeps. The work a request does
is counted, not timed (the calls nanobucket makes: `Work`), so a loaded
machine changes nothing, and it must not grow with the numbers it reads (a
``Remaining`` of 10**15 was once 10**15 turns of a loop, holding the key's
lock). Every answer the caller does not get back is closed.

The fuzz tests throw huge, negative, fractional, non-numeric, far-dated and
malformed values, thousands of members and of repeated lines, at every
field the pacer reads, with statuses 200, 429 and 503;
``NANOBUCKET_FUZZ_EXAMPLES=N`` runs N examples each (``.ci/fuzz_long.sh``).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import email.utils
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from fractions import Fraction
from types import ModuleType
from typing import Any, TypeVar

import httpx
import pytest
import requests
import requests.adapters
from hypothesis import example, given
from hypothesis import strategies as st

import nanobucket
from nanobucket._outbound import pacer as _outbound
from nanobucket._outbound.adapter import LimitTimeout, Outbound
from nanobucket._outbound.pacer import KeyLimit
from nanobucket.httpx import AsyncRateLimitedTransport, RateLimitedTransport, RateLimitTimeout
from nanobucket.requests import RateLimitedAdapter

from conftest import SleepClock
from fuzz_values import fuzz

NS = 1_000_000_000
MS = 1_000_000
TAU_MAX = 1 << 62
KINDS = ["sync", "async", "requests"]
# Calls in nanobucket one request may make (`Work`): parsing a field of thousands of
# members takes up to about 45,000 (the pure-Python twin's bucket counted too); a loop
# that grows with the numbers read, far more. Reading an answer is linear in its
# lines: a limit field sent a thousand times costs about 48 calls a line (its values
# joined as the client joins them, then read member by member), so each line the
# answers carried adds CALLS_PER_LINE to the bound.
MOST_CALLS = 100_000
CALLS_PER_LINE = 64

Reply = tuple[int, list[tuple[str, str]]]
#: More sleeps than this in one test fail it: a wait woken once per token of a long
#: pause is work that grows with the numbers, too.
MOST_SLEEPS = 1000
T = TypeVar("T")


class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """An httpx answer's body (empty), remembering whether it was closed."""

    closed = False

    def __iter__(self) -> Iterator[bytes]:
        yield b""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b""

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


class Raw:
    """A requests answer's body stream, remembering whether it was closed."""

    closed = False

    def close(self) -> None:
        self.closed = True


class Server:
    """Answers *replies* in turn, the last one forever; keeps every answer it gave."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = replies
        self.answers: list[Any] = []
        self._lines: dict[int, int] = {}  # id of an answer (kept in answers): its lines

    def most_calls(self, answers: list[Any]) -> int:
        """The bound on the calls a request that got *answers* may make (`MOST_CALLS`)."""
        return MOST_CALLS + CALLS_PER_LINE * sum(self._lines[id(a)] for a in answers)

    def _next(self) -> Reply:
        return self.replies[min(len(self.answers), len(self.replies) - 1)]

    def httpx(self, request: httpx.Request) -> httpx.Response:
        status, fields = self._next()
        # Bytes, as off the wire: httpx reads them as latin-1 (each line kept).
        lines = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in fields]
        answer = httpx.Response(status, headers=lines, stream=Body())
        self.answers.append(answer)
        self._lines[id(answer)] = len(lines)
        return answer

    def requests(self) -> requests.Response:
        status, fields = self._next()
        answer = requests.Response()
        answer.status_code = status
        lines: dict[str, list[str]] = {}
        for name, value in fields:
            lines.setdefault(name.lower(), []).append(value)
        for name, values in lines.items():  # repeated lines joined with ", ", as urllib3 does
            answer.headers[name] = ", ".join(values)
        answer.raw = Raw()
        self.answers.append(answer)
        self._lines[id(answer)] = len(fields)
        return answer


def is_closed(answer: Any) -> bool:
    body: Any = answer.stream if isinstance(answer, httpx.Response) else answer.raw
    return bool(body.closed)


class Canned(requests.adapters.HTTPAdapter):
    """An adapter answering from its `Server`, without a network."""

    server: Server

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        return self.server.requests()


class CannedLimited(RateLimitedAdapter, Canned):
    pass


# One request's outcome: the answer returned (or the RateLimitTimeout raised),
# the calls it took (`Work`), and the answers the server gave it.
Outcome = tuple[Any, int, list[Any]]
NANOBUCKET = os.path.dirname(nanobucket.__file__) + os.sep


class Work:
    """The work a request does, counted and not timed: the calls nanobucket's own
    functions receive and make (a profiler's counts), whatever the machine's load."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile()

    def __call__(self, fn: Callable[[], T]) -> tuple[T, int]:
        """``fn()``, and the calls it made in nanobucket."""
        profile = self.profile
        profile.clear()
        profile.enable()
        try:
            result = fn()
        finally:
            profile.disable()
        calls = 0
        for entry in profile.getstats():
            code = entry.code
            if not isinstance(code, str) and code.co_filename.startswith(NANOBUCKET):
                calls += entry.callcount + sum(sub.callcount for sub in entry.calls or ())
        return result, calls


@contextlib.contextmanager
def client(
    kind: str, server: Server, clock: SleepClock, **options: Any
) -> Iterator[tuple[Outbound, Callable[[], Any]]]:
    """A *kind* client over *server* on *clock*, and a function that sends it one GET of
    ``http://h/``: the answer returned, or the ``RateLimitTimeout`` raised."""
    loop = asyncio.new_event_loop()  # the asyncio client's, for all its requests
    limited: Outbound
    if kind == "async":
        asynchronous = AsyncRateLimitedTransport(
            httpx.MockTransport(server.httpx), clock=clock, async_sleep=clock.async_sleep, **options
        )
        limited = asynchronous

        def send_one() -> Any:
            request = httpx.Request("GET", "http://h/")
            return loop.run_until_complete(asynchronous.handle_async_request(request))

    elif kind == "sync":
        transport = RateLimitedTransport(
            httpx.MockTransport(server.httpx), clock=clock, sleep=clock.sleep, **options
        )
        limited = transport

        def send_one() -> Any:
            return transport.handle_request(httpx.Request("GET", "http://h/"))

    else:
        adapter = CannedLimited(clock=clock, sleep=clock.sleep, **options)
        adapter.server = server
        limited = adapter

        def send_one() -> Any:
            return adapter.send(requests.Request("GET", "http://h/").prepare())

    def send() -> Any:
        try:
            return send_one()
        except LimitTimeout as err:
            return err

    try:
        yield limited, send
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def send_all(
    kind: str, server: Server, clock: SleepClock, count: int, **options: Any
) -> tuple[Outbound, list[Outcome]]:
    """*count* GETs of ``http://h/`` in turn through a *kind* client over *server*."""
    outcomes: list[Outcome] = []
    work = Work()
    with client(kind, server, clock, **options) as (limited, send):
        for _ in range(count):
            before = len(server.answers)
            answer, calls = work(send)
            outcomes.append((answer, calls, server.answers[before:]))
    return limited, outcomes


# A request after a quiet span: the key's `limit` just before it, the ns it waited
# (the clock moves only by its sleeps), and its status (or "timeout").
Step = tuple[KeyLimit, int, "int | str"]


def send_after(
    kind: str, server: Server, clock: SleepClock, quiet: list[int], **options: Any
) -> tuple[Outbound, list[Step]]:
    """A GET of ``http://h/`` after each quiet span of *quiet* (ns) through a *kind* client."""
    steps: list[Step] = []
    with client(kind, server, clock, **options) as (limited, send):
        for span in quiet:
            clock.now += span
            told, begun = limited.limit("h"), clock.now
            answer = send()
            code = "timeout" if isinstance(answer, Exception) else int(answer.status_code)
            steps.append((told, clock.now - begun, code))
    return limited, steps


def policy(q: int, w: int) -> Reply:
    """A 200 announcing *q* requests per *w* seconds."""
    return 200, [("RateLimit-Policy", f'"d";q={q};w={w}')]


def status(outcome: Outcome) -> int | str:
    """The status of the answer returned, or "timeout"."""
    answer = outcome[0]
    return "timeout" if isinstance(answer, Exception) else int(answer.status_code)


def within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()`` in a daemon thread; its result, or the test fails after *seconds* (real)."""
    result: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds} s")
    if errors:
        raise errors[0]
    return result[0]


# ------------------------------------------------- a huge Remaining (O(1))

EMPTY = [("X-RateLimit-Limit", "1"), ("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "1")]
PLENTY = [
    ("X-RateLimit-Limit", "1"),
    ("X-RateLimit-Remaining", "999999999999999"),
    ("X-RateLimit-Reset", "1"),
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_huge_remaining_is_learned_at_once(kind: str) -> None:
    # The first answer pauses the key for its reset (1 s); from the second
    # the refill rate is learned and the 10**15 tokens left are given, at
    # most the capacity (1, the Limit) at once.
    clock = SleepClock(MOST_SLEEPS)
    server = Server((200, EMPTY), (200, PLENTY))
    limited, outcomes = within(
        5, lambda: send_all(kind, server, clock, 3, rate=100, capacity=10, timeout=5)
    )
    assert [status(o) for o in outcomes] == [200, 200, 200]
    assert clock.slept == [1.0]
    assert limited.limit("h") == KeyLimit(rate=100, capacity=1, paused_for=0.0)
    assert all(calls <= MOST_CALLS for _, calls, _ in outcomes)


@pytest.mark.wall_clock
def test_a_huge_remaining_does_not_hold_the_other_callers() -> None:
    # One thread's answer says Remaining: 10**15 while another thread's
    # request waits for the key: that one returns within its timeout.
    clock = SleepClock(MOST_SLEEPS)
    plenty_answered = threading.Event()
    server = Server((200, EMPTY), (200, PLENTY))

    def handler(request: httpx.Request) -> httpx.Response:
        answer = server.httpx(request)
        if len(server.answers) == 2:
            plenty_answered.set()
        return answer

    t = RateLimitedTransport(
        httpx.MockTransport(handler),
        rate=100,
        capacity=10,
        timeout=5,
        clock=clock,
        sleep=clock.sleep,
    )
    http = httpx.Client(transport=t)
    assert http.get("http://h/").status_code == 200
    first = threading.Thread(target=http.get, args=("http://h/",), daemon=True)
    first.start()
    assert plenty_answered.wait(5)
    begun = time.perf_counter()
    # The key's one token: at hand if the answer was learned from, else 10 ms on.
    assert within(5, lambda: http.get("http://h/").status_code) == 200
    assert time.perf_counter() - begun < 5
    first.join(5)
    assert not first.is_alive()
    assert clock.slept in ([1.0], [1.0, 0.01])
    assert len(server.answers) == 3
    assert t.limit("h") == KeyLimit(rate=100, capacity=1, paused_for=0.0)
    assert t.pacer._keys["h"].inflight == 0


@pytest.mark.wall_clock
def test_raise_gives_back_at_most_the_capacity_in_one_step(impl: ModuleType) -> None:
    # Empty at 0: 10**15 tokens asked, the capacity (3) given.
    bucket = impl.TokenBucket(rate=100, capacity=3)
    bucket.allow_at(0, 3)
    within(1, lambda: _outbound._raise(bucket, 0, 10**15))
    assert bucket.tokens_at(0) == 3.0
    # Emptied at 5 s (a pause): owed 503 tokens at 0. One capacity goes back;
    # the rest stays owed, and the bucket is full from 5 s.
    bucket.allow_at(5 * NS, 3)
    within(1, lambda: _outbound._raise(bucket, 0, 10**15))
    assert (bucket.tokens_at(5 * NS - 10**7), bucket.tokens_at(5 * NS)) == (2.0, 3.0)
    # Nothing lacking, or nothing asked: nothing given.
    bucket.allow_at(5 * NS)
    _outbound._raise(bucket, 5 * NS, 2)
    _outbound._raise(bucket, 5 * NS, -(10**15))
    assert bucket.tokens_at(5 * NS) == 2.0


def test_a_learned_key_holds_what_the_server_has_left_not_one_more() -> None:
    # The rate is learned (4/s) from Remaining 0 then 4 a second later; the
    # third answer says 2 left while the key holds 3: it keeps 2, sends them
    # at once, then waits a token's time (0.25 s) for each. It used to keep
    # 3 (its probe of the bucket counted a token as spent): a 429 to come.
    clock = SleepClock(MOST_SLEEPS)
    fields = [("X-RateLimit-Limit", "10"), ("X-RateLimit-Reset", "1")]
    server = Server(
        (200, [*fields, ("X-RateLimit-Remaining", "0")]),
        (200, [*fields, ("X-RateLimit-Remaining", "4")]),
        (200, [*fields, ("X-RateLimit-Remaining", "2")]),
        (200, []),
    )
    limited, outcomes = send_all("sync", server, clock, 7, rate=500, capacity=50)
    assert [status(o) for o in outcomes] == [200] * 7
    assert limited.limit("h") == KeyLimit(rate=Fraction(4), capacity=5, paused_for=0.0)
    assert clock.slept == [1.0, 0.25, 0.25]  # the reset, then the 6th and 7th


@pytest.mark.parametrize("kind", KINDS)
def test_a_429_empties_a_key_that_holds_a_fraction_of_a_token(kind: str) -> None:
    # 10/s, bursts of 10, spent by ten 200s at once; 530 ms later the key holds 5.3
    # tokens when a 429 with no field and no Retry-After comes (its request took one):
    # the key is emptied, and each next request waits a token's time. It kept its 4.3
    # tokens (more whole tokens than it held could not be spent): four requests went
    # at once to the server that had just refused one.
    clock = SleepClock(MOST_SLEEPS)
    server = Server(*[(200, [])] * 10, (429, []), (200, []))
    quiet = [0] * 10 + [530 * MS] + [0] * 4
    _, steps = send_after(kind, server, clock, quiet, rate=10, capacity=10, retries=0)
    assert [(waited, code) for _, waited, code in steps[10:]] == [(0, 429)] + [(100 * MS, 200)] * 4


@pytest.mark.parametrize("kind", KINDS)
def test_a_pause_said_only_in_retry_after_ms_holds_a_key_no_budget_reached(kind: str) -> None:
    # 10/s, bursts of 10. A 429 whose only field is retry-after-ms (read by the budgets,
    # not the pacing) pauses the key 250 ms: 100 ms on, the key has a token again, and
    # the next request waits the 150 ms left, as `limit` says. A client that no answer
    # had told of a budget or a pause skips the budgets, and must stop skipping them here.
    clock = SleepClock(MOST_SLEEPS)
    server = Server((200, []), (429, [("retry-after-ms", "250")]), (200, []))
    quiet = [0, 0, 100 * MS, 0]
    _, steps = send_after(kind, server, clock, quiet, rate=10, capacity=10, retries=0)
    assert [(waited, code) for _, waited, code in steps] == [
        (0, 200),
        (0, 429),
        (150 * MS, 200),
        (0, 200),  # the bucket refilled at 10/s meanwhile
    ]
    assert steps[2][0] == KeyLimit(rate=10, capacity=10, paused_for=0.15)


def test_lowering_to_none_spends_a_fraction_of_a_token_too(impl: ModuleType) -> None:
    # 10/s, emptied at 0: 5.3 tokens at 530 ms, lowered to none: the next whole token is
    # a token's time away (it was 4 at once). Lowered to two: two whole tokens stay.
    bucket = impl.TokenBucket(rate=10, capacity=10)
    bucket.allow_at(0, 10)
    _outbound._lower(bucket, 530 * MS, 0)
    assert bucket.tokens_at(530 * MS) == 0.0
    assert bucket.peek_at(530 * MS).retry_after_ns == 100 * MS
    bucket.refund_at(530 * MS, 10)
    _outbound._lower(bucket, 530 * MS, 2)
    assert bucket.tokens_at(530 * MS) == 2.0


# ----------------------------------------------- a day at most, and a window that changes

DAY = 86_400 * NS


@pytest.mark.parametrize("kind", KINDS)
def test_a_window_slower_than_a_day_per_request_is_one_a_day(kind: str) -> None:
    # 5 per 10**15 s: the capacity becomes 1 (a twentieth of 5, at least 1) and
    # the rate one a day, where it was the slowest a bucket holds (2**62 ns, 146
    # years, a token). The first request counts against the window: the next
    # waits a day, past the timeout.
    clock = SleepClock(MOST_SLEEPS)
    server = Server(policy(5, 999999999999999))
    limited, outcomes = send_all(kind, server, clock, 7, rate=100, capacity=10, timeout=5)
    assert [status(o) for o in outcomes] == [200] + ["timeout"] * 6
    assert outcomes[-1][0].retry_after_ns == DAY
    assert limited.limit("h") == KeyLimit(rate=Fraction(1, 86400), capacity=1, paused_for=0.0)
    assert not any(is_closed(answer) for answer in server.answers)


@pytest.mark.parametrize("window", [999999999999999, 31536000])
@pytest.mark.parametrize("kind", KINDS)
def test_a_window_holds_a_key_a_day_then_one_request_learns_the_next(
    kind: str, window: int
) -> None:
    # One per 10**15 s (a token every 4.6e9 s, as it was followed), or one per
    # year (6.3e7 s): a day each at most. The request sent after it hears the
    # window again, the one after that 1000 per minute, and the next request
    # leaves at that window's spacing (33/2 per s: 60,606,061 ns).
    clock = SleepClock(MOST_SLEEPS)
    server = Server(policy(1, window), policy(1, window), policy(1000, 60), (200, []))
    limited, steps = send_after(kind, server, clock, [0] * 5, rate=100, capacity=10, timeout=None)
    assert [(waited, code) for _, waited, code in steps] == [
        (0, 200),
        (DAY, 200),
        (DAY, 200),
        (60_606_061, 200),
        (60_606_061, 200),
    ]
    assert [told for told, _, _ in steps[1:3]] == [KeyLimit(Fraction(1, 86400), 1, 0.0)] * 2
    assert limited.limit("h") == KeyLimit(rate=Fraction(33, 2), capacity=10, paused_for=0.0)


def test_a_window_adopted_with_requests_out_owes_them_within_a_day() -> None:
    # Three requests out at once (your limits: nothing is known yet), all
    # answered "1 per 10**15 s": the window counts the other two against the
    # first answer (a debt of two tokens, at a day each). They are owed by
    # one day on, as any one answer's wait: the next request waits a day, not
    # three (nor, as it was, 2**62 ns a token).
    clock = SleepClock(MOST_SLEEPS)
    server = Server(policy(1, 999999999999999))

    async def main() -> int:
        t = AsyncRateLimitedTransport(
            httpx.MockTransport(server.httpx),
            rate=100,
            capacity=10,
            timeout=None,
            clock=clock,
            async_sleep=clock.async_sleep,
        )
        async with httpx.AsyncClient(transport=t) as http:
            await asyncio.gather(*(http.get("http://h/") for _ in range(3)))
            begun = clock.now
            await http.get("http://h/")
            return clock.now - begun

    assert asyncio.run(main()) == DAY
    assert len(server.answers) == 4


@pytest.mark.parametrize("kind", KINDS)
def test_a_faster_window_is_paced_at_its_own_spacing_at_once(kind: str) -> None:
    # 10 per hour (one per 400 s, one at once), then 1000 per minute again:
    # the request after that answer waits the new window's spacing (60,606,061
    # ns), not the 400 s of the old one's.
    clock = SleepClock(MOST_SLEEPS)
    server = Server(policy(10, 3600), policy(1000, 60))
    _, steps = send_after(kind, server, clock, [0] * 4, rate=100, capacity=10, timeout=None)
    assert [waited for _, waited, _ in steps] == [0, 400 * NS, 60_606_061, 60_606_061]
    assert [told for told, _, _ in steps[2:]] == [KeyLimit(Fraction(33, 2), 10, 0.0)] * 2


@pytest.mark.parametrize("kind", KINDS)
def test_an_absurd_window_then_a_sane_one_is_the_sane_one(kind: str) -> None:
    # 100 per 10**14 s, then 1000 per 2 s (faster than your 50/s): the key runs
    # at 50/s at once. Its tokens carry over (4 of 5 after the first request
    # counted, 3 after the second): three leave at once, then one each 20 ms.
    # It used to wait out the absurd window's spacing (29 years a request):
    # every request timed out while `limit` said 50/s and no pause.
    clock = SleepClock(MOST_SLEEPS)
    server = Server(policy(100, 99999999999999), policy(1000, 2))
    _, steps = send_after(kind, server, clock, [0] * 7, rate=50, capacity=10, timeout=5)
    assert [code for _, _, code in steps] == [200] * 7
    assert [waited for _, waited, _ in steps] == [0, 0, 0, 0, 0, 20_000_000, 20_000_000]
    assert [told for told, _, _ in steps[2:]] == [KeyLimit(50, 10, 0.0)] * 5


@pytest.mark.parametrize("kind", KINDS)
def test_a_pause_heard_with_a_fraction_of_a_token_is_waited_exactly(kind: str) -> None:
    # One per 2 s: a token each 4 s, one at a time. The 429 comes when the
    # bucket is a quarter of a token on at the end of its hold (Retry-After:
    # 5 s, by the Date): the next request leaves at the pause's end, 5 s on,
    # as `limit` says, where it left a whole token later (8 s): a fraction of a
    # token could not be spent, so the bucket was not held, and its token,
    # come before the pause's end, was spent to hold it.
    clock = SleepClock(MOST_SLEEPS)
    paused = (429, [("Date", http_date(0)), ("Retry-After", http_date(5))])
    server = Server(policy(1, 2), paused, (200, []))
    _, steps = send_after(kind, server, clock, [0] * 4, rate=1, capacity=1, timeout=None)
    assert [waited for _, waited, _ in steps] == [0, 4 * NS, 5 * NS, 4 * NS]
    assert steps[2][0] == KeyLimit(Fraction(1, 4), 1, 5.0)


@pytest.mark.parametrize("kind", KINDS)
def test_an_answer_is_closed_when_learning_from_it_raises(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(get: Any, wall_clock: Any) -> None:
        raise RuntimeError("a bug in the learning")

    monkeypatch.setattr(_outbound, "parse_limits", broken)
    clock = SleepClock(MOST_SLEEPS)
    server = Server((200, []))
    with pytest.raises(RuntimeError, match="a bug in the learning"):
        send_all(kind, server, clock, 1, rate=100, capacity=10)
    assert len(server.answers) == 1 and is_closed(server.answers[0])


def test_learning_that_raises_leaves_nothing_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(get: Any, wall_clock: Any) -> None:
        raise RuntimeError("a bug in the learning")

    t = RateLimitedTransport(httpx.MockTransport(lambda r: httpx.Response(200)), rate=1, capacity=1)
    monkeypatch.setattr(_outbound, "parse_limits", broken)
    with pytest.raises(RuntimeError):
        t.handle_request(httpx.Request("GET", "http://h/"))
    assert t.pacer._keys["h"].inflight == 0


@pytest.mark.parametrize("kind", KINDS)
def test_many_429s_with_no_wait_slow_the_key_to_one_per_1000_s(kind: str) -> None:
    # Each "429, Retry-After: 0" one request after the last halves the guessed
    # rate (the span bounds nothing): 1/s, 1/2, 1/4, ... It stops at 1/1000
    # per second; it used to reach 0 and then every request raised ValueError.
    clock = SleepClock(MOST_SLEEPS)
    server = Server((429, [("Retry-After", "0")]))
    limited, outcomes = send_all(kind, server, clock, 14, rate=1, capacity=1, timeout=3600)
    assert [status(o) for o in outcomes] == [429] * 14
    assert limited.limit("h") == KeyLimit(rate=Fraction(1, 1000), capacity=1, paused_for=0.0)
    assert clock.slept[-3:] == [1000.0, 1000.0, 1000.0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_date_this_platform_cannot_read_is_ignored(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A zone of "-0000" is local time, and Windows' local time stops at the
    # year 3000: its timestamp() raises OSError. As unreadable as any date.
    class Local:
        def timestamp(self) -> float:
            raise OSError(22, "Invalid argument")

    monkeypatch.setattr(email.utils, "parsedate_to_datetime", lambda text: Local())
    clock = SleepClock(MOST_SLEEPS)
    far = "Fri, 31 Dec 9999 23:59:59 -0000"
    server = Server((429, [("Retry-After", far), ("Date", far)]), (200, [("Date", far)]))
    limited, outcomes = send_all(kind, server, clock, 2, rate=10, capacity=5)
    assert [status(o) for o in outcomes] == [429, 200]
    assert limited.limit("h") == KeyLimit(rate=10, capacity=5, paused_for=0.0)


# ---------------------------------------- a faster rate during a pause


@pytest.mark.wall_clock
def test_a_faster_rate_during_a_pause_wakes_the_next_request_once() -> None:
    # Two requests out at once: the first answers 429 "Retry-After: 3600" at
    # 1/s (paced at 1 per 2 s), then the second 200 at 10**6/s (paced at
    # 999,998/s: 1,001 ns a token). The next request waits out the hour: 1.8 ms
    # (the pause's 1800 tokens at the new rate), then the rest in one sleep.
    # It used to wake once per 1 us token until the pause's end (3.6e9
    # times: a busy thread for an hour).
    clock = SleepClock(MOST_SLEEPS)
    second_out, first_answered = asyncio.Event(), asyncio.Event()

    def policy(rate: int) -> dict[str, str]:
        return {"RateLimit-Policy": f'"d";q={rate};w=1', "RateLimit": f'"d";r={rate};t=1'}

    async def handler(request: httpx.Request) -> httpx.Response:
        if not second_out.is_set() and request.url.path == "/1":
            await second_out.wait()
            first_answered.set()
            return httpx.Response(429, headers={"Retry-After": "3600", **policy(1)})
        second_out.set()
        await first_answered.wait()
        await asyncio.sleep(0)  # the first learns from its answer meanwhile
        return httpx.Response(200, headers=policy(10**6))

    async def main() -> tuple[list[int], int]:
        t = AsyncRateLimitedTransport(
            httpx.MockTransport(handler),
            rate=10**9,
            capacity=2,
            timeout=7200,
            clock=clock,
            async_sleep=clock.async_sleep,
        )
        async with httpx.AsyncClient(transport=t) as http:
            both = await asyncio.gather(http.get("http://h/1"), http.get("http://h/2"))
            paused = clock.now
            third = await http.get("http://h/3")
        return [r.status_code for r in (*both, third)], clock.now - paused

    statuses, waited = within(5, lambda: asyncio.run(main()))
    assert statuses == [429, 200, 200]
    assert waited == 3600 * NS
    assert clock.slept == [0.0018018, 3599.9981982]


# ------------------------------------------------------------------ fuzz

HUGE = [
    "999999999999999",
    "1000000000000000",
    str(2**62),
    str(2**63 - 1),
    str(2**63),
    str(2**64),
    "9" * 400,
    "1" + "0" * 400,
    "0" * 30 + "7",
]
ODD = [
    "0",
    "1",
    "2",
    "60",
    "86400",
    "86401",
    "1000000000",
    "1000000001",
    "1445412540",
    "4102444800",
    "-1",
    "-0",
    "+5",
    "-999999999999999",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "Infinity",
    "1e3",
    "1E-3",
    "0x10",
    "1_000",
    "1,000",
    "",
    " ",
    "\t",
    "  7  ",
    "1.5",
    "0.5",
    "0.000000001",
    "0.0000000001",
    "999999999999999.999999999",
    ".5",
    "5.",
    "1.2.3",
    "\xb2",  # a latin-1 superscript two: str.isdigit() says True
    "\xb9\xb2\xb3",
]
DATES = [
    "Wed, 21 Oct 2015 07:28:00 GMT",
    "Thu, 01 Jan 1970 00:00:00 GMT",
    "Mon, 01 Jan 0001 00:00:00 GMT",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "Fri, 31 Dec 9999 23:59:59 -2359",
    "Fri, 31 Dec 9999 23:59:59 -0000",
    "Mon, 01 Jan 99999 00:00:00 GMT",
    "Mon, 32 Jan 2000 00:00:00 GMT",
    "Mon, 01 Jan 2000 25:00:00 GMT",
    "Mon, 01 Jan 2000 00:00:00 +9999",
    "Wednesday, 21-Oct-15 07:28:00 GMT",
    "Wed Oct 21 07:28:00 2015",
    "21 Oct 2015",
    "Wed, 21 Oct 2015 07:28:00",
    "GMT",
    ",,,",
]
# Numbers the fields read (at most 15 digits), and numbers past them.
valid = st.one_of(
    st.sampled_from(["0", "1", "2", "5", "86400", "1000000001", "999999999999999"]),
    st.integers(0, 10**15 - 1).map(str),
)
numbers = st.one_of(
    valid,
    st.sampled_from(HUGE + ODD),
    st.integers(-(10**20), 10**20).map(str),
    st.decimals(allow_nan=True, allow_infinity=True).map(str),
)
latin1 = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=24)
BASE = 1445412480  # the DATES' first, in Unix seconds


def http_date(offset: int) -> str:
    return email.utils.formatdate(BASE + offset, usegmt=True)


# Around BASE: past, near, far future (the year 9999 at most).
offsets = st.one_of(st.integers(-100, 100), st.integers(-(10**10), 250 * 10**9))
dates = st.one_of(st.sampled_from(DATES), offsets.map(http_date), latin1)
names = st.sampled_from(  # "d" twice: a state then often names a policy given
    ['"d"', '"d"', '"default"', "d", '"\\"q\\\\"', '"a,b;c"', '""', "1", "x y", '"open', "*", ""]
)
params = st.lists(
    st.tuples(st.sampled_from(["q", "w", "r", "t", "Q", " r ", "pk", ""]), numbers).map("=".join),
    max_size=4,
)
members = st.one_of(
    st.builds(lambda name, q, w: f"{name};q={q};w={w}", names, numbers, numbers),
    st.builds(lambda name, r, t: f"{name};r={r};t={t}", names, numbers, numbers),
    st.builds(lambda name, ps: ";".join([name, *ps]), names, params),
)


class Many(str):
    """A list field of one *member* *n* times, shown as made: a failing example stays
    readable (Hypothesis prints what it drew, and warns past 30 kB)."""

    def __new__(cls, member: str, n: int) -> Many:
        made = super().__new__(cls, ", ".join([member] * n))
        made.made = (member, n)
        return made

    made: tuple[str, int]

    def __repr__(self) -> str:
        return f"Many{self.made!r}"


structured = st.one_of(
    st.lists(members, max_size=4).map(", ".join),
    # One member thousands of times: past MAX_FIELD, or just within it.
    st.builds(Many, members, st.sampled_from([2, 200, 3000])),
)
policies = st.builds(lambda name, q, w: f"{name};q={q};w={w}", names, valid, valid)
states = st.builds(lambda name, r, t: f"{name};r={r};t={t}", names, valid, valid)
FIELDS = {
    "RateLimit": st.one_of(st.lists(states, min_size=1, max_size=3).map(", ".join), structured),
    "RateLimit-Policy": st.one_of(
        st.lists(policies, min_size=1, max_size=3).map(", ".join), structured
    ),
    "X-RateLimit-Limit": st.one_of(numbers, structured),
    "X-RateLimit-Remaining": st.one_of(numbers, structured),
    "X-RateLimit-Reset": st.one_of(numbers, structured),
    "RateLimit-Limit": numbers,
    "RateLimit-Remaining": numbers,
    "RateLimit-Reset": numbers,
    "Retry-After": st.one_of(numbers, dates),
    "Date": dates,
}
Lines = list[tuple[str, str]]


def fields(*names: str) -> st.SearchStrategy[Lines]:
    """The fields *names*, each with a value of its own."""
    return st.tuples(*(FIELDS[name] for name in names)).map(lambda v: list(zip(names, v)))


# The fields that make sense together, and any one alone.
groups = st.one_of(
    fields("RateLimit-Policy", "RateLimit"),
    fields("Retry-After", "RateLimit-Policy", "RateLimit"),
    fields("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"),
    fields("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"),
    st.tuples(offsets, offsets).map(
        lambda at: [("Date", http_date(at[0])), ("Retry-After", http_date(at[1]))]
    ),
    st.sampled_from(sorted(FIELDS)).flatmap(fields),
)


class Repeated(list[tuple[str, str]]):
    """Each group's lines *n* times, a long value (thousands of members) twice at most;
    shown as made, as `Many` is."""

    def __init__(self, found: list[tuple[Lines, int]]) -> None:
        super().__init__(
            line
            for lines, n in found
            for line in lines
            for _ in range(n if len(line[1]) < 100 else min(n, 2))
        )
        self.found = found

    def __repr__(self) -> str:
        return f"Repeated({self.found!r})"


field_lines = st.lists(st.tuples(groups, st.sampled_from([1, 1, 1, 2, 2000])), max_size=3).map(
    Repeated
)
statuses = st.sampled_from([200, 429, 503])
replies = st.lists(st.tuples(statuses, field_lines), min_size=1, max_size=6)
limits = st.sampled_from(
    [(1, 1), (100, 10), (Fraction(1, 3), 5), (10**6, 1000), (1000, 10**6), (10**9, 1)]
)


@pytest.mark.parametrize("kind", KINDS)
@fuzz(80)
@given(
    replies=replies,
    limit=limits,
    timeout=st.sampled_from([0, 5, 3600]),
    retries=st.sampled_from([0, 2]),
)
# A 429 whose X-RateLimit-* group comes a thousand times: joined, each field is
# just short of the longest read (3,000 lines, about 145,000 calls).
@example(
    replies=[
        (
            429,
            Repeated(
                [
                    (
                        [
                            ("X-RateLimit-Limit", "1"),
                            ("X-RateLimit-Remaining", "1"),
                            ("X-RateLimit-Reset", "1"),
                        ],
                        1000,
                    )
                ]
            ),
        )
    ],
    limit=(1, 1),
    timeout=5,
    retries=2,
)
def test_hostile_fields_answer_or_time_out_in_bounded_work(
    kind: str,
    replies: list[Reply],
    limit: tuple[Any, int],
    timeout: float,
    retries: int,
) -> None:
    clock = SleepClock(MOST_SLEEPS)
    server = Server(*replies)
    rate, capacity = limit
    count = len(replies) + 10  # the last answer again and again: what it teaches, repeated
    limited, outcomes = send_all(
        kind, server, clock, count, rate=rate, capacity=capacity, timeout=timeout, retries=retries
    )
    assert len(outcomes) == count
    for answer, calls, answers in outcomes:
        assert calls <= server.most_calls(answers)
        if isinstance(answer, LimitTimeout):
            # Refused before a send, or before a retry (its 429 closed).
            assert all(is_closed(a) for a in answers)
            assert answer.retry_after_ns >= 0 and answer.key == "h"
        else:
            # The server's own answer, open; any 429 sent again before it, closed.
            assert answers[-1] is answer and not is_closed(answer)
            assert all(is_closed(a) for a in answers[:-1])
            assert len(answers) <= retries + 1
    state = limited.pacer._keys["h"]
    assert state.inflight == 0
    now = limited.limit("h")
    assert 0 < Fraction(now.rate) <= Fraction(rate)
    assert 1 <= now.capacity <= capacity
    assert 0 <= now.paused_for <= 86_400


@fuzz(50)
@given(
    replies=replies,
    limit=limits,
    timeout=st.sampled_from([0, 5, 3600]),
    retries=st.sampled_from([0, 2]),
    delays=st.lists(st.integers(0, 3), min_size=1, max_size=6),
)
# A window slower than a bucket can hold, adopted while requests were out:
# the debt they leave was once set past the last time a bucket can hold.
@example(
    replies=[(200, [("RateLimit-Policy", '"d";q=0;w=0, "d";q=1;w=999999999999999')])],
    limit=(100, 10),
    timeout=0,
    retries=0,
    delays=[1],
)
def test_hostile_fields_to_requests_out_at_once(
    replies: list[Reply],
    limit: tuple[Any, int],
    timeout: float,
    retries: int,
    delays: list[int],
) -> None:
    # Three asyncio requests at a time, their answers learned in another
    # order than they were sent in (each held a few turns of the loop).
    clock = SleepClock(MOST_SLEEPS)
    server = Server(*replies)
    rate, capacity = limit

    async def handler(request: httpx.Request) -> httpx.Response:
        answer = server.httpx(request)
        for _ in range(delays[len(server.answers) % len(delays)]):
            await asyncio.sleep(0)
        return answer

    async def main() -> tuple[Outbound, list[Any]]:
        t = AsyncRateLimitedTransport(
            httpx.MockTransport(handler),
            rate=rate,
            capacity=capacity,
            timeout=timeout,
            retries=retries,
            clock=clock,
            async_sleep=clock.async_sleep,
        )

        async def one() -> Any:
            try:
                return await t.handle_async_request(httpx.Request("GET", "http://h/"))
            except RateLimitTimeout as err:
                return err

        outcomes: list[Any] = []
        for _ in range(4):
            outcomes += await asyncio.gather(one(), one(), one())
        return t, outcomes

    (limited, outcomes), calls = Work()(lambda: asyncio.run(main()))
    assert calls <= (len(outcomes) - 1) * MOST_CALLS + server.most_calls(server.answers)
    returned = [answer for answer in outcomes if isinstance(answer, httpx.Response)]
    assert all(a.key == "h" for a in outcomes if isinstance(a, LimitTimeout))
    # Each answer is returned, open, or closed: none is left behind.
    assert all(is_closed(a) != any(a is r for r in returned) for a in server.answers)
    assert limited.pacer._keys["h"].inflight == 0
    now = limited.limit("h")
    assert 0 < Fraction(now.rate) <= Fraction(rate)
    assert 1 <= now.capacity <= capacity


# ------------------------------------------ a server that changes what it says

# Windows and quotas as a server may announce them: sane, a year, 10**14 s, more.
quotas = st.one_of(st.integers(1, 1000), st.sampled_from([1, 5, 10**14, 10**15 - 1]))
windows = st.one_of(
    st.integers(1, 3600),
    st.sampled_from([86_401, 31_536_000, 99_999_999_999_999, 999_999_999_999_999]),
    st.integers(1, 10**15 - 1),
)
waits = st.sampled_from(["0", "1", "60", "86400", "86401", "999999999999999"])
said = st.one_of(
    st.just([]),  # nothing: what a quiet server says
    st.builds(lambda q, w: policy(q, w)[1], quotas, windows),
    st.builds(
        lambda q, w, r, t: [*policy(q, w)[1], ("RateLimit", f'"d";r={r};t={t}')],
        quotas,
        windows,
        st.integers(0, 1000),
        waits,
    ),
    st.builds(
        lambda limit, left, reset: [
            ("X-RateLimit-Limit", str(limit)),
            ("X-RateLimit-Remaining", str(left)),
            ("X-RateLimit-Reset", reset),
        ],
        st.integers(1, 1000),
        st.integers(0, 1000),
        waits,
    ),
    st.builds(lambda wait: [("Retry-After", wait)], waits),
    # An LLM provider's budget, OpenAI-style: one with nothing left holds the next
    # request until its reset (a Go duration, at most a day)
    st.builds(
        lambda name, limit, left, reset: [
            (f"x-ratelimit-limit-{name}", str(limit)),
            (f"x-ratelimit-remaining-{name}", str(left)),
            (f"x-ratelimit-reset-{name}", reset),
        ],
        st.sampled_from(["requests", "tokens"]),
        st.integers(1, 1000),
        st.integers(0, 1000),
        st.sampled_from(["0s", "12ms", "1s", "6m0s", "24h0m0s", "24h0m1s", "2562047h"]),
    ),
    # Anthropic-style: the reset a time, read against the answer's Date
    st.builds(
        lambda name, limit, left, at, later: [
            ("Date", http_date(at)),
            (f"anthropic-ratelimit-{name}-limit", str(limit)),
            (f"anthropic-ratelimit-{name}-remaining", str(left)),
            (
                f"anthropic-ratelimit-{name}-reset",
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(BASE + at + later)),
            ),
        ],
        st.sampled_from(["requests", "tokens", "input-tokens", "output-tokens"]),
        st.integers(1, 1000),
        st.integers(0, 1000),
        st.integers(-100, 100),
        st.sampled_from([-5, 0, 1, 30, 86_400, 86_401, 10**8]),
    ),
    st.builds(lambda ms: [("retry-after-ms", ms)], st.sampled_from(["0", "250", "86400001"])),
    groups,  # and anything the fuzz above throws
)
# An answer that leaves an LLM budget empty for 30 s
SPENT: Reply = (
    200,
    [
        ("x-ratelimit-limit-tokens", "1000"),
        ("x-ratelimit-remaining-tokens", "0"),
        ("x-ratelimit-reset-tokens", "30s"),
    ],
)
# A request after a quiet span (ns), and the answer it gets.
sequences = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 0, NS // 10, 60 * NS, DAY, 2 * DAY]),
        st.tuples(st.sampled_from([200, 200, 429, 503]), said),
    ),
    min_size=1,
    max_size=8,
)


@pytest.mark.parametrize("kind", KINDS)
def test_answers_before_a_request_left_are_not_in_the_window_its_answer_starts(
    kind: str,
) -> None:
    # Two answers with no field, a minute apart; a third request at once waits its
    # token (1 s at your 1/s) and hears a window of 1 a second (paced at 1 per 2 s).
    # The second was answered before the third left, so the window that starts at the
    # third's answer owes nothing for it: the fourth waits one token's time, as limit
    # says, not twice that (the second's 200 was counted when the third's answer
    # came, as if it had been answered while the third was out).
    clock = SleepClock(MOST_SLEEPS)
    server = Server((200, []), (200, []), policy(1, 1), (200, []))
    options = {"rate": 1, "capacity": 1, "timeout": None}
    _, steps = send_after(kind, server, clock, [0, 60 * NS, 0, 0], **options)
    assert [waited for _, waited, _ in steps] == [0, 0, NS, 2 * NS]
    assert steps[3][0] == KeyLimit(rate=Fraction(1, 2), capacity=1, paused_for=0.0)


@pytest.mark.parametrize("kind", KINDS)
@fuzz(40)
@given(sequence=sequences, limit=limits)
@example(sequence=[(0, policy(10, 3600)), (0, policy(1000, 60))], limit=(100, 10))
@example(sequence=[(0, policy(100, 99999999999999)), (0, policy(1000, 2))], limit=(50, 10))
@example(sequence=[(0, policy(1, 999999999999999))] * 3, limit=(100, 10))
# A budget spent: its reset holds the next request, and limit says so
@example(sequence=[(0, SPENT), (0, (200, []))], limit=(100, 10))
# A day's pause held in a bucket of 106,740 tokens at 43,205 s each: full, it
# lies past the clock's range, and the pause was once held a token short.
@example(
    sequence=[(0, (429, [("Retry-After", "86400"), *policy(2134800, 999999999999999)[1]]))],
    limit=(1000, 10**6),
)
def test_a_changing_server_holds_no_key_past_a_day_and_limit_says_the_wait(
    kind: str, sequence: list[tuple[int, Reply]], limit: tuple[Any, int]
) -> None:
    # Each answer says something else (absurd windows then sane ones, pauses,
    # nothing), after quiet spans; then the server says nothing, and after a
    # day's quiet the key sends at once. Each request waits what `limit` said
    # just before it: its pause, or a token's time at its rate if longer,
    # within a microsecond (a float's seconds); never past a day.
    clock = SleepClock(MOST_SLEEPS)
    server = Server(*(reply for _, reply in sequence), (200, []))
    rate, capacity = limit
    quiet = [span for span, _ in sequence] + [DAY]
    options = {"rate": rate, "capacity": capacity, "timeout": None}
    limited, steps = send_after(kind, server, clock, quiet, **options)
    for told, waited, code in steps:
        assert code != "timeout"
        paused = round(told.paused_for * NS)
        spacing = math.ceil(NS / Fraction(told.rate))
        assert paused - 1000 <= waited <= max(paused, spacing) + 1000, (told, waited)
        assert waited <= DAY
    assert steps[-1][1] == 0
    assert limited.pacer._keys["h"].inflight == 0

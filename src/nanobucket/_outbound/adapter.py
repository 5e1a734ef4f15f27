"""What the outbound adapters share: their keywords, their timeout error, and the loop
that paces a request through a `nanobucket._outbound.pacer.Pacer` and sends it again after
a 429 (`Retries`).

``Outbound`` is the base of the `nanobucket.httpx` transports and the
`nanobucket.requests` adapter. A request whose key has a token at hand goes
straight through (`Outbound._paced`, no generator); the others wait in
line, written once for threads and asyncio (`nanobucket._compose.drive`). Nothing
here imports an HTTP client: an adapter names its request's retry facts
(``_retry_info``) and how it finds the limit fields of an answer
(``_fields``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Generator, Hashable, Iterable, Mapping
from typing import Any, Protocol, TypedDict, TypeVar

from .._compose.drive import Call, drive, drive_async
from .._compose.waiting import DEFAULT_MAX_WAITERS
from .._core._params import NS_PER_S, Clock, RateArg, validated_timeout
from .budgets import Ledger, validated_costs
from .fields import MAX_WAIT_S, fields_of
from .pacer import KeyLimit, Pacer, Ticket, WaitTooLong
from .shared import SharedPace, validated_shared
from .shared_budgets import SharedBudgets

__all__ = (
    "IDEMPOTENT",
    "LimitTimeout",
    "Options",
    "Outbound",
    "Retries",
)

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


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

    def deadline(self, pacer: Pacer, start: int | None = None) -> int:
        """The clock's ns by which every retry of a request that started at *start*
        (default: now) must have started."""
        return (pacer.clock() if start is None else start) + self._budget_ns

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
    shared: Any  # None: this process alone (a keyed limiter: `nanobucket._outbound.shared`)
    clock: Clock | None
    wall_clock: Callable[[], int] | None  # time.time_ns
    sleep: Callable[[float], object] | None
    async_sleep: Callable[[float], Any] | None
    estimate: Callable[[Any], Mapping[str, int]] | None  # a request's cost per budget
    settle: Callable[[Any], Any] | None  # a response's spending per budget (maybe awaited)


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

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments, which Exception's own pickling cannot pass;
        # the HTTP client's ``request=`` stays behind (its request is not
        # picklable in general).
        rebuild = functools.partial(type(self), key=self.key, retry_after_ns=self.retry_after_ns)
        return rebuild, (str(self),)

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
    _retrying: bool  # retry.retries > 0
    _key: Callable[[Any], Hashable]
    _shared: SharedPace | None  # the pacing the processes share, if any
    _ledger: Ledger  # the budgets announced per key (`nanobucket._outbound.budgets`)
    _shared_budgets: SharedBudgets | None  # and those the processes share, if any

    def _configure(
        self,
        rate: RateArg,
        capacity: int | None,
        key: Callable[[Any], Hashable] | None,
        default_key: Callable[[Any], Hashable],
        options: Mapping[str, Any],
    ) -> None:
        """Check *options* (an `Options`) and set the pacer, key and retries from them.

        >>> o = Outbound()
        >>> o._configure(5, 10, None, str, {"retries": 2})
        >>> o.retry.retries, o.pacer.timeout, o.limit("api.example.com")
        (2, 30.0, KeyLimit(rate=5, capacity=10, paused_for=0.0, known=False))
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
            wall_clock=options.get("wall_clock"),
            sleep=options.get("sleep"),
            async_sleep=options.get("async_sleep"),
        )
        self._key = key if key is not None else default_key
        shared = options.get("shared")
        self._shared = (
            None
            if shared is None
            else SharedPace(validated_shared(shared, self._async), self.pacer)
        )
        self.retry = retry = Retries(
            options.get("retries", 0),
            options.get("retry_budget", 60.0),
            options.get("retry_methods"),
        )
        self._retrying = retry.retries > 0
        self._ledger = Ledger(
            clock=self.pacer.clock,
            estimate=options.get("estimate"),
            settle=options.get("settle"),
            max_keys=self.pacer.max_keys,
            wall_clock=self.pacer.wall_clock,
        )
        self._shared_budgets = (
            None if self._shared is None else SharedBudgets(shared, self.pacer.clock)
        )

    def _budgeted(self, send: Callable[[_Request], _Answer]) -> Callable[[_Request], _Answer]:
        """*send*, each request first charged to its key's budgets (waiting, the thread
        blocked, until every one has room, and with ``shared=`` until its slot in every
        one the processes share) and its answer learned and settled after."""
        ledger, key_of, pacer = self._ledger, self._key, self.pacer
        shared = self._shared_budgets
        sleep = pacer.sleep or time.sleep

        def budgeted(request: _Request) -> _Answer:
            key, taken = key_of(request), None
            deadline = pacer._deadline()
            try:
                charge = ledger.wait(key, ledger.costs(request), deadline, sleep)
                if shared is not None:
                    try:
                        taken = shared.wait(key, charge, deadline, sleep)
                    except BaseException:
                        ledger.failed(charge)
                        raise
            except WaitTooLong as err:
                raise self._timeout(err, request) from None
            try:
                answer = send(request)
            except BaseException:
                ledger.failed(charge)
                raise
            try:
                settle = ledger.settle
                spent = None if settle is None else validated_costs(settle(answer), "settle")
                ledger.answered(charge, answer.status_code, answer.headers.get, spent)
                if taken and spent:
                    shared.settle(charge, taken, spent)  # type: ignore[union-attr]
            except BaseException:
                answer.close()
                raise
            return answer

        return budgeted

    def _budgeted_async(
        self, send: Callable[[_Request], Awaitable[_AsyncAnswer]]
    ) -> Callable[[_Request], Awaitable[_AsyncAnswer]]:
        """`_budgeted` for asyncio: waits in the event loop; *settle* may be awaitable."""
        ledger, key_of, pacer = self._ledger, self._key, self.pacer
        shared = self._shared_budgets
        sleep = pacer.async_sleep or asyncio.sleep

        async def budgeted(request: _Request) -> _AsyncAnswer:
            key, taken = key_of(request), None
            deadline = pacer._deadline()
            costs = ledger.costs(request)
            try:
                charge = await ledger.wait_async(key, costs, deadline, sleep)
                if shared is not None:
                    try:
                        taken = await shared.wait_async(key, charge, deadline, sleep)
                    except BaseException:
                        ledger.failed(charge)
                        raise
            except WaitTooLong as err:
                raise self._timeout(err, request) from None
            try:
                answer = await send(request)
            except BaseException:
                ledger.failed(charge)
                raise
            try:
                spent = None
                if ledger.settle is not None:
                    said = ledger.settle(answer)
                    if inspect.isawaitable(said):
                        said = await said
                    spent = validated_costs(said, "settle")
                ledger.answered(charge, answer.status_code, answer.headers.get, spent)
                if taken and spent:
                    await shared.settle_async(charge, taken, spent)  # type: ignore[union-attr]
            except BaseException:
                await answer.aclose()
                raise
            return answer

        return budgeted

    def limit(self, key: Hashable) -> KeyLimit:
        """*key*'s rate and capacity now, the seconds left of its pause, and whether it is known.

        A key no request went to yet (or forgotten past ``max_keys``) is
        ``known=False``: the rate and capacity are your own, what its first
        request gets, nothing learned from the server.

        >>> import httpx
        >>> from nanobucket.httpx import RateLimitedTransport
        >>> api = httpx.MockTransport(lambda request: httpx.Response(200))
        >>> t = RateLimitedTransport(api, rate=5, capacity=10)
        >>> t.limit("api.example.com")
        KeyLimit(rate=5, capacity=10, paused_for=0.0, known=False)
        >>> _ = httpx.Client(transport=t).get("https://api.example.com/")
        >>> t.limit("api.example.com")   # known, and no limit announced: still your own
        KeyLimit(rate=5, capacity=10, paused_for=0.0, known=True)
        """
        return self.pacer.limit(key)

    def _timeout(self, err: WaitTooLong, request: object) -> LimitTimeout:
        return self._timeout_error(
            str(err), key=err.key, retry_after_ns=err.retry_after_ns, request=request
        )

    @staticmethod
    def _fields(headers: Mapping[str, str]) -> dict[str, str] | None:
        """The limit fields of an answer's *headers* by lower-case name, or None when it has
        no `TRIGGERS` field (most answers). An adapter puts here a function that looks in
        its HTTP client's own header list, in one pass."""
        return fields_of(headers)

    @staticmethod
    def _retry_info(request: Any) -> tuple[str, bool]:
        """*request*'s method, and whether its body can be sent twice (for `Retries`),
        read before it is sent (a body read by the transport may change its type) and
        only when retries are on. An adapter reads them from its request type."""
        return "GET", True

    def _again(
        self,
        ticket: Ticket,
        status: int,
        fields: dict[str, str] | None,
        info: tuple[str, bool],
        tries: int,
        end: int,
    ) -> bool:
        """Learn from an answer (its *status*, its *fields*) to a request that *ticket* let
        go, *info* its `_retry_info`; whether to send it again (see `Retries`)."""
        pacer = self.pacer
        if fields is None and status not in {429, 503} and pacer.plain(ticket):
            return False
        pause = pacer.done(ticket, status, (fields or _NONE).get)
        if status != 429:
            return False
        return self.retry.again(pacer, status, info[0], info[1], tries, pause, end)

    def _first(self, ticket: Ticket, answer: Any, info: tuple[str, bool]) -> int | None:
        """Learn from *answer*, the first to a request that `Pacer.take` let go with
        *ticket*: None when it is the caller's, else the end (ns) of the retry budget
        for sending it again (the caller closes it). Written for most requests: a bare
        key's answer with no limit field is one atomic count."""
        pacer = self.pacer
        try:
            fields = self._fields(answer.headers)
        except BaseException:
            pacer.failed(ticket)
            raise
        status = answer.status_code
        if status != 429:
            if fields is None and status != 503:
                if ticket[1] < 0:  # bare (`Pacer.take`): the path of most requests
                    next(ticket[0].bare_oks)
                    return None
                if pacer.plain(ticket):
                    return None
            pacer.done(ticket, status, (fields or _NONE).get)
            return None  # only a 429 is sent again
        sent = ticket[1]  # a bare ticket's is unknown (-1): the budget counts from now
        end = self.retry.deadline(pacer, sent if sent >= 0 else None)
        return end if self._again(ticket, status, fields, info, 0, end) else None

    def _paced(self, request: _Request, send: Callable[[_Request], _Answer]) -> _Answer:
        """Wait (block the thread) for *request*'s token, then ``send(request)``; again
        after a 429 while `Retries` allow.

        A request whose key has a token at hand goes straight through, as the
        first try (no generator): the path of most requests.

        >>> from typing import NamedTuple
        >>> class Answered(NamedTuple):
        ...     status_code: int
        ...     headers: dict
        ...     def close(self): pass
        >>> o = Outbound()   # 10/s, 1 at once, and a clock that stands still
        >>> o._configure(10, 1, None, str, {"clock": lambda: 0, "sleep": print})
        >>> [o._paced("h", lambda r: Answered(204, {})).status_code for _ in "ab"]
        0.1
        [204, 204]
        """
        pacer = self.pacer
        key = self._key(request)
        info = self._retry_info(request) if self._retrying else _ONCE
        ticket = pacer.take(key) if self._shared is None else None
        if ticket is None:
            end, tries = self.retry.deadline(pacer), 0
        else:
            try:
                answer = send(request)
            except BaseException:
                pacer.failed(ticket)
                raise
            try:
                again = self._first(ticket, answer, info)
            except BaseException:
                answer.close()  # the caller never sees it: not left open
                raise
            if again is None:
                return answer
            answer.close()
            end, tries = again, 1
        steps = self._tries(request, send, pacer.start, "close", key, info)
        try:
            done: _Answer = drive(steps(tries, end))
        except WaitTooLong as err:
            raise self._timeout(err, request) from None
        return done

    async def _paced_async(
        self, request: _Request, send: Callable[[_Request], Awaitable[_AsyncAnswer]]
    ) -> _AsyncAnswer:
        """`_paced` for asyncio: waits in the event loop (a cancelled waiter gives its
        place back) and awaits *send*."""
        pacer = self.pacer
        key = self._key(request)
        info = self._retry_info(request) if self._retrying else _ONCE
        ticket = pacer.take(key) if self._shared is None else None
        if ticket is None:
            end, tries = self.retry.deadline(pacer), 0
        else:
            try:
                answer = await send(request)
            except BaseException:
                pacer.failed(ticket)
                raise
            try:
                again = self._first(ticket, answer, info)
            except BaseException:
                await answer.aclose()
                raise
            if again is None:
                return answer
            await answer.aclose()
            end, tries = again, 1
        steps = self._tries(request, send, pacer.start_async, "aclose", key, info)
        try:
            done: _AsyncAnswer = await drive_async(steps(tries, end))
        except WaitTooLong as err:
            raise self._timeout(err, request) from None
        return done

    def _tries(
        self,
        request: _Request,
        send: Callable[[_Request], Any],
        start: Callable[[Hashable], Any],
        close: str,
        key: Hashable,
        info: tuple[str, bool],
    ) -> Callable[[int, int], Generator[Call, Any, Any]]:
        """The loop of `_paced` and `_paced_async` after their first try, as the calls it
        makes (see `drive`): *start* waits for *key*'s ticket (or raises `WaitTooLong`),
        *send* sends, and the answer's *close* method closes an answer whose request is
        sent again. Its steps start after *tries* tries, with the retry budget ending at
        *end* (ns)."""
        pacer = self.pacer
        shared = self._shared
        if shared is not None:
            wait, hold = shared.steps(self._async)

        def steps(tries: int, end: int) -> Generator[Call, Any, Any]:
            while True:
                if shared is None:
                    ticket = yield start, (key,)
                else:
                    # This process's token, then the processes' one, within one timeout:
                    # the request leaves when its shared slot starts, so no two
                    # processes' requests leave closer than the shared rate.
                    deadline = pacer._deadline()
                    ticket = yield start, (key, deadline)
                    try:
                        yield wait, (ticket[0], key, deadline)
                    except BaseException:  # not sent: its own token goes back
                        pacer.unsent(ticket)
                        raise
                try:
                    answer = yield send, (request,)
                except BaseException:  # GeneratorExit: send raised, or its caller gave up
                    pacer.failed(ticket)
                    raise
                try:
                    try:
                        fields = self._fields(answer.headers)
                    except BaseException:
                        pacer.failed(ticket)
                        raise
                    status = answer.status_code
                    again = self._again(ticket, status, fields, info, tries, end)
                except BaseException:
                    yield getattr(answer, close), ()  # the caller never sees it: not left open
                    raise
                if shared is not None and (fields is not None or status in {429, 503}):
                    # A pause it heard holds every process. Outside the block above: a
                    # hold raises only when its caller gives up (a cancelled task), and a
                    # generator being closed can make no call (close the answer) then.
                    yield hold, (ticket[0], key)
                if not again:
                    return answer
                yield getattr(answer, close), ()
                tries += 1

        return steps


_NONE: dict[str, str] = {}  # the fields of an answer that has none
_ONCE = ("", False)  # the `Outbound._retry_info` of any request when retries are off

"""What the outbound adapters share: their keywords, their timeout error, and the flow
that charges a request to its key's budgets, paces it through a
`nanobucket._outbound.pacer.Pacer`, sends it, learns from its answer and sends it
again after a 429 (`Retries`).

``Outbound`` is the base of the `nanobucket.httpx` transports, the
`nanobucket.requests` adapter and the `nanobucket.aiohttp` client middleware. The
flow is written once for threads and asyncio, as steps that
`nanobucket._compose.drive` makes or awaits: ``Outbound._tries`` (the key's ticket,
send, learn, again after a 429) sends through ``Outbound._charging`` (the budgets,
send, settle). A request whose key has a token and room at hand, with nothing to
settle or share, goes straight through (`Outbound._paced`, `Outbound._charged`: no
generator); one whose key has no budget, with no estimate, skips the budgets too
(`Ledger.idle`), and `Outbound._first` reads its answer for both. Nothing here
imports an HTTP client: an adapter names its default key function, its request's
retry facts (``_retry_info``) and how it finds the limit fields of an answer
(``_fields``, and ``_read`` for one look that serves the budgets too), each through
its client's public API.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Generator, Hashable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol, TypedDict, TypeVar

from .._compose.drive import Call, drive, drive_async
from .._compose.waiting import DEFAULT_MAX_WAITERS
from .._core._params import NS_PER_S, Clock, RateArg, validated_timeout
from .budget_fields import Budget
from .budgets import Charge, Ledger, validated_costs
from .fields import MAX_WAIT_S, Get, fields_of
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


class _Calls(NamedTuple):
    """The calls of a request's steps that a thread makes and asyncio awaits (see `drive`)."""

    start: Callable[..., Any]  # `Pacer.start`: the key's ticket
    charged: Callable[..., Any]  # `Outbound._charged`: sent through the key's budgets
    wait_shared: Callable[..., Any]  # `SharedPace.wait`: its slot in the processes' bucket
    hold: Callable[..., Any]  # `SharedPace.hold`: a pause heard, held for them all
    wait_budgets: Callable[..., Any]  # `Ledger.wait`: room in every budget
    wait_shared_budgets: Callable[..., Any]  # `SharedBudgets.wait`
    settle_shared_budgets: Callable[..., Any]  # `SharedBudgets.settle`
    sleep: Callable[[float], Any]
    attempt: Callable[..., Any]  # `_attempt`: a call whose error is handed back
    close: str  # the name of an answer's method that closes it


def _unshared(*args: Any) -> None:
    """The shared steps of an adapter with no ``shared=``: never called."""
    raise RuntimeError("no limiter is shared")


def _attempt(fn: Callable[..., Any], *args: Any) -> tuple[Any, BaseException | None]:
    """``fn(*args)``, and what it raised: ``(result, None)`` or ``(None, error)``."""
    try:
        return fn(*args), None
    except BaseException as err:
        return None, err


async def _attempt_async(fn: Callable[..., Any], *args: Any) -> tuple[Any, BaseException | None]:
    """`_attempt`, awaiting what *fn* returns when it is awaitable."""
    try:
        said = fn(*args)
        if inspect.isawaitable(said):
            said = await said
        return said, None
    except BaseException as err:
        return None, err


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
    _calls: tuple[_Calls, _Calls]  # a request's calls in a thread, and in asyncio
    _direct: bool  # no settle, no budget shared: a request charged at once goes straight
    _budgetless: bool  # and no estimate: a key with no budget charges nothing

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
        self._direct = self._ledger.settle is None and self._shared_budgets is None
        self._budgetless = self._direct and self._ledger.estimate is None
        self._calls = (self._calls_of(False), self._calls_of(True))

    def _calls_of(self, in_asyncio: bool) -> _Calls:
        """The calls a request's steps make in a thread, or awaited *in_asyncio*."""
        pacer, ledger = self.pacer, self._ledger
        pace, budgets = self._shared, self._shared_budgets
        wait_shared, hold = (_unshared, _unshared) if pace is None else pace.steps(in_asyncio)
        if in_asyncio:
            return _Calls(
                pacer.start_async,
                self._charged_async,
                wait_shared,
                hold,
                ledger.wait_async,
                _unshared if budgets is None else budgets.wait_async,
                _unshared if budgets is None else budgets.settle_async,
                pacer.async_sleep or asyncio.sleep,
                _attempt_async,
                "aclose",
            )
        return _Calls(
            pacer.start,
            self._charged,
            wait_shared,
            hold,
            ledger.wait,
            _unshared if budgets is None else budgets.wait,
            _unshared if budgets is None else budgets.settle,
            pacer.sleep or time.sleep,
            _attempt,
            "close",
        )

    def _charged(
        self, request: _Request, send: Callable[[_Request], _Answer], key: Hashable
    ) -> tuple[_Answer, dict[str, str] | None]:
        """``send(request)``, the request first charged to *key*'s budgets (waiting, the
        thread blocked, until every one has room, and with ``shared=`` until its slot in
        every one the processes share) and its answer learned and settled after: the
        answer and its limit fields (`_fields`), one look for the budgets and the pacing.

        A request charged at once, with nothing to settle and nothing shared, goes
        straight through (no generator): the path of most requests; the others take
        the steps of `_charging`, written once for threads and asyncio."""
        ledger = self._ledger
        costs = {} if ledger.estimate is None else ledger.costs(request)
        charge = ledger.claim(key, costs)[1]
        if charge is None or not self._direct:
            steps = self._charging(request, send, self._calls[0], key, costs, charge)
            done: tuple[_Answer, dict[str, str] | None] = self._driven(steps, request)
            return done
        try:
            answer = send(request)
        except BaseException:
            ledger.failed(charge)
            raise
        fields, error = self._learned(charge, answer)
        if error is not None:
            answer.close()  # the caller never sees it: not left open
            raise error
        return answer, fields

    async def _charged_async(
        self, request: _Request, send: Callable[[_Request], Awaitable[_AsyncAnswer]], key: Hashable
    ) -> tuple[_AsyncAnswer, dict[str, str] | None]:
        """`_charged` for asyncio: waits in the event loop; *settle* may be awaitable."""
        ledger = self._ledger
        costs = {} if ledger.estimate is None else ledger.costs(request)
        charge = ledger.claim(key, costs)[1]
        if charge is None or not self._direct:
            steps = self._charging(request, send, self._calls[1], key, costs, charge)
            done: tuple[_AsyncAnswer, dict[str, str] | None]
            done = await self._driven_async(steps, request)
            return done
        try:
            answer = await send(request)
        except BaseException:
            ledger.failed(charge)
            raise
        fields, error = self._learned(charge, answer)
        if error is not None:
            await answer.aclose()  # the caller never sees it: not left open
            raise error
        return answer, fields

    def _learned(
        self, charge: Charge, answer: Answer
    ) -> tuple[dict[str, str] | None, BaseException | None]:
        """Learn from *answer* what it says of its key's budgets (nothing to settle): its
        `_fields` and None, or None and what raised, for the caller to raise once the
        answer is closed. An answer with no field of a limit says nothing to a request
        charged nothing."""
        try:
            status = answer.status_code
            headers = answer.headers
            budget_get, budgets, fields = self._read(headers)
            if charge.costs or status in {429, 503} or budget_get is not None:
                self._ledger.answered(charge, status, budget_get or headers.get, None, budgets)
        except BaseException as err:
            return None, err
        return fields, None

    def _charging(
        self,
        request: _Request,
        send: Callable[[_Request], Any],
        calls: _Calls,
        key: Hashable,
        costs: Mapping[str, int],
        charge: Charge | None,
    ) -> Generator[Call, Any, Any]:
        """A request's steps through its key's budgets (see `drive`): charged (wait for
        room, unless *charge* is already taken), its slots in the budgets the
        processes share taken, sent, settled; it returns the answer and its `_fields`.
        *calls* are a thread's or asyncio's."""
        ledger, shared = self._ledger, self._shared_budgets
        taken = None
        if charge is None or shared is not None:
            deadline = self.pacer._deadline()
            if charge is None:
                charge = yield calls.wait_budgets, (key, costs, deadline, calls.sleep)
            if shared is not None:
                try:
                    taken = yield calls.wait_shared_budgets, (key, charge, deadline, calls.sleep)
                except BaseException:  # GeneratorExit: the wait raised, or its caller gave up
                    ledger.failed(charge)
                    raise
        try:
            answer = yield send, (request,)
        except BaseException:
            ledger.failed(charge)
            raise
        try:
            spent = None
            if ledger.settle is not None:
                # A call that raises closes the generator where it yielded, and a
                # generator being closed can make no call (close the answer): each of
                # these is made by `attempt`, which hands back what it raised.
                said, error = yield calls.attempt, (ledger.settle, answer)
                if error is not None:
                    raise error
                spent = validated_costs(said, "settle")
            headers = answer.headers
            budget_get, budgets, fields = self._read(headers)
            ledger.answered(charge, answer.status_code, budget_get or headers.get, spent, budgets)
            if taken and spent:
                _, error = yield calls.attempt, (calls.settle_shared_budgets, charge, taken, spent)
                if error is not None:
                    raise error
        except BaseException:
            yield getattr(answer, calls.close), ()  # the caller never sees it: not left open
            raise
        return answer, fields

    def _driven(self, steps: Generator[Call, Any, Any], request: object) -> Any:
        """`drive` *steps*; a wait past the timeout raises the adapter's `LimitTimeout`."""
        try:
            return drive(steps)
        except WaitTooLong as err:
            raise self._timeout(err, request) from None

    async def _driven_async(self, steps: Generator[Call, Any, Any], request: object) -> Any:
        """`_driven` in asyncio."""
        try:
            return await drive_async(steps)
        except WaitTooLong as err:
            raise self._timeout(err, request) from None

    def limit(self, key: Hashable) -> KeyLimit:
        """*key*'s rate and capacity now, the seconds its next request waits before its
        rate applies, and whether it is known.

        That wait (``paused_for``) is the longest of: a pause the server
        asked for (``Retry-After``, ``retry-after-ms``, a window with nothing
        left until its reset), and the reset of an announced budget with no
        room for one more unit (an LLM provider's requests or tokens; a
        request whose *estimate* costs more may wait longer). A key no
        request went to yet (or forgotten past ``max_keys``) is
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
        limit = self.pacer.limit(key)
        budgets = self._ledger.waiting(key) / NS_PER_S
        return limit._replace(paused_for=budgets) if budgets > limit.paused_for else limit

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

    def _read(
        self, headers: Mapping[str, str]
    ) -> tuple[Get | None, dict[str, Budget] | None, dict[str, str] | None]:
        """How the budgets read an answer's *headers* (a `Get` of every field of
        `nanobucket._outbound.budget_fields.BUDGET_FIELDS`), or None when no name may
        announce a budget (none holds one of
        `nanobucket._outbound.budgets.ANNOUNCING_MARKS`: the budgets learn nothing from
        it unless it is a 429 or a 503); the budgets they announce, read as
        `nanobucket._outbound.budget_fields.parse_budgets` reads them, or None to
        leave that to the budgets; and its `_fields`. An adapter puts here one look at
        its HTTP client's names for all three."""
        return headers.get, None, self._fields(headers)

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

    def _first(
        self,
        ticket: Ticket,
        answer: Any,
        info: tuple[str, bool],
        fields: Any,  # dict[str, str] | None, or _UNHEARD
        key: Hashable,
    ) -> int | BaseException | None:
        """Learn from *answer*, the first to a request of *key* that `Pacer.take` let go
        with *ticket*, and its *fields* (`_UNHEARD`: the budgets have not seen it, for
        it was charged nothing: read here for both): None when it is the caller's; else
        the caller closes it, and then sends it again within the retry budget that ends
        at the int returned (ns), or raises what is returned (reading it raised).
        Written for most requests: a bare key's answer with no limit field is one
        atomic count."""
        pacer = self.pacer
        try:
            status = answer.status_code
            if fields is _UNHEARD:
                try:
                    headers = answer.headers
                    budget_get, budgets, fields = self._read(headers)
                    if budget_get is not None or status in {429, 503}:
                        self._ledger.heard(key, status, budget_get or headers.get, budgets)
                except BaseException:
                    pacer.failed(ticket)
                    raise
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
        except BaseException as err:
            return err

    def _paced(self, request: _Request, send: Callable[[_Request], _Answer]) -> _Answer:
        """Wait (block the thread) for *request*'s token, then ``send(request)``; again
        after a 429 while `Retries` allow.

        A request whose key has a token at hand goes straight through, as the
        first try (no generator): the path of most requests. The rest is the
        steps of `_tries`, written once for threads and asyncio.

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
        end = None
        if ticket is not None:
            try:
                if self._budgetless and (self._ledger.unannounced or self._ledger.idle(key)):
                    answer, fields = send(request), _UNHEARD
                else:
                    answer, fields = self._charged(request, send, key)
            except BaseException:
                pacer.failed(ticket)
                raise
            again = self._first(ticket, answer, info, fields, key)
            if again is None:
                return answer
            answer.close()  # sent again, or reading it raised: the caller never sees it
            if not isinstance(again, int):
                raise again
            end = again
        steps = self._tries(request, send, self._calls[0], key, info, end)
        done: _Answer = self._driven(steps, request)
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
        end = None
        if ticket is not None:
            try:
                if self._budgetless and (self._ledger.unannounced or self._ledger.idle(key)):
                    answer, fields = await send(request), _UNHEARD
                else:
                    answer, fields = await self._charged_async(request, send, key)
            except BaseException:
                pacer.failed(ticket)
                raise
            again = self._first(ticket, answer, info, fields, key)
            if again is None:
                return answer
            await answer.aclose()  # sent again, or reading it raised: the caller never sees it
            if not isinstance(again, int):
                raise again
            end = again
        steps = self._tries(request, send, self._calls[1], key, info, end)
        done: _AsyncAnswer = await self._driven_async(steps, request)
        return done

    def _tries(
        self,
        request: _Request,
        send: Callable[[_Request], Any],
        calls: _Calls,
        key: Hashable,
        info: tuple[str, bool],
        end: int | None,
    ) -> Generator[Call, Any, Any]:
        """A request's tries (see `drive`): each waits for *key*'s ticket (and with
        ``shared=`` its slot in the processes' bucket), sends, learns from the answer,
        and closes an answer whose request is sent again, while `Retries` allow.
        *calls* are a thread's or asyncio's; *info* is the request's `_retry_info`.
        With *end* (ns: the retry budget's), its first try is over and its 429 closed."""
        pacer = self.pacer
        shared = self._shared
        tries = 0 if end is None else 1
        if end is None:
            end = self.retry.deadline(pacer)
        while True:
            if shared is None:
                ticket = yield calls.start, (key,)
            else:
                # This process's token, then the processes' one, within one timeout:
                # the request leaves when its shared slot starts, so no two
                # processes' requests leave closer than the shared rate.
                deadline = pacer._deadline()
                ticket = yield calls.start, (key, deadline)
                try:
                    yield calls.wait_shared, (ticket[0], key, deadline)
                except BaseException:  # not sent: its own token goes back
                    pacer.unsent(ticket)
                    raise
            try:
                # Through the budgets, which read the answer's fields for both.
                answer, fields = yield calls.charged, (request, send, key)
            except BaseException:  # GeneratorExit: send raised, or its caller gave up
                pacer.failed(ticket)
                raise
            try:
                status = answer.status_code
                again = self._again(ticket, status, fields, info, tries, end)
            except BaseException:
                yield getattr(answer, calls.close), ()  # the caller never sees it: not left open
                raise
            if shared is not None and (fields is not None or status in {429, 503}):
                # A pause it heard holds every process. Outside the block above: a
                # hold raises only when its caller gives up (a cancelled task), and a
                # generator being closed can make no call (close the answer) then.
                yield calls.hold, (ticket[0], key)
            if not again:
                return answer
            yield getattr(answer, calls.close), ()
            tries += 1


_NONE: dict[str, str] = {}  # the fields of an answer that has none
_UNHEARD = object()  # the fields of an answer the budgets have not read (`Outbound._first`)
_ONCE = ("", False)  # the `Outbound._retry_info` of any request when retries are off

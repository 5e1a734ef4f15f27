"""Calling a limited API with httpx: a transport that paces each host and learns its limit.

Each request waits, first in first out and at most *timeout* seconds, for a
token of its key's bucket (the host, or your *key* function), then goes to
the wrapped transport; the answer's ``Retry-After``, ``RateLimit-Policy`` /
``RateLimit`` and ``X-RateLimit-*`` fields lower that key's rate and
capacity to the server's, never above yours (see `nanobucket._outbound.pacer`).

>>> import httpx
>>> from nanobucket.httpx import RateLimitedTransport
>>> api = httpx.MockTransport(lambda request: httpx.Response(200, headers={
...     "RateLimit-Policy": '"default";q=100;w=1', "RateLimit": '"default";r=99;t=1'}))
>>> transport = RateLimitedTransport(api, rate=500, capacity=50)
>>> client = httpx.Client(transport=transport)
>>> client.get("https://api.example.com/items").status_code
200
>>> transport.limit("api.example.com")   # 100 a second: 5 at once, then 95/s
KeyLimit(rate=Fraction(95, 1), capacity=5, paused_for=0.0, known=True)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx

from ._core._params import NS_PER_S, RateArg
from ._outbound.adapter import IDEMPOTENT, LimitTimeout, Options, Outbound
from ._outbound.budget_fields import (
    BUDGET_FIELDS,
    FAMILIES,
    Budget,
    parse_go_duration,
    rfc3339_reset,
)
from ._outbound.budgets import ANNOUNCING_MARKS
from ._outbound.fields import FIELDS, TRIGGERS, Get, _http_date, fields_of
from ._outbound.pacer import KeyLimit

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = (
    "IDEMPOTENT",
    "AsyncRateLimitedTransport",
    "KeyLimit",
    "RateLimitTimeout",
    "RateLimitedTransport",
    "host_key",
)

KeyFunc = Callable[[httpx.Request], Hashable]
_Transport = TypeVar("_Transport", httpx.BaseTransport, httpx.AsyncBaseTransport)


class RateLimitTimeout(LimitTimeout, httpx.TimeoutException):
    """The wait for a token would pass the timeout: raised at once, nothing sent.

    ``key`` is the request's key; ``retry_after`` (s) and ``retry_after_ns``
    say when a request of that key may start, as far as is known now.

    >>> import httpx
    >>> err = RateLimitTimeout("wait", key="api.example.com", retry_after_ns=1_500_000_000)
    >>> isinstance(err, httpx.TimeoutException), err.retry_after
    (True, 1.5)
    """


def host_key(request: httpx.Request) -> str:
    """The default key: the request's host, with its port when the URL names one.

    >>> import httpx
    >>> host_key(httpx.Request("GET", "https://API.example.com/x")), host_key(
    ...     httpx.Request("GET", "http://127.0.0.1:8000/"))
    ('api.example.com', '127.0.0.1:8000')
    """
    url = request.url
    host, port = url.host, url.port  # lower-cased, IDNA decoded; a scheme's default port: None
    return host if port is None else f"{host}:{port}"


#: One of these is in the name of every `TRIGGERS` field: names without both have none.
_MARKS = (b"ratelimit", b"retry-after")
_RATELIMIT, _RETRY_AFTER = _MARKS
# The fields the pacing reads, and with them those the budgets read: by the raw name
# lowered, the name and whether the pacing reads it.
_PACING = {name.encode("ascii"): (name, True) for name in FIELDS}
_ANY = {name.encode("ascii"): (name, name in FIELDS) for name in FIELDS | BUDGET_FIELDS}
_raw_name = itemgetter(0)  # of httpx's (name, value) pairs
_LIMIT_OF, _ANTHROPIC = (mark.encode("ascii") for mark in ANNOUNCING_MARKS)
_budget = tuple.__new__  # a Budget from its fields, without NamedTuple's Python __new__


def read_fields(headers: Mapping[str, str]) -> tuple[bool, dict[str, str] | None]:
    """Whether a name of *headers* may be a limit field's (it holds ``ratelimit`` or
    ``retry-after``: False says no field of any family is there), and `limit_fields`.

    >>> read_fields(httpx.Headers({"Server": "x"}))
    (False, None)
    >>> read_fields(httpx.Headers({"X-RateLimit-Limit-Tokens": "5"}))   # a budget's
    (True, None)
    """
    if not isinstance(headers, httpx.Headers):
        return True, fields_of(headers)
    return _layout_of(headers.raw)[1], _read_answer(headers)[2]


def _read_answer(
    headers: Mapping[str, str],
) -> tuple[Get | None, dict[str, Budget] | None, dict[str, str] | None]:
    """The budgets' reading of *headers* (see `Outbound._read`: None when no name may
    announce a budget, and the budgets read already, or None), and `limit_fields`: one
    look at the names for all three.

    >>> _read_answer(httpx.Headers({"RateLimit": '"d";r=1;t=1'}))[0] is None
    True
    >>> get, budgets, fields = _read_answer(httpx.Headers({"X-RateLimit-Limit-Tokens": "5"}))
    >>> get("x-ratelimit-limit-tokens"), get("x-ratelimit-remaining-tokens"), budgets, fields
    ('5', None, {}, None)
    >>> _read_answer(httpx.Headers({"x-ratelimit-limit-tokens": "600",
    ...     "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1.5s"}))[1]
    {'tokens': Budget(limit=600, remaining=0, reset_ns=1500000000)}
    """
    if not isinstance(headers, httpx.Headers):
        return headers.get, None, fields_of(headers)
    raw = headers.raw
    # `_layout_of`, written out: the path of every answer.
    names = b"\n".join(map(_raw_name, raw))
    layout = _LAYOUTS.get(names)
    if layout is None or layout[0] != len(raw):
        layout = _layout(raw, names)
    if not layout[7]:
        return None, None, None  # most answers: no field the budgets or the pacing read
    _, _, announcing, places, triggers, spots, rest, _ = layout
    if places is not None:
        found: dict[str, str] = {}
        try:  # as httpx's own encoding reads them: the same for ASCII (and quicker)
            for i, key, _ in rest:  # (a loop: a comprehension is a call, a frame more)
                found[key] = raw[i][1].decode("ascii")
            if not announcing:  # every field found is one the pacing reads (a trigger)
                return None, None, found
            budgets = None
            if spots is not None:
                budgets = _spotted_budgets(raw, spots)
                if budgets is None:  # a count in another form, or no Date read: the budgets'
                    for i, key, _ in places:  # reading, of every field
                        found[key] = raw[i][1].decode("ascii")
        except UnicodeDecodeError:
            pass  # httpx's own reading, below
        else:
            if not triggers:
                return found.get, budgets, None
            fields = {key: found[key] for _, key, pacing in places if pacing}
            return found.get, budgets, fields
    return headers.get if announcing else None, None, fields_of(headers)


def _spotted_budgets(
    raw: list[tuple[bytes, bytes]], spots: tuple[tuple[int, int, int, str, int], ...]
) -> dict[str, Budget] | None:
    """The budgets of *raw* (httpx's header list), each read at its fields' places
    *spots* (limit, remaining, reset, the budget's name, and the ``Date``'s place
    for a reset in RFC 3339, -1 for a Go duration), as
    `nanobucket._outbound.budget_fields.parse_budgets` reads them; None when a
    count is not ASCII digits alone or the ``Date`` is not read (`parse_budgets`
    reads those). A reset or a ``Date`` that is not ASCII raises
    ``UnicodeDecodeError``."""
    budgets: dict[str, Budget] = {}
    wall_ns = None
    for limit_at, remaining_at, reset_at, name, date_at in spots:
        limit, remaining = raw[limit_at][1], raw[remaining_at][1]
        # bytes' isdigit is ASCII's: the digits-alone case of `parse_budgets`
        if not (
            limit.isdigit() and remaining.isdigit() and len(limit) <= 18 and len(remaining) <= 18
        ):
            return None
        reset = raw[reset_at][1].decode("ascii")
        if date_at < 0:  # a Go duration from now
            reset_ns = parse_go_duration(reset)
            if reset_ns is None:
                continue
        else:  # an RFC 3339 time, read against the answer's Date
            if wall_ns is None:
                date = raw[date_at][1].decode("ascii")
                seconds = _http_date(date) if date and len(date) < 64 else None
                if seconds is None:
                    return None  # read against this machine's clock: the budgets' own
                wall_ns = seconds * NS_PER_S
            reset_ns = rfc3339_reset(reset, wall_ns)
            if reset_ns is None:
                continue
        most = int(limit)
        left = int(remaining)
        budgets[name] = _budget(Budget, (most, left if left < most else most, reset_ns))
    return budgets


#: Where an answer's fields are in its header list (see `_layout`).
Layout = tuple[
    int,
    bool,
    bool,
    "tuple[tuple[int, str, bool], ...] | None",
    bool,
    "tuple[tuple[int, int, int, str, int], ...] | None",
    "tuple[tuple[int, str, bool], ...]",
    bool,
]
# An answer's joined names, as sent -> its `Layout`: a server sends the same names in the
# same order on every answer, so they are lowered and looked up one by one only once.
_LAYOUTS: dict[bytes, Layout] = {}
_LAYOUTS_KEPT = 64  # a server sends one list of names or a few; a hostile one, many
_LAYOUT_LEN = 2048  # longer joined names are looked up one by one every time


def _layout_of(raw: list[tuple[bytes, bytes]]) -> Layout:
    """The `Layout` of *raw* (httpx's header list), remembered or found."""
    names = b"\n".join(map(_raw_name, raw))
    layout = _LAYOUTS.get(names)
    if layout is None or layout[0] != len(raw):
        layout = _layout(raw, names)
    return layout


def _layout(raw: list[tuple[bytes, bytes]], names: bytes) -> Layout:
    """Where the fields of *raw* (httpx's header list, its names joined as *names*) are:
    how many names it has; whether one may be a limit field's (it holds ``ratelimit``
    or ``retry-after``: False says no field of any family is there); whether one may
    announce a budget; each field `_read_answer` reads as (its index, its lower-case
    name, whether the pacing reads it), or None when one is sent twice (httpx joins
    them: its reading is the one to take); whether one is a `TRIGGERS` field; where
    each budget's fields are (`_spotted_budgets`), or None when an RFC 3339 reset
    would be read against this machine's clock (no ``Date``); the fields read
    besides those (all of them without such places); and whether it has a field the
    budgets or the pacing read (most answers have none). Remembered by *names*,
    unless a name holds a line break (another list joins to the same names) or they
    are long.
    """
    lowered = names.lower()
    # ``find``, not ``in``: bytes' ``in`` first tries its operand as an int, and an
    # exception raised and cleared costs more than the search.
    marked = lowered.find(_RATELIMIT) >= 0 or lowered.find(_RETRY_AFTER) >= 0
    announcing = marked and (lowered.find(_LIMIT_OF) >= 0 or lowered.find(_ANTHROPIC) >= 0)
    places: list[tuple[int, str, bool]] = []
    keys: set[str] = set()
    repeated = False
    if marked:
        table = _ANY if announcing else _PACING
        for i, (name, _) in enumerate(raw):
            seen = table.get(name.lower())
            if seen is not None:
                repeated = repeated or seen[0] in keys
                keys.add(seen[0])
                places.append((i, *seen))
    at = {key: i for i, key, _ in places}
    spots = None
    if announcing and not repeated:
        spots = tuple(
            (at[limit], at[remaining], at[reset], name, -1 if go_resets else at.get("date", -2))
            for names, go_resets in FAMILIES
            for limit, remaining, reset, name in names
            if limit in at and remaining in at and reset in at
        )
        if any(spot[4] == -2 for spot in spots):
            spots = None  # RFC 3339 resets and no Date: read against the budgets' clock
    spotted = {i for spot in spots or () for i in spot[:3]}
    triggers = not TRIGGERS.isdisjoint(keys)
    layout: Layout = (
        len(raw),
        marked,
        announcing,
        None if repeated else tuple(places),
        triggers,
        spots,
        tuple(place for place in places if place[0] not in spotted),
        triggers or announcing,
    )
    if names.count(b"\n") == len(raw) - 1 and len(names) <= _LAYOUT_LEN:
        if len(_LAYOUTS) >= _LAYOUTS_KEPT:
            _LAYOUTS.clear()
        _LAYOUTS[names] = layout
    return layout


def limit_fields(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The limit fields of *headers* (`nanobucket._outbound.fields.FIELDS`), or None without a
    `TRIGGERS` one: most answers are told apart by two searches of their joined names.

    >>> limit_fields(httpx.Headers({"Server": "x", "Date": "now"})) is None
    True
    >>> fields = limit_fields(httpx.Headers([("RateLimit", '"d";r=1;t=1'), ("Date", "now")]))
    >>> fields == {"ratelimit": '"d";r=1;t=1', "date": "now"}
    True
    """
    return read_fields(headers)[1]


class _Limited(Outbound, Generic[_Transport]):
    """The constructor both transports share (their docstrings say what it takes)."""

    _timeout_error = RateLimitTimeout
    _transport_type: type[_Transport]
    _default_transport: Callable[[], _Transport]

    def __init__(
        self,
        transport: _Transport | None = None,
        *,
        rate: RateArg,
        capacity: int | None = None,
        key: KeyFunc | None = None,
        **options: Unpack[Options],
    ) -> None:
        kind = self._transport_type
        if transport is not None and not isinstance(transport, kind):
            raise TypeError(f"transport must be an httpx.{kind.__name__}, not {transport!r}")
        self._configure(rate, capacity, key, host_key, options)
        self.transport: _Transport = (
            transport if transport is not None else self._default_transport()
        )
        self._send = self._sender()

    def _sender(self) -> Callable[[httpx.Request], Any]:
        """The wrapped transport's send."""
        raise NotImplementedError

    _fields = staticmethod(limit_fields)
    _read = staticmethod(_read_answer)

    @staticmethod
    def _retry_info(request: httpx.Request) -> tuple[str, bool]:
        return request.method, isinstance(request.stream, httpx.ByteStream)  # a stream: once


class RateLimitedTransport(_Limited[httpx.BaseTransport], httpx.BaseTransport):
    """An httpx transport that waits for each host's token and learns its limit.

    * *transport*: the one that sends (default ``httpx.HTTPTransport()``).
    * *rate*, *capacity*: your limit per key; the server's may only lower it.
    * *key*: ``request -> key`` (default `host_key`).
    * *timeout*: the longest wait for a token, in seconds (default 30; None: no
      limit); a longer one raises `RateLimitTimeout` at once, nothing sent.
    * *retries*: how many times a 429 is sent again once its pause is over
      (default 0), for *retry_methods* (default the idempotent ones) and
      only while all its waits fit in *retry_budget* seconds (default 60);
      otherwise the 429 is returned.
    * *max_keys*, *max_waiters*: bounds on the keys remembered (default 1024)
      and on the requests waiting per key (past it: `RateLimitTimeout`).
    * *shared*: a keyed limiter that several processes' transports share (a
      `SharedKeyedTokenBucket`, a `RedisTokenBucket`): each request, once its
      own token is taken, takes its key's token there and leaves at that
      slot, and what one process learns (a slower rate, a
      pause) slows them all, so they behave as one client (see
      `nanobucket._outbound.shared`). Default None: this transport alone.
    * *estimate*, *settle*: for an API that announces several budgets at once
      (an LLM provider's requests and tokens per minute: OpenAI's
      ``x-ratelimit-*-requests`` / ``-tokens``, Anthropic's
      ``anthropic-ratelimit-*``), each learned and all kept together:
      ``estimate(request)`` gives a request's cost per budget before it
      leaves (``{"tokens": 1200}``; a budget it does not name costs one),
      ``settle(response)`` what it really spent, the difference given back or
      charged (see `nanobucket._outbound.budgets`). ``settle`` reads what it
      reads: ``response.read()`` reads the whole body first.
    * *clock* (int ns), *wall_clock* (int ns since the Unix epoch, read for a
      ``Retry-After`` date or a Unix-time reset when the answer has no
      ``Date``; default `time.time_ns`) and *sleep* serve tests.

    >>> import httpx
    >>> api = httpx.MockTransport(lambda request: httpx.Response(204))
    >>> slept = []   # with a clock that stands still, the second request waits 0.1 s
    >>> t = RateLimitedTransport(api, rate=10, capacity=1, clock=lambda: 0, sleep=slept.append)
    >>> [httpx.Client(transport=t).get("http://h/").status_code for _ in range(2)], slept
    ([204, 204], [0.1])
    """

    _transport_type = httpx.BaseTransport
    _default_transport = httpx.HTTPTransport

    def _sender(self) -> Callable[[httpx.Request], httpx.Response]:
        return self.transport.handle_request

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Wait for the key's token, send, learn from the answer (and maybe retry).

        >>> import httpx
        >>> t = RateLimitedTransport(httpx.MockTransport(lambda r: httpx.Response(200)),
        ...                          rate=1, capacity=1)
        >>> t.handle_request(httpx.Request("GET", "http://h/")).status_code
        200
        """
        answer: httpx.Response = self._paced(request, self._send)
        return answer

    def close(self) -> None:
        """Close the wrapped transport.

        >>> import httpx
        >>> RateLimitedTransport(httpx.MockTransport(lambda r: None), rate=1, capacity=1).close()
        """
        self.transport.close()


class AsyncRateLimitedTransport(_Limited[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport):
    """`RateLimitedTransport` for ``httpx.AsyncClient``: waits in asyncio.

    *transport* defaults to ``httpx.AsyncHTTPTransport()``; *async_sleep*
    (instead of *sleep*) replaces ``asyncio.sleep`` in tests. A cancelled
    waiter gives its place back.

    >>> import asyncio, httpx
    >>> api = httpx.MockTransport(lambda request: httpx.Response(200))
    >>> async def main():
    ...     transport = AsyncRateLimitedTransport(api, rate=100, capacity=10)
    ...     async with httpx.AsyncClient(transport=transport) as client:
    ...         return (await client.get("https://api.example.com/")).status_code
    >>> asyncio.run(main())
    200
    """

    _async = True
    _transport_type = httpx.AsyncBaseTransport
    _default_transport = httpx.AsyncHTTPTransport

    def _sender(self) -> Callable[[httpx.Request], Awaitable[httpx.Response]]:
        return self.transport.handle_async_request

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """`RateLimitedTransport.handle_request` for asyncio.

        >>> import asyncio, httpx
        >>> t = AsyncRateLimitedTransport(httpx.MockTransport(lambda r: httpx.Response(200)),
        ...                               rate=1, capacity=1)
        >>> asyncio.run(t.handle_async_request(httpx.Request("GET", "http://h/"))).status_code
        200
        """
        return await self._paced_async(request, self._send)

    async def aclose(self) -> None:
        """Close the wrapped transport.

        >>> import asyncio, httpx
        >>> t = AsyncRateLimitedTransport(httpx.MockTransport(lambda r: None), rate=1, capacity=1)
        >>> asyncio.run(t.aclose())
        """
        await self.transport.aclose()

"""Calling a limited API with requests: an ``HTTPAdapter`` that paces each host and learns.

The same pacing and learning as `nanobucket.httpx`, for ``requests``: mount
it on a session and every request through it waits for its host's token.

>>> import requests
>>> from nanobucket.requests import RateLimitedAdapter
>>> session = requests.Session()
>>> adapter = RateLimitedAdapter(rate=500, capacity=50)
>>> session.mount("https://", adapter); session.mount("http://", adapter)
>>> adapter.limit("api.example.com")   # no request yet: your own limits, nothing learned
KeyLimit(rate=500, capacity=50, paused_for=0.0, known=False)
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Hashable, Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import requests
import requests.adapters
from requests.structures import CaseInsensitiveDict

from ._core._params import RateArg
from ._outbound.adapter import IDEMPOTENT, LimitTimeout, Options, Outbound
from ._outbound.budgets import ANNOUNCING_MARKS
from ._outbound.fields import FIELDS, TRIGGERS, Get, fields_of
from ._outbound.pacer import KeyLimit

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ("IDEMPOTENT", "KeyLimit", "RateLimitTimeout", "RateLimitedAdapter", "host_key")

KeyFunc = Callable[[requests.PreparedRequest], Hashable]

_lower_name = itemgetter(0)  # of requests' (lower-case name, value) pairs
_LIMIT_OF, _ANTHROPIC = ANNOUNCING_MARKS

#: ``HTTPAdapter``'s own keywords, which the adapter passes on.
_POOL = ("pool_connections", "pool_maxsize", "max_retries", "pool_block")


class AdapterOptions(Options, total=False):
    """The outbound `Options`, and the ``HTTPAdapter`` keywords passed on to it."""

    pool_connections: int
    pool_maxsize: int
    max_retries: Any  # an int, or a urllib3 Retry
    pool_block: bool


class RateLimitTimeout(LimitTimeout, requests.exceptions.Timeout):
    """The wait for a token would pass the timeout: raised at once, nothing sent.

    ``key``, ``retry_after`` (s) and ``retry_after_ns`` as in
    `nanobucket.httpx.RateLimitTimeout`.

    >>> err = RateLimitTimeout("wait", key="api.example.com", retry_after_ns=2_000_000_000)
    >>> isinstance(err, requests.exceptions.Timeout), err.retry_after
    (True, 2.0)
    """


def host_key(request: requests.PreparedRequest) -> str:
    """The default key: the request's host, with its port when the URL names one.

    >>> host_key(requests.Request("GET", "https://API.example.com:8443/x").prepare())
    'api.example.com:8443'
    """
    parts = urllib.parse.urlsplit(request.url or "")
    host = parts.hostname or ""
    return host if parts.port is None else f"{host}:{parts.port}"


def read_fields(headers: Mapping[str, str]) -> tuple[bool, dict[str, str] | None]:
    """Whether a name of *headers* may be a limit field's (it holds ``ratelimit`` or
    ``retry-after``: False says no field of any family is there), and `limit_fields`.

    >>> from requests.structures import CaseInsensitiveDict as Headers
    >>> read_fields(Headers({"Server": "x"})), read_fields(Headers({"Retry-After": "1"}))
    ((False, None), (True, {'retry-after': '1'}))
    """
    marked, _, fields = _reading(headers)
    return marked, fields


def _read_answer(
    headers: Mapping[str, str],
) -> tuple[Get | None, None, dict[str, str] | None]:
    """The budgets' reading of *headers* (see `Outbound._read`: None when no name may
    announce a budget; the budgets are left to read it), and `limit_fields`: one look
    at the names for both.

    >>> from requests.structures import CaseInsensitiveDict as Headers
    >>> _read_answer(Headers({"Retry-After": "1"}))
    (None, None, {'retry-after': '1'})
    >>> get, _, fields = _read_answer(Headers({"X-RateLimit-Limit-Tokens": "5"}))
    >>> get("x-ratelimit-limit-tokens"), fields
    ('5', None)
    """
    _, announcing, fields = _reading(headers)
    return headers.get if announcing else None, None, fields


def _reading(headers: Mapping[str, str]) -> tuple[bool, bool, dict[str, str] | None]:
    """Whether a name of *headers* may be a limit field's, whether one may announce a
    budget, and `limit_fields`."""
    if not isinstance(headers, CaseInsensitiveDict):
        return True, True, fields_of(headers)
    items = list(headers.lower_items())
    names = "\n".join(map(_lower_name, items))
    if "ratelimit" not in names and "retry-after" not in names:
        return False, False, None
    announcing = _LIMIT_OF in names or _ANTHROPIC in names
    if TRIGGERS.isdisjoint(map(_lower_name, items)):
        return True, announcing, None
    return True, announcing, {name: value for name, value in items if name in FIELDS}


def limit_fields(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The limit fields of a response's *headers* (`nanobucket._outbound.fields.FIELDS`), or None
    without a `TRIGGERS` one: one pass over the lower-cased names that requests'
    ``CaseInsensitiveDict`` gives (``lower_items``).

    >>> from requests.structures import CaseInsensitiveDict
    >>> limit_fields(CaseInsensitiveDict({"Server": "x", "Date": "now"})) is None
    True
    >>> limit_fields(CaseInsensitiveDict({"Retry-After": "2", "Date": "now"}))
    {'retry-after': '2', 'date': 'now'}
    """
    return read_fields(headers)[1]


class RateLimitedAdapter(Outbound, requests.adapters.HTTPAdapter):
    """A ``requests`` transport adapter that waits for each host's token and learns its limit.

    The arguments are those of `nanobucket.httpx.RateLimitedTransport` (*key*
    takes the ``PreparedRequest``); ``HTTPAdapter``'s own (``pool_maxsize=``,
    ...) go to it. A wait past *timeout* raises `RateLimitTimeout`.

    >>> a = RateLimitedAdapter(rate=10, capacity=5, retries=2, pool_maxsize=8)
    >>> a.retry.retries, a.limit("h")
    (2, KeyLimit(rate=10, capacity=5, paused_for=0.0, known=False))
    """

    _timeout_error = RateLimitTimeout

    def __init__(
        self,
        *,
        rate: RateArg,
        capacity: int | None = None,
        key: KeyFunc | None = None,
        **options: Unpack[AdapterOptions],
    ) -> None:
        ours: dict[str, Any] = dict(options)
        pool = {name: ours.pop(name) for name in _POOL if name in ours}
        self._configure(rate, capacity, key, host_key, ours)
        super().__init__(**pool)

    _fields = staticmethod(limit_fields)
    _read = staticmethod(_read_answer)

    @staticmethod
    def _retry_info(request: requests.PreparedRequest) -> tuple[str, bool]:
        replayable = request.body is None or isinstance(request.body, (bytes, str))
        return request.method or "GET", replayable

    def send(
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        """Wait for the key's token, send, learn from the answer (and maybe retry).

        >>> class Canned(requests.adapters.HTTPAdapter):   # answers without a network
        ...     def send(self, request, *args, **kwargs):
        ...         response = requests.Response()
        ...         response.status_code, response.headers["X-RateLimit-Limit"] = 200, "3"
        ...         return response
        >>> class Limited(RateLimitedAdapter, Canned): pass
        >>> a = Limited(rate=10, capacity=5)
        >>> a.send(requests.Request("GET", "http://h/").prepare()).status_code, a.limit("h")
        (200, KeyLimit(rate=10, capacity=3, paused_for=0.0, known=True))
        """
        send = super().send
        return self._paced(request, lambda r: send(r, *args, **kwargs))

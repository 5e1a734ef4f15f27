"""`HttpAnswer`: the header fields and the 429 of a decision, for an integration written by hand.

The middlewares build their answers with these same functions (`limit_headers`,
`rejection`), so a framework nanobucket has no middleware for answers alike.
"""

from __future__ import annotations

from typing import Any

from .policy import Policy, headers_mode, limit_headers, rejection

__all__ = ("HttpAnswer",)


def _text(fields: Any) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in fields]


class HttpAnswer:
    """How the middlewares answer one limiter's decisions over HTTP, for a framework of your own.

    *limiter* is the limiter whose decisions are answered (its rate and
    capacity make ``RateLimit-Policy``), *name* the policy's name,
    *headers* ``"ietf"``, ``"legacy"`` or ``"off"``, as the middlewares take
    them. `admitted` gives the fields to add to an admitted response,
    `refused` the whole 429: its status, fields (``Content-Type``,
    ``Content-Length``, ``Retry-After`` and the limit fields) and its
    ``application/problem+json`` body. Header names are lower case, as
    HTTP/2 sends them.

    >>> import nanobucket as nb
    >>> limiter = nb.KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0)
    >>> answer = HttpAnswer(limiter)
    >>> answer.admitted(limiter.check("1.2.3.4"))
    [('ratelimit-policy', '"default";q=2;w=2'), ('ratelimit', '"default";r=1;t=1')]
    >>> limiter.check("1.2.3.4").allowed
    True
    >>> status, fields, body = answer.refused(limiter.check("1.2.3.4"))
    >>> status, dict(fields)["retry-after"], body[:31]
    (429, '1', b'{"type":"about:blank","title":"')
    """

    __slots__ = ("_headers", "_policy")

    def __init__(self, limiter: object, *, name: str = "default", headers: str = "ietf") -> None:
        self._headers = headers_mode(headers)
        self._policy = Policy(limiter, name, None)

    def admitted(self, decision: Any) -> list[tuple[str, str]]:
        """The fields of an admitted request's response (none with ``headers="off"``).

        >>> import nanobucket as nb
        >>> bucket = nb.TokenBucket(rate=10, capacity=10, clock=lambda: 0)
        >>> HttpAnswer(bucket, headers="legacy").admitted(bucket.check())[1]
        ('x-ratelimit-remaining', '9')
        """
        return _text(limit_headers(self._headers, self._policy, decision))

    def refused(self, decision: Any) -> tuple[int, list[tuple[str, str]], bytes]:
        """``(429, fields, body)``: the answer to a refused request, ``body`` its
        ``application/problem+json`` document.

        >>> import json, nanobucket as nb
        >>> bucket = nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0)
        >>> bucket.allow()
        True
        >>> status, fields, body = HttpAnswer(bucket, name="api").refused(bucket.check())
        >>> json.loads(body)["detail"], fields[2]
        ("Rate limit 'api' exceeded; retry after 1 s.", ('retry-after', '1'))
        """
        fields, body = rejection(self._headers, self._policy, decision)
        return 429, _text(fields), body

    def __repr__(self) -> str:
        return f"HttpAnswer(name={self._policy.name!r}, headers={self._headers!r})"

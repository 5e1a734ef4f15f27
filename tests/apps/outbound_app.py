"""A limited API for the outbound tests: 50 req/s, bursts of 10, per ``X-API-Key``.

``NB_OUT_FIELDS`` picks what it tells a client: ``ietf`` (``RateLimit-Policy``,
``RateLimit``, and ``Retry-After`` on a 429: nanobucket's middleware as
shipped), ``retry-after`` (only ``Retry-After`` on a 429) or ``x-ratelimit``
(only ``X-RateLimit-Limit/Remaining/Reset``, never ``Retry-After``).
``/stats`` (exempt) gives the middleware's counters.
"""

from __future__ import annotations

import os
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

import nanobucket as nb
from nanobucket.asgi import Counters, RateLimitMiddleware, header

counters = Counters()
FIELDS = os.environ.get("NB_OUT_FIELDS", "ietf")
MODES = {"ietf": "ietf", "retry-after": "off", "x-ratelimit": "legacy"}


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def stats(request: Request) -> JSONResponse:
    return JSONResponse(counters.snapshot())


limited = RateLimitMiddleware(
    Starlette(routes=[Route("/", hello), Route("/stats", stats)]),
    nb.KeyedTokenBucket(rate=50, capacity=10),
    key=header("X-API-Key"),
    headers=MODES[FIELDS],
    exempt=["/stats"],
    counters=counters,
)


async def app(scope: Any, receive: Any, send: Any) -> None:
    if FIELDS != "x-ratelimit":
        await limited(scope, receive, send)
        return

    async def without_retry_after(message: Any) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [(k, v) for k, v in message["headers"] if k != b"retry-after"]
        await send(message)

    await limited(scope, receive, without_retry_after)

"""A Starlette app behind the ASGI middleware, for the real-uvicorn tests.

Configured by the environment: ``NB_RATE`` (float), ``NB_CAPACITY`` (int),
``NB_KEY`` (``address`` or ``header``: the ``X-API-Key`` header).
"""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route as StarletteRoute

import nanobucket as nb
from nanobucket.asgi import Counters, RateLimitMiddleware, client_address, header

counters = Counters()


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def stats(request: Request) -> JSONResponse:
    return JSONResponse(counters.snapshot())


limiter = nb.KeyedTokenBucket(
    rate=float(os.environ["NB_RATE"]), capacity=int(os.environ["NB_CAPACITY"])
)
key = header("X-API-Key") if os.environ.get("NB_KEY") == "header" else client_address()

app = RateLimitMiddleware(
    Starlette(routes=[StarletteRoute("/", hello), StarletteRoute("/stats", stats)]),
    limiter,
    key=key,
    exempt=["/stats"],
    counters=counters,
)

"""A Starlette app behind the ASGI middleware, for the real-uvicorn tests.

Configured by the environment: ``NB_RATE`` (float), ``NB_CAPACITY`` (int),
``NB_KEY`` (``address``, ``header``: the ``X-API-Key`` header, or ``unix``:
the address in ``X-Forwarded-For`` from the proxy on a unix socket);
``NB_CAFE_CAPACITY``: ``/café`` gets its own, stricter limiter.
``/healthz`` and ``/stats`` are exempt; ``/files/{p:path}`` serves any path
below it, ``/files/../healthz`` included.
"""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route as StarletteRoute

import nanobucket as nb
from nanobucket.asgi import Counters, RateLimitMiddleware, Route, client_address, header

counters = Counters()


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def files(request: Request) -> PlainTextResponse:
    return PlainTextResponse("files:" + request.path_params["p"])


async def stats(request: Request) -> JSONResponse:
    return JSONResponse(counters.snapshot())


rate = float(os.environ["NB_RATE"])
limiter = nb.KeyedTokenBucket(rate=rate, capacity=int(os.environ["NB_CAPACITY"]))
name = os.environ.get("NB_KEY")
if name == "header":
    key: object = header("X-API-Key")
elif name == "unix":
    key = client_address(trusted_proxies=["unix:"])
else:
    key = client_address()
cafe = os.environ.get("NB_CAFE_CAPACITY")
routes = [Route("/café", nb.KeyedTokenBucket(rate=rate, capacity=int(cafe)))] if cafe else []

app = RateLimitMiddleware(
    Starlette(
        routes=[
            StarletteRoute("/", hello),
            StarletteRoute("/café", hello),
            StarletteRoute("/stats", stats),
            StarletteRoute("/healthz", hello),
            StarletteRoute("/files/{p:path}", files),
        ]
    ),
    limiter,
    key=key,
    routes=routes,
    exempt=["/stats", "/healthz"],
    counters=counters,
)

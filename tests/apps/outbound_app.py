"""A limited API for the outbound tests: 50 req/s, bursts of 10, per ``X-API-Key``.

``NB_OUT_FIELDS`` picks what it tells a client: ``ietf`` (``RateLimit-Policy``,
``RateLimit``, and ``Retry-After`` on a 429: nanobucket's middleware as
shipped), ``retry-after`` (only ``Retry-After`` on a 429) or ``x-ratelimit``
(only ``X-RateLimit-Limit/Remaining/Reset``, never ``Retry-After``). With
``sliding`` it is no token bucket but a sliding window of 50 requests per
second (tests/server_models.py's `SlidingWindow`, announced as ``q=50;w=1``).
``NB_OUT_RATE`` and ``NB_OUT_BURST`` change the 50 and the 10. ``/stats``
(exempt) gives the counters. ``/slow`` halves the bucket's rate (a fresh bucket
per key, full) and ``/fast`` brings it back: a server that slows down.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

import nanobucket as nb
from nanobucket.asgi import Counters, RateLimitMiddleware, header

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_models import SlidingWindow

counters = Counters()
FIELDS = os.environ.get("NB_OUT_FIELDS", "ietf")
RATE = int(os.environ.get("NB_OUT_RATE", "50"))
BURST = int(os.environ.get("NB_OUT_BURST", "10"))
MODES = {"ietf": "ietf", "retry-after": "off", "x-ratelimit": "legacy", "sliding": "ietf"}


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def stats(request: Request) -> JSONResponse:
    return JSONResponse(counters.snapshot())


def limited_at(rate: int) -> RateLimitMiddleware:
    return RateLimitMiddleware(
        Starlette(routes=[Route("/", hello), Route("/stats", stats)]),
        nb.KeyedTokenBucket(rate=rate, capacity=BURST),
        key=header("X-API-Key"),
        headers=MODES[FIELDS],
        exempt=["/stats"],
        counters=counters,
    )


limited = fast = limited_at(RATE)
slow = limited_at(RATE // 2)


windows: dict[bytes, SlidingWindow] = {}
sliding_counts = {"admitted": 0, "limited": 0}


async def sliding(scope: Any, receive: Any, send: Any) -> None:
    """At most RATE requests per key in any second, by a log of the admitted ones."""
    if scope["path"] == "/stats":
        status, headers, body = 200, {"content-type": "application/json"}, sliding_counts
    else:
        key = dict(scope["headers"]).get(b"x-api-key", b"")
        window = windows.setdefault(key, SlidingWindow(RATE, 1))
        status, headers = window.decide(time.monotonic_ns())
        sliding_counts["admitted" if status == 200 else "limited"] += 1
        body = {"status": status}
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


async def app(scope: Any, receive: Any, send: Any) -> None:
    global limited
    if scope["type"] == "http" and scope["path"] in {"/slow", "/fast"}:
        limited = slow if scope["path"] == "/slow" else fast
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if FIELDS == "sliding" and scope["type"] == "http":
        await sliding(scope, receive, send)
        return
    if FIELDS != "x-ratelimit":
        await limited(scope, receive, send)
        return

    async def without_retry_after(message: Any) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [(k, v) for k, v in message["headers"] if k != b"retry-after"]
        await send(message)

    await limited(scope, receive, without_retry_after)

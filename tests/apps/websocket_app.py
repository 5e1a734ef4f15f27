"""A Starlette app with websockets behind the ASGI middleware, for the real-uvicorn test.

``/echo`` echoes each text message, at most 2 per client (then closed with
1008); a client opens 2 connections (one token per hour), the third
handshake is refused with the 429. ``/bare/echo`` is the same app below a
server that offers no ``websocket.http.response``: refused, it is closed
with 1008 before it is accepted, which uvicorn answers with a 403.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount, WebSocketRoute
from starlette.websockets import WebSocket

import nanobucket as nb
from nanobucket.asgi import MessageLimit, RateLimitMiddleware

per_message = MessageLimit(nb.KeyedTokenBucket(rate=1 / 3600, capacity=2))


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    async for text in websocket.iter_text():
        if not await per_message(websocket):
            return
        await websocket.send_text(text)


limited = RateLimitMiddleware(
    Starlette(routes=[WebSocketRoute("/echo", echo)]),
    nb.KeyedTokenBucket(rate=1 / 3600, capacity=2),
)


async def without_the_extension(scope: Any, receive: Any, send: Any) -> None:
    scope = {**scope, "extensions": {}}
    await limited(scope, receive, send)


app = Starlette(routes=[Mount("/bare", app=without_the_extension), Mount("/", app=limited)])

"""WebSockets behind the ASGI middleware: the handshake counted, refused with a 429 or 1008;
`MessageLimit` on an open connection; and one real uvicorn server on loopback.

Under an injected clock a client's bucket holds 2 tokens: two handshakes
are accepted, the third is refused and due again in exactly 1 s.
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import websockets.exceptions
import websockets.sync.client
from fastapi import FastAPI, WebSocket
from starlette.applications import Starlette
from starlette.exceptions import StarletteDeprecationWarning
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocketDisconnect
from test_http_servers import Server, free_port

import nanobucket as nb
from nanobucket.asgi import MessageLimit, RateLimitMiddleware, Route, header

from conftest import ManualClock
from http_checks import PROBLEM_429_1S, AsyncRecorder, counts

# Starlette's TestClient now asks for httpx2 and warns on importing it over
# httpx; its websocket session, the part used here, does not touch either.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient, WebSocketDenialResponse

S = 1_000_000_000
SRC = str(Path(nb.__file__).resolve().parent.parent)  # the server imports this nanobucket
PEER = ("203.0.113.5", 50000)  # the TestClient's client address


async def _echo(websocket: Any) -> None:
    await websocket.accept()
    async for text in websocket.iter_text():
        await websocket.send_text(text)


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def starlette_app() -> Starlette:
    return Starlette(
        routes=[
            StarletteRoute("/", _hello),
            WebSocketRoute("/ws", _echo),
            WebSocketRoute("/free", _echo),
            WebSocketRoute("/chat", _echo),
        ]
    )


def without_the_extension(app: Any) -> Any:
    """*app* under a server that offers no ``websocket.http.response``."""

    async def call(scope: Any, receive: Any, send: Any) -> None:
        await app({**scope, "extensions": {}}, receive, send)

    return call


def bucket(impl: ModuleType, clock: ManualClock, capacity: int = 2) -> Any:
    return impl.KeyedTokenBucket(rate=1, capacity=capacity, clock=clock)


# ---------------------------------------------------------------- handshake


def test_a_refused_handshake_is_the_http_429(impl: ModuleType, clock: ManualClock) -> None:
    limiter = bucket(impl, clock)
    app = RateLimitMiddleware(starlette_app(), limiter)
    client = TestClient(app, client=PEER)
    accepted = []
    for _ in range(2):
        with client.websocket_connect("/ws") as ws:
            ws.send_text("hi")
            assert ws.receive_text() == "hi"
            accepted.append(dict(ws.extra_headers or ()))
    # The limit's fields on the 101 (the app's websocket.accept).
    assert accepted == [
        {b"ratelimit-policy": b'"default";q=2;w=2', b"ratelimit": b'"default";r=1;t=1'},
        {b"ratelimit-policy": b'"default";q=2;w=2', b"ratelimit": b'"default";r=0;t=2'},
    ]
    with pytest.raises(WebSocketDenialResponse) as refused:
        client.websocket_connect("/ws").__enter__()
    response = refused.value
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["ratelimit"] == '"default";r=0;t=2'
    assert response.json() == PROBLEM_429_1S
    assert limiter.tokens(PEER[0]) == 0.0
    assert app.counters.snapshot() == counts(admitted=2, limited=1, shadow_limited=0, exempt=0)
    clock.advance(S)  # one token back: one more connection
    with client.websocket_connect("/ws") as ws:
        ws.send_text("again")
        assert ws.receive_text() == "again"


def test_without_the_extension_the_handshake_is_closed_with_1008(
    impl: ModuleType, clock: ManualClock
) -> None:
    app = RateLimitMiddleware(starlette_app(), bucket(impl, clock, capacity=1))
    client = TestClient(without_the_extension(app), client=PEER)
    with client.websocket_connect("/ws") as ws:
        ws.send_text("hi")
        assert ws.receive_text() == "hi"
    with pytest.raises(WebSocketDisconnect) as closed:
        client.websocket_connect("/ws").__enter__()
    assert not isinstance(closed.value, WebSocketDenialResponse)
    assert closed.value.code == 1008
    assert closed.value.reason == "rate limit exceeded; retry after 1 s"


def test_the_raw_asgi_messages_of_both_refusals(impl: ModuleType, clock: ManualClock) -> None:
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "websocket.accept"})

    mw = RateLimitMiddleware(app, bucket(impl, clock, capacity=1), headers="off")

    def handshake(extensions: dict[str, Any]) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "websocket.connect"}

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {"type": "websocket", "path": "/ws", "headers": [], "client": PEER}
        asyncio.run(mw({**scope, "extensions": extensions}, receive, send))
        return sent

    assert handshake({}) == [{"type": "websocket.accept"}]  # headers="off": nothing added
    body = json.dumps(PROBLEM_429_1S, separators=(",", ":")).encode()
    assert handshake({"websocket.http.response": {}}) == [
        {
            "type": "websocket.http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", b"%d" % len(body)),
                (b"retry-after", b"1"),
            ],
        },
        {"type": "websocket.http.response.body", "body": body, "more_body": False},
    ]
    assert handshake({}) == [
        {"type": "websocket.close", "code": 1008, "reason": "rate limit exceeded; retry after 1 s"}
    ]
    assert reached == ["/ws"]  # a refused handshake never reaches the app


def test_a_route_written_with_the_root_path_warns_for_a_websocket_too(
    impl: ModuleType, clock: ManualClock
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "websocket.accept"})

    async def send(message: Any) -> None:
        pass

    mw = RateLimitMiddleware(app, bucket(impl, clock), routes=[Route("/api/chat")])
    scope = {"type": "websocket", "path": "/api/chat", "root_path": "/api", "client": PEER}
    with pytest.warns(RuntimeWarning, match=r"write Route\('/chat'\)"):
        asyncio.run(mw(scope, None, send))  # type: ignore[arg-type]


def test_routes_exempt_paths_and_clients_apply_as_to_http(
    impl: ModuleType, clock: ManualClock
) -> None:
    limiter = bucket(impl, clock)
    chat = bucket(impl, clock, capacity=1)
    app = RateLimitMiddleware(
        starlette_app(),
        limiter,
        exempt="/free",
        routes=[
            Route("/chat", chat, name="chat"),
            Route("/ws", nb.TokenBucket(rate=1, capacity=1), methods={"POST"}),  # never a handshake
        ],
        exempt_clients=lambda scope: (b"x-internal", b"1") in scope["headers"],
    )
    client = TestClient(app, client=PEER)

    def status(path: str, **kwargs: Any) -> int:
        try:
            with client.websocket_connect(path, **kwargs):
                return 101
        except WebSocketDenialResponse as refused:
            return int(refused.status_code)

    assert [status("/free") for _ in range(3)] == [101] * 3
    assert [status("/ws", headers={"x-internal": "1"}) for _ in range(3)] == [101] * 3
    assert limiter.tokens(PEER[0]) == 2.0
    # An HTTP request and a handshake of one client spend from one bucket.
    assert client.get("/").status_code == 200
    assert [status("/ws") for _ in range(2)] == [101, 429]
    assert [status("/chat") for _ in range(2)] == [101, 429]
    assert chat.tokens(PEER[0]) == 0.0
    assert app.counters.snapshot() == counts(admitted=3, limited=2, shadow_limited=0, exempt=6)


def test_shadow_mode_and_an_async_hook_on_the_handshake(
    impl: ModuleType, clock: ManualClock
) -> None:
    events: list[tuple[Any, str, str]] = []

    async def on_decision(event: Any) -> None:
        events.append((event.key, event.route, event.outcome))

    app = RateLimitMiddleware(
        starlette_app(),
        bucket(impl, clock, capacity=1),
        key=header("x-user"),
        shadow=True,
        on_decision=on_decision,
    )
    client = TestClient(app, client=PEER)
    for _ in range(2):
        with client.websocket_connect("/ws", headers={"x-user": "ann"}) as ws:
            assert not ws.extra_headers  # shadow mode adds no fields
    assert events == [("header:ann", "*", "admitted"), ("header:ann", "*", "shadow-limited")]
    assert app.counters.snapshot() == counts(admitted=1, limited=0, shadow_limited=1, exempt=0)


# ----------------------------------------------------------------- messages


def test_message_limit_closes_with_1008(impl: ModuleType, clock: ManualClock) -> None:
    per_message = MessageLimit(bucket(impl, clock, capacity=3), cost=1)
    seen: list[str] = []

    async def chat(websocket: Any) -> None:
        await websocket.accept()
        async for text in websocket.iter_text():
            if not await per_message(websocket, cost=2 if text == "big" else None):
                return
            seen.append(text)
            await websocket.send_text(text)

    app = Starlette(routes=[WebSocketRoute("/chat", chat)])
    client = TestClient(app, client=PEER)
    with client.websocket_connect("/chat") as ws:
        for text in ("a", "big", "b"):
            ws.send_text(text)
        assert [ws.receive_text(), ws.receive_text()] == ["a", "big"]
        assert ws.receive() == {
            "type": "websocket.close",
            "code": 1008,
            "reason": "rate limit exceeded; retry after 1 s",
        }
    assert seen == ["a", "big"]


def test_message_limit_per_connection_in_fastapi(impl: ModuleType, clock: ManualClock) -> None:
    # One bucket per connection (an unkeyed one made by the handler), and a key
    # callable taking the websocket for the per-user one.
    users = bucket(impl, clock, capacity=3)
    per_user = MessageLimit(users, key=lambda ws: ws.query_params["u"])
    app = FastAPI()

    @app.websocket("/chat")
    async def chat(websocket: WebSocket) -> None:
        per_connection = MessageLimit(impl.TokenBucket(rate=1, capacity=2, clock=clock))
        await websocket.accept()
        async for text in websocket.iter_text():
            if not (await per_connection(websocket) and await per_user(websocket)):
                return
            await websocket.send_text(text)

    client = TestClient(app, client=PEER)

    def chat_as(user: str) -> list[object]:
        with client.websocket_connect(f"/chat?u={user}") as ws:
            for text in ("1", "2", "3"):
                ws.send_text(text)
            got = [ws.receive(), ws.receive()]
            if got[-1]["type"] != "websocket.close":
                got.append(ws.receive())
            return [m.get("text", m.get("code")) for m in got]

    assert chat_as("ann") == ["1", "2", 1008]  # the connection's bucket of 2 closed it
    assert chat_as("ann") == ["1", 1008]  # ann's bucket of 3 had 1 left
    assert users.tokens("ann") == 0.0
    with client.websocket_connect("/chat?u=bob") as ws:
        ws.send_text("x")
        assert ws.receive_text() == "x"


def test_message_limit_awaits_an_asyncio_limiter_and_reads_a_header_key(
    impl: ModuleType, clock: ManualClock
) -> None:
    limiter = AsyncRecorder(bucket(impl, clock))
    per_message = MessageLimit(limiter, key=header("x-user"))

    async def chat(websocket: Any) -> None:
        await websocket.accept()
        async for text in websocket.iter_text():
            if not await per_message(websocket):
                return
            await websocket.send_text(text)

    client = TestClient(Starlette(routes=[WebSocketRoute("/chat", chat)]), client=PEER)
    with client.websocket_connect("/chat", headers={"x-user": "ann"}) as ws:
        for text in ("1", "2", "3"):
            ws.send_text(text)
        assert [ws.receive_text(), ws.receive_text()] == ["1", "2"]
        assert ws.receive()["code"] == 1008
    assert limiter.keys == ["header:ann"] * 3


def test_message_limit_bad_input(impl: ModuleType, clock: ManualClock) -> None:
    limiter = bucket(impl, clock)
    with pytest.raises(ValueError, match="cost"):
        MessageLimit(limiter, cost=3)
    with pytest.raises(TypeError, match="cost"):
        MessageLimit(limiter, cost=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be"):
        MessageLimit(limiter, key=42)
    with pytest.raises(TypeError, match="check"):
        MessageLimit(object())
    import redis

    from nanobucket import redis as nbr

    with pytest.raises(TypeError, match="AsyncRedisTokenBucket"):
        MessageLimit(nbr.RedisTokenBucket(redis.Redis(), rate=1, capacity=1))


# ------------------------------------------------------------- real uvicorn


def test_under_real_uvicorn(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "websocket_app:app", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    server = Server(argv, {"PYTHONPATH": SRC}, port, tmp_path / "uvicorn.log")
    url = f"ws://127.0.0.1:{port}"
    try:
        with websockets.sync.client.connect(url + "/echo", open_timeout=10) as ws:
            assert ws.response is not None
            assert ws.response.headers["ratelimit"] == '"default";r=1;t=3600'
            ws.send("a")
            ws.send("b")
            ws.send("c")
            assert [ws.recv(timeout=10), ws.recv(timeout=10)] == ["a", "b"]
            with pytest.raises(websockets.exceptions.ConnectionClosedError) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1008
        assert closed.value.rcvd.reason == "rate limit exceeded; retry after 3600 s"
        with websockets.sync.client.connect(url + "/echo", open_timeout=10):
            pass
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            websockets.sync.client.connect(url + "/echo", open_timeout=10)
        response = refused.value.response
        assert response.status_code == 429
        assert response.headers["retry-after"] == "3600"
        assert response.headers["content-type"] == "application/problem+json"
        assert json.loads(response.body or b"")["retry_after"] == 3600
        # A server without the extension: closed before accept, which uvicorn answers 403.
        with pytest.raises(websockets.exceptions.InvalidStatus) as closed_early:
            websockets.sync.client.connect(url + "/bare/echo", open_timeout=10)
        assert closed_early.value.response.status_code == 403
    finally:
        server.close()

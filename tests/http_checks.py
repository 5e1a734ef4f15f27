"""What the HTTP middleware tests share: an ASGI client, the 429 body, limiter wrappers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import httpx
import pytest

# The problem document every front end answers when the default policy
# refuses a request due again in one second.
PROBLEM_429_1S = {
    "type": "about:blank",
    "title": "Too Many Requests",
    "status": 429,
    "detail": "Rate limit 'default' exceeded; retry after 1 s.",
    "retry_after": 1,
}


def counts(*, admitted: int, limited: int, shadow_limited: int, exempt: int) -> dict[str, int]:
    """What a front end's ``counters.snapshot()`` is for these counts: its four keys."""
    return {
        "admitted": admitted,
        "limited": limited,
        "shadow_limited": shadow_limited,
        "exempt": exempt,
    }


class Client:
    """A synchronous face on ``httpx.AsyncClient(transport=ASGITransport(...))``."""

    def __init__(
        self, app: Any, client: tuple[str, int] = ("127.0.0.1", 40000), root_path: str = ""
    ) -> None:
        self.loop = asyncio.new_event_loop()
        # A root path as uvicorn gives it: in scope["root_path"], and in front of the
        # path, which the client sends whole ("/api/login" under "/api").
        transport = httpx.ASGITransport(app=app, client=client, root_path=root_path)
        self.http = httpx.AsyncClient(transport=transport, base_url="http://test")

    def get(self, path: str = "/", **kwargs: Any) -> httpx.Response:
        return self.loop.run_until_complete(self.http.get(path, **kwargs))

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.loop.run_until_complete(self.http.post(path, **kwargs))

    def close(self) -> None:
        self.loop.run_until_complete(self.http.aclose())
        self.loop.close()


MakeClient = Callable[..., Client]  # the `asgi_client` fixture: (app, host=..., root_path=...)


@pytest.fixture
def asgi_client() -> Iterator[MakeClient]:
    """Makes a `Client` of an app (from *host*, under *root_path*), closed when the test ends."""
    made: list[Client] = []

    def make(app: Any, host: str = "127.0.0.1", root_path: str = "") -> Client:
        made.append(Client(app, (host, 40000), root_path))
        return made[-1]

    yield make
    for c in made:
        c.close()


class Recorder:
    """A keyed limiter that remembers every key it was asked about."""

    keyed = True

    def __init__(self, limiter: Any) -> None:
        self.limiter = limiter
        self.capacity = limiter.capacity
        self.rate = limiter.rate
        self.keys: list[Hashable] = []

    def check(self, key: Hashable, cost: int = 1) -> Any:
        self.keys.append(key)
        return self.limiter.check(key, cost)


class AsyncRecorder(Recorder):
    """A `Recorder` with ``async def check``, as the Redis limiter has."""

    async def check(self, key: Hashable, cost: int = 1) -> Any:
        await asyncio.sleep(0)
        return super().check(key, cost)

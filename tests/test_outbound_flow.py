"""One flow for every outbound adapter: the same steps in a thread and in asyncio.

A request is charged to its key's budgets, paced, sent, and its answer read,
learned from and settled, by steps written once (`Outbound._charging`,
`Outbound._tries`) that the httpx transports (sync and asyncio) and the
requests adapter drive alike. Checked here on each of them, on a clock that
only the injected sleep moves: the same waits and outcomes, every answer the
caller does not get closed, and an answer without a limit field never looked
up by name (the work of most requests).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import requests
import requests.adapters
import requests.structures

from nanobucket._outbound.adapter import Outbound
from nanobucket.httpx import AsyncRateLimitedTransport, RateLimitedTransport, RateLimitTimeout
from nanobucket.requests import RateLimitedAdapter
from nanobucket.requests import RateLimitTimeout as RequestsTimeout

from conftest import SleepClock

NS = 1_000_000_000
KINDS = ["sync", "async", "requests"]
Reply = tuple[int, dict[str, str]]


class Looked:
    """How many times an answer's headers were looked up by name."""

    count = 0


class HttpxHeaders(httpx.Headers):
    def __getitem__(self, key: str) -> str:
        Looked.count += 1
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        Looked.count += 1
        return super().__contains__(key)


class RequestsHeaders(requests.structures.CaseInsensitiveDict[str]):
    def __getitem__(self, key: str) -> str:
        Looked.count += 1
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        Looked.count += 1
        return super().__contains__(key)


class Body(httpx.ByteStream):
    """An httpx answer's body, remembering whether it was closed."""

    closed = False

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


class Raw:
    """A requests answer's body stream, remembering whether it was closed."""

    closed = False

    def close(self) -> None:
        self.closed = True


class Server:
    """Answers *replies* in turn, the last one forever; keeps every answer and when it left."""

    def __init__(self, clock: SleepClock, *replies: Reply) -> None:
        self.clock = clock
        self.replies = replies
        self.answers: list[Any] = []
        self.sent: list[int] = []

    def _next(self) -> Reply:
        self.sent.append(self.clock.now)
        return self.replies[min(len(self.answers), len(self.replies) - 1)]

    def httpx(self, request: httpx.Request) -> httpx.Response:
        status, fields = self._next()
        answer = httpx.Response(status, stream=Body(b'{"usage": {"total_tokens": 50}}'))
        answer.headers = HttpxHeaders(fields)
        self.answers.append(answer)
        return answer

    def requests(self) -> requests.Response:
        status, fields = self._next()
        answer = requests.Response()
        answer.status_code = status
        answer.headers = RequestsHeaders(fields)
        answer.raw = Raw()
        answer._content = b'{"usage": {"total_tokens": 50}}'
        self.answers.append(answer)
        return answer


def is_closed(answer: Any) -> bool:
    body: Any = answer.stream if isinstance(answer, httpx.Response) else answer.raw
    return bool(body.closed)


def send_all(kind: str, server: Server, count: int, **options: Any) -> tuple[Outbound, list[Any]]:
    """*count* POSTs of ``http://h/`` in turn through a *kind* adapter over *server*: each
    one's answer, or what it raised."""
    clock = server.clock
    outcomes: list[Any] = []
    if kind == "requests":

        class Canned(requests.adapters.HTTPAdapter):
            def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
                return server.requests()

        class Limited(RateLimitedAdapter, Canned):
            pass

        adapter = Limited(clock=clock, sleep=clock.sleep, **options)
        for _ in range(count):
            try:
                prepared = requests.Request("POST", "http://h/", json={"tokens": 100}).prepare()
                outcomes.append(adapter.send(prepared))
            except Exception as err:
                outcomes.append(err)
        return adapter, outcomes
    request = httpx.Request("POST", "http://h/", json={"tokens": 100})
    if kind == "sync":
        t = RateLimitedTransport(
            httpx.MockTransport(server.httpx), clock=clock, sleep=clock.sleep, **options
        )
        for _ in range(count):
            try:
                outcomes.append(t.handle_request(request))
            except Exception as err:
                outcomes.append(err)
        return t, outcomes
    a = AsyncRateLimitedTransport(
        httpx.MockTransport(server.httpx), clock=clock, async_sleep=clock.async_sleep, **options
    )

    async def main() -> None:
        for _ in range(count):
            try:
                outcomes.append(await a.handle_async_request(request))
            except Exception as err:
                outcomes.append(err)

    asyncio.run(main())
    return a, outcomes


def estimate(request: Any) -> dict[str, int]:
    body = request.content if isinstance(request, httpx.Request) else request.body
    return dict(json.loads(body))


def status(outcome: Any) -> int | str:
    return outcome.status_code if hasattr(outcome, "status_code") else type(outcome).__name__


TOKENS = {  # 1000 tokens a minute, 150 left, full again in 6 s
    "x-ratelimit-limit-tokens": "1000",
    "x-ratelimit-remaining-tokens": "150",
    "x-ratelimit-reset-tokens": "6s",
}
FIFTY = {**TOKENS, "x-ratelimit-remaining-tokens": "50"}


@pytest.fixture(autouse=True)
def _no_lookups_counted() -> Iterator[None]:
    Looked.count = 0
    yield


@pytest.mark.parametrize("kind", KINDS)
def test_an_answer_without_a_limit_field_is_never_looked_up_by_name(kind: str) -> None:
    clock = SleepClock()
    server = Server(clock, (200, {"Server": "x", "Content-Type": "application/json"}))
    _, outcomes = send_all(kind, server, 5, rate=100, capacity=10)
    assert [status(o) for o in outcomes] == [200] * 5
    assert Looked.count == 0
    assert not any(is_closed(answer) for answer in server.answers)


@pytest.mark.parametrize("kind", KINDS)
def test_a_budget_announced_holds_the_next_request_until_its_reset(kind: str) -> None:
    clock = SleepClock()
    server = Server(clock, (200, TOKENS), (200, FIFTY))
    _, outcomes = send_all(kind, server, 3, rate=100, capacity=10, estimate=estimate)
    assert [status(o) for o in outcomes] == [200] * 3
    # 150 left: the second request's 100 fit; 50 left then, and the third waits for
    # the reset, 6 s on.
    assert [sent - server.sent[0] for sent in server.sent] == [0, 0, 6 * NS]
    assert clock.slept == [6.0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_budget_wait_past_the_timeout_sends_nothing(kind: str) -> None:
    clock = SleepClock()
    server = Server(clock, (200, TOKENS), (200, FIFTY))
    _, outcomes = send_all(kind, server, 3, rate=100, capacity=10, estimate=estimate, timeout=5)
    assert [status(o) for o in outcomes] == [200, 200, "RateLimitTimeout"]
    assert isinstance(outcomes[2], RequestsTimeout if kind == "requests" else RateLimitTimeout)
    assert outcomes[2].retry_after_ns == 6 * NS
    assert len(server.answers) == 2 and clock.slept == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("settle", "error"),
    [
        (lambda response: 1 / 0, "ZeroDivisionError"),
        (lambda response: {"tokens": -1}, "ValueError"),
        (lambda response: ["tokens"], "TypeError"),
    ],
    ids=["raises", "negative", "not-a-mapping"],
)
def test_a_settle_that_fails_closes_the_answer_and_raises(
    kind: str, settle: Callable[[Any], Any], error: str
) -> None:
    clock = SleepClock()
    server = Server(clock, (200, TOKENS))
    _, outcomes = send_all(kind, server, 2, rate=100, capacity=10, settle=settle)
    assert [status(o) for o in outcomes] == [error, error]
    assert len(server.answers) == 2 and all(is_closed(a) for a in server.answers)


@pytest.mark.parametrize("kind", KINDS)
def test_settle_gives_back_what_the_estimate_charged_past_the_usage(kind: str) -> None:
    # Each request is estimated at 100 tokens and spends 50 (its usage): with the
    # budget announced once, then silent, the 150 left hold three requests, not one.
    clock = SleepClock()
    server = Server(clock, (200, TOKENS), (200, {}))

    def settle(response: Any) -> dict[str, int]:
        return {"tokens": int(json.loads(response.read())["usage"]["total_tokens"])}

    def read_requests(response: Any) -> dict[str, int]:
        return {"tokens": int(response.json()["usage"]["total_tokens"])}

    chosen = read_requests if kind == "requests" else settle
    _, outcomes = send_all(kind, server, 4, rate=100, capacity=10, estimate=estimate, settle=chosen)
    assert [status(o) for o in outcomes] == [200] * 4
    assert [sent - server.sent[0] for sent in server.sent] == [0, 0, 0, 6 * NS]


@pytest.mark.parametrize("kind", KINDS)
def test_a_429_is_sent_again_after_its_pause_and_closed(kind: str) -> None:
    clock = SleepClock()
    server = Server(clock, (429, {"Retry-After": "2"}), (200, {}))
    _, outcomes = send_all(
        kind, server, 1, rate=100, capacity=10, retries=1, retry_methods=["POST"]
    )
    assert [status(o) for o in outcomes] == [200]
    assert [sent - server.sent[0] for sent in server.sent] == [0, 2 * NS]
    assert is_closed(server.answers[0]) and not is_closed(server.answers[1])


@pytest.mark.parametrize("kind", KINDS)
def test_the_key_function_is_called_once_a_request_and_its_key_paces_every_step(
    kind: str,
) -> None:
    keyed: list[int] = []

    def key(request: Any) -> str:
        keyed.append(0)
        return f"api-{len(keyed)}"  # a new key each call: the steps must share one

    clock = SleepClock()
    server = Server(clock, (429, {"Retry-After": "2"}), (200, TOKENS))
    options = {"retries": 1, "retry_methods": ["POST"], "estimate": estimate}
    limited, outcomes = send_all(kind, server, 3, rate=100, capacity=10, key=key, **options)
    assert [status(o) for o in outcomes] == [200, 200, 200]
    assert len(keyed) == 3
    # The first request's 429 paused its key, and its retry went on that key.
    assert [sent - server.sent[0] for sent in server.sent] == [0, 2 * NS, 2 * NS, 2 * NS]
    assert limited.limit("api-1").known and not limited.limit("api-4").known


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_one_answer_object_given_again_with_new_fields_is_read_again(kind: str) -> None:
    clock = SleepClock()
    answer = httpx.Response(200, headers={"Server": "x"})
    fields = {"RateLimit-Policy": '"d";q=4;w=1', "RateLimit": '"d";r=3;t=1'}
    mock = httpx.MockTransport(lambda request: answer)
    if kind == "sync":
        t: Any = RateLimitedTransport(mock, rate=100, capacity=10, clock=clock)
    else:
        t = AsyncRateLimitedTransport(mock, rate=100, capacity=10, clock=clock)

    def send() -> Any:
        request = httpx.Request("GET", "http://h/")
        if kind == "sync":
            return t.handle_request(request)
        return asyncio.run(t.handle_async_request(request))

    send()
    send()
    assert t.limit("h").capacity == 10
    answer.headers.update(fields)  # the same headers object, now with a limit
    send()
    assert t.limit("h").capacity == 1  # 4 a second: one at once (a twentieth, at least 1)

"""Outbound pacing through aiohttp's client: `nanobucket.aiohttp.ClientRateLimit`.

Every request goes through a real ``aiohttp.ClientSession`` to a real ``aiohttp.web``
server on loopback that answers from a script (statuses, ``Retry-After``,
``RateLimit-Policy`` / ``RateLimit``, ``X-RateLimit-*``, an LLM provider's budgets),
under a clock that only the injected sleep moves, so every wait is exact. The same
scripts through httpx's `AsyncRateLimitedTransport` give the same statuses, sleeps,
send times and learned limits; the default key is httpx's for the same URL.
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from yarl import URL

import nanobucket as nb
import nanobucket.httpx
from nanobucket.aiohttp import ClientRateLimit, KeyLimit, RateLimitTimeout, host_key
from nanobucket.httpx import AsyncRateLimitedTransport

from conftest import ManualClock

NS = 1_000_000_000
MS = NS // 1000

Answer = tuple[int, dict[str, str]]


class Script:
    """A scripted API: *answers* in turn (the last one forever); the clock at each request
    and its method are recorded. A 200 carries ``usage`` for the tokens the request asked."""

    def __init__(self, clock: ManualClock, answers: list[Answer]) -> None:
        self.clock = clock
        self.answers = answers
        self.sent: list[tuple[str, int]] = []

    async def handle(self, request: web.Request) -> web.Response:
        status, headers = self.answers[min(len(self.sent), len(self.answers) - 1)]
        self.sent.append((request.method, self.clock()))
        body = await request.read()
        asked = json.loads(body)["tokens"] if request.content_type == "application/json" else 0
        usage = json.dumps({"usage": {"total_tokens": asked // 2}})
        return web.Response(
            status=status, headers=headers, text=usage, content_type="application/json"
        )


@asynccontextmanager
async def serving(script: Script) -> AsyncIterator[URL]:
    """The script's server on loopback, for the block: its root URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", script.handle)
    async with TestServer(app, host="127.0.0.1") as server:
        yield server.make_url("/")


def sleeper(clock: ManualClock, slept: list[float]) -> Callable[[float], Awaitable[None]]:
    """An ``async_sleep`` that moves *clock* and records each wait (s)."""

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(round(seconds * NS))

    return sleep


def limited(clock: ManualClock, slept: list[float], **kwargs: Any) -> ClientRateLimit:
    kwargs.setdefault("rate", 10)
    kwargs.setdefault("capacity", 5)
    return ClientRateLimit(clock=clock, async_sleep=sleeper(clock, slept), **kwargs)


async def call(
    session: aiohttp.ClientSession, url: URL, method: str = "GET", **kwargs: Any
) -> int | str:
    """The answer's status, or ``"timeout <ns>"`` when the limiter gives up first."""
    try:
        async with session.request(method, url, **kwargs) as response:
            await response.read()
            return response.status
    except RateLimitTimeout as err:
        return f"timeout {err.retry_after_ns}"


def run(
    answers: list[Answer],
    calls: list[tuple[str, dict[str, Any]]],
    clock: ManualClock,
    **kwargs: Any,
) -> tuple[list[int | str], list[float], list[tuple[str, int]], ClientRateLimit]:
    """*calls* (method, request keywords) through a session with a `ClientRateLimit`
    (*kwargs*) against a server answering *answers*: the outcomes, the sleeps, what
    the server saw and the middleware."""
    slept: list[float] = []
    script = Script(clock, answers)
    limit = limited(clock, slept, **kwargs)

    async def main() -> list[int | str]:
        async with serving(script) as url, aiohttp.ClientSession(middlewares=[limit]) as session:
            return [await call(session, url, method, **kw) for method, kw in calls]

    return asyncio.run(main()), slept, script.sent, limit


GET: tuple[str, dict[str, Any]] = ("GET", {})


# ------------------------------------------------------------------ pacing


def test_exact_pacing_per_key(clock: ManualClock) -> None:
    by_path = lambda request: request.url.path  # noqa: E731 - a key function
    calls = [("GET", {"path": p}) for p in ("a", "a", "b", "a")]
    slept: list[float] = []
    script = Script(clock, [(200, {})])
    limit = limited(clock, slept, rate=10, capacity=1, key=by_path)

    async def main() -> list[int | str]:
        async with serving(script) as url, aiohttp.ClientSession(middlewares=[limit]) as session:
            return [await call(session, url / kw["path"]) for _, kw in calls]

    assert asyncio.run(main()) == [200] * 4
    # /a at 0, again 0.1 s later; /b its own token at once; /a 0.1 s after its last.
    assert slept == [0.1, 0.1]
    assert [at for _, at in script.sent] == [0, 100 * MS, 100 * MS, 200 * MS]
    assert limit.limit("/a") == KeyLimit(10, 1, 0.0, known=True)


def test_the_default_key_is_the_host_and_port(clock: ManualClock) -> None:
    script = Script(clock, [(200, {"X-RateLimit-Limit": "3"})])
    limit = limited(clock, [])

    async def main() -> int | None:
        async with serving(script) as url, aiohttp.ClientSession(middlewares=[limit]) as session:
            assert await call(session, url) == 200
            return url.port

    port = asyncio.run(main())
    assert limit.limit(f"127.0.0.1:{port}") == KeyLimit(10, 3, 0.0, known=True)
    assert not limit.limit("127.0.0.1").known


def test_a_policy_is_learned_as_by_httpx(clock: ManualClock) -> None:
    policy = {"RateLimit-Policy": '"d";q=20;w=1', "RateLimit": '"d";r=19;t=1'}
    outcomes, _, sent, limit = run(
        [(200, policy)], [GET] * 3, clock, rate=500, capacity=50, key=lambda r: "api"
    )
    # 20 a second: 1 at once (a twentieth), then 19/s; the first request counts.
    assert outcomes == [200] * 3 and limit.limit("api")[:2] == (19, 1)
    assert [at for _, at in sent] == [0, 52_631_579, 105_263_158]


def test_a_wait_past_the_timeout_raises_and_sends_nothing(clock: ManualClock) -> None:
    outcomes, slept, sent, _ = run([(200, {})], [GET] * 2, clock, rate=1, capacity=1, timeout=0.25)
    assert outcomes == [200, f"timeout {NS}"] and len(sent) == 1 and slept == []


def test_the_timeout_error_is_aiohttps_timeout(clock: ManualClock) -> None:
    script = Script(clock, [(200, {})])
    limit = limited(clock, [], rate=1, capacity=1, timeout=0, key=lambda r: "api")

    async def main() -> None:
        async with serving(script) as url, aiohttp.ClientSession(middlewares=[limit]) as session:
            await call(session, url)
            await session.get(url / "x")

    with pytest.raises(aiohttp.ServerTimeoutError) as caught:
        asyncio.run(main())
    err = caught.value
    assert isinstance(err, RateLimitTimeout) and isinstance(err, aiohttp.ClientError)
    assert isinstance(err, asyncio.TimeoutError)
    assert (err.key, err.retry_after_ns, err.retry_after) == ("api", NS, 1.0)
    assert err.request_info is not None and err.request_info.url.path == "/x"
    assert err.request_info.method == "GET"


def test_a_full_line_is_refused_with_its_reason(clock: ManualClock) -> None:
    gate, held = asyncio.Event(), list[float]()

    async def hold(seconds: float) -> None:
        held.append(seconds)
        await gate.wait()
        clock.advance(round(seconds * NS))

    script = Script(clock, [(200, {})])
    limit = ClientRateLimit(
        rate=1, capacity=1, max_waiters=1, clock=clock, async_sleep=hold, key=lambda r: "k"
    )

    async def main() -> list[int | str]:
        async with serving(script) as url, aiohttp.ClientSession(middlewares=[limit]) as session:
            assert await call(session, url) == 200
            waiter = asyncio.ensure_future(call(session, url))
            while not held:  # it is in line, its sleep held open
                await asyncio.sleep(0.01)
            with pytest.raises(RateLimitTimeout, match="1 requests are already waiting"):
                await session.get(url)
            gate.set()
            return [await waiter]

    assert asyncio.run(main()) == [200]
    assert held == [1.0] and [at for _, at in script.sent] == [0, NS]


def first_sleep_never_ends(clock: ManualClock, slept: list[float]) -> Any:
    """An *async_sleep* whose first sleep never ends (its waiter is cancelled or timed
    out meanwhile); the others move *clock*. Every sleep is noted in *slept*."""
    forever = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 1:
            await forever.wait()
        clock.advance(round(seconds * NS))

    return sleep


def test_a_cancelled_waiter_gives_its_place_back(clock: ManualClock) -> None:
    slept: list[float] = []
    sleep = first_sleep_never_ends(clock, slept)
    script = Script(clock, [(200, {})])
    limit = ClientRateLimit(rate=1, capacity=1, clock=clock, async_sleep=sleep, key=lambda r: "k")

    async def main() -> list[int | str]:
        async with serving(script) as url, aiohttp.ClientSession(middlewares=[limit]) as session:
            first = await call(session, url)
            waiter = asyncio.ensure_future(call(session, url))
            while not slept:
                await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            return [first, await call(session, url)]

    assert asyncio.run(main()) == [200, 200]
    # The next one waits one token's time, not two: the cancelled one's place is free.
    assert slept == [1.0, 1.0] and [at for _, at in script.sent] == [0, NS]


def test_the_sessions_timeout_ends_a_wait_and_frees_its_place(clock: ManualClock) -> None:
    """aiohttp's ``ClientTimeout(total=...)`` cancels the middleware's wait: its caller
    gets aiohttp's timeout, and the next request waits as if it had never been in line."""
    slept: list[float] = []
    sleep = first_sleep_never_ends(clock, slept)
    script = Script(clock, [(200, {})])
    limit = ClientRateLimit(rate=1, capacity=1, clock=clock, async_sleep=sleep, key=lambda r: "k")

    async def main() -> list[int | str]:
        async with serving(script) as url, aiohttp.ClientSession(middlewares=[limit]) as session:
            first = await call(session, url)
            with pytest.raises(asyncio.TimeoutError) as caught:
                await session.get(url, timeout=aiohttp.ClientTimeout(total=0.05))
            assert not isinstance(caught.value, RateLimitTimeout)
            return [first, await call(session, url)]

    assert asyncio.run(main()) == [200, 200]
    assert slept == [1.0, 1.0] and [at for _, at in script.sent] == [0, NS]


def test_a_request_cancelled_while_out_is_not_in_flight(clock: ManualClock) -> None:
    arrived, release = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        arrived.set()
        await release.wait()
        return web.Response()

    limit = ClientRateLimit(rate=10, capacity=5, clock=clock, key=lambda r: "k")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/", slow)
        async with (
            TestServer(app, host="127.0.0.1") as server,
            aiohttp.ClientSession(middlewares=[limit]) as session,
        ):
            task = asyncio.ensure_future(session.get(server.make_url("/")))
            await arrived.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()

    asyncio.run(main())
    assert limit.pacer._keys["k"].inflight == 0


def test_a_connection_error_is_not_learned_from(clock: ManualClock) -> None:
    limit = ClientRateLimit(rate=10, capacity=5, clock=clock)

    async def main() -> None:
        app = web.Application()
        async with TestServer(app, host="127.0.0.1") as server:
            url = server.make_url("/")
        async with aiohttp.ClientSession(middlewares=[limit]) as session:
            await session.get(url)  # nothing listens there any more

    with pytest.raises(aiohttp.ClientConnectionError):
        asyncio.run(main())
    ((key, state),) = limit.pacer._keys.items()
    assert str(key).startswith("127.0.0.1:") and state.inflight == 0


def test_shared_makes_two_sessions_one_client(clock: ManualClock) -> None:
    store = nb.KeyedTokenBucket(rate=10, capacity=1, clock=clock)
    slept: list[float] = []
    limits = [limited(clock, slept, rate=100, capacity=10, shared=store) for _ in "ab"]
    script = Script(clock, [(200, {})])

    async def main() -> list[int | str]:
        async with serving(script) as url:
            outcomes = []
            for limit in limits + limits:
                async with aiohttp.ClientSession(middlewares=[limit]) as session:
                    outcomes.append(await call(session, url))
            return outcomes

    assert asyncio.run(main()) == [200] * 4
    # Each alone would send all four at once: together they keep the shared 10/s.
    assert [at for _, at in script.sent] == [0, 100 * MS, 200 * MS, 300 * MS]


# ---------------------------------------------------------------- retries


def test_a_429_is_paused_for_and_sent_again(clock: ManualClock) -> None:
    outcomes, slept, sent, _ = run(
        [(200, {}), (429, {"Retry-After": "2"}), (200, {})], [GET] * 2, clock,
        rate=10, capacity=1, retries=1,
    )  # fmt: skip
    assert outcomes == [200, 200] and slept == [0.1, 2.0]
    assert sent == [("GET", 0), ("GET", 100 * MS), ("GET", 2100 * MS)]


def test_retries_are_bounded_in_count(clock: ManualClock) -> None:
    outcomes, slept, sent, _ = run([(429, {"Retry-After": "1"})], [GET], clock, retries=2)
    assert outcomes == [429] and slept == [1.0, 1.0] and len(sent) == 3


def test_only_idempotent_methods_are_sent_again_unless_opted_in(clock: ManualClock) -> None:
    answers: list[Answer] = [(429, {"Retry-After": "1"}), (200, {})]
    post = ("POST", {"data": b"x"})
    outcomes, _, sent, _ = run(answers, [post], clock, retries=1)
    assert outcomes == [429] and len(sent) == 1
    outcomes, _, sent, _ = run(answers, [post], ManualClock(), retries=1, retry_methods=["post"])
    assert outcomes == [200] and sent == [("POST", 0), ("POST", NS)]
    put = ("PUT", {"json": {"tokens": 4}})
    outcomes, _, sent, _ = run(answers, [put], ManualClock(), retries=1)
    assert outcomes == [200] and len(sent) == 2  # JSON is bytes: sent twice


def test_a_streamed_body_is_never_sent_twice(clock: ManualClock) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"streamed"

    answers: list[Answer] = [(429, {"Retry-After": "1"}), (200, {})]
    outcomes, slept, sent, _ = run(answers, [("PUT", {"data": body()})], clock, retries=1)
    assert outcomes == [429] and len(sent) == 1 and slept == []


# ------------------------------------------------------------- LLM budgets


def openai(requests: tuple[int, int], tokens: tuple[int, int], reset: str) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": str(requests[0]),
        "x-ratelimit-remaining-requests": str(requests[1]),
        "x-ratelimit-reset-requests": reset,
        "x-ratelimit-limit-tokens": str(tokens[0]),
        "x-ratelimit-remaining-tokens": str(tokens[1]),
        "x-ratelimit-reset-tokens": reset,
    }


def estimate(request: Any) -> dict[str, int]:
    """The tokens a request asks for, from its JSON body (httpx's request or aiohttp's)."""
    if isinstance(request, httpx.Request):
        return {"tokens": json.loads(request.content)["tokens"]}
    return {"tokens": json.loads(request.body.decode())["tokens"]}


async def settle(response: Any) -> dict[str, int]:
    """What a 200 spent (its ``usage``), read from httpx's response or aiohttp's."""
    if response.status_code if isinstance(response, httpx.Response) else response.status != 200:
        return {}
    if isinstance(response, httpx.Response):
        return {"tokens": json.loads(await response.aread())["usage"]["total_tokens"]}
    return {"tokens": (await response.json())["usage"]["total_tokens"]}


DATE = "Wed, 21 Oct 2015 07:28:00 GMT"  # the server's clock in the scripts that send one


def anthropic(remaining: int, reset: str) -> dict[str, str]:
    """Anthropic's requests budget: 2 a window, *remaining* left until *reset* (RFC 3339)."""
    return {
        "anthropic-ratelimit-requests-limit": "2",
        "anthropic-ratelimit-requests-remaining": str(remaining),
        "anthropic-ratelimit-requests-reset": reset,
        "Date": DATE,
    }


LLM = [
    (200, openai((10, 9), (300, 100), "1s")),
    (200, openai((10, 8), (300, 0), "1s")),
    (200, openai((10, 9), (300, 250), "1s")),
]
ASK = [("POST", {"json": {"tokens": n}}) for n in (200, 100, 120)]


def test_both_budgets_are_kept_and_settle_reads_the_body(clock: ManualClock) -> None:
    settled: list[dict[str, int]] = []

    async def recorded(response: aiohttp.ClientResponse) -> dict[str, int]:
        settled.append(await settle(response))
        body = await response.json()  # still readable: the body is kept
        assert body["usage"]["total_tokens"] == settled[-1]["tokens"]
        return settled[-1]

    outcomes, slept, sent, _ = run(
        LLM, ASK, clock, rate=1000, capacity=100, estimate=estimate, settle=recorded
    )
    # 0 tokens left after the second: the third waits the budget's reset.
    assert outcomes == [200] * 3 and slept == [1.0]
    assert [at for _, at in sent] == [0, 0, NS] and settled == [
        {"tokens": n} for n in (100, 50, 60)
    ]


# ---------------------------------------------------------------- bad input


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"rate": 0, "capacity": 1}, ValueError, "rate"),
    ({"rate": 1, "capacity": 0}, ValueError, "capacity"),
    ({"rate": True, "capacity": 1}, TypeError, "rate"),
    ({"rate": 1, "capacity": 1, "retries": -1}, ValueError, "retries"),
    ({"rate": 1, "capacity": 1, "retry_budget": None}, ValueError, "retry_budget"),
    ({"rate": 1, "capacity": 1, "retry_methods": "GET"}, TypeError, "retry_methods"),
    ({"rate": 1, "capacity": 1, "key": "host"}, TypeError, "key"),
    ({"rate": 1, "capacity": 1, "timeout": -1}, ValueError, "timeout"),
    ({"rate": 1, "capacity": 1, "clock": 5}, TypeError, "clock"),
    ({"rate": 1, "capacity": 1, "max_keys": 0}, ValueError, "max_keys"),
    ({"rate": 1, "capacity": 1, "estimate": 5}, TypeError, "estimate"),
    ({"rate": 1, "capacity": 1, "settle": 5}, TypeError, "settle"),
    ({"rate": 1, "capacity": 1, "shared": object()}, TypeError, "shared"),
    (
        {"rate": 1, "capacity": 1, "time_out": 5},
        TypeError,
        "unexpected keyword argument 'time_out'",
    ),
    ({"rate": 1, "capacity": 1, "sleep": print}, TypeError, "unexpected keyword argument 'sleep'"),
]


@pytest.mark.parametrize(("kwargs", "kind", "match"), BAD, ids=[str(b[0]) for b in BAD])
def test_bad_keywords_are_refused_as_by_httpx(
    kwargs: dict[str, Any], kind: type[Exception], match: str
) -> None:
    with pytest.raises(kind, match=match) as ours:
        ClientRateLimit(**kwargs)
    with pytest.raises(kind) as theirs:
        AsyncRateLimitedTransport(httpx.MockTransport(lambda r: httpx.Response(200)), **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_the_rate_and_capacity_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        ClientRateLimit(10, 5)  # type: ignore[call-arg]


# ------------------------------------------------------------ the same as httpx


async def through_httpx(url: URL, calls: list[tuple[str, dict[str, Any]]], **kwargs: Any) -> Any:
    transport = AsyncRateLimitedTransport(httpx.AsyncHTTPTransport(), **kwargs)
    outcomes: list[int | str] = []
    async with httpx.AsyncClient(transport=transport) as client:
        for method, kw in calls:
            try:
                outcomes.append((await client.request(method, str(url), **kw)).status_code)
            except nanobucket.httpx.RateLimitTimeout as err:
                outcomes.append(f"timeout {err.retry_after_ns}")
    key = nanobucket.httpx.host_key(httpx.Request("GET", str(url)))
    return outcomes, transport.limit(key)


async def through_aiohttp(url: URL, calls: list[tuple[str, dict[str, Any]]], **kwargs: Any) -> Any:
    limit = ClientRateLimit(**kwargs)
    async with aiohttp.ClientSession(middlewares=[limit]) as session:
        outcomes = [await call(session, url, method, **kw) for method, kw in calls]
    return outcomes, limit.limit(f"{url.host}:{url.port}")


SCRIPTS: dict[str, tuple[list[Answer], list[tuple[str, dict[str, Any]]], dict[str, Any]]] = {
    "retry-after": (
        [(200, {}), (429, {"Retry-After": "2"}), (200, {}), (503, {"Retry-After": "1"})],
        [GET] * 4,
        {"rate": 10, "capacity": 1, "retries": 1},
    ),
    "policy": (
        [
            (200, {"RateLimit-Policy": '"d";q=10;w=1', "RateLimit": f'"d";r={r};t=1'})
            for r in (9, 8, 7, 6, 5, 0)
        ],
        [GET] * 7,
        {"rate": 100, "capacity": 10},
    ),
    "x-ratelimit": (
        [
            (
                200,
                {
                    "X-RateLimit-Limit": "3",
                    "X-RateLimit-Remaining": str(r),
                    "X-RateLimit-Reset": "2",
                },
            )
            for r in (2, 1, 0, 2, 1)
        ],
        [GET] * 6,
        {"rate": 50, "capacity": 5},
    ),
    "post-not-retried": (
        [(429, {"Retry-After": "1"}), (200, {})],
        [("POST", {"json": {"tokens": 1}}), GET],
        {"rate": 10, "capacity": 5, "retries": 3},
    ),
    "timeout": (
        [(429, {"Retry-After": "60"}), (200, {})],
        [GET, GET, GET],
        {"rate": 10, "capacity": 5, "timeout": 30},
    ),
    "llm": (LLM, ASK, {"rate": 1000, "capacity": 100, "estimate": estimate, "settle": settle}),
    "anthropic": (
        [(200, anthropic(remaining, "2015-10-21T07:28:02Z")) for remaining in (1, 0, 1)],
        [GET] * 4,
        {"rate": 100, "capacity": 10},
    ),
    "dates": (
        [
            (429, {"Retry-After": "Wed, 21 Oct 2015 07:28:03 GMT", "Date": DATE}),
            (
                200,
                {
                    "X-RateLimit-Limit": "5",
                    "X-RateLimit-Remaining": "0",
                    "X-RateLimit-Reset": "1445412482",
                    "Date": DATE,
                },
            ),
        ],
        [GET] * 3,
        {"rate": 100, "capacity": 10, "retries": 1},
    ),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_same_answers_give_what_the_httpx_transport_gives(name: str) -> None:
    answers, calls, kwargs = SCRIPTS[name]
    seen = []
    for through in (through_httpx, through_aiohttp):
        clock, slept = ManualClock(), list[float]()
        script = Script(clock, answers)

        async def main(through: Any = through, script: Script = script) -> Any:
            async with serving(script) as url:
                return await through(
                    url, calls, clock=clock, async_sleep=sleeper(clock, slept), **kwargs
                )

        outcomes, limit = asyncio.run(main())
        seen.append((outcomes, slept, script.sent, limit))
    assert seen[0] == seen[1]
    assert len(set(map(str, seen[1][0]))) > 1 or seen[1][1]  # the script made a difference


# -------------------------------------------------------------- the default key


class Stop(Exception):
    """Raised by the recording middleware: nothing is sent."""


async def keys_through_aiohttp(urls: list[str]) -> list[str | None]:
    """`host_key` of the ``ClientRequest`` aiohttp makes for each URL (None: refused)."""
    keys: list[str | None] = []

    async def record(request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
        keys.append(host_key(request))
        raise Stop

    async with aiohttp.ClientSession(middlewares=[record]) as session:
        for url in urls:
            try:
                await session.get(url)
            except Stop:
                continue
            except (ValueError, aiohttp.InvalidURL):
                keys.append(None)
    return keys


def httpx_key(url: str) -> str | None:
    try:
        return nanobucket.httpx.host_key(httpx.Request("GET", url))
    except (httpx.InvalidURL, UnicodeError, ValueError):
        return None


_LETTERS = string.ascii_letters + string.digits + "_"
ascii_labels = st.text(_LETTERS, min_size=1, max_size=8) | st.builds(
    lambda a, b: f"{a}-{b}",
    st.text(_LETTERS, min_size=1, max_size=4),
    st.text(_LETTERS, min_size=1, max_size=4),
)
idna_labels = st.sampled_from(
    ["пример", "münchen", "ß", "bücher", "日本", "xn--e1afmkfd", "XN--mnchen-3ya", "xn--zca"]
)
names = st.builds(
    lambda labels, dot: ".".join(labels) + dot,
    st.lists(ascii_labels | idna_labels, min_size=1, max_size=3),
    st.sampled_from(["", "."]),
)
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(lambda a: f"[{a.compressed}]")  # as yarl writes it
ports = st.sampled_from(["", ":80", ":443", ":0080", ":8443"]) | st.integers(1, 65535).map(
    lambda p: f":{p}"
)
urls = st.builds(
    lambda scheme, user, host, port, path: f"{scheme}://{user}{host}{port}{path}",
    st.sampled_from(["http", "https"]),  # see the test below for "HTTP"
    st.sampled_from(["", "user@", "u:p@"]),
    names | ipv4 | ipv6,
    ports,
    st.sampled_from(["", "/", "/a/b?q=1", "/x#frag"]),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(urls, min_size=1, max_size=8))
def test_the_default_key_is_httpxs_for_the_same_url(batch: list[str]) -> None:
    expected = [httpx_key(url) for url in batch]
    assume(any(key is not None for key in expected))
    ours = asyncio.run(keys_through_aiohttp(batch))
    assert [o for o, e in zip(ours, expected, strict=True) if e is not None] == [
        e for e in expected if e is not None
    ]


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("https://API.Example.com:443/x", "api.example.com"),
        ("http://api.example.com:443/", "api.example.com:443"),
        ("http://127.0.0.1:8000/", "127.0.0.1:8000"),
        ("http://[::1]:8080/", "::1:8080"),
        ("http://пример.рф/", "пример.рф"),
        ("http://xn--e1afmkfd.xn--p1ai:81/", "пример.рф:81"),
        ("http://www.пример.рф/", "www.xn--e1afmkfd.xn--p1ai"),
    ],
)
def test_the_default_key_examples(url: str, key: str) -> None:
    assert asyncio.run(keys_through_aiohttp([url])) == [key] == [httpx_key(url)]


def test_a_scheme_not_in_lower_case_keeps_the_default_port_in_httpx_only() -> None:
    """The one difference: httpx drops a default port only after a lower-case scheme;
    yarl lower-cases the scheme first, so aiohttp's request names no port."""
    urls = ["HTTP://api.example.com:80/", "Https://api.example.com:443/"]
    assert [httpx_key(url) for url in urls] == ["api.example.com:80", "api.example.com:443"]
    assert asyncio.run(keys_through_aiohttp(urls)) == ["api.example.com"] * 2


def test_no_private_attribute_of_aiohttp_is_read() -> None:
    """The client adapter reads aiohttp's objects through their public names only."""
    import ast
    import inspect

    import nanobucket.aiohttp as module

    tree = ast.parse(inspect.getsource(module))
    private = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and isinstance(node.value, ast.Name)
        and node.value.id in {"request", "response", "url", "body", "aiohttp", "handler"}
    }
    assert private == set()

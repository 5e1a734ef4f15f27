"""`nanobucket.testing`: the manual clock every limiter a test builds reads, and limits off.

The clock on both implementations (``impl``) and the shared-memory table; the
switch through the real frameworks (Starlette behind the ASGI middleware,
Flask behind the WSGI one, FastAPI's dependency), the
gate every other integration uses, and ``@limit``; the fixtures through a
pytest run of their own (``pytester``).
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from types import ModuleType
from typing import Any

import pytest
from fastapi import Depends, FastAPI
from flask import Flask
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

import nanobucket as nb
from nanobucket._compose import switch
from nanobucket._http import ENVIRON, Gate
from nanobucket.asgi import RateLimitMiddleware
from nanobucket.fastapi import RateLimit
from nanobucket.testing import FakeClock, disabled, use_clock
from nanobucket.wsgi import RateLimitMiddleware as WsgiMiddleware

from http_checks import MakeClient, asgi_client

__all__ = ("asgi_client",)  # a fixture, used by name

pytest_plugins = ["pytester"]

S = 1_000_000_000
NOT_A_CLOCK: Any = 42
#: The package's own directory's parent, first on a child process's path (this checkout's).
SRC = os.path.dirname(os.path.dirname(nb.__file__))


def _child_path() -> str:
    return os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])])


# -- the manual clock


def test_limiters_built_in_the_block_read_the_manual_clock(impl: ModuleType) -> None:
    with use_clock() as clock:
        assert isinstance(clock, FakeClock)
        bucket = impl.TokenBucket(rate=1, capacity=2)
        table = impl.KeyedTokenBucket(rate=2, capacity=1)
    assert [bucket.allow() for _ in range(3)] == [True, True, False]
    assert [table.allow("a"), table.allow("a"), table.allow("b")] == [True, False, True]
    assert bucket.check().retry_after_ns == S
    clock.advance(0.5)
    assert (bucket.allow(), table.allow("a"), table.allow("a")) == (False, True, False)
    clock.advance(0.5)
    assert (bucket.allow(), bucket.allow()) == (True, False)
    assert (bucket.clock_ns(), table.clock_ns()) == (S, S)


def test_a_limiter_built_outside_or_with_its_own_clock_keeps_it(impl: ModuleType) -> None:
    before = time.monotonic_ns()
    outside = impl.TokenBucket(rate=1, capacity=1)
    with use_clock(FakeClock(start_ns=5 * S)):
        own = impl.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 7)
        inside = impl.TokenBucket(rate=1, capacity=1)
    after = impl.TokenBucket(rate=1, capacity=1)
    assert before <= outside.clock_ns() <= time.monotonic_ns()
    assert before <= after.clock_ns() <= time.monotonic_ns()
    assert (own.clock_ns(), inside.clock_ns()) == (7, 5 * S)


def test_blocks_nest_and_restore_the_clock_they_found(impl: ModuleType) -> None:
    with use_clock(FakeClock(1)) as outer:
        with use_clock(FakeClock(2)):
            inner_bucket = impl.TokenBucket(rate=1, capacity=1)
        outer_bucket = impl.TokenBucket(rate=1, capacity=1)
    assert outer() == 1
    assert (inner_bucket.clock_ns(), outer_bucket.clock_ns()) == (2, 1)


@pytest.mark.c_extension
def test_the_shared_memory_table_reads_the_manual_clock() -> None:
    pytest.importorskip("nanobucket._core._shared_c")
    with use_clock() as clock:
        table = nb.SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=1)
    try:
        assert (table.allow("a"), table.allow("a")) == (True, False)
        assert isinstance(clock, FakeClock)
        clock.advance_ns(S - 1)
        assert table.allow("a") is False
        clock.advance_ns(1)
        assert table.allow("a") is True
    finally:
        table.close()


def test_advance_rounds_to_the_nearest_ns_and_takes_any_real() -> None:
    from decimal import Decimal
    from fractions import Fraction

    clock = FakeClock()
    clock.advance(0.1)
    assert clock() == 100_000_000
    clock.advance(Fraction(2, 3))
    assert clock() == 766_666_667
    clock.advance(Decimal("0.000000001"))
    clock.advance(2)
    assert clock() == 2_766_666_668
    assert repr(clock) == "FakeClock(now_ns=2766666668)"


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda c: c.advance(True), TypeError, "seconds must be a real number, not bool"),
        (lambda c: c.advance("1"), TypeError, "seconds must be a real number, not str"),
        (lambda c: c.advance(math.nan), ValueError, "seconds must be finite, got nan"),
        (lambda c: c.advance(math.inf), ValueError, "seconds must be finite, got inf"),
        (lambda c: c.advance(-1), ValueError, "only moves forward: seconds must be >= 0, got -1"),
        (lambda c: c.advance_ns(1.0), TypeError, "ns must be an int, not float"),
        (lambda c: c.advance_ns(-1), ValueError, "only moves forward: ns must be >= 0, got -1"),
        (lambda c: c.advance_ns(1 << 62), ValueError, "the clock would pass 2**62 ns"),
        (lambda c: FakeClock(-1), ValueError, "now must be in [0, 2**62) ns, got -1"),
        (lambda c: use_clock(NOT_A_CLOCK).__enter__(), TypeError, "clock must be a callable"),
    ],
)
def test_bad_input_to_the_clock(call: Any, error: type[Exception], message: str) -> None:
    clock = FakeClock()
    with pytest.raises(error) as caught:
        call(clock)
    assert message in str(caught.value)
    assert clock() == 0
    assert nb.TokenBucket(rate=1, capacity=1).clock_ns() > 0  # the default clock is untouched


# -- limits off


def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def test_disabled_asgi_middleware_admits_without_deciding(
    impl: ModuleType, asgi_client: MakeClient
) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)
    app = RateLimitMiddleware(Starlette(routes=[StarletteRoute("/", _hello)]), limiter)
    client = asgi_client(app)
    with disabled():
        responses = [client.get("/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert [r.headers.get("ratelimit") for r in responses] == [None, None, None]
    assert app.counters.snapshot()["admitted"] == 0
    assert limiter.peek("127.0.0.1", 0).remaining == 1  # nothing was spent
    assert [client.get("/").status_code for _ in range(2)] == [200, 429]  # on again


def test_disabled_wsgi_middleware_admits_without_deciding(impl: ModuleType) -> None:
    flask = Flask(__name__)
    flask.add_url_rule("/", "index", lambda: "hello")
    limiter = impl.TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    flask.wsgi_app = WsgiMiddleware(flask.wsgi_app, limiter)  # type: ignore[method-assign]
    client = flask.test_client()
    client.environ_base["REMOTE_ADDR"] = "127.0.0.1"
    with disabled():
        responses = [client.get("/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert ["ratelimit" in r.headers for r in responses] == [False, False, False]
    assert limiter.tokens() == 1.0
    assert [client.get("/").status_code for _ in range(2)] == [200, 429]


def test_disabled_fastapi_dependency_reads_no_key(
    impl: ModuleType, asgi_client: MakeClient
) -> None:
    keys: list[str] = []

    def user() -> str:
        return "alice"

    def key(name: str = Depends(user)) -> str:
        keys.append(name)
        return name

    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)
    app = FastAPI()

    @app.get("/", dependencies=[Depends(RateLimit(limiter, key=key))])
    async def root() -> str:
        return "ok"

    client = asgi_client(app)
    with disabled():
        responses = [client.get("/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert ["ratelimit" in r.headers for r in responses] == [False, False, False]
    assert keys == []
    assert [client.get("/").status_code for _ in range(2)] == [200, 429]
    assert keys == ["alice", "alice"]


def test_disabled_gate_is_what_django_and_drf_decide_through(impl: ModuleType) -> None:
    gate = Gate(ENVIRON, impl.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0))
    environ = {"REMOTE_ADDR": "1.2.3.4", "PATH_INFO": "/"}
    with disabled():
        assert gate.decide(environ) == (True, None, (), None, None)
        assert asyncio.run(gate.decide_async(environ)) == (True, None, (), None, None)
    assert gate.counters.snapshot()["admitted"] == 0
    assert [gate.decide(environ)[0], gate.decide(environ)[0]] == [True, False]


def test_disabled_limit_decorator_calls_through(impl: ModuleType) -> None:
    bucket = impl.TokenBucket(rate=1, capacity=1, clock=lambda: 0)

    @nb.limit(bucket)
    def ping() -> str:
        return "pong"

    @nb.limit(bucket)
    async def aping() -> str:
        return "apong"

    with disabled():
        assert [ping() for _ in range(3)] == ["pong"] * 3
        assert [asyncio.run(aping()) for _ in range(3)] == ["apong"] * 3
    assert bucket.tokens() == 1.0
    assert ping() == "pong"
    with pytest.raises(nb.RateLimited):
        asyncio.run(aping())


def test_a_limiter_called_directly_still_counts_while_disabled(impl: ModuleType) -> None:
    bucket = impl.TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    with disabled():
        assert (bucket.allow(), bucket.allow()) == (True, False)


def test_disabled_blocks_nest_and_restore() -> None:
    assert switch.off is False
    with disabled():
        with disabled():
            assert switch.off is True
        assert switch.off is True
    assert switch.off is False
    with pytest.raises(TypeError, match="flag must be a bool, not int"):
        switch.turn_off(1)


@pytest.mark.parametrize(("value", "off"), [("1", True), ("yes", True), ("0", False), ("", False)])
def test_the_environment_variable_turns_limits_off_for_the_process(value: str, off: bool) -> None:
    env = {**os.environ, "NANOBUCKET_DISABLED": value, "PYTHONPATH": _child_path()}
    code = (
        "import nanobucket as nb; from nanobucket._compose import switch; "
        "print(switch.off, nb.__file__)"
    )
    argv = [sys.executable, "-c", code]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert (out.returncode, out.stdout) == (0, f"{off} {nb.__file__}\n")


# -- the pytest fixtures, in a run of their own


def test_the_fixtures_as_a_plugin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", _child_path())
    pytester.makeconftest('pytest_plugins = ["nanobucket.testing"]\n')
    pytester.makepyfile(
        """
        import nanobucket as nb

        def test_clock(fake_clock):
            bucket = nb.TokenBucket(rate=1, capacity=1)
            assert [bucket.allow(), bucket.allow()] == [True, False]
            fake_clock.advance(1)
            assert bucket.allow() is True

        def test_off(limits_disabled):
            @nb.limit(nb.TokenBucket(rate=1, capacity=1))
            def ping():
                return "pong"
            assert [ping(), ping()] == ["pong", "pong"]

        def test_after():
            from nanobucket._compose import switch
            assert switch.off is False
            assert nb.TokenBucket(rate=1, capacity=1).clock_ns() > 0
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=3)

"""Under ``all_of`` (and a ``tiered`` layer in one) every number of a decision comes from
one bucket, the binding one: in process (`LayeredDecision`) and in the header fields,
``Retry-After`` and the 429 body of the middlewares; its name is the user's where given.

The scenario is the case study's pair of limits: one bucket per client (100 a minute,
bursts of 100) and one for the whole app (20/s). A client sends 15 requests at 15/s,
rests 1.5 s and sends one more: the app's bucket (19 left, full in 0.05 s) binds, not the
client's (88 left, full in 7.2 s). Times come from an injected clock; both implementations.
"""

from __future__ import annotations

import json
from fractions import Fraction
from types import ModuleType
from typing import Any

import pytest
from flask import Flask
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

import nanobucket as nb
from nanobucket.asgi import RateLimitMiddleware as AsgiMiddleware
from nanobucket.wsgi import RateLimitMiddleware as WsgiMiddleware

from conftest import ManualClock
from http_checks import MakeClient, asgi_client

__all__ = ("asgi_client",)  # a fixture, used by name

S = 1_000_000_000
REST = 14 * S // 15 + 3 * S // 2  # the 16th request: 1.5 s after the 15th
AT_15_PER_S = [i * S // 15 for i in range(15)]


def layers(impl: ModuleType, clock: ManualClock, **names: Any) -> nb.AllOf:
    per_client = impl.KeyedTokenBucket(rate=Fraction(100, 60), capacity=100, clock=clock)
    app = impl.TokenBucket(rate=20, capacity=20, clock=clock)
    return nb.all_of(per_client, app, **names)


def numbers(d: Any) -> tuple[bool, int, int, int, int]:
    return (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)


# -- in process ---------------------------------------------------------------


def test_the_decision_is_the_binding_layers_own(impl: ModuleType, clock: ManualClock) -> None:
    limit = layers(impl, clock)
    for at in AT_15_PER_S:
        clock.now = at
        assert limit.allow("alice")
    clock.now = REST
    d = limit.check("alice")
    assert [numbers(x) for x in d.decisions] == [
        (True, 88, 0, 7_166_666_667, 100),  # the client's: 0.6 s a token
        (True, 19, 0, S // 20, 20),  # the app's: one spent, 0.05 s a token
    ]
    # The app's binds (fewest left), and every number is its own: it was
    # (True, 19, 0, 7_166_666_667, 20), the reset the client's.
    assert (d.layer, numbers(d)) == (1, (True, 19, 0, S // 20, 20))
    assert numbers(limit.peek_at("alice", REST)) == (True, 18, 0, S // 10, 20)  # one more
    # Emptied by 19 more, the app's refuses: its wait, its numbers.
    assert all(limit.allow("alice") for _ in range(19))
    d = limit.check("alice")
    assert (d.layer, numbers(d)) == (1, (False, 0, S // 20, S, 20))
    assert numbers(d.decisions[0])[:2] == (True, 68)  # the client's would admit


def test_ties_go_to_the_longest_reset(impl: ModuleType) -> None:
    # Admitted: one token left in each; the slower bucket is full last.
    fast, slow = impl.TokenBucket(rate=10, capacity=2), impl.TokenBucket(rate=1, capacity=2)
    d = nb.all_of(fast, slow).check_at(None, 0)
    assert (d.layer, numbers(d)) == (1, (True, 1, 0, S, 2))
    # Refused: both due again in 1 s; the one with more to refill binds.
    small, large = impl.TokenBucket(rate=1, capacity=1), impl.TokenBucket(rate=1, capacity=2)
    assert small.allow_at(0) and large.allow_at(0, cost=2)
    d = nb.all_of(small, large).check_at(None, 0)
    assert (d.layer, numbers(d)) == (1, (False, 0, S, 2 * S, 2))
    assert numbers(nb.all_of(large, small).peek_at(None, 0)) == (False, 0, S, 2 * S, 2)


def test_a_nested_all_of_binds_its_own_binding_layer(impl: ModuleType) -> None:
    a, b = impl.TokenBucket(rate=1, capacity=4), impl.TokenBucket(rate=2, capacity=2)
    c = impl.TokenBucket(rate=10, capacity=10)
    limit = nb.all_of(c, nb.all_of(a, b, names=("a", "b")), names=("c", None))
    d = limit.check_at(None, 0)
    assert (d.layer, d.decisions[1].layer, numbers(d)) == (1, 1, (True, 1, 0, S // 2, 2))
    assert limit.binding(d) == ("b", b)
    assert limit.leaf_names() == ("c", "a", "b")


def test_layer_names_are_checked_when_the_all_of_is_built(impl: ModuleType) -> None:
    a, b = impl.KeyedTokenBucket(rate=1, capacity=1), impl.TokenBucket(rate=1, capacity=1)
    assert nb.all_of(a, b, names=["client", None]).names == ("client", None)
    assert nb.all_of(a, b).names == (None, None)
    with pytest.raises(TypeError, match="names must be a sequence of layer names"):
        nb.all_of(a, b, names="ab")
    with pytest.raises(TypeError, match="names must be a sequence of layer names"):
        nb.all_of(a, b, names=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="names has 1 names for 2 layers"):
        nb.all_of(a, b, names=("client",))
    for bad in ("", 'say "hi"', "back\\slash", "caf\u00e9", "tab\t", 7):
        with pytest.raises(ValueError, match="a layer name must be a non-empty string"):
            nb.all_of(a, b, names=(bad, "app"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="two buckets of this all_of are named 'x'"):
        nb.all_of(a, b, names=("x", "x"))
    free = impl.KeyedTokenBucket(rate=1, capacity=1)
    plans = nb.tiered({"free": free}, tier=lambda key: "free")
    with pytest.raises(ValueError, match="names its own buckets"):
        nb.all_of(plans, b, names=("plans", "app"))
    with pytest.raises(ValueError, match="named 'free'"):  # the plan's name, taken
        nb.all_of(plans, b, names=(None, "free"))
    assert nb.all_of(plans, b, names=(None, "app")).leaf_names() == ("free", "app")
    assert repr(nb.all_of(b, names=("app",))).endswith(", names=('app',))")


# -- through the middlewares ----------------------------------------------------


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def asgi(limiter: Any, **options: Any) -> AsgiMiddleware:
    return AsgiMiddleware(Starlette(routes=[StarletteRoute("/", _hello)]), limiter, **options)


def wsgi(limiter: Any, **options: Any) -> Any:
    app = Flask("nanobucket_binding")
    app.add_url_rule("/", "hello", lambda: "hello")
    app.wsgi_app = WsgiMiddleware(app.wsgi_app, limiter, **options)  # type: ignore[method-assign]
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = "10.0.0.1"
    return client


FIELDS = ("ratelimit-policy", "ratelimit", "retry-after")
LEGACY = ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "retry-after")


def scenario(get: Any, clock: ManualClock, names: tuple[str, ...]) -> list[Any]:
    """The 16th request's fields, then the refusal after 19 more: (status, *names)."""
    for at in AT_15_PER_S:
        clock.now = at
        assert get().status_code == 200
    clock.now = REST
    seen = [get()]
    seen += [get() for _ in range(20)]
    assert [r.status_code for r in seen] == [200] * 20 + [429]
    return [(r.status_code, *(r.headers.get(n) for n in names)) for r in (seen[0], seen[-1])]


@pytest.mark.parametrize("server", ["asgi", "wsgi"])
def test_the_fields_are_the_binding_layers(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient, server: str
) -> None:
    def client(limiter: Any, **options: Any) -> Any:
        if server == "asgi":
            return asgi_client(asgi(limiter, **options), "10.0.0.1").get
        return wsgi(limiter, **options).get

    get = client(layers(impl, clock))
    # It sent '"default-1";q=20;w=1' with '"default-1";r=19;t=8': t was the client's bucket's.
    assert scenario(get, clock, FIELDS) == [
        (200, '"default:shared";q=20;w=1', '"default:shared";r=19;t=1', None),
        (429, '"default:shared";q=20;w=1', '"default:shared";r=0;t=1', "1"),
    ]
    clock.now = 0
    get = client(layers(impl, clock), headers="legacy")
    assert scenario(get, clock, LEGACY) == [
        (200, "20", "19", "1", None),
        (429, "20", "0", "1", "1"),
    ]
    # Named where the limits are built: the names a client reads.
    clock.now = 0
    get = client(layers(impl, clock, names=("per-client", "app")))
    assert scenario(get, clock, FIELDS) == [
        (200, '"app";q=20;w=1', '"app";r=19;t=1', None),
        (429, '"app";q=20;w=1', '"app";r=0;t=1', "1"),
    ]
    body = json.loads(get().text)
    assert body["detail"] == "Rate limit 'app' exceeded; retry after 1 s."
    assert body["retry_after"] == 1


def test_two_unnamed_layers_of_one_kind_are_numbered(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient
) -> None:
    # 100/s with bursts of 200 AND 3000 a minute, per client: numbered as given.
    burst = impl.KeyedTokenBucket(rate=100, capacity=200, clock=clock)
    minute = impl.KeyedTokenBucket(rate=50, capacity=3000, clock=clock)
    get = asgi_client(asgi(nb.all_of(minute, burst), name="api")).get
    r = get()
    assert r.headers["ratelimit-policy"] == '"api:per-key-2";q=200;w=2'
    assert r.headers["ratelimit"] == '"api:per-key-2";r=199;t=1'


@pytest.mark.parametrize("server", ["asgi", "wsgi"])
def test_a_tiered_layer_binds_by_its_plan_and_the_app_by_its_own(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient, server: str
) -> None:
    free = impl.KeyedTokenBucket(rate=Fraction(100, 60), capacity=100, clock=clock)
    pro = impl.KeyedTokenBucket(rate=100, capacity=1000, clock=clock)
    plans = nb.tiered({"free": free, "pro": pro}, tier=lambda ip: "free")
    app = impl.TokenBucket(rate=20, capacity=20, clock=clock)
    limiter = nb.all_of(plans, app, names=(None, "app"))
    get = asgi_client(asgi(limiter), "10.0.0.1").get if server == "asgi" else wsgi(limiter).get
    assert scenario(get, clock, FIELDS) == [
        (200, '"app";q=20;w=1', '"app";r=19;t=1', None),
        (429, '"app";q=20;w=1', '"app";r=0;t=1', "1"),
    ]
    # The plan binds once its bucket holds fewer than the app's: its own numbers.
    clock.advance(S)  # the app's is full again; the client's holds 69 + 1.67
    assert free.allow_at("10.0.0.1", clock(), cost=60)
    r = get()
    assert (r.headers["ratelimit-policy"], r.headers["ratelimit"]) == (
        '"free";q=100;w=60',
        '"free";r=9;t=55',
    )

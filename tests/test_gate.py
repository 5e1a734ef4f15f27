"""The gate alone: `Gate.decide` and `decide_async` driven through a fake view, no framework.

Exact outcomes ``(admitted, decision, headers, body, due)``, counters and
hook events for one bucket, an ``all_of`` (each layer named by its place),
a ``tiered`` limiter (named by the plan), shadow mode, routes, ``charge=``,
threads, and an asyncio limiter; the hot case `decide` takes in a few steps
agrees with the one that takes every step.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest

import nanobucket as nb
from nanobucket._http import EXEMPT, Gate, Outcome, Route, header, route
from nanobucket.hooks import LimitEvent

from conftest import ManualClock, run_threads
from http_checks import PROBLEM_429_1S, AsyncRecorder, counts

S = 1_000_000_000


@dataclass
class Request:
    """A request of no framework: what the fake view reads."""

    path: str = "/"
    method: str = "GET"
    peer: str = "10.0.0.1"
    headers: dict[str, str] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


class FakeView:
    """The `View` of a `Request`: every method reads one attribute."""

    def method(self, request: Request) -> str:
        return request.method

    def path(self, request: Request) -> str:
        return request.path

    def peer(self, request: Request) -> str:
        return request.peer

    def header(self, request: Request, name: str) -> str | None:
        return request.headers.get(name)

    app_header = header

    def note(self, request: Request, name: str, value: object) -> None:
        request.notes[name] = value

    def noted(self, request: Request, name: str) -> Any:
        return request.notes.get(name)


VIEW = FakeView()


def problem(name: str, seconds: int) -> bytes:
    """The 429 body naming *name*, due again in *seconds*."""
    detail = f"Rate limit {name!r} exceeded; retry after {seconds} s."
    doc = {**PROBLEM_429_1S, "detail": detail, "retry_after": seconds}
    return json.dumps(doc, separators=(",", ":")).encode()


def refusal(body: bytes, seconds: int, *fields: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """The headers of a 429 with *body*, ``Retry-After: seconds`` and *fields*."""
    return [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(seconds).encode()),
        *fields,
    ]


def shown(outcome: Outcome) -> tuple[bool, tuple[Any, ...], list[tuple[bytes, bytes]], Any]:
    """*outcome* with its decision's five fields, comparable as a whole."""
    admitted, d, fields, body, due = outcome
    five = (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)
    return admitted, five, list(fields), (body, due)


def two_then_refused() -> list[tuple[bool, tuple[Any, ...], list[tuple[bytes, bytes]], Any]]:
    """`shown` outcomes of three requests at one instant to a bucket of 2 at 1/s."""
    policy = (b"ratelimit-policy", b'"default";q=2;w=2')
    body = problem("default", 1)
    return [
        (True, (True, 1, 0, S, 2), [policy, (b"ratelimit", b'"default";r=1;t=1')], (None, None)),
        (
            True,
            (True, 0, 0, 2 * S, 2),
            [policy, (b"ratelimit", b'"default";r=0;t=2')],
            (None, None),
        ),
        (
            False,
            (False, 0, S, 2 * S, 2),
            refusal(body, 1, policy, (b"ratelimit", b'"default";r=0;t=2')),
            (body, None),
        ),
    ]


def test_one_bucket_admits_then_refuses_exactly(impl: ModuleType, clock: ManualClock) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    gate = Gate(VIEW, limiter)
    assert gate.awaits is False
    got = [shown(gate.decide(Request())) for _ in range(3)]
    assert got == two_then_refused()
    assert gate.counters.snapshot() == counts(admitted=2, limited=1, shadow_limited=0, exempt=0)
    # Another peer has its own bucket; one the adapter hands over is the one keyed.
    assert gate.decide(Request(peer="10.0.0.2"))[1].remaining == 1
    assert gate.decide(Request(peer="nobody"), "10.0.0.3")[1].remaining == 1
    assert gate.decide(Request(peer="2001:db8::1"))[1].remaining == 1  # keyed by its /64
    assert gate.decide(Request(peer="2001:db8::2"))[1].remaining == 0


def test_legacy_and_off_fields(impl: ModuleType, clock: ManualClock) -> None:
    legacy = Gate(VIEW, impl.KeyedTokenBucket(rate=2, capacity=5, clock=clock), headers="legacy")
    assert list(legacy.decide(Request())[2]) == [
        (b"x-ratelimit-limit", b"5"),
        (b"x-ratelimit-remaining", b"4"),
        (b"x-ratelimit-reset", b"1"),
    ]
    off = Gate(VIEW, impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock), headers="off")
    assert off.decide(Request())[2] == ()
    admitted, _, fields, body, _ = off.decide(Request())
    assert (admitted, fields, body) == (
        False,
        refusal(problem("default", 1), 1),
        problem("default", 1),
    )


def test_the_hot_case_and_every_step_agree(impl: ModuleType) -> None:
    # A hook takes the gate off its hot case: the outcomes must not change.
    events: list[LimitEvent] = []
    clocks = ManualClock(), ManualClock()
    hot = Gate(VIEW, impl.KeyedTokenBucket(rate=1, capacity=3, clock=clocks[0]))
    every = Gate(
        VIEW, impl.KeyedTokenBucket(rate=1, capacity=3, clock=clocks[1]), on_decision=events.append
    )
    for step in range(6):
        assert shown(hot.decide(Request())) == shown(every.decide(Request())), step
        for c in clocks:
            c.advance(S // 3)
    assert hot.counters.snapshot() == every.counters.snapshot()
    assert hot.counters.snapshot() == counts(admitted=4, limited=2, shadow_limited=0, exempt=0)
    assert [(e.key, e.route, e.cost, e.outcome) for e in events] == [
        ("10.0.0.1", "*", 1, outcome)
        for outcome in ("admitted",) * 3 + ("limited", "admitted", "limited")
    ]


def test_the_hot_case_and_every_step_agree_for_composites(impl: ModuleType) -> None:
    # all_of and tiered take the hot case too (with a hook, every step): the
    # same outcomes, fields of the binding bucket included, and a reconfigure
    # of a layer shows in the next response either way.
    def limits(clock: ManualClock) -> list[Any]:
        per_client = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
        instance = impl.TokenBucket(rate=10, capacity=3, clock=clock)
        plans = {
            "free": impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock),
            "pro": impl.KeyedTokenBucket(rate=2, capacity=3, clock=clock),
        }
        tier = nb.tiered(plans, tier=lambda key: "pro" if key == "10.0.0.2" else "free")
        return [nb.all_of(per_client, instance), tier]

    clocks = ManualClock(), ManualClock()
    for which in (0, 1):
        hot_limit, every_limit = limits(clocks[0])[which], limits(clocks[1])[which]
        hot = Gate(VIEW, hot_limit)
        every = Gate(VIEW, every_limit, on_decision=lambda event: None)
        assert hot._hot is not None and every._hot is None
        for step in range(8):
            if step == 5:  # the first layer, or plan, is reconfigured
                for limit, c in ((hot_limit, clocks[0]), (every_limit, clocks[1])):
                    limit.leaves()[0].reconfigure(rate=3, capacity=4, now=c())
            request = Request(peer=f"10.0.0.{step % 3}")
            got, want = shown(hot.decide(request)), shown(every.decide(request))
            assert got == want, (which, step)
            for c in clocks:
                c.advance(S // 4)
        assert hot.counters.snapshot() == every.counters.snapshot()
    assert shown(hot.decide(Request(peer="10.0.0.0")))[2][0] == (
        b"ratelimit-policy",
        b'"free";q=6;w=2',
    )


def test_a_reconfigured_bucket_shows_at_once(impl: ModuleType, clock: ManualClock) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    gate = Gate(VIEW, limiter)
    assert gate.decide(Request())[2][0] == (b"ratelimit-policy", b'"default";q=2;w=2')
    limiter.reconfigure(rate=4, capacity=8, now=clock())
    assert gate.decide(Request())[2][0] == (b"ratelimit-policy", b'"default";q=8;w=2')


def test_all_of_names_each_layer_by_its_place(impl: ModuleType, clock: ManualClock) -> None:
    per_client = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    instance = impl.TokenBucket(rate=10, capacity=3, clock=clock)
    gate = Gate(VIEW, nb.all_of(per_client, instance))
    got = [gate.decide(Request(peer=f"10.0.0.{i}")) for i in (1, 1, 2, 3)]
    assert [(a, list(fields)) for a, _, fields, _, _ in got[:3]] == [
        (
            True,
            [
                (b"ratelimit-policy", b'"default:per-key";q=2;w=2'),
                (b"ratelimit", b'"default:per-key";r=1;t=1'),
            ],
        ),
        (
            True,
            [
                (b"ratelimit-policy", b'"default:per-key";q=2;w=2'),
                (b"ratelimit", b'"default:per-key";r=0;t=2'),
            ],
        ),
        (
            True,
            [
                (b"ratelimit-policy", b'"default:shared";q=10;w=1'),
                (b"ratelimit", b'"default:shared";r=0;t=1'),
            ],
        ),
    ]
    admitted, decision, fields, body, _ = got[3]
    assert (admitted, decision.layer, body) == (False, 1, problem("default:shared", 1))
    assert fields == refusal(
        problem("default:shared", 1),
        1,
        (b"ratelimit-policy", b'"default:shared";q=10;w=1'),
        (b"ratelimit", b'"default:shared";r=0;t=1'),
    )
    # A nested all_of: three unnamed buckets of one kind, numbered in the order of the leaves.
    inner = impl.TokenBucket(rate=1, capacity=1, clock=clock)
    nested = Gate(
        VIEW,
        nb.all_of(
            impl.TokenBucket(rate=5, capacity=5, clock=clock),
            nb.all_of(impl.TokenBucket(rate=5, capacity=5, clock=clock), inner),
        ),
        name="api",
    )
    assert nested.decide(Request())[2][0] == (b"ratelimit-policy", b'"api:shared-3";q=1;w=1')


def test_tiered_names_the_plan(impl: ModuleType, clock: ManualClock) -> None:
    free = impl.KeyedTokenBucket(rate=10, capacity=20, clock=clock)
    pro = impl.KeyedTokenBucket(rate=100, capacity=200, clock=clock)
    plan_of = {"header:alice": "free", "header:bob": "pro"}
    limiter = nb.tiered({"free": free, "pro": pro}, tier=plan_of.__getitem__)
    gate = Gate(VIEW, limiter, key=header("X-User"))
    alice = Request(headers={"x-user": "alice"})
    bob = Request(headers={"x-user": "bob"})
    assert list(gate.decide(alice)[2]) == [
        (b"ratelimit-policy", b'"free";q=20;w=2'),
        (b"ratelimit", b'"free";r=19;t=1'),
    ]
    assert list(gate.decide(bob)[2]) == [
        (b"ratelimit-policy", b'"pro";q=200;w=2'),
        (b"ratelimit", b'"pro";r=199;t=1'),
    ]
    free.allow_at("header:alice", clock(), cost=19)
    admitted, decision, _, body, _ = gate.decide(alice)
    assert (admitted, decision.plan, body) == (False, "free", problem("free", 1))
    # In an all_of with a global limit: the plan's name, or what the global one is.
    instance = impl.TokenBucket(rate=1, capacity=200, clock=clock)
    both = Gate(VIEW, nb.all_of(limiter, instance), key=header("X-User"))
    assert both.decide(bob)[2][0] == (b"ratelimit-policy", b'"pro";q=200;w=2')
    instance.allow_at(clock(), cost=198)  # 1 left: the instance binds
    assert list(both.decide(bob)[2]) == [
        (b"ratelimit-policy", b'"default:shared";q=200;w=200'),  # one bucket for every key
        (b"ratelimit", b'"default:shared";r=0;t=200'),
    ]


def test_shadow_lets_a_refusal_through_with_no_fields(impl: ModuleType, clock: ManualClock) -> None:
    events: list[LimitEvent] = []
    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    gate = Gate(VIEW, limiter, shadow=True, on_limited=events.append)
    assert [shown(gate.decide(Request())) for _ in range(2)] == [
        (True, (True, 0, 0, S, 1), [], (None, None)),
        (True, (False, 0, S, S, 1), [], (None, None)),
    ]
    assert gate.counters.snapshot() == counts(admitted=1, limited=0, shadow_limited=1, exempt=0)
    assert [(e.outcome, e.shadow) for e in events] == [("shadow-limited", True)]


def test_routes_exempt_costs_keys_and_labels(impl: ModuleType, clock: ManualClock) -> None:
    events: list[LimitEvent] = []
    search = impl.KeyedTokenBucket(rate=1, capacity=10, clock=clock)
    gate = Gate(
        VIEW,
        impl.KeyedTokenBucket(rate=1, capacity=5, clock=clock),
        routes=[Route("/search", search, cost=4, key=route()), Route("/api/*", cost=2)],
        exempt="/healthz",
        on_decision=events.append,
    )
    health = Request(path="/healthz")
    assert gate.decide(health) is EXEMPT
    assert health.notes == {"nanobucket.route": "/healthz"}
    found = Request(path="/search")
    assert gate.decide(found)[1].remaining == 6
    assert found.notes == {"nanobucket.route": "/search"}
    assert gate.decide(Request(path="/api/items"))[1].remaining == 3
    assert gate.decide(Request(path="/other"), None, "a view")[1].remaining == 2
    assert [(e.key, e.route, e.cost) for e in events] == [
        ("/search", "/search", 4),  # route(): the pattern noted on the request
        ("10.0.0.1", "/api/*", 2),
        ("10.0.0.1", "a view", 1),  # an adapter's own label
    ]
    assert gate.counters.snapshot() == counts(admitted=3, limited=0, shadow_limited=0, exempt=1)


def test_a_cost_from_a_callable_is_checked(impl: ModuleType) -> None:
    gate = Gate(VIEW, impl.KeyedTokenBucket(rate=1, capacity=5), cost=lambda request: True)
    with pytest.raises(TypeError, match="cost must be an int, not bool"):
        gate.decide(Request())
    big = Gate(VIEW, impl.KeyedTokenBucket(rate=1, capacity=5), cost=lambda request: 6)
    with pytest.raises(ValueError, match="cost 6 exceeds capacity 5"):
        big.decide(Request())
    assert big.counters.snapshot() == counts(admitted=0, limited=0, shadow_limited=0, exempt=0)


def test_charge_settles_what_is_due(impl: ModuleType, clock: ManualClock) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=10, clock=clock)
    gate = Gate(VIEW, limiter, cost=2, charge=lambda request, status: 5 if status == 200 else 0)
    request = Request()
    _, _, _, _, due = gate.decide(request)
    assert due is not None and limiter.tokens_at("10.0.0.1", clock()) == 8
    due.settle(request, 200)  # 5 in all: 3 more
    assert limiter.tokens_at("10.0.0.1", clock()) == 5
    _, _, _, _, due = gate.decide(request)
    assert due is not None
    asyncio.run(due.settle_async(request, 500))  # 0 in all: the 2 back
    assert limiter.tokens_at("10.0.0.1", clock()) == 5


@pytest.mark.gil_atomic  # four threads insert keys into one C table at once
def test_a_locked_gate_counts_every_thread(impl: ModuleType) -> None:
    gate = Gate(VIEW, impl.KeyedTokenBucket(rate=1e-6, capacity=100), locked=True)

    def run(i: int) -> None:
        request = Request(peer=f"10.0.0.{i}")
        for _ in range(150):
            gate.decide(request)

    run_threads(4, run)
    assert gate.counters.snapshot() == counts(admitted=400, limited=200, shadow_limited=0, exempt=0)


def test_an_asyncio_limiter_and_hook_are_awaited(impl: ModuleType, clock: ManualClock) -> None:
    events: list[LimitEvent] = []

    async def hook(event: LimitEvent) -> None:
        await asyncio.sleep(0)
        events.append(event)

    limiter = AsyncRecorder(impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock))
    gate = Gate(VIEW, limiter, on_decision=hook)
    assert gate.awaits is True

    async def three() -> list[Outcome]:
        return [await gate.decide_async(Request()) for _ in range(3)]

    got = [shown(o) for o in asyncio.run(three())]
    assert got == two_then_refused()
    assert limiter.keys == ["10.0.0.1"] * 3
    assert [e.outcome for e in events] == ["admitted", "admitted", "limited"]
    assert gate.counters.snapshot() == counts(admitted=2, limited=1, shadow_limited=0, exempt=0)
    # A key and cost found by the adapter (FastAPI's dependencies): the cost is checked.
    other = asyncio.run(gate.decide_async(Request(), "/items", key="alice", cost=2))
    assert (other[0], other[1].remaining, events[-1].route) == (True, 0, "/items")
    with pytest.raises(ValueError, match="exceeds capacity"):
        asyncio.run(gate.decide_async(Request(), key="bob", cost=3))


def test_a_synchronous_limiter_on_the_asyncio_path(impl: ModuleType, clock: ManualClock) -> None:
    sync = Gate(VIEW, impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock))
    other = Gate(VIEW, impl.KeyedTokenBucket(rate=1, capacity=2, clock=ManualClock()))
    assert shown(asyncio.run(sync.decide_async(Request()))) == shown(other.decide(Request()))


def test_bad_options_fail_when_the_gate_is_built() -> None:
    limiter = nb.KeyedTokenBucket(rate=1, capacity=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        Gate(VIEW, limiter, colour="red")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="headers must be one of"):
        Gate(VIEW, limiter, headers="x")
    with pytest.raises(TypeError, match="on_decision is async, but this integration is"):

        async def hook(event: LimitEvent) -> None: ...

        Gate(VIEW, limiter, on_decision=hook, asynchronous=False)

"""`Decision.copy_as`: a decision's five fields in a subclass, as ``tiered`` builds its own."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import nanobucket as nb
from nanobucket._compose.tiered import TieredDecision


def test_copy_as_copies_the_five_fields_into_a_subclass(impl: ModuleType) -> None:
    class Named(impl.Decision):  # type: ignore[misc, name-defined]
        __slots__ = ("name",)

    d = impl.TokenBucket(rate=4, capacity=3, clock=lambda: 0).check_at(0, cost=2)
    copy = d.copy_as(Named)
    assert type(copy) is Named
    fields = (copy.allowed, copy.remaining, copy.retry_after_ns, copy.reset_after_ns, copy.limit)
    assert fields == (True, 1, 0, 500_000_000, 3)
    assert copy == d
    refused = impl.TokenBucket(rate=4, capacity=1, clock=lambda: 0)
    refused.check_at(0)
    late = refused.check_at(0).copy_as(Named)
    assert (late.allowed, late.retry_after_ns, late.reset_after_ns) == (
        False,
        250_000_000,
        250_000_000,
    )


@pytest.mark.parametrize("cls", [int, object])
def test_copy_as_makes_only_a_decision(impl: ModuleType, cls: type) -> None:
    with pytest.raises(TypeError, match="Decision"):
        impl.Decision(True, 1, 0, 1, 2).copy_as(cls)


class OwnTable:
    """A keyed limiter of a user's own: its decisions are any object with the five fields."""

    keyed = True
    capacity = 2
    rate = 1
    interval_ns = 1_000_000_000

    def __init__(self) -> None:
        self.decided = SimpleNamespace(
            allowed=True, remaining=1, retry_after_ns=0, reset_after_ns=7, limit=2
        )

    def check(self, key: Any, cost: int = 1) -> SimpleNamespace:
        return self.decided

    def check_at(self, key: Any, now: int, cost: int = 1) -> SimpleNamespace:
        return self.decided

    allow = allow_at = peek = peek_at = check_at


def test_a_plan_of_your_own_decides_through_tiered() -> None:
    own = OwnTable()
    t = nb.tiered({"own": own}, tier=lambda key: "own")
    d = t.check("alice")
    assert type(d) is TieredDecision
    assert (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit) == (
        True,
        1,
        0,
        7,
        2,
    )
    assert (d.plan, d.decision) == ("own", own.decided)


def test_a_tiered_decision_is_its_plans_decision_and_plan(impl: ModuleType) -> None:
    table = impl.KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0)
    t = nb.tiered({"free": table}, tier=lambda key: "free")
    d = t.check("alice")
    assert type(d) is TieredDecision
    assert (d.plan, d.remaining, d.limit, d.reset_after_ns) == ("free", 1, 2, 1_000_000_000)
    assert d.decision == d and type(d.decision) is impl.Decision

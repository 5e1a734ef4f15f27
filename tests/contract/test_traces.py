"""Random traces through every backend and the exact model, decision for decision.

The model is `nanobucket.reference.ExactBucket` (rational arithmetic, one
per key; one for all keys of an unkeyed bucket); each decision's fields are
derived from its tokens as DESIGN.md defines them. Times never go back (the
model treats an older time as the latest one; the buckets as itself, which
is stricter: see test_decisions) and are whole microseconds, as Redis keeps.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanobucket.reference import ExactBucket

from .backends import BATCH, CAPACITY, EXACT, PEEK, RATE, T0, TOKENS, US, Case, Subject, T, fields

KEYS = ("alice", "bob")
Step = tuple[str, int, int, list[str]]  # verb, microseconds since the last step, cost, keys

steps = st.tuples(
    st.sampled_from(["check", "check", "peek", "allow", "many"]),
    st.integers(0, 3 * T // US),
    st.integers(0, CAPACITY),
    st.lists(st.sampled_from(KEYS), min_size=1, max_size=4),
)


class Model:
    """The exact bucket of each key, and the decision DESIGN.md derives from its tokens."""

    def __init__(self, keyed: bool) -> None:
        self.keyed = keyed
        self.buckets: dict[str | None, ExactBucket] = {}

    def bucket(self, key: str) -> ExactBucket:
        name = key if self.keyed else None
        if name not in self.buckets:
            self.buckets[name] = ExactBucket(RATE, CAPACITY)
        return self.buckets[name]

    def decide(self, key: str, now: int, cost: int, spend: bool) -> tuple[Any, ...]:
        b = self.bucket(key)
        tokens: Fraction = b.tokens_at(now)
        allowed = tokens >= cost
        if spend:
            assert b.allow_at(now, cost) is allowed
        after = tokens - cost if allowed else tokens
        retry = 0 if allowed else (cost - tokens) * T
        return (allowed, math.floor(after), retry, (CAPACITY - after) * T, CAPACITY)


async def replay(s: Subject, trace: list[Step]) -> None:
    model, now = Model(s.backend.keyed), T0
    exact = s.backend.has(EXACT)
    for verb, gap, cost, keys in trace:
        now += gap * US
        key = keys[0]
        if verb == "many" and s.backend.has(BATCH):
            admitted = [int(model.decide(k, now, cost, True)[0]) for k in keys]
            assert list(await s.many(keys, now, cost)) == admitted
        elif verb in {"many", "allow"}:
            for k in keys if verb == "many" else [key]:
                want_allowed = model.decide(k, now, cost, True)[0]
                assert await s.allow(k, now, cost) is want_allowed
        elif verb == "peek" and s.backend.has(PEEK):
            want = model.decide(key, now, cost, False)
            assert fields(await s.peek(key, now, cost)) == want
        elif verb == "check":
            want = model.decide(key, now, cost, True)
            d = await s.check(key, now, cost)
            assert (fields(d) if exact else d.allowed) == (want if exact else want[0])


@pytest.mark.applies(TOKENS)
@settings(max_examples=25, deadline=None)
@given(trace=st.lists(steps, min_size=1, max_size=30))
def test_random_traces_decide_as_the_exact_model(backend: Case, trace: list[Step]) -> None:
    async def body(s: Subject) -> None:
        await replay(s, trace)

    backend.run(body)

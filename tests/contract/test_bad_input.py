"""Bad input: the same TypeError / ValueError, word for word, from every verb of every backend.

Where the backends differ by design (which keys a table can store), each
family's message is asserted exactly.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from .backends import (
    BATCH,
    CAPACITY,
    KEYED,
    LEASED,
    PEEK,
    REDIS,
    REFUND,
    RESERVE,
    SHARED,
    T0,
    Case,
    K,
    Subject,
)

BAD_COSTS = [
    (CAPACITY + 1, ValueError, "cost 6 exceeds capacity 5: it could never be admitted"),
    (-1, ValueError, "cost must be >= 0, got -1"),
    (True, TypeError, "cost must be an int, not bool"),
    (1.5, TypeError, "cost must be an int, not float"),
]
BAD_TIMES = [
    (-1, ValueError, "now must be in [0, 2**62) ns, got -1"),
    (2**62, ValueError, f"now must be in [0, 2**62) ns, got {2**62}"),
    (1.5, TypeError, "now must be an int of nanoseconds, not float"),
    (False, TypeError, "now must be an int of nanoseconds, not bool"),
]
#: The message for an unhashable key, by family: the tables that store keys as
#: bytes take str, bytes and int only, and say so.
BAD_KEY = {
    SHARED: "a shared table key must be str, bytes or int, not list",
    REDIS: "a Redis limiter key must be str, bytes or int, not list",
    LEASED: "a Redis limiter key must be str, bytes or int, not list",
}
UNHASHABLE = "unhashable type: 'list'"

Call = Callable[[Any, Any], Awaitable[Any]]


def verbs(s: Subject, key: Any) -> dict[str, Call]:
    """Each verb the backend has that takes a time and a cost, as ``call(now, cost)`` on *key*
    (a batch: a good key, then *key*)."""
    found: dict[str, Call] = {
        "allow_at": lambda now, cost: s.allow(key, now, cost),
        "check_at": lambda now, cost: s.check(key, now, cost),
    }
    if s.backend.has(PEEK):
        found["peek_at"] = lambda now, cost: s.peek(key, now, cost)
    if s.backend.has(BATCH):
        found["allow_many_at"] = lambda now, cost: s.many([K, key], now, cost)
    if s.backend.has(RESERVE):
        found["reserve"] = lambda now, cost: s.reserve(key, cost=cost, max_wait_ns=10**9, now=now)
    if s.backend.has(REFUND):
        found["refund_at"] = lambda now, cost: s.refund(key, now, cost)
    return found


def raises(error: type[Exception], message: str) -> Any:
    return pytest.raises(error, match=f"^{re.escape(message)}$")


def test_a_bad_cost_is_the_same_error_from_every_verb(backend: Case) -> None:
    async def body(s: Subject) -> None:
        for call in verbs(s, K).values():
            for cost, error, message in BAD_COSTS:
                with raises(error, message):
                    await call(T0, cost)
        assert await s.state(K, T0) == (True, 5, 0, 0, 5)  # nothing was spent

    backend.run(body)


def test_a_bad_time_is_the_same_error_from_every_verb(backend: Case) -> None:
    async def body(s: Subject) -> None:
        for call in verbs(s, K).values():
            for now, error, message in BAD_TIMES:
                with raises(error, message):
                    await call(now, 1)
        assert await s.state(K, T0) == (True, 5, 0, 0, 5)

    backend.run(body)


@pytest.mark.applies(RESERVE)
def test_a_bad_reservation_is_the_same_error(backend: Case) -> None:
    async def body(s: Subject) -> None:
        with raises(ValueError, "max_wait_ns must be >= 0, got -1"):
            await s.reserve(K, max_wait_ns=-1, now=T0)
        with raises(TypeError, "max_wait_ns must be an int of nanoseconds, not float"):
            await s.reserve(K, max_wait_ns=1.0, now=T0)
        with raises(TypeError, "shape must be a bool, not int"):
            await s.reserve(K, shape=1, now=T0)
        assert await s.state(K, T0) == (True, 5, 0, 0, 5)

    backend.run(body)


@pytest.mark.applies(KEYED)
def test_an_unhashable_key_is_a_type_error_from_every_verb(backend: Case) -> None:
    async def body(s: Subject) -> None:
        message = BAD_KEY.get(s.backend.family, UNHASHABLE)
        for call in verbs(s, ["unhashable"]).values():
            with raises(TypeError, message):
                await call(T0, 1)
        assert await s.state(K, T0) == (True, 5, 0, 0, 5)  # the batch charged no key

    backend.run(body)


@pytest.mark.applies(KEYED)
def test_keys_of_different_types(backend: Case) -> None:
    # Documented apart: Redis stores a key as bytes, so "7", b"7" and 7 are one
    # bucket there; everywhere else they are three.
    async def body(s: Subject) -> None:
        admitted = [await s.allow(key, T0, CAPACITY) for key in ("7", b"7", 7)]
        one_bucket = s.backend.family in (REDIS, LEASED)
        assert admitted == ([True, False, False] if one_bucket else [True, True, True])

    backend.run(body)

"""What a limiter offers is what the protocols say, and what the wrappers accept.

``isinstance`` with a runtime-checkable protocol only looks for the
verbs' names, so every limiter with ``allow``/``check``/``peek`` is both a
`Limiter` and a `KeyedLimiter` to it: its class's ``keyed`` tells them
apart, and is what the wrappers read. Each entry's declared protocols and
features are checked against the limiter here, so the matrix that decides
where each property runs cannot drift from the code.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import nanobucket as nb
from nanobucket._core._limiter import (
    Clocked,
    Composite,
    KeyedLimiter,
    Limiter,
    Refundable,
    Reservable,
    traits,
)

from .backends import (
    BATCH,
    CAPACITY,
    INFLIGHT,
    PEEK,
    PROTOCOLS,
    RECONFIGURE,
    REFUND,
    RESERVATION,
    RESERVE,
    RESET,
    T0,
    TOKENS,
    Case,
    K,
    Subject,
    T,
    fields,
    settle,
)

#: Each feature, and the verb whose presence it is.
VERBS = {
    PEEK: "peek_at",
    BATCH: "allow_many_at",
    RESERVE: "reserve",
    RESERVATION: "reservation",
    REFUND: "refund_at",
    RESET: "reset",
    RECONFIGURE: "reconfigure",
}


class NoRefund:
    """A limiter of one's own without ``refund``: ``all_of`` takes one such layer, charged last."""

    keyed = True

    def allow(self, key: Any, cost: int = 1) -> bool:
        return True

    def check(self, key: Any, cost: int = 1) -> Any:
        return nb.Decision(True, 1, 0, 0, 1)

    def peek(self, key: Any, cost: int = 1) -> Any:
        return nb.Decision(True, 1, 0, 0, 1)


def offered(limiter: Any) -> set[type]:
    verbs = KeyedLimiter if limiter.keyed else Limiter
    return {p for p in (verbs, *PROTOCOLS) if isinstance(limiter, p)}


def test_the_protocols_and_verbs_are_what_the_limiter_offers(backend: Case) -> None:
    async def body(s: Subject) -> None:
        lim = s.limiter
        assert lim.keyed is s.backend.keyed
        assert offered(lim) == set(s.backend.protocols)
        assert isinstance(lim, Reservable) is s.backend.has(RESERVE)
        assert isinstance(lim, Refundable) is s.backend.has(REFUND)
        for feature, verb in VERBS.items():
            assert callable(getattr(lim, verb, None)) is s.backend.has(feature), verb
        if isinstance(lim, Clocked):  # its own clock, in ns: the tests' frozen one
            assert (lim.clock_ns(), lim.interval_ns) == (T0, T)
        if isinstance(lim, Composite):  # each decision is one of its leaves', named as it
            assert all(leaf.capacity in (CAPACITY, 4 * CAPACITY) for leaf in lim.leaves())
            assert len(lim.leaf_names()) == len(lim.leaves())
            name, leaf = lim.binding(await s.check(K, T0))
            assert leaf in lim.leaves() and leaf.capacity == CAPACITY
            assert name == lim.leaf_names()[lim.leaves().index(leaf)]

    backend.run(body)


def test_the_traits_are_what_the_limiter_declares(backend: Case) -> None:
    async def body(s: Subject) -> None:
        learnt = traits(s.limiter)
        assert learnt.keyed is s.backend.keyed and learnt.checks
        assert learnt.releases is (s.backend.family == INFLIGHT)  # slots: released after use
        # A capacity of its own (and a rate: the fields a response shows), but for the
        # composites (their leaves' are theirs) and the in-flight limits (slots, no rate).
        single = s.backend.has(TOKENS) and Composite not in s.backend.protocols
        assert (learnt.capacity, learnt.bucket) == ((CAPACITY, True) if single else (None, False))
        # An all_of's verbs take key None too (its unkeyed layers need none).
        assert learnt.key_optional is isinstance(s.limiter, nb.AllOf)

    backend.run(body)


def test_waiting_takes_exactly_the_limiters_it_can_wait_on(backend: Case) -> None:
    async def body(s: Subject) -> None:
        lim = s.limiter
        try:
            waiting = nb.Waiting(lim)
        except TypeError as refused:
            assert str(refused) == (
                f"{type(lim).__name__} is an asyncio limiter: await its own acquire_async "
                "(Waiting calls a limiter's verbs without awaiting them)"
                if s.backend.asyncio
                else f"{type(lim).__name__} cannot reserve tokens: Waiting needs an "
                "in-process TokenBucket, KeyedTokenBucket or all_of"
            )
            # Refused: it cannot reserve and refund (or, an asyncio one, is not waited on).
            assert s.backend.asyncio or not (s.backend.has(RESERVE) and s.backend.has(REFUND))
            return
        assert s.backend.has(RESERVE, REFUND)
        key = s.key(K)
        with warnings.catch_warnings():
            # A wrapper that calls an asyncio verb without awaiting it drops the
            # coroutine: the assertion below, not this warning, reports it.
            warnings.simplefilter("ignore", RuntimeWarning)
            first = await waiting.acquire_async(*key, cost=CAPACITY, timeout=0)
            second = await waiting.acquire_async(*key, cost=CAPACITY, timeout=0)
        # The whole bucket, then nothing (a full bucket takes 500 ms to come back).
        assert (first, second) == (True, False)

    backend.run(body)


def test_all_of_takes_exactly_the_limiters(backend: Case) -> None:
    async def body(s: Subject) -> None:
        lim = s.limiter
        verbs = KeyedLimiter if s.backend.keyed else Limiter
        try:
            layered = nb.all_of(lim)
        except TypeError:
            assert not isinstance(lim, verbs) or s.backend.asyncio
            return
        # Taken: it is a limiter, and all_of's verbs decide as its own.
        key = K if s.backend.keyed else None
        assert isinstance(lim, verbs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # see the test above
            try:
                admitted = layered.check_at(key, T0, CAPACITY)
                refused = layered.peek_at(key, T0, 1)
            except AttributeError as error:  # a verb it lacks, or one it did not await
                failed = repr(error)
            else:
                failed = ""
            gc.collect()  # the dropped coroutines go now, their warning with them
        assert not failed, failed
        assert admitted.allowed and fields(refused) == fields(await settle(s.peek(K, T0, 1)))
        # One layer without refund is taken (charged last), two are not.
        if isinstance(lim, Refundable):
            nb.all_of(lim, NoRefund())

    backend.run(body)


def test_all_of_refuses_two_layers_without_refund() -> None:
    try:
        nb.all_of(NoRefund(), NoRefund())
    except TypeError as refused:
        assert str(refused) == (
            "all_of() takes at most one layer without refund() (it is charged last); "
            "got NoRefund, NoRefund"
        )
    else:  # pragma: no cover - the assertion's message
        raise AssertionError("all_of took two layers without refund")

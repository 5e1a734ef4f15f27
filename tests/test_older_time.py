"""An explicit time older than a bucket has seen: stricter than the rational model."""

from __future__ import annotations

from types import ModuleType

from nanobucket.reference import ExactBucket

S = 1_000_000_000


def test_an_older_time_is_charged_from_the_latest_state(impl: ModuleType) -> None:
    b, model = impl.TokenBucket(rate=1, capacity=2), ExactBucket(rate=1, capacity=2)
    assert b.allow_at(10 * S) and model.allow_at(10 * S)
    # The model keeps the token it held at 10 s and spends it at 5 s ...
    assert model.allow_at(5 * S)
    # ... nanobucket sees 6 s of debt from 5 s, against 1 s allowed: wait 5 s.
    d = b.check_at(5 * S)
    assert (d.allowed, d.retry_after_ns, d.remaining) == (False, 5 * S, 0)
    assert b.tokens_at(5 * S) == 0.0
    assert b.check_at(10 * S).allowed  # the token is there at the latest time


def test_an_older_time_never_admits_what_the_model_refuses(impl: ModuleType) -> None:
    b, model = impl.TokenBucket(rate=4, capacity=3), ExactBucket(rate=4, capacity=3)
    times = [9 * S, 9 * S, 2 * S, 9 * S + S // 4, 1, 9 * S, 3 * S, 10 * S, 10 * S, 10 * S, 4 * S]
    ours = [b.allow_at(t) for t in times]
    theirs = [model.allow_at(t) for t in times]
    # By hand, T = 250 ms, tau = 750 ms: at 2 s the debt seen is 7.75 s.
    assert ours == [True, True, False, True, False, False, False, True, True, True, False]
    assert theirs == [True, True, True, True, False, False, False, True, True, True, False]

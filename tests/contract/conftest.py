"""The contract's one fixture, ``backend``: a `Case` per entry of `backends.BACKENDS`.

A test runs on every entry whose features include those its
``@pytest.mark.applies(...)`` names (all entries without the mark). A
known disagreement -- a property a backend fails today -- is listed in
`KNOWN` with its reason: that pair is an expected failure (strict, so the
fix must remove the entry), every other pair must pass.
"""

from __future__ import annotations

import pytest

from .backends import BACKENDS, Case, Env

#: (test, backend) -> why it fails today. Each is a bug to fix in the limiter, not here.
KNOWN: dict[tuple[str, str], str] = {
    ("test_a_refund_after_a_refusal_counts_at_once", "leased"): (
        "LeasedTokenBucket remembers a refusal from Redis (_Lease.denied_need / denied_until) "
        "and refund_at does not forget it: after a refund fills the Redis bucket, a request "
        "needing as many tokens is still refused locally (source 'lease') until that "
        "retry_after"
    ),
    ("test_a_refusal_says_when_the_same_request_is_admitted", "leased"): (
        "LeasedTokenBucket refuses locally a request needing at least the tokens Redis last "
        "refused, with that refusal's retry_after: for a larger request it is too early "
        "(150 ms where the tokens are 250 ms away), and reset_after_ns is 0"
    ),
    ("test_waiting_takes_exactly_the_limiters_it_can_wait_on", "redis-async"): (
        "Waiting takes an asyncio limiter (it is Reservable and Refundable) but calls its "
        "verbs without awaiting them: acquire_async admits every request (an unawaited "
        "coroutine is true) and spends nothing"
    ),
    ("test_all_of_takes_exactly_the_limiters", "redis-async"): (
        "all_of takes an asyncio limiter but calls its verbs without awaiting them: allow "
        "admits every request, check_at raises AttributeError ('coroutine' object has no "
        "attribute 'allowed')"
    ),
    ("test_all_of_takes_exactly_the_limiters", "leased"): (
        "all_of takes a LeasedTokenBucket, which has no peek / peek_at (so is no "
        "KeyedLimiter): the all_of's peek_at raises AttributeError"
    ),
}
# The same limiter on valkey-py's asyncio client fails as on redis-py's.
for (_test, _name), _reason in list(KNOWN.items()):
    if _name == "redis-async":
        KNOWN[_test, "valkey-async"] = _reason


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "applies(*features): run this contract test on every backend with these features",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("applies")
    needs = marker.args if marker is not None else ()
    test = metafunc.function.__name__
    params = []
    for entry in BACKENDS:
        if not entry.has(*needs):
            continue
        marks = list(entry.marks)
        reason = KNOWN.get((test, entry.name))
        if reason is not None:
            marks.append(pytest.mark.xfail(strict=True, reason=reason))
        params.append(pytest.param(entry, id=entry.name, marks=marks))
    metafunc.parametrize("backend", params, indirect=True, scope="session")


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> Case:
    """The backend under test in this session (a Redis one on the session's redis-server)."""
    entry = request.param
    if not entry.needs_redis:
        return Case(entry, Env())
    server = request.getfixturevalue("redis_session_server")
    return Case(entry, Env(server.url, server.port))

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
KNOWN: dict[tuple[str, str], str] = {}
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

"""Every behaviour test runs on both implementations through the `impl` fixture."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType

import pytest

from nanobucket._core import _bucket_py

try:
    from nanobucket._core import _bucket_c
except ImportError:  # pragma: no cover - a pure-Python install
    _bucket_c = None  # type: ignore[assignment]
try:
    from nanobucket._core import _shared_c
except ImportError:  # pragma: no cover - a pure-Python install
    _shared_c = None  # type: ignore[assignment]

shared_c = _shared_c  # the shared-table extension, for the tests that call it directly

# The Redis fixtures (`redis_session_server`, `redis_url`, `own_redis_server`,
# `busy_server`) for every test module, without importing them into each.
pytest_plugins = ("redis_server",)

# The marks of every shared-table test module (its `pytestmark`): the table
# needs the extension, and CI must not skip it.
NEEDS_SHARED_TABLE = [
    pytest.mark.c_extension,
    pytest.mark.skipif(
        _shared_c is None and not os.environ.get("CI"), reason="the Cython extension is not built"
    ),
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-c-extensions",
        action="store_true",
        help="run only the pure-Python implementation",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Django reads its settings once per process: the Django tests, the
    # docstring examples and the README's examples all use tests/apps'.
    try:
        import django
    except ImportError:  # pragma: no cover - Django is a test dependency
        return
    sys.path.append(os.path.join(os.path.dirname(__file__), "apps"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_settings")
    django.setup()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--no-c-extensions"):
        return
    keep = [item for item in items if not item.get_closest_marker("c_extension")]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("c", marks=pytest.mark.c_extension, id="c"),
        pytest.param("py", id="py"),
    ],
)
def impl(request: pytest.FixtureRequest) -> ModuleType:
    """The implementation module under test: ``_bucket_c`` or ``_bucket_py``."""
    if request.param == "py":
        return _bucket_py
    if _bucket_c is None:
        if os.environ.get("CI"):
            pytest.fail("the Cython extension is not built (CI must test it)")
        pytest.skip("the Cython extension is not built")
    return _bucket_c


class ManualClock:
    """An injectable clock: a callable returning int ns that tests move by hand."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


class SleepClock(ManualClock):
    """A `ManualClock` from 10 s that only its sleeps move; records every sleep (s).

    With *most_sleeps*, more sleeps than that fail the test: a wait woken once
    per token of a long pause is work that grows with the numbers, too.
    """

    def __init__(self, most_sleeps: int | None = None) -> None:
        super().__init__(10 * 1_000_000_000)
        self.slept: list[float] = []
        self.most_sleeps = most_sleeps

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += round(seconds * 1_000_000_000)
        if self.most_sleeps is not None and len(self.slept) > self.most_sleeps:
            raise AssertionError(f"{len(self.slept)} sleeps: {self.slept[-3:]} ...")

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def run_threads(count: int, target: Callable[[int], None]) -> None:
    """Run ``target(i)`` in *count* threads started together; re-raise the first error.

    The switch interval is 1 us meanwhile, so on a GIL build threads are
    interleaved inside the verbs as often as the interpreter can.
    """
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def run(i: int) -> None:
        try:
            start.wait()
            target(i)
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    if errors:
        raise errors[0]


def in_line(remaining: list[int], capacity: int) -> bool:
    """Whether *remaining* (one value per admitted request) shows each request
    taking its own token of a *capacity* bucket that refills too slowly to matter.

    In one process the values are exactly capacity-1 .. 0. Across processes a
    request can read the clock just before another process's admission
    lands, and then counts that one's token as still owed at its own, earlier
    instant: its remaining is one lower than its place in line, never more.
    So the k-th largest value is capacity-1-k or one less (0 at the end).
    """
    ordered = sorted(remaining, reverse=True)
    return len(ordered) == capacity and all(
        max(capacity - 2 - k, 0) <= r <= capacity - 1 - k for k, r in enumerate(ordered)
    )

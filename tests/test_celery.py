"""RateLimitedTask: a refused task is retried with countdown=retry_after, never blocking
the worker. The real test runs a Celery worker process (solo pool) on the Redis broker
with a RedisTokenBucket shared through the same server; the eager tests (Celery's
``task_always_eager``, no worker: NOT the real test) pin the exact countdowns on a
bucket whose clock the test moves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

celery = pytest.importorskip("celery")
from celery import signals  # noqa: E402

import nanobucket as nb  # noqa: E402
from nanobucket.celery import RateLimitedTask, countdown  # noqa: E402

from conftest import ManualClock  # noqa: E402
from redis_server import RedisServer, own_redis_server  # noqa: E402,F401  (fixture)

S = 1_000_000_000
APPS = Path(__file__).resolve().parent / "apps"
SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture
def eager() -> Iterator[Any]:
    app = celery.Celery("eager", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    yield app


class Refusals:
    """Records each retry's countdown (Celery's task_retry signal) and moves the clock
    by it, as the broker would hold the retried message until then."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.seen: list[tuple[Any, int, float]] = []

    def __call__(self, request: Any = None, reason: Any = None, **_: Any) -> None:
        self.seen.append((request.args[0], request.retries, reason.when))
        self.clock.advance(round(reason.when * S))


@pytest.fixture
def refusals() -> Iterator[Refusals]:
    found = Refusals(ManualClock())
    signals.task_retry.connect(found, weak=False)
    yield found
    signals.task_retry.disconnect(found)


def test_eager_refused_calls_retry_with_the_exact_countdown(
    eager: Any, refusals: Refusals, impl: Any
) -> None:
    """Eager mode (no worker): 10 calls against capacity 3, rate 2/s."""
    clock = refusals.clock
    runs: list[tuple[int, int, int]] = []

    @eager.task(bind=True, base=RateLimitedTask, limiter=impl.TokenBucket(2, 3, clock=clock))
    def call(self: Any, n: int) -> int:
        runs.append((n, self.request.retries, clock.now))
        return n

    assert [call.delay(n).get() for n in range(10)] == list(range(10))
    # The first 3 at once; each later one refused once, 0.5 s before its token, then run.
    assert refusals.seen == [(n, 0, 0.5) for n in range(3, 10)]
    assert runs == [(n, 0, 0) for n in range(3)] + [(n, 1, (n - 2) * S // 2) for n in range(3, 10)]


def test_eager_key_and_cost_come_from_the_arguments(eager: Any, refusals: Refusals) -> None:
    clock = refusals.clock
    limiter = nb.KeyedTokenBucket(rate=1, capacity=4, clock=clock)

    @eager.task(
        base=RateLimitedTask,
        limiter=limiter,
        limit_key=lambda user, rows: user,
        limit_cost=lambda user, rows: len(rows),
    )
    def store(user: str, rows: list[int]) -> int:
        return len(rows)

    assert store.delay("alice", [1, 2, 3]).get() == 3
    assert store.delay("bob", [1, 2, 3, 4]).get() == 4
    assert store.delay("alice", [1, 2]).get() == 2  # 1 left: waits 1 s for the 2nd
    assert refusals.seen == [("alice", 0, 1.0)]
    assert limiter.tokens("alice") == 0 and limiter.tokens("bob") == 1  # bob refilled 1 s


def test_a_keyed_limiter_defaults_to_the_tasks_name(eager: Any, refusals: Refusals) -> None:
    limiter = nb.KeyedTokenBucket(rate=1, capacity=2, clock=refusals.clock)

    @eager.task(base=RateLimitedTask, limiter=limiter, name="named.task")
    def ping() -> str:
        return "pong"

    assert ping.delay().get() == "pong"
    assert limiter.tokens("named.task") == 1


def test_a_task_without_a_limiter_is_refused(eager: Any) -> None:
    @eager.task(base=RateLimitedTask)
    def bare() -> None: ...

    with pytest.raises(TypeError, match="give it a limiter"):
        bare.delay().get()


def test_the_countdown_is_rounded_up_to_celerys_microseconds(
    eager: Any, refusals: Refusals
) -> None:
    """At 3/s a token is 333,333,334 ns away; Celery turns a countdown into a timedelta
    (microseconds, rounded to nearest): 0.333333334 would become 333,333 us, early."""
    clock = refusals.clock

    @eager.task(base=RateLimitedTask, limiter=nb.TokenBucket(rate=3, capacity=1, clock=clock))
    def call(n: int) -> int:
        return n

    assert [call.delay(n).get() for n in range(2)] == [0, 1]
    assert refusals.seen == [(1, 0, 0.333334)]
    assert timedelta(seconds=0.333334) == timedelta(microseconds=333_334)
    assert countdown(nb.Decision(False, 0, 1, 1, 1)) == 0.000001  # 1 ns: one microsecond


def test_max_retries_is_respected(eager: Any, refusals: Refusals) -> None:
    """A task with max_retries=2 refused every time (its bucket's clock stands still):
    retried twice at the limiter's countdown, then MaxRetriesExceededError; never run."""
    still = ManualClock()
    ran: list[int] = []

    @eager.task(
        base=RateLimitedTask, limiter=nb.TokenBucket(rate=2, capacity=1, clock=still), max_retries=2
    )
    def call(n: int) -> None:
        ran.append(n)

    call.delay(0).get()
    with pytest.raises(celery.exceptions.MaxRetriesExceededError):
        call.delay(1).get()
    assert ran == [0]
    assert refusals.seen == [(1, 0, 0.5), (1, 1, 0.5)]


def _worker(server: RedisServer, prefix: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), str(APPS), os.environ.get("PYTHONPATH", "")]),
        "NANOBUCKET_CELERY_URL": server.url,
        "NANOBUCKET_CELERY_PREFIX": prefix,
    }
    command = [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool=solo",
               "--concurrency=1", "--without-heartbeat", "--without-gossip", "--without-mingle",
               "--loglevel=warning"]  # fmt: skip
    return subprocess.Popen(command, cwd=APPS, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip


def test_a_real_worker_retries_refused_tasks_until_all_ran(
    own_redis_server: RedisServer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10 tasks against a shared capacity 3, rate 2/s: 3 run at once, 7 are refused and
    retried at the countdowns the limiter gave, and all 10 run exactly once."""
    prefix = f"nb-celery-{uuid.uuid4().hex[:8]}"
    server = own_redis_server
    monkeypatch.setenv("NANOBUCKET_CELERY_URL", server.url)
    monkeypatch.setenv("NANOBUCKET_CELERY_PREFIX", prefix)
    monkeypatch.syspath_prepend(str(APPS))
    monkeypatch.delitem(sys.modules, "celery_app", raising=False)
    import celery_app

    for n in range(10):  # queued before the worker starts: it finds all 10 at once
        celery_app.call_api.delay(n)
    worker = _worker(server, prefix)
    log = server.client()
    try:
        deadline = time.monotonic() + 25
        while log.llen(f"{prefix}:runs") < 10 and time.monotonic() < deadline:
            assert worker.poll() is None, worker.communicate()[0].decode()
            time.sleep(0.05)
        time.sleep(0.3)  # nothing more may come
    finally:
        worker.terminate()
        try:
            out = worker.communicate(timeout=10)[0].decode()
        except subprocess.TimeoutExpired:  # never leave a worker behind
            worker.kill()
            out = worker.communicate()[0].decode()
        celery_app.shared.close()
    runs = [json.loads(r) for r in log.lrange(f"{prefix}:runs", 0, -1)]
    refused = [json.loads(r) for r in log.lrange(f"{prefix}:refused", 0, -1)]
    assert sorted(n for n, _ in runs) == list(range(10)), out  # each ran exactly once
    assert len([n for n, retries in runs if retries == 0]) == 3  # the first 3 at once
    assert len([n for n, retries, _ in refused if retries == 0]) == 7  # the other 7 refused
    for n, retries in runs:  # a task that ran after k refusals was retried k times
        assert sorted(r for m, r, _ in refused if m == n) == list(range(retries))
    # Each countdown is the limiter's retry_after: never 0, never more than one token's 0.5 s.
    assert all(0 < countdown <= 0.5 for _, _, countdown in refused)
    assert all(abs(c * 1e6 - round(c * 1e6)) < 1e-3 for _, _, c in refused)  # whole µs
    print(f"celery: {len(refused)} refusals for 10 tasks; countdowns "
          f"{sorted(round(c, 3) for _, _, c in refused)}")  # fmt: skip

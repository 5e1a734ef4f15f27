"""Prometheus metrics with several worker processes (``PROMETHEUS_MULTIPROC_DIR``).

Two real worker processes count their decisions into one multiprocess
directory; one scrape through ``MultiProcessCollector`` sees both workers'
counts summed, and each worker's breaker state as its own series.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

import nanobucket as nb

#: The package's own directory's parent, first on the workers' path (this checkout's).
SRC = os.path.dirname(os.path.dirname(nb.__file__))

# One worker: *capacity* tokens, *calls* calls at one instant, and a breaker that
# fails (open) or not (closed), its state written by the decision after it changed.
WORKER = """
import os, sys
import nanobucket as nb
from nanobucket.metrics import PrometheusMetrics
from nanobucket.redis import CircuitBreaker

capacity, calls, breaker_state = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
metrics = PrometheusMetrics()
breaker = CircuitBreaker(backoff=60.0, clock=lambda: 0)
metrics.watch_breaker(breaker, "sessions")
if breaker_state == "open":
    breaker.record_failure()

@nb.limit(nb.TokenBucket(rate=1, capacity=capacity, clock=lambda: 0), on_decision=metrics.hook)
def ping():
    return "pong"

for _ in range(calls):
    try:
        ping()
    except nb.RateLimited:
        pass
print(os.getpid(), metrics.value("ping", "admitted"), metrics.value("ping", "limited"))
"""


def _worker(directory: Path, capacity: int, calls: int, breaker: str) -> tuple[str, str]:
    path = os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "PYTHONPATH": path}
    argv = [sys.executable, "-c", WORKER, str(capacity), str(calls), breaker]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    pid, own = out.stdout.split(" ", 1)
    return pid, own.strip()


def test_one_scrape_sees_every_worker(tmp_path: Path) -> None:
    pid_a, own_a = _worker(tmp_path, capacity=3, calls=5, breaker="open")
    pid_b, own_b = _worker(tmp_path, capacity=2, calls=4, breaker="closed")
    assert (own_a, own_b) == ("3.0 2.0", "2.0 2.0")  # `value`: each worker's own

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]

    def sample(name: str, labels: dict[str, str]) -> float | None:
        return registry.get_sample_value(name, labels)

    decisions = "nanobucket_decisions_total"
    assert sample(decisions, {"route": "ping", "outcome": "admitted", "plan": ""}) == 5.0
    assert sample(decisions, {"route": "ping", "outcome": "limited", "plan": ""}) == 4.0
    states = {
        (s.labels["pid"], s.labels["state"]): s.value
        for metric in registry.collect()
        if metric.name == "nanobucket_breaker_state"
        for s in metric.samples
        if s.labels["breaker"] == "sessions"
    }
    assert states == {
        (pid_a, "closed"): 0.0,
        (pid_a, "open"): 1.0,
        (pid_a, "half-open"): 0.0,
        (pid_b, "closed"): 1.0,
        (pid_b, "open"): 0.0,
        (pid_b, "half-open"): 0.0,
    }

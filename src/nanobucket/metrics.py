"""Metrics: Prometheus and OpenTelemetry counts of decisions, and the Redis breaker's state.

Each class has a ``hook`` to pass as ``on_decision=`` to a middleware, the
FastAPI dependency or ``limit`` (see `nanobucket.hooks`), and
``watch_breaker`` for a Redis limiter. Only bounded labels are used: the
route *pattern* (never a raw path, never a key), the outcome, the plan when
the limiter names one, and Redis's source and reason codes.

* ``nanobucket_decisions_total{route, outcome, plan}`` (Prometheus) /
  ``nanobucket.decisions`` (OpenTelemetry): ``outcome`` is ``admitted``,
  ``limited`` or ``shadow-limited``.
* ``nanobucket_redis_fallback_total{route, source, reason}`` /
  ``nanobucket.redis.fallback``: decisions a Redis limiter did not make
  itself (``source`` ``fallback``, ``policy:open`` or ``policy:closed``).
* ``nanobucket_breaker_state{breaker, state}`` /
  ``nanobucket.breaker.state``: 1 for the breaker's current state
  (``closed``, ``open``, ``half-open``), 0 for the others; read when scraped.

``prometheus_client`` and ``opentelemetry-api`` are imported by the class
that needs them (the ``prometheus`` and ``otel`` extras), never by the core.

>>> import nanobucket as nb
>>> from prometheus_client import CollectorRegistry
>>> metrics = PrometheusMetrics(registry=CollectorRegistry())
>>> ping = nb.limit(nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0),
...                 on_decision=metrics.hook)(lambda: "pong")
>>> ping()
'pong'
>>> metrics.value("<lambda>", "admitted")
1.0
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ._compose.hooks import LimitEvent

__all__ = ("OpenTelemetryMetrics", "PrometheusMetrics")

_STATES = ("closed", "open", "half-open")
_POLICY_SOURCES = frozenset(("fallback", "policy:open", "policy:closed"))


def _breaker_of(limiter_or_breaker: object) -> Any:
    """The `CircuitBreaker` of a Redis limiter, or the breaker itself."""
    breaker = getattr(limiter_or_breaker, "breaker", limiter_or_breaker)
    if not isinstance(getattr(type(breaker), "state", None), property):
        raise TypeError(
            f"watch_breaker takes a Redis limiter or a CircuitBreaker, "
            f"not {type(limiter_or_breaker).__name__}"
        )
    return breaker


def _breaker_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a breaker's name must be a non-empty str, not {name!r}")
    return name


def _fallback(event: LimitEvent) -> tuple[str, str] | None:
    """``(source, reason)`` when a Redis limiter did not decide itself, else None."""
    source = getattr(event.decision, "source", None)
    if source not in _POLICY_SOURCES:
        return None
    return source, getattr(event.decision, "reason", None) or ""


class PrometheusMetrics:
    """Prometheus counters of decisions (``.hook``) and a breaker gauge (`watch_breaker`).

    *registry*: a ``prometheus_client.CollectorRegistry`` (default: the
    global ``REGISTRY``, which ``prometheus_client.make_asgi_app()`` and
    ``generate_latest()`` serve); *namespace* prefixes every name.

    Several worker processes (``PROMETHEUS_MULTIPROC_DIR`` set before
    ``prometheus_client`` is imported): each worker's counts go to that
    directory, and a scrape through ``multiprocess.MultiProcessCollector``
    sums them; `value` is this process's count. A breaker's state is then
    written at `watch_breaker` and at each decision this process counts
    after it changes (the directory holds values, not functions), one
    series per live worker (a ``pid`` label: each worker has its own breaker).

    >>> from prometheus_client import CollectorRegistry
    >>> m = PrometheusMetrics(registry=CollectorRegistry(), namespace="api")
    >>> m.registry.get_sample_value("api_decisions_total",
    ...     {"route": "*", "outcome": "limited", "plan": ""}) is None   # not seen yet
    True
    """

    def __init__(self, registry: Any = None, *, namespace: str = "nanobucket") -> None:
        from prometheus_client import REGISTRY, Counter, Gauge

        if not isinstance(namespace, str) or not namespace.isidentifier():
            raise ValueError(f"namespace must be a Prometheus name, e.g. 'api', not {namespace!r}")
        self.registry = REGISTRY if registry is None else registry
        self.namespace = namespace
        self._decisions = Counter(
            f"{namespace}_decisions",
            "Rate-limit decisions by route pattern and outcome.",
            ["route", "outcome", "plan"],
            registry=self.registry,
        )
        self._fallbacks = Counter(
            f"{namespace}_redis_fallback",
            "Decisions a Redis limiter left to its fallback or failure policy.",
            ["route", "source", "reason"],
            registry=self.registry,
        )
        # Bounded like the labels: route patterns x outcomes x plans.
        self._children: dict[tuple[str, str, str], Any] = {}
        self._breaker = Gauge(
            f"{namespace}_breaker_state",
            "1 for the Redis circuit breaker's current state, 0 for the others.",
            ["breaker", "state"],
            registry=self.registry,
            multiprocess_mode="liveall",  # each worker's own breaker, while it lives
        )
        # Multiprocess mode: a gauge's value is written, never computed at the scrape,
        # so the watched breakers' states are written when they change (see `hook`).
        self._multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self._watched: dict[str, tuple[Any, list[str | None]]] = {}  # name -> breaker, [state]

    def hook(self, event: LimitEvent) -> None:
        """Count one decision: pass ``on_decision=metrics.hook``.

        >>> import nanobucket as nb
        >>> from prometheus_client import CollectorRegistry
        >>> m = PrometheusMetrics(registry=CollectorRegistry())
        >>> d = nb.TokenBucket(rate=1, capacity=1).check_at(0)
        >>> m.hook(nb.LimitEvent("alice", "/api/*", 1, d)); m.value("/api/*", "admitted")
        1.0
        """
        labels = (event.route, event.outcome, event.plan or "")
        child = self._children.get(labels)
        if child is None:  # labels() costs more than inc(): once per label set
            child = self._children.setdefault(labels, self._decisions.labels(*labels))
        child.inc()
        fallback = _fallback(event)
        if fallback is not None:
            self._fallbacks.labels(event.route, *fallback).inc()
        if self._watched:
            self._write_breakers()

    def _write_breakers(self) -> None:
        """Write each watched breaker's state where it changed (multiprocess mode)."""
        for name, (breaker, seen) in list(self._watched.items()):
            state = breaker.state
            if state != seen[0]:
                seen[0] = state
                for each in _STATES:
                    self._breaker.labels(name, each).set(1.0 if each == state else 0.0)

    def value(self, route: str, outcome: str, plan: str | None = None) -> float:
        """The count of *outcome* decisions on *route* so far (0.0 if none).

        >>> from prometheus_client import CollectorRegistry
        >>> PrometheusMetrics(registry=CollectorRegistry()).value("/login", "limited")
        0.0
        """
        labels = {"route": route, "outcome": outcome, "plan": plan or ""}
        found = self.registry.get_sample_value(f"{self.namespace}_decisions_total", labels)
        return 0.0 if found is None else float(found)

    def watch_breaker(self, limiter_or_breaker: object, name: str = "redis") -> None:
        """Export the state of a Redis limiter's `CircuitBreaker` as *name*, read when scraped.

        >>> from prometheus_client import CollectorRegistry
        >>> from nanobucket.redis import CircuitBreaker
        >>> m = PrometheusMetrics(registry=CollectorRegistry())
        >>> b = CircuitBreaker(backoff=1.0, clock=lambda: 0)
        >>> m.watch_breaker(b, "sessions"); b.record_failure()
        >>> m.registry.get_sample_value("nanobucket_breaker_state",
        ...                             {"breaker": "sessions", "state": "open"})
        1.0
        """
        breaker = _breaker_of(limiter_or_breaker)
        name = _breaker_name(name)
        if self._multiprocess:
            self._watched[name] = (breaker, [None])
            self._write_breakers()
            return
        for state in _STATES:
            self._breaker.labels(name, state).set_function(_is_state(breaker, state))


def _is_state(breaker: Any, state: str) -> Callable[[], float]:
    return lambda: 1.0 if breaker.state == state else 0.0


class OpenTelemetryMetrics:
    """OpenTelemetry instruments for decisions (``.hook``) and breakers (`watch_breaker`).

    *meter*: an ``opentelemetry.metrics.Meter``; default: the meter
    ``"nanobucket"`` of *meter_provider* (default: the global provider).

    >>> from opentelemetry.sdk.metrics import MeterProvider
    >>> from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    >>> import nanobucket as nb
    >>> provider = MeterProvider(metric_readers=[reader := InMemoryMetricReader()])
    >>> m = OpenTelemetryMetrics(meter_provider=provider)
    >>> m.hook(nb.LimitEvent("alice", "/login", 1, nb.TokenBucket(1, 1).check_at(0)))
    >>> [metric] = [x for rm in reader.get_metrics_data().resource_metrics
    ...             for sm in rm.scope_metrics for x in sm.metrics]
    >>> metric.name, [(dict(p.attributes), p.value) for p in metric.data.data_points]
    ('nanobucket.decisions', [({'route': '/login', 'outcome': 'admitted'}, 1)])
    >>> provider.shutdown()
    """

    def __init__(self, meter_provider: Any = None, *, meter: Any = None) -> None:
        from opentelemetry import metrics

        if meter is None:
            provider = meter_provider or metrics.get_meter_provider()
            meter = provider.get_meter("nanobucket")
        elif meter_provider is not None:
            raise TypeError("pass meter= or meter_provider=, not both")
        self.meter = meter
        self._decisions = meter.create_counter(
            "nanobucket.decisions",
            unit="{decision}",
            description="Rate-limit decisions by route pattern and outcome.",
        )
        self._fallbacks = meter.create_counter(
            "nanobucket.redis.fallback",
            unit="{decision}",
            description="Decisions a Redis limiter left to its fallback or failure policy.",
        )
        self._breakers: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self._gauge: Any = None

    def hook(self, event: LimitEvent) -> None:
        """Count one decision: pass ``on_decision=metrics.hook``.

        >>> import nanobucket as nb
        >>> from opentelemetry.sdk.metrics import MeterProvider
        >>> provider = MeterProvider()
        >>> m = OpenTelemetryMetrics(meter_provider=provider)
        >>> m.hook(nb.LimitEvent("alice", "/api/*", 1, nb.TokenBucket(1, 1).check_at(0)))
        >>> provider.shutdown()
        """
        attributes = {"route": event.route, "outcome": event.outcome}
        if event.plan is not None:
            attributes["plan"] = event.plan
        self._decisions.add(1, attributes)
        fallback = _fallback(event)
        if fallback is not None:
            source, reason = fallback
            self._fallbacks.add(1, {"route": event.route, "source": source, "reason": reason})

    def watch_breaker(self, limiter_or_breaker: object, name: str = "redis") -> None:
        """Report the state of a Redis limiter's `CircuitBreaker` as *name* at each collection.

        >>> from opentelemetry.sdk.metrics import MeterProvider
        >>> from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        >>> from nanobucket.redis import CircuitBreaker
        >>> provider = MeterProvider(metric_readers=[reader := InMemoryMetricReader()])
        >>> m = OpenTelemetryMetrics(meter_provider=provider)
        >>> m.watch_breaker(CircuitBreaker(), "sessions")
        >>> [metric] = [x for rm in reader.get_metrics_data().resource_metrics
        ...             for sm in rm.scope_metrics for x in sm.metrics]
        >>> sorted((p.attributes["state"], p.value) for p in metric.data.data_points)
        [('closed', 1), ('half-open', 0), ('open', 0)]
        >>> provider.shutdown()
        """
        from opentelemetry.metrics import Observation

        breaker = _breaker_of(limiter_or_breaker)
        name = _breaker_name(name)
        with self._lock:
            self._breakers.append((name, breaker))
            if self._gauge is not None:
                return

            def observe(options: Any) -> list[Any]:
                with self._lock:
                    watched = list(self._breakers)
                out = []
                for watched_name, b in watched:
                    current = b.state
                    for state in _STATES:
                        attributes = {"breaker": watched_name, "state": state}
                        out.append(Observation(1 if current == state else 0, attributes))
                return out

            self._gauge = self.meter.create_observable_gauge(
                "nanobucket.breaker.state",
                callbacks=[observe],
                description="1 for the Redis circuit breaker's current state, 0 for the others.",
            )

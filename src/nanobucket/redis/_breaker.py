"""The circuit breaker: stop calling a failing Redis for a back-off, then probe."""

from __future__ import annotations

import threading
from typing import Literal

from .._core._params import NS_PER_S, Clock, clock_or_monotonic, int_at_least, real_seconds

__all__ = ("CircuitBreaker",)


class CircuitBreaker:
    """Stops calling a failing Redis for a back-off, then lets one probe through.

    After ``failures`` consecutive failures the breaker opens for ``backoff``
    seconds; the first call after that is a probe: success closes the breaker
    (and resets the back-off), failure re-opens it for twice as long, up to
    ``max_backoff`` (by default ``backoff`` itself, 0.1 s: a call probes
    Redis every 0.1 s while it fails, so decisions are Redis's again within
    0.1 s of its answering; one caller per probe waits out a hung Redis's
    timeout: give a larger ``max_backoff`` to probe less often). Thread-safe; ``clock``
    (int ns) is injectable for tests. ``recoveries`` counts the times Redis
    answered again after failing.

    >>> b = CircuitBreaker(backoff=1.0, clock=lambda: 0)
    >>> b.record_failure(); b.allow_request()
    False
    """

    def __init__(
        self,
        *,
        failures: int = 1,
        backoff: float = 0.1,
        max_backoff: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        failures = int_at_least(failures, "failures", 1)
        if max_backoff is None:
            max_backoff = backoff  # a probe every back-off, however long Redis fails
        for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
            if not 0 < real_seconds(value, name) < 86_400 * 365:
                raise ValueError(f"{name} must be > 0 seconds and finite, got {value!r}")
        if max_backoff < backoff:
            raise ValueError(f"max_backoff {max_backoff!r} < backoff {backoff!r}")
        self._threshold = failures
        self._base_ns = int(backoff * NS_PER_S)
        self._max_ns = int(max_backoff * NS_PER_S)
        self._clock: Clock = clock_or_monotonic(clock)
        self._lock = threading.Lock()
        self._failures = 0
        self._backoff_ns = self._base_ns
        self._open_until = 0  # meaningful only while failures >= threshold
        self.recoveries = 0  # successes that ended a run of failures
        self._settings = (failures, backoff, max_backoff, clock)
        self._nodes: dict[str, CircuitBreaker] = {}  # a cluster's, by node (see `node`)

    def node(self, name: str) -> CircuitBreaker:
        """The breaker of one node of a Redis Cluster, made on first use with these
        settings: a node that fails opens its own, and keys of the other nodes keep
        going to Redis. This breaker's `state` is then the worst of its own and its
        nodes'.

        >>> b = CircuitBreaker(clock=lambda: 0)
        >>> b.node("10.0.0.1:6379").record_failure()
        >>> b.node("10.0.0.1:6379").state, b.node("10.0.0.2:6379").state, b.state
        ('open', 'closed', 'open')
        """
        found = self._nodes.get(name)  # every cluster decision asks: no lock once made
        if found is not None:
            return found
        with self._lock:
            found = self._nodes.get(name)
            if found is None:
                failures, backoff, max_backoff, clock = self._settings
                found = self._nodes[name] = CircuitBreaker(
                    failures=failures, backoff=backoff, max_backoff=max_backoff, clock=clock
                )
            return found

    @property
    def clock(self) -> Clock:
        """The clock (int ns) the back-off is read on: ``clock=``, else the monotonic one.

        >>> CircuitBreaker(clock=lambda: 7).clock()
        7
        """
        return self._clock

    @property
    def state(self) -> Literal["closed", "open", "half-open"]:
        """``closed`` (calls go to Redis), ``open`` (they do not), ``half-open`` (one probes).

        >>> now = [0]
        >>> b = CircuitBreaker(backoff=1.0, clock=lambda: now[0])
        >>> b.record_failure(); b.state
        'open'
        >>> now[0] = 1_000_000_000; b.state   # the back-off is over: the next call probes
        'half-open'
        """
        with self._lock:
            nodes = list(self._nodes.values())
            if self._failures < self._threshold:
                own = "closed"
            else:
                own = "open" if self._clock() < self._open_until else "half-open"
        states = {own, *(node.state for node in nodes)}
        return next(s for s in ("open", "half-open", "closed") if s in states)

    def allow_request(self) -> bool:
        """True if the caller may try Redis now (closed, or this call is the probe).

        >>> b = CircuitBreaker(clock=lambda: 0)
        >>> b.allow_request()
        True
        >>> b.record_failure(); b.allow_request()
        False
        """
        if self._failures < self._threshold:
            # Closed: no lock (a failure recorded meanwhile by another thread
            # is as if it came just after this call).
            return True
        with self._lock:
            if self._failures < self._threshold:
                return True
            now = self._clock()
            if now < self._open_until:
                return False
            # This caller probes; others keep getting the policy meanwhile.
            self._open_until = now + self._backoff_ns
            return True

    def retry_in_ns(self) -> int:
        """Nanoseconds until the breaker lets a probe through (0 when closed).

        >>> b = CircuitBreaker(backoff=0.5, clock=lambda: 0)
        >>> b.retry_in_ns()
        0
        >>> b.record_failure(); b.retry_in_ns()
        500000000
        """
        with self._lock:
            if self._failures < self._threshold:
                return 0
            return max(0, self._open_until - self._clock())

    def record_success(self) -> None:
        """Redis answered: close the breaker and reset the back-off.

        >>> b = CircuitBreaker(clock=lambda: 0)
        >>> b.record_failure(); b.record_success(); b.state
        'closed'
        """
        if not self._failures and self._backoff_ns == self._base_ns:
            return  # closed and reset already: no lock (as for `allow_request`)
        with self._lock:
            if self._failures:
                self.recoveries += 1
            self._failures = 0
            self._backoff_ns = self._base_ns

    def record_failure(self) -> None:
        """Redis failed: count it; open (or re-open, for twice as long) at the threshold.

        >>> b = CircuitBreaker(failures=2, backoff=1.0, clock=lambda: 0)
        >>> b.record_failure(); b.state
        'closed'
        >>> b.record_failure(); b.state, b.retry_in_ns()
        ('open', 1000000000)
        """
        with self._lock:
            self._failures += 1
            if self._failures < self._threshold:
                return
            if self._failures > self._threshold:
                self._backoff_ns = min(self._max_ns, self._backoff_ns * 2)
            self._open_until = self._clock() + self._backoff_ns

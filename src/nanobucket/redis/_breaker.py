"""The circuit breaker: stop calling a failing Redis for a back-off, then probe."""

from __future__ import annotations

import threading
from typing import Literal

from .._params import NS_PER_S, Clock, clock_or_monotonic, int_at_least, real_seconds

__all__ = ("CircuitBreaker",)


class CircuitBreaker:
    """Stops calling a failing Redis for a back-off, then lets one probe through.

    After ``failures`` consecutive failures the breaker opens for ``backoff``
    seconds; the first call after that is a probe: success closes the breaker
    (and resets the back-off), failure re-opens it for twice as long, up to
    ``max_backoff``. Thread-safe; ``clock`` (int ns) is injectable for tests.

    >>> b = CircuitBreaker(backoff=1.0, clock=lambda: 0)
    >>> b.record_failure(); b.allow_request()
    False
    """

    def __init__(
        self,
        *,
        failures: int = 1,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        failures = int_at_least(failures, "failures", 1)
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
            if self._failures < self._threshold:
                return "closed"
            return "open" if self._clock() < self._open_until else "half-open"

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

"""`Counters`: what an integration decided, counted for the app to read.

The gate counts each request once, as it decides it: ``admitted``,
``limited`` (answered 429), ``shadow_limited`` and ``exempt``.
"""

from __future__ import annotations

import threading

__all__ = ("Counters", "counters_or_new")


class Counters:
    """Requests seen by a middleware, readable by the app at any time.

    ``admitted``: passed the limiter; ``limited``: answered 429;
    ``shadow_limited``: would have been 429 but shadow mode let them through;
    ``exempt``: matched an exempt route or came from an exempt client
    (``exempt_clients=``) and were not counted by any limiter.

    >>> c = Counters(); c.snapshot()
    {'admitted': 0, 'limited': 0, 'shadow_limited': 0, 'exempt': 0}
    """

    __slots__ = ("_lock", "admitted", "exempt", "limited", "shadow_limited")

    def __init__(self) -> None:
        self.admitted = 0
        self.limited = 0
        self.shadow_limited = 0
        self.exempt = 0
        # Taken where threads may count at once (WSGI, Django); an ASGI app
        # decides on its one event-loop thread and counts without it.
        self._lock = threading.Lock()

    def add(self, count: str) -> None:
        """Add one to *count* (``"admitted"``, ``"limited"``, ...), safely from any thread.

        >>> c = Counters(); c.add("limited"); c.add("limited")
        >>> c.limited
        2
        """
        with self._lock:
            setattr(self, count, getattr(self, count) + 1)

    def snapshot(self) -> dict[str, int]:
        """The four counts as a dict, read together.

        >>> c = Counters(); c.limited += 1
        >>> c.snapshot()["limited"]
        1
        """
        with self._lock:
            return {
                "admitted": self.admitted,
                "limited": self.limited,
                "shadow_limited": self.shadow_limited,
                "exempt": self.exempt,
            }

    def reset(self) -> None:
        """Set every count back to 0.

        >>> c = Counters(); c.admitted += 5; c.reset()
        >>> c.admitted
        0
        """
        with self._lock:
            self.admitted = self.limited = self.shadow_limited = self.exempt = 0

    def __repr__(self) -> str:
        return f"Counters({self.snapshot()})"


def counters_or_new(counters: object) -> Counters:
    """``counters=``: a `Counters` the app keeps, or None for a fresh one."""
    if counters is None:
        return Counters()
    if not isinstance(counters, Counters):
        raise TypeError(f"counters must be a nanobucket Counters, not {type(counters).__name__}")
    return counters

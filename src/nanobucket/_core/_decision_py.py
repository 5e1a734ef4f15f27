"""The pure-Python twin's `Decision`: what every verb of a limiter answers.

The Cython core has its own, field for field the same (the twins are held
to one behaviour); `nanobucket.Decision` is the selected one.
"""

from __future__ import annotations

import operator
from typing import TypeVar

from ._params import NS_PER_S

__all__ = ("Decision",)

D = TypeVar("D", bound="Decision")


def _int64(value: object) -> int:
    """*value* as a Decision field: an int in the int64 range, as a C field holds."""
    n = operator.index(value)  # type: ignore[arg-type]
    if not -(2**63) <= n < 2**63:
        raise OverflowError("Python int too large to convert to C long")
    return n


class Decision:
    """The outcome of ``check`` or ``peek``, with exact integer times.

    >>> d = TokenBucket(rate=100, capacity=200).check_at(0)
    >>> (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)
    (True, 199, 0, 10000000, 200)

    Built from the five fields in that order (an adapter, a test), it equals
    any decision with the same fields:

    >>> d == Decision(True, 199, 0, 10_000_000, 200)
    True
    """

    # A dict: each field's docstring (the Cython twin's fields carry the same).
    __slots__ = {
        "allowed": """True if the request was admitted (for ``peek``: would be).

        >>> TokenBucket(rate=1, capacity=1).check_at(0).allowed
        True
        """,
        "limit": """The bucket's capacity (the ``X-RateLimit-Limit`` of HTTP responses).

        >>> TokenBucket(rate=1, capacity=5).check_at(0).limit
        5
        """,
        "remaining": """Whole tokens the bucket holds after this decision (a ``peek``: as if spent).

        >>> TokenBucket(rate=1, capacity=5).check_at(0, cost=2).remaining
        3
        """,
        "reset_after_ns": """Nanoseconds until the bucket is full again.

        >>> TokenBucket(rate=2, capacity=4).check_at(0, cost=3).reset_after_ns
        1500000000
        """,
        "retry_after_ns": """Nanoseconds until the same request would be admitted (0 if it was).

        >>> b = TokenBucket(rate=2, capacity=1)
        >>> b.check_at(0).retry_after_ns, b.check_at(0).retry_after_ns
        (0, 500000000)
        """,
    }

    allowed: bool
    remaining: int
    retry_after_ns: int
    reset_after_ns: int
    limit: int

    def __init__(
        self, allowed: bool, remaining: int, retry_after_ns: int, reset_after_ns: int, limit: int
    ) -> None:
        # As the Cython twin's C fields: a truth value, and int64s (an int or
        # an __index__; 0.5 is a TypeError, not a truncation).
        self.allowed = bool(allowed)
        self.remaining = _int64(remaining)
        self.retry_after_ns = _int64(retry_after_ns)
        self.reset_after_ns = _int64(reset_after_ns)
        self.limit = _int64(limit)

    @property
    def retry_after(self) -> float:
        """Seconds until the same request would be admitted (0.0 if it was).

        >>> b = TokenBucket(rate=4, capacity=1)
        >>> b.check_at(0).retry_after, b.check_at(0).retry_after
        (0.0, 0.25)
        """
        return self.retry_after_ns / NS_PER_S

    @property
    def reset_after(self) -> float:
        """Seconds until the bucket is full again.

        >>> TokenBucket(rate=4, capacity=2).check_at(0).reset_after
        0.25
        """
        return self.reset_after_ns / NS_PER_S

    def __bool__(self) -> bool:
        return self.allowed

    def copy_as(self, cls: type[D]) -> D:
        """A new *cls* (a subclass of Decision) with this decision's five fields.

        What a limiter that wraps another's decision (``tiered``'s) builds its
        own from, in one call.

        >>> class Named(Decision):
        ...     __slots__ = ("name",)
        >>> d = TokenBucket(rate=1, capacity=2).check_at(0).copy_as(Named)
        >>> type(d).__name__, d.remaining, d.limit
        ('Named', 1, 2)
        """
        if not (isinstance(cls, type) and issubclass(cls, Decision)):
            raise TypeError(f"copy_as makes a subclass of Decision, not {cls!r}")
        made = cls.__new__(cls)
        made.allowed = self.allowed
        made.remaining = self.remaining
        made.retry_after_ns = self.retry_after_ns
        made.reset_after_ns = self.reset_after_ns
        made.limit = self.limit
        return made

    def __eq__(self, other: object) -> bool:
        if not hasattr(other, "retry_after_ns"):
            return NotImplemented
        return _fields(self) == _fields(other)

    def __hash__(self) -> int:
        return hash(_fields(self))

    def __repr__(self) -> str:
        # The class's own name: RedisDecision extends this repr.
        return (
            f"{type(self).__name__}(allowed={self.allowed}, remaining={self.remaining}, "
            f"retry_after_ns={self.retry_after_ns}, reset_after_ns={self.reset_after_ns}, "
            f"limit={self.limit})"
        )


def _fields(d: object) -> tuple[object, ...]:
    return tuple(
        getattr(d, name)
        for name in ("allowed", "remaining", "retry_after_ns", "reset_after_ns", "limit")
    )

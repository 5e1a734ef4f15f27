"""What a limiter is to the wrappers: its verbs, and whether they take a key.

Every limiter class says whether its verbs take a key first with a class
attribute ``keyed``: ``False`` for ``allow(cost=1)`` (`TokenBucket`,
`Concurrency`), ``True`` for ``allow(key, cost=1)`` (`KeyedTokenBucket`,
the shared and Redis tables, ``all_of``, ``tiered``). The wrappers
(``all_of``, `Waiting`, ``@limit``, the middlewares, the executor, the Celery
task) read it once, when they are built; nothing reads a signature.

A limiter of your own provides ``keyed`` and the verbs of `Limiter` or
`KeyedLimiter`, and for the wrappers that use them: ``refund`` (an ``all_of``
with more than one such layer), ``acquire`` / ``acquire_async`` (``@limit(...,
wait=True)``), ``release`` with ``releases = True`` (an in-flight limit: the
wrappers release it when the call ends), ``key_optional = True`` (a keyed
limiter whose verbs also take key None). A decision is a
`nanobucket.Decision`, or any object with its fields::

    class PerUser:
        keyed = True

        def allow(self, key, cost=1): ...
        def check(self, key, cost=1): ...   # a nanobucket.Decision
        def peek(self, key, cost=1): ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._bucket_py import Decision

__all__ = ("KeyedLimiter", "Limiter", "is_keyed")


class Limiter(Protocol):
    """A limiter whose verbs take no key: ``allow(cost=1)``, ``keyed = False``."""

    keyed: bool

    def allow(self, cost: int = 1) -> bool: ...
    def check(self, cost: int = 1) -> Decision: ...
    def peek(self, cost: int = 1) -> Decision: ...


class KeyedLimiter(Protocol):
    """A limiter whose verbs take the key first: ``allow(key, cost=1)``, ``keyed = True``."""

    keyed: bool

    # key: Any, so that a limiter of str keys (``allow(self, key: str, ...)``) is one.
    def allow(self, key: Any, cost: int = 1) -> bool: ...
    def check(self, key: Any, cost: int = 1) -> Decision: ...
    def peek(self, key: Any, cost: int = 1) -> Decision: ...


def is_keyed(limiter: object) -> bool:
    """*limiter*'s ``keyed``: True if its verbs take a key first.

    >>> import nanobucket as nb
    >>> is_keyed(nb.TokenBucket(1, 1)), is_keyed(nb.KeyedTokenBucket(1, 1))
    (False, True)
    >>> is_keyed(object())
    Traceback (most recent call last):
    ...
    TypeError: object is not a limiter: its class declares no keyed = True/False
    """
    keyed = getattr(limiter, "keyed", None)
    if type(keyed) is not bool:
        raise TypeError(
            f"{type(limiter).__name__} is not a limiter: its class declares no keyed = True/False"
        )
    return keyed

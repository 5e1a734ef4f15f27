"""Celery tasks that spend a token before they run, and retry instead of blocking a worker.

``RateLimitedTask`` is a task base class. Before the task's body runs it
spends a token of its *limiter* -- a ``RedisTokenBucket`` for one limit
shared by every worker on every machine. Refused, the task is not run: it is
retried with ``self.retry(countdown=decision.retry_after)`` (rounded up to
the microsecond, Celery's precision), the time until the token exists, and
the worker moves on to other work meanwhile. Celery's broker holds the
retried message until then.

>>> import celery
>>> import nanobucket as nb
>>> app = celery.Celery("example")
>>> app.conf.task_always_eager = True    # no broker needed for the example
>>> @app.task(base=RateLimitedTask, limiter=nb.TokenBucket(rate=2, capacity=3))
... def call_api(n: int) -> int:
...     return n * 10
>>> [call_api.delay(n).get() for n in range(3)]
[0, 10, 20]
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import celery

from ._compose.executor import checked_cost
from ._core._limiter import is_keyed, traits

__all__ = ("RateLimitedTask", "countdown")


def countdown(decision: Any) -> float:
    """*decision*'s ``retry_after`` in seconds, rounded up to Celery's microseconds.

    Celery turns a countdown into an ETA with microsecond precision (a
    ``timedelta``, which rounds to the nearest microsecond): rounded up, the
    retried task never arrives before its token exists.

    >>> import nanobucket as nb
    >>> b = nb.TokenBucket(rate=3, capacity=1)
    >>> first, second = b.check_at(0), b.check_at(0)
    >>> second.retry_after_ns, countdown(second)
    (333333334, 0.333334)
    """
    return -(-int(decision.retry_after_ns) // 1000) / 1e6


class RateLimitedTask(celery.Task):  # type: ignore[misc]
    """A Celery task that takes *limiter*'s tokens before it runs, or is retried when they exist.

    Set the options on the task: ``@app.task(base=RateLimitedTask,
    limiter=..., limit_key=..., limit_cost=...)``. ``limiter``: any limiter
    with ``check`` (a keyed one spends from ``limit_key``'s bucket: a
    callable of the task's arguments, or by default the task's name, so one
    limit covers every call of that task). ``limit_cost``: an int or a
    callable of the arguments (default 1). A refused call raises
    ``self.retry(countdown=retry_after)``; ``max_retries`` is None (retry
    until admitted) unless the task sets it, and every retry counts in
    ``request.retries``, as Celery counts retries.

    >>> import celery
    >>> import nanobucket as nb
    >>> app = celery.Celery("example", set_as_current=False)
    >>> clock = [0]    # the bucket's clock, moved by hand
    >>> @app.task(base=RateLimitedTask, limiter=nb.KeyedTokenBucket(2, 1, clock=lambda: clock[0]),
    ...           limit_key=lambda user: user)
    ... def sync(user: str) -> str:
    ...     return f"synced {user}"
    >>> sync.limit_decision("alice").allowed, sync.limit_decision("alice").retry_after
    (True, 0.5)
    """

    limiter: Any = None
    limit_key: Callable[..., Hashable] | None = None
    limit_cost: int | Callable[..., int] = 1
    max_retries: int | None = None

    def limit_decision(self, *args: Any, **kwargs: Any) -> Any:
        """Spend the call's tokens now: the limiter's `Decision` for ``(*args, **kwargs)``.

        >>> import celery
        >>> import nanobucket as nb
        >>> app = celery.Celery("example", set_as_current=False)
        >>> @app.task(base=RateLimitedTask, limiter=nb.TokenBucket(1, 2, clock=lambda: 0),
        ...           limit_cost=lambda rows: len(rows))
        ... def store(rows: list[int]) -> None: ...
        >>> d = store.limit_decision([1, 2]); d.allowed, d.remaining
        (True, 0)
        """
        limiter = self.limiter
        if limiter is None or not traits(limiter).checks:
            raise TypeError(
                f"task {self.name}: give it a limiter, "
                "@app.task(base=RateLimitedTask, limiter=<a limiter with check()>)"
            )
        cls = type(self)  # on the class: a function option is not bound to the task
        cost = cls.limit_cost
        cost = checked_cost(limiter, cost(*args, **kwargs) if callable(cost) else cost)
        if not is_keyed(limiter):
            return limiter.check(cost)
        key = cls.limit_key
        return limiter.check(self.name if key is None else key(*args, **kwargs), cost)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        d = self.limit_decision(*args, **kwargs)
        if not d.allowed:
            raise self.retry(countdown=countdown(d))
        return super().__call__(*args, **kwargs)

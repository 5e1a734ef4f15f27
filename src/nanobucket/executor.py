"""``LimitedExecutor``: a worker pool whose tasks start no faster than a limiter allows.

It wraps any ``concurrent.futures.Executor`` (threads or processes). A
submitted task waits in a bounded FIFO queue of its own; one pacing thread
takes the task at its head, waits for its tokens in the limiter's own line
(a reservation, slept on exactly, as ``acquire`` does: no polling) and only
then hands it to the wrapped executor. So tasks start in the order they were
submitted, and in any window of T seconds at most ``capacity + rate*T``
start. The queue holds at most *max_pending* tasks: past it ``submit``
blocks for at most *timeout* seconds and then raises `QueueFull` (at once
with ``timeout=0``), so memory never grows without bound.

>>> from concurrent.futures import ThreadPoolExecutor
>>> import nanobucket as nb
>>> with nb.LimitedExecutor(ThreadPoolExecutor(4), nb.TokenBucket(rate=100, capacity=5)) as pool:
...     list(pool.map(pow, [2, 3, 4], [2, 2, 2]))
[4, 9, 16]
"""

from ._compose.executor import (
    DEFAULT_MAX_PENDING,
    LimitedExecutor,
    QueueFull,
)

__all__ = ["DEFAULT_MAX_PENDING", "LimitedExecutor", "QueueFull"]

"""Pacing for asyncio: ``paced`` (an iterable, item by item) and ``paced_gather`` (awaitables).

Both take each token with the limiter's ``acquire_async``: the wait is a
reservation in the limiter's FIFO line, slept on exactly, and a task
cancelled while it waits gives its reservation back.

>>> import asyncio
>>> import nanobucket as nb
>>> async def main():
...     return [item async for item in nb.paced("abc", nb.TokenBucket(rate=100, capacity=3))]
>>> asyncio.run(main())
['a', 'b', 'c']
"""

from ._compose.pacing import (
    paced,
    paced_gather,
)

__all__ = ["paced", "paced_gather"]

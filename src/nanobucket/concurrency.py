"""In-flight limits: at most *max_in_flight* requests at once, waiting in a bounded FIFO line.

A token bucket bounds how often requests start; a database pool or a paid
API also bounds how many run at once. ``Concurrency(10)`` admits a request
while fewer than 10 hold a slot, and the request gives its slot back when
it finishes (``release``, or the end of a ``with`` block)::

    pool = Concurrency(10)
    with pool.slot(timeout=1.0):      # raises RateLimited after 1 s in line
        run_query()

    limit = all_of(Concurrency(10), TokenBucket(rate=100, capacity=20))
    with limit.slot(timeout=1.0):     # 10 at once AND 100/s with bursts of 20
        call_the_api()

``cost`` is a number of slots (default 1), as it is a number of tokens for
a bucket. Waiters are served first in, first out: a slot freed while
someone waits goes to the first waiter whose cost fits, and a later caller
-- waiting or calling ``allow`` -- is refused while anyone waits, so a large
cost is never starved by small ones. A waiter that gives up (its timeout, a
cancelled task, an interrupted thread) holds nothing: whatever it was
handed meanwhile goes on to the next in line.

One object serves threads and asyncio tasks together, on any loops: one
lock guards the count and the line (held only to update them, never while
anyone sleeps); a thread sleeps on a bell of its own, a task on a future of
its own loop, which a release from any thread settles. It is one process's
limit: the workers of a pre-fork server each have their own.

>>> pool = Concurrency(2)
>>> pool.allow(), pool.allow(), pool.allow()
(True, True, False)
>>> pool.release(); pool.in_flight
1
"""

from ._compose.concurrency import (
    Concurrency,
    KeyedConcurrency,
    Slot,
)

__all__ = ["Concurrency", "KeyedConcurrency", "Slot"]

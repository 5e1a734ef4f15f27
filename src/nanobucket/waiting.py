"""Waiting instead of rejecting: ``acquire`` / ``acquire_async`` over a bounded, FIFO line.

A waiter does not poll. It *reserves* its tokens at once (``reserve`` on
the bucket): the bucket's ``tat`` may move past "empty", and the time by
which it is past is the waiter's place in line. Everyone after it -- other
waiters and plain ``allow`` callers alike -- sees a bucket that is still
owed those tokens, so waiters are served first in, first out per bucket and
a large cost is never starved by a stream of small ones. The waiter then
sleeps exactly until its tokens exist.

Bounds, so that waiting never becomes an unbounded queue in memory:

* ``timeout`` (seconds): a wait longer than it is refused at once, before
  anything is reserved (``acquire`` returns False);
* ``max_waiters`` (default 1024 per limiter): past it, ``acquire`` returns
  False at once.

A waiter that gives up while it sleeps (a cancelled task, a timeout around
it, a ``KeyboardInterrupt``) gives its tokens back, and the waiters behind it
in the same bucket's line are moved up by as much and woken to sleep for
what is left (see ``_wait``): a caller that arrives later, waiting or not,
is still served after them: per ``TokenBucket``, per key of a
``KeyedTokenBucket`` and per layer of an ``all_of``, in one process.

``Waiting(limiter, shape=True)`` -- or ``LeakyBucket(rate)`` -- releases
callers at an even rate, one slot of ``cost / rate`` seconds each, with no
burst: the leaky bucket used as a shaper, for a downstream that needs smooth
load.

>>> import nanobucket as nb
>>> b = nb.TokenBucket(rate=100, capacity=200)
>>> b.acquire(timeout=0.5)          # blocks at most 0.5 s
True
"""

from ._compose.waiting import (
    DEFAULT_MAX_WAITERS,
    LeakyBucket,
    Waiting,
)

__all__ = ["DEFAULT_MAX_WAITERS", "LeakyBucket", "Waiting"]

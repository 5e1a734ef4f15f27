"""Several limits as one: ``all_of(*limiters)`` admits a request only if every layer does.

The case study's two limits at once -- one bucket per client key and a protective
global one per instance -- or several bandwidths on one resource (100/s
with bursts of 200 AND 3000 per minute)::

    per_client = KeyedTokenBucket(rate=100, capacity=200)
    instance = TokenBucket(rate=1000, capacity=1000)
    limit = all_of(per_client, instance)
    limit.allow("alice")           # keyed layers get the key, unkeyed ones do not

    api = all_of(TokenBucket(rate=100, capacity=200), TokenBucket(rate=50, capacity=3000))

All or nothing, also under threads, without a lock: layers are charged one
after the other, and when one rejects, the layers already charged get their
tokens back (``refund``), so a rejected request charges no layer and a
bucket shared with callers outside the ``all_of`` can never be pushed past
its own limit (each charge is that bucket's own atomic ``allow``). While a
rejected request is being undone, a concurrent caller may briefly see an
earlier layer a few tokens poorer (it may be refused, never over-admitted).

A layer without ``refund`` (a limiter of your own) is accepted
once: it is charged last, so a rejection from it needs no undo on it. Two
such layers cannot be made all-or-nothing: ``TypeError``.
The Redis limiters refund (each refund one atomic script), so any number of
them, with in-process layers or not, are all-or-nothing, and wait in
``acquire`` (reserved in Redis, given back when a later layer refuses).

In-flight layers (``Concurrency``, ``KeyedConcurrency``) hold their slots
after the request is admitted: ``release`` gives them back when it is done
(the tokens stay spent), and ``slot()`` does so at the end of a ``with``
block. ``acquire`` first waits for the in-flight layers' slots, in the
order given, then for the other layers' tokens with what is left of the
timeout; a caller refused or cancelled on the way holds nothing::

    db = all_of(Concurrency(10), TokenBucket(rate=100, capacity=20))
    with db.slot(timeout=1.0):       # 10 at once, 100/s, bursts of 20
        run_query()
"""

from ._compose.layered import (
    AllOf,
    LayeredDecision,
    all_of,
)

__all__ = ["AllOf", "LayeredDecision", "all_of"]

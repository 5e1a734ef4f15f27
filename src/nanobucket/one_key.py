"""One key of a keyed limiter as a limiter of its own: ``OneKey(table, key)``.

A limit for a whole instance, or for every worker process of a machine, is
one bucket; the shared-memory table and the Redis limiters are keyed. A
`OneKey` takes no key: each verb is the table's for *key*, so it goes where
a `TokenBucket` goes, an ``all_of`` beside a per-client table first of all::

    per_client = SharedKeyedTokenBucket.create_anonymous(rate=100, capacity=200)
    everyone = OneKey(SharedKeyedTokenBucket.create_anonymous(rate=1000, capacity=1000), "all")
    limit = all_of(per_client, everyone)     # per client, and for all the workers together
"""

from ._compose.one_key import (
    OneKey,
)

__all__ = ["OneKey"]

"""One key space per limit: limiters of different limits on one prefix never share a bucket.

A bucket in Redis is a number (its theoretical arrival time) that means
something only under one interval and one capacity: two limiters with
different limits reading one bucket would each admit what neither was set
to. So a limiter keeps its buckets under its prefix *and* its limit,
``<prefix>:<interval_us>:<capacity>:{<key>}``: limiters of one limit share
every bucket, limiters of two limits (the old and the new release of a
rolling deploy, say) each decide exactly under their own, on buckets of
their own, with nothing to check and nothing to record. A bucket under a
limit no limiter has used yet is a missing key, a full bucket: a key starts
full once under a new limit, and the old limit's buckets expire by
themselves as they fill up. The interval is the whole microseconds the
scripts apply, so two rates Redis applies alike are one limit.

The user key stays the Redis Cluster hash tag: every bucket of one key
(every limit, every prefix) lives in one slot.
"""

from __future__ import annotations

__all__ = ("PrefixConflict", "space")


class PrefixConflict(ValueError):
    """Never raised since each limit keeps its buckets apart (see `space`); kept so that
    code catching it still imports.

    >>> issubclass(PrefixConflict, ValueError)
    True
    """


# Named where users import it from, as tracebacks print it.
PrefixConflict.__module__ = "nanobucket.redis"


def space(prefix: bytes, interval_us: int, capacity: int) -> bytes:
    """The start of every bucket key of one limit on *prefix*: the key follows, then ``}``.

    The last two fields before ``{`` are always the limit's, so no two
    (prefix, limit) pairs share a space, whatever the prefix holds.

    >>> space(b"api", 10_000, 200)   # rate 100/s, capacity 200
    b'api:10000:200:{'
    """
    return b"%b:%d:%d:{" % (prefix, interval_us, capacity)

# cython: language_level=3, freethreading_compatible=True
"""The benchmarks' floor: an extension type whose methods do nothing.

Calling ``Floor().allow()`` costs what any call into a Cython method with an
optional argument costs (the loop, the bound-method call, argument parsing,
returning a cached object) and nothing else. The benchmarks time it beside
the real limiters, called the same way, so every figure reads as a multiple
of the least a method call can cost on the machine at hand.

``Floor().allow_clock()`` also reads the monotonic clock, with the same C
function as the limiters: the least a call that reads the clock can cost.
Where the clock is slow (about 16 ns on a VM, as much as the call itself),
it says how much of a limiter's time is the clock's.
"""

cimport cython
from libc.stdint cimport int64_t


cdef extern from "_atomic.h":
    int64_t nb_monotonic_ns() noexcept nogil


@cython.final
cdef class Floor:
    """No-op methods shaped like `TokenBucket` and `KeyedTokenBucket`'s verbs.

    >>> f = Floor()
    >>> f.allow(), f.allow_key("alice"), f.check(cost=2), f.allow_many(["a", "b"])
    (True, True, True, None)
    >>> f.allow_clock()
    True
    """

    def allow(self, cost=1):
        """Shaped like ``TokenBucket.allow``; does nothing, returns True."""
        return True

    def allow_clock(self, cost=1):
        """Shaped like ``TokenBucket.allow``; reads the monotonic clock, returns True."""
        nb_monotonic_ns()
        return True

    def allow_at(self, now, cost=1):
        """Shaped like ``TokenBucket.allow_at``; does nothing, returns True."""
        return True

    def allow_key(self, key, cost=1):
        """Shaped like ``KeyedTokenBucket.allow(key)``; does nothing, returns True."""
        return True

    def check(self, cost=1):
        """Shaped like ``TokenBucket.check``; does nothing, returns True."""
        return True

    def check_key(self, key, cost=1):
        """Shaped like ``KeyedTokenBucket.check(key)``; does nothing, returns True."""
        return True

    def allow_many(self, keys, cost=1):
        """Shaped like ``KeyedTokenBucket.allow_many``; does nothing, returns None."""
        return None

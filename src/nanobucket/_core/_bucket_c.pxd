# Decision's layout, so that every Cython module builds the one Decision type
# directly (`fill_decision`), at the cost of a freelist pop and five stores.
from libc.stdint cimport int64_t

from nanobucket._core cimport _gcra as gcra


cdef class Decision:
    cdef bint _allowed
    cdef int64_t _remaining
    cdef int64_t _retry_after_ns
    cdef int64_t _reset_after_ns
    cdef int64_t _limit


cdef inline Decision fill_decision(Decision d, bint allowed, int64_t tat, int64_t now,
                                   int64_t base, int64_t tau, int64_t interval, int64_t cost_t,
                                   int64_t capacity):
    """*d* (new) as the Decision of `gcra.step`/`gcra.take`: *tat* after it, *base* as seen by it.

    The caller makes *d* with ``Decision.__new__(Decision)``: in _bucket_c,
    which defines the type, that compiles to a direct call of its tp_new.
    """
    d._allowed = allowed
    d._remaining = gcra.remaining(tat, now, tau, interval)
    d._retry_after_ns = gcra.retry_after_ns(allowed, base, now, tau - cost_t)
    d._reset_after_ns = gcra.reset_after_ns(tat, now)
    d._limit = capacity
    return d

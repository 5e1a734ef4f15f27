# The GCRA rule, written once for every Cython module (cdef inline: each
# module that cimports it compiles its own copy, with no link at run time).
#
# A bucket is one word, tat (theoretical arrival time, ns). With T ns per
# token and tau = capacity*T, a request of cost*T = cost_t is admitted iff
# max(tat, now) + cost_t - now <= tau, and then tat = max(tat, now) + cost_t.
# The verbs pass slack = tau - cost_t, so the test reads base - now <= slack.
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport INT64_MAX, int64_t

from nanobucket._core._atomic cimport nb_cas, nb_load, nb_store


cdef inline bint step(int64_t tat, int64_t now, int64_t cost_t, int64_t slack,
                      int64_t *tat_out, int64_t *base_out) noexcept nogil:
    """The decision on *tat*, written nowhere: admitted or not.

    *tat_out: the tat after it (unchanged when rejected, and for cost 0, a
    probe); *base_out: max(tat, now), which `retry_after_ns` needs.
    """
    cdef int64_t base = tat if tat > now else now
    base_out[0] = base
    if base - now > slack:
        tat_out[0] = tat
        return False
    tat_out[0] = base + cost_t if cost_t else tat
    return True


cdef inline bint take(int64_t *word, int64_t now, int64_t cost_t, int64_t slack,
                      int64_t *tat_out, int64_t *base_out, bint alone) noexcept nogil:
    """`step` applied to one word, by CAS (a plain store when *alone*).

    *alone*: the caller is the word's only writer until this returns (it
    holds the object's critical section, which every writer of a
    `TokenBucket` takes, or the keyed table's with no batch deciding outside
    it; on a GIL build the GIL).
    """
    cdef int64_t old = nb_load(word)
    while True:
        if not step(old, now, cost_t, slack, tat_out, base_out):
            return False
        if cost_t == 0:
            return True
        if alone:
            nb_store(word, tat_out[0])
            return True
        if nb_cas(word, &old, tat_out[0]):
            return True
        # another thread moved the word: `old` now holds its value; retry


cdef inline int64_t reserve(int64_t *word, int64_t now, int64_t cost_t, int64_t slack,
                            int64_t max_wait) noexcept nogil:
    """Move the word past empty if need be: the ns to wait, or -1 (nothing written).

    The wait ends when max(tat, now) + cost*T - now <= slack: slack = tau
    waits for the tokens, slack = cost*T for the slot's start (shaping).
    """
    cdef int64_t old = nb_load(word)
    cdef int64_t base, wait
    while True:
        base = old if old > now else now
        wait = base - now - (slack - cost_t)
        if wait < 0:
            wait = 0
        if wait > max_wait or base > INT64_MAX - cost_t:
            return -1
        if cost_t == 0 or nb_cas(word, &old, base + cost_t):
            return wait


cdef inline void give_back(int64_t *word, int64_t now, int64_t cost_t) noexcept nogil:
    """tat = max(now, tat - cost*T) by CAS; a full bucket (tat <= now) is left alone."""
    cdef int64_t old = nb_load(word)
    cdef int64_t new
    while old > now:
        new = old - cost_t
        if new < now:
            new = now
        if nb_cas(word, &old, new):
            return


# -- the Decision's numbers, from the tat after the decision -------------------

cdef inline int64_t reset_after_ns(int64_t tat, int64_t now) noexcept nogil:
    """Nanoseconds until full: max(0, tat - now)."""
    return tat - now if tat > now else 0


cdef inline int64_t remaining(int64_t tat, int64_t now, int64_t tau,
                              int64_t interval) noexcept nogil:
    """Whole tokens left: floor(capacity - max(0, tat - now) / T)."""
    cdef int64_t debt = reset_after_ns(tat, now)
    return (tau - debt) // interval if debt <= tau else 0


cdef inline int64_t retry_after_ns(bint allowed, int64_t base, int64_t now,
                                   int64_t slack) noexcept nogil:
    """Nanoseconds until the same request fits (0 if admitted): *base* is `step`'s."""
    return 0 if allowed else base - now - slack


cdef inline double tokens(int64_t tat, int64_t now, int64_t tau, int64_t interval,
                          int64_t capacity) noexcept nogil:
    """Tokens held at *now*, as a float (``tokens()``)."""
    cdef int64_t debt = reset_after_ns(tat, now)
    if debt >= tau:
        return 0.0
    # Past 2**53 ns, (tau - debt) rounds on its way to a double and the
    # quotient could exceed capacity: cap it (below, the same as Python's).
    cdef double t = <double>(tau - debt) / <double>interval
    return t if t < <double>capacity else <double>capacity


# -- parsing an explicit time ---------------------------------------------------

cdef inline int64_t as_now(object now, object parse) except -1:
    """*now* as int ns in [0, 2**62): an exact int inline, anything else by *parse*.

    *parse* is the module's validator (it raises a clear TypeError/ValueError).
    """
    cdef int overflow = 0
    cdef long long value
    if type(now) is int:
        value = PyLong_AsLongLongAndOverflow(now, &overflow)
        if not overflow and 0 <= value <= <long long>0x3FFFFFFFFFFFFFFF:  # 2**62 - 1
            return value
    return parse(now)

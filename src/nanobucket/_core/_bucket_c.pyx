# cython: language_level=3, freethreading_compatible=True
"""Cython token buckets: the same classes as ``_bucket_py``, one int64 per bucket.

Each bucket is one 8-byte word, its GCRA ``tat`` in ns, changed by
compare-and-swap (``_atomic.h``) wherever another thread could write it at
the same time; a rejected request writes nothing. The keyed table is a
compact hash table; its structure changes under the GIL, or a per-table
critical section on free-threaded builds. Where the GIL or that section
already excludes every other writer, a word is changed by a plain store:
the CAS would only cost time.
"""

cimport cython
from cpython.buffer cimport PyObject_CheckBuffer
from cpython.long cimport (
    PyLong_AsLongLongAndOverflow,
    PyLong_CheckExact,
    PyLong_FromUnsignedLongLong,
)
from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree, PyMem_RawMalloc
from cpython.number cimport PyNumber_Index
from cpython.object cimport Py_EQ, PyObject, PyObject_RichCompareBool
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.sequence cimport PySequence_Fast
from cpython.tuple cimport PyTuple_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t
from libc.string cimport memset

from nanobucket._core cimport _gcra as gcra
from nanobucket._core._atomic cimport (
    nb_add, nb_cas, nb_load, nb_load_relaxed, nb_monotonic_ns, nb_prefetch, nb_store,
    nb_store_relaxed)
from nanobucket._core._capi cimport (
    PyByteArray_AS_STRING,
    PyByteArray_FromStringAndSize,
    PyComplex_Check,
    PyFloat_AS_DOUBLE,
    PyFloat_CheckExact,
    PyLong_Check,
    PyLong_FromDouble,
    PyNumber_Check,
    PySequence_Fast_GET_SIZE,
    PySequence_Fast_ITEMS,
    PyUnicode_CheckExact,
)

import os
import warnings

from . import _acquire
from ._limiter import Reservation
from ._wait import retimed
from ._params import (
    bucket_params, forked_warning, kept_capacity, none_key_error, public_rate, unkeyed_cost,
    unkeyed_now, unpicklable_error, validated_clock,
    validated_cost, validated_flag, validated_max_keys, validated_max_wait, validated_now,
    validated_shape, validated_timeout)


cdef extern from *:
    """
    /* The keyed table places a key by its key hash `kh` mixed with the
     * table's secret (nb_mix). kh is hash(o) for most keys (a str's cached
     * hash read in place, as dict does), but CPython's hash of an int is
     * its value modulo 2**61 - 1, so ints that hash alike are easy to make:
     * an int in [0, 2**64) is its own kh (what a uint64 batch matches), one
     * beyond that range (or below -(2**61 - 1)) its value modulo a secret
     * prime. Keys that are equal get equal kh: an integral float or other
     * number equal to such an int takes the int's kh (see `other_key_hash`). */
    #define NB_M61 ((uint64_t)0x1FFFFFFFFFFFFFFFULL)
    static uint64_t nb_wide_q = 0x1FFFFFFFFFFFFFFFULL;  /* the secret prime, set at import */
    static PyObject *nb_wide_q_obj = NULL;

    static inline int nb_is_uint64(PyObject *o, int overflow) {
        /* An exact int past int64 (overflow 1 or -1) that fits a uint64; no exception raised. */
        return overflow > 0 && _PyLong_NumBits(o) <= 64;
    }

    static Py_hash_t nb_residue(PyObject *o, int overflow) {
        /* kh of an exact int outside int64: itself as a uint64 if it is one, else o mod nb_wide_q. */
        unsigned long long u;
        PyObject *r;
        if (nb_is_uint64(o, overflow)) return (Py_hash_t)PyLong_AsUnsignedLongLong(o);
        r = PyNumber_Remainder(o, nb_wide_q_obj);
        if (r == NULL) return -1;
        u = PyLong_AsUnsignedLongLong(r);
        Py_DECREF(r);
        return (Py_hash_t)u;
    }

    static inline Py_hash_t nb_int_key_hash(PyObject *o) {
        /* kh of an exact int (see above). */
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        long long r;
        if (overflow) return nb_residue(o, overflow);
        if (v >= 0) return (Py_hash_t)v;
        if (v > -(long long)NB_M61) return v == -1 ? -2 : (Py_hash_t)v;  /* hash(v) */
        r = v % (long long)nb_wide_q;
        return (Py_hash_t)(r < 0 ? r + (long long)nb_wide_q : r);
    }

    static inline Py_hash_t nb_str_hash(PyObject *o) {
        Py_hash_t h = ((PyASCIIObject *)o)->hash;
        return h != -1 ? h : PyObject_Hash(o);
    }

    /* The position hash: a folded 64x64->128 multiply of kh under the
     * table's two secret words, as aHash's fallback does, folded again by
     * a constant: alone, the first fold leaves the low bits of arithmetic
     * progressions (i << 21) clustered under some secrets. */
    static inline uint64_t nb_mix(uint64_t kh, uint64_t s1, uint64_t s2) {
    #ifdef __SIZEOF_INT128__
        __uint128_t m = (__uint128_t)(kh ^ s1) * s2;
        m = (__uint128_t)((uint64_t)m ^ (uint64_t)(m >> 64)) * 0x9E3779B97F4A7C15ULL;
        return (uint64_t)m ^ (uint64_t)(m >> 64);
    #else
        uint64_t x = (kh ^ s1) * s2;
        x ^= x >> 32; x *= 0x9E3779B97F4A7C15ULL; x ^= x >> 29; x *= s2;
        return x ^ (x >> 32);
    #endif
    }
    """
    bint is_gc "PyObject_IS_GC"(PyObject *o) noexcept
    bint is_tracked "PyObject_GC_IsTracked"(PyObject *o) noexcept
    uint64_t nb_wide_q
    PyObject *nb_wide_q_obj
    Py_hash_t nb_int_key_hash(object o) except? -1
    bint nb_is_uint64(object o, int overflow) noexcept
    Py_hash_t nb_str_hash(object o) except? -1
    uint64_t nb_mix(uint64_t kh, uint64_t s1, uint64_t s2) noexcept nogil


cdef inline Py_hash_t key_hash(object key) except? -1:
    """The key hash `kh` the keyed table places and matches *key* by (see nb_mix)."""
    if PyUnicode_CheckExact(key):
        return nb_str_hash(key)
    if PyLong_CheckExact(key):
        return nb_int_key_hash(key)
    return other_key_hash(key)


cdef Py_hash_t other_key_hash(object key) except? -1:
    """`key_hash` of a key neither str nor int: hash(key), unless it equals a wide int.

    A number equal to an int beyond +-(2**61 - 1) must land where that int
    does: an integral float past 2**61, and any other number (int subclass,
    Fraction, Decimal, complex, ...) that converts to such an int and
    compares equal to it with the same hash.
    """
    cdef Py_hash_t h = hash(key)
    cdef double x
    if PyFloat_CheckExact(key):
        x = PyFloat_AS_DOUBLE(key)
        if x >= 2305843009213693952.0 or x <= -2305843009213693952.0:  # 2**61: integral
            if x - x == 0.0:  # finite
                return nb_int_key_hash(PyLong_FromDouble(x))
        return h
    if not PyNumber_Check(key):
        return h  # str subclass, bytes, tuple, None, most objects: never equal to an int
    try:
        if PyLong_Check(key):
            value = PyNumber_Index(key)  # the exact int, read without calling __index__
        elif PyComplex_Check(key):
            if key.imag != 0:
                return h
            value = int(key.real) if key.real.is_integer() else None
        else:
            value = int(key)
        if value is None or -HASH_MODULUS_INT < value < HASH_MODULUS_INT or hash(value) != h:
            return h
        if not (key == value):
            return h
    except Exception:
        return h  # not a number that converts to an int: placed by its hash
    return nb_int_key_hash(value)


cdef extern from "<sched.h>":
    int sched_yield() nogil


cdef extern from *:
    """
    /* An object's critical section held around C code that calls no Python
     * (so nothing can raise or suspend it inside): on a free-threaded build
     * CPython's per-object lock, under the GIL nothing at all. Cython's
     * `with cython.critical_section` also takes a reference to the object
     * for the block, which costs the GIL build instructions on the hot path. */
    #ifdef Py_GIL_DISABLED
    typedef PyCriticalSection nb_section;
    #define nb_section_begin(s, o) PyCriticalSection_Begin((s), (o))
    #define nb_section_end(s) PyCriticalSection_End(s)
    #else
    typedef int nb_section;
    #define nb_section_begin(s, o) ((void)(s), (void)(o))
    #define nb_section_end(s) ((void)(s))
    #endif
    """
    ctypedef struct nb_section:
        pass
    bint nb_unlikely "unlikely"(bint x) noexcept nogil  # Cython's own C macro
    void nb_section_begin(nb_section *s, PyObject *o) noexcept
    void nb_section_end(nb_section *s) noexcept

DEFAULT_MAX_KEYS = 1_000_000
cdef int MAX_RESTARTS = 100  # lookups restarted by a key's __eq__ before giving up
cdef object parse_now = validated_now  # a C global: gcra.as_now's slow path, at no lookup
cdef object parse_unkeyed_now = unkeyed_now  # the same for TokenBucket: a key there says so
cdef object ONE = 1  # the cached small int: `cost is ONE` skips parsing
cdef Py_ssize_t BATCH = 4096  # keys of a uint64 batch resolved per pinned chunk
cdef Py_ssize_t AHEAD = 32  # prefetch distance, in keys, of a uint64 batch
HASH_MODULUS_INT = (1 << 61) - 1  # CPython: hash(n) == n % (2**61 - 1), n >= 0


def _is_prime(n):
    """Miller-Rabin with the first 12 prime bases: exact below 3.3e24."""
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % a == 0:
            return n == a
        x = pow(a, d, n)
        for _ in range(r - 1):
            if x == 1 or x == n - 1:
                break
            x = x * x % n
        if x != 1 and x != n - 1:
            return False
    return True


def _secret_bytes():
    """A source of secret bytes: os.urandom, or, as for CPython's own hash,
    a generator seeded by PYTHONHASHSEED when it is set (reproducible runs)."""
    seed = os.environ.get("PYTHONHASHSEED", "random")
    if seed == "random":
        return os.urandom
    import random
    return random.Random(f"nanobucket:{seed}").randbytes


def _secret_prime(source):
    """A random 61-bit prime: wide ints are placed by their value modulo it."""
    while True:
        n = (int.from_bytes(source(8), "little") >> 3) | (1 << 60) | 1
        if _is_prime(n):
            return n


cdef uint64_t GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment


cdef inline uint64_t splitmix64_mix(uint64_t z) noexcept nogil:
    """SplitMix64's output function (Steele et al.) of the state *z*."""
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


cdef inline uint64_t splitmix64(uint64_t *state) noexcept nogil:
    """The next word of SplitMix64 from *state*, which only its owner advances."""
    state[0] += GOLDEN_GAMMA
    return splitmix64_mix(state[0])


cdef inline uint64_t next_secret() noexcept nogil:
    """The next word of the module's secret stream (per-table secrets), from any thread.

    The state advances by one atomic add: two tables built at once in two
    threads (free-threaded) never draw the same word.
    """
    return splitmix64_mix(<uint64_t>nb_add(&_secret_state, <int64_t>GOLDEN_GAMMA)
                          + GOLDEN_GAMMA)


_secret = _secret_bytes()
_WIDE_Q = _secret_prime(_secret)
nb_wide_q = _WIDE_Q
nb_wide_q_obj = <PyObject *>_WIDE_Q  # a module global keeps it alive
cdef int64_t _secret_state = int.from_bytes(_secret(8), "little", signed=True)
del _secret

# Forks since import in this process's line: 0 here, bumped once in each
# child as it starts. A limiter records it when made (`_Limits.gen`): a
# different value at a decision means a copy in a forked process, which one
# comparison on the hot path tells without a getpid() per call.
cdef int64_t fork_gen = 0


def _after_fork_in_child():
    global fork_gen
    fork_gen += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@cython.freelist(64)
cdef class Decision:
    """Decision(allowed, remaining, retry_after_ns, reset_after_ns, limit)
--

The outcome of ``check`` or ``peek``, with exact integer times.

    >>> d = TokenBucket(rate=100, capacity=200).check_at(0)
    >>> (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)
    (True, 199, 0, 10000000, 200)

    Built from the five fields in that order (an adapter, a test), it equals
    any decision with the same fields:

    >>> d == Decision(True, 199, 0, 10_000_000, 200)
    True
    """

    @property
    def allowed(self):
        """True if the request was admitted (for ``peek``: would be).

        >>> TokenBucket(rate=1, capacity=1).check_at(0).allowed
        True
        """
        return self._allowed

    @property
    def remaining(self):
        """Whole tokens the bucket holds after this decision (a ``peek``: as if spent).

        >>> TokenBucket(rate=1, capacity=5).check_at(0, cost=2).remaining
        3
        """
        return self._remaining

    @property
    def retry_after_ns(self):
        """Nanoseconds until the same request would be admitted (0 if it was).

        >>> b = TokenBucket(rate=2, capacity=1)
        >>> b.check_at(0).retry_after_ns, b.check_at(0).retry_after_ns
        (0, 500000000)
        """
        return self._retry_after_ns

    @property
    def reset_after_ns(self):
        """Nanoseconds until the bucket is full again.

        >>> TokenBucket(rate=2, capacity=4).check_at(0, cost=3).reset_after_ns
        1500000000
        """
        return self._reset_after_ns

    @property
    def limit(self):
        """The bucket's capacity (the ``X-RateLimit-Limit`` of HTTP responses).

        >>> TokenBucket(rate=1, capacity=5).check_at(0).limit
        5
        """
        return self._limit

    @property
    def retry_after(self):
        """Seconds until the same request would be admitted (0.0 if it was).

        >>> b = TokenBucket(rate=4, capacity=1)
        >>> b.check_at(0).retry_after, b.check_at(0).retry_after
        (0.0, 0.25)
        """
        return self._retry_after_ns / 1e9

    @property
    def reset_after(self):
        """Seconds until the bucket is full again.

        >>> TokenBucket(rate=4, capacity=2).check_at(0).reset_after
        0.25
        """
        return self._reset_after_ns / 1e9

    def __init__(self, allowed, remaining, retry_after_ns, reset_after_ns, limit):
        # For callers (the twin's signature). The limiters never call it: they
        # make a Decision with __new__ and set its fields, which costs less.
        # The fields are C ints, which Cython would fill from a float by
        # truncating it: ints only (TypeError otherwise), as __index__ says.
        self._allowed = allowed
        self._remaining = PyNumber_Index(remaining)
        self._retry_after_ns = PyNumber_Index(retry_after_ns)
        self._reset_after_ns = PyNumber_Index(reset_after_ns)
        self._limit = PyNumber_Index(limit)

    def __bool__(self):
        return self._allowed

    def copy_as(self, cls):
        """A new *cls* (a subclass of Decision) with this decision's five fields.

        What a limiter that wraps another's decision (``tiered``'s) builds its
        own from, in one call.

        >>> class Named(Decision):
        ...     __slots__ = ("name",)
        >>> d = TokenBucket(rate=1, capacity=2).check_at(0).copy_as(Named)
        >>> type(d).__name__, d.remaining, d.limit
        ('Named', 1, 2)
        """
        cdef Decision made = Decision.__new__(cls)
        made._allowed = self._allowed
        made._remaining = self._remaining
        made._retry_after_ns = self._retry_after_ns
        made._reset_after_ns = self._reset_after_ns
        made._limit = self._limit
        return made

    def _fields(self):
        return (self._allowed, self._remaining, self._retry_after_ns, self._reset_after_ns, self._limit)

    def __eq__(self, other):
        if not hasattr(other, "retry_after_ns"):
            return NotImplemented
        return self._fields() == tuple(getattr(other, name) for name in (
            "allowed", "remaining", "retry_after_ns", "reset_after_ns", "limit"))

    def __hash__(self):
        return hash(self._fields())

    def __repr__(self):
        return (f"{type(self).__name__}(allowed={self._allowed}, remaining={self._remaining}, "
                f"retry_after_ns={self._retry_after_ns}, reset_after_ns={self._reset_after_ns}, "
                f"limit={self._limit})")


cdef class _Limits:
    """Rate, capacity and the integers derived from them (changed only by `reconfigure`)."""

    # Not `readonly`: reconfigure replaces it, and on a free-threaded build a
    # bare read of the object pointer could race with that and use a freed
    # object. The property reads it under the same critical section.
    cdef object _rate
    cdef readonly int64_t capacity
    """The most tokens the bucket holds: the largest burst.

    >>> TokenBucket(rate=100, capacity=200).capacity
    200
    """
    cdef readonly int64_t interval_ns
    """Nanoseconds one token takes to refill (``ceil(1e9 / rate)``).

    >>> TokenBucket(rate=3, capacity=1).interval_ns
    333333334
    """
    cdef int64_t tau
    cdef object clock
    # ONE once __init__ has completed; NULL before, and after the garbage
    # collector cleared the object (see `keyed_clear`). Every verb parses
    # its cost first (`_cost`), whose `cost is ONE` test then compares with
    # this field: an object that is not ready fails it at no extra cost,
    # and the slow path raises. A C pointer, so no tp_clear resets it.
    cdef PyObject *one
    # `fork_gen` when made: another value at a decision is a copy in a forked
    # process (warned once: `_forked`), or one unpickled elsewhere (-1).
    cdef int64_t gen
    cdef bint _per_process  # counting in each process on its own is meant: no warning

    def __init__(self, rate, capacity, clock):
        self._set_limits(self._new_limits(rate, capacity, clock), clock)

    # Each __init__ checks every argument first (`_new_limits`, then its
    # own), then sets the fields at once (`_set_limits`, `one` last): an
    # __init__ that raised leaves an object whose verbs raise, and a second
    # __init__ raises rather than replacing the state under other callers.

    cdef tuple _new_limits(self, object rate, object capacity, object clock):
        if self.interval_ns:  # set by the first __init__, never cleared
            raise RuntimeError(f"{type(self).__name__} is already initialised")
        exact, cap, interval, tau = bucket_params(rate, capacity)
        validated_clock(clock)
        return public_rate(rate, exact), cap, interval, tau

    cdef int _set_limits(self, tuple limits, object clock) except -1:
        self._rate, self.capacity, self.interval_ns, self.tau = limits
        self.clock = validated_clock(clock)  # None: the default clock now (see `nanobucket.testing`)
        nb_store_relaxed(&self.gen, fork_gen)
        self.one = <PyObject *>ONE
        return 0

    cdef inline int _ready(self) except -1:
        """Raise unless the object is ready (for verbs that parse no cost)."""
        if self.one == NULL:
            self._not_ready()
        return 0

    cdef int _not_ready(self) except -1:
        raise RuntimeError(
            f"this {type(self).__name__} is not usable: its __init__ did not complete "
            "(or the garbage collector has cleared it)")

    @property
    def rate(self):
        """Tokens per second, the number given: an int, float, Decimal or Fraction.

        The arithmetic uses its exact value (a float's shortest decimal: 0.1 is 1/10).

        >>> TokenBucket(rate=100, capacity=200).rate, TokenBucket(rate=0.1, capacity=1).rate
        (100, 0.1)
        """
        self._ready()
        with cython.critical_section(self):
            return self._rate

    @property
    def per_process(self):
        """Whether copies in forked processes are meant to count on their own (no warning).

        >>> TokenBucket(rate=1, capacity=1).per_process
        False
        """
        return self._per_process

    cdef int _forked(self) except -1:
        """The first decision in a process this limiter was copied into: warn, once."""
        cdef bint first
        if self.one == NULL:
            return 0  # not usable: the verb raises that
        with cython.critical_section(self):
            first = nb_load_relaxed(&self.gen) != fork_gen
            nb_store_relaxed(&self.gen, fork_gen)
        if first and not self._per_process:
            # stacklevel 1: the caller's frame (a Cython function pushes none).
            warnings.warn(forked_warning(type(self).__name__), RuntimeWarning, stacklevel=1)
        return 0

    cdef inline int _used(self) except -1:
        """Before a verb that reads or changes the buckets: warn if this is a forked copy."""
        # Marked unlikely: the compiler then keeps the hot path as it was
        # (a key's hash inlined into the keyed verbs, not called).
        if nb_unlikely(nb_load_relaxed(&self.gen) != fork_gen):
            self._forked()
        return 0

    cdef inline int64_t _cost(self, object cost) except -1:
        cdef int overflow = 0
        cdef long long value
        self._used()  # every decision parses its cost first
        if <PyObject *>cost == self.one:  # `cost is ONE`, if ready (see `one`)
            return 1
        if type(cost) is int:
            value = PyLong_AsLongLongAndOverflow(cost, &overflow)
            # 1 <= value <= capacity, in one unsigned comparison: 0, every
            # value out of range and any value on an object not ready
            # (capacity 0) take the slow path.
            if not overflow and <uint64_t>value - 1 < <uint64_t>self.capacity:
                return value
        return self._cost_slow(cost)

    cdef int64_t _cost_slow(self, object cost) except -1:
        if self.one == NULL:
            self._not_ready()
        return validated_cost(cost, self.capacity)

    cdef inline int64_t _now(self) except -1:
        if self.clock is None:
            return nb_monotonic_ns()
        return gcra.as_now(self.clock(), parse_now)

    def clock_ns(self):
        """The bucket's clock now (int ns): the time `reserve` waits are counted on.

        >>> TokenBucket(rate=1, capacity=1, clock=lambda: 42).clock_ns()
        42
        """
        self._ready()
        return self._now()

    cdef Decision _decision(self, bint allowed, int64_t tat, int64_t now, int64_t cost_t,
                            int64_t base):
        return fill_decision(Decision.__new__(Decision), allowed, tat, now, base, self.tau,
                             self.interval_ns, cost_t, self.capacity)

    cdef double _tokens(self, int64_t tat, int64_t now):
        return gcra.tokens(tat, now, self.tau, self.interval_ns, self.capacity)

    cdef tuple _new_params(self, object rate, object capacity):
        """Validated ``(public rate, capacity, interval_ns, tau)`` for `reconfigure`."""
        rate = self._rate if rate is None else rate
        capacity = kept_capacity(rate, capacity, self.capacity)
        exact, cap, interval, tau = bucket_params(rate, capacity)
        return public_rate(rate, exact), cap, interval, tau


@cython.final
cdef class TokenBucket(_Limits):
    """TokenBucket(rate, capacity=None, *, clock=None, per_process=False)
--

One token bucket: starts full, refills ``rate`` tokens/s up to ``capacity``.

    >>> b = TokenBucket(rate=100, capacity=200)
    >>> sum(b.allow_at(0) for _ in range(250))  # a burst of 250 at one instant
    200
    >>> b = TokenBucket("100/minute")   # a rate as text: its count is the capacity
    >>> b.capacity, b.interval_ns, b.rate
    (100, 600000000, Fraction(5, 3))

    ``with b:`` / ``async with b:`` waits for one token as ``acquire()`` does,
    with no timeout (first in, first out), and raises `RateLimited` only
    when the line of waiters is full; leaving the block gives nothing back.
    A bounded wait is ``acquire(timeout=...)``, or ``async with`` inside
    ``asyncio.timeout(...)`` (cancelled, the wait reserves nothing).

    >>> with TokenBucket(rate=1000, capacity=1, clock=lambda: 0) as b:   # one token spent
    ...     b.tokens()
    0.0
    """

    cdef int64_t tat
    keyed = False  # the verbs take no key (see `KeyedTokenBucket`)

    def __init__(self, rate, capacity=None, *, clock=None, per_process=False):
        limits = self._new_limits(rate, capacity, clock)
        self._per_process = validated_flag(per_process, "per_process")
        self._set_limits(limits, clock)

    cdef int64_t _cost_slow(self, object cost) except -1:
        # `_cost`'s slow path: a key where the cost goes says this bucket has none.
        if self.one == NULL:
            self._not_ready()
        return unkeyed_cost(cost, self.capacity)

    def allow(self, cost=1):
        """Spend *cost* tokens now if the bucket holds them; True if admitted.

        >>> b = TokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> b.allow(), b.allow(), b.allow()
        (True, True, False)
        """
        cdef int64_t c = self._cost(cost)
        return self._take(self._now(), c)

    def allow_at(self, now, cost=1):
        """`allow` at an explicit time *now* (int ns).

        >>> b = TokenBucket(rate=1, capacity=1)
        >>> b.allow_at(0), b.allow_at(0), b.allow_at(1_000_000_000)   # one token a second
        (True, False, True)
        """
        cdef int64_t t = gcra.as_now(now, parse_unkeyed_now)
        return self._take(t, self._cost(cost))

    # The word and the parameters are read and written under the object's
    # critical section: a free-threaded build serialises the verbs with
    # `reconfigure` there (no decision mixes two configurations, none is made
    # on a word carried over with the parameters it was made with), and the
    # word needs no CAS inside. On a GIL build the section compiles to
    # nothing: the GIL already excludes every other writer.

    cdef inline bint _take(self, int64_t now, int64_t c) noexcept:
        """`gcra.take` of *c* tokens at *now*: True if admitted."""
        cdef int64_t cost_t, tat, base
        cdef bint ok
        cdef nb_section section
        nb_section_begin(&section, <PyObject *>self)
        cost_t = c * self.interval_ns
        ok = gcra.take(&self.tat, now, cost_t, self.tau - cost_t, &tat, &base, True)
        nb_section_end(&section)
        return ok

    cdef inline void _give_back(self, int64_t now, int64_t c) noexcept:
        """`gcra.give_back` of *c* tokens at *now*."""
        cdef nb_section section
        nb_section_begin(&section, <PyObject *>self)
        gcra.give_back(&self.tat, now, c * self.interval_ns)
        nb_section_end(&section)

    def check(self, cost=1):
        """Like `allow`, but return the whole `Decision`.

        >>> TokenBucket(rate=1, capacity=2, clock=lambda: 0).check(cost=2)
        Decision(allowed=True, remaining=0, retry_after_ns=0, reset_after_ns=2000000000, limit=2)
        """
        cdef int64_t c = self._cost(cost)
        return self._check(self._now(), c, True)

    def check_at(self, now, cost=1):
        """`check` at an explicit time *now* (int ns).

        >>> b = TokenBucket(rate=1, capacity=2)
        >>> b.check_at(0, cost=2)
        Decision(allowed=True, remaining=0, retry_after_ns=0, reset_after_ns=2000000000, limit=2)
        >>> d = b.check_at(500_000_000)   # half a token back: half a second more to wait
        >>> d.allowed, d.remaining, d.retry_after, d.reset_after
        (False, 0, 0.5, 1.5)
        """
        cdef int64_t t = gcra.as_now(now, parse_unkeyed_now)
        return self._check(t, self._cost(cost), True)

    def peek(self, cost=1):
        """The `Decision` `check` would return now, without spending anything.

        >>> b = TokenBucket(rate=1, capacity=1, clock=lambda: 0)
        >>> b.peek().allowed, b.peek().allowed, b.tokens()
        (True, True, 1.0)
        """
        cdef int64_t c = self._cost(cost)
        return self._check(self._now(), c, False)

    def peek_at(self, now, cost=1):
        """`peek` at an explicit time *now* (int ns).

        >>> b = TokenBucket(rate=1, capacity=3)
        >>> b.peek_at(0, cost=2).remaining, b.tokens_at(0)   # 1 would remain; 3 still there
        (1, 3.0)
        """
        cdef int64_t t = gcra.as_now(now, parse_unkeyed_now)
        return self._check(t, self._cost(cost), False)

    cdef Decision _check(self, int64_t now, int64_t cost, bint consume):
        cdef int64_t cost_t, tat, base, interval, tau, capacity
        cdef bint allowed
        cdef nb_section section
        nb_section_begin(&section, <PyObject *>self)  # the Decision is made after, from these
        interval = self.interval_ns
        tau = self.tau
        capacity = self.capacity
        cost_t = cost * interval
        if consume:
            allowed = gcra.take(&self.tat, now, cost_t, tau - cost_t, &tat, &base, True)
        else:
            allowed = gcra.step(nb_load(&self.tat), now, cost_t, tau - cost_t, &tat, &base)
        nb_section_end(&section)
        return fill_decision(Decision.__new__(Decision), allowed, tat, now, base, tau, interval,
                             cost_t, capacity)

    cdef double _tokens_now(self, int64_t now):
        cdef double tokens
        cdef nb_section section
        nb_section_begin(&section, <PyObject *>self)
        tokens = gcra.tokens(nb_load(&self.tat), now, self.tau, self.interval_ns, self.capacity)
        nb_section_end(&section)
        return tokens

    def tokens(self):
        """Tokens in the bucket now.

        >>> b = TokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> b.tokens(), b.allow(), b.tokens()
        (2.0, True, 1.0)
        """
        self._ready()
        return self._tokens_now(self._now())

    def tokens_at(self, now):
        """Tokens in the bucket at *now* (int ns).

        >>> b = TokenBucket(rate=4, capacity=2)
        >>> b.allow_at(0, cost=2), b.tokens_at(0), b.tokens_at(125_000_000)
        (True, 0.0, 0.5)
        """
        self._ready()
        return self._tokens_now(gcra.as_now(now, parse_unkeyed_now))

    def __repr__(self):
        if self.one == NULL:
            return "<TokenBucket, not initialised>"
        return f"TokenBucket(rate={self.rate!r}, capacity={self.capacity})"

    def __reduce__(self):
        # Pickled (and copied) as a constructor call plus its word: Cython's
        # automatic pickling would set the fields around __init__. The maker's
        # pid goes along: a copy unpickled in another process warns as a fork's.
        self._ready()
        return _restore_token_bucket, (self.rate, self.capacity, self.clock, nb_load(&self.tat),
                                       os.getpid(), self._per_process)

    def refund(self, cost=1):
        """Give back *cost* tokens for work that did not happen (never above capacity).

        >>> b = TokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> b.allow(cost=2)   # then the work fails before it starts
        True
        >>> b.refund(cost=2); b.tokens()
        2.0
        """
        cdef int64_t c = self._cost(cost)
        self._give_back(self._now(), c)

    def refund_at(self, now, cost=1):
        """`refund` at an explicit time *now* (int ns).

        >>> b = TokenBucket(rate=1, capacity=2)
        >>> b.allow_at(0, cost=2)
        True
        >>> b.refund_at(0); b.tokens_at(0)
        1.0
        """
        cdef int64_t t = gcra.as_now(now, parse_unkeyed_now)
        self._give_back(t, self._cost(cost))

    def reset(self):
        """Forget the bucket's state: it is full again.

        >>> b = TokenBucket(rate=1, capacity=2)
        >>> b.allow_at(0, cost=2), b.reset(), b.tokens_at(0)
        (True, None, 2.0)
        """
        self._ready()
        self._used()
        cdef nb_section section
        nb_section_begin(&section, <PyObject *>self)
        nb_store(&self.tat, 0)  # no time is earlier: full at every now
        nb_section_end(&section)

    def reserve(self, *, cost=1, max_wait_ns=0, shape=False, now=None):
        """Reserve *cost* tokens; the ns to wait before using them, or -1 (nothing reserved).

        Unlike `allow` the bucket may go past empty: the reservation is a
        place in line (the tat), so later callers wait behind it, first in,
        first out. With *shape* the wait ends at the start of the slot (even
        spacing, no burst); otherwise when the bucket holds the tokens.
        Nothing is reserved when the wait would exceed *max_wait_ns*. *now*
        (int ns) is an explicit time, as in `allow_at`.

        >>> b = TokenBucket(rate=1, capacity=1)
        >>> b.reserve(now=0), b.reserve(now=0, max_wait_ns=5 * 10**9), b.reserve(now=0)
        (0, 1000000000, -1)
        """
        cdef int64_t c = self._cost(cost)
        cdef int64_t mw = validated_max_wait(max_wait_ns)
        cdef bint sh = validated_shape(shape)
        cdef int64_t t = self._now() if now is None else gcra.as_now(now, parse_now)
        cdef int64_t cost_t, wait
        cdef nb_section section
        nb_section_begin(&section, <PyObject *>self)
        cost_t = c * self.interval_ns
        wait = gcra.reserve(&self.tat, t, cost_t, cost_t if sh else self.tau, mw)
        nb_section_end(&section)
        return wait

    def reservation(self, *, cost=1, max_wait_ns=0, shape=False, now=None):
        """`reserve`, as a `nanobucket.Reservation`: ``ok``, ``delay_ns``, ``cancel()``.

        >>> b = TokenBucket(rate=1, capacity=1)
        >>> r = b.reservation(now=0, max_wait_ns=10**9)
        >>> r.ok, r.delay_ns, b.reservation(now=0).ok, r.cancel_at(0), b.tokens_at(0)
        (True, 0, False, True, 1.0)
        """
        return Reservation.take(self, (), cost, max_wait_ns, shape, now)

    def reconfigure(self, rate=None, capacity=None, *, now=None):
        """Change the rate and/or the capacity, keeping the bucket's state.

        The tokens the bucket holds at *now* (default: its clock) carry over
        as they are, capped at the new capacity; a full bucket whose capacity
        grows keeps its tokens and refills the rest at the new rate. It is
        atomic with respect to every other verb, on every build: each
        decision is made with the old parameters or with the new ones, on
        the tokens as they were or as carried over. Callers waiting in line
        (``acquire``, `Waiting`) move with the tokens they reserved: woken
        earlier by a faster rate, later by a slower one, and refused at once
        when that is past their timeout. A rate written as text
        (``"200/minute"``) brings its count as the capacity, unless *capacity*
        is given; otherwise a capacity left out stays as it is.

        >>> b = TokenBucket(rate=1, capacity=4)
        >>> b.allow_at(0, cost=3)
        True
        >>> b.reconfigure(rate=10, capacity=2, now=0)   # the 1 token left stays
        >>> b.rate, b.capacity, b.tokens_at(0), b.tokens_at(100_000_000)
        (10, 2, 1.0, 2.0)
        """
        self._ready()
        self._used()
        cdef int64_t t = self._now() if now is None else gcra.as_now(now, parse_now)
        cdef int64_t old, new
        with retimed(self, t), cython.critical_section(self):
            new_rate, cap, interval, tau = self._new_params(rate, capacity)
            old = nb_load(&self.tat)
            while True:
                new = carry_over(old, t, self.interval_ns, self.tau, interval, tau)
                if nb_cas(&self.tat, &old, new):
                    break
            # The integers the verbs read first, with no Python code between
            # them and the word; then the rate (releasing the old one may run code).
            self.capacity = cap
            self.interval_ns = interval
            self.tau = tau
            self._rate = new_rate

    def acquire(self, cost=1, timeout=None):
        """Wait (block the thread) until *cost* tokens are spent, or *timeout* s pass.

        Waiters are served first in, first out; False at once when the wait
        would exceed *timeout* or too many waiters are queued (see `waiting`).

        >>> b = TokenBucket(rate=1000, capacity=1, clock=lambda: 0)
        >>> b.acquire(), b.acquire(timeout=0), b.acquire(timeout=1.0)   # the last sleeps 1 ms
        (True, False, True)
        """
        cdef int64_t c = self._cost(cost)
        if timeout is not None:
            validated_timeout(timeout)
        if self._take(self._now(), c):
            return True
        return _acquire.acquire_slow(self, (), c, timeout)

    def acquire_async(self, cost=1, timeout=None):
        """`acquire` for asyncio: ``await b.acquire_async()``; cancellation reserves nothing.

        >>> import asyncio
        >>> b = TokenBucket(rate=1000, capacity=1, clock=lambda: 0)
        >>> asyncio.run(b.acquire_async()), asyncio.run(b.acquire_async(timeout=0))
        (True, False)
        """
        return _acquire.acquire_async(self, (), cost, timeout)

    def __enter__(self):
        _acquire.enter(self)
        return self

    def __exit__(self, *exc):
        return None  # a spent token stays spent

    def __aenter__(self):
        return _acquire.enter_async(self, (), self)

    def __aexit__(self, *exc):
        return _acquire.exit_async()


def _restore_token_bucket(rate, capacity, clock, int64_t tat, pid=None, per_process=False):
    """A `TokenBucket` as pickled: its parameters and its word (and where it was pickled)."""
    cdef TokenBucket b = TokenBucket(rate, capacity, clock=clock, per_process=per_process)
    b.tat = tat
    if pid is not None and pid != os.getpid():
        nb_store_relaxed(&b.gen, -1)  # no process's generation: its first decision warns
    return b


include "_keyed.pxi"
include "_keyed_gc.pxi"


# -- refund, reserve (waiting) and reconfigure: off the hot path ---------------

cdef int64_t INT64_MAX = 0x7FFFFFFFFFFFFFFF
cdef int64_t INT64_MIN = -INT64_MAX - 1


cdef int64_t carry_over(int64_t tat, int64_t now, object interval, object tau,
                        object new_interval, object new_tau) except? -1:
    """*tat* under new parameters with the same tokens at *now*, capped (see ``_bucket_py``)."""
    cdef int64_t debt = tat - now if tat > now else 0
    # Python ints: (tau - debt) * new_interval does not fit 64 bits in general.
    new_debt = new_tau - ((tau - debt) * new_interval) // interval
    if new_debt <= 0:
        return tat if tat <= now else now
    return min(now + new_debt, INT64_MAX)


include "_allow_all.pxi"

# cython: language_level=3, freethreading_compatible=True
"""A keyed token-bucket table in a shared memory mapping, lock-free across processes.

The file behind the mapping (see ``shared.py`` for the header) holds a
power-of-two array of 16-byte slots of two int64 words ``(fp, tat)``:

* ``(0, 0)``: never used. A fingerprint never goes back to 0 and a key is
  only put at or before the first empty slot of its window, so an empty
  slot ends every probe chain.
* ``(K, tat)``, ``K > 0``: key K's bucket. K is SipHash-1-3 of the key under
  the table's random 128-bit seed, cut to 63 bits, never 0; ``tat >= 0`` is
  the GCRA tat in ns, exactly as in ``_bucket_c``.
* ``(K | PEND, tag)``: a claim of the slot for K, in progress. PEND is the
  top bit; the tag is a negative 64-bit hash unique to the claim.
* ``(FREE, 0)``: free (FREE is PEND alone: the claim of no key).

A key lives in one of the ``probe`` slots after ``K & mask``, its window.
Every change of a slot is one 16-byte compare-and-swap of both words, from
the state just read (``cmpxchg16b`` on x86-64, an LL/SC pair on arm64,
written as the instructions themselves: libatomic's fallback for wide
atomics is a lock, which is neither lock-free nor valid across processes;
other platforms refuse to attach). All loads are sequentially consistent.
The header's last word, the *horizon* H, is only ever raised (CAS, max).

The steps:

* spend: ``(K, t) -> (K, t')`` by the GCRA rule; it fails if anything in the
  slot changed, its owner included.
* claim: a slot that is empty, free, or a bucket full at the claimer's
  ``now`` (``tat <= now``; H is first raised to that tat) ``-> (K|PEND,
  new tag)``; or, when the window has no such slot, another key's claim seen
  unchanged by two scans (its process may be dead).
* abort: ``(K|PEND, tag) -> (FREE, 0)``.
* commit: ``(K|PEND, tag) -> (K, H)``.

A request for K scans its window up to the first empty slot. If it sees K's
bucket, it spends there. Else, if it sees claims of K, it commits the lowest
in window order, but only if its previous scan saw that same claim (slot and
tag) and only after aborting every other claim of K it saw. Else it claims
the first slot it may, and scans again. Any failed CAS means another process
changed the slot: scan again.

**One key, one bucket.** Suppose slots X and Y are both K's bucket at one
moment, their claims written at ``w_X < w_Y`` and committed at ``c_X``,
``c_Y`` by scans S_X, S_Y. A claim's tag is unique, so X held that claim
from ``w_X`` to ``c_X``; S_Y began after ``w_Y > w_X`` (its previous scan saw
Y's claim), so it read X after ``w_X``, and it reached X (every slot before
X was in use before ``w_X``). If S_Y read X before ``c_X``, it saw X's
claim: were X lower, S_Y would commit X, not Y; were X higher, S_Y aborted
it before committing Y, and either the abort won (then ``c_X`` cannot
happen) or it failed on X's commit (then S_Y restarted and committed
nothing). If S_Y read X after ``c_X``, it found K's bucket there and spent
on it. Each case contradicts the assumption.

**No history lost.** Whenever K has no bucket, every tat K's admissions
reached is at most H: a slot stops being K's bucket only by a claim of it
when full, which first raises H to its tat, and any spend of K landing later
fails (the CAS sees the claim). A commit gives K the horizon read after the
scan that found K without a bucket. So K's tat word is never below the
exact model's tat for K, and K admits at most ``capacity + rate*T`` over any
T, whatever the interleaving, the processes' clocks (explicit times
included) or their stalls. The horizon is the one approximation, on the
safe side: a key that is new or returns at a time earlier than the latest
reclaimed tat starts owing the difference (with the monotonic clock, the
few ns by which its reading is older than another process's reclaim).

**Stalls and kills.** No step holds anything. A process stopped (SIGSTOP)
or killed at any instant leaves at most a claim, which the next request of
its key commits or aborts, and which any key takes over when it needs the
slot; a process resuming after that finds its next CAS fails (the slot and
tag changed) and looks again. No slot becomes unusable, and no key gets two
buckets.

When all ``probe`` slots hold live buckets, the policy chosen at creation
applies: reject the new key (fail closed) or admit it untracked (fail open).
Two keys with the same fingerprint share one bucket (both are then limited
together, never more loosely): with k live keys the chance that any two
collide is about k*k / 2**64, under 6e-8 for a million keys.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t, uint8_t, uint64_t
from posix.mman cimport (
    MAP_ANONYMOUS, MAP_FAILED, MAP_FIXED, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE, mmap,
    munmap,
)

from nanobucket._core cimport _gcra as gcra
from nanobucket._core._atomic cimport nb_cas, nb_load, nb_monotonic_ns
from nanobucket._core._capi cimport (
    PyByteArray_AS_STRING,
    PyByteArray_FromStringAndSize,
    PyUnicode_AsUTF8AndSize,
)
from nanobucket._core._bucket_c cimport Decision, fill_decision

from fractions import Fraction

from ._bucket import Decision as SelectedDecision
from ._params import (
    none_key_error, validated_clock, validated_cost, validated_max_wait, validated_now,
    validated_shape)


cdef extern from *:
    """
    /* A 16-byte compare-and-swap of one slot, written as the instruction
     * itself: libatomic's fallback for wide atomics is a lock, which is
     * neither lock-free nor valid across processes. */
    #if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    #include <cpuid.h>
    static inline int nb_cas16(int64_t *p, int64_t e0, int64_t e1, int64_t d0, int64_t d1) {
        unsigned char ok;
        __asm__ __volatile__("lock cmpxchg16b %1\\n\\tsetz %0"
                             : "=q"(ok), "+m"(*(volatile __int128 *)p), "+a"(e0), "+d"(e1)
                             : "b"(d0), "c"(d1)
                             : "memory", "cc");
        return ok;
    }
    static int nb_cas16_usable(void) {
        unsigned a, b, c, d;
        return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_CMPXCHG16B);
    }
    #elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    static inline int nb_cas16(int64_t *p, int64_t e0, int64_t e1, int64_t d0, int64_t d1) {
        int64_t o0, o1;
        int failed, ok;
        /* One LL/SC loop in one asm block, so that no compiler spill lands
         * between the exclusive load and store. */
        __asm__ __volatile__(
            "1: ldaxp %0, %1, [%4]\\n"
            "   cmp %0, %5\\n"
            "   ccmp %1, %6, #0, eq\\n"
            "   b.ne 2f\\n"
            "   stlxp %w2, %7, %8, [%4]\\n"
            "   cbnz %w2, 1b\\n"
            "   mov %w3, #1\\n"
            "   b 3f\\n"
            "2: clrex\\n"
            "   mov %w3, #0\\n"
            "3:\\n"
            : "=&r"(o0), "=&r"(o1), "=&r"(failed), "=&r"(ok)
            : "r"(p), "r"(e0), "r"(e1), "r"(d0), "r"(d1)
            : "memory", "cc");
        return ok;
    }
    static int nb_cas16_usable(void) { return 1; }
    #else
    static inline int nb_cas16(int64_t *p, int64_t e0, int64_t e1, int64_t d0, int64_t d1) {
        return 0;
    }
    static int nb_cas16_usable(void) { return 0; }
    #endif
    /* Sequentially consistent: a claim is a store followed by a scan that
     * must see every claim stored before it (see the module docstring). */
    static inline int64_t nb_load_sc(int64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline uint64_t nb_fetch_add(uint64_t *p) {
        return __atomic_fetch_add(p, 1, __ATOMIC_RELAXED);
    }
    """
    bint nb_cas16(int64_t *p, int64_t e0, int64_t e1, int64_t d0, int64_t d1) noexcept nogil
    bint nb_cas16_usable() noexcept nogil
    int64_t nb_load_sc(int64_t *p) noexcept nogil
    uint64_t nb_fetch_add(uint64_t *p) noexcept nogil

cdef extern from "<unistd.h>":
    int getpid() noexcept nogil

cdef extern from "_siphash.h":
    uint64_t nb_siphash13(const void *data, size_t n, uint64_t k0, uint64_t k1,
                          uint64_t tweak) noexcept nogil
    uint64_t nb_siphash24(const void *data, size_t n, uint64_t k0, uint64_t k1,
                          uint64_t tweak) noexcept nogil

cdef object parse_now = validated_now  # a C global: gcra.as_now's slow path, at no lookup
cdef object ONE = 1
# The Cython Decision, unless the pure-Python twin is selected (NANOBUCKET_NO_EXTENSIONS=1).
cdef bint CYTHON_DECISION = SelectedDecision is Decision

# Domain separators (see _siphash.h): one per key encoding.
cdef uint64_t TAG_STR = 0x73    # UTF-8 of the str
cdef uint64_t TAG_BYTES = 0x62  # the bytes themselves
cdef uint64_t TAG_INT = 0x69    # an int in [-2**63, 2**63): 8 bytes, little-endian two's complement
cdef uint64_t TAG_BIGINT = 0x49 # any other int: minimal little-endian two's complement
cdef uint64_t TAG_NONCE = 0x63  # a claim's tag (pid, table object, counter)
cdef uint64_t TAG_NONE = 0x6E   # None, as a key (none_key=True): no bytes

cdef enum Found:
    FOUND = 0     # the key's slot
    ABSENT = 1    # not in the table, and there is room for it
    NO_ROOM = 2   # not in the table, and every probed slot holds a live bucket


def siphash(data, uint64_t k0, uint64_t k1, int c_rounds=1, uint64_t tweak=0):
    """SipHash-1-3 (or -2-4 with ``c_rounds=2``) of *data* (bytes): for tests."""
    cdef bytes b = bytes(data)
    if c_rounds == 2:
        return nb_siphash24(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b), k0, k1, tweak)
    if c_rounds != 1:
        raise ValueError("c_rounds must be 1 or 2")
    return nb_siphash13(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b), k0, k1, tweak)


include "_shared_slots.pxi"


cdef class SharedTable:
    """The mapped table and its verbs; ``shared.SharedKeyedTokenBucket`` adds the files.

    Not constructed directly: ``SharedKeyedTokenBucket.create`` / ``open``
    validate the file and call ``_attach``.

    >>> from nanobucket import SharedKeyedTokenBucket
    >>> issubclass(SharedKeyedTokenBucket, SharedTable)   # its verbs are defined here
    True
    """

    cdef char *base             # the mapping (file, or anonymous after close())
    cdef size_t size
    cdef int64_t *slots         # 2 words per slot: fingerprint, tat
    cdef uint64_t mask
    cdef int64_t probe
    cdef uint64_t k0, k1
    cdef bint admit_when_full
    cdef bint is_closed
    cdef int64_t tau
    cdef readonly object rate
    """Tokens per second, the number given (opened: an int, a float or a Fraction).

    >>> from nanobucket import SharedKeyedTokenBucket
    >>> with SharedKeyedTokenBucket.create_anonymous(rate=2.5, capacity=2) as t:
    ...     t.rate
    2.5
    """
    cdef readonly int64_t capacity
    """The most tokens a bucket holds: the largest burst.

    >>> from nanobucket import SharedKeyedTokenBucket
    >>> with SharedKeyedTokenBucket.create_anonymous(rate=100, capacity=200) as t:
    ...     t.capacity
    200
    """
    cdef readonly int64_t interval_ns
    """Nanoseconds one token takes to refill (``ceil(1e9 / rate)``).

    >>> from nanobucket import SharedKeyedTokenBucket
    >>> with SharedKeyedTokenBucket.create_anonymous(rate=3, capacity=1) as t:
    ...     t.interval_ns
    333333334
    """
    cdef readonly int64_t max_keys
    """The most keys the table is sized for (see ``slot_count``).

    >>> from nanobucket import SharedKeyedTokenBucket
    >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2, max_keys=1000) as t:
    ...     t.max_keys
    1000
    """
    cdef readonly int64_t slot_count
    """Slots in the file: a power of two, at least twice ``max_keys``.

    >>> from nanobucket import SharedKeyedTokenBucket
    >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2, max_keys=1000) as t:
    ...     t.slot_count
    2048
    """
    cdef readonly object path
    """The table's file, as given to ``create`` or ``open``; None for an anonymous table.

    >>> from nanobucket import SharedKeyedTokenBucket
    >>> path = os.path.join(tmp_dir, "api")
    >>> with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=2) as t:
    ...     t.path == path
    True
    """
    cdef readonly bint none_key
    """Whether None is a key (``none_key=True`` when attached); else a verb given None raises.

    >>> from nanobucket import SharedKeyedTokenBucket
    >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2) as t:
    ...     t.none_key
    False
    """
    cdef object clock
    cdef uint64_t claims        # claims made through this object: part of their tags

    def __cinit__(self):
        self.base = NULL
        self.is_closed = True

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, self.size)
            self.base = NULL

    def _attach(self, int fd, Py_ssize_t size, Py_ssize_t header_size, path, rate,
                int64_t capacity, int64_t interval_ns, int64_t slot_count, int64_t max_keys,
                int64_t probe, bint admit_when_full, uint64_t k0, uint64_t k1, clock,
                bint none_key=False):
        """Map *size* bytes of the validated table file open as *fd*."""
        cdef void *p
        if self.base != NULL:
            raise RuntimeError("the table is already attached")
        if slot_count < 1 or (slot_count & (slot_count - 1)) or probe < 1 or probe > slot_count:
            raise ValueError("bad slot count or probe length")
        if probe > MAX_PROBE:
            raise ValueError(f"probe length {probe} is over {MAX_PROBE}")
        if not nb_cas16_usable():
            raise RuntimeError("a shared table needs a 16-byte compare-and-swap (x86-64, arm64)")
        # Divided, not multiplied: a slot count from a file cannot overflow
        # its way past this into a mapping smaller than the slots it indexes.
        if (header_size < 0 or header_size % 8 or size < header_size
                or (size - header_size) % 16 or (size - header_size) // 16 != slot_count):
            raise ValueError("the size does not match the slot count")
        validated_clock(clock)
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            raise OSError("mmap of the shared table failed")
        self.base = <char *>p
        self.size = size
        self.slots = <int64_t *>(self.base + header_size)
        self.mask = <uint64_t>(slot_count - 1)
        self.slot_count = slot_count
        self.probe = probe
        self.k0 = k0
        self.k1 = k1
        self.admit_when_full = admit_when_full
        self.rate = rate
        self.capacity = capacity
        self.interval_ns = interval_ns
        self.tau = capacity * interval_ns
        self.max_keys = max_keys
        self.path = path
        self.clock = validated_clock(clock)  # None: the default clock now (see `nanobucket.testing`)
        self.none_key = none_key
        self.is_closed = False

    def close(self):
        """Detach from the table (the file stays: see ``unlink``). Idempotent.

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> path = os.path.join(tmp_dir, "api")
        >>> t = SharedKeyedTokenBucket.create(path=path, rate=1, capacity=2)
        >>> t.close(); t.close()
        >>> t.closed, os.path.exists(path)
        (True, True)
        """
        cdef void *p
        if self.is_closed:
            return
        self.is_closed = True
        # Replace the file mapping by private anonymous memory at the same
        # address instead of unmapping it: on a free-threaded build another
        # thread may still be inside a call on this object, and it then
        # touches harmless memory rather than faulting. The pages go in
        # __dealloc__, when no call can be running.
        p = mmap(self.base, self.size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
        if p == MAP_FAILED:  # pragma: no cover - out of address space
            munmap(self.base, self.size)
            self.base = NULL

    @property
    def closed(self):
        """True after ``close()``.

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> path = os.path.join(tmp_dir, "api")
        >>> with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=2) as t:
        ...     t.closed
        False
        >>> t.closed
        True
        """
        return self.is_closed

    @property
    def when_full(self):
        """``"reject"`` or ``"admit"``: what a new key gets when its probe window is all live.

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2) as t:
        ...     t.when_full   # the default: fail closed
        'reject'
        """
        return "admit" if self.admit_when_full else "reject"

    cdef inline int _open_check(self) except -1:
        if self.is_closed:
            self._closed_error()
        return 0

    cdef int _closed_error(self) except -1:
        if self.base == NULL:  # made with __new__, never attached (or the mapping is gone)
            raise ValueError(f"this {type(self).__name__} is not attached to a table: "
                             "use SharedKeyedTokenBucket.create or .open")
        raise ValueError("I/O operation on a closed SharedKeyedTokenBucket")

    cdef inline int64_t _cost(self, object cost) except -1:
        cdef int overflow = 0
        cdef long long value
        if cost is ONE:
            return 1
        if type(cost) is int:
            value = PyLong_AsLongLongAndOverflow(cost, &overflow)
            if not overflow and 0 <= value <= self.capacity:
                return value
        return validated_cost(cost, self.capacity)

    cdef inline int64_t _now(self) except -1:
        if self.clock is None:
            return nb_monotonic_ns()
        return gcra.as_now(self.clock(), parse_now)

    cdef uint64_t _fingerprint(self, object key) except 0:
        """The key's keyed hash, 63 bits and never 0 (0 marks an empty slot, the 64th a claim)."""
        cdef const char *buf
        cdef Py_ssize_t n
        cdef long long v
        cdef int overflow = 0
        cdef uint8_t le[8]
        cdef uint64_t h, u
        cdef int i
        cdef bytes data
        if isinstance(key, str):
            buf = PyUnicode_AsUTF8AndSize(key, &n)
            h = nb_siphash13(buf, n, self.k0, self.k1, TAG_STR)
        elif isinstance(key, bytes):
            h = nb_siphash13(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), self.k0, self.k1,
                             TAG_BYTES)
        elif isinstance(key, int) and not isinstance(key, bool):
            v = PyLong_AsLongLongAndOverflow(key, &overflow)
            if overflow:
                # int's own __index__: the value, not what a subclass's __int__ says.
                big = int.__index__(key)
                data = big.to_bytes((big.bit_length() + 8) // 8, "little", signed=True)
                h = nb_siphash13(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), self.k0,
                                 self.k1, TAG_BIGINT)
            else:
                u = <uint64_t>v
                for i in range(8):
                    le[i] = <uint8_t>(u >> (8 * i))
                h = nb_siphash13(le, 8, self.k0, self.k1, TAG_INT)
        elif key is None:
            if not self.none_key:
                raise none_key_error("SharedKeyedTokenBucket")
            h = nb_siphash13(b"", 0, self.k0, self.k1, TAG_NONE)
        else:
            raise TypeError(
                f"a shared table key must be str, bytes or int, not {type(key).__name__}")
        h &= <uint64_t>INT64_MAX
        return h if h != 0 else 1

    cdef int64_t _nonce(self) noexcept nogil:
        """A claim's tag, unique with the odds of a 63-bit hash, and negative (never a tat)."""
        cdef uint64_t parts[3]
        parts[0] = <uint64_t>getpid()
        parts[1] = <uint64_t><size_t>&self.claims  # tables attached twice in one process
        parts[2] = nb_fetch_add(&self.claims)
        return <int64_t>(nb_siphash13(parts, sizeof(parts), self.k0, self.k1, TAG_NONCE)) | PEND

    cdef int64_t *_find(self, uint64_t fp, int64_t now, bint insert, Found *found,
                        int64_t *soonest) noexcept nogil:
        """*fp*'s slot (claiming one if *insert*), or NULL: the protocol of the module docstring.

        Sets *found*; on NO_ROOM, *soonest* is the earliest time a probed
        slot's bucket becomes full (reclaimable).
        """
        cdef int64_t key = <int64_t>fp
        cdef int64_t claim = key | PEND
        cdef uint64_t start = fp & self.mask
        cdef int64_t *horizon = self.slots - 1
        cdef int64_t *claims[MAX_PROBE]
        cdef int64_t tags[MAX_PROBE]
        cdef int64_t *s
        cdef int64_t *cand
        cdef int64_t *other
        cdef int64_t *mine = NULL         # the lowest claim of this key the last scan saw
        cdef int64_t *other_seen = NULL   # a claim of another key the last scan saw
        cdef int64_t f, t, h, cand_f = 0, cand_t = 0, other_f = 0, other_t = 0
        cdef int64_t mine_tag = 0, other_seen_tag = 0, n, i, nclaims
        cdef bint aborted
        while True:  # restarts after every change of a slot, ours or another process's
            cand = NULL
            other = NULL
            nclaims = 0
            soonest[0] = INT64_MAX
            n = 0
            while n < self.probe:
                s = self.slots + 2 * ((start + <uint64_t>n) & self.mask)
                f = nb_load_sc(s)
                if f == key:
                    found[0] = FOUND
                    return s
                if f == 0:
                    # Never used: fingerprints never go back to 0 and a key is
                    # only put before the first empty slot, so the chain ends.
                    if cand == NULL:
                        cand, cand_f, cand_t = s, 0, 0
                    break
                t = nb_load_sc(s + 1)
                if f == claim:
                    claims[nclaims] = s
                    tags[nclaims] = t
                    nclaims += 1
                elif f == FREE:
                    if cand == NULL:
                        cand, cand_f, cand_t = s, f, t
                elif f < 0:
                    if other == NULL:
                        other, other_f, other_t = s, f, t
                elif t <= now:
                    if cand == NULL:
                        cand, cand_f, cand_t = s, f, t
                elif t < soonest[0]:
                    soonest[0] = t
                n += 1
            if nclaims:
                if not insert:
                    found[0] = ABSENT  # claimed, not yet a bucket: a full one
                    return NULL
                if claims[0] != mine or tags[0] != mine_tag:
                    # Commit a claim only from a scan begun after it was made.
                    mine, mine_tag = claims[0], tags[0]
                    continue
                aborted = True
                for i in range(1, nclaims):
                    if not nb_cas16(claims[i], claim, tags[i], FREE, 0):
                        aborted = False
                        break
                if aborted:
                    h = nb_load_sc(horizon)
                    if nb_cas16(mine, claim, mine_tag, key, h):
                        found[0] = FOUND
                        return mine
                mine = NULL
                continue
            if cand == NULL and other != NULL:
                if other == other_seen and other_t == other_seen_tag:
                    # Another key's claim left as it was across two scans (its
                    # process may be dead or stopped): take the slot over.
                    cand, cand_f, cand_t = other, other_f, other_t
                elif insert:
                    other_seen, other_seen_tag = other, other_t
                    continue
            if cand == NULL:
                found[0] = ABSENT if other != NULL else NO_ROOM
                return NULL
            if not insert:
                found[0] = ABSENT
                return NULL
            if cand_f > 0:
                # Reclaiming a full bucket: first raise the horizon to its
                # tat, so that its key, back in another slot, starts there.
                h = nb_load_sc(horizon)
                while h < cand_t and not nb_cas(horizon, &h, cand_t):
                    pass
            t = self._nonce()
            if nb_cas16(cand, cand_f, cand_t, claim, t):
                mine, mine_tag = cand, t  # made before the next scan begins
            # else another process changed the slot: look again


    # -- verbs ---------------------------------------------------------------

    def allow(self, key, cost=1):
        """Spend *cost* tokens from *key*'s bucket now; True if admitted.

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> clock = lambda: 0   # frozen: the same answers on every run
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2, clock=clock) as t:
        ...     t.allow("alice"), t.allow("alice"), t.allow("alice")
        (True, True, False)
        """
        self._open_check()
        cdef int64_t c = self._cost(cost)
        return self._allow(self._fingerprint(key), self._now(), c)

    def allow_at(self, key, now, cost=1):
        """`allow` at an explicit time *now* (int ns).

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2) as t:
        ...     t.allow_at("alice", 0, cost=2), t.allow_at("alice", 1_000_000_000)
        (True, True)
        """
        self._open_check()
        cdef int64_t t = gcra.as_now(now, parse_now)
        cdef int64_t c = self._cost(cost)
        return self._allow(self._fingerprint(key), t, c)

    cdef bint _allow(self, uint64_t fp, int64_t now, int64_t cost) noexcept:
        cdef int64_t cost_t = cost * self.interval_ns
        cdef int64_t tat, base, soonest
        cdef int r
        cdef Found found
        cdef int64_t *slot
        slot = lookup(self.slots, self.mask, self.probe, <int64_t>fp)
        while True:  # again if the slot changed owner between finding and spending
            if slot == NULL:
                slot = self._find(fp, now, cost_t != 0, &found, &soonest)
            if slot == NULL:
                # cost 0 on a missing key: a full bucket admits the probe
                return found == ABSENT or self.admit_when_full
            r = take(slot, <int64_t>fp, now, cost_t, self.tau - cost_t, &tat, &base)
            if r >= 0:
                return r
            slot = NULL

    def allow_many(self, keys, cost=1):
        """Decide a batch in order at one instant; ``bytearray`` of 1 (admitted) / 0.

        The same as ``allow_at(key, now, cost)`` for each key in turn, with one
        clock reading for the whole batch.

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> clock = lambda: 0   # frozen: the same answers on every run
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2, clock=clock) as t:
        ...     list(t.allow_many(["alice", "alice", "alice", "bob"]))
        [1, 1, 0, 1]
        """
        self._open_check()
        cdef int64_t c = self._cost(cost)
        return self._allow_many(keys, self._now(), c)

    def allow_many_at(self, keys, now, cost=1):
        """`allow_many` at an explicit time *now* (int ns).

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=1) as t:
        ...     list(t.allow_many_at(["alice", "bob", "alice"], 0))
        [1, 1, 0]
        """
        self._open_check()
        cdef int64_t t = gcra.as_now(now, parse_now)
        return self._allow_many(keys, t, self._cost(cost))

    cdef object _allow_many(self, object keys, int64_t now, int64_t cost):
        if isinstance(keys, (str, bytes)):
            raise TypeError("keys must be a sequence of keys, not a single str or bytes")
        # Fingerprint every key first, so a bad key fails the batch before
        # any token is spent.
        cdef list fps = [self._fingerprint(key) for key in keys]
        cdef Py_ssize_t n = len(fps), i
        cdef object out = PyByteArray_FromStringAndSize(NULL, n)
        cdef char *res = PyByteArray_AS_STRING(out)
        for i in range(n):
            res[i] = self._allow(<uint64_t>fps[i], now, cost)
        return out

    def check(self, key, cost=1):
        """Like `allow`, but return the whole `Decision`.

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> clock = lambda: 0   # frozen: the same answers on every run
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2, clock=clock) as t:
        ...     t.check("alice", cost=2)
        Decision(allowed=True, remaining=0, retry_after_ns=0, reset_after_ns=2000000000, limit=2)
        """
        self._open_check()
        cdef int64_t c = self._cost(cost)
        return self._check(self._fingerprint(key), self._now(), c, True)

    def check_at(self, key, now, cost=1):
        """`check` at an explicit time *now* (int ns).

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2) as t:
        ...     t.check_at("alice", 0, cost=2)
        ...     late = t.check_at("alice", 500_000_000)   # half a second more to wait
        ...     late.allowed, late.remaining, late.retry_after, late.reset_after
        Decision(allowed=True, remaining=0, retry_after_ns=0, reset_after_ns=2000000000, limit=2)
        (False, 0, 0.5, 1.5)
        """
        self._open_check()
        cdef int64_t t = gcra.as_now(now, parse_now)
        cdef int64_t c = self._cost(cost)
        return self._check(self._fingerprint(key), t, c, True)

    def peek(self, key, cost=1):
        """The `Decision` `check` would return now, without spending anything.

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> clock = lambda: 0   # frozen: the same answers on every run
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=1, clock=clock) as t:
        ...     t.peek("alice").allowed, t.peek("alice").allowed, t.tokens("alice")
        (True, True, 1.0)
        """
        self._open_check()
        cdef int64_t c = self._cost(cost)
        return self._check(self._fingerprint(key), self._now(), c, False)

    def peek_at(self, key, now, cost=1):
        """`peek` at an explicit time *now* (int ns).

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=3) as t:
        ...     t.peek_at("alice", 0, cost=2).remaining, t.tokens_at("alice", 0)
        (1, 3.0)
        """
        self._open_check()
        cdef int64_t t = gcra.as_now(now, parse_now)
        cdef int64_t c = self._cost(cost)
        return self._check(self._fingerprint(key), t, c, False)

    cdef object _check(self, uint64_t fp, int64_t now, int64_t cost, bint consume):
        cdef int64_t cost_t = cost * self.interval_ns
        cdef int64_t tat, base, soonest
        cdef bint allowed
        cdef Found found
        cdef int r = -1
        cdef int64_t *slot = lookup(self.slots, self.mask, self.probe, <int64_t>fp)
        while r < 0:  # again if the slot changed owner between finding and spending
            if slot == NULL:
                slot = self._find(fp, now, consume and cost_t != 0, &found, &soonest)
            if slot == NULL or not consume:
                break
            r = take(slot, <int64_t>fp, now, cost_t, self.tau - cost_t, &tat, &base)
            if r < 0:
                slot = NULL
        if slot == NULL and found == NO_ROOM and not self.admit_when_full:
            # Fail closed: nothing to spend from; retry when a probed slot frees.
            return SelectedDecision(False, 0, soonest - now, soonest - now, self.capacity)
        if slot != NULL and consume:
            allowed = r
        else:
            # A peek, or a missing key (a full bucket; untracked when admitted
            # on a full window): the decision `take` would make, written nowhere.
            allowed = gcra.step(nb_load(slot + 1) if slot != NULL else 0, now, cost_t,
                                self.tau - cost_t, &tat, &base)
        if CYTHON_DECISION:
            return fill_decision(Decision.__new__(Decision), allowed, tat, now, base, self.tau,
                                 self.interval_ns, cost_t, self.capacity)
        return SelectedDecision(
            allowed,
            gcra.remaining(tat, now, self.tau, self.interval_ns),
            gcra.retry_after_ns(allowed, base, now, self.tau - cost_t),
            gcra.reset_after_ns(tat, now),
            self.capacity,
        )

    def tokens(self, key):
        """Tokens in *key*'s bucket now (``capacity`` for a key not in the table).

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> clock = lambda: 0   # frozen: the same answers on every run
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2, clock=clock) as t:
        ...     t.allow("alice"), t.tokens("alice"), t.tokens("bob")
        (True, 1.0, 2.0)
        """
        self._open_check()
        return self._tokens_at(self._fingerprint(key), self._now())

    def tokens_at(self, key, now):
        """Tokens in *key*'s bucket at *now* (int ns).

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=4, capacity=2) as t:
        ...     t.allow_at("alice", 0, cost=2), t.tokens_at("alice", 125_000_000)
        (True, 0.5)
        """
        self._open_check()
        cdef int64_t t = gcra.as_now(now, parse_now)
        return self._tokens_at(self._fingerprint(key), t)

    cdef double _tokens_at(self, uint64_t fp, int64_t now):
        cdef int64_t soonest
        cdef Found found
        cdef int64_t *slot = self._find(fp, now, False, &found, &soonest)
        cdef int64_t tat = nb_load(slot + 1) if slot != NULL else 0
        return gcra.tokens(tat, now, self.tau, self.interval_ns, self.capacity)

    # -- refund and reserve: what charging after a response needs -------------

    def refund(self, key, cost=1):
        """Give back *cost* tokens to *key*'s bucket (never above capacity).

        A key not in the table (a full bucket) gets nothing; a bucket taken
        over by another key meanwhile is left alone.

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> clock = lambda: 0   # frozen: the same answers on every run
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2, clock=clock) as t:
        ...     t.allow("alice", cost=2), t.refund("alice"), t.tokens("alice")
        (True, None, 1.0)
        """
        self._open_check()
        cdef int64_t c = self._cost(cost)
        self._give(self._fingerprint(key), self._now(), c)

    def refund_at(self, key, now, cost=1):
        """`refund` at an explicit time *now* (int ns).

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2) as t:
        ...     t.allow_at("alice", 0, cost=2), t.refund_at("alice", 0, cost=2)
        ...     t.tokens_at("alice", 0)
        (True, None)
        2.0
        """
        self._open_check()
        cdef int64_t t = gcra.as_now(now, parse_now)
        cdef int64_t c = self._cost(cost)
        self._give(self._fingerprint(key), t, c)

    cdef int _give(self, uint64_t fp, int64_t now, int64_t cost) except -1:
        cdef int64_t cost_t = cost * self.interval_ns
        cdef int64_t tat, new_tat, soonest
        cdef Found found
        cdef int64_t *slot
        if cost_t == 0:
            return 0
        slot = lookup(self.slots, self.mask, self.probe, <int64_t>fp)
        while True:  # again if the slot changed between reading and the CAS
            if slot == NULL:
                slot = self._find(fp, now, False, &found, &soonest)
                if slot == NULL:
                    return 0  # not in the table: a full bucket has nothing to take back
            tat = nb_load_sc(slot + 1)
            if nb_load_sc(slot) != <int64_t>fp:
                slot = NULL
                continue
            if tat < 0:  # read while the slot was a claim: look again
                continue
            if tat <= now:
                return 0
            new_tat = tat - cost_t
            if new_tat < now:
                new_tat = now
            if nb_cas16(slot, <int64_t>fp, tat, <int64_t>fp, new_tat):
                return 0

    def reserve(self, key, *, cost=1, max_wait_ns=0, shape=False, now=None):
        """Reserve *cost* tokens; the ns to wait before using them, or -1 (nothing reserved).

        As ``KeyedTokenBucket.reserve``: the bucket may go past empty (into
        debt), by at most *max_wait_ns* of waiting; with *shape* the wait
        ends at the start of the slot.

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2) as t:
        ...     t.reserve("alice", cost=2, now=0), t.reserve("alice", cost=2, max_wait_ns=10**9, now=0)
        ...     t.reserve("alice", max_wait_ns=10**10, now=0), t.check_at("alice", 0).retry_after
        (0, -1)
        (1000000000, 2.0)
        """
        self._open_check()
        cdef int64_t c = self._cost(cost)
        cdef int64_t max_wait = validated_max_wait(max_wait_ns)
        shape = validated_shape(shape)
        cdef int64_t t = self._now() if now is None else gcra.as_now(now, parse_now)
        cdef uint64_t fp = self._fingerprint(key)
        cdef int64_t cost_t = c * self.interval_ns
        cdef int64_t lead = cost_t if shape else self.tau
        # take()'s bound on base - now; never past what an int64 tat can hold.
        cdef int64_t slack = min(max_wait + lead - cost_t,
                                 INT64_MAX - t - cost_t)
        cdef int64_t tat, base, soonest
        cdef int r
        cdef Found found
        cdef int64_t *slot = lookup(self.slots, self.mask, self.probe, <int64_t>fp)
        while True:  # again if the slot changed owner between finding and spending
            if slot == NULL:
                slot = self._find(fp, t, cost_t != 0, &found, &soonest)
            if slot == NULL:
                if found == ABSENT or self.admit_when_full:
                    return 0  # a full bucket (cost 0), or untracked on a full window
                return -1
            r = take(slot, <int64_t>fp, t, cost_t, slack, &tat, &base)
            if r == 0:
                return -1
            if r > 0:
                return max(base - t - (lead - cost_t), 0)
            slot = NULL

    def __len__(self):
        """Keys whose buckets are not full (still owing tokens) now.

        >>> from nanobucket import SharedKeyedTokenBucket
        >>> clock = lambda: 0   # frozen: the same answers on every run
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2, clock=clock) as t:
        ...     t.allow("alice"), t.allow("bob", cost=0), len(t)
        (True, True, 1)
        """
        self._open_check()
        cdef int64_t now = self._now()
        cdef int64_t i, count = 0
        for i in range(self.slot_count):
            if nb_load(&self.slots[2 * i]) > 0 and nb_load(&self.slots[2 * i + 1]) > now:
                count += 1
        return count

    def __enter__(self):
        self._open_check()
        return self

    def __exit__(self, *exc_info):
        self.close()

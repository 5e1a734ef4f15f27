# The slots of the shared table: two words each (a key's fingerprint, its
# tat), spent by a 16-byte CAS of both (`take`) and found by a short probe
# (`lookup`). Included by _shared_c.pyx, which holds the claim protocol.

cdef int64_t PEND = INT64_MIN  # fingerprint flag: a claim in progress (see the module docstring)
cdef int64_t FREE = INT64_MIN   # a free slot: a claim of no key
DEF MAX_PROBE = 128             # the most slots a window may have (fixed-size scan arrays)


cdef inline int take(int64_t *slot, int64_t key, int64_t now, int64_t cost_t, int64_t slack,
                     int64_t *tat_out, int64_t *base_out) noexcept nogil:
    """GCRA on *key*'s slot: 1 admitted, 0 rejected, -1 the slot is no longer the key's.

    ``gcra.step`` (the rule of every bucket) applied by a 16-byte CAS of the
    whole slot, so that a spend lands only while the slot
    still belongs to *key*: a process that stalled after finding its slot
    cannot spend from a bucket another key has taken over since.
    """
    cdef int64_t tat, base
    while True:
        tat = nb_load_sc(slot + 1)
        if nb_load_sc(slot) != key:
            return -1
        if tat < 0:  # read while the slot was a claim: look again
            continue
        # The tat read before the fingerprint is this key's, or that of the
        # slot's owner before it, which is never later than the key's start
        # (the horizon): a rejection decided on it is one the key's own tat
        # also makes. An admission is decided by the CAS on both words.
        if not gcra.step(tat, now, cost_t, slack, tat_out, base_out):
            return 0
        if cost_t == 0 or nb_cas16(slot, key, tat, key, tat_out[0]):
            return 1


cdef inline int64_t *lookup(int64_t *slots, uint64_t mask, int64_t probe,
                            int64_t key) noexcept nogil:
    """*key*'s bucket if the scan meets it before an empty slot, else NULL: the common case.

    Apart from ``SharedTable._find`` (which handles claims too) so that the
    hot path is a few inlined instructions.
    """
    cdef uint64_t start = <uint64_t>key & mask
    cdef int64_t *s
    cdef int64_t f, n = 0
    while n < probe:
        s = slots + 2 * ((start + <uint64_t>n) & mask)
        f = nb_load_sc(s)
        if f == key:
            return s
        if f == 0:
            return NULL
        n += 1
    return NULL

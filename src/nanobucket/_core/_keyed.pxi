# The keyed table: KeyedTokenBucket, its slots and its garbage-collector hooks.
# Included by _bucket_c.pyx (one extension module); the rule it applies is _gcra.pxd.


ctypedef struct Slot:
    int64_t tat         # the bucket's word (see `gcra.take`)
    uint64_t hv         # the key's `key_hash`: for an int key in [0, 2**64), its value
    uintptr_t key       # a strong reference, | INT_KEY for such an int (0 in the stand-ins below)


cdef int32_t TAG_MASK = 0x7F000000  # an index value's tag bits, when entries fit in the rest
cdef int32_t TAG_MASK_IX = 0x00FFFFFF
cdef uintptr_t INT_KEY = 1  # `Slot.key`'s low bit (objects are aligned): `hv` holds the int


cdef inline PyObject *key_of(const Slot *s) noexcept nogil:
    return <PyObject *>(s.key & ~INT_KEY)


cdef inline void slot_set(Slot *s, object key, Py_hash_t kh) noexcept:
    """Store *key* (a new strong reference) and its `key_hash`, with `INT_KEY`
    set for an int in [0, 2**64), whose key hash is its value: a uint64
    batch then matches int keys by value without reading the key objects,
    each a cache miss in a large table, and the slot stays 24 bytes."""
    cdef int overflow = 0
    cdef long long value
    Py_INCREF(key)
    s.key = <uintptr_t><PyObject *>key
    s.hv = <uint64_t>kh
    if PyLong_CheckExact(key):
        value = PyLong_AsLongLongAndOverflow(key, &overflow)
        if (overflow == 0 and value >= 0) or nb_is_uint64(key, overflow):
            s.key |= INT_KEY


cdef Slot REJECTING  # a stand-in slot no request fits (tat set at import)
REJECTING.tat = 0x7FFFFFFFFFFFFFFF
cdef Slot NEEDS_ROOM  # a stand-in: this key's insertion may sweep the table


cdef inline Py_ssize_t slots_for(Py_ssize_t keys) noexcept nogil:
    """The smallest power-of-two slot count that holds *keys* at 2/3 load."""
    cdef Py_ssize_t n = 8
    while n * 2 // 3 < keys:
        n *= 2
    return n


cdef int64_t kth_smallest(int64_t *a, Py_ssize_t n, Py_ssize_t k, uint64_t *rng) noexcept nogil:
    """Quickselect: the k-th smallest (0-based) of a[0:n], reordering a.

    Random pivots (from *rng*): clients choose their costs, hence the tats,
    and a fixed pivot rule has inputs that make it quadratic.
    """
    cdef Py_ssize_t lo = 0, hi = n - 1, i, j
    cdef int64_t pivot, tmp
    while lo < hi:
        pivot = a[lo + <Py_ssize_t>(splitmix64(rng) % <uint64_t>(hi - lo + 1))]
        i = lo
        j = hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                tmp = a[i]; a[i] = a[j]; a[j] = tmp
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            return a[k]
    return a[k]


@cython.final
cdef class KeyedTokenBucket(_Limits):
    """KeyedTokenBucket(rate, capacity=None, *, max_keys=1_000_000, clock=None, none_key=False, per_process=False)
--

A token bucket per key, in a table of at most ``max_keys`` buckets.

    A full bucket and a missing key are the same state, so full buckets are
    dropped without loss. When a new key arrives at a table holding
    ``max_keys`` buckets, the full ones are dropped; if fewer than an eighth
    were full, the buckets closest to full are forgiven (dropped: their
    clients get back the few tokens they still owed) until an eighth of the
    table is free. Memory never grows past the bound.

    Key None is refused (`TypeError`): it is what a key function returns for
    a value that is missing, and every such request would share one bucket.
    With ``none_key=True`` None is a key like any other.

    >>> t = KeyedTokenBucket(rate=1, capacity=2)
    >>> [t.allow_at("alice", 0), t.allow_at("alice", 0), t.allow_at("alice", 0)]
    [True, True, False]
    >>> t.allow_at("bob", 0)
    True
    >>> KeyedTokenBucket("10 per second", capacity=20).interval_ns   # a rate as text
    100000000
    """

    # A compact hash table, as CPython's dict: `slots` holds the entries in
    # the order they came, `index` maps a hash position to an entry (-1:
    # empty). Keys met in the order they came hit neighbouring memory, and
    # the table costs 24 bytes an entry plus 4 per position. A key's home
    # position is nb_mix of its `key_hash` under the table's secret words,
    # so keys chosen to share CPython hash bits (ints are their own hash)
    # do not share a position; probing is linear from there. Below 2**24
    # entries a position also holds 7 more bits of that mix (`tag_mask`):
    # a probe passes other keys without reading their entries, each a
    # cache miss when keys come in random order.
    cdef Slot *slots            # `room` entries, the first `used` hold keys
    cdef int32_t *index         # `mask + 1` positions, linear probing: entry | tag, or -1
    cdef int32_t tag_mask       # the bits of an index value that hold a tag (0: none)
    cdef Py_ssize_t mask        # positions - 1 (a power of two)
    cdef Py_ssize_t used        # entries holding a key
    cdef Py_ssize_t room        # `used` may grow to this before a sweep
    cdef Py_ssize_t max_slots
    cdef readonly Py_ssize_t max_keys
    """The most buckets the table holds.

    >>> KeyedTokenBucket(rate=1, capacity=2, max_keys=1000).max_keys
    1000
    """
    # The latest tat of a full bucket dropped so far: a missing key starts
    # from it, so an explicit time older than a dropped state cannot find a
    # fresh bucket (time going backwards never creates tokens).
    cdef int64_t floor
    cdef uint64_t version       # bumped whenever `slots` is replaced
    # Batches deciding without the GIL hold slot pointers: while pinned, the
    # slot array must not be replaced (see `_make_room`).
    cdef int pins
    # Whether a key that can be in a reference cycle (a GC object: not a str
    # or an int) was ever inserted: until then the collector's traverse has
    # nothing to visit and skips reading a million keys (`keyed_traverse`).
    cdef bint gc_keys
    cdef uint64_t seed1, seed2  # the table's secret (see nb_mix)
    cdef uint64_t rng           # pivots of the sweep's quickselect
    cdef bint _none_key         # None is a key (else refused: see `_refuse_none`)
    cdef readonly uint64_t _probes
    """Entries examined by lookups and index positions by rebuilds (for tests)."""
    keyed = True  # the verbs take the key first

    def __cinit__(self):
        self.slots = NULL
        self.index = NULL

    def __init__(self, rate, capacity=None, *, max_keys=DEFAULT_MAX_KEYS, clock=None, none_key=False,
                 per_process=False):
        limits = self._new_limits(rate, capacity, clock)
        keys = validated_max_keys(max_keys)
        self._none_key = validated_flag(none_key, "none_key")
        self._per_process = validated_flag(per_process, "per_process")
        cdef Slot *slots
        cdef int32_t *index
        # Every argument is checked: from here nothing fails but the
        # allocation, and `_set_limits` makes the table usable last.
        self.max_keys = keys
        self.max_slots = slots_for(self.max_keys)
        self.tag_mask = TAG_MASK if self.max_keys <= TAG_MASK_IX else 0
        self.seed1 = next_secret()
        self.seed2 = next_secret() | 1
        self.rng = next_secret()
        if self.slots == NULL:
            self._alloc(8, &slots, &index)
            self._install(slots, index, 8)
        self._set_limits(limits, clock)

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.slots != NULL:
            for i in range(self.used):
                Py_DECREF(<object>key_of(&self.slots[i]))
        PyMem_RawFree(self.slots)
        PyMem_RawFree(self.index)

    cdef inline Py_ssize_t _room_of(self, Py_ssize_t n) noexcept:
        return min(n * 2 // 3, self.max_keys)

    cdef int _alloc(self, Py_ssize_t n, Slot **slots, int32_t **index) except -1:
        """Entries and an empty index for *n* positions (all or nothing)."""
        slots[0] = <Slot *>PyMem_RawCalloc(self._room_of(n), sizeof(Slot))
        index[0] = <int32_t *>PyMem_RawMalloc(n * sizeof(int32_t))
        if slots[0] == NULL or index[0] == NULL:
            PyMem_RawFree(slots[0])
            PyMem_RawFree(index[0])
            raise MemoryError()
        memset(index[0], 0xFF, n * sizeof(int32_t))  # -1: empty
        return 0

    cdef int _install(self, Slot *slots, int32_t *index, Py_ssize_t n) except -1:
        self.slots = slots
        self.index = index
        self.mask = n - 1
        self.room = self._room_of(n)
        self.version += 1
        return 0

    cdef inline uint64_t _mix(self, Py_hash_t kh) noexcept nogil:
        """The position hash of a key hash: its low bits the home, its top bits the tag."""
        return nb_mix(<uint64_t>kh, self.seed1, self.seed2)

    cdef inline int32_t _tag(self, uint64_t ph) noexcept nogil:
        return <int32_t>(ph >> 32) & self.tag_mask

    cdef Slot *_find(self, object key, Py_hash_t h, int64_t now, bint insert) except? NULL:
        """The slot of *key* (`key_hash` *h*); a new one (tat = floor) if *insert*, else NULL if missing."""
        cdef Py_ssize_t i
        cdef int32_t ix, tag
        cdef Slot *s
        cdef uint64_t version, ph = self._mix(h)
        cdef int eq
        cdef object other
        cdef int restarts = 0
        while True:  # restarts when a comparison ran code that changed the table
            i = <Py_ssize_t>(ph & <uint64_t>self.mask)
            tag = self._tag(ph)
            version = self.version
            while True:
                self._probes += 1
                ix = self.index[i]
                if ix < 0:
                    if not insert:
                        return NULL
                    if self.used >= self.room:
                        self._make_room(now)
                        break
                    s = &self.slots[self.used]
                    slot_set(s, key, h)
                    s.tat = self.floor
                    self.index[i] = <int32_t>self.used | tag
                    self.used += 1
                    return s
                if ix & self.tag_mask != tag:
                    i = (i + 1) & self.mask
                    continue  # another key: its entry need not be read
                s = &self.slots[ix & ~self.tag_mask]
                if key_of(s) == <PyObject *>key:
                    return s
                if s.hv == <uint64_t>h:
                    other = <object>key_of(s)  # a strong reference for the comparison
                    eq = PyObject_RichCompareBool(other, key, Py_EQ)
                    if self.version != version:
                        # A key whose __eq__ rebuilds the table every time
                        # would restart forever: give up after a few tries.
                        restarts += 1
                        if restarts > MAX_RESTARTS:
                            raise RuntimeError(
                                "a key's __eq__ keeps changing this KeyedTokenBucket: "
                                "lookup abandoned")
                        break
                    if eq:
                        return s
                i = (i + 1) & self.mask

    cdef int _make_room(self, int64_t now) except -1:
        """Sweep full buckets out; grow, or forgive the least indebted, as needed.

        The caller looks its key up again afterwards: the table may have
        changed, here or (while waiting) in another thread.
        """
        while self.pins:
            # A batch is deciding without the GIL on pointers into `slots`:
            # let it finish (it never waits on us) before replacing them.
            with nogil:
                sched_yield()
        return self._sweep(now)

    cdef int _sweep(self, int64_t now) except -1:
        cdef Py_ssize_t n = self.used, i, j, live = 0, forgive = 0, size, new_n
        cdef Slot *old = self.slots
        cdef int32_t *old_index = self.index
        cdef Slot *new
        cdef int32_t *new_index
        cdef int64_t cut = -1, floor = self.floor
        cdef Py_ssize_t ties = 0
        cdef int64_t *tats
        cdef uint64_t probes = 0, ph
        for i in range(n):
            if old[i].tat > now:
                live += 1
        # At the bound: forgive the buckets closest to full (smallest tat)
        # until an eighth of max_keys is free, so this sweep runs once per
        # max_keys/8 new keys, not once per key.
        forgive = live - (self.max_keys - max(1, self.max_keys // 8))
        if forgive > 0:
            tats = <int64_t *>PyMem_RawMalloc(live * sizeof(int64_t))
            if tats == NULL:
                raise MemoryError()
            j = 0
            for i in range(n):
                if old[i].tat > now:
                    tats[j] = old[i].tat
                    j += 1
            cut = kth_smallest(tats, live, forgive - 1, &self.rng)
            # Forgive every tat below the cut, then as many equal to it as
            # needed, earliest arrival first (the pure-Python twin's order:
            # a dict's, which `slots` keeps).
            ties = forgive
            for i in range(live):
                if tats[i] < cut:
                    ties -= 1
            PyMem_RawFree(tats)
        else:
            forgive = 0
        new_n = self.mask + 1
        if live - forgive > self.room // 2 and new_n < self.max_slots:
            new_n *= 2
        self._alloc(new_n, &new, &new_index)
        # Move the survivors, in order; dropped keys keep their entry in
        # `old` and are released only after the new table is in place, since
        # releasing a key can run arbitrary code (a __del__) that uses it.
        size = 0
        for i in range(n):
            if old[i].tat <= now:
                if old[i].tat > floor:
                    floor = old[i].tat
                continue
            if forgive > 0 and old[i].tat <= cut:
                if old[i].tat < cut:
                    continue
                if ties > 0:
                    ties -= 1
                    continue
            ph = self._mix(<Py_hash_t>old[i].hv)
            j = <Py_ssize_t>(ph & <uint64_t>(new_n - 1))
            probes += 1
            while new_index[j] >= 0:
                j = (j + 1) & (new_n - 1)
                probes += 1
            new[size] = old[i]
            new_index[j] = <int32_t>size | self._tag(ph)
            old[i].key = 0  # moved, not dropped
            size += 1
        self._probes += probes
        self.floor = floor
        self.used = size
        self._install(new, new_index, new_n)
        for i in range(n):
            if old[i].key:
                Py_DECREF(<object>key_of(&old[i]))
        PyMem_RawFree(old)
        PyMem_RawFree(old_index)
        return 0

    @property
    def none_key(self):
        """Whether None is a key (``none_key=True``); else a verb given None raises.

        >>> KeyedTokenBucket(rate=1, capacity=2).none_key
        False
        """
        return self._none_key

    cdef inline int _refuse_none(self, object key) except -1:
        """Raise for key None, unless the table takes it (off the hot path: see `_allow_hashed`)."""
        if key is None and not self._none_key:
            raise none_key_error(type(self).__name__)
        return 0

    cdef inline void _note_key(self, object key) noexcept:
        """Before *key* may be inserted: see `gc_keys`."""
        if not self.gc_keys and is_gc(<PyObject *>key):
            self.gc_keys = True

    cdef inline bint _take(self, Slot *s, int64_t now, int64_t cost_t,
                           int64_t *tat, int64_t *base) noexcept:
        """`gcra.take` on slot *s* by a caller holding the table's critical section."""
        # The section excludes every other writer, unless a batch is deciding
        # outside it (pinned): then only CAS is safe.
        return gcra.take(&s.tat, now, cost_t, self.tau - cost_t, tat, base, self.pins == 0)

    def allow(self, key, cost=1):
        """Spend *cost* tokens from *key*'s bucket now; True if admitted.

        >>> t = KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)
        >>> t.allow("alice"), t.allow("alice"), t.allow("bob")
        (True, False, True)
        """
        cdef int64_t c = self._cost(cost)
        return self._allow(key, self._now(), c)

    def allow_at(self, key, now, cost=1):
        """`allow` at an explicit time *now* (int ns).

        >>> t = KeyedTokenBucket(rate=1, capacity=1)
        >>> t.allow_at("alice", 0), t.allow_at("alice", 0), t.allow_at("alice", 1_000_000_000)
        (True, False, True)
        """
        cdef int64_t t = gcra.as_now(now, parse_now)
        return self._allow(key, t, self._cost(cost))

    cdef bint _allow(self, object key, int64_t now, int64_t cost) except -1:
        return self._allow_hashed(key, key_hash(key), now, cost)

    cdef bint _allow_hashed(self, object key, Py_hash_t h, int64_t now, int64_t cost) except -1:
        cdef int64_t cost_t
        cdef int64_t tat, base
        cdef Slot *s
        with cython.critical_section(self):
            # interval_ns and tau inside: reconfigure changes them under this section.
            cost_t = cost * self.interval_ns
            s = self._find(key, h, now, False)
            if s == NULL:
                # Checked for a missing key only: a refused None is never in
                # the table, and a key found costs nothing more.
                self._refuse_none(key)
                # A missing key is a full bucket (from `floor`); only a key
                # that is charged takes a place in the table.
                if not gcra.step(self.floor, now, cost_t, self.tau - cost_t, &tat, &base):
                    return False
                if cost_t == 0:
                    return True
                self._note_key(key)
                s = self._find(key, h, now, True)
            return self._take(s, now, cost_t, &tat, &base)

    def allow_many(self, keys, cost=1):
        """Decide a batch in order at one instant; ``bytearray`` of 1 (admitted) / 0.

        The same as ``allow_at(key, now, cost)`` for each key in turn, with one
        clock reading for the whole batch. *keys* is any iterable of keys; a
        buffer of unsigned 64-bit ints (``array('Q')``, numpy ``uint64``)
        means those ints, and the Cython table decides it without building
        an int object per key and with the GIL released while it charges.

        >>> t = KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> list(t.allow_many(["alice", "alice", "alice", "bob"]))
        [1, 1, 0, 1]
        >>> from array import array
        >>> list(t.allow_many(array("Q", [7, 7, 7, 8])))   # uint64: the buckets of ints 7, 8
        [1, 1, 0, 1]
        """
        cdef int64_t c = self._cost(cost)
        return self._allow_many(keys, self._now(), c)

    def allow_many_at(self, keys, now, cost=1):
        """`allow_many` at an explicit time *now* (int ns).

        >>> t = KeyedTokenBucket(rate=1, capacity=1)
        >>> list(t.allow_many_at(["alice", "bob", "alice"], 0))
        [1, 1, 0]
        """
        cdef int64_t t = gcra.as_now(now, parse_now)
        return self._allow_many(keys, t, self._cost(cost))

    cdef object _allow_many(self, object keys, int64_t now, int64_t cost):
        cdef const uint64_t[::1] ints
        if isinstance(keys, (str, bytes, bytearray)):
            raise TypeError("keys must be a sequence of keys, not a single str or bytes")
        if cost and PyObject_CheckBuffer(keys):
            try:
                ints = keys
            except (ValueError, TypeError, BufferError):
                pass  # not a buffer of uint64: decided as a sequence below
            else:
                return self._allow_many_uint64(ints, now, cost)
        cdef object seq = PySequence_Fast(keys, "keys must be an iterable of keys")
        if type(seq) is not tuple:
            # A list is returned as itself: a key's __hash__ or __eq__ (or,
            # free-threaded, another thread) could change it while its item
            # pointers are in use. Decide a snapshot, as the Python twin does.
            seq = tuple(seq)
        cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i
        cdef object out = PyByteArray_FromStringAndSize(NULL, n)
        cdef char *res = PyByteArray_AS_STRING(out)
        cdef PyObject **items = PySequence_Fast_ITEMS(seq)
        # Hash every key first, so an unhashable one fails the batch before
        # any token is spent.
        cdef Py_hash_t *hashes = <Py_hash_t *>PyMem_RawMalloc(max(n, 1) * sizeof(Py_hash_t))
        if hashes == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                if i + AHEAD < n:  # the key objects are scattered in memory
                    nb_prefetch(items[i + AHEAD])
                hashes[i] = key_hash(<object>items[i])
                self._refuse_none(<object>items[i])
            for i in range(n):
                if i + AHEAD < n:  # as in `_allow_many_uint64`
                    self._prefetch(self._mix(hashes[i + AHEAD]), self._mix(hashes[i + AHEAD // 2]))
                res[i] = self._allow_hashed(<object>items[i], hashes[i], now, cost)
        finally:
            PyMem_RawFree(hashes)
        return out

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef object _allow_many_uint64(self, const uint64_t[::1] keys, int64_t now, int64_t cost):
        """`_allow_many` for a buffer of uint64 keys: the same buckets as the ints.

        Chunk by chunk: with the GIL, find each key's slot (prefetched, no
        Python object made unless the key is new); then, pinned, charge the
        slots in order with the GIL released.
        """
        cdef Py_ssize_t n = keys.shape[0], start, end, i
        cdef object out = PyByteArray_FromStringAndSize(NULL, n)
        cdef char *res = PyByteArray_AS_STRING(out)
        cdef int64_t cost_t, slack
        cdef int64_t tat, base
        cdef uint64_t version
        cdef Slot **found = <Slot **>PyMem_RawMalloc(BATCH * sizeof(Slot *))
        cdef uint64_t *phs = <uint64_t *>PyMem_RawMalloc(BATCH * sizeof(uint64_t))
        try:
            if found == NULL or phs == NULL:
                raise MemoryError()
            start = 0
            while start < n:
                end = min(start + BATCH, n)
                with cython.critical_section(self):
                    # Read inside, chunk by chunk: `reconfigure` changes them
                    # under this section, and waits for no chunk pinned.
                    cost_t = cost * self.interval_ns
                    slack = self.tau - cost_t
                    # A uint64's key hash is itself (see `key_hash`): mix
                    # it here, once, for the prefetch and the probe.
                    for i in range(start, end):
                        phs[i - start] = self._mix(<Py_hash_t>keys[i])
                    version = self.version
                    i = start
                    while i < end:
                        # Prefetch the index AHEAD keys on and the entry
                        # AHEAD/2 on, so the probe below rarely waits.
                        if i + AHEAD < end:
                            self._prefetch(phs[i + AHEAD - start], phs[i + AHEAD // 2 - start])
                        found[i - start] = self._find_uint64(
                            keys[i], phs[i - start], now, slack, i == start)
                        if found[i - start] == &NEEDS_ROOM:
                            # Inserting this key may sweep the table, and the
                            # keys found so far are not charged yet: charge
                            # them first, then start the next chunk with it.
                            end = i
                            break
                        if self.version != version:
                            version = self.version
                            if i > start:  # a key's __eq__ changed the table: look again
                                i = start
                                continue
                        i += 1
                    self.pins += 1
                with nogil:
                    for i in range(start, end):
                        res[i] = gcra.take(&found[i - start].tat, now, cost_t, slack, &tat, &base, False)
                with cython.critical_section(self):
                    self.pins -= 1
                start = end
        finally:
            PyMem_RawFree(found)
            PyMem_RawFree(phs)
        return out

    cdef inline void _prefetch(self, uint64_t far, uint64_t near) noexcept:
        """Two-stage prefetch for batches, by position hash: *far*'s index
        position, *near*'s entry (its position was prefetched earlier, so
        reading it is cheap)."""
        cdef int32_t ix = self.index[near & <uint64_t>self.mask]
        nb_prefetch(&self.index[far & <uint64_t>self.mask])
        if ix >= 0:
            nb_prefetch(&self.slots[ix & ~self.tag_mask])

    cdef Slot *_find_uint64(self, uint64_t value, uint64_t ph, int64_t now,
                            int64_t slack, bint may_sweep) except NULL:
        """The slot of the int *value* (position hash *ph*), comparing without objects.

        A missing key is inserted if it will be charged (as `_allow_hashed`
        does); if not, the result is `REJECTING`, a slot no request fits. If
        inserting it could sweep the table and not *may_sweep*: `NEEDS_ROOM`.
        """
        cdef Py_ssize_t i = <Py_ssize_t>(ph & <uint64_t>self.mask)
        cdef int32_t ix, tag = self._tag(ph)
        cdef Slot *s = NULL
        while True:
            self._probes += 1
            ix = self.index[i]
            if ix < 0:
                break
            if ix & self.tag_mask != tag:
                i = (i + 1) & self.mask
                continue  # another key (see `_find`)
            s = &self.slots[ix & ~self.tag_mask]
            if s.key & INT_KEY:
                if s.hv == value:
                    return s  # this very int (see `slot_set`); the object is not read
            elif s.hv == value and not PyLong_CheckExact(<object>key_of(s)):
                break  # maybe an equal key of another type (1.0 == 1): the general path
            # else another key: an int out of uint64 range cannot equal *value*
            i = (i + 1) & self.mask
        if ix < 0 and (self.floor if self.floor > now else now) - now > slack:
            return &REJECTING
        if ix < 0 and self.used >= self.room and not may_sweep:
            return &NEEDS_ROOM
        return self._find(PyLong_FromUnsignedLongLong(value), <Py_hash_t>value, now, True)

    def check(self, key, cost=1):
        """Like `allow`, but return the whole `Decision`.

        >>> KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0).check("alice", cost=2)
        Decision(allowed=True, remaining=0, retry_after_ns=0, reset_after_ns=2000000000, limit=2)
        """
        cdef int64_t c = self._cost(cost)
        return self._check(key, self._now(), c, True)

    def check_at(self, key, now, cost=1):
        """`check` at an explicit time *now* (int ns).

        >>> t = KeyedTokenBucket(rate=1, capacity=2)
        >>> t.check_at("alice", 0, cost=2)
        Decision(allowed=True, remaining=0, retry_after_ns=0, reset_after_ns=2000000000, limit=2)
        >>> d = t.check_at("alice", 500_000_000)   # half a token back: half a second to wait
        >>> d.allowed, d.remaining, d.retry_after, d.reset_after
        (False, 0, 0.5, 1.5)
        """
        cdef int64_t t = gcra.as_now(now, parse_now)
        return self._check(key, t, self._cost(cost), True)

    def peek(self, key, cost=1):
        """The `Decision` `check` would return now, without spending anything.

        >>> t = KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)
        >>> t.peek("alice").allowed, t.peek("alice").allowed, len(t)
        (True, True, 0)
        """
        cdef int64_t c = self._cost(cost)
        return self._check(key, self._now(), c, False)

    def peek_at(self, key, now, cost=1):
        """`peek` at an explicit time *now* (int ns).

        >>> t = KeyedTokenBucket(rate=1, capacity=3)
        >>> t.peek_at("alice", 0, cost=2).remaining, t.tokens_at("alice", 0)
        (1, 3.0)
        """
        cdef int64_t t = gcra.as_now(now, parse_now)
        return self._check(key, t, self._cost(cost), False)

    cdef Decision _check(self, object key, int64_t now, int64_t cost, bint consume):
        cdef Py_hash_t h = key_hash(key)
        cdef int64_t cost_t
        cdef int64_t tat, base
        cdef bint allowed
        cdef Slot *s
        with cython.critical_section(self):
            cost_t = cost * self.interval_ns  # inside: see _allow_hashed
            s = self._find(key, h, now, False)
            if s == NULL:
                self._refuse_none(key)
            if consume and s != NULL:
                allowed = self._take(s, now, cost_t, &tat, &base)
            else:
                allowed = gcra.step(nb_load(&s.tat) if s != NULL else self.floor, now, cost_t,
                                    self.tau - cost_t, &tat, &base)
                if allowed and cost_t and consume:  # a missing key, charged: it takes a place
                    self._note_key(key)
                    s = self._find(key, h, now, True)
                    allowed = self._take(s, now, cost_t, &tat, &base)
            return self._decision(allowed, tat, now, cost_t, base)

    def tokens(self, key):
        """Tokens in *key*'s bucket now.

        >>> t = KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> t.allow("alice"), t.tokens("alice"), t.tokens("bob")
        (True, 1.0, 2.0)
        """
        return self._tokens_at(key, self._now())

    def tokens_at(self, key, now):
        """Tokens in *key*'s bucket at *now* (int ns).

        >>> t = KeyedTokenBucket(rate=4, capacity=2)
        >>> t.allow_at("alice", 0, cost=2)
        True
        >>> t.tokens_at("alice", 0), t.tokens_at("alice", 125_000_000), t.tokens_at("bob", 0)
        (0.0, 0.5, 2.0)
        """
        return self._tokens_at(key, gcra.as_now(now, parse_now))

    cdef double _tokens_at(self, object key, int64_t now) except? -1.0:
        self._ready()
        self._used()
        self._refuse_none(key)
        cdef Py_hash_t h = key_hash(key)
        cdef Slot *s
        cdef int64_t tat
        with cython.critical_section(self):
            s = self._find(key, h, now, False)
            tat = nb_load(&s.tat) if s != NULL else self.floor
            return self._tokens(tat, now)

    def __len__(self):
        """Keys whose buckets are not full (still owing tokens) now.

        >>> t = KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> t.allow("alice"), t.allow("bob", cost=0), len(t)   # a cost-0 probe takes no place
        (True, True, 1)
        """
        self._ready()
        self._used()
        cdef int64_t now = self._now()
        cdef Py_ssize_t i, count = 0
        with cython.critical_section(self):
            for i in range(self.used):
                if nb_load(&self.slots[i].tat) > now:
                    count += 1
        return count

    def __reduce__(self):
        raise unpicklable_error("KeyedTokenBucket")

    def __sizeof__(self):
        return (object.__sizeof__(self) + self.room * sizeof(Slot)
                + (self.mask + 1) * sizeof(int32_t))

    def __repr__(self):
        if self.one == NULL:
            return "<KeyedTokenBucket, not initialised>"
        return (f"KeyedTokenBucket(rate={self.rate!r}, capacity={self.capacity}, "
                f"max_keys={self.max_keys}{', none_key=True' if self._none_key else ''})")

    def refund(self, key, cost=1):
        """Give back *cost* tokens to *key*'s bucket.

        Never above capacity; a key not in the table gets nothing.

        >>> t = KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> t.allow("alice", cost=2)   # then the work fails before it starts
        True
        >>> t.refund("alice", cost=2); t.tokens("alice")
        2.0
        """
        cdef int64_t c = self._cost(cost)
        self._refund(key, self._now(), c)

    def refund_at(self, key, now, cost=1):
        """`refund` at an explicit time *now* (int ns).

        >>> t = KeyedTokenBucket(rate=1, capacity=2)
        >>> t.allow_at("alice", 0, cost=2)
        True
        >>> t.refund_at("alice", 0); t.tokens_at("alice", 0)
        1.0
        """
        cdef int64_t t = gcra.as_now(now, parse_now)
        self._refund(key, t, self._cost(cost))

    cdef int _refund(self, object key, int64_t now, int64_t cost) except -1:
        self._refuse_none(key)
        cdef Py_hash_t h = key_hash(key)
        cdef Slot *s
        with cython.critical_section(self):
            s = self._find(key, h, now, False)
            if s != NULL:
                gcra.give_back(&s.tat, now, cost * self.interval_ns)
        return 0

    def reset(self, key):
        """Forget *key*'s bucket: the next decision sees it full.

        >>> t = KeyedTokenBucket(rate=1, capacity=2)
        >>> t.allow_at("alice", 0, cost=2), t.reset("alice"), t.tokens_at("alice", 0)
        (True, None, 2.0)
        """
        self._ready()
        self._used()
        cdef Py_hash_t h = key_hash(key)
        self._refuse_none(key)
        cdef int64_t now = self._now()
        cdef Slot *s
        with cython.critical_section(self):
            # A missing key reads `floor`, not full after a reconfigure: give it a slot.
            s = self._find(key, h, now, self.floor > 0)
            if s != NULL:
                nb_store(&s.tat, 0)  # no time is earlier: full at every now
        return None

    def reserve(self, key, *, cost=1, max_wait_ns=0, shape=False, now=None):
        """`TokenBucket.reserve` for *key*'s bucket.

        >>> t = KeyedTokenBucket(rate=1, capacity=1)
        >>> t.reserve("alice", now=0), t.reserve("alice", now=0, max_wait_ns=10**9)
        (0, 1000000000)
        """
        cdef int64_t c = self._cost(cost)
        cdef int64_t mw = validated_max_wait(max_wait_ns)
        cdef bint sh = validated_shape(shape)
        cdef int64_t t = self._now() if now is None else gcra.as_now(now, parse_now)
        cdef Py_hash_t h = key_hash(key)
        self._refuse_none(key)
        cdef int64_t cost_t, wait
        cdef Slot *s
        with cython.critical_section(self):
            cost_t = c * self.interval_ns
            self._note_key(key)
            s = self._find(key, h, t, True)
            wait = gcra.reserve(&s.tat, t, cost_t, cost_t if sh else self.tau, mw)
        return wait

    def reservation(self, key, *, cost=1, max_wait_ns=0, shape=False, now=None):
        """`reserve` for *key*, as a `nanobucket.Reservation`: ``ok``, ``delay_ns``, ``cancel()``.

        >>> t = KeyedTokenBucket(rate=1, capacity=1)
        >>> r = t.reservation("alice", now=0)
        >>> r.ok, t.tokens_at("alice", 0), r.cancel_at(0), t.tokens_at("alice", 0)
        (True, 0.0, True, 1.0)
        """
        return Reservation.take(self, (key,), cost, max_wait_ns, shape, now)

    def reconfigure(self, rate=None, capacity=None, *, now=None):
        """Change the rate and/or the capacity of every bucket, keeping their state.

        Each bucket's tokens at *now* (default: the clock) carry over as they
        are, capped at the new capacity -- keys not in the table too (they
        were full: with a larger capacity they keep the old capacity's tokens
        and refill the rest). Takes time in proportion to the table's size,
        and excludes every other keyed verb meanwhile, on every build.
        Callers waiting in line move with their tokens, as in
        `TokenBucket.reconfigure`.

        >>> t = KeyedTokenBucket(rate=1, capacity=4)
        >>> t.allow_at("alice", 0, cost=3)
        True
        >>> t.reconfigure(rate=10, capacity=2, now=0)   # alice's 1 token stays; bob is full
        >>> t.tokens_at("alice", 0), t.tokens_at("alice", 100_000_000), t.tokens_at("bob", 0)
        (1.0, 2.0, 2.0)
        """
        self._ready()
        self._used()
        cdef int64_t t = self._now() if now is None else gcra.as_now(now, parse_now)
        cdef int64_t old, new
        cdef Py_ssize_t i
        with retimed(self, t), cython.critical_section(self):
            new_rate, cap, interval, tau = self._new_params(rate, capacity)
            while self.pins:
                # A batch is charging a chunk outside the section with the
                # parameters it read: let it finish first (as `_make_room`).
                with nogil:
                    sched_yield()
            for i in range(self.used):
                old = nb_load(&self.slots[i].tat)
                while True:
                    new = carry_over(old, t, self.interval_ns, self.tau, interval, tau)
                    if nb_cas(&self.slots[i].tat, &old, new):
                        break
            self.floor = carry_over(self.floor, t, self.interval_ns, self.tau, interval, tau)
            self._rate = new_rate
            self.capacity = cap
            self.interval_ns = interval
            self.tau = tau

    def acquire(self, key, cost=1, timeout=None):
        """Wait (block the thread) until *cost* tokens of *key* are spent, or *timeout* s pass.

        >>> t = KeyedTokenBucket(rate=1000, capacity=1, clock=lambda: 0)
        >>> t.acquire("alice"), t.acquire("alice", timeout=0), t.acquire("alice", timeout=1.0)
        (True, False, True)
        """
        cdef int64_t c = self._cost(cost)
        if timeout is not None:
            validated_timeout(timeout)
        if self._allow(key, self._now(), c):
            return True
        return _acquire.acquire_slow(self, (key,), c, timeout)

    def acquire_async(self, key, cost=1, timeout=None):
        """`acquire` for asyncio: ``await t.acquire_async(key)``.

        >>> import asyncio
        >>> t = KeyedTokenBucket(rate=1000, capacity=1, clock=lambda: 0)
        >>> asyncio.run(t.acquire_async("alice")), asyncio.run(t.acquire_async("alice", timeout=0))
        (True, False)
        """
        return _acquire.acquire_async(self, (key,), cost, timeout)

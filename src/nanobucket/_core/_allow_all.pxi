# AllowAll: all_of(...).allow and .check for _bucket_c's own buckets, with no Python frame
# between layers.
# Included by _bucket_c.pyx (one extension module).


@cython.final
cdef class AllowAll:
    """`nanobucket.layered.AllOf.allow` and ``check`` for layers that are all
    this module's `TokenBucket` and `KeyedTokenBucket` on one clock: the same
    decision, made at one clock reading with no Python frame in between.

    Layer i is charged only if layers 0..i-1 admitted; on a refusal the
    layers already charged get *cost* back at the same instant, latest
    first, so a refused request leaves every layer as it found it.

    >>> a, b = TokenBucket(rate=1, capacity=2), TokenBucket(rate=1, capacity=1)
    >>> allow = AllowAll.of((a, b), None).allow
    >>> allow(), allow(), a.tokens() >= 1.0   # b is empty: a was not charged
    (True, False, True)
    """

    keyed = True  # allow(key=None, cost=1), as all_of's

    cdef tuple layers
    cdef _Limits first
    cdef bint needs_key
    cdef object missing_key
    cdef object layered

    @staticmethod
    def of(layers, missing_key, layered=None):
        """An `AllowAll` for *layers* (charging order), or None if they do not qualify.

        *missing_key* is called (it raises) when a keyed layer gets key None;
        *layered*, a subclass of `Decision` with ``decisions`` and ``layer``
        (``LayeredDecision``), is the type ``check`` returns.

        >>> AllowAll.of((TokenBucket(1, 1), KeyedTokenBucket(1, 1)), None) is not None
        True
        >>> AllowAll.of((TokenBucket(1, 1), TokenBucket(1, 1, clock=lambda: 0)), None) is None
        True
        """
        cdef AllowAll self
        layers = tuple(layers)
        if not layers:
            return None
        for layer in layers:
            if type(layer) is not TokenBucket and type(layer) is not KeyedTokenBucket:
                return None
            if (<_Limits>layer).one == NULL:
                return None  # not usable: AllOf's general path lets its verbs say so
            if (<_Limits>layer).clock is not (<_Limits>layers[0]).clock:
                return None  # each layer reads its own clock: AllOf's general path
        self = AllowAll.__new__(AllowAll)
        self.layers = layers
        self.first = <_Limits>layers[0]
        self.needs_key = any(type(layer) is KeyedTokenBucket for layer in layers)
        self.missing_key = missing_key
        self.layered = layered
        return self

    def allow(self, key=None, cost=1):
        """Admit (True) only if every layer admits *cost*; a refusal charges no layer.

        >>> t = KeyedTokenBucket(rate=1, capacity=1)
        >>> allow = AllowAll.of((t, TokenBucket(rate=1, capacity=5)), None).allow
        >>> allow("alice"), allow("alice"), allow("bob")
        (True, False, True)
        """
        cdef Py_ssize_t n, i
        cdef int64_t c = 0, now = 0
        cdef Py_hash_t h = 0
        cdef bint hashed = False, ok
        cdef _Limits layer
        if self.layers is None:  # made with __new__, not `of` (or cleared by the collector)
            raise RuntimeError("this AllowAll is not usable: make one with AllowAll.of")
        n = PyTuple_GET_SIZE(self.layers)
        if key is None and self.needs_key:
            self.missing_key()
        # Errors come in the order the layers' own verbs would raise them,
        # and always after the layers already charged got their cost back.
        for i in range(n):
            layer = <_Limits>self.layers[i]
            if i == 0:
                c = layer._cost(cost)
                now = layer._now()
            elif c > layer.capacity or layer.one == NULL:
                self._undo(i, key, now, c)
                layer._cost(cost)  # raises the error this layer's allow would
            elif nb_load_relaxed(&layer.gen) != fork_gen:
                try:
                    layer._forked()  # as its own allow would (layer 0: in `_cost`)
                except BaseException:
                    self._undo(i, key, now, c)  # the warning is an error here
                    raise
            if type(layer) is TokenBucket:
                ok = (<TokenBucket>layer)._take(now, c)
            else:
                try:
                    if not hashed:
                        h = key_hash(key)
                        hashed = True
                    ok = (<KeyedTokenBucket>layer)._allow_hashed(key, h, now, c)
                except BaseException:
                    self._undo(i, key, now, c)  # an unhashable key, or its __eq__ raised
                    raise
            if not ok:
                self._undo(i, key, now, c)
                return False
        return True

    def check(self, key=None, cost=1):
        """Like `allow`, but return the *layered* decision naming the binding layer.

        A refused request leaves every layer as it found it; then the other
        layers' decisions are their ``peek`` at the same instant.

        >>> from nanobucket.layered import LayeredDecision
        >>> a, b = TokenBucket(rate=1, capacity=5), TokenBucket(rate=2, capacity=2)
        >>> d = AllowAll.of((a, b), None, LayeredDecision).check(cost=2)
        >>> (d.allowed, d.layer, d.remaining, [x.remaining for x in d.decisions])
        (True, 1, 0, [3, 0])
        """
        cdef Py_ssize_t n, i, rejected = -1
        cdef int64_t c = 0, now = 0
        cdef _Limits layer
        cdef Decision d
        cdef list decisions
        if self.layers is None:  # made with __new__, not `of` (or cleared by the collector)
            raise RuntimeError("this AllowAll is not usable: make one with AllowAll.of")
        if self.layered is None:
            raise TypeError("this AllowAll has no decision type: give AllowAll.of one")
        n = PyTuple_GET_SIZE(self.layers)
        if key is None and self.needs_key:
            self.missing_key()
        decisions = [None] * n
        # As `allow`: errors in the order the layers' own verbs raise them, after the undo.
        for i in range(n):
            layer = <_Limits>self.layers[i]
            if i == 0:
                c = layer._cost(cost)
                now = layer._now()
            elif c > layer.capacity or layer.one == NULL:
                self._undo(i, key, now, c)
                layer._cost(cost)  # raises the error this layer's check would
            elif nb_load_relaxed(&layer.gen) != fork_gen:
                try:
                    layer._forked()
                except BaseException:
                    self._undo(i, key, now, c)
                    raise
            if type(layer) is TokenBucket:
                d = (<TokenBucket>layer)._check(now, c, True)
            else:
                try:
                    d = (<KeyedTokenBucket>layer)._check(key, now, c, True)
                except BaseException:
                    self._undo(i, key, now, c)
                    raise
            decisions[i] = d
            if not d._allowed:
                self._undo(i, key, now, c)
                rejected = i
                break
        if rejected >= 0:  # every other layer as it stands now that nothing is charged
            for i in range(n):
                if i == rejected:
                    continue
                layer = <_Limits>self.layers[i]
                if c > layer.capacity or layer.one == NULL:
                    layer._cost(cost)  # raises the error this layer's peek would
                elif nb_load_relaxed(&layer.gen) != fork_gen:
                    layer._forked()
                if type(layer) is TokenBucket:
                    decisions[i] = (<TokenBucket>layer)._check(now, c, False)
                else:
                    decisions[i] = (<KeyedTokenBucket>layer)._check(key, now, c, False)
        return self._layered(rejected < 0, decisions, n)

    cdef object _layered(self, bint allowed, list decisions, Py_ssize_t n):
        """The *layered* decision of *decisions*: the binding layer's fields (see
        ``nanobucket.layered.LayeredDecision``, whose rule this is)."""
        cdef Py_ssize_t i, best = -1
        cdef Decision d, b = None
        for i in range(n):
            d = <Decision>decisions[i]
            if allowed:  # the fewest tokens left, then the longest reset
                if (b is None or d._remaining < b._remaining or (
                        d._remaining == b._remaining and d._reset_after_ns > b._reset_after_ns)):
                    best, b = i, d
            elif not d._allowed and (  # refusing layers: the longest wait, then reset
                    b is None or d._retry_after_ns > b._retry_after_ns or (
                        d._retry_after_ns == b._retry_after_ns
                        and d._reset_after_ns > b._reset_after_ns)):
                best, b = i, d
        out = Decision.__new__(self.layered)
        d = <Decision>out
        d._allowed = allowed
        d._remaining = b._remaining
        d._retry_after_ns = b._retry_after_ns
        d._reset_after_ns = b._reset_after_ns
        d._limit = b._limit
        out.decisions = tuple(decisions)
        out.layer = best
        return out

    cdef int _undo(self, Py_ssize_t charged, object key, int64_t now, int64_t c) except -1:
        """Give *c* back to layers charged-1 .. 0 at *now*."""
        cdef Py_ssize_t j
        cdef _Limits layer
        for j in range(charged - 1, -1, -1):
            layer = <_Limits>self.layers[j]
            if type(layer) is TokenBucket:
                (<TokenBucket>layer)._give_back(now, c)
            else:
                (<KeyedTokenBucket>layer)._refund(key, now, c)
        return 0

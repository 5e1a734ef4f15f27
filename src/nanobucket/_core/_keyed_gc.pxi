# The keyed table and the garbage collector: KeyedTokenBucket's tp_traverse and
# tp_clear, wrapped at import (included by _bucket_c.pyx after _keyed.pxi).

# The table holds strong references to its keys in C memory, which the
# traverse Cython generates does not see: a key that refers back to the table
# (an object holding it, a tuple containing it) would keep both alive for
# ever. Cython lets no class define tp_traverse, so at import the type's
# slots are wrapped: Cython's own (the Python fields), then every key.

cdef extern from *:
    """
    typedef int (*nb_visitproc)(PyObject *, void *);
    typedef int (*nb_traverseproc)(PyObject *, nb_visitproc, void *);
    typedef int (*nb_inquiry)(PyObject *);
    """
    ctypedef int (*nb_visitproc)(PyObject *, void *) noexcept
    ctypedef int (*nb_traverseproc)(PyObject *, nb_visitproc, void *) noexcept
    ctypedef int (*nb_inquiry)(PyObject *) noexcept
    ctypedef struct nb_type "PyTypeObject":
        nb_traverseproc tp_traverse
        nb_inquiry tp_clear


cdef nb_traverseproc keyed_traverse_cython = NULL
cdef nb_inquiry keyed_clear_cython = NULL


cdef int keyed_traverse(KeyedTokenBucket self, nb_visitproc visit, void *arg) noexcept:
    cdef int err = 0
    cdef Py_ssize_t i
    cdef PyObject *key
    cdef bint tracked = False
    if keyed_traverse_cython != NULL:
        err = keyed_traverse_cython(<PyObject *>self, visit, arg)
    if err or self.slots == NULL or not self.gc_keys:
        return err
    for i in range(self.used):
        if i + AHEAD < self.used:  # the keys are scattered: a full collection waits on each
            nb_prefetch(key_of(&self.slots[i + AHEAD]))
        key = key_of(&self.slots[i])
        # Only a tracked GC object can be in a cycle (visiting any other is
        # a no-op for the collector).
        if key != NULL and is_gc(key) and is_tracked(key):
            tracked = True
            err = visit(key, arg)
            if err:
                return err
    if not tracked:
        # Every key is untracked now: tuples of atomic values, which the
        # collector untracked for good. Skip the loop until a GC key comes.
        self.gc_keys = False
    return 0


cdef int keyed_clear(KeyedTokenBucket self) noexcept:
    """Release every key (breaking any cycle through one); the table is unusable after.

    The verbs then raise (`one` NULL, capacity 0: see `_Limits.one`), so
    code that runs while the keys are released (a finaliser) and reaches the
    table meets a clear error, never a key already released.
    """
    cdef Py_ssize_t i, n = self.used
    self.one = NULL
    self.capacity = 0
    self.gc_keys = False
    self.used = 0  # released below: neither a verb nor __dealloc__ reads them again
    if self.slots != NULL:
        for i in range(n):
            Py_XDECREF(key_of(&self.slots[i]))
    return keyed_clear_cython(<PyObject *>self) if keyed_clear_cython != NULL else 0


keyed_traverse_cython = (<nb_type *><PyObject *>KeyedTokenBucket).tp_traverse
keyed_clear_cython = (<nb_type *><PyObject *>KeyedTokenBucket).tp_clear
(<nb_type *><PyObject *>KeyedTokenBucket).tp_traverse = <nb_traverseproc>keyed_traverse
(<nb_type *><PyObject *>KeyedTokenBucket).tp_clear = <nb_inquiry>keyed_clear

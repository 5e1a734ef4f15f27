# The 8-byte atomics and the clock of _atomic.h, declared once for every module.
from libc.stdint cimport int64_t


cdef extern from "_atomic.h":
    int64_t nb_load(int64_t *p) noexcept nogil
    bint nb_cas(int64_t *p, int64_t *expected, int64_t desired) noexcept nogil
    int64_t nb_monotonic_ns() noexcept nogil
    void nb_prefetch(const void *p) noexcept nogil
    void nb_store(int64_t *p, int64_t v) noexcept nogil
    int64_t nb_load_relaxed(int64_t *p) noexcept nogil
    void nb_store_relaxed(int64_t *p, int64_t v) noexcept nogil
    int64_t nb_add(int64_t *p, int64_t v) noexcept nogil
    const bint NB_GIL_SERIALISES

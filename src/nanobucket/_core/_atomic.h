/* Tiny static-inline wrappers: an 8-byte atomic load and compare-and-swap,
 * a plain store for words no other thread writes meanwhile, a relaxed load,
 * store and fetch-and-add, and the
 * monotonic clock in integer nanoseconds. GCC/Clang use the
 * __atomic builtins; MSVC the Interlocked functions (no 16-byte CAS and no
 * __int128 anywhere, so the same code is lock-free on every target). */
#ifndef NANOBUCKET_ATOMIC_H
#define NANOBUCKET_ATOMIC_H

#include <stdint.h>

#if defined(_MSC_VER)
#include <windows.h>
#include <intrin.h>

static __inline int64_t nb_load(int64_t *p) {
    /* An aligned 8-byte read is atomic on x64 and arm64; the barrier keeps
     * the compiler from reordering it. */
    int64_t v = *(volatile int64_t *)p;
    _ReadWriteBarrier();
    return v;
}

static __inline int nb_cas(int64_t *p, int64_t *expected, int64_t desired) {
    int64_t seen = InterlockedCompareExchange64((volatile LONG64 *)p, desired, *expected);
    if (seen == *expected) return 1;
    *expected = seen;
    return 0;
}

static __inline void nb_store(int64_t *p, int64_t v) {
    *(volatile int64_t *)p = v;
    _ReadWriteBarrier();
}

static __inline int64_t nb_load_relaxed(int64_t *p) {
    return *(volatile int64_t *)p;
}

static __inline void nb_store_relaxed(int64_t *p, int64_t v) {
    *(volatile int64_t *)p = v;
}

static __inline int64_t nb_add(int64_t *p, int64_t v) {
    /* The value before the addition (wrapping, as two's complement). */
    return InterlockedExchangeAdd64((volatile LONG64 *)p, v);
}

static __inline void nb_prefetch(const void *p) {
    _mm_prefetch((const char *)p, _MM_HINT_T0);
}

static __inline int64_t nb_monotonic_ns(void) {
    static LARGE_INTEGER freq; /* constant after boot: a racy first write stores the same value */
    LARGE_INTEGER count;
    if (freq.QuadPart == 0) QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&count);
    /* Split so that count * 1e9 cannot overflow without 128-bit math. */
    return (int64_t)(count.QuadPart / freq.QuadPart) * 1000000000LL
         + (int64_t)((count.QuadPart % freq.QuadPart) * 1000000000LL / freq.QuadPart);
}

#else
#include <time.h>

static inline int64_t nb_load(int64_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline int nb_cas(int64_t *p, int64_t *expected, int64_t desired) {
    return __atomic_compare_exchange_n(p, expected, desired, 0,
                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static inline void nb_store(int64_t *p, int64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

/* Relaxed: for a flag read on the hot path whose writers need no ordering
 * with other memory (a plain mov on x86-64 and arm64, but no data race). */
static inline int64_t nb_load_relaxed(int64_t *p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline void nb_store_relaxed(int64_t *p, int64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

static inline int64_t nb_add(int64_t *p, int64_t v) {
    /* The value before the addition (the builtins wrap signed values). */
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

static inline void nb_prefetch(const void *p) {
    __builtin_prefetch(p);
}

static inline int64_t nb_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
#endif

/* 1 where the GIL serialises every caller holding it: there a word that is
 * only changed with the GIL held needs no CAS (a load and a store, about
 * 6 ns less on x86-64). 0 on free-threaded builds. */
#ifdef Py_GIL_DISABLED
#define NB_GIL_SERIALISES 0
#else
#define NB_GIL_SERIALISES 1
#endif

#endif /* NANOBUCKET_ATOMIC_H */

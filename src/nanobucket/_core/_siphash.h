/* SipHash (Aumasson & Bernstein), 64-bit output, with a 128-bit key.
 *
 * The shared-memory table hashes every key with SipHash-1-3 (the variant
 * CPython uses for str) keyed by the random 128-bit key in the file's header, so
 * that every process attached to a table agrees on each key's slot while a
 * client who does not know that key cannot aim many keys at one slot.
 * SipHash-2-4 is the same code with more rounds; it is exported so the tests
 * can check this implementation against the published test vectors.
 *
 * `tweak` is XORed into v1 at initialisation (as SipHash-128 does with
 * 0xee): a domain separator, so that the str "1", the bytes b"1" and the int
 * 1 hash differently without copying the key to prepend a type tag. */
#ifndef NANOBUCKET_SIPHASH_H
#define NANOBUCKET_SIPHASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define NB_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

#define NB_SIPROUND                                                    \
    do {                                                               \
        v0 += v1; v1 = NB_ROTL(v1, 13); v1 ^= v0; v0 = NB_ROTL(v0, 32); \
        v2 += v3; v3 = NB_ROTL(v3, 16); v3 ^= v2;                      \
        v0 += v3; v3 = NB_ROTL(v3, 21); v3 ^= v0;                      \
        v2 += v1; v1 = NB_ROTL(v1, 17); v1 ^= v2; v2 = NB_ROTL(v2, 32); \
    } while (0)

/* Little-endian 8-byte load from any alignment (memcpy compiles to a mov). */
static inline uint64_t nb_load_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint64_t nb_siphash(const void *data, size_t len, uint64_t k0, uint64_t k1,
                                  uint64_t tweak, int c_rounds, int d_rounds) {
    const uint8_t *in = (const uint8_t *)data;
    const uint8_t *end = in + (len - (len % 8));
    uint64_t v0 = 0x736f6d6570736575ULL ^ k0;
    uint64_t v1 = 0x646f72616e646f6dULL ^ k1 ^ tweak;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k0;
    uint64_t v3 = 0x7465646279746573ULL ^ k1;
    uint64_t b = ((uint64_t)len) << 56;
    uint64_t m;
    int i;
    for (; in != end; in += 8) {
        m = nb_load_le64(in);
        v3 ^= m;
        for (i = 0; i < c_rounds; i++) NB_SIPROUND;
        v0 ^= m;
    }
    switch (len & 7) {
    case 7: b |= ((uint64_t)in[6]) << 48; /* fall through */
    case 6: b |= ((uint64_t)in[5]) << 40; /* fall through */
    case 5: b |= ((uint64_t)in[4]) << 32; /* fall through */
    case 4: b |= ((uint64_t)in[3]) << 24; /* fall through */
    case 3: b |= ((uint64_t)in[2]) << 16; /* fall through */
    case 2: b |= ((uint64_t)in[1]) << 8;  /* fall through */
    case 1: b |= ((uint64_t)in[0]); break;
    case 0: break;
    }
    v3 ^= b;
    for (i = 0; i < c_rounds; i++) NB_SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    for (i = 0; i < d_rounds; i++) NB_SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

static inline uint64_t nb_siphash13(const void *data, size_t len, uint64_t k0, uint64_t k1,
                                    uint64_t tweak) {
    return nb_siphash(data, len, k0, k1, tweak, 1, 3);
}

static inline uint64_t nb_siphash24(const void *data, size_t len, uint64_t k0, uint64_t k1,
                                    uint64_t tweak) {
    return nb_siphash(data, len, k0, k1, tweak, 2, 4);
}

#endif /* NANOBUCKET_SIPHASH_H */

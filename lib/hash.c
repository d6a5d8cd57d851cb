/* A 64-bit hash over bytes, eight at a time (lib/hash.h). */
#include "hash.h"

#include <string.h>

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t load_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint64_t mix(uint64_t h, uint64_t w) {
    w *= 0x87c37b91114253d5ull;
    w = rotl(w, 31);
    w *= 0x4cf5ad432745937full;
    h ^= w;
    return rotl(h, 27) * 5 + 0x52dce729;
}

uint64_t pp_hash64(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    size_t words = n / 8;
    for (size_t i = 0; i < words; i++) h = mix(h, load_le64(p + 8 * i));
    unsigned char tail[8] = {0};
    memcpy(tail, p + 8 * words, n % 8);
    h = mix(h, load_le64(tail) ^ ((uint64_t)(n % 8) << 56));
    /* finalizer (MurmurHash3's fmix64), with the length */
    h ^= (uint64_t)n;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

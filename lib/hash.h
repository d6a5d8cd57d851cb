/* Internal: a fast, stable 64-bit hash of bytes, for integrity checks
 * (checkpoint files, run identities). Not cryptographic: it catches
 * truncation, bit rot and skew, not an attacker. */
#ifndef PIPPIN_LIB_HASH_H
#define PIPPIN_LIB_HASH_H

#include <stddef.h>
#include <stdint.h>

#define PP_HASH64_SEED 0x9e3779b97f4a7c15ull

/* Continues hash h over n bytes (start with PP_HASH64_SEED). The same
 * bytes give the same value on every machine (little-endian reads). */
uint64_t pp_hash64(uint64_t h, const void *data, size_t n);

#endif

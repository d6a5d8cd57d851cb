/* Internal: the header before each tensor's bytes on a bulk lane (a plain
 * TCP connection beside the transport that carries large tensors;
 * transport_bulk.c). Pure, so the fuzzer (fuzz/fuzz_bulk_lane.c) and the
 * transport share the same check.
 *
 *   bytes 0-3   "PPB1"
 *   bytes 4-7   the tensor's index in its message (little-endian u32)
 *   bytes 8-15  the message's sequence number (its envelope's seq, u64)
 *   bytes 16-23 the tensor's byte count (u64), then that many bytes */
#ifndef PIPPIN_TRANSPORT_BULK_WIRE_H
#define PIPPIN_TRANSPORT_BULK_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define PP_BULK_HEADER_BYTES 24u

typedef struct pp_bulk_header {
    uint32_t index;
    uint64_t seq;
    uint64_t nbytes;
} pp_bulk_header;

void pp_bulk_header_pack(const pp_bulk_header *h, uint8_t out[PP_BULK_HEADER_BYTES]);
/* "" if the n bytes are a header (then *h holds it), else what is wrong. */
const char *pp_bulk_header_parse(const void *buf, size_t n, pp_bulk_header *h);

#endif

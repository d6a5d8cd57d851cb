/* The bulk lane's per-tensor header (bulk_wire.h). */
#include "bulk_wire.h"

#include <string.h>

#define MAGIC "PPB1"

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void pp_bulk_header_pack(const pp_bulk_header *h, uint8_t out[PP_BULK_HEADER_BYTES]) {
    memcpy(out, MAGIC, 4);
    for (int i = 0; i < 4; i++) out[4 + i] = (uint8_t)(h->index >> (8 * i));
    put64(out + 8, h->seq);
    put64(out + 16, h->nbytes);
}

const char *pp_bulk_header_parse(const void *buf, size_t n, pp_bulk_header *h) {
    const uint8_t *p = buf;
    if (n != PP_BULK_HEADER_BYTES) return "a header of another size";
    if (memcmp(p, MAGIC, 4) != 0) return "no bulk header where one was due";
    h->index = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
    h->seq = get64(p + 8);
    h->nbytes = get64(p + 16);
    if (h->nbytes == 0) return "an empty tensor (empty ones never use the lane)";
    return "";
}

/* The model's protobuf wire format walked by hand just deep enough to take
 * the initializers' raw_data out (see onnx_wire.h). Every length is checked
 * against what is left of its message before it is used. */
#include "onnx_wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status_internal.h"

/* Field numbers in onnx.proto. */
#define MODEL_GRAPH 7
#define GRAPH_INITIALIZER 5
#define TENSOR_RAW_DATA 9
/* The record of a stripped payload: the largest field number protobuf
 * allows, which onnx.proto does not use. */
#define RECORD_FIELD 536870911u

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };
enum { LEVEL_MODEL, LEVEL_GRAPH, LEVEL_TENSOR };

/* Reads a varint at *p (< end); 0 when malformed. */
static int get_varint(const unsigned char **p, const unsigned char *end, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        unsigned char b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0;
}

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

static unsigned char *put_varint(unsigned char *o, uint64_t v) {
    while (v >= 0x80) {
        *o++ = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    *o++ = (unsigned char)v;
    return o;
}

/* One field: its number, wire type, where it starts (tag included), where
 * its tag ends and, for WT_LEN, its payload. */
typedef struct field {
    uint64_t num;
    int wt;
    const unsigned char *start, *after_tag, *payload, *end;
} field;

/* Next field of [*p, end); 0 at the end, -1 when malformed or a group. */
static int next_field(const unsigned char **p, const unsigned char *end, field *f) {
    if (*p >= end) return 0;
    f->start = *p;
    uint64_t tag, n;
    /* protobuf-c reads tags and lengths of at most 5 bytes: refusing longer
     * ones keeps the rewrite from accepting what it would refuse. */
    if (!get_varint(p, end, &tag) || *p - f->start > 5) return -1;
    f->after_tag = *p;
    f->num = tag >> 3;
    f->wt = (int)(tag & 7);
    if (f->num == 0 || f->num > RECORD_FIELD) return -1;
    size_t left;
    switch (f->wt) {
    case WT_VARINT:
        if (!get_varint(p, end, &n)) return -1;
        break;
    case WT_FIXED64:
    case WT_FIXED32:
        left = (size_t)(end - *p);
        n = f->wt == WT_FIXED64 ? 8 : 4;
        if (left < n) return -1;
        *p += n;
        break;
    case WT_LEN:
        if (!get_varint(p, end, &n) || *p - f->after_tag > 5) return -1;
        if (n > (uint64_t)(end - *p)) return -1;
        f->payload = *p;
        *p += n;
        break;
    default: return -1; /* groups: protobuf-c refuses them as well */
    }
    f->end = *p;
    return 1;
}

typedef struct strip {
    const unsigned char *base; /* the whole input, for offsets */
    size_t min_bytes;
} strip;

/* Writes msg [p, end) of the given level to o (NULL: only counts); returns
 * the size written, or SIZE_MAX when malformed. */
static size_t rewrite(const strip *st, int level, const unsigned char *p, const unsigned char *end,
                      unsigned char *o) {
    const unsigned char *last_raw = NULL; /* the raw_data field that counts */
    field f;
    int r;
    if (level == LEVEL_TENSOR) {
        for (const unsigned char *q = p; (r = next_field(&q, end, &f)) > 0;) {
            if (f.num == RECORD_FIELD) return SIZE_MAX;
            if (f.num == TENSOR_RAW_DATA && f.wt == WT_LEN) last_raw = f.start;
        }
        if (r < 0) return SIZE_MAX;
    }
    size_t n = 0;
    while ((r = next_field(&p, end, &f)) > 0) {
        int sub = (level == LEVEL_MODEL && f.num == MODEL_GRAPH && f.wt == WT_LEN) ? LEVEL_GRAPH
                  : (level == LEVEL_GRAPH && f.num == GRAPH_INITIALIZER && f.wt == WT_LEN) ? LEVEL_TENSOR
                                                                                             : -1;
        size_t plen = (size_t)(f.end - f.payload);
        if (level == LEVEL_TENSOR && f.start == last_raw && plen >= st->min_bytes &&
            (uint64_t)plen <= UINT32_MAX && (uint64_t)(f.payload - st->base) <= UINT32_MAX) {
            /* An empty raw_data, then the record: offset low, length high. */
            uint64_t rec = (uint64_t)(f.payload - st->base) | (uint64_t)plen << 32;
            uint64_t tag = (uint64_t)RECORD_FIELD << 3 | WT_FIXED64;
            size_t k = 2 + varint_size(tag) + 8;
            if (o) {
                unsigned char *w = o + n;
                *w++ = TENSOR_RAW_DATA << 3 | WT_LEN;
                *w++ = 0;
                w = put_varint(w, tag);
                for (int b = 0; b < 8; b++) *w++ = (unsigned char)(rec >> (8 * b));
            }
            n += k;
        } else if (sub >= 0) {
            size_t inner = rewrite(st, sub, f.payload, f.end, NULL);
            if (inner == SIZE_MAX) return SIZE_MAX;
            size_t head = (size_t)(f.after_tag - f.start);
            if (o) {
                memcpy(o + n, f.start, head);
                unsigned char *w = put_varint(o + n + head, inner);
                if (rewrite(st, sub, f.payload, f.end, w) != inner) return SIZE_MAX;
            }
            n += head + varint_size(inner) + inner;
        } else {
            if (o) memcpy(o + n, f.start, (size_t)(f.end - f.start));
            n += (size_t)(f.end - f.start);
        }
    }
    return r < 0 ? SIZE_MAX : n;
}

pp_status pp_onnx_wire_strip(const unsigned char *in, size_t len, size_t min_bytes, unsigned char **out,
                             size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    /* The record needs 12 bytes beside the empty field; smaller payloads
     * stay (and so nothing grows). */
    strip st = {in, min_bytes < 16 ? 16 : min_bytes};
    size_t n = rewrite(&st, LEVEL_MODEL, in, in + len, NULL);
    if (n == SIZE_MAX) return pp_error(PP_ERR_PARSE, "malformed protobuf");
    unsigned char *o = malloc(n ? n : 1);
    if (!o) return pp_error(PP_ERR_NOMEM, "out of memory");
    if (rewrite(&st, LEVEL_MODEL, in, in + len, o) != n) {
        free(o);
        return pp_error(PP_ERR_INTERNAL, "protobuf rewrite: sizes differ between passes");
    }
    *out = o;
    *out_len = n;
    return PP_OK;
}

int pp_onnx_wire_raw_data(const Onnx__TensorProto *tp, size_t in_len, size_t *offset, size_t *len) {
    int found = 0;
    for (unsigned i = 0; i < tp->base.n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &tp->base.unknown_fields[i];
        if (u->tag != RECORD_FIELD) continue;
        /* Only the stripper writes this field, once per message. */
        if (found || u->wire_type != PROTOBUF_C_WIRE_TYPE_64BIT || u->len != 8 || !u->data) return -1;
        uint64_t rec = 0;
        for (int b = 0; b < 8; b++) rec |= (uint64_t)u->data[b] << (8 * b);
        *offset = (size_t)(rec & UINT32_MAX);
        *len = (size_t)(rec >> 32);
        if (*offset > in_len || *len > in_len - *offset) return -1;
        found = 1;
    }
    return found;
}

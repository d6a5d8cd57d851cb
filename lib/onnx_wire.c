/* The model's protobuf wire format walked by hand just deep enough to take
 * the initializers' raw_data out (see onnx_wire.h). Every length is checked
 * against what is left of its message before it is used. */
#include "onnx_wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "file_io.h"
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

/* Reading from a file, the input is a reserved region as large as the
 * file, filled in chunks of this size as the walk first needs them: the
 * payloads it strips are never read, but for the chunks they share with
 * what is walked. */
#define CHUNK ((size_t)64 << 10)

typedef struct strip {
    const unsigned char *base; /* the whole input, for offsets */
    size_t len;
    size_t min_bytes;
    int fd;                    /* -1: base holds the input */
    const char *name;          /* the file, for messages */
    unsigned char *loaded;     /* a flag per chunk of base read from fd */
    pp_status err;             /* a read failed (the file shrank) */
} strip;

/* Makes [p, p+n) of the input (clipped to its end) readable; 0 if a read
 * failed (st->err). */
static int have(strip *st, const unsigned char *p, size_t n) {
    if (st->fd < 0 || st->err != PP_OK) return st->err == PP_OK;
    size_t a = (size_t)(p - st->base), b = n < st->len - a ? a + n : st->len;
    for (size_t c = a / CHUNK; c * CHUNK < b;) {
        if (st->loaded[c]) {
            c++;
            continue;
        }
        size_t e = c; /* one read for a run of chunks not yet read */
        while (e * CHUNK < b && !st->loaded[e]) e++;
        size_t from = c * CHUNK, to = e * CHUNK < st->len ? e * CHUNK : st->len;
        st->err = pp_read_at(st->fd, (unsigned char *)(uintptr_t)st->base + from, to - from, from, st->name);
        if (st->err != PP_OK) return 0;
        memset(st->loaded + c, 1, e - c);
        c = e;
    }
    return 1;
}

/* Next field of [*p, end); 0 at the end, -1 when malformed, a group or
 * unreadable. */
static int next_field(strip *st, const unsigned char **p, const unsigned char *end, field *f) {
    if (*p >= end) return 0;
    /* a tag and a varint: at most 20 bytes */
    if (!have(st, *p, 20)) return -1;
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


/* Writes msg [p, end) of the given level to o (NULL: only counts); returns
 * the size written, or SIZE_MAX when malformed. */
static size_t rewrite(strip *st, int level, const unsigned char *p, const unsigned char *end,
                      unsigned char *o) {
    const unsigned char *last_raw = NULL; /* the raw_data field that counts */
    field f;
    int r;
    if (level == LEVEL_TENSOR) {
        for (const unsigned char *q = p; (r = next_field(st, &q, end, &f)) > 0;) {
            if (f.num == RECORD_FIELD) return SIZE_MAX;
            if (f.num == TENSOR_RAW_DATA && f.wt == WT_LEN) last_raw = f.start;
        }
        if (r < 0) return SIZE_MAX;
    }
    size_t n = 0;
    while ((r = next_field(st, &p, end, &f)) > 0) {
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
            if (o && !have(st, f.start, (size_t)(f.end - f.start))) return SIZE_MAX;
            if (o) memcpy(o + n, f.start, (size_t)(f.end - f.start));
            n += (size_t)(f.end - f.start);
        }
    }
    return r < 0 ? SIZE_MAX : n;
}

/* Both passes over st's input into *out. */
static pp_status run_strip(strip *st, unsigned char **out, size_t *out_len) {
    /* The record needs 12 bytes beside the empty field; smaller payloads
     * stay (and so nothing grows). */
    if (st->min_bytes < 16) st->min_bytes = 16;
    const unsigned char *in = st->base, *end = st->base + st->len;
    size_t n = rewrite(st, LEVEL_MODEL, in, end, NULL);
    if (st->err != PP_OK) return st->err;
    if (n == SIZE_MAX) return pp_error(PP_ERR_PARSE, "malformed protobuf");
    unsigned char *o = malloc(n ? n : 1);
    if (!o) return pp_error(PP_ERR_NOMEM, "out of memory");
    size_t again = rewrite(st, LEVEL_MODEL, in, end, o);
    if (again != n) {
        free(o);
        if (st->err != PP_OK) return st->err;
        return pp_error(PP_ERR_INTERNAL, "protobuf rewrite: sizes differ between passes");
    }
    *out = o;
    *out_len = n;
    return PP_OK;
}

pp_status pp_onnx_wire_strip(const unsigned char *in, size_t len, size_t min_bytes, unsigned char **out,
                             size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    strip st = {in, len, min_bytes, -1, NULL, NULL, PP_OK};
    return run_strip(&st, out, out_len);
}

pp_status pp_onnx_wire_strip_fd(int fd, size_t len, const char *name, size_t min_bytes, unsigned char **out,
                                size_t *out_len) {
    static const unsigned char empty[1];
    *out = NULL;
    *out_len = 0;
    strip st = {empty, len, min_bytes, fd, name, NULL, PP_OK};
    void *base = NULL;
    if (len) {
        /* address space only: a page costs memory once a chunk is read */
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        st.loaded = calloc(len / CHUNK + 1, 1);
        if (base == MAP_FAILED || !st.loaded) {
            if (base != MAP_FAILED) munmap(base, len);
            free(st.loaded);
            return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
        }
        st.base = base;
    }
    pp_status s = run_strip(&st, out, out_len);
    if (base) munmap(base, len);
    free(st.loaded);
    return s;
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

/* The envelope's protobuf wire format, coded directly. See envelope_wire.h.
 *
 * Writing follows protobuf-c for proto3: fields in number order, scalars
 * and strings left out when zero or empty, repeated int64 packed, every
 * TensorMeta written even when empty. Reading follows protobuf-c's unpack:
 * unknown fields are skipped (groups are refused), a known field with the
 * wrong wire type is an error, shape is accepted packed or not, a repeated
 * scalar or string keeps its last value, 32-bit fields keep the low 32 bits
 * of their varint. */
#include "envelope_wire.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "status_internal.h"
#include "envelope.h"
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

/* ---- writing ---- */

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* int32 and enum values are sign-extended to 64 bits, as protobuf says */
static uint64_t i32(int32_t v) { return (uint64_t)(int64_t)v; }

static size_t varint_field_size(uint64_t v) { return v ? 1 + varint_size(v) : 0; }

static size_t len_field_size(size_t len) { return 1 + varint_size(len) + len; }

static size_t str_field_size(const char *s) {
    size_t n = s ? strlen(s) : 0;
    return n ? len_field_size(n) : 0;
}

static uint8_t *put_varint_field(uint8_t *p, unsigned field, uint64_t v) {
    if (!v) return p;
    *p++ = (uint8_t)(field << 3 | WT_VARINT);
    return put_varint(p, v);
}

static uint8_t *put_bytes_field(uint8_t *p, unsigned field, const void *data, size_t len) {
    if (!len) return p;
    *p++ = (uint8_t)(field << 3 | WT_LEN);
    p = put_varint(p, len);
    memcpy(p, data, len);
    return p + len;
}

static uint8_t *put_str_field(uint8_t *p, unsigned field, const char *s) {
    return put_bytes_field(p, field, s, s ? strlen(s) : 0);
}

static size_t shape_body_size(const Pippin__TensorMeta *m) {
    size_t n = 0;
    for (size_t d = 0; d < m->n_shape; d++) n += varint_size((uint64_t)m->shape[d]);
    return n;
}

static size_t meta_size(const Pippin__TensorMeta *m) {
    size_t n = str_field_size(m->name) + varint_field_size(i32(m->dtype));
    if (m->n_shape) n += len_field_size(shape_body_size(m));
    return n + varint_field_size(m->nbytes) + varint_field_size(m->nframes) +
           varint_field_size(i32((int32_t)m->placement)) + varint_field_size(m->shm_pos);
}

size_t pp_wire_size(const Pippin__Envelope *pb) {
    size_t n = varint_field_size(pb->version) + varint_field_size(i32((int32_t)pb->kind)) +
               varint_field_size(pb->run_id) + varint_field_size((uint64_t)pb->step) +
               varint_field_size(i32(pb->microbatch)) + varint_field_size(i32(pb->src_stage)) +
               varint_field_size(i32(pb->dst_stage)) + varint_field_size(pb->seq) +
               varint_field_size(i32(pb->src_rank));
    for (size_t i = 0; i < pb->n_tensors; i++) n += len_field_size(meta_size(pb->tensors[i]));
    n += str_field_size(pb->text);
    if (pb->inline_data.len) n += len_field_size(pb->inline_data.len);
    n += str_field_size(pb->shm_name) + varint_field_size(pb->sender_nonce);
    for (size_t i = 0; i < pb->n_batch; i++) n += len_field_size(pb->batch[i].len); /* even when empty */
    return n;
}

size_t pp_wire_write(const Pippin__Envelope *pb, uint8_t *out) {
    uint8_t *p = out;
    p = put_varint_field(p, 1, pb->version);
    p = put_varint_field(p, 2, i32((int32_t)pb->kind));
    p = put_varint_field(p, 3, pb->run_id);
    p = put_varint_field(p, 4, (uint64_t)pb->step);
    p = put_varint_field(p, 5, i32(pb->microbatch));
    p = put_varint_field(p, 6, i32(pb->src_stage));
    p = put_varint_field(p, 7, i32(pb->dst_stage));
    p = put_varint_field(p, 8, pb->seq);
    p = put_varint_field(p, 9, i32(pb->src_rank));
    for (size_t i = 0; i < pb->n_tensors; i++) {
        const Pippin__TensorMeta *m = pb->tensors[i];
        *p++ = 10 << 3 | WT_LEN;
        p = put_varint(p, meta_size(m));
        p = put_str_field(p, 1, m->name);
        p = put_varint_field(p, 2, i32(m->dtype));
        if (m->n_shape) {
            *p++ = 3 << 3 | WT_LEN;
            p = put_varint(p, shape_body_size(m));
            for (size_t d = 0; d < m->n_shape; d++) p = put_varint(p, (uint64_t)m->shape[d]);
        }
        p = put_varint_field(p, 4, m->nbytes);
        p = put_varint_field(p, 5, m->nframes);
        p = put_varint_field(p, 6, i32((int32_t)m->placement));
        p = put_varint_field(p, 7, m->shm_pos);
    }
    p = put_str_field(p, 11, pb->text);
    p = put_bytes_field(p, 12, pb->inline_data.data, pb->inline_data.len);
    p = put_str_field(p, 13, pb->shm_name);
    p = put_varint_field(p, 14, pb->sender_nonce);
    for (size_t i = 0; i < pb->n_batch; i++) {
        *p++ = 15 << 3 | WT_LEN;
        p = put_varint(p, pb->batch[i].len);
        if (pb->batch[i].len) memcpy(p, pb->batch[i].data, pb->batch[i].len);
        p += pb->batch[i].len;
    }
    return (size_t)(p - out);
}

/* ---- reading ---- */

typedef struct reader {
    const uint8_t *p, *end;
} reader;

/* Where the parsed message goes. The first pass (fill == 0) only counts
 * what the second pass will store, so that one allocation holds it all. */
typedef struct sink {
    int fill;
    size_t n_tensors, n_shape, str_bytes, n_batch;
    Pippin__TensorMeta *metas;
    int64_t *shapes;
    char *strs;
} sink;

/* what went wrong, for the error (set before returning 0); one per thread,
 * as ranks on threads decode at once */
static _Thread_local const char *bad;

static int get_varint(reader *r, uint64_t *v) {
    uint64_t x = 0;
    for (unsigned i = 0; i < 10; i++) {
        if (r->p >= r->end) return bad = "truncated varint", 0;
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return bad = "varint longer than 10 bytes", 0;
}

/* A field's tag as protobuf-c reads it: at most 5 bytes, a first byte with
 * field bits, the number kept to 32 bits (a non-canonical 0 is possible and,
 * like any unknown number, skipped). */
static int get_tag(reader *r, uint32_t *field, unsigned *wt) {
    if (r->p >= r->end || (*r->p & 0xf8) == 0) return bad = "bad field tag", 0;
    uint32_t tag = (*r->p & 0x7f) >> 3;
    *wt = *r->p & 7;
    if (!(*r->p & 0x80)) {
        r->p++;
        *field = tag;
        return 1;
    }
    unsigned shift = 4;
    size_t max = (size_t)(r->end - r->p) < 5 ? (size_t)(r->end - r->p) : 5;
    for (size_t i = 1; i < max; i++) {
        uint8_t b = r->p[i];
        tag |= (uint32_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) {
            r->p += i + 1;
            *field = tag;
            return 1;
        }
    }
    return bad = "bad field tag", 0;
}

/* A length prefix as protobuf-c reads it: at most 5 bytes, not over INT_MAX. */
static int get_len(reader *r, reader *sub) {
    uint64_t n = 0;
    unsigned i = 0;
    for (;; i++) {
        if (i == 5 || r->p + i >= r->end) return bad = "bad length prefix", 0;
        n |= (uint64_t)(r->p[i] & 0x7f) << (7 * i);
        if (!(r->p[i] & 0x80)) break;
    }
    r->p += i + 1;
    if (n > INT_MAX || n > (uint64_t)(r->end - r->p)) return bad = "length runs past the end", 0;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return 1;
}

static int skip(reader *r, unsigned wt) {
    uint64_t v;
    reader sub;
    switch (wt) {
    case WT_VARINT: return get_varint(r, &v);
    case WT_LEN: return get_len(r, &sub);
    case WT_I64:
    case WT_I32: {
        size_t n = wt == WT_I64 ? 8 : 4;
        if ((size_t)(r->end - r->p) < n) return bad = "truncated fixed-width field", 0;
        r->p += n;
        return 1;
    }
    default: return bad = "unsupported wire type (groups?)", 0;
    }
}

/* A string field: counted, or copied NUL-terminated into the sink. Like a C
 * string from protobuf-c, it ends at an embedded NUL. */
static int get_str(reader *r, sink *s, char **dst) {
    reader sub;
    if (!get_len(r, &sub)) return 0;
    size_t n = (size_t)(sub.end - sub.p);
    if (!s->fill) {
        s->str_bytes += n + 1;
        return 1;
    }
    memcpy(s->strs, sub.p, n);
    s->strs[n] = 0;
    *dst = s->strs;
    s->strs += n + 1;
    return 1;
}

static int want(unsigned wt, unsigned expect) {
    if (wt != expect) return bad = "field with the wrong wire type", 0;
    return 1;
}

static int read_meta(reader *r, sink *s, Pippin__TensorMeta *m) {
    while (r->p < r->end) {
        uint64_t v;
        uint32_t field;
        unsigned wt;
        if (!get_tag(r, &field, &wt)) return 0;
        switch (field) {
        case 1:
            if (!want(wt, WT_LEN) || !get_str(r, s, &m->name)) return 0;
            break;
        case 3:
            if (wt == WT_LEN) { /* packed */
                reader sub;
                if (!get_len(r, &sub)) return 0;
                while (sub.p < sub.end) {
                    if (!get_varint(&sub, &v)) return 0;
                    if (s->fill) m->shape[m->n_shape] = (int64_t)v;
                    m->n_shape++;
                }
            } else {
                if (!want(wt, WT_VARINT) || !get_varint(r, &v)) return 0;
                if (s->fill) m->shape[m->n_shape] = (int64_t)v;
                m->n_shape++;
            }
            break;
        case 2: case 4: case 5: case 6: case 7:
            if (!want(wt, WT_VARINT) || !get_varint(r, &v)) return 0;
            if (field == 2) m->dtype = (int32_t)(uint32_t)v;
            else if (field == 4) m->nbytes = v;
            else if (field == 5) m->nframes = (uint32_t)v;
            else if (field == 6) m->placement = (Pippin__Placement)(int32_t)(uint32_t)v;
            else m->shm_pos = v;
            break;
        default:
            if (!skip(r, wt)) return 0;
        }
    }
    if (!s->fill) s->n_shape += m->n_shape;
    return 1;
}

static int read_envelope(reader *r, sink *s, Pippin__Envelope *e) {
    size_t ti = 0, bi = 0;
    while (r->p < r->end) {
        uint64_t v;
        uint32_t field;
        unsigned wt;
        if (!get_tag(r, &field, &wt)) return 0;
        if (field >= 1 && field <= 9) {
            if (!want(wt, WT_VARINT) || !get_varint(r, &v)) return 0;
            switch (field) {
            case 1: e->version = (uint32_t)v; break;
            case 2: e->kind = (Pippin__Kind)(int32_t)(uint32_t)v; break;
            case 3: e->run_id = v; break;
            case 4: e->step = (int64_t)v; break;
            case 5: e->microbatch = (int32_t)(uint32_t)v; break;
            case 6: e->src_stage = (int32_t)(uint32_t)v; break;
            case 7: e->dst_stage = (int32_t)(uint32_t)v; break;
            case 8: e->seq = v; break;
            default: e->src_rank = (int32_t)(uint32_t)v; break;
            }
            continue;
        }
        reader sub;
        switch (field) {
        case 10: {
            if (!want(wt, WT_LEN) || !get_len(r, &sub)) return 0;
            Pippin__TensorMeta scratch, *m = &scratch;
            if (s->fill) {
                m = &s->metas[ti];
                e->tensors[ti] = m;
            }
            pippin__tensor_meta__init(m);
            m->shape = s->fill ? s->shapes : NULL;
            if (!read_meta(&sub, s, m)) return 0;
            if (s->fill) {
                s->shapes += m->n_shape;
                if (!m->n_shape) m->shape = NULL;
            }
            ti++;
            break;
        }
        case 11:
            if (!want(wt, WT_LEN) || !get_str(r, s, &e->text)) return 0;
            break;
        case 12:
            if (!want(wt, WT_LEN) || !get_len(r, &sub)) return 0;
            e->inline_data.data = (uint8_t *)sub.p;
            e->inline_data.len = (size_t)(sub.end - sub.p);
            break;
        case 13:
            if (!want(wt, WT_LEN) || !get_str(r, s, &e->shm_name)) return 0;
            break;
        case 14:
            if (!want(wt, WT_VARINT) || !get_varint(r, &e->sender_nonce)) return 0;
            break;
        case 15: /* points into data, like inline_data */
            if (!want(wt, WT_LEN) || !get_len(r, &sub)) return 0;
            if (s->fill) {
                e->batch[bi].data = (uint8_t *)sub.p;
                e->batch[bi].len = (size_t)(sub.end - sub.p);
            }
            bi++;
            break;
        default:
            if (!skip(r, wt)) return 0;
        }
    }
    if (!s->fill) {
        s->n_tensors = ti;
        s->n_batch = bi;
    }
    return 1;
}

static size_t round_up(size_t n) { return (n + 15) & ~(size_t)15; }

pp_status pp_wire_read(const uint8_t *data, size_t len, Pippin__Envelope **out) {
    void *block;
    return pp_wire_read_with(data, len, 0, 0, out, &block);
}

pp_status pp_wire_read_with(const uint8_t *data, size_t len, size_t head, size_t per_tensor,
                            Pippin__Envelope **out, void **block_out) {
    *out = NULL;
    *block_out = NULL;
    Pippin__Envelope counted;
    pippin__envelope__init(&counted);
    sink s = {0};
    reader r = {data, data + len};
    if (!read_envelope(&r, &s, &counted))
        return pp_error(PP_ERR_PARSE, "envelope is not a valid protobuf message: %s", bad);
    /* one block: the caller's head, the envelope, the tensor metadata and
     * pointers, shapes, strings */
    size_t sz_head = round_up(head + per_tensor * s.n_tensors);
    size_t sz_env = round_up(sizeof(Pippin__Envelope));
    size_t sz_ptrs = round_up(s.n_tensors * sizeof(Pippin__TensorMeta *));
    size_t sz_metas = round_up(s.n_tensors * sizeof(Pippin__TensorMeta));
    size_t sz_shapes = round_up(s.n_shape * sizeof(int64_t));
    size_t sz_batch = round_up(s.n_batch * sizeof(ProtobufCBinaryData));
    char *start = malloc(sz_head + sz_env + sz_ptrs + sz_metas + sz_shapes + sz_batch + s.str_bytes);
    if (!start) return pp_error(PP_ERR_NOMEM, "out of memory decoding an envelope");
    char *block = start + sz_head;
    Pippin__Envelope *e = (Pippin__Envelope *)block;
    pippin__envelope__init(e);
    e->n_tensors = s.n_tensors;
    e->tensors = s.n_tensors ? (Pippin__TensorMeta **)(block + sz_env) : NULL;
    e->n_batch = s.n_batch;
    e->batch = s.n_batch ? (ProtobufCBinaryData *)(block + sz_env + sz_ptrs + sz_metas + sz_shapes) : NULL;
    s.fill = 1;
    s.metas = (Pippin__TensorMeta *)(block + sz_env + sz_ptrs);
    s.shapes = (int64_t *)(block + sz_env + sz_ptrs + sz_metas);
    s.strs = block + sz_env + sz_ptrs + sz_metas + sz_shapes + sz_batch;
    r.p = data;
    if (!read_envelope(&r, &s, e)) { /* cannot fail where the first pass passed */
        free(start);
        return pp_error(PP_ERR_INTERNAL, "envelope changed between passes: %s", bad);
    }
    *out = e;
    *block_out = start;
    return PP_OK;
}

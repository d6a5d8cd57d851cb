/* Envelope encoding (protobuf-c), decoding and validation of every field. */
#include "envelope.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "envelope_wire.h"
#include "shm_ring.h"
#include "pippin.pb-c.h"

#include "status_internal.h"
/* Stack space for the metadata of this many tensors when packing. */
#define PACK_STACK_TENSORS 16

const char *pp_msg_kind_name(int kind) {
    switch (kind) {
    case PP_MSG_ACTIVATION: return "activation";
    case PP_MSG_GRADIENT: return "gradient";
    case PP_MSG_CONTROL: return "control";
    case PP_MSG_HEARTBEAT: return "heartbeat";
    case PP_MSG_ABORT: return "abort";
    case PP_WIRE_KIND_BATCH: return "batch";
    default: return "unknown";
    }
}

/* ---- packing ---- */

typedef struct pack_state {
    Pippin__Envelope pb;
    Pippin__TensorMeta meta_stack[PACK_STACK_TENSORS];
    Pippin__TensorMeta *ptr_stack[PACK_STACK_TENSORS];
    Pippin__TensorMeta *meta;
    Pippin__TensorMeta **ptrs;
    ProtobufCBinaryData batch[PP_ENVELOPE_MAX_BATCH];
} pack_state;

static pp_status pack_begin(const pp_envelope *env, pack_state *ps) {
    pippin__envelope__init(&ps->pb);
    ps->meta = ps->meta_stack;
    ps->ptrs = ps->ptr_stack;
    if (env->ntensors < 0) return pp_error(PP_ERR_INVALID, "negative tensor count");
    if (env->nbatch < 0 || (uint32_t)env->nbatch > PP_ENVELOPE_MAX_BATCH)
        return pp_error(PP_ERR_INVALID, "%d batch entries (at most %u)", env->nbatch, PP_ENVELOPE_MAX_BATCH);
    if (env->ntensors > PACK_STACK_TENSORS) {
        ps->meta = calloc((size_t)env->ntensors, sizeof *ps->meta);
        ps->ptrs = calloc((size_t)env->ntensors, sizeof *ps->ptrs);
        if (!ps->meta || !ps->ptrs) {
            free(ps->meta);
            free(ps->ptrs);
            return pp_error(PP_ERR_NOMEM, "out of memory packing an envelope");
        }
    }
    Pippin__Envelope *pb = &ps->pb;
    pb->version = env->version;
    pb->kind = (Pippin__Kind)env->kind;
    pb->run_id = env->run_id;
    pb->step = env->step;
    pb->microbatch = env->microbatch;
    pb->src_stage = env->src_stage;
    pb->dst_stage = env->dst_stage;
    pb->seq = env->seq;
    pb->src_rank = env->src_rank;
    pb->text = (char *)(env->text ? env->text : "");
    pb->inline_data.len = env->inline_data ? env->inline_bytes : 0;
    pb->inline_data.data = (uint8_t *)env->inline_data;
    pb->shm_name = (char *)(env->shm_name ? env->shm_name : "");
    pb->sender_nonce = env->sender_nonce;
    pb->n_batch = (size_t)env->nbatch;
    pb->batch = env->nbatch ? ps->batch : NULL;
    for (int i = 0; i < env->nbatch; i++) {
        ps->batch[i].data = (uint8_t *)env->batch[i].data;
        ps->batch[i].len = env->batch[i].len;
    }
    pb->n_tensors = (size_t)env->ntensors;
    pb->tensors = env->ntensors ? ps->ptrs : NULL;
    for (int i = 0; i < env->ntensors; i++) {
        const pp_wire_tensor *wt = &env->tensors[i];
        Pippin__TensorMeta *m = &ps->meta[i];
        pippin__tensor_meta__init(m);
        m->name = (char *)(wt->name ? wt->name : "");
        m->dtype = (int32_t)wt->dtype;
        m->n_shape = wt->ndim > 0 ? (size_t)wt->ndim : 0;
        m->shape = (int64_t *)wt->shape;
        m->nbytes = wt->nbytes;
        m->nframes = wt->nframes;
        m->placement = (Pippin__Placement)wt->placement;
        m->shm_pos = wt->shm_pos;
        ps->ptrs[i] = m;
    }
    return PP_OK;
}

static void pack_end(pack_state *ps) {
    if (ps->meta != ps->meta_stack) free(ps->meta);
    if (ps->ptrs != ps->ptr_stack) free(ps->ptrs);
}

size_t pp_envelope_packed_size(const pp_envelope *env) {
    pack_state ps;
    if (pack_begin(env, &ps) != PP_OK) return 0;
    size_t n = pp_wire_size(&ps.pb);
    pack_end(&ps);
    return n;
}

pp_status pp_envelope_pack_into(const pp_envelope *env, void *(*alloc)(void *ctx, size_t n), void *ctx,
                                size_t *len) {
    pack_state ps;
    PP_TRY(pack_begin(env, &ps));
    size_t need = pp_wire_size(&ps.pb);
    uint8_t *buf = alloc(ctx, need);
    if (buf) *len = pp_wire_write(&ps.pb, buf);
    pack_end(&ps);
    return buf ? PP_OK : pp_error(PP_ERR_NOMEM, "no room for an envelope of %zu bytes", need);
}

pp_status pp_envelope_pack(const pp_envelope *env, void *buf, size_t cap, size_t *len) {
    pack_state ps;
    PP_TRY(pack_begin(env, &ps));
    size_t need = pp_wire_size(&ps.pb);
    if (need > cap) {
        pack_end(&ps);
        return pp_error(PP_ERR_INVALID, "envelope needs %zu bytes, buffer has %zu", need, cap);
    }
    *len = pp_wire_write(&ps.pb, buf);
    pack_end(&ps);
    return PP_OK;
}

/* ---- decoding and validation ---- */

/* A decoded envelope: the parsed message (one block, see envelope_wire.h)
 * and the checked metadata handed out as pp_wire_tensor. */
typedef struct decoded {
    Pippin__Envelope *pb;
    pp_envelope_part *batch; /* malloc'd when there are entries */
    pp_wire_tensor tensors[];
} decoded;

/* A name is 1..255 bytes with no control characters, so it is safe to log
 * and to use as a mailbox key. */
static int name_ok(const char *s, size_t max, int allow_empty) {
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (c < 0x20 || c == 0x7f) return 0;
        if (n >= max) return 0;
    }
    return n > 0 || allow_empty;
}

static pp_status check_tensor(const Pippin__TensorMeta *m, size_t i, pp_wire_tensor *wt) {
    if (!m->name || !name_ok(m->name, PP_ENVELOPE_MAX_NAME, 0))
        return pp_error(PP_ERR_PARSE, "tensor %zu: name empty, longer than %u bytes or not printable",
                        i, PP_ENVELOPE_MAX_NAME);
    if (!pp_dtype_is_valid((pp_dtype)m->dtype) || pp_dtype_size((pp_dtype)m->dtype) == 0)
        return pp_error(PP_ERR_PARSE, "tensor '%s': unknown dtype code %" PRId32, m->name, m->dtype);
    if (m->n_shape > PP_MAX_DIMS)
        return pp_error(PP_ERR_PARSE, "tensor '%s': %zu dims (at most %d)", m->name, m->n_shape,
                        PP_MAX_DIMS);
    uint64_t bytes = pp_dtype_size((pp_dtype)m->dtype);
    int zero = 0, overflow = 0;
    for (size_t d = 0; d < m->n_shape; d++) {
        int64_t v = m->shape[d];
        if (v < 0)
            return pp_error(PP_ERR_PARSE, "tensor '%s': dim %zu is negative (%" PRId64 ")",
                            m->name, d, v);
        if (v == 0) zero = 1;
        else if (!overflow && bytes > UINT64_MAX / (uint64_t)v) overflow = 1;
        else if (!overflow) bytes *= (uint64_t)v;
    }
    if (zero) bytes = 0;
    else if (overflow)
        return pp_error(PP_ERR_PARSE, "tensor '%s': shape product overflows", m->name);
    if (bytes != m->nbytes)
        return pp_error(PP_ERR_PARSE,
                        "tensor '%s': shape and dtype give %" PRIu64 " bytes, envelope says %" PRIu64,
                        m->name, bytes, m->nbytes);
    if (bytes > SIZE_MAX)
        return pp_error(PP_ERR_PARSE, "tensor '%s': %" PRIu64 " bytes do not fit in memory", m->name,
                        bytes);
    int place = (int)m->placement;
    if (place != PP_PLACE_FRAMES && place != PP_PLACE_INLINE && place != PP_PLACE_SHM && place != PP_PLACE_BULK)
        return pp_error(PP_ERR_PARSE, "tensor '%s': unknown placement %d", m->name, place);
    if (place == PP_PLACE_FRAMES && (bytes == 0) != (m->nframes == 0))
        return pp_error(PP_ERR_PARSE, "tensor '%s': %" PRIu64 " bytes in %" PRIu32 " frames",
                        m->name, bytes, m->nframes);
    if (place != PP_PLACE_FRAMES && (m->nframes != 0 || bytes == 0))
        return pp_error(PP_ERR_PARSE, "tensor '%s': %s tensor of %" PRIu64 " bytes claims %" PRIu32
                        " frames", m->name, place == PP_PLACE_INLINE ? "an inline"
                                            : place == PP_PLACE_SHM  ? "a shared-memory" : "a bulk",
                        bytes, m->nframes);
    if (m->nframes > bytes)
        return pp_error(PP_ERR_PARSE, "tensor '%s': %" PRIu32 " frames for %" PRIu64 " bytes",
                        m->name, m->nframes, bytes);
    if (place != PP_PLACE_SHM && m->shm_pos != 0)
        return pp_error(PP_ERR_PARSE, "tensor '%s': ring position without shared-memory placement",
                        m->name);
    if (place == PP_PLACE_SHM && m->shm_pos > UINT64_MAX - bytes)
        return pp_error(PP_ERR_PARSE, "tensor '%s': ring position overflows", m->name);
    wt->name = m->name;
    wt->dtype = (pp_dtype)m->dtype;
    wt->ndim = (int)m->n_shape;
    memset(wt->shape, 0, sizeof wt->shape);
    for (size_t d = 0; d < m->n_shape; d++) wt->shape[d] = m->shape[d];
    wt->nbytes = bytes;
    wt->nframes = m->nframes;
    wt->placement = (pp_wire_placement)place;
    wt->shm_pos = m->shm_pos;
    return PP_OK;
}

static pp_status check_envelope(const Pippin__Envelope *pb, const pp_envelope_limits *lim,
                                decoded *dec) {
    uint64_t max_bytes = lim && lim->max_message_bytes ? lim->max_message_bytes
                                                       : PP_ENVELOPE_DEFAULT_MAX_MESSAGE_BYTES;
    uint32_t max_tensors = lim && lim->max_tensors ? lim->max_tensors : PP_ENVELOPE_DEFAULT_MAX_TENSORS;
    uint32_t max_frames = lim && lim->max_frames ? lim->max_frames : PP_ENVELOPE_DEFAULT_MAX_FRAMES;
    int nstages = lim ? lim->nstages : 0;
    int nranks = lim ? lim->nranks : 0;

    if (pb->version != PP_PROTOCOL_VERSION)
        return pp_error(PP_ERR_PARSE, "protocol version %" PRIu32 " (expected %u)", pb->version,
                        PP_PROTOCOL_VERSION);
    int kind = (int)pb->kind;
    if ((kind < PP_MSG_ACTIVATION || kind > PP_MSG_ABORT) && kind != PP_WIRE_KIND_BATCH)
        return pp_error(PP_ERR_PARSE, "unknown message kind %d", kind);
    if (kind == PP_WIRE_KIND_BATCH) {
        /* a container: the entries carry everything, and are checked one
         * by one as messages of their own */
        if (pb->n_batch == 0 || pb->n_batch > PP_ENVELOPE_MAX_BATCH)
            return pp_error(PP_ERR_PARSE, "batch of %zu entries (1 to %u)", pb->n_batch,
                            PP_ENVELOPE_MAX_BATCH);
        for (size_t i = 0; i < pb->n_batch; i++)
            if (pb->batch[i].len == 0) return pp_error(PP_ERR_PARSE, "batch entry %zu is empty", i);
        if (pb->n_tensors || pb->step || pb->microbatch || pb->src_stage || pb->dst_stage ||
            (pb->text && pb->text[0]) || pb->inline_data.len || (pb->shm_name && pb->shm_name[0]))
            return pp_error(PP_ERR_PARSE, "a batch carries nothing but its entries");
    } else if (pb->n_batch) {
        return pp_error(PP_ERR_PARSE, "%s message with %zu batch entries", pp_msg_kind_name(kind),
                        pb->n_batch);
    }
    if (pb->step < 0) return pp_error(PP_ERR_PARSE, "negative step %" PRId64, pb->step);
    if (pb->microbatch < 0)
        return pp_error(PP_ERR_PARSE, "negative microbatch %" PRId32, pb->microbatch);
    if (pb->src_stage < 0 || (nstages > 0 && pb->src_stage >= nstages))
        return pp_error(PP_ERR_PARSE, "unknown source stage %" PRId32, pb->src_stage);
    if (pb->dst_stage < 0 || (nstages > 0 && pb->dst_stage >= nstages))
        return pp_error(PP_ERR_PARSE, "unknown destination stage %" PRId32, pb->dst_stage);
    if (pb->src_rank < 0 || (nranks > 0 && pb->src_rank >= nranks))
        return pp_error(PP_ERR_PARSE, "unknown source rank %" PRId32, pb->src_rank);
    if (!pb->text || !name_ok(pb->text, PP_ENVELOPE_MAX_TEXT, 1))
        return pp_error(PP_ERR_PARSE, "text longer than %u bytes or not printable",
                        PP_ENVELOPE_MAX_TEXT);
    if (pb->n_tensors > max_tensors)
        return pp_error(PP_ERR_PARSE, "%zu tensors (at most %" PRIu32 ")", pb->n_tensors,
                        max_tensors);
    if ((kind == PP_MSG_ACTIVATION || kind == PP_MSG_GRADIENT) && pb->n_tensors == 0)
        return pp_error(PP_ERR_PARSE, "%s message without tensors", pp_msg_kind_name(kind));
    if ((kind == PP_MSG_HEARTBEAT || kind == PP_MSG_ABORT) && pb->n_tensors != 0)
        return pp_error(PP_ERR_PARSE, "%s message with %zu tensors", pp_msg_kind_name(kind),
                        pb->n_tensors);

    uint64_t total = 0, frames = 0, inl = 0, in_shm = 0;
    pp_status s = PP_OK;
    for (size_t i = 0; i < pb->n_tensors && s == PP_OK; i++) {
        const Pippin__TensorMeta *m = pb->tensors[i];
        s = m ? check_tensor(m, i, &dec->tensors[i])
              : pp_error(PP_ERR_PARSE, "tensor %zu missing", i);
        if (s != PP_OK) break;
        for (size_t j = 0; j < i && s == PP_OK; j++)
            if (strcmp(dec->tensors[j].name, m->name) == 0)
                s = pp_error(PP_ERR_PARSE, "tensor '%s' appears twice", m->name);
        /* a sum can only wrap when nbytes alone is over the limit, which is caught */
        total += m->nbytes;
        frames += m->nframes;
        if (m->placement == PIPPIN__PLACEMENT__PLACEMENT_INLINE) inl += m->nbytes;
        if (m->placement == PIPPIN__PLACEMENT__PLACEMENT_SHM) in_shm++;
        if (s == PP_OK && (m->nbytes > max_bytes || total > max_bytes))
            s = pp_error(PP_ERR_PARSE, "message carries more than the limit of %" PRIu64 " bytes",
                         max_bytes);
        if (s == PP_OK && frames > max_frames)
            s = pp_error(PP_ERR_PARSE, "message has more than %" PRIu32 " data frames", max_frames);
    }
    /* inl <= total <= max_bytes here, so it did not wrap */
    if (s == PP_OK && inl != (uint64_t)pb->inline_data.len)
        s = pp_error(PP_ERR_PARSE, "%zu bytes of inline data, inline tensors hold %" PRIu64,
                     pb->inline_data.len, inl);
    if (s == PP_OK && !pb->shm_name)
        s = pp_error(PP_ERR_PARSE, "shared-memory ring name missing");
    if (s == PP_OK && in_shm && !pp_shm_ring_name_ok(pb->shm_name))
        s = pp_error(PP_ERR_PARSE, "shared-memory ring name is not \"/pippin-\" and up to %u "
                     "letters, digits, '.', '_' or '-'", PP_ENVELOPE_MAX_SHM_NAME);
    if (s == PP_OK && !in_shm && pb->shm_name[0])
        s = pp_error(PP_ERR_PARSE, "shared-memory ring name without shared-memory tensors");
    return s;
}

pp_status pp_envelope_decode(const void *data, size_t len, const pp_envelope_limits *lim,
                             pp_envelope *out) {
    memset(out, 0, sizeof *out);
    if (len == 0) return pp_error(PP_ERR_PARSE, "empty envelope frame");
    if (len > PP_ENVELOPE_MAX_BYTES)
        return pp_error(PP_ERR_PARSE, "envelope frame of %zu bytes (at most %u)", len,
                        PP_ENVELOPE_MAX_BYTES);
    /* one allocation: this module's bookkeeping and the parsed message */
    Pippin__Envelope *pb;
    void *block;
    PP_TRY(pp_wire_read_with(data, len, sizeof(decoded), sizeof(pp_wire_tensor), &pb, &block));
    decoded *dec = block;
    dec->pb = pb;
    dec->batch = NULL;
    memset(dec->tensors, 0, pb->n_tensors * sizeof dec->tensors[0]);
    pp_status s = pb->n_tensors > (lim && lim->max_tensors ? lim->max_tensors : PP_ENVELOPE_DEFAULT_MAX_TENSORS)
                      ? pp_error(PP_ERR_PARSE, "%zu tensors (at most %" PRIu32 ")", pb->n_tensors,
                                 lim && lim->max_tensors ? lim->max_tensors : PP_ENVELOPE_DEFAULT_MAX_TENSORS)
                      : check_envelope(pb, lim, dec);
    if (s != PP_OK) {
        free(block);
        return s;
    }
    out->version = pb->version;
    out->kind = (pp_msg_kind)pb->kind;
    out->run_id = pb->run_id;
    out->step = pb->step;
    out->microbatch = pb->microbatch;
    out->src_stage = pb->src_stage;
    out->dst_stage = pb->dst_stage;
    out->src_rank = pb->src_rank;
    out->seq = pb->seq;
    out->ntensors = (int)pb->n_tensors;
    out->tensors = dec->tensors;
    out->text = pb->text;
    out->inline_data = pb->inline_data.len ? pb->inline_data.data : NULL;
    out->inline_bytes = pb->inline_data.len;
    out->shm_name = pb->shm_name;
    out->sender_nonce = pb->sender_nonce;
    if (pb->n_batch) {
        dec->batch = malloc(pb->n_batch * sizeof *dec->batch);
        if (!dec->batch) {
            free(block);
            memset(out, 0, sizeof *out);
            return pp_error(PP_ERR_NOMEM, "out of memory decoding a batch");
        }
        for (size_t i = 0; i < pb->n_batch; i++) {
            dec->batch[i].data = pb->batch[i].data;
            dec->batch[i].len = pb->batch[i].len;
        }
        out->nbatch = (int)pb->n_batch;
        out->batch = dec->batch;
    }
    out->priv_ = dec;
    return PP_OK;
}

pp_status pp_envelope_decode_entry(const void *data, size_t len, const pp_envelope_limits *lim,
                                   pp_envelope *out) {
    PP_TRY(pp_envelope_decode(data, len, lim, out));
    pp_status s = PP_OK;
    if (out->kind != PP_MSG_ACTIVATION && out->kind != PP_MSG_GRADIENT)
        s = pp_error(PP_ERR_PARSE, "a %s message in a batch (only activations and gradients)",
                     pp_msg_kind_name((int)out->kind));
    for (int i = 0; i < out->ntensors && s == PP_OK; i++) {
        const pp_wire_tensor *wt = &out->tensors[i];
        if (wt->placement != PP_PLACE_INLINE && wt->nbytes != 0)
            s = pp_error(PP_ERR_PARSE, "tensor '%s' in a batch is not inline", wt->name);
    }
    if (s != PP_OK) pp_envelope_clear(out);
    return s;
}

void pp_envelope_clear(pp_envelope *env) {
    if (!env) return;
    if (env->priv_) free(((decoded *)env->priv_)->batch);
    free(env->priv_); /* the decoded block, parsed message included */
    memset(env, 0, sizeof *env);
}

pp_status pp_envelope_check_frames(const pp_envelope *env, size_t nframes,
                                   const size_t *frame_sizes) {
    size_t f = 0;
    for (int i = 0; i < env->ntensors; i++) {
        const pp_wire_tensor *wt = &env->tensors[i];
        if (wt->placement != PP_PLACE_FRAMES) continue; /* no frames */
        uint64_t sum = 0;
        for (uint32_t k = 0; k < wt->nframes; k++, f++) {
            if (f >= nframes)
                return pp_error(PP_ERR_PARSE, "message has %zu data frames, envelope announces more",
                                nframes);
            if (frame_sizes[f] == 0)
                return pp_error(PP_ERR_PARSE, "tensor '%s': empty data frame", wt->name);
            sum += frame_sizes[f];
            if (sum > wt->nbytes) break;
        }
        if (sum != wt->nbytes)
            return pp_error(PP_ERR_PARSE,
                            "tensor '%s': data frames hold %s%" PRIu64 " bytes, envelope says %" PRIu64,
                            wt->name, sum > wt->nbytes ? "at least " : "", sum, wt->nbytes);
    }
    if (f != nframes)
        return pp_error(PP_ERR_PARSE, "message has %zu data frames, envelope announces %zu",
                        nframes, f);
    return PP_OK;
}

pp_status pp_envelope_tensor_copy(const pp_wire_tensor *wt, const void *const *frames,
                                  const size_t *sizes, pp_tensor **out) {
    pp_tensor *t;
    PP_TRY(pp_tensor_empty(wt->dtype, wt->ndim, wt->shape, &t));
    if (t->nbytes != wt->nbytes) {
        pp_tensor_free(t);
        return pp_error(PP_ERR_INTERNAL, "tensor '%s': size mismatch after validation", wt->name);
    }
    size_t off = 0;
    for (uint32_t k = 0; k < wt->nframes; k++) {
        if (sizes[k] > t->nbytes - off) {
            pp_tensor_free(t);
            return pp_error(PP_ERR_PARSE, "tensor '%s': frames overrun the tensor", wt->name);
        }
        memcpy((char *)t->data + off, frames[k], sizes[k]);
        off += sizes[k];
    }
    if (off != t->nbytes) {
        pp_tensor_free(t);
        return pp_error(PP_ERR_PARSE, "tensor '%s': frames underrun the tensor", wt->name);
    }
    *out = t;
    return PP_OK;
}

pp_status pp_envelope_tensor_inline(const pp_envelope *env, int i, pp_tensor **out) {
    if (i < 0 || i >= env->ntensors || env->tensors[i].placement != PP_PLACE_INLINE)
        return pp_error(PP_ERR_INVALID, "tensor %d is not an inline tensor", i);
    uint64_t off = 0;
    for (int j = 0; j < i; j++)
        if (env->tensors[j].placement == PP_PLACE_INLINE) off += env->tensors[j].nbytes;
    const pp_wire_tensor *wt = &env->tensors[i];
    if (off > env->inline_bytes || wt->nbytes > env->inline_bytes - off)
        return pp_error(PP_ERR_PARSE, "tensor '%s': inline data overrun", wt->name);
    pp_tensor *t;
    PP_TRY(pp_tensor_empty(wt->dtype, wt->ndim, wt->shape, &t));
    if (t->nbytes != wt->nbytes) {
        pp_tensor_free(t);
        return pp_error(PP_ERR_INTERNAL, "tensor '%s': size mismatch after validation", wt->name);
    }
    if (t->nbytes) memcpy(t->data, (const char *)env->inline_data + off, t->nbytes);
    *out = t;
    return PP_OK;
}

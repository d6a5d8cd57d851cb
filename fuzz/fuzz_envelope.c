/* libFuzzer target: envelope decoding and validation, frame checks and
 * tensor reassembly, as the transport runs them on every incoming message.
 *
 * Input: 2 bytes (little endian) give the length of frame 0 (the envelope,
 * cut to what is there); the rest is data frames, each a 2-byte length then
 * that many bytes (cut likewise). Build: scripts/run-fuzz, which also sets
 * PIPPIN_FUZZ_SEEDS to a directory where this target writes a few valid
 * messages to start from.
 *
 * Differential: frame 0 is also read by protobuf-c, the reference for the
 * hand-written wire codec (transport/envelope_wire.c). Both must accept or
 * refuse it alike and read the same fields, and writing the result must
 * give protobuf-c's bytes.
 *
 * Batches (kind 6): each entry goes through pp_envelope_decode_entry, as
 * the transport does, and must then satisfy the same invariants and build
 * its inline tensors. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope_wire.h"
#include "pippin.pb-c.h"
#include "envelope.h"
#include "pippin/log.h"

#define MAX_FRAMES 64

static void check(int cond) {
    if (!cond) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Appends one seed message (envelope + frames in the input format). */
static void write_seed(const char *dir, const char *name, const pp_envelope *env, int nframes,
                       const size_t *frame_sizes) {
    uint8_t buf[4096];
    size_t len = 0;
    if (pp_envelope_pack(env, buf + 2, sizeof buf - 2, &len) != PP_OK) return;
    buf[0] = (uint8_t)len;
    buf[1] = (uint8_t)(len >> 8);
    size_t off = len + 2;
    for (int i = 0; i < nframes && off + 2 + frame_sizes[i] <= sizeof buf; i++) {
        buf[off++] = (uint8_t)frame_sizes[i];
        buf[off++] = (uint8_t)(frame_sizes[i] >> 8);
        memset(buf + off, 0x40 + i, frame_sizes[i]);
        off += frame_sizes[i];
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(buf, 1, off, f);
    fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("PIPPIN_FUZZ_SEEDS");
    if (!dir || !dir[0]) return 0;
    pp_wire_tensor wt[2] = {
        {"/blocks.0/Add_output_0", PP_F32, 2, {2, 3}, 24, 2},
        {"mask", PP_BOOL, 1, {5}, 5, 1},
    };
    pp_envelope env = {0};
    env.version = PP_PROTOCOL_VERSION;
    env.kind = PP_MSG_ACTIVATION;
    env.run_id = 1;
    env.step = 2;
    env.microbatch = 3;
    env.src_stage = 0;
    env.dst_stage = 1;
    env.src_rank = 0;
    env.seq = 9;
    env.sender_nonce = 0x8877665544332211ull;
    env.ntensors = 2;
    env.tensors = wt;
    env.text = "";
    size_t sizes[3] = {16, 8, 5};
    write_seed(dir, "seed-activation", &env, 3, sizes);
    env.kind = PP_MSG_GRADIENT;
    env.ntensors = 1;
    wt[0].nframes = 1;
    sizes[0] = 24;
    write_seed(dir, "seed-gradient", &env, 1, sizes);
    /* small tensors inline, a large one in a shared-memory ring */
    float inl[6] = {1, 2, 3, 4, 5, 6};
    wt[0].nframes = 0;
    wt[0].placement = PP_PLACE_INLINE;
    wt[1].nframes = 0;
    wt[1].placement = PP_PLACE_SHM;
    wt[1].shm_pos = 4096;
    env.kind = PP_MSG_ACTIVATION;
    env.ntensors = 2;
    env.inline_data = inl;
    env.inline_bytes = 24;
    env.shm_name = "/pippin-1234-5";
    write_seed(dir, "seed-placements", &env, 0, NULL);
    env.inline_data = NULL;
    env.inline_bytes = 0;
    env.shm_name = "";
    env.kind = PP_MSG_ABORT;
    env.ntensors = 0;
    env.text = "loss is NaN";
    write_seed(dir, "seed-abort", &env, 0, NULL);
    env.kind = PP_MSG_CONTROL;
    env.text = "bye";
    write_seed(dir, "seed-bye", &env, 0, NULL);
    /* a batch: two small activations and a gradient, all inline */
    uint8_t entries[3][512];
    pp_envelope_part parts[3];
    env.text = "";
    env.ntensors = 1;
    wt[0].placement = PP_PLACE_INLINE;
    env.inline_data = inl;
    env.inline_bytes = 24;
    for (int i = 0; i < 3; i++) {
        env.kind = i == 2 ? PP_MSG_GRADIENT : PP_MSG_ACTIVATION;
        env.src_stage = i == 2 ? 1 : 0;
        env.dst_stage = i == 2 ? 0 : 1;
        env.microbatch = i;
        parts[i].data = entries[i];
        if (pp_envelope_pack(&env, entries[i], sizeof entries[i], &parts[i].len) != PP_OK) return 0;
    }
    pp_envelope batch = {0};
    batch.version = PP_PROTOCOL_VERSION;
    batch.kind = (pp_msg_kind)PP_WIRE_KIND_BATCH;
    batch.run_id = 1;
    batch.seq = 12;
    batch.sender_nonce = env.sender_nonce;
    batch.text = "";
    batch.shm_name = "";
    batch.nbatch = 3;
    batch.batch = parts;
    write_seed(dir, "seed-batch", &batch, 0, NULL);
    /* and one whose entries break the batch rules: a tensor in a frame, an abort */
    wt[0].placement = PP_PLACE_FRAMES;
    wt[0].nframes = 1;
    env.inline_data = NULL;
    env.inline_bytes = 0;
    if (pp_envelope_pack(&env, entries[0], sizeof entries[0], &parts[0].len) != PP_OK) return 0;
    env.kind = PP_MSG_ABORT;
    env.ntensors = 0;
    env.text = "stop";
    if (pp_envelope_pack(&env, entries[1], sizeof entries[1], &parts[1].len) != PP_OK) return 0;
    batch.nbatch = 2;
    write_seed(dir, "seed-batch-bad", &batch, 0, NULL);
    return 0;
}

static int same_str(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

static void differential(const uint8_t *data, size_t len) {
    Pippin__Envelope *ours = NULL;
    pp_status s = pp_wire_read(data, len, &ours);
    Pippin__Envelope *ref = pippin__envelope__unpack(NULL, len, data);
    check((s == PP_OK) == (ref != NULL));
    if (!ref) return;
    check(ours->version == ref->version && ours->kind == ref->kind && ours->run_id == ref->run_id &&
          ours->step == ref->step && ours->microbatch == ref->microbatch &&
          ours->src_stage == ref->src_stage && ours->dst_stage == ref->dst_stage &&
          ours->seq == ref->seq && ours->src_rank == ref->src_rank && ours->sender_nonce == ref->sender_nonce &&
          same_str(ours->text, ref->text) && same_str(ours->shm_name, ref->shm_name) &&
          ours->inline_data.len == ref->inline_data.len &&
          (!ref->inline_data.len || memcmp(ours->inline_data.data, ref->inline_data.data, ref->inline_data.len) == 0) &&
          ours->n_tensors == ref->n_tensors && ours->n_batch == ref->n_batch);
    for (size_t i = 0; i < ref->n_batch; i++)
        check(ours->batch[i].len == ref->batch[i].len &&
              (!ref->batch[i].len || memcmp(ours->batch[i].data, ref->batch[i].data, ref->batch[i].len) == 0));
    for (size_t i = 0; i < ref->n_tensors; i++) {
        const Pippin__TensorMeta *a = ours->tensors[i], *b = ref->tensors[i];
        check(same_str(a->name, b->name) && a->dtype == b->dtype && a->n_shape == b->n_shape &&
              a->nbytes == b->nbytes && a->nframes == b->nframes && a->placement == b->placement &&
              a->shm_pos == b->shm_pos);
        for (size_t d = 0; d < b->n_shape; d++) check(a->shape[d] == b->shape[d]);
    }
    /* writing what was read: the same bytes as protobuf-c (which would also
     * write back the unknown fields it kept, so both write ours) */
    size_t n = pp_wire_size(ours);
    check(n == pippin__envelope__get_packed_size(ours));
    uint8_t *x = malloc(n + 1), *y = malloc(n + 1);
    check(x && y);
    check(pp_wire_write(ours, x) == n);
    check(pippin__envelope__pack(ours, y) == n);
    check(memcmp(x, y, n) == 0);
    free(x);
    free(y);
    free(ours);
    pippin__envelope__free_unpacked(ref, NULL);
}

/* A decoded batch: 1..64 non-empty entries and nothing else; each entry
 * that pp_envelope_decode_entry accepts is an activation or gradient whose
 * tensors are inline (or empty) and build from its inline data. */
static void check_batch(const pp_envelope *env, const pp_envelope_limits *lim) {
    check(env->nbatch >= 1 && (unsigned)env->nbatch <= PP_ENVELOPE_MAX_BATCH);
    check(env->ntensors == 0 && env->inline_bytes == 0 && env->text[0] == 0 && env->shm_name[0] == 0);
    check(env->step == 0 && env->microbatch == 0 && env->src_stage == 0 && env->dst_stage == 0);
    for (int b = 0; b < env->nbatch; b++) {
        check(env->batch[b].len > 0);
        pp_envelope e;
        if (pp_envelope_decode_entry(env->batch[b].data, env->batch[b].len, lim, &e) != PP_OK) continue;
        check(e.kind == PP_MSG_ACTIVATION || e.kind == PP_MSG_GRADIENT);
        check(e.nbatch == 0 && e.ntensors >= 1 && e.shm_name[0] == 0);
        check(pp_envelope_check_frames(&e, 0, NULL) == PP_OK); /* needs no data frame */
        uint64_t inl = 0;
        for (int i = 0; i < e.ntensors; i++) {
            const pp_wire_tensor *wt = &e.tensors[i];
            check(wt->placement == PP_PLACE_INLINE || wt->nbytes == 0);
            if (wt->placement != PP_PLACE_INLINE) continue;
            pp_tensor *t = NULL;
            check(pp_envelope_tensor_inline(&e, i, &t) == PP_OK && t->nbytes == wt->nbytes);
            pp_tensor_free(t);
            inl += wt->nbytes;
        }
        check(inl == e.inline_bytes);
        pp_envelope_clear(&e);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet;
    if (!quiet) {
        pp_log_set_level(PP_LOG_OFF);
        quiet = 1;
    }
    if (size < 2) return 0;
    size_t env_len = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2;
    size -= 2;
    if (env_len > size) env_len = size;
    const uint8_t *env_data = data;
    data += env_len;
    size -= env_len;

    const void *frames[MAX_FRAMES];
    size_t sizes[MAX_FRAMES];
    size_t nframes = 0;
    while (size >= 2 && nframes < MAX_FRAMES) {
        size_t n = (size_t)data[0] | (size_t)data[1] << 8;
        data += 2;
        size -= 2;
        if (n > size) n = size;
        frames[nframes] = data;
        sizes[nframes++] = n;
        data += n;
        size -= n;
    }

    differential(env_data, env_len);

    pp_envelope_limits lim = {1u << 20, 16, MAX_FRAMES, 8, 8};
    pp_envelope env;
    if (pp_envelope_decode(env_data, env_len, &lim, &env) != PP_OK) return 0;

    /* a decoded envelope satisfies every documented invariant */
    check(env.version == PP_PROTOCOL_VERSION);
    if ((int)env.kind == PP_WIRE_KIND_BATCH) {
        check_batch(&env, &lim);
        pp_envelope_clear(&env);
        return 0;
    }
    check(env.kind >= PP_MSG_ACTIVATION && env.kind <= PP_MSG_ABORT);
    check(env.nbatch == 0);
    check(env.step >= 0 && env.microbatch >= 0);
    check(env.src_stage >= 0 && env.src_stage < 8 && env.dst_stage >= 0 && env.dst_stage < 8);
    check(env.ntensors >= 0 && env.ntensors <= 16);
    check(strlen(env.text) <= PP_ENVELOPE_MAX_TEXT);
    uint64_t total = 0;
    for (int i = 0; i < env.ntensors; i++) {
        const pp_wire_tensor *wt = &env.tensors[i];
        check(wt->ndim >= 0 && wt->ndim <= PP_MAX_DIMS);
        check(pp_dtype_size(wt->dtype) > 0);
        size_t nb = 0;
        check(pp_shape_bytes(wt->dtype, wt->ndim, wt->shape, &nb) == PP_OK);
        check(nb == wt->nbytes);
        total += wt->nbytes;
    }
    check(total <= lim.max_message_bytes);

    /* packing it again gives an envelope that decodes to the same thing */
    uint8_t buf[PP_ENVELOPE_MAX_BYTES];
    size_t len = 0;
    if (pp_envelope_pack(&env, buf, sizeof buf, &len) == PP_OK) {
        pp_envelope again;
        check(pp_envelope_decode(buf, len, &lim, &again) == PP_OK);
        check(again.kind == env.kind && again.step == env.step && again.seq == env.seq &&
              again.sender_nonce == env.sender_nonce &&
              again.ntensors == env.ntensors && strcmp(again.text, env.text) == 0);
        for (int i = 0; i < env.ntensors; i++)
            check(strcmp(again.tensors[i].name, env.tensors[i].name) == 0 &&
                  again.tensors[i].nbytes == env.tensors[i].nbytes);
        pp_envelope_clear(&again);
    }

    if (pp_envelope_check_frames(&env, nframes, sizes) == PP_OK) {
        size_t f = 0;
        for (int i = 0; i < env.ntensors; i++) {
            const pp_wire_tensor *wt = &env.tensors[i];
            pp_tensor *t = NULL;
            if (wt->placement == PP_PLACE_INLINE) {
                check(pp_envelope_tensor_inline(&env, i, &t) == PP_OK && t->nbytes == wt->nbytes);
                pp_tensor_free(t);
                continue;
            }
            if (wt->placement == PP_PLACE_SHM) continue;  /* the transport's ring checks */
            if (wt->placement == PP_PLACE_BULK) continue; /* read from the bulk lane (fuzz_bulk_lane) */
            check(pp_envelope_tensor_copy(wt, frames + f, sizes + f, &t) == PP_OK);
            check(t->nbytes == wt->nbytes);
            size_t off = 0;
            for (uint32_t k = 0; k < wt->nframes; k++) {
                check(memcmp((char *)t->data + off, frames[f + k], sizes[f + k]) == 0);
                off += sizes[f + k];
            }
            pp_tensor_free(t);
            f += wt->nframes;
        }
        check(f == nframes);
    }
    pp_envelope_clear(&env);
    return 0;
}

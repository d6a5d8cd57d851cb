/* Envelope packing, decoding and validation of every field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope_wire.h"
#include "pippin.pb-c.h"
#include "tt_craft.h"
#include "tt_util.h"

#include "test_filter.h"
#include "envelope.h"
typedef tt_crafted crafted;

static void craft(crafted *c) { tt_craft(c, 7, 3, 2); }

static pp_status decode_crafted(crafted *c, const pp_envelope_limits *lim, pp_envelope *out) {
    size_t n = pippin__envelope__get_packed_size(&c->env);
    uint8_t *buf = malloc(n + 1);
    pippin__envelope__pack(&c->env, buf);
    pp_status s = pp_envelope_decode(buf, n, lim, out);
    free(buf);
    return s;
}

static void expect_bad(crafted *c, const pp_envelope_limits *lim, const char *mention) {
    pp_envelope e;
    TT_FAILS(PP_ERR_PARSE, decode_crafted(c, lim, &e), mention);
}

typedef struct buf_alloc {
    uint8_t *buf;
    size_t cap, *asked;
} buf_alloc;

static void *give_buffer(void *ctx, size_t n) {
    buf_alloc *b = ctx;
    *b->asked = n;
    return n <= b->cap ? b->buf : NULL;
}

static void test_roundtrip(void **state) {
    (void)state;
    pp_wire_tensor wt[2] = {
        {"a", PP_F32, 2, {4, 5}, 80, 1},
        {"/blocks.0/Add_output_0", PP_I64, 0, {0}, 8, 1},
    };
    pp_envelope env = {0};
    env.version = PP_PROTOCOL_VERSION;
    env.kind = PP_MSG_GRADIENT;
    env.run_id = 99;
    env.step = 12;
    env.microbatch = 3;
    env.src_stage = 2;
    env.dst_stage = 1;
    env.src_rank = 2;
    env.seq = 1234567;
    env.sender_nonce = 0xfedcba9876543210ull; /* past 2^63: a 10-byte varint */
    env.ntensors = 2;
    env.tensors = wt;
    env.text = "";
    uint8_t buf[512];
    size_t len = 0;
    assert_int_equal(pp_envelope_packed_size(&env) > 0, 1);
    TT_OK(pp_envelope_pack(&env, buf, sizeof buf, &len));
    assert_int_equal(len, pp_envelope_packed_size(&env));
    pp_envelope d;
    pp_envelope_limits lim = {0, 0, 0, 3, 3};
    TT_OK(pp_envelope_decode(buf, len, &lim, &d));
    assert_int_equal(d.kind, PP_MSG_GRADIENT);
    assert_int_equal(d.run_id, 99);
    assert_int_equal(d.step, 12);
    assert_int_equal(d.microbatch, 3);
    assert_int_equal(d.src_stage, 2);
    assert_int_equal(d.dst_stage, 1);
    assert_int_equal(d.src_rank, 2);
    assert_int_equal(d.seq, 1234567);
    assert_true(d.sender_nonce == 0xfedcba9876543210ull);
    assert_int_equal(d.ntensors, 2);
    assert_string_equal(d.tensors[0].name, "a");
    assert_int_equal(d.tensors[0].ndim, 2);
    assert_int_equal(d.tensors[0].shape[1], 5);
    assert_int_equal(d.tensors[0].nbytes, 80);
    assert_string_equal(d.tensors[1].name, "/blocks.0/Add_output_0");
    assert_int_equal(d.tensors[1].dtype, PP_I64);
    assert_int_equal(d.tensors[1].ndim, 0);
    size_t sizes[2] = {80, 8};
    TT_OK(pp_envelope_check_frames(&d, 2, sizes));
    pp_envelope_clear(&d);
    pp_envelope_clear(&d); /* twice is harmless */
    /* too small a buffer */
    TT_FAILS(PP_ERR_INVALID, pp_envelope_pack(&env, buf, 3, &len), "buffer");
    /* packing into memory an allocator gives: the same bytes; none: an error */
    uint8_t other[512];
    size_t len2 = 0, asked = 0;
    buf_alloc ba = {other, sizeof other, &asked};
    TT_OK(pp_envelope_pack_into(&env, give_buffer, &ba, &len2));
    assert_int_equal(asked, len);
    assert_int_equal(len2, len);
    assert_memory_equal(other, buf, len);
    ba.cap = 4;
    TT_FAILS(PP_ERR_NOMEM, pp_envelope_pack_into(&env, give_buffer, &ba, &len2), "no room");
}

/* Inline and shared-memory placements survive a round trip; only framed
 * tensors count in check_frames. */
static void test_placements(void **state) {
    (void)state;
    float a[3] = {1, 2, 3};
    int64_t b[2] = {-7, 9};
    pp_wire_tensor wt[4] = {
        {"a", PP_F32, 1, {3}, 12, 0, PP_PLACE_INLINE, 0},
        {"big", PP_F32, 1, {1 << 18}, 1 << 20, 0, PP_PLACE_SHM, (uint64_t)5 << 30},
        {"b", PP_I64, 1, {2}, 16, 0, PP_PLACE_INLINE, 0},
        {"framed", PP_U8, 1, {100}, 100, 2, PP_PLACE_FRAMES, 0},
    };
    uint8_t inl_all[28]; /* a then b */
    memcpy(inl_all, a, 12);
    memcpy(inl_all + 12, b, 16);
    pp_envelope env = {0};
    env.version = PP_PROTOCOL_VERSION;
    env.kind = PP_MSG_ACTIVATION;
    env.ntensors = 4;
    env.tensors = wt;
    env.text = "";
    env.inline_data = inl_all;
    env.inline_bytes = 28;
    env.shm_name = "/pippin-123-4";
    uint8_t buf[512];
    size_t len;
    TT_OK(pp_envelope_pack(&env, buf, sizeof buf, &len));
    pp_envelope d;
    TT_OK(pp_envelope_decode(buf, len, NULL, &d));
    assert_string_equal(d.shm_name, "/pippin-123-4");
    assert_int_equal(d.inline_bytes, 28);
    assert_int_equal(d.tensors[0].placement, PP_PLACE_INLINE);
    assert_int_equal(d.tensors[1].placement, PP_PLACE_SHM);
    assert_int_equal(d.tensors[1].shm_pos, (uint64_t)5 << 30);
    assert_int_equal(d.tensors[3].placement, PP_PLACE_FRAMES);
    size_t sizes[2] = {60, 40};
    TT_OK(pp_envelope_check_frames(&d, 2, sizes));
    pp_tensor *x;
    TT_OK(pp_envelope_tensor_inline(&d, 2, &x));
    assert_int_equal(x->dtype, PP_I64);
    assert_memory_equal(x->data, b, 16);
    pp_tensor_free(x);
    TT_OK(pp_envelope_tensor_inline(&d, 0, &x));
    assert_memory_equal(x->data, a, 12);
    pp_tensor_free(x);
    TT_FAILS(PP_ERR_INVALID, pp_envelope_tensor_inline(&d, 1, &x), "not an inline tensor");
    pp_envelope_clear(&d);
}

static void test_bad_placements(void **state) {
    (void)state;
    crafted c;
    uint8_t bytes[32] = {0};
    craft(&c); c.meta[0].placement = 7; expect_bad(&c, NULL, "unknown placement 7");
    /* inline: sizes must match, no frames */
    craft(&c); c.meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_INLINE; c.meta[0].nframes = 0;
    expect_bad(&c, NULL, "0 bytes of inline data, inline tensors hold 24");
    c.env.inline_data.data = bytes; c.env.inline_data.len = 23;
    expect_bad(&c, NULL, "23 bytes of inline data");
    c.env.inline_data.len = 24;
    pp_envelope e;
    TT_OK(decode_crafted(&c, NULL, &e));
    pp_envelope_clear(&e);
    c.meta[0].nframes = 1; expect_bad(&c, NULL, "an inline tensor of 24 bytes claims 1 frames");
    /* inline data without inline tensors */
    craft(&c); c.env.inline_data.data = bytes; c.env.inline_data.len = 4;
    expect_bad(&c, NULL, "4 bytes of inline data");
    /* shared memory: a well-formed ring name, no frames, no overflow */
    craft(&c); c.meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_SHM; c.meta[0].nframes = 0;
    expect_bad(&c, NULL, "ring name");
    const char *bad_names[] = {"/etc/passwd", "/pippin-", "/pippin-../../x", "pippin-1", "/pippin-a b",
                               "/pippin-1/2"};
    for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++) {
        c.env.shm_name = (char *)bad_names[i];
        expect_bad(&c, NULL, "ring name");
    }
    char longname[200];
    snprintf(longname, sizeof longname, "/pippin-%0150d", 1);
    c.env.shm_name = longname;
    expect_bad(&c, NULL, "ring name");
    c.env.shm_name = "/pippin-77-1";
    c.meta[0].shm_pos = UINT64_MAX - 10;
    expect_bad(&c, NULL, "ring position overflows");
    c.meta[0].shm_pos = 4096;
    TT_OK(decode_crafted(&c, NULL, &e));
    assert_int_equal(e.tensors[0].shm_pos, 4096);
    size_t none[1] = {0};
    TT_OK(pp_envelope_check_frames(&e, 0, none)); /* no data frames expected */
    pp_envelope_clear(&e);
    c.meta[0].nframes = 1; expect_bad(&c, NULL, "a shared-memory tensor of 24 bytes claims 1 frames");
    /* a ring position or name without a shared-memory tensor */
    craft(&c); c.meta[0].shm_pos = 8; expect_bad(&c, NULL, "ring position without");
    craft(&c); c.env.shm_name = "/pippin-77-1"; expect_bad(&c, NULL, "ring name without");
    /* empty tensors are framed (zero frames), never inline or shared */
    craft(&c); c.shape[0][0] = 0; c.meta[0].nbytes = 0; c.meta[0].nframes = 0;
    c.meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_INLINE;
    expect_bad(&c, NULL, "inline tensor of 0 bytes");
}

/* The hand-written wire codec writes protobuf-c's bytes and reads what
 * protobuf-c reads (fuzz/fuzz_envelope.c checks this on every input). */
static void test_wire_agrees_with_protobuf_c(void **state) {
    (void)state;
    crafted c;
    for (int variant = 0; variant < 6; variant++) {
        craft(&c);
        if (variant == 1) { c.env.n_tensors = 4; c.env.text = "hello"; }
        if (variant == 2) { c.env.microbatch = -1; c.env.src_stage = -7; c.shape[0][0] = -1; } /* 10-byte varints */
        if (variant == 3) { c.env.n_tensors = 0; c.env.kind = PIPPIN__KIND__KIND_ABORT; c.env.text = "why"; }
        if (variant == 4) {
            static uint8_t bytes[3] = {1, 2, 3};
            c.meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_SHM; c.meta[0].shm_pos = UINT64_MAX;
            c.env.shm_name = "/pippin-9-9"; c.env.inline_data.data = bytes; c.env.inline_data.len = 3;
        }
        if (variant == 5) { c.meta[0].n_shape = 0; c.meta[0].name = ""; c.env.run_id = UINT64_MAX; }
        size_t n = pippin__envelope__get_packed_size(&c.env);
        assert_int_equal(pp_wire_size(&c.env), n);
        uint8_t want[1024], got[1024];
        assert_true(n <= sizeof want);
        pippin__envelope__pack(&c.env, want);
        assert_int_equal(pp_wire_write(&c.env, got), n);
        assert_memory_equal(got, want, n);
        /* and read back the same */
        Pippin__Envelope *e;
        TT_OK(pp_wire_read(want, n, &e));
        assert_int_equal(e->n_tensors, c.env.n_tensors);
        assert_int_equal(e->microbatch, c.env.microbatch);
        assert_int_equal(e->run_id, c.env.run_id);
        assert_string_equal(e->text, c.env.text);
        if (e->n_tensors) assert_int_equal(e->tensors[0]->n_shape, c.meta[0].n_shape);
        free(e);
    }
    /* odd but legal wire forms, and broken ones: both readers agree */
    static const char *cases[] = {
        "08011d01020304",   /* known field, wrong wire type */
        "080123",           /* group */
        "0801fa0100",       /* unknown field 31, empty bytes */
        "0801a30100",       /* unknown group */
        "52021d00",         /* wrong wire type inside a tensor */
        "0801380107",       /* a tag byte without field bits */
        "520318ff01",       /* shape not packed */
        "0801780a",         /* unknown varint field 15 */
        "0801f8ffffff0f05", /* 5-byte tag */
        "08018000",         /* non-canonical tag 0: skipped as unknown */
        "0801",             /* just a version */
        "08",               /* truncated varint */
        "0a05",             /* length past the end */
        "08ffffffffffffffffff01", /* 10-byte varint */
        "08ffffffffffffffffffff01", /* 11 bytes */
        "5a808080808000",   /* text length in 6 bytes: protobuf-c reads at most 5 */
        "0801fa01808080808000", /* the same in an unknown field */
        "52071a808080808000", /* and in a tensor's packed shape */
        "5a8080808000",     /* a 5-byte length of 0 is fine */
        "08017a00",         /* an empty batch entry */
        "08017a0208017a03010203", /* two batch entries */
        "7a05080110",       /* batch entry length past the end */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint8_t buf[64];
        size_t n = strlen(cases[i]) / 2;
        for (size_t k = 0; k < n; k++) sscanf(cases[i] + 2 * k, "%2hhx", &buf[k]);
        Pippin__Envelope *ours = NULL, *ref = pippin__envelope__unpack(NULL, n, buf);
        pp_status st = pp_wire_read(buf, n, &ours);
        if ((st == PP_OK) != (ref != NULL))
            fail_msg("case %s: ours %s, protobuf-c %s", cases[i], st == PP_OK ? "accepts" : "refuses",
                     ref ? "accepts" : "refuses");
        if (ref) assert_int_equal(ours->version, ref->version);
        free(ours);
        if (ref) pippin__envelope__free_unpacked(ref, NULL);
    }
}

/* Packs c into a fresh buffer (*len bytes). */
static uint8_t *pack_crafted(crafted *c, size_t *len) {
    *len = pippin__envelope__get_packed_size(&c->env);
    uint8_t *buf = malloc(*len + 1);
    pippin__envelope__pack(&c->env, buf);
    return buf;
}

/* The frame decode_batch decoded last: a decoded batch points into it. */
static uint8_t *batch_frame;

/* A batch of the given entries from rank 0 (run 7), packed by protobuf-c;
 * the frame stays in batch_frame until the next call. */
static pp_status decode_batch(int n, uint8_t **entries, const size_t *lens, pp_envelope *out) {
    Pippin__Envelope b = PIPPIN__ENVELOPE__INIT;
    b.version = PP_PROTOCOL_VERSION;
    b.kind = (Pippin__Kind)PP_WIRE_KIND_BATCH;
    b.run_id = 7;
    b.sender_nonce = TT_RAW_NONCE;
    ProtobufCBinaryData parts[80];
    for (int i = 0; i < n; i++) {
        parts[i].data = entries[i];
        parts[i].len = lens[i];
    }
    b.n_batch = (size_t)n;
    b.batch = parts;
    size_t len = pippin__envelope__get_packed_size(&b);
    uint8_t *buf = malloc(len + 1);
    pippin__envelope__pack(&b, buf);
    /* our writer gives protobuf-c's bytes */
    assert_int_equal(pp_wire_size(&b), len);
    uint8_t *ours = malloc(len + 1);
    assert_int_equal(pp_wire_write(&b, ours), len);
    assert_memory_equal(ours, buf, len);
    free(ours);
    pp_status s = pp_envelope_decode(buf, len, NULL, out);
    free(batch_frame);
    batch_frame = buf;
    return s;
}

/* A batch holds packed envelopes, each checked on its own by
 * pp_envelope_decode_entry: only activations and gradients whose tensors
 * are inline; the container carries nothing else and never nests. */
static void test_batch(void **state) {
    (void)state;
    static float vals[6] = {1, 2, 3, 4, 5, 6};
    crafted c;
    uint8_t *entry[8];
    size_t len[8];
    /* 0: a good inline activation; 1: a good inline gradient */
    craft(&c); c.meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_INLINE; c.meta[0].nframes = 0;
    c.env.inline_data.data = (uint8_t *)vals; c.env.inline_data.len = 24;
    entry[0] = pack_crafted(&c, &len[0]);
    c.env.kind = PIPPIN__KIND__KIND_GRADIENT; c.env.src_stage = 1; c.env.dst_stage = 0;
    entry[1] = pack_crafted(&c, &len[1]);
    /* 2: a tensor in a data frame; 3: an abort; 4: a batch inside the batch;
     * 5: a control message with an inline tensor; 6: not a protobuf */
    craft(&c); entry[2] = pack_crafted(&c, &len[2]);
    craft(&c); c.env.kind = PIPPIN__KIND__KIND_ABORT; c.env.n_tensors = 0; c.env.text = "stop";
    entry[3] = pack_crafted(&c, &len[3]);
    pp_envelope e;
    TT_OK(decode_batch(2, entry, len, &e));
    assert_int_equal(e.kind, PP_WIRE_KIND_BATCH);
    assert_int_equal(e.nbatch, 2);
    assert_int_equal(e.ntensors, 0);
    {
        Pippin__Envelope b = PIPPIN__ENVELOPE__INIT;
        b.version = PP_PROTOCOL_VERSION;
        b.kind = (Pippin__Kind)PP_WIRE_KIND_BATCH;
        ProtobufCBinaryData part = {len[0], entry[0]};
        b.n_batch = 1;
        b.batch = &part;
        len[4] = pippin__envelope__get_packed_size(&b);
        entry[4] = malloc(len[4]);
        pippin__envelope__pack(&b, entry[4]);
    }
    craft(&c); c.env.kind = PIPPIN__KIND__KIND_CONTROL; c.meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_INLINE;
    c.meta[0].nframes = 0; c.env.inline_data.data = (uint8_t *)vals; c.env.inline_data.len = 24;
    entry[5] = pack_crafted(&c, &len[5]);
    entry[6] = malloc(4);
    memcpy(entry[6], "\xff\xff\xff\xff", 4);
    len[6] = 4;
    const char *why[8] = {NULL, NULL, "not inline", "abort message in a batch", "batch message in a batch",
                          "control message in a batch", "not a valid protobuf"};
    for (int i = 0; i < 7; i++) {
        pp_envelope x;
        if (!why[i]) {
            TT_OK(pp_envelope_decode_entry(e.batch[i].data, e.batch[i].len, NULL, &x));
            pp_tensor *t;
            TT_OK(pp_envelope_tensor_inline(&x, 0, &t));
            assert_memory_equal(t->data, vals, 24);
            pp_tensor_free(t);
            pp_envelope_clear(&x);
            if (i == 1) pp_envelope_clear(&e);
            continue;
        }
        TT_FAILS(PP_ERR_PARSE, pp_envelope_decode_entry(entry[i], len[i], NULL, &x), why[i]);
    }
    /* the container itself */
    TT_FAILS(PP_ERR_PARSE, decode_batch(0, entry, len, &e), "batch of 0 entries");
    uint8_t *many[80];
    size_t many_len[80];
    for (int i = 0; i < 80; i++) {
        many[i] = entry[0];
        many_len[i] = len[0];
    }
    TT_OK(decode_batch((int)PP_ENVELOPE_MAX_BATCH, many, many_len, &e));
    pp_envelope_clear(&e);
    TT_FAILS(PP_ERR_PARSE, decode_batch((int)PP_ENVELOPE_MAX_BATCH + 1, many, many_len, &e), "batch of 65");
    size_t zero = 0;
    TT_FAILS(PP_ERR_PARSE, decode_batch(1, entry, &zero, &e), "entry 0 is empty");
    /* a batch with anything of its own, or a message with entries */
    craft(&c); c.env.kind = (Pippin__Kind)PP_WIRE_KIND_BATCH; c.env.n_tensors = 0;
    ProtobufCBinaryData part = {len[0], entry[0]};
    c.env.n_batch = 1; c.env.batch = &part;
    expect_bad(&c, NULL, "nothing but its entries"); /* step 3, microbatch 2 */
    c.env.step = 0; c.env.microbatch = 0; c.env.dst_stage = 0;
    TT_OK(decode_crafted(&c, NULL, &e));
    pp_envelope_clear(&e);
    c.env.text = "hi"; expect_bad(&c, NULL, "nothing but its entries");
    craft(&c); c.env.n_batch = 1; c.env.batch = &part; expect_bad(&c, NULL, "activation message with 1 batch");
    /* packing from pp_envelope gives the same entries back */
    pp_envelope_part parts[2] = {{entry[0], len[0]}, {entry[1], len[1]}};
    pp_envelope out = {0};
    out.version = PP_PROTOCOL_VERSION;
    out.kind = (pp_msg_kind)PP_WIRE_KIND_BATCH;
    out.text = "";
    out.shm_name = "";
    out.nbatch = 2;
    out.batch = parts;
    uint8_t buf[1024];
    size_t n;
    TT_OK(pp_envelope_pack(&out, buf, sizeof buf, &n));
    TT_OK(pp_envelope_decode(buf, n, NULL, &e));
    assert_int_equal(e.nbatch, 2);
    assert_int_equal(e.batch[1].len, len[1]);
    assert_memory_equal(e.batch[1].data, entry[1], len[1]);
    pp_envelope_clear(&e);
    for (int i = 0; i < 7; i++) free(entry[i]);
    free(batch_frame);
    batch_frame = NULL;
}

static void test_valid_crafted(void **state) {
    (void)state;
    crafted c;
    craft(&c);
    pp_envelope e;
    TT_OK(decode_crafted(&c, NULL, &e));
    assert_int_equal(e.tensors[0].nbytes, 24);
    pp_envelope_clear(&e);
}

static void test_bad_header(void **state) {
    (void)state;
    crafted c;
    pp_envelope_limits lim = {0, 0, 0, 2, 2};
    craft(&c); c.env.version = 4; expect_bad(&c, NULL, "version 4");
    craft(&c); c.env.version = 2; expect_bad(&c, NULL, "version 2");
    craft(&c); c.env.version = 0; expect_bad(&c, NULL, "version 0");
    craft(&c); c.env.kind = 0; expect_bad(&c, NULL, "kind 0");
    craft(&c); c.env.kind = 7; expect_bad(&c, NULL, "kind 7");
    craft(&c); c.env.kind = 6; expect_bad(&c, NULL, "batch of 0 entries"); /* a batch with a tensor */
    craft(&c); c.env.kind = -3; expect_bad(&c, NULL, "kind -3");
    craft(&c); c.env.step = -1; expect_bad(&c, NULL, "negative step");
    craft(&c); c.env.microbatch = -1; expect_bad(&c, NULL, "negative microbatch");
    craft(&c); c.env.src_stage = 2; expect_bad(&c, &lim, "source stage 2");
    craft(&c); c.env.dst_stage = -1; expect_bad(&c, NULL, "destination stage -1");
    craft(&c); c.env.dst_stage = 5; expect_bad(&c, &lim, "destination stage 5");
    craft(&c); c.env.src_rank = 9; expect_bad(&c, &lim, "source rank 9");
    craft(&c); c.env.src_rank = -1; expect_bad(&c, NULL, "source rank -1");
    craft(&c); c.env.text = "bad\x01text"; expect_bad(&c, NULL, "text");
    char longtext[PP_ENVELOPE_MAX_TEXT + 2];
    memset(longtext, 'a', sizeof longtext - 1);
    longtext[sizeof longtext - 1] = 0;
    craft(&c); c.env.text = longtext; expect_bad(&c, NULL, "text");
    craft(&c); c.env.n_tensors = 0; expect_bad(&c, NULL, "without tensors");
    craft(&c); c.env.kind = PIPPIN__KIND__KIND_ABORT; expect_bad(&c, NULL, "abort message with 1 tensors");
    craft(&c); c.env.kind = PIPPIN__KIND__KIND_HEARTBEAT; expect_bad(&c, NULL, "heartbeat");
    /* control messages may carry tensors or none */
    pp_envelope e;
    craft(&c); c.env.kind = PIPPIN__KIND__KIND_CONTROL; c.env.n_tensors = 0;
    TT_OK(decode_crafted(&c, NULL, &e));
    pp_envelope_clear(&e);
}

static void test_bad_tensors(void **state) {
    (void)state;
    crafted c;
    craft(&c); c.meta[0].dtype = 99; expect_bad(&c, NULL, "unknown dtype code 99");
    craft(&c); c.meta[0].dtype = 0; expect_bad(&c, NULL, "unknown dtype code 0");
    craft(&c); c.meta[0].dtype = 8; expect_bad(&c, NULL, "unknown dtype code 8"); /* string */
    craft(&c); c.meta[0].n_shape = 9; expect_bad(&c, NULL, "9 dims");
    craft(&c); c.shape[0][1] = -3; expect_bad(&c, NULL, "negative");
    craft(&c); c.meta[0].nbytes = 25; expect_bad(&c, NULL, "envelope says 25");
    craft(&c); c.meta[0].nbytes = 0; expect_bad(&c, NULL, "envelope says 0");
    /* huge dims: the product overflows 64 bits */
    craft(&c); c.meta[0].n_shape = 3; c.shape[0][0] = INT64_MAX; c.shape[0][1] = INT64_MAX;
    c.shape[0][2] = 4; expect_bad(&c, NULL, "overflows");
    /* a zero dim makes the tensor empty even with huge others */
    craft(&c); c.meta[0].n_shape = 3; c.shape[0][0] = INT64_MAX; c.shape[0][1] = 0;
    c.shape[0][2] = INT64_MAX; c.meta[0].nbytes = 0; c.meta[0].nframes = 0;
    pp_envelope e;
    TT_OK(decode_crafted(&c, NULL, &e));
    assert_int_equal(e.tensors[0].nbytes, 0);
    pp_envelope_clear(&e);
    /* large but representable: over the size limit */
    craft(&c); c.meta[0].n_shape = 2; c.shape[0][0] = 1 << 20; c.shape[0][1] = 1 << 20;
    c.meta[0].nbytes = (uint64_t)4 << 40; c.meta[0].nframes = 4;
    expect_bad(&c, NULL, "limit");
    pp_envelope_limits small = {50, 0, 0, 0, 0};
    craft(&c); c.shape[0][0] = 5; c.meta[0].nbytes = 60; expect_bad(&c, &small, "limit of 50");
    craft(&c); c.meta[0].nframes = 0; expect_bad(&c, NULL, "24 bytes in 0 frames");
    craft(&c); c.meta[0].nframes = 25; expect_bad(&c, NULL, "25 frames for 24 bytes");
    craft(&c); c.meta[0].name = ""; expect_bad(&c, NULL, "name");
    craft(&c); c.meta[0].name = "a\nb"; expect_bad(&c, NULL, "name");
    char longname[300];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    craft(&c); c.meta[0].name = longname; expect_bad(&c, NULL, "name");
    /* duplicate names */
    craft(&c); c.env.n_tensors = 2; c.meta[1] = c.meta[0]; c.meta[1].shape = c.shape[1];
    memcpy(c.shape[1], c.shape[0], sizeof c.shape[0]);
    expect_bad(&c, NULL, "twice");
    /* too many tensors */
    pp_envelope_limits few = {0, 1, 0, 0, 0};
    craft(&c); c.env.n_tensors = 2; c.meta[1] = c.meta[0]; c.meta[1].name = "y";
    expect_bad(&c, &few, "2 tensors");
    /* too many frames */
    pp_envelope_limits frames = {0, 0, 10, 0, 0};
    craft(&c); c.meta[0].nframes = 11; c.shape[0][0] = 100; c.meta[0].nbytes = 1200;
    expect_bad(&c, &frames, "data frames");
}

static void test_garbage(void **state) {
    (void)state;
    pp_envelope e;
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
    TT_FAILS(PP_ERR_PARSE, pp_envelope_decode(junk, sizeof junk, NULL, &e), "protobuf");
    TT_FAILS(PP_ERR_PARSE, pp_envelope_decode(junk, 0, NULL, &e), "empty");
    uint8_t *big = calloc(1, PP_ENVELOPE_MAX_BYTES + 1);
    TT_FAILS(PP_ERR_PARSE, pp_envelope_decode(big, PP_ENVELOPE_MAX_BYTES + 1, NULL, &e), "bytes");
    free(big);
    /* every truncation of a valid envelope is rejected or still valid, never a crash */
    crafted c;
    craft(&c);
    uint8_t buf[256];
    size_t n = pippin__envelope__pack(&c.env, buf);
    int rejected = 0;
    for (size_t k = 1; k < n; k++) {
        if (pp_envelope_decode(buf, k, NULL, &e) == PP_OK) pp_envelope_clear(&e);
        else rejected++;
    }
    assert_true(rejected > 0);
    /* every single-byte corruption likewise */
    for (size_t k = 0; k < n; k++)
        for (int bit = 0; bit < 8; bit++) {
            buf[k] ^= (uint8_t)(1 << bit);
            if (pp_envelope_decode(buf, n, NULL, &e) == PP_OK) pp_envelope_clear(&e);
            buf[k] ^= (uint8_t)(1 << bit);
        }
}

static void test_check_frames(void **state) {
    (void)state;
    pp_wire_tensor wt[3] = {
        {"a", PP_F32, 1, {10}, 40, 2},
        {"b", PP_U8, 1, {0}, 0, 0},
        {"c", PP_U8, 1, {5}, 5, 1},
    };
    pp_envelope env = {0};
    env.ntensors = 3;
    env.tensors = wt;
    size_t ok[3] = {16, 24, 5};
    TT_OK(pp_envelope_check_frames(&env, 3, ok));
    TT_FAILS(PP_ERR_PARSE, pp_envelope_check_frames(&env, 2, ok), "data frames");
    size_t extra[4] = {16, 24, 5, 1};
    TT_FAILS(PP_ERR_PARSE, pp_envelope_check_frames(&env, 4, extra), "4 data frames");
    size_t wrong[3] = {16, 20, 9};
    TT_FAILS(PP_ERR_PARSE, pp_envelope_check_frames(&env, 3, wrong), "'a'", "36 bytes");
    size_t over[3] = {30, 24, 5};
    TT_FAILS(PP_ERR_PARSE, pp_envelope_check_frames(&env, 3, over), "at least");
    size_t empty[3] = {0, 40, 5};
    TT_FAILS(PP_ERR_PARSE, pp_envelope_check_frames(&env, 3, empty), "empty");
    /* copying the frames into a tensor */
    float vals[10];
    for (int i = 0; i < 10; i++) vals[i] = (float)i;
    const void *frames[2] = {vals, (const char *)vals + 16};
    pp_tensor *t;
    TT_OK(pp_envelope_tensor_copy(&wt[0], frames, ok, &t));
    assert_int_equal(t->nbytes, 40);
    assert_memory_equal(t->data, vals, 40);
    pp_tensor_free(t);
    TT_FAILS(PP_ERR_PARSE, pp_envelope_tensor_copy(&wt[0], frames, over, &t), "overrun");
}

static void test_kind_names(void **state) {
    (void)state;
    assert_string_equal(pp_msg_kind_name(PP_MSG_ACTIVATION), "activation");
    assert_string_equal(pp_msg_kind_name(PP_MSG_ABORT), "abort");
    assert_string_equal(pp_msg_kind_name(42), "unknown");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),   cmocka_unit_test(test_valid_crafted),
        cmocka_unit_test(test_bad_header),  cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_garbage),     cmocka_unit_test(test_check_frames),
        cmocka_unit_test(test_kind_names),  cmocka_unit_test(test_placements),
        cmocka_unit_test(test_bad_placements), cmocka_unit_test(test_wire_agrees_with_protobuf_c),
        cmocka_unit_test(test_batch),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Crafted bad messages from a raw ZeroMQ PUSH socket that completed the
 * hello handshake as rank 0 (a verified peer gone bad): each is dropped,
 * logged and counted, and the links keep working. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "pippin.pb-c.h"
#include "shm_ring.h"
#include "tt_craft.h"
#include "tt_util.h"

#include "test_filter.h"
#include "envelope.h"
typedef struct fixture {
    /* t[1] receives; t[2] sends good messages; rank 0 is the stranger: a
     * raw PULL socket bound at rank 0's endpoint (rank 1's hellos to rank 0
     * come there) and a raw PUSH socket connected to rank 1, which answers
     * rank 1's hello. So its connection is the one rank 1 pins for rank 0,
     * and what it sends meets every check after that (a verified peer gone
     * bad). */
    pp_transport *t[3];
    void *ctx, *raw, *pull;
    uint64_t dropped;    /* rank 1's count so far */
    int good;            /* good messages sent so far */
    pp_tensor *x;
} fixture;

#define MAX_MSG (1u << 20)

/* Reads rank 1's hello at the raw PULL socket and answers it from the raw
 * PUSH socket with its nonce echoed, as rank 0 of run 77 in this process. */
static void impersonate_rank0(fixture *f) {
    uint64_t nonce = 0;
    int64_t deadline = tt_now_ms() + 5000;
    while (!nonce && tt_now_ms() < deadline) {
        TT_OK(pp_transport_poll(f->t[1], 10));
        zmq_msg_t m;
        zmq_msg_init(&m);
        while (!nonce && zmq_msg_recv(&m, f->pull, ZMQ_DONTWAIT) >= 0) {
            Pippin__Envelope *e = pippin__envelope__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
            const char *n = e && e->text ? strstr(e->text, "nonce=") : NULL;
            if (n && strncmp(e->text, "hello", 5) == 0) nonce = strtoull(n + 6, NULL, 16);
            if (e) pippin__envelope__free_unpacked(e, NULL);
        }
        zmq_msg_close(&m);
    }
    assert_true(nonce != 0);
    char text[256];
    snprintf(text, sizeof text, "hello-reply run=%016llx nonce=%016llx echo=%016llx proc=%llx-%ld host=", 77ULL,
             TT_RAW_NONCE, (unsigned long long)nonce, pp_shm_pid_ns(), (long)getpid());
    Pippin__Envelope env = PIPPIN__ENVELOPE__INIT;
    env.version = PP_PROTOCOL_VERSION;
    env.kind = PIPPIN__KIND__KIND_CONTROL;
    env.run_id = 77;
    env.src_rank = 0;
    env.seq = 1;
    env.text = text;
    uint8_t buf[512];
    size_t len = pippin__envelope__pack(&env, buf);
    assert_true(zmq_send(f->raw, buf, len, 0) >= 0);
    while (!pp_transport_peer_ready(f->t[1], 0) && tt_now_ms() < deadline) TT_OK(pp_transport_poll(f->t[1], 10));
    assert_true(pp_transport_peer_ready(f->t[1], 0));
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.timeout_ms = 2000;
    o.linger_ms = 100;
    o.run_id = 77;
    o.max_message_bytes = MAX_MSG;
    f->ctx = zmq_ctx_new();
    f->pull = zmq_socket(f->ctx, ZMQ_PULL);
    int zero = 0;
    zmq_setsockopt(f->pull, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_bind(f->pull, "tcp://127.0.0.1:*"), 0);
    char eps[3][256];
    size_t n = sizeof eps[0];
    assert_int_equal(zmq_getsockopt(f->pull, ZMQ_LAST_ENDPOINT, eps[0], &n), 0);
    const char *list[3] = {eps[0], NULL, NULL};
    for (int r = 1; r < 3; r++) {
        tt_endpoint("tcp", r, eps[r], sizeof eps[r]);
        pp_transport_options ro = o;
        list[1] = r == 1 ? eps[1] : NULL;
        list[2] = r == 2 ? eps[2] : NULL;
        ro.rank = r;
        ro.nranks = 3;
        ro.endpoints = list;
        if (r == 2) ro.shm_bytes = -1; /* rank 1 takes rings the stranger announces; rank 2 has none */
        TT_OK(pp_transport_create(&ro, &f->t[r]));
    }
    TT_OK(pp_transport_connect_peer(f->t[1], 2, pp_transport_endpoint(f->t[2])));
    TT_OK(pp_transport_connect_peer(f->t[2], 1, pp_transport_endpoint(f->t[1])));
    f->raw = zmq_socket(f->ctx, ZMQ_PUSH);
    zmq_setsockopt(f->raw, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_connect(f->raw, pp_transport_endpoint(f->t[1])), 0);
    impersonate_rank0(f);
    int64_t deadline = tt_now_ms() + 5000;
    while ((!pp_transport_peer_ready(f->t[1], 2) || !pp_transport_peer_ready(f->t[2], 1)) && tt_now_ms() < deadline) {
        TT_OK(pp_transport_poll(f->t[1], 1));
        TT_OK(pp_transport_poll(f->t[2], 1));
    }
    assert_true(pp_transport_peer_ready(f->t[1], 2) && pp_transport_peer_ready(f->t[2], 1));
    int64_t s[2] = {2, 3};
    f->x = tt_f32_seq(2, s, 1);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    zmq_close(f->raw);
    zmq_close(f->pull);
    zmq_ctx_term(f->ctx);
    tt_close_ranks(3, f->t);
    pp_tensor_free(f->x);
    free(f);
    return 0;
}

typedef tt_crafted crafted;

static void craft(crafted *c) { tt_craft(c, 77, 0, 1000); }

/* Sends frames (NULL data: zeros) as one multipart message from the raw socket. */
static void raw_send(fixture *f, int n, const void *const *data, const size_t *sizes) {
    for (int i = 0; i < n; i++) {
        void *buf = calloc(1, sizes[i] ? sizes[i] : 1);
        if (data && data[i]) memcpy(buf, data[i], sizes[i]);
        assert_true(zmq_send(f->raw, buf, sizes[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
        free(buf);
    }
}

/* Data frames of the given sizes, then envelope c (the last frame). */
static void raw_send_crafted(fixture *f, crafted *c, int ndata, const size_t *data_sizes) {
    size_t sizes[80000];
    assert_true(ndata + 1 <= (int)(sizeof sizes / sizeof sizes[0]));
    sizes[ndata] = pippin__envelope__get_packed_size(&c->env);
    uint8_t *env = malloc(sizes[ndata] + 1);
    pippin__envelope__pack(&c->env, env);
    for (int i = 0; i < ndata; i++) sizes[i] = data_sizes[i];
    const void **data = calloc((size_t)ndata + 1, sizeof *data);
    data[ndata] = env;
    raw_send(f, ndata + 1, data, sizes);
    free(data);
    free(env);
}

/* Waits until rank 1 counted one more dropped message; then checks a good
 * message from rank 0 still arrives. */
static void expect_dropped(fixture *f, const char *what) {
    pp_transport_stats st;
    int64_t deadline = tt_now_ms() + 3000;
    do {
        TT_OK(pp_transport_poll(f->t[1], 20));
        pp_transport_stats_get(f->t[1], &st);
    } while (st.dropped == f->dropped && tt_now_ms() < deadline);
    if (st.dropped != f->dropped + 1)
        fail_msg("%s: dropped count went from %llu to %llu, expected +1", what,
                 (unsigned long long)f->dropped, (unsigned long long)st.dropped);
    f->dropped = st.dropped;
    assert_int_equal(st.pending, 0); /* nothing was filed */
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, f->good++, 2, 1, "x");
    TT_OK(pp_transport_send(f->t[2], &k, f->x));
    pp_tensor *got;
    TT_OK(pp_transport_recv(f->t[1], &k, 2000, &got));
    tt_assert_same(got, f->x);
    pp_tensor_free(got);
}

static const size_t one_frame[1] = {24};

static void test_crafted_valid_is_accepted(void **state) {
    fixture *f = *state;
    crafted c;
    craft(&c);
    raw_send_crafted(f, &c, 1, one_frame);
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 1000, 0, 1, "x");
    pp_tensor *got;
    TT_OK(pp_transport_recv(f->t[1], &k, 2000, &got));
    assert_int_equal(got->nbytes, 24);
    pp_tensor_free(got);
}

static void test_garbage(void **state) {
    fixture *f = *state;
    const char junk[] = "\xff\xfe this is not a protobuf \x01\x02\x03";
    const void *d[1] = {junk};
    size_t n[1] = {sizeof junk};
    raw_send(f, 1, d, n);
    expect_dropped(f, "garbage");
    /* garbage followed by data frames */
    const void *d2[3] = {junk, junk, junk};
    size_t n2[3] = {sizeof junk, 10, 20};
    raw_send(f, 3, d2, n2);
    expect_dropped(f, "garbage + frames");
    /* an empty frame */
    size_t n3[1] = {0};
    raw_send(f, 1, NULL, n3);
    expect_dropped(f, "empty frame");
    /* an envelope frame over the envelope limit */
    size_t n4[1] = {PP_ENVELOPE_MAX_BYTES + 1};
    raw_send(f, 1, NULL, n4);
    expect_dropped(f, "huge envelope frame");
}

static void test_truncated(void **state) {
    fixture *f = *state;
    crafted c;
    craft(&c);
    uint8_t buf[256];
    size_t len = pippin__envelope__pack(&c.env, buf);
    /* cut inside the tensor metadata: protobuf-c rejects it */
    const void *d[2] = {NULL, buf};
    size_t n[2] = {24, len - 3};
    raw_send(f, 2, d, n);
    expect_dropped(f, "truncated protobuf");
}

/* The envelope goes last (protocol 3): a message in the old order, envelope
 * then data frame, is dropped (its 24-byte data frame is no envelope), and
 * the same message in the new order is accepted. */
static void test_envelope_first_dropped(void **state) {
    fixture *f = *state;
    crafted c;
    craft(&c);
    c.env.microbatch = 1001;
    uint8_t buf[256];
    size_t len = pippin__envelope__pack(&c.env, buf);
    const void *d[2] = {buf, NULL};
    size_t n[2] = {len, 24};
    raw_send(f, 2, d, n);
    expect_dropped(f, "envelope first");
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 1001, 0, 1, "x");
    pp_tensor *got = NULL;
    TT_OK(pp_transport_take(f->t[1], &k, &got));
    assert_null(got);
    raw_send_crafted(f, &c, 1, one_frame);
    TT_OK(pp_transport_recv(f->t[1], &k, 2000, &got));
    assert_int_equal(got->nbytes, 24);
    pp_tensor_free(got);
}

static void test_bad_fields(void **state) {
    fixture *f = *state;
    crafted c;
    craft(&c); c.env.version = PP_PROTOCOL_VERSION + 1; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "version");
    craft(&c); c.env.version = 2; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "version 2");
    craft(&c); c.env.kind = 17; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "kind");
    craft(&c); c.meta[0].dtype = 1234; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "dtype");
    craft(&c); c.meta[0].nbytes = 32;
    size_t thirty_two[1] = {32};
    raw_send_crafted(f, &c, 1, thirty_two); expect_dropped(f, "nbytes");
    craft(&c); c.meta[0].n_shape = 9;
    for (int i = 0; i < 9; i++) c.shape[0][i] = 1;
    c.meta[0].nbytes = 4;
    size_t four[1] = {4};
    raw_send_crafted(f, &c, 1, four); expect_dropped(f, "9 dims");
    craft(&c); c.shape[0][0] = -2; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "negative dim");
    /* huge dims whose product overflows, with a small payload */
    craft(&c); c.shape[0][0] = INT64_MAX / 2; c.shape[0][1] = INT64_MAX / 2; c.meta[0].nbytes = 24;
    raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "huge dims");
    /* huge but representable dims: over the size limit, never allocated */
    craft(&c); c.shape[0][0] = 1 << 30; c.shape[0][1] = 1 << 30; c.meta[0].nbytes = (uint64_t)4 << 60;
    raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "4 EiB tensor");
    craft(&c); c.shape[0][0] = 1 << 20; c.meta[0].nbytes = (uint64_t)12 << 20; c.meta[0].nframes = 12;
    size_t mib[12];
    for (int i = 0; i < 12; i++) mib[i] = 1 << 20;
    raw_send_crafted(f, &c, 12, mib); expect_dropped(f, "over max_message_bytes");
    craft(&c); c.meta[0].name = "bad\tname"; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "name");
    craft(&c); c.env.n_tensors = 2; c.meta[1].name = "x";
    size_t two[2] = {24, 24};
    raw_send_crafted(f, &c, 2, two); expect_dropped(f, "duplicate names");
    craft(&c); c.env.step = -5; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "negative step");
}

static void test_wrong_frames(void **state) {
    fixture *f = *state;
    crafted c;
    craft(&c); raw_send_crafted(f, &c, 0, NULL); expect_dropped(f, "missing data frame");
    size_t extra[2] = {24, 8};
    craft(&c); raw_send_crafted(f, &c, 2, extra); expect_dropped(f, "extra data frame");
    size_t short_frame[1] = {20};
    craft(&c); raw_send_crafted(f, &c, 1, short_frame); expect_dropped(f, "short frame");
    size_t split[2] = {12, 12}; /* right total, wrong count */
    craft(&c); raw_send_crafted(f, &c, 2, split); expect_dropped(f, "split frames");
    craft(&c); c.meta[0].nframes = 2; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "nframes 2");
    size_t zero_split[2] = {24, 0};
    craft(&c); c.meta[0].nframes = 2; raw_send_crafted(f, &c, 2, zero_split); expect_dropped(f, "empty frame");
    /* more data frames than any message may have */
    static size_t many[70000];
    for (int i = 0; i < 70000; i++) many[i] = 0;
    craft(&c); raw_send_crafted(f, &c, 70000, many); expect_dropped(f, "70000 frames");
}

static void test_routing(void **state) {
    fixture *f = *state;
    crafted c;
    craft(&c); c.env.dst_stage = 7; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "unknown stage");
    craft(&c); c.env.dst_stage = 0; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "stage elsewhere");
    craft(&c); c.env.src_rank = 1; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "from self");
    craft(&c); c.env.src_rank = 5; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "unknown rank");
    craft(&c); c.env.src_stage = 1; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "src stage/rank");
    craft(&c); c.env.run_id = 78; raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "run id");
    craft(&c); c.env.kind = PIPPIN__KIND__KIND_CONTROL; c.env.n_tensors = 0; c.env.text = "reboot";
    raw_send_crafted(f, &c, 0, NULL); expect_dropped(f, "unknown control");
    craft(&c); c.env.kind = PIPPIN__KIND__KIND_ABORT;
    raw_send_crafted(f, &c, 1, one_frame); expect_dropped(f, "abort with tensors");
}

/* Inline and shared-memory placements from a stranger: good ones are
 * delivered, bad ones dropped; a dropped message still hands its ring space
 * back, and a ring that does not exist is an error, not a crash. */
static void test_placements(void **state) {
    fixture *f = *state;
    crafted c;
    float vals[6] = {1, 2, 3, 4, 5, 6};
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 1000, 0, 1, "x");
    pp_tensor *got;
    /* inline */
    craft(&c); c.meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_INLINE; c.meta[0].nframes = 0;
    c.env.inline_data.data = (uint8_t *)vals; c.env.inline_data.len = 24;
    raw_send_crafted(f, &c, 0, NULL);
    TT_OK(pp_transport_recv(f->t[1], &k, 2000, &got));
    assert_memory_equal(got->data, vals, 24);
    pp_tensor_free(got);
    c.env.inline_data.len = 20; raw_send_crafted(f, &c, 0, NULL); expect_dropped(f, "short inline data");

    /* shared memory: a ring the stranger made */
    pp_shm_ring *ring;
    TT_OK(pp_shm_ring_create(1 << 20, &ring));
    uint64_t pos;
    void *dst;
    assert_int_equal(pp_shm_ring_reserve(ring, 24, &pos, &dst), 1);
    memcpy(dst, vals, 24);
    pp_shm_ring_commit(ring, pos, 24);
    craft(&c); c.meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_SHM; c.meta[0].nframes = 0;
    c.meta[0].shm_pos = pos; c.env.shm_name = (char *)pp_shm_ring_name(ring);
    raw_send_crafted(f, &c, 0, NULL);
    TT_OK(pp_transport_recv(f->t[1], &k, 2000, &got));
    assert_memory_equal(got->data, vals, 24);
    pp_tensor_free(got);
    assert_true(pp_shm_ring_drained(ring)); /* copied out and handed back */

    /* a record routed nowhere is dropped, and its space handed back */
    assert_int_equal(pp_shm_ring_reserve(ring, 24, &pos, &dst), 1);
    pp_shm_ring_commit(ring, pos, 24);
    c.meta[0].shm_pos = pos; c.env.dst_stage = 0;
    raw_send_crafted(f, &c, 0, NULL); expect_dropped(f, "shm message for a stage elsewhere");
    assert_true(pp_shm_ring_drained(ring));
    /* positions outside what the ring can hold */
    c.env.dst_stage = 1;
    c.meta[0].shm_pos = pos + (2 << 20); raw_send_crafted(f, &c, 0, NULL); expect_dropped(f, "a lap ahead");
    c.meta[0].shm_pos = (1 << 20) - 8; raw_send_crafted(f, &c, 0, NULL); expect_dropped(f, "straddling");
    c.meta[0].shm_pos = 0; raw_send_crafted(f, &c, 0, NULL); expect_dropped(f, "already consumed");
    /* a ring that is not there */
    c.env.shm_name = "/pippin-0-424242"; raw_send_crafted(f, &c, 0, NULL); expect_dropped(f, "no such ring");
    c.env.shm_name = "/etc/passwd"; raw_send_crafted(f, &c, 0, NULL); expect_dropped(f, "bad ring name");
    pp_shm_ring_close(ring);
}

/* Polls rank 1 until its dropped count reaches want. */
static void wait_dropped(fixture *f, uint64_t want, const char *what) {
    pp_transport_stats st;
    int64_t deadline = tt_now_ms() + 3000;
    do {
        TT_OK(pp_transport_poll(f->t[1], 20));
        pp_transport_stats_get(f->t[1], &st);
    } while (st.dropped < want && tt_now_ms() < deadline);
    if (st.dropped != want)
        fail_msg("%s: dropped %llu, expected %llu", what, (unsigned long long)st.dropped,
                 (unsigned long long)want);
    f->dropped = st.dropped;
}

/* Sends a batch (kind 6) of the given packed entries from the raw rank 0,
 * followed by ndata empty-ish data frames. */
static void raw_send_batch(fixture *f, int n, uint8_t **entries, const size_t *lens, int ntensors, int ndata) {
    Pippin__Envelope b = PIPPIN__ENVELOPE__INIT;
    b.version = PP_PROTOCOL_VERSION;
    b.kind = (Pippin__Kind)PP_WIRE_KIND_BATCH;
    b.run_id = 77;
    b.sender_nonce = TT_RAW_NONCE;
    ProtobufCBinaryData parts[80];
    for (int i = 0; i < n; i++) {
        parts[i].data = entries[i];
        parts[i].len = lens[i];
    }
    b.n_batch = (size_t)n;
    b.batch = parts;
    crafted c;
    craft(&c);
    if (ntensors) {
        b.n_tensors = 1;
        b.tensors = c.ptrs;
    }
    /* a data frame (if any), then the batch envelope last */
    size_t sizes[2] = {24, pippin__envelope__get_packed_size(&b)};
    uint8_t *buf = malloc(sizes[1]);
    pippin__envelope__pack(&b, buf);
    const void *data[2] = {NULL, buf};
    raw_send(f, 1 + ndata, data + 1 - ndata, sizes + 1 - ndata);
    free(buf);
}

static uint8_t *pack_entry(crafted *c, size_t *len) {
    *len = pippin__envelope__get_packed_size(&c->env);
    uint8_t *buf = malloc(*len);
    pippin__envelope__pack(&c->env, buf);
    return buf;
}

/* A batch from a verified peer: every entry is checked as if it had come
 * alone on that connection. Good entries are filed; an entry of another
 * run, without the handshake's nonce, claiming another rank, routed
 * elsewhere, with a data-frame tensor, an abort, a batch inside, or
 * garbage is dropped alone (and the abort does not end the run). A batch
 * with data frames, tensors of its own, no entries or too many is dropped
 * whole. */
static void test_batches(void **state) {
    fixture *f = *state;
    static float vals[6] = {1, 2, 3, 4, 5, 6};
    enum { N = 10 };
    uint8_t *e[N];
    size_t len[N];
    crafted c;
    int mb = 2000;
#define INLINE_X(c) do { (c).meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_INLINE; (c).meta[0].nframes = 0; \
        (c).env.inline_data.data = (uint8_t *)vals; (c).env.inline_data.len = 24; } while (0)
    craft(&c); INLINE_X(c); c.env.microbatch = mb; e[0] = pack_entry(&c, &len[0]);
    craft(&c); INLINE_X(c); c.env.microbatch = mb + 1; c.env.run_id = 78; e[1] = pack_entry(&c, &len[1]);
    craft(&c); INLINE_X(c); c.env.microbatch = mb + 2; c.env.sender_nonce = 1; e[2] = pack_entry(&c, &len[2]);
    craft(&c); INLINE_X(c); c.env.microbatch = mb + 3; c.env.src_rank = 2; e[3] = pack_entry(&c, &len[3]);
    craft(&c); INLINE_X(c); c.env.microbatch = mb + 4; c.env.dst_stage = 0; e[4] = pack_entry(&c, &len[4]);
    craft(&c); c.env.microbatch = mb + 5; e[5] = pack_entry(&c, &len[5]); /* its tensor needs a data frame */
    craft(&c); c.env.kind = PIPPIN__KIND__KIND_ABORT; c.env.n_tensors = 0; c.env.text = "forged";
    e[6] = pack_entry(&c, &len[6]);
    {
        Pippin__Envelope inner = PIPPIN__ENVELOPE__INIT;
        inner.version = PP_PROTOCOL_VERSION;
        inner.kind = (Pippin__Kind)PP_WIRE_KIND_BATCH;
        inner.run_id = 77;
        inner.sender_nonce = TT_RAW_NONCE;
        ProtobufCBinaryData part = {len[0], e[0]};
        inner.n_batch = 1;
        inner.batch = &part;
        len[7] = pippin__envelope__get_packed_size(&inner);
        e[7] = malloc(len[7]);
        pippin__envelope__pack(&inner, e[7]);
    }
    e[8] = malloc(3);
    memcpy(e[8], "\xff\xfe\xfd", 3);
    len[8] = 3;
    craft(&c); INLINE_X(c); c.env.microbatch = mb + 9; c.env.kind = PIPPIN__KIND__KIND_GRADIENT;
    c.env.src_stage = 1; c.env.dst_stage = 0; /* stage 0 is rank 0's: routed elsewhere */
    e[9] = pack_entry(&c, &len[9]);
    /* good again, after the bad ones */
    crafted g;
    craft(&g); INLINE_X(g); g.env.microbatch = mb + 10;
    uint8_t *all[N + 1];
    size_t all_len[N + 1];
    for (int i = 0; i < N; i++) {
        all[i] = e[i];
        all_len[i] = len[i];
    }
    all[N] = pack_entry(&g, &all_len[N]);
    uint64_t base = f->dropped;
    raw_send_batch(f, N + 1, all, all_len, 0, 0);
    for (int m = 0; m <= 10; m += 10) {
        pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, mb + m, 0, 1, "x");
        pp_tensor *got;
        TT_OK(pp_transport_recv(f->t[1], &k, 2000, &got));
        assert_memory_equal(got->data, vals, 24);
        pp_tensor_free(got);
    }
    wait_dropped(f, base + 9, "bad batch entries");
    assert_null(pp_transport_abort_reason(f->t[1], NULL)); /* the forged abort did nothing */
    pp_transport_stats st;
    pp_transport_stats_get(f->t[1], &st);
    assert_int_equal(st.pending, 0);
    assert_true(st.dropped_foreign >= 2); /* another run id, a nonce it never proved */
    /* whole batches that are wrong */
    raw_send_batch(f, 1, all, all_len, 0, 1); wait_dropped(f, base + 10, "a batch with a data frame");
    raw_send_batch(f, 1, all, all_len, 1, 0); wait_dropped(f, base + 11, "a batch with a tensor");
    raw_send_batch(f, 0, all, all_len, 0, 0); wait_dropped(f, base + 12, "an empty batch");
    uint8_t *many[PP_ENVELOPE_MAX_BATCH + 1];
    size_t many_len[PP_ENVELOPE_MAX_BATCH + 1];
    for (unsigned i = 0; i <= PP_ENVELOPE_MAX_BATCH; i++) {
        many[i] = all[N];
        many_len[i] = all_len[N];
    }
    raw_send_batch(f, (int)PP_ENVELOPE_MAX_BATCH + 1, many, many_len, 0, 0);
    wait_dropped(f, base + 13, "a batch of 65");
    pp_transport_stats_get(f->t[1], &st);
    assert_int_equal(st.pending, 0);
    for (int i = 0; i <= N; i++) free(all[i]);
#undef INLINE_X
    /* the links still work */
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, f->good++, 2, 1, "x");
    TT_OK(pp_transport_send(f->t[2], &k, f->x));
    pp_tensor *got;
    TT_OK(pp_transport_recv(f->t[1], &k, 2000, &got));
    tt_assert_same(got, f->x);
    pp_tensor_free(got);
}

/* Writes envelope c as a record of a message ring. */
static void ring_put(pp_shm_ring *ring, crafted *c) {
    size_t n = pippin__envelope__get_packed_size(&c->env);
    uint64_t pos;
    void *dst;
    assert_int_equal(pp_shm_ring_msg_reserve(ring, n, &pos, &dst), 1);
    pippin__envelope__pack(&c->env, dst);
    pp_shm_ring_msg_commit(ring, pos, n);
}

/* A message ring the stranger makes and announces to rank 1 as rank 0's. */
static pp_shm_ring *stranger_ring(fixture *f) {
    pp_shm_ring *ring;
    TT_OK(pp_shm_ring_create(1 << 20, &ring));
    crafted c;
    craft(&c); c.env.kind = PIPPIN__KIND__KIND_CONTROL; c.env.n_tensors = 0;
    char text[128];
    snprintf(text, sizeof text, "msgring %s", pp_shm_ring_name(ring));
    c.env.text = text;
    raw_send_crafted(f, &c, 0, NULL);
    return ring;
}

/* A stranger on this host announces a message ring as rank 0 and writes
 * records to it: good ones are delivered, ones claiming another rank or
 * carrying control kinds are dropped, and a ring with a broken record is
 * given up (counted) without harm. */
static void test_msg_ring_records(void **state) {
    fixture *f = *state;
    pp_shm_ring *ring = stranger_ring(f);
    crafted c;
    float vals[6] = {1, 2, 3, 4, 5, 6};
    craft(&c); c.meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_INLINE; c.meta[0].nframes = 0;
    c.env.inline_data.data = (uint8_t *)vals; c.env.inline_data.len = 24; c.env.microbatch = 2000;
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 2000, 0, 1, "x");
    pp_tensor *got = NULL;
    int64_t deadline = tt_now_ms() + 3000;
    /* the announcement arrives over the socket; the record then waits in the ring */
    ring_put(ring, &c);
    while (!got && tt_now_ms() < deadline) {
        pp_status s = pp_transport_recv(f->t[1], &k, 100, &got);
        if (s != PP_OK && s != PP_ERR_TIMEOUT) fail_msg("%s", pp_last_error());
    }
    assert_non_null(got);
    assert_memory_equal(got->data, vals, 24);
    pp_tensor_free(got);
    pp_transport_stats st;
    pp_transport_stats_get(f->t[1], &st);
    uint64_t base = st.dropped;
    c.env.src_rank = 1; ring_put(ring, &c); /* claims rank 1 in rank 0's ring */
    c.env.src_rank = 0; c.env.kind = PIPPIN__KIND__KIND_ABORT; c.env.n_tensors = 0; c.env.inline_data.len = 0;
    c.env.text = "fake"; ring_put(ring, &c);
    wait_dropped(f, base + 2, "records claiming another rank or a control kind");
    pp_transport_stats_get(f->t[1], &st);
    assert_int_equal(st.pending, 0);
    /* a broken record header: the ring is dropped, one more count */
    uint64_t pos;
    void *dst;
    assert_int_equal(pp_shm_ring_msg_reserve(ring, 16, &pos, &dst), 1);
    uint32_t bogus = 1u << 30;
    memcpy((char *)dst - 8, &bogus, sizeof bogus);
    pp_shm_ring_msg_commit(ring, pos, 16);
    wait_dropped(f, base + 3, "a broken ring");
    pp_shm_ring_close(ring);
    /* the socket still works */
    pp_transport_key g = tt_key(PP_MSG_ACTIVATION, 0, f->good++, 0, 1, "x");
    craft(&c); c.env.microbatch = g.microbatch;
    raw_send_crafted(f, &c, 1, one_frame);
    TT_OK(pp_transport_recv(f->t[1], &g, 2000, &got));
    pp_tensor_free(got);
}

typedef struct flipper {
    _Atomic(uint8_t *) at;   /* the record being read, or NULL */
    atomic_int stop;
    const uint8_t *a, *b;
    size_t len;
} flipper;

static void *flip(void *arg) {
    flipper *fl = arg;
    for (unsigned i = 0; !atomic_load(&fl->stop); i++) {
        uint8_t *at = atomic_load(&fl->at);
        if (at) memcpy(at, i & 1 ? fl->b : fl->a, fl->len);
    }
    return NULL;
}

/* A stranger keeps rewriting each record while the receiver reads it: one
 * tensor, then a thousand empty ones. The receiver decodes a copy, so
 * whatever it sees is one consistent (if odd) message, never an overflow of
 * what its first look counted. */
static void test_msg_ring_record_rewritten(void **state) {
    fixture *f = *state;
    pp_shm_ring *ring = stranger_ring(f);
    crafted c;
    wait_dropped(f, f->dropped, "the announcement");
    enum { LEN = 2000 };
    static uint8_t a[LEN], b[LEN];
    for (size_t i = 0; i < LEN; i += 2) { b[i] = 0x52; b[i + 1] = 0; } /* empty tensors */
    float vals[6] = {1, 2, 3, 4, 5, 6};
    craft(&c); c.meta[0].placement = PIPPIN__PLACEMENT__PLACEMENT_INLINE; c.meta[0].nframes = 0;
    c.env.inline_data.data = (uint8_t *)vals; c.env.inline_data.len = 24;
    size_t n = pippin__envelope__pack(&c.env, a);
    a[n] = 0x7a; /* unknown field 15, bytes, to the end */
    a[n + 1] = (uint8_t)(0x80 | ((LEN - n - 3) & 0x7f));
    a[n + 2] = (uint8_t)((LEN - n - 3) >> 7);
    flipper fl = {NULL, 0, a, b, LEN};
    pthread_t th;
    pthread_create(&th, NULL, flip, &fl);
    for (int i = 0; i < 10000; i++) {
        uint64_t pos;
        void *dst;
        int got;
        while ((got = pp_shm_ring_msg_reserve(ring, LEN, &pos, &dst)) == 0) TT_OK(pp_transport_poll(f->t[1], 1));
        assert_int_equal(got, 1); /* -1: no pages in /dev/shm, and dst unset */
        memcpy(dst, a, LEN);
        atomic_store(&fl.at, (uint8_t *)dst);
        pp_shm_ring_msg_commit(ring, pos, LEN);
        TT_OK(pp_transport_poll(f->t[1], 0));
        atomic_store(&fl.at, NULL);
    }
    atomic_store(&fl.stop, 1);
    pthread_join(th, NULL);
    TT_OK(pp_transport_poll(f->t[1], 0));
    pp_transport_stats st;
    pp_transport_stats_get(f->t[1], &st);
    f->dropped = st.dropped;
    pp_shm_ring_close(ring);
    /* filed ones (step 0, microbatch 1000) are taken before the next test */
    pp_tensor *got;
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 1000, 0, 1, "x");
    while (pp_transport_recv(f->t[1], &k, 0, &got) == PP_OK) pp_tensor_free(got);
}

/* A frame over ZMQ_MAXMSGSIZE makes libzmq drop the stranger's connection;
 * other links are unaffected. */
static void test_oversize_frame(void **state) {
    fixture *f = *state;
    size_t n[1] = {MAX_MSG + 1};
    raw_send(f, 1, NULL, n);
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, f->good++, 2, 1, "x");
    TT_OK(pp_transport_send(f->t[2], &k, f->x));
    pp_tensor *got;
    TT_OK(pp_transport_recv(f->t[1], &k, 2000, &got));
    pp_tensor_free(got);
    pp_transport_stats st;
    pp_transport_stats_get(f->t[1], &st);
    assert_int_equal(st.dropped, f->dropped);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crafted_valid_is_accepted),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_envelope_first_dropped),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_wrong_frames),
        cmocka_unit_test(test_routing),
        cmocka_unit_test(test_placements),
        cmocka_unit_test(test_msg_ring_records),
        cmocka_unit_test(test_msg_ring_record_rewritten),
        cmocka_unit_test(test_batches),
        cmocka_unit_test(test_oversize_frame),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}

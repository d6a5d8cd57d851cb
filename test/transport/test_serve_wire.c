/* The serving wire format and the C client (pippin/client.h): requests and
 * responses round-trip, hostile ones are refused naming the problem, and
 * the client matches responses to requests by id whatever their order,
 * keeps the ones nobody waits for yet, drops cancelled ones and times out. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "serve.pb-c.h"
#include "serve_wire.h"
#include "tt_util.h"

#include "test_filter.h"

static pp_tensor *i64_seq(int64_t rows, int64_t cols, int64_t base) {
    pp_tensor *t;
    TT_OK(pp_tensor_new(PP_I64, 2, (int64_t[]){rows, cols}, &t));
    for (int64_t i = 0; i < rows * cols; i++) ((int64_t *)t->data)[i] = base + i;
    return t;
}

static void test_request_round_trip(void **state) {
    (void)state;
    pp_tensor *a = i64_seq(2, 3, 5), *b = tt_f32_seq(1, (int64_t[]){4}, 1.5f);
    char *names[2] = {"idx", "mask"}, *outs[1] = {"logits"};
    pp_tensor *ins[2] = {a, b};
    pp_serve_request r = {77, PP_SERVE_KIND_INFER, 2, names, ins, 1, outs, 250};
    void *buf;
    size_t n;
    TT_OK(pp_serve_request_encode(&r, &buf, &n));
    pp_serve_request got;
    TT_OK(pp_serve_request_decode(buf, n, 1 << 20, &got));
    assert_int_equal(got.id, 77);
    assert_int_equal(got.n_inputs, 2);
    assert_string_equal(got.names[1], "mask");
    tt_assert_same(got.inputs[0], a);
    tt_assert_same(got.inputs[1], b);
    assert_int_equal(got.n_outputs, 1);
    assert_string_equal(got.outputs[0], "logits");
    assert_int_equal(got.timeout_ms, 250);
    pp_serve_request_clear(&got);
    /* too large for the service */
    TT_FAILS(PP_ERR_PARSE, pp_serve_request_decode(buf, n, 20, &got), "input 'idx'", "larger");
    assert_int_equal(got.id, 77);
    assert_int_equal(got.n_inputs, 0);
    free(buf);
    /* a response with outputs and an error text */
    pp_response resp = {9, PP_SERVE_FAILED, "stage 2 on rank 1 failed", 1, (char *[]){"logits"}, &b, NULL};
    TT_OK(pp_serve_response_encode(&resp, &buf, &n));
    pp_response *back;
    TT_OK(pp_serve_response_decode(buf, n, 1 << 20, &back));
    assert_int_equal(back->id, 9);
    assert_int_equal(back->code, PP_SERVE_FAILED);
    assert_string_equal(back->error, "stage 2 on rank 1 failed");
    assert_string_equal(back->names[0], "logits");
    tt_assert_same(back->outputs[0], b);
    assert_null(back->stats);
    pp_response_free(back);
    free(buf);
    pp_tensor_free(a);
    pp_tensor_free(b);
}

/* Packs a hand-made request with one tensor. */
static void *pack_one(const char *name, int dtype, int ndim, int64_t *shape, size_t data_len, size_t *n) {
    static uint8_t data[64];
    Pippin__Serve__Tensor t = PIPPIN__SERVE__TENSOR__INIT, *tp = &t;
    t.name = (char *)name;
    t.dtype = dtype;
    t.n_shape = (size_t)ndim;
    t.shape = shape;
    t.data.len = data_len;
    t.data.data = data;
    Pippin__Serve__Request r = PIPPIN__SERVE__REQUEST__INIT;
    r.id = 5;
    r.n_inputs = 1;
    r.inputs = &tp;
    *n = pippin__serve__request__get_packed_size(&r);
    void *buf = malloc(*n);
    pippin__serve__request__pack(&r, buf);
    return buf;
}

static void test_hostile_requests(void **state) {
    (void)state;
    pp_serve_request got;
    size_t n;
    int64_t s2[2] = {2, 2}, s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg[1] = {-1};
    struct {
        const char *name;
        int dtype, ndim;
        int64_t *shape;
        size_t len;
        const char *says;
    } cases[] = {
        {"x", PP_F32, 2, s2, 15, "15 data bytes, its shape needs 16"},
        {"x", 99, 2, s2, 16, "unknown dtype 99"},
        {"x", PP_F32, 9, s9, 4, "9 dims"},
        {"x", PP_F32, 1, neg, 0, "negative"},
        {"", PP_F32, 2, s2, 16, "empty"},
        {"a\nb", PP_F32, 2, s2, 16, "not printable"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *buf = pack_one(cases[i].name, cases[i].dtype, cases[i].ndim, cases[i].shape, cases[i].len, &n);
        TT_FAILS(PP_ERR_PARSE, pp_serve_request_decode(buf, n, 1 << 20, &got), cases[i].says);
        free(buf);
    }
    TT_FAILS(PP_ERR_PARSE, pp_serve_request_decode("\xff\xff\xff", 3, 1 << 20, &got), "malformed");
    /* the same input twice */
    pp_tensor *a = i64_seq(1, 1, 0);
    pp_tensor *ins[2] = {a, a};
    pp_serve_request r = {1, PP_SERVE_KIND_INFER, 2, (char *[]){"x", "x"}, ins, 0, NULL, 0};
    void *buf;
    TT_OK(pp_serve_request_encode(&r, &buf, &n));
    TT_FAILS(PP_ERR_PARSE, pp_serve_request_decode(buf, n, 1 << 20, &got), "'x' given twice");
    free(buf);
    pp_tensor_free(a);
}

/* A service stand-in: answers each request with its inputs as outputs,
 * holding the first one back until the second arrived (responses out of
 * order), and never answers a request with timeout_ms 1. */
typedef struct {
    void *ctx;
    char ep[128];
    int count;
} fake_service;

static void *serve_fake(void *arg) {
    fake_service *f = arg;
    void *s = zmq_socket(f->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(s, f->ep) != 0) return NULL;
    zmq_msg_t held_id, held_body;
    int holding = 0;
    for (int handled = 0; handled < f->count;) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&body, s, 0) < 0) break;
        handled++;
        pp_serve_request r;
        if (pp_serve_request_decode(zmq_msg_data(&body), zmq_msg_size(&body), 1 << 20, &r) != PP_OK ||
            r.timeout_ms == 1 || r.kind == PP_SERVE_KIND_CANCEL) { /* never answered, as the service never answers a cancel */
            pp_serve_request_clear(&r);
            zmq_msg_close(&id);
            zmq_msg_close(&body);
            continue;
        }
        pp_response resp = {r.id, PP_SERVE_OK, "", r.n_inputs, r.names, r.inputs, NULL};
        if (r.kind == PP_SERVE_KIND_STATS) resp.stats = "{\"requests\": 3}";
        void *buf;
        size_t n;
        if (pp_serve_response_encode(&resp, &buf, &n) == PP_OK) {
            zmq_msg_t out;
            zmq_msg_init_size(&out, n);
            memcpy(zmq_msg_data(&out), buf, n);
            free(buf);
            if (!holding && handled == 1) { /* keep the first for after the second */
                zmq_msg_init(&held_id);
                zmq_msg_init(&held_body);
                zmq_msg_copy(&held_id, &id);
                zmq_msg_move(&held_body, &out);
                holding = 1;
            } else {
                zmq_msg_send(&id, s, ZMQ_SNDMORE);
                zmq_msg_send(&out, s, 0);
                if (holding) {
                    zmq_msg_send(&held_id, s, ZMQ_SNDMORE);
                    zmq_msg_send(&held_body, s, 0);
                    holding = 0;
                }
            }
            zmq_msg_close(&out);
        }
        pp_serve_request_clear(&r);
        zmq_msg_close(&id);
        zmq_msg_close(&body);
    }
    if (holding) {
        zmq_msg_close(&held_id);
        zmq_msg_close(&held_body);
    }
    zmq_close(s);
    return NULL;
}

/* A temperature of -0.0 reads as 0, so a request survives a round trip
 * (an encoder leaves zeros out). (Regression: fuzz_serve's input
 * "M\0\0\0\x80", field 9 = -0.0f, came back as +0.0.) */
static void test_negative_zero_temperature(void **state) {
    (void)state;
    static const uint8_t bytes[5] = {0x4d, 0, 0, 0, 0x80};
    pp_serve_request r;
    if (pp_serve_request_decode(bytes, sizeof bytes, 1 << 20, &r) != PP_OK) return; /* refused is fine too */
    assert_false(signbit(r.temperature));
    void *buf;
    size_t n;
    assert_int_equal(pp_serve_request_encode(&r, &buf, &n), PP_OK);
    pp_serve_request again;
    assert_int_equal(pp_serve_request_decode(buf, n, 1 << 20, &again), PP_OK);
    assert_memory_equal(&again.temperature, &r.temperature, sizeof r.temperature);
    pp_serve_request_clear(&again);
    pp_serve_request_clear(&r);
    free(buf);
}

static void test_client_matches_ids(void **state) {
    (void)state;
    const char *dir = tt_tmpdir();
    fake_service f = {zmq_ctx_new(), "", 6};
    snprintf(f.ep, sizeof f.ep, "ipc://%s/front", dir);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, serve_fake, &f), 0);
    pp_client *c;
    TT_OK(pp_client_connect(f.ep, NULL, &c));
    pp_tensor *a = i64_seq(1, 4, 10), *b = i64_seq(2, 2, 20);
    const char *name[1] = {"idx"};
    uint64_t ia, ib, is, it;
    TT_OK(pp_client_submit(c, 1, name, &a, 0, NULL, 0, &ia));
    TT_OK(pp_client_submit(c, 1, name, &b, 0, NULL, 0, &ib));
    assert_true(ia != ib);
    pp_response *r;
    TT_OK(pp_client_wait(c, ia, 5000, &r)); /* arrives second: the first one is kept meanwhile */
    assert_int_equal(r->id, ia);
    tt_assert_same(r->outputs[0], a);
    pp_response_free(r);
    TT_OK(pp_client_wait(c, ib, 0, &r)); /* already kept */
    tt_assert_same(r->outputs[0], b);
    pp_response_free(r);
    TT_OK(pp_client_submit_stats(c, &is));
    TT_OK(pp_client_wait(c, 0, 5000, &r));
    assert_int_equal(r->id, is);
    assert_string_equal(r->stats, "{\"requests\": 3}");
    pp_response_free(r);
    /* a cancelled request's response is dropped; one never answered times out */
    TT_OK(pp_client_submit(c, 1, name, &a, 0, NULL, 0, &ia));
    pp_client_cancel(c, ia);
    TT_OK(pp_client_submit(c, 1, name, &a, 0, NULL, 1, &it));
    TT_FAILS(PP_ERR_TIMEOUT, pp_client_wait(c, 0, 300, &r), "no response", "300 ms");
    pthread_join(th, NULL);
    pp_client_close(c);
    zmq_ctx_term(f.ctx);
    TT_FAILS(PP_ERR_INVALID, pp_client_connect("inproc://x", NULL, &c), "not a tcp:// or ipc://");
    pp_tensor_free(a);
    pp_tensor_free(b);
    tt_rmdir_all(dir);
}

/* A plaintext client of a CURVE front: its handshake is refused, and
 * libzmq gives up the connection (a protocol error: no reconnect), so a
 * submit finds nowhere to queue. CI's serve_curve once got "too many
 * requests queued (is the service there?)" there, which the test did not
 * take for the no-answer it is. Every submit now either goes (before the
 * refusal) or, after waiting for a connection, fails naming the refused
 * handshake; a wait for an answer names it too. */
static void test_refused_handshake_is_named(void **state) {
    (void)state;
    if (!zmq_has("curve")) skip();
    const char *dir = tt_tmpdir();
    char ep[512], pub[41], sec[41];
    snprintf(ep, sizeof ep, "ipc://%s/curve-front", dir);
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    void *ctx = zmq_ctx_new(), *front = zmq_socket(ctx, ZMQ_ROUTER);
    int one = 1, zero = 0;
    assert_int_equal(zmq_setsockopt(front, ZMQ_CURVE_SERVER, &one, sizeof one), 0);
    assert_int_equal(zmq_setsockopt(front, ZMQ_CURVE_SECRETKEY, sec, 40), 0);
    assert_int_equal(zmq_setsockopt(front, ZMQ_LINGER, &zero, sizeof zero), 0);
    assert_int_equal(zmq_bind(front, ep), 0);
    pp_client *c;
    TT_OK(pp_client_connect(ep, NULL, &c));
    pp_tensor *a = i64_seq(1, 4, 10);
    const char *name[1] = {"idx"};
    pp_status st = PP_OK;
    for (int64_t t0 = tt_now_ms(); st == PP_OK && tt_now_ms() - t0 < 20000;) { /* some go before the refusal */
        uint64_t id;
        st = pp_client_submit(c, 1, name, &a, 0, NULL, 0, &id);
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    assert_int_equal(st, PP_ERR_IO);
    tt_assert_mentions(pp_last_error(), "nothing took the request within 1000 ms", "refused this client's handshake",
                       "a CURVE front refuses a plaintext client", NULL);
    pp_response *r;
    TT_FAILS(PP_ERR_TIMEOUT, pp_client_wait(c, 0, 100, &r), "no response", "refused this client's handshake");
    pp_client_close(c);
    pp_tensor_free(a);
    zmq_close(front);
    zmq_ctx_term(ctx);
    tt_rmdir_all(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_round_trip),
        cmocka_unit_test(test_hostile_requests),
        cmocka_unit_test(test_client_matches_ids),
        cmocka_unit_test(test_negative_zero_temperature),
        cmocka_unit_test(test_refused_handshake_is_named),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}

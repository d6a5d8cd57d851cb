/* CURVE: key files, encrypted links, and a ZAP handler that lets no one
 * else in: a peer with an unlisted key, or none, cannot deliver a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "envelope.h"
#include "pippin.pb-c.h"
#include "tt_util.h"

#include "test_filter.h"
typedef struct keypair {
    char pub[PP_CURVE_KEY_CHARS + 1], sec[PP_CURVE_KEY_CHARS + 1];
} keypair;

static keypair new_keys(void) {
    keypair k;
    TT_OK(pp_curve_keypair(k.pub, k.sec));
    return k;
}

static pp_transport_options curve_opts(int rank, const char **eps, const keypair *mine,
                                       const char **rank_keys) {
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.rank = rank;
    o.nranks = 2;
    o.endpoints = eps;
    o.timeout_ms = 300;
    o.linger_ms = 100;
    o.curve_secret_key = mine->sec;
    o.curve_rank_keys = rank_keys;
    return o;
}

/* Rank 1 (CURVE server admitting the keys of ranks 0 and 1), bound on tcp. */
static pp_transport *make_server(const char *kind, keypair *k0, keypair *k1,
                                 const char **extra_allowed, int n_extra) {
    char ep[256];
    tt_endpoint(kind, 1, ep, sizeof ep);
    const char *eps[2] = {NULL, ep};
    const char *rank_keys[2] = {k0->pub, k1->pub};
    pp_transport_options o = curve_opts(1, eps, k1, rank_keys);
    const char *allowed[8] = {k0->pub, k1->pub};
    for (int i = 0; i < n_extra; i++) allowed[2 + i] = extra_allowed[i];
    if (n_extra) {
        o.curve_allowed_keys = allowed;
        o.n_curve_allowed_keys = 2 + n_extra;
    }
    pp_transport *t;
    TT_OK(pp_transport_create(&o, &t));
    return t;
}

/* Rank 0 using `mine` as its key pair and k1 as rank 1's public key. */
static pp_transport *make_client(pp_transport *server, const keypair *mine, const keypair *k1,
                                 int use_curve) {
    const char *eps[2] = {"tcp://127.0.0.1:*", pp_transport_endpoint(server)};
    if (strncmp(eps[1], "ipc://", 6) == 0) eps[0] = "ipc://*";
    const char *rank_keys[2] = {mine->pub, k1->pub};
    pp_transport_options o = curve_opts(0, eps, mine, rank_keys);
    if (!use_curve) {
        o.curve_secret_key = NULL;
        o.curve_rank_keys = NULL;
    }
    pp_transport *t;
    TT_OK(pp_transport_create(&o, &t));
    return t;
}

static void assert_nothing_arrived(pp_transport *server, int64_t min_auth_failures) {
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 0, 0, 1, "x");
    pp_tensor *got = NULL;
    TT_FAILS(PP_ERR_TIMEOUT, pp_transport_recv(server, &k, 300, &got), "timed out");
    assert_null(got);
    pp_transport_stats st;
    pp_transport_stats_get(server, &st);
    assert_int_equal(st.messages_received, 0);
    assert_int_equal(st.bytes_received, 0);
    assert_int_equal(st.pending, 0);
    assert_true((int64_t)st.auth_failures >= min_auth_failures);
}

static void test_key_functions(void **state) {
    (void)state;
    keypair k = new_keys();
    assert_true(pp_curve_key_valid(k.pub));
    assert_true(pp_curve_key_valid(k.sec));
    assert_false(pp_curve_key_valid("short"));
    assert_false(pp_curve_key_valid(NULL));
    assert_false(pp_curve_key_valid("0123456789012345678901234567890123456789 ")); /* 41 */
    assert_false(pp_curve_key_valid("012345678901234567890123456789012345678\""));  /* not Z85 */
    char pub[PP_CURVE_KEY_CHARS + 1];
    TT_OK(pp_curve_public_key(k.sec, pub));
    assert_string_equal(pub, k.pub);
    TT_FAILS(PP_ERR_INVALID, pp_curve_public_key("nope", pub), "secret key");
}

static int warned;
static void count_warnings(pp_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == PP_LOG_WARN && strstr(msg, "readable by other users")) warned++;
}

static void test_key_files(void **state) {
    (void)state;
    const char *dir = tt_tmpdir();
    char prefix[512], path[600];
    snprintf(prefix, sizeof prefix, "%s/node0", dir);
    char pub[PP_CURVE_KEY_CHARS + 1], sec[PP_CURVE_KEY_CHARS + 1], got[PP_CURVE_KEY_CHARS + 1];
    TT_OK(pp_curve_write_keypair(prefix, 0, pub));
    snprintf(path, sizeof path, "%s.key", prefix);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    TT_OK(pp_curve_read_key(path, sec));
    TT_OK(pp_curve_public_key(sec, got));
    assert_string_equal(got, pub);
    snprintf(path, sizeof path, "%s.pub", prefix);
    TT_OK(pp_curve_read_key(path, got));
    assert_string_equal(got, pub);
    TT_FAILS(PP_ERR_IO, pp_curve_write_keypair(prefix, 0, NULL), "exists");
    TT_OK(pp_curve_write_keypair(prefix, 1, got));
    assert_string_not_equal(got, pub);
    /* a secret key others can read is used, with a warning */
    snprintf(path, sizeof path, "%s.key", prefix);
    chmod(path, 0644);
    pp_log_set_handler(count_warnings, NULL);
    pp_log_level old = pp_log_get_level();
    pp_log_set_level(PP_LOG_WARN);
    warned = 0;
    TT_OK(pp_curve_read_key(path, sec));
    pp_log_set_handler(NULL, NULL);
    pp_log_set_level(old);
    assert_int_equal(warned, 1);
    /* bad files */
    snprintf(path, sizeof path, "%s/missing.pub", dir);
    TT_FAILS(PP_ERR_IO, pp_curve_read_key(path, got), "missing.pub");
    snprintf(path, sizeof path, "%s/bad.pub", dir);
    FILE *f = fopen(path, "w");
    fputs("# comment\nnot a key\n", f);
    fclose(f);
    TT_FAILS(PP_ERR_PARSE, pp_curve_read_key(path, got), "bad.pub:2", "not a CURVE key");
    f = fopen(path, "w");
    fputs("# only a comment\n\n", f);
    fclose(f);
    TT_FAILS(PP_ERR_PARSE, pp_curve_read_key(path, got), "no key");
    tt_rmdir_all(dir);
}

static void curve_link(const char *kind) {
    keypair k0 = new_keys(), k1 = new_keys();
    pp_transport *b = make_server(kind, &k0, &k1, NULL, 0);
    pp_transport *a = make_client(b, &k0, &k1, 1);
    /* rank 1 learns rank 0's endpoint for the way back */
    TT_OK(pp_transport_connect_peer(b, 0, pp_transport_endpoint(a)));
    TT_OK(pp_transport_wait_peers(a, 3000));
    TT_OK(pp_transport_wait_peers(b, 3000));
    int64_t s[1] = {300000};
    pp_tensor *x = tt_f32_seq(1, s, 3);
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 0, 0, 1, "x");
    TT_OK(pp_transport_send(a, &k, x));
    pp_tensor *got;
    TT_OK(pp_transport_recv(b, &k, 3000, &got));
    tt_assert_same(got, x);
    pp_tensor_free(got);
    pp_transport_key g = tt_key(PP_MSG_GRADIENT, 0, 0, 1, 0, "g");
    TT_OK(pp_transport_send(b, &g, x));
    TT_OK(pp_transport_recv(a, &g, 3000, &got));
    tt_assert_same(got, x);
    pp_tensor_free(got);
    pp_transport_stats st;
    pp_transport_stats_get(b, &st);
    assert_int_equal(st.auth_failures, 0);
    assert_int_equal(st.dropped, 0);
    /* CURVE promises encrypted links: same host or not, no shared memory */
    assert_int_equal(st.shm_bytes_sent + st.shm_bytes_received, 0);
    assert_false(pp_transport_peer_shm(a, 1));
    pp_tensor_free(x);
    pp_transport_close(a);
    pp_transport_close(b);
}

static void test_curve_link_tcp(void **state) { (void)state; curve_link("tcp"); }
static void test_curve_link_ipc(void **state) { (void)state; curve_link("ipc"); }

/* A rank with a key the server does not list. */
static void test_unlisted_key_refused(void **state) {
    (void)state;
    keypair k0 = new_keys(), k1 = new_keys(), mallory = new_keys();
    pp_transport *b = make_server("tcp", &k0, &k1, NULL, 0);
    pp_transport *m = make_client(b, &mallory, &k1, 1);
    int64_t s[1] = {6};
    pp_tensor *x = tt_f32_seq(1, s, 0);
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 0, 0, 1, "x");
    pp_status st = pp_transport_send(m, &k, x);
    assert_true(st == PP_ERR_PEER || st == PP_ERR_TIMEOUT);
    tt_assert_mentions(pp_last_error(), "rank 1", pp_transport_endpoint(b), NULL);
    TT_FAILS(PP_ERR_PEER, pp_transport_wait_peers(m, 2000), "refused our CURVE key");
    TT_FAILS(PP_ERR_PEER, pp_transport_send(m, &k, x), "refused our CURVE key");
    assert_int_equal(pp_transport_peer_state(m, 1), PP_PEER_REJECTED);
    assert_nothing_arrived(b, 1);
    pp_tensor_free(x);
    pp_transport_close(m);
    pp_transport_close(b);
}

/* A rank without CURVE at all (NULL mechanism). */
static void test_plain_peer_refused(void **state) {
    (void)state;
    keypair k0 = new_keys(), k1 = new_keys();
    pp_transport *b = make_server("tcp", &k0, &k1, NULL, 0);
    pp_transport *p = make_client(b, &k0, &k1, 0);
    int64_t s[1] = {6};
    pp_tensor *x = tt_f32_seq(1, s, 0);
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 0, 0, 1, "x");
    pp_status st = pp_transport_send(p, &k, x);
    assert_true(st == PP_ERR_PEER || st == PP_ERR_TIMEOUT);
    assert_nothing_arrived(b, 0);
    pp_tensor_free(x);
    pp_transport_close(p);
    pp_transport_close(b);
}

static void raw_send_valid(void *sock) {
    Pippin__Envelope env = PIPPIN__ENVELOPE__INIT;
    Pippin__TensorMeta meta = PIPPIN__TENSOR_META__INIT, *ptr = &meta;
    int64_t shape[1] = {6};
    env.version = PP_PROTOCOL_VERSION;
    env.kind = PIPPIN__KIND__KIND_ACTIVATION;
    env.dst_stage = 1;
    env.n_tensors = 1;
    env.tensors = &ptr;
    meta.name = "x";
    meta.dtype = PP_F32;
    meta.n_shape = 1;
    meta.shape = shape;
    meta.nbytes = 24;
    meta.nframes = 1;
    uint8_t buf[128], data[24] = {0};
    size_t n = pippin__envelope__pack(&env, buf);
    zmq_send(sock, data, sizeof data, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(sock, buf, n, ZMQ_DONTWAIT);
}

/* Raw ZeroMQ strangers: plain, and CURVE with an unlisted key. Neither gets
 * a single message through. */
static void test_raw_strangers(void **state) {
    (void)state;
    keypair k0 = new_keys(), k1 = new_keys(), stranger = new_keys();
    pp_transport *b = make_server("tcp", &k0, &k1, NULL, 0);
    void *ctx = zmq_ctx_new();
    void *plain = zmq_socket(ctx, ZMQ_PUSH);
    void *curve = zmq_socket(ctx, ZMQ_PUSH);
    int zero = 0, one = 1;
    zmq_setsockopt(plain, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(curve, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(curve, ZMQ_CURVE_SERVERKEY, k1.pub, 40);
    zmq_setsockopt(curve, ZMQ_CURVE_PUBLICKEY, stranger.pub, 40);
    zmq_setsockopt(curve, ZMQ_CURVE_SECRETKEY, stranger.sec, 40);
    (void)one;
    assert_int_equal(zmq_connect(plain, pp_transport_endpoint(b)), 0);
    assert_int_equal(zmq_connect(curve, pp_transport_endpoint(b)), 0);
    for (int i = 0; i < 20; i++) {
        raw_send_valid(plain);
        raw_send_valid(curve);
    }
    assert_nothing_arrived(b, 1);
    pp_transport_stats st;
    pp_transport_stats_get(b, &st);
    assert_int_equal(st.dropped, 0); /* refused at the handshake: nothing to drop */
    zmq_close(plain);
    zmq_close(curve);
    zmq_ctx_term(ctx);
    pp_transport_close(b);
}

/* A key that is allowed in, but is not rank 0's, cannot speak for rank 0. */
static void test_allowed_key_cannot_spoof_rank(void **state) {
    (void)state;
    keypair k0 = new_keys(), k1 = new_keys(), tool = new_keys();
    const char *extra[1] = {tool.pub};
    pp_transport *b = make_server("tcp", &k0, &k1, extra, 1);
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_PUSH);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, k1.pub, 40);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, tool.pub, 40);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, tool.sec, 40);
    assert_int_equal(zmq_connect(s, pp_transport_endpoint(b)), 0);
    /* the handshake succeeds (the key is listed); the message claims rank 0 */
    Pippin__Envelope env = PIPPIN__ENVELOPE__INIT;
    env.version = PP_PROTOCOL_VERSION;
    env.kind = PIPPIN__KIND__KIND_ABORT;
    env.text = "spoofed abort";
    uint8_t buf[128];
    size_t n = pippin__envelope__pack(&env, buf);
    assert_true(zmq_send(s, buf, n, 0) >= 0);
    pp_transport_stats st;
    int64_t deadline = tt_now_ms() + 3000;
    do {
        TT_OK(pp_transport_poll(b, 20)); /* an accepted abort would fail here */
        pp_transport_stats_get(b, &st);
    } while (st.dropped == 0 && tt_now_ms() < deadline);
    assert_int_equal(st.dropped, 1);
    assert_int_equal(st.auth_failures, 0);
    zmq_close(s);
    zmq_ctx_term(ctx);
    pp_transport_close(b);
}

/* A client that has the wrong public key for the server cannot connect. */
static void test_wrong_server_key(void **state) {
    (void)state;
    keypair k0 = new_keys(), k1 = new_keys(), other = new_keys();
    pp_transport *b = make_server("tcp", &k0, &k1, NULL, 0);
    pp_transport *a = make_client(b, &k0, &other, 1);
    int64_t s[1] = {6};
    pp_tensor *x = tt_f32_seq(1, s, 0);
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 0, 0, 1, "x");
    pp_status st = pp_transport_send(a, &k, x);
    assert_true(st == PP_ERR_PEER || st == PP_ERR_TIMEOUT);
    assert_nothing_arrived(b, 0);
    pp_tensor_free(x);
    pp_transport_close(a);
    pp_transport_close(b);
}

static void test_curve_option_errors(void **state) {
    (void)state;
    keypair k0 = new_keys(), k1 = new_keys();
    const char *eps[2] = {"tcp://127.0.0.1:*", NULL};
    const char *rank_keys[2] = {k1.pub, k1.pub}; /* rank 0's entry is not its key */
    pp_transport_options o = curve_opts(0, eps, &k0, rank_keys);
    pp_transport *t;
    TT_FAILS(PP_ERR_INVALID, pp_transport_create(&o, &t), "does not belong");
    o.curve_rank_keys = NULL;
    TT_FAILS(PP_ERR_INVALID, pp_transport_create(&o, &t), "public key of every rank");
    const char *bad_keys[2] = {k0.pub, "garbage"};
    o.curve_rank_keys = bad_keys;
    TT_FAILS(PP_ERR_INVALID, pp_transport_create(&o, &t), "rank 1");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_functions),
        cmocka_unit_test(test_key_files),
        cmocka_unit_test(test_curve_link_tcp),
        cmocka_unit_test(test_curve_link_ipc),
        cmocka_unit_test(test_unlisted_key_refused),
        cmocka_unit_test(test_plain_peer_refused),
        cmocka_unit_test(test_raw_strangers),
        cmocka_unit_test(test_allowed_key_cannot_spoof_rank),
        cmocka_unit_test(test_wrong_server_key),
        cmocka_unit_test(test_curve_option_errors),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}

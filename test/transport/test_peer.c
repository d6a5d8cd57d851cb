/* Dead and silent peers (separate processes): errors name the rank and the
 * endpoint within a few heartbeat timeouts; nothing hangs. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport_internal.h"
#include "tt_util.h"

#include "test_filter.h"
#define TIMEOUT_MS 300

typedef struct peer_proc {
    pid_t pid;
    char endpoint[256];
    pp_transport *me;   /* rank 0, in this process */
} peer_proc;

static pp_transport_options opts(void) {
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.timeout_ms = TIMEOUT_MS;
    o.linger_ms = 200;
    o.nranks = 2;
    return o;
}

static void write_line(int fd, const char *s) {
    size_t n = strlen(s) + 1;
    if (write(fd, s, n) != (ssize_t)n) _exit(3);
}

static void read_line(int fd, char *buf, size_t cap) {
    size_t n = 0;
    while (n + 1 < cap) {
        if (read(fd, buf + n, 1) != 1) break;
        if (buf[n] == 0) return;
        n++;
    }
    buf[n] = 0;
}

/* The child: rank 1. It receives `receive` activations (if > 0), or sends
 * -receive gradients of 1 MiB (rank 0 is on this host: through the
 * shared-memory ring) filled with their microbatch number, then idles until
 * killed (20 s at most). */
static void child_main(int to_parent, int from_parent, int receive) {
    alarm(20);
    pp_transport_options o = opts();
    const char *eps[2] = {NULL, "tcp://127.0.0.1:*"};
    o.rank = 1;
    o.endpoints = eps;
    o.timeout_ms = 5000;
    pp_transport *t;
    if (pp_transport_create(&o, &t) != PP_OK) _exit(2);
    write_line(to_parent, pp_transport_endpoint(t));
    char ep[256];
    read_line(from_parent, ep, sizeof ep);
    if (pp_transport_connect_peer(t, 0, ep) != PP_OK) _exit(2);
    for (int m = 0; m < receive; m++) {
        pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, m, 0, 1, "x");
        pp_tensor *got;
        if (pp_transport_recv(t, &k, 10000, &got) != PP_OK) break;
        pp_tensor_free(got);
    }
    if (receive < 0) {
        if (pp_transport_wait_peers(t, 5000) != PP_OK) _exit(2);
        for (int i = 0; i < 500 && !pp_transport_peer_shm(t, 0); i++) pp_transport_poll(t, 10);
        int64_t shape[1] = {1 << 18};
        for (int m = 0; m < -receive; m++) {
            pp_tensor *g;
            if (pp_tensor_new(PP_F32, 1, shape, &g) != PP_OK) _exit(2);
            for (int64_t i = 0; i < shape[0]; i++) ((float *)g->data)[i] = (float)m;
            pp_transport_key k = tt_key(PP_MSG_GRADIENT, 0, m, 1, 0, "g");
            if (pp_transport_send(t, &k, g) != PP_OK) _exit(2);
            pp_tensor_free(g);
        }
    }
    for (;;) pause();
}

static void start_peer(peer_proc *p, int receive) {
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        close(up[0]);
        close(down[1]);
        child_main(up[1], down[0], receive);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    read_line(up[0], p->endpoint, sizeof p->endpoint);
    assert_true(strncmp(p->endpoint, "tcp://", 6) == 0);
    pp_transport_options o = opts();
    const char *eps[2] = {"tcp://127.0.0.1:*", p->endpoint};
    o.endpoints = eps;
    TT_OK(pp_transport_create(&o, &p->me));
    write_line(down[1], pp_transport_endpoint(p->me));
    close(up[0]);
    close(down[1]);
    TT_OK(pp_transport_wait_peers(p->me, 5000));
    assert_int_equal(pp_transport_peer_state(p->me, 1), PP_PEER_UP);
}

static void stop_peer(peer_proc *p) {
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
    int64_t t0 = tt_now_ms();
    pp_transport_close(p->me);
    assert_true(tt_now_ms() - t0 < 2000);
}

/* Waits for a gradient from rank 1 with a long deadline; the peer's failure
 * must cut it short. */
static void expect_peer_error(peer_proc *p, const char *why) {
    pp_transport_key k = tt_key(PP_MSG_GRADIENT, 0, 0, 1, 0, "g");
    pp_tensor *got;
    int64_t t0 = tt_now_ms();
    TT_FAILS(PP_ERR_PEER, pp_transport_recv(p->me, &k, 30000, &got), "rank 1", p->endpoint, why);
    int64_t dt = tt_now_ms() - t0;
    if (dt >= 5 * TIMEOUT_MS) fail_msg("peer failure reported after %lld ms", (long long)dt);
}

static void test_killed_peer(void **state) {
    (void)state;
    peer_proc p;
    start_peer(&p, 0);
    kill(p.pid, SIGKILL);
    waitpid(p.pid, NULL, 0);
    p.pid = 0;
    expect_peer_error(&p, "unreachable");
    assert_int_equal(pp_transport_peer_state(p.me, 1), PP_PEER_DOWN);
    /* sending to it fails fast too */
    int64_t s[1] = {16};
    pp_tensor *x = tt_f32_seq(1, s, 0);
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 0, 0, 1, "x");
    int64_t t0 = tt_now_ms();
    TT_FAILS(PP_ERR_PEER, pp_transport_send(p.me, &k, x), "rank 1", p.endpoint);
    assert_true(tt_now_ms() - t0 < 5 * TIMEOUT_MS);
    pp_transport_stats st;
    pp_transport_stats_get(p.me, &st);
    assert_int_equal(st.peer_failures, 1);
    pp_tensor_free(x);
    stop_peer(&p);
}

/* SIGSTOP: the process is there, its sockets are open, it just says
 * nothing. Only heartbeats can tell. */
static void test_silent_peer(void **state) {
    (void)state;
    peer_proc p;
    start_peer(&p, 0);
    kill(p.pid, SIGSTOP);
    expect_peer_error(&p, "unreachable");
    stop_peer(&p);
}

/* The peer dies while big messages stream to it: the sender gets an error
 * within the timeout, never a hang. */
static void test_peer_dies_mid_stream(void **state) {
    (void)state;
    peer_proc p;
    start_peer(&p, 1000);
    int64_t s[1] = {4 << 20}; /* 16 MiB */
    pp_tensor *x = tt_f32_seq(1, s, 0);
    pp_status st = PP_OK;
    int m = 0;
    int64_t t_fail = 0;
    for (; m < 1000 && st == PP_OK; m++) {
        if (m == 3) {
            kill(p.pid, SIGKILL);
            waitpid(p.pid, NULL, 0);
            p.pid = 0;
            t_fail = tt_now_ms();
        }
        pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, m, 0, 1, "x");
        st = pp_transport_send(p.me, &k, x);
    }
    assert_true(st == PP_ERR_PEER || st == PP_ERR_TIMEOUT);
    tt_assert_mentions(pp_last_error(), "rank 1", p.endpoint, NULL);
    assert_true(tt_now_ms() - t_fail < 5 * TIMEOUT_MS);
    pp_tensor_free(x);
    stop_peer(&p);
}

/* Tensors received in place from a same-host peer's ring stay valid after
 * that peer is killed: the memory is ours until we free it. */
static void test_ring_tensors_outlive_sender(void **state) {
    (void)state;
    peer_proc p;
    start_peer(&p, -4);
    pp_tensor *got[4];
    for (int m = 0; m < 4; m++) {
        pp_transport_key k = tt_key(PP_MSG_GRADIENT, 0, m, 1, 0, "g");
        TT_OK(pp_transport_recv(p.me, &k, 5000, &got[m]));
    }
    pp_transport_stats st;
    pp_transport_stats_get(p.me, &st);
    assert_true(st.shm_bytes_received > 0); /* at least the later ones came through the ring */
    kill(p.pid, SIGKILL);
    waitpid(p.pid, NULL, 0);
    p.pid = 0;
    for (int m = 0; m < 4; m++) {
        const float *d = got[m]->data;
        assert_true(d[0] == (float)m && d[(1 << 18) - 1] == (float)m);
        pp_tensor_free(got[m]);
    }
    stop_peer(&p);
}

/* Close returns within linger even with data queued to a stopped peer. */
static void test_close_with_stopped_peer(void **state) {
    (void)state;
    peer_proc p;
    start_peer(&p, 0);
    kill(p.pid, SIGSTOP);
    int64_t s[1] = {1 << 18};
    pp_tensor *x = tt_f32_seq(1, s, 0);
    for (int m = 0; m < 200; m++) {
        pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, m, 0, 1, "x");
        if (pp_transport_send(p.me, &k, x) != PP_OK) break;
    }
    pp_tensor_free(x);
    int64_t t0 = tt_now_ms();
    pp_transport_close(p.me);
    assert_true(tt_now_ms() - t0 < 2000);
    kill(p.pid, SIGKILL);
    waitpid(p.pid, NULL, 0);
}

/* Regression: the receive (PULL) socket sends no heartbeats of its own.
 * libzmq 4.3.4 aborts the process (Assertion failed: !_io_error,
 * stream_engine_base.cpp:331; zeromq/libzmq#4364) when a receiving
 * connection that stopped reading sees its peer hang up and then its
 * heartbeat timer fires: a rank closing its transport in a rejoin while its
 * peers still sent died of SIGABRT (test/fault/rejoin.sh under ASan). The
 * peers' liveness keeps coming from the PUSH side (the tests above). */
static void test_receive_socket_sends_no_heartbeats(void **state) {
    (void)state;
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.timeout_ms = TIMEOUT_MS;
    pp_transport *t[2];
    tt_make_ranks("ipc", 2, &o, t);
    for (int r = 0; r < 2; r++) {
        int ivl = -1;
        size_t len = sizeof ivl;
        assert_int_equal(zmq_getsockopt(t[r]->pull, ZMQ_HEARTBEAT_IVL, &ivl, &len), 0);
        assert_int_equal(ivl, 0);
        assert_int_equal(zmq_getsockopt(t[r]->peers[1 - r].push, ZMQ_HEARTBEAT_IVL, &ivl, &len), 0);
        assert_true(ivl > 0);
    }
    tt_close_ranks(2, t);
}

/* pippin's own context copies small frames out of libzmq's read buffer
 * (ZMQ_ZERO_COPY_RECV off, transport/context.c): an envelope frame left
 * pinning that buffer made libzmq malloc another between the large data
 * frames, and glibc then trimmed and re-faulted the receive buffers. A
 * caller's context is not changed; messages small and large still arrive
 * whole over tcp. */
static void test_own_context_copies_small_frames(void **state) {
    (void)state;
    void *user = zmq_ctx_new();
    assert_non_null(user);
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.timeout_ms = 5000;
    o.shm_bytes = -1; /* the socket path */
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    assert_int_equal(zmq_ctx_get(pp_zctx_handle(t[0]->zctx), 10 /* ZMQ_ZERO_COPY_RECV */), 0);
    pp_transport_options u = o;
    u.zmq_context = user;
    pp_transport *tu[2];
    tt_make_ranks("tcp", 2, &u, tu);
    assert_ptr_equal(pp_zctx_handle(tu[0]->zctx), user);
    assert_int_equal(zmq_ctx_get(user, 10), 1);
    int64_t sizes[3] = {16, 3000, 1 << 18}; /* inline, a frame of its own, zero-copy */
    for (int i = 0; i < 3; i++) {
        pp_tensor *x = tt_f32_seq(1, &sizes[i], (float)i);
        pp_transport_key k = {PP_MSG_ACTIVATION, 0, i, 0, 1, "x"};
        TT_OK(pp_transport_send(t[0], &k, x));
        pp_tensor *got;
        TT_OK(pp_transport_recv(t[1], &k, -1, &got));
        tt_assert_same(got, x);
        pp_tensor_free(got);
        pp_tensor_free(x);
    }
    tt_close_ranks(2, tu);
    tt_close_ranks(2, t);
    zmq_ctx_term(user);
}

/* A batch is built in its wire form as messages are held back and handed
 * to libzmq as it is (no second packing): the frame must be byte for byte
 * what packing the batch envelope whole gives, with entries whose lengths
 * take 1, 2 and 3 bytes, and it stops at 48 KiB. */
static void test_batch_frame_built_in_place(void **state) {
    (void)state;
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.timeout_ms = 5000;
    pp_transport *t[2];
    tt_make_ranks("inproc", 2, &o, t);
    static uint8_t data[16000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + 1);
    /* entry lengths take 1-, 2- and 3-byte varints */
    const size_t sizes[6] = {8, 400, 16000, 16000, 16000, 16000};
    static uint8_t packed[6][17000];
    pp_envelope_part parts[6];
    int held = 0;
    for (int i = 0; i < 6; i++) {
        pp_wire_tensor wt = {"x", PP_U8, 1, {(int64_t)sizes[i]}, sizes[i], 0, PP_PLACE_INLINE, 0};
        pp_envelope env = {0};
        env.version = PP_PROTOCOL_VERSION;
        env.kind = PP_MSG_ACTIVATION;
        env.run_id = t[0]->run_id;
        env.step = 3;
        env.microbatch = i;
        env.src_stage = 0;
        env.dst_stage = 1;
        env.src_rank = 0;
        env.seq = (uint64_t)i + 1;
        env.ntensors = 1;
        env.tensors = &wt;
        env.text = "";
        env.inline_data = data;
        env.inline_bytes = sizes[i];
        env.shm_name = "";
        env.sender_nonce = t[0]->nonce;
        TT_OK(pp_envelope_pack(&env, packed[i], sizeof packed[i], &parts[i].len));
        parts[i].data = packed[i];
        if (!pp_tp_hold(t[0], 1, &env)) break;
        held++;
    }
    assert_int_equal(held, 5); /* the sixth would go past 48 KiB */
    assert_int_equal(t[0]->peers[1].obox_n, 5);
    t[0]->peers[1].seq = 5;
    zmq_msg_t m;
    TT_OK(pp_tp_take_held(t[0], 1, &m));
    assert_int_equal(t[0]->peers[1].obox_n, 0);
    pp_envelope b = {0};
    b.version = PP_PROTOCOL_VERSION;
    b.kind = (pp_msg_kind)PP_WIRE_KIND_BATCH;
    b.run_id = t[0]->run_id;
    b.src_rank = 0;
    b.seq = 5;
    b.text = "";
    b.shm_name = "";
    b.sender_nonce = t[0]->nonce;
    b.nbatch = 5;
    b.batch = parts;
    static uint8_t want[50000];
    size_t want_len;
    TT_OK(pp_envelope_pack(&b, want, sizeof want, &want_len));
    assert_int_equal(zmq_msg_size(&m), want_len);
    assert_true(want_len <= 48u << 10 && want_len + parts[5].len > 48u << 10);
    assert_memory_equal(zmq_msg_data(&m), want, want_len);
    pp_envelope got;
    TT_OK(pp_envelope_decode(zmq_msg_data(&m), zmq_msg_size(&m), NULL, &got));
    assert_int_equal(got.nbatch, 5);
    for (int i = 0; i < 5; i++) {
        pp_envelope e;
        TT_OK(pp_envelope_decode_entry(got.batch[i].data, got.batch[i].len, NULL, &e));
        assert_int_equal(e.microbatch, i);
        assert_int_equal(e.inline_bytes, sizes[i]);
        assert_memory_equal(e.inline_data, data, sizes[i]);
        pp_envelope_clear(&e);
    }
    pp_envelope_clear(&got);
    zmq_msg_close(&m);
    tt_close_ranks(2, t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_peer),
        cmocka_unit_test(test_silent_peer),
        cmocka_unit_test(test_peer_dies_mid_stream),
        cmocka_unit_test(test_ring_tensors_outlive_sender),
        cmocka_unit_test(test_close_with_stopped_peer),
        cmocka_unit_test(test_receive_socket_sends_no_heartbeats),
        cmocka_unit_test(test_own_context_copies_small_frames),
        cmocka_unit_test(test_batch_frame_built_in_place),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}

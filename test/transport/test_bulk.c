/* Bulk lanes (transport/bulk_lane.h, transport_bulk.c): large tensors to
 * another host over a TCP connection of their own. The lane comes up after
 * the first large tensor and carries the following ones intact, alone or
 * beside small and framed tensors, also to a rank bound to every
 * interface; it stays off when asked; a message the
 * receiver drops has its bytes read past; a message whose bytes have not
 * come is parked (bulk_park.c) while other peers' messages go on, in its
 * peer's order, within the timeout and the caps; the two ends on their
 * own: the reader's checks of what the lane says (also read in pieces),
 * and the writer's failure when the other end goes. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bulk_lane.h"
#include "transport_internal.h"
#include "direct_tcp.h"
#include "tt_util.h"

#include "test_filter.h"

static pp_transport_options opts(int bulk) {
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.timeout_ms = 5000;
    o.linger_ms = 500;
    o.shm_bytes = -1; /* as between hosts */
    o.bulk_lanes = bulk;
    return o;
}

static void expect_recv(pp_transport *t, const pp_transport_key *k, const pp_tensor *want) {
    pp_tensor *got;
    TT_OK(pp_transport_recv(t, k, 5000, &got));
    tt_assert_same(got, want);
    pp_tensor_free(got);
}

/* Sends 1 MiB tensors from rank 0 to rank 1 (microbatches from *mb on)
 * until one went over the lane: `tries` of them, or with tries 0 for up
 * to 10 s (a count of 20 was too few once for a sanitizer on a loaded
 * machine). Returns whether one did. */
static int send_until_lane(pp_transport **t, int *mb, int tries) {
    int64_t shape[1] = {1 << 18};
    pp_tensor *x = tt_f32_seq(1, shape, 7.0f);
    pp_transport_stats st;
    int64_t t0 = tt_now_ms();
    for (int i = 0; tries ? i < tries : tt_now_ms() - t0 < 10000; i++) {
        pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, (*mb)++, 0, 1, "x");
        TT_OK(pp_transport_send(t[0], &k, x));
        expect_recv(t[1], &k, x);
        TT_OK(pp_transport_poll(t[0], 10)); /* the offer */
        pp_transport_stats_get(t[1], &st);
        if (st.bulk_bytes_received) break;
    }
    pp_tensor_free(x);
    return st.bulk_bytes_received > 0;
}

static int bring_up(pp_transport **t, int *mb) { return send_until_lane(t, mb, 0); }

static void test_lane_carries_large_tensors(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    int mb = 0;
    assert_true(bring_up(t, &mb));
    pp_transport_stats s0, s1, a0, a1;
    pp_transport_stats_get(t[0], &s0);
    pp_transport_stats_get(t[1], &s1);
    /* one 16 MiB tensor; then a message of two lane tensors, a small one
     * (inline) and a framed one (under the lane's minimum) */
    int64_t big[1] = {4 << 20}, half[1] = {128 << 10}, small[1] = {16}, mid[1] = {32 << 10};
    pp_tensor *x = tt_f32_seq(1, big, 1.0f);
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, mb++, 0, 1, "big");
    TT_OK(pp_transport_send(t[0], &k, x));
    expect_recv(t[1], &k, x);
    pp_tensor *xs[4] = {tt_f32_seq(1, half, 2.0f), tt_f32_seq(1, small, 3.0f), tt_f32_seq(1, half, 4.0f),
                        tt_f32_seq(1, mid, 5.0f)};
    const char *names[4] = {"a", "b", "c", "d"};
    pp_transport_key kv = tt_key(PP_MSG_ACTIVATION, 0, mb++, 0, 1, "a");
    TT_OK(pp_transport_sendv(t[0], &kv, 4, names, xs));
    for (int i = 0; i < 4; i++) {
        pp_transport_key ki = tt_key(PP_MSG_ACTIVATION, 0, mb - 1, 0, 1, names[i]);
        expect_recv(t[1], &ki, xs[i]);
    }
    pp_transport_stats_get(t[0], &a0);
    pp_transport_stats_get(t[1], &a1);
    uint64_t lane = x->nbytes + xs[0]->nbytes + xs[2]->nbytes;
    assert_int_equal(a0.bulk_bytes_sent - s0.bulk_bytes_sent, lane);
    assert_int_equal(a1.bulk_bytes_received - s1.bulk_bytes_received, lane);
    assert_int_equal(a1.dropped, s1.dropped);
    pp_tensor_free(x);
    for (int i = 0; i < 4; i++) pp_tensor_free(xs[i]);
    tt_close_ranks(2, t);
}

/* Both ways at once, several queued before the other side reads: each
 * rank's writer moves its bytes while the rank itself waits to receive. */
/* A rank bound to every interface (bind_endpoint "tcp://" "*:...", as the
 * config example binds) while peers connect to its address in the list:
 * its lane listens on every interface and its offer names that address
 * (before, it offered no lane: "not bound to one tcp address"). */
static void test_lane_with_wildcard_bind(void **state) {
    (void)state;
    pp_transport_options o[2] = {opts(1), opts(1)};
    pp_transport *t[2];
    tt_make_pair_reached_at(o, "tcp://127.0.0.1:*", "tcp://*:*", "127.0.0.1", t);
    assert_non_null(strstr(pp_transport_endpoint(t[1]), "0.0.0.0:")); /* bound to every interface */
    char offer[PP_DIRECT_OFFER_CAP];
    pp_direct_listener *l;
    TT_OK(pp_direct_listen(t[1], 7, 0, offer, &l));
    assert_true(strncmp(offer, "tcp 127.0.0.1 ", 14) == 0);
    pp_direct_listener_free(l);
    int mb = 0;
    assert_true(bring_up(t, &mb));
    tt_close_ranks(2, t);
}

static void test_lanes_both_ways(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    int mb = 0;
    assert_true(bring_up(t, &mb));
    pp_transport *rev[2] = {t[1], t[0]};
    int mb_rev = 0;
    /* the reverse lane: rank 1 sends gradients to rank 0 */
    int64_t shape[1] = {1 << 18};
    pp_tensor *x = tt_f32_seq(1, shape, 9.0f);
    pp_transport_stats st;
    for (int i = 0; i < 20; i++) {
        pp_transport_key k = tt_key(PP_MSG_GRADIENT, 0, mb_rev++, 1, 0, "g");
        TT_OK(pp_transport_send(rev[0], &k, x));
        expect_recv(rev[1], &k, x);
        TT_OK(pp_transport_poll(rev[0], 10));
        pp_transport_stats_get(t[0], &st);
        if (st.bulk_bytes_received) break;
    }
    assert_true(st.bulk_bytes_received > 0);
    for (int i = 0; i < 8; i++) {
        pp_transport_key ka = tt_key(PP_MSG_ACTIVATION, 1, i, 0, 1, "x");
        pp_transport_key kg = tt_key(PP_MSG_GRADIENT, 1, i, 1, 0, "g");
        TT_OK(pp_transport_send(t[0], &ka, x));
        TT_OK(pp_transport_send(t[1], &kg, x));
    }
    for (int i = 0; i < 8; i++) {
        pp_transport_key ka = tt_key(PP_MSG_ACTIVATION, 1, i, 0, 1, "x");
        pp_transport_key kg = tt_key(PP_MSG_GRADIENT, 1, i, 1, 0, "g");
        expect_recv(t[1], &ka, x);
        expect_recv(t[0], &kg, x);
    }
    pp_tensor_free(x);
    tt_close_ranks(2, t);
}

static void test_lanes_off(void **state) {
    (void)state;
    pp_transport_options o = opts(-1);
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    int mb = 0;
    assert_false(send_until_lane(t, &mb, 20)); /* 20 tensors, all in frames */
    pp_transport_stats st;
    pp_transport_stats_get(t[0], &st);
    assert_int_equal(st.bulk_bytes_sent, 0);
    tt_close_ranks(2, t);
}

/* bulk_lanes off on the receiving rank alone: it offers no lane (a
 * firewall may pass only the transport's ports), and the sender keeps to
 * frames. */
static void test_receiver_off_offers_none(void **state) {
    (void)state;
    pp_transport *t[2];
    char eps[2][256];
    for (int r = 0; r < 2; r++) {
        pp_transport_options o = opts(r == 1 ? -1 : 0);
        const char *list[2] = {NULL, NULL};
        tt_endpoint("tcp", r, eps[r], sizeof eps[r]);
        list[r] = eps[r];
        o.rank = r;
        o.nranks = 2;
        o.endpoints = list;
        TT_OK(pp_transport_create(&o, &t[r]));
    }
    for (int r = 0; r < 2; r++) TT_OK(pp_transport_connect_peer(t[r], 1 - r, pp_transport_endpoint(t[1 - r])));
    tt_handshake(2, t);
    int mb = 0;
    assert_false(send_until_lane(t, &mb, 20)); /* 20 tensors, all in frames, all intact */
    pp_transport_stats st;
    pp_transport_stats_get(t[0], &st);
    assert_int_equal(st.bulk_bytes_sent, 0);
    tt_close_ranks(2, t);
}

/* A message the receiver drops (a step before its current one) after its
 * bytes went on the lane: they are read past, and the next message's
 * tensor arrives intact. */
static void test_dropped_message_read_past(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    int mb = 0;
    assert_true(bring_up(t, &mb));
    TT_OK(pp_transport_set_step(t[1], 3));
    pp_transport_stats before, after;
    pp_transport_stats_get(t[1], &before);
    int64_t shape[1] = {1 << 18};
    pp_tensor *stale = tt_f32_seq(1, shape, 100.0f), *good = tt_f32_seq(1, shape, 200.0f);
    pp_transport_key ks = tt_key(PP_MSG_ACTIVATION, 1, 0, 0, 1, "x");
    pp_transport_key kg = tt_key(PP_MSG_ACTIVATION, 3, 0, 0, 1, "x");
    TT_OK(pp_transport_send(t[0], &ks, stale));
    TT_OK(pp_transport_send(t[0], &kg, good));
    expect_recv(t[1], &kg, good);
    pp_transport_stats_get(t[1], &after);
    assert_int_equal(after.dropped, before.dropped + 1);
    assert_int_equal(after.bulk_bytes_received - before.bulk_bytes_received, good->nbytes);
    pp_tensor_free(stale);
    pp_tensor_free(good);
    tt_close_ranks(2, t);
}

/* The lane fails under a sender (the receiver's end cut): tensors already
 * in it may be lost with it, but every send succeeds and the later ones go
 * in frames. (The writer's failure is mostly seen when a tensor is placed;
 * in the narrow window after placing, the push sees it and the message
 * goes again in frames: transport_send.c, not reached here every run.) */
static void test_lane_failure_falls_back_to_frames(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    o.timeout_ms = 2000;
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    int mb = 0;
    assert_true(bring_up(t, &mb));
    assert_true(t[1]->peers[0].bulk_rx.fd >= 0);
    shutdown(t[1]->peers[0].bulk_rx.fd, SHUT_RDWR);
    int64_t shape[1] = {1 << 18};
    enum { N = 6 };
    pp_tensor *x[N];
    for (int i = 0; i < N; i++) {
        x[i] = tt_f32_seq(1, shape, (float)(10 * i));
        pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, mb + i, 0, 1, "x");
        TT_OK(pp_transport_send(t[0], &k, x[i])); /* never a failure: frames when the lane is gone */
        /* the tensor written (or the lane failed) before the next: a writer
         * thread a loaded machine had not run let later ones join a dead
         * lane's queue */
        for (int64_t t0 = tt_now_ms(); tt_now_ms() - t0 < 5000;) {
            pp_bulk_tx *tx = t[0]->peers[1].bulk_tx;
            if (!tx || pp_bulk_tx_queued(tx) == 0 || pp_bulk_tx_error(tx)[0] || pp_tp_bulk_failed(t[0], 1)) break;
            usleep(1000);
        }
        usleep(20000); /* the cut reaches the sender's socket */
    }
    pp_transport_stats st;
    pp_transport_stats_get(t[0], &st);
    uint64_t lane_sent = st.bulk_bytes_sent;
    int got = 0;
    for (int i = 0; i < N; i++) {
        pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, mb + i, 0, 1, "x");
        pp_tensor *y = NULL;
        if (pp_transport_recv(t[1], &k, i < 2 ? 300 : 5000, &y) == PP_OK) { /* the first ones may be lost */
            tt_assert_same(y, x[i]);
            got++;
        } else if (i >= 2) {
            fail_msg("tensor %d after the lane failed: %s", i, pp_last_error());
        }
        pp_tensor_free(y);
    }
    assert_true(got >= N - 2);
    /* the later ones went in frames */
    pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, mb + N, 0, 1, "x");
    TT_OK(pp_transport_send(t[0], &k, x[0]));
    expect_recv(t[1], &k, x[0]);
    pp_transport_stats_get(t[0], &st);
    assert_int_equal(st.bulk_bytes_sent, lane_sent);
    for (int i = 0; i < N; i++) pp_tensor_free(x[i]);
    tt_close_ranks(2, t);
}

/* Strangers connecting to a lane's port after the expected sender (its
 * hello sent) cannot push it out: with 8 connections waiting the
 * listener reads their hellos first and closes newcomers (before, the 9th
 * connection evicted the oldest, the sender's, unread, and the receiving
 * rank then waited out its timeout). */
static void test_strangers_cannot_evict_the_sender(void **state) {
    (void)state;
    pp_transport_options o = opts(1);
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    char offer[PP_DIRECT_OFFER_CAP];
    pp_direct_listener *l;
    TT_OK(pp_direct_listen(t[1], 0x42000000u, 0, offer, &l));
    pp_direct_conn *c;
    TT_OK(pp_direct_connect_start(t[0], offer, 0x42000000u, 0, 1, &c));
    int sender = -1;
    TT_OK(pp_direct_connect_finish(c, 2000, &sender));
    assert_true(sender >= 0); /* connected, hello sent */
    char host[64];
    int port;
    assert_int_equal(sscanf(offer, "tcp %63s %d", host, &port), 2);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &sa.sin_addr);
    int strangers[12];
    for (int i = 0; i < 12; i++) {
        strangers[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0); /* the backlog may be full */
        int rc = connect(strangers[i], (struct sockaddr *)&sa, sizeof sa);
        assert_true(rc == 0 || errno == EINPROGRESS);
    }
    int fd = -1;
    TT_OK(pp_direct_accept(l, 2000, &fd));
    assert_true(fd >= 0);
    close(fd);
    for (int i = 0; i < 12; i++) close(strangers[i]);
    close(sender);
    pp_direct_conn_free(c);
    pp_direct_listener_free(l);
    tt_close_ranks(2, t);
}

/* An offer's host is not followed: the link goes to the host this rank
 * reaches the offering one at (its endpoint), at the offered port. Here
 * the offer names a documentation address (192.0.2.7, nobody's) and the
 * link still comes up, to rank 1; a rank past the handshake cannot point
 * another's lane at some other machine. (Before, the offer's host was
 * checked against the endpoint's, names looked up on each side, and a
 * host name Debian maps to 127.0.1.1 on its own host turned lanes off.) */
static void test_offer_host_not_followed(void **state) {
    (void)state;
    pp_transport_options o = opts(1);
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    char offer[PP_DIRECT_OFFER_CAP], elsewhere[PP_DIRECT_OFFER_CAP], host[64], port[8], nonce[40];
    pp_direct_listener *l;
    TT_OK(pp_direct_listen(t[1], 0x42000000u, 0, offer, &l));
    assert_int_equal(sscanf(offer, "tcp %63s %7s %39s", host, port, nonce), 3);
    snprintf(elsewhere, sizeof elsewhere, "tcp 192.0.2.7 %s %s", port, nonce);
    assert_true(pp_direct_offer_valid(elsewhere));
    pp_direct_conn *c;
    TT_OK(pp_direct_connect_start(t[0], elsewhere, 0x42000000u, 0, 1, &c));
    int out = -1, in = -1;
    for (int i = 0; i < 200 && (out < 0 || in < 0); i++) {
        if (out < 0) TT_OK(pp_direct_connect_finish(c, 10, &out));
        if (in < 0) TT_OK(pp_direct_accept(l, 10, &in));
    }
    assert_true(out >= 0 && in >= 0);
    close(out);
    close(in);
    pp_direct_conn_free(c);
    pp_direct_listener_free(l);
    TT_FAILS(PP_ERR_INVALID, pp_direct_connect_start(t[0], offer, 0x42000000u, 0, 7, &c), "rank 7",
             "no such rank");
    tt_close_ranks(2, t);
}

/* A rank listed by a host name ("localhost"): the lane goes to that name
 * looked up for IPv4, as libzmq resolves it, so a resolver that lists ::1
 * first for localhost (Debian's /etc/hosts does) does not send it to an
 * address nobody listens on. */
static void test_lane_to_a_named_host(void **state) {
    (void)state;
    pp_transport_options o[2] = {opts(1), opts(1)};
    pp_transport *t[2];
    tt_make_pair_reached_at(o, "tcp://127.0.0.1:*", NULL, "localhost", t);
    int mb = 0;
    assert_true(bring_up(t, &mb));
    tt_close_ranks(2, t);
}

/* A message whose bytes went on the lane but whose envelope then could
 * not go (the receiver's queue full, the send timed out): the next large
 * message's tensor is read intact past those bytes, never taken for them
 * (the failed message's sequence number stays spent). */
static void test_orphan_bytes_read_past(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    o.heartbeat_timeout_ms = 30000; /* a full queue stops the heartbeats' answers too */
    o.sndhwm = o.rcvhwm = 1;
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    int mb = 0;
    assert_true(bring_up(t, &mb)); /* with the long timeout: a slow (sanitized) build's lane comes up in time */
    t[0]->timeout_ms = t[1]->timeout_ms = 300;
    /* rank 1 stops receiving: small messages until a send times out */
    int64_t one[1] = {256};
    pp_tensor *small = tt_f32_seq(1, one, 0.0f);
    int nsmall = 0;
    pp_status s = PP_OK;
    while (s == PP_OK && nsmall < 200000) {
        pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 100000 + nsmall, 0, 1, "s");
        s = pp_transport_send(t[0], &k, small);
        if (s == PP_OK) nsmall++;
    }
    if (s != PP_ERR_TIMEOUT) fail_msg("%d: %s", s, pp_last_error());
    int64_t shape[1] = {1 << 16};
    pp_tensor *lost = tt_f32_seq(1, shape, -5.0f), *good = tt_f32_seq(1, shape, 5.0f);
    pp_transport_key kl = tt_key(PP_MSG_ACTIVATION, 2, 0, 0, 1, "x");
    /* its envelope times out; on a loaded machine libzmq's I/O thread may
     * make room first and it goes after all: then it arrives whole, and
     * what follows must still be intact */
    s = pp_transport_send(t[0], &kl, lost);
    int orphaned = s != PP_OK;
    if (orphaned && s != PP_ERR_TIMEOUT) fail_msg("the lost message's send: %d: %s", s, pp_last_error());
    /* rank 1 takes what came, then a large message after the lost one */
    for (int i = 0; i < nsmall; i++) {
        pp_transport_key k = tt_key(PP_MSG_ACTIVATION, 0, 100000 + i, 0, 1, "s");
        expect_recv(t[1], &k, small);
    }
    if (!orphaned) expect_recv(t[1], &kl, lost);
    pp_transport_stats before, after;
    pp_transport_stats_get(t[1], &before);
    pp_transport_key kg = tt_key(PP_MSG_ACTIVATION, 2, 1, 0, 1, "x");
    TT_OK(pp_transport_send(t[0], &kg, good));
    expect_recv(t[1], &kg, good);
    pp_transport_stats_get(t[1], &after);
    assert_int_equal(after.bulk_bytes_received - before.bulk_bytes_received, good->nbytes);
    assert_int_equal(after.dropped, before.dropped);
    pp_tensor *none = NULL;
    TT_OK(pp_transport_take(t[1], &kl, &none));
    assert_null(none);
    if (!orphaned) fprintf(stderr, "# the lost message's envelope went after all: orphan bytes not exercised\n");
    pp_tensor_free(small);
    pp_tensor_free(lost);
    pp_tensor_free(good);
    tt_close_ranks(2, t);
}

/* ---- parking: a message whose lane bytes have not come waits aside ---- */

/* Sends 1 MiB tensors from rank `from` to rank `to` (stage n runs on rank
 * n) until one went over the lane: at most 20. Returns whether one did. */
static int bring_up_lane(pp_transport **t, int from, int to, int *mb) {
    int64_t shape[1] = {1 << 18};
    pp_tensor *x = tt_f32_seq(1, shape, 7.0f);
    pp_msg_kind kind = from < to ? PP_MSG_ACTIVATION : PP_MSG_GRADIENT;
    int up = 0;
    for (int i = 0; i < 20 && !up; i++) {
        pp_transport_key k = tt_key(kind, 0, (*mb)++, from, to, "x");
        TT_OK(pp_transport_send(t[from], &k, x));
        expect_recv(t[to], &k, x);
        TT_OK(pp_transport_poll(t[from], 10)); /* the offer */
        up = t[from]->peers[to].bulk_tx != NULL;
    }
    pp_tensor_free(x);
    return up;
}

/* Polls rank `at` (never waiting) until it has n messages from rank r
 * parked: at most 1000 passes (each a 1 ms pause). */
static void poll_until_parked(pp_transport *at, int r, int n) {
    for (int i = 0; i < 1000 && at->peers[r].park_n < n; i++) {
        TT_OK(pp_transport_poll(at, 0));
        if (at->peers[r].park_n < n) usleep(1000);
    }
    assert_int_equal(at->peers[r].park_n, n);
}

/* Ranks 0, 1, 2; rank 1's lane to rank 0 up and held (its writer writes
 * nothing: pp_bulk_tx_hold), so the envelope of what it sends comes before
 * the bytes. */
static pp_bulk_tx *three_ranks_one_held(pp_transport **t, pp_transport_options *o) {
    tt_make_ranks("tcp", 3, o, t);
    int mb = 0;
    assert_true(bring_up_lane(t, 1, 0, &mb));
    pp_bulk_tx *tx = t[1]->peers[0].bulk_tx;
    pp_bulk_tx_hold(tx, 1);
    return tx;
}

/* Rank 1 sends rank 0 a 64 MiB tensor whose bytes are held back; rank 0
 * parks it, and takes rank 2's small messages meanwhile (before, it read
 * the lane when it handled the envelope and waited there for the bytes,
 * up to its timeout, holding up every other peer). pp_transport_poll with
 * no timeout returns while the bytes are missing, and the tensor arrives
 * intact once they come, also while rank 2's messages keep coming. */
static void test_parked_tensor_holds_up_no_one(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    pp_transport *t[3];
    pp_bulk_tx *tx = three_ranks_one_held(t, &o);
    int64_t big_shape[1] = {16 << 20}, small_shape[1] = {64};
    pp_tensor *big = tt_f32_seq(1, big_shape, 3.0f), *small = tt_f32_seq(1, small_shape, 9.0f);
    pp_transport_key kb = tt_key(PP_MSG_GRADIENT, 0, 1000, 1, 0, "big");
    TT_OK(pp_transport_send(t[1], &kb, big));
    poll_until_parked(t[0], 1, 1); /* every poll returned, no bytes on the lane */
    TT_OK(pp_transport_poll(t[0], 0)); /* and returns again, the message still parked */
    assert_int_equal(t[0]->peers[1].park_n, 1);
    pp_tensor *none = NULL;
    TT_OK(pp_transport_take(t[0], &kb, &none));
    assert_null(none);
    pp_transport_key ks = tt_key(PP_MSG_GRADIENT, 0, 0, 2, 0, "s");
    TT_OK(pp_transport_send(t[2], &ks, small));
    expect_recv(t[0], &ks, small);
    assert_int_equal(t[0]->peers[1].park_n, 1); /* still waiting for its bytes */
    pp_bulk_tx_hold(tx, 0);
    /* the bytes move now; rank 2's next message is taken whatever the
     * order, and the large tensor completes intact */
    pp_transport_key ks2 = tt_key(PP_MSG_GRADIENT, 0, 1, 2, 0, "s");
    TT_OK(pp_transport_send(t[2], &ks2, small));
    expect_recv(t[0], &ks2, small);
    expect_recv(t[0], &kb, big);
    assert_int_equal(t[0]->peers[1].park_n, 0);
    pp_transport_stats st;
    pp_transport_stats_get(t[0], &st);
    assert_int_equal(st.dropped, 0);
    pp_tensor_free(big);
    pp_tensor_free(small);
    tt_close_ranks(3, t);
}

/* A small message after a parked one from the same peer waits behind it:
 * it is not filed before the parked one is complete. */
static void test_parked_keeps_the_peers_order(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    pp_transport *t[3];
    pp_bulk_tx *tx = three_ranks_one_held(t, &o);
    int64_t big_shape[1] = {1 << 20}, small_shape[1] = {64};
    pp_tensor *big = tt_f32_seq(1, big_shape, 4.0f), *small = tt_f32_seq(1, small_shape, 5.0f);
    pp_transport_key kb = tt_key(PP_MSG_GRADIENT, 0, 1000, 1, 0, "big");
    pp_transport_key ks = tt_key(PP_MSG_GRADIENT, 0, 1001, 1, 0, "s");
    TT_OK(pp_transport_send(t[1], &kb, big));
    TT_OK(pp_transport_send(t[1], &ks, small));
    poll_until_parked(t[0], 1, 2);
    pp_tensor *none = NULL;
    TT_OK(pp_transport_take(t[0], &ks, &none));
    assert_null(none);
    pp_bulk_tx_hold(tx, 0);
    expect_recv(t[0], &ks, small);
    /* by then the large one was filed: it is in the mailbox */
    pp_tensor *y = NULL;
    TT_OK(pp_transport_take(t[0], &kb, &y));
    assert_non_null(y);
    tt_assert_same(y, big);
    pp_tensor_free(y);
    pp_tensor_free(big);
    pp_tensor_free(small);
    tt_close_ranks(3, t);
}

/* A parked message whose bytes never come: after timeout_ms the lane is
 * closed and the tensor dropped; the receive waiting for it fails naming
 * the peer and its lane, and the peer's later large tensors come in
 * frames. */
static void test_parked_bytes_never_come(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    o.timeout_ms = 1000;
    pp_transport *t[3];
    pp_bulk_tx *tx = three_ranks_one_held(t, &o);
    int64_t shape[1] = {1 << 18};
    pp_tensor *x = tt_f32_seq(1, shape, 6.0f);
    pp_transport_key kb = tt_key(PP_MSG_GRADIENT, 0, 1000, 1, 0, "x");
    TT_OK(pp_transport_send(t[1], &kb, x));
    poll_until_parked(t[0], 1, 1);
    pp_tensor *y = NULL;
    assert_int_equal(pp_transport_recv(t[0], &kb, 3000, &y), PP_ERR_TIMEOUT);
    tt_assert_mentions(pp_last_error(), "rank 1", "bulk lane", "did not come within 1000 ms", NULL);
    assert_int_equal(t[0]->peers[1].park_n, 0);
    assert_true(t[0]->peers[1].bulk_rx.fd < 0);
    pp_transport_stats st0;
    pp_transport_stats_get(t[0], &st0);
    assert_int_equal(st0.dropped, 1);
    /* the writer, let go, finds the lane closed */
    pp_bulk_tx_hold(tx, 0);
    int64_t until = tt_now_ms() + 5000;
    while (!*pp_bulk_tx_error(tx) && tt_now_ms() < until) {
        struct pollfd pf = {pp_bulk_tx_event_fd(tx), POLLIN, 0};
        poll(&pf, 1, 100);
        pp_bulk_tx_clear(tx);
    }
    assert_true(*pp_bulk_tx_error(tx) != 0);
    pp_transport_key k2 = tt_key(PP_MSG_GRADIENT, 0, 1001, 1, 0, "x");
    TT_OK(pp_transport_send(t[1], &k2, x));
    expect_recv(t[0], &k2, x);
    pp_transport_stats st1;
    pp_transport_stats_get(t[0], &st1);
    assert_int_equal(st1.bulk_bytes_received, st0.bulk_bytes_received); /* in frames */
    pp_tensor_free(x);
    tt_close_ranks(3, t);
}

/* A lane that closes under a parked message breaks at the next look, not
 * after the timeout: the tensor dropped, the peer and why named. */
static void test_parked_lane_closes(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    pp_transport *t[3];
    three_ranks_one_held(t, &o);
    int64_t shape[1] = {1 << 18};
    pp_tensor *x = tt_f32_seq(1, shape, 6.0f);
    pp_transport_key kb = tt_key(PP_MSG_GRADIENT, 0, 1000, 1, 0, "x");
    TT_OK(pp_transport_send(t[1], &kb, x));
    poll_until_parked(t[0], 1, 1);
    shutdown(t[0]->peers[1].bulk_rx.fd, SHUT_RD); /* reads now see the end of the stream */
    TT_OK(pp_transport_poll(t[0], 0));
    assert_int_equal(t[0]->peers[1].park_n, 0);
    tt_assert_mentions(t[0]->peers[1].bulk_fail, "closed", NULL);
    pp_tensor *y = NULL;
    assert_int_equal(pp_transport_recv(t[0], &kb, 100, &y), PP_ERR_TIMEOUT);
    tt_assert_mentions(pp_last_error(), "rank 1", "bulk lane broke", NULL);
    pp_transport_stats st;
    pp_transport_stats_get(t[0], &st);
    assert_int_equal(st.dropped, 1);
    pp_tensor_free(x);
    tt_close_ranks(3, t);
}

/* Parked messages count toward max_pending_bytes_per_peer as the mailbox
 * does: one behind a parked 1 MiB tensor that would take its peer over
 * the cap is dropped. */
static void test_parked_bytes_count_toward_the_cap(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    o.max_pending_bytes_per_peer = (3 << 20) / 2;
    pp_transport *t[3];
    pp_bulk_tx *tx = three_ranks_one_held(t, &o);
    int64_t shape[1] = {1 << 18};
    pp_tensor *x = tt_f32_seq(1, shape, 8.0f);
    pp_transport_key kb = tt_key(PP_MSG_GRADIENT, 0, 1000, 1, 0, "x");
    pp_transport_key k2 = tt_key(PP_MSG_GRADIENT, 0, 1001, 1, 0, "x");
    TT_OK(pp_transport_send(t[1], &kb, x));
    poll_until_parked(t[0], 1, 1);
    pp_transport_stats before, after;
    pp_transport_stats_get(t[0], &before);
    after = before;
    TT_OK(pp_transport_send(t[1], &k2, x));
    for (int i = 0; i < 1000 && after.dropped_over_cap == before.dropped_over_cap; i++) {
        TT_OK(pp_transport_poll(t[0], 1));
        pp_transport_stats_get(t[0], &after);
    }
    assert_int_equal(after.dropped_over_cap, before.dropped_over_cap + 1);
    pp_bulk_tx_hold(tx, 0);
    expect_recv(t[0], &kb, x);
    pp_tensor_free(x);
    tt_close_ranks(3, t);
}

static void *let_go_later(void *tx) {
    usleep(300000); /* the receiver is likely waiting by then; if not, nothing changes but the path taken */
    pp_bulk_tx_hold(tx, 0);
    return NULL;
}

/* More messages behind a parked one than one peer may park
 * (PP_PARK_MAX): the receiver waits for the first one's lane bytes as it
 * did before parking (here until another thread lets the writer go), only
 * until there is room again, and drops nothing; all arrive intact and in
 * order. The queue is seen full before the messages past the cap go. */
static void test_park_cap_waits_instead(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    pp_transport *t[3];
    pp_bulk_tx *tx = three_ranks_one_held(t, &o);
    int64_t big_shape[1] = {4 << 20}, small_shape[1] = {16};
    pp_tensor *big = tt_f32_seq(1, big_shape, 2.0f), *small = tt_f32_seq(1, small_shape, 1.0f);
    pp_transport_key kb = tt_key(PP_MSG_GRADIENT, 0, 1000, 1, 0, "big");
    TT_OK(pp_transport_send(t[1], &kb, big));
    enum { N = PP_PARK_MAX + 6 };
    for (int i = 0; i < PP_PARK_MAX - 1; i++) {
        pp_transport_key k = tt_key(PP_MSG_GRADIENT, 0, 2000 + i, 1, 0, "s");
        TT_OK(pp_transport_send(t[1], &k, small));
    }
    poll_until_parked(t[0], 1, PP_PARK_MAX); /* full: the big one and 63 behind it */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, let_go_later, tx), 0);
    for (int i = PP_PARK_MAX - 1; i < N; i++) { /* past the cap: the first is waited for */
        pp_transport_key k = tt_key(PP_MSG_GRADIENT, 0, 2000 + i, 1, 0, "s");
        TT_OK(pp_transport_send(t[1], &k, small));
    }
    expect_recv(t[0], &kb, big);
    pthread_join(th, NULL);
    for (int i = 0; i < N; i++) {
        pp_transport_key k = tt_key(PP_MSG_GRADIENT, 0, 2000 + i, 1, 0, "s");
        expect_recv(t[0], &k, small);
    }
    assert_int_equal(t[0]->peers[1].park_n, 0);
    pp_transport_stats st;
    pp_transport_stats_get(t[0], &st);
    assert_int_equal(st.dropped, 0);
    pp_tensor_free(big);
    pp_tensor_free(small);
    tt_close_ranks(3, t);
}

/* A parked tensor larger than the sockets hold, while the receiving rank
 * is away (computing) for longer than timeout_ms: the sender's writer
 * waits on a full socket meanwhile, and when the rank comes back the bytes
 * flow again. The tensor arrives whole: the clock runs from the last bytes
 * that came, not from the parking (found by review: the lane broke, "did
 * not come within 1000 ms", and the tensor was dropped). */
static void test_parked_receiver_away_longer_than_timeout(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    o.timeout_ms = 1000;
    pp_transport *t[3];
    pp_bulk_tx *tx = three_ranks_one_held(t, &o);
    int64_t shape[1] = {16 << 20}; /* 64 MiB */
    pp_tensor *x = tt_f32_seq(1, shape, 3.0f);
    pp_transport_key kb = tt_key(PP_MSG_GRADIENT, 0, 1000, 1, 0, "x");
    TT_OK(pp_transport_send(t[1], &kb, x));
    poll_until_parked(t[0], 1, 1);
    pp_bulk_tx_hold(tx, 0);
    usleep(1500000); /* away: no transport call for 1.5 timeouts */
    expect_recv(t[0], &kb, x);
    pp_transport_stats st;
    pp_transport_stats_get(t[0], &st);
    assert_int_equal(st.dropped, 0);
    pp_tensor_free(x);
    tt_close_ranks(3, t);
}

/* Closing with a message parked frees it (the sanitized build finds a
 * leak otherwise). */
static void test_close_with_a_parked_message(void **state) {
    (void)state;
    pp_transport_options o = opts(0);
    pp_transport *t[3];
    three_ranks_one_held(t, &o);
    int64_t shape[1] = {1 << 20};
    pp_tensor *x = tt_f32_seq(1, shape, 1.0f);
    pp_transport_key kb = tt_key(PP_MSG_GRADIENT, 0, 1000, 1, 0, "x");
    pp_transport_key ks = tt_key(PP_MSG_GRADIENT, 0, 1001, 1, 0, "s");
    TT_OK(pp_transport_send(t[1], &kb, x));
    TT_OK(pp_transport_send(t[1], &ks, x)); /* its bytes held behind the first's */
    poll_until_parked(t[0], 1, 2);
    assert_true(t[0]->n_parked == 2);
    pp_tensor_free(x);
    tt_close_ranks(3, t);
}

/* ---- the two ends alone, over a socket pair ---- */

static void put(int fd, uint64_t seq, uint32_t index, const void *data, uint64_t n, uint64_t claimed) {
    uint8_t head[PP_BULK_HEADER_BYTES];
    pp_bulk_header h = {index, seq, claimed};
    pp_bulk_header_pack(&h, head);
    assert_int_equal(write(fd, head, sizeof head), (ssize_t)sizeof head);
    if (n) assert_int_equal(write(fd, data, n), (ssize_t)n);
}

static void pair(int sv[2]) {
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
}

static void test_reader(void **state) {
    (void)state;
    int sv[2];
    pair(sv);
    pp_bulk_rx rx = {sv[0], 0, {0, 0, 0}, 0, ""};
    int64_t later = tt_now_ms() + 5000;
    uint8_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[4] = {9, 10, 11, 12}, got[8];
    /* message 1 (dropped by the receiver), then message 3 */
    put(sv[1], 1, 0, a, sizeof a, sizeof a);
    put(sv[1], 3, 0, b, sizeof b, sizeof b);
    /* message 2's tensor: message 1's bytes are read past; message 3's
     * header comes next, so message 2's bytes never came */
    assert_int_equal(pp_bulk_rx_read(&rx, 2, 0, got, 4, later), 0);
    assert_int_equal(rx.skipped, sizeof a);
    assert_int_equal(pp_bulk_rx_read(&rx, 3, 0, got, 4, later), 1);
    assert_memory_equal(got, b, 4);
    /* a byte count other than the envelope's */
    put(sv[1], 4, 0, a, sizeof a, sizeof a);
    assert_int_equal(pp_bulk_rx_read(&rx, 4, 0, got, 4, later), -1);
    tt_assert_mentions(rx.why, "8 bytes on the lane", "says 4", NULL);
    close(sv[0]);
    close(sv[1]);

    /* not a header at all */
    pair(sv);
    rx = (pp_bulk_rx){sv[0], 0, {0, 0, 0}, 0, ""};
    uint8_t junk[PP_BULK_HEADER_BYTES] = "GET / HTTP/1.1\r\n\r\n";
    assert_int_equal(write(sv[1], junk, sizeof junk), (ssize_t)sizeof junk);
    assert_int_equal(pp_bulk_rx_read(&rx, 1, 0, got, 4, later), -1);
    tt_assert_mentions(rx.why, "no bulk header", NULL);
    close(sv[0]);
    close(sv[1]);

    /* the writer goes in the middle of a tensor */
    pair(sv);
    rx = (pp_bulk_rx){sv[0], 0, {0, 0, 0}, 0, ""};
    put(sv[1], 1, 0, a, 3, sizeof a);
    close(sv[1]);
    assert_int_equal(pp_bulk_rx_read(&rx, 1, 0, got, sizeof a, later), -1);
    tt_assert_mentions(rx.why, "closed", NULL);
    close(sv[0]);

    /* nothing comes by the deadline (one already past: no waiting) */
    pair(sv);
    rx = (pp_bulk_rx){sv[0], 0, {0, 0, 0}, 0, ""};
    assert_int_equal(pp_bulk_rx_read(&rx, 1, 0, got, 4, tt_now_ms() - 1), -1);
    tt_assert_mentions(rx.why, "in time", NULL);
    close(sv[0]);
    close(sv[1]);
}

/* The reader without waiting: bytes that come in pieces (a header cut in
 * two, a dropped message's tensor, the wanted one) are read as they come,
 * each call going on where the last stopped. */
static void test_step_resumes(void **state) {
    (void)state;
    int sv[2];
    pair(sv);
    pp_bulk_rx rx = {sv[0], 0, {0, 0, 0}, 0, ""};
    uint8_t head[2][PP_BULK_HEADER_BYTES], a[6] = {1, 2, 3, 4, 5, 6}, b[8] = {11, 12, 13, 14, 15, 16, 17, 18};
    uint8_t got[8] = {0};
    pp_bulk_header_pack(&(pp_bulk_header){0, 1, sizeof a}, head[0]); /* message 1: dropped */
    pp_bulk_header_pack(&(pp_bulk_header){0, 2, sizeof b}, head[1]); /* message 2: wanted */
    assert_int_equal(pp_bulk_rx_step(&rx, 2, 0, got, sizeof b), 2); /* nothing yet */
    assert_int_equal(write(sv[1], head[0], 10), 10);
    assert_int_equal(pp_bulk_rx_step(&rx, 2, 0, got, sizeof b), 2);
    assert_int_equal(write(sv[1], head[0] + 10, sizeof head[0] - 10), (ssize_t)sizeof head[0] - 10);
    assert_int_equal(write(sv[1], a, 4), 4);
    assert_int_equal(pp_bulk_rx_step(&rx, 2, 0, got, sizeof b), 2);
    assert_int_equal(write(sv[1], a + 4, 2), 2);
    assert_int_equal(write(sv[1], head[1], sizeof head[1]), (ssize_t)sizeof head[1]);
    assert_int_equal(write(sv[1], b, 5), 5);
    assert_int_equal(pp_bulk_rx_step(&rx, 2, 0, got, sizeof b), 2);
    assert_int_equal(rx.skipped, sizeof a);
    assert_int_equal(write(sv[1], b + 5, 3), 3);
    assert_int_equal(pp_bulk_rx_step(&rx, 2, 0, got, sizeof b), 1);
    assert_memory_equal(got, b, sizeof b);
    /* the writer goes with a tensor half sent: broken */
    pp_bulk_header_pack(&(pp_bulk_header){0, 3, sizeof b}, head[0]);
    assert_int_equal(write(sv[1], head[0], sizeof head[0]), (ssize_t)sizeof head[0]);
    assert_int_equal(write(sv[1], b, 3), 3);
    assert_int_equal(pp_bulk_rx_step(&rx, 3, 0, got, sizeof b), 2);
    close(sv[1]);
    assert_int_equal(pp_bulk_rx_step(&rx, 3, 0, got, sizeof b), -1);
    tt_assert_mentions(rx.why, "closed", NULL);
    close(sv[0]);
}

static void test_writer(void **state) {
    (void)state;
    int sv[2];
    pair(sv);
    pp_bulk_tx *tx;
    TT_OK(pp_bulk_tx_start(sv[0], 4, &tx));
    int64_t shape[1] = {1024};
    pp_tensor *x = tt_f32_seq(1, shape, 1.0f);
    pp_bulk_header h = {0, 5, x->nbytes};
    assert_int_equal(pp_bulk_tx_push(tx, &h, x), 1);
    /* the reader's end gets the header and the bytes, in order */
    pp_bulk_rx rx = {sv[1], 0, {0, 0, 0}, 0, ""};
    float got[1024];
    assert_int_equal(pp_bulk_rx_read(&rx, 5, 0, got, sizeof got, tt_now_ms() + 5000), 1);
    assert_memory_equal(got, x->data, sizeof got);
    /* the reader goes: the writer fails on the next tensor, and says so */
    close(sv[1]);
    int64_t big[1] = {1 << 20};
    pp_tensor *y = tt_f32_seq(1, big, 1.0f);
    h.seq = 6;
    h.nbytes = y->nbytes;
    assert_int_equal(pp_bulk_tx_push(tx, &h, y), 1);
    int64_t until = tt_now_ms() + 5000;
    while (!*pp_bulk_tx_error(tx) && tt_now_ms() < until) {
        struct pollfd pf = {pp_bulk_tx_event_fd(tx), POLLIN, 0};
        poll(&pf, 1, 100);
        pp_bulk_tx_clear(tx);
    }
    assert_true(*pp_bulk_tx_error(tx) != 0);
    assert_int_equal(pp_bulk_tx_push(tx, &h, y), -1);
    pp_bulk_tx_close(tx, 0);
    pp_tensor_free(x);
    pp_tensor_free(y); /* the queue's references are gone: freed here */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lane_carries_large_tensors),
        cmocka_unit_test(test_lane_with_wildcard_bind),
        cmocka_unit_test(test_lanes_both_ways),
        cmocka_unit_test(test_lanes_off),
        cmocka_unit_test(test_receiver_off_offers_none),
        cmocka_unit_test(test_dropped_message_read_past),
        cmocka_unit_test(test_orphan_bytes_read_past),
        cmocka_unit_test(test_lane_failure_falls_back_to_frames),
        cmocka_unit_test(test_strangers_cannot_evict_the_sender),
        cmocka_unit_test(test_offer_host_not_followed),
        cmocka_unit_test(test_lane_to_a_named_host),
        cmocka_unit_test(test_parked_tensor_holds_up_no_one),
        cmocka_unit_test(test_parked_keeps_the_peers_order),
        cmocka_unit_test(test_parked_bytes_never_come),
        cmocka_unit_test(test_parked_lane_closes),
        cmocka_unit_test(test_parked_bytes_count_toward_the_cap),
        cmocka_unit_test(test_park_cap_waits_instead),
        cmocka_unit_test(test_parked_receiver_away_longer_than_timeout),
        cmocka_unit_test(test_close_with_a_parked_message),
        cmocka_unit_test(test_reader),
        cmocka_unit_test(test_step_resumes),
        cmocka_unit_test(test_writer),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}

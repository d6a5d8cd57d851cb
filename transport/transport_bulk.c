/* Bulk lanes (bulk_lane.h): large tensors to a peer over a plain TCP
 * connection of their own, beside the ZeroMQ link that carries their
 * envelopes. On the socket path (no shared memory: ranks on two hosts)
 * libzmq's receiving I/O thread mallocs every large frame afresh, and how
 * often that memory came from fresh pages (a fault per 4 KiB) swung with
 * how far the receiver lagged: 1 MiB tensors ran at 0.6-1.8x raw libzmq
 * from run to run. Through a lane the receiving rank reads each tensor's
 * bytes itself, into a recycled buffer.
 *
 * Set-up, on the first large tensor for a peer: this rank asks it for a
 * lane (CTL_BULK_WANT); the peer, if its transport can carry direct links
 * (plain tcp, no CURVE, bound to one address: direct_tcp.h), listens and
 * answers with an offer (CTL_BULK_OFFER: address, port and a nonce, over
 * the checked transport); this rank connects and sends the hello with that
 * nonce. Until then, and for good if any of it fails, large tensors go in
 * frames as before. A tensor on the lane is PP_PLACE_BULK in its envelope;
 * its bytes go first (transport_send.c), and the receiver reads them when
 * it handles the envelope, after every check, reading past the bytes of
 * messages it dropped or whose envelopes never came (the header's sequence
 * number says whose bytes come next). */
#include "transport_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bulk_lane.h"
#include "direct_tcp.h"

#define PURPOSE_BULK 0x42000000u /* direct_tcp.h purposes: a bulk lane */
#define WANT_AGAIN_MS 100        /* a want without an offer is sent again after this */

enum { BULK_NONE, BULK_WANTED, BULK_CONNECTING, BULK_UP, BULK_OFF };

static int tcp_peer(const pp_transport *t, int r) {
    const peer *p = &t->peers[r];
    return !t->curve && !p->inproc && p->endpoint && strncmp(p->endpoint, "tcp://", 6) == 0;
}

static void lane_off(pp_transport *t, int r, const char *why) {
    peer *p = &t->peers[r];
    pp_warn("transport rank %d: bulk lane to rank %d (%s): %s; large tensors to it go in frames", t->rank, r,
            peer_ep(t, r), why);
    pp_direct_conn_free(p->bulk_conn);
    p->bulk_conn = NULL;
    size_t lost = pp_bulk_tx_close(p->bulk_tx, 0);
    if (lost) pp_warn("transport rank %d: %zu tensors to rank %d were lost with the lane", t->rank, lost, r);
    p->bulk_tx = NULL;
    p->bulk_state = BULK_OFF;
}

pp_bulk_tx *pp_tp_bulk_lane(pp_transport *t, int r, size_t nbytes) {
    peer *p = &t->peers[r];
    if (nbytes < PP_BULK_MIN_BYTES || !t->bulk || p->bulk_state == BULK_OFF || !tcp_peer(t, r)) return NULL;
    /* asked again while no offer came: the want or the offer can be lost
     * (sent without waiting, to a full queue) */
    if (p->bulk_state == BULK_NONE || (p->bulk_state == BULK_WANTED && now_ms() - p->bulk_want_ms >= WANT_AGAIN_MS)) {
        if (pp_tp_send_simple(t, r, PP_MSG_CONTROL, CTL_BULK_WANT)) {
            p->bulk_state = BULK_WANTED;
            p->bulk_want_ms = now_ms();
        }
        return NULL;
    }
    if (p->bulk_state == BULK_CONNECTING) {
        int fd = -1;
        if (pp_direct_connect_finish(p->bulk_conn, 0, &fd) != PP_OK) {
            lane_off(t, r, pp_last_error());
            return NULL;
        }
        if (fd < 0) return NULL; /* still connecting */
        pp_direct_conn_free(p->bulk_conn);
        p->bulk_conn = NULL;
        if (pp_bulk_tx_start(fd, (size_t)t->sndhwm, &p->bulk_tx) != PP_OK) {
            lane_off(t, r, pp_last_error());
            return NULL;
        }
        p->bulk_state = BULK_UP;
        pp_debug("transport rank %d: bulk lane to rank %d (%s) is up", t->rank, r, peer_ep(t, r));
    }
    if (p->bulk_state != BULK_UP) return NULL;
    const char *err = pp_bulk_tx_error(p->bulk_tx);
    if (*err) {
        lane_off(t, r, err);
        return NULL;
    }
    return p->bulk_tx;
}

pp_status pp_tp_bulk_push(pp_transport *t, int r, uint64_t seq, uint32_t index, pp_tensor *x, const action *act) {
    peer *p = &t->peers[r];
    pp_bulk_header h = {index, seq, x->nbytes};
    char doing[ACTION_CHARS];
    int64_t deadline = -1;
    for (;;) {
        int rc = p->bulk_tx ? pp_bulk_tx_push(p->bulk_tx, &h, x) : -1;
        if (rc > 0) {
            stat_add(&t->st.bulk_bytes_sent, x->nbytes);
            return PP_OK;
        }
        if (rc < 0) {
            /* the lane failed; the envelope has not gone: the caller sends
             * the message again, in frames (pp_tp_bulk_failed) */
            stat_add(&t->st.peer_failures, 1);
            pp_status s = pp_error(PP_ERR_PEER, "transport rank %d: %s: bulk lane to rank %d (%s) failed: %s",
                                   t->rank, pp_tp_action_str(act, doing, sizeof doing), r, peer_ep(t, r),
                                   p->bulk_tx ? pp_bulk_tx_error(p->bulk_tx) : "closed");
            if (p->bulk_state == BULK_UP) lane_off(t, r, "it failed");
            return s;
        }
        /* the queue is full: wait for the writer, taking messages meanwhile
         * (the peer may be waiting on its own lane to this rank) */
        int64_t now = now_ms();
        if (deadline < 0) deadline = now + t->timeout_ms;
        if (now >= deadline) {
            stat_add(&t->st.timeouts, 1);
            return pp_error(PP_ERR_TIMEOUT, "transport rank %d: %s: rank %d (%s) did not take %zu queued "
                            "tensors on its bulk lane within %d ms", t->rank,
                            pp_tp_action_str(act, doing, sizeof doing), r, peer_ep(t, r),
                            pp_bulk_tx_queued(p->bulk_tx), t->timeout_ms);
        }
        pp_tp_drain(t, NULL, NULL);
        if (t->aborted) return pp_tp_abort_error(t);
        zmq_pollitem_t it[2] = {{t->pull, 0, ZMQ_POLLIN, 0}, {NULL, pp_bulk_tx_event_fd(p->bulk_tx), ZMQ_POLLIN, 0}};
        int64_t wait = deadline - now;
        zmq_poll(it, 2, wait > 1000 ? 1000 : (long)wait);
        pp_bulk_tx_clear(p->bulk_tx);
    }
}

/* The receiving end of rank r's lane, reset (a new offer replaces it). */
static void rx_reset(peer *p) {
    pp_direct_listener_free(p->bulk_listen);
    p->bulk_listen = NULL;
    p->bulk_offer[0] = 0;
    if (p->bulk_rx.fd >= 0) close(p->bulk_rx.fd);
    memset(&p->bulk_rx, 0, sizeof p->bulk_rx);
    p->bulk_rx.fd = -1;
}

int pp_tp_bulk_control(pp_transport *t, int r, const char *text) {
    peer *p = &t->peers[r];
    if (strcmp(text, CTL_BULK_WANT) == 0) {
        /* a lane from r to this rank: listen, and tell it where */
        const char *why = "bulk_lanes is off";
        if (!t->bulk || !pp_direct_possible(t, &why)) {
            pp_debug("transport rank %d: no bulk lane for rank %d: %s", t->rank, r, why);
            return 1;
        }
        /* asked again before it connected: the same offer again (a new
         * listener would refuse a connection the first offer started) */
        if (!(p->bulk_listen && p->bulk_rx.fd < 0 && p->bulk_offer[0])) {
            rx_reset(p);
            char offer[PP_DIRECT_OFFER_CAP];
            if (pp_direct_listen(t, PURPOSE_BULK, r, offer, &p->bulk_listen) != PP_OK) {
                pp_warn("transport rank %d: no bulk lane for rank %d: %s", t->rank, r, pp_last_error());
                return 1;
            }
            snprintf(p->bulk_offer, sizeof p->bulk_offer, CTL_BULK_OFFER "%s", offer);
        }
        pp_tp_tell(t, r);
        pp_tp_send_simple(t, r, PP_MSG_CONTROL, p->bulk_offer); /* lost on a full queue: it asks again */
        return 1;
    }
    if (strncmp(text, CTL_BULK_OFFER, PREFIX_LEN(CTL_BULK_OFFER)) == 0) {
        const char *offer = text + PREFIX_LEN(CTL_BULK_OFFER);
        if (p->bulk_state != BULK_WANTED) return 1; /* not asked for (or asked twice): ignored */
        if (!pp_direct_offer_valid(offer)) return 0;
        if (pp_direct_connect_start(t, offer, PURPOSE_BULK, t->rank, r, &p->bulk_conn) != PP_OK) {
            lane_off(t, r, pp_last_error());
            return 1;
        }
        p->bulk_state = BULK_CONNECTING;
        return 1;
    }
    return 0;
}

pp_status pp_tp_bulk_tensor(pp_transport *t, int r, const pp_envelope *env, int i, pp_tensor **out) {
    peer *p = &t->peers[r];
    const pp_wire_tensor *wt = &env->tensors[i];
    *out = NULL;
    int64_t deadline = now_ms() + t->timeout_ms;
    if (p->bulk_rx.fd < 0) {
        if (!p->bulk_listen) return pp_error(PP_ERR_PEER, "a bulk tensor, but this rank offered it no lane");
        int fd = -1;
        PP_TRY(pp_direct_accept(p->bulk_listen, t->timeout_ms, &fd));
        if (fd < 0) return pp_error(PP_ERR_PEER, "its bulk lane did not connect within %d ms", t->timeout_ms);
        p->bulk_rx.fd = fd;
        pp_direct_listener_free(p->bulk_listen); /* its one connection came: no port left open */
        p->bulk_listen = NULL;
        p->bulk_offer[0] = 0;
    }
    pp_tensor *x;
    if (wt->nbytes >= POOL_MIN_BYTES && t->pool) PP_TRY(pp_bufpool_tensor(t->pool, wt->dtype, wt->ndim, wt->shape, &x));
    else PP_TRY(pp_tensor_empty(wt->dtype, wt->ndim, wt->shape, &x));
    int rc = pp_bulk_rx_read(&p->bulk_rx, env->seq, (uint32_t)i, x->data, wt->nbytes, deadline);
    if (rc <= 0) {
        pp_tensor_free(x);
        if (rc == 0) return pp_error(PP_ERR_PEER, "its bytes are not on the bulk lane");
        pp_status s = pp_error(PP_ERR_PEER, "bulk lane: %s (closed)", p->bulk_rx.why);
        close(p->bulk_rx.fd); /* its writer fails, and the peer goes back to frames */
        p->bulk_rx.fd = -1;
        p->bulk_rx.have = 0;
        pp_direct_listener_free(p->bulk_listen);
        p->bulk_listen = NULL;
        return s;
    }
    stat_add(&t->st.bulk_bytes_received, wt->nbytes);
    *out = x;
    return PP_OK;
}

int pp_tp_bulk_failed(const pp_transport *t, int r) { return t->peers[r].bulk_state == BULK_OFF; }

void pp_tp_bulk_init(peer *p) {
    p->bulk_state = BULK_NONE;
    memset(&p->bulk_rx, 0, sizeof p->bulk_rx);
    p->bulk_rx.fd = -1;
}

void pp_tp_bulk_close(pp_transport *t, int r, int linger_ms) {
    peer *p = &t->peers[r];
    pp_direct_conn_free(p->bulk_conn);
    p->bulk_conn = NULL;
    size_t lost = pp_bulk_tx_close(p->bulk_tx, linger_ms);
    if (lost)
        pp_warn("transport rank %d: closed with %zu tensors to rank %d (%s) not written to its bulk lane", t->rank,
                lost, r, peer_ep(t, r));
    p->bulk_tx = NULL;
    p->bulk_state = BULK_OFF;
    rx_reset(p);
}

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
 * its bytes go first (transport_send.c), and the receiver reads them after
 * every check of the envelope, reading past the bytes of messages it
 * dropped or whose envelopes never came (the header's sequence number says
 * whose bytes come next), never waiting there: a message whose bytes are
 * not all in is parked (bulk_park.c) and read on as they come. */
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
        zmq_pollitem_t *it = t->items; /* room for 2 + a lane per peer */
        it[0] = (zmq_pollitem_t){t->pull, 0, ZMQ_POLLIN, 0};
        it[1] = (zmq_pollitem_t){NULL, pp_bulk_tx_event_fd(p->bulk_tx), ZMQ_POLLIN, 0};
        int64_t wait = deadline - now;
        if (wait > 1000) wait = 1000;
        int n = 2 + pp_tp_park_items(t, it + 2, &wait); /* parked messages' lanes (the peer's may be one) */
        zmq_poll(it, n, (long)wait);
        pp_bulk_tx_clear(p->bulk_tx);
    }
}

/* The receiving end of rank r's lane, reset (a new offer replaces it).
 * A message parked for the old lane's bytes finds them gone: dropped,
 * never filled from the new lane (the sequence numbers differ). */
static void rx_reset(pp_transport *t, int r) {
    peer *p = &t->peers[r];
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
            rx_reset(t, r);
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

pp_status pp_tp_bulk_alloc(pp_transport *t, const pp_wire_tensor *wt, pp_tensor **out) {
    if (wt->nbytes >= POOL_MIN_BYTES && t->pool) return pp_bufpool_tensor(t->pool, wt->dtype, wt->ndim, wt->shape, out);
    return pp_tensor_empty(wt->dtype, wt->ndim, wt->shape, out);
}

/* Rank r's lane broke (closed, out of step, or its bytes did not come in
 * time): it is closed, so its writer fails and the peer goes back to
 * frames; why is kept for the receive errors that follow. */
static pp_status rx_fail(pp_transport *t, int r) {
    peer *p = &t->peers[r];
    pp_status s = pp_error(PP_ERR_PEER, "bulk lane from rank %d (%s): %s (closed)", r, peer_ep(t, r),
                           p->bulk_rx.why);
    snprintf(p->bulk_fail, sizeof p->bulk_fail, "%s", p->bulk_rx.why);
    if (p->bulk_rx.fd >= 0) close(p->bulk_rx.fd);
    p->bulk_rx.fd = -1;
    p->bulk_rx.have = 0;
    p->bulk_rx.hgot = 0;
    p->bulk_rx.body = 0;
    p->bulk_rx.lowat = 0;
    pp_direct_listener_free(p->bulk_listen);
    p->bulk_listen = NULL;
    return s;
}

/* Takes the connection rank r's lane comes on, waiting until deadline if
 * wait: 1 connected, 0 not yet (and not waiting), -1 failed (error set). */
static int rx_accept(pp_transport *t, int r, int64_t deadline, int wait) {
    peer *p = &t->peers[r];
    if (!p->bulk_listen) {
        pp_error(PP_ERR_PEER, "a bulk tensor, but this rank offered rank %d no lane", r);
        return -1;
    }
    int64_t left = deadline - now_ms();
    int fd = -1;
    if (pp_direct_accept(p->bulk_listen, wait && left > 0 ? (int)left : 0, &fd) != PP_OK) return -1;
    if (fd < 0) {
        if (!wait && left > 0) return 0;
        /* as a lane that broke: later messages do not wait for it again */
        snprintf(p->bulk_rx.why, sizeof p->bulk_rx.why, "it did not connect within %d ms", t->timeout_ms);
        rx_fail(t, r);
        return -1;
    }
    p->bulk_rx.fd = fd;
    p->bulk_rx.lowat = 0;
    p->bulk_fail[0] = 0;
    pp_direct_listener_free(p->bulk_listen); /* its one connection came: no port left open */
    p->bulk_listen = NULL;
    p->bulk_offer[0] = 0;
    return 1;
}

int pp_tp_bulk_fill(pp_transport *t, int r, uint64_t seq, uint32_t index, pp_tensor *x, int64_t deadline,
                    int wait) {
    peer *p = &t->peers[r];
    if (p->bulk_rx.fd < 0) {
        int rc = rx_accept(t, r, deadline, wait);
        if (rc <= 0) return rc;
    }
    uint64_t before = p->bulk_rx.received;
    int rc = wait ? pp_bulk_rx_read(&p->bulk_rx, seq, index, x->data, x->nbytes, deadline)
                  : pp_bulk_rx_step(&p->bulk_rx, seq, index, x->data, x->nbytes);
    if (rc == 2) {
        /* bytes came on this pass: not late, however long the rank was away
         * computing (the caller's clock restarts) */
        if (now_ms() < deadline || p->bulk_rx.received != before) return 0;
        snprintf(p->bulk_rx.why, sizeof p->bulk_rx.why, "%s did not come within %d ms", p->bulk_rx.what,
                 t->timeout_ms);
        rc = -1;
    }
    if (rc == 0) {
        pp_error(PP_ERR_PEER, "its bytes are not on the bulk lane");
        return -1;
    }
    if (rc < 0) {
        rx_fail(t, r);
        return -1;
    }
    stat_add(&t->st.bulk_bytes_received, x->nbytes);
    return 1;
}

int pp_tp_bulk_rx_fd(const pp_transport *t, int r) {
    const peer *p = &t->peers[r];
    if (p->bulk_rx.fd >= 0) return p->bulk_rx.fd;
    return p->bulk_listen ? pp_direct_listener_fd(p->bulk_listen) : -1;
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
    pp_tp_park_clear(t, r); /* closing: nothing more is filed */
    rx_reset(t, r);
}

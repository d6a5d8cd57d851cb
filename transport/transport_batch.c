/* Batching: small messages held back while this rank is ahead of a peer,
 * sent as one BATCH message (transport/pippin.proto) once it has room.
 *
 * With batching on (pp_transport_set_batching), an activation or gradient
 * whose tensors are all inline is held back when this rank is ahead of the
 * peer: HOLD_AHEAD of its small messages are still in libzmq's queue (the
 * I/O thread has not taken them), or the queue is full (the send would
 * have to wait). Later ones join it, up to PP_ENVELOPE_MAX_BATCH messages
 * in one frame of at most BATCH_MAX_BYTES. The batch goes out as one
 * message once libzmq has caught up, when it is full, at any later call
 * that finds room (every send, receive and poll looks), or at
 * pp_transport_flush. Per peer order holds: any other message to that
 * peer waits until the batch is out. libzmq's cost is per message (a
 * queue entry, a wake-up, a syscall per 8 KiB batch): 4 KiB tensors moved
 * 12 to a message go at 1.3x raw libzmq's one-per-message rate. */

#include "transport_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A batching sender is ahead of its peer when this many of its small
 * messages are still in libzmq's queue: the I/O thread has not taken
 * them, so the next ones can wait and go together. */
#define HOLD_AHEAD 2

void pp_tp_inflight_release(pp_tp_inflight *f) {
    if (f && atomic_fetch_sub(&f->refs, 1) == 1) free(f);
}

/* A counted message's buffer: the count, then the frame's bytes. */
typedef struct pp_tp_counted {
    pp_tp_inflight *f;
    max_align_t data[];
} counted;

static void counted_free(void *data, void *hint) {
    (void)data;
    counted *c = hint;
    atomic_fetch_sub(&c->f->count, 1);
    pp_tp_inflight_release(c->f);
    free(c);
}

typedef struct counted_alloc {
    counted *c;
} counted_alloc;

static void *alloc_counted(void *ctx, size_t n) {
    counted_alloc *a = ctx;
    a->c = malloc(sizeof(counted) + n);
    return a->c ? (void *)a->c->data : NULL;
}

/* Hands c (its frame at data, len bytes) to m, counted in rank r's
 * in-flight messages until libzmq has taken it; frees c on failure. */
static pp_status give_counted(pp_transport *t, int r, counted *c, void *data, size_t len, zmq_msg_t *m) {
    peer *p = &t->peers[r];
    if (!p->inflight) {
        if (!(p->inflight = calloc(1, sizeof *p->inflight))) {
            free(c);
            return pp_error(PP_ERR_NOMEM, "out of memory");
        }
        atomic_init(&p->inflight->refs, 1);
    }
    c->f = p->inflight;
    atomic_fetch_add(&p->inflight->refs, 1);
    atomic_fetch_add(&p->inflight->count, 1);
    if (zmq_msg_init_data(m, data, len, counted_free, c) != 0) {
        counted_free(NULL, c);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    return PP_OK;
}

/* Packs env into m, counted in rank r's in-flight messages until libzmq
 * has taken it. */
pp_status pp_tp_pack_counted(pp_transport *t, int r, const pp_envelope *env, zmq_msg_t *m) {
    counted_alloc a = {NULL};
    size_t len;
    PP_TRY(pp_envelope_pack_into(env, alloc_counted, &a, &len));
    return give_counted(t, r, a.c, a.c->data, len, m);
}

int pp_tp_ahead(const peer *p) {
    return p->inflight && atomic_load_explicit(&p->inflight->count, memory_order_relaxed) >= HOLD_AHEAD;
}

/* Room before the entries for the batch's own fields (version, kind, run
 * id, sequence number, source rank, nonce: at most ~45 bytes), which are
 * known only when it goes. */
#define BATCH_HEAD_BYTES 64
/* Largest batch frame: 48 KiB measured best on loopback at 4 KiB tensors
 * (16 KiB: 0.77x raw, 32 KiB: 1.0-1.06x, 48 KiB: 1.33-1.36x). At 64 KiB
 * (PP_ENVELOPE_MAX_BYTES, what a receiver accepts) it lost again: glibc
 * consolidates and trims its heap whenever a chunk of 64 KiB or more is
 * freed, and both ends then page-fault on fresh memory. */
#define BATCH_MAX_BYTES ((size_t)48 << 10)
/* An entry on the wire: field 15 (bytes), its length, the packed envelope. */
#define BATCH_ENTRY_TAG (15u << 3 | 2u)

static uint8_t *obox_bytes(const peer *p) { return (uint8_t *)p->obox->data; }

typedef struct entry_alloc {
    uint8_t *at;  /* where the entry's tag goes */
    size_t room;  /* bytes left in the frame */
} entry_alloc;

/* Writes the entry's tag and length (n bytes of envelope follow) and
 * returns where the envelope goes; NULL if it does not fit. */
static void *alloc_entry(void *ctx, size_t n) {
    entry_alloc *a = ctx;
    uint8_t *p = a->at;
    size_t prefix = 2;
    for (size_t v = n; v >= 0x80; v >>= 7) prefix++;
    if (prefix + n > a->room) return NULL;
    *p++ = BATCH_ENTRY_TAG;
    size_t v = n;
    for (; v >= 0x80; v >>= 7) *p++ = (uint8_t)(v | 0x80);
    *p++ = (uint8_t)v;
    a->at = p; /* the envelope, then the next entry */
    return p;
}

/* Packs env as the next entry of rank r's batch, straight into its wire
 * form; 0 if it does not fit. */
int pp_tp_hold(pp_transport *t, int r, const pp_envelope *env) {
    peer *p = &t->peers[r];
    if (p->obox_n >= (int)PP_ENVELOPE_MAX_BATCH) return 0;
    if (!p->obox) {
        if (!(p->obox = malloc(sizeof(counted) + BATCH_MAX_BYTES))) return 0;
        p->obox_n = 0;
        p->obox_end = BATCH_HEAD_BYTES;
    }
    entry_alloc a = {obox_bytes(p) + p->obox_end, BATCH_MAX_BYTES - p->obox_end};
    size_t len;
    if (pp_envelope_pack_into(env, alloc_entry, &a, &len) != PP_OK) return 0; /* no room */
    if (p->obox_n == 0) {
        t->n_obox++;
        stat_add(&t->st.retries, 1); /* a send that could not go at once */
        snprintf(p->obox_name, sizeof p->obox_name, "%s", env->tensors[0].name);
        p->obox_key = (pp_mbox_key){(int)env->kind, env->step, env->microbatch, env->src_stage,
                                    env->dst_stage, p->obox_name};
    }
    p->obox_n++;
    p->obox_end = (uint32_t)(a.at + len - obox_bytes(p));
    return 1;
}

void pp_tp_drop_held(pp_transport *t, int r) {
    peer *p = &t->peers[r];
    if (p->obox_n) t->n_obox--;
    p->obox_n = 0;
    p->obox_end = BATCH_HEAD_BYTES;
}

/* Rank r's batch as one message in m (the batch is then empty): its own
 * fields are written just before the entries, and the buffer goes to
 * libzmq as it is, without packing the entries again. */
pp_status pp_tp_take_held(pp_transport *t, int r, zmq_msg_t *m) {
    peer *p = &t->peers[r];
    pp_envelope env = {0};
    env.version = PP_PROTOCOL_VERSION;
    env.kind = (pp_msg_kind)PP_WIRE_KIND_BATCH;
    env.run_id = t->run_id;
    env.src_rank = t->rank;
    env.sender_nonce = t->nonce;
    env.seq = p->seq; /* the last entry's */
    env.text = "";
    env.shm_name = "";
    uint8_t head[BATCH_HEAD_BYTES];
    size_t hlen;
    pp_status s = pp_envelope_pack(&env, head, sizeof head, &hlen);
    counted *c = p->obox;
    size_t end = p->obox_end;
    pp_tp_drop_held(t, r);
    if (s != PP_OK) return s; /* the buffer stays for the next batch */
    p->obox = NULL;
    uint8_t *frame = (uint8_t *)c->data + BATCH_HEAD_BYTES - hlen;
    memcpy(frame, head, hlen);
    return give_counted(t, r, c, frame, hlen + end - BATCH_HEAD_BYTES, m);
}

/* Sends rank r's batch if it has room now: 1 sent (or nothing held), 0 not
 * yet; a lost connection loses the batch (counted in peer_failures, and
 * logged) like a message half sent. */
int pp_tp_flush_one(pp_transport *t, int r) {
    peer *p = &t->peers[r];
    if (!p->obox_n) return 1;
    pp_peer_state ps = peer_state(p);
    if (!p->told || !p->push || ps == PP_PEER_CLOSED || ps == PP_PEER_REJECTED) return 0;
    int events = 0;
    size_t elen = sizeof events;
    if (zmq_getsockopt(p->push, ZMQ_EVENTS, &events, &elen) != 0 || !(events & ZMQ_POLLOUT)) return 0;
    int n = p->obox_n;
    zmq_msg_t m;
    if (pp_tp_take_held(t, r, &m) != PP_OK) {
        stat_add(&t->st.peer_failures, 1);
        pp_warn("transport rank %d: lost %d small messages held back for rank %d (%s): %s", t->rank, n, r,
                peer_ep(t, r), pp_last_error());
        return 1;
    }
    if (zmq_msg_send(&m, p->push, ZMQ_DONTWAIT) >= 0) return 1;
    int e = zmq_errno();
    zmq_msg_close(&m);
    stat_add(&t->st.peer_failures, 1);
    pp_warn("transport rank %d: lost %d small messages held back for rank %d (%s): %s", t->rank, n, r,
            peer_ep(t, r), zmq_strerror(e));
    return 1;
}

void pp_transport_set_batching(pp_transport *t, int on) { t->batching = on != 0; }

pp_status pp_transport_flush(pp_transport *t, int timeout_ms) {
    int timeout = timeout_ms < 0 ? t->timeout_ms : timeout_ms;
    int64_t now = now_ms(), deadline = now + timeout;
    for (;;) {
        pp_tp_read_monitors(t);
        pp_tp_drain(t, NULL, NULL); /* sends what has room */
        if (!t->n_obox) return PP_OK;
        if (t->aborted) return pp_tp_abort_error(t);
        int r = 0;
        while (!t->peers[r].obox_n) r++;
        action act = {1, &t->peers[r].obox_key, t->peers[r].obox_n};
        int64_t wake = deadline;
        now = now_ms();
        PP_TRY(pp_tp_check_peer(t, r, &act, now, &wake));
        if (now >= deadline) {
            stat_add(&t->st.timeouts, 1);
            return pp_error(PP_ERR_TIMEOUT, "transport rank %d: %d small messages held back for rank %d (%s) "
                            "found no room within %d ms (%s)", t->rank, t->peers[r].obox_n, r, peer_ep(t, r),
                            timeout, peer_state(&t->peers[r]) == PP_PEER_UP && t->peers[r].told
                                         ? "its queue is full: it is not receiving"
                                         : pp_peer_state_name(peer_state(&t->peers[r])));
        }
        pp_tp_wait_events(t, wake - now, NULL);
    }
}

void pp_tp_flush_held(pp_transport *t) {
    for (int r = 0; t->n_obox && r < t->nranks; r++)
        if (t->peers[r].obox_n) pp_tp_flush_one(t, r);
}

void pp_tp_settle_held(pp_transport *t, int wait_ms) {
    int64_t until = now_ms() + wait_ms;
    while (t->n_obox && !t->aborted) {
        pp_tp_read_monitors(t);
        pp_tp_drain(t, NULL, NULL); /* flushes what has room */
        int64_t now = now_ms();
        if (!t->n_obox || now >= until) break;
        pp_tp_wait_events(t, until - now < 50 ? until - now : 50, NULL);
    }
    for (int r = 0; t->n_obox && r < t->nranks; r++)
        if (t->peers[r].obox_n) {
            pp_warn("transport rank %d: closing with %d small messages for rank %d (%s) not sent: it "
                    "had no room for %d ms", t->rank, t->peers[r].obox_n, r, peer_ep(t, r), wait_ms);
            stat_add(&t->st.peer_failures, 1);
            pp_tp_drop_held(t, r);
        }
}


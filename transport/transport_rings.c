/* The transport's side of the shared-memory rings (the rings themselves are
 * shm_ring.c): per same-host peer, a ring for large tensors, sized to what
 * is sent, and a message ring for whole small messages; on receipt, the
 * peer's rings mapped and their space handed back. */
#include "transport_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* A ring holds RING_TENSORS of the largest tensor sent so far (so a few can
 * be in flight), rounded up to a power of two, at least MIN_RING_BYTES. */
#define RING_TENSORS 4
#define MIN_RING_BYTES ((size_t)1 << 20)
/* Message rings (small messages between same-host ranks): room for a
 * receiver that lags far behind; what a ring costs in RSS is the pages its
 * traffic in flight touches (shm_ring.c maps them on first touch and goes
 * back to the start of the ring whenever the receiver has caught up). */
#define MSG_RING_BYTES ((size_t)4 << 20)
/* A sender waits this long for room in a full ring before it grows it. */
#define RING_WAIT_US 10000

/* ---- sending: tensor rings ---- */

/* Stops using the peer's ring. The receiver may still have to open it by
 * name (a message naming it can be in flight), so it stays until drained. */
void pp_tp_retire_ring(peer *p) {
    if (!p->tx_ring) return;
    pp_shm_ring_close(p->old_ring);
    p->old_ring = p->tx_ring;
    p->tx_ring = NULL;
}

static size_t round_pow2(size_t n) {
    size_t p = 1;
    while (p < n && p < SIZE_MAX / 2) p *= 2;
    return p;
}

/* Makes a ring of `want` bytes the one for peer r, with the pages for a
 * first record of `first` bytes allocated: a fresh ring costs one page
 * until used, so without them a nearly full /dev/shm would swap a working
 * ring for one that can never take a record. If that fails, the current
 * one (or none) stays, and that size is not tried again. */
static pp_shm_ring *replace_ring(pp_transport *t, int r, size_t want, size_t first) {
    peer *p = &t->peers[r];
    if (p->ring_failed && want >= p->ring_failed) return p->tx_ring;
    /* one retired ring at a time: the receiver may not have opened the last
     * one yet, and closing it would unlink a name a message in flight needs */
    if (p->old_ring && !pp_shm_ring_drained(p->old_ring) && !pp_shm_ring_opened(p->old_ring))
        return p->tx_ring;
    pp_shm_ring *fresh;
    int made = pp_shm_ring_create(want, &fresh) == PP_OK;
    if (made && !pp_shm_ring_prealloc(fresh, first)) {
        pp_shm_ring_close(fresh);
        made = 0;
    }
    if (made) {
        pp_shm_ring_set_align(fresh, 64); /* the receiver lends tensors out in place */
        pp_tp_retire_ring(p);
        p->tx_ring = fresh;
    } else {
        p->ring_failed = want;
        pp_warn("transport rank %d: no shared-memory ring of %zu bytes for rank %d (%s); %s: %s", t->rank,
                want, r, peer_ep(t, r),
                p->tx_ring ? "keeping the smaller one" : "large tensors go over the socket", pp_last_error());
    }
    return p->tx_ring;
}

/* The ring for tensors of up to `largest` bytes to peer r: only for a peer
 * on this host (it said so in its hello), created on first use and replaced
 * by a bigger one (up to shm_bytes) when a tensor would fill more than a
 * quarter of it. NULL means use the socket. */
pp_shm_ring *pp_tp_tx_ring(pp_transport *t, int r, size_t largest) {
    peer *p = &t->peers[r];
    if (p->inproc || !t->shm_bytes) return NULL;
    if (!p->hello_seen) pp_tp_drain(t, NULL, NULL); /* its hello may be waiting on our socket */
    if (!p->same_host) return NULL;
    if (p->old_ring && (pp_shm_ring_drained(p->old_ring) || pp_shm_ring_opened(p->old_ring))) {
        pp_shm_ring_close(p->old_ring);
        p->old_ring = NULL;
    }
    size_t want = largest > t->shm_bytes / RING_TENSORS ? t->shm_bytes : round_pow2(RING_TENSORS * largest);
    if (want < MIN_RING_BYTES) want = MIN_RING_BYTES;
    if (want > t->shm_bytes) want = t->shm_bytes;
    if (want > (p->tx_ring ? pp_shm_ring_bytes(p->tx_ring) : 0)) return replace_ring(t, r, want, largest);
    return p->tx_ring;
}

/* No /dev/shm pages for the ring to peer r (reserve returned -1): this
 * message goes over the socket, as when the ring is full. Said the first
 * time and then every power of two; each later send tries again. */
static void ring_nospace(pp_transport *t, int r) {
    peer *p = &t->peers[r];
    uint64_t n = ++p->ring_nospace;
    if ((n & (n - 1)) == 0)
        pp_warn("transport rank %d: no room in /dev/shm for the ring to rank %d (%s); sent over the socket "
                "instead (%llu so far): %s", t->rank, r, peer_ep(t, r), (unsigned long long)n, pp_last_error());
}

/* Room for n bytes in the ring to peer r. When the ring is full and
 * nothing of the message being built is in it yet: first wait a little for
 * the receiver, which copies out as envelopes arrive (a small ring that
 * stays in cache beats a big one); then replace the ring by one twice as
 * big (up to shm_bytes), so that a receiver lagging several tensors behind
 * does not push the rest onto the slower socket. 0: use the socket for this
 * tensor. Our own incoming messages keep moving meanwhile. */
int pp_tp_ring_reserve(pp_transport *t, int r, pp_shm_ring **ring, int first, size_t n, uint64_t *pos,
                       void **dst) {
    if (!*ring) return 0;
    int got = pp_shm_ring_reserve(*ring, n, pos, dst);
    if (got) goto out; /* room, or no pages: neither waiting nor a bigger ring helps the latter */
    if (!first || n > pp_shm_ring_bytes(*ring)) return 0;
    int64_t until = now_ns() + (int64_t)RING_WAIT_US * 1000;
    while (now_ns() < until) {
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
        pp_tp_drain(t, NULL, NULL);
        if ((got = pp_shm_ring_reserve(*ring, n, pos, dst))) goto out;
    }
    size_t have = pp_shm_ring_bytes(*ring);
    if (have >= t->shm_bytes) return 0;
    *ring = replace_ring(t, r, have > t->shm_bytes / 2 ? t->shm_bytes : 2 * have, n);
    got = pp_shm_ring_reserve(*ring, n, pos, dst);
out:
    if (got < 0) ring_nospace(t, r);
    return got > 0;
}

/* ---- sending: message rings ---- */

/* The message ring to peer r, once the peer has confirmed it reads it:
 * created and announced on first use, for a same-host peer whose doorbell
 * we could open. NULL: use the socket. */
pp_shm_ring *pp_tp_msg_ring(pp_transport *t, int r) {
    peer *p = &t->peers[r];
    if (p->inproc || !p->same_host || p->bell_fd < 0 || p->tx_msg_failed) return NULL;
    if (!p->tx_msg) {
        char text[PP_ENVELOPE_MAX_TEXT];
        if (pp_shm_ring_create(MSG_RING_BYTES, &p->tx_msg) != PP_OK) {
            p->tx_msg_failed = 1;
            pp_warn("transport rank %d: no message ring for rank %d (%s), small messages go over the "
                    "socket: %s", t->rank, r, peer_ep(t, r), pp_last_error());
            return NULL;
        }
        snprintf(text, sizeof text, CTL_MSGRING "%s", pp_shm_ring_name(p->tx_msg));
        if (!pp_tp_send_simple(t, r, PP_MSG_CONTROL, text)) { /* try again next time */
            pp_shm_ring_close(p->tx_msg);
            p->tx_msg = NULL;
        }
        return NULL;
    }
    if (!p->tx_msg_ready) pp_tp_drain(t, NULL, NULL); /* its confirmation may be waiting */
    return p->tx_msg_ready ? p->tx_msg : NULL;
}

typedef struct ring_slot {
    pp_transport *t;
    int r;
    pp_shm_ring *ring;
    uint64_t pos;
} ring_slot;

static void *alloc_in_ring(void *ctx, size_t n) {
    ring_slot *rs = ctx;
    void *dst;
    int got = pp_shm_ring_msg_reserve(rs->ring, n, &rs->pos, &dst);
    if (got < 0) ring_nospace(rs->t, rs->r);
    return got > 0 ? dst : NULL;
}

/* Writes the envelope (every tensor inline) into the message ring to peer
 * r and rings its doorbell if it sleeps. 0: no room; use the socket. */
int pp_tp_send_by_ring(pp_transport *t, int r, pp_shm_ring *ring, const pp_envelope *env) {
    ring_slot rs = {t, r, ring, 0};
    size_t len;
    if (pp_envelope_pack_into(env, alloc_in_ring, &rs, &len) != PP_OK) return 0;
    if (pp_shm_ring_msg_commit(ring, rs.pos, len)) pp_doorbell_ring(t->peers[r].bell_fd);
    return 1;
}

/* ---- receiving ---- */

int pp_tp_ring_name_ok(pp_transport *t, int r, const char *name) {
    const peer *p = &t->peers[r];
    size_t n = strlen(p->proc);
    if (!n || strncmp(name, "/pippin-", 8) != 0 || strncmp(name + 8, p->proc, n) != 0 || name[8 + n] != '-') {
        pp_error(PP_ERR_INVALID, "not a ring of rank %d (its rings are /pippin-%s-N)", r,
                 n ? p->proc : "(unknown: no hello)");
        return 0;
    }
    return 1;
}

/* Rank r's ring called name, mapped on first use and again whenever the
 * peer starts a new one. The new one is checked (its name is rank r's, it
 * opens) before the current one is let go: a bad name leaves it in place. */
pp_status pp_tp_rx_ring(pp_transport *t, int r, const char *name, pp_shm_ring **out) {
    peer *p = &t->peers[r];
    if (!p->rx_ring || strcmp(pp_shm_ring_name(p->rx_ring), name) != 0) {
        if (!pp_tp_ring_name_ok(t, r, name)) return PP_ERR_INVALID;
        pp_shm_ring *fresh;
        PP_TRY(pp_shm_ring_open(name, &fresh));
        pp_shm_ring_close(p->rx_ring);
        p->rx_ring = fresh;
    }
    *out = p->rx_ring;
    return PP_OK;
}

/* A tensor from the sender's ring: its bytes where they are (the space goes
 * back to the sender when the tensor is freed), or copied out when the
 * record is not aligned. */
pp_status pp_tp_shm_tensor(pp_transport *t, pp_shm_ring *ring, const pp_wire_tensor *wt,
                           pp_tensor **out) {
    pp_status s = pp_shm_ring_lend(ring, wt->shm_pos, wt->nbytes, wt->dtype, wt->ndim, wt->shape, out);
    if (s != PP_ERR_UNSUPPORTED) return s;
    const void *src;
    PP_TRY(pp_shm_ring_locate(ring, wt->shm_pos, wt->nbytes, &src));
    if (wt->nbytes >= POOL_MIN_BYTES && t->pool)
        PP_TRY(pp_bufpool_tensor(t->pool, wt->dtype, wt->ndim, wt->shape, out));
    else
        PP_TRY(pp_tensor_empty(wt->dtype, wt->ndim, wt->shape, out));
    memcpy((*out)->data, src, wt->nbytes);
    return PP_OK;
}

/* Hands a message's ring space back to the sender, whether its tensors were
 * taken or dropped: a dropped message must not stall the ring. */
void pp_tp_settle_ring(pp_shm_ring *ring, const pp_envelope *env) {
    uint64_t end = 0;
    for (int i = 0; i < env->ntensors; i++) {
        const pp_wire_tensor *wt = &env->tensors[i];
        const void *src;
        if (wt->placement == PP_PLACE_SHM && pp_shm_ring_locate(ring, wt->shm_pos, wt->nbytes, &src) == PP_OK &&
            wt->shm_pos + wt->nbytes > end)
            end = wt->shm_pos + wt->nbytes;
    }
    if (end) pp_shm_ring_release(ring, end);
}

/* ---- public: introspection ---- */

int pp_transport_peer_shm(const pp_transport *t, int rank) {
    if (rank < 0 || rank >= t->nranks || rank == t->rank) return 0;
    const peer *p = &t->peers[rank];
    return !p->inproc && t->shm_bytes && p->same_host && !(p->ring_failed && !p->tx_ring);
}

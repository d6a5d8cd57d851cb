/* Parked messages (transport_internal.h, bulk_park.c): a message whose
 * bulk tensors' bytes are not all on the lane yet when its envelope is
 * handled waits here, its other tensors already built, while the rank
 * handles other peers' messages; it goes on whenever the lane's socket is
 * readable (the wait loops poll it: pp_tp_park_items) and is filed once
 * its bytes are in. Reading the lane in the envelope's handler instead
 * made one large tensor in flight hold up every other peer, and made a
 * poll with no timeout wait for it.
 *
 * Per peer the order of messages stays the order they were sent: while a
 * peer has a message parked, its later ones (control texts included) park
 * behind it, built and checked but not filed or acted on. A message whose
 * bytes do not come within timeout_ms of its read starting (when it was
 * parked, or the message ahead of it finished: its bytes come after those)
 * breaks the lane as a waiting read did (closed, the tensor dropped with a
 * warning naming the peer; the peer's later tensors come in frames). */
#include "transport_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pp_tp_parked *pp_tp_park_new(const pp_envelope *env) {
    pp_tp_parked *m = calloc(1, sizeof *m + (size_t)env->ntensors * sizeof m->slot[0]);
    if (!m) {
        pp_error(PP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    m->kind = env->kind;
    m->step = env->step;
    m->microbatch = env->microbatch;
    m->src_stage = env->src_stage;
    m->dst_stage = env->dst_stage;
    m->seq = env->seq;
    m->ntensors = env->ntensors;
    snprintf(m->text, sizeof m->text, "%s", env->text ? env->text : "");
    for (int i = 0; i < env->ntensors; i++) {
        snprintf(m->slot[i].name, sizeof m->slot[i].name, "%s", env->tensors[i].name);
        m->bytes += env->tensors[i].nbytes;
    }
    return m;
}

void pp_tp_park_free(pp_tp_parked *m) {
    if (!m) return;
    for (int i = 0; i < m->ntensors; i++) pp_tensor_free(m->slot[i].x);
    free(m);
}

/* Reads m's bulk tensors from rank r's lane as far as they came (wait:
 * until its deadline). 1: all read (or failed: dropped and logged); 0:
 * waiting for bytes. */
static int read_lane(pp_transport *t, int r, pp_tp_parked *m, int wait) {
    int64_t deadline = m->parked_ms + t->timeout_ms;
    for (; m->cur < m->ntensors; m->cur++) {
        pp_tp_slot *s = &m->slot[m->cur];
        if (!s->bulk || !s->x) continue;
        uint64_t before = t->peers[r].bulk_rx.received;
        int rc = pp_tp_bulk_fill(t, r, m->seq, (uint32_t)m->cur, s->x, deadline, wait);
        /* its clock runs from the last bytes that came: time the rank spent
         * away (computing) while the sender waited on a full socket is not
         * the sender's lateness */
        if (t->peers[r].bulk_rx.received != before) m->parked_ms = now_ms();
        if (rc == 0) return 0;
        if (rc < 0) {
            pp_tp_drop(t, NULL, NULL, "claims rank %d: tensor '%s': %s", r, s->name, pp_last_error());
            pp_tensor_free(s->x);
            s->x = NULL;
        }
    }
    return 1;
}

/* Files the tensors of m, a finished message from rank r (or acts on its
 * control text). A data message whose step the rank moved past while it
 * was parked is dropped, as it would have been had it come then. */
static void finish(pp_transport *t, int r, pp_tp_parked *m, const pp_mbox_key *want, pp_tensor **got) {
    if (m->kind == PP_MSG_CONTROL && m->ntensors == 0) {
        pp_tp_control(t, r, m->text, NULL, want, got);
        return;
    }
    if (m->step < t->cur_step) {
        pp_tp_drop(t, NULL, NULL, "claims rank %d: step %" PRId64 " is before the current step %" PRId64
                   " (it waited for its bulk lane)", r, m->step, t->cur_step);
        return;
    }
    uint64_t bytes = 0;
    for (int i = 0; i < m->ntensors; i++) {
        pp_tp_slot *s = &m->slot[i];
        if (!s->x) continue;
        bytes += s->x->nbytes;
        pp_mbox_key key = {(int)m->kind, m->step, m->microbatch, m->src_stage, m->dst_stage, s->name};
        pp_tp_file(t, r, &key, s->x, want, got);
        s->x = NULL;
    }
    stat_add(&t->st.messages_received, 1);
    stat_add(&t->st.bytes_received, bytes);
    sync_pending(t);
}

/* Takes rank r's first parked message off its queue. */
static pp_tp_parked *pop(pp_transport *t, int r) {
    peer *p = &t->peers[r];
    pp_tp_parked *m = p->park_head;
    p->park_head = m->next;
    if (!p->park_head) p->park_tail = NULL;
    p->park_n--;
    p->park_bytes -= m->bytes;
    t->n_parked--;
    return m;
}

/* Finishes rank r's parked messages in order while their bytes are there
 * (until_room: waiting for the first ones' while the queue is full, only
 * until there is room: the others may not have begun to come). Returns
 * how many. */
static int advance(pp_transport *t, int r, const pp_mbox_key *want, pp_tensor **got, int until_room) {
    peer *p = &t->peers[r];
    int k = 0;
    while (p->park_head && read_lane(t, r, p->park_head, until_room && p->park_n >= PP_PARK_MAX)) {
        pp_tp_parked *m = pop(t, r); /* off the queue first: acting on it may reset the lane */
        /* the next one's bytes come after this one's: its clock starts now */
        if (p->park_head) p->park_head->parked_ms = now_ms();
        finish(t, r, m, want, got);
        pp_tp_park_free(m);
        k++;
    }
    return k;
}

void pp_tp_park_add(pp_transport *t, int r, pp_tp_parked *m, const pp_mbox_key *want, pp_tensor **got) {
    peer *p = &t->peers[r];
    /* bounded: past the cap, the first ones are waited for as before parking */
    if (p->park_n >= PP_PARK_MAX) advance(t, r, want, got, 1);
    m->parked_ms = now_ms();
    if (p->park_tail) p->park_tail->next = m;
    else p->park_head = m;
    p->park_tail = m;
    p->park_n++;
    p->park_bytes += m->bytes;
    t->n_parked++;
    advance(t, r, want, got, 0);
}

int pp_tp_park_resume(pp_transport *t, const pp_mbox_key *want, pp_tensor **got) {
    int k = 0;
    for (int r = 0; t->n_parked && r < t->nranks; r++)
        if (t->peers[r].park_head) k += advance(t, r, want, got, 0);
    return k;
}

int pp_tp_park_items(pp_transport *t, zmq_pollitem_t *it, int64_t *timeout) {
    int n = 0;
    int64_t now = now_ms();
    for (int r = 0; t->n_parked && r < t->nranks; r++) {
        pp_tp_parked *m = t->peers[r].park_head;
        if (!m) continue;
        int64_t left = m->parked_ms + t->timeout_ms - now;
        if (left < *timeout) *timeout = left > 0 ? left : 0; /* wake to fail it in time */
        int fd = pp_tp_bulk_rx_fd(t, r);
        if (fd >= 0) it[n++] = (zmq_pollitem_t){NULL, fd, ZMQ_POLLIN, 0};
        else *timeout = 0; /* no lane: the next pass fails it */
        /* a lane not yet connected: the listener's fd wakes for the
         * connection, not for its hello (read by the next pass), so look
         * again soon */
        if (t->peers[r].bulk_rx.fd < 0 && *timeout > 10) *timeout = 10;
    }
    return n;
}

void pp_tp_park_clear(pp_transport *t, int r) {
    peer *p = &t->peers[r];
    if (p->park_n)
        pp_warn("transport rank %d: %d messages from rank %d (%s) that waited for its bulk lane are dropped "
                "with it", t->rank, p->park_n, r, peer_ep(t, r));
    while (p->park_head) pp_tp_park_free(pop(t, r));
}

const char *pp_tp_park_note(const pp_transport *t, int r, char *buf, size_t cap) {
    buf[0] = 0;
    if (r == t->rank) return buf;
    const peer *p = &t->peers[r];
    if (p->park_head)
        snprintf(buf, cap, "; %d messages from it wait for their bytes on its bulk lane", p->park_n);
    else if (p->bulk_fail[0])
        snprintf(buf, cap, "; its bulk lane broke: %s", p->bulk_fail);
    return buf;
}

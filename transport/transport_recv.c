/* Receiving: messages from the socket and from same-host peers' message
 * rings are checked, then their tensors filed in the mailbox (or handed
 * straight to a receive waiting for them). */
#include "transport_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pippin/exec.h"

/* Messages moved from the socket per pass before peer states are re-read. */
#define DRAIN_BATCH 256
/* Receive scratch for this many frames to begin with. */
#define INITIAL_FRAMES 16
/* Stack space for this many frames' pointers when reassembling a tensor. */
#define STACK_FRAMES 8
/* Longest single poll. */
#define WAIT_MAX_MS 60000

/* Counts a dropped message (also in counter, a breakdown, if given) and
 * warns about it: the first ten, then every power of two. */
/* "IP:PORT" or "[IP6]:PORT" of a tcp peer into buf; 0 for other families. */
static int format_sockaddr(const struct sockaddr_storage *sa, char buf[PEER_ADDR_CHARS]) {
    char ip[INET6_ADDRSTRLEN];
    if (sa->ss_family == AF_INET &&
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, ip, sizeof ip)) {
        snprintf(buf, PEER_ADDR_CHARS, "%s:%u", ip, ntohs(((const struct sockaddr_in *)sa)->sin_port));
        return 1;
    }
    if (sa->ss_family == AF_INET6 &&
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, ip, sizeof ip)) {
        snprintf(buf, PEER_ADDR_CHARS, "[%s]:%u", ip, ntohs(((const struct sockaddr_in6 *)sa)->sin6_port));
        return 1;
    }
    return 0;
}

/* The address of the connection a message came in on. The socket is asked
 * every time (getpeername: a descriptor reused by another connection gives
 * another answer); only the text is reused when the answer is the last
 * one's, since formatting it cost as much as the rest of a small message's
 * checks. t NULL: nothing reused. */
static const char *msg_addr(pp_transport *t, zmq_msg_t *m0, char buf[PEER_ADDR_CHARS]) {
    const char *zaddr = zmq_msg_gets(m0, "Peer-Address");
    /* tcp: libzmq gives the IP only, which every process on that host
     * shares; the connection's own port (from the socket it came in on)
     * pins the one connection that answered the handshake */
    int fd = zmq_msg_get(m0, ZMQ_SRCFD);
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (fd >= 0 && getpeername(fd, (struct sockaddr *)&sa, &len) == 0 && len <= sizeof sa) {
        if (t && t->addr_cache_len == len && memcmp(&t->addr_cache_sa, &sa, len) == 0) {
            memcpy(buf, t->addr_cache, PEER_ADDR_CHARS);
            return buf;
        }
        if (format_sockaddr(&sa, buf)) {
            if (t) {
                memcpy(&t->addr_cache_sa, &sa, len);
                t->addr_cache_len = len;
                memcpy(t->addr_cache, buf, PEER_ADDR_CHARS);
            }
            return buf;
        }
    }
    return zaddr; /* ipc: ":UID:GID:PID" names the process; tcp after the connection closed: the IP */
}

const char *pp_tp_peer_addr(zmq_msg_t *m0, char buf[PEER_ADDR_CHARS]) { return msg_addr(NULL, m0, buf); }

void pp_tp_drop(pp_transport *t, zmq_msg_t *m0, atomic_ullong *counter, const char *fmt, ...) {
    uint64_t n = atomic_load_explicit(&t->st.dropped, memory_order_relaxed) + 1;
    stat_add(&t->st.dropped, 1);
    if (counter) stat_add(counter, 1);
    if (n > 10 && (n & (n - 1)) != 0) return;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    char buf[PEER_ADDR_CHARS];
    const char *addr = m0 ? pp_tp_peer_addr(m0, buf) : NULL;
    pp_warn("transport rank %d (%s): dropped a message%s%s: %s (%" PRIu64 " dropped so far)", t->rank,
            t->endpoint, addr ? " from " : "", addr ? addr : "", why, n);
}

#define drop_msg(t, m0, ...) pp_tp_drop(t, m0, NULL, __VA_ARGS__)

static void free_zmq_msg(void *data, void *hint) {
    (void)data;
    zmq_msg_close(hint);
    free(hint);
}

static pp_status grow_frames(pp_transport *t, size_t need) {
    if (need <= t->frames_cap) return PP_OK;
    size_t cap = t->frames_cap ? t->frames_cap : INITIAL_FRAMES;
    while (cap < need) cap *= 2;
    zmq_msg_t *f = realloc(t->frames, cap * sizeof *f);
    if (!f) return pp_error(PP_ERR_NOMEM, "out of memory");
    t->frames = f;
    size_t *sz = realloc(t->sizes, cap * sizeof *sz);
    if (!sz) return pp_error(PP_ERR_NOMEM, "out of memory");
    t->sizes = sz;
    t->frames_cap = cap;
    return PP_OK;
}

/* Builds tensor i of a checked message from its frames (first frame f0). */
static pp_status build_tensor(pp_transport *t, const pp_wire_tensor *wt, size_t f0, pp_tensor **out) {
    if (wt->nframes == 1 && wt->nbytes >= t->zero_copy_min) {
        void *data = zmq_msg_data(&t->frames[f0]);
        size_t align = pp_dtype_size(wt->dtype);
        if (align < 8) align = 8;
        if (((uintptr_t)data & (align - 1)) == 0) {
            zmq_msg_t *keep = malloc(sizeof *keep);
            if (!keep) return pp_error(PP_ERR_NOMEM, "out of memory");
            zmq_msg_init(keep);
            zmq_msg_move(keep, &t->frames[f0]);
            pp_status s = pp_tensor_wrap(wt->dtype, wt->ndim, wt->shape, zmq_msg_data(keep),
                                         free_zmq_msg, keep, out);
            if (s != PP_OK) free_zmq_msg(NULL, keep);
            return s;
        }
    }
    if (wt->nframes > 1 && wt->nbytes >= POOL_MIN_BYTES && t->pool) {
        PP_TRY(pp_bufpool_tensor(t->pool, wt->dtype, wt->ndim, wt->shape, out));
        char *dst = (*out)->data;
        for (uint32_t k = 0; k < wt->nframes; k++) {
            memcpy(dst, zmq_msg_data(&t->frames[f0 + k]), t->sizes[f0 + k]);
            dst += t->sizes[f0 + k];
        }
        return PP_OK;
    }
    const void *stack_ptrs[STACK_FRAMES];
    const void **ptrs = wt->nframes <= STACK_FRAMES ? stack_ptrs : malloc(wt->nframes * sizeof *ptrs);
    if (!ptrs) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (uint32_t k = 0; k < wt->nframes; k++) ptrs[k] = zmq_msg_data(&t->frames[f0 + k]);
    pp_status s = pp_envelope_tensor_copy(wt, ptrs, &t->sizes[f0], out);
    if (ptrs != stack_ptrs) free(ptrs);
    return s;
}

static int same_key(const pp_mbox_key *want, const pp_mbox_key *key) {
    return want && want->kind == key->kind && want->step == key->step && want->microbatch == key->microbatch &&
           want->src_stage == key->src_stage && want->dst_stage == key->dst_stage && strcmp(want->name, key->name) == 0;
}

static int key_matches(const pp_mbox_key *want, const pp_envelope *env, const char *name) {
    pp_mbox_key key = {(int)env->kind, env->step, env->microbatch, env->src_stage, env->dst_stage, name};
    return same_key(want, &key);
}

static int receive_ring(pp_transport *t, int r, const pp_mbox_key *want, pp_tensor **got, int max);

/* Where a message came from: the ZeroMQ envelope frame m0 (its connection's
 * address looked up once, however many batch entries it holds), or (m0
 * NULL) rank ring_rank's message ring. */
typedef struct msg_src {
    zmq_msg_t *m0;
    int ring_rank;
    int addr_done;
    const char *addr;
    char addr_buf[PEER_ADDR_CHARS];
} msg_src;

static const char *src_addr(pp_transport *t, msg_src *src) {
    if (!src->addr_done) {
        src->addr = src->m0 ? msg_addr(t, src->m0, src->addr_buf) : NULL;
        src->addr_done = 1;
    }
    return src->addr;
}

/* Acts on a control text from (checked) rank r: a goodbye, message ring
 * announcements, bulk lane set-up. m0 (NULL: none) names where it came
 * from in warnings. */
void pp_tp_control(pp_transport *t, int r, const char *text, zmq_msg_t *m0, const pp_mbox_key *want,
                   pp_tensor **got) {
    peer *p = &t->peers[r];
    if (strcmp(text, CTL_BYE) == 0) {
        set_state(p, PP_PEER_CLOSED);
        pp_debug("transport rank %d: rank %d (%s) closed its transport", t->rank, r, peer_ep(t, r));
    } else if (strncmp(text, CTL_MSGRING, PREFIX_LEN(CTL_MSGRING)) == 0 && t->bell) {
        /* the peer will write small messages to us through this ring:
         * open and check it first, so that a bad announcement leaves
         * the current one in place; what the peer wrote to the old one
         * comes first */
        const char *name = text + PREFIX_LEN(CTL_MSGRING);
        pp_shm_ring *fresh = NULL;
        if (!pp_tp_ring_name_ok(t, r, name) || pp_shm_ring_open(name, &fresh) != PP_OK) {
            drop_msg(t, m0, "claims rank %d: message ring '%s': %s", r, name, pp_last_error());
            return;
        }
        receive_ring(t, r, want, got, INT32_MAX); /* a receive may be waiting for one of them */
        receive_ring(t, r, NULL, NULL, INT32_MAX);
        if (p->rx_msg) t->n_rx_msg--;
        pp_shm_ring_close(p->rx_msg);
        p->rx_msg = fresh;
        t->n_rx_msg++;
        char ok[PP_ENVELOPE_MAX_TEXT];
        snprintf(ok, sizeof ok, CTL_MSGRING_OK "%s", name);
        pp_tp_tell(t, r);
        pp_tp_send_simple(t, r, PP_MSG_CONTROL, ok);
    } else if (strncmp(text, CTL_MSGRING_OK, PREFIX_LEN(CTL_MSGRING_OK)) == 0) {
        const char *name = text + PREFIX_LEN(CTL_MSGRING_OK);
        if (p->tx_msg && strcmp(name, pp_shm_ring_name(p->tx_msg)) == 0) p->tx_msg_ready = 1;
    } else if (!pp_tp_bulk_control(t, r, text)) {
        drop_msg(t, m0, "claims rank %d: unknown control command '%s'", r, text);
    }
}

static int has_bulk(const pp_envelope *env) {
    for (int i = 0; i < env->ntensors; i++)
        if (env->tensors[i].placement == PP_PLACE_BULK) return 1;
    return 0;
}

/* Builds tensor i of a checked message, not a bulk one (its data frames
 * from t->frames[f]). */
static pp_status build_one(pp_transport *t, const pp_envelope *env, int i, size_t f, pp_shm_ring *ring,
                           zmq_msg_t *m0, pp_tensor **out) {
    const pp_wire_tensor *wt = &env->tensors[i];
    pp_status s = wt->placement == PP_PLACE_INLINE ? pp_envelope_tensor_inline(env, i, out)
                  : wt->placement == PP_PLACE_SHM  ? pp_tp_shm_tensor(t, ring, wt, out)
                  : wt->placement == PP_PLACE_BULK ? pp_error(PP_ERR_PARSE, "a bulk tensor in a message ring")
                                                   : build_tensor(t, wt, f, out);
    if (s == PP_OK && (wt->placement == PP_PLACE_SHM || !m0)) stat_add(&t->st.shm_bytes_received, wt->nbytes);
    return s;
}

void pp_tp_file(pp_transport *t, int r, const pp_mbox_key *key, pp_tensor *x, const pp_mbox_key *want,
                pp_tensor **got) {
    if (got && !*got && same_key(want, key)) {
        *got = x;
        return;
    }
    if (pp_mailbox_put_from(t->mbox, key, r, x) != PP_OK) drop_msg(t, NULL, "%s", pp_last_error());
}

/* Files the tensors of a checked message from rank r that needs nothing
 * from a lane. */
static void file_message(pp_transport *t, int r, const pp_envelope *env, pp_shm_ring *ring, zmq_msg_t *m0,
                         const pp_mbox_key *want, pp_tensor **got) {
    size_t f = 1;
    uint64_t bytes = 0;
    for (int i = 0; i < env->ntensors; i++) {
        const pp_wire_tensor *wt = &env->tensors[i];
        pp_tensor *tensor = NULL;
        pp_status s = build_one(t, env, i, f, ring, m0, &tensor);
        f += wt->nframes;
        if (s != PP_OK) {
            drop_msg(t, m0, "claims rank %d: tensor '%s': %s", r, wt->name, pp_last_error());
            continue;
        }
        bytes += wt->nbytes;
        pp_mbox_key key = {(int)env->kind, env->step, env->microbatch, env->src_stage, env->dst_stage, wt->name};
        pp_tp_file(t, r, &key, tensor, want, got);
    }
    stat_add(&t->st.messages_received, 1);
    stat_add(&t->st.bytes_received, bytes);
    sync_pending(t);
}

/* Parks a checked message from rank r (bulk_park.c): its other tensors
 * built now (their frames and ring bytes are not kept), its bulk ones
 * allocated for the lane's bytes, which are read as they come. */
static void park_data(pp_transport *t, int r, const pp_envelope *env, pp_shm_ring *ring, zmq_msg_t *m0,
                      const pp_mbox_key *want, pp_tensor **got) {
    pp_tp_parked *m = pp_tp_park_new(env);
    if (!m) {
        drop_msg(t, m0, "claims rank %d: %s", r, pp_last_error());
        return;
    }
    size_t f = 1;
    for (int i = 0; i < env->ntensors; i++) {
        const pp_wire_tensor *wt = &env->tensors[i];
        m->slot[i].bulk = wt->placement == PP_PLACE_BULK && m0;
        pp_status s = m->slot[i].bulk ? pp_tp_bulk_alloc(t, wt, &m->slot[i].x)
                                      : build_one(t, env, i, f, ring, m0, &m->slot[i].x);
        f += wt->nframes;
        if (s != PP_OK) drop_msg(t, m0, "claims rank %d: tensor '%s': %s", r, wt->name, pp_last_error());
    }
    pp_tp_park_add(t, r, m, want, got);
}

/* Parks a control text from rank r behind its parked messages. */
static void park_control(pp_transport *t, int r, const pp_envelope *env, const pp_mbox_key *want,
                         pp_tensor **got) {
    pp_tp_parked *m = pp_tp_park_new(env);
    if (!m) {
        drop_msg(t, NULL, "claims rank %d: %s", r, pp_last_error());
        return;
    }
    pp_tp_park_add(t, r, m, want, got);
}

/* Checks a decoded message (data frames t->frames[1..n) for a message from
 * the socket; a batch entry has none), then files its tensors. A tensor
 * matching want is handed to *got instead of being filed (the caller
 * checked the mailbox holds nothing under that key). */
static void handle_decoded(pp_transport *t, pp_envelope *envp, msg_src *src, size_t n,
                           const pp_mbox_key *want, pp_tensor **got) {
    pp_envelope env = *envp;
    zmq_msg_t *m0 = src->m0;
    int ring_rank = src->ring_rank;
    pp_shm_ring *ring = NULL;
    for (size_t i = 1; i < n; i++) t->sizes[i] = zmq_msg_size(&t->frames[i]);
    int r = env.src_rank;
    if (pp_envelope_check_frames(&env, n - 1, t->sizes + 1) != PP_OK) {
        drop_msg(t, m0, "claims rank %d: %s", r, pp_last_error());
        goto done;
    }
    if (r == t->rank) {
        drop_msg(t, m0, "claims to come from this rank (%d)", r);
        goto done;
    }
    if (!m0 && (r != ring_rank || (env.kind != PP_MSG_ACTIVATION && env.kind != PP_MSG_GRADIENT))) {
        drop_msg(t, m0, "a %s message claiming rank %d in rank %d's message ring",
                 pp_msg_kind_name((int)env.kind), r, ring_rank);
        goto done;
    }
    if (t->curve && m0) {
        const char *uid = zmq_msg_gets(m0, "User-Id");
        if (!uid || strcmp(uid, t->rank_keys[r]) != 0) {
            drop_msg(t, m0, "claims rank %d but was sent with CURVE key %s", r, uid ? uid : "(none)");
            goto done;
        }
    }
    peer *p = &t->peers[r];
    const char *addr = src_addr(t, src);
    if (env.kind == PP_MSG_CONTROL && env.ntensors == 0 &&
        (strncmp(env.text, CTL_HELLO, PREFIX_LEN(CTL_HELLO)) == 0 ||
         strncmp(env.text, CTL_HELLO_REPLY, PREFIX_LEN(CTL_HELLO_REPLY)) == 0)) {
        if (m0) pp_tp_handle_hello(t, r, &env, m0, addr);
        else drop_msg(t, m0, "a hello in rank %d's message ring", r);
        goto done;
    }
    /* Everything else only from the rank's handshake connection, in this run. */
    if (!t->run_known) {
        pp_tp_drop(t, m0, &t->st.dropped_foreign, "claims rank %d: this rank has not learned the run id yet "
                   "(run id %016" PRIx64 " claimed)", r, env.run_id);
        goto done;
    }
    if (env.run_id != t->run_id) {
        pp_tp_drop(t, m0, &t->st.dropped_foreign, "claims rank %d: run id %" PRIu64 ", this run is %" PRIu64,
                   r, env.run_id, t->run_id);
        goto done;
    }
    if (m0 && !p->verified) {
        pp_tp_drop(t, m0, &t->st.dropped_foreign, "claims rank %d, which has not answered this rank's hello",
                   r);
        goto done;
    }
    /* the nonce of the hello this rank verified: a message read after its
     * tcp connection closed has only the host's IP to show, which a
     * stranger on that host shares; the nonce it cannot know */
    if (env.sender_nonce != p->echo) {
        pp_tp_drop(t, m0, &t->st.dropped_foreign, "claims rank %d but does not carry the nonce of rank %d's "
                   "handshake", r, r);
        goto done;
    }
    if (m0 && !same_addr(p->addr, addr)) {
        pp_tp_drop(t, m0, &t->st.dropped_foreign, "claims rank %d, whose handshake came from '%s'", r,
                   p->addr ? p->addr : "(inproc)");
        goto done;
    }
    /* the sender is who it says (as far as this link can tell): its ring
     * may be opened */
    if (env.shm_name[0] && pp_tp_rx_ring(t, r, env.shm_name, &ring) != PP_OK) {
        drop_msg(t, m0, "claims rank %d: %s", r, pp_last_error());
        goto done;
    }
    if (peer_state(p) == PP_PEER_CLOSED && !p->restarted) /* it closed, and came back on the same connection */
        set_state(p, p->inproc ? PP_PEER_CONNECTING : PP_PEER_UP);
    if (env.kind == PP_MSG_ABORT) {
        if (!t->aborted) {
            t->aborted = 1;
            t->abort_rank = r;
            snprintf(t->abort_text, sizeof t->abort_text, "%s", env.text);
            pp_log_error("transport rank %d: rank %d (%s) aborted the run: %s", t->rank, r,
                         peer_ep(t, r), env.text);
        }
        goto done;
    }
    if (env.kind == PP_MSG_HEARTBEAT) goto done;
    if (env.kind == PP_MSG_CONTROL && env.ntensors == 0) {
        if (p->park_head) park_control(t, r, &env, want, got); /* after what it sent before */
        else pp_tp_control(t, r, env.text, m0, want, got);
        goto done;
    }
    if (t->stage_ranks[env.dst_stage] != t->rank) {
        drop_msg(t, m0, "claims rank %d: destination stage %d does not run on this rank", r,
                 env.dst_stage);
        goto done;
    }
    if (t->stage_ranks[env.src_stage] != r) {
        drop_msg(t, m0, "claims rank %d: source stage %d runs on rank %d", r, env.src_stage,
                 t->stage_ranks[env.src_stage]);
        goto done;
    }
    if (env.step < t->cur_step) {
        drop_msg(t, m0, "claims rank %d: step %" PRId64 " is before the current step %" PRId64, r, env.step,
                 t->cur_step);
        goto done;
    }
    if (t->step_set && t->step_window > 0 && env.step > t->cur_step + t->step_window) {
        pp_tp_drop(t, m0, &t->st.dropped_window, "claims rank %d: step %" PRId64 " is more than %" PRId64
                   " steps ahead of the current step %" PRId64, r, env.step, t->step_window, t->cur_step);
        goto done;
    }
    if (t->max_pending_per_peer) {
        /* what this message would leave waiting in the mailbox (a tensor a
         * receive is waiting for is not kept) */
        uint64_t keep = 0;
        /* a message that will park is not handed over now, whatever it holds */
        int handed = !(got && !*got) || p->park_head || (m0 && has_bulk(&env));
        for (int i = 0; i < env.ntensors; i++) {
            if (!handed && key_matches(want, &env, env.tensors[i].name)) handed = 1;
            else keep += env.tensors[i].nbytes;
        }
        /* parked messages count as the mailbox does: they are filed later */
        uint64_t have = pp_mailbox_owner_bytes(t->mbox, r) + p->park_bytes;
        if (keep && have + keep > t->max_pending_per_peer) {
            pp_tp_drop(t, m0, &t->st.dropped_over_cap, "claims rank %d: %" PRIu64 " bytes would join the %"
                       PRIu64 " already waiting from it, over max_pending_bytes_per_peer (%" PRIu64 ")", r,
                       keep, have, t->max_pending_per_peer);
            goto done;
        }
    }
    /* a message whose tensors' bytes come on the lane, or that must wait
     * behind one (per peer, in order), is parked until they are in */
    if (p->park_head || (m0 && has_bulk(&env))) park_data(t, r, &env, ring, m0, want, got);
    else file_message(t, r, &env, ring, m0, want, got);
done:
    if (ring) pp_tp_settle_ring(ring, &env);
}

/* A batch: each entry is decoded and checked as a message of its own from
 * the same connection (run id, handshake, address, nonce, stages, step
 * window, byte cap), and must be an activation or gradient with inline
 * tensors only; a bad entry is dropped alone. */
static void handle_batch(pp_transport *t, const pp_envelope *env, msg_src *src, size_t n,
                         const pp_mbox_key *want, pp_tensor **got) {
    zmq_msg_t *m0 = src->m0;
    if (!m0 || n != 1) {
        drop_msg(t, m0, "claims rank %d: a batch %s", env->src_rank,
                 m0 ? "with data frames" : "in a message ring");
        return;
    }
    for (int i = 0; i < env->nbatch; i++) {
        pp_envelope e;
        if (pp_envelope_decode_entry(env->batch[i].data, env->batch[i].len, &t->lim, &e) != PP_OK) {
            drop_msg(t, m0, "claims rank %d: batch entry %d: %s", env->src_rank, i, pp_last_error());
            continue;
        }
        if (e.src_rank != env->src_rank)
            drop_msg(t, m0, "batch from rank %d: entry %d claims rank %d", env->src_rank, i, e.src_rank);
        else
            handle_decoded(t, &e, src, 1, want, got);
        pp_envelope_clear(&e);
    }
}

/* Handles a complete message in t->frames[0..n): validate, then file.
 * Frame 0 is f0 (len0 bytes): the ZeroMQ frame m0, or (m0 NULL) a record of
 * rank ring_rank's message ring. */
static void handle_message(pp_transport *t, const void *f0, size_t len0, zmq_msg_t *m0, int ring_rank,
                           size_t n, int too_many, const pp_mbox_key *want, pp_tensor **got) {
    if (too_many) {
        drop_msg(t, m0, "more than %u data frames",
                 t->lim.max_frames ? t->lim.max_frames : PP_ENVELOPE_DEFAULT_MAX_FRAMES);
        return;
    }
    pp_envelope env;
    if (pp_envelope_decode(f0, len0, &t->lim, &env) != PP_OK) {
        drop_msg(t, m0, "%s", pp_last_error());
        return;
    }
    msg_src src = {m0, ring_rank, 0, NULL, {0}};
    if ((int)env.kind == PP_WIRE_KIND_BATCH) handle_batch(t, &env, &src, n, want, got);
    else handle_decoded(t, &env, &src, n, want, got);
    pp_envelope_clear(&env);
}

/* Handles up to max records waiting in rank r's message ring (stops early
 * once a tensor under want arrived). Returns how many. */
static int receive_ring(pp_transport *t, int r, const pp_mbox_key *want, pp_tensor **got, int max) {
    peer *p = &t->peers[r];
    int k = 0;
    while (p->rx_msg && k < max && !(got && *got)) {
        const void *data;
        size_t len;
        uint64_t end;
        int rc = pp_shm_ring_msg_next(p->rx_msg, &data, &len, &end);
        if (rc == 0) break;
        if (rc < 0) { /* nothing more can be trusted in it */
            drop_msg(t, NULL, "rank %d's message ring: %s", r, pp_last_error());
            pp_shm_ring_close(p->rx_msg);
            p->rx_msg = NULL;
            t->n_rx_msg--;
            break;
        }
        /* decode a private copy: the sender can still write the ring, and
         * the decoder reads its input twice (count, then fill) */
        if (len <= PP_ENVELOPE_MAX_BYTES) {
            if (!t->ring_copy && !(t->ring_copy = malloc(PP_ENVELOPE_MAX_BYTES))) break;
            memcpy(t->ring_copy, data, len);
            data = t->ring_copy;
        }
        handle_message(t, data, len, NULL, r, 1, 0, want, got);
        pp_shm_ring_release(p->rx_msg, end);
        k++;
    }
    return k;
}

static int receive_rings(pp_transport *t, const pp_mbox_key *want, pp_tensor **got, int max) {
    int k = 0;
    for (int r = 0; t->n_rx_msg && r < t->nranks && k < max; r++) k += receive_ring(t, r, want, got, max - k);
    return k;
}

/* Receives one whole message if one is waiting (in a message ring or on the
 * socket). Returns 1 if it handled a message, 0 if none was waiting. */
static int receive_one(pp_transport *t, const pp_mbox_key *want, pp_tensor **got, int wait_ms) {
    /* parked messages whose lane bytes came since (never waits) */
    if (t->n_parked && pp_tp_park_resume(t, want, got)) return 1;
    if (receive_rings(t, want, got, 1)) return 1;
    if (wait_ms > 0 && (t->n_rx_msg || t->n_parked)) { /* sleep on the socket, doorbell and lanes together */
        pp_tp_wait_events(t, wait_ms, NULL);
        return receive_one(t, want, got, 0);
    }
    if (grow_frames(t, INITIAL_FRAMES) != PP_OK) return 0;
    if (wait_ms > 0 && wait_ms != t->rcvtimeo) {
        /* a blocking receive with a timeout: one wait inside libzmq, no poll
         * round trip for every message */
        setopt_int(t->pull, ZMQ_RCVTIMEO, wait_ms);
        t->rcvtimeo = wait_ms;
    }
    zmq_msg_init(&t->frames[0]);
    if (wait_ms > 0) pp_share_cores_idle(1); /* a blocking wait lends this rank's threads */
    int got_one = zmq_msg_recv(&t->frames[0], t->pull, wait_ms > 0 ? 0 : ZMQ_DONTWAIT) >= 0;
    if (wait_ms > 0) pp_share_cores_idle(0);
    if (!got_one) {
        zmq_msg_close(&t->frames[0]);
        return 0;
    }
    size_t n = 1, max_frames = (t->lim.max_frames ? t->lim.max_frames : PP_ENVELOPE_DEFAULT_MAX_FRAMES) + 1;
    int too_many = 0, more = zmq_msg_more(&t->frames[0]);
    while (more) {
        /* the rest of a multipart message is already here: recv cannot block */
        zmq_msg_t scratch, *m = &scratch;
        if (n < max_frames && grow_frames(t, n + 1) == PP_OK) m = &t->frames[n];
        zmq_msg_init(m);
        if (zmq_msg_recv(m, t->pull, 0) < 0) {
            zmq_msg_close(m);
            too_many = 1; /* cannot happen; treat the message as bad */
            break;
        }
        more = zmq_msg_more(m);
        if (m == &scratch) {
            zmq_msg_close(m);
            too_many = 1;
        } else {
            n++;
        }
    }
    /* the envelope is the last frame (transport_send.c: send_data says
     * why); it goes to t->frames[0], the data frames after it in order */
    if (n > 1 && !too_many) {
        zmq_msg_t env;
        zmq_msg_init(&env);
        zmq_msg_move(&env, &t->frames[n - 1]);
        for (size_t i = n - 1; i > 0; i--) zmq_msg_move(&t->frames[i], &t->frames[i - 1]);
        zmq_msg_move(&t->frames[0], &env);
        zmq_msg_close(&env);
    }
    handle_message(t, zmq_msg_data(&t->frames[0]), zmq_msg_size(&t->frames[0]), &t->frames[0], -1, n,
                   too_many, want, got);
    for (size_t i = 0; i < n; i++) zmq_msg_close(&t->frames[i]);
    return 1;
}


/* Busy-polls the receive socket for up to spin_us before the caller blocks:
 * a message that arrives meanwhile is taken without the thread going to
 * sleep and being woken again, which costs more than the message itself
 * when messages are small. Returns 1 if it handled a message. */
/* Whether a wait may busy-poll now: spin_us is set, and no rank of the
 * host has borrowed lent threads since this rank last waited. Ranks whose
 * kernels split over lent cores need the waiting rank's core asleep (a
 * spinner holds it until the scheduler preempts it, which delays every
 * borrowed piece); ranks with small kernels never borrow and keep their
 * cores awake (docs/serving.md, spin_us). */
static int may_spin(pp_transport *t) {
    if (t->spin_ns <= 0) return 0;
    int64_t b = pp_share_cores_borrows();
    int quiet = b == t->spin_borrows;
    t->spin_borrows = b;
    return quiet;
}

static int spin_receive(pp_transport *t, const pp_mbox_key *want, pp_tensor **got) {
    if (!may_spin(t)) return 0;
    int64_t until = now_ns() + t->spin_ns;
    pp_share_cores_idle(1); /* lent while it spins: a borrower ends the spin */
    int found = 0;
    for (unsigned i = 1;; i++) {
        if ((found = receive_one(t, want, got, 0))) break;
        if ((i & 15) == 0 && (now_ns() >= until || pp_share_cores_borrowing())) break;
    }
    pp_share_cores_idle(0);
    return found;
}

/* Moves waiting messages into the mailbox, at most DRAIN_BATCH. Returns the
 * number handled; stops early when a tensor under want arrived (in *got). */
int pp_tp_drain(pp_transport *t, const pp_mbox_key *want, pp_tensor **got) {
    pp_tp_flush_held(t);
    int k = 0;
    while (k < DRAIN_BATCH && !(got && *got)) {
        if (!receive_one(t, want, got, 0)) break;
        k++;
    }
    return k;
}

/* Waits up to timeout ms for the receive socket, a monitor, the doorbell
 * (same-host peers' message rings), or (if out_peer is given) room to send
 * to that peer. The rings say "waiting" first and are looked at once more,
 * so a record written meanwhile either is seen or rings the doorbell.
 * Returns 1 if the send socket is writable. */
int pp_tp_wait_events(pp_transport *t, int64_t timeout, peer *out_peer) {
    int n = 0;
    zmq_pollitem_t *it = t->items;
    if (out_peer) it[n++] = (zmq_pollitem_t){out_peer->push, 0, ZMQ_POLLOUT, 0};
    it[n++] = (zmq_pollitem_t){t->pull, 0, ZMQ_POLLIN, 0};
    for (int r = 0; r < t->nranks; r++)
        if (t->peers[r].mon) it[n++] = (zmq_pollitem_t){t->peers[r].mon, 0, ZMQ_POLLIN, 0};
    int mon_end = n;
    /* room to send what is held back for other peers (the caller's next
     * pass sends it) */
    for (int r = 0; t->n_obox && r < t->nranks; r++)
        if (t->peers[r].obox_n && &t->peers[r] != out_peer && t->peers[r].push)
            it[n++] = (zmq_pollitem_t){t->peers[r].push, 0, ZMQ_POLLOUT, 0};
    if (timeout < 0) timeout = 0;
    if (timeout > WAIT_MAX_MS) timeout = WAIT_MAX_MS;
    /* the lanes parked messages wait on (woken by their bytes, or in time
     * to fail them) */
    if (t->n_parked) n += pp_tp_park_items(t, it + n, &timeout);
    /* same-host peers' message rings: say we sleep, then look once more */
    int rings = t->n_rx_msg > 0;
    if (rings) {
        it[n++] = (zmq_pollitem_t){NULL, pp_doorbell_fd(t->bell), ZMQ_POLLIN, 0};
        for (int r = 0; r < t->nranks; r++) {
            pp_shm_ring *mr = t->peers[r].rx_msg;
            const void *d;
            size_t l;
            uint64_t e;
            if (!mr) continue;
            pp_shm_ring_set_waiting(mr, 1);
            if (pp_shm_ring_msg_next(mr, &d, &l, &e) != 0) timeout = 0; /* a record (or trouble) is there */
        }
    }
    /* a blocking wait lends this rank's threads to a busy one on the host */
    if (timeout > 0) pp_share_cores_idle(1);
    int rc = zmq_poll(it, n, (long)timeout);
    if (timeout > 0) pp_share_cores_idle(0);
    if (rings) {
        for (int r = 0; r < t->nranks; r++)
            if (t->peers[r].rx_msg) pp_shm_ring_set_waiting(t->peers[r].rx_msg, 0);
        pp_doorbell_clear(t->bell);
    }
    if (rc < 0) return 0;
    int k = 0, writable = 0;
    if (out_peer) writable = (it[k++].revents & ZMQ_POLLOUT) != 0;
    k++; /* the receive socket: drained by the caller */
    for (; k < mon_end; k++)
        if (it[k].revents & ZMQ_POLLIN) {
            pp_tp_read_monitors(t);
            break;
        }
    return writable;
}

/* ---- public ---- */

/* What every receive does first: the key checked, and the tensor taken if
 * the mailbox already holds it. */
static pp_status recv_start(pp_transport *t, const pp_transport_key *key, pp_mbox_key *k, pp_tensor **out) {
    *out = NULL;
    PP_TRY(pp_tp_check_key(t, key, 0));
    if (!name_ok(key->name))
        return pp_error(PP_ERR_INVALID, "transport rank %d: tensor name must be 1..%u printable bytes",
                        t->rank, PP_ENVELOPE_MAX_NAME);
    if (t->aborted) return pp_tp_abort_error(t);
    *k = (pp_mbox_key){(int)key->kind, key->step, key->microbatch, key->src_stage, key->dst_stage, key->name};
    if ((*out = pp_mailbox_take(t->mbox, k))) sync_pending(t);
    return PP_OK;
}

pp_status pp_transport_recv(pp_transport *t, const pp_transport_key *key, int timeout_ms,
                            pp_tensor **out) {
    pp_mbox_key k;
    PP_TRY(recv_start(t, key, &k, out));
    if (*out) return PP_OK;
    int timeout = timeout_ms < 0 ? t->timeout_ms : timeout_ms;
    int64_t now = now_ms(), deadline = now + timeout;
    /* Monitors are read (and the peer judged) every grace period, or at once
     * when what is already known says the peer is gone; in between the loop
     * is one blocking receive per message, as cheap as a plain zmq_recv. */
    int64_t next_check = now + t->grace_ms;
    int r = t->stage_ranks[key->src_stage];
    action act = {0, &k, 1};
    for (;;) {
        int64_t wake = deadline;
        if (now >= next_check || now >= deadline || pp_tp_peer_looks_gone(t, r, now)) {
            /* what already arrived counts, even from a peer that is gone now */
            pp_tp_read_monitors(t);
            pp_tp_drain(t, &k, out);
            if (*out) {
                sync_pending(t);
                return PP_OK;
            }
            if (t->aborted) return pp_tp_abort_error(t);
            PP_TRY(pp_tp_check_peer(t, r, &act, now, &wake));
            next_check = now + t->grace_ms;
            if (now >= deadline) {
                stat_add(&t->st.timeouts, 1);
                pp_peer_state ps = r == t->rank ? PP_PEER_SELF : peer_state(&t->peers[r]);
                char doing[ACTION_CHARS], note[256] = "";
                /* a poll (timeout 0) that finds nothing is routine (the serving
                 * front polls every batch): no scan of the open descriptors */
                if (timeout > 0) pp_tp_conn_note(t, note, sizeof note);
                if (!note[0]) pp_tp_park_note(t, r, note, sizeof note); /* waiting on (or lost with) its lane */
                return pp_error(PP_ERR_TIMEOUT, "transport rank %d: timed out after %d ms %s from rank "
                                "%d (%s, %s)%s", t->rank, timeout, pp_tp_action_str(&act, doing, sizeof doing),
                                r, peer_ep(t, r), pp_peer_state_name(ps), note);
            }
        }
        int64_t until = wake < next_check ? wake : next_check;
        if (until > deadline) until = deadline;
        int wait = until > now ? (int)(until - now) : 1;
        if (t->n_obox) { /* messages held back for a peer go as soon as it has room */
            pp_tp_flush_held(t);
            if (t->n_obox && !receive_one(t, &k, out, 0)) {
                pp_tp_wait_events(t, wait, NULL);
                receive_one(t, &k, out, 0);
            }
        } else if (!spin_receive(t, &k, out)) {
            receive_one(t, &k, out, wait);
        }
        if (*out) {
            sync_pending(t);
            return PP_OK;
        }
        if (t->aborted) return pp_tp_abort_error(t);
        now = now_ms();
    }
}

pp_status pp_transport_take(pp_transport *t, const pp_transport_key *key, pp_tensor **out) {
    pp_mbox_key k;
    return recv_start(t, key, &k, out);
}

pp_status pp_transport_try_recv(pp_transport *t, const pp_transport_key *key, pp_tensor **out) {
    pp_mbox_key k;
    PP_TRY(recv_start(t, key, &k, out));
    if (*out) return PP_OK;
    pp_tp_read_monitors(t);
    pp_tp_drain(t, &k, out);
    if (*out) {
        sync_pending(t);
        return PP_OK;
    }
    return t->aborted ? pp_tp_abort_error(t) : PP_OK;
}

pp_status pp_transport_poll(pp_transport *t, int timeout_ms) {
    pp_tp_read_monitors(t);
    int got = pp_tp_drain(t, NULL, NULL);
    int64_t left_ns = (int64_t)timeout_ms * 1000000;
    if (!got && left_ns > 0 && may_spin(t)) { /* spin_us (within the timeout) before the thread sleeps */
        int64_t t0 = now_ns(), until = t0 + (t->spin_ns < left_ns ? t->spin_ns : left_ns);
        pp_share_cores_idle(1); /* lent while it spins: a borrower ends the spin */
        while (!(got = pp_tp_drain(t, NULL, NULL)) && now_ns() < until && !t->aborted && !pp_share_cores_borrowing()) {
        }
        pp_share_cores_idle(0);
        left_ns -= now_ns() - t0;
    }
    if (got == 0 && left_ns >= 1000000) { /* what is left of the timeout, in whole ms */
        pp_tp_wait_events(t, left_ns / 1000000, NULL);
        pp_tp_drain(t, NULL, NULL);
    }
    return t->aborted ? pp_tp_abort_error(t) : PP_OK;
}

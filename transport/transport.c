/* The transport: one PULL socket per rank, one PUSH per peer, messages in a
 * mailbox, deadlines everywhere. See include/pippin/transport.h for the
 * threading and tensor contracts. */
#include "pippin/transport.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bufpool.h"
#include "context.h"
#include "mailbox.h"
#include "doorbell.h"
#include "shm_ring.h"
#include "pippin/log.h"

#include "status_internal.h"
#include "log_internal.h"
#include "envelope.h"
#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_LINGER_MS 1000
#define DEFAULT_HWM 64 /* send side: libzmq leaks zero-copy frames still queued to a dead peer at close (seen with 1000) */
#define DEFAULT_RCVHWM 1000 /* receive side: libzmq's default; a deep queue keeps the receiver from sleeping per message */
#define DEFAULT_MAX_MESSAGE (UINT64_C(2) << 30)
#define DEFAULT_FRAME_BYTES ((size_t)1 << 20)
#define DEFAULT_ZERO_COPY_MIN ((size_t)64 << 10)
#define DEFAULT_SHM_BYTES ((int64_t)1 << 30)
/* A ring holds four of the largest tensor sent so far (so a few can be in
 * flight), rounded up to a power of two, at least this much. */
#define MIN_RING_BYTES ((size_t)1 << 20)
/* Message rings (small messages between same-host ranks). */
#define MSG_RING_BYTES ((size_t)4 << 20)
/* A sender waits this long for room in a full ring before it grows it. */
#define RING_WAIT_US 10000
#define HOST_ID_CHARS 256
#define DEFAULT_RECV_CACHE ((int64_t)512 << 20)
/* Reassembled tensors at least this big come from the buffer pool. */
#define POOL_MIN_BYTES ((size_t)1 << 20)
#define MAX_ENDPOINT 256
/* Messages moved from the socket per pass before peer states are re-read. */
#define DRAIN_BATCH 256
/* Stack space for this many tensors' metadata when sending. */
#define SEND_STACK_TENSORS 16

typedef struct peer {
    char *endpoint;         /* NULL: not known */
    void *push;             /* owned by the transport's thread */
    void *mon;              /* PAIR reading push's monitor events (tcp/ipc only) */
    int inproc;
    atomic_int state;       /* pp_peer_state */
    int64_t down_since;     /* monotonic ms when state became DOWN */
    const char *why;        /* last failure, for messages */
    uint64_t seq;
    int hello_sent;         /* our host id went out on the current connection */
    int hello_seen;         /* its hello arrived (on this incarnation) */
    int same_host;          /* its hello carried our host id: rings can be used */
    size_t ring_failed;     /* creating a ring this big failed: do not try again */
    pp_shm_ring *tx_ring;   /* ours, for large tensors to this peer */
    pp_shm_ring *old_ring;  /* replaced by tx_ring, closed once the peer has drained it */
    pp_shm_ring *rx_ring;   /* the peer's, for large tensors from it */
    /* Small messages between same-host ranks skip ZeroMQ: whole envelopes
     * go through a message ring, and the receiver's doorbell wakes it. */
    int bell_fd;            /* the peer's doorbell (-1: none known) */
    pp_shm_ring *tx_msg;    /* our message ring to it */
    int tx_msg_ready;       /* it confirmed it reads tx_msg */
    int tx_msg_failed;
    pp_shm_ring *rx_msg;    /* its message ring to us */
} peer;

typedef struct stat_counters {
    atomic_ullong messages_sent, messages_received, bytes_sent, bytes_received, dropped,
        retries, timeouts, peer_failures, pending, pending_bytes, shm_bytes_sent, shm_bytes_received;
} stat_counters;

struct pp_transport {
    int rank, nranks, nstages;
    int *stage_ranks;
    uint64_t run_id;
    int timeout_ms, hb_ivl_ms, hb_timeout_ms, linger_ms, grace_ms;
    int sndhwm, rcvhwm, sndbuf, rcvbuf;
    uint64_t max_message_bytes;
    size_t frame_bytes, zero_copy_min;
    int64_t step_window, cur_step;

    pp_zctx *zctx;
    void *ctx;
    void *pull;
    char endpoint[MAX_ENDPOINT];
    peer *peers;
    pp_mailbox *mbox;
    pp_bufpool *pool;
    pp_envelope_limits lim;

    int aborted, abort_rank;
    char abort_text[PP_ENVELOPE_MAX_TEXT + 1];

    int curve;
    char secret_z85[PP_CURVE_KEY_CHARS + 1], public_z85[PP_CURVE_KEY_CHARS + 1];
    char (*rank_keys)[PP_CURVE_KEY_CHARS + 1];
    pp_zap_domain *zap_domain;
    char zap_name[64];

    zmq_msg_t *frames;      /* receive scratch: frame 0 and the data frames */
    size_t *sizes;
    size_t frames_cap;
    zmq_pollitem_t *items;  /* poll scratch: 1 + pull + monitors */
    int rcvtimeo;           /* ZMQ_RCVTIMEO currently set on pull */
    int64_t spin_ns;        /* busy-poll this long before a receive blocks */
    size_t shm_bytes;       /* ring size per same-host peer; 0: rings off */
    pp_doorbell *bell;      /* ours, announced in hellos (NULL: no message rings) */
    int n_rx_msg;           /* peers' message rings we read */
    uint8_t *ring_copy;     /* a message ring record, copied before decoding */
    char host_id[HOST_ID_CHARS];

    stat_counters st;
};

static atomic_uint monitor_counter;

/* ---- small helpers ---- */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t now_ms(void) { return now_ns() / 1000000; }

static void stat_add(atomic_ullong *c, uint64_t n) {
    /* one writer (the owner thread): a relaxed load and store, no lock prefix */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

const char *pp_peer_state_name(pp_peer_state s) {
    switch (s) {
    case PP_PEER_UNKNOWN: return "endpoint unknown";
    case PP_PEER_CONNECTING: return "connecting";
    case PP_PEER_UP: return "connected";
    case PP_PEER_DOWN: return "disconnected";
    case PP_PEER_REJECTED: return "handshake refused";
    case PP_PEER_CLOSED: return "closed";
    case PP_PEER_SELF: return "self";
    }
    return "unknown";
}

/* Mirrors the mailbox size into the counters other threads may read. */
static void sync_pending(pp_transport *t) {
    atomic_store_explicit(&t->st.pending, pp_mailbox_count(t->mbox), memory_order_relaxed);
    atomic_store_explicit(&t->st.pending_bytes, pp_mailbox_bytes(t->mbox), memory_order_relaxed);
}

static const char *peer_ep(const pp_transport *t, int r) {
    if (r == t->rank) return t->endpoint;
    return t->peers[r].endpoint ? t->peers[r].endpoint : "(endpoint unknown)";
}

static pp_peer_state peer_state(const peer *p) { return (pp_peer_state)atomic_load(&((peer *)p)->state); }

static void set_state(peer *p, pp_peer_state s) { atomic_store(&p->state, (int)s); }

static int setopt_int(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }

static void close_socket(void *s) {
    if (!s) return;
    setopt_int(s, ZMQ_LINGER, 0);
    zmq_close(s);
}

static int endpoint_usable(const char *ep) { return ep && ep[0] && !strchr(ep, '*'); }

static int name_ok(const char *s) {
    if (!s || !s[0]) return 0;
    size_t n = 0;
    for (; s[n]; n++)
        if ((unsigned char)s[n] < 0x20 || s[n] == 0x7f || n >= PP_ENVELOPE_MAX_NAME) return 0;
    return 1;
}

/* Warns about a dropped message: the first ten, then every power of two. */
static void drop_msg(pp_transport *t, zmq_msg_t *m0, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void drop_msg(pp_transport *t, zmq_msg_t *m0, const char *fmt, ...) {
    uint64_t n = atomic_load_explicit(&t->st.dropped, memory_order_relaxed) + 1;
    stat_add(&t->st.dropped, 1);
    if (n > 10 && (n & (n - 1)) != 0) return;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    const char *addr = m0 ? zmq_msg_gets(m0, "Peer-Address") : NULL;
    pp_warn("transport rank %d (%s): dropped a message%s%s: %s (%" PRIu64 " dropped so far)", t->rank,
            t->endpoint, addr ? " from " : "", addr ? addr : "", why, n);
}

/* ---- options ---- */

void pp_transport_options_init(pp_transport_options *o) {
    memset(o, 0, sizeof *o);
    o->nranks = 1;
    o->timeout_ms = DEFAULT_TIMEOUT_MS;
    o->linger_ms = DEFAULT_LINGER_MS;
    o->sndhwm = DEFAULT_HWM;
    o->rcvhwm = DEFAULT_RCVHWM;
    o->max_message_bytes = DEFAULT_MAX_MESSAGE;
    o->frame_bytes = DEFAULT_FRAME_BYTES;
    o->zero_copy_min = DEFAULT_ZERO_COPY_MIN;
    o->io_threads = 1;
}

static pp_status copy_options(pp_transport *t, const pp_transport_options *o) {
    if (o->nranks < 1) return pp_error(PP_ERR_INVALID, "transport: nranks %d < 1", o->nranks);
    if (o->rank < 0 || o->rank >= o->nranks)
        return pp_error(PP_ERR_INVALID, "transport: rank %d not in [0, %d)", o->rank, o->nranks);
    if (!o->endpoints) return pp_error(PP_ERR_INVALID, "transport: no endpoints given");
    const char *own = o->bind_endpoint ? o->bind_endpoint : o->endpoints[o->rank];
    if (!own || !own[0])
        return pp_error(PP_ERR_INVALID, "transport: rank %d has no endpoint to bind", o->rank);
    t->rank = o->rank;
    t->nranks = o->nranks;
    t->run_id = o->run_id;
    t->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : DEFAULT_TIMEOUT_MS;
    t->hb_timeout_ms = o->heartbeat_timeout_ms > 0 ? o->heartbeat_timeout_ms : t->timeout_ms;
    t->hb_ivl_ms = o->heartbeat_ivl_ms > 0 ? o->heartbeat_ivl_ms
                                           : (t->hb_timeout_ms / 4 < 1000 ? t->hb_timeout_ms / 4 : 1000);
    if (t->hb_ivl_ms < 10) t->hb_ivl_ms = 10;
    t->grace_ms = t->hb_ivl_ms < 200 ? t->hb_ivl_ms : 200;
    t->linger_ms = o->linger_ms > 0 ? o->linger_ms : (o->linger_ms < 0 ? 0 : DEFAULT_LINGER_MS);
    t->sndhwm = o->sndhwm > 0 ? o->sndhwm : DEFAULT_HWM;
    t->rcvhwm = o->rcvhwm > 0 ? o->rcvhwm : DEFAULT_RCVHWM;
    t->sndbuf = o->sndbuf > 0 ? o->sndbuf : 0;
    t->rcvbuf = o->rcvbuf > 0 ? o->rcvbuf : 0;
    t->max_message_bytes = o->max_message_bytes ? o->max_message_bytes : DEFAULT_MAX_MESSAGE;
    if (t->max_message_bytes > (uint64_t)INT64_MAX) t->max_message_bytes = (uint64_t)INT64_MAX;
    t->frame_bytes = o->frame_bytes ? o->frame_bytes : DEFAULT_FRAME_BYTES;
    if (t->frame_bytes < 4096) t->frame_bytes = 4096;
    t->zero_copy_min = o->zero_copy_min ? o->zero_copy_min : DEFAULT_ZERO_COPY_MIN;
    t->step_window = o->step_window > 0 ? o->step_window : 0;
    t->shm_bytes = o->shm_bytes < 0 || o->curve_secret_key
                       ? 0 /* CURVE promises encrypted links: keep every byte on them */
                       : (size_t)(o->shm_bytes ? o->shm_bytes : DEFAULT_SHM_BYTES);
    t->spin_ns = o->spin_us > 0 ? (int64_t)o->spin_us * 1000 : 0;

    if (o->stage_ranks) {
        if (o->nstages < 1) return pp_error(PP_ERR_INVALID, "transport: stage_ranks given with nstages %d", o->nstages);
        t->nstages = o->nstages;
    } else {
        t->nstages = o->nstages > 0 ? o->nstages : o->nranks;
        if (t->nstages != o->nranks)
            return pp_error(PP_ERR_INVALID, "transport: %d stages on %d ranks need stage_ranks",
                            t->nstages, o->nranks);
    }
    t->stage_ranks = malloc((size_t)t->nstages * sizeof *t->stage_ranks);
    if (!t->stage_ranks) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int s = 0; s < t->nstages; s++) {
        int r = o->stage_ranks ? o->stage_ranks[s] : s;
        if (r < 0 || r >= o->nranks)
            return pp_error(PP_ERR_INVALID, "transport: stage %d on rank %d, not in [0, %d)", s, r,
                            o->nranks);
        t->stage_ranks[s] = r;
    }
    t->lim.max_message_bytes = t->max_message_bytes;
    t->lim.nstages = t->nstages;
    t->lim.nranks = t->nranks;

    if (o->curve_secret_key) {
        if (!zmq_has("curve"))
            return pp_error(PP_ERR_UNSUPPORTED, "transport: CURVE requested but libzmq lacks it");
        if (!pp_curve_key_valid(o->curve_secret_key))
            return pp_error(PP_ERR_INVALID, "transport: CURVE secret key is not 40 characters of Z85");
        if (!o->curve_rank_keys)
            return pp_error(PP_ERR_INVALID, "transport: CURVE needs the public key of every rank");
        t->curve = 1;
        memcpy(t->secret_z85, o->curve_secret_key, sizeof t->secret_z85);
        PP_TRY(pp_curve_public_key(t->secret_z85, t->public_z85));
        t->rank_keys = calloc((size_t)t->nranks, sizeof *t->rank_keys);
        if (!t->rank_keys) return pp_error(PP_ERR_NOMEM, "out of memory");
        for (int r = 0; r < t->nranks; r++) {
            if (!pp_curve_key_valid(o->curve_rank_keys[r]))
                return pp_error(PP_ERR_INVALID, "transport: CURVE public key of rank %d is not 40 "
                                "characters of Z85", r);
            memcpy(t->rank_keys[r], o->curve_rank_keys[r], PP_CURVE_KEY_CHARS + 1);
        }
        if (strcmp(t->rank_keys[t->rank], t->public_z85) != 0)
            return pp_error(PP_ERR_INVALID, "transport: rank %d's public key in the key list does "
                            "not belong to its secret key", t->rank);
    }
    return PP_OK;
}

/* ---- sockets ---- */

static pp_status common_sockopts(pp_transport *t, void *s, const char *what) {
    int hb_ttl = t->hb_timeout_ms < 100 ? 100 : (t->hb_timeout_ms > 65000 ? 65000 : t->hb_timeout_ms);
    if (setopt_int(s, ZMQ_HEARTBEAT_IVL, t->hb_ivl_ms) || setopt_int(s, ZMQ_HEARTBEAT_TIMEOUT, t->hb_timeout_ms) ||
        setopt_int(s, ZMQ_HEARTBEAT_TTL, hb_ttl) || setopt_int(s, ZMQ_HANDSHAKE_IVL, t->hb_timeout_ms) ||
        (t->sndbuf && setopt_int(s, ZMQ_SNDBUF, t->sndbuf)) || (t->rcvbuf && setopt_int(s, ZMQ_RCVBUF, t->rcvbuf)))
        return pp_error(PP_ERR_IO, "transport rank %d: %s socket options: %s", t->rank, what,
                        zmq_strerror(zmq_errno()));
    return PP_OK;
}

static pp_status open_pull(pp_transport *t, const char *bind_ep) {
    t->pull = zmq_socket(t->ctx, ZMQ_PULL);
    if (!t->pull)
        return pp_error(PP_ERR_IO, "transport rank %d: zmq_socket: %s", t->rank, zmq_strerror(zmq_errno()));
    int64_t maxmsg = (int64_t)t->max_message_bytes;
    PP_TRY(common_sockopts(t, t->pull, "receive"));
    if (setopt_int(t->pull, ZMQ_RCVHWM, t->rcvhwm) || setopt_int(t->pull, ZMQ_LINGER, 0) ||
        zmq_setsockopt(t->pull, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg))
        return pp_error(PP_ERR_IO, "transport rank %d: receive socket options: %s", t->rank,
                        zmq_strerror(zmq_errno()));
    if (t->curve) {
        if (setopt_int(t->pull, ZMQ_CURVE_SERVER, 1) ||
            zmq_setsockopt(t->pull, ZMQ_CURVE_SECRETKEY, t->secret_z85, PP_CURVE_KEY_CHARS) ||
            zmq_setsockopt(t->pull, ZMQ_ZAP_DOMAIN, t->zap_name, strlen(t->zap_name)))
            return pp_error(PP_ERR_IO, "transport rank %d: CURVE server options: %s", t->rank,
                            zmq_strerror(zmq_errno()));
    }
    if (zmq_bind(t->pull, bind_ep) != 0)
        return pp_error(PP_ERR_IO, "transport rank %d: cannot bind %s: %s", t->rank, bind_ep,
                        zmq_strerror(zmq_errno()));
    size_t len = sizeof t->endpoint;
    if (zmq_getsockopt(t->pull, ZMQ_LAST_ENDPOINT, t->endpoint, &len) != 0 || !t->endpoint[0])
        snprintf(t->endpoint, sizeof t->endpoint, "%s", bind_ep);
    return PP_OK;
}

static void peer_close(peer *p) {
    if (p->mon) {
        if (p->push) zmq_socket_monitor(p->push, NULL, 0);
        close_socket(p->mon);
        p->mon = NULL;
    }
    if (p->push) {
        zmq_close(p->push); /* linger was set at creation */
        p->push = NULL;
    }
}

static pp_status open_push(pp_transport *t, int r) {
    peer *p = &t->peers[r];
    p->push = zmq_socket(t->ctx, ZMQ_PUSH);
    if (!p->push)
        return pp_error(PP_ERR_IO, "transport rank %d: zmq_socket: %s", t->rank, zmq_strerror(zmq_errno()));
    PP_TRY(common_sockopts(t, p->push, "send"));
    if (setopt_int(p->push, ZMQ_SNDHWM, t->sndhwm) || setopt_int(p->push, ZMQ_LINGER, t->linger_ms) ||
        setopt_int(p->push, ZMQ_IMMEDIATE, 1) || setopt_int(p->push, ZMQ_RECONNECT_IVL, 100) ||
        setopt_int(p->push, ZMQ_RECONNECT_IVL_MAX, 1000))
        return pp_error(PP_ERR_IO, "transport rank %d: send socket options: %s", t->rank,
                        zmq_strerror(zmq_errno()));
    if (t->curve) {
        if (zmq_setsockopt(p->push, ZMQ_CURVE_SERVERKEY, t->rank_keys[r], PP_CURVE_KEY_CHARS) ||
            zmq_setsockopt(p->push, ZMQ_CURVE_PUBLICKEY, t->public_z85, PP_CURVE_KEY_CHARS) ||
            zmq_setsockopt(p->push, ZMQ_CURVE_SECRETKEY, t->secret_z85, PP_CURVE_KEY_CHARS))
            return pp_error(PP_ERR_IO, "transport rank %d: CURVE client options: %s", t->rank,
                            zmq_strerror(zmq_errno()));
    }
    return PP_OK;
}

static pp_status connect_peer(pp_transport *t, int r, const char *ep) {
    peer *p = &t->peers[r];
    if (p->push && p->endpoint && strcmp(p->endpoint, ep) == 0) return PP_OK;
    char *copy = strdup(ep);
    if (!copy) return pp_error(PP_ERR_NOMEM, "out of memory");
    if (p->push && p->endpoint) zmq_disconnect(p->push, p->endpoint);
    free(p->endpoint);
    p->endpoint = copy;
    p->inproc = strncmp(ep, "inproc://", 9) == 0;
    if (!p->push) {
        pp_status s = open_push(t, r);
        if (s == PP_OK && !p->inproc) {
            char mon_ep[64];
            snprintf(mon_ep, sizeof mon_ep, "inproc://pippin-monitor-%u",
                     atomic_fetch_add(&monitor_counter, 1) + 1);
            int events = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                         ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
            if (zmq_socket_monitor(p->push, mon_ep, events) != 0 ||
                !(p->mon = zmq_socket(t->ctx, ZMQ_PAIR)) || zmq_connect(p->mon, mon_ep) != 0)
                s = pp_error(PP_ERR_IO, "transport rank %d: monitor for rank %d: %s", t->rank, r,
                             zmq_strerror(zmq_errno()));
        }
        if (s != PP_OK) {
            peer_close(p);
            return s;
        }
    }
    if (zmq_connect(p->push, ep) != 0)
        return pp_error(PP_ERR_IO, "transport rank %d: cannot connect to rank %d at %s: %s", t->rank, r,
                        ep, zmq_strerror(zmq_errno()));
    set_state(p, PP_PEER_CONNECTING);
    return PP_OK;
}

/* ---- monitors ---- */

/* Stops using the peer's ring. The receiver may still have to open it by
 * name (a message naming it can be in flight), so it stays until drained. */
static void retire_ring(peer *p) {
    if (!p->tx_ring) return;
    pp_shm_ring_close(p->old_ring);
    p->old_ring = p->tx_ring;
    p->tx_ring = NULL;
}

static void peer_event(pp_transport *t, int r, uint16_t ev) {
    peer *p = &t->peers[r];
    pp_peer_state s = peer_state(p);
    switch (ev) {
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        if (s != PP_PEER_CLOSED) set_state(p, PP_PEER_UP);
        p->hello_sent = 0; /* maybe a new incarnation: tell it our host again */
        pp_debug("transport rank %d: connected to rank %d (%s)", t->rank, r, peer_ep(t, r));
        break;
    case ZMQ_EVENT_DISCONNECTED:
        if (s == PP_PEER_UP || s == PP_PEER_CONNECTING) {
            if (s == PP_PEER_UP) stat_add(&t->st.peer_failures, 1);
            set_state(p, PP_PEER_DOWN);
            p->down_since = now_ms();
            p->why = "connection lost (process exited, crashed, or silent past the heartbeat timeout)";
            /* whoever comes back says hello again and gets fresh rings */
            retire_ring(p);
            p->hello_seen = p->same_host = 0;
            pp_shm_ring_close(p->tx_msg);
            p->tx_msg = NULL;
            p->tx_msg_ready = p->tx_msg_failed = 0;
            if (p->bell_fd >= 0) close(p->bell_fd);
            p->bell_fd = -1;
            pp_info("transport rank %d: lost connection to rank %d (%s)", t->rank, r, peer_ep(t, r));
        }
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        set_state(p, PP_PEER_REJECTED);
        p->down_since = now_ms();
        p->why = "the peer refused our CURVE key";
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        set_state(p, PP_PEER_REJECTED);
        p->down_since = now_ms();
        p->why = "handshake protocol error (security settings differ?)";
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        if (s == PP_PEER_UP || s == PP_PEER_CONNECTING) {
            if (s == PP_PEER_UP) stat_add(&t->st.peer_failures, 1);
            set_state(p, PP_PEER_DOWN);
            p->down_since = now_ms();
            p->why = "handshake failed or timed out";
        }
        break;
    default:
        break;
    }
}

static void read_monitor(pp_transport *t, int r) {
    peer *p = &t->peers[r];
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        uint16_t ev = 0;
        if (zmq_msg_size(&m) >= 6) memcpy(&ev, zmq_msg_data(&m), 2);
        int more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        while (more) { /* the endpoint frame */
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, p->mon, 0) < 0) {
                zmq_msg_close(&m);
                break;
            }
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        peer_event(t, r, ev);
    }
}

static int send_simple(pp_transport *t, int r, pp_msg_kind kind, const char *text);

/* Tells a newly connected peer which host we are on, so that it can send
 * us large tensors through a shared-memory ring if it is on the same one. */
static void say_hello(pp_transport *t, int r, const char *word) {
    peer *p = &t->peers[r];
    if (peer_state(p) != PP_PEER_UP || !t->shm_bytes || !t->host_id[0]) return;
    char text[HOST_ID_CHARS + 160];
    snprintf(text, sizeof text, "%s host=%s%s%s", word, t->host_id, t->bell ? " bell=" : "",
             t->bell ? pp_doorbell_path(t->bell) : "");
    p->hello_sent = send_simple(t, r, PP_MSG_CONTROL, text);
}

static void read_monitors(pp_transport *t) {
    for (int r = 0; r < t->nranks; r++)
        if (t->peers[r].mon) {
            read_monitor(t, r);
            if (!t->peers[r].hello_sent) say_hello(t, r, "hello");
        }
}

/* ---- receiving ---- */

static void free_zmq_msg(void *data, void *hint) {
    (void)data;
    zmq_msg_close(hint);
    free(hint);
}

static pp_status grow_frames(pp_transport *t, size_t need) {
    if (need <= t->frames_cap) return PP_OK;
    size_t cap = t->frames_cap ? t->frames_cap : 16;
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
    const void *stack_ptrs[8];
    const void **ptrs = wt->nframes <= 8 ? stack_ptrs : malloc(wt->nframes * sizeof *ptrs);
    if (!ptrs) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (uint32_t k = 0; k < wt->nframes; k++) ptrs[k] = zmq_msg_data(&t->frames[f0 + k]);
    pp_status s = pp_envelope_tensor_copy(wt, ptrs, &t->sizes[f0], out);
    if (ptrs != stack_ptrs) free(ptrs);
    return s;
}

/* Rank r's ring called name, mapped on first use and again whenever the
 * peer starts a new one. */
static pp_status rx_ring(pp_transport *t, int r, const char *name, pp_shm_ring **out) {
    peer *p = &t->peers[r];
    if (!p->rx_ring || strcmp(pp_shm_ring_name(p->rx_ring), name) != 0) {
        pp_shm_ring_close(p->rx_ring);
        p->rx_ring = NULL;
        PP_TRY(pp_shm_ring_open(name, &p->rx_ring));
    }
    *out = p->rx_ring;
    return PP_OK;
}

/* A tensor from the sender's ring: its bytes where they are (the space goes
 * back to the sender when the tensor is freed), or copied out when the
 * record is not aligned. */
static pp_status shm_tensor(pp_transport *t, pp_shm_ring *ring, const pp_wire_tensor *wt,
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
static void settle_ring(pp_shm_ring *ring, const pp_envelope *env) {
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

static int key_matches(const pp_mbox_key *want, const pp_envelope *env, const char *name) {
    return want && want->kind == (int)env->kind && want->step == env->step &&
           want->microbatch == env->microbatch && want->src_stage == env->src_stage &&
           want->dst_stage == env->dst_stage && strcmp(want->name, name) == 0;
}

/* Handles a complete message in t->frames[0..n): validate, then file. */
/* A tensor matching want is handed to *got instead of being filed (the
 * caller checked the mailbox holds nothing under that key). */
static int receive_ring(pp_transport *t, int r, const pp_mbox_key *want, pp_tensor **got, int max);

/* Frame 0 is f0 (len0 bytes): the ZeroMQ frame m0, or (m0 NULL) a record of
 * rank ring_rank's message ring. */
static void handle_message(pp_transport *t, const void *f0, size_t len0, zmq_msg_t *m0, int ring_rank,
                           size_t n, int too_many, const pp_mbox_key *want, pp_tensor **got) {
    if (too_many) {
        drop_msg(t, m0, "more than %u data frames", t->lim.max_frames ? t->lim.max_frames : 65536u);
        return;
    }
    pp_envelope env;
    pp_shm_ring *ring = NULL;
    if (pp_envelope_decode(f0, len0, &t->lim, &env) != PP_OK) {
        drop_msg(t, m0, "%s", pp_last_error());
        return;
    }
    for (size_t i = 1; i < n; i++) t->sizes[i] = zmq_msg_size(&t->frames[i]);
    int r = env.src_rank;
    if (pp_envelope_check_frames(&env, n - 1, t->sizes + 1) != PP_OK) {
        drop_msg(t, m0, "claims rank %d: %s", r, pp_last_error());
        goto done;
    }
    if (env.run_id != t->run_id) {
        drop_msg(t, m0, "claims rank %d: run id %" PRIu64 ", this run is %" PRIu64, r, env.run_id,
                 t->run_id);
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
    if (t->curve) {
        const char *uid = zmq_msg_gets(m0, "User-Id");
        if (!uid || strcmp(uid, t->rank_keys[r]) != 0) {
            drop_msg(t, m0, "claims rank %d but was sent with CURVE key %s", r, uid ? uid : "(none)");
            goto done;
        }
    }
    /* the sender is who it says (as far as this link can tell): its ring
     * may be opened */
    if (env.shm_name[0] && rx_ring(t, r, env.shm_name, &ring) != PP_OK) {
        drop_msg(t, m0, "claims rank %d: %s", r, pp_last_error());
        goto done;
    }
    peer *p = &t->peers[r];
    if (peer_state(p) == PP_PEER_CLOSED) /* a new incarnation of that rank */
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
        if (strcmp(env.text, "bye") == 0) {
            set_state(p, PP_PEER_CLOSED);
            pp_debug("transport rank %d: rank %d (%s) closed its transport", t->rank, r, peer_ep(t, r));
        } else if (strncmp(env.text, "hello host=", 11) == 0 || strncmp(env.text, "hello-reply host=", 17) == 0) {
            int reply = env.text[5] == '-';
            const char *id = env.text + (reply ? 17 : 11), *bell = strstr(id, " bell=");
            size_t id_len = bell ? (size_t)(bell - id) : strlen(id);
            p->hello_seen = 1;
            p->same_host = t->shm_bytes && t->host_id[0] && strlen(t->host_id) == id_len &&
                           strncmp(id, t->host_id, id_len) == 0;
            if (p->bell_fd >= 0) close(p->bell_fd);
            p->bell_fd = p->same_host && bell ? pp_doorbell_open_peer(bell + 6) : -1;
            /* answer, so that after a reconnect on either side both know */
            if (!reply) say_hello(t, r, "hello-reply");
            pp_debug("transport rank %d: rank %d (%s) is on %s host", t->rank, r, peer_ep(t, r),
                     p->same_host ? "this" : "another");
        } else if (strncmp(env.text, "msgring ", 8) == 0 && t->bell) {
            /* the peer will write small messages to us through this ring;
             * what it wrote to the old one comes first */
            receive_ring(t, r, want, got, INT32_MAX); /* a receive may be waiting for one of them */
            receive_ring(t, r, NULL, NULL, INT32_MAX);
            if (p->rx_msg) t->n_rx_msg--;
            pp_shm_ring_close(p->rx_msg);
            p->rx_msg = NULL;
            if (pp_shm_ring_open(env.text + 8, &p->rx_msg) == PP_OK) {
                t->n_rx_msg++;
                char ok[PP_ENVELOPE_MAX_TEXT];
                snprintf(ok, sizeof ok, "msgring-ok %s", env.text + 8);
                send_simple(t, r, PP_MSG_CONTROL, ok);
            } else {
                pp_warn("transport rank %d: rank %d's message ring: %s", t->rank, r, pp_last_error());
            }
        } else if (strncmp(env.text, "msgring-ok ", 11) == 0) {
            if (p->tx_msg && strcmp(env.text + 11, pp_shm_ring_name(p->tx_msg)) == 0) p->tx_msg_ready = 1;
        } else {
            drop_msg(t, m0, "claims rank %d: unknown control command '%s'", r, env.text);
        }
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
    if (env.step < t->cur_step || (t->step_window > 0 && env.step > t->cur_step + t->step_window)) {
        drop_msg(t, m0, "claims rank %d: step %" PRId64 " outside the window [%" PRId64 ", %s%" PRId64 "]",
                 r, env.step, t->cur_step, t->step_window > 0 ? "" : "inf ",
                 t->step_window > 0 ? t->cur_step + t->step_window : (int64_t)0);
        goto done;
    }
    size_t f = 1;
    uint64_t bytes = 0;
    for (int i = 0; i < env.ntensors; i++) {
        const pp_wire_tensor *wt = &env.tensors[i];
        pp_tensor *tensor = NULL;
        pp_status s = wt->placement == PP_PLACE_INLINE ? pp_envelope_tensor_inline(&env, i, &tensor)
                      : wt->placement == PP_PLACE_SHM  ? shm_tensor(t, ring, wt, &tensor)
                                                       : build_tensor(t, wt, f, &tensor);
        f += wt->nframes;
        if (s != PP_OK) {
            drop_msg(t, m0, "claims rank %d: tensor '%s': %s", r, wt->name, pp_last_error());
            continue;
        }
        bytes += wt->nbytes;
        if (wt->placement == PP_PLACE_SHM || !m0) stat_add(&t->st.shm_bytes_received, wt->nbytes);
        if (got && !*got && key_matches(want, &env, wt->name)) {
            *got = tensor;
            continue;
        }
        pp_mbox_key key = {(int)env.kind, env.step, env.microbatch, env.src_stage, env.dst_stage, wt->name};
        if (pp_mailbox_put(t->mbox, &key, tensor) != PP_OK) drop_msg(t, m0, "%s", pp_last_error());
    }
    stat_add(&t->st.messages_received, 1);
    stat_add(&t->st.bytes_received, bytes);
    sync_pending(t);
done:
    if (ring) settle_ring(ring, &env);
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

static int wait_events(pp_transport *t, int64_t timeout, peer *out_peer);

/* Receives one whole message if one is waiting (in a message ring or on the
 * socket). Returns 1 if it handled a message, 0 if none was waiting. */
static int receive_one(pp_transport *t, const pp_mbox_key *want, pp_tensor **got, int wait_ms) {
    if (receive_rings(t, want, got, 1)) return 1;
    if (wait_ms > 0 && t->n_rx_msg) { /* sleep on the socket and the doorbell together */
        wait_events(t, wait_ms, NULL);
        return receive_one(t, want, got, 0);
    }
    if (grow_frames(t, 16) != PP_OK) return 0;
    if (wait_ms > 0 && wait_ms != t->rcvtimeo) {
        /* a blocking receive with a timeout: one wait inside libzmq, no poll
         * round trip for every message */
        setopt_int(t->pull, ZMQ_RCVTIMEO, wait_ms);
        t->rcvtimeo = wait_ms;
    }
    zmq_msg_init(&t->frames[0]);
    if (zmq_msg_recv(&t->frames[0], t->pull, wait_ms > 0 ? 0 : ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&t->frames[0]);
        return 0;
    }
    size_t n = 1, max_frames = (t->lim.max_frames ? t->lim.max_frames : 65536u) + 1;
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
    handle_message(t, zmq_msg_data(&t->frames[0]), zmq_msg_size(&t->frames[0]), &t->frames[0], -1, n,
                   too_many, want, got);
    for (size_t i = 0; i < n; i++) zmq_msg_close(&t->frames[i]);
    return 1;
}


/* Busy-polls the receive socket for up to spin_us before the caller blocks:
 * a message that arrives meanwhile is taken without the thread going to
 * sleep and being woken again, which costs more than the message itself
 * when messages are small. Returns 1 if it handled a message. */
static int spin_receive(pp_transport *t, const pp_mbox_key *want, pp_tensor **got) {
    if (t->spin_ns <= 0) return 0;
    int64_t until = now_ns() + t->spin_ns;
    for (unsigned i = 1;; i++) {
        if (receive_one(t, want, got, 0)) return 1;
        if ((i & 15) == 0 && now_ns() >= until) return 0;
    }
}

/* Moves waiting messages into the mailbox, at most DRAIN_BATCH. Returns the
 * number handled; stops early when a tensor under want arrived (in *got). */
static int drain(pp_transport *t, const pp_mbox_key *want, pp_tensor **got) {
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
static int wait_events(pp_transport *t, int64_t timeout, peer *out_peer) {
    int n = 0;
    zmq_pollitem_t *it = t->items;
    if (out_peer) it[n++] = (zmq_pollitem_t){out_peer->push, 0, ZMQ_POLLOUT, 0};
    it[n++] = (zmq_pollitem_t){t->pull, 0, ZMQ_POLLIN, 0};
    for (int r = 0; r < t->nranks; r++)
        if (t->peers[r].mon) it[n++] = (zmq_pollitem_t){t->peers[r].mon, 0, ZMQ_POLLIN, 0};
    if (timeout < 0) timeout = 0;
    if (timeout > 60000) timeout = 60000;
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
    int rc = zmq_poll(it, n, (long)timeout);
    if (rings) {
        for (int r = 0; r < t->nranks; r++)
            if (t->peers[r].rx_msg) pp_shm_ring_set_waiting(t->peers[r].rx_msg, 0);
        pp_doorbell_clear(t->bell);
        n--; /* the doorbell is not a monitor */
    }
    if (rc < 0) return 0;
    int k = 0, writable = 0;
    if (out_peer) writable = (it[k++].revents & ZMQ_POLLOUT) != 0;
    k++; /* the receive socket: drained by the caller */
    for (; k < n; k++)
        if (it[k].revents & ZMQ_POLLIN) {
            read_monitors(t);
            break;
        }
    return writable;
}

static pp_status abort_error(pp_transport *t) {
    if (t->abort_rank == t->rank)
        return pp_error(PP_ERR_PEER, "transport rank %d: this rank aborted the run: %s", t->rank,
                        t->abort_text);
    return pp_error(PP_ERR_PEER, "transport rank %d: rank %d (%s) aborted the run: %s", t->rank,
                    t->abort_rank, peer_ep(t, t->abort_rank), t->abort_text);
}

/* What a send or receive is doing, turned into text only for errors. */
typedef struct action {
    int sending;
    const pp_mbox_key *key;
    int ntensors;
} action;

static const char *action_str(const action *a, char *buf, size_t cap) {
    char k[400];
    pp_mbox_key_str(a->key, k, sizeof k);
    snprintf(buf, cap, "%s %s%s", a->sending ? "sending" : "waiting for", k,
             a->ntensors > 1 ? " (and more)" : "");
    return buf;
}

/* PP_OK while peer r can still be expected to deliver; an error naming it
 * once it is gone (disconnected for longer than the grace period, refused
 * us when sending, or closed). *wake is lowered to when that would change. */
static pp_status check_peer(pp_transport *t, int r, const action *act, int64_t now, int64_t *wake) {
    if (r == t->rank) return PP_OK;
    peer *p = &t->peers[r];
    pp_peer_state s = peer_state(p);
    int sending = act->sending;
    char doing[512];
    if (s == PP_PEER_CLOSED || s == PP_PEER_REJECTED || s == PP_PEER_DOWN)
        action_str(act, doing, sizeof doing);
    if (s == PP_PEER_CLOSED)
        return pp_error(PP_ERR_PEER, "transport rank %d: %s: rank %d (%s) has closed its transport",
                        t->rank, doing, r, peer_ep(t, r));
    if (s == PP_PEER_REJECTED && sending)
        return pp_error(PP_ERR_PEER, "transport rank %d: %s: rank %d (%s): %s", t->rank, doing, r,
                        peer_ep(t, r), p->why);
    if (s == PP_PEER_DOWN) {
        if (now - p->down_since >= t->grace_ms)
            return pp_error(PP_ERR_PEER, "transport rank %d: %s: rank %d (%s) is unreachable: %s",
                            t->rank, doing, r, peer_ep(t, r), p->why);
        if (p->down_since + t->grace_ms < *wake) *wake = p->down_since + t->grace_ms;
    }
    return PP_OK;
}

/* Cheap test on what is already known (no socket calls). */
static int peer_looks_gone(const pp_transport *t, int r, int64_t now) {
    if (t->aborted) return 1;
    if (r == t->rank) return 0;
    const peer *p = &t->peers[r];
    pp_peer_state s = peer_state(p);
    return s == PP_PEER_CLOSED || (s == PP_PEER_DOWN && now - p->down_since >= t->grace_ms);
}

/* ---- public: lifecycle ---- */

pp_status pp_transport_create(const pp_transport_options *opts, pp_transport **out) {
    *out = NULL;
    if (!opts) return pp_error(PP_ERR_INVALID, "transport: no options");
    pp_transport *t = calloc(1, sizeof *t);
    if (!t) return pp_error(PP_ERR_NOMEM, "out of memory");
    t->zap_domain = NULL;
    pp_status s = copy_options(t, opts);
    if (s == PP_OK) {
        t->peers = calloc((size_t)t->nranks, sizeof *t->peers);
        t->items = calloc((size_t)t->nranks + 3, sizeof *t->items);
        if (!t->peers || !t->items) s = pp_error(PP_ERR_NOMEM, "out of memory");
    }
    if (s == PP_OK && t->shm_bytes) {
        pp_shm_host_id(t->host_id, sizeof t->host_id);
        int stale = pp_shm_sweep_stale();
        if (stale) pp_info("transport rank %d: removed %d rings and doorbells of dead processes", t->rank, stale);
        if (t->host_id[0] && pp_doorbell_create(&t->bell) != PP_OK) /* small messages keep to the socket */
            pp_warn("transport rank %d: %s", t->rank, pp_last_error());
    }
    if (s == PP_OK) s = pp_mailbox_new(&t->mbox);
    if (s == PP_OK && opts->recv_cache_bytes >= 0)
        s = pp_bufpool_new(opts->recv_cache_bytes ? (size_t)opts->recv_cache_bytes
                                                  : (size_t)DEFAULT_RECV_CACHE, &t->pool);
    if (s == PP_OK) s = pp_zctx_acquire(opts->zmq_context, opts->io_threads, &t->zctx);
    if (s == PP_OK) {
        t->ctx = pp_zctx_handle(t->zctx);
        for (int r = 0; r < t->nranks; r++) {
            atomic_init(&t->peers[r].state, r == t->rank ? PP_PEER_SELF : PP_PEER_UNKNOWN);
            t->peers[r].bell_fd = -1;
        }
    }
    if (s == PP_OK && t->curve) {
        int nkeys = opts->curve_allowed_keys ? opts->n_curve_allowed_keys : t->nranks;
        uint8_t (*keys)[32] = calloc(nkeys > 0 ? (size_t)nkeys : 1, sizeof *keys);
        if (!keys) s = pp_error(PP_ERR_NOMEM, "out of memory");
        for (int i = 0; s == PP_OK && i < nkeys; i++) {
            const char *k = opts->curve_allowed_keys ? opts->curve_allowed_keys[i] : t->rank_keys[i];
            if (!pp_curve_key_valid(k))
                s = pp_error(PP_ERR_INVALID, "transport: allowed CURVE key %d is not 40 characters of Z85", i);
            else
                zmq_z85_decode(keys[i], k);
        }
        if (s == PP_OK)
            s = pp_zctx_add_domain(t->zctx, (const uint8_t(*)[32])keys, nkeys, &t->zap_domain,
                                   t->zap_name, sizeof t->zap_name);
        free(keys);
    }
    if (s == PP_OK) s = open_pull(t, opts->bind_endpoint ? opts->bind_endpoint : opts->endpoints[opts->rank]);
    for (int r = 0; s == PP_OK && r < t->nranks; r++)
        if (r != t->rank && endpoint_usable(opts->endpoints[r])) s = connect_peer(t, r, opts->endpoints[r]);
    if (s != PP_OK) {
        pp_status keep = s;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", pp_last_error());
        pp_transport_close(t);
        return pp_error(keep, "%s", msg);
    }
    pp_debug("transport rank %d: bound %s", t->rank, t->endpoint);
    *out = t;
    return PP_OK;
}

const char *pp_transport_endpoint(const pp_transport *t) { return t->endpoint; }

pp_status pp_transport_connect_peer(pp_transport *t, int rank, const char *endpoint) {
    if (rank < 0 || rank >= t->nranks || rank == t->rank)
        return pp_error(PP_ERR_INVALID, "transport rank %d: cannot connect to rank %d", t->rank, rank);
    if (!endpoint_usable(endpoint))
        return pp_error(PP_ERR_INVALID, "transport rank %d: '%s' is not an endpoint to connect to",
                        t->rank, endpoint ? endpoint : "(null)");
    return connect_peer(t, rank, endpoint);
}

pp_status pp_transport_wait_peers(pp_transport *t, int timeout_ms) {
    int64_t deadline = now_ms() + (timeout_ms < 0 ? t->timeout_ms : timeout_ms);
    for (;;) {
        read_monitors(t);
        drain(t, NULL, NULL);
        int64_t now = now_ms();
        char missing[512] = "";
        size_t len = 0;
        for (int r = 0; r < t->nranks; r++) {
            peer *p = &t->peers[r];
            if (r == t->rank || !p->push || p->inproc) continue;
            pp_peer_state s = peer_state(p);
            if (s == PP_PEER_REJECTED)
                return pp_error(PP_ERR_PEER, "transport rank %d: rank %d (%s): %s", t->rank, r,
                                peer_ep(t, r), p->why);
            if (s != PP_PEER_UP && len < sizeof missing - 1)
                len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d (%s, %s)",
                                        len ? ", " : "", r, peer_ep(t, r), pp_peer_state_name(s));
        }
        if (!len) return PP_OK;
        if (len >= sizeof missing) len = sizeof missing - 1;
        if (now >= deadline) {
            stat_add(&t->st.timeouts, 1);
            return pp_error(PP_ERR_TIMEOUT, "transport rank %d: ranks not connected after %d ms: %s",
                            t->rank, timeout_ms < 0 ? t->timeout_ms : timeout_ms, missing);
        }
        wait_events(t, deadline - now, NULL);
    }
}

static int send_simple(pp_transport *t, int r, pp_msg_kind kind, const char *text) {
    peer *p = &t->peers[r];
    if (!p->push) return 0;
    pp_envelope env = {0};
    env.version = PP_PROTOCOL_VERSION;
    env.kind = kind;
    env.run_id = t->run_id;
    env.step = t->cur_step;
    env.src_rank = t->rank;
    env.seq = ++p->seq;
    env.text = text;
    uint8_t buf[PP_ENVELOPE_MAX_TEXT + 128];
    size_t len;
    if (pp_envelope_pack(&env, buf, sizeof buf, &len) != PP_OK) return 0;
    return zmq_send(p->push, buf, len, ZMQ_DONTWAIT) >= 0;
}

void pp_transport_close(pp_transport *t) {
    if (!t) return;
    if (t->peers) {
        /* goodbye to every connected peer (a send to one that is not
         * connected fails at once: ZMQ_IMMEDIATE) */
        for (int r = 0; r < t->nranks; r++)
            if (r != t->rank && t->peers[r].push) send_simple(t, r, PP_MSG_CONTROL, "bye");
        for (int r = 0; r < t->nranks; r++) {
            peer_close(&t->peers[r]);
            pp_shm_ring_close(t->peers[r].tx_ring);
            pp_shm_ring_close(t->peers[r].old_ring);
            pp_shm_ring_close(t->peers[r].rx_ring);
            pp_shm_ring_close(t->peers[r].tx_msg);
            pp_shm_ring_close(t->peers[r].rx_msg);
            if (t->peers[r].bell_fd >= 0) close(t->peers[r].bell_fd);
            free(t->peers[r].endpoint);
        }
    }
    close_socket(t->pull);
    /* libzmq leaves the socket file of a bound ipc endpoint behind */
    if (t->pull && strncmp(t->endpoint, "ipc://", 6) == 0 && t->endpoint[6] != '@')
        unlink(t->endpoint + 6);
    if (t->frames_cap) {
        free(t->frames);
        free(t->sizes);
    }
    pp_mailbox_free(t->mbox);
    pp_bufpool_release(t->pool);
    pp_doorbell_close(t->bell);
    if (t->zctx) {
        pp_zctx_remove_domain(t->zctx, t->zap_domain);
        pp_zctx_release(t->zctx); /* may terminate the context: waits at most linger */
    }
    free(t->peers);
    free(t->items);
    free(t->ring_copy);
    free(t->stage_ranks);
    if (t->rank_keys) {
        memset(t->rank_keys, 0, (size_t)t->nranks * sizeof *t->rank_keys);
        free(t->rank_keys);
    }
    memset(t->secret_z85, 0, sizeof t->secret_z85);
    free(t);
}

/* ---- public: sending ---- */

static void release_tensor(void *data, void *hint) {
    (void)data;
    pp_tensor_free(hint);
}

static pp_status check_key(const pp_transport *t, const pp_transport_key *k, int sending) {
    if (!k) return pp_error(PP_ERR_INVALID, "transport rank %d: no key", t->rank);
    if (k->kind != PP_MSG_ACTIVATION && k->kind != PP_MSG_GRADIENT && k->kind != PP_MSG_CONTROL)
        return pp_error(PP_ERR_INVALID, "transport rank %d: cannot %s %s messages", t->rank,
                        sending ? "send" : "receive", pp_msg_kind_name((int)k->kind));
    if (k->step < 0 || k->microbatch < 0)
        return pp_error(PP_ERR_INVALID, "transport rank %d: negative step or microbatch", t->rank);
    if (k->src_stage < 0 || k->src_stage >= t->nstages || k->dst_stage < 0 || k->dst_stage >= t->nstages)
        return pp_error(PP_ERR_INVALID, "transport rank %d: stages %d->%d not in [0, %d)", t->rank,
                        k->src_stage, k->dst_stage, t->nstages);
    int own = sending ? k->src_stage : k->dst_stage;
    if (t->stage_ranks[own] != t->rank)
        return pp_error(PP_ERR_INVALID, "transport rank %d: stage %d runs on rank %d, not here",
                        t->rank, own, t->stage_ranks[own]);
    return PP_OK;
}

static pp_status send_local(pp_transport *t, const pp_transport_key *key, int n,
                            const char *const *names, pp_tensor *const *tensors) {
    for (int i = 0; i < n; i++) {
        pp_mbox_key k = {(int)key->kind, key->step, key->microbatch, key->src_stage, key->dst_stage, names[i]};
        PP_TRY(pp_mailbox_put(t->mbox, &k, pp_tensor_retain(tensors[i])));
        stat_add(&t->st.bytes_sent, tensors[i]->nbytes);
    }
    stat_add(&t->st.messages_sent, 1);
    sync_pending(t);
    return PP_OK;
}

/* Sends frame 0, waiting (and receiving meanwhile) until the peer takes it
 * or the deadline passes. On failure m0 is closed. */
static pp_status send_first(pp_transport *t, int r, zmq_msg_t *m0, int more, const action *act) {
    peer *p = &t->peers[r];
    char doing[512];
    int flags = ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0);
    int64_t deadline = -1;
    for (;;) {
        if (zmq_msg_send(m0, p->push, flags) >= 0) return PP_OK;
        if (zmq_errno() != EAGAIN) {
            int e = zmq_errno();
            zmq_msg_close(m0);
            return pp_error(PP_ERR_IO, "transport rank %d: %s: rank %d (%s): %s", t->rank,
                            action_str(act, doing, sizeof doing), r, peer_ep(t, r), zmq_strerror(e));
        }
        int64_t now = now_ms();
        if (deadline < 0) {
            deadline = now + t->timeout_ms;
            stat_add(&t->st.retries, 1);
        }
        read_monitors(t);
        drain(t, NULL, NULL);
        int64_t wake = deadline;
        pp_status s = t->aborted ? abort_error(t) : check_peer(t, r, act, now, &wake);
        if (s == PP_OK && now >= deadline) {
            stat_add(&t->st.timeouts, 1);
            pp_peer_state ps = peer_state(p);
            s = pp_error(PP_ERR_TIMEOUT, "transport rank %d: %s: rank %d (%s) did not accept it within "
                         "%d ms (%s)", t->rank, action_str(act, doing, sizeof doing), r,
                         peer_ep(t, r), t->timeout_ms,
                         ps == PP_PEER_UP ? "its queue is full: it is not receiving"
                                          : ps == PP_PEER_CONNECTING && !p->inproc
                                                ? "it has not connected"
                                                : pp_peer_state_name(ps));
        }
        if (s != PP_OK) {
            zmq_msg_close(m0);
            return s;
        }
        wait_events(t, wake - now, p);
    }
}

static size_t round_pow2(size_t n) {
    size_t p = 1;
    while (p < n && p < SIZE_MAX / 2) p *= 2;
    return p;
}

/* Makes a ring of `want` bytes the one for peer r. If that fails, the
 * current one (or none) stays, and that size is not tried again. */
static pp_shm_ring *replace_ring(pp_transport *t, int r, size_t want) {
    peer *p = &t->peers[r];
    if (p->ring_failed && want >= p->ring_failed) return p->tx_ring;
    /* one retired ring at a time: the receiver may not have opened the last
     * one yet, and closing it would unlink a name a message in flight needs */
    if (p->old_ring && !pp_shm_ring_drained(p->old_ring) && !pp_shm_ring_opened(p->old_ring))
        return p->tx_ring;
    pp_shm_ring *fresh;
    if (pp_shm_ring_create(want, &fresh) == PP_OK) {
        pp_shm_ring_set_align(fresh, 64); /* the receiver lends tensors out in place */
        retire_ring(p);
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
static pp_shm_ring *tx_ring(pp_transport *t, int r, size_t largest) {
    peer *p = &t->peers[r];
    if (p->inproc || !t->shm_bytes) return NULL;
    if (!p->hello_seen) drain(t, NULL, NULL); /* its hello may be waiting on our socket */
    if (!p->same_host) return NULL;
    if (p->old_ring && (pp_shm_ring_drained(p->old_ring) || pp_shm_ring_opened(p->old_ring))) {
        pp_shm_ring_close(p->old_ring);
        p->old_ring = NULL;
    }
    size_t want = largest > t->shm_bytes / 4 ? t->shm_bytes : round_pow2(4 * largest);
    if (want < MIN_RING_BYTES) want = MIN_RING_BYTES;
    if (want > t->shm_bytes) want = t->shm_bytes;
    if (want > (p->tx_ring ? pp_shm_ring_bytes(p->tx_ring) : 0)) return replace_ring(t, r, want);
    return p->tx_ring;
}

/* Room for n bytes in the ring to peer r. When the ring is full and
 * nothing of the message being built is in it yet: first wait a little for
 * the receiver, which copies out as envelopes arrive (a small ring that
 * stays in cache beats a big one); then replace the ring by one twice as
 * big (up to shm_bytes), so that a receiver lagging several tensors behind
 * does not push the rest onto the slower socket. 0: use the socket for this
 * tensor. Our own incoming messages keep moving meanwhile. */
static int ring_reserve(pp_transport *t, int r, pp_shm_ring **ring, int first, size_t n, uint64_t *pos,
                        void **dst) {
    if (!*ring) return 0;
    if (pp_shm_ring_reserve(*ring, n, pos, dst)) return 1;
    if (!first || n > pp_shm_ring_bytes(*ring)) return 0;
    int64_t until = now_ns() + (int64_t)RING_WAIT_US * 1000;
    while (now_ns() < until) {
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
        drain(t, NULL, NULL);
        if (pp_shm_ring_reserve(*ring, n, pos, dst)) return 1;
    }
    size_t have = pp_shm_ring_bytes(*ring);
    if (have >= t->shm_bytes) return 0;
    *ring = replace_ring(t, r, have > t->shm_bytes / 2 ? t->shm_bytes : 2 * have);
    return pp_shm_ring_reserve(*ring, n, pos, dst);
}

/* The message ring to peer r, once the peer has confirmed it reads it:
 * created and announced on first use, for a same-host peer whose doorbell
 * we could open. NULL: use the socket. */
static pp_shm_ring *msg_ring(pp_transport *t, int r) {
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
        snprintf(text, sizeof text, "msgring %s", pp_shm_ring_name(p->tx_msg));
        if (!send_simple(t, r, PP_MSG_CONTROL, text)) { /* try again next time */
            pp_shm_ring_close(p->tx_msg);
            p->tx_msg = NULL;
        }
        return NULL;
    }
    if (!p->tx_msg_ready) drain(t, NULL, NULL); /* its confirmation may be waiting */
    return p->tx_msg_ready ? p->tx_msg : NULL;
}

typedef struct ring_slot {
    pp_shm_ring *ring;
    uint64_t pos;
} ring_slot;

static void *alloc_in_ring(void *ctx, size_t n) {
    ring_slot *rs = ctx;
    void *dst;
    return pp_shm_ring_msg_reserve(rs->ring, n, &rs->pos, &dst) ? dst : NULL;
}

static void *alloc_zmq_msg(void *ctx, size_t n) {
    return zmq_msg_init_size(ctx, n) == 0 ? zmq_msg_data(ctx) : NULL;
}

/* Writes the envelope (every tensor inline) into the message ring to peer
 * r and rings its doorbell if it sleeps. 0: no room; use the socket. */
static int send_by_ring(pp_transport *t, int r, pp_shm_ring *ring, const pp_envelope *env) {
    ring_slot rs = {ring, 0};
    size_t len;
    if (pp_envelope_pack_into(env, alloc_in_ring, &rs, &len) != PP_OK) return 0;
    if (pp_shm_ring_msg_commit(ring, rs.pos, len)) pp_doorbell_ring(t->peers[r].bell_fd);
    return 1;
}

pp_status pp_transport_sendv(pp_transport *t, const pp_transport_key *key, int n,
                             const char *const *names, pp_tensor *const *tensors) {
    PP_TRY(check_key(t, key, 1));
    if (n < 1 || (uint32_t)n > (t->lim.max_tensors ? t->lim.max_tensors : 256u) || !names || !tensors)
        return pp_error(PP_ERR_INVALID, "transport rank %d: %d tensors in one message", t->rank, n);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!name_ok(names[i]))
            return pp_error(PP_ERR_INVALID, "transport rank %d: tensor name must be 1..%u printable "
                            "bytes", t->rank, PP_ENVELOPE_MAX_NAME);
        if (!tensors[i] || !pp_dtype_size(tensors[i]->dtype))
            return pp_error(PP_ERR_INVALID, "transport rank %d: tensor '%s' is missing or has no "
                            "dtype", t->rank, names[i]);
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return pp_error(PP_ERR_INVALID, "transport rank %d: tensor '%s' twice in one message",
                                t->rank, names[i]);
        total += tensors[i]->nbytes;
    }
    if (total > t->max_message_bytes)
        return pp_error(PP_ERR_INVALID, "transport rank %d: message of %" PRIu64 " bytes exceeds the "
                        "limit of %" PRIu64, t->rank, total, t->max_message_bytes);
    if (t->aborted) return abort_error(t);
    int r = t->stage_ranks[key->dst_stage];
    if (r == t->rank) return send_local(t, key, n, names, tensors);
    peer *p = &t->peers[r];
    pp_mbox_key mk = {(int)key->kind, key->step, key->microbatch, key->src_stage, key->dst_stage, names[0]};
    action act = {1, &mk, n};
    char doing[512];
    if (!p->push)
        return pp_error(PP_ERR_STATE, "transport rank %d: %s: no endpoint known for rank %d",
                        t->rank, action_str(&act, doing, sizeof doing), r);

    size_t frame_bytes = p->inproc ? SIZE_MAX : t->frame_bytes;
    size_t largest = 0;
    for (int i = 0; i < n; i++)
        if (tensors[i]->nbytes > largest) largest = tensors[i]->nbytes;
    pp_shm_ring *ring = largest >= t->zero_copy_min ? tx_ring(t, r, largest) : NULL;
    pp_wire_tensor wt_stack[SEND_STACK_TENSORS];
    pp_wire_tensor *wt = n <= SEND_STACK_TENSORS ? wt_stack : calloc((size_t)n, sizeof *wt);
    if (!wt) return pp_error(PP_ERR_NOMEM, "out of memory");
    uint8_t place[256]; /* n <= 256, checked above; wt is gone by the data frames */
    size_t nframes = 0, inline_bytes = 0;
    uint64_t shm_bytes = 0;
    int ninline = 0, inline_one = -1;
    for (int i = 0; i < n; i++) {
        const pp_tensor *x = tensors[i];
        memset(&wt[i], 0, sizeof wt[i]);
        wt[i].name = names[i];
        wt[i].dtype = x->dtype;
        wt[i].ndim = x->ndim;
        memcpy(wt[i].shape, x->shape, sizeof wt[i].shape);
        wt[i].nbytes = x->nbytes;
        wt[i].placement = PP_PLACE_FRAMES;
        uint64_t pos;
        void *dst;
        if (x->nbytes == 0) {
            wt[i].nframes = 0;
        } else if (x->nbytes < t->zero_copy_min && x->nbytes <= PP_ENVELOPE_INLINE_MAX - inline_bytes) {
            /* small: its bytes ride in the envelope frame */
            wt[i].placement = PP_PLACE_INLINE;
            inline_bytes += x->nbytes;
            ninline++;
            inline_one = i;
        } else if (x->nbytes < t->zero_copy_min) {
            wt[i].nframes = 1;
        } else if (ring_reserve(t, r, &ring, shm_bytes == 0, x->nbytes, &pos, &dst)) {
            /* same host: one copy into shared memory, only the envelope on the socket */
            memcpy(dst, x->data, x->nbytes);
            pp_shm_ring_commit(ring, pos, x->nbytes);
            wt[i].placement = PP_PLACE_SHM;
            wt[i].shm_pos = pos;
            shm_bytes += x->nbytes;
        } else {
            wt[i].nframes = (uint32_t)(x->nbytes / frame_bytes + (x->nbytes % frame_bytes != 0));
        }
        place[i] = (uint8_t)wt[i].placement;
        nframes += wt[i].nframes;
    }
    /* the inline tensors' bytes, back to back: the tensor itself when there
     * is one, else gathered here */
    uint8_t gather[PP_ENVELOPE_INLINE_MAX];
    const void *inline_data = NULL;
    if (ninline == 1) {
        inline_data = tensors[inline_one]->data;
    } else if (ninline > 1) {
        size_t off = 0;
        for (int i = 0; i < n; i++)
            if (wt[i].placement == PP_PLACE_INLINE) {
                memcpy(gather + off, tensors[i]->data, wt[i].nbytes);
                off += wt[i].nbytes;
            }
        inline_data = gather;
    }
    pp_envelope env = {0};
    env.version = PP_PROTOCOL_VERSION;
    env.kind = key->kind;
    env.run_id = t->run_id;
    env.step = key->step;
    env.microbatch = key->microbatch;
    env.src_stage = key->src_stage;
    env.dst_stage = key->dst_stage;
    env.src_rank = t->rank;
    env.seq = p->seq + 1;
    env.ntensors = n;
    env.tensors = wt;
    env.text = "";
    env.inline_data = inline_data;
    env.inline_bytes = inline_bytes;
    env.shm_name = shm_bytes ? pp_shm_ring_name(ring) : "";
    pp_shm_ring *mring = nframes == 0 && shm_bytes == 0 ? msg_ring(t, r) : NULL;
    if (mring && send_by_ring(t, r, mring, &env)) {
        if (wt != wt_stack) free(wt);
        p->seq++;
        stat_add(&t->st.messages_sent, 1);
        stat_add(&t->st.bytes_sent, total);
        stat_add(&t->st.shm_bytes_sent, total);
        return PP_OK;
    }
    zmq_msg_t m0;
    size_t len;
    pp_status s = pp_envelope_pack_into(&env, alloc_zmq_msg, &m0, &len);
    if (wt != wt_stack) free(wt);
    PP_TRY(s);
    PP_TRY(send_first(t, r, &m0, nframes > 0, &act));
    p->seq++;

    /* Data frames: after frame 0 went in, the rest of the message cannot
     * hit the high-water mark; a failure means the connection died. */
    size_t sent = 0;
    int lost = 0, lost_more = 0;
    for (int i = 0; i < n && !lost; i++) {
        pp_tensor *x = tensors[i];
        if (x->nbytes == 0 || place[i] != PP_PLACE_FRAMES) continue;
        size_t off = 0;
        while (off < x->nbytes && !lost) {
            zmq_msg_t m;
            size_t chunk;
            if (x->nbytes < t->zero_copy_min) {
                chunk = x->nbytes;
                if (zmq_msg_init_size(&m, chunk) != 0) {
                    lost = 1;
                    lost_more = 1;
                    break;
                }
                memcpy(zmq_msg_data(&m), x->data, chunk);
            } else {
                chunk = x->nbytes - off < frame_bytes ? x->nbytes - off : frame_bytes;
                pp_tensor_retain(x);
                if (zmq_msg_init_data(&m, (char *)x->data + off, chunk, release_tensor, x) != 0) {
                    pp_tensor_free(x);
                    lost = 1;
                    lost_more = 1;
                    break;
                }
            }
            int more = sent + 1 < nframes;
            if (zmq_msg_send(&m, p->push, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) < 0) {
                zmq_msg_close(&m);
                lost = 1;
                lost_more = more;
                break;
            }
            off += chunk;
            sent++;
        }
    }
    if (lost) {
        /* End the half-sent message. After a failed send libzmq drops the
         * parts it still gets; after a failed allocation the receiver gets a
         * message with an empty last frame and drops it. */
        if (lost_more) zmq_send(p->push, "", 0, ZMQ_DONTWAIT);
        stat_add(&t->st.peer_failures, 1);
        return pp_error(PP_ERR_PEER, "transport rank %d: %s: connection to rank %d (%s) lost "
                        "mid-message", t->rank, action_str(&act, doing, sizeof doing), r, peer_ep(t, r));
    }
    stat_add(&t->st.messages_sent, 1);
    stat_add(&t->st.bytes_sent, total);
    stat_add(&t->st.shm_bytes_sent, shm_bytes);
    return PP_OK;
}

pp_status pp_transport_send(pp_transport *t, const pp_transport_key *key, pp_tensor *tensor) {
    if (!key) return pp_error(PP_ERR_INVALID, "transport: no key");
    const char *names[1] = {key->name};
    pp_tensor *ts[1] = {tensor};
    return pp_transport_sendv(t, key, 1, names, ts);
}

/* ---- public: receiving ---- */

pp_status pp_transport_recv(pp_transport *t, const pp_transport_key *key, int timeout_ms,
                            pp_tensor **out) {
    *out = NULL;
    PP_TRY(check_key(t, key, 0));
    if (!name_ok(key->name))
        return pp_error(PP_ERR_INVALID, "transport rank %d: tensor name must be 1..%u printable bytes",
                        t->rank, PP_ENVELOPE_MAX_NAME);
    if (t->aborted) return abort_error(t);
    pp_mbox_key k = {(int)key->kind, key->step, key->microbatch, key->src_stage, key->dst_stage, key->name};
    if ((*out = pp_mailbox_take(t->mbox, &k))) {
        sync_pending(t);
        return PP_OK;
    }
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
        if (now >= next_check || now >= deadline || peer_looks_gone(t, r, now)) {
            /* what already arrived counts, even from a peer that is gone now */
            read_monitors(t);
            drain(t, &k, out);
            if (*out) {
                sync_pending(t);
                return PP_OK;
            }
            if (t->aborted) return abort_error(t);
            PP_TRY(check_peer(t, r, &act, now, &wake));
            next_check = now + t->grace_ms;
            if (now >= deadline) {
                stat_add(&t->st.timeouts, 1);
                pp_peer_state ps = r == t->rank ? PP_PEER_SELF : peer_state(&t->peers[r]);
                char doing[512];
                return pp_error(PP_ERR_TIMEOUT, "transport rank %d: timed out after %d ms %s from rank "
                                "%d (%s, %s)", t->rank, timeout, action_str(&act, doing, sizeof doing),
                                r, peer_ep(t, r), pp_peer_state_name(ps));
            }
        }
        int64_t until = wake < next_check ? wake : next_check;
        if (until > deadline) until = deadline;
        int wait = until > now ? (int)(until - now) : 1;
        if (!spin_receive(t, &k, out)) receive_one(t, &k, out, wait);
        if (*out) {
            sync_pending(t);
            return PP_OK;
        }
        if (t->aborted) return abort_error(t);
        now = now_ms();
    }
}

pp_status pp_transport_poll(pp_transport *t, int timeout_ms) {
    read_monitors(t);
    if (drain(t, NULL, NULL) == 0 && timeout_ms > 0) {
        wait_events(t, timeout_ms, NULL);
        drain(t, NULL, NULL);
    }
    return t->aborted ? abort_error(t) : PP_OK;
}

pp_status pp_transport_set_step(pp_transport *t, int64_t step) {
    if (step < 0) return pp_error(PP_ERR_INVALID, "transport rank %d: negative step", t->rank);
    t->cur_step = step;
    char first[400];
    size_t n = pp_mailbox_drop_before(t->mbox, step, first, sizeof first);
    sync_pending(t);
    if (n) {
        stat_add(&t->st.dropped, n);
        pp_warn("transport rank %d: step %" PRId64 ": dropped %zu unclaimed tensors of earlier steps "
                "(%s%s)", t->rank, step, n, first, n > 1 ? ", ..." : "");
    }
    return PP_OK;
}

pp_status pp_transport_abort(pp_transport *t, const char *reason) {
    if (!reason) reason = "";
    if (!t->aborted) {
        t->aborted = 1;
        t->abort_rank = t->rank;
        /* keep it printable and bounded, as receivers will check */
        size_t j = 0;
        for (size_t i = 0; reason[i] && j < PP_ENVELOPE_MAX_TEXT; i++)
            t->abort_text[j++] = ((unsigned char)reason[i] < 0x20 || reason[i] == 0x7f) ? ' ' : reason[i];
        t->abort_text[j] = 0;
    }
    for (int r = 0; r < t->nranks; r++)
        if (r != t->rank) send_simple(t, r, PP_MSG_ABORT, t->abort_text);
    return PP_OK;
}

/* ---- public: introspection ---- */

void pp_transport_stats_get(const pp_transport *t, pp_transport_stats *out) {
    stat_counters *c = (stat_counters *)&t->st;
    memset(out, 0, sizeof *out);
    out->messages_sent = atomic_load_explicit(&c->messages_sent, memory_order_relaxed);
    out->messages_received = atomic_load_explicit(&c->messages_received, memory_order_relaxed);
    out->bytes_sent = atomic_load_explicit(&c->bytes_sent, memory_order_relaxed);
    out->bytes_received = atomic_load_explicit(&c->bytes_received, memory_order_relaxed);
    out->dropped = atomic_load_explicit(&c->dropped, memory_order_relaxed);
    out->retries = atomic_load_explicit(&c->retries, memory_order_relaxed);
    out->timeouts = atomic_load_explicit(&c->timeouts, memory_order_relaxed);
    out->peer_failures = atomic_load_explicit(&c->peer_failures, memory_order_relaxed);
    out->auth_failures = pp_zap_domain_refused(t->zap_domain);
    out->pending = atomic_load_explicit(&c->pending, memory_order_relaxed);
    out->pending_bytes = atomic_load_explicit(&c->pending_bytes, memory_order_relaxed);
    out->shm_bytes_sent = atomic_load_explicit(&c->shm_bytes_sent, memory_order_relaxed);
    out->shm_bytes_received = atomic_load_explicit(&c->shm_bytes_received, memory_order_relaxed);
}

int pp_transport_peer_shm(const pp_transport *t, int rank) {
    if (rank < 0 || rank >= t->nranks || rank == t->rank) return 0;
    const peer *p = &t->peers[rank];
    return !p->inproc && t->shm_bytes && p->same_host && !(p->ring_failed && !p->tx_ring);
}

pp_peer_state pp_transport_peer_state(const pp_transport *t, int rank) {
    if (rank < 0 || rank >= t->nranks) return PP_PEER_UNKNOWN;
    return peer_state(&t->peers[rank]);
}

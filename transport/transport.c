/* The transport: one PULL socket per rank, one PUSH per peer, messages in a
 * mailbox, deadlines everywhere. See include/pippin/transport.h for the
 * threading and tensor contracts. This file: options, create and close,
 * steps and abort, stats; transport_internal.h lists the other pieces. */
#include "transport_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_LINGER_MS 1000
#define DEFAULT_HWM 64 /* send side: libzmq leaks zero-copy frames still queued to a dead peer at close (seen with 1000) */
#define DEFAULT_RCVHWM 1000 /* receive side: libzmq's default; a deep queue keeps the receiver from sleeping per message */
#define DEFAULT_ZERO_COPY_MIN ((size_t)64 << 10)
#define DEFAULT_SHM_BYTES ((int64_t)1 << 30)
#define DEFAULT_RECV_CACHE ((int64_t)512 << 20)
#define MIN_FRAME_BYTES 4096
/* Heartbeats: by default HB_PER_TIMEOUT per timeout, within these bounds. */
#define HB_PER_TIMEOUT 4
#define HB_IVL_MIN_MS 10
#define HB_IVL_MAX_MS 1000
/* A disconnected peer counts as gone after min(heartbeat interval, this). */
#define GRACE_MAX_MS 200
/* Bounds on the heartbeat TTL peers are asked to apply. */
#define HB_TTL_MIN_MS 100
#define HB_TTL_MAX_MS 65000
#define IPC_SCHEME "ipc://"
/* Messages more than this many steps ahead are dropped (step_window 0). */
#define DEFAULT_STEP_WINDOW 2
/* Bytes one peer's messages may hold in the mailbox (max_pending_bytes_per_peer 0). */
#define DEFAULT_PENDING_PER_PEER ((int64_t)4 << 30)
#define LOCK_SUFFIX ".lock"
/* Errors mention the file limit when fewer descriptors than this are left. */
#define FILES_SPARE 4

/* 64 random bits, never 0 (getrandom; the clock and pid if that fails). */
static uint64_t random_u64(void) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 16) ^ (uint64_t)(uintptr_t)&v;
        v *= 0x9e3779b97f4a7c15ull;
    }
    return v ? v : 1;
}

/* ---- options ---- */

void pp_transport_options_init(pp_transport_options *o) {
    memset(o, 0, sizeof *o);
    o->nranks = 1;
    o->timeout_ms = DEFAULT_TIMEOUT_MS;
    o->linger_ms = DEFAULT_LINGER_MS;
    o->sndhwm = DEFAULT_HWM;
    o->rcvhwm = DEFAULT_RCVHWM;
    o->max_message_bytes = PP_ENVELOPE_DEFAULT_MAX_MESSAGE_BYTES;
    o->frame_bytes = 0; /* by size: see pp_tp_frame_size */
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
    /* run identity: given, drawn here (rank 0), or learned in the handshake */
    t->run_id = o->run_id;
    if (!t->run_id && (o->rank == 0 || o->nranks == 1)) t->run_id = random_u64();
    t->run_known = t->run_id != 0;
    t->nonce = random_u64();
    t->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : DEFAULT_TIMEOUT_MS;
    t->hb_timeout_ms = o->heartbeat_timeout_ms > 0 ? o->heartbeat_timeout_ms : t->timeout_ms;
    int hb_default = t->hb_timeout_ms / HB_PER_TIMEOUT;
    t->hb_ivl_ms = o->heartbeat_ivl_ms > 0 ? o->heartbeat_ivl_ms
                                           : (hb_default < HB_IVL_MAX_MS ? hb_default : HB_IVL_MAX_MS);
    if (t->hb_ivl_ms < HB_IVL_MIN_MS) t->hb_ivl_ms = HB_IVL_MIN_MS;
    t->grace_ms = t->hb_ivl_ms < GRACE_MAX_MS ? t->hb_ivl_ms : GRACE_MAX_MS;
    t->linger_ms = o->linger_ms > 0 ? o->linger_ms : (o->linger_ms < 0 ? 0 : DEFAULT_LINGER_MS);
    t->sndhwm = o->sndhwm > 0 ? o->sndhwm : DEFAULT_HWM;
    t->rcvhwm = o->rcvhwm > 0 ? o->rcvhwm : DEFAULT_RCVHWM;
    t->sndbuf = o->sndbuf > 0 ? o->sndbuf : 0;
    t->rcvbuf = o->rcvbuf > 0 ? o->rcvbuf : 0;
    t->max_message_bytes = o->max_message_bytes ? o->max_message_bytes : PP_ENVELOPE_DEFAULT_MAX_MESSAGE_BYTES;
    if (t->max_message_bytes > (uint64_t)INT64_MAX) t->max_message_bytes = (uint64_t)INT64_MAX;
    t->frame_bytes = o->frame_bytes;
    if (t->frame_bytes && t->frame_bytes < MIN_FRAME_BYTES) t->frame_bytes = MIN_FRAME_BYTES;
    t->zero_copy_min = o->zero_copy_min ? o->zero_copy_min : DEFAULT_ZERO_COPY_MIN;
    t->step_window = o->step_window > 0 ? o->step_window : (o->step_window < 0 ? 0 : DEFAULT_STEP_WINDOW);
    t->max_pending_per_peer = o->max_pending_bytes_per_peer > 0 ? (uint64_t)o->max_pending_bytes_per_peer
                              : o->max_pending_bytes_per_peer < 0 ? 0 : (uint64_t)DEFAULT_PENDING_PER_PEER;
    t->shm_bytes = o->shm_bytes < 0 || o->curve_secret_key
                       ? 0 /* CURVE promises encrypted links: keep every byte on them */
                       : (size_t)(o->shm_bytes ? o->shm_bytes : DEFAULT_SHM_BYTES);
    t->spin_ns = o->spin_us > 0 ? (int64_t)o->spin_us * 1000 : 0;
    t->bulk = o->bulk_lanes >= 0;

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

pp_status pp_tp_common_sockopts(pp_transport *t, void *s, const char *what) {
    int hb_ttl = t->hb_timeout_ms < HB_TTL_MIN_MS ? HB_TTL_MIN_MS
                 : (t->hb_timeout_ms > HB_TTL_MAX_MS ? HB_TTL_MAX_MS : t->hb_timeout_ms);
    if (setopt_int(s, ZMQ_HEARTBEAT_IVL, t->hb_ivl_ms) || setopt_int(s, ZMQ_HEARTBEAT_TIMEOUT, t->hb_timeout_ms) ||
        setopt_int(s, ZMQ_HEARTBEAT_TTL, hb_ttl) || setopt_int(s, ZMQ_HANDSHAKE_IVL, t->hb_timeout_ms) ||
        (t->sndbuf && setopt_int(s, ZMQ_SNDBUF, t->sndbuf)) || (t->rcvbuf && setopt_int(s, ZMQ_RCVBUF, t->rcvbuf)))
        return pp_error(PP_ERR_IO, "transport rank %d: %s socket options: %s", t->rank, what,
                        zmq_strerror(zmq_errno()));
    return PP_OK;
}

/* An ipc:// path (not a wildcard, not abstract) gets PATH.lock beside it,
 * held with flock while the transport lives: libzmq would silently take a
 * bound socket file over. A lock of a process that died is free again (the
 * kernel drops flocks with the process); the file is removed at close. The
 * inode is checked after locking, so a holder that removed the file at
 * close meanwhile does not let two transports both believe they hold it. */
static pp_status lock_ipc(pp_transport *t, const char *ep) {
    t->lock_fd = -1;
    if (strncmp(ep, IPC_SCHEME, PREFIX_LEN(IPC_SCHEME)) != 0) return PP_OK;
    const char *path = ep + PREFIX_LEN(IPC_SCHEME);
    if (!path[0] || path[0] == '@' || strcmp(path, "*") == 0) return PP_OK;
    size_t n = strlen(path) + sizeof LOCK_SUFFIX;
    t->lock_path = malloc(n);
    if (!t->lock_path) return pp_error(PP_ERR_NOMEM, "out of memory");
    snprintf(t->lock_path, n, "%s" LOCK_SUFFIX, path);
    for (int attempt = 0; attempt < 100; attempt++) {
        int fd = open(t->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0)
            return pp_error(PP_ERR_IO, "transport rank %d: cannot create the lock %s for ipc endpoint %s: %s",
                            t->rank, t->lock_path, ep, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK)
                return pp_error(PP_ERR_IO, "transport rank %d: cannot bind %s: another worker holds this ipc "
                                "endpoint (its lock %s is taken); is this rank already running?", t->rank, ep,
                                t->lock_path);
            return pp_error(PP_ERR_IO, "transport rank %d: cannot lock %s for ipc endpoint %s: %s", t->rank,
                            t->lock_path, ep, strerror(e));
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(t->lock_path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            t->lock_fd = fd;
            return PP_OK;
        }
        close(fd); /* removed by its last holder meanwhile: take the new file */
    }
    return pp_error(PP_ERR_IO, "transport rank %d: cannot lock %s for ipc endpoint %s", t->rank, t->lock_path, ep);
}

static void unlock_ipc(pp_transport *t) {
    if (t->lock_fd >= 0) {
        unlink(t->lock_path); /* while holding it: see lock_ipc */
        close(t->lock_fd);
    }
    t->lock_fd = -1;
    free(t->lock_path);
    t->lock_path = NULL;
}

static long file_limit(void) {
    struct rlimit rl;
    return getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long)rl.rlim_cur : -1;
}

/* Open file descriptors of this process (-2: cannot even open a directory,
 * i.e. at the limit; -1: unknown). */
static long open_files(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return errno == EMFILE || errno == ENFILE ? -2 : -1;
    long n = -1; /* the directory's own descriptor */
    while (readdir(d)) n++;
    closedir(d);
    return n - 2; /* . and .. */
}

const char *pp_tp_conn_note(pp_transport *t, char *buf, size_t cap) {
    if (!cap) return buf;
    buf[0] = 0;
    size_t n = 0;
    long limit = file_limit(), open = open_files();
    if (limit > 0 && (open == -2 || open >= limit - FILES_SPARE)) {
        if (open == -2) open = limit;
        n = (size_t)snprintf(buf, cap, "; this process has %ld of its %ld file descriptors open (RLIMIT_NOFILE): "
                             "incoming connections are refused (a flood of connections? raise ulimit -n)", open, limit);
    }
    /* a dropped message is never sent again: say so, or the wait looks like a slow peer */
    unsigned long long cap_drops = atomic_load_explicit(&t->st.dropped_over_cap, memory_order_relaxed),
                       window_drops = atomic_load_explicit(&t->st.dropped_window, memory_order_relaxed);
    if ((cap_drops || window_drops) && n < cap)
        snprintf(buf + n, cap - n, "; %llu messages were dropped over max_pending_bytes_per_peer and %llu more "
                 "than step_window steps ahead (raise them if the schedule parks that much)", cap_drops, window_drops);
    return buf;
}

static pp_status open_pull(pp_transport *t, const char *bind_ep) {
    t->pull = zmq_socket(t->ctx, ZMQ_PULL);
    if (!t->pull)
        return pp_error(PP_ERR_IO, "transport rank %d: zmq_socket: %s", t->rank, zmq_strerror(zmq_errno()));
    int64_t maxmsg = (int64_t)t->max_message_bytes;
    PP_TRY(pp_tp_common_sockopts(t, t->pull, "receive"));
    /* No heartbeats of its own (ZMQ_HEARTBEAT_IVL 0): libzmq 4.3.4 aborts
     * the process ("Assertion failed: !_io_error", stream_engine_base.cpp:331,
     * zeromq/libzmq#4364) when a receiving connection that stopped reading
     * (its queue full, or the socket closing, as in a rejoin) sees its peer
     * hang up and its heartbeat timer then fires. Only receiving connections
     * stop reading. A dead sender is still noticed: the PUSH side's
     * heartbeats carry the TTL after which this side drops a silent
     * connection, and pippin watches peers on its PUSH sockets. */
    if (setopt_int(t->pull, ZMQ_HEARTBEAT_IVL, 0) || setopt_int(t->pull, ZMQ_RCVHWM, t->rcvhwm) ||
        setopt_int(t->pull, ZMQ_LINGER, 0) ||
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
    PP_TRY(lock_ipc(t, bind_ep));
    if (zmq_bind(t->pull, bind_ep) != 0)
        return pp_error(PP_ERR_IO, "transport rank %d: cannot bind %s: %s", t->rank, bind_ep,
                        zmq_strerror(zmq_errno()));
    size_t len = sizeof t->endpoint;
    if (zmq_getsockopt(t->pull, ZMQ_LAST_ENDPOINT, t->endpoint, &len) != 0 || !t->endpoint[0])
        snprintf(t->endpoint, sizeof t->endpoint, "%s", bind_ep);
    return PP_OK;
}

/* ---- public: lifecycle ---- */

pp_status pp_transport_create(const pp_transport_options *opts, pp_transport **out) {
    *out = NULL;
    if (!opts) return pp_error(PP_ERR_INVALID, "transport: no options");
    pp_transport *t = calloc(1, sizeof *t);
    if (!t) return pp_error(PP_ERR_NOMEM, "out of memory");
    t->zap_domain = NULL;
    t->lock_fd = -1;
    pp_status s = copy_options(t, opts);
    snprintf(t->proc, sizeof t->proc, "%llx-%ld", pp_shm_pid_ns(), (long)getpid());
    if (s == PP_OK) {
        t->peers = calloc((size_t)t->nranks, sizeof *t->peers);
        t->items = calloc(3 * (size_t)t->nranks + 3, sizeof *t->items);
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
    if (s == PP_OK) s = pp_mailbox_set_owners(t->mbox, t->nranks);
    if (s == PP_OK && opts->recv_cache_bytes >= 0)
        s = pp_bufpool_new(opts->recv_cache_bytes ? (size_t)opts->recv_cache_bytes
                                                  : (size_t)DEFAULT_RECV_CACHE, &t->pool);
    if (s == PP_OK) s = pp_zctx_acquire(opts->zmq_context, opts->io_threads, &t->zctx);
    if (s == PP_OK) {
        t->ctx = pp_zctx_handle(t->zctx);
        for (int r = 0; r < t->nranks; r++) {
            atomic_init(&t->peers[r].state, r == t->rank ? PP_PEER_SELF : PP_PEER_UNKNOWN);
            t->peers[r].bell_fd = -1;
            pp_tp_bulk_init(&t->peers[r]);
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
    if (opts->bind_endpoint && opts->endpoints[opts->rank])
        snprintf(t->advertised, sizeof t->advertised, "%s", opts->endpoints[opts->rank]);
    if (s == PP_OK) s = open_pull(t, opts->bind_endpoint ? opts->bind_endpoint : opts->endpoints[opts->rank]);
    for (int r = 0; s == PP_OK && r < t->nranks; r++)
        if (r != t->rank && endpoint_usable(opts->endpoints[r])) s = pp_tp_connect_peer(t, r, opts->endpoints[r]);
    if (s != PP_OK) {
        pp_status keep = s;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", pp_last_error());
        pp_transport_close(t);
        return pp_error(keep, "%s", msg);
    }
    pp_tp_conn_budget_init(t, opts->max_incoming_connections > 0 ? (size_t)opts->max_incoming_connections : 0);
    pp_debug("transport rank %d: bound %s", t->rank, t->endpoint);
    *out = t;
    return PP_OK;
}

const char *pp_transport_endpoint(const pp_transport *t) { return t->endpoint; }

uint64_t pp_transport_run_id(const pp_transport *t) { return t->run_known ? t->run_id : 0; }

int pp_transport_timeout_ms(const pp_transport *t) { return t->timeout_ms; }

const char *pp_transport_host_id(const pp_transport *t) { return t->shm_bytes ? t->host_id : ""; }

int pp_transport_stage_rank(const pp_transport *t, int stage) {
    return stage >= 0 && stage < t->nstages ? t->stage_ranks[stage] : -1;
}

void pp_transport_close(pp_transport *t) {
    if (!t) return;
    if (pp_log_get_level() <= PP_LOG_DEBUG) {
        pp_transport_stats st;
        pp_transport_stats_get(t, &st);
        pp_debug("transport rank %d: closing: sent=%" PRIu64 " shm_sent=%" PRIu64 " received=%" PRIu64
                 " shm_received=%" PRIu64 " (tensor bytes; shm: through shared memory)", t->rank,
                 st.bytes_sent, st.shm_bytes_sent, st.bytes_received, st.shm_bytes_received);
    }
    if (t->peers) {
        /* small messages held back for a busy peer go first, within linger */
        pp_tp_settle_held(t, t->linger_ms);
        /* tensors queued on bulk lanes too (their envelopes went already):
         * every lane's writer drains at once, so one linger for them all */
        int64_t linger_until = now_ms() + (t->linger_ms > 0 ? t->linger_ms : 0);
        for (int r = 0; r < t->nranks; r++) {
            int64_t left = linger_until - now_ms();
            if (r != t->rank) pp_tp_bulk_close(t, r, left > 0 ? (int)left : 0);
        }
        /* goodbye to every connected peer (a send to one that is not
         * connected fails at once: ZMQ_IMMEDIATE) */
        for (int r = 0; r < t->nranks; r++)
            if (r != t->rank && t->peers[r].push) {
                pp_tp_tell(t, r); /* a peer accepts it only from a rank that completed the handshake */
                pp_tp_send_simple(t, r, PP_MSG_CONTROL, CTL_BYE);
            }
        for (int r = 0; r < t->nranks; r++) {
            pp_tp_peer_close(&t->peers[r]);
            pp_shm_ring_close(t->peers[r].tx_ring);
            pp_shm_ring_close(t->peers[r].old_ring);
            pp_shm_ring_close(t->peers[r].rx_ring);
            pp_shm_ring_close(t->peers[r].tx_msg);
            pp_shm_ring_close(t->peers[r].rx_msg);
            if (t->peers[r].bell_fd >= 0) close(t->peers[r].bell_fd);
            free(t->peers[r].endpoint);
            free(t->peers[r].addr);
            free(t->peers[r].obox);
            pp_tp_inflight_release(t->peers[r].inflight);
        }
    }
    close_socket(t->pull);
    /* libzmq leaves the socket file of a bound ipc endpoint behind */
    if (t->pull && strncmp(t->endpoint, IPC_SCHEME, PREFIX_LEN(IPC_SCHEME)) == 0 &&
        t->endpoint[PREFIX_LEN(IPC_SCHEME)] != '@')
        unlink(t->endpoint + PREFIX_LEN(IPC_SCHEME));
    unlock_ipc(t);
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
    pp_tp_conn_budget_close(t);
    free(t->ring_copy);
    free(t->stage_ranks);
    if (t->rank_keys) {
        memset(t->rank_keys, 0, (size_t)t->nranks * sizeof *t->rank_keys);
        free(t->rank_keys);
    }
    memset(t->secret_z85, 0, sizeof t->secret_z85);
    free(t);
}

/* ---- public: steps and abort ---- */

pp_status pp_transport_set_step(pp_transport *t, int64_t step) {
    if (step < 0) return pp_error(PP_ERR_INVALID, "transport rank %d: negative step", t->rank);
    t->cur_step = step;
    t->step_set = 1;
    char first[KEY_CHARS];
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
            t->abort_text[j++] = control_char(reason[i]) ? ' ' : reason[i];
        t->abort_text[j] = 0;
    }
    for (int r = 0; r < t->nranks; r++)
        if (r != t->rank) {
            pp_tp_drop_held(t, r); /* the run is over: small messages held back for it are not sent */
            pp_tp_tell(t, r); /* a peer accepts it only from a rank that completed the handshake */
            pp_tp_send_simple(t, r, PP_MSG_ABORT, t->abort_text);
        }
    return PP_OK;
}

const char *pp_transport_abort_reason(const pp_transport *t, int *rank) {
    if (rank) *rank = t->aborted ? t->abort_rank : -1;
    return t->aborted ? t->abort_text : NULL;
}

pp_status pp_tp_abort_error(pp_transport *t) {
    if (t->abort_rank == t->rank)
        return pp_error(PP_ERR_PEER, "transport rank %d: this rank aborted the run: %s", t->rank,
                        t->abort_text);
    return pp_error(PP_ERR_PEER, "transport rank %d: rank %d (%s) aborted the run: %s", t->rank,
                    t->abort_rank, peer_ep(t, t->abort_rank), t->abort_text);
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
    out->dropped_window = atomic_load_explicit(&c->dropped_window, memory_order_relaxed);
    out->dropped_over_cap = atomic_load_explicit(&c->dropped_over_cap, memory_order_relaxed);
    out->dropped_foreign = atomic_load_explicit(&c->dropped_foreign, memory_order_relaxed);
    out->shed_connections = atomic_load_explicit(&c->shed_connections, memory_order_relaxed);
    out->bulk_bytes_sent = atomic_load_explicit(&c->bulk_bytes_sent, memory_order_relaxed);
    out->bulk_bytes_received = atomic_load_explicit(&c->bulk_bytes_received, memory_order_relaxed);

}

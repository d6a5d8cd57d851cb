/* Internal: the transport's state and the helpers its pieces share.
 * transport.c: options, create and close, abort, stats. transport_peers.c:
 * connections, monitors, hellos, liveness. transport_rings.c: the
 * shared-memory rings to and from same-host peers. transport_send.c and
 * transport_recv.c: the two directions; transport_batch.c: small messages
 * held back and sent together (batching); transport_bulk.c: bulk lanes,
 * bulk_park.c: messages parked while their lane bytes come. */
#ifndef PIPPIN_TRANSPORT_INTERNAL_H
#define PIPPIN_TRANSPORT_INTERNAL_H

#include "pippin/transport.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <zmq.h>

#include "bufpool.h"
#include "bulk_lane.h"
#include "context.h"
#include "doorbell.h"
#include "mailbox.h"
#include "shm_ring.h"

#include "status_internal.h"
#include "log_internal.h"
#include "envelope.h"

#define HOST_ID_CHARS 256
/* Room for a message's source address as text (pp_tp_peer_addr). */
#define PEER_ADDR_CHARS 64
#define MAX_ENDPOINT 256
/* Reassembled tensors at least this big come from the buffer pool. */
#define POOL_MIN_BYTES ((size_t)1 << 20)
/* Room for what a send or receive is doing, as text (pp_tp_action_str). */
#define ACTION_CHARS 512
/* Room for a mailbox key as text (pp_mbox_key_str). */
#define KEY_CHARS 400

/* Length of a string literal, for matching it as a prefix. */
#define PREFIX_LEN(literal) (sizeof(literal) - 1)

/* Control messages (PP_MSG_CONTROL, no tensors): the text is a command,
 * some with an argument after the prefix. A hello is
 *   hello run=RUN nonce=NONCE echo=ECHO proc=NS-PID host=HOSTID[ bell=PATH]
 * (RUN, NONCE, ECHO 16 hex digits): our run id (0: not known yet), our
 * nonce, the nonce of the peer's last hello (0: none yet), the prefix of our
 * shared-memory names, our host id (empty without rings) and doorbell. A
 * message echoing our nonce proves it comes from the process bound at the
 * peer's endpoint (only that one got our hello): its address is pinned and
 * its run id adopted. Once pinned, a hello that echoes our nonce with a
 * nonce of its own that differs is a new process at that endpoint: the rank
 * restarted, and is closed for this transport (rejoin takes new ones). */
#define CTL_HELLO "hello "             /* please answer */
#define CTL_HELLO_REPLY "hello-reply " /* the same, answering a hello */
#define CTL_BELL " bell="
#define CTL_HOST " host="
#define CTL_MSGRING "msgring "              /* ring name: small messages to you come here */
#define CTL_MSGRING_OK "msgring-ok "        /* ring name: reading it */
#define CTL_BYE "bye"                       /* the transport closed */
#define CTL_BULK_WANT "bulk-want"           /* please offer me a bulk lane to you */
#define CTL_BULK_OFFER "bulk-offer "        /* direct_tcp.h offer: connect your bulk lane here */
/* Tensors at least this big take a bulk lane when there is one. */
#define PP_BULK_MIN_BYTES ((size_t)256 << 10)

typedef struct peer {
    char *endpoint;         /* NULL: not known */
    void *push;             /* owned by the transport's thread */
    void *mon;              /* PAIR reading push's monitor events (tcp/ipc only) */
    int inproc;
    atomic_int state;       /* pp_peer_state */
    int64_t down_since;     /* monotonic ms when state became DOWN */
    const char *why;        /* last failure, for messages */
    uint64_t seq;
    int hello_sent;         /* our hello went out on the current connection */
    int hello_seen;         /* its hello arrived (on this incarnation) */
    int64_t hello_at;       /* monotonic ms of our last hello */
    uint64_t echo;          /* its nonce, from its last accepted hello (0: none) */
    int told;               /* we sent it our run id and its nonce on the current connection */
    int verified;           /* it echoed our nonce: its messages are accepted from addr */
    int restarted;          /* a new process answered at its endpoint: it stays closed */
    char *addr;             /* pp_tp_peer_addr of its verifying message (NULL: none, inproc) */
    uint64_t foreign_run;   /* run id of the last hello for it that we refused (for errors) */
    char proc[48];          /* "NS-PID" from its hello: the prefix of its ring names */
    int same_host;          /* its hello carried our host id: rings can be used */
    size_t ring_failed;     /* creating a ring this big failed: do not try again */
    uint64_t ring_nospace;  /* sends that found no /dev/shm pages for a ring to it (for warnings) */
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
    /* Small messages held back while its queue is full, merged into one
     * batch message (PP_WIRE_KIND_BATCH) when it has room: the batch frame
     * is built in place in obox (entries already in their wire form, room
     * for the header before them), and obox itself goes to libzmq. */
    struct pp_tp_counted *obox; /* allocated on first use, handed over when sent */
    int obox_n;
    uint32_t obox_end;      /* bytes of obox's frame used, header room included */
    pp_mbox_key obox_key;   /* the first held-back message, for errors */
    struct pp_tp_inflight *inflight; /* small messages libzmq has not taken yet (batching) */
    char obox_name[PP_ENVELOPE_MAX_NAME + 1];
    /* Bulk lanes (transport_bulk.c): ours to the peer, and the peer's to us. */
    int bulk_state;
    int64_t bulk_want_ms;                    /* when we last asked it for a lane (asked again if no offer came) */
    char bulk_offer[160];                    /* the offer we made it, sent again if it asks again */
    struct pp_direct_conn *bulk_conn;        /* ours, while it connects */
    pp_bulk_tx *bulk_tx;                     /* ours, once up */
    struct pp_direct_listener *bulk_listen;  /* where the peer's connects (offered to it) */
    pp_bulk_rx bulk_rx;                      /* the peer's, once it connected */
    char bulk_fail[160];                     /* why the peer's lane last broke ("" since it connected) */
    /* Its messages parked while a tensor's bytes are not all on the lane
     * yet, and every later message of its behind them (bulk_park.c). */
    struct pp_tp_parked *park_head, *park_tail;
    int park_n;
    uint64_t park_bytes;                     /* their tensors' bytes, counted with the mailbox's */
} peer;

/* Counts the small messages to one peer that libzmq's I/O thread has not
 * taken from the queue yet: each holds a reference, released (on that
 * thread) when libzmq is done with it, so the count outlives the peer. */
typedef struct pp_tp_inflight {
    atomic_int refs, count;
} pp_tp_inflight;

typedef struct stat_counters {
    atomic_ullong messages_sent, messages_received, bytes_sent, bytes_received, dropped,
        retries, timeouts, peer_failures, pending, pending_bytes, shm_bytes_sent, shm_bytes_received,
        dropped_window, dropped_over_cap, dropped_foreign, shed_connections, bulk_bytes_sent, bulk_bytes_received;
} stat_counters;

/* An incoming connection that no rank's handshake pinned (transport_conns.c). */
typedef struct pp_tp_stranger {
    int fd;
    char addr[80];
} pp_tp_stranger;

struct pp_transport {
    int rank, nranks, nstages;
    int *stage_ranks;
    uint64_t run_id;        /* valid when run_known */
    int run_known;
    uint64_t nonce;         /* ours, in every hello: never 0 */
    char proc[48];          /* our "NS-PID" */
    int timeout_ms, hb_ivl_ms, hb_timeout_ms, linger_ms, grace_ms;
    int sndhwm, rcvhwm, sndbuf, rcvbuf;
    uint64_t max_message_bytes;
    size_t frame_bytes, zero_copy_min; /* frame_bytes 0: by size (pp_tp_frame_size) */
    int64_t step_window, cur_step; /* step_window 0: no upper bound */
    int step_set;           /* pp_transport_set_step was called: the window's upper bound applies */
    uint64_t max_pending_per_peer; /* 0: no cap */
    int lock_fd;            /* flock on ipc PATH.lock (-1: none) */
    int bound_port;         /* tcp: our port, whose accepted connections are budgeted; 0: none */
    size_t conn_budget;     /* incoming connections kept before strangers are shed */
    int64_t conns_swept_at; /* monotonic ms of the last look at them */
    pp_tp_stranger *strangers; /* unpinned incoming connections at that look */
    void *fd_dir;           /* DIR of /proc/self/fd, kept open for those looks */
    size_t n_strangers;
    char *lock_path;

    pp_zctx *zctx;
    void *ctx;
    void *pull;
    char endpoint[MAX_ENDPOINT];
    /* endpoints[rank] when another address was bound (bind_endpoint: all
     * interfaces, say): where peers were told to connect; else "" */
    char advertised[MAX_ENDPOINT];
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

    zmq_msg_t *frames;      /* receive scratch: the envelope (moved to 0), then the data frames */
    size_t *sizes;
    size_t frames_cap;
    zmq_pollitem_t *items;  /* poll scratch: 3 + 3 per rank (pp_tp_wait_events) */
    int rcvtimeo;           /* ZMQ_RCVTIMEO currently set on pull */
    int64_t spin_ns;        /* busy-poll this long before a receive blocks */
    int64_t spin_borrows;   /* pp_share_cores_borrows when this rank last waited (may_spin) */
    size_t shm_bytes;       /* ring size per same-host peer; 0: rings off */
    pp_doorbell *bell;      /* ours, announced in hellos (NULL: no message rings) */
    int n_rx_msg;           /* peers' message rings we read */
    int n_obox;             /* peers with held-back messages */
    int batching;           /* pp_transport_set_batching: small messages may be held back */
    int bulk;               /* bulk lanes may be used (options.bulk_lanes) */
    int n_parked;           /* messages parked, all peers (bulk_park.c) */
    uint8_t *ring_copy;     /* a message ring record, copied before decoding */
    char host_id[HOST_ID_CHARS];
    /* the last message source address looked up, and its text */
    struct sockaddr_storage addr_cache_sa;
    socklen_t addr_cache_len;
    char addr_cache[PEER_ADDR_CHARS];

    stat_counters st;
};

/* What a send or receive is doing, turned into text only for errors. */
typedef struct action {
    int sending;
    const pp_mbox_key *key;
    int ntensors;
} action;

/* ---- small helpers ---- */

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t now_ms(void) { return now_ns() / 1000000; }

static inline void stat_add(atomic_ullong *c, uint64_t n) {
    /* one writer (the owner thread): a relaxed load and store, no lock prefix */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

/* Mirrors the mailbox size into the counters other threads may read. */
static inline void sync_pending(pp_transport *t) {
    atomic_store_explicit(&t->st.pending, pp_mailbox_count(t->mbox), memory_order_relaxed);
    atomic_store_explicit(&t->st.pending_bytes, pp_mailbox_bytes(t->mbox), memory_order_relaxed);
}

static inline const char *peer_ep(const pp_transport *t, int r) {
    if (r == t->rank) return t->endpoint;
    return t->peers[r].endpoint ? t->peers[r].endpoint : "(endpoint unknown)";
}

static inline pp_peer_state peer_state(const peer *p) {
    return (pp_peer_state)atomic_load(&((peer *)p)->state);
}

static inline void set_state(peer *p, pp_peer_state s) { atomic_store(&p->state, (int)s); }

static inline int setopt_int(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }

static inline void close_socket(void *s) {
    if (!s) return;
    setopt_int(s, ZMQ_LINGER, 0);
    zmq_close(s);
}

static inline int endpoint_usable(const char *ep) { return ep && ep[0] && !strchr(ep, '*'); }

/* Control characters are kept out of names and texts: they get logged. */
static inline int control_char(char c) { return (unsigned char)c < 0x20 || c == 0x7f; }

static inline int name_ok(const char *s) {
    if (!s || !s[0]) return 0;
    size_t n = 0;
    for (; s[n]; n++)
        if (control_char(s[n]) || n >= PP_ENVELOPE_MAX_NAME) return 0;
    return 1;
}

/* Where a message came from, as pinned by the hello handshake: tcp
 * "IP:PORT" of the connection, ipc ":UID:GID:PID" of the process (libzmq's
 * Peer-Address), NULL for inproc. buf holds the tcp form. */
const char *pp_tp_peer_addr(zmq_msg_t *m0, char buf[PEER_ADDR_CHARS]);

/* Whether message address b is pinned address a (NULL only equals NULL).
 * A tcp message read after its connection closed has only its IP (the
 * descriptor is gone): it matches a's IP. So a peer's last messages before
 * it exits (data, goodbye, abort) still count; a stranger on the peer's
 * host that closes its connection at once passes this test too, and is
 * stopped by the handshake nonce every message carries. */
static inline int same_addr(const char *a, const char *b) {
    if (!a || !b) return !a && !b;
    if (strcmp(a, b) == 0) return 1;
    size_t n = strlen(b);
    return b[0] != ':' && strchr(a, ':') && strncmp(a, b, n) == 0 && a[n] == ':' && !strchr(a + n + 1, ':');
}

/* ---- transport_conns.c ---- */
/* Sets the budget (0: 4 per rank + 32) once the endpoint is bound. */
void pp_tp_conn_budget_init(pp_transport *t, size_t budget);
/* At most once a second: over budget or near the file limit, shuts down
 * incoming connections no handshake pinned. */
void pp_tp_conn_budget(pp_transport *t, int64_t now);
void pp_tp_conn_budget_close(pp_transport *t);

/* ---- transport.c ---- */

pp_status pp_tp_common_sockopts(pp_transport *t, void *s, const char *what);
pp_status pp_tp_abort_error(pp_transport *t);
/* "; this process has N of its L file descriptors open ..." when it is at
 * its file limit (incoming connections are then refused); "" otherwise. */
const char *pp_tp_conn_note(pp_transport *t, char *buf, size_t cap);

/* ---- transport_peers.c ---- */

pp_status pp_tp_connect_peer(pp_transport *t, int r, const char *ep);
void pp_tp_peer_close(peer *p);
/* Takes the monitors' events and greets peers that came up. */
void pp_tp_read_monitors(pp_transport *t);
void pp_tp_say_hello(pp_transport *t, int r, const char *word);
/* Handles a hello or hello-reply claiming rank r that came from addr; m0
 * for drop messages. */
void pp_tp_handle_hello(pp_transport *t, int r, const pp_envelope *env, zmq_msg_t *m0, const char *addr);
/* Sends our run id and peer r's nonce to r if not done on this connection;
 * 1 if told. */
int pp_tp_tell(pp_transport *t, int r);
/* Waits (receiving meanwhile) until peer r can accept our messages (we told
 * it our run id and echoed its nonce on this connection) or the deadline
 * passes. */
pp_status pp_tp_await_ready(pp_transport *t, int r, const action *act);
/* A tensorless message to peer r, without waiting. 1 if it went out. */
int pp_tp_send_simple(pp_transport *t, int r, pp_msg_kind kind, const char *text);
const char *pp_tp_action_str(const action *a, char *buf, size_t cap);
pp_status pp_tp_check_peer(pp_transport *t, int r, const action *act, int64_t now, int64_t *wake);
int pp_tp_peer_looks_gone(const pp_transport *t, int r, int64_t now);

/* ---- transport_rings.c ---- */

void pp_tp_retire_ring(peer *p);
pp_shm_ring *pp_tp_tx_ring(pp_transport *t, int r, size_t largest);
int pp_tp_ring_reserve(pp_transport *t, int r, pp_shm_ring **ring, int first, size_t n, uint64_t *pos,
                       void **dst);
pp_shm_ring *pp_tp_msg_ring(pp_transport *t, int r);
int pp_tp_send_by_ring(pp_transport *t, int r, pp_shm_ring *ring, const pp_envelope *env);
pp_status pp_tp_rx_ring(pp_transport *t, int r, const char *name, pp_shm_ring **out);
/* 1 if name can be one of rank r's rings (the prefix its hello gave); 0
 * with the error set otherwise. */
int pp_tp_ring_name_ok(pp_transport *t, int r, const char *name);
pp_status pp_tp_shm_tensor(pp_transport *t, pp_shm_ring *ring, const pp_wire_tensor *wt,
                           pp_tensor **out);
void pp_tp_settle_ring(pp_shm_ring *ring, const pp_envelope *env);

/* ---- transport_send.c ---- */

pp_status pp_tp_check_key(const pp_transport *t, const pp_transport_key *k, int sending);
/* The frame size for a tensor of nbytes to peer p (frame_bytes, or by size). */
size_t pp_tp_frame_size(const pp_transport *t, const peer *p, size_t nbytes);

/* ---- transport_batch.c ---- */

/* Whether peer p has HOLD_AHEAD small messages still in libzmq's queue. */
int pp_tp_ahead(const peer *p);
/* Packs env into m, counted as in flight to rank r until libzmq took it. */
pp_status pp_tp_pack_counted(pp_transport *t, int r, const pp_envelope *env, zmq_msg_t *m);
/* Adds env (inline tensors only) to rank r's batch; 0 if it does not fit. */
int pp_tp_hold(pp_transport *t, int r, const pp_envelope *env);
/* Rank r's batch as one message in m; the batch is then empty. */
pp_status pp_tp_take_held(pp_transport *t, int r, zmq_msg_t *m);
/* Sends rank r's batch if it has room now, without waiting: 1 if nothing
 * is held back any more (sent, or lost with the connection), 0 if not yet. */
int pp_tp_flush_one(pp_transport *t, int r);
/* Sends the batches held back for peers that now have room (never waits). */
void pp_tp_flush_held(pp_transport *t);
/* Sends or (at most wait_ms, receiving meanwhile) drops what is held back,
 * logging what is lost; for close. */
void pp_tp_settle_held(pp_transport *t, int wait_ms);
/* Forgets what is held back for peer r (abort, close). */
void pp_tp_drop_held(pp_transport *t, int r);
void pp_tp_inflight_release(pp_tp_inflight *f);

/* ---- transport_bulk.c ---- */

void pp_tp_bulk_init(peer *p);
/* Rank r's bulk lane for a tensor of nbytes, if one is up; set-up is asked
 * for and moved on here. NULL: the tensor goes in frames. */
pp_bulk_tx *pp_tp_bulk_lane(pp_transport *t, int r, size_t nbytes);
/* Queues tensor index of message seq on rank r's lane, waiting (receiving
 * meanwhile) while the lane's queue is full. */
pp_status pp_tp_bulk_push(pp_transport *t, int r, uint64_t seq, uint32_t index, pp_tensor *x, const action *act);
/* 1 once rank r's lane failed and was turned off: a message whose push
 * failed then goes again in frames. */
int pp_tp_bulk_failed(const pp_transport *t, int r);
/* Handles a bulk control text from (verified) rank r: 1 if it was one. */
int pp_tp_bulk_control(pp_transport *t, int r, const char *text);
/* A tensor to read PP_PLACE_BULK tensor wt's bytes into. */
pp_status pp_tp_bulk_alloc(pp_transport *t, const pp_wire_tensor *wt, pp_tensor **out);
/* Reads tensor index of message seq from rank r's lane into x, taking the
 * lane's connection first if it has not come yet. wait 0: never waits
 * (reads what is there; the next call goes on from there), wait 1: waits
 * until deadline. 1: done; 0: not all there yet (wait 0, deadline not
 * passed); -1: failed (error set; a lane that broke, or whose bytes did
 * not come by the deadline, is closed and bulk_fail says why). */
int pp_tp_bulk_fill(pp_transport *t, int r, uint64_t seq, uint32_t index, pp_tensor *x, int64_t deadline,
                    int wait);
/* What to poll for rank r's lane to go on: its socket, or while it has
 * not connected its listener; -1 if neither. */
int pp_tp_bulk_rx_fd(const pp_transport *t, int r);
/* Closes both lanes with rank r, letting ours finish for up to linger_ms. */
void pp_tp_bulk_close(pp_transport *t, int r, int linger_ms);

/* ---- bulk_park.c ---- */

/* A tensor of a parked message. */
typedef struct pp_tp_slot {
    char name[PP_ENVELOPE_MAX_NAME + 1];
    int bulk;               /* its bytes come on the lane, into x */
    pp_tensor *x;           /* NULL: it failed (dropped, logged) */
} pp_tp_slot;

/* A checked message from one peer, parked: its tensors built (a bulk
 * one's bytes read as far as they came), or a control text to act on. */
typedef struct pp_tp_parked {
    struct pp_tp_parked *next;
    pp_msg_kind kind;
    int64_t step;
    int32_t microbatch, src_stage, dst_stage;
    uint64_t seq;
    int ntensors, cur;      /* cur: the tensor being read from the lane */
    int64_t parked_ms;      /* parked, or the one ahead finished: its bytes must come within timeout_ms */
    uint64_t bytes;         /* its tensors' bytes, in the peer's park_bytes */
    char text[PP_ENVELOPE_MAX_TEXT + 1];
    pp_tp_slot slot[];
} pp_tp_parked;

/* Most messages one peer may have parked; past it the receiver waits for
 * the lane as it did before parking (never drops). */
#define PP_PARK_MAX 64

/* A record for checked message env (tensor names, kind, key, text); its
 * tensors are the caller's to build. NULL: out of memory (error set). */
pp_tp_parked *pp_tp_park_new(const pp_envelope *env);
void pp_tp_park_free(pp_tp_parked *m);
/* Queues m behind rank r's parked messages and goes on with the queue (so
 * a message whose bytes are all there is filed at once). */
void pp_tp_park_add(pp_transport *t, int r, pp_tp_parked *m, const pp_mbox_key *want, pp_tensor **got);
/* Goes on with every peer's parked messages without waiting; returns how
 * many were finished (filed, acted on or dropped). */
int pp_tp_park_resume(pp_transport *t, const pp_mbox_key *want, pp_tensor **got);
/* Poll items for the lanes parked messages wait on, into it (room for one
 * per rank); *timeout is cut to the nearest of their deadlines. */
int pp_tp_park_items(pp_transport *t, zmq_pollitem_t *it, int64_t *timeout);
/* Frees rank r's parked messages, unfiled (close, lane reset). */
void pp_tp_park_clear(pp_transport *t, int r);
/* "; ..." about rank r's parked message or broken lane for a receive's
 * timeout error, or "". */
const char *pp_tp_park_note(const pp_transport *t, int r, char *buf, size_t cap);

/* ---- transport_recv.c ---- */

int pp_tp_drain(pp_transport *t, const pp_mbox_key *want, pp_tensor **got);
/* Files tensor x under key from rank r (or hands it to *got if it is
 * the one wanted); takes x. */
void pp_tp_file(pp_transport *t, int r, const pp_mbox_key *key, pp_tensor *x, const pp_mbox_key *want,
                pp_tensor **got);
/* Acts on control text from (checked) rank r (m0: its frame, for
 * warnings; NULL for a parked one). */
void pp_tp_control(pp_transport *t, int r, const char *text, zmq_msg_t *m0, const pp_mbox_key *want,
                   pp_tensor **got);
/* Counts and (rate-limited) logs a dropped message; counter is one of the
 * stats breakdowns or NULL. */
void pp_tp_drop(pp_transport *t, zmq_msg_t *m0, atomic_ullong *counter, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int pp_tp_wait_events(pp_transport *t, int64_t timeout, peer *out_peer);

#endif

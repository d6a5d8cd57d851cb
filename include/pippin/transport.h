/* ZeroMQ transport: activations and gradients between pipeline ranks.
 *
 * Every rank binds one PULL socket at its endpoint and connects one PUSH
 * socket to every other rank whose endpoint it knows, so each direction of
 * each pair of ranks is a PUSH->PULL link. Endpoints are `inproc://` (ranks
 * as threads of one process: they must share one ZeroMQ context, which
 * pippin's process-wide context gives them), `ipc://` or `tcp://`.
 *
 * A message is multipart: frame 0 is a packed protobuf envelope
 * (transport/pippin.proto), then the raw bytes of each tensor. Tensors of at
 * least `zero_copy_min` bytes are sent without copying, in frames of
 * `frame_bytes`; smaller ones are copied. Received tensors are filed in a
 * mailbox by (kind, step, microbatch, source stage, destination stage,
 * value name); pp_transport_recv takes one out by key, whatever the order
 * of arrival.
 *
 * Never hang: every send and receive has a deadline; peers are watched with
 * ZMTP heartbeats and socket monitors, so a peer that exits, crashes or goes
 * silent is reported (PP_ERR_PEER, naming its rank and endpoint) within the
 * heartbeat timeout; messages are never queued to a peer that has not
 * connected (ZMQ_IMMEDIATE); linger is bounded, so pp_transport_close
 * returns. Never crash: every incoming message is validated before a tensor
 * is built; a bad one is dropped, logged (pp_log) and counted.
 *
 * Security: with a CURVE secret key the links are encrypted and a ZAP
 * handler admits only the listed client public keys; a peer with any other
 * key, or none, cannot deliver a message.
 *
 * THREADING CONTRACT. libzmq sockets are not thread-safe, so a transport
 * belongs to one thread at a time: all of its functions except
 * pp_transport_stats and pp_transport_peer_state must be called from that
 * thread (typically the rank's executor thread). It may be handed to another
 * thread only with a happens-before edge between the two (a mutex, a thread
 * join), never used by two threads at once. There is no background thread
 * per transport: incoming messages are moved from the socket into the
 * mailbox whenever the owner calls recv, send or poll (libzmq's own I/O
 * thread keeps reading the network meanwhile, up to the receive high-water
 * mark), and small messages held back by batching (pp_transport_set_batching)
 * go out during those calls too. pp_transport_stats and
 * pp_transport_peer_state may be called from
 * any thread. Several transports (ranks) may live in one process, one per
 * thread; they share the process-wide context and its ZAP handler thread.
 *
 * TENSOR CONTRACT. pp_transport_send does not copy large tensors: it keeps a
 * reference until libzmq has written the bytes, which can be after send
 * returns. The caller must not modify a tensor's data after sending it (it
 * may drop its own reference at once). Received tensors belong to the
 * caller; free them with pp_tensor_free.
 *
 * Thread safety: see the THREADING CONTRACT below. */
#ifndef PIPPIN_TRANSPORT_H
#define PIPPIN_TRANSPORT_H

#include "pippin/export.h"

#include <stddef.h>
#include <stdint.h>

#include "pippin/status.h"
#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a message carries. */
typedef enum pp_msg_kind {
    PP_MSG_ACTIVATION = 1,
    PP_MSG_GRADIENT = 2,
    PP_MSG_CONTROL = 3,
    PP_MSG_HEARTBEAT = 4,
    PP_MSG_ABORT = 5
} pp_msg_kind;

/* "activation", "gradient", ...; "unknown" for other values. */
PP_API const char *pp_msg_kind_name(int kind);

/* Z85 text of a CURVE key (32 bytes) is 40 characters. */
#define PP_CURVE_KEY_CHARS 40

typedef struct pp_transport_options {
    int rank;                     /* this rank, 0 <= rank < nranks */
    int nranks;
    /* nranks endpoints. endpoints[rank] is bound and may use a wildcard
     * (port "*" for tcp, path "*" for ipc; see pp_transport_endpoint); a peer's
     * entry may be NULL or "" when not known yet (pp_transport_connect_peer). */
    const char *const *endpoints;
    /* Address to bind instead of endpoints[rank], e.g. all interfaces
     * ("tcp://" "*:5555") while peers connect to "tcp://node3:5555".
     * NULL: endpoints[rank]. */
    const char *bind_endpoint;
    /* Stage -> rank map: stage s runs on rank stage_ranks[s]. NULL: stage r
     * on rank r (nstages = nranks). */
    int nstages;
    const int *stage_ranks;
    /* Run identity on the wire: messages of another run id are dropped.
     * 0: rank 0 draws a random 64-bit id at create and the other ranks learn
     * it from the hello handshake (a rank that has not learned it yet drops
     * every message but hellos, and sends nothing but hellos); nonzero
     * (e.g. from a config): every rank uses it as given. */
    uint64_t run_id;

    int timeout_ms;               /* default send/receive deadline; default 10000 */
    int heartbeat_ivl_ms;         /* ZMTP PING interval; default min(1000, timeout/4) */
    int heartbeat_timeout_ms;     /* peer silent this long = dead; default timeout_ms */
    int linger_ms;                /* close waits at most this for unsent data; default 1000 */
    int sndhwm;                   /* messages queued per peer; default 64 */
    int rcvhwm;                   /* messages queued on the receive socket; default 1000 */
    int sndbuf, rcvbuf;           /* kernel socket buffers in bytes; 0: OS default */
    uint64_t max_message_bytes;   /* larger incoming messages are dropped; default 2 GiB */
    size_t frame_bytes;           /* large tensors go in frames of this size; default 0: a tensor
                                   * up to 16 MiB in one frame (received without a copy), larger
                                   * ones in 1 MiB frames */
    size_t zero_copy_min;         /* tensors at least this big are not copied; default 64 KiB */
    /* Tensors that arrive in several frames are reassembled into buffers
     * that are kept for reuse after the tensor is freed, up to this many
     * bytes (saves the page faults of fresh memory). 0: 512 MiB; < 0: off. */
    int64_t recv_cache_bytes;
    /* Step window: messages of a step below the current one (see
     * pp_transport_set_step) are dropped, and once pp_transport_set_step has
     * been called so are messages more than step_window steps ahead of it.
     * 0: 2 steps; < 0: no upper bound. */
    int64_t step_window;
    /* A receive (or a poll that may wait) that finds nothing busy-polls
     * this long before it sleeps, since waking a sleeping thread costs
     * more than a small message. Pays
     * only when every rank and libzmq I/O thread has a core of its own (a
     * spinning rank starves the I/O thread that would deliver to it).
     * 0: never spin. */
    int spin_us;
    /* Ranks on one host (peers exchange a host id when they connect) pass
     * tensors of at least zero_copy_min bytes through a shared-memory ring
     * per destination instead of the socket (one copy in, one copy out, no
     * kernel in between), and small messages whole through a message ring
     * with a doorbell (no ZeroMQ at all). The largest ring is this many
     * bytes; what does not fit goes over the socket. 0: 1 GiB; < 0: never.
     * Off with CURVE, whose promise is that every byte is encrypted. */
    int64_t shm_bytes;

    /* CURVE. With curve_secret_key set (Z85, 40 chars) every link is
     * encrypted: this rank's receive socket is a CURVE server and admits only
     * clients whose public key is in curve_allowed_keys (NULL: the
     * curve_rank_keys); its sends use curve_rank_keys[peer] as the server
     * key. curve_rank_keys (nranks Z85 public keys) is then required. */
    const char *curve_secret_key;
    const char *const *curve_rank_keys;
    const char *const *curve_allowed_keys;
    int n_curve_allowed_keys;

    /* ZeroMQ context to use; NULL: pippin's process-wide context (created on
     * first use with io_threads I/O threads, terminated when the last
     * transport using it closes). A caller's context is never terminated. */
    void *zmq_context;
    int io_threads;               /* default 1 */

    /* Bytes of tensors from one peer that may wait in the mailbox; a
     * message that would go over is dropped (stats.dropped_over_cap; a
     * receive that then times out says so). A schedule can park many
     * microbatches' activations from one peer (GPipe: all of them): raise
     * it for those. 0: 4 GiB; < 0: no cap. (Appended: the struct only grows.) */
    int64_t max_pending_bytes_per_peer;
    /* tcp: incoming connections kept before those that completed no hello
     * handshake are shut down (also whenever the process nears its file
     * limit); stats.shed_connections counts them. 0: 4 per rank + 32. */
    int max_incoming_connections;
    /* Tensors of 256 KiB and more to a peer on another host go over a TCP
     * connection of their own beside the ZeroMQ link (a bulk lane), read by
     * the receiving rank straight into a recycled buffer; their envelopes
     * still take the link. Used when the receiver's transport can carry
     * direct links (plain tcp, no CURVE, bound to one address); set up on
     * the first such tensor. 0: on; < 0: off (frames through ZeroMQ; this
     * rank neither asks for lanes nor offers them, e.g. where a firewall
     * passes only the transport's ports). */
    int bulk_lanes;
} pp_transport_options;

/* Fills o with the defaults above (rank 0 of 1, no endpoints). */
PP_API void pp_transport_options_init(pp_transport_options *o);

/* What a send is addressed to and a receive waits for. kind is
 * PP_MSG_ACTIVATION, PP_MSG_GRADIENT or PP_MSG_CONTROL. */
typedef struct pp_transport_key {
    pp_msg_kind kind;
    int64_t step;         /* >= 0 */
    int32_t microbatch;   /* >= 0 */
    int32_t src_stage;    /* the sending stage (must run on the sending rank) */
    int32_t dst_stage;    /* the receiving stage (decides the destination rank) */
    const char *name;     /* graph value name (1..255 printable bytes) */
} pp_transport_key;

typedef struct pp_transport_stats {
    uint64_t messages_sent;
    uint64_t messages_received;   /* accepted (filed) messages */
    uint64_t bytes_sent;          /* tensor payload bytes */
    uint64_t bytes_received;
    uint64_t dropped;             /* invalid, stale, foreign or unroutable incoming messages */
    uint64_t retries;             /* sends that had to wait for a peer (queue full, not connected) */
    uint64_t timeouts;            /* sends and receives that missed their deadline */
    uint64_t peer_failures;       /* connections to peers lost */
    uint64_t auth_failures;       /* CURVE clients the ZAP handler refused */
    uint64_t pending;             /* tensors waiting in the mailbox */
    uint64_t pending_bytes;
    uint64_t shm_bytes_sent;      /* payload bytes that went through shared memory (same-host peers) */
    uint64_t shm_bytes_received;
    /* Appended (the struct only grows). Each is also counted in dropped. */
    uint64_t dropped_window;      /* more than step_window steps ahead */
    uint64_t dropped_over_cap;    /* over max_pending_bytes_per_peer */
    uint64_t dropped_foreign;     /* another run id, a sender that has not completed the hello
                                   * handshake, or from another address than its handshake */
    uint64_t shed_connections;    /* incoming tcp connections shut down over the budget (strangers) */
    uint64_t bulk_bytes_sent;     /* payload bytes that went over a bulk lane (bulk_lanes) */
    uint64_t bulk_bytes_received;
} pp_transport_stats;

typedef enum pp_peer_state {
    PP_PEER_UNKNOWN = 0,   /* no endpoint known */
    PP_PEER_CONNECTING,    /* connecting or handshaking (inproc peers stay here) */
    PP_PEER_UP,            /* connected and handshake done */
    PP_PEER_DOWN,          /* connection lost: exit, crash or heartbeat timeout */
    PP_PEER_REJECTED,      /* handshake failed: our CURVE key refused, or a mechanism mismatch */
    PP_PEER_CLOSED,        /* the peer closed its transport */
    PP_PEER_SELF
} pp_peer_state;

PP_API const char *pp_peer_state_name(pp_peer_state s);

typedef struct pp_transport pp_transport;

/* Binds this rank's endpoint and connects to every peer whose endpoint is
 * known. Does not wait for peers (see pp_transport_wait_peers). An ipc://
 * endpoint is locked (flock on PATH.lock beside the socket, released at
 * close or when the process dies): a second transport binding the same path
 * fails with PP_ERR_IO naming it, instead of taking the socket over. */
PP_API pp_status pp_transport_create(const pp_transport_options *opts, pp_transport **out);

/* The endpoint this rank is bound to, wildcards resolved
 * ("tcp://127.0.0.1:41235"). Valid until close. */
PP_API const char *pp_transport_endpoint(const pp_transport *t);

/* The run id this transport puts on the wire and accepts: the one given in
 * the options, the one rank 0 drew, or the one learned from the hello
 * handshake; 0 while not learned yet. A process that opens a new transport
 * for the same run (a rejoin) passes rank 0's on, so that ranks that learned
 * it keep talking to the new one. */
PP_API uint64_t pp_transport_run_id(const pp_transport *t);

/* The default deadline of sends and receives in ms (timeout_ms of the
 * options, or its default): what a timeout_ms < 0 given to this transport
 * or to a layer above it stands for. */
PP_API int pp_transport_timeout_ms(const pp_transport *t);

/* The rank that runs stage (stage_ranks of the options); -1 if there is no
 * such stage. */
PP_API int pp_transport_stage_rank(const pp_transport *t, int stage);

/* What this rank's same-host peers share with it: equal for two ranks
 * only when they can open each other's 0600 shared memory (boot, /dev/shm,
 * user; see shm_bytes), as sent in the hello. "" when this transport keeps
 * off shared memory (shm_bytes < 0, CURVE, no /proc). */
PP_API const char *pp_transport_host_id(const pp_transport *t);

/* Sets or changes a peer's endpoint and connects to it. */
PP_API pp_status pp_transport_connect_peer(pp_transport *t, int rank, const char *endpoint);

/* Waits until every peer with a known tcp/ipc endpoint has connected
 * (inproc peers are not waited for). PP_ERR_TIMEOUT names the missing
 * ranks; PP_ERR_PEER names a peer that refused us. timeout_ms < 0: the
 * transport's timeout. */
PP_API pp_status pp_transport_wait_peers(pp_transport *t, int timeout_ms);

/* Sends tensor, filed at the receiver under key, to the rank running
 * key->dst_stage (a stage on this rank is served from the local mailbox
 * without copying). Waits at most the transport's timeout for the peer to
 * accept it; PP_ERR_TIMEOUT or PP_ERR_PEER name the rank and endpoint.
 * Keeps a reference to tensor until sent (see TENSOR CONTRACT). */
PP_API pp_status pp_transport_send(pp_transport *t, const pp_transport_key *key, pp_tensor *tensor);

/* Sends n tensors in one message; tensor i is filed under key with
 * name names[i] (key->name is ignored). Names must differ. */
PP_API pp_status pp_transport_sendv(pp_transport *t, const pp_transport_key *key, int n,
                             const char *const *names, pp_tensor *const *tensors);

/* Takes the tensor filed under key, waiting until it arrives. timeout_ms < 0:
 * the transport's timeout; 0: do not wait. Errors: PP_ERR_TIMEOUT (names the
 * key and the source rank and endpoint), PP_ERR_PEER (that rank died, went
 * silent, closed, or some rank aborted the run). On success *out is a new
 * reference owned by the caller. */
PP_API pp_status pp_transport_recv(pp_transport *t, const pp_transport_key *key, int timeout_ms,
                            pp_tensor **out);

/* Takes the tensor filed under key if it has arrived, without waiting:
 * *out is NULL when it has not (what the socket holds is read first). For
 * callers that make progress on several exchanges between other work (the
 * replicas' gradient ring). Errors: PP_ERR_PEER when the run was aborted. */
PP_API pp_status pp_transport_try_recv(pp_transport *t, const pp_transport_key *key, pp_tensor **out);

/* Takes the tensor filed under key if it is in the mailbox already (what
 * pp_transport_poll or another receive moved there), with no socket call
 * and no peer check: *out is NULL when it is not. For a loop that polls
 * once and then looks for several keys (the serving front). Errors:
 * PP_ERR_PEER when the run was aborted. */
PP_API pp_status pp_transport_take(pp_transport *t, const pp_transport_key *key, pp_tensor **out);

/* Moves whatever has arrived into the mailbox, waiting at most timeout_ms
 * for the first message (0: do not wait; spin_us of it busy-polled). */
PP_API pp_status pp_transport_poll(pp_transport *t, int timeout_ms);

/* Batching (off unless turned on here). When on, a send of small tensors
 * (all of them under zero_copy_min, together within 16 KiB) that finds
 * the peer's queue full, that is, this rank is ahead of the peer, returns
 * at once and holds the message back instead of waiting; later small
 * messages to that peer join it, up to 64 messages in one 64 KiB batch,
 * which the receiver checks entry by entry as if each had come alone.
 * What is held back goes out as soon as the peer has room, during any
 * later call on this transport (send, recv, poll, flush, close) -- and only
 * then: there is no background thread. So a caller that turns batching on
 * calls pp_transport_flush before it stops calling the transport for a
 * while (computing, waiting on something else, exiting its send loop).
 * Another message to that peer waits until the batch is out, so per-peer
 * order holds. Ranks on one host send small messages through their
 * message rings, which never wait, so this is for the socket path (tcp
 * between hosts, CURVE). */
PP_API void pp_transport_set_batching(pp_transport *t, int on);

/* Sends everything held back (see pp_transport_set_batching), waiting
 * (and receiving meanwhile) at most timeout_ms (< 0: the transport's
 * timeout) for the peers to have room. PP_ERR_TIMEOUT or PP_ERR_PEER name
 * a rank whose messages are still held back; PP_OK at once when nothing
 * is. */
PP_API pp_status pp_transport_flush(pp_transport *t, int timeout_ms);

/* Starts step `step`: later messages of older steps are dropped, and those
 * still in the mailbox are freed; from the first call on, messages more than
 * step_window steps ahead are dropped too. */
PP_API pp_status pp_transport_set_step(pp_transport *t, int64_t step);

/* Tells every peer that this rank gives up the run (best effort, does not
 * wait). Their pending and later sends and receives fail with PP_ERR_PEER
 * quoting reason; so do this transport's. */
PP_API pp_status pp_transport_abort(pp_transport *t, const char *reason);

/* The first abort this transport saw (its own or a peer's): NULL while
 * there is none; else the reason, and *rank (may be NULL) the rank that
 * gave up. Valid until close. */
PP_API const char *pp_transport_abort_reason(const pp_transport *t, int *rank);

/* Counters; callable from any thread. */
PP_API void pp_transport_stats_get(const pp_transport *t, pp_transport_stats *out);

/* A peer's connection state; callable from any thread. */
PP_API pp_peer_state pp_transport_peer_state(const pp_transport *t, int rank);

/* 1 once rank has completed the hello handshake with this rank: it answered
 * this rank's hello on the connection its messages come from (they are
 * accepted from then on), this rank knows the run id and has answered the
 * rank's hello (so it accepts this rank's messages). A send waits, within
 * its deadline, for the last part: the rank's hello and this rank's answer. */
PP_API int pp_transport_peer_ready(const pp_transport *t, int rank);

/* 1 if large tensors to rank go through a shared-memory ring: it is on this
 * host, and has said so since it connected (peers introduce themselves
 * when they connect, so the first messages may still take the socket). */
PP_API int pp_transport_peer_shm(const pp_transport *t, int rank);

/* Says goodbye to the peers, closes the sockets (waiting at most linger_ms
 * for unsent data) and frees everything, including tensors left in the
 * mailbox. NULL is ignored. */
PP_API void pp_transport_close(pp_transport *t);

/* ---- CURVE keys ---- */

/* A new key pair as Z85 text (41 bytes each with the NUL). */
PP_API pp_status pp_curve_keypair(char public_z85[PP_CURVE_KEY_CHARS + 1],
                           char secret_z85[PP_CURVE_KEY_CHARS + 1]);
/* The public key of a secret key. */
PP_API pp_status pp_curve_public_key(const char *secret_z85, char public_z85[PP_CURVE_KEY_CHARS + 1]);
/* Checks that s is 40 characters of Z85 text. */
PP_API int pp_curve_key_valid(const char *s);
/* Writes a new key pair: PREFIX.key (secret, mode 0600) and PREFIX.pub.
 * Existing files are an error unless overwrite. Fills public_z85 if not NULL. */
PP_API pp_status pp_curve_write_keypair(const char *prefix, int overwrite,
                                 char public_z85[PP_CURVE_KEY_CHARS + 1]);
/* Reads a key file (.pub or .key: '#' comment lines, then the Z85 key on a
 * line of its own). Warns when a secret key file is readable by others. */
PP_API pp_status pp_curve_read_key(const char *path, char z85[PP_CURVE_KEY_CHARS + 1]);

#ifdef __cplusplus
}
#endif
#endif

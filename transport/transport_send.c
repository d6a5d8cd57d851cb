/* Sending: a message goes to this rank's own mailbox, through a message
 * ring (small, same host), or over the socket with its large tensors in a
 * tensor ring (same host) or in zero-copy frames. */
#include "transport_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Stack space for this many tensors' metadata when sending. */
#define SEND_STACK_TENSORS 16

static void release_tensor(void *data, void *hint) {
    (void)data;
    pp_tensor_free(hint);
}

pp_status pp_tp_check_key(const pp_transport *t, const pp_transport_key *k, int sending) {
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

/* With frame_bytes 0 (the default): a tensor of up to ONE_FRAME_MAX goes
 * in one frame, which the receiver wraps without a reassembly copy (1 MiB
 * frames made 16 MiB tensors 0.6-0.8x raw libzmq on the socket path, one
 * frame about 1x); larger ones in LARGE_FRAME_BYTES frames, reassembled
 * into recycled buffers: at 64 MiB, 16 MiB frames went at 1.5x raw and 1
 * MiB frames at 1.9x (libzmq receives each frame into fresh memory, and
 * big fresh blocks cost page faults), and frames past glibc's 32 MiB mmap
 * threshold fault on every message. */
#define ONE_FRAME_MAX ((size_t)16 << 20)
#define LARGE_FRAME_BYTES ((size_t)1 << 20)

size_t pp_tp_frame_size(const pp_transport *t, const peer *p, size_t nbytes) {
    if (p->inproc) return SIZE_MAX; /* the sender's buffer itself */
    if (t->frame_bytes) return t->frame_bytes;
    return nbytes <= ONE_FRAME_MAX ? ONE_FRAME_MAX : LARGE_FRAME_BYTES;
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

/* Sends a message's first frame, waiting (and receiving meanwhile) until
 * the peer takes it or the deadline passes. On failure m0 is closed. */
static pp_status send_first(pp_transport *t, int r, zmq_msg_t *m0, int more, const action *act) {
    peer *p = &t->peers[r];
    char doing[ACTION_CHARS];
    int flags = ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0);
    int64_t deadline = -1;
    for (;;) {
        if (zmq_msg_send(m0, p->push, flags) >= 0) return PP_OK;
        if (zmq_errno() != EAGAIN) {
            int e = zmq_errno();
            zmq_msg_close(m0);
            return pp_error(PP_ERR_IO, "transport rank %d: %s: rank %d (%s): %s", t->rank,
                            pp_tp_action_str(act, doing, sizeof doing), r, peer_ep(t, r), zmq_strerror(e));
        }
        int64_t now = now_ms();
        if (deadline < 0) {
            deadline = now + t->timeout_ms;
            stat_add(&t->st.retries, 1);
        }
        pp_tp_read_monitors(t);
        pp_tp_drain(t, NULL, NULL);
        int64_t wake = deadline;
        pp_status s = t->aborted ? pp_tp_abort_error(t) : pp_tp_check_peer(t, r, act, now, &wake);
        if (s == PP_OK && now >= deadline) {
            stat_add(&t->st.timeouts, 1);
            pp_peer_state ps = peer_state(p);
            s = pp_error(PP_ERR_TIMEOUT, "transport rank %d: %s: rank %d (%s) did not accept it within "
                         "%d ms (%s)", t->rank, pp_tp_action_str(act, doing, sizeof doing), r,
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
        pp_tp_wait_events(t, wake - now, p);
    }
}

static void *alloc_zmq_msg(void *ctx, size_t n) {
    return zmq_msg_init_size(ctx, n) == 0 ? zmq_msg_data(ctx) : NULL;
}

/* Sends a message's data frames, then its envelope m0 as the last frame:
 * libzmq's receiving I/O thread allocates each frame as it arrives, and
 * with the small envelope allocated before a large frame it took the front
 * of the hole the previous large frame left (freed by the receiver), so
 * every large frame came from fresh heap pages (1 MiB tensors: a page
 * fault per 4 KiB for a fifth to a quarter of the bytes, half raw
 * libzmq's speed). Data first, a large frame reuses that hole whole. The
 * first frame waits for room like any message; once it is in, the rest
 * cannot hit the high-water mark, and a failure means the connection died.
 * m0 is sent or closed. */
static pp_status send_data(pp_transport *t, int r, zmq_msg_t *m0, int n, pp_tensor *const *tensors,
                           const uint8_t *place, size_t nframes, const action *act) {
    peer *p = &t->peers[r];
    char doing[ACTION_CHARS];
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
                    lost_more = sent > 0;
                    break;
                }
                memcpy(zmq_msg_data(&m), x->data, chunk);
            } else {
                size_t fb = pp_tp_frame_size(t, p, x->nbytes);
                chunk = x->nbytes - off < fb ? x->nbytes - off : fb;
                pp_tensor_retain(x);
                if (zmq_msg_init_data(&m, (char *)x->data + off, chunk, release_tensor, x) != 0) {
                    pp_tensor_free(x);
                    lost = 1;
                    lost_more = sent > 0;
                    break;
                }
            }
            if (sent == 0) {
                /* nothing of the message is out yet: wait for room, as a
                 * message does (a failure is an error of its own) */
                pp_status s = send_first(t, r, &m, 1, act);
                if (s != PP_OK) {
                    zmq_msg_close(m0);
                    return s;
                }
                p->seq++;
            } else if (zmq_msg_send(&m, p->push, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) {
                zmq_msg_close(&m);
                lost = 1;
                lost_more = 1;
                break;
            }
            off += chunk;
            sent++;
        }
    }
    if (!lost && sent != nframes) lost = 1, lost_more = sent > 0; /* cannot happen: counted above */
    if (!lost) {
        if (zmq_msg_send(m0, p->push, ZMQ_DONTWAIT) >= 0) return PP_OK;
        lost_more = 0;
        lost = 1;
    }
    zmq_msg_close(m0);
    /* End the half-sent message. After a failed send libzmq drops the parts
     * it still gets; after a failed allocation the receiver gets a message
     * whose last frame (its envelope) is empty, and drops it. */
    if (lost_more) zmq_send(p->push, "", 0, ZMQ_DONTWAIT);
    if (sent == 0) return pp_error(PP_ERR_NOMEM, "transport rank %d: %s: out of memory", t->rank,
                                   pp_tp_action_str(act, doing, sizeof doing));
    stat_add(&t->st.peer_failures, 1);
    return pp_error(PP_ERR_PEER, "transport rank %d: %s: connection to rank %d (%s) lost "
                    "mid-message", t->rank, pp_tp_action_str(act, doing, sizeof doing), r, peer_ep(t, r));
}

/* ---- public ---- */

pp_status pp_transport_sendv(pp_transport *t, const pp_transport_key *key, int n,
                             const char *const *names, pp_tensor *const *tensors) {
    PP_TRY(pp_tp_check_key(t, key, 1));
    if (n < 1 || (uint32_t)n > (t->lim.max_tensors ? t->lim.max_tensors : PP_ENVELOPE_DEFAULT_MAX_TENSORS) ||
        !names || !tensors)
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
    if (t->aborted) return pp_tp_abort_error(t);
    int r = t->stage_ranks[key->dst_stage];
    if (r == t->rank) return send_local(t, key, n, names, tensors);
    peer *p = &t->peers[r];
    pp_mbox_key mk = {(int)key->kind, key->step, key->microbatch, key->src_stage, key->dst_stage, names[0]};
    action act = {1, &mk, n};
    char doing[ACTION_CHARS];
    if (!p->push)
        return pp_error(PP_ERR_STATE, "transport rank %d: %s: no endpoint known for rank %d",
                        t->rank, pp_tp_action_str(&act, doing, sizeof doing), r);
    /* the peer accepts messages only once it knows us (the hello handshake) */
    PP_TRY(pp_tp_await_ready(t, r, &act));

    size_t largest = 0;
    for (int i = 0; i < n; i++)
        if (tensors[i]->nbytes > largest) largest = tensors[i]->nbytes;
    pp_shm_ring *ring = largest >= t->zero_copy_min ? pp_tp_tx_ring(t, r, largest) : NULL;
    pp_wire_tensor wt_stack[SEND_STACK_TENSORS];
    pp_wire_tensor *wt = n <= SEND_STACK_TENSORS ? wt_stack : calloc((size_t)n, sizeof *wt);
    if (!wt) return pp_error(PP_ERR_NOMEM, "out of memory");
    uint8_t place[PP_ENVELOPE_DEFAULT_MAX_TENSORS]; /* n fits, checked above; wt is gone by the data frames */
    size_t nframes = 0, inline_bytes = 0;
    uint64_t shm_bytes = 0, bulk_bytes = 0;
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
        } else if (pp_tp_ring_reserve(t, r, &ring, shm_bytes == 0, x->nbytes, &pos, &dst)) {
            /* same host: one copy into shared memory, only the envelope on the socket */
            memcpy(dst, x->data, x->nbytes);
            pp_shm_ring_commit(ring, pos, x->nbytes);
            wt[i].placement = PP_PLACE_SHM;
            wt[i].shm_pos = pos;
            shm_bytes += x->nbytes;
        } else if (pp_tp_bulk_lane(t, r, x->nbytes)) {
            /* another host: its bytes on the bulk lane, read into the final buffer */
            wt[i].placement = PP_PLACE_BULK;
            bulk_bytes += x->nbytes;
        } else {
            size_t fb = pp_tp_frame_size(t, p, x->nbytes);
            wt[i].nframes = (uint32_t)(x->nbytes / fb + (x->nbytes % fb != 0));
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
    env.sender_nonce = t->nonce;
    env.seq = p->seq + 1;
    env.ntensors = n;
    env.tensors = wt;
    env.text = "";
    env.inline_data = inline_data;
    env.inline_bytes = inline_bytes;
    env.shm_name = shm_bytes ? pp_shm_ring_name(ring) : "";
    pp_shm_ring *mring = nframes == 0 && shm_bytes == 0 && bulk_bytes == 0 ? pp_tp_msg_ring(t, r) : NULL;
    if (mring && pp_tp_send_by_ring(t, r, mring, &env)) {
        if (wt != wt_stack) free(wt);
        p->seq++;
        stat_add(&t->st.messages_sent, 1);
        stat_add(&t->st.bytes_sent, total);
        stat_add(&t->st.shm_bytes_sent, total);
        return PP_OK;
    }
    /* small (all inline) activations and gradients may be held back and
     * batched while this rank is ahead of the peer */
    int batchable = t->batching && nframes == 0 && shm_bytes == 0 && bulk_bytes == 0 &&
                    (key->kind == PP_MSG_ACTIVATION || key->kind == PP_MSG_GRADIENT);
    if (batchable && (p->obox_n || pp_tp_ahead(p)) && pp_tp_hold(t, r, &env)) {
        if (!pp_tp_ahead(p)) pp_tp_flush_one(t, r); /* libzmq caught up: the batch goes now */
        goto held;
    }
    if (p->obox_n) {
        /* full, or another kind of message: the batch goes first */
        zmq_msg_t mb;
        pp_status s = pp_tp_take_held(t, r, &mb);
        if (s == PP_OK) s = send_first(t, r, &mb, 0, &act);
        if (s != PP_OK) {
            if (wt != wt_stack) free(wt);
            return s;
        }
        if (batchable && pp_tp_ahead(p) && pp_tp_hold(t, r, &env)) goto held; /* the next batch */
    }
    zmq_msg_t m0;
    size_t len;
    pp_status s = batchable ? pp_tp_pack_counted(t, r, &env, &m0) : pp_envelope_pack_into(&env, alloc_zmq_msg, &m0, &len);
    if (s == PP_OK && batchable) {
        if (zmq_msg_send(&m0, p->push, ZMQ_DONTWAIT) >= 0) {
            if (wt != wt_stack) free(wt);
            p->seq++;
            stat_add(&t->st.messages_sent, 1);
            stat_add(&t->st.bytes_sent, total);
            return PP_OK;
        }
        if (zmq_errno() == EAGAIN && pp_tp_hold(t, r, &env)) { /* its queue is full: this rank is ahead */
            zmq_msg_close(&m0);
            goto held;
        }
    }
    if (wt != wt_stack) free(wt);
    PP_TRY(s);
    /* The bulk tensors' bytes go before their envelope: by the time the
     * receiver reads the envelope they are (mostly) in its socket already,
     * and it takes them without sleeping again. From here on the message's
     * sequence number is spent even if its envelope never goes: the
     * receiver reads past bytes whose envelope never came, and must not
     * take them for a later message's. */
    for (int i = 0; bulk_bytes && s == PP_OK && i < n; i++)
        if (place[i] == PP_PLACE_BULK) s = pp_tp_bulk_push(t, r, env.seq, (uint32_t)i, tensors[i], &act);
    int lane_failed = s != PP_OK && bulk_bytes && pp_tp_bulk_failed(t, r);
    if (s == PP_OK)
        s = nframes == 0 ? send_first(t, r, &m0, 0, &act) : send_data(t, r, &m0, n, tensors, place, nframes, &act);
    else
        zmq_msg_close(&m0);
    if (s != PP_OK) {
        if (bulk_bytes && p->seq < env.seq) p->seq = env.seq;
        /* the lane failed before the envelope went: nothing of the message
         * reached the peer's transport (bytes already on the lane are read
         * past, or go with the lane), so it goes again, in frames now */
        if (lane_failed) return pp_transport_sendv(t, key, n, names, tensors);
        return s;
    }
    if (nframes == 0) p->seq++; /* send_data counted it with its first frame */
    stat_add(&t->st.messages_sent, 1);
    stat_add(&t->st.bytes_sent, total);
    stat_add(&t->st.shm_bytes_sent, shm_bytes);
    return PP_OK;
held: /* in rank r's batch */
    if (wt != wt_stack) free(wt);
    p->seq++;
    stat_add(&t->st.messages_sent, 1);
    stat_add(&t->st.bytes_sent, total);
    return PP_OK;
}

pp_status pp_transport_send(pp_transport *t, const pp_transport_key *key, pp_tensor *tensor) {
    if (!key) return pp_error(PP_ERR_INVALID, "transport: no key");
    const char *names[1] = {key->name};
    pp_tensor *ts[1] = {tensor};
    return pp_transport_sendv(t, key, 1, names, ts);
}

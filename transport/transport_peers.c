/* The transport's peers: their sockets and monitors, the hellos that tell
 * same-host peers apart, and whether a peer can still be expected to
 * deliver. */
#include "transport_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A peer that has not answered our hello hears it again this often. */
#define HELLO_RETRY_MS 250

static atomic_uint monitor_counter;

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

/* ---- sockets ---- */

void pp_tp_peer_close(peer *p) {
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
    PP_TRY(pp_tp_common_sockopts(t, p->push, "send"));
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

pp_status pp_tp_connect_peer(pp_transport *t, int r, const char *ep) {
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
            pp_tp_peer_close(p);
            return s;
        }
    }
    if (zmq_connect(p->push, ep) != 0)
        return pp_error(PP_ERR_IO, "transport rank %d: cannot connect to rank %d at %s: %s", t->rank, r,
                        ep, zmq_strerror(zmq_errno()));
    set_state(p, PP_PEER_CONNECTING);
    return PP_OK;
}

pp_status pp_transport_connect_peer(pp_transport *t, int rank, const char *endpoint) {
    if (rank < 0 || rank >= t->nranks || rank == t->rank)
        return pp_error(PP_ERR_INVALID, "transport rank %d: cannot connect to rank %d", t->rank, rank);
    if (!endpoint_usable(endpoint))
        return pp_error(PP_ERR_INVALID, "transport rank %d: '%s' is not an endpoint to connect to",
                        t->rank, endpoint ? endpoint : "(null)");
    return pp_tp_connect_peer(t, rank, endpoint);
}

/* ---- monitors ---- */

static void peer_event(pp_transport *t, int r, uint16_t ev) {
    peer *p = &t->peers[r];
    pp_peer_state s = peer_state(p);
    switch (ev) {
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        if (s != PP_PEER_CLOSED) set_state(p, PP_PEER_UP);
        p->hello_sent = 0; /* maybe a new incarnation: tell it our host again */
        p->told = 0;       /* and our run id, on this connection */
        pp_debug("transport rank %d: connected to rank %d (%s)", t->rank, r, peer_ep(t, r));
        break;
    case ZMQ_EVENT_DISCONNECTED:
        if (s == PP_PEER_UP || s == PP_PEER_CONNECTING) {
            if (s == PP_PEER_UP) stat_add(&t->st.peer_failures, 1);
            set_state(p, PP_PEER_DOWN);
            p->down_since = now_ms();
            p->why = "connection lost (process exited, crashed, or silent past the heartbeat timeout)";
            /* whoever comes back says hello again and gets fresh rings */
            pp_tp_retire_ring(p);
            p->hello_seen = p->same_host = 0;
            p->told = 0;
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

int pp_tp_send_simple(pp_transport *t, int r, pp_msg_kind kind, const char *text) {
    peer *p = &t->peers[r];
    if (!p->push) return 0;
    pp_envelope env = {0};
    env.version = PP_PROTOCOL_VERSION;
    env.kind = kind;
    env.run_id = t->run_id;
    env.step = t->cur_step;
    env.src_rank = t->rank;
    env.sender_nonce = t->nonce;
    env.seq = ++p->seq;
    env.text = text;
    uint8_t buf[PP_ENVELOPE_MAX_TEXT + 128];
    size_t len;
    if (pp_envelope_pack(&env, buf, sizeof buf, &len) != PP_OK) return 0;
    return zmq_send(p->push, buf, len, ZMQ_DONTWAIT) >= 0;
}

/* Tells a newly connected peer our run id (if known), our nonce, its own
 * nonce back (proving we got its hello), and which host we are on, so that
 * it can send us large tensors through a shared-memory ring if it is on the
 * same one. */
void pp_tp_say_hello(pp_transport *t, int r, const char *word) {
    peer *p = &t->peers[r];
    if (!p->push || (!p->inproc && peer_state(p) != PP_PEER_UP)) return;
    int rings = t->shm_bytes && t->host_id[0];
    char text[HOST_ID_CHARS + 320];
    int n = snprintf(text, sizeof text, "%srun=%016" PRIx64 " nonce=%016" PRIx64 " echo=%016" PRIx64 " proc=%s"
                     CTL_HOST "%s%s%s", word, t->run_known ? t->run_id : 0, t->nonce, p->echo, t->proc,
                     rings ? t->host_id : "", rings && t->bell ? CTL_BELL : "",
                     rings && t->bell ? pp_doorbell_path(t->bell) : "");
    if (n < 0 || (size_t)n >= sizeof text || (size_t)n > PP_ENVELOPE_MAX_TEXT) return;
    int sent = pp_tp_send_simple(t, r, PP_MSG_CONTROL, text);
    if (!sent) return;
    if (strcmp(word, CTL_HELLO) == 0) {
        p->hello_sent = 1;
        p->hello_at = now_ms();
    }
    if (t->run_known && p->echo) p->told = 1;
}

int pp_tp_tell(pp_transport *t, int r) {
    peer *p = &t->peers[r];
    if (!p->told && t->run_known && p->echo) pp_tp_say_hello(t, r, CTL_HELLO_REPLY);
    return p->told;
}

void pp_tp_read_monitors(pp_transport *t) {
    int64_t now = -1;
    if (t->bound_port) pp_tp_conn_budget(t, now_ms());
    for (int r = 0; r < t->nranks; r++) {
        peer *p = &t->peers[r];
        if (!p->push) continue;
        if (p->mon) read_monitor(t, r);
        if (!p->hello_sent) {
            pp_tp_say_hello(t, r, CTL_HELLO);
        } else if (!p->verified) { /* it may have missed it, or a stranger overwrote our nonce there */
            if (now < 0) now = now_ms();
            if (now - p->hello_at >= HELLO_RETRY_MS) pp_tp_say_hello(t, r, CTL_HELLO);
        }
        pp_tp_tell(t, r);
    }
}

/* ---- the hello handshake ---- */

/* Reads "KEY=16 hex digits " at *s. */
static int hex_field(const char **s, const char *key, uint64_t *v) {
    size_t k = strlen(key);
    if (strncmp(*s, key, k) != 0) return 0;
    const char *p = *s + k;
    uint64_t x = 0;
    int i = 0;
    for (; i < 16; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return 0;
        x = x << 4 | (uint64_t)d;
    }
    if (p[16] != ' ') return 0;
    *v = x;
    *s = p + 17;
    return 1;
}

static void learned_run(pp_transport *t, int from) {
    pp_debug("transport rank %d: run id %016" PRIx64 " (from rank %d)", t->rank, t->run_id, from);
    for (int q = 0; q < t->nranks; q++)
        if (q != t->rank) pp_tp_tell(t, q); /* peers waiting to send to us can go on */
}

void pp_tp_handle_hello(pp_transport *t, int r, const pp_envelope *env, zmq_msg_t *m0, const char *addr) {
    peer *p = &t->peers[r];
    if (t->aborted) return; /* done with this run: a new process must not learn anything from it */
    int reply = strncmp(env->text, CTL_HELLO_REPLY, PREFIX_LEN(CTL_HELLO_REPLY)) == 0;
    const char *s = env->text + (reply ? PREFIX_LEN(CTL_HELLO_REPLY) : PREFIX_LEN(CTL_HELLO));
    uint64_t run, nonce, echo;
    if (!hex_field(&s, "run=", &run) || !hex_field(&s, "nonce=", &nonce) || !hex_field(&s, "echo=", &echo) ||
        strncmp(s, "proc=", 5) != 0) {
        pp_tp_drop(t, m0, NULL, "claims rank %d: malformed hello '%s'", r, env->text);
        return;
    }
    const char *proc = s + 5, *host = strstr(proc, CTL_HOST);
    size_t proc_len = host ? (size_t)(host - proc) : 0;
    if (!host || !nonce || proc_len >= sizeof p->proc) {
        pp_tp_drop(t, m0, NULL, "claims rank %d: malformed hello '%s'", r, env->text);
        return;
    }
    if (p->verified && p->echo && nonce != p->echo && echo == t->nonce) {
        /* the process bound at rank r's endpoint (it got our hello) is not
         * the one this run exchanged with: r restarted, and what it held is
         * gone (its run id may be new too: checked before that) */
        if (!p->restarted) {
            p->restarted = 1;
            if (peer_state(p) != PP_PEER_CLOSED) stat_add(&t->st.peer_failures, 1);
            set_state(p, PP_PEER_CLOSED);
            p->why = "it restarted: a new process answered at its endpoint";
            pp_info("transport rank %d: rank %d (%s) restarted: a new process answered at its endpoint", t->rank,
                    r, peer_ep(t, r));
        }
        pp_tp_drop(t, m0, &t->st.dropped_foreign, "claims rank %d: a new process at its endpoint (it restarted)", r);
        return;
    }
    if ((run && t->run_known && run != t->run_id) || (env->run_id && env->run_id != run)) {
        p->foreign_run = run ? run : env->run_id;
        pp_tp_drop(t, m0, &t->st.dropped_foreign, "claims rank %d: a hello of run id %016" PRIx64
                   ", this run is %016" PRIx64 " (another run using this endpoint?)", r, p->foreign_run,
                   t->run_known ? t->run_id : 0);
        if (!reply && !p->verified) {
            /* Echo its nonce once, changing nothing here: if it is an older
             * process of this run that knew an earlier incarnation of this
             * rank, that proves to it that this rank restarted. */
            uint64_t echo_was = p->echo;
            int told_was = p->told;
            p->echo = nonce;
            pp_tp_say_hello(t, r, CTL_HELLO_REPLY);
            p->echo = echo_was;
            p->told = told_was;
        }
        return;
    }
    if (echo == t->nonce) {
        /* only the process bound at rank r's endpoint got our nonce: this is
         * rank r, and its address is the one to accept messages from */
        if (!p->verified || !same_addr(p->addr, addr)) {
            char *copy = addr ? strdup(addr) : NULL;
            if (addr && !copy) return;
            free(p->addr);
            p->addr = copy;
            pp_debug("transport rank %d: rank %d (%s) answered our hello from '%s'", t->rank, r,
                     peer_ep(t, r), addr ? addr : "(inproc)");
        }
        p->verified = 1;
        p->foreign_run = 0;
        if (run && !t->run_known) {
            t->run_id = run;
            t->run_known = 1;
            learned_run(t, r);
        }
    } else if (p->verified && !(addr ? p->addr && strcmp(p->addr, addr) == 0 : !p->addr)) {
        /* not exactly the address rank r answered from: a stranger, or a
         * new incarnation of r, which answers our next hello on reconnect
         * (a hello read after its connection closed shows only the IP: it
         * must not replace the nonce r proved) */
        pp_tp_drop(t, m0, &t->st.dropped_foreign, "claims rank %d: a hello from '%s', but rank %d answered "
                   "from '%s'", r, addr ? addr : "(inproc)", r, p->addr ? p->addr : "(inproc)");
        return;
    } else if (p->verified && nonce != p->echo) {
        /* from r's address, but a nonce r never proved and no echo of ours:
         * whoever took that address after r's connection closed (a
         * restarted r echoes our nonce, above) */
        pp_tp_drop(t, m0, &t->st.dropped_foreign, "claims rank %d: a hello with another nonce that does not "
                   "echo this rank's", r);
        return;
    }
    if (nonce != p->echo) {
        p->echo = nonce;
        p->told = 0;
    }
    memcpy(p->proc, proc, proc_len);
    p->proc[proc_len] = 0;
    const char *id = host + PREFIX_LEN(CTL_HOST);
    const char *bell = strstr(id, CTL_BELL);
    size_t id_len = bell ? (size_t)(bell - id) : strlen(id);
    p->hello_seen = 1;
    p->same_host = t->shm_bytes && t->host_id[0] && id_len && strlen(t->host_id) == id_len &&
                   strncmp(id, t->host_id, id_len) == 0;
    if (p->bell_fd >= 0) close(p->bell_fd);
    p->bell_fd = p->same_host && bell ? pp_doorbell_open_peer(bell + PREFIX_LEN(CTL_BELL)) : -1;
    /* answer, so that after a reconnect on either side both know */
    if (!reply) pp_tp_say_hello(t, r, CTL_HELLO_REPLY);
    else pp_tp_tell(t, r);
    pp_debug("transport rank %d: rank %d (%s) is on %s host", t->rank, r, peer_ep(t, r),
             p->same_host ? "this" : "another");
}

int pp_transport_peer_ready(const pp_transport *t, int rank) {
    if (rank < 0 || rank >= t->nranks || rank == t->rank) return 0;
    const peer *p = &t->peers[rank];
    return t->run_known && p->verified && p->told;
}

/* Why peer r is not ready, for errors. */
static const char *not_ready_why(const pp_transport *t, int r, char *buf, size_t cap) {
    const peer *p = &t->peers[r];
    pp_peer_state ps = peer_state(p);
    if (ps == PP_PEER_CONNECTING && !p->inproc) snprintf(buf, cap, "it has not connected");
    else if (p->foreign_run)
        snprintf(buf, cap, "a hello for it carried run id %016" PRIx64 ", this run is %016" PRIx64
                 ": is it another run's rank?", p->foreign_run, t->run_known ? t->run_id : 0);
    else if (!t->run_known)
        snprintf(buf, cap, "this rank has not learned the run id yet: no rank that knows it (rank 0 first) "
                 "answered its hello");
    else if (!p->echo) snprintf(buf, cap, "it has not said hello: does it know this rank's endpoint?");
    else if (!p->told) snprintf(buf, cap, "this rank could not answer its hello");
    else if (!p->verified) snprintf(buf, cap, "it has not answered this rank's hello");
    else snprintf(buf, cap, "%s", pp_peer_state_name(ps));
    return buf;
}

pp_status pp_tp_await_ready(pp_transport *t, int r, const action *act) {
    if (t->peers[r].told) return PP_OK;
    int64_t now = now_ms(), deadline = now + t->timeout_ms;
    stat_add(&t->st.retries, 1);
    for (;;) {
        pp_tp_read_monitors(t);
        pp_tp_drain(t, NULL, NULL);
        if (t->peers[r].told) return PP_OK;
        int64_t wake = deadline;
        if (t->aborted) return pp_tp_abort_error(t);
        PP_TRY(pp_tp_check_peer(t, r, act, now, &wake));
        if (now >= deadline) {
            stat_add(&t->st.timeouts, 1);
            char doing[ACTION_CHARS], why[256], note[256];
            return pp_error(PP_ERR_TIMEOUT, "transport rank %d: %s: rank %d (%s) did not complete the hello "
                            "handshake within %d ms (%s)%s", t->rank, pp_tp_action_str(act, doing, sizeof doing),
                            r, peer_ep(t, r), t->timeout_ms, not_ready_why(t, r, why, sizeof why),
                            pp_tp_conn_note(t, note, sizeof note));
        }
        int64_t until = now + t->grace_ms < wake ? now + t->grace_ms : wake;
        if (until > now + HELLO_RETRY_MS) until = now + HELLO_RETRY_MS;
        pp_tp_wait_events(t, until - now, NULL);
        now = now_ms();
    }
}

/* ---- liveness ---- */

pp_status pp_transport_wait_peers(pp_transport *t, int timeout_ms) {
    int64_t deadline = now_ms() + (timeout_ms < 0 ? t->timeout_ms : timeout_ms);
    for (;;) {
        pp_tp_read_monitors(t);
        pp_tp_drain(t, NULL, NULL);
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
        pp_tp_wait_events(t, deadline - now, NULL);
    }
}

const char *pp_tp_action_str(const action *a, char *buf, size_t cap) {
    char k[KEY_CHARS];
    pp_mbox_key_str(a->key, k, sizeof k);
    snprintf(buf, cap, "%s %s%s", a->sending ? "sending" : "waiting for", k,
             a->ntensors > 1 ? " (and more)" : "");
    return buf;
}

/* PP_OK while peer r can still be expected to deliver; an error naming it
 * once it is gone (disconnected for longer than the grace period, refused
 * us when sending, or closed). *wake is lowered to when that would change. */
pp_status pp_tp_check_peer(pp_transport *t, int r, const action *act, int64_t now, int64_t *wake) {
    if (r == t->rank) return PP_OK;
    peer *p = &t->peers[r];
    pp_peer_state s = peer_state(p);
    int sending = act->sending;
    char doing[ACTION_CHARS];
    if (s == PP_PEER_CLOSED || s == PP_PEER_REJECTED || s == PP_PEER_DOWN)
        pp_tp_action_str(act, doing, sizeof doing);
    if (s == PP_PEER_CLOSED && p->restarted)
        return pp_error(PP_ERR_PEER, "transport rank %d: %s: rank %d (%s): %s", t->rank, doing, r, peer_ep(t, r),
                        p->why);
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
int pp_tp_peer_looks_gone(const pp_transport *t, int r, int64_t now) {
    if (t->aborted) return 1;
    if (r == t->rank) return 0;
    const peer *p = &t->peers[r];
    pp_peer_state s = peer_state(p);
    return s == PP_PEER_CLOSED || (s == PP_PEER_DOWN && now - p->down_since >= t->grace_ms);
}

pp_peer_state pp_transport_peer_state(const pp_transport *t, int rank) {
    if (rank < 0 || rank >= t->nranks) return PP_PEER_UNKNOWN;
    return peer_state(&t->peers[rank]);
}

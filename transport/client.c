/* A serving pipeline's client (pippin/client.h): a ZeroMQ DEALER socket to
 * the front endpoint's ROUTER; responses are matched to requests by id, and
 * those that arrive while another is waited for are kept. */
#include "pippin/client.h"

#include <stdlib.h>
#include <string.h>

#include "pippin/transport.h"
#include <time.h>
#include <zmq.h>

#include "serve_wire.h"
#include "status_internal.h"

#define DEFAULT_MAX_RESPONSE ((int64_t)1 << 30)
#define MAX_KEPT 4096 /* responses kept for later waits (past it the oldest is dropped), and cancelled ids */

struct pp_client {
    void *ctx, *sock;
    void *monitor; /* the DEALER's refused handshakes (a PAIR), NULL if it could not be made */
    char refused[160]; /* why the last handshake was refused, "" if none was */
    char endpoint[256];
    uint64_t next_id;
    size_t max_response;
    int curve; /* a CURVE client: a refused key looks like silence */
    pp_response **kept; /* arrived, not yet waited for */
    size_t n_kept;
    uint64_t *cancelled;
    size_t n_cancelled;
};

void pp_client_options_init(pp_client_options *o) { memset(o, 0, sizeof *o); }

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Makes the DEALER a CURVE client when o gives the keys. */
static pp_status curve_options(pp_client *c, const pp_client_options *o) {
    if (!o || (!o->server_key && !o->public_key && !o->secret_key)) return PP_OK;
    if (!o->server_key || !o->public_key || !o->secret_key)
        return pp_error(PP_ERR_INVALID, "client: CURVE needs server_key, public_key and secret_key (all three)");
    const char *names[3] = {"server_key", "public_key", "secret_key"};
    const char *keys[3] = {o->server_key, o->public_key, o->secret_key};
    for (int i = 0; i < 3; i++)
        if (!pp_curve_key_valid(keys[i]))
            return pp_error(PP_ERR_INVALID, "client: %s is not a CURVE key (40 characters of Z85)", names[i]);
    if (!zmq_has("curve")) return pp_error(PP_ERR_UNSUPPORTED, "client: CURVE requested but libzmq lacks it");
    if (!c->sock) return PP_OK; /* reported by the caller */
    if (zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, o->server_key, PP_CURVE_KEY_CHARS) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, o->public_key, PP_CURVE_KEY_CHARS) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, o->secret_key, PP_CURVE_KEY_CHARS) != 0)
        return pp_error(PP_ERR_IO, "client: CURVE options: %s", zmq_strerror(zmq_errno()));
    c->curve = 1;
    return PP_OK;
}

/* A front that refuses this client's handshake (a CURVE front and a
 * plaintext client, or a key not in its list) gives no error on the
 * socket: the request goes nowhere or waits. The socket monitor tells, so
 * the error can say so. Only diagnostics: without it the client still works. */
static void watch_handshakes(pp_client *c) {
    char addr[64];
    snprintf(addr, sizeof addr, "inproc://pippin-client-monitor-%p", (void *)c);
    if (zmq_socket_monitor(c->sock, addr,
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0)
        return;
    int zero = 0;
    c->monitor = zmq_socket(c->ctx, ZMQ_PAIR);
    if (!c->monitor || zmq_setsockopt(c->monitor, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_connect(c->monitor, addr) != 0) {
        if (c->monitor) zmq_close(c->monitor);
        c->monitor = NULL;
        (void)zmq_socket_monitor(c->sock, NULL, 0);
    }
}

/* Reads the monitor's events so far into c->refused. Each event is two
 * frames: 2 bytes of event and 4 of value, then the endpoint. */
static void read_handshake_events(pp_client *c) {
    while (c->monitor) {
        zmq_msg_t head, where;
        zmq_msg_init(&head);
        if (zmq_msg_recv(&head, c->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&head);
            return;
        }
        uint16_t event = 0;
        if (zmq_msg_size(&head) >= 2) memcpy(&event, zmq_msg_data(&head), 2);
        int more = zmq_msg_more(&head);
        zmq_msg_close(&head);
        if (more) { /* the endpoint: not needed, c->endpoint names it */
            zmq_msg_init(&where);
            (void)zmq_msg_recv(&where, c->monitor, ZMQ_DONTWAIT);
            zmq_msg_close(&where);
        }
        const char *why = event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH       ? "its authentication refused this client's key"
                          : event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "a protocol error"
                                                                         : "no detail given";
        snprintf(c->refused, sizeof c->refused, "%s%s", why,
                 c->curve || event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                     ? ""
                     : "; a CURVE front refuses a plaintext client, if this is one");
    }
}

/* " (the service refused ...)" when a handshake was refused, else "". */
static const char *refusal(pp_client *c, char *buf, size_t size) {
    read_handshake_events(c);
    if (!c->refused[0]) return "";
    snprintf(buf, size, " (the service refused this client's handshake: %s)", c->refused);
    return buf;
}

pp_status pp_client_connect(const char *endpoint, const pp_client_options *o, pp_client **out) {
    *out = NULL;
    if (!endpoint || (strncmp(endpoint, "tcp://", 6) != 0 && strncmp(endpoint, "ipc://", 6) != 0))
        return pp_error(PP_ERR_INVALID, "client: '%s' is not a tcp:// or ipc:// endpoint", endpoint ? endpoint : "(null)");
    pp_client *c = calloc(1, sizeof *c);
    if (!c) return pp_error(PP_ERR_NOMEM, "out of memory");
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    c->max_response = (size_t)(o && o->max_response_bytes > 0 ? o->max_response_bytes : DEFAULT_MAX_RESPONSE);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->next_id = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec; /* distinct ids across reconnects */
    if (!c->next_id) c->next_id = 1;
    c->ctx = zmq_ctx_new();
    c->sock = c->ctx ? zmq_socket(c->ctx, ZMQ_DEALER) : NULL;
    int zero = 0;
    int64_t max = (int64_t)c->max_response + 4096;
    pp_status ks = curve_options(c, o);
    if (ks != PP_OK) {
        pp_client_close(c);
        return ks;
    }
    if (c->sock) watch_handshakes(c); /* before the connect: libzmq keeps no events from before a monitor */
    if (!c->sock || zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &max, sizeof max) != 0 || zmq_connect(c->sock, endpoint) != 0) {
        pp_status s = pp_error(PP_ERR_IO, "client: cannot connect to %s: %s", endpoint, zmq_strerror(zmq_errno()));
        pp_client_close(c);
        return s;
    }
    *out = c;
    return PP_OK;
}

/* How long a send waits for the DEALER to have somewhere to queue a
 * request. It has none once a handshake was refused (a CURVE front and a
 * plaintext or unlisted client: libzmq gives the connection up), or while
 * its queue is full (too many requests); a second is enough for the
 * queue to move, and says "nobody will take it" soon after a refusal. */
#define SEND_WAIT_MS 1000

static const char *curve_hint(const pp_client *c) {
    return c->curve ? " (CURVE: a front that refuses this client's key, or whose key is not server_key, never answers)"
                    : "";
}

static pp_status send_request_within(pp_client *c, const pp_serve_request *r, int wait_ms) {
    void *buf;
    size_t n;
    PP_TRY(pp_serve_request_encode(r, &buf, &n));
    int rc = zmq_send(c->sock, buf, n, ZMQ_DONTWAIT);
    int64_t until = now_ms() + wait_ms;
    while (rc < 0 && zmq_errno() == EAGAIN) {
        int64_t left = until - now_ms(); /* read once: a negative poll timeout waits for ever */
        if (left <= 0) break;
        zmq_pollitem_t item = {c->sock, 0, ZMQ_POLLOUT, 0};
        if (zmq_poll(&item, 1, (long)left) < 0 && zmq_errno() != EINTR) break;
        rc = zmq_send(c->sock, buf, n, ZMQ_DONTWAIT);
    }
    int err = zmq_errno();
    free(buf);
    char why[256];
    if (rc < 0)
        return err == EAGAIN ? pp_error(PP_ERR_IO,
                                        "client: sending to %s: nothing took the request within %d ms%s (is the "
                                        "service there? too many requests queued?)%s",
                                        c->endpoint, wait_ms, refusal(c, why, sizeof why), curve_hint(c))
                             : pp_error(PP_ERR_IO, "client: sending to %s: %s", c->endpoint, zmq_strerror(err));
    return PP_OK;
}

static pp_status send_request(pp_client *c, const pp_serve_request *r) {
    return send_request_within(c, r, SEND_WAIT_MS);
}

pp_status pp_client_submit_session(pp_client *c, const char *session, int n, const char *const *names,
                                   pp_tensor *const *inputs, int n_out, const char *const *outputs, uint32_t timeout_ms,
                                   uint64_t *id) {
    if (n < 0 || n > PP_SERVE_MAX_TENSORS || n_out < 0 || n_out > PP_SERVE_MAX_TENSORS)
        return pp_error(PP_ERR_INVALID, "client: %d inputs, %d outputs (at most %d each)", n, n_out, PP_SERVE_MAX_TENSORS);
    pp_serve_request r = {0};
    r.id = c->next_id++;
    r.kind = PP_SERVE_KIND_INFER;
    r.n_inputs = n;
    r.names = (char **)names;
    r.inputs = (pp_tensor **)inputs;
    r.n_outputs = n_out;
    r.outputs = (char **)outputs;
    r.timeout_ms = timeout_ms;
    r.session = (char *)session;
    PP_TRY(send_request(c, &r));
    *id = r.id;
    return PP_OK;
}

pp_status pp_client_submit(pp_client *c, int n, const char *const *names, pp_tensor *const *inputs, int n_out,
                           const char *const *outputs, uint32_t timeout_ms, uint64_t *id) {
    return pp_client_submit_session(c, NULL, n, names, inputs, n_out, outputs, timeout_ms, id);
}

void pp_generate_options_init(pp_generate_options *o) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 16;
}

pp_status pp_client_submit_generate(pp_client *c, const pp_tensor *tokens, const char *text,
                                    const pp_generate_options *o, uint64_t *id) {
    if (!tokens == !text) return pp_error(PP_ERR_INVALID, "client: a generation needs prompt tokens or text (one of them)");
    if (o->n_stop < 0 || o->n_stop > PP_SERVE_MAX_STOP)
        return pp_error(PP_ERR_INVALID, "client: %d stop tokens (at most %d)", o->n_stop, PP_SERVE_MAX_STOP);
    pp_serve_request r = {0};
    const char *name = "tokens";
    r.id = c->next_id++;
    r.kind = PP_SERVE_KIND_GENERATE;
    r.n_inputs = tokens ? 1 : 0;
    r.names = (char **)&name;
    r.inputs = (pp_tensor **)&tokens;
    r.text = (char *)text;
    r.timeout_ms = o->timeout_ms;
    r.session = (char *)o->session;
    r.max_tokens = o->max_tokens;
    r.temperature = o->temperature;
    r.top_k = o->top_k;
    r.seed = o->seed;
    r.n_stop = o->n_stop;
    r.stop = (int64_t *)o->stop;
    PP_TRY(send_request(c, &r));
    *id = r.id;
    return PP_OK;
}

pp_status pp_client_end_session(pp_client *c, const char *session, uint64_t *id) {
    if (!session || !session[0]) return pp_error(PP_ERR_INVALID, "client: ending a session needs its name");
    pp_serve_request r = {0};
    r.id = c->next_id++;
    r.kind = PP_SERVE_KIND_END_SESSION;
    r.session = (char *)session;
    PP_TRY(send_request(c, &r));
    *id = r.id;
    return PP_OK;
}

pp_status pp_client_submit_stats(pp_client *c, uint64_t *id) {
    pp_serve_request r = {0};
    r.id = c->next_id++;
    r.kind = PP_SERVE_KIND_STATS;
    PP_TRY(send_request(c, &r));
    *id = r.id;
    return PP_OK;
}

static int cancelled(pp_client *c, uint64_t id, int forget) {
    for (size_t i = 0; i < c->n_cancelled; i++)
        if (c->cancelled[i] == id) {
            if (forget) c->cancelled[i] = c->cancelled[--c->n_cancelled];
            return 1;
        }
    return 0;
}

void pp_client_cancel(pp_client *c, uint64_t id) {
    pp_serve_request stop = {0}; /* a generation stops; anything else runs to its end */
    stop.id = id;
    stop.kind = PP_SERVE_KIND_CANCEL;
    (void)send_request_within(c, &stop, 0); /* never waits: a cancel is best effort */
    int last_kept = 0; /* the final message of a stream is here: nothing more comes */
    for (size_t i = 0; i < c->n_kept;) {
        if (c->kept[i]->id != id) {
            i++;
            continue;
        }
        last_kept |= !c->kept[i]->more;
        pp_response_free(c->kept[i]);
        c->kept[i] = c->kept[--c->n_kept];
    }
    if (last_kept) return;
    if (c->n_cancelled == MAX_KEPT) { /* the oldest cancelled ones will not come any more */
        memmove(c->cancelled, c->cancelled + 1, (c->n_cancelled - 1) * sizeof *c->cancelled);
        c->n_cancelled--;
    }
    uint64_t *grown = realloc(c->cancelled, (c->n_cancelled + 1) * sizeof *grown);
    if (!grown) return;
    c->cancelled = grown;
    c->cancelled[c->n_cancelled++] = id;
}

/* A kept response for id (0: any), taken out. */
static pp_response *take_kept(pp_client *c, uint64_t id) {
    for (size_t i = 0; i < c->n_kept; i++)
        if (!id || c->kept[i]->id == id) {
            pp_response *r = c->kept[i];
            memmove(c->kept + i, c->kept + i + 1, (c->n_kept - i - 1) * sizeof *c->kept);
            c->n_kept--;
            return r;
        }
    return NULL;
}

pp_status pp_client_wait(pp_client *c, uint64_t id, int timeout_ms, pp_response **out) {
    *out = take_kept(c, id);
    if (*out) return PP_OK;
    int64_t deadline = now_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
    for (;;) {
        int64_t left = deadline - now_ms();
        zmq_pollitem_t it = {c->sock, 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll(&it, 1, left > 0 ? (long)left : 0);
        if (rc < 0 && zmq_errno() != EINTR)
            return pp_error(PP_ERR_IO, "client: waiting on %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
        if (rc <= 0) {
            if (now_ms() >= deadline) {
                char why[256];
                return pp_error(PP_ERR_TIMEOUT, "client: no response from %s within %d ms%s%s%s", c->endpoint,
                                timeout_ms, id ? "" : " (to any request)", refusal(c, why, sizeof why),
                                curve_hint(c));
            }
            continue;
        }
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            continue;
        }
        int more = zmq_msg_more(&m);
        pp_response *r = NULL;
        pp_status s = more ? pp_error(PP_ERR_PARSE, "a response of several frames")
                           : pp_serve_response_decode(zmq_msg_data(&m), zmq_msg_size(&m), c->max_response, &r);
        zmq_msg_close(&m);
        while (more) { /* drop the rest of a malformed one */
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, c->sock, 0) < 0) more = 0;
            else more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (s != PP_OK) return pp_error_context(s, "client: a response from %s", c->endpoint);
        if (cancelled(c, r->id, !r->more)) { /* a stream's messages until its last */
            pp_response_free(r);
            continue;
        }
        if (!id || r->id == id) {
            *out = r;
            return PP_OK;
        }
        if (c->n_kept == MAX_KEPT) { /* nobody waits for these: drop the oldest */
            pp_response_free(c->kept[0]);
            memmove(c->kept, c->kept + 1, (c->n_kept - 1) * sizeof *c->kept);
            c->n_kept--;
        }
        pp_response **grown = realloc(c->kept, (c->n_kept + 1) * sizeof *grown);
        if (!grown) {
            pp_response_free(r);
            return pp_error(PP_ERR_NOMEM, "out of memory");
        }
        c->kept = grown;
        c->kept[c->n_kept++] = r;
    }
}

void pp_client_close(pp_client *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_kept; i++) pp_response_free(c->kept[i]);
    free(c->kept);
    free(c->cancelled);
    if (c->monitor) {
        (void)zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->monitor);
    }
    if (c->sock) zmq_close(c->sock);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c);
}

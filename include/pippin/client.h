/* A client of a serving pipeline (`mode: serve`, docs/serving.md): sends
 * requests to its front endpoint and takes the responses, many in flight at
 * once, each matched by its id. Every call has a deadline.
 *
 *     pp_client *c;
 *     pp_client_connect("tcp://host:5600", NULL, &c);
 *     uint64_t id;
 *     pp_client_submit(c, 1, (const char *[]){"idx"}, &tokens, 0, NULL, 0, &id);
 *     pp_response *r;
 *     if (pp_client_wait(c, id, 5000, &r) == PP_OK && r->code == PP_SERVE_OK) use(r->outputs[0]);
 *     pp_response_free(r);
 *     pp_client_close(c);
 *
 * Thread safety: a client belongs to one thread at a time (a ZeroMQ socket);
 * use one client per thread. */
#ifndef PIPPIN_CLIENT_H
#define PIPPIN_CLIENT_H

#include <stdint.h>

#include "pippin/export.h"
#include "pippin/status.h"
#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Response codes (the wire's serve.Code). */
typedef enum pp_serve_code {
    PP_SERVE_OK = 0,
    PP_SERVE_BAD_REQUEST = 1, /* unknown input, wrong dtype or shape, too large, malformed */
    PP_SERVE_BUSY = 2,        /* the service's queue is full: try again later */
    PP_SERVE_TIMEOUT = 3,     /* not answered within the request's timeout */
    PP_SERVE_FAILED = 4,      /* a stage failed on it (the error names the stage and rank) */
    PP_SERVE_UNAVAILABLE = 5, /* shutting down, or a stage is gone */
    PP_SERVE_SESSION_LOST = 6 /* the session's state is gone (expired, evicted, a stage failed): start a new one */
} pp_serve_code;

/* "ok", "bad request", ... */
PP_API const char *pp_serve_code_name(int code);

typedef struct pp_response {
    uint64_t id;
    int code;              /* pp_serve_code */
    char *error;           /* "" when code is PP_SERVE_OK */
    int n_outputs;
    char **names;
    pp_tensor **outputs;
    char *stats;           /* a stats request's JSON, else NULL */
    /* a generation's messages (pp_client_submit_generate) */
    int n_tokens;
    int64_t *tokens;       /* the tokens produced since the previous message */
    char *text;            /* those tokens as text when the service has a vocabulary, else NULL */
    int more;              /* more messages follow for this id: wait for it again */
} pp_response;

PP_API void pp_response_free(pp_response *r);

typedef struct pp_client_options {
    int64_t max_response_bytes; /* larger responses are refused; 0: 1 GiB */
    /* CURVE, for a front whose config has security: (docs/serving.md
     * "Security"): each a 40-character Z85 key, as in the files of `pippin
     * keygen` (pp_curve_read_key in pippin/transport.h reads one). server_key
     * is the front rank's public key (its .pub); public_key/secret_key are
     * this client's own pair, whose public key must be in the service's
     * serve.client_keys. All three or none (NULL: plaintext). A front that
     * refuses the key (or a plaintext client of a CURVE front) never answers:
     * the wait ends with PP_ERR_TIMEOUT. */
    const char *server_key;
    const char *public_key;
    const char *secret_key;
} pp_client_options;

PP_API void pp_client_options_init(pp_client_options *o);

typedef struct pp_client pp_client;

/* Connects (lazily: the service may start later) to a front endpoint
 * (tcp:// or ipc://). */
PP_API pp_status pp_client_connect(const char *endpoint, const pp_client_options *o, pp_client **out);

/* Sends a request without waiting for its answer: n named inputs, the
 * outputs wanted (n_out 0: all), a timeout the service applies (0: its
 * default). *id identifies the response. It waits only when the socket has
 * nowhere to queue the request (no connection yet or any more: a service
 * restarting, a CURVE front that refused this client; or too many requests
 * queued), for up to a second, then fails saying why (a refused handshake
 * is named). */
PP_API pp_status pp_client_submit(pp_client *c, int n, const char *const *names, pp_tensor *const *inputs, int n_out,
                                  const char *const *outputs, uint32_t timeout_ms, uint64_t *id);

/* The same with a session: the model's state (a KV cache: present.X feeding
 * past_key_values.X) stays on the stages between requests of one session
 * (docs/serving.md). session NULL or "": none. */
PP_API pp_status pp_client_submit_session(pp_client *c, const char *session, int n, const char *const *names,
                                          pp_tensor *const *inputs, int n_out, const char *const *outputs,
                                          uint32_t timeout_ms, uint64_t *id);

typedef struct pp_generate_options {
    uint32_t max_tokens;   /* tokens to produce (>= 1) */
    float temperature;     /* 0: greedy (the most likely token) */
    uint32_t top_k;        /* sample among the k most likely; 0: all */
    uint64_t seed;         /* the sampler's seed: the same seed gives the same tokens */
    int n_stop;
    const int64_t *stop;   /* tokens that end the generation (the stop token is produced) */
    const char *session;   /* NULL or "": a one-off; else the conversation continues there */
    uint32_t timeout_ms;   /* per produced token; 0: the service's default */
} pp_generate_options;

PP_API void pp_generate_options_init(pp_generate_options *o);

/* Starts a generation from prompt tokens (int64 [1, T]) or, when tokens is
 * NULL, from text in the service's vocabulary. The service streams the
 * tokens: pp_client_wait(c, id, ...) returns one message per token (or
 * more), ->more set on all but the last. */
PP_API pp_status pp_client_submit_generate(pp_client *c, const pp_tensor *tokens, const char *text,
                                           const pp_generate_options *o, uint64_t *id);

/* Drops a session and its state on every stage (answered like a request). */
PP_API pp_status pp_client_end_session(pp_client *c, const char *session, uint64_t *id);

/* Asks for the service's counters (pp_client_wait gives them in ->stats). */
PP_API pp_status pp_client_submit_stats(pp_client *c, uint64_t *id);

/* Waits up to timeout_ms for the response to id (0: to any request), which
 * the caller frees. PP_ERR_TIMEOUT when none came in time. A response that
 * is not the one waited for is kept for a later wait. */
PP_API pp_status pp_client_wait(pp_client *c, uint64_t id, int timeout_ms, pp_response **out);

/* Forgets request id: its responses, when they come, are dropped; a
 * generation is told to stop. */
PP_API void pp_client_cancel(pp_client *c, uint64_t id);

PP_API void pp_client_close(pp_client *c);

#ifdef __cplusplus
}
#endif
#endif

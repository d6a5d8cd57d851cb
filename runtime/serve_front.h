/* Internal: the serving front endpoint (serve.h, docs/serving.md). A ZeroMQ
 * ROUTER at serve.endpoint and a thread of its own that decodes clients'
 * requests, answers alone what needs no pipeline (stats, malformed requests,
 * a full queue, a service that is degraded or closing) and hands the rest to
 * the front rank's thread through an inproc pair, which hands each answer
 * back the same way. It outlives the pipeline runs of a rejoin: while the
 * ranks wait for a restarted one, clients keep their endpoint and are told
 * the service is degraded. Counters live here, across runs. */
#ifndef PIPPIN_RUNTIME_SERVE_FRONT_H
#define PIPPIN_RUNTIME_SERVE_FRONT_H

#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "pippin/config.h"
#include "serve_curve.h"
#include "serve_wire.h"

#define PP_SERVE_LATENCIES 1024

struct pp_serve_session;

/* A request on its way through the service. */
typedef struct pp_serve_job {
    zmq_msg_t who; /* the client's routing id */
    pp_serve_request req;
    int64_t rows;
    double arrived, deadline; /* monotonic ms */
    int solo;                 /* runs in a batch of its own */
    pp_response *resp;
    int partial;              /* a message of a stream, not the request's last */
    struct pp_serve_session *sess; /* the session its state lives in, or NULL */
    /* a generation: the tokens so far (prompt, then produced) */
    int64_t *toks;
    int n_toks, cap_toks, n_fed, feeding;
    uint32_t produced;
    uint64_t rng;
    int cancelled;
    int took_next;            /* its prompt starts with its session's pending token */
} pp_serve_job;

void pp_serve_job_free(pp_serve_job *j);

typedef struct pp_serve_stats {
    atomic_llong requests, ok, bad, busy, timeouts, failed, unavailable, batches, batch_rows, tokens, lost, rejoins;
    atomic_int in_system; /* accepted and not yet answered */
    atomic_int sessions;
    atomic_llong state_bytes, busy_us; /* the front rank's: session state kept; time in its stages */
    atomic_int pending, inflight;      /* requests waiting for the pipeline; batches in it */
    int n_ranks;
    struct pp_serve_rank_stats {       /* per rank, as it last reported (serve.c) */
        atomic_llong compute_us, batches, state_bytes, sessions;
    } *ranks;
    pthread_mutex_t lock;
    double latency[PP_SERVE_LATENCIES];
    long n_latency;
} pp_serve_stats;

enum { PP_FRONT_SERVING = 0, PP_FRONT_DEGRADED = 1, PP_FRONT_CLOSING = 2 };

typedef struct pp_serve_front {
    const pp_config *c;
    void *zctx, *router;
    void *pair_front; /* the front thread's end */
    void *pair_worker; /* the rank thread's end: jobs in, answered jobs out */
    pp_serve_curve *curve; /* the client allow-list, with security */
    pthread_t thread;
    int started;
    atomic_int stop, state;
    atomic_int cancels;   /* cancels on their way to the rank thread (at most serve.max_queue) */
    pthread_mutex_t lock; /* why */
    char why[1024];       /* degraded: what happened */
    pp_serve_stats st;
    char pair_ep[64];
    /* the rank thread's: sessions lost, to tell their next request (kept
     * across the runs of a rejoin) */
    struct {
        char *name, *why;
    } lost[256];
    int64_t lost_next;
} pp_serve_front;

/* Binds serve.endpoint (rank: this rank, for its CURVE key) and starts the
 * front thread, answering "unavailable" until pp_serve_front_set_state says
 * serving. */
pp_status pp_serve_front_open(const pp_config *c, int rank, pp_serve_front **out);
/* Answers what is still queued "unavailable", stops the thread, unbinds. */
void pp_serve_front_close(pp_serve_front *f);

/* Serving, degraded (why: what the clients are told) or closing. */
void pp_serve_front_set_state(pp_serve_front *f, int state, const char *why);

/* The counters as JSON (malloc'd). */
char *pp_serve_front_stats(pp_serve_front *f);

/* The rank thread's side: the next job (NULL: none waiting), and a job
 * answered (its resp set; the front thread sends and frees it). */
pp_serve_job *pp_serve_front_take(pp_serve_front *f);
void pp_serve_front_answer(pp_serve_front *f, pp_serve_job *j);

#endif

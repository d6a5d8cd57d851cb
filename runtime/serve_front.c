/* The serving front endpoint (serve_front.h). */
#include "serve_front.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_curve.h"
#include "status_internal.h"
#include "timing.h"

#define REPLY_HWM 65536 /* messages queued to one client that does not read */

void pp_serve_job_free(pp_serve_job *j) {
    if (!j) return;
    zmq_msg_close(&j->who);
    pp_serve_request_clear(&j->req);
    pp_response_free(j->resp);
    free(j->toks);
    free(j);
}

/* Sends r to the client who; 0 when the client is gone or does not read
 * (the router is mandatory: no silent drop to an unknown peer; past
 * REPLY_HWM unread messages a client gets no more, and its generation is
 * stopped). */
static int send_reply(pp_serve_front *f, zmq_msg_t *who, const pp_response *r) {
    void *buf;
    size_t n;
    if (pp_serve_response_encode(r, &buf, &n) != PP_OK) return 1;
    zmq_msg_t id;
    zmq_msg_init(&id);
    zmq_msg_copy(&id, who);
    int sent = zmq_msg_send(&id, f->router, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0;
    if (sent) zmq_send(f->router, buf, n, ZMQ_DONTWAIT);
    zmq_msg_close(&id);
    free(buf);
    return sent || (zmq_errno() != EHOSTUNREACH && zmq_errno() != EAGAIN);
}

/* Tells the rank thread to stop client who's request id (it went away). */
static void forward_cancel(pp_serve_front *f, zmq_msg_t *who, uint64_t id) {
    if (atomic_load(&f->cancels) >= f->c->serve_max_queue) return;
    pp_serve_job *c = calloc(1, sizeof *c);
    if (!c) return;
    zmq_msg_init(&c->who);
    zmq_msg_copy(&c->who, who);
    c->req.id = id;
    c->req.kind = PP_SERVE_KIND_CANCEL;
    atomic_fetch_add(&f->cancels, 1);
    if (zmq_send(f->pair_front, &c, sizeof c, 0) != sizeof c) {
        atomic_fetch_sub(&f->cancels, 1);
        pp_serve_job_free(c);
    }
}

static void reply_error(pp_serve_front *f, zmq_msg_t *who, uint64_t id, int code, const char *error) {
    pp_response r = {id, code, (char *)error, 0, NULL, NULL, NULL, 0, NULL, NULL, 0};
    send_reply(f, who, &r);
}

static const char *state_name(int state) {
    return state == PP_FRONT_SERVING ? "serving" : state == PP_FRONT_DEGRADED ? "degraded" : "closing";
}

char *pp_serve_front_stats(pp_serve_front *f) {
    pp_serve_stats *st = &f->st;
    double lat[PP_SERVE_LATENCIES];
    pthread_mutex_lock(&st->lock);
    long n = st->n_latency < PP_SERVE_LATENCIES ? st->n_latency : PP_SERVE_LATENCIES;
    memcpy(lat, st->latency, sizeof(double) * (size_t)n);
    pthread_mutex_unlock(&st->lock);
    for (long i = 1; i < n; i++) /* insertion sort: at most 1024 */
        for (long j = i; j > 0 && lat[j - 1] > lat[j]; j--) {
            double t = lat[j];
            lat[j] = lat[j - 1];
            lat[j - 1] = t;
        }
    char why[300] = "";
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0, k = 0; f->why[i] && k < sizeof why - 2; i++) /* as a JSON string */
        if (f->why[i] != '"' && f->why[i] != '\\' && (unsigned char)f->why[i] >= 0x20) why[k++] = f->why[i];
    pthread_mutex_unlock(&f->lock);
    size_t cap = 1536 + (size_t)st->n_ranks * 160;
    char *out = malloc(cap);
    if (!out) return NULL;
    long long batches = atomic_load(&st->batches);
    snprintf(out, cap,
             "{\"state\": \"%s\", \"why\": \"%s\", \"requests\": %lld, \"ok\": %lld, \"bad_request\": %lld, "
             "\"busy\": %lld, \"timeout\": %lld, \"failed\": %lld, \"unavailable\": %lld, \"in_system\": %d, "
             "\"batches\": %lld, \"mean_batch_rows\": %.2f, \"tokens\": %lld, \"sessions\": %d, "
             "\"sessions_lost\": %lld, \"rejoins\": %lld, \"front_state_bytes\": %lld, \"front_busy_ms\": %.1f, "
             "\"pending\": %d, \"inflight\": %d, \"latency_ms_p50\": %.3f, \"latency_ms_p99\": %.3f, \"ranks\": [",
             state_name(atomic_load(&f->state)), why, (long long)atomic_load(&st->requests),
             (long long)atomic_load(&st->ok), (long long)atomic_load(&st->bad), (long long)atomic_load(&st->busy),
             (long long)atomic_load(&st->timeouts), (long long)atomic_load(&st->failed),
             (long long)atomic_load(&st->unavailable), atomic_load(&st->in_system), batches,
             batches ? (double)atomic_load(&st->batch_rows) / (double)batches : 0.0, (long long)atomic_load(&st->tokens),
             atomic_load(&st->sessions), (long long)atomic_load(&st->lost), (long long)atomic_load(&st->rejoins),
             (long long)atomic_load(&st->state_bytes), (double)atomic_load(&st->busy_us) / 1000.0,
             atomic_load(&st->pending), atomic_load(&st->inflight), n ? lat[n / 2] : 0.0,
             n ? lat[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1] : 0.0);
    for (int r = 0; r < st->n_ranks; r++) { /* each stage's work, as its rank last said */
        size_t len = strlen(out);
        snprintf(out + len, cap - len,
                 "%s{\"rank\": %d, \"compute_ms\": %.1f, \"batches\": %lld, \"state_bytes\": %lld, \"sessions\": %lld}",
                 r ? ", " : "", r, (double)atomic_load(&st->ranks[r].compute_us) / 1000.0,
                 (long long)atomic_load(&st->ranks[r].batches), (long long)atomic_load(&st->ranks[r].state_bytes),
                 (long long)atomic_load(&st->ranks[r].sessions));
    }
    size_t len = strlen(out);
    snprintf(out + len, cap - len, "]}");
    return out;
}

/* A request from a client: answered here, or handed to the rank thread. */
static void take_request(pp_serve_front *f) {
    zmq_msg_t who, body;
    zmq_msg_init(&who);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&who, f->router, ZMQ_DONTWAIT) < 0 || !zmq_msg_more(&who) ||
        zmq_msg_recv(&body, f->router, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&who);
        zmq_msg_close(&body);
        return;
    }
    while (zmq_msg_more(&body)) { /* one frame is a request: drop the rest */
        zmq_msg_t extra;
        zmq_msg_init(&extra);
        int more = zmq_msg_recv(&extra, f->router, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&extra);
        zmq_msg_close(&extra);
        if (!more) break;
    }
    pp_serve_job *j = calloc(1, sizeof *j);
    pp_status ok = j ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    if (j) zmq_msg_init(&j->who);
    if (ok == PP_OK)
        ok = pp_serve_request_decode(zmq_msg_data(&body), zmq_msg_size(&body),
                                     (size_t)f->c->serve_max_request_bytes, &j->req);
    zmq_msg_close(&body);
    int kind = ok == PP_OK ? j->req.kind : -1;
    if (kind != PP_SERVE_KIND_CANCEL) atomic_fetch_add(&f->st.requests, 1);
    int state = atomic_load(&f->state);
    if (ok != PP_OK) {
        atomic_fetch_add(&f->st.bad, 1);
        reply_error(f, &who, j ? j->req.id : 0, PP_SERVE_BAD_REQUEST, pp_last_error());
    } else if (kind == PP_SERVE_KIND_STATS) {
        char *json = pp_serve_front_stats(f);
        pp_response r = {j->req.id, PP_SERVE_OK, "", 0, NULL, NULL, json, 0, NULL, NULL, 0};
        send_reply(f, &who, &r);
        free(json);
        ok = PP_ERR_STATE;
    } else if (kind == PP_SERVE_KIND_CANCEL) { /* to the rank thread, never answered; bounded like requests */
        if (state == PP_FRONT_SERVING) forward_cancel(f, &who, j->req.id);
        ok = PP_ERR_STATE;
    } else if (state != PP_FRONT_SERVING) {
        char why[1100];
        pthread_mutex_lock(&f->lock);
        snprintf(why, sizeof why, "%s", f->why[0] ? f->why : "the service is shutting down");
        pthread_mutex_unlock(&f->lock);
        atomic_fetch_add(&f->st.unavailable, 1);
        reply_error(f, &who, j->req.id, PP_SERVE_UNAVAILABLE, why);
        ok = PP_ERR_STATE;
    } else if (atomic_load(&f->st.in_system) >= f->c->serve_max_queue) {
        atomic_fetch_add(&f->st.busy, 1);
        char why[128];
        snprintf(why, sizeof why, "%d requests are waiting or running (serve.max_queue)", f->c->serve_max_queue);
        reply_error(f, &who, j->req.id, PP_SERVE_BUSY, why);
        ok = PP_ERR_STATE;
    }
    if (ok != PP_OK) {
        pp_serve_job_free(j);
        zmq_msg_close(&who);
        return;
    }
    zmq_msg_move(&j->who, &who);
    zmq_msg_close(&who);
    j->arrived = pp_monotonic_ms();
    j->deadline = j->arrived + (j->req.timeout_ms ? j->req.timeout_ms : (uint32_t)f->c->timeout_ms);
    atomic_fetch_add(&f->st.in_system, 1);
    if (zmq_send(f->pair_front, &j, sizeof j, 0) != sizeof j) { /* cannot happen: inproc, no high-water mark */
        atomic_fetch_sub(&f->st.in_system, 1);
        reply_error(f, &j->who, j->req.id, PP_SERVE_UNAVAILABLE, "the service is shutting down");
        pp_serve_job_free(j);
    }
}

/* A job answered by the rank thread: send it, count it. */
static void answer_job(pp_serve_front *f) {
    pp_serve_job *j;
    if (zmq_recv(f->pair_front, &j, sizeof j, ZMQ_DONTWAIT) != sizeof j) return;
    if (j->partial) { /* one message of a stream: the request goes on, unless its client is gone */
        if (!send_reply(f, &j->who, j->resp)) forward_cancel(f, &j->who, j->req.id);
        pp_serve_job_free(j);
        return;
    }
    pp_response oom = {j->req.id, PP_SERVE_UNAVAILABLE, "out of memory", 0, NULL, NULL, NULL, 0, NULL, NULL, 0};
    send_reply(f, &j->who, j->resp ? j->resp : &oom);
    int code = j->resp ? j->resp->code : PP_SERVE_UNAVAILABLE;
    atomic_fetch_add(code == PP_SERVE_OK            ? &f->st.ok
                     : code == PP_SERVE_TIMEOUT     ? &f->st.timeouts
                     : code == PP_SERVE_BAD_REQUEST ? &f->st.bad
                     : code == PP_SERVE_BUSY        ? &f->st.busy
                     : code == PP_SERVE_UNAVAILABLE ? &f->st.unavailable
                                                    : &f->st.failed,
                     1);
    if (code == PP_SERVE_OK) {
        pthread_mutex_lock(&f->st.lock);
        f->st.latency[f->st.n_latency++ % PP_SERVE_LATENCIES] = pp_monotonic_ms() - j->arrived;
        pthread_mutex_unlock(&f->st.lock);
    }
    atomic_fetch_sub(&f->st.in_system, 1);
    pp_serve_job_free(j);
}

static void *front_main(void *arg) {
    pp_serve_front *f = arg;
    while (!atomic_load(&f->stop)) {
        zmq_pollitem_t items[2] = {{f->router, 0, ZMQ_POLLIN, 0}, {f->pair_front, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 2, 100) <= 0) continue;
        if (items[1].revents & ZMQ_POLLIN) answer_job(f);
        if (items[0].revents & ZMQ_POLLIN) take_request(f);
    }
    while (zmq_poll((zmq_pollitem_t[]){{f->pair_front, 0, ZMQ_POLLIN, 0}}, 1, 0) > 0) answer_job(f);
    return NULL;
}

void pp_serve_front_set_state(pp_serve_front *f, int state, const char *why) {
    pthread_mutex_lock(&f->lock);
    snprintf(f->why, sizeof f->why, "%s", why ? why : "");
    pthread_mutex_unlock(&f->lock);
    atomic_store(&f->state, state);
}

pp_serve_job *pp_serve_front_take(pp_serve_front *f) {
    pp_serve_job *j;
    return zmq_recv(f->pair_worker, &j, sizeof j, ZMQ_DONTWAIT) == sizeof j ? j : NULL;
}

void pp_serve_front_answer(pp_serve_front *f, pp_serve_job *j) { zmq_send(f->pair_worker, &j, sizeof j, 0); }

pp_status pp_serve_front_open(const pp_config *c, int rank, pp_serve_front **out) {
    *out = NULL;
    pp_serve_front *f = calloc(1, sizeof *f);
    if (!f) return pp_error(PP_ERR_NOMEM, "out of memory");
    f->c = c;
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->st.lock, NULL);
    f->st.n_ranks = c->n_ranks;
    f->st.ranks = calloc((size_t)c->n_ranks + 1, sizeof *f->st.ranks);
    if (!f->st.ranks) {
        pthread_mutex_destroy(&f->lock);
        pthread_mutex_destroy(&f->st.lock);
        free(f);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    atomic_store(&f->state, PP_FRONT_DEGRADED);
    snprintf(f->why, sizeof f->why, "the service is starting");
    pp_status s = PP_OK;
    f->zctx = zmq_ctx_new();
    if (f->zctx) {
        f->router = zmq_socket(f->zctx, ZMQ_ROUTER);
        f->pair_front = zmq_socket(f->zctx, ZMQ_PAIR);
        f->pair_worker = zmq_socket(f->zctx, ZMQ_PAIR);
    }
    if (!f->zctx || !f->router || !f->pair_front || !f->pair_worker) s = pp_error(PP_ERR_IO, "serve: cannot make sockets");
    if (s == PP_OK) {
        int zero = 0, hwm = 0, one = 1;
        /* up to twice the limit reaches the decoder, which answers "bad request";
         * past that libzmq drops the connection without an answer */
        int64_t max = c->serve_max_request_bytes < ((int64_t)1 << 40) ? 2 * c->serve_max_request_bytes + 65536 : INT64_MAX;
        zmq_setsockopt(f->router, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(f->router, ZMQ_MAXMSGSIZE, &max, sizeof max);
        int reply_hwm = REPLY_HWM;
        zmq_setsockopt(f->router, ZMQ_SNDHWM, &reply_hwm, sizeof reply_hwm);
        zmq_setsockopt(f->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
        zmq_setsockopt(f->pair_front, ZMQ_SNDHWM, &hwm, sizeof hwm); /* never drops: bounded by max_queue */
        zmq_setsockopt(f->pair_worker, ZMQ_SNDHWM, &hwm, sizeof hwm);
        snprintf(f->pair_ep, sizeof f->pair_ep, "inproc://pippin-serve-%p", (void *)f);
        if (zmq_bind(f->pair_front, f->pair_ep) != 0 || zmq_connect(f->pair_worker, f->pair_ep) != 0)
            s = pp_error(PP_ERR_IO, "serve: inproc pair: %s", zmq_strerror(zmq_errno()));
    }
    if (s == PP_OK) s = pp_serve_curve_open(c, rank, f->zctx, f->router, &f->curve); /* with security */
    if (s == PP_OK && zmq_bind(f->router, c->serve_endpoint) != 0)
        s = pp_error(PP_ERR_IO, "serve: cannot bind the front endpoint %s: %s", c->serve_endpoint,
                     zmq_strerror(zmq_errno()));
    if (s == PP_OK && pthread_create(&f->thread, NULL, front_main, f) != 0)
        s = pp_error(PP_ERR_IO, "serve: cannot start the front thread");
    else if (s == PP_OK)
        f->started = 1;
    if (s != PP_OK) {
        pp_serve_front_close(f);
        return s;
    }
    *out = f;
    return PP_OK;
}

void pp_serve_front_close(pp_serve_front *f) {
    if (!f) return;
    if (f->started) {
        if (atomic_load(&f->state) == PP_FRONT_DEGRADED) { /* it ends because of that: still said */
            char why[900];
            pthread_mutex_lock(&f->lock);
            snprintf(why, sizeof why, "%.899s", f->why);
            pthread_mutex_unlock(&f->lock);
            char told[sizeof f->why];
            snprintf(told, sizeof told, "the service is shutting down after: %.900s", why);
            pp_serve_front_set_state(f, PP_FRONT_CLOSING, told);
        } else {
            atomic_store(&f->state, PP_FRONT_CLOSING);
        }
        pp_serve_job *j; /* what the rank thread never took */
        for (double until = pp_monotonic_ms() + 1000; atomic_load(&f->st.in_system) > 0 && pp_monotonic_ms() < until;) {
            while ((j = pp_serve_front_take(f))) {
                if (j->req.kind == PP_SERVE_KIND_CANCEL) {
                    pp_serve_job_free(j);
                    continue;
                }
                j->resp = calloc(1, sizeof *j->resp);
                if (j->resp) {
                    j->resp->id = j->req.id;
                    j->resp->code = PP_SERVE_UNAVAILABLE;
                    pthread_mutex_lock(&f->lock);
                    j->resp->error = strdup(f->why[0] ? f->why : "the service is shutting down");
                    pthread_mutex_unlock(&f->lock);
                }
                pp_serve_front_answer(f, j);
            }
            struct timespec nap = {0, 5 * 1000 * 1000};
            nanosleep(&nap, NULL);
        }
        atomic_store(&f->stop, 1);
        pthread_join(f->thread, NULL);
        while ((j = pp_serve_front_take(f))) pp_serve_job_free(j);
    }
    if (f->router) zmq_close(f->router);
    if (f->pair_front) zmq_close(f->pair_front);
    if (f->pair_worker) zmq_close(f->pair_worker);
    pp_serve_curve_close(f->curve);
    if (f->zctx) zmq_ctx_term(f->zctx);
    pthread_mutex_destroy(&f->lock);
    pthread_mutex_destroy(&f->st.lock);
    for (int i = 0; i < 256; i++) free(f->lost[i].name), free(f->lost[i].why);
    free(f->st.ranks);
    free(f);
}

/* A standing pipeline that answers requests (serve.h, docs/serving.md). */
#include "serve.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "pippin/exec.h"
#include "log_internal.h"
#include "serve_front.h"
#include "serve_sample.h"
#include "serve_state.h"
#include "serve_wire.h"
#include "status_internal.h"
#include "text_data.h"
#include "timing.h"

/* Keys of serving messages: a microbatch number no schedule or agreement
 * uses; answers to the front at steps past any batch number, so that the
 * front's own steps (which drop older steps' messages) never drop them. */
#define SERVE_MB (1 << 29)
#define ANSWER_STEP ((int64_t)1 << 40)
#define STATS_STEP ((int64_t)1 << 41) /* + a rank's report number: its counters to the front */
#define STATS_NAME "pippin:stats"
#define STATS_EVERY_MS 500
#define BATCH_NAME "pippin:batch"
#define FAIL_NAME "pippin:fail"
#define GRAVES 64 /* batches answered without all their outputs, drained a while */
#define STATS_LOG_MS 60000 /* a stats line in the log this often (info level) */
#define LOST 256           /* sessions remembered as lost, to tell their next request */
#define HDR_DROPS 64       /* session drops one batch header carries */
#define HDR_LEN 5          /* flags, rows, session, fresh, drops; then the dropped sessions */
#define SESSION_LOST_PREFIX "session lost"
#define MAX_PROMPT (1 << 20) /* tokens in a prompt, without serve.context */

struct session;

typedef pp_serve_job job;

typedef struct pp_serve_session {
    char *name;      /* NULL: a generation's own (dropped when it ends) */
    int64_t handle;  /* how the ranks know it */
    double used;
    int jobs;        /* its jobs waiting or running */
    int running;     /* a batch of it is in the pipeline */
    int started;     /* its state exists on the ranks */
    int has_next;    /* a generation's last token, not yet fed: goes first next time */
    int64_t next_token;
    int ended;       /* out of the table; freed with its last job */
    job *owner;      /* a generation holding it from its first step to its last */
    int64_t positions; /* tokens its state holds (the front's store says) */
    int64_t scan;    /* pick()'s pass that saw its first waiting job */
    char why[256];   /* why it ended, for its jobs still waiting */
} session;

typedef struct batch {
    int64_t b;
    job **jobs;
    int n_jobs;
    int64_t rows;
    pp_tensor **outs; /* per model output, once here */
    double started;
    session *sess;
} batch;


typedef struct serve {
    const pp_serve_ctx *x;
    const pp_config *c;
    const pp_pipe *p;
    int front;           /* the rank holding stage 0 */
    int *first_stage;    /* per rank */
    int n_in;            /* model inputs */
    int *in_edge;
    pp_serve_front *f;   /* on the front rank: its endpoint, counters and lost sessions */
    /* the front rank's thread */
    job **pending;
    int n_pending, cap_pending;
    batch *inflight;
    int n_inflight, max_inflight;
    struct {
        int64_t b;
        double until;
    } graves[GRAVES];
    int n_graves;
    int64_t next_b;
    int64_t scans; /* pick()'s passes */
    /* state and generation (every rank) */
    pp_state_pair *pairs;
    int n_pairs;
    int *state_in, *state_out; /* per model input / output: its pair + 1, or 0 */
    pp_state_store *store;
    int token_in, logits_out; /* the generation's input and output, or -1 */
    int64_t vocab[256];       /* byte -> token, with serve.vocab */
    unsigned char *token_byte; /* token -> byte */
    int64_t n_token_byte;
    /* sessions (the front rank's thread) */
    session **sessions;
    int n_sessions, cap_sessions;
    int64_t next_handle;
    int64_t *drops;
    int n_drops, cap_drops;
    /* per-rank counters: the front's next report number from each rank; a
     * rank's own reports */
    int64_t *stats_seq;
    int64_t stats_sent;
    int64_t rank_batches;
    double stats_at;
    int stats_dirty;
} serve;

static double now_ms(void) { return pp_monotonic_ms(); }

/* ---- checking a request against the model's inputs ---- */

static pp_status check_request(serve *s, const pp_serve_request *r, int64_t *rows) {
    const pp_pipe *p = s->p;
    char sym_name[16][64];
    int64_t sym_val[16];
    int n_sym = 0;
    *rows = -1;
    for (int k = 0; k < r->n_inputs; k++) {
        int i = 0;
        while (i < s->n_in && strcmp(p->edges[s->in_edge[i]].value, r->names[k]) != 0) i++;
        if (i == s->n_in) return pp_error(PP_ERR_INVALID, "input '%s' is not a model input", r->names[k]);
        if (s->state_in[i])
            return pp_error(PP_ERR_INVALID, "input '%s' is state the service keeps per session (serve.state)",
                            r->names[k]);
    }
    if (r->session[0] && !s->n_pairs)
        return pp_error(PP_ERR_INVALID, "session '%s': the model keeps no state between requests (no output "
                        "present.X feeding an input past_key_values.X; see serve.state)", r->session);
    for (int i = 0; i < s->n_in; i++) {
        const pp_pipe_edge *e = &p->edges[s->in_edge[i]];
        if (s->state_in[i]) continue;
        int k = 0;
        while (k < r->n_inputs && strcmp(r->names[k], e->value) != 0) k++;
        if (k == r->n_inputs) return pp_error(PP_ERR_INVALID, "model input '%s' not given", e->value);
        const pp_tensor *t = r->inputs[k];
        if (e->dtype != PP_DTYPE_UNDEFINED && t->dtype != e->dtype)
            return pp_error(PP_ERR_INVALID, "input '%s': dtype %s, the model takes %s", e->value,
                            pp_dtype_name(t->dtype), pp_dtype_name(e->dtype));
        if (e->ndim >= 0 && t->ndim != e->ndim)
            return pp_error(PP_ERR_INVALID, "input '%s': %d dims, the model takes %d", e->value, t->ndim, e->ndim);
        if (t->ndim < 1) return pp_error(PP_ERR_INVALID, "input '%s': a scalar; inputs have a batch dim first", e->value);
        if (pp_tensor_numel(t) == 0) return pp_error(PP_ERR_INVALID, "input '%s': empty (a dim of 0)", e->value);
        if (*rows < 0) *rows = t->shape[0];
        else if (t->shape[0] != *rows)
            return pp_error(PP_ERR_INVALID, "input '%s': %" PRId64 " rows, another input has %" PRId64, e->value,
                            t->shape[0], *rows);
        for (int d = 0; e->ndim >= 0 && d < t->ndim; d++) {
            const char *dim = e->dims[d];
            if (!dim) continue;
            char *end;
            long long fixed = strtoll(dim, &end, 10);
            if (!*end && end != dim) {
                if (t->shape[d] != fixed)
                    return pp_error(PP_ERR_INVALID, "input '%s' dim %d: %" PRId64 ", the model takes %lld", e->value, d,
                                    t->shape[d], fixed);
                continue;
            }
            int j = 0;
            while (j < n_sym && strcmp(sym_name[j], dim) != 0) j++;
            if (j < n_sym && sym_val[j] != t->shape[d])
                return pp_error(PP_ERR_INVALID, "input '%s' dim %d ('%s'): %" PRId64 ", another input has %" PRId64,
                                e->value, d, dim, t->shape[d], sym_val[j]);
            if (j == n_sym && n_sym < 16) {
                snprintf(sym_name[n_sym], sizeof sym_name[n_sym], "%s", dim);
                sym_val[n_sym++] = t->shape[d];
            }
        }
    }
    if (*rows < 1) return pp_error(PP_ERR_INVALID, "no rows");
    if (*rows > s->c->serve_max_batch)
        return pp_error(PP_ERR_INVALID, "%" PRId64 " rows, more than serve.max_batch %d", *rows, s->c->serve_max_batch);
    for (int o = 0; o < r->n_outputs; o++) {
        int k = 0;
        while (k < p->n_outputs && strcmp(p->outputs[k], r->outputs[o]) != 0) k++;
        if (k == p->n_outputs) return pp_error(PP_ERR_INVALID, "output '%s' is not a model output", r->outputs[o]);
        if (s->state_out[k])
            return pp_error(PP_ERR_INVALID, "output '%s' is state the service keeps on its stage (serve.state)",
                            r->outputs[o]);
    }
    return PP_OK;
}

/* A generation's prompt, into j->toks: tokens (int64 [1, T] or [T]) or text
 * through serve.vocab. */
static pp_status check_generate(serve *s, job *j) {
    const pp_serve_request *r = &j->req;
    if (s->token_in < 0 || s->logits_out < 0)
        return pp_error(PP_ERR_INVALID, "generate: the model needs one int64 token input besides its state and a "
                        "float output 'logits' [batch, seq, vocab] (this one has %s)",
                        s->token_in < 0 ? "other inputs too, or no int64 one" : "no such output");
    const char *text = r->text;
    int64_t n = 0;
    const int64_t *given = NULL;
    if (text[0]) {
        if (r->n_inputs) return pp_error(PP_ERR_INVALID, "generate: give the prompt as text or as tokens, not both");
        if (!s->token_byte) return pp_error(PP_ERR_INVALID, "generate: a text prompt needs serve.vocab in the config");
        n = (int64_t)strlen(text);
    } else {
        if (r->n_inputs != 1) return pp_error(PP_ERR_INVALID, "generate: the prompt is one tensor of tokens (or text)");
        const pp_tensor *t = r->inputs[0];
        if (t->dtype != PP_I64 || t->ndim < 1 || t->ndim > 2 || (t->ndim == 2 && t->shape[0] != 1))
            return pp_error(PP_ERR_INVALID, "generate: the prompt tokens are int64 [1, T] (one sequence), not %s%s",
                            pp_dtype_name(t->dtype), t->ndim == 2 ? " with several rows" : " of that rank");
        n = pp_tensor_numel(t);
        given = t->data;
    }
    if (r->session[0] && !s->n_pairs)
        return pp_error(PP_ERR_INVALID, "session '%s': the model keeps no state between requests (no output "
                        "present.X feeding an input past_key_values.X; see serve.state)", r->session);
    if (n < 1 && !r->session[0]) return pp_error(PP_ERR_INVALID, "generate: an empty prompt");
    int64_t limit = s->c->serve_context && s->n_pairs ? s->c->serve_context : MAX_PROMPT;
    if (n > limit)
        return pp_error(PP_ERR_INVALID, "generate: a prompt of %lld tokens, more than %s %lld", (long long)n,
                        limit == MAX_PROMPT ? "the service takes," : "serve.context", (long long)limit);
    if (r->max_tokens > (uint32_t)s->c->serve_max_tokens)
        return pp_error(PP_ERR_INVALID, "generate: max_tokens %u, more than serve.max_tokens %d", r->max_tokens,
                        s->c->serve_max_tokens);
    j->cap_toks = (int)(n + r->max_tokens + 2); /* both bounded above: no overflow */
    if (!(j->toks = malloc(sizeof *j->toks * (size_t)j->cap_toks))) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) {
        if (given) {
            if (given[i] < 0)
                return pp_error(PP_ERR_INVALID, "generate: prompt token %lld is %lld (token ids are >= 0)", (long long)i,
                                (long long)given[i]);
            j->toks[i] = given[i];
        } else {
            int64_t id = s->vocab[(unsigned char)text[i]];
            if (id < 0)
                return pp_error(PP_ERR_INVALID, "generate: the prompt's character %lld (byte 0x%02x) is not in serve.vocab",
                                (long long)i, (unsigned char)text[i]);
            j->toks[i] = id;
        }
    }
    j->n_toks = (int)n;
    j->rng = r->seed;
    j->solo = 1;
    j->rows = 1;
    return PP_OK;
}

/* ---- the front rank's thread: batches ---- */

static void release_session(serve *s, job *j);

/* Hands j back to the front thread with its response: j belongs to that
 * thread from here on (it sends and frees it). */
static void respond(serve *s, job *j, int code, const char *error) {
    /* a generation's last token reached its client but not the state: the session feeds it first next time */
    if (j->toks && j->produced && j->n_fed < j->n_toks && j->sess && j->sess->name && !j->sess->ended)
        j->sess->has_next = 1, j->sess->next_token = j->toks[j->n_toks - 1];
    release_session(s, j);
    if (!j->resp) {
        j->resp = calloc(1, sizeof *j->resp);
        if (j->resp) j->resp->id = j->req.id;
    }
    if (code == PP_SERVE_SESSION_LOST && error && strncmp(error, SESSION_LOST_PREFIX ": ", strlen(SESSION_LOST_PREFIX) + 2) == 0)
        error += strlen(SESSION_LOST_PREFIX) + 2; /* the code says it already */
    if (j->resp && !j->resp->error) {
        j->resp->code = code;
        j->resp->error = strdup(error ? error : "");
    }
    pp_serve_front_answer(s->f, j);
}

static int compatible(const job *a, const job *b) {
    for (int k = 0; k < a->req.n_inputs; k++) {
        int m = 0;
        while (m < b->req.n_inputs && strcmp(b->req.names[m], a->req.names[k]) != 0) m++;
        const pp_tensor *x = a->req.inputs[k], *y = b->req.inputs[m];
        if (x->dtype != y->dtype || x->ndim != y->ndim) return 0;
        for (int d = 1; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d]) return 0;
    }
    return 1;
}

/* ---- sessions (the front rank's thread) ---- */

/* Session h's state is to go from every rank (with the next header). */
static void queue_drop(serve *s, int64_t h) {
    pp_state_drop(s->store, h);
    atomic_store(&s->f->st.state_bytes, pp_state_bytes(s->store));
    if (s->n_drops == s->cap_drops) {
        int cap = s->cap_drops ? 2 * s->cap_drops : 64;
        int64_t *grown = realloc(s->drops, sizeof *grown * (size_t)cap);
        if (!grown) return; /* the ranks keep it until their byte bound drops it */
        s->drops = grown, s->cap_drops = cap;
    }
    s->drops[s->n_drops++] = h;
}

static void remember_lost(serve *s, const char *name, const char *why) {
    int i = (int)(s->f->lost_next++ % LOST);
    free(s->f->lost[i].name);
    free(s->f->lost[i].why);
    s->f->lost[i].name = strdup(name);
    s->f->lost[i].why = strdup(why);
    atomic_fetch_add(&s->f->st.lost, 1);
}

/* Why session name was lost (taken out: its next request starts afresh), or NULL. */
static char *take_lost(serve *s, const char *name) {
    for (int i = 0; i < LOST; i++)
        if (s->f->lost[i].name && strcmp(s->f->lost[i].name, name) == 0) {
            char *why = s->f->lost[i].why;
            free(s->f->lost[i].name);
            s->f->lost[i].name = NULL;
            s->f->lost[i].why = NULL;
            return why ? why : strdup("session lost");
        }
    return NULL;
}

/* Ends a session: its state goes from every rank; when why is given, its
 * waiting jobs and a named one's next request are told why. Freed now, or
 * with its last job. */
static void end_session(serve *s, session *x, const char *why, int remember) {
    int i = 0;
    while (i < s->n_sessions && s->sessions[i] != x) i++;
    if (i < s->n_sessions) {
        s->sessions[i] = s->sessions[--s->n_sessions];
        atomic_store(&s->f->st.sessions, s->n_sessions);
    }
    if (x->started) queue_drop(s, x->handle);
    x->started = 0;
    if (why && remember && x->name && !x->ended) remember_lost(s, x->name, why);
    if (!x->ended) snprintf(x->why, sizeof x->why, "%s", why ? why : SESSION_LOST_PREFIX ": ended");
    x->ended = 1;
    if (x->jobs) return;
    free(x->name);
    free(x);
}

static session *find_session(serve *s, const char *name) {
    for (int i = 0; i < s->n_sessions; i++)
        if (s->sessions[i]->name && strcmp(s->sessions[i]->name, name) == 0) return s->sessions[i];
    return NULL;
}

/* A new session (name NULL: a generation's own); at serve.max_sessions the
 * least recently used idle one makes room, else NULL with the reason. */
static session *new_session(serve *s, const char *name, char *why, size_t cap) {
    if (s->n_sessions >= s->c->serve_max_sessions) {
        session *lru = NULL;
        for (int i = 0; i < s->n_sessions; i++)
            if (!s->sessions[i]->jobs && (!lru || s->sessions[i]->used < lru->used)) lru = s->sessions[i];
        if (!lru) {
            snprintf(why, cap, "%d sessions are busy (serve.max_sessions)", s->c->serve_max_sessions);
            return NULL;
        }
        char msg[160];
        snprintf(msg, sizeof msg, SESSION_LOST_PREFIX ": ended to make room for a new one (serve.max_sessions %d)",
                 s->c->serve_max_sessions);
        end_session(s, lru, msg, 1);
    }
    if (s->n_sessions == s->cap_sessions) {
        int c = s->cap_sessions ? 2 * s->cap_sessions : 16;
        session **grown = realloc(s->sessions, sizeof *grown * (size_t)c);
        if (!grown) return snprintf(why, cap, "out of memory"), NULL;
        s->sessions = grown, s->cap_sessions = c;
    }
    session *x = calloc(1, sizeof *x);
    if (!x || (name && !(x->name = strdup(name)))) {
        free(x);
        snprintf(why, cap, "out of memory");
        return NULL;
    }
    x->handle = ++s->next_handle;
    x->used = now_ms();
    s->sessions[s->n_sessions++] = x;
    atomic_store(&s->f->st.sessions, s->n_sessions);
    return x;
}

static void release_session(serve *s, job *j) {
    session *x = j->sess;
    if (!x) return;
    j->sess = NULL;
    x->jobs--;
    x->used = now_ms();
    if (x->owner == j) x->owner = NULL;
    if (!x->jobs && (x->ended || !x->name)) end_session(s, x, NULL, 0);
}

static void expire_sessions(serve *s, double now) {
    for (int i = 0; i < s->n_sessions; i++) {
        session *x = s->sessions[i];
        if (x->jobs || now - x->used < s->c->serve_session_idle_ms) continue;
        char why[160];
        snprintf(why, sizeof why, SESSION_LOST_PREFIX ": unused for %d ms (serve.session_idle_ms)",
                 s->c->serve_session_idle_ms);
        end_session(s, x, why, 1);
        i--;
    }
}

static int same_client(const job *a, const job *b) {
    zmq_msg_t *x = (zmq_msg_t *)&a->who, *y = (zmq_msg_t *)&b->who;
    return a->req.id == b->req.id && zmq_msg_size(x) == zmq_msg_size(y) &&
           memcmp(zmq_msg_data(x), zmq_msg_data(y), zmq_msg_size(x)) == 0;
}

static void respond(serve *s, job *j, int code, const char *error);
static void unpend(serve *s, job *j);

/* A client cancelled its generation: a waiting one ends now, a running one
 * when its batch is back. */
static void cancel(serve *s, job *c) {
    for (int i = 0; i < s->n_pending; i++)
        if (same_client(s->pending[i], c) && s->pending[i]->toks) {
            job *j = s->pending[i];
            unpend(s, j);
            respond(s, j, PP_SERVE_FAILED, "cancelled");
            break;
        }
    for (int b = 0; b < s->n_inflight; b++)
        for (int k = 0; k < s->inflight[b].n_jobs; k++)
            if (same_client(s->inflight[b].jobs[k], c)) s->inflight[b].jobs[k]->cancelled = 1;
    atomic_fetch_sub(&s->f->cancels, 1);
    pp_serve_job_free(c);
}

/* Ties a request to its session, creating it; 0 and an answer sent when it
 * cannot run (its session was lost, too many sessions). */
static int attach_session(serve *s, job *j) {
    const char *name = j->req.session;
    if (!name[0] && !(j->toks && s->n_pairs)) return 1; /* no state kept across requests */
    session *x = name[0] ? find_session(s, name) : NULL;
    if (name[0] && !x) {
        char *why = take_lost(s, name);
        if (why) {
            respond(s, j, PP_SERVE_SESSION_LOST, why);
            free(why);
            return 0;
        }
        if (j->req.kind == PP_SERVE_KIND_END_SESSION) { /* nothing to end */
            respond(s, j, PP_SERVE_OK, NULL);
            return 0;
        }
    }
    if (!x) {
        char why[160];
        if (!(x = new_session(s, name[0] ? name : NULL, why, sizeof why))) {
            atomic_fetch_add(&s->f->st.busy, 1);
            respond(s, j, PP_SERVE_BUSY, why);
            return 0;
        }
    }
    j->sess = x;
    x->jobs++;
    j->solo = 1; /* a session's batches carry its state: one request each */
    return 1;
}

static void take_jobs(serve *s) {
    job *j;
    while ((j = pp_serve_front_take(s->f))) {
        if (j->req.kind == PP_SERVE_KIND_CANCEL) {
            cancel(s, j);
            continue;
        }
        pp_status ok = PP_OK;
        if (j->req.kind == PP_SERVE_KIND_INFER) ok = check_request(s, &j->req, &j->rows);
        if (j->req.kind == PP_SERVE_KIND_GENERATE) ok = check_generate(s, j);
        if (ok != PP_OK) {
            respond(s, j, PP_SERVE_BAD_REQUEST, pp_last_error());
            continue;
        }
        if (s->n_pending == s->cap_pending) {
            int cap = s->cap_pending ? 2 * s->cap_pending : 64;
            job **grown = realloc(s->pending, (size_t)cap * sizeof *grown);
            if (!grown) {
                respond(s, j, PP_SERVE_UNAVAILABLE, "out of memory");
                continue;
            }
            s->pending = grown, s->cap_pending = cap;
        }
        if (!attach_session(s, j)) continue;
        s->pending[s->n_pending++] = j;
    }
}

static void expire_pending(serve *s, double now) {
    int k = 0;
    for (int i = 0; i < s->n_pending; i++) {
        job *j = s->pending[i];
        session *x = j->sess;
        if (x && ((x->owner && x->owner != j) || (x->running && x->owner != j))) {
            /* it waits for its session's earlier request: its timeout counts from when it can start */
            j->deadline = now + (j->req.timeout_ms ? j->req.timeout_ms : (uint32_t)s->c->timeout_ms);
            s->pending[k++] = j;
        } else if (now < j->deadline) {
            s->pending[k++] = j;
        } else {
            respond(s, j, PP_SERVE_TIMEOUT, "not started within its timeout (the service is busy)");
        }
    }
    s->n_pending = k;
}

/* Whether j may start now: a session's requests go one at a time, in the
 * order they came (a generation keeps its session from its first step to
 * its last); pending[] is walked in order with a new scan number, so the
 * first job of each session seen in this pass is its head. */
static int eligible(const job *j, int64_t scan) {
    session *x = j->sess;
    if (!x) return 1;
    int head = x->scan != scan;
    x->scan = scan;
    if (x->running) return 0;
    if (x->owner) return x->owner == j;
    return head && j->req.kind != PP_SERVE_KIND_END_SESSION;
}

/* The pending jobs to run next (the oldest that can run and those like it,
 * up to max_batch rows); 0 if none can run yet, or the batch should wait to
 * fill: only while other batches are in the pipeline, and at most
 * max_wait_us. */
static int pick(serve *s, double now, job **picked, int64_t *rows, double *wait_ms) {
    int n = 0;
    int64_t scan = ++s->scans;
    *rows = 0;
    for (int i = 0; i < s->n_pending; i++) {
        job *j = s->pending[i];
        if (!eligible(j, scan)) continue; /* it waits for its session's earlier request */
        if (n && (picked[0]->solo || j->solo || !compatible(picked[0], j) || *rows + j->rows > s->c->serve_max_batch))
            continue;
        picked[n++] = j;
        *rows += j->rows;
        if (*rows >= s->c->serve_max_batch) break;
    }
    if (!n) return 0;
    if (picked[0]->solo) return 1;
    double ready_at = picked[0]->arrived + s->c->serve_max_wait_us / 1000.0;
    *wait_ms = ready_at - now;
    /* an idle pipeline starts at once (waiting would only add latency);
     * a busy one waits up to max_wait_us for the batch to fill */
    return *rows >= s->c->serve_max_batch || now >= ready_at || s->n_inflight == 0 ? n : 0;
}

/* Requests to end a session whose other requests are done. */
static void run_ends(serve *s) {
    for (int i = 0; i < s->n_pending; i++) {
        job *j = s->pending[i];
        if (j->req.kind != PP_SERVE_KIND_END_SESSION || !j->sess) continue;
        session *y = j->sess;
        int first = 1; /* no earlier request of its session waits */
        for (int k = 0; k < i && first; k++) first = s->pending[k]->sess != y;
        if (!y->ended && (!first || y->running || y->owner)) continue;
        unpend(s, j);
        session *x = j->sess;
        j->sess = NULL;
        x->jobs--;
        end_session(s, x, NULL, 0); /* a second end of the same session: already ended, answered alike */
        respond(s, j, PP_SERVE_OK, NULL);
        i--;
    }
}

static pp_status concat(job **jobs, int n, const char *name, int64_t rows, pp_tensor **out) {
    const pp_tensor *first = NULL;
    for (int k = 0; k < jobs[0]->req.n_inputs; k++)
        if (strcmp(jobs[0]->req.names[k], name) == 0) first = jobs[0]->req.inputs[k];
    if (!first) return pp_error(PP_ERR_STATE, "serve: input '%s' missing from a checked request", name);
    int64_t shape[PP_MAX_DIMS];
    memcpy(shape, first->shape, sizeof shape);
    shape[0] = rows;
    PP_TRY(pp_tensor_empty(first->dtype, first->ndim, shape, out));
    size_t off = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < jobs[i]->req.n_inputs; k++)
            if (strcmp(jobs[i]->req.names[k], name) == 0) {
                memcpy((char *)(*out)->data + off, jobs[i]->req.inputs[k]->data, jobs[i]->req.inputs[k]->nbytes);
                off += jobs[i]->req.inputs[k]->nbytes;
            }
    return PP_OK;
}

/* Whether a stage on rank r consumes model input i. */
static int consumes(const serve *s, int i, int r) {
    const pp_pipe_edge *e = &s->p->edges[s->in_edge[i]];
    for (int c = 0; c < e->n_consumers; c++)
        if (s->x->sched->stage_rank[e->consumers[c]] == r) return 1;
    return 0;
}

/* Sends every other rank the header of batch b (flags: 1 the service ends,
 * 2 skip this batch; the batch's session and whether it starts afresh; the
 * sessions whose state is to go) with the model inputs its stages consume
 * (ins, NULL with a skip; state inputs are each rank's own). */
static pp_status send_headers(serve *s, int64_t b, int64_t flags, int64_t rows, const char **names, pp_tensor **ins,
                              int64_t session, int fresh) {
    const pp_serve_ctx *x = s->x;
    pp_tensor *hdr = NULL;
    int n_drop = s->n_drops < HDR_DROPS ? s->n_drops : HDR_DROPS;
    PP_TRY(pp_tensor_new(PP_I64, 1, (int64_t[]){HDR_LEN + n_drop}, &hdr));
    int64_t *h = hdr->data;
    h[0] = flags, h[1] = rows, h[2] = session, h[3] = fresh, h[4] = n_drop;
    if (n_drop) memcpy(h + HDR_LEN, s->drops, sizeof *h * (size_t)n_drop);
    pp_status st = PP_OK;
    for (int r = 0; r < x->sched->nranks; r++) { /* every rank, even after one failed; the first error */
        if (r == s->front) continue;
        const char *send_names[PP_SERVE_MAX_TENSORS + 2];
        pp_tensor *send[PP_SERVE_MAX_TENSORS + 2];
        int k = 0;
        send_names[k] = BATCH_NAME, send[k++] = hdr;
        for (int i = 0; ins && i < s->n_in && k < PP_SERVE_MAX_TENSORS + 2; i++)
            if (consumes(s, i, r) && !s->state_in[i]) send_names[k] = names[i], send[k++] = ins[i];
        pp_transport_key key = {PP_MSG_ACTIVATION, b, SERVE_MB, s->first_stage[s->front], s->first_stage[r], ""};
        pp_status sent = pp_transport_sendv(x->t, &key, k, send_names, send);
        if (st == PP_OK) st = sent;
    }
    pp_tensor_free(hdr);
    if (st == PP_OK && n_drop) { /* those drops are on their way */
        memmove(s->drops, s->drops + n_drop, sizeof *s->drops * (size_t)(s->n_drops - n_drop));
        s->n_drops -= n_drop;
    }
    return st;
}

static void unpend(serve *s, job *j) {
    int k = 0;
    while (k < s->n_pending && s->pending[k] != j) k++;
    if (k == s->n_pending) return;
    memmove(s->pending + k, s->pending + k + 1, sizeof *s->pending * (size_t)(s->n_pending - k - 1));
    s->n_pending--;
}

/* Puts j back at the head of the queue to run in a batch of its own. */
static void requeue_solo(serve *s, job *j) {
    j->solo = 1;
    if (s->n_pending == s->cap_pending) { /* cannot happen: it was just taken off */
        respond(s, j, PP_SERVE_FAILED, "out of memory");
        return;
    }
    memmove(s->pending + 1, s->pending, sizeof *s->pending * (size_t)s->n_pending);
    s->pending[0] = j;
    s->n_pending++;
}

/* The tokens a generation feeds next, as its request's one input: those
 * not yet in its session's state, or (a model without state) all of them,
 * the last serve.context at most. */
static pp_status gen_feed(serve *s, job *j) {
    session *x = j->sess;
    if (x && x->has_next && !j->n_fed && !j->produced && !j->took_next) { /* the last generation's final token first */
        memmove(j->toks + 1, j->toks, sizeof *j->toks * (size_t)j->n_toks);
        j->toks[0] = x->next_token;
        j->n_toks++;
        j->took_next = 1; /* the session forgets it once the step ran */
    }
    int start = j->n_fed;
    if (!s->n_pairs) start = s->c->serve_context && j->n_toks > s->c->serve_context ? j->n_toks - s->c->serve_context : 0;
    int len = j->n_toks - start;
    if (len < 1) return pp_error(PP_ERR_INVALID, "generate: an empty prompt");
    if (s->n_pairs && s->c->serve_context && x && x->positions + len > s->c->serve_context)
        return pp_error(PP_ERR_INVALID, "generate: the session holds %lld tokens; %d more would pass serve.context %d",
                        (long long)x->positions, len, s->c->serve_context);
    pp_tensor *t = NULL;
    PP_TRY(pp_tensor_new(PP_I64, 2, (int64_t[]){1, len}, &t));
    memcpy(t->data, j->toks + start, sizeof *j->toks * (size_t)len);
    char *name = strdup(s->p->edges[s->in_edge[s->token_in]].value);
    char **names = calloc(2, sizeof *names);
    pp_tensor **ins = calloc(2, sizeof *ins);
    if (!name || !names || !ins) {
        free(name), free(names), free(ins), pp_tensor_free(t);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < j->req.n_inputs; i++) free(j->req.names[i]), pp_tensor_free(j->req.inputs[i]);
    free(j->req.names);
    free(j->req.inputs);
    names[0] = name, ins[0] = t;
    j->req.names = names, j->req.inputs = ins, j->req.n_inputs = 1;
    j->feeding = j->n_toks;
    return PP_OK;
}

/* Starts a batch. Stage 0 runs first: if it refuses the batch (a token out
 * of range, say), the other ranks are told to skip it and its requests are
 * answered (each again alone, when several were merged: one bad request
 * must not fail the others); else they get the header and the model inputs
 * their stages consume. A session's state inputs come from each rank's
 * store and its state outputs stay there. Returns an error only when a rank
 * is unreachable. */
static pp_status launch(serve *s, job **jobs, int n, int64_t rows) {
    const pp_pipe *p = s->p;
    const pp_serve_ctx *x = s->x;
    for (int i = 0; i < n; i++) unpend(s, jobs[i]);
    session *sess = n == 1 ? jobs[0]->sess : NULL;
    if (sess && sess->ended) {
        respond(s, jobs[0], PP_SERVE_SESSION_LOST, sess->why);
        return PP_OK;
    }
    if (jobs[0]->toks && gen_feed(s, jobs[0]) != PP_OK) {
        respond(s, jobs[0], PP_SERVE_BAD_REQUEST, pp_last_error());
        return PP_OK;
    }
    int64_t handle = sess ? sess->handle : 0;
    int fresh = !sess || !sess->started;
    pp_tensor **ins = calloc((size_t)s->n_in + 1, sizeof *ins), **outs = calloc((size_t)p->n_outputs + 1, sizeof *outs);
    pp_tensor **state = calloc((size_t)s->n_pairs + 1, sizeof *state);
    const char **names = calloc((size_t)s->n_in + 1, sizeof *names);
    job **kept = malloc(sizeof *kept * (size_t)n);
    pp_status st = ins && outs && state && names && kept ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; st == PP_OK && i < s->n_in; i++) {
        names[i] = p->edges[s->in_edge[i]].value;
        if (!s->state_in[i]) st = concat(jobs, n, names[i], rows, &ins[i]);
    }
    int64_t b = s->next_b;
    pp_status ran = st;
    if (st == PP_OK) {
        ran = pp_state_inputs(s->store, handle, fresh, rows, state);
        for (int k = 0; ran == PP_OK && k < s->n_pairs; k++) ins[s->pairs[k].in] = state[k];
        s->next_b++; /* from here every rank hears of batch b */
        double t0 = now_ms();
        if (ran == PP_OK) ran = pp_executor_step(x->ex, b, 1, s->n_in, names, ins, outs);
        atomic_fetch_add(&s->f->st.busy_us, (long long)((now_ms() - t0) * 1000));
        if (ran == PP_OK) {
            pp_state_keep(s->store, handle, outs);
            atomic_store(&s->f->st.state_bytes, pp_state_bytes(s->store));
            st = send_headers(s, b, 0, rows, names, ins, handle, fresh);
        } else {
            st = send_headers(s, b, 2, rows, NULL, NULL, 0, 0);
        }
    }
    char why[1024];
    snprintf(why, sizeof why, "%s", pp_last_error());
    for (int i = 0; ins && i < s->n_in; i++) pp_tensor_free(ins[i]);
    free(ins);
    free(state);
    free(names);
    if (st != PP_OK) { /* a rank cannot be reached: the caller fails everything */
        for (int o = 0; outs && o < p->n_outputs; o++) pp_tensor_free(outs[o]);
        free(outs);
        free(kept);
        for (int i = 0; i < n; i++) respond(s, jobs[i], PP_SERVE_UNAVAILABLE, why);
        return pp_error(st, "%s", why);
    }
    if (ran != PP_OK) {
        for (int o = 0; outs && o < p->n_outputs; o++) pp_tensor_free(outs[o]);
        free(outs);
        free(kept);
        int lost = strncmp(why, SESSION_LOST_PREFIX, strlen(SESSION_LOST_PREFIX)) == 0;
        if (sess && lost) end_session(s, sess, why, 0); /* this request is told; the next starts afresh */
        for (int i = 0; i < n; i++) {
            if (n > 1) requeue_solo(s, jobs[i]);
            else respond(s, jobs[i], lost ? PP_SERVE_SESSION_LOST : PP_SERVE_FAILED, why);
        }
        return PP_OK;
    }
    if (sess) {
        sess->running = 1, sess->started = 1;
        int64_t held = pp_state_length(s->store, handle);
        if (held >= 0) sess->positions = held; /* the front holds some of its state: the exact count */
        else if (jobs[0]->toks) sess->positions = (fresh ? 0 : sess->positions) + jobs[0]->feeding - jobs[0]->n_fed;
        if (jobs[0]->toks) sess->owner = jobs[0]; /* until its last token */
        if (jobs[0]->took_next) sess->has_next = 0;
    }
    batch *bt = &s->inflight[s->n_inflight++];
    memset(bt, 0, sizeof *bt);
    bt->b = b;
    bt->rows = rows;
    bt->started = now_ms();
    bt->jobs = kept;
    memcpy(bt->jobs, jobs, sizeof *jobs * (size_t)n);
    bt->n_jobs = n;
    bt->outs = outs;
    bt->sess = sess;
    atomic_fetch_add(&s->f->st.batches, 1);
    atomic_fetch_add(&s->f->st.batch_rows, rows);
    return PP_OK;
}

/* Job j's rows [off, off+rows) of every output it wants. An output that is
 * not batch-major (a scalar loss) comes only from a batch of j alone: a job
 * that named it is run again alone (*again). */
static pp_status split_outputs(serve *s, batch *bt, job *j, int64_t off, int *again) {
    *again = 0;
    const pp_pipe *p = s->p;
    pp_response *r = calloc(1, sizeof *r);
    if (!r) return pp_error(PP_ERR_NOMEM, "out of memory");
    j->resp = r;
    r->id = j->req.id;
    r->error = strdup("");
    r->names = calloc((size_t)p->n_outputs + 1, sizeof *r->names);
    r->outputs = calloc((size_t)p->n_outputs + 1, sizeof *r->outputs);
    if (!r->error || !r->names || !r->outputs) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int o = 0; o < p->n_outputs; o++) {
        int wanted = j->req.n_outputs == 0;
        for (int k = 0; k < j->req.n_outputs; k++) wanted |= strcmp(j->req.outputs[k], p->outputs[o]) == 0;
        pp_tensor *t = bt->outs[o];
        if (!wanted || !t) continue;
        pp_tensor *part = NULL;
        if (t->ndim >= 1 && t->shape[0] == bt->rows) {
            PP_TRY(pp_tensor_slice0(t, off, j->rows, &part));
        } else if (bt->n_jobs == 1) {
            part = pp_tensor_retain(t);
        } else if (j->req.n_outputs) { /* asked for by name: it gets it, alone */
            *again = 1;
            return PP_OK;
        } else {
            continue; /* "every output" of a merged batch: the batch-major ones */
        }
        r->outputs[r->n_outputs] = part;
        if (!(r->names[r->n_outputs++] = strdup(p->outputs[o]))) return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    return PP_OK;
}

/* A batch answered without all its outputs (a rank failed it, or they were
 * late): what still comes for it is taken and dropped for a while, so the
 * mailbox never keeps it (answers are at steps no later step drops). */
static void bury(serve *s, int64_t b) {
    int i = s->n_graves < GRAVES ? s->n_graves++ : (int)(b % GRAVES);
    s->graves[i].b = b;
    s->graves[i].until = now_ms() + 4.0 * s->c->timeout_ms;
}

static void sweep_graves(serve *s) {
    const pp_serve_ctx *x = s->x;
    const pp_pipe *p = s->p;
    for (int g = 0; g < s->n_graves;) {
        int64_t b = s->graves[g].b;
        for (int r = 0; r < x->sched->nranks; r++) {
            if (r == s->front) continue;
            pp_tensor *t = NULL;
            pp_transport_key k = {PP_MSG_ACTIVATION, ANSWER_STEP + b, SERVE_MB + 1, s->first_stage[r],
                                  s->first_stage[s->front], FAIL_NAME};
            if (pp_transport_recv(x->t, &k, 0, &t) == PP_OK) pp_tensor_free(t);
            for (int o = 0; o < p->n_outputs; o++) {
                if (x->sched->stage_rank[p->output_stage[o]] != r || s->state_out[o]) continue;
                pp_transport_key ko = {PP_MSG_ACTIVATION, ANSWER_STEP + b, SERVE_MB, s->first_stage[r],
                                       s->first_stage[s->front], p->outputs[o]};
                if (pp_transport_recv(x->t, &ko, 0, &t) == PP_OK) pp_tensor_free(t);
            }
        }
        if (now_ms() > s->graves[g].until) s->graves[g] = s->graves[--s->n_graves];
        else g++;
    }
}

/* A message of j's stream: tokens, their text, whether more follow. */
static pp_response *gen_message(serve *s, job *j, const int64_t *toks, int n, int more) {
    pp_response *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->id = j->req.id;
    r->code = PP_SERVE_OK;
    r->error = strdup("");
    r->tokens = malloc(sizeof *r->tokens * (size_t)(n + 1));
    r->more = more;
    if (s->token_byte) r->text = calloc((size_t)n + 1, 1);
    if (!r->error || !r->tokens || (s->token_byte && !r->text)) {
        pp_response_free(r);
        return NULL;
    }
    memcpy(r->tokens, toks, sizeof *toks * (size_t)n);
    r->n_tokens = n;
    for (int i = 0, k = 0; r->text && i < n; i++)
        if (toks[i] >= 0 && toks[i] < s->n_token_byte && s->token_byte[toks[i]]) r->text[k++] = (char)s->token_byte[toks[i]];
    return r;
}

/* A generation's batch is back: choose the next token from the last
 * position's logits, stream it, and go on (the job waits in the queue for
 * its next step) or end. */
static void gen_next(serve *s, batch *bt, job *j) {
    const pp_tensor *lg = bt->outs[s->logits_out];
    if (!lg || lg->dtype != PP_F32 || lg->ndim < 1 || lg->shape[lg->ndim - 1] < 1) {
        respond(s, j, PP_SERVE_FAILED, "generate: the model's logits output is missing or not float32 [.., vocab]");
        return;
    }
    int64_t vocab = lg->shape[lg->ndim - 1], tok;
    const float *row = (const float *)lg->data + (pp_tensor_numel(lg) - vocab);
    if (pp_sample_token(row, vocab, j->req.temperature, j->req.top_k, &j->rng, &tok) != PP_OK) {
        respond(s, j, PP_SERVE_FAILED, pp_last_error());
        return;
    }
    j->n_fed = j->feeding;
    j->toks[j->n_toks++] = tok;
    j->produced++;
    atomic_fetch_add(&s->f->st.tokens, 1);
    int done = j->produced >= j->req.max_tokens || j->cancelled;
    for (int i = 0; i < j->req.n_stop; i++) done |= tok == j->req.stop[i];
    /* a model with state cannot take positions past serve.context: the next step would feed one more */
    done |= s->n_pairs && s->c->serve_context && j->sess && j->sess->positions + 1 > s->c->serve_context;
    if (done) {
        pp_response_free(j->resp);
        j->resp = gen_message(s, j, &tok, 1, 0);
        if (j->resp && j->cancelled) { /* the client asked to stop: told so (it drops it) and counted so */
            j->resp->code = PP_SERVE_FAILED;
            free(j->resp->error);
            j->resp->error = strdup("cancelled");
        }
        respond(s, j, j->cancelled ? PP_SERVE_FAILED : PP_SERVE_OK, j->cancelled ? "cancelled" : NULL);
        return;
    }
    job *note = calloc(1, sizeof *note);
    if (note && (note->resp = gen_message(s, j, &tok, 1, 1))) {
        zmq_msg_init(&note->who);
        zmq_msg_copy(&note->who, &j->who);
        note->req.id = j->req.id; /* a cancel for a client gone names it */
        note->partial = 1;
        pp_serve_front_answer(s->f, note);
    } else {
        free(note);
    }
    j->deadline = now_ms() + (j->req.timeout_ms ? j->req.timeout_ms : (uint32_t)s->c->timeout_ms);
    if (s->n_pending == s->cap_pending) { /* rare: the queue grew full while it ran */
        int cap = s->cap_pending ? 2 * s->cap_pending : 64;
        job **grown = realloc(s->pending, (size_t)cap * sizeof *grown);
        if (!grown) {
            respond(s, j, PP_SERVE_FAILED, "out of memory");
            return;
        }
        s->pending = grown, s->cap_pending = cap;
    }
    s->pending[s->n_pending++] = j; /* behind the others: generations take turns */
}

/* Takes what arrived for the oldest batch; answers it when complete. 1 if
 * it was finished. */
static pp_status poll_oldest(serve *s, int *done) {
    *done = 0;
    if (!s->n_inflight) return PP_OK;
    const pp_serve_ctx *x = s->x;
    const pp_pipe *p = s->p;
    batch *bt = &s->inflight[0];
    int missing = 0;
    char why[1200] = "";
    for (int o = 0; o < p->n_outputs; o++) {
        int r = x->sched->stage_rank[p->output_stage[o]];
        if (bt->outs[o] || r == s->front || s->state_out[o]) continue;
        pp_transport_key k = {PP_MSG_ACTIVATION, ANSWER_STEP + bt->b, SERVE_MB, s->first_stage[r],
                              s->first_stage[s->front], p->outputs[o]};
        /* what the loop's poll moved to the mailbox: no socket call, no
         * error built for each miss (peers_alive judges the ranks) */
        PP_TRY(pp_transport_take(x->t, &k, &bt->outs[o]));
        if (!bt->outs[o]) missing++;
    }
    for (int r = 0; missing && r < x->sched->nranks; r++) { /* every rank's, so none is left behind */
        if (r == s->front) continue;
        pp_transport_key k = {PP_MSG_ACTIVATION, ANSWER_STEP + bt->b, SERVE_MB + 1, s->first_stage[r],
                              s->first_stage[s->front], FAIL_NAME};
        pp_tensor *f = NULL;
        PP_TRY(pp_transport_take(x->t, &k, &f));
        if (f && !why[0]) snprintf(why, sizeof why, "rank %d: %.*s", r, (int)f->nbytes, (const char *)f->data);
        pp_tensor_free(f);
    }
    double age = now_ms() - bt->started;
    if (missing && !why[0] && age > 2.0 * s->c->timeout_ms)
        snprintf(why, sizeof why, "batch %" PRId64 ": the model outputs did not come back within %d ms", bt->b,
                 2 * s->c->timeout_ms);
    if (missing && !why[0]) return PP_OK;
    if (missing) bury(s, bt->b); /* what still comes for it is drained, never kept */
    if (bt->sess) {
        bt->sess->running = 0;
        /* a rank after the failing one kept its state, one before did not: it cannot go on */
        /* the request is told; a "failed" one leaves the next told "session lost" too */
        if (why[0]) end_session(s, bt->sess, why, strstr(why, SESSION_LOST_PREFIX ":") == NULL);
    }
    int64_t off = 0;
    for (int i = 0; i < bt->n_jobs; i++) {
        job *j = bt->jobs[i];
        int64_t rows = j->rows; /* a job handed back is the front thread's (it frees it) */
        if (why[0]) {
            int lost = strstr(why, SESSION_LOST_PREFIX ":") != NULL;
            respond(s, j, lost ? PP_SERVE_SESSION_LOST : PP_SERVE_FAILED, why);
        } else if (j->toks) {
            gen_next(s, bt, j);
        } else {
            int again = 0;
            pp_status sp = split_outputs(s, bt, j, off, &again);
            if (sp == PP_OK && again) { /* it wants an output only a batch of its own gives */
                pp_response_free(j->resp);
                j->resp = NULL;
                requeue_solo(s, j);
            } else if (sp != PP_OK) {
                pp_response_free(j->resp);
                j->resp = NULL;
                respond(s, j, PP_SERVE_FAILED, pp_last_error());
            } else {
                respond(s, j, PP_SERVE_OK, NULL);
            }
        }
        off += rows;
    }
    for (int o = 0; o < p->n_outputs; o++) pp_tensor_free(bt->outs[o]);
    free(bt->outs);
    free(bt->jobs);
    memmove(s->inflight, s->inflight + 1, sizeof *s->inflight * (size_t)(s->n_inflight - 1));
    s->n_inflight--;
    *done = 1;
    return PP_OK;
}

static void fail_all(serve *s, int code, const char *why) {
    for (int i = 0; i < s->n_inflight; i++) {
        batch *bt = &s->inflight[i];
        for (int k = 0; k < bt->n_jobs; k++) respond(s, bt->jobs[k], code, why);
        for (int o = 0; o < s->p->n_outputs; o++) pp_tensor_free(bt->outs[o]);
        free(bt->outs);
        free(bt->jobs);
    }
    s->n_inflight = 0;
    for (int i = 0; i < s->n_pending; i++) respond(s, s->pending[i], code, why);
    s->n_pending = 0;
}

static pp_status peers_alive(const serve *s);
static void take_stats(serve *s);

static pp_status front_rank(serve *s) {
    const pp_serve_ctx *x = s->x;
    pp_status st = PP_OK;
    job **picked = malloc(sizeof *picked * (size_t)(s->c->serve_max_queue + 1));
    if (!picked) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_info("serve: rank %d answers requests at %s", x->rank, s->c->serve_endpoint);
    double log_at = now_ms() + STATS_LOG_MS, check_at = 0, stats_at = 0;
    while (!atomic_load(x->stop) && st == PP_OK) {
        if (now_ms() >= log_at) { /* the periodic stats line */
            char *json = pp_serve_front_stats(s->f);
            if (json) pp_info("serve: %s", json);
            free(json);
            log_at = now_ms() + STATS_LOG_MS;
        }
        take_jobs(s);
        double now = now_ms();
        expire_pending(s, now);
        run_ends(s);
        expire_sessions(s, now);
        if (s->n_drops && !s->n_inflight && !s->n_pending) /* dropped state goes now, not with the next batch */
            st = send_headers(s, s->next_b++, 2, 0, NULL, NULL, 0, 0);
        int progressed = 0;
        double wait_ms = 100;
        if (s->n_pending && s->n_inflight < s->max_inflight) {
            int64_t rows;
            int n = pick(s, now, picked, &rows, &wait_ms);
            if (n) st = launch(s, picked, n, rows), progressed = 1;
        }
        int done = 1;
        /* what arrived while the stage ran goes to the mailbox, once per
         * pass: poll_oldest only looks there (pp_transport_take) */
        if (st == PP_OK && s->n_inflight) st = pp_transport_poll(x->t, 0);
        while (st == PP_OK && done && s->n_inflight) {
            st = poll_oldest(s, &done);
            progressed |= done;
        }
        if (s->n_graves) sweep_graves(s);
        if (now >= stats_at) { /* the ranks' reports, busy or not */
            stats_at = now + 200;
            take_stats(s);
        }
        if (progressed || st != PP_OK) continue;
        if (now >= check_at) { /* an idle pipeline notices a lost rank too: degraded at once */
            check_at = now + 200;
            if ((st = pp_transport_poll(x->t, 0)) == PP_OK) st = peers_alive(s);
            if (st != PP_OK) continue;
        }
        if (s->n_inflight) {
            st = pp_transport_poll(x->t, 1); /* outputs on their way */
        } else {
            long ms = s->n_pending ? (long)(wait_ms > 0 ? wait_ms + 1 : 0) : 100;
            pp_share_cores_idle(ms > 0); /* nothing in flight: lend the threads (lib/core_share.c) */
            zmq_poll((zmq_pollitem_t[]){{s->f->pair_worker, 0, ZMQ_POLLIN, 0}}, 1, ms);
            pp_share_cores_idle(0);
        }
    }
    char why[1024];
    snprintf(why, sizeof why, "%s", st == PP_OK ? "the service is shutting down" : pp_last_error());
    if (st == PP_OK) { /* let what is in the pipeline finish */
        double until = now_ms() + s->c->timeout_ms;
        while (s->n_inflight && now_ms() < until && st == PP_OK) {
            int done;
            st = poll_oldest(s, &done);
            if (st == PP_OK && !done) st = pp_transport_poll(x->t, 5);
        }
    }
    if (st == PP_OK) {
        pp_serve_front_set_state(s->f, PP_FRONT_CLOSING, why);
    } else { /* the front stays up: told how the service is (the worker may rejoin) */
        char told[1100];
        snprintf(told, sizeof told, "degraded: %s", why);
        pp_serve_front_set_state(s->f, PP_FRONT_DEGRADED, told);
        /* every session has state on every rank: none can go on */
        char lost[1100];
        snprintf(lost, sizeof lost, SESSION_LOST_PREFIX ": the service lost a rank (%s)", why);
        for (int i = 0; i < s->n_sessions; i++)
            if (s->sessions[i]->name) remember_lost(s, s->sessions[i]->name, lost);
    }
    take_jobs(s);
    fail_all(s, PP_SERVE_UNAVAILABLE, why);
    /* requests that were on their way to this thread when the state changed */
    for (double until = now_ms() + 1000; atomic_load(&s->f->st.in_system) > 0 && now_ms() < until;) {
        zmq_poll((zmq_pollitem_t[]){{s->f->pair_worker, 0, ZMQ_POLLIN, 0}}, 1, 5);
        take_jobs(s);
        fail_all(s, PP_SERVE_UNAVAILABLE, why);
    }
    /* the other ranks end after the batch they wait for: a header saying so
     * (after a failure they rejoin instead, told by the worker's abort) */
    if (st == PP_OK) (void)send_headers(s, s->next_b, 1, 0, NULL, NULL, 0, 0);
    free(picked);
    return st;
}

/* A stage rank's counters to the front, at most every STATS_EVERY_MS
 * (force: now, when there is news); best effort. */
static void report_stats(serve *s, int force) {
    double now = now_ms();
    if (!s->stats_dirty || (!force && now < s->stats_at)) return;
    pp_tensor *t = NULL;
    if (pp_tensor_new(PP_I64, 1, (int64_t[]){4}, &t) != PP_OK) return;
    int64_t *v = t->data;
    v[0] = (int64_t)(pp_executor_compute_ms(s->x->ex) * 1000), v[1] = s->rank_batches;
    v[2] = pp_state_bytes(s->store), v[3] = pp_state_count(s->store);
    pp_transport_key k = {PP_MSG_ACTIVATION, STATS_STEP + s->stats_sent, SERVE_MB + 2, s->first_stage[s->x->rank],
                          s->first_stage[s->front], STATS_NAME};
    if (pp_transport_send(s->x->t, &k, t) == PP_OK) s->stats_sent++;
    pp_tensor_free(t);
    s->stats_at = now + STATS_EVERY_MS;
    s->stats_dirty = 0;
}

/* The front takes the ranks' reports that came, and notes its own. */
static void take_stats(serve *s) {
    struct pp_serve_rank_stats *rs = s->f->st.ranks;
    for (int r = 0; r < s->x->sched->nranks && r < s->f->st.n_ranks; r++) {
        if (r == s->front) continue;
        pp_tensor *t = NULL;
        for (;;) {
            pp_transport_key k = {PP_MSG_ACTIVATION, STATS_STEP + s->stats_seq[r], SERVE_MB + 2, s->first_stage[r],
                                  s->first_stage[s->front], STATS_NAME};
            if (pp_transport_recv(s->x->t, &k, 0, &t) != PP_OK) break;
            s->stats_seq[r]++;
            if (t->dtype == PP_I64 && pp_tensor_numel(t) == 4) {
                const int64_t *v = t->data;
                atomic_store(&rs[r].compute_us, v[0]), atomic_store(&rs[r].batches, v[1]);
                atomic_store(&rs[r].state_bytes, v[2]), atomic_store(&rs[r].sessions, v[3]);
            }
            pp_tensor_free(t);
        }
    }
    if (s->front < s->f->st.n_ranks) {
        atomic_store(&rs[s->front].compute_us, (long long)(pp_executor_compute_ms(s->x->ex) * 1000));
        atomic_store(&rs[s->front].batches, atomic_load(&s->f->st.batches));
        atomic_store(&rs[s->front].state_bytes, pp_state_bytes(s->store));
        atomic_store(&rs[s->front].sessions, pp_state_count(s->store));
    }
    atomic_store(&s->f->st.pending, s->n_pending);
    atomic_store(&s->f->st.inflight, s->n_inflight);
}

/* PP_ERR_PEER naming the first rank that died, went silent or closed (the
 * worker then rejoins, when rejoin is on); else PP_OK. */
static pp_status peers_alive(const serve *s) {
    for (int r = 0; r < s->x->sched->nranks; r++) {
        if (r == s->x->rank) continue;
        pp_peer_state ps = pp_transport_peer_state(s->x->t, r);
        if (ps == PP_PEER_DOWN || ps == PP_PEER_CLOSED || ps == PP_PEER_REJECTED)
            return pp_error(PP_ERR_PEER, "serve: rank %d (stage %d) is %s", r, s->first_stage[r],
                            pp_peer_state_name(ps));
    }
    return PP_OK;
}

/* ---- the other ranks ---- */

static pp_status stage_rank(serve *s) {
    const pp_serve_ctx *x = s->x;
    const pp_pipe *p = s->p;
    int me = s->first_stage[x->rank], fr = s->first_stage[s->front];
    const char **names = calloc((size_t)s->n_in + 1, sizeof *names);
    pp_tensor **ins = calloc((size_t)s->n_in + 1, sizeof *ins), **outs = calloc((size_t)p->n_outputs + 1, sizeof *outs);
    pp_tensor **state = calloc((size_t)s->n_pairs + 1, sizeof *state);
    pp_status st = names && ins && outs && state ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int64_t b = 0; st == PP_OK; b++) {
        pp_tensor *hdr = NULL;
        pp_transport_key k = {PP_MSG_ACTIVATION, b, SERVE_MB, fr, me, BATCH_NAME};
        while ((st = pp_transport_recv(x->t, &k, 200, &hdr)) == PP_ERR_TIMEOUT && !atomic_load(x->stop)) {
            report_stats(s, 1);
            if ((st = peers_alive(s)) == PP_OK) continue;
            char why[512]; /* the lost peer, not the wait below, is what the others are told */
            snprintf(why, sizeof why, "%s", pp_last_error());
            /* a header sent before the peer went (the last one, at a shutdown) still counts */
            if (pp_transport_recv(x->t, &k, 500, &hdr) == PP_OK) st = PP_OK;
            else st = pp_error(PP_ERR_PEER, "%s", why);
            break;
        }
        if (st == PP_ERR_TIMEOUT) { /* stopped while idle */
            st = PP_OK;
            break;
        }
        if (st != PP_OK) break;
        const int64_t *h = hdr->data;
        int64_t numel = pp_tensor_numel(hdr);
        if (hdr->dtype != PP_I64 || numel < HDR_LEN || h[4] < 0 || h[4] > numel - HDR_LEN) {
            pp_tensor_free(hdr);
            st = pp_error(PP_ERR_PEER, "serve: rank %d: a malformed batch header from the front", x->rank);
            break;
        }
        int64_t flags = h[0], rows = h[1], session = h[2];
        int fresh = h[3] != 0;
        for (int64_t d = 0; d < h[4]; d++) pp_state_drop(s->store, h[HDR_LEN + d]);
        pp_tensor_free(hdr);
        if (flags & 1) break; /* the front is done */
        if (flags & 2) continue; /* stage 0 refused this batch */
        int n = 0;
        for (int i = 0; st == PP_OK && i < s->n_in; i++) {
            const pp_pipe_edge *e = &p->edges[s->in_edge[i]];
            if (!consumes(s, i, x->rank) || s->state_in[i]) continue;
            pp_transport_key ki = {PP_MSG_ACTIVATION, b, SERVE_MB, fr, me, e->value};
            names[n] = e->value;
            st = pp_transport_recv(x->t, &ki, -1, &ins[n]);
            if (st == PP_OK) n++;
        }
        pp_status ran = st == PP_OK ? pp_state_inputs(s->store, session, fresh, rows, state) : st;
        for (int k = 0; ran == PP_OK && k < s->n_pairs; k++)
            if (state[k]) names[n] = p->edges[s->in_edge[s->pairs[k].in]].value, ins[n++] = state[k];
        if (ran == PP_OK) ran = pp_executor_step(x->ex, b, 1, n, names, ins, outs);
        if (ran == PP_OK) pp_state_keep(s->store, session, outs);
        s->rank_batches++;
        s->stats_dirty = 1;
        for (int i = 0; i < n; i++) pp_tensor_free(ins[i]), ins[i] = NULL;
        if (ran == PP_ERR_PEER && pp_transport_abort_reason(x->t, NULL)) {
            st = ran;
            break;
        }
        for (int o = 0; o < p->n_outputs; o++) {
            if (ran == PP_OK && outs[o]) {
                pp_transport_key ko = {PP_MSG_ACTIVATION, ANSWER_STEP + b, SERVE_MB, me, fr, p->outputs[o]};
                st = pp_transport_send(x->t, &ko, outs[o]);
            }
            pp_tensor_free(outs[o]);
            outs[o] = NULL;
        }
        if (ran != PP_OK) { /* this batch only: the front answers its requests, the service goes on */
            const char *why = pp_last_error();
            pp_warn("serve: rank %d, batch %" PRId64 ": %s", x->rank, b, why);
            pp_tensor *f;
            size_t len = strlen(why);
            st = pp_tensor_new(PP_U8, 1, (int64_t[]){(int64_t)len}, &f);
            if (st == PP_OK) {
                memcpy(f->data, why, len);
                pp_transport_key kf = {PP_MSG_ACTIVATION, ANSWER_STEP + b, SERVE_MB + 1, me, fr, FAIL_NAME};
                st = pp_transport_send(x->t, &kf, f);
                pp_tensor_free(f);
            }
        }
        if (st == PP_OK) report_stats(s, 0);
    }
    free(names);
    free(ins);
    free(outs);
    free(state);
    return st;
}

/* ---- setup ---- */

static void serve_free(serve *s) {
    free(s->first_stage);
    free(s->in_edge);
    free(s->pending);
    free(s->inflight);
    for (int i = 0; i < s->n_sessions; i++) { /* every job was answered: nothing refers to them */
        free(s->sessions[i]->name);
        free(s->sessions[i]);
    }
    free(s->sessions);
    pp_state_store_free(s->store);
    free(s->pairs);
    free(s->state_in);
    free(s->state_out);
    free(s->token_byte);
    free(s->drops);
    free(s->stats_seq);
}

/* The model's state pairs and this rank's store; the generation's token
 * input and logits output; the vocabulary for text prompts. */
static pp_status open_state(serve *s) {
    const pp_pipe *p = s->p;
    PP_TRY(pp_state_pairs(s->c, p, s->x->sched, s->n_in, s->in_edge, &s->pairs, &s->n_pairs));
    s->state_in = calloc((size_t)s->n_in + 1, sizeof *s->state_in);
    s->state_out = calloc((size_t)p->n_outputs + 1, sizeof *s->state_out);
    if (!s->state_in || !s->state_out) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < s->n_pairs; k++) s->state_in[s->pairs[k].in] = s->state_out[s->pairs[k].out] = k + 1;
    PP_TRY(pp_state_store_new(p, s->in_edge, s->pairs, s->n_pairs, s->x->rank, s->c->serve_session_max_bytes,
                              &s->store));
    s->token_in = s->logits_out = -1;
    for (int i = 0; i < s->n_in; i++) {
        if (s->state_in[i]) continue;
        const pp_pipe_edge *e = &p->edges[s->in_edge[i]];
        if (s->token_in >= 0 || (e->dtype != PP_I64 && e->dtype != PP_DTYPE_UNDEFINED)) { /* not one int64 input */
            s->token_in = -1;
            break;
        }
        s->token_in = i;
    }
    for (int o = 0; o < p->n_outputs; o++)
        if (strcmp(p->outputs[o], "logits") == 0) s->logits_out = o;
    int mine = 0;
    for (int k = 0; k < s->n_pairs; k++) mine += s->pairs[k].rank == s->x->rank;
    if (mine) pp_info("serve: rank %d: %d state input%s kept per session", s->x->rank, mine, mine == 1 ? "" : "s");
    if (!s->c->serve_vocab) return PP_OK;
    PP_TRY(pp_text_vocab(s->c->serve_vocab, s->vocab));
    for (int c = 0; c < 256; c++)
        if (s->vocab[c] >= s->n_token_byte) s->n_token_byte = s->vocab[c] + 1;
    if (s->n_token_byte > (1 << 24)) return pp_error(PP_ERR_INVALID, "%s: token ids up to %lld", s->c->serve_vocab, (long long)s->n_token_byte);
    if (!(s->token_byte = calloc((size_t)s->n_token_byte + 1, 1))) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int c = 1; c < 256; c++)
        if (s->vocab[c] >= 0) s->token_byte[s->vocab[c]] = (unsigned char)c;
    return PP_OK;
}

pp_status pp_serve_run(const pp_serve_ctx *x) {
    serve s;
    memset(&s, 0, sizeof s);
    s.x = x;
    s.c = x->c;
    s.p = x->p;
    s.f = x->front;
    s.front = x->sched->stage_rank[0];
    s.first_stage = malloc(sizeof(int) * (size_t)x->sched->nranks);
    s.in_edge = malloc(sizeof(int) * ((size_t)x->p->n_edges + 1));
    s.max_inflight = x->c->serve_max_inflight > 0 ? x->c->serve_max_inflight : x->sched->nranks + 1;
    s.inflight = calloc((size_t)s.max_inflight + 1, sizeof *s.inflight);
    pp_status st = s.first_stage && s.in_edge && s.inflight ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int r = 0; st == PP_OK && r < x->sched->nranks; r++) s.first_stage[r] = -1;
    for (int stg = x->sched->nstages - 1; st == PP_OK && stg >= 0; stg--) s.first_stage[x->sched->stage_rank[stg]] = stg;
    for (int e = 0; st == PP_OK && e < x->p->n_edges; e++)
        if (x->p->edges[e].producer < 0) s.in_edge[s.n_in++] = e;
    if (st == PP_OK) st = open_state(&s);
    if (st == PP_OK && x->rank != s.front) {
        st = stage_rank(&s);
        serve_free(&s);
        return st;
    }
    if (st == PP_OK && !s.f) st = pp_error(PP_ERR_STATE, "serve: rank %d holds stage 0 but has no front endpoint", x->rank);
    if (st == PP_OK && !(s.stats_seq = calloc((size_t)x->sched->nranks + 1, sizeof *s.stats_seq)))
        st = pp_error(PP_ERR_NOMEM, "out of memory");
    if (st == PP_OK) {
        pp_serve_front_set_state(s.f, PP_FRONT_SERVING, NULL);
        st = front_rank(&s);
    }
    serve_free(&s);
    return st;
}

pp_status pp_serve_front_for(const pp_config *c, const pp_schedule *sched, int rank, pp_serve_front **out) {
    *out = NULL;
    if (sched->stage_rank[0] != rank) return PP_OK;
    return pp_serve_front_open(c, rank, out);
}

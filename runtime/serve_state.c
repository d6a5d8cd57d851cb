/* Sessions' model state on its rank (serve_state.h). */
#include "serve_state.h"

#include <stdlib.h>
#include <string.h>

#include "log_internal.h"
#include "pippin/tensor.h"
#include "status_internal.h"
#include "timing.h"

#define INPUT_PREFIX "past_key_values"
#define OUTPUT_PREFIX "present"

static int output_index(const pp_pipe *p, const char *name) {
    for (int o = 0; o < p->n_outputs; o++)
        if (strcmp(p->outputs[o], name) == 0) return o;
    return -1;
}

static int input_index(const pp_pipe *p, int n_in, const int *in_edge, const char *name) {
    for (int i = 0; i < n_in; i++)
        if (strcmp(p->edges[in_edge[i]].value, name) == 0) return i;
    return -1;
}

/* Checks one pair and fills in its rank and growing dim. */
static pp_status check_pair(const pp_pipe *p, const pp_schedule *sched, const int *in_edge, pp_state_pair *pr) {
    const pp_pipe_edge *e = &p->edges[in_edge[pr->in]];
    const char *out = p->outputs[pr->out];
    pr->rank = sched->stage_rank[p->output_stage[pr->out]];
    for (int c = 0; c < e->n_consumers; c++)
        if (sched->stage_rank[e->consumers[c]] != pr->rank)
            return pp_error(PP_ERR_INVALID,
                            "serve: state '%s' -> '%s': the output is computed on rank %d but stage %d on rank %d reads "
                            "the input; state must stay on one rank (split the model so both are in one stage)",
                            out, e->value, pr->rank, e->consumers[c], sched->stage_rank[e->consumers[c]]);
    pr->grow_dim = -1;
    if (e->ndim < 2)
        return pp_error(PP_ERR_INVALID, "serve: state input '%s' needs a known rank of at least 2 (batch, growing dim)",
                        e->value);
    for (int d = 1; d < e->ndim; d++) {
        const char *dim = e->dims[d];
        char *end = NULL;
        if (dim && (strtoll(dim, &end, 10), end != dim && !*end)) continue; /* fixed */
        if (pr->grow_dim >= 0 || !dim)
            return pp_error(PP_ERR_INVALID,
                            "serve: state input '%s' needs fixed dims besides the batch (dim 0) and one growing dim; "
                            "dims %d and %d are not fixed",
                            e->value, pr->grow_dim >= 0 ? pr->grow_dim : d, d);
        pr->grow_dim = d;
    }
    if (pr->grow_dim < 0)
        return pp_error(PP_ERR_INVALID, "serve: state input '%s' has no growing (symbolic) dim besides the batch",
                        e->value);
    return PP_OK;
}

pp_status pp_state_pairs(const pp_config *c, const pp_pipe *p, const pp_schedule *sched, int n_in, const int *in_edge,
                         pp_state_pair **pairs, int *n) {
    *pairs = calloc((size_t)p->n_outputs + 1, sizeof **pairs);
    *n = 0;
    if (!*pairs) return pp_error(PP_ERR_NOMEM, "out of memory");
    if (c->n_serve_state) {
        for (int k = 0; k < c->n_serve_state; k++) {
            int o = output_index(p, c->serve_state[k].key), i = input_index(p, n_in, in_edge, c->serve_state[k].value);
            if (o < 0) return pp_error(PP_ERR_NOT_FOUND, "serve.state: '%s' is not a model output", c->serve_state[k].key);
            if (i < 0) return pp_error(PP_ERR_NOT_FOUND, "serve.state: '%s' is not a model input", c->serve_state[k].value);
            for (int j = 0; j < *n; j++)
                if ((*pairs)[j].in == i || (*pairs)[j].out == o)
                    return pp_error(PP_ERR_INVALID, "serve.state: '%s' or '%s' named twice", c->serve_state[k].key,
                                    c->serve_state[k].value);
            (*pairs)[*n].in = i, (*pairs)[*n].out = o;
            PP_TRY(check_pair(p, sched, in_edge, &(*pairs)[(*n)++]));
        }
        return PP_OK;
    }
    for (int o = 0; o < p->n_outputs; o++) {
        const char *name = p->outputs[o];
        if (strncmp(name, OUTPUT_PREFIX, strlen(OUTPUT_PREFIX)) != 0) continue;
        char in_name[512];
        snprintf(in_name, sizeof in_name, "%s%s", INPUT_PREFIX, name + strlen(OUTPUT_PREFIX));
        int i = input_index(p, n_in, in_edge, in_name);
        if (i < 0) continue;
        (*pairs)[*n].in = i, (*pairs)[*n].out = o;
        PP_TRY(check_pair(p, sched, in_edge, &(*pairs)[(*n)++]));
    }
    return PP_OK;
}

typedef struct held {
    int64_t h;
    pp_tensor **t; /* per pair; NULL where not on this rank */
    int64_t bytes;
    double used;
} held;

struct pp_state_store {
    const pp_pipe *p;
    const int *in_edge;
    const pp_state_pair *pairs;
    int n_pairs, rank;
    int64_t max_bytes, bytes;
    held *held;
    int n_held, cap_held;
};

pp_status pp_state_store_new(const pp_pipe *p, const int *in_edge, const pp_state_pair *pairs, int n_pairs, int rank,
                             int64_t max_bytes, pp_state_store **out) {
    pp_state_store *st = calloc(1, sizeof *st);
    if (!st) return pp_error(PP_ERR_NOMEM, "out of memory");
    st->p = p, st->in_edge = in_edge, st->pairs = pairs, st->n_pairs = n_pairs, st->rank = rank;
    st->max_bytes = max_bytes;
    *out = st;
    return PP_OK;
}

static void free_held(pp_state_store *st, held *x) {
    for (int k = 0; k < st->n_pairs; k++) pp_tensor_free(x->t[k]);
    free(x->t);
    st->bytes -= x->bytes;
}

void pp_state_store_free(pp_state_store *st) {
    if (!st) return;
    for (int i = 0; i < st->n_held; i++) free_held(st, &st->held[i]);
    free(st->held);
    free(st);
}

static held *find(pp_state_store *st, int64_t h) {
    for (int i = 0; i < st->n_held; i++)
        if (st->held[i].h == h) return &st->held[i];
    return NULL;
}

void pp_state_drop(pp_state_store *st, int64_t h) {
    held *x = find(st, h);
    if (!x) return;
    free_held(st, x);
    *x = st->held[--st->n_held];
}

pp_status pp_state_inputs(pp_state_store *st, int64_t h, int fresh, int64_t rows, pp_tensor **ins) {
    for (int k = 0; k < st->n_pairs; k++) ins[k] = NULL;
    held *x = fresh || !h ? NULL : find(st, h);
    if (!fresh && h && !x)
        return pp_error(PP_ERR_NOT_FOUND,
                        "session lost: rank %d no longer holds its state (dropped to stay within "
                        "serve.session_max_bytes, or the rank restarted)",
                        st->rank);
    for (int k = 0; k < st->n_pairs; k++) {
        const pp_state_pair *pr = &st->pairs[k];
        if (pr->rank != st->rank) continue;
        if (x && x->t[k]) {
            if (x->t[k]->shape[0] != rows) {
                for (int j = 0; j < k; j++) pp_tensor_free(ins[j]), ins[j] = NULL;
                return pp_error(PP_ERR_INVALID, "the session's state has %lld rows, this request %lld",
                                (long long)x->t[k]->shape[0], (long long)rows);
            }
            ins[k] = pp_tensor_retain(x->t[k]);
            continue;
        }
        const pp_pipe_edge *e = &st->p->edges[st->in_edge[pr->in]];
        int64_t shape[PP_MAX_DIMS];
        shape[0] = rows;
        for (int d = 1; d < e->ndim; d++) shape[d] = d == pr->grow_dim ? 0 : strtoll(e->dims[d], NULL, 10);
        pp_status s = pp_tensor_new(e->dtype != PP_DTYPE_UNDEFINED ? e->dtype : PP_F32, e->ndim, shape, &ins[k]);
        if (s != PP_OK) {
            for (int j = 0; j < k; j++) pp_tensor_free(ins[j]), ins[j] = NULL;
            return s;
        }
    }
    return PP_OK;
}

void pp_state_keep(pp_state_store *st, int64_t h, pp_tensor **outs) {
    held *x = h ? find(st, h) : NULL;
    if (h && !x && st->n_held == st->cap_held) {
        int cap = st->cap_held ? 2 * st->cap_held : 16;
        held *grown = realloc(st->held, sizeof *grown * (size_t)cap);
        if (grown) st->held = grown, st->cap_held = cap;
    }
    if (h && !x && st->n_held < st->cap_held) {
        x = &st->held[st->n_held];
        memset(x, 0, sizeof *x);
        x->t = calloc((size_t)st->n_pairs + 1, sizeof *x->t);
        if (x->t) x->h = h, st->n_held++;
        else x = NULL;
    }
    for (int k = 0; k < st->n_pairs; k++) {
        const pp_state_pair *pr = &st->pairs[k];
        if (pr->rank != st->rank) continue;
        pp_tensor *t = outs[pr->out];
        outs[pr->out] = NULL;
        if (!x) { /* a one-off, or no memory to keep it: the next request finds it lost */
            pp_tensor_free(t);
            continue;
        }
        if (x->t[k]) st->bytes -= (int64_t)x->t[k]->nbytes, x->bytes -= (int64_t)x->t[k]->nbytes;
        pp_tensor_free(x->t[k]);
        x->t[k] = t;
        if (t) st->bytes += (int64_t)t->nbytes, x->bytes += (int64_t)t->nbytes;
    }
    if (!x) return;
    x->used = pp_monotonic_ms();
    while (st->bytes > st->max_bytes) { /* the least recently used first; h last */
        held *lru = NULL;
        for (int i = 0; i < st->n_held; i++)
            if (st->held[i].h != h && (!lru || st->held[i].used < lru->used)) lru = &st->held[i];
        if (!lru) lru = find(st, h);
        if (!lru) break;
        pp_warn("serve: rank %d drops session %lld's state (%lld bytes) to stay within serve.session_max_bytes %lld",
                st->rank, (long long)lru->h, (long long)lru->bytes, (long long)st->max_bytes);
        pp_state_drop(st, lru->h);
    }
}

int64_t pp_state_length(pp_state_store *st, int64_t h) {
    held *x = h ? find(st, h) : NULL;
    for (int k = 0; x && k < st->n_pairs; k++)
        if (x->t[k]) return x->t[k]->shape[st->pairs[k].grow_dim];
    return -1;
}

int pp_state_count(const pp_state_store *st) { return st->n_held; }
int64_t pp_state_bytes(const pp_state_store *st) { return st->bytes; }

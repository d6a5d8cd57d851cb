/* Per-node costs for balancing stages: runs one training step of the model
 * (its forward and the autodiff backward) on zero inputs at a sample size,
 * node by node, and records each forward node's time, the time of the
 * gradient nodes made for it (by their names, "<node>/grad/<op>"), the
 * parameter and stash bytes it brings into a stage and the activation
 * bytes that cross a cut before it. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pippin/autodiff.h"
#include "pippin/balance.h"
#include "pippin/exec.h"
#include "autodiff_unfused.h"
#include "op.h"
#include "split_internal.h"
#include "status_internal.h"

void pp_node_costs_options_init(pp_node_costs_options *o) {
    memset(o, 0, sizeof *o);
    o->batch = 8;
    o->repeats = 3;
    o->source = PP_COST_MEASURED;
}

void pp_node_costs_free(pp_node_costs *c) {
    if (!c) return;
    free(c->compute);
    free(c->fwd_ms);
    free(c->bwd_ms);
    free(c->param_bytes);
    free(c->stash_bytes);
    free(c->cross_bytes);
    free(c);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A copy of g with the same value and node order (autodiff appends to it). */
static pp_status copy_graph(const pp_graph *g, pp_graph **out) {
    pp_graph *t;
    PP_TRY(pp_graph_new(g->name ? g->name : "model", &t));
    t->opset = g->opset;
    int *map = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    pp_status s = map ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int v = 0; s == PP_OK && v < g->n_values; v++) map[v] = -1;
    for (int i = 0; s == PP_OK && i < g->n_inputs; i++) {
        const pp_value *v = &g->values[g->inputs[i]];
        int id;
        s = pp_graph_add_input(t, v->name, v->dtype, v->ndim, v->ndim > 0 ? v->shape : NULL, &id);
        for (int d = 0; s == PP_OK && d < v->ndim; d++)
            if (v->dim_names[d] && !(t->values[id].dim_names[d] = strdup(v->dim_names[d])))
                s = pp_error(PP_ERR_NOMEM, "out of memory");
        map[g->inputs[i]] = id;
    }
    for (int v = 0; s == PP_OK && v < g->n_values; v++) {
        const pp_value *val = &g->values[v];
        if ((val->kind == PP_VALUE_PARAM || val->kind == PP_VALUE_CONST) && val->data)
            s = pp_graph_add_initializer(t, val->name, val->kind, pp_tensor_retain(val->data), &map[v]);
    }
    for (int i = 0; s == PP_OK && i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        int in_map[64];
        if (n->n_in > 64) {
            s = pp_node_error(n, PP_ERR_UNSUPPORTED, "more than 64 inputs");
            break;
        }
        for (int k = 0; k < n->n_in; k++) in_map[k] = n->in[k] >= 0 ? map[n->in[k]] : -1;
        int nid;
        s = pp_graph_copy_node(t, g, i, in_map, &nid);
        for (int k = 0; s == PP_OK && k < n->n_out; k++)
            if (n->out[k] >= 0) map[n->out[k]] = t->nodes[nid].out[k];
    }
    for (int o = 0; s == PP_OK && o < g->n_outputs; o++) s = pp_graph_add_output(t, map[g->outputs[o]]);
    if (s == PP_OK) s = pp_graph_resolve(t);
    free(map);
    if (s != PP_OK) {
        pp_graph_free(t);
        return s;
    }
    *out = t;
    return PP_OK;
}

/* Size of symbolic dim `name` from "name=N" entries; 0 if not given. */
static int64_t dim_given(const pp_node_costs_options *o, const char *name) {
    size_t len = strlen(name);
    for (int k = 0; k < o->n_dims; k++)
        if (strncmp(o->dims[k], name, len) == 0 && o->dims[k][len] == '=') return atoll(o->dims[k] + len + 1);
    return 0;
}

static pp_status sample_input(const pp_value *v, const pp_node_costs_options *o, pp_tensor **out) {
    int64_t shape[PP_MAX_DIMS];
    if (v->ndim < 0 || v->dtype == PP_DTYPE_UNDEFINED)
        return pp_error(PP_ERR_UNSUPPORTED, "input '%s' has no declared type; cannot measure node costs", v->name);
    for (int d = 0; d < v->ndim; d++) {
        shape[d] = v->shape[d];
        if (shape[d] >= 0) continue;
        int64_t given = v->dim_names[d] ? dim_given(o, v->dim_names[d]) : 0;
        shape[d] = given > 0 ? given : d == 0 ? o->batch : 1;
    }
    return pp_tensor_new(v->dtype, v->ndim, shape, out);
}

static int64_t numel_of(const pp_tensor *t) { return t ? pp_tensor_numel(t) : 0; }

/* Counted work of one node, in millions of operations: 2 multiply-adds per
 * product term for the matrix ops, else one per element read or written. */
static double node_mflops(const pp_node *n, pp_tensor *const *env) {
    const pp_tensor *a = n->n_in > 0 && n->in[0] >= 0 ? env[n->in[0]] : NULL;
    const pp_tensor *b = n->n_in > 1 && n->in[1] >= 0 ? env[n->in[1]] : NULL;
    const pp_tensor *y = n->n_out > 0 && n->out[0] >= 0 ? env[n->out[0]] : NULL;
    int dflt = n->domain[0] == 0;
    if (dflt && a && y && strcmp(n->op_type, "MatMul") == 0 && a->ndim >= 1)
        return 2.0 * (double)numel_of(y) * (double)a->shape[a->ndim - 1] / 1e6;
    if (dflt && a && y && strcmp(n->op_type, "Gemm") == 0 && a->ndim == 2)
        return 2.0 * (double)numel_of(y) * (double)a->shape[pp_node_attr_int(n, "transA", 0) ? 0 : 1] / 1e6;
    if (dflt && b && y && strcmp(n->op_type, "Conv") == 0 && b->ndim >= 1 && b->shape[0] > 0)
        return 2.0 * (double)numel_of(y) * (double)(numel_of(b) / b->shape[0]) / 1e6;
    if (dflt && a && b && strcmp(n->op_type, "ConvTranspose") == 0 && b->ndim >= 1 && b->shape[0] > 0)
        return 2.0 * (double)numel_of(a) * (double)(numel_of(b) / b->shape[0]) / 1e6;
    double e = 0;
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k] >= 0) e += (double)numel_of(env[n->in[k]]);
    for (int k = 0; k < n->n_out; k++)
        if (n->out[k] >= 0) e += (double)numel_of(env[n->out[k]]);
    return e / 1e6;
}

typedef struct {
    const char *name;
    int node;
} name_ix;

static int cmp_name(const void *a, const void *b) {
    const name_ix *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->node - y->node;
}

/* owner[i] for every node of t: the forward node (index < n_fwd) whose
 * cost it counts toward. Gradient nodes are named "<forward>/grad/<op>";
 * others (accumulations of unnamed nodes) go with the node the reverse
 * sweep was at, the last one named before them. */
static pp_status find_owners(const pp_graph *t, int n_fwd, int *owner) {
    name_ix *ix = malloc(sizeof *ix * ((size_t)n_fwd + 1));
    if (!ix) return pp_error(PP_ERR_NOMEM, "out of memory");
    int m = 0;
    for (int i = 0; i < n_fwd; i++)
        if (t->nodes[i].name && t->nodes[i].name[0]) ix[m++] = (name_ix){t->nodes[i].name, i};
    qsort(ix, (size_t)m, sizeof *ix, cmp_name);
    int cur = n_fwd - 1;
    char buf[1024];
    for (int i = 0; i < t->n_nodes; i++) {
        if (i < n_fwd) {
            owner[i] = i;
            continue;
        }
        const char *nm = t->nodes[i].name ? t->nodes[i].name : "", *g = NULL;
        for (const char *p = strstr(nm, "/grad/"); p; p = strstr(p + 1, "/grad/")) g = p;
        if (g && (size_t)(g - nm) < sizeof buf) {
            memcpy(buf, nm, (size_t)(g - nm));
            buf[g - nm] = 0;
            name_ix key = {buf, -1};
            int lo = 0, hi = m; /* first entry >= key */
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (cmp_name(&ix[mid], &key) < 0) lo = mid + 1;
                else hi = mid;
            }
            if (lo < m && strcmp(ix[lo].name, buf) == 0) cur = ix[lo].node;
        }
        owner[i] = cur;
    }
    free(ix);
    return PP_OK;
}

typedef struct {
    pp_graph *t;
    pp_backward *b;
    pp_exec *ex;
    pp_tensor **env;
    uint8_t *keep;
    int *order, n_order;   /* F, I, W nodes */
    int *last;             /* per value: last position in order that reads it */
    uint8_t *is_out;       /* per value: a graph output */
    int64_t *bytes;        /* per value: bytes when produced */
    double *ms;            /* per node: fastest time */
    double *mflops;        /* per node */
} run_ctx;

static void release_env(run_ctx *r) {
    for (int v = 0; r->env && v < r->t->n_values; v++) {
        pp_tensor_free(r->env[v]);
        r->env[v] = NULL;
    }
}

/* One training step node by node; each node's time goes to r->ms (the
 * smallest over runs). */
static pp_status run_once(run_ctx *r, const pp_node_costs_options *o, int first) {
    const pp_graph *t = r->t;
    int n_model = r->b->n_inputs_before;
    for (int i = 0; i < t->n_inputs; i++) {
        const pp_value *v = &t->values[t->inputs[i]];
        if (i < n_model) PP_TRY(sample_input(v, o, &r->env[t->inputs[i]]));
        else PP_TRY(pp_tensor_scalar_f32(1.0f, &r->env[t->inputs[i]])); /* the loss seed */
    }
    for (int p = 0; p < r->n_order; p++) {
        int id = r->order[p];
        const pp_node *n = &t->nodes[id];
        double t0 = now_ms();
        pp_status s = pp_exec_run_nodes(r->ex, &id, 1, r->env, r->keep);
        double dt = now_ms() - t0;
        if (s != PP_OK) {
            char label[512];
            return pp_error_context(s, "measuring node costs at %s", pp_node_label(n, label, sizeof label));
        }
        if (first || dt < r->ms[id]) r->ms[id] = dt;
        if (first) r->mflops[id] = node_mflops(n, r->env);
        for (int k = 0; k < n->n_out; k++) {
            int v = n->out[k];
            if (v < 0 || !r->env[v]) continue;
            if (first) r->bytes[v] = (int64_t)r->env[v]->nbytes;
            /* never read: gone once sized, graph outputs too (the
             * parameters' gradients would otherwise all be held to the
             * step's end, the peak of a split's setup) */
            if (r->last[v] < 0) {
                pp_tensor_free(r->env[v]);
                r->env[v] = NULL;
            }
        }
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            if (v < 0 || r->last[v] != p || r->is_out[v] || t->values[v].kind != PP_VALUE_NODE) continue;
            pp_tensor_free(r->env[v]);
            r->env[v] = NULL;
        }
    }
    release_env(r);
    return PP_OK;
}

static pp_status alloc_costs(int n, pp_node_costs **out) {
    pp_node_costs *c = calloc(1, sizeof *c);
    if (!c) return pp_error(PP_ERR_NOMEM, "out of memory");
    size_t w = (size_t)n + 1;
    c->n_nodes = n;
    c->compute = calloc(w, 1);
    c->fwd_ms = calloc(w, sizeof(double));
    c->bwd_ms = calloc(w, sizeof(double));
    c->param_bytes = calloc(w, sizeof(int64_t));
    c->stash_bytes = calloc(w, sizeof(int64_t));
    c->cross_bytes = calloc(w, sizeof(int64_t));
    if (!c->compute || !c->fwd_ms || !c->bwd_ms || !c->param_bytes || !c->stash_bytes || !c->cross_bytes) {
        pp_node_costs_free(c);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    *out = c;
    return PP_OK;
}

/* Parameter, stash and crossing bytes from the run's sizes. */
static void attribute_bytes(int n, const run_ctx *r, const int *owner, pp_node_costs *c) {
    const pp_graph *g = r->t; /* its first n nodes are the model's, in order */
    uint8_t *seen = calloc((size_t)r->t->n_values + 1, 1);
    if (!seen) return; /* the bytes stay 0: the plan is still valid */
    /* a parameter counts where a compute node first reads it */
    for (int i = 0; i < n; i++) {
        const pp_node *nd = &g->nodes[i];
        for (int k = 0; k < nd->n_in; k++) {
            int v = nd->in[k];
            if (v < 0 || seen[v] || g->values[v].kind != PP_VALUE_PARAM || !g->values[v].data) continue;
            seen[v] = 1;
            c->param_bytes[i] += (int64_t)g->values[v].data->nbytes;
        }
    }
    /* a stashed value counts with the forward node whose gradient nodes
     * read it first (the stage holding that backward keeps it) */
    memset(seen, 0, (size_t)r->t->n_values + 1);
    uint8_t *stash = calloc((size_t)r->t->n_values + 1, 1);
    for (int k = 0; stash && k < r->b->n_stash; k++)
        if (!r->b->stash_static[k]) stash[r->b->stash[k]] = 1;
    for (int p = 0; stash && p < r->n_order; p++) {
        int id = r->order[p];
        if (id < n) continue;
        const pp_node *nd = &r->t->nodes[id];
        for (int k = 0; k < nd->n_in; k++) {
            int v = nd->in[k];
            if (v < 0 || !stash[v] || seen[v]) continue;
            seen[v] = 1;
            c->stash_bytes[owner[id]] += r->bytes[v];
        }
    }
    free(stash);
    free(seen);
    /* an activation crosses a cut before node k when its producer is
     * before k and a compute node at or after k reads it */
    int64_t *diff = calloc((size_t)n + 2, sizeof(int64_t));
    int *lastr = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    if (!diff || !lastr) {
        free(diff);
        free(lastr);
        return;
    }
    for (int v = 0; v < g->n_values; v++) lastr[v] = -1;
    for (int j = 0; j < n; j++)
        for (int q = 0; c->compute[j] && q < g->nodes[j].n_in; q++)
            if (g->nodes[j].in[q] >= 0) lastr[g->nodes[j].in[q]] = j;
    for (int i = 0; i < n; i++) {
        if (!c->compute[i]) continue;
        const pp_node *nd = &g->nodes[i];
        for (int k = 0; k < nd->n_out; k++) {
            int v = nd->out[k];
            if (v < 0 || lastr[v] <= i) continue;
            diff[i + 1] += r->bytes[v];
            diff[lastr[v] + 1] -= r->bytes[v];
        }
    }
    free(lastr);
    int64_t acc = 0;
    for (int k = 0; k <= n; k++) {
        acc += diff[k];
        c->cross_bytes[k] = acc;
    }
    free(diff);
}

pp_status pp_node_costs_measure(const pp_graph *g, const pp_node_costs_options *opt, pp_node_costs **out) {
    pp_node_costs_options o;
    if (opt) o = *opt;
    else pp_node_costs_options_init(&o);
    if (o.batch < 1) o.batch = 8;
    if (o.repeats < 1) o.repeats = 1;
    *out = NULL;
    int n = g->n_nodes;
    pp_node_costs *c = NULL;
    run_ctx r = {0};
    int *owner = NULL;
    PP_TRY(alloc_costs(n, &c));
    c->batch = o.batch;
    c->source = o.source;
    pp_status s = pp_split_compute_nodes(g, 1, c->compute);
    if (s == PP_OK) s = copy_graph(g, &r.t);
    /* unfused: the copy's first n nodes stay the model's, one to one */
    if (s == PP_OK) s = pp_autodiff_model_unfused(r.t, o.loss, 0, &r.b);
    if (s == PP_OK) s = pp_exec_new(r.t, &r.ex);
    if (s == PP_OK) {
        size_t nv = (size_t)r.t->n_values + 1, nn = (size_t)r.t->n_nodes + 1;
        r.env = calloc(nv, sizeof *r.env);
        r.keep = malloc(nv);
        r.last = malloc(sizeof(int) * nv);
        r.is_out = calloc(nv, 1);
        r.bytes = calloc(nv, sizeof(int64_t));
        r.order = malloc(sizeof(int) * nn);
        r.ms = calloc(nn, sizeof(double));
        r.mflops = calloc(nn, sizeof(double));
        owner = malloc(sizeof(int) * nn);
        if (!r.env || !r.keep || !r.last || !r.is_out || !r.bytes || !r.order || !r.ms || !r.mflops || !owner)
            s = pp_error(PP_ERR_NOMEM, "out of memory");
    }
    if (s == PP_OK) {
        memset(r.keep, 1, (size_t)r.t->n_values + 1);
        for (int k = 0; k < r.b->n_forward; k++) r.order[r.n_order++] = r.b->forward_nodes[k];
        for (int k = 0; k < r.b->n_i; k++) r.order[r.n_order++] = r.b->i_nodes[k];
        for (int k = 0; k < r.b->n_w; k++) r.order[r.n_order++] = r.b->w_nodes[k];
        for (int v = 0; v < r.t->n_values; v++) r.last[v] = -1;
        for (int p = 0; p < r.n_order; p++) {
            const pp_node *nd = &r.t->nodes[r.order[p]];
            for (int k = 0; k < nd->n_in; k++)
                if (nd->in[k] >= 0) r.last[nd->in[k]] = p;
        }
        for (int k = 0; k < r.t->n_outputs; k++) r.is_out[r.t->outputs[k]] = 1;
        s = find_owners(r.t, n, owner);
    }
    int runs = o.source == PP_COST_FLOPS ? 1 : o.repeats + 1; /* the first warms up */
    for (int k = 0; s == PP_OK && k < runs; k++) {
        s = run_once(&r, &o, k == 0);
        if (s == PP_OK && k == 0 && runs > 1) /* the warm-up's times do not count */
            for (int i = 0; i < r.t->n_nodes; i++) r.ms[i] = 1e300;
    }
    if (s == PP_OK) {
        for (int i = 0; i < r.t->n_nodes; i++) {
            double v = o.source == PP_COST_FLOPS ? r.mflops[i] : r.ms[i];
            if (v >= 1e300) v = 0; /* not run (outside F, I and W) */
            if (i < n) c->fwd_ms[i] += v;
            else c->bwd_ms[owner[i]] += v;
        }
        attribute_bytes(n, &r, owner, c);
    }
    if (r.env) release_env(&r);
    free(r.env);
    free(r.keep);
    free(r.last);
    free(r.is_out);
    free(r.bytes);
    free(r.order);
    free(r.ms);
    free(r.mflops);
    free(owner);
    pp_exec_free(r.ex);
    pp_backward_free(r.b);
    pp_graph_free(r.t);
    if (s != PP_OK) {
        pp_node_costs_free(c);
        return s;
    }
    *out = c;
    return PP_OK;
}

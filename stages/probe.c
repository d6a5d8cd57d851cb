/* Shape probing: runs the pipe's forward on small made-up inputs to learn
 * each edge's dtype and shape, with symbolic input dims kept symbolic.
 *
 * Every symbolic dim name gets a base size b; one more run per name sets it
 * to a = b-1 (b+1 when b <= 2: a dim such as seq may have an upper bound).
 * An edge dim that scales by a/b with exactly the names n1..nk is written
 * "c*n1*...*nk" (c dropped when 1); a dim that never changes is a number. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/exec.h"
#include "pippin/pipe.h"

#include "status_internal.h"
#define MAX_SYMS 8

typedef struct {
    int n;
    const char *names[MAX_SYMS];
    int64_t base[MAX_SYMS];
} symbols;

/* Records a symbolic name once; its base size is given or a small prime,
 * so products of names stay distinguishable. */
static void add_symbol(symbols *sy, const char *name, int n_given, const char *const *given) {
    for (int i = 0; i < sy->n; i++)
        if (strcmp(sy->names[i], name) == 0) return;
    if (sy->n == MAX_SYMS) return;
    static const int64_t primes[MAX_SYMS] = {2, 3, 5, 7, 11, 13, 17, 19};
    int64_t size = primes[sy->n];
    size_t len = strlen(name);
    for (int k = 0; k < n_given; k++)
        if (strncmp(given[k], name, len) == 0 && given[k][len] == '=') size = atoll(given[k] + len + 1);
    sy->names[sy->n] = name;
    sy->base[sy->n++] = size;
}

/* Runs every stage in order; env_names/env_vals is a small name->tensor map
 * that receives each stage's outputs (edges and model outputs). */
typedef struct {
    int n, cap;
    char **names;
    pp_tensor **vals;
} tensor_map;

static pp_tensor *map_get(const tensor_map *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->names[i], name) == 0) return m->vals[i];
    return NULL;
}

static pp_status map_put(tensor_map *m, const char *name, pp_tensor *t) {
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 32;
        char **n = realloc(m->names, sizeof *n * (size_t)cap);
        if (n) m->names = n;
        pp_tensor **v = realloc(m->vals, sizeof *v * (size_t)cap);
        if (v) m->vals = v;
        if (!n || !v) return pp_error(PP_ERR_NOMEM, "out of memory");
        m->cap = cap;
    }
    m->names[m->n] = strdup(name);
    m->vals[m->n++] = t;
    return PP_OK;
}

static void map_free(tensor_map *m) {
    for (int i = 0; i < m->n; i++) {
        free(m->names[i]);
        pp_tensor_free(m->vals[i]);
    }
    free(m->names);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* A zero tensor for a model input with symbolic dims set from sizes. */
static pp_status made_up_input(const pp_value *v, const symbols *sy, const int64_t *sizes, pp_tensor **out) {
    int64_t shape[PP_MAX_DIMS];
    if (v->ndim < 0 || v->dtype == PP_DTYPE_UNDEFINED)
        return pp_error(PP_ERR_UNSUPPORTED, "input '%s' has no declared type; cannot probe shapes", v->name);
    for (int d = 0; d < v->ndim; d++) {
        shape[d] = v->shape[d] >= 0 ? v->shape[d] : 1;
        for (int i = 0; i < sy->n && v->dim_names[d]; i++)
            if (strcmp(sy->names[i], v->dim_names[d]) == 0) shape[d] = sizes[i];
    }
    return pp_tensor_new(v->dtype, v->ndim, shape, out);
}

static pp_status run_pipe(const pp_pipe *p, const symbols *sy, const int64_t *sizes, tensor_map *m) {
    for (int s = 0; s < p->n_stages; s++) {
        pp_graph *g = p->stages[s];
        pp_tensor **ins = calloc((size_t)g->n_inputs + 1, sizeof *ins);
        pp_tensor **outs = calloc((size_t)g->n_outputs + 1, sizeof *outs);
        pp_status st = (ins && outs) ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
        for (int i = 0; i < g->n_inputs && st == PP_OK; i++) {
            const pp_value *v = &g->values[g->inputs[i]];
            pp_tensor *t = map_get(m, v->name);
            if (t) {
                ins[i] = pp_tensor_retain(t);
                continue;
            }
            st = made_up_input(v, sy, sizes, &ins[i]);
            if (st == PP_OK) st = map_put(m, v->name, pp_tensor_retain(ins[i]));
        }
        if (st == PP_OK) st = pp_graph_run(g, ins, outs);
        if (st != PP_OK) st = pp_error_context(st, "probing stage %d", s);
        for (int o = 0; o < g->n_outputs && st == PP_OK; o++)
            if (!map_get(m, g->values[g->outputs[o]].name)) st = map_put(m, g->values[g->outputs[o]].name, outs[o]);
            else pp_tensor_free(outs[o]);
        for (int i = 0; ins && i < g->n_inputs; i++) pp_tensor_free(ins[i]);
        free(ins);
        free(outs);
        if (st != PP_OK) return st;
    }
    return PP_OK;
}

static int64_t alt_size(int64_t base) { return base > 2 ? base - 1 : base + 1; }

static char *dim_expr(const symbols *sy, int64_t base_val, const int64_t *alt_vals) {
    char buf[256];
    int64_t denom = 1;
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < sy->n; i++) {
        if (base_val == 0 || alt_vals[i] * sy->base[i] != base_val * alt_size(sy->base[i])) continue;
        denom *= sy->base[i];
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", n ? "*" : "", sy->names[i]);
    }
    if (n == 0) {
        snprintf(buf, sizeof buf, "%lld", (long long)base_val);
    } else if (base_val != denom && denom > 0 && base_val % denom == 0) {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%lld*%s", (long long)(base_val / denom), buf);
        snprintf(buf, sizeof buf, "%s", tmp);
    }
    return strdup(buf);
}

/* Model outputs that are not edges keep their probed dtype and rank (the
 * loss's scalar shape is what autodiff checks). */
static void type_outputs(pp_pipe *p, const tensor_map *run) {
    for (int o = 0; o < p->n_outputs; o++) {
        pp_graph *g = p->stages[p->output_stage[o]];
        const pp_tensor *t = map_get(run, p->outputs[o]);
        int v = g ? pp_graph_find_value(g, p->outputs[o]) : -1;
        if (!t || v < 0 || pp_pipe_find_edge(p, p->outputs[o]) >= 0) continue;
        pp_value *val = &g->values[v];
        if (val->dtype == PP_DTYPE_UNDEFINED) val->dtype = t->dtype;
        if (val->ndim < 0) { /* rank only: sizes came from made-up inputs */
            val->ndim = t->ndim;
            for (int d = 0; d < t->ndim; d++) val->shape[d] = t->shape[d] == 1 ? 1 : -1;
        }
    }
}

/* Copies each edge's type onto the stage graphs' inputs and outputs, so
 * stage files declare them (symbolic dims as dim names). */
static void type_stage_values(pp_pipe *p) {
    for (int s = 0; s < p->n_stages; s++) {
        pp_graph *g = p->stages[s];
        if (!g) continue;
        for (int v = 0; v < g->n_values; v++) {
            pp_value *val = &g->values[v];
            if (val->kind != PP_VALUE_INPUT && val->kind != PP_VALUE_NODE) continue;
            int e = pp_pipe_find_edge(p, val->name);
            if (e < 0 || p->edges[e].ndim < 0) continue;
            const pp_pipe_edge *ed = &p->edges[e];
            val->dtype = ed->dtype;
            val->ndim = ed->ndim;
            for (int d = 0; d < ed->ndim; d++) {
                char *end;
                long long n = strtoll(ed->dims[d], &end, 10);
                free(val->dim_names[d]);
                val->dim_names[d] = NULL;
                if (*end == '\0') {
                    val->shape[d] = n;
                } else {
                    val->shape[d] = -1;
                    val->dim_names[d] = strdup(ed->dims[d]);
                }
            }
        }
    }
}

/* "name=N" settings: N a positive integer, name a symbolic input dim. */
static pp_status check_dims_given(const symbols *sy, int n, const char *const *given) {
    for (int k = 0; k < n; k++) {
        const char *eq = strchr(given[k], '=');
        char *end;
        long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
        if (!eq || eq == given[k] || !eq[1] || *end || v < 1 || v > (1LL << 30))
            return pp_error(PP_ERR_INVALID, "dim '%s': expected NAME=N with N a positive integer", given[k]);
        int known = 0;
        for (int i = 0; i < sy->n; i++)
            known |= strlen(sy->names[i]) == (size_t)(eq - given[k]) && strncmp(sy->names[i], given[k], (size_t)(eq - given[k])) == 0;
        if (!known) {
            char list[256] = "";
            size_t len = 0;
            for (int i = 0; i < sy->n && len < sizeof list; i++)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", sy->names[i]);
            return pp_error(PP_ERR_NOT_FOUND, "dim '%.*s' is not a dynamic input dim (the model's: %s)",
                            (int)(eq - given[k]), given[k], sy->n ? list : "none");
        }
    }
    return PP_OK;
}

/* p->dims: the symbols as "name=N", the batch first. */
static pp_status keep_sizes(pp_pipe *p, const symbols *sy) {
    char **dims = calloc(MAX_SYMS + 1, sizeof *dims);
    if (!dims) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < sy->n; i++) {
        size_t cap = strlen(sy->names[i]) + 24;
        if (!(dims[i] = malloc(cap))) {
            for (int k = 0; k < i; k++) free(dims[k]);
            free(dims);
            return pp_error(PP_ERR_NOMEM, "out of memory");
        }
        snprintf(dims[i], cap, "%s=%lld", sy->names[i], (long long)sy->base[i]);
    }
    for (int i = 0; i < p->n_dims; i++) free(p->dims[i]);
    free(p->dims);
    p->dims = dims;
    p->n_dims = sy->n;
    return PP_OK;
}

pp_status pp_pipe_probe_shapes(pp_pipe *p, int n_dims_given, const char *const *dims_given) {
    for (int s = 0; s < p->n_stages; s++)
        if (!p->stages[s]) return pp_error(PP_ERR_STATE, "probing needs every stage's graph; stage %d is not loaded", s);
    symbols sy = {0};
    for (int s = 0; s < p->n_stages; s++) {
        const pp_graph *g = p->stages[s];
        for (int i = 0; i < g->n_inputs; i++) {
            const pp_value *v = &g->values[g->inputs[i]];
            for (int d = 0; d < v->ndim; d++)
                if (v->dim_names[d] && pp_pipe_find_edge(p, v->name) >= 0 && p->edges[pp_pipe_find_edge(p, v->name)].producer < 0)
                    add_symbol(&sy, v->dim_names[d], n_dims_given, dims_given);
        }
    }
    PP_TRY(check_dims_given(&sy, n_dims_given, dims_given));
    tensor_map runs[MAX_SYMS + 1] = {{0}};
    int64_t sizes[MAX_SYMS];
    pp_status st = PP_OK;
    for (int r = 0; r <= sy.n && st == PP_OK; r++) {
        for (int i = 0; i < sy.n; i++) sizes[i] = i + 1 == r ? alt_size(sy.base[i]) : sy.base[i];
        st = run_pipe(p, &sy, sizes, &runs[r]);
    }
    /* The batch symbol: the first dim name of the first model input. */
    int batch = sy.n ? 0 : -1;
    for (int e = 0; e < p->n_edges && st == PP_OK; e++) {
        pp_pipe_edge *ed = &p->edges[e];
        const pp_tensor *t = map_get(&runs[0], ed->value);
        if (!t) continue;
        ed->dtype = t->dtype;
        ed->ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++) {
            int64_t alt[MAX_SYMS];
            for (int i = 0; i < sy.n; i++) {
                const pp_tensor *u = map_get(&runs[i + 1], ed->value);
                alt[i] = u && u->ndim == t->ndim ? u->shape[d] : t->shape[d];
            }
            free(ed->dims[d]);
            ed->dims[d] = dim_expr(&sy, t->shape[d], alt);
        }
        ed->bytes_per_sample = batch >= 0 ? (int64_t)t->nbytes / sy.base[batch] : (int64_t)t->nbytes;
    }
    if (st == PP_OK) type_outputs(p, &runs[0]);
    for (int r = 0; r <= sy.n; r++) map_free(&runs[r]);
    /* The probe's buffers (made-up sizes, freed into the tensor cache and
     * this thread's plan arena) serve nothing that follows: the weights
     * read next (pippin split, model: workers) must not sit on them. */
    pp_tensor_cache_release();
    if (st == PP_OK) st = keep_sizes(p, &sy); /* before the names go with the stage inputs' old types */
    if (st == PP_OK) type_stage_values(p);
    return st;
}

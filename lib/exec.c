/* Graph executor: runs nodes in order, frees buffers after their last use,
 * and caches the integer shape sub-graphs per input signature; with
 * constant parameters also what depends on weights alone (a transposed
 * weight), for every signature. Buffers that live and die inside a run
 * come from a memory plan made once per node list and input signature
 * (lib/mem_plan.c). */
#include "pippin/exec.h"

#include <stdlib.h>
#include <string.h>

#include "device_backend.h"
#include "exec_fault.h"
#include "pippin/log.h"
#include "hash.h"
#include "inplace.h"
#include "log_internal.h"
#include "mem_plan.h"
#include "op.h"
#include "pack_cache.h"
#include "pippin/optimize.h"

#include "status_internal.h"

/* Shorter node lists (a node timed alone) gain nothing from a plan. */
#define PLAN_MIN_NODES 8
struct pp_exec {
    pp_graph *g;
    int *all_nodes;         /* 0..n_nodes-1 */
    uint8_t *is_output;     /* per value: a graph output (never freed early) */
    uint8_t *static_node;   /* per node: depends only on constants and input shapes */
    uint8_t *const_node;    /* per node: depends only on constants (kept across signatures) */
    int params_constant;    /* parameters count as constants (pp_exec_set_constant_params) */
    pp_tensor **cache;      /* per value: cached output of a static node */
    int64_t kernels_run, nodes_cached; /* counters for pp_exec_stats */
    pp_random_stream random; /* pp_exec_set_random_stream */
    int n_sig;
    int64_t *sig;           /* dtype, ndim, dims of each input at the last run */
    pp_device_plan *plan;   /* pp_exec_set_device; NULL: all on the CPU */
    pp_mem_plans *mem;      /* buffer plans per node list and signature */
    const uint8_t *device_values; /* pp_exec_set_device_values */
    const uint8_t *host_written;  /* pp_exec_set_host_written */
    int async_outputs;            /* pp_exec_set_async_outputs */
    const uint8_t *watch;   /* pp_exec_set_value_hook */
    pp_exec_value_fn value_fn;
    pp_exec_target_fn target_fn; /* pp_exec_set_target_hook (its user is value_user) */
    void *value_user;
    int plan_memory;        /* pp_exec_set_memory_plan; PIPPIN_MEMORY_PLAN=0 turns it off */
    int inplace;            /* pp_exec_set_inplace; the optimizer's "inplace" bit by default */
    int64_t inplace_nodes, inplace_bytes; /* pp_exec_inplace_stats */
    pp_pack_cache *packs;   /* pp_exec_set_pack_weights; NULL: off */
};

static pp_status alloc_zeroed(void **p, size_t n, size_t size) {
    *p = calloc(n ? n : 1, size);
    return *p ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory planning execution");
}

/* Static nodes: Shape/Size read only the input's shape; everything else is
 * static if all its inputs are constants or outputs of static nodes. */
static void mark_static(pp_exec *ex) {
    const pp_graph *g = ex->g;
    /* per value: 1 static (constants, shapes), 2 constant too */
    uint8_t *level = calloc((size_t)g->n_values + 1, 1);
    memset(ex->static_node, 0, (size_t)g->n_nodes);
    memset(ex->const_node, 0, (size_t)g->n_nodes);
    if (!level) return; /* caching is an optimisation only */
    for (int v = 0; v < g->n_values; v++) {
        pp_value_kind k = g->values[v].kind;
        level[v] = k == PP_VALUE_CONST || (ex->params_constant && k == PP_VALUE_PARAM) ? 2 : 0;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        int lv = 2;
        if (strcmp(n->op_type, "Shape") == 0 || strcmp(n->op_type, "Size") == 0) {
            lv = n->n_in > 0 && n->in[0] >= 0 && level[n->in[0]] == 2 ? 2 : 1;
        } else if (n->domain[0] && strcmp(n->domain, "ai.onnx") != 0 && !(n->op && n->op->pure)) {
            lv = 0; /* other domains' ops may draw random numbers, unless their entry says pure */
        } else if (strncmp(n->op_type, "Random", 6) == 0 || strcmp(n->op_type, "Dropout") == 0 ||
                   strcmp(n->op_type, "Bernoulli") == 0) {
            lv = 0;
        } else { /* pure: as constant as its inputs */
            for (int k = 0; k < n->n_in; k++)
                if (n->in[k] >= 0 && level[n->in[k]] < lv) lv = level[n->in[k]];
        }
        ex->static_node[i] = (uint8_t)(lv >= 1);
        ex->const_node[i] = (uint8_t)(lv == 2);
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0) level[n->out[k]] = (uint8_t)lv;
    }
    free(level);
}

pp_status pp_exec_new(pp_graph *g, pp_exec **out) {
    PP_TRY(pp_graph_resolve(g));
    pp_exec *ex = calloc(1, sizeof *ex);
    if (!ex) return pp_error(PP_ERR_NOMEM, "out of memory planning execution");
    ex->g = g;
    pp_status s = alloc_zeroed((void **)&ex->all_nodes, (size_t)g->n_nodes, sizeof(int));
    if (!s) s = alloc_zeroed((void **)&ex->is_output, (size_t)g->n_values, 1);
    if (!s) s = alloc_zeroed((void **)&ex->static_node, (size_t)g->n_nodes, 1);
    if (!s) s = alloc_zeroed((void **)&ex->const_node, (size_t)g->n_nodes, 1);
    if (!s) s = alloc_zeroed((void **)&ex->cache, (size_t)g->n_values, sizeof(pp_tensor *));
    if (!s) s = alloc_zeroed((void **)&ex->sig, (size_t)g->n_inputs * (PP_MAX_DIMS + 2), sizeof(int64_t));
    if (!s) s = pp_mem_plans_new(&ex->mem);
    if (s) {
        pp_exec_free(ex);
        return s;
    }
    for (int i = 0; i < g->n_nodes; i++) ex->all_nodes[i] = i;
    for (int i = 0; i < g->n_outputs; i++) ex->is_output[g->outputs[i]] = 1;
    const char *plan_env = getenv("PIPPIN_MEMORY_PLAN");
    ex->plan_memory = !(plan_env && strcmp(plan_env, "0") == 0);
    ex->inplace = (pp_optimize_default() & PP_OPT_INPLACE) != 0;
    mark_static(ex);
    *out = ex;
    return PP_OK;
}

/* Drops what belongs to the last input signature (all: everything). */
static void clear_cache_of(pp_exec *ex, int all) {
    for (int v = 0; v < ex->g->n_values; v++) {
        int p = ex->g->values[v].producer;
        if (!all && p >= 0 && ex->const_node[p]) continue; /* the same for every signature */
        pp_tensor_free(ex->cache[v]);
        ex->cache[v] = NULL;
    }
}

static void clear_cache(pp_exec *ex) { clear_cache_of(ex, 0); }

void pp_exec_set_constant_params(pp_exec *ex, int on) {
    clear_cache_of(ex, 1);
    ex->params_constant = on != 0;
    mark_static(ex);
    if (ex->plan) {
        pp_device_plan_forget(ex->plan);
        pp_device_plan_keep_params(ex->plan, ex->params_constant);
    }
}

void pp_exec_constants_written(pp_exec *ex) {
    clear_cache_of(ex, 1);
    pp_pack_cache_invalidate(ex->packs); /* packed copies of the old bytes too */
    if (ex->plan) pp_device_plan_forget(ex->plan);
}

void pp_exec_set_random_stream(pp_exec *ex, uint64_t seed, int64_t step, int64_t microbatch) {
    ex->random = (pp_random_stream){seed, step, microbatch};
}

void pp_exec_free(pp_exec *ex) {
    if (!ex) return;
    if (ex->cache) clear_cache_of(ex, 1);
    pp_device_plan_free(ex->plan);
    pp_pack_cache_free(ex->packs);
    free(ex->cache);
    free(ex->const_node);
    free(ex->all_nodes);
    free(ex->is_output);
    free(ex->static_node);
    free(ex->sig);
    pp_mem_plans_free(ex->mem);
    free(ex);
}

void pp_exec_set_memory_plan(pp_exec *ex, int on) { ex->plan_memory = on != 0; }

pp_status pp_exec_set_pack_weights(pp_exec *ex, int on) {
    if (!on || ex->packs) { /* on again: the copies may be stale, start afresh */
        pp_pack_cache_free(ex->packs);
        ex->packs = NULL;
    }
    return on ? pp_pack_cache_new(ex->g->n_values, &ex->packs) : PP_OK;
}

int pp_exec_pack_weights(const pp_exec *ex) { return ex->packs != NULL; }

void pp_exec_params_changed(pp_exec *ex) { pp_pack_cache_invalidate(ex->packs); }

void pp_exec_pack_stats(const pp_exec *ex, int64_t *packed, int64_t *reused) {
    pp_pack_cache_stats(ex->packs, packed, reused);
}

void pp_exec_set_inplace(pp_exec *ex, int on) { ex->inplace = on != 0; }

void pp_exec_inplace_stats(const pp_exec *ex, int64_t *nodes, int64_t *bytes) {
    if (nodes) *nodes = ex->inplace_nodes;
    if (bytes) *bytes = ex->inplace_bytes;
}

void pp_exec_set_value_hook(pp_exec *ex, const uint8_t *watch, pp_exec_value_fn fn, void *user) {
    ex->watch = watch;
    ex->value_fn = watch ? fn : NULL;
    ex->value_user = user;
}

void pp_exec_set_target_hook(pp_exec *ex, pp_exec_target_fn fn) { ex->target_fn = fn; }

void pp_exec_set_device_values(pp_exec *ex, const uint8_t *resident) { ex->device_values = resident; }

void pp_exec_set_host_written(pp_exec *ex, const uint8_t *host_written) { ex->host_written = host_written; }

void pp_exec_set_async_outputs(pp_exec *ex, int on) { ex->async_outputs = on != 0; }

/* Hands the watched outputs of node n to the value hook. A value on a
 * device is not the hook's to read (its data is device memory): it stays
 * in env and comes back to the host with the run's other results, unless
 * the caller holds it on the device (pp_exec_set_device_values). */
static pp_status hand_over_outputs(pp_exec *ex, const pp_node *n, pp_tensor **env) {
    for (int k = 0; k < n->n_out; k++) {
        int v = n->out[k];
        if (v >= 0 && ex->watch[v] && env[v] &&
            (!pp_tensor_device(env[v]) || (ex->device_values && ex->device_values[v])))
            PP_TRY(ex->value_fn(ex->value_user, v, &env[v]));
    }
    return PP_OK;
}

void pp_exec_memory_plan(const pp_exec *ex, int64_t *plan_bytes, int64_t *buffer_bytes) {
    pp_mem_plans_peak(ex->mem, plan_bytes, buffer_bytes);
}

/* The places node n may add its watched outputs into (pp_exec_set_target_hook);
 * *count: how many it got. Only for nodes the CPU runs. */
static pp_status targets_for(pp_exec *ex, const pp_node *n, pp_tensor **into, int *count) {
    *count = 0;
    if (!ex->target_fn || !ex->value_fn) return PP_OK;
    for (int k = 0; k < n->n_out; k++) into[k] = NULL;
    if (ex->plan && strcmp(pp_device_plan_node_device(ex->plan, (int)(n - ex->g->nodes)), "cpu") != 0) return PP_OK;
    for (int k = 0; k < n->n_out; k++) {
        int v = n->out[k];
        if (v < 0 || !ex->watch[v]) continue;
        pp_status s = ex->target_fn(ex->value_user, v, &into[k]);
        if (s != PP_OK) { /* none offered: the caller frees nothing more */
            for (int j = 0; j <= k; j++) {
                pp_tensor_free(into[j]);
                into[j] = NULL;
            }
            *count = 0;
            return s;
        }
        *count += into[k] != NULL;
    }
    return PP_OK;
}

/* Runs node i reading env; stores outputs in env. donate: the inputs
 * whose buffer output 0 may take (pp_inplace_choose), if their tensors
 * allow it now. */
static pp_status run_node(pp_exec *ex, int i, pp_tensor **env, unsigned donate) {
    const pp_graph *g = ex->g;
    const pp_node *n = &g->nodes[i];
    pp_tensor *ins[64], *outs[64];
    if (n->n_in > 64 || n->n_out > 64)
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "more than 64 inputs or outputs");
    int cached = ex->cache && ex->static_node[i];
    for (int k = 0; cached && k < n->n_out; k++)
        if (n->out[k] >= 0 && !ex->cache[n->out[k]]) cached = 0;
    if (cached && n->n_out > 0) {
        ex->nodes_cached++;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0) env[n->out[k]] = pp_tensor_retain(ex->cache[n->out[k]]);
        return PP_OK;
    }
    for (int k = 0; k < n->n_in; k++) {
        int v = n->in[k];
        ins[k] = NULL;
        if (v < 0) continue;
        if (!env[v]) {
            const pp_value *val = &g->values[v];
            if ((val->kind == PP_VALUE_PARAM || val->kind == PP_VALUE_CONST) && val->data)
                env[v] = pp_tensor_retain(val->data);
            else
                return pp_node_error(n, PP_ERR_STATE, "input '%s' has no value", val->name);
        }
        ins[k] = env[v];
    }
    memset(outs, 0, sizeof(pp_tensor *) * (size_t)n->n_out);
    pp_tensor *into[64];
    uint64_t added = 0;
    int targets = 0;
    pp_status s = targets_for(ex, n, into, &targets);
    pp_kernel_ctx ctx = {g, n, n->n_in, ins, n->n_out, outs, &ex->random, targets ? into : NULL, &added, ex->packs};
    ex->kernels_run++;
    pp_tensor *donors[PP_INPLACE_MAX];
    int n_donors = 0;
    for (int k = 0; s == PP_OK && donate && k < n->n_in && k < PP_INPLACE_MAX; k++)
        if ((donate & (1u << k)) && ins[k] && pp_inplace_can_donate(ins[k])) donors[n_donors++] = ins[k];
    if (n_donors) pp_inplace_offer(donors, n_donors);
    if (s == PP_OK) s = ex->plan ? pp_device_plan_run(ex->plan, i, &ctx) : n->op->run(&ctx);
    size_t took = n_donors ? pp_inplace_withdraw() : 0;
    if (took && s == PP_OK) {
        ex->inplace_nodes++;
        ex->inplace_bytes += (int64_t)took;
    }
    for (int k = 0; k < n->n_out && s == PP_OK; k++)
        if (n->out[k] >= 0 && !outs[k] && !(added >> k & 1))
            s = pp_node_error(n, PP_ERR_INTERNAL, "kernel left output %d unset", k);
    for (int k = 0; targets && k < n->n_out; k++) pp_tensor_free(into[k]);
    if (s != PP_OK) {
        for (int k = 0; k < n->n_out; k++) pp_tensor_free(outs[k]);
        return s;
    }
    for (int k = 0; k < n->n_out; k++) {
        int v = n->out[k];
        if (v < 0) {
            pp_tensor_free(outs[k]);
            continue;
        }
        pp_tensor_free(env[v]);
        env[v] = outs[k];
        if (ex->cache && ex->static_node[i]) {
            pp_tensor_free(ex->cache[v]);
            ex->cache[v] = pp_tensor_retain(outs[k]);
        }
    }
    return PP_OK;
}

/* What a run's allocations depend on: the node list, what it keeps, and
 * the dtypes and shapes of the values it starts from (parameters and
 * constants do not change shape). */
static uint64_t run_key(const pp_exec *ex, const int *nodes, int n_nodes, pp_tensor *const *env,
                        const uint8_t *keep) {
    const pp_graph *g = ex->g;
    uint64_t h = pp_hash64(PP_HASH64_SEED, nodes, sizeof *nodes * (size_t)n_nodes);
    h = pp_hash64(h, &keep, sizeof keep);
    for (int v = 0; v < g->n_values; v++) {
        const pp_tensor *t = env[v];
        if (!t || g->values[v].kind == PP_VALUE_PARAM || g->values[v].kind == PP_VALUE_CONST) continue;
        int64_t head[3] = {v, t->dtype, t->ndim};
        h = pp_hash64(h, head, sizeof head);
        h = pp_hash64(h, t->shape, sizeof *t->shape * (size_t)t->ndim);
    }
    return h;
}

/* Nodes left before the injected failure; -1: none planned (exec_fault.h). */
static _Thread_local int fail_countdown = -1;

int pp_exec_fail_after_nodes(int n) {
    int left = fail_countdown;
    fail_countdown = n < 0 ? -1 : n;
    return left;
}

static pp_status run_list(pp_exec *ex, const int *nodes, int n_nodes, pp_tensor **env,
                          const uint8_t *keep) {
    const pp_graph *g = ex->g;
    for (int p = 0; p < n_nodes; p++)
        if (nodes[p] < 0 || nodes[p] >= g->n_nodes)
            return pp_error(PP_ERR_INVALID, "node index %d out of range (%d nodes)", nodes[p], g->n_nodes);
    int *last = malloc(sizeof(int) * (size_t)(g->n_values ? g->n_values : 1));
    if (!last) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int v = 0; v < g->n_values; v++) last[v] = -1;
    for (int p = 0; p < n_nodes; p++) {
        const pp_node *n = &g->nodes[nodes[p]];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0) last[n->in[k]] = p;
    }
    /* in place: not where a device runs nodes (values may live there) */
    uint8_t *donate = ex->inplace && !ex->plan ? malloc((size_t)n_nodes + 1) : NULL;
    if (donate) pp_inplace_choose(g, nodes, n_nodes, last, keep, ex->value_fn ? ex->watch : NULL, donate);
    int planned = ex->plan_memory && n_nodes >= PLAN_MIN_NODES;
    pp_status s = planned ? pp_mem_run_begin(ex->mem, nodes, n_nodes, run_key(ex, nodes, n_nodes, env, keep))
                          : PP_OK;
    for (int p = 0; p < n_nodes && s == PP_OK; p++) {
        int i = nodes[p];
        if (planned) pp_mem_run_node(ex->mem, p);
        const pp_node *n = &g->nodes[i];
        if (fail_countdown >= 0 && fail_countdown-- == 0)
            s = pp_node_error(n, PP_ERR_INTERNAL, "failure injected by the test hook");
        else
            s = run_node(ex, i, env, donate ? donate[p] : 0);
        if (s == PP_OK && ex->value_fn) s = hand_over_outputs(ex, n, env);
        for (int k = 0; k < n->n_in && s == PP_OK; k++) {
            int v = n->in[k];
            if (v >= 0 && last[v] == p && !(keep && keep[v])) {
                pp_tensor_free(env[v]);
                env[v] = NULL;
                if (ex->plan) pp_device_plan_drop(ex->plan, v);
            }
        }
    }
    if (ex->plan) { /* what the run leaves behind goes back to the host */
        /* pp_exec_run's outputs (keep is is_output there) may stay in flight */
        const uint8_t *no_wait = ex->async_outputs && keep == ex->is_output ? ex->is_output : NULL;
        pp_status f = pp_device_plan_finish(ex->plan, env, ex->device_values, ex->host_written, no_wait);
        if (s == PP_OK) s = f;
    }
    if (planned && pp_mem_run_end(ex->mem, s == PP_OK) != PP_OK) /* the run is fine; later ones use the pool */
        pp_warn("no memory plan for a run of %d nodes: %s", n_nodes, pp_last_error());
    free(donate);
    free(last);
    return s;
}

/* Records input i's dtype and shape; 1 if they differ from the last run's. */
static int note_signature(pp_exec *ex, int i, const pp_tensor *t) {
    int changed = 0;
    int64_t *sig = ex->sig + (size_t)i * (PP_MAX_DIMS + 2);
    if (sig[0] != t->dtype || sig[1] != t->ndim) changed = 1;
    for (int d = 0; d < t->ndim; d++)
        if (sig[2 + d] != t->shape[d]) changed = 1;
    sig[0] = t->dtype;
    sig[1] = t->ndim;
    for (int d = 0; d < t->ndim; d++) sig[2 + d] = t->shape[d];
    return changed;
}

pp_status pp_exec_run_nodes(pp_exec *ex, const int *nodes, int n_nodes, pp_tensor **env,
                            const uint8_t *keep) {
    /* Cached shape sub-graphs belong to one input signature; microbatches
     * may differ in size, so check the inputs present in env. */
    int changed = 0;
    for (int i = 0; i < ex->g->n_inputs; i++)
        if (env[ex->g->inputs[i]]) changed |= note_signature(ex, i, env[ex->g->inputs[i]]);
    if (changed) clear_cache(ex);
    return run_list(ex, nodes, n_nodes, env, keep);
}

/* Checks the fed tensors against the declared inputs and refreshes the
 * shape cache when the signature changed. */
static pp_status check_inputs(pp_exec *ex, pp_tensor *const *inputs) {
    const pp_graph *g = ex->g;
    int changed = 0;
    for (int i = 0; i < g->n_inputs; i++) {
        const pp_value *v = &g->values[g->inputs[i]];
        const pp_tensor *t = inputs[i];
        char a[128], b[128];
        if (!t) return pp_error(PP_ERR_INVALID, "input '%s' was not given", v->name);
        if (v->dtype != PP_DTYPE_UNDEFINED && t->dtype != v->dtype)
            return pp_error(PP_ERR_SHAPE, "input '%s': expected %s, got %s", v->name,
                            pp_dtype_name(v->dtype), pp_dtype_name(t->dtype));
        if (v->ndim >= 0) {
            int ok = t->ndim == v->ndim;
            for (int d = 0; ok && d < v->ndim; d++)
                if (v->shape[d] >= 0 && v->shape[d] != t->shape[d]) ok = 0;
            if (!ok)
                return pp_error(PP_ERR_SHAPE, "input '%s': expected shape %s, got %s", v->name,
                                pp_shape_str(v->ndim, v->shape, a, sizeof a),
                                pp_shape_str(t->ndim, t->shape, b, sizeof b));
        }
        changed |= note_signature(ex, i, t);
    }
    if (changed) clear_cache(ex);
    return PP_OK;
}

pp_status pp_exec_run(pp_exec *ex, pp_tensor *const *inputs, pp_tensor **outputs) {
    pp_graph *g = ex->g;
    PP_TRY(check_inputs(ex, inputs));
    pp_tensor **env = calloc((size_t)g->n_values + 1, sizeof *env);
    if (!env) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < g->n_inputs; i++) {
        pp_tensor_free(env[g->inputs[i]]);
        env[g->inputs[i]] = pp_tensor_retain(inputs[i]);
    }
    pp_status s = run_list(ex, ex->all_nodes, g->n_nodes, env, ex->is_output);
    for (int i = 0; i < g->n_outputs && s == PP_OK; i++) {
        int v = g->outputs[i];
        if (!env[v] && g->values[v].data) env[v] = pp_tensor_retain(g->values[v].data);
        if (!env[v] && !(ex->value_fn && ex->watch[v])) /* a watched one the value hook may take: NULL */
            s = pp_error(PP_ERR_STATE, "output '%s' was not computed", g->values[v].name);
    }
    if (s == PP_OK)
        for (int i = 0; i < g->n_outputs; i++) outputs[i] = pp_tensor_retain(env[g->outputs[i]]);
    for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[v]);
    free(env);
    return s;
}

pp_status pp_exec_set_device(pp_exec *ex, pp_device *dev) {
    pp_device_plan_free(ex->plan);
    ex->plan = NULL;
    if (pp_device_is_cpu(dev)) return PP_OK;
    PP_TRY(pp_device_plan_new(dev, ex->g, ex->static_node, &ex->plan));
    pp_device_plan_keep_params(ex->plan, ex->params_constant);
    return PP_OK;
}

const char *pp_exec_node_device(const pp_exec *ex, int node) {
    return ex->plan ? pp_device_plan_node_device(ex->plan, node) : "cpu";
}

void pp_exec_stats(const pp_exec *ex, int64_t *kernels_run, int64_t *nodes_cached) {
    if (kernels_run) *kernels_run = ex->kernels_run;
    if (nodes_cached) *nodes_cached = ex->nodes_cached;
}

pp_status pp_exec_node(const pp_graph *g, int node, pp_tensor *const *inputs,
                       pp_tensor **outputs) {
    const pp_node *n = &g->nodes[node];
    const pp_op *op = n->op ? n->op : pp_op_find(n->domain, n->op_type);
    if (!op) return pp_node_error(n, PP_ERR_UNSUPPORTED, "unsupported op");
    pp_tensor *outs[64] = {0};
    if (n->n_out > 64) return pp_node_error(n, PP_ERR_UNSUPPORTED, "more than 64 outputs");
    pp_kernel_ctx ctx = {g, n, n->n_in, inputs, n->n_out, outs};
    PP_TRY(op->run(&ctx));
    for (int k = 0; k < n->n_out; k++) outputs[k] = outs[k];
    return PP_OK;
}

pp_status pp_graph_run(pp_graph *g, pp_tensor *const *inputs, pp_tensor **outputs) {
    pp_exec *ex;
    PP_TRY(pp_exec_new(g, &ex));
    pp_status s = pp_exec_run(ex, inputs, outputs);
    pp_exec_free(ex);
    return s;
}

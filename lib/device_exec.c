/* The executor's placement on a device (the hook lib/exec.c calls): which
 * nodes the device claims, and the copies where a value crosses between the
 * device and the CPU, as ONNX Runtime inserts copy nodes at provider
 * boundaries. A value keeps one copy on the other side while it lives, so
 * a value read by several nodes over there crosses once. */
#include "device_backend.h"

#include <stdlib.h>
#include <string.h>

#include "status_internal.h"

struct pp_device_plan {
    pp_device *dev;
    const pp_graph *g;
    uint8_t *on_device;  /* per node */
    pp_tensor **mirror_of; /* per value: the tensor mirrored (a reference) */
    pp_tensor **mirror;    /* per value: its copy on the other side */
    int keep_params;       /* pp_device_plan_keep_params */
    const uint8_t *static_node; /* the executor's: per node, its output is cached across runs */
};

pp_status pp_device_plan_new(pp_device *dev, const pp_graph *g, const uint8_t *static_node,
                             pp_device_plan **out) {
    *out = NULL;
    pp_device_plan *p = calloc(1, sizeof *p);
    if (!p) return pp_error(PP_ERR_NOMEM, "out of memory placing nodes");
    p->dev = dev;
    p->g = g;
    p->static_node = static_node;
    p->on_device = calloc((size_t)g->n_nodes + 1, 1);
    p->mirror_of = calloc((size_t)g->n_values + 1, sizeof *p->mirror_of);
    p->mirror = calloc((size_t)g->n_values + 1, sizeof *p->mirror);
    if (!p->on_device || !p->mirror_of || !p->mirror) {
        pp_device_plan_free(p);
        return pp_error(PP_ERR_NOMEM, "out of memory placing nodes");
    }
    /* Shape arithmetic and what the executor caches stay on the CPU. */
    for (int i = 0; i < g->n_nodes; i++)
        p->on_device[i] = (uint8_t)(!static_node[i] && pp_device_supports(dev, g, i));
    *out = p;
    return PP_OK;
}

static void drop_mirror(pp_device_plan *p, int v) {
    pp_tensor_free(p->mirror[v]);
    pp_tensor_free(p->mirror_of[v]);
    p->mirror[v] = p->mirror_of[v] = NULL;
}

/* A copy of a constant's data (a parameter's, when they are constant),
 * or of what the executor caches across runs (a static node's output:
 * a weight transposed once), stays for the next runs. It is found by the
 * tensor it copies (a new cached tensor is copied again); a host write in
 * place is not seen, so the writer says so (pp_exec_constants_written). */
static int keeps(const pp_device_plan *p, int v) {
    const pp_value *val = &p->g->values[v];
    if (!p->mirror[v]) return 0;
    if (val->producer >= 0) return p->static_node && p->static_node[val->producer];
    int kind_kept = val->kind == PP_VALUE_CONST || (p->keep_params && val->kind == PP_VALUE_PARAM);
    return kind_kept && p->mirror_of[v] == val->data;
}

void pp_device_plan_keep_params(pp_device_plan *p, int on) { p->keep_params = on != 0; }

void pp_device_plan_forget(pp_device_plan *p) {
    for (int v = 0; v < p->g->n_values; v++) drop_mirror(p, v);
}

void pp_device_plan_drop(pp_device_plan *p, int v) {
    if (!keeps(p, v)) drop_mirror(p, v);
}

void pp_device_plan_free(pp_device_plan *p) {
    if (!p) return;
    for (int v = 0; p->mirror && p->mirror_of && v < p->g->n_values; v++) drop_mirror(p, v);
    free(p->on_device);
    free(p->mirror_of);
    free(p->mirror);
    free(p);
}

const char *pp_device_plan_node_device(const pp_device_plan *p, int node) {
    return p->on_device[node] ? pp_device_name(p->dev) : "cpu";
}

/* t (value v) on the side a reader wants: itself, or its copy over there. */
static pp_status on_side(pp_device_plan *p, int v, pp_tensor *t, int want_device, pp_tensor **out) {
    int is_device = pp_tensor_device(t) != NULL;
    if (is_device == want_device) return *out = t, PP_OK;
    if (p->mirror_of[v] == t && p->mirror[v]) return *out = p->mirror[v], PP_OK;
    pp_tensor *copy;
    PP_TRY(want_device ? pp_device_upload(p->dev, t, &copy) : pp_device_download(p->dev, t, &copy));
    drop_mirror(p, v);
    p->mirror_of[v] = pp_tensor_retain(t);
    p->mirror[v] = copy;
    *out = copy;
    return PP_OK;
}

/* Shape and Size read a tensor's shape alone, which a device tensor has
 * on the host too: their input never crosses. */
static int reads_shape_only(const pp_node *n) {
    return (!n->domain[0] || !strcmp(n->domain, "ai.onnx")) && (!strcmp(n->op_type, "Shape") || !strcmp(n->op_type, "Size"));
}

/* Runs node i on the device (dev_node) or the CPU, its inputs moved to
 * that side. */
static pp_status run_on(pp_device_plan *p, int i, pp_kernel_ctx *ctx, int dev_node) {
    const pp_node *n = ctx->node;
    pp_tensor *ins[64];
    int shape_only = !dev_node && reads_shape_only(n);
    for (int k = 0; k < ctx->n_in; k++) {
        ins[k] = ctx->in[k];
        if (!ins[k] || n->in[k] < 0 || shape_only) continue;
        int want = dev_node && !(p->dev->ops->input_on_host && p->dev->ops->input_on_host(n, k));
        PP_TRY(on_side(p, n->in[k], ctx->in[k], want, &ins[k]));
    }
    pp_kernel_ctx c = *ctx;
    c.in = ins;
    return dev_node ? p->dev->ops->run(p->dev, &c) : n->op->run(&c);
}

pp_status pp_device_plan_run(pp_device_plan *p, int i, pp_kernel_ctx *ctx) {
    if (!p->on_device[i]) return run_on(p, i, ctx, 0);
    pp_status s = run_on(p, i, ctx, 1);
    /* A claimed node the device finds it cannot run after all (a dtype
     * only known now): the CPU runs it. The backend set no output. */
    if (s == PP_ERR_UNSUPPORTED && p->dev->ops->run != NULL) {
        p->dev->stats.fallbacks++;
        s = run_on(p, i, ctx, 0);
    }
    return s;
}

pp_status pp_device_plan_finish(pp_device_plan *p, pp_tensor **env, const uint8_t *resident,
                                const uint8_t *host_written, const uint8_t *no_wait) {
    const pp_graph *g = p->g;
    pp_status s = PP_OK;
    /* Start every download, then wait once for all (they overlap). */
    for (int v = 0; v < g->n_values && s == PP_OK; v++) {
        if (!env[v] || !pp_tensor_device(env[v]) || (resident && resident[v])) continue;
        pp_tensor *host;
        if (p->mirror_of[v] == env[v] && p->mirror[v]) /* a CPU node read it: already down */
            host = pp_tensor_retain(p->mirror[v]);
        else if ((s = pp_device_download_async(p->dev, env[v], &host)) != PP_OK)
            break;
        pp_tensor_free(env[v]);
        env[v] = host;
    }
    for (int v = 0; v < g->n_values; v++) {
        if (env[v] && pp_tensor_memory_kind(env[v]) == PP_MEMORY_PINNED && !(no_wait && no_wait[v])) {
            pp_status w = pp_device_staging_wait(p->dev, env[v]);
            if (s == PP_OK) s = w;
        }
        if (host_written && host_written[v]) drop_mirror(p, v); /* the host may change it before the next */
        else pp_device_plan_drop(p, v); /* copies of constants serve the next run too */
    }
    return s;
}

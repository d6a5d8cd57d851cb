/* The autodiff pass: which values carry gradients, the reverse sweep that
 * calls the rules and accumulates, and the F/I/W region split with its
 * stash analysis. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff_internal.h"
#include "autodiff_unfused.h"
#include "grow.h"
#include "pippin/log.h"
#include "pippin/optimize.h"
#include "op.h"

#include "status_internal.h"
#include "log_internal.h"
/* Working arrays of one pass, indexed by value (forward values only). */
typedef struct pass {
    pp_graph *g;
    pp_ad_state st;
    uint8_t *rg;   /* depends on a parameter or requested input */
    uint8_t *nd;   /* reaches the loss or a seed */
    int *acc;      /* accumulated gradient value, or -1 */
    int *uses;     /* readers of each value (graph outputs and seeds count) */
} pass;

static int bit(uint32_t mask, int k) { return (mask >> (k < 31 ? k : 31)) & 1u; }

static int value_is_float(const pp_value *v) {
    return v->dtype == PP_DTYPE_UNDEFINED || pp_dtype_is_float(v->dtype);
}

/* Output k of node n may carry a gradient: a float, and not a Cast to ints. */
static int output_may_be_float(const pp_graph *g, const pp_node *n, int k) {
    if (!value_is_float(&g->values[n->out[k]])) return 0;
    if (strcmp(n->op_type, "Cast") == 0)
        return pp_dtype_is_float((pp_dtype)pp_node_attr_int(n, "to", PP_F32));
    return 1;
}

/* "[batch,10]" (dim names where known), "" for an unknown rank. */
static const char *dims_str(const pp_value *v, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int d = 0; d < v->ndim && n + 24 < cap; d++) {
        const char *sep = d ? "," : "[";
        if (v->dim_names[d]) n += (size_t)snprintf(buf + n, cap - n, "%s%.20s", sep, v->dim_names[d]);
        else if (v->shape[d] < 0) n += (size_t)snprintf(buf + n, cap - n, "%s?", sep);
        else n += (size_t)snprintf(buf + n, cap - n, "%s%lld", sep, (long long)v->shape[d]);
    }
    if (v->ndim == 0) snprintf(buf, cap, "[]");
    else if (v->ndim > 0 && n + 1 < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

static pp_status check_spec(const pp_graph *g, const pp_backward_spec *spec) {
    char buf[160];
    if (spec->loss < 0 && spec->n_seeds == 0)
        return pp_error(PP_ERR_INVALID, "autodiff: no loss and no seed gradients given");
    if (spec->loss >= g->n_values) return pp_error(PP_ERR_INVALID, "autodiff: bad loss value id");
    if (spec->loss >= 0) {
        const pp_value *v = &g->values[spec->loss];
        int scalar = 1;
        for (int d = 0; d < v->ndim; d++)
            if (v->shape[d] != 1) scalar = 0;
        if (!value_is_float(v) || !scalar)
            return pp_error(PP_ERR_INVALID,
                            "loss '%s' is %s%s: training needs a float scalar loss", v->name,
                            pp_dtype_name(v->dtype), dims_str(v, buf, sizeof buf));
    }
    for (int i = 0; i < spec->n_seeds; i++)
        if (spec->seeds[i] < 0 || spec->seeds[i] >= g->n_values)
            return pp_error(PP_ERR_INVALID, "autodiff: bad seed value id");
    for (int i = 0; i < spec->n_wrt; i++) {
        int w = spec->wrt[i];
        if (w < 0 || w >= g->n_values || g->values[w].kind != PP_VALUE_INPUT)
            return pp_error(PP_ERR_INVALID, "autodiff: gradients can be asked for graph inputs only");
        const pp_value *v = &g->values[w];
        if (!value_is_float(v))
            return pp_error(PP_ERR_INVALID,
                            "cannot take the gradient with respect to input '%s': it is %s, "
                            "not a float",
                            v->name, pp_dtype_name(v->dtype));
    }
    return PP_OK;
}

/* rg: forward reachability from parameters and requested inputs; nd:
 * backward reachability from the loss and seeds. A gradient path through an
 * op without a rule is an error naming the op. */
static pp_status reachability(pass *p, const pp_backward_spec *spec) {
    pp_graph *g = p->g;
    for (int v = 0; v < g->n_values; v++)
        p->rg[v] = g->values[v].kind == PP_VALUE_PARAM && value_is_float(&g->values[v]);
    for (int i = 0; i < spec->n_wrt; i++) p->rg[spec->wrt[i]] = 1;
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        uint32_t mask = pp_grad_rule_inputs(n->domain, n->op_type);
        int any = 0;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0 && bit(mask, k) && p->rg[n->in[k]]) any = 1;
        for (int k = 0; any && k < n->n_out; k++)
            if (n->out[k] >= 0 && output_may_be_float(g, n, k)) p->rg[n->out[k]] = 1;
    }
    if (spec->loss >= 0) p->nd[spec->loss] = 1;
    for (int i = 0; i < spec->n_seeds; i++) p->nd[spec->seeds[i]] = 1;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const pp_node *n = &g->nodes[i];
        int needed = 0;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0 && p->nd[n->out[k]]) needed = 1;
        if (!needed) continue;
        uint32_t mask = pp_grad_rule_inputs(n->domain, n->op_type);
        if (!mask) {
            if (pp_grad_op_is_constant(n->domain, n->op_type)) continue;
            for (int k = 0; k < n->n_in; k++)
                if (n->in[k] >= 0 && p->rg[n->in[k]])
                    return pp_node_error(n, PP_ERR_UNSUPPORTED,
                                         "no gradient rule for this op, which lies on the "
                                         "path from '%s' to the loss",
                                         g->values[n->in[k]].name);
            continue;
        }
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0 && bit(mask, k)) p->nd[n->in[k]] = 1;
    }
    return PP_OK;
}

/* Adds contribution gv to value v's gradient (an Add node from the second on). */
static pp_status accumulate(pass *p, pp_grad_ctx *c, int v, int gv) {
    if (p->acc[v] < 0) {
        p->acc[v] = gv;
        return PP_OK;
    }
    return pp_grad_op1(c, "Add", "", p->acc[v], gv, &p->acc[v]);
}

/* A new graph input carrying the gradient of forward value v. */
static pp_status add_seed(pp_graph *g, int v, int *id) {
    char name[512];
    snprintf(name, sizeof name, "%s_grad", g->values[v].name);
    const char *nm = pp_graph_find_value(g, name) >= 0 ? pp_graph_unique_name(g, name) : name;
    pp_value src = g->values[v];
    pp_dtype dt = src.dtype == PP_DTYPE_UNDEFINED ? PP_F32 : src.dtype;
    PP_TRY(pp_graph_add_input(g, nm, dt, src.ndim, src.ndim > 0 ? src.shape : NULL, id));
    for (int d = 0; d < src.ndim; d++)
        if (src.dim_names[d]) g->values[*id].dim_names[d] = strdup(src.dim_names[d]);
    return PP_OK;
}

/* A decomposed GELU ending at node i: one pippin::GeluGrad for the whole
 * pattern. Returns 1 if node i was such a pattern (handled). */
static int fused_gelu(pass *p, int i, pp_status *s) {
    pp_graph *g = p->g;
    int x, kind = pp_ad_match_gelu(g, i, p->uses, &x);
    if (!kind) return 0;
    int y = g->nodes[i].out[0], dy = p->rg[y] && p->nd[y] ? p->acc[y] : -1;
    *s = PP_OK;
    if (dy < 0 || !p->rg[x] || !p->nd[x]) return 1;
    pp_grad_ctx c = {g, i, NULL, NULL, NULL, &p->st};
    int in[2] = {dy, x}, gx, id;
    *s = pp_grad_emit(&c, "GeluGrad", "pippin", 2, in, 1, NULL, &gx, &id);
    if (*s == PP_OK && kind == 1) *s = pp_node_set_string(g, id, "approximate", "tanh");
    if (*s == PP_OK) *s = accumulate(p, &c, x, gx);
    return 1;
}

static pp_status sweep(pass *p) {
    pp_graph *g = p->g;
    int dy[64], dx[64];
    uint8_t need[64];
    for (int i = p->st.n_fwd_nodes - 1; i >= 0; i--) {
        pp_status fs;
        if (fused_gelu(p, i, &fs)) {
            PP_TRY(fs);
            continue;
        }
        const pp_node *n = &g->nodes[i];
        pp_grad_rule rule = pp_grad_rule_find(n->domain, n->op_type);
        if (!rule) continue;
        uint32_t mask = pp_grad_rule_inputs(n->domain, n->op_type);
        if (n->n_in > 64 || n->n_out > 64)
            return pp_node_error(n, PP_ERR_UNSUPPORTED, "more than 64 inputs or outputs");
        int any_dy = 0, any_need = 0;
        for (int k = 0; k < n->n_out; k++) {
            int v = n->out[k];
            dy[k] = v >= 0 && p->rg[v] && p->nd[v] ? p->acc[v] : -1;
            any_dy |= dy[k] >= 0;
        }
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            need[k] = (uint8_t)(v >= 0 && bit(mask, k) && p->rg[v] && p->nd[v]);
            any_need |= need[k];
            dx[k] = -1;
        }
        if (!any_dy || !any_need) continue;
        pp_grad_ctx c = {g, i, dy, dx, need, &p->st};
        pp_status s = rule(&c);
        if (s != PP_OK) {
            char label[512];
            return pp_error_context(s, "gradient of %s", pp_node_label(&g->nodes[i], label, sizeof label));
        }
        /* g->nodes[i] read afresh each time: accumulating adds nodes, which
         * may move the node array (a pointer kept across it dangled) */
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (need[k] && dx[k] >= 0) PP_TRY(accumulate(p, &c, g->nodes[i].in[k], dx[k]));
        for (int k = 0; k < p->st.n_extra; k++)
            PP_TRY(accumulate(p, &c, p->st.extra_v[k], p->st.extra_g[k]));
        p->st.n_extra = 0;
    }
    return PP_OK;
}

/* Appends v to *arr, an array of exactly *n ints (pp_backward's lists). On
 * failure *arr and *n are unchanged: pp_backward_free still frees it all. */
static pp_status push(int **arr, int *n, int v) {
    PP_TRY(PP_GROW_EXACT(*arr, *n));
    (*arr)[(*n)++] = v;
    return PP_OK;
}

/* Makes gradient *gv of value v a graph output, typed like v (so an
 * exported training graph declares it); an Identity keeps outputs unique and
 * never a graph input. */
static pp_status add_grad_output(pp_graph *g, pp_grad_ctx *c, int v, int *gv) {
    int dup = g->values[*gv].kind == PP_VALUE_INPUT;
    for (int i = 0; i < g->n_outputs && !dup; i++) dup = g->outputs[i] == *gv;
    if (dup) PP_TRY(pp_grad_op1(c, "Identity", "", *gv, -2, gv));
    pp_value *t = &g->values[*gv];
    const pp_value *f = &g->values[v];
    if (t->dtype == PP_DTYPE_UNDEFINED && t->ndim < 0) {
        t->dtype = f->dtype;
        t->ndim = f->ndim;
        memcpy(t->shape, f->shape, sizeof t->shape);
        for (int d = 0; d < f->ndim; d++)
            if (f->dim_names[d] && !(t->dim_names[d] = strdup(f->dim_names[d])))
                return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    return pp_graph_add_output(g, *gv);
}

/* Gradients of requested inputs and parameters, as graph outputs. */
static pp_status collect(pass *p, const pp_backward_spec *spec, pp_backward *b) {
    pp_graph *g = p->g;
    pp_grad_ctx c = {g, -1, NULL, NULL, NULL, &p->st};
    b->wrt_values = calloc((size_t)spec->n_wrt + 1, sizeof(int));
    b->wrt_grads = calloc((size_t)spec->n_wrt + 1, sizeof(int));
    if (!b->wrt_values || !b->wrt_grads) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < spec->n_wrt; i++) {
        int w = spec->wrt[i], gv = p->acc[w];
        if (gv < 0) { /* no path from this input to the loss: zeros */
            int shape, id;
            PP_TRY(pp_grad_shape_of(&c, w, &shape));
            PP_TRY(pp_grad_emit(&c, "ConstantOfShape", "", 1, &shape, 1, NULL, &gv, &id));
            pp_tensor *zero;
            int64_t one = 1;
            PP_TRY(pp_tensor_new(PP_F32, 1, &one, &zero));
            PP_TRY(pp_node_set_tensor(g, id, "value", zero));
        }
        PP_TRY(add_grad_output(g, &c, w, &gv));
        b->wrt_values[b->n_wrt] = w;
        b->wrt_grads[b->n_wrt++] = gv;
    }
    for (int v = 0; v < p->st.n_fwd_values; v++) {
        if (g->values[v].kind != PP_VALUE_PARAM || !value_is_float(&g->values[v])) continue;
        if (p->acc[v] < 0) {
            PP_TRY(push(&b->frozen, &b->n_frozen, v));
            continue;
        }
        int gv = p->acc[v];
        PP_TRY(add_grad_output(g, &c, v, &gv));
        PP_TRY(PP_GROW_EXACT(b->param_grads, b->n_params));
        b->param_grads[b->n_params] = gv;
        PP_TRY(push(&b->params, &b->n_params, v));
    }
    return PP_OK;
}

/* Tags regions and lists nodes, stash and I->W handoff values. */
static pp_status regions(pass *p, pp_backward *b) {
    pp_graph *g = p->g;
    int nf = p->st.n_fwd_nodes;
    uint8_t *mark = calloc((size_t)g->n_values + 1, 1);  /* feeds an input gradient */
    uint8_t *dep = calloc((size_t)g->n_values + 1, 1);   /* depends on a graph input */
    uint8_t *fwdv = calloc((size_t)g->n_values + 1, 1);  /* a forward value */
    uint8_t *reg = calloc((size_t)g->n_values + 1, 1);   /* producer region + 1 of I/W values */
    uint8_t *seen = calloc((size_t)g->n_values + 1, 1);
    pp_status s = PP_OK;
    if (!mark || !dep || !fwdv || !reg || !seen) {
        s = pp_error(PP_ERR_NOMEM, "out of memory in autodiff");
        goto done;
    }
    for (int i = 0; i < b->n_wrt; i++) mark[b->wrt_grads[i]] = 1;
    for (int j = g->n_nodes - 1; j >= nf; j--) {
        pp_node *n = &g->nodes[j];
        if (pp_ad_is_side(&p->st, j)) {
            n->region = PP_REGION_FORWARD;
            continue;
        }
        int in_i = 0;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0 && mark[n->out[k]]) in_i = 1;
        n->region = in_i ? PP_REGION_BACKWARD_INPUT : PP_REGION_BACKWARD_WEIGHT;
        for (int k = 0; in_i && k < n->n_in; k++)
            if (n->in[k] >= 0) mark[n->in[k]] = 1;
    }
    for (int v = 0; v < p->st.n_fwd_values; v++) {
        fwdv[v] = g->values[v].kind == PP_VALUE_INPUT || g->values[v].kind == PP_VALUE_NODE;
        dep[v] = g->values[v].kind == PP_VALUE_INPUT;
    }
    for (int j = 0; j < g->n_nodes; j++) {
        pp_node *n = &g->nodes[j];
        if (j >= nf && !pp_ad_is_side(&p->st, j)) {
            for (int k = 0; k < n->n_out; k++)
                if (n->out[k] >= 0) reg[n->out[k]] = (uint8_t)(n->region + 1);
            continue;
        }
        n->region = PP_REGION_FORWARD;
        if ((s = push(&b->forward_nodes, &b->n_forward, j)) != PP_OK) goto done;
        int d = 0;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0) d |= dep[n->in[k]];
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0) {
                dep[n->out[k]] = (uint8_t)d;
                fwdv[n->out[k]] = 1;
            }
    }
    for (int j = nf; j < g->n_nodes; j++) {
        pp_node *n = &g->nodes[j];
        if (pp_ad_is_side(&p->st, j)) continue;
        s = n->region == PP_REGION_BACKWARD_INPUT ? push(&b->i_nodes, &b->n_i, j)
                                                  : push(&b->w_nodes, &b->n_w, j);
        if (s != PP_OK) goto done;
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            if (v < 0) continue;
            if (fwdv[v]) seen[v] |= 1;
            if (n->region == PP_REGION_BACKWARD_WEIGHT && reg[v] == PP_REGION_BACKWARD_INPUT + 1)
                seen[v] |= 2;
        }
    }
    b->stash_static = malloc((size_t)g->n_values + 1);
    if (!b->stash_static) {
        s = pp_error(PP_ERR_NOMEM, "out of memory in autodiff");
        goto done;
    }
    for (int v = 0; v < g->n_values; v++) {
        if (seen[v] & 1) {
            b->stash_static[b->n_stash] = (uint8_t)!dep[v];
            if ((s = push(&b->stash, &b->n_stash, v)) != PP_OK) goto done;
        }
        if ((seen[v] & 2) && (s = push(&b->handoff, &b->n_handoff, v)) != PP_OK) goto done;
    }
done:
    free(mark);
    free(dep);
    free(fwdv);
    free(reg);
    free(seen);
    return s;
}

static pp_status run_pass(pass *p, const pp_backward_spec *spec, pp_backward *b) {
    pp_graph *g = p->g;
    int nv = g->n_values;
    p->rg = calloc((size_t)nv + 1, 1);
    p->nd = calloc((size_t)nv + 1, 1);
    p->acc = malloc(sizeof(int) * ((size_t)nv + 1));
    p->uses = calloc((size_t)nv + 1, sizeof(int));
    if (!p->rg || !p->nd || !p->acc || !p->uses)
        return pp_error(PP_ERR_NOMEM, "out of memory in autodiff");
    for (int v = 0; v < nv; v++) p->acc[v] = -1;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] >= 0) p->uses[g->nodes[i].in[k]]++;
    for (int i = 0; i < g->n_outputs; i++) p->uses[g->outputs[i]]++;
    for (int i = 0; i < spec->n_seeds; i++) p->uses[spec->seeds[i]]++;
    if (spec->loss >= 0) p->uses[spec->loss]++;
    PP_TRY(pp_ad_state_init(&p->st, g));
    PP_TRY(reachability(p, spec));
    /* Seed inputs: the loss first. */
    int n_seeds = (spec->loss >= 0) + spec->n_seeds;
    b->seed_values = calloc((size_t)n_seeds + 1, sizeof(int));
    b->seed_grads = calloc((size_t)n_seeds + 1, sizeof(int));
    if (!b->seed_values || !b->seed_grads) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_seeds; i++) {
        int v = i == 0 && spec->loss >= 0 ? spec->loss : spec->seeds[i - (spec->loss >= 0)];
        int id;
        PP_TRY(add_seed(g, v, &id));
        b->seed_values[b->n_seeds] = v;
        b->seed_grads[b->n_seeds++] = id;
        if (p->acc[v] < 0) {
            p->acc[v] = id;
        } else { /* the same value seeded twice: add up */
            pp_grad_ctx c = {g, -1, NULL, NULL, NULL, &p->st};
            PP_TRY(pp_grad_op1(&c, "Add", "", p->acc[v], id, &p->acc[v]));
        }
    }
    PP_TRY(sweep(p));
    PP_TRY(collect(p, spec, b));
    return regions(p, b);
}

void pp_backward_spec_init(pp_backward_spec *s) {
    memset(s, 0, sizeof *s);
    s->loss = -1;
}

/* 1 if every value the backward starts from is a graph output, which the
 * optimizer keeps (it may remove what no node and no output reads). */
static int is_output(const pp_graph *g, int v) {
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return 1;
    return 0;
}

static int seeds_are_outputs(const pp_graph *g, const pp_backward_spec *spec) {
    if (spec->loss >= 0 && !is_output(g, spec->loss)) return 0;
    for (int i = 0; i < spec->n_seeds; i++)
        if (!is_output(g, spec->seeds[i])) return 0;
    return 1;
}

static pp_status autodiff(pp_graph *g, const pp_backward_spec *spec, int fuse, pp_backward **out) {
    *out = NULL;
    PP_TRY(pp_graph_resolve(g));
    PP_TRY(check_spec(g, spec));
    /* Fusions with gradient rules first (MatMul by a transposed weight and
     * its bias as one GEMM): the forward gets cheaper and the backward is
     * built from the fused nodes. */
    if (fuse && seeds_are_outputs(g, spec)) PP_TRY(pp_graph_optimize_for_training(g, NULL));
    else if (fuse) pp_debug("autodiff: a seed or the loss is no graph output: the forward is not fused");
    PP_TRY(pp_ad_prepare_training_ops(g));
    pp_backward *b = calloc(1, sizeof *b);
    if (!b) return pp_error(PP_ERR_NOMEM, "out of memory in autodiff");
    b->n_values_before = g->n_values;
    b->n_inputs_before = g->n_inputs;
    b->n_outputs_before = g->n_outputs;
    pass p = {.g = g};
    pp_status s = run_pass(&p, spec, b);
    free(p.rg);
    free(p.nd);
    free(p.acc);
    free(p.uses);
    pp_ad_state_clear(&p.st);
    if (s != PP_OK) {
        pp_backward_free(b);
        return s;
    }
    pp_debug("autodiff: %d forward, %d I, %d W nodes; %d parameters, %d stashed values",
             b->n_forward, b->n_i, b->n_w, b->n_params, b->n_stash);
    *out = b;
    return PP_OK;
}

pp_status pp_autodiff(pp_graph *g, const pp_backward_spec *spec, pp_backward **out) {
    return autodiff(g, spec, 1, out);
}

pp_status pp_autodiff_unfused(pp_graph *g, const pp_backward_spec *spec, pp_backward **out) {
    return autodiff(g, spec, 0, out);
}

void pp_backward_free(pp_backward *b) {
    if (!b) return;
    free(b->seed_values);
    free(b->seed_grads);
    free(b->wrt_values);
    free(b->wrt_grads);
    free(b->params);
    free(b->param_grads);
    free(b->forward_nodes);
    free(b->i_nodes);
    free(b->w_nodes);
    free(b->stash);
    free(b->stash_static);
    free(b->handoff);
    free(b->frozen);
    free(b);
}

/* Optimizer pass "matmul": a float32 MatMul by a 2-D weight, with what
 * follows it, becomes one pippin::MatMulAdd (lib/ops/matmul_fused.c):
 *   MatMul(x, W)                       W an initializer [K, N]
 *   MatMul(x, Transpose(W))            W [N, K], perm [1, 0]: transB = 1
 *   ... then Add(bias, .) or Add(., bias), bias an initializer [N]
 *   ... then Relu, or Gelu (either approximation)
 * Each value between the pieces must have that one reader and not be a
 * graph output. torch exports every nn.Linear as MatMul(x, Transpose(W))
 * then Add(b, .): one GEMM reading W in place, with the bias and the
 * activation applied to each output row, instead of a transposed copy of
 * W (kept by the executor), the product, and one pass over it per
 * elementwise node. A bare MatMul(x, W) is left alone: nothing to gain.
 * A Gemm (alpha = beta = 1, no transA) by such a weight with a bias [N] or
 * none becomes one too when a Relu or Gelu follows it (the activation is
 * what it gains). In inference graphs the Transpose of a weight read by
 * one MatMul becomes pippin::PackWeight and the MatMulAdd reads the packed
 * panels (packed_n = N; lib/ops/gemm_packed.c): the executor packs once,
 * OpenBLAS would pack on every call. Before a training graph's backward is built
 * (pp_graph_optimize_for_training) the activation stays a node of its own:
 * its gradient needs the value before it, which the fused node does not
 * keep (nor is a residual Add after it taken in, as inference graphs do:
 * Add(y, r) with r made before the MatMul becomes MatMulAdd's input 3);
 * the transpose and the bias are still taken, and MatMulAdd's
 * gradient rule (lib/grad_rules_nn.c) reads W in place too. */
#include <string.h>

#include "opt_internal.h"

#include "status_internal.h"

/* A 2-D float32 initializer. */
static const pp_tensor *weight(const pp_graph *g, int v) {
    const pp_tensor *t = pp_opt_initializer(g, v);
    return t && t->dtype == PP_F32 && t->ndim == 2 ? t : NULL;
}

/* Finds W for MatMul input b: *w and *trans_b, 1 if found. */
static int find_weight(const pp_opt_ctx *c, int b, int *w, int *trans_b) {
    const pp_graph *g = c->g;
    if (weight(g, b)) {
        *w = b;
        *trans_b = 0;
        return 1;
    }
    int t = pp_opt_producer(c, b, "Transpose");
    if (t < 0 || g->nodes[t].n_in != 1 || !weight(g, g->nodes[t].in[0])) return 0;
    const int64_t *perm;
    int np = pp_node_attr_ints(&g->nodes[t], "perm", &perm);
    if (np >= 0 && (np != 2 || perm[0] != 1 || perm[1] != 0)) return 0;
    *w = g->nodes[t].in[0];
    *trans_b = 1;
    return 1;
}

/* The bias of Add node a over value y: a float32 initializer of N
 * elements, 1-D. -1 if none. */
static int find_bias(const pp_graph *g, int a, int y, int64_t n) {
    const pp_node *add = &g->nodes[a];
    if (add->n_in != 2 || add->n_out != 1) return -1;
    int other = add->in[0] == y ? add->in[1] : add->in[0];
    if (add->in[0] == add->in[1]) return -1;
    const pp_tensor *t = pp_opt_initializer(g, other);
    if (!t || t->dtype != PP_F32 || t->ndim != 1 || t->shape[0] != n) return -1;
    return other;
}

/* The activation node reading y alone, and its name for MatMulAdd. */
static const char *find_activation(const pp_opt_ctx *c, int y, int *node) {
    *node = pp_opt_sole_reader(c, y);
    if (*node < 0) return NULL;
    const pp_node *n = &c->g->nodes[*node];
    if (n->n_in != 1 || n->n_out != 1) return NULL;
    if (pp_opt_is_op(n, "Relu")) return "relu";
    if (pp_opt_is_op(n, "Gelu")) {
        const char *approx = pp_node_attr_string(n, "approximate", "none");
        if (strcmp(approx, "tanh") == 0) return "gelu_tanh";
        if (strcmp(approx, "none") == 0) return "gelu";
    }
    return NULL;
}

/* Inference: the Add reading y alone that adds a residual r to it, r made
 * before node i (the fused node reads it there); r, or -1. */
static int find_residual(const pp_opt_ctx *c, int i, int y, int *node) {
    const pp_graph *g = c->g;
    *node = pp_opt_sole_reader(c, y);
    if (c->training || *node < 0) return -1;
    const pp_node *add = &g->nodes[*node];
    if (!pp_opt_is_op(add, "Add") || add->n_in != 2 || add->n_out != 1 || add->in[0] == add->in[1]) return -1;
    int r = add->in[0] == y ? add->in[1] : add->in[0];
    if (r < 0 || pp_opt_initializer(g, r)) return -1; /* a constant: a bias of another shape, not a residual */
    int made = g->values[r].producer;
    return made < i ? r : -1;
}

/* Inference: the Split that alone reads packed MatMulAdd i's output y,
 * with its sizes given (an attribute or a constant input) and at most 16
 * parts, is taken in: node i makes the parts ("axis", "split"), and where
 * the cut is along the last axis at multiples of the GEMM's 16-column
 * panels the GEMM stores each tile in its part (the QKV projection's
 * Split: no copy); else the Split kernel cuts the product
 * (lib/ops/matmul_fused.c). 1 if taken. */
static int take_split(pp_opt_ctx *c, int i, pp_status *st) {
    pp_graph *g = c->g;
    *st = PP_OK;
    int sp = pp_opt_sole_reader(c, g->nodes[i].out[0]);
    if (sp < 0 || !pp_opt_is_op(&g->nodes[sp], "Split")) return 0;
    const pp_node *s = &g->nodes[sp];
    if (s->n_out < 2 || s->n_out > 16 || s->n_in < 1 || s->in[0] != g->nodes[i].out[0]) return 0;
    int64_t sizes[16];
    const int64_t *attr;
    int na = pp_node_attr_ints(s, "split", &attr);
    const pp_tensor *t = s->n_in > 1 && s->in[1] >= 0 ? pp_opt_initializer(g, s->in[1]) : NULL;
    if (t && t->dtype == PP_I64 && t->ndim == 1 && t->shape[0] == s->n_out)
        memcpy(sizes, t->data, sizeof(int64_t) * (size_t)s->n_out);
    else if (s->n_in == 1 && na == s->n_out)
        memcpy(sizes, attr, sizeof(int64_t) * (size_t)s->n_out);
    else
        return 0;
    for (int k = 0; k < s->n_out; k++)
        if (sizes[k] < 0) return 0;
    int outs[16];
    memcpy(outs, s->out, sizeof(int) * (size_t)s->n_out);
    int n = s->n_out;
    int64_t axis = pp_node_attr_int(s, "axis", 0);
    if ((*st = pp_node_set_ints(g, i, "split", n, sizes)) != PP_OK) return 0;
    if ((*st = pp_node_set_int(g, i, "axis", axis)) != PP_OK) return 0;
    pp_opt_kill(c, sp);
    if ((*st = pp_opt_take_outputs(c, i, n, outs)) != PP_OK) return 0;
    return 1;
}

/* Gemm node i as MatMulAdd: W, transB, bias (-1: none); 0 if it does not fit. */
static int gemm_fits(const pp_opt_ctx *c, int i, int *w, int *trans_b, int *bias) {
    const pp_graph *g = c->g;
    const pp_node *n = &g->nodes[i];
    if (n->n_in < 2 || n->n_in > 3 || n->n_out != 1 || n->in[0] < 0 || !weight(g, n->in[1])) return 0;
    if (pp_node_attr_int(n, "transA", 0) != 0 || pp_node_attr_float(n, "alpha", 1.0f) != 1.0f) return 0;
    *w = n->in[1];
    *trans_b = pp_node_attr_int(n, "transB", 0) != 0;
    *bias = n->n_in > 2 ? n->in[2] : -1;
    if (*bias < 0) return 1;
    if (pp_node_attr_float(n, "beta", 1.0f) != 1.0f) return 0;
    const pp_tensor *wt = g->values[*w].data, *b = pp_opt_initializer(g, *bias);
    int64_t nn = *trans_b ? wt->shape[0] : wt->shape[1];
    return b && b->dtype == PP_F32 && b->ndim == 1 && b->shape[0] == nn;
}

static pp_status fuse_gemm(pp_opt_ctx *c, int i, int *count) {
    pp_graph *g = c->g;
    int w, trans_b, bias, act_node;
    if (c->training || !gemm_fits(c, i, &w, &trans_b, &bias)) return PP_OK;
    const char *act = find_activation(c, g->nodes[i].out[0], &act_node);
    if (!act) return PP_OK;
    int y = g->nodes[act_node].out[0], ins[3] = {g->nodes[i].in[0], w, bias};
    PP_TRY(pp_opt_rewrite(c, i, "MatMulAdd", "pippin", bias >= 0 ? 3 : 2, ins));
    if (trans_b) PP_TRY(pp_node_set_int(g, i, "transB", 1));
    PP_TRY(pp_node_set_string(g, i, "activation", act));
    pp_opt_kill(c, act_node);
    pp_opt_take_output(c, i, y);
    (*count)++;
    return PP_OK;
}

pp_status pp_opt_matmul(pp_opt_ctx *c, int *count) {
    pp_graph *g = c->g;
    *count = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (c->dead[i]) continue;
        if (pp_opt_is_op(&g->nodes[i], "Gemm")) {
            PP_TRY(fuse_gemm(c, i, count));
            continue;
        }
        if (!pp_opt_is_op(&g->nodes[i], "MatMul")) continue;
        const pp_node *mm = &g->nodes[i];
        int w, trans_b;
        if (mm->n_in != 2 || mm->n_out != 1 || mm->in[0] < 0 || !find_weight(c, mm->in[1], &w, &trans_b)) continue;
        const pp_tensor *wt = g->values[w].data;
        int64_t n = trans_b ? wt->shape[0] : wt->shape[1];
        int y = mm->out[0], add = pp_opt_sole_reader(c, y), bias = -1, act_node = -1;
        if (add >= 0 && pp_opt_is_op(&g->nodes[add], "Add") && (bias = find_bias(g, add, y, n)) >= 0)
            y = g->nodes[add].out[0];
        else
            add = -1;
        const char *act = c->training ? NULL : find_activation(c, y, &act_node);
        if (act) y = g->nodes[act_node].out[0];
        else act_node = -1;
        if (!trans_b && bias < 0 && !act) continue;
        int res_node, res = find_residual(c, i, y, &res_node);
        if (res >= 0) y = g->nodes[res_node].out[0];
        /* Inference: the Transpose becomes PackWeight (the weight packed
         * once for pp_gemm_packed_f32) when this MatMul is its only reader. */
        int tv = mm->in[1], t = trans_b ? pp_opt_producer(c, tv, "Transpose") : -1;
        int pack = !c->training && t >= 0 && pp_opt_sole_reader(c, tv) == i && n <= INT32_MAX;
        if (pack) {
            PP_TRY(pp_opt_rewrite(c, t, "PackWeight", "pippin", 1, &w));
            PP_TRY(pp_node_set_int(g, t, "transB", 1));
        }
        int ins[4] = {mm->in[0], pack ? tv : w, bias, res};
        PP_TRY(pp_opt_rewrite(c, i, "MatMulAdd", "pippin", res >= 0 ? 4 : bias >= 0 ? 3 : 2, ins));
        if (pack) PP_TRY(pp_node_set_int(g, i, "packed_n", n));
        else if (trans_b) PP_TRY(pp_node_set_int(g, i, "transB", 1));
        if (act) PP_TRY(pp_node_set_string(g, i, "activation", act));
        if (act_node >= 0) pp_opt_kill(c, act_node);
        if (add >= 0) pp_opt_kill(c, add);
        if (res >= 0) pp_opt_kill(c, res_node);
        if (y != g->nodes[i].out[0]) pp_opt_take_output(c, i, y);
        if (pack && !act && res < 0) {
            pp_status st;
            (void)take_split(c, i, &st);
            PP_TRY(st);
        }
        (*count)++;
    }
    return PP_OK;
}

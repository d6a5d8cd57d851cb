/* Composite ops that exporters decompose, recognised so their backward is
 * one fused node. PyTorch 1.13 exports F.gelu (opset 17 has no Gelu) as
 *   tanh form: 0.5 * (x * (1 + tanh(0.7978846 * (x + 0.044715 * (x * (x * x))))))
 *   erf form:  0.5 * (x * (1 + erf(x / 1.4142135)))
 * whose backward through the pieces is a dozen nodes that keep most of the
 * intermediates; pippin::GeluGrad needs x alone. */
#include <math.h>
#include <string.h>

#include "autodiff_internal.h"

/* Producer of v if it is a default-domain op_type node, else -1. */
static int producer(const pp_graph *g, int v, const char *op_type) {
    if (v < 0 || g->values[v].kind != PP_VALUE_NODE) return -1;
    int p = g->values[v].producer;
    const pp_node *n = &g->nodes[p];
    if (strcmp(n->op_type, op_type) != 0) return -1;
    if (n->domain[0] && strcmp(n->domain, "ai.onnx") != 0) return -1;
    int arity = strcmp(op_type, "Constant") == 0 ? 0 : (strcmp(op_type, "Tanh") == 0 ||
                                                         strcmp(op_type, "Erf") == 0 ? 1 : 2);
    return n->n_in == arity ? p : -1;
}

/* v is a float scalar constant (an initializer or a Constant node's
 * output) equal to c. */
static int is_const(const pp_graph *g, int v, double c) {
    if (v < 0) return 0;
    const pp_value *val = &g->values[v];
    const pp_tensor *t = val->kind == PP_VALUE_CONST ? val->data : NULL;
    if (val->kind == PP_VALUE_NODE && producer(g, v, "Constant") >= 0) {
        const pp_attr *a = pp_node_attr(&g->nodes[val->producer], "value");
        t = a && a->type == PP_ATTR_TENSOR ? a->t : NULL;
    }
    if (!t || pp_tensor_numel(t) != 1 || !pp_dtype_is_float(t->dtype)) return 0;
    return fabs(pp_tensor_get_f64(t, 0) - c) <= 1e-5 * fabs(c);
}

/* v = op(k, w) or op(w, k) (only op(w, k) when ordered) with k a scalar
 * constant equal to c: returns w, else -1. Appends the node to path. */
static int with_const(const pp_graph *g, int v, const char *op, double c, int ordered, int *path,
                      int *np) {
    int p = producer(g, v, op);
    if (p < 0) return -1;
    const pp_node *n = &g->nodes[p];
    int w = -1;
    if (is_const(g, n->in[1], c)) w = n->in[0];
    else if (!ordered && is_const(g, n->in[0], c)) w = n->in[1];
    if (w >= 0) path[(*np)++] = p;
    return w;
}

/* v = op(x, w) or op(w, x): returns w, else -1. */
static int with_value(const pp_graph *g, int v, const char *op, int x, int *path, int *np) {
    int p = producer(g, v, op);
    if (p < 0) return -1;
    const pp_node *n = &g->nodes[p];
    int w = n->in[0] == x ? n->in[1] : (n->in[1] == x ? n->in[0] : -1);
    if (w >= 0) path[(*np)++] = p;
    return w;
}

/* The inner part, given x and a1 (the "1 + tanh/erf(...)" value). */
static int match_inner(const pp_graph *g, int x, int a1, int *path, int *np) {
    int t = with_const(g, a1, "Add", 1.0, 0, path, np);
    int pt = producer(g, t, "Tanh"), pe = producer(g, t, "Erf");
    if (pt >= 0) {
        path[(*np)++] = pt;
        int a0 = with_const(g, g->nodes[pt].in[0], "Mul", 0.7978845608028654, 0, path, np);
        int m2 = with_value(g, a0, "Add", x, path, np);
        int m1 = with_const(g, m2, "Mul", 0.044715, 0, path, np);
        int m0 = with_value(g, m1, "Mul", x, path, np);
        int p0 = producer(g, m0, "Mul");
        if (p0 < 0 || g->nodes[p0].in[0] != x || g->nodes[p0].in[1] != x) return 0;
        path[(*np)++] = p0;
        return 1; /* tanh */
    }
    if (pe >= 0) {
        path[(*np)++] = pe;
        int d = g->nodes[pe].in[0];
        int n0 = *np;
        if (with_const(g, d, "Div", 1.4142135623730951, 1, path, np) == x) return 2;
        *np = n0;
        if (with_const(g, d, "Mul", 0.7071067811865476, 0, path, np) == x) return 2;
    }
    return 0;
}

int pp_ad_match_gelu(const pp_graph *g, int node, const int *uses, int *x_out) {
    const pp_node *n = &g->nodes[node];
    if (n->n_out != 1 || n->out[0] < 0) return 0;
    int path[16], np = 0;
    int m4 = with_const(g, n->out[0], "Mul", 0.5, 0, path, &np);
    int pm = producer(g, m4, "Mul");
    if (pm < 0) return 0;
    path[np++] = pm;
    for (int order = 0; order < 2; order++) {
        int x = g->nodes[pm].in[order], a1 = g->nodes[pm].in[1 - order], k = np;
        int kind = match_inner(g, x, a1, path, &k);
        if (!kind) continue;
        /* Every intermediate feeds only the next piece (root excluded). */
        int ok = 1;
        for (int i = 1; i < k && ok; i++)
            ok = uses[g->nodes[path[i]].out[0]] == 1 && g->nodes[path[i]].n_out == 1;
        if (!ok) continue;
        *x_out = x;
        return kind;
    }
    return 0;
}

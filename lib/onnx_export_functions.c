/* The model-local FunctionProtos of the pippin-domain ops a graph uses
 * (lib/onnx_functions.h): a body built from each node, one function per
 * distinct body ("op", "op__2", ...). An op with no body, or a node its
 * builder cannot express, is logged and the op left without a function: the
 * file still loads in pippin, and ONNX Runtime names the op it lacks rather
 * than computing something else. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "log_internal.h"
#include "onnx_functions.h"

#include "status_internal.h"

#define MAX_OPS 96
#define MAX_ATTRS 32

void pp_fn_line(pp_fn_body *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = sizeof b->text - b->len;
    int k = vsnprintf(b->text + b->len, room, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k + 1 >= room) {
        b->overflow = 1;
        return;
    }
    b->len += (size_t)k;
    b->text[b->len++] = '\n';
    b->text[b->len] = '\0';
}

void pp_fn_float(pp_fn_body *b, const char *name, double v) {
    char num[48];
    snprintf(num, sizeof num, "%.9g", v);
    if (!strpbrk(num, ".eni")) strcat(num, ".0"); /* read back as a float */
    pp_fn_line(b, "%s = Constant<value_float=%s>()", name, num);
}

int pp_fn_has_in(const pp_node *n, int k) { return k < n->n_in && n->in[k] >= 0; }

/* The length of 1-D value v when the graph knows it: its own shape, its
 * data, the rank of what Shape read, a Constant's tensor, or a Concat of
 * such (PyTorch builds Resize's scales that way). depth bounds the walk. */
static int value_len(const pp_graph *g, int v, int depth) {
    const pp_value *val = &g->values[v];
    if (val->data) return val->data->ndim == 1 ? (int)val->data->shape[0] : -1;
    if (val->ndim == 1 && val->shape[0] >= 0) return (int)val->shape[0];
    int i = val->producer;
    if (i < 0 || depth > 8) return -1;
    const pp_node *p = &g->nodes[i];
    if (p->domain && p->domain[0]) return -1;
    if (!strcmp(p->op_type, "Shape") && p->n_attr == 0 && pp_fn_has_in(p, 0)) return g->values[p->in[0]].ndim;
    if (!strcmp(p->op_type, "Constant")) {
        const pp_attr *a = pp_node_attr(p, "value");
        return a && a->t && a->t->ndim == 1 ? (int)a->t->shape[0] : -1;
    }
    if (!strcmp(p->op_type, "Concat")) {
        int total = 0;
        for (int k = 0; k < p->n_in; k++) {
            int len = pp_fn_has_in(p, k) ? value_len(g, p->in[k], depth + 1) : -1;
            if (len < 0) return -1;
            total += len;
        }
        return total;
    }
    return -1;
}

int pp_fn_shape_len(const pp_graph *g, const pp_node *n, int k) {
    return pp_fn_has_in(n, k) ? value_len(g, n->in[k], 0) : -1;
}

int pp_fn_in_rank(const pp_graph *g, const pp_node *n, int k) {
    return pp_fn_has_in(n, k) ? g->values[n->in[k]].ndim : -1;
}

static const pp_fn_entry *const families[] = {pp_fn_act, pp_fn_nn, pp_fn_shape, pp_fn_conv, pp_fn_resize,
                                               pp_fn_attention, pp_fn_rnn, pp_fn_matmul};

static pp_fn_builder find_builder(const char *op) {
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (const pp_fn_entry *e = families[f]; e->op; e++)
            if (strcmp(e->op, op) == 0) return e->build;
    return NULL;
}

static int is_pippin(const pp_node *n) { return n->domain && strcmp(n->domain, "pippin") == 0; }

int pp_onnx_node_inputs(const pp_node *n) {
    if (is_pippin(n) && strcmp(n->op_type, "MatMulAdd") == 0 && n->n_in < 3) return 3;
    return n->n_in;
}

/* Splits "a, b, c" into arena copies. */
static pp_status split_names(const char *list, pp_onnx_alloc_fn alloc, void *ctx, char ***out, size_t *n) {
    size_t k = 0, len = strlen(list);
    char *copy = alloc(ctx, len + 1);
    char **names = alloc(ctx, sizeof *names * (len / 2 + 2));
    if (!copy || !names) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    memcpy(copy, list, len);
    for (char *tok = strtok(copy, ", "); tok; tok = strtok(NULL, ", ")) names[k++] = tok;
    *out = names;
    *n = k;
    return PP_OK;
}

/* Nodes of one op may need different bodies (SplitLike's piece count, an
 * RNN's direction): ONNX keeps one function per name, so the first body is
 * function "op" and each other one "op__2", "op__3", ..., the nodes calling
 * it written with that op type (lib/onnx_import.c reads "op__k" back as op). */
#define MAX_VARIANTS 16

typedef struct fn_variants {
    pp_fn_body *body[MAX_VARIANTS];
    int n;
    int *of_node; /* per graph node: its variant, -1 for other ops */
} fn_variants;

static int same_body(const pp_fn_body *a, const pp_fn_body *b) {
    return !strcmp(a->text, b->text) && !strcmp(a->inputs, b->inputs) && !strcmp(a->outputs, b->outputs) &&
           a->n_in == b->n_in && a->n_out == b->n_out;
}

/* The bodies of op, one per distinct one its nodes need; v->n = 0 (logged)
 * when there is none to write: no builder, or a node it cannot express (no
 * node of op gets a function then, so none runs another's body). */
static pp_status build_bodies(const pp_graph *g, const char *op, pp_onnx_alloc_fn alloc, void *ctx,
                              fn_variants *v) {
    pp_fn_builder build = find_builder(op);
    v->n = 0;
    if (!build) {
        pp_warn("pippin::%s has no ONNX function body: ONNX Runtime and onnx.checker will not load this file",
                op);
        return PP_OK;
    }
    pp_fn_body *b = NULL;
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        v->of_node[i] = -1;
        if (!is_pippin(n) || strcmp(n->op_type, op) != 0) continue;
        if (!b && !(b = alloc(ctx, sizeof *b))) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
        memset(b, 0, sizeof *b);
        pp_status s = build(g, n, b);
        if (s == PP_ERR_UNSUPPORTED) {
            pp_warn("node '%s' (pippin::%s): %s; the file has no ONNX function for pippin::%s", n->name, op,
                    pp_last_error(), op);
            v->n = 0;
            return PP_OK;
        }
        PP_TRY(s);
        b->n_in = pp_onnx_node_inputs(n);
        b->n_out = n->n_out;
        if (b->overflow) return pp_error(PP_ERR_INTERNAL, "pippin::%s: function body too long", op);
        int k = 0;
        while (k < v->n && !same_body(v->body[k], b)) k++;
        if (k == v->n) {
            if (k == MAX_VARIANTS) {
                pp_warn("nodes of pippin::%s need more than %d different ONNX function bodies (node '%s'): "
                        "the file has no function for it",
                        op, MAX_VARIANTS, n->name);
                v->n = 0;
                return PP_OK;
            }
            v->body[v->n++] = b;
            b = NULL; /* kept */
        }
        v->of_node[i] = k;
    }
    return PP_OK;
}

/* The function name of variant k of op: "op", "op__2", ... */
static char *variant_name(const char *op, int k, pp_onnx_alloc_fn alloc, void *ctx) {
    size_t len = strlen(op) + 16;
    char *name = alloc(ctx, len);
    if (!name) return NULL;
    if (k == 0) snprintf(name, len, "%s", op);
    else snprintf(name, len, "%s__%d", op, k + 1);
    return name;
}

static pp_status make_function(const pp_graph *g, const char *op, const char *name, const fn_variants *v, int k,
                               int64_t opset, pp_onnx_alloc_fn alloc, void *ctx, Onnx__FunctionProto **out) {
    const pp_fn_body *body = v->body[k];
    Onnx__FunctionProto *f = alloc(ctx, sizeof *f);
    Onnx__OperatorSetIdProto *os = alloc(ctx, sizeof *os);
    Onnx__OperatorSetIdProto **osl = alloc(ctx, sizeof *osl);
    char **attrs = alloc(ctx, sizeof *attrs * MAX_ATTRS);
    if (!f || !os || !osl || !attrs) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    onnx__function_proto__init(f);
    onnx__operator_set_id_proto__init(os);
    f->name = (char *)name;
    f->domain = (char *)"pippin";
    os->domain = (char *)"";
    os->has_version = 1;
    os->version = opset;
    osl[0] = os;
    f->opset_import = osl;
    f->n_opset_import = 1;
    PP_TRY(split_names(body->inputs, alloc, ctx, &f->input, &f->n_input));
    PP_TRY(split_names(body->outputs, alloc, ctx, &f->output, &f->n_output));
    /* onnx.checker wants the node's counts: the optional ones it leaves off go */
    if (f->n_input > (size_t)body->n_in) f->n_input = (size_t)body->n_in;
    if (f->n_output > (size_t)body->n_out) f->n_output = (size_t)body->n_out;
    /* Every attribute any of its nodes carries is declared, used or not. */
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        if (v->of_node[i] != k) continue;
        for (int a = 0; a < n->n_attr; a++) {
            size_t j = 0;
            while (j < f->n_attribute && strcmp(attrs[j], n->attrs[a].name) != 0) j++;
            if (j == f->n_attribute && j < MAX_ATTRS) attrs[f->n_attribute++] = n->attrs[a].name;
        }
    }
    f->attribute = attrs;
    PP_TRY(pp_onnx_nodes_from_text(body->text, op, alloc, ctx, &f->node, &f->n_node));
    *out = f;
    return PP_OK;
}

pp_status pp_onnx_functions(const pp_graph *g, int64_t opset, pp_onnx_alloc_fn alloc, void *ctx,
                            Onnx__NodeProto **written, Onnx__FunctionProto ***out, size_t *n_out) {
    const char *ops[MAX_OPS];
    int n_ops = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        if (!is_pippin(n)) continue;
        int k = 0;
        while (k < n_ops && strcmp(ops[k], n->op_type) != 0) k++;
        if (k == n_ops && n_ops < MAX_OPS) ops[n_ops++] = n->op_type;
    }
    fn_variants v = {.of_node = alloc(ctx, sizeof(int) * (size_t)(g->n_nodes + 1))};
    *out = alloc(ctx, sizeof **out * (size_t)(n_ops * MAX_VARIANTS + 1));
    *n_out = 0;
    if (!*out || !v.of_node) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    for (int k = 0; k < n_ops; k++) {
        PP_TRY(build_bodies(g, ops[k], alloc, ctx, &v));
        for (int j = 0; j < v.n; j++) {
            char *name = variant_name(ops[k], j, alloc, ctx);
            if (!name) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
            PP_TRY(make_function(g, ops[k], name, &v, j, opset, alloc, ctx, &(*out)[(*n_out)++]));
            for (int i = 0; i < g->n_nodes; i++)
                if (v.of_node[i] == j && j > 0) written[i]->op_type = name;
        }
    }
    return PP_OK;
}

/* The model-local FunctionProtos of the pippin-domain ops a graph uses
 * (lib/onnx_functions.h): one body per op, built from each of its nodes and
 * checked to agree. An op with no body, or whose nodes need different ones,
 * is logged and left without a function: the file still loads in pippin, and
 * ONNX Runtime names the op it lacks rather than computing something else. */
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
                                               pp_fn_attention};

static pp_fn_builder find_builder(const char *op) {
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (const pp_fn_entry *e = families[f]; e->op; e++)
            if (strcmp(e->op, op) == 0) return e->build;
    return NULL;
}

static int is_pippin(const pp_node *n) { return n->domain && strcmp(n->domain, "pippin") == 0; }

int pp_onnx_node_inputs(const pp_node *n) {
    if (is_pippin(n) && strcmp(n->op_type, "MatMulAdd") == 0 && n->n_in < 3 &&
        !pp_node_attr_string(n, "activation", "")[0])
        return 3;
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

/* The body of op, from every node of it; 0 in *ok (logged) when there is
 * none to write. */
static pp_status build_body(const pp_graph *g, const char *op, pp_onnx_alloc_fn alloc, void *ctx,
                            pp_fn_body *body, int *ok) {
    pp_fn_builder build = find_builder(op);
    *ok = 0;
    if (!build) {
        pp_warn("pippin::%s has no ONNX function body: ONNX Runtime and onnx.checker will not load this file",
                op);
        return PP_OK;
    }
    pp_fn_body *other = alloc(ctx, sizeof *other);
    if (!other) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    int first = 1;
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        if (!is_pippin(n) || strcmp(n->op_type, op) != 0) continue;
        pp_fn_body *b = first ? body : other;
        memset(b, 0, sizeof *b);
        pp_status s = build(g, n, b);
        if (s == PP_ERR_UNSUPPORTED) {
            pp_warn("node '%s' (pippin::%s): %s; the file has no ONNX function for it", n->name, op,
                    pp_last_error());
            return PP_OK;
        }
        PP_TRY(s);
        b->n_in = pp_onnx_node_inputs(n);
        b->n_out = n->n_out;
        if (b->overflow) return pp_error(PP_ERR_INTERNAL, "pippin::%s: function body too long", op);
        if (!first && (strcmp(b->text, body->text) || strcmp(b->inputs, body->inputs) ||
                       strcmp(b->outputs, body->outputs) || b->n_in != body->n_in ||
                       b->n_out != body->n_out)) {
            pp_warn("nodes of pippin::%s need different ONNX function bodies (node '%s' differs from the "
                    "first; ONNX keeps one per op): the file has no function for it",
                    op, n->name);
            return PP_OK;
        }
        first = 0;
    }
    *ok = 1;
    return PP_OK;
}

static pp_status make_function(const pp_graph *g, const char *op, const pp_fn_body *body, int64_t opset,
                               pp_onnx_alloc_fn alloc, void *ctx, Onnx__FunctionProto **out) {
    Onnx__FunctionProto *f = alloc(ctx, sizeof *f);
    Onnx__OperatorSetIdProto *os = alloc(ctx, sizeof *os);
    Onnx__OperatorSetIdProto **osl = alloc(ctx, sizeof *osl);
    char **attrs = alloc(ctx, sizeof *attrs * MAX_ATTRS);
    size_t lines = 0;
    for (const char *p = body->text; *p; p++) lines += *p == '\n';
    Onnx__NodeProto **nodes = alloc(ctx, sizeof *nodes * (lines + 1));
    if (!f || !os || !osl || !attrs || !nodes) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    onnx__function_proto__init(f);
    onnx__operator_set_id_proto__init(os);
    f->name = (char *)op;
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
        if (!is_pippin(n) || strcmp(n->op_type, op) != 0) continue;
        for (int a = 0; a < n->n_attr; a++) {
            size_t k = 0;
            while (k < f->n_attribute && strcmp(attrs[k], n->attrs[a].name) != 0) k++;
            if (k == f->n_attribute && k < MAX_ATTRS) attrs[f->n_attribute++] = n->attrs[a].name;
        }
    }
    f->attribute = attrs;
    char line[512];
    for (const char *p = body->text; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = (size_t)(e - p);
        if (len >= sizeof line) return pp_error(PP_ERR_INTERNAL, "pippin::%s: body line too long", op);
        memcpy(line, p, len);
        line[len] = '\0';
        PP_TRY(pp_onnx_node_from_text(line, op, alloc, ctx, &nodes[f->n_node]));
        f->n_node++;
        p = e + 1;
    }
    f->node = nodes;
    *out = f;
    return PP_OK;
}

pp_status pp_onnx_functions(const pp_graph *g, int64_t opset, pp_onnx_alloc_fn alloc, void *ctx,
                            Onnx__FunctionProto ***out, size_t *n_out) {
    const char *ops[MAX_OPS];
    int n_ops = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        if (!is_pippin(n)) continue;
        int k = 0;
        while (k < n_ops && strcmp(ops[k], n->op_type) != 0) k++;
        if (k == n_ops && n_ops < MAX_OPS) ops[n_ops++] = n->op_type;
    }
    *out = alloc(ctx, sizeof **out * (size_t)(n_ops + 1));
    *n_out = 0;
    if (!*out) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    pp_fn_body *body = alloc(ctx, sizeof *body);
    if (!body) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    for (int k = 0; k < n_ops; k++) {
        int ok;
        PP_TRY(build_body(g, ops[k], alloc, ctx, body, &ok));
        if (ok) PP_TRY(make_function(g, ops[k], body, opset, alloc, ctx, &(*out)[(*n_out)++]));
    }
    return PP_OK;
}

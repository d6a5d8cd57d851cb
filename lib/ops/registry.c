/* The op table: families of ops concatenated, looked up by (domain, name). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "op.h"

#include "status_internal.h"
static const pp_op *const families[] = {
    pp_ops_elementwise, pp_ops_reduce, pp_ops_reshape, pp_ops_slice, pp_ops_pad, pp_ops_cast,
    pp_ops_constant, pp_ops_matmul, pp_ops_matmul_fused, pp_ops_attention, pp_ops_attention_grad, pp_ops_pippin, pp_ops_grad,
    pp_ops_pool, pp_ops_grad_act,
    pp_ops_conv,
    pp_ops_conv_transpose,
    pp_ops_resize,
    pp_ops_group_norm,
    pp_ops_rnn, pp_ops_grad_rnn,
    pp_ops_dropout,
    pp_ops_misc,
};

static int same_domain(const char *a, const char *b) {
    if (!a || strcmp(a, "ai.onnx") == 0) a = "";
    if (!b || strcmp(b, "ai.onnx") == 0) b = "";
    return strcmp(a, b) == 0;
}

const pp_op *pp_op_at(int i) {
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        for (const pp_op *op = families[f]; op->name; op++)
            if (i-- == 0) return op;
    }
    return NULL;
}

const pp_op *pp_op_find(const char *domain, const char *name) {
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (const pp_op *op = families[f]; op->name; op++)
            if (strcmp(op->name, name) == 0 && same_domain(op->domain, domain)) return op;
    return NULL;
}

const char *pp_node_label(const pp_node *n, char *buf, size_t cap) {
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0)
        snprintf(buf, cap, "node '%s' (%s::%s)", n->name ? n->name : "", n->domain, n->op_type);
    else
        snprintf(buf, cap, "node '%s' (%s)", n->name ? n->name : "", n->op_type);
    return buf;
}

static pp_status node_verror(const pp_node *n, pp_status code, const char *fmt, va_list ap) {
    char label[512], msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return pp_error(code, "%s: %s", pp_node_label(n, label, sizeof label), msg);
}

pp_status pp_node_error(const pp_node *n, pp_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pp_status s = node_verror(n, code, fmt, ap);
    va_end(ap);
    return s;
}

pp_status pp_kernel_error(const pp_kernel_ctx *ctx, pp_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pp_status s = node_verror(ctx->node, code, fmt, ap);
    va_end(ap);
    return s;
}

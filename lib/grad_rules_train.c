/* Gradient rules of the ops that act differently when training:
 * BatchNormalization (through the batch statistics when training_mode=1)
 * and Dropout (the mask of the forward, when training). Also the step
 * before the pass that gives a training-mode Dropout its mask output, which
 * PyTorch's export often leaves out and the backward needs. */
#include <math.h>
#include <string.h>

#include "autodiff_internal.h"

#include "status_internal.h"

/* The scalar constant in value v (an initializer, or a Constant node's
 * 'value', as PyTorch exports Dropout's ratio and training_mode), as a double. */
static int const_scalar(const pp_graph *g, int v, double *out) {
    if (v < 0 || v >= g->n_values) return 0;
    const pp_value *val = &g->values[v];
    const pp_tensor *t = val->kind == PP_VALUE_CONST ? val->data : NULL;
    if (val->kind == PP_VALUE_NODE && val->producer >= 0) {
        const pp_node *p = &g->nodes[val->producer];
        const pp_attr *a = strcmp(p->op_type, "Constant") == 0 && !p->domain[0] ? pp_node_attr(p, "value") : NULL;
        if (a && a->type == PP_ATTR_TENSOR) t = a->t;
        const pp_attr *f = strcmp(p->op_type, "Constant") == 0 && !p->domain[0] ? pp_node_attr(p, "value_float") : NULL;
        const pp_attr *i = strcmp(p->op_type, "Constant") == 0 && !p->domain[0] ? pp_node_attr(p, "value_int") : NULL;
        if (f && f->type == PP_ATTR_FLOAT) {
            *out = f->f;
            return 1;
        }
        if (i && i->type == PP_ATTR_INT) {
            *out = (double)i->i;
            return 1;
        }
    }
    if (!t || pp_tensor_numel(t) != 1) return 0;
    *out = pp_tensor_get_f64(t, 0);
    return 1;
}

/* A Dropout node's ratio when it trains (> 0), 0 when it passes values
 * through; an error when that is only known at run time. */
static pp_status dropout_ratio(const pp_graph *g, const pp_node *n, double *ratio) {
    *ratio = 0;
    int tm = n->n_in > 2 ? n->in[2] : -1, tr = n->n_in > 1 ? n->in[1] : -1;
    double training = 0, r = pp_node_attr_float(n, "ratio", 0.5f);
    if (tm < 0) return PP_OK;
    if (!const_scalar(g, tm, &training))
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "training_mode must be a constant scalar to differentiate "
                             "(it is computed at run time)");
    if (training == 0) return PP_OK;
    if (tr >= 0 && !const_scalar(g, tr, &r))
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "ratio must be a constant scalar to differentiate");
    if (!(r >= 0 && r <= 1)) return pp_node_error(n, PP_ERR_INVALID, "ratio %g is outside [0, 1]", r);
    *ratio = r;
    return PP_OK;
}

pp_status pp_ad_prepare_training_ops(pp_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        if (strcmp(n->op_type, "Dropout") != 0 || (n->domain[0] && strcmp(n->domain, "ai.onnx") != 0)) continue;
        double r;
        PP_TRY(dropout_ratio(g, n, &r));
        if (r > 0) PP_TRY(pp_node_add_output(g, i, 1, NULL));
    }
    return PP_OK;
}

/* Training: dx = pippin::DropoutGrad(dy, mask) (dy * mask / (1 - ratio));
 * otherwise dx = dy. */
PP_GRAD_RULE(dropout) {
    double r;
    PP_TRY(dropout_ratio(c->g, &c->g->nodes[c->node], &r));
    if (r <= 0) return pp_grad_rule_identity(c);
    int mask = pp_ad_out(c, 1), id;
    if (mask < 0) /* pp_ad_prepare_training_ops gave it one */
        return pp_node_error(&c->g->nodes[c->node], PP_ERR_INTERNAL, "training-mode dropout without a mask output");
    int in[2] = {c->dy[0], mask};
    PP_TRY(pp_grad_emit(c, "DropoutGrad", "pippin", 2, in, 1, NULL, &c->dx[0], &id));
    return pp_node_set_float(c->g, id, "scale", r < 1 ? (float)(1.0 / (1.0 - r)) : 0.0f);
}

/* dx from pippin::BatchNormGradInput (region I); dscale and dB from
 * pippin::BatchNormGradWeight (region W). The running mean and variance
 * (inputs 3, 4) are state, not trained; in training mode the kernels do not
 * read them. */
PP_GRAD_RULE(batch_norm) {
    const pp_node *n = &c->g->nodes[c->node];
    if ((n->n_out > 1 && c->dy[1] >= 0) || (n->n_out > 2 && c->dy[2] >= 0))
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "no gradient through the running mean/variance outputs");
    int64_t training = pp_node_attr_int(n, "training_mode", 0) != 0;
    float eps = pp_node_attr_float(n, "epsilon", 1e-5f);
    int x = pp_ad_in(c, 0), scale = pp_ad_in(c, 1);
    int mean = training ? -1 : pp_ad_in(c, 3), var = training ? -1 : pp_ad_in(c, 4), id;
    if (c->need[0]) {
        int in[5] = {c->dy[0], x, scale, mean, var};
        PP_TRY(pp_grad_emit(c, "BatchNormGradInput", "pippin", training ? 3 : 5, in, 1, NULL, &c->dx[0], &id));
        PP_TRY(pp_node_set_int(c->g, id, "training_mode", training));
        PP_TRY(pp_node_set_float(c->g, id, "epsilon", eps));
    }
    uint8_t want[2] = {c->need[1], c->need[2]};
    if (want[0] || want[1]) {
        int in[4] = {c->dy[0], x, mean, var}, outs[2];
        PP_TRY(pp_grad_emit(c, "BatchNormGradWeight", "pippin", training ? 2 : 4, in, 2, want, outs, &id));
        PP_TRY(pp_node_set_int(c->g, id, "training_mode", training));
        PP_TRY(pp_node_set_float(c->g, id, "epsilon", eps));
        if (want[0]) c->dx[1] = outs[0];
        if (want[1]) c->dx[2] = outs[1];
    }
    return PP_OK;
}

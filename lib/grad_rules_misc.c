/* Gradient rules of Sin, Cos, Trilu, CumSum, Tile, GatherElements, TopK and the
 * reductions beyond ReduceSum/ReduceMean (ReduceMax, ReduceMin, ReduceProd,
 * ReduceL2, ReduceLogSumExp, by closed forms over the broadcast result). */
#include <string.h>

#include "autodiff_internal.h"

#include "status_internal.h"

/* dx = dy * cos(x) */
PP_GRAD_RULE(sin) {
    int cx;
    PP_TRY(pp_grad_op1(c, "Cos", "", pp_ad_in(c, 0), -2, &cx));
    return pp_grad_op1(c, "Mul", "", c->dy[0], cx, &c->dx[0]);
}

/* dx = -dy * sin(x) */
PP_GRAD_RULE(cos) {
    int sx, t;
    PP_TRY(pp_grad_op1(c, "Sin", "", pp_ad_in(c, 0), -2, &sx));
    PP_TRY(pp_grad_op1(c, "Mul", "", c->dy[0], sx, &t));
    return pp_grad_op1(c, "Neg", "", t, -2, &c->dx[0]);
}

/* dx = Trilu(dy, k) with the same triangle kept. */
PP_GRAD_RULE(trilu) {
    const pp_node *n = &c->g->nodes[c->node];
    int64_t upper = pp_node_attr_int(n, "upper", 1);
    int in[2] = {c->dy[0], pp_ad_in(c, 1)}, id;
    PP_TRY(pp_grad_emit(c, "Trilu", "", in[1] >= 0 ? 2 : 1, in, 1, NULL, &c->dx[0], &id));
    return pp_node_set_int(c->g, id, "upper", upper);
}

/* The transpose of a (reverse) cumulative sum is the cumulative sum the
 * other way, exclusive as the forward. */
PP_GRAD_RULE(cumsum) {
    const pp_node *n = &c->g->nodes[c->node];
    int64_t exclusive = pp_node_attr_int(n, "exclusive", 0);
    int64_t reverse = pp_node_attr_int(n, "reverse", 0);
    int in[2] = {c->dy[0], pp_ad_in(c, 1)}, id;
    PP_TRY(pp_grad_emit(c, "CumSum", "", 2, in, 1, NULL, &c->dx[0], &id));
    PP_TRY(pp_node_set_int(c->g, id, "exclusive", exclusive));
    return pp_node_set_int(c->g, id, "reverse", !reverse);
}

/* dx = sum of dy over the tiles: pippin::TileGrad(dy, shape_x). */
PP_GRAD_RULE(tile) {
    int in[2] = {c->dy[0]};
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &in[1]));
    return pp_grad_emit(c, "TileGrad", "pippin", 2, in, 1, NULL, &c->dx[0], NULL);
}

/* dx = scatter-add of dy at the indices: pippin::GatherElementsGrad. */
PP_GRAD_RULE(gather_elements) {
    int64_t axis = pp_node_attr_int(&c->g->nodes[c->node], "axis", 0);
    int in[3] = {c->dy[0], pp_ad_in(c, 1)}, id;
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &in[2]));
    PP_TRY(pp_grad_emit(c, "GatherElementsGrad", "pippin", 3, in, 1, NULL, &c->dx[0], &id));
    return pp_node_set_int(c->g, id, "axis", axis);
}

/* With dyb, yb: dy and y broadcast back to x's shape,
 *   Max/Min:    dx = dyb * (x == yb)   (every tied extreme gets dy)
 *   Prod:       dx = dyb * yb / x      (x without zeros)
 *   L2:         dx = dyb * x / yb
 *   LogSumExp:  dx = dyb * exp(x - yb) */
PP_GRAD_RULE(reduce_ext) {
    const char *op = c->g->nodes[c->node].op_type;
    int x = pp_ad_in(c, 0), y = pp_ad_out(c, 0), shape, dyb, yb, f, id;
    PP_TRY(pp_grad_shape_of(c, x, &shape));
    PP_TRY(pp_grad_expand_reduced(c, c->dy[0], shape, 0, &dyb));
    PP_TRY(pp_grad_expand_reduced(c, y, shape, 0, &yb));
    if (strcmp(op, "ReduceMax") == 0 || strcmp(op, "ReduceMin") == 0) {
        int eq;
        PP_TRY(pp_grad_op1(c, "Equal", "", x, yb, &eq));
        PP_TRY(pp_grad_emit(c, "Cast", "", 1, &eq, 1, NULL, &f, &id));
        PP_TRY(pp_node_set_int(c->g, id, "to", PP_F32));
    } else if (strcmp(op, "ReduceProd") == 0) {
        PP_TRY(pp_grad_op1(c, "Div", "", yb, x, &f));
    } else if (strcmp(op, "ReduceL2") == 0) {
        PP_TRY(pp_grad_op1(c, "Div", "", x, yb, &f));
    } else {
        int d;
        PP_TRY(pp_grad_op1(c, "Sub", "", x, yb, &d));
        PP_TRY(pp_grad_op1(c, "Exp", "", d, -2, &f));
    }
    return pp_grad_op1(c, "Mul", "", dyb, f, &c->dx[0]);
}

/* TopK: dy of the values scattered back to the indices taken
 * (pippin::GatherElementsGrad along the axis); the indices pass none. */
PP_GRAD_RULE(topk) {
    const pp_node *n = &c->g->nodes[c->node];
    if (c->dy[0] < 0) return PP_OK;
    int idx = pp_ad_out(c, 1), id;
    if (idx < 0)
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "no gradient for TopK without its indices "
                                                    "output");
    int64_t axis = pp_node_attr_int(n, "axis", -1);
    int in[3] = {c->dy[0], idx};
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &in[2]));
    PP_TRY(pp_grad_emit(c, "GatherElementsGrad", "pippin", 3, in, 1, NULL, &c->dx[0], &id));
    return pp_node_set_int(c->g, id, "axis", axis);
}

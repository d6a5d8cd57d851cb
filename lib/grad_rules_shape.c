/* Gradient rules of data-movement ops: identities, reshapes, Transpose,
 * Expand, Concat/Split, Slice, Gather, Pad and Cast. Shapes they need come from
 * pp_grad_shape_of (taken during the forward). */
#include "autodiff_internal.h"

#include "status_internal.h"
/* Identity, PipeSplit (n -> n), Dropout (inference identity). */
PP_GRAD_RULE(identity) {
    const pp_node *n = &c->g->nodes[c->node];
    for (int k = 0; k < n->n_in && k < n->n_out; k++)
        if (c->need[k]) c->dx[k] = c->dy[k];
    return PP_OK;
}

/* Reshape, Flatten, Squeeze, Unsqueeze: reshape back to x's shape. */
PP_GRAD_RULE(reshape) {
    int shape, id;
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &shape));
    int in[2] = {c->dy[0], shape};
    PP_TRY(pp_grad_emit(c, "Reshape", "", 2, in, 1, NULL, &c->dx[0], &id));
    return pp_node_set_int(c->g, id, "allowzero", 1);
}

PP_GRAD_RULE(expand) { return pp_grad_sum_to(c, c->dy[0], pp_ad_in(c, 0), &c->dx[0]); }

PP_GRAD_RULE(transpose) {
    const pp_node *n = &c->g->nodes[c->node];
    const int64_t *perm;
    int np = pp_node_attr_ints(n, "perm", &perm), id;
    int64_t inv[PP_MAX_DIMS];
    if (np > PP_MAX_DIMS) return pp_node_error(n, PP_ERR_UNSUPPORTED, "perm too long");
    for (int i = 0; i < np; i++) {
        if (perm[i] < 0 || perm[i] >= np) return pp_node_error(n, PP_ERR_INVALID, "bad perm");
        inv[perm[i]] = i;
    }
    PP_TRY(pp_grad_emit(c, "Transpose", "", 1, &c->dy[0], 1, NULL, &c->dx[0], &id));
    /* Without perm the forward reversed the dims, its own inverse. */
    return np >= 0 ? pp_node_set_ints(c->g, id, "perm", np, inv) : PP_OK;
}

PP_GRAD_RULE(concat) {
    const pp_node *n = &c->g->nodes[c->node];
    int64_t axis = pp_node_attr_int(n, "axis", 0);
    int k = n->n_in, in[64], id;
    if (k > 63) return pp_node_error(n, PP_ERR_UNSUPPORTED, "more than 63 inputs");
    in[0] = c->dy[0];
    for (int i = 0; i < k; i++) PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, i), &in[i + 1]));
    PP_TRY(pp_grad_emit(c, "SplitLike", "pippin", k + 1, in, k, c->need, c->dx, &id));
    return pp_node_set_int(c->g, id, "axis", axis);
}

PP_GRAD_RULE(split) {
    const pp_node *n = &c->g->nodes[c->node];
    int64_t axis = pp_node_attr_int(n, "axis", 0);
    int k = n->n_out, in[64], id;
    if (k > 64) return pp_node_error(n, PP_ERR_UNSUPPORTED, "more than 64 outputs");
    for (int i = 0; i < k; i++) {
        in[i] = c->dy[i];
        if (in[i] >= 0) continue;
        /* An output no gradient reached contributes zeros. */
        int shape;
        PP_TRY(pp_grad_shape_of(c, pp_ad_out(c, i), &shape));
        PP_TRY(pp_grad_emit(c, "ConstantOfShape", "", 1, &shape, 1, NULL, &in[i], &id));
        pp_tensor *zero;
        int64_t one = 1;
        PP_TRY(pp_tensor_new(PP_F32, 1, &one, &zero));
        PP_TRY(pp_node_set_tensor(c->g, id, "value", zero));
    }
    if (k == 1) {
        c->dx[0] = in[0];
        return PP_OK;
    }
    PP_TRY(pp_grad_emit(c, "Concat", "", k, in, 1, NULL, &c->dx[0], &id));
    return pp_node_set_int(c->g, id, "axis", axis);
}

PP_GRAD_RULE(slice) {
    const pp_node *n = &c->g->nodes[c->node];
    if (n->n_in < 3)
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "no gradient for Slice with attributes "
                                                    "(opset < 10)");
    int in[6], n_in = n->n_in + 1; /* dy, shape_x, then starts.. as given */
    for (int i = 1; i < n_in - 1; i++) in[i + 1] = pp_ad_in(c, i);
    in[0] = c->dy[0];
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &in[1]));
    return pp_grad_emit(c, "SliceGrad", "pippin", n_in, in, 1, NULL, &c->dx[0], NULL);
}

PP_GRAD_RULE(gather) {
    int64_t axis = pp_node_attr_int(&c->g->nodes[c->node], "axis", 0);
    int in[3] = {c->dy[0], pp_ad_in(c, 1)}, id;
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &in[2]));
    PP_TRY(pp_grad_emit(c, "GatherGrad", "pippin", 3, in, 1, NULL, &c->dx[0], &id));
    return pp_node_set_int(c->g, id, "axis", axis);
}

/* Pad (any mode): dx = pippin::PadGrad(dy, shape_x, pads, axes), dy summed
 * back where each padded element was read; the fill value gets none. */
PP_GRAD_RULE(pad) {
    const pp_node *n = &c->g->nodes[c->node];
    int in[4] = {c->dy[0], -1, pp_ad_in(c, 1), pp_ad_in(c, 3)}, id;
    int n_in = in[3] >= 0 ? 4 : in[2] >= 0 ? 3 : 2;
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &in[1]));
    PP_TRY(pp_grad_emit(c, "PadGrad", "pippin", n_in, in, 1, NULL, &c->dx[0], &id));
    n = &c->g->nodes[c->node];
    const char *keep[2] = {"mode", "pads"};
    for (int k = 0; k < 2; k++) {
        const pp_attr *a = pp_node_attr(n, keep[k]);
        if (!a) continue;
        pp_attr copy;
        PP_TRY(pp_attr_clone(a, &copy));
        PP_TRY(pp_node_add_attr(c->g, id, &copy));
        n = &c->g->nodes[c->node];
    }
    return PP_OK;
}

/* Float-to-float casts pass the gradient back in the input's type. */
PP_GRAD_RULE(cast) {
    pp_dtype dt = c->g->values[pp_ad_in(c, 0)].dtype;
    if (dt == PP_DTYPE_UNDEFINED || dt == PP_F32) {
        c->dx[0] = c->dy[0];
        return PP_OK;
    }
    int id;
    PP_TRY(pp_grad_emit(c, "Cast", "", 1, &c->dy[0], 1, NULL, &c->dx[0], &id));
    return pp_node_set_int(c->g, id, "to", dt);
}

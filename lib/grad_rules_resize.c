/* Gradient rule of Resize and Upsample: dx = pippin::ResizeGrad(dy,
 * shape_x, the forward's scale inputs), the adjoint of the separable
 * interpolation (scatter-add for nearest, the same weights for linear). It
 * carries the forward's attributes and 'form', how the forward passed its
 * scales (0: Resize 11+, 1: a scales input, 2: Upsample's attribute). */
#include <string.h>

#include "autodiff_internal.h"

#include "status_internal.h"

PP_GRAD_RULE(resize) {
    if (c->dy[0] < 0 || !c->need[0]) return PP_OK;
    const pp_node *n = &c->g->nodes[c->node];
    int64_t form;
    if (strcmp(n->op_type, "Upsample") == 0) form = pp_node_attr(n, "scales") ? 2 : 1;
    else form = c->g->opset <= 10 ? 1 : 0;
    int in[5] = {c->dy[0], -1, -1, -1, -1}, n_in = 2, id;
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &in[1]));
    n = &c->g->nodes[c->node]; /* adding the Shape node may have moved the node array */
    for (int k = 1; k < n->n_in && k < 4; k++) {
        in[k + 1] = pp_ad_in(c, k);
        if (in[k + 1] >= 0) n_in = k + 2;
    }
    /* An absent roi or scales before a given input becomes an empty float
     * tensor, which the kernel reads as absent: a written training graph
     * then passes every input its ONNX function declares (onnx.checker
     * types each one). */
    for (int k = 2; k < n_in - 1; k++) {
        if (in[k] >= 0) continue;
        pp_tensor *t;
        int64_t zero = 0;
        PP_TRY(pp_tensor_new(PP_F32, 1, &zero, &t));
        PP_TRY(pp_graph_add_initializer(c->g, pp_graph_unique_name(c->g, "autodiff/none"), PP_VALUE_CONST, t,
                                        &in[k]));
    }
    PP_TRY(pp_grad_emit(c, "ResizeGrad", "pippin", n_in, in, 1, NULL, &c->dx[0], &id));
    int na = c->g->nodes[c->node].n_attr;
    for (int a = 0; a < na; a++) {
        pp_attr copy;
        PP_TRY(pp_attr_clone(&c->g->nodes[c->node].attrs[a], &copy));
        PP_TRY(pp_node_add_attr(c->g, id, &copy));
    }
    return pp_node_set_int(c->g, id, "form", form);
}

/* Gradient rules of GroupNormalization and InstanceNormalization: dx
 * through pippin::GroupNormGradInput (region I), dscale and dbias through
 * one pippin::GroupNormGradWeight (region W). InstanceNormalization is group
 * normalisation with one group per channel: its helpers carry no
 * num_groups. */
#include <string.h>

#include "autodiff_internal.h"

#include "status_internal.h"

/* Copies the forward's epsilon and num_groups (if any) onto node id. */
static pp_status copy_norm_attrs(pp_grad_ctx *c, int id) {
    const char *names[2] = {"epsilon", "num_groups"};
    for (int k = 0; k < 2; k++) {
        const pp_attr *a = pp_node_attr(&c->g->nodes[c->node], names[k]);
        if (!a) continue;
        pp_attr copy;
        PP_TRY(pp_attr_clone(a, &copy));
        PP_TRY(pp_node_add_attr(c->g, id, &copy));
    }
    return PP_OK;
}

PP_GRAD_RULE(group_norm) {
    int x = pp_ad_in(c, 0), scale = pp_ad_in(c, 1), id;
    if (c->dy[0] < 0) return PP_OK;
    if (c->need[0]) {
        int in[3] = {c->dy[0], x, scale};
        PP_TRY(pp_grad_emit(c, "GroupNormGradInput", "pippin", 3, in, 1, NULL, &c->dx[0], &id));
        PP_TRY(copy_norm_attrs(c, id));
    }
    uint8_t want[2] = {c->need[1], c->need[2]};
    if (want[0] || want[1]) {
        int shape, outs[2];
        PP_TRY(pp_grad_shape_of(c, scale, &shape));
        int in[3] = {c->dy[0], x, shape};
        PP_TRY(pp_grad_emit(c, "GroupNormGradWeight", "pippin", 3, in, 2, want, outs, &id));
        PP_TRY(copy_norm_attrs(c, id));
        if (want[0]) c->dx[1] = outs[0];
        if (want[1]) c->dx[2] = outs[1];
    }
    return PP_OK;
}

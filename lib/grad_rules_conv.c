/* Gradient rules of Conv and ConvTranspose: dx through
 * pippin::ConvGradInput / ConvTransposeGradInput (region I), dW and dB
 * through one pippin::ConvGradWeight / ConvTransposeGradWeight (region W), so
 * the input gradient holds no weight-gradient work. The helpers carry the
 * forward's attributes and take a shape input (the geometry, auto_pad and
 * output_shape included, follows from the shapes of X and W). */
#include "autodiff_internal.h"

#include "status_internal.h"

/* Copies every attribute of the forward node onto node id. */
static pp_status copy_attrs(pp_grad_ctx *c, int id) {
    int na = c->g->nodes[c->node].n_attr;
    for (int a = 0; a < na; a++) {
        pp_attr copy;
        PP_TRY(pp_attr_clone(&c->g->nodes[c->node].attrs[a], &copy));
        PP_TRY(pp_node_add_attr(c->g, id, &copy));
    }
    return PP_OK;
}

static pp_status conv_like(pp_grad_ctx *c, const char *gin, const char *gw) {
    int x = pp_ad_in(c, 0), w = pp_ad_in(c, 1), b = pp_ad_in(c, 2), id;
    if (c->dy[0] < 0) return PP_OK;
    if (c->need[0]) {
        int shape;
        PP_TRY(pp_grad_shape_of(c, x, &shape));
        int in[3] = {c->dy[0], w, shape};
        PP_TRY(pp_grad_emit(c, gin, "pippin", 3, in, 1, NULL, &c->dx[0], &id));
        PP_TRY(copy_attrs(c, id));
    }
    uint8_t want[2] = {c->need[1], (uint8_t)(b >= 0 && c->need[2])};
    if (want[0] || want[1]) {
        int shape, outs[2];
        PP_TRY(pp_grad_shape_of(c, w, &shape));
        int in[3] = {c->dy[0], x, shape};
        PP_TRY(pp_grad_emit(c, gw, "pippin", 3, in, 2, want, outs, &id));
        PP_TRY(copy_attrs(c, id));
        if (want[0]) c->dx[1] = outs[0];
        if (want[1]) c->dx[2] = outs[1];
    }
    return PP_OK;
}

PP_GRAD_RULE(conv) { return conv_like(c, "ConvGradInput", "ConvGradWeight"); }

PP_GRAD_RULE(conv_transpose) {
    return conv_like(c, "ConvTransposeGradInput", "ConvTransposeGradWeight");
}

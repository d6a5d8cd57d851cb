/* Optimizer pass "fold": nodes whose outputs depend on constants alone are
 * run once here and their outputs become constants. Folded: Constant
 * nodes; default-domain nodes whose inputs are all non-trainable
 * initializers (or values folded before them); Shape and Size of a value
 * whose shape is fixed (an initializer, trainable or not, or a graph input
 * whose dims are all static). Never folded: trainable parameters' values
 * (weights may be loaded after the graph is prepared), random ops,
 * Dropout, other domains, and outputs over FOLD_MAX_BYTES (a constant
 * kept in memory for the graph's life).
 *
 * Before a training graph's backward (pp_graph_optimize_for_training) it
 * folds less: Constant nodes, nodes reading only what this pass folded, and
 * Shape/Size of static graph inputs. Nothing that reads an initializer:
 * buffers change in training (BatchNormalization's running statistics) and
 * any initializer may be replaced by a parameter file or a checkpoint after
 * the graph is built. What attention fusion needs (the scale, the mask's
 * Constant-made pieces) is folded all the same. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "op.h"
#include "pippin/exec.h"
#include "opt_internal.h"

#include "status_internal.h"

#define FOLD_MAX_BYTES ((size_t)64 << 20)

static int is_random(const pp_node *n) {
    return strncmp(n->op_type, "Random", 6) == 0 || strcmp(n->op_type, "Bernoulli") == 0 ||
           strcmp(n->op_type, "Dropout") == 0 || strcmp(n->op_type, "Multinomial") == 0;
}

/* A non-trainable value with data; in training only one this pass made
 * (made[v]). */
static const pp_tensor *constant_of(const pp_graph *g, int v, const uint8_t *made) {
    if (v < 0 || g->values[v].kind != PP_VALUE_CONST) return NULL;
    return !made || made[v] ? g->values[v].data : NULL;
}

/* A tensor standing for v's shape alone (Shape and Size read nothing
 * else): from an initializer, or a graph input with every dim static. */
static int shape_only(const pp_graph *g, int v, int training, pp_tensor *view) {
    if (v < 0) return 0;
    const pp_value *val = &g->values[v];
    if (!training && (val->kind == PP_VALUE_CONST || val->kind == PP_VALUE_PARAM) && val->data) {
        *view = *val->data;
        view->data = NULL;
        view->nbytes = 0;
        return 1;
    }
    if (val->kind != PP_VALUE_INPUT || val->ndim < 0) return 0;
    for (int d = 0; d < val->ndim; d++)
        if (val->shape[d] < 0) return 0;
    memset(view, 0, sizeof *view);
    view->dtype = val->dtype;
    view->ndim = val->ndim;
    memcpy(view->shape, val->shape, sizeof(int64_t) * (size_t)val->ndim);
    view->refcount = 1;
    return 1;
}

/* Runs node i on the tensors ins; folds its outputs into constants. 1 if
 * folded, 0 if left alone (an output too large). */
static pp_status fold_node(pp_opt_ctx *c, int i, pp_tensor *const *ins, uint8_t *made, int *folded) {
    pp_graph *g = c->g;
    const pp_node *n = &g->nodes[i];
    pp_tensor *outs[64] = {0};
    *folded = 0;
    PP_TRY(pp_exec_node(g, i, ins, outs));
    size_t bytes = 0;
    for (int k = 0; k < n->n_out; k++) bytes += outs[k] ? outs[k]->nbytes : 0;
    if (bytes > FOLD_MAX_BYTES) {
        for (int k = 0; k < n->n_out; k++) pp_tensor_free(outs[k]);
        return PP_OK;
    }
    for (int k = 0; k < n->n_out; k++) {
        int v = n->out[k];
        if (v < 0) {
            pp_tensor_free(outs[k]);
            continue;
        }
        pp_value *val = &g->values[v];
        if (made) made[v] = 1;
        val->kind = PP_VALUE_CONST;
        val->producer = -1;
        val->producer_output = 0;
        pp_tensor_free(val->data);
        val->data = outs[k];
        val->dtype = outs[k]->dtype;
        val->ndim = outs[k]->ndim;
        memcpy(val->shape, outs[k]->shape, sizeof(int64_t) * (size_t)outs[k]->ndim);
    }
    pp_opt_kill(c, i);
    *folded = 1;
    return PP_OK;
}

pp_status pp_opt_fold(pp_opt_ctx *c, int *count) {
    pp_graph *g = c->g;
    *count = 0;
    uint8_t *made = NULL;
    if (c->training && !(made = calloc((size_t)g->n_values + 1, 1))) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status s = PP_OK;
    for (int i = 0; i < g->n_nodes && s == PP_OK; i++) {
        if (c->dead[i]) continue;
        const pp_node *n = &g->nodes[i];
        if (n->n_in > 64 || n->n_out > 64 || n->n_out < 1) continue;
        if (n->domain[0] && strcmp(n->domain, "ai.onnx") != 0) continue;
        if (is_random(n)) continue;
        pp_tensor *ins[64] = {0};
        pp_tensor view;
        int ok;
        if (pp_opt_is_op(n, "Shape") || pp_opt_is_op(n, "Size")) {
            ok = n->n_in == 1 && shape_only(g, n->in[0], c->training, &view);
            ins[0] = &view;
        } else if (n->n_in == 0) {
            ok = pp_opt_is_op(n, "Constant");
        } else {
            ok = 1;
            for (int k = 0; k < n->n_in && ok; k++) {
                if (n->in[k] < 0) continue;
                ins[k] = (pp_tensor *)constant_of(g, n->in[k], made);
                ok = ins[k] != NULL;
            }
        }
        if (!ok) continue;
        int folded = 0;
        s = fold_node(c, i, ins, made, &folded); /* an error: the kernel's, naming the node */
        *count += folded;
    }
    free(made);
    return s;
}

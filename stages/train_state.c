/* State a training forward updates (BatchNormalization's running
 * statistics), and the inference rewrites of training-mode ops. See
 * train_state.h. */
#include "train_state.h"

#include <stdlib.h>
#include <string.h>

#include "pippin/log.h"
#include "pippin/optimize.h"
#include "pippin/stage.h"

#include "log_internal.h"
#include "status_internal.h"

static int is_op(const pp_node *n, const char *op) {
    return strcmp(n->op_type, op) == 0 && (!n->domain[0] || strcmp(n->domain, "ai.onnx") == 0);
}

/* An initializer usable as state: with data. */
static int state_value(const pp_graph *g, int v) {
    if (v < 0 || v >= g->n_values) return 0;
    const pp_value *val = &g->values[v];
    return (val->kind == PP_VALUE_CONST || val->kind == PP_VALUE_PARAM) && val->data;
}

static pp_status add_pair(pp_train_state *ts, int src, int dst) {
    int *s = realloc(ts->src, sizeof(int) * (size_t)(ts->n + 1));
    if (!s) return pp_error(PP_ERR_NOMEM, "out of memory");
    ts->src = s;
    int *d = realloc(ts->dst, sizeof(int) * (size_t)(ts->n + 1));
    if (!d) return pp_error(PP_ERR_NOMEM, "out of memory");
    ts->dst = d;
    ts->src[ts->n] = src;
    ts->dst[ts->n++] = dst;
    return PP_OK;
}

static pp_status prepare_batch_norm(pp_graph *g, int i, int training, pp_train_state *ts) {
    if (pp_node_attr_int(&g->nodes[i], "training_mode", 0) == 0) return PP_OK;
    if (!training) { /* inference: the running statistics, and no outputs 1, 2 */
        pp_node *n = &g->nodes[i];
        for (int k = 1; k < n->n_out; k++)
            if (n->out[k] >= 0) {
                g->values[n->out[k]].producer = -1;
                n->out[k] = -1;
            }
        return pp_node_set_int(g, i, "training_mode", 0);
    }
    PP_TRY(pp_node_set_int(g, i, "unbiased_running_var", 1));
    for (int k = 1; k <= 2; k++) {
        const pp_node *n = &g->nodes[i];
        int dst = n->n_in > k + 2 ? n->in[k + 2] : -1;
        if (!state_value(g, dst)) {
            pp_debug("stage: node '%s': running statistics that are not initializers are not updated", n->name);
            continue;
        }
        if (g->values[dst].data->dtype != PP_F32)
            return pp_error(PP_ERR_UNSUPPORTED, "node '%s' (BatchNormalization): running statistics '%s' are %s; "
                            "training updates float32 state only", n->name, g->values[dst].name,
                            pp_dtype_name(g->values[dst].data->dtype));
        if (g->values[dst].kind == PP_VALUE_PARAM) {
            pp_debug("stage: '%s' is BatchNormalization state ('%s'), not a trained parameter", g->values[dst].name,
                     n->name);
            g->values[dst].kind = PP_VALUE_CONST;
        }
        /* its own copy: a split shares constants with the source graph and
         * the other stages, which must not see this stage's updates */
        int shared = 0;
        for (int j = 0; j < ts->n; j++) shared |= ts->dst[j] == dst;
        if (!shared) {
            pp_tensor *own;
            PP_TRY(pp_tensor_clone(g->values[dst].data, &own));
            pp_tensor_free(g->values[dst].data);
            g->values[dst].data = own;
        }
        int src;
        PP_TRY(pp_node_add_output(g, i, k, &src));
        PP_TRY(add_pair(ts, src, dst));
    }
    return PP_OK;
}

/* A written training graph (`pippin inspect --backward -o`): its backward
 * nodes read the forward's batch statistics and Dropout masks, so running it
 * (pippin infer) keeps the forward in training mode, as ONNX Runtime runs
 * the same file. */
static int has_backward(const pp_graph *g) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].region != PP_REGION_FORWARD) return 1;
    return 0;
}

pp_status pp_train_state_prepare(pp_graph *g, int training, pp_train_state *ts) {
    memset(ts, 0, sizeof *ts);
    if (!training && has_backward(g)) return PP_OK;
    for (int i = 0; i < g->n_nodes; i++) {
        if (is_op(&g->nodes[i], "BatchNormalization")) {
            PP_TRY(prepare_batch_norm(g, i, training, ts));
        } else if (!training && is_op(&g->nodes[i], "Dropout") && g->nodes[i].n_in > 2) {
            g->nodes[i].in[2] = -1; /* training_mode: inference passes values through */
        }
    }
    return PP_OK;
}

void pp_train_state_keep(const pp_train_state *ts, uint8_t *keep) {
    for (int i = 0; i < ts->n; i++) keep[ts->src[i]] = 1;
}

pp_status pp_train_state_update(const pp_train_state *ts, pp_graph *g, pp_tensor *const *env) {
    for (int i = 0; i < ts->n; i++) {
        pp_tensor *one[1] = {env[ts->src[i]]};
        pp_train_state single = {1, &ts->src[i], &ts->dst[i], NULL};
        PP_TRY(pp_train_state_update_from(&single, g, one));
    }
    return PP_OK;
}

pp_status pp_train_state_update_from(const pp_train_state *ts, pp_graph *g, pp_tensor *const *computed) {
    for (int i = 0; i < ts->n; i++) { /* all checked first: none or all change */
        const pp_tensor *from = computed[i], *to = g->values[ts->dst[i]].data;
        if (from && (from->dtype != to->dtype || from->nbytes != to->nbytes))
            return pp_error(PP_ERR_SHAPE, "state '%s': the forward computed %s of %zu bytes for %s of %zu",
                            g->values[ts->dst[i]].name, pp_dtype_name(from->dtype), from->nbytes,
                            pp_dtype_name(to->dtype), to->nbytes);
    }
    for (int i = 0; i < ts->n; i++) {
        const pp_tensor *from = computed[i];
        pp_tensor *to = g->values[ts->dst[i]].data;
        if (from) memcpy(to->data, from->data, to->nbytes); /* NULL: a node the forward did not need */
    }
    return PP_OK;
}

pp_status pp_train_state_snapshot(pp_train_state *ts, const pp_graph *g) {
    if (!ts->n) return PP_OK;
    if (!ts->snap && !(ts->snap = calloc((size_t)ts->n, sizeof *ts->snap)))
        return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < ts->n; i++) {
        const pp_tensor *t = g->values[ts->dst[i]].data;
        if (!ts->snap[i]) PP_TRY(pp_tensor_clone(t, &ts->snap[i]));
        else memcpy(ts->snap[i]->data, t->data, t->nbytes);
    }
    return PP_OK;
}

void pp_train_state_restore(const pp_train_state *ts, pp_graph *g) {
    for (int i = 0; ts->snap && i < ts->n; i++)
        if (ts->snap[i]) memcpy(g->values[ts->dst[i]].data->data, ts->snap[i]->data, ts->snap[i]->nbytes);
}

pp_status pp_graph_prepare_inference(pp_graph *g) {
    pp_train_state none;
    pp_status s = pp_train_state_prepare(g, 0, &none);
    pp_train_state_clear(&none);
    if (s == PP_OK) s = pp_graph_optimize(g, pp_optimize_default(), NULL);
    return s;
}

void pp_train_state_clear(pp_train_state *ts) {
    for (int i = 0; ts->snap && i < ts->n; i++) pp_tensor_free(ts->snap[i]);
    free(ts->snap);
    free(ts->src);
    free(ts->dst);
    memset(ts, 0, sizeof *ts);
}

/* Whole-model training step: one executor runs forward and backward of the
 * training graph; gradients are added into the flat buffer. */
#include "pippin/trainer.h"

#include <stdlib.h>
#include <string.h>

#include "pippin/exec.h"
#include "pippin/optimize.h"

#include "status_internal.h"
#include "train_state.h"
struct pp_trainer {
    pp_graph *g;
    pp_backward *b;
    pp_flat_params *fp;
    pp_exec *ex;
    int loss_out;        /* index of the loss among the graph outputs */
    int *grad_out;       /* per flat parameter: index of its gradient output */
    uint8_t *grad_watch; /* per value: a parameter's gradient no node reads (the value hook takes it) */
    int *grad_param;     /* per value: the parameter whose gradient it is, or -1 */
    pp_tensor **ins, **outs;
    pp_train_state state; /* BatchNorm's running statistics (train_state.h) */
    int *state_out;       /* per state: its index among the graph outputs */
    pp_tensor **computed; /* per state: scratch */
    int64_t step, microbatch; /* pp_trainer_set_step */
    int touched;              /* this backward has added to the gradients */
    int hold;             /* pp_trainer_hold_params: packed weights outlive a backward */
};

void pp_trainer_free(pp_trainer *t) {
    if (!t) return;
    pp_exec_free(t->ex);
    pp_flat_params_free(t->fp);
    pp_backward_free(t->b);
    free(t->grad_out);
    free(t->grad_watch);
    free(t->grad_param);
    free(t->ins);
    free(t->outs);
    free(t->state_out);
    free(t->computed);
    pp_train_state_clear(&t->state);
    free(t);
}

/* The value hook: a parameter's gradient goes into the flat buffer as soon
 * as it is made (the run holds no gradient to its end). */
static pp_status add_gradient(void *user, int value, pp_tensor **slot) {
    pp_trainer *t = user;
    t->touched = 1;
    pp_status s = pp_flat_params_accumulate(t->fp, t->grad_param[value], *slot);
    pp_tensor_free(*slot);
    *slot = NULL;
    return s;
}

/* The target hook: a weight's gradient made as one tall GEMM adds straight
 * into its place (pp_exec_set_target_hook). */
static pp_status gradient_place(void *user, int value, pp_tensor **target) {
    pp_trainer *t = user;
    t->touched = 1; /* the GEMM adds into it from here on */
    return pp_flat_params_grad_view(t->fp, t->grad_param[value], target);
}

static pp_status watch_gradients(pp_trainer *t) {
    const pp_graph *g = t->g;
    t->grad_watch = calloc((size_t)g->n_values + 1, 1);
    t->grad_param = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    if (!t->grad_watch || !t->grad_param) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int v = 0; v < g->n_values; v++) t->grad_param[v] = -1;
    for (int i = 0; i < t->b->n_params; i++) {
        int v = t->b->param_grads[i];
        if (v < 0 || t->grad_param[v] >= 0) continue; /* one value, one parameter */
        t->grad_param[v] = i;
        t->grad_watch[v] = 1;
    }
    /* A gradient another node reads (P's in h + P, the same shapes: it is
     * dy itself, which h's own gradient reads) must stay in the run: it is
     * added from the outputs at the end, as before the hooks. */
    for (int n = 0; n < g->n_nodes; n++)
        for (int k = 0; k < g->nodes[n].n_in; k++)
            if (g->nodes[n].in[k] >= 0) t->grad_watch[g->nodes[n].in[k]] = 0;
    pp_exec_set_value_hook(t->ex, t->grad_watch, add_gradient, t);
    pp_exec_set_target_hook(t->ex, gradient_place);
    return PP_OK;
}

static int output_index(const pp_graph *g, int v) {
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return i;
    return -1;
}

pp_status pp_trainer_new(pp_graph *g, const char *loss_name, pp_trainer **out) {
    *out = NULL;
    pp_trainer *t = calloc(1, sizeof *t);
    if (!t) return pp_error(PP_ERR_NOMEM, "out of memory");
    t->g = g;
    pp_status s = pp_train_state_prepare(g, 1, &t->state);
    if (s == PP_OK) s = pp_autodiff_model(g, loss_name, 0, &t->b);
    if (s == PP_OK) {
        t->state_out = calloc((size_t)t->state.n + 1, sizeof(int));
        t->computed = calloc((size_t)t->state.n + 1, sizeof *t->computed);
        if (!t->state_out || !t->computed) s = pp_error(PP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; s == PP_OK && i < t->state.n; i++) { /* state values become outputs: the run keeps them */
        t->state_out[i] = g->n_outputs;
        s = pp_graph_add_output(g, t->state.src[i]);
    }
    if (s == PP_OK) s = pp_flat_params_new(g, t->b->n_params, t->b->params, &t->fp);
    if (s == PP_OK) s = pp_exec_new(g, &t->ex);
    if (s == PP_OK && (pp_optimize_default() & PP_OPT_PACK)) s = pp_exec_set_pack_weights(t->ex, 1);
    if (s == PP_OK) {
        t->grad_out = calloc((size_t)t->b->n_params + 1, sizeof(int));
        t->ins = calloc((size_t)g->n_inputs + 1, sizeof *t->ins);
        t->outs = calloc((size_t)g->n_outputs + 1, sizeof *t->outs);
        if (!t->grad_out || !t->ins || !t->outs) s = pp_error(PP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; s == PP_OK && i < t->b->n_params; i++)
        t->grad_out[i] = output_index(g, t->b->param_grads[i]);
    if (s == PP_OK) t->loss_out = output_index(g, t->b->seed_values[0]);
    if (s == PP_OK) s = watch_gradients(t);
    if (s == PP_OK && t->loss_out < 0)
        s = pp_error(PP_ERR_INTERNAL, "the loss is not a graph output");
    if (s != PP_OK) {
        pp_trainer_free(t);
        return s;
    }
    *out = t;
    return PP_OK;
}

/* One forward and backward (pp_trainer_backward). */
static pp_status trainer_run(pp_trainer *t, pp_tensor *const *inputs, float loss_scale, float *loss) {
    pp_graph *g = t->g;
    int n = t->b->n_inputs_before;
    for (int i = 0; i < n; i++) t->ins[i] = inputs[i];
    /* Unless the caller holds the parameters (pp_trainer_hold_params), it
     * may have written them since the last call (through the flat buffer
     * it keeps): packed copies live for this call only. */
    if (!t->hold) pp_exec_params_changed(t->ex);
    pp_tensor *seed;
    PP_TRY(pp_tensor_scalar_f32(loss_scale, &seed));
    t->ins[n] = seed; /* the loss seed is the one input autodiff added */
    pp_exec_set_random_stream(t->ex, 0, t->step, t->microbatch);
    pp_status s = pp_exec_run(t->ex, t->ins, t->outs);
    pp_tensor_free(seed);
    PP_TRY(s);
    for (int i = 0; i < t->state.n; i++) t->computed[i] = t->outs[t->state_out[i]];
    const pp_tensor *l = t->outs[t->loss_out];
    if (pp_tensor_numel(l) != 1 || l->dtype != PP_F32)
        s = pp_error(PP_ERR_INVALID, "loss '%s' is not a float32 scalar (%lld elements)",
                     g->values[g->outputs[t->loss_out]].name, (long long)pp_tensor_numel(l));
    if (s == PP_OK && loss) *loss = ((const float *)l->data)[0];
    for (int i = 0; s == PP_OK && i < t->fp->n; i++) /* the hooks took each gradient as it was made */
        if (t->grad_out[i] >= 0 && t->outs[t->grad_out[i]]) {
            t->touched = 1;
            s = pp_flat_params_accumulate(t->fp, i, t->outs[t->grad_out[i]]);
        }
    if (s == PP_OK) s = pp_train_state_update_from(&t->state, g, t->computed);
    for (int i = 0; i < g->n_outputs; i++) {
        pp_tensor_free(t->outs[i]);
        t->outs[i] = NULL;
    }
    return s;
}

pp_status pp_trainer_backward(pp_trainer *t, pp_tensor *const *inputs, float loss_scale,
                              float *loss) {
    PP_TRY(pp_flat_params_check_grads(t->fp, "trainer"));
    t->touched = 0;
    pp_status s = trainer_run(t, inputs, loss_scale, loss);
    /* a failure after a gradient went in leaves a part sum: flagged, never
     * silently stepped on or added to (a failure before any went in leaves
     * the buffer as it was) */
    if (s != PP_OK && t->touched) t->fp->grads_incomplete = 1;
    return s;
}

pp_flat_params *pp_trainer_params(pp_trainer *t) {
    pp_exec_params_changed(t->ex); /* the caller may write them */
    return t->fp;
}

void pp_trainer_hold_params(pp_trainer *t, int on) {
    pp_exec_params_changed(t->ex); /* held from now on, or may change from now on */
    t->hold = on != 0;
}

const pp_exec *pp_trainer_exec(const pp_trainer *t) { return t->ex; }

void pp_trainer_set_step(pp_trainer *t, int64_t step, int64_t microbatch) {
    if (step != t->step) pp_exec_params_changed(t->ex); /* an optimizer may have run in between */
    t->step = step;
    t->microbatch = microbatch;
}

int pp_trainer_n_state(const pp_trainer *t) { return t->state.n; }
const char *pp_trainer_state_name(const pp_trainer *t, int i) { return t->g->values[t->state.dst[i]].name; }
pp_tensor *pp_trainer_state_tensor(pp_trainer *t, int i) { return t->g->values[t->state.dst[i]].data; }
const pp_backward *pp_trainer_autodiff(const pp_trainer *t) { return t->b; }
int pp_trainer_n_inputs(const pp_trainer *t) { return t->b->n_inputs_before; }

pp_status pp_data_batch(const pp_tensor *data, int64_t step, int64_t batch, pp_tensor **out) {
    if (data->ndim < 1 || data->shape[0] < 1)
        return pp_error(PP_ERR_SHAPE, "training data needs at least one row along dim 0");
    if (batch < 1) return pp_error(PP_ERR_INVALID, "batch size %lld", (long long)batch);
    /* A negative step would make the row index negative (C's %). */
    if (step < 0) return pp_error(PP_ERR_INVALID, "training step %lld is negative", (long long)step);
    int64_t shape[PP_MAX_DIMS], rows = data->shape[0];
    memcpy(shape, data->shape, sizeof(int64_t) * (size_t)data->ndim);
    shape[0] = batch;
    PP_TRY(pp_tensor_empty(data->dtype, data->ndim, shape, out));
    size_t row_bytes = data->nbytes / (size_t)rows;
    for (int64_t j = 0; j < batch && row_bytes; j++) {
        int64_t r = ((step % rows) * (batch % rows) + j) % rows;
        memcpy((char *)(*out)->data + (size_t)j * row_bytes,
               (const char *)data->data + (size_t)r * row_bytes, row_bytes);
    }
    return PP_OK;
}

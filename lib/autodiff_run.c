/* Using a pp_backward: finding a model's loss, keep masks for running the
 * F/I/W regions apart, and measuring the stash and the memory plan. */
#include <stdlib.h>
#include <string.h>

#include "pippin/autodiff.h"
#include "pippin/exec.h"

#include "autodiff_unfused.h"

#include "status_internal.h"
pp_status pp_autodiff_find_loss(const pp_graph *g, const char *loss_name, int *value) {
    const char *want = loss_name ? loss_name : "loss";
    for (int i = 0; i < g->n_outputs; i++)
        if (strcmp(g->values[g->outputs[i]].name, want) == 0) {
            *value = g->outputs[i];
            return PP_OK;
        }
    if (loss_name) return pp_error(PP_ERR_NOT_FOUND, "the model has no output '%s'", loss_name);
    int found = -1, count = 0;
    for (int i = 0; i < g->n_outputs; i++) {
        const pp_value *v = &g->values[g->outputs[i]];
        if (v->ndim == 0 && pp_dtype_is_float(v->dtype)) {
            found = g->outputs[i];
            count++;
        }
    }
    if (count != 1)
        return pp_error(PP_ERR_NOT_FOUND,
                        "cannot tell which output is the loss (no output 'loss', %d float scalar "
                        "outputs); name it",
                        count);
    *value = found;
    return PP_OK;
}

static pp_status autodiff_model(pp_graph *g, const char *loss_name, int wrt_float_inputs, int fuse,
                                pp_backward **out) {
    int loss;
    PP_TRY(pp_autodiff_find_loss(g, loss_name, &loss));
    int *wrt = malloc(sizeof(int) * (size_t)(g->n_inputs + 1)), n_wrt = 0;
    if (!wrt) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; wrt_float_inputs && i < g->n_inputs; i++)
        if (pp_dtype_is_float(g->values[g->inputs[i]].dtype)) wrt[n_wrt++] = g->inputs[i];
    pp_backward_spec spec = {loss, 0, NULL, n_wrt, wrt};
    pp_status s = fuse ? pp_autodiff(g, &spec, out) : pp_autodiff_unfused(g, &spec, out);
    free(wrt);
    return s;
}

pp_status pp_autodiff_model(pp_graph *g, const char *loss_name, int wrt_float_inputs, pp_backward **out) {
    return autodiff_model(g, loss_name, wrt_float_inputs, 1, out);
}

pp_status pp_autodiff_model_unfused(pp_graph *g, const char *loss_name, int wrt_float_inputs, pp_backward **out) {
    return autodiff_model(g, loss_name, wrt_float_inputs, 0, out);
}

pp_status pp_backward_keep_masks(const pp_graph *g, const pp_backward *b, uint8_t **keep_f,
                                 uint8_t **keep_i) {
    uint8_t *f = calloc((size_t)g->n_values + 1, 1), *i = calloc((size_t)g->n_values + 1, 1);
    if (!f || !i) {
        free(f);
        free(i);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < b->n_stash; k++) f[b->stash[k]] = 1;
    for (int k = 0; k < g->n_outputs; k++) f[g->outputs[k]] = i[g->outputs[k]] = 1;
    /* After I: whatever W reads that I might otherwise free. */
    for (int k = 0; k < b->n_w; k++) {
        const pp_node *n = &g->nodes[b->w_nodes[k]];
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] >= 0) i[n->in[j]] = 1;
    }
    *keep_f = f;
    *keep_i = i;
    return PP_OK;
}

pp_status pp_backward_stash_bytes(pp_graph *g, const pp_backward *b, pp_tensor *const *inputs,
                                  int64_t *bytes) {
    pp_exec *ex;
    PP_TRY(pp_exec_new(g, &ex));
    pp_tensor **env = calloc((size_t)g->n_values + 1, sizeof *env);
    uint8_t *keep = calloc((size_t)g->n_values + 1, 1);
    pp_status s = env && keep ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int k = 0; s == PP_OK && k < b->n_inputs_before; k++)
        env[g->inputs[k]] = pp_tensor_retain(inputs[k]);
    for (int k = 0; s == PP_OK && k < b->n_stash; k++) keep[b->stash[k]] = 1;
    if (s == PP_OK) s = pp_exec_run_nodes(ex, b->forward_nodes, b->n_forward, env, keep);
    int64_t total = 0;
    for (int k = 0; s == PP_OK && k < b->n_stash; k++) {
        const pp_tensor *t = env[b->stash[k]];
        if (!t) continue;
        int shared = 0; /* views (Reshape, Identity) share one buffer */
        for (int j = 0; j < k && !shared; j++)
            shared = env[b->stash[j]] && env[b->stash[j]]->data == t->data && t->data;
        if (!shared) total += (int64_t)t->nbytes;
    }
    for (int v = 0; env && v < g->n_values; v++) pp_tensor_free(env[v]);
    free(env);
    free(keep);
    pp_exec_free(ex);
    if (s == PP_OK) *bytes = total;
    return s;
}


/* W's value hook while planning: a parameter's gradient dies as soon as
 * it is made, as in a stage (which adds it into its flat buffer then), so
 * the plan places it like any buffer living and dying inside the run. */
static pp_status drop_gradient(void *user, int value, pp_tensor **slot) {
    (void)user;
    (void)value;
    pp_tensor_free(*slot);
    *slot = NULL;
    return PP_OK;
}

/* The stage's masks for W: keep every parameter gradient, hand over (watch)
 * those no W node reads (pp_stage's keep_w and grad_watch). */
static pp_status w_masks(const pp_graph *g, const pp_backward *b, uint8_t **keep_w, uint8_t **watch) {
    uint8_t *k = calloc((size_t)g->n_values + 1, 1), *w = calloc((size_t)g->n_values + 1, 1);
    if (!k || !w) {
        free(k);
        free(w);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < b->n_params; i++)
        if (b->param_grads[i] >= 0) k[b->param_grads[i]] = w[b->param_grads[i]] = 1;
    for (int j = 0; j < b->n_w; j++) {
        const pp_node *n = &g->nodes[b->w_nodes[j]];
        for (int q = 0; q < n->n_in; q++)
            if (n->in[q] >= 0) w[n->in[q]] = 0;
    }
    *keep_w = k;
    *watch = w;
    return PP_OK;
}

/* F, I and W once on inputs, each on its own executor so each phase's
 * plan is read apart (bytes[p]), and the bytes in-place ops did not
 * allocate over the three (inplace_bytes, may be NULL). */
static pp_status plan_phases(pp_graph *g, const pp_backward *b, pp_tensor *const *inputs, int64_t bytes[PP_PHASES],
                             int64_t *inplace_bytes) {
    /* one executor per phase, so each one's plan is read apart */
    pp_exec *ex[PP_PHASES] = {NULL};
    uint8_t *keep_f = NULL, *keep_i = NULL, *keep_w = NULL, *watch = NULL;
    pp_tensor **env = calloc((size_t)g->n_values + 1, sizeof *env);
    pp_status s = env ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int p = 0; p < PP_PHASES && s == PP_OK; p++) {
        s = pp_exec_new(g, &ex[p]);
        if (s == PP_OK) pp_exec_set_memory_plan(ex[p], 1);
    }
    if (s == PP_OK) s = pp_backward_keep_masks(g, b, &keep_f, &keep_i);
    if (s == PP_OK) s = w_masks(g, b, &keep_w, &watch);
    for (int k = 0; s == PP_OK && k < b->n_inputs_before; k++) env[g->inputs[k]] = pp_tensor_retain(inputs[k]);
    if (s == PP_OK) s = pp_exec_run_nodes(ex[PP_PHASE_F], b->forward_nodes, b->n_forward, env, keep_f);
    /* Output gradients of zeros: the plan depends on shapes alone. */
    for (int k = 0; s == PP_OK && k < b->n_seeds; k++) {
        const pp_value *sv = &g->values[b->seed_values[k]];
        const pp_tensor *t = env[b->seed_values[k]] ? env[b->seed_values[k]] : sv->data;
        if (!t) s = pp_error(PP_ERR_STATE, "output '%s' was not computed", sv->name);
        else s = pp_tensor_new(pp_dtype_is_float(t->dtype) ? t->dtype : PP_F32, t->ndim, t->shape,
                               &env[b->seed_grads[k]]);
    }
    if (s == PP_OK) s = pp_exec_run_nodes(ex[PP_PHASE_I], b->i_nodes, b->n_i, env, keep_i);
    if (s == PP_OK) {
        pp_exec_set_value_hook(ex[PP_PHASE_W], watch, drop_gradient, NULL);
        s = pp_exec_run_nodes(ex[PP_PHASE_W], b->w_nodes, b->n_w, env, keep_w);
    }
    if (inplace_bytes) *inplace_bytes = 0;
    for (int p = 0; p < PP_PHASES; p++) {
        if (s == PP_OK) pp_exec_memory_plan(ex[p], &bytes[p], NULL);
        int64_t in_place = 0;
        if (s == PP_OK && inplace_bytes) pp_exec_inplace_stats(ex[p], NULL, &in_place);
        if (inplace_bytes) *inplace_bytes += in_place;
        pp_exec_free(ex[p]);
    }
    for (int v = 0; env && v < g->n_values; v++) pp_tensor_free(env[v]);
    free(env);
    free(keep_f);
    free(keep_i);
    free(keep_w);
    free(watch);
    return s;
}

pp_status pp_backward_plan_bytes(pp_graph *g, const pp_backward *b, pp_tensor *const *inputs, int64_t *bytes) {
    int64_t phase[PP_PHASES];
    PP_TRY(plan_phases(g, b, inputs, phase, NULL));
    *bytes = 0;
    for (int p = 0; p < PP_PHASES; p++)
        if (phase[p] > *bytes) *bytes = phase[p];
    return PP_OK;
}

pp_status pp_backward_plan_phase_bytes(pp_graph *g, const pp_backward *b, pp_tensor *const *inputs,
                                       int64_t bytes[PP_PHASES]) {
    return plan_phases(g, b, inputs, bytes, NULL);
}

pp_status pp_backward_inplace_bytes(pp_graph *g, const pp_backward *b, pp_tensor *const *inputs, int64_t *bytes) {
    int64_t phase[PP_PHASES];
    return plan_phases(g, b, inputs, phase, bytes);
}

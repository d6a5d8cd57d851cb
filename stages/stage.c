/* A pipeline stage: forward / backward-input / backward-weight per
 * microbatch over the stage graph and its symbolic backward, with
 * per-microbatch stashes and flat parameter and gradient buffers. */
#include "pippin/stage.h"

#include "pippin/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/autodiff.h"
#include "pippin/exec.h"
#include "pippin/log.h"
#include "pippin/optimize.h"
#include "pippin/params.h"

#include "device_backend.h"
#include "device_params.h"
#include "log_internal.h"
#include "status_internal.h"
#include "train_state.h"
typedef struct {
    int mb;
    int backward_input_done;
    int inputs_only; /* recompute: env holds the forward's inputs; F runs again before I */
    int64_t step;    /* the step of its forward: the re-run draws the same random masks */
    pp_tensor **env; /* one slot per graph value: the stash */
} mb_state;

struct pp_stage {
    pp_graph *g;
    int index;
    int training;
    int grads_touched; /* a W of this step (pp_stage_begin_step) has added to the gradients */
    pp_exec *ex;
    pp_device *dev;      /* pp_stage_use_device; NULL: the CPU */
    pp_backward *bw;
    uint8_t *keep_f, *keep_i, *keep_w;
    uint8_t *grad_watch; /* per value: a parameter's gradient no W node reads (added once made) */
    int *grad_param;     /* per value: the parameter whose gradient it is, or -1 */
    uint8_t *stash_mask; /* per value: kept from forward to backward */
    uint8_t *input_mask; /* per value: a forward input (what F keeps under recompute) */
    uint8_t *keep_f_rc;  /* keep_f and the inputs: F's keep mask under recompute */
    int recompute;       /* pp_stage_set_recompute */
    int async_outputs;   /* pp_stage_set_async_outputs */
    int n_fwd_inputs, n_fwd_outputs;
    int loss_seed; /* index into bw->seed_values of the loss, -1 if none */
    float loss_scale;
    int mb_offset;      /* pp_stage_set_microbatch_offset */
    int n_out_grads; /* seeds other than the loss */
    int *out_grad_seed; /* [n_out_grads]: index into bw seeds */
    mb_state *mbs;
    int n_mbs, cap_mbs;
    pp_flat_params *params; /* trainable parameters, in bw->params order */
    pp_device_params *dp;   /* params kept on dev (NULL: on the host) */
    uint8_t *device_values; /* per value: left on dev when a run ends (with dp: all but the state's) */
    uint8_t *upload_input;  /* per value: a forward input only device nodes read (with dp): uploaded by F */
    uint8_t *state_values;  /* per value: the state's (the host writes them between runs) */
    pp_train_state state;   /* what each training forward updates */
    int64_t step;           /* pp_stage_begin_step: for the random stream */
};

/* The parameters may change (or did): the executor's packed copies of
 * them are stale (pp_exec_set_pack_weights). Called by every stage call
 * that changes the parameters or hands out their buffers for writing, and
 * at every step's start, so a pack never outlives a step. */
static void params_changed(pp_stage *st) {
    if (st->ex) pp_exec_params_changed(st->ex);
}

static pp_status stage_error(const pp_stage *st, pp_status code, const char *fmt, const char *a, int mb) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a, mb);
    return pp_error(code, "stage %d: %s", st->index, msg);
}

static int find_value_index(const pp_graph *g, const int *ids, int n, int v) {
    for (int i = 0; i < n; i++)
        if (ids[i] == v) return i;
    (void)g;
    return -1;
}

static pp_status build_backward(pp_stage *st, const pp_stage_spec *spec) {
    pp_graph *g = st->g;
    int *seeds = calloc((size_t)spec->n_seeds + 1, sizeof(int));
    int *wrt = calloc((size_t)spec->n_wrt + 1, sizeof(int));
    pp_status s = seeds && wrt ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    int loss = -1;
    if (s == PP_OK && spec->loss && (loss = pp_graph_find_value(g, spec->loss)) < 0)
        s = pp_error(PP_ERR_NOT_FOUND, "stage %d: no loss value '%s'", st->index, spec->loss);
    for (int i = 0; s == PP_OK && i < spec->n_seeds; i++)
        if ((seeds[i] = pp_graph_find_value(g, spec->seeds[i])) < 0)
            s = pp_error(PP_ERR_NOT_FOUND, "stage %d: no output '%s'", st->index, spec->seeds[i]);
    for (int i = 0; s == PP_OK && i < spec->n_wrt; i++)
        if ((wrt[i] = pp_graph_find_value(g, spec->wrt[i])) < 0)
            s = pp_error(PP_ERR_NOT_FOUND, "stage %d: no input '%s'", st->index, spec->wrt[i]);
    if (s == PP_OK) {
        pp_backward_spec bs = {loss, spec->n_seeds, seeds, spec->n_wrt, wrt};
        s = pp_autodiff(g, &bs, &st->bw);
        if (s != PP_OK) s = pp_error_context(s, "stage %d backward", st->index);
    }
    free(seeds);
    free(wrt);
    PP_TRY(s);
    pp_backward *b = st->bw;
    st->loss_seed = loss >= 0 ? find_value_index(g, b->seed_values, b->n_seeds, loss) : -1;
    st->out_grad_seed = calloc((size_t)b->n_seeds + 1, sizeof(int));
    if (!st->out_grad_seed) return pp_error(PP_ERR_NOMEM, "out of memory");
    /* Output gradients come in the order the spec listed the seeds. */
    for (int i = 0; i < spec->n_seeds; i++) {
        int k = find_value_index(g, b->seed_values, b->n_seeds, pp_graph_find_value(g, spec->seeds[i]));
        if (k < 0) return pp_error(PP_ERR_INTERNAL, "stage %d: seed '%s' lost", st->index, spec->seeds[i]);
        st->out_grad_seed[st->n_out_grads++] = k;
    }
    PP_TRY(pp_backward_keep_masks(g, b, &st->keep_f, &st->keep_i));
    st->keep_w = calloc((size_t)g->n_values + 1, 1);
    if (!st->keep_w) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < b->n_params; i++)
        if (b->param_grads[i] >= 0) st->keep_w[b->param_grads[i]] = 1;
    st->grad_watch = calloc((size_t)g->n_values + 1, 1);
    st->grad_param = malloc(sizeof *st->grad_param * ((size_t)g->n_values + 1));
    if (!st->grad_watch || !st->grad_param) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int v = 0; v <= g->n_values; v++) st->grad_param[v] = -1;
    for (int i = 0; i < b->n_params; i++)
        if (b->param_grads[i] >= 0) {
            st->grad_watch[b->param_grads[i]] = 1;
            st->grad_param[b->param_grads[i]] = i;
        }
    for (int k = 0; k < b->n_w; k++) { /* one a W node reads waits for the end */
        const pp_node *n = &g->nodes[b->w_nodes[k]];
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] >= 0) st->grad_watch[n->in[j]] = 0;
    }
    st->stash_mask = calloc((size_t)g->n_values + 1, 1);
    if (!st->stash_mask) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < b->n_stash; k++) st->stash_mask[b->stash[k]] = 1;
    st->input_mask = calloc((size_t)g->n_values + 1, 1);
    if (!st->input_mask) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < st->n_fwd_inputs; i++) st->input_mask[g->inputs[i]] = 1;
    st->keep_f_rc = malloc((size_t)g->n_values + 1);
    if (!st->keep_f_rc) return pp_error(PP_ERR_NOMEM, "out of memory");
    return pp_flat_params_new(g, b->n_params, b->params, &st->params);
}

void pp_stage_spec_init(pp_stage_spec *s, int index) {
    memset(s, 0, sizeof *s);
    s->index = index;
}

pp_status pp_stage_new(pp_graph *g, const pp_stage_spec *spec, pp_stage **out) {
    *out = NULL;
    pp_stage *st = calloc(1, sizeof *st);
    if (!st) {
        pp_graph_free(g);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    st->g = g;
    st->index = spec->index;
    st->training = spec->training;
    st->loss_seed = -1;
    st->loss_scale = 1.0f;
    st->n_fwd_inputs = g->n_inputs;
    st->n_fwd_outputs = g->n_outputs;
    pp_status s = pp_graph_resolve(g);
    if (s == PP_OK) s = pp_train_state_prepare(g, spec->training, &st->state);
    if (s == PP_OK && spec->training) s = build_backward(st, spec);
    if (s == PP_OK && !spec->training) s = pp_graph_optimize(g, pp_optimize_default(), NULL);
    if (s == PP_OK && spec->training) {
        pp_train_state_keep(&st->state, st->keep_f);
        for (int v = 0; v <= g->n_values; v++) st->keep_f_rc[v] = st->keep_f[v] | st->input_mask[v];
    }
    if (s == PP_OK) s = pp_exec_new(g, &st->ex);
    if (s == PP_OK && !spec->training) pp_exec_set_constant_params(st->ex, 1); /* weights never change here */
    if (s == PP_OK && spec->training && (pp_optimize_default() & PP_OPT_PACK))
        s = pp_exec_set_pack_weights(st->ex, 1); /* packed once per step (params_changed) */
    if (s != PP_OK) {
        pp_stage_free(st);
        return s;
    }
    *out = st;
    return PP_OK;
}

pp_status pp_stage_from_pipe(pp_pipe *p, int index, int training, pp_stage **out) {
    *out = NULL;
    if (index < 0 || index >= p->n_stages || !p->stages[index])
        return pp_error(PP_ERR_INVALID, "stage %d is not in the pipe (or was taken)", index);
    pp_graph *g = p->stages[index];
    const char **seeds = calloc((size_t)g->n_outputs + 1, sizeof(char *));
    const char **wrt = calloc((size_t)g->n_inputs + 1, sizeof(char *));
    if (!seeds || !wrt) {
        free(seeds);
        free(wrt);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    pp_stage_spec spec = {index, training, NULL, 0, seeds, 0, wrt};
    if (training && p->loss_stage == index) spec.loss = p->loss;
    for (int e = 0; training && e < p->n_edges; e++) {
        const pp_pipe_edge *ed = &p->edges[e];
        int is_float = pp_dtype_is_float(ed->dtype);
        if (ed->dtype == PP_DTYPE_UNDEFINED) {
            free(seeds);
            free(wrt);
            return pp_error(PP_ERR_STATE, "edge '%s' has no dtype: probe the pipe's shapes first", ed->value);
        }
        if (!is_float) continue;
        if (ed->producer == index) seeds[spec.n_seeds++] = ed->value;
        for (int k = 0; k < ed->n_consumers; k++)
            if (ed->consumers[k] == index && ed->producer >= 0) wrt[spec.n_wrt++] = ed->value;
    }
    p->stages[index] = NULL;
    pp_status s = pp_stage_new(g, &spec, out);
    free(seeds);
    free(wrt);
    return s;
}

static void drop_mb(pp_stage *st, mb_state *m);

static void free_env(const pp_graph *g, pp_tensor **env) {
    if (!env) return;
    for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[v]);
    free(env);
}

void pp_stage_free(pp_stage *st) {
    if (!st) return;
    for (int i = 0; i < st->n_mbs; i++) free_env(st->g, st->mbs[i].env);
    free(st->mbs);
    pp_exec_free(st->ex);
    pp_device_params_free(st->dp);
    free(st->device_values);
    free(st->upload_input);
    free(st->state_values);
    pp_device_close(st->dev); /* after the executor: it holds device buffers */
    pp_backward_free(st->bw);
    free(st->keep_f);
    free(st->keep_i);
    free(st->keep_w);
    free(st->grad_watch);
    free(st->grad_param);
    free(st->stash_mask);
    free(st->input_mask);
    free(st->keep_f_rc);
    free(st->out_grad_seed);
    pp_graph_free(st->g);
    pp_flat_params_free(st->params);
    pp_train_state_clear(&st->state);
    free(st);
}

/* The forward inputs that nodes on dev read and no node on the CPU does:
 * F uploads them once and the stash keeps the device copy for I and W. */
static pp_status mark_device_inputs(pp_stage *st, pp_device *dev) {
    const pp_graph *g = st->g;
    uint8_t *host_read = calloc((size_t)g->n_values + 1, 1);
    if (!st->upload_input) st->upload_input = calloc((size_t)g->n_values + 1, 1);
    if (!host_read || !st->upload_input) {
        free(host_read);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    memset(st->upload_input, 0, (size_t)g->n_values + 1);
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        int on_dev = strcmp(pp_exec_node_device(st->ex, i), "cpu") != 0;
        if (!strcmp(n->op_type, "Shape") || !strcmp(n->op_type, "Size")) continue; /* a shape, cached */
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] < 0 || !st->input_mask[n->in[k]]) continue;
            if (on_dev && !(dev->ops->input_on_host && dev->ops->input_on_host(n, k))) st->upload_input[n->in[k]] = 1;
            else host_read[n->in[k]] = 1;
        }
    }
    for (int v = 0; v < g->n_values; v++)
        if (host_read[v]) st->upload_input[v] = 0;
    free(host_read);
    return PP_OK;
}

/* A training stage on a device that keeps parameters holds its weights,
 * gradients and optimizer state there (device_params.h), and its stash
 * between F, I and W: the executor leaves every value on the device at a
 * run's end, but the state the forward updates (train_state.h copies it
 * on the host); the stage downloads what it hands out (outputs, input
 * gradients). */
static pp_status keep_params_on(pp_stage *st, pp_device *dev) {
    pp_flat_params *fp = st->params;
    if (!fp || fp->total == 0 || !pp_device_keeps_params(dev)) return PP_OK;
    if (!st->device_values && !(st->device_values = malloc((size_t)st->g->n_values + 1)))
        return pp_error(PP_ERR_NOMEM, "out of memory");
    memset(st->device_values, 1, (size_t)st->g->n_values + 1);
    for (int i = 0; i < st->state.n; i++) st->device_values[st->state.src[i]] = 0;
    PP_TRY(mark_device_inputs(st, dev));
    PP_TRY(pp_device_params_new(dev, fp, &st->dp));
    pp_exec_set_device_values(st->ex, st->device_values);
    return PP_OK;
}

/* The state the forward updates is written on the host after each
 * microbatch (and by checkpoint loads): a device node reading it must get
 * a fresh copy each run, not the one it made first. */
static pp_status mark_state_values(pp_stage *st) {
    if (!st->state.n) return PP_OK;
    if (!st->state_values && !(st->state_values = calloc((size_t)st->g->n_values + 1, 1)))
        return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < st->state.n; i++) st->state_values[st->state.dst[i]] = 1;
    pp_exec_set_host_written(st->ex, st->state_values);
    return PP_OK;
}

pp_status pp_stage_use_device(pp_stage *st, const char *spec) {
    pp_device *dev = NULL;
    pp_status s = spec && strcmp(spec, "cpu") != 0 ? pp_device_open(spec, &dev) : PP_OK;
    if (s == PP_OK && st->dp) s = pp_device_params_to_host(st->dp, 1); /* the old device's values come back */
    if (s != PP_OK) { /* the stage stays as it was */
        pp_device_close(dev);
        return pp_error_context(s, "stage %d", st->index);
    }
    pp_device_params_free(st->dp);
    st->dp = NULL;
    pp_exec_set_device_values(st->ex, NULL);
    s = pp_exec_set_device(st->ex, dev);
    if (s == PP_OK) s = mark_state_values(st);
    if (s == PP_OK) s = keep_params_on(st, dev);
    if (s != PP_OK) { /* on the CPU, whose buffers are current */
        pp_exec_set_device_values(st->ex, NULL);
        pp_exec_set_device(st->ex, NULL);
        pp_device_close(dev);
        dev = NULL;
    }
    pp_device_close(st->dev);
    st->dev = dev;
    params_changed(st); /* the weights came back from the old device */
    return s == PP_OK ? s : pp_error_context(s, "stage %d", st->index);
}

/* F's inputs that only device nodes read go up once (upload_input). */
static pp_status upload_inputs(pp_stage *st, pp_tensor **env) {
    for (int i = 0; st->dp && i < st->n_fwd_inputs; i++) {
        int v = st->g->inputs[i];
        if (!st->upload_input[v] || pp_tensor_device(env[v])) continue;
        pp_tensor *d;
        PP_TRY(pp_device_upload(st->dev, env[v], &d));
        pp_tensor_free(env[v]);
        env[v] = d;
    }
    return PP_OK;
}

/* Before a run: the parameters' device copies go into env (their host
 * views would be uploaded by each run). */
static pp_status place_params(pp_stage *st, pp_tensor **env) {
    if (!st->dp) return PP_OK;
    PP_TRY(pp_device_params_ready(st->dp));
    for (int i = 0; i < st->params->n; i++) {
        int v = st->params->values[i];
        pp_tensor *view = pp_device_params_view(st->dp, i);
        if (env[v] == view) continue;
        pp_tensor_free(env[v]);
        env[v] = pp_tensor_retain(view);
    }
    return PP_OK;
}

/* A new host reference to t (downloaded when it is on the device; left
 * in flight with async_outputs). */
static pp_status to_host(pp_stage *st, pp_tensor *t, pp_tensor **out) {
    if (!pp_tensor_device(t)) return *out = pp_tensor_retain(t), PP_OK;
    return st->async_outputs ? pp_device_download_async(st->dev, t, out) : pp_device_download(st->dev, t, out);
}

void pp_stage_set_async_outputs(pp_stage *st, int on) {
    st->async_outputs = on != 0;
    pp_exec_set_async_outputs(st->ex, st->async_outputs);
}

/* Gradient i += g, where the stage keeps its gradients. */
/* The gradients hold a part sum after a failed W (pippin/params.h,
 * grads_incomplete); kept on the host buffer, which ZeRO-1's step and
 * the replicas' sum also look at, with the parameters on a device too. */
static void mark_grads_incomplete(pp_stage *st) {
    if (st->params) st->params->grads_incomplete = 1;
}

static pp_status check_grads(const pp_stage *st) {
    char who[32];
    snprintf(who, sizeof who, "stage %d", st->index);
    return pp_flat_params_check_grads(st->params, who);
}

pp_status pp_stage_check_grads(const pp_stage *st) { return check_grads(st); }

static pp_status accumulate(pp_stage *st, int i, const pp_tensor *g) {
    st->grads_touched = 1;
    return st->dp ? pp_device_params_accumulate(st->dp, i, g) : pp_flat_params_accumulate(st->params, i, g);
}

pp_device *pp_stage_device(const pp_stage *st) { return st->dev; }

const pp_exec *pp_stage_exec(const pp_stage *st) { return st->ex; }

const pp_graph *pp_stage_graph(const pp_stage *st) { return st->g; }
int pp_stage_index(const pp_stage *st) { return st->index; }
int pp_stage_n_inputs(const pp_stage *st) { return st->n_fwd_inputs; }
const char *pp_stage_input_name(const pp_stage *st, int i) { return st->g->values[st->g->inputs[i]].name; }
int pp_stage_n_outputs(const pp_stage *st) { return st->n_fwd_outputs; }
const char *pp_stage_output_name(const pp_stage *st, int i) { return st->g->values[st->g->outputs[i]].name; }
int pp_stage_n_grad_outputs(const pp_stage *st) { return st->n_out_grads; }
const char *pp_stage_grad_output_name(const pp_stage *st, int i) {
    return st->g->values[st->bw->seed_values[st->out_grad_seed[i]]].name;
}
int pp_stage_n_grad_inputs(const pp_stage *st) { return st->bw ? st->bw->n_wrt : 0; }
const char *pp_stage_grad_input_name(const pp_stage *st, int i) { return st->g->values[st->bw->wrt_values[i]].name; }
int pp_stage_has_loss(const pp_stage *st) { return st->loss_seed >= 0; }
void pp_stage_set_loss_scale(pp_stage *st, float scale) { st->loss_scale = scale; }
void pp_stage_set_microbatch_offset(pp_stage *st, int offset) { st->mb_offset = offset; }
int pp_stage_pending(const pp_stage *st) { return st->n_mbs; }

void pp_stage_discard_pending(pp_stage *st) {
    while (st->n_mbs > 0) drop_mb(st, &st->mbs[st->n_mbs - 1]);
}

size_t pp_stage_stash_bytes(const pp_stage *st) {
    size_t total = 0;
    for (int i = 0; i < st->n_mbs; i++)
        for (int v = 0; v < st->g->n_values; v++)
            if (st->mbs[i].env[v] && st->g->values[v].kind != PP_VALUE_PARAM &&
                st->g->values[v].kind != PP_VALUE_CONST)
                total += st->mbs[i].env[v]->nbytes;
    return total;
}

static mb_state *find_mb(pp_stage *st, int mb) {
    for (int i = 0; i < st->n_mbs; i++)
        if (st->mbs[i].mb == mb) return &st->mbs[i];
    return NULL;
}

static void drop_mb(pp_stage *st, mb_state *m) {
    free_env(st->g, m->env);
    *m = st->mbs[--st->n_mbs];
}

pp_status pp_stage_forward(pp_stage *st, int mb, pp_tensor *const *inputs, pp_tensor **outputs) {
    pp_graph *g = st->g;
    if (!st->training) {
        /* No stash: the executor frees every buffer after its last use. */
        pp_tensor **outs = calloc((size_t)g->n_outputs + 1, sizeof *outs);
        if (!outs) return pp_error(PP_ERR_NOMEM, "out of memory");
        pp_status s = pp_exec_run(st->ex, inputs, outs);
        if (s != PP_OK) s = pp_error_context(s, "stage %d forward of microbatch %d", st->index, mb);
        for (int o = 0; s == PP_OK && o < st->n_fwd_outputs; o++) outputs[o] = outs[o];
        free(outs);
        return s;
    }
    if (find_mb(st, mb)) return stage_error(st, PP_ERR_STATE, "%sforward of microbatch %d ran twice", "", mb);
    if (st->n_mbs == st->cap_mbs) {
        int cap = st->cap_mbs ? st->cap_mbs * 2 : 8;
        mb_state *m = realloc(st->mbs, sizeof *m * (size_t)cap);
        if (!m) return pp_error(PP_ERR_NOMEM, "out of memory");
        st->mbs = m;
        st->cap_mbs = cap;
    }
    pp_tensor **env = calloc((size_t)g->n_values + 1, sizeof *env);
    if (!env) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < st->n_fwd_inputs; i++) {
        if (!inputs[i]) {
            free_env(g, env);
            return stage_error(st, PP_ERR_INVALID, "input '%s' not given for microbatch %d",
                               g->values[g->inputs[i]].name, mb);
        }
        env[g->inputs[i]] = pp_tensor_retain(inputs[i]);
    }
    pp_backward *b = st->bw;
    pp_exec_set_random_stream(st->ex, 0, st->step, st->mb_offset + mb);
    pp_status s = place_params(st, env);
    if (s == PP_OK) s = upload_inputs(st, env);
    if (s == PP_OK)
        s = pp_exec_run_nodes(st->ex, b->forward_nodes, b->n_forward, env, st->recompute ? st->keep_f_rc : st->keep_f);
    if (s == PP_OK) s = pp_train_state_update(&st->state, g, env);
    for (int o = 0; s == PP_OK && o < st->n_fwd_outputs; o++)
        if (!env[g->outputs[o]] && !(env[g->outputs[o]] = pp_tensor_retain(g->values[g->outputs[o]].data)))
            s = stage_error(st, PP_ERR_INTERNAL, "output '%s' not computed (microbatch %d)",
                            g->values[g->outputs[o]].name, mb);
    for (int o = 0; o < st->n_fwd_outputs; o++) outputs[o] = NULL;
    for (int o = 0; s == PP_OK && o < st->n_fwd_outputs; o++) s = to_host(st, env[g->outputs[o]], &outputs[o]);
    if (s != PP_OK) {
        for (int o = 0; o < st->n_fwd_outputs; o++) pp_tensor_free(outputs[o]), outputs[o] = NULL;
        free_env(g, env);
        return pp_error_context(s, "stage %d forward of microbatch %d", st->index, mb);
    }
    /* Keep only the stash (recompute: only the inputs; I runs F again). */
    const uint8_t *keep = st->recompute ? st->input_mask : st->stash_mask;
    for (int v = 0; v < g->n_values; v++) {
        if (env[v] && !keep[v]) {
            pp_tensor_free(env[v]);
            env[v] = NULL;
        }
    }
    st->mbs[st->n_mbs++] = (mb_state){mb, 0, st->recompute, st->step, env};
    return PP_OK;
}

/* Recompute: F again over the inputs F kept, with the random stream of its
 * step and microbatch (the same Dropout masks) and without touching the
 * state (BatchNorm's running statistics took this microbatch's values
 * when F ran; its batch statistics come from the same inputs). Same nodes,
 * same kernels, same order: the stash F would have kept, bit for bit. The
 * inputs-only env is replaced only on success, so a failed try can be
 * retried or dropped. */
static pp_status recompute_forward(pp_stage *st, mb_state *m) {
    pp_graph *g = st->g;
    pp_backward *b = st->bw;
    pp_tensor **env = calloc((size_t)g->n_values + 1, sizeof *env);
    if (!env) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < st->n_fwd_inputs; i++) env[g->inputs[i]] = pp_tensor_retain(m->env[g->inputs[i]]);
    pp_exec_set_random_stream(st->ex, 0, m->step, st->mb_offset + m->mb);
    pp_status s = place_params(st, env);
    if (s == PP_OK) s = pp_exec_run_nodes(st->ex, b->forward_nodes, b->n_forward, env, st->keep_f);
    if (s != PP_OK) {
        free_env(g, env);
        return pp_error_context(s, "stage %d recomputing the forward of microbatch %d", st->index, m->mb);
    }
    for (int v = 0; v < g->n_values; v++)
        if (env[v] && !st->stash_mask[v]) {
            pp_tensor_free(env[v]);
            env[v] = NULL;
        }
    free_env(g, m->env);
    m->env = env;
    m->inputs_only = 0;
    return PP_OK;
}

pp_status pp_stage_backward_input(pp_stage *st, int mb, pp_tensor *const *out_grads, pp_tensor **in_grads) {
    if (!st->training) return stage_error(st, PP_ERR_STATE, "%sbackward of microbatch %d: not built for training", "", mb);
    mb_state *m = find_mb(st, mb);
    if (!m) return stage_error(st, PP_ERR_STATE, "%sbackward of microbatch %d before its forward", "", mb);
    if (m->backward_input_done)
        return stage_error(st, PP_ERR_STATE, "%sbackward-input of microbatch %d ran twice", "", mb);
    pp_graph *g = st->g;
    pp_backward *b = st->bw;
    for (int k = 0; k < st->n_out_grads; k++) /* checked before a re-run is paid for */
        if (!out_grads || !out_grads[k])
            return stage_error(st, PP_ERR_INVALID, "no gradient given for output '%s' (microbatch %d)",
                               g->values[b->seed_values[st->out_grad_seed[k]]].name, mb);
    if (m->inputs_only) PP_TRY(recompute_forward(st, m));
    pp_tensor **env = m->env;
    if (st->loss_seed >= 0) {
        pp_tensor *scale;
        PP_TRY(pp_tensor_scalar_f32(st->loss_scale, &scale));
        pp_tensor_free(env[b->seed_grads[st->loss_seed]]); /* from a failed earlier try */
        env[b->seed_grads[st->loss_seed]] = scale;
    }
    for (int k = 0; k < st->n_out_grads; k++) {
        int seed = st->out_grad_seed[k];
        pp_tensor *gt = out_grads ? out_grads[k] : NULL;
        if (!gt) {
            /* No consumer sent a gradient: it is zero, shaped like the output. */
            const pp_value *sv = &g->values[b->seed_values[seed]];
            return stage_error(st, PP_ERR_INVALID, "no gradient given for output '%s' (microbatch %d)", sv->name, mb);
        }
        pp_tensor_free(env[b->seed_grads[seed]]);
        env[b->seed_grads[seed]] = pp_tensor_retain(gt);
    }
    for (int k = 0; k < b->n_wrt; k++) in_grads[k] = NULL;
    pp_status s = place_params(st, env);
    if (s == PP_OK) s = pp_exec_run_nodes(st->ex, b->i_nodes, b->n_i, env, st->keep_i);
    for (int k = 0; s == PP_OK && k < b->n_wrt; k++) {
        int gv = b->wrt_grads[k];
        const pp_tensor *x = env[b->wrt_values[k]];
        if (gv >= 0 && env[gv]) {
            s = to_host(st, env[gv], &in_grads[k]);
        } else if (x) {
            s = pp_tensor_new(PP_F32, x->ndim, x->shape, &in_grads[k]); /* no path: zero */
        } else {
            s = stage_error(st, PP_ERR_INTERNAL, "gradient of '%s' missing (microbatch %d)",
                            g->values[b->wrt_values[k]].name, mb);
        }
    }
    if (s != PP_OK) {
        for (int k = 0; k < b->n_wrt; k++) { /* the caller gets all or nothing */
            pp_tensor_free(in_grads[k]);
            in_grads[k] = NULL;
        }
        return pp_error_context(s, "stage %d backward-input of microbatch %d", st->index, mb);
    }
    for (int v = 0; v < g->n_values; v++) /* W needs only what keep_i marks */
        if (env[v] && !st->keep_i[v]) {
            pp_tensor_free(env[v]);
            env[v] = NULL;
        }
    m->backward_input_done = 1;
    return PP_OK;
}

/* W's value hook: a parameter's gradient goes into the flat buffer as soon
 * as it is made, so a stage never holds all its gradients at once. Each
 * parameter has its own part of the buffer, so the order does not change
 * the bits. */
static pp_status add_gradient(void *user, int value, pp_tensor **slot) {
    pp_stage *st = user;
    pp_status s = accumulate(st, st->grad_param[value], *slot);
    pp_tensor_free(*slot);
    *slot = NULL;
    return s;
}

/* W's target hook: a weight's gradient made as one tall GEMM adds straight
 * into its place in the flat buffer (beta 1), so the gradient of every
 * microbatch is neither a tensor of its own nor a second pass over the
 * buffer. Not with the parameters on a device (their buffer is there). */
static pp_status gradient_place(void *user, int value, pp_tensor **target) {
    pp_stage *st = user;
    int i = st->grad_param[value];
    if (st->dp || i < 0) return PP_OK;
    st->grads_touched = 1; /* the GEMM adds into it from here on */
    return pp_flat_params_grad_view(st->params, i, target);
}

pp_status pp_stage_backward_weight(pp_stage *st, int mb) {
    if (!st->training) return stage_error(st, PP_ERR_STATE, "%sbackward of microbatch %d: not built for training", "", mb);
    mb_state *m = find_mb(st, mb);
    if (!m || !m->backward_input_done)
        return stage_error(st, PP_ERR_STATE, "%sbackward-weight of microbatch %d before its backward-input", "", mb);
    pp_backward *b = st->bw;
    PP_TRY(check_grads(st));
    pp_exec_set_value_hook(st->ex, st->grad_watch, add_gradient, st);
    pp_exec_set_target_hook(st->ex, gradient_place);
    pp_status s = place_params(st, m->env);
    if (s == PP_OK) s = pp_exec_run_nodes(st->ex, b->w_nodes, b->n_w, m->env, st->keep_w);
    pp_exec_set_target_hook(st->ex, NULL);
    pp_exec_set_value_hook(st->ex, NULL, NULL, NULL);
    for (int i = 0; s == PP_OK && i < b->n_params; i++) { /* the gradients W's nodes read */
        const pp_tensor *gt = b->param_grads[i] >= 0 ? m->env[b->param_grads[i]] : NULL;
        if (gt) s = accumulate(st, i, gt);
    }
    if (s != PP_OK) {
        /* a part sum is flagged, never stepped on nor added to (a retry
         * would add the parts that went in twice); so is one with this
         * step's earlier microbatches only */
        if (st->grads_touched) mark_grads_incomplete(st);
        return pp_error_context(s, "stage %d backward-weight of microbatch %d", st->index, mb);
    }
    drop_mb(st, m);
    return PP_OK;
}

pp_status pp_stage_backward(pp_stage *st, int mb, pp_tensor *const *out_grads, pp_tensor **in_grads) {
    PP_TRY(pp_stage_backward_input(st, mb, out_grads, in_grads));
    return pp_stage_backward_weight(st, mb);
}

pp_status pp_stage_set_recompute(pp_stage *st, int on) {
    if (on && !st->training)
        return pp_error(PP_ERR_STATE, "stage %d: recompute needs a stage built for training", st->index);
    st->recompute = on != 0;
    return PP_OK;
}

int pp_stage_recompute(const pp_stage *st) { return st->recompute; }

pp_status pp_stage_recompute_stash_per_sample_dims(pp_stage *st, const char *batch_name, int n_dims,
                                                   const char *const *dims, int64_t *per_sample) {
    if (!st->bw) return pp_error(PP_ERR_STATE, "stage %d was not built for training", st->index);
    return pp_backward_input_bytes_per_sample_dims(st->g, st->bw, batch_name, n_dims, dims, per_sample, NULL);
}

pp_status pp_stage_stash_per_sample(pp_stage *st, int64_t other_dims, int64_t *per_sample) {
    if (!st->bw) return pp_error(PP_ERR_STATE, "stage %d was not built for training", st->index);
    return pp_backward_stash_per_sample(st->g, st->bw, other_dims, per_sample, NULL);
}

pp_status pp_stage_stash_per_sample_dims(pp_stage *st, const char *batch_name, int n_dims,
                                         const char *const *dims, int64_t *per_sample) {
    if (!st->bw) return pp_error(PP_ERR_STATE, "stage %d was not built for training", st->index);
    return pp_backward_stash_per_sample_dims(st->g, st->bw, batch_name, n_dims, dims, per_sample, NULL);
}

pp_status pp_stage_plan_per_sample_dims(pp_stage *st, const char *batch_name, int n_dims,
                                        const char *const *dims, int64_t *per_sample, int64_t *fixed) {
    if (!st->bw) return pp_error(PP_ERR_STATE, "stage %d was not built for training", st->index);
    return pp_backward_plan_per_sample_dims(st->g, st->bw, batch_name, n_dims, dims, per_sample, fixed);
}

pp_status pp_stage_plan_phases_per_sample_dims(pp_stage *st, const char *batch_name, int n_dims,
                                               const char *const *dims, int64_t *per_sample, int64_t *fixed) {
    if (!st->bw) return pp_error(PP_ERR_STATE, "stage %d was not built for training", st->index);
    return pp_backward_plan_phases_per_sample_dims(st->g, st->bw, batch_name, n_dims, dims, per_sample, fixed);
}

pp_status pp_stage_inplace_per_sample_dims(pp_stage *st, const char *batch_name, int n_dims,
                                           const char *const *dims, int64_t *per_sample, int64_t *fixed) {
    if (!st->bw) return pp_error(PP_ERR_STATE, "stage %d was not built for training", st->index);
    return pp_backward_inplace_per_sample_dims(st->g, st->bw, batch_name, n_dims, dims, per_sample, fixed);
}

int pp_stage_n_params(const pp_stage *st) { return st->params ? st->params->n : 0; }
const char *pp_stage_param_name(const pp_stage *st, int i) { return st->params->names[i]; }

int pp_stage_find_param(const pp_stage *st, const char *name) {
    return st->params ? pp_flat_params_find(st->params, name) : -1;
}

pp_status pp_stage_params_sync(pp_stage *st, pp_flat_params **out) {
    /* the caller may read or write the host's buffers: they become current,
     * and the device takes them again before it next uses them; packed
     * copies are made again at their next use */
    *out = NULL;
    params_changed(st);
    if (st->dp) {
        pp_status s = pp_device_params_to_host(st->dp, 1);
        if (s != PP_OK)
            return pp_error_context(s, "stage %d: parameters on %s not brought back", st->index,
                                    pp_device_name(st->dev));
    }
    *out = st->params;
    return PP_OK;
}

pp_flat_params *pp_stage_params(pp_stage *st) {
    pp_flat_params *fp;
    if (pp_stage_params_sync(st, &fp) != PP_OK) {
        pp_log_error("%s", pp_last_error());
        return st->params;
    }
    return fp;
}

pp_status pp_stage_set_constant(pp_stage *st, const char *name, const pp_tensor *t) {
    int v = name ? pp_graph_find_value(st->g, name) : -1;
    pp_value *val = v >= 0 ? &st->g->values[v] : NULL;
    if (!val || (val->kind != PP_VALUE_PARAM && val->kind != PP_VALUE_CONST) || !val->data)
        return pp_error(PP_ERR_NOT_FOUND, "stage %d has no parameter or constant '%s'", st->index, name ? name : "");
    char a[128], b[128];
    if (!t || pp_tensor_device(t) || t->dtype != val->data->dtype ||
        !pp_shape_equal(t->ndim, t->shape, val->data->ndim, val->data->shape))
        return pp_error(PP_ERR_SHAPE, "stage %d: '%s' is %s%s, the new value %s%s%s", st->index, name,
                        pp_dtype_name(val->data->dtype), pp_shape_str(val->data->ndim, val->data->shape, a, sizeof a),
                        t ? pp_dtype_name(t->dtype) : "none", t ? pp_shape_str(t->ndim, t->shape, b, sizeof b) : "",
                        t && pp_tensor_device(t) ? " on a device" : "");
    PP_TRY(pp_tensor_wait(t));
    /* a trained parameter is a view of the flat buffer: the host's current, the device's taken again */
    if (val->kind == PP_VALUE_PARAM && st->dp) { /* a write to a stale host copy would be lost */
        pp_status s = pp_device_params_to_host(st->dp, 1);
        if (s != PP_OK) return pp_error_context(s, "stage %d: '%s'", st->index, name);
    }
    if (t->nbytes) memcpy(val->data->data, t->data, t->nbytes);
    pp_exec_constants_written(st->ex); /* the cache and the device's copies made from the old bytes go */
    return PP_OK;
}

pp_flat_params *pp_stage_grads(pp_stage *st) {
    pp_status s = st->dp ? pp_device_params_grads_to_host(st->dp) : PP_OK;
    if (s != PP_OK) { /* never stale gradients summed as if current */
        pp_error_context(s, "stage %d: gradients on %s not brought back", st->index, pp_device_name(st->dev));
        return NULL;
    }
    return st->params;
}

static pp_status in_stage(const pp_stage *st, pp_status s) {
    return s == PP_OK ? s : pp_error_context(s, "stage %d", st->index);
}

pp_status pp_stage_param_copy(pp_stage *st, int i, int grad, pp_tensor **out) {
    *out = NULL;
    if (!st->params || i < 0 || i >= st->params->n)
        return pp_error(PP_ERR_INVALID, "stage %d has no parameter %d", st->index, i);
    if (st->dp) return in_stage(st, pp_device_params_copy(st->dp, i, grad, out));
    pp_tensor *view;
    PP_TRY(grad ? pp_flat_params_grad_view(st->params, i, &view) : pp_flat_params_data_view(st->params, i, &view));
    pp_status s = pp_tensor_clone(view, out);
    pp_tensor_free(view);
    return s;
}

pp_status pp_stage_set_param_grad(pp_stage *st, int i, const pp_tensor *g) {
    if (!st->params || i < 0 || i >= st->params->n)
        return pp_error(PP_ERR_INVALID, "stage %d has no parameter %d", st->index, i);
    if (st->dp) return in_stage(st, pp_device_params_set_grad(st->dp, i, g));
    if (g->dtype != PP_F32 || pp_tensor_numel(g) != st->params->numel[i])
        return pp_error(PP_ERR_SHAPE, "stage %d: gradient of '%s': %lld elements for %lld", st->index,
                        st->params->names[i], (long long)pp_tensor_numel(g), (long long)st->params->numel[i]);
    memcpy(st->params->grad + st->params->offset[i], g->data, g->nbytes);
    return PP_OK;
}

pp_status pp_stage_optimizer_step(pp_stage *st, pp_optim *o) {
    if (!st->params) return PP_OK;
    PP_TRY(check_grads(st));
    params_changed(st); /* also when the step fails part way */
    if (st->dp) return in_stage(st, pp_device_params_step(st->dp, o));
    return pp_optim_step(o, st->params->data, st->params->grad, st->params->total);
}

void pp_stage_zero_grad(pp_stage *st) {
    if (st->dp) pp_device_params_zero_grad(st->dp);
    else if (st->params) pp_flat_params_zero_grad(st->params);
    if (st->params) st->params->grads_incomplete = 0;
    st->grads_touched = 0;
}

pp_status pp_stage_begin_step(pp_stage *st, int64_t step) {
    st->step = step;
    st->grads_touched = 0;
    params_changed(st); /* whatever wrote them between steps */
    return st->training ? pp_train_state_snapshot(&st->state, st->g) : PP_OK;
}

void pp_stage_abort_step(pp_stage *st) {
    pp_train_state_restore(&st->state, st->g);
    if (st->grads_touched) mark_grads_incomplete(st); /* part of the step's microbatches went in */
    params_changed(st);
}

int pp_stage_n_state(const pp_stage *st) { return st->state.n; }
const char *pp_stage_state_name(const pp_stage *st, int i) { return st->g->values[st->state.dst[i]].name; }
pp_tensor *pp_stage_state_tensor(pp_stage *st, int i) { return st->g->values[st->state.dst[i]].data; }

int pp_stage_n_frozen(const pp_stage *st) { return st->bw ? st->bw->n_frozen : 0; }
const char *pp_stage_frozen_name(const pp_stage *st, int i) { return st->g->values[st->bw->frozen[i]].name; }

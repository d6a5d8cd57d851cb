/* SGD and AdamW over flat buffers, following torch.optim's single-tensor
 * code line by line so trajectories match in float32: scalars are formed in
 * double as Python does, then used as float32 in the elementwise updates. */
#include "pippin/optim.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <strings.h>

#include "status_internal.h"
#include "thread_pool.h"
struct pp_optim {
    pp_optim_config c;
    int64_t n, steps;
    float *s0, *s1; /* SGD: momentum buffer; AdamW: exp_avg, exp_avg_sq */
};

void pp_optim_config_init(pp_optim_config *c, pp_optim_kind kind) {
    *c = (pp_optim_config){0};
    c->kind = kind;
    c->lr = 1e-3;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    if (kind == PP_OPTIM_ADAMW) c->weight_decay = 1e-2;
}

pp_status pp_optim_kind_parse(const char *name, pp_optim_kind *kind) {
    if (strcasecmp(name, "sgd") == 0) *kind = PP_OPTIM_SGD;
    else if (strcasecmp(name, "adamw") == 0) *kind = PP_OPTIM_ADAMW;
    else return pp_error(PP_ERR_INVALID, "unknown optimizer '%s' (sgd, adamw)", name);
    return PP_OK;
}

const char *pp_optim_kind_name(pp_optim_kind kind) {
    return kind == PP_OPTIM_ADAMW ? "adamw" : "sgd";
}

static pp_status check(const pp_optim_config *c) {
    if (!(c->lr >= 0)) return pp_error(PP_ERR_INVALID, "invalid learning rate %g", c->lr);
    if (!(c->weight_decay >= 0))
        return pp_error(PP_ERR_INVALID, "invalid weight_decay %g", c->weight_decay);
    if (c->kind == PP_OPTIM_SGD) {
        if (!(c->momentum >= 0)) return pp_error(PP_ERR_INVALID, "invalid momentum %g", c->momentum);
        if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
            return pp_error(PP_ERR_INVALID, "nesterov momentum requires a momentum and zero "
                                            "dampening");
    } else if (c->kind == PP_OPTIM_ADAMW) {
        if (!(c->eps >= 0)) return pp_error(PP_ERR_INVALID, "invalid epsilon %g", c->eps);
        if (!(c->beta1 >= 0 && c->beta1 < 1))
            return pp_error(PP_ERR_INVALID, "invalid beta1 %g (must be in [0, 1))", c->beta1);
        if (!(c->beta2 >= 0 && c->beta2 < 1))
            return pp_error(PP_ERR_INVALID, "invalid beta2 %g (must be in [0, 1))", c->beta2);
    } else {
        return pp_error(PP_ERR_INVALID, "unknown optimizer kind %d", (int)c->kind);
    }
    return PP_OK;
}

pp_status pp_optim_new(const pp_optim_config *c, int64_t n, pp_optim **out) {
    *out = NULL;
    PP_TRY(check(c));
    if (n < 0) return pp_error(PP_ERR_INVALID, "negative parameter count");
    /* sizeof(float) * n below must not wrap to a tiny buffer. */
    if ((uint64_t)n > PTRDIFF_MAX / sizeof(float))
        return pp_error(PP_ERR_INVALID, "%lld parameters: too many for one optimizer", (long long)n);
    pp_optim *o = calloc(1, sizeof *o);
    if (!o) return pp_error(PP_ERR_NOMEM, "out of memory");
    o->c = *c;
    o->n = n;
    size_t bytes = sizeof(float) * (size_t)(n ? n : 1);
    int need0 = c->kind == PP_OPTIM_ADAMW || c->momentum != 0, need1 = c->kind == PP_OPTIM_ADAMW;
    if (need0) o->s0 = calloc(1, bytes);
    if (need1) o->s1 = calloc(1, bytes);
    if ((need0 && !o->s0) || (need1 && !o->s1)) {
        pp_optim_free(o);
        return pp_error(PP_ERR_NOMEM, "out of memory for optimizer state");
    }
    *out = o;
    return PP_OK;
}

void pp_optim_free(pp_optim *o) {
    if (!o) return;
    free(o->s0);
    free(o->s1);
    free(o);
}

/* The updates run over element ranges [lo, hi) on the pool
 * (thread_pool.h): each element's update is the same at any cut. */
typedef struct step_job {
    pp_optim *o;
    float *p;
    const float *grad;
} step_job;

static void sgd_step(void *arg, int64_t lo, int64_t hi) {
    const step_job *j = arg;
    pp_optim *o = j->o;
    const pp_optim_config *c = &o->c;
    float *restrict p = j->p + lo;
    const float *restrict grad = j->grad + lo;
    int64_t n = hi - lo;
    float wd = (float)c->weight_decay, mom = (float)c->momentum;
    float damp = (float)(1.0 - c->dampening), neg_lr = (float)-c->lr;
    float sign = c->maximize ? -1.0f : 1.0f;
    float *restrict buf = o->s0 ? o->s0 + lo : NULL;
    int first = o->steps == 0;
    for (int64_t i = 0; i < n; i++) {
        float d = sign * grad[i];
        if (c->weight_decay != 0) d = d + wd * p[i];
        if (c->momentum != 0) {
            buf[i] = first ? d : buf[i] * mom + damp * d;
            d = c->nesterov ? d + mom * buf[i] : buf[i];
        }
        p[i] = p[i] + neg_lr * d;
    }
}

static void adamw_step(void *arg, int64_t lo, int64_t hi) {
    const step_job *j = arg;
    pp_optim *o = j->o;
    const pp_optim_config *c = &o->c;
    float *restrict p = j->p + lo;
    const float *restrict grad = j->grad + lo;
    int64_t n = hi - lo;
    double t = (double)(o->steps + 1);
    float decay = (float)(1.0 - c->lr * c->weight_decay);
    float b1 = (float)c->beta1, b2 = (float)c->beta2;
    float one_b1 = (float)(1.0 - c->beta1), one_b2 = (float)(1.0 - c->beta2);
    double bc1 = 1.0 - pow(c->beta1, t), bc2 = 1.0 - pow(c->beta2, t);
    float neg_step = (float)(-(c->lr / bc1)), bc2_sqrt = (float)sqrt(bc2), eps = (float)c->eps;
    float sign = c->maximize ? -1.0f : 1.0f;
    float *restrict m = o->s0 + lo, *restrict v = o->s1 + lo;
    for (int64_t i = 0; i < n; i++) {
        float g = sign * grad[i];
        p[i] = p[i] * decay;
        m[i] = m[i] * b1 + one_b1 * g;
        v[i] = v[i] * b2 + one_b2 * (g * g);
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] = p[i] + neg_step * (m[i] / denom);
    }
}

pp_status pp_optim_step(pp_optim *o, float *params, const float *grads, int64_t n) {
    if (n != o->n)
        return pp_error(PP_ERR_INVALID, "optimizer made for %lld elements, stepped with %lld",
                        (long long)o->n, (long long)n);
    step_job j = {o, params, grads};
    pp_parallel_elems(n, PP_GRAIN_ELEMS, o->c.kind == PP_OPTIM_SGD ? sgd_step : adamw_step, &j);
    o->steps++;
    return PP_OK;
}

int64_t pp_optim_size(const pp_optim *o) { return o->n; }
int64_t pp_optim_steps(const pp_optim *o) { return o->steps; }
void pp_optim_set_lr(pp_optim *o, double lr) { o->c.lr = lr; }
const pp_optim_config *pp_optim_get_config(const pp_optim *o) { return &o->c; }
void pp_optim_set_steps(pp_optim *o, int64_t steps) { o->steps = steps; }

int pp_optim_state(pp_optim *o, int i, const char **name, float **buf) {
    int count = o->c.kind == PP_OPTIM_ADAMW ? 2 : (o->s0 ? 1 : 0);
    if (i >= 0 && i < count) {
        if (name)
            *name = o->c.kind == PP_OPTIM_ADAMW ? (i == 0 ? "exp_avg" : "exp_avg_sq")
                                                : "momentum_buffer";
        if (buf) *buf = i == 0 ? o->s0 : o->s1;
    }
    return count;
}

/* A training stage's parameters kept on its device (device_params.h). */
#include "device_params.h"

#include <stdlib.h>
#include <string.h>

#include "device_backend.h"
#include "status_internal.h"

/* Which copy of a buffer is current. */
typedef enum side { BOTH = 0, HOST_NEWER = 1, DEVICE_NEWER = 2 } side;

#define MAX_STATE 2 /* SGD's momentum; AdamW's two moments */

struct pp_device_params {
    pp_device *dev;
    pp_flat_params *fp;
    pp_tensor *data, *grad;       /* device copies of fp->data, fp->grad */
    pp_tensor **views;            /* [fp->n]: parameter i in data */
    side data_side, grad_side;
    pp_optim *opt;                /* the optimizer whose state the device holds (NULL: none) */
    pp_tensor *state[MAX_STATE];  /* its state buffers on the device */
    side state_side;
};

static size_t total_bytes(const pp_device_params *dp) { return sizeof(float) * (size_t)dp->fp->total; }

static float *dev_floats(const pp_tensor *t) { return t->data; }

pp_status pp_device_params_new(pp_device *dev, pp_flat_params *fp, pp_device_params **out) {
    *out = NULL;
    if (!pp_device_keeps_params(dev))
        return pp_error(PP_ERR_UNSUPPORTED, "%s keeps no parameters", pp_device_name(dev));
    pp_device_params *dp = calloc(1, sizeof *dp);
    if (!dp) return pp_error(PP_ERR_NOMEM, "out of memory");
    dp->dev = dev;
    dp->fp = fp;
    dp->data_side = dp->grad_side = HOST_NEWER;
    dp->views = calloc((size_t)fp->n + 1, sizeof *dp->views);
    int64_t total = fp->total;
    pp_status s = dp->views ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    if (s == PP_OK) s = pp_device_tensor_new(dev, PP_MEMORY_DEVICE, PP_F32, 1, &total, &dp->data);
    if (s == PP_OK) s = pp_device_tensor_new(dev, PP_MEMORY_DEVICE, PP_F32, 1, &total, &dp->grad);
    for (int i = 0; i < fp->n && s == PP_OK; i++)
        s = pp_device_tensor_view(dp->data, sizeof(float) * (size_t)fp->offset[i], PP_F32, fp->ndims[i],
                                  fp->shapes + (size_t)i * PP_MAX_DIMS, &dp->views[i]);
    if (s != PP_OK) {
        pp_device_params_free(dp);
        return pp_error_context(s, "%s: keeping %lld parameter elements", pp_device_name(dev), (long long)total);
    }
    *out = dp;
    return PP_OK;
}

void pp_device_params_free(pp_device_params *dp) {
    if (!dp) return;
    for (int i = 0; dp->views && i < dp->fp->n; i++) pp_tensor_free(dp->views[i]);
    free(dp->views);
    pp_tensor_free(dp->data);
    pp_tensor_free(dp->grad);
    for (int i = 0; i < MAX_STATE; i++) pp_tensor_free(dp->state[i]);
    free(dp);
}

pp_tensor *pp_device_params_view(const pp_device_params *dp, int i) { return dp->views[i]; }

/* The device's copy of a flat buffer current. */
static pp_status to_device(pp_device_params *dp, pp_tensor *dt, const float *host, side *where) {
    if (*where != HOST_NEWER) return PP_OK;
    PP_TRY(pp_device_copy_in(dp->dev, dt->data, host, total_bytes(dp)));
    *where = BOTH;
    return PP_OK;
}

pp_status pp_device_params_ready(pp_device_params *dp) {
    return to_device(dp, dp->data, dp->fp->data, &dp->data_side);
}

static pp_status check_index(const pp_device_params *dp, int i, const pp_tensor *t, const char *what) {
    if (i < 0 || i >= dp->fp->n) return pp_error(PP_ERR_INVALID, "parameter index %d out of range", i);
    if (t && (t->dtype != PP_F32 || pp_tensor_numel(t) != dp->fp->numel[i]))
        return pp_error(PP_ERR_SHAPE, "%s of '%s': %lld %s elements for %lld float32", what, dp->fp->names[i],
                        (long long)pp_tensor_numel(t), pp_dtype_name(t->dtype), (long long)dp->fp->numel[i]);
    return PP_OK;
}

pp_status pp_device_params_accumulate(pp_device_params *dp, int i, const pp_tensor *g) {
    PP_TRY(check_index(dp, i, g, "gradient"));
    PP_TRY(to_device(dp, dp->grad, dp->fp->grad, &dp->grad_side));
    pp_tensor *up = NULL;
    if (pp_tensor_device(g) != dp->dev) PP_TRY(pp_device_upload(dp->dev, g, &up)); /* a CPU node made it */
    const pp_tensor *src = up ? up : g;
    pp_status s = dp->dev->ops->add_into(dp->dev, dev_floats(dp->grad) + dp->fp->offset[i], src->data, dp->fp->numel[i]);
    pp_tensor_free(up);
    if (s != PP_OK) return pp_error_context(s, "adding the gradient of '%s'", dp->fp->names[i]);
    dp->grad_side = DEVICE_NEWER;
    return PP_OK;
}

void pp_device_params_zero_grad(pp_device_params *dp) {
    pp_flat_params_zero_grad(dp->fp);
    /* the host's zeros stand if the device cannot zero its copy */
    dp->grad_side = dp->dev->ops->zero(dp->dev, dp->grad->data, total_bytes(dp)) == PP_OK ? BOTH : HOST_NEWER;
}

pp_status pp_device_params_step(pp_device_params *dp, pp_optim *o) {
    int64_t n = dp->fp->total;
    if (pp_optim_size(o) != n)
        return pp_error(PP_ERR_INVALID, "optimizer made for %lld elements, stepped with %lld",
                        (long long)pp_optim_size(o), (long long)n);
    PP_TRY(pp_device_params_ready(dp));
    PP_TRY(to_device(dp, dp->grad, dp->fp->grad, &dp->grad_side));
    int n_state = pp_optim_state(o, -1, NULL, NULL);
    if (n_state > MAX_STATE) return pp_error(PP_ERR_INTERNAL, "optimizer with %d state buffers", n_state);
    if (dp->opt != o || dp->state_side == HOST_NEWER) { /* o's state comes up */
        for (int k = 0; k < n_state; k++) {
            float *host;
            pp_optim_state(o, k, NULL, &host);
            if (!dp->state[k]) PP_TRY(pp_device_tensor_new(dp->dev, PP_MEMORY_DEVICE, PP_F32, 1, &n, &dp->state[k]));
            PP_TRY(pp_device_copy_in(dp->dev, dp->state[k]->data, host, total_bytes(dp)));
        }
        dp->opt = o;
        dp->state_side = BOTH;
    }
    const pp_optim_config *c = pp_optim_get_config(o);
    int64_t steps = pp_optim_steps(o);
    float *p = dp->data->data, *g = dp->grad->data;
    pp_status s;
    if (c->kind == PP_OPTIM_SGD) {
        pp_km_sgd k = {(float)c->lr, (float)c->weight_decay, (float)c->momentum, (float)c->dampening,
                       c->maximize ? -1.0f : 1.0f, c->nesterov, steps == 0};
        s = dp->dev->ops->sgd(dp->dev, &k, p, g, n_state ? dp->state[0]->data : NULL, n);
    } else {
        pp_km_adamw k = pp_km_adamw_for_step(c->lr, c->weight_decay, c->beta1, c->beta2, c->eps, c->maximize,
                                             (double)(steps + 1));
        s = dp->dev->ops->adamw(dp->dev, &k, p, g, dp->state[0]->data, dp->state[1]->data, n);
    }
    if (s != PP_OK) return pp_error_context(s, "%s update on %s", pp_optim_kind_name(c->kind), pp_device_name(dp->dev));
    pp_optim_set_steps(o, steps + 1);
    dp->data_side = DEVICE_NEWER;
    if (n_state) dp->state_side = DEVICE_NEWER;
    return PP_OK;
}

/* The host's copy of a buffer current. */
static pp_status to_host(pp_device_params *dp, float *host, const void *device_ptr, side *where) {
    if (*where != DEVICE_NEWER) return PP_OK;
    PP_TRY(pp_device_copy_out(dp->dev, host, device_ptr, total_bytes(dp)));
    *where = BOTH;
    return PP_OK;
}

pp_status pp_device_params_to_host(pp_device_params *dp, int writable) {
    PP_TRY(to_host(dp, dp->fp->data, dp->data->data, &dp->data_side));
    PP_TRY(to_host(dp, dp->fp->grad, dp->grad->data, &dp->grad_side));
    if (dp->opt && dp->state_side == DEVICE_NEWER) {
        for (int k = 0; k < pp_optim_state(dp->opt, -1, NULL, NULL); k++) {
            float *host;
            pp_optim_state(dp->opt, k, NULL, &host);
            PP_TRY(pp_device_copy_out(dp->dev, host, dp->state[k]->data, total_bytes(dp)));
        }
        dp->state_side = BOTH;
    }
    if (writable) dp->data_side = dp->grad_side = dp->state_side = HOST_NEWER;
    return PP_OK;
}

pp_status pp_device_params_grads_to_host(pp_device_params *dp) {
    PP_TRY(to_host(dp, dp->fp->grad, dp->grad->data, &dp->grad_side));
    dp->grad_side = HOST_NEWER;
    return PP_OK;
}

pp_status pp_device_params_copy(pp_device_params *dp, int i, int grad, pp_tensor **out) {
    *out = NULL;
    PP_TRY(check_index(dp, i, NULL, NULL));
    pp_flat_params *fp = dp->fp;
    pp_tensor *t;
    PP_TRY(pp_tensor_new(PP_F32, fp->ndims[i], fp->shapes + (size_t)i * PP_MAX_DIMS, &t));
    side where = grad ? dp->grad_side : dp->data_side;
    const float *host = (grad ? fp->grad : fp->data) + fp->offset[i];
    pp_status s = PP_OK;
    if (where == DEVICE_NEWER)
        s = pp_device_copy_out(dp->dev, t->data, dev_floats(grad ? dp->grad : dp->data) + fp->offset[i], t->nbytes);
    else
        memcpy(t->data, host, t->nbytes);
    if (s != PP_OK) {
        pp_tensor_free(t);
        return pp_error_context(s, "reading '%s'", fp->names[i]);
    }
    *out = t;
    return PP_OK;
}

pp_status pp_device_params_set_grad(pp_device_params *dp, int i, const pp_tensor *g) {
    PP_TRY(check_index(dp, i, g, "gradient"));
    if (pp_tensor_device(g)) return pp_error(PP_ERR_INVALID, "gradient of '%s': a device tensor", dp->fp->names[i]);
    float *host = dp->fp->grad + dp->fp->offset[i];
    memcpy(host, g->data, g->nbytes);
    if (dp->grad_side == HOST_NEWER) return PP_OK; /* the device takes the whole buffer before its next use */
    return pp_device_copy_in(dp->dev, dev_floats(dp->grad) + dp->fp->offset[i], host, g->nbytes);
}

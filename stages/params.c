/* Flat parameter and gradient buffers with per-tensor views. */
#include "pippin/params.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status_internal.h"
#include "thread_pool.h"
#define ALIGN_ELEMS 16 /* 64 bytes of float32 */

/* One allocation holding both buffers; freed when the pp_flat_params and
 * every view made of it are gone. */
typedef struct block {
    atomic_int refs;
    void *raw;  /* what calloc gave */
    float *mem; /* raw rounded up to 64 bytes */
} block;

static void block_unref(void *data, void *hint) {
    (void)data;
    block *b = hint;
    if (atomic_fetch_sub(&b->refs, 1) == 1) {
        free(b->raw);
        free(b);
    }
}

static pp_status view(pp_flat_params *fp, int i, float *base, pp_tensor **out) {
    if (i < 0 || i >= fp->n) return pp_error(PP_ERR_INVALID, "parameter index %d out of range", i);
    block *b = fp->block;
    atomic_fetch_add(&b->refs, 1);
    pp_status s = pp_tensor_wrap(PP_F32, fp->ndims[i], fp->shapes + (size_t)i * PP_MAX_DIMS,
                                 base + fp->offset[i], block_unref, b, out);
    if (s != PP_OK) atomic_fetch_sub(&b->refs, 1);
    return s;
}

pp_status pp_flat_params_data_view(pp_flat_params *fp, int i, pp_tensor **out) {
    return view(fp, i, fp->data, out);
}

pp_status pp_flat_params_grad_view(pp_flat_params *fp, int i, pp_tensor **out) {
    return view(fp, i, fp->grad, out);
}

static void no_free(void *data, void *hint) {
    (void)data;
    (void)hint;
}

pp_status pp_flat_params_range_view(pp_flat_params *fp, int grad, int64_t off, int64_t len, pp_tensor **out) {
    if (off < 0 || len < 0 || off > fp->total - len)
        return pp_error(PP_ERR_INVALID, "elements [%lld, %lld) of a flat buffer of %lld", (long long)off,
                        (long long)(off + len), (long long)fp->total);
    block *b = fp->block;
    if (b) atomic_fetch_add(&b->refs, 1);
    pp_status s = pp_tensor_wrap(PP_F32, 1, (int64_t[]){len}, (grad ? fp->grad : fp->data) + off,
                                 b ? block_unref : no_free, b, out);
    if (s != PP_OK && b) atomic_fetch_sub(&b->refs, 1);
    return s;
}

void pp_flat_params_free(pp_flat_params *fp) {
    if (!fp) return;
    for (int i = 0; fp->names && i < fp->n; i++) free(fp->names[i]);
    free(fp->names);
    free(fp->values);
    free(fp->offset);
    free(fp->numel);
    free(fp->ndims);
    free(fp->shapes);
    if (fp->block) block_unref(NULL, fp->block);
    free(fp);
}

static pp_status layout(const pp_graph *g, int n, const int *values, pp_flat_params *fp) {
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        int v = values[i];
        if (v < 0 || v >= g->n_values) return pp_error(PP_ERR_INVALID, "bad parameter value id %d", v);
        const pp_value *val = &g->values[v];
        if (val->kind != PP_VALUE_PARAM || !val->data || val->data->dtype != PP_F32)
            return pp_error(PP_ERR_INVALID, "'%s' is not a float32 parameter", val->name);
        /* A second slot for one value: the graph would read only the last
         * slot, so updates to the first would be silently lost. */
        for (int j = 0; j < i; j++)
            if (values[j] == v) return pp_error(PP_ERR_INVALID, "parameter '%s' is listed twice", val->name);
        fp->values[i] = v;
        fp->names[i] = strdup(val->name);
        if (!fp->names[i]) return pp_error(PP_ERR_NOMEM, "out of memory");
        fp->numel[i] = pp_tensor_numel(val->data);
        fp->ndims[i] = val->data->ndim;
        memcpy(fp->shapes + (size_t)i * PP_MAX_DIMS, val->data->shape,
               sizeof(int64_t) * (size_t)val->data->ndim);
        fp->offset[i] = off;
        off += (fp->numel[i] + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    }
    fp->total = off;
    return PP_OK;
}

pp_status pp_flat_params_new(pp_graph *g, int n, const int *values, pp_flat_params **out) {
    *out = NULL;
    if (n < 0 || (n && !values)) return pp_error(PP_ERR_INVALID, "pp_flat_params_new: %d parameters", n);
    pp_flat_params *fp = calloc(1, sizeof *fp);
    if (!fp) return pp_error(PP_ERR_NOMEM, "out of memory");
    size_t m = (size_t)(n ? n : 1);
    fp->n = n;
    fp->values = calloc(m, sizeof(int));
    fp->names = calloc(m, sizeof(char *));
    fp->offset = calloc(m, sizeof(int64_t));
    fp->numel = calloc(m, sizeof(int64_t));
    fp->ndims = calloc(m, sizeof(int));
    fp->shapes = calloc(m * PP_MAX_DIMS, sizeof(int64_t));
    block *b = calloc(1, sizeof *b);
    pp_status s = fp->values && fp->names && fp->offset && fp->numel && fp->ndims && fp->shapes && b
                      ? PP_OK
                      : pp_error(PP_ERR_NOMEM, "out of memory");
    if (s == PP_OK) {
        atomic_init(&b->refs, 1);
        fp->block = b;
        b = NULL;
        s = layout(g, n, values, fp);
    }
    free(b);
    block *blk = fp->block;
    if (s == PP_OK) {
        /* calloc, not aligned_alloc and memset: a large block comes as
         * fresh zero pages, so the gradients cost no memory until a
         * backward writes them (never, for `inspect`) */
        size_t bytes = sizeof(float) * (size_t)(2 * fp->total + ALIGN_ELEMS);
        blk->raw = calloc(1, bytes + 64);
        if (!blk->raw) s = pp_error(PP_ERR_NOMEM, "out of memory for %lld parameters", (long long)fp->total);
        else blk->mem = (float *)(((uintptr_t)blk->raw + 63) / 64 * 64);
    }
    if (s != PP_OK) {
        pp_flat_params_free(fp);
        return s;
    }
    fp->data = blk->mem;
    fp->grad = blk->mem + fp->total;
    /* Copy each parameter in, then point the graph at the view. */
    for (int i = 0; i < n && s == PP_OK; i++) {
        pp_value *val = &g->values[fp->values[i]];
        memcpy(fp->data + fp->offset[i], val->data->data, sizeof(float) * (size_t)fp->numel[i]);
        pp_tensor *t;
        s = pp_flat_params_data_view(fp, i, &t);
        if (s == PP_OK) {
            pp_tensor_free(val->data);
            val->data = t;
        }
    }
    if (s != PP_OK) {
        pp_flat_params_free(fp);
        return s;
    }
    *out = fp;
    return PP_OK;
}

int pp_flat_params_find(const pp_flat_params *fp, const char *name) {
    for (int i = 0; i < fp->n; i++)
        if (strcmp(fp->names[i], name) == 0) return i;
    return -1;
}

void pp_flat_params_zero_grad(pp_flat_params *fp) {
    memset(fp->grad, 0, sizeof(float) * (size_t)fp->total);
    fp->grads_incomplete = 0;
}

pp_status pp_flat_params_check_grads(const pp_flat_params *fp, const char *who) {
    if (!fp || !fp->grads_incomplete) return PP_OK;
    return pp_error(PP_ERR_STATE, "%s: the gradients hold part of a backward that failed; zero them before "
                    "another backward or an optimizer step", who);
}

static pp_status check_src(const pp_flat_params *fp, int i, const pp_tensor *t, const char *what) {
    if (i < 0 || i >= fp->n) return pp_error(PP_ERR_INVALID, "parameter index %d out of range", i);
    if (!t || t->dtype != PP_F32 || pp_tensor_numel(t) != fp->numel[i])
        return pp_error(PP_ERR_SHAPE, "%s for parameter '%s' must be float32 with %lld elements",
                        what, fp->names[i], (long long)fp->numel[i]);
    return PP_OK;
}

typedef struct acc_job {
    float *dst;
    const float *src;
} acc_job;

static void acc_piece(void *arg, int64_t lo, int64_t hi) {
    const acc_job *j = arg;
    float *restrict dst = j->dst;
    const float *restrict src = j->src;
    for (int64_t k = lo; k < hi; k++) dst[k] += src[k];
}

/* Each element's sum is the same at any cut: the pool may split it. */
pp_status pp_flat_params_accumulate(pp_flat_params *fp, int i, const pp_tensor *g) {
    PP_TRY(check_src(fp, i, g, "gradient"));
    acc_job j = {fp->grad + fp->offset[i], g->data};
    pp_parallel_elems(fp->numel[i], PP_GRAIN_ELEMS, acc_piece, &j);
    return PP_OK;
}

pp_status pp_flat_params_set(pp_flat_params *fp, int i, const pp_tensor *src) {
    PP_TRY(check_src(fp, i, src, "value"));
    memcpy(fp->data + fp->offset[i], src->data, sizeof(float) * (size_t)fp->numel[i]);
    return PP_OK;
}

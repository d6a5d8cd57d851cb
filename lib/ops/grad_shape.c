/* Gradient helper ops for broadcasting, reductions and data movement:
 * SumToShape, ExpandReduced, SliceGrad, GatherGrad, SplitLike. Target shapes
 * arrive as 1-D int64 tensors computed at run time, because the batch
 * dimension is dynamic. */
#include <stdlib.h>
#include <string.h>

#include "broadcast.h"
#include "grad_kernels.h"

#include "status_internal.h"
/* ------------------------------------------------------------------------ */
/* SumToShape(grad, shape): undo numpy broadcasting by summing. */

/* acc[output index] += grad over runs len[0..n) of kept (red 0) or summed
 * (red 1) dims; n == 0 means a single element. */
PP_VEC_CLONES static void sum_runs(int n, const int64_t *len, const int *red,
                                   const float *restrict src, int64_t gn, double *restrict acc) {
    if (n == 0) {
        acc[0] += src[0];
        return;
    }
    /* Output strides of the runs (0 for summed runs). */
    int64_t ost[PP_MAX_DIMS], idx[PP_MAX_DIMS] = {0}, st = 1;
    for (int k = n - 1; k >= 0; k--) {
        ost[k] = red[k] ? 0 : st;
        if (!red[k]) st *= len[k];
    }
    int64_t inner = len[n - 1], o = 0;
    for (int64_t base = 0; base < gn; base += inner) {
        const float *restrict row = src + base;
        if (red[n - 1]) {
            acc[o] += pp_grad_vsum(row, inner);
        } else {
            double *restrict dst = acc + o;
            PP_VFOR(i, inner, dst[i] += (double)row[i];);
        }
        for (int k = n - 2; k >= 0; k--) { /* odometer over the outer runs */
            o += ost[k];
            if (++idx[k] < len[k]) break;
            o -= ost[k] * len[k];
            idx[k] = 0;
        }
    }
}

pp_status pp_grad_sum_to_shape_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "grad"));
    int rt;
    int64_t ts[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 1, &rt, ts));
    const pp_tensor *g = ctx->in[0];
    if (pp_shape_equal(g->ndim, g->shape, rt, ts)) {
        ctx->out[0] = pp_tensor_retain(ctx->in[0]);
        return PP_OK;
    }
    int rg = g->ndim;
    char a[128], b[128];
    if (rt > rg) goto bad;
    /* Merge grad dims into runs that are all kept or all summed. */
    int n = 0;
    int64_t len[PP_MAX_DIMS];
    int red[PP_MAX_DIMS];
    for (int d = 0; d < rg; d++) {
        int j = d - (rg - rt);
        int r;
        if (j < 0) r = 1;
        else if (ts[j] == g->shape[d]) r = 0;
        else if (ts[j] == 1) r = 1;
        else goto bad;
        if (g->shape[d] == 1) continue; /* neutral either way */
        if (n > 0 && red[n - 1] == r) {
            len[n - 1] *= g->shape[d];
        } else {
            len[n] = g->shape[d];
            red[n++] = r;
        }
    }
    int64_t on = pp_shape_numel(rt, ts), gn = pp_tensor_numel(g);
    double *acc = calloc((size_t)(on ? on : 1), sizeof *acc);
    if (!acc) return pp_error(PP_ERR_NOMEM, "out of memory");
    if (gn > 0) sum_runs(n, len, red, g->data, gn, acc);
    /* A bias's gradient adds straight into its place in the flat gradient
     * buffer when the executor offers one: the same bits as the sum made
     * alone and then added there, without the tensor. */
    float *into = pp_grad_k_target(ctx, 0, on);
    if (into) {
        for (int64_t i = 0; i < on; i++) into[i] += (float)acc[i];
        free(acc);
        return PP_OK;
    }
    pp_tensor *out;
    pp_status s = pp_tensor_empty(PP_F32, rt, ts, &out);
    if (s == PP_OK) {
        float *dst = out->data;
        for (int64_t i = 0; i < on; i++) dst[i] = (float)acc[i];
        ctx->out[0] = out;
    }
    free(acc);
    return s;
bad:
    return pp_kernel_error(ctx, PP_ERR_SHAPE, "gradient %s cannot be summed to shape %s",
                           pp_shape_str(g->ndim, g->shape, a, sizeof a),
                           pp_shape_str(rt, ts, b, sizeof b));
}

/* ------------------------------------------------------------------------ */
/* ExpandReduced(dy, shape_x[, axes]): the gradient of ReduceSum/ReduceMean. */

pp_status pp_grad_expand_reduced_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    int r;
    int64_t xs[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 1, &r, xs));
    const pp_node *n = ctx->node;
    const pp_tensor *at = ctx->n_in > 2 ? ctx->in[2] : NULL;
    const int64_t *attr_axes = NULL;
    int n_attr = pp_node_attr_ints(n, "axes", &attr_axes);
    int given = at ? (int)pp_tensor_numel(at) : (n_attr > 0 ? n_attr : 0);
    if (given > PP_MAX_DIMS) return pp_kernel_error(ctx, PP_ERR_INVALID, "too many axes");
    uint8_t reduced[PP_MAX_DIMS] = {0};
    for (int i = 0; i < given; i++) {
        int64_t a = at ? pp_tensor_get_i64(at, i) : attr_axes[i];
        if (a < 0) a += r;
        if (a < 0 || a >= r) return pp_kernel_error(ctx, PP_ERR_INVALID, "axis out of range");
        reduced[a] = 1;
    }
    if (given == 0) {
        if (pp_node_attr_int(n, "noop_with_empty_axes", 0)) {
            /* The forward was an identity. */
            pp_tensor *v;
            PP_TRY(pp_tensor_view(ctx->in[0], r, xs, &v));
            ctx->out[0] = v;
            return PP_OK;
        }
        for (int d = 0; d < r; d++) reduced[d] = 1;
    }
    int64_t kept[PP_MAX_DIMS], count = 1;
    for (int d = 0; d < r; d++) {
        kept[d] = reduced[d] ? 1 : xs[d];
        if (reduced[d]) count *= xs[d];
    }
    if (pp_tensor_numel(ctx->in[0]) != pp_shape_numel(r, kept))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy does not match the reduced shape");
    pp_tensor *view, *out;
    PP_TRY(pp_tensor_view(ctx->in[0], r, kept, &view));
    pp_status s = pp_broadcast_to(view, r, xs, &out);
    pp_tensor_free(view);
    PP_TRY(s);
    if (pp_node_attr_int(n, "mean", 0) && count > 0) {
        /* Divide (not multiply by 1/count), as torch's mean backward does. */
        float c = (float)count, *o = out->data;
        int64_t on = pp_tensor_numel(out);
        for (int64_t i = 0; i < on; i++) o[i] /= c;
    }
    ctx->out[0] = out;
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* SliceGrad(dy, shape_x, starts, ends[, axes[, steps]]): zeros with dy
 * written where Slice read. Index rules are ONNX Slice's. */

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

pp_status pp_grad_slice_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    int r;
    int64_t xs[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 1, &r, xs));
    const pp_tensor *st = ctx->in[2], *en = ctx->in[3];
    const pp_tensor *ax = ctx->n_in > 4 ? ctx->in[4] : NULL;
    const pp_tensor *sp = ctx->n_in > 5 ? ctx->in[5] : NULL;
    int64_t k = pp_tensor_numel(st);
    if (pp_tensor_numel(en) != k || (ax && pp_tensor_numel(ax) != k) ||
        (sp && pp_tensor_numel(sp) != k))
        return pp_kernel_error(ctx, PP_ERR_INVALID, "starts, ends, axes, steps differ in length");
    int64_t start[PP_MAX_DIMS], step[PP_MAX_DIMS], cnt[PP_MAX_DIMS];
    for (int d = 0; d < r; d++) {
        start[d] = 0;
        step[d] = 1;
        cnt[d] = xs[d];
    }
    for (int64_t i = 0; i < k; i++) {
        int64_t a = ax ? pp_tensor_get_i64(ax, i) : i;
        if (a < 0) a += r;
        if (a < 0 || a >= r) return pp_kernel_error(ctx, PP_ERR_INVALID, "axis out of range");
        int64_t dim = xs[a], s = pp_tensor_get_i64(st, i), e = pp_tensor_get_i64(en, i);
        int64_t p = sp ? pp_tensor_get_i64(sp, i) : 1;
        if (p == 0) return pp_kernel_error(ctx, PP_ERR_INVALID, "step 0");
        if (s < 0) s += dim;
        if (e < 0) e += dim;
        int64_t c;
        if (p > 0) {
            s = clamp64(s, 0, dim);
            e = clamp64(e, 0, dim);
            c = e > s ? (e - s - 1) / p + 1 : 0; /* no overflow for huge steps */
        } else {
            s = clamp64(s, 0, dim - 1);
            e = clamp64(e, -1, dim - 1);
            c = s > e ? (s - e - 1) / (p == INT64_MIN ? INT64_MAX : -p) + 1 : 0;
        }
        start[a] = s;
        step[a] = c > 1 ? p : 1; /* one element: the step never moves, and p*stride may overflow */
        cnt[a] = c;
    }
    const pp_tensor *dy = ctx->in[0];
    if (pp_tensor_numel(dy) != pp_shape_numel(r, cnt))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy does not match the slice");
    pp_tensor *out;
    PP_TRY(pp_tensor_new(PP_F32, r, xs, &out));
    int64_t n = pp_tensor_numel(dy);
    if (n > 0 && r == 0) ((float *)out->data)[0] = ((const float *)dy->data)[0];
    if (n > 0 && r > 0) {
        int64_t xst[PP_MAX_DIMS], idx[PP_MAX_DIMS] = {0}, off = 0;
        xst[r - 1] = 1;
        for (int d = r - 2; d >= 0; d--) xst[d] = xst[d + 1] * xs[d + 1];
        for (int d = 0; d < r; d++) off += start[d] * xst[d];
        const float *src = dy->data;
        float *dst = out->data;
        int64_t inner = cnt[r - 1], istep = step[r - 1];
        for (int64_t base = 0; base < n; base += inner) {
            if (istep == 1) memcpy(dst + off, src + base, (size_t)inner * sizeof(float));
            else
                for (int64_t i = 0; i < inner; i++) dst[off + i * istep] = src[base + i];
            for (int d = r - 2; d >= 0; d--) {
                off += step[d] * xst[d];
                if (++idx[d] < cnt[d]) break;
                off -= step[d] * xst[d] * cnt[d];
                idx[d] = 0;
            }
        }
    }
    ctx->out[0] = out;
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* GatherGrad(dy, indices, shape_data): scatter-add of dy rows (embeddings). */

/* GatherGrad into the place the executor offers (an embedding's part of
 * the flat gradient buffer): no zeroed [dim, inner] tensor per microbatch
 * and no pass adding it there. The bits stay those of that tensor added
 * to the place: each picked row's dy rows are summed from +0 in pick order
 * in a scratch row, which is then added once. next chains a row's picks.
 * 0: the place does not fit (or no memory): the caller makes the tensor. */
static int gather_grad_into(pp_kernel_ctx *ctx, const pp_tensor *ix, int64_t outer, int64_t dim, int64_t inner) {
    int64_t ni = pp_tensor_numel(ix);
    int64_t *last = malloc(sizeof *last * (size_t)(dim + 1)), *next = malloc(sizeof *next * (size_t)(ni + 1));
    float *row = malloc(sizeof *row * (size_t)(inner + 1));
    uint8_t *first = malloc((size_t)(ni + 1));
    float *into = last && next && row && first ? pp_grad_k_target(ctx, 0, outer * dim * inner) : NULL;
    if (into) {
        for (int64_t d = 0; d < dim; d++) last[d] = -1;
        for (int64_t j = 0; j < ni; j++) {
            int64_t id = pp_tensor_get_i64(ix, j);
            if (id < 0) id += dim;
            next[j] = -1;
            first[j] = last[id] < 0;
            if (!first[j]) next[last[id]] = j;
            last[id] = j;
        }
        const float *src = ctx->in[0]->data;
        for (int64_t j = 0; j < ni; j++) {
            if (!first[j]) continue;
            int64_t id = pp_tensor_get_i64(ix, j);
            if (id < 0) id += dim;
            for (int64_t o = 0; o < outer; o++) {
                for (int64_t i = 0; i < inner; i++) row[i] = 0.0f;
                for (int64_t k = j; k >= 0; k = next[k]) {
                    const float *restrict s = src + (o * ni + k) * inner;
                    for (int64_t i = 0; i < inner; i++) row[i] += s[i];
                }
                float *restrict d = into + (o * dim + id) * inner;
                for (int64_t i = 0; i < inner; i++) d[i] += row[i];
            }
        }
    }
    free(last);
    free(next);
    free(row);
    free(first);
    return into != NULL;
}

pp_status pp_grad_gather_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    int r;
    int64_t ds[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 2, &r, ds));
    const pp_tensor *ix = ctx->in[1];
    if (!ix || (ix->dtype != PP_I64 && ix->dtype != PP_I32))
        return pp_kernel_error(ctx, PP_ERR_INVALID, "indices must be int32 or int64");
    int64_t axis = pp_node_attr_int(ctx->node, "axis", 0);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r) return pp_kernel_error(ctx, PP_ERR_INVALID, "axis out of range");
    int64_t outer = pp_shape_numel((int)axis, ds), dim = ds[axis];
    int64_t inner = pp_shape_numel(r - (int)axis - 1, ds + axis + 1);
    int64_t ni = pp_tensor_numel(ix);
    if (pp_tensor_numel(ctx->in[0]) != outer * ni * inner)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy does not match indices and data shape");
    for (int64_t j = 0; j < ni; j++) { /* all checked before anything is added into a place */
        int64_t id = pp_tensor_get_i64(ix, j);
        if (id < -dim || id >= dim)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "index %lld out of range [0,%lld)", (long long)id,
                                   (long long)dim);
    }
    if (ctx->into && ctx->into[0] && gather_grad_into(ctx, ix, outer, dim, inner)) return PP_OK;
    pp_tensor *out;
    PP_TRY(pp_tensor_new(PP_F32, r, ds, &out));
    const float *src = ctx->in[0]->data;
    float *dst = out->data;
    for (int64_t j = 0; j < ni; j++) {
        int64_t id = ix->dtype == PP_I64 ? ((const int64_t *)ix->data)[j]
                                         : ((const int32_t *)ix->data)[j];
        if (id < 0) id += dim;
        for (int64_t o = 0; o < outer; o++) {
            float *restrict d = dst + (o * dim + id) * inner;
            const float *restrict s = src + (o * ni + j) * inner;
            for (int64_t i = 0; i < inner; i++) d[i] += s[i];
        }
    }
    ctx->out[0] = out;
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* SplitLike(dy, shape_0, ..., shape_n-1): the gradient of Concat. */

pp_status pp_grad_split_like_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    const pp_tensor *dy = ctx->in[0];
    int np = ctx->n_in - 1, r = dy->ndim;
    if (np != ctx->n_out)
        return pp_kernel_error(ctx, PP_ERR_INVALID, "needs one shape per output");
    int64_t axis = pp_node_attr_int(ctx->node, "axis", 0);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r) return pp_kernel_error(ctx, PP_ERR_INVALID, "axis out of range");
    int64_t outer = pp_shape_numel((int)axis, dy->shape);
    int64_t inner = pp_shape_numel(r - (int)axis - 1, dy->shape + axis + 1);
    int64_t off = 0;
    for (int i = 0; i < np; i++) {
        int ri;
        int64_t s[PP_MAX_DIMS];
        PP_TRY(pp_grad_k_shape(ctx, i + 1, &ri, s));
        if (ri != r) return pp_kernel_error(ctx, PP_ERR_SHAPE, "piece %d has another rank", i);
        int64_t len = s[axis];
        if (off + len > dy->shape[axis])
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "pieces exceed dy along the axis");
        if (ctx->node->out[i] >= 0) {
            pp_tensor *o;
            PP_TRY(pp_tensor_empty(PP_F32, r, s, &o));
            const float *src = dy->data;
            float *dst = o->data;
            size_t chunk = (size_t)(len * inner) * sizeof(float);
            for (int64_t q = 0; q < outer && chunk; q++)
                memcpy(dst + q * len * inner, src + (q * dy->shape[axis] + off) * inner, chunk);
            ctx->out[i] = o;
        }
        off += len;
    }
    if (off != dy->shape[axis])
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "pieces do not cover dy along the axis");
    return PP_OK;
}

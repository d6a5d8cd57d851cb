/* Gradient helper ops for the layers: MatMul (input and weight halves kept
 * apart for the I/W split), Softmax, LogSoftmax, LayerNormalization (input
 * half and weight half) and SoftmaxCrossEntropyLoss. Statistics the forward
 * computed (softmax of the scores, LayerNorm mean and 1/std) are recomputed
 * from the stashed input: cheaper than keeping them per microbatch. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "grad_kernels.h"

#include "status_internal.h"
#include "thread_pool.h"
/* ------------------------------------------------------------------------ */
/* MatMul: y = a @ b with numpy batch broadcasting and 1-D promotion. */

typedef struct mm_plan {
    int64_t M, K, N, P;            /* P: number of output batch matrices */
    int nb;                        /* output batch rank */
    int64_t by[PP_MAX_DIMS];       /* output batch dims */
    int64_t sa[PP_MAX_DIMS], sb[PP_MAX_DIMS]; /* batch strides (in matrices), 0 = broadcast */
    int64_t Pa, Pb;                /* matrices in a and b */
} mm_plan;

static pp_status mm_plan_make(const pp_kernel_ctx *ctx, int ra, const int64_t *as, int rb,
                              const int64_t *bs, mm_plan *p) {
    if (ra < 1 || rb < 1) return pp_kernel_error(ctx, PP_ERR_SHAPE, "MatMul of a scalar");
    int64_t K2;
    p->M = ra == 1 ? 1 : as[ra - 2];
    p->K = as[ra - 1];
    K2 = rb == 1 ? bs[0] : bs[rb - 2];
    p->N = rb == 1 ? 1 : bs[rb - 1];
    if (p->K != K2) return pp_kernel_error(ctx, PP_ERR_SHAPE, "inner dimensions differ");
    int na = ra > 2 ? ra - 2 : 0, nbb = rb > 2 ? rb - 2 : 0;
    p->nb = na > nbb ? na : nbb;
    int64_t st_a = 1, st_b = 1;
    p->P = 1;
    for (int d = p->nb - 1; d >= 0; d--) {
        int ja = d - (p->nb - na), jb = d - (p->nb - nbb);
        int64_t da = ja >= 0 ? as[ja] : 1, db = jb >= 0 ? bs[jb] : 1;
        if (da != db && da != 1 && db != 1)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "batch dimensions do not broadcast");
        p->by[d] = da > db ? da : db;
        if (da == 0 || db == 0) p->by[d] = 0;
        p->sa[d] = da == 1 ? 0 : st_a;
        p->sb[d] = db == 1 ? 0 : st_b;
        st_a *= da;
        st_b *= db;
        p->P *= p->by[d];
    }
    p->Pa = st_a;
    p->Pb = st_b;
    if (p->M > INT_MAX || p->N > INT_MAX || p->K > INT_MAX || p->P * p->M > INT_MAX)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "matrix too large for BLAS");
    return PP_OK;
}

/* Matrix offsets into a and b of output batch matrix q (row-major walk). */
static void mm_offsets(const mm_plan *p, int64_t q, int64_t *oa, int64_t *ob) {
    int64_t a = 0, b = 0;
    for (int d = p->nb - 1; d >= 0; d--) {
        int64_t i = q % p->by[d];
        q /= p->by[d];
        a += i * p->sa[d];
        b += i * p->sb[d];
    }
    *oa = a;
    *ob = b;
}

/* Products [lo, hi) of a MatMul gradient (mm_grad below). */
#define MM_GRAIN_MACS (INT64_C(1) << 17) /* a piece's work worth a wake-up */

typedef struct mm_grad_job {
    const mm_plan *p;
    const float *g, *o;
    float *r;
    int want_a, wt, tall;
    float tall_beta; /* 0: a tall product writes its result; 1: adds it into a target */
} mm_grad_job;

static void mm_grad_piece(void *arg, int64_t lo, int64_t hi) {
    const mm_grad_job *j = arg;
    const mm_plan *p = j->p;
    int M = (int)p->M, N = (int)p->N, K = (int)p->K;
    int rows = j->tall ? (int)(p->P * p->M) : M;
    const float *o = j->o;
    float *r = j->r;
    float beta = j->tall ? j->tall_beta : 1.0f; /* a tall product writes its result whole, or adds it */
    for (int64_t q = lo; q < hi; q++) {
        int64_t qa = 0, qb = 0;
        if (!j->tall) mm_offsets(p, q, &qa, &qb);
        const float *gq = j->g + q * p->M * p->N;
        if (j->want_a && j->wt) /* da = dy W */
            pp_gemm_f32(0, 0, rows, K, N, 1.0f, gq, N, o, K, 0.0f, r, K);
        else if (j->want_a)
            pp_gemm_f32(0, 1, rows, K, N, 1.0f, gq, N, o + qb * p->K * p->N, N, beta, r + qa * p->M * p->K, K);
        else if (j->wt) /* dW = dy^T a */
            pp_gemm_f32(1, 0, N, K, rows, 1.0f, gq, N, o, K, beta, r, K);
        else
            pp_gemm_f32(1, 0, K, N, rows, 1.0f, o + qa * p->M * p->K, K, gq, N, beta, r + qb * p->K * p->N, N);
    }
}

/* MatMulGradA(dy, b, shape_a) -> da = dy b^T and MatMulGradB(dy, a, shape_b)
 * -> db = a^T dy. With weight_t = 1, b is W^T for a 2-D W and the node
 * reads (GradA) or writes (GradB) W itself: no transposed copy is kept for
 * the backward and no Transpose runs on the gradient. */
static pp_status mm_grad(pp_kernel_ctx *ctx, int want_a) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, want_a ? "b" : "a"));
    const pp_tensor *dy = ctx->in[0], *other = ctx->in[1];
    int rs, wt = pp_node_attr_int(ctx->node, "weight_t", 0) != 0;
    int64_t ss[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 2, &rs, ss));
    const int64_t *w = want_a ? other->shape : ss;
    if (wt && (want_a ? other->ndim : rs) != 2)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "weight_t needs a 2-D weight");
    int64_t bt[2] = {wt ? w[1] : 0, wt ? w[0] : 0}; /* b's shape when b = W^T */
    mm_plan p;
    if (want_a) PP_TRY(mm_plan_make(ctx, rs, ss, other->ndim, wt ? bt : other->shape, &p));
    else PP_TRY(mm_plan_make(ctx, other->ndim, other->shape, rs, wt ? bt : ss, &p));
    if (pp_tensor_numel(dy) != p.P * p.M * p.N)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy does not match the product's shape");
    /* One tall product writes every element (beta 0): no zeroing first.
     * Several add into a zeroed result (beta 1). */
    int tall = p.Pb == 1 && p.Pa == p.P;
    int empty = p.P == 0 || p.M == 0 || p.N == 0 || p.K == 0;
    /* A weight's gradient as one tall product adds straight into its place
     * when the executor offers one (pp_exec_set_target_hook): beta 1 into
     * the flat gradient buffer, no tensor and no pass adding it there. */
    pp_tensor *into = !want_a && tall && !empty && ctx->into ? ctx->into[0] : NULL;
    if (into && (into->dtype != PP_F32 || pp_tensor_numel(into) != pp_shape_numel(rs, ss))) into = NULL;
    pp_tensor *out = NULL;
    if (into) *ctx->added |= 1;
    else if (tall && !empty) PP_TRY(pp_tensor_empty(PP_F32, rs, ss, &out));
    else PP_TRY(pp_tensor_new(PP_F32, rs, ss, &out));
    ctx->out[0] = out;
    if (empty) return PP_OK;
    /* Each product is summed over the batch dims its operand was broadcast
     * along (gemm with beta 1 into a zeroed result). When b has no batch
     * dims (a linear layer's weight) and a is not broadcast, the whole batch
     * is one tall gemm; a 2-D b always is. Without broadcasting every
     * product writes its own matrix, so the products spread over the pool
     * (attention's per-head products). */
    mm_grad_job j = {&p, dy->data, other->data, into ? into->data : out->data, want_a, wt, tall, into ? 1.0f : 0.0f};
    int64_t n_prod = tall ? 1 : p.P, macs = p.M * p.N * p.K;
    if (!tall && p.Pa == p.P && p.Pb == p.P)
        pp_parallel_for(n_prod, macs < MM_GRAIN_MACS ? MM_GRAIN_MACS / macs : 1, mm_grad_piece, &j);
    else
        mm_grad_piece(&j, 0, n_prod);
    return PP_OK;
}

pp_status pp_grad_matmul_a_run(pp_kernel_ctx *ctx) { return mm_grad(ctx, 1); }
pp_status pp_grad_matmul_b_run(pp_kernel_ctx *ctx) { return mm_grad(ctx, 0); }

/* ------------------------------------------------------------------------ */
/* Softmax and LogSoftmax along one axis (or, with coerce2d = 1, over all
 * dims from axis on, as opset < 13 defines them). */

typedef struct axis_split {
    int64_t outer, n, inner;
} axis_split;

static pp_status split_at_axis(const pp_kernel_ctx *ctx, const pp_tensor *t, axis_split *s) {
    int r = t->ndim;
    s->outer = s->n = s->inner = 1;
    int64_t axis = pp_node_attr_int(ctx->node, "axis", -1);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= (r ? r : 1))
        return pp_kernel_error(ctx, PP_ERR_INVALID, "axis out of range");
    if (r == 0) return PP_OK;
    s->outer = pp_shape_numel((int)axis, t->shape);
    if (pp_node_attr_int(ctx->node, "coerce2d", 0)) {
        s->n = pp_shape_numel(r - (int)axis, t->shape + axis);
        s->inner = 1;
    } else {
        s->n = t->shape[axis];
        s->inner = pp_shape_numel(r - (int)axis - 1, t->shape + axis + 1);
    }
    return PP_OK;
}

/* Contiguous rows (the softmax axis is the last one). */
PP_VEC_CLONES static void softmax_grad_rows(int64_t rows, int64_t n, int log,
                                            const float *restrict g, const float *restrict y,
                                            float *restrict dx) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict gr = g + r * n, *restrict yr = y + r * n;
        float *restrict dr = dx + r * n;
        if (log) {
            float sum = pp_grad_vsum(gr, n);
            PP_VFOR(i, n, dr[i] = gr[i] - pp_vexpf(yr[i]) * sum;);
        } else {
            float sum = pp_grad_vdot(gr, yr, n);
            PP_VFOR(i, n, dr[i] = yr[i] * (gr[i] - sum););
        }
    }
}

typedef struct sm_grad_job {
    int64_t n;
    int log;
    const float *g, *y;
    float *dx;
} sm_grad_job;

static void sm_grad_piece(void *arg, int64_t lo, int64_t hi) {
    const sm_grad_job *j = arg;
    softmax_grad_rows(hi - lo, j->n, j->log, j->g + lo * j->n, j->y + lo * j->n, j->dx + lo * j->n);
}

static pp_status softmax_like_grad(pp_kernel_ctx *ctx, int log) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "y"));
    const pp_tensor *dy = ctx->in[0], *y = ctx->in[1];
    if (!pp_shape_equal(dy->ndim, dy->shape, y->ndim, y->shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy and y differ in shape");
    axis_split s;
    PP_TRY(split_at_axis(ctx, y, &s));
    pp_tensor *out;
    PP_TRY(pp_tensor_empty(PP_F32, y->ndim, y->shape, &out));
    const float *g = dy->data, *v = y->data;
    float *dx = out->data;
    ctx->out[0] = out;
    if (s.inner == 1) {
        sm_grad_job j = {s.n, log, g, v, dx};
        pp_parallel_for(s.outer, pp_grain_rows(s.n, PP_GRAIN_ROW_ELEMS), sm_grad_piece, &j);
        return PP_OK;
    }
    for (int64_t o = 0; o < s.outer; o++)
        for (int64_t k = 0; k < s.inner; k++) {
            int64_t base = o * s.n * s.inner + k, st = s.inner;
            float sum = 0;
            for (int64_t i = 0; i < s.n; i++)
                sum += log ? g[base + i * st] : g[base + i * st] * v[base + i * st];
            for (int64_t i = 0; i < s.n; i++) {
                int64_t j = base + i * st;
                dx[j] = log ? g[j] - expf(v[j]) * sum : v[j] * (g[j] - sum);
            }
        }
    return PP_OK;
}

pp_status pp_grad_softmax_run(pp_kernel_ctx *ctx) { return softmax_like_grad(ctx, 0); }
pp_status pp_grad_log_softmax_run(pp_kernel_ctx *ctx) { return softmax_like_grad(ctx, 1); }

/* ------------------------------------------------------------------------ */
/* LayerNormalization: rows of n elements normalised over dims axis.. */

static pp_status ln_rows(const pp_kernel_ctx *ctx, const pp_tensor *x, int64_t *rows, int64_t *n,
                         int *axis) {
    int64_t a = pp_node_attr_int(ctx->node, "axis", -1);
    if (a < 0) a += x->ndim;
    if (a < 0 || a >= x->ndim) return pp_kernel_error(ctx, PP_ERR_INVALID, "axis out of range");
    *axis = (int)a;
    *rows = pp_shape_numel((int)a, x->shape);
    *n = pp_shape_numel(x->ndim - (int)a, x->shape + a);
    return PP_OK;
}

/* Mean and 1/sqrt(var + eps) of one row, as the forward computes them. */
PP_VINLINE void ln_stats(const float *restrict x, int64_t n, float eps, float *mean, float *rstd) {
    float m = n ? pp_grad_vsum(x, n) / (float)n : 0.0f;
    float var = n ? pp_grad_vsqdev(x, m, n) / (float)n : 0.0f;
    *mean = m;
    *rstd = 1.0f / sqrtf(var + eps);
}

static pp_status ln_inputs(pp_kernel_ctx *ctx, int64_t *rows, int64_t *n, int *axis) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "x"));
    const pp_tensor *dy = ctx->in[0], *x = ctx->in[1];
    if (!pp_shape_equal(dy->ndim, dy->shape, x->ndim, x->shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy and x differ in shape");
    return ln_rows(ctx, x, rows, n, axis);
}

/* dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = dy * scale */
PP_VEC_CLONES static void ln_input_rows(int64_t rows, int64_t n, float eps, const float *restrict g,
                                        const float *restrict x, const float *restrict w,
                                        float *restrict dx) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * n, *restrict gr = g + r * n;
        float *restrict dr = dx + r * n;
        float mean, rstd;
        ln_stats(xr, n, eps, &mean, &rstd);
        float la[PP_VEC_BLOCK] = {0}, lb[PP_VEC_BLOCK] = {0}, a = 0, b = 0;
        int64_t i = 0;
        for (; i + PP_VEC_BLOCK <= n; i += PP_VEC_BLOCK)
            for (int j = 0; j < PP_VEC_BLOCK; j++) {
                float gw = gr[i + j] * w[i + j];
                la[j] += gw;
                lb[j] += gw * ((xr[i + j] - mean) * rstd);
            }
        for (int j = 0; j < PP_VEC_BLOCK; j++) {
            a += la[j];
            b += lb[j];
        }
        for (; i < n; i++) {
            float gw = gr[i] * w[i];
            a += gw;
            b += gw * ((xr[i] - mean) * rstd);
        }
        float ma = a / (float)n, mb = b / (float)n;
        PP_VFOR(k, n, dr[k] = rstd * (gr[k] * w[k] - ma - ((xr[k] - mean) * rstd) * mb););
    }
}

typedef struct ln_in_job {
    int64_t n;
    float eps;
    const float *g, *x, *w;
    float *dx;
} ln_in_job;

static void ln_in_piece(void *arg, int64_t lo, int64_t hi) {
    const ln_in_job *j = arg;
    ln_input_rows(hi - lo, j->n, j->eps, j->g + lo * j->n, j->x + lo * j->n, j->w, j->dx + lo * j->n);
}

pp_status pp_grad_layer_norm_input_run(pp_kernel_ctx *ctx) {
    int64_t rows, n;
    int axis;
    PP_TRY(ln_inputs(ctx, &rows, &n, &axis));
    PP_TRY(pp_grad_k_f32(ctx, 2, "scale"));
    if (pp_tensor_numel(ctx->in[2]) != n)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "scale does not match the normalised shape");
    const pp_tensor *x = ctx->in[1];
    pp_tensor *out;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, x->shape, &out));
    ln_in_job j = {n, pp_node_attr_float(ctx->node, "epsilon", 1e-5f), ctx->in[0]->data, x->data,
                   ctx->in[2]->data, out->data};
    pp_parallel_for(rows, pp_grain_rows(n, PP_GRAIN_ROW_ELEMS), ln_in_piece, &j);
    ctx->out[0] = out;
    return PP_OK;
}

/* Column sums over the rows, in double: dscale += dy * xhat, dbias += dy.
 * Two passes, each on the pool: every row's mean and 1/std (ln_stats, as
 * the forward computes them), then columns [c0, c1) summed over all rows in
 * row order, so each sum runs in the same order at any thread count. */
typedef struct ln_w_job {
    int64_t n;
    float eps;
    const float *g, *x;
    float *stats; /* mean, rstd per row */
    double *ds, *db;
    int64_t rows;
} ln_w_job;

PP_VEC_CLONES static void ln_stats_piece(void *arg, int64_t lo, int64_t hi) {
    const ln_w_job *j = arg;
    for (int64_t r = lo; r < hi; r++) ln_stats(j->x + r * j->n, j->n, j->eps, &j->stats[2 * r], &j->stats[2 * r + 1]);
}

PP_VEC_CLONES static void ln_cols_piece(void *arg, int64_t c0, int64_t c1) {
    const ln_w_job *j = arg;
    double *restrict ds = j->ds + c0, *restrict db = j->db + c0;
    for (int64_t r = 0; r < j->rows; r++) {
        const float *restrict xr = j->x + r * j->n + c0, *restrict gr = j->g + r * j->n + c0;
        float mean = j->stats[2 * r], rstd = j->stats[2 * r + 1];
        PP_VFOR(i, c1 - c0, ds[i] += (double)(gr[i] * ((xr[i] - mean) * rstd)); db[i] += (double)gr[i];);
    }
}

pp_status pp_grad_layer_norm_weight_run(pp_kernel_ctx *ctx) {
    int64_t rows, n;
    int axis;
    PP_TRY(ln_inputs(ctx, &rows, &n, &axis));
    const pp_tensor *x = ctx->in[1];
    double *acc = calloc((size_t)(2 * n + 1), sizeof *acc);
    float *stats = malloc((size_t)(2 * rows + 1) * sizeof *stats);
    if (!acc || !stats) {
        free(acc);
        free(stats);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    ln_w_job j = {n, pp_node_attr_float(ctx->node, "epsilon", 1e-5f), ctx->in[0]->data, x->data, stats, acc,
                  acc + n, rows};
    pp_parallel_for(rows, pp_grain_rows(n, PP_GRAIN_ROW_ELEMS), ln_stats_piece, &j);
    pp_parallel_elems(n, rows > 0 ? pp_grain_rows(rows, PP_GRAIN_ELEMS) : n, ln_cols_piece, &j);
    free(stats);
    pp_status s = PP_OK;
    for (int k = 0; k < 2 && s == PP_OK; k++) {
        if (k >= ctx->n_out || ctx->node->out[k] < 0) continue;
        /* Into the flat gradient buffer when offered: the bits of the
         * tensor added there, without it. */
        float *into = pp_grad_k_target(ctx, k, n);
        if (into) {
            for (int64_t i = 0; i < n; i++) into[i] += (float)acc[k * n + i];
            continue;
        }
        pp_tensor *o;
        s = pp_tensor_empty(PP_F32, x->ndim - axis, x->shape + axis, &o);
        if (s != PP_OK) break;
        float *d = o->data;
        for (int64_t i = 0; i < n; i++) d[i] = (float)acc[k * n + i];
        ctx->out[k] = o;
    }
    free(acc);
    return s;
}

/* ------------------------------------------------------------------------ */
/* SoftmaxCrossEntropyLoss: scores [N, C, d...], labels [N, d...]. */

/* d[c] = coef * softmax(s)[c] over one row (the label's -coef comes after). */
PP_VEC_CLONES static void sce_row(int64_t C, const float *restrict s, float coef,
                                  float *restrict d) {
    float mx = -INFINITY;
    for (int64_t c = 0; c < C; c++) mx = s[c] > mx ? s[c] : mx;
    PP_VFOR(c, C, d[c] = pp_vexpf(s[c] - mx););
    float k = coef / pp_grad_vsum(d, C);
    PP_VFOR(c, C, d[c] *= k;);
}

pp_status pp_grad_sce_loss_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dloss"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "scores"));
    const pp_tensor *dl = ctx->in[0], *sc = ctx->in[1], *lb = ctx->in[2];
    const pp_tensor *wt = ctx->n_in > 3 ? ctx->in[3] : NULL;
    if (wt) PP_TRY(pp_grad_k_f32(ctx, 3, "weights"));
    if (!lb || (lb->dtype != PP_I64 && lb->dtype != PP_I32))
        return pp_kernel_error(ctx, PP_ERR_INVALID, "labels must be int32 or int64");
    if (sc->ndim < 2) return pp_kernel_error(ctx, PP_ERR_SHAPE, "scores need rank >= 2");
    int64_t N = sc->shape[0], C = sc->shape[1];
    int64_t inner = pp_shape_numel(sc->ndim - 2, sc->shape + 2), rows = N * inner;
    if (pp_tensor_numel(lb) != rows)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "labels do not match the scores");
    if (wt && pp_tensor_numel(wt) != C)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "weights must have C entries");
    const char *red = pp_node_attr_string(ctx->node, "reduction", "mean");
    int mode = strcmp(red, "none") == 0 ? 0 : (strcmp(red, "sum") == 0 ? 1 : 2);
    if (mode == 2 && strcmp(red, "mean") != 0)
        return pp_kernel_error(ctx, PP_ERR_INVALID, "unknown reduction '%s'", red);
    if (pp_tensor_numel(dl) != (mode == 0 ? rows : 1))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dloss has the wrong size");
    int has_ignore = pp_node_attr(ctx->node, "ignore_index") != NULL;
    int64_t ignore = pp_node_attr_int(ctx->node, "ignore_index", 0);
    const float *w = wt ? wt->data : NULL;
    /* Mean divides by the summed weight of the rows not ignored. */
    double denom = 0;
    for (int64_t j = 0; j < rows; j++) {
        int64_t l = pp_tensor_get_i64(lb, j);
        if (has_ignore && l == ignore) continue;
        if (l < 0 || l >= C)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "label %lld out of range [0,%lld)",
                                   (long long)l, (long long)C);
        denom += w ? w[l] : 1.0;
    }
    pp_tensor *out;
    PP_TRY(pp_tensor_new(PP_F32, sc->ndim, sc->shape, &out));
    const float *s = sc->data, *g = dl->data;
    float *dx = out->data;
    for (int64_t j = 0; j < rows; j++) {
        int64_t l = pp_tensor_get_i64(lb, j);
        if (has_ignore && l == ignore) continue;
        int64_t nn = j / inner, k = j % inner, base = nn * C * inner + k;
        float coef = mode == 0 ? g[j] : (mode == 1 ? g[0] : (float)(g[0] / denom));
        if (w) coef *= w[l];
        if (inner == 1) { /* contiguous class scores */
            const float *restrict sr = s + base;
            float *restrict dr = dx + base;
            sce_row(C, sr, coef, dr);
        } else {
            float mx = -INFINITY;
            for (int64_t c = 0; c < C; c++) mx = fmaxf(mx, s[base + c * inner]);
            double z = 0;
            for (int64_t c = 0; c < C; c++) {
                float e = expf(s[base + c * inner] - mx);
                dx[base + c * inner] = e;
                z += e;
            }
            float inv = (float)(1.0 / z);
            for (int64_t c = 0; c < C; c++) dx[base + c * inner] *= inv * coef;
        }
        dx[base + l * inner] -= coef;
    }
    ctx->out[0] = out;
    return PP_OK;
}

/* The per-element and per-row arithmetic and indexing of the CUDA kernels
 * (lib/cuda/kernels.cu), as __host__ __device__ inline functions: nvcc
 * builds them into the kernels, and the host C compiler builds them into
 * the cuda-host tests (test/cuda/), which run them over the same index
 * space on the CPU and compare with pippin's CPU kernels. A CUDA kernel is
 * then only "one thread per index: call the function here".
 *
 * float32 only, as the backend claims. No allocation, no errors: the
 * backend checks shapes before launching. */
#ifndef PIPPIN_CUDA_KERNEL_MATH_H
#define PIPPIN_CUDA_KERNEL_MATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define PP_HD __host__ __device__ __forceinline__
#else
#define PP_HD static inline
#endif

#define PP_KM_MAX_DIMS 8

/* ------------------------------------------------------- strided index */

/* Shape of the index space and the source strides per dim (0 where the
 * source is broadcast); passed to kernels by value. */
typedef struct pp_km_strides {
    int nd;
    int64_t shape[PP_KM_MAX_DIMS];
    int64_t stride[PP_KM_MAX_DIMS];
} pp_km_strides;

/* The source offset of flat (row-major) index i of the index space. */
PP_HD int64_t pp_km_offset(const pp_km_strides *s, int64_t i) {
    int64_t off = 0;
    for (int d = s->nd - 1; d >= 0; d--) {
        int64_t c = i % s->shape[d];
        i /= s->shape[d];
        off += c * s->stride[d];
    }
    return off;
}

/* Strides of an input of shape in[0..in_nd) read at each index of the
 * broadcast output shape out[0..nd) (numpy rules, aligned at the right).
 * Returns 0, or -1 when the shapes do not broadcast. */
PP_HD int pp_km_broadcast(int nd, const int64_t *out, int in_nd, const int64_t *in, pp_km_strides *s) {
    s->nd = nd;
    int64_t st = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int k = d - (nd - in_nd);
        int64_t dim = k >= 0 ? in[k] : 1;
        s->shape[d] = out[d];
        if (dim != 1 && dim != out[d]) return -1;
        s->stride[d] = dim == 1 ? 0 : st;
        st *= dim;
    }
    return 0;
}

/* Strides that read an input of shape in[0..nd) transposed by perm: output
 * dim d is input dim perm[d]. */
PP_HD void pp_km_transpose(int nd, const int64_t *in, const int64_t *perm, pp_km_strides *s) {
    int64_t in_stride[PP_KM_MAX_DIMS];
    int64_t st = 1;
    for (int d = nd - 1; d >= 0; d--) {
        in_stride[d] = st;
        st *= in[d];
    }
    s->nd = nd;
    for (int d = 0; d < nd; d++) {
        s->shape[d] = in[perm[d]];
        s->stride[d] = in_stride[perm[d]];
    }
}

/* Slice: output dims out[d] read input index start[d] + k * step[d];
 * the base offset goes in *base. */
PP_HD void pp_km_slice(int nd, const int64_t *in, const int64_t *out, const int64_t *start, const int64_t *step,
                       pp_km_strides *s, int64_t *base) {
    int64_t st = 1;
    *base = 0;
    s->nd = nd;
    for (int d = nd - 1; d >= 0; d--) {
        s->shape[d] = out[d];
        s->stride[d] = st * step[d];
        *base += start[d] * st;
        st *= in[d];
    }
}

/* Concat: element i of part k (outer x len x inner) goes to this offset of
 * the output (outer x total x inner), the part starting at axis_off. */
PP_HD int64_t pp_km_concat_dst(int64_t i, int64_t len, int64_t inner, int64_t total, int64_t axis_off) {
    int64_t in = i % inner, a = (i / inner) % len, o = i / (inner * len);
    return (o * total + axis_off + a) * inner + in;
}

/* Split: element i of part k (outer x len x inner) reads this offset of
 * the input (outer x total x inner), the part starting at axis_off: the
 * inverse of Concat's placement. */
PP_HD int64_t pp_km_split_src(int64_t i, int64_t len, int64_t inner, int64_t total, int64_t axis_off) {
    return pp_km_concat_dst(i, len, inner, total, axis_off);
}

/* ---------------------------------------------------------------- GEMMs */

/* One strided batched GEMM over row-major matrices:
 *   C[b] (M x N) = op(A[b]) op(B[b]),  b < batch,
 * op(A) M x K (A stored K x M when trans_a), op(B) K x N (B stored N x K
 * when trans_b); a stride of 0 repeats an operand over the batch. For the
 * matmul gradients, a_is_dy says which input is A (the other is B). */
typedef struct pp_km_gemm {
    int trans_a, trans_b, a_is_dy;
    int64_t M, N, K, batch;
    int64_t stride_a, stride_b, stride_c;
} pp_km_gemm;

/* pippin::MatMulGradA(dy, b, shape_a) = dy op(b)^T and MatMulGradB(dy, a,
 * shape_b) = a^T dy (lib/ops/grad_nn.c), each summed to the target shape
 * ts, as one GEMM: the batches match, or b is 2-D (the Linear case: dA
 * repeats b over the batch, dB is one GEMM over all the batch's rows).
 * weight_t = 1: b is W^T of a 2-D W [N, K] and the node reads (GradA) or
 * writes (GradB) W itself: dA = dy W, dW = dy^T a over all rows.
 * Returns 0, or -1 for what the CPU must do (other broadcasts, empty). */
PP_HD int pp_km_matmul_grad_plan(int want_a, int weight_t, int dy_nd, const int64_t *dy_shape, int o_nd,
                                 const int64_t *o_shape, int t_nd, const int64_t *ts, pp_km_gemm *g) {
    *g = (pp_km_gemm){0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (dy_nd < 2 || o_nd < 2 || t_nd < 2 || (weight_t && (want_a ? o_nd : t_nd) != 2)) return -1;
    int64_t n_dy = 1, n_o = 1, n_t = 1;
    for (int d = 0; d < dy_nd; d++) n_dy *= dy_shape[d];
    for (int d = 0; d < o_nd; d++) n_o *= o_shape[d];
    for (int d = 0; d < t_nd; d++) n_t *= ts[d];
    int64_t rows = dy_shape[dy_nd - 2], cols = dy_shape[dy_nd - 1];
    int64_t o_r = o_shape[o_nd - 2], o_c = o_shape[o_nd - 1];
    if (want_a) { /* dA [.., rows, N] = dy [.., rows, cols] op(b)^T */
        int64_t M = rows, K = cols, N = ts[t_nd - 1];
        if (!M || !N || !K || ts[t_nd - 2] != M) return -1;
        if (weight_t ? (o_r != K || o_c != N) : (o_r != N || o_c != K)) return -1; /* W [K, N]; b [.., N, K] */
        int64_t batch = n_dy / (M * K);
        if (n_t != batch * M * N || (o_nd != 2 && n_o != batch * N * K)) return -1;
        *g = (pp_km_gemm){0, !weight_t, 1, M, N, K, batch, M * K, o_nd == 2 ? 0 : N * K, M * N};
        return 0;
    }
    if (weight_t) { /* dW [cols, N] = dy^T [cols, all rows] a [all rows, N] */
        int64_t M = cols, N = ts[1], K = cols ? n_dy / cols : 0;
        if (!M || !N || !K || ts[0] != M || o_c != N || n_o != K * N) return -1;
        *g = (pp_km_gemm){1, 0, 1, M, N, K, 1, 0, 0, 0};
        return 0;
    }
    /* dB [.., M, cols] = a^T dy, a [.., rows, M] */
    int64_t M = ts[t_nd - 2], N = cols, K = rows;
    if (!M || !N || !K || ts[t_nd - 1] != N || o_r != K || o_c != M) return -1;
    int64_t batch = n_dy / (K * N);
    if (n_o != batch * K * M) return -1;
    if (n_t == batch * M * N) {
        *g = (pp_km_gemm){1, 0, 0, M, N, K, batch, K * M, K * N, M * N};
        return 0;
    }
    if (n_t != M * N) return -1;
    *g = (pp_km_gemm){1, 0, 0, M, N, batch * K, 1, 0, 0, 0}; /* summed over the batch: one GEMM over its rows */
    return 0;
}

/* The column-major BLAS call (cuBLAS's cublasSgemmStridedBatched) of a
 * row-major GEMM: C^T = op(B)^T op(A)^T, so B is the first operand. */
typedef struct pp_km_blas {
    int op_first, op_second; /* 1: transposed */
    int64_t m, n, k;
    int64_t ld_first, ld_second, ld_c;
    int64_t stride_first, stride_second, stride_c, batch;
} pp_km_blas;

PP_HD pp_km_blas pp_km_gemm_blas(const pp_km_gemm *g) {
    pp_km_blas b;
    b.op_first = g->trans_b;
    b.op_second = g->trans_a;
    b.m = g->N;
    b.n = g->M;
    b.k = g->K;
    b.ld_first = g->trans_b ? g->K : g->N;
    b.ld_second = g->trans_a ? g->M : g->K;
    b.ld_c = g->N;
    b.stride_first = g->stride_b;
    b.stride_second = g->stride_a;
    b.stride_c = g->stride_c;
    b.batch = g->batch;
    return b;
}

/* ------------------------------------------------------------ elementwise */

typedef enum pp_km_binop { PP_KM_ADD, PP_KM_SUB, PP_KM_MUL, PP_KM_DIV } pp_km_binop;

PP_HD float pp_km_binary(pp_km_binop op, float a, float b) {
    switch (op) {
    case PP_KM_ADD: return a + b;
    case PP_KM_SUB: return a - b;
    case PP_KM_MUL: return a * b;
    default: return a / b;
    }
}

typedef enum pp_km_unop {
    PP_KM_RELU, PP_KM_TANH, PP_KM_GELU, PP_KM_GELU_TANH, PP_KM_NEG, PP_KM_EXP, PP_KM_SQRT, PP_KM_SIGMOID
} pp_km_unop;

PP_HD float pp_km_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

PP_HD float pp_km_unary(pp_km_unop op, float x) {
    switch (op) {
    case PP_KM_RELU: return x < 0 ? 0.0f : x;
    case PP_KM_TANH: return tanhf(x);
    case PP_KM_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case PP_KM_GELU_TANH: return pp_km_gelu_tanh(x);
    case PP_KM_NEG: return -x;
    case PP_KM_EXP: return expf(x);
    case PP_KM_SQRT: return sqrtf(x);
    default: return 1.0f / (1.0f + expf(-x));
    }
}

/* dx from dy and t: t is the forward output y (Relu, Tanh) or input x (Gelu). */
typedef enum pp_km_gradop { PP_KM_RELU_GRAD, PP_KM_TANH_GRAD, PP_KM_GELU_GRAD, PP_KM_GELU_TANH_GRAD } pp_km_gradop;

PP_HD float pp_km_unary_grad(pp_km_gradop op, float g, float v) {
    switch (op) {
    case PP_KM_RELU_GRAD: return v > 0.0f ? g : 0.0f;
    case PP_KM_TANH_GRAD: return g * (1.0f - v * v);
    case PP_KM_GELU_GRAD: {
        float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
        float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
        return g * (cdf + v * pdf);
    }
    default: {
        const float k0 = 0.79788456080286536f, k1 = 0.044715f;
        float th = tanhf(k0 * (v + k1 * v * v * v));
        float du = k0 * (1.0f + 3.0f * k1 * v * v);
        return g * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
    }
    }
}

/* ------------------------------------------------------------------ rows */

/* Softmax of one row of n (the last axis). */
PP_HD void pp_km_softmax_row(const float *x, float *y, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    float s = 0;
    for (int64_t i = 0; i < n; i++) {
        y[i] = expf(x[i] - m);
        s += y[i];
    }
    float k = (float)(1.0 / (double)s);
    for (int64_t i = 0; i < n; i++) y[i] *= k;
}

/* dx = y * (dy - sum(dy * y)) over one row. */
PP_HD void pp_km_softmax_grad_row(const float *g, const float *y, float *dx, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += g[i] * y[i];
    for (int64_t i = 0; i < n; i++) dx[i] = y[i] * (g[i] - s);
}

/* A row's mean and 1/sqrt(var + eps), in double as the forward does. */
PP_HD void pp_km_ln_stats(const float *x, int64_t n, float eps, float *mean, float *rstd) {
    double s = 0, q = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    double m = n ? s / (double)n : 0.0;
    for (int64_t i = 0; i < n; i++) q += ((double)x[i] - m) * ((double)x[i] - m);
    double var = n ? q / (double)n : 0.0;
    *mean = (float)m;
    *rstd = (float)(1.0 / sqrt(var + (double)eps));
}

/* LayerNormalization over one row; w and b (b may be NULL) of n. */
PP_HD void pp_km_layernorm_row(const float *x, const float *w, const float *b, float eps, float *y, int64_t n,
                               float *mean_out, float *rstd_out) {
    float mean, rstd;
    pp_km_ln_stats(x, n, eps, &mean, &rstd);
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * rstd * w[i] + (b ? b[i] : 0.0f);
    if (mean_out) *mean_out = mean;
    if (rstd_out) *rstd_out = rstd;
}

/* The input half of LayerNorm's gradient over one row:
 * dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)). */
PP_HD void pp_km_ln_grad_input_row(const float *g, const float *x, const float *w, float eps, float *dx,
                                   int64_t n) {
    float mean, rstd;
    pp_km_ln_stats(x, n, eps, &mean, &rstd);
    float a = 0, b = 0;
    for (int64_t i = 0; i < n; i++) {
        float gw = g[i] * w[i];
        a += gw;
        b += gw * ((x[i] - mean) * rstd);
    }
    float ma = a / (float)n, mb = b / (float)n;
    for (int64_t i = 0; i < n; i++) dx[i] = rstd * (g[i] * w[i] - ma - ((x[i] - mean) * rstd) * mb);
}

/* The weight half, column c over all rows (stats: mean, rstd per row):
 * dscale[c] = sum dy * xhat, dbias[c] = sum dy, in double, row order. */
PP_HD void pp_km_ln_grad_weight_col(const float *g, const float *x, const float *stats, int64_t rows, int64_t n,
                                    int64_t c, float *dscale, float *dbias) {
    double ds = 0, db = 0;
    for (int64_t r = 0; r < rows; r++) {
        float gr = g[r * n + c];
        ds += (double)(gr * ((x[r * n + c] - stats[2 * r]) * stats[2 * r + 1]));
        db += (double)gr;
    }
    *dscale = (float)ds;
    *dbias = (float)db;
}

/* Sum over the middle axis of outer x len x inner, at (o, k). */
PP_HD float pp_km_reduce_sum(const float *x, int64_t len, int64_t inner, int64_t o, int64_t k) {
    double s = 0;
    for (int64_t l = 0; l < len; l++) s += x[(o * len + l) * inner + k];
    return (float)s;
}

/* ---------------------------------------------------- gather, embedding */

/* Gather along an axis of outer x axis_len x inner by n_idx indices: the
 * source offset of output element i (indices may be negative). */
PP_HD int64_t pp_km_gather_src(int64_t i, const int64_t *idx, int64_t n_idx, int64_t axis_len, int64_t inner) {
    int64_t in = i % inner, j = (i / inner) % n_idx, o = i / (inner * n_idx);
    int64_t r = idx[j] < 0 ? idx[j] + axis_len : idx[j];
    return (o * axis_len + r) * inner + in;
}

/* GatherGrad (the embedding gradient): dy element i (outer x n_idx x
 * inner) adds into this offset of the data's gradient (outer x axis_len x
 * inner). Adds to one row are serialised by the caller (atomicAdd on the
 * device, a loop on the host). */
PP_HD int64_t pp_km_gather_grad_dst(int64_t i, const int64_t *idx, int64_t n_idx, int64_t axis_len, int64_t inner) {
    return pp_km_gather_src(i, idx, n_idx, axis_len, inner);
}

/* ------------------------------------------------------- cross-entropy */

/* Row r's loss, -log softmax(s)[label], 0 for ignore_index. */
PP_HD float pp_km_sce_row_loss(const float *s, int64_t C, int64_t label, int64_t ignore_index) {
    if (label == ignore_index) return 0.0f;
    float m = -INFINITY;
    for (int64_t c = 0; c < C; c++) m = s[c] > m ? s[c] : m;
    double z = 0;
    for (int64_t c = 0; c < C; c++) z += exp((double)(s[c] - m));
    return (float)(-(double)(s[label] - m) + log(z));
}

/* Its gradient over the row: coef * (softmax(s) - onehot(label)). */
PP_HD void pp_km_sce_row_grad(const float *s, int64_t C, int64_t label, int64_t ignore_index, float coef, float *d) {
    if (label == ignore_index) {
        for (int64_t c = 0; c < C; c++) d[c] = 0.0f;
        return;
    }
    float m = -INFINITY;
    for (int64_t c = 0; c < C; c++) m = s[c] > m ? s[c] : m;
    float z = 0;
    for (int64_t c = 0; c < C; c++) {
        d[c] = expf(s[c] - m);
        z += d[c];
    }
    float k = coef / z;
    for (int64_t c = 0; c < C; c++) d[c] *= k;
    d[label] -= coef;
}

/* ---------------------------------------------------- causal attention */

/* pippin::CausalAttention and its gradient (lib/ops/attention.c,
 * attention_grad.c) one query row or one key row per thread. An operand
 * as the CPU kernels view it (lib/ops/attention_internal.h): the head of
 * batch-head bh starts at (bh / heads) * sb + (bh % heads) * sh; row t
 * (time) at t * st from there, feature c at c * sd. Y and dY: sd = 1. */
typedef struct pp_km_attn_view {
    int64_t sb, sh, st, sd;
} pp_km_attn_view;

typedef struct pp_km_attn {
    int64_t heads, tq, tk, d, dv; /* d: Q's and K's width; dv: V's */
    int64_t mask_a, mask_b;       /* the causal mask's last two dims (tq, tk without one) */
    float scale;
    int scale_div;                /* scores x / scale, else x * scale */
    pp_km_attn_view q, k, v, y;   /* y: Y (forward) or dY (backward) */
} pp_km_attn;

PP_HD int64_t pp_km_attn_at(const pp_km_attn_view *v, int64_t heads, int64_t bh, int64_t t) {
    return (bh / heads) * v->sb + (bh % heads) * v->sh + t * v->st;
}

/* Keys query i sees (pp_attn_keys_seen): j < this. */
PP_HD int64_t pp_km_attn_seen(const pp_km_attn *A, int64_t i) {
    if (A->mask_b == 1) return A->tk;
    int64_t ip = A->mask_a == 1 ? 0 : i;
    return ip + 1 < A->tk ? ip + 1 : A->tk;
}

/* The scaled score of query i and key j. */
PP_HD float pp_km_attn_score(const pp_km_attn *A, const float *q, const float *k, int64_t bh, int64_t i,
                             int64_t j) {
    const float *qi = q + pp_km_attn_at(&A->q, A->heads, bh, i), *kj = k + pp_km_attn_at(&A->k, A->heads, bh, j);
    float s = 0;
    for (int64_t c = 0; c < A->d; c++) s += qi[c * A->q.sd] * kj[c * A->k.sd];
    return A->scale_div ? s / A->scale : s * A->scale;
}

/* Row i's softmax: its max m and 1 / sum(exp(score - m)) (summed in
 * double, as pp_attn_softmax_row does); P[i][j] = exp(score - m) * inv. */
PP_HD void pp_km_attn_row_norm(const pp_km_attn *A, const float *q, const float *k, int64_t bh, int64_t i, float *m,
                               float *inv) {
    int64_t n = pp_km_attn_seen(A, i);
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        float s = pp_km_attn_score(A, q, k, bh, i, j);
        mx = s > mx ? s : mx;
    }
    double total = 0;
    for (int64_t j = 0; j < n; j++) total += expf(pp_km_attn_score(A, q, k, bh, i, j) - mx);
    *m = mx;
    *inv = (float)(1.0 / total);
}

/* dY[i] . V[j]: dP of query i and key j. */
PP_HD float pp_km_attn_dp(const pp_km_attn *A, const float *v, const float *dy, int64_t bh, int64_t i, int64_t j) {
    const float *dyi = dy + pp_km_attn_at(&A->y, A->heads, bh, i), *vj = v + pp_km_attn_at(&A->v, A->heads, bh, j);
    float s = 0;
    for (int64_t c = 0; c < A->dv; c++) s += dyi[c * A->y.sd] * vj[c * A->v.sd];
    return s;
}

/* The forward of query row i of batch-head bh: Y[i] = sum_j P[i][j] V[j]
 * over the keys it sees (0 without keys). */
PP_HD void pp_km_attn_fwd_row(const pp_km_attn *A, const float *q, const float *k, const float *v, float *y,
                              int64_t bh, int64_t i) {
    float *yi = y + pp_km_attn_at(&A->y, A->heads, bh, i);
    for (int64_t c = 0; c < A->dv; c++) yi[c * A->y.sd] = 0.0f;
    int64_t n = pp_km_attn_seen(A, i);
    if (n <= 0) return;
    float m, inv;
    pp_km_attn_row_norm(A, q, k, bh, i, &m, &inv);
    for (int64_t j = 0; j < n; j++) {
        float p = expf(pp_km_attn_score(A, q, k, bh, i, j) - m) * inv;
        const float *vj = v + pp_km_attn_at(&A->v, A->heads, bh, j);
        for (int64_t c = 0; c < A->dv; c++) yi[c * A->y.sd] += p * vj[c * A->v.sd];
    }
}

/* The backward's first pass, query row i: its softmax (stats[0], [1]: m
 * and inv) and rowsum(dP P) (stats[2]), and dQ[i] = sum_j dS[i][j] K[j]
 * (dq may be NULL), dS = P (dP - rowsum(dP P)) * c, c the scale or
 * 1 / scale. dq is laid out as Q. */
PP_HD void pp_km_attn_grad_row(const pp_km_attn *A, const float *q, const float *k, const float *v, const float *dy,
                               int64_t bh, int64_t i, float c, float *stats, float *dq) {
    int64_t n = pp_km_attn_seen(A, i);
    float m = 0, inv = 0;
    double dot = 0;
    if (n > 0) pp_km_attn_row_norm(A, q, k, bh, i, &m, &inv);
    for (int64_t j = 0; j < n; j++) {
        float p = expf(pp_km_attn_score(A, q, k, bh, i, j) - m) * inv;
        dot += (double)pp_km_attn_dp(A, v, dy, bh, i, j) * p;
    }
    float t = (float)dot;
    stats[0] = m, stats[1] = inv, stats[2] = t;
    if (!dq) return;
    float *dqi = dq + pp_km_attn_at(&A->q, A->heads, bh, i);
    for (int64_t cc = 0; cc < A->d; cc++) dqi[cc * A->q.sd] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float p = expf(pp_km_attn_score(A, q, k, bh, i, j) - m) * inv;
        float ds = p * (pp_km_attn_dp(A, v, dy, bh, i, j) - t) * c;
        const float *kj = k + pp_km_attn_at(&A->k, A->heads, bh, j);
        for (int64_t cc = 0; cc < A->d; cc++) dqi[cc * A->q.sd] += ds * kj[cc * A->k.sd];
    }
}

/* The backward's second pass, key row j: dK[j] = sum_i dS[i][j] Q[i] and
 * dV[j] = sum_i P[i][j] dY[i] over the queries that see j, in query
 * order, from the first pass's stats (3 per row, rows of batch-head bh
 * at bh * tq). dk (laid out as K) and dv (as V) may be NULL. */
PP_HD void pp_km_attn_grad_key(const pp_km_attn *A, const float *q, const float *k, const float *v, const float *dy,
                               const float *stats, int64_t bh, int64_t j, float c, float *dk, float *dv) {
    float *dkj = dk ? dk + pp_km_attn_at(&A->k, A->heads, bh, j) : 0;
    float *dvj = dv ? dv + pp_km_attn_at(&A->v, A->heads, bh, j) : 0;
    for (int64_t cc = 0; dkj && cc < A->d; cc++) dkj[cc * A->k.sd] = 0.0f;
    for (int64_t cc = 0; dvj && cc < A->dv; cc++) dvj[cc * A->v.sd] = 0.0f;
    for (int64_t i = 0; i < A->tq; i++) {
        if (j >= pp_km_attn_seen(A, i)) continue;
        const float *st = stats + 3 * (bh * A->tq + i);
        float p = expf(pp_km_attn_score(A, q, k, bh, i, j) - st[0]) * st[1];
        if (dvj) {
            const float *dyi = dy + pp_km_attn_at(&A->y, A->heads, bh, i);
            for (int64_t cc = 0; cc < A->dv; cc++) dvj[cc * A->v.sd] += p * dyi[cc * A->y.sd];
        }
        if (dkj) {
            float ds = p * (pp_km_attn_dp(A, v, dy, bh, i, j) - st[2]) * c;
            const float *qi = q + pp_km_attn_at(&A->q, A->heads, bh, i);
            for (int64_t cc = 0; cc < A->d; cc++) dkj[cc * A->k.sd] += ds * qi[cc * A->q.sd];
        }
    }
}

/* ------------------------------------------------------------ optimizers */

typedef struct pp_km_sgd {
    float lr, weight_decay, momentum, dampening, sign;
    int nesterov, first;
} pp_km_sgd;

/* One SGD element (torch.optim.SGD); buf is the momentum buffer (may be NULL without momentum). */
PP_HD void pp_km_sgd_step(const pp_km_sgd *c, float *p, const float *grad, float *buf, int64_t i) {
    float d = c->sign * grad[i];
    if (c->weight_decay != 0) d = d + c->weight_decay * p[i];
    if (c->momentum != 0) {
        buf[i] = c->first ? d : buf[i] * c->momentum + (1.0f - c->dampening) * d;
        d = c->nesterov ? d + c->momentum * buf[i] : buf[i];
    }
    p[i] = p[i] + (-c->lr) * d;
}

typedef struct pp_km_adamw {
    float decay;    /* 1 - lr * weight_decay */
    float b1, b2, one_b1, one_b2;
    float neg_step; /* -lr / (1 - beta1^t) */
    float bc2_sqrt; /* sqrt(1 - beta2^t) */
    float eps, sign;
} pp_km_adamw;

/* AdamW's constants for step t (1-based), as stages/optim.c computes them. */
PP_HD pp_km_adamw pp_km_adamw_for_step(double lr, double weight_decay, double beta1, double beta2, double eps,
                                       int maximize, double t) {
    pp_km_adamw c;
    c.decay = (float)(1.0 - lr * weight_decay);
    c.b1 = (float)beta1;
    c.b2 = (float)beta2;
    c.one_b1 = (float)(1.0 - beta1);
    c.one_b2 = (float)(1.0 - beta2);
    c.neg_step = (float)(-(lr / (1.0 - pow(beta1, t))));
    c.bc2_sqrt = (float)sqrt(1.0 - pow(beta2, t));
    c.eps = (float)eps;
    c.sign = maximize ? -1.0f : 1.0f;
    return c;
}

/* One AdamW element (torch.optim.AdamW); m, v: the moment buffers. */
PP_HD void pp_km_adamw_step(const pp_km_adamw *c, float *p, const float *grad, float *m, float *v, int64_t i) {
    float g = c->sign * grad[i];
    p[i] = p[i] * c->decay;
    m[i] = m[i] * c->b1 + c->one_b1 * g;
    v[i] = v[i] * c->b2 + c->one_b2 * (g * g);
    float denom = sqrtf(v[i]) / c->bc2_sqrt + c->eps;
    p[i] = p[i] + c->neg_step * (m[i] / denom);
}

#endif

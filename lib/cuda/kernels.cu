// The CUDA kernels: one thread per element (or per row, per column), each
// calling its function in kernel_math.h, which the cuda-host tests check
// against the CPU kernels. Simple rather than fast: rows are one thread.
#include <cuda_runtime.h>

#include "kernels.h"

namespace {

const int kThreads = 256;

unsigned blocks_for(int64_t n) { return (unsigned)((n + kThreads - 1) / kThreads); }

int launched() { return (int)cudaGetLastError(); }

#define PP_CU_INDEX(n)                                                  \
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;         \
    if (i >= (n)) return

__global__ void binary_k(pp_km_binop op, const float *a, pp_km_strides sa, const float *b, pp_km_strides sb,
                         float *out, int64_t n) {
    PP_CU_INDEX(n);
    out[i] = pp_km_binary(op, a[pp_km_offset(&sa, i)], b[pp_km_offset(&sb, i)]);
}

__global__ void unary_k(pp_km_unop op, const float *x, float *y, int64_t n) {
    PP_CU_INDEX(n);
    y[i] = pp_km_unary(op, x[i]);
}

__global__ void unary_grad_k(pp_km_gradop op, const float *dy, const float *t, float *dx, int64_t n) {
    PP_CU_INDEX(n);
    dx[i] = pp_km_unary_grad(op, dy[i], t[i]);
}

__global__ void softmax_k(const float *x, float *y, int64_t rows, int64_t n) {
    PP_CU_INDEX(rows);
    pp_km_softmax_row(x + i * n, y + i * n, n);
}

__global__ void softmax_grad_k(const float *dy, const float *y, float *dx, int64_t rows, int64_t n) {
    PP_CU_INDEX(rows);
    pp_km_softmax_grad_row(dy + i * n, y + i * n, dx + i * n, n);
}

__global__ void layernorm_k(const float *x, const float *w, const float *b, float eps, float *y, float *mean,
                            float *rstd, int64_t rows, int64_t n) {
    PP_CU_INDEX(rows);
    pp_km_layernorm_row(x + i * n, w, b, eps, y + i * n, n, mean ? mean + i : NULL, rstd ? rstd + i : NULL);
}

__global__ void ln_grad_input_k(const float *dy, const float *x, const float *w, float eps, float *dx,
                                int64_t rows, int64_t n) {
    PP_CU_INDEX(rows);
    pp_km_ln_grad_input_row(dy + i * n, x + i * n, w, eps, dx + i * n, n);
}

__global__ void ln_stats_k(const float *x, float eps, float *stats, int64_t rows, int64_t n) {
    PP_CU_INDEX(rows);
    pp_km_ln_stats(x + i * n, n, eps, &stats[2 * i], &stats[2 * i + 1]);
}

__global__ void ln_grad_weight_k(const float *dy, const float *x, const float *stats, int64_t rows, int64_t n,
                                 float *ds, float *db) {
    PP_CU_INDEX(n);
    pp_km_ln_grad_weight_col(dy, x, stats, rows, n, i, ds + i, db + i);
}

__global__ void reduce_sum_k(const float *x, float *y, int64_t outer, int64_t len, int64_t inner) {
    PP_CU_INDEX(outer * inner);
    y[i] = pp_km_reduce_sum(x, len, inner, i / inner, i % inner);
}

template <typename T>
__global__ void gather_k(const T *src, const int64_t *idx, int64_t n_idx, int64_t axis_len, int64_t inner, T *out,
                         int64_t n) {
    PP_CU_INDEX(n);
    out[i] = src[pp_km_gather_src(i, idx, n_idx, axis_len, inner)];
}

__global__ void gather_grad_k(const float *dy, const int64_t *idx, int64_t n_idx, int64_t axis_len, int64_t inner,
                              float *out, int64_t n) {
    PP_CU_INDEX(n);
    atomicAdd(out + pp_km_gather_grad_dst(i, idx, n_idx, axis_len, inner), dy[i]);
}

__global__ void sce_rows_k(const float *s, const int64_t *labels, int64_t rows, int64_t C, int64_t ignore,
                           float *work) {
    PP_CU_INDEX(rows);
    work[i] = pp_km_sce_row_loss(s + i * C, C, labels[i], ignore);
}

// The mean in row order on one thread, as the host sums it.
__global__ void sce_mean_k(const float *work, const int64_t *labels, int64_t rows, int64_t ignore, float *loss) {
    double sum = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < rows; r++) {
        sum += work[r];
        count += labels[r] != ignore;
    }
    *loss = (float)(sum / (double)count);
}

__global__ void sce_grad_k(const float *dloss, const float *s, const int64_t *labels, int64_t rows, int64_t C,
                           int64_t ignore, int64_t count, float *dx) {
    PP_CU_INDEX(rows);
    float coef = (float)((double)dloss[0] / (double)count);
    pp_km_sce_row_grad(s + i * C, C, labels[i], ignore, coef, dx + i * C);
}

template <typename T>
__global__ void strided_copy_k(const T *src, int64_t base, pp_km_strides st, T *out, int64_t n) {
    PP_CU_INDEX(n);
    out[i] = src[base + pp_km_offset(&st, i)];
}

template <typename T>
__global__ void concat_part_k(const T *src, int64_t len, int64_t inner, int64_t total, int64_t off, T *out,
                              int64_t n) {
    PP_CU_INDEX(n);
    out[pp_km_concat_dst(i, len, inner, total, off)] = src[i];
}

template <typename T>
__global__ void split_part_k(const T *src, int64_t len, int64_t inner, int64_t total, int64_t off, T *out,
                             int64_t n) {
    PP_CU_INDEX(n);
    out[i] = src[pp_km_split_src(i, len, inner, total, off)];
}

__global__ void attn_fwd_k(pp_km_attn a, const float *q, const float *k, const float *v, float *y, int64_t n) {
    PP_CU_INDEX(n);
    pp_km_attn_fwd_row(&a, q, k, v, y, i / a.tq, i % a.tq);
}

__global__ void attn_grad_rows_k(pp_km_attn a, const float *q, const float *k, const float *v, const float *dy,
                                 float c, float *stats, float *dq, int64_t n) {
    PP_CU_INDEX(n);
    pp_km_attn_grad_row(&a, q, k, v, dy, i / a.tq, i % a.tq, c, stats + 3 * i, dq);
}

__global__ void attn_grad_keys_k(pp_km_attn a, const float *q, const float *k, const float *v, const float *dy,
                                 const float *stats, float c, float *dk, float *dv, int64_t n) {
    PP_CU_INDEX(n);
    pp_km_attn_grad_key(&a, q, k, v, dy, stats, i / a.tk, i % a.tk, c, dk, dv);
}

__global__ void sgd_k(pp_km_sgd c, float *p, const float *grad, float *buf, int64_t n) {
    PP_CU_INDEX(n);
    pp_km_sgd_step(&c, p, grad, buf, i);
}

__global__ void adamw_k(pp_km_adamw c, float *p, const float *grad, float *m, float *v, int64_t n) {
    PP_CU_INDEX(n);
    pp_km_adamw_step(&c, p, grad, m, v, i);
}

// Picks the kernel instance for an element size.
template <template <typename> class K, typename... A>
int by_size(int elem, A... a) {
    switch (elem) {
    case 1: return K<uint8_t>::go(a...);
    case 2: return K<uint16_t>::go(a...);
    case 4: return K<uint32_t>::go(a...);
    case 8: return K<uint64_t>::go(a...);
    default: return (int)cudaErrorInvalidValue;
    }
}

template <typename T> struct gather_go {
    static int go(cudaStream_t s, const void *src, const int64_t *idx, int64_t n_idx, int64_t axis_len,
                  int64_t inner, void *out, int64_t n) {
        gather_k<T><<<blocks_for(n), kThreads, 0, s>>>((const T *)src, idx, n_idx, axis_len, inner, (T *)out, n);
        return launched();
    }
};

template <typename T> struct strided_go {
    static int go(cudaStream_t s, const void *src, int64_t base, pp_km_strides st, void *out, int64_t n) {
        strided_copy_k<T><<<blocks_for(n), kThreads, 0, s>>>((const T *)src, base, st, (T *)out, n);
        return launched();
    }
};

template <typename T> struct concat_go {
    static int go(cudaStream_t s, const void *src, int64_t len, int64_t inner, int64_t total, int64_t off,
                  void *out, int64_t n) {
        concat_part_k<T><<<blocks_for(n), kThreads, 0, s>>>((const T *)src, len, inner, total, off, (T *)out, n);
        return launched();
    }
};

template <typename T> struct split_go {
    static int go(cudaStream_t s, const void *src, int64_t len, int64_t inner, int64_t total, int64_t off,
                  void *out, int64_t n) {
        split_part_k<T><<<blocks_for(n), kThreads, 0, s>>>((const T *)src, len, inner, total, off, (T *)out, n);
        return launched();
    }
};

}  // namespace

#define PP_CU_LAUNCH(n, kernel, ...)                                         \
    do {                                                                    \
        if ((n) <= 0) return 0;                                             \
        kernel<<<blocks_for(n), kThreads, 0, s>>>(__VA_ARGS__);             \
        return launched();                                                  \
    } while (0)

extern "C" {

int pp_cu_binary(pp_cu_stream s, pp_km_binop op, const float *a, pp_km_strides sa, const float *b,
                 pp_km_strides sb, float *out, int64_t n) {
    PP_CU_LAUNCH(n, binary_k, op, a, sa, b, sb, out, n);
}

int pp_cu_unary(pp_cu_stream s, pp_km_unop op, const float *x, float *y, int64_t n) {
    PP_CU_LAUNCH(n, unary_k, op, x, y, n);
}

int pp_cu_unary_grad(pp_cu_stream s, pp_km_gradop op, const float *dy, const float *t, float *dx, int64_t n) {
    PP_CU_LAUNCH(n, unary_grad_k, op, dy, t, dx, n);
}

int pp_cu_softmax(pp_cu_stream s, const float *x, float *y, int64_t rows, int64_t n) {
    PP_CU_LAUNCH(rows, softmax_k, x, y, rows, n);
}

int pp_cu_softmax_grad(pp_cu_stream s, const float *dy, const float *y, float *dx, int64_t rows, int64_t n) {
    PP_CU_LAUNCH(rows, softmax_grad_k, dy, y, dx, rows, n);
}

int pp_cu_layernorm(pp_cu_stream s, const float *x, const float *w, const float *b, float eps, float *y,
                    float *mean, float *rstd, int64_t rows, int64_t n) {
    PP_CU_LAUNCH(rows, layernorm_k, x, w, b, eps, y, mean, rstd, rows, n);
}

int pp_cu_ln_grad_input(pp_cu_stream s, const float *dy, const float *x, const float *w, float eps, float *dx,
                        int64_t rows, int64_t n) {
    PP_CU_LAUNCH(rows, ln_grad_input_k, dy, x, w, eps, dx, rows, n);
}

int pp_cu_ln_grad_weight(pp_cu_stream s, const float *dy, const float *x, float eps, float *stats, int64_t rows,
                         int64_t n, float *dscale, float *dbias) {
    if (rows > 0) {
        ln_stats_k<<<blocks_for(rows), kThreads, 0, s>>>(x, eps, stats, rows, n);
        int e = launched();
        if (e) return e;
    }
    PP_CU_LAUNCH(n, ln_grad_weight_k, dy, x, stats, rows, n, dscale, dbias);
}

int pp_cu_reduce_sum(pp_cu_stream s, const float *x, float *y, int64_t outer, int64_t len, int64_t inner) {
    PP_CU_LAUNCH(outer * inner, reduce_sum_k, x, y, outer, len, inner);
}

int pp_cu_gather(pp_cu_stream s, const void *src, int elem, const int64_t *idx, int64_t n_idx, int64_t axis_len,
                 int64_t inner, void *out, int64_t n_out) {
    if (n_out <= 0) return 0;
    return by_size<gather_go>(elem, (cudaStream_t)s, src, idx, n_idx, axis_len, inner, out, n_out);
}

int pp_cu_gather_grad(pp_cu_stream s, const float *dy, const int64_t *idx, int64_t n_idx, int64_t axis_len,
                      int64_t inner, float *out, int64_t n_out, int64_t n_dy) {
    int e = (int)cudaMemsetAsync(out, 0, sizeof(float) * (size_t)n_out, s);
    if (e) return e;
    PP_CU_LAUNCH(n_dy, gather_grad_k, dy, idx, n_idx, axis_len, inner, out, n_dy);
}

int pp_cu_sce_loss(pp_cu_stream s, const float *scores, const int64_t *labels, int64_t rows, int64_t C,
                   int64_t ignore_index, float *work, float *loss) {
    if (rows > 0) {
        sce_rows_k<<<blocks_for(rows), kThreads, 0, s>>>(scores, labels, rows, C, ignore_index, work);
        int e = launched();
        if (e) return e;
    }
    sce_mean_k<<<1, 1, 0, s>>>(work, labels, rows, ignore_index, loss);
    return launched();
}

int pp_cu_sce_grad(pp_cu_stream s, const float *dloss, const float *scores, const int64_t *labels, int64_t rows,
                   int64_t C, int64_t ignore_index, int64_t count, float *dx) {
    PP_CU_LAUNCH(rows, sce_grad_k, dloss, scores, labels, rows, C, ignore_index, count, dx);
}

int pp_cu_strided_copy(pp_cu_stream s, const void *src, int elem, int64_t base, pp_km_strides st, void *out,
                       int64_t n) {
    if (n <= 0) return 0;
    return by_size<strided_go>(elem, (cudaStream_t)s, src, base, st, out, n);
}

int pp_cu_concat_part(pp_cu_stream s, const void *src, int elem, int64_t len, int64_t inner, int64_t total,
                      int64_t axis_off, void *out, int64_t n) {
    if (n <= 0) return 0;
    return by_size<concat_go>(elem, (cudaStream_t)s, src, len, inner, total, axis_off, out, n);
}

int pp_cu_split_part(pp_cu_stream s, const void *src, int elem, int64_t len, int64_t inner, int64_t total,
                     int64_t axis_off, void *out, int64_t n) {
    if (n <= 0) return 0;
    return by_size<split_go>(elem, (cudaStream_t)s, src, len, inner, total, axis_off, out, n);
}

int pp_cu_attention(pp_cu_stream s, pp_km_attn a, const float *q, const float *k, const float *v, float *y,
                    int64_t n_bh) {
    PP_CU_LAUNCH(n_bh * a.tq, attn_fwd_k, a, q, k, v, y, n_bh * a.tq);
}

int pp_cu_attention_grad(pp_cu_stream s, pp_km_attn a, const float *q, const float *k, const float *v,
                         const float *dy, float c, float *stats, float *dq, float *dk, float *dv, int64_t n_bh) {
    if (n_bh * a.tq > 0) {
        attn_grad_rows_k<<<blocks_for(n_bh * a.tq), kThreads, 0, s>>>(a, q, k, v, dy, c, stats, dq, n_bh * a.tq);
        int e = launched();
        if (e) return e;
    }
    if (!dk && !dv) return 0;
    PP_CU_LAUNCH(n_bh * a.tk, attn_grad_keys_k, a, q, k, v, dy, stats, c, dk, dv, n_bh * a.tk);
}

int pp_cu_sgd(pp_cu_stream s, pp_km_sgd c, float *p, const float *grad, float *buf, int64_t n) {
    PP_CU_LAUNCH(n, sgd_k, c, p, grad, buf, n);
}

int pp_cu_adamw(pp_cu_stream s, pp_km_adamw c, float *p, const float *grad, float *m, float *v, int64_t n) {
    PP_CU_LAUNCH(n, adamw_k, c, p, grad, m, v, n);
}

}  // extern "C"

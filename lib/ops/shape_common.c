/* Helpers of the shape families (shape_kernels.h): reading int tensors and
 * the strided copy every data-movement kernel uses. */
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "shape_kernels.h"
#include "thread_pool.h"

#ifdef __SSE2__
#include <immintrin.h>
#endif

/* Reads a 0-d or 1-d int32/int64 tensor of at most max entries. */
pp_status pp_read_ints(const pp_kernel_ctx *ctx, const pp_tensor *t, const char *what,
                       int64_t *vals, int max, int *n) {
    if (t->dtype != PP_I64 && t->dtype != PP_I32)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must be int64 or int32, got %s", what,
                               pp_dtype_name(t->dtype));
    if (t->ndim > 1)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must be 1-D, got %d dims", what, t->ndim);
    int64_t cnt = pp_tensor_numel(t);
    if (cnt > max)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "%s has %" PRId64 " entries (at most %d)",
                               what, cnt, max);
    for (int64_t i = 0; i < cnt; i++) vals[i] = pp_tensor_get_i64(t, i);
    *n = (int)cnt;
    return PP_OK;
}

/* --------------------------------------------------------- strided copy */

/* Strided gather along one dim into contiguous dst. */
static void copy_run_strided(char *d, const char *s, int64_t n, int64_t sstride, size_t es) {
    ptrdiff_t sb = (ptrdiff_t)(sstride * (int64_t)es);
    switch (es) {
    case 4:
        for (int64_t j = 0; j < n; j++, s += sb) memcpy(d + j * 4, s, 4);
        break;
    case 8:
        for (int64_t j = 0; j < n; j++, s += sb) memcpy(d + j * 8, s, 8);
        break;
    case 2:
        for (int64_t j = 0; j < n; j++, s += sb) memcpy(d + j * 2, s, 2);
        break;
    default:
        for (int64_t j = 0; j < n; j++, s += sb) pp_copy_elem(d + (size_t)j * es, s, es);
        break;
    }
}

/* Replicates one element n times (broadcast along the innermost dim). */
void pp_fill_elem(char *d, const char *s, int64_t n, size_t es) {
    if (n <= 0) return;
    memcpy(d, s, es);
    size_t done = es, total = (size_t)n * es;
    while (done < total) { /* doubling: few memcpy calls */
        size_t k = done < total - done ? done : total - done;
        memcpy(d + done, d, k);
        done += k;
    }
}

/* Cache-blocked 2-D transpose: d[i*drow + j] = s[i + j*scol]. */
static void transpose_block(char *d, int64_t drow, const char *s, int64_t scol, int64_t rows,
                            int64_t cols, size_t es) {
    enum { B = 32 };
    for (int64_t i0 = 0; i0 < rows; i0 += B) {
        int64_t i1 = i0 + B < rows ? i0 + B : rows;
        for (int64_t j0 = 0; j0 < cols; j0 += B) {
            int64_t j1 = j0 + B < cols ? j0 + B : cols;
            if (es == 4) {
                int64_t i = i0;
#ifdef __SSE2__
                /* 4x4 register transposes: 2-4x faster than scalar here */
                for (; i + 4 <= i1; i += 4) {
                    int64_t j = j0;
                    for (; j + 4 <= j1; j += 4) {
                        const float *sp = (const float *)s + i + j * scol;
                        __m128 r0 = _mm_loadu_ps(sp), r1 = _mm_loadu_ps(sp + scol);
                        __m128 r2 = _mm_loadu_ps(sp + 2 * scol), r3 = _mm_loadu_ps(sp + 3 * scol);
                        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
                        float *dp = (float *)d + i * drow + j;
                        _mm_storeu_ps(dp, r0);
                        _mm_storeu_ps(dp + drow, r1);
                        _mm_storeu_ps(dp + 2 * drow, r2);
                        _mm_storeu_ps(dp + 3 * drow, r3);
                    }
                    for (; j < j1; j++)
                        for (int64_t a = 0; a < 4; a++)
                            memcpy(d + (size_t)((i + a) * drow + j) * 4,
                                   s + (size_t)(i + a + j * scol) * 4, 4);
                }
#endif
                for (; i < i1; i++) {
                    char *dr = d + (size_t)(i * drow) * 4;
                    const char *sr = s + (size_t)i * 4;
                    for (int64_t j = j0; j < j1; j++)
                        memcpy(dr + (size_t)j * 4, sr + (size_t)(j * scol) * 4, 4);
                }
            } else {
                for (int64_t i = i0; i < i1; i++)
                    for (int64_t j = j0; j < j1; j++)
                        pp_copy_elem(d + (size_t)(i * drow + j) * es,
                                     s + (size_t)(i + j * scol) * es, es);
            }
        }
    }
}

static void copy_box(void *dstv, const void *srcv, size_t es, const pp_sc_layout *in) {
    char *dst = dstv;
    const char *src = srcv;
    int64_t n[PP_SC_MAXD], ss[PP_SC_MAXD], ds[PP_SC_MAXD];
    int nd = 0;
    /* Coalesce: drop unit dims, merge a dim into its outer neighbour when
     * both strides line up. */
    for (int i = 0; i < in->nd; i++) {
        if (in->n[i] == 0) return;
        if (in->n[i] == 1) continue;
        if (nd > 0 && ss[nd - 1] == in->ss[i] * in->n[i] && ds[nd - 1] == in->ds[i] * in->n[i]) {
            n[nd - 1] *= in->n[i];
            ss[nd - 1] = in->ss[i];
            ds[nd - 1] = in->ds[i];
        } else {
            n[nd] = in->n[i];
            ss[nd] = in->ss[i];
            ds[nd] = in->ds[i];
            nd++;
        }
    }
    if (nd == 0) {
        memcpy(dst, src, es);
        return;
    }
    int last = nd - 1;
    /* Transpose pattern: dst contiguous in the last dim, src contiguous in an
     * outer one -> blocked tiles instead of a strided gather. */
    int tp = -1;
    if (ds[last] == 1 && ss[last] != 1 && ss[last] != 0 && n[last] >= 4)
        for (int i = last - 1; i >= 0; i--)
            if (ss[i] == 1 && n[i] >= 4) {
                tp = i;
                break;
            }
    int outer[PP_SC_MAXD], no = 0;
    for (int i = 0; i < last; i++)
        if (i != tp) outer[no++] = i;
    int64_t idx[PP_SC_MAXD] = {0};
    int64_t soff = 0, doff = 0; /* in elements */
    for (;;) {
        char *d = dst + doff * (int64_t)es;
        const char *s = src + soff * (int64_t)es;
        if (tp >= 0) {
            transpose_block(d, ds[tp], s, ss[last], n[tp], n[last], es);
        } else if (ss[last] == 1 && ds[last] == 1) {
            memcpy(d, s, (size_t)n[last] * es);
        } else if (ds[last] == 1 && ss[last] == 0) {
            pp_fill_elem(d, s, n[last], es);
        } else if (ds[last] == 1) {
            copy_run_strided(d, s, n[last], ss[last], es);
        } else {
            for (int64_t j = 0; j < n[last]; j++)
                pp_copy_elem(d + j * ds[last] * (int64_t)es, s + j * ss[last] * (int64_t)es, es);
        }
        /* odometer over the outer dims */
        int k = no - 1;
        for (; k >= 0; k--) {
            int a = outer[k];
            idx[a]++;
            soff += ss[a];
            doff += ds[a];
            if (idx[a] < n[a]) break;
            soff -= ss[a] * n[a];
            doff -= ds[a] * n[a];
            idx[a] = 0;
        }
        if (k < 0) break;
    }
}

/* Large copies run in pieces on the pool (thread_pool.h): the outermost dim
 * of more than one index is cut, each piece copying its own sub-box. */
typedef struct copy_job {
    char *dst;
    const char *src;
    size_t es;
    const pp_sc_layout *in;
    int dim;
} copy_job;

static void copy_piece(void *arg, int64_t lo, int64_t hi) {
    const copy_job *j = arg;
    pp_sc_layout L = *j->in;
    L.n[j->dim] = hi - lo;
    copy_box(j->dst + lo * L.ds[j->dim] * (int64_t)j->es, j->src + lo * L.ss[j->dim] * (int64_t)j->es, j->es, &L);
}

void pp_strided_copy(void *dstv, const void *srcv, size_t es, const pp_sc_layout *in) {
    int64_t numel = 1;
    int dim = -1;
    for (int i = 0; i < in->nd; i++) {
        numel *= in->n[i];
        if (dim < 0 && in->n[i] > 1) dim = i;
    }
    if (dim < 0 || numel < 2 * PP_GRAIN_ELEMS) {
        copy_box(dstv, srcv, es, in);
        return;
    }
    copy_job j = {dstv, srcv, es, in, dim};
    int64_t per = numel / in->n[dim]; /* elements per index of dim */
    pp_parallel_for(in->n[dim], (PP_GRAIN_ELEMS + per - 1) / per, copy_piece, &j);
}

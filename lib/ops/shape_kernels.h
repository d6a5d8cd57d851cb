/* Internal: helpers shared by the shape and data-movement families
 * (reshape.c, slice.c, pad.c, cast.c, constant.c; the strided copy in
 * shape_common.c). Data is moved by element size, never by dtype. */
#ifndef PIPPIN_OPS_SHAPE_KERNELS_H
#define PIPPIN_OPS_SHAPE_KERNELS_H

#include <stdint.h>
#include <string.h>

#include "op.h"

static inline int pp_kernel_want_out(const pp_kernel_ctx *ctx, int i) {
    return i < ctx->n_out && ctx->node->out[i] >= 0;
}

static inline pp_tensor *pp_kernel_input(const pp_kernel_ctx *ctx, int i) {
    return i < ctx->n_in ? ctx->in[i] : NULL;
}

/* Normalises axis into [0, rank); -1 if out of range. */
static inline int pp_norm_axis(int64_t axis, int rank) {
    if (axis < -rank || axis >= rank) return -1;
    return (int)(axis < 0 ? axis + rank : axis);
}

static inline const char *pp_shape_s(const pp_tensor *t, char *buf, size_t cap) {
    return pp_shape_str(t->ndim, t->shape, buf, cap);
}

static inline void pp_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
}

/* Split's axis and the sizes of its ctx->n_out parts along it (sizes has
 * n_out entries): the `split` input or attribute, else num_outputs or
 * equal parts, checked against x. The CPU kernel's and the CUDA
 * backend's (lib/cuda/cuda_ops.c). */
pp_status pp_split_sizes(const pp_kernel_ctx *ctx, const pp_tensor *x, int *axis, int64_t *sizes);

/* Reads a 0-d or 1-d int32/int64 tensor of at most max entries. */
pp_status pp_read_ints(const pp_kernel_ctx *ctx, const pp_tensor *t, const char *what,
                       int64_t *vals, int max, int *n);

/* --------------------------------------------------------- strided copy */

/* dst[sum i_k*ds_k] = src[sum i_k*ss_k] over the index box n (strides in
 * elements, src strides may be 0 for broadcasting or negative for reversed
 * slices). Up to 2*PP_MAX_DIMS dims so Tile can split each dim in two. */
#define PP_SC_MAXD (2 * PP_MAX_DIMS)

typedef struct {
    int nd;
    int64_t n[PP_SC_MAXD];
    int64_t ss[PP_SC_MAXD];
    int64_t ds[PP_SC_MAXD];
} pp_sc_layout;

static inline void pp_copy_elem(char *d, const char *s, size_t es) {
    switch (es) {
    case 1: *d = *s; break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    default: memcpy(d, s, es); break;
    }
}

/* Replicates one element n times (broadcast along the innermost dim). */
void pp_fill_elem(char *d, const char *s, int64_t n, size_t es);

void pp_strided_copy(void *dstv, const void *srcv, size_t es, const pp_sc_layout *in);

/* Casts src to dt into a new tensor (cast.c; Pad casts its fill value). */
pp_status pp_cast_tensor(const pp_tensor *src, pp_dtype dt, pp_tensor **out);

#endif

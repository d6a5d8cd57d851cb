/* Internal: numpy-style broadcasting for kernels.
 *
 * A pp_bcast plan describes how up to PP_BCAST_MAX contiguous operands map
 * onto their broadcast output shape. Adjacent dimensions are merged wherever
 * every operand either runs contiguously across them or is broadcast along
 * both, so equal shapes become one flat row, a scalar operand becomes a row
 * with inner stride 0, and a bias [C] added to [N,T,C] becomes N*T rows of C.
 * Kernels then walk the plan one row at a time (pp_bcast_iter) and pick a
 * tight loop for the row from the operands' inner strides, which are always 0
 * (broadcast) or 1 (contiguous). */
#ifndef PIPPIN_OPS_BROADCAST_H
#define PIPPIN_OPS_BROADCAST_H

#include <stdint.h>

#include "pippin/tensor.h"

#define PP_BCAST_MAX 4

typedef struct pp_bcast {
    int n;                         /* operands */
    int ndim;                      /* output rank */
    int64_t shape[PP_MAX_DIMS];    /* output shape */
    int64_t numel;                 /* output elements */
    /* Merged iteration space; cdim == 0 means a single element. */
    int cdim;
    int64_t cshape[PP_MAX_DIMS];
    int64_t cstride[PP_BCAST_MAX][PP_MAX_DIMS]; /* element strides, 0 = broadcast */
    int64_t inner;                 /* row length: cshape[cdim-1], or 1 */
    int64_t inner_stride[PP_BCAST_MAX]; /* 0 or 1 */
    int64_t rows;                  /* numel / inner (0 when numel == 0) */
} pp_bcast;

/* Broadcast shape of two shapes. On failure sets a message like
 * "shapes [2,3] and [4] do not broadcast" and returns PP_ERR_SHAPE. */
pp_status pp_broadcast_shape(int na, const int64_t *a, int nb, const int64_t *b, int *nout,
                             int64_t *out);

/* Plans the broadcast of n (1..PP_BCAST_MAX) shapes. Error as above, naming
 * every shape. */
pp_status pp_bcast_init_shapes(pp_bcast *b, int n, const int *ndims,
                               const int64_t *const *shapes);
/* Same, from tensors. */
pp_status pp_bcast_init(pp_bcast *b, int n, const pp_tensor *const *ts);

/* Walks the rows of a plan: off[k] is the element offset of the current
 * row's start in operand k; the output row starts at row * inner. */
typedef struct pp_bcast_iter {
    const pp_bcast *b;
    int64_t row;
    int64_t off[PP_BCAST_MAX];
    int64_t idx[PP_MAX_DIMS];
} pp_bcast_iter;

/* Positions the iterator on row 0. Only valid when b->rows > 0. */
void pp_bcast_iter_init(pp_bcast_iter *it, const pp_bcast *b);
/* Positions the iterator on row `row` (0 <= row < b->rows). */
void pp_bcast_iter_seek(pp_bcast_iter *it, const pp_bcast *b, int64_t row);
/* Moves to the next row; returns 0 after the last one. */
int pp_bcast_iter_next(pp_bcast_iter *it);

/* Calls seg(user, len, off, out) for every row of the plan, or for pieces
 * of rows: off[k] is operand k's element offset of the segment's first
 * element (inner stride already applied), out the output's. Large plans
 * run in pieces on the thread pool (thread_pool.h), cut at multiples of
 * PP_BCAST_ALIGN elements, so seg must only write its own output elements. */
#define PP_BCAST_ALIGN 16
typedef void (*pp_bcast_seg_fn)(void *user, int64_t len, const int64_t *off, int64_t out);
void pp_bcast_run(const pp_bcast *b, int64_t grain_elems, pp_bcast_seg_fn seg, void *user);

/* Materialises src broadcast to shape (a new tensor, same dtype). Fails with
 * PP_ERR_SHAPE if src does not broadcast to exactly that shape. */
pp_status pp_broadcast_to(const pp_tensor *src, int ndim, const int64_t *shape,
                          pp_tensor **out);

#endif

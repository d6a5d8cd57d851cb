/* Internal: in-place elementwise ops (see inplace.c).
 *
 * The executor picks, per node of a run, an input whose buffer the node's
 * output may take (pp_inplace_choose: a rule on the graph alone), checks
 * the tensor at run time (pp_inplace_can_donate), and offers it to the
 * kernel for the node's duration; the kernel's first allocation of the
 * same dtype and shape takes it (pp_inplace_take, from tensor_alloc). */
#ifndef PIPPIN_INPLACE_H
#define PIPPIN_INPLACE_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/graph.h"
#include "pippin/tensor.h"

/* For each position p of nodes[0..n_nodes): the inputs (bit k: input k,
 * k < 8) whose buffer output 0 may take. last[v] is the position of v's
 * last reader in the list; keep (values kept past the run: a stash,
 * outputs) and watch (values a hook may take) may be NULL. An input
 * qualifies when the op allows it (pp_op.inplace), an earlier node of this
 * list made it (never a graph input, an initializer, or a value from an
 * earlier run), this node is its last reader, it is neither kept nor
 * watched, and no other input of the node is the same value. Whether its
 * shape is the output's (no broadcasting) is seen when the kernel runs. */
void pp_inplace_choose(const pp_graph *g, const int *nodes, int n_nodes, const int *last, const uint8_t *keep,
                       const uint8_t *watch, uint8_t *choice);

/* 1 if t's buffer may go to an output now: t holds the only reference, is
 * float32 or float64, and the buffer is its own (from the tensor pool, the
 * memory plan or an earlier in-place output; not a view, caller memory or
 * a device buffer). */
int pp_inplace_can_donate(const pp_tensor *t);

/* Offers the buffers of donors[0..n) (n <= PP_INPLACE_MAX) to the calling
 * thread's next allocation of the same dtype and shape as one of them (the
 * first that fits) until pp_inplace_withdraw, which returns the bytes
 * taken (0: none). */
#define PP_INPLACE_MAX 8
void pp_inplace_offer(pp_tensor *const *donors, int n);
size_t pp_inplace_withdraw(void);

/* For tensor_alloc (uninitialised buffers only): 1 if t took the offered
 * buffer; it then keeps the donor alive until t is freed. */
int pp_inplace_take(pp_tensor *t, pp_dtype dt, int ndim, const int64_t *shape, size_t nbytes);

#endif

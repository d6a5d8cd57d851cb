/* Flat parameters: all trainable parameters of a graph in one contiguous
 * float32 buffer, and their gradients in another of the same layout (like
 * FSDP's flat parameter). The graph's PARAM values are rewired to views into
 * the buffer, so the executor reads the live parameters and an optimizer
 * updates every tensor with one pass over one array.
 *
 * Each tensor starts on a 64-byte boundary; the padding between tensors is
 * zero in both buffers and stays zero under SGD and AdamW.
 *
 * Thread safety: one thread uses a pp_flat_params at a time. */
#ifndef PIPPIN_PARAMS_H
#define PIPPIN_PARAMS_H

#include "pippin/export.h"

#include <stdint.h>

#include "pippin/graph.h"
#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_flat_params {
    int n;             /* parameters */
    int *values;       /* their value ids in the graph they came from */
    char **names;      /* their names (owned copies) */
    int64_t *offset;   /* element offset of parameter i in data and grad */
    int64_t *numel;    /* elements of parameter i */
    int *ndims;        /* rank of parameter i */
    int64_t *shapes;   /* its shape: shapes[i * PP_MAX_DIMS + d] */
    int64_t total;     /* elements in each buffer, padding included */
    float *data;       /* parameters */
    float *grad;       /* gradients */
    void *block;       /* private: the reference-counted allocation */
    /* 1 once a backward failed after adding part of its gradients: the
     * buffer then holds no whole sum, so the trainer and the stages refuse
     * to add more or to take an optimizer step until it is zeroed
     * (pp_flat_params_zero_grad clears it). */
    int grads_incomplete;
} pp_flat_params;

/* Moves the given float32 PARAM values of g (n of them, in this order) into
 * one buffer and makes g's values views of it. g may be freed before or
 * after the result. Errors name a value that is no float32 parameter. */
PP_API pp_status pp_flat_params_new(pp_graph *g, int n, const int *values, pp_flat_params **out);
PP_API void pp_flat_params_free(pp_flat_params *fp);

/* Index of a parameter by name, or -1. */
PP_API int pp_flat_params_find(const pp_flat_params *fp, const char *name);

/* Sets every gradient to zero (and clears grads_incomplete). */
PP_API void pp_flat_params_zero_grad(pp_flat_params *fp);
/* grad[i] += g (same number of elements; float32). Accumulating microbatch
 * gradients this way gives the full-batch gradient when each microbatch's
 * loss gradient was seeded with 1/M. */
PP_API pp_status pp_flat_params_accumulate(pp_flat_params *fp, int i, const pp_tensor *g);

/* New tensors (shape of parameter i) viewing parameter i or its gradient;
 * they keep the buffers alive. */
PP_API pp_status pp_flat_params_data_view(pp_flat_params *fp, int i, pp_tensor **out);
PP_API pp_status pp_flat_params_grad_view(pp_flat_params *fp, int i, pp_tensor **out);
/* A 1-D tensor viewing elements [off, off + len) of the parameters (grad
 * 0) or the gradients (grad 1), keeping the buffers alive (a
 * pp_flat_params filled in by hand, without the allocation
 * pp_flat_params_new makes, must outlive the view itself). */
PP_API pp_status pp_flat_params_range_view(pp_flat_params *fp, int grad, int64_t off, int64_t len,
                                           pp_tensor **out);

/* PP_OK, or PP_ERR_STATE naming who (e.g. "stage 1") when grads_incomplete
 * is set: what an optimizer step or a further backward checks first. */
PP_API pp_status pp_flat_params_check_grads(const pp_flat_params *fp, const char *who);

/* Copies src into parameter i (same element count; float32). */
PP_API pp_status pp_flat_params_set(pp_flat_params *fp, int i, const pp_tensor *src);

#ifdef __cplusplus
}
#endif
#endif

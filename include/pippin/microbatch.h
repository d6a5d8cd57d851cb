/* Microbatches: a batch split along dim 0 into M chunks (uneven chunks as
 * torch.tensor_split makes them: the first N % M chunks get one more row),
 * and outputs merged back by concatenation (scalars by their mean).
 *
 * Thread safety: reentrant; no shared state. */
#ifndef PIPPIN_MICROBATCH_H
#define PIPPIN_MICROBATCH_H

#include "pippin/export.h"

#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* chunks[i] (i < m) are views into t (no copy). Fewer than m rows is an
 * error; name is used in messages. */
PP_API pp_status pp_microbatch_split(pp_tensor *t, int m, const char *name, pp_tensor **chunks);
/* Size of chunk i of an n-row batch split into m. */
PP_API int64_t pp_microbatch_rows(int64_t n, int m, int i);
/* Concatenates m chunks along dim 0; 0-d chunks are averaged instead (a
 * loss that is the mean over its microbatch). */
PP_API pp_status pp_microbatch_merge(pp_tensor *const *chunks, int m, const char *name, pp_tensor **out);

#ifdef __cplusplus
}
#endif
#endif

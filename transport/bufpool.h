/* Buffers for reassembled tensors (internal to the transport).
 *
 * A tensor that arrives in several frames is copied into one buffer. Big
 * fresh buffers cost page faults on every byte (64 MiB is 16384 faults), so
 * freed buffers are kept for the next tensor of the same size, up to a
 * byte budget; buffers are mapped with transparent huge pages where the
 * kernel allows. Buffers may be returned from any thread and may outlive
 * the transport that made them. */
#ifndef PIPPIN_TRANSPORT_BUFPOOL_H
#define PIPPIN_TRANSPORT_BUFPOOL_H

#include <stddef.h>

#include "pippin/status.h"
#include "pippin/tensor.h"

typedef struct pp_bufpool pp_bufpool;

/* Keeps at most cache_bytes of free buffers (0: keeps none). */
pp_status pp_bufpool_new(size_t cache_bytes, pp_bufpool **out);
/* Drops the creator's reference; buffers still out free themselves. */
void pp_bufpool_release(pp_bufpool *p);
/* A new tensor of the given shape whose data comes from the pool (64-byte
 * aligned, not zeroed). */
pp_status pp_bufpool_tensor(pp_bufpool *p, pp_dtype dt, int ndim, const int64_t *shape,
                            pp_tensor **out);

#endif

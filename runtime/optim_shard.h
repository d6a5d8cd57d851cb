/* Internal: ZeRO-1 for data-parallel replicas (pp_replica_options'
 * shard_optimizer): a replica keeps optimizer state only for its shard of
 * a stage's flat parameters, the elements whose gradient sum it holds
 * after the ring's reduce-scatter (grad_ring.h, pp_grad_ring_shard), and
 * updates only those; the ring's all-gather then spreads the updated
 * parameters. SGD and AdamW update each element on its own, so the result
 * is the unsharded update's, bit for bit. Checkpoints stay unsharded: the
 * replicas' shards are put together (pp_optim_shard_put) into a whole
 * optimizer on replica 0, which writes it, and a resume takes each
 * replica's shard out of the whole one it loads (pp_optim_shard_take), so a
 * checkpoint resumes with any number of replicas, sharded or not. */
#ifndef PIPPIN_RUNTIME_OPTIM_SHARD_H
#define PIPPIN_RUNTIME_OPTIM_SHARD_H

#include "grad_ring.h"
#include "pippin/optim.h"
#include "pippin/params.h"

typedef struct pp_optim_shard {
    pp_ring_ranges r;   /* this replica's elements of the flat buffer */
    pp_optim *opt;      /* over r.count elements */
    float *p, *g;       /* scratch: the shard's parameters and gradients, contiguous */
} pp_optim_shard;

/* The shard of `replica` (o's ring layout) of fp, with an optimizer for it. */
pp_status pp_optim_shard_new(const pp_optim_config *c, const pp_grad_ring_options *o, int replica,
                             const pp_flat_params *fp, pp_optim_shard **out);
void pp_optim_shard_free(pp_optim_shard *s);
/* Updates the shard's elements of fp->data from fp->grad. */
pp_status pp_optim_shard_step(pp_optim_shard *s, pp_flat_params *fp);

/* Copies between a shard's state (n = r.count elements per state buffer,
 * as pp_optim_state numbers them) and a whole optimizer's (fp->total). */
void pp_ring_ranges_gather(const pp_ring_ranges *r, const float *whole, float *part);
void pp_ring_ranges_scatter(const pp_ring_ranges *r, const float *part, float *whole);
/* The shard's state and step count from whole (a resumed checkpoint). */
pp_status pp_optim_shard_take(pp_optim_shard *s, pp_optim *whole);

#endif

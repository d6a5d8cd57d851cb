/* Internal: the gradient all-reduce between data-parallel replicas of a
 * pipeline (pippin/executor.h, pp_executor_set_replicas). Each stage's
 * replicas form a ring over the transport. Once a stage's gradients of the
 * step are complete its flat gradient buffer is cut into buckets in reverse
 * parameter order (the first small, so the ring starts at once, then large
 * ones); each bucket is summed with a ring reduce-scatter then all-gather,
 * chunk by chunk (optionally in pieces sent on as they arrive, so the
 * phases overlap). Progress is made between the rank's other actions, so
 * the sums overlap the backward work still to run, and finished at the
 * step's end.
 *
 * The sum is deterministic: chunk c of every bucket is added up in the
 * fixed order replica c, c+1, ..., c-1 (mod R) whatever the timing, and
 * every replica ends with the same bits (the all-gather copies them).
 * Small buckets skip the ring: every replica sends its whole bucket to
 * every other and adds them up in that same order (one round trip).
 *
 * When every replica of a stage runs on this host, the stage's buckets are
 * summed through shared memory instead (grad_shm.h), with the same bits;
 * sharded (ZeRO-1), its reduce-scatter and all-gather go that way too.
 * Otherwise, over a plain tcp transport, the ring's chunks go over direct
 * TCP links between neighbouring replicas (grad_tcp.h), read and written
 * by this thread. Both ways take a stage's buckets one at a time, in
 * bucket order on every replica (whatever order they became ready in), so
 * that the replicas' rounds match.
 *
 * Chunks are sent straight from the flat buffers (no copy; the transport
 * copies into a shared-memory ring, or libzmq writes them out from there):
 * finish and gather return only once the transport has let go of them. */
#ifndef PIPPIN_RUNTIME_GRAD_RING_H
#define PIPPIN_RUNTIME_GRAD_RING_H

#include <stdint.h>

#include "pippin/params.h"
#include "pippin/transport.h"

/* The microbatch numbers of ring messages: PP_GRAD_RING_MICROBATCH + bucket
 * (no schedule uses them; agreements sit at 1 << 30). */
#define PP_GRAD_RING_MICROBATCH ((1 << 29) + (1 << 20))

typedef struct pp_grad_ring_options {
    pp_transport *t;
    int replicas, replica;      /* R and this rank's replica */
    int n_stages;               /* stages of one replica: world stage = replica * n_stages + stage */
    int64_t first_bucket_bytes; /* > 0 */
    int64_t bucket_bytes;       /* > 0 */
    /* ZeRO-1: the backward runs only the reduce-scatter; each replica then
     * updates its shard of the parameters (pp_grad_ring_shard) and
     * pp_grad_ring_gather all-gathers the parameters instead of the sums. */
    int shard;
    /* Buckets whose bytes times R - 1 are at most this are summed directly
     * (each replica sends the whole bucket to every other: one round trip
     * instead of 2(R - 1), the same bits). 0: 128 KiB; < 0: never. */
    int64_t direct_max_bytes;
    /* Replicas all on this host (as the transport sees them) sum through
     * shared memory instead (grad_shm.h: the same bits, no transport):
     * 0 when they can, < 0 never. Sharded too: reduce-scatter and
     * all-gather through the same segments. */
    int same_host;
    /* Shared memory: bytes each chunk moves per round; 0: 1 MiB. Every
     * replica must use the same. */
    int64_t shm_slot_bytes;
    /* Over the transport: a ring phase's chunk goes in pieces of at most
     * this many bytes, each sent on as soon as it is in (the phases
     * overlap); <= 0: whole chunks (grad_ring.c says why by default).
     * Every replica must use the same (a piece of another size is
     * refused, naming its replica). */
    int64_t piece_bytes;
    /* Replicas that cannot share memory sum over direct TCP links beside
     * the transport (grad_tcp.h: the same bits, no libzmq I/O thread) when
     * every one of them can (plain tcp transport, no CURVE): 0 when they
     * can, < 0 never (always through the transport). */
    int sockets;
} pp_grad_ring_options;

typedef struct pp_grad_ring pp_grad_ring;

pp_status pp_grad_ring_new(const pp_grad_ring_options *o, pp_grad_ring **out);
void pp_grad_ring_free(pp_grad_ring *g);

/* Starts a step: what an earlier (failed) step left is dropped. */
void pp_grad_ring_begin(pp_grad_ring *g, int64_t step);
/* Drops every stage's shared-memory group and direct links (between
 * steps): the next step's first bucket of each stage agrees again, keyed
 * by that step. Every replica must do it after the same step (one that
 * failed on any of them), or their groups' rounds no longer match. */
void pp_grad_ring_drop_groups(pp_grad_ring *g);
/* Stage `stage`'s gradients in fp are complete for the step: its buckets
 * join the ring (and the first of them is sent at once). fp must not change
 * until pp_grad_ring_finish returns. full (sharded rings): the gradients
 * are all-reduced whole anyway (a stage holding a copy of a tied parameter,
 * whose sum across stages comes after the replicas', as unsharded). */
pp_status pp_grad_ring_add(pp_grad_ring *g, int stage, pp_flat_params *fp, int full);
/* Moves every bucket on as far as what has arrived allows; never waits. */
pp_status pp_grad_ring_progress(pp_grad_ring *g);
/* Waits until every added bucket is summed (sharded: its reduce-scatter
 * is done), each receive at most timeout_ms (< 0: the transport's timeout),
 * then at most pp_grad_ring_settle_ms for the transport to let go of the
 * chunks it sent from fp. */
pp_status pp_grad_ring_finish(pp_grad_ring *g, int timeout_ms);
/* The longest wait of finish for chunks still out: timeout_ms, or (< 0)
 * the transport's configured timeout (it was 60 s whatever the config). */
int pp_grad_ring_settle_ms(const pp_grad_ring *g, int timeout_ms);
/* Sharded, after the update: every bucket's all-gather, of the parameters
 * (each replica sends the chunk it updated). Unsharded: nothing to do. */
pp_status pp_grad_ring_gather(pp_grad_ring *g, int timeout_ms);

/* Element ranges of a flat buffer, ascending within each bucket. */
typedef struct pp_ring_ranges {
    int n, cap;
    int64_t *lo, *len;
    int64_t count;      /* elements in all of them */
} pp_ring_ranges;
/* The elements of fp whose sum replica `replica` holds after the
 * reduce-scatter (its shard), for the ring's options o. */
pp_status pp_grad_ring_shard(const pp_grad_ring_options *o, int replica, const pp_flat_params *fp,
                             pp_ring_ranges *out);
void pp_ring_ranges_free(pp_ring_ranges *r);
/* Buckets added in the step so far (for tests and the log). */
int pp_grad_ring_buckets(const pp_grad_ring *g);
/* Of those, how many were summed through shared memory (grad_shm.h). */
int pp_grad_ring_shm_buckets(const pp_grad_ring *g);
/* Of those, how many went over direct links (grad_tcp.h). */
int pp_grad_ring_tcp_buckets(const pp_grad_ring *g);
/* Of those, how many were summed (their backward half) before the last
 * pp_grad_ring_finish had to wait: the overlap with compute. */
int pp_grad_ring_overlapped(const pp_grad_ring *g);

#endif

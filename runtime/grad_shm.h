/* Internal: the gradient sum of one stage's replicas when they all run on
 * this host, through shared memory instead of the transport (as MPI's
 * shared-memory collectives do). Used by the gradient ring (grad_ring.h)
 * in place of its chunks over the transport; the results are the ring's
 * bits: chunk c of a bucket is added up in the order replica c, c+1, ...,
 * c-1 (mod R), and every replica ends with the same sums.
 *
 * Agreement. At a stage's first bucket every replica offers the others
 * its segment (one message each over the transport, once per group): a
 * 0600 POSIX shared-memory object it created with the transport's host id
 * (pp_transport_host_id: same boot, /dev/shm, user; network namespaces
 * may differ), or "-" when it cannot (the transport keeps off shared
 * memory, no room in /dev/shm, or the ring told not to). Shared memory is
 * used only when every replica offered one with this replica's host id
 * (equality is transitive: every replica decides alike); otherwise the
 * stage keeps to the ring. A peer's segment is checked before use (this
 * user's, mode 0600, its size, header: the random key sent with the
 * offer, stage, replica, layout) and its name is unlinked by its owner
 * once every peer has mapped it (a crashed rank's name is removed by the
 * transport's sweep of dead processes' objects).
 *
 * Data. Each replica's segment holds two buffers of R slots of a fixed
 * number of floats. A bucket is summed in rounds: in round q every chunk
 * contributes its q-th slice. A replica copies the slices of the chunks it
 * does not own into its slots and says so (a counter in its header); the
 * owner of chunk c (replica c-1) adds up chunk c's slice from the others'
 * slots and its own gradients in the ring's order, writes the sum into its
 * gradients and its own slot and says so; then every replica copies the
 * sums it does not own from the owners' slots. Rounds alternate between
 * the two buffers, so a replica never overwrites a slot a peer may still
 * read (that peer has said it reached the next round first).
 *
 * ZeRO-1 (grad_ring.h's shard) uses the two halves alone: the
 * reduce-scatter is the rounds without the copies back (each replica ends
 * with the sum of the chunk it owns, chunk replica + 1, the ring's shard;
 * the rest of its buffer keeps its own values), and the all-gather of the
 * updated parameters is the rounds where each replica publishes the chunk
 * it owns and copies the others'. Each has one sync point per round.
 *
 * Slots have a page of slack: the owner puts a slice's data where its
 * address has the low 12 bits of the caller's buffer at that slice (the
 * skew, in the segment's header), so copies and sums between buffer and
 * slot never stall on loads that look like earlier stores 4 KiB away (4K
 * aliasing: a buffer at page + 16 bytes against page-aligned slots summed
 * 256 KiB at about half the speed of a page-aligned one).
 *
 * Waiting: a short spin on the peer's counter, then a futex wait in
 * slices; between slices the transport is polled, so a peer that is gone
 * (connection lost, closed, aborted) ends the wait at once with an error
 * naming its replica and rank; otherwise the wait ends at the timeout. */
#ifndef PIPPIN_RUNTIME_GRAD_SHM_H
#define PIPPIN_RUNTIME_GRAD_SHM_H

#include <stdint.h>

#include "pippin/transport.h"

typedef struct pp_grad_shm_options {
    pp_transport *t;
    int replicas, replica;
    int n_stages, stage;  /* world stage of replica k: k * n_stages + stage */
    int64_t slot_bytes;   /* floats per slot, in bytes; 0: 1 MiB. Every replica must use the same */
    int offer;            /* 0: offer "-" (never use shared memory) */
} pp_grad_shm_options;

typedef struct pp_grad_shm pp_grad_shm;

/* Creates this replica's segment (if it can) and sends its offer to every
 * other replica of the stage, for step's agreement; never waits. */
pp_status pp_grad_shm_new(const pp_grad_shm_options *o, int64_t step, pp_grad_shm **out);
void pp_grad_shm_free(pp_grad_shm *s);

/* Takes the peers' offers (wait 0: those that arrived; else waiting up to
 * timeout_ms for each). *decided is 1 once every offer is in: then
 * pp_grad_shm_in_use says whether the stage uses shared memory. */
pp_status pp_grad_shm_agree(pp_grad_shm *s, int wait, int timeout_ms, int *decided);
int pp_grad_shm_in_use(const pp_grad_shm *s);

/* Sums buf[off, off + len) over the replicas in place (the ring's order
 * and bits). One bucket at a time: call again with the same arguments
 * until *done; wait 0 never waits. bucket names it in errors. After an
 * error the group is unusable (pp_grad_shm_broken). */
pp_status pp_grad_shm_sum(pp_grad_shm *s, float *buf, int64_t off, int64_t len, int bucket, int wait,
                          int timeout_ms, int *done);

/* The collectives of pp_grad_shm_run: the whole sum; its reduce-scatter
 * (replica k ends with chunk k + 1 of the ring's chunks summed, bit for
 * bit the ring's, the rest of buf unchanged); the all-gather (replica k's
 * chunk k + 1 of buf to every other). */
enum { PP_SHM_SUM, PP_SHM_SCATTER, PP_SHM_GATHER };
/* pp_grad_shm_sum for any of them; every replica must run the same ones
 * on the same buckets in the same order. */
pp_status pp_grad_shm_run(pp_grad_shm *s, int mode, float *buf, int64_t off, int64_t len, int bucket, int wait,
                          int timeout_ms, int *done);
/* The step of the collectives that follow (from pp_grad_shm_new's step
 * on): part of what every replica's round must match, so a replica's
 * round of one step is never summed with a peer's round of another. */
void pp_grad_shm_set_step(pp_grad_shm *s, int64_t step);

/* 1 if a sum failed or is half done: the replicas' counters no longer
 * match, the group must be dropped (and agreed again). */
int pp_grad_shm_broken(const pp_grad_shm *s);

/* memcpy of n floats, except where dst is up to 63 bytes above src modulo
 * 4 KiB: there glibc's copy (rep movsb, up to 512 KiB on AMD Zen 3) ran
 * 10-16x slower (a 128 KiB chunk: 45 us instead of 3), and a backward
 * copy is used instead. */
void pp_grad_copy(float *dst, const float *src, int64_t n);

#endif

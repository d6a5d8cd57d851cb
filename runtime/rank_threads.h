/* Internal: a worker's side of the cores lent between the ranks of one
 * host (runtime/rank_threads.c, lib/core_share.c). */
#ifndef PIPPIN_RUNTIME_RANK_THREADS_H
#define PIPPIN_RUNTIME_RANK_THREADS_H

#include "pippin/config.h"

/* A worker opens: joins the host's core sharing as rank `rank` of config
 * c when c says share_cores, the rank and at least one other are on this
 * host (not inproc://), this process may use more CPUs than its own
 * threads, and no other worker of this process is open or ever was at the
 * same time (one worker's waits would lend the threads another computes
 * on; a second open stops the sharing for good). *joined: 1 when this call
 * joined. Failing to share is logged, never an error: the rank computes on
 * its own threads. Every call is paired with pp_rank_share_cores_done. */
void pp_rank_share_cores(const pp_config *c, int rank, int *joined);
/* The worker closes (joined: what pp_rank_share_cores said). */
void pp_rank_share_cores_done(int joined);

#endif

/* Internal: a worker's side of the cores lent between the ranks of one
 * host (runtime/rank_threads.c, lib/core_share.c). */
#ifndef PIPPIN_RUNTIME_RANK_THREADS_H
#define PIPPIN_RUNTIME_RANK_THREADS_H

#include "pippin/config.h"

/* Joins the host's core sharing as rank `rank` of config c when c says
 * share_cores, the rank and at least one other are on this host, and this
 * process may use more CPUs than its own threads. *joined: 1 when this call
 * joined (the caller leaves with pp_share_cores_leave on close). A process
 * already sharing for another worker stops sharing: the waits of one worker
 * would lend the threads another computes on. Failing to share is logged,
 * never an error: the rank computes on its own threads. */
void pp_rank_share_cores(const pp_config *c, int rank, int *joined);

#endif

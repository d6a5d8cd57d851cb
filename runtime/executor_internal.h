/* Internal: what the workers (runtime/worker.c) set on their executors
 * beyond the public API (pippin/executor.h). */
#ifndef PIPPIN_RUNTIME_EXECUTOR_INTERNAL_H
#define PIPPIN_RUNTIME_EXECUTOR_INTERNAL_H

#include "pippin/executor.h"

/* With replicas, every step ends with the ranks' vote on it (on by
 * default; pippin/executor.h). A worker turns it off: on a failed step it
 * aborts the transport, so its peers fail at once instead of waiting out
 * the vote, and rolls back with them (or ends the run). */
void pp_executor_set_step_vote(pp_executor *ex, int on);

#endif

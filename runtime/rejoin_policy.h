/* Internal: whether a rank's failed step can be recovered by rejoining
 * (runtime/worker.c asks; runtime/rejoin_policy.c decides), kept apart
 * from the transport so the rule is tested on its own
 * (test/runtime/test_rejoin_policy.c). */
#ifndef PIPPIN_REJOIN_POLICY_H
#define PIPPIN_REJOIN_POLICY_H

#include "pippin/status.h"
#include "pippin/transport.h"

/* The prefix of the abort a rank sends its peers when it rolls back to
 * rejoin; any other abort is an error that ends the run. */
#define PP_REJOIN_PREFIX "rejoin: "

/* s: the step's failure. abort_reason/abort_by: the abort a peer sent (or
 * this rank itself, abort_by == self), NULL when none. states: each rank's
 * peer state as the transport sees it now (n ranks; states[self] unused).
 * Recoverable: a peer died, restarted, went silent or stopped answering
 * (PP_ERR_PEER or PP_ERR_TIMEOUT with no abort, whatever the peers' states
 * show now: a peer reopening its transport in its own rejoin is up a
 * moment later), unless a peer refused this rank's key; or a peer rolled
 * back to rejoin (its abort says so). */
int pp_rejoin_recoverable(pp_status s, const char *abort_reason, int abort_by, int self,
                          const pp_peer_state *states, int n);

#endif

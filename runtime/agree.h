/* Internal: small agreements between the ranks of a run over their
 * transports (stop votes, the resume step, checkpoint commits, the run
 * identity). Each is keyed as a gradient message of the step with a
 * microbatch number no schedule uses (PP_AGREE_MICROBATCH + slot, the same
 * whatever each rank's microbatch count: ranks configured with different
 * counts still meet, and their identities tell them so) and a value name of
 * its own. */
#ifndef PIPPIN_RUNTIME_AGREE_H
#define PIPPIN_RUNTIME_AGREE_H

#include <stdint.h>

#include "pippin/schedule.h"
#include "pippin/transport.h"

typedef struct pp_agree {
    pp_transport *t;         /* NULL: a single process holds every stage (no one to ask) */
    /* The ranks of the run and which stage each runs, as the transport
     * numbers them (with data-parallel replicas: every replica's stages,
     * pp_executor_world_stage_ranks). */
    int nranks, nstages;
    const int *stage_rank;   /* [nstages] */
    int rank;
    int timeout_ms;          /* the stop vote and the identity, like any message */
    /* Checkpoint commits and resume wait for the slowest rank's disk; a
     * dead peer still fails them at once (heartbeats), so this may be long. */
    int long_timeout_ms;
} pp_agree;

/* The default long_timeout_ms: 5 minutes, or timeout_ms if longer. */
int pp_agree_long_timeout(int timeout_ms);

/* Agreement slots: the microbatch number is PP_AGREE_MICROBATCH + slot. */
#define PP_AGREE_MICROBATCH (1 << 30)
enum { PP_AGREE_STOP = 1, PP_AGREE_RESUME = 2, PP_AGREE_RESUME_OK = 3, PP_AGREE_CHECKPOINT = 4, PP_AGREE_IDENTITY = 5,
       PP_AGREE_STEP = 6 /* the executor's, with replicas: did every rank's step succeed */ };

/* Whether slot waits long_timeout_ms: the checkpoint and resume slots. */
static inline int pp_agree_slow(int slot) {
    return slot == PP_AGREE_CHECKPOINT || slot == PP_AGREE_RESUME || slot == PP_AGREE_RESUME_OK;
}

typedef struct pp_agree_result {
    int64_t lo, hi;          /* the smallest and largest value of all ranks */
    int who_lo, who_hi;      /* a rank with each */
} pp_agree_result;

/* Every rank tells every other rank `mine` and gets theirs. Sends go first,
 * so no rank waits on a rank that waits on it. */
pp_status pp_agree_int(const pp_agree *a, int64_t step, int slot, int64_t mine, pp_agree_result *r);

/* Every rank sends its bytes to every other; check(user, rank, bytes, n)
 * judges each peer's (an error from it is returned). Bytes are sent as a
 * uint8 tensor. */
typedef pp_status (*pp_agree_check_fn)(void *user, int rank, const uint8_t *bytes, size_t n);
pp_status pp_agree_bytes(const pp_agree *a, int64_t step, int slot, const uint8_t *mine, size_t n,
                         pp_agree_check_fn check, void *user);

#endif

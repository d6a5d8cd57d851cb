/* Internal: small agreements between the ranks of a run over their
 * transports (stop votes, the resume step, checkpoint commits, the run
 * identity). Each is keyed as a gradient message of a microbatch number past
 * the step's last (which data never uses) with a value name of its own. */
#ifndef PIPPIN_RUNTIME_AGREE_H
#define PIPPIN_RUNTIME_AGREE_H

#include <stdint.h>

#include "pippin/schedule.h"
#include "pippin/transport.h"

typedef struct pp_agree {
    pp_transport *t;         /* NULL: a single process holds every stage (no one to ask) */
    const pp_schedule *sched;
    int rank;
    int microbatches;
    int timeout_ms;
} pp_agree;

/* Agreement slots: the microbatch number is microbatches + slot. */
enum { PP_AGREE_STOP = 1, PP_AGREE_RESUME = 2, PP_AGREE_RESUME_OK = 3, PP_AGREE_CHECKPOINT = 4, PP_AGREE_IDENTITY = 5 };

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

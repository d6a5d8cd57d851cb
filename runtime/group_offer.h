/* Internal: the one-message agreements of a stage's replicas (the shared
 * memory of grad_shm.c, the direct links of grad_tcp.c): each replica sends
 * every other a short text, and takes each one's. Keyed by the group's
 * step, a microbatch number of the agreement's own and a name, from and to
 * the replicas' world stages, so that agreements of different steps or
 * kinds never mix. */
#ifndef PIPPIN_RUNTIME_GROUP_OFFER_H
#define PIPPIN_RUNTIME_GROUP_OFFER_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/transport.h"

typedef struct pp_group_offer {
    pp_transport *t;
    int64_t step;
    int microbatch;      /* the agreement's (PP_GRAD_RING_MICROBATCH - k) */
    const char *name;    /* "pippin:shm:offer", ... */
    const char *what;    /* for errors: "shared memory", "a direct link" */
    int replicas, replica;
    int n_stages, stage; /* world stage of replica k: k * n_stages + stage */
} pp_group_offer;

/* Sends text to every other replica. */
pp_status pp_group_offer_send(const pp_group_offer *g, const char *text);
/* Takes replica from's text into text (cap bytes; "" when it is not one
 * that fits); wait 0: only if it arrived (*got says), else up to
 * timeout_ms. */
pp_status pp_group_offer_take(const pp_group_offer *g, int from, int wait, int timeout_ms, char *text, size_t cap,
                              int *got);

#endif

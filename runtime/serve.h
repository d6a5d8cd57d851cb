/* Internal: a standing pipeline that answers requests (mode: serve,
 * docs/serving.md). The rank holding stage 0 is the front: a thread of its
 * own takes requests on a ZeroMQ ROUTER socket, checks them against the
 * model's inputs and hands them to the rank's thread, which merges
 * compatible ones into batches and starts each as a step of the executor
 * (step number = batch number); the other ranks run the same steps as their
 * inputs arrive, so several batches are in the pipeline at once. The ranks
 * computing model outputs send them back to the front, which splits them per
 * request and answers. */
#ifndef PIPPIN_RUNTIME_SERVE_H
#define PIPPIN_RUNTIME_SERVE_H

#include <stdatomic.h>

#include "pippin/config.h"
#include "pippin/executor.h"
#include "pippin/pipe.h"
#include "pippin/schedule.h"
#include "pippin/transport.h"
#include "serve_front.h"

typedef struct pp_serve_ctx {
    const pp_config *c;
    const pp_pipe *p;
    const pp_schedule *sched;
    pp_executor *ex;
    pp_transport *t;
    int rank;
    atomic_int *stop;        /* set from any thread: drain and return */
    pp_serve_front *front;   /* the rank holding stage 0's endpoint (it outlives the run); else NULL */
} pp_serve_ctx;

/* Opens the front endpoint when this rank holds stage 0 (*out NULL on the
 * others). */
pp_status pp_serve_front_for(const pp_config *c, const pp_schedule *sched, int rank, pp_serve_front **out);

/* Serves until *stop (the front then tells the other ranks to end) or a
 * peer fails: then the front endpoint stays up, answering "degraded", its
 * sessions are lost, and the caller may rejoin and serve again. */
pp_status pp_serve_run(const pp_serve_ctx *x);

#endif

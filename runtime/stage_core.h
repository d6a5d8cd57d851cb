/* Internal: the execution core shared by the local runner (runner.c: every
 * stage in one process) and the executor (executor.c: one rank's stages over
 * a transport). It owns a set of stages and implements, once, what a step
 * does with them: microbatch splitting of the model inputs, the F, I and W
 * actions, the bookkeeping that catches bad schedules, the sum of replicated
 * parameters' gradients, merging the model outputs and the optimizer step.
 * Only the routing of activations and gradients between stages differs; it
 * goes through a pp_route. With the same schedule the two give the same bits
 * by construction. */
#ifndef PIPPIN_RUNTIME_STAGE_CORE_H
#define PIPPIN_RUNTIME_STAGE_CORE_H

#include <stdint.h>

#include "pippin/optim.h"
#include "pippin/pipe.h"
#include "pippin/sched_trace.h"
#include "pippin/schedule.h"
#include "pippin/stage.h"

/* Where tensors go between stages. Edges are pipe edges produced by a stage
 * (model inputs never reach the route); `consumer` and `producer` are stage
 * indices. A send borrows the tensor; a receive returns a new reference.
 * The ready hooks say whether a receive would find its tensor now; a route
 * whose receives block (the transport) leaves them NULL. */
typedef struct pp_route {
    void *ctx;
    int (*act_ready)(void *ctx, int e, int mb, int consumer);
    pp_status (*send_act)(void *ctx, int e, int mb, int consumer, pp_tensor *t);
    pp_status (*recv_act)(void *ctx, int e, int mb, int consumer, pp_tensor **out);
    /* Every consumer's gradient of edge e is there. */
    int (*grads_ready)(void *ctx, int e, int mb);
    /* The gradient of edge e from `consumer`, to the edge's producer. */
    pp_status (*send_grad)(void *ctx, int e, int mb, int consumer, pp_tensor *g);
    pp_status (*recv_grad)(void *ctx, int e, int mb, int consumer, pp_tensor **out);
    /* What replica stage `from` added this step to replicated parameter
     * `shared` (an index into the pipe's shared list), for stage `to`. Only
     * called between stages that are not both in this core. */
    pp_status (*send_delta)(void *ctx, int shared, int from, int to, pp_tensor *d);
    pp_status (*recv_delta)(void *ctx, int shared, int from, int to, pp_tensor **out);
} pp_route;

/* A local stage's values as pipe edges, looked up once: per forward input
 * its edge; per forward output the edge it produces (-1: none) and the
 * model output it is (-1: none); per incoming gradient (an output's) and
 * outgoing gradient (an input's) the edge. */
typedef struct pp_core_links {
    int *in_edge, *out_edge, *out_model, *gout_edge, *gin_edge;
} pp_core_links;

/* A send held back until its download (a device stage's output on the
 * copy stream) is done: an activation (grad 0) of edge e to `peer` (the
 * consumer), or a gradient (grad 1) of edge e from `peer`. */
typedef struct pp_core_send {
    int grad, e, mb, peer;
    pp_tensor *t;
} pp_core_send;

typedef struct pp_core {
    pp_pipe *p;
    int training;
    /* Data-parallel replicas (pp_executor_set_replicas): the loss is seeded
     * with 1/(m * replicas) and random streams key microbatches from
     * replica * m. 1 and 0 without replicas. */
    int replicas, replica;
    int n_stages;       /* the pipe's */
    pp_stage **stages;  /* [n_stages]: NULL where not in this core */
    pp_optim **optims;  /* [n_stages] */
    pp_core_links *links; /* [n_stages]: set for local stages */
    int n_local;
    int *local;         /* indices of this core's stages, ascending */
    pp_trace *trace;    /* NULL: not recording */
    double trace_origin_ms;
    double inputs_ms;     /* when the running F or I/B had its inputs (0: no receive) */
    double compute_ms;    /* time in the stages' kernels (forward, backward), for serving's stats */
    /* The step in progress (pp_core_step_begin .. pp_core_step_end). */
    int64_t step;
    int m;
    pp_tensor **chunks;               /* [edge * m + mb]: model inputs */
    pp_tensor **outs;                 /* [output * m + mb] */
    uint8_t *done_f, *done_i, *done_w; /* [stage * m + mb] */
    pp_tensor **snap;                 /* [shared]: replicated gradients before the step */
    int shared_synced;                /* pp_core_sync_shared ran this step */
    /* Sends of device stages' outputs whose downloads are in flight, in
     * order: they go out after the next action's compute is queued (so
     * the copy overlaps it), before a receive that may block, when an
     * action is not ready, and at the step's end. A CPU stage's outputs
     * are sent at once, as before, unless sends are held before them. */
    pp_core_send *pending;
    int n_pending, cap_pending;
} pp_core;

/* Builds the stages of p that `rank` runs under sched (rank -1: all of
 * them); their graphs move out of p, which must outlive the core. */
pp_status pp_core_init(pp_core *c, pp_pipe *p, const pp_schedule *sched, int rank, int training);
void pp_core_free(pp_core *c);

/* Starts a step of m microbatches: loss scale 1/m, the model inputs this
 * core's stages read split into microbatches (names[i] names inputs[i]; an
 * input no local stage reads may be missing), and the replicated
 * parameters' gradients noted. */
pp_status pp_core_step_begin(pp_core *c, int64_t step, int m, int n_inputs, const char *const *names,
                             pp_tensor *const *inputs);
/* Runs one F, I, B or W action (others are no-ops) of a local stage, on
 * `rank` for the trace. *ran is 0 when its inputs are not there yet (only a
 * route with ready hooks says so). The trace gets the action from when its
 * inputs were there to its end (its sends included, but those of a device
 * stage, which go out with the next action: see pending) and, when it had
 * to wait for them, the wait as RECV_F / RECV_B on the communication lane. */
pp_status pp_core_run_action(pp_core *c, const pp_route *r, int rank, const pp_action *a, int *ran);
/* 1 once every weight gradient of local stage s ran this step (training). */
int pp_core_weights_done(const pp_core *c, int s);
/* Sums the replicated parameters' gradients across their stages (once a
 * step; pp_core_step_end does it if no one did before). */
pp_status pp_core_sync_shared(pp_core *c, const pp_route *r);
/* Waits for the held-back sends' downloads and sends them, in order. */
pp_status pp_core_flush_sends(pp_core *c, const pp_route *r);
/* Ends the step: every local forward (and, training, backward) ran, the
 * replicated parameters' gradients are summed across their stages, and
 * outputs[o] (may be NULL) gets model output o merged over microbatches
 * when a local stage computes it, else NULL. On failure the stages drop
 * what the step left pending. Frees the step's state either way. */
pp_status pp_core_step_end(pp_core *c, const pp_route *r, pp_status s, pp_tensor **outputs);

void pp_core_zero_grad(pp_core *c);
pp_status pp_core_set_optimizer(pp_core *c, const pp_optim_config *cfg);
pp_status pp_core_optimizer_step(pp_core *c);
/* PP_ERR_STATE when a local stage's gradients are incomplete (pp_stage_check_grads). */
pp_status pp_core_check_grads(const pp_core *c);

#endif

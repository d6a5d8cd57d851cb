/* Timed simulation of a schedule against a cost model.
 *
 * Each rank runs its actions in order; an action starts when the rank is
 * free and its inputs are there: F(s,m) needs F(s-1,m)'s output, I/B(s,m)
 * needs the input gradient from I/B(s+1,m), each delayed by the link
 * (latency + bytes / bandwidth) when the two stages are on different
 * ranks. Transfers overlap with compute and with each other. In a lowered
 * schedule the explicit SEND/RECV actions carry these dependencies instead:
 * SEND is asynchronous, RECV blocks until the data has arrived.
 * libc only.
 *
 * Thread safety: reentrant; cost models and results belong to their caller. */
#ifndef PIPPIN_SCHED_SIM_H
#define PIPPIN_SCHED_SIM_H

#include "pippin/export.h"

#include "pippin/sched_trace.h"
#include "pippin/schedule.h"
#include "pippin/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_cost_model {
    int nstages;
    double *f;            /* [nstages] forward time */
    double *i;            /* [nstages] backward-input time */
    double *w;            /* [nstages] backward-weight time; B = I + W */
    double latency;       /* per transfer between ranks */
    double bandwidth;     /* bytes per time unit; 0 = infinite */
    double *edge_bytes;   /* [nstages] bytes per microbatch from stage s to
                             s+1 (its gradient goes back with the same size) */
    double *stash_bytes;  /* [nstages] bytes kept per microbatch from F until I/B */
    double *wstash_bytes; /* [nstages] bytes kept from I until W */
    /* Activation recomputation (appended; allocated by pp_cost_model_new): */
    unsigned char *recompute; /* [nstages] 1: the stage keeps only its inputs
                                 from F to I/B and runs F again right before
                                 I/B, so I/B costs F more */
    double *input_bytes;      /* [nstages] bytes of the stage's inputs per
                                 microbatch, what a recomputing stage keeps;
                                 < 0 (the default): edge_bytes of the stage
                                 before (0 for stage 0) */
} pp_cost_model;

/* F = I = W = 1 on every stage, no communication cost, no bytes. */
PP_API pp_status pp_cost_model_new(int nstages, pp_cost_model **out);
PP_API void pp_cost_model_free(pp_cost_model *c);
/* Parses "F=1,I=1,W=1,c=0": keys F, I, W, B (full backward: I = B - W, or
 * I = W = B/2 when neither is given), c (latency), bw (bandwidth), bytes
 * (edge_bytes), mem (stash_bytes), wmem (wstash_bytes), rc (recompute: 0
 * or 1), in (input_bytes). A value is a number or a colon-separated list
 * with one number per stage ("F=1:2:1:1"). Keys not given keep the defaults
 * of pp_cost_model_new. */
PP_API pp_status pp_cost_model_parse(const char *spec, int nstages, pp_cost_model **out);
/* Time to move one microbatch's activation (or gradient) across the edge
 * from stage s to s+1 when the two are on different ranks. */
PP_API double pp_cost_model_xfer(const pp_cost_model *c, int s);
/* What stage s's backward-input (I, or the I part of B) takes: I, plus F
 * when the stage recomputes. */
PP_API double pp_cost_model_backward_input(const pp_cost_model *c, int s);
/* Bytes stage s keeps per microbatch from F until I/B: its input bytes when
 * it recomputes, else stash_bytes. */
PP_API double pp_cost_model_stash(const pp_cost_model *c, int s);
/* Bytes a recomputing stage s holds on top of that while I/B runs (the
 * stash the second forward rebuilds, beyond the inputs); 0 otherwise. */
PP_API double pp_cost_model_recompute_extra(const pp_cost_model *c, int s);

typedef struct pp_sim_result {
    int nranks;
    double makespan;     /* end of the last action */
    double total_busy;
    double *busy;        /* [nranks] compute time */
    double *bubble;      /* [nranks] 1 - busy / makespan */
    double *first_start; /* [nranks] start of the first compute action */
    double *last_end;    /* [nranks] end of the last compute action */
    int *peak_act;       /* [nranks] most microbatch-stages between F and I/B */
    int *peak_wpend;     /* [nranks] most backward-weights waiting (I done, W not) */
    double *peak_bytes;  /* [nranks] most stash + wstash bytes held at once */
} pp_sim_result;

/* Simulates s (costs NULL: unit costs, no comm). With trace != NULL every
 * action and transfer is appended to it. Fails on a deadlock, naming the
 * stuck rank and action. */
PP_API pp_status pp_simulate(const pp_schedule *s, const pp_cost_model *costs, pp_trace *trace,
                      pp_sim_result **out);
PP_API void pp_sim_result_free(pp_sim_result *r);
/* Longest per-rank span (last_end - first_start). */
PP_API double pp_sim_result_span(const pp_sim_result *r);

#ifdef __cplusplus
}
#endif
#endif

/* Balanced stages: per-node costs of a model measured on a sample batch,
 * and the cut points that make the slowest stage as fast as possible
 * (`pippin split --auto N`, config `split: {auto: N}`; docs/pipeline.md).
 *
 * A cut is a position in the graph's node order: "before node k". What
 * crosses it becomes a stage edge (pp_split_spec.cut_at hands the positions
 * to pp_pipe_split, which handles cross edges and shared parameters).
 *
 * Thread safety: reentrant; results belong to their caller. */
#ifndef PIPPIN_BALANCE_H
#define PIPPIN_BALANCE_H

#include "pippin/export.h"

#include <stdint.h>

#include "pippin/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ partition */

/* Items in order (a model's compute nodes), to be cut into n_parts
 * contiguous non-empty parts. A part from item a to item b-1 costs
 * sum(cost[a..b-1]) + cut_cost[a] + cut_cost[b] (cut_cost[0] and
 * cut_cost[n] are ignored: no cut there). With a memory cap, part j of S
 * needs sum(param_bytes) + sum(stash_bytes) * min(in_flight, S - j) <=
 * memory_cap (1F1B keeps S - j microbatches' stashes on stage j). */
typedef struct pp_balance_problem {
    int n;
    const double *cost;         /* [n] */
    const double *cut_cost;     /* [n+1] or NULL: cuts are free */
    const double *param_bytes;  /* [n] or NULL */
    const double *stash_bytes;  /* [n] or NULL: per microbatch */
    int in_flight;              /* microbatches per step (M); <= 0: 1 */
    double memory_cap;          /* bytes; <= 0: no cap */
} pp_balance_problem;

/* The partition with the smallest largest part cost (ties: the earliest
 * cuts), by dynamic programming over the order. starts[j] (n_parts-1
 * entries) receives the first item of part j+1; *max_cost the largest part
 * cost (may be NULL). Errors: n_parts < 1 or more parts than items (names
 * both counts), no partition within the memory cap (names the cap). */
PP_API pp_status pp_balance_partition(const pp_balance_problem *pb, int n_parts, int *starts, double *max_cost);

/* --------------------------------------------------------- node costs */

typedef enum pp_cost_source {
    PP_COST_MEASURED = 0, /* wall time of each node's forward and of its gradient nodes */
    PP_COST_FLOPS = 1     /* counted work (deterministic): the same on every rank */
} pp_cost_source;

typedef struct pp_node_costs_options {
    int batch;                 /* the sample batch (dim 0 of inputs whose dim 0 is dynamic); default 8 */
    int n_dims;                /* other symbolic input dims, "name=N"; others get 1 */
    const char *const *dims;
    const char *loss;          /* NULL: "loss", else the only float scalar output */
    int repeats;               /* timed runs (the fastest counts); default 3 */
    pp_cost_source source;
} pp_node_costs_options;

PP_API void pp_node_costs_options_init(pp_node_costs_options *o);

/* Costs per node of the graph it was measured on (same node indices). */
typedef struct pp_node_costs {
    int n_nodes;
    uint8_t *compute;      /* 1: a node a stage can start at (not a constant sub-graph) */
    double *fwd_ms;        /* forward time (FLOPS: millions of operations) */
    double *bwd_ms;        /* its gradient nodes' time (FLOPS: the same unit) */
    int64_t *param_bytes;  /* parameters first read by the node */
    int64_t *stash_bytes;  /* per microbatch of the sample batch: values the backward keeps, by reader */
    int64_t *cross_bytes;  /* [n_nodes+1]: activation bytes crossing a cut before node k */
    int batch;
    pp_cost_source source;
} pp_node_costs;

/* Runs a training step of g (forward and the autodiff backward, on zero
 * inputs at the sample sizes) and fills the per-node costs. g is not
 * modified. Errors name the node that failed. */
PP_API pp_status pp_node_costs_measure(const pp_graph *g, const pp_node_costs_options *o, pp_node_costs **out);
PP_API void pp_node_costs_free(pp_node_costs *c);

/* ------------------------------------------------------------- plans */

typedef struct pp_balance_options {
    int n_stages;
    int microbatches;       /* in flight per stage for the memory term (1F1B); default 1 */
    double memory_cap;      /* bytes per stage; <= 0: no cap */
    double bytes_per_ms;    /* link bandwidth for the cut term; <= 0: cuts cost nothing */
} pp_balance_options;

PP_API void pp_balance_options_init(pp_balance_options *o, int n_stages);

/* Cut points and what each stage costs. */
typedef struct pp_balance_plan {
    int n_stages;
    int *cut_at;            /* [n_stages-1] node indices: stage k+1 starts before node cut_at[k] */
    double *fwd_ms, *bwd_ms;/* [n_stages] */
    double *comm_ms;        /* [n_stages] its cuts' transfer time (both directions) */
    int64_t *param_bytes, *stash_bytes; /* [n_stages]; stash per microbatch */
    int64_t *cut_bytes;     /* [n_stages-1] activation bytes crossing each cut */
    double max_ms;          /* the slowest stage's fwd + bwd + comm */
} pp_balance_plan;

/* The min-max plan (pp_balance_partition over the compute nodes). */
PP_API pp_status pp_balance_plan_auto(const pp_node_costs *c, const pp_balance_options *o, pp_balance_plan **out);
/* The same number of compute nodes per stage. */
PP_API pp_status pp_balance_plan_even(const pp_node_costs *c, const pp_balance_options *o, pp_balance_plan **out);
/* The costs of given cuts (ascending node indices, e.g. a model's markers). */
PP_API pp_status pp_balance_plan_eval(const pp_node_costs *c, const pp_balance_options *o, int n_cuts,
                                      const int *cut_at, pp_balance_plan **out);
PP_API void pp_balance_plan_free(pp_balance_plan *p);

#ifdef __cplusplus
}
#endif
#endif

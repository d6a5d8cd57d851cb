/* split: {auto: N} in a config: the cut positions every rank computes. */
#ifndef PIPPIN_RUNTIME_SPLIT_AUTO_H
#define PIPPIN_RUNTIME_SPLIT_AUTO_H

#include "pippin/config.h"
#include "pippin/graph.h"

/* The c->split_auto - 1 cuts (node indices, malloc'd into *cut_at) of g,
 * balanced on counted operations (deterministic: every rank gets the same
 * cuts) at the microbatch size batch_size / microbatches. */
pp_status pp_config_auto_cuts(const pp_config *c, const pp_graph *g, int **cut_at, int *n_cuts);

#endif

/* What the partitioner shares with the balancer (stages/balance.c,
 * stages/node_costs.c). */
#ifndef PIPPIN_STAGES_SPLIT_INTERNAL_H
#define PIPPIN_STAGES_SPLIT_INTERNAL_H

#include <stdint.h>

#include "pippin/graph.h"

/* compute[i] (one byte per node) = 1 for the nodes a stage owns: not a
 * PipeSplit marker cut at (unless ignore_markers), not computed from
 * constants alone (those are copied into every stage that reads them). */
pp_status pp_split_compute_nodes(const pp_graph *g, int ignore_markers, uint8_t *compute);

#endif

/* Internal: pp_autodiff without the training fusions it runs first
 * (pp_graph_optimize_for_training), for a caller that maps the graph's
 * first nodes onto the model's own, one to one (stages/node_costs.c times
 * each model node). Not installed. */
#ifndef PIPPIN_AUTODIFF_UNFUSED_H
#define PIPPIN_AUTODIFF_UNFUSED_H

#include "pippin/autodiff.h"

pp_status pp_autodiff_unfused(pp_graph *g, const pp_backward_spec *spec, pp_backward **out);
pp_status pp_autodiff_model_unfused(pp_graph *g, const char *loss_name, int wrt_float_inputs, pp_backward **out);

#endif

/* Command-line glue for the local pipeline runner. */
#include "pipe_cli.h"

#include <stdlib.h>
#include <string.h>

#include "status_internal.h"
#include "param_files.h"
int pp_cli_has_markers(const pp_graph *g) {
    for (int i = 0; i < g->n_nodes; i++)
        if (strcmp(g->nodes[i].op_type, "PipeSplit") == 0 && strcmp(g->nodes[i].domain, "pippin") == 0) return 1;
    return 0;
}

pp_status pp_cli_schedule_needs_stages(const char *schedule, int staged, int no_split, const char *hint) {
    if (!schedule || staged) return PP_OK;
    if (no_split)
        return pp_error(PP_ERR_INVALID, "--schedule %s: --no-split runs the model whole, with no stages to schedule; "
                        "drop one of the two", schedule);
    return pp_error(PP_ERR_INVALID, "--schedule %s: the model has no stages (no pipe-split markers, no "
                    "--split-before/--split-after); give it stages with --split-before PREFIX or "
                    "--split-after PREFIX (a node-name prefix such as /fc2/), or drop --schedule%s", schedule,
                    hint ? hint : "");
}

pp_status pp_cli_open_pipeline(pp_graph *g, const pp_split_args *sa, int training, pp_pipe **pipe,
                               pp_runner **runner) {
    pp_split_spec spec = pp_split_args_spec(sa);
    *runner = NULL;
    PP_TRY(pp_pipe_split_take(g, &spec, pipe));
    /* The stages hold their own references now: with g's, each parameter
     * would stay alive beside the copy a training stage's flat buffer makes. */
    for (int v = 0; v < g->n_values; v++) {
        pp_tensor_free(g->values[v].data);
        g->values[v].data = NULL;
    }
    pp_status s = pp_pipe_probe_shapes(*pipe, sa->n_dims, sa->dims);
    if (s == PP_OK) s = pp_runner_new(*pipe, training, runner);
    if (s != PP_OK) {
        pp_pipe_free(*pipe);
        *pipe = NULL;
    }
    return s;
}

pp_status pp_cli_runner_step(pp_runner *r, int m, const pp_schedule *sched, const pp_named_tensors *in,
                             pp_tensor **outputs) {
    return pp_runner_step(r, m, sched, in->n, (const char *const *)in->names, in->tensors, outputs);
}

pp_status pp_cli_save_runner_params(const pp_pipe *p, pp_runner *r, const char *dir, const char *prefix, int grads,
                                    int *count) {
    int n = pp_runner_n_stages(r);
    pp_stage **stages = calloc((size_t)n + 1, sizeof *stages);
    if (!stages) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int s = 0; s < n; s++) stages[s] = pp_runner_stage(r, s);
    pp_status st = pp_save_stage_params(p, n, stages, dir, prefix, grads, count);
    free(stages);
    return st;
}

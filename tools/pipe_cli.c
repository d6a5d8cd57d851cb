/* Command-line glue for the local pipeline runner. */
#include "pipe_cli.h"

#include <stdlib.h>
#include <string.h>

#include "status_internal.h"
int pp_cli_has_markers(const pp_graph *g) {
    for (int i = 0; i < g->n_nodes; i++)
        if (strcmp(g->nodes[i].op_type, "PipeSplit") == 0 && strcmp(g->nodes[i].domain, "pippin") == 0) return 1;
    return 0;
}

pp_status pp_cli_open_pipeline(const pp_graph *g, const pp_split_args *sa, int training, pp_pipe **pipe,
                               pp_runner **runner) {
    pp_split_spec spec = pp_split_args_spec(sa);
    *runner = NULL;
    PP_TRY(pp_pipe_split(g, &spec, pipe));
    pp_status s = pp_pipe_probe_shapes(*pipe, sa->n_dims, sa->dims);
    if (s == PP_OK) s = pp_runner_new(*pipe, training, runner);
    if (s != PP_OK) {
        pp_pipe_free(*pipe);
        *pipe = NULL;
    }
    return s;
}

pp_status pp_cli_schedule(const char *kind, int n_stages, int m, pp_schedule **out) {
    *out = NULL;
    if (!kind) return PP_OK;
    if (strncmp(kind, "csv:", 4) == 0) {
        PP_TRY(pp_schedule_load_csv(kind + 4, out));
    } else {
        pp_sched_params sp = {0};
        PP_TRY(pp_sched_kind_parse(kind, &sp.kind));
        int spr = pp_sched_default_stages_per_rank(sp.kind);
        if (n_stages % spr != 0)
            return pp_error(PP_ERR_INVALID, "schedule '%s' puts %d stages on each rank; the pipe has %d stages",
                            kind, spr, n_stages);
        sp.nranks = n_stages / spr;
        sp.nmb = m;
        sp.stages_per_rank = spr;
        PP_TRY(pp_schedule_generate(&sp, out));
    }
    pp_status s = pp_schedule_validate(*out, NULL);
    if (s == PP_OK && (*out)->nstages != n_stages)
        s = pp_error(PP_ERR_INVALID, "schedule '%s' has %d stages; the pipe has %d", kind, (*out)->nstages, n_stages);
    if (s != PP_OK) {
        pp_schedule_free(*out);
        *out = NULL;
    }
    return s;
}

pp_status pp_cli_runner_step(pp_runner *r, int m, const pp_schedule *sched, const pp_named_tensors *in,
                             pp_tensor **outputs) {
    return pp_runner_step(r, m, sched, in->n, (const char *const *)in->names, in->tensors, outputs);
}

/* A replicated parameter is written once, from the first stage listed for
 * it in the pipe (every copy is equal). */
static int writes_param(const pp_pipe *p, int stage, const char *name) {
    for (int i = 0; i < p->n_shared; i++)
        if (strcmp(p->shared[i].name, name) == 0) return p->shared[i].stages[0] == stage;
    return 1;
}

pp_status pp_cli_save_stage_params(const pp_pipe *p, int n, pp_stage *const *stages, const char *dir,
                                   const char *prefix, int grads, int *count) {
    PP_TRY(pp_cli_mkdirs(dir));
    int saved = 0;
    for (int s = 0; s < n; s++) {
        pp_flat_params *fp = pp_stage_params(stages[s]);
        for (int i = 0; fp && i < fp->n; i++) {
            if (!writes_param(p, pp_stage_index(stages[s]), fp->names[i])) continue;
            pp_tensor *t;
            PP_TRY(grads ? pp_flat_params_grad_view(fp, i, &t) : pp_flat_params_data_view(fp, i, &t));
            pp_status st = pp_cli_save_named(dir, prefix, fp->names[i], t);
            pp_tensor_free(t);
            PP_TRY(st);
            saved++;
        }
    }
    if (count) *count = saved;
    return PP_OK;
}

pp_status pp_cli_save_runner_params(const pp_pipe *p, pp_runner *r, const char *dir, const char *prefix, int grads,
                                    int *count) {
    int n = pp_runner_n_stages(r);
    pp_stage **stages = calloc((size_t)n + 1, sizeof *stages);
    if (!stages) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int s = 0; s < n; s++) stages[s] = pp_runner_stage(r, s);
    pp_status st = pp_cli_save_stage_params(p, n, stages, dir, prefix, grads, count);
    free(stages);
    return st;
}

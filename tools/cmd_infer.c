/* pippin infer: runs a model on .npy inputs and writes every graph output as
 * DIR/<output name>.npy. A model with pipe-split markers (or a split spec)
 * runs stage by stage, microbatch by microbatch, through the local runner. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "pipe_cli.h"
#include "pippin/pippin.h"

#include "status_internal.h"
static void infer_usage(FILE *f) {
    fprintf(f,
            "usage: pippin infer MODEL.onnx --input NAME=FILE.npy ... --output-dir DIR\n"
            "                    [--microbatches M] [--schedule KIND]\n"
            "                    [--split-before PREFIX]... [--split-after PREFIX]... [--no-split]\n"
            "                    [--freeze PATTERN]... [--no-optimize]\n"
            "Runs the model on the CPU and writes DIR/<output name>.npy for each graph output\n"
            "('/' and ':' in names become '_'). A model with pippin::PipeSplit markers, or\n"
            "one given a split spec, runs through its stages with the batch cut into M\n"
            "microbatches (default 1) in the order of schedule KIND (default gpipe).\n"
            "The graph is optimized first (constant folding, fused MatMul+bias+activation,\n"
            "GELU; pippin/optimize.h); --no-optimize (or PIPPIN_OPTIMIZE=0) runs it as loaded.\n");
}

typedef struct {
    const char *out_dir, *schedule;
    int microbatches, no_split;
    pp_split_args split;
} infer_opts;

static int write_outputs(const char *dir, int n, const char *const *names, pp_tensor **outs) {
    if (pp_mkdirs(dir) != PP_OK) return 1;
    for (int i = 0; i < n; i++) {
        char safe[512], path[4096], shape[128];
        pp_file_safe_name(names[i], safe, sizeof safe);
        snprintf(path, sizeof path, "%s/%s.npy", dir, safe);
        if (pp_npy_save(path, outs[i]) != PP_OK) return 1;
        printf("%s: %s%s -> %s\n", names[i], pp_dtype_name(outs[i]->dtype),
               pp_shape_str(outs[i]->ndim, outs[i]->shape, shape, sizeof shape), path);
    }
    return 0;
}

static int infer_unsplit(pp_graph *g, const pp_named_tensors *in, const char *dir) {
    pp_tensor **feeds = calloc((size_t)g->n_inputs + 1, sizeof *feeds);
    pp_tensor **outs = calloc((size_t)g->n_outputs + 1, sizeof *outs);
    const char **names = calloc((size_t)g->n_outputs + 1, sizeof *names);
    int rc = 1;
    if (!feeds || !outs || !names) pp_error(PP_ERR_NOMEM, "out of memory");
    else if (pp_cli_match_inputs(g, in, feeds) == PP_OK && pp_graph_prepare_inference(g) == PP_OK &&
             pp_graph_run(g, feeds, outs) == PP_OK) {
        for (int i = 0; i < g->n_outputs; i++) names[i] = g->values[g->outputs[i]].name;
        rc = write_outputs(dir, g->n_outputs, names, outs);
    }
    for (int i = 0; outs && i < g->n_outputs; i++) pp_tensor_free(outs[i]);
    free(outs);
    free(feeds);
    free(names);
    return rc;
}

static int infer_pipelined(pp_graph *g, const pp_named_tensors *in, const infer_opts *o) {
    pp_pipe *p = NULL;
    pp_runner *r = NULL;
    pp_schedule *sched = NULL;
    pp_tensor **outs = NULL;
    const char **names = NULL;
    int rc = 1, n = 0;
    pp_tensor **feeds = calloc((size_t)g->n_inputs + 1, sizeof *feeds);
    if (!feeds || pp_cli_match_inputs(g, in, feeds) != PP_OK) goto done; /* names checked early */
    if (pp_cli_open_pipeline(g, &o->split, 0, &p, &r) != PP_OK) goto done;
    if (pp_schedule_from_spec(o->schedule, p->n_stages, o->microbatches, &sched) != PP_OK) goto done;
    n = pp_runner_n_outputs(r);
    outs = calloc((size_t)n + 1, sizeof *outs);
    names = calloc((size_t)n + 1, sizeof *names);
    if (!outs || !names) goto done;
    if (pp_cli_runner_step(r, o->microbatches, sched, in, outs) != PP_OK) goto done;
    for (int i = 0; i < n; i++) names[i] = pp_runner_output_name(r, i);
    printf("ran %d stage%s, %d microbatch%s\n", p->n_stages, p->n_stages == 1 ? "" : "s", o->microbatches,
           o->microbatches == 1 ? "" : "es");
    rc = write_outputs(o->out_dir, n, names, outs);
done:
    for (int i = 0; outs && i < n; i++) pp_tensor_free(outs[i]);
    free(outs);
    free(names);
    free(feeds);
    pp_schedule_free(sched);
    pp_runner_free(r);
    pp_pipe_free(p);
    return rc;
}

int cmd_infer(int argc, char **argv) {
    static const struct option opts[] = {
        PP_SPLIT_LONG_OPTIONS,
        {"input", required_argument, NULL, 'i'},
        {"output-dir", required_argument, NULL, 'o'},
        {"microbatches", required_argument, NULL, 'm'},
        {"schedule", required_argument, NULL, 's'},
        {"no-split", no_argument, NULL, 'n'},
        {"no-optimize", no_argument, NULL, 'O'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    pp_named_tensors inputs = {0};
    infer_opts o = {0};
    o.microbatches = 1;
    int c, rc = 2;
    optind = 1;
    while ((c = getopt_long(argc, argv, "i:o:m:s:h", opts, NULL)) != -1) {
        int handled = pp_split_args_handle(&o.split, c, optarg, "infer");
        if (handled < 0) goto out;
        if (handled) continue;
        switch (c) {
        case 'i':
            if (pp_cli_add_named_npy(&inputs, optarg) != PP_OK) {
                rc = pp_cli_fail("infer");
                goto out;
            }
            break;
        case 'o': o.out_dir = optarg; break;
        case 'm':
            o.microbatches = atoi(optarg);
            if (o.microbatches < 1) {
                fprintf(stderr, "pippin infer: --microbatches '%s': need a positive number\n", optarg);
                goto out;
            }
            break;
        case 's': o.schedule = optarg; break;
        case 'n': o.no_split = 1; break;
        case 'O': pp_optimize_set_default(0); break;
        case 'h': infer_usage(stdout); rc = 0; goto out;
        default: infer_usage(stderr); goto out;
        }
    }
    if (optind != argc - 1 || !o.out_dir) {
        fprintf(stderr, "pippin infer: need one MODEL.onnx and --output-dir\n");
        infer_usage(stderr);
        goto out;
    }
    pp_graph *g;
    o.split.microbatches = o.microbatches;
    if (pp_split_args_load(&o.split, argv[optind], &g) != PP_OK) {
        rc = pp_cli_fail("infer");
        goto out;
    }
    int staged = !o.no_split && (pp_cli_has_markers(g) || pp_split_args_any(&o.split));
    int pipelined = staged || (!o.no_split && o.microbatches > 1); /* M > 1 without stages: one stage */
    if (pp_cli_schedule_needs_stages(o.schedule, staged, o.no_split, NULL) != PP_OK) rc = 1;
    else rc = pipelined ? infer_pipelined(g, &inputs, &o) : infer_unsplit(g, &inputs, o.out_dir);
    if (rc) pp_cli_fail("infer");
    pp_graph_free(g);
out:
    pp_cli_named_free(&inputs);
    pp_split_args_free(&o.split);
    return rc;
}

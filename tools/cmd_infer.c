/* pippin infer: runs a model on .npy inputs and writes every graph output as
 * DIR/<output name>.npy. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "pippin/pippin.h"

static void infer_usage(FILE *f) {
    fprintf(f,
            "usage: pippin infer MODEL.onnx --input NAME=FILE.npy ... --output-dir DIR\n"
            "Runs the model on the CPU and writes DIR/<output name>.npy for each graph output\n"
            "('/' and ':' in names become '_').\n");
}

int cmd_infer(int argc, char **argv) {
    static const struct option opts[] = {
        {"input", required_argument, NULL, 'i'},
        {"output-dir", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    pp_named_tensors inputs = {0};
    const char *out_dir = NULL;
    int c, rc = 1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "i:o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'i':
            if (pp_cli_add_named_npy(&inputs, optarg) != PP_OK) {
                pp_cli_named_free(&inputs);
                return pp_cli_fail("infer");
            }
            break;
        case 'o': out_dir = optarg; break;
        case 'h': infer_usage(stdout); pp_cli_named_free(&inputs); return 0;
        default: infer_usage(stderr); pp_cli_named_free(&inputs); return 2;
        }
    }
    if (optind != argc - 1 || !out_dir) {
        fprintf(stderr, "pippin infer: need one MODEL.onnx and --output-dir\n");
        infer_usage(stderr);
        pp_cli_named_free(&inputs);
        return 2;
    }
    pp_graph *g = NULL;
    pp_tensor **feeds = NULL, **outs = NULL;
    if (pp_onnx_load(argv[optind], &g) != PP_OK) goto done;
    feeds = calloc((size_t)g->n_inputs + 1, sizeof *feeds);
    outs = calloc((size_t)g->n_outputs + 1, sizeof *outs);
    if (!feeds || !outs) {
        pp_error(PP_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (pp_cli_match_inputs(g, &inputs, feeds) != PP_OK) goto done;
    if (pp_graph_run(g, feeds, outs) != PP_OK) goto done;
    if (pp_cli_mkdirs(out_dir) != PP_OK) goto done;
    for (int i = 0; i < g->n_outputs; i++) {
        char safe[512], path[4096];
        pp_cli_file_safe(g->values[g->outputs[i]].name, safe, sizeof safe);
        snprintf(path, sizeof path, "%s/%s.npy", out_dir, safe);
        if (pp_npy_save(path, outs[i]) != PP_OK) goto done;
        char shape[128];
        printf("%s: %s%s -> %s\n", g->values[g->outputs[i]].name, pp_dtype_name(outs[i]->dtype),
               pp_shape_str(outs[i]->ndim, outs[i]->shape, shape, sizeof shape), path);
    }
    rc = 0;
done:
    if (rc) pp_cli_fail("infer");
    for (int i = 0; g && outs && i < g->n_outputs; i++) pp_tensor_free(outs[i]);
    free(outs);
    free(feeds);
    pp_graph_free(g);
    pp_cli_named_free(&inputs);
    return rc;
}

/* pippin split: cuts a model into stage files DIR/stage_K.onnx + pipe.json. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "pippin/pippin.h"
#include "pippin/pipe.h"
#include "split_args.h"

static void split_usage(FILE *f) {
    fprintf(f,
            "usage: pippin split MODEL.onnx [--split-before PREFIX]... [--split-after PREFIX]...\n"
            "                    [--transmit-shared] [--dim NAME=N]... [--freeze PATTERN]...\n"
            "                    [--external-data] -o DIR\n"
            "Cuts the model at its pippin::PipeSplit markers and/or before (after) the first\n"
            "(last) node whose name starts with PREFIX, and writes DIR/stage_K.onnx for each\n"
            "stage plus DIR/pipe.json (stages, edges with symbolic shapes, shared parameters).\n"
            "--dim sets the size of a symbolic input dim used to measure edge bytes per sample.\n"
            "Shared parameters are replicated unless --transmit-shared.\n"
            "Trainable: the initializers the exporter listed (pippin_torch.export records\n"
            "torch's parameters with requires_grad; buffers are constants), else every float\n"
            "initializer; --freeze PATTERN (shell pattern on names) freezes more.\n"
            "A stage's initializers go to DIR/stage_K.onnx.data (ONNX external data, at\n"
            "4096-byte aligned offsets) when its file would exceed 1.8 GiB, or always\n"
            "with --external-data (those of 1 KiB and more).\n");
}

enum { OPT_EXTERNAL_DATA = 2000 };

int cmd_split(int argc, char **argv) {
    static const struct option opts[] = {
        PP_SPLIT_LONG_OPTIONS,
        {"external-data", no_argument, NULL, OPT_EXTERNAL_DATA},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    pp_split_args sa = {0};
    const char *out_dir = NULL;
    pp_onnx_save_options save;
    pp_onnx_save_options_init(&save);
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        int handled = pp_split_args_handle(&sa, c, optarg, "split");
        if (handled < 0) return 2;
        if (handled) continue;
        if (c == 'o') out_dir = optarg;
        else if (c == OPT_EXTERNAL_DATA) save.external_data = PP_ONNX_EXTERNAL_ALWAYS;
        else if (c == 'h') {
            split_usage(stdout);
            return 0;
        } else {
            split_usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1 || !out_dir) {
        fprintf(stderr, "pippin split: need one MODEL.onnx and -o DIR\n");
        split_usage(stderr);
        return 2;
    }
    pp_graph *g = NULL;
    pp_pipe *p = NULL;
    pp_split_spec spec = pp_split_args_spec(&sa);
    int rc = 1;
    if (pp_split_args_load(&sa, argv[optind], &g) != PP_OK) goto done;
    if (pp_pipe_split(g, &spec, &p) != PP_OK) goto done;
    if (pp_pipe_probe_shapes(p, sa.n_dims, sa.dims) != PP_OK) goto done;
    if (pp_pipe_save_with(p, out_dir, &save) != PP_OK) goto done;
    printf("%d stages, %d edges, %d shared parameters -> %s/pipe.json\n", p->n_stages, p->n_edges,
           p->n_shared, out_dir);
    rc = 0;
done:
    if (rc) pp_cli_fail("split");
    pp_pipe_free(p);
    pp_graph_free(g);
    return rc;
}

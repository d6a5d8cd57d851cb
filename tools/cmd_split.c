/* pippin split: cuts a model into stage files DIR/stage_K.onnx + pipe.json. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "pippin/pippin.h"
#include "pippin/pipe.h"
#include "split_args.h"

static void split_usage(FILE *f) {
    fprintf(f,
            "usage: pippin split MODEL.onnx [--split-before PREFIX]... [--split-after PREFIX]...\n"
            "                    [--transmit-shared] [--dim NAME=N]... [--freeze PATTERN]...\n"
            "                    [--external-data] [--auto N | --split-even N] [--microbatches M]\n"
            "                    [--auto-memory-cap BYTES] [--auto-batch B] [--auto-cost time|flops]\n"
            "                    [--auto-bandwidth GBPS] -o DIR\n"
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
            "with --external-data (those of 1 KiB and more).\n"
            "--auto N chooses N-1 cuts (markers ignored) that make the slowest stage as fast\n"
            "as possible: it times a training step of the model node by node (forward and\n"
            "the gradient nodes of each node) at batch B (--auto-batch, default 8; --dim for\n"
            "other dims), adds the transfer of what crosses each cut (--auto-bandwidth,\n"
            "default 10 GB/s), keeps every stage's parameters plus its 1F1B stash\n"
            "(min(M, N-k) microbatches on stage k; --microbatches, default 4) within\n"
            "--auto-memory-cap (suffix K, M, G), and prints each stage's cost and memory\n"
            "with the simulated 1F1B step against an even split. --auto-cost flops counts\n"
            "operations instead of timing (the same cuts on every machine). --split-even N\n"
            "cuts into N stages of as many compute nodes.\n");
}

enum { OPT_EXTERNAL_DATA = 2000, OPT_MICROBATCHES };

int cmd_split(int argc, char **argv) {
    static const struct option opts[] = {
        PP_SPLIT_LONG_OPTIONS,
        {"external-data", no_argument, NULL, OPT_EXTERNAL_DATA},
        {"microbatches", required_argument, NULL, OPT_MICROBATCHES},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    pp_split_args sa = {0};
    sa.microbatches = 4;
    sa.report = stdout;
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
        else if (c == OPT_MICROBATCHES) {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 1 || v > 1 << 20) {
                fprintf(stderr, "pippin split: --microbatches '%s': need a positive count\n", optarg);
                return 2;
            }
            sa.microbatches = (int)v;
        }
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
    pp_onnx_deferred *weights = NULL;
    int rc = 1;
    /* the weights are read after the probe, so its activations and the
     * model are not held together */
    if (pp_split_args_load_deferred(&sa, argv[optind], &g, &weights) != PP_OK) goto done;
    pp_split_spec spec = pp_split_args_spec(&sa);
    /* the stages take g's weights (g is only freed after): the model is not held twice */
    if (pp_pipe_split_take(g, &spec, &p) != PP_OK) goto done;
    if (pp_pipe_probe_shapes(p, sa.n_dims, sa.dims) != PP_OK) goto done;
    for (int s = 0; s < p->n_stages; s++)
        if (pp_onnx_deferred_fill(weights, p->stages[s]) != PP_OK) goto done;
    pp_onnx_deferred_free(weights);
    weights = NULL;
    if (pp_pipe_save_with(p, out_dir, &save) != PP_OK) goto done;
    printf("%d stages, %d edges, %d shared parameters -> %s/pipe.json\n", p->n_stages, p->n_edges,
           p->n_shared, out_dir);
    rc = 0;
done:
    if (rc) pp_cli_fail("split");
    pp_onnx_deferred_free(weights);
    pp_pipe_free(p);
    pp_graph_free(g);
    pp_split_args_free(&sa);
    return rc;
}

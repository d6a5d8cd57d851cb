/* pippin grad: loss and parameter gradients of a model on one batch. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "pippin/pippin.h"

static void grad_usage(FILE *f) {
    fprintf(f,
            "usage: pippin grad MODEL.onnx --input NAME=FILE.npy ... --out DIR [--loss NAME]\n"
            "Runs forward and backward on the batch and writes DIR/loss.npy and\n"
            "DIR/grad_<initializer name>.npy for every trainable parameter. The loss is the\n"
            "output named by --loss, else 'loss', else the only float scalar output.\n");
}

int cmd_grad(int argc, char **argv) {
    static const struct option opts[] = {
        {"input", required_argument, NULL, 'i'},
        {"out", required_argument, NULL, 'o'},
        {"loss", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    pp_named_tensors inputs = {0};
    const char *out_dir = NULL, *loss_name = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "i:o:l:h", opts, NULL)) != -1) {
        switch (c) {
        case 'i':
            if (pp_cli_add_named_npy(&inputs, optarg) != PP_OK) {
                pp_cli_named_free(&inputs);
                return pp_cli_fail("grad");
            }
            break;
        case 'o': out_dir = optarg; break;
        case 'l': loss_name = optarg; break;
        case 'h': grad_usage(stdout); pp_cli_named_free(&inputs); return 0;
        default: grad_usage(stderr); pp_cli_named_free(&inputs); return 2;
        }
    }
    if (optind != argc - 1 || !out_dir) {
        fprintf(stderr, "pippin grad: need one MODEL.onnx and --out DIR\n");
        grad_usage(stderr);
        pp_cli_named_free(&inputs);
        return 2;
    }
    int rc = 1;
    pp_graph *g = NULL;
    pp_trainer *t = NULL;
    pp_tensor **feeds = NULL, *lt = NULL;
    if (pp_onnx_load(argv[optind], &g) != PP_OK) goto done;
    feeds = calloc((size_t)g->n_inputs + 1, sizeof *feeds);
    if (!feeds) {
        pp_error(PP_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (pp_cli_match_inputs(g, &inputs, feeds) != PP_OK) goto done;
    if (pp_trainer_new(g, loss_name, &t) != PP_OK) goto done;
    float loss;
    if (pp_trainer_backward(t, feeds, 1.0f, &loss) != PP_OK) goto done;
    if (pp_cli_mkdirs(out_dir) != PP_OK) goto done;
    if (pp_tensor_scalar_f32(loss, &lt) != PP_OK || pp_cli_save_named(out_dir, "", "loss", lt) != PP_OK)
        goto done;
    pp_flat_params *fp = pp_trainer_params(t);
    for (int i = 0; i < fp->n; i++) {
        pp_tensor *gv;
        if (pp_flat_params_grad_view(fp, i, &gv) != PP_OK) goto done;
        pp_status s = pp_cli_save_named(out_dir, "grad_", fp->names[i], gv);
        pp_tensor_free(gv);
        if (s != PP_OK) goto done;
    }
    printf("loss %.9g; gradients of %d parameters written to %s\n", loss, fp->n, out_dir);
    const pp_backward *b = pp_trainer_autodiff(t);
    for (int i = 0; i < b->n_frozen; i++)
        printf("not trainable (no gradient reaches it): %s\n", g->values[b->frozen[i]].name);
    rc = 0;
done:
    if (rc) pp_cli_fail("grad");
    pp_tensor_free(lt);
    pp_trainer_free(t);
    free(feeds);
    pp_graph_free(g);
    pp_cli_named_free(&inputs);
    return rc;
}

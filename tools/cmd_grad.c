/* pippin grad: loss and parameter gradients of a model on one batch. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "pipe_cli.h"
#include "pippin/pippin.h"

#include "status_internal.h"
static void grad_usage(FILE *f) {
    fprintf(f,
            "usage: pippin grad MODEL.onnx --input NAME=FILE.npy ... --out DIR [--loss NAME]\n"
            "                   [--microbatches M] [--schedule KIND] [--split-before P]...\n"
            "                   [--split-after P]... [--transmit-shared] [--no-split]\n"
            "                   [--freeze PATTERN]...\n"
            "Runs forward and backward on the batch and writes DIR/loss.npy and\n"
            "DIR/grad_<initializer name>.npy for every trainable parameter. The loss is the\n"
            "output named by --loss, else 'loss', else the only float scalar output.\n"
            "A model with pippin::PipeSplit markers (or a split spec) runs through its\n"
            "stages: M microbatches in the order of schedule KIND (default gpipe), loss\n"
            "seeded with 1/M so the gradients are the full batch's. A model without stages\n"
            "runs as one stage when M > 1; --schedule needs stages.\n"
            "Trainable: the initializers the exporter listed (pippin_torch.export records\n"
            "torch's parameters with requires_grad; buffers are constants), else every float\n"
            "initializer; --freeze PATTERN (shell pattern on names) freezes more.\n");
}

/* Loss and gradients through the stages (local runner). */
static int grad_pipelined(pp_graph *g, const pp_named_tensors *in, const pp_split_args *sa, int m,
                          const char *schedule, const char *out_dir) {
    pp_pipe *p = NULL;
    pp_runner *r = NULL;
    pp_schedule *sched = NULL;
    pp_tensor **outs = NULL;
    int rc = 1, count = 0, lo;
    if (pp_cli_open_pipeline(g, sa, 1, &p, &r) != PP_OK) goto done;
    if (pp_schedule_from_spec(schedule, p->n_stages, m, &sched) != PP_OK) goto done;
    if ((lo = pp_runner_loss_output(r)) < 0) {
        pp_error(PP_ERR_NOT_FOUND, "the model has no loss output");
        goto done;
    }
    outs = calloc((size_t)pp_runner_n_outputs(r) + 1, sizeof *outs);
    if (!outs || pp_cli_runner_step(r, m, sched, in, outs) != PP_OK) goto done;
    if (pp_mkdirs(out_dir) != PP_OK || pp_save_named_npy(out_dir, "", "loss", outs[lo]) != PP_OK) goto done;
    if (pp_cli_save_runner_params(p, r, out_dir, "grad_", 1, &count) != PP_OK) goto done;
    printf("loss %.9g; gradients of %d parameters (%d stage%s, %d microbatch%s) written to %s\n",
           pp_tensor_get_f64(outs[lo], 0), count, p->n_stages, p->n_stages == 1 ? "" : "s", m, m == 1 ? "" : "es",
           out_dir);
    for (int s = 0; s < pp_runner_n_stages(r); s++)
        for (int i = 0; i < pp_stage_n_frozen(pp_runner_stage(r, s)); i++)
            printf("not trainable (no gradient reaches it): %s (stage %d)\n",
                   pp_stage_frozen_name(pp_runner_stage(r, s), i), s);
    rc = 0;
done:
    for (int o = 0; outs && o < pp_runner_n_outputs(r); o++) pp_tensor_free(outs[o]);
    free(outs);
    pp_schedule_free(sched);
    pp_runner_free(r);
    pp_pipe_free(p);
    return rc;
}

int cmd_grad(int argc, char **argv) {
    static const struct option opts[] = {
        {"input", required_argument, NULL, 'i'},
        {"out", required_argument, NULL, 'o'},
        {"loss", required_argument, NULL, 'l'},
        {"microbatches", required_argument, NULL, 'm'},
        {"schedule", required_argument, NULL, 's'},
        {"no-split", no_argument, NULL, 'n'},
        PP_SPLIT_LONG_OPTIONS,
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    pp_named_tensors inputs = {0};
    const char *out_dir = NULL, *loss_name = NULL, *schedule = NULL;
    int c, microbatches = 1, no_split = 0;
    pp_split_args sa = {0};
    optind = 1;
    while ((c = getopt_long(argc, argv, "i:o:l:h", opts, NULL)) != -1) {
        int handled = pp_split_args_handle(&sa, c, optarg, "grad");
        if (handled < 0) {
            pp_cli_named_free(&inputs);
            return 2;
        }
        if (handled) continue;
        switch (c) {
        case 'm':
            if ((microbatches = atoi(optarg)) < 1) {
                fprintf(stderr, "pippin grad: --microbatches '%s': need a positive number\n", optarg);
                pp_cli_named_free(&inputs);
                return 2;
            }
            break;
        case 's': schedule = optarg; break;
        case 'n': no_split = 1; break;
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
    if (pp_split_args_load(&sa, argv[optind], &g) != PP_OK) goto done;
    feeds = calloc((size_t)g->n_inputs + 1, sizeof *feeds);
    if (!feeds) {
        pp_error(PP_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (pp_cli_match_inputs(g, &inputs, feeds) != PP_OK) goto done;
    sa.loss = loss_name;
    int staged = !no_split && (pp_cli_has_markers(g) || pp_split_args_any(&sa));
    if (pp_cli_schedule_needs_stages(schedule, staged, no_split, NULL) != PP_OK) goto done;
    /* As infer: M > 1 microbatches of a model without stages run as one stage. */
    if (staged || (!no_split && microbatches > 1)) {
        rc = grad_pipelined(g, &inputs, &sa, microbatches, schedule, out_dir);
        goto done;
    }
    if (pp_trainer_new(g, loss_name, &t) != PP_OK) goto done;
    float loss;
    if (pp_trainer_backward(t, feeds, 1.0f, &loss) != PP_OK) goto done;
    if (pp_mkdirs(out_dir) != PP_OK) goto done;
    if (pp_tensor_scalar_f32(loss, &lt) != PP_OK || pp_save_named_npy(out_dir, "", "loss", lt) != PP_OK)
        goto done;
    pp_flat_params *fp = pp_trainer_params(t);
    for (int i = 0; i < fp->n; i++) {
        pp_tensor *gv;
        if (pp_flat_params_grad_view(fp, i, &gv) != PP_OK) goto done;
        pp_status s = pp_save_named_npy(out_dir, "grad_", fp->names[i], gv);
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
    pp_split_args_free(&sa);
    return rc;
}

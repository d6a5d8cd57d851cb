/* Embedding pippin: train a model with pipe-split markers as a pipeline,
 * all stages in this process, through the C API.
 *
 *   train_pipeline MODEL.onnx TOKENS.npy TARGETS.npy [STEPS]
 *
 * Builds with `pkg-config --cflags --libs pippin` after `meson install`
 * (or as build/examples/embed/train_pipeline in the source tree). */
#include <stdio.h>
#include <stdlib.h>

#include "pippin/pippin.h"

static int fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, pp_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.onnx TOKENS.npy TARGETS.npy [STEPS]\n", argv[0]);
        return 2;
    }
    int steps = argc > 4 ? atoi(argv[4]) : 5;
    pp_graph *model;
    pp_tensor *data[2];
    if (pp_onnx_load(argv[1], &model) != PP_OK) return fail("load model");
    if (pp_npy_load(argv[2], &data[0]) != PP_OK || pp_npy_load(argv[3], &data[1]) != PP_OK) return fail("load data");

    /* Cut at the model's pippin::PipeSplit markers; probe the edge shapes. */
    pp_pipe *pipe;
    if (pp_pipe_split(model, NULL, &pipe) != PP_OK) return fail("split");
    pp_runner *runner;
    if (pp_runner_new(pipe, /*training=*/1, &runner) != PP_OK) return fail("build stages");

    /* A 1F1B schedule over one rank per stage, 4 microbatches per step. */
    pp_sched_params sp;
    pp_sched_params_init(&sp, PP_SCHED_1F1B, pipe->n_stages, 4);
    pp_schedule *sched;
    if (pp_schedule_generate(&sp, &sched) != PP_OK) return fail("schedule");

    pp_optim_config opt;
    pp_optim_config_init(&opt, PP_OPTIM_ADAMW);
    opt.lr = 2e-3;
    if (pp_runner_set_optimizer(runner, &opt) != PP_OK) return fail("optimizer");

    const char *names[2] = {model->values[model->inputs[0]].name, model->values[model->inputs[1]].name};
    int loss_index = pp_runner_loss_output(runner);
    for (int step = 0; step < steps; step++) {
        pp_tensor *batch[2], *outputs[8] = {0};
        for (int i = 0; i < 2; i++)
            if (pp_data_batch(data[i], step, 16, &batch[i]) != PP_OK) return fail("batch");
        pp_runner_zero_grad(runner);
        if (pp_runner_step(runner, 4, sched, 2, names, batch, outputs) != PP_OK) return fail("step");
        if (pp_runner_optimizer_step(runner) != PP_OK) return fail("update");
        printf("step %d: loss %.4f\n", step, pp_tensor_get_f64(outputs[loss_index], 0));
        for (int o = 0; o < pp_runner_n_outputs(runner); o++) pp_tensor_free(outputs[o]);
        pp_tensor_free(batch[0]);
        pp_tensor_free(batch[1]);
    }
    pp_schedule_free(sched);
    pp_runner_free(runner);
    pp_pipe_free(pipe);
    pp_graph_free(model);
    pp_tensor_free(data[0]);
    pp_tensor_free(data[1]);
    return 0;
}

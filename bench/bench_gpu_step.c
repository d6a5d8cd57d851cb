/* The example GPT's training step (forward + backward, every parameter's
 * gradient) with its stages on a device against the same step on the CPU
 * and against PyTorch on the same GPU (bench/torch_gpu_step.py).
 *
 *   pippin-bench-gpu [--device cuda:0] [--batch B] [--iters K] [--threads N]
 *                    [--model DIR] [--torch SCRIPT] [--python PY]
 *
 * DIR holds model.onnx with pipe-split markers (default: the test fixture);
 * the torch script gets --model DIR --batch B --iters K and prints one JSON
 * line with "train_step_ms". Each time is the median of K steps after 3.
 * The device is timed twice: the step alone (torch's peer) and the step
 * with an AdamW update; each prints the copies per step (with the
 * parameters, gradients and optimizer state kept on the device, only the
 * stages' boundary values). */
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pippin/pippin.h"

#include "bench_util.h"

static const char *const input_names[2] = {"idx", "targets"};

/* Median step time of the pipe's training step with every stage on spec,
 * with an AdamW update when adamw. */
static int time_steps(const char *model, const char *spec, int iters, int adamw, pp_tensor **ins, double *ms,
                      pp_device_stats *per_step) {
    pp_graph *g = NULL;
    pp_pipe *p = NULL;
    pp_runner *r = NULL;
    pp_status s = pp_onnx_load(model, &g);
    if (!s) s = pp_pipe_split(g, NULL, &p);
    if (!s) s = pp_runner_new(p, 1, &r);
    for (int i = 0; !s && spec && i < pp_runner_n_stages(r); i++) s = pp_stage_use_device(pp_runner_stage(r, i), spec);
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_ADAMW);
    if (!s && adamw) s = pp_runner_set_optimizer(r, &oc);
    double *ts = malloc(sizeof(double) * (size_t)iters);
    pp_tensor *outs[4] = {0};
    memset(per_step, 0, sizeof *per_step);
    for (int i = -3; !s && i < iters; i++) {
        if (i == 0)
            for (int k = 0; spec && k < pp_runner_n_stages(r); k++) pp_device_reset_stats(pp_stage_device(pp_runner_stage(r, k)));
        pp_runner_zero_grad(r);
        double t0 = bench_clock_ms(CLOCK_MONOTONIC);
        s = pp_runner_step(r, 1, NULL, 2, input_names, ins, outs);
        if (!s && adamw) s = pp_runner_optimizer_step(r);
        if (i >= 0) ts[i] = bench_clock_ms(CLOCK_MONOTONIC) - t0;
        for (int o = 0; o < 4; o++) pp_tensor_free(outs[o]), outs[o] = NULL;
    }
    for (int k = 0; !s && spec && k < pp_runner_n_stages(r); k++) {
        pp_device_stats st;
        pp_device_get_stats(pp_stage_device(pp_runner_stage(r, k)), &st);
        per_step->kernels += st.kernels / iters;
        per_step->fallbacks += st.fallbacks / iters;
        per_step->uploads += st.uploads / iters;
        per_step->downloads += st.downloads / iters;
        per_step->upload_bytes += st.upload_bytes / iters;
        per_step->download_bytes += st.download_bytes / iters;
    }
    if (!s) *ms = bench_median(ts, iters);
    else fprintf(stderr, "pippin-bench-gpu: %s: %s\n", spec ? spec : "cpu", pp_last_error());
    free(ts);
    pp_runner_free(r);
    pp_pipe_free(p);
    pp_graph_free(g);
    return s ? 1 : 0;
}

static int torch_ms(const char *python, const char *script, const char *dir, int batch, int iters, double *ms) {
    if (!script || access(script, R_OK) != 0) return -1;
    char cmd[9000], line[4096] = "", buf[4096];
    snprintf(cmd, sizeof cmd, "%s %s --model %s --batch %d --iters %d", python, script, dir, batch, iters);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    while (fgets(buf, sizeof buf, p))
        if (buf[0] == '{') snprintf(line, sizeof line, "%s", buf);
        else fputs(buf, stdout);
    if (pclose(p) != 0 || !line[0]) return -1;
    json_object *o = json_tokener_parse(line), *v;
    int ok = o && json_object_object_get_ex(o, "train_step_ms", &v);
    if (ok) *ms = json_object_get_double(v);
    if (o && json_object_object_get_ex(o, "torch", &v)) printf("  (torch %s)\n", json_object_get_string(v));
    json_object_put(o);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    int batch = 32, iters = 20, threads = 0;
    const char *spec = "cuda:0", *script = NULL, *python = "python3";
    const char *src = getenv("PIPPIN_SOURCE_ROOT");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test/fixtures/gpt", src ? src : PP_SOURCE_ROOT);
    static const struct option opts[] = {
        {"device", required_argument, NULL, 'd'}, {"batch", required_argument, NULL, 'b'},
        {"iters", required_argument, NULL, 'i'},  {"threads", required_argument, NULL, 't'},
        {"model", required_argument, NULL, 'm'},  {"torch", required_argument, NULL, 'T'},
        {"python", required_argument, NULL, 'P'}, {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "d:b:i:t:m:", opts, NULL)) != -1) {
        switch (c) {
        case 'd': spec = optarg; break;
        case 'b': batch = atoi(optarg); break;
        case 'i': iters = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'm': snprintf(dir, sizeof dir, "%s", optarg); break;
        case 'T': script = optarg; break;
        case 'P': python = optarg; break;
        default:
            fprintf(stderr, "usage: pippin-bench-gpu [--device SPEC] [--batch B] [--iters K] [--threads N] "
                            "[--model DIR] [--torch SCRIPT] [--python PY]\n");
            return 2;
        }
    }
    if (batch < 1 || iters < 1) return 2;
    pp_set_threads(threads);
    pp_device *probe;
    if (pp_device_open(spec, &probe) != PP_OK) {
        printf("pippin-bench-gpu: skipped: %s\n", pp_last_error());
        return 0;
    }
    pp_device_close(probe);
    char model[4200];
    snprintf(model, sizeof model, "%s/model.onnx", dir);
    unsigned seed = 1;
    int64_t vocab = 64, seq = 16; /* the fixture's; a bigger model: from its embeddings */
    pp_graph *g;
    if (pp_onnx_load(model, &g) == PP_OK) {
        int tok = pp_graph_find_value(g, "tok_emb.weight"), pos = pp_graph_find_value(g, "pos_emb.weight");
        if (tok >= 0) vocab = g->values[tok].shape[0];
        if (pos >= 0) seq = g->values[pos].shape[0];
        pp_graph_free(g);
    }
    pp_tensor *ins[2] = {bench_tokens(batch, seq, vocab, &seed), bench_tokens(batch, seq, vocab, &seed)};
    double cpu = 0, dev = 0, dev_adamw = 0, torch = 0;
    pp_device_stats none, st, st_adamw;
    printf("GPT train step (forward + backward), batch %d x %lld tokens, median of %d\n", batch, (long long)seq, iters);
    int rc = time_steps(model, NULL, iters, 0, ins, &cpu, &none);
    if (!rc) printf("  pippin cpu (%d threads): %9.3f ms\n", pp_get_threads(), cpu);
    if (!rc) rc = time_steps(model, spec, iters, 0, ins, &dev, &st);
    if (!rc)
        printf("  pippin %-14s    %9.3f ms  (per step: %lld nodes on the device, %lld handed back, %lld uploads "
               "%.1f KiB, %lld downloads %.1f KiB)\n",
               spec, dev, (long long)st.kernels, (long long)st.fallbacks, (long long)st.uploads,
               (double)st.upload_bytes / 1024.0, (long long)st.downloads, (double)st.download_bytes / 1024.0);
    if (!rc) rc = time_steps(model, spec, iters, 1, ins, &dev_adamw, &st_adamw);
    if (!rc)
        printf("  pippin %-14s    %9.3f ms  with an AdamW update (per step: %lld uploads %.1f KiB, %lld downloads "
               "%.1f KiB)\n",
               spec, dev_adamw, (long long)st_adamw.uploads, (double)st_adamw.upload_bytes / 1024.0,
               (long long)st_adamw.downloads, (double)st_adamw.download_bytes / 1024.0);
    if (!rc && torch_ms(python, script, dir, batch, iters, &torch) == 0) {
        printf("  torch cuda:             %9.3f ms\n", torch);
        printf("  ratio torch/pippin on the GPU: %.2fx (>1: pippin faster); pippin gpu/cpu speed-up %.2fx\n",
               torch / dev, cpu / dev);
    } else if (!rc) {
        printf("  torch: unavailable (--torch SCRIPT)\n");
    }
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    return rc;
}

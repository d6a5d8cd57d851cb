/* What cutting a batch into microbatches costs: one training step (forward
 * + backward, every gradient) of a GPT (bench/bench_gpt.py's export, or the
 * fixture) on batch B, run whole and as M microbatches of B/M rows whose
 * gradients add up, on the same thread count. The step times of each M are
 * interleaved (one step of each in turn) so a loaded machine slows them
 * alike; wall and process CPU time are both printed (at 1 thread the CPU
 * time is what load disturbs least), with each M's ratio to M = 1. Issue
 * 14's target: 8 microbatches cost <= 1.10x one.
 *
 *   pippin-bench-microbatch [--model DIR] [--batch B] [--microbatches 1,2,4,8]
 *                           [--threads N] [--iters K] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pippin/pippin.h"

#include "bench_util.h"

#define MAX_MS 8

/* Rows [lo, lo + n) of a [B, T] token tensor. */
static pp_tensor *rows(const pp_tensor *t, int64_t lo, int64_t n) {
    pp_tensor *r;
    if (pp_tensor_empty(PP_I64, 2, (int64_t[]){n, t->shape[1]}, &r) != PP_OK) return NULL;
    memcpy(r->data, (const int64_t *)t->data + lo * t->shape[1], (size_t)(n * t->shape[1]) * sizeof(int64_t));
    return r;
}

int main(int argc, char **argv) {
    int threads = 1, batch = 8, iters = 5, ms[MAX_MS] = {1, 2, 4, 8}, n_ms = 4;
    const char *src = getenv("PIPPIN_SOURCE_ROOT");
    char model_dir[4096];
    snprintf(model_dir, sizeof model_dir, "%s/test/fixtures/gpt", src ? src : PP_SOURCE_ROOT);
    static const struct option opts[] = {
        {"threads", required_argument, NULL, 't'}, {"batch", required_argument, NULL, 'b'},
        {"iters", required_argument, NULL, 'i'},   {"model", required_argument, NULL, 'm'},
        {"microbatches", required_argument, NULL, 'M'}, {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't': threads = atoi(optarg); break;
        case 'b': batch = atoi(optarg); break;
        case 'i': iters = atoi(optarg); break;
        case 'm': snprintf(model_dir, sizeof model_dir, "%s", optarg); break;
        case 'M': {
            n_ms = 0;
            for (char *p = optarg; *p && n_ms < MAX_MS;) {
                ms[n_ms++] = (int)strtol(p, &p, 10);
                if (*p == ',') p++;
                else if (*p) return 2;
            }
            break;
        }
        default:
            fprintf(stderr, "usage: pippin-bench-microbatch [--model DIR] [--batch B] [--microbatches 1,2,4,8] "
                            "[--threads N] [--iters K]\n");
            return 2;
        }
    }
    if (threads < 1 || batch < 1 || iters < 1 || n_ms < 1) return 2;
    for (int k = 0; k < n_ms; k++)
        if (ms[k] < 1 || batch % ms[k]) {
            fprintf(stderr, "pippin-bench-microbatch: %d microbatches do not divide batch %d\n", ms[k], batch);
            return 2;
        }
    pp_set_threads(threads);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.onnx", model_dir);
    pp_graph *g = NULL;
    pp_trainer *t = NULL;
    if (pp_onnx_load(path, &g) != PP_OK || pp_trainer_new(g, NULL, &t) != PP_OK) {
        fprintf(stderr, "pippin-bench-microbatch: %s\n", pp_last_error());
        pp_graph_free(g);
        return 1;
    }
    int tok = pp_graph_find_value(g, "tok_emb.weight"), pos = pp_graph_find_value(g, "pos_emb.weight");
    int64_t vocab = tok >= 0 ? g->values[tok].shape[0] : 64, seq = pos >= 0 ? g->values[pos].shape[0] : 16;
    unsigned seed = 1;
    pp_tensor *whole[2] = {bench_tokens(batch, seq, vocab, &seed), bench_tokens(batch, seq, vocab, &seed)};
    double *wall = calloc((size_t)(n_ms * iters), sizeof *wall), *cpu = calloc((size_t)(n_ms * iters), sizeof *cpu);
    pp_flat_params *fp = pp_trainer_params(t);
    int rc = !wall || !cpu;
    for (int i = -2; i < iters && rc == 0; i++)
        for (int k = 0; k < n_ms && rc == 0; k++) {
            int M = ms[k];
            int64_t per = batch / M;
            double w0 = bench_clock_ms(CLOCK_MONOTONIC), c0 = bench_clock_ms(CLOCK_PROCESS_CPUTIME_ID);
            pp_flat_params_zero_grad(fp);
            for (int j = 0; j < M && rc == 0; j++) {
                pp_tensor *ins[2] = {M == 1 ? whole[0] : rows(whole[0], j * per, per),
                                     M == 1 ? whole[1] : rows(whole[1], j * per, per)};
                float loss;
                pp_trainer_set_step(t, i, j);
                if (!ins[0] || !ins[1] || pp_trainer_backward(t, ins, 1.0f / (float)M, &loss) != PP_OK) {
                    fprintf(stderr, "pippin-bench-microbatch: %s\n", pp_last_error());
                    rc = 1;
                }
                if (M != 1) {
                    pp_tensor_free(ins[0]);
                    pp_tensor_free(ins[1]);
                }
            }
            if (i >= 0) {
                wall[k * iters + i] = bench_clock_ms(CLOCK_MONOTONIC) - w0;
                cpu[k * iters + i] = bench_clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
            }
        }
    if (rc == 0) {
        printf("GPT train step (forward + backward) as microbatches: %s, %.2fM parameters, batch %d x %lld "
               "tokens, %d thread%s, median of %d interleaved steps\n",
               model_dir, (double)pp_trainer_params(t)->total / 1e6, batch, (long long)seq, threads, threads == 1 ? "" : "s", iters);
        double w1 = 0, c1 = 0;
        for (int k = 0; k < n_ms; k++) {
            double w = bench_median(wall + k * iters, iters), cp = bench_median(cpu + k * iters, iters);
            if (k == 0) w1 = w, c1 = cp;
            printf("  %d microbatch%s of %d: wall %9.2f ms (%.2fx)  cpu %9.2f ms (%.2fx)\n", ms[k],
                   ms[k] == 1 ? "  " : "es", batch / ms[k], w, w / w1, cp, cp / c1);
        }
    }
    free(wall);
    free(cpu);
    pp_tensor_free(whole[0]);
    pp_tensor_free(whole[1]);
    pp_trainer_free(t);
    pp_graph_free(g);
    return rc;
}

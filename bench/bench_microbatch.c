/* What cutting a batch into microbatches costs: one training step (forward
 * + backward, every gradient) of a GPT (bench/bench_gpt.py's export, or the
 * fixture) on batch B, run whole and as M microbatches of B/M rows whose
 * gradients add up, on the same thread count. The step times of each M are
 * interleaved (one step of each in turn) so a loaded machine slows them
 * alike; wall and process CPU time are both printed (at 1 thread the CPU
 * time is what load disturbs least), with each M's ratio to M = 1. Issue
 * 14's target: 8 microbatches cost <= 1.10x one.
 *
 * --pack both runs every step twice, interleaved: on a trainer whose
 * weights are packed once per step (the optimizer's "pack" bit,
 * pp_trainer_hold_params over the step's microbatches) and on one
 * without (the model loaded twice), and prints the ratio off/on.
 *
 *   pippin-bench-microbatch [--model DIR] [--batch B] [--microbatches 1,2,4,8]
 *                           [--threads N] [--iters K] [--pack on|off|both] */
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

/* One step of M microbatches on t; 0 or 1 on failure. */
static int step(pp_trainer *t, pp_tensor *const *whole, int batch, int M, int it) {
    int64_t per = batch / M;
    int rc = 0;
    pp_flat_params_zero_grad(pp_trainer_params(t));
    pp_trainer_hold_params(t, 1); /* no update inside the step */
    for (int j = 0; j < M && rc == 0; j++) {
        pp_tensor *ins[2] = {M == 1 ? whole[0] : rows(whole[0], j * per, per),
                             M == 1 ? whole[1] : rows(whole[1], j * per, per)};
        float loss;
        pp_trainer_set_step(t, it, j);
        if (!ins[0] || !ins[1] || pp_trainer_backward(t, ins, 1.0f / (float)M, &loss) != PP_OK) {
            fprintf(stderr, "pippin-bench-microbatch: %s\n", pp_last_error());
            rc = 1;
        }
        if (M != 1) {
            pp_tensor_free(ins[0]);
            pp_tensor_free(ins[1]);
        }
    }
    pp_trainer_hold_params(t, 0);
    return rc;
}

int main(int argc, char **argv) {
    int threads = 1, batch = 8, iters = 5, ms[MAX_MS] = {1, 2, 4, 8}, n_ms = 4;
    const char *pack = "on";
    const char *src = getenv("PIPPIN_SOURCE_ROOT");
    char model_dir[4096];
    snprintf(model_dir, sizeof model_dir, "%s/test/fixtures/gpt", src ? src : PP_SOURCE_ROOT);
    static const struct option opts[] = {
        {"threads", required_argument, NULL, 't'}, {"batch", required_argument, NULL, 'b'},
        {"iters", required_argument, NULL, 'i'},   {"model", required_argument, NULL, 'm'},
        {"microbatches", required_argument, NULL, 'M'}, {"pack", required_argument, NULL, 'p'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't': threads = atoi(optarg); break;
        case 'b': batch = atoi(optarg); break;
        case 'i': iters = atoi(optarg); break;
        case 'm': snprintf(model_dir, sizeof model_dir, "%s", optarg); break;
        case 'p': pack = optarg; break;
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
                            "[--threads N] [--iters K] [--pack on|off|both]\n");
            return 2;
        }
    }
    int both = strcmp(pack, "both") == 0, n_t = both ? 2 : 1;
    if (threads < 1 || batch < 1 || iters < 1 || n_ms < 1 || (!both && strcmp(pack, "on") && strcmp(pack, "off")))
        return 2;
    for (int k = 0; k < n_ms; k++)
        if (ms[k] < 1 || batch % ms[k]) {
            fprintf(stderr, "pippin-bench-microbatch: %d microbatches do not divide batch %d\n", ms[k], batch);
            return 2;
        }
    pp_set_threads(threads);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.onnx", model_dir);
    pp_graph *g[2] = {NULL, NULL};
    pp_trainer *t[2] = {NULL, NULL};
    unsigned passes = pp_optimize_default();
    for (int k = 0; k < n_t; k++) { /* t[0]: as --pack says (both: on), t[1]: off */
        int on = k == 0 && strcmp(pack, "off") != 0;
        pp_optimize_set_default(on ? passes | PP_OPT_PACK : passes & ~PP_OPT_PACK);
        if (pp_onnx_load(path, &g[k]) != PP_OK || pp_trainer_new(g[k], NULL, &t[k]) != PP_OK) {
            fprintf(stderr, "pippin-bench-microbatch: %s\n", pp_last_error());
            for (int j = 0; j <= k; j++) pp_trainer_free(t[j]), pp_graph_free(g[j]);
            return 1;
        }
    }
    pp_optimize_set_default(passes);
    int tok = pp_graph_find_value(g[0], "tok_emb.weight"), pos = pp_graph_find_value(g[0], "pos_emb.weight");
    int64_t vocab = tok >= 0 ? g[0]->values[tok].shape[0] : 64, seq = pos >= 0 ? g[0]->values[pos].shape[0] : 16;
    unsigned seed = 1;
    pp_tensor *whole[2] = {bench_tokens(batch, seq, vocab, &seed), bench_tokens(batch, seq, vocab, &seed)};
    size_t cells = (size_t)(n_t * n_ms * iters);
    double *wall = calloc(cells, sizeof *wall), *cpu = calloc(cells, sizeof *cpu);
    int rc = !wall || !cpu;
    for (int i = -2; i < iters && rc == 0; i++)
        for (int k = 0; k < n_ms && rc == 0; k++)
            for (int v = 0; v < n_t && rc == 0; v++) {
                double w0 = bench_clock_ms(CLOCK_MONOTONIC), c0 = bench_clock_ms(CLOCK_PROCESS_CPUTIME_ID);
                rc = step(t[v], whole, batch, ms[k], i);
                if (i >= 0) {
                    wall[(v * n_ms + k) * iters + i] = bench_clock_ms(CLOCK_MONOTONIC) - w0;
                    cpu[(v * n_ms + k) * iters + i] = bench_clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
                }
            }
    if (rc == 0) {
        printf("GPT train step (forward + backward) as microbatches: %s, %.2fM parameters, batch %d x %lld "
               "tokens, %d thread%s, median of %d interleaved steps\n",
               model_dir, (double)pp_trainer_params(t[0])->total / 1e6, batch, (long long)seq, threads,
               threads == 1 ? "" : "s", iters);
        for (int v = 0; v < n_t; v++) {
            int on = v == 0 && strcmp(pack, "off") != 0;
            int64_t packed = 0, reused = 0;
            pp_exec_pack_stats(pp_trainer_exec(t[v]), &packed, &reused);
            printf(" weights packed once per step %s (%lld packs, %lld reuses):\n", on ? "on" : "off",
                   (long long)packed, (long long)reused);
            double w1 = 0, c1 = 0;
            for (int k = 0; k < n_ms; k++) {
                double w = bench_median(wall + (v * n_ms + k) * iters, iters);
                double cp = bench_median(cpu + (v * n_ms + k) * iters, iters);
                if (k == 0) w1 = w, c1 = cp;
                printf("  %d microbatch%s of %d: wall %9.2f ms (%.2fx)  cpu %9.2f ms (%.2fx)\n", ms[k],
                       ms[k] == 1 ? "  " : "es", batch / ms[k], w, w / w1, cp, cp / c1);
            }
        }
        for (int k = 0; both && k < n_ms; k++) /* medians sorted above */
            printf(" packing off/on at %d microbatch%s: wall %.3fx  cpu %.3fx\n", ms[k], ms[k] == 1 ? "" : "es",
                   wall[(n_ms + k) * iters + iters / 2] / wall[k * iters + iters / 2],
                   cpu[(n_ms + k) * iters + iters / 2] / cpu[k * iters + iters / 2]);
    }
    free(wall);
    free(cpu);
    pp_tensor_free(whole[0]);
    pp_tensor_free(whole[1]);
    for (int v = 0; v < n_t; v++) pp_trainer_free(t[v]), pp_graph_free(g[v]);
    return rc;
}

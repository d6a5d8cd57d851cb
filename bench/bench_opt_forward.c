/* One model's forward in pippin with a chosen set of optimizer passes:
 * loads MODEL, prepares it for inference (pp_graph_prepare_inference with
 * the passes given), feeds every int64 input random tokens [batch, seq]
 * below VOCAB, runs it WARMUP times, then times ITERS runs and prints one
 * JSON line: {"passes", "nodes", "threads", "median_ms", "min_ms",
 * "cpu_ms" (the process's CPU time per run, median: what a loaded machine
 * disturbs least at 1 thread), ...}.
 * bench/bench_ort_forward.py runs it beside ONNX Runtime and prints the
 * ratios.
 *
 *   pippin-bench-opt-forward MODEL --batch B --seq T --vocab V --threads N
 *                            [--passes LIST] [--iters K]
 *
 * LIST: pass names (pippin/optimize.h), "all" or "none" (default all). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pippin/pippin.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"batch", required_argument, NULL, 'b'}, {"seq", required_argument, NULL, 's'},
                                         {"vocab", required_argument, NULL, 'v'}, {"threads", required_argument, NULL, 't'},
                                         {"passes", required_argument, NULL, 'p'}, {"iters", required_argument, NULL, 'i'},
                                         {NULL, 0, NULL, 0}};
    int batch = 8, seq = 128, vocab = 65, threads = 1, iters = 20, c;
    const char *passes_text = "all";
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b': batch = atoi(optarg); break;
        case 's': seq = atoi(optarg); break;
        case 'v': vocab = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'p': passes_text = optarg; break;
        case 'i': iters = atoi(optarg); break;
        default: return 2;
        }
    }
    if (optind != argc - 1 || batch < 1 || seq < 1 || vocab < 1 || iters < 1) {
        fprintf(stderr, "usage: %s MODEL --batch B --seq T --vocab V --threads N [--passes LIST] [--iters K]\n", argv[0]);
        return 2;
    }
    unsigned passes;
    pp_graph *g = NULL;
    pp_exec *ex = NULL;
    if (pp_optimize_parse(passes_text, &passes) != PP_OK || pp_onnx_load(argv[optind], &g) != PP_OK) {
        fprintf(stderr, "%s\n", pp_last_error());
        return 1;
    }
    pp_set_threads(threads);
    pp_optimize_set_default(passes);
    double t0 = now_ms();
    int nodes_before = g->n_nodes;
    if (pp_graph_prepare_inference(g) != PP_OK || pp_exec_new(g, &ex) != PP_OK) {
        fprintf(stderr, "%s\n", pp_last_error());
        pp_graph_free(g);
        return 1;
    }
    double prepare_ms = now_ms() - t0;
    pp_exec_set_constant_params(ex, 1); /* as inference stages do */
    pp_tensor *ins[8] = {0}, *outs[8] = {0};
    if (g->n_inputs > 8 || g->n_outputs > 8) return 1;
    unsigned seed = 1;
    for (int i = 0; i < g->n_inputs; i++) {
        if (pp_tensor_empty(PP_I64, 2, (int64_t[]){batch, seq}, &ins[i]) != PP_OK) return 1;
        int64_t *d = ins[i]->data;
        for (int64_t k = 0; k < (int64_t)batch * seq; k++) {
            seed = seed * 1103515245u + 12345u;
            d[k] = (int64_t)((seed >> 8) % (unsigned)vocab);
        }
    }
    double *ms = calloc((size_t)iters, sizeof *ms), *cpu = calloc((size_t)iters, sizeof *cpu);
    for (int it = -3; it < iters; it++) { /* 3 warm-up runs */
        double s = now_ms(), sc = cpu_ms();
        if (pp_exec_run(ex, ins, outs) != PP_OK) {
            fprintf(stderr, "%s\n", pp_last_error());
            return 1;
        }
        if (it >= 0) ms[it] = now_ms() - s, cpu[it] = cpu_ms() - sc;
        for (int o = 0; o < g->n_outputs; o++) pp_tensor_free(outs[o]);
    }
    qsort(ms, (size_t)iters, sizeof *ms, cmp_double);
    qsort(cpu, (size_t)iters, sizeof *cpu, cmp_double);
    printf("{\"passes\": \"%s\", \"nodes_before\": %d, \"nodes\": %d, \"threads\": %d, \"batch\": %d, \"seq\": %d, "
           "\"median_ms\": %.3f, \"min_ms\": %.3f, \"cpu_ms\": %.3f, \"prepare_ms\": %.1f}\n",
           passes_text, nodes_before, g->n_nodes, threads, batch, seq, ms[iters / 2], ms[0], cpu[iters / 2], prepare_ms);
    free(ms);
    free(cpu);
    for (int i = 0; i < g->n_inputs; i++) pp_tensor_free(ins[i]);
    pp_exec_free(ex);
    pp_graph_free(g);
    return 0;
}

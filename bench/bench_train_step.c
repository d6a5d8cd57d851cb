/* One training step (forward + backward, all parameter gradients) and one
 * forward (loss and logits) of a GPT (the fixture, or --model DIR as
 * bench/bench_gpt.py exports it) against PyTorch 1.13 on the same number of
 * threads, and the peak resident memory of both processes.
 *
 *   pippin-bench-train [--threads N] [--pool-threads P] [--batch B] [--iters K]
 *                      [--model DIR] [--no-torch] [--json]
 *
 * --threads sets pippin's kernel pool, which runs the GEMMs too
 * (pp_set_threads); --pool-threads 1 with --threads N instead runs the
 * kernels on one thread and the GEMMs whole on OpenBLAS's own N threads, as
 * pippin did before its pool (and before the GEMMs moved onto it). --json
 * adds one JSON line.
 *
 * The torch side is bench/torch_forward.py, run with /usr/bin/python3. */
#include <cblas.h>
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "pippin/pippin.h"

#include "bench_util.h"
#include "thread_pool.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

/* Runs the torch script; fills *ms and *rss (MB). 0 on success. */
static int torch_numbers(const char *src, const char *model_dir, int threads, int batch, int iters,
                         double *ms, double *fwd_ms, double *rss) {
    if (access("/usr/bin/python3", X_OK) != 0) return -1;
    char cmd[8800], line[8192] = "";
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/bench/torch_forward.py --model %s --threads %d --batch %d "
             "--iters %d 2>/dev/null",
             src, model_dir, threads, batch, iters);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char buf[8192];
    while (fgets(buf, sizeof buf, p))
        if (buf[0] == '{') snprintf(line, sizeof line, "%s", buf);
    if (pclose(p) != 0 || !line[0]) return -1;
    json_object *o = json_tokener_parse(line), *v;
    if (!o) return -1;
    int ok = json_object_object_get_ex(o, "train_step_ms", &v);
    if (ok) *ms = json_object_get_double(v);
    ok = ok && json_object_object_get_ex(o, "forward_ms", &v);
    if (ok) *fwd_ms = json_object_get_double(v);
    ok = ok && json_object_object_get_ex(o, "peak_rss_mb", &v);
    if (ok) *rss = json_object_get_double(v);
    json_object_put(o);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    int threads = 1, pool = 0, batch = 32, iters = 20, no_torch = 0, json = 0;
    const char *src = getenv("PIPPIN_SOURCE_ROOT");
    char model_dir[4096];
    snprintf(model_dir, sizeof model_dir, "%s/test/fixtures/gpt", src ? src : PP_SOURCE_ROOT);
    static const struct option opts[] = {
        {"threads", required_argument, NULL, 't'}, {"batch", required_argument, NULL, 'b'},
        {"iters", required_argument, NULL, 'i'},   {"model", required_argument, NULL, 'm'},
        {"no-torch", no_argument, NULL, 'n'},      {"pool-threads", required_argument, NULL, 'p'},
        {"json", no_argument, NULL, 'j'},          {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "t:b:i:m:", opts, NULL)) != -1) {
        switch (c) {
        case 't': threads = atoi(optarg); break;
        case 'b': batch = atoi(optarg); break;
        case 'i': iters = atoi(optarg); break;
        case 'm': snprintf(model_dir, sizeof model_dir, "%s", optarg); break;
        case 'n': no_torch = 1; break;
        case 'p': pool = atoi(optarg); break;
        case 'j': json = 1; break;
        default:
            fprintf(stderr, "usage: pippin-bench-train [--threads N] [--pool-threads P] [--batch B] "
                            "[--iters K] [--model DIR] [--no-torch] [--json]\n");
            return 2;
        }
    }
    if (threads < 1 || batch < 1 || iters < 1 || pool < 0) return 2;
    pp_set_threads(threads);
    if (pool > 0) pp_pool_set_size(pool);
    if (pool == 1 && threads > 1) pp_set_blas_threads(threads); /* OpenBLAS's threads, as before */

    char path[4200];
    snprintf(path, sizeof path, "%s/model.onnx", model_dir);
    pp_graph *g = NULL;
    pp_trainer *t = NULL;
    if (pp_onnx_load(path, &g) != PP_OK || pp_trainer_new(g, NULL, &t) != PP_OK) {
        fprintf(stderr, "pippin-bench-train: %s\n", pp_last_error());
        pp_graph_free(g);
        return 1;
    }
    /* vocab and block size from the embeddings */
    int tok = pp_graph_find_value(g, "tok_emb.weight"), pos = pp_graph_find_value(g, "pos_emb.weight");
    int64_t vocab = tok >= 0 ? g->values[tok].shape[0] : 64, seq = pos >= 0 ? g->values[pos].shape[0] : 16;
    unsigned seed = 1;
    pp_tensor *ins[2] = {bench_tokens(batch, seq, vocab, &seed), bench_tokens(batch, seq, vocab, &seed)};
    double rss_before = peak_rss_mb();
    double *ts = malloc(sizeof(double) * (size_t)iters);
    pp_flat_params *fp = pp_trainer_params(t);
    int rc = 0;
    for (int i = -3; i < iters && rc == 0; i++) {
        double t0 = now_ms();
        pp_flat_params_zero_grad(fp);
        float loss;
        if (pp_trainer_backward(t, ins, 1.0f, &loss) != PP_OK) {
            fprintf(stderr, "pippin-bench-train: %s\n", pp_last_error());
            rc = 1;
        }
        if (i >= 0) ts[i] = now_ms() - t0;
    }
    double rss = peak_rss_mb(); /* the training's peak */
    /* the forward alone (loss and logits), on the model loaded again: the
     * trainer's graph has inputs of its own */
    pp_exec *ex = NULL;
    pp_graph *g2 = NULL;
    double *fs = malloc(sizeof(double) * (size_t)iters);
    pp_tensor **outs = calloc((size_t)g->n_outputs + 1, sizeof *outs);
    if (rc == 0 && (pp_onnx_load(path, &g2) != PP_OK || pp_exec_new(g2, &ex) != PP_OK || !fs || !outs)) {
        fprintf(stderr, "pippin-bench-train: %s\n", pp_last_error());
        rc = 1;
    }
    for (int i = -3; i < iters && rc == 0; i++) {
        double t0 = now_ms();
        if (pp_exec_run(ex, ins, outs) != PP_OK) {
            fprintf(stderr, "pippin-bench-train: %s\n", pp_last_error());
            rc = 1;
        }
        for (int o = 0; o < g2->n_outputs; o++) pp_tensor_free(outs[o]), outs[o] = NULL;
        if (i >= 0) fs[i] = now_ms() - t0;
    }
    if (rc == 0) {
        qsort(ts, (size_t)iters, sizeof *ts, bench_cmp_double);
        qsort(fs, (size_t)iters, sizeof *fs, bench_cmp_double);
        double ms = ts[iters / 2], fms = fs[iters / 2];
        printf("GPT train step (forward + backward) and forward, batch %d x %lld tokens, %d thread%s "
               "(kernel pool %d)\n",
               batch, (long long)seq, threads, threads == 1 ? "" : "s", pp_get_threads());
        printf("  pippin: train %8.3f ms  forward %8.3f ms  peak RSS %7.1f MB (%.1f MB above the loaded model)\n",
               ms, fms, rss, rss - rss_before);
        double tms = 0, tfms = 0, trss = 0;
        int have_torch = !no_torch && torch_numbers(src ? src : PP_SOURCE_ROOT, model_dir, threads, batch, iters,
                                                    &tms, &tfms, &trss) == 0;
        if (have_torch) {
            printf("  torch : train %8.3f ms  forward %8.3f ms  peak RSS %7.1f MB\n", tms, tfms, trss);
            printf("  speed ratio torch/pippin: train %.2fx, forward %.2fx (>1: pippin faster); memory ratio "
                   "torch/pippin %.2fx\n",
                   tms / ms, tfms / fms, trss / rss);
        } else {
            printf("  torch unavailable\n");
        }
        if (json)
            printf("{\"threads\": %d, \"pool\": %d, \"batch\": %d, \"seq\": %lld, \"train_ms\": %.4f, "
                   "\"forward_ms\": %.4f, \"rss_mb\": %.1f, \"torch_train_ms\": %.4f, \"torch_forward_ms\": %.4f, "
                   "\"torch_rss_mb\": %.1f}\n",
                   threads, pp_get_threads(), batch, (long long)seq, ms, fms, rss, have_torch ? tms : 0.0,
                   have_torch ? tfms : 0.0, have_torch ? trss : 0.0);
    }
    pp_exec_free(ex);
    pp_graph_free(g2);
    free(outs);
    free(fs);
    free(ts);
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    pp_trainer_free(t);
    pp_graph_free(g);
    return rc;
}

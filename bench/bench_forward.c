/* Forward pass of the GPT fixture at batch 32 against PyTorch 1.13 eager on
 * the same number of threads, and the model's largest MatMul through
 * pippin's kernel against a direct cblas_sgemm call of the same shape.
 *
 *   pippin-bench-forward [--threads N] [--batch B] [--iters K] [--no-torch]
 *
 * Targets: pippin no slower than PyTorch; the GEMM path >= 0.9x direct
 * cblas. The torch side is bench/torch_forward.py (/usr/bin/python3). */
#include <cblas.h>
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pippin/pippin.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static pp_tensor *tokens(int64_t batch, int64_t seq, int64_t vocab, unsigned seed) {
    pp_tensor *t;
    if (pp_tensor_empty(PP_I64, 2, (int64_t[]){batch, seq}, &t) != PP_OK) return NULL;
    int64_t *d = t->data;
    for (int64_t i = 0; i < batch * seq; i++) {
        seed = seed * 1103515245u + 12345u;
        d[i] = (int64_t)((seed >> 8) % (unsigned)vocab);
    }
    return t;
}

static int torch_forward_ms(const char *src, int threads, int batch, int iters, double *ms) {
    if (access("/usr/bin/python3", X_OK) != 0) return -1;
    char cmd[8600], line[4096] = "", buf[4096];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/bench/torch_forward.py --threads %d --batch %d --iters %d 2>/dev/null",
             src, threads, batch, iters);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    while (fgets(buf, sizeof buf, p))
        if (buf[0] == '{') snprintf(line, sizeof line, "%s", buf);
    if (pclose(p) != 0 || !line[0]) return -1;
    json_object *o = json_tokener_parse(line), *v;
    int ok = o && json_object_object_get_ex(o, "forward_ms", &v);
    if (ok) *ms = json_object_get_double(v);
    json_object_put(o);
    return ok ? 0 : -1;
}

/* The MatMul with the most flops in one forward: its M, K, N. */
static void largest_matmul(pp_graph *g, pp_tensor *const *ins, int64_t *M, int64_t *K, int64_t *N) {
    pp_exec *ex;
    *M = *K = *N = 0;
    if (pp_exec_new(g, &ex) != PP_OK) return;
    pp_tensor **env = calloc((size_t)g->n_values, sizeof *env);
    uint8_t *keep = malloc((size_t)g->n_values);
    memset(keep, 1, (size_t)g->n_values);
    for (int i = 0; i < g->n_inputs; i++) env[g->inputs[i]] = pp_tensor_retain(ins[i]);
    int *all = malloc(sizeof(int) * (size_t)g->n_nodes);
    for (int i = 0; i < g->n_nodes; i++) all[i] = i;
    if (pp_exec_run_nodes(ex, all, g->n_nodes, env, keep) == PP_OK) {
        double best = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const pp_node *n = &g->nodes[i];
            if (strcmp(n->op_type, "MatMul") != 0) continue;
            const pp_tensor *a = env[n->in[0]] ? env[n->in[0]] : g->values[n->in[0]].data;
            const pp_tensor *b = env[n->in[1]] ? env[n->in[1]] : g->values[n->in[1]].data;
            if (!a || !b || b->ndim != 2) continue; /* weight products: one GEMM */
            int64_t m = pp_tensor_numel(a) / a->shape[a->ndim - 1], k = b->shape[0], nn = b->shape[1];
            if ((double)m * k * nn > best) {
                best = (double)m * k * nn;
                *M = m, *K = k, *N = nn;
            }
        }
    }
    for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[v]);
    free(env);
    free(keep);
    free(all);
    pp_exec_free(ex);
}

int main(int argc, char **argv) {
    int threads = 1, batch = 32, iters = 30, no_torch = 0;
    const char *src = getenv("PIPPIN_SOURCE_ROOT");
    if (!src) src = PP_SOURCE_ROOT;
    static const struct option opts[] = {
        {"threads", required_argument, NULL, 't'}, {"batch", required_argument, NULL, 'b'},
        {"iters", required_argument, NULL, 'i'},   {"no-torch", no_argument, NULL, 'n'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "t:b:i:n", opts, NULL)) != -1) {
        if (c == 't') threads = atoi(optarg);
        else if (c == 'b') batch = atoi(optarg);
        else if (c == 'i') iters = atoi(optarg);
        else if (c == 'n') no_torch = 1;
        else {
            fprintf(stderr, "usage: pippin-bench-forward [--threads N] [--batch B] [--iters K] [--no-torch]\n");
            return 2;
        }
    }
    openblas_set_num_threads(threads);
    char path[4096];
    snprintf(path, sizeof path, "%s/test/fixtures/gpt/model.onnx", src);
    pp_graph *g;
    if (pp_onnx_load(path, &g) != PP_OK) {
        fprintf(stderr, "%s\n", pp_last_error());
        return 1;
    }
    pp_tensor *ins[2] = {tokens(batch, 16, 64, 1), tokens(batch, 16, 64, 2)};
    pp_exec *ex;
    if (pp_exec_new(g, &ex) != PP_OK) return 1;
    double *t = calloc((size_t)iters, sizeof *t);
    for (int i = -3; i < iters; i++) {
        pp_tensor *outs[2];
        double t0 = now_ms();
        if (pp_exec_run(ex, ins, outs) != PP_OK) {
            fprintf(stderr, "%s\n", pp_last_error());
            return 1;
        }
        if (i >= 0) t[i] = now_ms() - t0;
        pp_tensor_free(outs[0]);
        pp_tensor_free(outs[1]);
    }
    double pippin_ms = median(t, iters);
    printf("gpt forward, batch %d x 16 tokens, %d thread(s)\n", batch, threads);
    printf("  pippin   %8.3f ms\n", pippin_ms);
    double torch_ms;
    if (!no_torch && torch_forward_ms(src, threads, batch, iters, &torch_ms) == 0)
        printf("  pytorch  %8.3f ms   ratio pytorch/pippin %.2fx (>= 1 means pippin is faster)\n", torch_ms,
               torch_ms / pippin_ms);
    else
        printf("  pytorch  unavailable (needs /usr/bin/python3 with python3-torch)\n");

    /* The largest GEMM: pippin's MatMul kernel vs cblas_sgemm on the same data. */
    int64_t M, K, N;
    largest_matmul(g, ins, &M, &K, &N);
    pp_graph *mg;
    pp_graph_new("mm", &mg);
    int a, b, node;
    pp_graph_add_input(mg, "a", PP_F32, 2, (int64_t[]){M, K}, &a);
    pp_graph_add_input(mg, "b", PP_F32, 2, (int64_t[]){K, N}, &b);
    pp_graph_add_node(mg, "MatMul", "", "mm", 2, (int[]){a, b}, 1, NULL, &node);
    pp_graph_add_output(mg, mg->nodes[node].out[0]);
    pp_tensor *A, *B, *C;
    pp_tensor_new(PP_F32, 2, (int64_t[]){M, K}, &A);
    pp_tensor_new(PP_F32, 2, (int64_t[]){K, N}, &B);
    pp_tensor_new(PP_F32, 2, (int64_t[]){M, N}, &C);
    for (int64_t i = 0; i < M * K; i++) ((float *)A->data)[i] = (float)(i % 7) * 0.1f;
    for (int64_t i = 0; i < K * N; i++) ((float *)B->data)[i] = (float)(i % 5) * 0.1f;
    pp_exec *mex;
    pp_exec_new(mg, &mex);
    int reps = 200;
    double *tp = calloc((size_t)reps, sizeof *tp), *tc = calloc((size_t)reps, sizeof *tc);
    pp_tensor *mins[2] = {A, B};
    for (int i = -10; i < reps; i++) {
        pp_tensor *out;
        double t0 = now_ms();
        pp_exec_run(mex, mins, &out);
        double t1 = now_ms();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, A->data, (int)K,
                    B->data, (int)N, 0.0f, C->data, (int)N);
        double t2 = now_ms();
        if (i >= 0) {
            tp[i] = t1 - t0;
            tc[i] = t2 - t1;
        }
        pp_tensor_free(out);
    }
    double mp = median(tp, reps), mc = median(tc, reps);
    printf("largest MatMul [%lld x %lld] x [%lld x %lld]\n", (long long)M, (long long)K, (long long)K, (long long)N);
    printf("  pippin MatMul %8.4f ms, direct cblas_sgemm %8.4f ms: pippin at %.2fx of cblas (target >= 0.9x)\n",
           mp, mc, mc / mp);
    pp_exec_free(mex);
    pp_graph_free(mg);
    pp_tensor_free(A);
    pp_tensor_free(B);
    pp_tensor_free(C);
    free(tp);
    free(tc);
    free(t);
    pp_exec_free(ex);
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    pp_graph_free(g);
    return 0;
}

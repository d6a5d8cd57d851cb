/* Closed-loop clients against a serving pipeline (mode: serve): N threads,
 * each with its own client (pippin/client.h), send a request, wait for its
 * answer, send the next, for a given time. Prints one JSON line: requests
 * per second, tokens per second (batch x seq per request), p50/p99 latency.
 * bench/bench_serve.py starts the service and ONNX Runtime and prints the
 * ratios.
 *
 *   pippin-bench-serve ENDPOINT [--clients N] [--seconds S] [--batch B] [--seq T] [--vocab V]
 *                      [--inputs idx,targets]
 *
 * Every input (--inputs, comma-separated; default the example GPT's idx and
 * targets) is int64 [B, T] of random tokens below V; the output asked for is
 * logits. Up to 1024 clients, each its own thread and connection. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pippin/client.h"
#include "pippin/tensor.h"

#define MAX_INPUTS 8

typedef struct {
    const char *endpoint;
    int n_inputs;
    const char *inputs[MAX_INPUTS];
    double seconds;
    int batch, seq, vocab, id;
    double *lat;
    long n, cap, errors;
    char error[256];
} worker;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *run(void *arg) {
    worker *w = arg;
    pp_client *c;
    if (pp_client_connect(w->endpoint, NULL, &c) != PP_OK) {
        snprintf(w->error, sizeof w->error, "%s", pp_last_error());
        w->errors++;
        return NULL;
    }
    pp_tensor *in[MAX_INPUTS] = {0};
    int64_t shape[2] = {w->batch, w->seq};
    unsigned seed = 7u + (unsigned)w->id;
    for (int k = 0; k < w->n_inputs; k++) {
        if (pp_tensor_new(PP_I64, 2, shape, &in[k]) != PP_OK) {
            snprintf(w->error, sizeof w->error, "%s", pp_last_error());
            w->errors++;
            for (int j = 0; j < k; j++) pp_tensor_free(in[j]);
            pp_client_close(c);
            return NULL;
        }
        for (int64_t i = 0; i < shape[0] * shape[1]; i++) ((int64_t *)in[k]->data)[i] = rand_r(&seed) % w->vocab;
    }
    const char *outs[1] = {"logits"};
    double end = now_ms() + w->seconds * 1e3;
    while (now_ms() < end) {
        double t0 = now_ms();
        uint64_t id;
        pp_response *r = NULL;
        if (pp_client_submit(c, w->n_inputs, w->inputs, in, 1, outs, 10000, &id) != PP_OK ||
            pp_client_wait(c, id, 11000, &r) != PP_OK || r->code != PP_SERVE_OK) {
            w->errors++;
            snprintf(w->error, sizeof w->error, "%s", r ? r->error : pp_last_error());
            pp_response_free(r);
            continue;
        }
        pp_response_free(r);
        if (w->n == w->cap) {
            w->cap = w->cap ? 2 * w->cap : 1024;
            w->lat = realloc(w->lat, sizeof *w->lat * (size_t)w->cap);
            if (!w->lat) break;
        }
        w->lat[w->n++] = now_ms() - t0;
    }
    for (int k = 0; k < w->n_inputs; k++) pp_tensor_free(in[k]);
    pp_client_close(c);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: %s ENDPOINT [--clients N] [--seconds S] [--batch B] [--seq T] [--vocab V] "
                "[--inputs idx,targets]\n",
                argv[0]);
        return 2;
    }
    int clients = 1, batch = 1, seq = 64, vocab = 58;
    double seconds = 5;
    char inputs[256] = "idx,targets";
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--clients")) clients = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) seq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--vocab")) vocab = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--inputs")) snprintf(inputs, sizeof inputs, "%s", argv[i + 1]);
        else {
            fprintf(stderr, "%s: unknown option %s\n", argv[0], argv[i]);
            return 2;
        }
    }
    const char *names[MAX_INPUTS];
    int n_inputs = 0;
    for (char *save = NULL, *t = strtok_r(inputs, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n_inputs == MAX_INPUTS) return 2;
        names[n_inputs++] = t;
    }
    if (n_inputs == 0) return 2;
    if (clients < 1 || clients > 1024 || batch < 1 || seq < 1 || vocab < 1) return 2;
    worker *w = calloc((size_t)clients, sizeof *w);
    pthread_t *th = calloc((size_t)clients, sizeof *th);
    if (!w || !th) return 1;
    double t0 = now_ms();
    for (int i = 0; i < clients; i++) {
        w[i] = (worker){.endpoint = argv[1], .n_inputs = n_inputs, .seconds = seconds, .batch = batch,
                        .seq = seq, .vocab = vocab, .id = i};
        memcpy(w[i].inputs, names, sizeof names[0] * (size_t)n_inputs);
        if (pthread_create(&th[i], NULL, run, &w[i])) {
            fprintf(stderr, "%s: cannot start client thread %d\n", argv[0], i);
            return 1;
        }
    }
    long n = 0, errors = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        n += w[i].n;
        errors += w[i].errors;
    }
    double wall = (now_ms() - t0) / 1e3;
    double *all = malloc(sizeof *all * (size_t)(n + 1));
    long k = 0;
    for (int i = 0; i < clients; i++) {
        if (all) memcpy(all + k, w[i].lat, sizeof *all * (size_t)w[i].n);
        k += w[i].n;
        free(w[i].lat);
    }
    if (all && n) qsort(all, (size_t)n, sizeof *all, cmp);
    printf("{\"clients\": %d, \"requests\": %ld, \"errors\": %ld, \"rps\": %.2f, \"tokens_per_s\": %.1f, "
           "\"p50_ms\": %.3f, \"p99_ms\": %.3f}\n",
           clients, n, errors, n / wall, (double)n * batch * seq / wall, n && all ? all[n / 2] : 0.0,
           n && all ? all[(long)((double)n * 0.99) < n ? (long)((double)n * 0.99) : n - 1] : 0.0);
    for (int i = 0; i < clients && errors; i++)
        if (w[i].errors) {
            fprintf(stderr, "pippin-bench-serve: %ld errors, e.g. %s\n", errors, w[i].error);
            break;
        }
    free(all);
    free(w);
    free(th);
    return errors ? 1 : 0;
}

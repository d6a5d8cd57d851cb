/* Closed-loop generation clients against a serving decoder (mode: serve, a
 * model with a KV cache): N threads, each with its own client
 * (pippin/client.h), start a greedy generation (a random prompt of P tokens,
 * M tokens to produce, no session), read its streamed tokens to the end,
 * start the next, for a given time. Prints one JSON line: generations and
 * tokens per second, the time to the first token (p50) and the per-token
 * latency (the time between two streamed tokens of one generation, p50/p99).
 * bench/bench_generate.py starts the service and ONNX Runtime and prints the
 * ratios.
 *
 *   pippin-bench-generate ENDPOINT [--clients N] [--seconds S] [--prompt P] [--max-tokens M] [--vocab V] */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pippin/client.h"
#include "pippin/tensor.h"

typedef struct {
    double *v;
    long n, cap;
} samples;

typedef struct {
    const char *endpoint;
    double seconds;
    int prompt, max_tokens, vocab, id;
    samples gap, first;
    long gens, tokens, errors;
    char error[256];
} worker;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int push(samples *s, double x) {
    if (s->n == s->cap) {
        long cap = s->cap ? 2 * s->cap : 1024;
        double *v = realloc(s->v, sizeof *v * (size_t)cap);
        if (!v) return -1;
        s->v = v, s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

static void *run(void *arg) {
    worker *w = arg;
    pp_client *c;
    if (pp_client_connect(w->endpoint, NULL, &c) != PP_OK) {
        snprintf(w->error, sizeof w->error, "%s", pp_last_error());
        w->errors++;
        return NULL;
    }
    pp_tensor *toks;
    if (pp_tensor_new(PP_I64, 2, (int64_t[]){1, w->prompt}, &toks) != PP_OK) return NULL;
    unsigned seed = 11u + (unsigned)w->id;
    pp_generate_options o;
    pp_generate_options_init(&o);
    o.max_tokens = (uint32_t)w->max_tokens;
    o.timeout_ms = 30000;
    double end = now_ms() + w->seconds * 1e3;
    while (now_ms() < end) {
        for (int i = 0; i < w->prompt; i++) ((int64_t *)toks->data)[i] = rand_r(&seed) % w->vocab;
        uint64_t id;
        double t0 = now_ms(), last = t0;
        long got = 0;
        int failed = pp_client_submit_generate(c, toks, NULL, &o, &id) != PP_OK;
        for (int more = 1; !failed && more;) {
            pp_response *r = NULL;
            if (pp_client_wait(c, id, 31000, &r) != PP_OK || r->code != PP_SERVE_OK) {
                snprintf(w->error, sizeof w->error, "%s", r ? r->error : pp_last_error());
                pp_response_free(r);
                failed = 1;
                break;
            }
            double t = now_ms();
            if (r->n_tokens > 0) {
                if (got == 0) push(&w->first, t - t0);
                else push(&w->gap, (t - last) / r->n_tokens);
                got += r->n_tokens;
                last = t;
            }
            more = r->more;
            pp_response_free(r);
        }
        if (failed) {
            w->errors++;
            continue;
        }
        w->gens++;
        w->tokens += got;
    }
    pp_tensor_free(toks);
    pp_client_close(c);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Every worker's samples of one kind, sorted; q-quantile. */
static double quantile(worker *w, int n, size_t off, double q) {
    long total = 0, k = 0;
    for (int i = 0; i < n; i++) total += ((samples *)((char *)&w[i] + off))->n;
    if (!total) return 0;
    double *all = malloc(sizeof *all * (size_t)total);
    if (!all) return 0;
    for (int i = 0; i < n; i++) {
        samples *s = (samples *)((char *)&w[i] + off);
        memcpy(all + k, s->v, sizeof *all * (size_t)s->n);
        k += s->n;
    }
    qsort(all, (size_t)total, sizeof *all, cmp);
    long at = (long)((double)total * q);
    double x = all[at < total ? at : total - 1];
    free(all);
    return x;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s ENDPOINT [--clients N] [--seconds S] [--prompt P] [--max-tokens M] [--vocab V]\n",
                argv[0]);
        return 2;
    }
    int clients = 1, prompt = 16, max_tokens = 32, vocab = 58;
    double seconds = 5;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--clients")) clients = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt")) prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-tokens")) max_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--vocab")) vocab = atoi(argv[i + 1]);
    }
    if (clients < 1 || clients > 1024 || prompt < 1 || max_tokens < 1 || vocab < 1) return 2;
    worker *w = calloc((size_t)clients, sizeof *w);
    pthread_t *th = calloc((size_t)clients, sizeof *th);
    if (!w || !th) return 1;
    double t0 = now_ms();
    for (int i = 0; i < clients; i++) {
        w[i] = (worker){.endpoint = argv[1], .seconds = seconds, .prompt = prompt, .max_tokens = max_tokens,
                        .vocab = vocab, .id = i};
        pthread_create(&th[i], NULL, run, &w[i]);
    }
    long gens = 0, tokens = 0, errors = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        gens += w[i].gens;
        tokens += w[i].tokens;
        errors += w[i].errors;
    }
    double wall = (now_ms() - t0) / 1e3;
    printf("{\"clients\": %d, \"generations\": %ld, \"tokens\": %ld, \"errors\": %ld, \"gen_per_s\": %.2f, "
           "\"tokens_per_s\": %.1f, \"first_p50_ms\": %.3f, \"token_p50_ms\": %.3f, \"token_p99_ms\": %.3f}\n",
           clients, gens, tokens, errors, gens / wall, tokens / wall, quantile(w, clients, offsetof(worker, first), 0.5),
           quantile(w, clients, offsetof(worker, gap), 0.5), quantile(w, clients, offsetof(worker, gap), 0.99));
    if (errors) fprintf(stderr, "pippin-bench-generate: %ld errors, e.g. %s\n", errors, w[0].error);
    for (int i = 0; i < clients; i++) free(w[i].gap.v), free(w[i].first.v);
    free(w);
    free(th);
    return errors ? 1 : 0;
}

/* Model loading benchmark (not a test): peak RSS and time of pp_onnx_load
 * against the former loader in the same run (the whole file read into
 * memory, decoded by protobuf-c with its copy of every raw_data, then each
 * initializer copied into its tensor). Each load runs in its own process,
 * whose peak RSS wait4 reports; the ratio to the file size is printed.
 * For a FILE.safetensors: pp_safetensors_load (each tensor read straight
 * into place) against the former way (the whole file read, then parsed
 * from memory, which copies each tensor out); a missing FILE.safetensors
 * is first written with 12 float32 tensors of 768 x 3072 (108 MiB, a GPT's
 * MLP weights).
 * Usage: pippin-bench-load MODEL.onnx|FILE.safetensors [reps] (default 3;
 * min and median). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "file_io.h"
#include "onnx.pb-c.h"
#include "onnx_tensor.h"
#include "pippin/graph.h"
#include "pippin/onnx.h"
#include "pippin/safetensors.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The loader as it was: one buffer for the file, protobuf-c's copies, and
 * the tensors (the graph around them is small and left out). */
static int former_load(const char *path) {
    unsigned char *buf;
    size_t len;
    if (pp_read_file(path, (size_t)2 << 30, &buf, &len) != PP_OK) return 1;
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
    if (!m || !m->graph) return 1;
    size_t n = m->graph->n_initializer;
    pp_tensor **t = calloc(n ? n : 1, sizeof *t);
    for (size_t i = 0; t && i < n; i++)
        if (pp_onnx_tensor_from_proto(m->graph->initializer[i], "bench", &t[i]) != PP_OK) return 1;
    onnx__model_proto__free_unpacked(m, NULL);
    free(buf);
    for (size_t i = 0; t && i < n; i++) pp_tensor_free(t[i]);
    free(t);
    return 0;
}

static int new_load(const char *path) {
    pp_graph *g;
    if (pp_onnx_load(path, &g) != PP_OK) {
        fprintf(stderr, "pippin-bench-load: %s\n", pp_last_error());
        return 1;
    }
    pp_graph_free(g);
    return 0;
}

static int st_new_load(const char *path) {
    pp_safetensors *st;
    if (pp_safetensors_load(path, &st) != PP_OK) {
        fprintf(stderr, "pippin-bench-load: %s\n", pp_last_error());
        return 1;
    }
    pp_safetensors_free(st);
    return 0;
}

/* The former pp_safetensors_load: the whole file, then a copy of each tensor. */
static int st_former_load(const char *path) {
    unsigned char *buf;
    size_t len;
    pp_safetensors *st;
    if (pp_read_file(path, SIZE_MAX / 2, &buf, &len) != PP_OK) return 1;
    pp_status s = pp_safetensors_parse(buf, len, path, &st);
    free(buf);
    if (s != PP_OK) return 1;
    pp_safetensors_free(st);
    return 0;
}

static int make_safetensors(const char *path) {
    enum { N = 12 };
    pp_tensor *t[N];
    const char *names[N];
    char buf[N][32];
    for (int i = 0; i < N; i++) {
        if (pp_tensor_empty(PP_F32, 2, (const int64_t[]){768, 3072}, &t[i]) != PP_OK) return 1;
        for (int64_t k = 0; k < 768 * 3072; k++) ((float *)t[i]->data)[k] = (float)(k % 977) * 1e-3f;
        snprintf(buf[i], sizeof buf[i], "blocks.%d.mlp.weight", i);
        names[i] = buf[i];
    }
    pp_status s = pp_safetensors_save(path, N, names, t, 0, NULL, NULL);
    for (int i = 0; i < N; i++) pp_tensor_free(t[i]);
    if (s != PP_OK) fprintf(stderr, "pippin-bench-load: %s\n", pp_last_error());
    return s != PP_OK;
}

typedef int (*load_fn)(const char *path);

/* Runs one load in a child; *secs its time, *rss_kib its peak RSS. */
static int measure(const char *path, load_fn load, double *secs, long *rss_kib) {
    int fd[2];
    if (pipe(fd)) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        close(fd[0]);
        double t0 = now();
        int rc = load(path);
        double t = now() - t0;
        if (rc || write(fd[1], &t, sizeof t) != (ssize_t)sizeof t) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    ssize_t got = read(fd[0], secs, sizeof *secs);
    close(fd[0]);
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) != pid || got != (ssize_t)sizeof *secs || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        return 1;
    *rss_kib = ru.ru_maxrss;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: pippin-bench-load MODEL.onnx|FILE.safetensors [reps]\n");
        return 2;
    }
    const char *path = argv[1];
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    if (reps < 1 || reps > 50) reps = 3;
    size_t plen = strlen(path);
    int safetensors = plen > 12 && strcmp(path + plen - 12, ".safetensors") == 0;
    struct stat st;
    if (safetensors && stat(path, &st) != 0 && make_safetensors(path)) return 1;
    load_fn loads[2] = {safetensors ? st_new_load : new_load, safetensors ? st_former_load : former_load};
    if (stat(path, &st) != 0) {
        perror(path);
        return 1;
    }
    double mib = (double)st.st_size / (1 << 20), load = 0;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &load) != 1) load = 0;
        fclose(la);
    }
    printf("%s: %.1f MiB; %d runs of each, interleaved, one process per load (load average %.2f)\n", path,
           mib, reps, load);
    double t[2][50], r[2][50];
    for (int k = 0; k < reps; k++)
        for (int f = 0; f < 2; f++) {
            long kib;
            if (measure(path, loads[f], &t[f][k], &kib)) {
                fprintf(stderr, "pippin-bench-load: %s load failed\n", f ? "former" : "new");
                return 1;
            }
            r[f][k] = kib / 1024.0;
        }
    const char *label[2] = {safetensors ? "safetensors" : "pp_onnx_load", "former loader"};
    double med_t[2], med_r[2];
    printf("%-14s %10s %10s %12s %12s %10s\n", "", "time min", "median", "peak RSS min", "median", "RSS/file");
    for (int f = 0; f < 2; f++) {
        qsort(t[f], (size_t)reps, sizeof(double), cmp_double);
        qsort(r[f], (size_t)reps, sizeof(double), cmp_double);
        med_t[f] = t[f][reps / 2];
        med_r[f] = r[f][reps / 2];
        printf("%-14s %8.3f s %8.3f s %8.1f MiB %8.1f MiB %9.2fx\n", label[f], t[f][0], med_t[f], r[f][0], med_r[f],
               med_r[f] / mib);
    }
    printf("%s / former: time %.2fx, peak RSS %.2fx (target: RSS <= 1.5x the file)\n", label[0], med_t[0] / med_t[1],
           med_r[0] / med_r[1]);
    return 0;
}

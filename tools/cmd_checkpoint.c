/* pippin checkpoint: list, inspect and export the checkpoints that
 * training writes (pippin/checkpoint.h). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_util.h"
#include "commands.h"
#include "pippin/checkpoint.h"
#include "pippin/npy.h"
#include "pippin/safetensors.h"

#include "status_internal.h"

#define OPTIM_PREFIX "pippin.optim."

static void usage(FILE *f) {
    fprintf(f, "usage: pippin checkpoint list DIR\n"
               "       pippin checkpoint inspect DIR [--step N] | FILE.safetensors\n"
               "       pippin checkpoint export DIR [--step N] --output-dir OUT\n"
               "A checkpoint directory holds step_N/stage_K.safetensors for each step saved and\n"
               "step_N/manifest.json once every stage's file of that step was on disk (committed).\n"
               "list shows every step, committed or partial (a crash before the commit; resume\n"
               "ignores it). inspect shows a stage file's metadata and tensors, or every stage\n"
               "file of a step (default: the newest committed), and checks each file's hash.\n"
               "export writes a committed step's parameters as OUT/<name>.npy, as training's\n"
               "output_dir holds them (a tied parameter once; its copies must agree).\n");
}

static int list(const char *dir) {
    pp_checkpoint_step *v;
    int n;
    if (pp_checkpoint_list(dir, &v, &n) != PP_OK) return pp_cli_fail("checkpoint");
    int latest = n - 1;
    while (latest >= 0 && !v[latest].committed) latest--;
    printf("%-12s %-10s %7s %7s %14s\n", "step", "state", "stages", "files", "bytes");
    for (int i = 0; i < n; i++) {
        const char *state = !v[i].committed ? "partial" : v[i].n_files < v[i].n_stages ? "incomplete" : "committed";
        printf("%-12" PRId64 " %-10s %7d %7d %14" PRId64 "%s\n", v[i].step, state, v[i].n_stages, v[i].n_files,
               v[i].bytes, i == latest ? "  (newest committed: resume starts after it)" : "");
    }
    if (!n) printf("(no steps in %s)\n", dir);
    free(v);
    return 0;
}

static void describe_tensor(const char *name, const pp_tensor *t) {
    char shape[128] = "";
    size_t k = 0;
    for (int d = 0; d < t->ndim && k < sizeof shape - 24; d++)
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    printf("  %-40s %-8s [%s]\n", name, pp_dtype_name(t->dtype), shape);
}

static int inspect_file(const char *path) {
    pp_safetensors *f;
    if (pp_checkpoint_read_file(path, &f) != PP_OK) return pp_cli_fail("checkpoint");
    printf("%s: hash ok\n", path);
    for (int i = 0; i < f->n_meta; i++) printf("  %s = %s\n", f->meta_keys[i], f->meta_values[i]);
    for (int i = 0; i < f->n; i++) describe_tensor(f->names[i], f->tensors[i]);
    pp_safetensors_free(f);
    return 0;
}

/* step, or the newest committed one when step < 0; its stage count. */
static pp_status pick_step(const char *dir, int64_t *step, int *n_stages) {
    pp_checkpoint_step *v;
    int n;
    PP_TRY(pp_checkpoint_list(dir, &v, &n));
    int i = n - 1;
    if (*step >= 0) {
        while (i >= 0 && v[i].step != *step) i--;
    } else {
        while (i >= 0 && !v[i].committed) i--;
    }
    pp_status s = PP_OK;
    if (i < 0 && *step >= 0) s = pp_error(PP_ERR_NOT_FOUND, "%s: no step %" PRId64, dir, *step);
    else if (i < 0) s = pp_error(PP_ERR_NOT_FOUND, "%s: no committed step", dir);
    else if (!v[i].committed)
        s = pp_error(PP_ERR_INVALID, "%s: step %" PRId64 " is not committed (a crash before every stage's file was "
                     "written); `pippin checkpoint list` shows the committed ones", dir, v[i].step);
    else {
        *step = v[i].step;
        *n_stages = v[i].n_stages;
    }
    free(v);
    return s;
}

static int inspect_step(const char *dir, int64_t step) {
    int n_stages;
    if (pick_step(dir, &step, &n_stages) != PP_OK) return pp_cli_fail("checkpoint");
    printf("%s: step %" PRId64 ", %d stages (committed)\n", dir, step, n_stages);
    int rc = 0;
    for (int k = 0; k < n_stages; k++) {
        char path[4200];
        pp_checkpoint_stage_path(dir, step, k, path, sizeof path);
        if (inspect_file(path) != 0) rc = 1;
    }
    return rc;
}

/* Every stage's parameters of a committed step as OUT/<name>.npy. */
static pp_status export_step(const char *dir, int64_t step, const char *out, int *written) {
    int n_stages;
    PP_TRY(pick_step(dir, &step, &n_stages));
    PP_TRY(pp_mkdirs(out));
    pp_safetensors **files = calloc((size_t)n_stages, sizeof *files);
    if (!files) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status s = PP_OK;
    *written = 0;
    for (int k = 0; k < n_stages && s == PP_OK; k++) {
        char path[4200];
        pp_checkpoint_stage_path(dir, step, k, path, sizeof path);
        s = pp_checkpoint_read_file(path, &files[k]);
        for (int i = 0; s == PP_OK && i < files[k]->n; i++) {
            const char *name = files[k]->names[i];
            const pp_tensor *t = files[k]->tensors[i];
            if (strncmp(name, OPTIM_PREFIX, strlen(OPTIM_PREFIX)) == 0) continue;
            const pp_tensor *first = NULL; /* a tied parameter: its copy in an earlier stage */
            int at = 0;
            for (int j = 0; j < k && !first; j++)
                if ((first = pp_safetensors_find(files[j], name))) at = j;
            if (first && (first->nbytes != t->nbytes || memcmp(first->data, t->data, t->nbytes) != 0))
                s = pp_error(PP_ERR_INVALID, "%s: parameter '%s' differs from its copy in stage %d", path, name, at);
            for (int j = 0; j <= k && !first && s == PP_OK; j++) /* two names, one file name */
                for (int q = 0; q < (j < k ? files[j]->n : i) && s == PP_OK; q++) {
                    char a[512], b[512];
                    pp_file_safe_name(name, a, sizeof a);
                    pp_file_safe_name(files[j]->names[q], b, sizeof b);
                    if (strcmp(a, b) == 0 && strcmp(name, files[j]->names[q]) != 0)
                        s = pp_error(PP_ERR_UNSUPPORTED, "%s: parameters '%s' and '%s' would both be %s/%s.npy", path,
                                     files[j]->names[q], name, out, a);
                }
            if (!first && s == PP_OK) {
                s = pp_save_named_npy(out, "", name, t);
                if (s == PP_OK) ++*written;
            }
        }
    }
    for (int k = 0; k < n_stages; k++) pp_safetensors_free(files[k]);
    free(files);
    return s;
}

static int parse_step(const char *arg, int64_t *step) {
    char *end;
    errno = 0;
    long long v = strtoll(arg, &end, 10);
    if (errno || *end || end == arg || v < 0) {
        fprintf(stderr, "pippin checkpoint: --step '%s': need a step number\n", arg);
        return 0;
    }
    *step = v;
    return 1;
}

int cmd_checkpoint(int argc, char **argv) {
    static const struct option opts[] = {{"step", required_argument, NULL, 's'},
                                         {"output-dir", required_argument, NULL, 'o'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int64_t step = -1;
    const char *out = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 's') {
            if (!parse_step(optarg, &step)) return 2;
        } else if (c == 'o') {
            out = optarg;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 2) {
        usage(stderr);
        return 2;
    }
    const char *verb = argv[optind], *path = argv[optind + 1];
    if (strcmp(verb, "list") == 0 && step < 0 && !out) return list(path);
    if (strcmp(verb, "inspect") == 0 && !out) {
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) return step < 0 ? inspect_file(path) : (usage(stderr), 2);
        return inspect_step(path, step);
    }
    if (strcmp(verb, "export") == 0 && out) {
        int n;
        if (export_step(path, step, out, &n) != PP_OK) return pp_cli_fail("checkpoint");
        printf("wrote %d parameters to %s\n", n, out);
        return 0;
    }
    usage(stderr);
    return 2;
}

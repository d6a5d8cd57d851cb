/* Runs ONNX's own node conformance cases (Debian libonnx-testdata) whose ops
 * pippin supports and compares every output. Prints TAP: one line per case,
 * skipped cases marked "# SKIP" with the reason.
 *
 * A case is skipped as unsupported when its model does not load with
 * PP_ERR_UNSUPPORTED (unknown op, opset outside 7-21, unsupported dtype or
 * attribute). A supported case may only be skipped when it is listed, with
 * its reason, in test/conformance-skips.txt. Each case runs as loaded, then
 * again after the inference optimizer's passes (pp_graph_optimize). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pippin/pippin.h"

#define DEFAULT_DIR "/usr/share/libonnx-testdata/data/node"

typedef struct {
    char **names;
    char **reasons;
    int n;
} skip_list;

static void load_skips(const char *path, skip_list *sl) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!line[0] || line[0] == '#') continue;
        char *sp = strpbrk(line, " \t");
        const char *reason = "listed";
        if (sp) {
            *sp = '\0';
            reason = sp + 1 + strspn(sp + 1, " \t");
        }
        sl->names = realloc(sl->names, sizeof(char *) * (size_t)(sl->n + 1));
        sl->reasons = realloc(sl->reasons, sizeof(char *) * (size_t)(sl->n + 1));
        sl->names[sl->n] = strdup(line);
        sl->reasons[sl->n] = strdup(reason);
        sl->n++;
    }
    fclose(f);
}

static const char *skip_reason(const skip_list *sl, const char *name) {
    for (int i = 0; i < sl->n; i++)
        if (strcmp(sl->names[i], name) == 0) return sl->reasons[i];
    return NULL;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Runs one data set; returns 0 on success, else fills why. */
static int run_dataset(pp_graph *g, const char *dir, char *why, size_t cap) {
    pp_tensor *inputs[64] = {0}, *outputs[64] = {0}, *expected[64] = {0};
    char path[8192];
    int n_in = 0, n_exp = 0, rc = 1;
    if (g->n_inputs > 64 || g->n_outputs > 64) {
        snprintf(why, cap, "too many inputs or outputs");
        return 1;
    }
    for (;; n_in++) {
        snprintf(path, sizeof path, "%s/input_%d.pb", dir, n_in);
        if (!file_exists(path) || n_in >= 64) break;
        if (pp_onnx_tensor_load(path, &inputs[n_in], NULL) != PP_OK) {
            snprintf(why, cap, "%s", pp_last_error());
            goto done;
        }
    }
    for (;; n_exp++) {
        snprintf(path, sizeof path, "%s/output_%d.pb", dir, n_exp);
        if (!file_exists(path) || n_exp >= 64) break;
        if (pp_onnx_tensor_load(path, &expected[n_exp], NULL) != PP_OK) {
            snprintf(why, cap, "%s", pp_last_error());
            goto done;
        }
    }
    if (n_in != g->n_inputs) {
        snprintf(why, cap, "%d input files for %d graph inputs", n_in, g->n_inputs);
        goto done;
    }
    if (pp_graph_run(g, inputs, outputs) != PP_OK) {
        snprintf(why, cap, "run failed: %s", pp_last_error());
        goto done;
    }
    for (int i = 0; i < n_exp && i < g->n_outputs; i++) {
        char diff[512];
        double rtol = pp_dtype_is_float(expected[i]->dtype) ? 1e-3 : 0;
        double atol = pp_dtype_is_float(expected[i]->dtype) ? 1e-5 : 0;
        if (expected[i]->dtype == PP_F16 || expected[i]->dtype == PP_BF16) rtol = 1e-2, atol = 1e-3;
        if (!pp_tensor_allclose(outputs[i], expected[i], rtol, atol, diff, sizeof diff)) {
            snprintf(why, cap, "output %d ('%s'): %s", i, g->values[g->outputs[i]].name, diff);
            goto done;
        }
    }
    rc = 0;
done:
    for (int i = 0; i < 64; i++) {
        pp_tensor_free(inputs[i]);
        pp_tensor_free(outputs[i]);
        pp_tensor_free(expected[i]);
    }
    return rc;
}

int main(int argc, char **argv) {
    const char *root = DEFAULT_DIR, *filter = NULL, *skips_path = NULL;
    int verbose = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) root = argv[++i];
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) filter = argv[++i];
        else if (strcmp(argv[i], "--skips") == 0 && i + 1 < argc) skips_path = argv[++i];
        else if (strcmp(argv[i], "--verbose") == 0) verbose = 1;
        else {
            printf("usage: %s [--dir DIR] [--filter SUBSTRING] [--skips FILE] [--verbose]\n"
                   "Runs ONNX node conformance cases; TAP output. --verbose also prints why\n"
                   "each unsupported case was skipped.\n", argv[0]);
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    char skips_buf[4096];
    if (!skips_path) {
        const char *src = getenv("PIPPIN_SOURCE_ROOT");
        snprintf(skips_buf, sizeof skips_buf, "%s/test/conformance-skips.txt", src ? src : ".");
        skips_path = skips_buf;
    }
    skip_list sl = {0};
    load_skips(skips_path, &sl);
    pp_log_set_level(PP_LOG_OFF);

    DIR *d = opendir(root);
    if (!d) {
        printf("1..0 # SKIP %s not found (install libonnx-testdata)\n", root);
        return 0;
    }
    char **cases = NULL;
    int n_cases = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (filter && !strstr(e->d_name, filter)) continue;
        cases = realloc(cases, sizeof(char *) * (size_t)(n_cases + 1));
        cases[n_cases++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(cases, (size_t)n_cases, sizeof(char *), cmp_str);

    int passed = 0, failed = 0, unsupported = 0, listed = 0;
    for (int c = 0; c < n_cases; c++) {
        char path[4096], why[2048] = "";
        snprintf(path, sizeof path, "%s/%s/model.onnx", root, cases[c]);
        pp_graph *g = NULL;
        pp_status s = pp_onnx_load(path, &g);
        const char *listed_reason = skip_reason(&sl, cases[c]);
        if (s == PP_ERR_UNSUPPORTED) {
            unsupported++;
            if (verbose) printf("ok %d - %s # SKIP unsupported: %s\n", c + 1, cases[c], pp_last_error());
            else printf("ok %d - %s # SKIP unsupported\n", c + 1, cases[c]);
            continue;
        }
        int bad = 0;
        if (s != PP_OK) {
            snprintf(why, sizeof why, "load failed: %s", pp_last_error());
            bad = 1;
        }
        for (int k = 0; !bad; k++) {
            snprintf(path, sizeof path, "%s/%s/test_data_set_%d", root, cases[c], k);
            if (!file_exists(path)) break;
            bad = run_dataset(g, path, why, sizeof why);
        }
        /* and again with the inference optimizer's passes (pippin/optimize.h) */
        if (!bad && pp_graph_optimize(g, PP_OPT_ALL, NULL) != PP_OK) {
            snprintf(why, sizeof why, "optimize failed: %s", pp_last_error());
            bad = 1;
        }
        for (int k = 0; !bad; k++) {
            snprintf(path, sizeof path, "%s/%s/test_data_set_%d", root, cases[c], k);
            if (!file_exists(path)) break;
            char inner[2048] = "";
            if ((bad = run_dataset(g, path, inner, sizeof inner))) snprintf(why, sizeof why, "optimized: %s", inner);
        }
        pp_graph_free(g);
        if (bad && listed_reason) {
            listed++;
            printf("ok %d - %s # SKIP listed: %s\n", c + 1, cases[c], listed_reason);
        } else if (bad) {
            failed++;
            printf("not ok %d - %s: %s\n", c + 1, cases[c], why);
        } else {
            passed++;
            printf("ok %d - %s\n", c + 1, cases[c]);
        }
    }
    printf("1..%d\n", n_cases);
    printf("# conformance: %d passed, %d failed, %d skipped as unsupported, %d skipped as listed\n",
           passed, failed, unsupported, listed);
    for (int c = 0; c < n_cases; c++) free(cases[c]);
    free(cases);
    for (int i = 0; i < sl.n; i++) {
        free(sl.names[i]);
        free(sl.reasons[i]);
    }
    free(sl.names);
    free(sl.reasons);
    return failed ? 1 : 0;
}

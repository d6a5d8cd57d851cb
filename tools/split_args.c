/* Parsing of the split-spec flags shared by several subcommands. */
#include "split_args.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/onnx.h"

#include "status_internal.h"
static int push(const char **arr, int *n, int cap, const char *v, const char *cmd, const char *flag) {
    if (*n >= cap) {
        fprintf(stderr, "pippin %s: too many %s flags (at most %d)\n", cmd, flag, cap);
        return -1;
    }
    arr[(*n)++] = v;
    return 1;
}

int pp_split_args_handle(pp_split_args *a, int code, const char *arg, const char *cmd) {
    switch (code) {
    case PP_OPT_SPLIT_BEFORE: return push(a->before, &a->n_before, 64, arg, cmd, "--split-before");
    case PP_OPT_SPLIT_AFTER: return push(a->after, &a->n_after, 64, arg, cmd, "--split-after");
    case PP_OPT_TRANSMIT: a->transmit_shared = 1; return 1;
    case PP_OPT_DIM:
        if (!strchr(arg, '=')) {
            fprintf(stderr, "pippin %s: --dim '%s': expected NAME=N\n", cmd, arg);
            return -1;
        }
        return push(a->dims, &a->n_dims, 16, arg, cmd, "--dim");
    case PP_OPT_FREEZE: return push(a->freeze, &a->n_freeze, 64, arg, cmd, "--freeze");
    case PP_OPT_MARKER_IDENTITY: a->marker_identity = arg; return 1;
    case PP_OPT_AUTO:
    case PP_OPT_EVEN:
    case PP_OPT_AUTO_BATCH: {
        const char *flag = code == PP_OPT_AUTO ? "--auto" : code == PP_OPT_EVEN ? "--split-even" : "--auto-batch";
        char *end;
        long v = strtol(arg, &end, 10);
        if (*arg == 0 || *end || v < 1 || v > 1024) {
            fprintf(stderr, "pippin %s: %s '%s': need a count from 1 to 1024\n", cmd, flag, arg);
            return -1;
        }
        if (code == PP_OPT_AUTO) a->auto_stages = (int)v;
        else if (code == PP_OPT_EVEN) a->even_stages = (int)v;
        else a->auto_batch = (int)v;
        return 1;
    }
    case PP_OPT_AUTO_MEM:
    case PP_OPT_AUTO_BW: {
        char *end;
        double v = strtod(arg, &end), mult = 1;
        if (code == PP_OPT_AUTO_MEM && *end && !end[1]) {
            const char *units = "KMGT";
            const char *u = strchr(units, *end);
            for (const char *q = units; u && q <= u; q++) mult *= 1024;
            if (u) end++;
        }
        if (end == arg || *end || !(v > 0) || isinf(v)) {
            fprintf(stderr, "pippin %s: %s '%s': need a positive number%s\n", cmd,
                    code == PP_OPT_AUTO_MEM ? "--auto-memory-cap" : "--auto-bandwidth", arg,
                    code == PP_OPT_AUTO_MEM ? " of bytes (suffix K, M, G or T: powers of 1024)" : " (GB/s)");
            return -1;
        }
        if (code == PP_OPT_AUTO_MEM) a->auto_memory_cap = v * mult;
        else a->auto_gbps = v;
        return 1;
    }
    case PP_OPT_AUTO_COST:
        if (strcmp(arg, "time") != 0 && strcmp(arg, "flops") != 0) {
            fprintf(stderr, "pippin %s: --auto-cost '%s': time or flops\n", cmd, arg);
            return -1;
        }
        a->auto_flops = strcmp(arg, "flops") == 0;
        return 1;
    default: return 0;
    }
}

pp_split_spec pp_split_args_spec(const pp_split_args *a) {
    pp_split_spec s = {a->n_before, a->before, a->n_after, a->after, a->transmit_shared, 0, a->loss};
    if (a->auto_stages || a->even_stages) { /* the chosen cuts replace the markers */
        s.ignore_markers = 1;
        s.n_cut_at = a->n_cut_at;
        s.cut_at = a->cut_at;
    }
    return s;
}

int pp_split_args_any(const pp_split_args *a) {
    return a->n_before + a->n_after > 0 || a->auto_stages > 0 || a->even_stages > 0;
}

void pp_split_args_free(pp_split_args *a) {
    free(a->cut_at);
    a->cut_at = NULL;
    a->n_cut_at = 0;
}

static pp_status load(pp_split_args *a, const char *path, pp_graph **out, pp_onnx_deferred **deferred) {
    if (a->auto_stages && a->even_stages)
        return pp_error(PP_ERR_INVALID, "--auto and --split-even each choose the cuts: give one");
    if ((a->auto_stages || a->even_stages) && a->n_before + a->n_after > 0)
        return pp_error(PP_ERR_INVALID, "--%s chooses every cut: no --split-before or --split-after with it",
                        a->auto_stages ? "auto" : "split-even");
    /* --auto times the nodes (on zero pages it would time the wrong thing);
     * --freeze makes parameters constants, whose values the optimizer reads */
    if (deferred && !a->auto_stages && !a->n_freeze) PP_TRY(pp_onnx_load_deferred(path, out, deferred));
    else PP_TRY(pp_onnx_load(path, out));
    if (a->marker_identity && pp_graph_identity_markers(*out, a->marker_identity) == 0) {
        pp_graph_free(*out);
        *out = NULL;
        return pp_error(PP_ERR_NOT_FOUND, "%s: --marker-identity '%s' matches no Identity node", path,
                        a->marker_identity);
    }
    for (int i = 0; i < a->n_freeze; i++)
        if (pp_graph_freeze(*out, a->freeze[i]) == 0) {
            pp_graph_free(*out);
            *out = NULL;
            return pp_error(PP_ERR_NOT_FOUND, "%s: freeze pattern '%s' matches no trainable initializer", path,
                            a->freeze[i]);
        }
    if (a->auto_stages || a->even_stages) {
        pp_status s = pp_split_args_balance(a, *out);
        if (s != PP_OK) {
            pp_graph_free(*out);
            *out = NULL;
            return pp_error_context(s, "%s", path);
        }
    }
    return PP_OK;
}

pp_status pp_split_args_load(pp_split_args *a, const char *path, pp_graph **out) { return load(a, path, out, NULL); }

pp_status pp_split_args_load_deferred(pp_split_args *a, const char *path, pp_graph **out,
                                      pp_onnx_deferred **deferred) {
    *deferred = NULL;
    pp_status s = load(a, path, out, deferred);
    if (s != PP_OK) {
        pp_onnx_deferred_free(*deferred);
        *deferred = NULL;
    }
    return s;
}

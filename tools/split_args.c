/* Parsing of the split-spec flags shared by several subcommands. */
#include "split_args.h"

#include <stdio.h>
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
    default: return 0;
    }
}

pp_split_spec pp_split_args_spec(const pp_split_args *a) {
    pp_split_spec s = {a->n_before, a->before, a->n_after, a->after, a->transmit_shared, 0, a->loss};
    return s;
}

int pp_split_args_any(const pp_split_args *a) { return a->n_before + a->n_after > 0; }

pp_status pp_split_args_load(const pp_split_args *a, const char *path, pp_graph **out) {
    PP_TRY(pp_onnx_load(path, out));
    for (int i = 0; i < a->n_freeze; i++)
        if (pp_graph_freeze(*out, a->freeze[i]) == 0) {
            pp_graph_free(*out);
            *out = NULL;
            return pp_error(PP_ERR_NOT_FOUND, "%s: freeze pattern '%s' matches no trainable initializer", path,
                            a->freeze[i]);
        }
    return PP_OK;
}

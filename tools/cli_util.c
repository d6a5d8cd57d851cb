/* Argument and file helpers shared by the subcommands. */
#include "cli_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pippin/npy.h"

#include "grow.h"
#include "status_internal.h"
#include "param_files.h"
pp_status pp_cli_add_named_npy(pp_named_tensors *nt, const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return pp_error(PP_ERR_INVALID, "'%s': expected NAME=FILE.npy", arg);
    pp_tensor *t;
    PP_TRY(pp_npy_load(eq + 1, &t));
    /* Both arrays grow to exactly nt->n + 1; on a failure nothing is added
     * (a slot already grown is reused by the next call). */
    pp_status s = PP_GROW_EXACT(nt->names, nt->n);
    if (s == PP_OK) s = PP_GROW_EXACT(nt->tensors, nt->n);
    char *name = s == PP_OK ? strndup(arg, (size_t)(eq - arg)) : NULL;
    if (s == PP_OK && !name) s = pp_error(PP_ERR_NOMEM, "out of memory");
    if (s != PP_OK) {
        free(name);
        pp_tensor_free(t);
        return s;
    }
    nt->names[nt->n] = name;
    nt->tensors[nt->n] = t;
    nt->n++;
    return PP_OK;
}

void pp_cli_named_free(pp_named_tensors *nt) {
    for (int i = 0; i < nt->n; i++) {
        free(nt->names[i]);
        pp_tensor_free(nt->tensors[i]);
    }
    free(nt->names);
    free(nt->tensors);
    memset(nt, 0, sizeof *nt);
}

static void list_inputs(const pp_graph *g, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < g->n_inputs && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", g->values[g->inputs[i]].name);
}

pp_status pp_cli_match_inputs(const pp_graph *g, const pp_named_tensors *nt, pp_tensor **out) {
    char expected[1024];
    list_inputs(g, expected, sizeof expected);
    for (int k = 0; k < nt->n; k++) {
        int found = 0;
        for (int i = 0; i < g->n_inputs; i++)
            if (strcmp(g->values[g->inputs[i]].name, nt->names[k]) == 0) found = 1;
        if (!found)
            return pp_error(PP_ERR_NOT_FOUND, "the model has no input '%s' (inputs: %s)",
                            nt->names[k], expected);
    }
    for (int i = 0; i < g->n_inputs; i++) {
        out[i] = NULL;
        for (int k = 0; k < nt->n; k++)
            if (strcmp(g->values[g->inputs[i]].name, nt->names[k]) == 0) out[i] = nt->tensors[k];
        if (!out[i])
            return pp_error(PP_ERR_INVALID, "input '%s' not given (inputs: %s)",
                            g->values[g->inputs[i]].name, expected);
    }
    return PP_OK;
}

const char *pp_cli_value_type(const pp_value *v, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "%s", pp_dtype_name(v->dtype));
    if (v->ndim < 0 || n >= cap) return buf;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int d = 0; d < v->ndim && n < cap; d++) {
        const char *sep = d ? "," : "";
        if (v->dim_names[d]) n += (size_t)snprintf(buf + n, cap - n, "%s%s", sep, v->dim_names[d]);
        else if (v->shape[d] < 0) n += (size_t)snprintf(buf + n, cap - n, "%s?", sep);
        else n += (size_t)snprintf(buf + n, cap - n, "%s%lld", sep, (long long)v->shape[d]);
    }
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

/* Tensors and stage parameters as .npy files (param_files.h). */
#include "param_files.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pippin/npy.h"
#include "status_internal.h"

pp_status pp_mkdirs(const char *path) {
    char buf[4096];
    if (strlen(path) >= sizeof buf) return pp_error(PP_ERR_INVALID, "path too long: %s", path);
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return pp_error(PP_ERR_IO, "%s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return pp_error(PP_ERR_IO, "%s: %s", buf, strerror(errno));
    return PP_OK;
}

void pp_file_safe_name(const char *name, char *buf, size_t cap) {
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++) buf[i] = (name[i] == '/' || name[i] == ':') ? '_' : name[i];
    buf[i] = '\0';
}

pp_status pp_save_named_npy(const char *dir, const char *prefix, const char *name, const pp_tensor *t) {
    char safe[512], path[4096];
    pp_file_safe_name(name, safe, sizeof safe);
    snprintf(path, sizeof path, "%s/%s%s.npy", dir, prefix, safe);
    return pp_npy_save(path, t);
}

/* A replicated parameter is written once, from the first stage listed for
 * it in the pipe (every copy is equal). */
static int writes_param(const pp_pipe *p, int stage, const char *name) {
    for (int i = 0; i < p->n_shared; i++)
        if (strcmp(p->shared[i].name, name) == 0) return p->shared[i].stages[0] == stage;
    return 1;
}

pp_status pp_save_stage_params(const pp_pipe *p, int n, pp_stage *const *stages, const char *dir,
                               const char *prefix, int grads, int *count) {
    PP_TRY(pp_mkdirs(dir));
    int saved = 0;
    for (int s = 0; s < n; s++) {
        pp_flat_params *fp;
        PP_TRY(pp_stage_params_sync(stages[s], &fp));
        for (int i = 0; fp && i < fp->n; i++) {
            if (!writes_param(p, pp_stage_index(stages[s]), fp->names[i])) continue;
            pp_tensor *t;
            PP_TRY(grads ? pp_flat_params_grad_view(fp, i, &t) : pp_flat_params_data_view(fp, i, &t));
            pp_status st = pp_save_named_npy(dir, prefix, fp->names[i], t);
            pp_tensor_free(t);
            PP_TRY(st);
            saved++;
        }
        /* state the training updated (BatchNorm's running statistics): the
         * trained model needs it (a serving `params:` directory loads it) */
        for (int i = 0; !grads && i < pp_stage_n_state(stages[s]); i++) {
            PP_TRY(pp_save_named_npy(dir, prefix, pp_stage_state_name(stages[s], i),
                                     pp_stage_state_tensor(stages[s], i)));
            saved++;
        }
    }
    if (count) *count = saved;
    return PP_OK;
}

pp_status pp_load_params_dir(pp_graph *g, const char *dir, int *loaded) {
    *loaded = 0;
    for (int v = 0; v < g->n_values; v++) {
        pp_value *val = &g->values[v];
        if ((val->kind != PP_VALUE_PARAM && val->kind != PP_VALUE_CONST) || !val->data || !val->name) continue;
        char safe[512], path[4096];
        pp_file_safe_name(val->name, safe, sizeof safe);
        if ((size_t)snprintf(path, sizeof path, "%s/%s.npy", dir, safe) >= sizeof path)
            return pp_error(PP_ERR_INVALID, "params: path too long for '%s'", val->name);
        if (access(path, F_OK) != 0) {
            if (val->kind == PP_VALUE_PARAM) /* a half-trained model must not be served silently */
                return pp_error(PP_ERR_NOT_FOUND, "params: %s has no file for parameter '%s' (%s)", dir, val->name, path);
            continue; /* buffers (masks) keep the model's values */
        }
        pp_tensor *t = NULL;
        PP_TRY(pp_npy_load(path, &t));
        const pp_tensor *old = val->data;
        int same = t->dtype == old->dtype && t->ndim == old->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == old->shape[d];
        if (!same) {
            char a[128], b[128];
            pp_status s = pp_error(PP_ERR_INVALID, "params: %s is %s%s, parameter '%s' of the model is %s%s", path,
                                   pp_dtype_name(t->dtype), pp_shape_str(t->ndim, t->shape, a, sizeof a), val->name,
                                   pp_dtype_name(old->dtype), pp_shape_str(old->ndim, old->shape, b, sizeof b));
            pp_tensor_free(t);
            return s;
        }
        pp_tensor_free(val->data);
        val->data = t;
        (*loaded)++;
    }
    if (!*loaded) return pp_error(PP_ERR_NOT_FOUND, "params: no file in %s matches a parameter of the model", dir);
    return PP_OK;
}

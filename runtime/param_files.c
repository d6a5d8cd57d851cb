/* Tensors and stage parameters as .npy files (param_files.h). */
#include "param_files.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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
        pp_flat_params *fp = pp_stage_params(stages[s]);
        for (int i = 0; fp && i < fp->n; i++) {
            if (!writes_param(p, pp_stage_index(stages[s]), fp->names[i])) continue;
            pp_tensor *t;
            PP_TRY(grads ? pp_flat_params_grad_view(fp, i, &t) : pp_flat_params_data_view(fp, i, &t));
            pp_status st = pp_save_named_npy(dir, prefix, fp->names[i], t);
            pp_tensor_free(t);
            PP_TRY(st);
            saved++;
        }
    }
    if (count) *count = saved;
    return PP_OK;
}

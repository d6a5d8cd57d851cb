/* Stage checkpoints: parameters and optimizer state as .npy files. */
#include "pippin/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <json-c/json.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pippin/npy.h"
#include "pippin/params.h"

#include "status_internal.h"
static void file_safe(const char *name, char *buf, size_t cap) {
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++) buf[i] = (name[i] == '/' || name[i] == ':') ? '_' : name[i];
    buf[i] = '\0';
}

static pp_status make_dirs(const char *path) {
    char buf[4096];
    if (strlen(path) >= sizeof buf) return pp_error(PP_ERR_INVALID, "path too long: %s", path);
    strcpy(buf, path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return pp_error(PP_ERR_IO, "%s: %s", buf, strerror(errno));
        if (!c) break;
        *p = c;
    }
    return PP_OK;
}

/* Removes a directory of plain files (a stage checkpoint). */
static void remove_flat_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char file[8192];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(file, sizeof file, "%s/%s", path, e->d_name);
            unlink(file);
        }
    closedir(d);
    rmdir(path);
}

static pp_status save_floats(const char *dir, const char *name, float *data, int64_t n) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    pp_tensor *t;
    PP_TRY(pp_tensor_wrap(PP_F32, 1, &n, data, NULL, NULL, &t));
    pp_status s = pp_npy_save(path, t);
    pp_tensor_free(t);
    return s;
}

pp_status pp_checkpoint_save(const char *dir, pp_stage *st, pp_optim *opt, int64_t step) {
    pp_flat_params *fp = pp_stage_params(st);
    if (!fp) return pp_error(PP_ERR_STATE, "stage %d has no trainable parameters to save", pp_stage_index(st));
    char final[4096], tmp[4200], old[4200];
    snprintf(final, sizeof final, "%s/stage_%d", dir, pp_stage_index(st));
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    snprintf(old, sizeof old, "%s.old", final);
    remove_flat_dir(tmp);
    PP_TRY(make_dirs(tmp));
    pp_status s = PP_OK;
    for (int i = 0; i < fp->n && s == PP_OK; i++) /* file names must not collide */
        for (int k = 0; k < i && s == PP_OK; k++) {
            char a[512], b[512];
            file_safe(fp->names[i], a, sizeof a);
            file_safe(fp->names[k], b, sizeof b);
            if (strcmp(a, b) == 0)
                s = pp_error(PP_ERR_UNSUPPORTED, "stage %d: parameters '%s' and '%s' would share the file %s.npy",
                             pp_stage_index(st), fp->names[k], fp->names[i], a);
        }
    if (s != PP_OK) {
        remove_flat_dir(tmp);
        return s;
    }
    json_object *names = json_object_new_array();
    for (int i = 0; i < fp->n && s == PP_OK; i++) {
        char safe[512], path[8192];
        file_safe(fp->names[i], safe, sizeof safe);
        snprintf(path, sizeof path, "%s/%s.npy", tmp, safe);
        pp_tensor *view;
        s = pp_flat_params_data_view(fp, i, &view);
        if (s == PP_OK) s = pp_npy_save(path, view);
        pp_tensor_free(view);
        json_object_array_add(names, json_object_new_string(fp->names[i]));
    }
    for (int i = 0; opt && s == PP_OK && i < pp_optim_state(opt, -1, NULL, NULL); i++) {
        const char *bname;
        float *buf;
        pp_optim_state(opt, i, &bname, &buf);
        char fname[128];
        snprintf(fname, sizeof fname, "optim_%s", bname);
        s = save_floats(tmp, fname, buf, fp->total);
    }
    json_object *state = json_object_new_object();
    json_object_object_add(state, "step", json_object_new_int64(step));
    json_object_object_add(state, "stage", json_object_new_int(pp_stage_index(st)));
    if (opt) {
        json_object_object_add(state, "optimizer", json_object_new_string(pp_optim_kind_name(pp_optim_get_config(opt)->kind)));
        json_object_object_add(state, "optimizer_steps", json_object_new_int64(pp_optim_steps(opt)));
    }
    json_object_object_add(state, "parameters", names);
    char path[8192];
    snprintf(path, sizeof path, "%s/state.json", tmp);
    if (s == PP_OK && json_object_to_file_ext(path, state, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE) != 0)
        s = pp_error(PP_ERR_IO, "%s: write failed", path);
    json_object_put(state);
    if (s != PP_OK) {
        remove_flat_dir(tmp);
        return s;
    }
    /* Swap in the new directory; the old one goes only once the new is in place. */
    remove_flat_dir(old);
    int had_old = rename(final, old) == 0;
    if (!had_old && errno != ENOENT) s = pp_error(PP_ERR_IO, "%s: %s", final, strerror(errno));
    if (s == PP_OK && rename(tmp, final) != 0) {
        s = pp_error(PP_ERR_IO, "%s: %s", final, strerror(errno));
        if (had_old) rename(old, final); /* keep the previous checkpoint */
        remove_flat_dir(tmp);
        return s;
    }
    if (s == PP_OK) remove_flat_dir(old);
    return s;
}

static pp_status load_into(const char *path, float *dst, int64_t n) {
    pp_tensor *t;
    PP_TRY(pp_npy_load(path, &t));
    pp_status s = PP_OK;
    if (t->dtype != PP_F32 || pp_tensor_numel(t) != n)
        s = pp_error(PP_ERR_SHAPE, "%s: holds %lld %s values, the stage needs %lld float32", path,
                     (long long)pp_tensor_numel(t), pp_dtype_name(t->dtype), (long long)n);
    else if (n)
        memcpy(dst, t->data, (size_t)n * sizeof(float));
    pp_tensor_free(t);
    return s;
}

pp_status pp_checkpoint_load(const char *dir, pp_stage *st, pp_optim *opt, int64_t *step) {
    pp_flat_params *fp = pp_stage_params(st);
    if (!fp) return pp_error(PP_ERR_STATE, "stage %d has no trainable parameters to load", pp_stage_index(st));
    char sdir[4096], path[8192];
    snprintf(sdir, sizeof sdir, "%s/stage_%d", dir, pp_stage_index(st));
    snprintf(path, sizeof path, "%s/state.json", sdir);
    json_object *state = json_object_from_file(path), *v;
    if (!state) return pp_error(PP_ERR_IO, "%s: no checkpoint here (%s)", path, json_util_get_last_err());
    pp_status s = PP_OK;
    int64_t saved_step = 0, opt_steps = 0;
    if (!json_object_object_get_ex(state, "step", &v) || !json_object_is_type(v, json_type_int))
        s = pp_error(PP_ERR_PARSE, "%s: 'step' missing or not an integer", path);
    else if ((saved_step = json_object_get_int64(v)) < 0)
        s = pp_error(PP_ERR_PARSE, "%s: 'step' is negative (%" PRId64 ")", path, saved_step);
    if (s == PP_OK && opt) {
        const char *kind = pp_optim_kind_name(pp_optim_get_config(opt)->kind);
        if (!json_object_object_get_ex(state, "optimizer", &v) || strcmp(json_object_get_string(v), kind) != 0)
            s = pp_error(PP_ERR_INVALID, "%s: saved with another optimizer than %s", path, kind);
        else if (!json_object_object_get_ex(state, "optimizer_steps", &v) || !json_object_is_type(v, json_type_int))
            s = pp_error(PP_ERR_PARSE, "%s: 'optimizer_steps' missing", path);
        else if ((opt_steps = json_object_get_int64(v)) < 0) /* AdamW's bias correction would divide by 0 */
            s = pp_error(PP_ERR_PARSE, "%s: 'optimizer_steps' is negative (%" PRId64 ")", path, opt_steps);
    }
    json_object_put(state);
    for (int i = 0; i < fp->n && s == PP_OK; i++) {
        char safe[512];
        file_safe(fp->names[i], safe, sizeof safe);
        snprintf(path, sizeof path, "%s/%s.npy", sdir, safe);
        s = load_into(path, fp->data + fp->offset[i], fp->numel[i]);
    }
    for (int i = 0; opt && s == PP_OK && i < pp_optim_state(opt, -1, NULL, NULL); i++) {
        const char *bname;
        float *buf;
        pp_optim_state(opt, i, &bname, &buf);
        snprintf(path, sizeof path, "%s/optim_%s.npy", sdir, bname);
        s = load_into(path, buf, fp->total);
    }
    if (s != PP_OK) return s;
    if (opt) pp_optim_set_steps(opt, opt_steps);
    if (step) *step = saved_step;
    return PP_OK;
}

/* Stage checkpoints as safetensors files in committed step directories
 * (pippin/checkpoint.h). */
#include "pippin/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_io.h"
#include "hash.h"
#include "param_files.h"
#include "pippin/params.h"
#include "pippin/safetensors.h"
#include "safetensors_index.h"
#include "status_internal.h"

#define OPTIM_PREFIX "pippin.optim."
#define MANIFEST "manifest.json"

static void step_dir(const char *dir, int64_t step, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/step_%" PRId64, dir, step);
}

void pp_checkpoint_stage_path(const char *dir, int64_t step, int stage, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/step_%" PRId64 "/stage_%d.safetensors", dir, step, stage);
}

static int by_key(const void *a, const void *b) {
    return strcmp(**(const char *const *const *)a, **(const char *const *const *)b);
}

/* The hash recorded in a stage file: its tensors' names and bytes in file
 * order, then its metadata (but the hash itself) in key order, so a changed
 * step count shows as much as a changed weight. Built a tensor at a time,
 * so a load can hash each as it reads it into place. */
static uint64_t hash_tensor(uint64_t h, const char *name, const void *data, size_t nbytes) {
    h = pp_hash64(h, name, strlen(name) + 1);
    return pp_hash64(h, data, nbytes);
}

static uint64_t hash_meta(uint64_t h, int n_meta, const char *const *keys, const char *const *vals) {
    const char *const *order[64][2];
    int m = 0;
    for (int i = 0; i < n_meta && m < 64; i++)
        if (strcmp(keys[i], "pippin.hash") != 0) order[m][0] = &keys[i], order[m++][1] = &vals[i];
    qsort(order, (size_t)m, sizeof order[0], by_key);
    for (int i = 0; i < m; i++) {
        h = pp_hash64(h, *order[i][0], strlen(*order[i][0]) + 1);
        h = pp_hash64(h, *order[i][1], strlen(*order[i][1]) + 1);
    }
    return h;
}

static uint64_t file_hash(int n, const char *const *names, pp_tensor *const *t, int n_meta, const char *const *keys,
                          const char *const *vals) {
    uint64_t h = PP_HASH64_SEED;
    for (int i = 0; i < n; i++) h = hash_tensor(h, names[i], t[i]->data, t[i]->nbytes);
    return hash_meta(h, n_meta, keys, vals);
}

/* ---- writing ---- */

pp_status pp_checkpoint_save_stage(const char *dir, int64_t step, pp_stage *st, pp_optim *opt) {
    pp_flat_params none = {0}, *fp;
    PP_TRY(pp_stage_params_sync(st, &fp)); /* never the host's stale copy of a device's values */
    int k = pp_stage_index(st);
    if (!fp) { /* a stage without parameters still has its file: every stage of a step is there */
        fp = &none;
        opt = NULL;
    }
    if (step < 0) return pp_error(PP_ERR_INVALID, "stage %d: checkpoint of step %" PRId64, k, step);
    char sdir[4096], path[4200];
    step_dir(dir, step, sdir, sizeof sdir);
    PP_TRY(pp_mkdirs(sdir));
    PP_TRY(pp_fsync_parent(sdir)); /* the step directory's entry in dir */
    PP_TRY(pp_fsync_parent(dir));  /* and dir's own, when it is new */
    int n_opt = opt ? pp_optim_state(opt, -1, NULL, NULL) : 0, n_state = pp_stage_n_state(st);
    int n = fp->n + n_opt + n_state;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    char **owned = calloc((size_t)n_opt + 1, sizeof *owned);
    pp_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    pp_status s = names && owned && ts ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < fp->n && s == PP_OK; i++) {
        names[i] = fp->names[i];
        if (strncmp(names[i], OPTIM_PREFIX, strlen(OPTIM_PREFIX)) == 0)
            s = pp_error(PP_ERR_UNSUPPORTED, "stage %d: parameter '%s' has the name prefix checkpoints reserve for the optimizer",
                         k, names[i]);
        if (s == PP_OK) s = pp_flat_params_data_view(fp, i, &ts[i]);
    }
    for (int i = 0; i < n_opt && s == PP_OK; i++) {
        const char *bname;
        float *buf;
        pp_optim_state(opt, i, &bname, &buf);
        size_t len = strlen(OPTIM_PREFIX) + strlen(bname) + 1;
        if (!(owned[i] = malloc(len))) s = pp_error(PP_ERR_NOMEM, "out of memory");
        else snprintf(owned[i], len, OPTIM_PREFIX "%s", bname);
        names[fp->n + i] = owned[i];
        int64_t total = fp->total;
        if (s == PP_OK) s = pp_tensor_wrap(PP_F32, 1, &total, buf, NULL, NULL, &ts[fp->n + i]);
    }
    for (int i = 0; i < n_state && s == PP_OK; i++) { /* BatchNorm's running statistics, under their names */
        names[fp->n + n_opt + i] = pp_stage_state_name(st, i);
        if (strncmp(names[fp->n + n_opt + i], OPTIM_PREFIX, strlen(OPTIM_PREFIX)) == 0) {
            s = pp_error(PP_ERR_UNSUPPORTED, "stage %d: state '%s' has the name prefix checkpoints reserve for the "
                         "optimizer", k, names[fp->n + n_opt + i]);
            break;
        }
        ts[fp->n + n_opt + i] = pp_tensor_retain(pp_stage_state_tensor(st, i));
    }
    if (s == PP_OK) {
        char v_step[32], v_stage[16], v_steps[32], v_hash[32];
        snprintf(v_step, sizeof v_step, "%" PRId64, step);
        snprintf(v_stage, sizeof v_stage, "%d", k);
        snprintf(v_steps, sizeof v_steps, "%" PRId64, opt ? pp_optim_steps(opt) : (int64_t)0);
        const char *keys[] = {"pippin.format", "pippin.step", "pippin.stage", "pippin.optimizer", "pippin.optimizer_steps",
                              "pippin.hash"};
        const char *vals[] = {"checkpoint", v_step, v_stage,
                              opt ? pp_optim_kind_name(pp_optim_get_config(opt)->kind) : "none", v_steps, v_hash};
        snprintf(v_hash, sizeof v_hash, "%016" PRIx64, file_hash(n, names, ts, 5, keys, vals));
        pp_checkpoint_stage_path(dir, step, k, path, sizeof path);
        s = pp_safetensors_save(path, n, names, ts, 6, keys, vals);
    }
    for (int i = 0; ts && i < n; i++) pp_tensor_free(ts[i]);
    for (int i = 0; owned && i < n_opt; i++) free(owned[i]);
    free(ts);
    free(owned);
    free(names);
    return s;
}

pp_status pp_checkpoint_commit(const char *dir, int64_t step, int n_stages) {
    char sdir[4096], path[4200];
    step_dir(dir, step, sdir, sizeof sdir);
    PP_TRY(pp_mkdirs(sdir));
    json_object *m = json_object_new_object(), *files = json_object_new_array();
    json_object_object_add(m, "format", json_object_new_string("pippin-checkpoint"));
    json_object_object_add(m, "version", json_object_new_int(1));
    json_object_object_add(m, "step", json_object_new_int64(step));
    json_object_object_add(m, "stages", json_object_new_int(n_stages));
    for (int k = 0; k < n_stages; k++) {
        char f[64];
        snprintf(f, sizeof f, "stage_%d.safetensors", k);
        json_object_array_add(files, json_object_new_string(f));
    }
    json_object_object_add(m, "files", files);
    const char *text = json_object_to_json_string_ext(m, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    snprintf(path, sizeof path, "%s/" MANIFEST, sdir);
    pp_atomic_file af;
    pp_status s = pp_atomic_open(path, &af);
    if (s == PP_OK) {
        if (fputs(text, af.f) < 0 || fputc('\n', af.f) == EOF) {
            s = pp_error(PP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
            pp_atomic_discard(&af);
        } else {
            s = pp_atomic_commit(&af);
        }
    }
    json_object_put(m);
    return s;
}

/* ---- reading ---- */

/* "step_<N>" -> N; 0 if the name is not a step directory. */
static int parse_step_name(const char *name, int64_t *step) {
    if (strncmp(name, "step_", 5) != 0 || !name[5]) return 0;
    if (name[5] == '0' && name[6]) return 0; /* one directory per step: step_7, never step_007 */
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (*p - '0');
    }
    *step = v;
    return 1;
}

/* The manifest of step: 1 and its stage count when it commits that step. */
static int read_manifest(const char *dir, int64_t step, int *n_stages) {
    char path[4200];
    snprintf(path, sizeof path, "%s/step_%" PRId64 "/" MANIFEST, dir, step);
    unsigned char *buf;
    size_t len;
    if (pp_read_file(path, 1 << 20, &buf, &len) != PP_OK) return 0;
    buf[len] = '\0';
    json_object *m = json_tokener_parse((const char *)buf), *v;
    free(buf);
    int ok = m && json_object_is_type(m, json_type_object) && json_object_object_get_ex(m, "format", &v) &&
             json_object_is_type(v, json_type_string) && strcmp(json_object_get_string(v), "pippin-checkpoint") == 0 &&
             json_object_object_get_ex(m, "step", &v) && json_object_is_type(v, json_type_int) &&
             json_object_get_int64(v) == step && json_object_object_get_ex(m, "stages", &v) &&
             json_object_is_type(v, json_type_int) && json_object_get_int64(v) > 0 && json_object_get_int64(v) < (1 << 20);
    if (ok) *n_stages = (int)json_object_get_int64(v);
    json_object_put(m);
    return ok;
}

static int by_step(const void *a, const void *b) {
    const pp_checkpoint_step *x = a, *y = b;
    return (x->step > y->step) - (x->step < y->step);
}

/* Stage files in a step directory, and their bytes. */
static void count_files(const char *sdir, pp_checkpoint_step *cs) {
    DIR *d = opendir(sdir);
    if (!d) return;
    struct dirent *e;
    char path[8192];
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "stage_", 6) != 0 || len < 12 || strcmp(e->d_name + len - 12, ".safetensors") != 0)
            continue;
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        cs->n_files++;
        cs->bytes += (int64_t)sb.st_size;
    }
    closedir(d);
}

pp_status pp_checkpoint_list(const char *dir, pp_checkpoint_step **steps, int *n) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return pp_error(errno == ENOENT ? PP_ERR_NOT_FOUND : PP_ERR_IO, "%s: %s", dir, strerror(errno));
    pp_checkpoint_step *v = NULL;
    int cap = 0;
    pp_status s = PP_OK;
    struct dirent *e;
    while (s == PP_OK && (e = readdir(d))) {
        int64_t step;
        if (!parse_step_name(e->d_name, &step)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            pp_checkpoint_step *nv = realloc(v, sizeof *v * (size_t)cap);
            if (!nv) {
                s = pp_error(PP_ERR_NOMEM, "out of memory");
                break;
            }
            v = nv;
        }
        pp_checkpoint_step *cs = &v[(*n)++];
        memset(cs, 0, sizeof *cs);
        cs->step = step;
        cs->committed = read_manifest(dir, step, &cs->n_stages);
        char sdir[4200];
        step_dir(dir, step, sdir, sizeof sdir);
        count_files(sdir, cs);
    }
    closedir(d);
    if (s != PP_OK) {
        free(v);
        *n = 0;
        return s;
    }
    if (*n) qsort(v, (size_t)*n, sizeof *v, by_step);
    *steps = v;
    return PP_OK;
}

pp_status pp_checkpoint_latest(const char *dir, int64_t *step) {
    pp_checkpoint_step *v;
    int n;
    pp_status s = pp_checkpoint_list(dir, &v, &n);
    if (s == PP_ERR_NOT_FOUND) return pp_error(s, "%s: no checkpoint here (the directory does not exist)", dir);
    PP_TRY(s);
    int i = n - 1;
    while (i >= 0 && !v[i].committed) i--;
    if (i >= 0) *step = v[i].step;
    free(v);
    if (i < 0) {
        char old[4200];
        struct stat sb;
        snprintf(old, sizeof old, "%s/stage_0/state.json", dir);
        if (stat(old, &sb) == 0)
            return pp_error(PP_ERR_NOT_FOUND, "%s: holds a checkpoint in the layout of pippin 0.2 (stage_K/*.npy), "
                            "which this version does not read; committed checkpoints are step_N/ directories", dir);
        return pp_error(PP_ERR_NOT_FOUND, "%s: no committed checkpoint here (no step_N/" MANIFEST ")", dir);
    }
    return PP_OK;
}

pp_status pp_checkpoint_keep_from(const char *dir, int keep, int64_t *before) {
    *before = INT64_MIN;
    pp_checkpoint_step *v;
    int n;
    PP_TRY(pp_checkpoint_list(dir, &v, &n));
    for (int i = n - 1, seen = 0; i >= 0 && keep > 0; i--)
        if (v[i].committed && ++seen == keep) {
            *before = v[i].step;
            break;
        }
    free(v);
    return PP_OK;
}

static void remove_step_dir(const char *sdir) {
    char path[8192];
    snprintf(path, sizeof path, "%s/" MANIFEST, sdir);
    if (unlink(path) == 0) pp_fsync_dir(sdir); /* uncommitted before anything else goes */
    DIR *d = opendir(sdir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(sdir); /* another rank may still be removing its files: then it removes the directory */
}

pp_status pp_checkpoint_prune(const char *dir, int64_t before) {
    pp_checkpoint_step *v;
    int n;
    PP_TRY(pp_checkpoint_list(dir, &v, &n));
    for (int i = 0; i < n && v[i].step < before; i++) {
        char sdir[4200];
        step_dir(dir, v[i].step, sdir, sizeof sdir);
        remove_step_dir(sdir);
    }
    free(v);
    return pp_fsync_dir(dir);
}

/* got: the file's value of metadata key (NULL: missing); want: NULL for any. */
static pp_status check_meta(const char *got, const char *path, const char *key, const char *want) {
    if (!got) return pp_error(PP_ERR_PARSE, "%s: metadata '%s' missing: not a pippin checkpoint", path, key);
    if (want && strcmp(got, want) != 0)
        return pp_error(PP_ERR_INVALID, "%s: %s is '%s', expected '%s'", path, key, got, want);
    return PP_OK;
}

static pp_status meta_int(const char *v, const char *path, const char *key, int64_t *out) {
    PP_TRY(check_meta(v, path, key, NULL));
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || end == v || x < 0) return pp_error(PP_ERR_PARSE, "%s: %s is '%s', not a count", path, key, v);
    *out = x;
    return PP_OK;
}

pp_status pp_checkpoint_read_file(const char *path, pp_safetensors **out) {
    pp_safetensors *f;
    PP_TRY(pp_safetensors_load(path, &f));
    char want[32];
    snprintf(want, sizeof want, "%016" PRIx64,
             file_hash(f->n, (const char *const *)f->names, f->tensors, f->n_meta, (const char *const *)f->meta_keys,
                       (const char *const *)f->meta_values));
    const char *hash = pp_safetensors_meta(f, "pippin.hash");
    pp_status s = check_meta(pp_safetensors_meta(f, "pippin.format"), path, "pippin.format", "checkpoint");
    if (s == PP_OK) s = check_meta(hash, path, "pippin.hash", NULL);
    if (s == PP_OK && strcmp(hash, want) != 0)
        s = pp_error(PP_ERR_INVALID, "%s: the contents' hash differs from the one recorded: the file is damaged", path);
    if (s != PP_OK) {
        pp_safetensors_free(f);
        return s;
    }
    *out = f;
    return PP_OK;
}

/* Where entry e of a stage file goes: the stage's parameter, optimizer
 * buffer or running statistics of its name, as n floats of this shape
 * (ndim < 0: any); *dst NULL when this stage has no such tensor. */
typedef struct target {
    float *dst;
    int64_t n;
    int ndim;
    const int64_t *shape;
} target;

static target target_of(const char *name, pp_stage *st, pp_flat_params *fp, pp_optim *opt) {
    target t = {0};
    if (strncmp(name, OPTIM_PREFIX, strlen(OPTIM_PREFIX)) == 0) {
        int n_opt = opt ? pp_optim_state(opt, -1, NULL, NULL) : 0;
        for (int i = 0; i < n_opt; i++) {
            const char *bname;
            float *buf;
            pp_optim_state(opt, i, &bname, &buf);
            if (strcmp(name + strlen(OPTIM_PREFIX), bname) == 0) return (target){buf, fp->total, -1, NULL};
        }
        return t;
    }
    int k = pp_flat_params_find(fp, name);
    if (k >= 0) return (target){fp->data + fp->offset[k], fp->numel[k], fp->ndims[k], fp->shapes + (size_t)k * PP_MAX_DIMS};
    for (int j = 0; j < pp_stage_n_state(st); j++)
        if (strcmp(pp_stage_state_name(st, j), name) == 0) {
            pp_tensor *x = pp_stage_state_tensor(st, j);
            return (target){x->dtype == PP_F32 ? x->data : NULL, pp_tensor_numel(x), x->ndim, x->shape};
        }
    return t;
}

/* Checks the file's tensor `name` against n floats of this shape (ndim < 0: any). */
static pp_status check_floats(const pp_safetensors_index *ix, const char *name, int64_t n, int ndim, const int64_t *shape) {
    const pp_safetensors_entry *e = NULL;
    for (int i = 0; i < ix->n && !e; i++)
        if (strcmp(ix->entries[i].name, name) == 0) e = &ix->entries[i];
    if (!e) return pp_error(PP_ERR_NOT_FOUND, "%s: no tensor '%s' (the stage has it)", ix->name, name);
    int64_t numel = 1;
    for (int d = 0; d < e->ndim; d++) numel *= e->shape[d];
    int same = e->dtype == PP_F32 && numel == n && (ndim < 0 || e->ndim == ndim);
    for (int d = 0; same && ndim >= 0 && d < ndim; d++) same = e->shape[d] == shape[d];
    if (!same)
        return pp_error(PP_ERR_SHAPE, "%s: tensor '%s' is %s with %lld elements; the stage's is float32 with %lld", ix->name,
                        name, pp_dtype_name(e->dtype), (long long)numel, (long long)n);
    return PP_OK;
}

/* Everything that needs no tensor data: step, stage, optimizer, and every
 * tensor's name, dtype and shape against the stage's. A file refused here
 * leaves the stage as it was. */
static pp_status check_index(const pp_safetensors_index *ix, int64_t step, pp_stage *st, pp_flat_params *fp,
                             pp_optim *opt, int64_t *opt_steps) {
    const char *path = ix->name;
    char want[32];
    PP_TRY(check_meta(pp_safetensors_index_meta(ix, "pippin.format"), path, "pippin.format", "checkpoint"));
    PP_TRY(check_meta(pp_safetensors_index_meta(ix, "pippin.hash"), path, "pippin.hash", NULL));
    snprintf(want, sizeof want, "%" PRId64, step);
    PP_TRY(check_meta(pp_safetensors_index_meta(ix, "pippin.step"), path, "pippin.step", want));
    snprintf(want, sizeof want, "%d", pp_stage_index(st));
    PP_TRY(check_meta(pp_safetensors_index_meta(ix, "pippin.stage"), path, "pippin.stage", want));
    int n_opt = opt ? pp_optim_state(opt, -1, NULL, NULL) : 0;
    if (opt) {
        const char *kind = pp_optim_kind_name(pp_optim_get_config(opt)->kind);
        const char *saved = pp_safetensors_index_meta(ix, "pippin.optimizer");
        if (check_meta(saved, path, "pippin.optimizer", kind) != PP_OK)
            return pp_error(PP_ERR_INVALID, "%s: saved with optimizer '%s', this run uses %s", path, saved ? saved : "?",
                            kind);
        PP_TRY(meta_int(pp_safetensors_index_meta(ix, "pippin.optimizer_steps"), path, "pippin.optimizer_steps", opt_steps));
    }
    for (int i = 0; i < ix->n; i++) {
        const char *name = ix->entries[i].name;
        if (strncmp(name, OPTIM_PREFIX, strlen(OPTIM_PREFIX)) == 0) continue;
        int j = 0;
        while (j < pp_stage_n_state(st) && strcmp(pp_stage_state_name(st, j), name) != 0) j++;
        if (pp_flat_params_find(fp, name) < 0 && j == pp_stage_n_state(st))
            return pp_error(PP_ERR_INVALID, "%s: holds parameter '%s', which stage %d does not have", path, name,
                            pp_stage_index(st));
    }
    for (int i = 0; i < pp_stage_n_state(st); i++) {
        const char *name = pp_stage_state_name(st, i);
        int found = 0;
        for (int k = 0; k < ix->n && !found; k++) found = strcmp(ix->entries[k].name, name) == 0;
        if (!found)
            return pp_error(PP_ERR_NOT_FOUND, "%s: no running statistics '%s' for stage %d: the checkpoint was written "
                            "before pippin kept BatchNormalization state (or by another model)", path, name,
                            pp_stage_index(st));
    }
    for (int i = 0; i < fp->n; i++)
        PP_TRY(check_floats(ix, fp->names[i], fp->numel[i], fp->ndims[i], fp->shapes + (size_t)i * PP_MAX_DIMS));
    for (int i = 0; i < n_opt; i++) {
        const char *bname;
        float *buf;
        pp_optim_state(opt, i, &bname, &buf);
        char name[256];
        snprintf(name, sizeof name, OPTIM_PREFIX "%s", bname);
        PP_TRY(check_floats(ix, name, fp->total, -1, NULL));
    }
    for (int i = 0; i < pp_stage_n_state(st); i++) {
        pp_tensor *t = pp_stage_state_tensor(st, i);
        if (t->dtype != PP_F32)
            return pp_error(PP_ERR_UNSUPPORTED, "%s: state '%s' is %s (float32 only)", path, pp_stage_state_name(st, i),
                            pp_dtype_name(t->dtype));
        PP_TRY(check_floats(ix, pp_stage_state_name(st, i), pp_tensor_numel(t), t->ndim, t->shape));
    }
    return PP_OK;
}

/* Reads every tensor of the file once, in file order, straight into its
 * place in the stage (a tensor this stage has no place for, such as
 * optimizer state when opt is NULL, through a buffer of its own), hashing
 * each as it comes, and compares the hash with the recorded one. */
static pp_status read_into_stage(const pp_safetensors_index *ix, pp_stage *st, pp_flat_params *fp, pp_optim *opt) {
    uint64_t h = PP_HASH64_SEED;
    for (int i = 0; i < ix->n; i++) {
        const pp_safetensors_entry *e = &ix->entries[i];
        target t = target_of(e->name, st, fp, opt);
        void *dst = t.dst, *own = NULL;
        if (!dst && !(dst = own = malloc(e->nbytes ? e->nbytes : 1)))
            return pp_error(PP_ERR_NOMEM, "%s: tensor '%s': out of memory", ix->name, e->name);
        pp_status s = pp_safetensors_index_read(ix, i, dst);
        if (s == PP_OK) h = hash_tensor(h, e->name, dst, e->nbytes);
        free(own);
        if (s != PP_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", pp_last_error()); /* pp_error writes over it */
            return pp_error(s, "%s (stage %d's parameters are now partly overwritten: do not train on)", why,
                            pp_stage_index(st));
        }
    }
    h = hash_meta(h, ix->n_meta, (const char *const *)ix->meta_keys, (const char *const *)ix->meta_values);
    char got[32];
    snprintf(got, sizeof got, "%016" PRIx64, h);
    if (strcmp(got, pp_safetensors_index_meta(ix, "pippin.hash")) != 0)
        return pp_error(PP_ERR_INVALID, "%s: the contents' hash differs from the one recorded: the file is damaged "
                        "(stage %d's parameters are now partly overwritten: do not train on)", ix->name,
                        pp_stage_index(st));
    return PP_OK;
}

pp_status pp_checkpoint_load_stage(const char *dir, int64_t step, pp_stage *st, pp_optim *opt) {
    char path[4200];
    pp_checkpoint_stage_path(dir, step, pp_stage_index(st), path, sizeof path);
    pp_flat_params none = {0}, *fp;
    PP_TRY(pp_stage_params_sync(st, &fp));
    if (!fp) {
        fp = &none;
        opt = NULL;
    }
    pp_safetensors_index *ix;
    PP_TRY(pp_safetensors_index_open(path, &ix));
    int64_t opt_steps = 0;
    pp_status s = check_index(ix, step, st, fp, opt, &opt_steps);
    if (s == PP_OK) s = read_into_stage(ix, st, fp, opt);
    if (s == PP_OK && opt) pp_optim_set_steps(opt, opt_steps);
    pp_safetensors_index_free(ix);
    return s;
}

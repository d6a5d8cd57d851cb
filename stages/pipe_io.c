/* Stage files: DIR/stage_K.onnx per stage and DIR/pipe.json describing the
 * stages, the values crossing between them and the shared parameters. */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pippin/onnx.h"
#include "pippin/pipe.h"

#include "status_internal.h"
static json_object *dims_json(const pp_pipe_edge *e) {
    if (e->ndim < 0) return NULL;
    json_object *arr = json_object_new_array();
    for (int d = 0; d < e->ndim; d++) {
        const char *s = e->dims[d];
        char *end;
        long long v = s ? strtoll(s, &end, 10) : -1;
        if (s && *end == '\0') json_object_array_add(arr, json_object_new_int64(v));
        else json_object_array_add(arr, s ? json_object_new_string(s) : NULL);
    }
    return arr;
}

static json_object *names_json(const pp_graph *g, const int *ids, int n) {
    json_object *arr = json_object_new_array();
    for (int i = 0; i < n; i++) json_object_array_add(arr, json_object_new_string(g->values[ids[i]].name));
    return arr;
}

static json_object *ints_json(const int *v, int n) {
    json_object *arr = json_object_new_array();
    for (int i = 0; i < n; i++) json_object_array_add(arr, json_object_new_int(v[i]));
    return arr;
}

static json_object *pipe_json(const pp_pipe *p) {
    json_object *root = json_object_new_object();
    json_object_object_add(root, "format", json_object_new_string("pippin-pipe"));
    json_object_object_add(root, "version", json_object_new_int(1));
    json_object *stages = json_object_new_array();
    for (int s = 0; s < p->n_stages; s++) {
        const pp_graph *g = p->stages[s];
        json_object *o = json_object_new_object();
        char file[64];
        snprintf(file, sizeof file, "stage_%d.onnx", s);
        json_object_object_add(o, "file", json_object_new_string(file));
        if (g) { /* a stage not loaded (or moved into a stage object) has only its file */
            int64_t count, bytes;
            pp_graph_param_stats(g, &count, &bytes);
            json_object_object_add(o, "nodes", json_object_new_int(g->n_nodes));
            json_object_object_add(o, "parameters", json_object_new_int64(count));
            json_object_object_add(o, "parameter_bytes", json_object_new_int64(bytes));
            json_object_object_add(o, "inputs", names_json(g, g->inputs, g->n_inputs));
            json_object_object_add(o, "outputs", names_json(g, g->outputs, g->n_outputs));
        }
        if (s > 0 && p->cut_names[s - 1])
            json_object_object_add(o, "cut", json_object_new_string(p->cut_names[s - 1]));
        json_object_array_add(stages, o);
    }
    json_object_object_add(root, "stages", stages);
    json_object *edges = json_object_new_array();
    for (int e = 0; e < p->n_edges; e++) {
        const pp_pipe_edge *ed = &p->edges[e];
        json_object *o = json_object_new_object();
        json_object_object_add(o, "value", json_object_new_string(ed->value));
        json_object_object_add(o, "producer", ed->producer >= 0 ? json_object_new_int(ed->producer) : NULL);
        json_object_object_add(o, "consumers", ints_json(ed->consumers, ed->n_consumers));
        json_object_object_add(o, "dtype", json_object_new_string(pp_dtype_name(ed->dtype)));
        json_object_object_add(o, "shape", dims_json(ed));
        json_object_object_add(o, "bytes_per_sample",
                               ed->bytes_per_sample >= 0 ? json_object_new_int64(ed->bytes_per_sample) : NULL);
        json_object_array_add(edges, o);
    }
    json_object_object_add(root, "edges", edges);
    json_object *shared = json_object_new_array();
    for (int i = 0; i < p->n_shared; i++) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "name", json_object_new_string(p->shared[i].name));
        json_object_object_add(o, "stages", ints_json(p->shared[i].stages, p->shared[i].n_stages));
        json_object_array_add(shared, o);
    }
    json_object_object_add(root, "shared_parameters", shared);
    json_object *outs = json_object_new_array();
    for (int o = 0; o < p->n_outputs; o++) {
        json_object *jo = json_object_new_object();
        json_object_object_add(jo, "name", json_object_new_string(p->outputs[o]));
        json_object_object_add(jo, "stage", json_object_new_int(p->output_stage[o]));
        json_object_array_add(outs, jo);
    }
    json_object_object_add(root, "outputs", outs);
    json_object_object_add(root, "loss", p->loss ? json_object_new_string(p->loss) : NULL);
    return root;
}

char *pp_pipe_to_json(const pp_pipe *p) {
    json_object *root = pipe_json(p);
    const char *text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    char *copy = text ? strdup(text) : NULL;
    json_object_put(root);
    if (!copy) pp_error(PP_ERR_NOMEM, "out of memory");
    return copy;
}

pp_status pp_pipe_save(const pp_pipe *p, const char *dir) { return pp_pipe_save_with(p, dir, NULL); }

pp_status pp_pipe_save_with(const pp_pipe *p, const char *dir, const pp_onnx_save_options *o) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) return pp_error(PP_ERR_IO, "%s: %s", dir, strerror(errno));
    char path[4096];
    for (int s = 0; s < p->n_stages; s++) {
        snprintf(path, sizeof path, "%s/stage_%d.onnx", dir, s);
        PP_TRY(pp_onnx_save_with(p->stages[s], path, o));
    }
    snprintf(path, sizeof path, "%s/pipe.json", dir);
    json_object *root = pipe_json(p);
    int rc = json_object_to_file_ext(path, root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    json_object_put(root);
    return rc == 0 ? PP_OK : pp_error(PP_ERR_IO, "%s: write failed", path);
}

/* --- loading: every field is checked, errors name the file and the key --- */

typedef struct {
    const char *path;
} ctx_t;

static pp_status get_array(const ctx_t *c, json_object *o, const char *key, int required, json_object **out) {
    *out = NULL;
    if (!json_object_object_get_ex(o, key, out) || !*out) {
        if (required) return pp_error(PP_ERR_PARSE, "%s: missing '%s'", c->path, key);
        return PP_OK;
    }
    if (!json_object_is_type(*out, json_type_array))
        return pp_error(PP_ERR_PARSE, "%s: '%s' must be an array", c->path, key);
    return PP_OK;
}

static pp_status get_string(const ctx_t *c, json_object *o, const char *key, const char *where, const char **out) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return pp_error(PP_ERR_PARSE, "%s: %s: '%s' must be a string", c->path, where, key);
    *out = json_object_get_string(v);
    return PP_OK;
}

static pp_status get_stage_list(const ctx_t *c, json_object *arr, int n_stages, const char *where, int **out,
                                int *n) {
    size_t len = json_object_array_length(arr);
    *out = malloc(sizeof(int) * (len + 1));
    *n = 0;
    if (!*out) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) {
        json_object *v = json_object_array_get_idx(arr, i);
        if (!json_object_is_type(v, json_type_int) || json_object_get_int(v) < 0 ||
            json_object_get_int(v) >= n_stages)
            return pp_error(PP_ERR_PARSE, "%s: %s: stage %zu is not a stage index (0..%d)", c->path, where, i,
                            n_stages - 1);
        (*out)[(*n)++] = json_object_get_int(v);
    }
    return PP_OK;
}

static pp_status load_edges(const ctx_t *c, json_object *root, pp_pipe *p) {
    json_object *arr;
    PP_TRY(get_array(c, root, "edges", 1, &arr));
    size_t n = json_object_array_length(arr);
    p->edges = calloc(n + 1, sizeof *p->edges);
    if (!p->edges) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *o = json_object_array_get_idx(arr, i), *v;
        char where[64];
        snprintf(where, sizeof where, "edges[%zu]", i);
        if (!json_object_is_type(o, json_type_object)) return pp_error(PP_ERR_PARSE, "%s: %s is not an object", c->path, where);
        pp_pipe_edge *e = &p->edges[p->n_edges++];
        e->ndim = -1;
        e->bytes_per_sample = -1;
        const char *value;
        PP_TRY(get_string(c, o, "value", where, &value));
        e->value = strdup(value);
        e->producer = -1;
        if (json_object_object_get_ex(o, "producer", &v) && v) {
            if (!json_object_is_type(v, json_type_int) || json_object_get_int(v) < 0 ||
                json_object_get_int(v) >= p->n_stages)
                return pp_error(PP_ERR_PARSE, "%s: %s: bad producer", c->path, where);
            e->producer = json_object_get_int(v);
        }
        json_object *cons;
        PP_TRY(get_array(c, o, "consumers", 1, &cons));
        PP_TRY(get_stage_list(c, cons, p->n_stages, where, &e->consumers, &e->n_consumers));
        const char *dt;
        if (get_string(c, o, "dtype", where, &dt) == PP_OK) {
            e->dtype = pp_dtype_from_name(dt);
            if (e->dtype == PP_DTYPE_UNDEFINED && strcmp(dt, "undefined") != 0)
                return pp_error(PP_ERR_PARSE, "%s: %s: unknown dtype '%s'", c->path, where, dt);
        }
        json_object *shape;
        PP_TRY(get_array(c, o, "shape", 0, &shape));
        if (shape) {
            size_t nd = json_object_array_length(shape);
            if (nd > PP_MAX_DIMS) return pp_error(PP_ERR_PARSE, "%s: %s: more than %d dims", c->path, where, PP_MAX_DIMS);
            e->ndim = (int)nd;
            for (size_t d = 0; d < nd; d++) {
                json_object *dv = json_object_array_get_idx(shape, d);
                if (dv) e->dims[d] = strdup(json_object_get_string(dv));
            }
        }
        if (json_object_object_get_ex(o, "bytes_per_sample", &v) && json_object_is_type(v, json_type_int))
            e->bytes_per_sample = json_object_get_int64(v);
    }
    return PP_OK;
}

static pp_status load_rest(const ctx_t *c, json_object *root, pp_pipe *p) {
    json_object *arr, *v;
    PP_TRY(get_array(c, root, "shared_parameters", 0, &arr));
    size_t n = arr ? json_object_array_length(arr) : 0;
    p->shared = calloc(n + 1, sizeof *p->shared);
    if (!p->shared) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *o = json_object_array_get_idx(arr, i), *st;
        char where[64];
        snprintf(where, sizeof where, "shared_parameters[%zu]", i);
        pp_pipe_shared *sh = &p->shared[p->n_shared++];
        const char *name;
        PP_TRY(get_string(c, o, "name", where, &name));
        sh->name = strdup(name);
        PP_TRY(get_array(c, o, "stages", 1, &st));
        PP_TRY(get_stage_list(c, st, p->n_stages, where, &sh->stages, &sh->n_stages));
    }
    PP_TRY(get_array(c, root, "outputs", 1, &arr));
    n = json_object_array_length(arr);
    p->outputs = calloc(n + 1, sizeof(char *));
    p->output_stage = calloc(n + 1, sizeof(int));
    if (!p->outputs || !p->output_stage) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *o = json_object_array_get_idx(arr, i);
        char where[64];
        snprintf(where, sizeof where, "outputs[%zu]", i);
        const char *name;
        PP_TRY(get_string(c, o, "name", where, &name));
        if (!json_object_object_get_ex(o, "stage", &v) || !json_object_is_type(v, json_type_int) ||
            json_object_get_int(v) < 0 || json_object_get_int(v) >= p->n_stages)
            return pp_error(PP_ERR_PARSE, "%s: %s: bad stage", c->path, where);
        p->outputs[p->n_outputs] = strdup(name);
        p->output_stage[p->n_outputs++] = json_object_get_int(v);
    }
    p->loss_stage = -1;
    if (json_object_object_get_ex(root, "loss", &v) && v) {
        if (!json_object_is_type(v, json_type_string)) return pp_error(PP_ERR_PARSE, "%s: 'loss' must be a string", c->path);
        p->loss = strdup(json_object_get_string(v));
        for (int o = 0; o < p->n_outputs; o++)
            if (strcmp(p->outputs[o], p->loss) == 0) p->loss_stage = p->output_stage[o];
        if (p->loss_stage < 0) return pp_error(PP_ERR_PARSE, "%s: loss '%s' is not an output", c->path, p->loss);
    }
    return PP_OK;
}

/* only: -1 every stage graph, -2 none, k >= 0 stage k alone. */
static pp_status load_pipe(const char *dir, int only, pp_pipe **out) {
    char path[4096];
    *out = NULL;
    snprintf(path, sizeof path, "%s/pipe.json", dir);
    ctx_t c = {path};
    json_object *root = json_object_from_file(path);
    if (!root) return pp_error(PP_ERR_PARSE, "%s: cannot read JSON (%s)", path, json_util_get_last_err());
    pp_pipe *p = calloc(1, sizeof *p);
    pp_status s = p ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    json_object *stages = NULL, *v;
    const char *fmt = NULL;
    if (s == PP_OK && (get_string(&c, root, "format", "top level", &fmt) != PP_OK || strcmp(fmt, "pippin-pipe") != 0))
        s = pp_error(PP_ERR_PARSE, "%s: not a pippin pipe description (format)", path);
    if (s == PP_OK && (!json_object_object_get_ex(root, "version", &v) || json_object_get_int(v) != 1))
        s = pp_error(PP_ERR_UNSUPPORTED, "%s: unsupported version", path);
    if (s == PP_OK) s = get_array(&c, root, "stages", 1, &stages);
    if (s == PP_OK) {
        size_t n = json_object_array_length(stages);
        if (n == 0 || n > 1024) s = pp_error(PP_ERR_PARSE, "%s: %zu stages (1 to 1024)", path, n);
        p->stages = calloc(n + 1, sizeof *p->stages);
        p->cut_names = calloc(n + 1, sizeof(char *));
        p->stage_files = calloc(n + 1, sizeof(char *));
        if (s == PP_OK && (!p->stages || !p->cut_names || !p->stage_files))
            s = pp_error(PP_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n && s == PP_OK; i++) {
            json_object *o = json_object_array_get_idx(stages, i), *cutv;
            char where[64], spath[8192];
            const char *file;
            snprintf(where, sizeof where, "stages[%zu]", i);
            s = get_string(&c, o, "file", where, &file);
            if (s == PP_OK && (strchr(file, '/') || !file[0] || strcmp(file, ".") == 0 || strcmp(file, "..") == 0))
                s = pp_error(PP_ERR_PARSE, "%s: %s: file must be a plain name", path, where);
            if (s != PP_OK) break;
            snprintf(spath, sizeof spath, "%s/%s", dir, file);
            /* A worker loads only its own stage file. */
            if (only == -1 || only == (int)i) s = pp_onnx_load(spath, &p->stages[i]);
            if (s == PP_OK && !(p->stage_files[i] = strdup(file))) s = pp_error(PP_ERR_NOMEM, "out of memory");
            if (s == PP_OK) p->n_stages++; /* frees go up to n_stages */
            if (i > 0 && json_object_object_get_ex(o, "cut", &cutv)) p->cut_names[i - 1] = strdup(json_object_get_string(cutv));
        }
    }
    if (s == PP_OK && only >= p->n_stages)
        s = pp_error(PP_ERR_NOT_FOUND, "%s: there is no stage %d (%d stages)", path, only, p->n_stages);
    if (s == PP_OK) s = load_edges(&c, root, p);
    if (s == PP_OK) s = load_rest(&c, root, p);
    json_object_put(root);
    if (s != PP_OK) {
        pp_pipe_free(p);
        return s;
    }
    *out = p;
    return PP_OK;
}

pp_status pp_pipe_load(const char *dir, pp_pipe **out) { return load_pipe(dir, -1, out); }

pp_status pp_pipe_load_stage(const char *dir, int index, pp_pipe **out) {
    if (index < 0) return pp_error(PP_ERR_INVALID, "stage %d: stage indices start at 0", index);
    return load_pipe(dir, index, out);
}

pp_status pp_pipe_load_meta(const char *dir, pp_pipe **out) { return load_pipe(dir, -2, out); }

pp_status pp_pipe_load_graph(pp_pipe *p, const char *dir, int k) {
    if (k < 0 || k >= p->n_stages || !p->stage_files || !p->stage_files[k])
        return pp_error(PP_ERR_INVALID, "%s: no stage %d to load", dir, k);
    if (p->stages[k]) return PP_OK;
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, p->stage_files[k]);
    return pp_onnx_load(path, &p->stages[k]);
}

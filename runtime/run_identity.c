/* A run's identity: what the ranks of one run must agree on, its wire form
 * and the comparison between two ranks' (runtime/run_identity.h). */
#include "run_identity.h"

#include "pippin/version.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "status_internal.h"

struct pp_run_identity {
    int n, cap;
    pp_run_identity_entry *e;
};

#define ENTRY_HEADER 18 /* kind, flags, key bytes, detail bytes, stage, hash */
#define FILE_CHUNK ((size_t)1 << 20)

static const uint8_t MAGIC[4] = {'P', 'P', 'R', 'I'};
enum { VERSION = 1 };

/* ---- building ---- */

static int is_common(int kind) { return kind == PP_RUN_IDENTITY_VALUE || kind == PP_RUN_IDENTITY_FILE; }

/* No control characters (they would end up in error messages). */
static int clean_text(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f) return 0;
    }
    return 1;
}

/* A copy of detail cut to the limit ("..." at the end) with control
 * characters made '?'. */
static char *detail_copy(const char *d) {
    if (!d) d = "";
    size_t n = strlen(d), max = PP_RUN_IDENTITY_MAX_DETAIL;
    int cut = n > max;
    if (cut) n = max - 3;
    char *r = malloc(n + (cut ? 3 : 0) + 1);
    if (!r) return NULL;
    memcpy(r, d, n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)r[i] < 0x20 || r[i] == 0x7f) r[i] = '?';
    if (cut) memcpy(r + n, "...", 3), n += 3;
    r[n] = 0;
    return r;
}

static pp_status add(pp_run_identity *id, int kind, int flags, int stage, const char *key, uint64_t hash,
                     const char *detail) {
    size_t kl = strlen(key);
    if (kl == 0 || kl > PP_RUN_IDENTITY_MAX_KEY)
        return pp_error(PP_ERR_UNSUPPORTED, "run identity: key '%.80s...' is longer than %d bytes", key,
                        PP_RUN_IDENTITY_MAX_KEY);
    if (!clean_text(key, kl)) return pp_error(PP_ERR_UNSUPPORTED, "run identity: the name '%s' has a control character", key);
    if (id->n >= PP_RUN_IDENTITY_MAX_ENTRIES)
        return pp_error(PP_ERR_UNSUPPORTED, "run identity: more than %d entries", PP_RUN_IDENTITY_MAX_ENTRIES);
    if (id->n == id->cap) {
        int cap = id->cap ? 2 * id->cap : 32;
        pp_run_identity_entry *e = realloc(id->e, (size_t)cap * sizeof *e);
        if (!e) return pp_error(PP_ERR_NOMEM, "out of memory");
        id->e = e;
        id->cap = cap;
    }
    pp_run_identity_entry *e = &id->e[id->n];
    e->key = strdup(key);
    e->detail = detail_copy(detail);
    e->hash = hash;
    e->kind = (uint8_t)kind;
    e->flags = (uint8_t)flags;
    e->stage = stage;
    id->n++;
    if (!e->key || !e->detail) return pp_error(PP_ERR_NOMEM, "out of memory");
    return PP_OK;
}

static uint64_t hash_text(const char *s) { return pp_hash64(PP_HASH64_SEED, s, strlen(s)); }

static pp_status add_text(pp_run_identity *id, const char *key, const char *text) {
    return add(id, PP_RUN_IDENTITY_VALUE, 0, -1, key, hash_text(text), text);
}

static pp_status add_int(pp_run_identity *id, const char *key, long long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return add_text(id, key, buf);
}

static pp_status add_double(pp_run_identity *id, const char *key, double v) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.15g", v); /* short when it reads back exactly */
    if (strtod(buf, NULL) != v) snprintf(buf, sizeof buf, "%.17g", v);
    return add_text(id, key, buf); /* either way it reads back: any change of bits shows */
}

static pp_status add_bool(pp_run_identity *id, const char *key, int v) { return add_text(id, key, v ? "true" : "false"); }

/* A list: each item's length and bytes; detail "[a, b]". */
static pp_status add_list(pp_run_identity *id, const char *key, int n, char *const *items) {
    uint64_t h = PP_HASH64_SEED;
    uint8_t count[8];
    for (int b = 0; b < 8; b++) count[b] = (uint8_t)((uint64_t)n >> (8 * b));
    h = pp_hash64(h, count, 8);
    char detail[PP_RUN_IDENTITY_MAX_DETAIL + 8];
    size_t len = 0;
    detail[len++] = '[';
    detail[len] = 0;
    for (int i = 0; i < n; i++) {
        h = pp_hash64(h, items[i], strlen(items[i])); /* pp_hash64 mixes in the length */
        if (len < sizeof detail - 1) {
            int w = snprintf(detail + len, sizeof detail - len, "%s%s", i ? ", " : "", items[i]);
            len = w < 0 ? len : len + (size_t)w;
            if (len > sizeof detail - 1) len = sizeof detail - 1;
        }
    }
    if (len < sizeof detail - 1) detail[len++] = ']', detail[len] = 0;
    return add(id, PP_RUN_IDENTITY_VALUE, 0, -1, key, h, detail);
}

/* A file's bytes, in chunks of FILE_CHUNK (each chunk's hash continues the last). */
static pp_status hash_file(const char *path, const char *what, uint64_t *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return pp_error(PP_ERR_IO, "run identity: cannot read %s %s: %s", what, path, strerror(errno));
    unsigned char *buf = malloc(FILE_CHUNK);
    if (!buf) {
        fclose(f);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    uint64_t h = PP_HASH64_SEED;
    pp_status s = PP_OK;
    for (;;) {
        size_t got = fread(buf, 1, FILE_CHUNK, f);
        if (got) h = pp_hash64(h, buf, got);
        if (got < FILE_CHUNK) {
            if (ferror(f)) s = pp_error(PP_ERR_IO, "run identity: reading %s %s failed", what, path);
            break;
        }
    }
    free(buf);
    fclose(f);
    *out = h;
    return s;
}

static pp_status add_file(pp_run_identity *id, const char *key, const char *path) {
    uint64_t h = 0;
    PP_TRY(hash_file(path, key, &h));
    return add(id, PP_RUN_IDENTITY_FILE, 0, -1, key, h, path);
}

static pp_status add_config(pp_run_identity *id, const pp_config *c) {
    char key[PP_RUN_IDENTITY_MAX_KEY + 1];
    /* kernels and their summation order may differ between versions */
    PP_TRY(add_text(id, "pippin.version", pp_version()));
    PP_TRY(add_text(id, "mode", c->training ? "train" : c->serving ? "serve" : "infer"));
    const char *sched = c->schedule ? c->schedule : "gpipe";
    if (!strncmp(sched, "csv:", 4)) PP_TRY(add_file(id, "schedule", sched + 4));
    else PP_TRY(add_text(id, "schedule", sched));
    PP_TRY(add_int(id, "microbatches", c->microbatches));
    PP_TRY(add_int(id, "batch_size", (long long)c->batch_size));
    PP_TRY(add_int(id, "replicas", c->replicas));
    PP_TRY(add_text(id, "wire_dtype", c->wire_bf16 ? "bfloat16" : "float32"));
    if (c->replicas > 1) { /* the buckets set where each sum starts, so its bits */
        PP_TRY(add_int(id, "gradient_buckets.first_bytes", (long long)c->bucket_first_bytes));
        PP_TRY(add_int(id, "gradient_buckets.bytes", (long long)c->bucket_bytes));
        PP_TRY(add_bool(id, "shard_optimizer", c->shard_optimizer)); /* what the ring gathers after the update */
    }
    PP_TRY(add_int(id, "steps", (long long)c->steps));
    PP_TRY(add_text(id, "loss", c->loss ? c->loss : "(automatic)"));
    const pp_optim_config *o = &c->optim;
    PP_TRY(add_text(id, "optimizer.kind", pp_optim_kind_name(o->kind)));
    PP_TRY(add_double(id, "optimizer.lr", o->lr));
    PP_TRY(add_double(id, "optimizer.weight_decay", o->weight_decay));
    PP_TRY(add_bool(id, "optimizer.maximize", o->maximize));
    PP_TRY(add_double(id, "optimizer.momentum", o->momentum));
    PP_TRY(add_double(id, "optimizer.dampening", o->dampening));
    PP_TRY(add_bool(id, "optimizer.nesterov", o->nesterov));
    PP_TRY(add_double(id, "optimizer.beta1", o->beta1));
    PP_TRY(add_double(id, "optimizer.beta2", o->beta2));
    PP_TRY(add_double(id, "optimizer.eps", o->eps));
    for (int i = 0; i < c->n_dims; i++) {
        snprintf(key, sizeof key, "dims.%s", c->dims[i].key);
        PP_TRY(add_text(id, key, c->dims[i].value ? c->dims[i].value : ""));
    }
    PP_TRY(add_list(id, "split.before", c->n_split_before, c->split_before));
    if (c->split_marker_identity) PP_TRY(add_text(id, "split.marker_identity", c->split_marker_identity));
    PP_TRY(add_list(id, "split.after", c->n_split_after, c->split_after));
    PP_TRY(add_bool(id, "split.transmit_shared", c->transmit_shared));
    PP_TRY(add_int(id, "split.auto", c->split_auto));
    PP_TRY(add_int(id, "split.memory_cap", (long long)c->split_memory_cap));
    PP_TRY(add_list(id, "freeze", c->n_freeze, c->freeze));
    for (int i = 0; i < c->n_data; i++) {
        snprintf(key, sizeof key, "data.%s", c->data[i].key);
        PP_TRY(add_file(id, key, c->data[i].value));
    }
    if (c->text_file) {
        PP_TRY(add_file(id, "text.file", c->text_file));
        if (c->text_vocab) PP_TRY(add_file(id, "text.vocab", c->text_vocab));
        PP_TRY(add_int(id, "text.seq", c->text_seq));
    }
    PP_TRY(add_int(id, "n_ranks", c->n_ranks));
    PP_TRY(add_list(id, "ranks", c->n_ranks, c->ranks));
    PP_TRY(add_text(id, "security", c->n_secret_keys > 0 ? "curve" : "off"));
    if (c->run_id) PP_TRY(add_text(id, "run_id", c->run_id));
    PP_TRY(add_bool(id, "checkpoint", c->checkpoint_dir != NULL)); /* the directory itself is each rank's */
    PP_TRY(add_int(id, "checkpoint.every", (long long)c->checkpoint_every));
    if (c->model) PP_TRY(add_file(id, "model", c->model));
    if (c->stages) {
        size_t len = strlen(c->stages) + sizeof "/pipe.json";
        char *path = malloc(len);
        if (!path) return pp_error(PP_ERR_NOMEM, "out of memory");
        snprintf(path, len, "%s/pipe.json", c->stages);
        pp_status s = add_file(id, "stages/pipe.json", path);
        free(path);
        PP_TRY(s);
    }
    return PP_OK;
}

/* 1 if the pipe lists name as shared and stage among its holders. */
static int listed_shared(const pp_pipe *p, const char *name, int stage) {
    for (int i = 0; p && i < p->n_shared; i++) {
        if (strcmp(p->shared[i].name, name) != 0) continue;
        for (int k = 0; k < p->shared[i].n_stages; k++)
            if (p->shared[i].stages[k] == stage) return 1;
    }
    return 0;
}

/* dtype, shape and bytes of an initializer. */
static uint64_t hash_tensor(const pp_tensor *t) {
    uint8_t head[8 * (2 + PP_MAX_DIMS)];
    size_t n = 0;
    uint64_t w[2 + PP_MAX_DIMS];
    w[0] = (uint64_t)t->dtype;
    w[1] = (uint64_t)t->ndim;
    for (int d = 0; d < t->ndim && d < PP_MAX_DIMS; d++) w[2 + d] = (uint64_t)t->shape[d];
    int words = 2 + (t->ndim < PP_MAX_DIMS ? t->ndim : PP_MAX_DIMS);
    for (int i = 0; i < words; i++)
        for (int b = 0; b < 8; b++) head[n++] = (uint8_t)(w[i] >> (8 * b));
    uint64_t h = pp_hash64(PP_HASH64_SEED, head, n);
    if (t->nbytes && t->data) h = pp_hash64(h, t->data, t->nbytes);
    return h;
}

static pp_status add_graph(pp_run_identity *id, const pp_pipe *p, const pp_graph *g, int stage) {
    char key[PP_RUN_IDENTITY_MAX_KEY + 2];
    for (int v = 0; v < g->n_values; v++) {
        const pp_value *val = &g->values[v];
        if (!val->data || val->producer >= 0) continue;
        if (val->kind != PP_VALUE_PARAM && val->kind != PP_VALUE_CONST) continue;
        if (!strncmp(val->name, "autodiff/", 9)) continue; /* per graph */
        int param = val->kind == PP_VALUE_PARAM;
        if ((size_t)snprintf(key, sizeof key, "%s%s", param ? "param." : "const.", val->name) >= sizeof key - 1)
            return pp_error(PP_ERR_UNSUPPORTED, "run identity: stage %d: initializer name '%.60s...' is too long",
                            stage, val->name);
        int flags = param && listed_shared(p, val->name, stage) ? PP_RUN_IDENTITY_SHARED : 0;
        PP_TRY(add(id, param ? PP_RUN_IDENTITY_PARAM : PP_RUN_IDENTITY_CONST, flags, stage, key, hash_tensor(val->data), ""));
    }
    return PP_OK;
}

static int cmp_key_stage(const void *a, const void *b) {
    const pp_run_identity_entry *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c) return c;
    return (x->stage > y->stage) - (x->stage < y->stage);
}

static void entry_clear(pp_run_identity_entry *e) {
    free(e->key);
    free(e->detail);
}

static const char *entry_name(const pp_run_identity_entry *e) {
    const char *dot = strchr(e->key, '.');
    return dot && !is_common(e->kind) ? dot + 1 : e->key;
}

/* Two copies of one initializer held by this rank (a < b in stage order). */
static pp_status check_local_pair(const pp_run_identity_entry *a, const pp_run_identity_entry *b) {
    const char *name = entry_name(a);
    if (a->kind == PP_RUN_IDENTITY_PARAM && b->kind == PP_RUN_IDENTITY_PARAM &&
        (!(a->flags & PP_RUN_IDENTITY_SHARED) || !(b->flags & PP_RUN_IDENTITY_SHARED)))
        return pp_error(PP_ERR_INVALID,
                        "parameter '%s' is in stage %d and stage %d, but the pipe does not list it as shared "
                        "(is pipe.json missing its shared_parameters?): each copy would be trained on its own",
                        name, a->stage, b->stage);
    if (a->hash != b->hash)
        return pp_error(PP_ERR_INVALID, "stage %d's copy of '%s' differs from stage %d's: the stage files do not agree",
                        b->stage, name, a->stage);
    return PP_OK;
}

/* Sorts entries [from, n) by key and stage, checks each name's local copies
 * and keeps the first (lowest stage). */
static pp_status merge_local(pp_run_identity *id, int from) {
    int n = id->n - from;
    if (n <= 1) return PP_OK;
    pp_run_identity_entry *e = id->e + from;
    qsort(e, (size_t)n, sizeof *e, cmp_key_stage);
    int out = 0;
    pp_status s = PP_OK;
    for (int i = 0; i < n; i++) {
        if (out > 0 && strcmp(e[out - 1].key, e[i].key) == 0) {
            if (s == PP_OK) s = check_local_pair(&e[out - 1], &e[i]);
            entry_clear(&e[i]);
            continue;
        }
        e[out++] = e[i];
    }
    id->n = from + out;
    return s;
}

pp_status pp_run_identity_compute_graphs(const pp_config *c, const pp_pipe *p, int n,
                                         const pp_graph *const *graphs, const int *stage_index,
                                         pp_run_identity **out) {
    *out = NULL;
    if (!c) return pp_error(PP_ERR_INVALID, "run identity: no config");
    if (n < 0 || (n > 0 && (!graphs || !stage_index))) return pp_error(PP_ERR_INVALID, "run identity: no stage graphs");
    pp_run_identity *id = calloc(1, sizeof *id);
    if (!id) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status s = add_config(id, c);
    int from = id->n;
    for (int i = 0; s == PP_OK && i < n; i++)
        if (graphs[i]) s = add_graph(id, p, graphs[i], stage_index[i]);
    if (s == PP_OK) s = merge_local(id, from);
    if (s == PP_OK) { /* config keys are distinct unless the config repeats one */
        for (int i = 0; i < from && s == PP_OK; i++)
            for (int j = i + 1; j < from && s == PP_OK; j++)
                if (strcmp(id->e[i].key, id->e[j].key) == 0)
                    s = pp_error(PP_ERR_INVALID, "run identity: the config gives '%s' twice", id->e[i].key);
    }
    if (s != PP_OK) {
        pp_run_identity_free(id);
        return s;
    }
    *out = id;
    return PP_OK;
}

pp_status pp_run_identity_compute(const pp_config *c, const pp_pipe *p, int n_stages, pp_stage *const *stages,
                                  pp_run_identity **out) {
    *out = NULL;
    if (n_stages < 0 || (n_stages > 0 && !stages)) return pp_error(PP_ERR_INVALID, "run identity: no stages");
    const pp_graph **g = calloc((size_t)n_stages + 1, sizeof *g);
    int *index = calloc((size_t)n_stages + 1, sizeof *index);
    pp_status s = g && index ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; s == PP_OK && i < n_stages; i++) {
        g[i] = pp_stage_graph(stages[i]);
        index[i] = pp_stage_index(stages[i]);
    }
    if (s == PP_OK) s = pp_run_identity_compute_graphs(c, p, n_stages, g, index, out);
    free(g);
    free(index);
    return s;
}

void pp_run_identity_free(pp_run_identity *id) {
    if (!id) return;
    for (int i = 0; i < id->n; i++) entry_clear(&id->e[i]);
    free(id->e);
    free(id);
}

int pp_run_identity_count(const pp_run_identity *id) { return id ? id->n : 0; }

const pp_run_identity_entry *pp_run_identity_entry_at(const pp_run_identity *id, int i) {
    return id && i >= 0 && i < id->n ? &id->e[i] : NULL;
}

const pp_run_identity_entry *pp_run_identity_find(const pp_run_identity *id, const char *key) {
    for (int i = 0; id && i < id->n; i++)
        if (strcmp(id->e[i].key, key) == 0) return &id->e[i];
    return NULL;
}

/* ---- wire form ---- */

static void put16(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int b = 0; b < 4; b++) p[b] = (uint8_t)(v >> (8 * b));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int b = 0; b < 8; b++) p[b] = (uint8_t)(v >> (8 * b));
}
static uint32_t get16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int b = 3; b >= 0; b--) v = v << 8 | p[b];
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--) v = v << 8 | p[b];
    return v;
}

pp_status pp_run_identity_encode(const pp_run_identity *id, uint8_t **bytes, size_t *n) {
    *bytes = NULL;
    *n = 0;
    size_t total = 12;
    for (int i = 0; i < id->n; i++) {
        size_t kl = strlen(id->e[i].key), dl = strlen(id->e[i].detail);
        if (kl == 0 || kl > PP_RUN_IDENTITY_MAX_KEY || dl > PP_RUN_IDENTITY_MAX_DETAIL)
            return pp_error(PP_ERR_INVALID, "run identity: entry %d's key or detail is out of bounds", i);
        total += ENTRY_HEADER + kl + dl;
    }
    if (total > PP_RUN_IDENTITY_MAX_BYTES)
        return pp_error(PP_ERR_UNSUPPORTED, "run identity: %zu bytes encoded (at most %zu)", total,
                        PP_RUN_IDENTITY_MAX_BYTES);
    uint8_t *b = malloc(total), *p = b;
    if (!b) return pp_error(PP_ERR_NOMEM, "out of memory");
    memcpy(p, MAGIC, 4);
    p[4] = VERSION;
    p[5] = p[6] = p[7] = 0;
    put32(p + 8, (uint32_t)id->n);
    p += 12;
    for (int i = 0; i < id->n; i++) {
        const pp_run_identity_entry *e = &id->e[i];
        size_t kl = strlen(e->key), dl = strlen(e->detail);
        p[0] = e->kind;
        p[1] = e->flags;
        put16(p + 2, (uint32_t)kl);
        put16(p + 4, (uint32_t)dl);
        put32(p + 6, (uint32_t)e->stage);
        put64(p + 10, e->hash);
        p += ENTRY_HEADER;
        memcpy(p, e->key, kl);
        p += kl;
        memcpy(p, e->detail, dl);
        p += dl;
    }
    *bytes = b;
    *n = total;
    return PP_OK;
}

static char *dup_n(const uint8_t *p, size_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

static int cmp_key_ptr(const void *a, const void *b) {
    const pp_run_identity_entry *const *x = a, *const *y = b;
    return strcmp((*x)->key, (*y)->key);
}

/* Entries sorted by key (pointers into id); NULL when out of memory. */
static const pp_run_identity_entry **sorted_index(const pp_run_identity *id) {
    const pp_run_identity_entry **ix = malloc(((size_t)id->n + 1) * sizeof *ix);
    if (!ix) return NULL;
    for (int i = 0; i < id->n; i++) ix[i] = &id->e[i];
    qsort(ix, (size_t)id->n, sizeof *ix, cmp_key_ptr);
    return ix;
}

static pp_status decode_entries(const uint8_t *bytes, size_t n, pp_run_identity *id) {
    if (n < 12) return pp_error(PP_ERR_PARSE, "run identity: %zu bytes, shorter than its 12-byte header", n);
    if (n > PP_RUN_IDENTITY_MAX_BYTES)
        return pp_error(PP_ERR_PARSE, "run identity: %zu bytes (at most %zu)", n, PP_RUN_IDENTITY_MAX_BYTES);
    if (memcmp(bytes, MAGIC, 4) != 0) return pp_error(PP_ERR_PARSE, "run identity: bad magic (not a run identity)");
    if (bytes[4] != VERSION) return pp_error(PP_ERR_PARSE, "run identity: version %u (this build reads %d)", bytes[4], VERSION);
    if (bytes[5] || bytes[6] || bytes[7]) return pp_error(PP_ERR_PARSE, "run identity: reserved header bytes are set");
    uint32_t count = get32(bytes + 8);
    if (count > PP_RUN_IDENTITY_MAX_ENTRIES || (uint64_t)count * ENTRY_HEADER > n - 12)
        return pp_error(PP_ERR_PARSE, "run identity: %u entries do not fit in %zu bytes", count, n);
    id->e = calloc((size_t)count + 1, sizeof *id->e);
    if (!id->e) return pp_error(PP_ERR_NOMEM, "out of memory");
    id->cap = (int)count + 1;
    size_t at = 12;
    for (uint32_t i = 0; i < count; i++) {
        if (n - at < ENTRY_HEADER) return pp_error(PP_ERR_PARSE, "run identity: entry %u is cut off at byte %zu", i, at);
        const uint8_t *h = bytes + at;
        uint32_t kind = h[0], flags = h[1], kl = get16(h + 2), dl = get16(h + 4);
        int32_t stage = (int32_t)get32(h + 6);
        at += ENTRY_HEADER;
        if (kind > PP_RUN_IDENTITY_CONST) return pp_error(PP_ERR_PARSE, "run identity: entry %u has kind %u", i, kind);
        if (flags & ~(uint32_t)PP_RUN_IDENTITY_SHARED)
            return pp_error(PP_ERR_PARSE, "run identity: entry %u has unknown flags 0x%x", i, flags);
        if (kl == 0 || kl > PP_RUN_IDENTITY_MAX_KEY || dl > PP_RUN_IDENTITY_MAX_DETAIL)
            return pp_error(PP_ERR_PARSE, "run identity: entry %u's key (%u bytes) or detail (%u) is out of bounds", i,
                            kl, dl);
        if (stage < -1) return pp_error(PP_ERR_PARSE, "run identity: entry %u has stage %d", i, (int)stage);
        if (n - at < (size_t)kl + dl)
            return pp_error(PP_ERR_PARSE, "run identity: entry %u is cut off at byte %zu", i, at);
        if (!clean_text((const char *)bytes + at, kl) || !clean_text((const char *)bytes + at + kl, dl))
            return pp_error(PP_ERR_PARSE, "run identity: entry %u has a control character", i);
        if (memchr(bytes + at, 0, kl) || memchr(bytes + at + kl, 0, dl))
            return pp_error(PP_ERR_PARSE, "run identity: entry %u has a NUL byte", i);
        pp_run_identity_entry *e = &id->e[id->n];
        e->key = dup_n(bytes + at, kl);
        e->detail = dup_n(bytes + at + kl, dl);
        id->n++;
        if (!e->key || !e->detail) return pp_error(PP_ERR_NOMEM, "out of memory");
        e->kind = (uint8_t)kind;
        e->flags = (uint8_t)flags;
        e->stage = stage;
        e->hash = get64(h + 10);
        at += (size_t)kl + dl;
    }
    if (at != n) return pp_error(PP_ERR_PARSE, "run identity: %zu bytes left over after %u entries", n - at, count);
    const pp_run_identity_entry **ix = sorted_index(id);
    if (!ix) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status s = PP_OK;
    for (int i = 1; i < id->n && s == PP_OK; i++)
        if (strcmp(ix[i - 1]->key, ix[i]->key) == 0)
            s = pp_error(PP_ERR_PARSE, "run identity: key '%s' appears twice", ix[i]->key);
    free(ix);
    return s;
}

pp_status pp_run_identity_decode(const uint8_t *bytes, size_t n, pp_run_identity **out) {
    *out = NULL;
    if (!bytes && n) return pp_error(PP_ERR_INVALID, "run identity: no bytes");
    pp_run_identity *id = calloc(1, sizeof *id);
    if (!id) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status s = decode_entries(bytes, n, id);
    if (s != PP_OK) {
        pp_run_identity_free(id);
        return s;
    }
    *out = id;
    return PP_OK;
}

/* ---- comparing ---- */

static const pp_run_identity_entry *lookup(const pp_run_identity_entry **ix, int n, const char *key) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(ix[mid]->key, key);
        if (c == 0) return ix[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

static const char *kind_what(int kind) {
    return kind == PP_RUN_IDENTITY_FILE ? "the ranks' files do not agree" : "the ranks' configs do not agree";
}

/* a (rank ra, mine) and b (rank rb, theirs) have the same key. */
static pp_status compare_pair(const pp_run_identity_entry *a, int ra, const pp_run_identity_entry *b, int rb) {
    if (is_common(a->kind) || is_common(b->kind)) {
        if (a->kind == b->kind && a->hash == b->hash) return PP_OK;
        if (a->kind == PP_RUN_IDENTITY_FILE && b->kind == PP_RUN_IDENTITY_FILE) {
            if (strcmp(a->detail, b->detail) == 0)
                return pp_error(PP_ERR_INVALID, "rank %d's %s differs from rank %d's: the file %s differs between them",
                                rb, a->key, ra, a->detail);
            return pp_error(PP_ERR_INVALID, "rank %d's %s differs from rank %d's: the file %s differs from %s", rb, a->key,
                            ra, b->detail, a->detail);
        }
        return pp_error(PP_ERR_INVALID, "rank %d's %s (%s) differs from rank %d's (%s): %s", rb, a->key, b->detail, ra,
                        a->detail, kind_what(a->kind));
    }
    const char *name = entry_name(a);
    if (a->kind == PP_RUN_IDENTITY_PARAM && b->kind == PP_RUN_IDENTITY_PARAM && a->stage != b->stage &&
        (!(a->flags & PP_RUN_IDENTITY_SHARED) || !(b->flags & PP_RUN_IDENTITY_SHARED)))
        return pp_error(PP_ERR_INVALID,
                        "parameter '%s' is in rank %d's stage %d and rank %d's stage %d, but the pipe does not list it "
                        "as shared (is pipe.json missing its shared_parameters?): each copy would be trained on its own",
                        name, rb, (int)b->stage, ra, (int)a->stage);
    if (a->hash == b->hash) return PP_OK;
    if (a->kind == PP_RUN_IDENTITY_PARAM && b->kind == PP_RUN_IDENTITY_PARAM)
        return pp_error(PP_ERR_INVALID,
                        "rank %d's copy of shared parameter '%s' (stage %d) differs from rank %d's (stage %d): the "
                        "stage files do not agree",
                        rb, name, (int)b->stage, ra, (int)a->stage);
    return pp_error(PP_ERR_INVALID,
                    "rank %d's copy of initializer '%s' (stage %d) differs from rank %d's (stage %d): the stage files "
                    "do not agree",
                    rb, name, (int)b->stage, ra, (int)a->stage);
}

pp_status pp_run_identity_compare(const pp_run_identity *mine, int my_rank, const pp_run_identity *theirs,
                                  int their_rank) {
    const pp_run_identity_entry **tix = sorted_index(theirs), **mix = sorted_index(mine);
    pp_status s = tix && mix ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; s == PP_OK && i < mine->n; i++) {
        const pp_run_identity_entry *a = &mine->e[i], *b = lookup(tix, theirs->n, a->key);
        if (b) s = compare_pair(a, my_rank, b, their_rank);
        else if (is_common(a->kind))
            s = pp_error(PP_ERR_INVALID, "rank %d has %s (%s) and rank %d has none: %s", my_rank, a->key, a->detail,
                         their_rank, kind_what(a->kind));
    }
    for (int i = 0; s == PP_OK && i < theirs->n; i++) {
        const pp_run_identity_entry *b = &theirs->e[i];
        if (is_common(b->kind) && !lookup(mix, mine->n, b->key))
            s = pp_error(PP_ERR_INVALID, "rank %d has %s (%s) and rank %d has none: %s", their_rank, b->key, b->detail,
                         my_rank, kind_what(b->kind));
    }
    free(tix);
    free(mix);
    return s;
}

uint64_t pp_run_identity_digest(const pp_run_identity *id) {
    const pp_run_identity_entry **ix = sorted_index(id);
    uint64_t h = PP_HASH64_SEED;
    for (int i = 0; i < id->n; i++) {
        const pp_run_identity_entry *e = ix ? ix[i] : &id->e[i]; /* out of memory: in list order */
        if (!is_common(e->kind)) continue;
        uint8_t w[9];
        w[0] = e->kind;
        put64(w + 1, e->hash);
        h = pp_hash64(h, e->key, strlen(e->key));
        h = pp_hash64(h, w, sizeof w);
    }
    free(ix);
    return h;
}

pp_status pp_run_identity_check_peer(void *user, int rank, const uint8_t *bytes, size_t n) {
    const pp_run_identity_peer *me = user;
    pp_run_identity *theirs;
    pp_status s = pp_run_identity_decode(bytes, n, &theirs);
    if (s != PP_OK) return pp_error_context(PP_ERR_INVALID, "rank %d's run identity", rank);
    s = pp_run_identity_compare(me->mine, me->my_rank, theirs, rank);
    pp_run_identity_free(theirs);
    return s;
}

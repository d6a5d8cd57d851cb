/* Pipeline configuration files: YAML loaded with libyaml's document API, then
 * walked against a fixed schema. Every error names the file, the 1-based
 * line and the dotted key path (lists as key[i]). YAML syntax errors and
 * structural mistakes (unknown or duplicate keys, wrong types) are
 * PP_ERR_PARSE; well-typed values that are out of range or inconsistent are
 * PP_ERR_INVALID. */
#include "pippin/config.h"
#include "pippin/device.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "file_io.h"
#include "pippin/schedule.h"

#include "status_internal.h"
#define CFG_MAX_BYTES (1u << 20) /* the file */
#define CFG_MAX_RANKS 4096
#define CFG_MAX_ITEMS 4096       /* entries of any list or mapping */
#define CFG_MAX_STR 4096         /* bytes of any string value or key */
#define CFG_MAX_DEPTH 32         /* nested lists and mappings */
#define CFG_MAX_RUN_ID 256       /* bytes of run_id */

typedef struct cx {
    const char *file;
    const char *dir;
    yaml_document_t *doc;
    pp_config *c;
} cx;

/* ------------------------------------------------------------ messages */

static int line_of(const yaml_node_t *n) { return (int)n->start_mark.line + 1; }

static const char *sval(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static int is_null(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *s = sval(n);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
           !strcmp(s, "NULL");
}

/* What a node is, for "got ...": a short quote of a scalar, else its kind. */
static void describe(const yaml_node_t *n, char *buf, size_t sz) {
    if (n->type == YAML_SEQUENCE_NODE) snprintf(buf, sz, "a list");
    else if (n->type == YAML_MAPPING_NODE) snprintf(buf, sz, "a mapping");
    else if (is_null(n)) snprintf(buf, sz, "null");
    else {
        size_t len = strnlen(sval(n), n->data.scalar.length);
        snprintf(buf, sz, "'%.*s%s'", len > 60 ? 60 : (int)len, sval(n), len > 60 ? "..." : "");
    }
}

static pp_status err_at(const cx *x, pp_status code, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static pp_status err_at(const cx *x, pp_status code, const yaml_node_t *n, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pp_error(code, "%s:%d: %s", x->file, line_of(n), msg);
}

static pp_status type_err(const cx *x, const yaml_node_t *n, const char *key, const char *want) {
    char got[96];
    describe(n, got, sizeof got);
    return err_at(x, PP_ERR_PARSE, n, "key '%s': expected %s, got %s", key, want, got);
}

/* prefix.key (or key[i] with i >= 0), truncated to fit. */
static void key_path(char *buf, size_t sz, const char *prefix, const char *key, int idx) {
    int n;
    if (prefix && *prefix) n = snprintf(buf, sz, "%s.%.*s", prefix, 200, key);
    else n = snprintf(buf, sz, "%.*s", 200, key);
    if (idx >= 0 && n >= 0 && (size_t)n < sz) snprintf(buf + n, sz - (size_t)n, "[%d]", idx);
}

/* ------------------------------------------------------------ scalars */

static yaml_node_t *node(const cx *x, int id) { return yaml_document_get_node(x->doc, id); }

/* A scalar's text, checked: no NUL bytes, not too long. */
static pp_status scalar_text(const cx *x, const yaml_node_t *n, const char *key, const char *want,
                             const char **out) {
    if (n->type != YAML_SCALAR_NODE || is_null(n)) return type_err(x, n, key, want);
    if (strlen(sval(n)) != n->data.scalar.length)
        return err_at(x, PP_ERR_PARSE, n, "key '%s': value contains a NUL byte", key);
    if (n->data.scalar.length > CFG_MAX_STR)
        return err_at(x, PP_ERR_PARSE, n, "key '%s': value longer than %d bytes", key, CFG_MAX_STR);
    *out = sval(n);
    return PP_OK;
}

static pp_status get_str(const cx *x, const yaml_node_t *n, const char *key, char **out) {
    const char *s;
    PP_TRY(scalar_text(x, n, key, "a string", &s));
    if (!*s) return err_at(x, PP_ERR_INVALID, n, "key '%s': must not be empty", key);
    if (!(*out = strdup(s))) return pp_error(PP_ERR_NOMEM, "%s: out of memory", x->file);
    return PP_OK;
}

/* p against dir unless absolute (or dir is "."). */
static char *resolve(const char *dir, const char *p) {
    if (p[0] == '/' || !dir || !*dir || !strcmp(dir, ".")) return strdup(p);
    size_t d = strlen(dir), l = strlen(p);
    int slash = dir[d - 1] != '/';
    char *r = malloc(d + (size_t)slash + l + 1);
    if (!r) return NULL;
    memcpy(r, dir, d);
    if (slash) r[d] = '/';
    memcpy(r + d + slash, p, l + 1);
    return r;
}

static pp_status get_path(const cx *x, const yaml_node_t *n, const char *key, char **out) {
    const char *s;
    PP_TRY(scalar_text(x, n, key, "a path", &s));
    if (!*s) return err_at(x, PP_ERR_INVALID, n, "key '%s': must not be empty", key);
    if (!(*out = resolve(x->dir, s))) return pp_error(PP_ERR_NOMEM, "%s: out of memory", x->file);
    return PP_OK;
}

static pp_status get_int(const cx *x, const yaml_node_t *n, const char *key, int64_t lo, int64_t hi,
                         int64_t *out) {
    const char *s;
    PP_TRY(scalar_text(x, n, key, "an integer", &s));
    if (!((s[0] >= '0' && s[0] <= '9') || ((s[0] == '-' || s[0] == '+') && s[1] >= '0' && s[1] <= '9')))
        return type_err(x, n, key, "an integer");
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end) return type_err(x, n, key, "an integer");
    if (errno == ERANGE || v < lo || v > hi) {
        /* strtoll clamps an underflow to LLONG_MIN: that too is below lo. */
        if (v < lo || (errno == ERANGE && v == LLONG_MIN))
            return err_at(x, PP_ERR_INVALID, n, "key '%s': must be at least %lld, got '%.40s'", key,
                          (long long)lo, s);
        return err_at(x, PP_ERR_INVALID, n, "key '%s': must be at most %lld, got '%.40s'", key,
                      (long long)hi, s);
    }
    *out = v;
    return PP_OK;
}

static pp_status get_int32(const cx *x, const yaml_node_t *n, const char *key, int lo, int hi, int *out) {
    int64_t v;
    PP_TRY(get_int(x, n, key, lo, hi, &v));
    *out = (int)v;
    return PP_OK;
}

/* A finite number >= lo, and < 1 where below_one. */
static pp_status get_num(const cx *x, const yaml_node_t *n, const char *key, double lo, int below_one,
                         double *out) {
    const char *s;
    PP_TRY(scalar_text(x, n, key, "a number", &s));
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* strtod skips blanks and reads "inf", "nan", hex: only plain decimals. */
    int ok = *s && *end == '\0' && !strchr(" \t\n\r\f\v", s[0]) && isfinite(v);
    for (const char *p = s; ok && *p; p++)
        if (!strchr("0123456789+-.eE", *p)) ok = 0;
    if (!ok) return type_err(x, n, key, "a number");
    if (!(v >= lo) || (below_one && !(v < 1)))
        return err_at(x, PP_ERR_INVALID, n, "key '%s': must be %s%g%s, got '%s'", key,
                      below_one ? "in [" : "at least ", lo, below_one ? ", 1)" : "", s);
    *out = v;
    return PP_OK;
}

static pp_status get_bool(const cx *x, const yaml_node_t *n, const char *key, int *out) {
    const char *s;
    PP_TRY(scalar_text(x, n, key, "true or false", &s));
    if (!strcasecmp(s, "true") || !strcasecmp(s, "yes")) *out = 1;
    else if (!strcasecmp(s, "false") || !strcasecmp(s, "no")) *out = 0;
    else return type_err(x, n, key, "true or false");
    return PP_OK;
}

/* ------------------------------------------------------------ mappings and lists */

static pp_status want_map(const cx *x, const yaml_node_t *n, const char *key) {
    if (n->type != YAML_MAPPING_NODE) return type_err(x, n, key, "a mapping");
    if (n->data.mapping.pairs.top - n->data.mapping.pairs.start > CFG_MAX_ITEMS)
        return err_at(x, PP_ERR_INVALID, n, "key '%s': more than %d entries", key, CFG_MAX_ITEMS);
    return PP_OK;
}

/* Checks the key of pair p of mapping m: a plain name, not seen earlier in
 * m. prefix names the mapping ("" for the top level). */
static pp_status check_key(const cx *x, const yaml_node_t *m, const yaml_node_pair_t *p, const char *prefix) {
    yaml_node_t *k = node(x, p->key);
    if (k->type != YAML_SCALAR_NODE || is_null(k) || strlen(sval(k)) != k->data.scalar.length ||
        k->data.scalar.length > 256) {
        char got[96];
        describe(k, got, sizeof got);
        if (*prefix) return err_at(x, PP_ERR_PARSE, k, "key '%s': expected a name as key, got %s", prefix, got);
        return err_at(x, PP_ERR_PARSE, k, "expected a name as key, got %s", got);
    }
    for (const yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++) {
        yaml_node_t *k0 = node(x, q->key);
        if (!strcmp(sval(k0), sval(k))) {
            char path[512];
            key_path(path, sizeof path, prefix, sval(k), -1);
            return err_at(x, PP_ERR_PARSE, k, "duplicate key '%s' (first at line %d)", path, line_of(k0));
        }
    }
    return PP_OK;
}

/* Matches a mapping's keys against known[0..n): vals[i] gets the value of
 * known[i] or NULL. Unknown keys are errors listing the known ones. */
static pp_status match_keys(const cx *x, const yaml_node_t *m, const char *prefix,
                            const char *const *known, int n, yaml_node_t **vals) {
    PP_TRY(want_map(x, m, *prefix ? prefix : "(top level)"));
    for (int i = 0; i < n; i++) vals[i] = NULL;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        PP_TRY(check_key(x, m, p, prefix));
        yaml_node_t *k = node(x, p->key);
        int i = 0;
        while (i < n && strcmp(known[i], sval(k))) i++;
        if (i == n) {
            char path[512], list[512];
            size_t len = 0;
            list[0] = '\0';
            for (int j = 0; j < n && len < sizeof list; j++)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", j ? ", " : "", known[j]);
            key_path(path, sizeof path, prefix, sval(k), -1);
            return err_at(x, PP_ERR_PARSE, k, "unknown key '%s' (expected one of %s)", path, list);
        }
        vals[i] = node(x, p->value);
    }
    return PP_OK;
}

/* A list of strings (paths where resolve_paths) into a fresh array owned by
 * *out / *count from the start, so pp_config_free can clean up halfway. */
static pp_status get_str_list(const cx *x, const yaml_node_t *n, const char *key, int resolve_paths,
                              int max, char ***out, int *count) {
    if (n->type != YAML_SEQUENCE_NODE) return type_err(x, n, key, "a list");
    ptrdiff_t len = n->data.sequence.items.top - n->data.sequence.items.start;
    if (len > max) return err_at(x, PP_ERR_INVALID, n, "key '%s': more than %d entries", key, max);
    if (!(*out = calloc((size_t)len + 1, sizeof **out))) return pp_error(PP_ERR_NOMEM, "%s: out of memory", x->file);
    *count = (int)len;
    char path[512];
    for (int i = 0; i < (int)len; i++) {
        yaml_node_t *e = node(x, n->data.sequence.items.start[i]);
        key_path(path, sizeof path, "", key, i);
        if (e->type != YAML_SCALAR_NODE || is_null(e))
            return type_err(x, e, path, resolve_paths ? "a path" : "a string");
        PP_TRY(resolve_paths ? get_path(x, e, path, &(*out)[i]) : get_str(x, e, path, &(*out)[i]));
    }
    return PP_OK;
}

/* A mapping of names to values, one entry per pair (dims, data). */
static pp_status get_entries(const cx *x, const yaml_node_t *m, const char *key, pp_config_entry **out,
                             int *count, pp_status (*value)(const cx *, const yaml_node_t *, const char *, char **)) {
    PP_TRY(want_map(x, m, key));
    ptrdiff_t len = m->data.mapping.pairs.top - m->data.mapping.pairs.start;
    if (!(*out = calloc((size_t)len + 1, sizeof **out))) return pp_error(PP_ERR_NOMEM, "%s: out of memory", x->file);
    *count = (int)len;
    char path[512];
    for (int i = 0; i < (int)len; i++) {
        yaml_node_pair_t *p = &m->data.mapping.pairs.start[i];
        PP_TRY(check_key(x, m, p, key));
        yaml_node_t *k = node(x, p->key), *v = node(x, p->value);
        key_path(path, sizeof path, key, sval(k), -1);
        if (!((*out)[i].key = strdup(sval(k)))) return pp_error(PP_ERR_NOMEM, "%s: out of memory", x->file);
        PP_TRY(value(x, v, path, &(*out)[i].value));
    }
    return PP_OK;
}

static pp_status dim_value(const cx *x, const yaml_node_t *n, const char *key, char **out) {
    int64_t v;
    PP_TRY(get_int(x, n, key, 1, INT64_MAX, &v));
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    if (!(*out = strdup(buf))) return pp_error(PP_ERR_NOMEM, "%s: out of memory", x->file);
    return PP_OK;
}

static pp_status str_value(const cx *x, const yaml_node_t *n, const char *key, char **out) {
    return get_str(x, n, key, out);
}

/* ------------------------------------------------------------ sections */

/* Given: present and not null (a null value means "use the default"). */
static int given(const yaml_node_t *n) { return n && !is_null(n); }

static pp_status parse_split(const cx *x, const yaml_node_t *m) {
    static const char *const keys[] = {"before", "after", "transmit_shared", "auto", "memory_cap", "marker_identity"};
    yaml_node_t *v[6];
    pp_config *c = x->c;
    PP_TRY(match_keys(x, m, "split", keys, 6, v));
    if (given(v[5]) && c->stages)
        return err_at(x, PP_ERR_INVALID, v[5], "key 'split.marker_identity': applies to 'model' (stage files are cut)");
    if (given(v[5])) PP_TRY(get_str(x, v[5], "split.marker_identity", &c->split_marker_identity));
    if (given(v[0])) PP_TRY(get_str_list(x, v[0], "split.before", 0, CFG_MAX_ITEMS, &c->split_before, &c->n_split_before));
    if (given(v[1])) PP_TRY(get_str_list(x, v[1], "split.after", 0, CFG_MAX_ITEMS, &c->split_after, &c->n_split_after));
    if (given(v[2])) PP_TRY(get_bool(x, v[2], "split.transmit_shared", &c->transmit_shared));
    /* balanced stages (stages/balance.c): the count, and a byte cap per stage */
    if (given(v[3])) PP_TRY(get_int32(x, v[3], "split.auto", 1, 1024, &c->split_auto));
    if (given(v[4])) PP_TRY(get_int(x, v[4], "split.memory_cap", 1, INT64_MAX, &c->split_memory_cap));
    if (given(v[4]) && !c->split_auto)
        return err_at(x, PP_ERR_INVALID, v[4], "key 'split.memory_cap': needs 'split.auto'");
    if (c->split_auto && c->n_split_before + c->n_split_after > 0)
        return err_at(x, PP_ERR_INVALID, v[3], "key 'split.auto': chooses every cut; no 'before' or 'after' with it");
    return PP_OK;
}

static pp_status parse_optimizer(const cx *x, const yaml_node_t *m) {
    enum { KIND, LR, WD, BETAS, EPS, MOMENTUM, DAMPENING, NESTEROV, NKEYS };
    static const char *const keys[] = {"kind", "lr", "weight_decay", "betas", "eps",
                                       "momentum", "dampening", "nesterov"};
    yaml_node_t *v[NKEYS];
    PP_TRY(match_keys(x, m, "optimizer", keys, NKEYS, v));
    pp_optim_kind kind = PP_OPTIM_ADAMW;
    if (given(v[KIND])) {
        const char *s;
        PP_TRY(scalar_text(x, v[KIND], "optimizer.kind", "sgd or adamw", &s));
        if (pp_optim_kind_parse(s, &kind) != PP_OK)
            return err_at(x, PP_ERR_INVALID, v[KIND], "key 'optimizer.kind': expected sgd or adamw, got '%.60s'", s);
    }
    pp_optim_config *o = &x->c->optim;
    pp_optim_config_init(o, kind);
    if (given(v[LR])) PP_TRY(get_num(x, v[LR], "optimizer.lr", 0, 0, &o->lr));
    if (given(v[WD])) PP_TRY(get_num(x, v[WD], "optimizer.weight_decay", 0, 0, &o->weight_decay));
    if (given(v[EPS])) PP_TRY(get_num(x, v[EPS], "optimizer.eps", 0, 0, &o->eps));
    if (given(v[MOMENTUM])) PP_TRY(get_num(x, v[MOMENTUM], "optimizer.momentum", 0, 0, &o->momentum));
    if (given(v[DAMPENING])) PP_TRY(get_num(x, v[DAMPENING], "optimizer.dampening", 0, 0, &o->dampening));
    if (given(v[NESTEROV])) PP_TRY(get_bool(x, v[NESTEROV], "optimizer.nesterov", &o->nesterov));
    if (given(v[BETAS])) {
        yaml_node_t *b = v[BETAS];
        if (b->type != YAML_SEQUENCE_NODE || b->data.sequence.items.top - b->data.sequence.items.start != 2)
            return b->type == YAML_SEQUENCE_NODE
                       ? err_at(x, PP_ERR_PARSE, b, "key 'optimizer.betas': expected a list of 2 numbers, got %d",
                                (int)(b->data.sequence.items.top - b->data.sequence.items.start))
                       : type_err(x, b, "optimizer.betas", "a list of 2 numbers");
        PP_TRY(get_num(x, node(x, b->data.sequence.items.start[0]), "optimizer.betas[0]", 0, 1, &o->beta1));
        PP_TRY(get_num(x, node(x, b->data.sequence.items.start[1]), "optimizer.betas[1]", 0, 1, &o->beta2));
    }
    if (kind == PP_OPTIM_SGD && o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return err_at(x, PP_ERR_INVALID, v[NESTEROV],
                      "key 'optimizer.nesterov': needs a momentum above 0 and dampening 0");
    return PP_OK;
}

static pp_status parse_text(const cx *x, const yaml_node_t *m) {
    static const char *const keys[] = {"file", "vocab", "seq"};
    yaml_node_t *v[3];
    pp_config *c = x->c;
    PP_TRY(match_keys(x, m, "text", keys, 3, v));
    if (!v[0]) return err_at(x, PP_ERR_PARSE, m, "missing key 'text.file'");
    if (!v[1]) return err_at(x, PP_ERR_PARSE, m, "missing key 'text.vocab'");
    PP_TRY(get_path(x, v[0], "text.file", &c->text_file));
    PP_TRY(get_path(x, v[1], "text.vocab", &c->text_vocab));
    if (given(v[2])) PP_TRY(get_int32(x, v[2], "text.seq", 0, INT_MAX, &c->text_seq));
    return PP_OK;
}

/* *client_keys: the serve.client_keys node, or NULL (checked against
 * security: once that is read). */
static pp_status parse_serve(const cx *x, const yaml_node_t *m, yaml_node_t **client_keys) {
    static const char *const keys[] = {"endpoint",     "max_batch",       "max_wait_us",       "max_queue",
                                       "max_inflight", "max_request_bytes", "max_sessions",    "session_idle_ms",
                                       "session_max_bytes", "state",       "vocab",             "context",
                                       "client_keys", "max_tokens"};
    yaml_node_t *v[14];
    pp_config *c = x->c;
    PP_TRY(match_keys(x, m, "serve", keys, 14, v));
    *client_keys = v[12];
    if (!given(v[0])) return v[0] ? type_err(x, v[0], "serve.endpoint", "an endpoint")
                                  : err_at(x, PP_ERR_PARSE, m, "missing key 'serve.endpoint'");
    PP_TRY(get_str(x, v[0], "serve.endpoint", &c->serve_endpoint));
    if (strncmp(c->serve_endpoint, "tcp://", 6) != 0 && strncmp(c->serve_endpoint, "ipc://", 6) != 0)
        return err_at(x, PP_ERR_INVALID, v[0], "key 'serve.endpoint': '%.80s' is not a tcp:// or ipc:// endpoint",
                      c->serve_endpoint);
    if (given(v[1])) PP_TRY(get_int32(x, v[1], "serve.max_batch", 1, 1 << 20, &c->serve_max_batch));
    if (given(v[2])) PP_TRY(get_int32(x, v[2], "serve.max_wait_us", 0, 60 * 1000 * 1000, &c->serve_max_wait_us));
    if (given(v[3])) PP_TRY(get_int32(x, v[3], "serve.max_queue", 1, 1 << 20, &c->serve_max_queue));
    if (given(v[4])) PP_TRY(get_int32(x, v[4], "serve.max_inflight", 0, 1 << 16, &c->serve_max_inflight));
    if (given(v[5]))
        PP_TRY(get_int(x, v[5], "serve.max_request_bytes", 1, (int64_t)1 << 40, &c->serve_max_request_bytes));
    if (given(v[6])) PP_TRY(get_int32(x, v[6], "serve.max_sessions", 1, 1 << 20, &c->serve_max_sessions));
    if (given(v[7])) PP_TRY(get_int32(x, v[7], "serve.session_idle_ms", 1, INT_MAX, &c->serve_session_idle_ms));
    if (given(v[8]))
        PP_TRY(get_int(x, v[8], "serve.session_max_bytes", 1, (int64_t)1 << 50, &c->serve_session_max_bytes));
    if (given(v[9])) PP_TRY(get_entries(x, v[9], "serve.state", &c->serve_state, &c->n_serve_state, str_value));
    if (given(v[10])) PP_TRY(get_path(x, v[10], "serve.vocab", &c->serve_vocab));
    if (given(v[11])) PP_TRY(get_int32(x, v[11], "serve.context", 0, INT_MAX, &c->serve_context));
    if (given(v[13])) PP_TRY(get_int32(x, v[13], "serve.max_tokens", 1, 1 << 20, &c->serve_max_tokens));
    if (v[12]) {
        if (!given(v[12])) return type_err(x, v[12], "serve.client_keys", "a list of paths");
        PP_TRY(get_str_list(x, v[12], "serve.client_keys", 1, CFG_MAX_ITEMS, &c->serve_client_keys,
                            &c->n_serve_client_keys));
    }
    return PP_OK;
}

static pp_status parse_security(const cx *x, const yaml_node_t *m, yaml_node_t **lists) {
    static const char *const keys[] = {"secret_keys", "public_keys"};
    pp_config *c = x->c;
    PP_TRY(match_keys(x, m, "security", keys, 2, lists));
    if (!lists[0]) return err_at(x, PP_ERR_PARSE, m, "missing key 'security.secret_keys'");
    if (!lists[1]) return err_at(x, PP_ERR_PARSE, m, "missing key 'security.public_keys'");
    PP_TRY(get_str_list(x, lists[0], "security.secret_keys", 1, CFG_MAX_RANKS, &c->secret_keys, &c->n_secret_keys));
    PP_TRY(get_str_list(x, lists[1], "security.public_keys", 1, CFG_MAX_RANKS, &c->public_keys, &c->n_public_keys));
    return PP_OK;
}

static pp_status parse_schedule(const cx *x, const yaml_node_t *n) {
    const char *s;
    PP_TRY(scalar_text(x, n, "schedule", "a schedule kind", &s));
    if (!strncmp(s, "csv:", 4)) {
        if (!s[4]) return err_at(x, PP_ERR_INVALID, n, "key 'schedule': csv: needs a file name");
        char *p = resolve(x->dir, s + 4);
        char *r = p ? malloc(strlen(p) + 5) : NULL;
        if (r) {
            memcpy(r, "csv:", 4);
            strcpy(r + 4, p);
        }
        free(p);
        if (!r) return pp_error(PP_ERR_NOMEM, "%s: out of memory", x->file);
        free(x->c->schedule);
        x->c->schedule = r;
        return PP_OK;
    }
    pp_sched_kind k;
    if (pp_sched_kind_parse(s, &k) != PP_OK) {
        char list[512];
        size_t len = 0;
        for (int i = 0; i < PP_SCHED_KIND_COUNT && len < sizeof list; i++)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s, ", pp_sched_kind_name((pp_sched_kind)i));
        return err_at(x, PP_ERR_INVALID, n, "key 'schedule': unknown schedule '%.60s' (%scsv:FILE)", s, list);
    }
    char *r = strdup(pp_sched_kind_name(k));
    if (!r) return pp_error(PP_ERR_NOMEM, "%s: out of memory", x->file);
    free(x->c->schedule);
    x->c->schedule = r;
    return PP_OK;
}

static pp_status parse_checkpoint(const cx *x, const yaml_node_t *m) {
    static const char *const keys[] = {"dir", "every", "keep"};
    yaml_node_t *v[3];
    pp_config *c = x->c;
    PP_TRY(match_keys(x, m, "checkpoint", keys, 3, v));
    if (!given(v[0]))
        return v[0] ? type_err(x, v[0], "checkpoint.dir", "a path")
                    : err_at(x, PP_ERR_PARSE, m, "missing key 'checkpoint.dir'");
    PP_TRY(get_path(x, v[0], "checkpoint.dir", &c->checkpoint_dir));
    if (given(v[1])) PP_TRY(get_int(x, v[1], "checkpoint.every", 0, INT64_MAX, &c->checkpoint_every));
    if (given(v[2])) PP_TRY(get_int32(x, v[2], "checkpoint.keep", 1, INT_MAX, &c->checkpoint_keep));
    return PP_OK;
}

static pp_status parse_buckets(const cx *x, const yaml_node_t *m) {
    static const char *const keys[] = {"first_bytes", "bytes", "direct_links"};
    yaml_node_t *v[3];
    pp_config *c = x->c;
    PP_TRY(match_keys(x, m, "gradient_buckets", keys, 3, v));
    if (given(v[0])) PP_TRY(get_int(x, v[0], "gradient_buckets.first_bytes", 4, INT64_MAX, &c->bucket_first_bytes));
    if (given(v[1])) PP_TRY(get_int(x, v[1], "gradient_buckets.bytes", 4, INT64_MAX, &c->bucket_bytes));
    if (given(v[2])) PP_TRY(get_bool(x, v[2], "gradient_buckets.direct_links", &c->bucket_direct_links));
    return PP_OK;
}

static pp_status parse_run_id(const cx *x, const yaml_node_t *n) {
    PP_TRY(get_str(x, n, "run_id", &x->c->run_id));
    size_t len = strlen(x->c->run_id);
    if (len > CFG_MAX_RUN_ID)
        return err_at(x, PP_ERR_INVALID, n, "key 'run_id': longer than %d bytes", CFG_MAX_RUN_ID);
    for (const unsigned char *p = (const unsigned char *)x->c->run_id; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return err_at(x, PP_ERR_INVALID, n, "key 'run_id': contains a control character");
    return PP_OK;
}

/* ------------------------------------------------------------ protected mode */

/* h[0..n) names this host only: localhost, 127.0.0.0/8 or ::1 (also as
 * ::ffff:127.x.y.z). Wildcards (*, 0.0.0.0, ::) and interface names do not. */
static int host_is_loopback(const char *h, size_t n) {
    char buf[64];
    if (n == 0 || n >= sizeof buf) return 0;
    memcpy(buf, h, n);
    buf[n] = '\0';
    if (!strcasecmp(buf, "localhost")) return 1;
    struct in_addr a4;
    if (inet_pton(AF_INET, buf, &a4) == 1) return ((const unsigned char *)&a4)[0] == 127;
    struct in6_addr a6;
    if (inet_pton(AF_INET6, buf, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return 0;
}

/* One address of a tcp endpoint, "host:port" or "[v6]:port". */
static int tcp_addr_is_loopback(const char *p, size_t n) {
    if (n && p[0] == '[') {
        const char *e = memchr(p, ']', n);
        return e && host_is_loopback(p + 1, (size_t)(e - p - 1));
    }
    size_t colon = n;
    while (colon > 0 && p[colon - 1] != ':') colon--;
    return host_is_loopback(p, colon ? colon - 1 : n);
}

/* 1: traffic never leaves this host (ipc, inproc, loopback tcp; a string
 * that is no endpoint at all is the transport's to refuse). 0: it may. */
static int endpoint_is_local(const char *ep) {
    if (!strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9) || !strstr(ep, "://")) return 1;
    if (strncmp(ep, "tcp://", 6)) return 0; /* tipc, vmci, ws, pgm, ...: a network */
    /* tcp://SOURCE;DEST names two addresses: both must be loopback. */
    for (const char *p = ep + 6;;) {
        const char *semi = strchr(p, ';');
        size_t n = semi ? (size_t)(semi - p) : strlen(p);
        if (!tcp_addr_is_loopback(p, n)) return 0;
        if (!semi) return 1;
        p = semi + 1;
    }
}

static pp_status check_endpoint(const cx *x, const yaml_node_t *n, const char *key, const char *ep) {
    if (endpoint_is_local(ep)) return PP_OK;
    return err_at(x, PP_ERR_INVALID, n,
                  "key '%s': endpoint '%.200s' is not loopback and the config has no 'security' (CURVE), "
                  "so anyone who can reach it could read or change the run; set 'insecure: true' to allow "
                  "unencrypted traffic, or configure 'security:' (pippin keygen)",
                  key, ep);
}

/* Like Redis's protected mode: without CURVE, only endpoints on this host
 * unless the config says insecure: true. */
static pp_status check_protected(const cx *x, const yaml_node_t *ranks, const yaml_node_t *bind) {
    const pp_config *c = x->c;
    if (c->insecure || c->n_secret_keys > 0) return PP_OK;
    char path[64];
    for (int i = 0; i < c->n_ranks; i++) {
        key_path(path, sizeof path, "", "ranks", i);
        PP_TRY(check_endpoint(x, node(x, ranks->data.sequence.items.start[i]), path, c->ranks[i]));
    }
    if (c->bind) PP_TRY(check_endpoint(x, bind, "bind", c->bind));
    return PP_OK;
}

enum {
    K_MODEL, K_SPLIT, K_DIMS, K_MODE, K_SCHEDULE, K_MICROBATCHES, K_BATCH, K_STEPS, K_LOSS,
    K_OPTIMIZER, K_DATA, K_TEXT, K_RANKS, K_BIND, K_TIMEOUT, K_SECURITY, K_OUTPUT, K_STAGES, K_SHM, K_FREEZE,
    K_CHECKPOINT, K_RUN_ID, K_INSECURE, K_REJOIN, K_SERVE, K_PARAMS, K_RECOMPUTE, K_REPLICAS, K_BUCKETS, K_SHARD,
    K_WIRE, K_THREADS, K_SHARE_CORES, K_DEVICE, K_STAGE_DEVICES, K_SPIN, K_BULK, K_COUNT
};
static const char *const top_keys[K_COUNT] = {
    "model", "split", "dims", "mode", "schedule", "microbatches", "batch_size", "steps", "loss",
    "optimizer", "data", "text", "ranks", "bind", "timeout_ms", "security", "output_dir", "stages",
    "shared_memory", "freeze", "checkpoint", "run_id", "insecure", "rejoin_timeout_ms", "serve", "params",
    "recompute", "replicas", "gradient_buckets", "shard_optimizer", "wire_dtype", "threads", "share_cores", "device",
    "stage_devices", "spin_us", "bulk_lanes"};

/* Checks each device spec of a list (key's entries) against pippin/device.h's forms. */
static pp_status check_devices(const cx *x, const yaml_node_t *n, const char *key, char **specs, int count) {
    for (int i = 0; i < count; i++) {
        const yaml_node_t *e = n->type == YAML_SEQUENCE_NODE ? node(x, n->data.sequence.items.start[i]) : n;
        if (pp_device_spec_check(specs[i]) != PP_OK)
            return err_at(x, PP_ERR_INVALID, e, "key '%s': device '%.60s': expected cpu, cuda, cuda:N or fake[:ops]",
                          key, specs[i]);
    }
    return PP_OK;
}

/* device: one spec for every stage, or a list with one per rank;
 * stage_devices: one per stage (over device:). */
static pp_status parse_devices(const cx *x, yaml_node_t *const *v) {
    pp_config *c = x->c;
    yaml_node_t *d = v[K_DEVICE], *sd = v[K_STAGE_DEVICES];
    if (given(d) && d->type == YAML_SEQUENCE_NODE) {
        PP_TRY(get_str_list(x, d, "device", 0, CFG_MAX_RANKS, &c->rank_devices, &c->n_rank_devices));
        PP_TRY(check_devices(x, d, "device", c->rank_devices, c->n_rank_devices));
        if (c->n_rank_devices != c->n_ranks)
            return err_at(x, PP_ERR_INVALID, d, "key 'device': %d devices for %d ranks (give one, or one per rank)",
                          c->n_rank_devices, c->n_ranks);
    } else if (given(d)) {
        PP_TRY(get_str(x, d, "device", &c->device));
        PP_TRY(check_devices(x, d, "device", &c->device, 1));
    }
    if (given(sd)) {
        PP_TRY(get_str_list(x, sd, "stage_devices", 0, CFG_MAX_ITEMS, &c->stage_devices, &c->n_stage_devices));
        PP_TRY(check_devices(x, sd, "stage_devices", c->stage_devices, c->n_stage_devices));
    }
    return PP_OK;
}

const char *pp_config_device(const pp_config *c, int rank, int stage) {
    if (stage >= 0 && stage < c->n_stage_devices) return c->stage_devices[stage];
    if (rank >= 0 && rank < c->n_rank_devices) return c->rank_devices[rank];
    return c->device ? c->device : "cpu";
}

/* recompute: true | false | a list of distinct stage indices. */
static pp_status parse_recompute(const cx *x, const yaml_node_t *n) {
    pp_config *c = x->c;
    c->recompute_line = line_of(n);
    if (n->type == YAML_SCALAR_NODE && !is_null(n)) {
        const char *s;
        PP_TRY(scalar_text(x, n, "recompute", "true, false or a list of stage indices", &s));
        if (!strcasecmp(s, "true") || !strcasecmp(s, "yes")) c->recompute = 1;
        else if (!strcasecmp(s, "false") || !strcasecmp(s, "no")) c->recompute = 0;
        else return type_err(x, n, "recompute", "true, false or a list of stage indices");
        return PP_OK;
    }
    if (n->type != YAML_SEQUENCE_NODE) return type_err(x, n, "recompute", "true, false or a list of stage indices");
    ptrdiff_t len = n->data.sequence.items.top - n->data.sequence.items.start;
    if (len > CFG_MAX_ITEMS)
        return err_at(x, PP_ERR_INVALID, n, "key 'recompute': more than %d entries", CFG_MAX_ITEMS);
    c->recompute_stages = calloc((size_t)len + 1, sizeof *c->recompute_stages);
    c->recompute_lines = calloc((size_t)len + 1, sizeof *c->recompute_lines);
    if (!c->recompute_stages || !c->recompute_lines) return pp_error(PP_ERR_NOMEM, "%s: out of memory", x->file);
    char path[64];
    for (int i = 0; i < (int)len; i++) {
        yaml_node_t *e = node(x, n->data.sequence.items.start[i]);
        key_path(path, sizeof path, "", "recompute", i);
        int v;
        PP_TRY(get_int32(x, e, path, 0, INT_MAX, &v));
        for (int j = 0; j < c->n_recompute_stages; j++)
            if (c->recompute_stages[j] == v)
                return err_at(x, PP_ERR_INVALID, e, "key '%s': stage %d is listed twice", path, v);
        c->recompute_lines[c->n_recompute_stages] = line_of(e);
        c->recompute_stages[c->n_recompute_stages++] = v;
    }
    return PP_OK;
}

/* replicas: R copies of the pipeline, each with its share of the batch. */
static pp_status parse_replicas(const cx *x, yaml_node_t *const *v) {
    pp_config *c = x->c;
    if (given(v[K_REPLICAS])) PP_TRY(get_int32(x, v[K_REPLICAS], "replicas", 1, CFG_MAX_RANKS, &c->replicas));
    else if (v[K_REPLICAS]) return type_err(x, v[K_REPLICAS], "replicas", "an integer");
    if (given(v[K_BUCKETS])) PP_TRY(parse_buckets(x, v[K_BUCKETS]));
    if (given(v[K_SHARD])) PP_TRY(get_bool(x, v[K_SHARD], "shard_optimizer", &c->shard_optimizer));
    if (c->shard_optimizer && c->replicas == 1)
        return err_at(x, PP_ERR_INVALID, v[K_SHARD], "key 'shard_optimizer': shards the optimizer over the "
                      "replicas; needs 'replicas' of 2 or more");
    if (c->replicas == 1) return PP_OK;
    const yaml_node_t *at = v[K_REPLICAS];
    if (!c->training || c->serving)
        return err_at(x, PP_ERR_INVALID, at, "key 'replicas': data-parallel replicas are for mode: train");
    if (c->n_ranks % c->replicas)
        return err_at(x, PP_ERR_INVALID, at, "key 'replicas': %d replicas, but 'ranks' lists %d endpoints (a multiple "
                      "of %d: each replica has the schedule's ranks)", c->replicas, c->n_ranks, c->replicas);
    if (c->batch_size % c->replicas)
        return err_at(x, PP_ERR_INVALID, at, "key 'replicas': batch_size %lld does not split into %d equal shares",
                      (long long)c->batch_size, c->replicas);
    if (c->microbatches > c->batch_size / c->replicas)
        return err_at(x, PP_ERR_INVALID, at, "key 'replicas': each replica's %lld rows cannot make %d microbatches",
                      (long long)(c->batch_size / c->replicas), c->microbatches);
    return PP_OK;
}

static pp_status parse_top(const cx *x, const yaml_node_t *root) {
    pp_config *c = x->c;
    yaml_node_t *v[K_COUNT];
    PP_TRY(match_keys(x, root, "", top_keys, K_COUNT, v));

    if (given(v[K_MODEL]) && given(v[K_STAGES]))
        return err_at(x, PP_ERR_INVALID, v[K_STAGES], "key 'stages': give either 'model' or 'stages', not both");
    if (given(v[K_STAGES])) {
        PP_TRY(get_path(x, v[K_STAGES], "stages", &c->stages));
    } else {
        if (!given(v[K_MODEL]))
            return v[K_MODEL] ? type_err(x, v[K_MODEL], "model", "a path")
                              : err_at(x, PP_ERR_PARSE, root, "missing key 'model' (or 'stages')");
        PP_TRY(get_path(x, v[K_MODEL], "model", &c->model));
    }
    if (given(v[K_SPLIT])) PP_TRY(parse_split(x, v[K_SPLIT]));
    if (given(v[K_FREEZE]) && c->stages)
        return err_at(x, PP_ERR_INVALID, v[K_FREEZE], "key 'freeze': stage files record what is trainable; "
                      "freeze when splitting (pippin split --freeze PATTERN)");
    if (given(v[K_FREEZE])) PP_TRY(get_str_list(x, v[K_FREEZE], "freeze", 0, CFG_MAX_ITEMS, &c->freeze, &c->n_freeze));
    if (given(v[K_DIMS])) PP_TRY(get_entries(x, v[K_DIMS], "dims", &c->dims, &c->n_dims, dim_value));
    if (given(v[K_MODE])) {
        const char *s;
        PP_TRY(scalar_text(x, v[K_MODE], "mode", "train, infer or serve", &s));
        if (!strcmp(s, "train")) c->training = 1;
        else if (!strcmp(s, "infer")) c->training = 0;
        else if (!strcmp(s, "serve")) c->training = 0, c->serving = 1;
        else return err_at(x, PP_ERR_INVALID, v[K_MODE], "key 'mode': expected train, infer or serve, got '%.60s'", s);
    }
    if (given(v[K_SCHEDULE])) PP_TRY(parse_schedule(x, v[K_SCHEDULE]));
    if (given(v[K_MICROBATCHES]))
        PP_TRY(get_int32(x, v[K_MICROBATCHES], "microbatches", 1, PP_SCHED_MAX_MB, &c->microbatches));
    yaml_node_t *client_keys = NULL;
    if (c->serving && given(v[K_SERVE])) PP_TRY(parse_serve(x, v[K_SERVE], &client_keys));
    else if (c->serving)
        return err_at(x, PP_ERR_PARSE, v[K_SERVE] ? v[K_SERVE] : root, "mode serve needs a 'serve:' section with an endpoint");
    else if (given(v[K_SERVE]))
        return err_at(x, PP_ERR_INVALID, v[K_SERVE], "key 'serve': only for mode: serve");
    if (c->serving && !given(v[K_BATCH])) c->batch_size = c->serve_max_batch; /* requests bring their rows */
    else if (!given(v[K_BATCH])) return v[K_BATCH] ? type_err(x, v[K_BATCH], "batch_size", "an integer")
                                              : err_at(x, PP_ERR_PARSE, root, "missing key 'batch_size'");
    else PP_TRY(get_int(x, v[K_BATCH], "batch_size", 1, INT64_MAX, &c->batch_size));
    /* Each microbatch needs a sample: caught here, with the line, rather
     * than by every worker's first step. */
    if (c->microbatches > c->batch_size)
        return err_at(x, PP_ERR_INVALID, v[K_MICROBATCHES],
                      "key 'microbatches': %d microbatches for batch_size %lld", c->microbatches,
                      (long long)c->batch_size);
    if (given(v[K_STEPS])) PP_TRY(get_int(x, v[K_STEPS], "steps", 0, INT64_MAX, &c->steps));
    if (given(v[K_LOSS])) PP_TRY(get_str(x, v[K_LOSS], "loss", &c->loss));
    if (given(v[K_OPTIMIZER])) PP_TRY(parse_optimizer(x, v[K_OPTIMIZER]));
    if (given(v[K_DATA])) {
        PP_TRY(get_entries(x, v[K_DATA], "data", &c->data, &c->n_data, get_path));
        if (c->n_data == 0) return err_at(x, PP_ERR_INVALID, v[K_DATA], "key 'data': no inputs given");
    }
    if (given(v[K_TEXT])) PP_TRY(parse_text(x, v[K_TEXT]));
    if (given(v[K_DATA]) && given(v[K_TEXT]))
        return err_at(x, PP_ERR_INVALID, v[K_TEXT], "key 'text': give either 'data' or 'text', not both");
    if (c->training && !given(v[K_DATA]) && !given(v[K_TEXT]))
        return err_at(x, PP_ERR_INVALID, v[K_MODE] ? v[K_MODE] : root,
                      "key 'data': mode train needs 'data' or 'text'");

    if (!given(v[K_RANKS])) return v[K_RANKS] ? type_err(x, v[K_RANKS], "ranks", "a list of endpoints")
                                              : err_at(x, PP_ERR_PARSE, root, "missing key 'ranks'");
    PP_TRY(get_str_list(x, v[K_RANKS], "ranks", 0, CFG_MAX_RANKS, &c->ranks, &c->n_ranks));
    if (c->n_ranks == 0) return err_at(x, PP_ERR_INVALID, v[K_RANKS], "key 'ranks': no endpoints given");
    if (given(v[K_BIND])) PP_TRY(get_str(x, v[K_BIND], "bind", &c->bind));
    if (given(v[K_TIMEOUT])) PP_TRY(get_int32(x, v[K_TIMEOUT], "timeout_ms", 1, INT_MAX, &c->timeout_ms));
    if (given(v[K_REJOIN]))
        PP_TRY(get_int32(x, v[K_REJOIN], "rejoin_timeout_ms", 0, INT_MAX, &c->rejoin_timeout_ms));
    if (given(v[K_THREADS])) PP_TRY(get_int32(x, v[K_THREADS], "threads", 0, 4096, &c->threads));
    PP_TRY(parse_devices(x, v));
    if (given(v[K_SHM])) PP_TRY(get_bool(x, v[K_SHM], "shared_memory", &c->shared_memory));
    if (given(v[K_BULK])) PP_TRY(get_bool(x, v[K_BULK], "bulk_lanes", &c->bulk_lanes));
    if (given(v[K_SHARE_CORES])) PP_TRY(get_bool(x, v[K_SHARE_CORES], "share_cores", &c->share_cores));
    if (given(v[K_SPIN])) PP_TRY(get_int32(x, v[K_SPIN], "spin_us", 0, 10000, &c->spin_us));
    if (given(v[K_SECURITY])) {
        yaml_node_t *lists[2];
        PP_TRY(parse_security(x, v[K_SECURITY], lists));
        const char *names[2] = {"security.secret_keys", "security.public_keys"};
        int counts[2] = {c->n_secret_keys, c->n_public_keys};
        for (int i = 0; i < 2; i++)
            if (counts[i] != c->n_ranks)
                return err_at(x, PP_ERR_INVALID, lists[i], "key '%s': %d key file%s for %d rank%s", names[i],
                              counts[i], counts[i] == 1 ? "" : "s", c->n_ranks, c->n_ranks == 1 ? "" : "s");
    }
    if (given(v[K_OUTPUT])) PP_TRY(get_path(x, v[K_OUTPUT], "output_dir", &c->output_dir));
    if (given(v[K_PARAMS])) {
        if (!c->model) return err_at(x, PP_ERR_INVALID, v[K_PARAMS], "key 'params': needs 'model' (not 'stages')");
        PP_TRY(get_path(x, v[K_PARAMS], "params", &c->params));
    }
    if (given(v[K_CHECKPOINT])) {
        if (!c->training)
            return err_at(x, PP_ERR_INVALID, v[K_CHECKPOINT],
                          "key 'checkpoint': checkpoints need mode: train (this config infers)");
        PP_TRY(parse_checkpoint(x, v[K_CHECKPOINT]));
    }
    if (given(v[K_RUN_ID])) PP_TRY(parse_run_id(x, v[K_RUN_ID]));
    if (given(v[K_RECOMPUTE])) {
        PP_TRY(parse_recompute(x, v[K_RECOMPUTE]));
        if (!c->training && (c->recompute || c->n_recompute_stages))
            return err_at(x, PP_ERR_INVALID, v[K_RECOMPUTE],
                          "key 'recompute': recomputation saves training memory; needs mode: train");
    } else if (v[K_RECOMPUTE]) {
        return type_err(x, v[K_RECOMPUTE], "recompute", "true, false or a list of stage indices");
    }
    if (given(v[K_INSECURE])) PP_TRY(get_bool(x, v[K_INSECURE], "insecure", &c->insecure));
    PP_TRY(parse_replicas(x, v));
    if (given(v[K_WIRE])) {
        const char *w;
        PP_TRY(scalar_text(x, v[K_WIRE], "wire_dtype", "float32 or bfloat16", &w));
        if (!strcmp(w, "bfloat16") || !strcmp(w, "bf16")) c->wire_bf16 = 1;
        else if (strcmp(w, "float32") != 0)
            return err_at(x, PP_ERR_INVALID, v[K_WIRE], "key 'wire_dtype': expected float32 or bfloat16, got '%.60s'", w);
    }
    PP_TRY(check_protected(x, v[K_RANKS], v[K_BIND]));
    /* With security: the front is a CURVE server admitting serve.client_keys
     * only; without it, the front is plaintext (protected mode applies). */
    if (c->serving && client_keys && c->n_secret_keys == 0)
        return err_at(x, PP_ERR_INVALID, client_keys,
                      "key 'serve.client_keys': needs 'security:' (the front uses its rank's CURVE key pair)");
    if (c->serving && c->n_secret_keys > 0 && c->n_serve_client_keys == 0)
        return err_at(x, PP_ERR_INVALID, client_keys ? client_keys : v[K_SERVE],
                      "serve.client_keys: needed with security: the clients the front admits");
    if (c->serving && !c->insecure && c->n_secret_keys == 0)
        PP_TRY(check_endpoint(x, v[K_SERVE], "serve.endpoint", c->serve_endpoint));
    return PP_OK;
}

/* ------------------------------------------------------------ entry points */

/* libyaml's failure as FILE:LINE: problem. */
static pp_status yaml_fail(const yaml_parser_t *p, const char *file, const char *text, size_t len) {
    if (p->error == YAML_MEMORY_ERROR) return pp_error(PP_ERR_NOMEM, "%s: out of memory", file);
    size_t line;
    if (p->error == YAML_READER_ERROR) {
        line = 1;
        for (size_t i = 0; i < p->problem_offset && i < len; i++) line += text[i] == '\n';
    } else {
        line = p->problem_mark.line + 1;
    }
    const char *problem = p->problem ? p->problem : "malformed YAML";
    if (p->context)
        return pp_error(PP_ERR_PARSE, "%s:%zu: invalid YAML: %s (%s at line %zu)", file, line, problem,
                        p->context, p->context_mark.line + 1);
    return pp_error(PP_ERR_PARSE, "%s:%zu: invalid YAML: %s", file, line, problem);
}

/* A pass over the events before the document is built: libyaml has no
 * nesting limit, and its scanner's cost grows with the depth (500 KB of
 * '[' took over 30 s). This pass stops at the first level too deep. */
static pp_status check_depth(const char *file, const char *text, size_t len) {
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) return pp_error(PP_ERR_NOMEM, "%s: out of memory", file);
    yaml_parser_set_input_string(&p, (const unsigned char *)(text ? text : ""), len);
    pp_status s = PP_OK;
    int depth = 0;
    for (;;) {
        yaml_event_t e;
        if (!yaml_parser_parse(&p, &e)) {
            s = yaml_fail(&p, file, text, len);
            break;
        }
        yaml_event_type_t t = e.type;
        size_t line = e.start_mark.line + 1;
        yaml_event_delete(&e);
        if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) {
            if (++depth > CFG_MAX_DEPTH) {
                s = pp_error(PP_ERR_UNSUPPORTED, "%s:%zu: lists and mappings nested more than %d levels deep",
                             file, line, CFG_MAX_DEPTH);
                break;
            }
        } else if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT) {
            depth--;
        } else if (t == YAML_STREAM_END_EVENT) {
            break;
        }
    }
    yaml_parser_delete(&p);
    return s;
}

void pp_config_free(pp_config *c) {
    if (!c) return;
    free(c->path);
    free(c->model);
    free(c->stages);
    for (int i = 0; c->split_before && i < c->n_split_before; i++) free(c->split_before[i]);
    free(c->split_before);
    for (int i = 0; c->split_after && i < c->n_split_after; i++) free(c->split_after[i]);
    free(c->split_after);
    for (int i = 0; c->freeze && i < c->n_freeze; i++) free(c->freeze[i]);
    free(c->freeze);
    for (int i = 0; c->dims && i < c->n_dims; i++) {
        free(c->dims[i].key);
        free(c->dims[i].value);
    }
    free(c->dims);
    free(c->schedule);
    free(c->loss);
    for (int i = 0; c->data && i < c->n_data; i++) {
        free(c->data[i].key);
        free(c->data[i].value);
    }
    free(c->data);
    free(c->text_file);
    free(c->text_vocab);
    free(c->serve_endpoint);
    free(c->serve_vocab);
    for (int i = 0; c->serve_client_keys && i < c->n_serve_client_keys; i++) free(c->serve_client_keys[i]);
    free(c->serve_client_keys);
    free(c->params);
    free(c->recompute_stages);
    free(c->recompute_lines);
    for (int i = 0; c->serve_state && i < c->n_serve_state; i++) {
        free(c->serve_state[i].key);
        free(c->serve_state[i].value);
    }
    free(c->serve_state);
    free(c->device);
    for (int i = 0; c->rank_devices && i < c->n_rank_devices; i++) free(c->rank_devices[i]);
    free(c->rank_devices);
    for (int i = 0; c->stage_devices && i < c->n_stage_devices; i++) free(c->stage_devices[i]);
    free(c->stage_devices);
    for (int i = 0; c->ranks && i < c->n_ranks; i++) free(c->ranks[i]);
    free(c->ranks);
    free(c->bind);
    for (int i = 0; c->secret_keys && i < c->n_secret_keys; i++) free(c->secret_keys[i]);
    free(c->secret_keys);
    for (int i = 0; c->public_keys && i < c->n_public_keys; i++) free(c->public_keys[i]);
    free(c->public_keys);
    free(c->output_dir);
    free(c->checkpoint_dir);
    free(c->run_id);
    free(c->split_marker_identity);
    free(c);
}

pp_status pp_config_parse(const char *text, size_t len, const char *name, const char *dir, pp_config **out) {
    if (!out) return pp_error(PP_ERR_INVALID, "pp_config_parse: out is NULL");
    *out = NULL;
    if (!name) name = "<config>";
    if (!dir) dir = ".";
    if (!text && len) return pp_error(PP_ERR_INVALID, "%s: no text", name);
    if (len > CFG_MAX_BYTES)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: %zu bytes (a config has at most %u)", name, len, CFG_MAX_BYTES);

    PP_TRY(check_depth(name, text, len));

    pp_config *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(name)) || !(c->schedule = strdup("gpipe"))) {
        pp_config_free(c);
        return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    }
    c->training = 1;
    c->microbatches = 1;
    c->replicas = 1;
    c->bucket_first_bytes = 1 << 20;
    c->bucket_bytes = 25 << 20;
    c->bucket_direct_links = 1;
    c->steps = 1;
    c->timeout_ms = 10000;
    c->shared_memory = 1;
    c->bulk_lanes = 1;
    c->share_cores = 1;
    c->spin_us = -1; /* auto: pp_worker_spin_us */
    c->checkpoint_keep = 2;
    c->serve_max_batch = 8;
    c->serve_max_wait_us = 500;
    c->serve_max_queue = 256;
    c->serve_max_request_bytes = (int64_t)64 << 20;
    c->serve_max_sessions = 64;
    c->serve_max_tokens = 4096;
    c->serve_session_idle_ms = 10 * 60 * 1000;
    c->serve_session_max_bytes = (int64_t)1 << 30;
    pp_optim_config_init(&c->optim, PP_OPTIM_ADAMW);

    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        pp_config_free(c);
        return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)(text ? text : ""), len);
    pp_status s = PP_OK;
    if (!yaml_parser_load(&parser, &doc)) {
        s = yaml_fail(&parser, name, text, len);
        yaml_parser_delete(&parser);
        pp_config_free(c);
        return s;
    }
    cx x = {name, dir, &doc, c};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
        s = pp_error(PP_ERR_PARSE, "%s: empty config (expected a mapping of keys)", name);
    } else if (root->type != YAML_MAPPING_NODE) {
        char got[96];
        describe(root, got, sizeof got);
        s = err_at(&x, PP_ERR_PARSE, root, "expected a mapping of keys, got %s", got);
    } else {
        s = parse_top(&x, root);
    }
    if (s == PP_OK) {
        /* One document only: a second would be silently ignored. */
        yaml_document_t more;
        if (!yaml_parser_load(&parser, &more)) {
            s = yaml_fail(&parser, name, text, len);
        } else {
            yaml_node_t *r2 = yaml_document_get_root_node(&more);
            if (r2)
                s = pp_error(PP_ERR_PARSE, "%s:%d: more than one YAML document", name, line_of(r2));
            yaml_document_delete(&more);
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    if (s != PP_OK) {
        pp_config_free(c);
        return s;
    }
    *out = c;
    return PP_OK;
}

pp_status pp_config_load(const char *path, pp_config **out) {
    if (!out) return pp_error(PP_ERR_INVALID, "pp_config_load: out is NULL");
    *out = NULL;
    if (!path) return pp_error(PP_ERR_INVALID, "pp_config_load: path is NULL");
    unsigned char *buf;
    size_t len;
    PP_TRY(pp_read_file(path, CFG_MAX_BYTES, &buf, &len));
    const char *slash = strrchr(path, '/');
    char *dir = slash == path ? strdup("/") : slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    if (!dir) {
        free(buf);
        return pp_error(PP_ERR_NOMEM, "%s: out of memory", path);
    }
    pp_status s = pp_config_parse((const char *)buf, len, path, dir, out);
    free(dir);
    free(buf);
    return s;
}

/* ------------------------------------------------------------ rank */

pp_status pp_config_rank(int rank_arg, int nranks, int *rank) {
    if (!rank) return pp_error(PP_ERR_INVALID, "pp_config_rank: rank is NULL");
    *rank = -1;
    if (nranks < 1) return pp_error(PP_ERR_INVALID, "no ranks configured");
    if (rank_arg >= 0) {
        if (rank_arg >= nranks)
            return pp_error(PP_ERR_INVALID, "--rank %d: the config has %d rank%s (0 to %d)", rank_arg, nranks,
                            nranks == 1 ? "" : "s", nranks - 1);
        *rank = rank_arg;
        return PP_OK;
    }
    static const char *const vars[] = {"PIPPIN_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v) continue;
        int ok = 1;
        long long r = 0;
        for (const char *p = v; *p; p++) {
            if (*p < '0' || *p > '9' || r > INT_MAX) {
                ok = 0;
                break;
            }
            r = r * 10 + (*p - '0');
        }
        if (!ok || r > INT_MAX)
            return pp_error(PP_ERR_INVALID, "%s='%.40s': not a non-negative integer", vars[i], v);
        if (r >= nranks)
            return pp_error(PP_ERR_INVALID, "%s=%lld: the config has %d rank%s (0 to %d)", vars[i], r, nranks,
                            nranks == 1 ? "" : "s", nranks - 1);
        *rank = (int)r;
        return PP_OK;
    }
    return pp_error(PP_ERR_INVALID, "no rank given: pass --rank or set PIPPIN_RANK "
                                    "(or run under Slurm, Open MPI or a PMI launcher)");
}

/* One line of text -> one ONNX NodeProto (syntax in onnx_function_text.h).
 * The lines are pippin's own, so errors say which line and where, for the
 * one who edits them. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_function_text.h"

#include "status_internal.h"

#define MAX_ITEMS 16

#define MAX_GRAPHS 8

/* The subgraphs defined so far in a text (graph ... end blocks). */
typedef struct {
    const char *name[MAX_GRAPHS];
    Onnx__GraphProto *g[MAX_GRAPHS];
    int n;
} graph_table;

typedef struct {
    const char *s, *line, *what;
    pp_onnx_alloc_fn alloc;
    void *ctx;
    const graph_table *graphs; /* what %name may refer to; NULL: none */
} cursor;

static void skip_space(cursor *c) {
    while (*c->s == ' ') c->s++;
}

static pp_status bad(const cursor *c, const char *expected) {
    return pp_error(PP_ERR_INVALID, "function %s: body line '%s': expected %s at column %d", c->what, c->line,
                    expected, (int)(c->s - c->line) + 1);
}

static int name_char(char ch) { return isalnum((unsigned char)ch) || ch == '_' || ch == '.'; }

/* A name (possibly empty) copied into the arena. */
static char *take_name(cursor *c) {
    skip_space(c);
    const char *b = c->s;
    while (name_char(*c->s)) c->s++;
    char *n = c->alloc(c->ctx, (size_t)(c->s - b) + 1);
    if (n) memcpy(n, b, (size_t)(c->s - b));
    return n;
}

/* Names separated by ',' up to (not including) the character stop. */
static pp_status name_list(cursor *c, char stop, char ***names, size_t *n) {
    char *tmp[MAX_ITEMS];
    size_t k = 0;
    skip_space(c);
    if (*c->s != stop)
        for (;;) {
            if (k == MAX_ITEMS) return bad(c, "at most 16 names");
            if (!(tmp[k++] = take_name(c))) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
            skip_space(c);
            if (*c->s != ',') break;
            c->s++;
        }
    if (*c->s != stop) return bad(c, stop == '=' ? "'='" : "')'");
    *names = c->alloc(c->ctx, sizeof **names * (k + 1));
    if (!*names) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    memcpy(*names, tmp, sizeof *tmp * k);
    *n = k;
    return PP_OK;
}

static int is_float_text(const char *b, const char *e) {
    for (const char *p = b; p < e; p++)
        if (*p == '.' || *p == 'e' || *p == 'E' || *p == 'i' || *p == 'n') return 1;
    return 0;
}

/* A number token [b, e): stored as float or int. */
static pp_status number(cursor *c, int as_float, double *f, int64_t *i) {
    char *end;
    if (as_float) *f = strtod(c->s, &end);
    else *i = strtoll(c->s, &end, 10);
    if (end == c->s) return bad(c, "a number");
    c->s = end;
    return PP_OK;
}

static const char *token_end(const char *s) {
    while (*s && *s != ',' && *s != ']' && *s != '>' && *s != ' ') s++;
    return s;
}

static pp_status ref_value(cursor *c, Onnx__AttributeProto *a) {
    c->s++;
    if (!(a->ref_attr_name = take_name(c))) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    if (!a->ref_attr_name[0] || *c->s != ':') return bad(c, "@name:type");
    c->s++;
    static const struct {
        const char *t;
        Onnx__AttributeProto__AttributeType v;
    } types[] = {{"ints", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS},
                 {"floats", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS},
                 {"i", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT},
                 {"f", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT},
                 {"s", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING}};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        size_t len = strlen(types[k].t);
        if (strncmp(c->s, types[k].t, len) == 0 && !isalpha((unsigned char)c->s[len])) {
            a->has_type = 1;
            a->type = types[k].v;
            c->s += len;
            return PP_OK;
        }
    }
    return bad(c, "a type (i f s ints floats)");
}

static pp_status list_value(cursor *c, Onnx__AttributeProto *a) {
    c->s++;
    const char *close = strchr(c->s, ']');
    if (!close) return bad(c, "']'");
    int as_float = is_float_text(c->s, close);
    double f[MAX_ITEMS];
    int64_t i[MAX_ITEMS];
    size_t k = 0;
    skip_space(c);
    while (*c->s != ']') {
        if (k == MAX_ITEMS) return bad(c, "at most 16 values");
        PP_TRY(number(c, as_float, &f[k], &i[k]));
        k++;
        skip_space(c);
        if (*c->s == ',') c->s++;
        skip_space(c);
    }
    c->s++;
    a->has_type = 1;
    if (as_float) {
        a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS;
        if (!(a->floats = c->alloc(c->ctx, sizeof *a->floats * (k + 1))))
            return pp_error(PP_ERR_NOMEM, "out of memory exporting");
        for (size_t j = 0; j < k; j++) a->floats[j] = (float)f[j];
        a->n_floats = k;
    } else {
        a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
        if (!(a->ints = c->alloc(c->ctx, sizeof *a->ints * (k + 1))))
            return pp_error(PP_ERR_NOMEM, "out of memory exporting");
        memcpy(a->ints, i, sizeof *i * k);
        a->n_ints = k;
    }
    return PP_OK;
}

static pp_status string_value(cursor *c, Onnx__AttributeProto *a) {
    const char *b = ++c->s, *e = strchr(b, '\'');
    if (!e) return bad(c, "a closing quote");
    uint8_t *copy = c->alloc(c->ctx, (size_t)(e - b) + 1);
    if (!copy) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    memcpy(copy, b, (size_t)(e - b));
    a->has_type = a->has_s = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    a->s.data = copy;
    a->s.len = (size_t)(e - b);
    c->s = e + 1;
    return PP_OK;
}

/* %name: a subgraph defined earlier in the text. */
static pp_status graph_value(cursor *c, Onnx__AttributeProto *a) {
    c->s++;
    char *name = take_name(c);
    if (!name) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    for (int k = 0; c->graphs && k < c->graphs->n; k++)
        if (strcmp(c->graphs->name[k], name) == 0) {
            a->has_type = 1;
            a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
            a->g = c->graphs->g[k];
            return PP_OK;
        }
    return bad(c, "the name of a graph defined above");
}

static pp_status attribute(cursor *c, Onnx__AttributeProto **out) {
    Onnx__AttributeProto *a = c->alloc(c->ctx, sizeof *a);
    if (!a) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    onnx__attribute_proto__init(a);
    if (!(a->name = take_name(c))) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    skip_space(c);
    if (!a->name[0] || *c->s != '=') return bad(c, "name=value");
    c->s++;
    skip_space(c);
    *out = a;
    if (*c->s == '@') return ref_value(c, a);
    if (*c->s == '[') return list_value(c, a);
    if (*c->s == '\'') return string_value(c, a);
    if (*c->s == '%') return graph_value(c, a);
    const char *e = token_end(c->s);
    int as_float = is_float_text(c->s, e);
    double f = 0;
    int64_t i = 0;
    PP_TRY(number(c, as_float, &f, &i));
    a->has_type = 1;
    if (as_float) {
        a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
        a->has_f = 1;
        a->f = (float)f;
    } else {
        a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
        a->has_i = 1;
        a->i = i;
    }
    return PP_OK;
}

static pp_status node_line(const char *line, const char *what, pp_onnx_alloc_fn alloc, void *ctx,
                           const graph_table *graphs, Onnx__NodeProto **out) {
    cursor c = {line, line, what, alloc, ctx, graphs};
    Onnx__NodeProto *n = alloc(ctx, sizeof *n);
    if (!n) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    onnx__node_proto__init(n);
    PP_TRY(name_list(&c, '=', &n->output, &n->n_output));
    c.s++;
    if (!(n->op_type = take_name(&c))) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    if (!n->op_type[0]) return bad(&c, "an op type");
    skip_space(&c);
    if (*c.s == '<') {
        Onnx__AttributeProto *tmp[MAX_ITEMS];
        size_t k = 0;
        c.s++;
        for (;;) {
            if (k == MAX_ITEMS) return bad(&c, "at most 16 attributes");
            PP_TRY(attribute(&c, &tmp[k++]));
            skip_space(&c);
            if (*c.s != ',') break;
            c.s++;
        }
        if (*c.s != '>') return bad(&c, "'>'");
        c.s++;
        if (!(n->attribute = alloc(ctx, sizeof *n->attribute * (k + 1))))
            return pp_error(PP_ERR_NOMEM, "out of memory exporting");
        memcpy(n->attribute, tmp, sizeof *tmp * k);
        n->n_attribute = k;
    }
    skip_space(&c);
    if (*c.s != '(') return bad(&c, "'('");
    c.s++;
    PP_TRY(name_list(&c, ')', &n->input, &n->n_input));
    c.s++;
    skip_space(&c);
    if (*c.s) return bad(&c, "the end of the line");
    *out = n;
    return PP_OK;
}

pp_status pp_onnx_node_from_text(const char *line, const char *what, pp_onnx_alloc_fn alloc, void *ctx,
                                 Onnx__NodeProto **out) {
    return node_line(line, what, alloc, ctx, NULL, out);
}

/* "name:type" (type one of float int64 bool, "[]" after it for a scalar)
 * as a ValueInfoProto: a tensor of that element type, its shape left to
 * inference but for scalars (ONNX Runtime wants a Loop body's types, and its
 * iteration count and condition known as scalars). */
static pp_status value_info(cursor *c, Onnx__ValueInfoProto **out) {
    static const struct {
        const char *name;
        int32_t type;
    } types[] = {{"float", 1}, {"int64", 7}, {"bool", 9}};
    Onnx__ValueInfoProto *v = c->alloc(c->ctx, sizeof *v);
    Onnx__TypeProto *tp = c->alloc(c->ctx, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = c->alloc(c->ctx, sizeof *tt);
    if (!v || !tp || !tt) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    if (!(v->name = take_name(c))) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    if (!v->name[0] || *c->s != ':') return bad(c, "name:type");
    c->s++;
    size_t k = 0;
    while (k < sizeof types / sizeof types[0] &&
           (strncmp(c->s, types[k].name, strlen(types[k].name)) != 0 || name_char(c->s[strlen(types[k].name)])))
        k++;
    if (k == sizeof types / sizeof types[0]) return bad(c, "a type (float int64 bool)");
    c->s += strlen(types[k].name);
    if (strncmp(c->s, "[]", 2) == 0) { /* a scalar: shape [] */
        c->s += 2;
        if (!(tt->shape = c->alloc(c->ctx, sizeof *tt->shape)))
            return pp_error(PP_ERR_NOMEM, "out of memory exporting");
        onnx__tensor_shape_proto__init(tt->shape);
    }
    tt->has_elem_type = 1;
    tt->elem_type = types[k].type;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    v->type = tp;
    *out = v;
    return PP_OK;
}

/* "a:float, b:bool)" up to stop, as value infos. */
static pp_status value_infos(cursor *c, char stop, Onnx__ValueInfoProto ***out, size_t *n) {
    Onnx__ValueInfoProto *tmp[MAX_ITEMS];
    size_t k = 0;
    skip_space(c);
    if (*c->s != stop)
        for (;;) {
            if (k == MAX_ITEMS) return bad(c, "at most 16 names");
            PP_TRY(value_info(c, &tmp[k++]));
            skip_space(c);
            if (*c->s != ',') break;
            c->s++;
        }
    if (*c->s != stop) return bad(c, "')'");
    c->s++;
    if (!(*out = c->alloc(c->ctx, sizeof **out * (k + 1))))
        return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    memcpy(*out, tmp, sizeof *tmp * k);
    *n = k;
    return PP_OK;
}

/* "graph NAME(in, ...) -> (out, ...)": a new empty graph with room for
 * max_nodes nodes, added to t. */
static pp_status graph_header(const char *line, const char *what, pp_onnx_alloc_fn alloc, void *ctx,
                              size_t max_nodes, graph_table *t) {
    cursor c = {line + strlen("graph"), line, what, alloc, ctx, NULL};
    if (t->n == MAX_GRAPHS) return bad(&c, "at most 8 graphs");
    Onnx__GraphProto *g = alloc(ctx, sizeof *g);
    if (!g) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    onnx__graph_proto__init(g);
    if (!(g->name = take_name(&c))) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    if (!g->name[0] || *c.s != '(') return bad(&c, "graph NAME(");
    c.s++;
    PP_TRY(value_infos(&c, ')', &g->input, &g->n_input));
    skip_space(&c);
    if (strncmp(c.s, "-> (", 4) != 0) return bad(&c, "'-> ('");
    c.s += 4;
    PP_TRY(value_infos(&c, ')', &g->output, &g->n_output));
    skip_space(&c);
    if (*c.s) return bad(&c, "the end of the line");
    if (!(g->node = alloc(ctx, sizeof *g->node * (max_nodes + 1))))
        return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    t->name[t->n] = g->name;
    t->g[t->n++] = g;
    return PP_OK;
}

pp_status pp_onnx_nodes_from_text(const char *text, const char *what, pp_onnx_alloc_fn alloc, void *ctx,
                                  Onnx__NodeProto ***nodes, size_t *n_nodes) {
    size_t lines = 0;
    for (const char *p = text; *p; p++) lines += *p == '\n';
    graph_table t = {0};
    Onnx__GraphProto *open = NULL; /* the graph whose lines these are */
    *n_nodes = 0;
    if (!(*nodes = alloc(ctx, sizeof **nodes * (lines + 1))))
        return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    char line[1024];
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len >= sizeof line)
            return pp_error(PP_ERR_INTERNAL, "function %s: body line too long: '%.60s...'", what, p);
        memcpy(line, p, len);
        line[len] = '\0';
        p += len + (e != NULL);
        if (strncmp(line, "graph ", 6) == 0) {
            if (open) return pp_error(PP_ERR_INTERNAL, "function %s: graph blocks do not nest: '%s'", what, line);
            PP_TRY(graph_header(line, what, alloc, ctx, lines, &t));
            open = t.g[t.n - 1];
        } else if (strcmp(line, "end") == 0) {
            if (!open) return pp_error(PP_ERR_INTERNAL, "function %s: 'end' without 'graph'", what);
            open = NULL;
        } else if (open) {
            PP_TRY(node_line(line, what, alloc, ctx, &t, &open->node[open->n_node++]));
        } else {
            PP_TRY(node_line(line, what, alloc, ctx, &t, &(*nodes)[(*n_nodes)++]));
        }
    }
    if (open) return pp_error(PP_ERR_INTERNAL, "function %s: graph '%s' has no 'end'", what, open->name);
    return PP_OK;
}

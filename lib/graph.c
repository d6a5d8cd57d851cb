/* Graph IR builder: values, nodes, attributes and a name index. */
#include "pippin/graph.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "op.h"

#include "status_internal.h"
/* Name index: open-addressing hash from value name to value index + 1. */
typedef struct {
    int cap;   /* power of two */
    int used;
    int *slots;
} name_index;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int index_lookup(const pp_graph *g, const char *name) {
    const name_index *ix = g->name_index;
    if (!ix || !name) return -1;
    for (uint64_t i = hash_str(name) & (uint64_t)(ix->cap - 1);; i = (i + 1) & (uint64_t)(ix->cap - 1)) {
        int v = ix->slots[i];
        if (v == 0) return -1;
        if (strcmp(g->values[v - 1].name, name) == 0) return v - 1;
    }
}

static void index_put(name_index *ix, const pp_graph *g, int value) {
    for (uint64_t i = hash_str(g->values[value].name) & (uint64_t)(ix->cap - 1);;
         i = (i + 1) & (uint64_t)(ix->cap - 1)) {
        if (ix->slots[i] == 0) {
            ix->slots[i] = value + 1;
            ix->used++;
            return;
        }
    }
}

static pp_status index_add(pp_graph *g, int value) {
    name_index *ix = g->name_index;
    if ((ix->used + 1) * 2 > ix->cap) {
        int cap = ix->cap * 2;
        int *slots = calloc((size_t)cap, sizeof *slots);
        if (!slots) return pp_error(PP_ERR_NOMEM, "out of memory growing the name index");
        free(ix->slots);
        ix->slots = slots;
        ix->cap = cap;
        ix->used = 0;
        for (int v = 0; v < g->n_values; v++)
            if (v != value && g->values[v].name) index_put(ix, g, v);
    }
    index_put(ix, g, value);
    return PP_OK;
}

static char *dup_str(const char *s) { return s ? strdup(s) : NULL; }

pp_status pp_graph_new(const char *name, pp_graph **out) {
    pp_graph *g = calloc(1, sizeof *g);
    name_index *ix = calloc(1, sizeof *ix);
    int *slots = calloc(64, sizeof *slots);
    if (!g || !ix || !slots) {
        free(g);
        free(ix);
        free(slots);
        return pp_error(PP_ERR_NOMEM, "out of memory creating a graph");
    }
    ix->cap = 64;
    ix->slots = slots;
    g->name_index = ix;
    g->name = dup_str(name ? name : "graph");
    g->opset = 17;
    *out = g;
    return PP_OK;
}

void pp_attr_clear(pp_attr *a) {
    free(a->name);
    free(a->s);
    pp_tensor_free(a->t);
    free(a->ints);
    free(a->floats);
    for (int i = 0; a->strings && i < a->n; i++) free(a->strings[i]);
    free(a->strings);
}

void pp_node_clear(pp_node *n) {
    free(n->name);
    free(n->op_type);
    free(n->domain);
    free(n->in);
    free(n->out);
    for (int a = 0; a < n->n_attr; a++) pp_attr_clear(&n->attrs[a]);
    free(n->attrs);
}

void pp_graph_free(pp_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_values; i++) {
        pp_value *v = &g->values[i];
        free(v->name);
        for (int d = 0; d < PP_MAX_DIMS; d++) free(v->dim_names[d]);
        pp_tensor_free(v->data);
    }
    for (int i = 0; i < g->n_nodes; i++) pp_node_clear(&g->nodes[i]);
    name_index *ix = g->name_index;
    if (ix) free(ix->slots);
    free(ix);
    free(g->values);
    free(g->nodes);
    free(g->inputs);
    free(g->outputs);
    free(g->name);
    free(g->source);
    free(g);
}

int pp_graph_find_value(const pp_graph *g, const char *name) { return index_lookup(g, name); }

int pp_graph_find_node(const pp_graph *g, const char *name) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].name && strcmp(g->nodes[i].name, name) == 0) return i;
    return -1;
}

const char *pp_graph_unique_name(pp_graph *g, const char *prefix) {
    static _Thread_local char buf[256];
    do {
        snprintf(buf, sizeof buf, "%s_%d", prefix, g->name_counter++);
    } while (index_lookup(g, buf) >= 0);
    return buf;
}

/* Appends a value with a unique name; fills *id. */
static pp_status add_value(pp_graph *g, const char *name, pp_value_kind kind, int *id) {
    if (!name || !name[0]) return pp_error(PP_ERR_INVALID, "value with an empty name");
    if (index_lookup(g, name) >= 0)
        return pp_error(PP_ERR_INVALID, "value '%s' is defined twice", name);
    PP_TRY(PP_GROW(g->values, g->cap_values, g->n_values));
    pp_value *v = &g->values[g->n_values];
    memset(v, 0, sizeof *v);
    v->name = dup_str(name);
    if (!v->name) return pp_error(PP_ERR_NOMEM, "out of memory");
    v->kind = kind;
    v->ndim = -1;
    v->producer = -1;
    g->n_values++;
    pp_status s = index_add(g, g->n_values - 1);
    if (s != PP_OK) {
        free(v->name);
        g->n_values--;
        return s;
    }
    *id = g->n_values - 1;
    return PP_OK;
}

pp_status pp_graph_add_input(pp_graph *g, const char *name, pp_dtype dt, int ndim,
                             const int64_t *shape, int *value_id) {
    if (ndim > PP_MAX_DIMS)
        return pp_error(PP_ERR_UNSUPPORTED, "input '%s' has %d dims (at most %d)", name, ndim,
                        PP_MAX_DIMS);
    int id;
    PP_TRY(add_value(g, name, PP_VALUE_INPUT, &id));
    pp_value *v = &g->values[id];
    v->dtype = dt;
    v->ndim = ndim;
    for (int i = 0; i < ndim && shape; i++) v->shape[i] = shape[i];
    PP_TRY(PP_GROW(g->inputs, g->cap_inputs, g->n_inputs));
    g->inputs[g->n_inputs++] = id;
    if (value_id) *value_id = id;
    return PP_OK;
}

pp_status pp_graph_add_initializer(pp_graph *g, const char *name, pp_value_kind kind,
                                   pp_tensor *data, int *value_id) {
    int id;
    pp_status s = add_value(g, name, kind, &id);
    if (s != PP_OK) {
        pp_tensor_free(data);
        return s;
    }
    pp_value *v = &g->values[id];
    v->data = data;
    v->dtype = data->dtype;
    v->ndim = data->ndim;
    for (int i = 0; i < data->ndim; i++) v->shape[i] = data->shape[i];
    if (value_id) *value_id = id;
    return PP_OK;
}

pp_status pp_graph_add_node(pp_graph *g, const char *op_type, const char *domain,
                            const char *name, int n_in, const int *in, int n_out,
                            const char *const *out_names, int *node_id) {
    if (n_in < 0 || n_out < 0) return pp_error(PP_ERR_INVALID, "negative arity");
    for (int i = 0; i < n_in; i++)
        if (in[i] < -1 || in[i] >= g->n_values)
            return pp_error(PP_ERR_INVALID, "%s node: input %d refers to no value", op_type, i);
    PP_TRY(PP_GROW(g->nodes, g->cap_nodes, g->n_nodes));
    int nid = g->n_nodes;
    pp_node *n = &g->nodes[nid];
    memset(n, 0, sizeof *n);
    n->stage = -1;
    n->op_type = dup_str(op_type);
    n->domain = dup_str(domain ? domain : "");
    n->name = dup_str(name ? name : pp_graph_unique_name(g, op_type));
    n->in = malloc(sizeof(int) * (size_t)(n_in ? n_in : 1));
    n->out = malloc(sizeof(int) * (size_t)(n_out ? n_out : 1));
    g->n_nodes++;
    if (!n->op_type || !n->domain || !n->name || !n->in || !n->out)
        return pp_error(PP_ERR_NOMEM, "out of memory adding a node");
    n->n_in = n_in;
    for (int i = 0; i < n_in; i++) n->in[i] = in[i];
    n->n_out = 0;
    for (int i = 0; i < n_out; i++) {
        const char *oname = out_names ? out_names[i] : NULL;
        if (oname && !oname[0]) {
            g->nodes[nid].out[g->nodes[nid].n_out++] = -1;
            continue;
        }
        char buf[512];
        if (!oname) {
            snprintf(buf, sizeof buf, "%s_out%d", g->nodes[nid].name, i);
            oname = index_lookup(g, buf) >= 0 ? pp_graph_unique_name(g, buf) : buf;
        }
        int vid;
        PP_TRY(add_value(g, oname, PP_VALUE_NODE, &vid));
        g->values[vid].producer = nid;
        g->values[vid].producer_output = i;
        g->nodes[nid].out[g->nodes[nid].n_out++] = vid;
    }
    if (node_id) *node_id = nid;
    return PP_OK;
}

pp_status pp_node_add_output(pp_graph *g, int node, int k, int *value_id) {
    if (node < 0 || node >= g->n_nodes || k < 0 || k >= 64)
        return pp_error(PP_ERR_INVALID, "no node %d or output %d", node, k);
    pp_node *n = &g->nodes[node];
    if (k < n->n_out && n->out[k] >= 0) {
        if (value_id) *value_id = n->out[k];
        return PP_OK;
    }
    if (k >= n->n_out) {
        int *grown = realloc(n->out, sizeof(int) * (size_t)(k + 1));
        if (!grown) return pp_error(PP_ERR_NOMEM, "out of memory adding an output");
        n->out = grown;
        for (int i = n->n_out; i <= k; i++) n->out[i] = -1;
        n->n_out = k + 1;
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%s_out%d", n->name, k);
    const char *oname = index_lookup(g, buf) >= 0 ? pp_graph_unique_name(g, buf) : buf;
    int vid;
    PP_TRY(add_value(g, oname, PP_VALUE_NODE, &vid));
    g->values[vid].producer = node;
    g->values[vid].producer_output = k;
    g->nodes[node].out[k] = vid;
    if (value_id) *value_id = vid;
    return PP_OK;
}

pp_status pp_graph_add_output(pp_graph *g, int value_id) {
    if (value_id < 0 || value_id >= g->n_values)
        return pp_error(PP_ERR_INVALID, "graph output refers to no value");
    PP_TRY(PP_GROW(g->outputs, g->cap_outputs, g->n_outputs));
    g->outputs[g->n_outputs++] = value_id;
    return PP_OK;
}

pp_status pp_node_add_attr(pp_graph *g, int node, pp_attr *attr) {
    pp_node *n = &g->nodes[node];
    pp_status s = PP_GROW_EXACT(n->attrs, n->n_attr);
    if (s != PP_OK) {
        pp_attr_clear(attr);
        return s;
    }
    pp_attr *a = n->attrs;
    /* A later attribute of the same name replaces the earlier one. */
    for (int i = 0; i < n->n_attr; i++)
        if (strcmp(a[i].name, attr->name) == 0) {
            pp_attr_clear(&a[i]);
            a[i] = *attr;
            return PP_OK;
        }
    a[n->n_attr++] = *attr;
    return PP_OK;
}

static pp_status new_attr(const char *name, pp_attr_type type, pp_attr *a) {
    memset(a, 0, sizeof *a);
    a->name = dup_str(name);
    a->type = type;
    return a->name ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
}

pp_status pp_node_set_int(pp_graph *g, int node, const char *name, int64_t v) {
    pp_attr a;
    PP_TRY(new_attr(name, PP_ATTR_INT, &a));
    a.i = v;
    return pp_node_add_attr(g, node, &a);
}

pp_status pp_node_set_float(pp_graph *g, int node, const char *name, float v) {
    pp_attr a;
    PP_TRY(new_attr(name, PP_ATTR_FLOAT, &a));
    a.f = v;
    return pp_node_add_attr(g, node, &a);
}

pp_status pp_node_set_string(pp_graph *g, int node, const char *name, const char *v) {
    pp_attr a;
    PP_TRY(new_attr(name, PP_ATTR_STRING, &a));
    a.s = dup_str(v);
    return pp_node_add_attr(g, node, &a);
}

pp_status pp_node_set_ints(pp_graph *g, int node, const char *name, int n, const int64_t *v) {
    pp_attr a;
    PP_TRY(new_attr(name, PP_ATTR_INTS, &a));
    a.n = n;
    a.ints = malloc(sizeof *a.ints * (size_t)(n ? n : 1));
    if (!a.ints) {
        pp_attr_clear(&a);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) a.ints[i] = v[i];
    return pp_node_add_attr(g, node, &a);
}

pp_status pp_node_set_floats(pp_graph *g, int node, const char *name, int n, const float *v) {
    pp_attr a;
    PP_TRY(new_attr(name, PP_ATTR_FLOATS, &a));
    a.n = n;
    a.floats = malloc(sizeof *a.floats * (size_t)(n ? n : 1));
    if (!a.floats) {
        pp_attr_clear(&a);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) a.floats[i] = v[i];
    return pp_node_add_attr(g, node, &a);
}

pp_status pp_node_set_tensor(pp_graph *g, int node, const char *name, pp_tensor *t) {
    pp_attr a;
    pp_status s = new_attr(name, PP_ATTR_TENSOR, &a);
    if (s != PP_OK) {
        pp_tensor_free(t);
        return s;
    }
    a.t = t;
    return pp_node_add_attr(g, node, &a);
}

pp_status pp_attr_clone(const pp_attr *src, pp_attr *dst) {
    memset(dst, 0, sizeof *dst);
    *dst = *src;
    dst->name = dup_str(src->name);
    dst->s = dup_str(src->s);
    dst->t = pp_tensor_retain(src->t); /* attribute tensors are never written */
    dst->ints = NULL;
    dst->floats = NULL;
    dst->strings = NULL;
    int ok = dst->name && (!src->s || dst->s);
    if (ok && src->ints) {
        dst->ints = malloc(sizeof *dst->ints * (size_t)(src->n ? src->n : 1));
        if ((ok = dst->ints != NULL)) memcpy(dst->ints, src->ints, sizeof *dst->ints * (size_t)src->n);
    }
    if (ok && src->floats) {
        dst->floats = malloc(sizeof *dst->floats * (size_t)(src->n ? src->n : 1));
        if ((ok = dst->floats != NULL)) memcpy(dst->floats, src->floats, sizeof *dst->floats * (size_t)src->n);
    }
    if (ok && src->strings) {
        dst->strings = calloc((size_t)(src->n ? src->n : 1), sizeof(char *));
        ok = dst->strings != NULL;
        for (int i = 0; ok && i < src->n; i++) ok = (dst->strings[i] = dup_str(src->strings[i])) != NULL;
    }
    if (!ok) {
        pp_attr_clear(dst);
        return pp_error(PP_ERR_NOMEM, "out of memory copying attribute");
    }
    return PP_OK;
}

pp_status pp_graph_copy_node(pp_graph *dst, const pp_graph *src, int node, const int *in_map,
                             int *new_node) {
    const pp_node *n = &src->nodes[node];
    const char *names[64];
    if (n->n_out > 64) return pp_node_error(n, PP_ERR_UNSUPPORTED, "more than 64 outputs");
    for (int k = 0; k < n->n_out; k++) names[k] = n->out[k] >= 0 ? src->values[n->out[k]].name : "";
    int nid;
    PP_TRY(pp_graph_add_node(dst, n->op_type, n->domain, n->name, n->n_in, in_map, n->n_out, names, &nid));
    dst->nodes[nid].region = n->region;
    for (int a = 0; a < n->n_attr; a++) {
        pp_attr copy;
        PP_TRY(pp_attr_clone(&n->attrs[a], &copy));
        PP_TRY(pp_node_add_attr(dst, nid, &copy));
    }
    for (int k = 0; k < n->n_out; k++) {
        int sv = n->out[k], dv = dst->nodes[nid].out[k];
        if (sv < 0 || dv < 0) continue;
        dst->values[dv].dtype = src->values[sv].dtype;
        dst->values[dv].ndim = src->values[sv].ndim;
        memcpy(dst->values[dv].shape, src->values[sv].shape, sizeof dst->values[dv].shape);
        for (int d = 0; d < PP_MAX_DIMS; d++)
            if (src->values[sv].dim_names[d]) dst->values[dv].dim_names[d] = dup_str(src->values[sv].dim_names[d]);
    }
    if (new_node) *new_node = nid;
    return PP_OK;
}

const pp_attr *pp_node_attr(const pp_node *n, const char *name) {
    for (int i = 0; i < n->n_attr; i++)
        if (strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
    return NULL;
}

int64_t pp_node_attr_int(const pp_node *n, const char *name, int64_t def) {
    const pp_attr *a = pp_node_attr(n, name);
    return a && a->type == PP_ATTR_INT ? a->i : def;
}

float pp_node_attr_float(const pp_node *n, const char *name, float def) {
    const pp_attr *a = pp_node_attr(n, name);
    if (a && a->type == PP_ATTR_FLOAT) return a->f;
    if (a && a->type == PP_ATTR_INT) return (float)a->i;
    return def;
}

const char *pp_node_attr_string(const pp_node *n, const char *name, const char *def) {
    const pp_attr *a = pp_node_attr(n, name);
    return a && a->type == PP_ATTR_STRING && a->s ? a->s : def;
}

int pp_node_attr_ints(const pp_node *n, const char *name, const int64_t **vals) {
    const pp_attr *a = pp_node_attr(n, name);
    if (!a || a->type != PP_ATTR_INTS) return -1;
    if (vals) *vals = a->ints;
    return a->n;
}

pp_status pp_graph_resolve(pp_graph *g) {
    char label[512];
    for (int i = 0; i < g->n_nodes; i++) {
        pp_node *n = &g->nodes[i];
        if (n->op) continue;
        const pp_op *op = pp_op_find(n->domain, n->op_type);
        if (!op)
            return pp_error(PP_ERR_UNSUPPORTED, "%s: unsupported op '%s%s%s'",
                            pp_node_label(n, label, sizeof label), n->domain[0] ? n->domain : "",
                            n->domain[0] ? "::" : "", n->op_type);
        int last_in = n->n_in;
        while (last_in > 0 && n->in[last_in - 1] < 0) last_in--;
        if (last_in < op->min_in || n->n_in > op->max_in)
            return pp_node_error(n, PP_ERR_INVALID, "has %d inputs; %s takes %d to %d", n->n_in,
                                 op->name, op->min_in, op->max_in);
        if (n->n_out < op->min_out || n->n_out > op->max_out)
            return pp_node_error(n, PP_ERR_INVALID, "has %d outputs; %s gives %d to %d", n->n_out,
                                 op->name, op->min_out, op->max_out);
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            if (v < 0) continue;
            int p = g->values[v].producer;
            if (g->values[v].kind == PP_VALUE_NODE && p >= i)
                return pp_node_error(n, PP_ERR_INVALID,
                                     "input '%s' is used before the node that makes it",
                                     g->values[v].name);
        }
        for (int a = 0; a < n->n_attr; a++)
            if (n->attrs[a].type == PP_ATTR_GRAPH)
                return pp_node_error(n, PP_ERR_UNSUPPORTED,
                                     "attribute '%s' holds a subgraph (control flow is not "
                                     "supported)", n->attrs[a].name);
        if (op->check) PP_TRY(op->check(g, n));
        n->op = op;
    }
    return PP_OK;
}

void pp_graph_param_stats(const pp_graph *g, int64_t *count, int64_t *bytes) {
    int64_t c = 0, b = 0;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].kind == PP_VALUE_PARAM && g->values[i].data) {
            c += pp_tensor_numel(g->values[i].data);
            b += (int64_t)g->values[i].data->nbytes;
        }
    if (count) *count = c;
    if (bytes) *bytes = b;
}

int pp_graph_is_frozen(const pp_graph *g, int v) {
    const pp_value *val = &g->values[v];
    /* initializers only: a Constant node's output has a producer */
    return val->kind == PP_VALUE_CONST && val->data && val->producer < 0 && pp_dtype_is_float(val->data->dtype);
}

void pp_graph_frozen_stats(const pp_graph *g, int64_t *count, int64_t *bytes) {
    int64_t c = 0, b = 0;
    for (int i = 0; i < g->n_values; i++)
        if (pp_graph_is_frozen(g, i)) {
            c += pp_tensor_numel(g->values[i].data);
            b += (int64_t)g->values[i].data->nbytes;
        }
    if (count) *count = c;
    if (bytes) *bytes = b;
}

int pp_graph_freeze(pp_graph *g, const char *pattern) {
    int n = 0;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].kind == PP_VALUE_PARAM && fnmatch(pattern, g->values[i].name, 0) == 0) {
            g->values[i].kind = PP_VALUE_CONST;
            n++;
        }
    return n;
}

int pp_graph_identity_markers(pp_graph *g, const char *pattern) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        pp_node *nd = &g->nodes[i];
        if (strcmp(nd->op_type, "Identity") != 0 || nd->domain[0] || nd->n_in != 1 || nd->n_out != 1) continue;
        const char *out = nd->out[0] >= 0 ? g->values[nd->out[0]].name : "";
        if (fnmatch(pattern, nd->name ? nd->name : "", 0) != 0 && fnmatch(pattern, out, 0) != 0) continue;
        char *op = strdup("PipeSplit"), *dom = strdup("pippin");
        if (!op || !dom) { /* out of memory: the node stays an Identity */
            free(op);
            free(dom);
            continue;
        }
        free(nd->op_type);
        free(nd->domain);
        nd->op_type = op, nd->domain = dom;
        nd->op = pp_op_find(dom, op);
        n++;
    }
    return n;
}

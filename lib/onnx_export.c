/* pp_graph -> ONNX model file. The messages point into the graph's own
 * memory (no copies); only the arrays of pointers are allocated here. */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grow.h"
#include "onnx.pb-c.h"
#include "onnx_external.h"
#include "onnx_functions.h"
#include "onnx_tensor.h"
#include "pippin/onnx.h"

#include "status_internal.h"
/* Everything allocated while building the message, freed in one go. */
typedef struct {
    void **ptrs;
    int n, cap;
    int failed;
} arena;

static void *arena_alloc(arena *a, size_t size) {
    if (a->failed) return NULL;
    if (PP_GROW(a->ptrs, a->cap, a->n) != PP_OK) {
        a->failed = 1;
        return NULL;
    }
    void *m = calloc(1, size ? size : 1);
    if (!m) {
        a->failed = 1;
        return NULL;
    }
    a->ptrs[a->n++] = m;
    return m;
}

static void arena_free(arena *a) {
    for (int i = 0; i < a->n; i++) free(a->ptrs[i]);
    free(a->ptrs);
}

static const char *region_doc(pp_region r) {
    switch (r) {
    case PP_REGION_BACKWARD_INPUT: return "pippin.region=I";
    case PP_REGION_BACKWARD_WEIGHT: return "pippin.region=W";
    default: return NULL;
    }
}

static Onnx__ValueInfoProto *value_info(arena *a, const pp_value *v) {
    Onnx__ValueInfoProto *vi = arena_alloc(a, sizeof *vi);
    Onnx__TypeProto *tp = arena_alloc(a, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = arena_alloc(a, sizeof *tt);
    if (!vi || !tp || !tt) return NULL;
    onnx__value_info_proto__init(vi);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    vi->name = v->name;
    vi->type = tp;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    if (v->dtype != PP_DTYPE_UNDEFINED) {
        tt->has_elem_type = 1;
        tt->elem_type = (int32_t)v->dtype;
    }
    if (v->ndim >= 0) {
        Onnx__TensorShapeProto *sp = arena_alloc(a, sizeof *sp);
        Onnx__TensorShapeProto__Dimension **dims = arena_alloc(a, sizeof *dims * (size_t)(v->ndim + 1));
        if (!sp || !dims) return NULL;
        onnx__tensor_shape_proto__init(sp);
        sp->n_dim = (size_t)v->ndim;
        sp->dim = dims;
        for (int d = 0; d < v->ndim; d++) {
            dims[d] = arena_alloc(a, sizeof **dims);
            if (!dims[d]) return NULL;
            onnx__tensor_shape_proto__dimension__init(dims[d]);
            if (v->dim_names[d]) {
                dims[d]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
                dims[d]->dim_param = v->dim_names[d];
            } else if (v->shape[d] >= 0) {
                dims[d]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
                dims[d]->dim_value = v->shape[d];
            }
        }
        tt->shape = sp;
    }
    return vi;
}

static Onnx__AttributeProto *attr_proto(arena *a, const pp_attr *at) {
    Onnx__AttributeProto *ap = arena_alloc(a, sizeof *ap);
    if (!ap) return NULL;
    onnx__attribute_proto__init(ap);
    ap->name = at->name;
    ap->has_type = 1;
    ap->type = (Onnx__AttributeProto__AttributeType)at->type;
    switch (at->type) {
    case PP_ATTR_FLOAT: ap->has_f = 1; ap->f = at->f; break;
    case PP_ATTR_INT: ap->has_i = 1; ap->i = at->i; break;
    case PP_ATTR_STRING:
        ap->has_s = 1;
        ap->s.data = (uint8_t *)at->s;
        ap->s.len = at->s ? strlen(at->s) : 0;
        break;
    case PP_ATTR_TENSOR:
        ap->t = arena_alloc(a, sizeof *ap->t);
        if (!ap->t) return NULL;
        onnx__tensor_proto__init(ap->t);
        pp_onnx_tensor_to_proto(at->t, NULL, ap->t);
        break;
    case PP_ATTR_FLOATS: ap->n_floats = (size_t)at->n; ap->floats = at->floats; break;
    case PP_ATTR_INTS: ap->n_ints = (size_t)at->n; ap->ints = at->ints; break;
    case PP_ATTR_STRINGS:
        ap->n_strings = (size_t)at->n;
        ap->strings = arena_alloc(a, sizeof *ap->strings * (size_t)(at->n + 1));
        if (!ap->strings) return NULL;
        for (int i = 0; i < at->n; i++) {
            ap->strings[i].data = (uint8_t *)at->strings[i];
            ap->strings[i].len = strlen(at->strings[i]);
        }
        break;
    default: return NULL;
    }
    return ap;
}

static char empty_name[] = "";
static char absent_name[] = PP_ONNX_ABSENT;

static int is_pippin_node(const pp_node *n) { return n->domain && strcmp(n->domain, "pippin") == 0; }

/* in_fill: the name of inputs the node lacks up to pp_onnx_node_inputs (see
 * zero_bias), else "" (absent). */
static Onnx__NodeProto *node_proto(arena *a, const pp_graph *g, const pp_node *n, char *in_fill) {
    Onnx__NodeProto *np = arena_alloc(a, sizeof *np);
    if (!np) return NULL;
    onnx__node_proto__init(np);
    np->name = n->name;
    np->op_type = n->op_type;
    np->domain = n->domain && n->domain[0] ? n->domain : NULL;
    np->doc_string = (char *)region_doc(n->region);
    int n_in = pp_onnx_node_inputs(n); /* a function's trailing inputs written too */
    np->n_input = (size_t)n_in;
    np->input = arena_alloc(a, sizeof(char *) * (size_t)(n_in + 1));
    np->n_output = (size_t)n->n_out;
    np->output = arena_alloc(a, sizeof(char *) * (size_t)(n->n_out + 1));
    np->n_attribute = (size_t)n->n_attr;
    np->attribute = arena_alloc(a, sizeof(void *) * (size_t)(n->n_attr + 1));
    if (!np->input || !np->output || !np->attribute) return NULL;
    /* a function call's absent inputs: PP_ONNX_ABSENT (onnx_functions.h) */
    char *absent = is_pippin_node(n) ? absent_name : empty_name;
    for (int i = 0; i < n_in; i++)
        np->input[i] = i < n->n_in ? (n->in[i] >= 0 ? g->values[n->in[i]].name : absent) : in_fill;
    for (int i = 0; i < n->n_out; i++)
        np->output[i] = n->out[i] >= 0 ? g->values[n->out[i]].name : empty_name;
    for (int i = 0; i < n->n_attr; i++) {
        if (n->attrs[i].type == PP_ATTR_GRAPH) return NULL;
        if (!(np->attribute[i] = attr_proto(a, &n->attrs[i]))) return NULL;
    }
    return np;
}

/* The zeros pippin::MatMulAdd without a bias is written with (named
 * "<its output>/pippin_zero_bias", [N] float32): its ONNX function takes
 * three inputs, and onnx.checker's shape inference refuses an absent one.
 * Read back, the node adds zeros: the same bits. */
/* The bias length N of MatMulAdd node n from its weight's shape (or its
 * packed_n); -1 when unknown (then the input is written absent: ONNX
 * Runtime still runs it). */
static int64_t bias_len(const pp_graph *g, const pp_node *n) {
    if (n->n_in < 2 || n->in[1] < 0 || n->n_out < 1 || n->out[0] < 0) return -1;
    int64_t packed_n = pp_node_attr_int(n, "packed_n", 0); /* B is pippin::PackWeight's panels */
    if (packed_n > 0) return packed_n;
    const pp_value *w = &g->values[n->in[1]];
    const int64_t *ws = w->data ? w->data->shape : w->shape;
    int nd = w->data ? w->data->ndim : w->ndim;
    if (nd != 2 || ws[0] < 0 || ws[1] < 0) return -1;
    return pp_node_attr_int(n, "transB", 0) ? ws[0] : ws[1];
}

/* NULL: out of memory. */
static Onnx__TensorProto *zero_bias(arena *a, const pp_graph *g, const pp_node *n, int64_t N) {
    const char *out = g->values[n->out[0]].name;
    Onnx__TensorProto *tp = arena_alloc(a, sizeof *tp);
    int64_t *dims = arena_alloc(a, sizeof *dims);
    char *name = arena_alloc(a, strlen(out) + sizeof "/pippin_zero_bias");
    void *zeros = arena_alloc(a, (size_t)N * sizeof(float) + 1);
    if (!tp || !dims || !name || !zeros) return NULL;
    memset(zeros, 0, (size_t)N * sizeof(float));
    onnx__tensor_proto__init(tp);
    sprintf(name, "%s/pippin_zero_bias", out);
    dims[0] = N;
    tp->n_dims = 1;
    tp->dims = dims;
    tp->has_data_type = 1;
    tp->data_type = (int32_t)PP_F32;
    tp->name = name;
    tp->has_raw_data = 1;
    tp->raw_data.len = (size_t)N * sizeof(float);
    tp->raw_data.data = zeros;
    return tp;
}

/* PP_ONNX_TRAINABLE_KEY: the names of the parameters that have data, as a
 * JSON list (arena-owned copy). */
static Onnx__StringStringEntryProto *trainable_entry(arena *a, const pp_graph *g) {
    json_object *list = json_object_new_array();
    if (!list) return NULL;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == PP_VALUE_PARAM && g->values[v].data &&
            json_object_array_add(list, json_object_new_string(g->values[v].name)) != 0) {
            json_object_put(list);
            return NULL;
        }
    const char *text = json_object_to_json_string_ext(list, JSON_C_TO_STRING_PLAIN);
    Onnx__StringStringEntryProto *e = arena_alloc(a, sizeof *e);
    char *copy = text ? arena_alloc(a, strlen(text) + 1) : NULL;
    if (e && copy) {
        onnx__string_string_entry_proto__init(e);
        strcpy(copy, text);
        e->key = (char *)PP_ONNX_TRAINABLE_KEY;
        e->value = copy;
    }
    json_object_put(list);
    return copy ? e : NULL;
}

static void *arena_cb(void *ctx, size_t size) { return arena_alloc(ctx, size); }

static pp_status build_model(arena *a, const pp_graph *g, Onnx__ModelProto *m) {
    Onnx__GraphProto *gp = arena_alloc(a, sizeof *gp);
    Onnx__OperatorSetIdProto *ops[2] = {arena_alloc(a, sizeof *ops[0]), arena_alloc(a, sizeof *ops[1])};
    Onnx__OperatorSetIdProto **opset = arena_alloc(a, sizeof *opset * 2);
    if (!gp || !ops[0] || !ops[1] || !opset) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    onnx__model_proto__init(m);
    onnx__graph_proto__init(gp);
    m->has_ir_version = 1;
    m->ir_version = 8;
    m->producer_name = (char *)"pippin";
    m->graph = gp;
    for (int i = 0; i < 2; i++) {
        onnx__operator_set_id_proto__init(ops[i]);
        ops[i]->has_version = 1;
        opset[i] = ops[i];
    }
    ops[0]->domain = empty_name;
    ops[0]->version = g->opset;
    ops[1]->domain = (char *)"pippin";
    ops[1]->version = 1;
    m->n_opset_import = 2;
    m->opset_import = opset;
    Onnx__StringStringEntryProto **meta = arena_alloc(a, sizeof *meta);
    if (!meta || !(meta[0] = trainable_entry(a, g))) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    m->n_metadata_props = 1;
    m->metadata_props = meta;
    gp->name = g->name;

    gp->node = arena_alloc(a, sizeof(void *) * (size_t)(g->n_nodes + 1));
    gp->initializer = arena_alloc(a, sizeof(void *) * (size_t)(g->n_values + g->n_nodes + 1));
    gp->input = arena_alloc(a, sizeof(void *) * (size_t)(g->n_inputs + 1));
    gp->output = arena_alloc(a, sizeof(void *) * (size_t)(g->n_outputs + 1));
    if (!gp->node || !gp->initializer || !gp->input || !gp->output)
        return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    for (int i = 0; i < g->n_nodes; i++) {
        char *fill = empty_name;
        int64_t N = pp_onnx_node_inputs(&g->nodes[i]) > g->nodes[i].n_in ? bias_len(g, &g->nodes[i]) : -1;
        if (N >= 0) {
            Onnx__TensorProto *zb = zero_bias(a, g, &g->nodes[i], N);
            if (!zb) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
            gp->initializer[gp->n_initializer++] = zb;
            fill = zb->name;
        }
        gp->node[gp->n_node] = node_proto(a, g, &g->nodes[i], fill);
        if (!gp->node[gp->n_node++])
            return pp_error(a->failed ? PP_ERR_NOMEM : PP_ERR_UNSUPPORTED,
                            "node '%s': cannot be exported", g->nodes[i].name);
    }
    /* the empty tensor that pippin nodes' absent inputs name, if any */
    int any_absent = 0;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in && is_pippin_node(&g->nodes[i]); k++)
            any_absent |= g->nodes[i].in[k] < 0;
    if (any_absent) {
        Onnx__TensorProto *tp = arena_alloc(a, sizeof *tp);
        int64_t *dims = arena_alloc(a, sizeof *dims);
        if (!tp || !dims) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
        onnx__tensor_proto__init(tp);
        tp->name = absent_name;
        tp->n_dims = 1;
        tp->dims = dims; /* [0] */
        tp->has_data_type = 1;
        tp->data_type = (int32_t)PP_F32;
        gp->initializer[gp->n_initializer++] = tp;
    }
    /* a constant no node reads and no output names (what folding left) is
     * not written: ONNX Runtime warns of each; parameters always are */
    uint8_t *read = arena_alloc(a, (size_t)g->n_values + 1);
    if (!read) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    memset(read, 0, (size_t)g->n_values + 1);
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] >= 0) read[g->nodes[i].in[k]] = 1;
    for (int i = 0; i < g->n_outputs; i++) read[g->outputs[i]] = 1;
    for (int v = 0; v < g->n_values; v++) {
        const pp_value *val = &g->values[v];
        if ((val->kind != PP_VALUE_PARAM && val->kind != PP_VALUE_CONST) || !val->data) continue;
        if (val->kind == PP_VALUE_CONST && !read[v]) continue;
        Onnx__TensorProto *tp = arena_alloc(a, sizeof *tp);
        if (!tp) return pp_error(PP_ERR_NOMEM, "out of memory exporting");
        onnx__tensor_proto__init(tp);
        pp_onnx_tensor_to_proto(val->data, val->name, tp);
        gp->initializer[gp->n_initializer++] = tp;
    }
    for (int i = 0; i < g->n_inputs; i++)
        if (!(gp->input[gp->n_input++] = value_info(a, &g->values[g->inputs[i]])))
            return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    for (int i = 0; i < g->n_outputs; i++)
        if (!(gp->output[gp->n_output++] = value_info(a, &g->values[g->outputs[i]])))
            return pp_error(PP_ERR_NOMEM, "out of memory exporting");
    /* pippin's own ops as model-local functions, so other tools load the file */
    return pp_onnx_functions(g, g->opset, arena_cb, a, gp->node, &m->functions, &m->n_functions);
}

/* protobuf-c's output that appends to a file (what it packs goes out as
 * it is packed; the weights' bytes straight from their tensors). */
typedef struct file_sink {
    ProtobufCBuffer base;
    FILE *f;
    int failed;
} file_sink;

static void file_append(ProtobufCBuffer *buffer, size_t len, const uint8_t *data) {
    file_sink *sink = (file_sink *)buffer;
    if (!sink->failed && len && fwrite(data, 1, len, sink->f) != len) sink->failed = 1;
}

void pp_onnx_save_options_init(pp_onnx_save_options *o) {
    memset(o, 0, sizeof *o);
    o->external_data = PP_ONNX_EXTERNAL_AUTO;
    o->external_min_bytes = 1024;
}

pp_status pp_onnx_save(const pp_graph *g, const char *path) { return pp_onnx_save_with(g, path, NULL); }

pp_status pp_onnx_save_with(const pp_graph *g, const char *path, const pp_onnx_save_options *o) {
    pp_onnx_save_options defaults;
    if (!o) {
        pp_onnx_save_options_init(&defaults);
        o = &defaults;
    }
    if (o->external_data != PP_ONNX_EXTERNAL_AUTO && o->external_data != PP_ONNX_EXTERNAL_ALWAYS &&
        o->external_data != PP_ONNX_EXTERNAL_NEVER)
        return pp_error(PP_ERR_INVALID, "%s: unknown external data mode %d", path, (int)o->external_data);
    arena a = {0};
    Onnx__ModelProto m;
    pp_atomic_file data = {0}, model = {0};
    int moved = 0;
    pp_status s = build_model(&a, g, &m);
    size_t len = 0;
    if (s == PP_OK) {
        len = onnx__model_proto__get_packed_size(&m);
        if (o->external_data == PP_ONNX_EXTERNAL_ALWAYS ||
            (o->external_data == PP_ONNX_EXTERNAL_AUTO && len > PP_ONNX_EXTERNAL_THRESHOLD)) {
            s = pp_onnx_ext_write(&m, path, o->external_min_bytes, arena_cb, &a, &data, &moved);
            len = onnx__model_proto__get_packed_size(&m);
        }
    }
    if (s == PP_OK && len >= (size_t)INT32_MAX)
        s = pp_error(PP_ERR_UNSUPPORTED, "%s: model over 2 GiB%s", path,
                     moved ? " even with its initializers in external data" : " (save it with external data)");
    if (s == PP_OK) s = pp_atomic_open(path, &model);
    if (s == PP_OK) { /* packed straight into the file: no copy of the weights in memory */
        file_sink sink = {{file_append}, model.f, 0};
        if (onnx__model_proto__pack_to_buffer(&m, &sink.base) != len || sink.failed)
            s = pp_error(PP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    arena_free(&a);
    /* Both files are on disk before either is renamed, so a failure leaves
     * the old pair; the side file goes first (the new model needs it). */
    if (s == PP_OK && moved && (fflush(model.f) != 0 || fsync(fileno(model.f)) != 0))
        s = pp_error(PP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (s == PP_OK && moved) s = pp_atomic_commit(&data);
    if (s == PP_OK) s = pp_atomic_commit(&model);
    pp_atomic_discard(&data);
    pp_atomic_discard(&model);
    return s;
}

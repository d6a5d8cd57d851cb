/* ONNX model -> pp_graph. Decoding is done by protobuf-c from the system's
 * onnx.proto; this file maps the messages onto the IR and checks them. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "onnx.pb-c.h"
#include "file_io.h"
#include "onnx_deferred.h"
#include "onnx_external.h"
#include "onnx_tensor.h"
#include "pippin/log.h"
#include "pippin/onnx.h"
#include "onnx_functions.h"
#include "onnx_upgrade.h"
#include "onnx_wire.h"
#include "op.h"

#include "status_internal.h"
#include "log_internal.h"
/* protobuf messages are limited to 2 GiB */
#define PP_ONNX_MAX_BYTES ((size_t)2 << 30)

static pp_status convert_attr(const Onnx__AttributeProto *ap, const char *where, pp_attr *a) {
    memset(a, 0, sizeof *a);
    if (!ap->name) return pp_error(PP_ERR_PARSE, "%s: attribute without a name", where);
    if (ap->ref_attr_name)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: attribute '%s' refers to a function attribute",
                        where, ap->name);
    a->name = strdup(ap->name);
    if (!a->name) return pp_error(PP_ERR_NOMEM, "out of memory");
    a->type = (pp_attr_type)ap->type;
    switch (ap->type) {
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT: a->f = ap->f; break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT: a->i = ap->i; break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING:
        a->s = malloc(ap->s.len + 1);
        if (!a->s) return pp_error(PP_ERR_NOMEM, "out of memory");
        if (ap->s.len) memcpy(a->s, ap->s.data, ap->s.len);
        a->s[ap->s.len] = '\0';
        break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR: {
        if (!ap->t) return pp_error(PP_ERR_PARSE, "%s: attribute '%s' has no tensor", where, ap->name);
        char what[1200];
        snprintf(what, sizeof what, "%s: attribute '%s'", where, ap->name);
        PP_TRY(pp_onnx_tensor_from_proto(ap->t, what, &a->t));
        break;
    }
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS:
        a->n = (int)ap->n_floats;
        a->floats = malloc(sizeof(float) * (ap->n_floats ? ap->n_floats : 1));
        if (!a->floats) return pp_error(PP_ERR_NOMEM, "out of memory");
        if (ap->n_floats) memcpy(a->floats, ap->floats, sizeof(float) * ap->n_floats);
        break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS:
        a->n = (int)ap->n_ints;
        a->ints = malloc(sizeof(int64_t) * (ap->n_ints ? ap->n_ints : 1));
        if (!a->ints) return pp_error(PP_ERR_NOMEM, "out of memory");
        if (ap->n_ints) memcpy(a->ints, ap->ints, sizeof(int64_t) * ap->n_ints);
        break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS:
        a->n = (int)ap->n_strings;
        a->strings = calloc(ap->n_strings ? ap->n_strings : 1, sizeof(char *));
        if (!a->strings) return pp_error(PP_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < ap->n_strings; i++) {
            a->strings[i] = malloc(ap->strings[i].len + 1);
            if (!a->strings[i]) return pp_error(PP_ERR_NOMEM, "out of memory");
            if (ap->strings[i].len) memcpy(a->strings[i], ap->strings[i].data, ap->strings[i].len);
            a->strings[i][ap->strings[i].len] = '\0';
        }
        break;
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH:
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS:
        a->type = PP_ATTR_GRAPH; /* rejected by pp_graph_resolve with the node's name */
        break;
    default:
        return pp_error(PP_ERR_UNSUPPORTED, "%s: attribute '%s' has unsupported type %d", where,
                        ap->name, (int)ap->type);
    }
    return PP_OK;
}

/* Declared input types: tensor element type and shape with dim_params. */
static pp_status add_graph_input(pp_graph *g, const Onnx__ValueInfoProto *vi, const char *file) {
    if (!vi->name || !vi->name[0]) return pp_error(PP_ERR_PARSE, "%s: graph input without a name", file);
    pp_dtype dt = PP_DTYPE_UNDEFINED;
    int ndim = -1;
    int64_t shape[PP_MAX_DIMS];
    const char *dim_names[PP_MAX_DIMS] = {0};
    const Onnx__TypeProto *tp = vi->type;
    if (tp && tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE &&
        tp->value_case != ONNX__TYPE_PROTO__VALUE__NOT_SET)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: input '%s' is not a tensor", file, vi->name);
    if (tp && tp->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && tp->tensor_type) {
        const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
        if (tt->has_elem_type) {
            dt = (pp_dtype)tt->elem_type;
            if (!pp_dtype_is_valid(dt))
                return pp_error(PP_ERR_UNSUPPORTED, "%s: input '%s' has unsupported element type %d",
                                file, vi->name, tt->elem_type);
        }
        if (tt->shape) {
            if (tt->shape->n_dim > PP_MAX_DIMS)
                return pp_error(PP_ERR_UNSUPPORTED, "%s: input '%s' has %zu dims (at most %d)", file,
                                vi->name, tt->shape->n_dim, PP_MAX_DIMS);
            ndim = (int)tt->shape->n_dim;
            for (int d = 0; d < ndim; d++) {
                const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
                shape[d] = -1;
                if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
                    dim->dim_value >= 0)
                    shape[d] = dim->dim_value;
                else if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM)
                    dim_names[d] = dim->dim_param;
            }
        }
    }
    int id;
    PP_TRY(pp_graph_add_input(g, vi->name, dt, ndim, shape, &id));
    for (int d = 0; d < ndim; d++)
        if (dim_names[d]) g->values[id].dim_names[d] = strdup(dim_names[d]);
    return PP_OK;
}

/* A pippin-domain op type "op__k" names variant k of op's ONNX function
 * (lib/onnx_functions.h): the node is op. The base goes to buf. */
static const char *pippin_op(const Onnx__NodeProto *np, char *buf, size_t cap) {
    const char *op = np->op_type ? np->op_type : "";
    const char *cut = strstr(op, "__");
    if (!np->domain || strcmp(np->domain, "pippin") != 0 || !cut || cut == op || !cut[2] ||
        strspn(cut + 2, "0123456789") != strlen(cut + 2) || (size_t)(cut - op) >= cap)
        return op;
    memcpy(buf, op, (size_t)(cut - op));
    buf[cut - op] = '\0';
    return buf;
}

static pp_status add_node(pp_graph *g, const Onnx__NodeProto *np, int index, const char *file) {
    char where[768], op_buf[128];
    const char *op = pippin_op(np, op_buf, sizeof op_buf);
    snprintf(where, sizeof where, "%s: node '%s' (%s)", file,
             np->name && np->name[0] ? np->name : "(unnamed)", op);
    if (!op[0]) return pp_error(PP_ERR_PARSE, "%s: node %d has no op_type", file, index);
    if (np->n_input > 64 || np->n_output > 64)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: more than 64 inputs or outputs", where);
    int in[64];
    for (size_t i = 0; i < np->n_input; i++) {
        const char *name = np->input[i];
        in[i] = -1;
        if (!name || !name[0] || strcmp(name, PP_ONNX_ABSENT) == 0) continue;
        in[i] = pp_graph_find_value(g, name);
        if (in[i] < 0)
            return pp_error(PP_ERR_NOT_FOUND,
                            "%s: input '%s' is not defined by any earlier node, initializer or "
                            "graph input", where, name);
    }
    for (size_t i = 0; i < np->n_output; i++)
        if (np->output[i] && np->output[i][0] && pp_graph_find_value(g, np->output[i]) >= 0)
            return pp_error(PP_ERR_INVALID, "%s: output '%s' is already defined", where, np->output[i]);
    char name_buf[160];
    const char *name = np->name;
    if (!name || !name[0]) {
        snprintf(name_buf, sizeof name_buf, "%s_%d", op, index);
        name = name_buf;
    }
    int nid;
    pp_status s = pp_graph_add_node(g, op, np->domain ? np->domain : "", name, (int)np->n_input, in,
                                    (int)np->n_output, (const char *const *)np->output, &nid);
    if (s != PP_OK) return pp_error_context(s, "%s", where);
    /* Regions written by pp_onnx_save come back (training graphs round-trip). */
    if (np->doc_string && strcmp(np->doc_string, "pippin.region=I") == 0)
        g->nodes[nid].region = PP_REGION_BACKWARD_INPUT;
    else if (np->doc_string && strcmp(np->doc_string, "pippin.region=W") == 0)
        g->nodes[nid].region = PP_REGION_BACKWARD_WEIGHT;
    for (size_t a = 0; a < np->n_attribute; a++) {
        pp_attr attr;
        s = convert_attr(np->attribute[a], where, &attr);
        if (s != PP_OK) {
            pp_attr_clear(&attr);
            return s;
        }
        PP_TRY(pp_node_add_attr(g, nid, &attr));
    }
    return PP_OK;
}

static pp_status check_opsets(const Onnx__ModelProto *m, const char *file, int *opset) {
    *opset = 0;
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = m->opset_import[i];
        const char *d = o->domain ? o->domain : "";
        if (d[0] == '\0' || strcmp(d, "ai.onnx") == 0)
            *opset = o->version > 0 && o->version < 1000 ? (int)o->version : -1; /* never truncated into range */
    }
    if (*opset == 0) return pp_error(PP_ERR_UNSUPPORTED, "%s: no default-domain opset import", file);
    if (m->has_ir_version && m->ir_version > PP_IR_VERSION_MAX)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: IR version %lld is not supported (pippin reads up to %d)",
                        file, (long long)m->ir_version, PP_IR_VERSION_MAX);
    if (*opset < PP_OPSET_MIN || *opset > PP_OPSET_MAX)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: opset %d is not supported (pippin reads %d to %d)",
                        file, *opset, PP_OPSET_MIN, PP_OPSET_MAX);
    return PP_OK;
}

/* PyTorch's eval-mode export merges equal initializers into one plus
 * Identity nodes, silently tying separate parameters. */
static void warn_identity_params(const pp_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        if (strcmp(n->op_type, "Identity") != 0 || n->n_in != 1 || n->in[0] < 0) continue;
        const pp_value *src = &g->values[n->in[0]];
        if (src->kind == PP_VALUE_PARAM && n->n_out == 1 && n->out[0] >= 0)
            pp_warn("%s: '%s' is an Identity of parameter '%s': the exporter tied them (export "
                    "with training=TrainingMode.TRAINING to keep them separate)",
                    g->source ? g->source : g->name, g->values[n->out[0]].name, src->name);
    }
}

/* Keeps the declared type of a graph output (for inspect) when the value
 * has none of its own yet. */
static void record_declared_type(pp_value *v, const Onnx__ValueInfoProto *vi) {
    const Onnx__TypeProto *tp = vi->type;
    if (v->dtype != PP_DTYPE_UNDEFINED || !tp ||
        tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
        return;
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    if (tt->has_elem_type && pp_dtype_is_valid((pp_dtype)tt->elem_type)) v->dtype = (pp_dtype)tt->elem_type;
    if (!tt->shape || tt->shape->n_dim > PP_MAX_DIMS) return;
    v->ndim = (int)tt->shape->n_dim;
    for (int d = 0; d < v->ndim; d++) {
        const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
        v->shape[d] = -1;
        if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
            v->shape[d] = dim->dim_value;
        else if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                 dim->dim_param && !v->dim_names[d])
            v->dim_names[d] = strdup(dim->dim_param);
    }
}

/* The exporter's record of which initializers are trainable (torch's
 * named_parameters() with requires_grad): metadata PP_ONNX_TRAINABLE_KEY
 * holding a JSON list of names. *list stays NULL when the model has none
 * (a model from elsewhere: every float initializer is then trainable). */
static pp_status read_trainable(const Onnx__ModelProto *m, const char *file, json_object **list) {
    *list = NULL;
    for (size_t i = 0; i < m->n_metadata_props; i++) {
        const Onnx__StringStringEntryProto *e = m->metadata_props[i];
        if (!e->key || strcmp(e->key, PP_ONNX_TRAINABLE_KEY) != 0) continue;
        if (*list) {
            json_object_put(*list);
            *list = NULL;
            return pp_error(PP_ERR_PARSE, "%s: metadata '%s' appears twice", file, PP_ONNX_TRAINABLE_KEY);
        }
        json_object *j = e->value ? json_tokener_parse(e->value) : NULL;
        int ok = j && json_object_is_type(j, json_type_array);
        for (size_t k = 0; ok && k < json_object_array_length(j); k++)
            ok = json_object_is_type(json_object_array_get_idx(j, k), json_type_string);
        if (!ok) {
            json_object_put(j);
            return pp_error(PP_ERR_PARSE, "%s: metadata '%s' is not a JSON list of initializer names",
                            file, PP_ONNX_TRAINABLE_KEY);
        }
        *list = j;
    }
    return PP_OK;
}

static int listed(json_object *list, const char *name) {
    for (size_t k = 0; k < json_object_array_length(list); k++)
        if (strcmp(json_object_get_string(json_object_array_get_idx(list, k)), name) == 0) return 1;
    return 0;
}

/* Where a model was decoded from, for the raw_data its decoding left out
 * (onnx_wire.h): the file open as fd, which the payloads are read from
 * (pread) straight into their tensors, or (fd -1) bytes in memory. */
typedef struct model_src {
    const unsigned char *bytes;
    size_t len;
    int fd;
    pp_onnx_deferred *defer; /* non-NULL: parameters of 64 KiB and up (in the file or a side file) are left unread */
} model_src;

/* Initializer i of the model as a tensor; its raw_data from src when the
 * model was stripped. */
static pp_status load_initializer(const Onnx__TensorProto *tp, const char *what, const model_src *src,
                                  pp_onnx_ext *ext, int trains, pp_tensor **t) {
    size_t off = 0, n = 0;
    int stripped = src ? pp_onnx_wire_raw_data(tp, src->len, &off, &n) : 0;
    if (stripped < 0) return pp_error(PP_ERR_PARSE, "%s: raw_data record out of range", what);
    if (stripped && pp_onnx_ext_is_external(tp))
        return pp_error(PP_ERR_PARSE, "%s: holds data of its own besides its external data", what);
    /* only parameters: the optimizer and the gradient fusions read constants
     * (a causal mask), never a parameter's values */
    if (stripped && src->fd >= 0 && src->defer && trains && pp_onnx_tensor_may_defer(n)) {
        PP_TRY(pp_onnx_tensor_unread_raw(tp, what, n, t));
        pp_status s = pp_onnx_deferred_add(src->defer, tp->name, off, n);
        if (s != PP_OK) {
            pp_tensor_free(*t);
            *t = NULL;
        }
        return s;
    }
    if (stripped && src->fd >= 0) return pp_onnx_tensor_read_raw(tp, what, src->fd, off, n, t);
    if (stripped) {
        Onnx__TensorProto with_data = *tp;
        with_data.raw_data.data = (uint8_t *)(uintptr_t)(src->bytes + off);
        with_data.raw_data.len = n;
        return pp_onnx_tensor_from_proto(&with_data, what, t);
    }
    if (!pp_onnx_ext_is_external(tp)) return pp_onnx_tensor_from_proto(tp, what, t);
    if (!(src && src->fd >= 0 && src->defer && trains)) return pp_onnx_ext_load(ext, tp, what, t);
    /* a parameter in a side file: left unread like one in the model file,
     * its side file kept open by the record */
    pp_onnx_ext_where w;
    PP_TRY(pp_onnx_ext_locate(ext, tp, what, &w));
    if (!pp_onnx_tensor_may_defer(w.nbytes)) return pp_onnx_ext_load(ext, tp, what, t);
    PP_TRY(pp_onnx_tensor_unread_raw(tp, what, w.nbytes, t));
    pp_status s = pp_onnx_deferred_add_external(src->defer, tp->name, w.fd, w.path, w.offset, w.nbytes);
    if (s != PP_OK) {
        pp_tensor_free(*t);
        *t = NULL;
    }
    return s;
}

static pp_status build_graph(const Onnx__ModelProto *m, const char *file, const model_src *src, pp_onnx_ext *ext,
                             pp_graph **out) {
    const Onnx__GraphProto *gp = m->graph;
    if (!gp) return pp_error(PP_ERR_PARSE, "%s: model has no graph", file);
    int opset;
    PP_TRY(check_opsets(m, file, &opset));
    if (gp->n_sparse_initializer)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: sparse initializers are not supported", file);
    json_object *trainable;
    PP_TRY(read_trainable(m, file, &trainable));
    pp_graph *g;
    pp_status s = pp_graph_new(gp->name, &g);
    if (s != PP_OK) {
        json_object_put(trainable);
        return s;
    }
    g->opset = opset;
    g->source = strdup(file);
    for (size_t i = 0; i < gp->n_initializer && s == PP_OK; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        char what[600];
        if (!tp->name || !tp->name[0]) {
            s = pp_error(PP_ERR_PARSE, "%s: initializer %zu has no name", file, i);
            break;
        }
        if (strcmp(tp->name, PP_ONNX_ABSENT) == 0) continue; /* stands for an absent input */
        snprintf(what, sizeof what, "%s: initializer '%s'", file, tp->name);
        pp_tensor *t;
        int trains = pp_dtype_is_float((pp_dtype)tp->data_type) && (!trainable || listed(trainable, tp->name));
        s = load_initializer(tp, what, src, ext, trains, &t);
        if (s != PP_OK) break;
        pp_value_kind kind = trains ? PP_VALUE_PARAM : PP_VALUE_CONST;
        s = pp_graph_add_initializer(g, tp->name, kind, t, NULL);
        if (s != PP_OK) s = pp_error_context(s, "%s", file);
    }
    for (size_t i = 0; i < gp->n_input && s == PP_OK; i++) {
        /* Older exporters list initializers as inputs too. */
        if (gp->input[i]->name && pp_graph_find_value(g, gp->input[i]->name) >= 0) continue;
        s = add_graph_input(g, gp->input[i], file);
    }
    for (size_t i = 0; i < gp->n_node && s == PP_OK; i++) s = add_node(g, gp->node[i], (int)i, file);
    if (s == PP_OK) s = pp_onnx_upgrade(g, opset, file);
    for (size_t i = 0; i < gp->n_output && s == PP_OK; i++) {
        const char *name = gp->output[i]->name;
        int v = name ? pp_graph_find_value(g, name) : -1;
        if (v < 0) s = pp_error(PP_ERR_NOT_FOUND, "%s: graph output '%s' is never computed", file,
                                name ? name : "");
        else s = pp_graph_add_output(g, v);
        if (s == PP_OK) record_declared_type(&g->values[v], gp->output[i]);
    }
    json_object_put(trainable);
    if (s == PP_OK) {
        s = pp_graph_resolve(g);
        if (s != PP_OK) s = pp_error_context(s, "%s", file);
    }
    if (s != PP_OK) {
        pp_graph_free(g);
        return s;
    }
    warn_identity_params(g);
    *out = g;
    return PP_OK;
}

/* Payloads smaller than this are left to protobuf-c. */
#define STRIP_MIN_BYTES 64

/* base_dir: where external data is looked for; NULL refuses it. */
static pp_status parse_model(const model_src *src, const char *name, const char *base_dir, pp_graph **out) {
    *out = NULL;
    /* Decode the model without its weights, then read (or copy) each
     * weight once, into its tensor; a model the rewrite cannot walk is
     * decoded as it is (and fails there, or loads as it always did). */
    unsigned char *stripped = NULL, *whole = NULL;
    size_t stripped_len = 0;
    pp_status s = src->fd < 0 ? pp_onnx_wire_strip(src->bytes, src->len, STRIP_MIN_BYTES, &stripped, &stripped_len)
                              : pp_onnx_wire_strip_fd(src->fd, src->len, name, STRIP_MIN_BYTES, &stripped, &stripped_len);
    if (s == PP_ERR_NOMEM) return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    if (s == PP_ERR_IO) return s; /* the file was cut short */
    const unsigned char *bytes = src->bytes;
    if (s != PP_OK && src->fd >= 0) {
        pp_status r = (whole = malloc(src->len ? src->len : 1)) ? pp_read_at(src->fd, whole, src->len, 0, name)
                                                                : pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
        if (r != PP_OK) {
            free(whole);
            return r;
        }
        bytes = whole;
    }
    Onnx__ModelProto *m = s == PP_OK ? onnx__model_proto__unpack(NULL, stripped_len, stripped)
                                     : onnx__model_proto__unpack(NULL, src->len, bytes);
    free(stripped);
    free(whole);
    if (!m) return pp_error(PP_ERR_PARSE, "%s: not an ONNX model (protobuf decoding failed)", name);
    pp_onnx_ext *ext;
    const model_src *from = s == PP_OK ? src : NULL;
    s = pp_onnx_ext_open(base_dir, &ext);
    if (s == PP_OK) s = build_graph(m, name, from, ext, out);
    pp_onnx_ext_close(ext);
    onnx__model_proto__free_unpacked(m, NULL);
    return s;
}

pp_status pp_onnx_parse(const void *bytes, size_t len, const char *name, pp_graph **out) {
    model_src src = {bytes, len, -1, NULL};
    return parse_model(&src, name, NULL, out);
}

static pp_status load_file(const char *path, pp_graph **out, pp_onnx_deferred **deferred) {
    *out = NULL;
    /* Read, never mapped: a model file truncated while it is read (another
     * process saving over it in place, a partial copy) is an error naming
     * the file, not a SIGBUS (file_io.h). The structure is read once and
     * each weight straight into its tensor, so loading peaks at about the
     * file's size plus its decoded structure. */
    model_src src = {NULL, 0, -1, NULL};
    PP_TRY(pp_open_file(path, PP_ONNX_MAX_BYTES, &src.fd, &src.len));
    if (deferred) { /* the record keeps the file open for the reads to come */
        *deferred = NULL;
        int fd = fcntl(src.fd, F_DUPFD_CLOEXEC, 0); /* dup would drop close-on-exec */
        pp_status ds = fd < 0 ? pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno))
                              : pp_onnx_deferred_new(fd, path, &src.defer);
        if (ds != PP_OK) {
            close(src.fd);
            return ds;
        }
    }
    /* external data locations are relative to the model file's directory */
    char *dir = malloc(strlen(path) + 2);
    pp_status s = PP_OK;
    if (!dir) s = pp_error(PP_ERR_NOMEM, "out of memory");
    else {
        strcpy(dir, path);
        char *slash = strrchr(dir, '/');
        if (!slash) strcpy(dir, ".");
        else slash[slash == dir ? 1 : 0] = '\0';
        s = parse_model(&src, path, dir, out);
    }
    free(dir);
    close(src.fd);
    if (s == PP_OK && deferred) {
        pp_onnx_deferred_done(src.defer);
        *deferred = src.defer;
    }
    else pp_onnx_deferred_free(src.defer);
    return s;
}

pp_status pp_onnx_load(const char *path, pp_graph **out) { return load_file(path, out, NULL); }

pp_status pp_onnx_load_deferred(const char *path, pp_graph **out, pp_onnx_deferred **deferred) {
    return load_file(path, out, deferred);
}

pp_status pp_onnx_tensor_parse(const void *bytes, size_t len, const char *name, pp_tensor **out,
                               char **tensor_name) {
    *out = NULL;
    if (tensor_name) *tensor_name = NULL;
    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, len, bytes);
    if (!tp) return pp_error(PP_ERR_PARSE, "%s: not an ONNX TensorProto", name);
    pp_status s = pp_onnx_tensor_from_proto(tp, name, out);
    if (s == PP_OK && tensor_name && tp->name) *tensor_name = strdup(tp->name);
    onnx__tensor_proto__free_unpacked(tp, NULL);
    return s;
}

pp_status pp_onnx_tensor_load(const char *path, pp_tensor **out, char **tensor_name) {
    unsigned char *buf;
    size_t len;
    *out = NULL;
    PP_TRY(pp_read_file(path, PP_ONNX_MAX_BYTES, &buf, &len));
    pp_status s = pp_onnx_tensor_parse(buf, len, path, out, tensor_name);
    free(buf);
    return s;
}

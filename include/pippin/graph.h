/* Graph IR: SSA values and nodes in topological order.
 *
 * Values and nodes are addressed by index (arrays grow, so never keep a
 * pointer across a call that adds to the graph). A value is a graph input, a
 * parameter (trainable initializer), a constant, or a node output. Nodes
 * reference an op from the registry (lib/op.h, internal) and carry ONNX-style
 * attributes. Backward nodes built by autodiff carry a region tag.
 *
 * Thread safety: a graph is not locked: build or change it from one thread;
 * concurrent reads are fine. */
#ifndef PIPPIN_GRAPH_H
#define PIPPIN_GRAPH_H

#include "pippin/export.h"

#include <stdint.h>

#include "pippin/status.h"
#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pp_value_kind {
    PP_VALUE_INPUT = 0, /* fed at run time */
    PP_VALUE_PARAM = 1, /* initializer that may be trained */
    PP_VALUE_CONST = 2, /* Constant node output or non-trainable initializer */
    PP_VALUE_NODE = 3   /* computed by a node */
} pp_value_kind;

typedef struct pp_value {
    char *name;
    pp_value_kind kind;
    pp_dtype dtype;                 /* PP_DTYPE_UNDEFINED if not known yet */
    int ndim;                       /* -1 if the rank is not known */
    int64_t shape[PP_MAX_DIMS];     /* -1 for a dynamic dimension */
    char *dim_names[PP_MAX_DIMS];   /* symbolic names ("batch"), may be NULL */
    pp_tensor *data;                /* PARAM and CONST values; owned */
    int producer;                   /* node index for NODE values, else -1 */
    int producer_output;            /* which output of the producer */
} pp_value;

/* Attribute types use ONNX AttributeProto codes. */
typedef enum pp_attr_type {
    PP_ATTR_FLOAT = 1,
    PP_ATTR_INT = 2,
    PP_ATTR_STRING = 3,
    PP_ATTR_TENSOR = 4,
    PP_ATTR_GRAPH = 5, /* recorded, never supported */
    PP_ATTR_FLOATS = 6,
    PP_ATTR_INTS = 7,
    PP_ATTR_STRINGS = 8
} pp_attr_type;

typedef struct pp_attr {
    char *name;
    pp_attr_type type;
    int64_t i;
    float f;
    char *s;          /* STRING */
    pp_tensor *t;     /* TENSOR, owned */
    int n;            /* length of ints / floats / strings */
    int64_t *ints;
    float *floats;
    char **strings;
} pp_attr;

/* Where a node belongs in a training graph (docs/architecture.md, the I/W split). */
typedef enum pp_region {
    PP_REGION_FORWARD = 0,
    PP_REGION_BACKWARD_INPUT = 1,  /* I: needed for some input gradient */
    PP_REGION_BACKWARD_WEIGHT = 2  /* W: needed only for parameter gradients */
} pp_region;

struct pp_op;

typedef struct pp_node {
    char *name;
    char *op_type;
    char *domain;      /* "" for the default ONNX domain */
    int n_in;
    int *in;           /* value indices; -1 for an omitted optional input */
    int n_out;
    int *out;          /* value indices; -1 for an omitted optional output */
    int n_attr;
    pp_attr *attrs;
    const struct pp_op *op; /* resolved from the registry; NULL if unknown */
    pp_region region;
    int stage;         /* pipeline stage, -1 if not assigned */
} pp_node;

typedef struct pp_graph {
    char *name;
    int n_values, cap_values;
    pp_value *values;
    int n_nodes, cap_nodes;
    pp_node *nodes;
    int n_inputs, cap_inputs;
    int *inputs;       /* value indices of graph inputs, in order */
    int n_outputs, cap_outputs;
    int *outputs;      /* value indices of graph outputs, in order */
    int opset;         /* default-domain opset the model was written for */
    char *source;      /* file it was loaded from, for messages (may be NULL) */
    void *name_index;  /* private: name -> value hash */
    int name_counter;  /* private: for generated names */
} pp_graph;

PP_API pp_status pp_graph_new(const char *name, pp_graph **out);
PP_API void pp_graph_free(pp_graph *g);

/* Value index by name, or -1. */
PP_API int pp_graph_find_value(const pp_graph *g, const char *name);
/* Node index by name, or -1. */
PP_API int pp_graph_find_node(const pp_graph *g, const char *name);

/* Adds a graph input. shape entries may be -1 (dynamic); ndim -1: unknown. */
PP_API pp_status pp_graph_add_input(pp_graph *g, const char *name, pp_dtype dt, int ndim,
                             const int64_t *shape, int *value_id);
/* Adds a parameter or constant; takes ownership of data (also on failure). */
PP_API pp_status pp_graph_add_initializer(pp_graph *g, const char *name, pp_value_kind kind,
                                   pp_tensor *data, int *value_id);
/* Adds a node and its output values. out_names may be NULL (names are made
 * up from the node name); an out_names entry "" makes an omitted output.
 * name may be NULL (made up from op_type). in entries may be -1. */
PP_API pp_status pp_graph_add_node(pp_graph *g, const char *op_type, const char *domain,
                            const char *name, int n_in, const int *in, int n_out,
                            const char *const *out_names, int *node_id);
PP_API pp_status pp_graph_add_output(pp_graph *g, int value_id);
/* Gives node's output k (omitted, or past its last output) a new value
 * (named from the node); an output that has one keeps it. */
PP_API pp_status pp_node_add_output(pp_graph *g, int node, int k, int *value_id);

/* A fresh value name with the given prefix, unique in g. Returned string is
 * valid until the next call on this thread. */
PP_API const char *pp_graph_unique_name(pp_graph *g, const char *prefix);

/* Attributes. The setters copy their arguments. */
PP_API pp_status pp_node_set_int(pp_graph *g, int node, const char *name, int64_t v);
PP_API pp_status pp_node_set_float(pp_graph *g, int node, const char *name, float v);
PP_API pp_status pp_node_set_string(pp_graph *g, int node, const char *name, const char *v);
PP_API pp_status pp_node_set_ints(pp_graph *g, int node, const char *name, int n, const int64_t *v);
PP_API pp_status pp_node_set_floats(pp_graph *g, int node, const char *name, int n, const float *v);
/* Takes ownership of t (also on failure). */
PP_API pp_status pp_node_set_tensor(pp_graph *g, int node, const char *name, pp_tensor *t);
/* Moves a fully built attribute (used by importers); takes ownership. */
PP_API pp_status pp_node_add_attr(pp_graph *g, int node, pp_attr *attr);

/* Deep copy of an attribute into dst (caller frees with pp_attr_clear). */
PP_API pp_status pp_attr_clone(const pp_attr *src, pp_attr *dst);
PP_API void pp_attr_clear(pp_attr *a);
/* Appends a copy of src's node (op, name, attributes, region) to dst with
 * inputs in_map[k] (dst value ids, -1 omitted) and outputs of the same
 * names. */
PP_API pp_status pp_graph_copy_node(pp_graph *dst, const pp_graph *src, int node, const int *in_map,
                             int *new_node);

PP_API const pp_attr *pp_node_attr(const pp_node *n, const char *name);
PP_API int64_t pp_node_attr_int(const pp_node *n, const char *name, int64_t def);
PP_API float pp_node_attr_float(const pp_node *n, const char *name, float def);
PP_API const char *pp_node_attr_string(const pp_node *n, const char *name, const char *def);
/* Number of ints (and *vals) or -1 if absent. */
PP_API int pp_node_attr_ints(const pp_node *n, const char *name, const int64_t **vals);

/* Human-readable node label for messages: "node 'name' (OpType)". */
PP_API const char *pp_node_label(const pp_node *n, char *buf, size_t cap);

/* Checks structure: inputs defined before use, arity against the op, every op
 * known. Resolves node->op. Errors name the node. */
PP_API pp_status pp_graph_resolve(pp_graph *g);

/* Parameter count and bytes (PARAM values only). */
PP_API void pp_graph_param_stats(const pp_graph *g, int64_t *count, int64_t *bytes);
/* 1 if value v is a frozen initializer: a float constant that is not
 * trained (a buffer, a frozen parameter). */
PP_API int pp_graph_is_frozen(const pp_graph *g, int v);
/* Count and bytes of the frozen initializers. */
PP_API void pp_graph_frozen_stats(const pp_graph *g, int64_t *count, int64_t *bytes);

/* Freezes the parameters whose names match the shell pattern (fnmatch:
 * "blocks.0.*", "*.mask"): they become constants, never get a gradient or
 * an update. Returns how many it froze; matching none is not an error here
 * (a stage may hold none of them). */
PP_API int pp_graph_freeze(pp_graph *g, const char *pattern);

/* Stage markers from other exporters: every Identity node whose name or
 * output name matches the shell pattern (fnmatch: "*pipe_split*") becomes
 * a pippin::PipeSplit marker (the same identity, now a cut). Returns how
 * many. */
PP_API int pp_graph_identity_markers(pp_graph *g, const char *pattern);

#ifdef __cplusplus
}
#endif
#endif

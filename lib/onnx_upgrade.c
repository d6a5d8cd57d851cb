/* ONNX op versions -> pippin's forms, at import (opsets 7 to 21).
 *
 * ONNX changes an op's signature in a new opset version; a model names one
 * default-domain opset for all its nodes. The table below lists, per op, the
 * opsets where that op's form differs from the one pippin's kernels were
 * written for (mostly opset 13-17) and what import does about it:
 *
 *   kernel   the kernel reads the older (or newer) form itself, so the node
 *            is kept as written (export then writes a valid model for the
 *            same opset): Squeeze/Unsqueeze/ReduceSum/Split with 'axes' or
 *            'split' attributes (< 13), the other Reduce* with an 'axes'
 *            attribute (< 18) or input (>= 18), Clip's 'min'/'max'
 *            attributes (< 11), Pad's 'pads'/'value' attributes (< 11) and
 *            'axes' input (>= 18) and 'wrap' mode (19), Slice's
 *            'starts'/'ends'/'axes' attributes
 *            (< 10), Dropout's 'ratio' attribute (< 12), Split's
 *            'num_outputs' (>= 18), Softmax/LogSoftmax/Hardmax coercing the
 *            input to 2-D at 'axis' (< 13; the kernels look at g->opset).
 *   rewrite  the node is changed here (an obsolete attribute that means
 *            what pippin does anyway is dropped).
 *   refuse   the semantics differ in a way pippin cannot run: import fails
 *            with PP_ERR_UNSUPPORTED naming node, opset and the difference.
 *
 * Versions that only widen types or add attributes whose defaults match the
 * old behaviour (MaxPool ceil_mode/dilations at 10, Gemm's optional C at 11,
 * Reshape allowzero at 14, AveragePool dilations at 19, Cast saturate at 19
 * which only concerns float8) need no entry. Resize's forms (10: X and
 * scales; 11-13: roi, scales, sizes; 18: axes, keep_aspect_ratio_policy,
 * antialias; 19: half_pixel_symmetric), Upsample's (7: 'scales' attribute,
 * 9: input) and GroupNormalization's scale per group (18) or per channel
 * (21) are read by their kernels (lib/ops/resize.c, group_norm.c). Ops
 * pippin has no kernel for are refused by pp_graph_resolve as unknown ops. */
#include <string.h>

#include "onnx_upgrade.h"
#include "op.h"

#include "status_internal.h"

typedef struct upgrade_ctx {
    pp_graph *g;
    int node;
    int opset;
    const char *file;
} upgrade_ctx;

typedef pp_status (*upgrade_fn)(const upgrade_ctx *c);

typedef struct upgrade_rule {
    const char *op;
    int lo, hi;           /* applies to models of opset lo..hi */
    upgrade_fn fn;        /* NULL: the kernel reads this form */
    const char *change;   /* what differs in those versions */
} upgrade_rule;

static pp_status refuse(const upgrade_ctx *c, const char *what) {
    char label[512];
    return pp_error(PP_ERR_UNSUPPORTED, "%s: %s at opset %d: %s", c->file,
                    pp_node_label(&c->g->nodes[c->node], label, sizeof label), c->opset, what);
}

static int has_output(const pp_node *n, int i) { return n->n_out > i && n->out[i] >= 0; }

static void drop_attr(pp_node *n, const char *name) {
    for (int i = 0; i < n->n_attr; i++) {
        if (strcmp(n->attrs[i].name, name) != 0) continue;
        pp_attr_clear(&n->attrs[i]);
        memmove(&n->attrs[i], &n->attrs[i + 1], sizeof(pp_attr) * (size_t)(n->n_attr - i - 1));
        n->n_attr--;
        return;
    }
}

/* BatchNormalization 7-8: 'spatial' = 1 (the default) is what later
 * versions always do; 0 keeps statistics per element. */
static pp_status batchnorm_spatial(const upgrade_ctx *c) {
    pp_node *n = &c->g->nodes[c->node];
    const pp_attr *a = pp_node_attr(n, "spatial");
    if (!a) return PP_OK;
    if (a->type != PP_ATTR_INT || a->i != 1)
        return refuse(c, "'spatial' = 0 (mean and variance per element, not per channel) is not "
                         "supported");
    drop_attr(n, "spatial");
    return PP_OK;
}

/* BatchNormalization before 14: outputs 1-4 (mean, var, saved_mean,
 * saved_var) exist only in training mode and are defined differently from
 * opset 14's running_mean/running_var. */
static pp_status batchnorm_outputs(const upgrade_ctx *c) {
    const pp_node *n = &c->g->nodes[c->node];
    for (int i = 1; i < n->n_out; i++)
        if (has_output(n, i))
            return refuse(c, "training-mode outputs (mean, var, saved_mean, saved_var) before "
                             "opset 14 are not supported; only Y is");
    return PP_OK;
}

/* Dropout 7-9: the mask output has the input's type, not bool. */
static pp_status dropout_mask(const upgrade_ctx *c) {
    if (has_output(&c->g->nodes[c->node], 1))
        return refuse(c, "the mask output has the input's element type before opset 10 (bool "
                         "from 10); pippin writes a bool mask");
    return PP_OK;
}

static const upgrade_rule rules[] = {
    {"Squeeze", 7, 12, NULL, "'axes' attribute, an input from 13"},
    {"Unsqueeze", 7, 12, NULL, "'axes' attribute, an input from 13"},
    {"ReduceSum", 7, 12, NULL, "'axes' attribute, an input from 13"},
    {"Split", 7, 12, NULL, "'split' attribute, an input from 13"},
    {"Split", 18, 21, NULL, "'num_outputs' attribute (18)"},
    {"ReduceMean", 7, 17, NULL, "'axes' attribute, an input from 18"},
    {"ReduceMax", 7, 17, NULL, "'axes' attribute, an input from 18"},
    {"ReduceMin", 7, 17, NULL, "'axes' attribute, an input from 18"},
    {"ReduceProd", 7, 17, NULL, "'axes' attribute, an input from 18"},
    {"ReduceL1", 7, 17, NULL, "'axes' attribute, an input from 18"},
    {"ReduceL2", 7, 17, NULL, "'axes' attribute, an input from 18"},
    {"ReduceLogSum", 7, 17, NULL, "'axes' attribute, an input from 18"},
    {"ReduceLogSumExp", 7, 17, NULL, "'axes' attribute, an input from 18"},
    {"ReduceSumSquare", 7, 17, NULL, "'axes' attribute, an input from 18"},
    {"Clip", 7, 10, NULL, "'min'/'max' attributes, inputs from 11"},
    {"Pad", 7, 10, NULL, "'pads'/'value' attributes, inputs from 11"},
    {"Pad", 18, 21, NULL, "optional 'axes' input (18)"},
    {"Pad", 19, 21, NULL, "'wrap' mode (19)"},
    {"Slice", 7, 9, NULL, "'starts'/'ends'/'axes' attributes, inputs from 10"},
    {"Dropout", 7, 9, dropout_mask, "mask of the input's type, bool from 10"},
    {"Dropout", 7, 11, NULL, "'ratio' attribute, an input from 12"},
    {"Softmax", 7, 12, NULL, "input coerced to 2-D at 'axis' (default 1)"},
    {"LogSoftmax", 7, 12, NULL, "input coerced to 2-D at 'axis' (default 1)"},
    {"Hardmax", 7, 12, NULL, "input coerced to 2-D at 'axis' (default 1)"},
    {"BatchNormalization", 7, 8, batchnorm_spatial, "'spatial' attribute (removed in 9)"},
    {"BatchNormalization", 7, 13, batchnorm_outputs, "training outputs differ (14)"},
};

pp_status pp_onnx_upgrade(pp_graph *g, int opset, const char *file) {
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0) continue;
        for (size_t r = 0; r < sizeof rules / sizeof rules[0]; r++) {
            const upgrade_rule *u = &rules[r];
            if (opset < u->lo || opset > u->hi || !u->fn || strcmp(u->op, n->op_type) != 0) continue;
            upgrade_ctx c = {g, i, opset, file};
            PP_TRY(u->fn(&c));
            n = &g->nodes[i];
        }
    }
    return PP_OK;
}

#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tu_src_path(const char *rel) {
    static char buf[4096];
    const char *root = getenv("PIPPIN_SOURCE_ROOT");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

pp_tensor *tu_f32(int ndim, const int64_t *shape, const float *vals) {
    pp_tensor *t = NULL;
    if (pp_tensor_empty(PP_F32, ndim, shape, &t) != PP_OK) fail_msg("%s", pp_last_error());
    if (t->nbytes) memcpy(t->data, vals, t->nbytes);
    return t;
}

pp_tensor *tu_i64(int ndim, const int64_t *shape, const int64_t *vals) {
    pp_tensor *t = NULL;
    if (pp_tensor_empty(PP_I64, ndim, shape, &t) != PP_OK) fail_msg("%s", pp_last_error());
    if (t->nbytes) memcpy(t->data, vals, t->nbytes);
    return t;
}

void tu_assert_close(const pp_tensor *got, const pp_tensor *want, double rtol, double atol,
                     const char *what) {
    char why[512];
    if (!got) fail_msg("%s: no tensor", what);
    if (!pp_tensor_allclose(got, want, rtol, atol, why, sizeof why)) fail_msg("%s: %s", what, why);
}

void tu_expect(pp_tensor *got, pp_tensor *want, double rtol, double atol, const char *what) {
    tu_assert_close(got, want, rtol, atol, what);
    pp_tensor_free(got);
    pp_tensor_free(want);
}

void tu_assert_shape(const pp_tensor *t, int nd, const int64_t *shape) {
    char a[128], b[128];
    if (!pp_shape_equal(t->ndim, t->shape, nd, shape))
        fail_msg("shape %s, expected %s", pp_shape_str(t->ndim, t->shape, a, sizeof a),
                 pp_shape_str(nd, shape, b, sizeof b));
}

pp_tensor *tu_i64_vec(int n, const int64_t *vals) {
    int64_t s = n;
    return tu_i64(1, &s, vals);
}

pp_tensor *tu_typed(pp_dtype dt, int ndim, const int64_t *shape, const double *vals) {
    pp_tensor *t = NULL;
    TU_OK(pp_tensor_empty(dt, ndim, shape, &t));
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) pp_tensor_set_f64(t, i, vals[i]);
    return t;
}

/* Path of test/fixtures/<model>/<file> (tu_src_path's buffer). */
static const char *fixture_path(const char *model, const char *file) {
    char rel[512];
    snprintf(rel, sizeof rel, "test/fixtures/%s/%s", model, file);
    return tu_src_path(rel);
}

pp_tensor *tu_fixture_npy(const char *model, const char *file) {
    pp_tensor *t = NULL;
    TU_OK(pp_npy_load(fixture_path(model, file), &t));
    return t;
}

pp_graph *tu_fixture_onnx(const char *model, const char *file) {
    pp_graph *g = NULL;
    TU_OK(pp_onnx_load(fixture_path(model, file), &g));
    return g;
}

uint64_t tu_xorshift(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

double tu_urand(uint64_t *state) {
    return (double)(tu_xorshift(state) >> 11) / (double)(1ull << 52) - 1.0;
}

/* ------------------------------------------------- one-node graph harness */

void tu_node_init_dom(tu_node *t, const char *op, const char *domain, int n_in,
                      pp_tensor *const *ins, int n_out, const char *const *out_names) {
    memset(t, 0, sizeof *t);
    if (n_in > TU_MAX_IN || n_out > TU_MAX_OUT)
        fail_msg("tu_node: %d inputs, %d outputs (at most %d, %d)", n_in, n_out, TU_MAX_IN,
                 TU_MAX_OUT);
    TU_OK(pp_graph_new("t", &t->g));
    int ids[TU_MAX_IN];
    for (int i = 0; i < n_in; i++) {
        t->in[i] = ins[i];
        ids[i] = -1;
        if (!ins[i]) continue;
        char name[16];
        snprintf(name, sizeof name, "in%d", i);
        TU_OK(pp_graph_add_input(t->g, name, ins[i]->dtype, ins[i]->ndim, ins[i]->shape, &ids[i]));
    }
    t->n_in = n_in;
    TU_OK(pp_graph_add_node(t->g, op, domain, "n0", n_in, ids, n_out, out_names, &t->node));
    for (int k = 0; k < n_out; k++) {
        int v = t->g->nodes[t->node].out[k];
        if (v >= 0) {
            TU_OK(pp_graph_add_output(t->g, v));
            t->n_out++;
        }
    }
}

void tu_node_init(tu_node *t, const char *op, int n_in, pp_tensor *const *ins, int n_out,
                  const char *const *out_names) {
    tu_node_init_dom(t, op, "", n_in, ins, n_out, out_names);
}

pp_status tu_node_run(tu_node *t, pp_tensor **outs) {
    pp_tensor *feed[TU_MAX_IN];
    int nf = 0;
    for (int i = 0; i < t->n_in; i++)
        if (t->in[i]) feed[nf++] = t->in[i];
    for (int k = 0; k < t->n_out; k++) outs[k] = NULL;
    pp_status s = pp_graph_resolve(t->g);
    if (s != PP_OK) return s;
    return pp_graph_run(t->g, feed, outs);
}

pp_tensor *tu_node_run_one(tu_node *t) {
    pp_tensor *outs[TU_MAX_OUT];
    TU_OK(tu_node_run(t, outs));
    for (int k = 1; k < t->n_out; k++) pp_tensor_free(outs[k]);
    return outs[0];
}

void tu_node_expect_error(tu_node *t, pp_status code, const char *part) {
    pp_tensor *outs[TU_MAX_OUT];
    pp_status s = tu_node_run(t, outs);
    if (s == PP_OK) {
        for (int k = 0; k < t->n_out; k++) pp_tensor_free(outs[k]);
        fail_msg("expected an error, got success");
    }
    if (s != code)
        fail_msg("expected %s, got %s: %s", pp_status_name(code), pp_status_name(s),
                 pp_last_error());
    if (!strstr(pp_last_error(), "'n0'"))
        fail_msg("message does not name the node: %s", pp_last_error());
    if (part && !strstr(pp_last_error(), part))
        fail_msg("message lacks \"%s\": %s", part, pp_last_error());
}

void tu_node_free(tu_node *t) {
    for (int i = 0; i < t->n_in; i++) pp_tensor_free(t->in[i]);
    pp_graph_free(t->g);
}

/* Shared helpers for the core tests. */
#ifndef PIPPIN_TEST_UTIL_H
#define PIPPIN_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "pippin/pippin.h"
#include "pippin/schedule.h"

/* Path under the source tree (PIPPIN_SOURCE_ROOT, set by meson test). */
const char *tu_src_path(const char *rel);
/* test/fixtures/<model>/<file>, loaded (fails the test on error). */
pp_tensor *tu_fixture_npy(const char *model, const char *file);
pp_graph *tu_fixture_onnx(const char *model, const char *file);
/* f32 tensor from values. */
pp_tensor *tu_f32(int ndim, const int64_t *shape, const float *vals);
pp_tensor *tu_i64(int ndim, const int64_t *shape, const int64_t *vals);
/* 1-D i64 tensor of n values. */
pp_tensor *tu_i64_vec(int n, const int64_t *vals);
/* Tensor of dtype dt from values given as doubles (pp_tensor_set_f64). */
pp_tensor *tu_typed(pp_dtype dt, int ndim, const int64_t *shape, const double *vals);
/* Asserts allclose with a message naming what differs. */
void tu_assert_close(const pp_tensor *got, const pp_tensor *want, double rtol, double atol,
                     const char *what);
/* tu_assert_close, then frees both tensors. */
void tu_expect(pp_tensor *got, pp_tensor *want, double rtol, double atol, const char *what);
/* Asserts t has shape (nd, shape). */
void tu_assert_shape(const pp_tensor *t, int nd, const int64_t *shape);

/* Literal shorthands: SHAPE(2, 3), F32(2, SHAPE(2, 3), 1, 2, ...), I64(...),
 * T(PP_F16, 1, SHAPE(2), 1.5, 2). */
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define F32(nd, shape, ...) tu_f32(nd, shape, (const float[]){__VA_ARGS__})
#define I64(nd, shape, ...) tu_i64(nd, shape, (const int64_t[]){__VA_ARGS__})
#define T(dt, nd, shape, ...) tu_typed(dt, nd, shape, (const double[]){__VA_ARGS__})

/* xorshift64 step on *state. */
uint64_t tu_xorshift(uint64_t *state);
/* Uniform in [-1, 1) from the top 53 bits of tu_xorshift(state). */
double tu_urand(uint64_t *state);

/* Asserts st == PP_OK, printing pp_last_error() otherwise. */
#define TU_OK(expr)                                                              \
    do {                                                                         \
        pp_status tu_s_ = (expr);                                                \
        if (tu_s_ != PP_OK) fail_msg("%s failed: %s", #expr, pp_last_error());   \
    } while (0)

/* ------------------------------------------------- one-node graph harness */

#define TU_MAX_IN 8
#define TU_MAX_OUT 8

/* A graph "t" holding one node "n0"; each non-NULL input is a graph input
 * "in<i>" and each present output a graph output, in order. */
typedef struct {
    pp_graph *g;
    int node;
    int n_in;                 /* inputs given to tu_node_init, NULL ones included */
    int n_out;                /* graph outputs (present node outputs) */
    pp_tensor *in[TU_MAX_IN]; /* owned; NULL for omitted inputs */
} tu_node;

/* Builds the graph; takes ownership of the inputs. out_names may be NULL
 * (all n_out outputs) or hold "" for omitted ones. Domain "" for
 * tu_node_init. */
void tu_node_init(tu_node *t, const char *op, int n_in, pp_tensor *const *ins, int n_out,
                  const char *const *out_names);
void tu_node_init_dom(tu_node *t, const char *op, const char *domain, int n_in,
                      pp_tensor *const *ins, int n_out, const char *const *out_names);
/* Resolves and runs, feeding the non-NULL inputs; outs receives t->n_out
 * tensors (caller frees). */
pp_status tu_node_run(tu_node *t, pp_tensor **outs);
/* Runs (asserting success) and returns output 0; any others are freed. */
pp_tensor *tu_node_run_one(tu_node *t);
/* Runs and expects failure with code; the message must name node 'n0' and,
 * where part is not NULL, contain part. */
void tu_node_expect_error(tu_node *t, pp_status code, const char *part);
/* Frees the graph and the inputs. */
void tu_node_free(tu_node *t);

#endif

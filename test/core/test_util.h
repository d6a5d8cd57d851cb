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
/* f32 tensor from values. */
pp_tensor *tu_f32(int ndim, const int64_t *shape, const float *vals);
pp_tensor *tu_i64(int ndim, const int64_t *shape, const int64_t *vals);
/* Asserts allclose with a message naming what differs. */
void tu_assert_close(const pp_tensor *got, const pp_tensor *want, double rtol, double atol,
                     const char *what);
/* Asserts st == PP_OK, printing pp_last_error() otherwise. */
#define TU_OK(expr)                                                              \
    do {                                                                         \
        pp_status tu_s_ = (expr);                                                \
        if (tu_s_ != PP_OK) fail_msg("%s failed: %s", #expr, pp_last_error());   \
    } while (0)

#endif

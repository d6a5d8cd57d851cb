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

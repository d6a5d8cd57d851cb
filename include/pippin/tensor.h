/* Tensors: dtype, shape (up to 8 dims), contiguous row-major data.
 *
 * A tensor owns its data (allocated by pippin) or borrows it (the caller
 * passes a free function, called once when the last reference goes, as
 * zmq_msg_init_data and sqlite3_bind_blob do). Tensors are reference counted
 * so several graph values may share one buffer (Identity, Reshape).
 *
 * Thread safety: a tensor may be read and retained/freed from several threads
 * (the count is atomic); writes need the caller's own ordering. */
#ifndef PIPPIN_TENSOR_H
#define PIPPIN_TENSOR_H

#include "pippin/export.h"

#include <stddef.h>
#include <stdint.h>

#include "pippin/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PP_MAX_DIMS 8

/* Values equal ONNX TensorProto.DataType codes. */
typedef enum pp_dtype {
    PP_DTYPE_UNDEFINED = 0,
    PP_F32 = 1,
    PP_U8 = 2,
    PP_I8 = 3,
    PP_I32 = 6,
    PP_I64 = 7,
    PP_BOOL = 9,
    PP_F16 = 10,
    PP_F64 = 11,
    PP_BF16 = 16
} pp_dtype;

/* Bytes per element; 0 for an unknown dtype. */
PP_API size_t pp_dtype_size(pp_dtype dt);
/* "float32", "int64", ...; "undefined" for unknown codes. */
PP_API const char *pp_dtype_name(pp_dtype dt);
/* Parses the names pp_dtype_name returns; PP_DTYPE_UNDEFINED if unknown. */
PP_API pp_dtype pp_dtype_from_name(const char *name);
PP_API int pp_dtype_is_float(pp_dtype dt);
PP_API int pp_dtype_is_valid(pp_dtype dt);

typedef void (*pp_free_fn)(void *data, void *hint);

typedef struct pp_tensor {
    pp_dtype dtype;
    int ndim;
    int64_t shape[PP_MAX_DIMS];
    void *data;      /* NULL only when nbytes == 0 */
    size_t nbytes;   /* numel * dtype size */
    /* private */
    pp_free_fn free_fn;
    void *free_hint;
    int refcount;    /* atomic */
} pp_tensor;

/* New tensor with zeroed data. ndim 0 is a scalar. */
PP_API pp_status pp_tensor_new(pp_dtype dt, int ndim, const int64_t *shape, pp_tensor **out);
/* New tensor with uninitialised data (faster when every element is written). */
PP_API pp_status pp_tensor_empty(pp_dtype dt, int ndim, const int64_t *shape, pp_tensor **out);
/* Wraps caller memory without copying. free_fn (may be NULL: never freed)
 * runs with (data, hint) when the last reference is dropped. On failure
 * free_fn is not called. */
PP_API pp_status pp_tensor_wrap(pp_dtype dt, int ndim, const int64_t *shape, void *data,
                         pp_free_fn free_fn, void *hint, pp_tensor **out);
/* Deep copy. */
PP_API pp_status pp_tensor_clone(const pp_tensor *src, pp_tensor **out);
/* New tensor of another shape sharing src's data (numel must match). */
PP_API pp_status pp_tensor_view(pp_tensor *src, int ndim, const int64_t *shape, pp_tensor **out);
/* Rows [start, start+len) along dim 0 as a view sharing src's data. */
PP_API pp_status pp_tensor_slice0(pp_tensor *src, int64_t start, int64_t len, pp_tensor **out);
/* Converts to another dtype (float<->int truncates toward zero, as numpy). */
PP_API pp_status pp_tensor_cast(const pp_tensor *src, pp_dtype dt, pp_tensor **out);
/* A 0-d f32 / i64 tensor. */
PP_API pp_status pp_tensor_scalar_f32(float v, pp_tensor **out);
PP_API pp_status pp_tensor_scalar_i64(int64_t v, pp_tensor **out);

/* Tensor buffers of 64 KiB and more are recycled instead of going back to
 * malloc (up to PIPPIN_TENSOR_CACHE_MB, default 256, MiB); this frees the
 * recycled ones now, and lets the calling thread's memory-plan arena go
 * (pippin/exec.h; the next planned run makes it again). */
PP_API void pp_tensor_cache_release(void);

/* Adds a reference; returns t. */
PP_API pp_tensor *pp_tensor_retain(pp_tensor *t);
/* Drops a reference; frees at zero. NULL is ignored. */
PP_API void pp_tensor_free(pp_tensor *t);

PP_API int64_t pp_tensor_numel(const pp_tensor *t);
PP_API int64_t pp_shape_numel(int ndim, const int64_t *shape);
/* Checks dims >= 0 and that numel * elem_size fits in size_t; fills *nbytes. */
PP_API pp_status pp_shape_bytes(pp_dtype dt, int ndim, const int64_t *shape, size_t *nbytes);
PP_API int pp_shape_equal(int na, const int64_t *a, int nb, const int64_t *b);
/* "[2,3,4]" into buf; returns buf. */
PP_API const char *pp_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

/* Element i as double (any dtype). */
PP_API double pp_tensor_get_f64(const pp_tensor *t, int64_t i);
/* Element i as int64 (any dtype). */
PP_API int64_t pp_tensor_get_i64(const pp_tensor *t, int64_t i);
PP_API void pp_tensor_set_f64(pp_tensor *t, int64_t i, double v);

/* Half-precision conversions (round to nearest even). */
PP_API float pp_f16_to_f32(uint16_t h);
PP_API uint16_t pp_f32_to_f16(float f);
PP_API float pp_bf16_to_f32(uint16_t h);
PP_API uint16_t pp_f32_to_bf16(float f);

/* out = ts[0] + ts[1] + ... + ts[n-1], added left to right (so the result
 * does not depend on arrival order); float32, equal shapes. n == 1 returns
 * a new reference to ts[0]. */
PP_API pp_status pp_tensor_sum(pp_tensor *const *ts, int n, pp_tensor **out);

/* Compare: every element |a-b| <= atol + rtol*|b| (NaN equals NaN). Shapes
 * and dtypes must match. Returns 1 if close; on mismatch writes a message
 * naming the first bad index into why (may be NULL). */
PP_API int pp_tensor_allclose(const pp_tensor *a, const pp_tensor *b, double rtol, double atol,
                       char *why, size_t why_cap);

#ifdef __cplusplus
}
#endif
#endif

/* TensorProto <-> pp_tensor. ONNX stores data either as little-endian
 * raw_data or in a typed repeated field; both are accepted. */
#include "onnx_tensor.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "file_io.h"
#include "pippin/status.h"

#include "status_internal.h"
pp_status pp_onnx_tensor_header(const Onnx__TensorProto *tp, const char *what, pp_dtype *dtype, int *ndim,
                                int64_t *shape, size_t *nbytes) {
    pp_dtype dt = (pp_dtype)tp->data_type;
    if (!pp_dtype_is_valid(dt))
        return pp_error(PP_ERR_UNSUPPORTED, "%s: unsupported data type %d", what, tp->data_type);
    if (tp->segment) return pp_error(PP_ERR_UNSUPPORTED, "%s: segmented tensors are not supported", what);
    if (tp->n_dims > PP_MAX_DIMS)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: %zu dims (at most %d)", what, tp->n_dims, PP_MAX_DIMS);
    for (size_t i = 0; i < tp->n_dims; i++) {
        if (tp->dims[i] < 0) return pp_error(PP_ERR_PARSE, "%s: negative dimension", what);
        shape[i] = tp->dims[i];
    }
    if (pp_shape_bytes(dt, (int)tp->n_dims, shape, nbytes) != PP_OK)
        return pp_error_context(PP_ERR_PARSE, "%s", what);
    *dtype = dt;
    *ndim = (int)tp->n_dims;
    return PP_OK;
}

/* Weights at least this large get pages of their own. */
#define OWN_PAGES_MIN ((size_t)1 << 20)

static void unmap_weight(void *data, void *hint) { munmap(data, (size_t)(uintptr_t)hint); }

/* A tensor for a loaded weight. Large ones are mapped on their own rather
 * than taken from the tensor pool: a weight lives as long as its model, and
 * when it goes (a stage copied into flat parameters, another rank's stage
 * dropped) its memory should go back to the system, not into the pool's
 * cache or the middle of malloc's heap. */
static pp_status weight_tensor(pp_dtype dt, int ndim, const int64_t *shape, size_t nbytes, pp_tensor **out) {
    if (nbytes < OWN_PAGES_MIN) return pp_tensor_empty(dt, ndim, shape, out);
    void *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return pp_error(PP_ERR_NOMEM, "out of memory for a weight of %zu bytes", nbytes);
    pp_status s = pp_tensor_wrap(dt, ndim, shape, p, unmap_weight, (void *)(uintptr_t)nbytes, out);
    if (s != PP_OK) munmap(p, nbytes);
    return s;
}

pp_status pp_onnx_tensor_from_proto(const Onnx__TensorProto *tp, const char *what, pp_tensor **out) {
    *out = NULL;
    /* initializers with external data are read by lib/onnx_external.c */
    if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: external data is supported for graph initializers only", what);
    pp_dtype dt;
    int ndim;
    int64_t shape[PP_MAX_DIMS];
    size_t nbytes;
    PP_TRY(pp_onnx_tensor_header(tp, what, &dt, &ndim, shape, &nbytes));
    int64_t numel = pp_shape_numel(ndim, shape);
    size_t have = 0;
    if (tp->has_raw_data) have = tp->raw_data.len;
    else if (dt == PP_F32) have = tp->n_float_data;
    else if (dt == PP_F64) have = tp->n_double_data;
    else if (dt == PP_I64) have = tp->n_int64_data;
    else have = tp->n_int32_data;
    if (tp->has_raw_data ? have != nbytes : have != (size_t)numel)
        return pp_error(PP_ERR_PARSE, "%s: holds %zu %s, shape needs %zu", what, have,
                        tp->has_raw_data ? "bytes" : "values",
                        tp->has_raw_data ? nbytes : (size_t)numel);
    PP_TRY(weight_tensor(dt, ndim, shape, nbytes, out));
    pp_tensor *t = *out;
    if (tp->has_raw_data) {
        if (nbytes) memcpy(t->data, tp->raw_data.data, nbytes);
        return PP_OK;
    }
    for (int64_t i = 0; i < numel; i++) {
        switch (dt) {
        case PP_F32: ((float *)t->data)[i] = tp->float_data[i]; break;
        case PP_F64: ((double *)t->data)[i] = tp->double_data[i]; break;
        case PP_I64: ((int64_t *)t->data)[i] = tp->int64_data[i]; break;
        case PP_I32: ((int32_t *)t->data)[i] = tp->int32_data[i]; break;
        case PP_F16: case PP_BF16: ((uint16_t *)t->data)[i] = (uint16_t)tp->int32_data[i]; break;
        case PP_I8: ((int8_t *)t->data)[i] = (int8_t)tp->int32_data[i]; break;
        default: ((uint8_t *)t->data)[i] = (uint8_t)tp->int32_data[i]; break;
        }
    }
    return PP_OK;
}

pp_status pp_onnx_tensor_read_raw(const Onnx__TensorProto *tp, const char *what, int fd, uint64_t off, size_t len,
                                  pp_tensor **out) {
    *out = NULL;
    pp_dtype dt;
    int ndim;
    int64_t shape[PP_MAX_DIMS];
    size_t nbytes;
    PP_TRY(pp_onnx_tensor_header(tp, what, &dt, &ndim, shape, &nbytes));
    if (len != nbytes) return pp_error(PP_ERR_PARSE, "%s: holds %zu bytes, shape needs %zu", what, len, nbytes);
    PP_TRY(weight_tensor(dt, ndim, shape, nbytes, out));
    pp_status s = pp_read_at(fd, (*out)->data, nbytes, off, what);
    if (s != PP_OK) {
        pp_tensor_free(*out);
        *out = NULL;
    }
    return s;
}

/* Weights at least this large may be left unread (pp_onnx_load_deferred). */
#define UNREAD_MIN ((size_t)64 << 10)

int pp_onnx_tensor_may_defer(size_t nbytes) { return nbytes >= UNREAD_MIN; }

pp_status pp_onnx_tensor_unread_raw(const Onnx__TensorProto *tp, const char *what, size_t len, pp_tensor **out) {
    *out = NULL;
    pp_dtype dt;
    int ndim;
    int64_t shape[PP_MAX_DIMS];
    size_t nbytes;
    PP_TRY(pp_onnx_tensor_header(tp, what, &dt, &ndim, shape, &nbytes));
    if (len != nbytes) return pp_error(PP_ERR_PARSE, "%s: holds %zu bytes, shape needs %zu", what, len, nbytes);
    /* pages of its own whatever its size: zeros that cost nothing until written */
    void *p = nbytes ? mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (p == MAP_FAILED) return pp_error(PP_ERR_NOMEM, "%s: out of memory for %zu bytes", what, nbytes);
    pp_status s = pp_tensor_wrap(dt, ndim, shape, p, unmap_weight, (void *)(uintptr_t)nbytes, out);
    if (s != PP_OK) munmap(p, nbytes);
    return s;
}

pp_status pp_onnx_tensor_to_proto(const pp_tensor *t, const char *name, Onnx__TensorProto *tp) {
    tp->n_dims = (size_t)t->ndim;
    tp->dims = (int64_t *)t->shape;
    tp->has_data_type = 1;
    tp->data_type = (int32_t)t->dtype;
    tp->name = (char *)name;
    tp->has_raw_data = 1;
    tp->raw_data.len = t->nbytes;
    tp->raw_data.data = t->data;
    return PP_OK;
}

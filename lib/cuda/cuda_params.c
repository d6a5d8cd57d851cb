/* The CUDA backend's side of a stage's resident parameters
 * (stages/device_params.c): zeroing, adding a gradient into the flat
 * gradient buffer and the SGD/AdamW updates, on the compute stream. The
 * math is kernel_math.h's, tested on the host by the cuda-host suite. */
#include "cuda_internal.h"

static cudaStream_t compute(pp_device *dev) { return ((cuda_device *)dev->impl)->stream[PP_STREAM_COMPUTE]; }

static pp_status launched(pp_device *dev, int err, const char *what) {
    return err ? pp_cuda_error(dev, err, what) : PP_OK;
}

pp_status pp_cuda_zero(pp_device *dev, void *ptr, size_t bytes) {
    return launched(dev, cudaMemsetAsync(ptr, 0, bytes, compute(dev)), "cudaMemsetAsync");
}

pp_status pp_cuda_add_into(pp_device *dev, float *dst, const float *src, int64_t n) {
    pp_km_strides one = {1, {n}, {1}};
    return launched(dev, pp_cu_binary(compute(dev), PP_KM_ADD, dst, one, src, one, dst, n), "gradient add");
}

pp_status pp_cuda_sgd(pp_device *dev, const pp_km_sgd *c, float *p, const float *grad, float *buf, int64_t n) {
    return launched(dev, pp_cu_sgd(compute(dev), *c, p, grad, buf, n), "SGD update");
}

pp_status pp_cuda_adamw(pp_device *dev, const pp_km_adamw *c, float *p, const float *grad, float *m, float *v,
                        int64_t n) {
    return launched(dev, pp_cu_adamw(compute(dev), *c, p, grad, m, v, n), "AdamW update");
}

/* Internal to the CUDA backend (lib/cuda/): its state and the op side. */
#ifndef PIPPIN_CUDA_INTERNAL_H
#define PIPPIN_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "device_backend.h"
#include "kernels.h"

typedef struct cuda_device {
    int ordinal;
    cudaStream_t stream[2]; /* PP_STREAM_COMPUTE, PP_STREAM_COPY */
    cublasHandle_t blas;    /* on the compute stream */
} cuda_device;

/* "cuda:N: what: the CUDA error's text". */
pp_status pp_cuda_error(const pp_device *dev, int err, const char *what);

int pp_cuda_supports(const pp_device *dev, const pp_graph *g, const pp_node *n);
int pp_cuda_input_on_host(const pp_node *n, int k);
pp_status pp_cuda_run(pp_device *dev, pp_kernel_ctx *ctx);

/* Resident parameters (cuda_params.c). */
pp_status pp_cuda_zero(pp_device *dev, void *ptr, size_t bytes);
pp_status pp_cuda_add_into(pp_device *dev, float *dst, const float *src, int64_t n);
pp_status pp_cuda_sgd(pp_device *dev, const pp_km_sgd *c, float *p, const float *grad, float *buf, int64_t n);
pp_status pp_cuda_adamw(pp_device *dev, const pp_km_adamw *c, float *p, const float *grad, float *m, float *v,
                        int64_t n);

#endif

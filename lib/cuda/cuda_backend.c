/* The CUDA backend's device side: opening a device (a failing CUDA init
 * means "no CUDA device", never an abort), memory (cudaMalloc, pinned
 * cudaMallocHost), a compute stream and a copy stream per pp_device, events,
 * and the cuBLAS handle. The ops it claims and runs: cuda_ops.c. */
#include "cuda_internal.h"

#include <stdlib.h>

#include "status_internal.h"

pp_status pp_cuda_error(const pp_device *dev, int err, const char *what) {
    return pp_error(err == cudaErrorMemoryAllocation ? PP_ERR_NOMEM : PP_ERR_INTERNAL, "%s: %s: %s",
                    dev->name, what, cudaGetErrorString((cudaError_t)err));
}

static pp_status cuda_alloc(pp_device *dev, pp_memory_kind kind, size_t bytes, void **ptr) {
    cudaError_t e = kind == PP_MEMORY_DEVICE ? cudaMalloc(ptr, bytes) : cudaMallocHost(ptr, bytes);
    return e ? pp_cuda_error(dev, e, kind == PP_MEMORY_DEVICE ? "cudaMalloc" : "cudaMallocHost") : PP_OK;
}

static void cuda_release(pp_device *dev, pp_memory_kind kind, void *ptr) {
    if (kind == PP_MEMORY_DEVICE) cudaFree(ptr);
    else cudaFreeHost(ptr);
}

static pp_status cuda_copy(pp_device *dev, pp_stream stream, void *dst, const void *src, size_t bytes,
                           pp_copy_dir dir) {
    cuda_device *c = dev->impl;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, dir == PP_COPY_TO_DEVICE ? cudaMemcpyHostToDevice
                                                                               : cudaMemcpyDeviceToHost,
                                    c->stream[stream]);
    return e ? pp_cuda_error(dev, e, "cudaMemcpyAsync") : PP_OK;
}

static pp_status cuda_stream_wait(pp_device *dev, pp_stream waiter, pp_stream other) {
    cuda_device *c = dev->impl;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e) return pp_cuda_error(dev, e, "cudaEventCreate");
    e = cudaEventRecord(ev, c->stream[other]);
    if (!e) e = cudaStreamWaitEvent(c->stream[waiter], ev, 0);
    cudaEventDestroy(ev); /* released once the wait is done */
    return e ? pp_cuda_error(dev, e, "cudaStreamWaitEvent") : PP_OK;
}

static pp_status cuda_event_record(pp_device *dev, pp_stream stream, void **event) {
    cuda_device *c = dev->impl;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (!e) e = cudaEventRecord(ev, c->stream[stream]);
    if (e) return pp_cuda_error(dev, e, "cudaEventRecord");
    *event = ev;
    return PP_OK;
}

static pp_status cuda_event_wait(pp_device *dev, void *event) {
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)event);
    return e ? pp_cuda_error(dev, e, "cudaEventSynchronize") : PP_OK;
}

static void cuda_event_free(pp_device *dev, void *event) { cudaEventDestroy((cudaEvent_t)event); }

static void cuda_close(pp_device *dev) {
    cuda_device *c = dev->impl;
    if (!c) return;
    if (c->blas) cublasDestroy(c->blas);
    for (int i = 0; i < 2; i++)
        if (c->stream[i]) {
            cudaStreamSynchronize(c->stream[i]);
            cudaStreamDestroy(c->stream[i]);
        }
    free(c);
}

static const pp_backend_ops cuda_ops = {
    .alloc = cuda_alloc,
    .release = cuda_release,
    .copy = cuda_copy,
    .stream_wait = cuda_stream_wait,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_free = cuda_event_free,
    .supports = pp_cuda_supports,
    .input_on_host = pp_cuda_input_on_host,
    .run = pp_cuda_run,
    .zero = pp_cuda_zero,
    .add_into = pp_cuda_add_into,
    .sgd = pp_cuda_sgd,
    .adamw = pp_cuda_adamw,
    .close = cuda_close,
};

pp_status pp_cuda_device_open(pp_device *dev, int ordinal) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e) return pp_error(PP_ERR_UNSUPPORTED, "no CUDA device: %s", cudaGetErrorString(e));
    if (count == 0) return pp_error(PP_ERR_UNSUPPORTED, "no CUDA device: the driver reports none");
    if (ordinal >= count)
        return pp_error(PP_ERR_UNSUPPORTED, "no CUDA device: cuda:%d asked for, %d present", ordinal, count);
    cuda_device *c = calloc(1, sizeof *c);
    if (!c) return pp_error(PP_ERR_NOMEM, "out of memory");
    c->ordinal = ordinal;
    dev->impl = c;
    dev->ops = &cuda_ops;
    e = cudaSetDevice(ordinal);
    for (int i = 0; i < 2 && !e; i++) e = cudaStreamCreateWithFlags(&c->stream[i], cudaStreamNonBlocking);
    pp_status s = e ? pp_cuda_error(dev, e, "creating streams") : PP_OK;
    if (!s && cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS)
        s = pp_error(PP_ERR_UNSUPPORTED, "no CUDA device: cuBLAS did not initialise on cuda:%d", ordinal);
    /* exact float32 GEMMs (no TF32), so results match the CPU's within 1e-5 */
    if (!s && (cublasSetStream(c->blas, c->stream[PP_STREAM_COMPUTE]) != CUBLAS_STATUS_SUCCESS ||
               cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS))
        s = pp_error(PP_ERR_INTERNAL, "cuda:%d: configuring cuBLAS failed", ordinal);
    if (s) {
        cuda_close(dev);
        dev->impl = NULL;
        dev->ops = NULL;
    }
    return s;
}

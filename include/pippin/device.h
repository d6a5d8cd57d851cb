/* Devices: where a stage's nodes run and where their tensors live.
 *
 * Modelled on ggml's backend interface (buffers per backend, async copies,
 * events) and ONNX Runtime's execution providers (each backend claims the
 * nodes it can run; the CPU takes the rest, with copies inserted where a
 * value crosses between them). The CPU is the default: an executor without
 * a device runs exactly as before.
 *
 * A device tensor is an ordinary pp_tensor whose data lives in a backend's
 * memory (pp_tensor_device says which); its data pointer must not be read on
 * the host. Device tensors exist only inside a run of pp_exec_run_nodes /
 * pp_exec_run: whatever a run leaves behind (outputs, stashed values) comes
 * back to host memory through the device's copy stream, so stages, the
 * transport and checkpoints only ever see host tensors. The exception is a
 * training stage on a device: it keeps its parameters, their gradients,
 * its optimizer's state and its stash between F, I and W on the device
 * across runs and steps, downloads what it hands out (outputs, input
 * gradients) and brings its parameters back on demand (pippin/stage.h:
 * pp_stage_params, pp_stage_param_copy).
 *
 * Each pp_device is one instance with its own compute stream and copy
 * stream (open one per stage), and its own memory pool.
 *
 * Thread safety: one thread uses a given pp_device. */
#ifndef PIPPIN_DEVICE_H
#define PIPPIN_DEVICE_H

#include "pippin/export.h"

#include <stddef.h>
#include <stdint.h>

#include "pippin/exec.h"
#include "pippin/graph.h"
#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a buffer lives. */
typedef enum pp_memory_kind {
    PP_MEMORY_HOST = 0,   /* ordinary host memory (the CPU backend's) */
    PP_MEMORY_PINNED = 1, /* page-locked host memory: staging for async copies */
    PP_MEMORY_DEVICE = 2  /* the device's own memory */
} pp_memory_kind;

typedef struct pp_device pp_device;

/* Opens a device from its spec:
 *   "cpu"                the CPU (the default; claims no node)
 *   "cuda" or "cuda:N"   CUDA device N (0 by default); without a CUDA build
 *                        or without a device: PP_ERR_UNSUPPORTED, "no CUDA
 *                        device: ..."
 *   "fake" or "fake:Op,Op,..."  a test backend: separate host memory, every
 *                        copy counted, claims the listed ops (default: Add,
 *                        Sub, Mul, Div, Relu, MatMul, Softmax) and runs them
 *                        with the CPU kernels.
 * Errors name the spec. */
PP_API pp_status pp_device_open(const char *spec, pp_device **out);
PP_API void pp_device_close(pp_device *dev);
/* "cpu", "cuda:0", "fake". */
PP_API const char *pp_device_name(const pp_device *dev);
PP_API int pp_device_is_cpu(const pp_device *dev);
/* Checks a spec's form without opening it ("cpu", "cuda", "cuda:N", "fake[:ops]"). */
PP_API pp_status pp_device_spec_check(const char *spec);

/* 1 if the device claims node `node` of g (its op and dtypes). */
PP_API int pp_device_supports(const pp_device *dev, const pp_graph *g, int node);

/* The device a tensor's data lives on; NULL for host memory. */
PP_API pp_device *pp_tensor_device(const pp_tensor *t);

/* Copies a host tensor to the device (on the copy stream; the compute stream
 * waits for it) and back (the host copy lands in pinned staging memory and is
 * complete when this returns). */
PP_API pp_status pp_device_upload(pp_device *dev, const pp_tensor *host, pp_tensor **out);
PP_API pp_status pp_device_download(pp_device *dev, const pp_tensor *dt, pp_tensor **out);

/* Starts a download on the copy stream without waiting: *out is pinned host
 * memory, valid once pp_device_staging_wait(dev, *out) returns (any device's
 * staging buffer may be waited for; a completed one returns at once). The compute
 * stream goes on meanwhile (the transport sends microbatch k while k+1
 * computes). */
PP_API pp_status pp_device_download_async(pp_device *dev, const pp_tensor *dt, pp_tensor **out);
PP_API pp_status pp_device_staging_wait(pp_device *dev, const pp_tensor *staged);
/* 1 while t is a staging buffer whose download has not been waited for
 * (its bytes are not there yet); 0 for any other tensor. */
PP_API int pp_tensor_pending(const pp_tensor *t);
/* Waits for t's download when it is pending; PP_OK at once otherwise
 * (any tensor may be passed). */
PP_API pp_status pp_tensor_wait(const pp_tensor *t);

typedef struct pp_device_stats {
    int64_t uploads, downloads;       /* host->device and device->host copies */
    int64_t upload_bytes, download_bytes;
    int64_t kernels;                  /* nodes the device ran */
    int64_t fallbacks;                /* claimed nodes it handed to the CPU at run time (a dtype it lacks) */
    int64_t allocs, pool_hits;        /* buffers asked for; of them, served from the pool */
    int64_t bytes_in_use, bytes_pooled;
    int64_t peak_bytes_in_use;        /* the most bytes_in_use reached since the last reset */
} pp_device_stats;

PP_API void pp_device_get_stats(const pp_device *dev, pp_device_stats *out);
PP_API void pp_device_reset_stats(pp_device *dev);

/* Places an executor's nodes: those dev claims run on it, the rest on the
 * CPU, with copies where values cross. Nodes the shape cache answers (shape
 * arithmetic, pure functions of constants) stay on the CPU. NULL or a CPU
 * device: everything on the CPU (the default). dev must outlive ex or be
 * replaced first. */
PP_API pp_status pp_exec_set_device(pp_exec *ex, pp_device *dev);
/* Where node i runs: the device's name or "cpu". */
PP_API const char *pp_exec_node_device(const pp_exec *ex, int node);

#ifdef __cplusplus
}
#endif
#endif

/* Internal: what a device backend implements (lib/device.c calls it), and the
 * executor's placement hook (lib/device_exec.c). Backends: the CPU (no
 * table: nodes run their op's CPU kernel), the fake test device
 * (lib/device_fake.c) and CUDA (lib/cuda/, -Dcuda=enabled). */
#ifndef PIPPIN_DEVICE_BACKEND_H
#define PIPPIN_DEVICE_BACKEND_H

#include "pippin/device.h"

#include <pthread.h>

#include "cuda/kernel_math.h"
#include "op.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pp_stream { PP_STREAM_COMPUTE = 0, PP_STREAM_COPY = 1 } pp_stream;
typedef enum pp_copy_dir { PP_COPY_TO_DEVICE = 0, PP_COPY_TO_HOST = 1 } pp_copy_dir;

typedef struct pp_backend_ops {
    /* Raw memory of a kind (the pool in lib/device.c sits above). */
    pp_status (*alloc)(pp_device *dev, pp_memory_kind kind, size_t bytes, void **ptr);
    void (*release)(pp_device *dev, pp_memory_kind kind, void *ptr);
    /* Queues a copy on a stream; host memory on either side is pinned or
     * ordinary (an ordinary one may make the copy synchronous). */
    pp_status (*copy)(pp_device *dev, pp_stream stream, void *dst, const void *src, size_t bytes, pp_copy_dir dir);
    /* Makes `waiter` wait for everything queued on `other` so far (an event
     * recorded on other, waited on by waiter; the host does not block). */
    pp_status (*stream_wait)(pp_device *dev, pp_stream waiter, pp_stream other);
    /* An event recorded on a stream now, the host's wait for it, its end. */
    pp_status (*event_record)(pp_device *dev, pp_stream stream, void **event);
    pp_status (*event_wait)(pp_device *dev, void *event);
    void (*event_free)(pp_device *dev, void *event);
    /* Claims a node (op, attributes, dtypes as far as known). */
    int (*supports)(const pp_device *dev, const pp_graph *g, const pp_node *n);
    /* 1 when input k of a claimed node is read on the host (a shape, axes):
     * the executor passes it as a host tensor. May be NULL (none). */
    int (*input_on_host)(const pp_node *n, int k);
    /* A buffer of `kind` just handed out by the pool (fresh or reused);
     * may be NULL. The fake device fills it with NaN bytes, so a kernel
     * that reads memory it never wrote, or a host read of a download not
     * waited for, shows on the CPU. */
    void (*handed_out)(pp_device *dev, pp_memory_kind kind, void *ptr, size_t bytes);
    /* Runs a claimed node on the compute stream: inputs are device tensors
     * (host ones where input_on_host says so), outputs new device tensors
     * (pp_device_tensor_new). */
    pp_status (*run)(pp_device *dev, pp_kernel_ctx *ctx);
    /* A stage's resident parameters (stages/device_params.c), on the
     * compute stream, over device memory: zero bytes, dst[i] += src[i],
     * and one optimizer update (the math of lib/cuda/kernel_math.h, which
     * is stages/optim.c's). NULL (all four): the backend keeps no
     * parameters and they cross in every run. */
    pp_status (*zero)(pp_device *dev, void *ptr, size_t bytes);
    pp_status (*add_into)(pp_device *dev, float *dst, const float *src, int64_t n);
    pp_status (*sgd)(pp_device *dev, const pp_km_sgd *c, float *p, const float *grad, float *buf, int64_t n);
    pp_status (*adamw)(pp_device *dev, const pp_km_adamw *c, float *p, const float *grad, float *m, float *v,
                       int64_t n);
    void (*close)(pp_device *dev);
} pp_backend_ops;

/* A device's pool: freed buffers kept by kind and rounded size for reuse. */
typedef struct pp_device_block {
    pp_memory_kind kind;
    size_t size;
    void *ptr;
} pp_device_block;

struct pp_device {
    const pp_backend_ops *ops; /* NULL: the CPU */
    char name[32];
    void *impl;                /* the backend's state */
    pp_device_stats stats;
    /* The pool may be given buffers back on other threads (the transport
     * frees a sent tensor on its I/O thread): under pool_lock. */
    pthread_mutex_t pool_lock;
    pp_device_block *free_blocks;
    int n_free, cap_free;
    /* The owner's reference plus one per live buffer: a tensor may outlive
     * pp_device_close (a stage's output), so the device goes with the last. */
    int refs; /* atomic */
};

/* Opens a backend into dev (name already set); lib/device_fake.c and
 * lib/cuda/cuda_backend.cu (or device_nocuda.c without CUDA). */
pp_status pp_fake_device_open(pp_device *dev, const char *ops_list);
pp_status pp_cuda_device_open(pp_device *dev, int ordinal);

/* A new uninitialised tensor of `kind` memory on dev, from its pool. */
pp_status pp_device_tensor_new(pp_device *dev, pp_memory_kind kind, pp_dtype dt, int ndim,
                               const int64_t *shape, pp_tensor **out);
/* A device tensor viewing parent's memory from byte offset on (which
 * must hold the view); it keeps parent alive. */
pp_status pp_device_tensor_view(pp_tensor *parent, size_t offset, pp_dtype dt, int ndim, const int64_t *shape,
                                pp_tensor **out);
/* Counted copies between host memory and device memory by raw pointers
 * (device_ptr is device memory of dev): copy_in returns once src may be
 * reused and the compute stream waits for it; copy_out returns once dst
 * holds the bytes (after the compute stream's work so far). */
pp_status pp_device_copy_in(pp_device *dev, void *device_ptr, const void *src, size_t bytes);
pp_status pp_device_copy_out(pp_device *dev, void *dst, const void *device_ptr, size_t bytes);
/* Test hook: after n more copies out succeed, every one fails (as a
 * device that failed would) until called with n < 0. Process-wide. */
void pp_device_fail_copies_out_after(int n);
/* 1 if dev keeps a stage's parameters (the ops above are there). */
int pp_device_keeps_params(const pp_device *dev);
/* The memory kind of a tensor made by pp_device_tensor_new; HOST otherwise. */
pp_memory_kind pp_tensor_memory_kind(const pp_tensor *t);

/* The executor's placement (lib/device_exec.c), owned by a pp_exec. */
typedef struct pp_device_plan pp_device_plan;
pp_status pp_device_plan_new(pp_device *dev, const pp_graph *g, const uint8_t *static_node,
                             pp_device_plan **out);
void pp_device_plan_free(pp_device_plan *p);
const char *pp_device_plan_node_device(const pp_device_plan *p, int node);
/* Runs node ctx->node (index i) where it is placed, copying inputs that live
 * on the other side (one copy per value and direction while it lives). */
pp_status pp_device_plan_run(pp_device_plan *p, int i, pp_kernel_ctx *ctx);
/* The executor freed value v: drop its copy on the other side. */
void pp_device_plan_drop(pp_device_plan *p, int v);
/* on = 1: parameters' device copies are kept across runs as constants'
 * are (the executor's parameters are constant: an inference stage's). */
void pp_device_plan_keep_params(pp_device_plan *p, int on);
/* Drops every copy kept across runs (the host wrote constants in place). */
void pp_device_plan_forget(pp_device_plan *p);
/* End of a run: values left on the device come back to (pinned) host
 * memory in env, but those `resident` marks (may be NULL), which stay on
 * the device; copies of constants stay for the next run, but those of the
 * constants `host_written` marks (may be NULL), which the host may change
 * before it. The downloads of values `no_wait` marks (may be NULL) are
 * left in flight (pp_tensor_pending); the others are waited for. */
pp_status pp_device_plan_finish(pp_device_plan *p, pp_tensor **env, const uint8_t *resident,
                                const uint8_t *host_written, const uint8_t *no_wait);

/* Values (one byte per graph value, kept by the caller; NULL: none) that
 * the caller holds on the device across runs (lib/exec.c): a stage's
 * parameters, whose device tensors it puts in env itself, and their
 * gradients. They stay on the device when a run ends, and the value hook
 * is handed them on the device too. */
void pp_exec_set_device_values(pp_exec *ex, const uint8_t *resident);

/* Constants (one byte per graph value, kept by the caller; NULL: none)
 * that the host writes in place between runs: a training stage's state
 * (BatchNorm's running statistics, updated after every microbatch and
 * loaded by checkpoints). The device copy of a constant is kept by the
 * tensor it copies, which an in-place write does not change, so these are
 * copied again at each run instead. */
void pp_exec_set_host_written(pp_exec *ex, const uint8_t *host_written);

/* on = 1: pp_exec_run leaves the downloads of the graph's outputs in
 * flight: an output may come back pending (pp_tensor_pending) and must be
 * waited for (pp_tensor_wait) before its bytes are read. The caller (a
 * stage whose sends overlap the next compute) then waits when it needs
 * them. 0 (the default): every output is complete when the run returns. */
void pp_exec_set_async_outputs(pp_exec *ex, int on);

#ifdef __cplusplus
}
#endif
#endif

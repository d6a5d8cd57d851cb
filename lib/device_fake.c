/* The fake device: a backend for tests. Its "device memory" is separate
 * host memory (the counters in lib/device.c see every copy into and out of
 * it), it claims a chosen set of ops and runs them with the CPU kernels, so
 * placement, fallback, boundary copies and staging are checked on any
 * machine, and results must equal the CPU's bit for bit. */
#include "device_backend.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status_internal.h"

#define FAKE_MAX_OPS 64

/* A copy queued on the copy stream, done when something waits for it. */
typedef struct fake_copy {
    void *dst;
    const void *src;
    size_t bytes;
    uint64_t seq;
} fake_copy;

/* Strict as a real device may be: fresh buffers hold NaN bytes, and a copy
 * on the copy stream happens as late as the stream semantics allow: when
 * the compute stream waits for the copy stream, or an event recorded
 * after it is waited for (it reads its source then, as a DMA from pinned
 * memory does). Code that reads a download before waiting for it, frees
 * or reuses a copy's source too early, or computes on an upload the
 * compute stream did not wait for sees NaN or stale bytes. The compute
 * stream runs eagerly: a kernel is done when its node returns. */
typedef struct fake_device {
    int n_ops;
    char ops[FAKE_MAX_OPS][32];
    pthread_mutex_t lock; /* buffers are released on other threads too */
    fake_copy *pending;
    int n_pending, cap_pending;
    uint64_t seq; /* copies queued so far */
} fake_device;

static const char *const default_ops[] = {"Add", "Sub", "Mul", "Div", "Relu", "MatMul", "Softmax"};

/* Does the queued copies up to and including number `upto`, in order. */
static void flush_locked(fake_device *f, uint64_t upto) {
    int k = 0;
    for (; k < f->n_pending && f->pending[k].seq <= upto; k++)
        if (f->pending[k].bytes) memcpy(f->pending[k].dst, f->pending[k].src, f->pending[k].bytes);
    if (k) memmove(f->pending, f->pending + k, sizeof *f->pending * (size_t)(f->n_pending - k));
    f->n_pending -= k;
}

static void flush(fake_device *f, uint64_t upto) {
    pthread_mutex_lock(&f->lock);
    flush_locked(f, upto);
    pthread_mutex_unlock(&f->lock);
}

static pp_status fake_alloc(pp_device *dev, pp_memory_kind kind, size_t bytes, void **ptr) {
    *ptr = aligned_alloc(64, bytes);
    return *ptr ? PP_OK : pp_error(PP_ERR_NOMEM, "%s: out of memory allocating %zu bytes", dev->name, bytes);
}

static void fake_release(pp_device *dev, pp_memory_kind kind, void *ptr) {
    flush(dev->impl, UINT64_MAX); /* as cudaFree waits for the device */
    free(ptr);
}

static void fake_handed_out(pp_device *dev, pp_memory_kind kind, void *ptr, size_t bytes) {
    memset(ptr, 0xff, bytes); /* NaN as float32, -1 as integers */
}

static pp_status fake_copy_op(pp_device *dev, pp_stream stream, void *dst, const void *src, size_t bytes,
                              pp_copy_dir dir) {
    fake_device *f = dev->impl;
    if (stream == PP_STREAM_COMPUTE) { /* in order after the (eager) kernels */
        memcpy(dst, src, bytes);
        return PP_OK;
    }
    pthread_mutex_lock(&f->lock);
    if (f->n_pending == f->cap_pending) {
        int cap = f->cap_pending ? f->cap_pending * 2 : 64;
        fake_copy *np = realloc(f->pending, sizeof *np * (size_t)cap);
        if (!np) {
            pthread_mutex_unlock(&f->lock);
            return pp_error(PP_ERR_NOMEM, "%s: out of memory queueing a copy", dev->name);
        }
        f->pending = np;
        f->cap_pending = cap;
    }
    f->pending[f->n_pending++] = (fake_copy){dst, src, bytes, ++f->seq};
    pthread_mutex_unlock(&f->lock);
    return PP_OK;
}

static pp_status fake_stream_wait(pp_device *dev, pp_stream waiter, pp_stream other) {
    /* the compute stream waiting for copies: they are done before its next kernel */
    if (waiter == PP_STREAM_COMPUTE && other == PP_STREAM_COPY) flush(dev->impl, UINT64_MAX);
    return PP_OK;
}

/* An event: the number of copies queued when it was recorded (0 on the
 * compute stream, whose work is done already). */
static pp_status fake_event_record(pp_device *dev, pp_stream stream, void **event) {
    fake_device *f = dev->impl;
    uint64_t *e = malloc(sizeof *e);
    if (!e) return pp_error(PP_ERR_NOMEM, "%s: out of memory", dev->name);
    pthread_mutex_lock(&f->lock);
    *e = stream == PP_STREAM_COPY ? f->seq : 0;
    pthread_mutex_unlock(&f->lock);
    *event = e;
    return PP_OK;
}

static pp_status fake_event_wait(pp_device *dev, void *event) {
    flush(dev->impl, *(uint64_t *)event);
    return PP_OK;
}

static void fake_event_free(pp_device *dev, void *event) { free(event); }

static int fake_supports(const pp_device *dev, const pp_graph *g, const pp_node *n) {
    const fake_device *f = dev->impl;
    /* by op type in any domain: pippin's gradient helpers too */
    for (int i = 0; i < f->n_ops; i++)
        if (!strcmp(f->ops[i], n->op_type)) return 1;
    return 0;
}

/* The inputs the CUDA backend reads on the host (lib/cuda/cuda_ops.c's
 * table: shapes, axes, indices, labels), so the fake copies what CUDA
 * would: bit k of the op's entry is input k. */
static const struct {
    const char *op;
    int host_inputs;
} host_reads[] = {
    {"MatMulGradA", 1 << 2}, {"MatMulGradB", 1 << 2}, {"SumToShape", 1 << 1},
    {"Gather", 1 << 1},      {"GatherGrad", 1 << 1 | 1 << 2}, {"SoftmaxCrossEntropyLoss", 1 << 1},
    {"SoftmaxCrossEntropyLossGrad", 1 << 2}, {"Reshape", 1 << 1}, {"Squeeze", 1 << 1},
    {"Unsqueeze", 1 << 1}, {"Split", 1 << 1}, {"CausalAttention", 1 << 3}, {"CausalAttentionGrad", 1 << 4},
};

static int fake_input_on_host(const pp_node *n, int k) {
    for (size_t i = 0; i < sizeof host_reads / sizeof *host_reads; i++)
        if (!strcmp(host_reads[i].op, n->op_type)) return host_reads[i].host_inputs >> k & 1;
    return 0;
}

/* The CPU kernel reads the inputs in place (fake device memory is host
 * memory); its outputs move into device memory, uncounted: on a real device
 * they would be computed there. */
static pp_status fake_run(pp_device *dev, pp_kernel_ctx *ctx) {
    PP_TRY(ctx->node->op->run(ctx));
    for (int k = 0; k < ctx->n_out; k++) {
        pp_tensor *o = ctx->out[k];
        if (!o || pp_tensor_device(o) == dev) continue;
        pp_tensor *d;
        pp_status s = pp_device_tensor_new(dev, PP_MEMORY_DEVICE, o->dtype, o->ndim, o->shape, &d);
        if (s != PP_OK) return s; /* the executor frees ctx->out */
        if (o->nbytes) memcpy(d->data, o->data, o->nbytes);
        pp_tensor_free(o);
        ctx->out[k] = d;
    }
    dev->stats.kernels++;
    return PP_OK;
}

/* Resident parameters: the loops of the CUDA kernels (kernel_math.h) over
 * fake device memory, on the (eager) compute stream. */
static pp_status fake_zero(pp_device *dev, void *ptr, size_t bytes) {
    (void)dev;
    memset(ptr, 0, bytes);
    return PP_OK;
}

static pp_status fake_add_into(pp_device *dev, float *dst, const float *src, int64_t n) {
    (void)dev;
    for (int64_t i = 0; i < n; i++) dst[i] = pp_km_binary(PP_KM_ADD, dst[i], src[i]);
    return PP_OK;
}

static pp_status fake_sgd(pp_device *dev, const pp_km_sgd *c, float *p, const float *grad, float *buf, int64_t n) {
    (void)dev;
    for (int64_t i = 0; i < n; i++) pp_km_sgd_step(c, p, grad, buf, i);
    return PP_OK;
}

static pp_status fake_adamw(pp_device *dev, const pp_km_adamw *c, float *p, const float *grad, float *m, float *v,
                            int64_t n) {
    (void)dev;
    for (int64_t i = 0; i < n; i++) pp_km_adamw_step(c, p, grad, m, v, i);
    return PP_OK;
}

static void fake_close(pp_device *dev) {
    fake_device *f = dev->impl;
    flush(f, UINT64_MAX);
    pthread_mutex_destroy(&f->lock);
    free(f->pending);
    free(f);
}

static const pp_backend_ops fake_ops = {
    .alloc = fake_alloc,
    .release = fake_release,
    .copy = fake_copy_op,
    .stream_wait = fake_stream_wait,
    .event_record = fake_event_record,
    .event_wait = fake_event_wait,
    .event_free = fake_event_free,
    .handed_out = fake_handed_out,
    .supports = fake_supports,
    .input_on_host = fake_input_on_host,
    .run = fake_run,
    .zero = fake_zero,
    .add_into = fake_add_into,
    .sgd = fake_sgd,
    .adamw = fake_adamw,
    .close = fake_close,
};

static pp_status add_op(fake_device *f, const char *name, size_t len) {
    if (len == 0 || len >= sizeof f->ops[0])
        return pp_error(PP_ERR_INVALID, "fake device: op name '%.*s' is empty or too long", (int)len, name);
    if (f->n_ops == FAKE_MAX_OPS) return pp_error(PP_ERR_INVALID, "fake device: more than %d ops", FAKE_MAX_OPS);
    memcpy(f->ops[f->n_ops], name, len);
    f->ops[f->n_ops++][len] = '\0';
    return PP_OK;
}

pp_status pp_fake_device_open(pp_device *dev, const char *ops_list) {
    fake_device *f = calloc(1, sizeof *f);
    if (!f) return pp_error(PP_ERR_NOMEM, "fake device: out of memory");
    pp_status s = PP_OK;
    if (!ops_list) {
        for (size_t i = 0; i < sizeof default_ops / sizeof *default_ops && !s; i++)
            s = add_op(f, default_ops[i], strlen(default_ops[i]));
    } else {
        for (const char *p = ops_list; !s;) { /* comma-separated op types */
            const char *c = strchr(p, ',');
            size_t len = c ? (size_t)(c - p) : strlen(p);
            s = add_op(f, p, len);
            if (!c) break;
            p = c + 1;
        }
    }
    if (s != PP_OK) {
        free(f);
        return s;
    }
    pthread_mutex_init(&f->lock, NULL);
    dev->impl = f;
    dev->ops = &fake_ops;
    return PP_OK;
}

/* The fake device: a backend for tests. Its "device memory" is separate
 * host memory (the counters in lib/device.c see every copy into and out of
 * it), it claims a chosen set of ops and runs them with the CPU kernels, so
 * placement, fallback, boundary copies and staging are checked on any
 * machine, and results must equal the CPU's bit for bit. */
#include "device_backend.h"

#include <stdlib.h>
#include <string.h>

#include "status_internal.h"

#define FAKE_MAX_OPS 64

typedef struct fake_device {
    int n_ops;
    char ops[FAKE_MAX_OPS][32];
} fake_device;

static const char *const default_ops[] = {"Add", "Sub", "Mul", "Div", "Relu", "MatMul", "Softmax"};

static pp_status fake_alloc(pp_device *dev, pp_memory_kind kind, size_t bytes, void **ptr) {
    *ptr = aligned_alloc(64, bytes);
    return *ptr ? PP_OK : pp_error(PP_ERR_NOMEM, "%s: out of memory allocating %zu bytes", dev->name, bytes);
}

static void fake_release(pp_device *dev, pp_memory_kind kind, void *ptr) { free(ptr); }

/* Streams are in order and the host waits for nothing: copies happen now. */
static pp_status fake_copy(pp_device *dev, pp_stream stream, void *dst, const void *src, size_t bytes,
                           pp_copy_dir dir) {
    memcpy(dst, src, bytes);
    return PP_OK;
}

static pp_status fake_stream_wait(pp_device *dev, pp_stream waiter, pp_stream other) { return PP_OK; }

static int fake_event; /* events are complete when recorded: one shared token */

static pp_status fake_event_record(pp_device *dev, pp_stream stream, void **event) {
    *event = &fake_event;
    return PP_OK;
}

static pp_status fake_event_wait(pp_device *dev, void *event) { return PP_OK; }
static void fake_event_free(pp_device *dev, void *event) {}

static int fake_supports(const pp_device *dev, const pp_graph *g, const pp_node *n) {
    const fake_device *f = dev->impl;
    /* by op type in any domain: pippin's gradient helpers too */
    for (int i = 0; i < f->n_ops; i++)
        if (!strcmp(f->ops[i], n->op_type)) return 1;
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

static void fake_close(pp_device *dev) { free(dev->impl); }

static const pp_backend_ops fake_ops = {
    .alloc = fake_alloc,
    .release = fake_release,
    .copy = fake_copy,
    .stream_wait = fake_stream_wait,
    .event_record = fake_event_record,
    .event_wait = fake_event_wait,
    .event_free = fake_event_free,
    .supports = fake_supports,
    .input_on_host = NULL,
    .run = fake_run,
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
    dev->impl = f;
    dev->ops = &fake_ops;
    return PP_OK;
}

/* Devices: opening one from its spec, its memory pool, device tensors,
 * copies between host and device, and counters (pippin/device.h). The
 * backends behind the table are lib/device_fake.c and lib/cuda/. */
#include "device_backend.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status_internal.h"

/* ------------------------------------------------------------- specs */

/* "cuda" / "cuda:N": N in *ordinal; 0 if spec is not of that form. */
static int parse_cuda(const char *spec, int *ordinal) {
    if (strncmp(spec, "cuda", 4) != 0) return 0;
    if (spec[4] == '\0') return *ordinal = 0, 1;
    if (spec[4] != ':' || !spec[5]) return 0;
    char *end;
    long v = strtol(spec + 5, &end, 10);
    if (*end || v < 0 || v > 1024) return 0;
    *ordinal = (int)v;
    return 1;
}

pp_status pp_device_spec_check(const char *spec) {
    int ord;
    if (!spec) return pp_error(PP_ERR_INVALID, "device: no spec given");
    if (!strcmp(spec, "cpu") || parse_cuda(spec, &ord) || !strcmp(spec, "fake") || !strncmp(spec, "fake:", 5))
        return PP_OK;
    return pp_error(PP_ERR_INVALID, "device '%.60s': expected cpu, cuda, cuda:N or fake[:ops]", spec);
}

pp_status pp_device_open(const char *spec, pp_device **out) {
    *out = NULL;
    PP_TRY(pp_device_spec_check(spec));
    pp_device *dev = calloc(1, sizeof *dev);
    if (!dev) return pp_error(PP_ERR_NOMEM, "device '%s': out of memory", spec);
    pthread_mutex_init(&dev->pool_lock, NULL);
    atomic_init((atomic_int *)&dev->refs, 1);
    int ordinal = 0;
    pp_status s = PP_OK;
    if (!strcmp(spec, "cpu")) {
        snprintf(dev->name, sizeof dev->name, "cpu");
    } else if (parse_cuda(spec, &ordinal)) {
        snprintf(dev->name, sizeof dev->name, "cuda:%d", ordinal);
        s = pp_cuda_device_open(dev, ordinal);
    } else {
        snprintf(dev->name, sizeof dev->name, "fake");
        s = pp_fake_device_open(dev, spec[4] == ':' ? spec + 5 : NULL);
    }
    if (s != PP_OK) {
        pthread_mutex_destroy(&dev->pool_lock);
        free(dev);
        return pp_error_context(s, "device '%s'", spec);
    }
    *out = dev;
    return PP_OK;
}

static void device_unref(pp_device *dev) {
    if (atomic_fetch_sub((atomic_int *)&dev->refs, 1) != 1) return;
    for (int i = 0; i < dev->n_free; i++) dev->ops->release(dev, dev->free_blocks[i].kind, dev->free_blocks[i].ptr);
    free(dev->free_blocks);
    if (dev->ops && dev->ops->close) dev->ops->close(dev);
    pthread_mutex_destroy(&dev->pool_lock);
    free(dev);
}

void pp_device_close(pp_device *dev) {
    if (dev) device_unref(dev);
}

const char *pp_device_name(const pp_device *dev) { return dev ? dev->name : "cpu"; }
int pp_device_is_cpu(const pp_device *dev) { return !dev || !dev->ops; }

int pp_device_supports(const pp_device *dev, const pp_graph *g, int node) {
    if (pp_device_is_cpu(dev) || node < 0 || node >= g->n_nodes) return 0;
    return dev->ops->supports(dev, g, &g->nodes[node]);
}

void pp_device_get_stats(const pp_device *dev, pp_device_stats *out) {
    memset(out, 0, sizeof *out);
    if (!dev) return;
    pthread_mutex_lock((pthread_mutex_t *)&dev->pool_lock);
    *out = dev->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&dev->pool_lock);
}

void pp_device_reset_stats(pp_device *dev) {
    pthread_mutex_lock(&dev->pool_lock);
    int64_t in_use = dev->stats.bytes_in_use, pooled = dev->stats.bytes_pooled;
    memset(&dev->stats, 0, sizeof dev->stats);
    dev->stats.bytes_in_use = in_use;
    dev->stats.peak_bytes_in_use = in_use;
    dev->stats.bytes_pooled = pooled;
    pthread_mutex_unlock(&dev->pool_lock);
}

/* -------------------------------------------------------------- pool */

/* A buffer handed out: the free hint of its tensor. */
typedef struct device_buffer {
    pp_device *dev;
    pp_memory_kind kind;
    size_t size;
    void *event; /* pinned staging: the download's event, until waited for */
    pp_tensor *source; /* pinned staging: the downloaded tensor, kept until then (the copy reads it) */
    pp_tensor *parent; /* a view (pp_device_tensor_view): the tensor whose memory it is */
} device_buffer;

/* Sizes round up to 256 bytes (a block serves any request of its size). */
static size_t round_size(size_t n) { return (n + 255) & ~(size_t)255; }

/* Under pool_lock. */
static void in_use_add(pp_device *dev, int64_t n) {
    dev->stats.bytes_in_use += n;
    if (dev->stats.bytes_in_use > dev->stats.peak_bytes_in_use) dev->stats.peak_bytes_in_use = dev->stats.bytes_in_use;
}

static pp_status pool_take(pp_device *dev, pp_memory_kind kind, size_t size, void **ptr) {
    pthread_mutex_lock(&dev->pool_lock);
    dev->stats.allocs++;
    for (int i = 0; i < dev->n_free; i++) {
        pp_device_block *b = &dev->free_blocks[i];
        if (b->kind != kind || b->size != size) continue;
        *ptr = b->ptr;
        dev->free_blocks[i] = dev->free_blocks[--dev->n_free];
        dev->stats.pool_hits++;
        dev->stats.bytes_pooled -= (int64_t)size;
        in_use_add(dev, (int64_t)size);
        pthread_mutex_unlock(&dev->pool_lock);
        return PP_OK;
    }
    pthread_mutex_unlock(&dev->pool_lock);
    PP_TRY(dev->ops->alloc(dev, kind, size, ptr));
    pthread_mutex_lock(&dev->pool_lock);
    in_use_add(dev, (int64_t)size);
    pthread_mutex_unlock(&dev->pool_lock);
    return PP_OK;
}

static void pool_give_locked(pp_device *dev, pp_memory_kind kind, size_t size, void *ptr);

static void pool_give(pp_device *dev, pp_memory_kind kind, size_t size, void *ptr) {
    pthread_mutex_lock(&dev->pool_lock);
    pool_give_locked(dev, kind, size, ptr);
    pthread_mutex_unlock(&dev->pool_lock);
}

static void pool_give_locked(pp_device *dev, pp_memory_kind kind, size_t size, void *ptr) {
    dev->stats.bytes_in_use -= (int64_t)size;
    if (dev->n_free == dev->cap_free) {
        int cap = dev->cap_free ? dev->cap_free * 2 : 64;
        pp_device_block *nb = realloc(dev->free_blocks, sizeof *nb * (size_t)cap);
        if (!nb) { /* cannot keep it: give it back */
            dev->ops->release(dev, kind, ptr);
            return;
        }
        dev->free_blocks = nb;
        dev->cap_free = cap;
    }
    dev->free_blocks[dev->n_free++] = (pp_device_block){kind, size, ptr};
    dev->stats.bytes_pooled += (int64_t)size;
}

static void buffer_release(void *data, void *hint) {
    device_buffer *b = hint;
    if (b->event) {
        (void)b->dev->ops->event_wait(b->dev, b->event); /* a copy may still write it */
        b->dev->ops->event_free(b->dev, b->event);
    }
    pp_tensor_free(b->source);
    pp_device *dev = b->dev;
    if (b->parent) pp_tensor_free(b->parent); /* a view gives back no memory */
    else if (data) pool_give(dev, b->kind, b->size, data);
    free(b);
    device_unref(dev); /* the buffer's reference */
}

pp_status pp_device_tensor_new(pp_device *dev, pp_memory_kind kind, pp_dtype dt, int ndim,
                               const int64_t *shape, pp_tensor **out) {
    size_t nbytes;
    PP_TRY(pp_shape_bytes(dt, ndim, shape, &nbytes));
    device_buffer *b = calloc(1, sizeof *b);
    if (!b) return pp_error(PP_ERR_NOMEM, "%s: out of memory", dev->name);
    *b = (device_buffer){dev, kind, round_size(nbytes), NULL, NULL, NULL};
    void *ptr = NULL;
    pp_status s = nbytes ? pool_take(dev, kind, b->size, &ptr) : PP_OK;
    if (s != PP_OK) {
        free(b);
        return pp_error_context(s, "%s: allocating %zu bytes", dev->name, nbytes);
    }
    if (ptr && dev->ops->handed_out) dev->ops->handed_out(dev, kind, ptr, b->size);
    /* pp_tensor_wrap wants data for a non-empty tensor: fill it in after */
    s = pp_tensor_wrap(dt, ndim, shape, ptr, buffer_release, b, out);
    if (s != PP_OK) {
        if (ptr) pool_give(dev, kind, b->size, ptr);
        free(b);
        return s;
    }
    atomic_fetch_add((atomic_int *)&dev->refs, 1);
    return PP_OK;
}

static const device_buffer *buffer_of(const pp_tensor *t) {
    return t && t->free_fn == buffer_release ? t->free_hint : NULL;
}

pp_status pp_device_tensor_view(pp_tensor *parent, size_t offset, pp_dtype dt, int ndim, const int64_t *shape,
                                pp_tensor **out) {
    *out = NULL;
    const device_buffer *pb = buffer_of(parent);
    size_t nbytes;
    PP_TRY(pp_shape_bytes(dt, ndim, shape, &nbytes));
    if (!pb || pb->kind != PP_MEMORY_DEVICE || offset > parent->nbytes || nbytes > parent->nbytes - offset)
        return pp_error(PP_ERR_INVALID, "device view of %zu bytes at %zu: not inside a device tensor of %zu bytes",
                        nbytes, offset, parent ? parent->nbytes : 0);
    pp_device *dev = pb->dev;
    device_buffer *b = calloc(1, sizeof *b);
    if (!b) return pp_error(PP_ERR_NOMEM, "%s: out of memory", dev->name);
    *b = (device_buffer){dev, PP_MEMORY_DEVICE, 0, NULL, NULL, pp_tensor_retain(parent)};
    pp_status s = pp_tensor_wrap(dt, ndim, shape, (char *)parent->data + offset, buffer_release, b, out);
    if (s != PP_OK) {
        pp_tensor_free(parent);
        free(b);
        return s;
    }
    atomic_fetch_add((atomic_int *)&dev->refs, 1);
    return PP_OK;
}

pp_memory_kind pp_tensor_memory_kind(const pp_tensor *t) {
    const device_buffer *b = buffer_of(t);
    return b ? b->kind : PP_MEMORY_HOST;
}

pp_device *pp_tensor_device(const pp_tensor *t) {
    const device_buffer *b = buffer_of(t);
    return b && b->kind == PP_MEMORY_DEVICE ? b->dev : NULL;
}

/* ------------------------------------------------------------ copies */

pp_status pp_device_upload(pp_device *dev, const pp_tensor *host, pp_tensor **out) {
    *out = NULL;
    if (pp_device_is_cpu(dev)) return pp_error(PP_ERR_INVALID, "upload: the CPU has no device memory");
    if (pp_tensor_device(host)) return pp_error(PP_ERR_INVALID, "%s: upload of a tensor already on a device", dev->name);
    pp_tensor *t;
    PP_TRY(pp_device_tensor_new(dev, PP_MEMORY_DEVICE, host->dtype, host->ndim, host->shape, &t));
    /* The copy stream first waits for the compute stream (its reads of the
     * buffer's previous owner), then the compute stream waits for the copy. */
    pp_status s = PP_OK;
    if (host->nbytes) {
        s = dev->ops->stream_wait(dev, PP_STREAM_COPY, PP_STREAM_COMPUTE);
        if (!s) s = dev->ops->copy(dev, PP_STREAM_COPY, t->data, host->data, host->nbytes, PP_COPY_TO_DEVICE);
        if (!s) s = dev->ops->stream_wait(dev, PP_STREAM_COMPUTE, PP_STREAM_COPY);
    }
    if (s != PP_OK) {
        pp_tensor_free(t);
        return pp_error_context(s, "%s: upload of %zu bytes", dev->name, host->nbytes);
    }
    dev->stats.uploads++;
    dev->stats.upload_bytes += (int64_t)host->nbytes;
    *out = t;
    return PP_OK;
}

pp_status pp_device_download_async(pp_device *dev, const pp_tensor *dt, pp_tensor **out) {
    *out = NULL;
    if (pp_tensor_device(dt) != dev || pp_device_is_cpu(dev))
        return pp_error(PP_ERR_INVALID, "%s: download of a tensor not on this device", pp_device_name(dev));
    pp_tensor *t;
    PP_TRY(pp_device_tensor_new(dev, PP_MEMORY_PINNED, dt->dtype, dt->ndim, dt->shape, &t));
    device_buffer *b = (device_buffer *)buffer_of(t);
    pp_status s = PP_OK;
    if (dt->nbytes) {
        s = dev->ops->stream_wait(dev, PP_STREAM_COPY, PP_STREAM_COMPUTE); /* the value is computed */
        if (!s) s = dev->ops->copy(dev, PP_STREAM_COPY, t->data, dt->data, dt->nbytes, PP_COPY_TO_HOST);
        if (!s) s = dev->ops->event_record(dev, PP_STREAM_COPY, &b->event);
        /* the source stays out of the pool until the copy is waited for:
         * the compute stream goes on and would reuse its memory */
        if (!s) b->source = pp_tensor_retain((pp_tensor *)dt);
    }
    if (s != PP_OK) {
        pp_tensor_free(t);
        return pp_error_context(s, "%s: download of %zu bytes", dev->name, dt->nbytes);
    }
    dev->stats.downloads++;
    dev->stats.download_bytes += (int64_t)dt->nbytes;
    *out = t;
    return PP_OK;
}

pp_status pp_device_staging_wait(pp_device *dev, const pp_tensor *staged) {
    device_buffer *b = (device_buffer *)buffer_of(staged);
    if (!b || b->kind != PP_MEMORY_PINNED)
        return pp_error(PP_ERR_INVALID, "%s: not a staging buffer", pp_device_name(dev));
    if (!b->event) return PP_OK;
    /* the device that started the copy waits (another stage's, say) */
    pp_status s = b->dev->ops->event_wait(b->dev, b->event);
    b->dev->ops->event_free(b->dev, b->event);
    b->event = NULL;
    pp_tensor_free(b->source);
    b->source = NULL;
    return s;
}

int pp_tensor_pending(const pp_tensor *t) {
    const device_buffer *b = buffer_of(t);
    return b && b->kind == PP_MEMORY_PINNED && b->event != NULL;
}

pp_status pp_tensor_wait(const pp_tensor *t) {
    if (!pp_tensor_pending(t)) return PP_OK;
    const device_buffer *b = buffer_of(t);
    return pp_device_staging_wait(b->dev, t);
}

int pp_device_keeps_params(const pp_device *dev) {
    return !pp_device_is_cpu(dev) && dev->ops->zero && dev->ops->add_into && dev->ops->sgd && dev->ops->adamw;
}

pp_status pp_device_copy_in(pp_device *dev, void *device_ptr, const void *src, size_t bytes) {
    if (pp_device_is_cpu(dev)) return pp_error(PP_ERR_INVALID, "copy in: the CPU has no device memory");
    if (!bytes) return PP_OK;
    /* as pp_device_upload: after the compute stream's reads, before its next kernel */
    pp_status s = dev->ops->stream_wait(dev, PP_STREAM_COPY, PP_STREAM_COMPUTE);
    if (!s) s = dev->ops->copy(dev, PP_STREAM_COPY, device_ptr, src, bytes, PP_COPY_TO_DEVICE);
    if (!s) s = dev->ops->stream_wait(dev, PP_STREAM_COMPUTE, PP_STREAM_COPY);
    if (s != PP_OK) return pp_error_context(s, "%s: copy of %zu bytes to the device", dev->name, bytes);
    pthread_mutex_lock(&dev->pool_lock);
    dev->stats.uploads++;
    dev->stats.upload_bytes += (int64_t)bytes;
    pthread_mutex_unlock(&dev->pool_lock);
    return PP_OK;
}

static atomic_int copies_out_left = -1; /* < 0: no failure injected */

void pp_device_fail_copies_out_after(int n) { atomic_store(&copies_out_left, n < 0 ? -1 : n); }

pp_status pp_device_copy_out(pp_device *dev, void *dst, const void *device_ptr, size_t bytes) {
    if (pp_device_is_cpu(dev)) return pp_error(PP_ERR_INVALID, "copy out: the CPU has no device memory");
    if (!bytes) return PP_OK;
    for (int left = atomic_load(&copies_out_left); left >= 0;) {
        if (left == 0) return pp_error(PP_ERR_IO, "%s: copy of %zu bytes from the device: failure injected", dev->name, bytes);
        if (atomic_compare_exchange_weak(&copies_out_left, &left, left - 1)) break;
    }
    void *event = NULL;
    pp_status s = dev->ops->stream_wait(dev, PP_STREAM_COPY, PP_STREAM_COMPUTE); /* the values are computed */
    if (!s) s = dev->ops->copy(dev, PP_STREAM_COPY, dst, device_ptr, bytes, PP_COPY_TO_HOST);
    if (!s) s = dev->ops->event_record(dev, PP_STREAM_COPY, &event);
    if (!s) s = dev->ops->event_wait(dev, event);
    if (event) dev->ops->event_free(dev, event);
    if (s != PP_OK) return pp_error_context(s, "%s: copy of %zu bytes from the device", dev->name, bytes);
    pthread_mutex_lock(&dev->pool_lock);
    dev->stats.downloads++;
    dev->stats.download_bytes += (int64_t)bytes;
    pthread_mutex_unlock(&dev->pool_lock);
    return PP_OK;
}

pp_status pp_device_download(pp_device *dev, const pp_tensor *dt, pp_tensor **out) {
    PP_TRY(pp_device_download_async(dev, dt, out));
    pp_status s = pp_device_staging_wait(dev, *out);
    if (s != PP_OK) {
        pp_tensor_free(*out);
        *out = NULL;
    }
    return s;
}

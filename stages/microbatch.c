/* Microbatch split (views, no copies) and merge. */
#include "pippin/microbatch.h"

#include <string.h>

#include "status_internal.h"
int64_t pp_microbatch_rows(int64_t n, int m, int i) { return n / m + (i < n % m ? 1 : 0); }

pp_status pp_microbatch_split(pp_tensor *t, int m, const char *name, pp_tensor **chunks) {
    if (m < 1) return pp_error(PP_ERR_INVALID, "%d microbatches: need at least 1", m);
    if (t->ndim < 1)
        return pp_error(PP_ERR_SHAPE, "input '%s' is a scalar: it has no batch dimension to split", name);
    if (t->shape[0] < m)
        return pp_error(PP_ERR_SHAPE, "input '%s' has %lld samples: too few for %d microbatches", name,
                        (long long)t->shape[0], m);
    int64_t start = 0;
    for (int i = 0; i < m; i++) {
        int64_t rows = pp_microbatch_rows(t->shape[0], m, i);
        pp_status s = pp_tensor_slice0(t, start, rows, &chunks[i]);
        if (s != PP_OK) {
            for (int k = 0; k < i; k++) {
                pp_tensor_free(chunks[k]);
                chunks[k] = NULL; /* the caller may free what it holds */
            }
            return s;
        }
        start += rows;
    }
    return PP_OK;
}

pp_status pp_microbatch_merge(pp_tensor *const *chunks, int m, const char *name, pp_tensor **out) {
    if (m < 1) return pp_error(PP_ERR_INVALID, "nothing to merge for '%s'", name);
    const pp_tensor *c0 = chunks[0];
    if (c0->ndim == 0) {
        PP_TRY(pp_tensor_new(c0->dtype, 0, NULL, out));
        double sum = 0;
        for (int i = 0; i < m; i++) sum += pp_tensor_get_f64(chunks[i], 0);
        pp_tensor_set_f64(*out, 0, sum / m);
        return PP_OK;
    }
    int64_t shape[PP_MAX_DIMS];
    memcpy(shape, c0->shape, sizeof shape);
    shape[0] = 0;
    for (int i = 0; i < m; i++) {
        const pp_tensor *c = chunks[i];
        int same = c->dtype == c0->dtype && c->ndim == c0->ndim;
        for (int d = 1; same && d < c->ndim; d++) same = c->shape[d] == c0->shape[d];
        if (!same) return pp_error(PP_ERR_SHAPE, "output '%s': microbatch %d has another shape or dtype", name, i);
        shape[0] += c->shape[0];
    }
    PP_TRY(pp_tensor_empty(c0->dtype, c0->ndim, shape, out));
    size_t off = 0;
    for (int i = 0; i < m; i++) {
        if (chunks[i]->nbytes) memcpy((char *)(*out)->data + off, chunks[i]->data, chunks[i]->nbytes);
        off += chunks[i]->nbytes;
    }
    return PP_OK;
}

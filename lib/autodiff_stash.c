/* Measuring the stash (and the inputs, the memory plan) per sample with
 * dynamic dims sized by name (the sizes shape probing ran at, or --dim
 * settings). */
#include <stdlib.h>
#include <string.h>

#include "pippin/autodiff.h"

#include "status_internal.h"
/* The size "name=N" in dims gives name; 0 if none does. */
static int64_t named_size(const char *name, size_t len, int n_dims, const char *const *dims) {
    for (int i = 0; i < n_dims; i++) {
        const char *eq = strrchr(dims[i], '=');
        if (eq && (size_t)(eq - dims[i]) == len && strncmp(dims[i], name, len) == 0) {
            long long v = atoll(eq + 1);
            return v > 0 ? v : 0;
        }
    }
    return 0;
}

/* A dim written as a name or a product of names and numbers ("batch*seq",
 * "2*seq"); 0 when a factor is unknown. */
static int64_t dim_size(const char *expr, const char *batch_name, int64_t batch, int n_dims,
                        const char *const *dims) {
    if (batch_name && strcmp(expr, batch_name) == 0) return batch;
    int64_t size = named_size(expr, strlen(expr), n_dims, dims);
    if (size > 0) return size;
    size = 1;
    for (const char *f = expr; *f;) {
        const char *end = strchr(f, '*');
        size_t len = end ? (size_t)(end - f) : strlen(f);
        if (len == 0) return 0;
        char *num_end;
        long long v = strtoll(f, &num_end, 10);
        if (num_end == f + len && v > 0) size *= v;
        else if (batch_name && len == strlen(batch_name) && strncmp(f, batch_name, len) == 0) size *= batch;
        else if ((v = named_size(f, len, n_dims, dims)) > 0) size *= v;
        else return 0;
        f += len + (end != NULL);
    }
    return size;
}

typedef enum { MEASURE_STASH, MEASURE_INPUTS, MEASURE_PLAN, MEASURE_INPLACE } measure;

/* What is measured (the stash, the inputs, the bytes in-place ops did
 * not allocate: one figure; the memory plan: one per phase) at batch 1 and
 * 2 with dims sized as above; a dim no size is known for is the batch if
 * it comes first, else `other`. per_sample[k] and fixed[k] (may be NULL)
 * for each figure k. */
static pp_status stash_per_sample(pp_graph *g, const pp_backward *b, const char *batch_name, int n_dims,
                                  const char *const *dims, int64_t other, measure what,
                                  int64_t *per_sample, int64_t *fixed) {
    int n = b->n_inputs_before, figures = what == MEASURE_PLAN ? PP_PHASES : 1;
    pp_tensor **ins = calloc((size_t)n + 1, sizeof *ins);
    if (!ins) return pp_error(PP_ERR_NOMEM, "out of memory");
    int64_t bytes[2][PP_PHASES] = {{0}};
    pp_status s = PP_OK;
    for (int batch = 1; batch <= 2 && s == PP_OK; batch++) {
        for (int k = 0; k < n && s == PP_OK; k++) {
            const pp_value *v = &g->values[g->inputs[k]];
            if (v->ndim < 0) {
                s = pp_error(PP_ERR_INVALID, "input '%s' has an unknown rank", v->name);
                break;
            }
            int64_t shape[PP_MAX_DIMS];
            for (int d = 0; d < v->ndim; d++) {
                shape[d] = v->shape[d] >= 0 ? v->shape[d]
                           : v->dim_names[d] ? dim_size(v->dim_names[d], batch_name, batch, n_dims, dims)
                                             : 0;
                if (shape[d] <= 0) shape[d] = d == 0 ? batch : other;
            }
            s = pp_tensor_new(v->dtype == PP_DTYPE_UNDEFINED ? PP_F32 : v->dtype, v->ndim, shape, &ins[k]);
        }
        if (s == PP_OK && what == MEASURE_INPUTS)
            for (int k = 0; k < n; k++) bytes[batch - 1][0] += (int64_t)ins[k]->nbytes;
        else if (s == PP_OK && what == MEASURE_PLAN)
            s = pp_backward_plan_phase_bytes(g, b, ins, bytes[batch - 1]);
        else if (s == PP_OK && what == MEASURE_INPLACE)
            s = pp_backward_inplace_bytes(g, b, ins, &bytes[batch - 1][0]);
        else if (s == PP_OK)
            s = pp_backward_stash_bytes(g, b, ins, &bytes[batch - 1][0]);
        for (int k = 0; k < n; k++) {
            pp_tensor_free(ins[k]);
            ins[k] = NULL;
        }
    }
    free(ins);
    PP_TRY(s);
    for (int k = 0; k < figures; k++) {
        per_sample[k] = bytes[1][k] - bytes[0][k];
        if (fixed) fixed[k] = bytes[0][k] - per_sample[k];
    }
    return PP_OK;
}

pp_status pp_backward_stash_per_sample_dims(pp_graph *g, const pp_backward *b, const char *batch_name,
                                            int n_dims, const char *const *dims, int64_t *per_sample,
                                            int64_t *fixed) {
    return stash_per_sample(g, b, batch_name, n_dims, dims, 1, MEASURE_STASH, per_sample, fixed);
}

pp_status pp_backward_input_bytes_per_sample_dims(pp_graph *g, const pp_backward *b, const char *batch_name,
                                                  int n_dims, const char *const *dims, int64_t *per_sample,
                                                  int64_t *fixed) {
    return stash_per_sample(g, b, batch_name, n_dims, dims, 1, MEASURE_INPUTS, per_sample, fixed);
}

pp_status pp_backward_stash_per_sample(pp_graph *g, const pp_backward *b, int64_t other_dims,
                                       int64_t *per_sample, int64_t *fixed) {
    return stash_per_sample(g, b, NULL, 0, NULL, other_dims > 0 ? other_dims : 1, MEASURE_STASH, per_sample, fixed);
}

pp_status pp_backward_plan_phases_per_sample_dims(pp_graph *g, const pp_backward *b, const char *batch_name,
                                                  int n_dims, const char *const *dims, int64_t per_sample[PP_PHASES],
                                                  int64_t fixed[PP_PHASES]) {
    return stash_per_sample(g, b, batch_name, n_dims, dims, 1, MEASURE_PLAN, per_sample, fixed);
}

void pp_backward_plan_bound(const int64_t per_sample[PP_PHASES], const int64_t fixed[PP_PHASES],
                            int64_t *bound_per_sample, int64_t *bound_fixed) {
    int64_t per = 0, fix = 0; /* a phase smaller at batch 2 than at 1 adds nothing per sample */
    for (int p = 0; p < PP_PHASES; p++) {
        if (per_sample[p] > per) per = per_sample[p];
        if (fixed[p] > fix) fix = fixed[p];
    }
    *bound_per_sample = per;
    if (bound_fixed) *bound_fixed = fix;
}

pp_status pp_backward_plan_per_sample_dims(pp_graph *g, const pp_backward *b, const char *batch_name, int n_dims,
                                           const char *const *dims, int64_t *per_sample, int64_t *fixed) {
    int64_t ps[PP_PHASES], fx[PP_PHASES];
    PP_TRY(pp_backward_plan_phases_per_sample_dims(g, b, batch_name, n_dims, dims, ps, fx));
    pp_backward_plan_bound(ps, fx, per_sample, fixed);
    return PP_OK;
}

pp_status pp_backward_inplace_per_sample_dims(pp_graph *g, const pp_backward *b, const char *batch_name,
                                              int n_dims, const char *const *dims, int64_t *per_sample,
                                              int64_t *fixed) {
    return stash_per_sample(g, b, batch_name, n_dims, dims, 1, MEASURE_INPLACE, per_sample, fixed);
}

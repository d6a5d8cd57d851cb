/* In-place elementwise ops: an op's output written into the buffer of an
 * input that dies with it, so a chain of elementwise ops (a bias and
 * residual Add, an activation, a gradient's Add) holds one buffer instead
 * of two at each step.
 *
 * Kernels allocate their own outputs (lib/op.h), so the buffer is handed
 * over at allocation: the executor offers the dying input for the node's
 * duration, and the kernel's first uninitialised allocation of the same
 * dtype and shape takes it. No broadcasting can reach that input: its
 * shape is the output's. The output then holds a reference to the donor
 * tensor, which frees the buffer (to the pool or the memory plan, whose
 * recording sees it die with the output) when the output goes. The kernel
 * sees out->data == in[k]->data and takes its in-place loop, which reads
 * and writes through one pointer (pp_op.inplace). */
#include "inplace.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "mem_plan.h"
#include "op.h"
#include "tensor_pool.h"

static _Thread_local pp_tensor *offered[PP_INPLACE_MAX];
static _Thread_local int n_offered;
static _Thread_local size_t taken_bytes;

void pp_inplace_choose(const pp_graph *g, const int *nodes, int n_nodes, const int *last, const uint8_t *keep,
                       const uint8_t *watch, uint8_t *choice) {
    /* per value: 1 once a node of this list made it */
    uint8_t *made = calloc((size_t)g->n_values + 1, 1);
    for (int p = 0; p < n_nodes; p++) {
        const pp_node *n = &g->nodes[nodes[p]];
        choice[p] = 0;
        unsigned allowed = made && n->op && n->n_out > 0 && n->out[0] >= 0 ? n->op->inplace : 0;
        for (int k = 0; k < n->n_in && k < PP_INPLACE_MAX; k++) {
            int v = n->in[k];
            if (!(allowed & (1u << k)) || v < 0 || !made[v] || last[v] != p || (keep && keep[v]) ||
                (watch && watch[v]))
                continue;
            int twice = 0;
            for (int j = 0; j < n->n_in; j++) twice |= j != k && n->in[j] == v;
            if (!twice) choice[p] |= (uint8_t)(1u << k);
        }
        for (int k = 0; made && k < n->n_out; k++)
            if (n->out[k] >= 0) made[n->out[k]] = 1;
    }
    free(made); /* none (out of memory): nothing goes in place */
}

/* The free function of an output that took a donor's buffer: the donor
 * (hint) held the buffer and lets it go now. */
static void release_donor(void *data, void *hint) {
    (void)data;
    pp_tensor_free(hint);
}

int pp_inplace_can_donate(const pp_tensor *t) {
    if (t->nbytes == 0 || (t->dtype != PP_F32 && t->dtype != PP_F64)) return 0;
    /* through earlier in-place outputs to the tensor that owns the buffer */
    while (atomic_load((const atomic_int *)&t->refcount) == 1 && t->free_fn == release_donor)
        t = t->free_hint;
    return atomic_load((const atomic_int *)&t->refcount) == 1 &&
           (pp_pool_owns(t->free_fn) || pp_mem_plan_owns(t->free_fn));
}

void pp_inplace_offer(pp_tensor *const *donors, int n) {
    n_offered = n < PP_INPLACE_MAX ? n : PP_INPLACE_MAX;
    for (int i = 0; i < n_offered; i++) offered[i] = donors[i];
    taken_bytes = 0;
}

size_t pp_inplace_withdraw(void) {
    size_t n = taken_bytes;
    n_offered = 0;
    taken_bytes = 0;
    return n;
}

int pp_inplace_take(pp_tensor *t, pp_dtype dt, int ndim, const int64_t *shape, size_t nbytes) {
    for (int i = 0; i < n_offered; i++) {
        pp_tensor *d = offered[i];
        if (d->dtype != dt || d->nbytes != nbytes || !pp_shape_equal(d->ndim, d->shape, ndim, shape)) continue;
        n_offered = 0; /* one output per offer */
        taken_bytes = nbytes;
        t->data = d->data;
        t->free_fn = release_donor;
        t->free_hint = pp_tensor_retain(d);
        return 1;
    }
    return 0;
}

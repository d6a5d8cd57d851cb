/* Balanced stages: the min-max partition of per-node costs into
 * contiguous stages (dynamic programming over the node order), and the
 * plans built from it (auto, even, given cuts) with each stage's cost and
 * memory. The costs come from stages/node_costs.c. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/balance.h"
#include "status_internal.h"

/* ------------------------------------------------------------ partition */

typedef struct {
    const pp_balance_problem *pb;
    double *c, *p, *st; /* prefix sums, [n+1] */
    int parts;
} dp_ctx;

static double seg_cost(const dp_ctx *x, int a, int b) {
    const pp_balance_problem *pb = x->pb;
    double t = x->c[b] - x->c[a];
    if (pb->cut_cost && a > 0) t += pb->cut_cost[a];
    if (pb->cut_cost && b < pb->n) t += pb->cut_cost[b];
    return t;
}

/* Part j (0-based) of x->parts holding items a..b-1 fits the cap. */
static int seg_fits(const dp_ctx *x, int a, int b, int j) {
    const pp_balance_problem *pb = x->pb;
    if (pb->memory_cap <= 0) return 1;
    int m = pb->in_flight > 0 ? pb->in_flight : 1;
    int held = x->parts - j < m ? x->parts - j : m;
    return (x->p[b] - x->p[a]) + (x->st[b] - x->st[a]) * held <= pb->memory_cap;
}

static pp_status check_vector(const double *v, int n, const char *what) {
    for (int i = 0; v && i < n; i++)
        if (!(v[i] >= 0) || isinf(v[i]))
            return pp_error(PP_ERR_INVALID, "balance: %s[%d] = %g (need a finite cost >= 0)", what, i, v[i]);
    return PP_OK;
}

pp_status pp_balance_partition(const pp_balance_problem *pb, int n_parts, int *starts, double *max_cost) {
    int n = pb->n;
    if (n_parts < 1) return pp_error(PP_ERR_INVALID, "balance: %d stages (need at least 1)", n_parts);
    if (n_parts > n)
        return pp_error(PP_ERR_INVALID,
                        "balance: cannot cut %d nodes into %d stages (at most %d stages: %d possible cut points)",
                        n, n_parts, n, n > 0 ? n - 1 : 0);
    PP_TRY(check_vector(pb->cost, n, "cost"));
    PP_TRY(check_vector(pb->cut_cost, n + 1, "cut_cost"));
    PP_TRY(check_vector(pb->param_bytes, n, "param_bytes"));
    PP_TRY(check_vector(pb->stash_bytes, n, "stash_bytes"));
    size_t w = (size_t)n + 1;
    dp_ctx x = {pb, calloc(w, sizeof(double)), calloc(w, sizeof(double)), calloc(w, sizeof(double)), n_parts};
    double *best = malloc(sizeof(double) * w * (size_t)(n_parts + 1));
    int *arg = malloc(sizeof(int) * w * (size_t)(n_parts + 1));
    pp_status s = PP_OK;
    if (!x.c || !x.p || !x.st || !best || !arg) s = pp_error(PP_ERR_NOMEM, "balance: out of memory");
    for (int i = 0; s == PP_OK && i < n; i++) {
        x.c[i + 1] = x.c[i] + pb->cost[i];
        x.p[i + 1] = x.p[i] + (pb->param_bytes ? pb->param_bytes[i] : 0);
        x.st[i + 1] = x.st[i] + (pb->stash_bytes ? pb->stash_bytes[i] : 0);
    }
    /* best[j*w + b]: the smallest largest cost of j parts over items
     * 0..b-1; arg: where the last of them starts. */
    for (int j = 1; s == PP_OK && j <= n_parts; j++)
        for (int b = j; b <= n; b++) {
            double cur = INFINITY;
            int at = -1;
            if (j == 1) {
                if (seg_fits(&x, 0, b, 0)) cur = seg_cost(&x, 0, b), at = 0;
            } else {
                /* a descending: the part's own cost grows, so stop once it
                 * alone exceeds the best found; ties go to the earliest a. */
                for (int a = b - 1; a >= j - 1; a--) {
                    if (x.c[b] - x.c[a] > cur) break;
                    double prev = best[(size_t)(j - 1) * w + (size_t)a];
                    if (!isfinite(prev) || !seg_fits(&x, a, b, j - 1)) continue;
                    double sc = seg_cost(&x, a, b), v = prev > sc ? prev : sc;
                    if (v <= cur) cur = v, at = a;
                }
            }
            best[(size_t)j * w + (size_t)b] = cur;
            arg[(size_t)j * w + (size_t)b] = at;
        }
    if (s == PP_OK && !isfinite(best[(size_t)n_parts * w + (size_t)n])) {
        double need = 0; /* the smallest cap that any single node fits is a lower bound to report */
        for (int i = 0; i < n; i++) {
            double m = (x.p[i + 1] - x.p[i]) + (x.st[i + 1] - x.st[i]);
            if (m > need) need = m;
        }
        s = pp_error(PP_ERR_INVALID,
                     "balance: no split into %d stages keeps every stage within the memory cap of %.0f bytes "
                     "(the largest single node alone needs %.0f)",
                     n_parts, pb->memory_cap, need);
    }
    if (s == PP_OK) {
        int b = n;
        for (int j = n_parts; j > 1; j--) {
            int a = arg[(size_t)j * w + (size_t)b];
            starts[j - 2] = a;
            b = a;
        }
        if (max_cost) *max_cost = best[(size_t)n_parts * w + (size_t)n];
    }
    free(x.c);
    free(x.p);
    free(x.st);
    free(best);
    free(arg);
    return s;
}

/* ------------------------------------------------------------- plans */

void pp_balance_options_init(pp_balance_options *o, int n_stages) {
    memset(o, 0, sizeof *o);
    o->n_stages = n_stages;
    o->microbatches = 1;
}

void pp_balance_plan_free(pp_balance_plan *p) {
    if (!p) return;
    free(p->cut_at);
    free(p->fwd_ms);
    free(p->bwd_ms);
    free(p->comm_ms);
    free(p->param_bytes);
    free(p->stash_bytes);
    free(p->cut_bytes);
    free(p);
}

/* The compute nodes in order (the items), each with the non-compute nodes
 * before it folded in. */
typedef struct {
    int n;
    int *node;      /* [n] node index of item k */
    double *cost, *cut_cost, *param, *stash; /* problem vectors */
} items;

static void items_free(items *it) {
    free(it->node);
    free(it->cost);
    free(it->cut_cost);
    free(it->param);
    free(it->stash);
}

static pp_status make_items(const pp_node_costs *c, const pp_balance_options *o, items *it) {
    memset(it, 0, sizeof *it);
    size_t cap = (size_t)c->n_nodes + 1;
    it->node = malloc(sizeof(int) * cap);
    it->cost = calloc(cap, sizeof(double));
    it->cut_cost = calloc(cap, sizeof(double));
    it->param = calloc(cap, sizeof(double));
    it->stash = calloc(cap, sizeof(double));
    if (!it->node || !it->cost || !it->cut_cost || !it->param || !it->stash) {
        items_free(it);
        return pp_error(PP_ERR_NOMEM, "balance: out of memory");
    }
    double carry = 0, carry_p = 0, carry_s = 0;
    for (int i = 0; i < c->n_nodes; i++) {
        carry += c->fwd_ms[i] + c->bwd_ms[i];
        carry_p += (double)c->param_bytes[i];
        carry_s += (double)c->stash_bytes[i];
        if (!c->compute[i]) continue;
        int k = it->n++;
        it->node[k] = i;
        it->cost[k] = carry;
        it->param[k] = carry_p;
        it->stash[k] = carry_s;
        carry = carry_p = carry_s = 0;
        /* forward activation and backward gradient across the cut */
        if (o->bytes_per_ms > 0) it->cut_cost[k] = 2.0 * (double)c->cross_bytes[i] / o->bytes_per_ms;
    }
    if (it->n > 0) {
        it->cost[it->n - 1] += carry;
        it->param[it->n - 1] += carry_p;
        it->stash[it->n - 1] += carry_s;
    }
    return PP_OK;
}

/* A plan from item starts (n_stages-1 ascending item indices). */
static pp_status plan_from_starts(const pp_node_costs *c, const pp_balance_options *o, const items *it,
                                  const int *starts, pp_balance_plan **out) {
    int S = o->n_stages;
    pp_balance_plan *p = calloc(1, sizeof *p);
    if (!p) return pp_error(PP_ERR_NOMEM, "balance: out of memory");
    p->n_stages = S;
    p->cut_at = calloc((size_t)S, sizeof(int));
    p->cut_bytes = calloc((size_t)S, sizeof(int64_t));
    p->fwd_ms = calloc((size_t)S, sizeof(double));
    p->bwd_ms = calloc((size_t)S, sizeof(double));
    p->comm_ms = calloc((size_t)S, sizeof(double));
    p->param_bytes = calloc((size_t)S, sizeof(int64_t));
    p->stash_bytes = calloc((size_t)S, sizeof(int64_t));
    if (!p->cut_at || !p->cut_bytes || !p->fwd_ms || !p->bwd_ms || !p->comm_ms || !p->param_bytes ||
        !p->stash_bytes) {
        pp_balance_plan_free(p);
        return pp_error(PP_ERR_NOMEM, "balance: out of memory");
    }
    for (int j = 0; j + 1 < S; j++) {
        p->cut_at[j] = it->node[starts[j]];
        p->cut_bytes[j] = c->cross_bytes[p->cut_at[j]];
        p->comm_ms[j] += it->cut_cost[starts[j]];
        p->comm_ms[j + 1] += it->cut_cost[starts[j]];
    }
    /* A node outside every stage (a constant sub-graph) counts with the
     * next compute node, as make_items folds it (the last ones: the end). */
    int stage = 0;
    for (int i = 0, k = 0; i < c->n_nodes; i++) {
        while (k < it->n && it->node[k] < i) k++;
        int at = k < it->n ? it->node[k] : c->n_nodes;
        while (stage + 1 < S && at >= p->cut_at[stage]) stage++;
        p->fwd_ms[stage] += c->fwd_ms[i];
        p->bwd_ms[stage] += c->bwd_ms[i];
        p->param_bytes[stage] += c->param_bytes[i];
        p->stash_bytes[stage] += c->stash_bytes[i];
    }
    for (int j = 0; j < S; j++) {
        double t = p->fwd_ms[j] + p->bwd_ms[j] + p->comm_ms[j];
        if (t > p->max_ms) p->max_ms = t;
    }
    *out = p;
    return PP_OK;
}

static pp_status check_options(const pp_node_costs *c, const pp_balance_options *o, items *it) {
    if (o->n_stages < 1) return pp_error(PP_ERR_INVALID, "balance: %d stages (need at least 1)", o->n_stages);
    PP_TRY(make_items(c, o, it));
    if (o->n_stages > it->n) {
        int n = it->n;
        items_free(it);
        return pp_error(PP_ERR_INVALID,
                        "balance: %d stages asked, but the model has %d compute nodes (%d possible cut points): "
                        "at most %d stages",
                        o->n_stages, n, n > 0 ? n - 1 : 0, n);
    }
    return PP_OK;
}

pp_status pp_balance_plan_auto(const pp_node_costs *c, const pp_balance_options *o, pp_balance_plan **out) {
    items it;
    PP_TRY(check_options(c, o, &it));
    int *starts = calloc((size_t)o->n_stages, sizeof(int));
    pp_balance_problem pb = {it.n, it.cost, it.cut_cost, it.param, it.stash, o->microbatches, o->memory_cap};
    pp_status s = starts ? pp_balance_partition(&pb, o->n_stages, starts, NULL)
                         : pp_error(PP_ERR_NOMEM, "balance: out of memory");
    if (s == PP_OK) s = plan_from_starts(c, o, &it, starts, out);
    free(starts);
    items_free(&it);
    return s;
}

pp_status pp_balance_plan_even(const pp_node_costs *c, const pp_balance_options *o, pp_balance_plan **out) {
    items it;
    PP_TRY(check_options(c, o, &it));
    int *starts = calloc((size_t)o->n_stages, sizeof(int));
    pp_status s = starts ? PP_OK : pp_error(PP_ERR_NOMEM, "balance: out of memory");
    for (int j = 1; s == PP_OK && j < o->n_stages; j++)
        starts[j - 1] = (int)(((int64_t)j * it.n + o->n_stages / 2) / o->n_stages);
    if (s == PP_OK) s = plan_from_starts(c, o, &it, starts, out);
    free(starts);
    items_free(&it);
    return s;
}

pp_status pp_balance_plan_eval(const pp_node_costs *c, const pp_balance_options *o, int n_cuts, const int *cut_at,
                               pp_balance_plan **out) {
    pp_balance_options oo = *o;
    oo.n_stages = n_cuts + 1;
    items it;
    PP_TRY(check_options(c, &oo, &it));
    int *starts = calloc((size_t)n_cuts + 1, sizeof(int));
    pp_status s = starts ? PP_OK : pp_error(PP_ERR_NOMEM, "balance: out of memory");
    for (int j = 0; s == PP_OK && j < n_cuts; j++) {
        int k = 0;
        while (k < it.n && it.node[k] < cut_at[j]) k++;
        if (k == 0 || k == it.n || (j > 0 && k <= starts[j - 1]))
            s = pp_error(PP_ERR_INVALID, "balance: the cut before node %d leaves a stage without compute nodes",
                         cut_at[j]);
        else starts[j] = k;
    }
    if (s == PP_OK) s = plan_from_starts(c, &oo, &it, starts, out);
    free(starts);
    items_free(&it);
    return s;
}

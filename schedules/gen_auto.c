/* Automatic zero-bubble schedule for one stage per rank: F/I/W costs and a
 * cap on activations in flight per rank in, the shortest order found out.
 *
 * Candidates: the zero-bubble paper's greedy heuristic in its 8 variants
 * (sail-sg/zero-bubble-pipeline-parallelism), an event-driven list
 * scheduler in 8 variants, and the hand schedules ZB-H1 and ZB-H2. Each is
 * simulated with the real cost model; the best that fits the memory cap is
 * then improved by hill climbing (single actions slid earlier or later,
 * kept where the simulated result improves; ties broken by earlier
 * forwards and input-gradients, which keeps the search moving on plateaus). Memory is counted in activations: F adds 1, I releases
 * 1 - w_frac, W the remaining w_frac. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

#include "status_internal.h"
/* Simulated actions the hill climb may spend (bounds its run time). */
#define LS_BUDGET 40000000.0

typedef struct actx {
    int p, m;
    size_t n;          /* actions per rank: 3m */
    double cap, wf;
    pp_sched_objective obj;
    const double *F, *I, *W;
    double *c;         /* [p] transfer time on edge j -> j+1 */
    pp_cost_model *cm; /* the costs (unit costs when none are given) */
    double spent;      /* simulated actions so far */
    /* fast evaluator state */
    double *tF, *tI, *clock, *mem, *first;
    size_t *pc;
    int *stack;
    unsigned char *queued;
} actx;

typedef struct score {
    int ok;       /* valid and within the memory cap */
    double obj;   /* makespan or span */
    double tie;   /* sum of per-rank ends (or spans) */
    double tie2;  /* sum of F and I end times: earlier critical work */
} score;

static int better(score a, score b) {
    if (!a.ok) return 0;
    if (!b.ok) return 1;
    double eps = 1e-9 * (fabs(b.obj) + 1);
    if (a.obj < b.obj - eps) return 1;
    if (a.obj > b.obj + eps) return 0;
    eps = 1e-9 * (fabs(b.tie) + 1);
    if (a.tie < b.tie - eps) return 1;
    if (a.tie > b.tie + eps) return 0;
    return a.tie2 < b.tie2 - 1e-9 * (fabs(b.tie2) + 1);
}

/* Times a flat order (rank j's 3m actions at j*n) the way pp_simulate
 * does (same model; the chosen order is simulated by it again in the end),
 * without its generality: no allocation, one stage per rank. */
static score evaluate(actx *x, const pp_action *ord) {
    score sc = {0, 0, 0, 0};
    double crit = 0;
    int p = x->p, m = x->m, ns = 0;
    size_t n = x->n, pm = (size_t)p * (size_t)m;
    double peak = 0;
    for (size_t k = 0; k < pm; k++) x->tF[k] = x->tI[k] = -1;
    for (int j = p - 1; j >= 0; j--) {
        x->pc[j] = 0;
        x->clock[j] = x->mem[j] = 0;
        x->first[j] = -1;
        x->queued[j] = 1;
        x->stack[ns++] = j;
    }
    x->spent += (double)pm * 3;
    while (ns > 0) {
        int j = x->stack[--ns];
        x->queued[j] = 0;
        const pp_action *a = ord + (size_t)j * n;
        while (x->pc[j] < n) {
            pp_action c = a[x->pc[j]];
            size_t id = (size_t)j * (size_t)m + (size_t)c.mb;
            double ready = 0, end;
            int wake = -1;
            if (c.kind == PP_ACT_F) {
                if (j > 0) {
                    ready = x->tF[id - (size_t)m];
                    if (ready < 0) break;
                    ready += x->c[j - 1];
                }
                double start = fmax(ready, x->clock[j]);
                if (x->first[j] < 0) x->first[j] = start;
                x->mem[j] += 1.0;
                if (x->mem[j] > peak) peak = x->mem[j];
                end = start + x->F[j];
                x->tF[id] = end;
                crit += end;
                if (j + 1 < p) wake = j + 1;
            } else if (c.kind == PP_ACT_I) {
                if (x->tF[id] < 0) return sc; /* I before its F */
                if (j + 1 < p) {
                    ready = x->tI[id + (size_t)m];
                    if (ready < 0) break;
                    ready += x->c[j];
                }
                end = fmax(ready, x->clock[j]) + x->I[j];
                x->mem[j] -= 1.0 - x->wf;
                x->tI[id] = end;
                crit += end;
                if (j > 0) wake = j - 1;
            } else {
                if (x->tI[id] < 0) return sc; /* W before its I */
                end = x->clock[j] + x->W[j];
                x->mem[j] -= x->wf;
            }
            x->clock[j] = end;
            x->pc[j]++;
            if (wake >= 0 && !x->queued[wake] && x->pc[wake] < n) {
                x->queued[wake] = 1;
                x->stack[ns++] = wake;
            }
        }
    }
    double mk = 0, span = 0, sum_end = 0, sum_span = 0;
    for (int j = 0; j < p; j++) {
        if (x->pc[j] < n) return sc; /* deadlock */
        double sp = x->clock[j] - x->first[j];
        if (x->clock[j] > mk) mk = x->clock[j];
        if (sp > span) span = sp;
        sum_end += x->clock[j];
        sum_span += sp;
    }
    if (peak > x->cap + 1e-9) return sc;
    sc.ok = 1;
    sc.obj = x->obj == PP_OBJ_SPAN ? span : mk;
    sc.tie = x->obj == PP_OBJ_SPAN ? sum_span : sum_end;
    sc.tie2 = crit;
    return sc;
}

/* ---- the paper's greedy heuristic (manual_order in its zb.py) ---- */

typedef struct heur {
    actx *x;
    int *f, *b, *w, *o; /* per stage: F, B(=I), W issued; actions placed */
    double *e, *mem, *bubble;
    double *t;          /* [3][p][m] end times */
    pp_action *ord;
} heur;

static double *tt(heur *h, int k, int j, int i) {
    return &h->t[((size_t)k * h->x->p + (size_t)j) * h->x->m + (size_t)i];
}

static double hcost(heur *h, int k, int j) {
    return k == 0 ? h->x->F[j] : k == 1 ? h->x->I[j] : h->x->W[j];
}

static double hmem(heur *h, int k) {
    return k == 0 ? 1.0 : k == 1 ? -(1.0 - h->x->wf) : -h->x->wf;
}

static double max_bubble(heur *h) {
    double mb = 0;
    for (int j = 0; j < h->x->p; j++)
        if (h->bubble[j] > mb) mb = h->bubble[j];
    return mb;
}

static void put(heur *h, int j, int k) {
    actx *x = h->x;
    int i = k == 0 ? h->f[j] : k == 1 ? h->b[j] : h->w[j];
    double cost = hcost(h, k, j), tmp = h->e[j] + cost, nob = tmp;
    if (j > 0 && k == 0) tmp = fmax(tmp, *tt(h, 0, j - 1, i) + x->c[j - 1] + cost);
    if (j < x->p - 1 && k == 1) tmp = fmax(tmp, *tt(h, 1, j + 1, i) + x->c[j] + cost);
    if (h->f[j] > 0) h->bubble[j] += tmp - nob;
    h->e[j] = tmp;
    *tt(h, k, j, i) = tmp;
    h->mem[j] += hmem(h, k);
    static const pp_act_kind kinds[3] = {PP_ACT_F, PP_ACT_I, PP_ACT_W};
    h->ord[(size_t)j * x->n + (size_t)h->o[j]++] = pp_act(kinds[k], j, i);
    if (k == 0)
        h->f[j]++;
    else if (k == 1)
        h->b[j]++;
    else
        h->w[j]++;
}

/* Fills W before the next input arrives at `arrive` (the paper's rule). */
static void fill_w(heur *h, int j, double arrive, int no_bubble_greedy) {
    actx *x = h->x;
    while (h->w[j] < h->b[j] && h->e[j] + x->W[j] <= arrive) put(h, j, 2);
    if (h->w[j] < h->b[j] && h->e[j] < arrive) {
        if (arrive - h->e[j] <= max_bubble(h) - h->bubble[j]) {
            if (no_bubble_greedy) put(h, j, 2);
        } else {
            put(h, j, 2);
        }
    }
}

static int paper_order(actx *x, int allow_bubble, int prio_b, int no_bubble_greedy,
                       pp_action *ord) {
    int p = x->p, m = x->m, ok = 0;
    heur h = {0};
    h.x = x;
    h.ord = ord;
    h.f = calloc((size_t)p, sizeof(int));
    h.b = calloc((size_t)p, sizeof(int));
    h.w = calloc((size_t)p, sizeof(int));
    h.o = calloc((size_t)p, sizeof(int));
    h.e = calloc((size_t)p, sizeof(double));
    h.mem = calloc((size_t)p, sizeof(double));
    h.bubble = calloc((size_t)p, sizeof(double));
    h.t = calloc(3 * (size_t)p * (size_t)m, sizeof(double));
    int *freq = calloc((size_t)p, sizeof(int));
    if (!h.f || !h.b || !h.w || !h.o || !h.e || !h.mem || !h.bubble || !h.t || !freq) goto out;
    for (int i = 0; i < m; i++) {
        if (i == 0) {
            for (int j = 0; j < p; j++) put(&h, j, 0);
            for (int j = 0; j < p; j++) freq[j] = 0;
            double last_t = 0;
            for (int j = p - 1; j >= 0; j--) {
                if (j == p - 1) {
                    last_t = *tt(&h, 0, j, 0) + x->I[j];
                    continue;
                }
                double mem = h.mem[j], cost = h.e[j];
                for (;;) {
                    if (h.f[j] + freq[j] < m && mem + 1.0 <= x->cap + 1e-9) {
                        if (allow_bubble) {
                            if (cost + x->F[j] > last_t + x->c[j]) break;
                        } else if (cost >= last_t + x->c[j]) {
                            break;
                        }
                        mem += 1.0;
                        cost += x->F[j];
                        freq[j]++;
                    } else {
                        break;
                    }
                }
                last_t = fmax(cost, last_t + x->c[j]) + x->I[j];
            }
            for (int j = 1; j < p; j++)
                while (freq[j] > 0 && freq[j] >= freq[j - 1] && h.f[j] + freq[j] < m) freq[j]--;
            for (int j = 0; j < p; j++)
                for (int k = 0; k < freq[j]; k++) put(&h, j, 0);
            for (int j = p - 1; j >= 0; j--) {
                if (h.f[j] <= 0) goto out;
                put(&h, j, 1);
            }
            continue;
        }
        for (int j = 0; j < p; j++) {
            freq[j] = 0;
            if (h.f[j] >= m) continue;
            if (j + 1 < p && h.f[j] >= h.f[j + 1] + 2 && prio_b) {
                double next_plus_fw = h.e[j + 1] + x->F[j + 1] + x->I[j + 1] + x->c[j];
                if (h.e[j] >= next_plus_fw) continue;
                double w_cost = 0, mem_w = h.mem[j] + 1.0;
                int w_cnt = 0;
                while (mem_w > x->cap + 1e-9 && h.w[j] + w_cnt < h.b[j]) {
                    w_cost += x->W[j];
                    mem_w -= x->wf;
                    w_cnt++;
                }
                if (h.e[j] + x->F[j] + w_cost <= next_plus_fw) {
                    freq[j] = 1;
                    continue;
                }
                if (next_plus_fw - h.e[j] <= max_bubble(&h) - h.bubble[j]) continue;
            }
            freq[j] = 1;
        }
        for (int j = p - 2; j >= 0; j--)
            if (freq[j + 1] < freq[j]) freq[j] = freq[j + 1];
        for (int j = 0; j < p; j++) {
            if (!freq[j]) continue;
            while (h.mem[j] + 1.0 > x->cap + 1e-9) {
                if (h.w[j] >= h.b[j] || x->wf <= 0) goto out; /* cannot fit memory */
                put(&h, j, 2);
            }
            if (j > 0) fill_w(&h, j, *tt(&h, 0, j - 1, h.f[j]) + x->c[j - 1], no_bubble_greedy);
            put(&h, j, 0);
        }
        for (int j = p - 1; j >= 0; j--) {
            if (h.b[j] != i || h.f[j] <= i) goto out;
            if (j + 1 < p) fill_w(&h, j, *tt(&h, 1, j + 1, i) + x->c[j], no_bubble_greedy);
            if (j == 0 && h.f[j] == m)
                while (h.w[j] < h.b[j]) put(&h, j, 2);
            put(&h, j, 1);
        }
    }
    for (int j = 0; j < p; j++) {
        if (h.f[j] != m || h.b[j] != m) goto out;
        while (h.w[j] < m) put(&h, j, 2);
    }
    ok = 1;
out:
    free(h.f);
    free(h.b);
    free(h.w);
    free(h.o);
    free(h.e);
    free(h.mem);
    free(h.bubble);
    free(h.t);
    free(freq);
    return ok;
}

/* ---- event-driven list scheduler ---- */

typedef struct lsched {
    double theta;  /* fill a gap with W only if it is at least theta * W long */
    int prefer_f;  /* F before I when both are ready */
} lsched;

static int list_order(actx *x, lsched v, pp_action *ord) {
    int p = x->p, m = x->m, ok = 0;
    size_t pm = (size_t)p * (size_t)m;
    double *tF = malloc(pm * sizeof *tF), *tI = malloc(pm * sizeof *tI);
    double *free_at = calloc((size_t)p, sizeof(double)), *mem = calloc((size_t)p, sizeof(double));
    int *fN = calloc((size_t)p, sizeof(int)), *iN = calloc((size_t)p, sizeof(int));
    int *wN = calloc((size_t)p, sizeof(int)), *o = calloc((size_t)p, sizeof(int));
    if (!tF || !tI || !free_at || !mem || !fN || !iN || !wN || !o) goto out;
    for (size_t k = 0; k < pm; k++) tF[k] = tI[k] = -1;
    for (size_t left = 3 * pm; left > 0; left--) {
        int bj = -1, bk = 0;
        double bt = INFINITY;
        for (int j = 0; j < p; j++) {
            double t0 = free_at[j];
            int haveI = iN[j] < fN[j] &&
                        (j == p - 1 || tI[(size_t)(j + 1) * m + (size_t)iN[j]] >= 0);
            int haveF = fN[j] < m && (j == 0 || tF[(size_t)(j - 1) * m + (size_t)fN[j]] >= 0);
            int memok = mem[j] + 1.0 <= x->cap + 1e-9;
            int haveW = wN[j] < iN[j];
            double rI = INFINITY, rF = INFINITY;
            if (haveI) {
                rI = fmax(t0, tF[(size_t)j * m + (size_t)iN[j]]);
                if (j < p - 1) rI = fmax(rI, tI[(size_t)(j + 1) * m + (size_t)iN[j]] + x->c[j]);
            }
            if (haveF && memok)
                rF = fmax(t0, j > 0 ? tF[(size_t)(j - 1) * m + (size_t)fN[j]] + x->c[j - 1] : 0);
            int nk = -1;
            double nt = INFINITY;
            if (rI < INFINITY || rF < INFINITY) {
                if (rI < rF || (rI == rF && !v.prefer_f)) {
                    nk = 1;
                    nt = rI;
                } else {
                    nk = 0;
                    nt = rF;
                }
            }
            int kind = nk;
            double at = nt;
            if (haveW && nt > t0) {
                int forced = haveF && !memok && x->wf > 0;
                if (forced || nt - t0 >= v.theta * x->W[j]) {
                    kind = 2;
                    at = t0;
                }
            }
            if (kind >= 0 && at < bt) {
                bt = at;
                bj = j;
                bk = kind;
            }
        }
        if (bj < 0) goto out; /* nothing can run: memory cap too small */
        int j = bj, i;
        double end;
        if (bk == 0) {
            i = fN[j]++;
            end = bt + x->F[j];
            tF[(size_t)j * m + (size_t)i] = end;
            mem[j] += 1.0;
            ord[(size_t)j * x->n + (size_t)o[j]++] = pp_act(PP_ACT_F, j, i);
        } else if (bk == 1) {
            i = iN[j]++;
            end = bt + x->I[j];
            tI[(size_t)j * m + (size_t)i] = end;
            mem[j] -= 1.0 - x->wf;
            ord[(size_t)j * x->n + (size_t)o[j]++] = pp_act(PP_ACT_I, j, i);
        } else {
            i = wN[j]++;
            end = bt + x->W[j];
            mem[j] -= x->wf;
            ord[(size_t)j * x->n + (size_t)o[j]++] = pp_act(PP_ACT_W, j, i);
        }
        free_at[j] = end;
    }
    ok = 1;
out:
    free(tF);
    free(tI);
    free(free_at);
    free(mem);
    free(fN);
    free(iN);
    free(wN);
    free(o);
    return ok;
}

/* ---- hand schedules as candidates ---- */

static int hand_order(actx *x, int h2, pp_action *ord) {
    pp_schedule *s;
    if (pp_schedule_new(x->p, x->p, x->m, &s) != PP_OK) return 0;
    int ok = pp_schedule_place(s, PP_PLACE_LOOP) == PP_OK &&
             (h2 ? pp_gen_zb_h2(s) : pp_gen_zb_h1(s)) == PP_OK;
    for (int j = 0; ok && j < x->p; j++) {
        if (s->len[j] != x->n) ok = 0;
        else memcpy(ord + (size_t)j * x->n, s->acts[j], x->n * sizeof *ord);
    }
    pp_schedule_free(s);
    return ok;
}

/* ---- hill climbing over adjacent swaps ---- */

/* May y move in front of x on one rank? */
static int swappable(pp_action a, pp_action b) {
    if (a.kind == b.kind) return 0;       /* keeps each kind in microbatch order */
    if (a.mb == b.mb) {
        if (a.kind == PP_ACT_F && b.kind == PP_ACT_I) return 0;
        if (a.kind == PP_ACT_I && b.kind == PP_ACT_W) return 0;
        if (a.kind == PP_ACT_F && b.kind == PP_ACT_W) return 0;
    }
    return 1;
}

/* Moves a[k] by d (+-1) positions; 0 if a dependency or a kind's order
 * forbids it. */
static int step(pp_action *a, size_t n, size_t *k, int d) {
    size_t j = d > 0 ? *k + 1 : *k - 1;
    if ((d > 0 && *k + 1 >= n) || (d < 0 && *k == 0)) return 0;
    size_t lo = d > 0 ? *k : j, hi = d > 0 ? j : *k;
    if (!swappable(a[lo], a[hi])) return 0;
    pp_action t = a[lo];
    a[lo] = a[hi];
    a[hi] = t;
    *k = j;
    return 1;
}

/* Hill climbing: each action in turn is slid up to CLIMB_REACH positions
 * later or earlier; the best improving position is kept. */
#define CLIMB_REACH 1000000
static score climb(actx *x, pp_action *ord, score cur) {
    int improved = 1;
    while (improved && x->spent < LS_BUDGET) {
        improved = 0;
        for (int j = 0; j < x->p && x->spent < LS_BUDGET; j++) {
            pp_action *a = ord + (size_t)j * x->n;
            for (size_t k0 = 0; k0 < x->n && x->spent < LS_BUDGET; k0++) {
                for (int d = -1; d <= 1; d += 2) {
                    size_t k = k0;
                    int moved = 0, best_at = 0;
                    score best = cur;
                    while (moved < CLIMB_REACH && step(a, x->n, &k, d)) {
                        moved++;
                        score sc = evaluate(x, ord);
                        if (better(sc, best)) {
                            best = sc;
                            best_at = moved;
                        }
                    }
                    /* Slide back to the best position (or the start). */
                    for (; moved > best_at; moved--) step(a, x->n, &k, -d);
                    if (best_at) {
                        cur = best;
                        improved = 1;
                    }
                }
            }
        }
    }
    return cur;
}

static pp_status setup(actx *x, pp_schedule *s, const pp_sched_params *pr) {
    int p = s->nranks, m = s->nmb;
    x->p = p;
    x->m = m;
    x->n = 3 * (size_t)m;
    x->cap = pr->mem_cap > 0 ? pr->mem_cap : 2.0 * p;
    x->wf = pr->w_frac;
    x->obj = pr->objective;
    if (!(x->wf >= 0 && x->wf <= 1))
        return pp_error(PP_ERR_INVALID, "auto: w_frac %g must be within 0..1", x->wf);
    if (x->cap < 1)
        return pp_error(PP_ERR_INVALID, "auto: memory cap %g below one activation", x->cap);
    if (pr->costs && pr->costs->nstages != p)
        return pp_error(PP_ERR_INVALID, "auto: cost model has %d stages, schedule %d",
                        pr->costs->nstages, p);
    PP_TRY(pp_cost_model_new(p, &x->cm));
    if (pr->costs) {
        memcpy(x->cm->f, pr->costs->f, (size_t)p * sizeof(double));
        for (int j = 0; j < p; j++) /* a recomputing stage's I runs its F again */
            x->cm->i[j] = pp_cost_model_backward_input(pr->costs, j);
        memcpy(x->cm->w, pr->costs->w, (size_t)p * sizeof(double));
        memcpy(x->cm->edge_bytes, pr->costs->edge_bytes, (size_t)p * sizeof(double));
        x->cm->latency = pr->costs->latency;
        x->cm->bandwidth = pr->costs->bandwidth;
    }
    x->F = x->cm->f;
    x->I = x->cm->i;
    x->W = x->cm->w;
    x->c = calloc((size_t)p, sizeof(double));
    if (!x->c) return pp_error(PP_ERR_NOMEM, "auto: out of memory");
    for (int j = 0; j + 1 < p; j++) x->c[j] = pp_cost_model_xfer(x->cm, j);
    size_t pm = (size_t)p * (size_t)m;
    x->tF = malloc(pm * sizeof(double));
    x->tI = malloc(pm * sizeof(double));
    x->clock = malloc((size_t)p * sizeof(double));
    x->mem = malloc((size_t)p * sizeof(double));
    x->first = malloc((size_t)p * sizeof(double));
    x->pc = malloc((size_t)p * sizeof(size_t));
    x->stack = malloc((size_t)p * sizeof(int));
    x->queued = malloc((size_t)p);
    if (!x->tF || !x->tI || !x->clock || !x->mem || !x->first || !x->pc || !x->stack ||
        !x->queued)
        return pp_error(PP_ERR_NOMEM, "auto: out of memory");
    return PP_OK;
}

static void teardown(actx *x) {
    free(x->tF);
    free(x->tI);
    free(x->clock);
    free(x->mem);
    free(x->first);
    free(x->pc);
    free(x->stack);
    free(x->queued);
    pp_cost_model_free(x->cm);
    free(x->c);
}

/* Keeps cand in best when it scores better. */
static void consider(actx *x, const pp_action *cand, pp_action *best, score *bs) {
    score sc = evaluate(x, cand);
    if (better(sc, *bs)) {
        *bs = sc;
        memcpy(best, cand, x->n * (size_t)x->p * sizeof *cand);
    }
}

pp_status pp_gen_auto(pp_schedule *s, const pp_sched_params *pr) {
    actx x = {0};
    unsigned search = pr->auto_search ? pr->auto_search : PP_AUTO_ALL;
    pp_status st = setup(&x, s, pr);
    size_t total = x.n * (size_t)x.p;
    pp_action *best = NULL, *cand = NULL;
    if (st == PP_OK) {
        best = malloc(total * sizeof *best);
        cand = malloc(total * sizeof *cand);
        if (!best || !cand) st = pp_error(PP_ERR_NOMEM, "auto: out of memory");
    }
    score bs = {0, 0, 0, 0};
    if (st == PP_OK) {
        if (search & PP_AUTO_PAPER)
            for (int v = 0; v < 8; v++)
                if (paper_order(&x, v & 1, (v >> 1) & 1, (v >> 2) & 1, cand))
                    consider(&x, cand, best, &bs);
        static const double thetas[4] = {0.0, 0.5, 1.0, 1e300};
        if (search & PP_AUTO_LIST)
            for (int v = 0; v < 8; v++) {
                lsched ls = {thetas[v & 3], v >> 2};
                if (list_order(&x, ls, cand)) consider(&x, cand, best, &bs);
            }
        if (search & PP_AUTO_HAND)
            for (int h2 = 0; h2 < 2; h2++)
                if (hand_order(&x, h2, cand)) consider(&x, cand, best, &bs);
        if (!bs.ok)
            st = pp_error(PP_ERR_INVALID,
                          "auto: no schedule fits %g activations per rank (try a larger cap)",
                          x.cap);
    }
    if (st == PP_OK) {
        if (search & PP_AUTO_CLIMB) bs = climb(&x, best, bs);
        for (int j = 0; j < x.p && st == PP_OK; j++) {
            st = pp_schedule_reserve(s, j, x.n);
            for (size_t k = 0; k < x.n && st == PP_OK; k++)
                st = pp_schedule_append(s, j, best[(size_t)j * x.n + k]);
        }
    }
    free(best);
    free(cand);
    teardown(&x);
    return st;
}

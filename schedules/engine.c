/* The execution engine behind the simulator and the validator's deadlock
 * check.
 *
 * Each rank runs its list in order. A rank runs until its next action waits
 * for something not done yet, then sleeps; finishing an action wakes the
 * rank that consumes its result. Start times are max(rank free, inputs
 * ready), so the result is the timed execution whatever order ranks are
 * visited in, in time linear in the number of actions. Ranks still asleep
 * when nothing is left to wake are deadlocked. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

#include "status_internal.h"
enum { RECVF_DONE = 1, RECVB_DONE = 2 };
/* What a sleeping rank waits for: an entry of one of the time arrays. */
enum { WAIT_NONE = 0, WAIT_TF, WAIT_TI, WAIT_TSF, WAIT_TSB };

/* End times are stored negated: calloc's +0.0 then means "not done yet"
 * and every stored time, 0 included, has its sign bit set. Saves
 * initialising arrays of hundreds of megabytes. TGET gives -1 when not done. */
#define TGET(x) (signbit(x) ? -(x) : -1.0)
#define TSET(x, v) ((x) = -(v))

#define IS_COMPUTE(k) ((k) == PP_ACT_F || (k) == PP_ACT_I || (k) == PP_ACT_W || (k) == PP_ACT_B)

/* End times of F and of I (or B) for one (stage, microbatch), side by
 * side: the engine mostly reads one right after the other. */
typedef struct tpair {
    double f, i;
} tpair;

/* One rank's state, kept together: the engine hops between ranks. */
typedef struct rstate {
    size_t pc;                 /* next action */
    double clock;              /* when the rank is free */
    double busy, first, last;  /* compute time, first start, last end */
    double bytes, pbytes;      /* stash bytes held now / at most */
    int act, wp, pact, pwp;    /* activations and pending W, now / at most */
    size_t wid;                /* index the rank waits on */
    uint8_t wkind;             /* WAIT_* */
    uint8_t queued;
} rstate;

typedef struct eng {
    const pp_schedule *s;
    const pp_cost_model *c;
    pp_trace *trace;
    int p, S, m;
    int lowered;
    tpair *t;          /* [S*m] end of F and of I or B; -1 before */
    double *tSF, *tSB; /* [S*m] arrival of SEND_F(s) at s+1 / SEND_B(s) at s-1 */
    uint8_t *rflag;    /* [S*m] RECV_F / RECV_B done at (s, mb) */
    double *xfer;      /* [S] edge s -> s+1 transfer time, 0 on one rank */
    double *cf, *ci, *cw, *cst, *cwst; /* [S] costs and stash bytes (recomputation applied) */
    double *crc;       /* [S] bytes a recomputing stage rebuilds while I/B runs */
    int fast;          /* compute-only, checked, no trace: fast_run applies */
    rstate *rs;        /* [p] */
    int *work;
    int nwork;
    int checked;    /* actions already checked (ranges, owners) */
} eng;

static double cost_of(const eng *e, int kind, int s) {
    switch (kind) {
    case PP_ACT_F: return e->cf[s];
    case PP_ACT_I: return e->ci[s];
    case PP_ACT_W: return e->cw[s];
    case PP_ACT_B: return e->ci[s] + e->cw[s];
    default: return 0.0;
    }
}

static double stash_of(const eng *e, int s) { return e->cst[s]; }

static double wstash_of(const eng *e, int s) { return e->cwst[s]; }

static void wake(eng *e, int rank) {
    if (rank < 0 || e->rs[rank].queued) return;
    if (e->rs[rank].pc >= e->s->len[rank]) return;
    e->rs[rank].queued = 1;
    e->rs[rank].wkind = WAIT_NONE;
    e->work[e->nwork++] = rank;
}

/* Wakes rank only if it sleeps on exactly this entry, so a rank is not
 * re-run for results it does not need yet. */
static inline void wake_on(eng *e, int rank, int kind, size_t id) {
    if (e->rs[rank].wkind == kind && e->rs[rank].wid == id) wake(e, rank);
}

static inline int wait_for(eng *e, int rank, int kind, size_t id) {
    e->rs[rank].wkind = (uint8_t)kind;
    e->rs[rank].wid = id;
    return 0;
}

static int needs_mb(int kind) {
    return kind != PP_ACT_UNSHARD && kind != PP_ACT_RESHARD && kind != PP_ACT_REDUCE_GRAD &&
           kind != PP_ACT_IDLE;
}

static pp_status where(const eng *e, int rank, const pp_action *a, pp_status code,
                       const char *detail) {
    char buf[PP_ACTION_STR_MAX];
    pp_action_format(e->s, a, buf, sizeof buf);
    return pp_error(code, "rank %d step %zu action %s: %s", rank, e->rs[rank].pc, buf, detail);
}

/* Checks a plain action's numbers and owner. */
static pp_status check_action(const eng *e, int rank, const pp_action *x, const pp_action *top) {
    char msg[160];
    if (x->kind <= PP_ACT_IDLE || x->kind >= PP_ACT_OVERLAP_F_B)
        return where(e, rank, top, PP_ERR_INVALID, "not a plain action");
    if (x->stage < 0 || x->stage >= e->S) {
        snprintf(msg, sizeof msg, "stage %d out of range (%d stages)", (int)x->stage, e->S);
        return where(e, rank, top, PP_ERR_INVALID, msg);
    }
    if (needs_mb(x->kind) && (x->mb < 0 || x->mb >= e->m)) {
        snprintf(msg, sizeof msg, "microbatch %d out of range (%d microbatches)", (int)x->mb,
                 e->m);
        return where(e, rank, top, PP_ERR_INVALID, msg);
    }
    if (e->s->stage_rank[x->stage] != rank) {
        snprintf(msg, sizeof msg, "stage %d belongs to rank %d", (int)x->stage,
                 e->s->stage_rank[x->stage]);
        return where(e, rank, top, PP_ERR_INVALID, msg);
    }
    return PP_OK;
}

/* 1 if x can start (*ready: earliest start its inputs allow), 0 if it must
 * wait, negative on an error. */
static int readiness(eng *e, int rank, const pp_action *x, const pp_action *top, double *ready) {
    int s = x->stage;
    size_t id = (size_t)s * (size_t)e->m + (size_t)(x->mb < 0 ? 0 : x->mb);
    const int *sr = e->s->stage_rank;
    *ready = 0.0;
    switch (x->kind) {
    case PP_ACT_F:
        if (s == 0) return 1;
        if (sr[s - 1] == rank || !e->lowered) {
            double t = TGET(e->t[id - (size_t)e->m].f);
            if (t < 0) return wait_for(e, rank, WAIT_TF, id - (size_t)e->m);
            *ready = t + (sr[s - 1] == rank ? 0.0 : e->xfer[s - 1]);
            return 1;
        }
        if (!(e->rflag[id] & RECVF_DONE))
            return where(e, rank, top, PP_ERR_INVALID,
                         "forward input from another rank was never received (no RECV_F before it)");
        return 1;
    case PP_ACT_I:
    case PP_ACT_B:
        if (TGET(e->t[id].f) < 0) return wait_for(e, rank, WAIT_TF, id);
        *ready = TGET(e->t[id].f);
        if (s == e->S - 1) return 1;
        if (sr[s + 1] == rank || !e->lowered) {
            double t = TGET(e->t[id + (size_t)e->m].i);
            if (t < 0) return wait_for(e, rank, WAIT_TI, id + (size_t)e->m);
            t += sr[s + 1] == rank ? 0.0 : e->xfer[s];
            if (t > *ready) *ready = t;
            return 1;
        }
        if (!(e->rflag[id] & RECVB_DONE))
            return where(e, rank, top, PP_ERR_INVALID,
                         "output gradient from another rank was never received (no RECV_B before it)");
        return 1;
    case PP_ACT_W:
        if (TGET(e->t[id].i) < 0) return wait_for(e, rank, WAIT_TI, id);
        *ready = TGET(e->t[id].i);
        return 1;
    case PP_ACT_SEND_F:
        if (s == e->S - 1)
            return where(e, rank, top, PP_ERR_INVALID, "SEND_F from the last stage");
        if (TGET(e->t[id].f) < 0) return wait_for(e, rank, WAIT_TF, id);
        return 1;
    case PP_ACT_SEND_B:
        if (s == 0) return where(e, rank, top, PP_ERR_INVALID, "SEND_B from stage 0");
        if (TGET(e->t[id].i) < 0) return wait_for(e, rank, WAIT_TI, id);
        return 1;
    case PP_ACT_RECV_F:
        if (s == 0) return where(e, rank, top, PP_ERR_INVALID, "RECV_F at stage 0");
        if (e->tSF[id - (size_t)e->m] < 0) return wait_for(e, rank, WAIT_TSF, id - (size_t)e->m);
        *ready = e->tSF[id - (size_t)e->m];
        return 1;
    case PP_ACT_RECV_B:
        if (s == e->S - 1)
            return where(e, rank, top, PP_ERR_INVALID, "RECV_B at the last stage");
        if (e->tSB[id + (size_t)e->m] < 0) return wait_for(e, rank, WAIT_TSB, id + (size_t)e->m);
        *ready = e->tSB[id + (size_t)e->m];
        return 1;
    default: return 1; /* UNSHARD, RESHARD, REDUCE_GRAD: local bookkeeping */
    }
}

static pp_status trace_add(eng *e, int rank, int kind, int lane, int st, int mb, int st2,
                           int mb2, double t0, double t1) {
    pp_trace_event ev = {rank, st, mb, (uint8_t)kind, (uint8_t)lane, st2, mb2, t0, t1};
    return pp_trace_add(e->trace, &ev);
}

/* Runs x on rank from time start; returns its end. */
static pp_status commit(eng *e, int rank, const pp_action *x, double start, double *end) {
    int s = x->stage, kind = x->kind;
    size_t id = (size_t)s * (size_t)e->m + (size_t)(x->mb < 0 ? 0 : x->mb);
    const int *sr = e->s->stage_rank;
    double t1 = start + cost_of(e, kind, s);
    *end = t1;
    switch (kind) {
    case PP_ACT_F:
        if (++e->rs[rank].act > e->rs[rank].pact) e->rs[rank].pact = e->rs[rank].act;
        e->rs[rank].bytes += stash_of(e, s);
        if (e->rs[rank].bytes > e->rs[rank].pbytes) e->rs[rank].pbytes = e->rs[rank].bytes;
        TSET(e->t[id].f, t1);
        if (s + 1 < e->S && sr[s + 1] != rank && !e->lowered) {
            if (e->trace && e->xfer[s] > 0)
                PP_TRY(trace_add(e, rank, PP_ACT_SEND_F, PP_LANE_COMM, s, x->mb, -1, -1, t1,
                                 t1 + e->xfer[s]));
            wake_on(e, sr[s + 1], WAIT_TF, id);
        }
        break;
    case PP_ACT_I:
    case PP_ACT_B:
        if (e->rs[rank].bytes + e->crc[s] > e->rs[rank].pbytes)
            e->rs[rank].pbytes = e->rs[rank].bytes + e->crc[s];
        e->rs[rank].act--;
        e->rs[rank].bytes -= stash_of(e, s);
        if (kind == PP_ACT_I) {
            if (++e->rs[rank].wp > e->rs[rank].pwp) e->rs[rank].pwp = e->rs[rank].wp;
            e->rs[rank].bytes += wstash_of(e, s);
            if (e->rs[rank].bytes > e->rs[rank].pbytes) e->rs[rank].pbytes = e->rs[rank].bytes;
        }
        TSET(e->t[id].i, t1);
        if (s > 0 && sr[s - 1] != rank && !e->lowered) {
            if (e->trace && e->xfer[s - 1] > 0)
                PP_TRY(trace_add(e, rank, PP_ACT_SEND_B, PP_LANE_COMM, s, x->mb, -1, -1, t1,
                                 t1 + e->xfer[s - 1]));
            wake_on(e, sr[s - 1], WAIT_TI, id);
        }
        break;
    case PP_ACT_W:
        e->rs[rank].wp--;
        e->rs[rank].bytes -= wstash_of(e, s);
        break;
    case PP_ACT_SEND_F:
        e->tSF[id] = start + e->xfer[s];
        if (e->trace && e->xfer[s] > 0)
            PP_TRY(trace_add(e, rank, PP_ACT_SEND_F, PP_LANE_COMM, s, x->mb, -1, -1, start,
                             start + e->xfer[s]));
        wake_on(e, sr[s + 1], WAIT_TSF, id);
        break;
    case PP_ACT_SEND_B:
        e->tSB[id] = start + e->xfer[s - 1];
        if (e->trace && e->xfer[s - 1] > 0)
            PP_TRY(trace_add(e, rank, PP_ACT_SEND_B, PP_LANE_COMM, s, x->mb, -1, -1, start,
                             start + e->xfer[s - 1]));
        wake_on(e, sr[s - 1], WAIT_TSB, id);
        break;
    case PP_ACT_RECV_F: e->rflag[id] |= RECVF_DONE; break;
    case PP_ACT_RECV_B: e->rflag[id] |= RECVB_DONE; break;
    default: break;
    }
    if (IS_COMPUTE(kind)) {
        double d = t1 - start;
        e->rs[rank].busy += d;
        if (e->rs[rank].first < 0) e->rs[rank].first = start;
        if (t1 > e->rs[rank].last) e->rs[rank].last = t1;
    }
    return PP_OK;
}

/* Per-rank state of the fast path, held in locals while a rank runs. */
typedef struct fstate {
    double clock, busy, first, bytes, pbytes;
    int act, wp, pact, pwp;
} fstate;

/* Earliest start of a plain F/I/W/B given its inputs from other stages,
 * or -1 (after noting what the rank waits for) when one is missing. The
 * same stage's F before I/B and I before W need no look: the static check
 * put them earlier in this rank's list, so they are done and end before
 * the rank's clock (and those entries are usually out of cache). */
static inline double fast_ready(eng *e, int rank, const pp_action *a) {
    const size_t m = (size_t)e->m;
    int st = a->stage, k = a->kind;
    size_t id = (size_t)st * m + (size_t)a->mb;
    const tpair *t = e->t;
    if (k == PP_ACT_F) {
        if (st == 0) return 0;
        double tp = TGET(t[id - m].f);
        if (tp < 0) return wait_for(e, rank, WAIT_TF, id - m), -1;
        return tp + e->xfer[st - 1];
    }
    if (k == PP_ACT_W || st + 1 >= e->S) return 0;
    double tn = TGET(t[id + m].i);
    if (tn < 0) return wait_for(e, rank, WAIT_TI, id + m), -1;
    return tn + e->xfer[st];
}

/* Runs a plain F/I/W/B from start; returns its end. */
static inline double fast_commit(eng *e, int rank, const pp_action *a, double start,
                                 fstate *f) {
    const size_t m = (size_t)e->m;
    const int *sr = e->s->stage_rank;
    int st = a->stage, k = a->kind;
    size_t id = (size_t)st * m + (size_t)a->mb;
    double end;
    if (k == PP_ACT_F) {
        end = start + e->cf[st];
        if (++f->act > f->pact) f->pact = f->act;
        f->bytes += e->cst[st];
        if (f->bytes > f->pbytes) f->pbytes = f->bytes;
        TSET(e->t[id].f, end);
        if (st + 1 < e->S && sr[st + 1] != rank) wake_on(e, sr[st + 1], WAIT_TF, id);
    } else if (k != PP_ACT_W) {
        end = start + e->ci[st];
        if (f->bytes + e->crc[st] > f->pbytes) f->pbytes = f->bytes + e->crc[st];
        f->act--;
        f->bytes -= e->cst[st];
        if (k == PP_ACT_I) {
            if (++f->wp > f->pwp) f->pwp = f->wp;
            f->bytes += e->cwst[st];
            if (f->bytes > f->pbytes) f->pbytes = f->bytes;
        } else {
            end += e->cw[st];
        }
        TSET(e->t[id].i, end);
        if (st > 0 && sr[st - 1] != rank) wake_on(e, sr[st - 1], WAIT_TI, id);
    } else {
        end = start + e->cw[st];
        f->wp--;
        f->bytes -= e->cwst[st];
    }
    f->busy += end - start;
    if (f->first < 0) f->first = start;
    return end;
}

/* The common case, inlined: F/I/W/B and compounds of them in a checked
 * compute-only schedule. Returns 1 when the next action needs the general
 * path, 0 when the rank finished or waits. */
static int fast_run(eng *e, int rank) {
    const pp_action *list = e->s->acts[rank];
    const pp_action *subs = e->s->sub;
    const size_t len = e->s->len[rank];
    rstate *rs = &e->rs[rank];
    size_t pc = rs->pc;
    fstate f = {rs->clock, rs->busy, rs->first, rs->bytes, rs->pbytes,
                rs->act,   rs->wp,   rs->pact,  rs->pwp};
    int slow = 0;
    while (pc < len) {
        const pp_action *a = &list[pc];
        int k = a->kind;
        if (k >= PP_ACT_F && k <= PP_ACT_B) {
            double ready = fast_ready(e, rank, a);
            if (ready < 0) break;
            f.clock = fast_commit(e, rank, a, ready > f.clock ? ready : f.clock, &f);
        } else if (k == PP_ACT_OVERLAP_F_B) {
            /* All inputs first, then the sub-actions back to back. */
            const pp_action *sub = subs + a->mb;
            double start = f.clock;
            int n = a->nsub, ok = 1;
            for (int j = 0; j < n; j++) {
                if (sub[j].kind < PP_ACT_F || sub[j].kind > PP_ACT_B) {
                    slow = 1;
                    break;
                }
                double r = fast_ready(e, rank, &sub[j]);
                if (r < 0) {
                    ok = 0;
                    break;
                }
                if (r > start) start = r;
            }
            if (slow || !ok) break;
            for (int j = 0; j < n; j++) start = fast_commit(e, rank, &sub[j], start, &f);
            f.clock = start;
        } else if (k != PP_ACT_IDLE) {
            slow = 1;
            break;
        }
        pc++;
    }
    rs->pc = pc;
    rs->clock = f.clock;
    rs->busy = f.busy;
    rs->first = f.first;
    if (f.clock > rs->last) rs->last = f.clock;
    rs->bytes = f.bytes;
    rs->pbytes = f.pbytes;
    rs->act = f.act;
    rs->wp = f.wp;
    rs->pact = f.pact;
    rs->pwp = f.pwp;
    /* The rank comes back later: have its next actions and their time
     * entries in cache by then. */
    if (pc + 5 < len) __builtin_prefetch(&list[pc + 5]);
    if (pc < len && list[pc].kind != PP_ACT_OVERLAP_F_B && list[pc].mb >= 0)
        __builtin_prefetch(&e->t[(size_t)list[pc].stage * (size_t)e->m + (size_t)list[pc].mb], 1);
    return slow;
}

/* Runs rank until it waits or finishes. */
static pp_status run_rank(eng *e, int rank) {
    const pp_schedule *s = e->s;
    const pp_action *list = s->acts[rank];
    while (e->rs[rank].pc < s->len[rank]) {
        if (e->fast && !fast_run(e, rank)) return PP_OK;
        const pp_action *a = &list[e->rs[rank].pc];
        if (a->kind == PP_ACT_IDLE) {
            e->rs[rank].pc++;
            continue;
        }
        double ready, start, end;
        if (a->kind != PP_ACT_OVERLAP_F_B) {
            if (!e->checked) PP_TRY(check_action(e, rank, a, a));
            int ok = readiness(e, rank, a, a, &ready);
            if (ok < 0) return (pp_status)ok;
            if (!ok) return PP_OK;
            start = ready > e->rs[rank].clock ? ready : e->rs[rank].clock;
            PP_TRY(commit(e, rank, a, start, &end));
            e->rs[rank].clock = end;
            if (e->trace && IS_COMPUTE(a->kind))
                PP_TRY(trace_add(e, rank, a->kind, PP_LANE_COMPUTE, a->stage, a->mb, -1, -1,
                                 start, end));
        } else {
            /* A compound starts once every sub-action's inputs are there
             * and runs them back to back. */
            const pp_action *sub = pp_schedule_subs(s, a);
            if (!sub) return where(e, rank, a, PP_ERR_INVALID, "broken compound action");
            start = e->rs[rank].clock;
            for (int k = 0; k < a->nsub; k++) {
                PP_TRY(check_action(e, rank, &sub[k], a));
                int ok = readiness(e, rank, &sub[k], a, &ready);
                if (ok < 0) return (pp_status)ok;
                if (!ok) return PP_OK;
                if (ready > start) start = ready;
            }
            double t = start;
            for (int k = 0; k < a->nsub; k++) {
                /* A sub-action may feed the next one (same rank). */
                int ok = readiness(e, rank, &sub[k], a, &ready);
                if (ok <= 0)
                    return where(e, rank, a, PP_ERR_INVALID,
                                 "sub-actions of a compound depend on each other out of order");
                PP_TRY(commit(e, rank, &sub[k], t, &end));
                t = end;
            }
            e->rs[rank].clock = t;
            if (e->trace) {
                int st2 = a->nsub > 1 ? sub[1].stage : -1, mb2 = a->nsub > 1 ? sub[1].mb : -1;
                PP_TRY(trace_add(e, rank, PP_ACT_OVERLAP_F_B, PP_LANE_COMPUTE, sub[0].stage,
                                 sub[0].mb, st2, mb2, start, t));
            }
        }
        e->rs[rank].pc++;
    }
    return PP_OK;
}

/* What the action a (stuck on rank) waits for, as text. */
static void describe_wait(const eng *e, int rank, const pp_action *a, char *out, size_t n) {
    const pp_action *x = a;
    const pp_action *sub = pp_schedule_subs(e->s, a);
    double ready;
    if (sub) /* the first sub-action that cannot start */
        for (int k = 0; k < a->nsub; k++)
            if (readiness((eng *)e, rank, &sub[k], a, &ready) == 0) {
                x = &sub[k];
                break;
            }
    pp_action need = *x;
    int s = x->stage;
    switch (x->kind) {
    case PP_ACT_F:
        need = pp_act(PP_ACT_F, s - 1, x->mb);
        break;
    case PP_ACT_I:
    case PP_ACT_B: {
        size_t id = (size_t)s * (size_t)e->m + (size_t)x->mb;
        if (TGET(e->t[id].f) < 0)
            need = pp_act(PP_ACT_F, s, x->mb);
        else
            need = pp_act(PP_ACT_I, s + 1, x->mb); /* or B */
        break;
    }
    case PP_ACT_W: need = pp_act(PP_ACT_I, s, x->mb); break;
    case PP_ACT_SEND_F: need = pp_act(PP_ACT_F, s, x->mb); break;
    case PP_ACT_SEND_B: need = pp_act(PP_ACT_I, s, x->mb); break;
    case PP_ACT_RECV_F: need = pp_act(PP_ACT_SEND_F, s - 1, x->mb); break;
    case PP_ACT_RECV_B: need = pp_act(PP_ACT_SEND_B, s + 1, x->mb); break;
    default: break;
    }
    char nb[PP_ACTION_STR_MAX];
    pp_action_format(NULL, &need, nb, sizeof nb);
    if ((need.kind == PP_ACT_I) && x->kind != PP_ACT_W && x->kind != PP_ACT_SEND_B)
        snprintf(nb + strlen(nb), sizeof nb - strlen(nb), " (or %dB%d)", (int)need.stage,
                 (int)need.mb);
    int owner = need.stage >= 0 && need.stage < e->S ? e->s->stage_rank[need.stage] : -1;
    if (owner < 0) {
        snprintf(out, n, "waits for %s, whose stage no rank holds", nb);
    } else if (e->rs[owner].pc >= e->s->len[owner]) {
        snprintf(out, n, "waits for %s, which rank %d never runs (its list has ended)", nb,
                 owner);
    } else {
        char ob[PP_ACTION_STR_MAX];
        pp_action_format(e->s, &e->s->acts[owner][e->rs[owner].pc], ob, sizeof ob);
        if (owner == rank)
            snprintf(out, n, "waits for %s, which comes later on the same rank", nb);
        else
            snprintf(out, n, "waits for %s on rank %d, which is itself stuck at step %zu (%s)",
                     nb, owner, e->rs[owner].pc, ob);
    }
}

static void *xcalloc(size_t n, size_t sz, int *oom) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) *oom = 1;
    return p;
}

static double *times_array(size_t n, int *oom) {
    double *t = malloc((n ? n : 1) * sizeof *t);
    if (!t) {
        *oom = 1;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) t[i] = -1.0;
    return t;
}

static void eng_free(eng *e) {
    free(e->t);
    free(e->tSF);
    free(e->tSB);
    free(e->rflag);
    free(e->xfer);
    free(e->cf);
    free(e->ci);
    free(e->cw);
    free(e->cst);
    free(e->cwst);
    free(e->crc);
    free(e->rs);
    free(e->work);
}

pp_status pp_sched_run(const pp_schedule *s, const pp_cost_model *costs, pp_trace *trace,
                       int checked, pp_sim_result *res, int *err_rank, long *err_step) {
    if (err_rank) *err_rank = -1;
    if (err_step) *err_step = -1;
    if (!s->stage_rank || s->nstages <= 0 || s->nmb <= 0)
        return pp_error(PP_ERR_INVALID, "schedule has no stages or microbatches");
    if (costs && costs->nstages < s->nstages)
        return pp_error(PP_ERR_INVALID, "cost model covers %d stages, schedule has %d",
                        costs->nstages, s->nstages);
    eng e = {0};
    e.s = s;
    e.c = costs;
    e.trace = trace;
    e.p = s->nranks;
    e.S = s->nstages;
    e.m = s->nmb;
    e.lowered = pp_schedule_has_comms(s);
    e.checked = checked;
    size_t n = (size_t)e.S * (size_t)e.m, p = (size_t)e.p;
    int oom = 0;
    e.t = xcalloc(n, sizeof *e.t, &oom); /* +0.0 everywhere: nothing done yet */
    if (e.lowered) {
        e.tSF = times_array(n, &oom);
        e.tSB = times_array(n, &oom);
        e.rflag = xcalloc(n, 1, &oom);
    }
    e.xfer = xcalloc((size_t)e.S, sizeof *e.xfer, &oom);
    e.cf = xcalloc((size_t)e.S, sizeof(double), &oom);
    e.ci = xcalloc((size_t)e.S, sizeof(double), &oom);
    e.cw = xcalloc((size_t)e.S, sizeof(double), &oom);
    e.cst = xcalloc((size_t)e.S, sizeof(double), &oom);
    e.cwst = xcalloc((size_t)e.S, sizeof(double), &oom);
    e.crc = xcalloc((size_t)e.S, sizeof(double), &oom);
    e.rs = xcalloc(p, sizeof *e.rs, &oom);
    e.work = xcalloc(p, sizeof(int), &oom);
    if (oom) {
        eng_free(&e);
        return pp_error(PP_ERR_NOMEM, "schedule engine: out of memory (%d stages x %d microbatches)",
                        e.S, e.m);
    }
    for (int st = 0; st + 1 < e.S; st++)
        if (s->stage_rank[st] != s->stage_rank[st + 1])
            e.xfer[st] = costs ? pp_cost_model_xfer(costs, st) : 0.0;
    for (int st = 0; st < e.S; st++) {
        e.cf[st] = costs ? costs->f[st] : 1.0;
        e.ci[st] = costs ? pp_cost_model_backward_input(costs, st) : 1.0;
        e.cw[st] = costs ? costs->w[st] : 1.0;
        e.cst[st] = costs ? pp_cost_model_stash(costs, st) : 0.0;
        e.cwst[st] = costs && costs->wstash_bytes ? costs->wstash_bytes[st] : 0.0;
        e.crc[st] = costs ? pp_cost_model_recompute_extra(costs, st) : 0.0;
    }
    e.fast = !e.lowered && !trace && checked;
    for (int r = e.p - 1; r >= 0; r--) {
        e.rs[r].first = -1.0;
        wake(&e, r);
    }
    pp_status st = PP_OK;
    while (e.nwork > 0 && st == PP_OK) {
        int r = e.work[--e.nwork];
        e.rs[r].queued = 0;
        st = run_rank(&e, r);
        if (st != PP_OK) {
            if (err_rank) *err_rank = r;
            if (err_step) *err_step = (long)e.rs[r].pc;
        }
    }
    if (st == PP_OK)
        for (int r = 0; r < e.p; r++) {
            if (e.rs[r].pc >= s->len[r]) continue;
            char why[4 * PP_ACTION_STR_MAX], ab[PP_ACTION_STR_MAX];
            const pp_action *a = &s->acts[r][e.rs[r].pc];
            describe_wait(&e, r, a, why, sizeof why);
            pp_action_format(s, a, ab, sizeof ab);
            st = pp_error(PP_ERR_INVALID, "deadlock: rank %d step %zu action %s %s", r, e.rs[r].pc,
                          ab, why);
            if (err_rank) *err_rank = r;
            if (err_step) *err_step = (long)e.rs[r].pc;
            break;
        }
    if (st == PP_OK && res) {
        double mk = 0, tot = 0;
        for (int r = 0; r < e.p; r++) {
            if (e.rs[r].clock > mk) mk = e.rs[r].clock;
            tot += e.rs[r].busy;
        }
        res->makespan = mk;
        res->total_busy = tot;
        for (int r = 0; r < e.p; r++) {
            res->busy[r] = e.rs[r].busy;
            res->bubble[r] = mk > 0 ? 1.0 - e.rs[r].busy / mk : 0.0;
            res->first_start[r] = e.rs[r].first < 0 ? 0.0 : e.rs[r].first;
            res->last_end[r] = e.rs[r].last;
            res->peak_act[r] = e.rs[r].pact;
            res->peak_wpend[r] = e.rs[r].pwp;
            res->peak_bytes[r] = e.rs[r].pbytes;
        }
    }
    eng_free(&e);
    return st;
}

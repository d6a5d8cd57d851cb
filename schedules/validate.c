/* Schedule validation: static rules per action, completeness per
 * (stage, microbatch), then a dry run of the engine for deadlocks. */
#include <stdio.h>
#include <stdlib.h>

#include "sched_internal.h"

#include "status_internal.h"
enum {
    SEEN_F = 1,
    SEEN_I = 2,
    SEEN_W = 4,
    SEEN_B = 8,
    SEEN_SF = 16,
    SEEN_RF = 32,
    SEEN_SB = 64,
    SEEN_RB = 128
};

typedef struct vstate {
    const pp_schedule *s;
    uint8_t *seen;  /* [S*m] */
    int *bwd_done;  /* [S] backwards (B or W) run so far */
    int lowered;
    int err_rank;
    long err_step;
} vstate;

static pp_status fail_at(vstate *v, int rank, size_t step, const pp_action *top,
                         const char *fmt, int a, int b, int c) {
    char ab[PP_ACTION_STR_MAX], msg[256];
    pp_action_format(v->s, top, ab, sizeof ab);
    snprintf(msg, sizeof msg, fmt, a, b, c);
    v->err_rank = rank;
    v->err_step = (long)step;
    return pp_error(PP_ERR_INVALID, "rank %d step %zu action %s: %s", rank, step, ab, msg);
}

static int other_rank(const pp_schedule *s, int st, int rank) {
    return s->stage_rank[st] != rank;
}

static pp_status check_one(vstate *v, int rank, size_t step, const pp_action *x,
                           const pp_action *top) {
    const pp_schedule *s = v->s;
    int S = s->nstages, m = s->nmb, st = x->stage, mb = x->mb, kind = x->kind;
    if (kind <= PP_ACT_IDLE || kind >= PP_ACT_OVERLAP_F_B)
        return fail_at(v, rank, step, top, "a compound action may only hold plain actions", 0, 0,
                       0);
    if (st < 0 || st >= S)
        return fail_at(v, rank, step, top, "stage %d out of range (%d stages)", st, S, 0);
    int has_mb = kind != PP_ACT_UNSHARD && kind != PP_ACT_RESHARD && kind != PP_ACT_REDUCE_GRAD;
    if (has_mb && (mb < 0 || mb >= m))
        return fail_at(v, rank, step, top, "microbatch %d out of range (%d microbatches)", mb, m,
                       0);
    if (s->stage_rank[st] != rank)
        return fail_at(v, rank, step, top, "stage %d is assigned to both rank %d and rank %d", st,
                       s->stage_rank[st], rank);
    if (!has_mb) {
        if (kind == PP_ACT_REDUCE_GRAD && v->bwd_done[st] != m)
            return fail_at(v, rank, step, top,
                           "REDUCE_GRAD of stage %d after only %d of %d backwards", st,
                           v->bwd_done[st], m);
        return PP_OK;
    }
    uint8_t *f = &v->seen[(size_t)st * (size_t)m + (size_t)mb];
    switch (kind) {
    case PP_ACT_F:
        if (*f & SEEN_F)
            return fail_at(v, rank, step, top, "second forward of stage %d microbatch %d", st, mb,
                           0);
        if (v->lowered && st > 0 && other_rank(s, st - 1, rank) && !(*f & SEEN_RF))
            return fail_at(v, rank, step, top,
                           "forward of stage %d microbatch %d without a RECV_F before it", st,
                           mb, 0);
        *f |= SEEN_F;
        break;
    case PP_ACT_I:
    case PP_ACT_B:
        if (!(*f & SEEN_F))
            return fail_at(v, rank, step, top,
                           kind == PP_ACT_I
                               ? "Running Backward Input for stage %d, microbatch %d without "
                                 "first running Forward"
                               : "Running Full Backward for stage %d, microbatch %d without "
                                 "first running Forward",
                           st, mb, 0);
        if (*f & (SEEN_I | SEEN_B))
            return fail_at(v, rank, step, top, "second backward of stage %d microbatch %d", st,
                           mb, 0);
        if (v->lowered && st + 1 < S && other_rank(s, st + 1, rank) && !(*f & SEEN_RB))
            return fail_at(v, rank, step, top,
                           "backward of stage %d microbatch %d without a RECV_B before it", st,
                           mb, 0);
        *f |= kind == PP_ACT_I ? SEEN_I : SEEN_B;
        if (kind == PP_ACT_B) v->bwd_done[st]++;
        break;
    case PP_ACT_W:
        if (*f & SEEN_B)
            return fail_at(v, rank, step, top,
                           "backward weight of stage %d microbatch %d after a full backward", st,
                           mb, 0);
        if (!(*f & SEEN_I))
            return fail_at(v, rank, step, top,
                           "Running Backward Weight for stage %d, microbatch %d without first "
                           "running Backward Input",
                           st, mb, 0);
        if (*f & SEEN_W)
            return fail_at(v, rank, step, top, "second backward weight of stage %d microbatch %d",
                           st, mb, 0);
        *f |= SEEN_W;
        v->bwd_done[st]++;
        break;
    case PP_ACT_SEND_F:
        if (st + 1 >= S || !other_rank(s, st + 1, rank))
            return fail_at(v, rank, step, top,
                           "SEND_F from stage %d, whose next stage is not on another rank", st,
                           0, 0);
        if (!(*f & SEEN_F))
            return fail_at(v, rank, step, top,
                           "SEND_F of stage %d microbatch %d before its forward", st, mb, 0);
        if (*f & SEEN_SF)
            return fail_at(v, rank, step, top, "second SEND_F of stage %d microbatch %d", st, mb,
                           0);
        *f |= SEEN_SF;
        break;
    case PP_ACT_RECV_F:
        if (st == 0 || !other_rank(s, st - 1, rank))
            return fail_at(v, rank, step, top,
                           "RECV_F at stage %d, whose previous stage is not on another rank", st,
                           0, 0);
        if (*f & (SEEN_RF | SEEN_F))
            return fail_at(v, rank, step, top,
                           "RECV_F of stage %d microbatch %d repeated or after its forward", st,
                           mb, 0);
        *f |= SEEN_RF;
        break;
    case PP_ACT_SEND_B:
        if (st == 0 || !other_rank(s, st - 1, rank))
            return fail_at(v, rank, step, top,
                           "SEND_B from stage %d, whose previous stage is not on another rank",
                           st, 0, 0);
        if (!(*f & (SEEN_I | SEEN_B)))
            return fail_at(v, rank, step, top,
                           "SEND_B of stage %d microbatch %d before its backward", st, mb, 0);
        if (*f & SEEN_SB)
            return fail_at(v, rank, step, top, "second SEND_B of stage %d microbatch %d", st, mb,
                           0);
        *f |= SEEN_SB;
        break;
    case PP_ACT_RECV_B:
        if (st + 1 >= S || !other_rank(s, st + 1, rank))
            return fail_at(v, rank, step, top,
                           "RECV_B at stage %d, whose next stage is not on another rank", st, 0,
                           0);
        if (*f & (SEEN_RB | SEEN_I | SEEN_B))
            return fail_at(v, rank, step, top,
                           "RECV_B of stage %d microbatch %d repeated or after its backward", st,
                           mb, 0);
        *f |= SEEN_RB;
        break;
    default: break;
    }
    return PP_OK;
}

/* Every (stage, microbatch) complete and every send received. */
static pp_status check_complete(vstate *v) {
    const pp_schedule *s = v->s;
    int S = s->nstages, m = s->nmb;
    for (int st = 0; st < S; st++)
        for (int mb = 0; mb < m; mb++) {
            uint8_t f = v->seen[(size_t)st * (size_t)m + (size_t)mb];
            int rank = s->stage_rank[st];
            if (!(f & SEEN_F))
                return pp_error(PP_ERR_INVALID,
                                "stage %d (rank %d) microbatch %d: no forward (expected one F "
                                "per microbatch, %d microbatches)",
                                st, rank, mb, m);
            if (!(f & (SEEN_B | SEEN_I)))
                return pp_error(PP_ERR_INVALID,
                                "stage %d (rank %d) microbatch %d: no backward (expected one B or "
                                "one I and one W)",
                                st, rank, mb);
            if ((f & SEEN_I) && !(f & SEEN_W))
                return pp_error(PP_ERR_INVALID,
                                "stage %d (rank %d) microbatch %d: backward input without "
                                "backward weight (I and W must have equal counts)",
                                st, rank, mb);
            if (!v->lowered) continue;
            if (st + 1 < S && s->stage_rank[st + 1] != rank) {
                uint8_t g = v->seen[(size_t)(st + 1) * (size_t)m + (size_t)mb];
                if (!(f & SEEN_SF) || !(g & SEEN_RF))
                    return pp_error(PP_ERR_INVALID,
                                    "microbatch %d, stage %d (rank %d) -> stage %d (rank %d): "
                                    "%s without a matching %s",
                                    mb, st, rank, st + 1, s->stage_rank[st + 1],
                                    (f & SEEN_SF) ? "SEND_F" : "RECV_F",
                                    (f & SEEN_SF) ? "RECV_F" : "SEND_F");
                if (!(g & SEEN_SB) || !(f & SEEN_RB))
                    return pp_error(PP_ERR_INVALID,
                                    "microbatch %d, stage %d (rank %d) -> stage %d (rank %d): "
                                    "%s without a matching %s",
                                    mb, st + 1, s->stage_rank[st + 1], st, rank,
                                    (g & SEEN_SB) ? "SEND_B" : "RECV_B",
                                    (g & SEEN_SB) ? "RECV_B" : "SEND_B");
            }
        }
    return PP_OK;
}

/* The table around the failing step (the whole schedule when short). */
static void make_table(const pp_schedule *s, long step, char **table) {
    long steps = 0;
    for (int r = 0; r < s->nranks; r++)
        if ((long)s->len[r] > steps) steps = (long)s->len[r];
    long first = 0, last = steps - 1;
    if (steps > 200) {
        first = step - 20;
        last = step + 20;
    }
    char *t = NULL;
    if (pp_sched_table_range(s, first, last, step, &t) == PP_OK) *table = t;
}

pp_status pp_sched_check_static(const pp_schedule *s, int *err_rank, long *err_step) {
    if (err_rank) *err_rank = -1;
    if (err_step) *err_step = -1;
    if (s->nstages <= 0 || s->nmb <= 0 || !s->stage_rank)
        return pp_error(PP_ERR_INVALID,
                        "schedule has %d stages and %d microbatches (empty or not inferred)",
                        s->nstages, s->nmb);
    for (int st = 0; st < s->nstages; st++)
        if (s->stage_rank[st] < 0 || s->stage_rank[st] >= s->nranks)
            return pp_error(PP_ERR_INVALID, "stage %d is on no rank (no action runs it)", st);
    /* Each (stage, microbatch) needs a forward and a backward: a schedule
     * with fewer actions cannot be complete (and this bounds the memory
     * below by the schedule's size). */
    size_t need = 2 * (size_t)s->nstages * (size_t)s->nmb, have = s->nsub;
    for (int r = 0; r < s->nranks; r++) have += s->len[r];
    if (have < need)
        return pp_error(PP_ERR_INVALID,
                        "%zu actions cannot cover %d stages x %d microbatches (each needs a "
                        "forward and a backward)",
                        have, s->nstages, s->nmb);
    vstate v = {0};
    v.s = s;
    v.err_rank = -1;
    v.err_step = -1;
    v.lowered = pp_schedule_has_comms(s);
    v.seen = calloc((size_t)s->nstages * (size_t)s->nmb, 1);
    v.bwd_done = calloc((size_t)s->nstages, sizeof *v.bwd_done);
    if (!v.seen || !v.bwd_done) {
        free(v.seen);
        free(v.bwd_done);
        return pp_error(PP_ERR_NOMEM, "validate: out of memory");
    }
    pp_status st = PP_OK;
    for (int r = 0; r < s->nranks && st == PP_OK; r++)
        for (size_t k = 0; k < s->len[r] && st == PP_OK; k++) {
            const pp_action *a = &s->acts[r][k];
            if (a->kind == PP_ACT_IDLE) continue;
            if (a->kind == PP_ACT_OVERLAP_F_B) {
                const pp_action *sub = pp_schedule_subs(s, a);
                if (!sub) {
                    st = fail_at(&v, r, k, a, "broken compound action", 0, 0, 0);
                    break;
                }
                for (int j = 0; j < a->nsub && st == PP_OK; j++)
                    st = check_one(&v, r, k, &sub[j], a);
            } else {
                st = check_one(&v, r, k, a, a);
            }
        }
    if (st == PP_OK) st = check_complete(&v);
    free(v.seen);
    free(v.bwd_done);
    if (err_rank) *err_rank = v.err_rank;
    if (err_step) *err_step = v.err_step;
    return st;
}

pp_status pp_schedule_validate(const pp_schedule *s, char **table) {
    if (table) *table = NULL;
    int er;
    long es;
    pp_status st = pp_sched_check_static(s, &er, &es);
    if (st == PP_OK) st = pp_sched_run(s, NULL, NULL, 1, NULL, &er, &es);
    if (st != PP_OK && table && es >= 0) make_table(s, es, table);
    return st;
}

/* Lowering a compute-only schedule: merge I+W into B, add SEND/RECV and
 * REDUCE_GRAD. */
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

#include "status_internal.h"
typedef struct lower {
    const pp_schedule *in;
    pp_schedule *out;
    unsigned flags;
    int *bwd; /* [S] backwards (B or W) emitted per stage */
} lower;

/* RECV before x when its input comes from another rank. */
static pp_status recv_for(lower *l, int rank, const pp_action *x) {
    const int *sr = l->in->stage_rank;
    int s = x->stage, S = l->in->nstages;
    if (x->kind == PP_ACT_F && s > 0 && sr[s - 1] != rank)
        return pp_schedule_append(l->out, rank, pp_act(PP_ACT_RECV_F, s, x->mb));
    if ((x->kind == PP_ACT_I || x->kind == PP_ACT_B) && s + 1 < S && sr[s + 1] != rank)
        return pp_schedule_append(l->out, rank, pp_act(PP_ACT_RECV_B, s, x->mb));
    return PP_OK;
}

/* SEND after x when its result goes to another rank. */
static pp_status send_for(lower *l, int rank, const pp_action *x) {
    const int *sr = l->in->stage_rank;
    int s = x->stage, S = l->in->nstages;
    if (x->kind == PP_ACT_F && s + 1 < S && sr[s + 1] != rank)
        return pp_schedule_append(l->out, rank, pp_act(PP_ACT_SEND_F, s, x->mb));
    if ((x->kind == PP_ACT_I || x->kind == PP_ACT_B) && s > 0 && sr[s - 1] != rank)
        return pp_schedule_append(l->out, rank, pp_act(PP_ACT_SEND_B, s, x->mb));
    return PP_OK;
}

/* REDUCE_GRAD(s) once the last backward of s has run (torch's
 * _add_reduce_grad). */
static pp_status reduce_for(lower *l, int rank, const pp_action *x) {
    if (x->kind != PP_ACT_B && x->kind != PP_ACT_W) return PP_OK;
    if (++l->bwd[x->stage] != l->in->nmb) return PP_OK;
    return pp_schedule_append(l->out, rank, pp_act(PP_ACT_REDUCE_GRAD, x->stage, -1));
}

static pp_status emit(lower *l, int rank, const pp_action *a) {
    const pp_action *sub = pp_schedule_subs(l->in, a);
    int n = sub ? a->nsub : 1;
    const pp_action *xs = sub ? sub : a;
    for (int k = 0; k < n; k++)
        if (xs[k].stage < 0 || xs[k].stage >= l->in->nstages)
            return pp_error(PP_ERR_INVALID, "lower: rank %d: stage %d out of range", rank,
                            (int)xs[k].stage);
    if (l->flags & PP_LOWER_COMMS)
        for (int k = 0; k < n; k++) PP_TRY(recv_for(l, rank, &xs[k]));
    if (sub)
        PP_TRY(pp_schedule_append_overlap(l->out, rank, sub, n));
    else
        PP_TRY(pp_schedule_append(l->out, rank, *a));
    if (l->flags & PP_LOWER_COMMS)
        for (int k = 0; k < n; k++) PP_TRY(send_for(l, rank, &xs[k]));
    if (l->flags & PP_LOWER_REDUCE_GRAD)
        for (int k = 0; k < n; k++) PP_TRY(reduce_for(l, rank, &xs[k]));
    return PP_OK;
}

static pp_status lower_rank(lower *l, int rank) {
    const pp_action *list = l->in->acts[rank];
    size_t len = l->in->len[rank];
    PP_TRY(pp_schedule_reserve(l->out, rank, len + len / 2 + 4));
    for (size_t k = 0; k < len; k++) {
        pp_action a = list[k];
        if (a.kind == PP_ACT_IDLE) continue;
        if (a.kind >= PP_ACT_SEND_F && a.kind <= PP_ACT_RECV_B && (l->flags & PP_LOWER_COMMS))
            return pp_error(PP_ERR_INVALID,
                            "rank %d step %zu: schedule already has communication actions", rank,
                            k);
        if (a.kind == PP_ACT_REDUCE_GRAD && (l->flags & PP_LOWER_REDUCE_GRAD)) continue;
        if ((l->flags & PP_LOWER_MERGE_BW) && a.kind == PP_ACT_I) {
            size_t j = k + 1;
            while (j < len && list[j].kind == PP_ACT_IDLE) j++;
            if (j < len && list[j].kind == PP_ACT_W && list[j].stage == a.stage &&
                list[j].mb == a.mb) {
                a.kind = PP_ACT_B;
                k = j;
            }
        }
        if (a.kind == PP_ACT_OVERLAP_F_B && !pp_schedule_subs(l->in, &a))
            return pp_error(PP_ERR_INVALID, "rank %d step %zu: broken compound action", rank, k);
        PP_TRY(emit(l, rank, &a));
    }
    return PP_OK;
}

pp_status pp_schedule_lower(const pp_schedule *in, unsigned flags, pp_schedule **out) {
    *out = NULL;
    if (in->nstages <= 0 || !in->stage_rank)
        return pp_error(PP_ERR_INVALID, "lower: schedule has no stage map");
    for (int st = 0; st < in->nstages; st++)
        if (in->stage_rank[st] < 0)
            return pp_error(PP_ERR_INVALID, "lower: stage %d is on no rank", st);
    lower l = {in, NULL, flags, NULL};
    PP_TRY(pp_schedule_new(in->nranks, in->nstages, in->nmb, &l.out));
    memcpy(l.out->stage_rank, in->stage_rank, (size_t)in->nstages * sizeof(int));
    l.out->placement = in->placement;
    memcpy(l.out->name, in->name, sizeof l.out->name);
    l.bwd = calloc((size_t)in->nstages, sizeof *l.bwd);
    pp_status st = l.bwd ? PP_OK : pp_error(PP_ERR_NOMEM, "lower: out of memory");
    for (int r = 0; r < in->nranks && st == PP_OK; r++) st = lower_rank(&l, r);
    free(l.bwd);
    if (st != PP_OK) {
        pp_schedule_free(l.out);
        return st;
    }
    *out = l.out;
    return PP_OK;
}

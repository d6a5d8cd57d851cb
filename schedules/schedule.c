/* The schedule container: per-rank action arrays and the compound pool. */
#include "pippin/schedule.h"
#include "sched_internal.h"

#include <stdlib.h>
#include <string.h>

#include "status_internal.h"
pp_status pp_schedule_new(int nranks, int nstages, int nmb, pp_schedule **out) {
    *out = NULL;
    if (nranks < 1 || nranks > PP_SCHED_MAX_RANKS)
        return pp_error(PP_ERR_INVALID, "schedule: %d ranks (must be 1..%d)", nranks,
                        PP_SCHED_MAX_RANKS);
    if (nstages < 0 || nstages > PP_SCHED_MAX_STAGES)
        return pp_error(PP_ERR_INVALID, "schedule: %d stages (must be 0..%d)", nstages,
                        PP_SCHED_MAX_STAGES);
    if (nmb < 0 || nmb > PP_SCHED_MAX_MB)
        return pp_error(PP_ERR_INVALID, "schedule: %d microbatches (must be 0..%d)", nmb,
                        PP_SCHED_MAX_MB);
    pp_schedule *s = calloc(1, sizeof *s);
    if (!s) return pp_error(PP_ERR_NOMEM, "schedule: out of memory");
    s->nranks = nranks;
    s->nstages = nstages;
    s->nmb = nmb;
    s->acts = calloc((size_t)nranks, sizeof *s->acts);
    s->len = calloc((size_t)nranks, sizeof *s->len);
    s->cap_ = calloc((size_t)nranks, sizeof *s->cap_);
    if (nstages > 0) s->stage_rank = malloc((size_t)nstages * sizeof *s->stage_rank);
    if (!s->acts || !s->len || !s->cap_ || (nstages > 0 && !s->stage_rank)) {
        pp_schedule_free(s);
        return pp_error(PP_ERR_NOMEM, "schedule: out of memory");
    }
    for (int i = 0; i < nstages; i++) s->stage_rank[i] = -1;
    *out = s;
    return PP_OK;
}

void pp_schedule_free(pp_schedule *s) {
    if (!s) return;
    if (s->acts)
        for (int r = 0; r < s->nranks; r++) free(s->acts[r]);
    free(s->acts);
    free(s->len);
    free(s->cap_);
    free(s->stage_rank);
    free(s->sub);
    free(s);
}

pp_status pp_schedule_place(pp_schedule *s, pp_placement placement) {
    int p = s->nranks;
    if (s->nstages <= 0 || s->nstages % p != 0)
        return pp_error(PP_ERR_INVALID, "placement: %d stages do not divide over %d ranks",
                        s->nstages, p);
    if (placement == PP_PLACE_V && s->nstages != 2 * p)
        return pp_error(PP_ERR_INVALID,
                        "V placement needs exactly 2 stages per rank (%d stages, %d ranks)",
                        s->nstages, p);
    for (int st = 0; st < s->nstages; st++) {
        if (placement == PP_PLACE_V)
            s->stage_rank[st] = st < p ? st : 2 * p - 1 - st;
        else if (placement == PP_PLACE_LOOP)
            s->stage_rank[st] = st % p;
    }
    s->placement = placement;
    return PP_OK;
}

pp_status pp_schedule_reserve(pp_schedule *s, int rank, size_t n) {
    if (rank < 0 || rank >= s->nranks)
        return pp_error(PP_ERR_INVALID, "schedule: rank %d out of range", rank);
    if (n <= s->cap_[rank]) return PP_OK;
    if (n > SIZE_MAX / sizeof(pp_action))
        return pp_error(PP_ERR_NOMEM, "schedule: rank %d: too many actions", rank);
    pp_action *a = realloc(s->acts[rank], n * sizeof *a);
    if (!a) return pp_error(PP_ERR_NOMEM, "schedule: out of memory for rank %d", rank);
    s->acts[rank] = a;
    s->cap_[rank] = n;
    return PP_OK;
}

pp_status pp_schedule_append(pp_schedule *s, int rank, pp_action a) {
    if (rank < 0 || rank >= s->nranks)
        return pp_error(PP_ERR_INVALID, "schedule: rank %d out of range", rank);
    if (s->len[rank] == s->cap_[rank])
        PP_TRY(pp_schedule_reserve(s, rank, s->cap_[rank] ? 2 * s->cap_[rank] : 64));
    s->acts[rank][s->len[rank]++] = a;
    return PP_OK;
}

pp_status pp_sched_reserve_subs(pp_schedule *s, size_t n) {
    if (n <= s->sub_cap_) return PP_OK;
    if (n > (size_t)INT32_MAX) return pp_error(PP_ERR_NOMEM, "schedule: too many compound actions");
    pp_action *p = realloc(s->sub, n * sizeof *p);
    if (!p) return pp_error(PP_ERR_NOMEM, "schedule: out of memory");
    s->sub = p;
    s->sub_cap_ = n;
    return PP_OK;
}

pp_status pp_schedule_append_overlap(pp_schedule *s, int rank, const pp_action *subs, int n) {
    if (n < 1 || n > PP_OVERLAP_MAX)
        return pp_error(PP_ERR_INVALID, "OVERLAP_F_B with %d sub-actions (1..%d allowed)", n,
                        PP_OVERLAP_MAX);
    for (int k = 0; k < n; k++)
        if (subs[k].kind == PP_ACT_OVERLAP_F_B || subs[k].kind == PP_ACT_IDLE)
            return pp_error(PP_ERR_INVALID, "OVERLAP_F_B sub-action %d must be a plain action",
                            k);
    if (s->nsub > (size_t)INT32_MAX - (size_t)n)
        return pp_error(PP_ERR_NOMEM, "schedule: too many compound actions");
    if (s->nsub + (size_t)n > s->sub_cap_) {
        size_t cap = s->sub_cap_ ? 2 * s->sub_cap_ : 64;
        while (cap < s->nsub + (size_t)n) cap *= 2;
        pp_action *p = realloc(s->sub, cap * sizeof *p);
        if (!p) return pp_error(PP_ERR_NOMEM, "schedule: out of memory");
        s->sub = p;
        s->sub_cap_ = cap;
    }
    pp_action a = {-1, (int32_t)s->nsub, PP_ACT_OVERLAP_F_B, (uint8_t)n, 0};
    PP_TRY(pp_schedule_append(s, rank, a));
    memcpy(s->sub + s->nsub, subs, (size_t)n * sizeof *subs);
    s->nsub += (size_t)n;
    return PP_OK;
}

const pp_action *pp_schedule_subs(const pp_schedule *s, const pp_action *a) {
    if (!s || a->kind != PP_ACT_OVERLAP_F_B || a->mb < 0 || (size_t)a->mb + a->nsub > s->nsub)
        return NULL;
    return s->sub + a->mb;
}

size_t pp_schedule_count(const pp_schedule *s) {
    size_t n = 0;
    for (int r = 0; r < s->nranks; r++)
        for (size_t k = 0; k < s->len[r]; k++) n += s->acts[r][k].kind != PP_ACT_IDLE;
    return n;
}

int pp_schedule_has_comms(const pp_schedule *s) {
    for (int r = 0; r < s->nranks; r++)
        for (size_t k = 0; k < s->len[r]; k++) {
            int kd = s->acts[r][k].kind;
            if (kd >= PP_ACT_SEND_F && kd <= PP_ACT_RECV_B) return 1;
        }
    return 0;
}

/* Grows the stage map to n stages, new entries unknown. */
static pp_status grow_stages(pp_schedule *s, int n) {
    if (n <= s->nstages && s->stage_rank) return PP_OK;
    int *m = realloc(s->stage_rank, (size_t)n * sizeof *m);
    if (!m) return pp_error(PP_ERR_NOMEM, "schedule: out of memory");
    for (int i = s->nstages; i < n; i++) m[i] = -1;
    s->stage_rank = m;
    s->nstages = n;
    return PP_OK;
}

pp_status pp_schedule_infer(pp_schedule *s) {
    int max_stage = -1, max_mb = -1;
    for (int r = 0; r < s->nranks; r++)
        for (size_t k = 0; k < s->len[r]; k++) {
            const pp_action *a = &s->acts[r][k];
            if (a->kind == PP_ACT_IDLE) continue;
            const pp_action *sub = pp_schedule_subs(s, a);
            if (a->kind == PP_ACT_OVERLAP_F_B && !sub)
                return pp_error(PP_ERR_INVALID, "rank %d step %zu: broken compound action", r,
                                k);
            int n = sub ? a->nsub : 1;
            for (int j = 0; j < n; j++) {
                const pp_action *x = sub ? &sub[j] : a;
                if (x->stage > max_stage) max_stage = x->stage;
                if (x->mb > max_mb) max_mb = x->mb;
            }
        }
    if (max_stage >= PP_SCHED_MAX_STAGES)
        return pp_error(PP_ERR_INVALID, "schedule names stage %d (limit %d)", max_stage,
                        PP_SCHED_MAX_STAGES - 1);
    if (max_mb >= PP_SCHED_MAX_MB)
        return pp_error(PP_ERR_INVALID, "schedule names microbatch %d (limit %d)", max_mb,
                        PP_SCHED_MAX_MB - 1);
    if (max_stage + 1 > s->nstages || !s->stage_rank) PP_TRY(grow_stages(s, max_stage + 1));
    if (max_mb + 1 > s->nmb) s->nmb = max_mb + 1;
    /* Stage map: the rank whose compute actions name the stage first. */
    for (int r = 0; r < s->nranks; r++)
        for (size_t k = 0; k < s->len[r]; k++) {
            const pp_action *a = &s->acts[r][k];
            const pp_action *sub = pp_schedule_subs(s, a);
            int n = sub ? a->nsub : 1;
            for (int j = 0; j < n; j++) {
                const pp_action *x = sub ? &sub[j] : a;
                if (pp_act_is_compute(x->kind) && x->stage >= 0 && s->stage_rank[x->stage] < 0)
                    s->stage_rank[x->stage] = r;
            }
        }
    return PP_OK;
}

/* Fill-drain style generators: GPipe, 1F1B and LoopedBFS. */
#include "sched_internal.h"

#include "status_internal.h"
#define ADD(r, k, st, mb) PP_TRY(pp_sched_push(s, (r), pp_act((k), (st), (mb))))

pp_status pp_gen_gpipe(pp_schedule *s) {
    int m = s->nmb;
    for (int r = 0; r < s->nranks; r++) {
        PP_TRY(pp_schedule_reserve(s, r, 2 * (size_t)m));
        for (int mb = 0; mb < m; mb++) ADD(r, PP_ACT_F, r, mb);
        for (int mb = 0; mb < m; mb++) ADD(r, PP_ACT_B, r, mb);
    }
    return PP_OK;
}

/* Megatron/DeepSpeed 1F1B on every rank: min(p-r-1, m) warmup forwards,
 * then forward/backward pairs, then the remaining backwards. (torch's own
 * pipeline_order for the last rank is off by one; this is what its
 * runtime actually executes.) */
pp_status pp_gen_1f1b(pp_schedule *s) {
    int p = s->nranks, m = s->nmb;
    for (int r = 0; r < p; r++) {
        PP_TRY(pp_schedule_reserve(s, r, 2 * (size_t)m));
        int warm = p - r - 1 < m ? p - r - 1 : m;
        int f = 0, b = 0;
        while (f < warm) ADD(r, PP_ACT_F, r, f++);
        while (f < m) {
            ADD(r, PP_ACT_F, r, f++);
            ADD(r, PP_ACT_B, r, b++);
        }
        while (b < m) ADD(r, PP_ACT_B, r, b++);
    }
    return PP_OK;
}

/* Breadth first: every forward of the rank's stages, earliest stage first;
 * then backwards, latest stage first, microbatches descending (torch's
 * ScheduleLoopedBFS). */
pp_status pp_gen_looped_bfs(pp_schedule *s) {
    int p = s->nranks, m = s->nmb, L = s->nstages / p;
    for (int r = 0; r < p; r++) {
        PP_TRY(pp_schedule_reserve(s, r, 2 * (size_t)m * (size_t)L));
        for (int k = 0; k < L; k++)
            for (int mb = 0; mb < m; mb++) ADD(r, PP_ACT_F, r + k * p, mb);
        for (int k = L - 1; k >= 0; k--)
            for (int mb = m - 1; mb >= 0; mb--) ADD(r, PP_ACT_B, r + k * p, mb);
    }
    return PP_OK;
}

/* Interleaved generators on loop placement: torch's Interleaved1F1B and
 * InterleavedZeroBubble (which is the paper's ZB-H1 with one stage per
 * rank), and the paper's ZB-H2. */
#include <stdlib.h>

#include "sched_internal.h"

#include "status_internal.h"
#define ADD(r, k, st, mb) PP_TRY(pp_sched_push(s, (r), pp_act((k), (st), (mb))))

typedef struct ilv {
    int p, r, L, mpr, warmup;
} ilv;

/* One rank of torch's _get_1f1b_rank_ops: warmup forwards, then F with B
 * (or I), then the cooldown backwards. With zb, each I at op index k with
 * k - warmup >= r is followed by the oldest pending W; the rest come at the
 * end. Microbatch counters run per stage. */
static pp_status rank_ops(pp_schedule *s, ilv *v, int factor, int zb, int *cnt) {
    int m = s->nmb, L = v->L, p = v->p, r = v->r;
    long total_mb = (long)m * L;
    long warm = (long)(L - 1) * v->mpr + (long)factor * (p - 1 - r);
    if (warm > total_mb) warm = total_mb;
    v->warmup = (int)warm;
    long fwd_bwd = total_mb - warm, total = total_mb + warm;
    int *fcnt = cnt, *bcnt = cnt + L, *wcnt = cnt + 2 * L;
    for (int k = 0; k < 3 * L; k++) cnt[k] = 0;
    pp_act_kind bk = zb ? PP_ACT_I : PP_ACT_B;
    long wdone = 0; /* backward ops whose W was emitted */
    /* Stage of op k, kept incrementally (no division per op): forwards go
     * round the local stages every mpr ops, backwards the other way. */
    int fl = 0, fi = 0, bl = L - 1, bi = 0;
    int wl = L - 1, wi = 0;
    PP_TRY(pp_schedule_reserve(s, r, (size_t)total_mb * (zb ? 3 : 2)));
    for (long op = 0; op < total; op++) {
        if (op < warm + fwd_bwd) {
            int st = fl * p + r;
            ADD(r, PP_ACT_F, st, fcnt[fl]++);
            if (++fi == v->mpr) fi = 0, fl = fl + 1 == L ? 0 : fl + 1;
        }
        if (op >= warm) {
            int st = bl * p + r;
            ADD(r, bk, st, bcnt[bl]++);
            if (++bi == v->mpr) bi = 0, bl = bl == 0 ? L - 1 : bl - 1;
            if (zb && op - warm >= r) {
                ADD(r, PP_ACT_W, wl * p + r, wcnt[wl]++);
                wdone++;
                if (++wi == v->mpr) wi = 0, wl = wl == 0 ? L - 1 : wl - 1;
            }
        }
    }
    while (zb && wdone < total_mb) {
        ADD(r, PP_ACT_W, wl * p + r, wcnt[wl]++);
        wdone++;
        if (++wi == v->mpr) wi = 0, wl = wl == 0 ? L - 1 : wl - 1;
    }
    return PP_OK;
}

static pp_status gen(pp_schedule *s, int factor, int zb, int check_rounds) {
    int p = s->nranks, m = s->nmb, L = s->nstages / p;
    int rounds = m / p > 1 ? m / p : 1;
    if (check_rounds && m % rounds != 0)
        return pp_error(PP_ERR_INVALID,
                        "%s needs the number of microbatches (%d) to be a multiple of the "
                        "number of rounds max(1, m / p) = %d",
                        zb ? "interleaved-zb" : "interleaved-1f1b", m, rounds);
    int *cnt = malloc(3 * (size_t)L * sizeof *cnt);
    if (!cnt) return pp_error(PP_ERR_NOMEM, "schedule generator: out of memory");
    pp_status st = PP_OK;
    for (int r = 0; r < p && st == PP_OK; r++) {
        ilv v = {p, r, L, m / rounds, 0};
        st = rank_ops(s, &v, factor, zb, cnt);
    }
    free(cnt);
    return st;
}

pp_status pp_gen_interleaved(pp_schedule *s, int zb) {
    /* Zero bubble warms up one forward per hop, 1F1B two. */
    return gen(s, zb ? 1 : 2, zb, 1);
}

/* ZB-H1: 1F1B's warmup and memory, the backward split into I and W, and
 * rank r's first r W deferred to fill the cooldown bubble: exactly
 * InterleavedZeroBubble with one stage per rank. */
pp_status pp_gen_zb_h1(pp_schedule *s) { return gen(s, 1, 1, 0); }

/* ZB-H2: 2(p-r)-1 forwards before the first I (2p-1 microbatches in flight
 * on rank 0), then I, W, F; the first 2r W deferred to the tail. With
 * F = I = W and free communication each rank is busy without a gap from
 * its first F to its last W. */
pp_status pp_gen_zb_h2(pp_schedule *s) {
    int p = s->nranks, m = s->nmb;
    for (int r = 0; r < p; r++) {
        PP_TRY(pp_schedule_reserve(s, r, 3 * (size_t)m));
        int warm = 2 * (p - r) - 1 < m ? 2 * (p - r) - 1 : m;
        int f = 0, i = 0, w = 0;
        while (f < warm) ADD(r, PP_ACT_F, r, f++);
        for (int k = 0; i < m; k++) {
            ADD(r, PP_ACT_I, r, i++);
            if (k >= 2 * r) ADD(r, PP_ACT_W, r, w++);
            if (f < m) ADD(r, PP_ACT_F, r, f++);
        }
        while (w < m) ADD(r, PP_ACT_W, r, w++);
    }
    return PP_OK;
}

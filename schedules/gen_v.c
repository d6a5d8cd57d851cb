/* V-placement generators (rank r holds stages r and 2p-1-r): torch's
 * ZBVZeroBubble and DualPipeV. */
#include <stdlib.h>

#include "sched_internal.h"

#include "status_internal.h"
/* Appends unless the microbatch is beyond m (ZBV generates for
 * max(2p-1, m) microbatches and drops the extra ones). */
static pp_status add_lt(pp_schedule *s, int r, pp_act_kind k, int st, int mb) {
    if (mb >= s->nmb) return PP_OK;
    return pp_sched_push(s, r, pp_act(k, st, mb));
}

#define ADDV(k, st, mb) PP_TRY(add_lt(s, r, (k), (st), (mb)))

pp_status pp_gen_zbv(pp_schedule *s) {
    int p = s->nranks, m = s->nmb;
    int n = m > 2 * p - 1 ? m : 2 * p - 1;
    for (int r = 0; r < p; r++) {
        PP_TRY(pp_schedule_reserve(s, r, 6 * (size_t)m));
        int c0 = r, c1 = 2 * p - 1 - r;
        int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
        for (int k = 0; k < 2 * (p - r) - 1; k++) ADDV(PP_ACT_F, c0, f0++);
        for (int k = 0; k < r; k++) {
            ADDV(PP_ACT_F, c1, f1++);
            ADDV(PP_ACT_F, c0, f0++);
        }
        for (int k = 0; k < p - r; k++) {
            ADDV(PP_ACT_F, c1, f1++);
            ADDV(PP_ACT_I, c1, b1);
            ADDV(PP_ACT_W, c1, b1++);
        }
        while (f1 < f0 || f0 < n) {
            if (f0 < n) ADDV(PP_ACT_F, c0, f0++);
            ADDV(PP_ACT_I, c0, b0);
            ADDV(PP_ACT_W, c0, b0++);
            ADDV(PP_ACT_F, c1, f1++);
            ADDV(PP_ACT_I, c1, b1);
            ADDV(PP_ACT_W, c1, b1++);
        }
        int w0 = b0, w1 = b1;
        for (int k = 0; k < r; k++) {
            ADDV(PP_ACT_I, c0, b0++);
            ADDV(PP_ACT_I, c1, b1++);
        }
        for (int k = 0; k < p - r; k++) {
            ADDV(PP_ACT_I, c0, b0++);
            ADDV(PP_ACT_W, c0, w0++);
        }
        while (w1 < b1) ADDV(PP_ACT_W, c1, w1++);
        while (w0 < b0) ADDV(PP_ACT_W, c0, w0++);
        if (w0 != f0 || w1 != f1)
            return pp_error(PP_ERR_INTERNAL, "zbv: rank %d: counts do not close (%d/%d, %d/%d)",
                            r, w0, f0, w1, f1);
    }
    return PP_OK;
}

/* DualPipeV state of one rank: per local stage (0: r, 1: 2p-1-r) the next
 * forward and backward microbatch, and the FIFO of W owed by I actions. */
typedef struct dpv {
    pp_schedule *s;
    int r;
    int st[2];
    int fcnt[2], icnt[2];
    int *wq; /* pairs (local stage, mb) */
    size_t wq_head, wq_tail;
} dpv;

static pp_status dpv_add(dpv *d, int loc, pp_act_kind k) {
    int st = d->st[loc];
    if (k == PP_ACT_F) return pp_sched_push(d->s, d->r, pp_act(k, st, d->fcnt[loc]++));
    int mb = d->icnt[loc]++;
    if (k == PP_ACT_I) {
        d->wq[2 * d->wq_tail] = loc;
        d->wq[2 * d->wq_tail + 1] = mb;
        d->wq_tail++;
    }
    return pp_sched_push(d->s, d->r, pp_act(k, st, mb));
}

static pp_status dpv_overlap(dpv *d, int floc, int bloc) {
    pp_action sub[2] = {pp_act(PP_ACT_F, d->st[floc], d->fcnt[floc]++),
                        pp_act(PP_ACT_B, d->st[bloc], d->icnt[bloc]++)};
    return pp_schedule_append_overlap(d->s, d->r, sub, 2);
}

static pp_status dpv_weight(dpv *d) {
    if (d->wq_head == d->wq_tail) return PP_OK; /* nothing pending */
    int loc = d->wq[2 * d->wq_head], mb = d->wq[2 * d->wq_head + 1];
    d->wq_head++;
    return pp_sched_push(d->s, d->r, pp_act(PP_ACT_W, d->st[loc], mb));
}

/* torch's ScheduleDualPipeV, itself DeepSeek's DualPipe folded into a V:
 * eight phases per rank, the middle ones overlapping a forward of one
 * stage with a full backward of the other. */
static pp_status dpv_rank(dpv *d, int p, int m) {
    int r = d->r;
    for (int k = 0; k < 2 * (p - r - 1); k++) PP_TRY(dpv_add(d, 0, PP_ACT_F));
    for (int k = 0; k < r + 1; k++) {
        PP_TRY(dpv_add(d, 0, PP_ACT_F));
        PP_TRY(dpv_add(d, 1, PP_ACT_F));
    }
    for (int k = 0; k < p - r - 1; k++) {
        PP_TRY(dpv_add(d, 1, PP_ACT_I));
        PP_TRY(dpv_weight(d));
        PP_TRY(dpv_add(d, 1, PP_ACT_F));
    }
    for (int k = 0; k < m - 2 * p + r + 1; k++) {
        if (k == 0 && r == p - 1) {
            /* The last rank does not overlap its first pair. */
            PP_TRY(dpv_add(d, 0, PP_ACT_F));
            PP_TRY(dpv_add(d, 1, PP_ACT_B));
        } else {
            PP_TRY(dpv_overlap(d, 0, 1));
        }
        PP_TRY(dpv_overlap(d, 1, 0));
    }
    for (int k = 0; k < p - r - 1; k++) {
        PP_TRY(dpv_add(d, 1, PP_ACT_B));
        PP_TRY(dpv_overlap(d, 1, 0));
    }
    int n6 = r + 1, zb = 0;
    for (int k = 0; k < n6; k++) {
        if (k == n6 / 2 && r % 2 == 1) zb = 1;
        PP_TRY(dpv_add(d, 1, zb ? PP_ACT_I : PP_ACT_B));
        if (k == n6 / 2 && r % 2 == 0) zb = 1;
        PP_TRY(dpv_add(d, 0, zb ? PP_ACT_I : PP_ACT_B));
    }
    for (int k = 0; k < p - r - 1; k++) {
        PP_TRY(dpv_weight(d));
        PP_TRY(dpv_add(d, 0, zb ? PP_ACT_I : PP_ACT_B));
    }
    for (int k = 0; k < r + 1; k++) PP_TRY(dpv_weight(d));
    return PP_OK;
}

pp_status pp_gen_dualpipev(pp_schedule *s) {
    int p = s->nranks, m = s->nmb;
    if (m < 2 * p)
        return pp_error(PP_ERR_INVALID,
                        "dualpipev needs at least as many microbatches as stages (%d "
                        "microbatches, %d stages)",
                        m, 2 * p);
    /* Per rank at most 2(m-2p+r+1) + (p-r-1) compounds of 2 actions. */
    PP_TRY(pp_sched_reserve_subs(s, 4 * (size_t)m * (size_t)p));
    dpv d = {0};
    d.s = s;
    d.wq = malloc(4 * (size_t)m * sizeof *d.wq);
    if (!d.wq) return pp_error(PP_ERR_NOMEM, "dualpipev: out of memory");
    pp_status st = PP_OK;
    for (int r = 0; r < p && st == PP_OK; r++) {
        d.r = r;
        d.st[0] = r;
        d.st[1] = 2 * p - 1 - r;
        d.fcnt[0] = d.fcnt[1] = d.icnt[0] = d.icnt[1] = 0;
        d.wq_head = d.wq_tail = 0;
        st = pp_schedule_reserve(s, r, 4 * (size_t)m);
        if (st == PP_OK) st = dpv_rank(&d, p, m);
    }
    free(d.wq);
    return st;
}

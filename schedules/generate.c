/* Schedule kinds by name, their constraints, and the generator dispatch. */
#include <ctype.h>
#include <strings.h>
#include <stdio.h>
#include <string.h>

#include "sched_internal.h"

#include "status_internal.h"
static const struct {
    const char *name;  /* CLI name */
    const char *torch; /* torch.distributed.pipelining class name, if any */
    int spr;           /* default stages per rank */
    int fixed_spr;     /* 1: only 1 stage per rank; 2: exactly 2; 0: any */
    pp_placement place;
} kinds[PP_SCHED_KIND_COUNT] = {
    [PP_SCHED_GPIPE] = {"gpipe", "GPipe", 1, 1, PP_PLACE_LOOP},
    [PP_SCHED_1F1B] = {"1f1b", "1F1B", 1, 1, PP_PLACE_LOOP},
    [PP_SCHED_INTERLEAVED_1F1B] = {"interleaved-1f1b", "Interleaved1F1B", 2, 0, PP_PLACE_LOOP},
    [PP_SCHED_LOOPED_BFS] = {"looped-bfs", "LoopedBFS", 2, 0, PP_PLACE_LOOP},
    [PP_SCHED_INTERLEAVED_ZB] = {"interleaved-zb", "InterleavedZeroBubble", 2, 0,
                                 PP_PLACE_LOOP},
    [PP_SCHED_ZBV] = {"zbv", "ZBVZeroBubble", 2, 2, PP_PLACE_V},
    [PP_SCHED_DUALPIPEV] = {"dualpipev", "DualPipeV", 2, 2, PP_PLACE_V},
    [PP_SCHED_ZB_H1] = {"zb-h1", "ZBH1", 1, 1, PP_PLACE_LOOP},
    [PP_SCHED_ZB_H2] = {"zb-h2", "ZBH2", 1, 1, PP_PLACE_LOOP},
    [PP_SCHED_AUTO] = {"auto", "ZB2P", 1, 1, PP_PLACE_LOOP},
};

/* Upper bound on the actions one generated schedule may hold (about 12 GiB). */
#define MAX_TOTAL_ACTIONS ((double)(1u << 30))

const char *pp_sched_kind_name(pp_sched_kind k) {
    if ((int)k < 0 || k >= PP_SCHED_KIND_COUNT) return "?";
    return kinds[k].name;
}

int pp_sched_default_stages_per_rank(pp_sched_kind k) {
    if ((int)k < 0 || k >= PP_SCHED_KIND_COUNT) return 1;
    return kinds[k].spr;
}

/* Lower case without '-', '_' and a leading "schedule". */
static void normalize(const char *in, char *out, size_t n) {
    size_t j = 0;
    if (strncasecmp(in, "schedule", 8) == 0 && in[8]) in += 8;
    for (; *in && j + 1 < n; in++)
        if (*in != '-' && *in != '_') out[j++] = (char)tolower((unsigned char)*in);
    out[j] = '\0';
}

pp_status pp_sched_kind_parse(const char *name, pp_sched_kind *out) {
    char want[64], have[64];
    normalize(name, want, sizeof want);
    for (int k = 0; k < PP_SCHED_KIND_COUNT; k++) {
        normalize(kinds[k].name, have, sizeof have);
        if (strcmp(want, have) == 0) goto found;
        normalize(kinds[k].torch, have, sizeof have);
        if (strcmp(want, have) == 0) goto found;
        continue;
    found:
        *out = (pp_sched_kind)k;
        return PP_OK;
    }
    return pp_error(PP_ERR_INVALID,
                    "unknown schedule kind '%s' (gpipe, 1f1b, interleaved-1f1b, looped-bfs, "
                    "interleaved-zb, zbv, dualpipev, zb-h1, zb-h2, auto)",
                    name);
}

void pp_sched_params_init(pp_sched_params *p, pp_sched_kind kind, int nranks, int nmb) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->nranks = nranks;
    p->nmb = nmb;
}

pp_status pp_schedule_generate(const pp_sched_params *pr, pp_schedule **out) {
    *out = NULL;
    if ((int)pr->kind < 0 || pr->kind >= PP_SCHED_KIND_COUNT)
        return pp_error(PP_ERR_INVALID, "schedule: unknown kind %d", (int)pr->kind);
    const char *name = kinds[pr->kind].name;
    int p = pr->nranks, m = pr->nmb;
    int L = pr->stages_per_rank ? pr->stages_per_rank : kinds[pr->kind].spr;
    if (p < 1 || p > PP_SCHED_MAX_RANKS)
        return pp_error(PP_ERR_INVALID, "%s: %d ranks (must be 1..%d)", name, p,
                        PP_SCHED_MAX_RANKS);
    if (m < 1 || m > PP_SCHED_MAX_MB)
        return pp_error(PP_ERR_INVALID, "%s: %d microbatches (must be 1..%d)", name, m,
                        PP_SCHED_MAX_MB);
    if (L < 1 || (double)L * p > PP_SCHED_MAX_STAGES)
        return pp_error(PP_ERR_INVALID, "%s: %d stages per rank over %d ranks is out of range",
                        name, L, p);
    if (kinds[pr->kind].fixed_spr == 1 && L != 1)
        return pp_error(PP_ERR_INVALID,
                        "%s runs one stage per rank (%d asked); use looped-bfs, "
                        "interleaved-1f1b or interleaved-zb for more",
                        name, L);
    if (kinds[pr->kind].fixed_spr == 2 && L != 2)
        return pp_error(PP_ERR_INVALID, "%s requires exactly 2 stages per rank, but got %d",
                        name, L);
    if (3.0 * L * (double)m * p > MAX_TOTAL_ACTIONS)
        return pp_error(PP_ERR_NOMEM, "%s: %d ranks x %d stages x %d microbatches is too large",
                        name, p, L, m);
    pp_schedule *s;
    PP_TRY(pp_schedule_new(p, L * p, m, &s));
    snprintf(s->name, sizeof s->name, "%s", name);
    pp_status st = pp_schedule_place(s, kinds[pr->kind].place);
    if (st == PP_OK) switch (pr->kind) {
        case PP_SCHED_GPIPE: st = pp_gen_gpipe(s); break;
        case PP_SCHED_1F1B: st = pp_gen_1f1b(s); break;
        case PP_SCHED_LOOPED_BFS: st = pp_gen_looped_bfs(s); break;
        case PP_SCHED_INTERLEAVED_1F1B: st = pp_gen_interleaved(s, 0); break;
        case PP_SCHED_INTERLEAVED_ZB: st = pp_gen_interleaved(s, 1); break;
        case PP_SCHED_ZBV: st = pp_gen_zbv(s); break;
        case PP_SCHED_DUALPIPEV: st = pp_gen_dualpipev(s); break;
        case PP_SCHED_ZB_H1: st = pp_gen_zb_h1(s); break;
        case PP_SCHED_ZB_H2: st = pp_gen_zb_h2(s); break;
        case PP_SCHED_AUTO: st = pp_gen_auto(s, pr); break;
        default: st = pp_error(PP_ERR_INTERNAL, "schedule kind %d", (int)pr->kind);
        }
    if (st != PP_OK) {
        pp_schedule_free(s);
        return st;
    }
    *out = s;
    return PP_OK;
}

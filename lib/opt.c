/* The optimizer's pass manager (pippin/optimize.h): the pass table, the
 * order passes run in, the report, and the process-wide default
 * (PIPPIN_OPTIMIZE, pp_optimize_set_default). */
#include "pippin/optimize.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "log_internal.h"
#include "opt_internal.h"

#include "status_internal.h"

typedef struct {
    const char *name;
    unsigned bit;
    pp_status (*run)(pp_opt_ctx *c, int *count);
} pass_entry;

/* In the order they run: folding first (fusions then see constants), the
 * fusions before dead-node removal (which sweeps what they left). */
static const pass_entry passes_table[] = {
    {"fold", PP_OPT_FOLD, pp_opt_fold},
    {"identity", PP_OPT_IDENTITY, pp_opt_identity},
    {"layernorm", PP_OPT_LAYERNORM, pp_opt_layernorm},
    {"gelu", PP_OPT_GELU, pp_opt_gelu},
    {"attention", PP_OPT_ATTENTION, pp_opt_attention},
    {"transpose", PP_OPT_TRANSPOSE, pp_opt_transpose},
    {"matmul", PP_OPT_MATMUL, pp_opt_matmul},
    {"dead", PP_OPT_DEAD, pp_opt_dead},
    {"inplace", PP_OPT_INPLACE, NULL}, /* the executor's (lib/inplace.c), no rewrite */
    {"pack", PP_OPT_PACK, NULL},       /* training executors' packed weights (lib/pack_cache.c), no rewrite */
};
#define N_PASSES ((int)(sizeof passes_table / sizeof passes_table[0]))

const char *pp_optimize_pass_name(int i) {
    for (int k = 0; k < N_PASSES; k++)
        if (passes_table[k].bit == 1u << i) return passes_table[k].name;
    return NULL;
}

pp_status pp_optimize_parse(const char *text, unsigned *passes) {
    *passes = 0;
    if (!text) return PP_OK;
    if (!strcmp(text, "0") || !strcmp(text, "off") || !strcmp(text, "none") || !text[0]) return PP_OK;
    if (!strcmp(text, "1") || !strcmp(text, "on") || !strcmp(text, "all")) {
        *passes = PP_OPT_ALL;
        return PP_OK;
    }
    const char *p = text;
    while (*p) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (int k = 0; k < N_PASSES; k++)
            if (strlen(passes_table[k].name) == len && strncmp(p, passes_table[k].name, len) == 0) {
                *passes |= passes_table[k].bit;
                found = 1;
            }
        if (!found && len)
            return pp_error(PP_ERR_INVALID, "optimizer: unknown pass '%.*s' in \"%s\" (passes: fold, identity, "
                            "layernorm, gelu, attention, transpose, matmul, dead, inplace, pack; or all, none)", (int)len, p, text);
        p += len;
        if (*p == ',') p++;
    }
    return PP_OK;
}

/* -1: not set by pp_optimize_set_default (the environment decides). */
static atomic_int default_override = -1;

unsigned pp_optimize_default(void) {
    int o = atomic_load(&default_override);
    if (o >= 0) return (unsigned)o;
    const char *env = getenv("PIPPIN_OPTIMIZE");
    /* pack only when asked: a second copy of every Linear weight for a
     * gain the step time has not shown (docs/architecture.md) */
    if (!env) return PP_OPT_ALL & ~PP_OPT_PACK;
    unsigned bits;
    if (pp_optimize_parse(env, &bits) != PP_OK) {
        pp_warn("PIPPIN_OPTIMIZE=%s: not a pass list; every pass runs", env);
        return PP_OPT_ALL;
    }
    return bits;
}

void pp_optimize_set_default(unsigned passes) { atomic_store(&default_override, (int)(passes & PP_OPT_ALL)); }

static pp_status optimize(pp_graph *g, unsigned passes, int training, pp_optimize_report *report) {
    pp_optimize_report local;
    pp_optimize_report *r = report ? report : &local;
    memset(r, 0, sizeof *r);
    r->nodes_before = r->nodes_after = g->n_nodes;
    if (!(passes & PP_OPT_ALL)) return PP_OK;
    PP_TRY(pp_graph_resolve(g));
    pp_opt_ctx c;
    PP_TRY(pp_opt_ctx_init(&c, g));
    c.training = training;
    pp_status s = PP_OK;
    for (int k = 0; k < N_PASSES && s == PP_OK; k++) {
        if (!(passes & passes_table[k].bit) || !passes_table[k].run) continue;
        int count = 0;
        s = passes_table[k].run(&c, &count);
        if (s == PP_OK) s = pp_opt_compact(&c, passes_table[k].name);
        if (s != PP_OK) {
            s = pp_error_context(s, "optimizer pass '%s' on graph '%s'", passes_table[k].name,
                                 g->source ? g->source : (g->name ? g->name : ""));
            break;
        }
        if (r->n_passes < PP_OPT_MAX_PASSES) {
            r->pass[r->n_passes] = passes_table[k].name;
            r->rewrites[r->n_passes++] = count;
        }
    }
    pp_opt_ctx_clear(&c);
    if (s == PP_OK) s = pp_graph_resolve(g); /* the rewritten nodes' ops and attributes */
    r->nodes_after = g->n_nodes;
    if (s == PP_OK)
        pp_debug("optimizer: graph '%s': %d nodes -> %d", g->name ? g->name : "", r->nodes_before, r->nodes_after);
    return s;
}

pp_status pp_graph_optimize(pp_graph *g, unsigned passes, pp_optimize_report *report) {
    return optimize(g, passes, 0, report);
}

pp_status pp_graph_optimize_for_training(pp_graph *g, pp_optimize_report *report) {
    return optimize(g, pp_optimize_default() & PP_OPT_TRAINING, 1, report);
}

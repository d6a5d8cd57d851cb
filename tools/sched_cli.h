/* Schedule selection shared by `pippin schedule` and `pippin simulate`:
 * option parsing and building the (validated) schedule (sched_cli.c). */
#ifndef PIPPIN_TOOLS_SCHED_CLI_H
#define PIPPIN_TOOLS_SCHED_CLI_H

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "pippin/sched_sim.h"
#include "pippin/sched_trace.h"
#include "pippin/schedule.h"

typedef struct sched_opts {
    const char *cmd;
    const char *kind;
    int ranks, mb, spr; /* 0 when not given */
    int comms, merge_bw;
    const char *cost;
    int recompute;                /* --recompute: every stage */
    const char *recompute_stages; /* --recompute-stages 0,2 */
    double mem_cap, w_frac;
    pp_sched_objective objective;
    /* schedule */
    const char *format;
    /* simulate */
    int json;
    const char *trace, *svg;
} sched_opts;

enum {
    OPT_KIND = 256,
    OPT_RANKS,
    OPT_MB,
    OPT_SPR,
    OPT_COMMS,
    OPT_MERGE,
    OPT_FORMAT,
    OPT_COST,
    OPT_MEMCAP,
    OPT_WFRAC,
    OPT_OBJECTIVE,
    OPT_JSON,
    OPT_TRACE,
    OPT_SVG,
    OPT_RECOMPUTE,
    OPT_RECOMPUTE_STAGES,
    OPT_HELP
};

int sched_usage_error(const char *cmd, const char *fmt, const char *a, const char *b);
/* 0 ok; otherwise the exit code (2 usage, after printing why). */
int sched_parse_args(int argc, char **argv, sched_opts *o, void (*usage)(FILE *));
/* Builds the schedule (and cost model) the options describe. */
int sched_build(sched_opts *o, pp_schedule **out, pp_cost_model **costs);

#endif

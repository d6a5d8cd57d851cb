/* Schedule selection shared by `pippin schedule` and `pippin simulate`. */
#include "sched_cli.h"

static const struct option sched_long_opts[] = {
    {"kind", required_argument, NULL, OPT_KIND},
    {"ranks", required_argument, NULL, OPT_RANKS},
    {"microbatches", required_argument, NULL, OPT_MB},
    {"stages-per-rank", required_argument, NULL, OPT_SPR},
    {"comms", no_argument, NULL, OPT_COMMS},
    {"merge-bw", no_argument, NULL, OPT_MERGE},
    {"format", required_argument, NULL, OPT_FORMAT},
    {"cost", required_argument, NULL, OPT_COST},
    {"mem-cap", required_argument, NULL, OPT_MEMCAP},
    {"w-frac", required_argument, NULL, OPT_WFRAC},
    {"objective", required_argument, NULL, OPT_OBJECTIVE},
    {"json", no_argument, NULL, OPT_JSON},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"svg", required_argument, NULL, OPT_SVG},
    {"recompute", no_argument, NULL, OPT_RECOMPUTE},
    {"recompute-stages", required_argument, NULL, OPT_RECOMPUTE_STAGES},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

int sched_usage_error(const char *cmd, const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "pippin %s: ", cmd);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(run 'pippin %s --help' for usage)\n", cmd);
    return 2;
}

static int sched_int_arg(const char *cmd, const char *flag, const char *v, int lo, int hi,
                         int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        char range[64];
        snprintf(range, sizeof range, "an integer from %d to %d", lo, hi);
        fprintf(stderr, "pippin %s: %s: '%s' is not %s\n", cmd, flag, v, range);
        return 2;
    }
    *out = (int)x;
    return 0;
}

static int sched_num_arg(const char *cmd, const char *flag, const char *v, double lo, double hi,
                         double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "pippin %s: %s: '%s' is not a number from %g to %g\n", cmd, flag, v, lo,
                hi);
        return 2;
    }
    *out = x;
    return 0;
}

/* Parses argv into o. Returns -1 to go on, or an exit code (0 after
 * --help, 2 on a usage error). `usage` prints the command's help. */
int sched_parse_args(int argc, char **argv, sched_opts *o, void (*usage)(FILE *)) {
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", sched_long_opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case OPT_KIND: o->kind = optarg; break;
        case OPT_RANKS: rc = sched_int_arg(o->cmd, "--ranks", optarg, 1, PP_SCHED_MAX_RANKS, &o->ranks); break;
        case OPT_MB: rc = sched_int_arg(o->cmd, "--microbatches", optarg, 1, PP_SCHED_MAX_MB, &o->mb); break;
        case OPT_SPR: rc = sched_int_arg(o->cmd, "--stages-per-rank", optarg, 1, 4096, &o->spr); break;
        case OPT_COMMS: o->comms = 1; break;
        case OPT_MERGE: o->merge_bw = 1; break;
        case OPT_FORMAT: o->format = optarg; break;
        case OPT_COST: o->cost = optarg; break;
        case OPT_MEMCAP: rc = sched_num_arg(o->cmd, "--mem-cap", optarg, 1, 1e9, &o->mem_cap); break;
        case OPT_WFRAC: rc = sched_num_arg(o->cmd, "--w-frac", optarg, 0, 1, &o->w_frac); break;
        case OPT_OBJECTIVE:
            if (strcmp(optarg, "makespan") == 0)
                o->objective = PP_OBJ_MAKESPAN;
            else if (strcmp(optarg, "span") == 0)
                o->objective = PP_OBJ_SPAN;
            else
                rc = sched_usage_error(o->cmd, "--objective: '%s' is not makespan or span%s",
                                       optarg, "");
            break;
        case OPT_JSON: o->json = 1; break;
        case OPT_TRACE: o->trace = optarg; break;
        case OPT_SVG: o->svg = optarg; break;
        case OPT_RECOMPUTE: o->recompute = 1; break;
        case OPT_RECOMPUTE_STAGES:
            if (o->recompute_stages)
                return sched_usage_error(o->cmd, "--recompute-stages given twice; list every "
                                                 "stage once (0,2)%s%s", "", "");
            o->recompute_stages = optarg;
            break;
        case 'h':
        case OPT_HELP: usage(stdout); return 0;
        case ':':
            return sched_usage_error(o->cmd, "%s needs a value%s", argv[optind - 1], "");
        default:
            return sched_usage_error(o->cmd, "unknown option '%s'%s", argv[optind - 1], "");
        }
        if (rc) return rc;
    }
    if (optind < argc)
        return sched_usage_error(o->cmd, "unexpected argument '%s'%s", argv[optind], "");
    if (!o->kind) return sched_usage_error(o->cmd, "--kind is required%s%s", "", "");
    if (o->recompute && o->recompute_stages)
        return sched_usage_error(o->cmd, "--recompute (every stage) and --recompute-stages "
                                         "(some) exclude each other%s%s", "", "");
    return -1;
}

/* Marks the stages --recompute / --recompute-stages name in *costs (made
 * with the default costs when --cost was not given). Returns 0, or 2
 * after printing what is wrong with the list. */
static int apply_recompute(const sched_opts *o, int nstages, pp_cost_model **costs) {
    if (!o->recompute && !o->recompute_stages) return 0;
    if (!*costs && pp_cost_model_new(nstages, costs) != PP_OK) return pp_cli_fail(o->cmd);
    if (o->recompute) {
        memset((*costs)->recompute, 1, (size_t)nstages);
        return 0;
    }
    const char *p = o->recompute_stages;
    unsigned char *seen = calloc((size_t)nstages, 1);
    if (!seen) return pp_cli_fail(o->cmd);
    int rc = 0;
    do {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        char num[32];
        snprintf(num, sizeof num, "%ld", v);
        if (end == p || errno || (*end && *end != ',') || v < 0 || *p == '-' || *p == '+') {
            rc = sched_usage_error(o->cmd, "--recompute-stages '%s': expected stage indices "
                                           "separated by commas (0,2)%s", o->recompute_stages, "");
        } else if (v >= nstages) {
            char have[32];
            snprintf(have, sizeof have, "%d", nstages);
            fprintf(stderr, "pippin %s: --recompute-stages '%s': stage %s, but the schedule has "
                            "%s stages\n", o->cmd, o->recompute_stages, num, have);
            rc = 2;
        } else if (seen[v]) {
            fprintf(stderr, "pippin %s: --recompute-stages '%s': stage %s is listed twice\n",
                    o->cmd, o->recompute_stages, num);
            rc = 2;
        } else {
            seen[v] = 1;
            (*costs)->recompute[v] = 1;
        }
        p = *end ? end + 1 : end;
        if (!rc && *end == ',' && !*p)
            rc = sched_usage_error(o->cmd, "--recompute-stages '%s': ends with a comma%s",
                                   o->recompute_stages, "");
    } while (!rc && *p);
    free(seen);
    return rc;
}

/* Builds the schedule the options select, lowered as asked and validated.
 * Returns 0, or the exit code after printing the error. */
int sched_build(sched_opts *o, pp_schedule **out, pp_cost_model **costs) {
    *out = NULL;
    *costs = NULL;
    pp_schedule *s = NULL;
    const char *cmd = o->cmd;
    int is_csv = strncmp(o->kind, "csv:", 4) == 0;
    if (is_csv) {
        if (pp_schedule_load_csv(o->kind + 4, &s) != PP_OK) return pp_cli_fail(cmd);
        char have[32], want[32];
        if (o->ranks && o->ranks != s->nranks) {
            snprintf(have, sizeof have, "%d", o->ranks);
            snprintf(want, sizeof want, "%d", s->nranks);
            pp_schedule_free(s);
            return sched_usage_error(cmd, "--ranks %s, but the CSV file has %s rows", have, want);
        }
        if (o->mb && o->mb != s->nmb) {
            if (o->mb > s->nmb) {
                s->nmb = o->mb; /* validation will report the missing ones */
            } else {
                snprintf(have, sizeof have, "%d", o->mb);
                snprintf(want, sizeof want, "%d", s->nmb);
                pp_schedule_free(s);
                return sched_usage_error(cmd, "--microbatches %s, but the CSV file uses %s", have,
                                         want);
            }
        }
        if (o->spr && s->nstages != o->spr * s->nranks) {
            pp_schedule_free(s);
            return sched_usage_error(cmd, "--stages-per-rank does not match the CSV file%s%s",
                                     "", "");
        }
    } else {
        pp_sched_params pr = {0};
        if (pp_sched_kind_parse(o->kind, &pr.kind) != PP_OK)
            return sched_usage_error(cmd, "--kind: %s%s", pp_last_error(), "");
        if (!o->ranks) return sched_usage_error(cmd, "--ranks is required%s%s", "", "");
        if (!o->mb) return sched_usage_error(cmd, "--microbatches is required%s%s", "", "");
        pr.nranks = o->ranks;
        pr.nmb = o->mb;
        pr.stages_per_rank = o->spr;
        pr.mem_cap = o->mem_cap;
        pr.w_frac = o->w_frac;
        pr.objective = o->objective;
        int spr = o->spr ? o->spr : pp_sched_default_stages_per_rank(pr.kind);
        if (o->cost) {
            if (pp_cost_model_parse(o->cost, spr * o->ranks, costs) != PP_OK)
                return sched_usage_error(cmd, "--cost: %s%s", pp_last_error(), "");
        }
        int rrc = apply_recompute(o, spr * o->ranks, costs);
        if (rrc) {
            pp_cost_model_free(*costs);
            *costs = NULL;
            return rrc;
        }
        pr.costs = *costs;
        pp_status st = pp_schedule_generate(&pr, &s);
        if (st != PP_OK) {
            pp_cost_model_free(*costs);
            *costs = NULL;
            if (st == PP_ERR_INVALID)
                return sched_usage_error(cmd, "%s%s", pp_last_error(), "");
            return pp_cli_fail(cmd);
        }
    }
    if (is_csv && o->cost && pp_cost_model_parse(o->cost, s->nstages, costs) != PP_OK) {
        pp_schedule_free(s);
        return sched_usage_error(cmd, "--cost: %s%s", pp_last_error(), "");
    }
    if (is_csv) {
        int rrc = apply_recompute(o, s->nstages, costs);
        if (rrc) {
            pp_schedule_free(s);
            pp_cost_model_free(*costs);
            *costs = NULL;
            return rrc;
        }
    }
    if (o->comms || o->merge_bw) {
        unsigned flags = (o->merge_bw ? PP_LOWER_MERGE_BW : 0) |
                         (o->comms ? PP_LOWER_COMMS | PP_LOWER_REDUCE_GRAD : 0);
        pp_schedule *l;
        if (pp_schedule_lower(s, flags, &l) != PP_OK) {
            pp_schedule_free(s);
            pp_cost_model_free(*costs);
            *costs = NULL;
            return pp_cli_fail(cmd);
        }
        pp_schedule_free(s);
        s = l;
    }
    char *table = NULL;
    if (pp_schedule_validate(s, &table) != PP_OK) {
        fprintf(stderr, "pippin %s: invalid schedule: %s\n", cmd, pp_last_error());
        if (table) fprintf(stderr, "\nFull pipeline schedule:\n%s", table);
        free(table);
        pp_schedule_free(s);
        pp_cost_model_free(*costs);
        *costs = NULL;
        return 1;
    }
    *out = s;
    return 0;
}

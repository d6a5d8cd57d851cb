/* pippin schedule: print a pipeline schedule's per-rank action lists as a
 * table, CSV or JSON. */
#include "sched_cli.h"

#include "status_internal.h"
static void usage(FILE *f) {
    fprintf(f,
            "usage: pippin schedule --kind K --ranks P --microbatches M [--stages-per-rank V]\n"
            "                       [--comms] [--merge-bw] [--format table|csv|json]\n"
            "                       [--cost F=1,I=1,W=1,c=0] [--mem-cap N] [--w-frac X]\n"
            "                       [--objective makespan|span]\n"
            "                       [--recompute | --recompute-stages S,S...]\n"
            "\n"
            "kinds: gpipe, 1f1b, interleaved-1f1b, looped-bfs, interleaved-zb, zbv,\n"
            "       dualpipev, zb-h1, zb-h2, auto, csv:FILE (a schedule saved as CSV)\n"
            "  --comms       add SEND/RECV between ranks and REDUCE_GRAD (lowered form)\n"
            "  --merge-bw    merge an I directly followed by its W into one B\n"
            "  --format      table (default; steps down, ranks across), csv (one row per\n"
            "                rank, torch's format) or json ({\"orders\": [[...], ...]})\n"
            "  --cost, --mem-cap, --w-frac, --objective: inputs of the auto scheduler\n"
            "                (costs per stage, activations in flight per rank, default 2P)\n"
            "  --recompute, --recompute-stages S,S: the auto scheduler's I costs F more on\n"
            "                those stages (see pippin simulate --help)\n"
            "The schedule is validated before it is printed.\n");
}

/* {"orders": [[...], ...]} as json-c's plain form, written as it goes:
 * action texts need no escaping, and a json-c tree of a large schedule
 * took several times the schedule's memory. */
static int print_json(const pp_schedule *s, FILE *f) {
    char buf[PP_ACTION_STR_MAX];
    int bad = fputs("{\"orders\":[", f) == EOF;
    for (int r = 0; r < s->nranks && !bad; r++) {
        bad = fputs(r ? ",[" : "[", f) == EOF;
        int first = 1;
        for (size_t k = 0; k < s->len[r] && !bad; k++) {
            if (s->acts[r][k].kind == PP_ACT_IDLE) continue;
            pp_action_format(s, &s->acts[r][k], buf, sizeof buf);
            bad = fputs(first ? "\"" : ",\"", f) == EOF || fputs(buf, f) == EOF ||
                  fputc('"', f) == EOF;
            first = 0;
        }
        bad = bad || fputc(']', f) == EOF;
    }
    return bad || fputs("]}\n", f) == EOF;
}

int cmd_schedule(int argc, char **argv) {
    sched_opts o = {0};
    o.cmd = "schedule";
    o.format = "table";
    int rc = sched_parse_args(argc, argv, &o, usage);
    if (rc >= 0) return rc;
    if (strcmp(o.format, "table") && strcmp(o.format, "csv") && strcmp(o.format, "json"))
        return sched_usage_error(o.cmd, "--format: '%s' is not table, csv or json%s", o.format,
                                 "");
    pp_schedule *s;
    pp_cost_model *costs;
    rc = sched_build(&o, &s, &costs);
    if (rc) return rc;
    pp_status st = PP_OK;
    if (!strcmp(o.format, "csv")) {
        st = pp_schedule_write_csv(s, stdout);
    } else if (!strcmp(o.format, "json")) {
        if (print_json(s, stdout)) st = pp_error(PP_ERR_IO, "writing to stdout failed");
    } else {
        st = pp_schedule_write_table(s, stdout);
    }
    pp_schedule_free(s);
    pp_cost_model_free(costs);
    if (st == PP_OK && fflush(stdout) != 0) st = pp_error(PP_ERR_IO, "writing to stdout failed");
    return st == PP_OK ? 0 : pp_cli_fail(o.cmd);
}

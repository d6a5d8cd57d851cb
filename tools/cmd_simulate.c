/* pippin simulate: run a schedule against a cost model and report makespan,
 * bubble and peak activation memory; optionally draw the timeline. */
#include <json-c/json.h>
#include <math.h>

#include "sched_cli.h"

#include "status_internal.h"
static void usage(FILE *f) {
    fprintf(f,
            "usage: pippin simulate --kind K --ranks P --microbatches M [--stages-per-rank V]\n"
            "                       [--cost F=1,I=1,W=1,c=0] [--comms] [--merge-bw]\n"
            "                       [--json] [--trace FILE.json] [--svg FILE.svg]\n"
            "                       [--mem-cap N] [--w-frac X] [--objective makespan|span]\n"
            "                       [--recompute | --recompute-stages S,S...]\n"
            "\n"
            "kinds as for 'pippin schedule' (including csv:FILE).\n"
            "--cost keys (a value, or one per stage separated by ':' as in F=1:2:1:1):\n"
            "  F, I, W   forward, backward-input, backward-weight time (B = I + W)\n"
            "  B         full backward time (split evenly unless I or W is given)\n"
            "  c         link latency per transfer; bw bandwidth in bytes per time unit\n"
            "  bytes     bytes per microbatch sent from each stage to the next\n"
            "  mem, wmem bytes stashed per microbatch from F to I, and from I to W\n"
            "  rc        1 where the stage recomputes (as --recompute-stages)\n"
            "  in        a recomputing stage's input bytes per microbatch (default: the\n"
            "            previous stage's bytes, 0 for stage 0)\n"
            "--recompute (every stage) or --recompute-stages 0,2 (those stages) models\n"
            "activation recomputation as `pippin train --recompute` runs it: I (or B)\n"
            "costs F more, and from F to I/B the stage keeps only its input bytes\n"
            "(in) instead of mem; while I/B runs it holds mem again.\n"
            "Reports makespan, per-rank busy time, bubble (1 - busy/makespan) and peak\n"
            "activations in flight (F done, I/B not yet). --trace writes Chrome trace\n"
            "JSON (open in https://ui.perfetto.dev), --svg a picture.\n");
}

/* JSON has no NaN or infinity (json-c would write NaN, Infinity): null,
 * e.g. when costs near DBL_MAX overflow a sum. */
static json_object *dnum(double v) { return isfinite(v) ? json_object_new_double(v) : NULL; }

static json_object *darr(const double *v, int n) {
    json_object *a = json_object_new_array();
    for (int k = 0; k < n; k++) json_object_array_add(a, dnum(v[k]));
    return a;
}

static json_object *iarr(const int *v, int n) {
    json_object *a = json_object_new_array();
    for (int k = 0; k < n; k++) json_object_array_add(a, json_object_new_int(v[k]));
    return a;
}

static int has_bytes(const pp_cost_model *c) {
    if (!c) return 0;
    for (int k = 0; k < c->nstages; k++)
        if (pp_cost_model_stash(c, k) > 0 || c->wstash_bytes[k] > 0 ||
            pp_cost_model_recompute_extra(c, k) > 0)
            return 1;
    return 0;
}

static int any_recompute(const pp_cost_model *c) {
    for (int k = 0; c && k < c->nstages; k++)
        if (c->recompute[k]) return 1;
    return 0;
}

static void print_json(const pp_sim_result *r, int bytes, const pp_cost_model *c) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "makespan", dnum(r->makespan));
    json_object_object_add(o, "bubble", darr(r->bubble, r->nranks));
    json_object_object_add(o, "peak_activations", iarr(r->peak_act, r->nranks));
    json_object_object_add(o, "busy", darr(r->busy, r->nranks));
    json_object_object_add(o, "span", dnum(pp_sim_result_span(r)));
    json_object_object_add(o, "peak_pending_w", iarr(r->peak_wpend, r->nranks));
    if (bytes) json_object_object_add(o, "peak_bytes", darr(r->peak_bytes, r->nranks));
    if (any_recompute(c)) {
        json_object *a = json_object_new_array();
        for (int k = 0; k < c->nstages; k++)
            if (c->recompute[k]) json_object_array_add(a, json_object_new_int(k));
        json_object_object_add(o, "recompute_stages", a);
    }
    puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
}

static void print_text(const pp_schedule *s, const pp_sim_result *r, int bytes,
                       const pp_cost_model *c) {
    double mean = 0;
    for (int k = 0; k < r->nranks; k++) mean += r->bubble[k];
    mean /= r->nranks;
    printf("schedule %s: %d ranks, %d stages, %d microbatches, %zu actions\n", s->name,
           s->nranks, s->nstages, s->nmb, pp_schedule_count(s));
    printf("makespan %g, mean bubble %.4f, longest rank span %g\n", r->makespan, mean,
           pp_sim_result_span(r));
    if (any_recompute(c)) {
        printf("recompute: stage");
        for (int k = 0; k < c->nstages; k++)
            if (c->recompute[k]) printf(" %d", k);
        printf(" (I/B runs F again; F to I/B keeps the inputs)\n");
    }
    printf("%-6s %12s %8s %9s %10s%s\n", "rank", "busy", "bubble", "peak_act", "pending_w",
           bytes ? "   peak_bytes" : "");
    for (int k = 0; k < r->nranks; k++) {
        printf("%-6d %12g %8.4f %9d %10d", k, r->busy[k], r->bubble[k], r->peak_act[k],
               r->peak_wpend[k]);
        if (bytes) printf(" %12g", r->peak_bytes[k]);
        printf("\n");
    }
}

int cmd_simulate(int argc, char **argv) {
    sched_opts o = {0};
    o.cmd = "simulate";
    int rc = sched_parse_args(argc, argv, &o, usage);
    if (rc >= 0) return rc;
    if (o.format) return sched_usage_error(o.cmd, "--format is for 'pippin schedule'%s%s", "", "");
    pp_schedule *s;
    pp_cost_model *costs;
    rc = sched_build(&o, &s, &costs);
    if (rc) return rc;
    pp_trace *trace = NULL;
    pp_sim_result *r = NULL;
    pp_status st = PP_OK;
    if (o.trace || o.svg) st = pp_trace_new(s->nranks, &trace);
    if (st == PP_OK) st = pp_simulate(s, costs, trace, &r);
    if (st == PP_OK && o.trace) st = pp_trace_save_chrome(trace, o.trace, 1.0);
    if (st == PP_OK && o.svg) {
        char title[160];
        snprintf(title, sizeof title, "%s: %d ranks, %d microbatches, makespan %g", s->name,
                 s->nranks, s->nmb, r->makespan);
        st = pp_trace_save_svg(trace, o.svg, title);
    }
    if (st == PP_OK) {
        if (o.json)
            print_json(r, has_bytes(costs), costs);
        else
            print_text(s, r, has_bytes(costs), costs);
        if (fflush(stdout) != 0) st = pp_error(PP_ERR_IO, "writing to stdout failed");
    }
    pp_sim_result_free(r);
    pp_trace_free(trace);
    pp_schedule_free(s);
    pp_cost_model_free(costs);
    return st == PP_OK ? 0 : pp_cli_fail(o.cmd);
}

/* libFuzzer target: schedule CSV and action text. Parses the input as a
 * CSV schedule; a schedule that parses is formatted, written back and
 * re-read (the same actions must come back), validated, lowered and, when
 * valid, simulated with a timeline. Any crash, leak or sanitizer report is
 * a bug. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/log.h"
#include "pippin/sched_sim.h"
#include "pippin/sched_trace.h"
#include "pippin/schedule.h"

/* Bounds that keep one input fast (the engine is linear in the schedule). */
#define MAX_INPUT 65536

static void roundtrip(const pp_schedule *s) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return;
    pp_status st = pp_schedule_write_csv(s, f);
    fclose(f);
    if (st == PP_OK) {
        /* Empty trailing rows (ranks with nothing but idle steps) do not
         * survive the format; everything else must. */
        pp_schedule *t = NULL;
        if (pp_schedule_parse_csv(text, len, "roundtrip", &t) != PP_OK) {
            if (pp_schedule_count(s) != 0) abort();
            free(text);
            return;
        }
        if (pp_schedule_count(t) != pp_schedule_count(s)) abort();
        for (int r = 0; r < s->nranks && r < t->nranks; r++) {
            size_t n = s->len[r] < t->len[r] ? s->len[r] : t->len[r];
            for (size_t k = 0; k < n; k++) {
                char a[PP_ACTION_STR_MAX], b[PP_ACTION_STR_MAX];
                pp_action_format(s, &s->acts[r][k], a, sizeof a);
                pp_action_format(t, &t->acts[r][k], b, sizeof b);
                if (strcmp(a, b) != 0) abort();
            }
        }
        pp_schedule_free(t);
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pp_log_set_level(PP_LOG_OFF);
    if (size > MAX_INPUT) return 0;
    /* Also the single-action parser on the whole input. */
    pp_action a, sub[PP_OVERLAP_MAX];
    int nsub;
    if (pp_action_parse((const char *)data, size, &a, sub, &nsub) == PP_OK &&
        a.kind != PP_ACT_OVERLAP_F_B) {
        char buf[PP_ACTION_STR_MAX];
        pp_action_format(NULL, &a, buf, sizeof buf);
    }
    pp_schedule *s = NULL;
    if (pp_schedule_parse_csv((const char *)data, size, "fuzz.csv", &s) != PP_OK) return 0;
    roundtrip(s);
    char *table = NULL;
    if (s->nranks <= 64 && pp_schedule_format_table(s, 0, &table) == PP_OK) free(table);
    table = NULL;
    pp_status st = pp_schedule_validate(s, &table);
    free(table);
    pp_schedule *l = NULL;
    if (pp_schedule_lower(s, PP_LOWER_COMMS | PP_LOWER_MERGE_BW | PP_LOWER_REDUCE_GRAD, &l) ==
        PP_OK) {
        if (st == PP_OK && pp_schedule_validate(l, NULL) != PP_OK) abort(); /* lowering keeps validity */
        pp_schedule_free(l);
    }
    if (st == PP_OK) {
        pp_cost_model *c = NULL;
        pp_trace *t = NULL;
        pp_sim_result *r = NULL;
        if (pp_cost_model_parse("F=1,I=2,W=1,c=0.5,bw=10,bytes=3,mem=1,wmem=1", s->nstages, &c) ==
                PP_OK &&
            pp_trace_new(s->nranks, &t) == PP_OK) {
            if (pp_simulate(s, c, t, &r) != PP_OK) abort(); /* valid means it runs */
            FILE *f = fopen("/dev/null", "w");
            if (f) {
                pp_trace_write_chrome(t, f, 1.0);
                pp_trace_write_svg(t, f, "fuzz");
                fclose(f);
            }
        }
        pp_sim_result_free(r);
        pp_trace_free(t);
        pp_cost_model_free(c);
    }
    pp_schedule_free(s);
    return 0;
}

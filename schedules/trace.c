/* Timed events and their Chrome trace JSON form. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/sched_trace.h"

#include "status_internal.h"
pp_status pp_trace_new(int nranks, pp_trace **out) {
    *out = NULL;
    if (nranks < 1) return pp_error(PP_ERR_INVALID, "trace: %d ranks", nranks);
    pp_trace *t = calloc(1, sizeof *t);
    if (!t) return pp_error(PP_ERR_NOMEM, "trace: out of memory");
    t->nranks = nranks;
    *out = t;
    return PP_OK;
}

void pp_trace_free(pp_trace *t) {
    if (!t) return;
    free(t->ev);
    free(t);
}

pp_status pp_trace_add(pp_trace *t, const pp_trace_event *e) {
    if (e->rank < 0 || e->rank >= t->nranks)
        return pp_error(PP_ERR_INVALID, "trace: event for rank %d of %d", (int)e->rank,
                        t->nranks);
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        pp_trace_event *p = realloc(t->ev, cap * sizeof *p);
        if (!p) return pp_error(PP_ERR_NOMEM, "trace: out of memory");
        t->ev = p;
        t->cap = cap;
    }
    t->ev[t->n++] = *e;
    return PP_OK;
}

/* Event name in action syntax: 0F1, 2SEND_B3, (0F4;3B1)OVERLAP_F_B. */
static void event_name(const pp_trace_event *e, char *buf, size_t n) {
    if (e->kind == PP_ACT_OVERLAP_F_B) {
        snprintf(buf, n, "(%dF%d;%dB%d)OVERLAP_F_B", (int)e->stage, (int)e->mb, (int)e->stage2,
                 (int)e->mb2);
        return;
    }
    pp_action a = pp_act((pp_act_kind)e->kind, e->stage, e->mb);
    pp_action_format(NULL, &a, buf, n);
}

/* chrome://tracing reserved colour names (Perfetto colours by name). */
static const char *cname(int kind, int lane) {
    if (lane == PP_LANE_COMM) return "grey";
    switch (kind) {
    case PP_ACT_F: return "thread_state_runnable";
    case PP_ACT_I: return "rail_load";
    case PP_ACT_W: return "good";
    case PP_ACT_B: return "terrible";
    case PP_ACT_OVERLAP_F_B: return "rail_animation";
    default: return "grey";
    }
}

static const char *category(int kind, int lane) {
    if (lane == PP_LANE_COMM) return "comm";
    switch (kind) {
    case PP_ACT_F: return "F";
    case PP_ACT_I: return "I";
    case PP_ACT_W: return "W";
    case PP_ACT_B: return "B";
    case PP_ACT_OVERLAP_F_B: return "OVERLAP_F_B";
    default: return "other";
    }
}

pp_status pp_trace_write_chrome(const pp_trace *t, FILE *f, double us_per_unit) {
    if (!(us_per_unit > 0)) us_per_unit = 1.0;
    int bad = fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n") < 0;
    for (int r = 0; r < t->nranks && !bad; r++) {
        bad |= fprintf(f,
                       "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":"
                       "\"rank %d\"}},\n"
                       "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{"
                       "\"sort_index\":%d}},\n"
                       "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{"
                       "\"name\":\"compute\"}},\n"
                       "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{"
                       "\"name\":\"comm\"}}%s\n",
                       r, r, r, r, r, r, (r + 1 < t->nranks || t->n) ? "," : "") < 0;
    }
    char name[PP_ACTION_STR_MAX];
    for (size_t k = 0; k < t->n && !bad; k++) {
        const pp_trace_event *e = &t->ev[k];
        event_name(e, name, sizeof name);
        double ts = e->start * us_per_unit, dur = (e->end - e->start) * us_per_unit;
        bad |= fprintf(f,
                       "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
                       "\"ts\":%.3f,\"dur\":%.3f,\"cname\":\"%s\",\"args\":{\"stage\":%d,"
                       "\"mb\":%d}}%s\n",
                       name, category(e->kind, e->lane), (int)e->rank, (int)e->lane, ts, dur,
                       cname(e->kind, e->lane), (int)e->stage, (int)e->mb,
                       k + 1 < t->n ? "," : "") < 0;
    }
    bad |= fprintf(f, "]}\n") < 0;
    if (bad) return pp_error(PP_ERR_IO, "writing trace: %s", strerror(errno));
    return PP_OK;
}

pp_status pp_trace_save_chrome(const pp_trace *t, const char *path, double us_per_unit) {
    FILE *f = fopen(path, "wb");
    if (!f) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    pp_status st = pp_trace_write_chrome(t, f, us_per_unit);
    if (fclose(f) != 0 && st == PP_OK) st = pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    if (st != PP_OK) return pp_error_context(st, "%s", path);
    return PP_OK;
}

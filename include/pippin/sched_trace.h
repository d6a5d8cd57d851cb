/* Timelines: timed events per rank, written as Chrome trace JSON (opens in
 * Perfetto and chrome://tracing) or as an SVG picture.
 *
 * The simulator fills a pp_trace; the executor fills the same structure
 * from real timings, so a run and its simulation can be laid side by side.
 * libc only.
 *
 * Thread safety: a trace is filled by one thread at a time. */
#ifndef PIPPIN_SCHED_TRACE_H
#define PIPPIN_SCHED_TRACE_H

#include "pippin/export.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pippin/schedule.h"
#include "pippin/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { PP_LANE_COMPUTE = 0, PP_LANE_COMM = 1 };

typedef struct pp_trace_event {
    int32_t rank;
    int32_t stage; /* OVERLAP_F_B: the forward's stage */
    int32_t mb;    /* -1 if none; OVERLAP_F_B: the forward's microbatch */
    uint8_t kind;  /* pp_act_kind; SEND_F/SEND_B on the comm lane are transfers */
    uint8_t lane;  /* PP_LANE_COMPUTE or PP_LANE_COMM */
    int32_t stage2; /* OVERLAP_F_B: the backward's stage and microbatch, else -1 */
    int32_t mb2;
    double start;   /* in the trace's time unit */
    double end;
} pp_trace_event;

typedef struct pp_trace {
    int nranks;
    pp_trace_event *ev;
    size_t n;
    size_t cap;
} pp_trace;

PP_API pp_status pp_trace_new(int nranks, pp_trace **out);
PP_API void pp_trace_free(pp_trace *t);
PP_API pp_status pp_trace_add(pp_trace *t, const pp_trace_event *e);

/* Chrome trace: one process per rank (tid 0 compute, tid 1 communication),
 * complete ("X") events named like actions (`0F1`), args with stage and
 * microbatch. Times are multiplied by us_per_unit to get microseconds (1
 * for simulator units, 1e6 for seconds). */
PP_API pp_status pp_trace_write_chrome(const pp_trace *t, FILE *f, double us_per_unit);
PP_API pp_status pp_trace_save_chrome(const pp_trace *t, const char *path, double us_per_unit);

/* SVG: one row per rank, F / I / W / B / overlap / communication in
 * distinct colours over a pale idle background, microbatch numbers written
 * in boxes wide enough to hold them, a time axis and a legend. */
PP_API pp_status pp_trace_write_svg(const pp_trace *t, FILE *f, const char *title);
PP_API pp_status pp_trace_save_svg(const pp_trace *t, const char *path, const char *title);

#ifdef __cplusplus
}
#endif
#endif

/* Internal: timing real runs into traces (the runner and the executor). */
#ifndef PIPPIN_SCHEDULES_TIMING_H
#define PIPPIN_SCHEDULES_TIMING_H

#include "pippin/sched_trace.h"

/* Milliseconds on CLOCK_MONOTONIC. */
double pp_monotonic_ms(void);
/* Adds a compute action that ran from start_ms to end_ms (relative to the
 * trace's origin) on `rank`; the trace's unit is microseconds. */
pp_status pp_trace_action(pp_trace *t, int rank, const pp_action *a, double start_ms, double end_ms);
/* Adds a wait for a RECV_F / RECV_B (a's kind) on the communication lane. */
pp_status pp_trace_wait(pp_trace *t, int rank, const pp_action *a, double start_ms, double end_ms);

#endif

/* Timing real runs into the simulator's trace format. */
#include "timing.h"

#include <time.h>

double pp_monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

pp_status pp_trace_action(pp_trace *t, int rank, const pp_action *a, double start_ms, double end_ms) {
    pp_trace_event e = {rank, a->stage, a->mb, a->kind, PP_LANE_COMPUTE, -1, -1, start_ms * 1e3, end_ms * 1e3};
    return pp_trace_add(t, &e);
}

pp_status pp_trace_wait(pp_trace *t, int rank, const pp_action *a, double start_ms, double end_ms) {
    pp_trace_event e = {rank, a->stage, a->mb, a->kind, PP_LANE_COMM, -1, -1, start_ms * 1e3, end_ms * 1e3};
    return pp_trace_add(t, &e);
}

/* Private to schedules/: generator entry points, the execution engine
 * shared by the validator and the simulator, and table helpers. */
#ifndef PIPPIN_SCHED_INTERNAL_H
#define PIPPIN_SCHED_INTERNAL_H

#include "pippin/sched_sim.h"
#include "pippin/schedule.h"

/* Generators append compute actions to s, which the dispatcher created
 * with the right ranks, stages, microbatches and placement. */
pp_status pp_gen_gpipe(pp_schedule *s);
pp_status pp_gen_1f1b(pp_schedule *s);
pp_status pp_gen_looped_bfs(pp_schedule *s);
/* Interleaved 1F1B (zb = 0) and interleaved zero bubble (zb = 1). */
pp_status pp_gen_interleaved(pp_schedule *s, int zb);
pp_status pp_gen_zb_h1(pp_schedule *s);
pp_status pp_gen_zb_h2(pp_schedule *s);
pp_status pp_gen_zbv(pp_schedule *s);
pp_status pp_gen_dualpipev(pp_schedule *s);
pp_status pp_gen_auto(pp_schedule *s, const pp_sched_params *params);

/* Appends to a list reserved beforehand without a call (the generators'
 * inner loops); falls back to pp_schedule_append when full. */
static inline pp_status pp_sched_push(pp_schedule *s, int rank, pp_action a) {
    if (s->len[rank] < s->cap_[rank]) {
        s->acts[rank][s->len[rank]++] = a;
        return PP_OK;
    }
    return pp_schedule_append(s, rank, a);
}

/* Room for n sub-actions of compound actions in all. */
pp_status pp_sched_reserve_subs(pp_schedule *s, size_t n);

/* Table of steps first..last (clamped), marking err_step. */
pp_status pp_sched_table_range(const pp_schedule *s, long first, long last, long err_step,
                               char **out);

/* The validator's rules without the dry run: per-action checks and
 * completeness. err_rank and err_step locate a per-action failure (-1 if
 * none or not applicable). */
pp_status pp_sched_check_static(const pp_schedule *s, int *err_rank, long *err_step);

/* Runs every rank's list in dependency order (see sched_sim.h for the
 * model). costs NULL means unit costs, no communication cost. With
 * res != NULL its per-rank arrays (allocated by the caller) are filled;
 * with trace != NULL events are appended. checked says the
 * schedule passed pp_sched_check_static (ranges and owners are then not
 * checked again). On a deadlock or a dependency
 * that cannot be met, fails naming the rank, step and action; *err_rank
 * and *err_step (if given) locate it. */
pp_status pp_sched_run(const pp_schedule *s, const pp_cost_model *costs, pp_trace *trace,
                       int checked, pp_sim_result *res, int *err_rank, long *err_step);

#endif

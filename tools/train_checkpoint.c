/* pippin train --checkpoint / --resume: the committed-checkpoint protocol
 * (runtime/checkpoint_sync.h) for the local runner and for rank threads. */
#include "train_args.h"

#include "status_internal.h"

void train_ckpt_init(const train_args *a, pp_transport *t, const pp_schedule *sched, int rank, int n_total, int n,
                     pp_stage *const *stages, pp_optim *const *optims, pp_ckpt_sync *ck) {
    *ck = (pp_ckpt_sync){0};
    ck->dir = a->checkpoint;
    ck->every = a->checkpoint_every;
    ck->keep = a->checkpoint_keep > 0 ? a->checkpoint_keep : 2;
    ck->agree = (pp_agree){t, sched ? sched->nranks : 1, sched ? sched->nstages : 0, sched ? sched->stage_rank : NULL, rank, 10000, pp_agree_long_timeout(10000)};
    ck->n = n;
    ck->stages = stages;
    ck->optims = optims;
    ck->n_stages_total = n_total;
    ck->write_files = 1;
}

pp_status train_resume(pp_ckpt_sync *ck, const train_args *a, long long *first_step) {
    *first_step = 0;
    if (!ck->dir) return PP_OK;
    int64_t next;
    PP_TRY(pp_ckpt_start(ck, a->resume ? PP_CKPT_RESUME : PP_CKPT_FRESH, &next));
    *first_step = next;
    return PP_OK;
}

pp_status train_checkpoint(pp_ckpt_sync *ck, const train_args *a, long long step) {
    return pp_ckpt_due(ck, step, a->steps) ? pp_ckpt_save(ck, step) : PP_OK;
}

/* pippin train --checkpoint / --resume: save and restore stages. */
#include "pippin/checkpoint.h"
#include "train_args.h"

#include "status_internal.h"
pp_status train_resume(const train_args *a, int n, pp_stage *const *stages, pp_optim *const *optims,
                       long long *first_step) {
    *first_step = 0;
    if (!a->resume) return PP_OK;
    int64_t saved = -1;
    for (int i = 0; i < n; i++) {
        int64_t step;
        PP_TRY(pp_checkpoint_load(a->checkpoint, stages[i], optims[i], &step));
        if (i > 0 && step != saved)
            return pp_error(PP_ERR_INVALID, "%s: stage %d was saved at step %lld, stage %d at step %lld", a->checkpoint,
                            pp_stage_index(stages[0]), (long long)saved, pp_stage_index(stages[i]), (long long)step);
        saved = step;
    }
    *first_step = saved + 1;
    return PP_OK;
}

pp_status train_checkpoint(const train_args *a, long long step, int n, pp_stage *const *stages,
                           pp_optim *const *optims) {
    if (!a->checkpoint) return PP_OK;
    int due = step == a->steps - 1 || (a->checkpoint_every > 0 && (step + 1) % a->checkpoint_every == 0);
    for (int i = 0; due && i < n; i++) PP_TRY(pp_checkpoint_save(a->checkpoint, stages[i], optims[i], step));
    return PP_OK;
}

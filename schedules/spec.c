/* A schedule from its name as users write it: a kind or csv:FILE. */
#include <string.h>

#include "pippin/schedule.h"
#include "status_internal.h"

pp_status pp_schedule_from_spec(const char *spec, int n_stages, int m, pp_schedule **out) {
    *out = NULL;
    if (!spec) return PP_OK;
    if (strncmp(spec, "csv:", 4) == 0) {
        PP_TRY(pp_schedule_load_csv(spec + 4, out));
    } else {
        pp_sched_params sp = {0};
        PP_TRY(pp_sched_kind_parse(spec, &sp.kind));
        int spr = pp_sched_default_stages_per_rank(sp.kind);
        if (n_stages % spr != 0)
            return pp_error(PP_ERR_INVALID, "schedule '%s' puts %d stages on each rank; the pipe has %d stages",
                            spec, spr, n_stages);
        sp.nranks = n_stages / spr;
        sp.nmb = m;
        sp.stages_per_rank = spr;
        PP_TRY(pp_schedule_generate(&sp, out));
    }
    pp_status s = pp_schedule_validate(*out, NULL);
    if (s == PP_OK && (*out)->nstages != n_stages)
        s = pp_error(PP_ERR_INVALID, "schedule '%s' has %d stages; the pipe has %d", spec, (*out)->nstages, n_stages);
    if (s != PP_OK) {
        pp_schedule_free(*out);
        *out = NULL;
    }
    return s;
}

#include "opt_internal.h"

pp_status pp_opt_transpose(pp_opt_ctx *c, int *count) {
    (void)c;
    *count = 0;
    return PP_OK;
}

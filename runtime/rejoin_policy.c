/* When a failed step is worth a rejoin (runtime/rejoin_policy.h). */
#include "rejoin_policy.h"

#include <string.h>

int pp_rejoin_recoverable(pp_status s, const char *abort_reason, int abort_by, int self,
                          const pp_peer_state *states, int n) {
    if (s != PP_ERR_PEER && s != PP_ERR_TIMEOUT) return 0;
    if (abort_reason)
        return abort_by != self && strncmp(abort_reason, PP_REJOIN_PREFIX, strlen(PP_REJOIN_PREFIX)) == 0;
    for (int r = 0; r < n; r++)
        if (r != self && states[r] == PP_PEER_REJECTED) return 0;
    return 1;
}

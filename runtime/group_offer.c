/* The replicas' one-message agreements (group_offer.h). */
#include "group_offer.h"

#include <string.h>

#include "status_internal.h"

static void key_of(const pp_group_offer *g, int peer, int sending, pp_transport_key *k) {
    int mine = g->replica * g->n_stages + g->stage, theirs = peer * g->n_stages + g->stage;
    *k = (pp_transport_key){PP_MSG_GRADIENT, g->step, g->microbatch, sending ? mine : theirs, sending ? theirs : mine,
                            g->name};
}

pp_status pp_group_offer_send(const pp_group_offer *g, const char *text) {
    pp_tensor *t = NULL;
    int64_t len = (int64_t)strlen(text);
    PP_TRY(pp_tensor_empty(PP_U8, 1, (int64_t[]){len}, &t));
    memcpy(t->data, text, (size_t)len);
    pp_status st = PP_OK;
    for (int k = 0; k < g->replicas && st == PP_OK; k++) {
        if (k == g->replica) continue;
        pp_transport_key key;
        key_of(g, k, 1, &key);
        st = pp_error_context(pp_transport_send(g->t, &key, t), "stage %d: offering %s to replica %d", g->stage,
                              g->what, k);
    }
    pp_tensor_free(t);
    return st;
}

pp_status pp_group_offer_take(const pp_group_offer *g, int from, int wait, int timeout_ms, char *text, size_t cap,
                              int *got) {
    *got = 0;
    text[0] = 0;
    pp_transport_key key;
    key_of(g, from, 0, &key);
    pp_tensor *in = NULL;
    pp_status st = wait ? pp_transport_recv(g->t, &key, timeout_ms, &in) : pp_transport_try_recv(g->t, &key, &in);
    if (st != PP_OK)
        return pp_error_context(st, "stage %d: waiting for replica %d's (rank %d) offer of %s", g->stage, from,
                                pp_transport_stage_rank(g->t, from * g->n_stages + g->stage), g->what);
    if (!in) return PP_OK;
    int64_t n = pp_tensor_numel(in);
    if (in->dtype == PP_U8 && in->ndim == 1 && n > 0 && (size_t)n < cap) {
        memcpy(text, in->data, (size_t)n);
        text[n] = 0;
    }
    pp_tensor_free(in);
    *got = 1;
    return PP_OK;
}

/* Agreements between ranks over their transports (agree.h). */
#include "agree.h"

#include <stdlib.h>
#include <string.h>

#include "status_internal.h"

#define AGREE_NAME "pippin:agree"

/* first[r]: the lowest stage on rank r, which names the rank in keys. */
static pp_status first_stages(const pp_agree *a, int **first) {
    *first = malloc(sizeof(int) * (size_t)a->nranks);
    if (!*first) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int st = a->nstages - 1; st >= 0; st--) (*first)[a->stage_rank[st]] = st;
    return PP_OK;
}

int pp_agree_long_timeout(int timeout_ms) { return timeout_ms > 300000 ? timeout_ms : 300000; }

/* What an agreement is, for errors (its keys show only a microbatch number
 * no schedule uses). */
static const char *slot_name(int slot) {
    switch (slot) {
    case PP_AGREE_STOP: return "the stop vote after step";
    case PP_AGREE_RESUME: return "the agreement on where to start (rank 0's newest committed checkpoint)";
    case PP_AGREE_RESUME_OK: return "the agreement that every rank loaded the checkpoint";
    case PP_AGREE_CHECKPOINT: return "the checkpoint commit of step";
    case PP_AGREE_IDENTITY: return "the run identity check";
    case PP_AGREE_STEP: return "the replicas' vote on step";
    default: return "an agreement";
    }
}

/* Sends t to every peer, then hands each peer's tensor to got(). */
static pp_status all_to_all(const pp_agree *a, int64_t step, int slot, pp_tensor *t,
                            pp_status (*got)(void *user, int rank, const pp_tensor *t), void *user) {
    int nr = a->nranks, mb = PP_AGREE_MICROBATCH + slot, *first;
    PP_TRY(first_stages(a, &first));
    pp_status s = PP_OK;
    for (int r = 0; r < nr; r++) { /* to every peer that can take it, even after one that cannot: they wait for it */
        pp_transport_key k = {PP_MSG_GRADIENT, step, mb, first[a->rank], first[r], AGREE_NAME};
        pp_status e = r != a->rank ? pp_transport_send(a->t, &k, t) : PP_OK;
        if (s == PP_OK) s = e;
    }
    for (int r = 0; r < nr && s == PP_OK; r++) {
        if (r == a->rank) continue;
        pp_transport_key k = {PP_MSG_GRADIENT, step, mb, first[r], first[a->rank], AGREE_NAME};
        pp_tensor *in = NULL;
        s = pp_transport_recv(a->t, &k, pp_agree_slow(slot) ? a->long_timeout_ms : a->timeout_ms, &in);
        if (s == PP_OK) s = got(user, r, in);
        pp_tensor_free(in);
    }
    free(first);
    if (s == PP_OK) return s;
    if (slot == PP_AGREE_STOP || slot == PP_AGREE_CHECKPOINT || slot == PP_AGREE_STEP)
        return pp_error_context(s, "%s %lld", slot_name(slot), (long long)step);
    return pp_error_context(s, "%s", slot_name(slot));
}

static pp_status got_int(void *user, int rank, const pp_tensor *t) {
    pp_agree_result *r = user;
    if (t->dtype != PP_I64 || pp_tensor_numel(t) != 1)
        return pp_error(PP_ERR_PEER, "rank %d sent a malformed agreement message", rank);
    int64_t v = ((const int64_t *)t->data)[0];
    if (v < r->lo) {
        r->lo = v;
        r->who_lo = rank;
    }
    if (v > r->hi) {
        r->hi = v;
        r->who_hi = rank;
    }
    return PP_OK;
}

pp_status pp_agree_int(const pp_agree *a, int64_t step, int slot, int64_t mine, pp_agree_result *r) {
    *r = (pp_agree_result){mine, mine, a->rank, a->rank};
    if (!a->t || a->nranks < 2) return PP_OK;
    pp_tensor *t;
    PP_TRY(pp_tensor_new(PP_I64, 1, (int64_t[]){1}, &t));
    ((int64_t *)t->data)[0] = mine;
    pp_status s = all_to_all(a, step, slot, t, got_int, r);
    pp_tensor_free(t);
    return s;
}

typedef struct bytes_ctx {
    pp_agree_check_fn check;
    void *user;
} bytes_ctx;

static pp_status got_bytes(void *user, int rank, const pp_tensor *t) {
    bytes_ctx *c = user;
    if (t->dtype != PP_U8 || t->ndim != 1)
        return pp_error(PP_ERR_PEER, "rank %d sent a malformed agreement message", rank);
    return c->check(c->user, rank, t->data, t->nbytes);
}

pp_status pp_agree_bytes(const pp_agree *a, int64_t step, int slot, const uint8_t *mine, size_t n,
                         pp_agree_check_fn check, void *user) {
    if (!a->t || a->nranks < 2) return PP_OK;
    pp_tensor *t;
    PP_TRY(pp_tensor_new(PP_U8, 1, (int64_t[]){(int64_t)n}, &t));
    if (n) memcpy(t->data, mine, n);
    bytes_ctx c = {check, user};
    pp_status s = all_to_all(a, step, slot, t, got_bytes, &c);
    pp_tensor_free(t);
    return s;
}

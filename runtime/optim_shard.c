/* ZeRO-1: a replica's shard of the optimizer state (optim_shard.h). */
#include "optim_shard.h"

#include <stdlib.h>
#include <string.h>

#include "status_internal.h"

pp_status pp_optim_shard_new(const pp_optim_config *c, const pp_grad_ring_options *o, int replica,
                             const pp_flat_params *fp, pp_optim_shard **out) {
    *out = NULL;
    pp_optim_shard *s = calloc(1, sizeof *s);
    if (!s) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status st = pp_grad_ring_shard(o, replica, fp, &s->r);
    size_t bytes = sizeof(float) * (size_t)(s->r.count ? s->r.count : 1);
    if (st == PP_OK && (!(s->p = malloc(bytes)) || !(s->g = malloc(bytes)))) st = pp_error(PP_ERR_NOMEM, "out of memory");
    if (st == PP_OK) st = pp_optim_new(c, s->r.count, &s->opt);
    if (st != PP_OK) {
        pp_optim_shard_free(s);
        return st;
    }
    *out = s;
    return PP_OK;
}

void pp_optim_shard_free(pp_optim_shard *s) {
    if (!s) return;
    pp_ring_ranges_free(&s->r);
    pp_optim_free(s->opt);
    free(s->p);
    free(s->g);
    free(s);
}

void pp_ring_ranges_gather(const pp_ring_ranges *r, const float *whole, float *part) {
    for (int i = 0; i < r->n; i++) {
        memcpy(part, whole + r->lo[i], sizeof(float) * (size_t)r->len[i]);
        part += r->len[i];
    }
}

void pp_ring_ranges_scatter(const pp_ring_ranges *r, const float *part, float *whole) {
    for (int i = 0; i < r->n; i++) {
        memcpy(whole + r->lo[i], part, sizeof(float) * (size_t)r->len[i]);
        part += r->len[i];
    }
}

pp_status pp_optim_shard_step(pp_optim_shard *s, pp_flat_params *fp) {
    PP_TRY(pp_flat_params_check_grads(fp, "optimizer shard"));
    pp_ring_ranges_gather(&s->r, fp->data, s->p);
    pp_ring_ranges_gather(&s->r, fp->grad, s->g);
    PP_TRY(pp_optim_step(s->opt, s->p, s->g, s->r.count));
    pp_ring_ranges_scatter(&s->r, s->p, fp->data);
    return PP_OK;
}

pp_status pp_optim_shard_take(pp_optim_shard *s, pp_optim *whole) {
    int n = pp_optim_state(s->opt, -1, NULL, NULL);
    if (pp_optim_state(whole, -1, NULL, NULL) != n || pp_optim_get_config(whole)->kind != pp_optim_get_config(s->opt)->kind)
        return pp_error(PP_ERR_INTERNAL, "optimizer shard: the whole optimizer is of another kind");
    for (int i = 0; i < n; i++) {
        float *part, *all;
        pp_optim_state(s->opt, i, NULL, &part);
        pp_optim_state(whole, i, NULL, &all);
        if (part && all) pp_ring_ranges_gather(&s->r, all, part);
    }
    pp_optim_set_steps(s->opt, pp_optim_steps(whole));
    return PP_OK;
}

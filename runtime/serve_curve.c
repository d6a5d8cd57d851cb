/* CURVE with a client allow-list on the serving front (serve_curve.h). */
#include "serve_curve.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "context.h"
#include "log_internal.h"
#include "pippin/transport.h"
#include "status_internal.h"

struct pp_serve_curve {
    pp_zctx *z;
    pp_zap_domain *domain;
};

void pp_serve_curve_close(pp_serve_curve *sc) {
    if (!sc) return;
    if (sc->domain) pp_zctx_remove_domain(sc->z, sc->domain);
    pp_zctx_release(sc->z); /* the last reference stops the ZAP handler; the context is the caller's */
    free(sc);
}

pp_status pp_serve_curve_open(const pp_config *c, int rank, void *zctx, void *router, pp_serve_curve **out) {
    *out = NULL;
    if (c->n_secret_keys == 0) return PP_OK;
    if (rank < 0 || rank >= c->n_secret_keys)
        return pp_error(PP_ERR_INVALID, "serve: no security.secret_keys entry for the front rank %d", rank);
    if (c->n_serve_client_keys <= 0)
        return pp_error(PP_ERR_INVALID, "serve.client_keys: needed with security: the clients the front admits");
    if (!zmq_has("curve"))
        return pp_error(PP_ERR_UNSUPPORTED, "serve: the front needs CURVE but this libzmq lacks it");
    char secret[PP_CURVE_KEY_CHARS + 1], z85[PP_CURVE_KEY_CHARS + 1];
    uint8_t (*keys)[32] = calloc((size_t)c->n_serve_client_keys, sizeof *keys);
    if (!keys) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status s = PP_OK;
    for (int i = 0; s == PP_OK && i < c->n_serve_client_keys; i++) {
        s = pp_curve_read_key(c->serve_client_keys[i], z85);
        if (s == PP_OK) zmq_z85_decode(keys[i], z85);
        else s = pp_error(PP_ERR_INVALID, "serve.client_keys: %s", pp_last_error());
    }
    pp_serve_curve *sc = s == PP_OK ? calloc(1, sizeof *sc) : NULL;
    if (s == PP_OK && !sc) s = pp_error(PP_ERR_NOMEM, "out of memory");
    if (s == PP_OK) s = pp_curve_read_key(c->secret_keys[rank], secret);
    if (s == PP_OK) s = pp_zctx_acquire(zctx, 0, &sc->z);
    char domain[64];
    if (s == PP_OK)
        s = pp_zctx_add_domain(sc->z, (const uint8_t(*)[32])keys, c->n_serve_client_keys, &sc->domain, domain,
                               sizeof domain);
    int one = 1;
    if (s == PP_OK && (zmq_setsockopt(router, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
                       zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, secret, PP_CURVE_KEY_CHARS) != 0 ||
                       zmq_setsockopt(router, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0))
        s = pp_error(PP_ERR_IO, "serve: CURVE options on the front: %s", zmq_strerror(zmq_errno()));
    memset(secret, 0, sizeof secret);
    free(keys);
    if (s != PP_OK) {
        if (sc && sc->z) pp_serve_curve_close(sc);
        else free(sc);
        return s;
    }
    pp_info("serve: the front admits %d CURVE client key%s", c->n_serve_client_keys,
            c->n_serve_client_keys == 1 ? "" : "s");
    *out = sc;
    return PP_OK;
}

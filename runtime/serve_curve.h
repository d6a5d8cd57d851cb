/* Internal: CURVE on the serving front (docs/serving.md "Security"). With
 * `security:` in the config the front ROUTER is a CURVE server with its
 * rank's own key pair and admits only the clients whose public keys are in
 * serve.client_keys: a ZAP domain (transport/context.h) on the front's
 * ZeroMQ context lists them. Without security: nothing to do (plaintext). */
#ifndef PIPPIN_RUNTIME_SERVE_CURVE_H
#define PIPPIN_RUNTIME_SERVE_CURVE_H

#include "pippin/config.h"
#include "pippin/status.h"

typedef struct pp_serve_curve pp_serve_curve;

/* Makes router (a socket of zctx, not yet bound) a CURVE server for rank's
 * secret key and the config's client keys; *out NULL when the config has no
 * security. Call before binding. */
pp_status pp_serve_curve_open(const pp_config *c, int rank, void *zctx, void *router, pp_serve_curve **out);
/* Removes the ZAP domain and stops the handler: after the router is closed,
 * before the context is terminated. NULL is fine. */
void pp_serve_curve_close(pp_serve_curve *sc);

#endif

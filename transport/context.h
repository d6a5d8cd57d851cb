/* Shared ZeroMQ contexts and their ZAP handlers (internal to the transport).
 *
 * Transports of one process share one context (pippin's own, or the
 * caller's), so inproc endpoints connect across ranks that are threads. A
 * context gets a ZAP handler thread the first time a CURVE transport uses
 * it; each CURVE transport registers a ZAP domain listing the client keys it
 * admits. The handler stops and an owned context is terminated when the
 * last transport using it lets go. */
#ifndef PIPPIN_TRANSPORT_CONTEXT_H
#define PIPPIN_TRANSPORT_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/status.h"

typedef struct pp_zctx pp_zctx;
typedef struct pp_zap pp_zap;
typedef struct pp_zap_domain pp_zap_domain;

/* user_ctx NULL: pippin's process-wide context (created with io_threads). */
pp_status pp_zctx_acquire(void *user_ctx, int io_threads, pp_zctx **out);
void *pp_zctx_handle(const pp_zctx *z);
/* What pippin sets on its own context (before any socket): small frames
 * copied out of libzmq's read buffer instead of pinning it (context.c). */
void pp_zctx_tune(void *ctx);
/* Drops a reference; the last one stops the ZAP handler and terminates an
 * owned context (every socket of it must be closed by then). */
void pp_zctx_release(pp_zctx *z);

/* Registers a ZAP domain admitting CURVE clients with one of the nkeys
 * 32-byte public keys, starting the context's ZAP handler if needed. The
 * domain's name (for ZMQ_ZAP_DOMAIN) is written into name (cap >= 64). */
pp_status pp_zctx_add_domain(pp_zctx *z, const uint8_t (*keys)[32], int nkeys,
                             pp_zap_domain **out, char *name, size_t cap);
void pp_zctx_remove_domain(pp_zctx *z, pp_zap_domain *d);
/* Clients refused in that domain so far (any thread). */
uint64_t pp_zap_domain_refused(const pp_zap_domain *d);

/* The handler itself (zap.c). */
pp_status pp_zap_start(void *ctx, pp_zap **out);
void pp_zap_stop(pp_zap *z);
pp_status pp_zap_add(pp_zap *z, const char *name, const uint8_t (*keys)[32], int nkeys,
                     pp_zap_domain **out);
void pp_zap_remove(pp_zap *z, pp_zap_domain *d);

#endif

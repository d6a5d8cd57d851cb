/* Internal: setting this thread's error message, and PP_TRY. Not installed;
 * callers of the library read messages with pp_last_error (pippin/status.h). */
#ifndef PIPPIN_STATUS_INTERNAL_H
#define PIPPIN_STATUS_INTERNAL_H

#include "pippin/status.h"

/* Sets this thread's error message (printf-style) and returns code, so a
 * caller can write `return pp_error(PP_ERR_INVALID, "node %s: ...", n);`. */
pp_status pp_error(pp_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with more context: "ctx: old message".
 * Returns code unchanged. */
pp_status pp_error_context(pp_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));


/* Propagate a failure: evaluates expr once, returns it if not PP_OK. */
#define PP_TRY(expr)                          \
    do {                                      \
        pp_status pp_try_s_ = (expr);         \
        if (pp_try_s_ != PP_OK) return pp_try_s_; \
    } while (0)

#endif

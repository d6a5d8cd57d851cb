/* Error codes and the thread-local last-error message.
 *
 * Every fallible pippin function returns a pp_status: PP_OK (0) or a negative
 * code. The human-readable message, with context (file, node, stage, peer),
 * is kept per thread and read with pp_last_error(). */
#ifndef PIPPIN_STATUS_H
#define PIPPIN_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pp_status {
    PP_OK = 0,
    PP_ERR_INVALID = -1,     /* bad argument or malformed input */
    PP_ERR_NOMEM = -2,       /* allocation failed or size limit exceeded */
    PP_ERR_IO = -3,          /* file or socket I/O failed */
    PP_ERR_PARSE = -4,       /* a file or message could not be decoded */
    PP_ERR_UNSUPPORTED = -5, /* valid input pippin does not handle */
    PP_ERR_SHAPE = -6,       /* shapes or dtypes do not fit together */
    PP_ERR_NOT_FOUND = -7,   /* a named thing does not exist */
    PP_ERR_TIMEOUT = -8,     /* a deadline passed */
    PP_ERR_PEER = -9,        /* a peer died, misbehaved or refused us */
    PP_ERR_STATE = -10,      /* call made in the wrong state or order */
    PP_ERR_INTERNAL = -11    /* a bug in pippin */
} pp_status;

/* Short name of a code, e.g. "invalid argument". Never NULL. */
const char *pp_status_name(pp_status s);

/* The last error message set on this thread ("" if none). */
const char *pp_last_error(void);

/* Sets this thread's error message (printf-style) and returns code, so a
 * caller can write `return pp_error(PP_ERR_INVALID, "node %s: ...", n);`. */
pp_status pp_error(pp_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with more context: "ctx: old message".
 * Returns code unchanged. */
pp_status pp_error_context(pp_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clears this thread's message. */
void pp_error_clear(void);

/* Propagate a failure: evaluates expr once, returns it if not PP_OK. */
#define PP_TRY(expr)                          \
    do {                                      \
        pp_status pp_try_s_ = (expr);         \
        if (pp_try_s_ != PP_OK) return pp_try_s_; \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif

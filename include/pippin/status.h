/* Error codes and the thread-local last-error message.
 *
 * Every fallible pippin function returns a pp_status: PP_OK (0) or a negative
 * code. The human-readable message, with context (file, node, stage, peer),
 * is kept per thread and read with pp_last_error().
 *
 * Thread safety: every function may be called from any thread; the message is per thread. */
#ifndef PIPPIN_STATUS_H
#define PIPPIN_STATUS_H

#include "pippin/export.h"

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
PP_API const char *pp_status_name(pp_status s);

/* The last error message set on this thread ("" if none). */
PP_API const char *pp_last_error(void);

/* Clears this thread's message. */
PP_API void pp_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif

/* Logging: the only way the library prints anything.
 *
 * By default messages at PP_LOG_WARN and above go to stderr. An embedding
 * service installs its own handler to route them elsewhere.
 *
 * Thread safety: logging and the level are safe from any thread; install a
 * handler before starting threads. */
#ifndef PIPPIN_LOG_H
#define PIPPIN_LOG_H

#include "pippin/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pp_log_level {
    PP_LOG_DEBUG = 0,
    PP_LOG_INFO = 1,
    PP_LOG_WARN = 2,
    PP_LOG_ERROR = 3,
    PP_LOG_OFF = 4
} pp_log_level;

typedef void (*pp_log_handler)(pp_log_level level, const char *msg, void *user);

/* Messages below level are dropped. The initial level comes from the
 * PIPPIN_LOG environment variable (debug, info, warn, error, off). */
PP_API void pp_log_set_level(pp_log_level level);
PP_API pp_log_level pp_log_get_level(void);

/* NULL restores the default stderr handler. Not thread-safe with logging
 * calls in flight: install it before starting workers. */
PP_API void pp_log_set_handler(pp_log_handler handler, void *user);

#ifdef __cplusplus
}
#endif
#endif

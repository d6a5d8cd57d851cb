/* Internal: the library's own logging calls, routed through the handler and
 * level set with pippin/log.h. Not installed. */
#ifndef PIPPIN_LOG_INTERNAL_H
#define PIPPIN_LOG_INTERNAL_H

#include "pippin/log.h"

void pp_log(pp_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define pp_debug(...) pp_log(PP_LOG_DEBUG, __VA_ARGS__)
#define pp_info(...) pp_log(PP_LOG_INFO, __VA_ARGS__)
#define pp_warn(...) pp_log(PP_LOG_WARN, __VA_ARGS__)
#define pp_log_error(...) pp_log(PP_LOG_ERROR, __VA_ARGS__)

#endif

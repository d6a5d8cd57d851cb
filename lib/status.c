/* Thread-local error messages. */
#include "pippin/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "status_internal.h"
#define PP_ERROR_CAP 2048

static _Thread_local char last_error[PP_ERROR_CAP];

const char *pp_status_name(pp_status s) {
    switch (s) {
    case PP_OK: return "ok";
    case PP_ERR_INVALID: return "invalid argument";
    case PP_ERR_NOMEM: return "out of memory";
    case PP_ERR_IO: return "I/O error";
    case PP_ERR_PARSE: return "parse error";
    case PP_ERR_UNSUPPORTED: return "unsupported";
    case PP_ERR_SHAPE: return "shape error";
    case PP_ERR_NOT_FOUND: return "not found";
    case PP_ERR_TIMEOUT: return "timeout";
    case PP_ERR_PEER: return "peer error";
    case PP_ERR_STATE: return "bad state";
    case PP_ERR_INTERNAL: return "internal error";
    }
    return "unknown error";
}

const char *pp_last_error(void) { return last_error; }

void pp_error_clear(void) { last_error[0] = '\0'; }

pp_status pp_error(pp_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

pp_status pp_error_context(pp_status code, const char *fmt, ...) {
    char prefix[512];
    char old[PP_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    /* Build "prefix: old" by hand; snprintf would warn about truncation. */
    size_t n = strlen(prefix);
    memcpy(last_error, prefix, n);
    if (n + 2 < sizeof last_error) {
        last_error[n++] = ':';
        last_error[n++] = ' ';
    }
    size_t rest = strnlen(old, sizeof old - 1);
    if (rest > sizeof last_error - 1 - n) rest = sizeof last_error - 1 - n;
    memcpy(last_error + n, old, rest);
    last_error[n + rest] = '\0';
    return code;
}

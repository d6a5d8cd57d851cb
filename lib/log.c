/* Logging with a replaceable handler; stderr by default. */
#include "pippin/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log_internal.h"
static atomic_int current_level = -1; /* -1: not read from the environment yet */
static pp_log_handler handler_fn;
static void *handler_user;

static const char *level_names[] = {"debug", "info", "warn", "error", "off"};

static pp_log_level level_from_env(void) {
    const char *s = getenv("PIPPIN_LOG");
    if (s)
        for (int i = 0; i <= PP_LOG_OFF; i++)
            if (strcmp(s, level_names[i]) == 0) return (pp_log_level)i;
    return PP_LOG_WARN;
}

void pp_log_set_level(pp_log_level level) { atomic_store(&current_level, (int)level); }

pp_log_level pp_log_get_level(void) {
    int lvl = atomic_load(&current_level);
    if (lvl < 0) {
        lvl = (int)level_from_env();
        atomic_store(&current_level, lvl);
    }
    return (pp_log_level)lvl;
}

void pp_log_set_handler(pp_log_handler handler, void *user) {
    handler_fn = handler;
    handler_user = user;
}

void pp_log(pp_log_level level, const char *fmt, ...) {
    if (level < pp_log_get_level() || level >= PP_LOG_OFF) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (handler_fn) {
        handler_fn(level, msg, handler_user);
        return;
    }
    fprintf(stderr, "pippin %s: %s\n", level_names[level], msg);
}

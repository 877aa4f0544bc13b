/* common/log.c - the process-wide log hook.  Library code logs, programs print. */
#include "common/common.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static tp_log_fn g_hook;
static void *g_hook_user;
static enum tp_log_level g_level = TP_LOG_INFO;

void tp_log_set_hook(tp_log_fn fn, void *user)
{
    g_hook = fn;
    g_hook_user = user;
}

void tp_log_set_level(enum tp_log_level level) { g_level = level; }
enum tp_log_level tp_log_get_level(void) { return g_level; }

const char *tp_log_level_str(enum tp_log_level level)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    _Static_assert(TP_ARRAY_LEN(names) == TP_LOG_LEVEL_COUNT, "log names out of sync");
    return (unsigned)level < TP_LOG_LEVEL_COUNT ? names[level] : "?";
}

enum tp_status tp_log_level_parse(const char *s, enum tp_log_level *out)
{
    for (int i = 0; i < TP_LOG_LEVEL_COUNT; i++) {
        if (s && strcasecmp(s, tp_log_level_str((enum tp_log_level)i)) == 0) {
            *out = (enum tp_log_level)i;
            return TP_OK;
        }
    }
    return TP_ERR_INVALID_ARG;
}

void tp_logv(enum tp_log_level level, const char *module, const char *fmt, va_list ap)
{
    if (!g_hook || level < g_level) return;
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    g_hook(level, module ? module : "-", line, g_hook_user);
}

void tp_log(enum tp_log_level level, const char *module, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tp_logv(level, module, fmt, ap);
    va_end(ap);
}

void tp_log_stderr_hook(enum tp_log_level level, const char *module, const char *msg, void *user)
{
    char line[2300];
    const char *prefix = user ? (const char *)user : "";
    snprintf(line, sizeof line, "%s%s[%s] %s: %s\n", prefix, *prefix ? " " : "", tp_log_level_str(level),
             module, msg);
    fputs(line, stderr);
}

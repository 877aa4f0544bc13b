/* common/status.c - status names, error buffers and invariant failures. */
#include "common/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[] = {
    [TP_OK] = "ok",
    [TP_ERR_INVALID_ARG] = "invalid argument",
    [TP_ERR_NOMEM] = "out of memory",
    [TP_ERR_IO] = "I/O error",
    [TP_ERR_FORMAT] = "malformed input",
    [TP_ERR_UNSUPPORTED] = "unsupported",
    [TP_ERR_NOT_BUILT] = "not built with this feature",
    [TP_ERR_TIMEOUT] = "timeout",
    [TP_ERR_PEER] = "peer failure",
    [TP_ERR_PROTOCOL] = "protocol error",
    [TP_ERR_POISONED] = "handle poisoned by an earlier failure",
    [TP_ERR_CANCELLED] = "cancelled",
    [TP_ERR_FULL] = "full",
    [TP_ERR_NOT_FOUND] = "not found",
    [TP_ERR_INTERNAL] = "internal error",
    [TP_ERR_INIT] = "initialisation failed",
    [TP_ERR_DENIED] = "access denied",
    [TP_ERR_TOO_LARGE] = "too large",
    [TP_ERR_BUSY] = "busy",
    [TP_ERR_NOT_ALLOWED] = "not allowed",
};
_Static_assert(TP_ARRAY_LEN(status_names) == TP_STATUS_COUNT, "status_names out of sync");

const char *tp_status_str(enum tp_status st)
{
    if ((unsigned)st >= TP_STATUS_COUNT) return "unknown status";
    return status_names[st];
}

static enum tp_status error_vset(struct tp_error *err, enum tp_status st, const char *fmt, va_list ap)
{
    if (!err) return st;
    err->status = st;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return st;
}

enum tp_status tp_error_set(struct tp_error *err, enum tp_status st, const char *fmt, ...)
{
    if (!err || err->status != TP_OK) return st;
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, st, fmt, ap);
    va_end(ap);
    return st;
}

enum tp_status tp_error_force(struct tp_error *err, enum tp_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, st, fmt, ap);
    va_end(ap);
    return st;
}

void tp_error_clear(struct tp_error *err)
{
    if (!err) return;
    err->status = TP_OK;
    err->msg[0] = '\0';
}

const char *tp_error_msg(const struct tp_error *err)
{
    return err ? err->msg : "";
}

_Noreturn void tp_assert_fail(const char *expr, const char *file, int line)
{
    tp_log(TP_LOG_ERROR, "assert", "%s:%d: invariant violated: %s", file, line, expr);
    /* Last resort: the hook may be gone; stderr is always there. */
    fprintf(stderr, "tpserve: internal error at %s:%d: %s\n", file, line, expr);
    abort();
}

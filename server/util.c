/*
 * server/util.c - small helpers shared by the server files: a growable byte
 * buffer, UTF-8 validation, request errors and SSE framing.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server_impl.h"

/* ------------------------------------------------------------ tp_buf */

static enum tp_status buf_reserve(struct tp_buf *b, size_t extra)
{
    size_t need;
    if (tp_add_size(b->len, extra, &need) != 0 || tp_add_size(need, 1, &need) != 0) return TP_ERR_NOMEM;
    if (need <= b->cap) return TP_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return TP_ERR_NOMEM;
        cap *= 2;
    }
    char *d = realloc(b->data, cap);
    if (!d) return TP_ERR_NOMEM;
    b->data = d;
    b->cap = cap;
    return TP_OK;
}

enum tp_status tp_buf_append(struct tp_buf *b, const char *s, size_t n)
{
    if (buf_reserve(b, n) != TP_OK) return TP_ERR_NOMEM;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return TP_OK;
}

enum tp_status tp_buf_puts(struct tp_buf *b, const char *s) { return tp_buf_append(b, s, strlen(s)); }

enum tp_status tp_buf_printf(struct tp_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return TP_ERR_INVALID_ARG;
    if (buf_reserve(b, (size_t)n) != TP_OK) return TP_ERR_NOMEM;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return TP_OK;
}

void tp_buf_free(struct tp_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ------------------------------------------------------------ UTF-8 */

int tp_srv_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return 0;
        if (i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += (size_t)len;
    }
    return 1;
}

/* ------------------------------------------------------------ errors */

enum tp_status tp_api_err(struct tp_api_error *e, enum tp_status st, const char *param, const char *fmt, ...)
{
    e->status = st;
    e->code = NULL;
    e->n_prompt_tokens = e->n_max_tokens = e->n_ctx = 0;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return st;
}

enum tp_status tp_api_err_from(struct tp_api_error *e, const struct tp_error *err)
{
    enum tp_status st = err->status != TP_OK ? err->status : TP_ERR_INTERNAL;
    return tp_api_err(e, st, NULL, "%s", err->msg[0] ? err->msg : tp_status_str(st));
}

/* ------------------------------------------------------------ SSE */

enum tp_status tp_sse_data(struct tp_buf *b, const char *json)
{
    /* JSON from cJSON_PrintUnformatted never contains a raw newline, so one
     * data: line carries the whole event. */
    if (tp_buf_puts(b, "data: ") || tp_buf_puts(b, json) || tp_buf_puts(b, "\n\n")) return TP_ERR_NOMEM;
    return TP_OK;
}

enum tp_status tp_sse_done(struct tp_buf *b) { return tp_buf_puts(b, "data: [DONE]\n\n"); }

enum tp_status tp_sse_comment(struct tp_buf *b, const char *text)
{
    if (tp_buf_puts(b, ": ") || tp_buf_puts(b, text) || tp_buf_puts(b, "\n\n")) return TP_ERR_NOMEM;
    return TP_OK;
}

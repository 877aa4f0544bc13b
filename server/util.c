/*
 * server/util.c - small helpers shared by the server files: a growable byte
 * buffer, UTF-8 validation, OpenAI-shaped error bodies and SSE framing.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server_impl.h"

/* ------------------------------------------------------------ tp_buf */

static int buf_reserve(struct tp_buf *b, size_t extra)
{
    size_t need;
    if (tp_add_size(b->len, extra, &need) != 0 || tp_add_size(need, 1, &need) != 0) return -1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    char *d = realloc(b->data, cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

int tp_buf_append(struct tp_buf *b, const char *s, size_t n)
{
    if (buf_reserve(b, n) != 0) return -1;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int tp_buf_puts(struct tp_buf *b, const char *s) { return tp_buf_append(b, s, strlen(s)); }

int tp_buf_printf(struct tp_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || buf_reserve(b, (size_t)n) != 0) return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
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

int tp_api_fail(struct tp_api_error *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    switch (status) {
    case 401: e->type = "invalid_request_error"; e->code = "invalid_api_key"; break;
    case 404: e->type = "invalid_request_error"; e->code = "not_found"; break;
    case 405: e->type = "invalid_request_error"; e->code = "method_not_allowed"; break;
    case 413: e->type = "invalid_request_error"; e->code = "request_too_large"; break;
    case 429: e->type = "rate_limit_error"; e->code = "rate_limit_exceeded"; break;
    case 500: e->type = "server_error"; e->code = "internal_error"; break;
    case 503: e->type = "server_error"; e->code = "service_unavailable"; break;
    default: e->type = "invalid_request_error"; e->code = NULL; break;
    }
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

char *tp_api_error_json(const struct tp_api_error *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    char *out = NULL;
    if (!o) goto out;
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    out = tp_json_print(root); /* user text quoted in messages may hold NUL (C0 80) */
out:
    cJSON_Delete(root);
    return out;
}

/* ------------------------------------------------------------ SSE */

int tp_sse_data(struct tp_buf *b, const char *json)
{
    /* JSON from cJSON_PrintUnformatted never contains a raw newline, so one
     * data: line carries the whole event. */
    if (tp_buf_puts(b, "data: ") || tp_buf_puts(b, json) || tp_buf_puts(b, "\n\n")) return -1;
    return 0;
}

int tp_sse_done(struct tp_buf *b) { return tp_buf_puts(b, "data: [DONE]\n\n"); }

int tp_sse_comment(struct tp_buf *b, const char *text)
{
    if (tp_buf_puts(b, ": ") || tp_buf_puts(b, text) || tp_buf_puts(b, "\n\n")) return -1;
    return 0;
}

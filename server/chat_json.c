/*
 * server/chat_json.c - Jinja's tojson filter as @huggingface/jinja writes it,
 * for the chat templates that print tools and call arguments.
 *
 * The reference prints Python-style separators (", " and ": "), numbers as
 * JavaScript's Number.prototype.toString (1.0 -> 1, 1e21 -> 1e+21, 1e-7 ->
 * 1e-7, shortest digits that read back to the same double), strings as
 * JSON.stringify escapes them (", \, \b \f \n \r \t, other control bytes as
 * \u00XX, everything else as is), and with an indent one member per line
 * with empty objects and arrays kept as {} and [].
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat_impl.h"

/* d as JavaScript's Number::toString(10) writes it (ECMA-262 7.1.12.1). */
static void js_number(double d, char *out, size_t cap)
{
    if (isnan(d) || isinf(d)) {
        snprintf(out, cap, "null"); /* JSON.stringify */
        return;
    }
    if (d == 0) {
        snprintf(out, cap, "0");
        return;
    }
    char sci[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, d);
        if (strtod(sci, NULL) == d) break;
    }
    /* sci: [-]D[.DDD]e[+-]XX -> digits, exponent */
    const char *q = sci;
    int neg = *q == '-';
    if (neg) q++;
    char dig[24];
    int k = 0;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') dig[k++] = *q;
    while (k > 1 && dig[k - 1] == '0') k--;
    dig[k] = '\0';
    int n = atoi(q + 1) + 1; /* value = 0.dig x 10^n */
    size_t w = 0;
#define OUT(c)                        \
    do {                              \
        if (w + 1 < cap) out[w++] = (c); \
    } while (0)
    if (neg) OUT('-');
    if (k <= n && n <= 21) {
        for (int i = 0; i < k; i++) OUT(dig[i]);
        for (int i = k; i < n; i++) OUT('0');
    } else if (0 < n && n <= 21) {
        for (int i = 0; i < n; i++) OUT(dig[i]);
        OUT('.');
        for (int i = n; i < k; i++) OUT(dig[i]);
    } else if (-6 < n && n <= 0) {
        OUT('0');
        OUT('.');
        for (int i = 0; i < -n; i++) OUT('0');
        for (int i = 0; i < k; i++) OUT(dig[i]);
    } else {
        OUT(dig[0]);
        if (k > 1) {
            OUT('.');
            for (int i = 1; i < k; i++) OUT(dig[i]);
        }
        char e[16];
        snprintf(e, sizeof e, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
        for (const char *x = e; *x; x++) OUT(*x);
    }
#undef OUT
    out[w] = '\0';
}

static int js_string(const char *s, struct tp_buf *o)
{
    if (tp_buf_puts(o, "\"")) return -1;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        const char *e = NULL;
        switch (*p) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                e = esc;
            } else if (p[0] == 0xC0 && p[1] == 0x80) { /* tree-form NUL */
                e = "\\u0000";
                p++;
            }
        }
        if (e ? tp_buf_puts(o, e) : tp_buf_append(o, (const char *)p, 1)) return -1;
    }
    return tp_buf_puts(o, "\"");
}

static int indent_to(struct tp_buf *o, int indent, int level)
{
    if (tp_buf_puts(o, "\n")) return -1;
    for (int i = 0; i < indent * level; i++)
        if (tp_buf_puts(o, " ")) return -1;
    return 0;
}

static int tojson(const cJSON *v, int indent, int level, struct tp_buf *o)
{
    if (!v || cJSON_IsNull(v)) return tp_buf_puts(o, "null");
    if (cJSON_IsTrue(v)) return tp_buf_puts(o, "true");
    if (cJSON_IsFalse(v)) return tp_buf_puts(o, "false");
    if (cJSON_IsNumber(v)) {
        char num[48];
        js_number(v->valuedouble, num, sizeof num);
        return tp_buf_puts(o, num);
    }
    if (cJSON_IsString(v)) return js_string(v->valuestring, o);
    int obj = cJSON_IsObject(v);
    if (!obj && !cJSON_IsArray(v)) return tp_buf_puts(o, "null");
    if (tp_buf_puts(o, obj ? "{" : "[")) return -1;
    int first = 1;
    for (const cJSON *c = v->child; c; c = c->next) {
        if (!first && tp_buf_puts(o, indent > 0 ? "," : ", ")) return -1;
        first = 0;
        if (indent > 0 && indent_to(o, indent, level + 1)) return -1;
        if (obj && (js_string(c->string ? c->string : "", o) || tp_buf_puts(o, ": "))) return -1;
        if (tojson(c, indent, level + 1, o)) return -1;
    }
    if (!first && indent > 0 && indent_to(o, indent, level)) return -1;
    return tp_buf_puts(o, obj ? "}" : "]");
}

enum tp_status tp_chat_tojson(const cJSON *v, int indent, struct tp_buf *out)
{
    return tojson(v, indent, 0, out) == 0 ? TP_OK : TP_ERR_NOMEM;
}

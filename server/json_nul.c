/*
 * server/json_nul.c - JSON strings that may hold NUL, on top of cJSON, whose
 * strings are NUL-terminated.  Inside the server's cJSON trees U+0000 is
 * the two bytes C0 80 ("modified UTF-8"; C0 never occurs in valid UTF-8):
 * tp_json_parse rewrites each \u0000 escape to C0 80 before parsing,
 * tp_json_bytes reads a value back as bytes with real NULs, and
 * tp_json_print writes each C0 80 as \u0000.  The contracts are in
 * server_impl.h.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server_impl.h"

#define NUL_HI 0xC0 /* C0 80: U+0000 inside cJSON strings */
#define NUL_LO 0x80

/* Rewrite each \u0000 escape of body[0..len) to C0 80 (other escapes are
 * copied as they are; "\\u0000" is an escaped backslash and stays).  out
 * has room for len bytes + NUL.  Returns the new length. */
static size_t rewrite_nul_escapes(const char *body, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        if (body[i] != '\\' || i + 1 >= len) {
            out[o++] = body[i++];
            continue;
        }
        if (body[i + 1] == 'u' && i + 6 <= len && memcmp(body + i + 2, "0000", 4) == 0) {
            out[o++] = (char)NUL_HI;
            out[o++] = (char)NUL_LO;
            i += 6;
            continue;
        }
        out[o++] = body[i++];
        out[o++] = body[i++];
    }
    out[o] = '\0';
    return o;
}

/* Offset in the original body of offset off of the rewritten text (each
 * C0 80 before it stood for the 6 bytes of \u0000). */
static size_t original_offset(const char *text, size_t off)
{
    size_t extra = 0;
    for (size_t i = 0; i + 1 < off; i++)
        if ((unsigned char)text[i] == NUL_HI && (unsigned char)text[i + 1] == NUL_LO) extra += 4;
    return off + extra;
}

struct cJSON *tp_json_parse(const char *body, size_t len, struct tp_api_error *e)
{
    if (len == 0) {
        tp_api_err(e, TP_ERR_FORMAT, NULL, "the request body is empty; send a JSON object");
        return NULL;
    }
    if (!tp_srv_utf8_valid(body, len)) {
        tp_api_err(e, TP_ERR_FORMAT, NULL, "the request body is not valid UTF-8");
        return NULL;
    }
    const char *raw_nul = memchr(body, '\0', len);
    if (raw_nul) {
        tp_api_err(e, TP_ERR_FORMAT, NULL, "the request body has a raw NUL byte at byte %zu; inside a JSON string write it "
                                  "as \\u0000", (size_t)(raw_nul - body));
        return NULL;
    }
    char *text = malloc(len + 1);
    if (!text) {
        tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        return NULL;
    }
    size_t n = rewrite_nul_escapes(body, len, text);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!root) {
        size_t off = end ? (size_t)(end - text) : 0;
        tp_api_err(e, TP_ERR_FORMAT, NULL, "the request body is not valid JSON (error near byte %zu)",
                   original_offset(text, off));
        free(text);
        return NULL;
    }
    while (end && end < text + n && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')) end++;
    if (end && end < text + n) {
        tp_api_err(e, TP_ERR_FORMAT, NULL, "the request body has extra data after the JSON value (byte %zu)",
                   original_offset(text, (size_t)(end - text)));
        cJSON_Delete(root);
        root = NULL;
    } else if (!cJSON_IsObject(root)) {
        tp_api_err(e, TP_ERR_FORMAT, NULL, "the request body must be a JSON object");
        cJSON_Delete(root);
        root = NULL;
    }
    free(text);
    return root;
}

size_t tp_json_decode_nul(char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)s[i] == NUL_HI && i + 1 < n && (unsigned char)s[i + 1] == NUL_LO) {
            s[o++] = '\0';
            i++;
        } else {
            s[o++] = s[i];
        }
    }
    if (o < n) s[o] = '\0';
    return o;
}

enum tp_status tp_json_bytes(const struct cJSON *v, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    const char *s = cJSON_IsString(v) && v->valuestring ? v->valuestring : "";
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (!d) return TP_ERR_NOMEM;
    memcpy(d, s, n + 1);
    *len = tp_json_decode_nul(d, n);
    *out = d;
    return TP_OK;
}

int tp_json_has_nul(const char *s) { return s && strstr(s, "\xC0\x80") != NULL; }

enum tp_status tp_json_encode_bytes(const char *s, size_t n, struct tp_buf *out)
{
    size_t i = 0;
    while (i < n) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == 0) {
            if (tp_buf_append(out, "\xC0\x80", 2) != TP_OK) return TP_ERR_NOMEM;
            i++;
            continue;
        }
        size_t cl = ch < 0x80 ? 1 : (ch & 0xE0) == 0xC0 ? 2 : (ch & 0xF0) == 0xE0 ? 3 : (ch & 0xF8) == 0xF0 ? 4 : 0;
        if (cl && i + cl <= n && tp_srv_utf8_valid(s + i, cl)) {
            if (tp_buf_append(out, s + i, cl) != TP_OK) return TP_ERR_NOMEM;
            i += cl;
        } else {
            if (tp_buf_append(out, "\xEF\xBF\xBD", 3) != TP_OK) return TP_ERR_NOMEM;
            i++;
        }
    }
    return tp_buf_append(out, "", 0);
}

struct cJSON *tp_json_string_bytes(const char *s, size_t n)
{
    struct tp_buf b = {0};
    cJSON *item = NULL;
    if (tp_json_encode_bytes(s, n, &b) == TP_OK) item = cJSON_CreateString(b.data ? b.data : "");
    tp_buf_free(&b);
    return item;
}

enum tp_status tp_json_add_bytes(struct cJSON *obj, const char *key, const char *s, size_t n)
{
    cJSON *item = tp_json_string_bytes(s, n);
    if (!item) return TP_ERR_NOMEM;
    if (!cJSON_AddItemToObject(obj, key, item)) {
        cJSON_Delete(item);
        return TP_ERR_NOMEM;
    }
    return TP_OK;
}

char *tp_json_print(const struct cJSON *root)
{
    char *json = cJSON_PrintUnformatted(root);
    if (!json || !strchr(json, (char)NUL_HI)) return json;
    size_t n = strlen(json), k = 0;
    for (size_t i = 0; i < n; i++) k += (unsigned char)json[i] == NUL_HI;
    char *out = malloc(n + 4 * k + 1); /* C0 80 (2) -> \u0000 (6); a lone C0 -> U+FFFD (3) */
    if (!out) {
        free(json);
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)json[i] != NUL_HI) {
            out[o++] = json[i];
        } else if (i + 1 < n && (unsigned char)json[i + 1] == NUL_LO) {
            memcpy(out + o, "\\u0000", 6);
            o += 6;
            i++;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
    }
    out[o] = '\0';
    free(json);
    return out;
}

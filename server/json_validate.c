/*
 * server/json_validate.c - parse and validate the JSON body of
 * /v1/completions and /v1/chat/completions into struct tp_req_params.
 *
 * Rules: the body must be valid UTF-8 and a JSON object (tp_json_parse:
 * \u0000 stays a NUL in the prompt and stop strings, chat contents keep it
 * in tree form, role and model names refuse it); unknown fields are ignored;
 * OpenAI fields that would change the output but are not implemented are
 * refused (docs/api-fields.md); a field that is present with JSON null
 * counts as absent; a field of the wrong type or out of range is refused
 * with 400 naming the field (OpenAI's "param").  Ranges follow OpenAI's
 * documentation where it has one.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/json_field.h"
#include "server_impl.h"

static const cJSON *field(const cJSON *root, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static enum tp_status get_number(const cJSON *root, const char *name, double lo, double hi, float *out,
                      struct tp_api_error *e)
{
    const cJSON *v = field(root, name);
    if (!v) return TP_OK;
    if (!cJSON_IsNumber(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, name, "'%s' must be a number", name);
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi))
        return tp_api_err(e, TP_ERR_INVALID_ARG, name, "'%s' is %g; it must be between %g and %g", name, d, lo, hi);
    *out = (float)d;
    return TP_OK;
}

static int is_integer(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && floor(v->valuedouble) == v->valuedouble;
}

static enum tp_status get_int(const cJSON *root, const char *name, double lo, double hi, int *out, struct tp_api_error *e)
{
    enum tp_status st = tp_json_field_int(root, name, lo, hi, out);
    if (st == TP_OK || st == TP_ERR_NOT_FOUND) return TP_OK;
    if (st == TP_ERR_FORMAT) return tp_api_err(e, TP_ERR_INVALID_ARG, name, "'%s' must be an integer", name);
    return tp_api_err(e, TP_ERR_INVALID_ARG, name, "'%s' is %.0f; it must be between %.0f and %.0f", name,
                      field(root, name)->valuedouble, TP_MAX(lo, (double)INT_MIN), TP_MIN(hi, (double)INT_MAX));
}

static enum tp_status get_bool(const cJSON *root, const char *name, int *out, struct tp_api_error *e)
{
    enum tp_status st = tp_json_field_bool(root, name, out);
    if (st == TP_OK || st == TP_ERR_NOT_FOUND) return TP_OK;
    return tp_api_err(e, TP_ERR_INVALID_ARG, name, "'%s' must be a boolean", name);
}

static enum tp_status parse_token_list(const cJSON *arr, int n_vocab, const char *param, struct tp_req_params *p,
                            struct tp_api_error *e)
{
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' is an empty list of tokens", param);
    p->prompt_ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!p->prompt_ids) return tp_api_err(e, TP_ERR_NOMEM, param, "out of memory");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, arr)
    {
        if (!is_integer(t) || t->valuedouble < 0 || t->valuedouble >= n_vocab)
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s'[%d] is not a token id in [0, %d)", param, i, n_vocab);
        p->prompt_ids[i++] = (int32_t)t->valuedouble;
    }
    p->n_prompt_ids = n;
    return TP_OK;
}

static enum tp_status parse_prompt(const cJSON *root, int n_vocab, struct tp_req_params *p, struct tp_api_error *e)
{
    const cJSON *v = field(root, "prompt");
    if (!v) return tp_api_err(e, TP_ERR_INVALID_ARG, "prompt", "'prompt' is required (a string, or a list of token ids)");
    if (cJSON_IsString(v))
        return tp_json_bytes(v, &p->prompt, &p->prompt_len) == 0 ? TP_OK : tp_api_err(e, TP_ERR_NOMEM, "prompt", "out of memory");
    if (!cJSON_IsArray(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "prompt", "'prompt' must be a string or a list");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return tp_api_err(e, TP_ERR_INVALID_ARG, "prompt", "'prompt' is an empty list");
    const cJSON *first = cJSON_GetArrayItem(v, 0);
    if (cJSON_IsNumber(first)) return parse_token_list(v, n_vocab, "prompt", p, e);
    if (n != 1)
        return tp_api_err(e, TP_ERR_INVALID_ARG, "prompt", "'prompt' lists %d prompts; this server takes one prompt per request", n);
    if (cJSON_IsString(first))
        return tp_json_bytes(first, &p->prompt, &p->prompt_len) == TP_OK ? TP_OK
                                                                      : tp_api_err(e, TP_ERR_NOMEM, "prompt", "out of memory");
    if (cJSON_IsArray(first)) return parse_token_list(first, n_vocab, "prompt", p, e);
    return tp_api_err(e, TP_ERR_INVALID_ARG, "prompt", "'prompt' must be a string, a list of strings or a list of token ids");
}

/* content: a string, or a list of {"type": "text", "text": ...} parts, joined as llama-server joins them
 * (common_chat_msgs_to_json_oaicompat): a newline before each part when the text so far is not empty.
 * Any other part type (image_url, input_audio, file, ...) is refused naming it. */
static enum tp_status parse_content(const cJSON *c, int idx, int allow_null, char **out, struct tp_api_error *e)
{
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", idx);
    if (!c || cJSON_IsNull(c)) {
        if (!allow_null) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' is required", param);
        *out = strdup("");
        return *out ? TP_OK : tp_api_err(e, TP_ERR_NOMEM, param, "out of memory");
    }
    if (cJSON_IsString(c)) {
        *out = strdup(c->valuestring);
        return *out ? TP_OK : tp_api_err(e, TP_ERR_NOMEM, param, "out of memory");
    }
    if (!cJSON_IsArray(c)) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' must be a string or a list of text parts", param);
    struct tp_buf b = {0};
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c)
    {
        char pp[64];
        snprintf(pp, sizeof pp, "%s[%d]", param, k);
        const cJSON *type = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
        const cJSON *text = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
        enum tp_status st = TP_OK;
        if (!cJSON_IsString(type)) {
            st = tp_api_err(e, TP_ERR_INVALID_ARG, pp, "'%s' must be a content part {\"type\": \"text\", \"text\": \"...\"}",
                            pp);
        } else if (strcmp(type->valuestring, "text") != 0) {
            st = tp_api_err(e, TP_ERR_INVALID_ARG, pp, "'%s' is a content part of type '%.40s'; this server takes text "
                            "parts only (the served model reads no images, audio or files)", pp, type->valuestring);
        } else if (!cJSON_IsString(text)) {
            st = tp_api_err(e, TP_ERR_INVALID_ARG, pp, "'%s'.text must be a string", pp);
        } else if ((b.len > 0 && tp_buf_puts(&b, "\n") != TP_OK) || tp_buf_puts(&b, text->valuestring) != TP_OK) {
            st = tp_api_err(e, TP_ERR_NOMEM, param, "out of memory");
        }
        if (st != TP_OK) {
            tp_buf_free(&b);
            return st;
        }
        k++;
    }
    *out = b.data ? b.data : strdup("");
    return *out ? TP_OK : tp_api_err(e, TP_ERR_NOMEM, param, "out of memory");
}

/* messages[i].tool_calls[k]: {"id", "type": "function", "function": {"name", "arguments": JSON text}} into *c. */
static enum tp_status parse_history_call(const cJSON *tc, int i, int k, struct tp_chat_call *c, struct tp_api_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%d].tool_calls[%d]", i, k);
    const cJSON *fn = cJSON_IsObject(tc) ? field(tc, "function") : NULL;
    const cJSON *ty = cJSON_IsObject(tc) ? field(tc, "type") : NULL, *id = cJSON_IsObject(tc) ? field(tc, "id") : NULL;
    const cJSON *name = cJSON_IsObject(fn) ? field(fn, "name") : NULL, *args = cJSON_IsObject(fn) ? field(fn, "arguments") : NULL;
    if (!cJSON_IsObject(fn) || (ty && !(cJSON_IsString(ty) && strcmp(ty->valuestring, "function") == 0)) ||
        !cJSON_IsString(name) || (id && !cJSON_IsString(id)))
        return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' must be {\"id\": \"...\", \"type\": \"function\", \"function\": "
                                          "{\"name\": \"...\", \"arguments\": \"{...}\"}}", param);
    if (tp_json_has_nul(name->valuestring) || (id && tp_json_has_nul(id->valuestring)))
        return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' holds a NUL character (\\u0000) in its name or id", param);
    cJSON *a = NULL;
    if (cJSON_IsString(args)) {
        a = cJSON_Parse(args->valuestring);
        if (!a)
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s'.function.arguments is not valid JSON text: '%.60s'", param,
                               args->valuestring);
    } else if (args) {
        a = cJSON_Duplicate(args, 1);
    } else {
        a = cJSON_CreateObject();
    }
    if (!a) return tp_api_err(e, TP_ERR_NOMEM, param, "out of memory");
    c->arguments = a;
    c->name = strdup(name->valuestring);
    c->id = strdup(id ? id->valuestring : "");
    if (!c->name || !c->id) return tp_api_err(e, TP_ERR_NOMEM, param, "out of memory");
    return TP_OK;
}

static enum tp_status parse_messages(const cJSON *root, struct tp_req_params *p, struct tp_api_error *e)
{
    const cJSON *v = field(root, "messages");
    if (!v) return tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "'messages' is required (a list of {role, content})");
    if (!cJSON_IsArray(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "'messages' must be a list");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "'messages' must contain at least one message");
    if (n > 4096) return tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "'messages' has %d entries (at most 4096)", n);
    p->msgs = calloc((size_t)n, sizeof *p->msgs);
    if (!p->msgs) return tp_api_err(e, TP_ERR_NOMEM, "messages", "out of memory");
    int n_calls = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, v)
    {
        const cJSON *tc = cJSON_IsObject(m) ? field(m, "tool_calls") : NULL;
        if (cJSON_IsArray(tc)) n_calls += cJSON_GetArraySize(tc);
    }
    if (n_calls > 4096) return tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "the messages hold %d tool calls (at most 4096)", n_calls);
    if (n_calls > 0 && !(p->calls = calloc((size_t)n_calls, sizeof *p->calls)))
        return tp_api_err(e, TP_ERR_NOMEM, "messages", "out of memory");
    int i = 0;
    cJSON_ArrayForEach(m, v)
    {
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' must be an object {role, content}", param);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role)) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' must be a string", param);
        const char *r = role->valuestring;
        if (tp_json_has_nul(r))
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' holds a NUL character (\\u0000); a role name cannot", param);
        if (strcmp(r, "developer") == 0) r = "system";
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 && strcmp(r, "tool") != 0)
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' is '%.40s'; supported roles are system, developer, user, "
                                              "assistant and tool", param, r);
        p->msgs[i].role = r[0] == 's' ? "system" : r[0] == 'u' ? "user" : r[0] == 't' ? "tool" : "assistant";
        const cJSON *fc = cJSON_GetObjectItemCaseSensitive(m, "function_call");
        if (fc && !cJSON_IsNull(fc)) {
            snprintf(param, sizeof param, "messages[%d].function_call", i);
            p->n_msgs = i;
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' (legacy function calling) is not supported; send 'tool_calls'", param);
        }
        const cJSON *tc = field(m, "tool_calls");
        if (tc) {
            snprintf(param, sizeof param, "messages[%d].tool_calls", i);
            p->n_msgs = i;
            if (r[0] != 'a') return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s': only assistant messages carry tool calls", param);
            if (!cJSON_IsArray(tc)) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' must be a list", param);
            p->msgs[i].calls = p->calls + p->n_calls;
            int k = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, tc)
            {
                enum tp_status st = parse_history_call(x, i, k, &p->calls[p->n_calls], e);
                if (st != TP_OK) {
                    p->n_calls++; /* freed with the rest */
                    return st;
                }
                p->n_calls++;
                k++;
            }
            p->msgs[i].n_calls = k;
        }
        p->msgs[i].tool_call_id = "";
        if (r[0] == 't') {
            const cJSON *id = field(m, "tool_call_id");
            snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
            if (id && (!cJSON_IsString(id) || tp_json_has_nul(id->valuestring))) {
                p->n_msgs = i;
                return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' must be a string (the id of the call answered)", param);
            }
            if (id && id->valuestring[0] && !(p->msgs[i].tool_call_id = strdup(id->valuestring))) {
                p->n_msgs = i;
                return tp_api_err(e, TP_ERR_NOMEM, param, "out of memory");
            }
        }
        char *content = NULL;
        int null_ok = r[0] == 'a';
        enum tp_status st = parse_content(cJSON_GetObjectItemCaseSensitive(m, "content"), i, null_ok, &content, e);
        if (st != TP_OK) {
            p->n_msgs = i + 1;
            return st;
        }
        p->msgs[i].content = content;
        p->n_msgs = i + 1; /* freed from here on */
        const cJSON *rc = field(m, "reasoning_content");
        if (rc) {
            snprintf(param, sizeof param, "messages[%d].reasoning_content", i);
            if (r[0] != 'a' || !cJSON_IsString(rc))
                return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' must be a string on an assistant message", param);
            if (!(p->msgs[i].reasoning = strdup(rc->valuestring)))
                return tp_api_err(e, TP_ERR_NOMEM, param, "out of memory");
        }
        i++;
    }
    return TP_OK;
}

static enum tp_status parse_stop(const cJSON *root, struct tp_req_params *p, struct tp_api_error *e)
{
    const cJSON *v = field(root, "stop");
    if (!v) return TP_OK;
    const cJSON *items[TP_MAX_STOP];
    int n = 0;
    if (cJSON_IsString(v)) {
        items[n++] = v;
    } else if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > TP_MAX_STOP)
            return tp_api_err(e, TP_ERR_INVALID_ARG, "stop", "'stop' has %d strings (at most %d)", cJSON_GetArraySize(v), TP_MAX_STOP);
        const cJSON *s;
        cJSON_ArrayForEach(s, v)
        {
            if (!cJSON_IsString(s)) return tp_api_err(e, TP_ERR_INVALID_ARG, "stop", "'stop' must be a string or a list of strings");
            items[n++] = s;
        }
    } else {
        return tp_api_err(e, TP_ERR_INVALID_ARG, "stop", "'stop' must be a string or a list of strings");
    }
    for (int i = 0; i < n; i++) {
        char *d = NULL;
        size_t l = 0;
        if (tp_json_bytes(items[i], &d, &l) != 0) return tp_api_err(e, TP_ERR_NOMEM, "stop", "out of memory");
        p->stop[i] = d;
        p->stop_len[i] = l;
        p->n_stop = i + 1;
        if (l == 0) return tp_api_err(e, TP_ERR_INVALID_ARG, "stop", "'stop' strings must not be empty");
        if (l > TP_MAX_STOP_BYTES)
            return tp_api_err(e, TP_ERR_INVALID_ARG, "stop", "a 'stop' string has %zu bytes (at most %d)", l, TP_MAX_STOP_BYTES);
    }
    return TP_OK;
}

/* ------------------------------------------------------------ seed */

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) i++;
    return i;
}

/* s[i] == '"': index after the closing quote. */
static size_t skip_string(const char *s, size_t i, size_t n)
{
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\') i++;
    return i < n ? i + 1 : n;
}

/* Index after the JSON value starting at s[i] (the text is known to be valid JSON). */
static size_t skip_value(const char *s, size_t i, size_t n)
{
    if (i < n && s[i] == '"') return skip_string(s, i, n);
    if (i < n && (s[i] == '{' || s[i] == '[')) {
        int depth = 0;
        while (i < n) {
            if (s[i] == '"') {
                i = skip_string(s, i, n);
                continue;
            }
            if (s[i] == '{' || s[i] == '[') depth++;
            else if ((s[i] == '}' || s[i] == ']') && --depth == 0) return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && !strchr(",}] \t\r\n", s[i])) i++;
    return i;
}

/* The text of the first top-level member named key of the JSON object in
 * body[0..len) (valid JSON, as cJSON has parsed it): *at, *n.  0 if absent. */
static int member_text(const char *body, size_t len, const char *key, const char **at, size_t *n)
{
    size_t i = skip_ws(body, 0, len);
    if (i >= len || body[i] != '{') return 0;
    i = skip_ws(body, i + 1, len);
    const size_t kl = strlen(key);
    while (i < len && body[i] == '"') {
        size_t ks = i, ke = skip_string(body, i, len);
        int match = ke - ks == kl + 2 && memcmp(body + ks + 1, key, kl) == 0;
        if (!match && memchr(body + ks, '\\', ke - ks)) { /* an escaped name: compare it decoded */
            cJSON *k = cJSON_ParseWithLength(body + ks, ke - ks);
            match = cJSON_IsString(k) && strcmp(k->valuestring, key) == 0;
            cJSON_Delete(k);
        }
        i = skip_ws(body, ke, len);
        if (i < len && body[i] == ':') i++;
        i = skip_ws(body, i, len);
        size_t vs = i;
        i = skip_value(body, i, len);
        if (match) {
            *at = body + vs;
            *n = i - vs;
            return 1;
        }
        i = skip_ws(body, i, len);
        if (i < len && body[i] == ',') i = skip_ws(body, i + 1, len);
    }
    return 0;
}

/* seed: any integer in [-2^63, 2^64 - 1] (a negative one is taken modulo 2^64).
 * cJSON keeps numbers as doubles, which hold integers exactly only up to
 * 2^53, so a seed written as plain digits is read from the body's text. */
static enum tp_status parse_seed(const cJSON *root, const char *body, size_t len, struct tp_req_params *p, struct tp_api_error *e)
{
    const cJSON *v = field(root, "seed");
    if (!v) return TP_OK;
    const char *range = "'seed' must be an integer from -9223372036854775808 to 18446744073709551615";
    if (!is_integer(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "seed", "%s", range);
    const char *t = NULL;
    size_t n = 0;
    char digits[32];
    if (member_text(body, len, "seed", &t, &n) && n > 0 && n < sizeof digits) {
        memcpy(digits, t, n);
        digits[n] = '\0';
        size_t d0 = digits[0] == '-';
        if (d0 < n && strspn(digits + d0, "0123456789") == n - d0) {
            errno = 0;
            char *end = NULL;
            if (d0) {
                long long x = strtoll(digits, &end, 10);
                if (errno || *end) return tp_api_err(e, TP_ERR_INVALID_ARG, "seed", "%s", range);
                p->seed = (uint64_t)x;
            } else {
                unsigned long long x = strtoull(digits, &end, 10);
                if (errno || *end) return tp_api_err(e, TP_ERR_INVALID_ARG, "seed", "%s", range);
                p->seed = (uint64_t)x;
            }
            p->has_seed = 1;
            return TP_OK;
        }
    }
    /* written with a fraction or an exponent (e.g. 1e3): the double's value */
    double d = v->valuedouble;
    if (!(d >= -9223372036854775808.0 && d < 18446744073709551616.0)) return tp_api_err(e, TP_ERR_INVALID_ARG, "seed", "%s", range);
    p->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    p->has_seed = 1;
    return TP_OK;
}

/* -------------------------------------------------- fields not implemented */

/* OpenAI fields that would change the output and are not implemented are
 * refused (TP_ERR_UNSUPPORTED, naming them); values that ask for the default behaviour
 * (echo false, best_of 1, n 1, suffix "", tools [], response_format text,
 * tool_choice / function_call "none" or "auto") are accepted. */
static enum tp_status refuse_unsupported(const cJSON *root, struct tp_api_error *e)
{
    const cJSON *v = field(root, "n");
    if (v) {
        if (!is_integer(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "n", "'n' must be an integer");
        if (v->valuedouble != 1)
            return tp_api_err(e, TP_ERR_UNSUPPORTED, "n", "'n' is %.0f; this server generates one choice per request (n = 1)",
                              v->valuedouble);
    }
    v = field(root, "best_of");
    if (v) {
        if (!is_integer(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "best_of", "'best_of' must be an integer");
        if (v->valuedouble != 1)
            return tp_api_err(e, TP_ERR_UNSUPPORTED, "best_of", "'best_of' is %.0f; this server generates one candidate per request "
                                                  "(best_of = 1)", v->valuedouble);
    }
    v = field(root, "echo");
    if (v && !(cJSON_IsBool(v) && !cJSON_IsTrue(v)))
        return tp_api_err(e, TP_ERR_UNSUPPORTED, "echo",
                          "'echo' is not supported (the prompt is not echoed); remove it or send false");
    v = field(root, "suffix");
    if (v && !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
        return tp_api_err(e, TP_ERR_UNSUPPORTED, "suffix", "'suffix' (insertion) is not supported; remove it");
    v = field(root, "functions");
    if (v && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0))
        return tp_api_err(e, TP_ERR_UNSUPPORTED, "functions", "'functions' (legacy function calling) is not supported; send 'tools'");
    v = field(root, "function_call");
    if (v && !(cJSON_IsString(v) && (strcmp(v->valuestring, "none") == 0 || strcmp(v->valuestring, "auto") == 0)))
        return tp_api_err(e, TP_ERR_UNSUPPORTED, "function_call", "'function_call' (legacy function calling) is not supported; send "
                                                    "'tool_choice'");
    v = field(root, "modalities");
    if (v) {
        const cJSON *m0 = cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 ? cJSON_GetArrayItem(v, 0) : NULL;
        if (!(cJSON_IsString(m0) && strcmp(m0->valuestring, "text") == 0))
            return tp_api_err(e, TP_ERR_UNSUPPORTED, "modalities", "'modalities' other than [\"text\"] is not supported; remove it");
    }
    static const char *const others[] = {"audio", "web_search_options"};
    for (int i = 0; i < 2; i++)
        if (field(root, others[i]))
            return tp_api_err(e, TP_ERR_UNSUPPORTED, others[i], "'%s' is not supported by this server; remove it", others[i]);
    return TP_OK;
}

/* ------------------------------------------------------- response_format */

/* response_format: {"type": "text"}, {"type": "json_object"} or
 * {"type": "json_schema", "json_schema": {"name": ..., "schema": {...},
 * "strict": bool, "description": ...}}; the last two compile the reply's
 * automaton (server/grammar.c), schemas outside the supported subset are
 * refused naming the keyword and where it is. */
static enum tp_status parse_response_format(const cJSON *root, struct tp_req_params *p, struct tp_api_error *e)
{
    const char *pn = "response_format";
    const cJSON *v = field(root, pn);
    if (!v) return TP_OK;
    const cJSON *ty = cJSON_IsObject(v) ? field(v, "type") : NULL;
    if (!cJSON_IsString(ty))
        return tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'response_format' must be an object with 'type': \"text\", \"json_object\" or "
                                       "\"json_schema\"");
    const cJSON *kv;
    cJSON_ArrayForEach(kv, v)
    {
        if (strcmp(kv->string, "type") != 0 && strcmp(kv->string, "json_schema") != 0)
            return tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'response_format' has an unknown field '%.60s'", kv->string);
    }
    if (strcmp(ty->valuestring, "text") == 0) {
        if (field(v, "json_schema")) return tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'response_format' text takes no json_schema");
        return TP_OK;
    }
    if (strcmp(ty->valuestring, "json_object") == 0) {
        if (field(v, "json_schema"))
            return tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'response_format' json_object takes no json_schema (use type json_schema)");
        if (tp_grammar_json_object(&p->grammar) != TP_OK) return tp_api_err(e, TP_ERR_NOMEM, pn, "out of memory");
        return TP_OK;
    }
    if (strcmp(ty->valuestring, "json_schema") != 0)
        return tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'response_format.type' is \"%.40s\"; want \"text\", \"json_object\" or "
                                       "\"json_schema\"", ty->valuestring);
    const cJSON *js = field(v, "json_schema");
    if (!cJSON_IsObject(js))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "response_format.json_schema",
                          "'response_format.json_schema' must be an object with 'name' and 'schema'");
    cJSON_ArrayForEach(kv, js)
    {
        static const char *const ok[] = {"name", "schema", "strict", "description"};
        int known = 0;
        for (int i = 0; i < 4; i++) known |= strcmp(kv->string, ok[i]) == 0;
        if (!known)
            return tp_api_err(e, TP_ERR_INVALID_ARG, "response_format.json_schema",
                              "'response_format.json_schema' has an unknown field '%.60s'", kv->string);
    }
    const cJSON *name = field(js, "name"), *strict = field(js, "strict"), *desc = field(js, "description");
    if (name && !cJSON_IsString(name))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "response_format.json_schema.name", "'response_format.json_schema.name' must be a string");
    if (strict && !cJSON_IsBool(strict))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "response_format.json_schema.strict",
                          "'response_format.json_schema.strict' must be a boolean");
    if (desc && !cJSON_IsString(desc))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "response_format.json_schema.description",
                          "'response_format.json_schema.description' must be a string");
    const cJSON *schema = field(js, "schema");
    if (!schema)
        return tp_api_err(e, TP_ERR_INVALID_ARG, "response_format.json_schema.schema", "'response_format.json_schema.schema' is missing");
    struct tp_error err = {0};
    enum tp_status st = tp_grammar_from_schema(schema, &p->grammar, &err);
    if (st == TP_ERR_NOMEM) return tp_api_err(e, TP_ERR_NOMEM, pn, "out of memory compiling the schema");
    if (st != TP_OK)
        return tp_api_err(e, st == TP_ERR_UNSUPPORTED ? st : TP_ERR_INVALID_ARG, "response_format.json_schema.schema", "'response_format.json_schema.schema': %s "
                          "(docs/structured-output.md lists the supported subset)", tp_error_msg(&err));
    return TP_OK;
}

/* ----------------------------------------------------------------- tools */

/* The schema of one call {"name": <const>, <akey>: <parameters>} appended to
 * calls; the parameters' $defs / definitions are hoisted into defs (the
 * wrapper's root) so their local $refs resolve.  0 or -1 (e filled). */
static enum tp_status tool_call_schema(const cJSON *fn, const char *akey, cJSON *calls, cJSON *defs, cJSON *definitions,
                            struct tp_api_error *e)
{
    const cJSON *name = field(fn, "name"), *params = field(fn, "parameters");
    cJSON *one = cJSON_CreateObject(), *props = NULL, *args = NULL;
    if (!one) return tp_api_err(e, TP_ERR_NOMEM, "tools", "out of memory");
    cJSON_AddItemToArray(calls, one);
    if (!akey) { /* name[ARGS]{...}: the name's bytes, then the arguments */
        cJSON_AddStringToObject(one, "x-raw-prefix", name->valuestring);
    } else {
        cJSON_AddStringToObject(one, "type", "object");
        props = cJSON_AddObjectToObject(one, "properties");
        cJSON *nm = cJSON_AddObjectToObject(props, "name");
        cJSON_AddStringToObject(nm, "const", name->valuestring);
    }
    if (params) {
        args = cJSON_Duplicate(params, 1);
    } else {
        args = cJSON_CreateObject();
        cJSON_AddStringToObject(args, "type", "object");
        cJSON_AddFalseToObject(args, "additionalProperties");
    }
    if (!args) return tp_api_err(e, TP_ERR_NOMEM, "tools", "out of memory");
    static const char *const dk[] = {"$defs", "definitions"};
    for (int k = 0; k < 2; k++) {
        cJSON *d = cJSON_DetachItemFromObjectCaseSensitive(args, dk[k]);
        cJSON *into = k ? definitions : defs;
        while (d && d->child) {
            cJSON *it = cJSON_DetachItemViaPointer(d, d->child);
            const cJSON *have = cJSON_GetObjectItemCaseSensitive(into, it->string);
            if (have && !cJSON_Compare(have, it, 1)) {
                cJSON_Delete(it);
                cJSON_Delete(d);
                cJSON_Delete(args);
                return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "two tools define %s '%.60s' differently; rename one", dk[k],
                                   have->string);
            }
            if (have) cJSON_Delete(it);
            else cJSON_AddItemToObject(into, it->string, it);
        }
        cJSON_Delete(d);
    }
    if (!akey) {
        cJSON_AddItemToObject(one, "x-then", args);
        return TP_OK;
    }
    cJSON_AddItemToObject(props, akey, args);
    cJSON *req = cJSON_AddArrayToObject(one, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(akey));
    cJSON_AddFalseToObject(one, "additionalProperties");
    return TP_OK;
}

/*
 * Compile the grammar of the calls to tools (only the one named, when
 * named): one call object {"name", <akey>} (anyOf over the tools), or with
 * array a JSON array of 1.. (1 when !parallel) such objects; akey NULL: the
 * name's bytes and then the arguments object (Mistral's name[ARGS]{...}).
 * 0, or -1 (e filled).
 */
static enum tp_status calls_grammar(const cJSON *tools, const char *named, const char *akey, int array, int parallel,
                         tp_grammar_t **out, struct tp_api_error *e)
{
    cJSON *wrap = cJSON_CreateObject(), *calls = NULL, *holder = wrap;
    if (wrap && array) {
        cJSON_AddStringToObject(wrap, "type", "array");
        holder = cJSON_AddObjectToObject(wrap, "items");
        cJSON_AddNumberToObject(wrap, "minItems", 1);
        if (!parallel) cJSON_AddNumberToObject(wrap, "maxItems", 1);
    }
    calls = holder ? cJSON_AddArrayToObject(holder, "anyOf") : NULL;
    cJSON *defs = cJSON_CreateObject(), *definitions = cJSON_CreateObject();
    enum tp_status rc = TP_OK;
    int found = 0;
    const cJSON *t;
    if (!calls || !defs || !definitions) {
        rc = tp_api_err(e, TP_ERR_NOMEM, "tools", "out of memory");
        goto out;
    }
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *fn = field(t, "function");
        if (named && strcmp(field(fn, "name")->valuestring, named) != 0) continue;
        found = 1;
        if ((rc = tool_call_schema(fn, akey, calls, defs, definitions, e)) != TP_OK) goto out;
    }
    if (!found) {
        rc = tp_api_err(e, TP_ERR_INVALID_ARG, "tool_choice", "'tool_choice' names '%.64s', which is not in 'tools'", named);
        goto out;
    }
    if (defs->child) cJSON_AddItemToObject(wrap, "$defs", defs), defs = NULL;
    if (definitions->child) cJSON_AddItemToObject(wrap, "definitions", definitions), definitions = NULL;
    struct tp_error err = {0};
    enum tp_status st = tp_grammar_from_tool_schema(wrap, out, &err);
    if (st == TP_ERR_NOMEM)
        rc = tp_api_err(e, TP_ERR_NOMEM, "tools", "out of memory compiling the tool schemas");
    else if (st != TP_OK)
        rc = tp_api_err(e, st == TP_ERR_UNSUPPORTED ? st : TP_ERR_INVALID_ARG, "tools",
                        "'tools' parameters: %s (docs/structured-output.md lists the supported subset)",
                        tp_error_msg(&err));
out:
    cJSON_Delete(wrap);
    cJSON_Delete(defs);
    cJSON_Delete(definitions);
    return rc;
}

/* tools / tool_choice / parallel_tool_calls.  tool_choice "required" or a
 * named function: the reply is one call {"name", "arguments"}, generated
 * under the function's parameters schema (p->grammar) and returned as
 * tool_calls.  "auto" (the default with tools): the tools are rendered into
 * the prompt and the model may answer in text or call tools in its family's
 * format; the grammar is built once the family is known
 * (tp_req_tools_grammar).  "none" (or no tools): plain text, the tools are
 * not shown to the model. */
static enum tp_status parse_tools(const cJSON *root, struct tp_req_params *p, struct tp_api_error *e)
{
    const cJSON *tools = field(root, "tools"), *choice = field(root, "tool_choice");
    const cJSON *ptc = field(root, "parallel_tool_calls");
    if (ptc && !cJSON_IsBool(ptc))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    p->parallel_tool_calls = !ptc || cJSON_IsTrue(ptc);
    if (tools && !cJSON_IsArray(tools))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "'tools' must be an array of {\"type\": \"function\", \"function\": {...}}");
    const int n = tools ? cJSON_GetArraySize(tools) : 0;
    if (n > 128) return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "'tools' lists %d functions (at most 128)", n);
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *ty = cJSON_IsObject(t) ? field(t, "type") : NULL, *fn = cJSON_IsObject(t) ? field(t, "function") : NULL;
        const cJSON *name = cJSON_IsObject(fn) ? field(fn, "name") : NULL;
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") != 0 || !cJSON_IsObject(fn))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "'tools'[%d] must be {\"type\": \"function\", \"function\": {\"name\", "
                                                "\"description\", \"parameters\"}}", i);
        if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 64 ||
            strspn(name->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") !=
                strlen(name->valuestring))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "'tools'[%d].function.name must be 1-64 characters of a-z, A-Z, 0-9, "
                                                "'_', '-', '.'", i);
        const cJSON *pa = field(fn, "parameters"), *st = field(fn, "strict"), *de = field(fn, "description");
        if (pa && !cJSON_IsObject(pa))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "'tools'[%d].function.parameters must be a JSON schema object", i);
        if ((st && !cJSON_IsBool(st)) || (de && !cJSON_IsString(de)))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "'tools'[%d].function: 'strict' must be a boolean and 'description' a "
                                                "string", i);
        i++;
    }
    const char *mode = "auto";
    const char *named = NULL;
    if (choice) {
        if (cJSON_IsString(choice) && (strcmp(choice->valuestring, "none") == 0 || strcmp(choice->valuestring, "auto") == 0 ||
                                       strcmp(choice->valuestring, "required") == 0)) {
            mode = choice->valuestring;
        } else {
            const cJSON *ty = cJSON_IsObject(choice) ? field(choice, "type") : NULL;
            const cJSON *fn = cJSON_IsObject(choice) ? field(choice, "function") : NULL;
            const cJSON *nm = cJSON_IsObject(fn) ? field(fn, "name") : NULL;
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") != 0 || !cJSON_IsString(nm))
                return tp_api_err(e, TP_ERR_INVALID_ARG, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                                          "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            mode = "named";
            named = nm->valuestring;
        }
    }
    if (n == 0) {
        if (strcmp(mode, "required") == 0 || named)
            return tp_api_err(e, TP_ERR_INVALID_ARG, "tool_choice", "'tool_choice' %s needs 'tools'", named ? "names a function but" : "\"required\"");
        return TP_OK;
    }
    if (strcmp(mode, "none") == 0) return TP_OK;
    if (p->grammar)
        return tp_api_err(e, TP_ERR_INVALID_ARG, "tool_choice", "tool calls (tool_choice \"%s\") and 'response_format' cannot be "
                                                  "combined; send tool_choice \"none\" or drop response_format",
                           named ? named : mode);
    if (!(p->tools = cJSON_Duplicate(tools, 1))) return tp_api_err(e, TP_ERR_NOMEM, "tools", "out of memory");
    if (strcmp(mode, "auto") == 0) {
        p->tool_auto = 1;
        return TP_OK;
    }
    enum tp_status st = calls_grammar(tools, named, "arguments", 0, 0, &p->grammar, e);
    if (st != TP_OK) return st;
    if (named && !(p->tool_name = strdup(named))) return tp_api_err(e, TP_ERR_NOMEM, "tool_choice", "out of memory");
    p->tool_call = 1;
    p->tool_format = TP_TOOL_FORMAT_JSON;
    return TP_OK;
}

enum tp_status tp_req_forced_name_args(struct tp_req_params *p, struct tp_api_error *e)
{
    if (!p->tool_call) return TP_OK;
    tp_grammar_t *g = NULL;
    enum tp_status st = calls_grammar(p->tools, p->tool_name, NULL, 0, 0, &g, e);
    if (st != TP_OK) return st;
    tp_grammar_free(p->grammar);
    p->grammar = g;
    p->tool_format = TP_TOOL_FORMAT_NAME_ARGS;
    return TP_OK;
}

enum tp_status tp_req_harmony_calls_grammar(struct tp_req_params *p, struct tp_api_error *e)
{
    if (!p->tool_auto) return TP_OK;
    enum tp_status st = calls_grammar(p->tools, NULL, NULL, 0, 0, &p->grammar, e);
    if (st == TP_OK) p->harmony_calls = 1;
    return st;
}

enum tp_status tp_req_tools_grammar(struct tp_req_params *p, enum tp_tool_format f, const char *family,
                                    struct tp_api_error *e)
{
    if (!p->tool_auto) return TP_OK;
    if (f != TP_TOOL_FORMAT_LLAMA3 && f != TP_TOOL_FORMAT_HERMES && f != TP_TOOL_FORMAT_MISTRAL &&
        f != TP_TOOL_FORMAT_MISTRAL_ARGS)
        return tp_api_err(e, TP_ERR_UNSUPPORTED, "tool_choice",
                           "tool_choice \"auto\" (the default with 'tools') needs a chat template with a tool-call format "
                           "(llama3.1, qwen2.5, qwen3, mistral-nemo, mistral-small-3.2, devstral); this model's is %s. "
                           "Send tool_choice \"required\" or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}} to force a call, or \"none\"",
                           family);
    const char *akey = f == TP_TOOL_FORMAT_LLAMA3 ? "parameters" : f == TP_TOOL_FORMAT_MISTRAL_ARGS ? NULL : "arguments";
    enum tp_status st = calls_grammar(p->tools, NULL, akey, f == TP_TOOL_FORMAT_MISTRAL, p->parallel_tool_calls,
                                      &p->grammar, e);
    if (st != TP_OK) return st;
    p->tool_format = f;
    return TP_OK;
}

/* ------------------------------------------------------------ logit_bias */

static int cmp_bias(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* logit_bias: {"<token id>": bias, ...}, bias in [-100, 100]; at most
 * TP_MAX_LOGIT_BIAS entries, each token once, not every token banned.
 * Stored sorted by id. */
static enum tp_status parse_logit_bias(const cJSON *root, int n_vocab, struct tp_req_params *p, struct tp_api_error *e)
{
    const char *pn = "logit_bias";
    const cJSON *v = field(root, pn);
    if (!v) return TP_OK;
    if (!cJSON_IsObject(v))
        return tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'logit_bias' must be an object mapping token ids (as strings) to numbers from "
                                       "-100 to 100");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return TP_OK;
    if (n > TP_MAX_LOGIT_BIAS)
        return tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'logit_bias' has %d entries (at most %d)", n, TP_MAX_LOGIT_BIAS);
    /* (id, index) pairs sorted by id find duplicates; values follow the order */
    int32_t *pairs = malloc(sizeof(int32_t) * 2 * (size_t)n);
    p->bias_id = malloc(sizeof(int32_t) * (size_t)n);
    p->bias_val = malloc(sizeof(float) * (size_t)n);
    float *vals = malloc(sizeof(float) * (size_t)n);
    enum tp_status rc = TP_OK;
    if (!pairs || !p->bias_id || !p->bias_val || !vals) {
        rc = tp_api_err(e, TP_ERR_NOMEM, pn, "out of memory");
        goto out;
    }
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        const char *k = it->string ? it->string : "";
        size_t kl = strlen(k);
        long id = -1;
        if (kl > 0 && kl <= 9 && strspn(k, "0123456789") == kl) id = strtol(k, NULL, 10);
        if (id < 0 || id >= n_vocab) {
            rc = tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'logit_bias' key \"%.40s\" is not a token id in [0, %d)", k, n_vocab);
            goto out;
        }
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100.0 && it->valuedouble <= 100.0)) {
            rc = tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'logit_bias'[\"%ld\"] must be a number from -100 to 100", id);
            goto out;
        }
        pairs[2 * i] = (int32_t)id;
        pairs[2 * i + 1] = i;
        vals[i] = (float)it->valuedouble;
        i++;
    }
    qsort(pairs, (size_t)n, 2 * sizeof(int32_t), cmp_bias);
    int n_ban = 0;
    for (i = 0; i < n; i++) {
        if (i > 0 && pairs[2 * i] == pairs[2 * i - 2]) {
            rc = tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'logit_bias' lists token %d twice", pairs[2 * i]);
            goto out;
        }
        p->bias_id[i] = pairs[2 * i];
        p->bias_val[i] = vals[pairs[2 * i + 1]];
        n_ban += p->bias_val[i] <= -100.0f;
    }
    if (n_ban >= n_vocab) {
        rc = tp_api_err(e, TP_ERR_INVALID_ARG, pn, "'logit_bias' bans all %d tokens (-100); leave at least one allowed", n_vocab);
        goto out;
    }
    p->n_logit_bias = n;
out:
    free(pairs);
    free(vals);
    return rc;
}

static enum tp_status parse_fields(const cJSON *root, const char *body, size_t len, int chat, int n_vocab, int n_ctx,
                        struct tp_req_params *p, struct tp_api_error *e)
{
    const cJSON *v = field(root, "model");
    if (v) {
        if (!cJSON_IsString(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "model", "'model' must be a string");
        if (tp_json_has_nul(v->valuestring))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "model", "'model' holds a NUL character (\\u0000); a model name cannot");
        if (!(p->model = strdup(v->valuestring))) return tp_api_err(e, TP_ERR_NOMEM, "model", "out of memory");
    }
    if (chat ? parse_messages(root, p, e) : parse_prompt(root, n_vocab, p, e)) return e->status;

    int mt = -1, mct = -1;
    if (get_int(root, "max_tokens", -1e18, 1e18, &mt, e)) return e->status;
    /* range checks by hand so the message names the context size */
    const char *mt_name = "max_tokens";
    if (chat && field(root, "max_completion_tokens")) {
        if (get_int(root, "max_completion_tokens", -1e18, 1e18, &mct, e)) return e->status;
        mt = mct;
        mt_name = "max_completion_tokens";
    }
    if (field(root, mt_name)) {
        double d = field(root, mt_name)->valuedouble;
        if (d < 1) return tp_api_err(e, TP_ERR_INVALID_ARG, mt_name, "'%s' is %.0f; it must be at least 1", mt_name, d);
        if (d > n_ctx)
            return tp_api_err(e, TP_ERR_INVALID_ARG, mt_name, "'%s' is %.0f but the context holds only %d tokens", mt_name, d, n_ctx);
        p->max_tokens = (int)d;
        p->set |= TP_GEN_N_PREDICT;
    }
    if (get_number(root, "temperature", 0, 2, &p->temperature, e)) return e->status;
    if (get_number(root, "top_p", 0, 1, &p->top_p, e)) return e->status;
    if (field(root, "top_p") && p->top_p <= 0) return tp_api_err(e, TP_ERR_INVALID_ARG, "top_p", "'top_p' must be greater than 0");
    if (get_number(root, "min_p", 0, 1, &p->min_p, e)) return e->status;
    if (get_int(root, "top_k", -1, n_vocab, &p->top_k, e)) return e->status;
    if (p->top_k < 0) p->top_k = 0;
    if (get_number(root, "presence_penalty", -2, 2, &p->presence_penalty, e)) return e->status;
    if (get_number(root, "frequency_penalty", -2, 2, &p->frequency_penalty, e)) return e->status;
    if (get_number(root, "repetition_penalty", 0, 10, &p->repetition_penalty, e)) return e->status;
    if (field(root, "repetition_penalty") && p->repetition_penalty <= 0)
        return tp_api_err(e, TP_ERR_INVALID_ARG, "repetition_penalty", "'repetition_penalty' must be greater than 0");
    if (parse_seed(root, body, len, p, e)) return e->status;
    static const struct {
        const char *name;
        unsigned bit;
    } given[] = {{"temperature", TP_GEN_TEMPERATURE}, {"top_p", TP_GEN_TOP_P},   {"top_k", TP_GEN_TOP_K},
                 {"min_p", TP_GEN_MIN_P},             {"seed", TP_GEN_SEED},     {"repetition_penalty", TP_GEN_REPEAT_PENALTY}};
    for (size_t i = 0; i < TP_ARRAY_LEN(given); i++)
        if (field(root, given[i].name)) p->set |= given[i].bit;
    if (refuse_unsupported(root, e)) return e->status;
    const cJSON *re = field(root, "reasoning_effort");
    if (re && !cJSON_IsNull(re)) {
        if (!chat)
            return tp_api_err(e, TP_ERR_INVALID_ARG, "reasoning_effort", "'reasoning_effort' is for /v1/chat/completions");
        if (!cJSON_IsString(re) || !tp_harmony_effort_valid(re->valuestring))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "reasoning_effort",
                              "'reasoning_effort' must be \"low\", \"medium\" or \"high\"");
        if (!(p->reasoning_effort = strdup(re->valuestring)))
            return tp_api_err(e, TP_ERR_NOMEM, "reasoning_effort", "out of memory");
    }
    if (parse_logit_bias(root, n_vocab, p, e)) return e->status;
    if (parse_response_format(root, p, e)) return e->status;
    if (chat) {
        if (parse_tools(root, p, e)) return e->status;
    } else {
        const cJSON *tl = field(root, "tools"), *tc = field(root, "tool_choice");
        if (tl && !(cJSON_IsArray(tl) && cJSON_GetArraySize(tl) == 0))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "'tools' is for /v1/chat/completions");
        if (tc && !(cJSON_IsString(tc) && (strcmp(tc->valuestring, "none") == 0 || strcmp(tc->valuestring, "auto") == 0)))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "tool_choice", "'tool_choice' is for /v1/chat/completions");
    }
    if (chat) {
        if (get_bool(root, "logprobs", &p->logprobs, e)) return e->status;
        if (get_int(root, "top_logprobs", 0, 20, &p->top_logprobs, e)) return e->status;
        if (field(root, "top_logprobs") && !p->logprobs)
            return tp_api_err(e, TP_ERR_INVALID_ARG, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else {
        int lp = -1;
        v = field(root, "logprobs");
        if (v && cJSON_IsBool(v)) {
            lp = cJSON_IsTrue(v) ? 0 : -1;
        } else if (get_int(root, "logprobs", 0, 20, &lp, e)) {
            return e->status;
        }
        p->logprobs = lp >= 0;
        p->top_logprobs = lp > 0 ? lp : 0;
    }
    if (get_bool(root, "stream", &p->stream, e)) return e->status;
    v = field(root, "stream_options");
    if (v) {
        if (!cJSON_IsObject(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "stream_options", "'stream_options' must be an object");
        const cJSON *iu = field(v, "include_usage");
        if (iu) {
            if (!cJSON_IsBool(iu))
                return tp_api_err(e, TP_ERR_INVALID_ARG, "stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
            p->include_usage = cJSON_IsTrue(iu);
        }
    }
    if (get_bool(root, "ignore_eos", &p->ignore_eos, e)) return e->status;
    int spec = 0;
    if (field(root, "speculative")) {
        if (get_bool(root, "speculative", &spec, e)) return e->status;
        p->speculative = spec ? 1 : -1;
    }
    v = field(root, "user");
    if (v && !cJSON_IsString(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "user", "'user' must be a string");
    return parse_stop(root, p, e);
}

enum tp_status tp_req_parse(const char *body, size_t len, int chat, int n_vocab, int n_ctx, struct tp_req_params *p,
                            struct tp_api_error *e)
{
    memset(p, 0, sizeof *p);
    p->chat = chat;
    p->max_tokens = -1;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    cJSON *root = tp_json_parse(body, len, e);
    if (!root) return e->status;
    enum tp_status rc = parse_fields(root, body, len, chat, n_vocab, n_ctx, p, e);
    cJSON_Delete(root);
    if (rc != TP_OK) tp_req_params_free(p);
    return rc;
}

void tp_req_apply_defaults(struct tp_req_params *p, const struct tp_gen_defaults *d)
{
    if (!d || p->embed) return;
    const unsigned fill = d->set & ~p->set;
    if (fill & TP_GEN_TEMPERATURE) p->temperature = d->temperature;
    if (fill & TP_GEN_TOP_P) p->top_p = d->top_p;
    if (fill & TP_GEN_TOP_K) p->top_k = d->top_k;
    if (fill & TP_GEN_MIN_P) p->min_p = d->min_p;
    if (fill & TP_GEN_REPEAT_PENALTY) p->repetition_penalty = d->repeat_penalty;
    if (fill & TP_GEN_SEED) {
        p->seed = d->seed;
        p->has_seed = 1;
    }
    if (fill & TP_GEN_N_PREDICT) p->max_tokens = d->n_predict > 0 ? d->n_predict : -1;
}

void tp_req_params_free(struct tp_req_params *p)
{
    free(p->model);
    free(p->prompt);
    free(p->prompt_ids);
    for (int i = 0; i < p->n_msgs; i++) {
        free((char *)p->msgs[i].content);
        free((char *)p->msgs[i].reasoning);
        if (p->msgs[i].tool_call_id && p->msgs[i].tool_call_id[0]) free((char *)p->msgs[i].tool_call_id);
    }
    free(p->reasoning_effort);
    free(p->tool_name);
    free(p->msgs);
    for (int i = 0; i < p->n_calls; i++) {
        free((char *)p->calls[i].id);
        free((char *)p->calls[i].name);
        cJSON_Delete((cJSON *)p->calls[i].arguments);
    }
    free(p->calls);
    cJSON_Delete(p->tools);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->bias_id);
    free(p->bias_val);
    tp_grammar_free(p->grammar);
    memset(p, 0, sizeof *p);
}

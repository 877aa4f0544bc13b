/*
 * server/json_validate.c - parse and validate the JSON body of
 * /v1/completions and /v1/chat/completions into struct tp_req_params.
 *
 * Rules: the body must be valid UTF-8 and a JSON object; unknown fields are
 * ignored; a field that is present with JSON null counts as absent; a field
 * of the wrong type or out of range is refused with 400 naming the field
 * (OpenAI's "param").  Ranges follow OpenAI's documentation where it has one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server_impl.h"

static const cJSON *field(const cJSON *root, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static int get_number(const cJSON *root, const char *name, double lo, double hi, float *out,
                      struct tp_api_error *e)
{
    const cJSON *v = field(root, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return tp_api_fail(e, 400, name, "'%s' must be a number", name);
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi))
        return tp_api_fail(e, 400, name, "'%s' is %g; it must be between %g and %g", name, d, lo, hi);
    *out = (float)d;
    return 0;
}

static int is_integer(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && floor(v->valuedouble) == v->valuedouble;
}

static int get_int(const cJSON *root, const char *name, double lo, double hi, int *out, struct tp_api_error *e)
{
    const cJSON *v = field(root, name);
    if (!v) return 0;
    if (!is_integer(v)) return tp_api_fail(e, 400, name, "'%s' must be an integer", name);
    double d = v->valuedouble;
    if (d < lo || d > hi)
        return tp_api_fail(e, 400, name, "'%s' is %.0f; it must be between %.0f and %.0f", name, d, lo, hi);
    *out = (int)d;
    return 0;
}

static int get_bool(const cJSON *root, const char *name, int *out, struct tp_api_error *e)
{
    const cJSON *v = field(root, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return tp_api_fail(e, 400, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

static int parse_token_list(const cJSON *arr, int n_vocab, const char *param, struct tp_req_params *p,
                            struct tp_api_error *e)
{
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return tp_api_fail(e, 400, param, "'%s' is an empty list of tokens", param);
    p->prompt_ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!p->prompt_ids) return tp_api_fail(e, 500, param, "out of memory");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, arr)
    {
        if (!is_integer(t) || t->valuedouble < 0 || t->valuedouble >= n_vocab)
            return tp_api_fail(e, 400, param, "'%s'[%d] is not a token id in [0, %d)", param, i, n_vocab);
        p->prompt_ids[i++] = (int32_t)t->valuedouble;
    }
    p->n_prompt_ids = n;
    return 0;
}

static int parse_prompt(const cJSON *root, int n_vocab, struct tp_req_params *p, struct tp_api_error *e)
{
    const cJSON *v = field(root, "prompt");
    if (!v) return tp_api_fail(e, 400, "prompt", "'prompt' is required (a string, or a list of token ids)");
    if (cJSON_IsString(v)) {
        p->prompt = dup_str(v->valuestring);
        return p->prompt ? 0 : tp_api_fail(e, 500, "prompt", "out of memory");
    }
    if (!cJSON_IsArray(v)) return tp_api_fail(e, 400, "prompt", "'prompt' must be a string or a list");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return tp_api_fail(e, 400, "prompt", "'prompt' is an empty list");
    const cJSON *first = cJSON_GetArrayItem(v, 0);
    if (cJSON_IsNumber(first)) return parse_token_list(v, n_vocab, "prompt", p, e);
    if (n != 1)
        return tp_api_fail(e, 400, "prompt", "'prompt' lists %d prompts; this server takes one prompt per request", n);
    if (cJSON_IsString(first)) {
        p->prompt = dup_str(first->valuestring);
        return p->prompt ? 0 : tp_api_fail(e, 500, "prompt", "out of memory");
    }
    if (cJSON_IsArray(first)) return parse_token_list(first, n_vocab, "prompt", p, e);
    return tp_api_fail(e, 400, "prompt", "'prompt' must be a string, a list of strings or a list of token ids");
}

/* content: a string, or a list of {"type":"text","text":...} parts (joined). */
static int parse_content(const cJSON *c, int idx, int allow_null, char **out, struct tp_api_error *e)
{
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", idx);
    if (!c || cJSON_IsNull(c)) {
        if (!allow_null) return tp_api_fail(e, 400, param, "'%s' is required", param);
        *out = dup_str("");
        return *out ? 0 : tp_api_fail(e, 500, param, "out of memory");
    }
    if (cJSON_IsString(c)) {
        *out = dup_str(c->valuestring);
        return *out ? 0 : tp_api_fail(e, 500, param, "out of memory");
    }
    if (!cJSON_IsArray(c)) return tp_api_fail(e, 400, param, "'%s' must be a string or a list of text parts", param);
    struct tp_buf b = {0};
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            tp_buf_free(&b);
            return tp_api_fail(e, 400, param, "'%s'[%d] must be {\"type\": \"text\", \"text\": \"...\"} (only text is supported)",
                               param, k);
        }
        if (tp_buf_puts(&b, text->valuestring) != 0) {
            tp_buf_free(&b);
            return tp_api_fail(e, 500, param, "out of memory");
        }
        k++;
    }
    *out = b.data ? b.data : dup_str("");
    return *out ? 0 : tp_api_fail(e, 500, param, "out of memory");
}

static int parse_messages(const cJSON *root, struct tp_req_params *p, struct tp_api_error *e)
{
    const cJSON *v = field(root, "messages");
    if (!v) return tp_api_fail(e, 400, "messages", "'messages' is required (a list of {role, content})");
    if (!cJSON_IsArray(v)) return tp_api_fail(e, 400, "messages", "'messages' must be a list");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return tp_api_fail(e, 400, "messages", "'messages' must contain at least one message");
    if (n > 4096) return tp_api_fail(e, 400, "messages", "'messages' has %d entries (at most 4096)", n);
    p->msgs = calloc((size_t)n, sizeof *p->msgs);
    if (!p->msgs) return tp_api_fail(e, 500, "messages", "out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, v)
    {
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return tp_api_fail(e, 400, param, "'%s' must be an object {role, content}", param);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role)) return tp_api_fail(e, 400, param, "'%s' must be a string", param);
        const char *r = role->valuestring;
        if (strcmp(r, "developer") == 0) r = "system";
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0)
            return tp_api_fail(e, 400, param, "'%s' is '%.40s'; supported roles are system, user and assistant",
                               param, r);
        p->msgs[i].role = r[0] == 's' ? "system" : r[0] == 'u' ? "user" : "assistant";
        char *content = NULL;
        if (parse_content(cJSON_GetObjectItemCaseSensitive(m, "content"), i, r[0] == 'a', &content, e) != 0) {
            p->n_msgs = i;
            return -1;
        }
        p->msgs[i].content = content;
        p->n_msgs = ++i;
    }
    return 0;
}

static int parse_stop(const cJSON *root, struct tp_req_params *p, struct tp_api_error *e)
{
    const cJSON *v = field(root, "stop");
    if (!v) return 0;
    const cJSON *items[TP_MAX_STOP];
    int n = 0;
    if (cJSON_IsString(v)) {
        items[n++] = v;
    } else if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > TP_MAX_STOP)
            return tp_api_fail(e, 400, "stop", "'stop' has %d strings (at most %d)", cJSON_GetArraySize(v), TP_MAX_STOP);
        const cJSON *s;
        cJSON_ArrayForEach(s, v)
        {
            if (!cJSON_IsString(s)) return tp_api_fail(e, 400, "stop", "'stop' must be a string or a list of strings");
            items[n++] = s;
        }
    } else {
        return tp_api_fail(e, 400, "stop", "'stop' must be a string or a list of strings");
    }
    for (int i = 0; i < n; i++) {
        size_t l = strlen(items[i]->valuestring);
        if (l == 0) return tp_api_fail(e, 400, "stop", "'stop' strings must not be empty");
        if (l > TP_MAX_STOP_BYTES)
            return tp_api_fail(e, 400, "stop", "a 'stop' string has %zu bytes (at most %d)", l, TP_MAX_STOP_BYTES);
        p->stop[i] = dup_str(items[i]->valuestring);
        if (!p->stop[i]) return tp_api_fail(e, 500, "stop", "out of memory");
        p->n_stop = i + 1;
    }
    return 0;
}

static int parse_fields(const cJSON *root, int chat, int n_vocab, int n_ctx, struct tp_req_params *p,
                        struct tp_api_error *e)
{
    const cJSON *v = field(root, "model");
    if (v) {
        if (!cJSON_IsString(v)) return tp_api_fail(e, 400, "model", "'model' must be a string");
        if (!(p->model = dup_str(v->valuestring))) return tp_api_fail(e, 500, "model", "out of memory");
    }
    if (chat ? parse_messages(root, p, e) : parse_prompt(root, n_vocab, p, e)) return -1;

    int mt = -1, mct = -1;
    if (get_int(root, "max_tokens", -1e18, 1e18, &mt, e)) return -1;
    /* range checks by hand so the message names the context size */
    const char *mt_name = "max_tokens";
    if (chat && field(root, "max_completion_tokens")) {
        if (get_int(root, "max_completion_tokens", -1e18, 1e18, &mct, e)) return -1;
        mt = mct;
        mt_name = "max_completion_tokens";
    }
    if (field(root, mt_name)) {
        double d = field(root, mt_name)->valuedouble;
        if (d < 1) return tp_api_fail(e, 400, mt_name, "'%s' is %.0f; it must be at least 1", mt_name, d);
        if (d > n_ctx)
            return tp_api_fail(e, 400, mt_name, "'%s' is %.0f but the context holds only %d tokens", mt_name, d, n_ctx);
        p->max_tokens = (int)d;
    }
    if (get_number(root, "temperature", 0, 2, &p->temperature, e)) return -1;
    if (get_number(root, "top_p", 0, 1, &p->top_p, e)) return -1;
    if (field(root, "top_p") && p->top_p <= 0) return tp_api_fail(e, 400, "top_p", "'top_p' must be greater than 0");
    if (get_number(root, "min_p", 0, 1, &p->min_p, e)) return -1;
    if (get_int(root, "top_k", -1, n_vocab, &p->top_k, e)) return -1;
    if (p->top_k < 0) p->top_k = 0;
    if (get_number(root, "presence_penalty", -2, 2, &p->presence_penalty, e)) return -1;
    if (get_number(root, "frequency_penalty", -2, 2, &p->frequency_penalty, e)) return -1;
    if (get_number(root, "repetition_penalty", 0, 10, &p->repetition_penalty, e)) return -1;
    if (field(root, "repetition_penalty") && p->repetition_penalty <= 0)
        return tp_api_fail(e, 400, "repetition_penalty", "'repetition_penalty' must be greater than 0");
    v = field(root, "seed");
    if (v) {
        if (!is_integer(v) || fabs(v->valuedouble) > 9007199254740992.0)
            return tp_api_fail(e, 400, "seed", "'seed' must be an integer");
        p->has_seed = 1;
        p->seed = (uint64_t)(int64_t)v->valuedouble;
    }
    v = field(root, "n");
    if (v) {
        if (!is_integer(v)) return tp_api_fail(e, 400, "n", "'n' must be an integer");
        if (v->valuedouble != 1)
            return tp_api_fail(e, 400, "n", "'n' is %.0f; this server generates one choice per request (n = 1)",
                               v->valuedouble);
    }
    if (chat) {
        if (get_bool(root, "logprobs", &p->logprobs, e)) return -1;
        if (get_int(root, "top_logprobs", 0, 20, &p->top_logprobs, e)) return -1;
        if (field(root, "top_logprobs") && !p->logprobs)
            return tp_api_fail(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else {
        int lp = -1;
        v = field(root, "logprobs");
        if (v && cJSON_IsBool(v)) {
            lp = cJSON_IsTrue(v) ? 0 : -1;
        } else if (get_int(root, "logprobs", 0, 20, &lp, e)) {
            return -1;
        }
        p->logprobs = lp >= 0;
        p->top_logprobs = lp > 0 ? lp : 0;
    }
    if (get_bool(root, "stream", &p->stream, e)) return -1;
    v = field(root, "stream_options");
    if (v) {
        if (!cJSON_IsObject(v)) return tp_api_fail(e, 400, "stream_options", "'stream_options' must be an object");
        const cJSON *iu = field(v, "include_usage");
        if (iu) {
            if (!cJSON_IsBool(iu))
                return tp_api_fail(e, 400, "stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
            p->include_usage = cJSON_IsTrue(iu);
        }
    }
    if (get_bool(root, "ignore_eos", &p->ignore_eos, e)) return -1;
    v = field(root, "user");
    if (v && !cJSON_IsString(v)) return tp_api_fail(e, 400, "user", "'user' must be a string");
    return parse_stop(root, p, e);
}

int tp_req_parse(const char *body, size_t len, int chat, int n_vocab, int n_ctx, struct tp_req_params *p,
                 struct tp_api_error *e)
{
    memset(p, 0, sizeof *p);
    p->chat = chat;
    p->max_tokens = -1;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    if (len == 0) return tp_api_fail(e, 400, NULL, "the request body is empty; send a JSON object");
    if (!tp_srv_utf8_valid(body, len)) return tp_api_fail(e, 400, NULL, "the request body is not valid UTF-8");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t off = end ? (size_t)(end - body) : 0;
        return tp_api_fail(e, 400, NULL, "the request body is not valid JSON (error near byte %zu)", off);
    }
    int rc;
    while (end && end < body + len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')) end++;
    if (end && end < body + len)
        rc = tp_api_fail(e, 400, NULL, "the request body has extra data after the JSON value (byte %zu)",
                         (size_t)(end - body));
    else if (!cJSON_IsObject(root)) rc = tp_api_fail(e, 400, NULL, "the request body must be a JSON object");
    else rc = parse_fields(root, chat, n_vocab, n_ctx, p, e);
    cJSON_Delete(root);
    if (rc != 0) tp_req_params_free(p);
    return rc;
}

void tp_req_params_free(struct tp_req_params *p)
{
    free(p->model);
    free(p->prompt);
    free(p->prompt_ids);
    for (int i = 0; i < p->n_msgs; i++) free((char *)p->msgs[i].content);
    free(p->msgs);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    memset(p, 0, sizeof *p);
}

/*
 * server/api_messages.c - Anthropic's Messages API: POST /v1/messages and
 * POST /v1/messages/count_tokens.
 *
 * A request is validated field by field as Anthropic documents it (unknown
 * fields are refused, as Anthropic's API refuses them), translated into the
 * equivalent chat-completions request (system first, then the turns; the
 * sampling fields; stop_sequences as stop; tools as functions whose
 * parameters are the input_schema; tool_choice any -> required, tool ->
 * the named function) and run on the one engine (api_run.c).  The answer is
 * a message object, or a stream of Anthropic's typed events:
 *   message_start, content_block_start, ping, content_block_delta...,
 *   content_block_stop, message_delta (stop_reason, usage), message_stop
 * each sent as "event: <type>\ndata: <json>\n\n".  A forced tool call is one
 * tool_use block (input_json_delta in the stream).  Errors use Anthropic's
 * shape {"type": "error", "error": {"type", "message"}}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api_run.h"

/* ------------------------------------------------------------ errors */

static const char *error_type(int status)
{
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *tp_api_messages_error_json(const struct tp_api_error *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "type", "error");
    cJSON *er = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(er, "type", error_type(tp_http_error_kind(e->status).http_status));
    char m[700];
    if (e->n_ctx > 0 && e->n_max_tokens > 0) /* context_length_exceeded, in Anthropic's words */
        snprintf(m, sizeof m, "input length and `max_tokens` exceed context limit: %d + %d > %d, decrease input length "
                 "or `max_tokens` and try again", e->n_prompt_tokens, e->n_max_tokens, e->n_ctx);
    else if (e->n_ctx > 0)
        snprintf(m, sizeof m, "prompt is too long: %d tokens > %d maximum", e->n_prompt_tokens, e->n_ctx - 1);
    else
        tp_run_error_text(e, m, sizeof m);
    cJSON_AddStringToObject(er, "message", m);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return json;
}

/* ------------------------------------------------------------ request */

static const cJSON *field(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A text block blk (content block k of param) appended to b. */
static int read_text_block(const cJSON *blk, const char *param, int k, struct tp_buf *b, struct tp_api_error *e)
{
    const cJSON *tx = field(blk, "text");
    if (!cJSON_IsString(tx))
        return tp_api_err(e, TP_ERR_INVALID_ARG, param, "%s.%d.text: Field required (a string)", param, k);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, blk)
    {
        if (strcmp(kv->string, "type") && strcmp(kv->string, "text") && strcmp(kv->string, "cache_control") &&
            strcmp(kv->string, "citations"))
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "%s.%d.%.40s: Extra inputs are not permitted", param, k,
                              kv->string);
    }
    return tp_buf_puts(b, tx->valuestring) ? tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory") : 0;
}

/* Append a content value (a string, or a list of text blocks: system, a tool_result's content) to b; other
 * block types are refused naming them. */
static int content_text(const cJSON *c, const char *param, struct tp_buf *b, struct tp_api_error *e)
{
    if (cJSON_IsString(c)) return tp_buf_puts(b, c->valuestring) ? tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory") : 0;
    if (!cJSON_IsArray(c))
        return tp_api_err(e, TP_ERR_INVALID_ARG, param, "%s: must be a string or a list of content blocks", param);
    int k = 0;
    const cJSON *blk;
    cJSON_ArrayForEach(blk, c)
    {
        const cJSON *ty = cJSON_IsObject(blk) ? field(blk, "type") : NULL;
        if (!cJSON_IsString(ty))
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "%s.%d: a content block must be an object with a 'type'",
                              param, k);
        if (strcmp(ty->valuestring, "text") != 0)
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "%s.%d: content blocks of type '%.40s' are not supported "
                              "here by this server (text only)", param, k, ty->valuestring);
        if (read_text_block(blk, param, k, b, e)) return -1;
        k++;
    }
    return 0;
}

/* Consecutive Anthropic turns of one role, combined into one turn as Anthropic does, and the chat messages
 * they become: user -> a tool message per tool_result block, then a user message with the text; assistant
 * -> one assistant message with the text and a tool call per tool_use block. */
struct group {
    const char *role;      /* "user" | "assistant"; NULL: empty */
    struct tp_buf text;    /* the turns' text, "\n\n" between turns */
    int n_text;            /* turns that brought text */
    cJSON *calls;          /* assistant: chat-completions tool_calls (owned) or NULL */
    cJSON *results;        /* user: tool messages (owned) or NULL */
};

static int nomem(struct tp_api_error *e) { return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory"); }

/* Only the keys allowed[0..n) in blk (param names it). */
static int only_keys(const cJSON *blk, const char *const *allowed, size_t n, const char *param, int k,
                     struct tp_api_error *e)
{
    const cJSON *kv;
    cJSON_ArrayForEach(kv, blk)
    {
        size_t i = 0;
        while (i < n && strcmp(kv->string, allowed[i])) i++;
        if (i == n)
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "%s.%d.%.40s: Extra inputs are not permitted", param, k,
                              kv->string);
    }
    return 0;
}

/* messages[i].content (c) into g: text, tool_use (assistant) and tool_result (user) blocks. */
static int turn_blocks(const cJSON *c, int i, struct group *g, struct tp_api_error *e)
{
    char param[48];
    snprintf(param, sizeof param, "messages.%d.content", i);
    const int user = g->role[0] == 'u';
    struct tp_buf t = {0};
    int has_text = cJSON_IsString(c), rc = 0;
    if (has_text) {
        if (tp_buf_puts(&t, c->valuestring)) rc = nomem(e);
    } else if (!cJSON_IsArray(c)) {
        rc = tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "%s: must be a string or a list of content blocks", param);
    }
    int k = 0;
    const cJSON *blk;
    for (blk = cJSON_IsArray(c) ? c->child : NULL; blk && !rc; blk = blk->next, k++) {
        const cJSON *ty = cJSON_IsObject(blk) ? field(blk, "type") : NULL;
        const char *bt = cJSON_IsString(ty) ? ty->valuestring : "";
        if (strcmp(bt, "text") == 0) {
            /* a turn's text blocks are chat content parts: joined with a newline, as chat completions and
             * llama-server join them */
            if (t.len > 0 && tp_buf_puts(&t, "\n")) rc = nomem(e);
            else rc = read_text_block(blk, param, k, &t, e);
            has_text = 1;
        } else if (strcmp(bt, "tool_use") == 0) {
            static const char *const keys[] = {"type", "id", "name", "input", "cache_control"};
            const cJSON *id = field(blk, "id"), *nm = field(blk, "name"), *in = field(blk, "input");
            if (user) {
                rc = tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "%s.%d: tool_use blocks belong to assistant turns "
                                "(the results go in a user turn as tool_result blocks)", param, k);
            } else if (!only_keys(blk, keys, TP_ARRAY_LEN(keys), param, k, e)) {
                if (!cJSON_IsString(id) || !cJSON_IsString(nm) || !cJSON_IsObject(in)) {
                    rc = tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "%s.%d: a tool_use block needs 'id' and 'name' "
                                    "(strings) and 'input' (an object)", param, k);
                } else {
                    char *args = cJSON_PrintUnformatted(in);
                    cJSON *call = args ? tp_run_chat_call(id->valuestring, nm->valuestring, args, strlen(args)) : NULL;
                    if (!g->calls) g->calls = cJSON_CreateArray();
                    if (!call || !g->calls) {
                        cJSON_Delete(call);
                        rc = nomem(e);
                    } else {
                        cJSON_AddItemToArray(g->calls, call);
                    }
                    free(args);
                }
            } else {
                rc = -1;
            }
        } else if (strcmp(bt, "tool_result") == 0) {
            static const char *const keys[] = {"type", "tool_use_id", "content", "is_error", "cache_control"};
            const cJSON *id = field(blk, "tool_use_id"), *rc_ = field(blk, "content"), *ie = field(blk, "is_error");
            char rp[96];
            snprintf(rp, sizeof rp, "%s.%d.content", param, k);
            struct tp_buf rt = {0};
            if (!user) {
                rc = tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "%s.%d: tool_result blocks belong to user turns",
                                param, k);
            } else if (only_keys(blk, keys, TP_ARRAY_LEN(keys), param, k, e)) {
                rc = -1;
            } else if (!cJSON_IsString(id)) {
                rc = tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "%s.%d.tool_use_id: Field required (a string)",
                                param, k);
            } else if (ie && !cJSON_IsBool(ie)) {
                rc = tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "%s.%d.is_error: Input should be a valid boolean",
                                param, k);
            } else if (!rc_ || !(rc = content_text(rc_, rp, &rt, e))) {
                cJSON *m = cJSON_CreateObject();
                if (!g->results) g->results = cJSON_CreateArray();
                if (!m || !g->results) {
                    cJSON_Delete(m);
                    rc = nomem(e);
                } else {
                    cJSON_AddItemToArray(g->results, m);
                    cJSON_AddStringToObject(m, "role", "tool");
                    cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
                    cJSON_AddStringToObject(m, "content", rt.data ? rt.data : "");
                }
            }
            tp_buf_free(&rt);
        } else {
            rc = tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "%s.%d: content blocks of type '%.40s' are not supported "
                            "by this server (text, tool_use and tool_result)", param, k, bt[0] ? bt : "?");
        }
    }
    if (!rc && has_text) {
        if ((g->n_text++ > 0 && tp_buf_puts(&g->text, "\n\n")) || tp_buf_puts(&g->text, t.data ? t.data : ""))
            rc = nomem(e);
    }
    tp_buf_free(&t);
    return rc;
}

/* The chat messages of g appended to msgs; g emptied. */
static void group_flush(struct group *g, cJSON *msgs)
{
    if (!g->role) return;
    const char *text = g->text.data ? g->text.data : "";
    if (g->role[0] == 'u') {
        while (g->results && g->results->child)
            cJSON_AddItemToArray(msgs, cJSON_DetachItemViaPointer(g->results, g->results->child));
        if (g->n_text > 0 || !g->results) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddItemToArray(msgs, m);
            cJSON_AddStringToObject(m, "role", "user");
            cJSON_AddStringToObject(m, "content", text);
        }
    } else {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "assistant");
        if (g->n_text > 0 || !g->calls) cJSON_AddStringToObject(m, "content", text);
        else cJSON_AddNullToObject(m, "content");
        if (g->calls) cJSON_AddItemToObject(m, "tool_calls", g->calls);
        g->calls = NULL;
    }
    cJSON_Delete(g->results);
    cJSON_Delete(g->calls);
    tp_buf_free(&g->text);
    memset(g, 0, sizeof *g);
}

/* Anthropic tools [{name, description, input_schema}] -> OpenAI tools; tool_choice likewise. */
static int translate_tools(const cJSON *root, cJSON *out, int for_count, struct tp_api_error *e)
{
    const cJSON *tools = field(root, "tools"), *choice = field(root, "tool_choice");
    if (tools && !cJSON_IsArray(tools)) return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "tools: Input should be a valid list");
    if (tools) {
        cJSON *arr = cJSON_AddArrayToObject(out, "tools");
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools)
        {
            const cJSON *nm = cJSON_IsObject(t) ? field(t, "name") : NULL;
            const cJSON *ty = cJSON_IsObject(t) ? field(t, "type") : NULL;
            const cJSON *sc = cJSON_IsObject(t) ? field(t, "input_schema") : NULL;
            const cJSON *de = cJSON_IsObject(t) ? field(t, "description") : NULL;
            if (ty && !(cJSON_IsString(ty) && strcmp(ty->valuestring, "custom") == 0))
                return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "tools.%d: tool type '%.40s' is not supported by this server "
                                                    "(custom tools with an input_schema only)", i,
                                   cJSON_IsString(ty) ? ty->valuestring : "?");
            if (!cJSON_IsString(nm))
                return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "tools.%d.name: Field required (a string)", i);
            if (!cJSON_IsObject(sc))
                return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "tools.%d.input_schema: Field required (a JSON schema object)", i);
            if (de && !cJSON_IsString(de))
                return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "tools.%d.description: Input should be a valid string", i);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToArray(arr, o);
            cJSON_AddStringToObject(o, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(o, "function");
            cJSON_AddStringToObject(fn, "name", nm->valuestring);
            if (de) cJSON_AddStringToObject(fn, "description", de->valuestring);
            cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(sc, 1));
            i++;
        }
    }
    if (!choice) return 0;
    const cJSON *ty = cJSON_IsObject(choice) ? field(choice, "type") : NULL;
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
    const cJSON *dp = cJSON_IsObject(choice) ? field(choice, "disable_parallel_tool_use") : NULL;
    if (dp && !cJSON_IsBool(dp))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "tool_choice", "tool_choice.disable_parallel_tool_use: Input should be a valid boolean");
    if (for_count) return 0;
    if (cJSON_IsTrue(dp)) cJSON_AddFalseToObject(out, "parallel_tool_calls");
    if (strcmp(t, "auto") == 0) {
        cJSON_AddStringToObject(out, "tool_choice", "auto");
    } else if (strcmp(t, "any") == 0) {
        cJSON_AddStringToObject(out, "tool_choice", "required");
    } else if (strcmp(t, "none") == 0) {
        cJSON_AddStringToObject(out, "tool_choice", "none");
    } else if (strcmp(t, "tool") == 0) {
        const cJSON *nm = field(choice, "name");
        if (!cJSON_IsString(nm)) return tp_api_err(e, TP_ERR_INVALID_ARG, "tool_choice", "tool_choice.name: Field required");
        cJSON *o = cJSON_AddObjectToObject(out, "tool_choice");
        cJSON_AddStringToObject(o, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", nm->valuestring);
    } else {
        return tp_api_err(e, TP_ERR_INVALID_ARG, "tool_choice", "tool_choice: must be {\"type\": \"auto\" | \"any\" | \"tool\" | "
                                                  "\"none\"} (\"tool\" with a \"name\")");
    }
    return 0;
}

/* The chat-completions names the core may blame, in Messages terms. */
static const char *const rename_fields[][2] = {
    {"stop", "stop_sequences"},
    {"max_completion_tokens", "max_tokens"},
    {"\"required\"", "{\"type\": \"any\"}"},
    {NULL, NULL},
};

/* Every field of the body is one the Messages API has (for_count: /v1/messages/count_tokens, which takes no
 * sampling fields).  TP_OK or TP_ERR_INVALID_ARG (e filled). */
static enum tp_status msg_check_known(const cJSON *root, int for_count, struct tp_api_error *e)
{
    static const char *const known[] = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream",
                                        "temperature", "top_p", "top_k", "tools", "tool_choice", "metadata",
                                        "thinking", "service_tier"};
    const cJSON *kv;
    cJSON_ArrayForEach(kv, root)
    {
        int ok = 0;
        for (size_t i = 0; i < TP_ARRAY_LEN(known) && !ok; i++) ok = strcmp(kv->string, known[i]) == 0;
        if (for_count && ok)
            ok = strcmp(kv->string, "max_tokens") && strcmp(kv->string, "stop_sequences") &&
                 strcmp(kv->string, "stream") && strcmp(kv->string, "temperature") && strcmp(kv->string, "top_p") &&
                 strcmp(kv->string, "top_k") && strcmp(kv->string, "metadata") && strcmp(kv->string, "service_tier");
        if (!ok) return tp_api_err(e, TP_ERR_INVALID_ARG, kv->string, "%.60s: Extra inputs are not permitted", kv->string);
    }
    return TP_OK;
}

/* The generation fields (max_tokens required, temperature, top_p, top_k, stream, stop_sequences; metadata and
 * service_tier checked) into the chat-completions body out.  TP_OK or TP_ERR_INVALID_ARG (e filled). */
static enum tp_status msg_parse_sampling(const cJSON *root, cJSON *out, struct tp_api_error *e)
{
    const cJSON *v = field(root, "max_tokens");
    if (!v) return tp_api_err(e, TP_ERR_INVALID_ARG, "max_tokens", "max_tokens: Field required");
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)v->valuedouble)
        return tp_api_err(e, TP_ERR_INVALID_ARG, "max_tokens", "max_tokens: Input should be a valid integer");
    if (v->valuedouble < 1)
        return tp_api_err(e, TP_ERR_INVALID_ARG, "max_tokens", "max_tokens: Input should be greater than or equal to 1");
    cJSON_AddNumberToObject(out, "max_tokens", v->valuedouble);
    v = field(root, "temperature");
    if (v && (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "temperature", "temperature: Input should be a number from 0 to 1");
    /* Anthropic's default temperature is 1.0, as the engine's */
    static const char *const pass[] = {"temperature", "top_p", "top_k", "stream"};
    for (int i = 0; i < 4; i++)
        if ((v = field(root, pass[i]))) cJSON_AddItemToObject(out, pass[i], cJSON_Duplicate(v, 1));
    v = field(root, "stop_sequences");
    if (v) {
        if (!cJSON_IsArray(v))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "stop_sequences", "stop_sequences: Input should be a valid list");
        if (cJSON_GetArraySize(v) > 0) cJSON_AddItemToObject(out, "stop", cJSON_Duplicate(v, 1));
    }
    v = field(root, "metadata");
    if (v && !cJSON_IsObject(v))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "metadata", "metadata: Input should be a valid dictionary");
    v = field(root, "service_tier");
    if (v && !cJSON_IsString(v))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "service_tier", "service_tier: Input should be 'auto' or 'standard_only'");
    return TP_OK;
}

/* thinking: only {"type": "disabled"}.  TP_OK or TP_ERR_INVALID_ARG (e filled). */
static enum tp_status msg_check_thinking(const cJSON *root, struct tp_api_error *e)
{
    const cJSON *v = field(root, "thinking");
    if (!v) return TP_OK;
    const cJSON *ty = cJSON_IsObject(v) ? field(v, "type") : NULL;
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "disabled") != 0)
        return tp_api_err(e, TP_ERR_INVALID_ARG, "thinking", "thinking: extended thinking is not available: this server's model has "
                                        "no reasoning channel it can separate; send {\"type\": \"disabled\"} or "
                                        "leave it out");
    return TP_OK;
}

/* One entry of messages (index i): a role of user or assistant, a content, no other key.  *role: "user" or
 * "assistant" (static).  TP_OK or TP_ERR_INVALID_ARG (e filled). */
static enum tp_status msg_check_turn(const cJSON *m, int i, const char **role, struct tp_api_error *e)
{
    const cJSON *ro = cJSON_IsObject(m) ? field(m, "role") : NULL;
    if (!cJSON_IsString(ro) || (strcmp(ro->valuestring, "user") && strcmp(ro->valuestring, "assistant")))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "messages.%d.role: Input should be 'user' or 'assistant'", i);
    if (!field(m, "content"))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "messages.%d.content: Field required", i);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, m)
    {
        if (strcmp(kv->string, "role") && strcmp(kv->string, "content"))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "messages.%d.%.40s: Extra inputs are not permitted", i,
                              kv->string);
    }
    *role = ro->valuestring[0] == 'u' ? "user" : "assistant";
    return TP_OK;
}

/* The system prompt and the turns as chat messages appended to msgs, consecutive turns of one role merged
 * into one, as Anthropic does.  for_count: the last turn may be the assistant's.  TP_OK or an error in e. */
static enum tp_status msg_translate_turns(const cJSON *root, int for_count, cJSON *msgs, struct tp_api_error *e)
{
    struct tp_buf b = {0};
    struct group g = {0};
    enum tp_status st = TP_OK;
    const cJSON *v = field(root, "system");
    if (v) {
        if (content_text(v, "system", &b, e)) {
            st = e->status;
            goto done;
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", b.data ? b.data : "");
    }
    v = field(root, "messages");
    if (!cJSON_IsArray(v)) {
        st = tp_api_err(e, TP_ERR_INVALID_ARG, "messages",
                        v ? "messages: Input should be a valid list" : "messages: Field required");
        goto done;
    }
    if (cJSON_GetArraySize(v) == 0) {
        st = tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "messages: at least one message is required");
        goto done;
    }
    int i = 0;
    const char *prev_role = NULL, *r = NULL;
    const cJSON *m;
    cJSON_ArrayForEach(m, v)
    {
        if ((st = msg_check_turn(m, i, &r, e)) != TP_OK) goto done;
        if (g.role && strcmp(g.role, r) != 0) group_flush(&g, msgs);
        g.role = r;
        if (turn_blocks(field(m, "content"), i, &g, e)) {
            st = e->status;
            goto done;
        }
        prev_role = r;
        i++;
    }
    group_flush(&g, msgs);
    if (prev_role && prev_role[0] == 'a' && !for_count)
        st = tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "messages: the last message is from the assistant (a prefill to continue); "
                                        "this server starts a new assistant turn and does not continue one, so end "
                                        "with a user message");
done:
    g.role = NULL; /* nothing more to emit */
    cJSON_Delete(g.results);
    cJSON_Delete(g.calls);
    tp_buf_free(&g.text);
    tp_buf_free(&b);
    return st;
}

/* Validate an Anthropic Messages body and translate it into p (for_count:
 * count_tokens, which has no max_tokens and generates nothing).
 * 0, or nonzero with e filled. */
static int parse_messages_request(struct tp_server *s, const char *body, size_t len, int for_count,
                                  struct tp_req_params *p, struct tp_api_error *e)
{
    cJSON *root = tp_json_parse(body, len, e);
    if (!root) return -1;
    cJSON *out = cJSON_CreateObject();
    int rc = -1;
    if (!out) {
        tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        goto done;
    }
    if (msg_check_known(root, for_count, e) != TP_OK) goto done;
    const cJSON *v = field(root, "model");
    if (!cJSON_IsString(v)) {
        tp_api_err(e, TP_ERR_INVALID_ARG, "model", "model: Field required (a string)");
        goto done;
    }
    cJSON_AddStringToObject(out, "model", v->valuestring);
    if (!for_count && msg_parse_sampling(root, out, e) != TP_OK) goto done;
    if (msg_check_thinking(root, e) != TP_OK) goto done;
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    if (msg_translate_turns(root, for_count, msgs, e) != TP_OK) goto done;
    if (translate_tools(root, out, for_count, e)) goto done;
    rc = tp_run_parse_chat(s, out, rename_fields, p, e);
done:
    cJSON_Delete(out);
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------ answers */

static char *print_free(cJSON *root)
{
    char *json = tp_json_print(root);
    cJSON_Delete(root);
    return json;
}

static void add_usage(cJSON *o, const struct tp_req *r, int out_tokens)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", 0);
    cJSON_AddNumberToObject(u, "output_tokens", out_tokens);
}

static const char *stop_reason(const struct tp_req *r, int tool)
{
    if (r->finish == TP_FINISH_LENGTH) return "max_tokens";
    if (tool) return "tool_use";
    return r->stop_idx ? "stop_sequence" : "end_turn";
}

static void add_stop(cJSON *o, const struct tp_req *r, int tool)
{
    cJSON_AddStringToObject(o, "stop_reason", stop_reason(r, tool));
    size_t sl = 0;
    const char *ss = tp_run_stop_string(r, &sl);
    if (r->stop_idx && !tool) tp_json_add_bytes(o, "stop_sequence", ss, sl);
    else cJSON_AddNullToObject(o, "stop_sequence");
}

static cJSON *message_object(struct tp_run *x, int with_content)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", x->r->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", x->r->params.model ? x->r->params.model : x->s->model_id);
    if (!with_content) {
        cJSON_AddArrayToObject(o, "content");
        cJSON_AddNullToObject(o, "stop_reason");
        cJSON_AddNullToObject(o, "stop_sequence");
        add_usage(o, x->r, 0);
    }
    return o;
}

/* A tool_use block {"type": "tool_use", "id", "name", "input"}: input parsed from args[0..n) (NULL: {},
 * as a stream's content_block_start has it). */
static cJSON *tool_use_block(const char *id, const char *name, const char *args, size_t n)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "type", "tool_use");
    cJSON_AddStringToObject(t, "id", id);
    cJSON_AddStringToObject(t, "name", name);
    cJSON *in = args ? cJSON_ParseWithLength(args, n) : NULL;
    cJSON_AddItemToObject(t, "input", in ? in : cJSON_CreateObject());
    return t;
}

static char *final_json(struct tp_run *x)
{
    const struct tp_req *r = x->r;
    cJSON *o = message_object(x, 1);
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    struct tp_tool_scan sc;
    size_t base;
    const int n_calls = tp_run_reply_calls(r, &sc, &base);
    const char *text = (r->text.data ? r->text.data : "") + base; /* the content and calls (after </think>) */
    if (sc.content_end > 0 || n_calls == 0) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "type", "text");
        tp_json_add_bytes(t, "text", text, sc.content_end);
        cJSON_AddItemToArray(content, t);
    }
    for (int k = 0; k < sc.n_calls; k++) {
        const struct tp_tool_call_view *v = &sc.calls[k];
        if (!v->complete) continue;
        char id[96];
        tp_run_call_id(x->s, r, k, "toolu_", id, sizeof id);
        cJSON_AddItemToArray(content, tool_use_block(id, v->name, text + v->args_off, v->args_len));
    }
    add_stop(o, r, n_calls > 0);
    add_usage(o, r, r->n_toks);
    return print_free(o);
}

/* "event: <type>\ndata: <json>\n\n" */
static void event(struct tp_buf *out, const char *type, cJSON *data)
{
    char *j = print_free(data);
    if (!j) return;
    tp_buf_printf(out, "event: %s\ndata: ", type);
    tp_buf_puts(out, j);
    tp_buf_puts(out, "\n\n");
    free(j);
}

static cJSON *typed(const char *type)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static void block_start(struct tp_buf *out, int index, cJSON *block)
{
    cJSON *o = typed("content_block_start");
    cJSON_AddNumberToObject(o, "index", index);
    cJSON_AddItemToObject(o, "content_block", block);
    event(out, "content_block_start", o);
}

static void block_delta(struct tp_buf *out, int index, const char *dtype, const char *key, const char *s, size_t n)
{
    cJSON *o = typed("content_block_delta");
    cJSON_AddNumberToObject(o, "index", index);
    cJSON *d = cJSON_AddObjectToObject(o, "delta");
    cJSON_AddStringToObject(d, "type", dtype);
    tp_json_add_bytes(d, key, s, n);
    event(out, "content_block_delta", o);
}

static void block_stop(struct tp_buf *out, int index)
{
    cJSON *o = typed("content_block_stop");
    cJSON_AddNumberToObject(o, "index", index);
    event(out, "content_block_stop", o);
}

static cJSON *text_block(void)
{
    cJSON *t = typed("text");
    cJSON_AddStringToObject(t, "text", "");
    return t;
}

/* A stream's content blocks: the one open (-1: none), how many were started, whether the open one is text. */
struct msg_ctx {
    int open, n_blocks, open_text;
};

static void ctx_free(void *p) { free(p); }

static void close_block(struct msg_ctx *m, struct tp_buf *out)
{
    if (m->open < 0) return;
    block_stop(out, m->open);
    m->open = -1;
    m->open_text = 0;
}

static void open_block(struct msg_ctx *m, cJSON *block, int is_text, struct tp_buf *out)
{
    close_block(m, out);
    m->open = m->n_blocks++;
    m->open_text = is_text;
    block_start(out, m->open, block);
}

static void s_begin(struct tp_run *x, struct tp_buf *out)
{
    struct msg_ctx *m = x->ctx;
    cJSON *o = typed("message_start");
    cJSON_AddItemToObject(o, "message", message_object(x, 0));
    event(out, "message_start", o);
    /* a reply that may hold tool calls opens its blocks as they come */
    if (x->r->params.tool_format == TP_TOOL_FORMAT_NONE) open_block(m, text_block(), 1, out);
    event(out, "ping", typed("ping"));
}

static void s_text(struct tp_run *x, const char *text, size_t n, struct tp_buf *out)
{
    struct msg_ctx *m = x->ctx;
    if (!m->open_text) open_block(m, text_block(), 1, out);
    block_delta(out, m->open, "text_delta", "text", text, n);
}

static void s_call_begin(struct tp_run *x, int k, const char *id, const char *name, struct tp_buf *out)
{
    (void)k;
    open_block(x->ctx, tool_use_block(id, name, NULL, 0), 0, out);
}

static void s_call_args(struct tp_run *x, int k, const char *args, size_t n, struct tp_buf *out)
{
    (void)k;
    struct msg_ctx *m = x->ctx;
    block_delta(out, m->open, "input_json_delta", "partial_json", args, n);
}

static void s_call_done(struct tp_run *x, int k, const char *name, const char *args, size_t n, struct tp_buf *out)
{
    (void)k, (void)name, (void)args, (void)n;
    close_block(x->ctx, out);
}

static void s_end(struct tp_run *x, struct tp_buf *out)
{
    struct msg_ctx *m = x->ctx;
    const struct tp_req *r = x->r;
    if (m->n_blocks == 0) open_block(m, text_block(), 1, out); /* an empty reply: one empty text block */
    close_block(m, out);
    cJSON *o = typed("message_delta");
    cJSON *d = cJSON_AddObjectToObject(o, "delta");
    add_stop(d, r, x->calls.n_done > 0);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "usage"), "output_tokens", r->n_toks);
    event(out, "message_delta", o);
    event(out, "message_stop", typed("message_stop"));
}

static void s_error(struct tp_run *x, const struct tp_api_error *e, struct tp_buf *out)
{
    (void)x;
    char *j = tp_api_messages_error_json(e);
    if (!j) return;
    tp_buf_puts(out, "event: error\ndata: ");
    tp_buf_puts(out, j);
    tp_buf_puts(out, "\n\n");
    free(j);
}

static void s_keepalive(struct tp_run *x, struct tp_buf *out)
{
    (void)x;
    event(out, "ping", typed("ping"));
}

static const struct tp_run_ops messages_ops = {
    .path = "/v1/messages",
    .id_prefix = "msg_",
    .call_id_prefix = "toolu_",
    .stream_type = "text/event-stream",
    .begin = s_begin,
    .text = s_text,
    .call_begin = s_call_begin,
    .call_args = s_call_args,
    .call_done = s_call_done,
    .end = s_end,
    .error = s_error,
    .keepalive = s_keepalive,
    .final_json = final_json,
    .error_json = tp_api_messages_error_json,
};

enum MHD_Result tp_api_messages(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    struct tp_req_params p;
    struct tp_api_error e;
    if (parse_messages_request(s, body, len, 0, &p, &e) != 0) return tp_run_send_error(s, c, &messages_ops, &e);
    struct msg_ctx *m = malloc(sizeof *m);
    if (!m) {
        tp_req_params_free(&p);
        tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
        return tp_run_send_error(s, c, &messages_ops, &e);
    }
    *m = (struct msg_ctx){.open = -1};
    return tp_run_request(s, c, &messages_ops, &p, NULL, 0, "max_tokens", m, ctx_free);
}

enum MHD_Result tp_api_messages_count(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    struct tp_req_params p;
    struct tp_api_error e;
    if (parse_messages_request(s, body, len, 1, &p, &e) != 0) return tp_run_send_error(s, c, &messages_ops, &e);
    return tp_run_count_tokens(s, c, &messages_ops, &p, "messages", "");
}

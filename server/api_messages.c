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
    if (e->param[0] && !strstr(e->message, e->param)) {
        char m[700];
        snprintf(m, sizeof m, "%s: %s", e->param, e->message);
        cJSON_AddStringToObject(er, "message", m);
    } else {
        cJSON_AddStringToObject(er, "message", e->message);
    }
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

/* Append a content value (string, or a list of text blocks) of messages[i] to b;
 * other block types are refused naming them. */
static int content_text(const cJSON *c, const char *param, struct tp_buf *b, struct tp_api_error *e)
{
    if (cJSON_IsString(c)) return tp_buf_puts(b, c->valuestring) ? tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory") : 0;
    if (!cJSON_IsArray(c)) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "%s: must be a string or a list of content blocks", param);
    int k = 0;
    const cJSON *blk;
    cJSON_ArrayForEach(blk, c)
    {
        const cJSON *ty = cJSON_IsObject(blk) ? field(blk, "type") : NULL;
        if (!cJSON_IsString(ty))
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "%s.%d: a content block must be an object with a 'type'", param, k);
        const char *t = ty->valuestring;
        if (strcmp(t, "text") == 0) {
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
            if (tp_buf_puts(b, tx->valuestring)) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        } else if (strcmp(t, "tool_use") == 0 || strcmp(t, "tool_result") == 0) {
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "%s.%d: '%s' blocks in the conversation history are not supported yet "
                                              "by this server (it cannot render tool turns into the model's prompt)",
                               param, k, t);
        } else {
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "%s.%d: content blocks of type '%.40s' are not supported by this server "
                                              "(text only)", param, k, t);
        }
        k++;
    }
    return 0;
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

/* Validate an Anthropic Messages body and translate it into p (for_count:
 * count_tokens, which has no max_tokens and generates nothing). */
static int parse_messages_request(struct tp_server *s, const char *body, size_t len, int for_count,
                                  struct tp_req_params *p, struct tp_api_error *e)
{
    cJSON *root = tp_json_parse(body, len, e);
    if (!root) return -1;
    cJSON *out = cJSON_CreateObject();
    struct tp_buf b = {0};
    int rc = -1;
    if (!out) {
        tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        goto done;
    }
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
        if (!ok) {
            tp_api_err(e, TP_ERR_INVALID_ARG, kv->string, "%.60s: Extra inputs are not permitted", kv->string);
            goto done;
        }
    }
    const cJSON *v = field(root, "model");
    if (!cJSON_IsString(v)) {
        tp_api_err(e, TP_ERR_INVALID_ARG, "model", "model: Field required (a string)");
        goto done;
    }
    cJSON_AddStringToObject(out, "model", v->valuestring);
    if (!for_count) {
        v = field(root, "max_tokens");
        if (!v) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "max_tokens", "max_tokens: Field required");
            goto done;
        }
        if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)v->valuedouble) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "max_tokens", "max_tokens: Input should be a valid integer");
            goto done;
        }
        if (v->valuedouble < 1) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "max_tokens", "max_tokens: Input should be greater than or equal to 1");
            goto done;
        }
        cJSON_AddNumberToObject(out, "max_tokens", v->valuedouble);
        v = field(root, "temperature");
        if (v && (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1)) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "temperature", "temperature: Input should be a number from 0 to 1");
            goto done;
        }
        /* Anthropic's default temperature is 1.0, as the engine's */
        static const char *const pass[] = {"temperature", "top_p", "top_k", "stream"};
        for (int i = 0; i < 4; i++)
            if ((v = field(root, pass[i]))) cJSON_AddItemToObject(out, pass[i], cJSON_Duplicate(v, 1));
        v = field(root, "stop_sequences");
        if (v) {
            if (!cJSON_IsArray(v)) {
                tp_api_err(e, TP_ERR_INVALID_ARG, "stop_sequences", "stop_sequences: Input should be a valid list");
                goto done;
            }
            if (cJSON_GetArraySize(v) > 0) cJSON_AddItemToObject(out, "stop", cJSON_Duplicate(v, 1));
        }
        v = field(root, "metadata");
        if (v && !cJSON_IsObject(v)) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "metadata", "metadata: Input should be a valid dictionary");
            goto done;
        }
        v = field(root, "service_tier");
        if (v && !cJSON_IsString(v)) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "service_tier", "service_tier: Input should be 'auto' or 'standard_only'");
            goto done;
        }
    }
    v = field(root, "thinking");
    if (v) {
        const cJSON *ty = cJSON_IsObject(v) ? field(v, "type") : NULL;
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "disabled") != 0) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "thinking", "thinking: extended thinking is not available: this server's model has "
                                            "no reasoning channel it can separate; send {\"type\": \"disabled\"} or "
                                            "leave it out");
            goto done;
        }
    }
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    v = field(root, "system");
    if (v) {
        if (content_text(v, "system", &b, e)) goto done;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", b.data ? b.data : "");
        tp_buf_free(&b);
    }
    v = field(root, "messages");
    if (!cJSON_IsArray(v)) {
        tp_api_err(e, TP_ERR_INVALID_ARG, "messages", v ? "messages: Input should be a valid list" : "messages: Field required");
        goto done;
    }
    if (cJSON_GetArraySize(v) == 0) {
        tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "messages: at least one message is required");
        goto done;
    }
    int i = 0;
    const char *prev_role = NULL;
    cJSON *prev = NULL;
    const cJSON *m;
    cJSON_ArrayForEach(m, v)
    {
        char param[48];
        snprintf(param, sizeof param, "messages.%d", i);
        const cJSON *role = cJSON_IsObject(m) ? field(m, "role") : NULL;
        if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant"))) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "%s.role: Input should be 'user' or 'assistant'", param);
            goto done;
        }
        const cJSON *c = field(m, "content");
        snprintf(param, sizeof param, "messages.%d.content", i);
        if (!c) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "%s: Field required", param);
            goto done;
        }
        cJSON_ArrayForEach(kv, m)
        {
            if (strcmp(kv->string, "role") && strcmp(kv->string, "content")) {
                tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "messages.%d.%.40s: Extra inputs are not permitted", i, kv->string);
                goto done;
            }
        }
        if (content_text(c, param, &b, e)) goto done;
        const char *r = role->valuestring[0] == 'u' ? "user" : "assistant";
        if (prev && prev_role == r) {
            /* consecutive turns of one role are combined into one turn, as Anthropic does */
            const cJSON *pc = cJSON_GetObjectItemCaseSensitive(prev, "content");
            struct tp_buf j = {0};
            if (tp_buf_puts(&j, pc->valuestring) || tp_buf_puts(&j, "\n\n") || tp_buf_puts(&j, b.data ? b.data : "")) {
                tp_buf_free(&j);
                tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
                goto done;
            }
            cJSON_ReplaceItemInObjectCaseSensitive(prev, "content", cJSON_CreateString(j.data));
            tp_buf_free(&j);
        } else {
            prev = cJSON_CreateObject();
            cJSON_AddItemToArray(msgs, prev);
            cJSON_AddStringToObject(prev, "role", r);
            cJSON_AddStringToObject(prev, "content", b.data ? b.data : "");
        }
        prev_role = r;
        tp_buf_free(&b);
        i++;
    }
    if (prev_role && prev_role[0] == 'a' && !for_count) {
        tp_api_err(e, TP_ERR_INVALID_ARG, "messages", "messages: the last message is from the assistant (a prefill to continue); "
                                        "this server starts a new assistant turn and does not continue one, so end "
                                        "with a user message");
        goto done;
    }
    if (translate_tools(root, out, for_count, e)) goto done;
    rc = tp_run_parse_chat(s, out, rename_fields, p, e);
done:
    tp_buf_free(&b);
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

/* The tool_use block of a forced call: {"type": "tool_use", "id", "name", "input"} (input empty when streaming). */
static cJSON *tool_use_block(struct tp_run *x, const char *name, const char *args, int with_input)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "type", "tool_use");
    char id[80];
    snprintf(id, sizeof id, "toolu_%s", x->r->id + 4); /* "msg_..." -> "toolu_..." */
    cJSON_AddStringToObject(t, "id", id);
    cJSON_AddStringToObject(t, "name", name);
    cJSON *in = with_input ? cJSON_Parse(args) : NULL;
    cJSON_AddItemToObject(t, "input", in ? in : cJSON_CreateObject());
    return t;
}

static char *final_json(struct tp_run *x)
{
    const struct tp_req *r = x->r;
    cJSON *o = message_object(x, 1);
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    char *name = NULL, *args = NULL;
    int tool = tp_run_tool_call(r, &name, &args) == 0;
    if (tool) {
        cJSON_AddItemToArray(content, tool_use_block(x, name, args, 1));
    } else {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "type", "text");
        tp_json_add_bytes(t, "text", r->text.data ? r->text.data : "", r->text.len);
        cJSON_AddItemToArray(content, t);
    }
    free(name);
    free(args);
    add_stop(o, r, tool);
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

static void s_begin(struct tp_run *x, struct tp_buf *out)
{
    cJSON *o = typed("message_start");
    cJSON_AddItemToObject(o, "message", message_object(x, 0));
    event(out, "message_start", o);
    if (!x->r->params.tool_call) block_start(out, 0, text_block());
    event(out, "ping", typed("ping"));
}

static void s_text(struct tp_run *x, const char *text, size_t n, struct tp_buf *out)
{
    (void)x;
    block_delta(out, 0, "text_delta", "text", text, n);
}

static void s_end(struct tp_run *x, struct tp_buf *out)
{
    const struct tp_req *r = x->r;
    int tool = 0;
    if (r->params.tool_call) {
        char *name = NULL, *args = NULL;
        tool = tp_run_tool_call(r, &name, &args) == 0;
        if (tool) {
            block_start(out, 0, tool_use_block(x, name, args, 0));
            block_delta(out, 0, "input_json_delta", "partial_json", args, strlen(args));
        } else { /* cut short: what was generated, as text */
            block_start(out, 0, text_block());
            if (r->text.len) block_delta(out, 0, "text_delta", "text", r->text.data, r->text.len);
        }
        free(name);
        free(args);
    }
    block_stop(out, 0);
    cJSON *o = typed("message_delta");
    cJSON *d = cJSON_AddObjectToObject(o, "delta");
    add_stop(d, r, tool);
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
    .stream_type = "text/event-stream",
    .begin = s_begin,
    .text = s_text,
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
    return tp_run_request(s, c, &messages_ops, &p, NULL, 0, "max_tokens", NULL, NULL);
}

enum MHD_Result tp_api_messages_count(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    struct tp_req_params p;
    struct tp_api_error e;
    if (parse_messages_request(s, body, len, 1, &p, &e) != 0) return tp_run_send_error(s, c, &messages_ops, &e);
    int32_t *ids = NULL;
    int n = 0;
    enum tp_status st = tp_run_tokens(s, &p, "messages", &ids, &n, &e);
    free(ids);
    tp_req_params_free(&p);
    if (st != TP_OK) return tp_run_send_error(s, c, &messages_ops, &e);
    char json[64];
    snprintf(json, sizeof json, "{\"input_tokens\":%d}", n);
    return tp_http_send_json(s, c, 200, json);
}

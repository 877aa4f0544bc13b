/*
 * server/api_responses.c - OpenAI's Responses API: POST /v1/responses and
 * POST /v1/responses/input_tokens.
 *
 * The request (input as a string or a list of message items, instructions,
 * max_output_tokens, sampling fields, function tools and tool_choice,
 * text.format, previous_response_id) is validated, turned into the
 * equivalent chat-completions request and run on the one engine
 * (api_run.c).  Unknown fields are refused, as OpenAI refuses them; hosted
 * tool types the server cannot run (web_search, file_search, ...) are left
 * out of the request and logged, because agents send them with every call.
 *
 * The answer is a response object, or a stream of typed events, each
 * "event: <type>\ndata: <json>\n\n" with a sequence_number:
 *   response.created, response.in_progress, response.output_item.added,
 *   response.content_part.added, response.output_text.delta...,
 *   response.output_text.done, response.content_part.done,
 *   response.output_item.done, response.completed (response.incomplete when
 *   max_output_tokens cut it).
 * A forced function call is a function_call item, streamed as
 * response.function_call_arguments.delta / .done.
 *
 * Conversation state: a finished response (unless store is false) keeps its
 * conversation (the turns before it, without instructions, and its own
 * output) in a bounded in-memory store (tp_server_config.responses_store
 * entries, oldest evicted first); previous_response_id continues it.  An id
 * that was evicted or never stored gets a 400 that says which.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "api_run.h"

/* ------------------------------------------------------------ the store */

struct resp_entry {
    char id[48];
    uint64_t num;       /* the id's sequence number */
    cJSON *messages;    /* chat messages of the conversation up to and including this response (owned) */
    cJSON *response;    /* the response object as answered (owned), for GET /v1/responses/{id} */
    cJSON *input_items; /* this response's input items, with ids (owned), for .../input_items */
};

struct tp_resp_store {
    pthread_mutex_t mu;
    int cap, n, head;   /* ring: entries[(head + i) % cap], i < n, oldest first */
    uint64_t n_evicted_below; /* every stored id numbered below this was evicted */
    struct resp_entry *entries;
};

struct tp_resp_store *tp_resp_store_new(int cap)
{
    struct tp_resp_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->cap = cap;
    if (cap > 0 && !(st->entries = calloc((size_t)cap, sizeof *st->entries))) {
        free(st);
        return NULL;
    }
    pthread_mutex_init(&st->mu, NULL);
    return st;
}

static void entry_clear(struct resp_entry *en)
{
    cJSON_Delete(en->messages);
    cJSON_Delete(en->response);
    cJSON_Delete(en->input_items);
    memset(en, 0, sizeof *en);
}

void tp_resp_store_free(struct tp_resp_store *st)
{
    if (!st) return;
    for (int i = 0; i < st->n; i++) entry_clear(&st->entries[(st->head + i) % st->cap]);
    free(st->entries);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* Takes messages, response and input_items. */
static void store_put(struct tp_resp_store *st, const char *id, uint64_t num, cJSON *messages, cJSON *response,
                      cJSON *input_items)
{
    if (!st || st->cap <= 0) {
        cJSON_Delete(messages);
        cJSON_Delete(response);
        cJSON_Delete(input_items);
        return;
    }
    pthread_mutex_lock(&st->mu);
    if (st->n == st->cap) {
        struct resp_entry *old = &st->entries[st->head];
        if (old->num + 1 > st->n_evicted_below) st->n_evicted_below = old->num + 1;
        entry_clear(old);
        st->head = (st->head + 1) % st->cap;
        st->n--;
    }
    struct resp_entry *en = &st->entries[(st->head + st->n) % st->cap];
    snprintf(en->id, sizeof en->id, "%s", id);
    en->num = num;
    en->messages = messages;
    en->response = response;
    en->input_items = input_items;
    st->n++;
    pthread_mutex_unlock(&st->mu);
}

/* What store_lookup copies out of an entry. */
enum { WANT_MESSAGES, WANT_RESPONSE, WANT_INPUT_ITEMS, WANT_DELETE };

/* A copy of what of id's entry (WANT_DELETE: removes it and returns a non-NULL marker, cJSON true), or NULL
 * when the store does not hold id. */
static cJSON *store_lookup(struct tp_resp_store *st, const char *id, int what)
{
    cJSON *out = NULL;
    if (!st) return NULL;
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < st->n && !out; i++) {
        struct resp_entry *en = &st->entries[(st->head + i) % st->cap];
        if (strcmp(en->id, id) != 0) continue;
        if (what == WANT_DELETE) {
            /* the later entries move down one place: the ring stays contiguous */
            entry_clear(en);
            for (int j = i; j + 1 < st->n; j++)
                st->entries[(st->head + j) % st->cap] = st->entries[(st->head + j + 1) % st->cap];
            memset(&st->entries[(st->head + st->n - 1) % st->cap], 0, sizeof *en);
            st->n--;
            out = cJSON_CreateTrue();
        } else {
            const cJSON *v = what == WANT_MESSAGES ? en->messages : what == WANT_RESPONSE ? en->response : en->input_items;
            out = v ? cJSON_Duplicate(v, 1) : cJSON_CreateArray();
        }
    }
    pthread_mutex_unlock(&st->mu);
    return out;
}

/* A copy of the stored conversation of id, or NULL with e filled. */
static cJSON *store_get(struct tp_server *s, const char *id, struct tp_api_error *e)
{
    struct tp_resp_store *st = s->resp_store;
    cJSON *out = NULL;
    uint64_t evicted_below = 0;
    if (st) {
        out = store_lookup(st, id, WANT_MESSAGES);
        pthread_mutex_lock(&st->mu);
        evicted_below = st->n_evicted_below;
        pthread_mutex_unlock(&st->mu);
    }
    if (out) return out;
    /* ids of this server are "resp_<created hex><6+ digit number>" */
    char mine[40];
    int ml = snprintf(mine, sizeof mine, "resp_%llx", (unsigned long long)s->created);
    int cap = st ? st->cap : 0;
    if (strncmp(id, mine, (size_t)ml) == 0 && strspn(id + ml, "0123456789") == strlen(id + ml) && id[ml]) {
        uint64_t num = strtoull(id + ml, NULL, 10);
        if (num < evicted_below)
            tp_api_err(e, TP_ERR_INVALID_ARG, "previous_response_id", "Previous response with id '%.64s' was evicted: this server "
                        "keeps the last %d responses in memory (--responses-store); start the conversation again "
                        "with the whole input", id, cap);
        else
            tp_api_err(e, TP_ERR_INVALID_ARG, "previous_response_id", "Previous response with id '%.64s' was not stored (it was "
                        "sent with store: false, did not finish, was deleted, or the store is off: --responses-store %d)", id, cap);
    } else {
        tp_api_err(e, TP_ERR_INVALID_ARG, "previous_response_id", "Previous response with id '%.64s' not found (this server keeps "
                    "its own responses in memory only, and they are lost when it restarts)", id);
    }
    e->code = "previous_response_not_found";
    return NULL;
}

/* ------------------------------------------------------------ request */

static const cJSON *field(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

struct resp_ctx {
    cJSON *echo;          /* the request fields a response object repeats (owned) */
    cJSON *history;       /* chat messages without instructions, for the store (owned) */
    cJSON *input_items;   /* the input as items with ids, for the store (owned) */
    int store;
    int seq;              /* stream sequence_number */
    int64_t created_at;
    /* streaming: output items announced, and the one open (OPEN_*) with its output_index */
    int n_items, open, open_index;
    char open_name[TP_TOOL_NAME_BYTES]; /* the open call's name */
};
enum { OPEN_NONE = 0, OPEN_MESSAGE, OPEN_CALL };

static void ctx_free(void *p)
{
    struct resp_ctx *x = p;
    if (!x) return;
    cJSON_Delete(x->echo);
    cJSON_Delete(x->history);
    cJSON_Delete(x->input_items);
    free(x);
}

/* Text of an item's content: a string, or a list of input_text / output_text parts, joined as chat completions
 * joins text parts (a newline before each part when the text so far is not empty, as llama-server does). */
static int content_text(const cJSON *c, const char *param, struct tp_buf *b, struct tp_api_error *e)
{
    if (cJSON_IsString(c)) return tp_buf_puts(b, c->valuestring) ? tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory") : 0;
    if (!cJSON_IsArray(c)) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' must be a string or a list of content parts", param);
    int k = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *ty = cJSON_IsObject(part) ? field(part, "type") : NULL, *tx = field(part, "text");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text"))
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s'[%d] is a '%.40s' part; this server takes input_text and "
                                              "output_text parts only", param, k, t[0] ? t : "?");
        if (!cJSON_IsString(tx)) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s'[%d].text must be a string", param, k);
        if ((b->len > 0 && tp_buf_puts(b, "\n")) || tp_buf_puts(b, tx->valuestring))
            return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        k++;
    }
    return 0;
}

static void add_msg(cJSON *arr, const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, m);
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
}

/* A function_call item as a chat tool call, added to the assistant message that ends msgs (a new one when
 * the last message is not the assistant's). */
static int add_call(cJSON *msgs, const cJSON *it, const char *param, struct tp_api_error *e)
{
    const cJSON *cid = field(it, "call_id"), *nm = field(it, "name"), *args = field(it, "arguments");
    if (!cJSON_IsString(cid) || !cJSON_IsString(nm) || !cJSON_IsString(args))
        return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' (a function_call item) needs 'call_id', 'name' and "
                          "'arguments' (strings)", param);
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const cJSON *lr = last ? cJSON_GetObjectItemCaseSensitive(last, "role") : NULL;
    if (!cJSON_IsString(lr) || strcmp(lr->valuestring, "assistant") != 0) {
        last = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, last);
        cJSON_AddStringToObject(last, "role", "assistant");
        cJSON_AddNullToObject(last, "content");
    }
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
    if (!calls) calls = cJSON_AddArrayToObject(last, "tool_calls");
    cJSON *c = tp_run_chat_call(cid->valuestring, nm->valuestring, args->valuestring, strlen(args->valuestring));
    if (!c) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
    cJSON_AddItemToArray(calls, c);
    return 0;
}

/* input: a string (one user message) or a list of items, appended to msgs as chat messages and to items
 * (when not NULL) as the items OpenAI lists for the response (ids are added when it is stored). */
static int translate_input(const cJSON *input, cJSON *msgs, cJSON *items, struct tp_api_error *e)
{
    if (cJSON_IsString(input)) {
        add_msg(msgs, "user", input->valuestring);
        if (items) {
            cJSON *it = cJSON_CreateObject();
            cJSON_AddItemToArray(items, it);
            cJSON_AddStringToObject(it, "type", "message");
            cJSON_AddStringToObject(it, "role", "user");
            cJSON *part = cJSON_CreateObject();
            cJSON_AddStringToObject(part, "type", "input_text");
            cJSON_AddStringToObject(part, "text", input->valuestring);
            cJSON_AddItemToArray(cJSON_AddArrayToObject(it, "content"), part);
            cJSON_AddStringToObject(it, "status", "completed");
        }
        return 0;
    }
    if (!cJSON_IsArray(input)) return tp_api_err(e, TP_ERR_INVALID_ARG, "input", "'input' must be a string or a list of items");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, input)
    {
        char param[48];
        snprintf(param, sizeof param, "input[%d]", i);
        if (!cJSON_IsObject(it)) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' must be an object", param);
        const cJSON *ty = field(it, "type"), *role = field(it, "role");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : "message";
        if (strcmp(t, "message") == 0) {
            const char *r = cJSON_IsString(role) ? role->valuestring : "";
            if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer"))
                return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s.role' must be \"user\", \"assistant\", \"system\" or "
                                                  "\"developer\"", param);
            struct tp_buf b = {0};
            char cp[64];
            snprintf(cp, sizeof cp, "%s.content", param);
            const cJSON *c = field(it, "content");
            if (!c) return tp_api_err(e, TP_ERR_INVALID_ARG, cp, "'%s' is required", cp);
            if (content_text(c, cp, &b, e)) {
                tp_buf_free(&b);
                return -1;
            }
            add_msg(msgs, strcmp(r, "developer") == 0 ? "system" : r, b.data ? b.data : "");
            tp_buf_free(&b);
        } else if (strcmp(t, "function_call") == 0) {
            if (add_call(msgs, it, param, e)) return -1;
        } else if (strcmp(t, "function_call_output") == 0) {
            const cJSON *cid = field(it, "call_id"), *o = field(it, "output");
            char op[64];
            snprintf(op, sizeof op, "%s.output", param);
            if (!cJSON_IsString(cid))
                return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s.call_id' is required (a string)", param);
            struct tp_buf b = {0};
            if (!o) return tp_api_err(e, TP_ERR_INVALID_ARG, op, "'%s' is required", op);
            if (content_text(o, op, &b, e)) {
                tp_buf_free(&b);
                return -1;
            }
            cJSON *m = cJSON_CreateObject();
            cJSON_AddItemToArray(msgs, m);
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", cid->valuestring);
            cJSON_AddStringToObject(m, "content", b.data ? b.data : "");
            tp_buf_free(&b);
        } else if (strcmp(t, "reasoning") == 0) {
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' is a reasoning item; this server's model has no reasoning "
                                              "channel", param);
        } else {
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' has type '%.40s'; this server takes message, "
                              "function_call and function_call_output items", param, t);
        }
        if (items) cJSON_AddItemToArray(items, cJSON_Duplicate(it, 1));
        i++;
    }
    if (i == 0) return tp_api_err(e, TP_ERR_INVALID_ARG, "input", "'input' is an empty list");
    return 0;
}

/* Hosted tools the server cannot run: dropped with a log line. */
static int hosted_tool(const char *t)
{
    static const char *const hosted[] = {"web_search", "web_search_preview", "web_search_preview_2025_03_11",
                                         "file_search", "code_interpreter", "computer_use_preview", "image_generation",
                                         "local_shell", "mcp", "namespace", "custom", "web_search_2025_08_26"};
    for (size_t i = 0; i < TP_ARRAY_LEN(hosted); i++)
        if (strcmp(t, hosted[i]) == 0) return 1;
    return 0;
}

static int translate_tools(const cJSON *root, cJSON *out, cJSON *echo, struct tp_api_error *e)
{
    const cJSON *tools = field(root, "tools"), *choice = field(root, "tool_choice");
    if (tools && !cJSON_IsArray(tools)) return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "'tools' must be a list");
    cJSON *arr = cJSON_CreateArray(), *earr = cJSON_AddArrayToObject(echo, "tools");
    int i = 0, n = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *ty = cJSON_IsObject(t) ? field(t, "type") : NULL;
        const char *tn = cJSON_IsString(ty) ? ty->valuestring : "";
        if (strcmp(tn, "function") != 0) {
            if (!hosted_tool(tn)) {
                cJSON_Delete(arr);
                return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "'tools'[%d] has type '%.40s'; this server runs function tools",
                                   i, tn[0] ? tn : "?");
            }
            tp_log(TP_LOG_INFO, "http", "/v1/responses: hosted tool '%s' left out (this server cannot run it)", tn);
            i++;
            continue;
        }
        const cJSON *nm = field(t, "name"), *pa = field(t, "parameters"), *de = field(t, "description");
        const cJSON *sx = field(t, "strict");
        if (!cJSON_IsString(nm)) {
            cJSON_Delete(arr);
            return tp_api_err(e, TP_ERR_INVALID_ARG, "tools", "'tools'[%d].name is required (a string)", i);
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, o);
        cJSON_AddStringToObject(o, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(fn, "name", nm->valuestring);
        if (de) cJSON_AddItemToObject(fn, "description", cJSON_Duplicate(de, 1));
        if (pa) cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(pa, 1));
        if (sx) cJSON_AddItemToObject(fn, "strict", cJSON_Duplicate(sx, 1));
        cJSON_AddItemToArray(earr, cJSON_Duplicate(t, 1));
        i++;
        n++;
    }
    if (n) cJSON_AddItemToObject(out, "tools", arr);
    else cJSON_Delete(arr);
    if (!choice) {
        cJSON_AddStringToObject(echo, "tool_choice", "auto");
        return 0;
    }
    cJSON_AddItemToObject(echo, "tool_choice", cJSON_Duplicate(choice, 1));
    if (cJSON_IsString(choice)) {
        if (strcmp(choice->valuestring, "auto") && strcmp(choice->valuestring, "none") &&
            strcmp(choice->valuestring, "required"))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                                      "{\"type\": \"function\", \"name\": ...}");
        if (n || strcmp(choice->valuestring, "auto")) cJSON_AddStringToObject(out, "tool_choice", choice->valuestring);
        return 0;
    }
    const cJSON *ty = cJSON_IsObject(choice) ? field(choice, "type") : NULL, *nm = field(choice, "name");
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                                  "{\"type\": \"function\", \"name\": ...}");
    cJSON *o = cJSON_AddObjectToObject(out, "tool_choice");
    cJSON_AddStringToObject(o, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", nm->valuestring);
    return 0;
}

/* text: {"format": {"type": "text" | "json_object" | "json_schema", name, schema, strict, description}} */
static int translate_text(const cJSON *root, cJSON *out, cJSON *echo, struct tp_api_error *e)
{
    const cJSON *tx = field(root, "text");
    const cJSON *fmt = cJSON_IsObject(tx) ? field(tx, "format") : NULL;
    if (tx && !cJSON_IsObject(tx)) return tp_api_err(e, TP_ERR_INVALID_ARG, "text", "'text' must be an object {\"format\": ...}");
    const cJSON *kv;
    cJSON_ArrayForEach(kv, tx)
    {
        if (strcmp(kv->string, "format") && strcmp(kv->string, "verbosity"))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "text", "Unknown parameter: 'text.%.40s'.", kv->string);
    }
    const cJSON *verb = tx ? field(tx, "verbosity") : NULL;
    if (verb && !(cJSON_IsString(verb) && strcmp(verb->valuestring, "medium") == 0))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "text.verbosity", "'text.verbosity' other than \"medium\" is not supported by "
                                                     "this server");
    cJSON *etext = cJSON_AddObjectToObject(echo, "text");
    if (!fmt) {
        cJSON_AddStringToObject(cJSON_AddObjectToObject(etext, "format"), "type", "text");
        return 0;
    }
    cJSON_AddItemToObject(etext, "format", cJSON_Duplicate(fmt, 1));
    const cJSON *ty = cJSON_IsObject(fmt) ? field(fmt, "type") : NULL;
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
    if (strcmp(t, "text") == 0) return 0;
    cJSON *rf = cJSON_AddObjectToObject(out, "response_format");
    if (strcmp(t, "json_object") == 0) {
        cJSON_AddStringToObject(rf, "type", "json_object");
        return 0;
    }
    if (strcmp(t, "json_schema") != 0)
        return tp_api_err(e, TP_ERR_INVALID_ARG, "text.format.type", "'text.format.type' must be \"text\", \"json_object\" or "
                                                       "\"json_schema\"");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_ArrayForEach(kv, fmt)
    {
        if (strcmp(kv->string, "type") == 0) continue;
        cJSON_AddItemToObject(js, kv->string, cJSON_Duplicate(kv, 1));
    }
    if (!field(fmt, "name")) return tp_api_err(e, TP_ERR_INVALID_ARG, "text.format.name", "'text.format.name' is required");
    return 0;
}

static const char *const rename_fields[][2] = {
    {"response_format.json_schema", "text.format"},
    {"response_format", "text.format"},
    {"max_completion_tokens", "max_output_tokens"},
    {"max_tokens", "max_output_tokens"},
    {"messages", "input"},
    {NULL, NULL},
};

/* What a response repeats for a field the request left out: the server's generation defaults for temperature
 * and top_p, true for parallel_tool_calls, else null. */
static cJSON *echo_default(const struct tp_server *s, const char *name)
{
    if (strcmp(name, "temperature") == 0) return cJSON_CreateNumber(tp_srv_num(s->gen.temperature));
    if (strcmp(name, "top_p") == 0) return cJSON_CreateNumber(tp_srv_num(s->gen.top_p));
    return strcmp(name, "parallel_tool_calls") == 0 ? cJSON_CreateTrue() : cJSON_CreateNull();
}

/* Every field of the body is one the Responses API has, and none that would change the answer but that this
 * server does not implement.  TP_OK or TP_ERR_INVALID_ARG (e filled). */
static enum tp_status resp_check_known(const cJSON *root, struct tp_api_error *e)
{
    static const char *const known[] = {
        "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice", "text",
        "reasoning", "stream", "store", "previous_response_id", "metadata", "parallel_tool_calls", "truncation", "user",
        "include", "service_tier", "prompt_cache_key", "safety_identifier", "stream_options", "background",
        "top_logprobs", "max_tool_calls", "conversation", "prompt", "client_metadata"};
    const cJSON *kv;
    cJSON_ArrayForEach(kv, root)
    {
        int ok = 0;
        for (size_t i = 0; i < TP_ARRAY_LEN(known) && !ok; i++) ok = strcmp(kv->string, known[i]) == 0;
        if (!ok) {
            tp_api_err(e, TP_ERR_INVALID_ARG, kv->string, "Unknown parameter: '%.60s'.", kv->string);
            e->code = "unknown_parameter";
            return e->status;
        }
    }
    static const char *const refused[][2] = {
        {"conversation", "conversations are not stored by this server; use previous_response_id"},
        {"prompt", "prompt templates are not stored by this server; send the input"},
        {"background", "background responses are not supported; send the request and wait, or stream it"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(refused); i++) {
        const cJSON *v = field(root, refused[i][0]);
        if (v && !(cJSON_IsBool(v) && !cJSON_IsTrue(v)))
            return tp_api_err(e, TP_ERR_INVALID_ARG, refused[i][0], "'%s': %s", refused[i][0], refused[i][1]);
    }
    return TP_OK;
}

/* top_logprobs (0 only), include (the encrypted reasoning only: there is none to include) and reasoning (no
 * effort but "none"; a summary is accepted, there is none to summarise).  TP_OK or TP_ERR_INVALID_ARG. */
static enum tp_status resp_check_reasoning(const cJSON *root, struct tp_api_error *e)
{
    const cJSON *v = field(root, "top_logprobs");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "top_logprobs", "'top_logprobs' is not supported on /v1/responses by this server; use "
                                            "/v1/chat/completions with logprobs");
    v = field(root, "include");
    if (v) {
        if (!cJSON_IsArray(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "include", "'include' must be a list of strings");
        const cJSON *inc;
        cJSON_ArrayForEach(inc, v)
        {
            if (!cJSON_IsString(inc) || strcmp(inc->valuestring, "reasoning.encrypted_content") != 0)
                return tp_api_err(e, TP_ERR_INVALID_ARG, "include", "'include' value '%.60s' is not supported by this server",
                            cJSON_IsString(inc) ? inc->valuestring : "?");
        }
    }
    v = field(root, "reasoning");
    if (!v) return TP_OK;
    const cJSON *eff = cJSON_IsObject(v) ? field(v, "effort") : NULL;
    if (!cJSON_IsObject(v) || (eff && !(cJSON_IsString(eff) && strcmp(eff->valuestring, "none") == 0))) {
        tp_api_err(e, TP_ERR_INVALID_ARG, "reasoning.effort", "'reasoning.effort' is not supported with this model: it has no "
                                                "reasoning channel; leave 'reasoning' out");
        e->code = "unsupported_parameter";
        return e->status;
    }
    /* a summary of the reasoning (Codex asks for "auto") */
    const cJSON *kv;
    cJSON_ArrayForEach(kv, v)
    {
        const int sum = strcmp(kv->string, "summary") == 0 || strcmp(kv->string, "generate_summary") == 0;
        if (strcmp(kv->string, "effort") && !sum) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "reasoning", "Unknown parameter: 'reasoning.%.40s'.", kv->string);
            e->code = "unknown_parameter";
            return e->status;
        }
        if (sum && !cJSON_IsNull(kv) &&
            !(cJSON_IsString(kv) && (strcmp(kv->valuestring, "auto") == 0 || strcmp(kv->valuestring, "concise") == 0 ||
                                     strcmp(kv->valuestring, "detailed") == 0)))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "reasoning", "'reasoning.%s' must be \"auto\", \"concise\" or "
                       "\"detailed\"", kv->string);
    }
    return TP_OK;
}

/* The plain fields: truncation, store (ctx->store), metadata, client_metadata, the strings; the model and the
 * sampling fields passed on to the chat-completions body out, and what the response repeats into echo.
 * for_count: /v1/responses/input_tokens (no max_output_tokens, no stream).  TP_OK or TP_ERR_INVALID_ARG. */
static enum tp_status resp_parse_plain(const struct tp_server *s, const cJSON *root, int for_count, cJSON *out,
                                       cJSON *echo, struct resp_ctx *ctx, struct tp_api_error *e)
{
    const cJSON *v = field(root, "truncation");
    if (v && !(cJSON_IsString(v) && (strcmp(v->valuestring, "disabled") == 0 || strcmp(v->valuestring, "auto") == 0)))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "truncation", "'truncation' must be \"disabled\" or \"auto\"");
    cJSON_AddStringToObject(echo, "truncation", "disabled");
    v = field(root, "store");
    if (v && !cJSON_IsBool(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "store", "'store' must be a boolean");
    ctx->store = !v || cJSON_IsTrue(v);
    cJSON_AddBoolToObject(echo, "store", ctx->store);
    v = field(root, "metadata");
    if (v && !cJSON_IsObject(v))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "metadata", "'metadata' must be an object of strings");
    cJSON_AddItemToObject(echo, "metadata", v ? cJSON_Duplicate(v, 1) : cJSON_CreateObject());
    v = field(root, "client_metadata"); /* what Codex says about itself (session ids): changes nothing */
    if (v && !cJSON_IsObject(v))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "client_metadata", "'client_metadata' must be an object");
    static const char *const strs[] = {"user", "service_tier", "prompt_cache_key", "safety_identifier", "model"};
    for (size_t i = 0; i < TP_ARRAY_LEN(strs); i++) {
        v = field(root, strs[i]);
        if (v && !cJSON_IsString(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, strs[i], "'%s' must be a string", strs[i]);
    }
    v = field(root, "model");
    if (v) cJSON_AddStringToObject(out, "model", v->valuestring);
    cJSON_AddStringToObject(echo, "model", v ? v->valuestring : s->model_id);
    static const char *const pass[][2] = {{"temperature", "temperature"}, {"top_p", "top_p"},
                                          {"max_output_tokens", "max_tokens"}, {"stream", "stream"},
                                          {"parallel_tool_calls", "parallel_tool_calls"}, {"user", "user"}};
    for (size_t i = 0; i < TP_ARRAY_LEN(pass); i++) {
        v = field(root, pass[i][0]);
        if (v && (!for_count || strcmp(pass[i][0], "max_output_tokens") != 0))
            cJSON_AddItemToObject(out, pass[i][1], cJSON_Duplicate(v, 1));
        /* the response repeats the value used: the server's defaults where the request left one out */
        if (strcmp(pass[i][0], "stream") == 0) continue;
        cJSON_AddItemToObject(echo, pass[i][0], v ? cJSON_Duplicate(v, 1) : echo_default(s, pass[i][0]));
    }
    if (for_count) cJSON_DeleteItemFromObject(out, "stream");
    return TP_OK;
}

/* The conversation as out's messages: the previous response's (ctx->history from the store), then the
 * instructions first, then the input (ctx->input_items for the store unless for_count).  TP_OK or an error
 * in e. */
static enum tp_status resp_conversation(struct tp_server *s, const cJSON *root, int for_count, cJSON *out,
                                        cJSON *echo, struct resp_ctx *ctx, struct tp_api_error *e)
{
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    ctx->history = cJSON_CreateArray();
    const cJSON *v = field(root, "previous_response_id");
    cJSON_AddItemToObject(echo, "previous_response_id", v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
    if (v) {
        if (!cJSON_IsString(v))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "previous_response_id", "'previous_response_id' must be a string");
        cJSON *prev = store_get(s, v->valuestring, e);
        if (!prev) return e->status;
        cJSON_Delete(ctx->history);
        ctx->history = prev;
    }
    v = field(root, "instructions");
    cJSON_AddItemToObject(echo, "instructions", v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
    if (v) {
        if (!cJSON_IsString(v))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "instructions", "'instructions' must be a string");
        add_msg(msgs, "system", v->valuestring);
    }
    v = field(root, "input");
    if (!v) return tp_api_err(e, TP_ERR_INVALID_ARG, "input", "'input' is required (a string or a list of items)");
    if (!for_count && !(ctx->input_items = cJSON_CreateArray()))
        return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
    if (translate_input(v, ctx->history, ctx->input_items, e)) return e->status;
    const cJSON *m;
    cJSON_ArrayForEach(m, ctx->history) cJSON_AddItemToArray(msgs, cJSON_Duplicate(m, 1));
    return TP_OK;
}

/* Validate a Responses body and translate it into p (through the equivalent chat-completions body); ctx gets
 * what the answer repeats.  for_count: /v1/responses/input_tokens.  0, or nonzero with e filled. */
static int parse_request(struct tp_server *s, const char *body, size_t len, int for_count, struct tp_req_params *p,
                         struct resp_ctx *ctx, struct tp_api_error *e)
{
    cJSON *root = tp_json_parse(body, len, e);
    if (!root) return -1;
    cJSON *out = cJSON_CreateObject(), *echo = ctx->echo = cJSON_CreateObject();
    int rc = -1;
    if (resp_check_known(root, e) == TP_OK && resp_check_reasoning(root, e) == TP_OK &&
        resp_parse_plain(s, root, for_count, out, echo, ctx, e) == TP_OK &&
        resp_conversation(s, root, for_count, out, echo, ctx, e) == TP_OK && !translate_tools(root, out, echo, e) &&
        !translate_text(root, out, echo, e))
        rc = tp_run_parse_chat(s, out, rename_fields, p, e);
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

static int incomplete(const struct tp_req *r) { return r->finish == TP_FINISH_LENGTH; }

/* The id of output item k of a response: "msg_<id digits>" for its message, "fc_<id digits>_<k>" for
 * function call k (call < 0: the message). */
static void item_id(const struct tp_run *x, int call, char *out, size_t cap)
{
    const char *u = x->r->id + strlen("resp_");
    if (call < 0) snprintf(out, cap, "msg_%s", u);
    else snprintf(out, cap, "fc_%s_%d", u, call);
}

/* A message item with text[0..n) (NULL: no content part yet) and status. */
static cJSON *message_item(const struct tp_run *x, const char *text, size_t n, const char *status)
{
    char id[96];
    item_id(x, -1, id, sizeof id);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "type", "message");
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(it, "content");
    if (text) {
        cJSON *part = cJSON_CreateObject();
        cJSON_AddStringToObject(part, "type", "output_text");
        tp_json_add_bytes(part, "text", text, n);
        cJSON_AddArrayToObject(part, "annotations");
        cJSON_AddArrayToObject(part, "logprobs");
        cJSON_AddItemToArray(content, part);
    }
    return it;
}

/* A function_call item: call k named name with arguments args[0..n). */
static cJSON *call_item(const struct tp_run *x, int k, const char *name, const char *args, size_t n,
                        const char *status)
{
    char id[96], cid[96];
    item_id(x, k, id, sizeof id);
    tp_run_call_id(x->s, x->r, k, "call_", cid, sizeof cid);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "call_id", cid);
    cJSON_AddStringToObject(it, "name", name);
    tp_json_add_bytes(it, "arguments", args, n);
    cJSON_AddStringToObject(it, "status", status);
    return it;
}

/* The output items of a finished request: a message with the content (when there is any, or no call),
 * then a function_call item per call. */
static cJSON *output_items(const struct tp_run *x)
{
    const struct tp_req *r = x->r;
    struct tp_tool_scan sc;
    size_t base;
    const int n_calls = tp_run_reply_calls(r, &sc, &base);
    const char *text = (r->text.data ? r->text.data : "") + base; /* the content and calls (after </think>) */
    cJSON *out = cJSON_CreateArray();
    if (sc.content_end > 0 || n_calls == 0)
        cJSON_AddItemToArray(out, message_item(x, text, sc.content_end, incomplete(r) ? "incomplete" : "completed"));
    for (int k = 0; k < sc.n_calls; k++) {
        const struct tp_tool_call_view *v = &sc.calls[k];
        if (v->complete)
            cJSON_AddItemToArray(out, call_item(x, k, v->name, text + v->args_off, v->args_len, "completed"));
    }
    return out;
}

/* The response object: in progress (done 0) or finished. */
static cJSON *response_object(struct tp_run *x, int done)
{
    struct resp_ctx *ctx = x->ctx;
    const struct tp_req *r = x->r;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)ctx->created_at);
    cJSON_AddStringToObject(o, "status", !done ? "in_progress" : incomplete(r) ? "incomplete" : "completed");
    cJSON_AddNullToObject(o, "error");
    if (done && incomplete(r))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason", "max_output_tokens");
    else
        cJSON_AddNullToObject(o, "incomplete_details");
    const cJSON *kv;
    cJSON_ArrayForEach(kv, ctx->echo) cJSON_AddItemToObject(o, kv->string, cJSON_Duplicate(kv, 1));
    cJSON *reasoning = cJSON_AddObjectToObject(o, "reasoning");
    cJSON_AddNullToObject(reasoning, "effort");
    cJSON_AddNullToObject(reasoning, "summary");
    if (done) {
        cJSON_AddItemToObject(o, "output", output_items(x));
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "input_tokens", r->n_prompt);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", r->n_cached);
        cJSON_AddNumberToObject(u, "output_tokens", r->n_toks);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", 0);
        cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + r->n_toks);
    } else {
        cJSON_AddArrayToObject(o, "output");
        cJSON_AddNullToObject(o, "usage");
    }
    return o;
}

/* A finished response goes into the store (unless store: false): its conversation (for
 * previous_response_id), the response object and its input items (for GET /v1/responses/{id}). */
static void remember(struct tp_run *x, const cJSON *response)
{
    struct resp_ctx *ctx = x->ctx;
    const struct tp_req *r = x->r;
    if (!ctx->store || !ctx->history || r->finish == TP_FINISH_ERROR) return;
    struct tp_tool_scan sc;
    size_t base;
    const int n_calls = tp_run_reply_calls(r, &sc, &base);
    const char *text = (r->text.data ? r->text.data : "") + base; /* the content and calls (after </think>) */
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(ctx->history, m);
    cJSON_AddStringToObject(m, "role", "assistant");
    if (sc.content_end > 0 || n_calls == 0) tp_json_add_bytes(m, "content", text, sc.content_end);
    else cJSON_AddNullToObject(m, "content");
    cJSON *calls = n_calls ? cJSON_AddArrayToObject(m, "tool_calls") : NULL;
    for (int k = 0; k < sc.n_calls && calls; k++) {
        const struct tp_tool_call_view *v = &sc.calls[k];
        if (!v->complete) continue;
        char cid[96];
        tp_run_call_id(x->s, r, k, "call_", cid, sizeof cid);
        cJSON_AddItemToArray(calls, tp_run_chat_call(cid, v->name, text + v->args_off, v->args_len));
    }
    /* input items get ids as OpenAI lists them: "<kind>_<response id digits>_in<k>" */
    int k = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, ctx->input_items)
    {
        if (!cJSON_IsObject(it) || cJSON_IsString(cJSON_GetObjectItemCaseSensitive(it, "id"))) {
            k++;
            continue;
        }
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : "message";
        char id[96];
        snprintf(id, sizeof id, "%s_%s_in%d", !strcmp(t, "function_call") ? "fc" : !strcmp(t, "function_call_output") ? "fco" : "msg",
                 r->id + strlen("resp_"), k++);
        cJSON_DeleteItemFromObjectCaseSensitive(it, "id");
        cJSON_AddStringToObject(it, "id", id);
    }
    uint64_t num = strtoull(r->id + strlen("resp_") + (size_t)snprintf(NULL, 0, "%llx", (unsigned long long)x->s->created),
                            NULL, 10);
    store_put(x->s->resp_store, r->id, num, ctx->history, cJSON_Duplicate(response, 1), ctx->input_items);
    ctx->history = ctx->input_items = NULL;
}

static char *final_json(struct tp_run *x)
{
    cJSON *o = response_object(x, 1);
    remember(x, o);
    return print_free(o);
}

/* An event object whose "type" comes first, as OpenAI sends it. */
static cJSON *ev(const char *type)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

/* "event: <type>\ndata: <json with sequence_number>\n\n"; frees o. */
static void event(struct tp_run *x, struct tp_buf *out, cJSON *o)
{
    struct resp_ctx *ctx = x->ctx;
    cJSON_AddNumberToObject(o, "sequence_number", ctx->seq++);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    tp_buf_printf(out, "event: %s\ndata: ", cJSON_IsString(t) ? t->valuestring : "message");
    char *j = print_free(o);
    if (j) tp_buf_puts(out, j);
    tp_buf_puts(out, "\n\n");
    free(j);
}

/* An event about output item index (id: item_id of call, -1 the message), with content_index 0 for text. */
static cJSON *at_item(struct tp_run *x, const char *type, int call, int index, int with_content)
{
    char id[96];
    item_id(x, call, id, sizeof id);
    cJSON *o = ev(type);
    cJSON_AddStringToObject(o, "item_id", id);
    cJSON_AddNumberToObject(o, "output_index", index);
    if (with_content) cJSON_AddNumberToObject(o, "content_index", 0);
    return o;
}

static cJSON *text_part(const char *s, size_t n)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    tp_json_add_bytes(p, "text", s, n);
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

static void item_added(struct tp_run *x, struct tp_buf *out, int index, cJSON *item)
{
    cJSON *o = ev("response.output_item.added");
    cJSON_AddNumberToObject(o, "output_index", index);
    cJSON_AddItemToObject(o, "item", item);
    event(x, out, o);
}

static void item_done(struct tp_run *x, struct tp_buf *out, int index, cJSON *item)
{
    cJSON *o = ev("response.output_item.done");
    cJSON_AddNumberToObject(o, "output_index", index);
    cJSON_AddItemToObject(o, "item", item);
    event(x, out, o);
}

static void open_message(struct tp_run *x, struct tp_buf *out)
{
    struct resp_ctx *ctx = x->ctx;
    ctx->open = OPEN_MESSAGE;
    ctx->open_index = ctx->n_items++;
    item_added(x, out, ctx->open_index, message_item(x, NULL, 0, "in_progress"));
    cJSON *o = at_item(x, "response.content_part.added", -1, ctx->open_index, 1);
    cJSON_AddItemToObject(o, "part", text_part("", 0));
    event(x, out, o);
}

/* Close the open item: the message's text is the content sent, calls.sent_text bytes from calls.base. */
static void close_open(struct tp_run *x, struct tp_buf *out)
{
    struct resp_ctx *ctx = x->ctx;
    const struct tp_req *r = x->r;
    if (ctx->open == OPEN_MESSAGE) {
        const char *text = (r->text.data ? r->text.data : "") + x->calls.base;
        size_t n = x->calls.sent_text;
        cJSON *o = at_item(x, "response.output_text.done", -1, ctx->open_index, 1);
        tp_json_add_bytes(o, "text", text, n);
        cJSON_AddArrayToObject(o, "logprobs");
        event(x, out, o);
        o = at_item(x, "response.content_part.done", -1, ctx->open_index, 1);
        cJSON_AddItemToObject(o, "part", text_part(text, n));
        event(x, out, o);
        const char *st = incomplete(r) && r->state == TP_REQ_DONE ? "incomplete" : "completed";
        item_done(x, out, ctx->open_index, message_item(x, text, n, st));
    } else if (ctx->open == OPEN_CALL) { /* a call cut short by the limit */
        const int k = x->calls.n_begun - 1;
        cJSON *it = call_item(x, k, ctx->open_name, "", 0, "incomplete");
        item_done(x, out, ctx->open_index, it);
    }
    ctx->open = OPEN_NONE;
}

static void s_begin(struct tp_run *x, struct tp_buf *out)
{
    cJSON *o = ev("response.created");
    cJSON_AddItemToObject(o, "response", response_object(x, 0));
    event(x, out, o);
    o = ev("response.in_progress");
    cJSON_AddItemToObject(o, "response", response_object(x, 0));
    event(x, out, o);
    /* a reply that may hold function calls announces its items as they come */
    if (x->r->params.tool_format == TP_TOOL_FORMAT_NONE) open_message(x, out);
}

static void s_text(struct tp_run *x, const char *text, size_t n, struct tp_buf *out)
{
    struct resp_ctx *ctx = x->ctx;
    if (ctx->open != OPEN_MESSAGE) open_message(x, out);
    cJSON *o = at_item(x, "response.output_text.delta", -1, ctx->open_index, 1);
    tp_json_add_bytes(o, "delta", text, n);
    cJSON_AddArrayToObject(o, "logprobs");
    event(x, out, o);
}

static void s_call_begin(struct tp_run *x, int k, const char *id, const char *name, struct tp_buf *out)
{
    (void)id;
    struct resp_ctx *ctx = x->ctx;
    close_open(x, out);
    ctx->open = OPEN_CALL;
    ctx->open_index = ctx->n_items++;
    snprintf(ctx->open_name, sizeof ctx->open_name, "%s", name);
    item_added(x, out, ctx->open_index, call_item(x, k, name, "", 0, "in_progress"));
}

static void s_call_args(struct tp_run *x, int k, const char *args, size_t n, struct tp_buf *out)
{
    struct resp_ctx *ctx = x->ctx;
    cJSON *o = at_item(x, "response.function_call_arguments.delta", k, ctx->open_index, 0);
    tp_json_add_bytes(o, "delta", args, n);
    event(x, out, o);
}

static void s_call_done(struct tp_run *x, int k, const char *name, const char *args, size_t n, struct tp_buf *out)
{
    struct resp_ctx *ctx = x->ctx;
    cJSON *o = at_item(x, "response.function_call_arguments.done", k, ctx->open_index, 0);
    cJSON_AddStringToObject(o, "name", name);
    tp_json_add_bytes(o, "arguments", args, n);
    event(x, out, o);
    item_done(x, out, ctx->open_index, call_item(x, k, name, args, n, "completed"));
    ctx->open = OPEN_NONE;
}

static void s_end(struct tp_run *x, struct tp_buf *out)
{
    struct resp_ctx *ctx = x->ctx;
    const struct tp_req *r = x->r;
    if (ctx->n_items == 0) open_message(x, out); /* an empty reply: one empty message */
    close_open(x, out);
    cJSON *resp = response_object(x, 1);
    remember(x, resp);
    cJSON *o = ev(incomplete(r) ? "response.incomplete" : "response.completed");
    cJSON_AddItemToObject(o, "response", resp);
    event(x, out, o);
}

static void s_error(struct tp_run *x, const struct tp_api_error *e, struct tp_buf *out)
{
    cJSON *o = ev("error");
    cJSON_AddStringToObject(o, "code", tp_http_error_kind(e->status).http_status == 503 ? "server_is_overloaded" : "server_error");
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddNullToObject(o, "param");
    event(x, out, o);
}

static char *error_json(const struct tp_api_error *e) { return tp_api_error_json(e); }

static const struct tp_run_ops responses_ops = {
    .path = "/v1/responses",
    .id_prefix = "resp_",
    .call_id_prefix = "call_",
    .stream_type = "text/event-stream",
    .begin = s_begin,
    .text = s_text,
    .call_begin = s_call_begin,
    .call_args = s_call_args,
    .call_done = s_call_done,
    .end = s_end,
    .error = s_error,
    .keepalive = NULL,
    .final_json = final_json,
    .error_json = error_json,
};

enum MHD_Result tp_api_responses(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    struct tp_req_params p;
    struct tp_api_error e;
    struct resp_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
        return tp_run_send_error(s, c, &responses_ops, &e);
    }
    ctx->created_at = (int64_t)time(NULL);
    if (parse_request(s, body, len, 0, &p, ctx, &e) != 0) {
        ctx_free(ctx);
        return tp_run_send_error(s, c, &responses_ops, &e);
    }
    return tp_run_request(s, c, &responses_ops, &p, NULL, 0, "max_output_tokens", ctx, ctx_free);
}

enum MHD_Result tp_api_responses_input_tokens(struct tp_server *s, struct MHD_Connection *c, const char *body,
                                              size_t len)
{
    struct tp_req_params p;
    struct tp_api_error e;
    struct resp_ctx ctx = {0};
    int rc = parse_request(s, body, len, 1, &p, &ctx, &e);
    cJSON_Delete(ctx.echo);
    cJSON_Delete(ctx.history);
    cJSON_Delete(ctx.input_items);
    if (rc != 0) return tp_run_send_error(s, c, &responses_ops, &e);
    return tp_run_count_tokens(s, c, &responses_ops, &p, "input", "\"object\":\"response.input_tokens\",");
}

/* ------------------------------------------------------------ stored responses */

static enum MHD_Result send_stored(struct tp_server *s, struct MHD_Connection *c, cJSON *o)
{
    char *j = o ? print_free(o) : NULL;
    enum MHD_Result ret = j ? tp_http_send_json(s, c, 200, j) : MHD_NO;
    free(j);
    return ret;
}

/* GET .../input_items: the list object, newest first unless order=asc; limit (1..100, default 20); after
 * (an item id: the items that follow it in that order). */
static enum MHD_Result input_items(struct tp_server *s, struct MHD_Connection *c, cJSON *items)
{
    struct tp_api_error e;
    const char *order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order");
    const char *lim = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    int asc = 0, limit = 20;
    if (order && strcmp(order, "asc") && strcmp(order, "desc")) {
        cJSON_Delete(items);
        tp_api_err(&e, TP_ERR_INVALID_ARG, "order", "'order' must be \"asc\" or \"desc\"");
        return tp_run_send_error(s, c, &responses_ops, &e);
    }
    asc = order && strcmp(order, "asc") == 0;
    if (lim) {
        char *end = NULL;
        long v = strtol(lim, &end, 10);
        if (!*lim || *end || v < 1 || v > 100) {
            cJSON_Delete(items);
            tp_api_err(&e, TP_ERR_INVALID_ARG, "limit", "'limit' must be an integer from 1 to 100");
            return tp_run_send_error(s, c, &responses_ops, &e);
        }
        limit = (int)v;
    }
    const int n = cJSON_GetArraySize(items);
    cJSON *o = cJSON_CreateObject(), *data = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToObject(o, "data", data);
    int skipping = after != NULL, more = 0;
    for (int i = 0; i < n; i++) {
        cJSON *it = cJSON_GetArrayItem(items, asc ? i : n - 1 - i);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (skipping) {
            skipping = !(cJSON_IsString(id) && strcmp(id->valuestring, after) == 0);
            continue;
        }
        if (cJSON_GetArraySize(data) == limit) {
            more = 1;
            break;
        }
        cJSON_AddItemToArray(data, cJSON_Duplicate(it, 1));
    }
    const cJSON *first = data->child, *last = first ? first->prev : NULL;
    const cJSON *fid = first ? cJSON_GetObjectItemCaseSensitive(first, "id") : NULL;
    const cJSON *lid = last ? cJSON_GetObjectItemCaseSensitive(last, "id") : NULL;
    if (cJSON_IsString(fid)) cJSON_AddStringToObject(o, "first_id", fid->valuestring);
    else cJSON_AddNullToObject(o, "first_id");
    if (cJSON_IsString(lid)) cJSON_AddStringToObject(o, "last_id", lid->valuestring);
    else cJSON_AddNullToObject(o, "last_id");
    cJSON_AddBoolToObject(o, "has_more", more);
    cJSON_Delete(items);
    return send_stored(s, c, o);
}

enum MHD_Result tp_api_responses_stored(struct tp_server *s, struct MHD_Connection *c, const char *method,
                                        const char *rest)
{
    struct tp_api_error e;
    char id[64];
    size_t idl = strcspn(rest, "/");
    const char *sub = rest + idl;
    int list = strcmp(sub, "/input_items") == 0, del = strcmp(method, "DELETE") == 0;
    if (idl == 0 || idl >= sizeof id || (*sub && !list) || (del && list)) {
        tp_api_err(&e, TP_ERR_NOT_FOUND, NULL, "no such endpoint: %s /v1/responses/%.80s (GET or DELETE "
                   "/v1/responses/{id}, GET /v1/responses/{id}/input_items)", method, rest);
        return tp_run_send_error(s, c, &responses_ops, &e);
    }
    memcpy(id, rest, idl);
    id[idl] = '\0';
    cJSON *v = store_lookup(s->resp_store, id, del ? WANT_DELETE : list ? WANT_INPUT_ITEMS : WANT_RESPONSE);
    if (!v) {
        tp_api_err(&e, TP_ERR_NOT_FOUND, NULL, "Response with id '%s' not found (this server keeps the last %d "
                   "stored responses in memory: --responses-store)", id, s->resp_store ? s->resp_store->cap : 0);
        return tp_run_send_error(s, c, &responses_ops, &e);
    }
    if (list) return input_items(s, c, v);
    if (del) {
        cJSON_Delete(v);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "object", "response");
        cJSON_AddBoolToObject(o, "deleted", 1);
        return send_stored(s, c, o);
    }
    return send_stored(s, c, v);
}

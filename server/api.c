/*
 * server/api.c - POST /v1/completions and /v1/chat/completions.
 *
 * The HTTP thread validates the body (json_validate.c), renders the chat
 * template, tokenizes, checks the context budget, and submits a request to
 * the engine.  Non-streaming: it waits for the result and answers one JSON
 * object.  Streaming: it answers 200 with a text/event-stream whose content
 * callback turns each published token into an OpenAI chunk
 * (`data: {...}\n\n`), sends `: keep-alive` comments while the prompt is
 * still being read, a final chunk with finish_reason, a usage chunk when
 * stream_options.include_usage, then `data: [DONE]`.  An engine failure in
 * the middle of a stream becomes `data: {"error": {...}}` and the stream ends.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "api_run.h"
#include "http_impl.h"

/* Tool calls read from the finished reply in the request's format (complete
 * calls only): OpenAI tool_calls [{index, id, type, function: {name,
 * arguments (the model's JSON text)}}].  NULL when the reply holds none.
 * *content_end: bytes of the reply that are content (before the calls). */
static cJSON *tool_calls_json(const struct tp_server *s, const struct tp_req *r, size_t base, size_t *content_end)
{
    const char *text = (r->text.data ? r->text.data : "") + base;
    *content_end = r->text.len;
    if (r->params.tool_format == TP_TOOL_FORMAT_NONE) return NULL;
    struct tp_tool_scan sc;
    tp_tool_scan(r->params.tool_format, text, r->text.len - base, 1, &sc);
    cJSON *calls = NULL;
    for (int k = 0; k < sc.n_calls; k++) {
        const struct tp_tool_call_view *v = &sc.calls[k];
        if (!v->complete) continue;
        if (!calls && !(calls = cJSON_CreateArray())) return NULL;
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(calls, c);
        cJSON_AddNumberToObject(c, "index", cJSON_GetArraySize(calls) - 1);
        char id[96];
        tp_run_call_id(s, r, k, "call_", id, sizeof id);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(fn, "name", v->name);
        tp_json_add_bytes(fn, "arguments", text + v->args_off, v->args_len);
    }
    if (calls) *content_end = base + sc.content_end;
    return calls;
}

static const char *finish_str(const struct tp_req *r, int has_calls)
{
    if (r->finish == TP_FINISH_LENGTH) return "length";
    return has_calls ? "tool_calls" : "stop";
}

/* ------------------------------------------------------- harmony replies */

/* harmony replies are split by channel; one under response_format's grammar is plain JSON text (the
 * grammar leaves the model no channel tokens), answered as content like any other template's. */
static int is_harmony(const struct tp_server *s, const struct tp_req *r)
{
    return r->chat && s->chat == TP_CHAT_HARMONY && (!r->params.grammar || r->params.harmony_calls);
}
/* qwen3-family replies: <think> reasoning split from the answer (not when the reply may hold tool calls:
 * those are read by tool_parse.c, the reasoning left in content). */
static int is_think(const struct tp_server *s, const struct tp_req *r)
{
    return r->chat && s->chat == TP_CHAT_QWEN3 && r->params.tool_format == TP_TOOL_FORMAT_NONE;
}

static const char *harmony_finish(const struct tp_req *r, int n_calls)
{
    if (r->finish == TP_FINISH_LENGTH) return "length";
    return n_calls > 0 ? "tool_calls" : "stop";
}

static void add_piece_string(struct tp_server *s, cJSON *o, const char *key, int id, int with_bytes)
{
    size_t l = 0;
    const char *p = tp_tokenizer_piece(s->tok, id, &l);
    tp_json_add_bytes(o, key, p ? p : "", p ? l : 0);
    if (with_bytes) {
        cJSON *arr = cJSON_AddArrayToObject(o, "bytes");
        for (size_t i = 0; p && i < l; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)p[i]));
    }
}

/* Chat logprobs for tokens [from, to): {"content": [...]} (mu held). */
static cJSON *chat_logprobs(struct tp_server *s, const struct tp_req *r, int from, int to)
{
    cJSON *lp = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(lp, "content");
    for (int i = from; i < to; i++) {
        const struct tp_gen_tok *g = &r->toks[i];
        cJSON *t = cJSON_CreateObject();
        add_piece_string(s, t, "token", g->id, 1);
        cJSON_AddNumberToObject(t, "logprob", g->logprob);
        cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
        for (int k = 0; k < g->n_top && k < r->params.top_logprobs; k++) {
            cJSON *a = cJSON_CreateObject();
            add_piece_string(s, a, "token", g->top[k].id, 1);
            cJSON_AddNumberToObject(a, "logprob", g->top[k].logprob);
            cJSON_AddItemToArray(top, a);
        }
        cJSON_AddItemToArray(content, t);
    }
    return lp;
}

/* Completions (legacy) logprobs for tokens [from, to) (mu held). */
static cJSON *cmpl_logprobs(struct tp_server *s, const struct tp_req *r, int from, int to, size_t base_offset)
{
    cJSON *lp = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON *off = cJSON_AddArrayToObject(lp, "text_offset");
    for (int i = from; i < to; i++) {
        const struct tp_gen_tok *g = &r->toks[i];
        size_t l = 0;
        const char *p = tp_tokenizer_piece(s->tok, g->id, &l);
        cJSON_AddItemToArray(tokens, tp_json_string_bytes(p ? p : "", p ? l : 0));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(g->logprob));
        cJSON *alt = cJSON_CreateObject();
        for (int k = 0; k < g->n_top && k < r->params.top_logprobs; k++) {
            p = tp_tokenizer_piece(s->tok, g->top[k].id, &l);
            struct tp_buf kb = {0};
            tp_json_encode_bytes(p ? p : "", p ? l : 0, &kb);
            if (!cJSON_GetObjectItemCaseSensitive(alt, kb.data ? kb.data : ""))
                cJSON_AddNumberToObject(alt, kb.data ? kb.data : "", g->top[k].logprob);
            tp_buf_free(&kb);
        }
        cJSON_AddItemToArray(top, alt);
        size_t o = i > 0 ? r->toks[i - 1].text_end : 0;
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(base_offset + o)));
    }
    return lp;
}

static void add_usage(cJSON *root, const struct tp_req *r)
{
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", r->n_toks);
    cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + r->n_toks);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", r->n_cached);
    if (r->spec) tp_usage_add_spec(u, r);
}

static cJSON *envelope(struct tp_server *s, const struct tp_req *r, const char *object)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", r->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)time(NULL));
    cJSON_AddStringToObject(root, "model", s->model_id ? s->model_id : "tpserve");
    if (s->fingerprint[0]) cJSON_AddStringToObject(root, "system_fingerprint", s->fingerprint); /* props.c */
    else cJSON_AddNullToObject(root, "system_fingerprint");
    return root;
}

/* Whole response of a finished request (mu held). */
static char *final_json(struct tp_server *s, const struct tp_req *r)
{
    cJSON *root = envelope(s, r, r->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    const char *text = r->text.data ? r->text.data : "";
    const char *finish = NULL; /* NULL: finish_str */
    int has_calls = 0;
    if (is_harmony(s, r)) {
        int n_calls = 0;
        tp_harmony_message(&s->harmony, r->toks, r->n_toks, r->text.data ? r->text.data : "", r->text.len, r->id,
                           cJSON_AddObjectToObject(ch, "message"), &n_calls);
        finish = harmony_finish(r, n_calls);
        if (r->params.logprobs) cJSON_AddItemToObject(ch, "logprobs", chat_logprobs(s, r, 0, r->n_toks));
        else cJSON_AddNullToObject(ch, "logprobs");
    } else if (is_think(s, r)) {
        struct tp_think_parts tp;
        tp_think_split(text, r->text.len, 1, &tp);
        cJSON *msg = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        tp_json_add_bytes(msg, "content", text + tp.content_b, tp.content_e - tp.content_b);
        if (tp.thinking)
            tp_json_add_bytes(msg, "reasoning_content", text + tp.reasoning_b, tp.reasoning_e - tp.reasoning_b);
        if (r->params.logprobs) cJSON_AddItemToObject(ch, "logprobs", chat_logprobs(s, r, 0, r->n_toks));
        else cJSON_AddNullToObject(ch, "logprobs");
    } else if (r->chat) {
        cJSON *msg = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        /* a reasoning reply that may call tools: the calls and the content are read after </think> */
        struct tp_think_parts tp = {0};
        if (r->params.think) tp_think_split(text, r->text.len, 1, &tp);
        const size_t base = tp.content_b;
        size_t content_end;
        cJSON *calls = tool_calls_json(s, r, base, &content_end);
        has_calls = calls != NULL;
        if (calls) {
            const cJSON *c;
            cJSON_ArrayForEach(c, calls) cJSON_DeleteItemFromObject((cJSON *)c, "index"); /* index is for stream deltas */
            if (content_end > base) tp_json_add_bytes(msg, "content", text + base, content_end - base);
            else cJSON_AddNullToObject(msg, "content");
            cJSON_AddItemToObject(msg, "tool_calls", calls);
        } else {
            tp_json_add_bytes(msg, "content", text + base, r->text.len - base);
        }
        if (tp.thinking)
            tp_json_add_bytes(msg, "reasoning_content", text + tp.reasoning_b, tp.reasoning_e - tp.reasoning_b);
        if (r->params.logprobs) cJSON_AddItemToObject(ch, "logprobs", chat_logprobs(s, r, 0, r->n_toks));
        else cJSON_AddNullToObject(ch, "logprobs");
    } else {
        tp_json_add_bytes(ch, "text", text, r->text.len);
        if (r->params.logprobs) cJSON_AddItemToObject(ch, "logprobs", cmpl_logprobs(s, r, 0, r->n_toks, 0));
        else cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddStringToObject(ch, "finish_reason", finish ? finish : finish_str(r, has_calls));
    cJSON_AddItemToArray(choices, ch);
    add_usage(root, r);
    char *json = tp_json_print(root);
    cJSON_Delete(root);
    return json;
}

/* One streaming chunk carrying text[t0, t1) and tokens [k0, k1) (mu held). */
static char *chunk_json(struct tp_server *s, const struct tp_req *r, size_t t0, size_t t1, int k0, int k1,
                        const char *finish, int first)
{
    cJSON *root = envelope(s, r, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    const char *piece = (r->text.data ? r->text.data : "") + t0;
    if (r->chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (first) cJSON_AddStringToObject(d, "role", "assistant");
        if (!finish || t1 > t0) tp_json_add_bytes(d, "content", piece, t1 - t0);
        if (r->params.logprobs && k1 > k0) cJSON_AddItemToObject(ch, "logprobs", chat_logprobs(s, r, k0, k1));
        else cJSON_AddNullToObject(ch, "logprobs");
    } else {
        tp_json_add_bytes(ch, "text", piece, t1 - t0);
        if (r->params.logprobs && k1 > k0) cJSON_AddItemToObject(ch, "logprobs", cmpl_logprobs(s, r, k0, k1, 0));
        else cJSON_AddNullToObject(ch, "logprobs");
    }
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(choices, ch);
    char *json = tp_json_print(root);
    cJSON_Delete(root);
    return json;
}

static char *usage_chunk_json(struct tp_server *s, const struct tp_req *r)
{
    cJSON *root = envelope(s, r, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, r);
    char *json = tp_json_print(root);
    cJSON_Delete(root);
    return json;
}

static void log_done(struct tp_server *s, const struct tp_req *r, int status)
{
    double ttft = r->t_first_ns ? (double)(r->t_first_ns - r->t_submit_ns) / 1e9 : 0;
    double tps = 0;
    if (r->n_toks > 1 && r->t_done_ns > r->t_first_ns)
        tps = (double)(r->n_toks - 1) / ((double)(r->t_done_ns - r->t_first_ns) / 1e9);
    tp_http_log_request(s, r->id, r->chat ? "/v1/chat/completions" : "/v1/completions", status, r->n_prompt,
                        r->n_cached, r->n_toks, ttft, tps);
    if (tps > 0) tp_metrics_tokens_per_s(s->metrics, tps);
}

/* ------------------------------------------------------------ streaming */

struct stream {
    struct tp_server *s;
    struct tp_req *r;
    struct MHD_Connection *conn;
    struct tp_buf out;        /* formatted, not yet handed to MHD */
    size_t out_pos;
    int sent_toks;
    int first;
    int ended;                /* final events formatted */
    int complete;             /* every byte handed to MHD */
    int status;               /* HTTP status logged and counted: 200, or the error's (tp_http_error_kind) */
    uint64_t last_out_ns;
    struct tp_harmony_cursor h; /* harmony: where the stream stands */
    size_t think_r, think_c;    /* <think> replies: reasoning and content bytes sent */
    struct tp_call_cursor calls; /* the reply's content bytes sent (calls.sent_text, from calls.base) and,
                                  * when it may hold tool calls, the calls whose first delta (id, name) was
                                  * sent and the argument bytes sent of each */
};

/* One chunk of a split reply (harmony, <think>): delta (owned; {} when NULL) with role on
 * the first chunk and the logprobs of the tokens not yet sent (mu held). */
static void delta_chunk(struct stream *st, cJSON *delta)
{
    struct tp_req *r = st->r;
    cJSON *root = envelope(st->s, r, "chat.completion.chunk");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    cJSON *d = delta ? delta : cJSON_CreateObject();
    if (st->first) cJSON_AddItemToObject(d, "role", cJSON_CreateString("assistant"));
    cJSON_AddItemToObject(ch, "delta", d);
    if (r->params.logprobs && r->n_toks > st->sent_toks)
        cJSON_AddItemToObject(ch, "logprobs", chat_logprobs(st->s, r, st->sent_toks, r->n_toks));
    else cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    st->sent_toks = r->n_toks;
    st->first = 0;
    char *j = tp_json_print(root);
    cJSON_Delete(root);
    if (j) tp_sse_data(&st->out, j);
    free(j);
}

/* A chat.completion.chunk with one choice: *root owns it, *ch is the choice; returns its (empty) delta. */
static cJSON *chunk_open(struct stream *st, cJSON **root, cJSON **ch)
{
    *root = envelope(st->s, st->r, "chat.completion.chunk");
    *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(*root, "choices"), *ch);
    cJSON_AddNumberToObject(*ch, "index", 0);
    return cJSON_AddObjectToObject(*ch, "delta");
}

/* Sends a chunk from chunk_open (no logprobs, no finish reason) and frees it. */
static void chunk_send(struct stream *st, cJSON *root, cJSON *ch)
{
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    char *j = tp_json_print(root);
    cJSON_Delete(root);
    if (j) tp_sse_data(&st->out, j);
    free(j);
}

/* One chunk whose delta carries the tool call fragment k: with its id, type
 * and name when hdr, else only argument bytes args[0..n).  mu held. */
static void tool_delta(struct stream *st, int k, const char *name, const char *args, size_t n, int hdr)
{
    struct tp_req *r = st->r;
    cJSON *root, *ch;
    cJSON *d = chunk_open(st, &root, &ch);
    if (st->first) {
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddNullToObject(d, "content");
        st->first = 0;
    }
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), c);
    cJSON_AddNumberToObject(c, "index", k);
    if (hdr) {
        char id[96];
        tp_run_call_id(st->s, r, k, "call_", id, sizeof id);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
    }
    cJSON *fn = cJSON_AddObjectToObject(c, "function");
    if (hdr) cJSON_AddStringToObject(fn, "name", name);
    tp_json_add_bytes(fn, "arguments", args, n);
    chunk_send(st, root, ch);
}

/* Stream what is new in a harmony reply (mu held). */
static void harmony_stream(struct stream *st)
{
    struct tp_req *r = st->r;
    cJSON *deltas = cJSON_CreateArray();
    if (!deltas) return;
    tp_harmony_deltas(&st->s->harmony, r->toks, r->n_toks, r->text.data ? r->text.data : "", r->text.len,
                      r->state == TP_REQ_DONE, r->id, &st->h, deltas);
    while (deltas->child) delta_chunk(st, cJSON_DetachItemViaPointer(deltas, deltas->child));
    cJSON_Delete(deltas);
    if (r->params.logprobs && r->n_toks > st->sent_toks) delta_chunk(st, NULL);
    st->sent_toks = r->n_toks;
}

/* Stream what is new in a <think> reply: reasoning_content, then content (mu held). */
static void think_stream(struct stream *st)
{
    struct tp_req *r = st->r;
    const char *text = r->text.data ? r->text.data : "";
    struct tp_think_parts tp;
    tp_think_split(text, r->text.len, r->state == TP_REQ_DONE, &tp);
    const char *keys[2] = {"reasoning_content", "content"};
    size_t b[2] = {tp.reasoning_b, tp.content_b}, e[2] = {tp.reasoning_e, tp.content_e};
    size_t *sent[2] = {&st->think_r, &st->think_c};
    for (int k = 0; k < 2; k++) {
        if (e[k] <= b[k] + *sent[k]) continue;
        cJSON *d = cJSON_CreateObject();
        if (!d) return;
        tp_json_add_bytes(d, keys[k], text + b[k] + *sent[k], e[k] - b[k] - *sent[k]);
        delta_chunk(st, d);
        *sent[k] = e[k] - b[k];
    }
    if (r->params.logprobs && r->n_toks > st->sent_toks) delta_chunk(st, NULL);
    st->sent_toks = r->n_toks;
}

/* mu held: a reply that may hold tool calls, streamed from a scan of the text so far
 * (tp_run_stream_calls): reasoning_content first (a <think> reply), content up to the first call,
 * then each call's first delta once its name is complete (index, id, type, name) and its argument
 * bytes as they grow.  final: the reply ended.  Returns 1 when any call was streamed. */
static void tools_text(void *ctx, const char *text, size_t n)
{
    struct stream *st = ctx;
    (void)text;
    const size_t at = st->calls.base + st->calls.sent_text;
    char *j = chunk_json(st->s, st->r, at, at + n, 0, 0, NULL, st->first);
    if (j) tp_sse_data(&st->out, j);
    free(j);
    st->first = 0;
}
static void tools_reasoning(void *ctx, const char *text, size_t n)
{
    cJSON *d = cJSON_CreateObject();
    if (!d) return;
    tp_json_add_bytes(d, "reasoning_content", text, n);
    delta_chunk(ctx, d);
}
static void tools_begin(void *ctx, int k, const char *name) { tool_delta(ctx, k, name, "", 0, 1); }
static void tools_args(void *ctx, int k, const char *args, size_t n) { tool_delta(ctx, k, NULL, args, n, 0); }
static const struct tp_call_sink tools_sink = {tools_text, tools_reasoning, tools_begin, tools_args, NULL};

static int stream_tools(struct stream *st, int final)
{
    tp_run_stream_calls(st->r, final, &st->calls, &tools_sink, st);
    return st->calls.n_begun > 0;
}

/* mu held: the closing chunk with finish_reason fin, then the usage chunk when asked for. */
static void finish_chunks(struct stream *st, const char *fin)
{
    const struct tp_req *r = st->r;
    size_t tl = r->text.len;
    char *j = chunk_json(st->s, r, tl, tl, 0, 0, fin, 0);
    if (j) tp_sse_data(&st->out, j);
    free(j);
    if (r->params.include_usage) {
        j = usage_chunk_json(st->s, r);
        if (j) tp_sse_data(&st->out, j);
        free(j);
    }
}

/* mu held: the chunk a chat stream opens with, as llama-server and OpenAI send it: the role and no content
 * ({"role": "assistant", "content": null}), before any content, reasoning or tool call. */
static void role_chunk(struct stream *st)
{
    cJSON *root, *ch;
    cJSON *d = chunk_open(st, &root, &ch);
    cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddNullToObject(d, "content");
    chunk_send(st, root, ch);
    st->first = 0;
}

/* mu held: format everything new into st->out. */
static void stream_format(struct stream *st)
{
    struct tp_req *r = st->r;
    struct tp_server *s = st->s;
    if (st->first && (r->n_toks > 0 || (r->state == TP_REQ_DONE && r->finish != TP_FINISH_ERROR))) role_chunk(st);
    int harmony = is_harmony(s, r), split = harmony || is_think(s, r);
    const int tools = !split && r->params.tool_format != TP_TOOL_FORMAT_NONE;
    if (harmony) {
        harmony_stream(st);
    } else if (split) {
        think_stream(st);
    } else if (tools && st->sent_toks < r->n_toks) {
        stream_tools(st, 0);
        st->sent_toks = r->n_toks;
    }
    while (!split && st->sent_toks < r->n_toks) {
        int k = st->sent_toks;
        size_t end = r->toks[k].text_end;
        if (end < st->calls.sent_text) end = st->calls.sent_text;
        if (end > st->calls.sent_text || r->params.logprobs || st->first) {
            char *j = chunk_json(s, r, st->calls.sent_text, end, k, k + 1, NULL, st->first);
            if (j) tp_sse_data(&st->out, j);
            free(j);
            st->first = 0;
        }
        st->calls.sent_text = end;
        st->sent_toks++;
    }
    if (r->state != TP_REQ_DONE) return;
    if (r->finish == TP_FINISH_ERROR) {
        struct tp_api_error e;
        tp_api_err_from(&e, &r->err);
        char *j = tp_api_error_json(&e);
        if (j) tp_sse_data(&st->out, j);
        free(j);
        st->status = tp_http_error_kind(e.status).http_status;
    } else if (split) {
        if (st->first) delta_chunk(st, NULL);
        finish_chunks(st, harmony ? harmony_finish(r, st->h.calls + (st->h.announced ? 1 : 0)) : finish_str(r, 0));
    } else {
        size_t tl = r->text.len;
        int has_calls = tools && stream_tools(st, 1);
        if (!has_calls && (tl > st->calls.base + st->calls.sent_text || st->first)) {
            char *j = chunk_json(s, r, st->calls.base + st->calls.sent_text, tl, 0, 0, NULL, st->first);
            if (j) tp_sse_data(&st->out, j);
            free(j);
            st->calls.sent_text = tl - st->calls.base;
            st->first = 0;
        }
        finish_chunks(st, finish_str(r, has_calls));
    }
    tp_sse_done(&st->out);
    st->ended = 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct stream *st = cls;
    pthread_mutex_t *mu = tp_engine_mutex(st->s->engine);
    for (;;) {
        size_t n = tp_run_drain(&st->out, &st->out_pos, buf, max, &st->last_out_ns);
        if (n > 0) return (ssize_t)n;
        if (st->ended) {
            st->complete = 1;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        pthread_mutex_lock(mu);
        int w = tp_run_wait_news(st->s, st->conn, st->r, st->sent_toks, st->last_out_ns, 1);
        if (w < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (w > 0) tp_sse_comment(&st->out, "keep-alive");
        stream_format(st);
        pthread_mutex_unlock(mu);
    }
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    pthread_mutex_t *mu = tp_engine_mutex(st->s->engine);
    pthread_mutex_lock(mu);
    int done = st->r->state == TP_REQ_DONE;
    pthread_mutex_unlock(mu);
    if (!done) tp_engine_cancel(st->s->engine, st->r);
    /* counted once, here: under the final status, or 499 when the client left
     * before the whole stream was handed over */
    int status = done && st->complete ? st->status : tp_http_error_kind(TP_ERR_CANCELLED).http_status;
    pthread_mutex_lock(mu);
    log_done(st->s, st->r, status);
    pthread_mutex_unlock(mu);
    tp_metrics_request(st->s->metrics, status);
    tp_engine_release(st->s->engine, st->r);
    tp_buf_free(&st->out);
    free(st);
}

/* ------------------------------------------------------------ entry */

/* Parse, tokenize and check a completion body against the context; on TP_OK
 * *out is a new request (two references, see tp_req_new) ready to submit. */
static enum tp_status prepare_request(struct tp_server *s, int chat, const char *body, size_t len,
                                      struct tp_req **out, struct tp_api_error *e)
{
    struct tp_req_params p;
    int32_t *ids = NULL;
    int n = 0;
    enum tp_status st = tp_req_parse(body, len, chat, s->n_vocab, s->n_ctx, &p, e);
    if (st != TP_OK) return st;
    st = tp_run_apply_defaults(s, &p, e);
    if (st == TP_OK) st = tp_run_tokens(s, &p, chat ? "messages" : "prompt", &ids, &n, e);
    if (st == TP_OK)
        st = tp_run_check_context(s, &p, n, chat ? "messages" : "prompt", chat ? "max_completion_tokens" : "max_tokens", e);
    struct tp_req *r = st == TP_OK ? tp_req_new() : NULL;
    if (st == TP_OK && !r) st = tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
    if (st != TP_OK) {
        free(ids);
        tp_req_params_free(&p);
        return st;
    }
    uint64_t num = __atomic_add_fetch(&s->next_id, 1, __ATOMIC_RELAXED);
    snprintf(r->id, sizeof r->id, "%s-%llx%06llu", chat ? "chatcmpl" : "cmpl", (unsigned long long)s->created,
             (unsigned long long)num);
    r->chat = chat;
    r->params = p;
    r->prompt = ids;
    r->n_prompt = n;
    r->max_tokens = p.max_tokens > 0 ? p.max_tokens : s->n_ctx - n;
    r->seed = p.has_seed ? p.seed : (tp_now_ns() ^ (num * 0x9E3779B97F4A7C15ull));
    r->toks = calloc((size_t)r->max_tokens, sizeof *r->toks);
    if (!r->toks) {
        tp_engine_release(s->engine, r);
        tp_engine_release(s->engine, r);
        return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
    }
    *out = r;
    return TP_OK;
}

/* Answer a submitted request r as an event stream (the caller's reference moves to the stream). */
static enum MHD_Result answer_stream(struct tp_server *s, struct MHD_Connection *c, struct tp_req *r)
{
    struct stream *st = calloc(1, sizeof *st);
    if (!st) {
        tp_engine_cancel(s->engine, r);
        tp_engine_release(s->engine, r);
        return MHD_NO;
    }
    st->s = s;
    st->r = r;
    st->conn = c;
    st->first = r->chat;
    st->status = 200;
    st->last_out_ns = tp_now_ns();
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result ret = tp_http_queue(s, c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* Wait for a submitted request r and answer one JSON object; cancels r when
 * the client goes away.  Drops the caller's reference. */
static enum MHD_Result answer_whole(struct tp_server *s, struct MHD_Connection *c, struct tp_req *r)
{
    pthread_mutex_t *mu = tp_engine_mutex(s->engine);
    pthread_mutex_lock(mu);
    if (tp_run_wait_done(s, c, r) != 0) {
        int gone = tp_http_error_kind(TP_ERR_CANCELLED).http_status;
        log_done(s, r, gone);
        pthread_mutex_unlock(mu);
        tp_metrics_request(s->metrics, gone);
        tp_engine_release(s->engine, r);
        return MHD_NO;
    }
    enum MHD_Result ret;
    if (r->finish == TP_FINISH_ERROR) {
        struct tp_api_error e;
        tp_api_err_from(&e, &r->err);
        log_done(s, r, tp_http_error_kind(e.status).http_status);
        pthread_mutex_unlock(mu);
        ret = tp_http_send_error(s, c, &e);
    } else {
        char *json = final_json(s, r);
        log_done(s, r, 200);
        pthread_mutex_unlock(mu);
        ret = json ? tp_http_send_json(s, c, 200, json) : MHD_NO;
        free(json);
    }
    tp_engine_release(s->engine, r);
    return ret;
}

enum MHD_Result tp_api_handle_completion(struct tp_server *s, struct MHD_Connection *c, int chat, const char *body,
                                         size_t len)
{
    struct tp_api_error e;
    struct tp_req *r = NULL;
    if (!chat && tp_api_is_fim_completion(body, len)) return tp_api_completion_fim(s, c, body, len); /* api_infill.c */
    if (prepare_request(s, chat, body, len, &r, &e) != TP_OK) return tp_http_send_error(s, c, &e);
    if (tp_engine_submit(s->engine, r, &e) != TP_OK) {
        tp_engine_release(s->engine, r);
        tp_engine_release(s->engine, r);
        return tp_http_send_error(s, c, &e);
    }
    return r->params.stream ? answer_stream(s, c, r) : answer_whole(s, c, r);
}

/*
 * server/api_run.c - one engine request for the APIs that are not OpenAI's
 * completions (api_messages.c, api_responses.c, api_ollama.c): prompt
 * rendering and tokenizing, the context check, submission to the engine,
 * the non-streaming wait and the streaming content callback.  What the
 * client sees is shaped by the API's struct tp_run_ops (api_run.h); the
 * engine side is the same as chat completions' (server/api.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "api_run.h"

#define KEEPALIVE_NS 1000000000ull /* keep-alive every second without output */

static void deadline_in(struct timespec *ts, long ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += ms * 1000000L;
    while (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

enum MHD_Result tp_run_send_error(struct tp_server *s, struct MHD_Connection *c, const struct tp_run_ops *ops,
                                  const struct tp_api_error *e)
{
    char *json = ops->error_json(e);
    if (!json) return MHD_NO;
    const struct tp_http_error_kind k = tp_http_error_kind(e->status);
    tp_metrics_request(s->metrics, k.http_status);
    enum MHD_Result ret = tp_http_send(s, c, k.http_status, "application/json", json, strlen(json), k.header_name,
                                       k.header_value);
    free(json);
    tp_log(k.http_status >= 500 ? TP_LOG_WARN : TP_LOG_INFO, "http", "%s %d %s", ops->path, k.http_status, e->message);
    return ret;
}

enum MHD_Result tp_run_count_tokens(struct tp_server *s, struct MHD_Connection *c, const struct tp_run_ops *ops,
                                    struct tp_req_params *p, const char *param, const char *object_kv)
{
    struct tp_api_error e = {0};
    int32_t *ids = NULL;
    int n = 0;
    enum tp_status st = tp_run_tokens(s, p, param, &ids, &n, &e);
    free(ids);
    tp_req_params_free(p);
    if (st != TP_OK) return tp_run_send_error(s, c, ops, &e);
    char json[160];
    snprintf(json, sizeof json, "{%s\"input_tokens\":%d}", object_kv, n);
    return tp_http_send_json(s, c, 200, json);
}

void tp_run_make_id(struct tp_server *s, const char *prefix, char *out, size_t cap)
{
    uint64_t num = __atomic_add_fetch(&s->next_id, 1, __ATOMIC_RELAXED);
    snprintf(out, cap, "%s%llx%06llu", prefix, (unsigned long long)s->created, (unsigned long long)num);
}

/* What the harmony format alone takes (reasoning_effort). */
static enum tp_status refuse_for_template(struct tp_server *s, const struct tp_req_params *p, struct tp_api_error *e)
{
    if (s->chat == TP_CHAT_HARMONY) return TP_OK;
    if (p->reasoning_effort)
        return tp_api_err(e, TP_ERR_UNSUPPORTED, "reasoning_effort", "'reasoning_effort' is not supported by the %s "
                          "chat template (it applies to gpt-oss, the harmony format); remove it",
                          tp_chat_family_name(s->chat));
    return TP_OK;
}

enum tp_status tp_run_tokens(struct tp_server *s, struct tp_req_params *p, const char *param, int32_t **ids,
                             int *n, struct tp_api_error *e)
{
    *ids = NULL;
    *n = 0;
    if (!p->chat) {
        if (p->prompt_ids) {
            *ids = malloc(sizeof(int32_t) * (size_t)p->n_prompt_ids);
            if (!*ids) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
            memcpy(*ids, p->prompt_ids, sizeof(int32_t) * (size_t)p->n_prompt_ids);
            *n = p->n_prompt_ids;
            return TP_OK;
        }
        return tp_server_tokenize(s, p->prompt ? p->prompt : "", p->prompt_len, tp_tokenizer_add_bos(s->tok), ids, n,
                                  e);
    }
    enum tp_status st = refuse_for_template(s, p, e);
    if (st != TP_OK) return st;
    /* harmony's calls are read from the reply's channel tokens (harmony.c): no call grammar; a forced call
     * is the function's name and arguments after the prompt's commentary header */
    if (s->chat != TP_CHAT_HARMONY) st = tp_req_tools_grammar(p, tp_chat_tool_format(s->chat), tp_chat_family_name(s->chat), e);
    else st = tp_req_forced_name_args(p, e);
    if (st == TP_OK && s->chat == TP_CHAT_HARMONY && p->tool_auto) st = tp_req_harmony_calls_grammar(p, e);
    if (st != TP_OK) return st;
    p->think = p->tool_auto && s->chat == TP_CHAT_QWEN3;
    /* Mistral's templates refuse call ids other than 9 characters when the calls come back in the history */
    const enum tp_tool_format ff = tp_chat_tool_format(s->chat);
    p->short_call_ids = ff == TP_TOOL_FORMAT_MISTRAL || ff == TP_TOOL_FORMAT_MISTRAL_ARGS;
    struct tp_buf text = {0};
    struct tp_error err = {0};
    /* tools are shown to models whose template has a place for them; a forced call is generated under its
     * schema either way */
    struct tp_chat_opts opts = {.add_generation_prompt = 1,
                                .bos = s->bos_text,
                                .eos = s->eos_text,
                                .default_system = s->has_default_system ? s->default_system : NULL,
                                .tools = tp_chat_has_tools(s->chat) ? p->tools : NULL,
                                .reasoning_effort = p->reasoning_effort};
    st = tp_chat_render_opts(s->chat, p->msgs, p->n_msgs, &opts, &text, &err);
    if (st == TP_OK && s->chat == TP_CHAT_HARMONY && p->tool_call)
        st = tp_buf_puts(&text, "<|channel|>commentary to=functions.");
    if (st != TP_OK) {
        tp_buf_free(&text);
        if (st == TP_ERR_NOMEM) return tp_api_err(e, st, NULL, "out of memory");
        return tp_api_err(e, st, param, "the %s chat template refused these messages: %s",
                          tp_chat_family_name(s->chat), tp_error_msg(&err));
    }
    const char *t = text.data ? text.data : "";
    size_t tl = tp_json_decode_nul(text.data, text.len); /* contents held NUL in tree form */
    /* no BOS added when the rendered text already begins with it (an empty BOS text never does) */
    int add_bos = tp_tokenizer_add_bos(s->tok) &&
                  !(s->bos_text[0] && tl >= strlen(s->bos_text) && tp_str_starts_with(t, s->bos_text));
    st = tp_server_tokenize(s, t, tl, add_bos, ids, n, e);
    tp_buf_free(&text);
    return st;
}

enum tp_status tp_run_apply_defaults(const struct tp_server *s, struct tp_req_params *p, struct tp_api_error *e)
{
    tp_req_apply_defaults(p, &s->gen);
    if (s->n_bias == 0 || p->n_logit_bias > 0 || p->embed) return TP_OK;
    p->bias_id = malloc(sizeof(int32_t) * (size_t)s->n_bias);
    p->bias_val = malloc(sizeof(float) * (size_t)s->n_bias);
    if (!p->bias_id || !p->bias_val) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
    memcpy(p->bias_id, s->bias_id, sizeof(int32_t) * (size_t)s->n_bias);
    memcpy(p->bias_val, s->bias_val, sizeof(float) * (size_t)s->n_bias);
    p->n_logit_bias = s->n_bias;
    return TP_OK;
}

enum tp_status tp_run_check_context(const struct tp_server *s, struct tp_req_params *p, int n, const char *prompt_param,
                                    const char *max_param, struct tp_api_error *e)
{
    if (n == 0) return tp_api_err(e, TP_ERR_INVALID_ARG, prompt_param, "the prompt is empty (0 tokens); send some text");
    if (n >= s->n_ctx) {
        tp_api_err(e, TP_ERR_INVALID_ARG, prompt_param,
                   "the prompt has %d tokens but the context holds %d (at least one must remain for the reply); "
                   "shorten it or restart with a larger --ctx-size", n, s->n_ctx);
    } else if (p->max_tokens > 0 && n + p->max_tokens > s->n_ctx) {
        if (!(p->set & TP_GEN_N_PREDICT)) {
            p->max_tokens = s->n_ctx - n; /* a server default (--n-predict, max_new_tokens): what fits */
            return TP_OK;
        }
        tp_api_err(e, TP_ERR_INVALID_ARG, max_param,
                   "the context holds %d tokens, but %d were requested (%d in the prompt, %d for the reply); lower %s "
                   "or shorten the prompt", s->n_ctx, n + p->max_tokens, n, p->max_tokens, max_param);
    } else {
        return TP_OK;
    }
    tp_run_context_error(e, n, n < s->n_ctx ? p->max_tokens : 0, s->n_ctx);
    return e->status;
}

void tp_run_context_error(struct tp_api_error *e, int n, int n_max, int n_ctx)
{
    e->code = "context_length_exceeded";
    e->n_prompt_tokens = n;
    e->n_max_tokens = n_max;
    e->n_ctx = n_ctx;
}

int tp_run_wait_done(struct tp_server *s, struct MHD_Connection *c, struct tp_req *r)
{
    pthread_mutex_t *mu = tp_engine_mutex(s->engine);
    while (r->state != TP_REQ_DONE) {
        struct timespec ts;
        deadline_in(&ts, 100);
        pthread_cond_timedwait(&r->cond, mu, &ts);
        if (r->state != TP_REQ_DONE && tp_http_client_gone(c)) {
            pthread_mutex_unlock(mu);
            tp_engine_cancel(s->engine, r);
            pthread_mutex_lock(mu);
            return -1;
        }
    }
    return 0;
}

size_t tp_run_drain(struct tp_buf *out, size_t *pos, char *buf, size_t max, uint64_t *last_out_ns)
{
    if (*pos >= out->len) return 0;
    size_t n = TP_MIN(max, out->len - *pos);
    memcpy(buf, out->data + *pos, n);
    *pos += n;
    if (*pos == out->len) *pos = out->len = 0;
    *last_out_ns = tp_now_ns();
    return n;
}

int tp_run_wait_news(struct tp_server *s, struct MHD_Connection *c, struct tp_req *r, int sent_toks,
                     uint64_t last_out_ns, int keepalive)
{
    pthread_mutex_t *mu = tp_engine_mutex(s->engine);
    while (r->n_toks == sent_toks && r->state != TP_REQ_DONE) {
        struct timespec ts;
        deadline_in(&ts, 100);
        pthread_cond_timedwait(&r->cond, mu, &ts);
        if (r->n_toks != sent_toks || r->state == TP_REQ_DONE) break;
        if (tp_http_client_gone(c)) {
            pthread_mutex_unlock(mu);
            tp_engine_cancel(s->engine, r);
            return -1;
        }
        if (keepalive && tp_now_ns() - last_out_ns > KEEPALIVE_NS) return 1;
    }
    return 0;
}

/* Replace every "from" by "to" in s (in place, bounded by cap). */
static void replace_all(char *s, size_t cap, const char *from, const char *to)
{
    size_t fl = strlen(from), tl = strlen(to);
    char tmp[1024];
    size_t o = 0;
    for (const char *p = s; *p && o + 1 < sizeof tmp;) {
        if (strncmp(p, from, fl) == 0 && (p == s || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z'))) &&
            !(p[fl] == '_' || (p[fl] >= 'a' && p[fl] <= 'z'))) {
            size_t n = TP_MIN(tl, sizeof tmp - 1 - o);
            memcpy(tmp + o, to, n);
            o += n;
            p += fl;
        } else {
            tmp[o++] = *p++;
        }
    }
    tmp[o] = '\0';
    size_t n = TP_MIN(o, cap - 1);
    memcpy(s, tmp, n);
    s[n] = '\0';
}

int tp_run_parse_chat(struct tp_server *s, const cJSON *req, const char *const (*rename)[2], struct tp_req_params *p,
                      struct tp_api_error *e)
{
    char *body = tp_json_print(req);
    if (!body) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
    int chat = cJSON_GetObjectItemCaseSensitive(req, "prompt") == NULL;
    int rc = tp_req_parse(body, strlen(body), chat, s->n_vocab, s->n_ctx, p, e);
    free(body);
    if (rc != 0 && rename) {
        for (int i = 0; rename[i][0]; i++) {
            replace_all(e->param, sizeof e->param, rename[i][0], rename[i][1]);
            replace_all(e->message, sizeof e->message, rename[i][0], rename[i][1]);
        }
    }
    return rc;
}

int tp_run_reply_calls(const struct tp_req *r, struct tp_tool_scan *sc, size_t *base)
{
    const char *text = r->text.data ? r->text.data : "";
    struct tp_think_parts tp = {0};
    if (r->params.think) tp_think_split(text, r->text.len, 1, &tp);
    *base = tp.content_b;
    tp_tool_scan(r->params.tool_format, text + *base, r->text.len - *base, 1, sc);
    int n = 0;
    for (int k = 0; k < sc->n_calls; k++) n += sc->calls[k].complete;
    return n;
}

void tp_run_call_id(const struct tp_server *s, const struct tp_req *r, int k, const char *prefix, char *out,
                    size_t cap)
{
    (void)s;
    if (!r->params.short_call_ids) {
        /* the request id's unique part: what follows its own prefix ("chatcmpl-", "msg_", "resp_") */
        const char *u = r->id + strcspn(r->id, "-_");
        snprintf(out, cap, "%s%s_%d", prefix, *u ? u + 1 : r->id, k);
        return;
    }
    static const char an[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t h = 1469598103934665603ull;
    for (const char *p = r->id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ (uint64_t)k) * 1099511628211ull;
    size_t n = 0;
    for (; n < 9 && n + 1 < cap; n++, h /= 62) out[n] = an[h % 62];
    out[n] = '\0';
}

const char *tp_run_error_text(const struct tp_api_error *e, char *buf, size_t cap)
{
    if (e->param[0] && !strstr(e->message, e->param)) snprintf(buf, cap, "%s: %s", e->param, e->message);
    else snprintf(buf, cap, "%s", e->message);
    return buf;
}

const char *tp_run_stop_string(const struct tp_req *r, size_t *len)
{
    int i = r->stop_idx - 1;
    if (r->finish != TP_FINISH_STOP || i < 0 || i >= r->params.n_stop) {
        *len = 0;
        return "";
    }
    *len = r->params.stop_len[i];
    return r->params.stop[i];
}

static void run_log(struct tp_run *x, int status)
{
    const struct tp_req *r = x->r;
    double ttft = r->t_first_ns ? (double)(r->t_first_ns - r->t_submit_ns) / 1e9 : 0;
    double tps = 0;
    if (r->n_toks > 1 && r->t_done_ns > r->t_first_ns)
        tps = (double)(r->n_toks - 1) / ((double)(r->t_done_ns - r->t_first_ns) / 1e9);
    tp_http_log_request(x->s, r->id, x->ops->path, status, r->n_prompt, r->n_cached, r->n_toks, ttft, tps);
    if (tps > 0) tp_metrics_tokens_per_s(x->s->metrics, tps);
}

static void run_free(struct tp_run *x)
{
    if (!x) return;
    if (x->r) tp_engine_release(x->s->engine, x->r);
    if (x->ctx_free) x->ctx_free(x->ctx);
    tp_buf_free(&x->out);
    free(x);
}

/* ------------------------------------------------------------ streaming */

void tp_run_stream_calls(const struct tp_req *r, int final, struct tp_call_cursor *cur,
                         const struct tp_call_sink *sink, void *ctx)
{
    const char *text = r->text.data ? r->text.data : "";
    size_t len = r->text.len;
    if (r->params.think) {
        /* the reasoning first; the content and the calls come after </think> (an empty region while the
         * reasoning is open or the reply may still open it) */
        struct tp_think_parts tp;
        tp_think_split(text, len, final, &tp);
        if (tp.thinking && tp.reasoning_e > tp.reasoning_b + cur->sent_reasoning) {
            if (sink->reasoning)
                sink->reasoning(ctx, text + tp.reasoning_b + cur->sent_reasoning,
                                tp.reasoning_e - tp.reasoning_b - cur->sent_reasoning);
            cur->sent_reasoning = tp.reasoning_e - tp.reasoning_b;
        }
        cur->base = tp.content_b;
        len = tp.content_e > tp.content_b ? tp.content_e : tp.content_b;
    }
    text += cur->base;
    len -= cur->base;
    struct tp_tool_scan sc;
    tp_tool_scan(r->params.tool_format, text, len, final, &sc);
    size_t ce = cur->n_begun > 0 ? cur->sent_text : sc.content_end;
    if (ce > cur->sent_text) {
        if (sink->text) sink->text(ctx, text + cur->sent_text, ce - cur->sent_text);
        cur->sent_text = ce;
    }
    for (int k = 0; k < sc.n_calls && !sc.malformed; k++) {
        const struct tp_tool_call_view *v = &sc.calls[k];
        if (k == cur->n_begun && v->name[0]) {
            if (sink->begin) sink->begin(ctx, k, v->name);
            cur->n_begun++;
        }
        if (k >= cur->n_begun) break;
        if (v->args_len > cur->args_sent[k]) {
            if (sink->args) sink->args(ctx, k, text + v->args_off + cur->args_sent[k], v->args_len - cur->args_sent[k]);
            cur->args_sent[k] = v->args_len;
        }
        if (k == cur->n_done && v->complete) {
            if (sink->done) sink->done(ctx, k, v->name, text + v->args_off, v->args_len);
            cur->n_done++;
        }
    }
}

cJSON *tp_run_chat_call(const char *id, const char *name, const char *args, size_t n)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(fn, "name", name);
    if (tp_json_add_bytes(fn, "arguments", args, n) != TP_OK || !fn) {
        cJSON_Delete(c);
        return NULL;
    }
    return c;
}

/* The API's ops as a tp_call_sink for a tp_run. */
static void sink_text(void *ctx, const char *text, size_t n)
{
    struct tp_run *x = ctx;
    x->ops->text(x, text, n, &x->out);
}
static void sink_begin(void *ctx, int k, const char *name)
{
    struct tp_run *x = ctx;
    char id[96];
    tp_run_call_id(x->s, x->r, k, x->ops->call_id_prefix ? x->ops->call_id_prefix : "call_", id, sizeof id);
    if (x->ops->call_begin) x->ops->call_begin(x, k, id, name, &x->out);
}
static void sink_args(void *ctx, int k, const char *args, size_t n)
{
    struct tp_run *x = ctx;
    if (x->ops->call_args) x->ops->call_args(x, k, args, n, &x->out);
}
static void sink_done(void *ctx, int k, const char *name, const char *args, size_t n)
{
    struct tp_run *x = ctx;
    if (x->ops->call_done) x->ops->call_done(x, k, name, args, n, &x->out);
}
static const struct tp_call_sink run_sink = {sink_text, NULL, sink_begin, sink_args, sink_done};

/* mu held: format everything new into x->out. */
static void run_format(struct tp_run *x)
{
    struct tp_req *r = x->r;
    if (!x->begun) {
        if (x->ops->begin) x->ops->begin(x, &x->out);
        x->begun = 1;
    }
    const int done = r->state == TP_REQ_DONE;
    if (r->params.tool_format != TP_TOOL_FORMAT_NONE) {
        if (x->sent_toks < r->n_toks || done)
            tp_run_stream_calls(r, done && r->finish != TP_FINISH_ERROR, &x->calls, &run_sink, x);
    } else if (r->text.len > x->calls.sent_text) {
        x->ops->text(x, r->text.data + x->calls.sent_text, r->text.len - x->calls.sent_text, &x->out);
        x->calls.sent_text = r->text.len;
    }
    x->sent_toks = r->n_toks;
    if (!done) return;
    if (r->finish == TP_FINISH_ERROR) {
        struct tp_api_error e;
        tp_api_err_from(&e, &r->err);
        x->ops->error(x, &e, &x->out);
        x->status = tp_http_error_kind(e.status).http_status;
    } else {
        x->ops->end(x, &x->out);
    }
    x->ended = 1;
}

static ssize_t run_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct tp_run *x = cls;
    pthread_mutex_t *mu = tp_engine_mutex(x->s->engine);
    for (;;) {
        size_t n = tp_run_drain(&x->out, &x->out_pos, buf, max, &x->last_out_ns);
        if (n > 0) return (ssize_t)n;
        if (x->ended) {
            x->complete = 1;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        pthread_mutex_lock(mu);
        if (x->begun) {
            int w = tp_run_wait_news(x->s, x->conn, x->r, x->sent_toks, x->last_out_ns, x->ops->keepalive != NULL);
            if (w < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
            if (w > 0) x->ops->keepalive(x, &x->out);
        }
        run_format(x);
        pthread_mutex_unlock(mu);
    }
}

static void run_stream_free(void *cls)
{
    struct tp_run *x = cls;
    pthread_mutex_t *mu = tp_engine_mutex(x->s->engine);
    pthread_mutex_lock(mu);
    int done = x->r->state == TP_REQ_DONE;
    pthread_mutex_unlock(mu);
    if (!done) tp_engine_cancel(x->s->engine, x->r);
    int status = done && x->complete ? x->status : 499;
    pthread_mutex_lock(mu);
    run_log(x, status);
    pthread_mutex_unlock(mu);
    tp_metrics_request(x->s->metrics, status);
    run_free(x);
}

/* ------------------------------------------------------------ entry */

enum MHD_Result tp_run_request(struct tp_server *s, struct MHD_Connection *c, const struct tp_run_ops *ops,
                               struct tp_req_params *p, int32_t *ids, int n_ids, const char *max_tokens_param,
                               void *ctx, void (*ctx_free)(void *))
{
    struct tp_api_error e = {0};
    struct tp_run *x = calloc(1, sizeof *x);
    if (!x) {
        free(ids);
        tp_req_params_free(p);
        if (ctx_free) ctx_free(ctx);
        tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
        return tp_run_send_error(s, c, ops, &e);
    }
    x->s = s;
    x->ops = ops;
    x->ctx = ctx;
    x->ctx_free = ctx_free;
    x->conn = c;
    x->status = 200;
    int n = n_ids;
    if (s->chat == TP_CHAT_HARMONY && p->tools) {
        /* harmony replies carry their calls in channel tokens, which only chat completions reads */
        tp_api_err(&e, TP_ERR_UNSUPPORTED, "tools", "tool calls on %s are not supported with the harmony format "
                   "(gpt-oss); use /v1/chat/completions, or leave the tools out", ops->path);
    } else if (ids || tp_run_tokens(s, p, p->chat ? "messages" : "prompt", &ids, &n, &e) == TP_OK) {
        tp_run_apply_defaults(s, p, &e);
        if (!e.status) tp_run_check_context(s, p, n, p->chat ? "messages" : "prompt", max_tokens_param, &e);
    }
    struct tp_req *r = NULL;
    if (!e.status && !(r = tp_req_new())) tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
    if (e.status) {
        free(ids);
        tp_req_params_free(p);
        run_free(x);
        return tp_run_send_error(s, c, ops, &e);
    }
    tp_run_make_id(s, ops->id_prefix, r->id, sizeof r->id);
    r->chat = p->chat;
    r->params = *p;
    memset(p, 0, sizeof *p);
    r->prompt = ids;
    r->n_prompt = n;
    r->max_tokens = r->params.max_tokens > 0 ? r->params.max_tokens : s->n_ctx - n;
    r->seed = r->params.has_seed ? r->params.seed : (tp_now_ns() ^ ((uint64_t)(uintptr_t)r * 0x9E3779B97F4A7C15ull));
    r->toks = calloc((size_t)r->max_tokens, sizeof *r->toks);
    if (!r->toks || tp_engine_submit(s->engine, r, &e) != 0) {
        if (!r->toks) tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
        tp_engine_release(s->engine, r); /* the engine's reference */
        x->r = r;
        run_free(x);
        return tp_run_send_error(s, c, ops, &e);
    }
    x->r = r;
    pthread_mutex_t *mu = tp_engine_mutex(s->engine);
    if (r->params.stream) {
        x->last_out_ns = tp_now_ns();
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, run_read, x,
                                                                      run_stream_free);
        if (!resp) {
            run_stream_free(x);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", ops->stream_type);
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ret = tp_http_queue(s, c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    pthread_mutex_lock(mu);
    if (tp_run_wait_done(s, c, r) != 0) {
        run_log(x, 499);
        pthread_mutex_unlock(mu);
        tp_metrics_request(s->metrics, 499);
        run_free(x);
        return MHD_NO;
    }
    enum MHD_Result ret;
    if (r->finish == TP_FINISH_ERROR) {
        tp_api_err_from(&e, &r->err);
        run_log(x, tp_http_error_kind(e.status).http_status);
        pthread_mutex_unlock(mu);
        ret = tp_run_send_error(s, c, ops, &e);
    } else {
        char *json = ops->final_json(x);
        run_log(x, 200);
        pthread_mutex_unlock(mu);
        ret = json ? tp_http_send_json(s, c, 200, json) : MHD_NO;
        free(json);
    }
    run_free(x);
    return ret;
}

/* ------------------------------------------------------------ routes */

char *tp_api_error_json_for(const char *path, const struct tp_api_error *e)
{
    if (path && strncmp(path, "/v1/messages", 12) == 0 && (path[12] == '\0' || path[12] == '/'))
        return tp_api_messages_error_json(e);
    if (path && strncmp(path, "/api/", 5) == 0) return tp_api_ollama_error_json(e);
    return tp_api_error_json(e);
}

enum MHD_Result tp_api_route_ext(struct tp_server *s, struct MHD_Connection *c, const char *path, const char *body,
                                 size_t len)
{
    if (strcmp(path, "/v1/messages") == 0) return tp_api_messages(s, c, body, len);
    if (strcmp(path, "/v1/messages/count_tokens") == 0) return tp_api_messages_count(s, c, body, len);
    if (strcmp(path, "/v1/responses") == 0 || strcmp(path, "/responses") == 0) return tp_api_responses(s, c, body, len);
    if (strcmp(path, "/v1/responses/input_tokens") == 0) return tp_api_responses_input_tokens(s, c, body, len);
    if (strcmp(path, "/v1/embeddings") == 0 || strcmp(path, "/embeddings") == 0)
        return tp_api_embeddings(s, c, body, len, 0);
    if (strcmp(path, "/infill") == 0) return tp_api_infill(s, c, body, len);
    if (strcmp(path, "/api/embed") == 0) return tp_api_embeddings(s, c, body, len, 1);
    if (strncmp(path, "/api/", 5) == 0) return tp_api_ollama(s, c, path, body, len);
    struct tp_api_error e;
    tp_api_err(&e, TP_ERR_INTERNAL, NULL, "unrouted request %s", path);
    return tp_http_send_error(s, c, &e);
}

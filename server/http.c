/*
 * server/http.c - the HTTP layer: the libmicrohttpd daemon, routing,
 * authentication, body collection (--max-body), the connection watchdog and
 * the memory budget, the small endpoints (/health, /metrics, /v1/models,
 * /tokenize, /detokenize), and tp_http_error_kind, the one place where a
 * status becomes an HTTP status.  Completions: api.c; the gate in front of
 * MHD: http_gate.c.  Handlers may block (a thread per connection): a waiting
 * request polls its client every 100 ms and cancels its sequence when the
 * client has gone.  Limits, defences and the error table: docs/http.md.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "api_run.h"
#include "http_impl.h"

struct tp_server_config tp_server_default_config(void)
{
    struct tp_server_config c;
    memset(&c, 0, sizeof c);
    c.host = "127.0.0.1";
    c.port = 8080;
    c.n_parallel = 8;
    c.max_queue = 64;
    c.max_body_bytes = 1u << 20;
    c.max_connections = 256;
    c.max_conn_per_ip = 32;
    c.conn_timeout_s = 60;
    c.header_timeout_s = 10;
    c.body_timeout_s = 30;
    c.mem_budget_bytes = (size_t)256 << 20;
    c.n_batch = 256;
    c.prefill_chunk = 64;
    c.prefix_share_min = 32;
    c.spec = 0;
    c.draft_max = 4;
    c.recover_wait_s = 60;
    c.replan_after_s = 10;
    c.responses_store = 256;
    return c;
}

/* ------------------------------------------------------------ responses */

enum MHD_Result tp_http_send(struct tp_server *s, struct MHD_Connection *c, int status, const char *content_type,
                             const char *body, size_t len, const char *extra_name, const char *extra_value)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", content_type);
    if (extra_name) MHD_add_response_header(r, extra_name, extra_value);
    enum MHD_Result ret = tp_http_queue(s, c, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result tp_http_send_json(struct tp_server *s, struct MHD_Connection *c, int status, const char *json)
{
    tp_metrics_request(s->metrics, status);
    return tp_http_send(s, c, status, "application/json", json, strlen(json), NULL, NULL);
}

/* ------------------------------------------------------------ errors at the edge */

struct tp_http_error_kind tp_http_error_kind(enum tp_status st)
{
    static const char *const invalid = "invalid_request_error", *const server = "server_error";
    struct tp_http_error_kind k = {500, server, "internal_error", NULL, NULL};
    switch (st) {
    case TP_ERR_INVALID_ARG:
    case TP_ERR_FORMAT:
    case TP_ERR_UNSUPPORTED: k = (struct tp_http_error_kind){400, invalid, NULL, NULL, NULL}; break;
    case TP_ERR_DENIED:
        k = (struct tp_http_error_kind){401, invalid, "invalid_api_key", "WWW-Authenticate", "Bearer"};
        break;
    case TP_ERR_NOT_FOUND: k = (struct tp_http_error_kind){404, invalid, "not_found", NULL, NULL}; break;
    case TP_ERR_NOT_ALLOWED:
        k = (struct tp_http_error_kind){405, invalid, "method_not_allowed", "Allow", "GET, HEAD, POST"};
        break;
    case TP_ERR_TOO_LARGE: k = (struct tp_http_error_kind){413, invalid, "request_too_large", NULL, NULL}; break;
    case TP_ERR_FULL:
        k = (struct tp_http_error_kind){429, "rate_limit_error", "rate_limit_exceeded", "Retry-After", "1"};
        break;
    case TP_ERR_PROTOCOL: k = (struct tp_http_error_kind){431, invalid, NULL, NULL, NULL}; break;
    case TP_ERR_CANCELLED: k = (struct tp_http_error_kind){499, invalid, "client_closed_request", NULL, NULL}; break;
    case TP_ERR_BUSY:
    case TP_ERR_PEER:
    case TP_ERR_TIMEOUT:
    case TP_ERR_POISONED:
    case TP_ERR_INIT:
        k = (struct tp_http_error_kind){503, server, "service_unavailable", "Retry-After", "1"};
        break;
    default: break; /* TP_ERR_NOMEM, TP_ERR_IO, TP_ERR_INTERNAL, ...: 500 */
    }
    return k;
}

char *tp_api_error_json(const struct tp_api_error *e)
{
    struct tp_http_error_kind k = tp_http_error_kind(e->status);
    const char *code = e->code ? e->code : k.code;
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    char *out = NULL;
    if (!o) goto out;
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", k.type);
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (code) cJSON_AddStringToObject(o, "code", code);
    else cJSON_AddNullToObject(o, "code");
    if (e->n_ctx > 0) {
        /* context_length_exceeded: the counts as llama-server gives them */
        cJSON_AddNumberToObject(o, "n_prompt_tokens", e->n_prompt_tokens);
        cJSON_AddNumberToObject(o, "n_ctx", e->n_ctx);
    }
    out = tp_json_print(root); /* user text quoted in messages may hold NUL (C0 80) */
out:
    cJSON_Delete(root);
    return out;
}

static void log_refused(struct tp_server *s, const struct tp_api_error *e);

/* tp_http_send_error, plus "Connection: close": for answers given before the
 * request body was read, so that no unread body is taken for a next request. */
static enum MHD_Result send_error_close(struct tp_server *s, struct MHD_Connection *c, const char *url,
                                        const struct tp_api_error *e)
{
    struct tp_http_error_kind k = tp_http_error_kind(e->status);
    char *json = tp_api_error_json_for(url, e); /* in the shape of the API the path belongs to */
    if (!json) return MHD_NO;
    tp_metrics_request(s->metrics, k.http_status);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_COPY);
    free(json);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Connection", "close");
    if (k.header_name) MHD_add_response_header(r, k.header_name, k.header_value);
    enum MHD_Result ret = tp_http_queue(s, c, k.http_status, r);
    MHD_destroy_response(r);
    log_refused(s, e);
    return ret;
}

enum MHD_Result tp_http_send_error(struct tp_server *s, struct MHD_Connection *c, const struct tp_api_error *e)
{
    struct tp_http_error_kind k = tp_http_error_kind(e->status);
    char *json = tp_api_error_json(e);
    if (!json) return MHD_NO;
    tp_metrics_request(s->metrics, k.http_status);
    enum MHD_Result ret = tp_http_send(s, c, k.http_status, "application/json", json, strlen(json), k.header_name,
                                       k.header_value);
    free(json);
    log_refused(s, e);
    return ret;
}

/* One log line per refused request. */
static void log_refused(struct tp_server *s, const struct tp_api_error *e)
{
    int status = tp_http_error_kind(e->status).http_status;
    if (s->cfg.log_json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "status", status);
        cJSON_AddStringToObject(o, "param", e->param);
        cJSON_AddStringToObject(o, "error", e->message);
        char *line = cJSON_PrintUnformatted(o);
        if (line) tp_log(TP_LOG_INFO, "http", "%s", line);
        free(line);
        cJSON_Delete(o);
    } else {
        tp_log(TP_LOG_INFO, "http", "refused status=%d%s%s: %s", status, e->param[0] ? " param=" : "", e->param,
               e->message);
    }
}

/* Write all of buf[0..len) to fd within timeout_ms.  Returns TP_OK, TP_ERR_IO or TP_ERR_TIMEOUT. */
static enum tp_status send_all_fd(int fd, const char *buf, size_t len, int timeout_ms)
{
    uint64_t end = tp_now_ns() + (uint64_t)timeout_ms * 1000000u;
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return TP_ERR_IO;
        uint64_t now = tp_now_ns();
        if (now >= end) return TP_ERR_TIMEOUT;
        struct pollfd pf = {.fd = fd, .events = POLLOUT, .revents = 0};
        poll(&pf, 1, (int)((end - now) / 1000000u) + 1);
    }
    return TP_OK;
}

void tp_http_refuse_fd(struct tp_server *s, int fd, const struct tp_api_error *e, int timeout_ms)
{
    struct tp_http_error_kind k = tp_http_error_kind(e->status);
    tp_metrics_request(s->metrics, k.http_status);
    log_refused(s, e);
    char *json = tp_api_error_json(e);
    if (!json) return;
    const char *reason = MHD_get_reason_phrase_for((unsigned)k.http_status);
    char extra[96] = "", head[512];
    if (k.header_name) snprintf(extra, sizeof extra, "%s: %s\r\n", k.header_name, k.header_value);
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n%s\r\n",
                      k.http_status, reason && reason[0] ? reason : "Error", strlen(json), extra);
    if (hl > 0 && (size_t)hl < sizeof head && send_all_fd(fd, head, (size_t)hl, timeout_ms) == TP_OK)
        send_all_fd(fd, json, strlen(json), timeout_ms);
    free(json);
}

/*
 * Answer e on the socket itself and end the connection (returns MHD_NO, so
 * MHD closes it): in the middle of an upload (a chunked body over
 * --max-body) MHD cannot queue a response.  After the answer the write side
 * is shut and at most 64 KiB of the rest of the request is read (for at most
 * 200 ms), so that closing does not reset the connection before the client
 * has read the answer.
 */
static enum MHD_Result send_raw_and_close(struct tp_server *s, struct MHD_Connection *c, const struct tp_api_error *e)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return MHD_NO;
    int fd = ci->connect_fd;
    tp_http_refuse_fd(s, fd, e, 2000);
    shutdown(fd, SHUT_WR);
    char sink[4096];
    size_t drained = 0;
    uint64_t end = tp_now_ns() + 200u * 1000000u;
    while (drained < 64 * 1024) {
        uint64_t now = tp_now_ns();
        if (now >= end) break;
        struct pollfd pf = {.fd = fd, .events = POLLIN, .revents = 0};
        if (poll(&pf, 1, (int)((end - now) / 1000000u) + 1) <= 0) break;
        ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n <= 0) break;
        drained += (size_t)n;
    }
    return MHD_NO;
}

/*
 * A client whose connection was reset (or errored) is gone.  End of input
 * alone is not: a client may shut its write side after sending the request
 * and still read the answer, and TCP cannot tell that from a full close
 * until something is written.  (Streams write as they go, so a closed
 * stream is noticed at its next chunk or keep-alive comment.)
 */
int tp_http_client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    int fd = ci->connect_fd;
    struct pollfd pf = {.fd = fd, .events = POLLIN, .revents = 0};
    if (poll(&pf, 1, 0) <= 0) return 0;
    if (pf.revents & (POLLERR | POLLNVAL | POLLHUP)) return 1;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    return 0;
}

void tp_http_log_request(struct tp_server *s, const char *id, const char *path, int status, int n_prompt,
                         int n_cached, int n_gen, double ttft_s, double tps)
{
    if (s->cfg.log_json)
        tp_log(TP_LOG_INFO, "http",
               "{\"id\":\"%s\",\"path\":\"%s\",\"status\":%d,\"prompt_tokens\":%d,\"cached_tokens\":%d,"
               "\"completion_tokens\":%d,\"ttft_ms\":%.1f,\"tokens_per_s\":%.2f}",
               id, path, status, n_prompt, n_cached, n_gen, ttft_s * 1e3, tps);
    else
        tp_log(TP_LOG_INFO, "http", "%s %s status=%d prompt=%d cached=%d gen=%d ttft=%.1fms %.2f tok/s", id, path,
               status, n_prompt, n_cached, n_gen, ttft_s * 1e3, tps);
}

/* ------------------------------------------------------------ small endpoints */

static enum MHD_Result handle_health(struct tp_server *s, struct MHD_Connection *c)
{
    struct tp_api_error e;
    char reason[512];
    pthread_mutex_lock(&s->state_mu);
    int state = s->state;
    snprintf(reason, sizeof reason, "%s", s->fail_reason);
    pthread_mutex_unlock(&s->state_mu);
    if (state == TP_SRV_LOADING) {
        tp_api_err(&e, TP_ERR_BUSY, NULL, "loading the model");
        return tp_http_send_error(s, c, &e);
    }
    if (state == TP_SRV_FAILED) {
        tp_api_err(&e, TP_ERR_POISONED, NULL, "%s", reason);
        return tp_http_send_error(s, c, &e);
    }
    if (!tp_engine_healthy(s->engine, reason, sizeof reason)) {
        tp_api_err(&e, TP_ERR_PEER, NULL, "%s", reason);
        return tp_http_send_error(s, c, &e);
    }
    char body[128];
    snprintf(body, sizeof body, "{\"status\":\"ok\",\"ranks\":%d}", tp_parallel_size(s->par));
    return tp_http_send_json(s, c, 200, body);
}

static enum MHD_Result handle_metrics(struct tp_server *s, struct MHD_Connection *c)
{
    struct tp_metrics_gauges g;
    memset(&g, 0, sizeof g);
    pthread_mutex_lock(&s->state_mu);
    int ready = s->state == TP_SRV_READY;
    pthread_mutex_unlock(&s->state_mu);
    if (ready) tp_engine_gauges(s->engine, &g);
    g.n_parallel = s->cfg.n_parallel;
    struct tp_buf b = {0};
    tp_metrics_request(s->metrics, 200);
    if (tp_metrics_render(s->metrics, &g, &b) != TP_OK) {
        tp_buf_free(&b);
        return MHD_NO;
    }
    enum MHD_Result r = tp_http_send(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len, NULL, NULL);
    tp_buf_free(&b);
    return r;
}

static cJSON *model_object(struct tp_server *s)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_id ? s->model_id : "tpserve");
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "tpserve");
    return m;
}

/* GET /v1/models/{id} */
static enum MHD_Result handle_model_one(struct tp_server *s, struct MHD_Connection *c, const char *id)
{
    struct tp_api_error e;
    pthread_mutex_lock(&s->state_mu);
    int ready = s->state == TP_SRV_READY;
    pthread_mutex_unlock(&s->state_mu);
    if (!ready) {
        tp_api_err(&e, TP_ERR_BUSY, NULL, "the model is not loaded (yet)");
        return tp_http_send_error(s, c, &e);
    }
    if (!s->model_id || strcmp(id, s->model_id) != 0) {
        tp_api_err(&e, TP_ERR_NOT_FOUND, "model", "model '%.200s' does not exist here; this server serves '%s'", id,
                   s->model_id ? s->model_id : "tpserve");
        e.code = "model_not_found";
        return tp_http_send_error(s, c, &e);
    }
    cJSON *m = model_object(s);
    char *json = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    if (!json) return MHD_NO;
    enum MHD_Result r = tp_http_send_json(s, c, 200, json);
    free(json);
    return r;
}

static enum MHD_Result handle_models(struct tp_server *s, struct MHD_Connection *c)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, model_object(s));
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return MHD_NO;
    enum MHD_Result r = tp_http_send_json(s, c, 200, json);
    free(json);
    return r;
}

static enum tp_status parse_body_object(const char *body, size_t len, cJSON **out, struct tp_api_error *e)
{
    cJSON *root = tp_json_parse(body, len, e); /* strings hold NUL as C0 80 */
    if (!root) return e->status;
    *out = root;
    return TP_OK;
}

/*
 * POST /tokenize answers {"tokens":[...]} written piece by piece from the
 * token ids as MHD asks for it, so the response costs a 16 KiB block
 * whatever the number of tokens: with_pieces objects for a 1 MiB body would
 * otherwise be tens of MiB of JSON (or hundreds as a cJSON tree).
 */
struct tok_stream {
    struct tp_server *s;
    int32_t *ids;            /* (n) owned */
    int n, next;             /* next: first id not yet formatted */
    int with_pieces;
    int stage;               /* 0: "{"tokens":[" pending, 1: items, 2: "]}" pending, 3: done */
    struct tp_buf item;      /* formatted, not yet handed out (one item at most) */
    size_t item_pos;
};

/* Append piece[0..n) as a JSON string literal (json_nul.c: NUL as \u0000,
 * bytes that are not UTF-8 as U+FFFD).  Returns TP_OK or TP_ERR_NOMEM. */
static enum tp_status json_string_piece(struct tp_buf *o, const char *piece, size_t n)
{
    cJSON *str = tp_json_string_bytes(piece, n);
    char *lit = str ? tp_json_print(str) : NULL;
    enum tp_status rc = lit ? tp_buf_puts(o, lit) : TP_ERR_NOMEM;
    cJSON_free(lit);
    cJSON_Delete(str);
    return rc;
}

/* Format the next piece of the response into ts->item; *end set when there is none.
 * Returns TP_OK or TP_ERR_NOMEM. */
static enum tp_status tok_stream_next(struct tok_stream *ts, int *end)
{
    ts->item.len = 0;
    ts->item_pos = 0;
    *end = 0;
    if (ts->stage == 0) {
        ts->stage = 1;
        return tp_buf_puts(&ts->item, "{\"tokens\":[");
    }
    if (ts->stage == 1 && ts->next < ts->n) {
        int k = ts->next++, id = ts->ids[k];
        enum tp_status rc = k > 0 ? tp_buf_puts(&ts->item, ",") : TP_OK;
        if (rc == TP_OK && !ts->with_pieces) return tp_buf_printf(&ts->item, "%d", (int)id);
        size_t pl = 0;
        const char *piece = tp_tokenizer_piece(ts->s->tok, id, &pl);
        if (rc == TP_OK) rc = tp_buf_printf(&ts->item, "{\"id\":%d,\"piece\":", (int)id);
        if (rc == TP_OK) rc = json_string_piece(&ts->item, piece ? piece : "", piece ? pl : 0);
        if (rc == TP_OK) rc = tp_buf_puts(&ts->item, "}");
        return rc;
    }
    if (ts->stage <= 2) {
        ts->stage = 3;
        return tp_buf_puts(&ts->item, "]}");
    }
    *end = 1;
    return TP_OK;
}

static ssize_t tok_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct tok_stream *ts = cls;
    size_t n = 0;
    while (n < max) {
        if (ts->item_pos == ts->item.len) {
            int end;
            if (tok_stream_next(ts, &end) != TP_OK) return MHD_CONTENT_READER_END_WITH_ERROR;
            if (end) break;
        }
        size_t k = TP_MIN(max - n, ts->item.len - ts->item_pos);
        memcpy(buf + n, ts->item.data + ts->item_pos, k);
        ts->item_pos += k;
        n += k;
    }
    return n > 0 ? (ssize_t)n : MHD_CONTENT_READER_END_OF_STREAM;
}

static void tok_stream_free(void *cls)
{
    struct tok_stream *ts = cls;
    free(ts->ids);
    tp_buf_free(&ts->item);
    free(ts);
}

static enum MHD_Result handle_tokenize(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    struct tp_api_error e;
    cJSON *root = NULL;
    int32_t *ids = NULL;
    if (parse_body_object(body, len, &root, &e) != TP_OK) return tp_http_send_error(s, c, &e);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    const cJSON *add_special = cJSON_GetObjectItemCaseSensitive(root, "add_special");
    const cJSON *with_pieces = cJSON_GetObjectItemCaseSensitive(root, "with_pieces");
    if (!cJSON_IsString(content)) {
        tp_api_err(&e, TP_ERR_INVALID_ARG, "content",
                   "'content' (the text to tokenize) is required and must be a string");
        goto fail;
    }
    if (add_special && !cJSON_IsBool(add_special)) {
        tp_api_err(&e, TP_ERR_INVALID_ARG, "add_special", "'add_special' must be a boolean");
        goto fail;
    }
    if (with_pieces && !cJSON_IsBool(with_pieces)) {
        tp_api_err(&e, TP_ERR_INVALID_ARG, "with_pieces", "'with_pieces' must be a boolean");
        goto fail;
    }
    char *text = NULL;
    size_t text_len = 0;
    if (tp_json_bytes(content, &text, &text_len) != TP_OK) {
        tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
        goto fail;
    }
    int n = 0;
    enum tp_status st = tp_server_tokenize(s, text, text_len, cJSON_IsTrue(add_special), &ids, &n, &e);
    free(text);
    if (st != TP_OK) goto fail;
    struct tok_stream *ts = calloc(1, sizeof *ts);
    if (!ts) {
        tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
        goto fail;
    }
    ts->s = s;
    ts->ids = ids;
    ts->n = n;
    ts->with_pieces = cJSON_IsTrue(with_pieces);
    cJSON_Delete(root);
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, tok_stream_read, ts, tok_stream_free);
    if (!r) {
        tok_stream_free(ts);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    tp_metrics_request(s->metrics, 200);
    enum MHD_Result ret = tp_http_queue(s, c, 200, r);
    MHD_destroy_response(r);
    return ret;
fail:
    cJSON_Delete(root);
    free(ids);
    return tp_http_send_error(s, c, &e);
}

static enum MHD_Result handle_detokenize(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    struct tp_api_error e;
    cJSON *root = NULL;
    if (parse_body_object(body, len, &root, &e) != TP_OK) return tp_http_send_error(s, c, &e);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(toks)) {
        cJSON_Delete(root);
        tp_api_err(&e, TP_ERR_INVALID_ARG, "tokens", "'tokens' (a list of token ids) is required");
        return tp_http_send_error(s, c, &e);
    }
    int n_vocab = tp_tokenizer_n_vocab(s->tok), i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, toks)
    {
        if (!cJSON_IsNumber(t) || t->valuedouble != (double)(int)t->valuedouble || t->valuedouble < 0 ||
            t->valuedouble >= n_vocab) {
            cJSON_Delete(root);
            tp_api_err(&e, TP_ERR_INVALID_ARG, "tokens", "'tokens'[%d] is not a token id in [0, %d)", i, n_vocab);
            return tp_http_send_error(s, c, &e);
        }
        i++;
    }
    struct tp_buf text = {0};
    tp_detok_t *d = NULL;
    char tmp[1024];
    int oom = tp_detok_init(s->tok, &d) != TP_OK;
    cJSON_ArrayForEach(t, toks)
    {
        if (oom) break;
        size_t nb = tp_detok_push(d, (int)t->valuedouble, tmp, sizeof tmp);
        if (tp_buf_append(&text, tmp, nb) != TP_OK) oom = 1;
    }
    if (!oom) {
        size_t nb = tp_detok_flush(d, tmp, sizeof tmp);
        if (tp_buf_append(&text, tmp, nb) != TP_OK) oom = 1;
    }
    tp_detok_free(d);
    cJSON_Delete(root);
    if (oom) {
        tp_buf_free(&text);
        tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
        return tp_http_send_error(s, c, &e);
    }
    cJSON *resp = cJSON_CreateObject();
    int added = resp && tp_json_add_bytes(resp, "content", text.data ? text.data : "", text.len) == TP_OK;
    tp_buf_free(&text);
    char *json = added ? tp_json_print(resp) : NULL; /* NUL bytes (the <0x00> token) as \u0000 */
    cJSON_Delete(resp);
    enum MHD_Result ret = json ? tp_http_send_json(s, c, 200, json) : MHD_NO;
    free(json);
    return ret;
}

/* ------------------------------------------------------------ routing */

enum route { R_NONE = 0, R_HEALTH, R_METRICS, R_MODELS, R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE, R_PROPS, R_EXT };
static const struct {
    const char *path;
    const char *method;
    enum route r;
    int auth, needs_model;
} routes[] = {
    {"/health", "GET", R_HEALTH, 0, 0},
    {"/metrics", "GET", R_METRICS, 0, 0},
    {"/v1/models", "GET", R_MODELS, 1, 0},
    {"/v1/completions", "POST", R_COMPLETIONS, 1, 1},
    {"/v1/chat/completions", "POST", R_CHAT, 1, 1},
    {"/tokenize", "POST", R_TOKENIZE, 1, 1},
    {"/detokenize", "POST", R_DETOKENIZE, 1, 1},
    {"/props", "GET", R_PROPS, 1, 1},
    /* the other APIs (api_run.h: tp_api_route_ext) */
    /* the un-prefixed paths some clients build from a base URL without /v1 */
    {"/models", "GET", R_MODELS, 1, 0},
    {"/completions", "POST", R_COMPLETIONS, 1, 1},
    {"/chat/completions", "POST", R_CHAT, 1, 1},
    {"/embeddings", "POST", R_EXT, 1, 1},
    {"/responses", "POST", R_EXT, 1, 1},
    {"/v1/messages", "POST", R_EXT, 1, 1},
    {"/v1/messages/count_tokens", "POST", R_EXT, 1, 1},
    {"/v1/responses", "POST", R_EXT, 1, 1},
    {"/v1/responses/input_tokens", "POST", R_EXT, 1, 1},
    {"/v1/embeddings", "POST", R_EXT, 1, 1},
    {"/infill", "POST", R_EXT, 1, 1},
    {"/api/version", "GET", R_EXT, 1, 0},
    {"/api/tags", "GET", R_EXT, 1, 1},
    {"/api/ps", "GET", R_EXT, 1, 1},
    {"/api/show", "POST", R_EXT, 1, 1},
    {"/api/chat", "POST", R_EXT, 1, 1},
    {"/api/generate", "POST", R_EXT, 1, 1},
    {"/api/embed", "POST", R_EXT, 1, 1},
};

/* ------------------------------------------------------------ connections */

enum conn_phase { PH_HEADERS = 0, PH_BODY, PH_BUSY };

struct tp_http_conn {
    struct tp_http_conn *prev, *next;
    int fd;                 /* owned by MHD; valid until the CLOSED notification */
    enum conn_phase phase;
    uint64_t t_phase_ns;    /* when the phase began */
    int cut;                /* shut down by us; MHD closes it */
    int served;             /* answered a request: idle between requests when in PH_HEADERS */
    int over_limit;         /* opened over --max-connections with nothing to evict: answer 503 */
};

/* conn_mu held.  Shutting the socket down makes its MHD thread see the end
 * of input and close the connection; the fd stays valid until then. */
static void conn_cut_locked(struct tp_server *s, struct tp_http_conn *k)
{
    k->cut = 1;
    s->n_cut++;
    s->n_cut_total++;
    if (k->fd >= 0) shutdown(k->fd, SHUT_RDWR);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct tp_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct tp_http_conn *k = calloc(1, sizeof *k);
        *socket_context = k;
        if (!k) return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        k->t_phase_ns = tp_now_ns();
        int evicted = 0;
        pthread_mutex_lock(&s->conn_mu);
        k->next = s->conns;
        if (s->conns) s->conns->prev = k;
        s->conns = k;
        s->n_conns++;
        if (s->n_conns - s->n_cut > s->cfg.max_connections) {
            /* full: the connection idle longest between requests makes room (the
             * gate hands over only complete header blocks, so a connection not
             * yet served is about to be answered and is left alone) */
            struct tp_http_conn *victim = NULL;
            for (struct tp_http_conn *o = k->next; o; o = o->next)
                if (!o->cut && o->served && o->phase == PH_HEADERS && (!victim || o->t_phase_ns < victim->t_phase_ns))
                    victim = o;
            if (victim) {
                conn_cut_locked(s, victim);
                evicted = 1;
            } else {
                k->over_limit = 1;
            }
        }
        pthread_mutex_unlock(&s->conn_mu);
        if (evicted)
            tp_log(TP_LOG_DEBUG, "http", "connection limit (%d) reached: closed the longest idle kept-alive one",
                   s->cfg.max_connections);
    } else {
        struct tp_http_conn *k = *socket_context;
        if (!k) return;
        pthread_mutex_lock(&s->conn_mu);
        if (k->prev) k->prev->next = k->next;
        else s->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        s->n_conns--;
        if (k->cut) s->n_cut--;
        pthread_mutex_unlock(&s->conn_mu);
        free(k);
        *socket_context = NULL;
    }
}

static struct tp_http_conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void conn_set_phase(struct tp_server *s, struct MHD_Connection *c, enum conn_phase ph)
{
    struct tp_http_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&s->conn_mu);
    k->phase = ph;
    k->t_phase_ns = tp_now_ns();
    pthread_mutex_unlock(&s->conn_mu);
}

/* Every 200 ms: cut the connections whose header block or body is late. */
static void *watchdog_main(void *arg)
{
    struct tp_server *s = arg;
    const uint64_t hdr_ns = (uint64_t)s->cfg.header_timeout_s * 1000000000u;
    const uint64_t body_ns = (uint64_t)s->cfg.body_timeout_s * 1000000000u;
    pthread_mutex_lock(&s->conn_mu);
    while (!s->watchdog_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->conn_cv, &s->conn_mu, &ts);
        if (s->watchdog_stop) break;
        uint64_t now = tp_now_ns();
        int n_hdr = 0, n_body = 0;
        for (struct tp_http_conn *k = s->conns; k; k = k->next) {
            if (k->cut || now < k->t_phase_ns) continue;
            if (k->phase == PH_HEADERS && hdr_ns && now - k->t_phase_ns > hdr_ns) {
                conn_cut_locked(s, k);
                n_hdr++;
            } else if (k->phase == PH_BODY && body_ns && now - k->t_phase_ns > body_ns) {
                conn_cut_locked(s, k);
                n_body++;
            }
        }
        if (n_hdr + n_body > 0) {
            pthread_mutex_unlock(&s->conn_mu);
            tp_log(TP_LOG_INFO, "http",
                   "closed %d connection(s) whose header block took over %u s and %d whose body took over %u s",
                   n_hdr, s->cfg.header_timeout_s, n_body, s->cfg.body_timeout_s);
            pthread_mutex_lock(&s->conn_mu);
        }
    }
    pthread_mutex_unlock(&s->conn_mu);
    return NULL;
}

/* Reserve n bytes of the server-wide budget.  Returns TP_OK, or TP_ERR_BUSY when it would overflow. */
static enum tp_status budget_reserve(struct tp_server *s, size_t n)
{
    size_t cur = __atomic_load_n(&s->mem_used, __ATOMIC_RELAXED);
    do {
        if (n > s->cfg.mem_budget_bytes || cur > s->cfg.mem_budget_bytes - n) return TP_ERR_BUSY;
    } while (!__atomic_compare_exchange_n(&s->mem_used, &cur, cur + n, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
    return TP_OK;
}

/* ------------------------------------------------------------ requests */

struct conn_ctx {
    int route_idx;
    struct tp_buf body;
    size_t reserved;   /* bytes of the budget held until the request completes */
    int answered;
};

int tp_http_check_auth(struct tp_server *s, struct MHD_Connection *c)
{
    if (!s->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *xk = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's clients */
    if (xk && !h) {
        size_t a = strlen(xk), b = strlen(s->cfg.api_key);
        unsigned diff = (unsigned)(a ^ b);
        for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(xk[i] ^ s->cfg.api_key[i]);
        return diff == 0;
    }
    /* the scheme name is case-insensitive (RFC 9110 11.1) */
    if (!h || strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t')) return 0;
    const char *k = h + 6;
    while (*k == ' ' || *k == '\t') k++;
    size_t a = strlen(k), b = strlen(s->cfg.api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(k[i] ^ s->cfg.api_key[i]);
    return diff == 0;
}

struct framing {
    int n_cl, n_te;
    const char *cl, *te;
};

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    struct framing *f = cls;
    if (strcasecmp(key, "Content-Length") == 0) f->n_cl++, f->cl = value;
    else if (strcasecmp(key, "Transfer-Encoding") == 0) f->n_te++, f->te = value;
    return MHD_YES;
}

/*
 * Check how the body is delimited, before any of it is read.  Returns TP_OK
 * with *cl (declared length) and *has_cl, or TP_ERR_FORMAT with e filled;
 * *raw is set when MHD has already queued its own reply (a Content-Length it
 * could not parse), so ours must go out on the socket.
 */
static enum tp_status check_framing(struct MHD_Connection *c, unsigned long long *cl, int *has_cl, int *raw,
                         struct tp_api_error *e)
{
    struct framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    *cl = 0;
    *has_cl = 0;
    *raw = 0;
    if (f.n_te && f.n_cl)
        return tp_api_err(e, TP_ERR_FORMAT, NULL,
                          "the request has both Transfer-Encoding and Content-Length; send one");
    if (f.n_te > 1 || (f.n_te && strcasecmp(f.te, "chunked") != 0))
        return tp_api_err(e, TP_ERR_FORMAT, NULL,
                          "Transfer-Encoding '%.64s' is not supported; send 'chunked' or a Content-Length", f.te);
    if (f.n_cl > 1)
        return tp_api_err(e, TP_ERR_FORMAT, NULL, "the request has %d Content-Length headers; send one", f.n_cl);
    if (f.n_cl) {
        const char *v = f.cl;
        size_t n = strlen(v);
        int digits = n > 0 && n <= 19;
        for (size_t i = 0; digits && i < n; i++) digits = v[i] >= '0' && v[i] <= '9';
        if (!digits) {
            *raw = 1;
            return tp_api_err(e, TP_ERR_FORMAT, NULL, "Content-Length '%.32s' is not a decimal byte count", v);
        }
        *cl = strtoull(v, NULL, 10);
        *has_cl = 1;
    }
    return TP_OK;
}

static int route_matches(const char *method, const char *route_method)
{
    /* HEAD is answered wherever GET is (MHD sends the headers only) */
    return strcmp(method, route_method) == 0 || (strcmp(method, "HEAD") == 0 && strcmp(route_method, "GET") == 0);
}

/* First call for a request: the header block is complete, no body byte read yet. */
static enum MHD_Result on_headers(struct tp_server *s, struct MHD_Connection *c, struct conn_ctx *cc, const char *url,
                                  const char *method)
{
    struct tp_api_error e;
    struct tp_http_conn *k = conn_of(c);
    conn_set_phase(s, c, PH_BODY);
    cc->answered = 1; /* unless the request passes every check below */
    if (k && k->over_limit) {
        tp_api_err(&e, TP_ERR_BUSY, NULL,
                   "the server has %d connections open, its limit (--max-connections); retry shortly",
                   s->cfg.max_connections);
        e.code = "server_busy";
        return send_error_close(s, c, url, &e);
    }
    unsigned long long cl;
    int has_cl, raw;
    if (check_framing(c, &cl, &has_cl, &raw, &e) != TP_OK)
        return raw ? send_raw_and_close(s, c, &e) : send_error_close(s, c, url, &e);
    enum MHD_Result web_ret;
    if (tp_web_route(s, c, url, method, &web_ret)) return web_ret;
    if (strncmp(url, "/v1/models/", 11) == 0 && url[11]) {
        if (!route_matches(method, "GET")) {
            tp_api_err(&e, TP_ERR_NOT_ALLOWED, NULL, "method %s is not allowed on %s", method, url);
            return send_error_close(s, c, url, &e);
        }
        if (!tp_http_check_auth(s, c)) {
            tp_api_err(&e, TP_ERR_DENIED, NULL, "missing or wrong API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
            return send_error_close(s, c, url, &e);
        }
        return handle_model_one(s, c, url + 11);
    }
    const char *rp = strncmp(url, "/v1/responses/", 14) == 0 ? url + 14 : strncmp(url, "/responses/", 11) == 0 ? url + 11 : NULL;
    if (rp && *rp && strcmp(rp, "input_tokens") != 0) {
        /* a stored response (api_responses.c): no body */
        if (!route_matches(method, "GET") && strcmp(method, "DELETE") != 0) {
            tp_api_err(&e, TP_ERR_NOT_ALLOWED, NULL, "method %s is not allowed on %s (GET, DELETE)", method, url);
            return send_error_close(s, c, url, &e);
        }
        if (!tp_http_check_auth(s, c)) {
            tp_api_err(&e, TP_ERR_DENIED, NULL, "missing or wrong API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
            return send_error_close(s, c, url, &e);
        }
        return tp_api_responses_stored(s, c, strcmp(method, "DELETE") == 0 ? "DELETE" : "GET", rp);
    }
    int path_known = 0;
    for (size_t i = 0; i < TP_ARRAY_LEN(routes); i++) {
        if (strcmp(url, routes[i].path) != 0) continue;
        path_known = 1;
        if (route_matches(method, routes[i].method)) cc->route_idx = (int)i;
    }
    if (cc->route_idx < 0) {
        if (path_known)
            tp_api_err(&e, TP_ERR_NOT_ALLOWED, NULL, "method %s is not allowed on %s", method, url);
        else
            tp_api_err(&e, TP_ERR_NOT_FOUND, NULL,
                       "no such endpoint: %s %s (see /v1/completions, /v1/chat/completions, /v1/models, "
                       "/v1/messages, /v1/responses, /v1/embeddings, /infill, the Ollama /api/ routes, "
                       "/v1/cluster, /health, /metrics, /tokenize, /detokenize, and the web page at /; docs/api.md)",
                       method, url);
        return send_error_close(s, c, url, &e);
    }
    if (routes[cc->route_idx].auth && !tp_http_check_auth(s, c)) {
        tp_api_err(&e, TP_ERR_DENIED, NULL, "missing or wrong API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
        return send_error_close(s, c, url, &e);
    }
    if (has_cl && cl > s->cfg.max_body_bytes) {
        tp_api_err(&e, TP_ERR_TOO_LARGE, NULL, "request body of %llu bytes exceeds the limit of %zu bytes (--max-body)",
                   cl, s->cfg.max_body_bytes);
        return send_error_close(s, c, url, &e);
    }
    if (strcmp(routes[cc->route_idx].method, "POST") == 0) {
        size_t body = has_cl ? (size_t)cl : s->cfg.max_body_bytes;
        size_t want = body * TP_HTTP_WORK_FACTOR + TP_HTTP_WORK_CONST;
        if (budget_reserve(s, want) != TP_OK) {
            tp_api_err(&e, TP_ERR_BUSY, NULL,
                       "the server is holding its memory budget for requests in flight (--mem-budget %zu bytes); "
                       "retry shortly", s->cfg.mem_budget_bytes);
            e.code = "server_busy";
            return send_error_close(s, c, url, &e);
        }
        cc->reserved = want;
        if (has_cl && cl > 0) {
            cc->body.data = malloc((size_t)cl + 1);
            if (!cc->body.data) return MHD_NO;
            cc->body.cap = (size_t)cl + 1;
            cc->body.data[0] = '\0';
        }
    }
    cc->answered = 0;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    struct tp_server *s = cls;
    struct conn_ctx *cc = *con_cls;
    struct tp_api_error e;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        cc->route_idx = -1;
        *con_cls = cc;
        return on_headers(s, c, cc, url, method);
    }
    if (*upload_size > 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cc->answered) return MHD_YES;
        if (cc->body.len + n > s->cfg.max_body_bytes) {
            /* a chunked body past the limit: stop reading it */
            cc->answered = 1;
            tp_api_err(&e, TP_ERR_TOO_LARGE, NULL, "request body exceeds the limit of %zu bytes (--max-body)",
                       s->cfg.max_body_bytes);
            return send_raw_and_close(s, c, &e);
        }
        if (tp_buf_append(&cc->body, upload, n) != TP_OK) return MHD_NO;
        return MHD_YES;
    }
    if (cc->answered) return MHD_YES;
    cc->answered = 1;
    conn_set_phase(s, c, PH_BUSY);
    enum route r = routes[cc->route_idx].r;
    if (r == R_HEALTH) return handle_health(s, c);
    if (r == R_METRICS) return handle_metrics(s, c);
    pthread_mutex_lock(&s->state_mu);
    int state = s->state;
    char reason[512];
    snprintf(reason, sizeof reason, "%s", s->fail_reason);
    pthread_mutex_unlock(&s->state_mu);
    if (state != TP_SRV_READY && routes[cc->route_idx].needs_model) {
        if (state == TP_SRV_LOADING) tp_api_err(&e, TP_ERR_BUSY, NULL, "the model is still loading; retry shortly");
        else tp_api_err(&e, TP_ERR_POISONED, NULL, "%s", reason);
        return tp_http_send_error(s, c, &e);
    }
    const char *body = cc->body.data ? cc->body.data : "";
    switch (r) {
    case R_MODELS: return handle_models(s, c);
    case R_PROPS: return tp_api_props(s, c); /* props.c */
    case R_TOKENIZE: return handle_tokenize(s, c, body, cc->body.len);
    case R_DETOKENIZE: return handle_detokenize(s, c, body, cc->body.len);
    case R_EXT: return tp_api_route_ext(s, c, routes[cc->route_idx].path, body, cc->body.len);
    case R_COMPLETIONS: return tp_api_handle_completion(s, c, 0, body, cc->body.len);
    case R_CHAT: return tp_api_handle_completion(s, c, 1, body, cc->body.len);
    default: break;
    }
    tp_api_err(&e, TP_ERR_INTERNAL, NULL, "unrouted request");
    return tp_http_send_error(s, c, &e);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    struct tp_server *s = cls;
    struct tp_http_conn *k = conn_of(c);
    if (k) {
        /* a next request on this connection has its own header deadline */
        pthread_mutex_lock(&s->conn_mu);
        k->phase = PH_HEADERS;
        k->t_phase_ns = tp_now_ns();
        k->served = 1;
        pthread_mutex_unlock(&s->conn_mu);
    }
    struct conn_ctx *cc = *con_cls;
    if (!cc) return;
    if (cc->reserved) __atomic_sub_fetch(&s->mem_used, cc->reserved, __ATOMIC_ACQ_REL);
    tp_buf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    tp_logv(TP_LOG_DEBUG, "mhd", fmt, ap);
}

/* ------------------------------------------------------------ life cycle */

enum tp_status tp_server_tokenize(struct tp_server *s, const char *text, size_t len, int add_bos, int32_t **out,
                                  int *n_out, struct tp_api_error *e)
{
    int cap = (int)TP_MIN(len + 16, (size_t)1 << 24);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!ids) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
    pthread_mutex_lock(&s->tok_mu);
    int n = tp_tokenizer_encode(s->tok, text, len, add_bos, 1, ids, cap);
    if (n > cap) {
        int32_t *b = realloc(ids, sizeof(int32_t) * (size_t)n);
        if (b) {
            ids = b;
            cap = n;
            n = tp_tokenizer_encode(s->tok, text, len, add_bos, 1, ids, cap);
        } else {
            n = -2;
        }
    }
    pthread_mutex_unlock(&s->tok_mu);
    if (n < 0) {
        free(ids);
        return n == -2 ? tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory")
                       : tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "the text could not be tokenized (invalid UTF-8?)");
    }
    *out = ids;
    *n_out = n;
    return TP_OK;
}

void tp_srv_utf8_sanitize(const char *s, size_t n, struct tp_buf *out)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i + 1;
        unsigned char ch = (unsigned char)s[i];
        size_t len = ch < 0x80 ? 1 : (ch & 0xE0) == 0xC0 ? 2 : (ch & 0xF0) == 0xE0 ? 3 : (ch & 0xF8) == 0xF0 ? 4 : 0;
        if (len && i + len <= n && tp_srv_utf8_valid(s + i, len)) j = i + len;
        if (j == i + len && len) {
            tp_buf_append(out, s + i, len);
        } else {
            tp_buf_puts(out, "\xEF\xBF\xBD");
            j = i + 1;
        }
        i = j;
    }
    if (!out->data) tp_buf_append(out, "", 0);
}

enum tp_status tp_server_init(const struct tp_server_config *cfg, tp_server_t **out, struct tp_error *err)
{
    *out = NULL;
    if (cfg->port < 0 || cfg->port > 65535)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "--port %d: must be between 0 and 65535", cfg->port);
    if (cfg->n_parallel < 1 || cfg->n_parallel > 256)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "--parallel %d: must be between 1 and 256", cfg->n_parallel);
    if (cfg->chat_template && tp_chat_family_parse(cfg->chat_template) == TP_CHAT_UNKNOWN)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "--chat-template %s: unknown; known templates: %s",
                            cfg->chat_template, tp_server_chat_template_names());
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)cfg->port);
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    if (strcmp(host, "localhost") == 0) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "--host %s: not an IPv4 address (use e.g. 127.0.0.1 or 0.0.0.0)",
                            host);
    if (cfg->max_body_bytes > (cfg->mem_budget_bytes - TP_MIN(cfg->mem_budget_bytes, TP_HTTP_WORK_CONST)) /
                                    TP_HTTP_WORK_FACTOR) {
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "--mem-budget %zu is too small for one request of --max-body %zu bytes (each reserves "
                            "%d x its body + %zu bytes); raise --mem-budget or lower --max-body",
                            cfg->mem_budget_bytes, cfg->max_body_bytes, TP_HTTP_WORK_FACTOR, TP_HTTP_WORK_CONST);
    }
    if (cfg->cors_origin && !tp_web_origin_valid(cfg->cors_origin))
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "--cors-origin '%.200s': want '*' or an origin such as https://app.example.com:8443 "
                            "(scheme://host[:port], no path)", cfg->cors_origin);
    struct tp_server *s = calloc(1, sizeof *s);
    if (!s) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    s->cfg = *cfg;
    s->cfg.host = (host ? strdup(host) : NULL);
    s->cfg.api_key = (cfg->api_key ? strdup(cfg->api_key) : NULL);
    s->cfg.chat_template = (cfg->chat_template ? strdup(cfg->chat_template) : NULL);
    s->cfg.model_id = (cfg->model_id ? strdup(cfg->model_id) : NULL);
    s->cfg.cors_origin = (cfg->cors_origin ? strdup(cfg->cors_origin) : NULL);
    s->cfg.draft_model = (cfg->draft_model ? strdup(cfg->draft_model) : NULL);
    s->cfg.logit_bias = (cfg->logit_bias ? strdup(cfg->logit_bias) : NULL);
    if (s->cfg.max_queue < 1) s->cfg.max_queue = 1;
    if (s->cfg.max_connections < 4) s->cfg.max_connections = 4;
    if (s->cfg.max_conn_per_ip < 1) s->cfg.max_conn_per_ip = 1;
    if (s->cfg.n_batch < s->cfg.n_parallel) s->cfg.n_batch = s->cfg.n_parallel;
    pthread_mutex_init(&s->state_mu, NULL);
    pthread_mutex_init(&s->tok_mu, NULL);
    pthread_mutex_init(&s->stop_mu, NULL);
    pthread_cond_init(&s->stop_cv, NULL);
    pthread_mutex_init(&s->conn_mu, NULL);
    pthread_cond_init(&s->conn_cv, NULL);
    s->state = TP_SRV_LOADING;
    s->created = (int64_t)time(NULL);
    s->metrics = tp_metrics_new();
    s->web = tp_web_new();
    s->resp_store = tp_resp_store_new(cfg->responses_store);
    if (pipe(s->stop_pipe) != 0) {
        s->stop_pipe[0] = s->stop_pipe[1] = -1;
        tp_server_free(s);
        return tp_error_set(err, TP_ERR_IO, "pipe: %s", strerror(errno));
    }
    if (!s->metrics || !s->web || !s->resp_store || (cfg->cors_origin && !s->cfg.cors_origin) ||
        (cfg->draft_model && !s->cfg.draft_model) ||
        (cfg->logit_bias && !s->cfg.logit_bias)) {
        tp_server_free(s);
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    }
    if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0) {
        tp_server_free(s);
        return tp_error_set(err, TP_ERR_IO, "could not start the connection watchdog thread");
    }
    s->watchdog_started = 1;
    /* MHD's own limit leaves room above ours for the connections we answer
     * 503 or are evicting (it closes anything beyond without a word). */
    unsigned mhd_limit = (unsigned)s->cfg.max_connections + 64;
    s->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC, 0,
        NULL, NULL, on_request, s, MHD_OPTION_CONNECTION_LIMIT, mhd_limit, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)s->cfg.max_conn_per_ip, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.conn_timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)128 * 1024,
        MHD_OPTION_END);
    if (!s->daemon) {
        tp_server_free(s);
        return tp_error_set(err, TP_ERR_IO, "could not start the HTTP daemon (libmicrohttpd)");
    }
    struct tp_error gerr = {0};
    if (tp_http_gate_start(s, &sa, &gerr) != TP_OK) {
        tp_server_free(s);
        return tp_error_set(err, TP_ERR_IO, "could not listen on %s:%d: %s (port in use? try another --port, or "
                            "--port 0 for any)", host, cfg->port, gerr.msg);
    }
    *out = s;
    return TP_OK;
}

int tp_server_port(const tp_server_t *s) { return s->port; }

/* --logit-bias "ID+BIAS,ID-BIAS,..." into s->bias_id / bias_val (sorted by id), checked against the
 * vocabulary.  TP_OK, TP_ERR_INVALID_ARG (err names the entry), TP_ERR_NOMEM. */
static enum tp_status parse_server_bias(struct tp_server *s, const char *spec, struct tp_error *err)
{
    int n = 1;
    for (const char *q = spec; *q; q++) n += *q == ',';
    s->bias_id = malloc(sizeof(int32_t) * (size_t)n);
    s->bias_val = malloc(sizeof(float) * (size_t)n);
    if (!s->bias_id || !s->bias_val) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    int k = 0;
    for (const char *q = spec; *q;) {
        char *end = NULL;
        long id = strtol(q, &end, 10);
        int ok = end != q && (*end == '+' || *end == '-');
        double b = ok ? strtod(end, &end) : 0;
        if (!ok || !(b >= -100.0 && b <= 100.0) || (*end && *end != ',') || id < 0 || id >= s->n_vocab)
            return tp_error_set(err, TP_ERR_INVALID_ARG, "--logit-bias: '%.40s' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS "
                                "with a token id below %d and a bias from -100 to 100", q, s->n_vocab);
        int at = k;
        while (at > 0 && s->bias_id[at - 1] > id) at--;
        if (at > 0 && s->bias_id[at - 1] == id)
            return tp_error_set(err, TP_ERR_INVALID_ARG, "--logit-bias: token %ld is listed twice", id);
        memmove(s->bias_id + at + 1, s->bias_id + at, sizeof(int32_t) * (size_t)(k - at));
        memmove(s->bias_val + at + 1, s->bias_val + at, sizeof(float) * (size_t)(k - at));
        s->bias_id[at] = (int32_t)id;
        s->bias_val[at] = (float)b;
        k++;
        q = *end ? end + 1 : end;
    }
    s->n_bias = k;
    return TP_OK;
}

enum tp_status tp_server_start(tp_server_t *s, tp_parallel_t *p, struct tp_error *err)
{
    s->par = p;
    s->tok = tp_parallel_tokenizer(p);
    tp_model_t *m = tp_parallel_model(p);
    const char *tmpl = tp_model_chat_template(m);
    if (s->cfg.chat_template) {
        s->chat = tp_chat_family_parse(s->cfg.chat_template);
    } else {
        s->chat = tp_chat_detect(tmpl);
        if (s->chat == TP_CHAT_UNKNOWN) {
            tp_error_set(err, TP_ERR_UNSUPPORTED,
                         "the model's chat template is not one tpserve can render; pass --chat-template NAME (%s)",
                         tp_server_chat_template_names());
            tp_server_set_failed(s, err->msg);
            return TP_ERR_UNSUPPORTED;
        }
    }
    if (s->chat == TP_CHAT_HARMONY && !tp_harmony_ids_init(s->tok, &s->harmony)) {
        tp_error_set(err, TP_ERR_UNSUPPORTED,
                     "the harmony chat format (gpt-oss) needs the <|start|> <|end|> <|message|> <|channel|> <|return|> "
                     "<|call|> tokens, which this model's vocabulary lacks; pass another --chat-template (%s)",
                     tp_server_chat_template_names());
        tp_server_set_failed(s, err->msg);
        return TP_ERR_UNSUPPORTED;
    }
    if (!s->cfg.chat_template && (s->chat == TP_CHAT_CHATML || s->chat == TP_CHAT_QWEN25))
        s->has_default_system = tp_chat_default_system(tmpl, s->default_system, sizeof s->default_system);
    int bos = tp_tokenizer_bos(s->tok), eos = tp_tokenizer_eos(s->tok);
    size_t l = 0;
    const char *t;
    if (bos >= 0 && (t = tp_tokenizer_piece(s->tok, bos, &l)) != NULL) snprintf(s->bos_text, sizeof s->bos_text, "%.*s", (int)l, t);
    if (eos >= 0 && (t = tp_tokenizer_piece(s->tok, eos, &l)) != NULL) snprintf(s->eos_text, sizeof s->eos_text, "%.*s", (int)l, t);
    const char *id = s->cfg.model_id ? s->cfg.model_id : tp_model_name(m);
    s->model_id = id ? strdup(id) : NULL;
    s->n_ctx = tp_model_n_ctx(m);
    s->n_vocab = tp_parallel_hparams(p)->n_vocab;
    tp_server_gen_init(s);     /* props.c: the generation defaults every request starts from */
    tp_server_identity_init(s); /* props.c: system_fingerprint */
    if (s->cfg.logit_bias && parse_server_bias(s, s->cfg.logit_bias, err) != TP_OK) {
        tp_server_set_failed(s, err->msg);
        return err->status;
    }
    struct tp_engine_config ec = {.n_parallel = s->cfg.n_parallel, .max_queue = s->cfg.max_queue,
                                  .n_batch = s->cfg.n_batch, .prefill_chunk = s->cfg.prefill_chunk,
                                  .prefix_share_min = s->cfg.prefix_share_min,
                                  .recover_wait_ms = s->cfg.recover_wait_s * 1000u,
                                  .replan = s->cfg.on_rank_loss_replan,
                                  .replan_after_ms = s->cfg.replan_after_s * 1000u,
                                  .spec = s->cfg.spec, .draft_max = s->cfg.draft_max,
                                  .draft_model = s->cfg.draft_model};
    enum tp_status rc = tp_engine_init(&ec, p, s->metrics, &s->engine, err);
    if (rc != TP_OK) {
        tp_server_set_failed(s, err->msg);
        return rc;
    }
    pthread_mutex_lock(&s->state_mu);
    s->state = TP_SRV_READY;
    pthread_mutex_unlock(&s->state_mu);
    tp_log(TP_LOG_INFO, "server", "ready: model '%s', %d ranks, context %d, %d parallel, chat template %s",
           s->model_id ? s->model_id : "?", tp_parallel_size(p), s->n_ctx, s->cfg.n_parallel,
           tp_chat_family_name(s->chat));
    return TP_OK;
}

void tp_server_set_failed(tp_server_t *s, const char *reason)
{
    pthread_mutex_lock(&s->state_mu);
    s->state = TP_SRV_FAILED;
    snprintf(s->fail_reason, sizeof s->fail_reason, "%s", reason);
    pthread_mutex_unlock(&s->state_mu);
}

enum tp_status tp_server_run(tp_server_t *s)
{
    for (;;) {
        char ch;
        ssize_t n = read(s->stop_pipe[0], &ch, 1);
        if (n == 1 || (n < 0 && errno != EINTR)) break;
    }
    return TP_OK;
}

void tp_server_stop(tp_server_t *s)
{
    char ch = 1;
    ssize_t n = write(s->stop_pipe[1], &ch, 1);
    (void)n;
}

void tp_server_free(tp_server_t *s)
{
    if (!s) return;
    /* Engine first: it fails every waiting request so blocked HTTP threads
     * return; then the daemon joins its connection threads. */
    tp_engine_stop(s->engine);
    pthread_mutex_lock(&s->state_mu);
    s->state = TP_SRV_FAILED;
    snprintf(s->fail_reason, sizeof s->fail_reason, "the server is shutting down");
    pthread_mutex_unlock(&s->state_mu);
    tp_http_gate_stop(s);
    if (s->watchdog_started) {
        pthread_mutex_lock(&s->conn_mu);
        s->watchdog_stop = 1;
        pthread_cond_signal(&s->conn_cv);
        pthread_mutex_unlock(&s->conn_mu);
        pthread_join(s->watchdog, NULL);
    }
    if (s->daemon) MHD_stop_daemon(s->daemon);
    tp_engine_free(s->engine);
    tp_metrics_free(s->metrics);
    tp_web_free(s->web);
    tp_resp_store_free(s->resp_store);
    if (s->stop_pipe[0] >= 0) close(s->stop_pipe[0]);
    if (s->stop_pipe[1] >= 0) close(s->stop_pipe[1]);
    free((char *)s->cfg.host);
    free((char *)s->cfg.api_key);
    free((char *)s->cfg.chat_template);
    free((char *)s->cfg.model_id);
    free((char *)s->cfg.cors_origin);
    free((char *)s->cfg.draft_model);
    free((char *)s->cfg.logit_bias);
    free(s->bias_id);
    free(s->bias_val);
    free(s->model_id);
    pthread_mutex_destroy(&s->state_mu);
    pthread_mutex_destroy(&s->tok_mu);
    pthread_mutex_destroy(&s->stop_mu);
    pthread_cond_destroy(&s->stop_cv);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_cond_destroy(&s->conn_cv);
    free(s);
}

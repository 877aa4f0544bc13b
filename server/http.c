/*
 * server/http.c - the HTTP layer: libmicrohttpd daemon (one thread per
 * connection, bounded connections, idle timeout), routing, authentication,
 * body collection with the --max-body cap (413), and the small endpoints
 * (/health, /metrics, /v1/models, /tokenize, /detokenize).  The completion
 * endpoints live in api.c; the engine thread in scheduler.c.
 *
 * Blocking is allowed in this threading mode: a non-streaming request waits
 * for its result inside the access handler, a streaming one inside the
 * response's content callback; both poll the client socket every 100 ms and
 * cancel the sequence when the client has gone.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

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
    c.conn_timeout_s = 60;
    c.n_batch = 256;
    c.prefill_chunk = 64;
    c.prefix_share_min = 32;
    return c;
}

static char *dup_or_null(const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

/* ------------------------------------------------------------ responses */

enum MHD_Result tp_http_send(struct MHD_Connection *c, int status, const char *content_type, const char *body,
                             size_t len, const char *extra_name, const char *extra_value)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", content_type);
    if (extra_name) MHD_add_response_header(r, extra_name, extra_value);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result tp_http_send_json(struct tp_server *s, struct MHD_Connection *c, int status, const char *json)
{
    tp_metrics_request(s->metrics, status);
    return tp_http_send(c, status, "application/json", json, strlen(json), NULL, NULL);
}

enum MHD_Result tp_http_send_error(struct tp_server *s, struct MHD_Connection *c, const struct tp_api_error *e)
{
    char *json = tp_api_error_json(e);
    if (!json) return MHD_NO;
    tp_metrics_request(s->metrics, e->status);
    const char *hn = NULL, *hv = NULL;
    if (e->status == 429) hn = "Retry-After", hv = "1";
    else if (e->status == 405) hn = "Allow", hv = "GET, POST";
    else if (e->status == 401) hn = "WWW-Authenticate", hv = "Bearer";
    enum MHD_Result ret = tp_http_send(c, e->status, "application/json", json, strlen(json), hn, hv);
    /* one log line per refused request too */
    if (s->cfg.log_json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "status", e->status);
        cJSON_AddStringToObject(o, "param", e->param);
        cJSON_AddStringToObject(o, "error", e->message);
        char *line = cJSON_PrintUnformatted(o);
        if (line) tp_log(TP_LOG_INFO, "http", "%s", line);
        free(line);
        cJSON_Delete(o);
    } else {
        tp_log(TP_LOG_INFO, "http", "refused status=%d%s%s: %s", e->status, e->param[0] ? " param=" : "", e->param,
               e->message);
    }
    free(json);
    return ret;
}

int tp_http_client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    int fd = ci->connect_fd;
    struct pollfd pf = {.fd = fd, .events = POLLIN, .revents = 0};
    if (poll(&pf, 1, 0) <= 0) return 0;
    if (pf.revents & (POLLERR | POLLNVAL)) return 1;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return 1;
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
        tp_api_fail(&e, 503, NULL, "loading the model");
        return tp_http_send_error(s, c, &e);
    }
    if (state == TP_SRV_FAILED) {
        tp_api_fail(&e, 503, NULL, "%s", reason);
        return tp_http_send_error(s, c, &e);
    }
    if (!tp_engine_healthy(s->engine, reason, sizeof reason)) {
        tp_api_fail(&e, 503, NULL, "%s", reason);
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
    if (tp_metrics_render(s->metrics, &g, &b) != 0) {
        tp_buf_free(&b);
        return MHD_NO;
    }
    enum MHD_Result r = tp_http_send(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len, NULL, NULL);
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
        tp_api_fail(&e, 503, NULL, "the model is not loaded (yet)");
        return tp_http_send_error(s, c, &e);
    }
    if (!s->model_id || strcmp(id, s->model_id) != 0) {
        tp_api_fail(&e, 404, "model", "model '%.200s' does not exist here; this server serves '%s'", id,
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

static int parse_body_object(const char *body, size_t len, cJSON **out, struct tp_api_error *e)
{
    if (len == 0) return tp_api_fail(e, 400, NULL, "the request body is empty; send a JSON object");
    if (!tp_srv_utf8_valid(body, len)) return tp_api_fail(e, 400, NULL, "the request body is not valid UTF-8");
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return tp_api_fail(e, 400, NULL, "the request body is not valid JSON");
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tp_api_fail(e, 400, NULL, "the request body must be a JSON object");
    }
    *out = root;
    return 0;
}

static enum MHD_Result handle_tokenize(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    struct tp_api_error e;
    cJSON *root = NULL, *resp = NULL;
    int32_t *ids = NULL;
    enum MHD_Result ret;
    if (parse_body_object(body, len, &root, &e) != 0) return tp_http_send_error(s, c, &e);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    const cJSON *add_special = cJSON_GetObjectItemCaseSensitive(root, "add_special");
    const cJSON *with_pieces = cJSON_GetObjectItemCaseSensitive(root, "with_pieces");
    if (!cJSON_IsString(content)) {
        tp_api_fail(&e, 400, "content", "'content' (the text to tokenize) is required and must be a string");
        goto fail;
    }
    if (add_special && !cJSON_IsBool(add_special)) {
        tp_api_fail(&e, 400, "add_special", "'add_special' must be a boolean");
        goto fail;
    }
    if (with_pieces && !cJSON_IsBool(with_pieces)) {
        tp_api_fail(&e, 400, "with_pieces", "'with_pieces' must be a boolean");
        goto fail;
    }
    int n = tp_server_tokenize(s, content->valuestring, cJSON_IsTrue(add_special), &ids, &e);
    if (n < 0) goto fail;
    resp = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(resp, "tokens");
    for (int i = 0; i < n; i++) {
        if (cJSON_IsTrue(with_pieces)) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "id", ids[i]);
            size_t pl = 0;
            const char *piece = tp_tokenizer_piece(s->tok, ids[i], &pl);
            struct tp_buf pb = {0};
            tp_srv_utf8_sanitize(piece, pl, &pb);
            cJSON_AddStringToObject(o, "piece", pb.data ? pb.data : "");
            tp_buf_free(&pb);
            cJSON_AddItemToArray(arr, o);
        } else {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
        }
    }
    char *json = cJSON_PrintUnformatted(resp);
    ret = json ? tp_http_send_json(s, c, 200, json) : MHD_NO;
    free(json);
    cJSON_Delete(resp);
    cJSON_Delete(root);
    free(ids);
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
    if (parse_body_object(body, len, &root, &e) != 0) return tp_http_send_error(s, c, &e);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(toks)) {
        cJSON_Delete(root);
        tp_api_fail(&e, 400, "tokens", "'tokens' (a list of token ids) is required");
        return tp_http_send_error(s, c, &e);
    }
    int n_vocab = tp_tokenizer_n_vocab(s->tok), i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, toks)
    {
        if (!cJSON_IsNumber(t) || t->valuedouble != (double)(int)t->valuedouble || t->valuedouble < 0 ||
            t->valuedouble >= n_vocab) {
            cJSON_Delete(root);
            tp_api_fail(&e, 400, "tokens", "'tokens'[%d] is not a token id in [0, %d)", i, n_vocab);
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
        if (tp_buf_append(&text, tmp, nb) != 0) oom = 1;
    }
    if (!oom) {
        size_t nb = tp_detok_flush(d, tmp, sizeof tmp);
        if (tp_buf_append(&text, tmp, nb) != 0) oom = 1;
    }
    tp_detok_free(d);
    cJSON_Delete(root);
    if (oom) {
        tp_buf_free(&text);
        tp_api_fail(&e, 500, NULL, "out of memory");
        return tp_http_send_error(s, c, &e);
    }
    cJSON *resp = cJSON_CreateObject();
    cJSON_AddStringToObject(resp, "content", text.data ? text.data : "");
    tp_buf_free(&text);
    char *json = cJSON_PrintUnformatted(resp);
    cJSON_Delete(resp);
    enum MHD_Result ret = json ? tp_http_send_json(s, c, 200, json) : MHD_NO;
    free(json);
    return ret;
}

/* ------------------------------------------------------------ routing */

enum route { R_NONE = 0, R_HEALTH, R_METRICS, R_MODELS, R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE };
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
};

struct conn_ctx {
    int route_idx;
    struct tp_buf body;
    int too_big;
    int answered;
};

static int check_auth(struct tp_server *s, struct MHD_Connection *c)
{
    if (!s->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7;
    size_t a = strlen(k), b = strlen(s->cfg.api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(k[i] ^ s->cfg.api_key[i]);
    return diff == 0;
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
        if (strncmp(url, "/v1/models/", 11) == 0 && url[11]) {
            cc->answered = 1;
            if (strcmp(method, "GET") != 0) {
                tp_api_fail(&e, 405, NULL, "method %s is not allowed on %s", method, url);
                return tp_http_send_error(s, c, &e);
            }
            if (!check_auth(s, c)) {
                tp_api_fail(&e, 401, NULL, "missing or wrong API key: send 'Authorization: Bearer <key>'");
                return tp_http_send_error(s, c, &e);
            }
            return handle_model_one(s, c, url + 11);
        }
        int path_known = 0;
        for (size_t i = 0; i < TP_ARRAY_LEN(routes); i++) {
            if (strcmp(url, routes[i].path) != 0) continue;
            path_known = 1;
            if (strcmp(method, routes[i].method) == 0) cc->route_idx = (int)i;
        }
        if (cc->route_idx < 0) {
            cc->answered = 1;
            if (path_known)
                tp_api_fail(&e, 405, NULL, "method %s is not allowed on %s", method, url);
            else
                tp_api_fail(&e, 404, NULL, "no such endpoint: %s %s (see /v1/completions, /v1/chat/completions, "
                                           "/v1/models, /health, /metrics, /tokenize, /detokenize)", method, url);
            return tp_http_send_error(s, c, &e);
        }
        if (routes[cc->route_idx].auth && !check_auth(s, c)) {
            cc->answered = 1;
            tp_api_fail(&e, 401, NULL, "missing or wrong API key: send 'Authorization: Bearer <key>'");
            return tp_http_send_error(s, c, &e);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            unsigned long long v = strtoull(cl, NULL, 10);
            if (v > s->cfg.max_body_bytes && v > 64ull * 1024 * 1024) {
                cc->answered = 1;
                tp_api_fail(&e, 413, NULL, "request body of %llu bytes exceeds the limit of %zu bytes (--max-body)",
                            v, s->cfg.max_body_bytes);
                return tp_http_send_error(s, c, &e);
            }
        }
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!cc->answered && !cc->too_big) {
            if (cc->body.len + *upload_size > s->cfg.max_body_bytes) {
                cc->too_big = 1;
                tp_buf_free(&cc->body);
            } else if (tp_buf_append(&cc->body, upload, *upload_size) != 0) {
                return MHD_NO;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->answered) return MHD_YES;
    cc->answered = 1;
    if (cc->too_big) {
        tp_api_fail(&e, 413, NULL, "request body exceeds the limit of %zu bytes (--max-body)", s->cfg.max_body_bytes);
        return tp_http_send_error(s, c, &e);
    }
    enum route r = routes[cc->route_idx].r;
    if (r == R_HEALTH) return handle_health(s, c);
    if (r == R_METRICS) return handle_metrics(s, c);
    pthread_mutex_lock(&s->state_mu);
    int state = s->state;
    char reason[512];
    snprintf(reason, sizeof reason, "%s", s->fail_reason);
    pthread_mutex_unlock(&s->state_mu);
    if (state != TP_SRV_READY && routes[cc->route_idx].needs_model) {
        if (state == TP_SRV_LOADING) tp_api_fail(&e, 503, NULL, "the model is still loading; retry shortly");
        else tp_api_fail(&e, 503, NULL, "%s", reason);
        return tp_http_send_error(s, c, &e);
    }
    const char *body = cc->body.data ? cc->body.data : "";
    switch (r) {
    case R_MODELS: return handle_models(s, c);
    case R_TOKENIZE: return handle_tokenize(s, c, body, cc->body.len);
    case R_DETOKENIZE: return handle_detokenize(s, c, body, cc->body.len);
    case R_COMPLETIONS: return tp_api_handle_completion(s, c, 0, body, cc->body.len);
    case R_CHAT: return tp_api_handle_completion(s, c, 1, body, cc->body.len);
    default: break;
    }
    tp_api_fail(&e, 500, NULL, "unrouted request");
    return tp_http_send_error(s, c, &e);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    struct conn_ctx *cc = *con_cls;
    if (!cc) return;
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

int tp_server_tokenize(struct tp_server *s, const char *text, int add_bos, int32_t **out, struct tp_api_error *e)
{
    size_t len = strlen(text);
    int cap = (int)TP_MIN(len + 16, (size_t)1 << 24);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!ids) return tp_api_fail(e, 500, NULL, "out of memory");
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
        return n == -2 ? tp_api_fail(e, 500, NULL, "out of memory")
                       : tp_api_fail(e, 400, NULL, "the text could not be tokenized (invalid UTF-8?)");
    }
    *out = ids;
    return n;
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
    struct tp_server *s = calloc(1, sizeof *s);
    if (!s) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    s->cfg = *cfg;
    s->cfg.host = dup_or_null(host);
    s->cfg.api_key = dup_or_null(cfg->api_key);
    s->cfg.chat_template = dup_or_null(cfg->chat_template);
    s->cfg.model_id = dup_or_null(cfg->model_id);
    if (s->cfg.max_queue < 1) s->cfg.max_queue = 1;
    if (s->cfg.max_connections < 4) s->cfg.max_connections = 4;
    if (s->cfg.n_batch < s->cfg.n_parallel) s->cfg.n_batch = s->cfg.n_parallel;
    pthread_mutex_init(&s->state_mu, NULL);
    pthread_mutex_init(&s->tok_mu, NULL);
    pthread_mutex_init(&s->stop_mu, NULL);
    pthread_cond_init(&s->stop_cv, NULL);
    s->state = TP_SRV_LOADING;
    s->created = (int64_t)time(NULL);
    s->metrics = tp_metrics_new();
    if (pipe(s->stop_pipe) != 0) {
        s->stop_pipe[0] = s->stop_pipe[1] = -1;
        tp_server_free(s);
        return tp_error_set(err, TP_ERR_IO, "pipe: %s", strerror(errno));
    }
    if (!s->metrics) {
        tp_server_free(s);
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    }
    s->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD, (uint16_t)cfg->port, NULL, NULL, on_request,
        s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->cfg.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.conn_timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)128 * 1024, MHD_OPTION_END);
    if (!s->daemon) {
        tp_server_free(s);
        return tp_error_set(err, TP_ERR_IO,
                            "could not listen on %s:%d (port in use? try another --port, or --port 0 for any)", host,
                            cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    *out = s;
    return TP_OK;
}

int tp_server_port(const tp_server_t *s) { return s->port; }

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
    if (!s->cfg.chat_template && s->chat == TP_CHAT_CHATML)
        s->has_default_system = tp_chat_default_system(tmpl, s->default_system, sizeof s->default_system);
    int bos = tp_tokenizer_bos(s->tok), eos = tp_tokenizer_eos(s->tok);
    size_t l = 0;
    const char *t;
    if (bos >= 0 && (t = tp_tokenizer_piece(s->tok, bos, &l)) != NULL) snprintf(s->bos_text, sizeof s->bos_text, "%.*s", (int)l, t);
    if (eos >= 0 && (t = tp_tokenizer_piece(s->tok, eos, &l)) != NULL) snprintf(s->eos_text, sizeof s->eos_text, "%.*s", (int)l, t);
    if (!s->cfg.model_id) s->model_id = dup_or_null(tp_model_name(m));
    else s->model_id = dup_or_null(s->cfg.model_id);
    s->n_ctx = tp_model_n_ctx(m);
    s->n_vocab = tp_parallel_hparams(p)->n_vocab;
    struct tp_engine_config ec = {.n_parallel = s->cfg.n_parallel, .max_queue = s->cfg.max_queue,
                                  .n_batch = s->cfg.n_batch, .prefill_chunk = s->cfg.prefill_chunk,
                                  .prefix_share_min = s->cfg.prefix_share_min};
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
    if (s->daemon) MHD_stop_daemon(s->daemon);
    tp_engine_free(s->engine);
    tp_metrics_free(s->metrics);
    if (s->stop_pipe[0] >= 0) close(s->stop_pipe[0]);
    if (s->stop_pipe[1] >= 0) close(s->stop_pipe[1]);
    free((char *)s->cfg.host);
    free((char *)s->cfg.api_key);
    free((char *)s->cfg.chat_template);
    free((char *)s->cfg.model_id);
    free(s->model_id);
    pthread_mutex_destroy(&s->state_mu);
    pthread_mutex_destroy(&s->tok_mu);
    pthread_mutex_destroy(&s->stop_mu);
    pthread_cond_destroy(&s->stop_cv);
    free(s);
}

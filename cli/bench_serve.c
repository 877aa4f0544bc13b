/*
 * cli/bench_serve.c - `tpserve bench serve`: load test a running server.
 * For each concurrency level C, C client threads released together each
 * send --rounds streaming /v1/completions requests of exactly
 * --prompt-tokens prompt tokens (token ids) and --gen-tokens generated ones
 * (ignore_eos); it reports per level the aggregate tokens/s, median TTFT and
 * TPOT, the decode-phase and steady-state rates and errors.  Tokens are
 * counted from the usage chunk (or logprobs), never from text chunks.  --api
 * chat|responses|messages|ollama sends the same tokens as text to that API and
 * counts its events and usage (docs/api.md).  What each figure means:
 * docs/serving.md ("Load test").  A benchmark, not a test.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

#ifndef MSG_NOSIGNAL /* macOS: SIGPIPE is ignored for the whole run instead */
#define MSG_NOSIGNAL 0
#endif

/* Start gate: clients wait until the main thread opens it (portable to
 * macOS, which has no pthread_barrier_t). */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_waiting, open;
};
static void gate_wait(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->n_waiting++;
    pthread_cond_broadcast(&g->cv);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}
/* Wait until n clients are at the gate, then open it. */
static void gate_open(struct gate *g, int n)
{
    pthread_mutex_lock(&g->mu);
    while (g->n_waiting < n) pthread_cond_wait(&g->cv, &g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* The API the requests speak (--api). */
enum bench_api { API_COMPLETIONS = 0, API_CHAT, API_RESPONSES, API_MESSAGES, API_OLLAMA };
static const char *const api_names[] = {"completions", "chat", "responses", "messages", "ollama"};

struct bench_target {
    char host[256];
    int port;
    const char *api_key;
    enum bench_api api;
};

struct bench_result {
    int ok;
    int n_tokens;             /* usage.completion_tokens */
    int n_counted;            /* tokens seen in the chunks (logprobs.tokens, else 1 per non-empty text) */
    int n_cached;             /* usage.prompt_tokens_details.cached_tokens (0 if absent) */
    double ttft_s, tpot_s;
    double *t_tok;            /* arrival time of each chunk carrying tokens (cap entries; caller's) */
    int *k_tok;               /* tokens that chunk carried (cap entries; caller's) */
    int n_t, cap;
};

/* A TCP connection to the target (TCP_NODELAY), or -1. */
static int connect_to(const struct bench_target *t)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char port[16];
    snprintf(port, sizeof port, "%d", t->port);
    if (getaddrinfo(t->host, port, &hints, &res) != 0) return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

/*
 * Streaming response parser: the HTTP body, de-chunked when the server uses
 * chunked transfer encoding, split into server-sent events ("data: {...}"
 * then a blank line); each choices chunk carrying tokens is recorded with its
 * arrival time, the usage chunk gives the totals.
 */
struct sse {
    struct bench_result *br;
    int chunked;              /* Transfer-Encoding: chunked */
    size_t left;              /* bytes left in the current HTTP chunk */
    int in_size;              /* reading a chunk-size line */
    char *body;               /* de-chunked body (body_cap bytes) */
    size_t body_len, body_cap, scanned;
    int done, error, usage;
    enum bench_api api;
    double t_first, t_last;
    int k_first;              /* tokens in the first chunk */
};

/* Record k tokens arriving now. */
static void sse_tokens(struct sse *e, int k, double now)
{
    if (k <= 0) return;
    if (e->t_first < 0) {
        e->t_first = now;
        e->k_first = k;
    }
    e->t_last = now;
    e->br->n_counted += k;
    if (e->br->t_tok && e->br->n_t < e->br->cap) {
        e->br->t_tok[e->br->n_t] = now;
        e->br->k_tok[e->br->n_t++] = k;
    }
}

static int nonempty(const cJSON *s) { return cJSON_IsString(s) && s->valuestring[0]; }

/* The other APIs' stream events: a text delta counts one token (the server sends one per token's released
 * text), the closing event gives the usage and ends the stream. */
static void other_event(struct sse *e, const cJSON *o, double now)
{
    const cJSON *ty = cJSON_GetObjectItem(o, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
    if (cJSON_GetObjectItem(o, "error") && (e->api == API_OLLAMA || strcmp(t, "error") == 0)) e->error = 1;
    if (e->api == API_MESSAGES) {
        if (strcmp(t, "content_block_delta") == 0)
            sse_tokens(e, nonempty(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "delta"), "text")), now);
        if (strcmp(t, "message_delta") == 0) {
            const cJSON *ot = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "output_tokens");
            if (cJSON_IsNumber(ot)) e->br->n_tokens = ot->valueint, e->usage = 1;
        }
        if (strcmp(t, "message_stop") == 0) e->done = 1;
    } else if (e->api == API_RESPONSES) {
        if (strcmp(t, "response.output_text.delta") == 0) sse_tokens(e, nonempty(cJSON_GetObjectItem(o, "delta")), now);
        if (strcmp(t, "response.completed") == 0 || strcmp(t, "response.incomplete") == 0) {
            const cJSON *u = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "response"), "usage");
            const cJSON *ot = cJSON_GetObjectItem(u, "output_tokens");
            const cJSON *cd = cJSON_GetObjectItem(cJSON_GetObjectItem(u, "input_tokens_details"), "cached_tokens");
            if (cJSON_IsNumber(ot)) e->br->n_tokens = ot->valueint, e->usage = 1;
            if (cJSON_IsNumber(cd)) e->br->n_cached = cd->valueint;
            e->done = 1;
        }
        if (strcmp(t, "error") == 0 || strcmp(t, "response.failed") == 0) e->error = 1;
    } else { /* ollama: one JSON object per line */
        sse_tokens(e, nonempty(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "message"), "content")), now);
        if (cJSON_IsTrue(cJSON_GetObjectItem(o, "done"))) {
            const cJSON *ec = cJSON_GetObjectItem(o, "eval_count");
            if (cJSON_IsNumber(ec)) e->br->n_tokens = ec->valueint, e->usage = 1;
            e->done = 1;
        }
    }
}

static void sse_event(struct sse *e, const char *json, double now)
{
    if (strcmp(json, "[DONE]") == 0) {
        e->done = 1;
        return;
    }
    cJSON *o = cJSON_Parse(json);
    if (!o) return;
    if (e->api != API_COMPLETIONS && e->api != API_CHAT) {
        other_event(e, o, now);
        cJSON_Delete(o);
        return;
    }
    if (cJSON_GetObjectItem(o, "error")) e->error = 1;
    const cJSON *u = cJSON_GetObjectItem(o, "usage");
    if (cJSON_IsObject(u)) {
        const cJSON *ct = cJSON_GetObjectItem(u, "completion_tokens");
        const cJSON *d = cJSON_GetObjectItem(u, "prompt_tokens_details");
        const cJSON *cached = d ? cJSON_GetObjectItem(d, "cached_tokens") : NULL;
        if (cJSON_IsNumber(ct)) {
            e->br->n_tokens = ct->valueint;
            e->usage = 1;
        }
        if (cJSON_IsNumber(cached)) e->br->n_cached = cached->valueint;
    }
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    if (ch) {
        const cJSON *lp = cJSON_GetObjectItem(ch, "logprobs");
        const cJSON *toks = cJSON_IsObject(lp) ? cJSON_GetObjectItem(lp, "tokens") : NULL;
        const cJSON *lpc = cJSON_IsObject(lp) ? cJSON_GetObjectItem(lp, "content") : NULL;
        const cJSON *text = cJSON_GetObjectItem(ch, "text");
        if (!text) text = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "content");
        int k = cJSON_IsArray(toks) ? cJSON_GetArraySize(toks)
                : cJSON_IsArray(lpc) ? cJSON_GetArraySize(lpc)
                : nonempty(text)     ? 1
                                     : 0;
        sse_tokens(e, k, now);
    }
    cJSON_Delete(o);
}

/* Append body bytes; parse every complete event.  TP_OK or TP_ERR_NOMEM. */
static enum tp_status sse_body(struct sse *e, const char *p, size_t n, double now)
{
    if (e->body_len + n + 1 > e->body_cap) {
        size_t cap = TP_MAX(e->body_cap * 2, e->body_len + n + 4096);
        char *nb = realloc(e->body, cap);
        if (!nb) return TP_ERR_NOMEM;
        e->body = nb;
        e->body_cap = cap;
    }
    memcpy(e->body + e->body_len, p, n);
    e->body_len += n;
    e->body[e->body_len] = '\0';
    char *end;
    if (e->api == API_OLLAMA) { /* NDJSON: one object per line */
        while ((end = strchr(e->body + e->scanned, '\n')) != NULL) {
            *end = '\0';
            if (e->body[e->scanned]) sse_event(e, e->body + e->scanned, now);
            e->scanned = (size_t)(end - e->body) + 1;
        }
        return TP_OK;
    }
    while ((end = strstr(e->body + e->scanned, "\n\n")) != NULL) {
        *end = '\0';
        for (char *line = e->body + e->scanned; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            if (strncmp(line, "data: ", 6) == 0) sse_event(e, line + 6, now);
            line = nl ? nl + 1 : NULL;
        }
        e->scanned = (size_t)(end - e->body) + 2;
    }
    return TP_OK;
}

/* Feed raw body bytes (after the headers), undoing chunked encoding.  TP_OK or TP_ERR_NOMEM. */
static enum tp_status sse_feed(struct sse *e, const char *p, size_t n, double now, char *line, size_t *line_len)
{
    if (!e->chunked) return sse_body(e, p, n, now);
    while (n > 0) {
        if (e->left > 0) {
            size_t k = TP_MIN(e->left, n);
            if (sse_body(e, p, k, now) != TP_OK) return TP_ERR_NOMEM;
            e->left -= k;
            p += k;
            n -= k;
            if (e->left == 0) e->in_size = 2; /* the CRLF after the data, then a size line */
            continue;
        }
        char c = *p++;
        n--;
        if (c != '\n') {
            if (*line_len < 31) line[(*line_len)++] = c;
            continue;
        }
        line[*line_len] = '\0';
        *line_len = 0;
        if (e->in_size == 2) { /* the empty line ending a chunk's data */
            e->in_size = 1;
            continue;
        }
        e->left = strtoul(line, NULL, 16); /* 0: the last chunk; the connection closes next */
    }
    return TP_OK;
}

/* One request; resp_out (malloc'd, may be NULL) gets the raw response.  With
 * br the response is parsed as it arrives (token counts and arrival times).
 * TP_OK on a complete 200 answer; TP_ERR_IO (cannot connect or send),
 * TP_ERR_TIMEOUT, TP_ERR_NOMEM, TP_ERR_PROTOCOL (not a 200 answer). */
static enum tp_status request(const struct bench_target *t, const char *path, const char *body, double timeout_s,
                              char **resp_out, struct bench_result *br)
{
    int fd = connect_to(t);
    if (fd < 0) return TP_ERR_IO;
    char head[1024];
    char auth[600] = "";
    if (t->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", t->api_key);
    size_t blen = strlen(body);
    int hl = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Type: application/json\r\n%s"
                      "Content-Length: %zu\r\n\r\n",
                      path, t->host, auth, blen);
    double t0 = tp_now_s();
    if (send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl || send(fd, body, blen, MSG_NOSIGNAL) != (ssize_t)blen) {
        close(fd);
        return TP_ERR_IO;
    }
    size_t cap = 1 << 16, n = 0, hdr_end = 0;
    char *buf = malloc(cap);
    struct sse e;
    memset(&e, 0, sizeof e);
    e.br = br;
    e.api = t->api;
    e.in_size = 1;
    e.t_first = e.t_last = -1;
    char line[32];
    size_t line_len = 0;
    enum tp_status rc = TP_ERR_TIMEOUT;
    int oom = !buf;
    while (!oom) {
        if (tp_now_s() - t0 > timeout_s) break;
        struct pollfd pf = {.fd = fd, .events = POLLIN, .revents = 0};
        if (poll(&pf, 1, 200) <= 0) continue;
        if (n + 8192 > cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            rc = TP_OK;
            break;
        }
        size_t from = n;
        n += (size_t)k;
        buf[n] = '\0';
        if (!br) continue;
        double now = tp_now_s();
        if (!hdr_end) {
            char *he = strstr(buf, "\r\n\r\n");
            if (!he) continue;
            hdr_end = (size_t)(he - buf) + 4;
            for (char *h = buf; h < he; h++)
                if (strncasecmp(h, "\nTransfer-Encoding: chunked", 27) == 0) e.chunked = 1;
            from = hdr_end;
        }
        if (sse_feed(&e, buf + from, n - from, now, line, &line_len) != TP_OK) oom = 1;
    }
    close(fd);
    if (buf) buf[n] = '\0';
    int status = 0;
    if (oom) {
        rc = TP_ERR_NOMEM;
    } else if (rc == TP_OK && sscanf(buf, "HTTP/1.%*d %d", &status) == 1 && status == 200) {
        if (br) {
            br->ttft_s = e.t_first >= 0 ? e.t_first - t0 : -1;
            /* the tokens after the first chunk arrived over [t_first, t_last] */
            const double w = br->n_counted > 0 ? (double)br->n_tokens / br->n_counted : 1.0;
            const double after = br->n_tokens - e.k_first * w;
            br->tpot_s = (after > 0.5 && e.t_last > e.t_first) ? (e.t_last - e.t_first) / after : -1;
            br->ok = e.usage && e.done && !e.error;
        }
    } else if (rc == TP_OK) {
        rc = TP_ERR_PROTOCOL;
    }
    free(e.body);
    if (resp_out) *resp_out = buf;
    else free(buf);
    return rc;
}

struct level_ctx {
    const struct bench_target *t;
    struct gate *gate;
    const int32_t *ids;
    int n_ids;
    int prompt_tokens, gen_tokens, rounds, idx, level;
    int shared_prefix;        /* first tokens identical in every request */
    int logprobs;             /* ask for logprobs: every chunk's own token count */
    struct bench_result *res; /* (rounds) */
    double t_end;
};

static const char *api_path(enum bench_api a)
{
    static const char *const paths[] = {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
                                        "/api/chat"};
    return paths[a];
}

static void dechunk(char *b);

/* POST /detokenize {"tokens": [...]} (ids_body: {"prompt": [...]}); the text (malloc'd) or NULL. */
static char *detok_text(const struct bench_target *t, const char *ids_body)
{
    cJSON *in = cJSON_Parse(ids_body), *req = cJSON_CreateObject();
    cJSON_AddItemToObject(req, "tokens", cJSON_DetachItemFromObject(in, "prompt"));
    cJSON_Delete(in);
    char *body = cJSON_PrintUnformatted(req), *resp = NULL, *text = NULL;
    cJSON_Delete(req);
    if (body && request(t, "/detokenize", body, 30, &resp, NULL) == TP_OK && resp) {
        char *jb = strstr(resp, "\r\n\r\n");
        for (const char *h = resp; jb && h < jb; h++)
            if (strncasecmp(h, "\nTransfer-Encoding: chunked", 27) == 0) {
                dechunk(jb + 4);
                break;
            }
        cJSON *j = jb ? cJSON_Parse(jb + 4) : NULL;
        const cJSON *ct = cJSON_GetObjectItem(j, "content");
        if (cJSON_IsString(ct)) text = strdup(ct->valuestring);
        cJSON_Delete(j);
    }
    free(body);
    free(resp);
    return text;
}

/* A streaming request of api a for text, greedy, gen tokens at most (malloc'd JSON). */
static char *api_body(enum bench_api a, const char *text, int gen)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", "bench");
    if (a == API_RESPONSES) {
        cJSON_AddStringToObject(o, "input", text);
        cJSON_AddNumberToObject(o, "max_output_tokens", gen);
    } else {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "messages"), m);
    }
    if (a == API_OLLAMA) {
        cJSON *op = cJSON_AddObjectToObject(o, "options");
        cJSON_AddNumberToObject(op, "temperature", 0);
        cJSON_AddNumberToObject(op, "num_predict", gen);
    } else {
        cJSON_AddNumberToObject(o, "temperature", 0);
        cJSON_AddTrueToObject(o, "stream");
    }
    if (a == API_CHAT) {
        cJSON_AddNumberToObject(o, "max_tokens", gen);
        cJSON_AddTrueToObject(o, "ignore_eos");
        cJSON_AddTrueToObject(cJSON_AddObjectToObject(o, "stream_options"), "include_usage");
    }
    if (a == API_MESSAGES) cJSON_AddNumberToObject(o, "max_tokens", gen);
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return j;
}

static void *client_main(void *arg)
{
    struct level_ctx *c = arg;
    /* each request its own prompt (rotations of the id pool, first token
     * after the shared prefix distinct), so neither batching nor the server's
     * prompt cache shares work beyond --shared-prefix tokens */
    size_t cap = (size_t)c->prompt_tokens * 12 + 256;
    char **bodies = calloc((size_t)c->rounds, sizeof *bodies);
    for (int r = 0; r < c->rounds; r++) {
        char *d = malloc(cap);
        size_t n = (size_t)snprintf(d, cap, "{\"prompt\":[");
        /* the first two tokens spell a number unique to this request (base
         * n_ids), so two prompts share at most one leading token */
        static unsigned counter;
        unsigned u = __atomic_fetch_add(&counter, 1u, __ATOMIC_RELAXED);
        int shift = c->idx * 7 + r * 131 + c->level * 977 + 1;
        const int sp = c->shared_prefix;
        for (int i = 0; i < c->prompt_tokens; i++) {
            int id = i < sp        ? c->ids[i % c->n_ids]
                   : i == sp       ? c->ids[u % (unsigned)c->n_ids]
                   : i == sp + 1   ? c->ids[(u / (unsigned)c->n_ids) % (unsigned)c->n_ids]
                                   : c->ids[(i + shift) % c->n_ids];
            n += (size_t)snprintf(d + n, cap - n, "%s%d", i ? "," : "", id);
        }
        if (c->t->api != API_COMPLETIONS) {
            /* the chat-shaped APIs take text: the same tokens, detokenized (the chat template adds a few) */
            snprintf(d + n, cap - n, "]}");
            char *text = detok_text(c->t, d);
            free(d);
            bodies[r] = api_body(c->t->api, text ? text : "", c->gen_tokens);
            free(text);
            continue;
        }
        snprintf(d + n, cap - n,
                 "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,%s"
                 "\"stream_options\":{\"include_usage\":true}}",
                 c->gen_tokens, c->logprobs ? "\"logprobs\":0," : "");
        bodies[r] = d;
    }
    gate_wait(c->gate);
    for (int r = 0; r < c->rounds; r++) {
        double *tt = c->res[r].t_tok;
        int *kt = c->res[r].k_tok;
        int tcap = c->res[r].cap;
        memset(&c->res[r], 0, sizeof c->res[r]);
        c->res[r].t_tok = tt;
        c->res[r].k_tok = kt;
        c->res[r].cap = tcap;
        if (!bodies[r] || request(c->t, api_path(c->t->api), bodies[r], 600, NULL, &c->res[r]) != TP_OK)
            c->res[r].ok = 0;
    }
    c->t_end = tp_now_s();
    for (int r = 0; r < c->rounds; r++) free(bodies[r]);
    free(bodies);
    return NULL;
}

/* Undo chunked transfer encoding in place in the NUL-terminated body b
 * (chunk-size lines and the CRLF after each chunk's data removed). */
static void dechunk(char *b)
{
    char *out = b, *p = b;
    for (;;) {
        char *end = NULL;
        unsigned long n = strtoul(p, &end, 16);
        char *data = end ? strstr(end, "\r\n") : NULL;
        if (!data || n == 0) break;
        data += 2;
        size_t have = strlen(data);
        if (n > have) n = have;
        memmove(out, data, n);
        out += n;
        p = data + n;
        if (p[0] == '\r' && p[1] == '\n') p += 2;
    }
    *out = '\0';
}

/* Tokens a chunk of b stands for: its own count, scaled by usage / counted
 * when the chunks do not add up to the usage (text held back, no logprobs). */
static double chunk_tokens(const struct bench_result *b, int i)
{
    double w = b->n_counted > 0 && b->n_counted != b->n_tokens ? (double)b->n_tokens / b->n_counted : 1.0;
    return b->k_tok[i] * w;
}

/* Steady-state decode rate: for each round, the window in which every
 * client's request of that round is past its first token and none has
 * finished ([latest first arrival, earliest last arrival]; no prefill of
 * that round runs then, and no client has started its next request), and the
 * tokens all of them received in it (chunk_tokens); total tokens / total
 * window time over the rounds.  0 when no round has a window holding at
 * least two tokens per client (streams too staggered to ever all decode
 * together). */
static double steady_rate(const struct bench_result *res, int c, int rounds)
{
    double win = 0, n = 0;
    for (int r = 0; r < rounds; r++) {
        double lo = -1, hi = 1e300;
        int ok = 1;
        for (int i = 0; i < c; i++) {
            const struct bench_result *b = &res[(size_t)i * (size_t)rounds + (size_t)r];
            if (!b->ok || b->n_t < 2) {
                ok = 0;
                break;
            }
            if (b->t_tok[0] > lo) lo = b->t_tok[0];
            if (b->t_tok[b->n_t - 1] < hi) hi = b->t_tok[b->n_t - 1];
        }
        if (!ok || hi <= lo) continue;
        double k = 0;
        for (int i = 0; i < c; i++) {
            const struct bench_result *b = &res[(size_t)i * (size_t)rounds + (size_t)r];
            for (int t = 0; t < b->n_t; t++)
                if (b->t_tok[t] > lo && b->t_tok[t] <= hi) k += chunk_tokens(b, t);
        }
        if (k < 2.0 * c) continue;
        win += hi - lo;
        n += k;
    }
    return win > 0 ? n / win : 0;
}

/* ------------------------------------------------------------------ parse */

struct bs_opts {
    const char *url, *api_key, *api;
    int prompt_tokens, gen_tokens, rounds, json, shared_prefix, logprobs;
    int repeat;             /* --repeat: the APIs' runs of each level, interleaved */
    struct bench_target t;
    int conc[64], n_levels; /* --concurrency */
    enum bench_api apis[5]; /* --api, in the order given */
    int n_apis;
};

/* Parse argv into o.  Returns what tp_cli_parse does: 0 to go on, 1 after --help, 2 after printing a
 * usage error. */
static int bs_parse(int argc, char **argv, struct bs_opts *o)
{
    const char *levels = "1,2,4,8";
    memset(o, 0, sizeof *o);
    o->url = "http://127.0.0.1:8080";
    o->prompt_tokens = 128, o->gen_tokens = 64, o->rounds = 2, o->repeat = 1;
    o->api = "completions";
    const struct tp_opt opts[] = {
        {"url", 0, TP_OPT_STRING, &o->url, "URL", "server base URL (default http://127.0.0.1:8080)", 0, 0},
        {"concurrency", 0, TP_OPT_LIST, &levels, "N,N..", "concurrent clients per level (default 1,2,4,8)", 0, 0},
        {"prompt-tokens", 0, TP_OPT_INT, &o->prompt_tokens, "N", "prompt length in tokens (default 128)", 1, 1 << 20},
        {"gen-tokens", 0, TP_OPT_INT, &o->gen_tokens, "N", "tokens generated per request (default 64)", 1, 1 << 20},
        {"shared-prefix", 0, TP_OPT_INT, &o->shared_prefix, "N",
         "the first N prompt tokens are the same in every request (default 0; N < --prompt-tokens)", 0, 1 << 20},
        {"rounds", 0, TP_OPT_INT, &o->rounds, "N", "requests per client per level (default 2)", 1, 1000},
        {"api-key", 0, TP_OPT_STRING, &o->api_key, "KEY", "API key if the server wants one", 0, 0},
        {"logprobs", 0, TP_OPT_FLAG, &o->logprobs, NULL,
         "ask for logprobs so each chunk's token count is exact (the server then leaves its greedy fast path)", 0, 0},
        {"json", 0, TP_OPT_FLAG, &o->json, NULL, "one JSON object per level instead of the table", 0, 0},
        {"api", 0, TP_OPT_STRING, &o->api, "API[,API..]",
         "completions (default: token-id prompts, ignore_eos), chat, responses, messages or ollama (the prompt's "
         "tokens as text in one user message; only chat can ignore EOS); several: each level runs each API in "
         "turn, and a summary gives each API's median aggregate tokens/s against the first's", 0, 0},
        {"repeat", 0, TP_OPT_INT, &o->repeat, "N",
         "run each level's APIs N times, interleaved, each time starting one API further on (default 1), so "
         "that load from elsewhere lands on all", 1, 100},
        {NULL, 0, 0, NULL, NULL, NULL, 0, 0},
    };
    int pr = tp_cli_parse("bench serve", "Usage: tpserve bench serve --url URL [options]", opts, argc, argv, NULL, 0,
                          NULL, NULL, NULL);
    if (pr) return pr;
    if (o->shared_prefix >= o->prompt_tokens) {
        fprintf(stderr, "tpserve bench serve: --shared-prefix %d: must be below --prompt-tokens %d\n",
                o->shared_prefix, o->prompt_tokens);
        return 2;
    }
    o->t.api_key = o->api_key;
    for (const char *p = o->api; *p;) {
        size_t l = strcspn(p, ",");
        int found = -1;
        for (int i = 0; i < 5; i++)
            if (strlen(api_names[i]) == l && strncmp(p, api_names[i], l) == 0) found = i;
        if (found < 0 || o->n_apis == 5) {
            fprintf(stderr, "tpserve bench serve: --api %s: want completions, chat, responses, messages or ollama "
                    "(a comma-separated list of at most 5)\n", o->api);
            return 2;
        }
        o->apis[o->n_apis++] = (enum bench_api)found;
        p += l + (p[l] == ',');
    }
    if (o->n_apis == 0) {
        fprintf(stderr, "tpserve bench serve: --api is empty\n");
        return 2;
    }
    o->t.api = o->apis[0];
    if (o->logprobs && (o->n_apis > 1 || o->t.api != API_COMPLETIONS)) {
        fprintf(stderr, "tpserve bench serve: --logprobs works with --api completions only\n");
        return 2;
    }
    const char *h = strncmp(o->url, "http://", 7) == 0 ? o->url + 7 : o->url;
    const char *colon = strchr(h, ':'), *slash = strchr(h, '/');
    size_t hl = colon ? (size_t)(colon - h) : slash ? (size_t)(slash - h) : strlen(h);
    if (hl == 0 || hl >= sizeof o->t.host) {
        fprintf(stderr, "tpserve bench serve: --url %s: want http://HOST:PORT\n", o->url);
        return 2;
    }
    memcpy(o->t.host, h, hl);
    o->t.port = colon ? atoi(colon + 1) : 80;
    for (const char *p = levels; *p && o->n_levels < 64;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1024) {
            fprintf(stderr, "tpserve bench serve: --concurrency %s: want a list of integers 1..1024\n", levels);
            return 2;
        }
        o->conc[o->n_levels++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "tpserve bench serve: --concurrency %s: want a list like 1,2,4,8\n", levels);
            return 2;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ run */

/* A pool of real token ids from the server's POST /tokenize: *ids (malloc'd), *n_ids >= 8. */
static enum tp_status bs_token_pool(const struct bs_opts *o, int32_t **ids, int *n_ids, struct tp_error *err)
{
    char *resp = NULL;
    const char *text = "{\"content\":\"Once upon a time there was a little girl who lived in a village near the forest. "
                       "Whenever she went out, the little girl wore a red riding cloak, so everyone in the village "
                       "called her Little Red Riding Hood.\"}";
    if (request(&o->t, "/tokenize", text, 30, &resp, NULL) != TP_OK) {
        free(resp);
        return tp_error_set(err, TP_ERR_IO, "cannot reach %s (POST /tokenize failed); is `tpserve serve` running?",
                            o->url);
    }
    char *jb = strstr(resp, "\r\n\r\n");
    if (jb) {
        int chunked = 0;
        for (const char *hdr_line = strstr(resp, "\r\n"); hdr_line && hdr_line < jb; hdr_line = strstr(hdr_line + 2, "\r\n"))
            if (strncasecmp(hdr_line + 2, "Transfer-Encoding: chunked", 26) == 0) chunked = 1;
        if (chunked) dechunk(jb + 4);
    }
    cJSON *j = jb ? cJSON_Parse(jb + 4) : NULL;
    const cJSON *toks = cJSON_GetObjectItem(j, "tokens");
    const int n = cJSON_GetArraySize(toks);
    *ids = calloc((size_t)(n > 0 ? n : 1), sizeof(int32_t));
    for (int i = 0; *ids && i < n; i++) (*ids)[i] = (int32_t)cJSON_GetArrayItem(toks, i)->valueint;
    cJSON_Delete(j);
    free(resp);
    *n_ids = n;
    if (!*ids) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    if (n < 8) return tp_error_set(err, TP_ERR_FORMAT, "/tokenize returned %d tokens; cannot build prompts", n);
    return TP_OK;
}

/* One concurrency level's clients and results, released in bs_level_free. */
struct bs_level {
    int c;                     /* clients */
    struct level_ctx *ctx;     /* (c) */
    pthread_t *th;             /* (c) */
    struct bench_result *res;  /* (c, rounds) */
    double *t_tok;             /* (c, rounds, gen_tokens + 8): token arrival times, lent to res */
    int *k_tok;                /* the same shape: tokens per arrival */
    double t0, t_end;          /* the level's start and last arrival */
};

static void bs_level_free(struct bs_level *L)
{
    free(L->ctx);
    free(L->th);
    free(L->res);
    free(L->t_tok);
    free(L->k_tok);
    memset(L, 0, sizeof *L);
}

/* Level li: c clients released together, each --rounds requests; results in L. */
static enum tp_status bs_run_level(const struct bs_opts *o, int li, const int32_t *ids, int n_ids, struct bs_level *L,
                                   struct tp_error *err)
{
    const int c = o->conc[li], total = c * o->rounds;
    const size_t per = (size_t)o->gen_tokens + 8;
    memset(L, 0, sizeof *L);
    L->c = c;
    L->ctx = calloc((size_t)c, sizeof *L->ctx);
    L->th = calloc((size_t)c, sizeof *L->th);
    L->res = calloc((size_t)total, sizeof *L->res);
    L->t_tok = calloc((size_t)total * per, sizeof(double));
    L->k_tok = calloc((size_t)total * per, sizeof(int));
    if (!L->ctx || !L->th || !L->res || !L->t_tok || !L->k_tok)
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory for %d clients", c);
    for (int i = 0; i < total; i++) {
        L->res[i].t_tok = L->t_tok + (size_t)i * per;
        L->res[i].k_tok = L->k_tok + (size_t)i * per;
        L->res[i].cap = (int)per;
    }
    struct gate gate;
    pthread_mutex_init(&gate.mu, NULL);
    pthread_cond_init(&gate.cv, NULL);
    gate.n_waiting = gate.open = 0;
    for (int i = 0; i < c; i++) {
        L->ctx[i] = (struct level_ctx){.t = &o->t, .gate = &gate, .ids = ids, .n_ids = n_ids,
                                       .prompt_tokens = o->prompt_tokens, .gen_tokens = o->gen_tokens,
                                       .rounds = o->rounds, .shared_prefix = o->shared_prefix,
                                       .logprobs = o->logprobs, .idx = i, .level = li,
                                       .res = L->res + (size_t)i * (size_t)o->rounds};
        pthread_create(&L->th[i], NULL, client_main, &L->ctx[i]);
    }
    gate_open(&gate, c);
    L->t0 = L->t_end = tp_now_s();
    for (int i = 0; i < c; i++) {
        pthread_join(L->th[i], NULL);
        if (L->ctx[i].t_end > L->t_end) L->t_end = L->ctx[i].t_end;
    }
    pthread_mutex_destroy(&gate.mu);
    pthread_cond_destroy(&gate.cv);
    return TP_OK;
}

/* ------------------------------------------------------------------ report */

/* The figures of one level (docs/serving.md, "Load test"). */
struct bs_figures {
    int errors, n_ok, mismatch;
    double agg, ttft_med, tpot_med, dec, steady, cached_req;
};

static enum tp_status bs_summarize(const struct bs_opts *o, const struct bs_level *L, struct bs_figures *f,
                                   struct tp_error *err)
{
    const int total = L->c * o->rounds;
    long gen = 0, cached = 0;
    double *ttft = calloc((size_t)total, sizeof(double)), *tpot = calloc((size_t)total, sizeof(double));
    int nt = 0, np = 0;
    memset(f, 0, sizeof *f);
    if (!ttft || !tpot) {
        free(ttft);
        free(tpot);
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < total; i++) {
        const struct bench_result *r = &L->res[i];
        if (!r->ok || r->n_tokens != o->gen_tokens) {
            f->errors++;
            continue;
        }
        f->n_ok++;
        f->mismatch += r->n_counted != r->n_tokens;
        gen += r->n_tokens;
        cached += r->n_cached;
        if (r->ttft_s >= 0) ttft[nt++] = r->ttft_s * 1e3;
        if (r->tpot_s >= 0) tpot[np++] = r->tpot_s * 1e3;
    }
    f->agg = L->t_end > L->t0 ? (double)gen / (L->t_end - L->t0) : 0;
    f->steady = steady_rate(L->res, L->c, o->rounds);
    f->ttft_med = tp_median(ttft, nt);
    f->tpot_med = tp_median(tpot, np);
    f->dec = f->tpot_med > 0 ? 1000.0 * L->c / f->tpot_med : 0;
    f->cached_req = f->n_ok > 0 ? (double)cached / f->n_ok : 0;
    free(ttft);
    free(tpot);
    return TP_OK;
}

static void bs_report_header(const struct bs_opts *o)
{
    printf("tpserve bench serve: %s (%s), prompt %d tokens (shared prefix %d), %d generated per request, %d rounds "
           "per client\n\n"
           "%11s %12s %7s %14s %14s %16s %7s %13s %7s %11s %7s%s\n",
           o->url, o->n_apis > 1 ? o->api : api_path(o->t.api), o->prompt_tokens, o->shared_prefix, o->gen_tokens,
           o->rounds, "concurrency", "agg tok/s", "x1", "TTFT med ms", "TPOT med ms", "decode agg t/s", "x1",
           "steady t/s", "x1", "cached/req", "errors", o->n_apis > 1 || o->repeat > 1 ? "  api" : "");
}

/* One level's line; base: the first level's figures (the ratios' denominators). */
static void bs_report_level(const struct bs_opts *o, int c, const struct bs_figures *f, const struct bs_figures *base)
{
    const double x_agg = base->agg > 0 ? f->agg / base->agg : 0, x_dec = base->dec > 0 ? f->dec / base->dec : 0;
    const double x_steady = base->steady > 0 && f->steady > 0 ? f->steady / base->steady : 0;
    if (o->json)
        printf("{\"api\":\"%s\",\"concurrency\":%d,\"agg_tps\":%.2f,\"ttft_ms_median\":%.2f,\"tpot_ms_median\":%.3f,\"errors\":%d,"
               "\"decode_agg_tps\":%.2f,\"agg_ratio\":%.3f,\"decode_agg_ratio\":%.3f,"
               "\"requests\":%d,\"prompt_tokens\":%d,\"shared_prefix\":%d,\"cached_tokens_mean\":%.1f,"
               "\"gen_tokens\":%d,\"steady_agg_tps\":%.2f,\"steady_ratio\":%.3f,\"tokens_counted_from\":\"%s\","
               "\"requests_chunks_not_tokens\":%d}\n",
               api_names[o->t.api], c, f->agg, f->ttft_med, f->tpot_med, f->errors, f->dec, x_agg, x_dec, c * o->rounds, o->prompt_tokens,
               o->shared_prefix, f->cached_req, o->gen_tokens, f->steady, x_steady,
               o->logprobs ? "logprobs" : "usage", f->mismatch);
    else
        printf("%11d %12.2f %6.2fx %14.2f %14.3f %16.2f %6.2fx %13.2f %6.2fx %11.1f %7d%s%s%s\n", c, f->agg, x_agg,
               f->ttft_med, f->tpot_med, f->dec, x_dec, f->steady, x_steady, f->cached_req, f->errors,
               o->n_apis > 1 || o->repeat > 1 ? "  " : "", o->n_apis > 1 || o->repeat > 1 ? api_names[o->t.api] : "",
               f->mismatch ? "  (chunks != tokens in some requests: weighted by usage; --logprobs for exact)" : "");
    fflush(stdout);
}

/* ------------------------------------------------------------------ command */

int tp_bench_serve(int argc, char **argv)
{
    struct bs_opts o;
    int rc = bs_parse(argc, argv, &o);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    signal(SIGPIPE, SIG_IGN);
    struct tp_error err = {0};
    int32_t *ids = NULL;
    int n_ids = 0;
    if (bs_token_pool(&o, &ids, &n_ids, &err) != TP_OK) {
        free(ids);
        return tp_cli_fail("bench serve", "%s", err.msg);
    }
    if (!o.json) bs_report_header(&o);
    struct bs_figures base = {0};
    int exit_code = 0, have_base = 0;
    /* (level, api, repeat) aggregate tokens/s, for the summary of several APIs */
    double *agg = calloc((size_t)o.n_levels * 5 * (size_t)o.repeat, sizeof(double));
    if (!agg) {
        free(ids);
        return tp_cli_fail("bench serve", "out of memory");
    }
    for (int li = 0; li < o.n_levels && !exit_code; li++) {
        for (int rep = 0; rep < o.repeat && !exit_code; rep++) {
            /* each repeat starts one API further on, so that no API always runs first or after the same one */
            for (int k = 0; k < o.n_apis; k++) {
                const int ai = (k + rep) % o.n_apis;
                struct bs_level L;
                struct bs_figures f;
                o.t.api = o.apis[ai];
                if (bs_run_level(&o, li, ids, n_ids, &L, &err) != TP_OK || bs_summarize(&o, &L, &f, &err) != TP_OK) {
                    bs_level_free(&L);
                    exit_code = tp_cli_fail("bench serve", "%s", err.msg);
                    break;
                }
                if (!have_base) base = f, have_base = 1;
                bs_report_level(&o, o.conc[li], &f, &base);
                agg[((size_t)li * 5 + (size_t)ai) * (size_t)o.repeat + (size_t)rep] = f.agg;
                bs_level_free(&L);
            }
        }
    }
    if (!exit_code && (o.n_apis > 1 || o.repeat > 1) && !o.json) {
        /* per API: the median aggregate tokens/s, and the median over the repeats of its ratio to the first
         * API's figure of the same repeat (paired: load from elsewhere drifts between repeats) */
        printf("\nmedian aggregate tokens/s over %d run%s, and the median of each run's ratio to %s's:\n", o.repeat,
               o.repeat > 1 ? "s" : "", api_names[o.apis[0]]);
        double ratio[100], val[100]; /* --repeat <= 100; tp_median sorts its argument: copies */
        for (int li = 0; li < o.n_levels; li++) {
            const double *first = agg + (size_t)li * 5 * (size_t)o.repeat;
            printf("%11d", o.conc[li]);
            for (int ai = 0; ai < o.n_apis; ai++) {
                const double *v = agg + ((size_t)li * 5 + (size_t)ai) * (size_t)o.repeat;
                for (int rep = 0; rep < o.repeat; rep++) {
                    ratio[rep] = first[rep] > 0 ? v[rep] / first[rep] : 0;
                    val[rep] = v[rep];
                }
                printf("  %s %.2f (%.2fx)", api_names[o.apis[ai]], tp_median(val, o.repeat),
                       tp_median(ratio, o.repeat));
            }
            printf("\n");
        }
    }
    free(agg);
    free(ids);
    return exit_code;
}

/*
 * server/api_embeddings.c - POST /v1/embeddings (OpenAI) and POST /api/embed
 * (Ollama).
 *
 * Each input (a string, a list of strings, a list of token ids or a list of
 * such lists) becomes one engine request that only reads its prompt: the
 * scheduler pools the final hidden states (after the output norm) of its
 * tokens, the mean, the last token or the first (cls) as the model's GGUF
 * pooling_type or --pooling says, and L2-normalises the vector
 * (scheduler.c: embed_rows).  All inputs of a call are queued at once, so
 * continuous batching reads them together, at any number of ranks.
 * Prompts are tokenized as the model asks (BOS, and EOS when the GGUF sets
 * tokenizer.ggml.add_eos_token, as Qwen3-Embedding does).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "api_run.h"

#define MAX_INPUTS 2048 /* inputs per call (OpenAI's limit) */

static const cJSON *field(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static char *ollama_error_json(const struct tp_api_error *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", e->message);
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return j;
}

static char *openai_error_json(const struct tp_api_error *e) { return tp_api_error_json(e); }

static enum MHD_Result send_error(struct tp_server *s, struct MHD_Connection *c, int ollama, const struct tp_api_error *e)
{
    static const struct tp_run_ops oa = {.path = "/v1/embeddings", .error_json = openai_error_json};
    static const struct tp_run_ops ol = {.path = "/api/embed", .error_json = ollama_error_json};
    return tp_run_send_error(s, c, ollama ? &ol : &oa, e);
}

/* The pooling this server applies: --pooling, else the model's, else mean.  0 with e filled when the model
 * cannot give embeddings. */
int tp_api_pooling(struct tp_server *s, struct tp_api_error *e)
{
    if (s->cfg.pooling >= TP_POOL_MEAN && s->cfg.pooling < TP_POOL_COUNT) return s->cfg.pooling;
    const struct tp_hparams *hp = tp_parallel_hparams(s->par);
    switch (hp->pooling_type) {
    case 2: return TP_POOL_CLS;
    case 3: return TP_POOL_LAST;
    case 4:
        tp_api_err(e, TP_ERR_INVALID_ARG, "model", "this model is a reranker (GGUF pooling_type rank): it scores pairs and gives no "
                                     "embeddings; restart with --pooling mean|last|cls to embed with it anyway");
        return 0;
    default: return TP_POOL_MEAN; /* 1 mean, 0 none (per-token: not served), -1 not said */
    }
}

/* One input as token ids: *ids (malloc'd) and their count *n_out.  TP_OK or an error in e. */
static enum tp_status input_tokens(struct tp_server *s, const cJSON *in, const char *param, int32_t **ids, int *n_out,
                                   struct tp_api_error *e)
{
    *ids = NULL;
    int n = 0;
    if (cJSON_IsString(in)) {
        char *b = NULL;
        size_t bl = 0;
        if (tp_json_bytes(in, &b, &bl) != 0) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        if (bl == 0) {
            free(b);
            return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' is an empty string; an input needs at least one token", param);
        }
        enum tp_status st = tp_server_tokenize(s, b, bl, tp_tokenizer_add_bos(s->tok), ids, &n, e);
        free(b);
        if (st != TP_OK) return st;
    } else if (cJSON_IsArray(in)) {
        n = cJSON_GetArraySize(in);
        if (n == 0) return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' is an empty list of tokens", param);
        *ids = malloc(sizeof(int32_t) * ((size_t)n + 1));
        if (!*ids) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, in)
        {
            if (!cJSON_IsNumber(t) || t->valuedouble != (double)(int64_t)t->valuedouble || t->valuedouble < 0 ||
                t->valuedouble >= s->n_vocab) {
                free(*ids);
                *ids = NULL;
                return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s'[%d] is not a token id in [0, %d)", param, i, s->n_vocab);
            }
            (*ids)[i++] = (int32_t)t->valuedouble;
        }
        *n_out = n; /* token ids are taken as they are */
        return TP_OK;
    } else {
        return tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' must be a string or a list of token ids", param);
    }
    int eos = tp_tokenizer_eos(s->tok);
    if (tp_tokenizer_add_eos(s->tok) && eos >= 0 && (n == 0 || (*ids)[n - 1] != eos)) {
        int32_t *g = realloc(*ids, sizeof(int32_t) * ((size_t)n + 1));
        if (!g) {
            free(*ids);
            *ids = NULL;
            return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        }
        *ids = g;
        (*ids)[n++] = eos;
    }
    *n_out = n;
    return TP_OK;
}

/* Base64 of the floats' little-endian bytes (OpenAI's encoding_format "base64"). */
static char *base64_floats(const float *v, int n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t nb = (size_t)n * 4, o = 0;
    char *out = malloc((nb + 2) / 3 * 4 + 1);
    if (!out) return NULL;
    const unsigned char *b = (const unsigned char *)v; /* the hosts tpserve builds on are little-endian */
    for (size_t i = 0; i < nb; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < nb ? b[i + 2] : 0);
        out[o++] = tab[x >> 18 & 63];
        out[o++] = tab[x >> 12 & 63];
        out[o++] = i + 1 < nb ? tab[x >> 6 & 63] : '=';
        out[o++] = i + 2 < nb ? tab[x & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

/* v[0..n) as a JSON array of numbers, each printed with 9 significant digits (enough for a float to
 * read back exactly); NULL on out of memory.  cJSON_CreateFloatArray prints each as a double, trying 15
 * digits and checking by reading it back: several times slower on a call's many thousands of numbers. */
static cJSON *float_array(const float *v, int n)
{
    struct tp_buf b = {0};
    enum tp_status st = tp_buf_puts(&b, "[");
    for (int i = 0; i < n && st == TP_OK; i++) {
        char num[32];
        const double d = isfinite(v[i]) ? (double)v[i] : 0.0; /* unit vectors: always finite */
        snprintf(num, sizeof num, "%s%.9g", i ? "," : "", d);
        st = tp_buf_puts(&b, num);
    }
    if (st == TP_OK) st = tp_buf_puts(&b, "]");
    cJSON *a = st == TP_OK ? cJSON_CreateRaw(b.data) : NULL;
    tp_buf_free(&b);
    return a;
}

/* One embeddings call: what its body asks, and its engine requests. */
struct embed_call {
    int ollama;            /* /api/embed (Ollama's shapes) or /v1/embeddings */
    int b64;               /* encoding_format "base64" */
    int pooling;           /* enum tp_pooling applied */
    int single;            /* input is one string or one list of token ids */
    int n_in, n_sub;       /* inputs; requests submitted to the engine so far */
    int client_gone;       /* the client went away while the requests ran */
    int E;                 /* vector length: the model's n_embd */
    long long n_tokens;    /* prompt tokens over all inputs */
    const cJSON *input;    /* the body's "input" (owned by the parsed body) */
    struct tp_req **reqs;  /* (n_in) one request per input, NULL where not made yet (owned) */
};

/* Every field of the body is one this API knows.  TP_OK or TP_ERR_INVALID_ARG (e filled). */
static enum tp_status embed_check_known(const cJSON *root, int ollama, struct tp_api_error *e)
{
    static const char *const oa_known[] = {"input", "model", "encoding_format", "dimensions", "user"};
    static const char *const ol_known[] = {"input", "model", "truncate", "options", "keep_alive", "dimensions"};
    const char *const *known = ollama ? ol_known : oa_known;
    const size_t n_known = ollama ? TP_ARRAY_LEN(ol_known) : TP_ARRAY_LEN(oa_known);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, root)
    {
        int ok = 0;
        for (size_t i = 0; i < n_known && !ok; i++) ok = strcmp(kv->string, known[i]) == 0;
        if (!ok) return tp_api_err(e, TP_ERR_INVALID_ARG, kv->string, "unknown field '%.60s'", kv->string);
    }
    return TP_OK;
}

/* The fields other than input: model, encoding_format (x->b64), dimensions, truncate, options, and the
 * pooling (x->pooling).  TP_OK or an error in e. */
static enum tp_status embed_parse_options(struct tp_server *s, const cJSON *root, struct embed_call *x,
                                          struct tp_api_error *e)
{
    const cJSON *v = field(root, "model");
    if (v && !cJSON_IsString(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "model", "'model' must be a string");
    if (x->ollama && !v) return tp_api_err(e, TP_ERR_INVALID_ARG, "model", "model is required");
    v = field(root, "encoding_format");
    if (v) {
        if (!cJSON_IsString(v) || (strcmp(v->valuestring, "float") && strcmp(v->valuestring, "base64")))
            return tp_api_err(e, TP_ERR_INVALID_ARG, "encoding_format",
                              "'encoding_format' must be \"float\" or \"base64\"");
        x->b64 = strcmp(v->valuestring, "base64") == 0;
    }
    v = field(root, "dimensions");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == x->E))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "dimensions",
                          "'dimensions' must be this model's %d (vectors are not shortened)", x->E);
    v = field(root, "truncate");
    if (v && !(cJSON_IsBool(v))) return tp_api_err(e, TP_ERR_INVALID_ARG, "truncate", "truncate must be a boolean");
    v = field(root, "options");
    if (v && !cJSON_IsObject(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, "options", "options must be an object");
    if (!(x->pooling = tp_api_pooling(s, e))) return e->status;
    return TP_OK;
}

/* x->input, x->single and x->n_in from the body's "input": one input (a string or a list of token ids) or
 * several.  TP_OK or TP_ERR_INVALID_ARG (e filled). */
static enum tp_status embed_parse_input(const cJSON *root, struct embed_call *x, struct tp_api_error *e)
{
    const cJSON *input = field(root, "input");
    if (!input)
        return tp_api_err(e, TP_ERR_INVALID_ARG, "input",
                          "'input' is required (a string, a list of strings or token ids)");
    x->input = input;
    x->single = cJSON_IsString(input) || (cJSON_IsArray(input) && cJSON_IsNumber(cJSON_GetArrayItem(input, 0)));
    x->n_in = x->single ? 1 : cJSON_IsArray(input) ? cJSON_GetArraySize(input) : 0;
    if (!x->single && !cJSON_IsArray(input))
        return tp_api_err(e, TP_ERR_INVALID_ARG, "input", "'input' must be a string, a list of strings or token ids");
    if (x->n_in == 0 || x->n_in > MAX_INPUTS)
        return tp_api_err(e, TP_ERR_INVALID_ARG, "input", "'input' has %d entries; send 1 to %d", x->n_in,
                          MAX_INPUTS);
    return TP_OK;
}

/* x->reqs: one engine request per input, tokenized and checked against the context; x->n_tokens.  TP_OK or an
 * error in e (the requests made so far stay in x->reqs). */
static enum tp_status embed_requests(struct tp_server *s, struct embed_call *x, struct tp_api_error *e)
{
    x->reqs = calloc((size_t)x->n_in, sizeof *x->reqs);
    if (!x->reqs) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
    for (int i = 0; i < x->n_in; i++) {
        char param[32];
        snprintf(param, sizeof param, x->single ? "input" : "input[%d]", i);
        const cJSON *in = x->single ? x->input : cJSON_GetArrayItem(x->input, i);
        int32_t *ids = NULL;
        int n = 0;
        enum tp_status st = input_tokens(s, in, param, &ids, &n, e);
        if (st != TP_OK) return st;
        if (n >= s->n_ctx) {
            free(ids);
            tp_api_err(e, TP_ERR_INVALID_ARG, param, "'%s' has %d tokens but the context holds %d; shorten it or restart with a "
                                        "larger --ctx-size", param, n, s->n_ctx);
            tp_run_context_error(e, n, 0, s->n_ctx);
            return e->status;
        }
        struct tp_req *r = tp_req_new();
        if (!r) {
            free(ids);
            return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        }
        x->reqs[i] = r;
        tp_run_make_id(s, "embd-", r->id, sizeof r->id);
        r->params.embed = x->pooling;
        r->params.max_tokens = 1;
        r->params.temperature = 0.0f; /* nothing is sampled; a greedy step gathers the least */
        r->params.top_p = 1.0f;
        r->params.repetition_penalty = 1.0f;
        r->prompt = ids;
        r->n_prompt = n;
        r->max_tokens = 1;
        r->toks = calloc(1, sizeof *r->toks);
        r->embd = calloc((size_t)x->E, sizeof(float));
        if (!r->toks || !r->embd) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        x->n_tokens += n;
    }
    return TP_OK;
}

/* Submit x's requests and wait for each in order, a window of inputs in the queue at a time, so that a long
 * list leaves room in the queue for other requests, yet keeps every slot busy while it waits for its inputs
 * in order.  TP_OK; TP_ERR_CANCELLED with x->client_gone set when the client went away (the submitted
 * requests cancelled, the 499 counted and logged); another status with e filled. */
static enum tp_status embed_wait(struct tp_server *s, struct MHD_Connection *c, struct embed_call *x,
                                 const char *path, struct tp_api_error *e)
{
    const int window = TP_MAX(TP_MAX(1, s->cfg.n_parallel * 2), s->cfg.max_queue / 2);
    pthread_mutex_t *mu = tp_engine_mutex(s->engine);
    for (int i = 0; i < x->n_in; i++) {
        while (x->n_sub < x->n_in && x->n_sub - i < window) {
            enum tp_status st = tp_engine_submit(s->engine, x->reqs[x->n_sub], e);
            if (st != TP_OK) return st;
            x->n_sub++;
        }
        struct tp_req *r = x->reqs[i];
        pthread_mutex_lock(mu);
        if (tp_run_wait_done(s, c, r) != 0) {
            pthread_mutex_unlock(mu);
            for (int k = 0; k < x->n_sub; k++) tp_engine_cancel(s->engine, x->reqs[k]);
            tp_metrics_request(s->metrics, 499);
            tp_http_log_request(s, x->reqs[0]->id, path, 499, (int)x->n_tokens, 0, 0, 0, 0);
            x->client_gone = 1;
            return TP_ERR_CANCELLED;
        }
        if (r->finish == TP_FINISH_ERROR) {
            tp_api_err_from(e, &r->err);
            pthread_mutex_unlock(mu);
            return e->status ? e->status : TP_ERR_INTERNAL;
        }
        pthread_mutex_unlock(mu);
    }
    return TP_OK;
}

/* The answer of a finished call in the API's shape (malloc'd JSON; NULL on out of memory). */
static char *embed_response_json(const struct tp_server *s, const cJSON *root, const struct embed_call *x)
{
    cJSON *o = cJSON_CreateObject();
    if (x->ollama) {
        cJSON_AddStringToObject(o, "model", field(root, "model")->valuestring);
        cJSON *arr = cJSON_AddArrayToObject(o, "embeddings");
        for (int i = 0; i < x->n_in; i++)
            cJSON_AddItemToArray(arr, float_array(x->reqs[i]->embd, x->E));
        uint64_t dur = x->reqs[x->n_in - 1]->t_done_ns - x->reqs[0]->t_submit_ns;
        cJSON_AddNumberToObject(o, "total_duration", (double)dur);
        cJSON_AddNumberToObject(o, "load_duration", 0);
        cJSON_AddNumberToObject(o, "prompt_eval_count", (double)x->n_tokens);
    } else {
        cJSON_AddStringToObject(o, "object", "list");
        cJSON *arr = cJSON_AddArrayToObject(o, "data");
        for (int i = 0; i < x->n_in; i++) {
            cJSON *d = cJSON_CreateObject();
            cJSON_AddItemToArray(arr, d);
            cJSON_AddStringToObject(d, "object", "embedding");
            cJSON_AddNumberToObject(d, "index", i);
            if (x->b64) {
                char *b = base64_floats(x->reqs[i]->embd, x->E);
                cJSON_AddStringToObject(d, "embedding", b ? b : "");
                free(b);
            } else {
                cJSON_AddItemToObject(d, "embedding", float_array(x->reqs[i]->embd, x->E));
            }
        }
        const cJSON *v = field(root, "model");
        cJSON_AddStringToObject(o, "model", v ? v->valuestring : s->model_id);
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", (double)x->n_tokens);
        cJSON_AddNumberToObject(u, "total_tokens", (double)x->n_tokens);
    }
    char *json = tp_json_print(o);
    cJSON_Delete(o);
    return json;
}

/* A call: parse, make the requests, run them, answer; on an error the submitted requests are cancelled and
 * the error is sent in the API's shape. */
static enum MHD_Result embed(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len, int ollama)
{
    const char *path = ollama ? "/api/embed" : "/v1/embeddings";
    struct tp_api_error e = {0};
    cJSON *root = tp_json_parse(body, len, &e);
    if (!root) return send_error(s, c, ollama, &e);
    struct embed_call x = {.ollama = ollama, .E = tp_parallel_hparams(s->par)->n_embd};
    enum MHD_Result ret = MHD_NO;
    enum tp_status st = embed_check_known(root, ollama, &e);
    if (st == TP_OK) st = embed_parse_options(s, root, &x, &e);
    if (st == TP_OK) st = embed_parse_input(root, &x, &e);
    if (st == TP_OK) st = embed_requests(s, &x, &e);
    if (st == TP_OK) st = embed_wait(s, c, &x, path, &e);
    if (st == TP_OK) {
        double ttft = (double)(x.reqs[x.n_in - 1]->t_done_ns - x.reqs[0]->t_submit_ns) / 1e9;
        tp_http_log_request(s, x.reqs[0]->id, path, 200, (int)x.n_tokens, 0, 0, ttft, 0);
        char *json = embed_response_json(s, root, &x);
        ret = json ? tp_http_send_json(s, c, 200, json) : MHD_NO;
        free(json);
    } else if (!x.client_gone) {
        for (int k = 0; k < x.n_sub; k++) tp_engine_cancel(s->engine, x.reqs[k]);
        ret = send_error(s, c, ollama, &e);
    }
    for (int k = 0; x.reqs && k < x.n_in; k++) {
        if (!x.reqs[k]) continue;
        if (k >= x.n_sub) tp_engine_release(s->engine, x.reqs[k]); /* never submitted: the engine's reference too */
        tp_engine_release(s->engine, x.reqs[k]);
    }
    free(x.reqs);
    cJSON_Delete(root);
    return ret;
}

enum MHD_Result tp_api_embeddings(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len,
                                  int ollama)
{
    return embed(s, c, body, len, ollama);
}

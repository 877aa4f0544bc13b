/*
 * server/api_ollama.c - Ollama's API: GET /api/version, GET /api/tags,
 * GET /api/ps, POST /api/show, POST /api/chat, POST /api/generate.
 *
 * Chat and generate requests are translated into the equivalent
 * chat-completions (or, for generate with raw: true, completions) request
 * and run on the one engine (api_run.c).  `options` maps temperature,
 * top_p, top_k, min_p, seed, num_predict, stop, repeat_penalty,
 * presence_penalty and frequency_penalty; num_ctx above the server's context
 * is refused; options that only tune Ollama's own runtime (num_thread,
 * num_gpu, use_mmap, ...) change nothing here and are accepted; options that
 * would change the output but are not implemented (mirostat, tfs_z,
 * typical_p, ...) are refused.  `format` ("json" or a JSON schema) goes
 * through the structured-output engine.  Answers stream as NDJSON by
 * default, as Ollama does (one JSON object per line, the last with
 * "done": true and the counts); "stream": false gives one object.  Errors
 * are Ollama's {"error": "..."} with the HTTP status.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "api_run.h"

#define OLLAMA_VERSION "0.12.0" /* the Ollama API level these routes follow */

char *tp_api_ollama_error_json(const struct tp_api_error *e)
{
    cJSON *o = cJSON_CreateObject();
    char m[700];
    cJSON_AddStringToObject(o, "error", tp_run_error_text(e, m, sizeof m));
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return j;
}

static char *error_json(const struct tp_api_error *e) { return tp_api_ollama_error_json(e); }

static const cJSON *field(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* RFC 3339 UTC time with nanoseconds, as Ollama writes created_at. */
static void rfc3339(char *out, size_t cap, int64_t t_s, long ns)
{
    time_t t = (time_t)t_s;
    struct tm tm;
    gmtime_r(&t, &tm);
    char d[40];
    strftime(d, sizeof d, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, cap, "%s.%09ldZ", d, ns);
}

static void now_rfc3339(char *out, size_t cap)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rfc3339(out, cap, (int64_t)ts.tv_sec, ts.tv_nsec);
}

/* ------------------------------------------------------------ models */

/* The served model's name as Ollama clients expect it: "name:tag". */
static void model_name(struct tp_server *s, char *out, size_t cap)
{
    const char *id = s->model_id ? s->model_id : "tpserve";
    snprintf(out, cap, "%s%s", id, strchr(id, ':') ? "" : ":latest");
}

static int is_our_model(struct tp_server *s, const char *name)
{
    char full[300];
    model_name(s, full, sizeof full);
    const char *id = s->model_id ? s->model_id : "tpserve";
    return strcmp(name, id) == 0 || strcmp(name, full) == 0;
}

static void size_label(uint64_t n, char *out, size_t cap)
{
    if (n >= 1000000000ull) snprintf(out, cap, "%.1fB", (double)n / 1e9);
    else if (n >= 1000000ull) snprintf(out, cap, "%.1fM", (double)n / 1e6);
    else snprintf(out, cap, "%.0fK", (double)n / 1e3);
}

/* A stable identifier of the served model (name, file, shape): 64 hex digits
 * in Ollama's "digest" field.  It is not the SHA-256 of the file, which would
 * take a read of every weight. */
static void digest(struct tp_server *s, char *out, size_t cap)
{
    tp_model_t *m = tp_parallel_model(s->par);
    const char *path = tp_parallel_model_path(s->par);
    uint64_t h[4];
    for (int k = 0; k < 4; k++) {
        uint64_t x = 1469598103934665603ull ^ (uint64_t)(k + 1) * 0x9E3779B97F4A7C15ull;
        const char *parts[2] = {path ? path : "", s->model_id ? s->model_id : ""};
        for (int p = 0; p < 2; p++)
            for (const char *c = parts[p]; *c; c++) x = (x ^ (unsigned char)*c) * 1099511628211ull;
        x = (x ^ tp_model_weight_bytes(m)) * 1099511628211ull;
        h[k] = x;
    }
    snprintf(out, cap, "%016llx%016llx%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1],
             (unsigned long long)h[2], (unsigned long long)h[3]);
}

static cJSON *details(struct tp_server *s)
{
    tp_model_t *m = tp_parallel_model(s->par);
    const struct tp_hparams *hp = tp_model_hparams(m);
    cJSON *d = cJSON_CreateObject();
    const char *arch = tp_arch_name(hp->arch);
    cJSON_AddStringToObject(d, "parent_model", "");
    cJSON_AddStringToObject(d, "format", "gguf");
    cJSON_AddStringToObject(d, "family", arch);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "families"), cJSON_CreateString(arch));
    char sz[32];
    size_label(tp_srv_n_params(hp), sz, sizeof sz);
    cJSON_AddStringToObject(d, "parameter_size", sz);
    cJSON_AddStringToObject(d, "quantization_level", tp_wtype_name(tp_model_weight_type(m)));
    return d;
}

static cJSON *model_entry(struct tp_server *s, int ps)
{
    char name[300], dg[80], t[64];
    model_name(s, name, sizeof name);
    digest(s, dg, sizeof dg);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "model", name);
    tp_model_t *m = tp_parallel_model(s->par);
    if (!ps) {
        rfc3339(t, sizeof t, s->created, 0);
        cJSON_AddStringToObject(o, "modified_at", t);
    }
    cJSON_AddNumberToObject(o, "size", (double)tp_model_weight_bytes(m));
    cJSON_AddStringToObject(o, "digest", dg);
    cJSON_AddItemToObject(o, "details", details(s));
    if (ps) {
        /* loaded for as long as the server runs */
        cJSON_AddStringToObject(o, "expires_at", "2318-08-22T00:00:00.000000000Z");
        cJSON_AddNumberToObject(o, "size_vram", 0);
        cJSON_AddNumberToObject(o, "context_length", s->n_ctx);
    }
    return o;
}

static enum MHD_Result send_obj(struct tp_server *s, struct MHD_Connection *c, cJSON *o)
{
    char *j = tp_json_print(o);
    cJSON_Delete(o);
    if (!j) return MHD_NO;
    enum MHD_Result r = tp_http_send_json(s, c, 200, j);
    free(j);
    return r;
}

static enum MHD_Result list_models(struct tp_server *s, struct MHD_Connection *c, int ps)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "models"), model_entry(s, ps));
    return send_obj(s, c, o);
}

static const struct tp_run_ops ollama_chat_ops, ollama_generate_ops;

static enum MHD_Result show_model(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    struct tp_api_error e;
    cJSON *root = tp_json_parse(body, len, &e);
    if (!root) return tp_run_send_error(s, c, &ollama_chat_ops, &e);
    const cJSON *nm = field(root, "model");
    if (!nm) nm = field(root, "name");
    if (!cJSON_IsString(nm)) {
        cJSON_Delete(root);
        tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "model is required");
        return tp_run_send_error(s, c, &ollama_chat_ops, &e);
    }
    if (!is_our_model(s, nm->valuestring)) {
        char name[300];
        model_name(s, name, sizeof name);
        tp_api_err(&e, TP_ERR_NOT_FOUND, NULL, "model '%.200s' not found; this server serves '%s'", nm->valuestring, name);
        cJSON_Delete(root);
        return tp_run_send_error(s, c, &ollama_chat_ops, &e);
    }
    cJSON_Delete(root);
    tp_model_t *m = tp_parallel_model(s->par);
    const struct tp_hparams *hp = tp_model_hparams(m);
    const char *tmpl = tp_model_chat_template(m);
    const char *arch = tp_arch_name(hp->arch);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "license", "");
    struct tp_buf mf = {0};
    const char *path = tp_parallel_model_path(s->par);
    tp_buf_printf(&mf, "# served by tpserve\nFROM %s\n", path ? path : "");
    cJSON_AddStringToObject(o, "modelfile", mf.data ? mf.data : "");
    tp_buf_free(&mf);
    /* the server's generation defaults (props.c), one "name value" line each, as Ollama lists a Modelfile's */
    struct tp_buf pb = {0};
    const struct tp_gen_defaults *g = &s->gen;
    if (g->set & TP_GEN_TEMPERATURE) tp_buf_printf(&pb, "temperature %g\n", tp_srv_num(g->temperature));
    if (g->set & TP_GEN_TOP_P) tp_buf_printf(&pb, "top_p %g\n", tp_srv_num(g->top_p));
    if (g->set & TP_GEN_TOP_K) tp_buf_printf(&pb, "top_k %d\n", g->top_k);
    if (g->set & TP_GEN_MIN_P) tp_buf_printf(&pb, "min_p %g\n", tp_srv_num(g->min_p));
    if (g->set & TP_GEN_REPEAT_PENALTY) tp_buf_printf(&pb, "repeat_penalty %g\n", tp_srv_num(g->repeat_penalty));
    if (g->set & TP_GEN_SEED) tp_buf_printf(&pb, "seed %llu\n", (unsigned long long)g->seed);
    if (g->set & TP_GEN_N_PREDICT) tp_buf_printf(&pb, "num_predict %d\n", g->n_predict);
    if (pb.len > 0) pb.data[--pb.len] = '\0';
    cJSON_AddStringToObject(o, "parameters", pb.data ? pb.data : "");
    tp_buf_free(&pb);
    cJSON_AddStringToObject(o, "template", tmpl ? tmpl : "");
    cJSON_AddItemToObject(o, "details", details(s));
    cJSON *mi = cJSON_AddObjectToObject(o, "model_info");
    char k[96];
    cJSON_AddStringToObject(mi, "general.architecture", arch);
    cJSON_AddNumberToObject(mi, "general.parameter_count", (double)tp_srv_n_params(hp));
    static const char *const keys[] = {"context_length", "embedding_length", "block_count", "feed_forward_length",
                                       "attention.head_count", "attention.head_count_kv", "vocab_size"};
    const int vals[] = {hp->n_ctx_train, hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head, hp->n_head_kv, hp->n_vocab};
    for (int i = 0; i < 7; i++) {
        snprintf(k, sizeof k, "%s.%s", arch, keys[i]);
        cJSON_AddNumberToObject(mi, k, vals[i]);
    }
    cJSON *caps = cJSON_AddArrayToObject(o, "capabilities");
    cJSON_AddItemToArray(caps, cJSON_CreateString("completion"));
    char t[64];
    rfc3339(t, sizeof t, s->created, 0);
    cJSON_AddStringToObject(o, "modified_at", t);
    return send_obj(s, c, o);
}

/* ------------------------------------------------------------ requests */

/* options -> chat-completions fields of out.  n_ctx: the server's. */
static int translate_options(const cJSON *root, cJSON *out, int n_ctx, struct tp_api_error *e)
{
    const cJSON *opt = field(root, "options");
    if (!opt) return 0;
    if (!cJSON_IsObject(opt)) return tp_api_err(e, TP_ERR_INVALID_ARG, "options", "options must be an object");
    static const char *const map[][2] = {
        {"temperature", "temperature"},       {"top_p", "top_p"},
        {"top_k", "top_k"},                   {"min_p", "min_p"},
        {"seed", "seed"},                     {"repeat_penalty", "repetition_penalty"},
        {"presence_penalty", "presence_penalty"}, {"frequency_penalty", "frequency_penalty"},
        {"stop", "stop"},
    };
    /* Ollama runtime settings: how it loads and runs the model, not what it generates */
    static const char *const runtime[] = {"num_thread", "num_gpu", "main_gpu", "use_mmap", "use_mlock", "num_batch",
                                          "low_vram", "numa", "f16_kv", "vocab_only", "logits_all", "embedding_only"};
    const cJSON *kv;
    cJSON_ArrayForEach(kv, opt)
    {
        const char *k = kv->string;
        int done = 0;
        for (size_t i = 0; i < TP_ARRAY_LEN(map) && !done; i++) {
            if (strcmp(k, map[i][0]) != 0) continue;
            if (!cJSON_IsNull(kv)) cJSON_AddItemToObject(out, map[i][1], cJSON_Duplicate(kv, 1));
            done = 1;
        }
        for (size_t i = 0; i < TP_ARRAY_LEN(runtime) && !done; i++) done = strcmp(k, runtime[i]) == 0;
        if (done) continue;
        if (strcmp(k, "num_predict") == 0) {
            if (!cJSON_IsNumber(kv)) return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "options.num_predict must be an integer");
            /* -1: until the end of the reply, -2: until the context is full (both: no cap here) */
            if (kv->valuedouble > 0) cJSON_AddNumberToObject(out, "max_tokens", kv->valuedouble);
            else if (kv->valuedouble == 0) return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "options.num_predict is 0; send a "
                                                                            "positive count, or -1 for no limit");
        } else if (strcmp(k, "num_ctx") == 0) {
            if (!cJSON_IsNumber(kv)) return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "options.num_ctx must be an integer");
            if (kv->valuedouble > n_ctx)
                return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "options.num_ctx is %.0f but this server's context holds %d tokens "
                                                 "(restart it with a larger --ctx-size)", kv->valuedouble, n_ctx);
        } else if (strcmp(k, "num_keep") == 0 || strcmp(k, "repeat_last_n") == 0 ||
                   strcmp(k, "penalize_newline") == 0) {
            /* Ollama's context shifting and penalty window: accepted at their neutral values only */
            if (!(cJSON_IsNumber(kv) && kv->valuedouble <= 0 && strcmp(k, "repeat_last_n") != 0) &&
                !(strcmp(k, "repeat_last_n") == 0 && cJSON_IsNumber(kv) && (kv->valuedouble == -1)) &&
                !(cJSON_IsBool(kv) && !cJSON_IsTrue(kv)))
                return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "options.%s is not supported by this server (penalties look at the "
                                                 "whole reply, and the context is never shifted); leave it out", k);
        } else {
            return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "options.%.60s is not supported by this server; leave it out", k);
        }
    }
    return 0;
}

/* options.num_predict -1 / -2 asks for no limit: a field the request sets, which the server's --n-predict
 * default does not replace (p->max_tokens stays -1). */
static void no_limit_asked(const cJSON *root, struct tp_req_params *p)
{
    const cJSON *opt = field(root, "options");
    const cJSON *np = cJSON_IsObject(opt) ? field(opt, "num_predict") : NULL;
    if (cJSON_IsNumber(np) && np->valuedouble < 0) p->set |= TP_GEN_N_PREDICT;
}

/* format: "json" or a JSON schema object -> response_format. */
static int translate_format(const cJSON *root, cJSON *out, struct tp_api_error *e)
{
    const cJSON *f = field(root, "format");
    if (!f || (cJSON_IsString(f) && f->valuestring[0] == '\0')) return 0;
    cJSON *rf = cJSON_AddObjectToObject(out, "response_format");
    if (cJSON_IsString(f)) {
        if (strcmp(f->valuestring, "json") != 0)
            return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "format must be \"json\" or a JSON schema object");
        cJSON_AddStringToObject(rf, "type", "json_object");
        return 0;
    }
    if (!cJSON_IsObject(f)) return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "format must be \"json\" or a JSON schema object");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_AddStringToObject(js, "name", "format");
    cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(f, 1));
    return 0;
}

/* Fields every chat/generate request may carry: checked here. */
static int common_fields(const cJSON *root, cJSON *out, struct tp_server *s, struct tp_api_error *e)
{
    const cJSON *v = field(root, "model");
    if (!cJSON_IsString(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "model is required");
    cJSON_AddStringToObject(out, "model", v->valuestring);
    v = field(root, "stream");
    if (v && !cJSON_IsBool(v)) return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "stream must be a boolean");
    cJSON_AddBoolToObject(out, "stream", !v || cJSON_IsTrue(v)); /* Ollama streams by default */
    v = field(root, "think");
    if (v && !(cJSON_IsBool(v) && !cJSON_IsTrue(v)))
        return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "think: this model has no reasoning channel (\"think\" is not supported); "
                                         "leave it out or send false");
    v = field(root, "keep_alive"); /* the model stays loaded while the server runs */
    if (v && !cJSON_IsString(v) && !cJSON_IsNumber(v))
        return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "keep_alive must be a duration string or a number of seconds");
    if (translate_options(root, out, s->n_ctx, e)) return -1;
    return translate_format(root, out, e);
}

static const char *const rename_fields[][2] = {
    {"repetition_penalty", "options.repeat_penalty"},
    {"max_tokens", "options.num_predict"},
    {"response_format", "format"},
    {"temperature", "options.temperature"},
    {"top_p", "options.top_p"},
    {"top_k", "options.top_k"},
    {"min_p", "options.min_p"},
    {"seed", "options.seed"},
    {"stop", "options.stop"},
    {NULL, NULL},
};

/* Checks the request's top-level fields against the known list. */
static int known_fields(const cJSON *root, const char *const *known, size_t n, struct tp_api_error *e)
{
    const cJSON *kv;
    cJSON_ArrayForEach(kv, root)
    {
        int ok = 0;
        for (size_t i = 0; i < n && !ok; i++) ok = strcmp(kv->string, known[i]) == 0;
        if (!ok) return tp_api_err(e, TP_ERR_INVALID_ARG, NULL, "unknown field '%.60s'", kv->string);
    }
    return 0;
}

/* ------------------------------------------------------------ answers */

struct ol_ctx {
    int generate;          /* /api/generate (else /api/chat) */
    char model[256];
};

static void ctx_free(void *p) { free(p); }

static cJSON *head(struct tp_run *x)
{
    struct ol_ctx *ctx = x->ctx;
    cJSON *o = cJSON_CreateObject();
    char t[64];
    now_rfc3339(t, sizeof t);
    cJSON_AddStringToObject(o, "model", ctx->model);
    cJSON_AddStringToObject(o, "created_at", t);
    return o;
}

static void add_text(struct tp_run *x, cJSON *o, const char *text, size_t n)
{
    struct ol_ctx *ctx = x->ctx;
    if (ctx->generate) {
        tp_json_add_bytes(o, "response", text, n);
    } else {
        cJSON *m = cJSON_AddObjectToObject(o, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        tp_json_add_bytes(m, "content", text, n);
    }
}

/* The closing fields: done, done_reason, the counts and durations (ns). */
static void add_done(struct tp_run *x, cJSON *o)
{
    struct ol_ctx *ctx = x->ctx;
    const struct tp_req *r = x->r;
    cJSON_AddBoolToObject(o, "done", 1);
    cJSON_AddStringToObject(o, "done_reason", r->finish == TP_FINISH_LENGTH ? "length" : "stop");
    uint64_t now = tp_now_ns(), done = r->t_done_ns ? r->t_done_ns : now;
    uint64_t first = r->t_first_ns ? r->t_first_ns : done;
    cJSON_AddNumberToObject(o, "total_duration", (double)(done - r->t_submit_ns));
    cJSON_AddNumberToObject(o, "load_duration", 0);
    cJSON_AddNumberToObject(o, "prompt_eval_count", r->n_prompt);
    cJSON_AddNumberToObject(o, "prompt_eval_duration", (double)(first - r->t_submit_ns));
    cJSON_AddNumberToObject(o, "eval_count", r->n_toks);
    cJSON_AddNumberToObject(o, "eval_duration", (double)(done - first));
    if (ctx->generate) { /* the tokens of prompt and reply, for a next request's context */
        cJSON *cx = cJSON_AddArrayToObject(o, "context");
        for (int i = 0; i < r->n_prompt; i++) cJSON_AddItemToArray(cx, cJSON_CreateNumber(r->prompt[i]));
        for (int i = 0; i < r->n_toks; i++) cJSON_AddItemToArray(cx, cJSON_CreateNumber(r->toks[i].id));
    }
}

static void line(struct tp_buf *out, cJSON *o)
{
    char *j = tp_json_print(o);
    cJSON_Delete(o);
    if (!j) return;
    tp_buf_puts(out, j);
    tp_buf_puts(out, "\n");
    free(j);
}

static void s_text(struct tp_run *x, const char *text, size_t n, struct tp_buf *out)
{
    cJSON *o = head(x);
    add_text(x, o, text, n);
    cJSON_AddBoolToObject(o, "done", 0);
    line(out, o);
}

/* Ollama's tool call {"function": {"index", "name", "arguments": object}} from arguments text args[0..n). */
static cJSON *tool_call(int k, const char *name, const char *args, size_t n)
{
    cJSON *c = cJSON_CreateObject();
    cJSON *fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddNumberToObject(fn, "index", k);
    cJSON_AddStringToObject(fn, "name", name);
    cJSON *a = cJSON_ParseWithLength(args, n);
    cJSON_AddItemToObject(fn, "arguments", cJSON_IsObject(a) ? a : (cJSON_Delete(a), cJSON_CreateObject()));
    return c;
}

/* streaming: a complete call is one line whose message carries it, as Ollama streams calls */
static void s_call_done(struct tp_run *x, int k, const char *name, const char *args, size_t n, struct tp_buf *out)
{
    cJSON *o = head(x);
    add_text(x, o, "", 0);
    cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "message");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(m, "tool_calls"), tool_call(k, name, args, n));
    cJSON_AddBoolToObject(o, "done", 0);
    line(out, o);
}

static void s_end(struct tp_run *x, struct tp_buf *out)
{
    cJSON *o = head(x);
    add_text(x, o, "", 0);
    add_done(x, o);
    line(out, o);
}

static void s_error(struct tp_run *x, const struct tp_api_error *e, struct tp_buf *out)
{
    (void)x;
    char *j = error_json(e);
    if (!j) return;
    tp_buf_puts(out, j);
    tp_buf_puts(out, "\n");
    free(j);
}

static char *final_json(struct tp_run *x)
{
    const struct tp_req *r = x->r;
    struct tp_tool_scan sc;
    size_t base;
    const int n_calls = tp_run_reply_calls(r, &sc, &base);
    const char *text = (r->text.data ? r->text.data : "") + base; /* the content and calls (after </think>) */
    cJSON *o = head(x);
    add_text(x, o, text, sc.content_end);
    cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "message");
    cJSON *calls = n_calls && m ? cJSON_AddArrayToObject(m, "tool_calls") : NULL;
    for (int k = 0; k < sc.n_calls && calls; k++)
        if (sc.calls[k].complete)
            cJSON_AddItemToArray(calls, tool_call(k, sc.calls[k].name, text + sc.calls[k].args_off, sc.calls[k].args_len));
    add_done(x, o);
    char *j = tp_json_print(o);
    cJSON_Delete(o);
    return j;
}

static const struct tp_run_ops ollama_chat_ops = {
    .path = "/api/chat",
    .id_prefix = "ollama-chat-",
    .stream_type = "application/x-ndjson",
    .text = s_text,
    .call_done = s_call_done,
    .end = s_end,
    .error = s_error,
    .final_json = final_json,
    .error_json = error_json,
};

static const struct tp_run_ops ollama_generate_ops = {
    .path = "/api/generate",
    .id_prefix = "ollama-gen-",
    .stream_type = "application/x-ndjson",
    .text = s_text,
    .end = s_end,
    .error = s_error,
    .final_json = final_json,
    .error_json = error_json,
};

/* Nothing to generate (no messages / empty prompt): Ollama loads the model and says so. */
static enum MHD_Result load_only(struct tp_server *s, struct MHD_Connection *c, const char *model, int generate)
{
    cJSON *o = cJSON_CreateObject();
    char t[64];
    now_rfc3339(t, sizeof t);
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "created_at", t);
    if (generate) {
        cJSON_AddStringToObject(o, "response", "");
    } else {
        cJSON *m = cJSON_AddObjectToObject(o, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", "");
    }
    cJSON_AddBoolToObject(o, "done", 1);
    cJSON_AddStringToObject(o, "done_reason", "load");
    return send_obj(s, c, o);
}

static enum MHD_Result chat(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    const struct tp_run_ops *ops = &ollama_chat_ops;
    struct tp_api_error e;
    struct tp_req_params p;
    cJSON *root = tp_json_parse(body, len, &e);
    if (!root) return tp_run_send_error(s, c, ops, &e);
    cJSON *out = cJSON_CreateObject();
    static const char *const known[] = {"model", "messages", "stream", "format", "options", "keep_alive", "tools",
                                        "think"};
    enum MHD_Result ret;
    if (known_fields(root, known, TP_ARRAY_LEN(known), &e) || common_fields(root, out, s, &e)) goto fail;
    const cJSON *msgs = field(root, "messages");
    if (msgs && !cJSON_IsArray(msgs)) {
        tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "messages must be a list");
        goto fail;
    }
    if (!msgs || cJSON_GetArraySize(msgs) == 0) {
        ret = load_only(s, c, field(root, "model")->valuestring, 0);
        cJSON_Delete(out);
        cJSON_Delete(root);
        return ret;
    }
    cJSON *om = cJSON_AddArrayToObject(out, "messages");
    int i = 0, n_ids = 0, next_result = 0;
    cJSON *last_calls = NULL; /* the tool_calls of the latest assistant message, for the tool messages' ids */
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *role = cJSON_IsObject(m) ? field(m, "role") : NULL, *content = field(m, "content");
        const cJSON *img = field(m, "images"), *tc = field(m, "tool_calls");
        const char *r = cJSON_IsString(role) ? role->valuestring : "";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
            tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "messages[%d].role must be system, user, assistant or tool", i);
            goto fail;
        }
        if (img && cJSON_GetArraySize(img) > 0) {
            tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "messages[%d]: images are not supported by this server", i);
            goto fail;
        }
        if (tc && (!cJSON_IsArray(tc) || strcmp(r, "assistant"))) {
            tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "messages[%d].tool_calls must be a list, on an assistant message", i);
            goto fail;
        }
        if (content && !cJSON_IsString(content)) {
            tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "messages[%d].content must be a string", i);
            goto fail;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(om, o);
        cJSON_AddStringToObject(o, "role", r);
        cJSON_AddStringToObject(o, "content", content ? content->valuestring : "");
        if (tc && cJSON_GetArraySize(tc) > 0) {
            /* Ollama's calls carry no ids: each gets one here ("call" and 5 digits: 9 characters, what
             * Mistral's templates take), and the tool messages that follow answer them in order */
            last_calls = cJSON_AddArrayToObject(o, "tool_calls");
            next_result = 0;
            int k = 0;
            const cJSON *call;
            cJSON_ArrayForEach(call, tc)
            {
                const cJSON *fn = cJSON_IsObject(call) ? field(call, "function") : NULL;
                const cJSON *nm = cJSON_IsObject(fn) ? field(fn, "name") : NULL, *args = fn ? field(fn, "arguments") : NULL;
                if (!cJSON_IsString(nm) || (args && !cJSON_IsObject(args))) {
                    tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "messages[%d].tool_calls[%d] must be {\"function\": {\"name\": "
                               "string, \"arguments\": object}}", i, k);
                    goto fail;
                }
                char id[16], *aj = args ? cJSON_PrintUnformatted(args) : NULL;
                snprintf(id, sizeof id, "call%05d", n_ids++ % 100000);
                cJSON_AddItemToArray(last_calls, tp_run_chat_call(id, nm->valuestring, aj ? aj : "{}", aj ? strlen(aj) : 2));
                free(aj);
                k++;
            }
        }
        if (strcmp(r, "tool") == 0) {
            const cJSON *call = last_calls ? cJSON_GetArrayItem(last_calls, next_result++) : NULL;
            const cJSON *id = call ? cJSON_GetObjectItemCaseSensitive(call, "id") : NULL;
            if (cJSON_IsString(id)) cJSON_AddStringToObject(o, "tool_call_id", id->valuestring);
        }
        i++;
    }
    const cJSON *tools = field(root, "tools");
    if (tools && cJSON_GetArraySize(tools) > 0) cJSON_AddItemToObject(out, "tools", cJSON_Duplicate(tools, 1));
    if (tp_run_parse_chat(s, out, rename_fields, &p, &e)) goto fail;
    no_limit_asked(root, &p);
    struct ol_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        tp_req_params_free(&p);
        tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
        goto fail;
    }
    snprintf(ctx->model, sizeof ctx->model, "%s", field(root, "model")->valuestring);
    cJSON_Delete(out);
    cJSON_Delete(root);
    return tp_run_request(s, c, ops, &p, NULL, 0, "options.num_predict", ctx, ctx_free);
fail:
    cJSON_Delete(out);
    cJSON_Delete(root);
    return tp_run_send_error(s, c, ops, &e);
}

static enum MHD_Result generate(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    const struct tp_run_ops *ops = &ollama_generate_ops;
    struct tp_api_error e;
    struct tp_req_params p;
    cJSON *root = tp_json_parse(body, len, &e);
    if (!root) return tp_run_send_error(s, c, ops, &e);
    cJSON *out = cJSON_CreateObject();
    static const char *const known[] = {"model", "prompt", "suffix", "system", "template", "context", "stream", "raw",
                                        "format", "options", "keep_alive", "images", "think"};
    enum MHD_Result ret;
    if (known_fields(root, known, TP_ARRAY_LEN(known), &e) || common_fields(root, out, s, &e)) goto fail;
    const cJSON *prompt = field(root, "prompt"), *sys = field(root, "system"), *raw = field(root, "raw");
    if (prompt && !cJSON_IsString(prompt)) {
        tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "prompt must be a string");
        goto fail;
    }
    if (sys && !cJSON_IsString(sys)) {
        tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "system must be a string");
        goto fail;
    }
    if (raw && !cJSON_IsBool(raw)) {
        tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "raw must be a boolean");
        goto fail;
    }
    static const char *const refused[][2] = {
        {"suffix", "suffix (fill-in-the-middle) is not supported by this server"},
        {"template", "a per-request prompt template is not supported; the model's chat template is used (or send "
                     "raw: true with the whole prompt)"},
        {"context", "context (token ids of an earlier reply) is not supported; send the conversation to /api/chat"},
        {"images", "images are not supported by this server"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(refused); i++) {
        const cJSON *v = field(root, refused[i][0]);
        if (v && !(cJSON_IsString(v) && !v->valuestring[0]) && !(cJSON_IsArray(v) && !cJSON_GetArraySize(v))) {
            tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "%s", refused[i][1]);
            goto fail;
        }
    }
    if (!prompt || !prompt->valuestring[0]) {
        ret = load_only(s, c, field(root, "model")->valuestring, 1);
        cJSON_Delete(out);
        cJSON_Delete(root);
        return ret;
    }
    if (raw && cJSON_IsTrue(raw)) {
        if (sys) {
            tp_api_err(&e, TP_ERR_INVALID_ARG, NULL, "system cannot be used with raw: true (the prompt is sent as is)");
            goto fail;
        }
        cJSON_AddStringToObject(out, "prompt", prompt->valuestring);
    } else {
        cJSON *om = cJSON_AddArrayToObject(out, "messages");
        if (sys) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToArray(om, o);
            cJSON_AddStringToObject(o, "role", "system");
            cJSON_AddStringToObject(o, "content", sys->valuestring);
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(om, o);
        cJSON_AddStringToObject(o, "role", "user");
        cJSON_AddStringToObject(o, "content", prompt->valuestring);
    }
    if (tp_run_parse_chat(s, out, rename_fields, &p, &e)) goto fail;
    no_limit_asked(root, &p);
    struct ol_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        tp_req_params_free(&p);
        tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
        goto fail;
    }
    ctx->generate = 1;
    snprintf(ctx->model, sizeof ctx->model, "%s", field(root, "model")->valuestring);
    cJSON_Delete(out);
    cJSON_Delete(root);
    return tp_run_request(s, c, ops, &p, NULL, 0, "options.num_predict", ctx, ctx_free);
fail:
    cJSON_Delete(out);
    cJSON_Delete(root);
    return tp_run_send_error(s, c, ops, &e);
}

enum MHD_Result tp_api_ollama(struct tp_server *s, struct MHD_Connection *c, const char *path, const char *body,
                              size_t len)
{
    if (strcmp(path, "/api/version") == 0) return tp_http_send_json(s, c, 200, "{\"version\":\"" OLLAMA_VERSION "\"}");
    if (strcmp(path, "/api/tags") == 0) return list_models(s, c, 0);
    if (strcmp(path, "/api/ps") == 0) return list_models(s, c, 1);
    if (strcmp(path, "/api/show") == 0) return show_model(s, c, body, len);
    if (strcmp(path, "/api/chat") == 0) return chat(s, c, body, len);
    if (strcmp(path, "/api/generate") == 0) return generate(s, c, body, len);
    struct tp_api_error e;
    tp_api_err(&e, TP_ERR_NOT_FOUND, NULL, "%s is not an Ollama route this server serves", path);
    return tp_run_send_error(s, c, &ollama_chat_ops, &e);
}

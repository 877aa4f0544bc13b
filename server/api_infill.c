/*
 * server/api_infill.c - fill-in-the-middle: llama-server's POST /infill and
 * `suffix` on POST /v1/completions.
 *
 * The prompt is built from the model's FIM tokens (tp_tokenizer_fim: GGUF
 * tokenizer.ggml.fim_*_token_id, or the Qwen2.5-Coder / StarCoder /
 * CodeLlama / DeepSeek-Coder token names) in prefix-suffix-middle order, as
 * llama-server builds it:
 *   [BOS] [extra] <FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID> [prompt]
 * where extra, for /infill's input_extra chunks, is "<FIM_REP>project\n"
 * (when the model has it) and "<FIM_SEP>filename\ntext" per chunk.  The
 * token ids then go through the ordinary completion path, so every sampling
 * field, limit and the scheduler are those of /v1/completions.  A model
 * without prefix, suffix and middle tokens gets a 400 that says so.
 *
 * /infill answers in llama-server's native completion shape: {"content",
 * "stop", "stop_type", "tokens_predicted", "tokens_evaluated", ...}, or a
 * stream of `data: {"content": ..., "stop": false}` events ending with the
 * "stop": true one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api_run.h"

static const cJSON *field(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Append the tokens of text v (a JSON string in tree form) to ids. */
static int push_text(struct tp_server *s, const cJSON *v, cJSON *ids, struct tp_api_error *e)
{
    char *b = NULL;
    size_t bl = 0;
    if (tp_json_bytes(v, &b, &bl) != 0) return tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
    int32_t *t = NULL;
    int n = 0;
    enum tp_status st = bl ? tp_server_tokenize(s, b, bl, 0, &t, &n, e) : TP_OK;
    free(b);
    if (st != TP_OK) return -1;
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(t[i]));
    free(t);
    return 0;
}

static void push_id(cJSON *ids, int id) { cJSON_AddItemToArray(ids, cJSON_CreateNumber(id)); }

/* The FIM prompt as a JSON array of token ids.  extra: /infill's input_extra (NULL for /v1/completions);
 * mid: text after <FIM_MID> (NULL: none).  NULL with e filled. */
static cJSON *fim_prompt(struct tp_server *s, const cJSON *prefix, const cJSON *suffix, const cJSON *extra,
                         const cJSON *mid, const char *prefix_name, struct tp_api_error *e)
{
    int fim[TP_FIM_COUNT];
    if (!tp_tokenizer_fim(s->tok, fim)) {
        tp_api_err(e, TP_ERR_INVALID_ARG, prefix_name, "this model has no fill-in-the-middle tokens (GGUF "
                                         "tokenizer.ggml.fim_pre/suf/mid_token_id, or <|fim_prefix|> / <fim_prefix> / "
                                         "<PRE> tokens); serve a code model trained for infilling, such as "
                                         "Qwen2.5-Coder, StarCoder2 or CodeLlama");
        e->code = "fim_not_supported";
        return NULL;
    }
    cJSON *ids = cJSON_CreateArray();
    if (!ids) {
        tp_api_err(e, TP_ERR_NOMEM, NULL, "out of memory");
        return NULL;
    }
    int bos = tp_tokenizer_bos(s->tok);
    if (tp_tokenizer_add_bos(s->tok) && bos >= 0) push_id(ids, bos);
    if (extra && cJSON_GetArraySize(extra) > 0) {
        if (fim[TP_FIM_SEP] < 0) {
            tp_api_err(e, TP_ERR_INVALID_ARG, "input_extra", "'input_extra' needs the model's file separator token (<|file_sep|>), "
                                               "which this model does not have; leave input_extra out");
            goto fail;
        }
        if (fim[TP_FIM_REP] >= 0) {
            push_id(ids, fim[TP_FIM_REP]);
            cJSON *pn = cJSON_CreateString("project\n");
            int rc = push_text(s, pn, ids, e);
            cJSON_Delete(pn);
            if (rc) goto fail;
        }
        int i = 0;
        const cJSON *ch;
        cJSON_ArrayForEach(ch, extra)
        {
            const cJSON *fn = cJSON_IsObject(ch) ? field(ch, "filename") : NULL, *tx = field(ch, "text");
            if (!cJSON_IsString(tx) || (fn && !cJSON_IsString(fn))) {
                tp_api_err(e, TP_ERR_INVALID_ARG, "input_extra", "'input_extra'[%d] must be {\"filename\": string, \"text\": string}",
                            i);
                goto fail;
            }
            push_id(ids, fim[TP_FIM_SEP]);
            struct tp_buf b = {0};
            tp_buf_printf(&b, "%s\n%s", fn ? fn->valuestring : "", tx->valuestring);
            cJSON *t = cJSON_CreateString(b.data ? b.data : "");
            tp_buf_free(&b);
            int rc = push_text(s, t, ids, e);
            cJSON_Delete(t);
            if (rc) goto fail;
            i++;
        }
    }
    push_id(ids, fim[TP_FIM_PRE]);
    if (prefix && push_text(s, prefix, ids, e)) goto fail;
    push_id(ids, fim[TP_FIM_SUF]);
    if (suffix && push_text(s, suffix, ids, e)) goto fail;
    push_id(ids, fim[TP_FIM_MID]);
    if (mid && push_text(s, mid, ids, e)) goto fail;
    return ids;
fail:
    cJSON_Delete(ids);
    return NULL;
}

/* ------------------------------------------------------------ /v1/completions with suffix */

int tp_api_is_fim_completion(const char *body, size_t len)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    const cJSON *sf = root ? field(root, "suffix") : NULL;
    int yes = cJSON_IsString(sf) && sf->valuestring[0] != '\0';
    cJSON_Delete(root);
    return yes;
}

enum MHD_Result tp_api_completion_fim(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    struct tp_api_error e;
    cJSON *root = tp_json_parse(body, len, &e);
    if (!root) return tp_http_send_error(s, c, &e);
    const cJSON *prompt = field(root, "prompt");
    if (prompt && cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1 &&
        cJSON_IsString(cJSON_GetArrayItem(prompt, 0)))
        prompt = cJSON_GetArrayItem(prompt, 0);
    if (prompt && !cJSON_IsString(prompt)) {
        cJSON_Delete(root);
        tp_api_err(&e, TP_ERR_INVALID_ARG, "prompt", "with 'suffix' (fill-in-the-middle), 'prompt' must be a string (the text "
                                       "before the insertion point)");
        return tp_http_send_error(s, c, &e);
    }
    cJSON *ids = fim_prompt(s, prompt, field(root, "suffix"), NULL, NULL, "suffix", &e);
    if (!ids) {
        cJSON_Delete(root);
        return tp_http_send_error(s, c, &e);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(root, "suffix");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "prompt");
    cJSON_AddItemToObject(root, "prompt", ids);
    char *nb = tp_json_print(root);
    cJSON_Delete(root);
    if (!nb) {
        tp_api_err(&e, TP_ERR_NOMEM, NULL, "out of memory");
        return tp_http_send_error(s, c, &e);
    }
    enum MHD_Result ret = tp_api_handle_completion(s, c, 0, nb, strlen(nb));
    free(nb);
    return ret;
}

/* ------------------------------------------------------------ /infill */

static const char *stop_type(const struct tp_req *r)
{
    if (r->finish == TP_FINISH_LENGTH) return "limit";
    return r->stop_idx ? "word" : "eos";
}

static void add_final(struct tp_run *x, cJSON *o)
{
    const struct tp_req *r = x->r;
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "model", r->params.model ? r->params.model : x->s->model_id);
    cJSON_AddBoolToObject(o, "stop", 1);
    cJSON_AddStringToObject(o, "stop_type", stop_type(r));
    size_t sl = 0;
    const char *ss = tp_run_stop_string(r, &sl);
    tp_json_add_bytes(o, "stopping_word", ss, sl);
    cJSON_AddNumberToObject(o, "tokens_predicted", r->n_toks);
    cJSON_AddNumberToObject(o, "tokens_evaluated", r->n_prompt);
    cJSON_AddNumberToObject(o, "tokens_cached", r->n_cached);
    cJSON_AddBoolToObject(o, "truncated", 0);
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    uint64_t done = r->t_done_ns ? r->t_done_ns : tp_now_ns(), first = r->t_first_ns ? r->t_first_ns : done;
    double pms = (double)(first - r->t_submit_ns) / 1e6, gms = (double)(done - first) / 1e6;
    cJSON_AddNumberToObject(t, "prompt_n", r->n_prompt - r->n_cached);
    cJSON_AddNumberToObject(t, "prompt_ms", pms);
    cJSON_AddNumberToObject(t, "predicted_n", r->n_toks);
    cJSON_AddNumberToObject(t, "predicted_ms", gms);
}

static char *print_free(cJSON *o)
{
    char *j = tp_json_print(o);
    cJSON_Delete(o);
    return j;
}

static char *i_final(struct tp_run *x)
{
    cJSON *o = cJSON_CreateObject();
    tp_json_add_bytes(o, "content", x->r->text.data ? x->r->text.data : "", x->r->text.len);
    add_final(x, o);
    return print_free(o);
}

static void i_text(struct tp_run *x, const char *text, size_t n, struct tp_buf *out)
{
    (void)x;
    cJSON *o = cJSON_CreateObject();
    tp_json_add_bytes(o, "content", text, n);
    cJSON_AddBoolToObject(o, "stop", 0);
    char *j = print_free(o);
    if (j) tp_sse_data(out, j);
    free(j);
}

static void i_end(struct tp_run *x, struct tp_buf *out)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "content", "");
    add_final(x, o);
    char *j = print_free(o);
    if (j) tp_sse_data(out, j);
    free(j);
}

static void i_error(struct tp_run *x, const struct tp_api_error *e, struct tp_buf *out)
{
    (void)x;
    char *j = tp_api_error_json(e);
    if (j) tp_sse_data(out, j);
    free(j);
}

static void i_keepalive(struct tp_run *x, struct tp_buf *out)
{
    (void)x;
    tp_sse_comment(out, "keep-alive");
}

static char *i_error_json(const struct tp_api_error *e) { return tp_api_error_json(e); }

static const struct tp_run_ops infill_ops = {
    .path = "/infill",
    .id_prefix = "infill-",
    .stream_type = "text/event-stream",
    .text = i_text,
    .end = i_end,
    .error = i_error,
    .keepalive = i_keepalive,
    .final_json = i_final,
    .error_json = i_error_json,
};

enum MHD_Result tp_api_infill(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len)
{
    struct tp_api_error e;
    struct tp_req_params p;
    cJSON *root = tp_json_parse(body, len, &e);
    if (!root) return tp_run_send_error(s, c, &infill_ops, &e);
    cJSON *out = cJSON_CreateObject();
    /* llama-server's fields; the ones that tune its own cache, slots or response filtering change no token here */
    static const char *const known[] = {"input_prefix", "input_suffix", "input_extra", "prompt", "n_predict",
                                        "max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "stop",
                                        "stream", "repeat_penalty", "presence_penalty", "frequency_penalty",
                                        "model", "cache_prompt", "id_slot", "response_fields", "t_max_prompt_ms",
                                        "t_max_predict_ms", "samplers", "n_indent", "logit_bias", "ignore_eos"};
    const cJSON *kv;
    cJSON_ArrayForEach(kv, root)
    {
        int ok = 0;
        for (size_t i = 0; i < TP_ARRAY_LEN(known) && !ok; i++) ok = strcmp(kv->string, known[i]) == 0;
        if (!ok) {
            tp_api_err(&e, TP_ERR_INVALID_ARG, kv->string, "'%.60s' is not a field of /infill that this server serves", kv->string);
            goto fail;
        }
    }
    /* fields whose non-default values would change the answer and are not implemented */
    const cJSON *v = field(root, "n_indent");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 0)) {
        tp_api_err(&e, TP_ERR_INVALID_ARG, "n_indent", "'n_indent' is not supported by this server; leave it out");
        goto fail;
    }
    static const char *const strs[] = {"input_prefix", "input_suffix", "prompt"};
    for (int i = 0; i < 3; i++) {
        v = field(root, strs[i]);
        if (v && !cJSON_IsString(v)) {
            tp_api_err(&e, TP_ERR_INVALID_ARG, strs[i], "'%s' must be a string", strs[i]);
            goto fail;
        }
    }
    v = field(root, "input_extra");
    if (v && !cJSON_IsArray(v)) {
        tp_api_err(&e, TP_ERR_INVALID_ARG, "input_extra", "'input_extra' must be a list of {\"filename\", \"text\"}");
        goto fail;
    }
    cJSON *ids = fim_prompt(s, field(root, "input_prefix"), field(root, "input_suffix"), v, field(root, "prompt"),
                            "input_prefix", &e);
    if (!ids) goto fail;
    cJSON_AddItemToObject(out, "prompt", ids);
    static const char *const pass[][2] = {
        {"temperature", "temperature"}, {"top_k", "top_k"}, {"top_p", "top_p"}, {"min_p", "min_p"}, {"seed", "seed"},
        {"stop", "stop"}, {"stream", "stream"}, {"repeat_penalty", "repetition_penalty"},
        {"presence_penalty", "presence_penalty"}, {"frequency_penalty", "frequency_penalty"}, {"model", "model"},
        {"logit_bias", "logit_bias"}, {"ignore_eos", "ignore_eos"}, {"max_tokens", "max_tokens"}};
    for (size_t i = 0; i < TP_ARRAY_LEN(pass); i++)
        if ((v = field(root, pass[i][0]))) cJSON_AddItemToObject(out, pass[i][1], cJSON_Duplicate(v, 1));
    v = field(root, "n_predict");
    if (v) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1 || v->valuedouble == -1)) {
            tp_api_err(&e, TP_ERR_INVALID_ARG, "n_predict", "'n_predict' must be a positive integer, or -1 for no limit");
            goto fail;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(out, "max_tokens");
        if (v->valuedouble >= 1) cJSON_AddNumberToObject(out, "max_tokens", v->valuedouble);
    }
    static const char *const rename[][2] = {{"repetition_penalty", "repeat_penalty"}, {"max_tokens", "n_predict"},
                                            {NULL, NULL}};
    if (tp_run_parse_chat(s, out, rename, &p, &e)) goto fail;
    cJSON_Delete(out);
    cJSON_Delete(root);
    return tp_run_request(s, c, &infill_ops, &p, NULL, 0, "n_predict", NULL, NULL);
fail:
    cJSON_Delete(out);
    cJSON_Delete(root);
    return tp_run_send_error(s, c, &infill_ops, &e);
}

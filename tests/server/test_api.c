/*
 * tests/server/test_api.c - request contents end to end with `tpserve serve`
 * on the bundled stories260K model (127.0.0.1, free port):
 *   nul         NUL (\u0000) in prompts, chat contents, stop strings and
 *               generated / detokenized text is an ordinary byte: the same
 *               token ids as the tokenizer on the raw bytes, a stop string
 *               "the\u0000zzz" that does not stop at "the", output escaped as
 *               \u0000; a role or model name holding NUL gets 400 naming it.
 *   fields      every OpenAI field this server does not implement gets 400
 *               naming it; seeds up to 2^64 - 1 are accepted.
 *   defaults_props  server-wide generation defaults on every API, GET /props, the ChatML
 *               fallback, text parts, the first stream chunk, system_fingerprint across
 *               two starts, context_length_exceeded in each API's shape (see the test).
 *   logit_bias  at 1 and 2 ranks (full logits gather, distributed argmax; /props
 *               counts the ranks, one fingerprint):
 *               banning the greedy run's first token changes it, +100 forces
 *               a token, banning 511 of 512 leaves only the allowed one, and
 *               2 ranks answer what 1 rank answers.
 * Oracles are the model's own tokenizer (tp_tokenizer_from_gguf) and
 * detokenizer run in this process.  Responses are parsed with the server's
 * NUL-keeping JSON reader (tp_json_parse / tp_json_bytes).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "e2e_impl.h"
#include "model/gguf.h"
#include "model/model.h"
#include "server/server_impl.h"
#include "tp_test.h"

static const char *model_path(void)
{
    const char *p = tp_test_repo_path("models/stories260K.gguf");
    if (access(p, R_OK) != 0) {
        tp_test_skip("models/stories260K.gguf missing");
        return NULL;
    }
    return p;
}

/* POST json; returns the parsed body (NUL kept) or NULL; *status set. */
static cJSON *post(int port, const char *path, const char *json, int *status)
{
    struct resp r;
    *status = 0;
    if (http_post(port, path, json, &r) != 0) return NULL;
    *status = r.status;
    struct tp_api_error e;
    cJSON *root = tp_json_parse(r.body, r.body_len, &e);
    if (!root) fprintf(stderr, "%s: unparsable response %d: %.300s\n", path, r.status, r.body);
    resp_free(&r);
    return root;
}

/* Raw body of a POST (malloc'd) with its status. */
static char *post_raw(int port, const char *path, const char *json, int *status)
{
    struct resp r;
    *status = 0;
    if (http_post(port, path, json, &r) != 0) return NULL;
    *status = r.status;
    char *b = r.body;
    r.body = NULL;
    resp_free(&r);
    return b;
}

/* choices[0].text (chat: message.content) as bytes; malloc'd or NULL. */
static char *choice_text(const cJSON *root, int chat, size_t *len)
{
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
    const cJSON *t = chat ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "message"), "content")
                          : cJSON_GetObjectItemCaseSensitive(ch, "text");
    char *out = NULL;
    *len = 0;
    if (!cJSON_IsString(t) || tp_json_bytes(t, &out, len) != 0) return NULL;
    return out;
}

static int usage_prompt_tokens(const cJSON *root)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    return cJSON_IsNumber(n) ? n->valueint : -1;
}

static const char *error_param(const cJSON *root)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "error"), "param");
    return cJSON_IsString(p) ? p->valuestring : "";
}

/* Token ids of text[0..len) (BOS as the server adds it); returns the count. */
static int encode(const tp_tokenizer_t *t, const char *text, size_t len, int32_t *ids, int cap)
{
    return tp_tokenizer_encode(t, text, len, tp_tokenizer_add_bos(t), 1, ids, cap);
}

static void ids_json(const int32_t *ids, int n, struct tp_buf *b)
{
    tp_buf_puts(b, "[");
    for (int i = 0; i < n; i++) tp_buf_printf(b, "%s%d", i ? "," : "", ids[i]);
    tp_buf_puts(b, "]");
}

/* The byte token whose piece is the single byte 0 (<0x00>), or -1. */
static int nul_token(const tp_tokenizer_t *t)
{
    for (int i = 0; i < tp_tokenizer_n_vocab(t); i++) {
        size_t l = 0;
        const char *p = tp_tokenizer_piece(t, i, &l);
        if (l == 1 && p[0] == '\0') return i;
    }
    return -1;
}

static cJSON *call(int port, const char *method, const char *path, const char *json, const char *key, int *status);
static double num_at(const cJSON *o, const char *path);
static const char *str_at(const cJSON *o, const char *path);

/* ------------------------------------------------------------ NUL */

/* 1. prompt: the ids of the raw bytes (the NUL byte token among them), same reply as those ids; /tokenize
 * gives the same ids */
static void nul_prompt(int port, tp_tokenizer_t *tok, int nul_id)
{
    int st = 0;
    int32_t ids[256];
    struct tp_buf b = {0};
    static const char raw[] = "Once upon\0 a time";
    const size_t raw_len = sizeof raw - 1;
    int n = encode(tok, raw, raw_len, ids, 256);
    CU_ASSERT(n > 3 && n <= 256);
    if (!(n > 3 && n <= 256)) return; /* (the server must be stopped: no FATAL after srv_start) */
    int has_nul = 0;
    for (int i = 0; i < n; i++) has_nul |= ids[i] == nul_id;
    CU_ASSERT(has_nul);
    int32_t cut[64];
    CU_ASSERT(encode(tok, raw, strlen(raw), cut, 64) < n); /* a truncated prompt has fewer tokens */
    cJSON *a = post(port, "/v1/completions",
                    "{\"prompt\":\"Once upon\\u0000 a time\",\"max_tokens\":12,\"temperature\":0}", &st);
    CU_ASSERT_EQUAL(st, 200);
    CU_ASSERT_EQUAL(usage_prompt_tokens(a), n);
    tp_buf_puts(&b, "{\"prompt\":");
    ids_json(ids, n, &b);
    tp_buf_puts(&b, ",\"max_tokens\":12,\"temperature\":0}");
    cJSON *c = post(port, "/v1/completions", b.data, &st);
    CU_ASSERT_EQUAL(st, 200);
    size_t la = 0, lc = 0;
    char *ta = choice_text(a, 0, &la), *tc = choice_text(c, 0, &lc);
    CU_ASSERT_PTR_NOT_NULL(ta);
    CU_ASSERT(ta && tc && la == lc && memcmp(ta, tc, la) == 0 && la > 10);
    free(ta);
    free(tc);
    cJSON_Delete(a);
    cJSON_Delete(c);
    a = post(port, "/tokenize", "{\"content\":\"Once upon\\u0000 a time\",\"add_special\":true}", &st);
    CU_ASSERT_EQUAL(st, 200);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(a, "tokens");
    CU_ASSERT_EQUAL(cJSON_GetArraySize(arr), n);
    for (int i = 0; i < n && i < cJSON_GetArraySize(arr); i++)
        CU_ASSERT_EQUAL(cJSON_GetArrayItem(arr, i)->valueint, ids[i]);
    cJSON_Delete(a);
    tp_buf_free(&b);
}

/* 2. chat content: ChatML (no template in the model: llama-server's fallback), NUL as a raw byte; 3. names
 * that cannot hold NUL: 400 naming the field */
static void nul_chat(int port, tp_tokenizer_t *tok)
{
    int st = 0;
    int32_t ids[256];
    struct tp_buf b = {0};
    static const char chat_raw[] = "<|im_start|>user\nOnce upon\0 a time<|im_end|>\n<|im_start|>assistant\n";
    int n = encode(tok, chat_raw, sizeof chat_raw - 1, ids, 256);
    cJSON *a = post(port, "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon\\u0000 a time\"}],\"max_tokens\":10,"
             "\"temperature\":0}", &st);
    CU_ASSERT_EQUAL(st, 200);
    CU_ASSERT_EQUAL(usage_prompt_tokens(a), n);
    tp_buf_puts(&b, "{\"prompt\":");
    ids_json(ids, n, &b);
    tp_buf_puts(&b, ",\"max_tokens\":10,\"temperature\":0}");
    cJSON *c = post(port, "/v1/completions", b.data, &st);
    size_t la = 0, lc = 0;
    char *ta = choice_text(a, 1, &la), *tc = choice_text(c, 0, &lc);
    CU_ASSERT(ta && tc && la == lc && memcmp(ta, tc, la) == 0);
    free(ta);
    free(tc);
    cJSON_Delete(a);
    cJSON_Delete(c);
    tp_buf_free(&b);

    a = post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\\u0000\",\"content\":\"hi\"}]}", &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_STRING_EQUAL(error_param(a), "messages[0].role");
    cJSON_Delete(a);
    a = post(port, "/v1/completions", "{\"prompt\":\"hi\",\"model\":\"stories\\u0000x\"}", &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_STRING_EQUAL(error_param(a), "model");
    cJSON_Delete(a);
}

/* 4. stop "the\u0000zzz" does not stop at "the"; "the" does */
static void nul_stop(int port)
{
    int st = 0;
    size_t la = 0, lc = 0;
    const char *q = "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0%s}";
    char body[256];
    snprintf(body, sizeof body, q, "");
    cJSON *a = post(port, "/v1/completions", body, &st);
    char *free_text = choice_text(a, 0, &la);
    cJSON_Delete(a);
    CU_ASSERT_PTR_NOT_NULL(free_text);
    if (!free_text) return;
    const char *the = strstr(free_text, "the");
    CU_ASSERT_PTR_NOT_NULL(the); /* the oracle must contain "the" to test anything */
    snprintf(body, sizeof body, q, ",\"stop\":\"the\\u0000zzz\"");
    a = post(port, "/v1/completions", body, &st);
    CU_ASSERT_EQUAL(st, 200);
    char *ta = choice_text(a, 0, &lc);
    CU_ASSERT(ta && lc == la && memcmp(ta, free_text, la) == 0);
    free(ta);
    cJSON_Delete(a);
    snprintf(body, sizeof body, q, ",\"stop\":[\"zz\",\"the\"]");
    a = post(port, "/v1/completions", body, &st);
    ta = choice_text(a, 0, &lc);
    CU_ASSERT(ta && the && lc == (size_t)(the - free_text) && memcmp(ta, free_text, lc) == 0);
    free(ta);
    cJSON_Delete(a);
    free(free_text);
}

/* 5. /detokenize with the <0x00> byte token: the whole text, NUL escaped */
static void nul_detokenize(int port, tp_tokenizer_t *tok, int nul_id)
{
    int st = 0;
    int32_t ids[256];
    struct tp_buf b = {0};
    int nh = tp_tokenizer_encode(tok, "Hi", 2, 0, 0, ids, 64);
    int nt = tp_tokenizer_encode(tok, " there", 6, 0, 0, ids + nh + 1, 64);
    CU_ASSERT(nh > 0 && nt > 0);
    if (!(nh > 0 && nt > 0)) return;
    ids[nh] = nul_id;
    const int n = nh + 1 + nt;
    tp_detok_t *d = NULL;
    CU_ASSERT_EQUAL(tp_detok_init(tok, &d), TP_OK);
    if (!d) return;
    char want[256];
    size_t wl = 0;
    for (int i = 0; i < n; i++) wl += tp_detok_push(d, ids[i], want + wl, sizeof want - wl);
    wl += tp_detok_flush(d, want + wl, sizeof want - wl);
    tp_detok_free(d);
    CU_ASSERT(wl > 5 && memchr(want, '\0', wl) != NULL);
    tp_buf_puts(&b, "{\"tokens\":");
    ids_json(ids, n, &b);
    tp_buf_puts(&b, "}");
    char *rawresp = post_raw(port, "/detokenize", b.data, &st);
    CU_ASSERT_EQUAL(st, 200);
    CU_ASSERT_PTR_NOT_NULL(rawresp && strstr(rawresp, "\\u0000"));
    cJSON *a = rawresp ? tp_json_parse(rawresp, strlen(rawresp), &(struct tp_api_error){0}) : NULL;
    char *got = NULL;
    size_t gl = 0;
    CU_ASSERT_EQUAL(tp_json_bytes(cJSON_GetObjectItemCaseSensitive(a, "content"), &got, &gl), 0);
    CU_ASSERT(gl == wl && memcmp(got, want, wl) == 0);
    free(got);
    cJSON_Delete(a);
    free(rawresp);
    tp_buf_free(&b);
}

/* 6. generated NUL bytes (the <0x00> token forced by logit_bias): escaped, not cut, streamed too */
static void nul_generated(int port, int nul_id)
{
    int st = 0;
    size_t la = 0;
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"Once\",\"max_tokens\":3,\"temperature\":0,\"logprobs\":1,"
                                "\"logit_bias\":{\"%d\":100}}", nul_id);
    cJSON *a = post(port, "/v1/completions", body, &st);
    CU_ASSERT_EQUAL(st, 200);
    char *ta = choice_text(a, 0, &la);
    CU_ASSERT(ta && la == 3 && memcmp(ta, "\0\0\0", 3) == 0);
    free(ta);
    /* logprobs tokens: the one-byte piece, not "" */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(a, "choices"), 0), "logprobs"),
        "tokens");
    CU_ASSERT_EQUAL(cJSON_GetArraySize(lt), 3);
    char *pc = NULL;
    size_t pl = 0;
    CU_ASSERT_EQUAL(tp_json_bytes(cJSON_GetArrayItem(lt, 0), &pc, &pl), 0);
    CU_ASSERT(pl == 1 && pc && pc[0] == '\0');
    free(pc);
    cJSON_Delete(a);
    /* /tokenize with pieces: the <0x00> token's piece is "\u0000" */
    char *rawresp = post_raw(port, "/tokenize", "{\"content\":\"a\\u0000b\",\"with_pieces\":true}", &st);
    CU_ASSERT_EQUAL(st, 200);
    snprintf(body, sizeof body, "{\"id\":%d,\"piece\":\"\\u0000\"}", nul_id);
    CU_ASSERT_PTR_NOT_NULL(rawresp && strstr(rawresp, body));
    free(rawresp);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2,"
                                "\"temperature\":0,\"stream\":true,\"logit_bias\":{\"%d\":100}}", nul_id);
    rawresp = post_raw(port, "/v1/chat/completions", body, &st);
    CU_ASSERT_EQUAL(st, 200);
    CU_ASSERT_PTR_NOT_NULL(rawresp && strstr(rawresp, "\"content\":\"\\u0000\""));
    CU_ASSERT_PTR_NOT_NULL(rawresp && strstr(rawresp, "data: [DONE]"));
    free(rawresp);
}

/* NUL bytes in prompts, chat content, names, stop strings, /detokenize and generated text. */
static void test_nul(void)
{
    const char *mp = model_path();
    if (!mp) return;
    tp_tokenizer_t *tok = NULL;
    struct tp_error err;
    CU_ASSERT_EQUAL_FATAL(tp_tokenizer_from_gguf(mp, &tok, &err), TP_OK);
    const int nul_id = nul_token(tok);
    CU_ASSERT_FATAL(nul_id >= 0);
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, NULL), 0);
    nul_prompt(s.port, tok, nul_id);
    nul_chat(s.port, tok);
    nul_stop(s.port);
    nul_detokenize(s.port, tok, nul_id);
    nul_generated(s.port, nul_id);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
    tp_tokenizer_free(tok);
}

/* ------------------------------------------------------------ refused fields, seed */

static void test_fields(void)
{
    if (!model_path()) return;
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, NULL), 0);
    static const char *const refused[][2] = {
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"integer\",\"minimum\":1}}}", "response_format.json_schema.schema"},
        {"\"response_format\":{\"type\":\"json_schema\"}", "response_format.json_schema"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\",\"parameters\":{}}}],\"tool_choice\":\"required\"", "tools"},
        {"\"tool_choice\":\"required\"", "tool_choice"},
        {"\"functions\":[{\"name\":\"f\"}]", "functions"},
        {"\"function_call\":{\"name\":\"f\"}", "function_call"},
        {"\"echo\":true", "echo"},
        {"\"best_of\":3", "best_of"},
        {"\"suffix\":\" the end\"", "suffix"},
        {"\"n\":2", "n"},
        {"\"logit_bias\":{\"512\":1}", "logit_bias"},
        {"\"logit_bias\":{\"5\":-101}", "logit_bias"},
        {"\"logit_bias\":{\"x\":1}", "logit_bias"},
        {"\"seed\":18446744073709551616", "seed"},
    };
    char body[512];
    int st = 0;
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        for (int chat = 0; chat < 2; chat++) {
            if (chat) snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}", refused[i][0]);
            else snprintf(body, sizeof body, "{\"prompt\":\"hi\",%s}", refused[i][0]);
            cJSON *a = post(s.port, chat ? "/v1/chat/completions" : "/v1/completions", body, &st);
            if (st != 400 || strcmp(error_param(a), refused[i][1]) != 0)
                fprintf(stderr, "%s: status %d param '%s', want 400 '%s'\n", body, st, error_param(a), refused[i][1]);
            CU_ASSERT_EQUAL(st, 400);
            CU_ASSERT_STRING_EQUAL(error_param(a), refused[i][1]);
            cJSON_Delete(a);
        }
    }
    /* accepted: seeds 2^63 and 2^64 - 1 (the same seed twice gives the same sample), default-valued fields */
    static const char *const ok[] = {
        "{\"prompt\":\"Once\",\"max_tokens\":16,\"seed\":9223372036854775808}",
        "{\"prompt\":\"Once\",\"max_tokens\":16,\"seed\":18446744073709551615}",
        "{\"prompt\":\"Once\",\"max_tokens\":4,\"echo\":false,\"best_of\":1,\"n\":1,\"suffix\":\"\",\"tools\":[],"
        "\"response_format\":{\"type\":\"text\"},\"tool_choice\":\"none\",\"user\":\"u\",\"metadata\":{},"
        "\"store\":false}",
    };
    for (int i = 0; i < 3; i++) {
        char *first = NULL;
        size_t fl = 0;
        for (int rep = 0; rep < 2; rep++) {
            cJSON *a = post(s.port, "/v1/completions", ok[i], &st);
            if (st != 200) fprintf(stderr, "%s: status %d\n", ok[i], st);
            CU_ASSERT_EQUAL(st, 200);
            size_t l = 0;
            char *t = choice_text(a, 0, &l);
            if (rep == 0) {
                first = t;
                fl = l;
            } else {
                if (i < 2) CU_ASSERT(t && first && l == fl && memcmp(t, first, l) == 0);
                free(t);
            }
            cJSON_Delete(a);
        }
        free(first);
    }
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

/* ------------------------------------------------------------ logit_bias */

/* Generated token ids of a completion with logprobs (pieces mapped back to
 * ids through the vocabulary; every id with that piece when ambiguous is
 * returned in alt).  Returns the number of tokens. */
static int gen_pieces(const cJSON *root, char pieces[][64], int cap)
{
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "logprobs"), "tokens");
    int n = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, toks)
    {
        if (n == cap || !cJSON_IsString(t)) break;
        snprintf(pieces[n++], 64, "%s", t->valuestring);
    }
    return n;
}

/* Ids whose piece is p (bytes); returns how many (written to out). */
static int ids_of_piece(const tp_tokenizer_t *t, const char *p, int32_t *out, int cap)
{
    int n = 0;
    for (int i = 0; i < tp_tokenizer_n_vocab(t) && n < cap; i++) {
        size_t l = 0;
        const char *q = tp_tokenizer_piece(t, i, &l);
        if (l == strlen(p) && memcmp(q, p, l) == 0) out[n++] = i;
    }
    return n;
}

/* The completion text of body at port (malloc'd, may be NULL). */
static char *complete_text(int port, const char *body, size_t *len)
{
    int st = 0;
    cJSON *a = post(port, "/v1/completions", body, &st);
    if (st != 200) fprintf(stderr, "%s: status %d\n", body, st);
    CU_ASSERT_EQUAL(st, 200);
    char *t = choice_text(a, 0, len);
    cJSON_Delete(a);
    return t;
}

struct job {
    int port;
    const char *body;
    char *text;
    size_t len;
    int status;
};

static void *job_main(void *arg)
{
    struct job *j = arg;
    struct resp r;
    j->status = http_post(j->port, "/v1/completions", j->body, &r) == 0 ? r.status : 0;
    if (j->status) {
        struct tp_api_error e;
        cJSON *root = tp_json_parse(r.body, r.body_len, &e);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
        if (tp_json_bytes(cJSON_GetObjectItemCaseSensitive(ch, "text"), &j->text, &j->len) != 0) j->text = NULL;
        cJSON_Delete(root);
        resp_free(&r);
    }
    return NULL;
}

/* Requests with different biases decoded in the same steps: each row gets
 * its own bias (forced, unbiased, 511 banned), the unbiased one answers what
 * it answers alone. */
static void check_concurrent_rows(int port, int lily, const char *ban511)
{
    char forced[256];
    char plain[] = "{\"prompt\":\"Once upon a time\",\"max_tokens\":48,\"temperature\":0,\"ignore_eos\":true}";
    snprintf(forced, sizeof forced, "{\"prompt\":\"Once upon a time\",\"max_tokens\":48,\"temperature\":0,"
                                    "\"ignore_eos\":true,\"logit_bias\":{\"%d\":100}}", lily);
    size_t nb = strlen(ban511) + 128;
    char *banned = malloc(nb);
    CU_ASSERT_PTR_NOT_NULL_FATAL(banned);
    snprintf(banned, nb, "{\"prompt\":\"Once upon a time\",\"max_tokens\":48,\"temperature\":0,"
                         "\"ignore_eos\":true,%s}", ban511);
    struct job solo = {port, plain, NULL, 0, 0};
    job_main(&solo);
    struct job jobs[6];
    pthread_t th[6];
    for (int i = 0; i < 6; i++) {
        jobs[i] = (struct job){port, i % 3 == 0 ? forced : i % 3 == 1 ? plain : banned, NULL, 0, 0};
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, job_main, &jobs[i]), 0);
    }
    for (int i = 0; i < 6; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 6; i++) {
        CU_ASSERT_EQUAL(jobs[i].status, 200);
        const char *want = i % 3 == 0 ? " Lily" : " happy";
        if (i % 3 == 1) {
            CU_ASSERT(solo.text && jobs[i].text && jobs[i].len == solo.len &&
                      memcmp(jobs[i].text, solo.text, solo.len) == 0);
        } else {
            int ok = jobs[i].text && jobs[i].len == 48 * strlen(want);
            for (size_t k = 0; ok && k < 48; k++) ok = memcmp(jobs[i].text + k * strlen(want), want, strlen(want)) == 0;
            if (!ok) fprintf(stderr, "concurrent job %d: '%.80s'\n", i, jobs[i].text ? jobs[i].text : "(null)");
            CU_ASSERT(ok);
        }
        free(jobs[i].text);
    }
    free(solo.text);
    free(banned);
}

static void test_logit_bias(void)
{
    const char *mp = model_path();
    if (!mp) return;
    tp_tokenizer_t *tok = NULL;
    struct tp_error err;
    CU_ASSERT_EQUAL_FATAL(tp_tokenizer_from_gguf(mp, &tok, &err), TP_OK);
    const int V = tp_tokenizer_n_vocab(tok);
    CU_ASSERT_EQUAL_FATAL(V, 512);
    int32_t cat[4], dog[4]; /* a token to force, the one left when 511 are banned */
    CU_ASSERT_FATAL(ids_of_piece(tok, " Lily", cat, 4) == 1);
    CU_ASSERT_FATAL(ids_of_piece(tok, " happy", dog, 4) == 1);
    struct srv s1, s2;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s1, 1, NULL), 0);
    if (srv_start(&s2, 2, NULL) != 0) {
        CU_FAIL("2-rank server did not start");
        srv_stop(&s1);
        tp_tokenizer_free(tok);
        return;
    }
    int st = 0;
    /* /props at 1 and 2 ranks: the ranks counted, one system_fingerprint (build + model, not the layout) */
    cJSON *p1 = call(s1.port, "GET", "/props", NULL, NULL, &st), *p2 = call(s2.port, "GET", "/props", NULL, NULL, &st);
    CU_ASSERT_EQUAL(num_at(p1, "model_meta.n_ranks"), 1);
    CU_ASSERT_EQUAL(num_at(p2, "model_meta.n_ranks"), 2);
    CU_ASSERT_EQUAL(strncmp(str_at(p1, "system_fingerprint"), "fp_", 3), 0);
    CU_ASSERT_STRING_EQUAL(str_at(p1, "system_fingerprint"), str_at(p2, "system_fingerprint"));
    cJSON_Delete(p1);
    cJSON_Delete(p2);
    const char *prompt = "\"prompt\":\"Once upon a time\",\"max_tokens\":8";
    char body[16384];
    char pieces[16][64];
    /* the unbiased greedy run's first token */
    snprintf(body, sizeof body, "{%s,\"temperature\":0,\"logprobs\":1}", prompt);
    struct tp_buf lb = {0};
    cJSON *a = post(s1.port, "/v1/completions", body, &st);
    CU_ASSERT_EQUAL(st, 200);
    int np = gen_pieces(a, pieces, 16);
    cJSON_Delete(a);
    CU_ASSERT(np == 8);
    char first0[64];
    snprintf(first0, sizeof first0, "%s", np > 0 ? pieces[0] : "");
    int32_t ban[8];
    int nban = ids_of_piece(tok, first0, ban, 8);
    CU_ASSERT(nban >= 1);
    if (np != 8 || nban < 1) goto out; /* (servers must be stopped: no FATAL from here on) */

    /* ban it: a different first token, on both layouts, with and without logprobs (gather vs argmax at 2 ranks) */
    tp_buf_puts(&lb, "\"logit_bias\":{");
    for (int i = 0; i < nban; i++) tp_buf_printf(&lb, "%s\"%d\":-100", i ? "," : "", ban[i]);
    tp_buf_puts(&lb, "}");
    snprintf(body, sizeof body, "{%s,\"temperature\":0,\"logprobs\":1,%s}", prompt, lb.data);
    a = post(s1.port, "/v1/completions", body, &st);
    CU_ASSERT_EQUAL(st, 200);
    np = gen_pieces(a, pieces, 16);
    cJSON_Delete(a);
    CU_ASSERT(np >= 1 && strcmp(pieces[0], first0) != 0);
    snprintf(body, sizeof body, "{%s,\"temperature\":0,%s}", prompt, lb.data);
    size_t l1 = 0, l2 = 0, l3 = 0;
    char *t1 = complete_text(s1.port, body, &l1), *t2 = complete_text(s2.port, body, &l2);
    snprintf(body, sizeof body, "{%s,\"temperature\":0,\"logprobs\":1,%s}", prompt, lb.data);
    char *t3 = complete_text(s2.port, body, &l3);
    CU_ASSERT(t1 && t2 && t3 && l1 == l2 && l1 == l3 && memcmp(t1, t2, l1) == 0 && memcmp(t1, t3, l1) == 0);
    CU_ASSERT(t1 && strncmp(t1, first0, strlen(first0)) != 0);
    free(t1);
    free(t2);
    free(t3);

    /* force " Lily" (+100): every token is it, 1 and 2 ranks */
    char want[256] = "";
    for (int i = 0; i < 8; i++) strcat(want, " Lily");
    for (int world = 1; world <= 2; world++) {
        int port = world == 1 ? s1.port : s2.port;
        snprintf(body, sizeof body, "{%s,\"temperature\":0,\"logit_bias\":{\"%d\":100}}", prompt, cat[0]);
        t1 = complete_text(port, body, &l1);
        CU_ASSERT(t1 && l1 == strlen(want) && memcmp(t1, want, l1) == 0);
        free(t1);
        /* sampled at temperature 1.2 with a seed: still forced */
        snprintf(body, sizeof body, "{%s,\"temperature\":1.2,\"seed\":5,\"logit_bias\":{\"%d\":100}}", prompt, cat[0]);
        t1 = complete_text(port, body, &l1);
        CU_ASSERT(t1 && l1 == strlen(want) && memcmp(t1, want, l1) == 0);
        free(t1);
    }

    /* ban 511 of 512: only the allowed token, greedy and sampled, 1 and 2 ranks */
    lb.len = 0;
    tp_buf_puts(&lb, "\"logit_bias\":{");
    for (int i = 0, k = 0; i < V; i++)
        if (i != dog[0]) tp_buf_printf(&lb, "%s\"%d\":-100", k++ ? "," : "", i);
    tp_buf_puts(&lb, "}");
    want[0] = '\0';
    for (int i = 0; i < 8; i++) strcat(want, " happy");
    for (int world = 1; world <= 2; world++) {
        for (int sampled = 0; sampled < 2; sampled++) {
            snprintf(body, sizeof body, "{%s,%s,%s}", prompt,
                     sampled ? "\"temperature\":1.0,\"top_p\":0.9,\"seed\":11" : "\"temperature\":0", lb.data);
            t1 = complete_text(world == 1 ? s1.port : s2.port, body, &l1);
            if (!(t1 && l1 == strlen(want) && memcmp(t1, want, l1) == 0))
                fprintf(stderr, "ban 511 (world %d, sampled %d): '%s'\n", world, sampled, t1 ? t1 : "(null)");
            CU_ASSERT(t1 && l1 == strlen(want) && memcmp(t1, want, l1) == 0);
            free(t1);
        }
    }
    check_concurrent_rows(s1.port, cat[0], lb.data);
    check_concurrent_rows(s2.port, cat[0], lb.data);
    /* banning all 512 is refused */
    lb.len = 0;
    tp_buf_puts(&lb, "{\"prompt\":\"a\",\"logit_bias\":{");
    for (int i = 0; i < V; i++) tp_buf_printf(&lb, "%s\"%d\":-100", i ? "," : "", i);
    tp_buf_puts(&lb, "}}");
    a = post(s2.port, "/v1/completions", lb.data, &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_STRING_EQUAL(error_param(a), "logit_bias");
    cJSON_Delete(a);
out:
    tp_buf_free(&lb);
    CU_ASSERT_EQUAL(srv_stop(&s2), 0);
    CU_ASSERT_EQUAL(srv_stop(&s1), 0);
    tp_tokenizer_free(tok);
}


/* ------------------------------------------------------------ server defaults, /props, fingerprint */

/* A request carrying the API key "k" (NULL key: none); the parsed body (NUL kept) or NULL; *status set. */
static cJSON *call(int port, const char *method, const char *path, const char *json, const char *key, int *status)
{
    struct resp r;
    char hdr[128] = "";
    if (key) snprintf(hdr, sizeof hdr, "Authorization: Bearer %s\r\nContent-Type: application/json\r\n", key);
    *status = 0;
    if (http_do(port, method, path, hdr, json, json ? strlen(json) : 0, 60, &r) != 0) return NULL;
    *status = r.status;
    struct tp_api_error e;
    cJSON *root = r.body_len ? tp_json_parse(r.body, r.body_len, &e) : NULL;
    if (!root && r.body_len) fprintf(stderr, "%s: unparsable response %d: %.300s\n", path, r.status, r.body);
    resp_free(&r);
    return root;
}

/* The value at a dotted path ("choices.0.message.content"); NULL when absent. */
static const cJSON *at(const cJSON *o, const char *path)
{
    char key[64];
    while (o && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        o = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, atoi(key)) : cJSON_GetObjectItemCaseSensitive(o, key);
        path += n + (path[n] == '.');
    }
    return o;
}
static double num_at(const cJSON *o, const char *path)
{
    const cJSON *v = at(o, path);
    return cJSON_IsNumber(v) ? v->valuedouble : -12345;
}
static const char *str_at(const cJSON *o, const char *path)
{
    const cJSON *v = at(o, path);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* GET /props of the server started with the flags of test_defaults_props; fp: its system_fingerprint. */
static void props_flags(int port, const char *mp, const tp_tokenizer_t *tok, char *fp, size_t fp_cap)
{
    tp_gguf_t *g = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(mp, &g, &err), TP_OK);
    int64_t ctx_train = 0;
    CU_ASSERT_EQUAL(tp_gguf_get_int(g, "llama.context_length", &ctx_train), TP_OK);
    tp_gguf_close(g);
    int st = 0;
    cJSON *pr = call(port, "GET", "/props", NULL, NULL, &st);
    CU_ASSERT_EQUAL(st, 401);
    cJSON_Delete(pr);
    pr = call(port, "GET", "/props", NULL, "k", &st);
    CU_ASSERT_EQUAL_FATAL(st, 200);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.n_ctx"), 256);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.temperature"), 0);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.seed"), 7);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.top_k"), 5);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.top_p"), 0.9);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.min_p"), 0.05);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.repeat_penalty"), 1.1);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.n_predict"), 6);
    CU_ASSERT_STRING_EQUAL(str_at(pr, "default_generation_settings.params_from.temperature"), "command line");
    CU_ASSERT_EQUAL(num_at(pr, "total_slots"), 3);
    CU_ASSERT_STRING_EQUAL(str_at(pr, "model_alias"), "tiny");
    CU_ASSERT_STRING_EQUAL(str_at(pr, "model_path"), mp);
    CU_ASSERT_STRING_EQUAL(str_at(pr, "chat_template"), "chatml");
    CU_ASSERT_PTR_NOT_NULL(strstr(str_at(pr, "chat_template_source"), "fallback"));
    CU_ASSERT_STRING_EQUAL(str_at(pr, "model_meta.architecture"), "llama");
    CU_ASSERT_EQUAL(num_at(pr, "model_meta.n_vocab"), tp_tokenizer_n_vocab(tok));
    CU_ASSERT_EQUAL(num_at(pr, "model_meta.n_ctx_train"), (double)ctx_train);
    CU_ASSERT_EQUAL(strncmp(str_at(pr, "build_info"), "b", 1), 0);
    snprintf(fp, fp_cap, "%s", str_at(pr, "system_fingerprint"));
    CU_ASSERT_EQUAL(strlen(fp), 13u);
    CU_ASSERT_EQUAL(strncmp(fp, "fp_", 3), 0);
    cJSON_Delete(pr);
}

/* No temperature and no limit == temperature 0 and 6 tokens on every API; Ollama's num_predict -1 wins over
 * -n 6; a sampled request without a seed takes --seed 7. */
static void defaults_every_api(int port, const char *fp)
{
    int st = 0;
    static const char msgs[] = "[{\"role\":\"user\",\"content\":\"Once upon a time\"}]";
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\":%s,\"temperature\":0,\"max_tokens\":6}", msgs);
    cJSON *ref = call(port, "POST", "/v1/chat/completions", body, "k", &st);
    CU_ASSERT_EQUAL_FATAL(st, 200);
    char want[512];
    snprintf(want, sizeof want, "%s", str_at(ref, "choices.0.message.content"));
    CU_ASSERT(strlen(want) > 0);
    CU_ASSERT_STRING_EQUAL(str_at(ref, "system_fingerprint"), fp);
    cJSON_Delete(ref);
    struct {
        const char *path, *body, *text, *n_out;
    } apis[] = {
        {"/v1/chat/completions", "{\"messages\":%s}", "choices.0.message.content", "usage.completion_tokens"},
        {"/v1/responses", "{\"input\":\"Once upon a time\"}", "output.0.content.0.text", "usage.output_tokens"},
        {"/v1/messages", "{\"model\":\"tiny\",\"max_tokens\":6,\"messages\":%s}", "content.0.text", "usage.output_tokens"},
        {"/api/chat", "{\"model\":\"tiny\",\"stream\":false,\"messages\":%s}", "message.content", "eval_count"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(apis); i++) {
        snprintf(body, sizeof body, apis[i].body, msgs);
        cJSON *a = call(port, "POST", apis[i].path, body, "k", &st);
        CU_ASSERT_EQUAL(st, 200);
        if (strcmp(str_at(a, apis[i].text), want) != 0 || num_at(a, apis[i].n_out) != 6)
            fprintf(stderr, "%s: '%s' (%g tokens), want '%s' (6)\n", apis[i].path, str_at(a, apis[i].text),
                    num_at(a, apis[i].n_out), want);
        CU_ASSERT_STRING_EQUAL(str_at(a, apis[i].text), want);
        CU_ASSERT_EQUAL(num_at(a, apis[i].n_out), 6);
        cJSON_Delete(a);
    }
    /* Ollama's num_predict -1 asks for no limit: the request's field wins over -n 6 */
    snprintf(body, sizeof body, "{\"model\":\"tiny\",\"stream\":false,\"messages\":%s,\"options\":{\"num_predict\":-1}}",
             msgs);
    cJSON *ol = call(port, "POST", "/api/chat", body, "k", &st);
    CU_ASSERT_EQUAL(st, 200);
    CU_ASSERT(num_at(ol, "eval_count") > 6);
    CU_ASSERT_EQUAL(strncmp(str_at(ol, "message.content"), want, strlen(want)), 0);
    cJSON_Delete(ol);
    cJSON *c1 = call(port, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\"}", "k", &st);
    cJSON *c2 = call(port, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\",\"temperature\":0,\"max_tokens\":6}",
                     "k", &st);
    CU_ASSERT_STRING_EQUAL(str_at(c1, "choices.0.text"), str_at(c2, "choices.0.text"));
    CU_ASSERT_EQUAL(num_at(c1, "usage.completion_tokens"), 6);
    CU_ASSERT_STRING_EQUAL(str_at(c1, "system_fingerprint"), fp);
    cJSON_Delete(c1);
    cJSON_Delete(c2);
    /* the server's seed where a sampled request sends none */
    char sampled[3][256];
    for (int i = 0; i < 3; i++) {
        cJSON *a = call(port, "POST", "/v1/completions",
                        i < 2 ? "{\"prompt\":\"Once\",\"temperature\":1,\"top_k\":0,\"top_p\":1,\"min_p\":0,\"max_tokens\":24}"
                              : "{\"prompt\":\"Once\",\"temperature\":1,\"top_k\":0,\"top_p\":1,\"min_p\":0,\"max_tokens\":24,"
                                "\"seed\":7}",
                        "k", &st);
        CU_ASSERT_EQUAL(st, 200);
        snprintf(sampled[i], sizeof sampled[i], "%s", str_at(a, "choices.0.text"));
        cJSON_Delete(a);
    }
    CU_ASSERT_STRING_EQUAL(sampled[0], sampled[1]);
    CU_ASSERT_STRING_EQUAL(sampled[0], sampled[2]);
}

/* The ChatML fallback and text parts against the text written here, a part the model cannot read, and the raw
 * stream: a role chunk first, the fingerprint on every chunk. */
static void chatml_parts_stream(int port, const tp_tokenizer_t *tok, const char *fp)
{
    int st = 0;
    char body[1024];
    static const char msgs[] = "[{\"role\":\"user\",\"content\":\"Once upon a time\"}]";
    /* the ChatML fallback and two text parts, against the text written here as token ids */
    static const char chatml[] = "<|im_start|>system\nTell a story.<|im_end|>\n<|im_start|>user\nOnce upon\n"
                                 "a time<|im_end|>\n<|im_start|>assistant\n";
    int32_t ids[256];
    int n = encode(tok, chatml, sizeof chatml - 1, ids, 256);
    CU_ASSERT_FATAL(n > 0 && n < 256);
    cJSON *a = call(port, "POST", "/v1/chat/completions",
                    "{\"messages\":[{\"role\":\"system\",\"content\":\"Tell a story.\"},{\"role\":\"user\",\"content\":"
                    "[{\"type\":\"text\",\"text\":\"Once upon\"},{\"type\":\"text\",\"text\":\"a time\"}]}]}", "k", &st);
    CU_ASSERT_EQUAL(st, 200);
    CU_ASSERT_EQUAL(usage_prompt_tokens(a), n);
    struct tp_buf b = {0};
    tp_buf_puts(&b, "{\"prompt\":");
    ids_json(ids, n, &b);
    tp_buf_puts(&b, "}");
    cJSON *c = call(port, "POST", "/v1/completions", b.data, "k", &st);
    CU_ASSERT_STRING_EQUAL(str_at(a, "choices.0.message.content"), str_at(c, "choices.0.text"));
    tp_buf_free(&b);
    cJSON_Delete(a);
    cJSON_Delete(c);
    /* a part the model cannot read: 400 naming it */
    a = call(port, "POST", "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
             "k", &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_STRING_EQUAL(error_param(a), "messages[0].content[0]");
    CU_ASSERT_PTR_NOT_NULL(strstr(str_at(a, "error.message"), "image_url"));
    cJSON_Delete(a);

    /* the raw stream: role first, the fingerprint on every chunk */
    struct resp r;
    snprintf(body, sizeof body, "{\"messages\":%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}", msgs);
    char hdr[] = "Authorization: Bearer k\r\nContent-Type: application/json\r\n";
    CU_ASSERT_EQUAL_FATAL(http_do(port, "POST", "/v1/chat/completions", hdr, body, strlen(body), 60, &r), 0);
    CU_ASSERT_EQUAL(r.status, 200);
    int k = 0, role_at = -1, content_at = -1, fp_ok = 1;
    for (const char *q = r.body; (q = strstr(q, "data: {")) != NULL; q++, k++) {
        const char *e = strstr(q, "\n\n");
        cJSON *j = e ? cJSON_ParseWithLength(q + 6, (size_t)(e - q - 6)) : NULL;
        fp_ok &= strcmp(str_at(j, "system_fingerprint"), fp) == 0;
        if (role_at < 0 && strcmp(str_at(j, "choices.0.delta.role"), "assistant") == 0) {
            role_at = k;
            CU_ASSERT(cJSON_IsNull(at(j, "choices.0.delta.content"))); /* a chunk of its own, as llama-server's */
        }
        if (content_at < 0 && str_at(j, "choices.0.delta.content")[0]) content_at = k;
        cJSON_Delete(j);
    }
    CU_ASSERT_EQUAL(role_at, 0);
    CU_ASSERT_EQUAL(content_at, 1);
    CU_ASSERT(fp_ok && k >= 3);
    resp_free(&r);
}

/* A second start without the flags (-c 64): the same fingerprint, the built-in defaults, the context limit on
 * every API in its own shape. */
static void second_start_limits(const char *fp)
{
    struct srv s;
    int st = 0;
    char body[1024];
    cJSON *pr, *a;
    const char *small[] = {"-c", "64", NULL};
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, small), 0);
    pr = call(s.port, "GET", "/props", NULL, NULL, &st);
    CU_ASSERT_EQUAL(st, 200);
    CU_ASSERT_STRING_EQUAL(str_at(pr, "system_fingerprint"), fp);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.temperature"), 1);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.seed"), -1);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.n_predict"), -1);
    CU_ASSERT_STRING_EQUAL(str_at(pr, "default_generation_settings.params_from.temperature"), "built-in");
    cJSON_Delete(pr);
    struct tp_buf longp = {0};
    for (int i = 0; i < 40; i++) tp_buf_puts(&longp, "Once upon a time ");
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}", longp.data);
    a = call(s.port, "POST", "/v1/chat/completions", body, NULL, &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_STRING_EQUAL(str_at(a, "error.code"), "context_length_exceeded");
    CU_ASSERT_EQUAL(num_at(a, "error.n_ctx"), 64);
    const double n_long = num_at(a, "error.n_prompt_tokens");
    CU_ASSERT(n_long > 64);
    cJSON_Delete(a);
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", longp.data);
    a = call(s.port, "POST", "/v1/completions", body, NULL, &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_STRING_EQUAL(str_at(a, "error.code"), "context_length_exceeded");
    cJSON_Delete(a);
    snprintf(body, sizeof body, "{\"input\":\"%s\"}", longp.data);
    a = call(s.port, "POST", "/v1/responses", body, NULL, &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_STRING_EQUAL(str_at(a, "error.code"), "context_length_exceeded");
    CU_ASSERT_EQUAL(num_at(a, "error.n_prompt_tokens"), n_long);
    cJSON_Delete(a);
    snprintf(body, sizeof body, "{\"model\":\"m\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}",
             longp.data);
    a = call(s.port, "POST", "/v1/messages", body, NULL, &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_STRING_EQUAL(str_at(a, "type"), "error");
    CU_ASSERT_STRING_EQUAL(str_at(a, "error.type"), "invalid_request_error");
    char msg[128];
    snprintf(msg, sizeof msg, "prompt is too long: %.0f tokens > 63 maximum", n_long);
    CU_ASSERT_STRING_EQUAL(str_at(a, "error.message"), msg);
    cJSON_Delete(a);
    a = call(s.port, "POST", "/v1/messages",
             "{\"model\":\"m\",\"max_tokens\":60,\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}]}", NULL,
             &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_PTR_NOT_NULL(strstr(str_at(a, "error.message"), "input length and `max_tokens` exceed context limit: "));
    CU_ASSERT_PTR_NOT_NULL(strstr(str_at(a, "error.message"), " + 60 > 64,"));
    cJSON_Delete(a);
    snprintf(body, sizeof body, "{\"model\":\"m\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}",
             longp.data);
    a = call(s.port, "POST", "/api/chat", body, NULL, &st);
    CU_ASSERT_EQUAL(st, 400);
    snprintf(msg, sizeof msg, "has %.0f tokens but the context holds 64", n_long);
    CU_ASSERT_PTR_NOT_NULL(strstr(str_at(a, "error"), msg));
    cJSON_Delete(a);
    /* a reply limit the request sets that does not fit: refused with the counts */
    a = call(s.port, "POST", "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":60}", NULL, &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_STRING_EQUAL(str_at(a, "error.code"), "context_length_exceeded");
    CU_ASSERT(num_at(a, "error.n_prompt_tokens") > 0 && num_at(a, "error.n_prompt_tokens") < 64);
    cJSON_Delete(a);
    tp_buf_free(&longp);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

/* An HF directory with a generation_config.json under --top-k 3 -c 32. */
static void hf_generation_config(const char *fp)
{
    struct srv s;
    int st = 0;
    char body[1024];
    cJSON *pr, *a;
    char dir[512], cmd[1200], gc[600];
    snprintf(dir, sizeof dir, "%s/defaults-hf", tp_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' synth --shape test-tiny --format hf -q -o '%s'", tp_test_tpserve(), dir);
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
    snprintf(gc, sizeof gc, "%s/generation_config.json", dir);
    FILE *f = fopen(gc, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("{\"do_sample\": true, \"temperature\": 0.6, \"top_p\": 0.9, \"top_k\": 20, \"max_new_tokens\": 5}", f);
    fclose(f);
    const char *hf_flags[] = {"--top-k", "3", "-c", "32", NULL};
    CU_ASSERT_EQUAL_FATAL(srv_start_model(&s, 1, dir, hf_flags), 0);
    pr = call(s.port, "GET", "/props", NULL, NULL, &st);
    CU_ASSERT_EQUAL(st, 200);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.temperature"), 0.6);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.top_p"), 0.9);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.top_k"), 3);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.n_predict"), 5);
    CU_ASSERT_EQUAL(num_at(pr, "default_generation_settings.params.min_p"), 0);
    CU_ASSERT_STRING_EQUAL(str_at(pr, "default_generation_settings.params_from.temperature"), "generation_config.json");
    CU_ASSERT_STRING_EQUAL(str_at(pr, "default_generation_settings.params_from.top_k"), "command line");
    CU_ASSERT_STRING_EQUAL(str_at(pr, "default_generation_settings.params_from.min_p"), "built-in");
    CU_ASSERT_STRING_NOT_EQUAL(str_at(pr, "system_fingerprint"), fp); /* another model */
    cJSON_Delete(pr);
    a = call(s.port, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\",\"ignore_eos\":true}", NULL, &st);
    CU_ASSERT_EQUAL(st, 200);
    CU_ASSERT_EQUAL(num_at(a, "usage.completion_tokens"), 5);
    cJSON_Delete(a);
    /* a prompt that leaves fewer than 5 tokens of the 32: the default limit is lowered to what fits, where the
     * same limit set by the request is refused */
    struct tp_buf pw = {0};
    int np = 0;
    for (int w = 0; w < 64 && np < 28; w++) {
        tp_buf_puts(&pw, "word ");
        snprintf(body, sizeof body, "{\"content\":\"%s\",\"add_special\":true}", pw.data);
        a = call(s.port, "POST", "/tokenize", body, NULL, &st);
        np = cJSON_GetArraySize(at(a, "tokens"));
        cJSON_Delete(a);
    }
    CU_ASSERT_FATAL(np >= 28 && np < 32);
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"ignore_eos\":true}", pw.data);
    a = call(s.port, "POST", "/v1/completions", body, NULL, &st);
    CU_ASSERT_EQUAL(st, 200);
    CU_ASSERT_EQUAL(num_at(a, "usage.prompt_tokens"), np);
    CU_ASSERT_EQUAL(num_at(a, "usage.completion_tokens"), 32 - np);
    cJSON_Delete(a);
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"ignore_eos\":true,\"max_tokens\":5}", pw.data);
    a = call(s.port, "POST", "/v1/completions", body, NULL, &st);
    CU_ASSERT_EQUAL(st, 400);
    CU_ASSERT_STRING_EQUAL(str_at(a, "error.code"), "context_length_exceeded");
    cJSON_Delete(a);
    tp_buf_free(&pw);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

/*
 * One server started with every generation default (`--temp 0 --seed 7 --top-k 5 --top-p 0.9 --min-p 0.05
 * --repeat-penalty 1.1 -n 6`), an alias, 3 slots and an API key:
 *   - GET /props: 401 without the key; default_generation_settings equal the flags, n_ctx the -c, total_slots,
 *     alias, path, the ChatML fallback named, model_meta equal the GGUF's own keys (read here), build_info;
 *   - a request without temperature / max_tokens gives the same text as one with temperature 0 and
 *     max_tokens 6, on chat completions, completions, Responses, Messages and Ollama chat, each 6 tokens;
 *     an explicit temperature 1 without a seed takes seed 7: the same text as with seed 7, twice;
 *   - the ChatML fallback renders [system, user with two text parts] as the ChatML text written here (the
 *     parts joined by a newline): the same prompt tokens and greedy text as that text sent as token ids;
 *   - the first chunk of a chat stream is {"role": "assistant", "content": null}, content follows; every chunk and the
 *     whole reply carry /props' system_fingerprint ("fp_" + 10 hex).
 * Then a second start without the flags (-c 64): the same fingerprint, the built-in defaults in /props, and a
 * prompt longer than the context refused by each API in its own shape with the counts.  Then an HF directory
 * with a generation_config.json and --top-k 3 -c 32: /props takes temperature, top_p and max_new_tokens from the
 * file and top_k from the flag; a prompt leaving fewer than max_new_tokens gets what fits, unless the request
 * set the limit (context_length_exceeded).
 */
static void test_defaults_props(void)
{
    const char *mp = model_path();
    if (!mp) return;
    struct tp_error err = {0};
    tp_tokenizer_t *tok = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_tokenizer_from_gguf(mp, &tok, &err), TP_OK);
    struct srv s;
    const char *flags[] = {"--temp", "0", "--seed", "7", "--top-k", "5", "--top-p", "0.9", "--min-p", "0.05",
                           "--repeat-penalty", "1.1", "-n", "6", "--alias", "tiny", "--parallel", "3", "-c", "256",
                           "--api-key", "k", NULL};
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, flags), 0);
    char fp[32] = "";
    props_flags(s.port, mp, tok, fp, sizeof fp);
    defaults_every_api(s.port, fp);
    chatml_parts_stream(s.port, tok, fp);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
    tp_tokenizer_free(tok);
    second_start_limits(fp);
    hf_generation_config(fp);
}

static const struct tp_test_case api_cases[] = {
    {"nul", test_nul},
    {"fields", test_fields},
    {"defaults_props", test_defaults_props},
    {NULL, NULL},
};
TP_TEST_SUITE(api, "model", 180, api_cases)

static const struct tp_test_case api_mr_cases[] = {
    {"logit_bias", test_logit_bias},
    {NULL, NULL},
};
TP_TEST_SUITE(api_multirank, "model,multirank", 240, api_mr_cases)

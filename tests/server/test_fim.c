/*
 * tests/server/test_fim.c - fill-in-the-middle end to end: llama-server's
 * POST /infill and `suffix` on POST /v1/completions.
 *
 *   fim_shared  a synthetic Qwen3-shaped model with the real Qwen3 tokenizer
 *               (../shared), whose <|fim_prefix|> / <|fim_suffix|> /
 *               <|fim_middle|> / <|file_sep|> tokens are special: /infill,
 *               the suffix completion and input_extra give, greedily, the
 *               text and token counts of /v1/completions fed the prompt
 *               built here from the tokenizer (the oracle):
 *               <PRE> prefix <SUF> suffix <MID> [prompt], input_extra as
 *               <REP> project \n <SEP> filename \n text before it; streamed /infill equals
 *               the whole answer.
 *   fim         the bundled stories260K has no FIM tokens: /infill and
 *               suffix get 400 naming the field, and the server goes on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "e2e_impl.h"
#include "model/model.h"
#include "tp_test.h"

static cJSON *post_json(int port, const char *path, const char *json, int *status)
{
    struct resp r;
    *status = 0;
    if (http_post(port, path, json, &r) != 0) return NULL;
    *status = r.status;
    cJSON *root = cJSON_Parse(r.body);
    if (r.status != 200) fprintf(stderr, "%s: %d %s\n", path, r.status, r.body);
    resp_free(&r);
    return root;
}

/* Append the ids of text to ids[*n] (no BOS). */
static void add_text(tp_tokenizer_t *tok, const char *text, int32_t *ids, int *n)
{
    int k = tp_tokenizer_encode(tok, text, strlen(text), 0, 1, ids + *n, 4096 - *n);
    CU_ASSERT_FATAL(k >= 0 && *n + k < 4096);
    *n += k;
}

/* "[1,2,3]" of ids. */
static void ids_json(const int32_t *ids, int n, char *out, size_t cap)
{
    size_t o = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < n && o < cap; i++) o += (size_t)snprintf(out + o, cap - o, "%s%d", i ? "," : "", ids[i]);
    snprintf(out + o, cap - o, "]");
}

/* The first case of test_fim_qwen3 two more ways, each giving its greedy text wt from a prompt of n
 * tokens: the suffix on /v1/completions, and the /infill body infill streamed (the same text, then a
 * final event with stop: true). */
static void fim_suffix_and_stream(int port, const char *infill, const char *wt, int n)
{
    int st;
    cJSON *sf = post_json(port, "/v1/completions",
                          "{\"prompt\":\"def add(a, b):\\n    return \",\"suffix\":\"\\n\\nprint(add(1, 2))\\n\","
                          "\"max_tokens\":12,\"temperature\":0}", &st);
    CU_ASSERT_EQUAL_FATAL(st, 200);
    CU_ASSERT_STRING_EQUAL(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(sf, "choices"), 0), "text")->valuestring, wt);
    CU_ASSERT_EQUAL(cJSON_GetObjectItem(cJSON_GetObjectItem(sf, "usage"), "prompt_tokens")->valueint, n);
    cJSON_Delete(sf);
    /* streamed /infill: the same text, then a final event with stop: true */
    struct resp r;
    char sb[600];
    snprintf(sb, sizeof sb, "%.*s,\"stream\":true}", (int)strlen(infill) - 1, infill);
    CU_ASSERT_EQUAL_FATAL(http_post(port, "/infill", sb, &r), 0);
    CU_ASSERT_EQUAL(r.status, 200);
    struct tp_buf_l {
        char s[8192];
        size_t n;
    } acc = {{0}, 0};
    int stops = 0;
    for (char *l = strstr(r.body, "data: "); l; l = strstr(l + 6, "data: ")) {
        char *e = strstr(l, "\n\n");
        if (!e) break;
        cJSON *ev = cJSON_ParseWithLength(l + 6, (size_t)(e - l - 6));
        CU_ASSERT_PTR_NOT_NULL_FATAL(ev);
        const char *ct = cJSON_GetObjectItem(ev, "content")->valuestring;
        acc.n += (size_t)snprintf(acc.s + acc.n, sizeof acc.s - acc.n, "%s", ct);
        stops += cJSON_IsTrue(cJSON_GetObjectItem(ev, "stop"));
        cJSON_Delete(ev);
    }
    CU_ASSERT_STRING_EQUAL(acc.s, wt);
    CU_ASSERT_EQUAL(stops, 1);
    resp_free(&r);
}

static void test_fim_qwen3(void)
{
    const char *tj = tp_test_shared_path("models/tokenizers/qwen3/tokenizer.json");
    if (!tj) return;
    char path[600], cmd[1400];
    snprintf(path, sizeof path, "%s/fim-qwen3.gguf", tp_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' synth --shape test-tiny-qwen3 --tokenizer '%s' -q --threads 1 -o '%s' 2>/dev/null",
             tp_test_tpserve(), tj, path);
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
    tp_tokenizer_t *tok = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_tokenizer_from_gguf(path, &tok, &err), TP_OK);
    int fim[TP_FIM_COUNT];
    CU_ASSERT_EQUAL_FATAL(tp_tokenizer_fim(tok, fim), 1);
    /* the oracle's ids come from the token texts, not from tp_tokenizer_fim */
    const int pre = tp_tokenizer_find_special(tok, "<|fim_prefix|>"), suf = tp_tokenizer_find_special(tok, "<|fim_suffix|>");
    const int mid = tp_tokenizer_find_special(tok, "<|fim_middle|>"), sep = tp_tokenizer_find_special(tok, "<|file_sep|>");
    CU_ASSERT_FATAL(pre >= 0 && suf >= 0 && mid >= 0 && sep >= 0);
    CU_ASSERT(fim[TP_FIM_PRE] == pre && fim[TP_FIM_SUF] == suf && fim[TP_FIM_MID] == mid && fim[TP_FIM_SEP] == sep);
    const char *prefix = "def add(a, b):\n    return ", *suffix = "\n\nprint(add(1, 2))\n";
    static int32_t ids[4096];
    int n = 0;
    if (tp_tokenizer_add_bos(tok)) ids[n++] = tp_tokenizer_bos(tok);
    ids[n++] = pre;
    add_text(tok, prefix, ids, &n);
    ids[n++] = suf;
    add_text(tok, suffix, ids, &n);
    ids[n++] = mid;
    const int n_plain = n;
    add_text(tok, " a", ids, &n); /* /infill's prompt: the start of the middle */
    const int n_prompted = n;
    /* with input_extra: <REP> "project\n" <SEP> "a.py\ny = 1\n" before <PRE> */
    static int32_t ex[4096];
    int ne = 0;
    if (tp_tokenizer_add_bos(tok)) ex[ne++] = tp_tokenizer_bos(tok);
    const int rep = tp_tokenizer_find_special(tok, "<|repo_name|>");
    CU_ASSERT_FATAL(rep >= 0);
    CU_ASSERT(fim[TP_FIM_REP] == rep);
    ex[ne++] = rep;
    add_text(tok, "project\n", ex, &ne);
    ex[ne++] = sep;
    add_text(tok, "a.py\ny = 1\n", ex, &ne);
    memcpy(ex + ne, ids + (tp_tokenizer_add_bos(tok) ? 1 : 0), sizeof(int32_t) * (size_t)(n_plain - (tp_tokenizer_add_bos(tok) ? 1 : 0)));
    ne += n_plain - (tp_tokenizer_add_bos(tok) ? 1 : 0);

    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start_model(&s, 1, path, NULL), 0);
    static char body[65536], list[40000];
    int st;
    struct {
        const int32_t *ids;
        int n;
        const char *infill; /* the /infill body giving the same prompt */
    } cases[3] = {
        {ids, n_plain, NULL},
        {ids, n_prompted, NULL},
        {ex, ne, NULL},
    };
    char inf[3][512];
    snprintf(inf[0], sizeof inf[0], "{\"input_prefix\":\"def add(a, b):\\n    return \",\"input_suffix\":\"\\n\\nprint(add(1, "
                                    "2))\\n\",\"n_predict\":12,\"temperature\":0}");
    snprintf(inf[1], sizeof inf[1], "{\"input_prefix\":\"def add(a, b):\\n    return \",\"input_suffix\":\"\\n\\nprint(add(1, "
                                    "2))\\n\",\"prompt\":\" a\",\"n_predict\":12,\"temperature\":0}");
    snprintf(inf[2], sizeof inf[2], "{\"input_prefix\":\"def add(a, b):\\n    return \",\"input_suffix\":\"\\n\\nprint(add(1, "
                                    "2))\\n\",\"input_extra\":[{\"filename\":\"a.py\",\"text\":\"y = 1\\n\"}],\"n_predict\":12,"
                                    "\"temperature\":0,\"cache_prompt\":true}");
    for (int i = 0; i < 3; i++) {
        cases[i].infill = inf[i];
        ids_json(cases[i].ids, cases[i].n, list, sizeof list);
        snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":12,\"temperature\":0}", list);
        cJSON *want = post_json(s.port, "/v1/completions", body, &st);
        CU_ASSERT_EQUAL_FATAL(st, 200);
        const char *wt = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(want, "choices"), 0), "text")->valuestring;
        const cJSON *wu = cJSON_GetObjectItem(want, "usage");
        CU_ASSERT_EQUAL(cJSON_GetObjectItem(wu, "prompt_tokens")->valueint, cases[i].n);
        cJSON *got = post_json(s.port, "/infill", cases[i].infill, &st);
        CU_ASSERT_EQUAL_FATAL(st, 200);
        CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(got, "content")->valuestring, wt);
        CU_ASSERT_EQUAL(cJSON_GetObjectItem(got, "tokens_evaluated")->valueint, cases[i].n);
        CU_ASSERT_EQUAL(cJSON_GetObjectItem(got, "tokens_predicted")->valueint, 12);
        CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(got, "stop_type")->valuestring, "limit");
        CU_ASSERT(cJSON_IsTrue(cJSON_GetObjectItem(got, "stop")));
        if (i == 0) fim_suffix_and_stream(s.port, inf[0], wt, cases[i].n);
        cJSON_Delete(want);
        cJSON_Delete(got);
    }
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
    tp_tokenizer_free(tok);
}

static void test_fim_refused(void)
{
    const char *mp = tp_test_repo_path("models/stories260K.gguf");
    if (access(mp, R_OK) != 0) {
        tp_test_skip("models/stories260K.gguf missing");
        return;
    }
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start_model(&s, 1, mp, NULL), 0);
    static const struct {
        const char *path, *body, *param;
    } bad[] = {
        {"/infill", "{\"input_prefix\":\"a\",\"input_suffix\":\"b\"}", "input_prefix"},
        {"/v1/completions", "{\"prompt\":\"a\",\"suffix\":\"b\"}", "suffix"},
        {"/infill", "{\"input_prefix\":5}", "input_prefix"},
        {"/infill", "{\"input_prefix\":\"a\",\"bogus\":1}", "bogus"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st;
        cJSON *root = post_json(s.port, bad[i].path, bad[i].body, &st);
        CU_ASSERT_EQUAL(st, 400);
        const cJSON *pm = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "error"), "param");
        CU_ASSERT(cJSON_IsString(pm) && strcmp(pm->valuestring, bad[i].param) == 0);
        cJSON_Delete(root);
    }
    int st;
    cJSON *ok = post_json(s.port, "/v1/completions", "{\"prompt\":\"Once\",\"suffix\":\"\",\"max_tokens\":2}", &st);
    CU_ASSERT_EQUAL(st, 200); /* an empty suffix is a plain completion */
    cJSON_Delete(ok);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

static const struct tp_test_case fim_shared_cases[] = {
    {"qwen3_infill_suffix_extra_stream", test_fim_qwen3},
    {NULL, NULL},
};
TP_TEST_SUITE(fim_shared, "model", 180, fim_shared_cases)

static const struct tp_test_case fim_cases[] = {
    {"no_fim_tokens_refused", test_fim_refused},
    {NULL, NULL},
};
TP_TEST_SUITE(fim, "model", 120, fim_cases)

/*
 * tests/model/test_tokenizer.c - tokenizers against external oracles.
 *
 *   vectors   llama.cpp's test vectors (47 inputs each, ids without BOS):
 *             Llama 2 SentencePiece from the bundled vocab-only GGUF,
 *             Llama 3 and Qwen2 byte-level BPE from tokenizer.json in
 *             ../shared (skipped when absent).
 *   oracle    a wider corpus (Unicode, code, numbers, whitespace runs,
 *             emoji, CJK, combining marks) whose ids were produced by the
 *             Hugging Face tokenizers library (tests/data/tokenizer/
 *             gen_oracle.mjs -> oracle.json), for Llama 3, Qwen3 and Mistral.
 *   detok     round trips decode(encode(x)) == x, streaming byte by byte
 *             across byte tokens, U+FFFD for invalid leftovers.
 *   errors    bad files and bad input are refused with clear errors.
 *   unicode   NFC and category spot checks against known values.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/tokenizer_impl.h"
#include "model/unicode_impl.h"
#include "tp_test.h"

/* ------------------------------------------------------------ helpers */

static tp_tokenizer_t *load_json_tok(const char *dir)
{
    char rel[256], relc[256];
    snprintf(rel, sizeof(rel), "models/tokenizers/%s/tokenizer.json", dir);
    snprintf(relc, sizeof(relc), "models/tokenizers/%s/tokenizer_config.json", dir);
    const char *p = tp_test_shared_path(rel);
    const char *pc = tp_test_shared_path(relc);
    if (!p) return NULL;
    tp_tokenizer_t *t = NULL;
    struct tp_error err = {0};
    enum tp_status rc = tp_tokenizer_from_json(p, pc, &t, &err);
    if (rc != TP_OK) fprintf(stderr, "load %s: %s\n", p, err.msg);
    CU_ASSERT_EQUAL(rc, TP_OK);
    return t;
}

static tp_tokenizer_t *load_spm_gguf(void)
{
    tp_tokenizer_t *t = NULL;
    struct tp_error err = {0};
    enum tp_status rc = tp_tokenizer_from_gguf(tp_test_repo_path("tests/data/tokenizer/ggml-vocab-llama-spm.gguf"), &t, &err);
    if (rc != TP_OK) fprintf(stderr, "load spm gguf: %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, TP_OK);
    return t;
}

/* Encode text (no BOS unless asked) into a malloc'd array; *n set. */
static int32_t *encode(const tp_tokenizer_t *t, const char *s, size_t len, int add_bos, int special, int *n)
{
    int need = tp_tokenizer_encode(t, s, len, add_bos, special, NULL, 0);
    *n = need;
    if (need < 0) return NULL;
    int32_t *ids = malloc(((size_t)need + 1) * sizeof(int32_t));
    int got = tp_tokenizer_encode(t, s, len, add_bos, special, ids, need);
    CU_ASSERT_EQUAL(got, need);
    return ids;
}

static void print_ids(const char *what, const int32_t *ids, int n)
{
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* Run llama.cpp's .inp/.out vectors; returns the number that matched. */
static int run_vectors(const tp_tokenizer_t *t, const char *name, int *total)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/tokenizer/ggml-vocab-%s.gguf.inp", name);
    char *inp = tp_test_read_file(tp_test_repo_path(rel), NULL);
    snprintf(rel, sizeof(rel), "tests/data/tokenizer/ggml-vocab-%s.gguf.out", name);
    char *outp = tp_test_read_file(tp_test_repo_path(rel), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inp);
    CU_ASSERT_PTR_NOT_NULL_FATAL(outp);
    const char *sep = "\n__ggml_vocab_test__\n";
    int ok = 0, n = 0;
    char *ip = inp, *op = outp;
    /* split like llama.cpp's test-tokenizer-0: the text after the last
     * separator (empty) is the 47th case, paired with the empty last line */
    for (int last = 0; !last;) {
        char *e = strstr(ip, sep);
        if (e) *e = 0;
        else last = 1;
        char *ol = strchr(op, '\n');
        if (ol) *ol = 0;
        else if (!last) break;
        int32_t want[512];
        int nw = 0;
        for (char *q = op; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[nw++] = (int32_t)v;
            q = end;
        }
        int ng;
        int32_t *got = encode(t, ip, strlen(ip), 0, 0, &ng);
        int same = got && ng == nw && memcmp(got, want, (size_t)nw * sizeof(int32_t)) == 0;
        if (same) ok++;
        else {
            fprintf(stderr, "%s vector %d mismatch for \"%s\"\n", name, n, ip);
            print_ids("want", want, nw);
            if (got) print_ids("got ", got, ng);
        }
        free(got);
        n++;
        if (last) break;
        ip = e + strlen(sep);
        op = ol ? ol + 1 : op + strlen(op);
    }
    free(inp);
    free(outp);
    *total = n;
    return ok;
}

/* ------------------------------------------------------------ vectors */

static void test_vectors_llama_spm(void)
{
    tp_tokenizer_t *t = load_spm_gguf();
    CU_ASSERT_EQUAL(tp_tokenizer_kind(t), TP_TOK_SPM);
    CU_ASSERT_EQUAL(tp_tokenizer_n_vocab(t), 32000);
    CU_ASSERT_EQUAL(tp_tokenizer_bos(t), 1);
    CU_ASSERT_EQUAL(tp_tokenizer_eos(t), 2);
    CU_ASSERT(tp_tokenizer_add_bos(t));
    int total, ok = run_vectors(t, "llama-spm", &total);
    CU_ASSERT_EQUAL(total, 47);
    CU_ASSERT_EQUAL(ok, total);
    tp_tokenizer_free(t);
}

static void test_vectors_llama3(void)
{
    tp_tokenizer_t *t = load_json_tok("llama3");
    if (!t) {
        tp_test_skip("../shared/models/tokenizers/llama3 not present");
        return;
    }
    CU_ASSERT_EQUAL(tp_tokenizer_kind(t), TP_TOK_BPE);
    CU_ASSERT_EQUAL(tp_tokenizer_n_vocab(t), 128256);
    int total, ok = run_vectors(t, "llama-bpe", &total);
    CU_ASSERT_EQUAL(total, 47);
    CU_ASSERT_EQUAL(ok, total);
    tp_tokenizer_free(t);
}

static void test_vectors_qwen2(void)
{
    tp_tokenizer_t *t = load_json_tok("qwen3");
    if (!t) {
        tp_test_skip("../shared/models/tokenizers/qwen3 not present");
        return;
    }
    CU_ASSERT_EQUAL(tp_tokenizer_kind(t), TP_TOK_BPE);
    int total, ok = run_vectors(t, "qwen2", &total);
    CU_ASSERT_EQUAL(total, 47);
    CU_ASSERT_EQUAL(ok, total);
    tp_tokenizer_free(t);
}

static const struct tp_test_case vector_cases[] = {
    {"llama_spm_gguf", test_vectors_llama_spm},
    {"llama3_json", test_vectors_llama3},
    {"qwen2_json", test_vectors_qwen2},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_vectors, "unit,model", 300, vector_cases)

/* ------------------------------------------------------------ oracle corpus */

/* Decode ids with the streaming detokenizer (one id at a time) + flush. */
static char *detok_all(const tp_tokenizer_t *t, const int32_t *ids, int n, size_t *len)
{
    tp_detok_t *d = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_detok_init(t, &d), TP_OK);
    size_t cap = 64, o = 0;
    char *s = malloc(cap);
    char piece[256];
    for (int i = 0; i <= n; i++) {
        size_t k = i < n ? tp_detok_push(d, ids[i], piece, sizeof(piece)) : tp_detok_flush(d, piece, sizeof(piece));
        if (o + k + 1 > cap) {
            while (o + k + 1 > cap) cap *= 2;
            s = realloc(s, cap);
        }
        memcpy(s + o, piece, k);
        o += k;
    }
    s[o] = 0;
    *len = o;
    tp_detok_free(d);
    return s;
}

static void run_oracle(const char *name)
{
    char *js = tp_test_read_file(tp_test_repo_path("tests/data/tokenizer/oracle.json"), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(js);
    cJSON *root = cJSON_Parse(js);
    free(js);
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    const cJSON *inputs = cJSON_GetObjectItem(root, "inputs");
    const cJSON *tk = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "tokenizers"), name);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tk);
    const char *dir = cJSON_GetObjectItem(tk, "dir")->valuestring;
    tp_tokenizer_t *t = load_json_tok(dir + strlen("tokenizers/"));
    if (!t) {
        tp_test_skip("../shared/models/%s not present", dir);
        cJSON_Delete(root);
        return;
    }
    int n_cases = 0, n_ids_ok = 0, n_text_ok = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(tk, "cases"))
    {
        int idx = cJSON_GetObjectItem(c, "input")->valueint;
        int special = cJSON_IsTrue(cJSON_GetObjectItem(c, "special"));
        const cJSON *jids = cJSON_GetObjectItem(c, "ids");
        const char *want_text = cJSON_GetObjectItem(c, "decoded")->valuestring;
        const char *in = cJSON_GetArrayItem(inputs, idx)->valuestring;
        int nw = cJSON_GetArraySize(jids);
        int32_t *want = malloc(((size_t)nw + 1) * sizeof(int32_t));
        for (int i = 0; i < nw; i++) want[i] = (int32_t)cJSON_GetArrayItem(jids, i)->valueint;
        int ng;
        int32_t *got = encode(t, in, strlen(in), 0, special, &ng);
        n_cases++;
        if (got && ng == nw && memcmp(got, want, (size_t)nw * sizeof(int32_t)) == 0) n_ids_ok++;
        else {
            fprintf(stderr, "%s oracle case %d (\"%.60s\") ids differ\n", name, idx, in);
            print_ids("want", want, nw);
            if (got) print_ids("got ", got, ng);
        }
        size_t dl;
        char *dec = detok_all(t, want, nw, &dl);
        if (dl == strlen(want_text) && memcmp(dec, want_text, dl) == 0) n_text_ok++;
        else fprintf(stderr, "%s oracle case %d decode differs:\n  want \"%s\"\n  got  \"%s\"\n", name, idx, want_text, dec);
        free(dec);
        free(got);
        free(want);
    }
    fprintf(stderr, "%s: %d/%d ids exact, %d/%d decodes exact\n", name, n_ids_ok, n_cases, n_text_ok, n_cases);
    CU_ASSERT(n_cases >= 50);
    CU_ASSERT_EQUAL(n_ids_ok, n_cases);
    CU_ASSERT_EQUAL(n_text_ok, n_cases);
    tp_tokenizer_free(t);
    cJSON_Delete(root);
}

static void test_oracle_llama3(void) { run_oracle("llama3"); }
static void test_oracle_qwen3(void) { run_oracle("qwen3"); }
static void test_oracle_mistral(void) { run_oracle("mistral"); }

static const struct tp_test_case oracle_cases[] = {
    {"llama3", test_oracle_llama3},
    {"qwen3", test_oracle_qwen3},
    {"mistral", test_oracle_mistral},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_oracle, "unit,model", 300, oracle_cases)

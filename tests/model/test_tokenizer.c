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

/*
 * tests/model/test_o200k.c - the o200k byte-level BPE (GPT-4o, gpt-oss).
 *
 *   o200k           the pre-tokenizer's splits on hand-picked inputs (letter-case
 *                   runs, marks, contractions, digit triples, '/' runs, whitespace)
 *                   against the o200k regex run by a backtracking engine (node's
 *                   RegExp with the same pattern); harmony special tokens and end of
 *                   generation on a small vocabulary.
 *   o200k_tiktoken  ids identical to the tiktoken npm package's o200k_base on a
 *                   seeded mixed-script corpus of ~3200 texts (tests/node/o200k_oracle.mjs
 *                   writes the vocabulary from tiktoken's ranks as a gpt-oss
 *                   tokenizer.json, and the expected ids), loaded from tokenizer.json
 *                   and from a GGUF vocabulary written from it (tokenizer.ggml.pre
 *                   "gpt-4o"); harmony special tokens; decode round trip.  Skips
 *                   when node or the tiktoken package is missing.
 */
#include <cjson/cJSON.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/synth_vocab.h"
#include "model/tokenizer/tokenizer_core_impl.h"
#include "model/tokenizer/unicode_impl.h"
#include "tp_test.h"

/* ------------------------------------------------------------ helpers */

/* A byte-level vocabulary: the 256 GPT-2 byte tokens, one merge ("a b"), and
 * the harmony specials after them. */
static tp_tokenizer_t *small_o200k(void)
{
    static const char *const specials[] = {"<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                           "<|constrain|>", "<|return|>", "<|call|>", "<|endoftext|>"};
    enum { NS = sizeof(specials) / sizeof(specials[0]) };
    uint32_t map[256];
    tp_unicode_gpt2_byte_map(map);
    static char texts[256][5];
    const char *toks[256 + 1 + NS];
    int32_t types[256 + 1 + NS];
    for (int b = 0; b < 256; b++) {
        int k = tp_utf8_encode(map[b], texts[b]);
        texts[b][k] = 0;
        toks[b] = texts[b];
        types[b] = 1;
    }
    toks[256] = "ab";
    types[256] = 1;
    for (int i = 0; i < NS; i++) {
        toks[257 + i] = specials[i];
        types[257 + i] = 3;
    }
    const char *merges[] = {"a b"};
    struct tp_vocab_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = TP_TOK_BPE;
    d.pretok = TP_PRETOK_O200K;
    d.n_tokens = 257 + NS;
    d.tokens = toks;
    d.token_types = types;
    d.n_merges = 1;
    d.merges = merges;
    d.bos_id = d.eot_id = d.unk_id = d.pad_id = -1;
    d.eos_id = 257 + 5; /* <|return|> */
    tp_tokenizer_t *t = NULL;
    struct tp_error err = {0};
    enum tp_status rc = tp_tokenizer_build(&d, &t, &err);
    if (rc != TP_OK) fprintf(stderr, "build: %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, TP_OK);
    return t;
}

/* The pre-tokens of s joined with '|'. */
static void splits(const tp_tokenizer_t *t, const char *s, char *out, size_t cap)
{
    struct tp_tok_scratch sc;
    memset(&sc, 0, sizeof(sc));
    uint32_t ends[64];
    size_t n = 0, o = 0, start = 0;
    CU_ASSERT_EQUAL_FATAL(tp_tok_pretokenize(t, &sc, s, strlen(s), ends, 64, &n), 0);
    CU_ASSERT_FATAL(n <= 64);
    for (size_t i = 0; i < n; i++) {
        size_t l = ends[i] - start;
        CU_ASSERT_FATAL(o + l + 2 < cap);
        if (i) out[o++] = '|';
        memcpy(out + o, s + start, l);
        o += l;
        start = ends[i];
    }
    out[o] = 0;
    tp_tok_scratch_free(&sc);
}

/* ------------------------------------------------------------ o200k (unit) */

static void test_pretok_splits(void)
{
    tp_tokenizer_t *t = small_o200k();
    /* {input, pre-tokens joined by '|'}; the pieces contain no '|' */
    static const char *const cases[][2] = {
        {"Hello world", "Hello| world"},
        {"HELLOworld", "HELLOworld"},
        {"helloWORLD's", "hello|WORLD's"},
        {"\xE4\xB8\xAD\xE6\x96\x87" "ABC", "\xE4\xB8\xAD\xE6\x96\x87|ABC"}, /* Lo then Lu: 中文|ABC */
        {"!!hello", "!!|hello"},
        {"  hello", " | hello"},
        {"hello \n\n world", "hello| \n\n| world"},
        {"don'tI'M", "don't|I'M"},
        {"x=1234567", "x|=|123|456|7"},
        {"path/to/x\n\n/", "path|/to|/x|\n\n|/"},
        {"\xCC\x81" "abc", "\xCC\x81" "abc"},                       /* leading combining mark */
        {"a\xCC\x81\xCC\x81" "B", "a\xCC\x81\xCC\x81|B"},
        {"it'\xC5\xBF", "it'\xC5\xBF"},                             /* 'ſ folds to 's */
        {"\xF0\x9F\x99\x82\xF0\x9F\x99\x82 ok", "\xF0\x9F\x99\x82\xF0\x9F\x99\x82| ok"},
        {"\t\tfoo", "\t|\tfoo"},
        {"ABC DEF.", "ABC| DEF|."},
        {"\xCE\xA3\xCE\x8A\xCE\xA3\xCE\xA5\xCE\xA6\xCE\x9F\xCE\xA3's", "\xCE\xA3\xCE\x8A\xCE\xA3\xCE\xA5\xCE\xA6\xCE\x9F\xCE\xA3's"},
        /* Devanagari with vowel signs (marks): नमस्ते दुनिया */
        {"\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87 "
         "\xE0\xA4\xA6\xE0\xA5\x81\xE0\xA4\xA8\xE0\xA4\xBF\xE0\xA4\xAF\xE0\xA4\xBE",
         "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87| "
         "\xE0\xA4\xA6\xE0\xA5\x81\xE0\xA4\xA8\xE0\xA4\xBF\xE0\xA4\xAF\xE0\xA4\xBE"},
        {"a\r\n\r\nb", "a|\r\n\r\n|b"},
        {"end  ", "end|  "},
    };
    char got[512];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        splits(t, cases[i][0], got, sizeof(got));
        if (strcmp(got, cases[i][1]) != 0) fprintf(stderr, "case %zu: got [%s] want [%s]\n", i, got, cases[i][1]);
        CU_ASSERT_STRING_EQUAL(got, cases[i][1]);
    }
    tp_tokenizer_free(t);
}

static void test_harmony_specials(void)
{
    tp_tokenizer_t *t = small_o200k();
    const char *s = "<|start|>assistant<|channel|>final<|message|>ab<|return|>";
    int32_t ids[64];
    int n = tp_tokenizer_encode(t, s, strlen(s), 0, 1, ids, 64);
    CU_ASSERT_EQUAL_FATAL(n, 1 + 9 + 1 + 5 + 1 + 1 + 1);
    CU_ASSERT_EQUAL(ids[0], tp_tokenizer_find_special(t, "<|start|>"));
    CU_ASSERT_EQUAL(ids[0], 257);
    CU_ASSERT_EQUAL(ids[n - 2], 256); /* "ab" merged */
    CU_ASSERT_EQUAL(ids[n - 1], 262);
    /* not parsed: the text is plain bytes */
    CU_ASSERT_EQUAL(tp_tokenizer_encode(t, "<|end|>", 7, 0, 0, ids, 64), 7);
    /* harmony: <|return|> and <|call|> end generation, <|end|> (between messages) does not */
    CU_ASSERT(tp_tokenizer_is_eog(t, tp_tokenizer_find_special(t, "<|return|>")));
    CU_ASSERT(tp_tokenizer_is_eog(t, tp_tokenizer_find_special(t, "<|call|>")));
    CU_ASSERT(!tp_tokenizer_is_eog(t, tp_tokenizer_find_special(t, "<|end|>")));
    CU_ASSERT(!tp_tokenizer_is_eog(t, tp_tokenizer_find_special(t, "<|message|>")));
    tp_tokenizer_free(t);
}

static const struct tp_test_case o200k_cases[] = {
    {"pretok_splits", test_pretok_splits},
    {"harmony_specials", test_harmony_specials},
    {NULL, NULL},
};
TP_TEST_SUITE(o200k, "unit", 60, o200k_cases)

/* ------------------------------------------------------ o200k_tiktoken */

static char oracle_dir[1024];
static int oracle_state; /* 0 not run, 1 ready, 2 skipped, 3 failed */

/* Run tests/node/o200k_oracle.mjs once into the temporary directory. */
static int oracle_ready(void)
{
    if (oracle_state == 0) {
        snprintf(oracle_dir, sizeof(oracle_dir), "%s/o200k", tp_test_tmpdir());
        if (system("command -v node > /dev/null 2>&1") != 0) {
            oracle_state = 2;
        } else {
            char cmd[4096];
            snprintf(cmd, sizeof(cmd), "node '%s' '%s' 3000", tp_test_repo_path("tests/node/o200k_oracle.mjs"), oracle_dir);
            int rc = system(cmd);
            oracle_state = rc == 0 ? 1 : (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) ? 2 : 3;
        }
    }
    if (oracle_state == 2) tp_test_skip("node or the tiktoken npm package is missing (cd tests/node && npm install)");
    CU_ASSERT_NOT_EQUAL(oracle_state, 3);
    return oracle_state == 1;
}

static cJSON *read_corpus(void)
{
    char path[1100];
    snprintf(path, sizeof(path), "%s/corpus.json", oracle_dir);
    FILE *f = fopen(path, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    CU_ASSERT_FATAL(buf && fread(buf, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    cJSON *j = cJSON_ParseWithLength(buf, (size_t)sz);
    free(buf);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    return j;
}

/* Every corpus text encodes to tiktoken's ids and decodes back to itself.
 * Returns the number of mismatching texts (the first few are printed). */
static int check_corpus(const tp_tokenizer_t *t, const cJSON *corpus, const char *what)
{
    int bad = 0, n_texts = 0;
    long n_ids = 0, n_bytes = 0;
    int cap = 1 << 16;
    int32_t *ids = malloc((size_t)cap * sizeof(*ids));
    char *dec = malloc(1 << 20);
    CU_ASSERT_FATAL(ids && dec);
    double t0 = tp_now_s();
    const cJSON *c;
    cJSON_ArrayForEach(c, corpus)
    {
        const char *text = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "ids");
        int special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "special"));
        size_t len = strlen(text);
        int n = tp_tokenizer_encode(t, text, len, 0, special, ids, cap);
        CU_ASSERT_FATAL(n >= 0 && n <= cap);
        n_texts++;
        n_ids += n;
        n_bytes += (long)len;
        int same = n == cJSON_GetArraySize(want);
        for (int i = 0; same && i < n; i++) same = ids[i] == cJSON_GetArrayItem(want, i)->valueint;
        /* decode round trip: the pieces concatenate to the text */
        size_t o = 0;
        for (int i = 0; i < n; i++) {
            size_t pl;
            const char *p = tp_tokenizer_piece(t, ids[i], &pl);
            CU_ASSERT_FATAL(o + pl < (1u << 20));
            memcpy(dec + o, p, pl);
            o += pl;
        }
        if (o != len || memcmp(dec, text, len) != 0) same = 0;
        if (!same && bad++ < 5) {
            fprintf(stderr, "%s: mismatch on text %d (%zu bytes): %.200s\n  got ", what, n_texts - 1, len, text);
            for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n  want");
            for (int i = 0; i < cJSON_GetArraySize(want) && i < 40; i++)
                fprintf(stderr, " %d", cJSON_GetArrayItem(want, i)->valueint);
            fprintf(stderr, "\n");
        }
    }
    double dt = tp_now_s() - t0;
    printf("%s: %d texts, %ld bytes, %ld tokens, %d mismatches; encode+decode %.3f s (%.2f MB/s, %.0f tokens/ms)\n", what,
           n_texts, n_bytes, n_ids, bad, dt, (double)n_bytes / dt / 1e6, (double)n_ids / dt / 1e3);
    free(ids);
    free(dec);
    return bad;
}

static void test_tiktoken_json(void)
{
    if (!oracle_ready()) return;
    char tj[1100], tc[1100];
    snprintf(tj, sizeof(tj), "%s/tokenizer.json", oracle_dir);
    snprintf(tc, sizeof(tc), "%s/tokenizer_config.json", oracle_dir);
    tp_tokenizer_t *t = NULL;
    struct tp_error err = {0};
    enum tp_status rc = tp_tokenizer_from_json(tj, tc, &t, &err);
    if (rc != TP_OK) fprintf(stderr, "%s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, TP_OK);
    CU_ASSERT_EQUAL(tp_tokenizer_n_vocab(t), 201088);
    CU_ASSERT_EQUAL(tp_tokenizer_find_special(t, "<|start|>"), 200006);
    CU_ASSERT_EQUAL(tp_tokenizer_find_special(t, "<|channel|>"), 200005);
    CU_ASSERT_EQUAL(tp_tokenizer_find_special(t, "<|message|>"), 200008);
    CU_ASSERT_EQUAL(tp_tokenizer_find_special(t, "<|constrain|>"), 200003);
    CU_ASSERT_EQUAL(tp_tokenizer_find_special(t, "<|reserved_200017|>"), 200017);
    CU_ASSERT_EQUAL(tp_tokenizer_eos(t), 200002);
    CU_ASSERT_EQUAL(tp_tokenizer_add_bos(t), 0);
    CU_ASSERT(tp_tokenizer_is_eog(t, 200002) && tp_tokenizer_is_eog(t, 200012) && !tp_tokenizer_is_eog(t, 200007));
    cJSON *corpus = read_corpus();
    CU_ASSERT_EQUAL(check_corpus(t, corpus, "o200k tokenizer.json"), 0);

    /* a long prompt: 64 KiB of mixed text, the per-prompt cost */
    size_t cap = 1 << 16, o = 0;
    char *big = malloc(cap + 4096);
    const cJSON *c;
    cJSON_ArrayForEach(c, corpus)
    {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "special"))) continue;
        const char *s = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
        size_t l = strlen(s);
        if (o + l > cap) break;
        memcpy(big + o, s, l);
        o += l;
    }
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    double t0 = tp_now_s();
    int n = tp_tokenizer_encode(t, big, o, 0, 0, ids, (int)cap);
    double dt = tp_now_s() - t0;
    CU_ASSERT(n > 0);
    printf("o200k: one %zu-byte prompt -> %d tokens in %.2f ms (%.1f us per 1000 tokens)\n", o, n, dt * 1e3,
           dt * 1e6 / n * 1000);
    free(ids);
    free(big);
    cJSON_Delete(corpus);
    tp_tokenizer_free(t);
}

static void test_tiktoken_gguf(void)
{
    if (!oracle_ready()) return;
    char tj[1100], gg[1100];
    snprintf(tj, sizeof(tj), "%s/tokenizer.json", oracle_dir);
    snprintf(gg, sizeof(gg), "%s/vocab-o200k.gguf", oracle_dir);
    struct tp_synth_vocab v;
    struct tp_error err = {0};
    enum tp_status rc = tp_synth_vocab_json(tj, 0, &v, &err);
    if (rc != TP_OK) fprintf(stderr, "%s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, TP_OK);
    CU_ASSERT_STRING_EQUAL(v.pre, "gpt-4o"); /* what llama.cpp writes for gpt-oss */
    tp_gguf_writer_t *w = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(gg, 0, &w, &err), TP_OK);
    tp_gguf_kv_str(w, "general.architecture", "gpt-oss");
    tp_gguf_kv_str(w, "tokenizer.ggml.model", v.model);
    tp_gguf_kv_str(w, "tokenizer.ggml.pre", v.pre);
    tp_gguf_kv_array_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tokens, NULL, (uint64_t)v.n_tokens);
    tp_gguf_kv_array(w, "tokenizer.ggml.token_type", TP_GGUF_INT32, v.types, (uint64_t)v.n_tokens);
    tp_gguf_kv_array_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges, NULL, (uint64_t)v.n_merges);
    tp_gguf_kv_u32(w, "tokenizer.ggml.bos_token_id", 199998);
    tp_gguf_kv_u32(w, "tokenizer.ggml.eos_token_id", 200002);
    tp_gguf_kv_u32(w, "tokenizer.ggml.padding_token_id", 199999);
    rc = tp_gguf_writer_finish(w);
    if (rc != TP_OK) fprintf(stderr, "%s\n", tp_gguf_writer_error(w));
    CU_ASSERT_EQUAL_FATAL(rc, TP_OK);
    tp_gguf_writer_free(w);
    tp_synth_vocab_free(&v);

    tp_tokenizer_t *t = NULL;
    rc = tp_tokenizer_from_gguf(gg, &t, &err);
    if (rc != TP_OK) fprintf(stderr, "%s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, TP_OK);
    CU_ASSERT_EQUAL(tp_tokenizer_add_bos(t), 0);
    CU_ASSERT(tp_tokenizer_is_eog(t, 200002) && tp_tokenizer_is_eog(t, 200012) && !tp_tokenizer_is_eog(t, 200007));
    cJSON *corpus = read_corpus();
    CU_ASSERT_EQUAL(check_corpus(t, corpus, "o200k GGUF"), 0);
    cJSON_Delete(corpus);
    tp_tokenizer_free(t);
}

static const struct tp_test_case tiktoken_cases[] = {
    {"tokenizer_json", test_tiktoken_json},
    {"gguf", test_tiktoken_gguf},
    {NULL, NULL},
};
TP_TEST_SUITE(o200k_tiktoken, "unit,model", 300, tiktoken_cases)

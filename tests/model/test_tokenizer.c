/*
 * tests/model/test_tokenizer.c - tokenizers against external oracles.
 *
 *   vectors   llama.cpp's test vectors (47 inputs each, ids without BOS):
 *             Llama 2 SentencePiece from the bundled vocab-only GGUF,
 *             Llama 3 and Qwen2 byte-level BPE from tokenizer.json in
 *             ../shared.
 * Cases that need ../shared sit in the *_shared suites and tokenizer_oracle
 * (reported skipped when ../shared is absent; see tests/tp_test.h).
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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode_impl.h"
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
    if (!t) return; /* ../shared data absent: recorded as a skip */
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
    if (!t) return; /* ../shared data absent: recorded as a skip */
    CU_ASSERT_EQUAL(tp_tokenizer_kind(t), TP_TOK_BPE);
    int total, ok = run_vectors(t, "qwen2", &total);
    CU_ASSERT_EQUAL(total, 47);
    CU_ASSERT_EQUAL(ok, total);
    tp_tokenizer_free(t);
}

static const struct tp_test_case vector_cases[] = {
    {"llama_spm_gguf", test_vectors_llama_spm},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_vectors, "unit,model", 300, vector_cases)
static const struct tp_test_case vector_shared_cases[] = {
    {"llama3_json", test_vectors_llama3},
    {"qwen2_json", test_vectors_qwen2},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_vectors_shared, "unit,model", 300, vector_shared_cases)

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

/* Variants of a tokenizer.json, the same edits as gen_oracle.mjs makes:
 *   gpt2 / gpt2_digits  Llama 3 vocabulary with a plain ByteLevel(use_regex)
 *                       pre-tokenizer (after Digits for gpt2_digits)
 *   spm_normalizer      Mistral's vocabulary in Llama 2 style: Prepend +
 *                       Replace normalizers, no pre-tokenizer */
static tp_tokenizer_t *load_variant(const char *dir, const char *variant)
{
    int digits = !strcmp(variant, "gpt2_digits"), spm_norm = !strcmp(variant, "spm_normalizer");
    char rel[256];
    snprintf(rel, sizeof(rel), "models/%s/tokenizer.json", dir);
    const char *p = tp_test_shared_path(rel);
    if (!p) return NULL;
    char *js = tp_test_read_file(p, NULL);
    cJSON *root = cJSON_Parse(js);
    free(js);
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    cJSON *pre = cJSON_CreateObject();
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddFalseToObject(pre, "add_prefix_space");
    cJSON_AddTrueToObject(pre, "trim_offsets");
    cJSON_AddTrueToObject(pre, "use_regex");
    if (digits) { /* Sequence [Digits(individual_digits), ByteLevel] as SmolLM */
        cJSON *seq = cJSON_CreateObject(), *arr = cJSON_CreateArray(), *dg = cJSON_CreateObject();
        cJSON_AddStringToObject(seq, "type", "Sequence");
        cJSON_AddStringToObject(dg, "type", "Digits");
        cJSON_AddTrueToObject(dg, "individual_digits");
        cJSON_AddItemToArray(arr, dg);
        cJSON_AddItemToArray(arr, pre);
        cJSON_AddItemToObject(seq, "pretokenizers", arr);
        pre = seq;
    }
    if (spm_norm) {
        cJSON_Delete(pre);
        cJSON_ReplaceItemInObject(root, "pre_tokenizer", cJSON_CreateNull());
        cJSON *norm = cJSON_Parse("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
                                  "\"\\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                                  "\"content\": \"\\u2581\"}]}");
        CU_ASSERT_PTR_NOT_NULL_FATAL(norm);
        cJSON_ReplaceItemInObject(root, "normalizer", norm);
    } else {
        cJSON_ReplaceItemInObject(root, "pre_tokenizer", pre);
        cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "model"), "ignore_merges", cJSON_CreateFalse());
    }
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    char path[512];
    snprintf(path, sizeof(path), "%s/variant-%s.json", tp_test_tmpdir(), variant);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(txt, f);
    fclose(f);
    free(txt);
    tp_tokenizer_t *t = NULL;
    struct tp_error err = {0};
    enum tp_status rc = tp_tokenizer_from_json(path, NULL, &t, &err);
    if (rc != TP_OK) fprintf(stderr, "%s: %s\n", path, err.msg);
    CU_ASSERT_EQUAL(rc, TP_OK);
    return t;
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
    const cJSON *variant = cJSON_GetObjectItem(tk, "variant");
    tp_tokenizer_t *t = cJSON_IsString(variant) ? load_variant(dir, variant->valuestring)
                                                : load_json_tok(dir + strlen("tokenizers/"));
    if (!t) { /* ../shared data absent: recorded as a skip */
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
        const char *in = cJSON_GetArrayItem(inputs, idx)->valuestring;
        const cJSON *dec_item = cJSON_GetObjectItem(c, "decoded");
        const char *want_text = cJSON_IsString(dec_item) ? dec_item->valuestring : in;
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
static void test_oracle_mistral(void)
{
    run_oracle("mistral");
    tp_tokenizer_t *t = load_json_tok("mistral-7b-v0.1");
    if (!t) return;
    CU_ASSERT_EQUAL(tp_tokenizer_kind(t), TP_TOK_SPM);
    CU_ASSERT_EQUAL(tp_tokenizer_bos(t), 1);
    CU_ASSERT_EQUAL(tp_tokenizer_eos(t), 2);
    CU_ASSERT(tp_tokenizer_add_bos(t));
    CU_ASSERT(tp_tokenizer_is_eog(t, 2));
    int32_t ids[8];
    CU_ASSERT_EQUAL(tp_tokenizer_encode(t, "Hello world", 11, 1, 0, ids, 8), 3);
    CU_ASSERT(ids[0] == 1 && ids[1] == 22557 && ids[2] == 1526);
    tp_tokenizer_free(t);
}
static void test_oracle_gpt2(void) { run_oracle("gpt2_regex"); }
static void test_oracle_gpt2_digits(void) { run_oracle("gpt2_digits"); }
static void test_oracle_spm_normalizer(void) { run_oracle("spm_normalizer"); }

static const struct tp_test_case oracle_cases[] = {
    {"llama3", test_oracle_llama3},
    {"qwen3", test_oracle_qwen3},
    {"mistral", test_oracle_mistral},
    {"gpt2_regex", test_oracle_gpt2},
    {"gpt2_digits", test_oracle_gpt2_digits},
    {"spm_normalizer", test_oracle_spm_normalizer},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_oracle, "unit,model", 300, oracle_cases)

/* ------------------------------------------------------------ GGUF byte-level */

/* Write the vocabulary of a tokenizer.json as GGUF tokenizer.ggml.* metadata
 * (the layout llama.cpp's converter writes) and load it back. */
static tp_tokenizer_t *gguf_from_json(const char *dir, const char *pre, const char *fname)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "models/tokenizers/%s/tokenizer.json", dir);
    const char *p = tp_test_shared_path(rel);
    if (!p) return NULL;
    char *js = tp_test_read_file(p, NULL);
    cJSON *root = cJSON_Parse(js);
    free(js);
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    const cJSON *model = cJSON_GetObjectItem(root, "model");
    const cJSON *vocab = cJSON_GetObjectItem(model, "vocab"), *merges = cJSON_GetObjectItem(model, "merges");
    const cJSON *added = cJSON_GetObjectItem(root, "added_tokens");
    int n = cJSON_GetArraySize(vocab) + cJSON_GetArraySize(added);
    const char **toks = calloc((size_t)n, sizeof(char *));
    int32_t *types = calloc((size_t)n, sizeof(int32_t));
    const cJSON *x;
    int ids_in_range = 1;
    cJSON_ArrayForEach(x, vocab)
    {
        if (x->valueint < 0 || x->valueint >= n) {
            ids_in_range = 0;
            continue;
        }
        toks[x->valueint] = x->string;
        types[x->valueint] = TP_TOKEN_TYPE_NORMAL;
    }
    cJSON_ArrayForEach(x, added)
    {
        int id = cJSON_GetObjectItem(x, "id")->valueint;
        if (id < 0 || id >= n) {
            ids_in_range = 0;
            continue;
        }
        toks[id] = cJSON_GetObjectItem(x, "content")->valuestring;
        types[id] = TP_TOKEN_TYPE_CONTROL;
    }
    CU_ASSERT_FATAL(ids_in_range);
    int nm = cJSON_GetArraySize(merges);
    char **ms = calloc((size_t)nm, sizeof(char *));
    int i = 0;
    cJSON_ArrayForEach(x, merges)
    {
        if (cJSON_IsString(x)) {
            ms[i] = strdup(x->valuestring);
        } else {
            const char *a = x->child->valuestring, *b = x->child->next->valuestring;
            ms[i] = malloc(strlen(a) + strlen(b) + 2);
            sprintf(ms[i], "%s %s", a, b);
        }
        i++;
    }
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", tp_test_tmpdir(), fname);
    tp_gguf_writer_t *w = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(path, 0, &w, &err), TP_OK);
    tp_gguf_kv_str(w, "general.architecture", "llama");
    tp_gguf_kv_str(w, "tokenizer.ggml.model", "gpt2");
    tp_gguf_kv_str(w, "tokenizer.ggml.pre", pre);
    tp_gguf_kv_array_str(w, "tokenizer.ggml.tokens", toks, NULL, (uint64_t)n);
    tp_gguf_kv_array(w, "tokenizer.ggml.token_type", TP_GGUF_INT32, types, (uint64_t)n);
    tp_gguf_kv_array_str(w, "tokenizer.ggml.merges", (const char *const *)ms, NULL, (uint64_t)nm);
    tp_gguf_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(n - 1));
    CU_ASSERT_EQUAL(tp_gguf_writer_finish(w), TP_OK);
    tp_gguf_writer_free(w);
    for (i = 0; i < nm; i++) free(ms[i]);
    free(ms);
    free(toks);
    free(types);
    cJSON_Delete(root);
    tp_tokenizer_t *t = NULL;
    enum tp_status rc = tp_tokenizer_from_gguf(path, &t, &err);
    if (rc != TP_OK) fprintf(stderr, "%s: %s\n", path, err.msg);
    CU_ASSERT_EQUAL(rc, TP_OK);
    return t;
}

static void test_gguf_llama3(void)
{
    tp_tokenizer_t *t = gguf_from_json("llama3", "llama-bpe", "llama3-vocab.gguf");
    if (!t) return; /* ../shared data absent: recorded as a skip */
    int total, ok = run_vectors(t, "llama-bpe", &total);
    CU_ASSERT_EQUAL(total, 47);
    CU_ASSERT_EQUAL(ok, total);
    tp_tokenizer_free(t);
}

static void test_gguf_qwen2(void)
{
    tp_tokenizer_t *t = gguf_from_json("qwen3", "qwen2", "qwen2-vocab.gguf");
    if (!t) return; /* ../shared data absent: recorded as a skip */
    int total, ok = run_vectors(t, "qwen2", &total);
    CU_ASSERT_EQUAL(total, 47);
    CU_ASSERT_EQUAL(ok, total);
    tp_tokenizer_free(t);
}

/* ------------------------------------------------------------ specials, BOS/EOS */

static void test_specials_llama3(void)
{
    tp_tokenizer_t *t = load_json_tok("llama3");
    if (!t) return; /* ../shared data absent: recorded as a skip */
    CU_ASSERT_EQUAL(tp_tokenizer_bos(t), 128000);
    CU_ASSERT_EQUAL(tp_tokenizer_eos(t), 128001);
    CU_ASSERT(tp_tokenizer_add_bos(t));
    CU_ASSERT_EQUAL(tp_tokenizer_find_special(t, "<|eot_id|>"), 128009);
    CU_ASSERT_EQUAL(tp_tokenizer_find_special(t, "<|nope|>"), -1);
    CU_ASSERT(tp_tokenizer_is_eog(t, 128009));
    CU_ASSERT(tp_tokenizer_is_eog(t, 128001));
    CU_ASSERT(!tp_tokenizer_is_eog(t, 128000));
    CU_ASSERT(!tp_tokenizer_is_eog(t, 9906));
    CU_ASSERT(!tp_tokenizer_is_eog(t, -1));
    CU_ASSERT(!tp_tokenizer_is_eog(t, 1 << 30));
    const char *s = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
    int n;
    int32_t *ids = encode(t, s, strlen(s), 1, 1, &n);
    const int32_t want[] = {128000, 128006, 882, 128007, 271, 13347, 128009};
    CU_ASSERT_EQUAL(n, 7);
    CU_ASSERT(n == 7 && memcmp(ids, want, sizeof(want)) == 0);
    free(ids);
    /* without parse_special the markers are plain text */
    ids = encode(t, s, strlen(s), 0, 0, &n);
    CU_ASSERT(n > 10);
    for (int i = 0; i < n; i++) CU_ASSERT(ids[i] < 128000);
    free(ids);
    /* a short buffer: the full count is returned, nothing past max_ids written */
    int32_t buf[4] = {-7, -7, -7, -7};
    CU_ASSERT_EQUAL(tp_tokenizer_encode(t, s, strlen(s), 1, 1, buf, 3), 7);
    CU_ASSERT(buf[0] == 128000 && buf[1] == 128006 && buf[2] == 882 && buf[3] == -7);
    /* invalid UTF-8 is refused */
    CU_ASSERT_EQUAL(tp_tokenizer_encode(t, "ab\xC3(", 4, 0, 0, buf, 4), -1);
    CU_ASSERT_EQUAL(tp_tokenizer_encode(t, "\xED\xA0\x80", 3, 0, 0, buf, 4), -1); /* surrogate */
    /* empty input: only BOS */
    CU_ASSERT_EQUAL(tp_tokenizer_encode(t, "", 0, 1, 0, buf, 4), 1);
    CU_ASSERT_EQUAL(buf[0], 128000);
    tp_tokenizer_free(t);
}

static void test_specials_qwen3(void)
{
    tp_tokenizer_t *t = load_json_tok("qwen3");
    if (!t) return; /* ../shared data absent: recorded as a skip */
    CU_ASSERT_EQUAL(tp_tokenizer_bos(t), -1);
    CU_ASSERT(!tp_tokenizer_add_bos(t));
    CU_ASSERT_EQUAL(tp_tokenizer_eos(t), 151645); /* <|im_end|> per tokenizer_config */
    CU_ASSERT(tp_tokenizer_is_eog(t, 151645));
    CU_ASSERT(tp_tokenizer_is_eog(t, 151643)); /* <|endoftext|> */
    CU_ASSERT(!tp_tokenizer_is_eog(t, 151644));
    CU_ASSERT_EQUAL(tp_tokenizer_find_special(t, "<think>"), 151667);
    /* <think> is an added non-special token: matched even without parse_special */
    int n;
    int32_t *ids = encode(t, "a<think>b", 9, 1, 0, &n);
    CU_ASSERT(n == 3 && ids[1] == 151667);
    free(ids);
    tp_tokenizer_free(t);
}

static void test_specials_spm(void)
{
    tp_tokenizer_t *t = load_spm_gguf();
    /* llama.cpp: prefix space at the start and again after a special token */
    int n;
    int32_t *ids = encode(t, "Hello</s>world", 14, 1, 1, &n);
    const int32_t want[] = {1, 15043, 2, 3186};
    CU_ASSERT(n == 4 && memcmp(ids, want, sizeof(want)) == 0);
    if (n != 4) print_ids("got", ids, n);
    free(ids);
    ids = encode(t, "Hello</s>world", 14, 1, 0, &n);
    CU_ASSERT(n > 4 && ids[0] == 1);
    for (int i = 1; i < n; i++) CU_ASSERT(ids[i] != 2);
    free(ids);
    CU_ASSERT(tp_tokenizer_is_eog(t, 2));
    size_t len;
    const char *p = tp_tokenizer_piece(t, 15043, &len); /* "▁Hello" */
    CU_ASSERT(len == 6 && memcmp(p, " Hello", 6) == 0);
    p = tp_tokenizer_piece(t, 13, &len); /* <0x0A> */
    CU_ASSERT(len == 1 && p[0] == '\n');
    p = tp_tokenizer_piece(t, 99999, &len);
    CU_ASSERT(len == 0 && p != NULL);
    tp_tokenizer_free(t);
}

static void test_bundled_stories(void)
{
    tp_tokenizer_t *t = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_tokenizer_from_gguf(tp_test_repo_path("models/stories260K.gguf"), &t, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_tokenizer_n_vocab(t), 512);
    CU_ASSERT_EQUAL(tp_tokenizer_kind(t), TP_TOK_SPM);
    const char *s = "Once upon a time, there was a little girl named Lily.";
    int n;
    int32_t *ids = encode(t, s, strlen(s), 1, 0, &n);
    CU_ASSERT(n > 5 && ids[0] == 1);
    size_t dl;
    char *d = detok_all(t, ids, n, &dl);
    CU_ASSERT_STRING_EQUAL(d, s);
    free(d);
    free(ids);
    tp_tokenizer_free(t);
}

static const struct tp_test_case format_cases[] = {
    {"specials_spm", test_specials_spm},
    {"bundled_stories260K", test_bundled_stories},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_formats, "unit,model", 300, format_cases)
static const struct tp_test_case format_shared_cases[] = {
    {"gguf_llama3_vectors", test_gguf_llama3},
    {"gguf_qwen2_vectors", test_gguf_qwen2},
    {"specials_llama3", test_specials_llama3},
    {"specials_qwen3", test_specials_qwen3},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_formats_shared, "unit,model", 300, format_shared_cases)

/* ------------------------------------------------------------ detokenizer */

/* Push ids one at a time; every chunk must be valid UTF-8 on its own. */
static char *stream_all(const tp_tokenizer_t *t, const int32_t *ids, int n, size_t cap, size_t *len, int *chunks_valid)
{
    tp_detok_t *d = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_detok_init(t, &d), TP_OK);
    char *s = malloc(65536), piece[256];
    size_t o = 0;
    *chunks_valid = 1;
    for (int i = 0; i < n; i++) {
        size_t k = tp_detok_push(d, ids[i], piece, cap);
        if (k > cap || !tp_utf8_valid(piece, k)) *chunks_valid = 0;
        memcpy(s + o, piece, k);
        o += k;
    }
    for (;;) { /* drain: with a small cap the rest comes out over several flushes */
        size_t k = tp_detok_flush(d, piece, cap);
        if (k == 0) break;
        if (k > cap || !tp_utf8_valid(piece, k)) *chunks_valid = 0;
        memcpy(s + o, piece, k);
        o += k;
    }
    s[o] = 0;
    *len = o;
    tp_detok_free(d);
    return s;
}

static void test_detok_byte_tokens_spm(void)
{
    tp_tokenizer_t *t = load_spm_gguf();
    /* "🦙" has no piece in Llama 2: four <0xNN> byte tokens (243 162 169 156) */
    const char *s = "this is 🦙.cpp — 東京 ok";
    int n;
    int32_t *ids = encode(t, s, strlen(s), 1, 0, &n);
    int n_byte_tokens = 0;
    for (int i = 0; i < n; i++) n_byte_tokens += ids[i] >= 3 && ids[i] < 259;
    CU_ASSERT(n_byte_tokens >= 4);
    tp_detok_t *d = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_detok_init(t, &d), TP_OK);
    char out[64];
    /* partial character held back until its last byte token arrives */
    CU_ASSERT_EQUAL(tp_detok_push(d, 243, out, sizeof(out)), 0); /* <0xF0> */
    CU_ASSERT_EQUAL(tp_detok_push(d, 162, out, sizeof(out)), 0); /* <0x9F> */
    CU_ASSERT_EQUAL(tp_detok_push(d, 169, out, sizeof(out)), 0); /* <0xA6> */
    size_t k = tp_detok_push(d, 156, out, sizeof(out));          /* <0x99> */
    CU_ASSERT(k == 4 && memcmp(out, "\xF0\x9F\xA6\x99", 4) == 0);
    /* an incomplete tail at flush: one U+FFFD per maximal subpart */
    CU_ASSERT_EQUAL(tp_detok_push(d, 0xE2 + 3, out, sizeof(out)), 0);
    CU_ASSERT_EQUAL(tp_detok_push(d, 0x82 + 3, out, sizeof(out)), 0);
    k = tp_detok_flush(d, out, sizeof(out));
    CU_ASSERT(k == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0);
    CU_ASSERT_EQUAL(tp_detok_flush(d, out, sizeof(out)), 0);
    /* a byte that can never be valid comes out as U+FFFD at once, then the text */
    k = tp_detok_push(d, 0xFF + 3, out, sizeof(out));
    CU_ASSERT(k == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0);
    CU_ASSERT_EQUAL(tp_detok_push(d, 0xF0 + 3, out, sizeof(out)), 0);
    k = tp_detok_push(d, 'a' + 3, out, sizeof(out)); /* F0 then 'a': F0 alone is ill-formed */
    CU_ASSERT(k == 4 && memcmp(out, "\xEF\xBF\xBD" "a", 4) == 0);
    /* SentencePiece: the first piece loses its prefix space; BOS gives no text */
    tp_detok_reset(d);
    CU_ASSERT_EQUAL(tp_detok_push(d, 1, out, sizeof(out)), 0);
    k = tp_detok_push(d, 15043, out, sizeof(out));
    CU_ASSERT(k == 5 && memcmp(out, "Hello", 5) == 0);
    k = tp_detok_push(d, 3186, out, sizeof(out));
    CU_ASSERT(k == 6 && memcmp(out, " world", 6) == 0);
    tp_detok_free(d);
    tp_detok_free(NULL);
    /* whole stream, with roomy and with tiny output buffers */
    size_t caps[] = {256, 5, 4}; /* a 4-byte character needs cap >= 4 */
    for (size_t c = 0; c < TP_ARRAY_LEN(caps); c++) {
        size_t len;
        int valid;
        char *r = stream_all(t, ids, n, caps[c], &len, &valid);
        CU_ASSERT(valid);
        CU_ASSERT_STRING_EQUAL(r, s);
        if (strcmp(r, s) != 0) fprintf(stderr, "cap %zu: \"%s\"\n", caps[c], r);
        free(r);
    }
    free(ids);
    tp_tokenizer_free(t);
}

/* Byte-level: characters split across tokens (rare CJK / emoji) stream out whole. */
static void test_detok_stream_byte_level(void)
{
    tp_tokenizer_t *t = load_json_tok("llama3");
    if (!t) return; /* ../shared data absent: recorded as a skip */
    const char *s = "👨‍👩‍👧‍👦 𓀀 𝔘𝔫𝔦 龘龘 Ꭰ ขอบคุณ ăâđêôơư";
    int n;
    int32_t *ids = encode(t, s, strlen(s), 1, 0, &n);
    /* at least one token must end inside a character for this test to mean something */
    int split = 0;
    for (int i = 0; i < n; i++) {
        size_t pl;
        const char *p = tp_tokenizer_piece(t, ids[i], &pl);
        if (!tp_utf8_valid(p, pl)) split = 1;
    }
    CU_ASSERT(split);
    size_t len;
    int valid;
    char *r = stream_all(t, ids, n, 256, &len, &valid);
    CU_ASSERT(valid);
    CU_ASSERT_STRING_EQUAL(r, s);
    free(r);
    r = stream_all(t, ids, n, 4, &len, &valid);
    CU_ASSERT(valid);
    CU_ASSERT_STRING_EQUAL(r, s);
    free(r);
    free(ids);
    tp_tokenizer_free(t);
}

/* decode(encode(x)) == x on llama.cpp's inputs for the lossless tokenizers. */
static void round_trip_vectors(const tp_tokenizer_t *t, const char *name)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/tokenizer/ggml-vocab-%s.gguf.inp", name);
    char *inp = tp_test_read_file(tp_test_repo_path(rel), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inp);
    int bad = 0, n_in = 0;
    for (char *ip = inp;;) {
        char *e = strstr(ip, "\n__ggml_vocab_test__\n");
        if (e) *e = 0;
        int n;
        int32_t *ids = encode(t, ip, strlen(ip), 1, 0, &n);
        size_t len;
        int valid;
        char *r = stream_all(t, ids, n, 256, &len, &valid);
        if (!valid || strcmp(r, ip) != 0) {
            bad++;
            fprintf(stderr, "%s round trip differs: \"%s\" -> \"%s\"\n", name, ip, r);
        }
        free(r);
        free(ids);
        n_in++;
        if (!e) break;
        ip = e + strlen("\n__ggml_vocab_test__\n");
    }
    CU_ASSERT_EQUAL(n_in, 47);
    CU_ASSERT_EQUAL(bad, 0);
    free(inp);
}

static void test_round_trip_spm(void)
{
    tp_tokenizer_t *t = load_spm_gguf();
    round_trip_vectors(t, "llama-spm");
    tp_tokenizer_free(t);
}

static void test_round_trip_json(void)
{
    const char *dirs[] = {"llama3", "qwen3"}, *names[] = {"llama-bpe", "qwen2"};
    for (int i = 0; i < 2; i++) {
        tp_tokenizer_t *t = load_json_tok(dirs[i]);
        if (!t) continue; /* ../shared data absent: recorded as a skip */
        round_trip_vectors(t, names[i]);
        tp_tokenizer_free(t);
    }
}

static const struct tp_test_case detok_cases[] = {
    {"byte_tokens_spm", test_detok_byte_tokens_spm},
    {"round_trip_spm", test_round_trip_spm},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_detok, "unit,model", 300, detok_cases)
static const struct tp_test_case detok_shared_cases[] = {
    {"stream_byte_level", test_detok_stream_byte_level},
    {"round_trip_json", test_round_trip_json},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_detok_shared, "unit,model", 300, detok_shared_cases)

/* ------------------------------------------------------------ errors */

static const char *write_tmp(const char *name, const char *text)
{
    static char path[8][512];
    static int slot;
    char *p = path[slot++ % 8];
    snprintf(p, 512, "%s/%s", tp_test_tmpdir(), name);
    FILE *f = fopen(p, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
    return p;
}

static void expect_json_error(const char *file_text, enum tp_status want, const char *needle)
{
    const char *p = write_tmp("bad-tokenizer.json", file_text);
    tp_tokenizer_t *t = (tp_tokenizer_t *)1;
    struct tp_error err = {0};
    enum tp_status rc = tp_tokenizer_from_json(p, NULL, &t, &err);
    CU_ASSERT_EQUAL(rc, want);
    CU_ASSERT_PTR_NULL(t);
    if (!strstr(err.msg, needle)) fprintf(stderr, "error \"%s\" lacks \"%s\"\n", err.msg, needle);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, needle));
    if (!strstr(err.msg, "bad-tokenizer.json")) fprintf(stderr, "error \"%s\" lacks the file name\n", err.msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "bad-tokenizer.json"));
}

static void test_json_errors(void)
{
    tp_tokenizer_t *t = (tp_tokenizer_t *)1;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL(tp_tokenizer_from_json("/nonexistent/tokenizer.json", NULL, &t, &err), TP_ERR_IO);
    CU_ASSERT_PTR_NULL(t);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/nonexistent/tokenizer.json"));
    expect_json_error("{\"model\": {\"type\": \"BPE\", ", TP_ERR_FORMAT, "not valid JSON");
    expect_json_error("[1, 2]", TP_ERR_FORMAT, "no \"model\"");
    expect_json_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", TP_ERR_UNSUPPORTED, "Unigram");
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", TP_ERR_FORMAT, "empty vocabulary");
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -4}, \"merges\": []}}", TP_ERR_FORMAT,
                      "not an id");
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]},"
                      " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}}}",
                      TP_ERR_UNSUPPORTED, "neither a ByteLevel");
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]},"
                      " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\":"
                      " {\"Regex\": \"\\\\w+\"}}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}}",
                      TP_ERR_UNSUPPORTED, "regex \"\\w+\" is not supported");
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"pre_tokenizer\": {\"type\": \"Whitespace\"}}",
                      TP_ERR_UNSUPPORTED, "pre-tokenizer \"Whitespace\" is not supported");
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"normalizer\": {\"type\": \"Lowercase\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
                      TP_ERR_UNSUPPORTED, "normalizer \"Lowercase\" is not supported");
    /* byte-level vocabulary that cannot spell every byte */
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]},"
                      " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
                      TP_ERR_FORMAT, "lacks a token for byte 0x00");
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]},"
                      " \"pre_tokenizer\": {\"type\": \"Metaspace\"}}",
                      TP_ERR_FORMAT, "merges[0]");
}

/* A tiny SentencePiece tokenizer.json with byte fallback, made here. */
static void test_json_tiny_spm(void)
{
    char js[8192];
    size_t o = 0;
    o += (size_t)snprintf(js + o, sizeof(js) - o,
                          "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
                          "{\"id\": 1, \"content\": \"<s>\", \"special\": true}, {\"id\": 2, \"content\": \"</s>\", \"special\": true}],"
                          "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"first\"},"
                          "\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", \"vocab\": {"
                          "\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2");
    for (int b = 0; b < 256; b++) o += (size_t)snprintf(js + o, sizeof(js) - o, ", \"<0x%02X>\": %d", b, 3 + b);
    o += (size_t)snprintf(js + o, sizeof(js) - o,
                          ", \"\\u2581\": 259, \"h\": 260, \"i\": 261, \"hi\": 262, \"\\u2581hi\": 263},"
                          " \"merges\": [\"h i\", \"\\u2581 hi\"]}}");
    const char *p = write_tmp("tiny.json", js);
    const char *pc = write_tmp("tiny_config.json", "{\"add_bos_token\": true, \"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"}}");
    tp_tokenizer_t *t = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_tokenizer_from_json(p, pc, &t, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_tokenizer_kind(t), TP_TOK_SPM);
    CU_ASSERT_EQUAL(tp_tokenizer_bos(t), 1);
    CU_ASSERT_EQUAL(tp_tokenizer_eos(t), 2);
    CU_ASSERT(tp_tokenizer_add_bos(t));
    int n;
    int32_t *ids = encode(t, "hi hié", strlen("hi hié"), 1, 0, &n);
    /* <s> ▁hi ▁hi <0xC3> <0xA9> */
    const int32_t want[] = {1, 263, 263, 3 + 0xC3, 3 + 0xA9};
    CU_ASSERT(n == 5 && memcmp(ids, want, sizeof(want)) == 0);
    if (n != 5) print_ids("got", ids, n);
    size_t len;
    char *d = detok_all(t, ids, n, &len);
    CU_ASSERT_STRING_EQUAL(d, "hi hié");
    free(d);
    free(ids);
    tp_tokenizer_free(t);
}

static void test_gguf_errors(void)
{
    tp_tokenizer_t *t = (tp_tokenizer_t *)1;
    struct tp_error err = {0};
    CU_ASSERT_NOT_EQUAL(tp_tokenizer_from_gguf("/nonexistent/x.gguf", &t, &err), TP_OK);
    CU_ASSERT_PTR_NULL(t);
    CU_ASSERT(strlen(err.msg) > 0);
    struct {
        const char *model;
        int with_tokens, with_merges;
        enum tp_status want;
        const char *needle;
    } cases[] = {
        {NULL, 1, 0, TP_ERR_FORMAT, "tokenizer.ggml.model missing"},
        {"bert", 1, 0, TP_ERR_UNSUPPORTED, "\"bert\" is not supported"},
        {"gpt2", 0, 0, TP_ERR_FORMAT, "tokenizer.ggml.tokens missing"},
        {"gpt2", 1, 0, TP_ERR_FORMAT, "without tokenizer.ggml.merges"},
        {"llama", 1, 0, TP_ERR_FORMAT, "without tokenizer.ggml.scores"},
    };
    const char *toks[] = {"a", "b", "ab"};
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/bad-tok-%zu.gguf", tp_test_tmpdir(), i);
        tp_gguf_writer_t *w = NULL;
        CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(path, 0, &w, &err), TP_OK);
        tp_gguf_kv_str(w, "general.architecture", "llama");
        if (cases[i].model) tp_gguf_kv_str(w, "tokenizer.ggml.model", cases[i].model);
        if (cases[i].with_tokens) tp_gguf_kv_array_str(w, "tokenizer.ggml.tokens", toks, NULL, 3);
        CU_ASSERT_EQUAL(tp_gguf_writer_finish(w), TP_OK);
        tp_gguf_writer_free(w);
        struct tp_error e2 = {0};
        CU_ASSERT_EQUAL(tp_tokenizer_from_gguf(path, &t, &e2), cases[i].want);
        CU_ASSERT_PTR_NULL(t);
        if (!strstr(e2.msg, cases[i].needle)) fprintf(stderr, "error \"%s\" lacks \"%s\"\n", e2.msg, cases[i].needle);
        CU_ASSERT_PTR_NOT_NULL(strstr(e2.msg, cases[i].needle));
        CU_ASSERT_PTR_NOT_NULL(strstr(e2.msg, path));
    }
}

static void test_build_errors(void)
{
    struct tp_vocab_desc d;
    memset(&d, 0, sizeof(d));
    tp_tokenizer_t *t = (tp_tokenizer_t *)1;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL(tp_tokenizer_build(&d, &t, &err), TP_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(t);
    const char *toks[] = {"a", "b"};
    const char *merges[] = {"ab"};
    d.n_tokens = 2;
    d.tokens = toks;
    d.kind = TP_TOK_BPE;
    d.pretok = TP_PRETOK_GPT2;
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_tokenizer_build(&d, &t, &err), TP_ERR_FORMAT); /* no merges */
    d.kind = TP_TOK_SPM; /* SentencePiece without scores needs merges */
    d.pretok = TP_PRETOK_SPM;
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_tokenizer_build(&d, &t, &err), TP_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "neither scores nor merges"));
    d.n_merges = 1;
    d.merges = merges;
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_tokenizer_build(&d, &t, &err), TP_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "(\"ab\") is not \"left right\""));
    d.pretok = (enum tp_pretok)99;
    CU_ASSERT_EQUAL(tp_tokenizer_build(&d, &t, NULL), TP_ERR_UNSUPPORTED);
    /* encode argument checks */
    tp_tokenizer_t *s = load_spm_gguf();
    int32_t ids[4];
    CU_ASSERT_EQUAL(tp_tokenizer_encode(NULL, "a", 1, 0, 0, ids, 4), -1);
    CU_ASSERT_EQUAL(tp_tokenizer_encode(s, NULL, 1, 0, 0, ids, 4), -1);
    CU_ASSERT_EQUAL(tp_tokenizer_encode(s, "a", 1, 0, 0, NULL, 4), -1);
    CU_ASSERT_EQUAL(tp_tokenizer_encode(s, "a", 1, 1, 0, NULL, 0), 2); /* count only: <s> ▁a */
    tp_tokenizer_free(s);
    tp_tokenizer_free(NULL);
}

/* ------------------------------------------------------------ unicode */

static void expect_nfc(const char *in, const char *want)
{
    char *out;
    size_t len;
    CU_ASSERT_EQUAL_FATAL(tp_unicode_nfc(in, strlen(in), &out, &len), 0);
    CU_ASSERT_EQUAL(len, strlen(want));
    CU_ASSERT_STRING_EQUAL(out, want);
    free(out);
}

static void test_unicode(void)
{
    /* NFC: compose, reorder marks, Hangul, singletons, exclusions */
    expect_nfc("e\xCC\x81", "\xC3\xA9");                     /* e + U+0301 -> é */
    expect_nfc("a\xCC\xA3\xCC\x82", "\xE1\xBA\xAD");         /* a + dot below + circumflex -> ậ */
    expect_nfc("a\xCC\x82\xCC\xA3", "\xE1\xBA\xAD");         /* marks in the other order */
    expect_nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"); /* jamo -> 각 */
    expect_nfc("\xE2\x84\xAB", "\xC3\x85");                  /* U+212B ANGSTROM -> Å */
    expect_nfc("\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC");  /* U+0958 excluded: stays decomposed */
    expect_nfc("plain ascii", "plain ascii");
    expect_nfc("\xEF\xAC\x81", "\xEF\xAC\x81");              /* ﬁ: compatibility only, unchanged */
    char *out;
    size_t len;
    CU_ASSERT_EQUAL(tp_unicode_nfc("\xC3", 1, &out, &len), -1); /* invalid UTF-8 */
    /* classes */
    CU_ASSERT_EQUAL(tp_unicode_class('A'), TP_UCLS_LETTER);
    CU_ASSERT_EQUAL(tp_unicode_class('7'), TP_UCLS_NUMBER);
    CU_ASSERT_EQUAL(tp_unicode_class(' '), TP_UCLS_SPACE | 0u);
    CU_ASSERT(tp_unicode_class(0x3000) & TP_UCLS_SPACE);  /* ideographic space */
    CU_ASSERT(tp_unicode_class(0x85) & TP_UCLS_SPACE);    /* NEL */
    CU_ASSERT(!(tp_unicode_class(0x200B) & TP_UCLS_SPACE)); /* ZWSP is Cf, not White_Space */
    CU_ASSERT_EQUAL(tp_unicode_class(0x0663), TP_UCLS_NUMBER); /* ARABIC-INDIC THREE */
    CU_ASSERT_EQUAL(tp_unicode_class(0x216B), TP_UCLS_NUMBER); /* Ⅻ (Nl) */
    CU_ASSERT_EQUAL(tp_unicode_class(0x00BD), TP_UCLS_NUMBER); /* ½ (No) */
    CU_ASSERT_EQUAL(tp_unicode_class(0x4E2D), TP_UCLS_LETTER); /* 中 */
    CU_ASSERT_EQUAL(tp_unicode_class(0x0301), TP_UCLS_MARK);
    CU_ASSERT_EQUAL(tp_unicode_class(0x20AC), TP_UCLS_SYMBOL); /* € */
    CU_ASSERT_EQUAL(tp_unicode_class('!'), TP_UCLS_PUNCT);
    CU_ASSERT_EQUAL(tp_unicode_class(0x1F999), TP_UCLS_SYMBOL); /* 🦙 */
    CU_ASSERT_EQUAL(tp_unicode_class(0x10FFFF), 0u);
    CU_ASSERT_EQUAL(tp_unicode_category(0x1D518), TP_UCAT_LU); /* 𝔘 */
    CU_ASSERT_EQUAL(tp_unicode_ccc(0x0301), 230);
    CU_ASSERT_EQUAL(tp_unicode_ccc('a'), 0);
    /* UTF-8 validation and maximal subparts */
    uint32_t cp;
    CU_ASSERT_EQUAL(tp_utf8_decode((const unsigned char *)"\xF0\x9F\xA6\x99", 4, &cp), 4);
    CU_ASSERT_EQUAL(cp, 0x1F999u);
    CU_ASSERT_EQUAL(tp_utf8_decode((const unsigned char *)"\xC0\x80", 2, &cp), 0);      /* overlong */
    CU_ASSERT_EQUAL(tp_utf8_decode((const unsigned char *)"\xF4\x90\x80\x80", 4, &cp), 0); /* > U+10FFFF */
    CU_ASSERT_EQUAL(tp_utf8_check_prefix((const unsigned char *)"\xF0\x9F", 2), -2);
    CU_ASSERT_EQUAL(tp_utf8_check_prefix((const unsigned char *)"\xF0\x9F" "a", 3), 2);
    CU_ASSERT_EQUAL(tp_utf8_check_prefix((const unsigned char *)"\xE0\x80", 2), 1);
    CU_ASSERT_EQUAL(tp_utf8_check_prefix((const unsigned char *)"\x80", 1), 1);
    CU_ASSERT_EQUAL(tp_utf8_check_prefix((const unsigned char *)"\xC3\xA9", 2), 0);
    char buf[4];
    CU_ASSERT_EQUAL(tp_utf8_encode(0x10FFFF, buf), 4);
    CU_ASSERT(memcmp(buf, "\xF4\x8F\xBF\xBF", 4) == 0);
    uint32_t map[256];
    tp_unicode_gpt2_byte_map(map);
    CU_ASSERT_EQUAL(map[' '], 0x120u); /* Ġ */
    CU_ASSERT_EQUAL(map['\n'], 0x10Au); /* Ċ */
    CU_ASSERT_EQUAL(map['A'], (uint32_t)'A');
}

/* Special / added tokens: longest match first; control tokens only with
 * parse_special, user-defined ones always; pieces and detok of each kind. */
static void test_special_matching(void)
{
    const char *toks[263];
    int32_t types[263];
    float scores[263];
    char bytes[256][8];
    toks[0] = "<unk>", types[0] = TP_TOKEN_TYPE_UNKNOWN;
    toks[1] = "<s>", types[1] = TP_TOKEN_TYPE_CONTROL;
    toks[2] = "</s>", types[2] = TP_TOKEN_TYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof(bytes[b]), "<0x%02X>", b);
        toks[3 + b] = bytes[b];
        types[3 + b] = TP_TOKEN_TYPE_BYTE;
    }
    toks[259] = "\xE2\x96\x81", types[259] = TP_TOKEN_TYPE_NORMAL;
    toks[260] = "<x>", types[260] = TP_TOKEN_TYPE_USER_DEFINED;
    toks[261] = "<x>y", types[261] = TP_TOKEN_TYPE_USER_DEFINED;
    toks[262] = "<x>yz!", types[262] = TP_TOKEN_TYPE_CONTROL;
    for (int i = 0; i < 263; i++) scores[i] = 0.0f;
    struct tp_vocab_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = TP_TOK_SPM;
    d.pretok = TP_PRETOK_SPM;
    d.n_tokens = 263;
    d.tokens = toks;
    d.token_types = types;
    d.scores = scores;
    d.bos_id = 1, d.eos_id = 2, d.unk_id = 0, d.eot_id = -1, d.pad_id = -1;
    d.add_bos = 1;
    d.add_space_prefix = 1;
    d.byte_fallback = 1;
    tp_tokenizer_t *t = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_tokenizer_build(&d, &t, &err), TP_OK);
    int32_t ids[16];
    /* parse_special=0: user-defined <x>y (longest), then text "z!" (prefix space again after it) */
    int n = tp_tokenizer_encode(t, "<x>y<x>yz!", 10, 0, 0, ids, 16);
    CU_ASSERT_EQUAL(n, 5);
    CU_ASSERT(n == 5 && ids[0] == 261 && ids[1] == 261 && ids[2] == 259 && ids[3] == 3 + 'z' && ids[4] == 3 + '!');
    n = tp_tokenizer_encode(t, "<x>y<x>yz!", 10, 1, 1, ids, 16);
    CU_ASSERT(n == 3 && ids[0] == 1 && ids[1] == 261 && ids[2] == 262);
    CU_ASSERT_EQUAL(tp_tokenizer_find_special(t, "<x>yz!"), 262);
    CU_ASSERT_EQUAL(tp_tokenizer_find_special(t, "<x>"), 260);
    /* detok: control tokens silent, user-defined ones verbatim (no space stripped) */
    int32_t seq[] = {1, 260, 262, 259, 3 + 'q', 2};
    size_t len;
    char *dec = detok_all(t, seq, 6, &len);
    CU_ASSERT_STRING_EQUAL(dec, "<x> q");
    free(dec);
    tp_tokenizer_free(t);
}

static const struct tp_test_case unit_cases[] = {
    {"special_matching", test_special_matching},
    {"json_errors", test_json_errors},
    {"json_tiny_spm", test_json_tiny_spm},
    {"gguf_errors", test_gguf_errors},
    {"build_errors", test_build_errors},
    {"unicode", test_unicode},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_unit, "unit", 60, unit_cases)

/* ------------------------------------------------------------ long inputs */

/* 16 KB of mixed text and 64 KB pathological inputs (one long word, whitespace and digit
 * runs): the counting call and the filling call agree and decode(encode(x)) == x.  (Encode
 * speed is a benchmark's business, not a unit test's: ctest's timeout is the only bound here.) */
static void long_inputs_one(const tp_tokenizer_t *t, const char *name)
{
    const char *para = "The quick brown fox jumps over the lazy dog. It's 2024-06-01, and we've shipped v3.14 "
                       "to 1,234,567 users! Ça coûte 12,50 € — naïve café. Zürich, Москва, 東京, 서울. "
                       "if (x != 0) { return y / x; } // done\n\tfor i in range(100):\n";
    size_t pl = strlen(para), n = 0;
    char *s = malloc(65537);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    while (n + pl < 16384) {
        memcpy(s + n, para, pl);
        n += pl;
    }
    for (int kind = 0; kind < 4; kind++) {
        size_t len = kind == 0 ? n : 65536;
        if (kind == 1) memset(s, 'a', len);
        if (kind == 2) memset(s, ' ', len);
        if (kind == 3)
            for (size_t i = 0; i < len; i++) s[i] = (char)('0' + i % 10);
        s[len] = 0;
        int cnt = tp_tokenizer_encode(t, s, len, 0, 0, NULL, 0);
        CU_ASSERT_FATAL(cnt > 0);
        int32_t *ids = malloc((size_t)cnt * sizeof(int32_t));
        CU_ASSERT_EQUAL(tp_tokenizer_encode(t, s, len, 0, 0, ids, cnt), cnt);
        size_t dl;
        char *dec = detok_all(t, ids, cnt, &dl);
        if (dl != len || memcmp(dec, s, len) != 0) fprintf(stderr, "%s: input %d (%zu B) does not round-trip\n", name, kind, len);
        CU_ASSERT(dl == len && memcmp(dec, s, len) == 0);
        free(dec);
        free(ids);
    }
    free(s);
}

static void test_long_inputs_spm(void)
{
    tp_tokenizer_t *t = load_spm_gguf();
    long_inputs_one(t, "llama2-spm");
    tp_tokenizer_free(t);
}

static void test_long_inputs_json(void)
{
    const char *dirs[] = {"llama3", "qwen3"};
    for (int i = 0; i < 2; i++) {
        tp_tokenizer_t *t = load_json_tok(dirs[i]);
        if (!t) continue; /* ../shared data absent: recorded as a skip */
        long_inputs_one(t, dirs[i]);
        tp_tokenizer_free(t);
    }
}

/* ------------------------------------------------------------ random robustness */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Random byte strings: encode never crashes, refuses invalid UTF-8 with -1,
 * and valid text round-trips through the streaming decoder (SentencePiece
 * and Llama 3 are lossless; Qwen2 gives the NFC form). */
static void random_inputs(tp_tokenizer_t *toks[3])
{
    static const uint32_t pool[] = {' ', ' ', '\n', '\r', '\t', 'a', 'Z', '\'', 's', '7', '0', '.', '<', '|', '>',
                                    0xA0, 0xE9, 0x301, 0x3000, 0x4E2D, 0x1F999, 0x10FFFF, 0x2581, 0xFFFD, 0x85, 0};
    uint64_t seed = 0x9E3779B97F4A7C15ULL;
    char buf[256];
    int n_valid = 0, n_invalid = 0, bad = 0;
    for (int iter = 0; iter < 600; iter++) {
        size_t len = 0;
        int mode = (int)(rng_next(&seed) % 3);
        size_t n = 1 + rng_next(&seed) % 40;
        for (size_t j = 0; j < n && len + 4 < sizeof(buf); j++) {
            if (mode == 0) { /* raw bytes: mostly invalid */
                buf[len++] = (char)(rng_next(&seed) & 0xFF);
            } else {
                uint32_t cp = pool[rng_next(&seed) % TP_ARRAY_LEN(pool)];
                len += (size_t)tp_utf8_encode(cp, buf + len);
            }
        }
        int valid = tp_utf8_valid(buf, len);
        n_valid += valid;
        n_invalid += !valid;
        for (int k = 0; k < 3; k++) {
            if (!toks[k]) continue;
            int cnt = tp_tokenizer_encode(toks[k], buf, len, 1, iter & 1, NULL, 0);
            if (!valid) {
                if (cnt != -1) bad++;
                continue;
            }
            if (cnt < 0) {
                bad++;
                continue;
            }
            int32_t *ids = malloc(((size_t)cnt + 1) * sizeof(int32_t));
            CU_ASSERT_EQUAL(tp_tokenizer_encode(toks[k], buf, len, 1, iter & 1, ids, cnt), cnt);
            size_t dl;
            int ok;
            char *dec = stream_all(toks[k], ids, cnt, 64, &dl, &ok);
            char *want = NULL;
            size_t wl = len;
            if (k == 2) CU_ASSERT_EQUAL_FATAL(tp_unicode_nfc(buf, len, &want, &wl), 0);
            const char *w = want ? want : buf;
            /* with parse_special the text may contain a special token's text, which decodes to
             * nothing when it is a control token: only compare when no special was produced */
            int has_special = 0;
            /* SentencePiece writes spaces as U+2581: an input U+2581 decodes as a space */
            for (size_t i = 0; k == 0 && i + 2 < len; i++)
                if (!memcmp(buf + i, "\xE2\x96\x81", 3)) has_special = 1;
            for (int i = 0; i < cnt; i++)
                if (ids[i] == tp_tokenizer_bos(toks[k]) || tp_tokenizer_is_eog(toks[k], ids[i])) has_special |= i > 0;
            if (!ok || (!has_special && (dl != wl || memcmp(dec, w, wl) != 0))) {
                bad++;
                fprintf(stderr, "tokenizer %d: round trip of %zu bytes failed:", k, len);
                for (size_t i = 0; i < len; i++) fprintf(stderr, " %02x", (unsigned char)buf[i]);
                fprintf(stderr, "\n  ->");
                for (size_t i = 0; i < dl; i++) fprintf(stderr, " %02x", (unsigned char)dec[i]);
                fprintf(stderr, "\n");
            }
            free(want);
            free(dec);
            free(ids);
        }
    }
    CU_ASSERT(n_valid > 300 && n_invalid > 100);
    CU_ASSERT_EQUAL(bad, 0);
    for (int k = 0; k < 3; k++) tp_tokenizer_free(toks[k]);
}

static void test_random_spm(void) { random_inputs((tp_tokenizer_t *[3]){load_spm_gguf(), NULL, NULL}); }

static void test_random_json(void)
{
    tp_tokenizer_t *toks[3] = {NULL, load_json_tok("llama3"), load_json_tok("qwen3")};
    if (!toks[1] && !toks[2]) return; /* ../shared data absent: recorded as a skip */
    random_inputs(toks);
}

/* Two threads encoding with one tokenizer get the same ids as one thread. */
struct enc_job {
    const tp_tokenizer_t *t;
    const char *text;
    int n;
    int32_t ids[4096];
    int mismatches;
};

static void *enc_thread(void *arg)
{
    struct enc_job *j = arg;
    for (int r = 0; r < 50; r++) {
        int32_t ids[4096];
        int n = tp_tokenizer_encode(j->t, j->text, strlen(j->text), 1, 1, ids, 4096);
        if (n != j->n || memcmp(ids, j->ids, (size_t)n * sizeof(int32_t)) != 0) j->mismatches++;
    }
    return NULL;
}

static void test_concurrent_encode(void)
{
    tp_tokenizer_t *t = load_json_tok("qwen3");
    if (!t) return; /* ../shared data absent: recorded as a skip */
    static struct enc_job jobs[2];
    const char *texts[2] = {"<|im_start|>user\nCafe\u0301 naïve 東京 1234567 🦙🦙 it's fine<|im_end|>\n",
                            "def f(x):\n    return x ** 2  # e\u0301\u0323 ZWJ 👨‍👩‍👧\n\n\n"};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        jobs[i].t = t;
        jobs[i].text = texts[i];
        jobs[i].mismatches = 0;
        jobs[i].n = tp_tokenizer_encode(t, texts[i], strlen(texts[i]), 1, 1, jobs[i].ids, 4096);
        CU_ASSERT(jobs[i].n > 10);
    }
    for (int i = 0; i < 2; i++) CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, enc_thread, &jobs[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CU_ASSERT_EQUAL(jobs[0].mismatches, 0);
    CU_ASSERT_EQUAL(jobs[1].mismatches, 0);
    tp_tokenizer_free(t);
}

static const struct tp_test_case random_cases[] = {
    {"random_inputs_spm", test_random_spm},
    {"long_inputs_spm", test_long_inputs_spm},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_random, "unit,model", 300, random_cases)
static const struct tp_test_case random_shared_cases[] = {
    {"random_inputs_json", test_random_json},
    {"long_inputs_json", test_long_inputs_json},
    {"concurrent_encode", test_concurrent_encode},
    {NULL, NULL},
};
TP_TEST_SUITE(tokenizer_random_shared, "unit,model", 300, random_shared_cases)

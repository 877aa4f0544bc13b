/* tests/model/test_synth.c - shapes as data, the streaming GGUF writer and
 * `synth` models, read back with the validating GGUF reader (model/gguf.h):
 * every key, tensor name, dim and type is checked against the shape, the
 * weight statistics against the stated distribution, and files are
 * reproducible (same seed and any thread count give the same bytes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/kernels.h"
#include "model/synth.h"
#include "model/synth/synth_impl.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "tp_test.h"
#include "model_test_util.h"

static const char *tmp_path(const char *name)
{
    static char buf[8][512];
    static int slot;
    char *p = buf[slot++ % 8];
    snprintf(p, 512, "%s/%s", tp_test_tmpdir(), name);
    return p;
}

/* ------------------------------------------------------------------ shapes */

static void test_shapes_builtin(void)
{
    struct tp_shape *arr = NULL;
    int n = 0;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_shapes_parse(tp_shapes_builtin_json(), &arr, &n, &err), TP_OK);
    CU_ASSERT(n >= 20);
    const char *want[] = {"tinyllama-1.1b", "llama2-7b",    "llama3-8b",   "llama3-70b",  "llama3.2-1b", "mistral-7b",
                          "qwen2.5-0.5b",   "qwen2.5-7b",   "qwen3-0.6b",  "qwen3-8b",    "smollm2-135m", "smollm2-360m",
                          "test-tiny"};
    for (size_t i = 0; i < TP_ARRAY_LEN(want); i++) {
        int found = 0;
        for (int j = 0; j < n; j++) found |= strcmp(arr[j].name, want[i]) == 0;
        if (!found) fprintf(stderr, "missing shape %s\n", want[i]);
        CU_ASSERT(found);
    }
    free(arr);

    struct tp_shape s;
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "tinyllama-1.1b", &s, &err), TP_OK);
    CU_ASSERT_EQUAL(s.n_embd, 2048);
    CU_ASSERT_EQUAL(s.n_layer, 22);
    CU_ASSERT_EQUAL(s.n_head_kv, 4);
    CU_ASSERT_EQUAL(s.head_dim, 64);
    CU_ASSERT_EQUAL(s.n_ff, 5632);
    /* TinyLlama-1.1B has 1,100,048,384 parameters */
    CU_ASSERT_EQUAL(tp_shape_n_params(&s), 1100048384ull);
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "llama3-8b", &s, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_shape_n_params(&s), 8030261248ull); /* Meta-Llama-3-8B */
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "qwen3-0.6b", &s, &err), TP_OK);
    CU_ASSERT_EQUAL(s.head_dim, 128);
    CU_ASSERT(s.qk_norm && s.tied && s.arch == TP_ARCH_QWEN3);
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "llama3.2-1b", &s, &err), TP_OK);
    CU_ASSERT_EQUAL(s.rope_scaling, TP_ROPE_SCALING_LLAMA3);
    CU_ASSERT_DOUBLE_EQUAL(s.rope_factor, 32.0, 1e-6);

    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_shape_find(NULL, "llama9-1t", &s, &err), TP_ERR_NOT_FOUND);
    CU_ASSERT(strstr(err.msg, "llama9-1t") && strstr(err.msg, "tinyllama-1.1b"));
}

static void test_shapes_bad(void)
{
    struct {
        const char *json, *needle;
    } cases[] = {
        {"not json", "JSON"},
        {"{\"shapes\": []}", "at least one"},
        {"{\"shapes\": [{\"arch\": \"llama\"}]}", "name"},
        {"{\"shapes\": [{\"name\": \"x\", \"arch\": \"gpt9\", \"n_embd\": 64}]}", "gpt9"},
        {"{\"shapes\": [{\"name\": \"x\", \"arch\": \"llama\", \"n_embd\": 64, \"n_layer\": 1, \"n_head\": 4, "
         "\"n_head_kv\": 3, \"n_ff\": 64, \"n_vocab\": 300, \"n_ctx\": 16}]}",
         "n_head_kv"},
        {"{\"shapes\": [{\"name\": \"x\", \"arch\": \"llama\", \"n_embd\": \"64\"}]}", "wrong JSON type"},
        {"{\"shapes\": [{\"name\": \"x\", \"arch\": \"llama\", \"n_embd\": 64, \"n_layer\": 1, \"n_head\": 4, "
         "\"n_ff\": 64, \"n_vocab\": 300, \"n_ctx\": 16, \"qk_norm\": true}]}",
         "qwen3"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        struct tp_shape *arr = (struct tp_shape *)1;
        int n = -1;
        struct tp_error err = {0};
        CU_ASSERT_NOT_EQUAL(tp_shapes_parse(cases[i].json, &arr, &n, &err), TP_OK);
        CU_ASSERT_PTR_NULL(arr);
        if (!strstr(err.msg, cases[i].needle)) fprintf(stderr, "case %zu: '%s' lacks '%s'\n", i, err.msg, cases[i].needle);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, cases[i].needle));
    }
}

/* ------------------------------------------------------------------ writer */

static void test_writer_roundtrip(void)
{
    const char *path = tmp_path("w.gguf");
    tp_gguf_writer_t *w = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(path, 64, &w, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_u32(w, "general.alignment", 64), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_str(w, "general.name", "roundtrip"), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_i32(w, "t.i32", -7), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_u64(w, "t.u64", 1ull << 40), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_f32(w, "t.f32", 0.25f), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_bool(w, "t.bool", 1), TP_OK);
    int16_t i16 = -300;
    CU_ASSERT_EQUAL(tp_gguf_kv_scalar(w, "t.i16", TP_GGUF_INT16, &i16), TP_OK);
    double f64 = 1.5;
    CU_ASSERT_EQUAL(tp_gguf_kv_scalar(w, "t.f64", TP_GGUF_FLOAT64, &f64), TP_OK);
    const int32_t ai[4] = {1, -2, 3, 1 << 30};
    CU_ASSERT_EQUAL(tp_gguf_kv_array(w, "t.ai32", TP_GGUF_INT32, ai, 4), TP_OK);
    const float af[3] = {0.5f, -1.0f, 2.0f};
    CU_ASSERT_EQUAL(tp_gguf_kv_array(w, "t.af32", TP_GGUF_FLOAT32, af, 3), TP_OK);
    const char *as[3] = {"a", "", "\xE2\x96\x81hello"};
    CU_ASSERT_EQUAL(tp_gguf_kv_array_str(w, "t.astr", as, NULL, 3), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_array(w, "t.empty", TP_GGUF_UINT8, NULL, 0), TP_OK);

    const int64_t ne_a[2] = {32, 3}, ne_b[1] = {5}, ne_c[2] = {64, 2};
    CU_ASSERT_EQUAL(tp_gguf_add_tensor(w, "a", TP_WTYPE_Q8_0, 2, ne_a), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_add_tensor(w, "b", TP_WTYPE_F32, 1, ne_b), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_add_tensor(w, "c", TP_WTYPE_F16, 2, ne_c), TP_OK);
    const int64_t bad[2] = {33, 1};
    CU_ASSERT_EQUAL(tp_gguf_tensor_bytes(TP_WTYPE_Q4_0, 2, bad), 0u);

    uint8_t a[3 * 34], b[20], c[256];
    for (size_t i = 0; i < sizeof(a); i++) a[i] = (uint8_t)(i * 7);
    for (size_t i = 0; i < sizeof(b); i++) b[i] = (uint8_t)(100 + i);
    for (size_t i = 0; i < sizeof(c); i++) c[i] = (uint8_t)(255 - i);
    /* tensor a in two pieces, b whole, c in four */
    CU_ASSERT_EQUAL(tp_gguf_write_data(w, a, 40), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_write_data(w, a + 40, sizeof(a) - 40), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_write_data(w, b, sizeof(b)), TP_OK);
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(tp_gguf_write_data(w, c + 64 * i, 64), TP_OK);
    uint64_t expect_size = tp_gguf_writer_file_bytes(w);
    CU_ASSERT_EQUAL(tp_gguf_writer_finish(w), TP_OK);
    tp_gguf_writer_free(w);

    tp_gguf_t *g = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_version(g), 3u);
    CU_ASSERT_EQUAL(tp_gguf_alignment(g), 64u);
    if (tp_gguf_file_size(g) != expect_size) fprintf(stderr, "size %llu want %llu\n", (unsigned long long)tp_gguf_file_size(g), (unsigned long long)expect_size);
    CU_ASSERT_EQUAL(tp_gguf_file_size(g), expect_size);
    CU_ASSERT_EQUAL(tp_gguf_n_kv(g), 12);
    const char *str = NULL;
    int64_t iv = 0;
    uint64_t uv = 0;
    double dv = 0;
    int bv = 0;
    CU_ASSERT(tp_gguf_get_str(g, "general.name", &str) == TP_OK && strcmp(str, "roundtrip") == 0);
    CU_ASSERT(tp_gguf_get_int(g, "t.i32", &iv) == TP_OK && iv == -7);
    CU_ASSERT(tp_gguf_get_u64(g, "t.u64", &uv) == TP_OK && uv == (1ull << 40));
    CU_ASSERT(tp_gguf_get_float(g, "t.f32", &dv) == TP_OK && dv == 0.25);
    CU_ASSERT(tp_gguf_get_bool(g, "t.bool", &bv) == TP_OK && bv == 1);
    CU_ASSERT(tp_gguf_get_int(g, "t.i16", &iv) == TP_OK && iv == -300);
    CU_ASSERT(tp_gguf_get_float(g, "t.f64", &dv) == TP_OK && dv == 1.5);
    CU_ASSERT_EQUAL(tp_gguf_kv_type(g, tp_gguf_find_key(g, "t.i16")), TP_GGUF_INT16);
    int k = tp_gguf_find_key(g, "t.ai32");
    int32_t ai_back[4];
    CU_ASSERT_EQUAL(tp_gguf_arr_type(g, k), TP_GGUF_INT32);
    CU_ASSERT(tp_gguf_arr_copy_i32(g, k, ai_back, 4) == TP_OK && memcmp(ai, ai_back, sizeof(ai)) == 0);
    float af_back[3];
    CU_ASSERT(tp_gguf_arr_copy_f32(g, tp_gguf_find_key(g, "t.af32"), af_back, 3) == TP_OK &&
              memcmp(af, af_back, sizeof(af)) == 0);
    k = tp_gguf_find_key(g, "t.astr");
    CU_ASSERT_EQUAL(tp_gguf_arr_len(g, k), 3u);
    for (int i = 0; i < 3; i++) {
        size_t len = 99;
        const char *s = tp_gguf_arr_str(g, k, (uint64_t)i, &len);
        CU_ASSERT(s && len == strlen(as[i]) && memcmp(s, as[i], len) == 0);
    }
    CU_ASSERT_EQUAL(tp_gguf_arr_len(g, tp_gguf_find_key(g, "t.empty")), 0u);
    CU_ASSERT_EQUAL_FATAL(tp_gguf_n_tensors(g), 3);
    const struct tp_gguf_tensor *ta = tp_gguf_find_tensor(g, "a"), *tb = tp_gguf_find_tensor(g, "b"),
                                *tc = tp_gguf_find_tensor(g, "c");
    CU_ASSERT_FATAL(ta && tb && tc);
    CU_ASSERT(ta->type == TP_WTYPE_Q8_0 && ta->n_dims == 2 && ta->ne[0] == 32 && ta->ne[1] == 3);
    CU_ASSERT(tb->type == TP_WTYPE_F32 && tb->n_dims == 1 && tb->ne[0] == 5);
    CU_ASSERT(tc->type == TP_WTYPE_F16 && tc->ne[0] == 64 && tc->ne[1] == 2);
    CU_ASSERT(ta->file_offset % 64 == 0 && tb->file_offset % 64 == 0 && tc->file_offset % 64 == 0);
    CU_ASSERT(ta->n_bytes == sizeof(a) && memcmp(ta->data, a, sizeof(a)) == 0);
    CU_ASSERT(tb->n_bytes == sizeof(b) && memcmp(tb->data, b, sizeof(b)) == 0);
    CU_ASSERT(tc->n_bytes == sizeof(c) && memcmp(tc->data, c, sizeof(c)) == 0);
    tp_gguf_close(g);
}

static void test_writer_misuse(void)
{
    const char *path = tmp_path("bad.gguf");
    tp_gguf_writer_t *w = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL(tp_gguf_writer_open(path, 24, &w, &err), TP_ERR_INVALID_ARG); /* not a power of two */
    CU_ASSERT_PTR_NULL(w);
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_gguf_writer_open("/nonexistent-dir/x.gguf", 32, &w, &err), TP_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/nonexistent-dir/x.gguf"));

    /* a chunk crossing a tensor's end is refused, the error sticks, the partial file is removed */
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(path, 32, &w, &err), TP_OK);
    const int64_t ne[1] = {4};
    CU_ASSERT_EQUAL(tp_gguf_add_tensor(w, "x", TP_WTYPE_F32, 1, ne), TP_OK);
    const int64_t ne_bad[1] = {30};
    CU_ASSERT_EQUAL(tp_gguf_add_tensor(w, "q", TP_WTYPE_Q4_0, 1, ne_bad), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_gguf_writer_error(w), "'q'"));
    tp_gguf_writer_free(w);
    CU_ASSERT_NOT_EQUAL(access(path, F_OK), 0);

    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(path, 32, &w, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_add_tensor(w, "x", TP_WTYPE_F32, 1, ne), TP_OK);
    float v[5] = {0};
    CU_ASSERT_EQUAL(tp_gguf_write_data(w, v, sizeof(v)), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(tp_gguf_writer_finish(w), TP_ERR_INVALID_ARG);
    tp_gguf_writer_free(w);
    CU_ASSERT_NOT_EQUAL(access(path, F_OK), 0);

    /* a failed write leaves an existing file at path untouched (written via path.partial) */
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("old", f);
    fclose(f);
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(path, 32, &w, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_add_tensor(w, "x", TP_WTYPE_F32, 1, ne), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_writer_finish(w), TP_ERR_INVALID_ARG);
    tp_gguf_writer_free(w);
    size_t old_len = 0;
    char *old = tp_test_read_file(path, &old_len);
    CU_ASSERT(old && old_len == 3 && memcmp(old, "old", 3) == 0);
    free(old);
    char partial[600];
    snprintf(partial, sizeof(partial), "%s.partial", path);
    CU_ASSERT_NOT_EQUAL(access(partial, F_OK), 0);
    remove(path);

    /* finish with a tensor still missing bytes */
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(path, 32, &w, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_add_tensor(w, "x", TP_WTYPE_F32, 1, ne), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_write_data(w, v, 8), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_u32(w, "late.key", 1), TP_ERR_INVALID_ARG); /* after data started */
    CU_ASSERT_EQUAL(tp_gguf_writer_finish(w), TP_ERR_INVALID_ARG);
    tp_gguf_writer_free(w);
    CU_ASSERT_NOT_EQUAL(access(path, F_OK), 0);
    tp_gguf_writer_free(NULL);
}

/* ------------------------------------------------------------------ synth */

static enum tp_status synth(const char *shape_name, enum tp_wtype t, const char *tok, uint64_t seed, int threads,
                            int layers, const char *path)
{
    const struct tm_synth w = {
        .shape = shape_name, .tokenizer = tok, .type = t, .seed = seed, .threads = threads, .layers = layers};
    struct tp_error err = {0};
    return tm_synth(&w, path, &err);
}

static int64_t get_i(tp_gguf_t *g, const char *key)
{
    int64_t v = -12345;
    if (tp_gguf_get_int(g, key, &v) != TP_OK) fprintf(stderr, "key %s missing\n", key);
    return v;
}

/* Check one tensor's presence, type and dims. */
static const struct tp_gguf_tensor *want_tensor(tp_gguf_t *g, const char *name, enum tp_wtype type, int64_t ne0,
                                                int64_t ne1)
{
    const struct tp_gguf_tensor *t = tp_gguf_find_tensor(g, name);
    if (!t) {
        fprintf(stderr, "tensor %s missing\n", name);
        CU_FAIL("tensor missing");
        return NULL;
    }
    int ok = t->type == type && t->ne[0] == ne0 && t->n_dims == (ne1 > 0 ? 2 : 1) && (ne1 <= 0 || t->ne[1] == ne1);
    if (!ok)
        fprintf(stderr, "tensor %s: type %s dims %d [%lld, %lld], want %s [%lld, %lld]\n", name, tp_wtype_name(t->type),
                t->n_dims, (long long)t->ne[0], (long long)t->ne[1], tp_wtype_name(type), (long long)ne0, (long long)ne1);
    CU_ASSERT(ok);
    return t;
}

/* Every key and tensor of a synthetic model against its shape. */
static void check_model(const char *path, const struct tp_shape *s, enum tp_wtype wt, int n_vocab)
{
    tp_gguf_t *g = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
    const char *arch = NULL, *tm = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_gguf_get_str(g, "general.architecture", &arch), TP_OK);
    CU_ASSERT_STRING_EQUAL(arch, tp_arch_name(s->arch));
    CU_ASSERT_EQUAL(tp_gguf_alignment(g), 32u);
    char k[128];
#define KEY(suffix) (snprintf(k, sizeof(k), "%s.%s", arch, suffix), k)
    CU_ASSERT_EQUAL(get_i(g, KEY("context_length")), s->n_ctx);
    CU_ASSERT_EQUAL(get_i(g, KEY("embedding_length")), s->n_embd);
    CU_ASSERT_EQUAL(get_i(g, KEY("block_count")), s->n_layer);
    CU_ASSERT_EQUAL(get_i(g, KEY("feed_forward_length")), s->n_ff);
    CU_ASSERT_EQUAL(get_i(g, KEY("attention.head_count")), s->n_head);
    CU_ASSERT_EQUAL(get_i(g, KEY("attention.head_count_kv")), s->n_head_kv);
    CU_ASSERT_EQUAL(get_i(g, KEY("rope.dimension_count")), s->head_dim);
    if (s->head_dim * s->n_head != s->n_embd) {
        CU_ASSERT_EQUAL(get_i(g, KEY("attention.key_length")), s->head_dim);
    }
    double d = 0;
    CU_ASSERT(tp_gguf_get_float(g, KEY("rope.freq_base"), &d) == TP_OK && fabs(d - s->rope_theta) < 1e-3 * s->rope_theta);
    CU_ASSERT(tp_gguf_get_float(g, KEY("attention.layer_norm_rms_epsilon"), &d) == TP_OK &&
              fabs(d - s->norm_eps) < 1e-3 * s->norm_eps);
    CU_ASSERT_EQUAL(tp_gguf_find_key(g, KEY("rope.scaling.factor")), -1); /* llama3 scaling is rope_freqs, not keys */
#undef KEY
    CU_ASSERT_EQUAL_FATAL(tp_gguf_get_str(g, "tokenizer.ggml.model", &tm), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_arr_len(g, tp_gguf_find_key(g, "tokenizer.ggml.tokens")), (uint64_t)n_vocab);
    CU_ASSERT_EQUAL(tp_gguf_arr_len(g, tp_gguf_find_key(g, "tokenizer.ggml.token_type")), (uint64_t)n_vocab);

    const int64_t e = s->n_embd, q = (int64_t)s->n_head * s->head_dim, kv = (int64_t)s->n_head_kv * s->head_dim;
    int expect = 2 + !s->tied + (s->rope_scaling == TP_ROPE_SCALING_LLAMA3) +
                 s->n_layer * (9 + 3 * s->qkv_bias + 2 * s->qk_norm);
    CU_ASSERT_EQUAL(tp_gguf_n_tensors(g), expect);
    want_tensor(g, "token_embd.weight", wt, e, n_vocab);
    const struct tp_gguf_tensor *on = want_tensor(g, "output_norm.weight", TP_WTYPE_F32, e, 0);
    if (s->tied) {
        CU_ASSERT_PTR_NULL(tp_gguf_find_tensor(g, "output.weight"));
    } else {
        want_tensor(g, "output.weight", wt, e, n_vocab);
    }
    if (s->rope_scaling == TP_ROPE_SCALING_LLAMA3) {
        const struct tp_gguf_tensor *rf = want_tensor(g, "rope_freqs.weight", TP_WTYPE_F32, s->head_dim / 2, 0);
        if (rf) { /* highest frequency unscaled, lowest scaled by the factor */
            const float *f = rf->data;
            CU_ASSERT_DOUBLE_EQUAL(f[0], 1.0, 1e-6);
            CU_ASSERT_DOUBLE_EQUAL(f[s->head_dim / 2 - 1], s->rope_factor, 1e-4);
        }
    }
    for (int l = 0; l < s->n_layer; l++) {
        char n[64];
#define BLK(sfx) (snprintf(n, sizeof(n), "blk.%d.%s", l, sfx), n)
        want_tensor(g, BLK("attn_norm.weight"), TP_WTYPE_F32, e, 0);
        want_tensor(g, BLK("attn_q.weight"), wt, e, q);
        want_tensor(g, BLK("attn_k.weight"), wt, e, kv);
        want_tensor(g, BLK("attn_v.weight"), wt, e, kv);
        want_tensor(g, BLK("attn_output.weight"), wt, q, e);
        want_tensor(g, BLK("ffn_norm.weight"), TP_WTYPE_F32, e, 0);
        want_tensor(g, BLK("ffn_gate.weight"), wt, e, s->n_ff);
        want_tensor(g, BLK("ffn_up.weight"), wt, e, s->n_ff);
        want_tensor(g, BLK("ffn_down.weight"), wt, s->n_ff, e);
        if (s->qkv_bias) {
            want_tensor(g, BLK("attn_q.bias"), TP_WTYPE_F32, q, 0);
            want_tensor(g, BLK("attn_k.bias"), TP_WTYPE_F32, kv, 0);
            want_tensor(g, BLK("attn_v.bias"), TP_WTYPE_F32, kv, 0);
        }
        if (s->qk_norm) {
            want_tensor(g, BLK("attn_q_norm.weight"), TP_WTYPE_F32, s->head_dim, 0);
            want_tensor(g, BLK("attn_k_norm.weight"), TP_WTYPE_F32, s->head_dim, 0);
        }
#undef BLK
    }
    /* value statistics: norms in [0.95, 1.05]; matrices mean ~0, std 0.02 +- 5% (quantization adds a little) */
    if (on) {
        const float *x = on->data;
        int ok = 1;
        for (int64_t i = 0; i < on->ne[0]; i++) ok &= x[i] >= 0.95f && x[i] <= 1.05f;
        CU_ASSERT(ok);
    }
    const struct tp_gguf_tensor *ff = tp_gguf_find_tensor(g, "blk.0.ffn_gate.weight");
    if (ff) {
        int64_t n = ff->n_elems;
        float *x = malloc((size_t)n * sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(x);
        tp_kern_dequant(ff->type, ff->data, x, n);
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < n; i++) {
            sum += x[i];
            sq += (double)x[i] * x[i];
        }
        double mean = sum / n, sd = sqrt(sq / n - mean * mean);
        if (fabs(sd - 0.02) > 0.001) fprintf(stderr, "%s: std %.5f\n", tp_wtype_name(ff->type), sd);
        CU_ASSERT(fabs(mean) < 0.002);
        CU_ASSERT(fabs(sd - 0.02) < 0.001);
        free(x);
    }
    tp_gguf_close(g);
}

static void test_synth_types(void)
{
    const enum tp_wtype types[] = {TP_WTYPE_F32, TP_WTYPE_F16, TP_WTYPE_BF16, TP_WTYPE_Q8_0, TP_WTYPE_Q4_0};
    struct tp_shape s;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "test-tiny", &s, &err), TP_OK);
    for (size_t i = 0; i < TP_ARRAY_LEN(types); i++) {
        const char *path = tmp_path("tiny.gguf");
        CU_ASSERT_EQUAL_FATAL(synth("test-tiny", types[i], NULL, 7, 1, 0, path), TP_OK);
        check_model(path, &s, types[i], s.n_vocab);
        /* generated vocabulary: <unk> <s> </s>, byte tokens, then pieces */
        tp_gguf_t *g = NULL;
        CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
        int kt = tp_gguf_find_key(g, "tokenizer.ggml.tokens");
        size_t len;
        const char *t0 = tp_gguf_arr_str(g, kt, 0, &len);
        CU_ASSERT(t0 && len == 5 && memcmp(t0, "<unk>", 5) == 0);
        const char *t3 = tp_gguf_arr_str(g, kt, 3, &len);
        CU_ASSERT(t3 && len == 6 && memcmp(t3, "<0x00>", 6) == 0);
        CU_ASSERT_EQUAL(get_i(g, "tokenizer.ggml.bos_token_id"), 1);
        CU_ASSERT_EQUAL(get_i(g, "tokenizer.ggml.eos_token_id"), 2);
        CU_ASSERT_EQUAL(get_i(g, "general.file_type"), types[i] == TP_WTYPE_Q8_0 ? 7 : types[i] == TP_WTYPE_BF16 ? 32 : (int)types[i]);
        tp_gguf_close(g);
    }
}

static void test_synth_archs(void)
{
    const char *shapes[] = {"test-tiny-qwen2", "test-tiny-qwen3", "test-tiny-llama3"};
    for (size_t i = 0; i < TP_ARRAY_LEN(shapes); i++) {
        struct tp_shape s;
        struct tp_error err = {0};
        CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, shapes[i], &s, &err), TP_OK);
        const char *path = tmp_path("arch.gguf");
        CU_ASSERT_EQUAL_FATAL(synth(shapes[i], TP_WTYPE_Q8_0, NULL, 3, 2, 0, path), TP_OK);
        check_model(path, &s, TP_WTYPE_Q8_0, s.n_vocab);
    }
    /* --layers: fewer layers of a big shape (smollm2-135m: 576 wide, 49152 vocab) */
    struct tp_shape s;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "smollm2-135m", &s, &err), TP_OK);
    const char *path = tmp_path("smol.gguf");
    CU_ASSERT_EQUAL_FATAL(synth("smollm2-135m", TP_WTYPE_Q4_0, NULL, 3, 2, 1, path), TP_OK);
    s.n_layer = 1;
    check_model(path, &s, TP_WTYPE_Q4_0, s.n_vocab);
}

static int files_equal(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    char *x = tp_test_read_file(a, &la), *y = tp_test_read_file(b, &lb);
    int eq = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return eq;
}

static void test_synth_reproducible(void)
{
    const char *a = tmp_path("r1.gguf"), *b = tmp_path("r2.gguf"), *c = tmp_path("r3.gguf");
    CU_ASSERT_EQUAL_FATAL(synth("test-tiny", TP_WTYPE_Q4_0, NULL, 11, 1, 0, a), TP_OK);
    CU_ASSERT_EQUAL_FATAL(synth("test-tiny", TP_WTYPE_Q4_0, NULL, 11, 3, 0, b), TP_OK);
    CU_ASSERT_EQUAL_FATAL(synth("test-tiny", TP_WTYPE_Q4_0, NULL, 12, 1, 0, c), TP_OK);
    CU_ASSERT(files_equal(a, b));
    CU_ASSERT(!files_equal(a, c));
}

static void test_synth_errors(void)
{
    struct tp_shape s;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "test-tiny", &s, &err), TP_OK);
    s.n_ff = 100; /* not a multiple of 32: refused for q4_0 naming the tensor, fine for f16 */
    struct tp_synth_config c = tp_synth_default_config();
    c.shape = &s;
    c.type = TP_WTYPE_Q4_0;
    c.out_path = tmp_path("e.gguf");
    CU_ASSERT_EQUAL(tp_synth_write(&c, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "ffn_down"));
    CU_ASSERT_NOT_EQUAL(access(c.out_path, F_OK), 0);
    c.type = TP_WTYPE_F16;
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_synth_write(&c, &err), TP_OK);
    c.type = TP_WTYPE_Q4_1;
    CU_ASSERT_EQUAL(tp_synth_write(&c, &err), TP_ERR_UNSUPPORTED);
    c.type = TP_WTYPE_F16;
    c.tokenizer_json = "/nonexistent/tokenizer.json";
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_synth_write(&c, &err), TP_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/nonexistent/tokenizer.json"));
}

/* --tokenizer: the Llama 3 and Qwen3 tokenizer.json files from ../shared */
static void test_synth_tokenizer_json(void)
{
    const char *llama3 = tp_test_shared_path("models/tokenizers/llama3/tokenizer.json");
    const char *qwen3 = tp_test_shared_path("models/tokenizers/qwen3/tokenizer.json");
    const char *mistral = tp_test_shared_path("models/tokenizers/mistral-7b-v0.1/tokenizer.json");
    if (!llama3 || !qwen3 || !mistral) return; /* ../shared data absent: recorded as a skip */
    struct {
        const char *tok, *shape, *model, *pre, *bos, *eos;
        int n_vocab;
    } cases[] = {
        {llama3, "test-tiny-llama3", "gpt2", "llama-bpe", "<|begin_of_text|>", NULL, 128256},
        {qwen3, "test-tiny-qwen3", "gpt2", "qwen2", NULL, "<|im_end|>", 151669},
        {mistral, "test-tiny", "llama", NULL, "<s>", "</s>", 32000},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        struct tp_shape s;
        struct tp_error err = {0};
        CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, cases[i].shape, &s, &err), TP_OK);
        const char *path = tmp_path("tok.gguf");
        CU_ASSERT_EQUAL_FATAL(synth(cases[i].shape, TP_WTYPE_Q8_0, cases[i].tok, 1, 2, 1, path), TP_OK);
        s.n_layer = 1;
        check_model(path, &s, TP_WTYPE_Q8_0, cases[i].n_vocab);
        tp_gguf_t *g = NULL;
        CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
        const char *str = NULL;
        CU_ASSERT(tp_gguf_get_str(g, "tokenizer.ggml.model", &str) == TP_OK && strcmp(str, cases[i].model) == 0);
        if (cases[i].pre) {
            CU_ASSERT(tp_gguf_get_str(g, "tokenizer.ggml.pre", &str) == TP_OK && strcmp(str, cases[i].pre) == 0);
        }
        int kt = tp_gguf_find_key(g, "tokenizer.ggml.tokens");
        size_t len;
        if (cases[i].bos) {
            const char *t = tp_gguf_arr_str(g, kt, (uint64_t)get_i(g, "tokenizer.ggml.bos_token_id"), &len);
            CU_ASSERT(t && len == strlen(cases[i].bos) && memcmp(t, cases[i].bos, len) == 0);
        }
        if (cases[i].eos) {
            const char *t = tp_gguf_arr_str(g, kt, (uint64_t)get_i(g, "tokenizer.ggml.eos_token_id"), &len);
            CU_ASSERT(t && len == strlen(cases[i].eos) && memcmp(t, cases[i].eos, len) == 0);
        }
        if (strcmp(cases[i].model, "gpt2") == 0) {
            CU_ASSERT(tp_gguf_arr_len(g, tp_gguf_find_key(g, "tokenizer.ggml.merges")) > 100000);
            CU_ASSERT(tp_gguf_find_key(g, "tokenizer.chat_template") >= 0); /* from tokenizer_config.json */
        } else {
            int ks = tp_gguf_find_key(g, "tokenizer.ggml.scores");
            CU_ASSERT_EQUAL_FATAL(tp_gguf_arr_len(g, ks), (uint64_t)cases[i].n_vocab);
            /* scores = minus the rank of the merge producing the piece (Mistral's merges:
             * rank 0 is "▁ t" -> id 261, rank 58876 is "▁ ▁" -> id 259) */
            float *sc = malloc((size_t)cases[i].n_vocab * sizeof(float));
            CU_ASSERT_PTR_NOT_NULL_FATAL(sc);
            CU_ASSERT_EQUAL(tp_gguf_arr_copy_f32(g, ks, sc, (uint64_t)cases[i].n_vocab), TP_OK);
            CU_ASSERT_DOUBLE_EQUAL(sc[261], 0.0, 1e-9);
            CU_ASSERT_DOUBLE_EQUAL(sc[259], -58876.0, 1e-9);
            CU_ASSERT(sc[28705] < -58980.0); /* "▁" alone: no merge makes it */
            free(sc);
        }
        tp_gguf_close(g);

        /* the embedded vocabulary tokenizes exactly like the tokenizer.json it came from */
        char cfg_path[600];
        snprintf(cfg_path, sizeof(cfg_path), "%s", cases[i].tok);
        char *slash = strrchr(cfg_path, '/');
        snprintf(slash + 1, sizeof(cfg_path) - (size_t)(slash + 1 - cfg_path), "tokenizer_config.json");
        tp_tokenizer_t *tj = NULL, *tg = NULL;
        CU_ASSERT_EQUAL(tp_tokenizer_from_json(cases[i].tok, access(cfg_path, R_OK) == 0 ? cfg_path : NULL, &tj, &err), TP_OK);
        CU_ASSERT_EQUAL(tp_tokenizer_from_gguf(path, &tg, &err), TP_OK);
        if (tj && tg) {
            static const char *const texts[] = {"Hello world!", "numbers 12345 and   spaces\n\ttabs",
                                                "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 <tag>"};
            for (size_t t = 0; t < TP_ARRAY_LEN(texts); t++) {
                int32_t a[64], b[64];
                int na = tp_tokenizer_encode(tj, texts[t], strlen(texts[t]), 1, 0, a, 64);
                int nb = tp_tokenizer_encode(tg, texts[t], strlen(texts[t]), 1, 0, b, 64);
                if (na != nb || na <= 0 || na > 64 || memcmp(a, b, (size_t)na * sizeof(int32_t)) != 0)
                {
                    fprintf(stderr, "%s: json %d ids, gguf %d ids:", cases[i].shape, na, nb);
                    for (int q = 0; q < na && q < 64; q++) fprintf(stderr, " %d/%d", a[q], q < nb ? b[q] : -1);
                    fprintf(stderr, "\n");
                }
                CU_ASSERT(na == nb && na > 0 && na <= 64 && memcmp(a, b, (size_t)na * sizeof(int32_t)) == 0);
            }
        }
        tp_tokenizer_free(tj);
        tp_tokenizer_free(tg);
    }
}

static const char *write_tmp(const char *name, const char *text)
{
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* A hand-written byte-level tokenizer.json: ids, gaps, added tokens, both merge forms, pre-tokenizer. */
static void test_vocab_json_small(void)
{
    const char *dir_tok = write_tmp("tokenizer.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u0120c\": 4},"
        " \"merges\": [\"a b\", [\"\\u0120\", \"c\"]]},"
        " \"added_tokens\": [{\"id\": 5, \"content\": \"<|end|>\", \"special\": true},"
        "                     {\"id\": 6, \"content\": \"<extra>\", \"special\": false}],"
        " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\":"
        " {\"Regex\": \"\\\\p{N}{1,3}\"}}]}}");
    struct tp_synth_vocab v;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_synth_vocab_json(dir_tok, 10, &v, &err), TP_OK);
    CU_ASSERT_EQUAL(v.n_tokens, 10); /* padded up to the model's vocabulary */
    CU_ASSERT_STRING_EQUAL(v.model, "gpt2");
    CU_ASSERT_STRING_EQUAL(v.pre, "llama-bpe");
    CU_ASSERT_STRING_EQUAL(v.tokens[2], "ab");
    CU_ASSERT_STRING_EQUAL(v.tokens[4], "\xC4\xA0" "c");
    CU_ASSERT_STRING_EQUAL(v.tokens[3], "[PAD3]");
    CU_ASSERT_STRING_EQUAL(v.tokens[9], "[PAD9]");
    CU_ASSERT_EQUAL(v.types[3], TP_TOKEN_TYPE_UNUSED);
    CU_ASSERT_EQUAL(v.types[0], TP_TOKEN_TYPE_NORMAL);
    CU_ASSERT_EQUAL(v.types[5], TP_TOKEN_TYPE_CONTROL);
    CU_ASSERT_EQUAL(v.types[6], TP_TOKEN_TYPE_USER_DEFINED);
    CU_ASSERT_EQUAL_FATAL(v.n_merges, 2);
    CU_ASSERT_STRING_EQUAL(v.merges[0], "a b");
    CU_ASSERT_STRING_EQUAL(v.merges[1], "\xC4\xA0 c");
    CU_ASSERT_EQUAL(v.eos, -1); /* no tokenizer_config.json beside it and no well-known name */
    CU_ASSERT_EQUAL(v.bos, -1);
    CU_ASSERT_PTR_NULL(v.scores);
    tp_synth_vocab_free(&v);

    /* tokenizer_config.json beside it supplies bos/eos/add_bos/chat template */
    write_tmp("tokenizer_config.json", "{\"bos_token\": {\"content\": \"<extra>\"}, \"eos_token\": \"<|end|>\","
                                       " \"add_bos_token\": true, \"chat_template\": \"{{ x }}\"}");
    CU_ASSERT_EQUAL_FATAL(tp_synth_vocab_json(dir_tok, 0, &v, &err), TP_OK);
    CU_ASSERT_EQUAL(v.n_tokens, 7);
    CU_ASSERT_EQUAL(v.bos, 6);
    CU_ASSERT_EQUAL(v.eos, 5);
    CU_ASSERT_EQUAL(v.add_bos, 1);
    CU_ASSERT(v.chat_template && strcmp(v.chat_template, "{{ x }}") == 0);
    tp_synth_vocab_free(&v);
    remove(tmp_path("tokenizer_config.json"));

    /* refusals name the file and the problem */
    struct {
        const char *json, *needle;
    } bad[] = {
        {"{", "not valid JSON"},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": {}}}", "BPE"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", "bad id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "merges"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", "empty vocabulary"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}}", "merge 0"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": \"x\"}]}", "added_tokens"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(bad); i++) {
        const char *path = write_tmp("bad-tokenizer.json", bad[i].json);
        tp_error_clear(&err);
        CU_ASSERT_NOT_EQUAL(tp_synth_vocab_json(path, 0, &v, &err), TP_OK);
        int ok = strstr(err.msg, bad[i].needle) && strstr(err.msg, "bad-tokenizer.json");
        if (!ok) fprintf(stderr, "case %zu: '%s' lacks '%s'\n", i, err.msg, bad[i].needle);
        CU_ASSERT(ok);
        CU_ASSERT_PTR_NULL(v.tokens);
    }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The generated SentencePiece vocabulary: exact size, unique pieces, byte tokens, decreasing scores. */
static void test_vocab_spm(void)
{
    struct tp_synth_vocab v;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL(tp_synth_vocab_spm(299, &v, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL_FATAL(tp_synth_vocab_spm(152064, &v, &err), TP_OK);
    CU_ASSERT_EQUAL(v.n_tokens, 152064);
    CU_ASSERT_STRING_EQUAL(v.model, "llama");
    CU_ASSERT(v.bos == 1 && v.eos == 2 && v.unk == 0 && v.add_bos == 1);
    CU_ASSERT_STRING_EQUAL(v.tokens[3 + 0x41], "<0x41>");
    CU_ASSERT_EQUAL(v.types[3 + 0xFF], TP_TOKEN_TYPE_BYTE);
    CU_ASSERT_STRING_EQUAL(v.tokens[259], "\xE2\x96\x81");
    int dec = 1;
    for (int i = 260; i < v.n_tokens; i++) dec &= v.scores[i] < v.scores[i - 1] && v.types[i] == TP_TOKEN_TYPE_NORMAL;
    CU_ASSERT(dec);
    char **sorted = malloc((size_t)v.n_tokens * sizeof(char *));
    CU_ASSERT_PTR_NOT_NULL_FATAL(sorted);
    memcpy(sorted, v.tokens, (size_t)v.n_tokens * sizeof(char *));
    qsort(sorted, (size_t)v.n_tokens, sizeof(char *), cmp_str);
    int dup = 0;
    for (int i = 1; i < v.n_tokens; i++) dup += strcmp(sorted[i - 1], sorted[i]) == 0;
    CU_ASSERT_EQUAL(dup, 0);
    free(sorted);
    tp_synth_vocab_free(&v);
}

/* The loader reads every synthetic architecture back with the right
 * hyper-parameters, and the forward pass gives finite, non-constant logits. */
static void test_synth_loads(void)
{
    const char *shapes[] = {"test-tiny", "test-tiny-qwen2", "test-tiny-qwen3", "test-tiny-llama3"};
    const enum tp_wtype types[] = {TP_WTYPE_Q4_0, TP_WTYPE_Q8_0, TP_WTYPE_F16, TP_WTYPE_BF16};
    for (size_t i = 0; i < TP_ARRAY_LEN(shapes); i++) {
        struct tp_shape s;
        struct tp_error err = {0};
        CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, shapes[i], &s, &err), TP_OK);
        const char *path = tmp_path("load.gguf");
        CU_ASSERT_EQUAL_FATAL(synth(shapes[i], types[i], NULL, 5, 1, 0, path), TP_OK);
        struct tp_model_config mc = tp_model_default_config();
        mc.path = path;
        mc.n_threads = 2;
        mc.n_ctx = 64;
        mc.n_batch = 8;
        tp_model_t *m = NULL;
        if (tp_model_init(&mc, &m, &err) != TP_OK) fprintf(stderr, "%s: %s\n", shapes[i], err.msg);
        CU_ASSERT_PTR_NOT_NULL_FATAL(m);
        const struct tp_hparams *hp = tp_model_hparams(m);
        CU_ASSERT_EQUAL(hp->arch, s.arch);
        CU_ASSERT(hp->n_embd == s.n_embd && hp->n_layer == s.n_layer && hp->n_head == s.n_head &&
                  hp->n_head_kv == s.n_head_kv && hp->head_dim == s.head_dim && hp->n_ff == s.n_ff &&
                  hp->n_vocab == s.n_vocab && hp->n_ctx_train == s.n_ctx);
        CU_ASSERT(hp->tied_embeddings == s.tied && hp->has_qkv_bias == s.qkv_bias && hp->has_qk_norm == s.qk_norm);
        CU_ASSERT_EQUAL(hp->rope_scaling, s.rope_scaling);
        CU_ASSERT_EQUAL(tp_model_weight_type(m), types[i]);
        tp_tokenizer_t *tok = tp_model_tokenizer(m);
        CU_ASSERT_EQUAL(tp_tokenizer_n_vocab(tok), s.n_vocab);
        int32_t ids[16];
        int n_ids = tp_tokenizer_encode(tok, "hello world", 11, 1, 0, ids, 16);
        CU_ASSERT(n_ids >= 2 && n_ids <= 16 && ids[0] == 1);
        if (n_ids < 2 || n_ids > 8) n_ids = 2;
        int32_t pos[8], seq[8];
        int8_t want[8];
        for (int k = 0; k < n_ids; k++) {
            pos[k] = k;
            seq[k] = 0;
            want[k] = k == n_ids - 1;
        }
        struct tp_batch b = {.n_tokens = n_ids, .token = ids, .pos = pos, .seq = seq, .logits = want};
        float *logits = malloc((size_t)s.n_vocab * sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(logits);
        CU_ASSERT_EQUAL(tp_model_forward(m, &b, logits), TP_OK);
        int finite = 1;
        double mn = 1e30, mx = -1e30;
        for (int k = 0; k < s.n_vocab; k++) {
            finite &= isfinite(logits[k]) != 0;
            mn = fmin(mn, logits[k]);
            mx = fmax(mx, logits[k]);
        }
        CU_ASSERT(finite);
        CU_ASSERT(mx - mn > 1e-3); /* random weights: logits spread, not constant */
        CU_ASSERT(mx - mn < 100.0);
        free(logits);
        tp_model_free(m);
    }
}

static const struct tp_test_case synth_cases[] = {
    {"shapes_builtin", test_shapes_builtin},
    {"shapes_bad", test_shapes_bad},
    {"writer_roundtrip", test_writer_roundtrip},
    {"writer_misuse", test_writer_misuse},
    {"synth_types", test_synth_types},
    {"synth_archs", test_synth_archs},
    {"synth_reproducible", test_synth_reproducible},
    {"synth_errors", test_synth_errors},
    {"synth_loads", test_synth_loads},
    {"vocab_json_small", test_vocab_json_small},
    {"vocab_spm", test_vocab_spm},
    {NULL, NULL},
};
TP_TEST_SUITE(synth, "unit", 300, synth_cases)
static const struct tp_test_case synth_shared_cases[] = {{"synth_tokenizer_json", test_synth_tokenizer_json}, {NULL, NULL}};
TP_TEST_SUITE(synth_shared, "unit", 300, synth_shared_cases)

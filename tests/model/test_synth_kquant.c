/*
 * tests/model/test_synth_kquant.c - `synth --type q4_k_m / q5_k_m`: the
 * per-tensor type mix must be exactly llama-quantize's.
 *
 * Oracles, written out by hand from llama.cpp's llama_tensor_get_type (not
 * recomputed with the code under test):
 *  - use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2 picks
 *    the layers whose attn_v and ffn_down are Q6_K; for 22 layers (TinyLlama)
 *    that is {0,1,4,7,10,13,16,19,20,21}, which gives the counts llama.cpp
 *    prints for the published TinyLlama-1.1B Q4_K_M file: q4_K 135 tensors,
 *    q6_K 21 tensors (output.weight is the 21st), f32 45;
 *  - tied heads: token_embd.weight takes the head's Q6_K;
 *  - Llama 70B (80 layers, GQA): attn_v Q4_K -> Q5_K on the other layers;
 *  - rows that are not whole 256-value super-blocks: Q6_K -> Q8_0, and
 *    Q4_K -> Q5_0 which tpserve cannot compute, so synth refuses, naming the
 *    tensor.
 * Weight statistics of Q4_K and Q6_K tensors are checked after dequantization
 * (standard deviation 0.02 within the format's noise).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/gguf.h"
#include "model/kernels.h"
#include "model/synth.h"
#include "tp_test.h"

static const char *kq_path(const char *name)
{
    static char buf[4][512];
    static int slot;
    char *p = buf[slot++ % 4];
    snprintf(p, 512, "%s/%s", tp_test_tmpdir(), name);
    return p;
}

/* A small Llama shape whose matrices are whole super-blocks (n_embd, n_ff multiples of 256). */
static struct tp_shape small_shape(int n_layer, int tied)
{
    struct tp_shape s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "test-kq");
    s.arch = TP_ARCH_LLAMA;
    s.n_embd = 256;
    s.n_layer = n_layer;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = 64;
    s.n_ff = 512;
    s.n_vocab = 512;
    s.n_ctx = 256;
    s.rope_theta = 10000.0f;
    s.norm_eps = 1e-5f;
    s.tied = tied;
    return s;
}

static enum tp_status write_mix(const struct tp_shape *s, enum tp_synth_mix mix, const char *path, struct tp_error *err)
{
    struct tp_synth_config c = tp_synth_default_config();
    c.shape = s;
    c.n_layer = s->n_layer;
    c.mix = mix;
    c.type = TP_WTYPE_Q8_0; /* ignored under a mix */
    c.seed = 5;
    c.out_path = path;
    c.n_threads = 2;
    return tp_synth_write(&c, err);
}

static int tensor_type(tp_gguf_t *g, const char *name)
{
    const struct tp_gguf_tensor *t = tp_gguf_find_tensor(g, name);
    return t ? (int)t->type : -1;
}

static int64_t get_int(tp_gguf_t *g, const char *key)
{
    int64_t v = -1;
    return tp_gguf_get_int(g, key, &v) == TP_OK ? v : -1;
}

/* Check every matrix of an n-layer file against the oracle set of Q6_K layers. */
static void check_layers(tp_gguf_t *g, int n_layer, const int *more, int n_more, enum tp_wtype base,
                         enum tp_wtype attn_v_other)
{
    char nm[64];
    for (int l = 0; l < n_layer; l++) {
        int is_more = 0;
        for (int k = 0; k < n_more; k++) is_more |= more[k] == l;
        const struct {
            const char *suffix;
            enum tp_wtype want;
        } roles[] = {
            {"attn_q.weight", base},
            {"attn_k.weight", base},
            {"attn_v.weight", is_more ? TP_WTYPE_Q6_K : attn_v_other},
            {"attn_output.weight", base},
            {"ffn_gate.weight", base},
            {"ffn_up.weight", base},
            {"ffn_down.weight", is_more ? TP_WTYPE_Q6_K : base},
            {"attn_norm.weight", TP_WTYPE_F32},
            {"ffn_norm.weight", TP_WTYPE_F32},
        };
        for (size_t r = 0; r < TP_ARRAY_LEN(roles); r++) {
            snprintf(nm, sizeof nm, "blk.%d.%s", l, roles[r].suffix);
            int got = tensor_type(g, nm);
            if (got != (int)roles[r].want)
                fprintf(stderr, "%s: %s, want %s\n", nm, tp_wtype_name((enum tp_wtype)got), tp_wtype_name(roles[r].want));
            CU_ASSERT_EQUAL(got, (int)roles[r].want);
        }
    }
}

static void count_types(tp_gguf_t *g, int *n_q4k, int *n_q5k, int *n_q6k, int *n_f32)
{
    *n_q4k = *n_q5k = *n_q6k = *n_f32 = 0;
    for (int i = 0; i < tp_gguf_n_tensors(g); i++) {
        enum tp_wtype t = tp_gguf_tensor(g, i)->type;
        *n_q4k += t == TP_WTYPE_Q4_K;
        *n_q5k += t == TP_WTYPE_Q5_K;
        *n_q6k += t == TP_WTYPE_Q6_K;
        *n_f32 += t == TP_WTYPE_F32;
    }
}

/* TinyLlama's 22 layers: the published Q4_K_M file's mix */
static void test_q4_k_m_tinyllama_layers(void)
{
    static const int more22[] = {0, 1, 4, 7, 10, 13, 16, 19, 20, 21};
    struct tp_shape s = small_shape(22, 0);
    struct tp_error err = {0};
    const char *path = kq_path("q4km.gguf");
    CU_ASSERT_EQUAL_FATAL(write_mix(&s, TP_SYNTH_MIX_Q4_K_M, path, &err), TP_OK);
    tp_gguf_t *g = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
    CU_ASSERT_EQUAL(get_int(g, "general.file_type"), 15);
    CU_ASSERT_EQUAL(get_int(g, "general.quantization_version"), 2);
    CU_ASSERT_EQUAL(tensor_type(g, "token_embd.weight"), TP_WTYPE_Q4_K);
    CU_ASSERT_EQUAL(tensor_type(g, "output.weight"), TP_WTYPE_Q6_K);
    CU_ASSERT_EQUAL(tensor_type(g, "output_norm.weight"), TP_WTYPE_F32);
    check_layers(g, 22, more22, (int)TP_ARRAY_LEN(more22), TP_WTYPE_Q4_K, TP_WTYPE_Q4_K);
    int q4, q5, q6, f32;
    count_types(g, &q4, &q5, &q6, &f32);
    CU_ASSERT_EQUAL(q4, 135);
    CU_ASSERT_EQUAL(q5, 0);
    CU_ASSERT_EQUAL(q6, 21);
    CU_ASSERT_EQUAL(f32, 45);

    /* weights still have the stated distribution after K-quantization (sd 0.02; Q4_K noise ~3% of it) */
    const char *names[] = {"blk.2.ffn_down.weight", "blk.1.ffn_down.weight", "output.weight"};
    for (size_t i = 0; i < TP_ARRAY_LEN(names); i++) {
        const struct tp_gguf_tensor *t = tp_gguf_find_tensor(g, names[i]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        float *x = malloc((size_t)t->n_elems * sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(x);
        tp_kern_dequant(t->type, t->data, x, t->n_elems);
        double sum = 0, sq = 0;
        for (int64_t k = 0; k < t->n_elems; k++) sum += x[k], sq += (double)x[k] * x[k];
        double mean = sum / (double)t->n_elems, sd = sqrt(sq / (double)t->n_elems - mean * mean);
        if (fabs(sd - 0.02) > 0.001) fprintf(stderr, "%s (%s): sd %.5f\n", names[i], tp_wtype_name(t->type), sd);
        CU_ASSERT(fabs(mean) < 0.001);
        CU_ASSERT(fabs(sd - 0.02) < 0.001);
        free(x);
    }
    tp_gguf_close(g);

    /* the model loads and computes (every tensor type has kernels) */
    struct tp_model_config mc = tp_model_default_config();
    mc.path = path;
    mc.n_threads = 1;
    tp_model_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_model_init(&mc, &m, &err), TP_OK);
    tp_model_free(m);
}

/* Q5_K_M: base Q5_K; 8 layers -> n/8 = 1, 7n/8 = 7: more bits on {0, 3, 6, 7} */
static void test_q5_k_m(void)
{
    static const int more8[] = {0, 3, 6, 7};
    struct tp_shape s = small_shape(8, 0);
    struct tp_error err = {0};
    const char *path = kq_path("q5km.gguf");
    CU_ASSERT_EQUAL_FATAL(write_mix(&s, TP_SYNTH_MIX_Q5_K_M, path, &err), TP_OK);
    tp_gguf_t *g = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
    CU_ASSERT_EQUAL(get_int(g, "general.file_type"), 17);
    CU_ASSERT_EQUAL(tensor_type(g, "token_embd.weight"), TP_WTYPE_Q5_K);
    CU_ASSERT_EQUAL(tensor_type(g, "output.weight"), TP_WTYPE_Q6_K);
    check_layers(g, 8, more8, (int)TP_ARRAY_LEN(more8), TP_WTYPE_Q5_K, TP_WTYPE_Q5_K);
    tp_gguf_close(g);
}

/* tied head: the embedding is the head, so it gets the head's Q6_K */
static void test_q4_k_m_tied(void)
{
    static const int more8[] = {0, 3, 6, 7};
    struct tp_shape s = small_shape(8, 1);
    struct tp_error err = {0};
    const char *path = kq_path("q4km-tied.gguf");
    CU_ASSERT_EQUAL_FATAL(write_mix(&s, TP_SYNTH_MIX_Q4_K_M, path, &err), TP_OK);
    tp_gguf_t *g = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
    CU_ASSERT_EQUAL(tensor_type(g, "token_embd.weight"), TP_WTYPE_Q6_K);
    CU_ASSERT_EQUAL(tensor_type(g, "output.weight"), -1);
    check_layers(g, 8, more8, (int)TP_ARRAY_LEN(more8), TP_WTYPE_Q4_K, TP_WTYPE_Q4_K);
    tp_gguf_close(g);
}

/* Llama 70B class (80 layers, 8 q heads per kv head): attn_v Q5_K where not Q6_K.
 * n/8 = 10, 7n/8 = 70: more bits on 0..9, 70..79 and 12, 15, ..., 69 */
static void test_q4_k_m_70b(void)
{
    int more[80], n_more = 0;
    for (int l = 0; l < 10; l++) more[n_more++] = l;
    for (int l = 12; l < 70; l += 3) more[n_more++] = l;
    for (int l = 70; l < 80; l++) more[n_more++] = l;
    CU_ASSERT_EQUAL(n_more, 40);
    struct tp_shape s = small_shape(80, 0);
    s.n_head = 8;
    s.n_head_kv = 1;
    s.head_dim = 32;
    s.n_ff = 256;
    struct tp_error err = {0};
    const char *path = kq_path("q4km-70b.gguf");
    CU_ASSERT_EQUAL_FATAL(write_mix(&s, TP_SYNTH_MIX_Q4_K_M, path, &err), TP_OK);
    tp_gguf_t *g = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
    check_layers(g, 80, more, n_more, TP_WTYPE_Q4_K, TP_WTYPE_Q5_K);
    tp_gguf_close(g);
    unlink(path);
}

/* rows that are not whole super-blocks */
static void test_mix_fallbacks(void)
{
    struct tp_error err = {0};
    /* one layer: every layer is a "more bits" layer, so ffn_down (rows of n_ff = 800) is Q6_K -> Q8_0 */
    struct tp_shape s = small_shape(1, 0);
    s.n_ff = 800;
    const char *path = kq_path("q4km-fb.gguf");
    CU_ASSERT_EQUAL_FATAL(write_mix(&s, TP_SYNTH_MIX_Q4_K_M, path, &err), TP_OK);
    tp_gguf_t *g = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
    CU_ASSERT_EQUAL(tensor_type(g, "blk.0.ffn_down.weight"), TP_WTYPE_Q8_0);
    CU_ASSERT_EQUAL(tensor_type(g, "blk.0.ffn_up.weight"), TP_WTYPE_Q4_K);
    tp_gguf_close(g);
    /* rows of 320 (Qwen2.5-0.5B-like widths): Q4_K -> Q5_0, refused with the tensor named, no file left */
    s = small_shape(2, 1);
    s.n_embd = 320;
    s.n_head = 5;
    s.n_head_kv = 1;
    path = kq_path("q4km-refused.gguf");
    unlink(path);
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(write_mix(&s, TP_SYNTH_MIX_Q4_K_M, path, &err), TP_ERR_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "q5_0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "blk.0.attn_q.weight"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "not a multiple of 256"));
    CU_ASSERT_NOT_EQUAL(access(path, F_OK), 0);
    /* a plain K type with such rows: refused as any block type is */
    struct tp_synth_config c = tp_synth_default_config();
    c.shape = &s;
    c.type = TP_WTYPE_Q6_K;
    c.out_path = path;
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_synth_write(&c, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "256"));
}

static void test_type_parse(void)
{
    enum tp_wtype t;
    enum tp_synth_mix m;
    CU_ASSERT_EQUAL(tp_synth_type_parse("q4_k_m", &t, &m), TP_OK);
    CU_ASSERT_EQUAL(t, TP_WTYPE_Q4_K);
    CU_ASSERT_EQUAL(m, TP_SYNTH_MIX_Q4_K_M);
    CU_ASSERT_EQUAL(tp_synth_type_parse("Q5_K_M", &t, &m), TP_OK);
    CU_ASSERT_EQUAL(t, TP_WTYPE_Q5_K);
    CU_ASSERT_EQUAL(m, TP_SYNTH_MIX_Q5_K_M);
    CU_ASSERT_EQUAL(tp_synth_type_parse("q6_k", &t, &m), TP_OK);
    CU_ASSERT_EQUAL(t, TP_WTYPE_Q6_K);
    CU_ASSERT_EQUAL(m, TP_SYNTH_MIX_NONE);
    CU_ASSERT_EQUAL(tp_synth_type_parse("q4_0", &t, &m), TP_OK);
    CU_ASSERT_EQUAL(t, TP_WTYPE_Q4_0);
    CU_ASSERT_EQUAL(tp_synth_type_parse("q4_1", &t, &m), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(tp_synth_type_parse("q4_k_s", &t, &m), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(tp_synth_type_parse(NULL, &t, &m), TP_ERR_INVALID_ARG);
    CU_ASSERT_STRING_EQUAL(tp_synth_mix_name(TP_SYNTH_MIX_Q4_K_M), "q4_k_m");
    CU_ASSERT_PTR_NULL(tp_synth_mix_name(TP_SYNTH_MIX_NONE));
}

/* Mixture of experts (llama_tensor_get_type with n_expert): the router ffn_gate_inp stays F32;
 * ffn_down_exps follows ffn_down's use_more_bits by its layer, gate/up_exps the base; a model
 * with exactly 8 experts (Mixtral) gets attn_v and attn_k in Q8_0 and, under Q4_K_M, attn_output
 * in Q5_K; with another expert count (Qwen3-MoE's 128: here 16) those stay as for a dense model. */
static void test_q4_k_m_experts(void)
{
    /* 8 layers: use_more_bits = {0, 3, 6, 7} */
    const int more[] = {0, 3, 6, 7};
    for (int x = 0; x < 2; x++) {
        struct tp_shape s = small_shape(8, 0);
        s.n_expert = x == 0 ? 8 : 16;
        s.n_expert_used = 2;
        struct tp_error err = {0};
        const char *path = kq_path(x == 0 ? "q4km-moe8.gguf" : "q4km-moe16.gguf");
        CU_ASSERT_EQUAL_FATAL(write_mix(&s, TP_SYNTH_MIX_Q4_K_M, path, &err), TP_OK);
        tp_gguf_t *g = NULL;
        CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
        char nm[64];
        for (int l = 0; l < 8; l++) {
            int is_more = l == more[0] || l == more[1] || l == more[2] || l == more[3];
            const enum tp_wtype v = x == 0 ? TP_WTYPE_Q8_0 : is_more ? TP_WTYPE_Q6_K : TP_WTYPE_Q4_K;
            const struct {
                const char *suffix;
                enum tp_wtype want;
            } roles[] = {
                {"attn_q.weight", TP_WTYPE_Q4_K},
                {"attn_k.weight", x == 0 ? TP_WTYPE_Q8_0 : TP_WTYPE_Q4_K},
                {"attn_v.weight", v},
                {"attn_output.weight", x == 0 ? TP_WTYPE_Q5_K : TP_WTYPE_Q4_K},
                {"ffn_gate_inp.weight", TP_WTYPE_F32},
                {"ffn_gate_exps.weight", TP_WTYPE_Q4_K},
                {"ffn_up_exps.weight", TP_WTYPE_Q4_K},
                {"ffn_down_exps.weight", is_more ? TP_WTYPE_Q6_K : TP_WTYPE_Q4_K},
            };
            for (size_t r = 0; r < TP_ARRAY_LEN(roles); r++) {
                snprintf(nm, sizeof nm, "blk.%d.%s", l, roles[r].suffix);
                int got = tensor_type(g, nm);
                if (got != (int)roles[r].want)
                    fprintf(stderr, "%d experts %s: %s, want %s\n", s.n_expert, nm,
                            tp_wtype_name((enum tp_wtype)got), tp_wtype_name(roles[r].want));
                CU_ASSERT_EQUAL(got, (int)roles[r].want);
            }
        }
        CU_ASSERT_EQUAL(tensor_type(g, "output.weight"), (int)TP_WTYPE_Q6_K);
        CU_ASSERT_EQUAL(get_int(g, "llama.expert_count"), s.n_expert);
        tp_gguf_close(g);
        unlink(path);
    }
}

static const struct tp_test_case synth_kquant_cases[] = {
    {"q4_k_m_experts", test_q4_k_m_experts},
    {"type_parse", test_type_parse},
    {"q4_k_m_tinyllama_layers", test_q4_k_m_tinyllama_layers},
    {"q5_k_m", test_q5_k_m},
    {"q4_k_m_tied", test_q4_k_m_tied},
    {"q4_k_m_70b", test_q4_k_m_70b},
    {"mix_fallbacks", test_mix_fallbacks},
    {NULL, NULL},
};
TP_TEST_SUITE(synth_kquant, "unit", 120, synth_kquant_cases)

/*
 * tests/model/test_hf.c - Hugging Face directories through the single-rank
 * loader (model_load.c, hf_config.c, tsrc.c) and `synth --format hf`.
 *
 * Oracles:
 *   - GGUF F32 vs HF F32 of the same seed (synth writes the same values;
 *     llama q/k rows permuted to the halves layout, loaded with NeoX RoPE):
 *     identical greedy tokens over 64 steps (8 prompt tokens, then 56
 *     generated) for llama, llama3 (rope scaling), qwen2 and qwen3 shapes, and every step's logits within a normalized MSE of 1e-10 (only
 *     the order of the q.k sums inside a head differs: a few ulps);
 *   - the per-tensor values read back through the safetensors reader equal
 *     the GGUF's (q/k rows through the permutation);
 *   - HF F16 / BF16 directories of the same seed: first-step logits within
 *     NMSE 1e-4 (F16) / 1e-2 (BF16) of F32 (see test_half for the reasoning);
 *   - bad directories refused, each with a message naming the problem.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/tensor_source.h"
#include "model/synth.h"
#include "model_test_util.h"
#include "tp_test.h"

#define STEPS 64

/* Synthetic models of these tests: seed 99. */
static int write_model(const char *name, enum tp_wtype type, int hf, const char *out)
{
    return tm_write_model(name, type, hf, 0, 99, out);
}

/* A prompt of PROMPT varied tokens fed one by one, then greedy decoding: tokens[STEPS] are the
 * argmax of every step (the prompt steps' predictions, then the generated tokens), the logits of
 * every step go to all[STEPS][n_vocab]. */
#define PROMPT 8
static int greedy(tp_model_t *m, int32_t *tokens, float *all)
{
    int nv = tp_model_hparams(m)->n_vocab;
    int32_t tok = 1;
    for (int i = 0; i < STEPS; i++) {
        int32_t pos = i, seq = 0;
        int8_t want = 1;
        struct tp_batch b = {1, &tok, &pos, &seq, &want};
        float *lg = all + (size_t)i * (size_t)nv;
        if (tp_model_forward(m, &b, lg) != TP_OK) return -1;
        int best = 0;
        for (int k = 1; k < nv; k++)
            if (lg[k] > lg[best]) best = k;
        tokens[i] = best;
        tok = i + 1 < PROMPT ? 3 + (37 * (i + 1)) % (nv - 3) : best;
    }
    return 0;
}

static void same_model(const char *shape)
{
    char gguf[512], dir[512];
    snprintf(gguf, sizeof gguf, "%s/%s-f32.gguf", tp_test_tmpdir(), shape);
    snprintf(dir, sizeof dir, "%s/%s-f32-hf", tp_test_tmpdir(), shape);
    CU_ASSERT_EQUAL_FATAL(write_model(shape, TP_WTYPE_F32, 0, gguf), 0);
    CU_ASSERT_EQUAL_FATAL(write_model(shape, TP_WTYPE_F32, 1, dir), 0);
    struct tp_error e;
    tp_model_t *mg = tm_open_model(gguf, &e);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mg);
    tp_model_t *mh = tm_open_model(dir, &e);
    if (!mh) fprintf(stderr, "%s\n", e.msg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mh);
    const struct tp_hparams *hg = tp_model_hparams(mg), *hh = tp_model_hparams(mh);
    CU_ASSERT_EQUAL(hh->arch, hg->arch);
    CU_ASSERT_EQUAL(hh->n_vocab, hg->n_vocab);
    CU_ASSERT_EQUAL(hh->head_dim, hg->head_dim);
    CU_ASSERT_EQUAL(hh->tied_embeddings, hg->tied_embeddings);
    CU_ASSERT_EQUAL(hh->has_qkv_bias, hg->has_qkv_bias);
    CU_ASSERT_EQUAL(hh->has_qk_norm, hg->has_qk_norm);
    CU_ASSERT_EQUAL(hh->rope_neox, 1);
    CU_ASSERT_EQUAL(hh->norm_eps, hg->norm_eps);
    CU_ASSERT_EQUAL(hh->rope_theta, hg->rope_theta);
    CU_ASSERT_EQUAL(hh->rope_scaling, hg->rope_scaling);
    /* the same bytes, less Llama 3's rope_freqs.weight (HF: rope_scaling in config.json) */
    uint64_t rf = hg->rope_scaling == TP_ROPE_SCALING_LLAMA3 ? (uint64_t)hg->rope_dim / 2 * 4 : 0;
    CU_ASSERT_EQUAL(tp_model_weight_bytes(mh) + rf, tp_model_weight_bytes(mg));
    CU_ASSERT_STRING_EQUAL(tp_model_name(mh), strrchr(dir, '/') + 1);
    /* the tokenizers agree on a prompt */
    int32_t a[64], b[64];
    const char *text = "hello world, a test";
    int na = tp_tokenizer_encode(tp_model_tokenizer(mg), text, strlen(text), 1, 0, a, 64);
    int nb = tp_tokenizer_encode(tp_model_tokenizer(mh), text, strlen(text), 1, 0, b, 64);
    CU_ASSERT_EQUAL(na, nb);
    CU_ASSERT(na > 2 && na <= 64 && memcmp(a, b, sizeof(int32_t) * (size_t)na) == 0);

    int nv = hg->n_vocab;
    int32_t tg[STEPS], th[STEPS];
    float *lg = malloc(sizeof(float) * (size_t)nv * STEPS), *lh = malloc(sizeof(float) * (size_t)nv * STEPS);
    CU_ASSERT_EQUAL_FATAL(greedy(mg, tg, lg), 0);
    CU_ASSERT_EQUAL_FATAL(greedy(mh, th, lh), 0);
    CU_ASSERT(memcmp(tg, th, sizeof tg) == 0);
    int distinct = 0;
    for (int i = 1; i < STEPS; i++) distinct += tg[i] != tg[0]; /* a constant oracle would match anything */
    CU_ASSERT(distinct > 0);
    double worst = 0;
    for (int i = 0; i < STEPS; i++) {
        double x = tm_nmse(lh + (size_t)i * (size_t)nv, lg + (size_t)i * (size_t)nv, nv);
        worst = x > worst ? x : worst;
    }
    fprintf(stderr, "%s: GGUF F32 vs HF F32: %d greedy tokens %s, worst per-step logits nmse %.3g\n", shape, STEPS,
            memcmp(tg, th, sizeof tg) == 0 ? "identical" : "DIFFER", worst);
    CU_ASSERT(worst < 1e-10);
    free(lg);
    free(lh);
    tp_model_free(mg);
    tp_model_free(mh);
}

static void test_same_llama(void) { same_model("test-tiny"); }
static void test_same_llama3(void) { same_model("test-tiny-llama3"); }
static void test_same_qwen2(void) { same_model("test-tiny-qwen2"); }
static void test_same_qwen3(void) { same_model("test-tiny-qwen3"); }
/* mixture of experts: GGUF's stacked experts vs one safetensors tensor per expert (Qwen-MoE
 * mlp.experts.E.*_proj, Mixtral block_sparse_moe.experts.E.w1/w2/w3), Qwen2-MoE's shared expert */
static void test_same_moe(void)
{
    same_model("test-tiny-qwen3moe");
    same_model("test-tiny-mixtral");
    same_model("test-tiny-qwen2moe");
}

/* The values themselves: HF q_proj row h*hd + s*hd/2 + i holds GGUF attn_q row h*hd + 2i + s
 * (k_proj likewise per KV head); every other tensor byte for byte. */
static void test_values_permuted(void)
{
    char gguf[512], dir[512];
    snprintf(gguf, sizeof gguf, "%s/test-tiny-f32.gguf", tp_test_tmpdir());
    snprintf(dir, sizeof dir, "%s/test-tiny-f32-hf", tp_test_tmpdir());
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny", TP_WTYPE_F32, 0, gguf), 0);
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny", TP_WTYPE_F32, 1, dir), 0);
    tp_st_t *st = NULL;
    tp_gguf_t *g = NULL;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL_FATAL(tp_st_open(dir, &st, &e), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(gguf, &g, &e), TP_OK);
    /* every GGUF tensor but rope_freqs has an HF twin of the same element count */
    CU_ASSERT_EQUAL(tp_st_n_tensors(st), tp_gguf_n_tensors(g));
    const int hd = 16;
    int checked = 0;
    for (int i = 0; i < tp_gguf_n_tensors(g); i++) {
        const struct tp_gguf_tensor *gt = tp_gguf_tensor(g, i);
        char hfn[160];
        CU_ASSERT_FATAL(tp_tsrc_hf_name(gt->name, hfn, sizeof hfn));
        const struct tp_st_tensor *ht = tp_st_find(st, hfn);
        CU_ASSERT_PTR_NOT_NULL_FATAL(ht);
        CU_ASSERT_EQUAL_FATAL(ht->n_bytes, gt->n_bytes);
        CU_ASSERT_EQUAL(ht->shape[ht->n_dims - 1], gt->ne[0]);
        const float *gv = gt->data;
        const uint8_t *hv = ht->data;
        int perm = strstr(gt->name, "attn_q.weight") || strstr(gt->name, "attn_k.weight");
        int64_t rows = gt->ne[1], cols = gt->ne[0];
        for (int64_t r = 0; r < rows; r++) {
            int64_t src = r;
            if (perm) {
                int64_t h = r / hd, in = r % hd, sgn = in / (hd / 2), k = in % (hd / 2);
                src = h * hd + 2 * k + sgn;
            }
            if (memcmp(hv + (size_t)(r * cols) * 4, gv + src * cols, (size_t)cols * 4) != 0) {
                fprintf(stderr, "%s row %lld differs\n", hfn, (long long)r);
                CU_FAIL("values differ");
                break;
            }
        }
        checked++;
    }
    CU_ASSERT(checked >= 20);
    const struct tp_st_tensor *emb = tp_st_find(st, "model.embed_tokens.weight");
    CU_ASSERT_PTR_NOT_NULL_FATAL(emb);
    CU_ASSERT_EQUAL(emb->shape[0], 512);
    CU_ASSERT_EQUAL(emb->shape[1], 64);
    CU_ASSERT_EQUAL(((uintptr_t)emb->data) % 32, 0); /* data section aligned: used in place */
    CU_ASSERT_PTR_NOT_NULL(tp_st_find(st, "lm_head.weight")); /* untied shape */
    tp_gguf_close(g);
    tp_st_close(st);
}

/* F16 / BF16 directories of the same seed against F32.  Rounding a weight
 * to F16 (11-bit significand) changes it by at most 2^-12 relative (RMS
 * ~1.4e-4); BF16 (8-bit) by 2^-9 (RMS ~1.1e-3).  Through a few layers the
 * first-step logits' NMSE is of the order of the square of that times a
 * small factor (measured ~1e-7 and ~1e-5 here); the bounds 1e-4 and 1e-2
 * are far above that yet far below a wrong layout (NMSE ~1). */
static void test_half(void)
{
    char p32[512], p16[512], pbf[512];
    snprintf(p32, sizeof p32, "%s/q3-f32-hf", tp_test_tmpdir());
    snprintf(p16, sizeof p16, "%s/q3-f16-hf", tp_test_tmpdir());
    snprintf(pbf, sizeof pbf, "%s/q3-bf16-hf", tp_test_tmpdir());
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny-qwen3", TP_WTYPE_F32, 1, p32), 0);
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny-qwen3", TP_WTYPE_F16, 1, p16), 0);
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny-qwen3", TP_WTYPE_BF16, 1, pbf), 0);
    struct tp_error e;
    tp_model_t *m[3] = {tm_open_model(p32, &e), tm_open_model(p16, &e), tm_open_model(pbf, &e)};
    for (int i = 0; i < 3; i++) CU_ASSERT_PTR_NOT_NULL_FATAL(m[i]);
    CU_ASSERT_EQUAL(tp_model_weight_type(m[1]), TP_WTYPE_F16);
    CU_ASSERT_EQUAL(tp_model_weight_type(m[2]), TP_WTYPE_BF16);
    int nv = tp_model_hparams(m[0])->n_vocab;
    float *lg[3];
    for (int i = 0; i < 3; i++) {
        lg[i] = malloc(sizeof(float) * (size_t)nv);
        int32_t tok[4] = {1, 300, 301, 302}, pos[4] = {0, 1, 2, 3}, seq[4] = {0, 0, 0, 0};
        struct tp_batch b = {4, tok, pos, seq, NULL};
        CU_ASSERT_EQUAL_FATAL(tp_model_forward(m[i], &b, lg[i]), TP_OK);
    }
    double e16 = tm_nmse(lg[1], lg[0], nv), ebf = tm_nmse(lg[2], lg[0], nv);
    fprintf(stderr, "HF f16 vs f32 logits nmse %.3g (bound 1e-4), bf16 vs f32 %.3g (bound 1e-2)\n", e16, ebf);
    CU_ASSERT(e16 < 1e-4);
    CU_ASSERT(ebf < 1e-2);
    CU_ASSERT(e16 > 0); /* really a different precision */
    for (int i = 0; i < 3; i++) {
        free(lg[i]);
        tp_model_free(m[i]);
    }
}

/* ---------------------------------------------------------------- refusals */

static char *slurp(const char *path)
{
    size_t n;
    return tp_test_read_file(path, &n);
}

static void spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
}

/* Copy the reference directory's files into a fresh directory `name`. */
static void clone_dir(const char *src, const char *dst)
{
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    mkdir(dst, 0755);
    for (size_t i = 0; i < TP_ARRAY_LEN(files); i++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dst, files[i]);
        size_t n;
        char *d = tp_test_read_file(a, &n);
        CU_ASSERT_PTR_NOT_NULL_FATAL(d);
        FILE *f = fopen(b, "wb");
        CU_ASSERT_PTR_NOT_NULL_FATAL(f);
        CU_ASSERT(fwrite(d, 1, n, f) == n);
        fclose(f);
        free(d);
    }
}

struct cfg_case {
    const char *what;
    const char *key;   /* config.json key to set (NULL: none) */
    const char *json;  /* its new value as JSON text (NULL: delete the key) */
    const char *expect;
};

static void test_refusals(void)
{
    char ref[512];
    snprintf(ref, sizeof ref, "%s/refusal-ref-hf", tp_test_tmpdir());
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny", TP_WTYPE_F32, 1, ref), 0);
    static const struct cfg_case cases[] = {
        {"unsupported architecture", "architectures", "[\"GPT2LMHeadModel\"]",
         "architecture 'GPT2LMHeadModel' (model_type 'llama') is not supported"},
        {"mixture of experts", "num_local_experts", "8", "mixture-of-experts models (num_local_experts = 8)"},
        {"rope yarn (truncated)", "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4}",
         "rope_scaling yarn with truncate = true (rounded ramp ends) is not supported"},
        {"activation", "hidden_act", "\"gelu\"", "hidden_act 'gelu' is not supported"},
        {"mlp bias", "mlp_bias", "true", "mlp_bias = true"},
        {"foreign quantization", "quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4}",
         "quant_method 'gptq' is not supported"},
        {"missing hidden_size", "hidden_size", NULL, "\"hidden_size\" is missing"},
        {"bad heads", "num_key_value_heads", "3", "num_attention_heads 4 is not a multiple of num_key_value_heads 3"},
        {"negative size", "intermediate_size", "-5", "\"intermediate_size\" must be an integer"},
        {"more layers than tensors", "num_hidden_layers", "3", "tensor 'model.layers.2.input_layernorm.weight' is missing"},
        {"shape vs config", "intermediate_size", "96",
         "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [64, 128], expected [64, 96]"},
        {"vocab smaller than tokenizer", "vocab_size", "100", "tokenizer.json has 512 tokens but config.json vocab_size is 100"},
    };
    char dir[512], cfgp[600];
    snprintf(dir, sizeof dir, "%s/refusal-hf", tp_test_tmpdir());
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        clone_dir(ref, dir);
        char *text = slurp(cfgp);
        CU_ASSERT_PTR_NOT_NULL_FATAL(text);
        cJSON *root = cJSON_Parse(text);
        free(text);
        CU_ASSERT_PTR_NOT_NULL_FATAL(root);
        cJSON_DeleteItemFromObjectCaseSensitive(root, cases[i].key);
        if (cases[i].json) cJSON_AddItemToObject(root, cases[i].key, cJSON_Parse(cases[i].json));
        char *out = cJSON_Print(root);
        spit(cfgp, out);
        free(out);
        cJSON_Delete(root);
        struct tp_error e;
        tp_model_t *m = tm_open_model(dir, &e);
        if (m || !strstr(e.msg, cases[i].expect))
            fprintf(stderr, "case '%s': %s (want '%s')\n", cases[i].what, m ? "accepted" : e.msg, cases[i].expect);
        CU_ASSERT_PTR_NULL(m);
        CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, cases[i].expect));
        tp_model_free(m);
    }
    /* files missing or broken */
    struct tp_error e;
    clone_dir(ref, dir);
    char p[600];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    remove(p);
    CU_ASSERT_PTR_NULL(tm_open_model(dir, &e));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "no tokenizer.json"));
    clone_dir(ref, dir);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    remove(p);
    CU_ASSERT_PTR_NULL(tm_open_model(dir, &e));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "neither model.safetensors.index.json nor model.safetensors"));
    clone_dir(ref, dir);
    spit(cfgp, "{\"architectures\": [\"LlamaForCausalLM\"], ");
    CU_ASSERT_PTR_NULL(tm_open_model(dir, &e));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "config.json: not a valid JSON object"));
    /* a truncated weights file: the safetensors reader's message comes through */
    clone_dir(ref, dir);
    {
        size_t n;
        char *d = tp_test_read_file(p, &n);
        CU_ASSERT_PTR_NOT_NULL_FATAL(d);
        FILE *f = fopen(p, "wb");
        fwrite(d, 1, n / 2, f);
        fclose(f);
        free(d);
    }
    CU_ASSERT_PTR_NULL(tm_open_model(dir, &e));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "lie outside the data section"));
    /* untied config without lm_head: clone a tied qwen2 and flip the flag */
    char q2[512];
    snprintf(q2, sizeof q2, "%s/refusal-q2-hf", tp_test_tmpdir());
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny-qwen2", TP_WTYPE_F32, 1, q2), 0);
    snprintf(p, sizeof p, "%s/config.json", q2);
    char *text = slurp(p);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    char *at = strstr(text, "\"tie_word_embeddings\": true");
    CU_ASSERT_PTR_NOT_NULL_FATAL(at);
    memcpy(at, "\"tie_word_embeddings\":false", strlen("\"tie_word_embeddings\":false"));
    spit(p, text);
    free(text);
    CU_ASSERT_PTR_NULL(tm_open_model(q2, &e));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "no lm_head.weight and config.json tie_word_embeddings is false"));
    /* a file of the directory instead of the directory */
    snprintf(p, sizeof p, "%s/model.safetensors", ref);
    CU_ASSERT_PTR_NULL(tm_open_model(p, &e));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "a file of a Hugging Face model; give its directory"));
    /* a directory that is not a model */
    snprintf(p, sizeof p, "%s/not-a-model", tp_test_tmpdir());
    mkdir(p, 0755);
    CU_ASSERT_PTR_NULL(tm_open_model(p, &e));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "a directory without config.json"));
}

/* Chat template from tokenizer_config.json (string or list of named templates) or chat_template.jinja. */
static void test_chat_template(void)
{
    char ref[512], p[600];
    snprintf(ref, sizeof ref, "%s/chat-hf", tp_test_tmpdir());
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny", TP_WTYPE_F32, 1, ref), 0);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", ref);
    struct tp_error e;
    static const char *const cfgs[] = {
        "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"chat_template\": \"T1\"}",
        "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"chat_template\": [{\"name\": \"tool_use\", \"template\": "
        "\"X\"}, {\"name\": \"default\", \"template\": \"T2\"}]}",
    };
    static const char *const want[] = {"T1", "T2"};
    for (int i = 0; i < 2; i++) {
        spit(p, cfgs[i]);
        tp_model_t *m = tm_open_model(ref, &e);
        CU_ASSERT_PTR_NOT_NULL_FATAL(m);
        CU_ASSERT_PTR_NOT_NULL_FATAL(tp_model_chat_template(m));
        CU_ASSERT_STRING_EQUAL(tp_model_chat_template(m), want[i]);
        CU_ASSERT_EQUAL(tp_tokenizer_bos(tp_model_tokenizer(m)), 1);
        tp_model_free(m);
    }
    spit(p, "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}");
    char j[600];
    snprintf(j, sizeof j, "%s/chat_template.jinja", ref);
    spit(j, "T3");
    tp_model_t *m = tm_open_model(ref, &e);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_STRING_EQUAL(tp_model_chat_template(m), "T3");
    tp_model_free(m);
}

/* The generation settings a model file recommends (tp_model_gen_defaults_read): an HF directory's
 * generation_config.json, values and refusals; its eos_token_id ends generation once loaded; a GGUF's
 * general.sampling.* keys. */
static void test_generation_config(void)
{
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s/gen-hf", tp_test_tmpdir());
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny", TP_WTYPE_F32, 1, dir), 0);
    struct tp_model_gen_defaults d;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL(tp_model_gen_defaults_read(dir, &d, &e), TP_OK); /* none yet */
    CU_ASSERT_EQUAL(d.set, 0u);
    tp_model_t *m = tm_open_model(dir, &e);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(tp_tokenizer_is_eog(tp_model_tokenizer(m), 7), 0);
    tp_model_free(m);

    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    spit(p, "{\"do_sample\": true, \"temperature\": 0.7, \"top_p\": 0.8, \"top_k\": 20, \"min_p\": 0.05, "
            "\"repetition_penalty\": 1.05, \"max_new_tokens\": 77, \"eos_token_id\": [2, 7], \"bos_token_id\": 1, "
            "\"transformers_version\": \"4.51.0\"}");
    CU_ASSERT_EQUAL_FATAL(tp_model_gen_defaults_read(dir, &d, &e), TP_OK);
    CU_ASSERT_EQUAL(d.set, (unsigned)(TP_MODEL_GEN_TEMPERATURE | TP_MODEL_GEN_TOP_P | TP_MODEL_GEN_TOP_K |
                                      TP_MODEL_GEN_MIN_P | TP_MODEL_GEN_REPEAT_PENALTY | TP_MODEL_GEN_MAX_NEW_TOKENS));
    CU_ASSERT_EQUAL(d.temperature, 0.7f);
    CU_ASSERT_EQUAL(d.top_p, 0.8f);
    CU_ASSERT_EQUAL(d.top_k, 20);
    CU_ASSERT_EQUAL(d.min_p, 0.05f);
    CU_ASSERT_EQUAL(d.repeat_penalty, 1.05f);
    CU_ASSERT_EQUAL(d.max_new_tokens, 77);
    CU_ASSERT_EQUAL(d.n_eos, 2);
    CU_ASSERT_EQUAL(d.eos_ids[1], 7);
    CU_ASSERT_STRING_EQUAL(d.source, "generation_config.json");
    m = tm_open_model(dir, &e);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(tp_tokenizer_is_eog(tp_model_tokenizer(m), 7), 1); /* eos_token_id ends generation */
    tp_model_free(m);

    /* do_sample false: transformers decodes greedily whatever the temperature says */
    spit(p, "{\"do_sample\": false, \"temperature\": 0.6, \"eos_token_id\": 2}");
    CU_ASSERT_EQUAL_FATAL(tp_model_gen_defaults_read(dir, &d, &e), TP_OK);
    CU_ASSERT_EQUAL(d.set, (unsigned)TP_MODEL_GEN_TEMPERATURE);
    CU_ASSERT_EQUAL(d.temperature, 0.0f);
    CU_ASSERT_EQUAL(d.n_eos, 1);

    static const char *const bad[][2] = {{"{\"top_p\": 0}", "top_p"},
                                         {"{\"temperature\": -1}", "temperature"},
                                         {"{\"repetition_penalty\": \"x\"}", "repetition_penalty"},
                                         {"{\"eos_token_id\": [\"x\"]}", "eos_token_id"},
                                         {"[1]", "not a JSON object"}};
    for (size_t i = 0; i < TP_ARRAY_LEN(bad); i++) {
        spit(p, bad[i][0]);
        tp_error_clear(&e);
        CU_ASSERT_EQUAL(tp_model_gen_defaults_read(dir, &d, &e), TP_ERR_FORMAT);
        if (!strstr(e.msg, bad[i][1])) fprintf(stderr, "%s: '%s' does not name %s\n", bad[i][0], e.msg, bad[i][1]);
        CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, bad[i][1]));
    }

    /* a GGUF's general.sampling.* keys (llama.cpp's converter writes them from generation_config.json) */
    char g[600];
    snprintf(g, sizeof g, "%s/gen.gguf", tp_test_tmpdir());
    tp_gguf_writer_t *w = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(g, 0, &w, &e), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_str(w, "general.architecture", "llama"), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_f32(w, "general.sampling.temp", 0.6f), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_i32(w, "general.sampling.top_k", -1), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_kv_f32(w, "general.sampling.top_p", 0.95f), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_writer_finish(w), TP_OK);
    tp_gguf_writer_free(w);
    CU_ASSERT_EQUAL_FATAL(tp_model_gen_defaults_read(g, &d, &e), TP_OK);
    CU_ASSERT_EQUAL(d.set, (unsigned)(TP_MODEL_GEN_TEMPERATURE | TP_MODEL_GEN_TOP_K | TP_MODEL_GEN_TOP_P));
    CU_ASSERT_EQUAL(d.temperature, 0.6f);
    CU_ASSERT_EQUAL(d.top_k, 0); /* -1: off */
    CU_ASSERT_EQUAL(d.top_p, 0.95f);
}

/* A real config.json (Mistral-7B-v0.1, metadata only, from shared/models) read into hparams. */
static void test_real_config(void)
{
    const char *src = tp_test_shared_path("models/tokenizers/mistral-7b-v0.1/config.json");
    if (!src) return; /* ../shared data absent: recorded as a skip */
    char dir[512], dst[600];
    snprintf(dir, sizeof dir, "%s/mistral-config", tp_test_tmpdir());
    mkdir(dir, 0755);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    char *text = slurp(src);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    spit(dst, text);
    free(text);
    CU_ASSERT(tp_hf_is_dir(dir));
    struct tp_hf_config hc;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL_FATAL(tp_hf_read_config(dir, &hc, &e), TP_OK);
    const struct tp_hparams *hp = &hc.hp;
    CU_ASSERT_STRING_EQUAL(hc.architecture, "MistralForCausalLM");
    CU_ASSERT_EQUAL(hp->arch, TP_ARCH_LLAMA);
    CU_ASSERT_EQUAL(hp->n_embd, 4096);
    CU_ASSERT_EQUAL(hp->n_layer, 32);
    CU_ASSERT_EQUAL(hp->n_head, 32);
    CU_ASSERT_EQUAL(hp->n_head_kv, 8);
    CU_ASSERT_EQUAL(hp->head_dim, 128);
    CU_ASSERT_EQUAL(hp->rope_dim, 128);
    CU_ASSERT_EQUAL(hp->n_ff, 14336);
    CU_ASSERT_EQUAL(hp->n_vocab, 32000);
    CU_ASSERT_EQUAL(hp->n_ctx_train, 32768);
    CU_ASSERT_EQUAL(hp->rope_neox, 1);
    CU_ASSERT_EQUAL(hp->rope_theta, 10000.0f);
    CU_ASSERT_EQUAL(hp->norm_eps, 1e-5f);
    CU_ASSERT_EQUAL(hp->tied_embeddings, 0);
    CU_ASSERT_EQUAL(hp->rope_scaling, TP_ROPE_SCALING_NONE);
    CU_ASSERT_EQUAL(hc.quant_bits, 0);
}

static const struct tp_test_case hf_cases[] = {{"same_as_gguf_llama", test_same_llama},
                                               {"same_as_gguf_llama3", test_same_llama3},
                                               {"same_as_gguf_qwen2", test_same_qwen2},
                                               {"same_as_gguf_qwen3", test_same_qwen3},
                                               {"same_as_gguf_moe", test_same_moe},
                                               {"values_permuted", test_values_permuted},
                                               {"half_types", test_half},
                                               {"refusals", test_refusals},
                                               {"chat_template", test_chat_template},
                                               {"generation_config", test_generation_config},
                                               {NULL, NULL}};
TP_TEST_SUITE(hf, "unit,model", 120, hf_cases)
static const struct tp_test_case hf_shared_cases[] = {{"real_config", test_real_config}, {NULL, NULL}};
TP_TEST_SUITE(hf_shared, "unit,model", 120, hf_shared_cases)

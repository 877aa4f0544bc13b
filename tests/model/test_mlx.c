/*
 * tests/model/test_mlx.c - MLX quantized safetensors directories
 * (mlx-community layout: U32 packed X.weight + X.scales + X.biases, the
 * "quantization" block of config.json) through `synth --format mlx` and the
 * single-rank loader.
 *
 * Oracles:
 *   - the same seed's GGUF F32 model: MLX logits within a normalized-MSE
 *     bound justified by the MEASURED weight quantization error e_w (every
 *     MLX matrix dequantized and compared with the HF F32 directory of the
 *     same seed, which holds the same values in the same layout).  Bound:
 *     the output head alone turns independent relative weight errors of
 *     energy e_w into logits errors of energy e_w (y = W h: var(dW h) =
 *     e_w var(W h) for independent zero-mean errors); the quantized
 *     embedding perturbs h by e_w as well, and each of the 7 matrices of a
 *     block adds its e_w to the residual branch it feeds, damped by the
 *     branch's share of the residual stream.  So nmse ~ (2 + small) e_w.
 *     The int8 activations (per 32 values, d = amax / 127, amax ~ 2.5
 *     sigma) add e_a = (2.5 / 127)^2 / 12 = 3.2e-5 per matrix input, which
 *     propagates the same way.  We assert the mean over 64 teacher-forced
 *     steps lies in [e_w / 4, 4 (e_w + e_a)] and the worst step below
 *     10 (e_w + e_a).  Measured (test-tiny, seed 77): 4-bit g64 e_w 4.4e-3,
 *     mean 3.2 e_w, worst 5.1 e_w; 8-bit g64 e_w 1.5e-5, mean 7.6e-5 (where
 *     e_a dominates).  A wrong layout (nibble order, group, scale/bias swap,
 *     q/k row order) gives nmse ~ 1.
 *   - corrupt layouts refused, each with a message naming the problem:
 *     scales shape mismatch, bits in config.json not matching the packed
 *     width, biases missing, scales and biases of different dtypes,
 *     unsupported bits, a U32 weight without a quantization block.
 *   - a GGUF file naming an MLX type id (64..67) is refused by gguf.c.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/kernels.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "model/tensor_source.h"
#include "model_test_util.h"
#include "tp_test.h"

#define STEPS 64

/* Synthetic models of these tests: seed 77 (fmt 0 GGUF, 1 HF / MLX directory). */
static int write_model(const char *shape, enum tp_wtype type, int fmt, int mlx_bf16, const char *out)
{
    return tm_write_model(shape, type, fmt, mlx_bf16, 77, out);
}

/* One step: feed tok at pos, logits into lg. */
static int step(tp_model_t *m, int32_t tok, int32_t pos, float *lg)
{
    int32_t seq = 0;
    int8_t want = 1;
    struct tp_batch b = {1, &tok, &pos, &seq, &want};
    return tp_model_forward(m, &b, lg) == TP_OK ? 0 : -1;
}

/* Energy-weighted quantization error of every MLX matrix of dir against the F32 directory ref. */
static double weight_nmse(const char *dir, const char *ref, int *n_mats)
{
    tp_st_t *q = NULL, *f = NULL;
    struct tp_error e = {0};
    *n_mats = 0;
    if (tp_st_open(dir, &q, &e) != TP_OK || tp_st_open(ref, &f, &e) != TP_OK) {
        fprintf(stderr, "%s\n", e.msg);
        tp_st_close(q);
        return -1.0;
    }
    double num = 0, den = 0;
    for (int i = 0; i < tp_st_n_tensors(q); i++) {
        const struct tp_st_tensor *w = tp_st_tensor(q, i);
        if (w->dtype != TP_ST_U32) continue;
        char base[200], sn[220], bn[220];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(w->name) - 7), w->name); /* drop ".weight" */
        snprintf(sn, sizeof sn, "%s.scales", base);
        snprintf(bn, sizeof bn, "%s.biases", base);
        const struct tp_st_tensor *s = tp_st_find(q, sn), *b = tp_st_find(q, bn);
        if (!s || !b) return -1.0;
        /* mlx-lm's stacked experts [X, R, words]: expert x's rows are the F32 directory's per-expert tensor */
        const int stacked = w->n_dims == 3;
        const int64_t X = stacked ? w->shape[0] : 1, words = w->shape[w->n_dims - 1], ng = s->shape[s->n_dims - 1];
        for (int64_t x = 0; x < X; x++) {
            char rn[220];
            snprintf(rn, sizeof rn, "%s", w->name);
            if (stacked) { /* model.layers.L.{mlp,block_sparse_moe}.switch_mlp.P_proj.weight -> expert x's name */
                int layer = -1;
                const int p = strstr(w->name, ".gate_proj.") ? 0 : strstr(w->name, ".up_proj.") ? 1 : 2;
                const int mixtral = strstr(w->name, "block_sparse_moe") != NULL;
                static const char *const gg[3] = {"gate", "up", "down"};
                char gname[96];
                if (sscanf(w->name, "model.layers.%d.", &layer) != 1) return -1.0;
                snprintf(gname, sizeof gname, "blk.%d.ffn_%s_exps.%lld.weight", layer, gg[p], (long long)x);
                if (!tp_tsrc_hf_name_variant(gname, mixtral, rn, sizeof rn)) return -1.0;
            }
            const struct tp_st_tensor *r = tp_st_find(f, rn);
            if (!r || r->dtype != TP_ST_F32) return -1.0;
            const int64_t rows = r->shape[0], cols = r->shape[1];
            const int bits = (int)(words * 32 / cols), G = (int)(cols / ng);
            const enum tp_wtype t = tp_wtype_mlx(bits, G);
            if (t == TP_WTYPE_COUNT) return -1.0;
            float *row = malloc((size_t)cols * sizeof(float)), *fr = malloc((size_t)cols * sizeof(float));
            for (int64_t k = 0; k < rows; k++) {
                const int64_t kk = x * rows + k;
                tp_kern_dequant_mlx(t, (const uint8_t *)w->data + kk * words * 4, (const uint8_t *)s->data + kk * ng * 2,
                                    (const uint8_t *)b->data + kk * ng * 2, s->dtype == TP_ST_BF16, row, cols);
                memcpy(fr, (const float *)r->data + k * cols, (size_t)cols * sizeof(float));
                for (int64_t c = 0; c < cols; c++) {
                    num += ((double)row[c] - fr[c]) * ((double)row[c] - fr[c]);
                    den += (double)fr[c] * fr[c];
                }
            }
            free(row);
            free(fr);
        }
        (*n_mats)++;
    }
    tp_st_close(q);
    tp_st_close(f);
    return den > 0 ? num / den : -1.0;
}

static void mlx_vs_f32(int bits, int group, int bf16)
{
    const enum tp_wtype t = tp_wtype_mlx(bits, group);
    char gguf[512], hf[512], dir[512];
    snprintf(gguf, sizeof gguf, "%s/mlx-ref-f32.gguf", tp_test_tmpdir());
    snprintf(hf, sizeof hf, "%s/mlx-ref-f32-hf", tp_test_tmpdir());
    snprintf(dir, sizeof dir, "%s/mlx-%d-%d-%d", tp_test_tmpdir(), bits, group, bf16);
    struct stat sb;
    if (stat(gguf, &sb) != 0) CU_ASSERT_EQUAL_FATAL(write_model("test-tiny", TP_WTYPE_F32, 0, 0, gguf), 0);
    if (stat(hf, &sb) != 0) CU_ASSERT_EQUAL_FATAL(write_model("test-tiny", TP_WTYPE_F32, 1, 0, hf), 0);
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny", t, 1, bf16, dir), 0);
    int n_mats = 0;
    const double ew = weight_nmse(dir, hf, &n_mats);
    CU_ASSERT(ew > 0.0);
    CU_ASSERT_EQUAL(n_mats, 2 * 7 + 2); /* 7 per layer, embedding, head: all quantized */
    struct tp_error e;
    tp_model_t *mf = tm_open_model(gguf, &e), *mq = tm_open_model(dir, &e);
    if (!mq) fprintf(stderr, "%s\n", e.msg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mf);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mq);
    CU_ASSERT_EQUAL(tp_model_weight_type(mq), t);
    const int nv = tp_model_hparams(mf)->n_vocab;
    CU_ASSERT_EQUAL_FATAL(tp_model_hparams(mq)->n_vocab, nv);
    float *lf = malloc(sizeof(float) * (size_t)nv), *lq = malloc(sizeof(float) * (size_t)nv);
    CU_ASSERT_FATAL(lf && lq);
    /* teacher-forced: both models read the F32 model's greedy tokens */
    int32_t tok = 1;
    double sum = 0, worst = 0;
    int agree = 0;
    for (int i = 0; i < STEPS; i++) {
        CU_ASSERT_EQUAL_FATAL(step(mf, tok, i, lf), 0);
        CU_ASSERT_EQUAL_FATAL(step(mq, tok, i, lq), 0);
        const double x = tm_nmse(lq, lf, nv);
        sum += x;
        worst = x > worst ? x : worst;
        agree += tm_argmax(lq, nv) == tm_argmax(lf, nv);
        tok = tm_argmax(lf, nv);
    }
    const double mean = sum / STEPS;
    fprintf(stderr,
            "\n  mlx %d-bit g%d %s: weight nmse e_w %.3g over %d matrices; logits nmse vs F32 mean %.3g (%.2f e_w), "
            "worst %.3g (%.2f e_w); greedy argmax agrees %d/%d\n",
            bits, group, bf16 ? "bf16" : "f16", ew, n_mats, mean, mean / ew, worst, worst / ew, agree, STEPS);
    const double ea = 3.2e-5; /* int8 activation error per matrix input, see the top of the file */
    CU_ASSERT(mean <= 4.0 * (ew + ea));
    CU_ASSERT(mean >= ew / 4.0);
    CU_ASSERT(worst <= 10.0 * (ew + ea));
    free(lf);
    free(lq);
    tp_model_free(mf);
    tp_model_free(mq);
}

static void test_q4_g64_f16(void) { mlx_vs_f32(4, 64, 0); }
static void test_q4_g32_bf16(void) { mlx_vs_f32(4, 32, 1); }
static void test_q8_g64_f16(void) { mlx_vs_f32(8, 64, 0); }

/*
 * Mixture of experts as mlx-lm writes it (SwitchGLU stacked experts, router in 8 bits with group 64),
 * Qwen3-MoE and Mixtral, against the GGUF F32 model of the same seed, teacher-forced on the F32
 * model's greedy tokens.  The bound is the dense one above with one addition: where the quantized
 * weights move a token's router logits enough to change which experts it picks (two of its logits
 * within that error of each other), the layer's output is another expert mix, an error the weight
 * error alone does not predict.  So the mean is held to 6 (e_w + e_a) instead of 4 (measured 4.8 e_w
 * for Qwen3-MoE 4-bit, 3.5 e_w for Mixtral 4-bit, 3.0 (e_w + e_a) for 8-bit), and a step may exceed
 * the worst-step bound 10 (e_w + e_a) only at such a flip: at most 1 in 8 steps (measured: none).
 * e_w covers every quantized matrix: each expert of each stacked triple against the F32 directory's
 * per-expert tensor.  A wrong layout (expert order, scales of another expert, the router's 8 bits
 * read as 4) gives nmse ~ 1.
 */
static void moe_mlx_vs_f32(const char *shape, int bits, int group, int n_mats_want)
{
    const enum tp_wtype t = tp_wtype_mlx(bits, group);
    char gguf[512], hf[512], dir[512];
    snprintf(gguf, sizeof gguf, "%s/mlx-%s-f32.gguf", tp_test_tmpdir(), shape);
    snprintf(hf, sizeof hf, "%s/mlx-%s-f32-hf", tp_test_tmpdir(), shape);
    snprintf(dir, sizeof dir, "%s/mlx-%s-%d-%d", tp_test_tmpdir(), shape, bits, group);
    struct stat sb;
    if (stat(gguf, &sb) != 0) CU_ASSERT_EQUAL_FATAL(write_model(shape, TP_WTYPE_F32, 0, 0, gguf), 0);
    if (stat(hf, &sb) != 0) CU_ASSERT_EQUAL_FATAL(write_model(shape, TP_WTYPE_F32, 1, 0, hf), 0);
    CU_ASSERT_EQUAL_FATAL(write_model(shape, t, 1, 0, dir), 0);
    /* the layout: stacked switch_mlp triples and an 8-bit router, as config.json says */
    tp_st_t *st = NULL;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL_FATAL(tp_st_open(dir, &st, &e), TP_OK);
    const int mixtral = strstr(shape, "mixtral") != NULL;
    char nm[160];
    snprintf(nm, sizeof nm, "model.layers.1.%s.switch_mlp.down_proj.weight", mixtral ? "block_sparse_moe" : "mlp");
    const struct tp_st_tensor *sw = tp_st_find(st, nm);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sw);
    CU_ASSERT_EQUAL(sw->n_dims, 3);
    CU_ASSERT_EQUAL(sw->dtype, TP_ST_U32);
    snprintf(nm, sizeof nm, "model.layers.0.%s.gate.scales", mixtral ? "block_sparse_moe" : "mlp");
    const struct tp_st_tensor *rs = tp_st_find(st, nm);
    CU_ASSERT_PTR_NOT_NULL_FATAL(rs);
    tp_st_close(st);
    int n_mats = 0;
    const double ew = weight_nmse(dir, hf, &n_mats);
    CU_ASSERT(ew > 0.0);
    CU_ASSERT_EQUAL(n_mats, n_mats_want);
    tp_model_t *mf = tm_open_model(gguf, &e), *mq = tm_open_model(dir, &e);
    if (!mq) fprintf(stderr, "%s\n", e.msg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mf);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mq);
    CU_ASSERT_EQUAL(tp_model_weight_type(mq), t);
    const int nv = tp_model_hparams(mf)->n_vocab;
    CU_ASSERT_EQUAL_FATAL(tp_model_hparams(mq)->n_vocab, nv);
    CU_ASSERT_EQUAL(tp_model_hparams(mq)->n_expert, tp_model_hparams(mf)->n_expert);
    float *lf = malloc(sizeof(float) * (size_t)nv), *lq = malloc(sizeof(float) * (size_t)nv);
    CU_ASSERT_FATAL(lf && lq);
    const double ea = 3.2e-5, worst_bound = 10.0 * (ew + ea);
    int32_t tok = 1;
    double sum = 0, worst = 0;
    int agree = 0, over = 0;
    for (int i = 0; i < STEPS; i++) {
        CU_ASSERT_EQUAL_FATAL(step(mf, tok, i, lf), 0);
        CU_ASSERT_EQUAL_FATAL(step(mq, tok, i, lq), 0);
        const double x = tm_nmse(lq, lf, nv);
        sum += x;
        worst = x > worst ? x : worst;
        over += x > worst_bound;
        agree += tm_argmax(lq, nv) == tm_argmax(lf, nv);
        tok = tm_argmax(lf, nv);
    }
    const double mean = sum / STEPS;
    fprintf(stderr,
            "\n  mlx moe %s %d-bit g%d: weight nmse e_w %.3g over %d matrices; logits nmse vs F32 mean %.3g (%.2f e_w), "
            "worst %.3g (%.2f e_w), %d steps over 10 (e_w + e_a); greedy argmax agrees %d/%d\n",
            shape, bits, group, ew, n_mats, mean, mean / ew, worst, worst / ew, over, agree, STEPS);
    CU_ASSERT(mean <= 6.0 * (ew + ea));
    CU_ASSERT(mean >= ew / 4.0);
    CU_ASSERT(over <= STEPS / 8);
    free(lf);
    free(lq);
    tp_model_free(mf);
    tp_model_free(mq);
}

/* 2 layers: 7 matrices each (router, stacked gate/up/down counted once, q, k, v, o), embedding, head */
static void test_moe_qwen3moe_q4(void) { moe_mlx_vs_f32("test-tiny-qwen3moe", 4, 64, 2 * 8 + 2); }
static void test_moe_qwen3moe_q8(void) { moe_mlx_vs_f32("test-tiny-qwen3moe", 8, 64, 2 * 8 + 2); }
static void test_moe_mixtral_q4(void) { moe_mlx_vs_f32("test-tiny-mixtral", 4, 32, 2 * 8 + 2); }

/* ------------------------------------------------------------------ corrupt layouts */

static char *slurp(const char *path, size_t *len)
{
    size_t n = 0;
    char *d = tp_test_read_file(path, &n);
    if (len) *len = n;
    return d;
}

static void spit(const char *path, const void *d, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(d, 1, n, f);
    fclose(f);
}

static void copy_dir(const char *src, const char *dst)
{
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    mkdir(dst, 0755);
    for (size_t i = 0; i < TP_ARRAY_LEN(files); i++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dst, files[i]);
        size_t n;
        char *d = slurp(a, &n);
        if (d) spit(b, d, n);
        free(d);
    }
}

/* Rewrite dir/model.safetensors' header with edit(hdr); the data section is kept byte for byte. */
static void edit_header(const char *dir, void (*edit)(cJSON *hdr))
{
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    size_t n;
    uint8_t *d = (uint8_t *)slurp(p, &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)d[i] << (8 * i);
    char *js = malloc(hl + 1);
    memcpy(js, d + 8, hl);
    js[hl] = '\0';
    cJSON *h = cJSON_Parse(js);
    CU_ASSERT_PTR_NOT_NULL_FATAL(h);
    edit(h);
    char *out = cJSON_PrintUnformatted(h);
    size_t ol = strlen(out), pad = (8 - (8 + ol) % 8) % 8;
    FILE *f = fopen(p, "wb");
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)(ol + pad) >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(out, 1, ol, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    fwrite(d + 8 + hl, 1, n - 8 - hl, f);
    fclose(f);
    free(out);
    free(js);
    free(d);
    cJSON_Delete(h);
}

#define DOWN "model.layers.1.mlp.down_proj"

static void ed_scales_shape(cJSON *h) /* [64, 2] -> [32, 4]: same bytes, wrong shape */
{
    cJSON *shape = cJSON_GetObjectItem(cJSON_GetObjectItem(h, DOWN ".scales"), "shape");
    cJSON_ReplaceItemInArray(shape, 0, cJSON_CreateNumber(32));
    cJSON_ReplaceItemInArray(shape, 1, cJSON_CreateNumber(4));
}
static void ed_no_biases(cJSON *h) /* renamed: the data stays covered, the name is gone */
{
    cJSON *b = cJSON_DetachItemFromObject(h, DOWN ".biases");
    cJSON_AddItemToObject(h, DOWN ".biases_gone", b);
}
static void ed_bias_dtype(cJSON *h)
{
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(h, DOWN ".biases"), "dtype", cJSON_CreateString("BF16"));
}
static void ed_scales_u8(cJSON *h) /* F16 [64, 2] -> U8 [64, 4] */
{
    cJSON *s = cJSON_GetObjectItem(h, DOWN ".scales");
    cJSON_ReplaceItemInObject(s, "dtype", cJSON_CreateString("U8"));
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(s, "shape"), 1, cJSON_CreateNumber(4));
}

static void set_config(const char *dir, const char *quant_json)
{
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *text = slurp(p, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON_DeleteItemFromObject(root, "quantization");
    cJSON_DeleteItemFromObject(root, "quantization_config");
    if (quant_json) cJSON_AddItemToObject(root, "quantization", cJSON_Parse(quant_json));
    char *out = cJSON_Print(root);
    spit(p, out, strlen(out));
    free(out);
    cJSON_Delete(root);
}

static void expect_refused(const char *dir, const char *what, const char *want)
{
    struct tp_error e;
    tp_model_t *m = tm_open_model(dir, &e);
    if (m || !strstr(e.msg, want)) fprintf(stderr, "\n  case '%s': %s (want '%s')\n", what, m ? "accepted" : e.msg, want);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, want));
    tp_model_free(m);
}

static void test_corrupt(void)
{
    char ref[512], dir[512];
    snprintf(ref, sizeof ref, "%s/mlx-corrupt-ref", tp_test_tmpdir());
    snprintf(dir, sizeof dir, "%s/mlx-corrupt", tp_test_tmpdir());
    CU_ASSERT_EQUAL_FATAL(write_model("test-tiny", TP_WTYPE_MLX_Q4_G64, 1, 0, ref), 0);
    struct tp_error e;
    tp_model_t *ok = tm_open_model(ref, &e);
    CU_ASSERT_PTR_NOT_NULL(ok); /* the reference itself loads */
    tp_model_free(ok);

    copy_dir(ref, dir);
    edit_header(dir, ed_scales_shape);
    expect_refused(dir, "scales shape", "'" DOWN ".scales' shape [32, 4] and '" DOWN ".biases' shape [64, 2] must both be [64, groups]");
    copy_dir(ref, dir);
    edit_header(dir, ed_no_biases);
    expect_refused(dir, "missing biases", DOWN ".biases is missing");
    copy_dir(ref, dir);
    edit_header(dir, ed_bias_dtype);
    expect_refused(dir, "dtype mismatch", "scales and biases must share a dtype");
    copy_dir(ref, dir);
    edit_header(dir, ed_scales_u8);
    expect_refused(dir, "scales dtype", "has dtype U8; MLX scales must be F16 or BF16");
    copy_dir(ref, dir);
    set_config(dir, "{\"group_size\": 64, \"bits\": 8}");
    expect_refused(dir, "bits vs packed width",
                   "is 4-bit with group size 64 by its shapes ([512, 8] words for 64 columns, 1 groups) but config.json "
                   "quantization says 8 bits, group size 64");
    copy_dir(ref, dir);
    set_config(dir, "{\"group_size\": 64, \"bits\": 3}");
    expect_refused(dir, "unsupported bits", "MLX quantization with 3 bits and group size 64 is not supported");
    copy_dir(ref, dir);
    set_config(dir, "{\"group_size\": 32, \"bits\": 4, \"mode\": \"mxfp4\"}");
    expect_refused(dir, "mode", "\"quantization\".mode 'mxfp4' is not supported (MLX affine quantization only");
    copy_dir(ref, dir);
    set_config(dir, NULL);
    expect_refused(dir, "no quantization block", "is packed U32 (MLX quantized) but config.json has no \"quantization\"");
    /* a per-module override that matches the file is accepted, one that does not is refused */
    copy_dir(ref, dir);
    set_config(dir, "{\"group_size\": 64, \"bits\": 4, \"" DOWN "\": {\"group_size\": 32, \"bits\": 4}}");
    expect_refused(dir, "override", "'" DOWN ".weight' is 4-bit with group size 64 by its shapes");
    set_config(dir, "{\"group_size\": 64, \"bits\": 4, \"mode\": \"affine\", \"" DOWN "\": {\"group_size\": 64, \"bits\": 4}}");
    ok = tm_open_model(dir, &e);
    if (!ok) fprintf(stderr, "\n  override accepted? %s\n", e.msg);
    CU_ASSERT_PTR_NOT_NULL(ok);
    tp_model_free(ok);
}

/* A GGUF naming an MLX type id: gguf.c knows only GGUF's ids and refuses it. */
static void test_gguf_refuses_mlx_ids(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/mlx-id.gguf", tp_test_tmpdir());
    tp_gguf_writer_t *w = NULL;
    struct tp_error e = {0};
    const int64_t ne[2] = {32, 2};
    /* the writer refuses them outright */
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(p, 32, &w, &e), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_add_tensor(w, "x.weight", TP_WTYPE_MLX_Q4_G32, 2, ne), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_gguf_writer_error(w), "MLX types have no GGUF id"));
    tp_gguf_writer_free(w);
    w = NULL;
    /* and a file whose type field says 64..67 is refused by the reader */
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(p, 32, &w, &e), TP_OK);
    tp_gguf_kv_str(w, "general.architecture", "llama");
    CU_ASSERT_EQUAL_FATAL(tp_gguf_add_tensor(w, "mlx_victim.weight", TP_WTYPE_Q4_0, 2, ne), TP_OK);
    uint8_t data[36] = {0};
    CU_ASSERT_EQUAL_FATAL(tp_gguf_write_data(w, data, sizeof data), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_finish(w), TP_OK);
    tp_gguf_writer_free(w);
    size_t n;
    char *d = slurp(p, &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    /* tensor info: name (u64 length + bytes), n_dims u32, ne u64 x n_dims, type u32 */
    char *at = NULL;
    for (size_t i = 0; i + 17 < n && !at; i++)
        if (memcmp(d + i, "mlx_victim.weight", 17) == 0) at = d + i + 17;
    CU_ASSERT_PTR_NOT_NULL_FATAL(at);
    for (int id = TP_WTYPE_MLX_Q4_G32; id <= TP_WTYPE_MLX_Q8_G64; id++) {
        uint32_t v = (uint32_t)id;
        memcpy(at + 4 + 2 * 8, &v, 4);
        spit(p, d, n);
        tp_gguf_t *g = NULL;
        CU_ASSERT_EQUAL(tp_gguf_open(p, &g, &e), TP_ERR_UNSUPPORTED);
        CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "unknown tensor type"));
        tp_gguf_close(g);
    }
    free(d);
}

static const struct tp_test_case mlx_cases[] = {
    {"q4_g64_f16_vs_f32", test_q4_g64_f16},
    {"q4_g32_bf16_vs_f32", test_q4_g32_bf16},
    {"q8_g64_f16_vs_f32", test_q8_g64_f16},
    {"moe_qwen3moe_q4_g64_vs_f32", test_moe_qwen3moe_q4},
    {"moe_qwen3moe_q8_g64_vs_f32", test_moe_qwen3moe_q8},
    {"moe_mixtral_q4_g32_vs_f32", test_moe_mixtral_q4},
    {"corrupt", test_corrupt},
    {"gguf_refuses_mlx_ids", test_gguf_refuses_mlx_ids},
    {NULL, NULL},
};
TP_TEST_SUITE(mlx, "unit,model", 120, mlx_cases)

/*
 * model/synth/synth_hf.c - `tpserve synth --format hf` / `--format mlx`: a
 * random-weight model of a real shape written as a Hugging Face (or
 * mlx-community) directory, with the values of the GGUF writer for the same
 * seed (synth_impl.h), so both formats of one seed are the same model.  The
 * layouts: docs/models.md ("How --format hf and --format mlx are written").
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "model/kernels.h"
#include "synth_impl.h"
#include "model/tensor_source.h"

#define HF_DEFAULT_SHARD_BYTES 5000000000ull /* transformers' save_pretrained default ("5GB") */

/* A growable text buffer; on allocation failure `failed` sticks. */
struct sbuf {
    char *p;
    size_t n, cap;
    int failed;
};

static void sb_add(struct sbuf *b, const char *s, size_t len)
{
    if (b->failed) return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + len + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) TP_PRINTF(2, 3);
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        b->failed = 1;
        return;
    }
    sb_add(b, tmp, (size_t)n);
}

/* s as a JSON string literal. */
static void sb_json_str(struct sbuf *b, const char *s)
{
    cJSON *str = cJSON_CreateString(s);
    char *lit = str ? cJSON_PrintUnformatted(str) : NULL;
    if (lit) sb_add(b, lit, strlen(lit));
    else b->failed = 1;
    cJSON_free(lit);
    cJSON_Delete(str);
}

static enum tp_status write_text(const char *dir, const char *name, const char *text, size_t len, struct tp_error *err)
{
    char path[4096], part[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(part, sizeof(part), "%s.partial", path);
    FILE *f = fopen(part, "wb");
    if (!f) return tp_error_set(err, TP_ERR_IO, "synth: cannot create %s: %s", part, strerror(errno));
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fclose(f) != 0;
    if (bad || rename(part, path) != 0) {
        remove(part);
        return tp_error_set(err, TP_ERR_IO, "synth: writing %s failed", path);
    }
    return TP_OK;
}

static enum tp_status copy_file(const char *src, const char *dir, const char *name, struct tp_error *err)
{
    FILE *f = fopen(src, "rb");
    if (!f) return tp_error_set(err, TP_ERR_IO, "synth: cannot open %s: %s", src, strerror(errno));
    struct sbuf b = {0};
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0) sb_add(&b, tmp, n);
    int bad = ferror(f);
    fclose(f);
    enum tp_status rc;
    if (bad || b.failed) rc = tp_error_set(err, TP_ERR_IO, "synth: reading %s failed", src);
    else rc = write_text(dir, name, b.p ? b.p : "", b.n, err);
    free(b.p);
    return rc;
}

/* ------------------------------------------------------------ config.json */

static void config_json(struct sbuf *b, const struct tp_shape *s, int n_layer, int n_vocab, enum tp_wtype wt,
                        enum tp_wtype mlx_type, int router_q8, int bos, int eos)
{
    const int mixtral = s->arch == TP_ARCH_LLAMA && s->n_expert > 0;
    const char *arch = s->arch == TP_ARCH_QWEN2      ? "Qwen2ForCausalLM"
                       : s->arch == TP_ARCH_GPTOSS   ? "GptOssForCausalLM"
                       : s->arch == TP_ARCH_QWEN3    ? "Qwen3ForCausalLM"
                       : s->arch == TP_ARCH_QWEN3MOE ? "Qwen3MoeForCausalLM"
                       : s->arch == TP_ARCH_QWEN2MOE ? "Qwen2MoeForCausalLM"
                       : mixtral                     ? "MixtralForCausalLM"
                                                     : "LlamaForCausalLM";
    const char *mt = s->arch == TP_ARCH_QWEN2      ? "qwen2"
                     : s->arch == TP_ARCH_GPTOSS   ? "gpt_oss"
                     : s->arch == TP_ARCH_QWEN3    ? "qwen3"
                     : s->arch == TP_ARCH_QWEN3MOE ? "qwen3_moe"
                     : s->arch == TP_ARCH_QWEN2MOE ? "qwen2_moe"
                     : mixtral                     ? "mixtral"
                                                   : "llama";
    sb_printf(b, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", arch, mt);
    sb_printf(b, "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n", s->n_embd,
              s->n_ff, n_layer);
    sb_printf(b, "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n", s->n_head,
              s->n_head_kv, s->head_dim);
    sb_printf(b, "  \"max_position_embeddings\": %d,\n  \"vocab_size\": %d,\n", s->n_ctx, n_vocab);
    /* %.9g: parsing gives back the same float */
    sb_printf(b, "  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.9g,\n", (double)s->norm_eps, (double)s->rope_theta);
    if (s->rope_scaling == TP_ROPE_SCALING_LLAMA3)
        sb_printf(b,
                  "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.9g, \"low_freq_factor\": %.9g, "
                  "\"high_freq_factor\": %.9g, \"original_max_position_embeddings\": %d},\n",
                  (double)s->rope_factor, (double)s->rope_low_freq_factor, (double)s->rope_high_freq_factor,
                  s->rope_orig_ctx);
    else if (s->rope_scaling == TP_ROPE_SCALING_LINEAR)
        sb_printf(b, "  \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": %.9g},\n", (double)s->rope_factor);
    else if (s->rope_scaling == TP_ROPE_SCALING_YARN) /* as openai/gpt-oss-20b's config.json */
        sb_printf(b,
                  "  \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": %.9g, \"beta_fast\": 32.0, "
                  "\"beta_slow\": 1.0, \"original_max_position_embeddings\": %d, \"truncate\": false},\n",
                  (double)s->rope_factor, s->rope_orig_ctx);
    else
        sb_printf(b, "  \"rope_scaling\": null,\n");
    sb_printf(b, "  \"tie_word_embeddings\": %s,\n  \"hidden_act\": \"silu\",\n", s->tied ? "true" : "false");
    if (s->arch == TP_ARCH_LLAMA) sb_printf(b, "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n");
    if (s->arch == TP_ARCH_GPTOSS) {
        sb_printf(b,
                  "  \"num_local_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"experts_per_token\": %d,\n"
                  "  \"attention_bias\": true,\n  \"swiglu_limit\": 7.0,\n  \"layer_types\": [",
                  s->n_expert, s->n_expert_used, s->n_expert_used);
        for (int l = 0; l < n_layer; l++)
            sb_printf(b, "%s\"%s\"", l ? ", " : "", l % 2 == 0 ? "sliding_attention" : "full_attention");
        sb_printf(b, "],\n  \"quantization_config\": {\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": "
                     "[\"model.layers.*.self_attn\", \"model.layers.*.mlp.router\", \"model.embed_tokens\", "
                     "\"lm_head\"]},\n");
    } else if (mixtral)
        sb_printf(b, "  \"num_local_experts\": %d,\n  \"num_experts_per_tok\": %d,\n", s->n_expert, s->n_expert_used);
    else if (s->n_expert > 0)
        sb_printf(b,
                  "  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"moe_intermediate_size\": %d,\n"
                  "  \"norm_topk_prob\": %s,\n  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [],\n",
                  s->n_expert, s->n_expert_used, tp_shape_ff_width(s), s->arch == TP_ARCH_QWEN3MOE ? "true" : "false");
    if (s->n_ff_shexp > 0) sb_printf(b, "  \"shared_expert_intermediate_size\": %d,\n", s->n_ff_shexp);
    if (s->sliding_window > 0) sb_printf(b, "  \"sliding_window\": %d,\n", s->sliding_window);
    if (bos >= 0) sb_printf(b, "  \"bos_token_id\": %d,\n", bos);
    if (eos >= 0) sb_printf(b, "  \"eos_token_id\": %d,\n", eos);
    if (tp_wtype_mlx_bits(mlx_type)) /* mlx-lm writes both */
        for (int i = 0; i < 2; i++) {
            sb_printf(b, "  \"%s\": {\"group_size\": %d, \"bits\": %d", i ? "quantization_config" : "quantization",
                      tp_wtype_mlx_group(mlx_type), tp_wtype_mlx_bits(mlx_type));
            for (int l = 0; router_q8 && l < n_layer; l++) /* the routers: 8 bits, group 64 */
                sb_printf(b, ", \"model.layers.%d.%s.gate\": {\"group_size\": 64, \"bits\": 8}", l,
                          mixtral ? "block_sparse_moe" : "mlp");
            sb_printf(b, "},\n");
        }
    sb_printf(b, "  \"torch_dtype\": \"%s\",\n  \"_tpserve_synth\": \"random weights written by tpserve synth (shape %s)\"\n}\n",
              wt == TP_WTYPE_F32 ? "float32" : wt == TP_WTYPE_F16 ? "float16" : "bfloat16", s->name);
}

/* ------------------------------------------------------------ tokenizer */

/* The generated SPM vocabulary as a byte-fallback BPE tokenizer.json. */
static void spm_tokenizer_json(struct sbuf *b, const struct tp_synth_vocab *v)
{
    sb_printf(b, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [");
    int first = 1;
    for (int i = 0; i < v->n_tokens; i++) {
        if (v->types[i] != 2 /* control */ && v->types[i] != 3 /* unknown */) continue;
        sb_printf(b, "%s{\"id\": %d, \"content\": ", first ? "" : ", ", i);
        sb_json_str(b, v->tokens[i]);
        sb_printf(b, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
                     "\"special\": true}");
        first = 0;
    }
    sb_printf(b, "], \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
                 "\"\xE2\x96\x81\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": "
                 "\"\xE2\x96\x81\"}]}, \"pre_tokenizer\": null, \"post_processor\": null, \"decoder\": null, ");
    sb_printf(b, "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", "
                 "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": true, "
                 "\"byte_fallback\": true, \"ignore_merges\": false, \"vocab\": {");
    for (int i = 0; i < v->n_tokens; i++) {
        if (i) sb_add(b, ", ", 2);
        sb_json_str(b, v->tokens[i]);
        sb_printf(b, ": %d", i);
    }
    sb_printf(b, "}, \"merges\": [");
    first = 1;
    for (int i = 0; i < v->n_tokens; i++) {
        if (v->types[i] != 1 /* normal */) continue;
        const char *t = v->tokens[i];
        size_t len = strlen(t);
        /* pieces are "▁" + ASCII or ASCII: the last character is one byte, except for "▁" itself */
        if (len < 2 || strcmp(t, "\xE2\x96\x81") == 0) continue;
        char left[64], right[8];
        if (len - 1 >= sizeof(left)) continue;
        memcpy(left, t, len - 1);
        left[len - 1] = '\0';
        right[0] = t[len - 1];
        right[1] = '\0';
        sb_printf(b, "%s[", first ? "" : ", ");
        sb_json_str(b, left);
        sb_add(b, ", ", 2);
        sb_json_str(b, right);
        sb_add(b, "]", 1);
        first = 0;
    }
    sb_printf(b, "]}}\n");
}

/* ------------------------------------------------------------ tensors */

struct hf_tensor {
    const struct tp_synth_tensor *t;
    char name[160];
    int file;
    uint64_t off, bytes; /* within the file's data section */
    int permute_heads;   /* llama q/k: head count for the halves permutation, else 0 */
    enum tp_wtype wtype; /* written as: F32 / F16 / BF16, or (part 1) t->type, an MLX type */
    int part;            /* MLX: 1 packed words (U32), 2 scales, 3 biases (from part 1's buffers); 0 plain */
    enum tp_wtype mlx_type; /* MLX parts 1-3: the triple's MLX type (bits, group) */
    int64_t n_stack;     /* MLX stacked experts: n_expert (shape [n_stack, rows, cols]), else 0 */
    int64_t row_base;    /* stacked experts: this expert's first row in t (one HF tensor per expert), else 0 */
    int shape_1xn;       /* a 1-D GGUF vector stored as [1, n] (Qwen2-MoE shared_expert_gate) */
    /* gpt-oss experts (OpenAI's MXFP4 layout): part 4 PREFIX_blocks U8 (X, R, C/32, 16), part 5
     * PREFIX_scales U8 (X, R, C/32) (from part 4's buffer), part 6 gate_up_proj_bias (X, 2F);
     * t2: the up tensor fused with t (gate) as rows 2f / 2f + 1, NULL for down */
    const struct tp_synth_tensor *t2;
    int64_t x_rows; /* parts 4-6: rows of the tensor (X * R, or X) */
};

struct gen_job {
    const struct tp_shape *shape;
    const struct hf_tensor *h;
    uint64_t seed, seed2; /* seed2: h->t2's (gpt-oss fused gate_up) */
    int64_t row0, n_rows;
    float *f32;       /* (n_rows, ne0) */
    uint8_t *out;     /* (n_rows, row_bytes) */
    size_t row_bytes;
    uint16_t *mlx_s, *mlx_b; /* MLX part 1: (rows, ne0 / group) scales and biases of the whole tensor */
    int mlx_bf16;
};

/* Rows [b, e) of the chunk of a gpt-oss expert tensor (parts 4 and 6, see struct hf_tensor). */
static void gptoss_rows(const struct gen_job *j, int64_t b, int64_t e)
{
    const struct hf_tensor *h = j->h;
    const struct tp_synth_tensor *t = h->t;
    const int64_t ne0 = t->ne[0];
    for (int64_t r = b; r < e; r++) {
        const int64_t row = j->row0 + r;
        uint8_t *o = j->out + (size_t)r * j->row_bytes;
        float *x = j->f32 + r * 2 * ne0;
        if (h->part == 6) { /* bias row x: gate and up interleaved */
            tp_synth_fill_row(j->shape, t, j->seed, row, x);
            tp_synth_fill_row(j->shape, h->t2, j->seed2, row, x + ne0);
            for (int64_t i = 0; i < 2 * ne0; i++) {
                const float v = x[(i & 1) * ne0 + i / 2];
                uint16_t hv = h->wtype == TP_WTYPE_F16 ? tp_f32_to_fp16(v) : tp_f32_to_bf16(v);
                if (h->wtype == TP_WTYPE_F32) memcpy(o + 4 * i, &v, 4);
                else memcpy(o + 2 * i, &hv, 2);
            }
            continue;
        }
        /* part 4: fused gate/up row (expert x, row jj): gate row x*F + jj/2 for even jj, up for odd */
        const struct tp_synth_tensor *src = t;
        int64_t srow = row;
        uint64_t seed = j->seed;
        if (h->t2) {
            const int64_t F = t->ne[1], xx = row / (2 * F), jj = row % (2 * F);
            src = jj & 1 ? h->t2 : t;
            seed = jj & 1 ? j->seed2 : j->seed;
            srow = xx * F + jj / 2;
        }
        tp_synth_fill_row(j->shape, src, seed, srow, x);
        const int64_t nb = ne0 / 32;
        uint8_t blk[17];
        for (int64_t k = 0; k < nb; k++) {
            tp_kern_quantize(TP_WTYPE_MXFP4, x + 32 * k, blk, 32); /* GGUF layout: e, then j low / j+16 high */
            ((uint8_t *)j->mlx_s)[(size_t)(row * nb + k)] = blk[0];
            for (int i = 0; i < 16; i++) { /* OpenAI: byte i holds elements 2i (low) and 2i+1 (high) */
                const int e0 = 2 * i, e1 = 2 * i + 1;
                const uint8_t c0 = (uint8_t)(e0 < 16 ? blk[1 + e0] & 0x0F : blk[1 + e0 - 16] >> 4);
                const uint8_t c1 = (uint8_t)(e1 < 16 ? blk[1 + e1] & 0x0F : blk[1 + e1 - 16] >> 4);
                o[k * 16 + i] = (uint8_t)(c0 | (c1 << 4));
            }
        }
    }
}

static void gen_worker(void *ctx, int ith, int nth)
{
    struct gen_job *j = ctx;
    const struct tp_synth_tensor *t = j->h->t;
    const int64_t ne0 = t->ne[0];
    int64_t b, e;
    tp_split_range(j->n_rows, ith, nth, &b, &e);
    if (j->h->part >= 4) {
        gptoss_rows(j, b, e);
        return;
    }
    for (int64_t r = b; r < e; r++) {
        int64_t row = j->row0 + r + j->h->row_base;
        if (j->h->permute_heads) {
            int64_t hd = t->ne[1] / j->h->permute_heads, half = hd / 2;
            int64_t head = row / hd, in = row % hd, s = in / half, i = in % half;
            row = head * hd + 2 * i + s;
        }
        float *x = j->f32 + r * ne0;
        tp_synth_fill_row(j->shape, t, j->seed, row, x);
        uint8_t *o = j->out + (size_t)r * j->row_bytes;
        const enum tp_wtype wt = j->h->wtype;
        if (j->h->part == 1) {
            const size_t g0 = (size_t)(j->row0 + r) * (size_t)(ne0 / tp_wtype_mlx_group(wt));
            tp_kern_quantize_mlx(wt, x, o, j->mlx_s + g0, j->mlx_b + g0, j->mlx_bf16, ne0);
        } else if (wt == TP_WTYPE_F32) {
            memcpy(o, x, (size_t)ne0 * 4);
        } else {
            for (int64_t i = 0; i < ne0; i++) {
                uint16_t h = wt == TP_WTYPE_F16 ? tp_f32_to_fp16(x[i]) : tp_f32_to_bf16(x[i]);
                memcpy(o + 2 * i, &h, 2);
            }
        }
    }
}

static const char *st_dtype(enum tp_wtype t)
{
    if (t == TP_WTYPE_MXFP4) return "U8";
    return t == TP_WTYPE_F32 ? "F32" : t == TP_WTYPE_F16 ? "F16" : tp_wtype_mlx_bits(t) ? "U32" : "BF16";
}

/* Row length as stored: MLX words (part 1: ne0 * bits / 32 uint32), groups (parts 2, 3), else ne0. */
static int64_t hf_cols(const struct hf_tensor *h)
{
    const int64_t ne0 = h->t->ne[0];
    if (h->part == 1) return ne0 * tp_wtype_mlx_bits(h->mlx_type) / 32;
    if (h->part == 2 || h->part == 3) return ne0 / tp_wtype_mlx_group(h->mlx_type);
    return ne0;
}

static void shard_name(char *out, size_t cap, int n_files, int i)
{
    if (n_files == 1) snprintf(out, cap, "model.safetensors");
    else snprintf(out, cap, "model-%05d-of-%05d.safetensors", i + 1, n_files);
}

/* Write file fi (its header, then its tensors' data). */
static enum tp_status write_shard(const char *dir, int n_files, int fi, struct hf_tensor *ht, int n_ht,
                                  const struct tp_synth_config *cfg, const struct tp_shape *shape, tp_pool_t *pool,
                                  float *f32, uint8_t *conv, size_t buf_elems, uint16_t *mlx_s, uint16_t *mlx_b,
                                  uint64_t *done, uint64_t total, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    char name[64], path[4096], part[4200];
    shard_name(name, sizeof(name), n_files, fi);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(part, sizeof(part), "%s.partial", path);
    struct sbuf h = {0};
    sb_printf(&h, "{\"__metadata__\":{\"format\":\"%s\"}", tp_wtype_mlx_bits(cfg->type) ? "mlx" : "pt");
    for (int i = 0; i < n_ht; i++) {
        if (ht[i].file != fi) continue;
        const struct tp_synth_tensor *t = ht[i].t;
        sb_add(&h, ",", 1);
        sb_json_str(&h, ht[i].name);
        if (ht[i].part == 4 || ht[i].part == 5) { /* gpt-oss MXFP4 blocks / scales */
            const int64_t X = t->ne[2], R = ht[i].x_rows / X, nb = t->ne[0] / 32;
            if (ht[i].part == 4)
                sb_printf(&h, ":{\"dtype\":\"U8\",\"shape\":[%lld,%lld,%lld,16],", (long long)X, (long long)R, (long long)nb);
            else
                sb_printf(&h, ":{\"dtype\":\"U8\",\"shape\":[%lld,%lld,%lld],", (long long)X, (long long)R, (long long)nb);
        } else if (ht[i].part == 6) {
            sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],", st_dtype(ht[i].wtype), (long long)ht[i].x_rows,
                      (long long)(2 * t->ne[0]));
        } else if (ht[i].n_stack) /* MLX stacked experts: [n_expert, rows, cols] */
            sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[%lld,%lld,%lld],", ht[i].part == 1 ? "U32" : st_dtype(ht[i].wtype),
                      (long long)ht[i].n_stack, (long long)t->ne[1], (long long)hf_cols(&ht[i]));
        else if (t->n_dims >= 2) /* a stacked tensor: one expert's [rows, cols] */
            sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],", st_dtype(ht[i].wtype), (long long)t->ne[1],
                      (long long)hf_cols(&ht[i]));
        else if (ht[i].shape_1xn)
            sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[1,%lld],", st_dtype(ht[i].wtype), (long long)t->ne[0]);
        else
            sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[%lld],", st_dtype(ht[i].wtype), (long long)t->ne[0]);
        sb_printf(&h, "\"data_offsets\":[%llu,%llu]}", (unsigned long long)ht[i].off,
                  (unsigned long long)(ht[i].off + ht[i].bytes));
    }
    sb_add(&h, "}", 1);
    /* pad the header with spaces so the data section starts 64-byte aligned (the reference writer
     * aligns to 8): tensors whose offsets are multiples of 32 are then used in place from the mapping */
    while (!h.failed && (8 + h.n) % 64) sb_add(&h, " ", 1);
    if (h.failed) return tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory for a safetensors header");
    FILE *f = fopen(part, "wb");
    if (!f) {
        free(h.p);
        return tp_error_set(err, TP_ERR_IO, "synth: cannot create %s: %s", part, strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
    int bad = fwrite(len8, 1, 8, f) != 8 || fwrite(h.p, 1, h.n, f) != h.n;
    free(h.p);
    for (int i = 0; i < n_ht && !bad; i++) {
        if (ht[i].file != fi) continue;
        const struct tp_synth_tensor *t = ht[i].t;
        const int64_t rows = ht[i].x_rows > 0 ? ht[i].x_rows : t->n_dims >= 2 ? t->ne[1] : 1;
        if (ht[i].part == 2 || ht[i].part == 3 || ht[i].part == 5) { /* scales (/ biases) that the part just before
                                                                        (same file) computed */
            size_t nb = (size_t)ht[i].bytes;
            bad = fwrite(ht[i].part != 3 ? (void *)mlx_s : (void *)mlx_b, 1, nb, f) != nb;
            *done += nb;
            continue;
        }
        const int64_t chunk_rows = TP_MAX((int64_t)1, (int64_t)buf_elems / (2 * t->ne[0])); /* part 6: 2 rows each */
        const size_t esz = ht[i].wtype == TP_WTYPE_F32 ? 4 : 2;
        struct gen_job job = {.shape = shape,
                              .h = &ht[i],
                              .seed = tp_synth_tensor_seed(cfg->seed, t->name),
                              .seed2 = ht[i].t2 ? tp_synth_tensor_seed(cfg->seed, ht[i].t2->name) : 0,
                              .f32 = f32,
                              .out = conv,
                              .row_bytes = ht[i].part == 1   ? (size_t)hf_cols(&ht[i]) * 4
                                           : ht[i].part == 4 ? (size_t)(t->ne[0] / 32) * 16
                                           : ht[i].part == 6 ? (size_t)(2 * t->ne[0]) * esz
                                                             : (size_t)t->ne[0] * esz,
                              .mlx_s = mlx_s,
                              .mlx_b = mlx_b,
                              .mlx_bf16 = cfg->mlx_bf16};
        for (int64_t r = 0; r < rows && !bad; r += chunk_rows) {
            job.row0 = r;
            job.n_rows = TP_MIN(chunk_rows, rows - r);
            tp_pool_run(pool, gen_worker, &job);
            size_t nb = (size_t)job.n_rows * job.row_bytes;
            bad = fwrite(conv, 1, nb, f) != nb;
            *done += nb;
            if (cfg->progress) cfg->progress(cfg->progress_ctx, *done, total);
        }
    }
    bad |= fclose(f) != 0;
    if (bad || rename(part, path) != 0) {
        remove(part);
        rc = tp_error_set(err, TP_ERR_IO, "synth: writing %s failed (disk full?)", path);
    }
    return rc;
}

/* Where the tensors go: entries of ht laid out file after file. */
struct hf_layout {
    struct hf_tensor *ht; /* entries, n used */
    int n, file;          /* file: the one being filled */
    uint64_t in_file, total, cap;
    int64_t max_ne0;      /* the widest row: the conversion buffers' size */
    size_t mlx_groups;    /* the largest scales / biases tensor (MLX, gpt-oss scales), in 16-bit values */
};

/* Close the current file first when it holds something and `need` more bytes would pass the cap. */
static void lay_break(struct hf_layout *L, uint64_t need)
{
    if (L->in_file > 0 && L->in_file + need > L->cap) {
        L->file++;
        L->in_file = 0;
    }
}

/* h at the end of the current file. */
static void lay_place(struct hf_layout *L, struct hf_tensor *h)
{
    h->file = L->file;
    h->off = L->in_file;
    L->in_file += h->bytes;
    L->total += h->bytes;
}

static uint64_t float_bytes(enum tp_wtype t, uint64_t n) { return n * (t == TP_WTYPE_F32 ? 4 : 2); }

/* gpt-oss in OpenAI's layout: t is a layer's attn_sinks (a plain vector) or one of its expert tensors, in
 * tp_synth_plan's order (gate, up, down weights, then gate, up, down biases; up is fused with gate). */
static enum tp_status lay_gptoss(struct hf_layout *L, const struct tp_synth_tensor *t,
                                 const struct tp_synth_tensor *end, struct tp_error *err)
{
    int layer = 0;
    sscanf(t->name, "blk.%d.", &layer);
    const int down = strstr(t->name, "ffn_down_exps") != NULL, bias = strstr(t->name, ".bias") != NULL;
    if (strstr(t->name, "attn_sinks")) { /* self_attn.sinks */
        struct hf_tensor *h = &L->ht[L->n++];
        h->t = t;
        snprintf(h->name, sizeof h->name, "model.layers.%d.self_attn.sinks", layer);
        h->wtype = t->type; /* vectors keep the plan's F32, as the GGUF writer */
        h->bytes = float_bytes(h->wtype, (uint64_t)t->ne[0]);
        lay_place(L, h);
        return TP_OK;
    }
    if (strstr(t->name, "ffn_up_exps")) return TP_OK; /* fused with gate (t2) */
    const struct tp_synth_tensor *up = down ? NULL : t + 1;
    if (up && (up >= end || !strstr(up->name, "ffn_up_exps")))
        return tp_error_set(err, TP_ERR_INTERNAL, "synth: gpt-oss plan order: %s after %s",
                            up < end ? up->name : "the end", t->name);
    const char *base = down ? "down_proj" : "gate_up_proj";
    const int64_t X = bias ? t->ne[1] : t->ne[2];
    const int64_t R = bias ? 0 : (down ? t->ne[1] : 2 * t->ne[1]);
    for (int pt = 0; pt < (bias ? 1 : 2); pt++) {
        struct hf_tensor *h = &L->ht[L->n++];
        h->t = t;
        h->t2 = up;
        if (bias && down) { /* down_proj_bias (X, E): plain rows */
            snprintf(h->name, sizeof h->name, "model.layers.%d.mlp.experts.down_proj_bias", layer);
            h->wtype = t->type;
            h->bytes = float_bytes(h->wtype, (uint64_t)t->ne[0] * (uint64_t)t->ne[1]);
        } else if (bias) {
            snprintf(h->name, sizeof h->name, "model.layers.%d.mlp.experts.gate_up_proj_bias", layer);
            h->part = 6;
            h->x_rows = X;
            h->wtype = t->type;
            h->bytes = float_bytes(h->wtype, (uint64_t)X * 2 * (uint64_t)t->ne[0]);
        } else {
            snprintf(h->name, sizeof h->name, "model.layers.%d.mlp.experts.%s_%s", layer, base,
                     pt ? "scales" : "blocks");
            h->part = pt ? 5 : 4;
            h->x_rows = X * R;
            h->wtype = TP_WTYPE_MXFP4;
            h->bytes = (uint64_t)(X * R) * (uint64_t)(t->ne[0] / 32) * (pt ? 1 : 16);
            if (pt) L->mlx_groups = TP_MAX(L->mlx_groups, (size_t)(h->bytes / 2 + 1));
        }
        if (pt == 0) lay_break(L, h->bytes * 17 / 16); /* blocks and scales in one file */
        lay_place(L, h);
    }
    L->max_ne0 = TP_MAX(L->max_ne0, t->ne[0]);
    return TP_OK;
}

/* Stacked experts (ne[2] > 1): Hugging Face keeps one [rows, cols] tensor per expert. */
static enum tp_status lay_experts(struct hf_layout *L, const struct tp_synth_tensor *t, int mixtral,
                                  struct tp_error *err)
{
    const size_t len = strlen(t->name);
    for (int64_t e = 0; e < t->ne[2]; e++) {
        struct hf_tensor *h = &L->ht[L->n++];
        char gname[96];
        h->t = t;
        h->row_base = e * t->ne[1];
        /* "blk.N.ffn_gate_exps.weight" -> "blk.N.ffn_gate_exps.E.weight" */
        snprintf(gname, sizeof gname, "%.*s.%lld.weight", (int)(len - 7), t->name, (long long)e);
        if (!tp_tsrc_hf_name_variant(gname, mixtral, h->name, sizeof(h->name)))
            return tp_error_set(err, TP_ERR_INTERNAL, "synth: no Hugging Face name for %s", gname);
        h->wtype = t->type;
        h->bytes = float_bytes(h->wtype, (uint64_t)t->ne[0] * (uint64_t)t->ne[1]);
        lay_break(L, h->bytes);
        lay_place(L, h);
    }
    L->max_ne0 = TP_MAX(L->max_ne0, t->ne[0]);
    return TP_OK;
}

/* mlx-lm quantizes a mixture of experts' router in 8 bits, group 64, where its rows are whole groups. */
static int router_q8(const struct tp_shape *shape, enum tp_wtype wt)
{
    return tp_wtype_mlx_bits(wt) != 0 && shape->n_expert > 0 && shape->n_embd % 64 == 0;
}

/* MLX stacked experts (ne[2] > 1): mlx-lm's SwitchGLU, one triple per projection, [n_expert, rows, .]. */
static enum tp_status lay_mlx_experts(struct hf_layout *L, const struct tp_synth_tensor *t, int mixtral,
                                      enum tp_wtype wt, enum tp_wtype ft, struct tp_error *err)
{
    if (t->ne[0] % tp_wtype_mlx_group(wt))
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "synth: %s: rows of %lld values are not whole MLX groups of %d; pick another group size",
                            t->name, (long long)t->ne[0], tp_wtype_mlx_group(wt));
    const int64_t X = t->ne[2], rows = X * t->ne[1];
    const uint64_t wbytes = (uint64_t)rows * (uint64_t)t->ne[0] * (uint64_t)tp_wtype_mlx_bits(wt) / 8,
                   sbytes = (uint64_t)rows * (uint64_t)(t->ne[0] / tp_wtype_mlx_group(wt)) * 2;
    char base[160];
    if (!tp_tsrc_hf_name_variant(t->name, mixtral, base, sizeof base))
        return tp_error_set(err, TP_ERR_INTERNAL, "synth: no mlx-lm name for %s", t->name);
    lay_break(L, wbytes + 2 * sbytes); /* a triple stays in one file */
    for (int p = 0; p < 3; p++) {
        struct hf_tensor *h = &L->ht[L->n++];
        h->t = t;
        h->part = p + 1;
        h->mlx_type = wt;
        h->wtype = p == 0 ? wt : ft;
        h->n_stack = X;
        h->x_rows = rows;
        h->bytes = p == 0 ? wbytes : sbytes;
        snprintf(h->name, sizeof h->name, "%.*s.%s", (int)(strlen(base) - 7), base,
                 p == 0 ? "weight" : p == 1 ? "scales" : "biases");
        lay_place(L, h);
    }
    L->mlx_groups = TP_MAX(L->mlx_groups, (size_t)(sbytes / 2));
    L->max_ne0 = TP_MAX(L->max_ne0, t->ne[0]);
    return TP_OK;
}

/* Any other tensor under its Hugging Face name: float (wt or, MLX, ft), or an MLX triple (X.weight
 * packed, X.scales, X.biases) when its rows are whole groups of the MLX type wt. */
static enum tp_status lay_plain(struct hf_layout *L, const struct tp_synth_tensor *t, const struct tp_shape *shape,
                                enum tp_wtype wt, enum tp_wtype ft, struct tp_error *err)
{
    const int mlx = tp_wtype_mlx_bits(wt) != 0, gptoss = shape->arch == TP_ARCH_GPTOSS;
    struct hf_tensor *h = &L->ht[L->n];
    h->t = t;
    const int mixtral_name = shape->arch == TP_ARCH_LLAMA && shape->n_expert > 0;
    if (!(mixtral_name && tp_tsrc_hf_name_variant(t->name, 1, h->name, sizeof(h->name))) &&
        !(gptoss && tp_tsrc_hf_name_variant(t->name, 2, h->name, sizeof(h->name))) &&
        !tp_tsrc_hf_name(t->name, h->name, sizeof(h->name)))
        return tp_error_set(err, TP_ERR_INTERNAL, "synth: no Hugging Face name for %s", t->name);
    h->shape_1xn = strstr(t->name, "ffn_gate_inp_shexp") != NULL;
    const int64_t rows = t->n_dims == 2 ? t->ne[1] : 1;
    /* mlx quantizes every linear / embedding whose rows are whole groups; a router in 8 bits, group 64 */
    const int router = router_q8(shape, wt) && strstr(t->name, ".ffn_gate_inp.weight") != NULL;
    const enum tp_wtype qt = router ? TP_WTYPE_MLX_Q8_G64 : wt;
    const int quant = router || (mlx && t->type == wt && t->ne[0] % tp_wtype_mlx_group(wt) == 0);
    h->wtype = quant ? qt : mlx ? ft : t->type;
    h->mlx_type = quant ? qt : TP_WTYPE_COUNT;
    h->part = quant ? 1 : 0;
    h->bytes = quant ? (uint64_t)rows * (uint64_t)t->ne[0] * (uint64_t)tp_wtype_mlx_bits(qt) / 8
                     : float_bytes(h->wtype, (uint64_t)t->ne[0] * (uint64_t)rows);
    const uint64_t sb_bytes = quant ? (uint64_t)rows * (uint64_t)(t->ne[0] / tp_wtype_mlx_group(qt)) * 2 : 0;
    lay_break(L, h->bytes + 2 * sb_bytes); /* an MLX triple stays in one file */
    if (shape->arch == TP_ARCH_LLAMA && strstr(t->name, ".attn_q.weight")) h->permute_heads = shape->n_head;
    if (shape->arch == TP_ARCH_LLAMA && strstr(t->name, ".attn_k.weight")) h->permute_heads = shape->n_head_kv;
    L->max_ne0 = TP_MAX(L->max_ne0, t->ne[0]);
    const int n_parts = quant ? 3 : 1;
    for (int p = 0; p < n_parts; p++) {
        struct hf_tensor *hp = &L->ht[L->n + p];
        if (p > 0) { /* X.scales, X.biases beside X.weight */
            *hp = *h;
            hp->part = p + 1;
            hp->wtype = ft;
            hp->bytes = sb_bytes;
            char base[sizeof(hp->name)]; /* a copy: source and destination are both in ht[] (-Wrestrict) */
            memcpy(base, h->name, sizeof(base));
            size_t len = strlen(base);
            if (len > 7 && strcmp(base + len - 7, ".weight") == 0) len -= 7;
            snprintf(hp->name, sizeof(hp->name), "%.*s.%s", (int)len, base, p == 1 ? "scales" : "biases");
            L->mlx_groups = TP_MAX(L->mlx_groups, (size_t)(sb_bytes / 2));
        }
        lay_place(L, hp);
    }
    L->n += n_parts;
    return TP_OK;
}

/* The n_plan tensors of plan laid out into L (L->ht has room for them all). */
static enum tp_status lay_all(struct hf_layout *L, const struct tp_synth_tensor *plan, int n_plan,
                              const struct tp_shape *shape, enum tp_wtype wt, enum tp_wtype ft, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    for (int i = 0; i < n_plan && rc == TP_OK; i++) {
        const struct tp_synth_tensor *t = &plan[i];
        if (t->fill == TP_SYNTH_FILL_ROPE_FREQS) continue; /* HF: rope_scaling in config.json */
        if (shape->arch == TP_ARCH_GPTOSS && (strstr(t->name, "_exps.") || strstr(t->name, "attn_sinks")))
            rc = lay_gptoss(L, t, plan + n_plan, err);
        else if (t->ne[2] > 1 && tp_wtype_mlx_bits(wt))
            rc = lay_mlx_experts(L, t, shape->arch == TP_ARCH_LLAMA, wt, ft, err);
        else if (t->ne[2] > 1)
            rc = lay_experts(L, t, shape->arch == TP_ARCH_LLAMA, err);
        else
            rc = lay_plain(L, t, shape, wt, ft, err);
    }
    return rc;
}

/* tokenizer.json and tokenizer_config.json: copies of cfg->tokenizer_json and the config beside it, or
 * the SentencePiece-style vocabulary synth made up.  b: scratch. */
static enum tp_status write_tokenizer(const char *dir, const struct tp_synth_config *cfg,
                                      const struct tp_synth_vocab *vocab, const struct tp_shape *shape, struct sbuf *b,
                                      struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    if (cfg->tokenizer_json) {
        TP_CHECK_GOTO(copy_file(cfg->tokenizer_json, dir, "tokenizer.json", err), rc, out);
        /* tokenizer_config.json beside it, as the GGUF writer reads it */
        size_t pl = strlen(cfg->tokenizer_json) + 32;
        char *tc = malloc(pl);
        if (!tc) return tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory");
        snprintf(tc, pl, "%s", cfg->tokenizer_json);
        char *slash = strrchr(tc, '/');
        snprintf(slash ? slash + 1 : tc, pl - (size_t)(slash ? slash + 1 - tc : 0), "tokenizer_config.json");
        struct stat sb;
        if (stat(tc, &sb) == 0) rc = copy_file(tc, dir, "tokenizer_config.json", err);
        free(tc);
        return rc;
    }
    b->n = 0;
    spm_tokenizer_json(b, vocab);
    if (b->failed) return tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory for tokenizer.json");
    TP_CHECK_GOTO(write_text(dir, "tokenizer.json", b->p, b->n, err), rc, out);
    b->n = 0;
    sb_printf(b, "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"unk_token\": \"<unk>\", "
                 "\"add_bos_token\": true, \"add_eos_token\": false, \"model_max_length\": %d}\n",
              shape->n_ctx);
    rc = write_text(dir, "tokenizer_config.json", b->p, b->n, err);
out:
    return rc;
}

/* model.safetensors.index.json: which of the n_files files holds each tensor. */
static enum tp_status write_index(const char *dir, const struct hf_layout *L, int n_files, struct sbuf *b,
                                  struct tp_error *err)
{
    b->n = 0;
    sb_printf(b, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {", (unsigned long long)L->total);
    for (int i = 0; i < L->n; i++) {
        char fname[64];
        shard_name(fname, sizeof(fname), n_files, L->ht[i].file);
        sb_printf(b, "%s\n    ", i ? "," : "");
        sb_json_str(b, L->ht[i].name);
        sb_printf(b, ": \"%s\"", fname);
    }
    sb_printf(b, "\n  }\n}\n");
    if (b->failed) return tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory");
    return write_text(dir, "model.safetensors.index.json", b->p, b->n, err);
}

/* What --format hf / mlx can write: the weight type wt (after gpt-oss's bf16 rule), the mix, the shape;
 * and the output directory (made when missing). */
static enum tp_status hf_check(const struct tp_synth_config *cfg, enum tp_wtype wt, struct tp_error *err)
{
    const struct tp_shape *s0 = cfg->shape;
    const int gptoss = s0->arch == TP_ARCH_GPTOSS, mlx = tp_wtype_mlx_bits(wt) != 0;
    const int float_wt = wt == TP_WTYPE_F32 || wt == TP_WTYPE_F16 || wt == TP_WTYPE_BF16;
    if (gptoss && (cfg->mix != TP_SYNTH_MIX_MXFP4 || !float_wt))
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "synth: gpt-oss as a Hugging Face directory is OpenAI's layout: --type mxfp4 (experts "
                            "MXFP4, the rest bf16)");
    if ((cfg->mix != TP_SYNTH_MIX_NONE && !gptoss) || (!mlx && !float_wt))
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "synth: --format hf writes f32, f16 or bf16 weights and --format mlx MLX affine ones (got "
                            "%s); for other quantized weights use GGUF",
                            cfg->mix != TP_SYNTH_MIX_NONE ? tp_synth_mix_name(cfg->mix) : tp_wtype_name(wt));
    if (s0->arch == TP_ARCH_LLAMA && s0->qkv_bias)
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "synth: shape %s: a llama with q/k/v biases has no HF layout here",
                            s0->name);
    if (s0->n_expert > 0 && tp_wtype_mlx_bits(cfg->type) && s0->arch != TP_ARCH_QWEN3MOE && s0->arch != TP_ARCH_LLAMA)
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "synth: %s (%s) is a mixture of experts that --format mlx does not write (switch_mlp "
                            "layouts: Qwen3-MoE and Mixtral); write GGUF or --format hf",
                            s0->name, tp_arch_name(s0->arch));
    const char *dir = cfg->out_path;
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "synth: %s exists and is not a directory (--format hf writes a directory)", dir);
    if (stat(dir, &sb) != 0 && mkdir(dir, 0755) != 0)
        return tp_error_set(err, TP_ERR_IO, "synth: cannot create directory %s: %s", dir, strerror(errno));
    return TP_OK;
}

enum tp_status tp_synth_write_hf(const struct tp_synth_config *cfg, struct tp_error *err)
{
    if (!cfg || !cfg->shape || !cfg->out_path)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "synth: missing shape or output directory");
    const struct tp_shape *s0 = cfg->shape;
    const int gptoss = s0->arch == TP_ARCH_GPTOSS;
    const int float_type = cfg->type == TP_WTYPE_F32 || cfg->type == TP_WTYPE_F16 || cfg->type == TP_WTYPE_BF16;
    /* gpt-oss --type mxfp4: OpenAI's checkpoint keeps what is not an expert in bf16 */
    const enum tp_wtype wt = gptoss && cfg->mix == TP_SYNTH_MIX_MXFP4 && !float_type ? TP_WTYPE_BF16 : cfg->type;
    const char *dir = cfg->out_path;
    const int mlx = tp_wtype_mlx_bits(wt) != 0;
    /* float type of what is not quantized (MLX: norms, and rows that are not whole groups) */
    const enum tp_wtype ft = mlx ? (cfg->mlx_bf16 ? TP_WTYPE_BF16 : TP_WTYPE_F16) : wt;
    enum tp_status rc = hf_check(cfg, wt, err);
    if (rc != TP_OK) return rc;
    struct tp_synth_vocab vocab;
    memset(&vocab, 0, sizeof(vocab));
    struct tp_synth_tensor *plan = NULL;
    struct hf_layout L = {.cap = cfg->shard_bytes ? cfg->shard_bytes : HF_DEFAULT_SHARD_BYTES};
    tp_pool_t *pool = NULL;
    float *f32 = NULL;
    uint8_t *conv = NULL;
    uint16_t *mlx_s = NULL, *mlx_b = NULL; /* MLX: scales / biases of the tensor being written */
    struct sbuf b = {0};
    const int n_layer = cfg->n_layer > 0 ? cfg->n_layer : s0->n_layer;

    /* vocabulary: the same size the GGUF writer would use */
    if (cfg->tokenizer_json) TP_CHECK_GOTO(tp_synth_vocab_json(cfg->tokenizer_json, s0->n_vocab, &vocab, err), rc, out);
    else TP_CHECK_GOTO(tp_synth_vocab_spm(s0->n_vocab, &vocab, err), rc, out);
    struct tp_shape shape = *s0;
    shape.n_vocab = vocab.n_tokens;

    plan = calloc((size_t)n_layer * 24 + 8, sizeof(*plan));
    /* MLX: three tensors per matrix; experts: one per expert */
    L.ht = calloc(((size_t)n_layer * (16 + 3 * (size_t)shape.n_expert) + 8) * 3, sizeof(*L.ht));
    if (!plan || !L.ht) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory");
        goto out;
    }
    const int n_plan = tp_synth_plan(&shape, n_layer, wt, gptoss ? TP_SYNTH_MIX_MXFP4 : TP_SYNTH_MIX_NONE, plan);
    TP_CHECK_GOTO(lay_all(&L, plan, n_plan, &shape, wt, ft, err), rc, out);
    if (L.mlx_groups) {
        mlx_s = malloc(L.mlx_groups * 2);
        mlx_b = malloc(L.mlx_groups * 2);
        if (!mlx_s || !mlx_b) {
            rc = tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory for MLX scales");
            goto out;
        }
    }
    const int n_files = L.file + 1;

    /* config.json, tokenizer */
    config_json(&b, &shape, n_layer, vocab.n_tokens, ft, mlx ? wt : TP_WTYPE_COUNT, router_q8(&shape, wt), vocab.bos,
                vocab.eos);
    if (b.failed) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory");
        goto out;
    }
    TP_CHECK_GOTO(write_text(dir, "config.json", b.p, b.n, err), rc, out);
    TP_CHECK_GOTO(write_tokenizer(dir, cfg, &vocab, &shape, &b, err), rc, out);
    tp_synth_vocab_free(&vocab);

    /* weights */
    const size_t buf_elems = (size_t)TP_MAX((int64_t)(1 << 20), L.max_ne0);
    f32 = malloc(buf_elems * sizeof(float));
    conv = malloc(buf_elems * sizeof(float));
    struct tp_pool_config pc = tp_pool_default_config();
    pc.n_threads = cfg->n_threads > 0 ? cfg->n_threads : 1;
    if (!f32 || !conv || tp_pool_init(&pc, &pool) != TP_OK) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory");
        goto out;
    }
    uint64_t done = 0;
    for (int fi = 0; fi < n_files; fi++)
        TP_CHECK_GOTO(write_shard(dir, n_files, fi, L.ht, L.n, cfg, &shape, pool, f32, conv, buf_elems, mlx_s, mlx_b,
                                  &done, L.total, err),
                      rc, out);
    if (n_files > 1) rc = write_index(dir, &L, n_files, &b, err);
out:
    free(b.p);
    tp_pool_free(pool);
    free(f32);
    free(conv);
    free(mlx_s);
    free(mlx_b);
    free(L.ht);
    free(plan);
    tp_synth_vocab_free(&vocab);
    return rc;
}

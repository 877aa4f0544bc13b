/*
 * model/format/hf_config.c - a Hugging Face model directory's config.json read
 * into struct tp_hparams (LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM), and its chat template.
 *
 * HF Llama / Mistral checkpoints keep q_proj / k_proj rows in the
 * rotate-halves ("NeoX") RoPE layout (llama.cpp's converter permutes them to
 * make GGUF interleaved), so every HF model runs with rope_neox = 1.
 * Defaults are the transformers config classes' (rms_norm_eps 1e-6,
 * rope_theta 10000, max_position_embeddings 2048, no tied embeddings).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/json_field.h"
#include "model/tensor_source.h"

#define MODULE "model"
#define MAX_CONFIG_BYTES ((size_t)16 << 20)

int tp_hf_is_dir(const char *path)
{
    struct stat st;
    if (!path || stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    char p[4096];
    int n = snprintf(p, sizeof(p), "%s/config.json", path);
    return n > 0 && (size_t)n < sizeof(p) && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Integer field: absent -> def (or an error when required); must lie in [lo, hi]. */
static enum tp_status get_int(const cJSON *o, const char *path, const char *key, int required, int def, int lo, int hi,
                              int *out, struct tp_error *err)
{
    enum tp_status st = tp_json_field_int(o, key, lo, hi, out);
    if (st == TP_ERR_NOT_FOUND) {
        if (required) return tp_error_set(err, TP_ERR_FORMAT, "%s: \"%s\" is missing", path, key);
        *out = def;
        return TP_OK;
    }
    if (st != TP_OK)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: \"%s\" must be an integer in [%d, %d]", path, key, lo, hi);
    return TP_OK;
}

static enum tp_status get_float(const cJSON *o, const char *path, const char *key, float def, float *out,
                                struct tp_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return TP_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return tp_error_set(err, TP_ERR_FORMAT, "%s: \"%s\" must be a finite number", path, key);
    *out = (float)v->valuedouble;
    return TP_OK;
}

static int get_bool(const cJSON *o, const char *key, int def)
{
    int v = def;
    return tp_json_field_bool(o, key, &v) == TP_OK ? v : def;
}

static const char *get_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const struct {
    const char *arch, *model_type;
    enum tp_arch tp;
} k_archs[] = {
    {"LlamaForCausalLM", "llama", TP_ARCH_LLAMA},
    {"MistralForCausalLM", "mistral", TP_ARCH_LLAMA},
    {"Qwen2ForCausalLM", "qwen2", TP_ARCH_QWEN2},
    {"Qwen3ForCausalLM", "qwen3", TP_ARCH_QWEN3},
    {"Qwen3MoeForCausalLM", "qwen3_moe", TP_ARCH_QWEN3MOE},
    {"Qwen2MoeForCausalLM", "qwen2_moe", TP_ARCH_QWEN2MOE},
    {"MixtralForCausalLM", "mixtral", TP_ARCH_LLAMA},
    {"GptOssForCausalLM", "gpt_oss", TP_ARCH_GPTOSS},
};

static enum tp_status read_rope_scaling(const cJSON *root, const char *path, struct tp_hparams *hp,
                                        struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    hp->rope_scaling = TP_ROPE_SCALING_NONE;
    hp->rope_scale_factor = 1.0f;
    hp->rope_low_freq_factor = 1.0f;
    hp->rope_high_freq_factor = 4.0f;
    hp->rope_orig_ctx = 8192;
    hp->rope_yarn_beta_fast = 32.0f;
    hp->rope_yarn_beta_slow = 1.0f;
    hp->rope_attn_factor = 1.0f;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return TP_OK;
    if (!cJSON_IsObject(rs)) return tp_error_set(err, TP_ERR_FORMAT, "%s: \"rope_scaling\" must be an object or null", path);
    const char *type = get_str(rs, "rope_type");
    if (!type) type = get_str(rs, "type");
    if (!type || strcmp(type, "default") == 0) return TP_OK;
    if (strcmp(type, "linear") == 0) hp->rope_scaling = TP_ROPE_SCALING_LINEAR;
    else if (strcmp(type, "llama3") == 0) hp->rope_scaling = TP_ROPE_SCALING_LLAMA3;
    else if (strcmp(type, "yarn") == 0) hp->rope_scaling = TP_ROPE_SCALING_YARN;
    else
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "%s: rope_scaling type '%.32s' is not supported (supported: default, linear, llama3, yarn)",
                            path, type);
    TP_CHECK_GOTO(get_float(rs, path, "factor", 1.0f, &hp->rope_scale_factor, err), rc, out);
    TP_CHECK_GOTO(get_float(rs, path, "low_freq_factor", 1.0f, &hp->rope_low_freq_factor, err), rc, out);
    TP_CHECK_GOTO(get_float(rs, path, "high_freq_factor", 4.0f, &hp->rope_high_freq_factor, err), rc, out);
    TP_CHECK_GOTO(get_int(rs, path, "original_max_position_embeddings", 0, 8192, 1, 1 << 30, &hp->rope_orig_ctx, err),
                  rc, out);
    if (hp->rope_scaling == TP_ROPE_SCALING_YARN) {
        TP_CHECK_GOTO(get_float(rs, path, "beta_fast", 32.0f, &hp->rope_yarn_beta_fast, err), rc, out);
        TP_CHECK_GOTO(get_float(rs, path, "beta_slow", 1.0f, &hp->rope_yarn_beta_slow, err), rc, out);
        /* transformers rounds the ramp ends unless truncate is false (gpt-oss: false, as OpenAI's
         * reference); that rounding is not implemented */
        if (get_bool(rs, "truncate", 1))
            return tp_error_set(err, TP_ERR_UNSUPPORTED,
                                "%s: rope_scaling yarn with truncate = true (rounded ramp ends) is not supported; "
                                "only truncate = false (gpt-oss)",
                                path);
        if (cJSON_GetObjectItemCaseSensitive(rs, "attention_factor") || cJSON_GetObjectItemCaseSensitive(rs, "mscale"))
            return tp_error_set(err, TP_ERR_UNSUPPORTED,
                                "%s: rope_scaling yarn with attention_factor / mscale is not supported (the default "
                                "0.1 ln(factor) + 1 is)",
                                path);
        if (!(hp->rope_yarn_beta_fast > hp->rope_yarn_beta_slow && hp->rope_yarn_beta_slow > 0.0f))
            return tp_error_set(err, TP_ERR_FORMAT, "%s: rope_scaling beta_fast must exceed beta_slow > 0", path);
        if (hp->rope_scale_factor > 1.0f) hp->rope_attn_factor = 0.1f * logf(hp->rope_scale_factor) + 1.0f;
    }
    if (!(hp->rope_scale_factor > 0.0f) ||
        (hp->rope_scaling == TP_ROPE_SCALING_LLAMA3 && !(hp->rope_high_freq_factor > hp->rope_low_freq_factor)))
        return tp_error_set(err, TP_ERR_FORMAT, "%s: rope_scaling parameters are inconsistent", path);
out:
    return rc;
}

/* The architecture, and what tpserve refuses of it (experts of another architecture, another activation, MLP
 * or o_proj biases, another quantization); *moe: a mixture of experts, *quantized: a quant_method is named. */
static enum tp_status read_arch(const cJSON *root, const char *path, struct tp_hf_config *out, int *moe, int *quantized,
                                struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    struct tp_hparams *hp = &out->hp;
    const char *arch = NULL;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
        arch = cJSON_GetArrayItem(archs, 0)->valuestring;
    const char *mt = get_str(root, "model_type");
    snprintf(out->model_type, sizeof(out->model_type), "%s", mt ? mt : "");
    snprintf(out->architecture, sizeof(out->architecture), "%s", arch ? arch : out->model_type);
    int found = 0;
    for (size_t i = 0; i < TP_ARRAY_LEN(k_archs) && !found; i++)
        if ((arch && strcmp(arch, k_archs[i].arch) == 0) || (!arch && mt && strcmp(mt, k_archs[i].model_type) == 0)) {
            hp->arch = k_archs[i].tp;
            found = 1;
        }
    if (!found) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED,
                          "%s: architecture '%.64s' (model_type '%.32s') is not supported (supported: LlamaForCausalLM, "
                          "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, "
                          "MixtralForCausalLM, GptOssForCausalLM)",
                          path, arch ? arch : "(none)", mt ? mt : "(none)");
        goto out;
    }
    const int gptoss = hp->arch == TP_ARCH_GPTOSS;
    const int moe_arch = *moe = hp->arch == TP_ARCH_QWEN3MOE || hp->arch == TP_ARCH_QWEN2MOE || gptoss ||
                         (arch && strcmp(arch, "MixtralForCausalLM") == 0) || strcmp(out->model_type, "mixtral") == 0;
    static const char *const moe_keys[] = {"num_experts", "num_local_experts", "n_routed_experts"};
    for (size_t i = 0; i < TP_ARRAY_LEN(moe_keys) && !moe_arch; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, moe_keys[i]);
        if (cJSON_IsNumber(v) && v->valuedouble > 0) {
            rc = tp_error_set(err, TP_ERR_UNSUPPORTED,
                              "%s: mixture-of-experts models (%s = %g) of architecture %s are not supported "
                              "(supported: Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, MixtralForCausalLM)",
                              path, moe_keys[i], v->valuedouble, out->architecture);
            goto out;
        }
    }
    const char *act = get_str(root, "hidden_act");
    if (!act) act = get_str(root, "hidden_activation");
    if (act && strcmp(act, "silu") != 0) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: hidden_act '%.32s' is not supported (only silu)", path, act);
        goto out;
    }
    if (!gptoss && get_bool(root, "mlp_bias", 0)) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: mlp_bias = true (biases in the MLP) is not supported", path);
        goto out;
    }
    out->attention_bias = get_bool(root, "attention_bias", 0);
    if (out->attention_bias && hp->arch == TP_ARCH_LLAMA) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED,
                          "%s: attention_bias = true (a bias on o_proj too) is not supported for %s", path,
                          out->architecture);
        goto out;
    }
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    const char *qm = cJSON_IsObject(qc) ? get_str(qc, "quant_method") : NULL;
    *quantized = qm != NULL;
    if (qm && strcmp(qm, "mlx") != 0 && !(gptoss && strcmp(qm, "mxfp4") == 0)) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED,
                          "%s: quantization_config.quant_method '%.32s' is not supported (F32/F16/BF16 safetensors, "
                          "MLX quantized, or a GGUF file)",
                          path, qm);
        goto out;
    }
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    if (cJSON_IsObject(q)) {
        TP_CHECK_GOTO(get_int(q, path, "bits", 1, 0, 1, 16, &out->quant_bits, err), rc, out);
        TP_CHECK_GOTO(get_int(q, path, "group_size", 1, 0, 1, 1 << 16, &out->quant_group_size, err), rc, out);
    }
out:
    return rc;
}

/* Sizes, heads, head and rotary dimensions, rope theta and the norm epsilon. */
static enum tp_status read_shape(const cJSON *root, const char *path, struct tp_hparams *hp, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    const int big = 1 << 24;
    TP_CHECK_GOTO(get_int(root, path, "hidden_size", 1, 0, 1, big, &hp->n_embd, err), rc, out);
    TP_CHECK_GOTO(get_int(root, path, "num_hidden_layers", 1, 0, 1, 4096, &hp->n_layer, err), rc, out);
    TP_CHECK_GOTO(get_int(root, path, "num_attention_heads", 1, 0, 1, 65536, &hp->n_head, err), rc, out);
    TP_CHECK_GOTO(get_int(root, path, "num_key_value_heads", 0, hp->n_head, 1, 65536, &hp->n_head_kv, err), rc, out);
    TP_CHECK_GOTO(get_int(root, path, "intermediate_size", 1, 0, 1, big, &hp->n_ff, err), rc, out);
    TP_CHECK_GOTO(get_int(root, path, "vocab_size", 1, 0, 1, INT32_MAX, &hp->n_vocab, err), rc, out);
    TP_CHECK_GOTO(get_int(root, path, "max_position_embeddings", 0, 2048, 1, 1 << 30, &hp->n_ctx_train, err), rc, out);
    if (hp->n_head % hp->n_head_kv != 0) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                          path, hp->n_head, hp->n_head_kv);
        goto out;
    }
    TP_CHECK_GOTO(get_int(root, path, "head_dim", 0, hp->n_embd / hp->n_head, 1, 65536, &hp->head_dim, err), rc, out);
    if (hp->head_dim <= 0 || hp->head_dim % 2 != 0) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: head dimension %d (hidden_size %d / heads %d) must be even", path,
                          hp->head_dim, hp->n_embd, hp->n_head);
        goto out;
    }
    if ((int64_t)hp->n_head * hp->head_dim > big) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: %d heads x head_dim %d is absurd", path, hp->n_head, hp->head_dim);
        goto out;
    }
    float prf = 1.0f;
    TP_CHECK_GOTO(get_float(root, path, "partial_rotary_factor", 1.0f, &prf, err), rc, out);
    if (!(prf > 0.0f && prf <= 1.0f)) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: partial_rotary_factor %g must be in (0, 1]", path, (double)prf);
        goto out;
    }
    hp->rope_dim = (int)(hp->head_dim * prf);
    if (hp->rope_dim < 2 || hp->rope_dim % 2 != 0) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: rotary dimension %d (head_dim x partial_rotary_factor) must be even",
                          path, hp->rope_dim);
        goto out;
    }
    hp->rope_neox = 1;
    TP_CHECK_GOTO(get_float(root, path, "rope_theta", 10000.0f, &hp->rope_theta, err), rc, out);
    if (!(hp->rope_theta > 1.0f)) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: rope_theta %g must be > 1", path, (double)hp->rope_theta);
        goto out;
    }
    TP_CHECK_GOTO(get_float(root, path, "rms_norm_eps", 1e-6f, &hp->norm_eps, err), rc, out);
    if (!(hp->norm_eps >= 0.0f && hp->norm_eps < 1.0f)) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: rms_norm_eps %g is out of range", path, (double)hp->norm_eps);
        goto out;
    }
out:
    return rc;
}

/* gpt-oss: its experts (MXFP4 only), router, clamped SwiGLU and the windows of its even layers. */
static enum tp_status read_gptoss(const cJSON *root, const char *path, int quantized, struct tp_hparams *hp,
                                  struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    /* OpenAI's checkpoint: experts in MXFP4 (quantization_config.quant_method "mxfp4"); a
     * dequantized (bf16 gate_up_proj) directory has another expert layout, not read here */
    if (!quantized) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED,
                          "%s: gpt-oss without quantization_config mxfp4 (dequantized experts) is not supported; "
                          "use OpenAI's MXFP4 checkpoint or a GGUF file",
                          path);
        goto out;
    }
    TP_CHECK_GOTO(get_int(root, path, "num_local_experts", 1, 0, 1, 1 << 16, &hp->n_expert, err), rc, out);
    TP_CHECK_GOTO(get_int(root, path, "num_experts_per_tok", 1, 0, 1, hp->n_expert, &hp->n_expert_used, err), rc,
                  out);
    hp->router_softmax_topk = 1;
    hp->expert_weights_norm = 0;
    hp->swiglu_alpha = 1.702f;
    TP_CHECK_GOTO(get_float(root, path, "swiglu_limit", 7.0f, &hp->swiglu_limit, err), rc, out);
    if (!(hp->swiglu_limit > 0.0f)) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: swiglu_limit must be > 0", path);
        goto out;
    }
    /* windows: layer_types alternates "sliding_attention" / "full_attention" from layer 0 */
    int win = 0;
    TP_CHECK_GOTO(get_int(root, path, "sliding_window", 0, 0, 0, 1 << 30, &win, err), rc, out);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (cJSON_IsArray(lt)) {
        int l = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, lt)
        {
            const char *want = l % 2 == 0 ? "sliding_attention" : "full_attention";
            if (!cJSON_IsString(e) || strcmp(e->valuestring, want) != 0) {
                rc = tp_error_set(err, TP_ERR_UNSUPPORTED,
                                  "%s: layer_types[%d] is not \"%s\": only gpt-oss's alternation (sliding on the "
                                  "even layers) is supported",
                                  path, l, want);
                goto out;
            }
            l++;
        }
    }
    hp->sliding_window = win;
    hp->swa_period = 2;
out:
    return rc;
}

/* Qwen-MoE and Mixtral: experts, their width, the shared expert, renormalisation; every layer sparse. */
static enum tp_status read_moe(const cJSON *root, const char *path, struct tp_hparams *hp, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    const int big = 1 << 24;
    const int mixtral = hp->arch == TP_ARCH_LLAMA;
    TP_CHECK_GOTO(get_int(root, path, mixtral ? "num_local_experts" : "num_experts", 1, 0, 1, 1 << 16, &hp->n_expert,
                          err),
                  rc, out);
    TP_CHECK_GOTO(get_int(root, path, "num_experts_per_tok", 1, 0, 1, hp->n_expert, &hp->n_expert_used, err), rc,
                  out);
    if (!mixtral) /* Qwen-MoE experts are moe_intermediate_size wide (intermediate_size: dense layers) */
        TP_CHECK_GOTO(get_int(root, path, "moe_intermediate_size", 1, 0, 1, big, &hp->n_ff, err), rc, out);
    if (hp->arch == TP_ARCH_QWEN2MOE)
        TP_CHECK_GOTO(get_int(root, path, "shared_expert_intermediate_size", 1, 0, 1, big, &hp->n_ff_shexp, err), rc,
                      out);
    /* Mixtral always renormalises; Qwen-MoE as norm_topk_prob says (transformers' default: false) */
    hp->expert_weights_norm = mixtral ? 1 : get_bool(root, "norm_topk_prob", 0);
    int step = 1;
    TP_CHECK_GOTO(get_int(root, path, "decoder_sparse_step", 0, 1, 1, 4096, &step, err), rc, out);
    const cJSON *mlp_only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    if (step != 1 || (cJSON_IsArray(mlp_only) && cJSON_GetArraySize(mlp_only) > 0)) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED,
                          "%s: dense layers between the expert layers (decoder_sparse_step %d, mlp_only_layers) are "
                          "not supported",
                          path, step);
        goto out;
    }
out:
    return rc;
}

enum tp_status tp_hf_read_config(const char *dir, struct tp_hf_config *out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    char path[4096];
    char *text = NULL;
    cJSON *root = NULL;
    memset(out, 0, sizeof(*out));
    struct tp_hparams *hp = &out->hp;
    int n = snprintf(path, sizeof(path), "%s/config.json", dir);
    if (n < 0 || (size_t)n >= sizeof(path)) return tp_error_set(err, TP_ERR_INVALID_ARG, "%s: path too long", dir);
    TP_CHECK_GOTO(tp_read_file(path, MAX_CONFIG_BYTES, &text, NULL, err), rc, out);
    root = cJSON_Parse(text);
    if (!root || !cJSON_IsObject(root)) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: not a valid JSON object", path);
        goto out;
    }
    int moe = 0, quantized = 0;
    TP_CHECK_GOTO(read_arch(root, path, out, &moe, &quantized, err), rc, out);
    const int gptoss = hp->arch == TP_ARCH_GPTOSS;
    TP_CHECK_GOTO(read_shape(root, path, hp, err), rc, out);
    TP_CHECK_GOTO(read_rope_scaling(root, path, hp, err), rc, out);
    if (gptoss) TP_CHECK_GOTO(read_gptoss(root, path, quantized, hp, err), rc, out);
    else if (moe) TP_CHECK_GOTO(read_moe(root, path, hp, err), rc, out);
    hp->tied_embeddings = get_bool(root, "tie_word_embeddings", 0);
    hp->has_qkv_bias = hp->arch == TP_ARCH_QWEN2 || hp->arch == TP_ARCH_QWEN2MOE || out->attention_bias;
    hp->has_qk_norm = hp->arch == TP_ARCH_QWEN3 || hp->arch == TP_ARCH_QWEN3MOE;
    /* Mistral v0.1: every layer attends to the last sliding_window positions; a window at least as
     * long as the trained context is full attention.  Qwen2's use_sliding_window applies it to the
     * layers from max_window_layers on only, which is not implemented. */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (!gptoss) { /* gpt-oss: its windowed layers were read above */
        hp->sliding_window = 0;
        if (cJSON_IsNumber(sw) && sw->valuedouble >= 1 && sw->valuedouble < hp->n_ctx_train &&
            get_bool(root, "use_sliding_window", hp->arch == TP_ARCH_LLAMA)) {
            if (hp->arch == TP_ARCH_LLAMA)
                hp->sliding_window = (int)sw->valuedouble;
            else
                tp_log(TP_LOG_WARN, MODULE,
                       "%s: use_sliding_window with max_window_layers is not implemented (attention is full): output "
                       "differs from the reference past %g tokens",
                       path, sw->valuedouble);
        }
    }
out:
    cJSON_Delete(root);
    free(text);
    return rc;
}

enum tp_status tp_hf_chat_template(const char *dir, char **out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    char path[4096];
    char *text = NULL;
    cJSON *root = NULL;
    *out = NULL;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    rc = tp_read_file(path, MAX_CONFIG_BYTES, &text, NULL, err);
    if (rc == TP_ERR_NOT_FOUND) {
        tp_error_clear(err);
        rc = TP_OK;
    } else if (rc != TP_OK) {
        goto out;
    } else {
        root = cJSON_Parse(text);
        if (!root || !cJSON_IsObject(root)) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "%s: not a valid JSON object", path);
            goto out;
        }
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
        const char *t = NULL;
        if (cJSON_IsString(ct)) {
            t = ct->valuestring;
        } else if (cJSON_IsArray(ct)) {
            const cJSON *e;
            cJSON_ArrayForEach(e, ct)
            {
                const char *nm = get_str(e, "name");
                if (nm && strcmp(nm, "default") == 0) t = get_str(e, "template");
            }
        }
        if (t) {
            size_t len = strlen(t);
            *out = malloc(len + 1);
            if (!*out) {
                rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
                goto out;
            }
            memcpy(*out, t, len + 1);
            goto out;
        }
    }
    snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
    free(text);
    text = NULL;
    rc = tp_read_file(path, MAX_CONFIG_BYTES, &text, NULL, err);
    if (rc == TP_ERR_NOT_FOUND) {
        tp_error_clear(err);
        rc = TP_OK;
    } else if (rc == TP_OK) {
        *out = text;
        text = NULL;
    }
out:
    cJSON_Delete(root);
    free(text);
    return rc;
}

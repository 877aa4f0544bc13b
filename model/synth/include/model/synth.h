/*
 * model/synth/include/model/synth.h - private: model shapes as data (configs/shapes.json, built
 * into the library) and the random-weight model writer behind
 * `tpserve synth`.
 *
 * A synthetic model is a valid GGUF v3 file with llama.cpp's key and tensor
 * names (so llama.cpp and tpserve both load it), the real shape of a named
 * model, uniformly random weights with a standard deviation of 0.02 (norm
 * weights near 1, biases small) and either an embedded tokenizer.json
 * vocabulary or a generated SentencePiece-style vocabulary of the shape's
 * size.  Weights are generated row by row from (seed, tensor name, row), so
 * the file is identical for any thread count, and streamed to disk with a
 * few MB of memory.
 */
#ifndef TP_MODEL_SYNTH_H
#define TP_MODEL_SYNTH_H

#include <stdint.h>

#include "common/common.h"
#include "model/model.h"

/* One model shape (an entry of configs/shapes.json). */
struct tp_shape {
    char name[64];
    char source[160];
    enum tp_arch arch;
    int n_embd, n_layer, n_head, n_head_kv;
    int head_dim;              /* n_embd / n_head unless given */
    int n_ff, n_vocab, n_ctx;
    float rope_theta, norm_eps;
    enum tp_rope_scaling rope_scaling;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_orig_ctx;
    int tied, qkv_bias, qk_norm;
    /* mixture of experts (n_expert > 0): every layer's FFN is n_expert SwiGLU experts of
     * width n_ff_exp (0: n_ff, Mixtral) and a router; top-k = n_expert_used.  n_ff is then
     * the dense width the config names (GGUF feed_forward_length; unused by qwen3moe) */
    int n_expert, n_expert_used, n_ff_exp;
    int n_ff_shexp;            /* Qwen2-MoE: the shared expert's width (0: none) */
    int pooling_type;          /* embedding models: GGUF <arch>.pooling_type (llama.cpp's numbers: 1 mean, 2 cls,
                                * 3 last); 0: not an embedding model, nothing written */
    int sliding_window;        /* every layer's attention window (Mistral v0.1: 4096), gpt-oss: the even
                                * layers' (128); 0: full attention */
};
/* The width of the FFN a layer computes: the experts' for a mixture of experts, else n_ff. */
int tp_shape_ff_width(const struct tp_shape *s);

/* The shapes built in from configs/shapes.json (NUL-terminated JSON text). */
const char *tp_shapes_builtin_json(void);
/* Parse shapes JSON text ({"shapes": [...]}) into a malloc'd array (*out, *n;
 * free() it).  Every entry is validated (positive sizes, heads dividing
 * evenly, known arch); errors name the shape and the field. */
enum tp_status tp_shapes_parse(const char *json, struct tp_shape **out, int *n, struct tp_error *err);
/* Find a shape by name in json (NULL: the built-in list).  TP_ERR_NOT_FOUND
 * lists the known names in err. */
enum tp_status tp_shape_find(const char *json, const char *name, struct tp_shape *out, struct tp_error *err);

/* Weight-tensor parameter counts of a shape (for sizing without a file). */
uint64_t tp_shape_n_params(const struct tp_shape *s);

/*
 * Per-tensor type mixes of llama.cpp's K-quant "M" file types, exactly as
 * llama-quantize assigns them (llama_tensor_get_type, Llama-family and Qwen
 * models): the base type everywhere except
 *   output.weight (or token_embd.weight when the head is tied): Q6_K;
 *   attn_v.weight and ffn_down.weight of the "more bits" layers
 *     (use_more_bits: i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2): Q6_K;
 *   Q4_K_M on a Llama 70B (80 layers, GQA): attn_v of the other layers Q5_K;
 *   rows not a multiple of 256: Q6_K -> Q8_0, Q4_K -> Q5_0, Q5_K -> Q5_1
 *     (tpserve cannot compute Q5_0 / Q5_1: such shapes are refused);
 *   mixtures of experts: routers F32; ffn_down_exps (and _shexp) as ffn_down;
 *     exactly 8 experts: attn_v and attn_k Q8_0, attn_output Q5_K under Q4_K_M.
 */
enum tp_synth_mix {
    TP_SYNTH_MIX_NONE = 0, /* every matrix, embedding and head of cfg->type */
    TP_SYNTH_MIX_Q4_K_M,   /* base Q4_K, general.file_type 15 */
    TP_SYNTH_MIX_Q5_K_M,   /* base Q5_K, general.file_type 17 */
    TP_SYNTH_MIX_MXFP4,    /* gpt-oss as published (ggml-org GGUF): the stacked experts MXFP4, every other
                            * matrix, the embedding and the head Q8_0 (or cfg->type when that is f32 / f16 /
                            * bf16: OpenAI's checkpoint is bf16); general.file_type 38 (MOSTLY_MXFP4_MOE) */
    TP_SYNTH_MIX_COUNT
};

/* Parse a --type name: a weight type synth can write (f32, f16, bf16, q8_0,
 * q4_0, q4_k, q5_k, q6_k; *mix = NONE) or a mix (q4_k_m, q5_k_m, mxfp4; *type = its
 * base type, Q8_0 for mxfp4).  TP_ERR_INVALID_ARG for anything else. */
enum tp_status tp_synth_type_parse(const char *name, enum tp_wtype *type, enum tp_synth_mix *mix);
/* "q4_k_m", "q5_k_m", "mxfp4" (NULL for NONE / out of range). */
const char *tp_synth_mix_name(enum tp_synth_mix mix);

struct tp_synth_config {
    const struct tp_shape *shape;
    int n_layer;                 /* 0: the shape's */
    enum tp_wtype type;          /* matrices and embeddings: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K or Q6_K */
    enum tp_synth_mix mix;       /* NONE (default): `type` everywhere; else the mix (type is ignored) */
    const char *tokenizer_json;  /* NULL: a generated SPM vocabulary of n_vocab tokens */
    uint64_t seed;
    const char *out_path;
    int n_threads;               /* generation threads; 0: 1 */
    uint64_t shard_bytes;        /* tp_synth_write_hf: max tensor bytes per safetensors file; 0: 5 GB */
    int mlx_bf16;                /* tp_synth_write_hf with an MLX type: scales, biases, norms in bf16 (0: fp16) */
    /* Called after each chunk of tensor data: bytes written of the total. May be NULL. */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
};
struct tp_synth_config tp_synth_default_config(void);

/* Write the model.  On failure the partial file is removed and err explains. */
enum tp_status tp_synth_write(const struct tp_synth_config *cfg, struct tp_error *err);
/* The same model (same seed: the same values) as a Hugging Face directory at
 * cfg->out_path (created if absent): config.json, model.safetensors or
 * model-0000i-of-0000N.safetensors + model.safetensors.index.json, tokenizer.json
 * (+ tokenizer_config.json).  Types f32, f16, bf16 (mix NONE), or an MLX
 * affine type (TP_WTYPE_MLX_*): mlx-community's quantized layout, see
 * synth_hf.c. */
enum tp_status tp_synth_write_hf(const struct tp_synth_config *cfg, struct tp_error *err);

#endif /* TP_MODEL_SYNTH_H */

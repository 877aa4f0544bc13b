/*
 * model/include/model/model.h - the single-rank engine: model files, tokenizers, the
 * forward pass over a (possibly sharded) slice of the weights, sampling.
 *
 * This module knows nothing of sockets or HTTP.  Tensor parallelism plugs in
 * through struct tp_model_shard: which heads / FFN columns / vocab rows this
 * rank holds, and a reduction hook that parallel/ wires to comm/.  With the
 * default (whole) shard and no hook, the forward pass is the dense model.
 *
 * Sections: weight types - hyper-parameters - model files - tokenizer -
 *           forward pass - sampling.
 */
#ifndef TP_MODEL_H
#define TP_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================= weight types ===== */

/* Tensor element types; numbering equals GGUF's ggml_type ids, except the
 * MLX affine types (64..67), internal ids outside GGUF's numbering that only
 * safetensors loading produces (gguf.c refuses them in a GGUF file). */
enum tp_wtype {
    TP_WTYPE_F32 = 0,
    TP_WTYPE_F16 = 1,
    TP_WTYPE_Q4_0 = 2,
    TP_WTYPE_Q4_1 = 3,
    TP_WTYPE_Q5_0 = 6,
    TP_WTYPE_Q5_1 = 7,
    TP_WTYPE_Q8_0 = 8,
    TP_WTYPE_Q8_1 = 9,
    TP_WTYPE_Q2_K = 10,
    TP_WTYPE_Q3_K = 11,
    TP_WTYPE_Q4_K = 12,
    TP_WTYPE_Q5_K = 13,
    TP_WTYPE_Q6_K = 14,
    TP_WTYPE_Q8_K = 15,
    TP_WTYPE_I8 = 24,
    TP_WTYPE_I16 = 25,
    TP_WTYPE_I32 = 26,
    TP_WTYPE_I64 = 27,
    TP_WTYPE_F64 = 28,
    TP_WTYPE_BF16 = 30,
    TP_WTYPE_MXFP4 = 39, /* 32 E2M1 values + an E8M0 shared exponent (gpt-oss experts) */
    /* MLX affine quantization (mlx-community safetensors), BITS x GROUP: packed
     * uint32 words of unsigned q, plus per-group fp16/bf16 scale and bias held
     * beside the matrix (w = scale * q + bias); see model/kernels/kernels_mlx_impl.h.
     * Block = one group; block bytes = the packed words only. */
    TP_WTYPE_MLX_Q4_G32 = 64,
    TP_WTYPE_MLX_Q4_G64 = 65,
    TP_WTYPE_MLX_Q8_G32 = 66,
    TP_WTYPE_MLX_Q8_G64 = 67,
    TP_WTYPE_COUNT = 68 /* upper bound of ids we know by name */
};
#define TP_WTYPE_GGUF_END 40 /* ids below this are GGUF's ggml_type ids */

/* "f32", "q4_0", ...; "type#N" style static text for unknown ids. Never NULL. */
const char *tp_wtype_name(enum tp_wtype t);
/* Parse a name as printed by tp_wtype_name (case-insensitive). */
enum tp_status tp_wtype_parse(const char *s, enum tp_wtype *out);
/* Nonzero if this build can compute with weights of type t. */
int tp_wtype_supported(enum tp_wtype t);
/* Elements per block (1 for float types, 32 for Q8_0/Q4_0/MXFP4, 256 for K-quants); 0 if unknown. */
int64_t tp_wtype_block_elems(enum tp_wtype t);
/* Bytes per block; 0 if unknown. */
size_t tp_wtype_block_bytes(enum tp_wtype t);
/* MLX affine types: bits per value (4, 8) and group size (32, 64); 0 for other types. */
int tp_wtype_mlx_bits(enum tp_wtype t);
int tp_wtype_mlx_group(enum tp_wtype t);
/* The MLX type of (bits, group), or TP_WTYPE_COUNT when there is none. */
enum tp_wtype tp_wtype_mlx(int bits, int group);

/* ================================================== hyper-parameters ===== */

enum tp_arch {
    TP_ARCH_LLAMA = 0, /* Llama 1/2/3/3.x, Mistral, TinyLlama, SmolLM */
    TP_ARCH_QWEN2,     /* QKV bias */
    TP_ARCH_QWEN3,     /* q/k RMSNorm per head */
    TP_ARCH_QWEN3MOE,  /* Qwen3 attention + a mixture-of-experts FFN in every layer (GGUF "qwen3moe") */
    TP_ARCH_QWEN2MOE,  /* Qwen2 attention (QKV bias) + experts + a shared expert with a sigmoid gate (GGUF "qwen2moe") */
    TP_ARCH_GPTOSS,    /* gpt-oss (GGUF "gpt-oss", HF GptOssForCausalLM): attention with q/k/v/o biases, learned
                        * sinks and sliding windows on every other layer, YaRN RoPE; experts with biases, the
                        * clamped SwiGLU and a top-k-then-softmax router (hparams below) */
    TP_ARCH_COUNT
};
const char *tp_arch_name(enum tp_arch a);

enum tp_rope_scaling { TP_ROPE_SCALING_NONE = 0, TP_ROPE_SCALING_LINEAR, TP_ROPE_SCALING_LLAMA3, TP_ROPE_SCALING_YARN };

/* Everything the forward pass needs to know about the shape of a model. */
struct tp_hparams {
    enum tp_arch arch;
    int n_vocab;
    int n_embd;        /* hidden size */
    int n_layer;
    int n_head;        /* query heads */
    int n_head_kv;     /* key/value heads (GQA when < n_head) */
    int head_dim;      /* per head; usually n_embd / n_head */
    int n_ff;          /* FFN intermediate size */
    int n_ctx_train;   /* context length the model was trained for */
    int pooling_type;  /* embedding models: GGUF <arch>.pooling_type as llama.cpp numbers it (0 none, 1 mean,
                        * 2 cls, 3 last, 4 rank); -1 when the file does not say */
    int rope_dim;      /* rotated dims per head (<= head_dim) */
    int rope_neox;     /* 0: interleaved pairs (Llama GGUF), 1: halves (NeoX / Qwen) */
    float rope_theta;
    enum tp_rope_scaling rope_scaling;
    float rope_scale_factor;        /* linear / llama3 factor */
    float rope_low_freq_factor;     /* llama3 */
    float rope_high_freq_factor;    /* llama3 */
    int rope_orig_ctx;              /* llama3 / yarn original_max_position_embeddings */
    /*
     * YaRN (rope_scaling YARN), as OpenAI's gpt-oss reference and Hugging Face with truncate =
     * false: per frequency pair i < rope_dim/2, with f_i = theta^(-2i/rope_dim),
     * low/high = (rope_dim/2) ln(orig_ctx / (beta_fast|slow * 2 pi)) / ln(theta),
     * ramp_i = clamp((i - low) / (high - low), 0, 1), inv_freq_i = f_i / factor * ramp_i + f_i *
     * (1 - ramp_i); cos and sin are scaled by rope_attn_factor = 0.1 ln(factor) + 1.
     */
    float rope_yarn_beta_fast;      /* 32 */
    float rope_yarn_beta_slow;      /* 1 */
    float rope_attn_factor;         /* multiplies cos/sin; 1 without YaRN */
    float norm_eps;
    int tied_embeddings;            /* output head shares token_embd */
    int has_qkv_bias;               /* Qwen2 */
    int has_qk_norm;                /* Qwen3 */
    /*
     * Mixture of experts (n_expert > 0: Qwen3-MoE, Mixtral = llama with experts).
     * Every layer's FFN is then n_expert SwiGLU experts of width n_ff (the
     * expert width: GGUF <arch>.expert_feed_forward_length, else
     * feed_forward_length) and a router ffn_gate_inp (n_expert, n_embd).  Per
     * token: p = softmax(router logits) over all experts; the n_expert_used
     * largest p are selected (ties: the lower expert index first); their
     * weights are p, divided by the sum of the selected p when
     * expert_weights_norm (Mixtral, Qwen3-MoE: yes; GGUF
     * <arch>.expert_weights_norm overrides); the FFN output is the weighted
     * sum of the selected experts' outputs.
     */
    int n_expert;                   /* 0: dense FFN */
    int n_expert_used;              /* top-k, 1..n_expert */
    int expert_weights_norm;        /* renormalise the selected weights to sum 1 (Qwen2-MoE: no) */
    int n_ff_shexp;                 /* Qwen2-MoE: width of the shared expert, a SwiGLU FFN every token
                                     * runs, its output scaled by sigmoid(ffn_gate_inp_shexp . x) and
                                     * added to the experts'; 0: none */
    int sliding_window;             /* every layer attends to the last sliding_window positions only (itself
                                     * included; Mistral v0.1: 4096; GGUF <arch>.attention.sliding_window,
                                     * config.json sliding_window); 0: full attention */
    /* gpt-oss: router logits get a bias, the top n_expert_used are selected by logit and their
     * weights are the softmax over those k logits only (router_softmax_topk); experts have gate,
     * up and down biases and the clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit,
     * limit), h = g * sigmoid(alpha g) * (u + 1) (swiglu_limit > 0; alpha 1.702, limit 7). */
    int router_softmax_topk;
    float swiglu_alpha, swiglu_limit;   /* 0: plain SwiGLU */
    /* swa_period p > 0: only the layers l with l % p < p - 1 have the sliding window (gpt-oss:
     * p = 2, the even layers), the others attend to everything; 0: every layer (as above). */
    int swa_period;
};

/* ====================================================== model files ===== */

/*
 * Which slice of every sharded weight this rank holds (tensor parallelism).
 * All ranges are half-open [begin, end) and identical for every layer.
 *   Q heads: rows of attn_q (column-parallel) and columns of attn_output
 *            (row-parallel) for heads [q_head_begin, q_head_end).
 *   KV heads: rows of attn_k / attn_v for heads [kv_head_begin, kv_head_end);
 *            must cover the KV groups of the held Q heads (replicated on
 *            several ranks when needed).
 *   FFN: rows of ffn_gate / ffn_up and columns of ffn_down, [ff_begin, ff_end);
 *            boundaries on quantization block multiples.
 *   vocab: rows of the output head [vocab_begin, vocab_end).
 * all_sum: called after attn_output and after ffn_down with the partial
 * hidden states (n_rows x n_embd floats, in place); it must sum them over
 * ranks.  NULL when the shard is the whole model.
 */
typedef enum tp_status (*tp_model_all_sum_fn)(void *ctx, float *buf, size_t count);

struct tp_model_shard {
    int q_head_begin, q_head_end;
    int kv_head_begin, kv_head_end;
    int ff_begin, ff_end;
    int vocab_begin, vocab_end;
    tp_model_all_sum_fn all_sum;
    void *all_sum_ctx;
    /*
     * Nonzero: cfg.path is a tpserve shard file (`tpserve shard`, keys
     * tpserve.shard.*; parallel/ detects it and sets this).  Its metadata
     * (hparams) is the WHOLE model's, but every sharded tensor already holds
     * only this shard's slice, so the slice starts at offset 0 of the file
     * tensor and the file tensor's ne[] are the slice's:
     *   attn_q/k/v (+ bias), ffn_gate/up, output: ne = [n_embd, slice rows]
     *   attn_output: ne = [(q_head_end-q_head_begin)*head_dim, n_embd]
     *   ffn_down:    ne = [ff_end-ff_begin, n_embd]
     * Replicated tensors (norms, token_embd) are whole.
     */
    int file_is_slice;
    /* Mixture of experts: the experts [expert_begin, expert_end) held by this
     * rank (expert parallelism), each with rows [ff_begin, ff_end) of its
     * gate/up and those columns of its down (tensor parallelism inside every
     * expert); both at once is allowed.  The router is replicated.  A rank's
     * partial FFN output (its experts, its columns) goes through the same
     * all_sum as a dense FFN's.  [0, 0): every expert.  Ignored for dense models.
     * A shared expert (Qwen2-MoE) is split like a dense FFN: this rank holds
     * rows [shexp_begin, shexp_end) of its gate/up and those columns of its
     * down (and its gate vector whole), and adds its partial output, scaled
     * by the gate, to the same all_sum.  [0, 0): the rank whose expert_begin
     * and ff_begin are both 0 holds it whole, the others nothing. */
    int expert_begin, expert_end;
    int shexp_begin, shexp_end;
};

/*
 * KV cache element types.  Keys and values of one head at one position are a
 * row of head_dim elements: f32, fp16, or q8_0 (blocks of B int8 values after
 * their fp16 scale d = max |x| / 127, B = 32 where head_dim % 32 == 0 (34
 * bytes per 32 values), else 16 or 8; needs head_dim % 8 == 0), or bf16 in
 * tiles of TP_KV_TILE positions laid out as the bf16 attention products read
 * them (keys as pairs of dimensions across the tile's positions, values as
 * pairs of positions across the dimensions; needs head_dim % 16 == 0, and a
 * cache of whole tiles: tp_kv_cap_rows).  TP_KV_AUTO (a configuration value,
 * not an element type) is chosen at load by tp_kv_type_resolve.  Error
 * figures: docs/long-context.md.
 */
enum tp_kv_type { TP_KV_AUTO = -1, TP_KV_F32 = 0, TP_KV_F16, TP_KV_Q8_0, TP_KV_BF16, TP_KV_TYPE_COUNT };
/* Positions per tile of a TP_KV_BF16 cache. */
#define TP_KV_TILE 64
/* "f32", "f16", "q8_0", "bf16", "auto"; "?" for other values.  Never NULL. */
const char *tp_kv_type_name(enum tp_kv_type t);
/* Parse a name as printed by tp_kv_type_name (case-sensitive); TP_ERR_INVALID_ARG otherwise. */
enum tp_status tp_kv_type_parse(const char *s, enum tp_kv_type *out);
/* Bytes of one head's key (or value) row of head_dim elements; 0 when the type cannot hold
 * head_dim (q8_0 with head_dim % 8 != 0, bf16 with head_dim % 16 != 0) or t is unknown. */
size_t tp_kv_row_bytes(enum tp_kv_type t, int head_dim);
/* The element type a model loaded here gives its cache for t: t itself, or for TP_KV_AUTO bf16 where the
 * attention reads a bf16 cache in place (the avx512bf16 path: AVX512_BF16 without AMX, head_dim % 32 == 0;
 * that path rounds keys and values to bf16 whatever the cache holds), else f16.  Memory figures that
 * cannot know the machine count TP_KV_AUTO as bf16 (2 bytes per value, whole tiles: the larger). */
enum tp_kv_type tp_kv_type_resolve(enum tp_kv_type t, int head_dim);
/* Rows a cache of type t allocates to hold `positions` positions of one head: bf16 rounds up to
 * whole tiles (TP_KV_TILE, TP_KV_AUTO too), the others hold exactly that many. */
int64_t tp_kv_cap_rows(enum tp_kv_type t, int64_t positions);
/* The sliding window of layer l: hp->sliding_window on the windowed layers (every layer, or with
 * swa_period p those with l % p < p - 1: gpt-oss's even ones), 0 on full-attention layers and for l
 * out of range. */
int tp_kv_layer_window(const struct tp_hparams *hp, int l);
/* KV positions one sequence holds in layer l's cache for a context of n_ctx positions and batches
 * of n_batch tokens, as tp_model_init allocates it: a windowed layer keeps a ring of
 * min(n_ctx, window + n_batch) positions, the others n_ctx. */
int64_t tp_kv_layer_positions(const struct tp_hparams *hp, int l, int n_ctx, int n_batch);
/* Bytes of keys and values of ONE KV head for ONE sequence over every layer (the sum of
 * tp_kv_cap_rows(tp_kv_layer_positions) x 2 x tp_kv_row_bytes); 0 when the type cannot hold head_dim. */
uint64_t tp_kv_head_bytes(const struct tp_hparams *hp, int n_ctx, int n_batch, enum tp_kv_type t);

struct tp_model_config {
    const char *path;        /* GGUF file (full model or a tpserve shard file) */
    int n_threads;           /* compute threads; 0: all cores */
    int n_ctx;               /* KV cache positions per sequence; 0: min(train ctx, 4096) */
    int n_seq;               /* sequence slots in the KV cache (continuous batching) */
    int n_batch;             /* max tokens per forward call (prefill chunk) */
    const struct tp_model_shard *shard; /* NULL: the whole model */
    int vocab_only;          /* load metadata + tokenizer, no weights */
    int kv_f16;              /* KV cache in fp16 (half the memory, ~1e-3 relative error); 0: kv_type decides */
    enum tp_kv_type kv_type; /* KV cache element type when kv_f16 is 0 (default TP_KV_F32; TP_KV_AUTO: resolved) */
    int keep_layout;         /* 1: keep quantized matrices row-major as in the file; 0 (default): re-lay them
                              * 16 rows at a time where this CPU's kernels are faster on that (x16) */
    /* Progress while reading weights: bytes done of bytes needed. May be NULL. */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
};
struct tp_model_config tp_model_default_config(void);

typedef struct tp_model tp_model_t;
typedef struct tp_tokenizer tp_tokenizer_t;

/* Open the model file, validate it, read this rank's slice of the weights
 * and allocate the KV cache.  On failure *out = NULL and err names the file,
 * the field and the reason. */
enum tp_status tp_model_init(const struct tp_model_config *cfg, tp_model_t **out, struct tp_error *err);
void tp_model_free(tp_model_t *m); /* NULL safe */
/* Replace the slice this model holds with `shard`'s (NULL: the whole model) of the
 * same file and settings (threads, n_ctx, n_seq, n_batch, KV type, layout; no
 * progress callback).  The old weights, KV cache and scratch are freed first, so the
 * peak is one slice.  The tokenizer, name, chat template and hparams stay where they
 * are (pointers to them stay valid).  On failure the model holds no weights: only
 * tp_model_free may follow.  Not thread safe (the engine thread, between steps). */
enum tp_status tp_model_reload(tp_model_t *m, const struct tp_model_shard *shard, struct tp_error *err);
const char *tp_model_last_error(const tp_model_t *m);

const struct tp_hparams *tp_model_hparams(const tp_model_t *m);
/* Owned by the model; valid until tp_model_free. */
tp_tokenizer_t *tp_model_tokenizer(const tp_model_t *m);
/* Display name (general.name or file stem). */
const char *tp_model_name(const tp_model_t *m);
/* Chat template text from metadata, or NULL. */
const char *tp_model_chat_template(const tp_model_t *m);
/* Bytes of weights held by this rank (after sharding). */
uint64_t tp_model_weight_bytes(const tp_model_t *m);
/* Dominant weight type (of the attention / FFN matrices). */
enum tp_wtype tp_model_weight_type(const tp_model_t *m);
int tp_model_n_ctx(const tp_model_t *m);
/* Bytes of this rank's KV cache (keys and values, all layers and sequences; a
 * sliding-window layer holds min(n_ctx, window + n_batch) positions). */
uint64_t tp_model_kv_bytes(const tp_model_t *m);
/* The KV cache element type in use. */
enum tp_kv_type tp_model_kv_type(const tp_model_t *m);
/* Bytes of keys and values of ONE KV head, over all layers, that attention
 * reads for a query at position pos (a sliding-window layer reads at most its
 * window); times the held KV heads is what a decode step at depth pos reads. */
uint64_t tp_model_kv_head_bytes_read(const tp_model_t *m, int pos);
int tp_model_n_seq(const tp_model_t *m);
int tp_model_n_threads(const tp_model_t *m);

/* ========================================================= tokenizer ===== */

enum tp_tok_kind { TP_TOK_SPM = 0, TP_TOK_BPE, TP_TOK_KIND_COUNT };

/* Load a Hugging Face tokenizer.json (+ optional tokenizer_config.json, may
 * be NULL) on its own, e.g. for tests and `synth --tokenizer`. */
enum tp_status tp_tokenizer_from_json(const char *tokenizer_json, const char *tokenizer_config_json,
                                      tp_tokenizer_t **out, struct tp_error *err);
/* Load the tokenizer from a GGUF file's metadata (vocab-only files too). */
enum tp_status tp_tokenizer_from_gguf(const char *path, tp_tokenizer_t **out, struct tp_error *err);
void tp_tokenizer_free(tp_tokenizer_t *t); /* NULL safe */

int tp_tokenizer_n_vocab(const tp_tokenizer_t *t);
enum tp_tok_kind tp_tokenizer_kind(const tp_tokenizer_t *t);
int tp_tokenizer_bos(const tp_tokenizer_t *t);     /* -1 if none */
int tp_tokenizer_eos(const tp_tokenizer_t *t);     /* -1 if none */
int tp_tokenizer_add_bos(const tp_tokenizer_t *t); /* model wants BOS prepended */
int tp_tokenizer_add_eos(const tp_tokenizer_t *t); /* model wants EOS appended (embedding models, e.g. Qwen3-Embedding) */
/* Fill-in-the-middle tokens: prefix, suffix, middle, file separator, repository name. */
enum tp_fim { TP_FIM_PRE = 0, TP_FIM_SUF, TP_FIM_MID, TP_FIM_SEP, TP_FIM_REP, TP_FIM_COUNT };
/* ids[TP_FIM_COUNT]: each FIM token's id, -1 when the model has none: from GGUF
 * tokenizer.ggml.fim_*_token_id, else the special token with a code model's
 * name for it (<|fim_prefix|>, <fim_prefix>, <PRE>, ...).  Returns 1 when
 * prefix, suffix and middle all exist (the model can fill in the middle). */
int tp_tokenizer_fim(const tp_tokenizer_t *t, int ids[TP_FIM_COUNT]);
/* Nonzero if id ends generation (eos, eot, im_end ...). */
int tp_tokenizer_is_eog(const tp_tokenizer_t *t, int id);
/* Id of a special / added token by its text ("<|eot_id|>"), or -1. */
int tp_tokenizer_find_special(const tp_tokenizer_t *t, const char *text);

/*
 * Encode len bytes of UTF-8 text.  add_bos: prepend BOS when the model uses
 * one; parse_special: recognise special-token texts in the input (chat
 * templates) instead of tokenizing them as plain text.  Writes at most
 * max_ids ids; returns the number of ids the full encoding needs (call again
 * with a bigger buffer when it exceeds max_ids), or -1 on invalid input
 * (not UTF-8).  Thread safe: a tokenizer is read-only after loading, so any
 * number of threads may encode with it at once.
 */
int tp_tokenizer_encode(const tp_tokenizer_t *t, const char *text, size_t len, int add_bos, int parse_special,
                        int32_t *ids, int max_ids);
/* Raw bytes of one token (byte tokens decoded, U+2581 -> space); *len set.
 * Special tokens give their text.  Pointer valid for the tokenizer's life. */
const char *tp_tokenizer_piece(const tp_tokenizer_t *t, int id, size_t *len);

/*
 * Streaming detokenizer: feeds ids, emits only complete UTF-8 characters
 * (partial sequences are held back until the next token completes them).
 * Handles SentencePiece's leading-space rule for the first token: the first
 * text-producing token after init/reset loses one leading space.  To stream
 * a continuation of a prompt (generation), push the prompt's last token
 * first and discard what it returns (then flush and discard), else the
 * first generated " word" loses its space ("Once upon a" + "time").
 */
typedef struct tp_detok tp_detok_t;
enum tp_status tp_detok_init(const tp_tokenizer_t *t, tp_detok_t **out);
void tp_detok_free(tp_detok_t *d);
void tp_detok_reset(tp_detok_t *d);
/* Append the text of id; returns bytes written to out (<= cap, complete chars only).
 * Control tokens (BOS, EOS, <|eot_id|> ...) add no text.  Text that does not
 * fit in cap stays pending for the next push / flush; cap >= 4 guarantees
 * progress (64 or more is sensible).  Not thread safe per handle. */
size_t tp_detok_push(tp_detok_t *d, int id, char *out, size_t cap);
/* Flush held-back bytes (invalid sequences become U+FFFD); call until it
 * returns 0 when cap may be smaller than what is pending. */
size_t tp_detok_flush(tp_detok_t *d, char *out, size_t cap);

/* ====================================================== forward pass ===== */

/*
 * A batch of tokens from one or more sequences (continuous batching).
 * Arrays have n_tokens entries.  Tokens of one sequence must appear in
 * position order; positions continue that sequence's KV cache.
 *   token[i]  input token id
 *   pos[i]    position within its sequence
 *   seq[i]    sequence slot in [0, n_seq)
 *   logits[i] nonzero: produce logits for this token (usually the last of each
 *             sequence in the batch); logits == NULL: the last token only
 * pos[i] may not skip ahead of what the slot holds (pos <= its length);
 * writing an earlier position overwrites the cache from there.
 */
struct tp_batch {
    int n_tokens;
    const int32_t *token;
    const int32_t *pos;
    const int32_t *seq;
    const int8_t *logits;
};

/*
 * Run the forward pass.  out receives one row of vocab_local floats per token
 * with logits[i] != 0, in batch order (vocab_local = shard vocab_end -
 * vocab_begin, n_vocab when unsharded).  n_tokens <= n_batch.  Allocates
 * nothing.  Errors: TP_ERR_INVALID_ARG (bad ids, positions past n_ctx, seq
 * out of range), or whatever the all_sum hook returned.
 */
enum tp_status tp_model_forward(tp_model_t *m, const struct tp_batch *batch, float *out);
/*
 * The final hidden state of token t (its index in the last forward's batch,
 * any token, not only those that asked for logits) after the output norm:
 * out[0..n_embd) = rmsnorm(x_t) * output_norm.weight, the vector the output
 * head multiplies (embeddings pool it).  The residual stream is whole on
 * every rank after its all_sums, so any rank of a sharded model gives it.
 * Valid until the next forward.  TP_ERR_INVALID_ARG when t is not a token of
 * the last batch (or that forward failed).
 */
enum tp_status tp_model_hidden(const tp_model_t *m, int t, float *out);
/* Forget positions >= from_pos of sequence seq (from_pos 0: clear it). */
void tp_model_seq_truncate(tp_model_t *m, int seq, int from_pos);
/*
 * Prefix sharing between sequence slots: copy positions [0, n_pos) of every
 * layer's K and V of src_seq into dst_seq (this rank's KV heads only; under
 * tensor parallelism every rank copies its own slice), after which dst_seq
 * holds exactly n_pos positions (whatever it held before is forgotten) and
 * continues at position n_pos.  Bit-exact (f32 or f16 cache alike).
 * TP_ERR_INVALID_ARG with the reason in tp_model_last_error: a seq id out of
 * [0, n_seq), dst_seq == src_seq, n_pos < 0 or > n_ctx, or n_pos beyond
 * what src_seq holds.  n_pos 0 just clears dst_seq.  Allocates nothing.
 */
enum tp_status tp_model_kv_copy(tp_model_t *m, int dst_seq, int src_seq, int n_pos);
/*
 * Sliding-window layers keep a ring of min(n_ctx, window + n_batch) positions
 * per sequence, so a sequence can only continue (or be copied) at a position
 * whose window the ring still holds.  Returns n_pos when sequence seq, holding
 * at least n_pos positions, can continue at position n_pos (after a
 * truncation to n_pos) or be the source of tp_model_kv_copy of n_pos
 * positions, else 0 (start it over); always n_pos without windowed layers,
 * 0 for a bad seq or n_pos <= 0.  The scheduler bounds prompt-cache reuse and
 * prefix copies with it.
 */
int tp_model_seq_reusable(const tp_model_t *m, int seq, int n_pos);

/* Per-call timing (for compute vs communication accounting). */
struct tp_model_stats {
    uint64_t n_forward;
    uint64_t n_tokens;
    uint64_t ns_forward;   /* wall time in tp_model_forward, hooks included */
    uint64_t ns_all_sum;   /* of which inside the all_sum hook */
    /* Of ns_forward, the parallel jobs by kind, each from waking the threads to the last one done: */
    uint64_t ns_prep;      /* the norms and the activations' quantization before each matmul */
    uint64_t ns_matmul;    /* the layers' weight matmuls with what they fuse (QKV's bias, RoPE and cache store;
                            * SwiGLU; at one rank the O / down rows' residual add), the router and the experts */
    uint64_t ns_attn;      /* attention over the KV cache, with the merge of split work items */
    uint64_t ns_logits;    /* the output projection */
    uint64_t expert_bytes; /* mixture of experts: expert weight bytes streamed (each held expert that some
                            * token of a call selected, once per call) */
    uint64_t n_decode;     /* calls with a single token */
    uint64_t expert_bytes_decode; /* of expert_bytes, in those calls */
    uint64_t expert_runs;  /* mixture of experts: (layer, held expert) pairs run, each once per call for all
                            * of its tokens; per call and layer, the distinct held experts the batch selected */
};
void tp_model_get_stats(const tp_model_t *m, struct tp_model_stats *out);
/* Mixture of experts: bytes of the experts' matrices this rank holds (part of
 * tp_model_weight_bytes); 0 for a dense model.  Decoding reads the rest of the
 * weights every token but only the selected experts (stats.expert_bytes). */
uint64_t tp_model_expert_weight_bytes(const tp_model_t *m);

/* ========================================================== sampling ===== */

struct tp_sampler_params {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off (applied to tokens in the history) */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    int penalty_last_n;       /* history window for penalties; -1: all */
    uint64_t seed;            /* same seed, same choices */
    int n_logprobs;           /* top alternatives to report (0..20) */
    int no_logprob;           /* 1: skip the chosen token's log-softmax (res.logprob = 0): a pass with
                               * exp over the vocabulary per token that a caller not reporting it can save */
    int n_logit_bias;         /* entries of bias_id / bias_val (0: none); copied by tp_sampler_init */
    const int32_t *bias_id;   /* (n_logit_bias) token ids in [0, n_vocab) */
    const float *bias_val;    /* (n_logit_bias) added to the logit; <= TP_LOGIT_BAN bans the token */
};
struct tp_sampler_params tp_sampler_default_params(void);

/*
 * OpenAI logit_bias: add bias_val[i] to the logit of token bias_id[i]; a
 * value <= TP_LOGIT_BAN (-100) sets it to -inf (the token is never chosen).
 * row holds the logits of tokens [vocab_begin, vocab_begin + n) (a rank's
 * slice of the vocabulary, or all of it with vocab_begin 0); entries for
 * other tokens are skipped, so every rank can apply the same list to its
 * slice.  The sampler applies it first, before penalties and temperature,
 * and reports logprobs of the biased logits.
 */
#define TP_LOGIT_BAN (-100.0f)
void tp_logit_bias_apply(float *row, int vocab_begin, int n, int n_bias, const int32_t *bias_id,
                         const float *bias_val);

struct tp_logprob {
    int32_t id;
    float logprob;
};
struct tp_sample_result {
    int32_t id;
    float logprob;                 /* log-softmax of the chosen token (after logit_bias, before penalties, T=1) */
    int n_top;
    struct tp_logprob top[20];
};

typedef struct tp_sampler tp_sampler_t;
/* n_vocab fixes the scratch size (allocated once here). */
enum tp_status tp_sampler_init(const struct tp_sampler_params *p, int n_vocab, tp_sampler_t **out);
void tp_sampler_free(tp_sampler_t *s);
/* Reset history and reseed. */
void tp_sampler_reset(tp_sampler_t *s, uint64_t seed);
/* Add an accepted token to the penalty history (prompt tokens too). */
void tp_sampler_accept(tp_sampler_t *s, int32_t id);
/* Choose a token from logits[n_vocab] (not modified).  TP_ERR_INVALID_ARG when no token
 * can be chosen (every logit -inf or NaN). */
enum tp_status tp_sampler_sample(tp_sampler_t *s, const float *logits, struct tp_sample_result *res);
/*
 * Speculative decoding: choose the token at a position whose drafted token
 * is `draft` (a deterministic proposal: n-gram lookup, a greedy draft
 * model).  Accepts the draft with probability p(draft) under the same
 * pipeline as tp_sampler_sample (greedy: when the argmax is the draft), else
 * draws from p without the draft, so res->id is distributed exactly as
 * tp_sampler_sample's; *accepted = (res->id == draft).  The draft does not
 * enter the history: tp_sampler_accept the chosen token as usual.  Errors
 * as tp_sampler_sample.
 */
enum tp_status tp_sampler_sample_draft(tp_sampler_t *s, const float *logits, int32_t draft,
                                       struct tp_sample_result *res, int *accepted);

#ifdef __cplusplus
}
#endif
#endif /* TP_MODEL_H */

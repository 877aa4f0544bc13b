/*
 * model/include/model/tensor_source.h - where the loader's weights come from.
 *
 * A "tensor source" answers one question for model_load.c: "tensor NAME (a
 * GGUF canonical name such as blk.3.attn_q.weight): what type and dims does
 * it have, and where are its bytes (fd + absolute file offset for pread, and
 * the mapped pointer)?".  Two kinds:
 *   GGUF file:        names as in the file;
 *   Hugging Face dir: config.json + model.safetensors[.index.json]; names
 *                     translated (blk.N.attn_q.weight <-
 *                     model.layers.N.self_attn.q_proj.weight, output.weight
 *                     <- lm_head.weight, ...) and row-major shapes reversed
 *                     into ggml order (ne[0] = the contiguous row length).
 * The HF half also reads config.json into struct tp_hparams.
 *
 * Ownership: a tp_tsrc_tensor only borrows from the source; its pointers are
 * valid until the source (the model's gguf / st handle) is closed.
 */
#ifndef TP_MODEL_TENSOR_SOURCE_H
#define TP_MODEL_TENSOR_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/model.h"
#include "model/safetensors.h"

/* One tensor as the loader sees it. */
struct tp_tsrc_tensor {
    const char *name;        /* the name in the source (the HF name for a directory): for messages */
    const char *file;        /* path of the file that holds it: for messages */
    enum tp_wtype type;      /* TP_WTYPE_COUNT when the source's dtype has no tp_wtype (e.g. U32) */
    const char *type_name;   /* the source's own type name ("q4_0", "BF16", "U32"): for messages */
    int n_dims;
    int64_t ne[4];           /* ggml order: ne[0] contiguous; unused dims 1 (dims past 4 folded into ne[3]) */
    int64_t n_elems;
    uint64_t n_bytes;
    int fd;                  /* for pread; -1 when only the mapping exists */
    uint64_t file_offset;    /* absolute offset of the first byte in that file */
    const void *data;        /* into the mapping; NULL when n_bytes == 0; NOT necessarily aligned */
    const struct tp_st_tensor *st; /* HF: the safetensors record (MLX scales/biases lookups); NULL for GGUF */
    int mlx_packed;          /* MLX packed words (HF U32, or a GGUF shard's I32 + ".scales"): tp_mlx_load_mat */
};

enum tp_tsrc_kind { TP_TSRC_GGUF = 0, TP_TSRC_HF };

/* Borrowed handles; exactly one is non-NULL. */
struct tp_tsrc {
    enum tp_tsrc_kind kind;
    tp_gguf_t *gguf;
    tp_st_t *st;
    int mlx_bits; /* MLX default bits (config.json, or a shard's tpserve.mlx.bits), 0 when unknown (model/mlx_quant.h) */
};

/* Look up a GGUF canonical name.  Returns 1 and fills *out when present, 0 when absent. */
int tp_tsrc_find(const struct tp_tsrc *s, const char *name, struct tp_tsrc_tensor *out);

/* The Hugging Face name of a GGUF canonical name ("blk.3.ffn_up.weight" ->
 * "model.layers.3.mlp.up_proj.weight") into out; 0 when there is no mapping
 * or it does not fit in cap. */
int tp_tsrc_hf_name(const char *gguf_name, char *out, size_t cap);
/*
 * The same for one of the Hugging Face layouts a name has (tp_tsrc_find tries
 * them in order): variant 0 is the Llama / Qwen layout (tp_tsrc_hf_name's),
 * variant 1 Mixtral's block_sparse_moe layout for the mixture-of-experts names, variant 2
 * gpt-oss's router (mlp.router.weight / .bias).
 * Mixture-of-experts names: the router "blk.N.ffn_gate_inp.weight" (mlp.gate /
 * block_sparse_moe.gate), one expert "blk.N.ffn_{gate,up,down}_exps.E.weight"
 * (mlp.experts.E.{gate,up,down}_proj / block_sparse_moe.experts.E.{w1,w3,w2}; GGUF
 * stacks them in one tensor, Hugging Face keeps one per expert), and Qwen2-MoE's
 * shared expert "blk.N.ffn_{gate,up,down}_shexp.weight" (mlp.shared_expert.*_proj)
 * with its gate "blk.N.ffn_gate_inp_shexp.weight" (mlp.shared_expert_gate).
 * The stacked "blk.N.ffn_{gate,up,down}_exps.weight" is mlx-lm's SwitchGLU
 * (mlp.switch_mlp.{gate,up,down}_proj / block_sparse_moe.switch_mlp.*): one
 * [n_expert, rows, cols] tensor like GGUF's, MLX-quantized or not.
 * 0 when the name has no such variant.
 */
int tp_tsrc_hf_name_variant(const char *gguf_name, int variant, char *out, size_t cap);

/* ------------------------------------------------------ HF config.json */

/* Nonzero when path is a directory holding a config.json. */
int tp_hf_is_dir(const char *path);

struct tp_hf_config {
    struct tp_hparams hp;     /* n_vocab = vocab_size; tied_embeddings = tie_word_embeddings; rope_neox = 1 */
    char architecture[64];    /* architectures[0] (or model_type when absent) */
    char model_type[32];
    int attention_bias;       /* config says q/k/v projections have biases (Qwen2 has them implicitly) */
    int quant_bits;           /* MLX "quantization": {"bits", "group_size"}; 0 when absent */
    int quant_group_size;
};

/* Read and validate DIR/config.json.  Unsupported architectures, MoE, other
 * activations, rope scaling kinds other than linear / llama3, and foreign
 * quantization (GPTQ, AWQ, bitsandbytes, ...) are refused by name. */
enum tp_status tp_hf_read_config(const char *dir, struct tp_hf_config *out, struct tp_error *err);

/* The chat template of an HF directory: tokenizer_config.json "chat_template"
 * (a string, or the "default" entry of a list of {name, template}), else
 * chat_template.jinja.  *out = NULL (TP_OK) when there is none; malloc'd. */
enum tp_status tp_hf_chat_template(const char *dir, char **out, struct tp_error *err);

/* ------------------------------------------- recommended generation settings */

enum tp_model_gen_field {
    TP_MODEL_GEN_TEMPERATURE = 1u << 0,
    TP_MODEL_GEN_TOP_P = 1u << 1,
    TP_MODEL_GEN_TOP_K = 1u << 2,
    TP_MODEL_GEN_MIN_P = 1u << 3,
    TP_MODEL_GEN_REPEAT_PENALTY = 1u << 4,
    TP_MODEL_GEN_MAX_NEW_TOKENS = 1u << 5
};
#define TP_MODEL_GEN_MAX_EOS 8
struct tp_model_gen_defaults {
    unsigned set;                          /* TP_MODEL_GEN_* bits of the fields the file gives */
    float temperature, top_p, min_p, repeat_penalty;
    int top_k;                             /* 0: off */
    int max_new_tokens;
    int n_eos;                             /* generation_config.json eos_token_id: (n_eos) ids (the first 8) */
    int32_t eos_ids[TP_MODEL_GEN_MAX_EOS];
    char source[32];                       /* "generation_config.json", "gguf general.sampling", "" (none) */
};
/*
 * The generation settings the model at path recommends: a GGUF's
 * general.sampling.{temp,top_k,top_p,min_p,penalty_repeat} keys (written by
 * llama.cpp's converter), or an HF directory's generation_config.json
 * (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens,
 * eos_token_id; do_sample false reads as temperature 0).  A file without
 * them gives set 0.  Returns TP_OK, or TP_ERR_FORMAT (a value out of range,
 * named in err), an I/O error.  Reads metadata only.
 */
enum tp_status tp_model_gen_defaults_read(const char *path, struct tp_model_gen_defaults *out, struct tp_error *err);

#endif /* TP_MODEL_TENSOR_SOURCE_H */

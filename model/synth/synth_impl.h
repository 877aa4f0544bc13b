/*
 * model/synth_impl.h - private to synth*.c: the tensor plan and value
 * generator every synthetic layout shares (GGUF, Hugging Face directory: the
 * same seed gives the same values in each), and the tokenizer vocabulary a
 * synthetic model embeds, in GGUF tokenizer.ggml.* terms.
 */
#ifndef TP_MODEL_SYNTH_IMPL_H
#define TP_MODEL_SYNTH_IMPL_H

#include <stdint.h>

#include "model/synth.h"

/* One tensor of a synthetic model: GGUF name, type, ggml dims (ne[0] = row
 * length), and how its values are drawn. */
enum tp_synth_fill { TP_SYNTH_FILL_WEIGHT, TP_SYNTH_FILL_NORM, TP_SYNTH_FILL_ROPE_FREQS };
struct tp_synth_tensor {
    char name[64];
    enum tp_wtype type;
    int n_dims;
    int64_t ne[2];
    enum tp_synth_fill fill;
};
/* The tensor list of the model in GGUF order; p needs room for 16 per layer + 8.
 * Returns the count. */
int tp_synth_plan(const struct tp_shape *s, int n_layer, enum tp_wtype wt, enum tp_synth_mix mix,
                  struct tp_synth_tensor *p);
/* Per-tensor generator seed for (model seed, GGUF tensor name). */
uint64_t tp_synth_tensor_seed(uint64_t seed, const char *name);
/* The f32 values of row `row` of tensor t (t->ne[0] of them) into x: a pure
 * function of (tensor_seed, row), so any writer and thread count agrees. */
void tp_synth_fill_row(const struct tp_shape *shape, const struct tp_synth_tensor *t, uint64_t tensor_seed, int64_t row,
                       float *x);

struct tp_synth_vocab {
    const char *model;      /* tokenizer.ggml.model: "llama" (SPM scores) or "gpt2" (BPE merges) */
    const char *pre;        /* tokenizer.ggml.pre, or NULL */
    int n_tokens;
    char **tokens;          /* [n_tokens] NUL-terminated, owned */
    float *scores;          /* [n_tokens] or NULL */
    int32_t *types;         /* [n_tokens] enum tp_token_type values */
    int n_merges;
    char **merges;          /* [n_merges] "left right", owned */
    int bos, eos, unk, pad; /* -1 when absent */
    int add_bos, add_eos;
    char *chat_template;    /* or NULL */
};

/* SentencePiece-style vocabulary of exactly n tokens (n >= 300): <unk> <s>
 * </s>, the 256 <0xNN> byte tokens, then generated pieces with decreasing
 * scores. */
enum tp_status tp_synth_vocab_spm(int n, struct tp_synth_vocab *v, struct tp_error *err);
/* From a Hugging Face tokenizer.json (BPE; byte-level -> "gpt2", byte-fallback
 * SentencePiece conversions -> "llama"), padded with [PADi] tokens up to
 * min_tokens.  A tokenizer_config.json next to it supplies bos/eos,
 * add_bos_token and chat_template when present. */
enum tp_status tp_synth_vocab_json(const char *path, int min_tokens, struct tp_synth_vocab *v, struct tp_error *err);
void tp_synth_vocab_free(struct tp_synth_vocab *v);

#endif /* TP_MODEL_SYNTH_IMPL_H */

/*
 * model/include/model/synth_vocab.h - a tokenizer vocabulary in GGUF tokenizer.ggml.*
 * terms, built for a file writer: the one a synthetic model embeds (synth)
 * and the one `tpserve shard` writes for a Hugging Face directory.
 */
#ifndef TP_MODEL_SYNTH_VOCAB_H
#define TP_MODEL_SYNTH_VOCAB_H

#include <stdint.h>

#include "common/common.h"

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

#endif /* TP_MODEL_SYNTH_VOCAB_H */

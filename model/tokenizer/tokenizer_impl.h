/*
 * model/tokenizer/tokenizer_impl.h - private: how loaders hand a vocabulary to the
 * tokenizer.  Both the GGUF loader (tokenizer.ggml.* metadata) and the
 * tokenizer.json loader fill a struct tp_vocab_desc and call
 * tp_tokenizer_build(), which copies everything it needs (the descriptor
 * and its arrays may be freed / unmapped afterwards).
 */
#ifndef TP_MODEL_TOKENIZER_IMPL_H
#define TP_MODEL_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* GGUF tokenizer.ggml.token_type values. */
enum tp_token_type {
    TP_TOKEN_TYPE_UNDEFINED = 0,
    TP_TOKEN_TYPE_NORMAL = 1,
    TP_TOKEN_TYPE_UNKNOWN = 2,
    TP_TOKEN_TYPE_CONTROL = 3,
    TP_TOKEN_TYPE_USER_DEFINED = 4,
    TP_TOKEN_TYPE_UNUSED = 5,
    TP_TOKEN_TYPE_BYTE = 6
};

/* Pre-tokenizer (how text is split before BPE). */
enum tp_pretok {
    TP_PRETOK_SPM = 0,   /* SentencePiece: spaces -> U+2581, optional prefix space, no split */
    TP_PRETOK_LLAMA3,    /* Llama 3 regex ( \p{N}{1,3} ), byte-level */
    TP_PRETOK_QWEN2,     /* Qwen2/2.5/3 regex ( \p{N} single digits ), byte-level, NFC */
    TP_PRETOK_GPT2,      /* GPT-2 regex, byte-level */
    TP_PRETOK_GPT2_DIGITS, /* every \p{N} split off alone, then the GPT-2 regex (SmolLM, StarCoder) */
    TP_PRETOK_O200K,     /* o200k regex (GPT-4o, gpt-oss): letter-case runs, \p{N}{1,3}, byte-level */
    TP_PRETOK_COUNT
};

struct tp_vocab_desc {
    enum tp_tok_kind kind;        /* SPM (scores) or BPE (merges) */
    enum tp_pretok pretok;
    int n_tokens;
    const char *const *tokens;    /* [n_tokens] token texts as stored in the file */
    const size_t *token_lens;     /* [n_tokens] byte lengths; NULL: NUL-terminated */
    const float *scores;          /* [n_tokens] SPM merge scores; NULL for BPE */
    const int32_t *token_types;   /* [n_tokens] enum tp_token_type; NULL: all normal */
    int n_merges;
    const char *const *merges;    /* [n_merges] "left right" (BPE), rank = index */
    const size_t *merge_lens;     /* [n_merges]; NULL: NUL-terminated */
    int ignore_merges;            /* Llama 3: a pre-token already in the vocab is emitted whole */
    int bos_id, eos_id, eot_id, unk_id, pad_id; /* -1 when absent */
    int fim_ids[TP_FIM_COUNT];    /* fill-in-the-middle ids + 1 (GGUF tokenizer.ggml.fim_*_token_id); 0: not
                                   * given (then found by the token's text, tp_tokenizer_fim) */
    int add_bos, add_eos;
    int add_space_prefix;         /* SPM: prepend U+2581 to the input: 0 never; 1 llama.cpp (the
                                   * input and every text after a special token); 2 Hugging Face
                                   * Metaspace "first" (only at the start of the input, and not when
                                   * it already starts with a space); 3 Metaspace "always" (every
                                   * text piece not starting with a space) */
    int byte_fallback;            /* SPM: unknown bytes -> <0xNN> tokens */
};

/* Build a tokenizer from a descriptor (copies what it keeps). err may be NULL. */
enum tp_status tp_tokenizer_build(const struct tp_vocab_desc *desc, tp_tokenizer_t **out, struct tp_error *err);

/* Build the tokenizer from the tokenizer.ggml.* metadata of an open GGUF
 * reader (model/gguf.h; the model loader calls this).  Error text names the
 * file and the key.  err may be NULL. */
typedef struct tp_gguf tp_gguf_t;
enum tp_status tp_tokenizer_from_gguf_handle(tp_gguf_t *g, tp_tokenizer_t **out, struct tp_error *err);

/* Make id end generation too (an HF directory's generation_config.json eos_token_id); ids outside the
 * vocabulary are ignored.  Loading only: before the tokenizer is shared. */
void tp_tokenizer_mark_eog(tp_tokenizer_t *t, int id);

#endif /* TP_MODEL_TOKENIZER_IMPL_H */

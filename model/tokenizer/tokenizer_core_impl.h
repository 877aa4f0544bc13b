/*
 * model/tokenizer/tokenizer_core_impl.h - private: the tokenizer's in-memory layout,
 * shared by the tokenizer sources (tokenizer.c builds it, tokenizer_bpe.c
 * runs the merge loop and the pre-tokenizers, detok.c decodes).  Nothing
 * outside model/tokenizer*.c and model/detok.c should include this.
 *
 * Token texts come in two forms:
 *   key   what encoding looks up: SentencePiece vocabularies keep the file
 *         text (U+2581 for spaces); byte-level vocabularies are decoded from
 *         the GPT-2 byte map to the raw bytes they stand for;
 *   piece what decoding emits: U+2581 -> space, <0xNN> -> that byte, raw
 *         bytes for byte-level tokens, the literal text of special tokens.
 */
#ifndef TP_MODEL_TOKENIZER_CORE_IMPL_H
#define TP_MODEL_TOKENIZER_CORE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer_impl.h"

struct tp_tok_entry {
    uint32_t key_off, key_len;     /* into tp_tokenizer.blob */
    uint32_t piece_off, piece_len; /* into tp_tokenizer.blob */
    float score;                   /* SPM score (0 without scores) */
    uint8_t type;                  /* enum tp_token_type */
    uint8_t eog;                   /* ends generation */
    uint8_t in_key_hash;           /* encoding may produce it from text */
};

struct tp_merge_slot {
    uint64_t key;   /* (left id + 1) << 32 | (right id + 1); 0: empty */
    int32_t rank;   /* lower merges first */
    int32_t result; /* id of the merged token */
};

struct tp_tokenizer {
    enum tp_tok_kind kind;
    enum tp_pretok pretok;
    int n_vocab;
    struct tp_tok_entry *toks; /* [n_vocab] */
    char *blob;                /* keys and pieces */
    size_t blob_len;
    int32_t *key_hash;         /* [key_mask + 1] ids, -1 empty: key text -> id */
    size_t key_mask;
    struct tp_merge_slot *merges; /* [merge_mask + 1]; NULL when scored (SPM) */
    size_t merge_mask;
    int n_merges;
    int use_scores;            /* SPM: merge by token score instead of merge rank */
    int32_t byte_tok[256];     /* SPM: <0xNN> ids; byte-level: id of each single byte; -1 absent */
    /* special / added tokens matched in the input, grouped by first byte,
     * longest first within a group */
    int32_t *specials;         /* [n_specials] ids */
    int n_specials;
    int special_first[257];    /* specials[special_first[b] .. special_first[b+1]) start with byte b */
    int max_piece_len;
    int bos, eos, eot, unk, pad;
    int fim[TP_FIM_COUNT];        /* fill-in-the-middle token ids (enum tp_fim), -1 when the model has none */
    int add_bos, add_eos, add_space_prefix, byte_fallback, ignore_merges;
};

/* FNV-1a over bytes. */
uint64_t tp_tok_hash_bytes(const char *s, size_t len);
/* Id whose key equals s[0..len), or -1. */
int32_t tp_tok_lookup(const struct tp_tokenizer *t, const char *s, size_t len);
/* Merge of (left, right) ids: result id and rank, or -1. */
int32_t tp_tok_merge(const struct tp_tokenizer *t, int32_t left, int32_t right, int32_t *rank);

/* Scratch for one encode call (never shared between threads). */
struct tp_tok_scratch {
    struct tp_tok_sym *syms;
    struct tp_tok_cand *heap;
    size_t cap_syms, cap_heap;
    uint32_t *cps;   /* code points of a fragment (pre-tokenizers) */
    uint8_t *cls;    /* classes of cps */
    uint32_t *offs;  /* byte offset of each cp, plus the end */
    size_t cap_cps;
    char *buf;       /* SPM escaped text */
    size_t cap_buf;
};
void tp_tok_scratch_free(struct tp_tok_scratch *s);

/* Output sink: ids written while n < max, n counts all. */
struct tp_tok_out {
    int32_t *ids;
    int max;
    int n;
};
static inline void tp_tok_emit(struct tp_tok_out *o, int32_t id)
{
    if (o->n < o->max) o->ids[o->n] = id;
    o->n++;
}

/* Tokenize one word (no further splitting): SPM key text or raw bytes for
 * byte-level.  Returns 0, or -1 when out of memory. */
int tp_tok_bpe_word(const struct tp_tokenizer *t, struct tp_tok_scratch *sc, const char *s, size_t len,
                    struct tp_tok_out *out);
/* Tokenize one fragment of plain text (no special tokens in it) the way the
 * tokenizer's kind and pre-tokenizer say.  at_start: the fragment starts the
 * input (else it follows a special token); used by the SPM prefix-space
 * rule.  0, or -1 (no memory). */
int tp_tok_encode_fragment(const struct tp_tokenizer *t, struct tp_tok_scratch *sc, const char *s, size_t len,
                           int at_start, struct tp_tok_out *out);

/* The pre-tokens of one byte-level fragment: byte end offsets written to
 * ends[] while fewer than max_ends, *n_ends counts all.  0, or -1 (no memory,
 * or not a byte-level tokenizer).  For tests and diagnostics. */
int tp_tok_pretokenize(const struct tp_tokenizer *t, struct tp_tok_scratch *sc, const char *s, size_t len,
                       uint32_t *ends, size_t max_ends, size_t *n_ends);

#endif /* TP_MODEL_TOKENIZER_CORE_IMPL_H */

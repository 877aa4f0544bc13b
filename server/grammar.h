/*
 * server/grammar.h - constrained decoding: JSON schemas compiled into a
 * byte-level pushdown automaton with no dead ends (every reachable state can
 * still finish), a per-sequence state fed the bytes of each chosen token,
 * and the per-step token mask computed over a trie of the vocabulary's byte
 * strings.  How it works and the schema subset: docs/structured-output.md.
 *
 * Thread safety: a compiled grammar and a trie are read-only after
 * creation and may be shared; a tp_gstate and a tp_mask_ctx belong to one
 * thread at a time.
 */
#ifndef TP_SERVER_GRAMMAR_H
#define TP_SERVER_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/common.h"

#define TP_GRAMMAR_STACKS 8   /* anyOf branches followed at once (more are dropped: still valid) */
#define TP_GRAMMAR_DEPTH 32   /* nesting depth of values (deeper values are not generated) */
#define TP_GRAMMAR_MAX_PROPS 64 /* properties per object schema */
#define TP_GRAMMAR_NUM_DIGITS 15 /* integer / fraction digits of a generated number */
#define TP_GRAMMAR_WS 16      /* indentation bytes after a newline between two tokens of the JSON text */
#define TP_GRAMMAR_KEY_BYTES 64 /* bytes of an additionalProperties key */

typedef struct tp_grammar tp_grammar_t;

/* One automaton frame (32 bytes); fields are interpreted per frame kind. */
struct tp_gframe {
    uint16_t node;   /* grammar node, or TP_GNODE_ROOT / a key frame (kind in flags) */
    uint8_t phase;
    uint8_t ws;      /* whitespace bytes since the last token */
    uint32_t n;      /* characters / items / digits so far */
    uint64_t seen;   /* objects: properties already present */
    uint16_t lo, hi, pos; /* literal / key candidate range, bytes matched */
    uint8_t u8;      /* UTF-8 continuation bytes still expected */
    uint8_t u8lo;    /* allowed range of the next continuation byte */
    uint8_t u8hi;
    uint8_t flags;
    int16_t prop;    /* objects: property of the value being generated (-1: additional) */
    uint8_t pad[2];
};

struct tp_gstack {
    int depth;
    struct tp_gframe f[TP_GRAMMAR_DEPTH];
};

/* Automaton state of one sequence: n live stacks (0: rejected). */
struct tp_gstate {
    int n;
    struct tp_gstack s[TP_GRAMMAR_STACKS];
};

/*
 * Compile a JSON schema.  Returns TP_OK, TP_ERR_INVALID_ARG with err naming
 * the keyword and its location ("unsupported keyword 'minimum' at
 * #/properties/age") for schemas outside the supported subset or that no
 * value satisfies, TP_ERR_NOMEM.  schema is not kept; err may be NULL.
 */
enum tp_status tp_grammar_from_schema(const cJSON *schema, tp_grammar_t **out, struct tp_error *err);
/* The same for the server's own tool-call grammars, which may also hold
 * {"x-raw-prefix": "text", "x-then": schema}: the bytes of text (not JSON),
 * then a value of schema (Mistral's name[ARGS]{...} calls). */
enum tp_status tp_grammar_from_tool_schema(const cJSON *schema, tp_grammar_t **out, struct tp_error *err);
/* Any JSON object (response_format json_object). */
enum tp_status tp_grammar_json_object(tp_grammar_t **out);
void tp_grammar_free(tp_grammar_t *g); /* NULL safe */

/* Initial state (nothing generated yet). */
void tp_gstate_init(const tp_grammar_t *g, struct tp_gstate *st);
/* Feed one byte.  Returns 1 (accepted, st advanced) or 0 (rejected; st is
 * then empty and must be re-initialised or restored from a copy). */
int tp_gstate_feed(const tp_grammar_t *g, struct tp_gstate *st, unsigned char c);
/* Feed len bytes; 1 when all were accepted. */
int tp_gstate_feed_bytes(const tp_grammar_t *g, struct tp_gstate *st, const char *b, size_t len);
/* 1 when the bytes so far are a complete value (end of generation allowed). */
int tp_gstate_accepting(const tp_grammar_t *g, const struct tp_gstate *st);
/* 1 when the value is complete and no byte may follow. */
int tp_gstate_done(const tp_grammar_t *g, const struct tp_gstate *st);
/* Copy the live part of src into dst. */
void tp_gstate_copy(struct tp_gstate *dst, const struct tp_gstate *src);
/*
 * dst = src with the counters that cannot change the allowed tokens cleared
 * (the length of a string with no maxLength once minLength is reached), so
 * two states with equal normal forms (tp_gstate_equal) have the same mask.
 */
void tp_gstate_normalize(const tp_grammar_t *g, const struct tp_gstate *src, struct tp_gstate *dst);
int tp_gstate_equal(const struct tp_gstate *a, const struct tp_gstate *b);

/* ------------------------------------------------------------ token mask */

typedef struct tp_token_trie tp_token_trie_t;

/*
 * Trie over n_vocab token byte strings: piece[i][0..len[i]) (not kept);
 * tokens with skip[i] != 0 (special / control tokens) or empty pieces are
 * never allowed by a mask.  Returns TP_OK or TP_ERR_NOMEM.
 */
enum tp_status tp_token_trie_init(int n_vocab, const char *const *piece, const size_t *len, const uint8_t *skip,
                                  tp_token_trie_t **out);
void tp_token_trie_free(tp_token_trie_t *t); /* NULL safe */
int tp_token_trie_n_vocab(const tp_token_trie_t *t);

/* Per-thread scratch for tp_grammar_mask (one automaton state per trie depth). */
typedef struct tp_mask_ctx tp_mask_ctx_t;
enum tp_status tp_mask_ctx_init(const tp_token_trie_t *t, tp_mask_ctx_t **out);
void tp_mask_ctx_free(tp_mask_ctx_t *c); /* NULL safe */

/*
 * Allowed tokens from state st: mask has (n_vocab + 31) / 32 words; bit i of
 * word i / 32 is set when every byte of token i is accepted.  End-of-
 * generation tokens are the caller's (allow them when tp_gstate_accepting).
 * Returns the number of allowed tokens.  Allocates nothing.
 */
int tp_grammar_mask(tp_mask_ctx_t *c, const tp_grammar_t *g, const struct tp_gstate *st, uint32_t *mask);

/* ------------------------------------------------- closing within a budget */

/*
 * The cost of a state: the bytes of its shortest completion (every frame
 * closed at its shortest: missing required members with shortest values,
 * minItems, minLength, the rest of a literal or key, closing brackets), plus
 * one when only an end-of-generation token can end it; 0 once done.  A
 * vocabulary with a token for every single byte can always lower the cost
 * by one per token, so a reply whose cost after each token stays within
 * the tokens left always ends complete.  Allocates nothing.
 */
int tp_gstate_cost(const tp_grammar_t *g, const struct tp_gstate *st);
/*
 * tp_grammar_mask keeping only the tokens after which tp_gstate_cost is at
 * most budget (budget < 0: tp_grammar_mask).  May allow none (the caller
 * falls back to the plain mask).  max_cost (NULL: not wanted) receives a
 * bound on the cost after any allowed token: a plain mask whose bound is
 * within the tokens left needs no budget.  Allocates nothing.
 */
int tp_grammar_mask_budget(tp_mask_ctx_t *c, const tp_grammar_t *g, const struct tp_gstate *st, int budget,
                           uint32_t *mask, int *max_cost);

#endif

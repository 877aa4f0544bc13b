/*
 * server/include/server/spec.h - speculative decoding: the draft sources and
 * the per-sequence draft length.  A step verifies a sequence's last token
 * plus k drafted tokens at once (k + 1 logits rows of one sequence, causal
 * within the step, see parallel.h TP_PARALLEL_ROWS_PER_SEQ); the tokens are
 * then chosen row by row with tp_sampler_sample_draft until the first
 * rejected draft, so the output is what plain decoding would choose (greedy)
 * or is distributed exactly as it (sampling).  The scheduler (server/) and
 * `tpserve generate` (cli/) share these pieces.  Pure functions, no
 * allocation, thread safe.  Design and measurements: docs/speculative.md.
 */
#ifndef TP_SERVER_SPEC_H
#define TP_SERVER_SPEC_H

#include <stdint.h>

#include "common/common.h"
#include "parallel/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NGRAM: prompt lookup (below); DRAFT: a smaller model with the same vocabulary decodes the drafts greedily
 * (`serve`, `generate` and `bench gen` --draft-model). */
enum tp_spec_mode { TP_SPEC_OFF = 0, TP_SPEC_NGRAM, TP_SPEC_DRAFT, TP_SPEC_MODE_COUNT };
/* "off" | "ngram" | "draft" <-> enum; parse returns -1 for anything else. */
const char *tp_spec_mode_name(enum tp_spec_mode m);
int tp_spec_mode_parse(const char *text);

#define TP_SPEC_DRAFT_MAX 16    /* drafted tokens per sequence and step (--draft-max 1..16) */
#define TP_SPEC_NGRAM_MIN 1     /* shortest suffix the lookup matches */
#define TP_SPEC_NGRAM_MAX 4     /* longest */

/*
 * n-gram prompt lookup: toks[0..n) is the sequence so far (prompt, output,
 * and last the token about to be fed).  Finds the longest suffix of
 * TP_SPEC_NGRAM_MAX down to TP_SPEC_NGRAM_MIN tokens that occurred earlier
 * in toks, takes its most recent earlier occurrence and writes the tokens
 * that followed it (up to k, never past n) to out.  Returns how many (0: no
 * match).  O(n x TP_SPEC_NGRAM_MAX).
 */
int tp_spec_ngram_draft(const int32_t *toks, int n, int k, int32_t *out);

/*
 * Adaptive draft length per sequence: a running estimate of the chance that
 * a drafted token is accepted, alpha (exponentially weighted over the
 * sequence's verification steps: accepted / (accepted + 1 if one was
 * rejected)), and k = the largest draft whose last token still has a chance
 * alpha^k >= 0.2 of being reached and accepted, within 1..k_max.  Starts at
 * alpha 0.6 (k 3).
 */
struct tp_spec_adapt {
    float num, den;   /* weighted accepted, weighted tried */
    int k_max;        /* 1..TP_SPEC_DRAFT_MAX */
};
void tp_spec_adapt_init(struct tp_spec_adapt *a, int k_max);
int tp_spec_adapt_k(const struct tp_spec_adapt *a);
/* After a verification step that drafted n_drafted tokens and accepted the first n_accepted. */
void tp_spec_adapt_update(struct tp_spec_adapt *a, int n_drafted, int n_accepted);
/* The running alpha in [0, 1]. */
float tp_spec_adapt_alpha(const struct tp_spec_adapt *a);

/*
 * A draft model (server/spec_draft.c): a smaller model with the target's
 * vocabulary, greedy, one KV sequence per slot, on rank 0 alone
 * (tp_spec_draft_init) or sharded over the ranks of a parallel engine
 * (tp_spec_draft_init_sharded: each pass is a tp_parallel_draft_step on
 * every rank, the truncations of its sequences travel with the next pass;
 * where it runs: tp_parallel_draft_decision).  It
 * keeps, per sequence, the tokens whose K/V its cache holds and, asked for
 * drafts after a sequence, re-feeds from the first token that differs (so
 * rejected drafts need no other rollback), then decodes k tokens one at a
 * time.  Several sequences draft together: their catch-up tokens share
 * forward passes, then each pass decodes one token of every sequence that
 * still wants one, so a round of k drafts for any number of sequences costs
 * about k passes.  Not thread safe (one thread at a time: the engine thread,
 * which runs it without holding the queue lock, or a CLI loop).
 */
typedef struct tp_spec_draft tp_spec_draft_t;
/* Load path with n_seq sequences of n_ctx positions and n_threads threads;
 * its vocabulary must have n_vocab tokens.  TP_OK, or the error in err (the
 * file, or the vocabulary mismatch naming both sizes). */
enum tp_status tp_spec_draft_init(const char *path, int n_ctx, int n_seq, int n_threads, int n_vocab,
                                  tp_spec_draft_t **out, struct tp_error *err);
/* The draft model sharded in engine p (tp_parallel_draft_model(p) not NULL; rank 0), n_seq sequences
 * (at most the engine's); p is not owned and must outlive the draft.  TP_ERR_INVALID_ARG without a
 * sharded draft in p. */
enum tp_status tp_spec_draft_init_sharded(tp_parallel_t *p, int n_seq, tp_spec_draft_t **out, struct tp_error *err);
void tp_spec_draft_free(tp_spec_draft_t *d); /* NULL safe */
/* Forget what the draft's cache holds (after the group re-formed: a rank may have lost it); the next
 * drafts of each sequence re-feed it from its start. */
void tp_spec_draft_reset(tp_spec_draft_t *d);
/* 1 when it runs sharded over the engine's ranks (every pass costs the collectives of a step). */
int tp_spec_draft_is_sharded(const tp_spec_draft_t *d);
/* One sequence's part of tp_spec_draft_propose_batch. */
struct tp_spec_draft_req {
    int seq;              /* the draft model's sequence, 0..n_seq-1, each at most once per call */
    const int32_t *toks;  /* (n) the sequence so far, last the token about to be fed (not owned) */
    int n;
    int k;                /* drafts wanted; lowered to what the context leaves */
    int32_t *out;         /* (k) the drafts (not owned) */
    int n_out;            /* set: drafts written (0 when its context is full) */
};
/* Up to req[i].k greedy drafts after every req[i].toks, batched over the
 * requests.  TP_OK; TP_ERR_INVALID_ARG for a bad or repeated seq; or the
 * model's error (tp_spec_draft_last_error), every n_out then 0. */
enum tp_status tp_spec_draft_propose_batch(tp_spec_draft_t *d, struct tp_spec_draft_req *req, int n_req);
/* Up to k greedy drafts after toks[0..n) (sequence seq) into out; returns
 * how many (0 when its context is full), or -1 with the error in
 * tp_spec_draft_last_error. */
int tp_spec_draft_propose(tp_spec_draft_t *d, int seq, const int32_t *toks, int n, int k, int32_t *out);
const char *tp_spec_draft_last_error(const tp_spec_draft_t *d);
/* Forward passes the draft model has run; its weights' bytes; its layers (0 for NULL). */
uint64_t tp_spec_draft_passes(const tp_spec_draft_t *d);
uint64_t tp_spec_draft_weight_bytes(const tp_spec_draft_t *d);
int tp_spec_draft_n_layer(const tp_spec_draft_t *d);

#ifdef __cplusplus
}
#endif
#endif /* TP_SERVER_SPEC_H */

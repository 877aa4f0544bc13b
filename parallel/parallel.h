/*
 * parallel/parallel.h - tensor parallelism: sharding plans and the
 * distributed engine that runs one model across the ranks of a comm group.
 *
 * Knows comm/ and model/; nothing of HTTP.  Rank 0 drives: each step it
 * sends every rank one step descriptor (tokens, positions, sequences,
 * cleared sequences); all ranks run the forward pass on their slice with two
 * all_sums per layer; rank 0 gets the logits.  Other ranks sit in
 * tp_parallel_worker_loop() until rank 0 shuts the group down or a peer
 * fails.  A world of size 1 is the plain single-rank engine (no comm).
 *
 * Sections: sharding plan (pure data) - engine.
 */
#ifndef TP_PARALLEL_H
#define TP_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "common/common.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ===================================================== sharding plan ===== */

/* (The parallel issue defines struct tp_shard_plan and tp_parallel_plan() here:
 *  a pure function of (hparams, weight types, world size, shard weights).) */

/* ============================================================ engine ===== */

/* Activation dtype on the wire for the per-layer all_sums. */
enum tp_wire_dtype { TP_WIRE_F32 = 0, TP_WIRE_F16, TP_WIRE_BF16, TP_WIRE_Q8, TP_WIRE_COUNT };

struct tp_parallel_config {
    struct tp_model_config model;  /* path, threads, n_ctx, n_seq, n_batch (shard is filled in by the plan) */
    struct tp_comm_config comm;    /* backend, rank, world size ... (world 1: no network) */
    const char *shard_weights;     /* "2,1,1": relative share per rank; NULL: equal */
    enum tp_wire_dtype wire_dtype; /* default f32 */
};
/* Defaults: tp_model_default_config(), tp_comm_default_config() then
 * tp_comm_config_from_env() is NOT applied (the caller decides). */
struct tp_parallel_config tp_parallel_default_config(void);

typedef struct tp_parallel tp_parallel_t;

/*
 * Collective over all ranks: form the group, compute the plan, load this
 * rank's slice.  Every rank validates the same things, so a bad combination
 * (wrong shard file, a model that cannot be split as asked) fails on every
 * rank with the same message and nobody hangs.
 */
enum tp_status tp_parallel_init(const struct tp_parallel_config *cfg, tp_parallel_t **out, struct tp_error *err);
/* Rank 0: tells workers to leave (if still connected), then frees. Others: frees. NULL safe. */
void tp_parallel_free(tp_parallel_t *p);
const char *tp_parallel_last_error(const tp_parallel_t *p);

int tp_parallel_rank(const tp_parallel_t *p);
int tp_parallel_size(const tp_parallel_t *p);
tp_model_t *tp_parallel_model(const tp_parallel_t *p);         /* this rank's slice */
tp_tokenizer_t *tp_parallel_tokenizer(const tp_parallel_t *p);
const struct tp_hparams *tp_parallel_hparams(const tp_parallel_t *p);

/*
 * One engine step, rank 0 only.  Every rank first truncates the sequences in
 * clear_seq (cancelled or finished; positions >= clear_from[i], usually 0),
 * then runs batch.  logits receives n_vocab floats (the FULL vocabulary)
 * per token with batch.logits[i] != 0, in batch order.  Allocates nothing.
 * On a comm failure the engine is poisoned: this and every later call
 * return the error (TP_ERR_PEER / TP_ERR_TIMEOUT / TP_ERR_POISONED).
 */
struct tp_step {
    struct tp_batch batch;
    int n_clear;
    const int32_t *clear_seq;
    const int32_t *clear_from;
};
enum tp_status tp_parallel_step(tp_parallel_t *p, const struct tp_step *step, float *logits);

/* Rank 0: a no-op step that proves every rank is alive (for /health when idle). */
enum tp_status tp_parallel_ping(tp_parallel_t *p);

/* Ranks > 0: run steps sent by rank 0 until it shuts down (TP_OK) or fails. */
enum tp_status tp_parallel_worker_loop(tp_parallel_t *p);

/* Nonzero after a failure: the group cannot be used any more. */
int tp_parallel_is_poisoned(const tp_parallel_t *p);

struct tp_parallel_stats {
    uint64_t n_steps;
    uint64_t n_tokens;
    uint64_t ns_compute;   /* forward pass minus communication */
    uint64_t ns_comm;      /* all_sums, step broadcast, logits gather */
    uint64_t bytes_sent;   /* by this rank */
};
void tp_parallel_get_stats(const tp_parallel_t *p, struct tp_parallel_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* TP_PARALLEL_H */

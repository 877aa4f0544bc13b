/*
 * tests/parallel/mr_impl.h - private to the parallel tests: run N real ranks
 * (forked processes talking TCP on 127.0.0.1 through the ring backend), each
 * running the engine, with a hard deadline (ranks still alive at the deadline
 * are killed and reported as hung), and collect what each rank saw.
 *
 * Rank 0 generates greedily for two sequences in the same steps (so logits
 * gathers carry several rows), clears and restarts sequence 1 halfway (the
 * clear path), and records the tokens of sequence 0 and its final logits.
 * With copy_restart, the halfway restart of sequence 1 is a KV copy of
 * sequence 0 instead (the step's copy list: prefix sharing between slots).
 */
#ifndef TP_TESTS_PARALLEL_MR_IMPL_H
#define TP_TESTS_PARALLEL_MR_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "model/synth.h"
#include "parallel/parallel.h"

#define MR_MAX_RANKS 8
#define MR_MAX_STEPS 256

struct mr_run {
    /* in */
    int world;
    const char *model;          /* path, or a printf pattern with one %d (rank) when shard_files */
    int shard_files;
    const char *weights;        /* --shard-weights, NULL: equal */
    const char *weights_last;   /* non-NULL: the last rank uses these instead (disagreement test) */
    enum tp_wire_dtype wire;
    int n_steps;                /* greedy steps after the prompt */
    int greedy_api;             /* 1: tp_parallel_step_greedy, 2: tp_parallel_step_topk (k 8), not full logits */
    int file_of_rank[MR_MAX_RANKS]; /* shard_files: rank r opens the file of this rank (identity by default) */
    int deadline_s;             /* whole run; default 60 */
    int idle_ms;                /* > 0: rank 0 idles this long after init, before its first step */
    int slow_load_ms;           /* > 0: rank world-1 sleeps this long while loading (slow disk) */
    uint32_t op_timeout_ms;     /* comm op timeout of every rank (default 10000) */
    int kill_last_rank;         /* rank world-1 exits abruptly 300 ms after init (dead peer test) */
    const int32_t *force0;      /* non-NULL: after step s sequence 0 is fed force0[s] (teacher forcing)
                                 * instead of its own choice; tokens[] still records its argmax */
    enum tp_moe_split moe_split; /* mixture of experts: the split every rank asks for (default AUTO) */
    int hook;                   /* before generating, rank 0 runs the rank hook with argument 42; every rank
                                 * but the last registered one reporting {rank, arg, its weight bytes, -1} */
    int copy_restart;           /* halfway, sequence 1 is cleared and gets a KV copy of every position
                                 * sequence 0 holds, then is fed sequence 0's token at sequence 0's
                                 * position (in the same step), so from then on it decodes what
                                 * sequence 0 decodes */
    int n_bias;                 /* logit_bias of sequence 0 (row 0 of every step): entries of */
    const int32_t *bias_id;     /* (n_bias) token ids */
    const float *bias_val;      /* (n_bias) -100..100 */
    const uint32_t *mask0;      /* non-NULL: token mask of sequence 0 (row 0 of every step), (n_vocab + 31) / 32
                                 * words, bit set = allowed */
    /* out */
    int exit_code[MR_MAX_RANKS]; /* 0 ok, 3 init refused, 4 step failed, -1 killed at the deadline */
    char msg[MR_MAX_RANKS][512];
    int n_tokens;
    int32_t tokens[MR_MAX_STEPS];      /* sequence 0 */
    int32_t tokens1[MR_MAX_STEPS];     /* sequence 1 */
    int n_vocab;
    float *logits;                     /* (n_vocab) last step, sequence 0; malloc'd, mr_free */
    uint64_t rss[MR_MAX_RANKS];        /* after init */
    uint64_t rss_peak[MR_MAX_RANKS];   /* peak RSS of the rank's process at its end (0 if it died) */
    uint64_t plan_bytes[MR_MAX_RANKS]; /* plan sharded + replicated of that rank */
    int plan_split;                    /* rank 0's plan: enum tp_moe_split it chose */
    uint64_t weight_bytes[MR_MAX_RANKS];
    struct tp_parallel_stats stats0;   /* rank 0 */
    int32_t top_ids[8];                /* greedy_api 2: last step's top 8 of sequence 0 */
    float top_logits[8];
    float lse;                         /* and its log-sum-exp */
    float gap0[MR_MAX_STEPS];          /* full-logits mode: sequence 0's top-1 minus top-2 logit per step */
    float rms0[MR_MAX_STEPS];          /* and the root mean square of its logits */
    float gap1[MR_MAX_STEPS];          /* the same for sequence 1 */
    float rms1[MR_MAX_STEPS];
    double hook_values[MR_MAX_RANKS * TP_PARALLEL_HOOK_VALUES]; /* hook: what rank 0 got (NaN: none) */
    double seconds;
};

void mr_init(struct mr_run *r, const char *model, int world);
/* 0 when every rank could be started and collected (whatever they returned). */
int mr_exec(struct mr_run *r);
void mr_free(struct mr_run *r);
/* sum (a-b)^2 / sum b^2 */
double mr_nmse(const float *a, const float *b, int n);
/* The near-tie rule for greedy tokens at N > 1 ranks (r) against N = 1 (ref), both run in full-logits
 * mode.  N ranks add partial sums in another order than one rank (and quantized types re-quantize
 * the summed activations), so logits move by a small amount relative to their rms; where ref's top
 * two logits are closer than that, the argmax may flip.  A step is a near-tie when ref's top-1 minus
 * top-2 logit is below tau times the rms of ref's logits at that step.  The rule, per sequence:
 *   free run: r's tokens equal ref's up to the first step where they differ, and that step is a
 *     near-tie; after it the texts differ and nothing more is compared.  (So the tokens are equal
 *     at least up to ref's first near-tie, on any model and seed.)
 *   teacher-forced (forced 1: sequence 0 fed ref's tokens): every step where sequence 0's argmax
 *     differs is a near-tie; sequence 1 runs free.
 * Prints one line per sequence; returns the number of differing steps that are not near-ties, plus
 * 1 if the runs differ in length (0: the rule holds). */
int mr_near_tie_violations(const struct mr_run *ref, const struct mr_run *r, double tau, int forced, const char *what);
/* Steps of ref's sequence 0 (full-logits mode) that are near-ties at tau. */
int mr_near_ties(const struct mr_run *ref, double tau);
/* Synthetic models written once per test process (NULL + skip reason when the writer is missing). */
const char *mr_synth_model(const char *tag, enum tp_wtype type);
/* Write shape sh as type (with mix) from seed to path, or when path is NULL to a file in the test's
 * temporary folder named after the arguments; the path (one of 8 static buffers used in turn), or NULL
 * after printing why. */
const char *mr_synth_shape(const struct tp_shape *sh, enum tp_wtype type, enum tp_synth_mix mix, uint64_t seed,
                           const char *path);

#endif

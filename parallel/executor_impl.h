/*
 * parallel/executor_impl.h - private to parallel/: the executor handle shared by
 * executor.c (life cycle) and step.c (step protocol, worker loop, keepalive).
 */
#ifndef TP_PARALLEL_EXECUTOR_IMPL_H
#define TP_PARALLEL_EXECUTOR_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "parallel_impl.h"

/*
 * The step header: a fixed 256-byte broadcast of 64 little-endian int32.
 *   [0] magic 'TPS7'  [1] kind (enum step_kind)
 *   [2] step number   [3] n_tokens  [4] n_clear  [5] body inline (0/1)
 *   [6] k of RUN_TOPK (the argument of HOOK)  [7] collect stats after the step  [8] n_copy
 *   [9] n_bias        [10] n_mask   [11] which model steps (0 the model, 1 the sharded draft model:
 *                                        RUN_ARGMAX only, no copies, bias or masks; clears are its own)
 *   [12..63] the body when it fits (52 words), else a second broadcast.
 * Body (int32): token[n] pos[n] seq[n] want_logits[n] clear_seq[c] clear_from[c]
 *               copy_dst[k] copy_src[k] copy_len[k]
 *               bias_row[b] bias_id[b] bias_val[b] (float bits)
 *               mask_row[m] mask[m x W] (W = (n_vocab + 31) / 32 words of token bits).
 * With [7] set, every rank's counters (STATS_WORDS int32: steps, tokens, compute / comm ns, bytes
 * sent, memory and memory limit as u64, the 32-byte host name) are gathered to rank 0.  Workers
 * check every count and entry before use.
 */
#define STEP_MAGIC 0x37535054 /* "TPS7" little-endian */
#define HDR_WORDS 64
/* hdr[8]: n_copy */
#define HDR_N_COPY 8
/* hdr[9]: n_bias (logit_bias entries) */
#define HDR_N_BIAS 9
/* hdr[10]: n_mask (rows with a token mask) */
#define HDR_N_MASK 10
/* hdr[11]: 0 the model, 1 the draft model */
#define HDR_MODEL 11
#define HDR_INLINE_AT 12
/* hdr[7]: nonzero = after this step every rank sends its stats to rank 0 */
#define HDR_STATS 7
#define STATS_U64 10    /* counters and memory figures of struct tp_parallel_stats */
#define STATS_WORDS (2 * STATS_U64 + 8) /* those as little-endian u64 + the 32-byte host name, in int32 words */
#define STATS_EVERY_NS 1000000000ull /* collect at most once a second while steps run */
#define HDR_INLINE_MAX (HDR_WORDS - HDR_INLINE_AT)
enum step_kind {
    STEP_RUN_LOGITS = 1,
    STEP_RUN_ARGMAX = 2,
    STEP_PING = 3,
    STEP_SHUTDOWN = 4,
    STEP_RUN_TOPK = 5,
    STEP_HOOK = 6, /* hdr[6]: the argument; every rank runs its rank hook, values gathered to rank 0 */
};

#define GATHER_MAX_FLOATS (4u << 20) /* rank 0's logits gather area: 16 MiB */

struct tp_parallel {
    struct tp_error err;
    int rank, world;
    tp_comm_t *comm;              /* NULL for a world of 1 */
    tp_model_t *model;
    struct tp_model_probe probe;
    struct tp_shard_plan plan;
    struct tp_model_shard shard;
    struct tp_wire wire;
    enum tp_wire_dtype wire_dtype;

    int n_batch, n_seq, n_ctx, n_vocab;
    int vocab_begin, vocab_local; /* this rank's vocabulary rows */
    int vocab_max;                /* largest range over ranks (gather padding) */
    int equal_vocab;              /* every rank has vocab_max rows */
    int chunk;                    /* rows per logits gather */

    int32_t hdr[HDR_WORDS];
    int32_t *body;                /* (4*n_batch + 2*n_seq + 3*n_seq + 3*bias_max + rows_max*(1 + mask_words)) */
    int mask_words;               /* (n_vocab + 31) / 32: one token mask row */
    int rows_max;                 /* logits rows a step may bias or mask: min(n_batch, n_seq x
                                   * TP_PARALLEL_ROWS_PER_SEQ) */
    int bias_max;                 /* logit_bias entries per step: rows_max x TP_PARALLEL_BIAS_PER_ROW */
    float *local;                 /* (n_batch, vocab_local) this rank's logits rows */
    float *send;                  /* (chunk, vocab_max) padded rows (uneven vocab) */
    float *gath;                  /* rank 0: (world, chunk, vocab_max) */
    int8_t *want;                 /* (n_batch) logits flags of the current step */
    float *pairs;                 /* (n_batch, 2k+2) local argmax / top-k candidates */
    float *pairs_all;             /* rank 0: (world, n_batch, 2k+2) */

    atomic_int poisoned;
    int shut;
    uint32_t step_no;
    struct tp_parallel_stats stats;
    struct tp_parallel_stats *rank_stats; /* rank 0: (world) each rank's counters as last collected; under mu */
    int32_t *stats_all;                   /* rank 0: (world, STATS_WORDS) gather area */
    uint64_t stats_ns;                    /* rank 0: when they were last collected */
    char path[4096];              /* model path with {rank} expanded */
    struct tp_comm_config comm_cfg; /* as given to init (strings are the caller's), for tp_parallel_rejoin */
    uint64_t plan_hash;           /* what the ranks agreed on at init (model, plan, dtype, sizes) */
    size_t wire_max_count;        /* tp_wire_init's max_count */
    atomic_int rejoin_phase;      /* see tp_parallel_rejoin_phase() */
    /* what a re-plan over fewer ranks needs (tp_parallel_replan) */
    double weights[TP_PLAN_MAX_RANKS]; /* (world) the plan's shard weights when has_weights */
    int has_weights;
    enum tp_moe_split moe_split;
    int cfg_n_ctx, cfg_n_seq, cfg_n_batch; /* as given to init (part of plan_hash) */
    enum tp_kv_type kv_type;      /* the KV cache's element type (the re-plan's memory check) */
    int model_lost;               /* a re-plan freed the slice and the new one did not load */
    /* speculative decoding's draft model (tp_parallel_config.draft_path): where it runs, decided by
     * rank 0 at init (draft_exchange) and adopted by every rank; its slice when sharded */
    int has_draft_dec;                 /* a draft model was configured on rank 0 */
    struct tp_draft_place_result draft_dec; /* the decision (every rank: placement and reason) */
    double draft_bw_gbs;               /* this rank's bandwidth figure given to the decision */
    char dpath[4096];                  /* draft path with {rank} expanded */
    struct tp_model_probe dprobe;
    struct tp_shard_plan dplan;
    struct tp_model_shard dshard;
    tp_model_t *draft;                 /* this rank's draft slice (NULL unless SHARDED) */
    int d_n_batch, d_n_ctx;            /* tokens per draft step; its positions per sequence */
    int dvocab_begin, dvocab_local;    /* this rank's rows of the draft's output head */
    float *dlocal;                     /* (d_n_batch, dvocab_local) this rank's draft logits rows */
    tp_parallel_hook_fn hook;     /* tp_parallel_set_hook (NULL: values NaN) */
    void *hook_ud;

    /* what other threads read (tp_parallel_get_view, tp_parallel_silent_rank, tp_parallel_size): view_mu
     * guards `comm` being replaced (the engine thread's own reads of comm take no lock) and the view, a
     * copy of the last group that formed completely.  Never held across a collective or a load. */
    pthread_mutex_t view_mu;
    int view_mu_inited;
    struct tp_parallel_view view;

    /* rank 0 keepalive */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t keep;
    int keep_started, keep_stop, mu_inited;
    uint32_t keep_ms;
    uint64_t last_ns;
};

/* step.c: rank 0's keepalive thread (pthread start routine; arg is the engine). */
void *tp_engine_keepalive_main(void *arg);
/* step.c: rank 0 tells the workers to leave (best effort; logs on failure). */
void tp_engine_send_shutdown(tp_parallel_t *p);

#endif /* TP_PARALLEL_EXECUTOR_IMPL_H */

/*
 * parallel/include/parallel/probe.h - what a model file says before it is loaded (probe.c):
 * hyperparameters, tensor types and tpserve.shard.* keys, for the executor
 * and for `tpserve plan` / `tpserve info`.
 */
#ifndef TP_PARALLEL_PROBE_H
#define TP_PARALLEL_PROBE_H

#include <stdint.h>

#include "parallel/parallel.h"

/* What the engine needs to know about a model file before loading it. */
struct tp_model_probe {
    struct tp_hparams hp;
    struct tp_plan_types types;
    int is_shard;             /* file has tpserve.shard.* keys */
    int shard_rank, shard_world;
    char shard_weights[256];  /* as stored ("" = equal) */
    int32_t shard_ranges[TP_PLAN_MAX_RANKS * 8];
    uint64_t shard_plan_hash;
    /* mixture-of-experts shard files: the split they were cut with (AUTO: none recorded) and every
     * rank's expert_begin, expert_end, shexp_begin, shexp_end */
    enum tp_moe_split shard_moe_split;
    int32_t shard_experts[TP_PLAN_MAX_RANKS * 4];
};
/* Read hparams (through the model loader, vocab_only) and the tensor types and
 * shard keys (through the GGUF reader). */
enum tp_status tp_model_probe(const char *path, struct tp_model_probe *out, struct tp_error *err);

/* Hash of everything all ranks must agree on about the model. */
uint64_t tp_probe_hash(const struct tp_model_probe *pr);

#endif /* TP_PARALLEL_PROBE_H */

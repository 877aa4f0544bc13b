/*
 * parallel/parallel_impl.h - private to parallel/: the wire-compressed
 * all_sum hook (act_compress.c) and the tpserve shard-file keys
 * (probe.c, shard_file.c) shared by the executor and `tpserve shard`; the
 * model-file probe is public in parallel/probe.h.
 */
#ifndef TP_PARALLEL_IMPL_H
#define TP_PARALLEL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/parallel.h"
#include "parallel/probe.h"

#define TP_PARALLEL_MODULE "parallel"

/* -------------------------------------------------------- act_compress.c */

/*
 * The all_sum hook handed to the model (struct tp_model_shard.all_sum).
 * f32: tp_comm_all_sum in place.  f16 / bf16: convert, all_sum in that dtype
 * (comm reduces in f32, rounds once), convert back.  q8: every rank
 * quantizes its partial sums to blocks of 32 int8 + one f32 scale (36
 * bytes), all_gathers the blocks, and adds all ranks' dequantized values in
 * rank order, so every rank ends with the same bits.
 * Buffers are sized once for max_count floats (n_batch x n_embd).
 */
struct tp_wire {
    tp_comm_t *comm;
    enum tp_wire_dtype dtype;
    int world;
    size_t max_count;
    uint16_t *half;     /* (max_count) f16/bf16 staging */
    uint8_t *q8;        /* (world, n_blocks(max_count), 36) q8 gather area */
    uint64_t ns;        /* time inside the hook (comm + conversions) */
};
#define TP_WIRE_Q8_BLOCK 32
#define TP_WIRE_Q8_BYTES 36 /* 32 int8 + f32 scale */

enum tp_status tp_wire_init(struct tp_wire *w, tp_comm_t *comm, enum tp_wire_dtype dt, size_t max_count);
void tp_wire_release(struct tp_wire *w);
/* tp_model_all_sum_fn; ctx is a struct tp_wire. */
enum tp_status tp_wire_all_sum(void *ctx, float *buf, size_t count);
/* Quantize n floats into q8 blocks / add dequantized blocks into dst (exposed for tests). */
void tp_wire_q8_pack(const float *src, size_t n, uint8_t *dst);
void tp_wire_q8_add(float *dst, const uint8_t *src, size_t n);

/* ---------------------------------------------------------------- probe.c */

/* Shard-file metadata keys (written by tp_parallel_write_shards). */
#define TP_SHARD_KEY_RANK "tpserve.shard.rank"             /* u32 */
#define TP_SHARD_KEY_WORLD "tpserve.shard.world_size"      /* u32 */
#define TP_SHARD_KEY_WEIGHTS "tpserve.shard.weights"       /* string: "" (equal) or "2,1,1" */
#define TP_SHARD_KEY_PLAN "tpserve.shard.plan"             /* i32 array, 8 per rank (ranges) */
#define TP_SHARD_KEY_PLAN_HASH "tpserve.shard.plan_hash"   /* u64 tp_shard_plan_hash */
#define TP_SHARD_KEY_SOURCE "tpserve.shard.source"         /* string: file it was cut from */
/* mixture of experts only: */
#define TP_SHARD_KEY_MOE_SPLIT "tpserve.shard.moe_split"   /* string: "tensor" or "expert" */
#define TP_SHARD_KEY_EXPERTS "tpserve.shard.experts"       /* i32 array, 4 per rank: expert_begin, expert_end,
                                                            * shexp_begin, shexp_end */

/* How shard_file.c cuts GGUF tensor `name` for shard s: TP_SHARD_SLICE_NONE
 * (whole), _ROWS (rows [*a, *b), or elements of a 1-D bias) or _COLS
 * (columns [*a, *b) of every row). */
enum { TP_SHARD_SLICE_NONE = 0, TP_SHARD_SLICE_ROWS, TP_SHARD_SLICE_COLS };
int tp_shard_classify(const char *name, const struct tp_hparams *hp, const struct tp_model_shard *s, int64_t *a,
                      int64_t *b);
/* The tpserve.shard.* keys of rank's shard file into w (shard_file.c): rank,
 * world size, weights, the plan's 8 ranges per rank and its hash, source
 * (the model's file or directory name).  On failure err names path. */
struct tp_gguf_writer;
enum tp_status tp_shard_write_keys(struct tp_gguf_writer *w, const struct tp_shard_plan *plan, int rank,
                                   const char *weights, const char *source, const char *path, struct tp_error *err);
/* tp_parallel_write_shards for a Hugging Face directory (shard_hf.c): the same
 * GGUF shard files, written from the safetensors (plan already made). */
enum tp_status tp_shard_write_hf(const char *dir, const struct tp_model_probe *pr, const struct tp_shard_plan *plan,
                                 const char *weights, const char *out_dir, struct tp_error *err);

#endif /* TP_PARALLEL_IMPL_H */

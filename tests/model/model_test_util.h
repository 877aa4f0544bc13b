/*
 * tests/model/model_test_util.h - helpers shared by the model tests: synthetic
 * model files, opening them, and the float64 pieces of the naive reference
 * forward passes (test_forward_ref.c, test_moe.c).
 */
#ifndef TP_TESTS_MODEL_TEST_UTIL_H
#define TP_TESTS_MODEL_TEST_UTIL_H

#include <pthread.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"

/* What tm_synth writes: the shape named `shape` in shapes_json (NULL: the built-in shapes) with weights of
 * type (and mix), from seed; tokenizer: a tokenizer.json to take the vocabulary from (NULL: made up);
 * threads, layers: 0 for 1 and the shape's; hf: a Hugging Face / MLX directory instead of GGUF (MLX
 * scales in bf16 when mlx_bf16). */
struct tm_synth {
    const char *shapes_json, *shape, *tokenizer;
    enum tp_wtype type;
    enum tp_synth_mix mix;
    uint64_t seed;
    int threads, layers, hf, mlx_bf16;
};
/* Write w to out; TP_OK, or the writer's status with err filled and the reason printed. */
enum tp_status tm_synth(const struct tm_synth *w, const char *out, struct tp_error *err);
/* Write a synthetic model of the built-in shape `shape` to out: GGUF
 * (hf = 0) or a Hugging Face / MLX directory (hf = 1; MLX when type is an
 * MLX type, scales in bf16 when mlx_bf16).  0, or -1 after printing why. */
int tm_write_model(const char *shape, enum tp_wtype type, int hf, int mlx_bf16, uint64_t seed, const char *out);
/* A synthetic GGUF of the shape named shape_name in shapes_json (NULL: the
 * built-in shapes), in the test's temporary folder under a name made of the
 * arguments (tag: any suffix); the path is one of 8 static buffers used in
 * turn.  NULL after printing why. */
const char *tm_synth_gguf(const char *shapes_json, const char *shape_name, enum tp_wtype type, enum tp_synth_mix mix,
                          uint64_t seed, const char *tag);
/* Overwrite the F32 tensor blk.<l>.<suffix> of layers l < n_layer (at most 8) of the GGUF at path with v
 * everywhere.  0, or -1 when a tensor is missing, not F32, or the file cannot be written. */
int tm_fill_layer_f32(const char *path, int n_layer, const char *suffix, float v);
/* Open path with 1 thread and a 128-position context; NULL with e filled on failure. */
tp_model_t *tm_open_model(const char *path, struct tp_error *e);
/* Open path (one sequence) with the given threads, context, batch and shard (NULL: dense); NULL with err
 * filled on failure. */
tp_model_t *tm_open(const char *path, int threads, int n_ctx, int n_batch, const struct tp_model_shard *sh,
                    struct tp_error *err);
/* Open path (dense) with the given threads, context, sequences, batch and KV cache type; NULL with err filled
 * on failure. */
tp_model_t *tm_open_kv(const char *path, int threads, int n_ctx, int n_seq, int n_batch, enum tp_kv_type kv,
                       struct tp_error *err);
/* TM_F32_ATTN(fn) defines fn_f32_attn: case fn run on the float32 attention (the AVX-512 loop, or the best
 * below it), the limit restored after.  For suites that hold whole models to a float64 reference at ~1e-9:
 * the AMX-BF16 path, the default where the CPU has it, rounds q, k, p and v to bf16 (~1e-5 NMSE; checked on
 * its own in model.attn and model.attn_paths).  Needs model/forward/model_impl.h. */
#define TM_F32_ATTN(fn)                                                                                          \
    static void fn##_f32_attn(void)                                                                              \
    {                                                                                                            \
        const int prev_ = tp_attn_isa_limit(TP_ATTN_ISA_AVX512);                                                 \
        fn();                                                                                                    \
        tp_attn_isa_limit(prev_);                                                                                \
    }
/* Index of the largest of x[0..n) (the first on ties). */
int tm_argmax(const float *x, int n);

/* ---- the naive float64 reference ---- */
/* Dequantized copy of tensor `name` of g (all its elements, ne[0] fastest), malloc'd, its count in
 * *n_out (may be NULL); NULL when absent.  tm_deql: the tensor blk.<l>.<suffix>. */
float *tm_deq(tp_gguf_t *g, const char *name, int64_t *n_out);
float *tm_deql(tp_gguf_t *g, int l, const char *suffix);
/* y[rows] = W[rows x cols] x[cols] */
void tm_matvec(double *y, const float *w, const double *x, int rows, int cols);
/* y[n] = x / rms(x) * w with eps inside the root */
void tm_rmsnorm(double *y, const double *x, const float *w, int n, double eps);
/* Rotary embedding of one head of hd values at position pos: pairs (2i, 2i+1), or (i, i + hd/2) when neox;
 * frequency theta^(-2i/hd), divided by ff[i] when ff is not NULL. */
void tm_rope(double *x, int hd, int pos, double theta, const float *ff, int neox);
/* Normalized MSE of a against the reference b (n values). */
double tm_nmse(const float *a, const float *b, int n);


/* In-process two-rank all_sum for tp_model_shard.all_sum: each rank's hook
 * (ctx = struct tm_pair_rank) waits for the other and both get the sum. */
struct tm_pair {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, gen;
    float *buf[2], *tmp[2]; /* tmp: (n_tokens, n_embd) per rank, owned by tm_forward_pair */
};
struct tm_pair_rank {
    struct tm_pair *s;
    int rank;
};
void tm_pair_init(struct tm_pair *s);
void tm_pair_destroy(struct tm_pair *s);
enum tp_status tm_pair_all_sum(void *ctx, float *buf, size_t count);
/* Forward tok[0..n) at positions 0..n-1 (sequence 0, every row's logits) on
 * dense into ld (n x vocab) and on the two ranks m0, m1 of pair s at once
 * (two threads) into l0, l1 (n x each rank's vocab slice).  0, or -1 after
 * printing which forward failed. */
int tm_forward_pair(struct tm_pair *s, tp_model_t *dense, tp_model_t *m0, tp_model_t *m1, const int32_t *tok, int n,
                    float *ld, float *l0, float *l1);

/* The naive float64 reference forward pass of a Llama-family decoder (shape s, weights in g): q/k norms and
 * biases when present, rope (the rope_freqs tensor when present), causal attention over a sliding window of
 * `window` keys (0: all) with the sink logits sinks[l] of layers l < 4 (NULL: none), then the FFN: a
 * SwiGLU of ffn_gate / ffn_up / ffn_down, or ffn(ffn_ctx, layer, xb, out) (xb: the normed input, n_embd;
 * out: the block's output, n_embd; layer -1 after the last call: release what it holds). */
struct tm_ref {
    tp_gguf_t *g;
    struct tp_shape s;
    int neox, window;
    const float *sinks[4];
    void (*ffn)(void *ctx, int layer, const double *xb, double *out);
    void *ffn_ctx;
};
/* logits (n, n_vocab) for the tokens ids[0..n); hidden (may be NULL; n, n_embd): each token's final
 * hidden state after the output norm (what the output head multiplies). */
void tm_ref_forward(const struct tm_ref *r, const int *ids, int n, double *logits, double *hidden);

/* Two ranks in process (shards a and b, the vocabulary split at the same row in both, one thread for rank 0
 * and two for rank 1) against one rank, on the n tokens (i * 53 + 11) % V at positions 0..n-1 of the model
 * at path (context n_ctx): dense and sharded (n x V logits, rank 0's rows then rank 1's), malloc'd, freed by
 * tm_shard_run_free; smaller: rank 0 holds fewer weight bytes than the dense model.  0, or -1 after printing
 * what failed. */
struct tm_shard_run {
    int V;
    float *dense, *sharded;
    int smaller;
};
int tm_shard_pair_run(const char *path, int n_ctx, const struct tp_model_shard *a, const struct tp_model_shard *b, int n,
                      struct tm_shard_run *out);
void tm_shard_run_free(struct tm_shard_run *r);

#endif

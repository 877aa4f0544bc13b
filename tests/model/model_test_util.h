/*
 * tests/model/model_test_util.h - helpers shared by the model tests that
 * compare model files of one seed (tests/model/test_hf.c, test_mlx.c).
 */
#ifndef TP_TESTS_MODEL_TEST_UTIL_H
#define TP_TESTS_MODEL_TEST_UTIL_H

#include <pthread.h>
#include <stdint.h>

#include "model/model.h"

/* Write a synthetic model of the built-in shape `shape` to out: GGUF
 * (hf = 0) or a Hugging Face / MLX directory (hf = 1; MLX when type is an
 * MLX type, scales in bf16 when mlx_bf16).  0, or -1 after printing why. */
int tm_write_model(const char *shape, enum tp_wtype type, int hf, int mlx_bf16, uint64_t seed, const char *out);
/* Open path with 1 thread and a 128-position context; NULL with e filled on failure. */
tp_model_t *tm_open_model(const char *path, struct tp_error *e);
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

#endif

/*
 * tests/model/model_test_util.h - helpers shared by the model tests that
 * compare model files of one seed (tests/model/test_hf.c, test_mlx.c).
 */
#ifndef TP_TESTS_MODEL_TEST_UTIL_H
#define TP_TESTS_MODEL_TEST_UTIL_H

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

#endif

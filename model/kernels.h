/*
 * model/kernels.h - private: matrix kernels for every weight type, with a
 * scalar reference and SIMD versions (AVX2, AVX-512/VNNI, NEON/dotprod)
 * chosen once at run time.
 *
 * Layout: a weight matrix is `rows` rows of `cols` elements (ggml order:
 * ne0 = cols is contiguous); each row is cols/block_elems blocks in the exact
 * GGUF layout.  Quantized types compute against activations quantized to 8
 * bits (tp_kern_prepare_act: Q8_0-style 32-value blocks with f32 scales for
 * Q4_0/Q8_0, ggml's Q8_K for the K-quants; the layout is private, size it
 * with tp_kern_act_row_bytes); float types use f32 activations.  The caller
 * (forward pass) splits rows over threads; every function here is
 * thread-safe except the tp_kern_force_* test hooks.
 *
 * Types: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K (tp_wtype_supported).
 * Decode (n_tok = 1) streams each weight row once; prefill tiles rows x
 * tokens so an unpacked weight block serves several tokens; F32 with >= 8
 * tokens goes to BLAS sgemm (single-threaded) unless our AVX-512 tile is
 * faster (it is against OpenBLAS on Zen 5).
 */
#ifndef TP_MODEL_KERNELS_H
#define TP_MODEL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* Bytes of one weight row of n elements (n a multiple of the block size). */
size_t tp_kern_row_bytes(enum tp_wtype t, int64_t n);

/* Bytes needed for one activation row of n elements prepared for weights of type wt. */
size_t tp_kern_act_row_bytes(enum tp_wtype wt, int64_t n);
/* Prepare (quantize or copy) one activation row x[n] into xq for weights of type wt. */
void tp_kern_prepare_act(enum tp_wtype wt, const float *x, void *xq, int64_t n);

/*
 * y[t * y_stride + r] = dot(W[r, :], x[t, :]) for r in [r0, r1), t in [0, n_tok).
 *   w        weight matrix base (row r at w + r * w_row_bytes)
 *   xq       n_tok prepared activation rows, xq_row_bytes apart
 *   n_cols   elements per row
 * Scalar and SIMD versions give the same result up to float rounding.
 */
void tp_kern_matmul(enum tp_wtype wt, const void *w, size_t w_row_bytes, int64_t n_cols, const void *xq,
                    size_t xq_row_bytes, int n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1);

/* Dequantize n elements (whole blocks) of type t to f32. */
void tp_kern_dequant(enum tp_wtype t, const void *src, float *dst, int64_t n);
/* Quantize n f32 values (whole blocks) to type t (reference quantizer; used by
 * synth and tests).  Returns bytes written. */
size_t tp_kern_quantize(enum tp_wtype t, const float *src, void *dst, int64_t n);

/* Name of the instruction set chosen at run time ("avx512-vnni", "avx2", "neon-dotprod", "scalar"). */
const char *tp_kern_isa(void);
/* Force the scalar reference (tests); 0 restores automatic choice. */
void tp_kern_force_scalar(int on);
/* The instruction sets this CPU can run, index 0 = "scalar", last = the default. */
int tp_kern_isa_count(void);
const char *tp_kern_isa_name(int i); /* NULL when out of range */
/* Use the named one (tests, benchmarks); NULL or "" restores the default.
 * TP_ERR_UNSUPPORTED when this CPU/build lacks it.  Process-wide. */
enum tp_status tp_kern_force_isa(const char *name);

#endif /* TP_MODEL_KERNELS_H */

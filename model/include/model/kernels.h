/*
 * model/include/model/kernels.h - matrix kernels for every weight type, with a
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
 * Types: F32, F16, BF16, Q8_0, Q4_0, MXFP4 (its activations are Q8_0's), Q4_K, Q5_K, Q6_K
 * (tp_wtype_supported), the MLX affine types through tp_kern_matmul_mlx, and
 * Q4_0, Q8_0 and the K-quants re-laid 16 rows at a time ("x16") through
 * tp_kern_matmul_x16 (both below).
 * Decode (n_tok = 1) streams each weight row once; prefill tiles rows x
 * tokens so an unpacked weight block serves several tokens; F32 with >= 8
 * tokens goes to BLAS sgemm (single-threaded), or to our own tile on
 * AVX-512 CPUs (except with Accelerate).
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
/* The weight type whose prepared activations serve weights of type wt too (the same bytes): Q4_K for
 * every K-quant, F32 for F16 and BF16, wt itself otherwise.  One prepared row serves a whole class. */
enum tp_wtype tp_kern_act_class(enum tp_wtype wt);
/* Values per activation block for weights of type wt: the prepared bytes of a row's blocks [b0, b1)
 * depend on its values [b0 B, b1 B) alone, so threads can prepare one row's blocks apart
 * (tp_kern_prepare_act_blocks); 0 for the types whose rows are prepared whole (MLX). */
int64_t tp_kern_act_block(enum tp_wtype wt);
/* Blocks [b0, b1) of the activation row xq (n values, prepared for wt as tp_kern_prepare_act would) from
 * x[n]: the same bytes tp_kern_prepare_act writes there, no other byte of xq touched.  scratch: caller's,
 * tp_kern_act_row_bytes(wt, n) bytes. */
void tp_kern_prepare_act_blocks(enum tp_wtype wt, const float *x, void *xq, int64_t n, int64_t b0, int64_t b1,
                                void *scratch);

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

/* ------------------------------------------------ MLX affine types
 * TP_WTYPE_MLX_*: the matrix is three arrays (kernels_mlx_impl.h has the
 * exact layout): packed uint32 words (row r at w + r * w_row_bytes, the
 * row's cols * bits / 8 bytes) and per-group scales and biases described by
 * struct tp_kern_groups.  Activations are prepared with tp_kern_prepare_act
 * for the same type.  tp_kern_matmul / tp_kern_dequant / tp_kern_quantize do
 * not take these types (they would have no scales): use the functions below. */
struct tp_kern_groups {
    const void *scales; /* (rows, cols / group) fp16 or bf16; row r at scales + r * row_bytes */
    const void *biases; /* (rows, cols / group), same type and row stride */
    size_t row_bytes;   /* stride of both */
    int bf16;           /* 0: fp16, 1: bf16 */
};
/* tp_kern_matmul for an MLX type (same contract, plus g). */
void tp_kern_matmul_mlx(enum tp_wtype wt, const void *w, size_t w_row_bytes, const struct tp_kern_groups *g,
                        int64_t n_cols, const void *xq, size_t xq_row_bytes, int n_tok, float *y, int64_t y_stride,
                        int64_t r0, int64_t r1);
/* Dequantize one row of n elements: packed words w_row, its scales/biases rows. */
void tp_kern_dequant_mlx(enum tp_wtype t, const void *w_row, const void *scales_row, const void *biases_row, int bf16,
                         float *dst, int64_t n);
/* Quantize one row of n floats as mlx.core.quantize does (per group: the
 * edge of larger magnitude exact, scale (max - min) / (2^bits - 1), q rounded
 * and clipped), writing n * bits / 8 bytes of words and n / group scales and
 * biases as fp16 (bf16 = 0) or bf16. */
void tp_kern_quantize_mlx(enum tp_wtype t, const float *src, void *w_row, uint16_t *scales_row, uint16_t *biases_row,
                          int bf16, int64_t n);

/* ------------------------------------------------ "x16" layouts
 * Q4_0, Q8_0, Q4_K, Q5_K and Q6_K matrices re-laid 16 rows at a time so a
 * SIMD kernel holds one row per vector lane without gathering bytes (layout
 * in kernels_impl.h: every field of the 16 rows' blocks side by side, the
 * K-quants' super-block scales and mins included).  Same bytes per group of
 * 16 rows as the row-major form; a ragged last group is padded to 16 rows
 * (repeats of the last row), so the buffer holds tp_kern_x16_bytes(rows,
 * row_bytes).  The model repacks its matrices of type t at load when
 * tp_kern_x16_native(t); tp_kern_matmul_x16 has the tp_kern_matmul contract
 * (rows r0..r1, any alignment, activations from tp_kern_prepare_act for t)
 * and runs on every ISA (scalar reference where there is no x16 kernel).
 * t: a type for which tp_kern_x16_type(t). */
int tp_kern_x16_type(enum tp_wtype t);   /* t has an x16 layout */
int tp_kern_x16_native(enum tp_wtype t); /* the chosen ISA has an x16 kernel for t */
size_t tp_kern_x16_bytes(int64_t rows, size_t row_bytes);
/* Groups [g0, g1) of src (rows x row_bytes, row-major) into dst (x16). */
void tp_kern_repack_x16(enum tp_wtype t, const void *src, size_t row_bytes, int64_t rows, void *dst, int64_t g0,
                        int64_t g1);
/* Row r of an x16 matrix back in the GGUF row layout (row_bytes bytes). */
void tp_kern_unpack_x16_row(enum tp_wtype t, const void *w, size_t row_bytes, int64_t r, void *dst_row);
void tp_kern_matmul_x16(enum tp_wtype t, const void *w, size_t w_row_bytes, int64_t n_cols, const void *xq,
                        size_t xq_row_bytes, int n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1);

/* Name of the instruction set chosen at run time ("avx512-vnni", "avx2-vnni", "avx2", "neon-dotprod", "scalar"). */
const char *tp_kern_isa(void);
/* Force the scalar reference (tests); 0 restores automatic choice. */
void tp_kern_force_scalar(int on);
/* The attention path chosen at run time: "amx" (AMX-BF16 tiles, bf16 operands, float32 sums) where the CPU
 * and kernel allow it, else "avx512bf16" (AVX512_BF16 vector products, bf16 operands, float32 sums), else
 * "avx512", "avx2", "c" (float32); the TP_ATTN_ISA environment variable caps the choice (TP_ATTN_ISA=avx512:
 * float32 throughout).  Heads whose size is not a multiple of 32 (amx, avx512bf16) or 16 (avx512) take the
 * next path. */
const char *tp_kern_attn_isa(void);
/* For benchmarks: the tiled attention kernel on random data, on the calling thread: nt consecutive query
 * positions x ng query heads sharing one KV head of head_dim hd (nt x ng <= 1024 rows), attending causally
 * to the n_keys cached positions of a `kv` cache (the last query at position n_keys - 1); path "amx",
 * "avx512bf16", "avx512", "avx2" or "c" (TP_ERR_UNSUPPORTED when this CPU or build lacks it); one warm-up
 * call, then reps timed calls.  stream_mib 0: one cache, read from the CPU's caches after the warm-up;
 * else copies of it totalling at least stream_mib MiB, the calls going through them in turn, so that each
 * reads its keys and values from memory as a long decode does.  *cpu_s / *wall_s: thread CPU / wall
 * seconds of the fastest timed call by each clock; *flop: FLOPs per call (4 x hd x ng x keys the rows
 * see).  TP_ERR_INVALID_ARG for an unknown path or a bad shape (hd a multiple of 8, and of 32 for q8_0
 * rows unless 16 or 8 divide it; stream_mib 0..2^30), TP_ERR_NOMEM.  Not while a forward pass runs (the
 * path choice is process-wide). */
enum tp_status tp_kern_attn_time(const char *path, enum tp_kv_type kv, int hd, int nt, int ng, int n_keys, int reps,
                                 int stream_mib, double *cpu_s, double *wall_s, double *flop);
/* Where the decode paths request the data they read next from memory (the AVX-512 x16 matmuls' weights, in
 * their decode and batch passes, and the attention's next K and V rows): TP_KERN_PF_L1 (_MM_HINT_T0)
 * or TP_KERN_PF_L2 (_MM_HINT_T1: into L2, leaving L1's miss buffers to the loads).  Chosen once per
 * process with the ISA: L2 on AMD family 19h (Zen 3 / Zen 4), L1 elsewhere (kernels.c says what was
 * measured); TP_KERN_PREFETCH=l1|l2 in the environment pins one.  Results are the same either way. */
enum tp_kern_prefetch { TP_KERN_PF_L1, TP_KERN_PF_L2 };
enum tp_kern_prefetch tp_kern_prefetch(void);
const char *tp_kern_prefetch_name(enum tp_kern_prefetch p); /* "l1" or "l2" */
/* Use "l1" or "l2" (tests, benchmarks); NULL or "" restores the default.  TP_ERR_INVALID_ARG for any other
 * name.  Process-wide; not while a forward pass runs. */
enum tp_status tp_kern_force_prefetch(const char *name);
/* The instruction sets this CPU can run, index 0 = "scalar", last = the default. */
int tp_kern_isa_count(void);
const char *tp_kern_isa_name(int i); /* NULL when out of range */
/* Use the named one (tests, benchmarks); NULL or "" restores the default.
 * TP_ERR_UNSUPPORTED when this CPU/build lacks it.  Process-wide. */
enum tp_status tp_kern_force_isa(const char *name);

#endif /* TP_MODEL_KERNELS_H */

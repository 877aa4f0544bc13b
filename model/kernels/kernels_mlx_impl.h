/*
 * model/kernels/kernels_mlx_impl.h - private to the kernels_mlx*.c files (and the
 * ISA table in kernels.c): the exact layout of MLX affine-quantized weights,
 * of the activation rows prepared for them ("m8"), and the per-ISA entry
 * points.
 *
 * MLX affine quantization (mlx.core.quantize, as mlx-community safetensors
 * hold it), for a matrix of `rows` x `cols` with `bits` in {4, 8} and group
 * size G in {32, 64}:
 *   weight  uint32 [rows, cols * bits / 32]: element j of a word sits at bits
 *           [j * bits, (j + 1) * bits), so on a little-endian host byte i of a
 *           row holds elements 2i (low nibble) and 2i + 1 (high nibble) for
 *           4 bits, element i for 8 bits; q is unsigned, 0 .. 2^bits - 1;
 *   scales, biases  fp16 or bf16 [rows, cols / G];
 *   w[r][c] = scales[r][c / G] * q[r][c] + biases[r][c / G].
 * Kernels read exactly these bytes (no repacking).
 *
 * Prepared activation row ("m8") for an MLX type, n elements (n a multiple
 * of G), nb = n / 32 blocks, ng = n / G groups:
 *   int8_t qs[n]     x ~= d[b] * qs, d[b] = amax(block b) / 127, round half even;
 *                    4-bit types store each 32-block permuted to the nibble
 *                    order of the packed bytes: positions 0..15 hold the
 *                    block's elements 0, 2, .., 30 and positions 16..31 its
 *                    elements 1, 3, .., 31 (so low nibbles of 16 weight bytes
 *                    meet positions 0..15 and high nibbles 16..31);
 *   float   d[nb]
 *   float   ms[ng]   ms[g] = sum over the blocks b of group g of d[b] * sum(qs of b),
 *                    the group's sum of the (quantized) activation.
 * A row's dot is then, exactly as the hint of w = s q + b suggests,
 *   y = sum_g scale_g * (sum_{b in g} d[b] * isum_b(q, qs)) + bias_g * ms[g],
 * with isum_b an exact integer dot.  Using the quantized activation in both
 * terms keeps the error that of (w) x (quantized x); mixing an exact float
 * sum into the bias term would leave s * q * e_x uncancelled.
 * Kernels whose integer dot wants signed weights (AVX2 vpmaddubsw and NEON for
 * 8 bits) use q - 128 and add 128 * sum_g scale_g * ms[g] once per row.
 */
#ifndef TP_MODEL_KERNELS_MLX_IMPL_H
#define TP_MODEL_KERNELS_MLX_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels_impl.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the MLX kernels read packed little-endian uint32 words byte by byte: little-endian hosts only"
#endif

#define TP_M8_BLK 32 /* activation block */

#define TP_M8_ROW_BYTES(n, g) ((size_t)(n) + (size_t)((n) / TP_M8_BLK) * sizeof(float) + (size_t)((n) / (g)) * sizeof(float))
#define TP_M8_QS(row) ((const int8_t *)(row))
#define TP_M8_D(row, n) ((const float *)((const char *)(row) + (n)))
#define TP_M8_MS(row, n) ((const float *)((const char *)(row) + (n) + (size_t)((n) / TP_M8_BLK) * sizeof(float)))

/* Position of element i (0..31) of a 32-block in a 4-bit m8 row. */
#define TP_M8_POS4(i) (((i) & 1) ? 16 + ((i) >> 1) : ((i) >> 1))

/* Variant index of an MLX type: 0 q4 g32, 1 q4 g64, 2 q8 g32, 3 q8 g64; -1 otherwise. */
int tp_kern_mlx_variant(enum tp_wtype t);

/* Fill ops->mlx[] for the ISA named isa ("scalar", "avx2", "avx512-vnni",
 * "neon", "neon-dotprod"); unknown names fill nothing.  kernels_mlx.c */
void tp_kern_mlx_ops(const char *isa, struct tp_kern_ops *ops);
/* The m8 quantizer (one implementation for every ISA).  kernels_mlx.c */
size_t tp_kern_mlx_act_row_bytes(enum tp_wtype wt, int64_t n);
void tp_kern_mlx_prepare_act(enum tp_wtype wt, const float *x, void *xq, int64_t n);

#if defined(__x86_64__) || defined(_M_X64)
void tp_kern_mlx_avx2_ops(struct tp_kern_ops *ops);   /* kernels_mlx_avx2.c */
void tp_kern_mlx_avx512_ops(struct tp_kern_ops *ops); /* kernels_mlx_avx512.c */
#endif
#if defined(__aarch64__)
void tp_kern_mlx_neon_ops(struct tp_kern_ops *ops);    /* kernels_mlx_neon.c */
void tp_kern_mlx_neondot_ops(struct tp_kern_ops *ops); /* kernels_mlx_neondot.c */
#endif

#endif /* TP_MODEL_KERNELS_MLX_IMPL_H */

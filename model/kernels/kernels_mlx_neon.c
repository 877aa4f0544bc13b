/*
 * model/kernels/kernels_mlx_neon.c - arm64 NEON kernels for the MLX affine types
 * without the dot-product extension (ARMv8.0 baseline); the template is
 * kernels_mlx_neon_impl.h.
 */
#if defined(__aarch64__)
#define KMN_ATTR /* baseline NEON: every arm64 CPU has it */
#define KMN_DOT 0
#include "kernels/kernels_mlx_neon_impl.h"

void tp_kern_mlx_neon_ops(struct tp_kern_ops *ops) { kmn_fill_ops(ops); }
#else
typedef int tp_kernels_mlx_neon_unused; /* ISO C forbids an empty translation unit */
#endif

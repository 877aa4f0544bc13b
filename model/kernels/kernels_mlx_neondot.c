/*
 * model/kernels/kernels_mlx_neondot.c - arm64 NEON kernels for the MLX affine types
 * with the ARMv8.2 dot-product extension (sdot), offered when kernels.c
 * offers "neon-dotprod" (HWCAP_ASIMDDP, every Apple arm64 core); the
 * template is kernels_mlx_neon_impl.h.  Same compiler rules as
 * kernels_neondot.c: without a way to build sdot, nothing is filled (that
 * ISA is then not offered at all).
 */
#if defined(__aarch64__) && (defined(__ARM_FEATURE_DOTPROD) || !defined(__clang__))
#if defined(__ARM_FEATURE_DOTPROD)
#define KMN_ATTR
#elif defined(__clang__)
#define KMN_ATTR __attribute__((target("dotprod")))
#else
#define KMN_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define KMN_DOT 1
#include "kernels/kernels_mlx_neon_impl.h"

void tp_kern_mlx_neondot_ops(struct tp_kern_ops *ops) { kmn_fill_ops(ops); }
#elif defined(__aarch64__)
#include "kernels/kernels_mlx_impl.h"
void tp_kern_mlx_neondot_ops(struct tp_kern_ops *ops) { (void)ops; }
#else
typedef int tp_kernels_mlx_neondot_unused; /* ISO C forbids an empty translation unit */
#endif

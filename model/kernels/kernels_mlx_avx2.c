/*
 * model/kernels/kernels_mlx_avx2.c - AVX2 + FMA + F16C kernels for the MLX affine
 * types (x86-64), chosen at run time with the rest of the AVX2 kernels; the
 * code is the template in kernels_mlx_x86_impl.h (vpmaddubsw dots, a 2-row x
 * 4-token register tile).
 */
#if defined(__x86_64__) || defined(_M_X64)
#define KM_TARGET "avx2,fma,f16c"
#define KM_512 0
#define KM_MR 2
#define KM_NT 4
#include "kernels/kernels_mlx_x86_impl.h"

void tp_kern_mlx_avx2_ops(struct tp_kern_ops *ops) { km_fill_ops(ops); }
#else
typedef int tp_kernels_mlx_avx2_unused; /* ISO C forbids an empty translation unit */
#endif

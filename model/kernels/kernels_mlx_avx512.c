/*
 * model/kernels/kernels_mlx_avx512.c - AVX-512 (F/BW/VL) + VNNI kernels for the MLX
 * affine types (x86-64), chosen at run time with the rest of the AVX-512
 * kernels; the 512-bit half of kernels_mlx_x86_impl.h (two 32-value blocks
 * per zmm, vpdpbusd on the unsigned q, a 4-row x 4-token tile).
 */
#if defined(__x86_64__) || defined(_M_X64)
#define KM_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define KM_512 1
#define KM_MR 4
#define KM_NT 4
#include "kernels/kernels_mlx_x86_impl.h"

void tp_kern_mlx_avx512_ops(struct tp_kern_ops *ops) { km_fill_ops(ops); }
#else
typedef int tp_kernels_mlx_avx512_unused; /* ISO C forbids an empty translation unit */
#endif

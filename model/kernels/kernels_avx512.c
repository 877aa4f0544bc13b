/*
 * model/kernels/kernels_avx512.c - AVX-512 (F/BW/VL) + VNNI kernels (x86-64), chosen
 * at run time when the CPU has them.  The 512-bit half of the template in
 * kernels_x86_impl.h: two 32-value blocks per zmm register, integer dots as
 * single vpdpbusd instructions; several tokens in the 16-row lane-transposed
 * kernel (kx_qbatch), float weights in a 4-row x 4-token tile.
 */
#if defined(__x86_64__) || defined(_M_X64)
#define KX_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define KX_512 1
#define KX_MR 4
#define KX_NT 4
#include "kernels/kernels_x86_impl.h"

void tp_kern_avx512_ops(struct tp_kern_ops *ops)
{
    kx_fill_ops(ops);
    tp_kern_x16_avx512_ops(ops);  /* Q4_0 / Q8_0 in the 16-row layout: kernels_x16_avx512.c */
    tp_kern_kx16_avx512_ops(ops); /* the K-quants in it: kernels_kx16_avx512.c */
}
#else
typedef int tp_kernels_avx512_unused; /* ISO C forbids an empty translation unit */
#endif

/*
 * model/kernels/kernels_avx2.c - AVX2 + FMA + F16C kernels (x86-64), chosen at run
 * time when the CPU has them; the code is the template in kernels_x86_impl.h
 * with vpmaddubsw/vpmaddwd integer dots and a 2-row x 4-token register tile
 * (16 ymm registers).
 */
#if defined(__x86_64__) || defined(_M_X64)
#define KX_TARGET "avx2,fma,f16c"
#define KX_512 0
#define KX_MR 2
#define KX_NT 4
#include "kernels/kernels_x86_impl.h"

void tp_kern_avx2_ops(struct tp_kern_ops *ops)
{
    kx_fill_ops(ops);
    tp_kern_x16_avx2_ops(ops); /* every x16 layout: kernels_x16_avx2.c */
}
#else
typedef int tp_kernels_avx2_unused; /* ISO C forbids an empty translation unit */
#endif

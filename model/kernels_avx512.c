/*
 * model/kernels_avx512.c - AVX-512 (F/BW/VL) + VNNI kernels (x86-64), chosen
 * at run time when the CPU has them.  Same template as AVX2
 * (kernels_x86_impl.h) but integer dots are single vpdpbusd instructions on
 * 256-bit EVEX registers and the 32 vector registers hold a 4-row x 4-token
 * tile.  (On Zen 4, 512-bit ops are double-pumped 256-bit ones, so ymm width
 * costs nothing there.)
 */
#if defined(__x86_64__) || defined(_M_X64)
#define KX_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define KX_VNNI 1
#define KX_MR 4
#define KX_NT 4
#include "model/kernels_x86_impl.h"

void tp_kern_avx512_ops(struct tp_kern_ops *ops) { kx_fill_ops(ops); }
#else
typedef int tp_kernels_avx512_unused; /* ISO C forbids an empty translation unit */
#endif

/*
 * model/kernels/kernels_kquant_avx2.c - AVX2 (+FMA, F16C) K-quant kernels (x86-64);
 * the code is the template in kernels_kquant_x86_impl.h.
 */
#if defined(__x86_64__) || defined(_M_X64)
#define KQ_TARGET "avx2,fma,f16c"
#define KQ_FILL tp_kern_kquant_avx2_ops
#include "kernels/kernels_kquant_x86_impl.h"
#else
typedef int tp_kernels_kquant_avx2_unused; /* ISO C forbids an empty translation unit */
#endif

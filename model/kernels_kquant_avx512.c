/*
 * model/kernels_kquant_avx512.c - K-quant kernels for AVX-512 CPUs (x86-64):
 * the template in kernels_kquant_x86_impl.h compiled with AVX-512F/BW/VL
 * enabled, so the compiler has 32 vector registers (EVEX encoding) and an
 * unpacked 256-value super-block plus its scales stays in registers.
 */
#if defined(__x86_64__) || defined(_M_X64)
#define KQ_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl"
#define KQ_FILL tp_kern_kquant_avx512_ops
#include "model/kernels_kquant_x86_impl.h"
#else
typedef int tp_kernels_kquant_avx512_unused; /* ISO C forbids an empty translation unit */
#endif

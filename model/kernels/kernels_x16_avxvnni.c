/*
 * model/kernels/kernels_x16_avxvnni.c - AVX-VNNI matmul for every x16 layout (Q4_0,
 * Q8_0, MXFP4, Q4_K, Q5_K, Q6_K): the template kernels_x16_tmpl_impl.h with one ymm per
 * 8 rows, as kernels_x16_avx2.c, for CPUs with the VEX-encoded vpdpbusd / vpdpwssd but
 * no AVX-512 (Intel Alder Lake and later client cores, Sierra Forest): each 4-byte dot
 * per lane is one vpdpbusd where AVX2 takes vpmaddubsw + vpmaddwd + vpaddd; Q8_0's
 * signed weights go through vpsignb first (|w| x sign-adjusted a).  The row-major
 * kernels stay AVX2's (the "avx2-vnni" ISA in kernels.c).
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <string.h>

#include "kernels/kernels_impl.h"

#define KV_FN static inline __attribute__((always_inline, target("avx2,fma,f16c,avxvnni")))
#define KV_OUT static __attribute__((target("avx2,fma,f16c,avxvnni")))
#define KV_BT 4
#define KV_FILL tp_kern_x16_avxvnni_ops
/* Decode: one group at a time, the groups in memory order, no software prefetch (the template says
 * why; as kernels_x16_avx2.c, where it was measured). */
#define KV_DSTREAMS_A8 1
#define KV_DSTREAMS_K 1

#include "kernels/kernels_x16_avx2_kv_impl.h"

KV_FN kvi kv_dpb(kvi acc, kvi w, const void *a) { return _mm256_dpbusd_avx_epi32(acc, w, kv_bc(a)); }
KV_FN kvi kv_dpbs(kvi acc, kvi w, const void *a)
{
    return _mm256_dpbusd_avx_epi32(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(kv_bc(a), w));
}
KV_FN kvi kv_dpwd(kvi acc, kvi w, const int16_t *p) { return _mm256_dpwssd_avx_epi32(acc, w, kv_bc(p)); }

#include "kernels/kernels_x16_tmpl_impl.h"
#else
typedef int tp_kernels_x16_avxvnni_unused; /* ISO C forbids an empty translation unit */
#endif

/*
 * model/kernels/kernels_x16_avx2.c - AVX2 (+FMA, F16C) matmul for every x16 layout
 * (Q4_0, Q8_0, MXFP4, Q4_K, Q5_K, Q6_K): the template kernels_x16_tmpl_impl.h with
 * one ymm per 8 rows.  AVX2 has no vpdpbusd: a 4-byte dot per lane is
 * vpmaddubsw (u8 x s8 -> i16 pairs, exact for weights <= 63 against |a| <=
 * 127) then vpmaddwd against ones; Q8_0's signed weights go through
 * vpsignb first (|w| x sign-adjusted a, at most 2 * 128 * 127 per pair).
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <string.h>

#include "kernels/kernels_impl.h"

#define KV_FN static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define KV_OUT static __attribute__((target("avx2,fma,f16c")))
#define KV_BT 4
#define KV_FILL tp_kern_x16_avx2_ops
/* Decode: one group at a time, the groups in memory order (one weight stream for the hardware
 * prefetcher), no software prefetch (the template says why).  Measured by scripts/decode_ab
 * (docs/performance.md): against 4 groups side by side (Q4_0, Q8_0) or 2 (the K-quants), 1.15-1.18x
 * and 1.32-1.57x at one thread, 1.14-1.15x and 1.40-1.83x at two, with a software prefetch; without
 * it, 1.01-1.43x more at one thread and 1.02-1.24x at two. */
#define KV_DSTREAMS_A8 1
#define KV_DSTREAMS_K 1

#include "kernels/kernels_x16_avx2_kv_impl.h"

KV_FN kvi kv_dpb(kvi acc, kvi w, const void *a)
{
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, kv_bc(a)), _mm256_set1_epi16(1)));
}
KV_FN kvi kv_dpbs(kvi acc, kvi w, const void *a)
{
    const kvi x = kv_bc(a);
    const kvi p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
KV_FN kvi kv_dpwd(kvi acc, kvi w, const int16_t *p) { return _mm256_add_epi32(acc, _mm256_madd_epi16(w, kv_bc(p))); }
/* The K-quants' sub-block dots summed in i16 and scaled by one vpmaddwd per run of slices
 * (the template's KV_I16): 1 instruction per slice and token where kv_dpb takes 3. */
#define KV_I16 1
KV_FN kvi kv_mb16(kvi w, const void *a) { return _mm256_maddubs_epi16(w, kv_bc(a)); }
KV_FN kvi kv_add16(kvi a, kvi b) { return _mm256_add_epi16(a, b); }
KV_FN kvi kv_add32(kvi a, kvi b) { return _mm256_add_epi32(a, b); }
KV_FN kvi kv_madd16(kvi a, kvi b) { return _mm256_madd_epi16(a, b); }

#include "kernels/kernels_x16_tmpl_impl.h"
#else
typedef int tp_kernels_x16_avx2_unused; /* ISO C forbids an empty translation unit */
#endif

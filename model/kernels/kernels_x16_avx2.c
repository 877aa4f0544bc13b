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
/* Decode: groups side by side, each prefetched ahead (the template says how far).  Measured by
 * scripts/decode_ab (docs/performance.md): the K-quants, with more live registers per group, were
 * faster with 2 than with 4 in the 16 ymm; Q4_0 / Q8_0 with 4. */
#define KV_DSTREAMS_A8 4
#define KV_DSTREAMS_K 2
#define kv_prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

typedef __m256i kvi;
typedef __m256 kvf;

KV_FN kvi kv_ld(const char *p) { return _mm256_loadu_si256((const __m256i *)p); }
KV_FN kvi kv_and(kvi a, kvi b) { return _mm256_and_si256(a, b); }
KV_FN kvi kv_b8(int c) { return _mm256_set1_epi8((char)c); }
KV_FN kvi kv_b32(int32_t c) { return _mm256_set1_epi32(c); }
KV_FN kvi kv_zero(void) { return _mm256_setzero_si256(); }
KV_FN kvi kv_srl16(kvi v, int n) { return _mm256_srli_epi16(v, n); }
KV_FN kvi kv_sll16(kvi v, int n) { return _mm256_slli_epi16(v, n); }
KV_FN kvi kv_sra16(kvi v, int n) { return _mm256_srai_epi16(v, n); }
KV_FN kvi kv_srl32(kvi v, int n) { return _mm256_srli_epi32(v, n); }
KV_FN kvi kv_sll32(kvi v, int n) { return _mm256_slli_epi32(v, n); }
KV_FN kvi kv_sra32(kvi v, int n) { return _mm256_srai_epi32(v, n); }
KV_FN kvi kv_bsel(kvi b, kvi m, kvi c) { return _mm256_or_si256(_mm256_and_si256(b, m), c); }
KV_FN kvi kv_bc(const void *a)
{
    int32_t v;
    memcpy(&v, a, sizeof v);
    return _mm256_set1_epi32(v);
}
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
KV_FN kvi kv_lut(kvi v)
{
    static const int8_t k_table_u[16] = {16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4};
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k_table_u)), v);
}
KV_FN kvf kv_e8m0(const char *p) /* e >= 2: (e - 1) << 23; e < 2: the subnormal 0x00200000 << e */
{
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(small, big, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1))));
}
KV_FN kvf kv_cvt(kvi v) { return _mm256_cvtepi32_ps(v); }
KV_FN kvf kv_h2f(const char *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
KV_FN kvf kv_setf(float f) { return _mm256_set1_ps(f); }
KV_FN kvf kv_fzero(void) { return _mm256_setzero_ps(); }
KV_FN kvf kv_mul(kvf a, kvf b) { return _mm256_mul_ps(a, b); }
KV_FN kvf kv_fma(kvf a, kvf b, kvf c) { return _mm256_fmadd_ps(a, b, c); }
KV_FN kvf kv_fnma(kvf a, kvf b, kvf c) { return _mm256_fnmadd_ps(a, b, c); }
KV_FN void kv_stf(float *o, kvf v) { _mm256_storeu_ps(o, v); }

#include "kernels/kernels_x16_tmpl_impl.h"
#else
typedef int tp_kernels_x16_avx2_unused; /* ISO C forbids an empty translation unit */
#endif

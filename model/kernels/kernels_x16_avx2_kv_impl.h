/*
 * model/kernels/kernels_x16_avx2_kv_impl.h - private: the x16 template's vector interface
 * (kernels_x16_tmpl_impl.h) on one ymm per 8 rows, shared by the AVX2 and the AVX-VNNI
 * kernels (kernels_x16_avx2.c, kernels_x16_avxvnni.c).  The including file defines KV_FN
 * (its target attributes) first, and its own 4-byte dots (kv_dpb, kv_dpbs, kv_dpwd) after.
 */
#ifndef TP_KERNELS_X16_AVX2_KV_IMPL_H
#define TP_KERNELS_X16_AVX2_KV_IMPL_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

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

#endif

/*
 * model/kernels/kernels_x86_rows16_impl.h - private: the two steps with which the
 * AVX-512 small-batch kernels that hold 16 weight rows in the lanes of a zmm
 * (kernels_x86_impl.h kx_qbatch, kernels_mlx_x86_impl.h km_batch) turn 16
 * row-major rows into lane order.  Included by those templates inside their
 * 512-bit sections, after they define KFN (static inline, always_inline, with
 * their target attribute).
 */
#ifndef TP_MODEL_KERNELS_X86_ROWS16_IMPL_H
#define TP_MODEL_KERNELS_X86_ROWS16_IMPL_H

#include <immintrin.h>
#include <stddef.h>

/* 16 rows' 16-byte slices at p + ro[k] (row k of the group): 4 zmm, each 4 rows (one per 128-bit lane). */
KFN void tp_rows16_load(const void *p, const size_t ro[16], __m512i z[4])
{
    const char *c = p;
    for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(c + ro[4 * k])));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + ro[4 * k + 1])), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + ro[4 * k + 2])), 2);
        z[k] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + ro[4 * k + 3])), 3);
    }
}

/* 4x4 dword transpose inside each 128-bit lane: out[j] dword (4m + p) = z[p] lane m's dword j. */
KFN void tp_rows16_tr4(const __m512i z[4], __m512i out[4])
{
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    out[0] = _mm512_unpacklo_epi64(t0, t2);
    out[1] = _mm512_unpackhi_epi64(t0, t2);
    out[2] = _mm512_unpacklo_epi64(t1, t3);
    out[3] = _mm512_unpackhi_epi64(t1, t3);
}

#endif /* TP_MODEL_KERNELS_X86_ROWS16_IMPL_H */

/*
 * model/kernels_kquant_avx2.c - AVX2 (+FMA, F16C) kernels for the K-quants
 * Q4_K, Q5_K, Q6_K against Q8_K activations; used by the avx2 and the
 * avx512-vnni instruction-set choices alike.  Per super-block the integer
 * sub-block dots (vpmaddubsw, exact) are weighted by the sub-block scales
 * in integer (vpmaddwd), the min / offset terms come from the activation's
 * bsums, and only the super-block factor is applied in float.  Rows are the
 * outer loop so one weight row (in L1) serves every token.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <string.h>

#include "model/kernels_impl.h"

#define KQ_TARGET "avx2,fma,f16c"
#define KFN static inline __attribute__((always_inline, target(KQ_TARGET)))
#define KOUT static __attribute__((target(KQ_TARGET)))
#define ROW(w, rb, r) ((const void *)((const char *)(w) + (size_t)(r) * (rb)))

KFN float kq_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KFN float kq_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* The 8 6-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K/Q5_K block,
 * unpacked from the 12-byte field (ggml's get_scale_min_k4 for all j at once). */
KFN __m128i kq_scales_mins(const uint8_t *scales12)
{
    uint32_t u[4];
    memcpy(u, scales12, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    const uint32_t m03 = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = m03;
    u[0] &= k1;
    return _mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]);
}

/* vpshufb mask broadcasting 16-bit lane k of a 128-bit lane to all 8 lanes */
KFN __m256i kq_bcast16(int k) { return _mm256_set1_epi16((short)(0x0100 * (2 * k + 1) + 2 * k)); }

/* Q4_K (five = 0) and Q5_K (five = 1): returns float dot of one row with one activation row. */
KFN float kq_dot_q45(const void *wrow, const tp_blk_q8_k *a, int64_t nb, const int five)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    __m128 macc = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *scales, *qs, *qh = NULL;
        uint16_t dh, dminh;
        if (five) {
            const tp_blk_q5_k *w = (const tp_blk_q5_k *)wrow + i;
            scales = w->scales, qs = w->qs, qh = w->qh, dh = w->d, dminh = w->dmin;
        } else {
            const tp_blk_q4_k *w = (const tp_blk_q4_k *)wrow + i;
            scales = w->scales, qs = w->qs, dh = w->d, dminh = w->dmin;
        }
        const __m256i sm = _mm256_cvtepu8_epi16(kq_scales_mins(scales)); /* i16: sc[0..7], mn[0..7] */
        /* mins: mn[j] * (bsums[2j] + bsums[2j+1]) */
        const __m256i bs = _mm256_loadu_si256((const __m256i *)a[i].bsums);
        const __m128i bs2 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        const __m128i prod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), bs2);
        macc = _mm_fmadd_ps(_mm_set1_ps(a[i].d * kq_h2f(dminh)), _mm_cvtepi32_ps(prod), macc);
        const __m256i sc = _mm256_permute2x128_si256(sm, sm, 0x00); /* scales in both halves */
        const __m256i qhv = five ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, 2 * j), m1), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, 2 * j + 1), m1), 4));
            }
            const __m256i a0 = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * j));
            const __m256i a1 = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * j + 32));
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), _mm256_shuffle_epi8(sc, kq_bcast16(2 * j)));
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), _mm256_shuffle_epi8(sc, kq_bcast16(2 * j + 1)));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * kq_h2f(dh)), _mm256_cvtepi32_ps(isum), acc);
    }
    macc = _mm_add_ps(macc, _mm_movehl_ps(macc, macc));
    macc = _mm_add_ss(macc, _mm_movehdup_ps(macc));
    return kq_hsum(acc) - _mm_cvtss_f32(macc);
}

KFN float kq_dot_q6(const void *wrow, const tp_blk_q8_k *a, int64_t nb)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const tp_blk_q6_k *w = (const tp_blk_q6_k *)wrow + i;
        /* offset: -32 * sum_j sc_j * bsum_j */
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w->scales));
        __m256i isum = _mm256_sub_epi32(_mm256_setzero_si256(),
                                        _mm256_slli_epi32(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)a[i].bsums)), 5));
        for (int half = 0; half < 2; half++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * half));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * half + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w->qh + 32 * half));
            /* this half's 8 scales (i16) in both 128-bit lanes */
            const __m256i sch = half ? _mm256_permute2x128_si256(sc16, sc16, 0x11) : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            for (int qu = 0; qu < 4; qu++) {
                const __m256i l4 = (qu & 1) ? ql1 : ql0;
                const __m256i nib = (qu & 2) ? _mm256_and_si256(_mm256_srli_epi16(l4, 4), m4) : _mm256_and_si256(l4, m4);
                const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * qu), m3), 4);
                const __m256i q = _mm256_or_si256(nib, h2); /* 0..63 */
                const int e0 = 128 * half + 32 * qu, k = e0 / 16;
                const __m256i av = _mm256_loadu_si256((const __m256i *)(a[i].qs + e0));
                const __m256i scv = _mm256_shuffle_epi8(
                    sch, _mm256_set_m128i(_mm256_castsi256_si128(kq_bcast16((k + 1) % 8)), _mm256_castsi256_si128(kq_bcast16(k % 8))));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), scv));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * kq_h2f(w->d)), _mm256_cvtepi32_ps(isum), acc);
    }
    return kq_hsum(acc);
}

#define KQ_ENTRY(name, expr)                                                                                \
    KOUT void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,  \
                   int64_t ys, int64_t r0, int64_t r1)                                                     \
    {                                                                                                      \
        const int64_t nb = n / TP_QK_K;                                                                    \
        for (int64_t r = r0; r < r1; r++) {                                                                \
            const void *wr = ROW(w, wrb, r);                                                               \
            if (r + 1 < r1) _mm_prefetch((const char *)ROW(w, wrb, r + 1), _MM_HINT_T0);                   \
            for (int t = 0; t < n_tok; t++) {                                                              \
                const tp_blk_q8_k *a = ROW(xq, xrb, t);                                                    \
                y[t * ys + r] = expr;                                                                      \
            }                                                                                              \
        }                                                                                                  \
    }
KQ_ENTRY(kq_matmul_q4_k, kq_dot_q45(wr, a, nb, 0))
KQ_ENTRY(kq_matmul_q5_k, kq_dot_q45(wr, a, nb, 1))
KQ_ENTRY(kq_matmul_q6_k, kq_dot_q6(wr, a, nb))

void tp_kern_kquant_avx2_ops(struct tp_kern_ops *ops)
{
    ops->matmul[TP_WTYPE_Q4_K] = kq_matmul_q4_k;
    ops->matmul[TP_WTYPE_Q5_K] = kq_matmul_q5_k;
    ops->matmul[TP_WTYPE_Q6_K] = kq_matmul_q6_k;
}
#else
typedef int tp_kernels_kquant_avx2_unused; /* ISO C forbids an empty translation unit */
#endif

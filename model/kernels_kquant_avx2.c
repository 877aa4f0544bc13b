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

KFN int32_t kq_hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

KFN float kq_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* sum_j mn[j] * (bsums[2j] + bsums[2j+1]) for the 8 sub-blocks of 32 */
KFN int32_t kq_minsum(const uint8_t mn[8], const int16_t *bsums)
{
    const __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
    const __m256i m2 = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
    return kq_hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), m2));
}

/* Q4_K (five = 0) and Q5_K (five = 1): returns float dot of one row with one activation row. */
KFN float kq_dot_q45(const void *wrow, const tp_blk_q8_k *a, int64_t nb, const int five)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float macc = 0.0f;
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
        uint8_t sc[8], mn[8];
        tp_kq_scales_mins(scales, sc, mn);
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
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), _mm256_set1_epi16(sc[2 * j]));
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), _mm256_set1_epi16(sc[2 * j + 1]));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * kq_h2f(dh)), _mm256_cvtepi32_ps(isum), acc);
        macc += a[i].d * kq_h2f(dminh) * (float)kq_minsum(mn, a[i].bsums);
    }
    return kq_hsum(acc) - macc;
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
            for (int qu = 0; qu < 4; qu++) {
                const __m256i l4 = (qu & 1) ? ql1 : ql0;
                const __m256i nib = (qu & 2) ? _mm256_and_si256(_mm256_srli_epi16(l4, 4), m4) : _mm256_and_si256(l4, m4);
                const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * qu), m3), 4);
                const __m256i q = _mm256_or_si256(nib, h2); /* 0..63 */
                const int e0 = 128 * half + 32 * qu, k = e0 / 16;
                const __m256i av = _mm256_loadu_si256((const __m256i *)(a[i].qs + e0));
                const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(w->scales[k + 1]), _mm_set1_epi16(w->scales[k]));
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

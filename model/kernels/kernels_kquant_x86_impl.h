/*
 * model/kernels/kernels_kquant_x86_impl.h - private template for the x86-64 K-quant
 * kernels (Q4_K, Q5_K, Q6_K against Q8_K activations) in 256-bit vectors,
 * included by kernels_kquant_avx2.c (KQ_TARGET AVX2: 16 ymm registers);
 * AVX-512 CPUs use kernels_kquant_avx512.c, written for zmm and VNNI
 * instead (KQ_TARGET/KQ_FILL keep the template reusable for another
 * 256-bit target).  Per super-block the integer
 * sub-block dots (vpmaddubsw, exact) are weighted by the sub-block scales
 * in integer (vpmaddwd), the min / offset terms come from the activation's
 * bsums, and only the super-block factor is applied in float.  Each weight
 * super-block is unpacked once per group of up to 4 tokens (prefill), over
 * chunks of 64 rows so the weights stay in L2 while token groups pass.
 * Decode prefetches the weight stream 12 KiB ahead.
 */
#ifndef KQ_TARGET
#error "define KQ_TARGET and KQ_FILL before including kernels_kquant_x86_impl.h"
#endif
#include <immintrin.h>
#include <string.h>

#include "kernels/kernels_impl.h"

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

/* The 8 6-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K/Q5_K block
 * (ggml's get_scale_min_k4 for all j at once) with vector ops only.  Reads 16
 * bytes from the 12-byte field: the 4 after it are the block's qh / qs. */
KFN __m128i kq_scales_mins(const uint8_t *scales12)
{
    const __m128i u = _mm_loadu_si128((const __m128i *)scales12);  /* u32 lanes u0 u1 u2 (u3: not ours) */
    const __m128i a = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)); /* u0 u2 u1 u2 */
    const __m128i b = _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0)); /* u0 u0 u1 u1 */
    /* lanes 0, 2: u0 & 0x3f.., u1 & 0x3f.. (sc 0-3, mn 0-3)
     * lanes 1, 3: ((u2 >> {0,4}) & 0x0f..) | (((u{0,1} >> 6) & 0x03..) << 4) (sc 4-7, mn 4-7) */
    const __m128i lo = _mm_and_si128(a, _mm_set1_epi32(0x3f3f3f3f));
    const __m128i t = _mm_and_si128(_mm_srlv_epi32(a, _mm_set_epi32(4, 0, 0, 0)), _mm_set1_epi32(0x0f0f0f0f));
    const __m128i h = _mm_and_si128(_mm_srli_epi32(b, 2), _mm_set1_epi32(0x30303030));
    return _mm_blend_epi32(lo, _mm_or_si128(t, h), 0xA);
}

/* vpshufb mask broadcasting 16-bit lane k of a 128-bit lane to all 8 lanes */
KFN __m256i kq_bcast16(int k) { return _mm256_set1_epi16((short)(0x0100 * (2 * k + 1) + 2 * k)); }

enum { KQ_Q4_K, KQ_Q5_K, KQ_Q6_K };

/* One weight super-block unpacked for u8 x s8 dots: q[k] = the 32 unsigned values
 * for activation elements 32k..32k+31, s[k] = their sub-block scales as i16 lanes
 * (vpmaddwd operand); Q4_K/Q5_K mins (i16) or Q6_K scales (i16) for the offset term. */
struct kq_unp {
    __m256i q[8], s[8];
    __m256i sc16; /* Q6_K: the 16 int8 scales as i16 */
    __m128i mins; /* Q4_K/Q5_K: the 8 mins as i16 */
    float d, dmin;
};

KFN void kq_unpack(const int type, const void *wrow, int64_t i, struct kq_unp *u)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1), m3 = _mm256_set1_epi8(3);
    if (type == KQ_Q6_K) {
        const tp_blk_q6_k *w = (const tp_blk_q6_k *)wrow + i;
        u->d = kq_h2f(w->d);
        u->sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w->scales));
        for (int half = 0; half < 2; half++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * half));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * half + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w->qh + 32 * half));
            const __m256i sch = half ? _mm256_permute2x128_si256(u->sc16, u->sc16, 0x11)
                                     : _mm256_permute2x128_si256(u->sc16, u->sc16, 0x00);
            for (int qu = 0; qu < 4; qu++) {
                const __m256i l4 = (qu & 1) ? ql1 : ql0;
                const __m256i nib = (qu & 2) ? _mm256_and_si256(_mm256_srli_epi16(l4, 4), m4) : _mm256_and_si256(l4, m4);
                const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * qu), m3), 4);
                const int k = 4 * half + qu, sb = (2 * k) % 8; /* 16-value sub-blocks 2k, 2k+1 */
                u->q[k] = _mm256_or_si256(nib, h2); /* 0..63 */
                u->s[k] = _mm256_shuffle_epi8(
                    sch, _mm256_set_m128i(_mm256_castsi256_si128(kq_bcast16(sb + 1)), _mm256_castsi256_si128(kq_bcast16(sb))));
            }
        }
        return;
    }
    const uint8_t *scales, *qs, *qh = NULL;
    uint16_t dh, dminh;
    if (type == KQ_Q5_K) {
        const tp_blk_q5_k *w = (const tp_blk_q5_k *)wrow + i;
        scales = w->scales, qs = w->qs, qh = w->qh, dh = w->d, dminh = w->dmin;
    } else {
        const tp_blk_q4_k *w = (const tp_blk_q4_k *)wrow + i;
        scales = w->scales, qs = w->qs, dh = w->d, dminh = w->dmin;
    }
    u->d = kq_h2f(dh);
    u->dmin = kq_h2f(dminh);
    const __m256i sm = _mm256_cvtepu8_epi16(kq_scales_mins(scales)); /* i16: sc[0..7], mn[0..7] */
    u->mins = _mm256_extracti128_si256(sm, 1);
    const __m256i sc = _mm256_permute2x128_si256(sm, sm, 0x00); /* scales in both halves */
    const __m256i qhv = type == KQ_Q5_K ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (type == KQ_Q5_K) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, 2 * j), m1), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, 2 * j + 1), m1), 4));
        }
        u->q[2 * j] = lo;
        u->q[2 * j + 1] = hi;
        u->s[2 * j] = _mm256_shuffle_epi8(sc, kq_bcast16(2 * j));
        u->s[2 * j + 1] = _mm256_shuffle_epi8(sc, kq_bcast16(2 * j + 1));
    }
}

/* acc += main term, macc += offset term (to subtract) of one unpacked super-block with activation block a. */
KFN void kq_dot_unp(const int type, const struct kq_unp *u, const tp_blk_q8_k *a, __m256 *acc, __m128 *macc)
{
    const __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
    __m256i isum;
    if (type == KQ_Q6_K) {
        /* offset: -32 * sum_j sc_j * bsum_j, exact in integer */
        isum = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(u->sc16, bs), 5));
    } else {
        isum = _mm256_setzero_si256();
        /* mins: mn[j] * (bsums[2j] + bsums[2j+1]) */
        const __m128i bs2 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        *macc = _mm_fmadd_ps(_mm_set1_ps(a->d * u->dmin), _mm_cvtepi32_ps(_mm_madd_epi16(u->mins, bs2)), *macc);
    }
    for (int k = 0; k < 8; k++) {
        const __m256i av = _mm256_loadu_si256((const __m256i *)(a->qs + 32 * k));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(u->q[k], av), u->s[k]));
    }
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(a->d * u->d), _mm256_cvtepi32_ps(isum), *acc);
}

KFN float kq_finish(__m256 acc, __m128 macc)
{
    macc = _mm_add_ps(macc, _mm_movehl_ps(macc, macc));
    macc = _mm_add_ss(macc, _mm_movehdup_ps(macc));
    return kq_hsum(acc) - _mm_cvtss_f32(macc);
}

#define KQ_PF 12288 /* decode: software prefetch distance in the weight stream (bytes; as the AVX-512 kernels) */

/* T (1..4) tokens of one weight row: each super-block is unpacked once for all T.
 * T == 1 (decode) prefetches every cache line of the stream KQ_PF bytes ahead. */
KFN void kq_row(const int type, const void *wr, const char *xq, size_t xrb, int64_t nb, const int T, float *y,
                int64_t ys)
{
    __m256 acc[4];
    __m128 macc[4];
    const size_t bs = type == KQ_Q6_K ? sizeof(tp_blk_q6_k) : type == KQ_Q5_K ? sizeof(tp_blk_q5_k) : sizeof(tp_blk_q4_k);
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps(), macc[t] = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        if (T == 1) {
            const char *p = (const char *)wr + (size_t)i * bs + KQ_PF;
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p + 64, _MM_HINT_T0);
            _mm_prefetch(p + 128, _MM_HINT_T0);
            if (type == KQ_Q6_K) _mm_prefetch(p + 192, _MM_HINT_T0);
        }
        struct kq_unp u;
        kq_unpack(type, wr, i, &u);
        for (int t = 0; t < T; t++)
            kq_dot_unp(type, &u, (const tp_blk_q8_k *)(xq + (size_t)t * xrb) + i, &acc[t], &macc[t]);
    }
    for (int t = 0; t < T; t++) y[(int64_t)t * ys] = kq_finish(acc[t], macc[t]);
}

/* Rows in chunks of 64 (weights stay in L2), 4 tokens per pass over a row. */
KFN void kq_matmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                   float *y, int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK_K;
    for (int64_t c0 = r0; c0 < r1; c0 += 64) {
        const int64_t c1 = c0 + 64 < r1 ? c0 + 64 : r1;
        for (int t0 = 0; t0 < n_tok; t0 += 4) {
            const int T = n_tok - t0 < 4 ? n_tok - t0 : 4;
            const char *x = (const char *)xq + (size_t)t0 * xrb;
            for (int64_t r = c0; r < c1; r++) {
                const void *wr = ROW(w, wrb, r);
                float *yr = y + (int64_t)t0 * ys + r;
                switch (T) {
                case 1: kq_row(type, wr, x, xrb, nb, 1, yr, ys); break;
                case 2: kq_row(type, wr, x, xrb, nb, 2, yr, ys); break;
                case 3: kq_row(type, wr, x, xrb, nb, 3, yr, ys); break;
                default: kq_row(type, wr, x, xrb, nb, 4, yr, ys); break;
                }
            }
        }
    }
}

#define KQ_ENTRY(name, type)                                                                                \
    KOUT void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,  \
                   int64_t ys, int64_t r0, int64_t r1)                                                     \
    {                                                                                                      \
        kq_matmul(type, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);                                         \
    }
KQ_ENTRY(kq_matmul_q4_k, KQ_Q4_K)
KQ_ENTRY(kq_matmul_q5_k, KQ_Q5_K)
KQ_ENTRY(kq_matmul_q6_k, KQ_Q6_K)

void KQ_FILL(struct tp_kern_ops *ops)
{
    ops->matmul[TP_WTYPE_Q4_K] = kq_matmul_q4_k;
    ops->matmul[TP_WTYPE_Q5_K] = kq_matmul_q5_k;
    ops->matmul[TP_WTYPE_Q6_K] = kq_matmul_q6_k;
}

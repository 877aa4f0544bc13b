/*
 * model/kernels/kernels_kquant_avx512.c - K-quant kernels (Q4_K, Q5_K, Q6_K against
 * Q8_K activations) for AVX-512 CPUs with VNNI (the "avx512-vnni" ISA:
 * Ice Lake and later, Zen 4/5).  Decode streams weights, so the work per
 * 256-value super-block must stay below the time its bytes take to arrive
 * (144 bytes for Q4_K); this version needs about half of the AVX2
 * template's instructions:
 *  - 64 weights per zmm: a 32-byte broadcast load, one masked shift and one
 *    AND give the low nibbles (first 32 values) and high nibbles (next 32)
 *    in the two halves, matching 64 contiguous Q8_K activations, so neither
 *    side needs a lane-crossing shuffle;
 *  - vpmaddubsw (u8 x s8 -> i16, exact: at most 2*63*127) then vpdpwssd
 *    with the sub-block scales as i16 lanes (one fused multiply-add of the
 *    scale and the accumulation into i32);
 *  - the 6-bit scales and mins unpacked with vector ops from the 12-byte
 *    field, spread to lanes by vpshufb (Q4_K/Q5_K) or vpermw (Q6_K);
 *  - the min term (Q4_K/Q5_K) and the -32 offset (Q6_K) from the
 *    activation's bsums with one vpmaddwd, in float with its own factor.
 * Only the per-super-block float factor d * d_act is applied in float, so
 * results equal the scalar reference up to float summation order.
 * Decode: Q4_K/Q5_K rows go two super-blocks per step (scales of both
 * unpacked in one ymm, the two fp16 factors converted together), and every
 * cache line of the weight stream is prefetched KQ_PF bytes ahead.
 * Prefill: a super-block is unpacked once and used for up to 8 tokens, over
 * chunks of 64 rows so weights stay in L2 while token groups pass.
 * Also the Q8_K activation quantizer, bit-identical to the scalar one.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <string.h>

#include "kernels/kernels_impl.h"

#define KQ_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"
#define KFN static inline __attribute__((always_inline, target(KQ_TARGET)))
#define KOUT static __attribute__((target(KQ_TARGET)))
#define ROW(w, rb, r) ((const void *)((const char *)(w) + (size_t)(r) * (rb)))

enum { KQ_Q4_K, KQ_Q5_K, KQ_Q6_K };
#define KQ_MAX_TOK 8   /* tokens sharing one unpacked super-block */
#define KQ_ROW_CHUNK 64 /* rows per pass of the token groups (prefill) */
#define KQ_PF 12288     /* decode: software prefetch distance in the weight stream (bytes; docs/design-measurements.md) */

/* vpshufb indices (u16 lanes: low byte = source byte, 0x80 zeroes the high byte).
 * sidx[k]: Q4_K/Q5_K zmm k holds sub-blocks 2k (words 0-15) and 2k+1 (words 16-31). */
static const uint16_t kq_sidx[4][32] __attribute__((aligned(64))) = {
#define KQ_S(a, b) {a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b}
    KQ_S(0x8000, 0x8001), KQ_S(0x8002, 0x8003), KQ_S(0x8004, 0x8005), KQ_S(0x8006, 0x8007),
#undef KQ_S
};
/* midx: mins (bytes 8-15 of the unpacked field) per bsum lane j: mn[j / 2] */
static const uint16_t kq_midx[16] __attribute__((aligned(32))) = {0x8008, 0x8008, 0x8009, 0x8009, 0x800a, 0x800a,
                                                                   0x800b, 0x800b, 0x800c, 0x800c, 0x800d, 0x800d,
                                                                   0x800e, 0x800e, 0x800f, 0x800f};
/* p6[z]: vpermw indices, Q6_K zmm z covers the 16-value sub-blocks 4z..4z+3 (8 words each) */
static const uint16_t kq_p6[4][32] __attribute__((aligned(64))) = {
#define KQ_P(a) {a, a, a, a, a, a, a, a, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1, \
                 a + 2, a + 2, a + 2, a + 2, a + 2, a + 2, a + 2, a + 2, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3}
    KQ_P(0), KQ_P(4), KQ_P(8), KQ_P(12),
#undef KQ_P
};

KFN float kq_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* The 8 6-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K/Q5_K block
 * (ggml's get_scale_min_k4 for all j at once), in vector registers.  Reads 16
 * bytes from the 12-byte field: the 4 after it are the block's qs. */
KFN __m128i kq_scales_mins(const uint8_t *scales12)
{
    const __m128i u = _mm_loadu_si128((const __m128i *)scales12); /* u32 lanes u0 u1 u2 (u3: not ours) */
    const __m128i a = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)); /* u0 u2 u1 u2 */
    const __m128i b = _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0)); /* u0 u0 u1 u1 */
    /* lanes 0, 2: u0 & 0x3f.., u1 & 0x3f.. (sc 0-3, mn 0-3)
     * lanes 1, 3: ((u2 >> {0,4}) & 0x0f..) | (((u{0,1} >> 6) & 0x03..) << 4) (sc 4-7, mn 4-7) */
    const __m128i lo = _mm_and_si128(a, _mm_set1_epi32(0x3f3f3f3f));
    const __m128i t = _mm_srlv_epi32(a, _mm_set_epi32(4, 0, 0, 0));
    const __m128i h = _mm_and_si128(_mm_srli_epi32(b, 2), _mm_set1_epi32(0x30303030));
    const __m128i hi = _mm_ternarylogic_epi32(t, _mm_set1_epi32(0x0f0f0f0f), h, 0xEA); /* (A & B) | C */
    return _mm_blend_epi32(lo, hi, 0xA);
}

/* kq_scales_mins of two blocks at once (128-bit lane 0: s0, lane 1: s1). */
KFN __m256i kq_scales_mins2(const uint8_t *s0, const uint8_t *s1)
{
    const __m256i u = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)s0)),
                                              _mm_loadu_si128((const __m128i *)s1), 1);
    const __m256i a = _mm256_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0));
    const __m256i b = _mm256_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0));
    const __m256i lo = _mm256_and_si256(a, _mm256_set1_epi32(0x3f3f3f3f));
    const __m256i t = _mm256_srlv_epi32(a, _mm256_set_epi32(4, 0, 0, 0, 4, 0, 0, 0));
    const __m256i h = _mm256_and_si256(_mm256_srli_epi32(b, 2), _mm256_set1_epi32(0x30303030));
    const __m256i hi = _mm256_ternarylogic_epi32(t, _mm256_set1_epi32(0x0f0f0f0f), h, 0xEA);
    return _mm256_blend_epi32(lo, hi, 0xAA);
}

/* One weight super-block unpacked: q[k] = unsigned values for activation
 * elements 64k..64k+63, s[k] = their scales as i16 lanes of vpmaddubsw's
 * output; m16 = the factors of the activation bsums (i16, one per 16 values)
 * for the subtracted term, which is scaled by dm. */
struct kq_unp {
    __m512i q[4], s[4];
    __m256i m16;
    float d, dm;
};

KFN void kq_unpack(const int type, const void *wrow, int64_t i, struct kq_unp *u)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (type == KQ_Q6_K) {
        const tp_blk_q6_k *b = (const tp_blk_q6_k *)wrow + i;
        u->d = kq_h2f(b->d);
        u->dm = 32.0f * u->d; /* value = q - 32: subtract 32 * sum_j sc_j * bsum_j */
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        u->m16 = sc16;
        const __m512i scz = _mm512_castsi256_si512(sc16); /* vpermw indices < 16: upper half unused */
        for (int z = 0; z < 4; z++) u->s[z] = _mm512_permutexvar_epi16(_mm512_load_si512(kq_p6[z]), scz);
        const __m512i m30 = _mm512_set1_epi8(0x30);
        /* bits 2q..2q+1 of qh[k] are the high bits of quarter q: to bit 4 by << 4, << 2, >> 0, >> 2 */
        const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
        const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * h)));
            const __m512i hl = _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30);
            const __m512i hh = _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30);
            u->q[2 * h] = _mm512_ternarylogic_epi32(ql, m4, hl, 0xEA);
            u->q[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), m4, hh, 0xEA);
        }
        return;
    }
    const uint8_t *scales, *qs, *qh = NULL;
    uint16_t dh, dminh;
    if (type == KQ_Q5_K) {
        const tp_blk_q5_k *b = (const tp_blk_q5_k *)wrow + i;
        scales = b->scales, qs = b->qs, qh = b->qh, dh = b->d, dminh = b->dmin;
    } else {
        const tp_blk_q4_k *b = (const tp_blk_q4_k *)wrow + i;
        scales = b->scales, qs = b->qs, dh = b->d, dminh = b->dmin;
    }
    u->d = kq_h2f(dh);
    u->dm = kq_h2f(dminh);
    const __m128i sm = kq_scales_mins(scales);
    const __m512i smz = _mm512_broadcast_i32x4(sm);
    u->m16 = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(sm), _mm256_load_si256((const __m256i *)kq_midx));
    __m512i qhz = _mm512_setzero_si512();
    if (type == KQ_Q5_K) qhz = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
    for (int k = 0; k < 4; k++) {
        u->s[k] = _mm512_shuffle_epi8(smz, _mm512_load_si512(kq_sidx[k]));
        /* qs[32k + l]: low nibble = value 64k + l, high nibble = value 64k + 32 + l */
        const __m512i w = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * k)));
        __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(w, 0xFFFF0000u, w, 4), m4);
        if (type == KQ_Q5_K) { /* bit 2k (first 32) / 2k+1 (next 32) of qh[l] adds 16 */
            const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * k))),
                                                   _mm256_set1_epi8((char)(1 << (2 * k + 1))), 1);
            q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qhz, bit), q, _mm512_set1_epi8(16));
        }
        u->q[k] = q;
    }
}

/* acc += d * d_a * sum_k s_k * dot(q_k, a_k);  macc += dm * d_a * (m16 . bsums) */
KFN void kq_dot(const struct kq_unp *u, const tp_blk_q8_k *a, __m512 *acc, __m256 *macc)
{
    const __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
    *macc = _mm256_fmadd_ps(_mm256_set1_ps(a->d * u->dm), _mm256_cvtepi32_ps(_mm256_madd_epi16(u->m16, bs)), *macc);
    __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
    i0 = _mm512_dpwssd_epi32(i0, _mm512_maddubs_epi16(u->q[0], _mm512_loadu_si512(a->qs)), u->s[0]);
    i1 = _mm512_dpwssd_epi32(i1, _mm512_maddubs_epi16(u->q[1], _mm512_loadu_si512(a->qs + 64)), u->s[1]);
    i0 = _mm512_dpwssd_epi32(i0, _mm512_maddubs_epi16(u->q[2], _mm512_loadu_si512(a->qs + 128)), u->s[2]);
    i1 = _mm512_dpwssd_epi32(i1, _mm512_maddubs_epi16(u->q[3], _mm512_loadu_si512(a->qs + 192)), u->s[3]);
    *acc = _mm512_fmadd_ps(_mm512_set1_ps(a->d * u->d), _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), *acc);
}

/* Decode step of one Q4_K/Q5_K super-block b with activation block a, its scales and mins
 * (kq_scales_mins) broadcast to every 128-bit lane of smz.  Same sums as kq_unpack + kq_dot,
 * with the two fp16 factors converted together. */
KFN void kq_step_q45(const int type, const uint8_t *b, const __m512i smz, const tp_blk_q8_k *a, __m512 *acc,
                     __m256 *macc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* d, dmin (fp16, the block's first 4 bytes) times d_a */
    const __m128 f = _mm_mul_ps(_mm_cvtph_ps(_mm_loadu_si32(b)), _mm_set1_ps(a->d));
    const __m256i m16 = _mm256_shuffle_epi8(_mm512_castsi512_si256(smz), _mm256_load_si256((const __m256i *)kq_midx));
    const __m256 fm = _mm256_permutexvar_ps(_mm256_set1_epi32(1), _mm256_castps128_ps256(f));
    *macc = _mm256_fmadd_ps(fm, _mm256_cvtepi32_ps(_mm256_madd_epi16(m16, _mm256_loadu_si256((const __m256i *)a->bsums))),
                            *macc);
    const uint8_t *qs = type == KQ_Q5_K ? ((const tp_blk_q5_k *)b)->qs : ((const tp_blk_q4_k *)b)->qs;
    __m512i qhz = _mm512_setzero_si512();
    if (type == KQ_Q5_K) qhz = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)((const tp_blk_q5_k *)b)->qh));
    __m512i isum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int k = 0; k < 4; k++) {
        const __m512i w = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * k)));
        __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(w, 0xFFFF0000u, w, 4), m4);
        if (type == KQ_Q5_K) {
            const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * k))),
                                                   _mm256_set1_epi8((char)(1 << (2 * k + 1))), 1);
            q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qhz, bit), q, _mm512_set1_epi8(16));
        }
        const __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512(a->qs + 64 * k));
        isum[k & 1] = _mm512_dpwssd_epi32(isum[k & 1], p, _mm512_shuffle_epi8(smz, _mm512_load_si512(kq_sidx[k])));
    }
    *acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(f), _mm512_cvtepi32_ps(_mm512_add_epi32(isum[0], isum[1])), *acc);
}

KFN float kq_finish(__m512 acc, __m256 macc)
{
    __m256 s = _mm256_sub_ps(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1)), macc);
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* Bytes of one weight super-block. */
KFN size_t kq_bsz(const int type)
{
    return type == KQ_Q6_K ? sizeof(tp_blk_q6_k) : type == KQ_Q5_K ? sizeof(tp_blk_q5_k) : sizeof(tp_blk_q4_k);
}

/* T (1..KQ_MAX_TOK) tokens of one weight row; each super-block unpacked once for all T.
 * pf: prefetch the weight stream KQ_PF bytes ahead (decode; rows are contiguous). */
KFN void kq_row(const int type, const void *wr, const char *xq, size_t xrb, int64_t nb, const int T, float *y,
                int64_t ys, const int pf)
{
    __m512 acc[KQ_MAX_TOK];
    __m256 macc[KQ_MAX_TOK];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps(), macc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        if (pf) { /* every cache line of the super-block KQ_PF ahead: 3 lines cover 144 and 176 bytes, 4 cover 210 */
            const char *p = (const char *)wr + (size_t)i * kq_bsz(type) + KQ_PF;
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p + 64, _MM_HINT_T0);
            _mm_prefetch(p + 128, _MM_HINT_T0);
            if (type == KQ_Q6_K) _mm_prefetch(p + 192, _MM_HINT_T0);
        }
        struct kq_unp u;
        kq_unpack(type, wr, i, &u);
        for (int t = 0; t < T; t++) kq_dot(&u, (const tp_blk_q8_k *)(xq + (size_t)t * xrb) + i, &acc[t], &macc[t]);
    }
    for (int t = 0; t < T; t++) y[(int64_t)t * ys] = kq_finish(acc[t], macc[t]);
}

/* Decode (one token) of one Q4_K/Q5_K row: two super-blocks per step, their scales unpacked together. */
KFN float kq_row1_q45(const int type, const uint8_t *wr, const tp_blk_q8_k *a, int64_t nb)
{
    const size_t bs = kq_bsz(type);
    __m512 acc = _mm512_setzero_ps();
    __m256 macc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const uint8_t *b0 = wr + (size_t)i * bs, *b1 = b0 + bs;
        const char *p = (const char *)b0 + KQ_PF; /* every cache line of both blocks, KQ_PF ahead */
        for (int l = 0; l < (type == KQ_Q5_K ? 6 : 5); l++) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
        const uint8_t *s0 = type == KQ_Q5_K ? ((const tp_blk_q5_k *)b0)->scales : ((const tp_blk_q4_k *)b0)->scales;
        const __m512i sm = _mm512_castsi256_si512(kq_scales_mins2(s0, s0 + bs));
        kq_step_q45(type, b0, _mm512_shuffle_i32x4(sm, sm, 0x00), a + i, &acc, &macc);
        kq_step_q45(type, b1, _mm512_shuffle_i32x4(sm, sm, 0x55), a + i + 1, &acc, &macc);
    }
    if (i < nb) {
        const uint8_t *b0 = wr + (size_t)i * bs;
        const uint8_t *s0 = type == KQ_Q5_K ? ((const tp_blk_q5_k *)b0)->scales : ((const tp_blk_q4_k *)b0)->scales;
        kq_step_q45(type, b0, _mm512_broadcast_i32x4(kq_scales_mins(s0)), a + i, &acc, &macc);
    }
    return kq_finish(acc, macc);
}

KFN void kq_matmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                   float *y, int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK_K;
    if (n_tok == 1) { /* decode: one pass over the rows */
        if (type == KQ_Q6_K)
            for (int64_t r = r0; r < r1; r++) kq_row(type, ROW(w, wrb, r), xq, xrb, nb, 1, y + r, ys, 1);
        else
            for (int64_t r = r0; r < r1; r++) y[r] = kq_row1_q45(type, ROW(w, wrb, r), xq, nb);
        return;
    }
    for (int64_t c0 = r0; c0 < r1; c0 += KQ_ROW_CHUNK) {
        const int64_t c1 = c0 + KQ_ROW_CHUNK < r1 ? c0 + KQ_ROW_CHUNK : r1;
        for (int t0 = 0; t0 < n_tok; t0 += KQ_MAX_TOK) {
            const int T = n_tok - t0 < KQ_MAX_TOK ? n_tok - t0 : KQ_MAX_TOK;
            const char *x = (const char *)xq + (size_t)t0 * xrb;
            for (int64_t r = c0; r < c1; r++) {
                const void *wr = ROW(w, wrb, r);
                float *yr = y + (int64_t)t0 * ys + r;
                switch (T) {
                case 1: kq_row(type, wr, x, xrb, nb, 1, yr, ys, 0); break;
                case 2: kq_row(type, wr, x, xrb, nb, 2, yr, ys, 0); break;
                case 3: kq_row(type, wr, x, xrb, nb, 3, yr, ys, 0); break;
                case 4: kq_row(type, wr, x, xrb, nb, 4, yr, ys, 0); break;
                case 5: kq_row(type, wr, x, xrb, nb, 5, yr, ys, 0); break;
                case 6: kq_row(type, wr, x, xrb, nb, 6, yr, ys, 0); break;
                case 7: kq_row(type, wr, x, xrb, nb, 7, yr, ys, 0); break;
                default: kq_row(type, wr, x, xrb, nb, 8, yr, ys, 0); break;
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
KQ_ENTRY(kq512_matmul_q4_k, KQ_Q4_K)
KQ_ENTRY(kq512_matmul_q5_k, KQ_Q5_K)
KQ_ENTRY(kq512_matmul_q6_k, KQ_Q6_K)

/* Q8_K activations, bit-identical to tp_kq_quant_q8k: amax (NaN ignored as fmaxf does), d = amax / 127,
 * q = round-half-even(x / d) (vcvtps2dq in the default rounding mode = nearbyintf), bsums per 16 values. */
KOUT void kq512_quant_q8k(const float *x, void *out, int64_t n)
{
    tp_blk_q8_k *y = out;
    for (int64_t i = 0; i < n / TP_QK_K; i++, x += TP_QK_K) {
        __m512 mx = _mm512_setzero_ps();
        for (int l = 0; l < TP_QK_K; l += 16) mx = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + l)), mx);
        const float amax = _mm512_reduce_max_ps(mx);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = d;
        const __m512 idv = _mm512_set1_ps(id);
        for (int j = 0; j < TP_QK_K / 16; j++) {
            const __m128i q = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * j), idv)));
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * j), q);
            y[i].bsums[j] = (int16_t)_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q)); /* the stored int8 values */
        }
    }
}

void tp_kern_kquant_avx512_ops(struct tp_kern_ops *ops)
{
    ops->quant_q8k = kq512_quant_q8k;
    ops->matmul[TP_WTYPE_Q4_K] = kq512_matmul_q4_k;
    ops->matmul[TP_WTYPE_Q5_K] = kq512_matmul_q5_k;
    ops->matmul[TP_WTYPE_Q6_K] = kq512_matmul_q6_k;
}
#else
typedef int tp_kernels_kquant_avx512_unused; /* ISO C forbids an empty translation unit */
#endif

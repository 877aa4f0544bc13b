/*
 * model/kernels/kernels_mxfp4_x86.c - MXFP4 matmul for AVX2 and AVX-512/VNNI
 * (x86-64), chosen at run time with the other kernels of each ISA.
 *
 * A block's 16 bytes of nibbles become 32 codes with one vpshufb into the
 * value table offset by +16 (kernels_impl.h's kvalues + 16: 4..28, unsigned),
 * so the u8 x s8 dot (vpmaddubsw + vpmaddwd on AVX2, vpdpbusd on AVX-512)
 * takes them directly; the offset's 16 * sum(x) comes back out through the
 * activation row's correction vector c (K = 16 for MXFP4, kernels_impl.h),
 * which seeds the integer accumulator: each block's dot is exact in int32,
 * then scaled by 2^(e-128) * d_x in float.  AVX-512 takes two blocks per zmm
 * (their scales in the two 256-bit halves).  Each unpacked weight block
 * serves up to MX_NT tokens, so decode reads every row once and prefill
 * reuses each unpacked block.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <string.h>

#include "kernels/kernels_impl.h"

#define MX_NT 4    /* tokens per pass */
#define MX_PF 12288 /* software prefetch distance along the weight stream (bytes), as the Q4_0 kernels */
#define AVX2_FN static inline __attribute__((always_inline, target("avx2,fma")))
#define AVX2_OUT static __attribute__((target("avx2,fma")))
#define A512 "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"
#define A512_FN static inline __attribute__((always_inline, target(A512)))
#define A512_OUT static __attribute__((target(A512)))
#define ROW(p, rb, r) ((const void *)((const char *)(p) + (size_t)(r) * (rb)))

/* kvalues + 16 (the codes as unsigned bytes) */
static const int8_t k_table_u[16] = {16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4};

static float ld_f32(const float *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* the activation rows of one pass of tokens */
struct mx_act {
    const int8_t *qs[MX_NT];
    const float *d[MX_NT];
    const int32_t *c[MX_NT];
};

static int mx_act(struct mx_act *a, const void *xq, size_t xrb, int t0, int n_tok, int64_t n)
{
    const int nt = n_tok - t0 < MX_NT ? n_tok - t0 : MX_NT;
    for (int j = 0; j < nt; j++) {
        const void *row = ROW(xq, xrb, t0 + j);
        a->qs[j] = TP_A8_QS(row);
        a->d[j] = TP_A8_D(row, n);
        a->c[j] = TP_A8_C(row, n);
    }
    return nt;
}

/* ------------------------------------------------------------------ AVX2 */

AVX2_FN float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 32 unsigned codes of block b: elements 0..15 (low nibbles) then 16..31 (high). */
AVX2_FN __m256i unpack_avx2(const tp_blk_mxfp4 *b, __m256i table)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    return _mm256_shuffle_epi8(table, idx);
}

AVX2_OUT void matmul_avx2(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                          int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k_table_u));
    const __m256i ones = _mm256_set1_epi16(1);
    for (int t0 = 0; t0 < n_tok; t0 += MX_NT) {
        struct mx_act a;
        const int nt = mx_act(&a, xq, xrb, t0, n_tok, n);
        for (int64_t r = r0; r < r1; r++) {
            const tp_blk_mxfp4 *wb = ROW(w, wrb, r);
            __m256 acc[MX_NT];
            for (int j = 0; j < MX_NT; j++) acc[j] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                _mm_prefetch((const char *)(wb + b) + MX_PF, _MM_HINT_T0);
                const __m256i v = unpack_avx2(wb + b, table);
                const float dw = tp_e8m0_half(wb[b].e);
                for (int j = 0; j < nt; j++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(a.qs[j] + b * TP_QK));
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(v, x), ones);
                    p = _mm256_add_epi32(p, _mm256_loadu_si256((const __m256i *)(a.c[j] + 8 * b)));
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * ld_f32(a.d[j] + b)), acc[j]);
                }
            }
            for (int j = 0; j < nt; j++) y[(int64_t)(t0 + j) * ys + r] = hsum8(acc[j]);
        }
    }
}

void tp_kern_mxfp4_avx2_ops(struct tp_kern_ops *ops) { ops->matmul[TP_WTYPE_MXFP4] = matmul_avx2; }

/* ------------------------------------------------------------------ AVX-512 VNNI */

A512_FN __m256i unpack_256(const tp_blk_mxfp4 *b, __m256i table)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    return _mm256_shuffle_epi8(table, idx);
}

/* (s0 x 8, s1 x 8) from two consecutive floats at p */
A512_FN __m512 pair_scale(const float *p, __m512i idx)
{
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)p))));
}

A512_OUT void matmul_avx512(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                            int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k_table_u));
    const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int t0 = 0; t0 < n_tok; t0 += MX_NT) {
        struct mx_act a;
        const int nt = mx_act(&a, xq, xrb, t0, n_tok, n);
        for (int64_t r = r0; r < r1; r++) {
            const tp_blk_mxfp4 *wb = ROW(w, wrb, r);
            __m512 acc[MX_NT];
            for (int j = 0; j < MX_NT; j++) acc[j] = _mm512_setzero_ps();
            int64_t b = 0;
            for (; b + 1 < nb; b += 2) { /* two blocks per zmm */
                _mm_prefetch((const char *)(wb + b) + MX_PF, _MM_HINT_T0);
                const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(unpack_256(wb + b, table)),
                                                     unpack_256(wb + b + 1, table), 1);
                const __m512 dw = _mm512_mask_blend_ps((__mmask16)0xFF00, _mm512_set1_ps(tp_e8m0_half(wb[b].e)),
                                                       _mm512_set1_ps(tp_e8m0_half(wb[b + 1].e)));
                for (int j = 0; j < nt; j++) {
                    const __m512i x = _mm512_loadu_si512((const void *)(a.qs[j] + b * TP_QK));
                    const __m512i p = _mm512_dpbusd_epi32(_mm512_loadu_si512((const void *)(a.c[j] + 8 * b)), v, x);
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, pair_scale(a.d[j] + b, halves)),
                                             acc[j]);
                }
            }
            if (b < nb) { /* an odd last block: 256-bit VNNI */
                const __m256i v = unpack_256(wb + b, table);
                const float d0 = tp_e8m0_half(wb[b].e);
                for (int j = 0; j < nt; j++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(a.qs[j] + b * TP_QK));
                    const __m256i p = _mm256_dpbusd_epi32(_mm256_loadu_si256((const __m256i *)(a.c[j] + 8 * b)), v, x);
                    const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d0 * ld_f32(a.d[j] + b)));
                    acc[j] = _mm512_add_ps(acc[j], _mm512_maskz_mov_ps((__mmask16)0x00FF, _mm512_castps256_ps512(f)));
                }
            }
            for (int j = 0; j < nt; j++) y[(int64_t)(t0 + j) * ys + r] = _mm512_reduce_add_ps(acc[j]);
        }
    }
}

void tp_kern_mxfp4_avx512_ops(struct tp_kern_ops *ops) { ops->matmul[TP_WTYPE_MXFP4] = matmul_avx512; }

#else
typedef int tp_kernels_mxfp4_x86_unused; /* ISO C forbids an empty translation unit */
#endif

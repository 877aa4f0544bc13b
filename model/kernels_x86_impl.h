/*
 * model/kernels_x86_impl.h - private template for the x86-64 kernels,
 * included by kernels_avx2.c and kernels_avx512.c with
 *   KX_TARGET  target attribute string (no -march flags needed in the build)
 *   KX_VNNI    1: integer dots with vpdpbusd (AVX-512 VNNI, 256-bit EVEX);
 *              0: vpmaddubsw + vpmaddwd (AVX2)
 *   KX_MR/KX_NT  register tile: weight rows x tokens per inner kernel
 *
 * Quantized types: each weight block is unpacked once per tile and dotted
 * with KX_NT activation blocks (u8 x s8 products: Q4_0 nibbles are 0..15
 * with the -8 offset folded into a per-token correction term; Q8_0 uses the
 * sign trick on AVX2 and a +128 bias with correction on VNNI).  Rows are
 * processed in chunks of KX_CHUNK rows, all token tiles per chunk, so a chunk
 * of weights stays in L1/L2 while the activations stream past it.
 */
#ifndef KX_TARGET
#error "define KX_TARGET, KX_VNNI, KX_MR, KX_NT before including kernels_x86_impl.h"
#endif

#include <immintrin.h>
#include <string.h>

#include "model/kernels_impl.h"

#define KFN static inline __attribute__((always_inline, target(KX_TARGET)))
#define KOUT static __attribute__((target(KX_TARGET)))
#define KX_CHUNK 16
#define KROW(p, rb, r) ((const void *)((const char *)(p) + (size_t)(r) * (rb)))

enum { KX_Q4_0, KX_Q8_0, KX_F32, KX_F16, KX_BF16 };

KFN float kx_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc + sum over groups of 4 of u8(u) * s8(s), per 32-bit lane */
KFN __m256i kx_dot(__m256i acc, __m256i u, __m256i s)
{
#if KX_VNNI
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

KFN float kx_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* ------------------------------------------------------------------ quantized tile */

KFN void kx_qtile(const int type, const char *w, size_t wrb, const char *x, size_t xrb, int64_t nb, const int R,
                  const int T, float *y, int64_t ys)
{
    __m256 acc[KX_MR][KX_NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        __m256i W[KX_MR], Wraw[KX_MR];
        __m256 dw[KX_MR];
        for (int r = 0; r < R; r++) {
            if (type == KX_Q4_0) {
                const tp_blk_q4_0 *wb = (const tp_blk_q4_0 *)(w + (size_t)r * wrb) + b;
                __m128i q = _mm_loadu_si128((const __m128i *)wb->qs);
                W[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
                Wraw[r] = W[r];
                dw[r] = _mm256_set1_ps(kx_h2f(wb->d));
            } else {
                const tp_blk_q8_0 *wb = (const tp_blk_q8_0 *)(w + (size_t)r * wrb) + b;
                Wraw[r] = _mm256_loadu_si256((const __m256i *)wb->qs);
#if KX_VNNI
                W[r] = _mm256_xor_si256(Wraw[r], _mm256_set1_epi8((char)0x80)); /* w + 128 as u8 */
#else
                W[r] = _mm256_abs_epi8(Wraw[r]);
#endif
                dw[r] = _mm256_set1_ps(kx_h2f(wb->d));
            }
        }
        for (int t = 0; t < T; t++) {
            const tp_blk_a8 *ab = (const tp_blk_a8 *)(x + (size_t)t * xrb) + b;
            const __m256i A = _mm256_loadu_si256((const __m256i *)ab->qs);
            const __m256 da = _mm256_broadcast_ss(&ab->d);
            __m256i C;
            if (type == KX_Q4_0)
                C = _mm256_sub_epi32(_mm256_setzero_si256(), kx_dot(_mm256_setzero_si256(), _mm256_set1_epi8(8), A));
            else
#if KX_VNNI
                C = _mm256_sub_epi32(_mm256_setzero_si256(),
                                     kx_dot(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), A));
#else
                C = _mm256_setzero_si256();
#endif
            for (int r = 0; r < R; r++) {
                __m256i i;
#if !KX_VNNI
                if (type == KX_Q8_0)
                    i = kx_dot(C, W[r], _mm256_sign_epi8(A, Wraw[r]));
                else
#endif
                    i = kx_dot(C, W[r], A);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dw[r], da), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[(int64_t)t * ys + r] = kx_hsum(acc[r][t]);
}

/* Dispatch one tile with R (1..KX_MR) rows and T (1..KX_NT) tokens as compile-time constants. */
#define KX_TILE_T(fn, R, T, ...)                      \
    switch (T) {                                      \
    case 1: fn(__VA_ARGS__, R, 1, y, ys); break;      \
    case 2: if (KX_NT >= 2) fn(__VA_ARGS__, R, 2 < KX_NT ? 2 : KX_NT, y, ys); break; \
    case 3: if (KX_NT >= 3) fn(__VA_ARGS__, R, 3 < KX_NT ? 3 : KX_NT, y, ys); break; \
    default: fn(__VA_ARGS__, R, KX_NT, y, ys); break; \
    }

KFN void kx_qmatmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                    float *yy, int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK;
    for (int64_t c0 = r0; c0 < r1; c0 += KX_CHUNK) {
        const int64_t c1 = c0 + KX_CHUNK < r1 ? c0 + KX_CHUNK : r1;
        for (int t0 = 0; t0 < n_tok; t0 += KX_NT) {
            const int T = n_tok - t0 < KX_NT ? n_tok - t0 : KX_NT;
            const char *x = KROW(xq, xrb, t0);
            int64_t r = c0;
            for (; r + KX_MR <= c1; r += KX_MR) {
                float *y = yy + (int64_t)t0 * ys + r;
                const char *wr = KROW(w, wrb, r);
                KX_TILE_T(kx_qtile, KX_MR, T, type, wr, wrb, x, xrb, nb)
            }
            for (; r < c1; r++) {
                float *y = yy + (int64_t)t0 * ys + r;
                const char *wr = KROW(w, wrb, r);
                KX_TILE_T(kx_qtile, 1, T, type, wr, wrb, x, xrb, nb)
            }
        }
    }
}

KOUT void kx_matmul_q4_0(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                         int64_t ys, int64_t r0, int64_t r1)
{
    kx_qmatmul(KX_Q4_0, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);
}

KOUT void kx_matmul_q8_0(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                         int64_t ys, int64_t r0, int64_t r1)
{
    kx_qmatmul(KX_Q8_0, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);
}

/* ------------------------------------------------------------------ float tile */

KFN __m256 kx_ld8(const int type, const void *p, int64_t i)
{
    if (type == KX_F32) return _mm256_loadu_ps((const float *)p + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (type == KX_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

KFN float kx_ld1(const int type, const void *p, int64_t i)
{
    if (type == KX_F32) return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    if (type == KX_F16) return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

KFN void kx_ftile(const int type, const char *w, size_t wrb, const char *x, size_t xrb, int64_t n, const int R,
                  const int T, float *y, int64_t ys)
{
    __m256 acc[KX_MR][KX_NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 W[KX_MR];
        for (int r = 0; r < R; r++) W[r] = kx_ld8(type, w + (size_t)r * wrb, i);
        for (int t = 0; t < T; t++) {
            const __m256 A = _mm256_loadu_ps((const float *)(x + (size_t)t * xrb) + i);
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(W[r], A, acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++) {
        for (int t = 0; t < T; t++) {
            float s = kx_hsum(acc[r][t]);
            const float *xt = (const float *)(x + (size_t)t * xrb);
            for (int64_t k = i; k < n; k++) s += kx_ld1(type, w + (size_t)r * wrb, k) * xt[k];
            y[(int64_t)t * ys + r] = s;
        }
    }
}

KFN void kx_fmatmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                    float *yy, int64_t ys, int64_t r0, int64_t r1)
{
    for (int64_t c0 = r0; c0 < r1; c0 += KX_CHUNK) {
        const int64_t c1 = c0 + KX_CHUNK < r1 ? c0 + KX_CHUNK : r1;
        for (int t0 = 0; t0 < n_tok; t0 += KX_NT) {
            const int T = n_tok - t0 < KX_NT ? n_tok - t0 : KX_NT;
            const char *x = KROW(xq, xrb, t0);
            int64_t r = c0;
            for (; r + KX_MR <= c1; r += KX_MR) {
                float *y = yy + (int64_t)t0 * ys + r;
                const char *wr = KROW(w, wrb, r);
                KX_TILE_T(kx_ftile, KX_MR, T, type, wr, wrb, x, xrb, n)
            }
            for (; r < c1; r++) {
                float *y = yy + (int64_t)t0 * ys + r;
                const char *wr = KROW(w, wrb, r);
                KX_TILE_T(kx_ftile, 1, T, type, wr, wrb, x, xrb, n)
            }
        }
    }
}

KOUT void kx_matmul_f32(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                        int64_t ys, int64_t r0, int64_t r1)
{
    kx_fmatmul(KX_F32, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);
}

KOUT void kx_matmul_f16(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                        int64_t ys, int64_t r0, int64_t r1)
{
    kx_fmatmul(KX_F16, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);
}

KOUT void kx_matmul_bf16(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                         int64_t ys, int64_t r0, int64_t r1)
{
    kx_fmatmul(KX_BF16, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);
}

/* ------------------------------------------------------------------ activation quantizer */

/* Bit-identical to tp_kern_quant_a8_scalar: same amax, d = amax/127, id = 1/d,
 * q = round-half-even(x * id) (vcvtps2dq under the default MXCSR). */
KOUT void kx_quant_a8(const float *x, tp_blk_a8 *out, int64_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / TP_QK; b++) {
        const float *xb = x + b * TP_QK;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = d;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)out[b].qs, _mm256_permutevar8x32_epi32(p, perm));
    }
}

KOUT void kx_fill_ops(struct tp_kern_ops *ops)
{
    ops->matmul[TP_WTYPE_F32] = kx_matmul_f32;
    ops->matmul[TP_WTYPE_F16] = kx_matmul_f16;
    ops->matmul[TP_WTYPE_BF16] = kx_matmul_bf16;
    ops->matmul[TP_WTYPE_Q8_0] = kx_matmul_q8_0;
    ops->matmul[TP_WTYPE_Q4_0] = kx_matmul_q4_0;
    ops->quant_a8 = kx_quant_a8;
}

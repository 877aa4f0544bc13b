/*
 * model/kernels/kernels_mlx_x86_impl.h - private template for the x86-64 MLX affine
 * kernels, included by kernels_mlx_avx2.c and kernels_mlx_avx512.c with
 *   KM_TARGET   target attribute string
 *   KM_512      1: AVX-512 + VNNI, two 32-value blocks per zmm, vpdpbusd
 *                  straight on the unsigned q (4 and 8 bits);
 *               0: AVX2, one block per ymm, vpmaddubsw + vpmaddwd; 8-bit q
 *                  go in as q - 128 with the sign trick (vpmaddubsw would
 *                  saturate on 255 * 127 * 2), corrected once per row by
 *                  128 * sum_g scale_g * ms_g
 *   KM_MR/KM_NT register tile for many tokens (weight rows x tokens)
 *
 * The packed words are read in place: 16 bytes of a 4-bit row are one
 * 32-value block (low nibbles = even elements, high = odd, which is the order
 * of the m8 activation row), 32 bytes of an 8-bit row likewise.  Per block:
 * an exact integer dot, converted and scaled by scale_g * d_b into float
 * lanes; per row at the end, the bias term sum_g bias_g * ms_g (a short f16 /
 * bf16 dot over the groups).  Layouts: kernels_mlx_impl.h.
 */
#ifndef KM_TARGET
#error "define KM_TARGET, KM_512, KM_MR, KM_NT before including kernels_mlx_x86_impl.h"
#endif

#include <immintrin.h>
#include <string.h>

#include "kernels/kernels_mlx_impl.h"

#define KFN static inline __attribute__((always_inline, target(KM_TARGET)))
#define KOUT static __attribute__((target(KM_TARGET)))
#define KM_CHUNK 64
#define KM_PF 1024 /* software prefetch distance of the decode weight stream (bytes) */
#define KM_S8 (!KM_512) /* 8-bit weights enter the integer dot as q - 128 */

/* ------------------------------------------------------------ scales, biases */

KFN float km_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KFN float km_sb1(const char *p, int64_t i, const int bf)
{
    uint16_t h;
    memcpy(&h, p + 2 * i, sizeof h);
    if (bf) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    return _cvtsh_ss(h);
}

/* 4 .. 8 halves (in the low lanes of h) to floats */
KFN __m128 km_h4(__m128i h, const int bf)
{
    return bf ? _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)) : _mm_cvtph_ps(h);
}
KFN __m256 km_h8(__m128i h, const int bf)
{
    return bf ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

/* sum_g v[g] * ms[g] over ng groups, v a row of fp16/bf16 (biases or scales) */
KFN float km_gdot(const char *v, const float *ms, int64_t ng, const int bf)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= ng; g += 8)
        acc = _mm256_fmadd_ps(km_h8(_mm_loadu_si128((const __m128i *)(v + 2 * g)), bf), _mm256_loadu_ps(ms + g), acc);
    float s = km_hsum(acc);
    for (; g < ng; g++) s += km_sb1(v, g, bf) * ms[g];
    return s;
}

/* The bias term of one (row, token) and the q - 128 correction. */
KFN float km_tail(const int bits, const char *sr, const char *br, const float *ms, int64_t ng, const int bf)
{
    float v = km_gdot(br, ms, ng, bf);
    if (KM_S8 && bits == 8) v += 128.0f * km_gdot(sr, ms, ng, bf);
    return v;
}

/* Scales of the 4 blocks b .. b+3 (b a multiple of 4): G = 32 four groups, G = 64 two, each twice. */
KFN __m128 km_sc4(const char *sr, int64_t b, const int G, const int bf)
{
    if (G == 32) return km_h4(_mm_loadl_epi64((const __m128i *)(sr + 2 * b)), bf);
    int32_t v;
    memcpy(&v, sr + 2 * (b / 2), sizeof v);
    const __m128i h = _mm_cvtsi32_si128(v);
    return km_h4(_mm_unpacklo_epi16(h, h), bf);
}

#if !KM_512
/* ================================================================== AVX2 (256-bit) */

KFN __m256i km_dot(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Weight block as the unsigned operand W and, for 8 bits, the raw signed q - 128 (sign source). */
KFN void km_wblk(const int bits, const uint8_t *wb, __m256i *W, __m256i *Wr)
{
    if (bits == 4) {
        const __m128i q = _mm_loadu_si128((const __m128i *)wb);
        *W = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
        *Wr = *W;
    } else {
        *Wr = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)wb), _mm256_set1_epi8((char)0x80));
        *W = _mm256_abs_epi8(*Wr);
    }
}

KFN __m256i km_idot(const int bits, __m256i W, __m256i Wr, __m256i A)
{
    return bits == 4 ? km_dot(W, A) : km_dot(W, _mm256_sign_epi8(A, Wr));
}

KFN void km_decode(const int bits, const int G, const int bf, const uint8_t *w, size_t wrb,
                   const struct tp_kern_groups *gp, int64_t n, const void *xq, float *y, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_M8_BLK, ng = n / G;
    const size_t bpb = (size_t)TP_M8_BLK * (size_t)bits / 8; /* packed bytes per 32-block */
    const int8_t *aq = TP_M8_QS(xq);
    const float *ad = TP_M8_D(xq, n), *ms = TP_M8_MS(xq, n);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * wrb;
        const char *sr = (const char *)gp->scales + (size_t)r * gp->row_bytes;
        const char *br = (const char *)gp->biases + (size_t)r * gp->row_bytes;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        int64_t b = 0;
        for (; b + 4 <= nb; b += 4) {
            _mm_prefetch((const char *)wr + (size_t)b * bpb + KM_PF, _MM_HINT_T0);
            if (bits == 8) _mm_prefetch((const char *)wr + (size_t)b * bpb + KM_PF + 64, _MM_HINT_T0);
            const __m256 s4 = _mm256_castps128_ps256(_mm_mul_ps(km_sc4(sr, b, G, bf), _mm_loadu_ps(ad + b)));
            for (int k = 0; k < 4; k++) {
                __m256i W, Wr;
                km_wblk(bits, wr + (size_t)(b + k) * bpb, &W, &Wr);
                const __m256i A = _mm256_loadu_si256((const __m256i *)(aq + (b + k) * TP_M8_BLK));
                const __m256 sk = _mm256_permutevar8x32_ps(s4, _mm256_set1_epi32(k));
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(km_idot(bits, W, Wr, A)), sk, acc[k]);
            }
        }
        for (; b < nb; b++) {
            __m256i W, Wr;
            km_wblk(bits, wr + (size_t)b * bpb, &W, &Wr);
            const __m256i A = _mm256_loadu_si256((const __m256i *)(aq + b * TP_M8_BLK));
            acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(km_idot(bits, W, Wr, A)),
                                     _mm256_set1_ps(km_sb1(sr, b * TP_M8_BLK / G, bf) * ad[b]), acc[0]);
        }
        y[r] = km_hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))) +
               km_tail(bits, sr, br, ms, ng, bf);
    }
}

KFN void km_tile(const int bits, const int G, const int bf, const uint8_t *w, size_t wrb, const char *s,
                 const char *bi, size_t srb, const char *x, size_t xrb, int64_t n, const int R, const int T, float *y,
                 int64_t ys)
{
    const int64_t nb = n / TP_M8_BLK, ng = n / G;
    const size_t bpb = (size_t)TP_M8_BLK * (size_t)bits / 8;
    __m256 acc[KM_MR][KM_NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i W[KM_MR], Wr[KM_MR];
        float sc[KM_MR];
        for (int r = 0; r < R; r++) {
            km_wblk(bits, w + (size_t)r * wrb + (size_t)b * bpb, &W[r], &Wr[r]);
            sc[r] = km_sb1(s + (size_t)r * srb, b * TP_M8_BLK / G, bf);
        }
        for (int t = 0; t < T; t++) {
            const char *row = x + (size_t)t * xrb;
            const __m256i A = _mm256_loadu_si256((const __m256i *)(TP_M8_QS(row) + b * TP_M8_BLK));
            const float da = TP_M8_D(row, n)[b];
            for (int r = 0; r < R; r++)
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(km_idot(bits, W[r], Wr[r], A)),
                                            _mm256_set1_ps(sc[r] * da), acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            y[(int64_t)t * ys + r] = km_hsum(acc[r][t]) + km_tail(bits, s + (size_t)r * srb, bi + (size_t)r * srb,
                                                                  TP_M8_MS(x + (size_t)t * xrb, n), ng, bf);
}

#else
/* ================================================================== AVX-512 + VNNI (512-bit) */

/* Weight blocks b, b+1 as 64 u8 (one: block b only, upper half zero; never reads b+1). */
KFN __m512i km_w2(const int bits, const uint8_t *wb, const int one)
{
    if (bits == 4) {
        const __m128i q0 = _mm_loadu_si128((const __m128i *)wb);
        const __m128i q1 = one ? _mm_setzero_si128() : _mm_loadu_si128((const __m128i *)(wb + 16));
        const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
        __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
        z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)); /* q0, q0>>4, q1, q1>>4 */
        return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
    }
    return one ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, wb) : _mm512_loadu_si512(wb);
}

KFN __m512i km_a2(const int8_t *a, const int one)
{
    return one ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, a) : _mm512_loadu_si512(a);
}

/* lanes 0-7 <- v[0], 8-15 <- v[1] (idx01) or v[2], v[3] (idx23) */
#define KM_IDX01 _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
#define KM_IDX23 _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)

/* Scales of blocks b, b+1 (b even; one: block b only) in lanes 0, 1. */
KFN __m128 km_sc2(const char *sr, int64_t b, const int G, const int bf, const int one)
{
    uint32_t v;
    if (G == 64) {
        uint16_t h;
        memcpy(&h, sr + 2 * (b / 2), sizeof h);
        v = (uint32_t)h * 0x10001u;
    } else if (one) {
        uint16_t h;
        memcpy(&h, sr + 2 * b, sizeof h);
        v = h;
    } else {
        memcpy(&v, sr + 2 * b, sizeof v);
    }
    return km_h4(_mm_cvtsi32_si128((int)v), bf);
}

KFN __m128 km_d2(const float *ad, int64_t b, const int one)
{
    return one ? _mm_load_ss(ad + b) : _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(ad + b)));
}

/* acc + lanes of bias_g * ms_g over the ng groups (16 per step, masked tail): the
 * bias term joins the accumulator, so a row / tile entry needs one reduction only */
KFN __m512 km_gacc(__m512 acc, const char *v, const float *ms, int64_t ng, const int bf)
{
    for (int64_t g = 0; g < ng; g += 16) {
        const __mmask16 m = ng - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ng - g)) - 1);
        const __m256i h = _mm256_maskz_loadu_epi16(m, v + 2 * g);
        const __m512 bv = bf ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
        acc = _mm512_fmadd_ps(bv, _mm512_maskz_loadu_ps(m, ms + g), acc);
    }
    return acc;
}

KFN __m512 km_pair(const int bits, const uint8_t *wb, const int8_t *a, __m512 scale, __m512 acc, const int one)
{
    const __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), km_w2(bits, wb, one), km_a2(a, one));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), scale, acc);
}

KFN void km_decode(const int bits, const int G, const int bf, const uint8_t *w, size_t wrb,
                   const struct tp_kern_groups *gp, int64_t n, const void *xq, float *y, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_M8_BLK, ng = n / G;
    const size_t bpb = (size_t)TP_M8_BLK * (size_t)bits / 8;
    const int8_t *aq = TP_M8_QS(xq);
    const float *ad = TP_M8_D(xq, n), *ms = TP_M8_MS(xq, n);
    const __m512i i01 = KM_IDX01, i23 = KM_IDX23;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * wrb;
        const char *sr = (const char *)gp->scales + (size_t)r * gp->row_bytes;
        const char *br = (const char *)gp->biases + (size_t)r * gp->row_bytes;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        int64_t b = 0;
        for (; b + 4 <= nb; b += 4) {
            _mm_prefetch((const char *)wr + (size_t)b * bpb + KM_PF, _MM_HINT_T0);
            if (bits == 8) _mm_prefetch((const char *)wr + (size_t)b * bpb + KM_PF + 64, _MM_HINT_T0);
            const __m512 s4 = _mm512_castps128_ps512(_mm_mul_ps(km_sc4(sr, b, G, bf), _mm_loadu_ps(ad + b)));
            acc0 = km_pair(bits, wr + (size_t)b * bpb, aq + b * TP_M8_BLK, _mm512_permutexvar_ps(i01, s4), acc0, 0);
            acc1 = km_pair(bits, wr + (size_t)(b + 2) * bpb, aq + (b + 2) * TP_M8_BLK,
                           _mm512_permutexvar_ps(i23, s4), acc1, 0);
        }
        for (; b < nb; b += 2) {
            const int one = b + 1 == nb;
            const __m512 s2 = _mm512_permutexvar_ps(
                i01, _mm512_castps128_ps512(_mm_mul_ps(km_sc2(sr, b, G, bf, one), km_d2(ad, b, one))));
            if (one) acc0 = km_pair(bits, wr + (size_t)b * bpb, aq + b * TP_M8_BLK, s2, acc0, 1);
            else acc0 = km_pair(bits, wr + (size_t)b * bpb, aq + b * TP_M8_BLK, s2, acc0, 0);
        }
        y[r] = _mm512_reduce_add_ps(km_gacc(_mm512_add_ps(acc0, acc1), br, ms, ng, bf));
    }
}

/* One step of the R x T tile over blocks b, b+1 (one: block b only). */
KFN void km_tile_step(const int bits, const int G, const int bf, const uint8_t *w, size_t wrb, const char *s,
                      size_t srb, const char *x, size_t xrb, int64_t n, int64_t b, const int R, const int T,
                      __m512 acc[KM_MR][KM_NT], const int one)
{
    const size_t bpb = (size_t)TP_M8_BLK * (size_t)bits / 8;
    const __m512i i01 = KM_IDX01;
    __m512i W[KM_MR];
    __m512 sw[KM_MR];
    for (int r = 0; r < R; r++) {
        W[r] = km_w2(bits, w + (size_t)r * wrb + (size_t)b * bpb, one);
        sw[r] = _mm512_permutexvar_ps(i01, _mm512_castps128_ps512(km_sc2(s + (size_t)r * srb, b, G, bf, one)));
    }
    for (int t = 0; t < T; t++) {
        const char *row = x + (size_t)t * xrb;
        const __m512i A = km_a2(TP_M8_QS(row) + b * TP_M8_BLK, one);
        const __m512 da = _mm512_permutexvar_ps(i01, _mm512_castps128_ps512(km_d2(TP_M8_D(row, n), b, one)));
        for (int r = 0; r < R; r++) {
            const __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[r], A);
            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(sw[r], da), acc[r][t]);
        }
    }
}

KFN void km_tile(const int bits, const int G, const int bf, const uint8_t *w, size_t wrb, const char *s,
                 const char *bi, size_t srb, const char *x, size_t xrb, int64_t n, const int R, const int T, float *y,
                 int64_t ys)
{
    const int64_t nb = n / TP_M8_BLK, ng = n / G;
    __m512 acc[KM_MR][KM_NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) km_tile_step(bits, G, bf, w, wrb, s, srb, x, xrb, n, b, R, T, acc, 0);
    if (b < nb) km_tile_step(bits, G, bf, w, wrb, s, srb, x, xrb, n, b, R, T, acc, 1);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            y[(int64_t)t * ys + r] =
                _mm512_reduce_add_ps(km_gacc(acc[r][t], bi + (size_t)r * srb, TP_M8_MS(x + (size_t)t * xrb, n), ng, bf));
}

/* ---- several tokens (small batches and prefill): 16 rows in the lanes of a zmm ----
 *
 * As kernels_x86_impl.h's kx_qbatch does for Q4_0: lane L of a zmm holds one
 * row of a 16-row group, so one vpdpbusd adds a 4-value slice of a 32-block
 * for 16 rows, and after the block's 8 slices each lane holds its row's
 * exact integer block dot; the conversion, the scale (the 16 rows' group
 * scales x the token's d[b]) and the accumulation then cost 3 instructions
 * per 16 rows x token x block, and the bias term one fma per 16 rows x token
 * x group (the 16 rows' biases x the token's ms[g]).  The transposed slices
 * of a block are built once per pass and serve up to KM_BT tokens.  Lane
 * L = 4m + p holds row 4p + m (the 4x4 transpose's order); outputs are
 * permuted back once per group.  A ragged last group repeats its last row
 * in the unused lanes (not stored), so every row is computed the same way
 * whatever the split of rows over threads.
 */
#ifndef KM_BATCH_MAX
#define KM_BATCH_MAX 1000000 /* n_tok (>= 2) up to this use km_batch, more the km_tile tiles */
#endif
#define KM_BT 8 /* tokens per pass over a row group */
#define KM_PFB 256 /* prefetch distance per row stream (bytes) */
#define KM_LANE_ROWS _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)

#include "kernels/kernels_x86_rows16_impl.h"

/* The 32-block at p (+ ro[k] for row k) of 16 rows as 8 slices in m8 position order:
 * 4 bits: W[j] = low nibbles of packed dword j (positions 4j..4j+3), W[j + 4] its high
 * nibbles (positions 16 + 4j..); 8 bits: the q bytes as they are. */
KFN void km_wslices(const int bits, const uint8_t *p, const size_t ro[16], __m512i W[8])
{
    __m512i z[4];
    tp_rows16_load(p, ro, z);
    tp_rows16_tr4(z, W);
    if (bits == 4) {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        for (int j = 0; j < 4; j++) {
            W[j + 4] = _mm512_and_si512(_mm512_srli_epi16(W[j], 4), m4);
            W[j] = _mm512_and_si512(W[j], m4);
        }
    } else {
        tp_rows16_load(p + 16, ro, z);
        tp_rows16_tr4(z, W + 4);
    }
}

/* Group g's fp16/bf16 values of the 16 rows (lane L: row at offset so[L]) as floats. */
KFN __m512 km_sb16(const char *s, const size_t so[16], int64_t g, const int bf)
{
    uint16_t h[16];
    for (int l = 0; l < 16; l++) memcpy(&h[l], s + so[l] + 2 * (size_t)g, sizeof h[l]);
    const __m256i v = _mm256_loadu_si256((const __m256i *)h);
    return bf ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)) : _mm512_cvtph_ps(v);
}

/* Groups g0 .. g0 + 7 of the 16 rows as floats in lane order, f[g - g0][lane]: one 16-byte load
 * per row and the dword transpose (natural-order row offsets sr[k]) when 8 groups remain in
 * the row, else group by group (lane-order offsets so[l]); never reads past a row. */
KFN void km_sb8x16(const char *s, const size_t sr[16], const size_t so[16], int64_t g0, int64_t ng, const int bf,
                   float f[8][16])
{
    if (g0 + 8 <= ng) {
        __m512i z[4], d[4];
        tp_rows16_load((const uint8_t *)s + 2 * g0, sr, z);
        tp_rows16_tr4(z, d); /* d[j] lane l: groups g0 + 2j (low half), g0 + 2j + 1 (high half) of its row */
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm512_cvtepi32_epi16(h ? _mm512_srli_epi32(d[j], 16) : d[j]);
                _mm512_storeu_ps(f[2 * j + h], bf ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))
                                                  : _mm512_cvtph_ps(v));
            }
        return;
    }
    for (int64_t g = g0; g < ng; g++) _mm512_storeu_ps(f[g - g0], km_sb16(s, so, g, bf));
}

KFN __m512 km_bcf(const void *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_ps(v);
}
KFN __m512i km_bc32(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/* Token t of the pass (written out 8 times so the 8 tokens' dependent vpdpbusd chains
 * interleave): the block's dot for 16 rows, scaled by the rows' group scales x d[b]. */
#define KM_BTOK(t)                                                                                              \
    if (T > t) {                                                                                                \
        const char *row = x + (size_t)(t) * xrb;                                                                \
        const int8_t *q = TP_M8_QS(row) + b * TP_M8_BLK;                                                        \
        __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[0], km_bc32(q));                              \
        i = _mm512_dpbusd_epi32(i, W[1], km_bc32(q + 4));                                                       \
        i = _mm512_dpbusd_epi32(i, W[2], km_bc32(q + 8));                                                       \
        i = _mm512_dpbusd_epi32(i, W[3], km_bc32(q + 12));                                                      \
        i = _mm512_dpbusd_epi32(i, W[4], km_bc32(q + 16));                                                      \
        i = _mm512_dpbusd_epi32(i, W[5], km_bc32(q + 20));                                                      \
        i = _mm512_dpbusd_epi32(i, W[6], km_bc32(q + 24));                                                      \
        i = _mm512_dpbusd_epi32(i, W[7], km_bc32(q + 28));                                                      \
        acc##t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(sv, km_bcf(TP_M8_D(row, n) + b)), acc##t); \
    }
/* Token t's bias term of group g: the 16 rows' biases x its ms[g]. */
#define KM_BBIAS(t)                                                                                             \
    if (T > t) acc##t = _mm512_fmadd_ps(bv, km_bcf(TP_M8_MS(x + (size_t)(t) * xrb, n) + g), acc##t);

/* One pass: 16 rows (weights at w + ro[k], scales / biases at s / bi + sr[k], lane order so[l])
 * x T tokens, all blocks. */
KFN void km_batch_pass(const int bits, const int G, const int bf, const uint8_t *w, const size_t ro[16], const char *s,
                       const char *bi, const size_t sr[16], const size_t so[16], const char *x, size_t xrb, int64_t n,
                       const int T, __m512 out[KM_BT])
{
    const int64_t nb = n / TP_M8_BLK, ng = n / G;
    float sc[8][16], bs[8][16]; /* 8 groups' scales / biases of the 16 rows, lane order */
    const size_t bpb = (size_t)TP_M8_BLK * (size_t)bits / 8;
    const int bpg = G / TP_M8_BLK;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0, acc5 = acc0, acc6 = acc0,
           acc7 = acc0;
    __m512 sv = acc0;
    for (int64_t b = 0; b < nb; b++) {
        if (b % bpg == 0) { /* a new group: its scales, and its bias term for every token */
            const int64_t g = b / bpg;
            if (g % 8 == 0) {
                km_sb8x16(s, sr, so, g, ng, bf, sc);
                km_sb8x16(bi, sr, so, g, ng, bf, bs);
            }
            sv = _mm512_loadu_ps(sc[g % 8]);
            const __m512 bv = _mm512_loadu_ps(bs[g % 8]);
            KM_BBIAS(0)
            KM_BBIAS(1)
            KM_BBIAS(2)
            KM_BBIAS(3)
            KM_BBIAS(4)
            KM_BBIAS(5)
            KM_BBIAS(6)
            KM_BBIAS(7)
        }
        /* 16 row streams are more than the hardware prefetcher follows: each row KM_PFB ahead, every line once */
        if (bits == 8 || (b & 3) == 0)
            for (int k = 0; k < 16; k++) _mm_prefetch((const char *)w + ro[k] + (size_t)b * bpb + KM_PFB, _MM_HINT_T0);
        __m512i W[8];
        km_wslices(bits, w + (size_t)b * bpb, ro, W);
        KM_BTOK(0)
        KM_BTOK(1)
        KM_BTOK(2)
        KM_BTOK(3)
        KM_BTOK(4)
        KM_BTOK(5)
        KM_BTOK(6)
        KM_BTOK(7)
    }
    out[0] = acc0, out[1] = acc1, out[2] = acc2, out[3] = acc3;
    out[4] = acc4, out[5] = acc5, out[6] = acc6, out[7] = acc7;
}

KFN void km_batch(const int bits, const int G, const int bf, const void *w, size_t wrb, const struct tp_kern_groups *gp,
                  int64_t n, const void *xq, size_t xrb, int n_tok, float *y, int64_t ys, int64_t r0, int64_t r1)
{
    const __m512i lane_rows = KM_LANE_ROWS;
    const size_t srb = gp->row_bytes;
    for (int64_t r = r0; r < r1; r += 16) {
        const int nr = r1 - r < 16 ? (int)(r1 - r) : 16;
        size_t ro[16], sr[16], so[16];
        for (int k = 0; k < 16; k++) {
            ro[k] = (size_t)(k < nr ? k : nr - 1) * wrb;
            sr[k] = (size_t)(k < nr ? k : nr - 1) * srb;
        }
        for (int l = 0; l < 16; l++) { /* lane l holds row 4 (l % 4) + l / 4 */
            const int k = 4 * (l % 4) + l / 4;
            so[l] = (size_t)(k < nr ? k : nr - 1) * srb;
        }
        const __mmask16 keep = (__mmask16)((1u << nr) - 1u);
        const uint8_t *wg = (const uint8_t *)w + (size_t)r * wrb;
        const char *sg = (const char *)gp->scales + (size_t)r * srb, *bg = (const char *)gp->biases + (size_t)r * srb;
        for (int t0 = 0; t0 < n_tok; t0 += KM_BT) {
            const int T = n_tok - t0 < KM_BT ? n_tok - t0 : KM_BT;
            const char *x = (const char *)xq + (size_t)t0 * xrb;
            __m512 out[KM_BT];
            switch (T) {
            case 1: km_batch_pass(bits, G, bf, wg, ro, sg, bg, sr, so, x, xrb, n, 1, out); break;
            case 2: km_batch_pass(bits, G, bf, wg, ro, sg, bg, sr, so, x, xrb, n, 2, out); break;
            case 3: km_batch_pass(bits, G, bf, wg, ro, sg, bg, sr, so, x, xrb, n, 3, out); break;
            case 4: km_batch_pass(bits, G, bf, wg, ro, sg, bg, sr, so, x, xrb, n, 4, out); break;
            case 5: km_batch_pass(bits, G, bf, wg, ro, sg, bg, sr, so, x, xrb, n, 5, out); break;
            case 6: km_batch_pass(bits, G, bf, wg, ro, sg, bg, sr, so, x, xrb, n, 6, out); break;
            case 7: km_batch_pass(bits, G, bf, wg, ro, sg, bg, sr, so, x, xrb, n, 7, out); break;
            default: km_batch_pass(bits, G, bf, wg, ro, sg, bg, sr, so, x, xrb, n, KM_BT, out); break;
            }
            for (int t = 0; t < T; t++)
                _mm512_mask_storeu_ps(y + (int64_t)(t0 + t) * ys + r, keep, _mm512_permutexvar_ps(lane_rows, out[t]));
        }
    }
}
_Static_assert(KM_BT == 8, "km_batch's switch assumes 8 tokens per pass");
#endif

/* ================================================================== driver (shared) */

/* One tile with R rows and T (1..KM_NT) tokens as compile-time constants. */
#define KM_TILE_T(R, T)                                                                          \
    switch (T) {                                                                                 \
    case 1: km_tile(bits, G, bf, wr, wrb, sr, br, srb, x, xrb, n, R, 1, y, ys); break;           \
    case 2: km_tile(bits, G, bf, wr, wrb, sr, br, srb, x, xrb, n, R, 2, y, ys); break;           \
    case 3: km_tile(bits, G, bf, wr, wrb, sr, br, srb, x, xrb, n, R, 3, y, ys); break;           \
    default: km_tile(bits, G, bf, wr, wrb, sr, br, srb, x, xrb, n, R, KM_NT, y, ys); break;      \
    }
_Static_assert(KM_NT == 4, "KM_TILE_T assumes 4 tokens per tile");

KFN void km_matmul(const int bits, const int G, const int bf, const void *w, size_t wrb,
                   const struct tp_kern_groups *gp, int64_t n, const void *xq, size_t xrb, int n_tok, float *yy,
                   int64_t ys, int64_t r0, int64_t r1)
{
    if (n_tok == 1) {
        km_decode(bits, G, bf, w, wrb, gp, n, xq, yy, r0, r1);
        return;
    }
#if KM_512
    if (n_tok <= KM_BATCH_MAX) { /* rows in lanes; the tiles below serve AVX2 (and AVX-512 past KM_BATCH_MAX) */
        km_batch(bits, G, bf, w, wrb, gp, n, xq, xrb, n_tok, yy, ys, r0, r1);
        return;
    }
#endif
    const size_t srb = gp->row_bytes;
    /* chunks of KM_CHUNK rows: a chunk's weights stay in cache while every token tile passes over them */
    for (int64_t c0 = r0; c0 < r1; c0 += KM_CHUNK) {
        const int64_t c1 = c0 + KM_CHUNK < r1 ? c0 + KM_CHUNK : r1;
        for (int t0 = 0; t0 < n_tok; t0 += KM_NT) {
            const int T = n_tok - t0 < KM_NT ? n_tok - t0 : KM_NT;
            const char *x = (const char *)xq + (size_t)t0 * xrb;
            int64_t r = c0;
            for (; r < c1; r += (c1 - r >= KM_MR ? KM_MR : 1)) {
                const uint8_t *wr = (const uint8_t *)w + (size_t)r * wrb;
                const char *sr = (const char *)gp->scales + (size_t)r * srb;
                const char *br = (const char *)gp->biases + (size_t)r * srb;
                float *y = yy + (int64_t)t0 * ys + r;
                if (c1 - r >= KM_MR) {
                    KM_TILE_T(KM_MR, T)
                } else {
                    KM_TILE_T(1, T)
                }
            }
        }
    }
}

#define KM_ENTRY(name, bits, G)                                                                                 \
    KOUT void name(const void *w, size_t wrb, const struct tp_kern_groups *gp, int64_t n, const void *xq,      \
                   size_t xrb, int n_tok, float *y, int64_t ys, int64_t r0, int64_t r1)                        \
    {                                                                                                           \
        if (gp->bf16) km_matmul(bits, G, 1, w, wrb, gp, n, xq, xrb, n_tok, y, ys, r0, r1);                     \
        else km_matmul(bits, G, 0, w, wrb, gp, n, xq, xrb, n_tok, y, ys, r0, r1);                              \
    }
KM_ENTRY(km_matmul_q4_g32, 4, 32)
KM_ENTRY(km_matmul_q4_g64, 4, 64)
KM_ENTRY(km_matmul_q8_g32, 8, 32)
KM_ENTRY(km_matmul_q8_g64, 8, 64)

KOUT void km_fill_ops(struct tp_kern_ops *ops)
{
    ops->mlx[0] = km_matmul_q4_g32;
    ops->mlx[1] = km_matmul_q4_g64;
    ops->mlx[2] = km_matmul_q8_g32;
    ops->mlx[3] = km_matmul_q8_g64;
}

/*
 * model/kernels/kernels_x86_impl.h - private template for the x86-64 kernels,
 * included by kernels_avx2.c and kernels_avx512.c with
 *   KX_TARGET  target attribute string (no -march flags needed in the build)
 *   KX_512     1: 512-bit AVX-512 kernels, integer dots with vpdpbusd (VNNI),
 *                 two 32-value blocks per zmm register;
 *              0: 256-bit AVX2 kernels, vpmaddubsw + vpmaddwd, one block per ymm
 *   KX_MR/KX_NT  register tile for many tokens: weight rows x tokens
 *
 * Quantized types use u8 x s8 integer dots.  Q4_0 nibbles are 0..15 and the
 * -8 offset enters through the activation row's correction vector c (see
 * kernels_impl.h), which seeds the integer accumulator; Q8_0 uses the sign
 * trick on AVX2 and a +128 bias (xor 0x80) with c on AVX-512.  Either way
 * each block's integer dot is exact, then scaled by d_w * d_x in float.
 *
 * One token (decode): quantized rows one after another (a single contiguous
 * weight stream, prefetched ahead), float rows KX_DROWS side by side (as many
 * weight streams, the activation loads shared).  Several tokens on AVX-512 (small
 * batches and prefill alike): kx_qbatch puts 16 rows in the 16 lanes of a
 * zmm (a transposed block costs one vpdpbusd per 4 values of 16 rows, and the
 * float scale/accumulate runs once per 16 rows x token x block), up to 8
 * tokens per pass over a 16-row group, with those tokens' activations packed
 * block by block into one stream (an 80 KiB stack buffer).  On AVX2 (and for
 * float weights), a KX_MR x KX_NT register tile so each unpacked
 * weight block serves KX_NT tokens, over chunks of KX_CHUNK rows so a
 * chunk's weights stay in L1/L2 while all token tiles pass over it.
 */
#ifndef KX_TARGET
#error "define KX_TARGET, KX_512, KX_MR, KX_NT before including kernels_x86_impl.h"
#endif

#include <immintrin.h>
#include <string.h>

#include "kernels/kernels_a8pack_impl.h"
#include "kernels/kernels_impl.h"

#define KFN static inline __attribute__((always_inline, target(KX_TARGET)))
#define KOUT static __attribute__((target(KX_TARGET)))
#define KX_CHUNK 64
#define KX_PF 12288 /* software prefetch distance of the row-major quantized decode (bytes) */
/* Rows the float decode reads side by side, no software prefetch; the activation loads are
 * shared by the rows.  (The x16 decodes now read one stream, kernels_x16_avx512.c x16_decode;
 * this one has not been measured that way.) */
#ifndef KX_DROWS
#define KX_DROWS 4
#endif
#define KROW(p, rb, r) ((const void *)((const char *)(p) + (size_t)(r) * (rb)))

enum { KX_Q4_0, KX_Q8_0, KX_F32, KX_F16, KX_BF16 };

KFN float kx_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KFN uint16_t kx_u16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* activation row views */
struct kx_act {
    const int8_t *qs;
    const float *d;
    const int32_t *c;
};
KFN struct kx_act kx_act_row(const void *row, int64_t n)
{
    struct kx_act a = {TP_A8_QS(row), TP_A8_D(row, n), TP_A8_C(row, n)};
    return a;
}

KFN size_t kx_bsz(const int type) { return type == KX_Q4_0 ? sizeof(tp_blk_q4_0) : sizeof(tp_blk_q8_0); }

#if !KX_512
/* ================================================================== AVX2 (256-bit) */

/* acc + sum over groups of 4 of u8(u) * s8(s), per 32-bit lane */
KFN __m256i kx_dot(__m256i acc, __m256i u, __m256i s)
{
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

/* Exact integer dot of weight block b of row wr with activation block b, as 8 lanes. */
KFN __m256i kx_idot(const int type, const char *wr, int64_t b, struct kx_act a)
{
    const __m256i A = _mm256_loadu_si256((const __m256i *)(a.qs + b * TP_QK));
    if (type == KX_Q4_0) {
        const tp_blk_q4_0 *wb = (const tp_blk_q4_0 *)wr + b;
        const __m128i q = _mm_loadu_si128((const __m128i *)wb->qs);
        const __m256i W = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
        return kx_dot(_mm256_loadu_si256((const __m256i *)(a.c + b * 8)), W, A);
    }
    const tp_blk_q8_0 *wb = (const tp_blk_q8_0 *)wr + b;
    const __m256i W = _mm256_loadu_si256((const __m256i *)wb->qs);
    return kx_dot(_mm256_setzero_si256(), _mm256_abs_epi8(W), _mm256_sign_epi8(A, W));
}

KFN float kx_dw(const int type, const char *wr, int64_t b)
{
    return _cvtsh_ss(kx_u16(wr + (size_t)b * kx_bsz(type)));
}

KFN void kx_qdecode(const int type, const void *w, size_t wrb, int64_t n, const void *xq, float *y, int64_t r0,
                    int64_t r1)
{
    const int64_t nb = n / TP_QK;
    const struct kx_act a = kx_act_row(xq, n);
    for (int64_t r = r0; r < r1; r++) {
        const char *wr = KROW(w, wrb, r);
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        int64_t b = 0;
        for (; b + 4 <= nb; b += 4) {
            _mm_prefetch(wr + (size_t)b * kx_bsz(type) + KX_PF, _MM_HINT_T0);
            if (type == KX_Q8_0) _mm_prefetch(wr + (size_t)b * kx_bsz(type) + KX_PF + 64, _MM_HINT_T0);
            for (int k = 0; k < 4; k++)
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(kx_idot(type, wr, b + k, a)),
                                         _mm256_set1_ps(kx_dw(type, wr, b + k) * a.d[b + k]), acc[k]);
        }
        for (; b < nb; b++)
            acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(kx_idot(type, wr, b, a)),
                                     _mm256_set1_ps(kx_dw(type, wr, b) * a.d[b]), acc[0]);
        y[r] = kx_hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    }
}

KFN void kx_qtile(const int type, const char *w, size_t wrb, const char *x, size_t xrb, int64_t n, const int R,
                  const int T, float *y, int64_t ys)
{
    const int64_t nb = n / TP_QK;
    __m256 acc[KX_MR][KX_NT];
    struct kx_act a[KX_NT];
    for (int t = 0; t < T; t++) a[t] = kx_act_row(x + (size_t)t * xrb, n);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        __m256i W[KX_MR], Wraw[KX_MR];
        __m256 dw[KX_MR];
        for (int r = 0; r < R; r++) {
            const char *wr = w + (size_t)r * wrb;
            if (type == KX_Q4_0) {
                const __m128i q = _mm_loadu_si128((const __m128i *)((const tp_blk_q4_0 *)wr + b)->qs);
                W[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
                Wraw[r] = W[r];
            } else {
                Wraw[r] = _mm256_loadu_si256((const __m256i *)((const tp_blk_q8_0 *)wr + b)->qs);
                W[r] = _mm256_abs_epi8(Wraw[r]);
            }
            dw[r] = _mm256_set1_ps(kx_dw(type, wr, b));
        }
        for (int t = 0; t < T; t++) {
            const __m256i A = _mm256_loadu_si256((const __m256i *)(a[t].qs + b * TP_QK));
            const __m256 da = _mm256_broadcast_ss(a[t].d + b);
            const __m256i C = type == KX_Q4_0 ? _mm256_loadu_si256((const __m256i *)(a[t].c + b * 8))
                                              : _mm256_setzero_si256();
            for (int r = 0; r < R; r++) {
                const __m256i i = type == KX_Q4_0 ? kx_dot(C, W[r], A) : kx_dot(C, W[r], _mm256_sign_epi8(A, Wraw[r]));
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dw[r], da), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[(int64_t)t * ys + r] = kx_hsum(acc[r][t]);
}

/* float weights: 8 at a time, scalar tail */
KFN __m256 kx_ldw(const int type, const void *p, int64_t i)
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
        for (int r = 0; r < R; r++) W[r] = kx_ldw(type, w + (size_t)r * wrb, i);
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

/* Decode for float weights: R rows side by side (KX_DROWS), 16 elements per step in two
 * accumulators per row, scalar tail. */
KFN void kx_fdecode_rows(const int type, const char *w, size_t wrb, int64_t n, const float *x, float *y, const int R)
{
    __m256 acc[KX_DROWS][2];
    for (int k = 0; k < R; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        for (int k = 0; k < R; k++) {
            acc[k][0] = _mm256_fmadd_ps(kx_ldw(type, w + (size_t)k * wrb, i), x0, acc[k][0]);
            acc[k][1] = _mm256_fmadd_ps(kx_ldw(type, w + (size_t)k * wrb, i + 8), x1, acc[k][1]);
        }
    }
    if (i + 8 <= n) {
        const __m256 x0 = _mm256_loadu_ps(x + i);
        for (int k = 0; k < R; k++) acc[k][0] = _mm256_fmadd_ps(kx_ldw(type, w + (size_t)k * wrb, i), x0, acc[k][0]);
        i += 8;
    }
    for (int k = 0; k < R; k++) {
        float s = kx_hsum(_mm256_add_ps(acc[k][0], acc[k][1]));
        for (int64_t j = i; j < n; j++) s += kx_ld1(type, w + (size_t)k * wrb, j) * x[j];
        y[k] = s;
    }
}

#else
/* ================================================================== AVX-512 (512-bit) */

KFN float kx_hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

/* Weight blocks b and b+1 as 64 u8 (one: block b only, upper half zero; never reads b+1). */
KFN __m512i kx_w2(const int type, const char *wr, int64_t b, const int one)
{
    if (type == KX_Q4_0) {
        const tp_blk_q4_0 *wb = (const tp_blk_q4_0 *)wr + b;
        const __m128i q0 = _mm_loadu_si128((const __m128i *)wb[0].qs);
        const __m128i q1 = one ? _mm_setzero_si128() : _mm_loadu_si128((const __m128i *)wb[1].qs);
        const __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
        __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(y), _mm256_srli_epi16(y, 4), 1);
        z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)); /* q0, q0>>4, q1, q1>>4 */
        return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
    }
    const tp_blk_q8_0 *wb = (const tp_blk_q8_0 *)wr + b;
    const __m256i y0 = _mm256_loadu_si256((const __m256i *)wb[0].qs);
    const __m256i y1 = one ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)wb[1].qs);
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(y0), y1, 1), _mm512_set1_epi8((char)0x80));
}

/* fp16 scales of blocks b.. b+k-1 (k = 1, 2, 4) as floats in the low lanes of an xmm. */
KFN __m128 kx_dws(const int type, const char *wr, int64_t b, const int k)
{
    const size_t bs = kx_bsz(type);
    const char *p = wr + (size_t)b * bs;
    uint64_t v = kx_u16(p);
    if (k >= 2) v |= (uint64_t)kx_u16(p + bs) << 16;
    if (k >= 4) v |= (uint64_t)kx_u16(p + 2 * bs) << 32 | (uint64_t)kx_u16(p + 3 * bs) << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)v));
}

/* Activation blocks b, b+1: qs (64 s8), corrections (16 i32), scales (2 floats) */
KFN __m512i kx_a2(struct kx_act a, int64_t b, const int one)
{
    return one ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, a.qs + b * TP_QK) : _mm512_loadu_si512(a.qs + b * TP_QK);
}
KFN __m512i kx_c2(struct kx_act a, int64_t b, const int one)
{
    return one ? _mm512_maskz_loadu_epi32(0x00FF, a.c + b * 8) : _mm512_loadu_si512(a.c + b * 8);
}
KFN __m128 kx_d2(struct kx_act a, int64_t b, const int one)
{
    return one ? _mm_load_ss(a.d + b) : _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(a.d + b)));
}

/* lanes 0-7 <- s[0], lanes 8-15 <- s[1] (idx01) or s[2], s[3] (idx23) */
#define KX_IDX01 _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
#define KX_IDX23 _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)

KFN __m512 kx_pair(const int type, const char *wr, int64_t b, struct kx_act a, __m512 scale, __m512 acc, const int one)
{
    const __m512i i = _mm512_dpbusd_epi32(kx_c2(a, b, one), kx_w2(type, wr, b, one), kx_a2(a, b, one));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), scale, acc);
}

KFN void kx_qdecode(const int type, const void *w, size_t wrb, int64_t n, const void *xq, float *y, int64_t r0,
                    int64_t r1)
{
    const int64_t nb = n / TP_QK;
    const struct kx_act a = kx_act_row(xq, n);
    const __m512i i01 = KX_IDX01, i23 = KX_IDX23;
    for (int64_t r = r0; r < r1; r++) {
        const char *wr = KROW(w, wrb, r);
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        int64_t b = 0;
        for (; b + 4 <= nb; b += 4) {
            _mm_prefetch(wr + (size_t)b * kx_bsz(type) + KX_PF, _MM_HINT_T0);
            if (type == KX_Q8_0) _mm_prefetch(wr + (size_t)b * kx_bsz(type) + KX_PF + 64, _MM_HINT_T0);
            const __m512 s4 = _mm512_castps128_ps512(_mm_mul_ps(kx_dws(type, wr, b, 4), _mm_loadu_ps(a.d + b)));
            acc0 = kx_pair(type, wr, b, a, _mm512_permutexvar_ps(i01, s4), acc0, 0);
            acc1 = kx_pair(type, wr, b + 2, a, _mm512_permutexvar_ps(i23, s4), acc1, 0);
        }
        for (; b < nb; b += 2) {
            const int one = b + 1 == nb;
            const __m512 s2 = _mm512_castps128_ps512(
                _mm_mul_ps(one ? kx_dws(type, wr, b, 1) : kx_dws(type, wr, b, 2), kx_d2(a, b, one)));
            if (one)
                acc0 = kx_pair(type, wr, b, a, _mm512_permutexvar_ps(i01, s2), acc0, 1);
            else
                acc0 = kx_pair(type, wr, b, a, _mm512_permutexvar_ps(i01, s2), acc0, 0);
        }
        y[r] = kx_hsum512(_mm512_add_ps(acc0, acc1));
    }
}

/* ---- small batches and prefill: 16 rows x up to KX_BT tokens, rows in lanes ----
 *
 * Lane L of a zmm holds one row of a 16-row group, so one vpdpbusd adds a
 * 4-value slice of one block for 16 rows at once and, after the 8 slices of
 * a block, each lane holds its row's whole integer block dot: the float
 * conversion, the scale (d_w of 16 rows x d_a of the token) and the
 * accumulation then cost 3 instructions per 16 rows x 1 token x 1 block
 * instead of 3 per 2 blocks of one row (the AVX2 kx_qtile).  The transposed weight
 * slices W[0..7] of a block are built once (16 xmm loads, a 4x4 dword
 * transpose per 128-bit lane) and serve every token; activation slices are
 * embedded broadcasts.  The block's correction (s[b], kernels_impl.h) seeds
 * the integer accumulator.  Lane L = 4m + p holds row 4p + m of the group
 * (the transpose's order); outputs are permuted back once per group.
 */
#define KX_PFB 256 /* prefetch distance per row stream (bytes) */
#define KX_BT 8 /* tokens per pass over a row group (T accumulators + T chains + 8 slices + scales) */

/* lane L <-> row 4 (L % 4) + L / 4 of the group (an involution) */
#define KX_LANE_ROWS _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)

#include "kernels/kernels_x86_rows16_impl.h"

/* The block at p (+ ro[k] for row k) of the 16 rows as 8 slices: W[j] lane L = u8 values
 * 4j..4j+3 of row 4 (L % 4) + L / 4 (Q4_0 nibbles 0..15, Q8_0 q + 128), and the 16 weight
 * scales as floats in the same lane order. */
KFN void kx_wslices(const int type, const char *p, const size_t ro[16], __m512i W[8], __m512 *dw)
{
    __m512i z[4];
    if (type == KX_Q4_0) {
        tp_rows16_load(p + 2, ro, z);
        tp_rows16_tr4(z, W);
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        for (int j = 0; j < 4; j++) {
            W[j + 4] = _mm512_and_si512(_mm512_srli_epi16(W[j], 4), m4);
            W[j] = _mm512_and_si512(W[j], m4);
        }
    } else {
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        tp_rows16_load(p + 2, ro, z);
        tp_rows16_tr4(z, W);
        tp_rows16_load(p + 18, ro, z);
        tp_rows16_tr4(z, W + 4);
        for (int j = 0; j < 8; j++) W[j] = _mm512_xor_si512(W[j], bias);
    }
    /* the fp16 scale is the low half of dword 0 at each row's block start: the same
     * loads and the first quarter of the transpose (cheaper than a gather) */
    tp_rows16_load(p, ro, z);
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_unpacklo_epi64(t0, t2)));
}

KFN __m512i kx_bc32(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}
KFN __m512 kx_bcf(const void *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_ps(v);
}

/* Sanitizer builds instantiate only the full-width pass (the unrolled passes
 * are slow to compile with ASan/UBSan); every token still gets the same
 * arithmetic, so results are identical. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define KX_FEW_T 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define KX_FEW_T 1
#endif
#endif
#ifndef KX_FEW_T
#define KX_FEW_T 0
#endif

/* Activations of up to KX_BT tokens packed per block (kernels_a8pack_impl.h). */
#define KX_SLAB 64       /* blocks per slab when several passes reuse a chunk's weights */
#define KX_SLAB_MAX 256  /* one pass (<= KX_BT tokens): whole rows up to this many blocks */
#define KX_PK TP_A8PACK_BLK
_Static_assert(KX_BT == TP_A8PACK_BT, "packed block size");

/* The tokens' integer chains advance together, one slice j at a time (T
 * independent dependency chains in flight), then each token's block dot is
 * scaled and accumulated.  p: the packed block. */
#define KX_SEED(t) __m512i i##t = T > t ? kx_bc32(p + TP_A8PACK_S + 4 * (t)) : _mm512_setzero_si512();
#define KX_DOT(t, j) \
    if (T > t) i##t = _mm512_dpbusd_epi32(i##t, W[j], kx_bc32(p + (t) * TP_QK + 4 * (j)));
#define KX_SLICE(j) KX_DOT(0, j) KX_DOT(1, j) KX_DOT(2, j) KX_DOT(3, j) KX_DOT(4, j) KX_DOT(5, j) KX_DOT(6, j) KX_DOT(7, j)
#define KX_ACC(t) \
    if (T > t) \
        acc##t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##t), _mm512_mul_ps(dw, kx_bcf(p + TP_A8PACK_D + 4 * (t))), acc##t);

/* One pass: the 16 rows at w (+ ro[k]; w at the slab's first block) x T packed
 * tokens over nbs blocks, accumulating onto acc[t] (lane order). */
KFN void kx_qbatch_pass(const int type, const char *w, const size_t ro[16], const char *pk, int nbs, const int T,
                        __m512 acc[KX_BT])
{
    const size_t bs = kx_bsz(type);
    __m512 acc0 = acc[0], acc1 = acc[1], acc2 = acc[2], acc3 = acc[3], acc4 = acc[4], acc5 = acc[5], acc6 = acc[6],
           acc7 = acc[7];
    for (int b = 0; b < nbs; b++) {
        __m512i W[8];
        __m512 dw;
        /* 16 row streams are more than the hardware prefetcher follows: fetch each row
         * KX_PFB bytes ahead, every 36 (Q4_0: 2 blocks) or 34 (Q8_0) bytes, so every line once */
        if (type == KX_Q8_0 || (b & 1) == 0)
            for (int k = 0; k < 16; k++) _mm_prefetch(w + ro[k] + (size_t)b * bs + KX_PFB, _MM_HINT_T0);
        kx_wslices(type, w + (size_t)b * bs, ro, W, &dw);
        const char *p = pk + (size_t)b * KX_PK;
        KX_SEED(0) KX_SEED(1) KX_SEED(2) KX_SEED(3) KX_SEED(4) KX_SEED(5) KX_SEED(6) KX_SEED(7)
        KX_SLICE(0) KX_SLICE(1) KX_SLICE(2) KX_SLICE(3) KX_SLICE(4) KX_SLICE(5) KX_SLICE(6) KX_SLICE(7)
        KX_ACC(0) KX_ACC(1) KX_ACC(2) KX_ACC(3) KX_ACC(4) KX_ACC(5) KX_ACC(6) KX_ACC(7)
    }
    acc[0] = acc0, acc[1] = acc1, acc[2] = acc2, acc[3] = acc3;
    acc[4] = acc4, acc[5] = acc5, acc[6] = acc6, acc[7] = acc7;
}

/*
 * Rows [r0, r1) in chunks of KX_BROWS rows; per chunk, per slab of KX_SLAB
 * blocks, per pass of up to KX_BT tokens: pack the pass's activations once,
 * then run every 16-row group of the chunk over the slab (weights of a chunk
 * x slab stay in L2 across passes).  Partial sums wait in y between slabs and
 * are reloaded exactly, so the arithmetic of every row and token is the same
 * single chain of block terms whatever the chunking, the split of rows over
 * threads or the number of tokens.  A ragged last group repeats its last row
 * in the unused lanes (not stored).
 */
#define KX_BROWS 128
KFN void kx_qbatch(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                   float *y, int64_t ys, int64_t r0, int64_t r1)
{
    const __m512i lane_rows = KX_LANE_ROWS;
    const int64_t nb = n / TP_QK;
    const size_t bs = kx_bsz(type);
    _Alignas(64) char pk[KX_SLAB_MAX * KX_PK]; /* 80 KiB */
    /* one pass: rows streamed whole (no reuse to keep in L2, and every slab
     * restarts 16 row streams); several: slabs so a chunk's weights stay in L2 */
    const int slab = n_tok <= KX_BT && nb <= KX_SLAB_MAX ? (int)nb : KX_SLAB;
    for (int64_t c0 = r0; c0 < r1; c0 += KX_BROWS) {
        const int64_t c1 = r1 - c0 < KX_BROWS ? r1 : c0 + KX_BROWS;
        for (int64_t b0 = 0; b0 < nb; b0 += slab) {
            const int nbs = nb - b0 < slab ? (int)(nb - b0) : slab;
            for (int t0 = 0; t0 < n_tok; t0 += KX_BT) {
                const int T = n_tok - t0 < KX_BT ? n_tok - t0 : KX_BT;
#if KX_FEW_T
                const int Tk = KX_BT; /* sanitizer builds: one pass width, padded (compiles 3x faster) */
#else
                const int Tk = T;
#endif
                tp_a8_pack(pk, (const char *)KROW(xq, xrb, t0), xrb, n, b0, nbs, T, Tk);
                for (int64_t r = c0; r < c1; r += 16) {
                    const int nr = c1 - r < 16 ? (int)(c1 - r) : 16;
                    const __mmask16 keep = (__mmask16)((1u << nr) - 1u);
                    size_t ro[16];
                    for (int k = 0; k < 16; k++) ro[k] = (size_t)(k < nr ? k : nr - 1) * wrb;
                    __m512 acc[KX_BT];
                    for (int t = 0; t < KX_BT; t++) acc[t] = _mm512_setzero_ps();
                    if (b0 > 0)
                        for (int t = 0; t < T; t++)
                            acc[t] = _mm512_permutexvar_ps(lane_rows,
                                                           _mm512_maskz_loadu_ps(keep, y + (int64_t)(t0 + t) * ys + r));
                    const char *wg = (const char *)KROW(w, wrb, r) + (size_t)b0 * bs;
                    switch (Tk) {
#if !KX_FEW_T
                    case 1: kx_qbatch_pass(type, wg, ro, pk, nbs, 1, acc); break;
                    case 2: kx_qbatch_pass(type, wg, ro, pk, nbs, 2, acc); break;
                    case 3: kx_qbatch_pass(type, wg, ro, pk, nbs, 3, acc); break;
                    case 4: kx_qbatch_pass(type, wg, ro, pk, nbs, 4, acc); break;
                    case 5: kx_qbatch_pass(type, wg, ro, pk, nbs, 5, acc); break;
                    case 6: kx_qbatch_pass(type, wg, ro, pk, nbs, 6, acc); break;
                    case 7: kx_qbatch_pass(type, wg, ro, pk, nbs, 7, acc); break;
#endif
                    default: kx_qbatch_pass(type, wg, ro, pk, nbs, KX_BT, acc); break;
                    }
                    for (int t = 0; t < T; t++)
                        _mm512_mask_storeu_ps(y + (int64_t)(t0 + t) * ys + r, keep,
                                              _mm512_permutexvar_ps(lane_rows, acc[t]));
                }
            }
        }
    }
}
_Static_assert(KX_BT == 8, "kx_qbatch's switch assumes 8 tokens per pass");

/* float weights: 16 at a time, masked tail (no scalar remainder) */
KFN __m512 kx_ldw16(const int type, const void *p, int64_t i, __mmask16 m)
{
    if (type == KX_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (type == KX_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

KFN void kx_ftile(const int type, const char *w, size_t wrb, const char *x, size_t xrb, int64_t n, const int R,
                  const int T, float *y, int64_t ys)
{
    __m512 acc[KX_MR][KX_NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 W[KX_MR];
        for (int r = 0; r < R; r++) W[r] = kx_ldw16(type, w + (size_t)r * wrb, i, m);
        for (int t = 0; t < T; t++) {
            const __m512 A = _mm512_maskz_loadu_ps(m, (const float *)(x + (size_t)t * xrb) + i);
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(W[r], A, acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[(int64_t)t * ys + r] = kx_hsum512(acc[r][t]);
}

/* Decode for float weights: R rows side by side (R weight streams, KX_DROWS says why),
 * 32 elements per step in two accumulators per row, masked tail. */
KFN void kx_fdecode_rows(const int type, const char *w, size_t wrb, int64_t n, const float *x, float *y, const int R)
{
    __m512 acc[KX_DROWS][2];
    for (int k = 0; k < R; k++) acc[k][0] = acc[k][1] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
        for (int k = 0; k < R; k++) {
            acc[k][0] = _mm512_fmadd_ps(kx_ldw16(type, w + (size_t)k * wrb, i, (__mmask16)0xFFFF), x0, acc[k][0]);
            acc[k][1] = _mm512_fmadd_ps(kx_ldw16(type, w + (size_t)k * wrb, i + 16, (__mmask16)0xFFFF), x1, acc[k][1]);
        }
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 xm = _mm512_maskz_loadu_ps(m, x + i);
        for (int k = 0; k < R; k++) acc[k][0] = _mm512_fmadd_ps(kx_ldw16(type, w + (size_t)k * wrb, i, m), xm, acc[k][0]);
    }
    for (int k = 0; k < R; k++) y[k] = kx_hsum512(_mm512_add_ps(acc[k][0], acc[k][1]));
}
#endif

/* ================================================================== drivers (shared) */

/* Dispatch one tile with R rows and T (1..KX_NT) tokens as compile-time constants. */
#define KX_TILE_T(fn, R, T, ...)                         \
    switch (T) {                                         \
    case 1: fn(__VA_ARGS__, R, 1, y, ys); break;         \
    case 2: fn(__VA_ARGS__, R, 2, y, ys); break;         \
    case 3: fn(__VA_ARGS__, R, 3, y, ys); break;         \
    default: fn(__VA_ARGS__, R, KX_NT, y, ys); break;    \
    }
_Static_assert(KX_NT == 4, "KX_TILE_T assumes 4 tokens per tile");

#define KX_TILED(fn, type, w, wrb, n, xq, xrb, n_tok, yy, ys, r0, r1)                     \
    for (int64_t c0 = r0; c0 < r1; c0 += KX_CHUNK) {                                       \
        const int64_t c1 = c0 + KX_CHUNK < r1 ? c0 + KX_CHUNK : r1;                        \
        for (int t0 = 0; t0 < n_tok; t0 += KX_NT) {                                        \
            const int T = n_tok - t0 < KX_NT ? n_tok - t0 : KX_NT;                         \
            const char *x = KROW(xq, xrb, t0);                                             \
            int64_t r = c0;                                                                \
            for (; r + KX_MR <= c1; r += KX_MR) {                                          \
                float *y = yy + (int64_t)t0 * ys + r;                                      \
                KX_TILE_T(fn, KX_MR, T, type, (const char *)KROW(w, wrb, r), wrb, x, xrb, n) \
            }                                                                              \
            for (; r < c1; r++) {                                                          \
                float *y = yy + (int64_t)t0 * ys + r;                                      \
                KX_TILE_T(fn, 1, T, type, (const char *)KROW(w, wrb, r), wrb, x, xrb, n)   \
            }                                                                              \
        }                                                                                  \
    }

/* One token, float weights: rows [r0, r1), KX_DROWS at a time, then one at a time. */
KFN void kx_fdecode(const int type, const void *w, size_t wrb, int64_t n, const void *xq, float *y, int64_t r0,
                    int64_t r1)
{
    int64_t r = r0;
    for (; r + KX_DROWS <= r1; r += KX_DROWS) kx_fdecode_rows(type, KROW(w, wrb, r), wrb, n, xq, y + r, KX_DROWS);
    for (; r < r1; r++) kx_fdecode_rows(type, KROW(w, wrb, r), wrb, n, xq, y + r, 1);
}

KFN void kx_qmatmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                    float *yy, int64_t ys, int64_t r0, int64_t r1)
{
    if (n_tok == 1) {
        kx_qdecode(type, w, wrb, n, xq, yy, r0, r1);
        return;
    }
#if KX_512
    kx_qbatch(type, w, wrb, n, xq, xrb, n_tok, yy, ys, r0, r1);
#else
    KX_TILED(kx_qtile, type, w, wrb, n, xq, xrb, n_tok, yy, ys, r0, r1)
#endif
}

KFN void kx_fmatmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                    float *yy, int64_t ys, int64_t r0, int64_t r1)
{
    if (n_tok == 1) {
        kx_fdecode(type, w, wrb, n, xq, yy, r0, r1);
        return;
    }
    KX_TILED(kx_ftile, type, w, wrb, n, xq, xrb, n_tok, yy, ys, r0, r1)
}

#define KX_ENTRY(name, fn, type)                                                                            \
    KOUT void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,  \
                   int64_t ys, int64_t r0, int64_t r1)                                                     \
    {                                                                                                      \
        fn(type, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);                                                \
    }
KX_ENTRY(kx_matmul_q4_0, kx_qmatmul, KX_Q4_0)
KX_ENTRY(kx_matmul_q8_0, kx_qmatmul, KX_Q8_0)
KX_ENTRY(kx_matmul_f32, kx_fmatmul, KX_F32)
KX_ENTRY(kx_matmul_f16, kx_fmatmul, KX_F16)
KX_ENTRY(kx_matmul_bf16, kx_fmatmul, KX_BF16)

/* ================================================================== activation quantizer */

/* Bit-identical to tp_kern_quant_a8_scalar: same amax, d = amax/127, id = 1/d,
 * q = round-half-even(x * id) (vcvtps2dq under the default MXCSR), exact c. */
KOUT void kx_quant_a8(const float *x, void *out, int64_t n, int kshift)
{
    int8_t *qs = out;
    float *dd = (float *)(qs + n);
    int32_t *cc = (int32_t *)(dd + n / TP_QK);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m128i shift = _mm_cvtsi32_si128(kshift);
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
        dd[b] = d;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, perm);
        _mm256_storeu_si256((__m256i *)(qs + b * TP_QK), p);
        const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
        _mm256_storeu_si256((__m256i *)(cc + b * 8), _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_sll_epi32(s4, shift)));
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

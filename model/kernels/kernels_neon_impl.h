/*
 * model/kernels/kernels_neon_impl.h - private template for the arm64 NEON kernels,
 * included by kernels_neon.c (KN_DOT 0: vmull_s8 + vpadalq_s16 integer dots)
 * and kernels_neondot.c (KN_DOT 1: the ARMv8.2 dot-product sdot instruction,
 * chosen at run time from HWCAP_ASIMDDP).  Weights and activations are both
 * signed here (Q4_0 nibbles minus 8), so the activation row's correction
 * vector is not needed; each block's integer dot is exact, then scaled by
 * d_w * d_x in float.  Decode (one token) walks rows one after another;
 * prefill uses a KN_MR x KN_NT register tile (32 q-registers).
 */
#ifndef KN_DOT
#error "define KN_DOT and KN_ATTR (target attribute or nothing) before including kernels_neon_impl.h"
#endif

#include <arm_neon.h>
#include <string.h>

#include "common/common.h"
#include "kernels/kernels_impl.h"

#define KFN static inline __attribute__((always_inline)) KN_ATTR
#define KOUT static KN_ATTR
#define KN_MR 4
#define KN_NT 4
#define KN_CHUNK 64
#define KROW(p, rb, r) ((const void *)((const char *)(p) + (size_t)(r) * (rb)))

enum { KN_Q4_0, KN_Q8_0, KN_F32, KN_F16, KN_BF16 };

/* acc + 4-lane sums of a[i] * b[i] over 16 int8 pairs */
KFN int32x4_t kn_dot(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if KN_DOT
    return vdotq_s32(acc, a, b);
#else
    int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    int16x8_t p1 = vmull_s8(vget_high_s8(a), vget_high_s8(b));
    return vpadalq_s16(vpadalq_s16(acc, p0), p1);
#endif
}

KFN float kn_h2f(const void *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return tp_fp16_to_f32(h);
}

/* Weight block b of row wr as two signed int8x16 (elements 0..15, 16..31) and its scale. */
KFN void kn_wblock(const int type, const char *wr, int64_t b, int8x16_t *w0, int8x16_t *w1, float *dw)
{
    if (type == KN_Q4_0) {
        const tp_blk_q4_0 *wb = (const tp_blk_q4_0 *)wr + b;
        const uint8x16_t q = vld1q_u8(wb->qs);
        const int8x16_t eight = vdupq_n_s8(8);
        *w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), eight);
        *w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
        *dw = kn_h2f(&wb->d);
    } else {
        const tp_blk_q8_0 *wb = (const tp_blk_q8_0 *)wr + b;
        *w0 = vld1q_s8(wb->qs);
        *w1 = vld1q_s8(wb->qs + 16);
        *dw = kn_h2f(&wb->d);
    }
}

KFN void kn_qdecode(const int type, const void *w, size_t wrb, int64_t n, const void *xq, float *y, int64_t r0,
                    int64_t r1)
{
    const int64_t nb = n / TP_QK;
    const int8_t *aq = TP_A8_QS(xq);
    const float *ad = TP_A8_D(xq, n);
    for (int64_t r = r0; r < r1; r++) {
        const char *wr = KROW(w, wrb, r);
        float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {
            int8x16_t w0, w1, w2, w3;
            float d0, d1;
            kn_wblock(type, wr, b, &w0, &w1, &d0);
            kn_wblock(type, wr, b + 1, &w2, &w3, &d1);
            const int8_t *a = aq + b * TP_QK;
            int32x4_t i0 = kn_dot(kn_dot(vdupq_n_s32(0), w0, vld1q_s8(a)), w1, vld1q_s8(a + 16));
            int32x4_t i1 = kn_dot(kn_dot(vdupq_n_s32(0), w2, vld1q_s8(a + 32)), w3, vld1q_s8(a + 48));
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(i0), d0 * ad[b]);
            acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(i1), d1 * ad[b + 1]);
        }
        if (b < nb) {
            int8x16_t w0, w1;
            float d0;
            kn_wblock(type, wr, b, &w0, &w1, &d0);
            const int8_t *a = aq + b * TP_QK;
            int32x4_t i0 = kn_dot(kn_dot(vdupq_n_s32(0), w0, vld1q_s8(a)), w1, vld1q_s8(a + 16));
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(i0), d0 * ad[b]);
        }
        y[r] = vaddvq_f32(vaddq_f32(acc0, acc1));
    }
}

KFN void kn_qtile(const int type, const char *w, size_t wrb, const char *x, size_t xrb, int64_t n, const int R,
                  const int T, float *y, int64_t ys)
{
    const int64_t nb = n / TP_QK;
    float32x4_t acc[KN_MR][KN_NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t W0[KN_MR], W1[KN_MR];
        float dw[KN_MR];
        for (int r = 0; r < R; r++) kn_wblock(type, w + (size_t)r * wrb, b, &W0[r], &W1[r], &dw[r]);
        for (int t = 0; t < T; t++) {
            const void *row = x + (size_t)t * xrb;
            const int8_t *a = TP_A8_QS(row) + b * TP_QK;
            const int8x16_t a0 = vld1q_s8(a), a1 = vld1q_s8(a + 16);
            const float da = TP_A8_D(row, n)[b];
            for (int r = 0; r < R; r++) {
                int32x4_t i = kn_dot(kn_dot(vdupq_n_s32(0), W0[r], a0), W1[r], a1);
                acc[r][t] = vfmaq_n_f32(acc[r][t], vcvtq_f32_s32(i), dw[r] * da);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[(int64_t)t * ys + r] = vaddvq_f32(acc[r][t]);
}

KFN float32x4_t kn_ldw(const int type, const void *p, int64_t i)
{
    if (type == KN_F32) return vld1q_f32((const float *)p + i);
    const uint16x4_t h = vld1_u16((const uint16_t *)p + i);
    if (type == KN_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

KFN float kn_ld1(const int type, const void *p, int64_t i)
{
    if (type == KN_F32) return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return type == KN_F16 ? tp_fp16_to_f32(h) : tp_bf16_to_f32(h);
}

KFN void kn_ftile(const int type, const char *w, size_t wrb, const char *x, size_t xrb, int64_t n, const int R,
                  const int T, float *y, int64_t ys)
{
    float32x4_t acc[KN_MR][KN_NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t W[KN_MR];
        for (int r = 0; r < R; r++) W[r] = kn_ldw(type, w + (size_t)r * wrb, i);
        for (int t = 0; t < T; t++) {
            const float32x4_t A = vld1q_f32((const float *)(x + (size_t)t * xrb) + i);
            for (int r = 0; r < R; r++) acc[r][t] = vfmaq_f32(acc[r][t], W[r], A);
        }
    }
    for (int r = 0; r < R; r++) {
        for (int t = 0; t < T; t++) {
            float s = vaddvq_f32(acc[r][t]);
            const float *xt = (const float *)(x + (size_t)t * xrb);
            for (int64_t k = i; k < n; k++) s += kn_ld1(type, w + (size_t)r * wrb, k) * xt[k];
            y[(int64_t)t * ys + r] = s;
        }
    }
}

#define KN_TILE_T(fn, R, T, ...)                     \
    switch (T) {                                     \
    case 1: fn(__VA_ARGS__, R, 1, y, ys); break;     \
    case 2: fn(__VA_ARGS__, R, 2, y, ys); break;     \
    case 3: fn(__VA_ARGS__, R, 3, y, ys); break;     \
    default: fn(__VA_ARGS__, R, KN_NT, y, ys); break; \
    }

#define KN_TILED(fn, type, w, wrb, n, xq, xrb, n_tok, yy, ys, r0, r1)                     \
    for (int64_t c0 = r0; c0 < r1; c0 += KN_CHUNK) {                                       \
        const int64_t c1 = c0 + KN_CHUNK < r1 ? c0 + KN_CHUNK : r1;                        \
        for (int t0 = 0; t0 < n_tok; t0 += KN_NT) {                                        \
            const int T = n_tok - t0 < KN_NT ? n_tok - t0 : KN_NT;                         \
            const char *x = KROW(xq, xrb, t0);                                             \
            int64_t r = c0;                                                                \
            for (; r + KN_MR <= c1; r += KN_MR) {                                          \
                float *y = yy + (int64_t)t0 * ys + r;                                      \
                KN_TILE_T(fn, KN_MR, T, type, (const char *)KROW(w, wrb, r), wrb, x, xrb, n) \
            }                                                                              \
            for (; r < c1; r++) {                                                          \
                float *y = yy + (int64_t)t0 * ys + r;                                      \
                KN_TILE_T(fn, 1, T, type, (const char *)KROW(w, wrb, r), wrb, x, xrb, n)   \
            }                                                                              \
        }                                                                                  \
    }

KFN void kn_qmatmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                    float *yy, int64_t ys, int64_t r0, int64_t r1)
{
    if (n_tok == 1) {
        kn_qdecode(type, w, wrb, n, xq, yy, r0, r1);
        return;
    }
    KN_TILED(kn_qtile, type, w, wrb, n, xq, xrb, n_tok, yy, ys, r0, r1)
}

KFN void kn_fmatmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                    float *yy, int64_t ys, int64_t r0, int64_t r1)
{
    KN_TILED(kn_ftile, type, w, wrb, n, xq, xrb, n_tok, yy, ys, r0, r1)
}

#define KN_ENTRY(name, fn, type)                                                                            \
    KOUT void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,  \
                   int64_t ys, int64_t r0, int64_t r1)                                                     \
    {                                                                                                      \
        fn(type, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);                                                \
    }
KN_ENTRY(kn_matmul_q4_0, kn_qmatmul, KN_Q4_0)
KN_ENTRY(kn_matmul_q8_0, kn_qmatmul, KN_Q8_0)
KN_ENTRY(kn_matmul_f32, kn_fmatmul, KN_F32)
KN_ENTRY(kn_matmul_f16, kn_fmatmul, KN_F16)
KN_ENTRY(kn_matmul_bf16, kn_fmatmul, KN_BF16)

/* Bit-identical to tp_kern_quant_a8_scalar (vcvtnq = round half to even). */
KOUT void kn_quant_a8(const float *x, void *out, int64_t n, int kshift)
{
    int8_t *qs = out;
    float *dd = (float *)(qs + n);
    int32_t *cc = (int32_t *)(dd + n / TP_QK);
    const int32x4_t sh = vdupq_n_s32(kshift);
    for (int64_t b = 0; b < n / TP_QK; b++) {
        const float *xb = x + b * TP_QK;
        float32x4_t v[8];
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(xb + 4 * k);
            m = vmaxq_f32(m, vabsq_f32(v[k]));
        }
        const float amax = vmaxvq_f32(m);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        dd[b] = d;
        int8_t *q = qs + b * TP_QK;
        for (int k = 0; k < 8; k += 2) {
            int32x4_t i0 = vcvtnq_s32_f32(vmulq_n_f32(v[k], id));
            int32x4_t i1 = vcvtnq_s32_f32(vmulq_n_f32(v[k + 1], id));
            int8x8_t q8 = vqmovn_s16(vcombine_s16(vqmovn_s32(i0), vqmovn_s32(i1)));
            vst1_s8(q + 4 * k, q8);
        }
        for (int k = 0; k < 2; k++) {
            int32x4_t s = vpaddlq_s16(vpaddlq_s8(vld1q_s8(q + 16 * k)));
            vst1q_s32(cc + b * 8 + 4 * k, vnegq_s32(vshlq_s32(s, sh)));
        }
    }
}

KOUT void kn_fill_ops(struct tp_kern_ops *ops)
{
    ops->matmul[TP_WTYPE_F32] = kn_matmul_f32;
    ops->matmul[TP_WTYPE_F16] = kn_matmul_f16;
    ops->matmul[TP_WTYPE_BF16] = kn_matmul_bf16;
    ops->matmul[TP_WTYPE_Q8_0] = kn_matmul_q8_0;
    ops->matmul[TP_WTYPE_Q4_0] = kn_matmul_q4_0;
    ops->quant_a8 = kn_quant_a8;
}

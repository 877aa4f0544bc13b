/*
 * model/kernels/kernels_kquant_neon_impl.h - private template for the arm64 NEON
 * K-quant kernels (Q4_K, Q5_K, Q6_K against Q8_K activations), included by
 * kernels_kquant_neon.c (KQN_DOT 0: vmull_s8 + vpadalq_s16) and
 * kernels_kquant_neondot.c (KQN_DOT 1: the sdot instruction).  Weights are
 * unpacked to signed bytes (Q6_K minus its 32 offset; Q4_K/Q5_K as 0..15 /
 * 0..31 with the mins taken from the activation bsums), sub-block dots are
 * exact integers, scaled per sub-block in integer and per super-block in
 * float.
 */
#ifndef KQN_DOT
#error "define KQN_DOT, KQN_ATTR (target attribute or nothing) and KQN_FILL before including kernels_kquant_neon_impl.h"
#endif
#include <arm_neon.h>

#include "common/common.h"
#include "kernels/kernels_impl.h"

#define ROW(w, rb, r) ((const void *)((const char *)(w) + (size_t)(r) * (rb)))

#define KQNFN static inline __attribute__((always_inline)) KQN_ATTR
#define KQNOUT static KQN_ATTR

/* exact sum of a[i]*b[i] over 16 int8 pairs, into 4 lanes */
KQNFN int32x4_t kqn_dot16(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if KQN_DOT
    return vdotq_s32(acc, a, b);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_s8(vget_high_s8(a), vget_high_s8(b)));
#endif
}

KQNFN float kqn_dot_q45(const void *wrow, const tp_blk_q8_k *a, int64_t nb, int five)
{
    float s = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m1 = vdupq_n_u8(1);
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
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) msum += (int32_t)mn[j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        for (int j = 0; j < 4; j++) {
            for (int h = 0; h < 2; h++) { /* 16 of the 32 bytes at a time */
                const uint8x16_t q = vld1q_u8(qs + 32 * j + 16 * h);
                uint8x16_t lo = vandq_u8(q, m4), hi = vshrq_n_u8(q, 4);
                if (five) {
                    const uint8x16_t hb = vld1q_u8(qh + 16 * h);
                    lo = vorrq_u8(lo, vshlq_n_u8(vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(-2 * j))), m1), 4));
                    hi = vorrq_u8(hi, vshlq_n_u8(vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(-2 * j - 1))), m1), 4));
                }
                const int8x16_t a0 = vld1q_s8(a[i].qs + 64 * j + 16 * h);
                const int8x16_t a1 = vld1q_s8(a[i].qs + 64 * j + 32 + 16 * h);
                isum += sc[2 * j] * vaddvq_s32(kqn_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(lo), a0));
                isum += sc[2 * j + 1] * vaddvq_s32(kqn_dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(hi), a1));
            }
        }
        s += a[i].d * (tp_fp16_to_f32(dh) * (float)isum - tp_fp16_to_f32(dminh) * (float)msum);
    }
    return s;
}

KQNFN float kqn_dot_q6(const void *wrow, const tp_blk_q8_k *a, int64_t nb)
{
    float s = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    for (int64_t i = 0; i < nb; i++) {
        const tp_blk_q6_k *w = (const tp_blk_q6_k *)wrow + i;
        int32_t isum = 0;
        for (int half = 0; half < 2; half++) {
            for (int h = 0; h < 2; h++) { /* bytes k = 16h .. 16h+15 of the 32 */
                const uint8x16_t ql0 = vld1q_u8(w->ql + 64 * half + 16 * h);
                const uint8x16_t ql1 = vld1q_u8(w->ql + 64 * half + 32 + 16 * h);
                const uint8x16_t qh = vld1q_u8(w->qh + 32 * half + 16 * h);
                for (int qu = 0; qu < 4; qu++) {
                    const uint8x16_t l4 = (qu & 1) ? ql1 : ql0;
                    const uint8x16_t nib = (qu & 2) ? vshrq_n_u8(l4, 4) : vandq_u8(l4, m4);
                    const uint8x16_t h2 = vandq_u8(vshlq_u8(qh, vdupq_n_s8((int8_t)(-2 * qu))), m3);
                    const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib, vshlq_n_u8(h2, 4))), off);
                    const int e0 = 128 * half + 32 * qu + 16 * h;
                    const int8x16_t av = vld1q_s8(a[i].qs + e0);
                    isum += w->scales[e0 / 16] * vaddvq_s32(kqn_dot16(vdupq_n_s32(0), q, av));
                }
            }
        }
        s += a[i].d * tp_fp16_to_f32(w->d) * (float)isum;
    }
    return s;
}

#define KQN_ENTRY(name, expr)                                                                                \
    KQNOUT void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,  \
                     int64_t ys, int64_t r0, int64_t r1)                                                     \
    {                                                                                                        \
        const int64_t nb = n / TP_QK_K;                                                                      \
        for (int64_t r = r0; r < r1; r++) {                                                                  \
            const void *wr = ROW(w, wrb, r);                                                                 \
            for (int t = 0; t < n_tok; t++) {                                                                \
                const tp_blk_q8_k *a = ROW(xq, xrb, t);                                                      \
                y[t * ys + r] = expr;                                                                        \
            }                                                                                                \
        }                                                                                                    \
    }
KQN_ENTRY(kqn_matmul_q4_k, kqn_dot_q45(wr, a, nb, 0))
KQN_ENTRY(kqn_matmul_q5_k, kqn_dot_q45(wr, a, nb, 1))
KQN_ENTRY(kqn_matmul_q6_k, kqn_dot_q6(wr, a, nb))

void KQN_FILL(struct tp_kern_ops *ops)
{
    ops->matmul[TP_WTYPE_Q4_K] = kqn_matmul_q4_k;
    ops->matmul[TP_WTYPE_Q5_K] = kqn_matmul_q5_k;
    ops->matmul[TP_WTYPE_Q6_K] = kqn_matmul_q6_k;
}

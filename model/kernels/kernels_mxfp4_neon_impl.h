/*
 * model/kernels/kernels_mxfp4_neon_impl.h - private template of the arm64 MXFP4
 * matmul, included by kernels_mxfp4_neon.c (MXN_DOT 0) and
 * kernels_mxfp4_neondot.c (MXN_DOT 1, the ARMv8.2 dot product) with
 *   MXN_ATTR  function attribute (target) or empty
 *   MXN_FILL  name of the ops-filling function
 * A block's nibbles become 32 signed codes with one tbl lookup into the value
 * table (kernels_impl.h, |v| <= 12); the dot with the a8 activation row is
 * sdot, or widening multiplies (smull/smlal: |v x| <= 1524, so pairs fit
 * int16) accumulated pairwise into int32 (sadalp); exact either way, then
 * scaled by 2^(e-128) * d_x in float.  Each unpacked weight block serves up
 * to MX_NT tokens.
 */
#ifndef MXN_FILL
#error "define MXN_ATTR, MXN_DOT, MXN_FILL before including kernels_mxfp4_neon_impl.h"
#endif

#include <arm_neon.h>
#include <string.h>

#include "kernels/kernels_impl.h"

#define MX_NT 4
#define ROW(p, rb, r) ((const void *)((const char *)(p) + (size_t)(r) * (rb)))

MXN_ATTR static inline int32x4_t dot32(int32x4_t acc, int8x16_t w0, int8x16_t w1, const int8_t *x)
{
    const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
#if MXN_DOT
    return vdotq_s32(vdotq_s32(acc, w0, x0), w1, x1);
#else
    int16x8_t p = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
    p = vmlal_high_s8(p, w0, x0);
    acc = vpadalq_s16(acc, p);
    p = vmull_s8(vget_low_s8(w1), vget_low_s8(x1));
    p = vmlal_high_s8(p, w1, x1);
    return vpadalq_s16(acc, p);
#endif
}

MXN_ATTR static void matmul_neon(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                        int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK;
    const int8x16_t table = vld1q_s8(tp_mxfp4_kvalues);
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    for (int t0 = 0; t0 < n_tok; t0 += MX_NT) {
        const int nt = n_tok - t0 < MX_NT ? n_tok - t0 : MX_NT;
        const int8_t *xs[MX_NT];
        const float *xd[MX_NT];
        for (int j = 0; j < nt; j++) {
            xs[j] = TP_A8_QS(ROW(xq, xrb, t0 + j));
            xd[j] = TP_A8_D(ROW(xq, xrb, t0 + j), n);
        }
        for (int64_t r = r0; r < r1; r++) {
            const tp_blk_mxfp4 *wb = ROW(w, wrb, r);
            float32x4_t acc[MX_NT];
            for (int j = 0; j < MX_NT; j++) acc[j] = vdupq_n_f32(0.0f);
            for (int64_t b = 0; b < nb; b++) {
                const uint8x16_t q = vld1q_u8(wb[b].qs);
                const int8x16_t w0 = vqtbl1q_s8(table, vandq_u8(q, m4));
                const int8x16_t w1 = vqtbl1q_s8(table, vshrq_n_u8(q, 4));
                const float dw = tp_e8m0_half(wb[b].e);
                for (int j = 0; j < nt; j++) {
                    const int32x4_t p = dot32(vdupq_n_s32(0), w0, w1, xs[j] + b * TP_QK);
                    float dx;
                    memcpy(&dx, xd[j] + b, sizeof dx);
                    acc[j] = vmlaq_n_f32(acc[j], vcvtq_f32_s32(p), dw * dx);
                }
            }
            for (int j = 0; j < nt; j++) y[(int64_t)(t0 + j) * ys + r] = vaddvq_f32(acc[j]);
        }
    }
}

void MXN_FILL(struct tp_kern_ops *ops) { ops->matmul[TP_WTYPE_MXFP4] = matmul_neon; }

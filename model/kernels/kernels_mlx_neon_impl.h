/*
 * model/kernels/kernels_mlx_neon_impl.h - private template for the arm64 NEON MLX
 * affine kernels, included by kernels_mlx_neon.c (KMN_DOT 0: vmull_s8 +
 * vpadalq_s16 integer dots) and kernels_mlx_neondot.c (KMN_DOT 1: sdot),
 * with KMN_ATTR the target attribute (or nothing).
 *
 * The packed words are read in place: 16 bytes of a 4-bit row are one
 * 32-value block (low nibbles = the m8 positions 0..15, high = 16..31), 32
 * bytes of an 8-bit row likewise.  Both dot operands are signed here, so 8-bit
 * q enter as q - 128 (xor 0x80) and each row adds 128 * sum_g scale_g * ms_g
 * once; 4-bit q (0..15) are already valid int8.  Per block an exact integer
 * dot scaled by scale_g * d_b; per row the bias term sum_g bias_g * ms_g.
 * Decode walks rows one after another; prefill uses a KMN_MR x KMN_NT tile.
 */
#ifndef KMN_DOT
#error "define KMN_DOT and KMN_ATTR before including kernels_mlx_neon_impl.h"
#endif

#include <arm_neon.h>
#include <string.h>

#include "common/common.h"
#include "kernels/kernels_mlx_impl.h"

#define KFN static inline __attribute__((always_inline)) KMN_ATTR
#define KOUT static KMN_ATTR
#define KMN_MR 4
#define KMN_NT 4
#define KMN_CHUNK 64

/* acc + 4-lane sums of a[i] * b[i] over 16 int8 pairs */
KFN int32x4_t kmn_dot(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if KMN_DOT
    return vdotq_s32(acc, a, b);
#else
    int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    int16x8_t p1 = vmull_s8(vget_high_s8(a), vget_high_s8(b));
    return vpadalq_s16(vpadalq_s16(acc, p0), p1);
#endif
}

KFN float kmn_sb1(const char *p, int64_t i, const int bf)
{
    uint16_t h;
    memcpy(&h, p + 2 * i, sizeof h);
    return bf ? tp_bf16_to_f32(h) : tp_fp16_to_f32(h);
}

KFN float32x4_t kmn_sb4(const char *p, int64_t i, const int bf)
{
    const uint16x4_t h = vld1_u16((const uint16_t *)(const void *)(p + 2 * i));
    return bf ? vreinterpretq_f32_u32(vshll_n_u16(h, 16)) : vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* sum_g v[g] * ms[g] over ng groups, v a row of fp16/bf16 */
KFN float kmn_gdot(const char *v, const float *ms, int64_t ng, const int bf)
{
    float32x4_t acc = vdupq_n_f32(0.0f);
    int64_t g = 0;
    for (; g + 4 <= ng; g += 4) acc = vfmaq_f32(acc, kmn_sb4(v, g, bf), vld1q_f32(ms + g));
    float s = vaddvq_f32(acc);
    for (; g < ng; g++) s += kmn_sb1(v, g, bf) * ms[g];
    return s;
}

KFN float kmn_tail(const int bits, const char *sr, const char *br, const float *ms, int64_t ng, const int bf)
{
    float v = kmn_gdot(br, ms, ng, bf);
    if (bits == 8) v += 128.0f * kmn_gdot(sr, ms, ng, bf);
    return v;
}

/* 32-block of a packed row as two signed int8x16 in m8 position order */
KFN void kmn_wblk(const int bits, const uint8_t *wb, int8x16_t *w0, int8x16_t *w1)
{
    if (bits == 4) {
        const uint8x16_t q = vld1q_u8(wb);
        *w0 = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
        *w1 = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
    } else {
        const uint8x16_t k = vdupq_n_u8(0x80);
        *w0 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(wb), k));
        *w1 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(wb + 16), k));
    }
}

KFN int32x4_t kmn_idot(int8x16_t w0, int8x16_t w1, const int8_t *a)
{
    return kmn_dot(kmn_dot(vdupq_n_s32(0), w0, vld1q_s8(a)), w1, vld1q_s8(a + 16));
}

KFN void kmn_decode(const int bits, const int G, const int bf, const uint8_t *w, size_t wrb,
                    const struct tp_kern_groups *gp, int64_t n, const void *xq, float *y, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_M8_BLK, ng = n / G;
    const size_t bpb = (size_t)TP_M8_BLK * (size_t)bits / 8;
    const int8_t *aq = TP_M8_QS(xq);
    const float *ad = TP_M8_D(xq, n), *ms = TP_M8_MS(xq, n);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * wrb;
        const char *sr = (const char *)gp->scales + (size_t)r * gp->row_bytes;
        const char *br = (const char *)gp->biases + (size_t)r * gp->row_bytes;
        float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {
            int8x16_t w0, w1, w2, w3;
            kmn_wblk(bits, wr + (size_t)b * bpb, &w0, &w1);
            kmn_wblk(bits, wr + (size_t)(b + 1) * bpb, &w2, &w3);
            const int32x4_t i0 = kmn_idot(w0, w1, aq + b * TP_M8_BLK);
            const int32x4_t i1 = kmn_idot(w2, w3, aq + (b + 1) * TP_M8_BLK);
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(i0), kmn_sb1(sr, b * TP_M8_BLK / G, bf) * ad[b]);
            acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(i1), kmn_sb1(sr, (b + 1) * TP_M8_BLK / G, bf) * ad[b + 1]);
        }
        if (b < nb) {
            int8x16_t w0, w1;
            kmn_wblk(bits, wr + (size_t)b * bpb, &w0, &w1);
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(kmn_idot(w0, w1, aq + b * TP_M8_BLK)),
                               kmn_sb1(sr, b * TP_M8_BLK / G, bf) * ad[b]);
        }
        y[r] = vaddvq_f32(vaddq_f32(acc0, acc1)) + kmn_tail(bits, sr, br, ms, ng, bf);
    }
}

KFN void kmn_tile(const int bits, const int G, const int bf, const uint8_t *w, size_t wrb, const char *s,
                  const char *bi, size_t srb, const char *x, size_t xrb, int64_t n, const int R, const int T,
                  float *y, int64_t ys)
{
    const int64_t nb = n / TP_M8_BLK, ng = n / G;
    const size_t bpb = (size_t)TP_M8_BLK * (size_t)bits / 8;
    float32x4_t acc[KMN_MR][KMN_NT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t W0[KMN_MR], W1[KMN_MR];
        float sc[KMN_MR];
        for (int r = 0; r < R; r++) {
            kmn_wblk(bits, w + (size_t)r * wrb + (size_t)b * bpb, &W0[r], &W1[r]);
            sc[r] = kmn_sb1(s + (size_t)r * srb, b * TP_M8_BLK / G, bf);
        }
        for (int t = 0; t < T; t++) {
            const char *row = x + (size_t)t * xrb;
            const int8_t *a = TP_M8_QS(row) + b * TP_M8_BLK;
            const int8x16_t a0 = vld1q_s8(a), a1 = vld1q_s8(a + 16);
            const float da = TP_M8_D(row, n)[b];
            for (int r = 0; r < R; r++) {
                const int32x4_t i = kmn_dot(kmn_dot(vdupq_n_s32(0), W0[r], a0), W1[r], a1);
                acc[r][t] = vfmaq_n_f32(acc[r][t], vcvtq_f32_s32(i), sc[r] * da);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            y[(int64_t)t * ys + r] = vaddvq_f32(acc[r][t]) + kmn_tail(bits, s + (size_t)r * srb, bi + (size_t)r * srb,
                                                                      TP_M8_MS(x + (size_t)t * xrb, n), ng, bf);
}

#define KMN_TILE_T(R, T)                                                                         \
    switch (T) {                                                                                 \
    case 1: kmn_tile(bits, G, bf, wr, wrb, sr, br, srb, x, xrb, n, R, 1, y, ys); break;          \
    case 2: kmn_tile(bits, G, bf, wr, wrb, sr, br, srb, x, xrb, n, R, 2, y, ys); break;          \
    case 3: kmn_tile(bits, G, bf, wr, wrb, sr, br, srb, x, xrb, n, R, 3, y, ys); break;          \
    default: kmn_tile(bits, G, bf, wr, wrb, sr, br, srb, x, xrb, n, R, KMN_NT, y, ys); break;    \
    }
_Static_assert(KMN_NT == 4, "KMN_TILE_T assumes 4 tokens per tile");

KFN void kmn_matmul(const int bits, const int G, const int bf, const void *w, size_t wrb,
                    const struct tp_kern_groups *gp, int64_t n, const void *xq, size_t xrb, int n_tok, float *yy,
                    int64_t ys, int64_t r0, int64_t r1)
{
    if (n_tok == 1) {
        kmn_decode(bits, G, bf, w, wrb, gp, n, xq, yy, r0, r1);
        return;
    }
    const size_t srb = gp->row_bytes;
    for (int64_t c0 = r0; c0 < r1; c0 += KMN_CHUNK) {
        const int64_t c1 = c0 + KMN_CHUNK < r1 ? c0 + KMN_CHUNK : r1;
        for (int t0 = 0; t0 < n_tok; t0 += KMN_NT) {
            const int T = n_tok - t0 < KMN_NT ? n_tok - t0 : KMN_NT;
            const char *x = (const char *)xq + (size_t)t0 * xrb;
            int64_t r = c0;
            for (; r < c1; r += (c1 - r >= KMN_MR ? KMN_MR : 1)) {
                const uint8_t *wr = (const uint8_t *)w + (size_t)r * wrb;
                const char *sr = (const char *)gp->scales + (size_t)r * srb;
                const char *br = (const char *)gp->biases + (size_t)r * srb;
                float *y = yy + (int64_t)t0 * ys + r;
                if (c1 - r >= KMN_MR) {
                    KMN_TILE_T(KMN_MR, T)
                } else {
                    KMN_TILE_T(1, T)
                }
            }
        }
    }
}

#define KMN_ENTRY(name, bits, G)                                                                                \
    KOUT void name(const void *w, size_t wrb, const struct tp_kern_groups *gp, int64_t n, const void *xq,      \
                   size_t xrb, int n_tok, float *y, int64_t ys, int64_t r0, int64_t r1)                        \
    {                                                                                                           \
        if (gp->bf16) kmn_matmul(bits, G, 1, w, wrb, gp, n, xq, xrb, n_tok, y, ys, r0, r1);                    \
        else kmn_matmul(bits, G, 0, w, wrb, gp, n, xq, xrb, n_tok, y, ys, r0, r1);                             \
    }
KMN_ENTRY(kmn_matmul_q4_g32, 4, 32)
KMN_ENTRY(kmn_matmul_q4_g64, 4, 64)
KMN_ENTRY(kmn_matmul_q8_g32, 8, 32)
KMN_ENTRY(kmn_matmul_q8_g64, 8, 64)

KOUT void kmn_fill_ops(struct tp_kern_ops *ops)
{
    ops->mlx[0] = kmn_matmul_q4_g32;
    ops->mlx[1] = kmn_matmul_q4_g64;
    ops->mlx[2] = kmn_matmul_q8_g32;
    ops->mlx[3] = kmn_matmul_q8_g64;
}

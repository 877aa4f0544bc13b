/*
 * model/kernels/kernels_kquant.c - GGUF K-quants (Q4_K, Q5_K, Q6_K): exact ggml
 * block layouts, reference dequantizers, a simple reference quantizer (valid
 * blocks for synth and tests, not bit-identical to ggml's iterative search),
 * the Q8_K activation quantizer and the scalar matmul oracle.
 *
 * A K-quant super-block holds 256 values in sub-blocks (8 x 32 for Q4_K /
 * Q5_K with a 6-bit scale and 6-bit min each, 16 x 16 for Q6_K with an int8
 * scale), all scaled by fp16 super-block factors.  Activations are Q8_K:
 * {float d; int8 qs[256]; int16 bsums[16]} with bsums[j] = sum of qs[16j..16j+15].
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "kernels/kernels_impl.h"

#define ROW(w, rb, r) ((const void *)((const char *)(w) + (size_t)(r) * (rb)))

/* ggml's get_scale_min_k4: 6-bit scale and min of sub-block j (0..7). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

void tp_kq_scales_mins(const uint8_t *scales12, uint8_t sc[8], uint8_t mn[8])
{
    for (int j = 0; j < 8; j++) scale_min_k4(j, scales12, &sc[j], &mn[j]);
}

/* Inverse of scale_min_k4: pack 8 6-bit scales and mins into 12 bytes. */
static void pack_scale_min_k4(const uint8_t sc[8], const uint8_t mn[8], uint8_t q[12])
{
    memset(q, 0, 12);
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] & 63);
        q[j + 4] = (uint8_t)(mn[j] & 63);
    }
    for (int j = 4; j < 8; j++) {
        q[j + 4] = (uint8_t)((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
        q[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
        q[j] |= (uint8_t)((mn[j] >> 4) << 6);
    }
}

/* -------------------------------------------------------------- dequantize */

static void dequant_q4_k(const tp_blk_q4_k *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q = x[i].qs;
        const float d = tp_fp16_to_f32(x[i].d), mn = tp_fp16_to_f32(x[i].dmin);
        uint8_t sc[8], m[8];
        tp_kq_scales_mins(x[i].scales, sc, m);
        for (int j = 0; j < 4; j++) {
            const float d1 = d * sc[2 * j], m1 = mn * m[2 * j], d2 = d * sc[2 * j + 1], m2 = mn * m[2 * j + 1];
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
        }
    }
}

static void dequant_q5_k(const tp_blk_q5_k *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = tp_fp16_to_f32(x[i].d), mn = tp_fp16_to_f32(x[i].dmin);
        uint8_t sc[8], m[8];
        tp_kq_scales_mins(x[i].scales, sc, m);
        for (int j = 0; j < 4; j++) {
            const uint8_t u1 = (uint8_t)(1u << (2 * j)), u2 = (uint8_t)(2u << (2 * j));
            const float d1 = d * sc[2 * j], m1 = mn * m[2 * j], d2 = d * sc[2 * j + 1], m2 = mn * m[2 * j + 1];
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
        }
    }
}

/* Q6_K value l (0..255) of a block as a signed 6-bit integer (-32..31). */
static int q6_k_value(const tp_blk_q6_k *b, int e)
{
    const int half = e / 128, l = e % 128, quarter = l / 32, k = l % 32;
    const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
    int lo = (quarter & 1) ? ql[k + 32] : ql[k];
    lo = (quarter & 2) ? lo >> 4 : lo & 0xF;
    int hi = (qh[k] >> (2 * quarter)) & 3;
    return (lo | (hi << 4)) - 32;
}

static void dequant_q6_k(const tp_blk_q6_k *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = tp_fp16_to_f32(x[i].d);
        for (int e = 0; e < TP_QK_K; e++) *y++ = d * (float)x[i].scales[e / 16] * (float)q6_k_value(&x[i], e);
    }
}

void tp_kq_dequant(enum tp_wtype t, const void *src, float *dst, int64_t n)
{
    const int64_t nb = n / TP_QK_K;
    switch (t) {
    case TP_WTYPE_Q4_K: dequant_q4_k(src, dst, nb); break;
    case TP_WTYPE_Q5_K: dequant_q5_k(src, dst, nb); break;
    case TP_WTYPE_Q6_K: dequant_q6_k(src, dst, nb); break;
    default: TP_ASSERT(!"tp_kq_dequant: not a K-quant");
    }
}

/* -------------------------------------------------------------- quantize (reference) */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Q4_K / Q5_K: per 32-value sub-block an affine map x ~ s*q - m with q in
 * [0, qmax], s and m quantized to 6 bits against the super-block d / dmin. */
static void quant_qxk_affine(const float *x, int qmax, uint16_t *d_out, uint16_t *dmin_out, uint8_t scales[12],
                             uint8_t q[256])
{
    float sub_s[8], sub_m[8], max_s = 0.0f, max_m = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = x[32 * j], hi = x[32 * j];
        for (int l = 1; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        if (lo > 0.0f) lo = 0.0f; /* ggml keeps min <= 0: m >= 0 */
        sub_s[j] = (hi - lo) / (float)qmax;
        sub_m[j] = -lo;
        max_s = fmaxf(max_s, sub_s[j]);
        max_m = fmaxf(max_m, sub_m[j]);
    }
    const float d = max_s / 63.0f, dmin = max_m / 63.0f;
    *d_out = tp_f32_to_fp16(d);
    *dmin_out = tp_f32_to_fp16(dmin);
    const float dq = tp_fp16_to_f32(*d_out), dminq = tp_fp16_to_f32(*dmin_out);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(dq > 0.0f ? clampi((int)nearbyintf(sub_s[j] / dq), 0, 63) : 0);
        mn[j] = (uint8_t)(dminq > 0.0f ? clampi((int)nearbyintf(sub_m[j] / dminq), 0, 63) : 0);
    }
    pack_scale_min_k4(sc, mn, scales);
    for (int j = 0; j < 8; j++) {
        const float s = dq * sc[j], m = dminq * mn[j];
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)(s > 0.0f ? clampi((int)nearbyintf((x[32 * j + l] + m) / s), 0, qmax) : 0);
    }
}

static void quant_q4_k(const float *x, tp_blk_q4_k *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += TP_QK_K) {
        uint8_t q[256];
        quant_qxk_affine(x, 15, &y[i].d, &y[i].dmin, y[i].scales, q);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) y[i].qs[32 * j + l] = (uint8_t)(q[64 * j + l] | (q[64 * j + 32 + l] << 4));
    }
}

static void quant_q5_k(const float *x, tp_blk_q5_k *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += TP_QK_K) {
        uint8_t q[256];
        quant_qxk_affine(x, 31, &y[i].d, &y[i].dmin, y[i].scales, q);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int j = 0; j < 4; j++) {
            for (int l = 0; l < 32; l++) {
                const int a = q[64 * j + l], b = q[64 * j + 32 + l];
                y[i].qs[32 * j + l] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
                if (a & 16) y[i].qh[l] |= (uint8_t)(1u << (2 * j));
                if (b & 16) y[i].qh[l] |= (uint8_t)(2u << (2 * j));
            }
        }
    }
}

/* Q6_K: per 16-value sub-block a symmetric scale s = amax/31 (q in -31..31,
 * stored +32), s quantized to int8 against the super-block d = max|s|/127. */
static void quant_q6_k(const float *x, tp_blk_q6_k *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += TP_QK_K) {
        float sub[16], max_s = 0.0f;
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f;
            for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * j + l]));
            sub[j] = amax / 31.0f;
            max_s = fmaxf(max_s, sub[j]);
        }
        y[i].d = tp_f32_to_fp16(max_s / 127.0f);
        const float dq = tp_fp16_to_f32(y[i].d);
        memset(y[i].ql, 0, sizeof y[i].ql);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int j = 0; j < 16; j++) {
            y[i].scales[j] = (int8_t)(dq > 0.0f ? clampi((int)nearbyintf(sub[j] / dq), -127, 127) : 0);
            const float s = dq * y[i].scales[j];
            for (int l = 0; l < 16; l++) {
                const int e = 16 * j + l;
                const int q = (s > 0.0f ? clampi((int)nearbyintf(x[e] / s), -32, 31) : 0) + 32; /* 0..63 */
                const int half = e / 128, le = e % 128, quarter = le / 32, k = le % 32;
                uint8_t *ql = y[i].ql + 64 * half + k + ((quarter & 1) ? 32 : 0);
                *ql |= (uint8_t)((quarter & 2) ? (q & 0xF) << 4 : (q & 0xF));
                y[i].qh[32 * half + k] |= (uint8_t)((q >> 4) << (2 * quarter));
            }
        }
    }
}

void tp_kq_quantize(enum tp_wtype t, const float *src, void *dst, int64_t n)
{
    const int64_t nb = n / TP_QK_K;
    switch (t) {
    case TP_WTYPE_Q4_K: quant_q4_k(src, dst, nb); break;
    case TP_WTYPE_Q5_K: quant_q5_k(src, dst, nb); break;
    case TP_WTYPE_Q6_K: quant_q6_k(src, dst, nb); break;
    default: TP_ASSERT(!"tp_kq_quantize: not a K-quant");
    }
}

/* Q8_K activations: d = amax/127, q = round-half-even(x / d), bsums. */
void tp_kq_quant_q8k(const float *x, void *out, int64_t n)
{
    tp_blk_q8_k *y = out;
    for (int64_t i = 0; i < n / TP_QK_K; i++, x += TP_QK_K) {
        float amax = 0.0f;
        for (int l = 0; l < TP_QK_K; l++) amax = fmaxf(amax, fabsf(x[l]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = d;
        for (int l = 0; l < TP_QK_K; l++) y[i].qs[l] = (int8_t)nearbyintf(x[l] * id);
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)s;
        }
    }
}

/* -------------------------------------------------------------- scalar matmul */

/* Exact integer sums per sub-block, then float: sum_j d*sc_j*dot_j - dmin*m_j*asum_j, times d_a. */
static float dot_q4_k(const tp_blk_q4_k *w, const tp_blk_q8_k *a, int64_t nb)
{
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], mn[8];
        tp_kq_scales_mins(w[i].scales, sc, mn);
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = w[i].qs + 32 * (j / 2);
            const int8_t *aq = a[i].qs + 32 * j;
            int32_t dj = 0;
            for (int l = 0; l < 32; l++) dj += (int32_t)((j & 1) ? q[l] >> 4 : q[l] & 0xF) * aq[l];
            isum += dj * sc[j];
            msum += (int32_t)mn[j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        }
        s += a[i].d * (tp_fp16_to_f32(w[i].d) * (float)isum - tp_fp16_to_f32(w[i].dmin) * (float)msum);
    }
    return s;
}

static float dot_q5_k(const tp_blk_q5_k *w, const tp_blk_q8_k *a, int64_t nb)
{
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], mn[8];
        tp_kq_scales_mins(w[i].scales, sc, mn);
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = w[i].qs + 32 * (j / 2);
            const int8_t *aq = a[i].qs + 32 * j;
            int32_t dj = 0;
            for (int l = 0; l < 32; l++) {
                int v = ((j & 1) ? q[l] >> 4 : q[l] & 0xF) | (((w[i].qh[l] >> j) & 1) << 4);
                dj += v * aq[l];
            }
            isum += dj * sc[j];
            msum += (int32_t)mn[j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        }
        s += a[i].d * (tp_fp16_to_f32(w[i].d) * (float)isum - tp_fp16_to_f32(w[i].dmin) * (float)msum);
    }
    return s;
}

static float dot_q6_k(const tp_blk_q6_k *w, const tp_blk_q8_k *a, int64_t nb)
{
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            int32_t dj = 0;
            for (int l = 0; l < 16; l++) dj += q6_k_value(&w[i], 16 * j + l) * a[i].qs[16 * j + l];
            isum += dj * w[i].scales[j];
        }
        s += a[i].d * tp_fp16_to_f32(w[i].d) * (float)isum;
    }
    return s;
}

#define KQ_SCALAR(name, blk, dot)                                                                          \
    static void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y, \
                     int64_t ys, int64_t r0, int64_t r1)                                                    \
    {                                                                                                       \
        for (int64_t r = r0; r < r1; r++)                                                                   \
            for (int t = 0; t < n_tok; t++)                                                                 \
                y[t * ys + r] = dot((const blk *)ROW(w, wrb, r), ROW(xq, xrb, t), n / TP_QK_K);            \
    }
KQ_SCALAR(matmul_q4_k, tp_blk_q4_k, dot_q4_k)
KQ_SCALAR(matmul_q5_k, tp_blk_q5_k, dot_q5_k)
KQ_SCALAR(matmul_q6_k, tp_blk_q6_k, dot_q6_k)

void tp_kq_act_pairs(void *row, int64_t n)
{
    const int64_t nb = n / TP_QK_K;
    const tp_blk_q8_k *a = row;
    int16_t *p = (int16_t *)((char *)row + (size_t)nb * sizeof(tp_blk_q8_k));
    for (int64_t i = 0; i < nb; i++, p += TP_Q8K_PAIRS) {
        int16_t bs[16], s[8];
        memcpy(bs, a[i].bsums, sizeof bs);
        for (int j = 0; j < 8; j++) s[j] = (int16_t)(bs[2 * j] + bs[2 * j + 1]);
        static const int o45[8] = {0, 2, 1, 3, 4, 6, 5, 7}, o6[4] = {0, 2, 1, 3};
        int16_t out[TP_Q8K_PAIRS];
        for (int j = 0; j < 8; j++) out[j] = s[o45[j]];
        for (int m = 0; m < 4; m++)
            for (int j = 0; j < 4; j++) out[8 + 4 * m + j] = bs[4 * m + o6[j]];
        memcpy(p, out, sizeof out);
    }
}

void tp_kq_matmul_x16_scalar(enum tp_wtype t, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb,
                             int n_tok, float *y, int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK_K;
    union {
        tp_blk_q4_k q4;
        tp_blk_q5_k q5;
        tp_blk_q6_k q6;
    } b;
    for (int64_t r = r0; r < r1; r++) {
        for (int tk = 0; tk < n_tok; tk++) {
            const tp_blk_q8_k *a = ROW(xq, xrb, tk);
            float s = 0.0f; /* the row kernels' order: one float term per super-block */
            for (int64_t i = 0; i < nb; i++) {
                tp_x16_unpack_block(t, w, wrb, r, i, &b);
                s += t == TP_WTYPE_Q4_K ? dot_q4_k(&b.q4, a + i, 1)
                     : t == TP_WTYPE_Q5_K ? dot_q5_k(&b.q5, a + i, 1)
                                          : dot_q6_k(&b.q6, a + i, 1);
            }
            y[tk * ys + r] = s;
        }
    }
}

void tp_kern_kquant_scalar_ops(struct tp_kern_ops *ops)
{
    ops->matmul[TP_WTYPE_Q4_K] = matmul_q4_k;
    ops->matmul[TP_WTYPE_Q5_K] = matmul_q5_k;
    ops->matmul[TP_WTYPE_Q6_K] = matmul_q6_k;
}

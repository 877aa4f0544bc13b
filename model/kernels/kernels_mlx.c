/*
 * model/kernels/kernels_mlx.c - MLX affine-quantized weights (mlx-community
 * safetensors: packed uint32 words + per-group fp16/bf16 scales and biases,
 * 4 or 8 bits, groups of 32 or 64): the reference quantizer (as
 * mlx.core.quantize), dequantization, the activation preparation ("m8" rows,
 * layout in kernels_mlx_impl.h), the scalar reference matmul every SIMD
 * version is tested against, and the dispatch of tp_kern_matmul_mlx to the
 * instruction set kernels.c chose.  All of it works on the packed words as
 * the file holds them.
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "kernels/kernels_mlx_impl.h"

int tp_kern_mlx_variant(enum tp_wtype t)
{
    switch (t) {
    case TP_WTYPE_MLX_Q4_G32: return 0;
    case TP_WTYPE_MLX_Q4_G64: return 1;
    case TP_WTYPE_MLX_Q8_G32: return 2;
    case TP_WTYPE_MLX_Q8_G64: return 3;
    default: return -1;
    }
}

static float sb_load(const void *p, int64_t i, int bf16)
{
    uint16_t h;
    memcpy(&h, (const char *)p + 2 * i, sizeof h);
    return bf16 ? tp_bf16_to_f32(h) : tp_fp16_to_f32(h);
}

/* q of element i of a packed row (little-endian words read as bytes). */
static inline unsigned q_at(const uint8_t *w, int bits, int64_t i)
{
    if (bits == 8) return w[i];
    return (w[i >> 1] >> ((i & 1) * 4)) & 0x0F;
}

/* ------------------------------------------------------------ (de)quantize */

void tp_kern_dequant_mlx(enum tp_wtype t, const void *w_row, const void *scales_row, const void *biases_row, int bf16,
                         float *dst, int64_t n)
{
    const int bits = tp_wtype_mlx_bits(t), G = tp_wtype_mlx_group(t);
    TP_ASSERT(bits && n % G == 0);
    const uint8_t *w = w_row;
    for (int64_t g = 0; g < n / G; g++) {
        const float s = sb_load(scales_row, g, bf16), b = sb_load(biases_row, g, bf16);
        for (int64_t i = g * G; i < (g + 1) * G; i++) dst[i] = s * (float)q_at(w, bits, i) + b;
    }
}

void tp_kern_quantize_mlx(enum tp_wtype t, const float *src, void *w_row, uint16_t *scales_row, uint16_t *biases_row,
                          int bf16, int64_t n)
{
    const int bits = tp_wtype_mlx_bits(t), G = tp_wtype_mlx_group(t);
    TP_ASSERT(bits && n % G == 0);
    const float n_bins = (float)((1 << bits) - 1);
    uint8_t *w = w_row;
    memset(w, 0, (size_t)n * (size_t)bits / 8);
    for (int64_t g = 0; g < n / G; g++) {
        const float *x = src + g * G;
        float mx = x[0], mn = x[0];
        for (int i = 1; i < G; i++) mx = fmaxf(mx, x[i]), mn = fminf(mn, x[i]);
        /* mlx/ops.cpp affine quantize: the edge of larger magnitude is exactly
         * representable (scale signed towards it), zero maps to an integer */
        const int neg = fabsf(mn) > fabsf(mx);
        float scale = fmaxf((mx - mn) / n_bins, 1e-7f);
        scale = neg ? scale : -scale;
        const float edge = neg ? mn : mx;
        const float q0 = nearbyintf(edge / scale);
        float bias = 0.0f;
        if (q0 != 0.0f) {
            scale = edge / q0;
            bias = edge;
        }
        for (int i = 0; i < G; i++) {
            float q = nearbyintf((x[i] - bias) / scale);
            q = q < 0.0f ? 0.0f : q > n_bins ? n_bins : q;
            const int64_t e = g * G + i;
            if (bits == 8) w[e] = (uint8_t)q;
            else w[e >> 1] |= (uint8_t)((unsigned)q << ((e & 1) * 4));
        }
        scales_row[g] = bf16 ? tp_f32_to_bf16(scale) : tp_f32_to_fp16(scale);
        biases_row[g] = bf16 ? tp_f32_to_bf16(bias) : tp_f32_to_fp16(bias);
    }
}

/* ------------------------------------------------------------ activations */

size_t tp_kern_mlx_act_row_bytes(enum tp_wtype wt, int64_t n)
{
    const int G = tp_wtype_mlx_group(wt);
    if (!G || n <= 0 || n % G) return 0;
    return TP_M8_ROW_BYTES(n, G);
}

void tp_kern_mlx_prepare_act(enum tp_wtype wt, const float *x, void *xq, int64_t n)
{
    const int bits = tp_wtype_mlx_bits(wt), G = tp_wtype_mlx_group(wt);
    TP_ASSERT(bits && n % G == 0);
    int8_t *qs = xq;
    float *dd = (float *)(qs + n);
    float *ms = dd + n / TP_M8_BLK;
    /* plain loops the compiler vectorizes (no libm calls: this runs per token per matrix);
     * adding and subtracting 1.5 * 2^23 rounds |v| <= 2^22 half to even, as nearbyintf */
    const float magic = 12582912.0f;
    for (int64_t b = 0; b < n / TP_M8_BLK; b++) {
        const float *xb = x + b * TP_M8_BLK;
        float amax = 0.0f;
        for (int i = 0; i < TP_M8_BLK; i++) {
            const float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int8_t v[TP_M8_BLK];
        int32_t sum = 0;
        for (int i = 0; i < TP_M8_BLK; i++) {
            v[i] = (int8_t)(int32_t)((xb[i] * id + magic) - magic);
            sum += v[i];
        }
        int8_t *q = qs + b * TP_M8_BLK;
        if (bits == 4) {
            for (int i = 0; i < TP_M8_BLK / 2; i++) {
                q[i] = v[2 * i];
                q[TP_M8_BLK / 2 + i] = v[2 * i + 1];
            }
        } else {
            memcpy(q, v, sizeof v);
        }
        dd[b] = d;
        const int64_t g = b * TP_M8_BLK / G;
        const float m = d * (float)sum;
        ms[g] = b * TP_M8_BLK % G == 0 ? m : ms[g] + m;
    }
}

/* ------------------------------------------------------------ scalar reference */

/* Exact integer dot of 32-block b of a packed row with the m8 block. */
static int32_t block_idot(const uint8_t *w, int bits, int64_t b, const int8_t *qs)
{
    int32_t s = 0;
    const int8_t *a = qs + b * TP_M8_BLK;
    for (int i = 0; i < TP_M8_BLK; i++)
        s += (int32_t)q_at(w, bits, b * TP_M8_BLK + i) * (int32_t)a[bits == 4 ? TP_M8_POS4(i) : i];
    return s;
}

static void matmul_scalar(int bits, int G, const void *w, size_t wrb, const struct tp_kern_groups *gp, int64_t n,
                          const void *xq, size_t xrb, int n_tok, float *y, int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t ng = n / G, bpg = G / TP_M8_BLK;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * wrb;
        const char *sr = (const char *)gp->scales + (size_t)r * gp->row_bytes;
        const char *br = (const char *)gp->biases + (size_t)r * gp->row_bytes;
        for (int t = 0; t < n_tok; t++) {
            const void *row = (const char *)xq + (size_t)t * xrb;
            const int8_t *qs = TP_M8_QS(row);
            const float *d = TP_M8_D(row, n), *ms = TP_M8_MS(row, n);
            float acc = 0.0f;
            for (int64_t g = 0; g < ng; g++) {
                float sx = 0.0f;
                for (int64_t b = g * bpg; b < (g + 1) * bpg; b++) sx += d[b] * (float)block_idot(wr, bits, b, qs);
                acc += sb_load(sr, g, gp->bf16) * sx + sb_load(br, g, gp->bf16) * ms[g];
            }
            y[(int64_t)t * ys + r] = acc;
        }
    }
}

#define MLX_SCALAR(name, bits, G)                                                                                  \
    static void name(const void *w, size_t wrb, const struct tp_kern_groups *gp, int64_t n, const void *xq,       \
                     size_t xrb, int n_tok, float *y, int64_t ys, int64_t r0, int64_t r1)                         \
    {                                                                                                              \
        matmul_scalar(bits, G, w, wrb, gp, n, xq, xrb, n_tok, y, ys, r0, r1);                                      \
    }
MLX_SCALAR(matmul_q4_g32, 4, 32)
MLX_SCALAR(matmul_q4_g64, 4, 64)
MLX_SCALAR(matmul_q8_g32, 8, 32)
MLX_SCALAR(matmul_q8_g64, 8, 64)

void tp_kern_mlx_ops(const char *isa, struct tp_kern_ops *ops)
{
    if (strcmp(isa, "scalar") == 0) {
        ops->mlx[0] = matmul_q4_g32;
        ops->mlx[1] = matmul_q4_g64;
        ops->mlx[2] = matmul_q8_g32;
        ops->mlx[3] = matmul_q8_g64;
    }
#if defined(__x86_64__) || defined(_M_X64)
    if (strcmp(isa, "avx2") == 0) tp_kern_mlx_avx2_ops(ops);
    if (strcmp(isa, "avx512-vnni") == 0) tp_kern_mlx_avx512_ops(ops);
#endif
#if defined(__aarch64__)
    if (strcmp(isa, "neon") == 0) tp_kern_mlx_neon_ops(ops);
    if (strcmp(isa, "neon-dotprod") == 0) tp_kern_mlx_neondot_ops(ops);
#endif
}

void tp_kern_matmul_mlx(enum tp_wtype wt, const void *w, size_t w_row_bytes, const struct tp_kern_groups *g,
                        int64_t n_cols, const void *xq, size_t xq_row_bytes, int n_tok, float *y, int64_t y_stride,
                        int64_t r0, int64_t r1)
{
    if (r1 <= r0 || n_tok <= 0) return;
    const int v = tp_kern_mlx_variant(wt);
    TP_ASSERT(v >= 0 && g && g->scales && g->biases);
    const struct tp_kern_ops *o = tp_kern_ops_current();
    tp_kern_mlx_fn fn = o->mlx[v] ? o->mlx[v] : tp_kern_ops_scalar()->mlx[v];
    fn(w, w_row_bytes, g, n_cols, xq, xq_row_bytes, n_tok, y, y_stride, r0, r1);
}

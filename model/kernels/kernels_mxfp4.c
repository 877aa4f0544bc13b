/*
 * model/kernels/kernels_mxfp4.c - MXFP4 weights (GGUF type 39, the format of
 * gpt-oss's experts): the value table, the reference dequantizer and
 * quantizer (ggml's dequantize_row_mxfp4 / quantize_row_mxfp4_ref), the
 * scalar matmul every SIMD version is checked against, and the per-ISA
 * table entries (kernels.c calls tp_kern_mxfp4_ops for each ISA it offers).
 *
 * Activations are the a8 rows of Q8_0 (kernels_impl.h): a block's integer
 * dot sum_i kvalues[q_i] * x_i is exact in int32 (|kvalues| <= 12, |x| <=
 * 127, 32 terms), then scaled by 2^(e-128) * d_x in float.
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "kernels/kernels_impl.h"

const int8_t tp_mxfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void tp_mxfp4_dequant(const void *src, float *dst, int64_t n)
{
    const tp_blk_mxfp4 *b = src;
    for (int64_t k = 0; k < n / TP_QK; k++) {
        const float d = tp_e8m0_half(b[k].e);
        for (int i = 0; i < TP_QK / 2; i++) {
            dst[k * TP_QK + i] = (float)tp_mxfp4_kvalues[b[k].qs[i] & 0x0F] * d;
            dst[k * TP_QK + i + TP_QK / 2] = (float)tp_mxfp4_kvalues[b[k].qs[i] >> 4] * d;
        }
    }
}

/* The code whose value times d is nearest x (the first of equals, as ggml's best_index_mxfp4). */
static uint8_t best_index(float x, float d)
{
    int best = 0;
    float best_err = fabsf((float)tp_mxfp4_kvalues[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)tp_mxfp4_kvalues[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return (uint8_t)best;
}

/* As ggml's quantize_row_mxfp4_ref: the shared exponent puts the block's
 * largest magnitude amax in [4, 8) x 2^(e-127) (E2M1's top value is 6, so
 * values above 6/8 of the binade clip to +-6 x scale); each value takes the
 * nearest code. */
void tp_mxfp4_quantize(const float *src, void *dst, int64_t n)
{
    tp_blk_mxfp4 *b = dst;
    for (int64_t k = 0; k < n / TP_QK; k++) {
        const float *x = src + k * TP_QK;
        float amax = 0.0f;
        for (int i = 0; i < TP_QK; i++) amax = fmaxf(amax, fabsf(x[i]));
        int e = 0;
        if (amax > 0.0f) {
            e = (int)floorf(log2f(amax)) - 2 + 127;
            e = e < 0 ? 0 : e > 254 ? 254 : e;
        }
        b[k].e = (uint8_t)e;
        const float d = tp_e8m0_half((uint8_t)e);
        for (int i = 0; i < TP_QK / 2; i++)
            b[k].qs[i] = (uint8_t)(best_index(x[i], d) | (best_index(x[i + TP_QK / 2], d) << 4));
    }
}

/* One MXFP4 block against its a8 activations: an exact integer dot, scaled by the block's E8M0 scale
 * (halved: the kvalues are doubled) and the activation's d. */
static float blk_mxfp4(const void *w_blk, const int8_t *a, float d_x)
{
    const tp_blk_mxfp4 *wb = w_blk;
    int32_t is = 0;
    for (int i = 0; i < TP_QK / 2; i++) {
        is += (int32_t)tp_mxfp4_kvalues[wb->qs[i] & 0x0F] * (int32_t)a[i];
        is += (int32_t)tp_mxfp4_kvalues[wb->qs[i] >> 4] * (int32_t)a[i + TP_QK / 2];
    }
    return (float)is * (tp_e8m0_half(wb->e) * d_x);
}

static float dot_mxfp4(const void *w_row, const void *x_row, int64_t n)
{
    return tp_kern_ref_a8_dot(blk_mxfp4, sizeof(tp_blk_mxfp4), w_row, x_row, n);
}

static void matmul_mxfp4(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                         int64_t ys, int64_t r0, int64_t r1)
{
    tp_kern_ref_matmul(dot_mxfp4, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);
}

void tp_kern_mxfp4_ops(const char *isa, struct tp_kern_ops *ops)
{
    if (strcmp(isa, "scalar") == 0) ops->matmul[TP_WTYPE_MXFP4] = matmul_mxfp4;
#if defined(__x86_64__) || defined(_M_X64)
    if (strcmp(isa, "avx2") == 0) tp_kern_mxfp4_avx2_ops(ops);
    if (strcmp(isa, "avx512-vnni") == 0) tp_kern_mxfp4_avx512_ops(ops);
#endif
#if defined(__aarch64__)
    if (strcmp(isa, "neon") == 0) tp_kern_mxfp4_neon_ops(ops);
    if (strcmp(isa, "neon-dotprod") == 0) tp_kern_mxfp4_neondot_ops(ops);
#endif
}

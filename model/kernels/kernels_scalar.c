/*
 * model/kernels/kernels_scalar.c - the scalar reference matmul for every weight type.
 * Plain C, no vector intrinsics: this is the oracle the SIMD kernels are
 * tested against and the fallback on CPUs without a SIMD version.
 * Quantized types: exact integer dot per block, scaled by d_w * d_x and
 * summed in float; float types: dot accumulated in double.
 */
#include "common/common.h"
#include "kernels/kernels_impl.h"

/* Float types: the dot accumulated in double. */
static float dot_f32(const void *w_row, const void *x_row, int64_t n)
{
    const float *wr = w_row, *x = x_row;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)wr[i] * (double)x[i];
    return (float)s;
}

static float dot_f16(const void *w_row, const void *x_row, int64_t n)
{
    const uint16_t *wr = w_row;
    const float *x = x_row;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)tp_fp16_to_f32(wr[i]) * (double)x[i];
    return (float)s;
}

static float dot_bf16(const void *w_row, const void *x_row, int64_t n)
{
    const uint16_t *wr = w_row;
    const float *x = x_row;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)tp_bf16_to_f32(wr[i]) * (double)x[i];
    return (float)s;
}

/* Quantized types against an a8 activation row: an exact integer dot per block, scaled by d_w * d_x. */
static float blk_q8_0(const void *w_blk, const int8_t *a, float d_x)
{
    const tp_blk_q8_0 *wb = w_blk;
    int32_t is = 0;
    for (int i = 0; i < TP_QK; i++) is += (int32_t)wb->qs[i] * (int32_t)a[i];
    return (float)is * (tp_fp16_to_f32(wb->d) * d_x);
}

static float blk_q4_0(const void *w_blk, const int8_t *a, float d_x)
{
    const tp_blk_q4_0 *wb = w_blk;
    int32_t is = 0;
    for (int i = 0; i < TP_QK / 2; i++) {
        is += ((int32_t)(wb->qs[i] & 0x0F) - 8) * (int32_t)a[i];
        is += ((int32_t)(wb->qs[i] >> 4) - 8) * (int32_t)a[i + TP_QK / 2];
    }
    return (float)is * (tp_fp16_to_f32(wb->d) * d_x);
}

static float dot_q8_0(const void *w_row, const void *x_row, int64_t n)
{
    return tp_kern_ref_a8_dot(blk_q8_0, sizeof(tp_blk_q8_0), w_row, x_row, n);
}

static float dot_q4_0(const void *w_row, const void *x_row, int64_t n)
{
    return tp_kern_ref_a8_dot(blk_q4_0, sizeof(tp_blk_q4_0), w_row, x_row, n);
}

#define REF_MATMUL(name, dot)                                                                                     \
    static void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,     \
                     int64_t ys, int64_t r0, int64_t r1)                                                        \
    {                                                                                                           \
        tp_kern_ref_matmul(dot, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);                                      \
    }
REF_MATMUL(matmul_f32, dot_f32)
REF_MATMUL(matmul_f16, dot_f16)
REF_MATMUL(matmul_bf16, dot_bf16)
REF_MATMUL(matmul_q8_0, dot_q8_0)
REF_MATMUL(matmul_q4_0, dot_q4_0)

void tp_kern_scalar_ops(struct tp_kern_ops *ops)
{
    ops->matmul[TP_WTYPE_F32] = matmul_f32;
    ops->matmul[TP_WTYPE_F16] = matmul_f16;
    ops->matmul[TP_WTYPE_BF16] = matmul_bf16;
    ops->matmul[TP_WTYPE_Q8_0] = matmul_q8_0;
    ops->matmul[TP_WTYPE_Q4_0] = matmul_q4_0;
    ops->quant_a8 = tp_kern_quant_a8_scalar;
}

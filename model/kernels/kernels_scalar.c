/*
 * model/kernels/kernels_scalar.c - the scalar reference matmul for every weight type.
 * Plain C, no vector intrinsics: this is the oracle the SIMD kernels are
 * tested against and the fallback on CPUs without a SIMD version.
 * Quantized types: exact integer dot per block, scaled by d_w * d_x and
 * summed in float; float types: dot accumulated in double.
 */
#include "common/common.h"
#include "kernels/kernels_impl.h"

#define ROW(w, rb, r) ((const void *)((const char *)(w) + (size_t)(r) * (rb)))

static void matmul_f32(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                       int64_t ys, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *wr = ROW(w, wrb, r);
        for (int t = 0; t < n_tok; t++) {
            const float *x = ROW(xq, xrb, t);
            double s = 0.0;
            for (int64_t i = 0; i < n; i++) s += (double)wr[i] * (double)x[i];
            y[t * ys + r] = (float)s;
        }
    }
}

static void matmul_f16(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                       int64_t ys, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *wr = ROW(w, wrb, r);
        for (int t = 0; t < n_tok; t++) {
            const float *x = ROW(xq, xrb, t);
            double s = 0.0;
            for (int64_t i = 0; i < n; i++) s += (double)tp_fp16_to_f32(wr[i]) * (double)x[i];
            y[t * ys + r] = (float)s;
        }
    }
}

static void matmul_bf16(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                        int64_t ys, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *wr = ROW(w, wrb, r);
        for (int t = 0; t < n_tok; t++) {
            const float *x = ROW(xq, xrb, t);
            double s = 0.0;
            for (int64_t i = 0; i < n; i++) s += (double)tp_bf16_to_f32(wr[i]) * (double)x[i];
            y[t * ys + r] = (float)s;
        }
    }
}

static void matmul_q8_0(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                        int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK;
    for (int64_t r = r0; r < r1; r++) {
        const tp_blk_q8_0 *wb = ROW(w, wrb, r);
        for (int t = 0; t < n_tok; t++) {
            const int8_t *xs = TP_A8_QS(ROW(xq, xrb, t));
            const float *xd = TP_A8_D(ROW(xq, xrb, t), n);
            float s = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t is = 0;
                for (int i = 0; i < TP_QK; i++) is += (int32_t)wb[b].qs[i] * (int32_t)xs[b * TP_QK + i];
                s += (float)is * (tp_fp16_to_f32(wb[b].d) * xd[b]);
            }
            y[t * ys + r] = s;
        }
    }
}

static void matmul_q4_0(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                        int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK;
    for (int64_t r = r0; r < r1; r++) {
        const tp_blk_q4_0 *wb = ROW(w, wrb, r);
        for (int t = 0; t < n_tok; t++) {
            const int8_t *xs = TP_A8_QS(ROW(xq, xrb, t));
            const float *xd = TP_A8_D(ROW(xq, xrb, t), n);
            float s = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t is = 0;
                const int8_t *a = xs + b * TP_QK;
                for (int i = 0; i < TP_QK / 2; i++) {
                    is += ((int32_t)(wb[b].qs[i] & 0x0F) - 8) * (int32_t)a[i];
                    is += ((int32_t)(wb[b].qs[i] >> 4) - 8) * (int32_t)a[i + TP_QK / 2];
                }
                s += (float)is * (tp_fp16_to_f32(wb[b].d) * xd[b]);
            }
            y[t * ys + r] = s;
        }
    }
}

void tp_kern_scalar_ops(struct tp_kern_ops *ops)
{
    ops->matmul[TP_WTYPE_F32] = matmul_f32;
    ops->matmul[TP_WTYPE_F16] = matmul_f16;
    ops->matmul[TP_WTYPE_BF16] = matmul_bf16;
    ops->matmul[TP_WTYPE_Q8_0] = matmul_q8_0;
    ops->matmul[TP_WTYPE_Q4_0] = matmul_q4_0;
    ops->quant_a8 = tp_kern_quant_a8_scalar;
}

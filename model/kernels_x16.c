/*
 * model/kernels_x16.c - the Q4_0 "x16" layout (kernels_impl.h): repacking
 * row-major Q4_0 matrices 16 rows at a time, unpacking a row back, the
 * scalar reference matmul, and the dispatch to the chosen ISA's x16 kernel
 * (kernels_x16_avx512.c) or, where it has none, the reference.
 * TP_KERN_X16=0 in the environment turns the repacking off (A/B benchmarks).
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/kernels.h"
#include "model/kernels_impl.h"

#define X16_QS_OFF 32 /* the 16 fp16 scales come first */

size_t tp_kern_x16_bytes(int64_t rows, size_t row_bytes)
{
    return (size_t)((rows + 15) / 16) * 16 * row_bytes;
}

int tp_kern_x16_native(void)
{
    const char *env = getenv("TP_KERN_X16"); /* benchmarks: TP_KERN_X16=0 keeps the row layout */
    if (env && strcmp(env, "0") == 0) return 0;
    return tp_kern_ops_current()->matmul_q4_0_x16 != NULL;
}

void tp_kern_repack_x16(const void *src, size_t row_bytes, int64_t rows, void *dst, int64_t g0, int64_t g1)
{
    const int64_t nb = (int64_t)(row_bytes / sizeof(tp_blk_q4_0));
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *gd = (uint8_t *)dst + (size_t)g * 16 * row_bytes;
        for (int l = 0; l < 16; l++) {
            int64_t r = 16 * g + l < rows ? 16 * g + l : rows - 1;
            const tp_blk_q4_0 *row = (const tp_blk_q4_0 *)((const uint8_t *)src + (size_t)r * row_bytes);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *o = gd + (size_t)b * TP_X16_BLK;
                memcpy(o + 2 * l, &row[b].d, 2);
                for (int k = 0; k < 4; k++) memcpy(o + X16_QS_OFF + 64 * k + 4 * l, row[b].qs + 4 * k, 4);
            }
        }
    }
}

void tp_kern_unpack_x16_row(const void *w, size_t row_bytes, int64_t r, void *dst_row)
{
    const int64_t nb = (int64_t)(row_bytes / sizeof(tp_blk_q4_0));
    const uint8_t *gd = (const uint8_t *)w + (size_t)(r / 16) * 16 * row_bytes;
    const int l = (int)(r % 16);
    tp_blk_q4_0 *out = dst_row;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = gd + (size_t)b * TP_X16_BLK;
        memcpy(&out[b].d, o + 2 * l, 2);
        for (int k = 0; k < 4; k++) memcpy(out[b].qs + 4 * k, o + X16_QS_OFF + 64 * k + 4 * l, 4);
    }
}

/* Reference: the scalar Q4_0 arithmetic (kernels_scalar.c), values read through the layout. */
static void matmul_x16_scalar(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                              int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *gd = (const uint8_t *)w + (size_t)(r / 16) * 16 * wrb;
        const int l = (int)(r % 16);
        for (int t = 0; t < n_tok; t++) {
            const uint8_t *xr = (const uint8_t *)xq + (size_t)t * xrb;
            const int8_t *xs = TP_A8_QS(xr);
            const float *xd = TP_A8_D(xr, n);
            float s = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *o = gd + (size_t)b * TP_X16_BLK;
                uint16_t d;
                memcpy(&d, o + 2 * l, 2);
                int32_t is = 0;
                const int8_t *a = xs + b * TP_QK;
                for (int i = 0; i < TP_QK / 2; i++) {
                    const uint8_t q = o[X16_QS_OFF + 64 * (i / 4) + 4 * l + i % 4];
                    is += ((int32_t)(q & 0x0F) - 8) * (int32_t)a[i];
                    is += ((int32_t)(q >> 4) - 8) * (int32_t)a[i + TP_QK / 2];
                }
                float xdb;
                memcpy(&xdb, xd + b, sizeof xdb);
                s += (float)is * (tp_fp16_to_f32(d) * xdb);
            }
            y[t * ys + r] = s;
        }
    }
}

void tp_kern_matmul_x16(const void *w, size_t w_row_bytes, int64_t n_cols, const void *xq, size_t xq_row_bytes,
                        int n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1)
{
    if (r1 <= r0 || n_tok <= 0) return;
    const tp_kern_matmul_fn fn = tp_kern_ops_current()->matmul_q4_0_x16;
    (fn ? fn : matmul_x16_scalar)(w, w_row_bytes, n_cols, xq, xq_row_bytes, n_tok, y, y_stride, r0, r1);
}

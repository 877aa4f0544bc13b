/*
 * model/kernels/kernels_x16.c - the "x16" layouts of Q4_0 and Q8_0 (kernels_impl.h):
 * repacking row-major matrices 16 rows at a time, unpacking a row back, the
 * scalar reference matmul, and the dispatch to the chosen ISA's x16 kernel
 * (kernels_x16_avx512.c) or, where it has none, the reference.
 * TP_KERN_X16=0 in the environment turns the repacking off (A/B benchmarks).
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/kernels.h"
#include "kernels/kernels_impl.h"

#define X16_QS_OFF 32 /* the 16 fp16 scales come first */

size_t tp_kern_x16_bytes(int64_t rows, size_t row_bytes)
{
    return (size_t)((rows + 15) / 16) * 16 * row_bytes;
}

static tp_kern_matmul_fn x16_kernel(enum tp_wtype t)
{
    const struct tp_kern_ops *o = tp_kern_ops_current();
    return t == TP_WTYPE_Q4_0 ? o->matmul_q4_0_x16 : t == TP_WTYPE_Q8_0 ? o->matmul_q8_0_x16 : NULL;
}

int tp_kern_x16_native(enum tp_wtype t)
{
    const char *env = getenv("TP_KERN_X16"); /* benchmarks: TP_KERN_X16=0 keeps the row layout */
    if (env && strcmp(env, "0") == 0) return 0;
    return x16_kernel(t) != NULL;
}

/* Bytes of one row's block: its scale (2) then qs (16 for Q4_0, 32 for Q8_0). */
static size_t blk_bytes(enum tp_wtype t) { return t == TP_WTYPE_Q4_0 ? sizeof(tp_blk_q4_0) : sizeof(tp_blk_q8_0); }

void tp_kern_repack_x16(enum tp_wtype t, const void *src, size_t row_bytes, int64_t rows, void *dst, int64_t g0,
                        int64_t g1)
{
    TP_ASSERT(t == TP_WTYPE_Q4_0 || t == TP_WTYPE_Q8_0);
    const size_t bb = blk_bytes(t), qb = bb - 2;
    const int64_t nb = (int64_t)(row_bytes / bb);
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *gd = (uint8_t *)dst + (size_t)g * 16 * row_bytes;
        for (int l = 0; l < 16; l++) {
            int64_t r = 16 * g + l < rows ? 16 * g + l : rows - 1;
            const uint8_t *row = (const uint8_t *)src + (size_t)r * row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *o = gd + (size_t)b * 16 * bb;
                const uint8_t *blk = row + (size_t)b * bb;
                memcpy(o + 2 * l, blk, 2);
                for (size_t k = 0; k < qb / 4; k++) memcpy(o + X16_QS_OFF + 64 * k + 4 * (size_t)l, blk + 2 + 4 * k, 4);
            }
        }
    }
}

void tp_kern_unpack_x16_row(enum tp_wtype t, const void *w, size_t row_bytes, int64_t r, void *dst_row)
{
    TP_ASSERT(t == TP_WTYPE_Q4_0 || t == TP_WTYPE_Q8_0);
    const size_t bb = blk_bytes(t), qb = bb - 2;
    const int64_t nb = (int64_t)(row_bytes / bb);
    const uint8_t *gd = (const uint8_t *)w + (size_t)(r / 16) * 16 * row_bytes;
    const size_t l = (size_t)(r % 16);
    uint8_t *out = dst_row;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = gd + (size_t)b * 16 * bb;
        uint8_t *blk = out + (size_t)b * bb;
        memcpy(blk, o + 2 * l, 2);
        for (size_t k = 0; k < qb / 4; k++) memcpy(blk + 2 + 4 * k, o + X16_QS_OFF + 64 * k + 4 * l, 4);
    }
}

/* Reference: the scalar Q4_0 / Q8_0 arithmetic (kernels_scalar.c), values read through the layout. */
static void matmul_x16_scalar(enum tp_wtype t, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb,
                              int n_tok, float *y, int64_t ys, int64_t r0, int64_t r1)
{
    const int64_t nb = n / TP_QK;
    const size_t bb = blk_bytes(t);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *gd = (const uint8_t *)w + (size_t)(r / 16) * 16 * wrb;
        const int l = (int)(r % 16);
        for (int tk = 0; tk < n_tok; tk++) {
            const uint8_t *xr = (const uint8_t *)xq + (size_t)tk * xrb;
            const int8_t *xs = TP_A8_QS(xr);
            const float *xd = TP_A8_D(xr, n);
            float s = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *o = gd + (size_t)b * 16 * bb;
                uint16_t d;
                memcpy(&d, o + 2 * l, 2);
                int32_t is = 0;
                const int8_t *a = xs + b * TP_QK;
                if (t == TP_WTYPE_Q4_0) {
                    for (int i = 0; i < TP_QK / 2; i++) {
                        const uint8_t q = o[X16_QS_OFF + 64 * (i / 4) + 4 * l + i % 4];
                        is += ((int32_t)(q & 0x0F) - 8) * (int32_t)a[i];
                        is += ((int32_t)(q >> 4) - 8) * (int32_t)a[i + TP_QK / 2];
                    }
                } else {
                    for (int i = 0; i < TP_QK; i++)
                        is += (int32_t)(int8_t)o[X16_QS_OFF + 64 * (i / 4) + 4 * l + i % 4] * (int32_t)a[i];
                }
                float xdb;
                memcpy(&xdb, xd + b, sizeof xdb);
                s += (float)is * (tp_fp16_to_f32(d) * xdb);
            }
            y[tk * ys + r] = s;
        }
    }
}

void tp_kern_matmul_x16(enum tp_wtype t, const void *w, size_t w_row_bytes, int64_t n_cols, const void *xq,
                        size_t xq_row_bytes, int n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1)
{
    if (r1 <= r0 || n_tok <= 0) return;
    TP_ASSERT(t == TP_WTYPE_Q4_0 || t == TP_WTYPE_Q8_0);
    const tp_kern_matmul_fn fn = x16_kernel(t);
    if (fn)
        fn(w, w_row_bytes, n_cols, xq, xq_row_bytes, n_tok, y, y_stride, r0, r1);
    else
        matmul_x16_scalar(t, w, w_row_bytes, n_cols, xq, xq_row_bytes, n_tok, y, y_stride, r0, r1);
}

/*
 * model/kernels/kernels_x16.c - the "x16" layouts of Q4_0, Q8_0, MXFP4 and the K-quants
 * (kernels_impl.h): repacking row-major matrices 16 rows at a time (one field
 * table per type), unpacking a row back, the scalar reference matmul of Q4_0 /
 * Q8_0 / MXFP4 (the K-quants' is tp_kq_matmul_x16_scalar), and the dispatch to the
 * chosen ISA's x16 kernel (kernels_x16_avx512.c, kernels_kx16_avx512.c) or,
 * where it has none, the reference.
 * TP_KERN_X16=0 in the environment turns the repacking off (A/B benchmarks).
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/kernels.h"
#include "kernels/kernels_impl.h"

#define X16_QS_OFF 32 /* Q4_0 / Q8_0: the 16 fp16 scales come first */

size_t tp_kern_x16_bytes(int64_t rows, size_t row_bytes)
{
    return (size_t)((rows + 15) / 16) * 16 * row_bytes;
}

static int kq_index(enum tp_wtype t)
{
    return t == TP_WTYPE_Q4_K ? 0 : t == TP_WTYPE_Q5_K ? 1 : t == TP_WTYPE_Q6_K ? 2 : -1;
}

static tp_kern_matmul_fn x16_kernel(enum tp_wtype t)
{
    const struct tp_kern_ops *o = tp_kern_ops_current();
    if (kq_index(t) >= 0) return o->matmul_kq_x16[kq_index(t)];
    return t == TP_WTYPE_Q4_0   ? o->matmul_q4_0_x16
           : t == TP_WTYPE_Q8_0 ? o->matmul_q8_0_x16
           : t == TP_WTYPE_MXFP4 ? o->matmul_mxfp4_x16
                                 : NULL;
}

int tp_kern_x16_type(enum tp_wtype t)
{
    return t == TP_WTYPE_Q4_0 || t == TP_WTYPE_Q8_0 || t == TP_WTYPE_MXFP4 || kq_index(t) >= 0;
}

int tp_kern_x16_native(enum tp_wtype t)
{
    const char *env = getenv("TP_KERN_X16"); /* benchmarks: TP_KERN_X16=0 keeps the row layout */
    if (env && strcmp(env, "0") == 0) return 0;
    return tp_kern_x16_type(t) && x16_kernel(t) != NULL;
}

/* The fields of one block (kernels_impl.h): n bytes at src in the GGUF block
 * go to dst in the 16-row block; n == 1: u8 [16], n == 2: u16 [16], else [n/4][16][4],
 * its 64-byte chunks one after another from dst (X16_RUN) or where Q5_K's pairs or Q6_K's
 * triplets put them (X16_Q5K_*, X16_Q6K_*: tp_kx_q5k_qh ... in kernels_impl.h; dst unused). */
enum { X16_RUN, X16_Q5K_QH, X16_Q5K_QS, X16_Q6K_QH, X16_Q6K_QL };
struct x16_field {
    uint16_t src, n, dst, chunks;
};

/* Offset of chunk k of field f in the 16-row block. */
static size_t x16_chunk(const struct x16_field *f, size_t k)
{
    switch (f->chunks) {
    case X16_Q5K_QH: return tp_kx_q5k_qh((int)k);
    case X16_Q5K_QS: return tp_kx_q5k_qs((int)k);
    case X16_Q6K_QH: return tp_kx_q6k_qh((int)k);
    case X16_Q6K_QL: return tp_kx_q6k_ql((int)k);
    default: return (size_t)f->dst + 64 * k;
    }
}

struct x16_fields {
    size_t bb; /* bytes of one row's block */
    int nf;
    struct x16_field f[5];
};

static const struct x16_fields *x16_fields(enum tp_wtype t)
{
    static const struct x16_fields q4_0 = {sizeof(tp_blk_q4_0), 2, {{0, 2, 0, X16_RUN}, {2, 16, X16_QS_OFF, X16_RUN}}};
    static const struct x16_fields q8_0 = {sizeof(tp_blk_q8_0), 2, {{0, 2, 0, X16_RUN}, {2, 32, X16_QS_OFF, X16_RUN}}};
    static const struct x16_fields mxfp4 = {sizeof(tp_blk_mxfp4),
                                            2,
                                            {{0, 1, 0, X16_RUN}, {1, 16, TP_X16_MXFP4_QS, X16_RUN}}};
    static const struct x16_fields q4_k = {sizeof(tp_blk_q4_k),
                                           4,
                                           {{0, 2, 0, X16_RUN},
                                            {2, 2, TP_KX_Q4K_DMIN, X16_RUN},
                                            {4, 12, TP_KX_Q4K_SC, X16_RUN},
                                            {16, 128, TP_KX_Q4K_QS, X16_RUN}}};
    static const struct x16_fields q5_k = {sizeof(tp_blk_q5_k),
                                           5,
                                           {{0, 2, 0, X16_RUN},
                                            {2, 2, TP_KX_Q4K_DMIN, X16_RUN},
                                            {4, 12, TP_KX_Q4K_SC, X16_RUN},
                                            {16, 32, 0, X16_Q5K_QH},
                                            {48, 128, 0, X16_Q5K_QS}}};
    static const struct x16_fields q6_k = {sizeof(tp_blk_q6_k),
                                           4,
                                           {{208, 2, 0, X16_RUN},
                                            {192, 16, TP_KX_Q6K_SC, X16_RUN},
                                            {128, 64, 0, X16_Q6K_QH},
                                            {0, 128, 0, X16_Q6K_QL}}};
    switch (t) {
    case TP_WTYPE_Q4_0: return &q4_0;
    case TP_WTYPE_Q8_0: return &q8_0;
    case TP_WTYPE_MXFP4: return &mxfp4;
    case TP_WTYPE_Q4_K: return &q4_k;
    case TP_WTYPE_Q5_K: return &q5_k;
    case TP_WTYPE_Q6_K: return &q6_k;
    default: TP_ASSERT(!"x16: not an x16 type"); return NULL;
    }
}

/* Byte offsets (in the GGUF block, in the 16-row block) of every 2- or 4-byte piece of
 * lane l's block: fn(ctx, gguf offset, x16 offset, bytes). */
#define X16_PIECES(fs, l, COPY)                                                                    \
    for (int fi_ = 0; fi_ < (fs)->nf; fi_++) {                                                     \
        const struct x16_field *f_ = &(fs)->f[fi_];                                                \
        if (f_->n == 1) {                                                                          \
            COPY((size_t)f_->src, (size_t)f_->dst + (l), 1);                                       \
        } else if (f_->n == 2) {                                                                   \
            COPY((size_t)f_->src, (size_t)f_->dst + 2 * (l), 2);                                   \
        } else {                                                                                   \
            for (size_t k_ = 0; k_ < (size_t)f_->n / 4; k_++)                                      \
                COPY((size_t)f_->src + 4 * k_, x16_chunk(f_, k_) + 4 * (l), 4);                   \
        }                                                                                          \
    }

/* Lane l of the 16-row block o from one row's GGUF block, and back. */
static void x16_put(const struct x16_fields *fs, uint8_t *o, const uint8_t *blk, size_t l)
{
#define PUT(s, d, n) memcpy(o + (d), blk + (s), (n))
    X16_PIECES(fs, l, PUT)
#undef PUT
}

static void x16_get(const struct x16_fields *fs, const uint8_t *o, uint8_t *blk, size_t l)
{
#define GET(s, d, n) memcpy(blk + (s), o + (d), (n))
    X16_PIECES(fs, l, GET)
#undef GET
}

void tp_kern_repack_x16(enum tp_wtype t, const void *src, size_t row_bytes, int64_t rows, void *dst, int64_t g0,
                        int64_t g1)
{
    const struct x16_fields *fs = x16_fields(t);
    const int64_t nb = (int64_t)(row_bytes / fs->bb);
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *gd = (uint8_t *)dst + (size_t)g * 16 * row_bytes;
        for (int l = 0; l < 16; l++) {
            int64_t r = 16 * g + l < rows ? 16 * g + l : rows - 1;
            const uint8_t *row = (const uint8_t *)src + (size_t)r * row_bytes;
            for (int64_t b = 0; b < nb; b++)
                x16_put(fs, gd + (size_t)b * 16 * fs->bb, row + (size_t)b * fs->bb, (size_t)l);
        }
    }
}

void tp_x16_unpack_block(enum tp_wtype t, const void *w, size_t row_bytes, int64_t r, int64_t i, void *blk)
{
    const struct x16_fields *fs = x16_fields(t);
    const uint8_t *o = (const uint8_t *)w + (size_t)(r / 16) * 16 * row_bytes + (size_t)i * 16 * fs->bb;
    x16_get(fs, o, blk, (size_t)(r % 16));
}

void tp_kern_unpack_x16_row(enum tp_wtype t, const void *w, size_t row_bytes, int64_t r, void *dst_row)
{
    const struct x16_fields *fs = x16_fields(t);
    const int64_t nb = (int64_t)(row_bytes / fs->bb);
    for (int64_t b = 0; b < nb; b++) tp_x16_unpack_block(t, w, row_bytes, r, b, (uint8_t *)dst_row + (size_t)b * fs->bb);
}

/* Bytes of one row's block: its scale (2; MXFP4 1) then qs (16 for Q4_0 / MXFP4, 32 for Q8_0). */
static size_t blk_bytes(enum tp_wtype t)
{
    return t == TP_WTYPE_Q4_0 ? sizeof(tp_blk_q4_0) : t == TP_WTYPE_MXFP4 ? sizeof(tp_blk_mxfp4) : sizeof(tp_blk_q8_0);
}

/* Reference: the scalar Q4_0 / Q8_0 / MXFP4 arithmetic (kernels_scalar.c, kernels_mxfp4.c), values read
 * through the layout. */
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
                if (t == TP_WTYPE_MXFP4) {
                    for (int i = 0; i < TP_QK / 2; i++) {
                        const uint8_t q = o[TP_X16_MXFP4_QS + 64 * (i / 4) + 4 * l + i % 4];
                        is += (int32_t)tp_mxfp4_kvalues[q & 0x0F] * (int32_t)a[i];
                        is += (int32_t)tp_mxfp4_kvalues[q >> 4] * (int32_t)a[i + TP_QK / 2];
                    }
                    float xdm;
                    memcpy(&xdm, xd + b, sizeof xdm);
                    s += (float)is * (tp_e8m0_half(o[l]) * xdm);
                    continue;
                }
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
    TP_ASSERT(tp_kern_x16_type(t));
    const tp_kern_matmul_fn fn = x16_kernel(t);
    if (fn)
        fn(w, w_row_bytes, n_cols, xq, xq_row_bytes, n_tok, y, y_stride, r0, r1);
    else if (kq_index(t) >= 0)
        tp_kq_matmul_x16_scalar(t, w, w_row_bytes, n_cols, xq, xq_row_bytes, n_tok, y, y_stride, r0, r1);
    else
        matmul_x16_scalar(t, w, w_row_bytes, n_cols, xq, xq_row_bytes, n_tok, y, y_stride, r0, r1);
}

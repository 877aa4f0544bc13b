/*
 * model/kernels/kernels_x16_i8mm.c - arm64 NEON matmul for every x16 layout with the
 * int8 matrix-multiply extension (smmla; Apple M2 and later, Neoverse V1/N2,
 * Cortex-A710 and later), the "neon-i8mm" ISA.  One token (decode) is the
 * dot-product kernel (kernels_x16_tmpl_impl.h, compiled here too); 2..16
 * tokens go in passes of 4, two token pairs per 8-row half-group:
 *  - two consecutive 4-byte slices of the layout (values 4k..4k+7 of 8 rows,
 *    decoded as the template does) zipped give four 2-row x 8-value operands
 *    (zip1 / zip2 of the 32-bit lanes), the activations of two tokens side by
 *    side (8 bytes each) the other, and one smmla adds the 2 x 2 tile
 *    [row r token t, r t+1, r+1 t, r+1 t+1]: 32 multiply-adds, twice sdot's;
 *  - per (sub-)block the tiles are scaled in float by the rows' factors
 *    zipped to the tile order ([f_r, f_r, f_r+1, f_r+1]) and the tokens' d;
 *    the K-quant mins / offsets are the template's per-lane sums, zipped the
 *    same way; outputs are unzipped (uzp1 / uzp2) back to rows per token.
 * Results equal the scalar reference up to float rounding, as every x16 kernel.
 */
#if defined(__aarch64__) && (defined(__ARM_FEATURE_MATMUL_INT8) || !defined(__clang__))
#if defined(__ARM_FEATURE_MATMUL_INT8) && defined(__ARM_FEATURE_DOTPROD)
#define KV_ATTR
#elif defined(__clang__)
#define KV_ATTR __attribute__((target("dotprod,i8mm")))
#else
#define KV_ATTR __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#endif
#define KV_BT 4
#define KV_FILL tp_kern_x16_i8mm_sdot_ops
#include "kernels/kernels_x16_neon_kv_impl.h"
#include "kernels/kernels_x16_tmpl_impl.h"

#define XM_P 2 /* token pairs per pass */

/* Rows (0,1), (2,3), (4,5), (6,7) x 8 values from slices v0 (values 4k..4k+3) and v1 (4k+4..4k+7). */
KV_FN void xm_rows(kvi v0, kvi v1, int8x16_t A[4])
{
    A[0] = vreinterpretq_s8_s32(vzip1q_s32(v0.a, v1.a));
    A[1] = vreinterpretq_s8_s32(vzip2q_s32(v0.a, v1.a));
    A[2] = vreinterpretq_s8_s32(vzip1q_s32(v0.b, v1.b));
    A[3] = vreinterpretq_s8_s32(vzip2q_s32(v0.b, v1.b));
}

/* 8 activation bytes of two tokens side by side. */
KV_FN int8x16_t xm_tok2(const int8_t *a0, const int8_t *a1)
{
    int8_t b[16];
    memcpy(b, a0, 8);
    memcpy(b + 8, a1, 8);
    return vld1q_s8(b);
}

/* Per-row floats in tile order: [f_2r, f_2r, f_2r+1, f_2r+1] for row pair r. */
KV_FN void xm_fz(kvf f, float32x4_t o[4])
{
    o[0] = vzip1q_f32(f.a, f.a), o[1] = vzip2q_f32(f.a, f.a);
    o[2] = vzip1q_f32(f.b, f.b), o[3] = vzip2q_f32(f.b, f.b);
}

/* Two tokens' per-row sums in tile order. */
KV_FN void xm_iz(kvi u0, kvi u1, int32x4_t o[4])
{
    o[0] = vzip1q_s32(u0.a, u1.a), o[1] = vzip2q_s32(u0.a, u1.a);
    o[2] = vzip1q_s32(u0.b, u1.b), o[3] = vzip2q_s32(u0.b, u1.b);
}

KV_FN float32x4_t xm_d2(float d0, float d1)
{
    const float v[4] = {d0, d1, d0, d1};
    return vld1q_f32(v);
}

/* Q4_0 / Q8_0 block b for P token pairs (a8 rows at x + xo[t]). */
KV_FN void xm_blk_a8(const int type, const int P, const char *p, int lb, const char *x, const size_t *xo, int64_t n,
                     int64_t b, float32x4_t acc[XM_P][4])
{
    float32x4_t dz[4];
    xm_fz(kv_h2f(p + lb / 2), dz);
    int32x4_t D[XM_P][4];
    KX_UNROLL
    for (int q = 0; q < P; q++) {
        int32_t s0 = 0, s1 = 0;
        if (type == XT_Q4_0) { /* -8 * each token's block sum */
            memcpy(&s0, TP_A8_S(x + xo[2 * q], n) + b, sizeof s0);
            memcpy(&s1, TP_A8_S(x + xo[2 * q + 1], n) + b, sizeof s1);
        }
        const int32_t v[4] = {s0, s1, s0, s1};
        for (int r = 0; r < 4; r++) D[q][r] = vld1q_s32(v);
    }
    KX_UNROLL
    for (int k = 0; k < 8; k += 2) {
        int8x16_t A[4];
        xm_rows(xt_slice_a8(type, p, lb, k), xt_slice_a8(type, p, lb, k + 1), A);
        KX_UNROLL
        for (int q = 0; q < P; q++) {
            const int8x16_t B = xm_tok2(TP_A8_QS(x + xo[2 * q]) + b * TP_QK + 4 * k,
                                        TP_A8_QS(x + xo[2 * q + 1]) + b * TP_QK + 4 * k);
            for (int r = 0; r < 4; r++) D[q][r] = vmmlaq_s32(D[q][r], A[r], B);
        }
    }
    KX_UNROLL
    for (int q = 0; q < P; q++) {
        float d0, d1;
        memcpy(&d0, TP_A8_D(x + xo[2 * q], n) + b, sizeof d0);
        memcpy(&d1, TP_A8_D(x + xo[2 * q + 1], n) + b, sizeof d1);
        const float32x4_t dv = xm_d2(d0, d1);
        for (int r = 0; r < 4; r++) acc[q][r] = vfmaq_f32(acc[q][r], vcvtq_f32_s32(D[q][r]), vmulq_f32(dz[r], dv));
    }
}

/* K-quant super-block i for P token pairs (Q8_K rows at x + xo[t]). */
KV_FN void xm_sb_k(const int type, const int P, const char *p, int lb, const char *x, const size_t *xo, int64_t nb,
                   int64_t i, float32x4_t acc[XM_P][4])
{
    const tp_blk_q8_k *a[2 * XM_P];
    const int16_t *pr[2 * XM_P];
    KX_UNROLL
    for (int t = 0; t < 2 * P; t++) {
        a[t] = (const tp_blk_q8_k *)(x + xo[t]) + i;
        pr[t] = TP_Q8K_PAIR(x + xo[t], nb * TP_QK_K, i);
    }
    const kvf DL = kv_h2f(p + lb / 2);
    kvi sc[2] = {kv_zero(), kv_zero()}, mp[4] = {kv_zero(), kv_zero(), kv_zero(), kv_zero()};
    if (type != XT_Q6K) xt_scales_mins(p, lb, sc, mp);
    float32x4_t fs[XM_P][4];
    KX_UNROLL
    for (int q = 0; q < P; q++)
        for (int r = 0; r < 4; r++) fs[q][r] = vdupq_n_f32(0.0f);
    KX_UNROLL
    for (int j = 0; j < 16; j++) {
        if (j >= XT_NSUB(type)) break;
        float32x4_t sz[4];
        xm_fz(xt_scf(type, p, lb, sc, j, DL), sz);
        int32x4_t D[XM_P][4];
        KX_UNROLL
        for (int q = 0; q < P; q++)
            for (int r = 0; r < 4; r++) D[q][r] = vdupq_n_s32(0);
        KX_UNROLL
        for (int m = 0; m < 8; m += 2) {
            if (m >= XT_NSLICE(type)) break;
            int8x16_t A[4];
            xm_rows(xt_slice_k(type, p, lb, j, m), xt_slice_k(type, p, lb, j, m + 1), A);
            const int o = xt_aoff_k(type, j, m);
            KX_UNROLL
            for (int q = 0; q < P; q++) {
                const int8x16_t B = xm_tok2(a[2 * q]->qs + o, a[2 * q + 1]->qs + o);
                for (int r = 0; r < 4; r++) D[q][r] = vmmlaq_s32(D[q][r], A[r], B);
            }
        }
        KX_UNROLL
        for (int q = 0; q < P; q++)
            for (int r = 0; r < 4; r++) fs[q][r] = vfmaq_f32(fs[q][r], vcvtq_f32_s32(D[q][r]), sz[r]);
    }
    float32x4_t oz[4];
    xm_fz(xt_offset_f(type, p, lb, DL), oz);
    KX_UNROLL
    for (int q = 0; q < P; q++) {
        int32x4_t O[4];
        xm_iz(xt_offset(type, p, lb, mp, pr[2 * q]), xt_offset(type, p, lb, mp, pr[2 * q + 1]), O);
        const float32x4_t dv = xm_d2(a[2 * q]->d, a[2 * q + 1]->d);
        for (int r = 0; r < 4; r++)
            acc[q][r] = vfmaq_f32(acc[q][r], vfmsq_f32(fs[q][r], vcvtq_f32_s32(O[r]), oz[r]), dv);
    }
}

/* One half-group x P token pairs over every block; tokens < T, rows in [r0, r1) stored. */
KV_FN void xm_half(const int type, const int P, const char *gp, int lb, int64_t n, const char *x, const size_t *xo,
                   int T, float *y, int64_t ys, int64_t g0, int64_t r0, int64_t r1)
{
    float32x4_t acc[XM_P][4];
    for (int q = 0; q < XM_P; q++)
        for (int r = 0; r < 4; r++) acc[q][r] = vdupq_n_f32(0.0f);
    const size_t gbs = xt_gbs(type);
    const int kq = type >= XT_Q4K;
    const int64_t nb = n / (kq ? TP_QK_K : TP_QK);
    for (int64_t i = 0; i < nb; i++) {
        const char *p = gp + (size_t)i * gbs;
        if (kq)
            xm_sb_k(type, P, p, lb, x, xo, nb, i, acc);
        else
            xm_blk_a8(type, P, p, lb, x, xo, n, i, acc);
    }
    const int64_t h0 = g0 + lb / 4;
    for (int q = 0; q < P; q++) {
        float o[2][8]; /* tokens 2q, 2q+1: rows 0..7 of the half */
        vst1q_f32(o[0], vuzp1q_f32(acc[q][0], acc[q][1]));
        vst1q_f32(o[1], vuzp2q_f32(acc[q][0], acc[q][1]));
        vst1q_f32(o[0] + 4, vuzp1q_f32(acc[q][2], acc[q][3]));
        vst1q_f32(o[1] + 4, vuzp2q_f32(acc[q][2], acc[q][3]));
        for (int u = 0; u < 2; u++) {
            if (2 * q + u >= T) continue;
            for (int l = 0; l < 8; l++)
                if (h0 + l >= r0 && h0 + l < r1) y[(int64_t)(2 * q + u) * ys + h0 + l] = o[u][l];
        }
    }
}

KV_FN void xm_matmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                     float *y, int64_t ys, int64_t r0, int64_t r1)
{
    for (int64_t c0 = r0 / 16 * 16; c0 < r1; c0 += XT_BROWS) {
        const int64_t c1 = r1 - c0 < XT_BROWS ? r1 : c0 + XT_BROWS;
        for (int t0 = 0; t0 < n_tok; t0 += 2 * XM_P) {
            const int T = n_tok - t0 < 2 * XM_P ? n_tok - t0 : 2 * XM_P;
            const char *x = (const char *)xq + (size_t)t0 * xrb;
            size_t xo[2 * XM_P]; /* a padded pair repeats token T-1 (not stored) */
            for (int t = 0; t < 2 * XM_P; t++) xo[t] = (size_t)(t < T ? t : T - 1) * xrb;
            float *yt = y + (int64_t)t0 * ys;
            for (int64_t g0 = c0; g0 < c1; g0 += 16) {
                const char *gp = (const char *)w + (size_t)(g0 / 16) * 16 * wrb;
                for (int lb = 0; lb < 64; lb += 32) {
                    if (g0 + lb / 4 >= r1 || g0 + lb / 4 + 8 <= r0) continue;
                    if (T <= 2)
                        xm_half(type, 1, gp, lb, n, x, xo, T, yt, ys, g0, r0, r1);
                    else
                        xm_half(type, XM_P, gp, lb, n, x, xo, T, yt, ys, g0, r0, r1);
                }
            }
        }
    }
}
_Static_assert(XM_P == 2, "xm_matmul assumes passes of 1 or 2 token pairs");

#define XM_ENTRY(name, type)                                                                                    \
    KV_OUT void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,     \
                     int64_t ys, int64_t r0, int64_t r1)                                                        \
    {                                                                                                           \
        if (n_tok == 1)                                                                                         \
            xt_matmul(type, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);                                          \
        else                                                                                                    \
            xm_matmul(type, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);                                          \
    }
XM_ENTRY(xm_matmul_q4_0, XT_Q4_0)
XM_ENTRY(xm_matmul_q8_0, XT_Q8_0)
XM_ENTRY(xm_matmul_q4_k, XT_Q4K)
XM_ENTRY(xm_matmul_q5_k, XT_Q5K)
XM_ENTRY(xm_matmul_q6_k, XT_Q6K)

void tp_kern_neoni8mm_ops(struct tp_kern_ops *ops)
{
    tp_kern_neondot_ops(ops);
    ops->matmul_q4_0_x16 = xm_matmul_q4_0;
    ops->matmul_q8_0_x16 = xm_matmul_q8_0;
    ops->matmul_kq_x16[0] = xm_matmul_q4_k;
    ops->matmul_kq_x16[1] = xm_matmul_q5_k;
    ops->matmul_kq_x16[2] = xm_matmul_q6_k;
}
const int tp_kern_i8mm_built = 1;
#elif defined(__aarch64__)
#include "kernels/kernels_impl.h"
/* no i8mm intrinsics in this clang build (see kernels_neondot.c): no neon-i8mm ISA */
void tp_kern_neoni8mm_ops(struct tp_kern_ops *ops) { tp_kern_neondot_ops(ops); }
void tp_kern_x16_i8mm_sdot_ops(struct tp_kern_ops *ops) { (void)ops; }
const int tp_kern_i8mm_built = 0;
#else
typedef int tp_kernels_x16_i8mm_unused; /* ISO C forbids an empty translation unit */
#endif

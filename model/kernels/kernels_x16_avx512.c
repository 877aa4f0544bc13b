/*
 * model/kernels/kernels_x16_avx512.c - AVX-512 VNNI matmul for Q4_0, Q8_0 and MXFP4 weights
 * in the 16-row repacked "x16" layout (kernels_impl.h): lane L of a zmm holds
 * row L of a 16-row group, and the layout already stores each block's values
 * in that order, so a block of 16 rows costs four 64-byte loads and a nibble
 * split (Q4_0; MXFP4 then looks its codes up as kvalues + 16 with one vpshufb
 * per slice, the a8 row's -16 x sum taking the offset back out) or eight loads
 * and a +128 bias (Q8_0, the a8 correction takes it back out) and eight
 * vpdpbusd per token (the row-major kernels in
 * kernels_x86_impl.h spend most of their instructions gathering and
 * transposing bytes instead).
 * One weight stream per group instead of one per row, and the outputs land
 * in row order.
 *
 * One token (decode): the activation row is read in place (its slices are
 * embedded broadcasts), the groups walked in memory order.  Several tokens:
 * the kx_qbatch scheme - chunks of X16_BROWS rows x slabs of blocks x
 * passes of up to 8 tokens whose
 * activations are packed block by block into one stream - with the partial
 * sums reloaded exactly between slabs, so every row and token is the same
 * chain of block terms whatever the split.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <string.h>

#include "kernels/kernels_a8pack_impl.h"
#include "kernels/kernels_impl.h"

#define XT "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define XFN static inline __attribute__((always_inline, target(XT)))
#define XOUT static __attribute__((target(XT)))

#define X16_PF 4608 /* software prefetch distance of the batch pass's group stream (16 blocks) */
#define X16_BT 8    /* tokens per pass (8 accumulators + 8 chains + 8 slices in 32 zmm) */
#define X16_SLAB 64 /* blocks per slab when several passes reuse a chunk's weights */
#define X16_SLAB_MAX 256
#define X16_BROWS 128
#define X16_PK TP_A8PACK_BLK /* packed activation block (kernels_a8pack_impl.h) */

XFN __m512i x16_bc32(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}
XFN __m512 x16_bcf(const void *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_ps(v);
}

/* acc + vpdpbusd(w, the 4 bytes at p broadcast to every lane).  Written as the
 * instruction's embedded broadcast ({1to16} memory operand): compilers emit a
 * separate vpbroadcastd for _mm512_set1_epi32(*p), one more vector uop for
 * every vpdpbusd of the batch pass. */
XFN __m512i x16_dpb(__m512i acc, __m512i w, const void *p)
{
#if defined(__GNUC__) && !defined(X16_NO_ASM)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)p));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, w, x16_bc32(p));
#endif
}

/* The type argument q8 of the functions below: 0 Q4_0, 1 Q8_0, X16_MX MXFP4. */
#define X16_MX 2
/* Block stride of the layout (bytes per block of 16 rows). */
#define X16_BS(q8) ((q8) == X16_MX ? TP_X16_BLK_MXFP4 : (q8) ? TP_X16_BLK_Q8 : TP_X16_BLK)

/* The 16 E8M0 bytes at p as floats 2^(e - 128) (tp_e8m0_half: e >= 2 (e - 1) << 23, else the subnormal
 * 0x00200000 << e). */
XFN __m512 x16_e8m0(const char *p)
{
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    const __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i small = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1)), small, big));
}

/* Block at p: the 16 rows' scales as floats and the 8 slices, W[j] lane L = row L's
 * values 4j..4j+3 as u8: Q4_0 nibbles (j >= 4 are the high ones, values 16 + 4(j-4)..),
 * Q8_0 q + 128, MXFP4 the nibbles' kvalues + 16. */
XFN __m512 x16_slices(const char *p, __m512i W[8], const int q8)
{
    if (q8 == X16_MX) {
        static const int8_t k_table_u[16] = {16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4};
        const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)k_table_u));
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        for (int k = 0; k < 4; k++) {
            const __m512i z = _mm512_loadu_si512(p + TP_X16_MXFP4_QS + 64 * k);
            W[k] = _mm512_shuffle_epi8(tab, _mm512_and_si512(z, m4));
            W[k + 4] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
        }
        return x16_e8m0(p);
    }
    if (q8) {
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        for (int k = 0; k < 8; k++) W[k] = _mm512_xor_si512(_mm512_loadu_si512(p + 32 + 64 * k), bias);
    } else {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        for (int k = 0; k < 4; k++) {
            const __m512i z = _mm512_loadu_si512(p + 32 + 64 * k);
            W[k] = _mm512_and_si512(z, m4);
            W[k + 4] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
        }
    }
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* The block X16_PF bytes past p requested into L1, or into L2 where l2 (tp_kern_prefetch in kernels.h). */
XFN void x16_prefetch(const char *p, const int q8, const int l2)
{
    for (int o = 0; o < X16_BS(q8); o += 64) TP_PREFETCH(p + X16_PF + o, l2);
}

/* Lanes [lo, hi) of a group's 16 outputs. */
XFN __mmask16 x16_keep(int64_t g0, int64_t r0, int64_t r1)
{
    const int lo = r0 > g0 ? (int)(r0 - g0) : 0;
    const int hi = r1 - g0 < 16 ? (int)(r1 - g0) : 16;
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* acc + (the block at p) . (activation block b) x its scales, 16 rows as lanes. */
XFN __m512 x16_blk(const char *p, const int8_t *qs, const float *ad, const int32_t *as, int64_t b, __m512 acc,
                   const int q8)
{
    __m512i W[8];
    const __m512 dw = x16_slices(p, W, q8);
    const int8_t *a = qs + b * TP_QK;
    /* two chains of four (the second starts at zero), so a block's dot
     * is not one eight-deep vpdpbusd dependency */
    __m512i i0 = x16_bc32(as + b), i1 = _mm512_setzero_si512();
    i0 = _mm512_dpbusd_epi32(i0, W[0], x16_bc32(a + 0));
    i1 = _mm512_dpbusd_epi32(i1, W[4], x16_bc32(a + 16));
    i0 = _mm512_dpbusd_epi32(i0, W[1], x16_bc32(a + 4));
    i1 = _mm512_dpbusd_epi32(i1, W[5], x16_bc32(a + 20));
    i0 = _mm512_dpbusd_epi32(i0, W[2], x16_bc32(a + 8));
    i1 = _mm512_dpbusd_epi32(i1, W[6], x16_bc32(a + 24));
    i0 = _mm512_dpbusd_epi32(i0, W[3], x16_bc32(a + 12));
    i1 = _mm512_dpbusd_epi32(i1, W[7], x16_bc32(a + 28));
    const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1));
    return _mm512_fmadd_ps(f, _mm512_mul_ps(dw, _mm512_set1_ps(ad[b])), acc);
}

/* Bytes ahead of the read that the one-token decode requests, two blocks at a time.  Chosen when
 * the decode walked four groups side by side; in one stream they change nothing measurable on the
 * Zen 4 VM and are kept for prefetchers that follow a stream less far (docs/design-measurements.md). */
#define X16_DPF 1152

/* One token: groups covering rows [r0, r1), activation row xq read in place.  The groups lie one
 * after another in memory, so a thread's rows are one sequential read, and the decode walks them
 * in that order, one group at a time: the hardware prefetcher follows one long stream, where a
 * walk of several groups side by side starts that many new streams every few KiB and waits on
 * each one's first lines (rows of 2048 values: 0.75 of a streaming read against 0.94,
 * docs/performance.md).  Two accumulators per group, even and odd blocks. */
XFN void x16_decode(const char *w, size_t wrb, int64_t n, const void *xq, float *y, int64_t r0, int64_t r1, const int q8,
                    const int l2)
{
    const int64_t nb = n / TP_QK;
    const int8_t *qs = TP_A8_QS(xq);
    const float *ad = TP_A8_D(xq, n);
    const int32_t *as = TP_A8_S(xq, n);
    const size_t bs = X16_BS(q8);
    const int64_t g0 = r0 / 16 * 16;
    const char *base = w + (size_t)(g0 / 16) * 16 * wrb;
    const size_t total = (size_t)((r1 - g0 + 15) / 16) * 16 * wrb; /* the bytes of rows [g0, r1) */
    for (size_t l = 0; l < X16_DPF && l < total; l += 64) TP_PREFETCH(base + l, l2);
    size_t o = 0; /* offset of the next block in the stream */
    for (int64_t g = g0; g < r1; g += 16) {
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2, o += 2 * bs) {
            if (o + X16_DPF + 2 * bs <= total)
                for (size_t l = 0; l < 2 * bs; l += 64) TP_PREFETCH(base + o + X16_DPF + l, l2);
            acc0 = x16_blk(base + o, qs, ad, as, b, acc0, q8);
            acc1 = x16_blk(base + o + bs, qs, ad, as, b + 1, acc1, q8);
        }
        if (b < nb) {
            acc0 = x16_blk(base + o, qs, ad, as, b, acc0, q8);
            o += bs;
        }
        _mm512_mask_storeu_ps(y + g, x16_keep(g, r0, r1), _mm512_add_ps(acc0, acc1));
    }
}

#define X16_SEED(t) __m512i i##t = T > t ? x16_bc32(p + TP_A8PACK_S + 4 * (t)) : _mm512_setzero_si512();
#define X16_DOT(t, j) \
    if (T > t) i##t = x16_dpb(i##t, W[j], p + (t) * TP_QK + 4 * (j));
#define X16_SLICE(j) \
    X16_DOT(0, j) X16_DOT(1, j) X16_DOT(2, j) X16_DOT(3, j) X16_DOT(4, j) X16_DOT(5, j) X16_DOT(6, j) X16_DOT(7, j)
#define X16_ACC(t) \
    if (T > t)     \
        acc##t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i##t), _mm512_mul_ps(dw, x16_bcf(p + TP_A8PACK_D + 4 * (t))), acc##t);

/* One pass: the group at gp (at the slab's first block) x T packed tokens over nbs blocks. */
XFN void x16_pass(const char *gp, const char *pk, int nbs, const int T, __m512 acc[X16_BT], const int q8, const int l2)
{
    __m512 acc0 = acc[0], acc1 = acc[1], acc2 = acc[2], acc3 = acc[3], acc4 = acc[4], acc5 = acc[5], acc6 = acc[6],
           acc7 = acc[7];
    for (int b = 0; b < nbs; b++) {
        const char *wp = gp + (size_t)b * X16_BS(q8);
        x16_prefetch(wp, q8, l2);
        __m512i W[8];
        const __m512 dw = x16_slices(wp, W, q8);
        const char *p = pk + (size_t)b * X16_PK;
        X16_SEED(0) X16_SEED(1) X16_SEED(2) X16_SEED(3) X16_SEED(4) X16_SEED(5) X16_SEED(6) X16_SEED(7)
        X16_SLICE(0) X16_SLICE(1) X16_SLICE(2) X16_SLICE(3) X16_SLICE(4) X16_SLICE(5) X16_SLICE(6) X16_SLICE(7)
        X16_ACC(0) X16_ACC(1) X16_ACC(2) X16_ACC(3) X16_ACC(4) X16_ACC(5) X16_ACC(6) X16_ACC(7)
    }
    acc[0] = acc0, acc[1] = acc1, acc[2] = acc2, acc[3] = acc3;
    acc[4] = acc4, acc[5] = acc5, acc[6] = acc6, acc[7] = acc7;
}

/* Sanitizer builds instantiate only the full-width pass (see kernels_x86_impl.h). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define X16_FEW_T 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define X16_FEW_T 1
#endif
#endif
#ifndef X16_FEW_T
#define X16_FEW_T 0
#endif

XFN void x16_batch(const char *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y, int64_t ys,
                   int64_t r0, int64_t r1, const int q8, const int l2)
{
    const int64_t nb = n / TP_QK;
    _Alignas(64) char pk[X16_SLAB_MAX * X16_PK]; /* 80 KiB */
    const int slab = n_tok <= X16_BT && nb <= X16_SLAB_MAX ? (int)nb : X16_SLAB;
    const int64_t ga = r0 / 16 * 16; /* first group */
    /* one slab and one pass (a decode step of up to 8 sequences): pack once for every chunk */
    const int once = slab == nb && n_tok <= X16_BT;
    if (once) tp_a8_pack(pk, xq, xrb, n, 0, (int)nb, n_tok, X16_FEW_T ? X16_BT : n_tok);
    for (int64_t c0 = ga; c0 < r1; c0 += X16_BROWS) {
        const int64_t c1 = r1 - c0 < X16_BROWS ? r1 : c0 + X16_BROWS;
        for (int64_t b0 = 0; b0 < nb; b0 += slab) {
            const int nbs = nb - b0 < slab ? (int)(nb - b0) : slab;
            for (int t0 = 0; t0 < n_tok; t0 += X16_BT) {
                const int T = n_tok - t0 < X16_BT ? n_tok - t0 : X16_BT;
                const int Tk = X16_FEW_T ? X16_BT : T;
                if (!once) tp_a8_pack(pk, (const char *)xq + (size_t)t0 * xrb, xrb, n, b0, nbs, T, Tk);
                for (int64_t g0 = c0; g0 < c1; g0 += 16) {
                    const __mmask16 keep = x16_keep(g0, r0, r1);
                    __m512 acc[X16_BT];
                    for (int t = 0; t < X16_BT; t++) acc[t] = _mm512_setzero_ps();
                    if (b0 > 0)
                        for (int t = 0; t < T; t++) acc[t] = _mm512_maskz_loadu_ps(keep, y + (int64_t)(t0 + t) * ys + g0);
                    const char *gp = w + (size_t)(g0 / 16) * 16 * wrb + (size_t)b0 * X16_BS(q8);
                    switch (Tk) {
#if !X16_FEW_T
                    case 1: x16_pass(gp, pk, nbs, 1, acc, q8, l2); break;
                    case 2: x16_pass(gp, pk, nbs, 2, acc, q8, l2); break;
                    case 3: x16_pass(gp, pk, nbs, 3, acc, q8, l2); break;
                    case 4: x16_pass(gp, pk, nbs, 4, acc, q8, l2); break;
                    case 5: x16_pass(gp, pk, nbs, 5, acc, q8, l2); break;
                    case 6: x16_pass(gp, pk, nbs, 6, acc, q8, l2); break;
                    case 7: x16_pass(gp, pk, nbs, 7, acc, q8, l2); break;
#endif
                    default: x16_pass(gp, pk, nbs, X16_BT, acc, q8, l2); break;
                    }
                    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + (int64_t)(t0 + t) * ys + g0, keep, acc[t]);
                }
            }
        }
    }
}
_Static_assert(X16_BT == 8 && X16_BT == TP_A8PACK_BT, "x16_batch's switch assumes 8 tokens per pass");

/* Decode or batch of one type (q8: 0 Q4_0, 1 Q8_0) at one prefetch level. */
XFN void x16_matmul_at(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,
                       int64_t ys, int64_t r0, int64_t r1, const int q8, const int l2)
{
    if (n_tok == 1)
        x16_decode(w, wrb, n, xq, y, r0, r1, q8, l2);
    else
        x16_batch(w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1, q8, l2);
}

/* The matmul entry of one type: the prefetch level (tp_kern_prefetch) a constant in each copy. */
#define X16_ENTRY(name, q8)                                                                                     \
    XOUT void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,       \
                   int64_t ys, int64_t r0, int64_t r1)                                                          \
    {                                                                                                           \
        if (tp_kern_prefetch() == TP_KERN_PF_L2)                                                                \
            x16_matmul_at(w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1, q8, 1);                                     \
        else                                                                                                    \
            x16_matmul_at(w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1, q8, 0);                                     \
    }
X16_ENTRY(x16_matmul_q4_0, 0)
X16_ENTRY(x16_matmul_q8_0, 1)
X16_ENTRY(x16_matmul_mxfp4, X16_MX)

void tp_kern_x16_avx512_ops(struct tp_kern_ops *ops)
{
    ops->matmul_q4_0_x16 = x16_matmul_q4_0;
    ops->matmul_q8_0_x16 = x16_matmul_q8_0;
    ops->matmul_mxfp4_x16 = x16_matmul_mxfp4;
}
#else
typedef int tp_kernels_x16_avx512_unused; /* ISO C forbids an empty translation unit */
#endif

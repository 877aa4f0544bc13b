/*
 * model/kernels/kernels_kx16_avx512.c - AVX-512 VNNI matmul for Q4_K, Q5_K and Q6_K
 * weights in the 16-row "x16" layouts (kernels_impl.h): lane L of a zmm holds
 * row L of a 16-row group, so a 64-byte load gives 4 bytes of each of the 16
 * rows and one vpdpbusd does 64 multiply-adds with no byte gathering, exactly
 * as the Q4_0 / Q8_0 x16 kernels do.  Per 16-row super-block:
 *  - the 16 rows' 6-bit scales and mins (Q4_K / Q5_K: three 64-byte loads of
 *    the packed 12-byte fields) or int8 scales (Q6_K) are unpacked with a few
 *    lane-wise ops, once for every token of the pass;
 *  - each 32-value (Q4_K / Q5_K) or 16-value (Q6_K) sub-block is an exact
 *    integer dot per lane (vpdpbusd: unsigned 4/5/6-bit weights x int8
 *    activations, the activation bytes an embedded broadcast), converted to
 *    float and multiplied by its scale, the super-block's d applied once;
 *  - a weight chunk feeds every sub-block that uses it while its dots fit
 *    the registers (kx_sb_q45, kx_sb_q6: each chunk loaded and split once
 *    per super-block in decode);
 *  - the mins (Q4_K / Q5_K) or the -32 offset (Q6_K) come from the
 *    activation's pair sums (kernels_impl.h, prepared once per step) with
 *    four or eight vpdpwssd against the scales taken as i16 pairs;
 *  - one fma per token by the activation's d, into per-token sums kept in
 *    memory (kx_acc), so the sub-block loops do not spill.
 * Up to 8 tokens share each unpacked slice (prefill and batched decode); the
 * rows go in chunks of KX_BROWS so their weights stay in L2 while passes of 8
 * tokens reuse them.  Results equal the scalar reference up to float rounding
 * (the sub-block terms are summed in float here, in integer there).
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <string.h>

#include "kernels/kernels_impl.h"

#define XT "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define XFN static inline __attribute__((always_inline, target(XT)))
#define XOUT static __attribute__((target(XT)))

enum { KX_Q4K, KX_Q5K, KX_Q6K };
#define KX_BT 8       /* tokens per pass */
#define KX_BROWS 128  /* rows per chunk (weights reused from L2 by every pass) */
#define KX_PF 6144    /* software prefetch distance of a group's stream in the batch pass (bytes) */

/* Sanitizer builds instantiate only the full-width pass (as kernels_x16_avx512.c). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define KX_FEW_T 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define KX_FEW_T 1
#endif
#endif
#ifndef KX_FEW_T
#define KX_FEW_T 0
#endif

XFN __m512i kx_bc32(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/* acc + vpdpbusd(w, the 4 bytes at base + off broadcast): the embedded-broadcast form (see
 * kernels_x16_avx512.c).  With GCC optimizing, off (a constant once the loops are unrolled) is the
 * instruction's displacement from the one base register: given the address alone, GCC kept each of
 * a super-block's 64 addresses in a register of its own and spilled most of them, one reload per
 * vpdpbusd. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__) && !defined(X16_NO_ASM)
#define kx_dpb(acc, w, base, off) kx_dpb_i(acc, w, base, off)
XFN __m512i kx_dpb_i(__m512i acc, __m512i w, const int8_t *base, const int off)
{
    __asm__("vpdpbusd %c3(%2)%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "r"(base), "i"(off),
            "m"(*(const int8_t(*)[TP_QK_K])base)); /* what the instruction reads: the block's 256 values */
    return acc;
}
#else
XFN __m512i kx_dpb(__m512i acc, __m512i w, const int8_t *base, const int off)
{
    return _mm512_dpbusd_epi32(acc, w, kx_bc32(base + off));
}
#endif

XFN __m512i kx_ld(const char *p) { return _mm512_loadu_si512(p); }

/* The gbs bytes at p requested into L1, or into L2 where l2 (tp_kern_prefetch in kernels.h says which). */
XFN void kx_prefetch(const char *p, const size_t gbs, const int l2)
{
    for (size_t o = 0; o < gbs; o += 64) TP_PREFETCH(p + o, l2);
}

/* Bytes of one 16-row super-block. */
XFN size_t kx_gbs(const int type)
{
    return 16 * (type == KX_Q6K ? sizeof(tp_blk_q6_k) : type == KX_Q5K ? sizeof(tp_blk_q5_k) : sizeof(tp_blk_q4_k));
}

/* Offset of Q4_K / Q5_K qs chunk k in a super-block (kernels_impl.h). */
XFN size_t kx_qs(const int type, const int k)
{
    return type == KX_Q5K ? tp_kx_q5k_qs(k) : TP_KX_Q4K_QS + 64 * (size_t)k;
}

/* Byte j&3 of each dword of s as an i32 (unsigned), as a float. */
XFN __m512 kx_byte_u(__m512i s, int j)
{
    const __m512i v = (j & 3) == 3 ? _mm512_srli_epi32(s, 24) : _mm512_and_si512(_mm512_srli_epi32(s, 8 * (j & 3)), _mm512_set1_epi32(0xFF));
    return _mm512_cvtepi32_ps(v);
}

/* Byte j&3 of each dword of s sign-extended, as a float. */
XFN __m512 kx_byte_s(__m512i s, int j)
{
    const __m512i v = (j & 3) == 3 ? _mm512_srai_epi32(s, 24) : _mm512_srai_epi32(_mm512_slli_epi32(s, 24 - 8 * (j & 3)), 24);
    return _mm512_cvtepi32_ps(v);
}

/* p as a value the compiler cannot follow back to the loop counter, so that the decode addresses
 * every activation slice from it (a base register and a displacement) instead of deriving an
 * induction variable per slice. */
#if defined(__GNUC__)
#define KX_OPAQUE(p) __asm__("" : "+r"(p))
#else
#define KX_OPAQUE(p) ((void)0)
#endif

/* Tokens' Q8_K block i and pair sums (token t's row at x + xo[t]). */
#define KX_TOKENS(Tk)                                                                                           \
    const tp_blk_q8_k *a[KX_BT];                                                                                \
    const int16_t *pr[KX_BT];                                                                                   \
    KX_UNROLL                                                                                                   \
    for (int t = 0; t < (Tk); t++) {                                                                            \
        a[t] = (const tp_blk_q8_k *)(x + xo[t]) + i;                                                            \
        pr[t] = TP_Q8K_PAIR(x + xo[t], nb * TP_QK_K, i);                                                        \
    }

/* acc[t] (16 floats in memory, token t) += fs[t] * (f x token t's d): the per-token accumulators
 * live in memory (one load-fma-store per token per super-block) so that the sub-block loops keep
 * their integer dots, float sums and decoded slices in registers without spilling. */
XFN void kx_acc(const int Tk, float *acc, const __m512 fs[KX_BT], const tp_blk_q8_k *const a[KX_BT], __m512 f)
{
    KX_UNROLL
    for (int t = 0; t < Tk; t++) {
        const __m512 s = _mm512_mul_ps(f, _mm512_set1_ps(a[t]->d));
        _mm512_store_ps(acc + 16 * t, _mm512_fmadd_ps(fs[t], s, _mm512_load_ps(acc + 16 * t)));
    }
}

/* Sub-block j's values in qs chunk z (its low nibbles for even j, high for odd), with Q5_K's 5th bit
 * from qh chunk h (bit j of each byte) as bit 4. */
XFN __m512i kx_q45_vals(const int type, __m512i z, __m512i h, const int j)
{
    const __m512i mF = _mm512_set1_epi8(0x0F);
    const __m512i b = (j & 1) ? _mm512_srli_epi16(z, 4) : z;
    if (type != KX_Q5K) return _mm512_and_si512(b, mF);
    const __m512i hs = j < 4 ? _mm512_slli_epi16(h, 4 - j) : j == 4 ? h : _mm512_srli_epi16(h, j - 4);
    return _mm512_ternarylogic_epi32(b, mF, _mm512_and_si512(hs, _mm512_set1_epi8(0x10)), 0xEA);
}

/* Super-block p's 6-bit scales (ggml's get_scale_min_k4), lane L = row L: sub-blocks 0..3 in the
 * bytes of *lo, 4..7 in those of *hi. */
XFN void kx_q45_scales(const char *p, __m512i *lo, __m512i *hi)
{
    const __m512i mF = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), m3f = _mm512_set1_epi8(0x3F);
    const __m512i U0 = kx_ld(p + TP_KX_Q4K_SC), U2 = kx_ld(p + TP_KX_Q4K_SC + 128);
    *lo = _mm512_and_si512(U0, m3f);
    *hi = _mm512_ternarylogic_epi32(U2, mF, _mm512_and_si512(_mm512_srli_epi32(U0, 2), m30), 0xEA);
}

/* Super-block p's 6-bit mins as i16 pairs for vpdpwssd against the activation's pair sums:
 * mp[0..3] = (m0, m2), (m1, m3), (m4, m6), (m5, m7) per 32-bit lane (pair sums at pr, pr + 2, + 4, + 6). */
XFN void kx_q45_min_pairs(const char *p, __m512i mp[4])
{
    const __m512i mF = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), m3f = _mm512_set1_epi8(0x3F);
    const __m512i U1 = kx_ld(p + TP_KX_Q4K_SC + 64), U2 = kx_ld(p + TP_KX_Q4K_SC + 128);
    const __m512i mnlo = _mm512_and_si512(U1, m3f);
    const __m512i mnhi =
        _mm512_ternarylogic_epi32(_mm512_srli_epi32(U2, 4), mF, _mm512_and_si512(_mm512_srli_epi32(U1, 2), m30), 0xEA);
    const __m512i lo16 = _mm512_set1_epi32(0x00FF00FF);
    mp[0] = _mm512_and_si512(mnlo, lo16);
    mp[1] = _mm512_srli_epi16(mnlo, 8);
    mp[2] = _mm512_and_si512(mnhi, lo16);
    mp[3] = _mm512_srli_epi16(mnhi, 8);
}

/* Q4_K / Q5_K super-block i (p: its 16-row super-block) x Tk tokens into acc (kx_acc).
 * Up to 4 tokens the two sub-blocks of a 64-value span (low and high nibbles of the same
 * eight chunks) are computed together, so each qs chunk (and Q5_K's qh chunk) is loaded
 * and split once per pair; 5..8 tokens take one sub-block at a time (16 live dots at most).
 * The sub-block sums are scaled by the integer scales, d and the mins term applied once. */
XFN void kx_sb_q45(const int type, const int Tk, const char *p, const char *x, const size_t *xo, int64_t nb,
                   int64_t i, float *acc)
{
    KX_TOKENS(Tk)
    __m512i sclo, schi;
    kx_q45_scales(p, &sclo, &schi);
    const int NJ = Tk <= 4 ? 2 : 1; /* sub-blocks per chunk load */
    __m512 fs[KX_BT];
    KX_UNROLL
    for (int t = 0; t < Tk; t++) fs[t] = _mm512_setzero_ps();
    KX_UNROLL
    for (int k = 0; k < 8; k++) { /* 32-value sub-block j: chunks 8(j/2)..+7, low (even j) or high nibbles */
        if (k >= 8 / NJ) break;   /* constant bounds, so the loops unroll */
        const int j0 = k * NJ;
        __m512i D[2][KX_BT];
        KX_UNROLL
        for (int u = 0; u < 2; u++)
            KX_UNROLL
            for (int t = 0; t < Tk; t++) D[u][t] = _mm512_setzero_si512();
        KX_UNROLL
        for (int m = 0; m < 8; m++) {
            const __m512i z = kx_ld(p + kx_qs(type, 8 * (j0 >> 1) + m));
            const __m512i h = type == KX_Q5K ? kx_ld(p + tp_kx_q5k_qh(m)) : z;
            KX_UNROLL
            for (int u = 0; u < 2; u++) {
                if (u >= NJ) break;
                const int j = j0 + u;
                const __m512i v = kx_q45_vals(type, z, h, j);
                KX_UNROLL
                for (int t = 0; t < Tk; t++) D[u][t] = kx_dpb(D[u][t], v, a[t]->qs, 32 * j + 4 * m);
            }
        }
        KX_UNROLL
        for (int u = 0; u < 2; u++) {
            if (u >= NJ) break;
            const int j = j0 + u;
            const __m512 sc = kx_byte_u(j < 4 ? sclo : schi, j);
            KX_UNROLL
            for (int t = 0; t < Tk; t++) fs[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D[u][t]), sc, fs[t]);
        }
    }
    /* fs = d * sum_j sc_j dot_j - dmin * sum_j m_j a_j, the mins as i16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7) */
    const __m512 DL = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    const __m512 DM = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + TP_KX_Q4K_DMIN)));
    __m512i mp[4];
    kx_q45_min_pairs(p, mp);
    KX_UNROLL
    for (int t = 0; t < Tk; t++) {
        __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[0], kx_bc32(pr[t]));
        s = _mm512_dpwssd_epi32(s, mp[1], kx_bc32(pr[t] + 2));
        s = _mm512_dpwssd_epi32(s, mp[2], kx_bc32(pr[t] + 4));
        s = _mm512_dpwssd_epi32(s, mp[3], kx_bc32(pr[t] + 6));
        fs[t] = _mm512_fmsub_ps(fs[t], DL, _mm512_mul_ps(_mm512_cvtepi32_ps(s), DM));
    }
    kx_acc(Tk, acc, fs, a, _mm512_set1_ps(1.0f));
}

/* Q6_K super-block i x Tk tokens into acc (kx_acc).  Per half h and 16-value position b, the
 * four 2-bit planes of a qh chunk and the two nibbles of two ql chunks are the values of the
 * four quarters' sub-blocks 8h + 2q + b (q = 0..3).  Up to 2 tokens the four quarters are
 * computed together, so each qh and ql chunk is loaded and split once per super-block; 3..4
 * tokens take them in pairs (q, q + 2) sharing a ql chunk, 5..8 tokens one at a time, which
 * keeps the live dots at 8 and measured faster than pairs that spill (docs/performance.md).
 * The high bits come from X = qh & 0x33 (quarters 0, 2) or (qh >> 2) & 0x33 (1, 3): X << 4
 * has the low pair at bits 4-5 and zero at 6-7, X itself the high pair; a bit select
 * (vpternlogd) takes bits 0-3 from the ql nibble and 4-7 from that. */
XFN void kx_sb_q6(const int Tk, const char *p, const char *x, const size_t *xo, int64_t nb, int64_t i, float *acc)
{
    KX_TOKENS(Tk)
    const __m512i mF = _mm512_set1_epi8(0x0F), m33 = _mm512_set1_epi8(0x33);
    const char *sc = p + TP_KX_Q6K_SC;
    /* quarters per pass: 4 (each qh / ql chunk loaded once), 2 (pairs q, q + 2 sharing a ql chunk) or 1 */
    const int NQ = Tk <= 2 ? 4 : Tk <= 4 ? 2 : 1;
    __m512 fs[KX_BT];
    KX_UNROLL
    for (int t = 0; t < Tk; t++) fs[t] = _mm512_setzero_ps();
    KX_UNROLL
    for (int h = 0; h < 2; h++) {
        KX_UNROLL
        for (int b = 0; b < 2; b++) {
            KX_UNROLL
            for (int g = 0; g < 4; g++) {
                if (g >= 4 / NQ) break;
                /* quarter q is in this pass: NQ 4 all, NQ 2 q & 1 == g, NQ 1 q == g */
#define KX_Q6_IN(q) (NQ == 4 || (NQ == 2 ? ((q) & 1) == g : (q) == g))
                __m512i D[4][KX_BT]; /* [quarter][token] */
                KX_UNROLL
                for (int q = 0; q < 4; q++)
                    KX_UNROLL
                    for (int t = 0; t < Tk; t++) D[q][t] = _mm512_setzero_si512();
                KX_UNROLL
                for (int s = 0; s < 4; s++) {
                    const __m512i H = kx_ld(p + tp_kx_q6k_qh(8 * h + 4 * b + s));
                    /* a pass of fewer than four quarters reads one of the triplet's two ql chunks: the
                     * first (g = 0) requests the other into L1, so that the triplets' lines are first
                     * read in memory order (the 5-8 token pass 11% faster from memory, performance.md) */
                    if (NQ < 4 && g == 0) TP_PREFETCH(p + tp_kx_q6k_ql(16 * h + 8 + 4 * b + s), 0);
                    KX_UNROLL
                    for (int pq = 0; pq < 2; pq++) {
                        if (!KX_Q6_IN(pq) && !KX_Q6_IN(pq + 2)) continue;
                        const __m512i L = kx_ld(p + tp_kx_q6k_ql(16 * h + 8 * pq + 4 * b + s));
                        const __m512i X = _mm512_and_si512(pq ? _mm512_srli_epi16(H, 2) : H, m33);
                        const int jlo = 8 * h + 2 * pq + b, jhi = jlo + 4;
                        if (KX_Q6_IN(pq)) {
                            const __m512i vlo = _mm512_ternarylogic_epi32(L, _mm512_slli_epi16(X, 4), mF, 0xE4);
                            KX_UNROLL
                            for (int t = 0; t < Tk; t++) D[pq][t] = kx_dpb(D[pq][t], vlo, a[t]->qs, 16 * jlo + 4 * s);
                        }
                        if (KX_Q6_IN(pq + 2)) {
                            const __m512i vhi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(L, 4), X, mF, 0xE4);
                            KX_UNROLL
                            for (int t = 0; t < Tk; t++)
                                D[pq + 2][t] = kx_dpb(D[pq + 2][t], vhi, a[t]->qs, 16 * jhi + 4 * s);
                        }
                    }
                }
                KX_UNROLL
                for (int q = 0; q < 4; q++) {
                    if (!KX_Q6_IN(q)) continue;
                    const int j = 8 * h + 2 * q + b;
                    const __m512 scf = kx_byte_s(kx_ld(sc + 64 * (j >> 2)), j);
                    KX_UNROLL
                    for (int t = 0; t < Tk; t++) fs[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D[q][t]), scf, fs[t]);
                }
#undef KX_Q6_IN
            }
        }
    }
    /* -32 * sum_j sc_j * bsum_j with the scales as i16 pairs (s4m, s4m+2), (s4m+1, s4m+3) */
    __m512i ev[4], od[4];
    KX_UNROLL
    for (int m = 0; m < 4; m++) {
        const __m512i s = kx_ld(sc + 64 * m);
        ev[m] = _mm512_srai_epi16(_mm512_slli_epi16(s, 8), 8);
        od[m] = _mm512_srai_epi16(s, 8);
    }
    KX_UNROLL
    for (int t = 0; t < Tk; t++) {
        __m512i s = _mm512_setzero_si512();
        KX_UNROLL
        for (int m = 0; m < 4; m++) {
            s = _mm512_dpwssd_epi32(s, ev[m], kx_bc32(pr[t] + 8 + 4 * m));
            s = _mm512_dpwssd_epi32(s, od[m], kx_bc32(pr[t] + 8 + 4 * m + 2));
        }
        fs[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(32.0f), fs[t]);
    }
    kx_acc(Tk, acc, fs, a, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)));
}

/* Lanes [lo, hi) of a group's 16 outputs. */
XFN __mmask16 kx_keep(int64_t g0, int64_t r0, int64_t r1)
{
    const int lo = r0 > g0 ? (int)(r0 - g0) : 0;
    const int hi = r1 - g0 < 16 ? (int)(r1 - g0) : 16;
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* One group (at gp) x Tk tokens over every super-block; outputs of tokens < T stored. */
XFN void kx_group(const int type, const int Tk, const char *gp, int64_t nb, const char *x, const size_t *xo, int T,
                  float *y, int64_t ys, int64_t g0, __mmask16 keep, const int l2)
{
    _Alignas(64) float acc[KX_BT * 16]; /* token t's 16 outputs at 16 t */
    for (int t = 0; t < Tk; t++) _mm512_store_ps(acc + 16 * t, _mm512_setzero_ps());
    const size_t gbs = kx_gbs(type);
    for (int64_t i = 0; i < nb; i++) {
        const char *p = gp + (size_t)i * gbs;
        kx_prefetch(p + KX_PF, gbs, l2);
        if (type == KX_Q6K)
            kx_sb_q6(Tk, p, x, xo, nb, i, acc);
        else
            kx_sb_q45(type, Tk, p, x, xo, nb, i, acc);
    }
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + (int64_t)t * ys + g0, keep, _mm512_load_ps(acc + 16 * t));
}

/* Groups a Q5_K decode pass reads side by side (that many weight streams), and the super-blocks ahead
 * of a stream that a Q5_K decode requests while it computes the current one: one into L1, two into L2
 * (the prefetch level: tp_kern_prefetch).  Across several streams the hardware prefetcher alone
 * kept too few misses in flight (docs/performance.md: on a Zen 4 VM Q4_K read 0.63-0.69 of a streaming
 * read prefetched two ahead into L2, 0.55-0.59 one ahead into L2, 0.45-0.47 one ahead into L1).  The
 * requests run on past the end of a pass into the next pass's streams (tp_x16_ahead): a row of 2048
 * values is 8 super-blocks, and starting each pass on two unrequested ones cost 8-22% of the rate. */
#define KX_STREAMS 4
#define KX_DPF(l2) ((l2) ? 2 : 1) /* super-blocks ahead */

/* Decode (one token) of a Q4_K / Q5_K super-block p against activation block a (pair sums pr): the
 * 16 rows' dot before the token's d.  Each sub-block's dot is split over two accumulators (even and
 * odd chunks), so four vpdpbusd chains interleave within a chunk run where kx_sb_q45's single chain
 * per sub-block waits on each instruction's latency; the scale and min terms are summed in two
 * chains each, and the caller keeps the sums in registers (no per-super-block store). */
XFN __m512 kx_dec_q45(const int type, const char *p, const tp_blk_q8_k *a, const int16_t *pr)
{
    __m512i D[8];
    KX_UNROLL
    for (int k = 0; k < 4; k++) { /* sub-blocks 2k (low nibbles) and 2k + 1 (high) of chunks 8k..8k + 7 */
        __m512i E[2][2]; /* [u][m & 1] */
        KX_UNROLL
        for (int u = 0; u < 2; u++) E[u][0] = E[u][1] = _mm512_setzero_si512();
        KX_UNROLL
        for (int m = 0; m < 8; m++) {
            const __m512i z = kx_ld(p + kx_qs(type, 8 * k + m));
            const __m512i h = type == KX_Q5K ? kx_ld(p + tp_kx_q5k_qh(m)) : z;
            KX_UNROLL
            for (int u = 0; u < 2; u++) {
                const int j = 2 * k + u;
                const __m512i v = kx_q45_vals(type, z, h, j);
                E[u][m & 1] = kx_dpb(E[u][m & 1], v, a->qs, 32 * j + 4 * m);
            }
        }
        KX_UNROLL
        for (int u = 0; u < 2; u++) D[2 * k + u] = _mm512_add_epi32(E[u][0], E[u][1]);
    }
    __m512i sclo, schi;
    kx_q45_scales(p, &sclo, &schi);
    __m512 f[2];
    KX_UNROLL
    for (int u = 0; u < 2; u++) f[u] = _mm512_mul_ps(_mm512_cvtepi32_ps(D[u]), kx_byte_u(sclo, u));
    KX_UNROLL
    for (int j = 2; j < 8; j++)
        f[j & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D[j]), kx_byte_u(j < 4 ? sclo : schi, j), f[j & 1]);
    /* the mins against the pair sums, in two chains */
    __m512i mp[4];
    kx_q45_min_pairs(p, mp);
    __m512i s0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[0], kx_bc32(pr));
    __m512i s1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[1], kx_bc32(pr + 2));
    s0 = _mm512_dpwssd_epi32(s0, mp[2], kx_bc32(pr + 4));
    s1 = _mm512_dpwssd_epi32(s1, mp[3], kx_bc32(pr + 6));
    const __m512 DL = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    const __m512 DM = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + TP_KX_Q4K_DMIN)));
    return _mm512_fmsub_ps(_mm512_add_ps(f[0], f[1]), DL, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), DM));
}

/* Decode of a Q6_K super-block (as kx_sb_q6 with one token): per half h the eight sub-blocks
 * 8h + 2q + b have their own accumulators, and their qh / ql triplets are walked in memory order
 * (b, then chunk s: kernels_impl.h), so the super-block is read front to back while eight
 * independent vpdpbusd chains interleave; the scale terms are summed in four chains. */
XFN __m512 kx_dec_q6(const char *p, const tp_blk_q8_k *a, const int16_t *pr)
{
    const __m512i mF = _mm512_set1_epi8(0x0F), m33 = _mm512_set1_epi8(0x33);
    const char *sc = p + TP_KX_Q6K_SC;
    __m512 f[4];
    KX_UNROLL
    for (int u = 0; u < 4; u++) f[u] = _mm512_setzero_ps();
    KX_UNROLL
    for (int h = 0; h < 2; h++) {
        __m512i D[2][4]; /* [b][quarter q]: sub-block 8h + 2q + b */
        KX_UNROLL
        for (int b = 0; b < 2; b++)
            KX_UNROLL
            for (int q = 0; q < 4; q++) D[b][q] = _mm512_setzero_si512();
        KX_UNROLL
        for (int b = 0; b < 2; b++)
            KX_UNROLL
            for (int s = 0; s < 4; s++) {
                const __m512i H = kx_ld(p + tp_kx_q6k_qh(8 * h + 4 * b + s));
                KX_UNROLL
                for (int pq = 0; pq < 2; pq++) {
                    const __m512i L = kx_ld(p + tp_kx_q6k_ql(16 * h + 8 * pq + 4 * b + s));
                    const __m512i X = _mm512_and_si512(pq ? _mm512_srli_epi16(H, 2) : H, m33);
                    const int jlo = 8 * h + 2 * pq + b, jhi = jlo + 4;
                    const __m512i vlo = _mm512_ternarylogic_epi32(L, _mm512_slli_epi16(X, 4), mF, 0xE4);
                    const __m512i vhi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(L, 4), X, mF, 0xE4);
                    D[b][pq] = kx_dpb(D[b][pq], vlo, a->qs, 16 * jlo + 4 * s);
                    D[b][pq + 2] = kx_dpb(D[b][pq + 2], vhi, a->qs, 16 * jhi + 4 * s);
                }
            }
        KX_UNROLL
        for (int b = 0; b < 2; b++)
            KX_UNROLL
            for (int q = 0; q < 4; q++) {
                const int j = 8 * h + 2 * q + b;
                const __m512 scf = kx_byte_s(kx_ld(sc + 64 * (j >> 2)), j);
                f[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D[b][q]), scf, f[q]);
            }
    }
    /* -32 * sum_j sc_j * bsum_j with the scales as i16 pairs (s4m, s4m+2), (s4m+1, s4m+3) */
    __m512i e = _mm512_setzero_si512(), o = _mm512_setzero_si512();
    KX_UNROLL
    for (int m = 0; m < 4; m++) {
        const __m512i s = kx_ld(sc + 64 * m);
        e = _mm512_dpwssd_epi32(e, _mm512_srai_epi16(_mm512_slli_epi16(s, 8), 8), kx_bc32(pr + 8 + 4 * m));
        o = _mm512_dpwssd_epi32(o, _mm512_srai_epi16(s, 8), kx_bc32(pr + 8 + 4 * m + 2));
    }
    const __m512 fs = _mm512_add_ps(_mm512_add_ps(f[0], f[1]), _mm512_add_ps(f[2], f[3]));
    const __m512 r = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(e, o)), _mm512_set1_ps(32.0f), fs);
    return _mm512_mul_ps(r, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)));
}

/* Q5_K, one token, S groups at once from g0: each group's 16 sums in a register.  Each stream's
 * super-block KX_DPF ahead is requested, past the row's end in the next pass's Sn groups
 * (tp_x16_ahead). */
XFN void kx_decode_groups(const int type, const char *w, size_t wrb, int64_t nb, const char *x, float *y, int64_t g0,
                          int64_t r0, int64_t r1, const int S, const int Sn, const int l2)
{
    const int64_t ahead = KX_DPF(l2);
    __m512 acc[KX_STREAMS];
    const char *gp = w + (size_t)(g0 / 16) * 16 * wrb;
    const char *gn = gp + (size_t)S * 16 * wrb;
    const size_t gbs = kx_gbs(type);
    for (int k = 0; k < S; k++) acc[k] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const tp_blk_q8_k *a = (const tp_blk_q8_k *)x + i;
        const int16_t *pr = TP_Q8K_PAIR(x, nb * TP_QK_K, i);
        KX_OPAQUE(a);
        for (int k = 0; k < S; k++) {
            const char *p = gp + (size_t)k * 16 * wrb + (size_t)i * gbs;
            const char *q = tp_x16_ahead(gp, gn, k, Sn, wrb, (size_t)nb * gbs, (size_t)(i + ahead) * gbs);
            if (q) kx_prefetch(q, gbs, l2);
            acc[k] = _mm512_fmadd_ps(kx_dec_q45(type, p, a, pr), _mm512_set1_ps(a->d), acc[k]);
        }
    }
    for (int k = 0; k < S; k++) _mm512_mask_storeu_ps(y + g0 + 16 * k, kx_keep(g0 + 16 * k, r0, r1), acc[k]);
}

/* Q4_K and Q6_K, one token: rows [r0, r1), each group's 16 sums in a register.  The groups lie one
 * after another in memory, so a thread's rows are one sequential read of super-blocks; this walks
 * them in that order, one group at a time, each super-block front to back, so that the hardware
 * prefetcher follows one stream and keeps ahead of it alone (against KX_STREAMS groups side by side,
 * docs/performance.md: Q4_K 1.05-1.35x, Q6_K 1.13-1.28x from memory; Q6_K's requests two
 * super-blocks ahead, which its old layout needed, cost it 0.69 against 0.94 of a one-thread read
 * once its triplets were in read order, docs/design-measurements.md). */
XFN void kx_decode_stream(const int type, const char *w, size_t wrb, int64_t nb, const char *x, float *y, int64_t r0,
                          int64_t r1)
{
    const int64_t g0 = r0 / 16 * 16;
    const size_t gbs = kx_gbs(type);
    const char *base = w + (size_t)(g0 / 16) * 16 * wrb;
    int64_t s = 0; /* super-block of the stream */
    for (int64_t g = g0; g < r1; g += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < nb; i++, s++) {
            const tp_blk_q8_k *a = (const tp_blk_q8_k *)x + i;
            const int16_t *pr = TP_Q8K_PAIR(x, nb * TP_QK_K, i);
            KX_OPAQUE(a);
            const char *p = base + (size_t)s * gbs;
            const __m512 v = type == KX_Q6K ? kx_dec_q6(p, a, pr) : kx_dec_q45(type, p, a, pr);
            acc = _mm512_fmadd_ps(v, _mm512_set1_ps(a->d), acc);
        }
        _mm512_mask_storeu_ps(y + g, kx_keep(g, r0, r1), acc);
    }
}

/* One token: rows [r0, r1).  Q5_K, which measured slower or alike in one stream (0.52-0.64x without
 * requests, 0.94-1.12x with them spread): KX_STREAMS groups at a time, the rest together; the first
 * pass's first super-blocks are requested together before it starts (the later ones run ahead of it).
 * Q4_K and Q6_K: kx_decode_stream. */
XFN void kx_decode(const int type, const char *w, size_t wrb, int64_t nb, const char *x, float *y, int64_t r0,
                   int64_t r1, const int l2)
{
    if (type != KX_Q5K) {
        kx_decode_stream(type, w, wrb, nb, x, y, r0, r1);
        return;
    }
    int64_t g0 = r0 / 16 * 16;
    const size_t gbs = kx_gbs(type);
    const char *gp = w + (size_t)(g0 / 16) * 16 * wrb;
    for (int k = 0; k < tp_x16_pass_groups(g0, r1, KX_STREAMS); k++)
        for (int64_t j = 0; j < KX_DPF(l2) && j < nb; j++)
            kx_prefetch(gp + (size_t)k * 16 * wrb + (size_t)j * gbs, gbs, l2);
    while (g0 < r1) {
        const int S = tp_x16_pass_groups(g0, r1, KX_STREAMS);
        const int Sn = tp_x16_pass_groups(g0 + 16 * S, r1, KX_STREAMS);
        switch (S) {
#if KX_STREAMS > 3
        case 3: kx_decode_groups(type, w, wrb, nb, x, y, g0, r0, r1, 3, Sn, l2); break;
#endif
#if KX_STREAMS > 2
        case 2: kx_decode_groups(type, w, wrb, nb, x, y, g0, r0, r1, 2, Sn, l2); break;
#endif
        case 1: kx_decode_groups(type, w, wrb, nb, x, y, g0, r0, r1, 1, Sn, l2); break;
        default: kx_decode_groups(type, w, wrb, nb, x, y, g0, r0, r1, KX_STREAMS, Sn, l2); break;
        }
        g0 += 16 * S;
    }
}

XFN void kx_matmul_at(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                      float *y, int64_t ys, int64_t r0, int64_t r1, const int l2)
{
    const int64_t nb = n / TP_QK_K;
    if (n_tok == 1) {
        kx_decode(type, (const char *)w, wrb, nb, (const char *)xq, y, r0, r1, l2);
        return;
    }
    for (int64_t c0 = r0 / 16 * 16; c0 < r1; c0 += KX_BROWS) {
        const int64_t c1 = r1 - c0 < KX_BROWS ? r1 : c0 + KX_BROWS;
        for (int t0 = 0; t0 < n_tok; t0 += KX_BT) {
            const int T = n_tok - t0 < KX_BT ? n_tok - t0 : KX_BT;
            const int Tk = KX_FEW_T ? KX_BT : T;
            const char *x = (const char *)xq + (size_t)t0 * xrb;
            size_t xo[KX_BT]; /* tokens past T (a padded pass) read token T-1 and are not stored */
            for (int t = 0; t < KX_BT; t++) xo[t] = (size_t)(t < T ? t : T - 1) * xrb;
            for (int64_t g0 = c0; g0 < c1; g0 += 16) {
                const __mmask16 keep = kx_keep(g0, r0, r1);
                const char *gp = (const char *)w + (size_t)(g0 / 16) * 16 * wrb;
                float *yt = y + (int64_t)t0 * ys;
                switch (Tk) {
#if !KX_FEW_T
                case 1: kx_group(type, 1, gp, nb, x, xo, T, yt, ys, g0, keep, l2); break;
                case 2: kx_group(type, 2, gp, nb, x, xo, T, yt, ys, g0, keep, l2); break;
                case 3: kx_group(type, 3, gp, nb, x, xo, T, yt, ys, g0, keep, l2); break;
                case 4: kx_group(type, 4, gp, nb, x, xo, T, yt, ys, g0, keep, l2); break;
                case 5: kx_group(type, 5, gp, nb, x, xo, T, yt, ys, g0, keep, l2); break;
                case 6: kx_group(type, 6, gp, nb, x, xo, T, yt, ys, g0, keep, l2); break;
                case 7: kx_group(type, 7, gp, nb, x, xo, T, yt, ys, g0, keep, l2); break;
#endif
                default: kx_group(type, KX_BT, gp, nb, x, xo, T, yt, ys, g0, keep, l2); break;
                }
            }
        }
    }
}
_Static_assert(KX_BT == 8, "kx_matmul_at's switch assumes 8 tokens per pass");

/* The prefetch level (tp_kern_prefetch) a constant in each copy. */
XFN void kx_matmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                   float *y, int64_t ys, int64_t r0, int64_t r1)
{
    if (tp_kern_prefetch() == TP_KERN_PF_L2)
        kx_matmul_at(type, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1, 1);
    else
        kx_matmul_at(type, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1, 0);
}

#define KX_ENTRY(name, type)                                                                                    \
    XOUT void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,       \
                   int64_t ys, int64_t r0, int64_t r1)                                                          \
    {                                                                                                           \
        kx_matmul(type, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);                                              \
    }
KX_ENTRY(kx16_matmul_q4_k, KX_Q4K)
KX_ENTRY(kx16_matmul_q5_k, KX_Q5K)
KX_ENTRY(kx16_matmul_q6_k, KX_Q6K)

void tp_kern_kx16_avx512_ops(struct tp_kern_ops *ops)
{
    ops->matmul_kq_x16[0] = kx16_matmul_q4_k;
    ops->matmul_kq_x16[1] = kx16_matmul_q5_k;
    ops->matmul_kq_x16[2] = kx16_matmul_q6_k;
}
#else
typedef int tp_kernels_kx16_avx512_unused; /* ISO C forbids an empty translation unit */
#endif

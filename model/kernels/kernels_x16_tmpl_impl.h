/*
 * model/kernels/kernels_x16_tmpl_impl.h - private template: matmul kernels for every
 * x16 layout (Q4_0, Q8_0, MXFP4, Q4_K, Q5_K, Q6_K; kernels_impl.h) on ISAs whose
 * vectors hold 8 rows' 4-byte slices (AVX2: one ymm; NEON: two q-registers),
 * written once against a small vector interface that the including file
 * defines (kernels_x16_avx2.c, kernels_x16_neondot.c):
 *
 *   kvi, kvf                8 lanes of i32 / f32 (lane L = row L of the half-group)
 *   kv_ld(p)                the 32 bytes at p (4 bytes per lane)
 *   kv_and, kv_b8(c), kv_b32(c), kv_zero, kv_srl16/kv_sll16/kv_sra16(v, n),
 *   kv_srl32/kv_sll32/kv_sra32(v, n)
 *   kv_bsel(b, m, c)        (b & m) | c, c having no bit of m
 *   kv_dpb(acc, w, a)       acc + per lane sum of 4 u8 (<= 63) x the 4 int8 at a
 *   kv_dpbs(acc, w, a)      the same with signed weights (Q8_0)
 *   kv_dpwd(acc, w, p)      acc + w.i16[0] * p[0] + w.i16[1] * p[1] per lane (p: 2 int16)
 *   kv_lut(v)               per byte: MXFP4's kvalues + 16 (4..28) at index v (0..15)
 *   kv_e8m0(p)              the 8 E8M0 bytes at p as floats 2^(e - 128) (tp_e8m0_half)
 *   kv_cvt, kv_h2f(p) (8 fp16), kv_setf, kv_fzero, kv_mul, kv_fma(a, b, c) = a*b+c,
 *   kv_fnma(a, b, c) = c - a*b, kv_stf(float[8], v)
 *   KV_FN / KV_OUT          function attributes; KV_BT tokens per pass; KV_FILL
 *   the name of the ops filler; KV_Q8_BIAS 0 (Q8_0 by kv_dpbs).
 *   Optional, integer sums of K-quant sub-blocks for ISAs whose 4-byte dot is several
 *   instructions (AVX2); with KV_I16 defined, also:
 *   kv_mb16(w, a)           per lane the two i16 sums of pairs of u8 w x the 4 int8 at a
 *                           (vpmaddubsw against a broadcast), kv_add16 / kv_add32 (i16 / i32
 *                           adds), kv_madd16(a, b) per lane a.i16[0] b.i16[0] + a.i16[1] b.i16[1]
 *   Optional, for the decode's memory side (default: 2 streams):
 *   KV_DSTREAMS_A8, KV_DSTREAMS_K   groups a decode pass reads side by side (Q4_0 / Q8_0 /
 *                           MXFP4; K-quants)
 *
 * A 16-row group is computed as two halves of 8 rows (lane byte offset lb =
 * 0 or 32 in every 64-byte chunk, 2-byte fields at lb / 2), each over every
 * block for KV_BT tokens at a time (one token: both halves of XT_STREAMS
 * groups in the same pass over the blocks); the arithmetic is that of the AVX-512
 * kernels (kernels_x16_avx512.c for Q4_0 / Q8_0, kernels_kx16_avx512.c for
 * the K-quants, whose comments explain the steps).  Activations are read in
 * place: a8 rows (Q4_0 / Q8_0) and Q8_K rows with their pair sums (K-quants).
 */
#ifndef KV_FILL
#error "define the kv_ interface, KV_BT and KV_FILL before including kernels_x16_tmpl_impl.h"
#endif

enum { XT_Q4_0, XT_Q8_0, XT_MXFP4, XT_Q4K, XT_Q5K, XT_Q6K }; /* from XT_Q4K on: K-quants */
#define XT_BROWS 128 /* rows per chunk (weights reused from L2 by every pass) */

/* Bytes of one 16-row block. */
KV_FN size_t xt_gbs(const int type)
{
    switch (type) {
    case XT_Q4_0: return 16 * sizeof(tp_blk_q4_0);
    case XT_Q8_0: return 16 * sizeof(tp_blk_q8_0);
    case XT_MXFP4: return TP_X16_BLK_MXFP4;
    case XT_Q4K: return 16 * sizeof(tp_blk_q4_k);
    case XT_Q5K: return 16 * sizeof(tp_blk_q5_k);
    default: return 16 * sizeof(tp_blk_q6_k);
    }
}

/* Byte j&3 of each lane, unsigned / sign-extended, as i32 and as floats. */
KV_FN kvi xt_byte_ui(kvi s, int j)
{
    return (j & 3) == 3 ? kv_srl32(s, 24) : kv_and(kv_srl32(s, 8 * (j & 3)), kv_b32(0xFF));
}
KV_FN kvi xt_byte_si(kvi s, int j)
{
    return (j & 3) == 3 ? kv_sra32(s, 24) : kv_sra32(kv_sll32(s, 24 - 8 * (j & 3)), 24);
}
KV_FN kvf xt_byte_u(kvi s, int j) { return kv_cvt(xt_byte_ui(s, j)); }
KV_FN kvf xt_byte_s(kvi s, int j) { return kv_cvt(xt_byte_si(s, j)); }

/* The 4 weights per lane of slice k (0..7) of a Q4_0 / Q8_0 / MXFP4 block p: values 4k..4k+3
 * (Q4_0: nibbles 0..15, k < 4 the low nibbles of chunk k, else the high ones of chunk k-4;
 * MXFP4: those nibbles' codes looked up as kvalues + 16). */
KV_FN kvi xt_slice_a8(const int type, const char *p, int lb, int k)
{
    if (type == XT_Q8_0) return kv_ld(p + 32 + 64 * k + lb);
    if (type == XT_MXFP4) {
        const kvi z = kv_ld(p + TP_X16_MXFP4_QS + 64 * (k & 3) + lb);
        return kv_lut(kv_and(k < 4 ? z : kv_srl16(z, 4), kv_b8(0x0F)));
    }
    const kvi z = kv_ld(p + 32 + 64 * (k & 3) + lb);
    return kv_and(k < 4 ? z : kv_srl16(z, 4), kv_b8(0x0F));
}

/* The 4 unsigned weights per lane of slice m of sub-block j of a K-quant super-block p:
 * values xt_aoff_k(type, j, m) .. +3 (Q4_K / Q5_K: 8 sub-blocks of 8 slices, Q6_K: 16 of 4). */
KV_FN kvi xt_slice_k(const int type, const char *p, int lb, int j, int m)
{
    const kvi mF = kv_b8(0x0F);
    if (type == XT_Q6K) {
        const int half = j >> 3, quarter = (j >> 1) & 3;
        const kvi z = kv_ld(p + lb + tp_kx_q6k_ql(16 * half + 4 * (j & 1) + m + 8 * (quarter & 1)));
        const kvi h = kv_ld(p + lb + tp_kx_q6k_qh(8 * half + 4 * (j & 1) + m));
        const kvi bq = (quarter & 2) ? kv_srl16(z, 4) : z;
        /* bits 2q, 2q+1 of qh are the value's bits 4, 5 */
        const kvi hs = quarter == 0 ? kv_sll16(h, 4) : quarter == 1 ? kv_sll16(h, 2) : quarter == 2 ? h : kv_srl16(h, 2);
        return kv_bsel(bq, mF, kv_and(hs, kv_b8(0x30)));
    }
    const int k = 8 * (j >> 1) + m; /* the qs chunk */
    const kvi z = kv_ld(p + lb + (type == XT_Q5K ? tp_kx_q5k_qs(k) : TP_KX_Q4K_QS + 64 * (size_t)k));
    const kvi bq = (j & 1) ? kv_srl16(z, 4) : z;
    if (type != XT_Q5K) return kv_and(bq, mF);
    const kvi h = kv_ld(p + lb + tp_kx_q5k_qh(m)); /* bit j: the 5th bit, to bit 4 */
    const kvi hs = j < 4 ? kv_sll16(h, 4 - j) : j == 4 ? h : kv_srl16(h, j - 4);
    return kv_bsel(bq, mF, kv_and(hs, kv_b8(0x10)));
}
KV_FN int xt_aoff_k(const int type, int j, int m) { return type == XT_Q6K ? 16 * j + 4 * m : 32 * j + 4 * m; }
#define XT_NSUB(type) ((type) == XT_Q6K ? 16 : 8)   /* sub-blocks per super-block */
#define XT_NSLICE(type) ((type) == XT_Q6K ? 4 : 8)  /* slices per sub-block */

/* Q4_K / Q5_K: the 6-bit scales (sc[0]: 0..3, sc[1]: 4..7, one per byte) and the mins as
 * i16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7) of each lane (ggml's get_scale_min_k4). */
KV_FN void xt_scales_mins(const char *p, int lb, kvi sc[2], kvi mp[4])
{
    const kvi mF = kv_b8(0x0F), m30 = kv_b8(0x30), m3f = kv_b8(0x3F);
    const kvi U0 = kv_ld(p + TP_KX_Q4K_SC + lb), U1 = kv_ld(p + TP_KX_Q4K_SC + 64 + lb);
    const kvi U2 = kv_ld(p + TP_KX_Q4K_SC + 128 + lb);
    sc[0] = kv_and(U0, m3f);
    sc[1] = kv_bsel(U2, mF, kv_and(kv_srl32(U0, 2), m30));
    const kvi mnlo = kv_and(U1, m3f);
    const kvi mnhi = kv_bsel(kv_srl32(U2, 4), mF, kv_and(kv_srl32(U1, 2), m30));
    const kvi lo16 = kv_b32(0x00FF00FF);
    mp[0] = kv_and(mnlo, lo16), mp[1] = kv_srl16(mnlo, 8);
    mp[2] = kv_and(mnhi, lo16), mp[3] = kv_srl16(mnhi, 8);
}

/* d * scale of sub-block j per lane (sc from xt_scales_mins; Q6_K reads its int8 scales). */
KV_FN kvf xt_scf(const int type, const char *p, int lb, const kvi sc[2], int j, kvf DL)
{
    if (type == XT_Q6K) return kv_mul(xt_byte_s(kv_ld(p + TP_KX_Q6K_SC + lb + 64 * (j >> 2)), j), DL);
    return kv_mul(xt_byte_u(sc[j >> 2], j), DL);
}

#ifdef KV_I16
/* Slices of a sub-block whose kv_mb16 pair sums add up in i16 without overflow: with weights
 * at most 15 (Q4_K), 31 (Q5_K) or 63 (Q6_K) against |a| <= 127, runs of 8, 4 or 2 slices sum
 * 16, 8 or 4 products per i16, at most 32004 (tests/model/test_kernels.c matmul_kquant_extreme). */
#define XT_I16_RUN(type) ((type) == XT_Q4K ? 8 : (type) == XT_Q5K ? 4 : 2)

/* Sub-block j's integer scale per lane in both i16 halves (for kv_madd16): Q4_K / Q5_K the
 * 6-bit scale of xt_scales_mins, Q6_K its int8 scale. */
KV_FN kvi xt_sc16(const int type, const char *p, int lb, const kvi sc[2], int j)
{
    const kvi v =
        type == XT_Q6K ? xt_byte_si(kv_ld(p + TP_KX_Q6K_SC + lb + 64 * (j >> 2)), j) : xt_byte_ui(sc[j >> 2], j);
    return kv_bsel(v, kv_b32(0xFFFF), kv_sll32(v, 16));
}
#endif

/* The offset term per lane of one token (pr: its pair sums): Q4_K / Q5_K the mins' sum
 * (to scale by dmin), Q6_K sum_j sc_j * bsum_j (to scale by 32 d); mp from xt_scales_mins. */
KV_FN kvi xt_offset(const int type, const char *p, int lb, const kvi mp[4], const int16_t *pr)
{
    kvi s = kv_zero();
    if (type != XT_Q6K) {
        KX_UNROLL
        for (int k = 0; k < 4; k++) s = kv_dpwd(s, mp[k], pr + 2 * k);
        return s;
    }
    KX_UNROLL
    for (int m = 0; m < 4; m++) { /* the int8 scales as i16 pairs (s4m, s4m+2), (s4m+1, s4m+3) */
        const kvi s4 = kv_ld(p + TP_KX_Q6K_SC + lb + 64 * m);
        s = kv_dpwd(kv_dpwd(s, kv_sra16(kv_sll16(s4, 8), 8), pr + 8 + 4 * m), kv_sra16(s4, 8), pr + 8 + 4 * m + 2);
    }
    return s;
}

/* The factor of xt_offset's sum per lane (subtracted): dmin, or 32 d. */
KV_FN kvf xt_offset_f(const int type, const char *p, int lb, kvf DL)
{
    return type == XT_Q6K ? kv_mul(DL, kv_setf(32.0f)) : kv_h2f(p + TP_KX_Q4K_DMIN + lb / 2);
}

/* Q4_0 / Q8_0 / MXFP4: block b (p: its 16-row block) for Tk tokens (a8 rows at x + xo[t]). */
KV_FN void xt_blk_a8(const int type, const int Tk, const char *p, int lb, const char *x, const size_t *xo, int64_t n,
                     int64_t b, kvf acc[KV_BT])
{
    const kvf dw = type == XT_MXFP4 ? kv_e8m0(p + lb / 4) : kv_h2f(p + lb / 2);
    kvi I[KV_BT];
    KX_UNROLL
    for (int t = 0; t < Tk; t++) {
        int32_t s0 = 0; /* -8 (Q4_0) or -16 (MXFP4) x the block's sum */
        if (type != XT_Q8_0) memcpy(&s0, TP_A8_S(x + xo[t], n) + b, sizeof s0);
        I[t] = kv_b32(s0);
    }
    KX_UNROLL
    for (int k = 0; k < 8; k++) {
        const kvi v = xt_slice_a8(type, p, lb, k);
        KX_UNROLL
        for (int t = 0; t < Tk; t++) {
            const int8_t *a = TP_A8_QS(x + xo[t]) + b * TP_QK + 4 * k;
            I[t] = type == XT_Q8_0 ? kv_dpbs(I[t], v, a) : kv_dpb(I[t], v, a);
        }
    }
    KX_UNROLL
    for (int t = 0; t < Tk; t++) {
        float d;
        memcpy(&d, TP_A8_D(x + xo[t], n) + b, sizeof d);
        acc[t] = kv_fma(kv_cvt(I[t]), kv_mul(dw, kv_setf(d)), acc[t]);
    }
}

/* Q4_K / Q5_K / Q6_K: super-block i (p: its 16-row super-block) for Tk tokens (Q8_K rows at x + xo[t]). */
KV_FN void xt_sb_k(const int type, const int Tk, const char *p, int lb, const char *x, const size_t *xo, int64_t nb,
                   int64_t i, kvf acc[KV_BT])
{
    const tp_blk_q8_k *a[KV_BT];
    const int16_t *pr[KV_BT];
    KX_UNROLL
    for (int t = 0; t < Tk; t++) {
        a[t] = (const tp_blk_q8_k *)(x + xo[t]) + i;
        pr[t] = TP_Q8K_PAIR(x + xo[t], nb * TP_QK_K, i);
    }
    kvf fs[KV_BT];
    const kvf DL = kv_h2f(p + lb / 2);
    KX_UNROLL
    for (int t = 0; t < Tk; t++) fs[t] = kv_fzero();
    kvi sc[2] = {kv_zero(), kv_zero()}, mp[4] = {kv_zero(), kv_zero(), kv_zero(), kv_zero()};
    if (type != XT_Q6K) xt_scales_mins(p, lb, sc, mp);
#ifdef KV_I16
    /* sum_j scale_j x dot_j in i32 (at most 16 x 128 x 16 x 63 x 127 < 2^31): runs of slices
     * summed in i16, each run times the scale by kv_madd16, one conversion per super-block */
    kvi I[KV_BT];
    KX_UNROLL
    for (int t = 0; t < Tk; t++) I[t] = kv_zero();
    KX_UNROLL
    for (int j = 0; j < 16; j++) {
        if (j >= XT_NSUB(type)) break;
        const kvi s16 = xt_sc16(type, p, lb, sc, j);
        KX_UNROLL
        for (int m0 = 0; m0 < 8; m0 += XT_I16_RUN(type)) {
            if (m0 >= XT_NSLICE(type)) break;
            kvi S[KV_BT];
            KX_UNROLL
            for (int u = 0; u < 8; u++) {
                if (u >= XT_I16_RUN(type)) break;
                const int m = m0 + u;
                const kvi v = xt_slice_k(type, p, lb, j, m);
                KX_UNROLL
                for (int t = 0; t < Tk; t++) {
                    const kvi d = kv_mb16(v, a[t]->qs + xt_aoff_k(type, j, m));
                    S[t] = u == 0 ? d : kv_add16(S[t], d);
                }
            }
            KX_UNROLL
            for (int t = 0; t < Tk; t++) I[t] = kv_add32(I[t], kv_madd16(S[t], s16));
        }
    }
    KX_UNROLL
    for (int t = 0; t < Tk; t++) fs[t] = kv_mul(kv_cvt(I[t]), DL);
#else
    KX_UNROLL
    for (int j = 0; j < 16; j++) { /* constant bounds, so the loops unroll */
        if (j >= XT_NSUB(type)) break;
        const kvf scf = xt_scf(type, p, lb, sc, j, DL);
        kvi D[KV_BT];
        KX_UNROLL
        for (int t = 0; t < Tk; t++) D[t] = kv_zero();
        KX_UNROLL
        for (int m = 0; m < 8; m++) {
            if (m >= XT_NSLICE(type)) break;
            const kvi v = xt_slice_k(type, p, lb, j, m);
            KX_UNROLL
            for (int t = 0; t < Tk; t++) D[t] = kv_dpb(D[t], v, a[t]->qs + xt_aoff_k(type, j, m));
        }
        KX_UNROLL
        for (int t = 0; t < Tk; t++) fs[t] = kv_fma(kv_cvt(D[t]), scf, fs[t]);
    }
#endif
    const kvf of = xt_offset_f(type, p, lb, DL);
    KX_UNROLL
    for (int t = 0; t < Tk; t++) {
        fs[t] = kv_fnma(kv_cvt(xt_offset(type, p, lb, mp, pr[t])), of, fs[t]);
        acc[t] = kv_fma(fs[t], kv_setf(a[t]->d), acc[t]);
    }
}

/* Q6_K super-block i for Tk <= 2 tokens (used for decode): per half h and 16-value position b the two
 * ql chunks (two nibbles each) and the qh chunk (four 2-bit planes) are the values of the
 * four quarters' sub-blocks 8h + 2q + b, loaded once per super-block (xt_slice_k loads
 * each qh chunk four times and each ql chunk twice).  One token computes the four
 * quarters together, two tokens the pairs (q, q + 2) that share a ql chunk.  For the
 * pair from qh plane bits X = (qh >> 2p) & 0x33: quarter p's high bits are
 * (X & 0x03) << 4, quarter p + 2's X & 0x30. */
KV_FN void xt_sb_q6(const int Tk, const char *p, int lb, const char *x, const size_t *xo, int64_t nb, int64_t i,
                    kvf acc[KV_BT])
{
    const tp_blk_q8_k *a[2];
    const int16_t *pr[2];
    KX_UNROLL
    for (int t = 0; t < Tk; t++) {
        a[t] = (const tp_blk_q8_k *)(x + xo[t]) + i;
        pr[t] = TP_Q8K_PAIR(x + xo[t], nb * TP_QK_K, i);
    }
    const kvi mF = kv_b8(0x0F);
    const int NP = Tk == 1 ? 2 : 1; /* ql chunks (quarter pairs) per pass */
    kvf fs[2];
    KX_UNROLL
    for (int t = 0; t < Tk; t++) fs[t] = kv_fzero();
    KX_UNROLL
    for (int h = 0; h < 2; h++) {
        KX_UNROLL
        for (int b = 0; b < 2; b++) {
            KX_UNROLL
            for (int k = 0; k < 2; k++) {
                if (k >= 2 / NP) break; /* constant bounds, so the loops unroll */
                const int p0 = k * NP;
                kvi D[4][2]; /* [quarter][token] */
                KX_UNROLL
                for (int q = 0; q < 4; q++)
                    KX_UNROLL
                    for (int t = 0; t < Tk; t++) D[q][t] = kv_zero();
                KX_UNROLL
                for (int s = 0; s < 4; s++) {
                    const kvi H = kv_ld(p + lb + tp_kx_q6k_qh(8 * h + 4 * b + s));
                    KX_UNROLL
                    for (int e = 0; e < 2; e++) {
                        if (e >= NP) break;
                        const int pq = p0 + e;
                        const kvi L = kv_ld(p + lb + tp_kx_q6k_ql(16 * h + 8 * pq + 4 * b + s));
                        const kvi X = kv_and(pq ? kv_srl16(H, 2) : H, kv_b8(0x33));
                        const kvi vlo = kv_bsel(L, mF, kv_sll16(kv_and(X, kv_b8(0x03)), 4));
                        const kvi vhi = kv_bsel(kv_srl16(L, 4), mF, kv_and(X, kv_b8(0x30)));
                        const int jlo = 8 * h + 2 * pq + b, jhi = jlo + 4;
                        KX_UNROLL
                        for (int t = 0; t < Tk; t++) {
                            D[pq][t] = kv_dpb(D[pq][t], vlo, a[t]->qs + 16 * jlo + 4 * s);
                            D[pq + 2][t] = kv_dpb(D[pq + 2][t], vhi, a[t]->qs + 16 * jhi + 4 * s);
                        }
                    }
                }
                KX_UNROLL
                for (int f = 0; f < 2; f++) {
                    if (f >= NP) break;
                    const int pq = p0 + f;
                    KX_UNROLL
                    for (int e = 0; e < 2; e++) {
                        const int q = pq + 2 * e, j = 8 * h + 2 * q + b;
                        const kvf sc = xt_byte_s(kv_ld(p + TP_KX_Q6K_SC + lb + 64 * (j >> 2)), j);
                        KX_UNROLL
                        for (int t = 0; t < Tk; t++) fs[t] = kv_fma(kv_cvt(D[q][t]), sc, fs[t]);
                    }
                }
            }
        }
    }
    const kvi none[4] = {kv_zero(), kv_zero(), kv_zero(), kv_zero()};
    const kvf DL = kv_h2f(p + lb / 2);
    KX_UNROLL
    for (int t = 0; t < Tk; t++) {
        fs[t] = kv_fnma(kv_cvt(xt_offset(XT_Q6K, p, lb, none, pr[t])), kv_setf(32.0f), fs[t]);
        acc[t] = kv_fma(fs[t], kv_mul(DL, kv_setf(a[t]->d)), acc[t]);
    }
}

/* One half-group (rows g0 + lb/4 .. +8 of the group at gp) x Tk tokens over every block;
 * outputs of tokens < T in rows [r0, r1) stored. */
KV_FN void xt_half(const int type, const int Tk, const char *gp, int lb, int64_t n, const char *x, const size_t *xo,
                   int T, float *y, int64_t ys, int64_t g0, int64_t r0, int64_t r1)
{
    kvf acc[KV_BT];
    KX_UNROLL
    for (int t = 0; t < Tk; t++) acc[t] = kv_fzero();
    const size_t gbs = xt_gbs(type);
    const int kq = type >= XT_Q4K;
    const int64_t nb = n / (kq ? TP_QK_K : TP_QK);
    for (int64_t i = 0; i < nb; i++) {
        const char *p = gp + (size_t)i * gbs;
        if (type == XT_Q6K && Tk == 1) /* decode; 2 tokens counted no fewer instructions on NEON */
            xt_sb_q6(Tk, p, lb, x, xo, nb, i, acc);
        else if (kq)
            xt_sb_k(type, Tk, p, lb, x, xo, nb, i, acc);
        else
            xt_blk_a8(type, Tk, p, lb, x, xo, n, i, acc);
    }
    const int64_t h0 = g0 + lb / 4; /* first row of the half */
    for (int t = 0; t < T; t++) {
        float o[8];
        kv_stf(o, acc[t]);
        for (int l = 0; l < 8; l++)
            if (h0 + l >= r0 && h0 + l < r1) y[(int64_t)t * ys + h0 + l] = o[l];
    }
}

/* Groups a decode pass reads side by side, for Q4_0 / Q8_0 / MXFP4 and for the K-quants (both
 * halves of each group together).  The x86 ISAs take one group at a time, the groups in memory
 * order, so that the hardware prefetcher follows one stream (docs/performance.md); an ISA that does
 * not define them (NEON, where it is not measured) keeps 2.  No software prefetch: with one stream
 * the hardware prefetcher keeps ahead alone, and on the Zen 4 VM requesting the next super-block or
 * 1152 bytes ahead left 0.70-0.99x of the rate without (docs/design-measurements.md). */
#ifdef KV_DSTREAMS_A8
#define XT_STREAMS_A8 KV_DSTREAMS_A8
#define XT_STREAMS_K KV_DSTREAMS_K
#else
#define XT_STREAMS_A8 2
#define XT_STREAMS_K 2
#endif
#define XT_STREAMS (XT_STREAMS_A8 > XT_STREAMS_K ? XT_STREAMS_A8 : XT_STREAMS_K) /* the most */

/* One token, S groups from g0, both halves of each in the same pass over the blocks (so each
 * 64-byte line is used whole when it arrives): 2 S weight-stream halves, 2 S accumulators. */
KV_FN void xt_decode_groups(const int type, const char *w, size_t wrb, int64_t n, const char *x, float *y, int64_t g0,
                            int64_t r0, int64_t r1, const int S)
{
    kvf acc[2 * XT_STREAMS][KV_BT]; /* [k][0]: the (group k / 2, half k & 1) sums; the callees take KV_BT */
    const size_t xo[KV_BT] = {0};
    KX_UNROLL
    for (int k = 0; k < 2 * S; k++) acc[k][0] = kv_fzero();
    const char *gp = w + (size_t)(g0 / 16) * 16 * wrb;
    const size_t gbs = xt_gbs(type);
    const int kq = type >= XT_Q4K;
    const int64_t nb = n / (kq ? TP_QK_K : TP_QK);
    for (int64_t i = 0; i < nb; i++) {
        KX_UNROLL
        for (int k = 0; k < 2 * S; k++) {
            const char *p = gp + (size_t)(k / 2) * 16 * wrb + (size_t)i * gbs;
            const int lb = 32 * (k & 1);
            if (type == XT_Q6K)
                xt_sb_q6(1, p, lb, x, xo, nb, i, acc[k]);
            else if (kq)
                xt_sb_k(type, 1, p, lb, x, xo, nb, i, acc[k]);
            else
                xt_blk_a8(type, 1, p, lb, x, xo, n, i, acc[k]);
        }
    }
    for (int k = 0; k < 2 * S; k++) {
        const int64_t h0 = g0 + 8 * k; /* first row of group k / 2's half k & 1 */
        float o[8];
        kv_stf(o, acc[k][0]);
        for (int l = 0; l < 8; l++)
            if (h0 + l >= r0 && h0 + l < r1) y[h0 + l] = o[l];
    }
}

KV_FN void xt_matmul(const int type, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok,
                     float *y, int64_t ys, int64_t r0, int64_t r1)
{
    if (n_tok == 1) {
        const int NS = type >= XT_Q4K ? XT_STREAMS_K : XT_STREAMS_A8; /* a constant in each copy */
        for (int64_t g0 = r0 / 16 * 16; g0 < r1;) {
            const int S = tp_x16_pass_groups(g0, r1, NS);
            switch (S) { /* a constant S in each call */
#if XT_STREAMS > 3
            case 4:
                if (NS > 3) xt_decode_groups(type, (const char *)w, wrb, n, (const char *)xq, y, g0, r0, r1, 4);
                break;
#endif
#if XT_STREAMS > 2
            case 3:
                if (NS > 2) xt_decode_groups(type, (const char *)w, wrb, n, (const char *)xq, y, g0, r0, r1, 3);
                break;
#endif
#if XT_STREAMS > 1
            case 2:
                if (NS > 1) xt_decode_groups(type, (const char *)w, wrb, n, (const char *)xq, y, g0, r0, r1, 2);
                break;
#endif
            default: xt_decode_groups(type, (const char *)w, wrb, n, (const char *)xq, y, g0, r0, r1, 1); break;
            }
            g0 += 16 * S;
        }
        return;
    }
    for (int64_t c0 = r0 / 16 * 16; c0 < r1; c0 += XT_BROWS) {
        const int64_t c1 = r1 - c0 < XT_BROWS ? r1 : c0 + XT_BROWS;
        for (int t0 = 0; t0 < n_tok; t0 += KV_BT) {
            const int T = n_tok - t0 < KV_BT ? n_tok - t0 : KV_BT;
            const char *x = (const char *)xq + (size_t)t0 * xrb;
            size_t xo[KV_BT];
            for (int t = 0; t < KV_BT; t++) xo[t] = (size_t)(t < T ? t : T - 1) * xrb;
            float *yt = y + (int64_t)t0 * ys;
            for (int64_t g0 = c0; g0 < c1; g0 += 16) {
                const char *gp = (const char *)w + (size_t)(g0 / 16) * 16 * wrb;
                for (int lb = 0; lb < 64; lb += 32) {
                    if (g0 + lb / 4 >= r1 || g0 + lb / 4 + 8 <= r0) continue; /* no row of this half wanted */
                    switch (T) {
                    case 1: xt_half(type, 1, gp, lb, n, x, xo, T, yt, ys, g0, r0, r1); break;
                    case 2: xt_half(type, 2, gp, lb, n, x, xo, T, yt, ys, g0, r0, r1); break;
                    case 3: xt_half(type, 3, gp, lb, n, x, xo, T, yt, ys, g0, r0, r1); break;
                    default: xt_half(type, KV_BT, gp, lb, n, x, xo, T, yt, ys, g0, r0, r1); break;
                    }
                }
            }
        }
    }
}
_Static_assert(KV_BT == 4, "xt_matmul's switch assumes 4 tokens per pass");

#define XT_ENTRY(name, type)                                                                                    \
    KV_OUT void name(const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb, int n_tok, float *y,     \
                     int64_t ys, int64_t r0, int64_t r1)                                                        \
    {                                                                                                           \
        xt_matmul(type, w, wrb, n, xq, xrb, n_tok, y, ys, r0, r1);                                              \
    }
XT_ENTRY(xt_matmul_q4_0, XT_Q4_0)
XT_ENTRY(xt_matmul_q8_0, XT_Q8_0)
XT_ENTRY(xt_matmul_mxfp4, XT_MXFP4)
XT_ENTRY(xt_matmul_q4_k, XT_Q4K)
XT_ENTRY(xt_matmul_q5_k, XT_Q5K)
XT_ENTRY(xt_matmul_q6_k, XT_Q6K)

void KV_FILL(struct tp_kern_ops *ops)
{
    ops->matmul_q4_0_x16 = xt_matmul_q4_0;
    ops->matmul_q8_0_x16 = xt_matmul_q8_0;
    ops->matmul_mxfp4_x16 = xt_matmul_mxfp4;
    ops->matmul_kq_x16[0] = xt_matmul_q4_k;
    ops->matmul_kq_x16[1] = xt_matmul_q5_k;
    ops->matmul_kq_x16[2] = xt_matmul_q6_k;
}

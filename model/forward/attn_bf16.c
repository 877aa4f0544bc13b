/*
 * model/forward/attn_bf16.c - the tiled attention of attn.c on AVX512_BF16
 * vector products (x86-64 Linux CPUs with AVX512_BF16, AVX512BW and
 * AVX512DQ, with or without AMX): the scores S = Q K^T and the weighted
 * values P V are VDPBF16PS products (per 32-bit lane, two bf16 products added
 * into a float32 sum: 32 products per instruction), and the online softmax
 * runs on AVX-512 between them, as in attn_tile_impl.h but in log2 units (q
 * scaled by log2 e, each weight one 2^x), with a lazy max (raised only when a
 * score passes it by more than BF_MAX_SLACK, the score sums starting at minus
 * the max); a row's sum stays 16 lanes wide until the item ends, and whole
 * tiles take no masks.  Per tile of TP_ATTN_KB key positions the cache rows are converted
 * once (f32 / fp16 / q8_0 -> bf16; a bf16 cache is stored so and read in
 * place) into the layouts the products read, shared by every query row of
 * the item:
 *   Kt  K^T in pairs of dimensions: vector (pair p, key group kg) holds
 *       dimensions 2p and 2p+1 of keys 16 kg .. 16 kg + 15 (16 x 16
 *       transposes of 32-bit pairs);
 *   Vv  V in pairs of keys: vector (key pair kp, 16-dim chunk d) holds dims
 *       16 d .. 16 d + 15 of keys 2 kp and 2 kp + 1, interleaved.
 * A tile runs in three passes over the item's rows: the scores, in groups of
 * up to 4 rows whose sums are held in registers (4 x 4 vectors over the
 * tile's 64 keys: q's pair of a row broadcast into each product, a K^T
 * vector shared by the 4 rows); every row's softmax, back to back so that the
 * rows' dependent steps overlap; the weighted values, again in groups of 4
 * rows x 64 dims (a weight pair broadcast, a V vector shared).  A decode item
 * of 8 query heads per KV head is 2 groups, so a key
 * or value converted once feeds 8 rows.  The next tile's rows are requested
 * from memory while this tile's groups are computed, a few lines per step:
 * a bf16 cache's keys over the scores, its values over the weighted values
 * (the converted types' rows over the scores).  Requested in one burst, they
 * held the products up until the lines arrived.
 *
 * Accuracy: as on the AMX path, q (after the 1/sqrt(hd) scale), k, the
 * softmax weights p and v are rounded to bf16 (8-bit mantissa, relative
 * error <= 2^-9); products and sums are float32.  docs/long-context.md gives
 * the measured error.
 */
#include <math.h>
#include <string.h>

#include "forward/model_impl.h"

#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10) || (defined(__clang__) && __clang_major__ >= 9))
#define TP_ATTN_BF16 1
#include <cpuid.h>
#include <immintrin.h>
#endif

#define KB TP_ATTN_KB
_Static_assert(TP_ATTN_KB == 64, "attn_bf16.c holds a tile's keys as 4 vectors of 16 (2 chunks of 32)");

size_t tp_attn_bf16_scratch_floats(int hd, int rows)
{
    const size_t R = (size_t)rows, h = (size_t)hd;
    /* Qb (bf16), O, K^T and V (bf16), the tile's scores S and weights P (bf16), partial sums (16 per row), M, L,
     * corr; plus 16 floats to align */
    return R * h / 2 + R * h + (size_t)KB * h + R * KB + R * KB / 2 + 16 * R + 3 * R + 16;
}

#if defined(TP_ATTN_BF16)

int tp_attn_bf16_detect(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 16) & 1) || !((b >> 17) & 1) || !((b >> 30) & 1))
        return 0; /* F, DQ, BW */
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1); /* AVX512_BF16 */
}

#define BF_TARGET "avx512f,avx512bw,avx512dq,avx512bf16,avx2,fma,f16c"
#define BF_FN __attribute__((target(BF_TARGET)))
#define BF_INL __attribute__((always_inline, target(BF_TARGET))) static inline

#define SX_W 16
#define SX_NAME(x) bf_##x
#define SX_TARGET BF_TARGET
#include "forward/simd_x86_impl.h"
#undef SX_W
#undef SX_NAME
#undef SX_TARGET

#define BP_INL BF_INL
#define BP_NAME(x) bf_##x
#include "forward/bf16_pairs_impl.h"
#undef BP_INL
#undef BP_NAME

/* The keys and values of positions j0 .. j0+jn-1 (jn <= KB) as the products read them: Kt (hd/2, KB/16, 16)
 * 32-bit pairs, all KB keys (keys past jn zero: their scores are masked, and 0 x garbage may be NaN); Vv
 * (ceil(jn/2), hd/16, 16) 32-bit key pairs (a missing second key of the last pair zero, its weight 0). */
BF_INL void bf_convert(const struct tp_attn_geom *g, const uint8_t *kc, const uint8_t *vc, int j0, int jn,
                       uint32_t *Kt, uint32_t *Vv)
{
    const int hd = g->hd, nc = hd / 32, nd = hd / 16, nkp = (jn + 1) / 2;
    for (int kg = 0; kg < KB / 16; kg++)
        for (int c = 0; c < nc; c++) {
            __m512i rr[16];
            for (int j = 0; j < 16; j++) {
                const int key = kg * 16 + j;
                rr[j] = key < jn ? bf_row32(g->type, kc + (size_t)((j0 + key) % g->cap) * g->row_bytes, c)
                                 : _mm512_setzero_si512();
            }
            bf_transpose16(rr);
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(Kt + ((size_t)(16 * c + p) * 4 + kg) * 16, rr[p]);
        }
    const __m512i ilv_lo = _mm512_loadu_si512(bf_ilv_lo), ilv_hi = _mm512_loadu_si512(bf_ilv_hi);
    for (int kp = 0; kp < nkp; kp++) {
        const int ka = 2 * kp, kb = ka + 1;
        const uint8_t *ra = vc + (size_t)((j0 + ka) % g->cap) * g->row_bytes;
        const uint8_t *rb = vc + (size_t)((j0 + kb) % g->cap) * g->row_bytes;
        for (int c = 0; c < nc; c++) {
            const __m512i a = bf_row32(g->type, ra, c);
            const __m512i b = kb < jn ? bf_row32(g->type, rb, c) : _mm512_setzero_si512();
            _mm512_storeu_si512(Vv + ((size_t)kp * nd + 2 * c) * 16, _mm512_permutex2var_epi16(a, ilv_lo, b));
            _mm512_storeu_si512(Vv + ((size_t)kp * nd + 2 * c + 1) * 16, _mm512_permutex2var_epi16(a, ilv_hi, b));
        }
    }
}

/* A bf16 cache tile's values (as tp_kv_store_at lays them out: Vv's layout) that an item reads only from key ka to
 * key kb: the key pairs [ka/2, (kb+1)/2) the products read, copied, with the pairs' one key outside [ka, kb) zeroed
 * (key ka-1 for an odd ka, key kb for an odd kb): its weight is 0, and 0 x a stale inf would be NaN. */
BF_INL void bf_edge_values(const uint8_t *tile, int hd, int ka, int kb, uint32_t *Vv)
{
    const size_t pair = (size_t)hd * 4, b0 = (size_t)(ka / 2) * pair, b1 = (size_t)((kb + 1) / 2) * pair;
    memcpy((char *)Vv + b0, tile + b0, b1 - b0);
    uint16_t *v = (uint16_t *)(void *)Vv;
    for (int d = 0; d < hd; d++) {
        if (ka & 1) v[tp_kv_bf16_index(1, ka - 1, d, hd)] = 0;
        if (kb & 1) v[tp_kv_bf16_index(1, kb, d, hd)] = 0;
    }
}

/* Dims 16 d0 .. 16 (d0 + DN) - 1 of NR (1..4) rows O (NR, hd): O = O * corr + P V over the key pairs kp0 <= kp <
 * nkp (the weights of the others 0), P (NR, KB/2) bf16 pairs of weights; the pfl lines at pf requested a few per
 * key pair (tp_kern_prefetch's level: pfl2) */
BF_INL void bf_pv(const uint32_t *P, const uint32_t *Vv, int kp0, int nkp, int nd, int d0, int NR, int DN,
                  const float *Cr, float *O, int hd, const char *pf, int pfl, int pfl2)
{
    __m512 acc[4][4];
    for (int i = 0; i < NR; i++)
        for (int c = 0; c < DN; c++) acc[i][c] = _mm512_setzero_ps();
    const int pfn = nkp > kp0 ? (pfl + nkp - kp0 - 1) / (nkp - kp0) : 0; /* lines per step */
    int pfi = 0;
    for (int kp = kp0; kp < nkp; kp++) {
        for (int c = 0; c < pfn && pfi < pfl; c++, pfi++) TP_PREFETCH(pf + 64 * (size_t)pfi, pfl2);
        __m512bh v[4];
        for (int c = 0; c < DN; c++) v[c] = (__m512bh)_mm512_loadu_si512(Vv + ((size_t)kp * nd + d0 + c) * 16);
        for (int i = 0; i < NR; i++) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32((int)P[i * (KB / 2) + kp]);
            for (int c = 0; c < DN; c++) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], w, v[c]);
        }
    }
    for (int i = 0; i < NR; i++) {
        const __m512 corr = _mm512_set1_ps(Cr[i]);
        for (int c = 0; c < DN; c++) {
            float *op = O + (size_t)i * hd + 16 * (d0 + c);
            _mm512_storeu_ps(op, _mm512_fmadd_ps(corr, _mm512_loadu_ps(op), acc[i][c]));
        }
    }
}

/* 2^x per lane for the softmax weights, x <= BF_MAX_SLACK past a row's max (or any value in a lane the caller
 * zeroes): f = x - floor(x) in [0, 1) by VREDUCEPS, 2^f by a degree-3 minimax polynomial (relative error
 * < 7.5e-5, measured over [0, 1) in float32; the weight's bf16 rounding is up to 2^-9 = 1.95e-3, and the
 * error scales a key's weight and its share of the row's sum alike), times 2^floor(x) by VSCALEFPS, which
 * floors its exponent operand itself (0 below 2^-149, no exponent arithmetic) */
BF_INL __m512 bf_exp2(__m512 x)
{
    const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_set1_ps(7.80245215e-2f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.26067171e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.95833504e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.99925196e-1f));
    return _mm512_scalef_ps(p, x);
}

/* How far a tile's scores may pass a row's max (log2 units) before the max is raised: bf_softmax_row */
#define BF_MAX_SLACK 8.0f

/* the maximum of v's lanes, in every lane */
BF_INL __m512 bf_max_bcast(__m512 v)
{
    v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
    v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
    v = _mm512_max_ps(v, _mm512_permute_ps(v, 0x4E));
    return _mm512_max_ps(v, _mm512_permute_ps(v, 0xB1));
}

/* The online softmax of one row over the keys a <= j < b of the tile, its scores s[4] (keys 16 v .. 16 v + 15,
 * in log2 units: q was scaled by log2 e) less the row's max *M where it has one (bf_scores starts the sums
 * there): the row's max *M (log2 units) and 16-lane partial sums Lv updated,
 * *cr = 2^(old max - new max) for its weighted values, prow (KB/2) the weights 2^(s - max) as bf16 pairs, 0
 * outside [a, b).  A whole tile (a = 0, b = KB: every tile of a long row but its edges) takes no masks. */
BF_INL void bf_softmax_row(const __m512 s[4], uint32_t *prow, int a, int b, float *M, float *Lv, float *cr)
{
    if (a >= b) { /* this tile is outside the row's window (causal or sliding) */
        memset(prow, 0, sizeof(uint32_t) * KB / 2);
        *cr = 1.0f;
        return;
    }
    const int whole = a == 0 && b == KB;
    __mmask16 k[4] = {0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF};
    __m512 vm;
    if (whole) {
        vm = _mm512_max_ps(_mm512_max_ps(s[0], s[1]), _mm512_max_ps(s[2], s[3]));
    } else {
        vm = _mm512_set1_ps(-INFINITY);
        for (int v = 0; v < 4; v++) {
            k[v] = bf_range_mask(16 * v, a, b);
            vm = _mm512_mask_max_ps(vm, k[v], vm, s[v]);
        }
    }
    /* The max is raised only when a score passes it by more than BF_MAX_SLACK: the weights then stay <= 2^8
     * (no float32 or bf16 range is near), and O and L, both relative to the same max, still give O / L.
     * Once a row's max is found most tiles take the one compare, without the max across lanes, and their
     * scores (already less the max) go to 2^x as they are.  The max is a whole number (log2 units), so a
     * weight's bf16 rounding is the same whichever max it is taken against (a power of 2 apart): an item
     * split into key ranges (the split decode) rounds its weights as the whole item does. */
    const float m_old = *M;
    float corr = 1.0f;
    __m512 e[4];
    if (_mm512_cmp_ps_mask(vm, _mm512_set1_ps(BF_MAX_SLACK), _CMP_GT_OQ) || m_old == -INFINITY) {
        /* a whole number: > BF_MAX_SLACK but at the row's first tile */
        const float rise = ceilf(_mm512_cvtss_f32(bf_max_bcast(vm)));
        corr = m_old == -INFINITY ? 0.0f : ldexpf(1.0f, -(int)rise);
        *M = m_old == -INFINITY ? rise : m_old + rise;
        const __m512 vr = _mm512_set1_ps(rise);
        for (int v = 0; v < 4; v++) e[v] = bf_exp2(_mm512_sub_ps(s[v], vr));
    } else {
        for (int v = 0; v < 4; v++) e[v] = bf_exp2(s[v]);
    }
    if (!whole)
        for (int v = 0; v < 4; v++) e[v] = _mm512_maskz_mov_ps(k[v], e[v]);
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3]));
    _mm512_storeu_ps(Lv, _mm512_fmadd_ps(_mm512_loadu_ps(Lv), _mm512_set1_ps(corr), sum));
    _mm512_storeu_si512(prow, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));
    _mm512_storeu_si512(prow + 16, (__m512i)_mm512_cvtne2ps_pbh(e[3], e[2]));
    *cr = corr;
}

/* Where one tile's work goes: the item's rows and the tile's converted keys and values */
struct bf_tile {
    const struct tp_attn_geom *g;
    const struct tp_attn_rows *r;
    int j0, jn, kmin; /* the tile's first position and positions; the item's first key */
    int ka;           /* the item's first key in this tile (0 but in a bf16 cache's first tile): the key pairs
                       * before ka / 2 and 16-key vectors before ka / 16 are not read (their weights 0) */
    const uint32_t *Qb, *Kt, *Vv; /* (R, hd/2) q * scale * log2 e; the tile's K^T and V (bf_convert, or a bf16 cache's) */
    float *O, *M, *Lv, *Cr;       /* (R, hd) weighted values; (R) max (log2 units); (R, 16) partial sums; (R) */
    float *S;                     /* (R, KB) the tile's scores (log2 units) less each row's max */
    uint32_t *P;                  /* (R, KB/2) the tile's weights, bf16 pairs */
    /* the group's share of the next tile's rows, requested a few lines per step so that the reads from memory
     * overlap the arithmetic without stalling it: a bf16 cache's lines [0, pfl) of K at pfk over its scores
     * and of V at pfv over its weighted values (pfl 0: none); the converted types' pfq lines from the ring
     * cursor pf over its scores (NULL: none) */
    const char *pfk, *pfv;
    int pfl, pfq;
    int pfl2; /* those requests into L2, not L1 (tp_kern_prefetch) */
    struct tp_attn_pf *pf;
};

/* The scores of rows r0 .. r0+NR-1 (NR 1..4) of the item against the tile less each row's max so far (none:
 * 0), into S (4 x 4 vectors held in registers while they sum: q's pair of a row broadcast into each product, a
 * K^T vector shared by the NR rows) */
BF_INL void bf_scores_n(const struct bf_tile *t, int r0, int NR, int NK)
{
    const int np = t->g->hd / 2, kg0 = t->ka / 16;
    const uint32_t *Qb = t->Qb + (size_t)r0 * np;
    __m512 acc[4][4];
    for (int i = 0; i < NR; i++) { /* the sums start at -max, so the softmax gets the scores less the max */
        const float m = t->M[r0 + i];
        for (int kg = 0; kg < NK; kg++) acc[i][kg] = _mm512_set1_ps(m == -INFINITY ? 0.0f : -m);
    }
    const int pfn = (t->pfl + np - 1) / np, pcn = (t->pfq + np - 1) / np; /* lines per step */
    int pfi = 0;
    for (int p = 0; p < np; p++) {
        for (int c = 0; c < pfn && pfi < t->pfl; c++, pfi++) TP_PREFETCH(t->pfk + 64 * (size_t)pfi, t->pfl2);
        if (t->pf) tp_attn_pf_step(t->pf, pcn);
        __m512bh k[4];
        for (int kg = 0; kg < NK; kg++)
            k[kg] = (__m512bh)_mm512_loadu_si512(t->Kt + ((size_t)p * 4 + kg0 + kg) * 16);
        for (int i = 0; i < NR; i++) {
            const __m512bh q = (__m512bh)_mm512_set1_epi32((int)Qb[(size_t)i * np + p]);
            for (int kg = 0; kg < NK; kg++) acc[i][kg] = _mm512_dpbf16_ps(acc[i][kg], q, k[kg]);
        }
    }
    for (int i = 0; i < NR; i++) { /* the key vectors outside the item's keys: 0, masked by the softmax */
        float *sr = t->S + (size_t)(r0 + i) * KB;
        for (int kg = 0; kg < 4 - NK; kg++) _mm512_storeu_ps(sr + 16 * ((kg0 + NK + kg) % 4), _mm512_setzero_ps());
        for (int kg = 0; kg < NK; kg++) _mm512_storeu_ps(sr + 16 * (kg0 + kg), acc[i][kg]);
    }
}

/* bf_scores_n over the tile's 16-key vectors holding the item's keys, [ka / 16, ceil(jn / 16)) (at least one:
 * ka < jn): an item's first or last tile computes the scores of only those */
BF_INL void bf_scores(const struct bf_tile *t, int r0, int NR)
{
    switch ((t->jn + 15) / 16 - t->ka / 16) {
    case 1: bf_scores_n(t, r0, NR, 1); break;
    case 2: bf_scores_n(t, r0, NR, 2); break;
    case 3: bf_scores_n(t, r0, NR, 3); break;
    default: bf_scores_n(t, r0, NR, 4); break;
    }
}

/* Rows r0 .. r0+NR-1 (NR 1..4) of the item: O = O * corr + P V over the tile, dims 4 x 16 at a time (hd/16 is
 * even: 2 left at most) */
BF_INL void bf_values(const struct bf_tile *t, int r0, int NR)
{
    const int hd = t->g->hd, nd = hd / 16, nkp = (t->jn + 1) / 2;
    const uint32_t *P = t->P + (size_t)r0 * (KB / 2);
    float *O = t->O + (size_t)r0 * hd;
    int d0 = 0;
    for (; d0 + 4 <= nd; d0 += 4) /* the group's share of the next tile's values requested in the first */
        bf_pv(P, t->Vv, t->ka / 2, nkp, nd, d0, NR, 4, t->Cr + r0, O, hd, t->pfv, d0 ? 0 : t->pfl, t->pfl2);
    if (d0 < nd) bf_pv(P, t->Vv, t->ka / 2, nkp, nd, d0, NR, 2, t->Cr + r0, O, hd, t->pfv, d0 ? 0 : t->pfl, t->pfl2);
}

/* Group r0's share of a bf16 cache's next tile (its K lines at nk, V lines at nv; tl lines each, ngr groups) into
 * u: its scores request the K lines, its weighted values the V lines, a few per step (none without nk) */
BF_INL void bf_share(struct bf_tile *u, int r0, int ngr, int tl, const uint8_t *nk, const uint8_t *nv)
{
    u->pfl = 0;
    if (!nk) return;
    const int ls = r0 / 4 * tl / ngr, le = (r0 / 4 + 1) * tl / ngr;
    u->pfk = (const char *)(nk + 64 * (size_t)ls), u->pfv = (const char *)(nv + 64 * (size_t)ls);
    u->pfl = le - ls;
}

/* The item against one tile in three passes: every group's scores, every row's online softmax, every group's
 * weighted values.  A row's softmax is a chain of dependent steps (the max across lanes, the new max, 2^x);
 * run back to back, the rows' chains overlap one another, where between a group's scores and its values they
 * would hold both up. */
BF_INL void bf_tile_rows(const struct bf_tile *t, int R, int ngr, int tl, const uint8_t *nk, const uint8_t *nv)
{
    struct bf_tile u = *t;
    for (int r0 = 0; r0 < R; r0 += 4) {
        bf_share(&u, r0, ngr, tl, nk, nv);
        switch (TP_MIN(4, R - r0)) { /* the group's size a constant in each copy: its sums in registers */
        case 4: bf_scores(&u, r0, 4); break;
        case 3: bf_scores(&u, r0, 3); break;
        case 2: bf_scores(&u, r0, 2); break;
        default: bf_scores(&u, r0, 1); break;
        }
    }
    for (int row = 0; row < R; row++) {
        const int p = t->r->pos0 + row / t->r->ng, lo = tp_attn_first_key(t->g, p);
        const int a = TP_MAX(TP_MAX(t->j0, lo), t->kmin) - t->j0, b = TP_MIN(t->j0 + t->jn, p + 1) - t->j0;
        const float *sr = t->S + (size_t)row * KB;
        const __m512 s[4] = {_mm512_loadu_ps(sr), _mm512_loadu_ps(sr + 16), _mm512_loadu_ps(sr + 32),
                             _mm512_loadu_ps(sr + 48)};
        bf_softmax_row(s, t->P + (size_t)row * (KB / 2), a, b, t->M + row, t->Lv + (size_t)row * 16, t->Cr + row);
    }
    for (int r0 = 0; r0 < R; r0 += 4) {
        bf_share(&u, r0, ngr, tl, nk, nv);
        switch (TP_MIN(4, R - r0)) {
        case 4: bf_values(&u, r0, 4); break;
        case 3: bf_values(&u, r0, 3); break;
        case 2: bf_values(&u, r0, 2); break;
        default: bf_values(&u, r0, 1); break;
        }
    }
}

BF_FN void tp_attn_bf16_tile(const struct tp_attn_geom *g, const struct tp_attn_rows *r, const uint8_t *kc,
                             const uint8_t *vc, int k0, int k1, float *scratch, float *o, size_t o_stride, float *part)
{
    const int hd = g->hd, nt = r->nt, ng = r->ng, R = nt * ng, nc = hd / 32;
    float *base = (float *)(((uintptr_t)scratch + 63u) & ~(uintptr_t)63u);
    uint32_t *Qb = (uint32_t *)(void *)base;                 /* (R, hd/2) bf16 pairs: q * scale * log2 e */
    float *O = base + (size_t)R * hd / 2;                     /* (R, hd) running weighted values */
    uint32_t *Kt = (uint32_t *)(void *)(O + (size_t)R * hd); /* (hd/2, KB/16, 16) */
    uint32_t *Vv = Kt + (size_t)KB * hd / 2;                  /* (KB/2, hd/16, 16) */
    float *S = (float *)(void *)(Vv + (size_t)KB * hd / 2);   /* (R, KB) */
    uint32_t *P = (uint32_t *)(void *)(S + (size_t)R * KB);   /* (R, KB/2) */
    float *Lv = (float *)(void *)(P + (size_t)R * KB / 2);    /* (R, 16) */
    float *M = Lv + (size_t)16 * R, *L = M + R, *Cr = L + R;

    /* scores in log2 units, so each weight is one 2^x */
    const __m512 vscale = _mm512_set1_ps(g->scale * 1.44269504088896341f);
    for (int row = 0; row < R; row++) {
        const float *q = r->q + (size_t)(row / ng) * r->q_stride + (size_t)(row % ng) * hd;
        for (int c = 0; c < nc; c++)
            _mm512_storeu_si512(Qb + (size_t)row * hd / 2 + 16 * c, bf_scaled32(q + 32 * c, vscale));
        memset(O + (size_t)row * hd, 0, sizeof(float) * (size_t)hd);
        _mm512_storeu_ps(Lv + (size_t)row * 16, _mm512_setzero_ps());
        M[row] = -INFINITY;
    }
    /* keys any row can see: from the first row's window start to the last row's position */
    const int lo0 = tp_attn_first_key(g, r->pos0);
    const int kmin = TP_MAX(k0, lo0), kmax = TP_MIN(k1, r->pos0 + nt), ngr = (R + 3) / 4;
    /* a bf16 cache is read in place, a whole tile at a time from the one holding kmin (the keys outside
     * [kmin, kmax) masked); the other types are converted from kmin on */
    const int tiled = g->type == TP_KV_BF16;
    struct bf_tile t = {g, r, 0, 0, kmin, 0, Qb, Kt, Vv, O, M, Lv, Cr, S, P, NULL, NULL, 0, 0, 0, NULL};
    t.pfl2 = tp_kern_prefetch() == TP_KERN_PF_L2;
    for (int j0 = tiled ? kmin - kmin % KB : kmin; j0 < kmax; j0 += KB) {
        t.j0 = j0;
        t.jn = TP_MIN(KB, kmax - j0);
        /* the next tile's rows, requested over this tile's groups (struct bf_tile): a bf16 cache's next tile is one
         * block of K and one of V (whole tiles), a share of each per group; the converted types' rows go through
         * the ring cursor */
        struct tp_attn_pf pf;
        tp_attn_pf_init(&pf, kc, vc, j0 + KB, tiled ? j0 + KB : TP_MIN(j0 + 2 * KB, kmax), g->cap, g->row_bytes,
                        t.pfl2);
        const int pfq = (int)((tp_attn_pf_lines(&pf) + (size_t)ngr - 1) / (size_t)ngr);
        const uint8_t *nk = NULL, *nv = NULL;
        if (tiled && j0 + KB < kmax) {
            const size_t noff = (size_t)((j0 + KB) % g->cap) * g->row_bytes;
            nk = kc + noff, nv = vc + noff;
        }
        if (tiled) {
            const size_t off = (size_t)(j0 % g->cap) * g->row_bytes; /* the tile's start (cap: whole tiles) */
            t.Kt = (const uint32_t *)(const void *)(kc + off);
            t.Vv = (const uint32_t *)(const void *)(vc + off);
            t.ka = TP_MAX(kmin - j0, 0);
            if ((t.ka | t.jn) & 1) {
                bf_edge_values(vc + off, hd, t.ka, t.jn, Vv);
                t.Vv = Vv;
            }
        } else {
            bf_convert(g, kc, vc, j0, t.jn, Kt, Vv); /* from the item's first key: ka 0 */
        }
        const int tl = KB * (int)g->row_bytes / 64; /* lines per tile */
        t.pf = tiled ? NULL : &pf, t.pfq = pfq;
        bf_tile_rows(&t, R, ngr, tl, nk, nv);
        tp_attn_pf_step(&pf, 1 << 30);
    }
    for (int row = 0; row < R; row++) { /* the sums and maxima as tp_attn_finish takes them: natural units */
        L[row] = _mm512_reduce_add_ps(_mm512_loadu_ps(Lv + (size_t)row * 16));
        if (M[row] > -INFINITY) M[row] *= 0.693147180559945309f;
    }
    tp_attn_finish(r, hd, M, L, O, o, o_stride, part);
}

#else /* no AVX512_BF16 build: never chosen */

int tp_attn_bf16_detect(void) { return 0; }

void tp_attn_bf16_tile(const struct tp_attn_geom *g, const struct tp_attn_rows *r, const uint8_t *kc,
                       const uint8_t *vc, int k0, int k1, float *scratch, float *o, size_t o_stride, float *part)
{
    (void)g, (void)r, (void)kc, (void)vc, (void)k0, (void)k1, (void)scratch, (void)o, (void)o_stride, (void)part;
}

#endif

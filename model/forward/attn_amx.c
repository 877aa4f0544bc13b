/*
 * model/forward/attn_amx.c - the tiled attention of attn.c on AMX-BF16 tile
 * units (x86-64 Linux with AMX-BF16 and AVX512_BF16): the scores S = Q K^T
 * and the weighted values P V are bf16 tile products accumulated in float32
 * (TDPBF16PS); the online softmax runs on AVX-512 between them, exactly as
 * in attn_tile_impl.h.  Per tile of TP_ATTN_KB key positions the cache rows
 * are converted once (f32 / fp16 / q8_0 -> bf16) into the layouts the tile
 * unit reads, shared by every query row of the item:
 *   Kt  K^T in pairs of dimensions: tile (key group kg, 32-dim chunk c) holds
 *       16 rows (dimension pairs) x 16 keys x 2 bf16 (a 16x16 transpose of
 *       32-bit pairs);
 *   Vv  V in pairs of keys: tile (32-key chunk kc, 16-dim chunk d) holds 16
 *       rows (key pairs) x 16 dims x 2 bf16.
 * Query rows go in groups of 16 (padded with zero rows), so one item of R
 * rows costs ceil(R / 16) row groups of tile products.  An item with fewer
 * row groups than 32-dim chunks (decode: 8 rows of TinyLlama, 4 of Llama 3)
 * takes the scores as S^T = K Q^T instead: K's bf16 rows are the A operand
 * as they are, Q^T is prepared once per item, and each 16 x 16 block of S^T
 * is transposed back, which moves fewer values than transposing K.  The
 * next tile's rows are converted while the tile unit multiplies this one's,
 * and the one after is requested from memory over this tile's softmax.
 *
 * Accuracy: q (after the 1/sqrt(hd) scale), k, the softmax weights p and v
 * are rounded to bf16 (8-bit mantissa, relative error <= 2^-9); products and
 * sums are float32.  docs/long-context.md gives the measured error; the
 * plain C / AVX2 / AVX-512 builds of attn_tile_impl.h stay float32
 * throughout and remain available (tp_attn_isa_limit, TP_ATTN_ISA).
 *
 * The tile unit's state is per thread: each call loads the tile
 * configuration and releases the tiles before it returns.
 */
#include <math.h>
#include <string.h>

#include "forward/model_impl.h"

#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12))
#define TP_ATTN_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#endif

#define KB TP_ATTN_KB
_Static_assert(TP_ATTN_KB == 64, "attn_amx.c tiles TP_ATTN_KB keys as 4 groups of 16 (2 chunks of 32)");

/* Rows of query rows padded to whole tiles of 16. */
static int amx_rows(int rows) { return (rows + 15) & ~15; }

size_t tp_attn_amx_scratch_floats(int hd, int rows)
{
    const size_t Rp = (size_t)amx_rows(rows), h = (size_t)hd;
    /* Qb (bf16), O, M, L, corr, two tiles' K and V (bf16), S, P (bf16), Ot, Qt (bf16), Ct; plus 16 floats to
     * align to 64 bytes */
    return Rp * h / 2 + Rp * h + 3 * Rp + (size_t)2 * KB * h + Rp * KB + Rp * KB / 2 + Rp * h + Rp * h / 2 + 4 * 256 + 16;
}

#if defined(TP_ATTN_AMX)

int tp_attn_amx_detect(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1, avx512bw = (b >> 30) & 1;
    if (!tile || !bf16 || !avx512bw) return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !((a >> 5) & 1)) return 0; /* AVX512_BF16 */
    /* Linux hands out the tile state (8 KiB per thread) only on request, for the whole process:
     * ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18).  A kernel without it (before 5.16)
     * refuses, and the tiles stay unused. */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return 0;
    /* and reads back the grant: ARCH_GET_XCOMP_PERM (0x1022), bit 18 */
    unsigned long perm = 0;
    return syscall(SYS_arch_prctl, 0x1022, &perm) == 0 && ((perm >> 18) & 1u);
}

#define AMX_FN __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16,avx2,fma,f16c")))
#define AMX_INL __attribute__((always_inline, target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16,avx2,fma,f16c"))) static inline

#define SX_W 16
#define SX_NAME(x) amx_##x
#define SX_TARGET "amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16,avx2,fma,f16c"
#include "forward/simd_x86_impl.h"
#undef SX_W
#undef SX_NAME
#undef SX_TARGET

/* The tile asm statements do not tell the compiler that they read memory:
 * stores into the buffers a tile load reads must be complete before it. */
#define AMX_BARRIER() __asm__ volatile("" ::: "memory")

/* ldtilecfg's 64-byte operand, palette 1 */
struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
_Static_assert(sizeof(struct amx_cfg) == 64, "tile configuration is 64 bytes");

#define BP_INL AMX_INL
#define BP_NAME(x) amx_##x
#include "forward/bf16_pairs_impl.h"
#undef BP_INL
#undef BP_NAME

/* The keys and values of positions j0 .. j0+jn-1 (jn <= KB) as the tile unit reads them: in S^T mode K as bf16
 * rows (KB, hd), else K^T in dimension pairs ((KB/16, nc) tiles of 16 x 32 bf16); V in key pairs ((KB/32, nd)
 * tiles of 16 x 32 bf16).  Keys past jn are zero (their weights are zero, and 0 x garbage may be NaN). */
AMX_INL void amx_convert(const struct tp_attn_geom *g, const uint8_t *kc, const uint8_t *vc, int j0, int jn, int st,
                     uint16_t *Kt, uint16_t *Vv)
{
    const int hd = g->hd, nc = hd / 32, nd = hd / 16, nkg = (jn + 15) / 16, nkc = (jn + 31) / 32;
    const __m512i ilv_lo = _mm512_loadu_si512(amx_ilv_lo), ilv_hi = _mm512_loadu_si512(amx_ilv_hi);
    for (int key = 0; st && key < nkg * 16; key++) {
        uint16_t *kb = Kt + (size_t)key * hd;
        const uint8_t *row = kc + (size_t)((j0 + key) % g->cap) * g->row_bytes;
        for (int c = 0; c < nc; c++)
            _mm512_storeu_si512(kb + 32 * c, key < jn ? amx_row32(g->type, row, c) : _mm512_setzero_si512());
    }
    for (int kg = 0; !st && kg < nkg; kg++)
        for (int c = 0; c < nc; c++) {
            __m512i rr[16];
            for (int j = 0; j < 16; j++) {
                const int key = kg * 16 + j;
                rr[j] = key < jn ? amx_row32(g->type, kc + (size_t)((j0 + key) % g->cap) * g->row_bytes, c)
                                 : _mm512_setzero_si512();
            }
            amx_transpose16(rr);
            uint16_t *tile = Kt + (size_t)(kg * nc + c) * 512;
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(tile + 32 * p, rr[p]);
        }
    for (int kk = 0; kk < nkc; kk++)
        for (int kp = 0; kp < 16; kp++) {
            const int ka = kk * 32 + 2 * kp, kb = ka + 1;
            const uint8_t *ra = vc + (size_t)((j0 + ka) % g->cap) * g->row_bytes;
            const uint8_t *rb = vc + (size_t)((j0 + kb) % g->cap) * g->row_bytes;
            for (int c = 0; c < nc; c++) {
                const __m512i a = ka < jn ? amx_row32(g->type, ra, c) : _mm512_setzero_si512();
                const __m512i b = kb < jn ? amx_row32(g->type, rb, c) : _mm512_setzero_si512();
                _mm512_storeu_si512(Vv + ((size_t)(kk * nd + 2 * c) * 16 + kp) * 32,
                                    _mm512_permutex2var_epi16(a, ilv_lo, b));
                _mm512_storeu_si512(Vv + ((size_t)(kk * nd + 2 * c + 1) * 16 + kp) * 32,
                                    _mm512_permutex2var_epi16(a, ilv_hi, b));
            }
        }
}

AMX_FN void tp_attn_amx_tile(const struct tp_attn_geom *g, const struct tp_attn_rows *r, const uint8_t *kc,
                             const uint8_t *vc, int k0, int k1, float *scratch, float *o, size_t o_stride, float *part)
{
    const int hd = g->hd, nt = r->nt, ng = r->ng, R = nt * ng, Rp = amx_rows(R);
    const int nc = hd / 32, nd = hd / 16;
    float *base = (float *)(((uintptr_t)scratch + 63u) & ~(uintptr_t)63u);
    uint16_t *Qb = (uint16_t *)(void *)base;                  /* (Rp, hd) bf16: q * scale */
    float *O = base + (size_t)Rp * hd / 2;                     /* (Rp, hd) running weighted values */
    float *M = O + (size_t)Rp * hd, *L = M + Rp, *Cr = L + Rp; /* (Rp) max, sum, this tile's correction */
    uint16_t *Kt2 = (uint16_t *)(void *)(Cr + Rp);             /* (2, KB x hd) K of this tile and the next */
    uint16_t *Vv2 = Kt2 + (size_t)2 * KB * hd;                 /* (2, KB x hd) V of this tile and the next */
    float *S = (float *)(void *)(Vv2 + (size_t)2 * KB * hd);   /* (Rp, KB) scores */
    uint16_t *P = (uint16_t *)(void *)(S + (size_t)Rp * KB);   /* (Rp, KB) bf16 softmax weights */
    float *Ot = (float *)(void *)(P + (size_t)Rp * KB);        /* (Rp, hd) this tile's P V */
    uint16_t *Qt = (uint16_t *)(void *)(Ot + (size_t)Rp * hd); /* (Rp/16, nc) tiles of Q^T in dimension pairs */
    float *Ct = (float *)(void *)(Qt + (size_t)Rp * hd);       /* (4, 16, 16) blocks of S^T */
    /* Fewer row groups than 32-dim chunks (decode: one group): S^T = K Q^T, K's bf16 rows the A operand as
     * they are and Q^T prepared once per item, each 16 x 16 block of S^T transposed back: KB/16 transposes
     * per tile per row group instead of (KB/16) x nc of K. */
    const int st = Rp / 16 < nc;

    const __m512 vscale = _mm512_set1_ps(g->scale);
    for (int row = 0; row < Rp; row++) {
        uint16_t *qb = Qb + (size_t)row * hd;
        if (row < R) {
            const float *q = r->q + (size_t)(row / ng) * r->q_stride + (size_t)(row % ng) * hd;
            for (int c = 0; c < nc; c++) _mm512_storeu_si512(qb + 32 * c, amx_scaled32(q + 32 * c, vscale));
        } else {
            memset(qb, 0, sizeof(uint16_t) * (size_t)hd);
            memset(P + (size_t)row * KB, 0, sizeof(uint16_t) * KB);
        }
        memset(O + (size_t)row * hd, 0, sizeof(float) * (size_t)hd);
        M[row] = -INFINITY;
        L[row] = 0.0f;
    }

    if (st) /* Q^T: tile (rg, c) holds 16 dimension pairs x the group's 16 rows x 2 bf16 */
        for (int rg = 0; rg < Rp / 16; rg++)
            for (int c = 0; c < nc; c++) {
                __m512i rr[16];
                for (int i = 0; i < 16; i++) rr[i] = _mm512_loadu_si512(Qb + (size_t)(rg * 16 + i) * hd + 32 * c);
                amx_transpose16(rr);
                uint16_t *tile = Qt + (size_t)(rg * nc + c) * 512;
                for (int p = 0; p < 16; p++) _mm512_storeu_si512(tile + 32 * p, rr[p]);
            }

    struct amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    AMX_BARRIER();
    _tile_loadconfig(&cfg);

    const int lo0 = tp_attn_first_key(g, r->pos0);
    const int kmin = TP_MAX(k0, lo0), kmax = TP_MIN(k1, r->pos0 + nt);
    /* Software pipeline: tile t + 1's rows are converted while the tile unit multiplies tile t's (right after
     * the first row group's score products are issued), so their stores have drained by the time its tile
     * loads read them, and tile t + 2's rows are requested from memory over tile t's softmax. */
    if (kmin < kmax) amx_convert(g, kc, vc, kmin, TP_MIN(KB, kmax - kmin), st, Kt2, Vv2);
    const int pfl2 = tp_kern_prefetch() == TP_KERN_PF_L2;
    for (int j0 = kmin, t = 0; j0 < kmax; j0 += KB, t++) {
        const int jn = TP_MIN(KB, kmax - j0), nkg = (jn + 15) / 16, nkc = (jn + 31) / 32;
        uint16_t *Kt = Kt2 + (size_t)(t & 1) * KB * hd, *Vv = Vv2 + (size_t)(t & 1) * KB * hd;
        uint16_t *Kn = Kt2 + (size_t)(~t & 1) * KB * hd, *Vn = Vv2 + (size_t)(~t & 1) * KB * hd;
        const int jn_next = TP_MIN(KB, kmax - j0 - KB); /* <= 0: this is the last tile */
        struct tp_attn_pf pf;
        tp_attn_pf_init(&pf, kc, vc, j0 + 2 * KB, TP_MIN(j0 + 3 * KB, kmax), g->cap, g->row_bytes, pfl2);
        const int pfq = (int)((tp_attn_pf_lines(&pf) + 2 * (size_t)R - 1) / (2 * (size_t)R)); /* per row, twice */
        AMX_BARRIER();
        /* S^T mode: per row group, C tiles 0-3 = the 4 key groups x 16 rows, Q^T chunk in 4, K rows in 5 and
         * 6; each block stored, transposed and written into S */
        for (int rg = 0; st && rg < Rp / 16; rg++) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int c = 0; c < nc; c++) {
                _tile_loadd(4, Qt + (size_t)(rg * nc + c) * 512, 64);
                _tile_loadd(5, Kt + 32 * c, hd * 2);
                _tile_dpbf16ps(0, 5, 4);
                if (nkg > 1) {
                    _tile_loadd(6, Kt + (size_t)16 * hd + 32 * c, hd * 2);
                    _tile_dpbf16ps(1, 6, 4);
                }
                if (nkg > 2) {
                    _tile_loadd(5, Kt + (size_t)32 * hd + 32 * c, hd * 2);
                    _tile_dpbf16ps(2, 5, 4);
                }
                if (nkg > 3) {
                    _tile_loadd(6, Kt + (size_t)48 * hd + 32 * c, hd * 2);
                    _tile_dpbf16ps(3, 6, 4);
                }
            }
            if (rg == 0 && jn_next > 0) amx_convert(g, kc, vc, j0 + KB, jn_next, st, Kn, Vn);
            _tile_stored(0, Ct, 64);
            if (nkg > 1) _tile_stored(1, Ct + 256, 64);
            if (nkg > 2) _tile_stored(2, Ct + 512, 64);
            if (nkg > 3) _tile_stored(3, Ct + 768, 64);
            AMX_BARRIER();
            float *srow = S + (size_t)rg * 16 * KB;
            for (int kg = 0; kg < nkg; kg++) {
                __m512i rr[16];
                for (int i = 0; i < 16; i++) rr[i] = _mm512_loadu_si512(Ct + 256 * kg + 16 * i); /* key i's 16 rows */
                amx_transpose16(rr);
                for (int i = 0; i < 16; i++) _mm512_storeu_si512(srow + (size_t)i * KB + 16 * kg, rr[i]);
            }
        }
        /* S = Q K^T, 16 rows x 64 keys per row group: C tiles 0-3, Q chunk in 4, K chunks in 5 and 6 */
        for (int rg = 0; !st && rg < Rp / 16; rg++) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int c = 0; c < nc; c++) {
                _tile_loadd(4, Qb + (size_t)rg * 16 * hd + 32 * c, hd * 2);
                _tile_loadd(5, Kt + (size_t)(0 * nc + c) * 512, 64);
                _tile_dpbf16ps(0, 4, 5);
                if (nkg > 1) {
                    _tile_loadd(6, Kt + (size_t)(1 * nc + c) * 512, 64);
                    _tile_dpbf16ps(1, 4, 6);
                }
                if (nkg > 2) {
                    _tile_loadd(5, Kt + (size_t)(2 * nc + c) * 512, 64);
                    _tile_dpbf16ps(2, 4, 5);
                }
                if (nkg > 3) {
                    _tile_loadd(6, Kt + (size_t)(3 * nc + c) * 512, 64);
                    _tile_dpbf16ps(3, 4, 6);
                }
            }
            if (rg == 0 && jn_next > 0) amx_convert(g, kc, vc, j0 + KB, jn_next, st, Kn, Vn);
            float *srow = S + (size_t)rg * 16 * KB;
            _tile_stored(0, srow, KB * 4);
            if (nkg > 1) _tile_stored(1, srow + 16, KB * 4);
            if (nkg > 2) _tile_stored(2, srow + 32, KB * 4);
            if (nkg > 3) _tile_stored(3, srow + 48, KB * 4);
        }
        /* online softmax per real row; P = e^(s - max) inside the row's window, 0 elsewhere */
        for (int i = 0; i < nt; i++) {
            const int p = r->pos0 + i;
            const int lo = tp_attn_first_key(g, p);
            const int a = TP_MAX(j0, lo) - j0, b = TP_MIN(j0 + jn, p + 1) - j0;
            for (int h = 0; h < ng; h++) {
                const int row = i * ng + h;
                const float *s = S + (size_t)row * KB;
                uint16_t *prow = P + (size_t)row * KB;
                tp_attn_pf_step(&pf, pfq);
                if (a >= b) { /* this tile is outside row i's window (causal or sliding) */
                    memset(prow, 0, sizeof(uint16_t) * 32 * (size_t)nkc);
                    Cr[row] = 1.0f;
                    continue;
                }
                __m512 vm = _mm512_set1_ps(M[row]);
                for (int v = 0; v < 2 * nkc; v++) {
                    const __mmask16 k = amx_range_mask(16 * v, a, b);
                    vm = _mm512_mask_max_ps(vm, k, vm, _mm512_maskz_loadu_ps(k, s + 16 * v));
                }
                const float mx = _mm512_reduce_max_ps(vm);
                const float corr = M[row] == -INFINITY ? 0.0f : expf(M[row] - mx);
                const __m512 vmx = _mm512_set1_ps(mx);
                __m512 acc = _mm512_setzero_ps();
                for (int v = 0; v < 2 * nkc; v += 2) {
                    const __mmask16 k0m = amx_range_mask(16 * v, a, b), k1m = amx_range_mask(16 * v + 16, a, b);
                    const __m512 e0 = _mm512_maskz_mov_ps(k0m, amx_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k0m, s + 16 * v), vmx)));
                    const __m512 e1 = _mm512_maskz_mov_ps(k1m, amx_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k1m, s + 16 * v + 16), vmx)));
                    acc = _mm512_add_ps(acc, _mm512_add_ps(e0, e1));
                    _mm512_storeu_si512(prow + 16 * v, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
                }
                L[row] = L[row] * corr + _mm512_reduce_add_ps(acc);
                M[row] = mx;
                Cr[row] = corr;
            }
        }
        AMX_BARRIER();
        /* Ot = P V, 16 rows x 64 dims at a time: C tiles 0-3, P chunk in 4, V tiles in 5 and 6 */
        for (int rg = 0; rg < Rp / 16; rg++)
            for (int d0 = 0; d0 < nd; d0 += 4) {
                const int dn = TP_MIN(4, nd - d0); /* nd is even: 2 or 4 */
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int kk = 0; kk < nkc; kk++) {
                    _tile_loadd(4, P + (size_t)rg * 16 * KB + 32 * kk, KB * 2);
                    _tile_loadd(5, Vv + (size_t)(kk * nd + d0) * 512, 64);
                    _tile_dpbf16ps(0, 4, 5);
                    _tile_loadd(6, Vv + (size_t)(kk * nd + d0 + 1) * 512, 64);
                    _tile_dpbf16ps(1, 4, 6);
                    if (dn > 2) {
                        _tile_loadd(5, Vv + (size_t)(kk * nd + d0 + 2) * 512, 64);
                        _tile_dpbf16ps(2, 4, 5);
                        _tile_loadd(6, Vv + (size_t)(kk * nd + d0 + 3) * 512, 64);
                        _tile_dpbf16ps(3, 4, 6);
                    }
                }
                float *ot = Ot + (size_t)rg * 16 * hd + 16 * d0;
                _tile_stored(0, ot, hd * 4);
                _tile_stored(1, ot + 16, hd * 4);
                if (dn > 2) {
                    _tile_stored(2, ot + 32, hd * 4);
                    _tile_stored(3, ot + 48, hd * 4);
                }
            }
        for (int row = 0; row < R; row++) {
            tp_attn_pf_step(&pf, pfq);
            const __m512 corr = _mm512_set1_ps(Cr[row]);
            float *orow = O + (size_t)row * hd;
            const float *trow = Ot + (size_t)row * hd;
            for (int c = 0; c < hd; c += 16)
                _mm512_storeu_ps(orow + c, _mm512_fmadd_ps(corr, _mm512_loadu_ps(orow + c), _mm512_loadu_ps(trow + c)));
        }
        tp_attn_pf_step(&pf, 1 << 30);
    }
    _tile_release();

    tp_attn_finish(r, hd, M, L, O, o, o_stride, part);
}

#else /* no AMX build: never chosen */

int tp_attn_amx_detect(void) { return 0; }

void tp_attn_amx_tile(const struct tp_attn_geom *g, const struct tp_attn_rows *r, const uint8_t *kc,
                      const uint8_t *vc, int k0, int k1, float *scratch, float *o, size_t o_stride, float *part)
{
    (void)g, (void)r, (void)kc, (void)vc, (void)k0, (void)k1, (void)scratch, (void)o, (void)o_stride, (void)part;
}

#endif

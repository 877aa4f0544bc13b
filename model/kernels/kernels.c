/*
 * model/kernels/kernels.c - public side of the kernels: row sizes, activation
 * preparation, reference quantize/dequantize, and the run-time choice of
 * instruction set (once, via pthread_once; TP_KERN_ISA=scalar|avx2|avx2-vnni|
 * avx512-vnni|neon|neon-dotprod|neon-i8mm in the environment pins one the CPU has, for
 * benchmarks) and of the cache level the decode kernels prefetch into (TP_KERN_PREFETCH=l1|l2
 * pins it).  F32 weights with many tokens go to BLAS (single-threaded:
 * the caller already splits rows over its own threads), except on AVX-512,
 * where our own tile is used (f32_beats_blas).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "kernels/kernels_impl.h"
#include "kernels/kernels_mlx_impl.h"

#if defined(TP_BLAS_OPENBLAS)
#include <cblas.h>
#elif defined(TP_BLAS_ACCELERATE)
#include <Accelerate/Accelerate.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
#endif
#if defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

/* Float weights with at least this many tokens use BLAS sgemm. */
#define TP_BLAS_MIN_TOKENS 8

#define TP_MAX_ISAS 5
static struct tp_kern_ops g_isas[TP_MAX_ISAS]; /* [0] = scalar, then ever wider */
static int g_n_isas;
static const struct tp_kern_ops *g_best;
static _Atomic(const struct tp_kern_ops *) g_cur;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
#define g_scalar g_isas[0]
static enum tp_kern_prefetch g_pf_best;   /* this CPU's prefetch level (cpu_prefetch), or TP_KERN_PREFETCH's */
static _Atomic int g_pf_cur;              /* the level in use (tp_kern_force_prefetch) */

/* Append an ISA table: scalar entries overlaid with what the ISA implements; the MLX and
 * row-major MXFP4 kernels are those of the ISA named base (an ISA that adds instructions to
 * another shares its kernels for those). */
static void add_isa(const char *name, const char *base, void (*fill)(struct tp_kern_ops *),
                    void (*fill_kquant)(struct tp_kern_ops *))
{
    struct tp_kern_ops o = {0};
    fill(&o);
    if (fill_kquant) fill_kquant(&o);
    tp_kern_mlx_ops(base, &o);
    tp_kern_mxfp4_ops(base, &o);
    struct tp_kern_ops *dst = &g_isas[g_n_isas++];
    *dst = g_scalar;
    dst->name = name;
    for (int t = 0; t < TP_WTYPE_COUNT; t++)
        if (o.matmul[t]) dst->matmul[t] = o.matmul[t];
    for (int v = 0; v < TP_KERN_MLX_VARIANTS; v++)
        if (o.mlx[v]) dst->mlx[v] = o.mlx[v];
    if (o.matmul_q4_0_x16) dst->matmul_q4_0_x16 = o.matmul_q4_0_x16;
    if (o.matmul_q8_0_x16) dst->matmul_q8_0_x16 = o.matmul_q8_0_x16;
    for (int k = 0; k < 3; k++)
        if (o.matmul_kq_x16[k]) dst->matmul_kq_x16[k] = o.matmul_kq_x16[k];
    if (o.matmul_mxfp4_x16) dst->matmul_mxfp4_x16 = o.matmul_mxfp4_x16;
    if (o.quant_a8) dst->quant_a8 = o.quant_a8;
    if (o.quant_q8k) dst->quant_q8k = o.quant_q8k;
    dst->f32_beats_blas = 0;
}

#if defined(__x86_64__) || defined(_M_X64)
/* AVX-VNNI (CPUID leaf 7 subleaf 1, EAX bit 4), which not every compiler's __builtin_cpu_supports names. */
static int cpu_has_avxvnni(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1u);
}

/* The level the decode kernels prefetch into on this CPU (kernels.h says what it covers).  AMD family 19h
 * (Zen 3 and Zen 4): into L2.  On a Zen 4 VM an L1 prefetch (_MM_HINT_T0) of data that comes from memory
 * held the reads back: one thread's Q4_0 decode read 0.57 of a streaming read with it, 0.87 with
 * _MM_HINT_T1, and the K-quants' 8-token pass was 1.7-2.4x faster (docs/performance.md).  Zen 3 fills L1
 * on either hint, so it loses nothing.  Elsewhere into L1: on a Zen 5 VM that was the faster one (Q4_K
 * one thread, 0.89-0.95 against 0.68-0.80 of a streaming read); no other CPU has been measured. */
static enum tp_kern_prefetch cpu_prefetch(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u) return TP_KERN_PF_L1; /* "Auth"enticAMD */
    if (!__get_cpuid(1, &a, &b, &c, &d)) return TP_KERN_PF_L1;
    const unsigned fam = (a >> 8 & 0xFu) + ((a >> 8 & 0xFu) == 0xFu ? (a >> 20 & 0xFFu) : 0u);
    return fam == 0x19 ? TP_KERN_PF_L2 : TP_KERN_PF_L1;
}
#endif

/* "l1" or "l2" into *out; 0 for any other name. */
static int prefetch_parse(const char *name, enum tp_kern_prefetch *out)
{
    if (strcmp(name, "l1") != 0 && strcmp(name, "l2") != 0) return 0;
    *out = name[1] == '1' ? TP_KERN_PF_L1 : TP_KERN_PF_L2;
    return 1;
}

#if defined(__x86_64__) || defined(_M_X64)
static void avx2vnni_ops(struct tp_kern_ops *ops)
{
    tp_kern_avx2_ops(ops);
    tp_kern_x16_avxvnni_ops(ops);
}
#endif

static void choose_isa(void)
{
    tp_kern_scalar_ops(&g_scalar);
    tp_kern_kquant_scalar_ops(&g_scalar);
    tp_kern_mlx_ops("scalar", &g_scalar);
    tp_kern_mxfp4_ops("scalar", &g_scalar);
    g_scalar.name = "scalar";
    g_n_isas = 1;
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2) add_isa("avx2", "avx2", tp_kern_avx2_ops, tp_kern_kquant_avx2_ops);
    if (avx2 && cpu_has_avxvnni()) /* AVX2's kernels, the x16 ones on vpdpbusd */
        add_isa("avx2-vnni", "avx2", avx2vnni_ops, tp_kern_kquant_avx2_ops);
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
        add_isa("avx512-vnni", "avx512-vnni", tp_kern_avx512_ops, tp_kern_kquant_avx512_ops);
#if !defined(TP_BLAS_ACCELERATE)
        /* our 4x4 zmm tile outruns single-threaded OpenBLAS sgemm (docs/design-measurements.md) */
        g_isas[g_n_isas - 1].f32_beats_blas = 1;
#endif
    }
#elif defined(__aarch64__)
    int dot = 0, i8mm = 0;
#if defined(__linux__)
    dot = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    i8mm = (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
#elif defined(__APPLE__)
    dot = 1; /* every Apple arm64 core has the dot-product extension; i8mm from M2 on */
    int64_t has = 0;
    size_t len = sizeof has;
    if (sysctlbyname("hw.optional.arm.FEAT_I8MM", &has, &len, NULL, 0) == 0) i8mm = has != 0;
#endif
    add_isa("neon", "neon", tp_kern_neon_ops, tp_kern_kquant_neon_ops);
    if (dot && tp_kern_neondot_built)
        add_isa("neon-dotprod", "neon-dotprod", tp_kern_neondot_ops, tp_kern_kquant_neondot_ops);
    if (dot && i8mm && tp_kern_neondot_built && tp_kern_i8mm_built)
        add_isa("neon-i8mm", "neon-dotprod", tp_kern_neoni8mm_ops, tp_kern_kquant_neondot_ops);
#endif
    g_best = &g_isas[g_n_isas - 1];
    const char *want = getenv("TP_KERN_ISA"); /* benchmarks: pin an ISA this CPU has */
    if (want && *want) {
        int found = 0;
        for (int i = 0; i < g_n_isas; i++)
            if (strcmp(want, g_isas[i].name) == 0) g_best = &g_isas[i], found = 1;
        if (!found)
            tp_log(TP_LOG_WARN, "kernels", "TP_KERN_ISA=%s is not available on this CPU/build; using %s", want,
                   g_best->name);
    }
    atomic_store(&g_cur, g_best);
#if defined(__x86_64__) || defined(_M_X64)
    g_pf_best = cpu_prefetch();
#else
    g_pf_best = TP_KERN_PF_L1;
#endif
    const char *pf = getenv("TP_KERN_PREFETCH"); /* benchmarks and CPUs not measured: pin the level */
    if (pf && *pf && !prefetch_parse(pf, &g_pf_best))
        tp_log(TP_LOG_WARN, "kernels", "TP_KERN_PREFETCH=%s is not l1 or l2; using %s", pf,
               tp_kern_prefetch_name(g_pf_best));
    atomic_store(&g_pf_cur, (int)g_pf_best);
#if defined(TP_BLAS_OPENBLAS)
    openblas_set_num_threads(1); /* rows are already split over our own pool */
#endif
}

static const struct tp_kern_ops *ops(void)
{
    pthread_once(&g_once, choose_isa);
    return atomic_load_explicit(&g_cur, memory_order_relaxed);
}

const char *tp_kern_isa(void) { return ops()->name; }
const struct tp_kern_ops *tp_kern_ops_current(void) { return ops(); }
const struct tp_kern_ops *tp_kern_ops_scalar(void)
{
    pthread_once(&g_once, choose_isa);
    return &g_scalar;
}

void tp_kern_force_scalar(int on)
{
    pthread_once(&g_once, choose_isa);
    atomic_store(&g_cur, on ? &g_scalar : g_best);
}

int tp_kern_isa_count(void)
{
    pthread_once(&g_once, choose_isa);
    return g_n_isas;
}

const char *tp_kern_isa_name(int i)
{
    pthread_once(&g_once, choose_isa);
    return i >= 0 && i < g_n_isas ? g_isas[i].name : NULL;
}

enum tp_status tp_kern_force_isa(const char *name)
{
    pthread_once(&g_once, choose_isa);
    if (!name || !*name) {
        atomic_store(&g_cur, g_best);
        return TP_OK;
    }
    for (int i = 0; i < g_n_isas; i++) {
        if (strcmp(name, g_isas[i].name) == 0) {
            atomic_store(&g_cur, &g_isas[i]);
            return TP_OK;
        }
    }
    return TP_ERR_UNSUPPORTED;
}

enum tp_kern_prefetch tp_kern_prefetch(void)
{
    pthread_once(&g_once, choose_isa);
    return (enum tp_kern_prefetch)atomic_load_explicit(&g_pf_cur, memory_order_relaxed);
}

const char *tp_kern_prefetch_name(enum tp_kern_prefetch p) { return p == TP_KERN_PF_L2 ? "l2" : "l1"; }

enum tp_status tp_kern_force_prefetch(const char *name)
{
    pthread_once(&g_once, choose_isa);
    if (!name || !*name) {
        atomic_store(&g_pf_cur, (int)g_pf_best);
        return TP_OK;
    }
    enum tp_kern_prefetch p;
    if (!prefetch_parse(name, &p)) return TP_ERR_INVALID_ARG;
    atomic_store(&g_pf_cur, (int)p);
    return TP_OK;
}

size_t tp_kern_row_bytes(enum tp_wtype t, int64_t n)
{
    int64_t be = tp_wtype_block_elems(t);
    if (be <= 0 || n < 0 || n % be) return 0;
    return (size_t)(n / be) * tp_wtype_block_bytes(t);
}

size_t tp_kern_act_row_bytes(enum tp_wtype wt, int64_t n)
{
    switch (wt) {
    case TP_WTYPE_F32:
    case TP_WTYPE_F16:
    case TP_WTYPE_BF16: return (size_t)n * sizeof(float);
    case TP_WTYPE_Q8_0:
    case TP_WTYPE_Q4_0:
    case TP_WTYPE_MXFP4: return n % TP_QK ? 0 : TP_A8_ROW_BYTES(n);
    case TP_WTYPE_Q4_K:
    case TP_WTYPE_Q5_K:
    case TP_WTYPE_Q6_K: return n % TP_QK_K ? 0 : TP_Q8K_ROW_BYTES(n);
    case TP_WTYPE_MLX_Q4_G32:
    case TP_WTYPE_MLX_Q4_G64:
    case TP_WTYPE_MLX_Q8_G32:
    case TP_WTYPE_MLX_Q8_G64: return tp_kern_mlx_act_row_bytes(wt, n);
    default: return 0;
    }
}

void tp_kern_quant_a8_scalar(const float *x, void *out, int64_t n, int kshift)
{
    int8_t *qs = out;
    float *dd = (float *)(qs + n);
    int32_t *cc = (int32_t *)(dd + n / TP_QK);
    for (int64_t b = 0; b < n / TP_QK; b++) {
        const float *xb = x + b * TP_QK;
        float amax = 0.0f;
        for (int i = 0; i < TP_QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        dd[b] = d;
        /* nearbyintf = round half to even, as the SIMD conversions do */
        for (int i = 0; i < TP_QK; i++) qs[b * TP_QK + i] = (int8_t)nearbyintf(xb[i] * id);
        for (int j = 0; j < 8; j++) {
            const int8_t *q = qs + b * TP_QK + 4 * j;
            cc[b * 8 + j] = -(((int32_t)q[0] + q[1] + q[2] + q[3]) * (1 << kshift));
        }
    }
}

enum tp_wtype tp_kern_act_class(enum tp_wtype wt)
{
    switch (wt) {
    case TP_WTYPE_F16:
    case TP_WTYPE_BF16: return TP_WTYPE_F32;
    case TP_WTYPE_Q5_K:
    case TP_WTYPE_Q6_K: return TP_WTYPE_Q4_K;
    default: return wt;
    }
}

int64_t tp_kern_act_block(enum tp_wtype wt)
{
    switch (tp_kern_act_class(wt)) {
    case TP_WTYPE_F32: return 1;
    case TP_WTYPE_Q8_0:
    case TP_WTYPE_Q4_0:
    case TP_WTYPE_MXFP4: return TP_QK;
    case TP_WTYPE_Q4_K: return TP_QK_K;
    default: return 0;
    }
}

/* The blocks are prepared as a row of their own in scratch, and each region of that row (kernels_impl.h:
 * a8 qs, d, c and s; Q8_K blocks and pair sums) is copied to where the whole row keeps those blocks. */
void tp_kern_prepare_act_blocks(enum tp_wtype wt, const float *x, void *xq, int64_t n, int64_t b0, int64_t b1,
                                void *scratch)
{
    const int64_t B = tp_kern_act_block(wt), k = b1 - b0, m = k * B;
    TP_ASSERT(B > 0 && n % B == 0 && 0 <= b0 && b0 <= b1 && b1 * B <= n);
    if (k == 0) return;
    char *o = xq;
    const char *q = scratch;
    switch (tp_kern_act_class(wt)) {
    case TP_WTYPE_F32: memcpy(o + (size_t)b0 * sizeof(float), x + b0, (size_t)k * sizeof(float)); return;
    case TP_WTYPE_Q4_K:
        tp_kern_prepare_act(wt, x + b0 * B, scratch, m);
        memcpy(o + (size_t)b0 * sizeof(tp_blk_q8_k), q, (size_t)k * sizeof(tp_blk_q8_k));
        memcpy((void *)TP_Q8K_PAIR(o, n, b0), TP_Q8K_PAIR(q, m, 0), (size_t)k * TP_Q8K_PAIRS * sizeof(int16_t));
        return;
    default: /* a8: qs, d, c (8 per block), s */
        tp_kern_prepare_act(wt, x + b0 * B, scratch, m);
        memcpy(o + b0 * B, q, (size_t)m);
        memcpy((void *)(TP_A8_D(o, n) + b0), TP_A8_D(q, m), (size_t)k * sizeof(float));
        memcpy((void *)(TP_A8_C(o, n) + 8 * b0), TP_A8_C(q, m), (size_t)k * 8 * sizeof(int32_t));
        memcpy((void *)(TP_A8_S(o, n) + b0), TP_A8_S(q, m), (size_t)k * sizeof(int32_t));
        return;
    }
}

void tp_kern_prepare_act(enum tp_wtype wt, const float *x, void *xq, int64_t n)
{
    switch (wt) {
    case TP_WTYPE_F32:
    case TP_WTYPE_F16:
    case TP_WTYPE_BF16:
        if ((const void *)x != xq) memcpy(xq, x, (size_t)n * sizeof(float));
        break;
    case TP_WTYPE_Q8_0:
    case TP_WTYPE_Q4_0:
    case TP_WTYPE_MXFP4: { /* MXFP4: the Q8_0 row (its corrections c, s go unused) */
        const struct tp_kern_ops *o = ops();
        (o->quant_a8 ? o->quant_a8 : tp_kern_quant_a8_scalar)(x, xq, n, TP_A8_KSHIFT(wt));
        /* whole-block corrections s[b] (kernels_impl.h), the same for every ISA */
        const int32_t *c = TP_A8_C(xq, n);
        char *s = (char *)TP_A8_S(xq, n);
        for (int64_t b = 0; b < n / TP_QK; b++) {
            int32_t v = 0;
            for (int j = 0; j < 8; j++) {
                int32_t cj;
                memcpy(&cj, c + 8 * b + j, sizeof cj);
                v += cj;
            }
            memcpy(s + (size_t)b * sizeof v, &v, sizeof v);
        }
        break;
    }
    case TP_WTYPE_Q4_K:
    case TP_WTYPE_Q5_K:
    case TP_WTYPE_Q6_K: {
        const struct tp_kern_ops *o = ops();
        (o->quant_q8k ? o->quant_q8k : tp_kq_quant_q8k)(x, xq, n);
        tp_kq_act_pairs(xq, n);
        break;
    }
    case TP_WTYPE_MLX_Q4_G32:
    case TP_WTYPE_MLX_Q4_G64:
    case TP_WTYPE_MLX_Q8_G32:
    case TP_WTYPE_MLX_Q8_G64: tp_kern_mlx_prepare_act(wt, x, xq, n); break;
    default: TP_ASSERT(!"tp_kern_prepare_act: unsupported weight type");
    }
}

#if defined(TP_BLAS_OPENBLAS) || defined(TP_BLAS_ACCELERATE)
/* y[t, r0:r1] = x[t, :] . W[r0:r1, :]^T for f32 weights, one sgemm. */
static int blas_f32(const void *w, size_t w_row_bytes, int64_t n_cols, const void *xq, size_t xq_row_bytes,
                    int n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1)
{
    if (w_row_bytes % sizeof(float) || xq_row_bytes % sizeof(float)) return 0;
    const float *wr = (const float *)((const char *)w + (size_t)r0 * w_row_bytes);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tok, (int)(r1 - r0), (int)n_cols, 1.0f, xq,
                (int)(xq_row_bytes / sizeof(float)), wr, (int)(w_row_bytes / sizeof(float)), 0.0f, y + r0,
                (int)y_stride);
    return 1;
}
#endif

void tp_kern_matmul(enum tp_wtype wt, const void *w, size_t w_row_bytes, int64_t n_cols, const void *xq,
                    size_t xq_row_bytes, int n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1)
{
    if (r1 <= r0 || n_tok <= 0) return;
    TP_ASSERT((int)wt >= 0 && (int)wt < TP_WTYPE_COUNT);
    const struct tp_kern_ops *o = ops();
#if defined(TP_BLAS_OPENBLAS) || defined(TP_BLAS_ACCELERATE)
    if (wt == TP_WTYPE_F32 && n_tok >= TP_BLAS_MIN_TOKENS && o != &g_scalar && !o->f32_beats_blas &&
        blas_f32(w, w_row_bytes, n_cols, xq, xq_row_bytes, n_tok, y, y_stride, r0, r1))
        return;
#endif
    tp_kern_matmul_fn fn = o->matmul[wt] ? o->matmul[wt] : g_scalar.matmul[wt];
    TP_ASSERT(fn != NULL);
    fn(w, w_row_bytes, n_cols, xq, xq_row_bytes, n_tok, y, y_stride, r0, r1);
}

/* ------------------------------------------------------------ reference (de)quantizers */

void tp_kern_dequant(enum tp_wtype t, const void *src, float *dst, int64_t n)
{
    switch (t) {
    case TP_WTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case TP_WTYPE_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = tp_fp16_to_f32(s[i]);
        break;
    }
    case TP_WTYPE_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = tp_bf16_to_f32(s[i]);
        break;
    }
    case TP_WTYPE_Q8_0: {
        const tp_blk_q8_0 *b = src;
        for (int64_t k = 0; k < n / TP_QK; k++) {
            float d = tp_fp16_to_f32(b[k].d);
            for (int i = 0; i < TP_QK; i++) dst[k * TP_QK + i] = (float)b[k].qs[i] * d;
        }
        break;
    }
    case TP_WTYPE_Q4_0: {
        const tp_blk_q4_0 *b = src;
        for (int64_t k = 0; k < n / TP_QK; k++) {
            float d = tp_fp16_to_f32(b[k].d);
            for (int i = 0; i < TP_QK / 2; i++) {
                dst[k * TP_QK + i] = (float)((b[k].qs[i] & 0x0F) - 8) * d;
                dst[k * TP_QK + i + TP_QK / 2] = (float)((b[k].qs[i] >> 4) - 8) * d;
            }
        }
        break;
    }
    case TP_WTYPE_Q4_K:
    case TP_WTYPE_Q5_K:
    case TP_WTYPE_Q6_K: tp_kq_dequant(t, src, dst, n); break;
    case TP_WTYPE_MXFP4: tp_mxfp4_dequant(src, dst, n); break;
    default: TP_ASSERT(!"tp_kern_dequant: unsupported type");
    }
}

size_t tp_kern_quantize(enum tp_wtype t, const float *src, void *dst, int64_t n)
{
    switch (t) {
    case TP_WTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case TP_WTYPE_F16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = tp_f32_to_fp16(src[i]);
        break;
    }
    case TP_WTYPE_BF16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = tp_f32_to_bf16(src[i]);
        break;
    }
    case TP_WTYPE_Q8_0: { /* as ggml's quantize_row_q8_0_ref */
        tp_blk_q8_0 *b = dst;
        for (int64_t k = 0; k < n / TP_QK; k++) {
            const float *x = src + k * TP_QK;
            float amax = 0.0f;
            for (int i = 0; i < TP_QK; i++) amax = fmaxf(amax, fabsf(x[i]));
            float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            b[k].d = tp_f32_to_fp16(d);
            for (int i = 0; i < TP_QK; i++) b[k].qs[i] = (int8_t)roundf(x[i] * id);
        }
        break;
    }
    case TP_WTYPE_Q4_0: { /* as ggml's quantize_row_q4_0_ref */
        tp_blk_q4_0 *b = dst;
        for (int64_t k = 0; k < n / TP_QK; k++) {
            const float *x = src + k * TP_QK;
            float amax = 0.0f, max = 0.0f;
            for (int i = 0; i < TP_QK; i++) {
                if (fabsf(x[i]) > amax) {
                    amax = fabsf(x[i]);
                    max = x[i];
                }
            }
            float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            b[k].d = tp_f32_to_fp16(d);
            for (int i = 0; i < TP_QK / 2; i++) {
                int q0 = (int)(x[i] * id + 8.5f), q1 = (int)(x[i + TP_QK / 2] * id + 8.5f);
                q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
                q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
                b[k].qs[i] = (uint8_t)(q0 | (q1 << 4));
            }
        }
        break;
    }
    case TP_WTYPE_Q4_K:
    case TP_WTYPE_Q5_K:
    case TP_WTYPE_Q6_K: tp_kq_quantize(t, src, dst, n); break;
    case TP_WTYPE_MXFP4: tp_mxfp4_quantize(src, dst, n); break;
    default: TP_ASSERT(!"tp_kern_quantize: unsupported type"); return 0;
    }
    return tp_kern_row_bytes(t, n);
}

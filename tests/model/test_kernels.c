/*
 * tests/model/test_kernels.c - weight-type table and matrix kernels.
 *
 * Oracles:
 *  - hand-computed dequantization of known Q8_0 / Q4_0 / F16 / BF16 blocks;
 *  - quantize -> dequantize round trips within each format's error bound;
 *  - the scalar matmul against a double-precision dot of the dequantized
 *    operands (checks the reference itself);
 *  - every SIMD instruction set this CPU has against the scalar reference on
 *    identical inputs, for many shapes (odd row counts, row ranges not
 *    starting at 0, n_tok 1..20 for Q8_0/Q4_0 and 1..17 for the others,
 *    several n_cols), by normalized MSE
 *    nmse = sum (y - ref)^2 / sum ref^2 with these thresholds:
 *      quantized types, SIMD vs scalar: 1e-11.  Both compute the same exact
 *        integer block dots; only the float summation order of <= 160 block
 *        terms differs (relative rounding ~ sqrt(nb) * 2^-24 ~ 1e-6 rms, i.e.
 *        nmse ~ 1e-13), so 1e-11 leaves 100x margin yet catches any wrong
 *        element, block or scale (those give nmse >= 1e-4).
 *      float types vs the f64 reference: 1e-10 (f32 accumulation of up to
 *        1100 products: relative error ~ sqrt(n) * 2^-24 ~ 2e-6 rms).
 *  - activation quantization: SIMD bit-identical to scalar.
 *  - rows outside [r0, r1) are never written.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "common/common.h"
#include "model/kernels.h"
#include "model/model.h"
#include "tp_test.h"

/* ------------------------------------------------------------------ helpers */

static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }
static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
/* uniform in [-1, 1) */
static float rng_f(void) { return (float)((double)rng_u32() / 4294967296.0 * 2.0 - 1.0); }

/* Random values with varying magnitude per 32-block (realistic: scales differ). */
static void fill_random(float *x, int64_t n)
{
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = 0.05f + 2.0f * (rng_f() + 1.0f);
        x[i] = rng_f() * scale;
    }
}

static double nmse(const float *y, const double *ref, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? num / den : num;
}

static const enum tp_wtype kTypes[] = {TP_WTYPE_F32,  TP_WTYPE_F16,  TP_WTYPE_BF16, TP_WTYPE_Q8_0, TP_WTYPE_Q4_0,
                                       TP_WTYPE_Q4_K, TP_WTYPE_Q5_K, TP_WTYPE_Q6_K, TP_WTYPE_MXFP4};

static int is_quant(enum tp_wtype t) { return tp_wtype_block_elems(t) > 1; }
static int is_kquant(enum tp_wtype t) { return tp_wtype_block_elems(t) == 256; }

/* ------------------------------------------------------------------ type table */

static void test_wtype_table(void)
{
    CU_ASSERT_STRING_EQUAL(tp_wtype_name(TP_WTYPE_Q4_0), "q4_0");
    CU_ASSERT_STRING_EQUAL(tp_wtype_name(TP_WTYPE_BF16), "bf16");
    CU_ASSERT_STRING_EQUAL(tp_wtype_name((enum tp_wtype)4), "type#4");
    CU_ASSERT_STRING_EQUAL(tp_wtype_name((enum tp_wtype)1000), "type#unknown");
    enum tp_wtype t;
    CU_ASSERT_EQUAL(tp_wtype_parse("Q8_0", &t), TP_OK);
    CU_ASSERT_EQUAL(t, TP_WTYPE_Q8_0);
    CU_ASSERT_EQUAL(tp_wtype_parse("q6_k", &t), TP_OK);
    CU_ASSERT_EQUAL(t, TP_WTYPE_Q6_K);
    CU_ASSERT_NOT_EQUAL(tp_wtype_parse("q9_0", &t), TP_OK);
    CU_ASSERT_NOT_EQUAL(tp_wtype_parse(NULL, &t), TP_OK);
    /* ggml's sizes */
    CU_ASSERT_EQUAL(tp_wtype_block_elems(TP_WTYPE_Q4_0), 32);
    CU_ASSERT_EQUAL(tp_wtype_block_bytes(TP_WTYPE_Q4_0), 18);
    CU_ASSERT_EQUAL(tp_wtype_block_bytes(TP_WTYPE_Q8_0), 34);
    CU_ASSERT_EQUAL(tp_wtype_block_elems(TP_WTYPE_Q6_K), 256);
    CU_ASSERT_EQUAL(tp_wtype_block_bytes(TP_WTYPE_Q4_K), 144);
    CU_ASSERT_EQUAL(tp_wtype_block_bytes(TP_WTYPE_Q5_K), 176);
    CU_ASSERT_EQUAL(tp_wtype_block_bytes(TP_WTYPE_Q6_K), 210);
    CU_ASSERT_EQUAL(tp_wtype_block_bytes(TP_WTYPE_BF16), 2);
    CU_ASSERT_EQUAL(tp_wtype_block_elems(TP_WTYPE_MXFP4), 32);
    CU_ASSERT_EQUAL(tp_wtype_block_bytes(TP_WTYPE_MXFP4), 17);
    CU_ASSERT_EQUAL((int)TP_WTYPE_MXFP4, 39); /* GGUF's ggml_type id */
    CU_ASSERT_STRING_EQUAL(tp_wtype_name(TP_WTYPE_MXFP4), "mxfp4");
    CU_ASSERT_EQUAL(tp_wtype_block_bytes((enum tp_wtype)5), 0);
    for (size_t i = 0; i < TP_ARRAY_LEN(kTypes); i++) CU_ASSERT(tp_wtype_supported(kTypes[i]));
    CU_ASSERT(!tp_wtype_supported(TP_WTYPE_Q4_1));
    CU_ASSERT(!tp_wtype_supported((enum tp_wtype)-1));
    CU_ASSERT_EQUAL(tp_kern_row_bytes(TP_WTYPE_Q4_0, 64), 36);
    CU_ASSERT_EQUAL(tp_kern_row_bytes(TP_WTYPE_Q4_0, 33), 0);
    CU_ASSERT_EQUAL(tp_kern_row_bytes(TP_WTYPE_F16, 7), 14);
}

static void test_isa_choice(void)
{
    CU_ASSERT(tp_kern_isa_count() >= 1);
    CU_ASSERT_STRING_EQUAL(tp_kern_isa_name(0), "scalar");
    CU_ASSERT_PTR_NULL(tp_kern_isa_name(tp_kern_isa_count()));
    CU_ASSERT_EQUAL(tp_kern_force_isa("no-such-isa"), TP_ERR_UNSUPPORTED);
    const char *best = tp_kern_isa_name(tp_kern_isa_count() - 1);
    if (!getenv("TP_KERN_ISA")) CU_ASSERT_STRING_EQUAL(tp_kern_isa(), best);
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        CU_ASSERT_EQUAL(tp_kern_force_isa("avx2"), TP_OK);
    const int avx512 = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2") &&
                       __builtin_cpu_supports("fma");
    unsigned a, b, c, d; /* AVX-VNNI: CPUID leaf 7 subleaf 1, EAX bit 4 */
    const int avxvnni = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1u) && __builtin_cpu_supports("avx2") &&
                        __builtin_cpu_supports("fma");
    CU_ASSERT_EQUAL(tp_kern_force_isa("avx2-vnni"), avxvnni ? TP_OK : TP_ERR_UNSUPPORTED);
    if (avx512) CU_ASSERT_STRING_EQUAL(best, "avx512-vnni");
    if (avxvnni && !avx512) CU_ASSERT_STRING_EQUAL(best, "avx2-vnni");
#endif
    tp_kern_force_scalar(1);
    CU_ASSERT_STRING_EQUAL(tp_kern_isa(), "scalar");
    tp_kern_force_scalar(0);
    CU_ASSERT_EQUAL(tp_kern_force_isa(NULL), TP_OK);
    printf("\n  kernels: ISA %s (%d available), prefetch %s\n", tp_kern_isa(), tp_kern_isa_count(),
           tp_kern_prefetch_name(tp_kern_prefetch()));
}

/* The prefetch level: L2 on AMD family 19h, L1 elsewhere, unless TP_KERN_PREFETCH pins it; forced and restored. */
static void test_prefetch_choice(void)
{
    enum tp_kern_prefetch want = TP_KERN_PF_L1;
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && __get_cpuid(1, &a, &b, &c, &d)) { /* "Auth"enticAMD */
        const unsigned base = a >> 8 & 0xFu, fam = base + (base == 0xFu ? (a >> 20 & 0xFFu) : 0u);
        if (fam == 0x19) want = TP_KERN_PF_L2;
    }
#endif
    const char *env = getenv("TP_KERN_PREFETCH");
    if (env && (strcmp(env, "l1") == 0 || strcmp(env, "l2") == 0)) want = env[1] == '1' ? TP_KERN_PF_L1 : TP_KERN_PF_L2;
    CU_ASSERT_EQUAL(tp_kern_prefetch(), want);
    CU_ASSERT_STRING_EQUAL(tp_kern_prefetch_name(TP_KERN_PF_L1), "l1");
    CU_ASSERT_STRING_EQUAL(tp_kern_prefetch_name(TP_KERN_PF_L2), "l2");
    CU_ASSERT_EQUAL(tp_kern_force_prefetch("l2"), TP_OK);
    CU_ASSERT_EQUAL(tp_kern_prefetch(), TP_KERN_PF_L2);
    CU_ASSERT_EQUAL(tp_kern_force_prefetch("L1"), TP_ERR_INVALID_ARG); /* the names are lower case */
    CU_ASSERT_EQUAL(tp_kern_force_prefetch("l3"), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(tp_kern_prefetch(), TP_KERN_PF_L2); /* a refused name changes nothing */
    CU_ASSERT_EQUAL(tp_kern_force_prefetch("l1"), TP_OK);
    CU_ASSERT_EQUAL(tp_kern_prefetch(), TP_KERN_PF_L1);
    CU_ASSERT_EQUAL(tp_kern_force_prefetch(""), TP_OK);
    CU_ASSERT_EQUAL(tp_kern_prefetch(), want);
    CU_ASSERT_EQUAL(tp_kern_force_prefetch("l2"), TP_OK);
    CU_ASSERT_EQUAL(tp_kern_force_prefetch(NULL), TP_OK);
    CU_ASSERT_EQUAL(tp_kern_prefetch(), want);
}

/* ------------------------------------------------------------------ exact dequantization */

static void test_dequant_known_blocks(void)
{
    /* Q8_0: d = 0.5 (fp16 0x3800), qs = -128, -1, 0, 1, 127, then i - 16 */
    uint8_t q8[34];
    q8[0] = 0x00;
    q8[1] = 0x38;
    int8_t qs8[32];
    for (int i = 0; i < 32; i++) qs8[i] = (int8_t)(i - 16);
    qs8[0] = -128;
    qs8[1] = -1;
    qs8[2] = 0;
    qs8[3] = 1;
    qs8[4] = 127;
    memcpy(q8 + 2, qs8, 32);
    float out[32];
    tp_kern_dequant(TP_WTYPE_Q8_0, q8, out, 32);
    CU_ASSERT_EQUAL(out[0], -64.0f);
    CU_ASSERT_EQUAL(out[1], -0.5f);
    CU_ASSERT_EQUAL(out[2], 0.0f);
    CU_ASSERT_EQUAL(out[3], 0.5f);
    CU_ASSERT_EQUAL(out[4], 63.5f);
    CU_ASSERT_EQUAL(out[31], 7.5f);

    /* Q4_0: d = 2.0 (fp16 0x4000); byte j: low nibble = element j, high = element j+16.
     * qs[0] = 0x9F -> e0 = (15-8)*2 = 14, e16 = (9-8)*2 = 2;
     * qs[1] = 0x08 -> e1 = 0, e17 = (0-8)*2 = -16;  qs[j>=2] = 0x7A -> e=(10-8)*2=4, e+16=(7-8)*2=-2 */
    uint8_t q4[18] = {0x00, 0x40, 0x9F, 0x08};
    for (int j = 2; j < 16; j++) q4[2 + j] = 0x7A;
    tp_kern_dequant(TP_WTYPE_Q4_0, q4, out, 32);
    CU_ASSERT_EQUAL(out[0], 14.0f);
    CU_ASSERT_EQUAL(out[16], 2.0f);
    CU_ASSERT_EQUAL(out[1], 0.0f);
    CU_ASSERT_EQUAL(out[17], -16.0f);
    CU_ASSERT_EQUAL(out[5], 4.0f);
    CU_ASSERT_EQUAL(out[31], -2.0f);

    /* MXFP4: e = 128 -> scale 2^(128-128) = 1 on the doubled E2M1 table (0 1 2 3 4 6 8 12, then
     * negated): byte j low nibble = element j, high = element j+16.  qs[0] = 0xF7 -> e0 = 12 (6.0
     * doubled), e16 = -12; qs[1] = 0x95 -> e1 = 6, e17 = -1; qs[j>=2] = 0x80 -> 0 and -0.
     * e = 126 scales everything by 1/4. */
    uint8_t mx[17] = {128, 0xF7, 0x95};
    for (int j = 2; j < 16; j++) mx[1 + j] = 0x80;
    tp_kern_dequant(TP_WTYPE_MXFP4, mx, out, 32);
    CU_ASSERT_EQUAL(out[0], 12.0f);
    CU_ASSERT_EQUAL(out[16], -12.0f);
    CU_ASSERT_EQUAL(out[1], 6.0f);
    CU_ASSERT_EQUAL(out[17], -1.0f);
    CU_ASSERT_EQUAL(out[5], 0.0f);
    mx[0] = 126;
    tp_kern_dequant(TP_WTYPE_MXFP4, mx, out, 32);
    CU_ASSERT_EQUAL(out[0], 3.0f);
    CU_ASSERT_EQUAL(out[17], -0.25f);
    /* quantizing values on the grid is exact: amax 6 -> e = floor(log2 6) - 2 + 127 = 127 */
    {
        float g[32], back[32];
        static const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
        for (int i = 0; i < 32; i++) g[i] = (i & 1 ? -1.0f : 1.0f) * grid[i % 8];
        uint8_t qb[17];
        tp_kern_quantize(TP_WTYPE_MXFP4, g, qb, 32);
        CU_ASSERT_EQUAL(qb[0], 127);
        tp_kern_dequant(TP_WTYPE_MXFP4, qb, back, 32);
        CU_ASSERT_EQUAL(memcmp(g, back, sizeof g), 0);
    }

    /* F16: 0x3C00 = 1, 0xC000 = -2, 0x3555 = 0.333251953125; BF16: 0x3F80 = 1, 0xC0A0 = -5 */
    uint16_t h[3] = {0x3C00, 0xC000, 0x3555};
    tp_kern_dequant(TP_WTYPE_F16, h, out, 3);
    CU_ASSERT_EQUAL(out[0], 1.0f);
    CU_ASSERT_EQUAL(out[1], -2.0f);
    CU_ASSERT_EQUAL(out[2], 0.333251953125f);
    uint16_t bh[2] = {0x3F80, 0xC0A0};
    tp_kern_dequant(TP_WTYPE_BF16, bh, out, 2);
    CU_ASSERT_EQUAL(out[0], 1.0f);
    CU_ASSERT_EQUAL(out[1], -5.0f);

    /* a hand-computed Q4_0 x activation dot: weights above (row of 32), x = 1..32 */
    float x[32], ref = 0.0f;
    tp_kern_dequant(TP_WTYPE_Q4_0, q4, out, 32);
    for (int i = 0; i < 32; i++) {
        x[i] = (float)(i % 5) - 2.0f; /* -2..2: quantizes exactly (d = 2/127 * k) up to rounding */
        ref += out[i] * x[i];
    }
    uint8_t xq[128];
    CU_ASSERT_FATAL(tp_kern_act_row_bytes(TP_WTYPE_Q4_0, 32) <= sizeof xq);
    for (int i = 0; i < tp_kern_isa_count(); i++) {
        CU_ASSERT_EQUAL_FATAL(tp_kern_force_isa(tp_kern_isa_name(i)), TP_OK);
        tp_kern_prepare_act(TP_WTYPE_Q4_0, x, xq, 32);
        float y = 0.0f;
        tp_kern_matmul(TP_WTYPE_Q4_0, q4, 18, 32, xq, 0, 1, &y, 1, 0, 1);
        /* x = +-2 quantize to +-127 exactly, +-1 to +-63.5 -> 64: error 0.5/63.5 ~ 0.8% of those terms */
        CU_ASSERT(fabsf(y - ref) <= 0.01f * fabsf(ref) + 0.5f);
    }
    tp_kern_force_isa(NULL);
}

static void test_dequant_known_kquant(void)
{
    float out[256];
    /* Q4_K: d = 1 (0x3C00), dmin = 0.5 (0x3800); sub-block 0: sc 2, m 3; 1: sc 5, m 1;
     * 4: sc 33 (high bits 2), m 17 (high bits 1) -> packed scales bytes 0=2|2<<6, 4=3|1<<6, 8=1|1<<4, 1=5, 5=1 */
    uint8_t q4k[144] = {0};
    q4k[0] = 0x00, q4k[1] = 0x3C, q4k[2] = 0x00, q4k[3] = 0x38;
    uint8_t *sc = q4k + 4, *qs = q4k + 16;
    sc[0] = 2 | (2 << 6);
    sc[4] = 3 | (1 << 6);
    sc[8] = 1 | (1 << 4);
    sc[1] = 5;
    sc[5] = 1;
    qs[0] = 0x7A;  /* element 0: 10 (sub-block 0), element 32: 7 (sub-block 1) */
    qs[64] = 0x03; /* element 128: 3 (sub-block 4) */
    tp_kern_dequant(TP_WTYPE_Q4_K, q4k, out, 256);
    CU_ASSERT_EQUAL(out[0], 18.5f);  /* 1*2*10 - 0.5*3 */
    CU_ASSERT_EQUAL(out[1], -1.5f);  /* 1*2*0 - 0.5*3 */
    CU_ASSERT_EQUAL(out[32], 34.5f); /* 1*5*7 - 0.5*1 */
    CU_ASSERT_EQUAL(out[128], 90.5f); /* 1*33*3 - 0.5*17 */
    CU_ASSERT_EQUAL(out[255], 0.0f); /* sub-block 7: sc 0, m 0 */

    /* Q5_K: same scales; qh[0] bit 0 adds 16 to element 0, bit 1 to element 32 */
    uint8_t q5k[176] = {0};
    memcpy(q5k, q4k, 16);
    q5k[16] = 0x03;      /* qh[0] */
    q5k[16 + 32] = 0x7A; /* qs[0] */
    tp_kern_dequant(TP_WTYPE_Q5_K, q5k, out, 256);
    CU_ASSERT_EQUAL(out[0], 50.5f);  /* 2*(10+16) - 1.5 */
    CU_ASSERT_EQUAL(out[32], 114.5f); /* 5*(7+16) - 0.5 */
    CU_ASSERT_EQUAL(out[1], -1.5f);

    /* Q6_K: d = 0.5; element 0 = ql[0]&15 | (qh[0]&3)<<4 = 5|32 -> 37-32 = 5, scale[0] = 4 -> 10;
     * element 32 = ql[32]&15 | ((qh[0]>>2)&3)<<4 = 15 -> -17, scale[2] = -3 -> 25.5;
     * element 64 = ql[0]>>4 | ((qh[0]>>4)&3)<<4 = 0 -> -32, scale[4] = 1 -> -16 */
    uint8_t q6k[210] = {0};
    q6k[0] = 0x05;
    q6k[32] = 0x0F;
    q6k[128] = 0x02;
    int8_t *s6 = (int8_t *)(q6k + 192);
    s6[0] = 4;
    s6[2] = -3;
    s6[4] = 1;
    q6k[208] = 0x00, q6k[209] = 0x38;
    tp_kern_dequant(TP_WTYPE_Q6_K, q6k, out, 256);
    CU_ASSERT_EQUAL(out[0], 10.0f);
    CU_ASSERT_EQUAL(out[32], 25.5f);
    CU_ASSERT_EQUAL(out[64], -16.0f);
    CU_ASSERT_EQUAL(out[16], 0.0f); /* scale[1] = 0 */
}

/* ------------------------------------------------------------------ round trips */

static void test_quant_roundtrip(void)
{
    rng_seed(7);
    enum { N = 256 * 8 };
    float *x = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    void *q = malloc(N * 4);
    CU_ASSERT_FATAL(x && back && q);
    for (size_t ti = 0; ti < TP_ARRAY_LEN(kTypes); ti++) {
        enum tp_wtype t = kTypes[ti];
        for (int i = 0; i < N; i++) x[i] = rng_f(); /* uniform [-1,1): variance 1/3 */
        CU_ASSERT_EQUAL(tp_kern_quantize(t, x, q, N), tp_kern_row_bytes(t, N));
        tp_kern_dequant(t, q, back, N);
        double num = 0.0, den = 0.0;
        int bad = 0;
        const int bs = t == TP_WTYPE_Q6_K ? 16 : 32; /* scale granularity */
        for (int b = 0; b < N / bs; b++) {
            float amax = 0.0f;
            for (int i = 0; i < bs; i++) amax = fmaxf(amax, fabsf(x[b * bs + i]));
            for (int i = b * bs; i < b * bs + bs; i++) {
                float err = fabsf(back[i] - x[i]), bound;
                switch (t) {
                case TP_WTYPE_F32: bound = 0.0f; break;
                case TP_WTYPE_F16: bound = fabsf(x[i]) * 0x1p-11f + 0x1p-25f; break;  /* half ulp */
                case TP_WTYPE_BF16: bound = fabsf(x[i]) * 0x1p-8f; break;
                /* d = amax/127 stored as fp16 (rel. error 2^-11): |err| <= d/2 + 127 d 2^-11 */
                case TP_WTYPE_Q8_0: bound = amax / 127.0f * (0.5f + 127.0f * 0x1p-11f) + 1e-7f; break;
                /* d = amax/8: rounding d/2, except the clamp at +amax (q=16->15): one d */
                case TP_WTYPE_Q4_0: bound = amax / 8.0f * (1.0f + 16.0f * 0x1p-11f) + 1e-7f; break;
                /* K-quants: sub-block step s ~ range/qmax (range <= 2 amax) with 6/8-bit scales:
                 * rounding s/2 plus scale/min quantization, bounded by one step of 2 amax/qmax */
                case TP_WTYPE_Q4_K: bound = 2.0f * amax / 15.0f; break;
                case TP_WTYPE_Q5_K: bound = 2.0f * amax / 31.0f; break;
                case TP_WTYPE_MXFP4: { /* nearest point of s x {0 .5 1 1.5 2 3 4 6}, s = 2^(floor(log2 amax) - 2):
                                        * half the local gap, or the clip above 6 s */
                    const float s4 = ldexpf(1.0f, (int)floorf(log2f(amax)) - 2), a = fabsf(x[i]);
                    bound = a > 6.0f * s4 ? a - 6.0f * s4 : a < 2.0f * s4 ? 0.25f * s4 : a < 4.0f * s4 ? 0.5f * s4 : s4;
                    bound *= 1.0f + 0x1p-20f;
                    break;
                }
                default: bound = amax / 31.0f; break; /* Q6_K: s = amax16/31, rounding s/2 + int8 scale */
                }
                if (err > bound) bad++;
                num += (double)(back[i] - x[i]) * (back[i] - x[i]);
                den += (double)x[i] * x[i];
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
        /* uniform rounding noise (step^2/12)/(1/3): Q8_0 step 1/127 -> 1.6e-5; Q4_0 1/8 -> 3.9e-3;
         * Q4_K 2/15 -> 4.4e-3; Q5_K 2/31 -> 1.0e-3; Q6_K 1/31 -> 2.6e-4 (limits ~1.5x, the K-quant
         * ones 2x for the 6-bit scale/min rounding); f16 ~ 2^-24/3; bf16 ~ 2^-18/3; MXFP4 on uniform
         * [-1, 1): 0.021 (a NumPy simulation of the same quantizer over 3.2M values), limit ~1.4x */
        double limit = t == TP_WTYPE_Q8_0   ? 2.5e-5
                       : t == TP_WTYPE_Q4_0 ? 6e-3
                       : t == TP_WTYPE_Q4_K ? 9e-3
                       : t == TP_WTYPE_Q5_K ? 2e-3
                       : t == TP_WTYPE_Q6_K ? 5e-4
                       : t == TP_WTYPE_F16  ? 1e-7
                       : t == TP_WTYPE_BF16 ? 1e-5
                       : t == TP_WTYPE_MXFP4 ? 3e-2
                                            : 0.0;
        double e = num / den;
        if (e > limit) printf("\n  %s round trip nmse %.3g > %.3g\n", tp_wtype_name(t), e, limit);
        CU_ASSERT(e <= limit);
        if (is_quant(t)) CU_ASSERT(e > limit / 20); /* it really quantized */
    }
    free(x);
    free(back);
    free(q);
}

/* tp_kern_act_class: every type of a class prepares the same bytes as the class's own type, at the best
 * ISA (the forward pass prepares one row per class and hands it to all of them); a type outside a
 * class is its own. */
static void test_act_class(void)
{
    rng_seed(12);
    enum { N = 256 * 3 };
    float x[N];
    fill_random(x, N);
    const enum tp_wtype same[][2] = {{TP_WTYPE_Q5_K, TP_WTYPE_Q4_K}, {TP_WTYPE_Q6_K, TP_WTYPE_Q4_K},
                                     {TP_WTYPE_F16, TP_WTYPE_F32},   {TP_WTYPE_BF16, TP_WTYPE_F32}};
    for (size_t k = 0; k < TP_ARRAY_LEN(same); k++) {
        CU_ASSERT_EQUAL(tp_kern_act_class(same[k][0]), same[k][1]);
        CU_ASSERT_EQUAL(tp_kern_act_class(same[k][1]), same[k][1]);
        const size_t rb = tp_kern_act_row_bytes(same[k][1], N);
        CU_ASSERT_FATAL(rb > 0 && tp_kern_act_row_bytes(same[k][0], N) == rb);
        uint8_t *a = malloc(rb), *b = malloc(rb);
        CU_ASSERT_FATAL(a && b);
        memset(a, 0x11, rb);
        memset(b, 0x22, rb);
        tp_kern_prepare_act(same[k][0], x, a, N);
        tp_kern_prepare_act(same[k][1], x, b, N);
        CU_ASSERT(memcmp(a, b, rb) == 0);
        free(a);
        free(b);
    }
    const enum tp_wtype own[] = {TP_WTYPE_Q4_0, TP_WTYPE_Q8_0, TP_WTYPE_MXFP4, TP_WTYPE_MLX_Q4_G32,
                                 TP_WTYPE_MLX_Q4_G64};
    for (size_t k = 0; k < TP_ARRAY_LEN(own); k++) CU_ASSERT_EQUAL(tp_kern_act_class(own[k]), own[k]);
}

/* tp_kern_prepare_act_blocks: a row prepared in block ranges, the ranges in any order, equals the row
 * prepared whole, byte for byte (the split prep of forward.c relies on it), at the best ISA; a range
 * leaves the bytes of the other blocks as they were.  MLX rows are prepared whole only. */
static void test_act_blocks(void)
{
    rng_seed(13);
    enum { N = 256 * 5 };
    float x[N];
    fill_random(x, N);
    const enum tp_wtype wts[] = {TP_WTYPE_Q4_0, TP_WTYPE_Q8_0, TP_WTYPE_MXFP4, TP_WTYPE_Q4_K,
                                 TP_WTYPE_Q6_K, TP_WTYPE_F32,  TP_WTYPE_BF16};
    for (size_t k = 0; k < TP_ARRAY_LEN(wts); k++) {
        const int64_t B = tp_kern_act_block(wts[k]), nb = N / B;
        CU_ASSERT_FATAL(B > 0 && N % B == 0);
        const size_t rb = tp_kern_act_row_bytes(wts[k], N);
        uint8_t *ref = malloc(rb), *got = malloc(rb), *one = malloc(rb), *scratch = malloc(rb);
        CU_ASSERT_FATAL(ref && got && one && scratch);
        tp_kern_prepare_act(wts[k], x, ref, N);
        const int64_t cut[] = {0, nb / 3, nb / 3 + 1, nb - 1, nb}; /* ranges [cut[i], cut[i + 1]), last first */
        memset(got, 0xA5, rb);
        for (int i = 3; i >= 0; i--) tp_kern_prepare_act_blocks(wts[k], x, got, N, cut[i], cut[i + 1], scratch);
        if (memcmp(ref, got, rb) != 0) printf("\n  %s: a row prepared in ranges differs\n", tp_wtype_name(wts[k]));
        CU_ASSERT(memcmp(ref, got, rb) == 0);
        /* one range: its bytes are the whole row's, and the row prepared from the other ranges on top of it
         * still equals the whole row: no range wrote another's bytes with wrong values */
        memset(one, 0xA5, rb);
        tp_kern_prepare_act_blocks(wts[k], x, one, N, cut[1], cut[2], scratch);
        size_t changed = 0, wrong = 0;
        for (size_t i = 0; i < rb; i++) {
            changed += one[i] != 0xA5;
            wrong += one[i] != 0xA5 && one[i] != ref[i];
        }
        CU_ASSERT(changed > 0 && changed < rb / 2);
        CU_ASSERT_EQUAL(wrong, 0);
        tp_kern_prepare_act_blocks(wts[k], x, one, N, 0, 0, scratch); /* empty: nothing */
        tp_kern_prepare_act_blocks(wts[k], x, one, N, cut[0], cut[1], scratch);
        tp_kern_prepare_act_blocks(wts[k], x, one, N, cut[2], nb, scratch);
        CU_ASSERT(memcmp(ref, one, rb) == 0);
        free(ref);
        free(got);
        free(one);
        free(scratch);
    }
    CU_ASSERT_EQUAL(tp_kern_act_block(TP_WTYPE_MLX_Q4_G32), 0);
}

static void test_act_quant_identical(void)
{
    rng_seed(11);
    enum { N = 32 * 40 };
    float x[N];
    fill_random(x, N);
    for (int i = 0; i < 32; i++) x[32 * 3 + i] = 0.0f;        /* an all-zero block */
    for (int i = 0; i < 32; i++) x[32 * 5 + i] = (float)(i - 16) * 0.5f; /* exact halves: ties */
    const enum tp_wtype wts[] = {TP_WTYPE_Q8_0, TP_WTYPE_Q4_0};
    for (size_t k = 0; k < TP_ARRAY_LEN(wts); k++) {
        size_t rb = tp_kern_act_row_bytes(wts[k], N);
        CU_ASSERT_EQUAL_FATAL(rb, N + N / 32 * 40);
        uint8_t *ref = malloc(rb), *got = malloc(rb);
        CU_ASSERT_FATAL(ref && got);
        tp_kern_force_scalar(1);
        tp_kern_prepare_act(wts[k], x, ref, N);
        /* layout: qs[N] ~ x / d, d[N/32], c[8 per block] = -K * (sum of 4 qs), K = 8 (Q4_0) / 128 (Q8_0),
         * s[N/32] = -K * (sum of the block's 32 qs) */
        const int8_t *qs = (const int8_t *)ref;
        int bad = 0;
        for (int b = 0; b < N / 32; b++) {
            float d;
            memcpy(&d, ref + N + 4 * b, 4);
            for (int i = 0; i < 32; i++)
                if (fabsf(qs[32 * b + i] * d - x[32 * b + i]) > 0.5f * d * 1.0001f) bad++;
            for (int j = 0; j < 8; j++) {
                int32_t c;
                memcpy(&c, ref + N + N / 32 * 4 + 4 * (8 * b + j), 4);
                int32_t sum = qs[32 * b + 4 * j] + qs[32 * b + 4 * j + 1] + qs[32 * b + 4 * j + 2] + qs[32 * b + 4 * j + 3];
                if (c != -sum * (wts[k] == TP_WTYPE_Q4_0 ? 8 : 128)) bad++;
            }
            int32_t sb, bsum = 0;
            memcpy(&sb, ref + N + N / 32 * 36 + 4 * b, 4);
            for (int i = 0; i < 32; i++) bsum += qs[32 * b + i];
            if (sb != -bsum * (wts[k] == TP_WTYPE_Q4_0 ? 8 : 128)) bad++;
        }
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT_EQUAL(qs[32 * 5 + 0], -127); /* the tie block: -8 / (8/127) */
        for (int i = 1; i < tp_kern_isa_count(); i++) {
            CU_ASSERT_EQUAL_FATAL(tp_kern_force_isa(tp_kern_isa_name(i)), TP_OK);
            memset(got, 0x55, rb);
            tp_kern_prepare_act(wts[k], x, got, N);
            if (memcmp(ref, got, rb) != 0)
                printf("\n  %s: %s activation row differs from scalar\n", tp_kern_isa_name(i), tp_wtype_name(wts[k]));
            CU_ASSERT(memcmp(ref, got, rb) == 0);
        }
        free(ref);
        free(got);
    }
    tp_kern_force_isa(NULL);
}

/* ------------------------------------------------------------------ matmul */

struct mm_case {
    enum tp_wtype t;
    int64_t rows, cols;
    int n_tok;
    int64_t r0, r1;
};

struct mm_data {
    struct mm_case c;
    size_t wrb, xrb;
    uint8_t *w, *xq;
    float *x, *y;
    int64_t ys;
};

static int mm_setup(struct mm_data *d, struct mm_case c)
{
    memset(d, 0, sizeof *d);
    d->c = c;
    d->wrb = tp_kern_row_bytes(c.t, c.cols);
    d->xrb = tp_kern_act_row_bytes(c.t, c.cols) + 4 * (c.n_tok & 1); /* padded rows sometimes */
    d->ys = c.rows + 3;
    float *wf = malloc((size_t)c.rows * c.cols * sizeof(float));
    d->w = malloc((size_t)c.rows * d->wrb);
    d->x = malloc((size_t)c.n_tok * c.cols * sizeof(float));
    d->xq = malloc((size_t)c.n_tok * d->xrb);
    d->y = malloc((size_t)c.n_tok * d->ys * sizeof(float));
    if (!wf || !d->w || !d->x || !d->xq || !d->y) {
        free(wf);
        return -1;
    }
    fill_random(wf, c.rows * c.cols);
    for (int64_t r = 0; r < c.rows; r++) tp_kern_quantize(c.t, wf + r * c.cols, d->w + r * d->wrb, c.cols);
    fill_random(d->x, (int64_t)c.n_tok * c.cols);
    tp_kern_force_scalar(1); /* identical prepared inputs for every ISA */
    for (int t = 0; t < c.n_tok; t++) tp_kern_prepare_act(c.t, d->x + t * c.cols, d->xq + t * d->xrb, c.cols);
    free(wf);
    return 0;
}

static void mm_free(struct mm_data *d)
{
    free(d->w);
    free(d->x);
    free(d->xq);
    free(d->y);
}

/* Run with the current ISA, on d->w or (w16 != NULL) on the same matrix re-laid
 * in the x16 layout; returns 0 if nothing outside [r0,r1) was written. */
static int mm_run_on(struct mm_data *d, const uint8_t *w16)
{
    const float sentinel = -12345.0f;
    for (int64_t i = 0; i < (int64_t)d->c.n_tok * d->ys; i++) d->y[i] = sentinel;
    if (w16)
        tp_kern_matmul_x16(d->c.t, w16, d->wrb, d->c.cols, d->xq, d->xrb, d->c.n_tok, d->y, d->ys, d->c.r0, d->c.r1);
    else
        tp_kern_matmul(d->c.t, d->w, d->wrb, d->c.cols, d->xq, d->xrb, d->c.n_tok, d->y, d->ys, d->c.r0, d->c.r1);
    int bad = 0;
    for (int t = 0; t < d->c.n_tok; t++)
        for (int64_t r = 0; r < d->ys; r++)
            if ((r < d->c.r0 || r >= d->c.r1) && d->y[t * d->ys + r] != sentinel) bad++;
    return bad;
}

static int mm_run(struct mm_data *d) { return mm_run_on(d, NULL); }

/* Gather the computed [r0,r1) x n_tok outputs into out. */
static void mm_take(const struct mm_data *d, float *out)
{
    int64_t k = 0;
    for (int t = 0; t < d->c.n_tok; t++)
        for (int64_t r = d->c.r0; r < d->c.r1; r++) out[k++] = d->y[t * d->ys + r];
}

/* Q4_0, Q8_0 and the K-quants: repack into the x16 layout (every row unpacks back
 * exactly), then every ISA's x16 matmul (the scalar reference included) against
 * sref, the row-major scalar result.  Within 1e-11: Q4_0 / Q8_0 kernels compute
 * the same integer block dots; the K-quant kernels sum each sub-block's exact
 * integer dot in float (one rounding of ~6e-8 relative per term, ~1e-15 in
 * NMSE), where a wrong scale, min, nibble or bit would give ~1e-3 or more. */
static void check_x16(struct mm_data *d, const double *sref, float *got, int64_t n_out, double *worst)
{
    const struct mm_case *c = &d->c;
    uint8_t *w16 = malloc(tp_kern_x16_bytes(c->rows, d->wrb)), *row = malloc(d->wrb);
    CU_ASSERT_FATAL(w16 && row);
    tp_kern_repack_x16(c->t, d->w, d->wrb, c->rows, w16, 0, 1);
    tp_kern_repack_x16(c->t, d->w, d->wrb, c->rows, w16, 1, (c->rows + 15) / 16); /* in two calls, as threads do */
    int same = 1;
    for (int64_t r = 0; r < c->rows; r++) {
        tp_kern_unpack_x16_row(c->t, w16, d->wrb, r, row);
        same &= memcmp(row, d->w + r * d->wrb, d->wrb) == 0;
    }
    CU_ASSERT(same);
    float *got_l1 = malloc((size_t)n_out * sizeof(float));
    CU_ASSERT_FATAL(got_l1 != NULL);
    for (int i = 0; i < tp_kern_isa_count(); i++) {
        CU_ASSERT_EQUAL_FATAL(tp_kern_force_isa(tp_kern_isa_name(i)), TP_OK);
        /* each prefetch level runs its own copy of the decode and batch passes: the same results, bit for bit */
        CU_ASSERT_EQUAL_FATAL(tp_kern_force_prefetch("l1"), TP_OK);
        CU_ASSERT_EQUAL(mm_run_on(d, w16), 0);
        mm_take(d, got_l1);
        CU_ASSERT_EQUAL_FATAL(tp_kern_force_prefetch("l2"), TP_OK);
        CU_ASSERT_EQUAL(mm_run_on(d, w16), 0);
        mm_take(d, got);
        CU_ASSERT(memcmp(got, got_l1, (size_t)n_out * sizeof(float)) == 0);
        tp_kern_force_prefetch(NULL);
        const double e = nmse(got, sref, n_out);
        if (e > worst[TP_ARRAY_LEN(kTypes) + (size_t)i]) worst[TP_ARRAY_LEN(kTypes) + (size_t)i] = e;
        if (e > 1e-11)
            printf("\n  %s %s x16 %lldx%lld rows [%lld,%lld) tok %d: nmse %.3g > 1e-11\n", tp_kern_isa_name(i),
                   tp_wtype_name(c->t), (long long)c->rows, (long long)c->cols, (long long)c->r0, (long long)c->r1, c->n_tok, e);
        CU_ASSERT(e <= 1e-11);
    }
    tp_kern_force_isa(NULL);
    free(got_l1);
    free(w16);
    free(row);
}

/* f64 oracle: dequantized weights . (dequantized activation for quantized types, else x). */
static void mm_oracle(const struct mm_data *d, double *ref)
{
    const struct mm_case *c = &d->c;
    float *wr = malloc((size_t)c->cols * sizeof(float)), *xr = malloc((size_t)c->cols * sizeof(float));
    int64_t k = 0;
    for (int t = 0; t < c->n_tok; t++) {
        if (is_kquant(c->t)) {
            /* Q8_K blocks: {float d; int8 qs[256]; int16 bsums[16]} (292 bytes) */
            const uint8_t *xb = d->xq + t * d->xrb;
            for (int64_t b = 0; b < c->cols / 256; b++) {
                float s;
                memcpy(&s, xb + b * 292, 4);
                for (int i = 0; i < 256; i++) xr[b * 256 + i] = s * (float)(int8_t)xb[b * 292 + 4 + i];
            }
        } else if (is_quant(c->t)) {
            /* a8 rows: int8 qs[n], float d[n/32], (int32 corrections) */
            const uint8_t *xb = d->xq + t * d->xrb;
            for (int64_t b = 0; b < c->cols / 32; b++) {
                float s;
                memcpy(&s, xb + c->cols + b * 4, 4);
                for (int i = 0; i < 32; i++) xr[b * 32 + i] = s * (float)(int8_t)xb[b * 32 + i];
            }
        } else {
            memcpy(xr, d->x + t * c->cols, (size_t)c->cols * sizeof(float));
        }
        for (int64_t r = c->r0; r < c->r1; r++) {
            tp_kern_dequant(c->t, d->w + r * d->wrb, wr, c->cols);
            double s = 0.0;
            for (int64_t i = 0; i < c->cols; i++) s += (double)wr[i] * (double)xr[i];
            ref[k++] = s;
        }
    }
    free(wr);
    free(xr);
}

/* The checks of one prepared case (d: weights, activations): the scalar kernel against the f64
 * oracle, every ISA against the scalar one (float types: against f64), then the x16 layouts. */
static void check_data(struct mm_data *d, double *worst)
{
    const struct mm_case c = d->c;
    int64_t n_out = (c.r1 - c.r0) * c.n_tok;
    double *ref = malloc((size_t)n_out * sizeof(double));
    double *sref = malloc((size_t)n_out * sizeof(double));
    float *got = malloc((size_t)n_out * sizeof(float));
    CU_ASSERT_FATAL(ref && sref && got);
    mm_oracle(d, ref);
    /* scalar reference vs f64 oracle */
    tp_kern_force_scalar(1);
    CU_ASSERT_EQUAL(mm_run(d), 0);
    mm_take(d, got);
    double e = nmse(got, ref, n_out);
    if (e > 1e-10)
        printf("\n  scalar %s %lldx%lld tok %d: nmse vs f64 %.3g\n", tp_wtype_name(c.t), (long long)c.rows,
               (long long)c.cols, c.n_tok, e);
    CU_ASSERT(e <= 1e-10);
    for (int64_t i = 0; i < n_out; i++) sref[i] = got[i];
    for (int i = 1; i < tp_kern_isa_count(); i++) {
        CU_ASSERT_EQUAL_FATAL(tp_kern_force_isa(tp_kern_isa_name(i)), TP_OK);
        CU_ASSERT_EQUAL(mm_run(d), 0);
        mm_take(d, got);
        /* quantized: vs the scalar result (same integer dots); float: vs f64 */
        double lim = is_quant(c.t) ? 1e-11 : 1e-10;
        e = nmse(got, is_quant(c.t) ? sref : ref, n_out);
        if (e > worst[i]) worst[i] = e;
        if (e > lim)
            printf("\n  %s %s %lldx%lld rows [%lld,%lld) tok %d: nmse %.3g > %.0e\n", tp_kern_isa_name(i),
                   tp_wtype_name(c.t), (long long)c.rows, (long long)c.cols, (long long)c.r0, (long long)c.r1,
                   c.n_tok, e, lim);
        CU_ASSERT(e <= lim);
    }
    tp_kern_force_isa(NULL);
    if (tp_kern_x16_type(c.t)) check_x16(d, sref, got, n_out, worst);
    free(ref);
    free(sref);
    free(got);
}

static void check_case(struct mm_case c, double *worst)
{
    struct mm_data d;
    CU_ASSERT_FATAL(mm_setup(&d, c) == 0);
    check_data(&d, worst);
    mm_free(&d);
}

/* K-quant blocks at the extremes of their integer sums: every weight at its largest value
 * (Q4_K 15, Q5_K 31, Q6_K 63), every 6-bit scale and min 63 (Q6_K int8 scales 127 or -128)
 * and activations all +127 or all -127, so every partial sum a kernel keeps (i16 runs of
 * u8 x s8 pairs on AVX2, i32 scaled sums) is at its bound; every ISA's row-major and x16
 * kernels against the scalar one, and the scalar one against the f64 oracle. */
static void test_matmul_kquant_extreme(void)
{
    static const enum tp_wtype kq[] = {TP_WTYPE_Q4_K, TP_WTYPE_Q5_K, TP_WTYPE_Q6_K};
    static const int toks[] = {1, 2, 3, 4, 5, 8};
    double worst[TP_ARRAY_LEN(kTypes) + 16] = {0};
    for (size_t ti = 0; ti < TP_ARRAY_LEN(kq); ti++)
        for (int v = 0; v < 4; v++) { /* activation sign (v & 1), Q6_K scale 127 or -128 (v & 2) */
            if (kq[ti] != TP_WTYPE_Q6_K && (v & 2)) continue;
            for (size_t k = 0; k < TP_ARRAY_LEN(toks); k++) {
                const struct mm_case c = {kq[ti], 37, 512, toks[k], 0, 37};
                struct mm_data d;
                CU_ASSERT_FATAL(mm_setup(&d, c) == 0);
                const size_t bsz = d.wrb / (size_t)(c.cols / 256); /* bytes of one block */
                for (int64_t r = 0; r < c.rows; r++)
                    for (int64_t b = 0; b < c.cols / 256; b++) {
                        uint8_t *blk = d.w + r * d.wrb + b * (int64_t)bsz;
                        if (c.t == TP_WTYPE_Q6_K) { /* ql[128] qh[64] scales[16] d */
                            memset(blk, 0xFF, 192);
                            memset(blk + 192, (v & 2) ? 0x80 : 0x7F, 16);
                            blk[208] = 0x00, blk[209] = 0x14; /* d = 2^-10 */
                        } else { /* d dmin scales[12] (qh[32]) qs[128] */
                            memset(blk, 0xFF, bsz);
                            blk[0] = 0x00, blk[1] = 0x14; /* d = 2^-10 */
                            blk[2] = 0x00, blk[3] = 0x10; /* dmin = 2^-11 */
                        }
                    }
                for (int64_t i = 0; i < (int64_t)c.n_tok * c.cols; i++) d.x[i] = (v & 1) ? -1.0f : 1.0f;
                tp_kern_force_scalar(1);
                for (int t = 0; t < c.n_tok; t++) tp_kern_prepare_act(c.t, d.x + t * c.cols, d.xq + t * d.xrb, c.cols);
                check_data(&d, worst);
                mm_free(&d);
            }
        }
}

static void run_type_cases(enum tp_wtype t)
{
    /* 2336 = 73 blocks: more than one 64-block slab of the AVX-512 batch kernel */
    static const int64_t qcols[] = {32, 64, 96, 256, 800, 2048, 2336};
    static const int64_t kcols[] = {256, 512, 768, 2048};
    static const int64_t fcols[] = {1, 7, 8, 13, 33, 100, 256, 1100};
    const int64_t *cols = is_kquant(t) ? kcols : is_quant(t) ? qcols : fcols;
    size_t ncols = is_kquant(t) ? TP_ARRAY_LEN(kcols) : is_quant(t) ? TP_ARRAY_LEN(qcols) : TP_ARRAY_LEN(fcols);
    double worst[TP_ARRAY_LEN(kTypes) + 8] = {0}; /* [i]: ISA i; [len(kTypes) + i]: ISA i on x16 */
    rng_seed(1000 + (uint64_t)t);
    int n = 0;
    for (size_t ci = 0; ci < ncols; ci++) {
        /* quantized: n_tok 1..20 (decode, small-batch passes of 8 with every remainder,
         * prefill tiles; K-quants every third for wide rows); float types 1..17 */
        const int max_tok = is_quant(t) ? 20 : 17;
        const int step = is_quant(t) && !is_kquant(t) ? 1 : cols[ci] >= 800 ? 3 : 1;
        for (int n_tok = 1; n_tok <= max_tok; n_tok += step) {
            /* odd and even counts; decode 1..7 groups of 16 rows over the widths, so the x16
             * decode's passes over several groups side by side (4 on AVX-512; 4 or 2 on AVX2)
             * run whole and with every remainder */
            int64_t rows = 5 + (n_tok == 1 ? 16 * (int64_t)ci + (int64_t)(rng_u32() % 12) : (int64_t)(rng_u32() % 35));
            int64_t r0 = (int64_t)(rng_u32() % 4), r1 = rows - (int64_t)(rng_u32() % 3);
            if (n % 5 == 0) r0 = 0, r1 = rows;
            check_case((struct mm_case){t, rows, cols[ci], n_tok, r0, r1}, worst);
            n++;
        }
    }
    /* more rows than one 64-row chunk of the tiled kernels, ragged at both ends */
    check_case((struct mm_case){t, 150, cols[ncols / 2], 6, 3, 149}, worst);
    check_case((struct mm_case){t, 131, cols[ncols / 2], 1, 1, 131}, worst);
    n += 2;
    printf("\n  %s: %d cases;", tp_wtype_name(t), n);
    for (int i = 1; i < tp_kern_isa_count(); i++) printf(" %s worst nmse %.2g;", tp_kern_isa_name(i), worst[i]);
    if (tp_kern_x16_type(t))
        for (int i = 0; i < tp_kern_isa_count(); i++)
            printf(" x16 %s worst nmse %.2g;", tp_kern_isa_name(i), worst[TP_ARRAY_LEN(kTypes) + (size_t)i]);
}

static void test_matmul_f32(void) { run_type_cases(TP_WTYPE_F32); }
static void test_matmul_f16(void) { run_type_cases(TP_WTYPE_F16); }
static void test_matmul_bf16(void) { run_type_cases(TP_WTYPE_BF16); }
static void test_matmul_q8_0(void) { run_type_cases(TP_WTYPE_Q8_0); }
static void test_matmul_q4_0(void) { run_type_cases(TP_WTYPE_Q4_0); }
static void test_matmul_q4_k(void) { run_type_cases(TP_WTYPE_Q4_K); }
static void test_matmul_q5_k(void) { run_type_cases(TP_WTYPE_Q5_K); }
static void test_matmul_q6_k(void) { run_type_cases(TP_WTYPE_Q6_K); }
static void test_matmul_mxfp4(void) { run_type_cases(TP_WTYPE_MXFP4); }

/* Rows split over 2 pool threads (as the forward pass does) give the same
 * result as one call: bit-identical for our kernels (each row is computed the
 * same way whatever its tile-mates), within 1e-12 nmse for f32 (BLAS sgemm may
 * block differently).  Also exercises concurrent BLAS calls. */
struct mt_job {
    struct mm_data *d;
};
static void mt_fn(void *ctx, int ith, int nth)
{
    struct mt_job *j = ctx;
    int64_t b, e;
    tp_split_range(j->d->c.r1 - j->d->c.r0, ith, nth, &b, &e);
    tp_kern_matmul(j->d->c.t, j->d->w, j->d->wrb, j->d->c.cols, j->d->xq, j->d->xrb, j->d->c.n_tok, j->d->y,
                   j->d->ys, j->d->c.r0 + b, j->d->c.r0 + e);
}

static void test_matmul_threads(void)
{
    struct tp_pool_config pc = tp_pool_default_config();
    pc.n_threads = 2;
    tp_pool_t *pool = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_pool_init(&pc, &pool), TP_OK);
    rng_seed(4242);
    for (size_t k = 0; k < TP_ARRAY_LEN(kTypes); k++) {
        const enum tp_wtype t = kTypes[k];
        for (int n_tok = 1; n_tok <= 16; n_tok += 15) {
            struct mm_data d;
            CU_ASSERT_FATAL(mm_setup(&d, (struct mm_case){t, 203, 512, n_tok, 1, 202}) == 0);
            tp_kern_force_isa(NULL);
            int64_t n_out = (d.c.r1 - d.c.r0) * n_tok;
            float *one = malloc((size_t)n_out * sizeof(float)), *two = malloc((size_t)n_out * sizeof(float));
            double *oned = malloc((size_t)n_out * sizeof(double));
            CU_ASSERT_FATAL(one && two && oned);
            CU_ASSERT_EQUAL(mm_run(&d), 0);
            mm_take(&d, one);
            for (int i = 0; i < 3; i++) {
                struct mt_job job = {&d};
                for (int64_t q = 0; q < (int64_t)n_tok * d.ys; q++) d.y[q] = -1.0f;
                tp_pool_run(pool, mt_fn, &job);
                mm_take(&d, two);
                if (t == TP_WTYPE_F32) {
                    for (int64_t q = 0; q < n_out; q++) oned[q] = one[q];
                    CU_ASSERT(nmse(two, oned, n_out) <= 1e-12);
                } else {
                    CU_ASSERT(memcmp(one, two, (size_t)n_out * sizeof(float)) == 0);
                }
            }
            free(one);
            free(two);
            free(oned);
            mm_free(&d);
        }
    }
    tp_pool_free(pool);
}

/* Quantized matmul approximates the float product within the format's noise. */
static void test_matmul_vs_float(void)
{
    rng_seed(99);
    enum { R = 16, C = 1024, T = 3 };
    float *wf = malloc(R * C * sizeof(float)), *x = malloc(T * C * sizeof(float));
    double *ref = malloc(R * T * sizeof(double));
    float *y = malloc(R * T * sizeof(float));
    void *wq = malloc(R * C * 4), *xq = malloc(T * C * 4);
    CU_ASSERT_FATAL(wf && x && ref && y && wq && xq);
    for (int i = 0; i < R * C; i++) wf[i] = rng_f();
    for (int i = 0; i < T * C; i++) x[i] = rng_f();
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) {
            double s = 0.0;
            for (int i = 0; i < C; i++) s += (double)wf[r * C + i] * x[t * C + i];
            ref[t * R + r] = s;
        }
    /* expected nmse ~ weight nmse + activation nmse (independent noise): Q8_0 ~ 3e-5, Q4_0 ~ 4e-3 */
    const enum tp_wtype ts[] = {TP_WTYPE_Q8_0, TP_WTYPE_Q4_0, TP_WTYPE_F16, TP_WTYPE_BF16,
                                TP_WTYPE_Q4_K, TP_WTYPE_Q5_K, TP_WTYPE_Q6_K, TP_WTYPE_MXFP4};
    const double lim[] = {1e-4, 1e-2, 1e-6, 1e-4, 1.5e-2, 4e-3, 1e-3, 3e-2};
    for (size_t k = 0; k < TP_ARRAY_LEN(ts); k++) {
        size_t wrb = tp_kern_row_bytes(ts[k], C), xrb = tp_kern_act_row_bytes(ts[k], C);
        for (int r = 0; r < R; r++) tp_kern_quantize(ts[k], wf + r * C, (char *)wq + r * wrb, C);
        for (int t = 0; t < T; t++) tp_kern_prepare_act(ts[k], x + t * C, (char *)xq + t * xrb, C);
        tp_kern_matmul(ts[k], wq, wrb, C, xq, xrb, T, y, R, 0, R);
        double e = nmse(y, ref, R * T);
        CU_ASSERT(e < lim[k]);
        CU_ASSERT(e > 0.0);
    }
    free(wf);
    free(x);
    free(ref);
    free(y);
    free(wq);
    free(xq);
}

static const struct tp_test_case kernel_cases[] = {
    {"wtype_table", test_wtype_table},
    {"isa_choice", test_isa_choice},
    {"prefetch_choice", test_prefetch_choice},
    {"dequant_known_blocks", test_dequant_known_blocks},
    {"quant_roundtrip", test_quant_roundtrip},
    {"act_quant_identical", test_act_quant_identical},
    {"act_class", test_act_class},
    {"act_blocks", test_act_blocks},
    {"matmul_f32", test_matmul_f32},
    {"matmul_f16", test_matmul_f16},
    {"matmul_bf16", test_matmul_bf16},
    {"matmul_q8_0", test_matmul_q8_0},
    {"matmul_q4_0", test_matmul_q4_0},
    {"dequant_known_kquant", test_dequant_known_kquant},
    {"matmul_q4_k", test_matmul_q4_k},
    {"matmul_q5_k", test_matmul_q5_k},
    {"matmul_q6_k", test_matmul_q6_k},
    {"matmul_kquant_extreme", test_matmul_kquant_extreme},
    {"matmul_mxfp4", test_matmul_mxfp4},
    {"matmul_vs_float", test_matmul_vs_float},
    {"matmul_threads", test_matmul_threads},
    {NULL, NULL},
};
TP_TEST_SUITE(kernels, "unit", 300, kernel_cases)

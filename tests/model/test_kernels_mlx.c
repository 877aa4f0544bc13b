/*
 * tests/model/test_kernels_mlx.c - MLX affine-quantized weights (4/8 bits,
 * groups of 32/64, fp16 or bf16 scales and biases): type table, exact
 * dequantization of hand-packed words, the mlx.core.quantize round trip, the
 * m8 activation layout, and every matmul kernel this CPU has.
 *
 * Oracles and thresholds (normalized MSE, nmse = sum (y - ref)^2 / sum ref^2):
 *  - scalar matmul vs a double-precision dot of the dequantized weights with
 *    the dequantized activation: 1e-10.  The scalar kernel sums exact integer
 *    block dots in float as scale * (sum d * idot) + bias * ms per group; the
 *    two terms partly cancel (bias ~ -8 scale for 4 bits, ~ -128 scale for
 *    8), so float rounding acts on terms several times the result: relative
 *    error ~ k * sqrt(ng) * 2^-24 with k ~ 10 gives nmse ~ 1e-12; measured
 *    <= 2.4e-13 (x86-64).  1e-10 leaves 400x margin and still fails any wrong
 *    element, group scale or bias (nmse >= 1e-4).
 *  - every SIMD instruction set vs the scalar result on identical inputs:
 *    1e-10 (same integer dots, only the float summation order differs; the
 *    AVX2/NEON 8-bit q - 128 correction adds one more term of that size).
 *    Measured worst <= 5e-13 (AVX2, AVX-512); the values are printed.
 *  - round trip: each value within 1.5 |scale| + qmax |scale| 2^-8 (bf16;
 *    2^-11 fp16) + |bias| 2^-8 of the input: rounding is |scale|/2, but mlx
 *    moves the scale so that the edge of larger magnitude (and zero) fall on
 *    the grid, which can leave the far edge up to one more step outside it
 *    (clipped); the last terms are the stored scale/bias rounding; nmse of uniform [-1, 1) data near step^2/12 / (1/3) with
 *    step = 2/(2^bits - 1): 4 bits 4.4e-3 -> limit 6.5e-3; 8 bits 1.5e-5,
 *    plus the stored scale/bias rounding (bf16: ~2^-9/sqrt(3) relative on
 *    values ~1, +0.8e-5) -> limit 4e-5 (bf16), 2.5e-5 (fp16).
 *  - a column slice on group boundaries (row-parallel sharding: pointers into
 *    the words and the scale/bias rows, strides unchanged) gives the full
 *    product when the slices' results are added: nmse 1e-10 vs the full row.
 *  - rows outside [r0, r1) are never written; rows split anywhere give
 *    bit-identical results to one call.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static float rng_f(void) { return (float)((double)rng_u32() / 4294967296.0 * 2.0 - 1.0); } /* [-1, 1) */

/* Random values with a varying magnitude and offset per 32 values (scales and biases differ). */
static void fill_random(float *x, int64_t n)
{
    float scale = 1.0f, off = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = 0.05f + 2.0f * (rng_f() + 1.0f), off = 0.3f * rng_f() * scale;
        x[i] = rng_f() * scale + off;
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

static const enum tp_wtype kMlx[] = {TP_WTYPE_MLX_Q4_G32, TP_WTYPE_MLX_Q4_G64, TP_WTYPE_MLX_Q8_G32,
                                     TP_WTYPE_MLX_Q8_G64};

static float h2f(uint16_t h, int bf) { return bf ? tp_bf16_to_f32(h) : tp_fp16_to_f32(h); }

/* ------------------------------------------------------------------ type table */

static void test_mlx_types(void)
{
    CU_ASSERT_STRING_EQUAL(tp_wtype_name(TP_WTYPE_MLX_Q4_G64), "mlx_q4_g64");
    CU_ASSERT_STRING_EQUAL(tp_wtype_name(TP_WTYPE_MLX_Q8_G32), "mlx_q8_g32");
    CU_ASSERT_STRING_EQUAL(tp_wtype_name((enum tp_wtype)45), "type#unknown");
    enum tp_wtype t;
    CU_ASSERT_EQUAL(tp_wtype_parse("MLX_Q4_G32", &t), TP_OK);
    CU_ASSERT_EQUAL(t, TP_WTYPE_MLX_Q4_G32);
    for (size_t i = 0; i < TP_ARRAY_LEN(kMlx); i++) {
        const enum tp_wtype m = kMlx[i];
        const int bits = i < 2 ? 4 : 8, G = i % 2 ? 64 : 32;
        CU_ASSERT((int)m >= TP_WTYPE_GGUF_END); /* never a GGUF id */
        CU_ASSERT(tp_wtype_supported(m));
        CU_ASSERT_EQUAL(tp_wtype_mlx_bits(m), bits);
        CU_ASSERT_EQUAL(tp_wtype_mlx_group(m), G);
        CU_ASSERT_EQUAL(tp_wtype_mlx(bits, G), m);
        CU_ASSERT_EQUAL(tp_wtype_block_elems(m), G);
        CU_ASSERT_EQUAL(tp_wtype_block_bytes(m), (size_t)(G * bits / 8));
        CU_ASSERT_EQUAL(tp_kern_row_bytes(m, 256), (size_t)(256 * bits / 8));
        CU_ASSERT_EQUAL(tp_kern_row_bytes(m, G + 16), 0);
        /* m8 row: qs[n] + d[n/32] + ms[n/G] */
        CU_ASSERT_EQUAL(tp_kern_act_row_bytes(m, 256), (size_t)(256 + 8 * 4 + 256 / G * 4));
        CU_ASSERT_EQUAL(tp_kern_act_row_bytes(m, G / 2), 0);
    }
    CU_ASSERT_EQUAL(tp_wtype_mlx(3, 64), TP_WTYPE_COUNT);
    CU_ASSERT_EQUAL(tp_wtype_mlx(4, 128), TP_WTYPE_COUNT);
    CU_ASSERT_EQUAL(tp_wtype_mlx_bits(TP_WTYPE_Q4_0), 0);
    CU_ASSERT_EQUAL(tp_wtype_mlx_group(TP_WTYPE_F16), 0);
}

/* ------------------------------------------------------------------ exact dequantization */

static void test_mlx_dequant_known(void)
{
    float out[64];
    /* 4 bits, g32: word 0 = 0x76543210 -> elements 0..7 = 0..7; word 1 = 0xFEDCBA98 -> 8..15;
     * group 0: scale 0.5 (fp16 0x3800), bias -2 (0xC000): w = 0.5 q - 2 */
    uint32_t w4[8] = {0x76543210u, 0xFEDCBA98u, 0, 0, 0xF0000001u, 0, 0, 0};
    uint16_t s16[2] = {0x3800, 0x3C00}, b16[2] = {0xC000, 0x0000};
    tp_kern_dequant_mlx(TP_WTYPE_MLX_Q4_G32, w4, s16, b16, 0, out, 32);
    for (int i = 0; i < 16; i++) CU_ASSERT_EQUAL(out[i], 0.5f * (float)i - 2.0f);
    CU_ASSERT_EQUAL(out[16], -2.0f);
    CU_ASSERT_EQUAL(out[32 - 1], -2.0f);
    /* word 4 = elements 32..39 would be group 1: only with n = 64 */
    uint32_t w4b[8] = {0, 0, 0, 0, 0xF0000001u, 0, 0, 0};
    tp_kern_dequant_mlx(TP_WTYPE_MLX_Q4_G32, w4b, s16, b16, 0, out, 64);
    CU_ASSERT_EQUAL(out[32], 1.0f);  /* q 1, scale 1, bias 0 */
    CU_ASSERT_EQUAL(out[39], 15.0f); /* q 15 in the top nibble */
    CU_ASSERT_EQUAL(out[33], 0.0f);
    /* 8 bits, g64, bf16: word 0 = 0x04030201 -> elements 1, 2, 3, 4; word 15 top byte = 255;
     * scale -0.25 (bf16 0xBE80), bias 3 (0x4040): w = 3 - q / 4 */
    uint32_t w8[16] = {0x04030201u};
    w8[15] = 0xFF000000u;
    uint16_t sb = 0xBE80, bb = 0x4040;
    tp_kern_dequant_mlx(TP_WTYPE_MLX_Q8_G64, w8, &sb, &bb, 1, out, 64);
    CU_ASSERT_EQUAL(out[0], 2.75f);
    CU_ASSERT_EQUAL(out[3], 2.0f);
    CU_ASSERT_EQUAL(out[4], 3.0f);
    CU_ASSERT_EQUAL(out[63], 3.0f - 255.0f / 4.0f);
}

/* ------------------------------------------------------------------ quantize round trip */

static void test_mlx_roundtrip(void)
{
    rng_seed(17);
    enum { N = 64 * 32 };
    float *x = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    uint8_t *w = malloc(N);
    uint16_t *s = malloc(N / 32 * 2), *b = malloc(N / 32 * 2);
    CU_ASSERT_FATAL(x && back && w && s && b);
    for (size_t k = 0; k < TP_ARRAY_LEN(kMlx); k++) {
        for (int bf = 0; bf <= 1; bf++) {
            const enum tp_wtype t = kMlx[k];
            const int bits = tp_wtype_mlx_bits(t), G = tp_wtype_mlx_group(t);
            for (int i = 0; i < N; i++) x[i] = rng_f(); /* uniform [-1, 1): variance 1/3 */
            for (int i = 0; i < G; i++) x[G + i] = 0.25f; /* a constant group */
            for (int i = 0; i < G; i++) x[2 * G + i] = (float)(i % 3) * 0.5f; /* exact grid incl. 0 */
            tp_kern_quantize_mlx(t, x, w, s, b, bf, N);
            tp_kern_dequant_mlx(t, w, s, b, bf, back, N);
            const float rel = bf ? 0x1p-8f : 0x1p-11f;
            int bad = 0;
            double num = 0.0, den = 0.0;
            for (int g = 0; g < N / G; g++) {
                const float sc = fabsf(h2f(s[g], bf)), bi = fabsf(h2f(b[g], bf));
                const float qmax = (float)((1 << bits) - 1);
                for (int i = g * G; i < (g + 1) * G; i++) {
                    const float bound = 1.5f * sc * (1.0f + 2.0f * rel) + qmax * sc * rel + bi * rel + 1e-6f;
                    if (fabsf(back[i] - x[i]) > bound) bad++;
                    num += (double)(back[i] - x[i]) * (back[i] - x[i]);
                    den += (double)x[i] * x[i];
                }
            }
            CU_ASSERT_EQUAL(bad, 0);
            for (int i = 0; i < G; i++) CU_ASSERT(fabsf(back[G + i] - 0.25f) <= 0.25f * rel); /* constant group */
            const double e = num / den;
            const double lim = bits == 4 ? 6.5e-3 : bf ? 4e-5 : 2.5e-5;
            if (e > lim) printf("\n  %s %s round trip nmse %.3g > %.3g\n", tp_wtype_name(t), bf ? "bf16" : "f16", e, lim);
            CU_ASSERT(e <= lim);
            CU_ASSERT(e > (bits == 4 ? 2e-3 : 5e-6)); /* it really quantized */
        }
    }
    free(x);
    free(back);
    free(w);
    free(s);
    free(b);
}

/* ------------------------------------------------------------------ activations */

static void test_mlx_act_layout(void)
{
    rng_seed(23);
    enum { N = 128 };
    float x[N];
    fill_random(x, N);
    for (int i = 0; i < 32; i++) x[32 + i] = 0.0f; /* an all-zero block */
    for (size_t k = 0; k < TP_ARRAY_LEN(kMlx); k++) {
        const enum tp_wtype t = kMlx[k];
        const int bits = tp_wtype_mlx_bits(t), G = tp_wtype_mlx_group(t);
        size_t rb = tp_kern_act_row_bytes(t, N);
        uint8_t *row = malloc(rb);
        CU_ASSERT_FATAL(row != NULL);
        tp_kern_prepare_act(t, x, row, N);
        const int8_t *qs = (const int8_t *)row;
        int bad = 0;
        float ms_ref[N / 32] = {0};
        for (int b = 0; b < N / 32; b++) {
            float d;
            memcpy(&d, row + N + 4 * b, 4);
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) {
                /* 4 bits: even elements first, then odd ones */
                const int pos = bits == 4 ? (i % 2 ? 16 + i / 2 : i / 2) : i;
                const int8_t q = qs[32 * b + pos];
                if (fabsf((float)q * d - x[32 * b + i]) > 0.5f * d * 1.0001f) bad++;
                sum += q;
            }
            ms_ref[b * 32 / G] += d * (float)sum;
        }
        for (int g = 0; g < N / G; g++) {
            float ms;
            memcpy(&ms, row + N + 4 * (N / 32) + 4 * g, 4);
            if (fabsf(ms - ms_ref[g]) > 1e-5f * (1.0f + fabsf(ms_ref[g]))) bad++;
        }
        CU_ASSERT_EQUAL(bad, 0);
        float d1;
        memcpy(&d1, row + N + 4, 4);
        CU_ASSERT_EQUAL(d1, 0.0f); /* the zero block */
        free(row);
    }
}

/* ------------------------------------------------------------------ matmul */

struct mx_case {
    enum tp_wtype t;
    int bf16;
    int64_t rows, cols;
    int n_tok;
    int64_t r0, r1;
};

struct mx_data {
    struct mx_case c;
    size_t wrb, srb, xrb;
    uint8_t *w, *s, *b, *xq;
    float *y;
    int64_t ys;
    struct tp_kern_groups g;
};

/* Weights with padded row strides (as a column slice of a wider matrix would have). */
static int mx_setup(struct mx_data *d, struct mx_case c)
{
    memset(d, 0, sizeof *d);
    d->c = c;
    const int G = tp_wtype_mlx_group(c.t);
    d->wrb = tp_kern_row_bytes(c.t, c.cols) + 16 * (size_t)(c.rows & 1);
    d->srb = (size_t)(c.cols / G) * 2 + 2 * (size_t)(c.rows % 3);
    d->xrb = tp_kern_act_row_bytes(c.t, c.cols) + 4 * (size_t)(c.n_tok & 1);
    d->ys = c.rows + 3;
    float *wf = malloc((size_t)c.cols * sizeof(float)), *x = malloc((size_t)c.cols * sizeof(float));
    d->w = malloc((size_t)c.rows * d->wrb);
    d->s = malloc((size_t)c.rows * d->srb);
    d->b = malloc((size_t)c.rows * d->srb);
    d->xq = malloc((size_t)c.n_tok * d->xrb);
    d->y = malloc((size_t)c.n_tok * (size_t)d->ys * sizeof(float));
    if (!wf || !x || !d->w || !d->s || !d->b || !d->xq || !d->y) {
        free(wf);
        free(x);
        return -1;
    }
    memset(d->w, 0xA5, (size_t)c.rows * d->wrb); /* padding is garbage: kernels must not read it */
    memset(d->s, 0x7C, (size_t)c.rows * d->srb);
    memset(d->b, 0x7C, (size_t)c.rows * d->srb);
    for (int64_t r = 0; r < c.rows; r++) {
        fill_random(wf, c.cols);
        tp_kern_quantize_mlx(c.t, wf, d->w + r * d->wrb, (uint16_t *)(void *)(d->s + r * d->srb),
                             (uint16_t *)(void *)(d->b + r * d->srb), c.bf16, c.cols);
    }
    for (int t = 0; t < c.n_tok; t++) {
        fill_random(x, c.cols);
        tp_kern_prepare_act(c.t, x, d->xq + t * d->xrb, c.cols);
    }
    d->g = (struct tp_kern_groups){d->s, d->b, d->srb, c.bf16};
    free(wf);
    free(x);
    return 0;
}

static void mx_free(struct mx_data *d)
{
    free(d->w);
    free(d->s);
    free(d->b);
    free(d->xq);
    free(d->y);
}

static int mx_run(struct mx_data *d)
{
    const float sentinel = -12345.0f;
    for (int64_t i = 0; i < (int64_t)d->c.n_tok * d->ys; i++) d->y[i] = sentinel;
    tp_kern_matmul_mlx(d->c.t, d->w, d->wrb, &d->g, d->c.cols, d->xq, d->xrb, d->c.n_tok, d->y, d->ys, d->c.r0,
                       d->c.r1);
    int bad = 0;
    for (int t = 0; t < d->c.n_tok; t++)
        for (int64_t r = 0; r < d->ys; r++)
            if ((r < d->c.r0 || r >= d->c.r1) && d->y[t * d->ys + r] != sentinel) bad++;
    return bad;
}

static void mx_take(const struct mx_data *d, float *out)
{
    int64_t k = 0;
    for (int t = 0; t < d->c.n_tok; t++)
        for (int64_t r = d->c.r0; r < d->c.r1; r++) out[k++] = d->y[t * d->ys + r];
}

/* f64 oracle: dequantized weights . dequantized m8 activation (natural element order). */
static void mx_oracle(const struct mx_data *d, double *ref)
{
    const struct mx_case *c = &d->c;
    const int bits = tp_wtype_mlx_bits(c->t);
    float *wr = malloc((size_t)c->cols * sizeof(float)), *xr = malloc((size_t)c->cols * sizeof(float));
    int64_t k = 0;
    for (int t = 0; t < c->n_tok; t++) {
        const uint8_t *row = d->xq + t * d->xrb;
        for (int64_t b = 0; b < c->cols / 32; b++) {
            float dd;
            memcpy(&dd, row + c->cols + 4 * b, 4);
            for (int i = 0; i < 32; i++) {
                const int pos = bits == 4 ? (i % 2 ? 16 + i / 2 : i / 2) : i;
                xr[b * 32 + i] = dd * (float)(int8_t)row[b * 32 + pos];
            }
        }
        for (int64_t r = c->r0; r < c->r1; r++) {
            tp_kern_dequant_mlx(c->t, d->w + r * d->wrb, d->s + r * d->srb, d->b + r * d->srb, c->bf16, wr, c->cols);
            double s = 0.0;
            for (int64_t i = 0; i < c->cols; i++) s += (double)wr[i] * (double)xr[i];
            ref[k++] = s;
        }
    }
    free(wr);
    free(xr);
}

static void mx_check(struct mx_case c, double *worst)
{
    struct mx_data d;
    CU_ASSERT_FATAL(mx_setup(&d, c) == 0);
    const int64_t n_out = (c.r1 - c.r0) * c.n_tok;
    double *ref = malloc((size_t)n_out * sizeof(double)), *sref = malloc((size_t)n_out * sizeof(double));
    float *got = malloc((size_t)n_out * sizeof(float));
    CU_ASSERT_FATAL(ref && sref && got);
    mx_oracle(&d, ref);
    tp_kern_force_scalar(1);
    CU_ASSERT_EQUAL(mx_run(&d), 0);
    mx_take(&d, got);
    double e = nmse(got, ref, n_out);
    if (e > worst[0]) worst[0] = e;
    if (e > 1e-10)
        printf("\n  scalar %s %s %lldx%lld tok %d: nmse vs f64 %.3g\n", tp_wtype_name(c.t), c.bf16 ? "bf16" : "f16",
               (long long)c.rows, (long long)c.cols, c.n_tok, e);
    CU_ASSERT(e <= 1e-10);
    for (int64_t i = 0; i < n_out; i++) sref[i] = got[i];
    for (int i = 1; i < tp_kern_isa_count(); i++) {
        CU_ASSERT_EQUAL_FATAL(tp_kern_force_isa(tp_kern_isa_name(i)), TP_OK);
        CU_ASSERT_EQUAL(mx_run(&d), 0);
        mx_take(&d, got);
        e = nmse(got, sref, n_out);
        if (e > worst[i]) worst[i] = e;
        if (e > 1e-10)
            printf("\n  %s %s %s %lldx%lld rows [%lld,%lld) tok %d: nmse %.3g > 1e-10\n", tp_kern_isa_name(i),
                   tp_wtype_name(c.t), c.bf16 ? "bf16" : "f16", (long long)c.rows, (long long)c.cols,
                   (long long)c.r0, (long long)c.r1, c.n_tok, e);
        CU_ASSERT(e <= 1e-10);
    }
    tp_kern_force_isa(NULL);
    free(ref);
    free(sref);
    free(got);
    mx_free(&d);
}

static void run_mlx_cases(enum tp_wtype t)
{
    static const int64_t cols32[] = {32, 64, 96, 160, 256, 800, 2048};
    static const int64_t cols64[] = {64, 128, 192, 320, 768, 2048};
    const int G = tp_wtype_mlx_group(t);
    const int64_t *cols = G == 32 ? cols32 : cols64;
    const size_t ncols = G == 32 ? TP_ARRAY_LEN(cols32) : TP_ARRAY_LEN(cols64);
    double worst[8] = {0};
    rng_seed(3000 + (uint64_t)t);
    int n = 0;
    for (size_t ci = 0; ci < ncols; ci++) {
        for (int n_tok = 1; n_tok <= 11; n_tok += (cols[ci] >= 800 ? 5 : 1)) {
            const int64_t rows = 5 + (int64_t)(rng_u32() % 30);
            int64_t r0 = (int64_t)(rng_u32() % 4), r1 = rows - (int64_t)(rng_u32() % 3);
            if (n % 5 == 0) r0 = 0, r1 = rows;
            mx_check((struct mx_case){t, n % 2, rows, cols[ci], n_tok, r0, r1}, worst);
            n++;
        }
    }
    mx_check((struct mx_case){t, 0, 150, cols[ncols / 2], 6, 3, 149}, worst); /* > one 64-row chunk */
    mx_check((struct mx_case){t, 1, 131, cols[ncols / 2], 1, 1, 131}, worst);
    n += 2;
    printf("\n  %s: %d cases; scalar vs f64 worst nmse %.2g;", tp_wtype_name(t), n, worst[0]);
    for (int i = 1; i < tp_kern_isa_count(); i++) printf(" %s worst nmse %.2g;", tp_kern_isa_name(i), worst[i]);
}

static void test_matmul_mlx_q4_g32(void) { run_mlx_cases(TP_WTYPE_MLX_Q4_G32); }
static void test_matmul_mlx_q4_g64(void) { run_mlx_cases(TP_WTYPE_MLX_Q4_G64); }
static void test_matmul_mlx_q8_g32(void) { run_mlx_cases(TP_WTYPE_MLX_Q8_G32); }
static void test_matmul_mlx_q8_g64(void) { run_mlx_cases(TP_WTYPE_MLX_Q8_G64); }

/* Row-parallel sharding without repacking: columns [c0, c1) on group boundaries
 * are a pointer into the words and into the scale/bias rows, strides unchanged. */
static void test_mlx_column_slices(void)
{
    rng_seed(555);
    for (size_t k = 0; k < TP_ARRAY_LEN(kMlx); k++) {
        const enum tp_wtype t = kMlx[k];
        const int G = tp_wtype_mlx_group(t), bits = tp_wtype_mlx_bits(t);
        const int64_t R = 37, C = 12 * 64;
        const int64_t cuts[] = {0, 3 * G, 7 * G, C};
        struct mx_data d;
        CU_ASSERT_FATAL(mx_setup(&d, (struct mx_case){t, (int)k % 2, R, C, 3, 0, R}) == 0);
        float *x = malloc((size_t)3 * C * sizeof(float)), *part = malloc((size_t)3 * R * sizeof(float));
        double *sum = calloc((size_t)3 * R, sizeof(double));
        float *full = malloc((size_t)3 * R * sizeof(float));
        uint8_t *xq = malloc((size_t)3 * tp_kern_act_row_bytes(t, C));
        CU_ASSERT_FATAL(x && part && sum && full && xq);
        fill_random(x, 3 * C);
        const size_t xrb = tp_kern_act_row_bytes(t, C);
        for (int tok = 0; tok < 3; tok++) tp_kern_prepare_act(t, x + tok * C, xq + tok * xrb, C);
        tp_kern_matmul_mlx(t, d.w, d.wrb, &d.g, C, xq, xrb, 3, full, R, 0, R);
        for (size_t s = 0; s + 1 < TP_ARRAY_LEN(cuts); s++) {
            const int64_t c0 = cuts[s], c1 = cuts[s + 1], n = c1 - c0;
            const size_t sxrb = tp_kern_act_row_bytes(t, n);
            uint8_t *sxq = malloc(3 * sxrb);
            CU_ASSERT_FATAL(sxq != NULL);
            for (int tok = 0; tok < 3; tok++) tp_kern_prepare_act(t, x + tok * C + c0, sxq + tok * sxrb, n);
            const struct tp_kern_groups sg = {d.s + c0 / G * 2, d.b + c0 / G * 2, d.srb, d.g.bf16};
            tp_kern_matmul_mlx(t, d.w + c0 * bits / 8, d.wrb, &sg, n, sxq, sxrb, 3, part, R, 0, R);
            for (int i = 0; i < 3 * R; i++) sum[i] += part[i];
            free(sxq);
        }
        const double e = nmse(full, sum, 3 * R);
        if (e > 1e-10) printf("\n  %s: column slices sum nmse %.3g\n", tp_wtype_name(t), e);
        CU_ASSERT(e <= 1e-10);
        free(x);
        free(part);
        free(sum);
        free(full);
        free(xq);
        mx_free(&d);
    }
}

/* Rows split anywhere (as the forward pass splits them over threads) give bit-identical
 * results to one call: every kernel computes a row the same way whatever its neighbours
 * (the 16-row AVX-512 batch kernel repeats the last row in unused lanes). */
static void test_mlx_row_splits(void)
{
    rng_seed(808);
    for (size_t k = 0; k < TP_ARRAY_LEN(kMlx); k++) {
        for (int n_tok = 1; n_tok <= 9; n_tok += 4) {
            struct mx_data d;
            CU_ASSERT_FATAL(mx_setup(&d, (struct mx_case){kMlx[k], (int)k % 2, 53, 256, n_tok, 0, 53}) == 0);
            for (int i = 0; i < tp_kern_isa_count(); i++) {
                CU_ASSERT_EQUAL_FATAL(tp_kern_force_isa(tp_kern_isa_name(i)), TP_OK);
                float *one = malloc(sizeof(float) * (size_t)n_tok * (size_t)d.ys);
                CU_ASSERT_FATAL(one != NULL);
                CU_ASSERT_EQUAL(mx_run(&d), 0);
                memcpy(one, d.y, sizeof(float) * (size_t)n_tok * (size_t)d.ys);
                static const int64_t cuts[] = {1, 7, 16, 17, 33, 52};
                for (size_t c = 0; c < TP_ARRAY_LEN(cuts); c++) {
                    tp_kern_matmul_mlx(d.c.t, d.w, d.wrb, &d.g, d.c.cols, d.xq, d.xrb, n_tok, d.y, d.ys, 0, cuts[c]);
                    tp_kern_matmul_mlx(d.c.t, d.w, d.wrb, &d.g, d.c.cols, d.xq, d.xrb, n_tok, d.y, d.ys, cuts[c], 53);
                    int same = 1;
                    for (int t = 0; t < n_tok; t++)
                        same &= memcmp(one + t * d.ys, d.y + t * d.ys, 53 * sizeof(float)) == 0;
                    if (!same)
                        printf("\n  %s %s n_tok %d: split at %lld differs\n", tp_kern_isa_name(i), tp_wtype_name(d.c.t),
                               n_tok, (long long)cuts[c]);
                    CU_ASSERT(same);
                }
                free(one);
            }
            tp_kern_force_isa(NULL);
            mx_free(&d);
        }
    }
}

/* MLX matmul approximates the float product within the format's noise:
 * weight nmse (4 bits ~ 4.4e-3 on uniform data, 8 bits ~ 1.5e-5, see the
 * round trip) + activation int8 nmse (~1.5e-5): limits 8e-3 and 1e-4. */
static void test_mlx_vs_float(void)
{
    rng_seed(99);
    enum { R = 16, C = 1024, T = 3 };
    float *wf = malloc(R * C * sizeof(float)), *x = malloc(T * C * sizeof(float)), *y = malloc(R * T * sizeof(float));
    double *ref = malloc(R * T * sizeof(double));
    uint8_t *w = malloc(R * C), *xq = malloc(T * (C + C / 8 + C / 8));
    uint16_t *s = malloc(R * C / 32 * 2), *b = malloc(R * C / 32 * 2);
    CU_ASSERT_FATAL(wf && x && y && ref && w && xq && s && b);
    for (int i = 0; i < R * C; i++) wf[i] = rng_f();
    for (int i = 0; i < T * C; i++) x[i] = rng_f();
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) {
            double acc = 0.0;
            for (int i = 0; i < C; i++) acc += (double)wf[r * C + i] * x[t * C + i];
            ref[t * R + r] = acc;
        }
    for (size_t k = 0; k < TP_ARRAY_LEN(kMlx); k++) {
        const enum tp_wtype t = kMlx[k];
        const int G = tp_wtype_mlx_group(t);
        const size_t wrb = tp_kern_row_bytes(t, C), xrb = tp_kern_act_row_bytes(t, C);
        for (int r = 0; r < R; r++) tp_kern_quantize_mlx(t, wf + r * C, w + r * wrb, s + r * C / G, b + r * C / G, 0, C);
        for (int tk = 0; tk < T; tk++) tp_kern_prepare_act(t, x + tk * C, xq + tk * xrb, C);
        const struct tp_kern_groups g = {s, b, (size_t)C / G * 2, 0};
        tp_kern_matmul_mlx(t, w, wrb, &g, C, xq, xrb, T, y, R, 0, R);
        const double e = nmse(y, ref, R * T), lim = tp_wtype_mlx_bits(t) == 4 ? 8e-3 : 1e-4;
        if (e > lim) printf("\n  %s vs float nmse %.3g > %.1g\n", tp_wtype_name(t), e, lim);
        CU_ASSERT(e < lim);
        CU_ASSERT(e > 0.0);
    }
    free(wf);
    free(x);
    free(y);
    free(ref);
    free(w);
    free(xq);
    free(s);
    free(b);
}

static const struct tp_test_case mlx_kernel_cases[] = {
    {"types", test_mlx_types},
    {"dequant_known", test_mlx_dequant_known},
    {"roundtrip", test_mlx_roundtrip},
    {"act_layout", test_mlx_act_layout},
    {"matmul_q4_g32", test_matmul_mlx_q4_g32},
    {"matmul_q4_g64", test_matmul_mlx_q4_g64},
    {"matmul_q8_g32", test_matmul_mlx_q8_g32},
    {"matmul_q8_g64", test_matmul_mlx_q8_g64},
    {"column_slices", test_mlx_column_slices},
    {"row_splits", test_mlx_row_splits},
    {"vs_float", test_mlx_vs_float},
    {NULL, NULL},
};
TP_TEST_SUITE(kernels_mlx, "unit", 300, mlx_kernel_cases)

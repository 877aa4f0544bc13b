/*
 * tests/model/test_attn.c - the fused attention head (model/attn.c) against
 * its reference (per-position dot, softmax, axpy) and against a float64
 * oracle: head sizes with and without a 64-wide column tail (8, 64, 80, 128,
 * 256), position counts around the 4-position score blocks (1..9, 37, 300),
 * f16 and f32 caches, rows strided wider than a head.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward/model_impl.h"
#include "tp_test.h"

static uint64_t at_state = 0x9E3779B97F4A7C15ull;
static float at_rand(void) /* uniform [-1, 1) */
{
    at_state ^= at_state << 13;
    at_state ^= at_state >> 7;
    at_state ^= at_state << 17;
    return (float)((double)(at_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* float64 oracle of softmax(q.k * scale) . v over the cache values as stored */
static void oracle(const float *q, const float *kf, const float *vf, size_t kvs, int n, int hd, float scale, double *o)
{
    double *s = malloc((size_t)n * sizeof(double)), mx = -1e300, sum = 0;
    for (int j = 0; j < n; j++) {
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)q[i] * kf[(size_t)j * kvs + (size_t)i];
        s[j] = d * scale;
        if (s[j] > mx) mx = s[j];
    }
    for (int j = 0; j < n; j++) sum += s[j] = exp(s[j] - mx);
    for (int i = 0; i < hd; i++) {
        double a = 0;
        for (int j = 0; j < n; j++) a += s[j] / sum * vf[(size_t)j * kvs + (size_t)i];
        o[i] = a;
    }
    free(s);
}

static double rel_err(const float *got, const double *ref, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

static void test_attn_head(void)
{
    static const int hds[] = {8, 64, 80, 128, 256};
    static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 37, 300};
    double worst = 0, worst_ref = 0;
    tp_op_init();
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++) {
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            for (int f16 = 0; f16 <= 1; f16++) {
                const int hd = hds[a], n = ns[b];
                const size_t kvs = (size_t)hd * 2 + 8; /* rows of a wider cache line */
                float *q = malloc((size_t)hd * sizeof(float)), *kf = malloc((size_t)n * kvs * sizeof(float));
                float *vf = malloc((size_t)n * kvs * sizeof(float)), *sc = malloc((size_t)n * sizeof(float));
                float *o = malloc((size_t)hd * sizeof(float)), *o_ref = malloc((size_t)hd * sizeof(float));
                uint16_t *kh = malloc((size_t)n * kvs * 2), *vh = malloc((size_t)n * kvs * 2);
                double *od = malloc((size_t)hd * sizeof(double));
                CU_ASSERT_FATAL(q && kf && vf && sc && o && o_ref && kh && vh && od);
                for (int i = 0; i < hd; i++) q[i] = 2.0f * at_rand();
                for (size_t i = 0; i < (size_t)n * kvs; i++) {
                    kh[i] = tp_f32_to_fp16(at_rand());
                    vh[i] = tp_f32_to_fp16(at_rand());
                    kf[i] = f16 ? tp_fp16_to_f32(kh[i]) : at_rand();
                    vf[i] = f16 ? tp_fp16_to_f32(vh[i]) : at_rand();
                }
                const float scale = 1.0f / sqrtf((float)hd);
                const void *kc = f16 ? (const void *)kh : (const void *)kf, *vc = f16 ? (const void *)vh : (const void *)vf;
                oracle(q, kf, vf, kvs, n, hd, scale, od);
                for (int i = 0; i < hd; i++) o[i] = NAN; /* every output must be written */
                tp_op_attn_head(q, kc, vc, kvs, f16, n, hd, scale, sc, o);
                tp_op_attn_head_ref(q, kc, vc, kvs, f16, n, hd, scale, sc, o_ref);
                const double e = rel_err(o, od, hd), er = rel_err(o_ref, od, hd);
                if (e > worst) worst = e;
                if (er > worst_ref) worst_ref = er;
                if (!(e < 1e-10) || !(er < 1e-10))
                    printf("\n  hd %d n %d %s: nmse fused %.3g reference %.3g\n", hd, n, f16 ? "f16" : "f32", e, er);
                CU_ASSERT(e < 1e-10);
                CU_ASSERT(er < 1e-10);
                free(q), free(kf), free(vf), free(sc), free(o), free(o_ref), free(kh), free(vh), free(od);
            }
        }
    }
    printf("\n  attention head: worst nmse vs float64 fused %.2g, reference %.2g\n", worst, worst_ref);
}

static const struct tp_test_case attn_cases[] = {
    {"attn_head", test_attn_head},
    {NULL, NULL},
};
TP_TEST_SUITE(attn, "unit", 60, attn_cases)

/*
 * tests/model/test_kquant_act.c - Q8_K activation rows (what the K-quant
 * kernels multiply against): every instruction set's quantizer must give
 * the scalar reference's bytes exactly (the SIMD vs scalar matmul tests rely
 * on identical inputs), and the reference itself is checked against its
 * definition: d = amax / 127, |q * d - x| <= d / 2, round-half-even on exact
 * ties (a block with d = 1 and values k + 0.5), bsums = sums of 16 consecutive q, an all-zero block gives d = 0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels.h"
#include "tp_test.h"

enum { KA_N = 256 * 6, KA_BLK = 292 }; /* Q8_K block: float d; int8 qs[256]; int16 bsums[16] */

static uint64_t ka_state = 88172645463325252ull;
static float ka_rand(void) /* uniform [-1, 1) */
{
    ka_state ^= ka_state << 13;
    ka_state ^= ka_state >> 7;
    ka_state ^= ka_state << 17;
    return (float)((double)(ka_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void test_q8k_reference_and_isas(void)
{
    static float x[KA_N];
    for (int i = 0; i < KA_N; i++) x[i] = ka_rand() * (1.0f + (float)(i / 256)); /* scale differs per block */
    for (int i = 0; i < 256; i++) x[256 * 2 + i] = 0.0f;                      /* all-zero block */
    for (int i = 0; i < 256; i++) x[256 * 3 + i] = (float)(i % 8 - 4) + 0.5f; /* exact ties once d = 1 */
    x[256 * 3 + 255] = 127.0f;                                                 /* amax 127: d = 1 */
    x[256 * 4 + 17] = NAN; /* ignored by amax, as fmaxf does */
    const size_t rb = tp_kern_act_row_bytes(TP_WTYPE_Q4_K, KA_N);
    CU_ASSERT_EQUAL_FATAL(rb, (size_t)(KA_N / 256 * (KA_BLK + 48))); /* Q8_K blocks, then 24 i16 pair sums each */
    CU_ASSERT_EQUAL(tp_kern_act_row_bytes(TP_WTYPE_Q6_K, KA_N), rb);
    uint8_t *ref = malloc(rb), *got = malloc(rb);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    CU_ASSERT_PTR_NOT_NULL_FATAL(got);
    tp_kern_force_scalar(1);
    tp_kern_prepare_act(TP_WTYPE_Q4_K, x, ref, KA_N);
    tp_kern_force_scalar(0);
    int bad = 0;
    for (int b = 0; b < KA_N / 256; b++) {
        const uint8_t *blk = ref + (size_t)b * KA_BLK;
        float d, amax = 0.0f;
        memcpy(&d, blk, 4);
        for (int i = 0; i < 256; i++)
            if (!isnan(x[256 * b + i])) amax = fmaxf(amax, fabsf(x[256 * b + i]));
        if (d != amax / 127.0f) bad++;
        const int8_t *q = (const int8_t *)(blk + 4);
        for (int i = 0; i < 256; i++) {
            if (isnan(x[256 * b + i])) continue;
            if (fabsf((float)q[i] * d - x[256 * b + i]) > 0.5f * d * 1.0001f) bad++;
        }
        for (int j = 0; j < 16; j++) {
            int16_t bs;
            memcpy(&bs, blk + 4 + 256 + 2 * j, 2);
            int s = 0;
            for (int i = 0; i < 16; i++) s += q[16 * j + i];
            if (bs != s) bad++;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    /* the pair sums after the blocks: 32-value sums in the order 0 2 1 3 4 6 5 7, then bsums 0 2 1 3, 4 6 5 7, .. */
    int pbad = 0;
    for (int b = 0; b < KA_N / 256; b++) {
        int16_t bs[16], pr[24];
        memcpy(bs, ref + (size_t)b * KA_BLK + 4 + 256, sizeof bs);
        memcpy(pr, ref + (size_t)(KA_N / 256) * KA_BLK + (size_t)b * 48, sizeof pr);
        static const int o[8] = {0, 2, 1, 3, 4, 6, 5, 7};
        for (int j = 0; j < 8; j++) pbad += pr[j] != bs[2 * o[j]] + bs[2 * o[j] + 1];
        for (int j = 0; j < 16; j++) pbad += pr[8 + j] != bs[4 * (j / 4) + o[j % 4]];
    }
    CU_ASSERT_EQUAL(pbad, 0);
    float d2;
    memcpy(&d2, ref + 2 * KA_BLK, 4);
    CU_ASSERT_EQUAL(d2, 0.0f);
    /* tie block, d = 1: -3.5 .. 3.5 round half to even */
    static const int8_t ties[8] = {-4, -2, -2, 0, 0, 2, 2, 4};
    const int8_t *q3 = (const int8_t *)(ref + 3 * KA_BLK + 4);
    for (int i = 0; i < 255; i++) CU_ASSERT_EQUAL(q3[i], ties[i % 8]);
    CU_ASSERT_EQUAL(q3[255], 127);
    for (int i = 1; i < tp_kern_isa_count(); i++) {
        CU_ASSERT_EQUAL_FATAL(tp_kern_force_isa(tp_kern_isa_name(i)), TP_OK);
        memset(got, 0x55, rb);
        tp_kern_prepare_act(TP_WTYPE_Q6_K, x, got, KA_N);
        /* the NaN element's byte is implementation-defined; compare everything else */
        got[4 * KA_BLK + 4 + 17] = ref[4 * KA_BLK + 4 + 17];
        const int same = memcmp(ref, got, rb) == 0;
        if (!same) fprintf(stderr, "%s: Q8_K activation row differs from the scalar one\n", tp_kern_isa_name(i));
        CU_ASSERT(same);
    }
    tp_kern_force_isa(NULL);
    free(ref);
    free(got);
}

static const struct tp_test_case kquant_act_cases[] = {
    {"q8k_reference_and_isas", test_q8k_reference_and_isas},
    {NULL, NULL},
};
TP_TEST_SUITE(kquant_act, "unit", 30, kquant_act_cases)

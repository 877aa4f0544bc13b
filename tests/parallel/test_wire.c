/*
 * tests/parallel/test_wire.c - the q8 wire format of the compressed all_sum
 * (blocks of 32 int8 + f32 scale): quantize/dequantize error bound, exact
 * zeros, partial last block, and summation of several ranks' blocks.
 * Oracle: |x - q8(x)| <= scale/2 per element with scale = amax/127.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/parallel_impl.h"
#include "tp_test.h"

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void test_q8_roundtrip(void)
{
    enum { N = 100 }; /* 3 full blocks + a partial one */
    float x[N], y[N];
    uint8_t buf[4 * TP_WIRE_Q8_BYTES];
    uint64_t seed = 42;
    for (int i = 0; i < N; i++) x[i] = frand(&seed) * (i < 32 ? 1000.0f : i < 64 ? 1e-3f : 1.0f);
    for (int i = 64; i < 96; i++) x[i] = 0.0f; /* an all-zero block */
    tp_wire_q8_pack(x, N, buf);
    memset(y, 0, sizeof y);
    tp_wire_q8_add(y, buf, N);
    for (int b = 0; b < 4; b++) {
        float amax = 0;
        for (int i = b * 32; i < N && i < (b + 1) * 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int i = b * 32; i < N && i < (b + 1) * 32; i++) CU_ASSERT(fabsf(x[i] - y[i]) <= amax / 127.0f * 0.5001f);
    }
    for (int i = 64; i < 96; i++) CU_ASSERT_EQUAL(y[i], 0.0f);
    /* adding twice doubles: the sum over ranks is plain accumulation */
    float z[N] = {0};
    tp_wire_q8_add(z, buf, N);
    tp_wire_q8_add(z, buf, N);
    for (int i = 0; i < N; i++) CU_ASSERT_DOUBLE_EQUAL(z[i], 2.0f * y[i], fabsf(y[i]) * 1e-6 + 1e-30);
}

static void test_wire_names(void)
{
    for (int i = 0; i < TP_WIRE_COUNT; i++) {
        enum tp_wire_dtype d;
        CU_ASSERT_EQUAL(tp_wire_dtype_parse(tp_wire_dtype_name((enum tp_wire_dtype)i), &d), TP_OK);
        CU_ASSERT_EQUAL((int)d, i);
    }
    enum tp_wire_dtype d;
    CU_ASSERT_EQUAL(tp_wire_dtype_parse("int4", &d), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(tp_wire_dtype_parse(NULL, &d), TP_ERR_INVALID_ARG);
}

static const struct tp_test_case wire_cases[] = {
    {"q8_roundtrip", test_q8_roundtrip},
    {"names", test_wire_names},
    {NULL, NULL},
};
TP_TEST_SUITE(wire, "unit", 30, wire_cases)

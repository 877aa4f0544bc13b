/*
 * comm/reduce.c - element-wise reduction kernels used by the collectives:
 * dst = a op b for every dtype and op.  Plain loops the compiler vectorises;
 * half types go through f32 (one rounding per combine); integer sums are
 * done in unsigned arithmetic so overflow wraps instead of being undefined.
 */
#include <string.h>

#include "comm_impl.h"

/* d may alias a or b (in-place reductions), so no `restrict`: the compiler
 * vectorises with a run-time overlap check. */
#define DEF_LOOP(NAME, T, EXPR)                                                           \
    static void NAME(T *d, const T *a, const T *b, size_t n)                              \
    {                                                                                     \
        for (size_t i = 0; i < n; i++) {                                                  \
            T x = a[i], y = b[i];                                                         \
            d[i] = (EXPR);                                                                \
        }                                                                                 \
    }

DEF_LOOP(sum_f32, float, x + y)
DEF_LOOP(max_f32, float, x > y ? x : y)
DEF_LOOP(min_f32, float, x < y ? x : y)
DEF_LOOP(sum_i32, int32_t, (int32_t)((uint32_t)x + (uint32_t)y))
DEF_LOOP(max_i32, int32_t, x > y ? x : y)
DEF_LOOP(min_i32, int32_t, x < y ? x : y)
DEF_LOOP(sum_i64, int64_t, (int64_t)((uint64_t)x + (uint64_t)y))
DEF_LOOP(max_i64, int64_t, x > y ? x : y)
DEF_LOOP(min_i64, int64_t, x < y ? x : y)
DEF_LOOP(sum_u8, uint8_t, (uint8_t)(x + y))
DEF_LOOP(max_u8, uint8_t, x > y ? x : y)
DEF_LOOP(min_u8, uint8_t, x < y ? x : y)

static float combine(float x, float y, enum tp_red_op op)
{
    switch (op) {
    case TP_RED_MAX: return x > y ? x : y;
    case TP_RED_MIN: return x < y ? x : y;
    default: return x + y;
    }
}

static void half_loop(uint16_t *d, const uint16_t *a, const uint16_t *b, size_t n, int bf16, enum tp_red_op op)
{
    if (bf16) {
        for (size_t i = 0; i < n; i++) d[i] = tp_f32_to_bf16(combine(tp_bf16_to_f32(a[i]), tp_bf16_to_f32(b[i]), op));
    } else {
        for (size_t i = 0; i < n; i++) d[i] = tp_f32_to_fp16(combine(tp_fp16_to_f32(a[i]), tp_fp16_to_f32(b[i]), op));
    }
}

void tp_reduce(void *dst, const void *a, const void *b, size_t n, enum tp_dtype dt, enum tp_red_op op)
{
    if (n == 0) return;
    switch (dt) {
    case TP_DTYPE_F32:
        (op == TP_RED_SUM ? sum_f32 : op == TP_RED_MAX ? max_f32 : min_f32)(dst, a, b, n);
        break;
    case TP_DTYPE_I32:
        (op == TP_RED_SUM ? sum_i32 : op == TP_RED_MAX ? max_i32 : min_i32)(dst, a, b, n);
        break;
    case TP_DTYPE_I64:
        (op == TP_RED_SUM ? sum_i64 : op == TP_RED_MAX ? max_i64 : min_i64)(dst, a, b, n);
        break;
    case TP_DTYPE_U8:
        (op == TP_RED_SUM ? sum_u8 : op == TP_RED_MAX ? max_u8 : min_u8)(dst, a, b, n);
        break;
    case TP_DTYPE_F16: half_loop(dst, a, b, n, 0, op); break;
    case TP_DTYPE_BF16: half_loop(dst, a, b, n, 1, op); break;
    default: TP_ASSERT(!"bad dtype in tp_reduce");
    }
}

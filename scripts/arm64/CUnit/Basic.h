/*
 * scripts/arm64/CUnit/Basic.h - a minimal stand-in for CUnit's assertion
 * macros, so tests/model/test_kernels.c builds unchanged for the arm64 cross
 * test (scripts/test-arm64.sh) without an arm64 CUnit.  Failed assertions are
 * counted and printed; *_FATAL ones end the current test (longjmp).
 */
#ifndef TP_ARM64_CUNIT_SHIM_H
#define TP_ARM64_CUNIT_SHIM_H

#include <setjmp.h>
#include <string.h>

extern jmp_buf tp_shim_jmp;
void tp_shim_fail(const char *expr, const char *file, int line, int fatal);

#define TP_SHIM_CHECK(cond, text, fatal)                                       \
    do {                                                                       \
        if (!(cond)) tp_shim_fail(text, __FILE__, __LINE__, fatal);            \
    } while (0)

#define CU_ASSERT(c) TP_SHIM_CHECK((c), #c, 0)
#define CU_ASSERT_FATAL(c) TP_SHIM_CHECK((c), #c, 1)
#define CU_ASSERT_TRUE(c) TP_SHIM_CHECK((c), #c, 0)
#define CU_ASSERT_FALSE(c) TP_SHIM_CHECK(!(c), "!(" #c ")", 0)
#define CU_ASSERT_EQUAL(a, b) TP_SHIM_CHECK((a) == (b), #a " == " #b, 0)
#define CU_ASSERT_EQUAL_FATAL(a, b) TP_SHIM_CHECK((a) == (b), #a " == " #b, 1)
#define CU_ASSERT_NOT_EQUAL(a, b) TP_SHIM_CHECK((a) != (b), #a " != " #b, 0)
#define CU_ASSERT_PTR_NULL(p) TP_SHIM_CHECK((p) == NULL, #p " == NULL", 0)
#define CU_ASSERT_PTR_NOT_NULL(p) TP_SHIM_CHECK((p) != NULL, #p " != NULL", 0)
#define CU_ASSERT_PTR_NOT_NULL_FATAL(p) TP_SHIM_CHECK((p) != NULL, #p " != NULL", 1)
#define CU_ASSERT_STRING_EQUAL(a, b) TP_SHIM_CHECK(strcmp((a), (b)) == 0, #a " eq " #b, 0)
#define CU_ASSERT_DOUBLE_EQUAL(a, b, eps) \
    TP_SHIM_CHECK(((a) - (b)) <= (eps) && ((b) - (a)) <= (eps), #a " ~ " #b, 0)

#endif

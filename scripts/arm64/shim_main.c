/*
 * scripts/arm64/shim_main.c - runner for the arm64 cross test: collects the
 * suites that TP_TEST_SUITE registers, runs every case, prints failed
 * assertions and exits 1 if any failed (no CUnit needed on the target).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>

#include "tp_test.h"

jmp_buf tp_shim_jmp;
static int n_fail, n_fail_total, n_run;

static struct tp_test_suite suites[16];
static int n_suites;

void tp_shim_fail(const char *expr, const char *file, int line, int fatal);
void tp_shim_fail(const char *expr, const char *file, int line, int fatal)
{
    printf("    FAILED: %s (%s:%d)\n", expr, file, line);
    n_fail++;
    if (fatal) longjmp(tp_shim_jmp, 1);
}

void tp_test_register(const char *name, const struct tp_test_case *cases)
{
    if (n_suites < 16) suites[n_suites++] = (struct tp_test_suite){name, cases};
}

void tp_test_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("    SKIP: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* setjmp in its own frame: nothing live across the longjmp */
static void run_case(void (*fn)(void))
{
    if (setjmp(tp_shim_jmp) == 0) fn();
}

int main(void)
{
    for (int s = 0; s < n_suites; s++) {
        printf("Suite %s\n", suites[s].name);
        for (const struct tp_test_case *c = suites[s].cases; c->name; c++) {
            n_fail = 0;
            printf("  %s ...", c->name);
            fflush(stdout);
            run_case(c->fn);
            printf(" %s\n", n_fail ? "FAILED" : "passed");
            n_fail_total += n_fail;
            n_run++;
        }
    }
    printf("%d tests, %d failed assertions\n", n_run, n_fail_total);
    return n_fail_total ? 1 : 0;
}

/*
 * tests/tp_test.h - shared CUnit runner and helpers for every test suite.
 *
 * A module's test executable (test_<module>) is every .c file in tests/<module>/
 * linked with this runner, which provides main().  Each file declares its
 * suites with
 *
 *     static const struct tp_test_case kernel_cases[] = {{"q4_0", test_q4_0}, ..., {NULL, NULL}};
 *     TP_TEST_SUITE(kernels, "unit", 120, kernel_cases)
 *
 * (name, ctest labels separated by commas, ctest timeout in seconds, cases).
 * CMake reads these lines and registers one ctest entry <module>.<name> per
 * suite running `test_<module> --suite <name>`; nothing else to edit.
 * Labels: unit, multirank, model, slow.
 */
#ifndef TP_TEST_H
#define TP_TEST_H

#include <CUnit/Basic.h>
#include <stddef.h>

struct tp_test_case {
    const char *name;
    void (*fn)(void);
};
struct tp_test_suite {
    const char *name;
    const struct tp_test_case *cases; /* terminated by {NULL, NULL} */
};

/* Called by TP_TEST_SUITE at start-up (before main). */
void tp_test_register(const char *name, const struct tp_test_case *cases);
#define TP_TEST_SUITE(name, labels, timeout_s, cases)                                  \
    __attribute__((constructor)) static void tp_test_register_##name(void);            \
    __attribute__((constructor)) static void tp_test_register_##name(void)             \
    {                                                                                  \
        tp_test_register(#name, cases);                                                \
    }

/* Print "SKIP: <reason>" (the test then passes with nothing asserted).
 * Use only for missing optional prerequisites, never for failures. */
void tp_test_skip(const char *fmt, ...);

/* Path helpers: "<repo>/rel", "<shared>/rel" (NULL when ../shared lacks it),
 * the tpserve binary.  Returned pointers are to static storage per call slot
 * (up to 8 live at once). */
const char *tp_test_repo_path(const char *rel);
const char *tp_test_shared_path(const char *rel);
const char *tp_test_tpserve(void);
/* A fresh temporary directory for this test process (removed at exit). */
const char *tp_test_tmpdir(void);

/* Read a whole file into a malloc'd NUL-terminated buffer (NULL on error). */
char *tp_test_read_file(const char *path, size_t *len);

/* Run a shell command, capture up to cap-1 bytes of its stdout (NUL-terminated);
 * returns its exit status, -1 when it could not run or was killed. */
int tp_test_run_cmd(const char *cmd, char *out, size_t cap);

#endif

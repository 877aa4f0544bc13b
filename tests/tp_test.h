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
 *
 * Outcome of one run (`test_<module> --suite NAME`), read by ctest from the
 * exit status alone:
 *   1   some case failed (an assertion, or data missing under TP_REQUIRE_SHARED=1)
 *   77  every case skipped (SKIP_RETURN_CODE: ctest shows the entry as skipped)
 *   0   otherwise; cases that skipped while others ran are listed in the
 *       report the runner prints last ("skipped: case: reason").
 * A case skips by calling tp_test_skip() or by looking up ../shared data that
 * is absent (tp_test_shared_path).  So that a checkout without ../shared shows
 * every data-dependent suite as skipped rather than passed, a suite may not
 * mix cases that look up ../shared data with cases that do not: the runner
 * fails such a suite, naming the cases to move (suites of data-dependent
 * cases are named *_shared by convention).
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

/* Print "SKIP: <reason>" and record the current case as skipped (the caller
 * then returns without asserting more).  Use only for missing optional
 * prerequisites (a tool, an IPv6 loopback), never for failures; for ../shared
 * data use tp_test_shared_path(), which records the skip itself. */
void tp_test_skip(const char *fmt, ...);

/* Path helpers: "<repo>/rel", "<shared>/rel", the tpserve binary.  Returned
 * pointers are to static storage per call slot (up to 8 live at once).
 * tp_test_shared_path marks the current case as depending on ../shared and,
 * when the file is absent, returns NULL after recording the case as skipped,
 * or, with TP_REQUIRE_SHARED=1 in the environment (scripts/test.sh sets it
 * where ../shared exists), as failed. */
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
/* A TCP connection to 127.0.0.1:port, retried every 25 ms for up to tries
 * attempts (a listener still starting); receives time out after 5 s.  The
 * socket, or -1. */
int tp_test_connect_loopback(int port, int tries);

#endif

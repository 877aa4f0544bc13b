/*
 * tests/tp_test.h - shared CUnit runner and helpers for every test suite.
 *
 * Each test executable defines
 *     static const struct tp_test_suite suites[] = {{"name", tests}, ...};
 * and calls tp_test_main(argc, argv, suites, n).  `--suite NAME` runs one
 * suite (ctest registers one entry per suite); no argument runs all.
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

int tp_test_main(int argc, char **argv, const struct tp_test_suite *suites, size_t n_suites);

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

#endif

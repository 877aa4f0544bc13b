/* tests/common/test_util.c - the small shared helpers: tp_cmp_double, tp_median,
 * tp_str_starts_with / tp_str_ends_with, tp_read_file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "tp_test.h"

static void test_cmp_double(void)
{
    double a = 1.5, b = 2.5, c = 1.5, d = -3.0;
    CU_ASSERT(tp_cmp_double(&a, &b) < 0);
    CU_ASSERT(tp_cmp_double(&b, &a) > 0);
    CU_ASSERT_EQUAL(tp_cmp_double(&a, &c), 0);
    CU_ASSERT(tp_cmp_double(&d, &a) < 0);
    double v[] = {5, -1, 3.25, 0, 3.25, 1e9, -1e-9};
    qsort(v, 7, sizeof v[0], tp_cmp_double);
    const double want[] = {-1, -1e-9, 0, 3.25, 3.25, 5, 1e9};
    for (int i = 0; i < 7; i++) CU_ASSERT_EQUAL(v[i], want[i]);
}

static void test_median(void)
{
    double odd[] = {3, 1, 2};
    CU_ASSERT_EQUAL(tp_median(odd, 3), 2.0);
    CU_ASSERT(odd[0] == 1 && odd[1] == 2 && odd[2] == 3); /* sorted in place */
    double even[] = {4, 1, 3, 2};
    CU_ASSERT_EQUAL(tp_median(even, 4), 2.5);
    double one[] = {7};
    CU_ASSERT_EQUAL(tp_median(one, 1), 7.0);
    CU_ASSERT_EQUAL(tp_median(NULL, 0), 0.0);
}

static void test_prefix_suffix(void)
{
    CU_ASSERT_EQUAL(tp_str_starts_with("abc", "ab"), 1);
    CU_ASSERT_EQUAL(tp_str_starts_with("abc", "abc"), 1);
    CU_ASSERT_EQUAL(tp_str_starts_with("abc", ""), 1);
    CU_ASSERT_EQUAL(tp_str_starts_with("", ""), 1);
    CU_ASSERT_EQUAL(tp_str_starts_with("ab", "abc"), 0);
    CU_ASSERT_EQUAL(tp_str_starts_with("abc", "b"), 0);
    CU_ASSERT_EQUAL(tp_str_starts_with("", "a"), 0);
    CU_ASSERT_EQUAL(tp_str_ends_with("abc", "bc"), 1);
    CU_ASSERT_EQUAL(tp_str_ends_with("abc", "abc"), 1);
    CU_ASSERT_EQUAL(tp_str_ends_with("abc", ""), 1);
    CU_ASSERT_EQUAL(tp_str_ends_with("", ""), 1);
    CU_ASSERT_EQUAL(tp_str_ends_with("bc", "abc"), 0);
    CU_ASSERT_EQUAL(tp_str_ends_with("abc", "ab"), 0);
    CU_ASSERT_EQUAL(tp_str_ends_with("x.scales", ".scales"), 1);
}

/* A temporary file holding data[0..n); its path in path (cap >= 32). */
static int write_temp(char *path, const char *data, size_t n)
{
    strcpy(path, "/tmp/tp_util_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, data + done, n - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
    close(fd);
    return done == n ? 0 : -1;
}

static void test_read_file(void)
{
    /* 10000 bytes (more than one growth step), NUL bytes inside */
    enum { N = 10000 };
    char *data = malloc(N);
    CU_ASSERT_PTR_NOT_NULL_FATAL(data);
    for (int i = 0; i < N; i++) data[i] = (char)(i * 7 % 251);
    char path[64];
    CU_ASSERT_EQUAL_FATAL(write_temp(path, data, N), 0);

    struct tp_error err = {0};
    char *got = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL(tp_read_file(path, N, &got, &len, &err), TP_OK);
    CU_ASSERT_EQUAL(len, (size_t)N);
    CU_ASSERT_PTR_NOT_NULL_FATAL(got);
    CU_ASSERT_EQUAL(memcmp(got, data, N), 0);
    CU_ASSERT_EQUAL(got[N], '\0');
    free(got);

    /* one byte over the cap: a format error naming the file, nothing returned */
    got = (char *)1;
    CU_ASSERT_EQUAL(tp_read_file(path, N - 1, &got, &len, &err), TP_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(got);
    CU_ASSERT_EQUAL(len, 0u);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, path));
    tp_error_clear(&err);
    unlink(path);

    /* empty file: "" with length 0; out_len may be NULL */
    CU_ASSERT_EQUAL_FATAL(write_temp(path, "", 0), 0);
    CU_ASSERT_EQUAL(tp_read_file(path, 16, &got, NULL, &err), TP_OK);
    CU_ASSERT_PTR_NOT_NULL(got);
    if (got) CU_ASSERT_STRING_EQUAL(got, "");
    free(got);
    unlink(path);

    /* missing file, and a directory (opens, cannot be read) */
    CU_ASSERT_EQUAL(tp_read_file(path, 16, &got, &len, &err), TP_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NULL(got);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "cannot open"));
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_read_file("/tmp", 16, &got, &len, &err), TP_ERR_IO);
    CU_ASSERT_PTR_NULL(got);
    free(data);
}

static const struct tp_test_case util_cases[] = {
    {"cmp_double", test_cmp_double},
    {"median", test_median},
    {"prefix_suffix", test_prefix_suffix},
    {"read_file", test_read_file},
    {NULL, NULL},
};

TP_TEST_SUITE(util, "unit", 60, util_cases)

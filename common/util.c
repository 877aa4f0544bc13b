/* Small helpers every module uses: double comparison and median for timing
 * lists, prefix/suffix tests, whole-file reads with a size cap. */
#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tp_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tp_median(double *v, int n)
{
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, tp_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int tp_str_starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

int tp_str_ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

char *tp_str_dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

enum tp_status tp_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len, struct tp_error *err)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    if (max_bytes > SIZE_MAX / 2) max_bytes = SIZE_MAX / 2;
    FILE *f = fopen(path, "rb");
    if (!f)
        return tp_error_set(err, errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot open: %s", path,
                            strerror(errno));
    enum tp_status rc = TP_OK;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n > max_bytes) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "%s: larger than %zu bytes", path, max_bytes);
            goto out;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 4096;
            if (nc > max_bytes + 1) nc = max_bytes + 1;
            char *nb = realloc(buf, nc + 1);
            if (!nb) {
                rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
                goto out;
            }
            buf = nb;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        rc = tp_error_set(err, TP_ERR_IO, "%s: read failed", path);
        goto out;
    }
    buf[n] = '\0';
    *out = buf;
    if (out_len) *out_len = n;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return rc;
}

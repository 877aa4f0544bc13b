/* tests/tp_test.c - the CUnit runner shared by every suite. */
#include "tp_test.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"

static char g_tmpdir[256];

static void rm_tmpdir(void)
{
    if (!g_tmpdir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_tmpdir);
}

const char *tp_test_tmpdir(void)
{
    if (!g_tmpdir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(g_tmpdir, sizeof g_tmpdir, "%s/tptest.XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(g_tmpdir)) {
            perror("mkdtemp");
            abort();
        }
        atexit(rm_tmpdir);
    }
    return g_tmpdir;
}

void tp_test_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("\n    SKIP: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

static char g_paths[8][1024];
static int g_path_slot;

static const char *path_join(const char *a, const char *b)
{
    char *p = g_paths[g_path_slot++ & 7];
    snprintf(p, sizeof g_paths[0], "%s/%s", a, b);
    return p;
}

const char *tp_test_repo_path(const char *rel) { return path_join(TP_TEST_SOURCE_DIR, rel); }

const char *tp_test_shared_path(const char *rel)
{
    const char *p = path_join(TP_TEST_SHARED_DIR, rel);
    struct stat st;
    return stat(p, &st) == 0 ? p : NULL;
}

const char *tp_test_tpserve(void) { return TP_TEST_TPSERVE; }

int tp_test_run_cmd(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *tp_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = '\0';
    if (len) *len = (size_t)n;
    return buf;
}

static void log_hook(enum tp_log_level level, const char *module, const char *msg, void *user)
{
    (void)user;
    if (level >= TP_LOG_WARN) fprintf(stderr, "    [%s] %s: %s\n", tp_log_level_str(level), module, msg);
}

#define TP_TEST_MAX_SUITES 64
static struct tp_test_suite g_suites[TP_TEST_MAX_SUITES];
static size_t g_n_suites;

void tp_test_register(const char *name, const struct tp_test_case *cases)
{
    if (g_n_suites >= TP_TEST_MAX_SUITES) {
        fprintf(stderr, "too many test suites (max %d)\n", TP_TEST_MAX_SUITES);
        abort();
    }
    g_suites[g_n_suites].name = name;
    g_suites[g_n_suites].cases = cases;
    g_n_suites++;
}

int main(int argc, char **argv)
{
    const struct tp_test_suite *suites = g_suites;
    size_t n_suites = g_n_suites;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--suite") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--suite NAME]\n", argv[0]);
            return 2;
        }
    }
    tp_log_set_hook(log_hook, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    int matched = 0;
    for (size_t s = 0; s < n_suites; s++) {
        if (only && strcmp(only, suites[s].name) != 0) continue;
        matched++;
        CU_pSuite suite = CU_add_suite(suites[s].name, NULL, NULL);
        if (!suite) return 1;
        for (const struct tp_test_case *c = suites[s].cases; c->name; c++)
            if (!CU_add_test(suite, c->name, c->fn)) return 1;
    }
    if (!matched) {
        fprintf(stderr, "no suite named '%s'\n", only ? only : "");
        CU_cleanup_registry();
        return 2;
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

/* tests/tp_test.c - the CUnit runner shared by every suite. */
#include "tp_test.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
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

/* Per-case record of the run, filled as cases call tp_test_skip / tp_test_shared_path. */
#define TP_TEST_MAX_CASES 1024
struct case_rec {
    CU_pTest test;
    const char *suite, *name;
    int skipped;      /* tp_test_skip or absent ../shared data */
    int uses_shared;  /* looked up ../shared data (present or not) */
    char reason[320]; /* the first skip reason */
};
static struct case_rec g_cases[TP_TEST_MAX_CASES];
static size_t g_n_cases;

static struct case_rec *current_case(void)
{
    CU_pTest t = CU_get_current_test();
    for (size_t i = 0; t && i < g_n_cases; i++)
        if (g_cases[i].test == t) return &g_cases[i];
    return NULL;
}

static void record_skip(const char *reason)
{
    printf("\n    SKIP: %s\n", reason);
    fflush(stdout);
    struct case_rec *c = current_case();
    if (c && !c->skipped) {
        c->skipped = 1;
        snprintf(c->reason, sizeof c->reason, "%.300s", reason);
    }
}

void tp_test_skip(const char *fmt, ...)
{
    char reason[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    record_skip(reason);
}

static int require_shared(void)
{
    const char *v = getenv("TP_REQUIRE_SHARED");
    return v && *v && strcmp(v, "0") != 0;
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
    struct case_rec *c = current_case();
    if (c) c->uses_shared = 1;
    const char *p = path_join(TP_TEST_SHARED_DIR, rel);
    struct stat st;
    if (stat(p, &st) == 0) return p;
    char msg[1200];
    if (require_shared()) {
        snprintf(msg, sizeof msg, "../shared/%s is missing and TP_REQUIRE_SHARED=1: this case needs it", rel);
        CU_assertImplementation(CU_FALSE, __LINE__, msg, __FILE__, "", CU_FALSE);
        fprintf(stderr, "    FAIL: %s\n", msg);
    } else {
        snprintf(msg, sizeof msg, "../shared/%s not present", rel);
        record_skip(msg);
    }
    return NULL;
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

/* The per-case report and the exit status (see tp_test.h).  any_failed: CUnit
 * counted a failure (possibly outside any case). */
static int report(int any_failed)
{
    size_t n_pass = 0, n_skip = 0, n_fail = 0;
    int mixed = 0;
    printf("\ntp_test report:\n");
    for (size_t i = 0; i < g_n_cases; i++) {
        struct case_rec *c = &g_cases[i];
        int failed = 0;
        for (CU_pFailureRecord f = CU_get_failure_list(); f; f = f->pNext)
            if (f->pTest == c->test) failed = 1;
        if (failed) {
            n_fail++;
            printf("  FAIL %s.%s\n", c->suite, c->name);
        } else if (c->skipped) {
            n_skip++;
            printf("  SKIP %s.%s: %s\n", c->suite, c->name, c->reason);
        } else {
            n_pass++;
        }
    }
    /* a suite mixing ../shared cases with others would pass without ../shared */
    for (size_t i = 0; i < g_n_cases; i++) {
        if (!g_cases[i].uses_shared) continue;
        for (size_t j = 0; j < g_n_cases; j++) {
            if (g_cases[j].uses_shared || strcmp(g_cases[i].suite, g_cases[j].suite) != 0) continue;
            printf("  FAIL suite %s mixes %s, which needs ../shared data, with %s, which does not: move the "
                   "data-dependent cases to a suite of their own (*_shared)\n",
                   g_cases[i].suite, g_cases[i].name, g_cases[j].name);
            mixed = 1;
            break;
        }
    }
    printf("  %zu passed, %zu skipped, %zu failed of %zu cases\n", n_pass, n_skip, n_fail, g_n_cases);
    if (any_failed || n_fail || mixed) return 1;
    if (n_skip && n_skip == g_n_cases) {
        printf("  every case skipped: exit 77 (ctest: skipped)\n");
        return 77;
    }
    return 0;
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
        for (const struct tp_test_case *c = suites[s].cases; c->name; c++) {
            CU_pTest t = CU_add_test(suite, c->name, c->fn);
            if (!t || g_n_cases >= TP_TEST_MAX_CASES) return 1;
            g_cases[g_n_cases++] = (struct case_rec){.test = t, .suite = suites[s].name, .name = c->name};
        }
    }
    if (!matched) {
        fprintf(stderr, "no suite named '%s'\n", only ? only : "");
        CU_cleanup_registry();
        return 2;
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    int code = report(CU_get_number_of_failures() + CU_get_number_of_tests_failed() > 0);
    CU_cleanup_registry();
    return code;
}

int tp_test_connect_loopback(int port, int tries)
{
    for (int t = 0; t < tries; t++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            struct timeval tv = {.tv_sec = 5, .tv_usec = 0};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            return fd;
        }
        if (fd >= 0) close(fd);
        tp_sleep_ms(25);
    }
    return -1;
}

/*
 * tests/parallel/test_cli.c - the distributed command line end to end:
 * `tpserve launch -n N -- tpserve generate` (ring, and mpirun through
 * `launch --backend mpi`) must print the same greedy text as one rank;
 * `tpserve shard` files with a {rank} path template must too; shard files
 * used by the wrong world size are refused by every rank with the same
 * message (launch exits non-zero, nothing hangs: every command runs under
 * `timeout`); `bench gen --json` under launch reports the per-token split.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "tp_test.h"

/* Run a shell command (under timeout), return its output (malloc'd) and exit status. */
static char *run(const char *cmd, int *status)
{
    char full[4096];
    snprintf(full, sizeof full, "timeout 90 %s", cmd);
    FILE *f = popen(full, "r");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        pclose(f);
        return NULL;
    }
    size_t got;
    while ((got = fread(buf + n, 1, cap - 1 - n, f)) > 0) {
        n += got;
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    buf[n] = '\0';
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

/* Remove every occurrence of tag from s (in place). */
static void strip(char *s, const char *tag)
{
    size_t tl = strlen(tag);
    char *p;
    while ((p = strstr(s, tag)) != NULL) memmove(p, p + tl, strlen(p + tl) + 1);
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

static const char *stories_or_skip(void)
{
    const char *m = tp_test_repo_path("models/stories260K.gguf");
    if (access(m, R_OK) != 0) {
        tp_test_skip("models/stories260K.gguf not found");
        return NULL;
    }
    return m;
}

#define GEN_ARGS "-p 'Once upon a time' -n 48 --temp 0 -t 1 --quiet-stats"

static char *single_rank_text(const char *model)
{
    char cmd[2048];
    int st = -1;
    snprintf(cmd, sizeof cmd, "%s generate -m %s " GEN_ARGS " 2>/dev/null", tp_test_tpserve(), model);
    char *out = run(cmd, &st);
    CU_ASSERT_EQUAL(st, 0);
    if (out) CU_ASSERT(strlen(out) > 40); /* 48 tokens of story text */
    return out;
}

static void test_launch_generate(void)
{
    const char *m = stories_or_skip();
    if (!m) return;
    char *ref = single_rank_text(m);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    char cmd[2048];
    int st = -1;
    const struct {
        int n;
        const char *extra;
    } variants[] = {{2, ""}, {3, ""}, {3, "--shard-weights 2,1,1"}, {2, "--comm-dtype f16"}};
    for (size_t i = 0; i < TP_ARRAY_LEN(variants); i++) {
        snprintf(cmd, sizeof cmd, "%s launch -n %d -- %s generate -m %s " GEN_ARGS " %s 2>/dev/null", tp_test_tpserve(),
                 variants[i].n, tp_test_tpserve(), m, variants[i].extra);
        char *out = run(cmd, &st);
        CU_ASSERT_EQUAL(st, 0);
        CU_ASSERT_PTR_NOT_NULL_FATAL(out);
        strip(out, "[rank 0] ");
        if (strcmp(out, ref) != 0) fprintf(stderr, "launch -n %d %s:\n%s\nvs one rank:\n%s\n", variants[i].n,
                                           variants[i].extra, out, ref);
        CU_ASSERT_STRING_EQUAL(out, ref);
        free(out);
    }
    free(ref);
}

static void test_launch_mpi(void)
{
    const char *m = stories_or_skip();
    if (!m) return;
    int st = -1;
    char *which = run("sh -c 'command -v mpirun'", &st);
    free(which);
    if (st != 0) {
        tp_test_skip("mpirun not installed");
        return;
    }
    char *ref = single_rank_text(m);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    char cmd[2048];
    /* Sanitizer builds: OpenMPI's exit-time leaks sit in plugins it dlclose()s; only full unwinding
     * reaches the libmpi frames that tests/lsan.supp names (same as the comm tests). */
    const char *old_asan = getenv("ASAN_OPTIONS");
    snprintf(cmd, sizeof cmd,
             "env ASAN_OPTIONS='%s%sfast_unwind_on_malloc=0' LSAN_OPTIONS='suppressions=%s:print_suppressions=0' "
             "%s launch -n 2 --backend mpi -- %s generate -m %s " GEN_ARGS " 2>/dev/null",
             old_asan ? old_asan : "", old_asan && *old_asan ? ":" : "", tp_test_repo_path("tests/lsan.supp"),
             tp_test_tpserve(), tp_test_tpserve(), m);
    char *out = run(cmd, &st);
    if (st != 0 && out && strstr(out, "not built with MPI")) {
        tp_test_skip("tpserve built without MPI");
    } else {
        CU_ASSERT_EQUAL(st, 0);
        CU_ASSERT_PTR_NOT_NULL_FATAL(out);
        strip(out, "[1,0]<stdout>:");
        CU_ASSERT_STRING_EQUAL(out, ref);
    }
    free(out);
    free(ref);
}

static void test_shard_cli(void)
{
    const char *m = stories_or_skip();
    if (!m) return;
    char *ref = single_rank_text(m);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    char cmd[2048], dir[1024];
    int st = -1;
    snprintf(dir, sizeof dir, "%s/cli-shards", tp_test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s shard %s -n 2 -o %s 2>&1", tp_test_tpserve(), m, dir);
    char *out = run(cmd, &st);
    CU_ASSERT_EQUAL(st, 0);
    CU_ASSERT(out && strstr(out, "stories260K.rank1-of-2.gguf") != NULL);
    free(out);
    /* every rank its own file through the {rank} template */
    snprintf(cmd, sizeof cmd, "%s launch -n 2 -- %s generate -m '%s/stories260K.rank{rank}-of-2.gguf' " GEN_ARGS
             " 2>/dev/null", tp_test_tpserve(), tp_test_tpserve(), dir);
    out = run(cmd, &st);
    CU_ASSERT_EQUAL(st, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    strip(out, "[rank 0] ");
    CU_ASSERT_STRING_EQUAL(out, ref);
    free(out);
    /* the 2-rank shards at 3 ranks: every rank refuses with the same message */
    snprintf(cmd, sizeof cmd, "%s launch -n 3 -- %s generate -m '%s/stories260K.rank{rank}-of-2.gguf' " GEN_ARGS
             " 2>&1", tp_test_tpserve(), tp_test_tpserve(), dir);
    double t0 = tp_now_s();
    out = run(cmd, &st);
    CU_ASSERT(st != 0 && st != 124); /* refused, not timed out */
    CU_ASSERT(tp_now_s() - t0 < 60);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT_EQUAL(count(out, "is a shard file for a world of 2 ranks, but this group has 3 ranks"), 3);
    free(out);
    /* a single rank handed rank 1's file */
    snprintf(cmd, sizeof cmd, "%s generate -m '%s/stories260K.rank1-of-2.gguf' " GEN_ARGS " 2>&1", tp_test_tpserve(), dir);
    out = run(cmd, &st);
    CU_ASSERT_EQUAL(st, 1);
    CU_ASSERT(out && strstr(out, "shard file for a world of 2 ranks, but this group has 1") != NULL);
    free(out);
    /* bad usage */
    snprintf(cmd, sizeof cmd, "%s shard %s -n 2 --shard-weights 1,x -o %s 2>&1", tp_test_tpserve(), m, dir);
    out = run(cmd, &st);
    CU_ASSERT_EQUAL(st, 1);
    CU_ASSERT(out && strstr(out, "not a number") != NULL);
    free(out);
    free(ref);
}

static void test_bench_gen_json(void)
{
    const char *m = stories_or_skip();
    if (!m) return;
    char cmd[2048];
    int st = -1;
    snprintf(cmd, sizeof cmd,
             "%s launch -n 2 -- %s bench gen -m %s -p 8 -n 16 -t 1 --reps 1 --bw-mib 64 --json --comm-dtype bf16 "
             "2>/dev/null",
             tp_test_tpserve(), tp_test_tpserve(), m);
    char *out = run(cmd, &st);
    CU_ASSERT_EQUAL(st, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT(strstr(out, "\"ranks\":2") != NULL);
    CU_ASSERT(strstr(out, "\"comm_dtype\":\"bf16\"") != NULL);
    const char *c = strstr(out, "\"comm_ms_per_token\":"), *b = strstr(out, "\"bytes_per_token\":"),
               *k = strstr(out, "\"compute_ms_per_token\":");
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    CU_ASSERT(atof(c + strlen("\"comm_ms_per_token\":")) > 0.0);
    CU_ASSERT(atof(k + strlen("\"compute_ms_per_token\":")) > 0.0);
    /* per token rank 0 sends at least its share of 2 all_sums x 5 layers x 64 bf16 values + its logits */
    CU_ASSERT(atof(b + strlen("\"bytes_per_token\":")) >= 5 * 2 * 64 * 2 / 2);
    free(out);
}

static const struct tp_test_case cli_cases[] = {
    {"launch_generate", test_launch_generate},
    {"launch_mpi", test_launch_mpi},
    {"shard_cli", test_shard_cli},
    {"bench_gen_json", test_bench_gen_json},
    {NULL, NULL},
};
TP_TEST_SUITE(cli, "multirank,model", 300, cli_cases)

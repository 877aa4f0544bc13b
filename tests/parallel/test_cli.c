/*
 * tests/parallel/test_cli.c - the distributed command line end to end:
 * `tpserve launch -n N -- tpserve generate` (ring, and mpirun through
 * `launch --backend mpi`) must print the same greedy text as one rank;
 * `tpserve shard` files with a {rank} path template must too; shard files
 * used by the wrong world size are refused (launch exits non-zero with the
 * message, nothing hangs: every command has a 90 s deadline); `bench gen
 * --json` under launch reports the per-token split.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "tp_test.h"

/* Run a shell command with a 90 s deadline (its process group is killed then;
 * no timeout(1), which macOS lacks); returns its stdout (malloc'd) and exit
 * status (124 when killed at the deadline). */
static char *run(const char *cmd, int *status)
{
    int fds[2];
    *status = -1;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    if (pipe(fds) != 0) {
        free(buf);
        return NULL;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        free(buf);
        return NULL;
    }
    if (pid == 0) {
        setpgid(0, 0);
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    close(fds[1]);
    double deadline = tp_now_s() + 90.0;
    int killed = 0;
    for (;;) {
        struct pollfd pf = {fds[0], POLLIN, 0};
        int left_ms = (int)((deadline - tp_now_s()) * 1000.0);
        if (left_ms <= 0) {
            kill(-pid, SIGKILL);
            killed = 1;
            break;
        }
        int r = poll(&pf, 1, left_ms < 1000 ? left_ms : 1000);
        if (r < 0 && errno != EINTR) break;
        if (r <= 0) continue;
        if (n + 4096 + 1 > cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        ssize_t got = read(fds[0], buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += (size_t)got;
    }
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    *status = killed ? 124 : WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    buf[n] = '\0';
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
    if (!TP_TEST_WITH_MPI) {
        tp_test_skip("built without MPI (-DTP_WITH_MPI=OFF)");
        return;
    }
    const char *m = stories_or_skip();
    if (!m) return;
    int st = -1;
    char *which = run("sh -c 'command -v mpirun'", &st);
    free(which);
    if (st != 0) fprintf(stderr, "    mpirun not found in PATH: install openmpi-bin (this build has MPI)\n");
    CU_ASSERT_EQUAL_FATAL(st, 0);
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
    CU_ASSERT_EQUAL(st, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    strip(out, "[1,0]<stdout>:");
    CU_ASSERT_STRING_EQUAL(out, ref);
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
    /* launch stops the other ranks as soon as one exits, so not every rank may get to print it
     * (that every rank refuses is checked without launch in test_multirank.c) */
    CU_ASSERT(count(out, "is a shard file for a world of 2 ranks, but this group has 3 ranks") >= 1);
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
    /* local ranks share this host: shared memory unless asked otherwise */
    CU_ASSERT(strstr(out, "\"transport\":\"shm\"") != NULL);
    /* rank 0's step split: the matmuls and the all_sums ran, and fit in the step */
    const char *ph = strstr(out, "\"tg_rank0_ms_per_token\":{");
    CU_ASSERT_PTR_NOT_NULL_FATAL(ph);
    const char *sp = strstr(ph, "\"step\":"), *mm = strstr(ph, "\"matmul\":"), *as = strstr(ph, "\"all_sum\":");
    CU_ASSERT_PTR_NOT_NULL_FATAL(sp);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mm);
    CU_ASSERT_PTR_NOT_NULL_FATAL(as);
    const double step = atof(sp + 7), matmul = atof(mm + 9), allsum = atof(as + 10);
    CU_ASSERT(matmul > 0.0 && allsum > 0.0);
    CU_ASSERT(matmul + allsum <= step);
    free(out);
    snprintf(cmd, sizeof cmd, "%s launch -n 2 --no-shm -- %s bench gen -m %s -p 8 -n 4 -t 1 --reps 1 --bw-mib 64 --json "
             "2>/dev/null", tp_test_tpserve(), tp_test_tpserve(), m);
    out = run(cmd, &st);
    CU_ASSERT_EQUAL(st, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT(strstr(out, "\"transport\":\"tcp\"") != NULL);
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

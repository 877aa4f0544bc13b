/*
 * tests/comm/test_comm_mpi.c - the mpi backend under a real mpirun.
 *
 * The test starts `mpirun --oversubscribe -n N --mca btl tcp,self` on this
 * very executable with TP_COMM_TEST_MPI_HELPER=1 in the environment; a
 * constructor below notices the variable before CUnit's main() runs, plays
 * one MPI rank (every collective and dtype against the exact oracle,
 * send/recv between every pair, split, non-blocking requests) and exits
 * with the number of failures.  Skips only when the build has no MPI
 * (-DTP_WITH_MPI=OFF); in an MPI build a missing mpirun or a backend that
 * cannot start is a failure.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm_test.h"
#include "tp_test.h"

#define HELPER_ENV "TP_COMM_TEST_MPI_HELPER"

static int mpi_rank_main(void)
{
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    tp_comm_t *c = NULL;
    cfg.backend = TP_COMM_BACKEND_MPI;
    if (tp_comm_init(&cfg, &c, &err) != TP_OK) {
        fprintf(stderr, "    mpi rank: init failed: %s\n", err.msg);
        return 100;
    }
    static const size_t counts[] = {0, 1, 7, 1000, (1u << 20) + 3};
    int fails = ct_check_collectives(c, counts, (int)TP_ARRAY_LEN(counts), 1);
    fails += ct_body_split(c, NULL);
    fails += ct_body_async(c, NULL);
    /* last: p2p ends with a deliberate count mismatch that poisons ranks 0/1 */
    fails += ct_body_p2p(c, NULL);
    if (fails) fprintf(stderr, "    mpi rank %d of %d: %d failure(s)\n", tp_comm_rank(c), tp_comm_size(c), fails);
    tp_comm_free(c);
    return fails ? 1 : 0;
}

/* A peer that never joins: rank 0's barrier must end with TP_ERR_TIMEOUT
 * after the op timeout (500 ms), not hang.  Exit 42 = as expected. */
static int mpi_stall_main(void)
{
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    tp_comm_t *c = NULL;
    cfg.backend = TP_COMM_BACKEND_MPI;
    cfg.op_timeout_ms = 500;
    if (tp_comm_init(&cfg, &c, &err) != TP_OK) {
        fprintf(stderr, "    mpi rank: init failed: %s\n", err.msg);
        return 100;
    }
    if (tp_comm_rank(c) != 0) {
        tp_sleep_ms(30000); /* stuck; mpirun stops us when rank 0 leaves */
        return 0;
    }
    uint64_t t0 = tp_now_ns();
    enum tp_status st = tp_comm_barrier(c);
    double s_ = (double)(tp_now_ns() - t0) / 1e9;
    const char *msg = tp_comm_last_error(c);
    int ok = st == TP_ERR_TIMEOUT && s_ > 0.4 && s_ < 5.0 && strstr(msg, "no progress for 500 ms") != NULL;
    fprintf(stderr, "    mpi rank 0: barrier with a stuck peer -> %s after %.2f s: %s\n", tp_status_str(st), s_, msg);
    /* a second call fails at once: the group is poisoned */
    ok = ok && tp_comm_barrier(c) == TP_ERR_POISONED;
    tp_comm_free(c); /* must not hang on the request that never completed */
    return ok ? 42 : 1;
}

__attribute__((constructor)) static void mpi_helper_mode(void);
__attribute__((constructor)) static void mpi_helper_mode(void)
{
    const char *h = getenv(HELPER_ENV);
    if (!h || (strcmp(h, "1") != 0 && strcmp(h, "stall") != 0)) return;
    tp_log_set_level(TP_LOG_LEVEL_COUNT); /* deliberate errors would be noise */
    int code = strcmp(h, "stall") == 0 ? mpi_stall_main() : mpi_rank_main();
    fflush(stdout);
    fflush(stderr);
    exit(code);
}

static const char *find_mpirun(void)
{
    static char path[1024];
    const char *p = getenv("PATH");
    while (p && *p) {
        const char *e = strchr(p, ':');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        snprintf(path, sizeof path, "%.*s/mpirun", (int)len, p);
        if (access(path, X_OK) == 0) return path;
        p = e ? e + 1 : NULL;
    }
    return NULL;
}

static void run_mpi_mode(int n, const char *mode, int want_code, double max_s)
{
    if (!TP_TEST_WITH_MPI) {
        tp_test_skip("built without MPI (-DTP_WITH_MPI=OFF): the mpi backend is a stub");
        return;
    }
    const char *mpirun = find_mpirun();
    if (!mpirun) fprintf(stderr, "    mpirun not found in PATH: install openmpi-bin (this build has MPI)\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mpirun);
#ifndef __linux__
    CU_FAIL("re-running this executable under mpirun needs /proc/self/exe (Linux)");
    (void)n, (void)mode, (void)want_code, (void)max_s;
#else
    char self[1024];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    CU_ASSERT_FATAL(len > 0);
    self[len] = '\0';
    char nstr[8];
    snprintf(nstr, sizeof nstr, "%d", n);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        setenv(HELPER_ENV, mode, 1);
        /* Sanitizer builds: OpenMPI's leaks at exit come from plugins it
         * dlclose()s; only full (slow) unwinding reaches the libmpi frame
         * that tests/lsan.supp names. */
        char asan[1024];
        const char *old = getenv("ASAN_OPTIONS");
        snprintf(asan, sizeof asan, "%s%sfast_unwind_on_malloc=0", old ? old : "", old && *old ? ":" : "");
        setenv("ASAN_OPTIONS", asan, 1);
        setpgid(0, 0);
        execl(mpirun, "mpirun", "--oversubscribe", "-n", nstr, "--mca", "btl", "tcp,self", "-x", HELPER_ENV, "-x",
              "ASAN_OPTIONS", self, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    uint64_t t0 = tp_now_ns();
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (tp_now_ns() - t0 > 150000000000ull) {
            fprintf(stderr, "    mpirun -n %d did not finish in 150 s: killing it\n", n);
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        tp_sleep_ms(20);
    }
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (code == 100) fprintf(stderr, "    the mpi backend could not start in an MPI build: see the message above\n");
    double took = (double)(tp_now_ns() - t0) / 1e9;
    if (code != want_code) fprintf(stderr, "    mpirun -n %d exited with %d (want %d)\n", n, code, want_code);
    CU_ASSERT_EQUAL(code, want_code);
    CU_ASSERT(took < max_s);
#endif
}

static void run_mpi(int n) { run_mpi_mode(n, "1", 0, 150); }

/* A stuck peer: rank 0 times out in 0.5 s and exits; mpirun stops the rest and reports rank 0's status. */
static void test_mpi_stall(void) { run_mpi_mode(3, "stall", 42, 20); }

static void test_mpi_w2(void) { run_mpi(2); }
static void test_mpi_w3(void) { run_mpi(3); }
static void test_mpi_w4(void) { run_mpi(4); }

static const struct tp_test_case mpi_cases[] = {
    {"mpirun_world2", test_mpi_w2},
    {"mpirun_world3", test_mpi_w3},
    {"mpirun_world4", test_mpi_w4},
    {"stuck_peer_times_out", test_mpi_stall},
    {NULL, NULL},
};
TP_TEST_SUITE(mpi, "multirank", 480, mpi_cases)

/*
 * tests/comm/test_comm_fail.c - failure behaviour with real rank processes:
 * a rank killed mid-collective (every other rank errors within 5 s), a rank
 * stopped with SIGSTOP (the others time out within TP_COMM_TIMEOUT_MS plus
 * slack), tp_comm_abort waking a blocked call.  Attacks on the handshake
 * are in test_comm_auth.c.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm_test.h"
#include "tp_test.h"

enum { EXIT_GOT_TIMEOUT = 10, EXIT_GOT_ERROR = 11, EXIT_NO_ERROR = 12, EXIT_NOT_POISONED = 13 };

/* Loop on collectives (large ring and small mesh messages) until one fails;
 * report how.  20 s without a failure is itself a failure. */
static int body_until_error(tp_comm_t *c, void *arg)
{
    (void)arg;
    enum { N = 300000 };
    float *buf = malloc(N * sizeof *buf);
    if (!buf) return 1;
    for (size_t i = 0; i < N; i++) buf[i] = 1.0f;
    uint64_t t0 = tp_now_ns();
    enum tp_status st = TP_OK;
    for (unsigned it = 0; st == TP_OK; it++) {
        st = tp_comm_all_sum(c, buf, buf, (it & 1) ? N : 1000, TP_DTYPE_F32);
        if (tp_now_ns() - t0 > 20000000000ull) break;
    }
    free(buf);
    if (st == TP_OK) return EXIT_NO_ERROR;
    fprintf(stderr, "    rank %d: failed as expected with %s: %s\n", tp_comm_rank(c), tp_status_str(st),
            tp_comm_last_error(c));
    float x = 0;
    if (tp_comm_all_sum(c, &x, &x, 1, TP_DTYPE_F32) != TP_ERR_POISONED || !tp_comm_is_poisoned(c))
        return EXIT_NOT_POISONED;
    return st == TP_ERR_TIMEOUT ? EXIT_GOT_TIMEOUT : EXIT_GOT_ERROR;
}

static void test_rank_killed(void)
{
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile(&g, 3, "t"), 0);
    CU_ASSERT_EQUAL_FATAL(ct_spawn(&g, body_until_error, NULL, NULL, 30000), 0);
    tp_sleep_ms(1500);
    kill(g.pids[1], SIGKILL);
    CU_ASSERT_EQUAL(ct_wait(&g, 10000), 0);
    CU_ASSERT(WIFSIGNALED(g.status[1]));
    for (int r = 0; r < 3; r += 2) {
        int code = WIFEXITED(g.status[r]) ? WEXITSTATUS(g.status[r]) : -1;
        if (code != EXIT_GOT_ERROR) fprintf(stderr, "    rank %d exit code %d\n", r, code);
        CU_ASSERT_EQUAL(code, EXIT_GOT_ERROR);
        CU_ASSERT(g.exit_s[r] >= 0 && g.exit_s[r] < 5.0);
    }
}

static void test_rank_stopped(void)
{
    const uint32_t timeout_ms = 1500;
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile(&g, 3, "t"), 0);
    CU_ASSERT_EQUAL_FATAL(ct_spawn(&g, body_until_error, NULL, NULL, timeout_ms), 0);
    tp_sleep_ms(1500);
    kill(g.pids[2], SIGSTOP);
    uint64_t t0 = tp_now_ns();
    int timeouts = 0;
    for (int r = 0; r < 2; r++) {
        int st = 0;
        while (waitpid(g.pids[r], &st, WNOHANG) == 0 && tp_now_ns() - t0 < 10000000000ull) tp_sleep_ms(5);
        double s = (double)(tp_now_ns() - t0) / 1e9;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        fprintf(stderr, "    rank %d exited %.2f s after SIGSTOP with code %d\n", r, s, code);
        CU_ASSERT(code == EXIT_GOT_TIMEOUT || code == EXIT_GOT_ERROR);
        CU_ASSERT(s < timeout_ms / 1000.0 + 2.5);
        timeouts += code == EXIT_GOT_TIMEOUT;
        g.exited[r] = 1;
    }
    CU_ASSERT(timeouts >= 1);
    kill(g.pids[2], SIGKILL);
    kill(g.pids[2], SIGCONT);
    ct_wait(&g, 5000);
}

/* tp_comm_abort from another thread wakes a call blocked on a silent peer. */
static void *abort_later(void *arg)
{
    tp_sleep_ms(300);
    tp_comm_abort(arg, "stopped by the watchdog");
    return NULL;
}

static int body_abort(tp_comm_t *c, void *arg)
{
    (void)arg;
    if (tp_comm_rank(c) == 0) {
        tp_sleep_ms(3000); /* says nothing while rank 1 waits */
        return 0;
    }
    pthread_t th;
    if (pthread_create(&th, NULL, abort_later, c) != 0) return 1;
    float x[4];
    uint64_t t0 = tp_now_ns();
    enum tp_status st = tp_comm_recv(c, x, 4, TP_DTYPE_F32, 0);
    double s = (double)(tp_now_ns() - t0) / 1e9;
    pthread_join(th, NULL);
    int bad = 0;
    if (st != TP_ERR_POISONED || s > 1.5) {
        fprintf(stderr, "    rank 1: recv returned %s after %.2f s, want poisoned within 1.5 s\n", tp_status_str(st), s);
        bad++;
    }
    if (!strstr(tp_comm_last_error(c), "stopped by the watchdog")) {
        fprintf(stderr, "    rank 1: last error '%s' lacks the abort reason\n", tp_comm_last_error(c));
        bad++;
    }
    if (tp_comm_barrier(c) != TP_ERR_POISONED) bad++;
    return bad;
}

static void test_abort_wakes(void) { ct_run_ok(2, body_abort, NULL, 20000); }

static const struct tp_test_case fail_cases[] = {
    {"abort_wakes_blocked_call", test_abort_wakes},
    {"rank_killed_mid_collective", test_rank_killed},
    {"rank_stopped_times_out", test_rank_stopped},
    {NULL, NULL},
};
TP_TEST_SUITE(failures, "multirank", 120, fail_cases)

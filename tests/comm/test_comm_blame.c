/*
 * tests/comm/test_comm_blame.c - which rank rank 0 names after a loss
 * (tp_comm_lost_rank, tp_comm_silent_rank), with real rank processes on
 * 127.0.0.1: groups of 2, 3 and 4 ranks run ring all_sums the way the
 * engine's steps do; each worker position in turn is stopped (SIGSTOP) or
 * killed (SIGKILL) mid-run.  In a ring the stopped rank's neighbours time
 * out in their own collectives as rank 0 does, and a surviving worker that
 * gives up first closes its links; rank 0 must still name the stopped rank,
 * never a survivor.  The oracle is the position the test chose.  A short op
 * timeout (below the 1 s silence threshold) checks the case where the
 * survivors leave before the stopped rank's silence counts.
 */
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm_test.h"
#include "tp_test.h"

#define BLAME_SILENT_MS 1000u /* the engine's threshold (server/scheduler.c TP_ENGINE_SILENT_MS) */

struct blame_arg {
    int pipe_wr; /* rank 0 writes int32 -2 once running, then (lost, silent_600, status) */
};

/* Every rank: small all_sums until one fails (rank 0 paces them 1 ms apart,
 * the others wait inside the collective as workers do).  Rank 0 then asks,
 * as the engine does, which rank was lost (up to 600 ms for the heartbeat
 * thread to see it) and reports it. */
static int body_blame(tp_comm_t *c, void *arg)
{
    const struct blame_arg *ba = arg;
    float buf[256];
    for (int i = 0; i < 256; i++) buf[i] = 1.0f;
    const int rank = tp_comm_rank(c);
    uint64_t t0 = tp_now_ns();
    enum tp_status st = TP_OK;
    for (unsigned it = 0; st == TP_OK; it++) {
        st = tp_comm_all_sum(c, buf, buf, 256, TP_DTYPE_F32);
        if (rank == 0 && it == 20) {
            int32_t ready = -2;
            if (write(ba->pipe_wr, &ready, sizeof ready) != (ssize_t)sizeof ready) return 1;
        }
        if (rank == 0) tp_sleep_ms(1);
        if (tp_now_ns() - t0 > 30000000000ull) return 2; /* no failure within 30 s */
        for (int i = 0; i < 256; i++) buf[i] = 1.0f;
    }
    if (rank != 0) return 0; /* freeing the group tells rank 0 we leave alive */
    int32_t out[3] = {-1, -1, (int32_t)st};
    for (int i = 0; i < 12 && out[0] < 0; i++) {
        out[0] = tp_comm_lost_rank(c, BLAME_SILENT_MS, NULL);
        if (out[0] < 0) tp_sleep_ms(50);
    }
    /* the cluster view's question (600 ms of silence), asked once the loss is known */
    for (int i = 0; i < 20 && out[1] < 0; i++) {
        out[1] = tp_comm_silent_rank(c, 600, NULL);
        if (out[1] < 0) tp_sleep_ms(50);
    }
    return write(ba->pipe_wr, out, sizeof out) == (ssize_t)sizeof out ? 0 : 1;
}

/* Read one int32 from fd within ms; 0 on success. */
static int read_within(int fd, int32_t *v, size_t n, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, ms) != 1) return -1;
    return read(fd, v, n * sizeof *v) == (ssize_t)(n * sizeof *v) ? 0 : -1;
}

/* One group of n ranks; worker `victim` gets `sig` once rank 0 is running. */
static void blame_case(int n, int victim, int sig, uint32_t op_timeout_ms)
{
    int p[2];
    CU_ASSERT_FATAL(pipe(p) == 0);
    struct blame_arg ba = {.pipe_wr = p[1]};
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile_held(&g, n, NULL), 0);
    CU_ASSERT_EQUAL_FATAL(ct_spawn(&g, body_blame, &ba, NULL, op_timeout_ms), 0);
    close(p[1]);
    int32_t ready = 0, out[3] = {-9, -9, 0};
    int got_ready = read_within(p[0], &ready, 1, 20000) == 0 && ready == -2;
    CU_ASSERT(got_ready);
    if (got_ready) {
        kill(g.pids[victim], sig);
        CU_ASSERT_EQUAL(read_within(p[0], out, 3, 20000), 0);
    }
    if (sig == SIGSTOP) kill(g.pids[victim], SIGKILL); /* its part is over */
    CU_ASSERT_EQUAL(ct_wait(&g, 15000), 0);
    close(p[0]);
    fprintf(stderr, "    %d ranks, op timeout %u ms, %s rank %d: rank 0 failed with %s, named rank %d (silent: %d)\n",
            n, op_timeout_ms, sig == SIGSTOP ? "SIGSTOP" : "SIGKILL", victim, tp_status_str((enum tp_status)out[2]),
            out[0], out[1]);
    CU_ASSERT_EQUAL(out[0], victim);
    CU_ASSERT_EQUAL(out[1], victim);
    CU_ASSERT(WIFEXITED(g.status[0]) && WEXITSTATUS(g.status[0]) == 0);
}

static void blame_all_positions(int n)
{
    for (int v = 1; v < n; v++) {
        blame_case(n, v, SIGSTOP, 2000);
        blame_case(n, v, SIGKILL, 2000);
    }
}

static void test_blame_2(void) { blame_all_positions(2); }
static void test_blame_3(void) { blame_all_positions(3); }
static void test_blame_4(void) { blame_all_positions(4); }

/* Op timeout 700 ms, below the 1 s silence threshold: the survivors leave
 * before the stopped rank counts as silent; it is still the one named. */
static void test_blame_short_timeout(void)
{
    blame_case(4, 2, SIGSTOP, 700);
    blame_case(3, 1, SIGSTOP, 700);
}

static const struct tp_test_case blame_cases[] = {
    {"blame_2", test_blame_2},
    {"blame_3", test_blame_3},
    {"blame_4", test_blame_4},
    {"blame_short_timeout", test_blame_short_timeout},
    {NULL, NULL},
};
TP_TEST_SUITE(blame, "multirank", 180, blame_cases)

/*
 * tests/comm/test_comm_shm.c - the shared-memory transport (cfg.shm) with
 * real rank processes on this host: every collective against the exact
 * oracle (the byte rings wrap many times at the large counts, every rank on
 * "shm"), a rank 0 that cannot create the rings leaving every rank on TCP, send/recv
 * between every pair, a killed rank and a stopped rank still fail loudly
 * and in time (through the TCP side channel and the op timeout).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm_test.h"
#include "tp_test.h"

/* arg: the transport every rank must be on ("shm", or "tcp" after a fallback). */
static int body_collectives(tp_comm_t *c, void *arg)
{
    if (strcmp(tp_comm_transport(c), (const char *)arg) != 0) {
        fprintf(stderr, "    rank %d: transport %s, want %s\n", tp_comm_rank(c), tp_comm_transport(c), (const char *)arg);
        return 20;
    }
    static const size_t counts[] = {0, 1, 7, 1000, (1u << 20) + 3};
    return ct_check_collectives(c, counts, 5, 1);
}

static void run_shm(int n, ct_rank_fn fn, const char *arg, int timeout_ms)
{
    ct_shm = 1;
    ct_run_ok(n, fn, (void *)arg, timeout_ms);
    ct_shm = 0;
}

static void test_collectives_w2(void) { run_shm(2, body_collectives, "shm", 90000); }
static void test_collectives_w3(void) { run_shm(3, body_collectives, "shm", 90000); }

/* Rank 0's file-size limit stops it growing a segment: it cannot create the rings, every rank stays on
 * TCP (each one checks its transport) and the collectives are still exact. */
static void fallback(int n)
{
#ifdef __linux__
    ct_shm_fsize_rank = 0;
    run_shm(n, body_collectives, "tcp", 90000);
    ct_shm_fsize_rank = -1;
#else
    (void)n;
    tp_test_skip("the file-size limit stops a shared-memory segment's growth on Linux (tmpfs) only");
#endif
}
static void test_fallback_create_w2(void) { fallback(2); }
static void test_fallback_create_w3(void) { fallback(3); }

/* A rank that waits past the spin and the yields (2 ms) sleeps in poll(), and its peer's doorbell must
 * end that sleep, not the end of its 20 ms slice: rank 1 comes 8 ms late to each of 20 small all_sums
 * (rank 0 sleeps waiting for bytes: rx_sleep) and to each of 10 receives of 2 MiB that rank 0 sends
 * (twice a ring: rank 0 sleeps waiting for space until rank 1 reads: tx_sleep).  Rank 0's comm stats
 * count its sleeps and those that lasted the whole slice: it must have slept for at least a third of
 * the 30 (on a loaded machine rank 0 itself may come late), and at most a fifth of its sleeps may have
 * run out (with either doorbell removed, most of them do; a few may, where the machine holds rank 1
 * back for 20 ms).  Exact data checked (the sends' whole buffer after the last one, a marker in each). */
static int body_sleepers(tp_comm_t *c, void *arg)
{
    (void)arg;
    enum { BIG = 1 << 19 };
    float *buf = malloc(BIG * sizeof *buf);
    if (!buf) return 1;
    const int me = tp_comm_rank(c);
    uint64_t t0 = tp_now_ns();
    int bad = 0;
    for (int it = 0; it < 20 && !bad; it++) {
        for (size_t i = 0; i < 64; i++) buf[i] = (float)(me + 1) * (float)(i % 7);
        if (me == 1) tp_sleep_ms(8);
        if (tp_comm_all_sum(c, buf, buf, 64, TP_DTYPE_F32) != TP_OK) bad = 2;
        for (size_t i = 0; i < 64 && !bad; i++)
            if (buf[i] != 3.0f * (float)(i % 7)) bad = 3;
    }
    const double small_ms = (double)(tp_now_ns() - t0) / 1e6;
    t0 = tp_now_ns();
    for (size_t i = 0; i < BIG; i++) buf[i] = me == 0 ? (float)(i % 1000) : -1.0f;
    for (int it = 0; it < 10 && !bad; it++) { /* element 0 marks the iteration; the rest checked at the end */
        buf[0] = (float)it;
        if (me == 0 && tp_comm_send(c, buf, BIG, TP_DTYPE_F32, 1) != TP_OK) bad = 4;
        if (me == 1) {
            tp_sleep_ms(8);
            if (tp_comm_recv(c, buf, BIG, TP_DTYPE_F32, 0) != TP_OK || buf[0] != (float)it) bad = 5;
        }
    }
    for (size_t i = 1; i < BIG && !bad && me == 1; i++)
        if (buf[i] != (float)(i % 1000)) bad = 6;
    const double big_ms = (double)(tp_now_ns() - t0) / 1e6;
    free(buf);
    struct tp_comm_stats cs;
    tp_comm_get_stats(c, &cs);
    fprintf(stderr, "    rank %d: 20 late all_sums in %.0f ms, 10 sends to a late receiver in %.0f ms; %llu sleeps, "
            "%llu ran out their slice\n", me, small_ms, big_ms, (unsigned long long)cs.n_sleeps,
            (unsigned long long)cs.n_sleeps_full);
    if (bad || me != 0) return bad;
    return cs.n_sleeps < 10 ? 30 : cs.n_sleeps_full * 5 > cs.n_sleeps ? 31 : 0;
}

static void test_sleepers(void) { run_shm(2, body_sleepers, NULL, 60000); }

static void test_p2p_w4(void) { run_shm(4, ct_body_p2p, NULL, 30000); }
static void test_async_w2(void) { run_shm(2, ct_body_async, NULL, 30000); }

static int body_until_error(tp_comm_t *c, void *arg)
{
    (void)arg;
    enum { N = 300000 };
    float *buf = calloc(N, sizeof *buf);
    if (!buf) return 1;
    uint64_t t0 = tp_now_ns();
    enum tp_status st = TP_OK;
    for (unsigned it = 0; st == TP_OK && tp_now_ns() - t0 < 20000000000ull; it++)
        st = tp_comm_all_sum(c, buf, buf, (it & 1) ? N : 1000, TP_DTYPE_F32);
    free(buf);
    fprintf(stderr, "    rank %d: %s: %s\n", tp_comm_rank(c), tp_status_str(st), tp_comm_last_error(c));
    return st == TP_OK ? 12 : st == TP_ERR_TIMEOUT ? 10 : 11;
}

static void kill_or_stop(int sig, uint32_t timeout_ms, double limit_s)
{
    struct ct_group g;
    ct_shm = 1;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile(&g, 3, "shm"), 0);
    CU_ASSERT_EQUAL_FATAL(ct_spawn(&g, body_until_error, NULL, NULL, timeout_ms), 0);
    ct_shm = 0;
    tp_sleep_ms(1500);
    kill(g.pids[1], sig);
    uint64_t t0 = tp_now_ns();
    for (int r = 0; r < 3; r += 2) {
        int st = 0;
        while (waitpid(g.pids[r], &st, WNOHANG) == 0 && tp_now_ns() - t0 < 15000000000ull) tp_sleep_ms(5);
        double s = (double)(tp_now_ns() - t0) / 1e9;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        fprintf(stderr, "    rank %d exited %.2f s after signal %d with code %d\n", r, s, sig, code);
        CU_ASSERT(code == 10 || code == 11);
        CU_ASSERT(s < limit_s);
        g.exited[r] = 1;
    }
    kill(g.pids[1], SIGKILL);
    kill(g.pids[1], SIGCONT);
    ct_wait(&g, 5000);
}

static void test_killed(void) { kill_or_stop(SIGKILL, 30000, 5.0); }
static void test_stopped(void) { kill_or_stop(SIGSTOP, 1500, 1.5 + 2.5); }

static const struct tp_test_case shm_cases[] = {
    {"collectives_world2", test_collectives_w2},
    {"collectives_world3", test_collectives_w3},
    {"sleepers_woken_by_doorbell", test_sleepers},
    {"fallback_to_tcp_world2", test_fallback_create_w2},
    {"fallback_to_tcp_world3", test_fallback_create_w3},
    {"p2p_every_pair_world4", test_p2p_w4},
    {"nonblocking_world2", test_async_w2},
    {"rank_killed", test_killed},
    {"rank_stopped", test_stopped},
    {NULL, NULL},
};
TP_TEST_SUITE(shm, "multirank", 300, shm_cases)

/*
 * tests/comm/test_comm_fail.c - failure behaviour with real rank processes:
 * a rank killed mid-collective (every other rank errors within 5 s), a rank
 * stopped with SIGSTOP (the others time out within TP_COMM_TIMEOUT_MS plus
 * slack), stray connections with a wrong magic or cluster token (rejected
 * with a REJECT frame; the group still forms and works).
 */
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "comm/comm_wire.h"
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

static int connect_local(int port)
{
    for (int tries = 0; tries < 400; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
        close(fd);
        tp_sleep_ms(25);
    }
    return -1;
}

/* Send a frame, expect a REJECT with the given reason, then EOF. */
static void stray(int port, const struct tp_wire_frame *f, uint32_t want_reason)
{
    int fd = connect_local(port);
    CU_ASSERT_FATAL(fd >= 0);
    struct timeval tv = {.tv_sec = 5, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t buf[TP_WIRE_FRAME_BYTES];
    tp_wire_encode(f, buf);
    CU_ASSERT_EQUAL(send(fd, buf, sizeof buf, 0), (ssize_t)sizeof buf);
    size_t got = 0;
    while (got < sizeof buf) {
        ssize_t r = recv(fd, buf + got, sizeof buf - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    CU_ASSERT_EQUAL(got, sizeof buf);
    struct tp_wire_frame rep;
    tp_wire_decode(buf, &rep);
    CU_ASSERT_EQUAL(rep.magic, TP_WIRE_MAGIC);
    CU_ASSERT_EQUAL(rep.kind, TP_WIRE_REJECT);
    CU_ASSERT_EQUAL(rep.arg, want_reason);
    CU_ASSERT_EQUAL(recv(fd, buf, 1, 0), 0); /* closed after the answer */
    close(fd);
}

static int body_small_check(tp_comm_t *c, void *arg)
{
    (void)arg;
    static const size_t counts[] = {1, 1000};
    return ct_check_collectives(c, counts, 2, 0);
}

static void test_stray_connections(void)
{
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile(&g, 2, NULL), 0);
    CU_ASSERT_FATAL(ct_spawn_one(&g, 0, body_small_check, NULL, "right-token", 0) > 0);
    struct tp_wire_frame f = {.magic = 0x12345678u, .version = TP_WIRE_VERSION, .kind = TP_WIRE_HELLO,
                              .rank = 1, .world_size = 2};
    tp_wire_token_digest("right-token", f.token);
    stray(g.ports[0], &f, TP_REJECT_MAGIC);
    f.magic = TP_WIRE_MAGIC;
    tp_wire_token_digest("wrong-token", f.token);
    stray(g.ports[0], &f, TP_REJECT_TOKEN);
    tp_wire_token_digest("right-token", f.token);
    f.world_size = 5;
    stray(g.ports[0], &f, TP_REJECT_WORLD);
    f.world_size = 2;
    f.version = TP_WIRE_VERSION + 1;
    stray(g.ports[0], &f, TP_REJECT_VERSION);
    /* a connection that says nothing and leaves */
    int fd = connect_local(g.ports[0]);
    CU_ASSERT(fd >= 0);
    close(fd);
    /* the real rank 1 still joins and the group works */
    CU_ASSERT_FATAL(ct_spawn_one(&g, 1, body_small_check, NULL, "right-token", 0) > 0);
    CU_ASSERT_EQUAL(ct_wait(&g, 30000), 0);
    for (int r = 0; r < 2; r++) CU_ASSERT(WIFEXITED(g.status[r]) && WEXITSTATUS(g.status[r]) == 0);
}

/* Two processes claiming rank 1 with the other's hello rejected. */
static void test_wrong_token_rank_fails(void)
{
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile(&g, 2, NULL), 0);
    CU_ASSERT_FATAL(ct_spawn_one(&g, 0, body_small_check, NULL, "alpha", 0) > 0);
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    tp_comm_t *c = NULL;
    cfg.rank = 1;
    cfg.world_size = 2;
    cfg.hostfile = g.hostfile;
    cfg.cluster_token = "beta";
    cfg.connect_timeout_ms = 5000;
    CU_ASSERT_EQUAL(tp_comm_init(&cfg, &c, &err), TP_ERR_PROTOCOL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "cluster token mismatch"));
    kill(g.pids[0], SIGKILL);
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
    {"stray_connections_rejected", test_stray_connections},
    {"wrong_token_named", test_wrong_token_rank_fails},
    {NULL, NULL},
};
TP_TEST_SUITE(failures, "multirank", 120, fail_cases)

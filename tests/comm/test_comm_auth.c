/*
 * tests/comm/test_comm_auth.c - attacks on the rank handshake with real rank
 * processes on 127.0.0.1, and the liveness side channel.
 *
 * Each attack runs against a real rank 0 waiting for its group: junk bytes
 * and then the REJECT's bytes replayed in a HELLO/PROOF; a real handshake
 * captured by a relay and replayed against a fresh rank 0; a wrong token;
 * random bytes after a forged HELLO.  Each must be refused with a REJECT that
 * carries no secret material, rank 0's log must show the peer's address and
 * its bytes escaped (never raw), and the real rank 1 must then join and every
 * collective must give the exact oracle values.  A group on a non-loopback
 * address without a token is refused before any socket opens.  A stopped
 * worker shows in tp_comm_silent_rank on rank 0 while rank 0 is blocked in
 * a receive, and clears after SIGCONT.
 */
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "comm/comm_impl.h"
#include "comm/comm_wire.h"
#include "comm_test.h"
#include "tp_test.h"

#define TOKEN "right-token-0123456789abcdef"

/* ---------------------------------------------------------------- helpers */

static int g_log_fd = -1;

/* Log hook of the rank processes: every line appended to g_log_fd. */
static void file_hook(enum tp_log_level level, const char *module, const char *msg, void *user)
{
    (void)level;
    (void)user;
    char line[2048];
    int n = snprintf(line, sizeof line, "%s: %s\n", module, msg);
    if (n > 0 && g_log_fd >= 0) {
        ssize_t w = write(g_log_fd, line, (size_t)TP_MIN(n, (int)sizeof line - 1));
        (void)w;
    }
}

/* Route the log of processes forked from now on into a fresh file. */
static void log_to_file(char *path, size_t cap)
{
    static int seq;
    snprintf(path, cap, "%s/auth-log-%d-%d.txt", tp_test_tmpdir(), (int)getpid(), seq++);
    g_log_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    CU_ASSERT_FATAL(g_log_fd >= 0);
    tp_log_set_hook(file_hook, NULL);
}

static void log_stop(void)
{
    tp_log_set_hook(NULL, NULL);
    if (g_log_fd >= 0) close(g_log_fd);
    g_log_fd = -1;
}

/* The whole log file (NUL terminated, raw bytes kept); caller frees. */
static char *read_log(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = calloc(1, 1 << 20);
    *len = 0;
    if (f && buf) *len = fread(buf, 1, (1 << 20) - 1, f);
    if (f) fclose(f);
    return buf;
}

static int mem_has(const char *hay, size_t n, const void *needle, size_t m)
{
    for (size_t i = 0; i + m <= n; i++)
        if (memcmp(hay + i, needle, m) == 0) return 1;
    return 0;
}

static int read_n(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static const uint8_t zeros[TP_WIRE_AUTH_BYTES];

/* Read a frame and assert it is a REJECT for want_reason (0: any) with no
 * secret material (zero auth field), followed by EOF. */
static void expect_reject(int fd, uint32_t want_reason)
{
    uint8_t buf[TP_WIRE_FRAME_BYTES];
    CU_ASSERT_EQUAL_FATAL(read_n(fd, buf, sizeof buf), 0);
    struct tp_wire_frame rep;
    tp_wire_decode(buf, &rep);
    CU_ASSERT_EQUAL(rep.magic, TP_WIRE_MAGIC);
    CU_ASSERT_EQUAL(rep.kind, TP_WIRE_REJECT);
    if (want_reason) CU_ASSERT_EQUAL(rep.arg, want_reason);
    CU_ASSERT_NOT_EQUAL(rep.arg, TP_REJECT_NONE);
    CU_ASSERT_EQUAL(memcmp(rep.auth, zeros, sizeof zeros), 0);
    CU_ASSERT_EQUAL(recv(fd, buf, 1, 0), 0); /* closed after the answer */
}

static void send_frame(int fd, const struct tp_wire_frame *f)
{
    uint8_t buf[TP_WIRE_FRAME_BYTES];
    tp_wire_encode(f, buf);
    CU_ASSERT_EQUAL(send(fd, buf, sizeof buf, MSG_NOSIGNAL), (ssize_t)sizeof buf);
}

/* Send a forged HELLO (rank 1 of 2) with the given auth bytes; read the
 * CHALLENGE (asserted: fresh nonce, not zero). */
static void forged_hello(int fd, const uint8_t auth[TP_WIRE_AUTH_BYTES])
{
    struct tp_wire_frame f = {.magic = TP_WIRE_MAGIC, .version = TP_WIRE_VERSION, .kind = TP_WIRE_HELLO,
                              .rank = 1, .world_size = 2, .arg = TP_WIRE_CH_DATA};
    memcpy(f.auth, auth, TP_WIRE_AUTH_BYTES);
    send_frame(fd, &f);
    uint8_t buf[TP_WIRE_FRAME_BYTES];
    CU_ASSERT_EQUAL_FATAL(read_n(fd, buf, sizeof buf), 0);
    struct tp_wire_frame ch;
    tp_wire_decode(buf, &ch);
    CU_ASSERT_EQUAL(ch.kind, TP_WIRE_CHALLENGE);
    CU_ASSERT_EQUAL(ch.rank, 0);
    CU_ASSERT_NOT_EQUAL(memcmp(ch.auth, zeros, sizeof zeros), 0);
}

static int body_small_check(tp_comm_t *c, void *arg)
{
    (void)arg;
    static const size_t counts[] = {1, 1000, 70000};
    return ct_check_collectives(c, counts, 3, 0);
}

/* Start the real rank 1 of g and assert both ranks pass the oracle. */
static void finish_group(struct ct_group *g, const char *token)
{
    CU_ASSERT_FATAL(ct_spawn_one(g, 1, body_small_check, NULL, token, 0) > 0);
    CU_ASSERT_EQUAL(ct_wait(g, 30000), 0);
    for (int r = 0; r < 2; r++) CU_ASSERT(WIFEXITED(g->status[r]) && WEXITSTATUS(g->status[r]) == 0);
}

/* The log has the rejection with the peer's address, peer bytes only escaped. */
static void check_log(const char *path, const char *escaped, const void *raw, size_t raw_len)
{
    size_t n = 0;
    char *log = read_log(path, &n);
    CU_ASSERT_FATAL(log != NULL);
    int ok_line = mem_has(log, n, "rejected a connection from 127.0.0.1:", 37);
    int ok_esc = mem_has(log, n, escaped, strlen(escaped));
    int no_raw = !mem_has(log, n, raw, raw_len);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)log[i] < 0x20 && log[i] != '\n') no_raw = 0; /* control bytes never reach the log */
    if (!ok_line || !ok_esc || !no_raw) fprintf(stderr, "    log (%zu bytes):\n%s\n", n, log);
    CU_ASSERT(ok_line);
    CU_ASSERT(ok_esc);
    CU_ASSERT(no_raw);
    free(log);
}

/* ---------------------------------------------------------------- attacks */

/* 64 junk bytes, then the REJECT's bytes replayed as nonce and as proof. */
static void test_junk_then_replay(void)
{
    struct ct_group g;
    char logpath[512];
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile_held(&g, 2, NULL), 0);
    log_to_file(logpath, sizeof logpath);
    CU_ASSERT_FATAL(ct_spawn_one(&g, 0, body_small_check, NULL, TOKEN, 0) > 0);
    log_stop();

    uint8_t junk[TP_WIRE_FRAME_BYTES];
    static const char evil[] = "\x1b[31mEVIL\r\n";
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
    memcpy(junk, evil, sizeof evil - 1);
    int fd = tp_test_connect_loopback(g.ports[0], 400);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(send(fd, junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
    uint8_t reply[TP_WIRE_FRAME_BYTES];
    CU_ASSERT_EQUAL_FATAL(read_n(fd, reply, sizeof reply), 0);
    close(fd);
    struct tp_wire_frame rep;
    tp_wire_decode(reply, &rep);
    CU_ASSERT_EQUAL(rep.kind, TP_WIRE_REJECT);
    CU_ASSERT_EQUAL(rep.arg, TP_REJECT_MAGIC);
    CU_ASSERT_EQUAL(memcmp(rep.auth, zeros, sizeof zeros), 0); /* nothing derived from the token */

    /* replay the reply's auth bytes as the nonce, then as the proof */
    fd = tp_test_connect_loopback(g.ports[0], 400);
    CU_ASSERT_FATAL(fd >= 0);
    forged_hello(fd, rep.auth);
    struct tp_wire_frame proof = {.magic = TP_WIRE_MAGIC, .version = TP_WIRE_VERSION, .kind = TP_WIRE_PROOF,
                                  .rank = 1, .world_size = 2};
    memcpy(proof.auth, reply + 16, TP_WIRE_AUTH_BYTES);
    send_frame(fd, &proof);
    expect_reject(fd, TP_REJECT_AUTH);
    close(fd);
    /* the whole REJECT frame replayed as the first frame */
    fd = tp_test_connect_loopback(g.ports[0], 400);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(send(fd, reply, sizeof reply, MSG_NOSIGNAL), (ssize_t)sizeof reply);
    expect_reject(fd, TP_REJECT_KIND);
    close(fd);

    finish_group(&g, TOKEN);
    check_log(logpath, "\\x1b\\x5b\\x33\\x31\\x6d\\x45\\x56\\x49\\x4c", "EVIL", 4);
    unlink(logpath);
}

/* A relay between rank 1 and rank 0 that records what rank 1 sent on its
 * first connection (HELLO + PROOF), then forwards everything both ways. */
struct relay {
    int lfd, port, target_port;
    uint8_t captured[2 * TP_WIRE_FRAME_BYTES];
    size_t n_captured;
    int n_conns;
};

static void *relay_main(void *arg)
{
    struct relay *rl = arg;
    int a[2] = {-1, -1}, b[2] = {-1, -1}; /* a: from rank 1, b: to rank 0 */
    uint64_t t0 = tp_now_ns();
    int open_pairs = 0;
    while (tp_now_ns() - t0 < 30000000000ull) {
        struct pollfd p[5];
        int np = 0;
        p[np++] = (struct pollfd){.fd = rl->n_conns < 2 ? rl->lfd : -1, .events = POLLIN};
        for (int i = 0; i < 2; i++) {
            p[np++] = (struct pollfd){.fd = a[i], .events = POLLIN};
            p[np++] = (struct pollfd){.fd = b[i], .events = POLLIN};
        }
        if (poll(p, (nfds_t)np, 100) <= 0) {
            if (rl->n_conns == 2 && open_pairs == 0) break;
            continue;
        }
        if (p[0].revents & POLLIN) {
            int i = rl->n_conns++;
            a[i] = accept(rl->lfd, NULL, NULL);
            b[i] = tp_test_connect_loopback(rl->target_port, 400);
            open_pairs++;
        }
        for (int i = 0; i < 2; i++)
            for (int dir = 0; dir < 2; dir++) {
                struct pollfd *q = &p[1 + 2 * i + dir];
                if (q->fd < 0 || !q->revents) continue;
                int from = dir ? b[i] : a[i], to = dir ? a[i] : b[i];
                uint8_t buf[65536];
                ssize_t r = recv(from, buf, sizeof buf, 0);
                if (r <= 0) {
                    close(a[i]);
                    close(b[i]);
                    a[i] = b[i] = -1;
                    open_pairs--;
                    continue;
                }
                if (i == 0 && dir == 0 && rl->n_captured < sizeof rl->captured) {
                    size_t k = TP_MIN((size_t)r, sizeof rl->captured - rl->n_captured);
                    memcpy(rl->captured + rl->n_captured, buf, k);
                    rl->n_captured += k;
                }
                for (ssize_t off = 0; off < r;) {
                    ssize_t w = send(to, buf + off, (size_t)(r - off), MSG_NOSIGNAL);
                    if (w <= 0) break;
                    off += w;
                }
            }
    }
    for (int i = 0; i < 2; i++) {
        if (a[i] >= 0) close(a[i]);
        if (b[i] >= 0) close(b[i]);
    }
    return NULL;
}

static void test_captured_handshake_replayed(void)
{
    struct ct_group g, g1;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile_held(&g, 2, NULL), 0);
    /* rank 1 reaches rank 0 through the relay: its hostfile names the relay's port */
    struct relay rl = {.target_port = g.ports[0]};
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rl.lfd = socket(AF_INET, SOCK_STREAM, 0);
    CU_ASSERT_FATAL(rl.lfd >= 0 && bind(rl.lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(rl.lfd, 4) == 0 &&
                    getsockname(rl.lfd, (struct sockaddr *)&sa, &sl) == 0);
    rl.port = ntohs(sa.sin_port);
    g1 = g;
    g1.listen_fd[0] = -1; /* rank 1 (spawned from g1) takes its socket; rank 0's is g's */
    g.listen_fd[1] = -1;
    snprintf(g1.hostfile, sizeof g1.hostfile, "%s/hostfile-relay-%d.json", tp_test_tmpdir(), (int)getpid());
    FILE *f = fopen(g1.hostfile, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"hosts\": [{\"ips\": [\"127.0.0.1\"], \"port\": %d}, {\"ips\": [\"127.0.0.1\"], \"port\": %d}]}\n",
            rl.port, g.ports[1]);
    fclose(f);
    /* both ranks forked before the relay thread starts: a fork while another thread runs copies
     * whatever lock that thread holds (malloc's, the sanitizer's) locked into the child, which then
     * hangs; rank 1's connection waits in the relay socket's backlog until the thread accepts it */
    CU_ASSERT_FATAL(ct_spawn_one(&g, 0, body_small_check, NULL, TOKEN, 0) > 0);
    CU_ASSERT_FATAL(ct_spawn_one(&g1, 1, body_small_check, NULL, TOKEN, 0) > 0);
    g.pids[1] = g1.pids[1];
    pthread_t th;
    CU_ASSERT_FATAL(pthread_create(&th, NULL, relay_main, &rl) == 0);
    CU_ASSERT_EQUAL(ct_wait(&g, 30000), 0);
    for (int r = 0; r < 2; r++) CU_ASSERT(WIFEXITED(g.status[r]) && WEXITSTATUS(g.status[r]) == 0);
    pthread_join(th, NULL);
    close(rl.lfd);
    unlink(g1.hostfile);
    CU_ASSERT_EQUAL_FATAL(rl.n_captured, 2 * TP_WIRE_FRAME_BYTES);
    struct tp_wire_frame hello, proof;
    tp_wire_decode(rl.captured, &hello);
    tp_wire_decode(rl.captured + TP_WIRE_FRAME_BYTES, &proof);
    CU_ASSERT_EQUAL(hello.kind, TP_WIRE_HELLO);
    CU_ASSERT_EQUAL(proof.kind, TP_WIRE_PROOF);
    /* nothing on the wire contains the token */
    CU_ASSERT(!mem_has((const char *)rl.captured, sizeof rl.captured, TOKEN, strlen(TOKEN)));

    /* a fresh rank 0 on the same address: the captured frames replayed */
    char logpath[512];
    struct ct_group g2;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile_held(&g2, 2, NULL), 0);
    log_to_file(logpath, sizeof logpath);
    CU_ASSERT_FATAL(ct_spawn_one(&g2, 0, body_small_check, NULL, TOKEN, 0) > 0);
    log_stop();
    int fd = tp_test_connect_loopback(g2.ports[0], 400);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(send(fd, rl.captured, TP_WIRE_FRAME_BYTES, MSG_NOSIGNAL), TP_WIRE_FRAME_BYTES);
    uint8_t ch[TP_WIRE_FRAME_BYTES];
    CU_ASSERT_EQUAL_FATAL(read_n(fd, ch, sizeof ch), 0);
    CU_ASSERT_EQUAL(ch[6], TP_WIRE_CHALLENGE);
    CU_ASSERT_EQUAL(send(fd, rl.captured + TP_WIRE_FRAME_BYTES, TP_WIRE_FRAME_BYTES, MSG_NOSIGNAL),
                    TP_WIRE_FRAME_BYTES);
    expect_reject(fd, TP_REJECT_AUTH);
    close(fd);
    finish_group(&g2, TOKEN);
    char esc[5 * 4 + 1];
    tp_wire_escape(rl.captured + TP_WIRE_FRAME_BYTES, 5, esc, sizeof esc); /* the replayed PROOF's first bytes */
    check_log(logpath, esc, "\x1b", 1);
    unlink(logpath);
}

/* A rank with the wrong token is refused (and told why); the right one joins. */
static void test_wrong_token(void)
{
    struct ct_group g;
    char logpath[512];
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile_held(&g, 2, NULL), 0);
    log_to_file(logpath, sizeof logpath);
    CU_ASSERT_FATAL(ct_spawn_one(&g, 0, body_small_check, NULL, "alpha", 0) > 0);
    log_stop();
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    tp_comm_t *c = NULL;
    cfg.rank = 1;
    cfg.world_size = 2;
    cfg.hostfile = g.hostfile;
    cfg.cluster_token = "beta";
    cfg.connect_timeout_ms = 5000;
    cfg.listen_fd = dup(g.listen_fd[1]); /* rank 1's held socket (the attempt closes its copy) */
    CU_ASSERT_EQUAL(tp_comm_init(&cfg, &c, &err), TP_ERR_PROTOCOL);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "authentication failed"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "TP_CLUSTER_TOKEN"));
    /* a different group id with the right token is refused the same way */
    cfg.cluster_token = "alpha";
    cfg.group_id = "another-model";
    cfg.listen_fd = dup(g.listen_fd[1]);
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_comm_init(&cfg, &c, &err), TP_ERR_PROTOCOL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "authentication failed"));
    finish_group(&g, "alpha");
    size_t n = 0;
    char *log = read_log(logpath, &n);
    CU_ASSERT(log && strstr(log, "rejected a connection from 127.0.0.1:") && strstr(log, "authentication failed"));
    free(log);
    unlink(logpath);
}

/* A forged HELLO, then random bytes instead of a PROOF; then a forged HELLO
 * and a short write and a hang-up. */
static void test_random_after_forged_hello(void)
{
    struct ct_group g;
    char logpath[512];
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile_held(&g, 2, NULL), 0);
    log_to_file(logpath, sizeof logpath);
    CU_ASSERT_FATAL(ct_spawn_one(&g, 0, body_small_check, NULL, TOKEN, 0) > 0);
    log_stop();
    uint8_t nonce[TP_WIRE_AUTH_BYTES], rnd[TP_WIRE_FRAME_BYTES];
    CU_ASSERT_EQUAL(tp_wire_random(nonce, sizeof nonce), 0);
    CU_ASSERT_EQUAL(tp_wire_random(rnd, sizeof rnd), 0);
    rnd[0] = 0x07; /* a bell byte (never the magic's 'T') that must not reach the log raw */
    int fd = tp_test_connect_loopback(g.ports[0], 400);
    CU_ASSERT_FATAL(fd >= 0);
    forged_hello(fd, nonce);
    CU_ASSERT_EQUAL(send(fd, rnd, sizeof rnd, MSG_NOSIGNAL), (ssize_t)sizeof rnd);
    expect_reject(fd, TP_REJECT_MAGIC);
    close(fd);
    fd = tp_test_connect_loopback(g.ports[0], 400);
    CU_ASSERT_FATAL(fd >= 0);
    forged_hello(fd, nonce);
    CU_ASSERT_EQUAL(send(fd, rnd, 10, MSG_NOSIGNAL), 10);
    close(fd);
    /* a second forged rank 1 with a proper-looking but wrong PROOF */
    fd = tp_test_connect_loopback(g.ports[0], 400);
    CU_ASSERT_FATAL(fd >= 0);
    forged_hello(fd, nonce);
    struct tp_wire_frame proof = {.magic = TP_WIRE_MAGIC, .version = TP_WIRE_VERSION, .kind = TP_WIRE_PROOF,
                                  .rank = 1, .world_size = 2};
    memcpy(proof.auth, rnd, TP_WIRE_AUTH_BYTES);
    send_frame(fd, &proof);
    expect_reject(fd, TP_REJECT_AUTH);
    close(fd);
    finish_group(&g, TOKEN);
    char esc[8 * 4 + 1];
    tp_wire_escape(rnd, 8, esc, sizeof esc);
    check_log(logpath, esc, "\x07", 1);
    unlink(logpath);
}

/* Stray structure errors: bad magic, world, version, kind are refused before
 * any challenge; the group still forms. */
static void test_stray_frames(void)
{
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile_held(&g, 2, TOKEN), 0);
    CU_ASSERT_FATAL(ct_spawn_one(&g, 0, body_small_check, NULL, NULL, 0) > 0);
    struct tp_wire_frame f = {.magic = 0x12345678u, .version = TP_WIRE_VERSION, .kind = TP_WIRE_HELLO,
                              .rank = 1, .world_size = 2};
    static const struct {
        uint32_t magic, version, world, kind, rank, reason;
    } cases[] = {
        {0x12345678u, TP_WIRE_VERSION, 2, TP_WIRE_HELLO, 1, TP_REJECT_MAGIC},
        {TP_WIRE_MAGIC, TP_WIRE_VERSION + 1, 2, TP_WIRE_HELLO, 1, TP_REJECT_VERSION},
        {TP_WIRE_MAGIC, 1, 2, TP_WIRE_HELLO, 1, TP_REJECT_VERSION}, /* the unauthenticated protocol */
        {TP_WIRE_MAGIC, TP_WIRE_VERSION, 5, TP_WIRE_HELLO, 1, TP_REJECT_WORLD},
        {TP_WIRE_MAGIC, TP_WIRE_VERSION, 2, TP_WIRE_PROOF, 1, TP_REJECT_KIND},
        {TP_WIRE_MAGIC, TP_WIRE_VERSION, 2, TP_WIRE_HELLO, 7, TP_REJECT_RANK},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        f.magic = cases[i].magic;
        f.version = (uint16_t)cases[i].version;
        f.world_size = cases[i].world;
        f.kind = (uint16_t)cases[i].kind;
        f.rank = cases[i].rank;
        int fd = tp_test_connect_loopback(g.ports[0], 400);
        CU_ASSERT_FATAL(fd >= 0);
        send_frame(fd, &f);
        expect_reject(fd, cases[i].reason);
        close(fd);
    }
    int fd = tp_test_connect_loopback(g.ports[0], 400); /* says nothing and leaves */
    CU_ASSERT(fd >= 0);
    close(fd);
    finish_group(&g, NULL); /* both take the token from the hostfile */
}

/* Group epochs: rank 0 runs epoch 1 (the default); a HELLO of another
 * non-zero epoch (a process of an earlier or later group) is refused before
 * any challenge, a real rank of epoch 9 cannot join, and a joining rank
 * (epoch 0) learns epoch 1 from rank 0's CHALLENGE and forms the group. */
static void test_stale_epoch(void)
{
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile_held(&g, 2, NULL), 0);
    CU_ASSERT_FATAL(ct_spawn_one(&g, 0, body_small_check, NULL, TOKEN, 0) > 0);
    struct tp_wire_frame f = {.magic = TP_WIRE_MAGIC, .version = TP_WIRE_VERSION, .kind = TP_WIRE_HELLO,
                              .rank = 1, .world_size = 2, .arg = TP_WIRE_CH_DATA, .epoch = 2};
    int fd = tp_test_connect_loopback(g.ports[0], 400);
    CU_ASSERT_FATAL(fd >= 0);
    send_frame(fd, &f);
    expect_reject(fd, TP_REJECT_EPOCH);
    close(fd);
    /* epoch 0: a CHALLENGE that names rank 0's epoch */
    fd = tp_test_connect_loopback(g.ports[0], 400);
    CU_ASSERT_FATAL(fd >= 0);
    f.epoch = 0;
    send_frame(fd, &f);
    uint8_t buf[TP_WIRE_FRAME_BYTES];
    CU_ASSERT_EQUAL_FATAL(read_n(fd, buf, sizeof buf), 0);
    struct tp_wire_frame ch;
    tp_wire_decode(buf, &ch);
    CU_ASSERT_EQUAL(ch.kind, TP_WIRE_CHALLENGE);
    CU_ASSERT_EQUAL(ch.epoch, 1);
    close(fd);
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    tp_comm_t *c = NULL;
    cfg.rank = 1;
    cfg.world_size = 2;
    cfg.hostfile = g.hostfile;
    cfg.cluster_token = TOKEN;
    cfg.connect_timeout_ms = 5000;
    cfg.epoch = 9;
    cfg.listen_fd = dup(g.listen_fd[1]);
    CU_ASSERT_EQUAL(tp_comm_init(&cfg, &c, &err), TP_ERR_PROTOCOL);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "group epoch mismatch"));
    finish_group(&g, TOKEN); /* the real rank 1 (epoch 0) joins epoch 1 */
}

/* The MAC covers the epoch: the same transcript in two epochs gives two MACs. */
static void test_epoch_in_mac(void)
{
    struct tp_wire_key key = {.bytes = (const uint8_t *)"k", .len = 1};
    struct tp_wire_transcript t;
    memset(&t, 0, sizeof t);
    t.hello_kind = TP_WIRE_HELLO;
    t.world_size = 2;
    t.rank_c = 1;
    t.epoch = 1;
    uint8_t a[TP_WIRE_AUTH_BYTES], b[TP_WIRE_AUTH_BYTES];
    CU_ASSERT_EQUAL(tp_wire_mac(&key, 'C', &t, a), 0);
    t.epoch = 2;
    CU_ASSERT_EQUAL(tp_wire_mac(&key, 'C', &t, b), 0);
    CU_ASSERT_FALSE(tp_wire_mac_equal(a, b));
    t.epoch = 1;
    CU_ASSERT_EQUAL(tp_wire_mac(&key, 'C', &t, b), 0);
    CU_ASSERT_TRUE(tp_wire_mac_equal(a, b));
}

/* A non-loopback address without a token is refused before any socket. */
static void test_token_required_off_loopback(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/hostfile-lan-%d.json", tp_test_tmpdir(), (int)getpid());
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"hosts\": [{\"ips\": [\"127.0.0.1\"], \"port\": 29500}, {\"ips\": [\"192.0.2.7\"], \"port\": 29501}]}\n");
    fclose(f);
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    tp_comm_t *c = NULL;
    cfg.rank = 0;
    cfg.world_size = 2;
    cfg.hostfile = path;
    cfg.connect_timeout_ms = 2000;
    uint64_t t0 = tp_now_ns();
    CU_ASSERT_EQUAL(tp_comm_init(&cfg, &c, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT(tp_now_ns() - t0 < 1000000000ull); /* refused up front, not after a connect timeout */
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "192.0.2.7"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "TP_CLUSTER_TOKEN"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "cluster_token"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "openssl rand -hex 32"));
    /* with a token, rank 0 binds only its own address: one this machine does not have is refused
     * locally (nothing is sent anywhere) */
    cfg.cluster_token = "s3cret";
    f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"hosts\": [{\"ips\": [\"192.0.2.7\"], \"port\": 29500}, {\"ips\": [\"127.0.0.1\"], \"port\": 29501}]}\n");
    fclose(f);
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_comm_init(&cfg, &c, &err), TP_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "not an address of this machine"));
    unlink(path);
    /* coordinator mode: the coordinator's host decides */
    cfg = tp_comm_default_config();
    cfg.rank = 1;
    cfg.world_size = 2;
    cfg.coordinator = "192.0.2.7:29500";
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_comm_init(&cfg, &c, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "TP_CLUSTER_TOKEN"));
    /* the check itself: a token, or loopback names, pass */
    struct tp_host t[2] = {{.ip = "127.0.0.1", .port = 1}, {.ip = "192.0.2.7", .port = 2}};
    struct tp_comm_config hc = tp_comm_default_config();
    hc.hostfile = "x";
    CU_ASSERT_EQUAL(tp_comm_check_token(&hc, t, 2, "s3cret", &err), TP_OK);
    CU_ASSERT_EQUAL(tp_comm_check_token(&hc, t, 2, "", &err), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(tp_comm_check_token(&hc, t, 2, NULL, &err), TP_ERR_INVALID_ARG);
    snprintf(t[1].ip, sizeof t[1].ip, "127.0.0.2");
    CU_ASSERT_EQUAL(tp_comm_check_token(&hc, t, 2, NULL, &err), TP_OK);
    snprintf(t[1].ip, sizeof t[1].ip, "::1");
    CU_ASSERT_EQUAL(tp_comm_check_token(&hc, t, 2, NULL, &err), TP_OK);
    snprintf(t[1].ip, sizeof t[1].ip, "0.0.0.0");
    CU_ASSERT_EQUAL(tp_comm_check_token(&hc, t, 2, NULL, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT(tp_sock_is_loopback("127.0.0.1"));
    CU_ASSERT(tp_sock_is_loopback("::1"));
    CU_ASSERT(!tp_sock_is_loopback("10.1.2.3"));
    CU_ASSERT(!tp_sock_is_loopback("::"));
}

/* The listener binds the hostfile address only: the rank's port is not
 * reachable on another local address (127.0.0.2 is loopback on Linux, so no
 * traffic leaves the machine). */
static void test_binds_given_address(void)
{
#ifdef __linux__
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile_held(&g, 2, NULL), 0);
    CU_ASSERT_FATAL(ct_spawn_one(&g, 0, body_small_check, NULL, NULL, 0) > 0);
    int probe = tp_test_connect_loopback(g.ports[0], 400); /* waits until rank 0 listens; says nothing and leaves */
    CU_ASSERT_FATAL(probe >= 0);
    close(probe);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g.ports[0]);
    a.sin_addr.s_addr = htonl(0x7f000002u);
    CU_ASSERT_NOT_EQUAL(connect(fd, (struct sockaddr *)&a, sizeof a), 0); /* refused: not bound there */
    close(fd);
    finish_group(&g, NULL);
#endif
}

/* ---------------------------------------------------------------- liveness */

struct live_arg {
    int pipe_wr;              /* rank 0 writes (t_silent, t_back, rank, false_alarm) as u64 */
};

struct watch {
    tp_comm_t *c;
    volatile int stop;
    uint64_t t_silent, t_back, false_alarm;
    int rank;
};

static void *watch_main(void *arg)
{
    struct watch *w = arg;
    uint64_t t0 = tp_now_ns();
    while (!w->stop) {
        uint32_t ms = 0;
        int r = tp_comm_silent_rank(w->c, 1000, &ms);
        uint64_t now = tp_now_ns();
        if (r >= 0 && !w->t_silent) {
            w->t_silent = now;
            w->rank = r;
            if (now - t0 < 1200000000ull) w->false_alarm = 1; /* the stop comes 1.5 s after start */
        }
        if (r < 0 && w->t_silent && !w->t_back) w->t_back = now;
        tp_sleep_ms(20);
    }
    return NULL;
}

/* Rank 0 blocks in a receive from rank 1 (which sends after 5 s) while a
 * watcher thread polls tp_comm_silent_rank. */
static int body_live(tp_comm_t *c, void *arg)
{
    struct live_arg *la = arg;
    float x[4] = {1, 2, 3, 4};
    if (tp_comm_rank(c) == 1) {
        if (tp_comm_silent_rank(c, 60000, NULL) != -1) return 3;
        tp_sleep_ms(5000);
        return tp_comm_send(c, x, 4, TP_DTYPE_F32, 0) == TP_OK ? 0 : 1;
    }
    struct watch w = {.c = c};
    pthread_t th;
    if (pthread_create(&th, NULL, watch_main, &w) != 0) return 1;
    enum tp_status st = tp_comm_recv(c, x, 4, TP_DTYPE_F32, 1);
    tp_sleep_ms(300);
    w.stop = 1;
    pthread_join(th, NULL);
    uint64_t out[4] = {w.t_silent, w.t_back, (uint64_t)w.rank, w.false_alarm};
    ssize_t wr = write(la->pipe_wr, out, sizeof out);
    return st == TP_OK && wr == (ssize_t)sizeof out ? 0 : 2;
}

static void test_stalled_rank_shows(void)
{
    int p[2];
    CU_ASSERT_FATAL(pipe(p) == 0);
    struct live_arg la = {.pipe_wr = p[1]};
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile_held(&g, 2, NULL), 0);
    CU_ASSERT_EQUAL_FATAL(ct_spawn(&g, body_live, &la, NULL, 20000), 0);
    close(p[1]);
    tp_sleep_ms(1500);
    uint64_t t_stop = tp_now_ns();
    kill(g.pids[1], SIGSTOP);
    tp_sleep_ms(2500);
    uint64_t t_cont = tp_now_ns();
    kill(g.pids[1], SIGCONT);
    CU_ASSERT_EQUAL(ct_wait(&g, 20000), 0);
    for (int r = 0; r < 2; r++) CU_ASSERT(WIFEXITED(g.status[r]) && WEXITSTATUS(g.status[r]) == 0);
    uint64_t out[4] = {0};
    CU_ASSERT_EQUAL(read(p[0], out, sizeof out), (ssize_t)sizeof out);
    close(p[0]);
    double detect_s = out[0] ? ((double)out[0] - (double)t_stop) / 1e9 : -1;
    double back_s = out[1] ? ((double)out[1] - (double)t_cont) / 1e9 : -1;
    fprintf(stderr, "    rank %d reported silent %.2f s after SIGSTOP, answering again %.2f s after SIGCONT\n",
            (int)out[2], detect_s, back_s);
    CU_ASSERT_EQUAL(out[3], 0); /* no silence reported while rank 1 was merely idle */
    CU_ASSERT_EQUAL(out[2], 1);
    CU_ASSERT(detect_s > 0.5 && detect_s < 2.0);
    CU_ASSERT(back_s >= 0 && back_s < 1.0);
}

static const struct tp_test_case auth_cases[] = {
    {"junk_then_replay", test_junk_then_replay},
    {"captured_handshake_replayed", test_captured_handshake_replayed},
    {"wrong_token", test_wrong_token},
    {"random_after_forged_hello", test_random_after_forged_hello},
    {"stray_frames", test_stray_frames},
    {"token_required_off_loopback", test_token_required_off_loopback},
    {"binds_given_address", test_binds_given_address},
    {"stalled_rank_shows", test_stalled_rank_shows},
    {"stale_epoch", test_stale_epoch},
    {"epoch_in_mac", test_epoch_in_mac},
    {NULL, NULL},
};
TP_TEST_SUITE(auth, "multirank", 120, auth_cases)

/* tests/comm/comm_test_util.c - rank processes and the exact-data oracle (see comm_test.h). */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "comm_test.h"
#include "tp_test.h"

static int g_hostfile_seq;
int ct_shm;
int ct_shm_fsize_rank = -1;

static int make_hostfile(struct ct_group *g, int n, const char *token, int hold)
{
    int fds[CT_MAX_RANKS];
    memset(g, 0, sizeof *g);
    g->n = n;
    if (tp_comm_hold_loopback_ports(n, g->ports, fds, NULL) != TP_OK) return -1;
    for (int r = 0; r < n; r++) {
        if (hold) g->listen_fd[r] = fds[r];
        else close(fds[r]);
    }
    snprintf(g->hostfile, sizeof g->hostfile, "%s/hostfile-%d-%d.json", tp_test_tmpdir(), (int)getpid(),
             g_hostfile_seq++);
    FILE *f = fopen(g->hostfile, "w");
    if (!f) return -1;
    fprintf(f, "{\"version\": 1,%s%s%s \"hosts\": [\n", token ? " \"cluster_token\": \"" : "", token ? token : "",
            token ? "\"," : "");
    for (int r = 0; r < n; r++)
        fprintf(f, "  {\"host\": \"localhost\", \"ips\": [\"127.0.0.1\"], \"port\": %d}%s\n", g->ports[r],
                r + 1 < n ? "," : "");
    fprintf(f, "]}\n");
    fclose(f);
    return 0;
}

int ct_make_hostfile(struct ct_group *g, int n, const char *token) { return make_hostfile(g, n, token, 0); }
int ct_make_hostfile_held(struct ct_group *g, int n, const char *token) { return make_hostfile(g, n, token, 1); }

pid_t ct_spawn_one(struct ct_group *g, int r, ct_rank_fn fn, void *arg, const char *token, uint32_t op_timeout_ms)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid != 0) {
        if (pid > 0) g->pids[r] = pid;
        if (g->listen_fd[r] > 2) close(g->listen_fd[r]); /* the rank holds it now */
        g->listen_fd[r] = -1;
        return pid;
    }
    for (int k = 0; k < g->n; k++)
        if (k != r && g->listen_fd[k] > 2) close(g->listen_fd[k]);
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    tp_comm_t *c = NULL;
    cfg.rank = r;
    cfg.world_size = g->n;
    cfg.hostfile = g->hostfile;
    cfg.cluster_token = token;
    cfg.connect_timeout_ms = 20000;
    cfg.shm = ct_shm;
    if (g->listen_fd[r] > 2) cfg.listen_fd = g->listen_fd[r];
    if (op_timeout_ms) cfg.op_timeout_ms = op_timeout_ms;
    if (r == ct_shm_fsize_rank) {
        const struct rlimit lim = {64 * 1024, 64 * 1024};
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(101);
    }
    if (tp_comm_init(&cfg, &c, &err) != TP_OK) {
        fprintf(stderr, "    rank %d: tp_comm_init failed: %s\n", r, err.msg);
        _exit(100);
    }
    int code = fn(c, arg);
    tp_comm_free(c);
    fflush(stdout);
    fflush(stderr);
    _exit(code & 0xff);
}

int ct_spawn(struct ct_group *g, ct_rank_fn fn, void *arg, const char *token, uint32_t op_timeout_ms)
{
    for (int r = 0; r < g->n; r++)
        if (ct_spawn_one(g, r, fn, arg, token, op_timeout_ms) < 0) return -1;
    return 0;
}

int ct_wait(struct ct_group *g, int timeout_ms)
{
    uint64_t t0 = tp_now_ns(), deadline = t0 + (uint64_t)timeout_ms * 1000000u;
    int left = 0;
    for (int r = 0; r < g->n; r++) {
        if (g->pids[r] <= 0) g->exited[r] = 1; /* never spawned: never waitpid(0)/kill(0) */
        left += !g->exited[r];
    }
    while (left > 0) {
        for (int r = 0; r < g->n; r++) {
            if (g->exited[r]) continue;
            int st = 0;
            pid_t p = waitpid(g->pids[r], &st, WNOHANG);
            if (p == g->pids[r]) {
                g->exited[r] = 1;
                g->status[r] = st;
                g->exit_s[r] = (double)(tp_now_ns() - t0) / 1e9;
                left--;
            }
        }
        if (left == 0) break;
        if (tp_now_ns() > deadline) {
            for (int r = 0; r < g->n; r++)
                if (!g->exited[r]) {
                    fprintf(stderr, "    rank %d did not exit within %d ms: killing it\n", r, timeout_ms);
                    kill(g->pids[r], SIGKILL);
                    waitpid(g->pids[r], &g->status[r], 0);
                    g->exited[r] = 1;
                    g->exit_s[r] = -1;
                }
            return left;
        }
        tp_sleep_ms(5);
    }
    return 0;
}

/* Free ports are found by binding port 0 and releasing it, so another process
 * (a parallel ctest) can take one before the rank binds it.  A group whose
 * tp_comm_init failed (exit 100: "port already in use") is therefore run again
 * on fresh ports, at most 3 times; a real start-up bug fails all three. */
void ct_run_ok(int n, ct_rank_fn fn, void *arg, int timeout_ms)
{
    struct ct_group g;
    for (int attempt = 1;; attempt++) {
        CU_ASSERT_EQUAL_FATAL(ct_make_hostfile(&g, n, "test-token"), 0);
        CU_ASSERT_EQUAL_FATAL(ct_spawn(&g, fn, arg, NULL, 0), 0);
        int left = ct_wait(&g, timeout_ms);
        int init_failed = 0;
        for (int r = 0; r < n; r++)
            if (WIFEXITED(g.status[r]) && WEXITSTATUS(g.status[r]) == 100) init_failed = 1;
        if (left == 0 && init_failed && attempt < 3) {
            fprintf(stderr, "    world %d: start-up failed (port taken by another process?); retrying on new ports\n",
                    n);
            unlink(g.hostfile);
            continue;
        }
        CU_ASSERT_EQUAL(left, 0);
        break;
    }
    for (int r = 0; r < n; r++) {
        int ok = WIFEXITED(g.status[r]) && WEXITSTATUS(g.status[r]) == 0;
        if (!ok)
            fprintf(stderr, "    world %d: rank %d failed (%s %d, see messages above)\n", n, r,
                    WIFEXITED(g.status[r]) ? "exit" : "signal",
                    WIFEXITED(g.status[r]) ? WEXITSTATUS(g.status[r]) : WTERMSIG(g.status[r]));
        CU_ASSERT(ok);
    }
    unlink(g.hostfile);
}

/* ------------------------------------------------------------------ oracle */

double ct_val(int rank, size_t i, int salt, enum tp_dtype dt)
{
    long v = (long)((i * 7u + (size_t)rank * 13u + (size_t)salt * 5u) % 17u);
    return dt == TP_DTYPE_U8 ? (double)v : (double)(v - 8);
}

void ct_set(void *buf, enum tp_dtype dt, size_t i, double v)
{
    switch (dt) {
    case TP_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case TP_DTYPE_F16: ((uint16_t *)buf)[i] = tp_f32_to_fp16((float)v); break;
    case TP_DTYPE_BF16: ((uint16_t *)buf)[i] = tp_f32_to_bf16((float)v); break;
    case TP_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case TP_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case TP_DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}

double ct_get(const void *buf, enum tp_dtype dt, size_t i)
{
    switch (dt) {
    case TP_DTYPE_F32: return ((const float *)buf)[i];
    case TP_DTYPE_F16: return tp_fp16_to_f32(((const uint16_t *)buf)[i]);
    case TP_DTYPE_BF16: return tp_bf16_to_f32(((const uint16_t *)buf)[i]);
    case TP_DTYPE_I32: return ((const int32_t *)buf)[i];
    case TP_DTYPE_I64: return (double)((const int64_t *)buf)[i];
    case TP_DTYPE_U8: return ((const uint8_t *)buf)[i];
    default: return 0;
    }
}

void ct_fill(void *buf, enum tp_dtype dt, size_t count, int rank, int salt)
{
    for (size_t i = 0; i < count; i++) ct_set(buf, dt, i, ct_val(rank, i, salt, dt));
}

/* op: 0 sum, 1 max, 2 min, 3 "rank r's value" with r = size (identity check). */
static double expect(int size, size_t i, int op, int salt, enum tp_dtype dt)
{
    double acc = ct_val(0, i, salt, dt);
    for (int r = 1; r < size; r++) {
        double v = ct_val(r, i, salt, dt);
        if (op == 0) acc += v;
        else if (op == 1) acc = v > acc ? v : acc;
        else acc = v < acc ? v : acc;
    }
    return acc;
}

size_t ct_check_reduce(const void *buf, enum tp_dtype dt, size_t count, int size, int op, int salt, size_t base_index,
                       const char *what, int rank)
{
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        double want = expect(size, base_index + i, op, salt, dt), got = ct_get(buf, dt, i);
        if (got != want) {
            if (bad < 3)
                fprintf(stderr, "    rank %d: %s %s count %zu: index %zu expected %g got %g\n", rank, what,
                        tp_dtype_name(dt), count, i, want, got);
            bad++;
        }
    }
    return bad;
}

static size_t check_block(const void *buf, enum tp_dtype dt, size_t count, int src_rank, int salt, const char *what,
                          int rank)
{
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        double want = ct_val(src_rank, i, salt, dt), got = ct_get(buf, dt, i);
        if (got != want) {
            if (bad < 3)
                fprintf(stderr, "    rank %d: %s %s count %zu block of rank %d: index %zu expected %g got %g\n", rank,
                        what, tp_dtype_name(dt), count, src_rank, i, want, got);
            bad++;
        }
    }
    return bad;
}

#define CHECK_RC(expr, what)                                                                                  \
    do {                                                                                                      \
        enum tp_status rc_ = (expr);                                                                          \
        if (rc_ != TP_OK) {                                                                                   \
            fprintf(stderr, "    rank %d: %s %s count %zu returned %s: %s\n", me, what, tp_dtype_name(dt), count, \
                    tp_status_str(rc_), tp_comm_last_error(c));                                               \
            fails++;                                                                                          \
            goto out;                                                                                         \
        }                                                                                                     \
    } while (0)

static int check_one(tp_comm_t *c, enum tp_dtype dt, size_t count, int full)
{
    const int me = tp_comm_rank(c), n = tp_comm_size(c), root = n - 1;
    const size_t es = tp_dtype_size(dt), total = count * (size_t)n;
    int fails = 0;
    unsigned char *a = malloc(total * es + 16), *b = malloc(total * es + 16);
    if (!a || !b) {
        free(a);
        free(b);
        return 1;
    }
    static const char *red_names[3] = {"all_sum", "all_max", "all_min"};
    for (int op = 0; op < 3; op++) {
        if (!full && op > 0) break;
        /* out of place */
        ct_fill(a, dt, count, me, op);
        memset(b, 0xA5, count * es);
        enum tp_status st = op == 0 ? tp_comm_all_sum(c, a, b, count, dt)
                            : op == 1 ? tp_comm_all_max(c, a, b, count, dt)
                                      : tp_comm_all_min(c, a, b, count, dt);
        CHECK_RC(st, red_names[op]);
        fails += ct_check_reduce(b, dt, count, n, op, op, 0, red_names[op], me) != 0;
        fails += check_block(a, dt, count, me, op, "send buffer untouched", me) != 0;
        /* in place */
        ct_fill(a, dt, count, me, op + 3);
        st = op == 0 ? tp_comm_all_sum(c, a, a, count, dt)
             : op == 1 ? tp_comm_all_max(c, a, a, count, dt)
                       : tp_comm_all_min(c, a, a, count, dt);
        CHECK_RC(st, red_names[op]);
        fails += ct_check_reduce(a, dt, count, n, op, op + 3, 0, "in-place", me) != 0;
    }
    if (!full) goto out;
    /* all_gather out of place and in place */
    ct_fill(a, dt, count, me, 7);
    CHECK_RC(tp_comm_all_gather(c, a, b, count, dt), "all_gather");
    for (int r = 0; r < n; r++) fails += check_block(b + (size_t)r * count * es, dt, count, r, 7, "all_gather", me) != 0;
    memset(b, 0, total * es);
    ct_fill(b + (size_t)me * count * es, dt, count, me, 8);
    CHECK_RC(tp_comm_all_gather(c, b + (size_t)me * count * es, b, count, dt), "all_gather in place");
    for (int r = 0; r < n; r++)
        fails += check_block(b + (size_t)r * count * es, dt, count, r, 8, "all_gather in place", me) != 0;
    /* sum_scatter: element j of send is value(rank, j) over the whole n*count */
    ct_fill(a, dt, total, me, 9);
    memset(b, 0xA5, count * es);
    CHECK_RC(tp_comm_sum_scatter(c, a, b, count, dt), "sum_scatter");
    fails += ct_check_reduce(b, dt, count, n, 0, 9, (size_t)me * count, "sum_scatter", me) != 0;
    /* broadcast from the last rank */
    if (me == root) ct_fill(a, dt, count, root, 10);
    else memset(a, 0, count * es);
    CHECK_RC(tp_comm_broadcast(c, a, count, dt, root), "broadcast");
    fails += check_block(a, dt, count, root, 10, "broadcast", me) != 0;
    /* scatter from the last rank: block r = values of "rank r" */
    if (me == root)
        for (int r = 0; r < n; r++) ct_fill(a + (size_t)r * count * es, dt, count, r, 11);
    memset(b, 0, count * es);
    CHECK_RC(tp_comm_scatter(c, a, b, count, dt, root), "scatter");
    fails += check_block(b, dt, count, me, 11, "scatter", me) != 0;
    /* gather to the last rank */
    ct_fill(a, dt, count, me, 12);
    memset(b, 0, total * es);
    CHECK_RC(tp_comm_gather(c, a, b, count, dt, root), "gather");
    if (me == root)
        for (int r = 0; r < n; r++) fails += check_block(b + (size_t)r * count * es, dt, count, r, 12, "gather", me) != 0;
out:
    free(a);
    free(b);
    return fails;
}

int ct_check_collectives(tp_comm_t *c, const size_t *counts, int n_counts, int big_all_dtypes)
{
    int fails = 0;
    for (int d = 0; d < TP_DTYPE_COUNT; d++) {
        for (int k = 0; k < n_counts; k++) {
            int big = counts[k] > 100000;
            int full = !big || d == TP_DTYPE_F32;
            if (big && !big_all_dtypes && d != TP_DTYPE_F32) continue;
            fails += check_one(c, (enum tp_dtype)d, counts[k], full);
            if (tp_comm_is_poisoned(c)) return fails + 1;
        }
    }
    return fails;
}

/*
 * tests/comm/test_comm_ring.c - the ring (TCP) backend with real rank
 * processes on 127.0.0.1: every collective, dtype and edge count against
 * the exact integer oracle, in place, split, send/recv between every pair,
 * non-blocking requests, the coordinator bootstrap.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "comm_test.h"
#include "tp_test.h"

static const size_t k_counts[] = {0, 1, 7, 1000, (1u << 20) + 3};

static int body_collectives(tp_comm_t *c, void *arg)
{
    (void)arg;
    return ct_check_collectives(c, k_counts, (int)TP_ARRAY_LEN(k_counts), 1);
}

static void test_collectives_w2(void) { ct_run_ok(2, body_collectives, NULL, 90000); }
static void test_collectives_w3(void) { ct_run_ok(3, body_collectives, NULL, 90000); }
static void test_collectives_w4(void) { ct_run_ok(4, body_collectives, NULL, 120000); }

/*
 * Bidirectional ring (3+ ranks, all_sum >= TP_ALGO_BIDIR_BYTES): exact
 * integer sums for counts straddling the threshold, odd counts (not
 * divisible by 2 * world), out of place and in place, i32 / f16 / bf16 / u8,
 * plus max/min on one count.
 */
static int body_bidir_exact(tp_comm_t *c, void *arg)
{
    (void)arg;
    static const enum tp_dtype dts[] = {TP_DTYPE_I32, TP_DTYPE_F16, TP_DTYPE_BF16, TP_DTYPE_U8};
    const int me = tp_comm_rank(c), n = tp_comm_size(c);
    int fails = 0;
    unsigned char *a = malloc(2u * TP_ALGO_BIDIR_BYTES + 64), *b = malloc(2u * TP_ALGO_BIDIR_BYTES + 64);
    if (!a || !b) goto out;
    for (size_t d = 0; d < TP_ARRAY_LEN(dts); d++) {
        const enum tp_dtype dt = dts[d];
        const size_t t = TP_ALGO_BIDIR_BYTES / tp_dtype_size(dt);
        const size_t counts[] = {t - 1, t, t + 1, t + 2 * (size_t)n + 1, t + 13};
        for (size_t k = 0; k < TP_ARRAY_LEN(counts); k++) {
            const size_t count = counts[k];
            const int salt = (int)(d * 8 + k);
            ct_fill(a, dt, count, me, salt);
            memset(b, 0xA5, count * tp_dtype_size(dt));
            if (tp_comm_all_sum(c, a, b, count, dt) != TP_OK) {
                fprintf(stderr, "    rank %d: bidir all_sum %s count %zu: %s\n", me, tp_dtype_name(dt), count,
                        tp_comm_last_error(c));
                fails++;
                goto out;
            }
            fails += ct_check_reduce(b, dt, count, n, 0, salt, 0, "bidir all_sum", me) != 0;
            ct_fill(a, dt, count, me, salt + 1);
            if (tp_comm_all_sum(c, a, a, count, dt) != TP_OK) {
                fails++;
                goto out;
            }
            fails += ct_check_reduce(a, dt, count, n, 0, salt + 1, 0, "bidir all_sum in place", me) != 0;
        }
    }
    /* max / min through the same path */
    const size_t count = TP_ALGO_BIDIR_BYTES / 4 + 5;
    ct_fill(a, TP_DTYPE_I32, count, me, 40);
    if (tp_comm_all_max(c, a, b, count, TP_DTYPE_I32) != TP_OK) {
        fails++;
        goto out;
    }
    fails += ct_check_reduce(b, TP_DTYPE_I32, count, n, 1, 40, 0, "bidir all_max", me) != 0;
    ct_fill(a, TP_DTYPE_I32, count, me, 41);
    if (tp_comm_all_min(c, a, a, count, TP_DTYPE_I32) != TP_OK) {
        fails++;
        goto out;
    }
    fails += ct_check_reduce(a, TP_DTYPE_I32, count, n, 2, 41, 0, "bidir all_min in place", me) != 0;
out:
    free(a);
    free(b);
    return fails + (a && b ? 0 : 1);
}

static void test_bidir_exact_w3(void) { ct_run_ok(3, body_bidir_exact, NULL, 60000); }
static void test_bidir_exact_w4(void) { ct_run_ok(4, body_bidir_exact, NULL, 60000); }

/* Non-integer data whose sum depends on the association (magnitudes 2^-10
 * .. 2^10, mixed signs), exactly representable in dt. */
static void order_fill(void *buf, enum tp_dtype dt, size_t count, int rank)
{
    for (size_t i = 0; i < count; i++) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503 + 17);
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        float v = ((float)(h % 20011u) / 997.0f - 10.0f) * ldexpf(1.0f, (int)((h >> 20) % 21u) - 10);
        if (dt == TP_DTYPE_BF16) ((uint16_t *)buf)[i] = tp_f32_to_bf16(v);
        else ((float *)buf)[i] = v;
    }
}

static size_t order_seg_begin(size_t count, int n, int r)
{
    return (count / (size_t)n) * (size_t)r + (count % (size_t)n) * (size_t)r / (size_t)n;
}

/*
 * The documented reduction order (comm/algo.c, ring_reduce_scatter_lanes):
 * above TP_ALGO_BIDIR_BYTES the first half runs clockwise (dir +1), the
 * second counter-clockwise (dir -1), else one clockwise lane; segment j of a
 * lane (split like seg_begin) is ((d[j+dir] + d[j+2dir]) + ...) + d[j].
 * Every rank must produce exactly these bits.
 */
static int body_fixed_order(tp_comm_t *c, void *arg)
{
    (void)arg;
    const int me = tp_comm_rank(c), n = tp_comm_size(c);
    int fails = 0;
    const enum tp_dtype dts[] = {TP_DTYPE_F32, TP_DTYPE_BF16};
    for (size_t d = 0; d < TP_ARRAY_LEN(dts); d++) {
        const enum tp_dtype dt = dts[d];
        const size_t es = tp_dtype_size(dt), t = TP_ALGO_BIDIR_BYTES / es;
        const size_t counts[] = {t - 3, t + 2 * (size_t)n + 1};
        for (size_t k = 0; k < TP_ARRAY_LEN(counts); k++) {
            const size_t count = counts[k];
            unsigned char *all = malloc((size_t)n * count * es), *want = malloc(count * es), *got = malloc(count * es);
            if (!all || !want || !got) {
                free(all), free(want), free(got);
                return fails + 1;
            }
            for (int r = 0; r < n; r++) order_fill(all + (size_t)r * count * es, dt, count, r);
            if (tp_comm_all_sum(c, all + (size_t)me * count * es, got, count, dt) != TP_OK) {
                fprintf(stderr, "    rank %d: fixed-order all_sum failed: %s\n", me, tp_comm_last_error(c));
                free(all), free(want), free(got);
                return fails + 1;
            }
            const int nl = count * es >= TP_ALGO_BIDIR_BYTES ? 2 : 1;
            const size_t hbeg[2] = {0, nl == 2 ? count / 2 : count}, hlen[2] = {hbeg[1], count - hbeg[1]};
            for (int l = 0; l < nl; l++) {
                const int dir = l == 0 ? 1 : -1;
                for (int j = 0; j < n; j++) {
                    const size_t o = hbeg[l] + order_seg_begin(hlen[l], n, j);
                    const size_t len = hbeg[l] + order_seg_begin(hlen[l], n, j + 1) - o;
                    const int r1 = ((j + dir) % n + n) % n;
                    memcpy(want + o * es, all + ((size_t)r1 * count + o) * es, len * es);
                    for (int s = 2; s <= n; s++) {
                        const int r = ((j + dir * s) % n + n) % n;
                        tp_reduce(want + o * es, want + o * es, all + ((size_t)r * count + o) * es, len, dt,
                                  TP_RED_SUM);
                    }
                }
            }
            size_t bad = 0;
            for (size_t i = 0; i < count && bad < 3; i++)
                if (memcmp(want + i * es, got + i * es, es) != 0) {
                    fprintf(stderr, "    rank %d: fixed-order %s count %zu: index %zu expected %.9g got %.9g\n", me,
                            tp_dtype_name(dt), count, i, ct_get(want, dt, i), ct_get(got, dt, i));
                    bad++;
                }
            fails += bad != 0;
            free(all), free(want), free(got);
        }
    }
    return fails;
}

static void test_fixed_order_w3(void) { ct_run_ok(3, body_fixed_order, NULL, 60000); }
static void test_fixed_order_w4(void) { ct_run_ok(4, body_fixed_order, NULL, 60000); }

/* Send/recv between every ordered pair, in order, with per-pair data; also
 * two messages back to back on one pair and a zero-length message. */
int ct_body_p2p(tp_comm_t *c, void *arg)
{
    (void)arg;
    const int me = tp_comm_rank(c), n = tp_comm_size(c);
    int fails = 0;
    int32_t buf[300];
    for (int s = 0; s < n; s++)
        for (int d = 0; d < n; d++) {
            if (s == d) continue;
            size_t count = (size_t)(1 + 37 * s + 11 * d);
            if (me == s) {
                for (size_t i = 0; i < count; i++) buf[i] = (int32_t)(1000 * s + 100 * d + (int)i);
                if (tp_comm_send(c, buf, count, TP_DTYPE_I32, d) != TP_OK ||
                    tp_comm_send(c, buf, 0, TP_DTYPE_I32, d) != TP_OK) {
                    fprintf(stderr, "    rank %d: send to %d failed: %s\n", me, d, tp_comm_last_error(c));
                    return 1;
                }
            } else if (me == d) {
                memset(buf, 0, sizeof buf);
                if (tp_comm_recv(c, buf, count, TP_DTYPE_I32, s) != TP_OK ||
                    tp_comm_recv(c, buf + 299, 0, TP_DTYPE_I32, s) != TP_OK) {
                    fprintf(stderr, "    rank %d: recv from %d failed: %s\n", me, s, tp_comm_last_error(c));
                    return 1;
                }
                for (size_t i = 0; i < count; i++)
                    if (buf[i] != (int32_t)(1000 * s + 100 * d + (int)i)) {
                        fprintf(stderr, "    rank %d: recv from %d index %zu expected %d got %d\n", me, s, i,
                                1000 * s + 100 * d + (int)i, buf[i]);
                        fails++;
                        break;
                    }
            }
            if (tp_comm_barrier(c) != TP_OK) return 1;
        }
    /* A count mismatch is a protocol error, not garbage. */
    if (n >= 2 && me < 2) {
        enum tp_status st = me == 0 ? tp_comm_send(c, buf, 5, TP_DTYPE_I32, 1) : tp_comm_recv(c, buf, 6, TP_DTYPE_I32, 0);
        if (me == 1 && st != TP_ERR_PROTOCOL) {
            fprintf(stderr, "    rank 1: mismatched recv returned %s, want protocol\n", tp_status_str(st));
            fails++;
        }
        if (me == 1 && tp_comm_barrier(c) != TP_ERR_POISONED) {
            fprintf(stderr, "    rank 1: group not poisoned after a failure\n");
            fails++;
        }
    }
    return fails;
}

static void test_p2p_w3(void) { ct_run_ok(3, ct_body_p2p, NULL, 30000); }
static void test_p2p_w4(void) { ct_run_ok(4, ct_body_p2p, NULL, 30000); }

/* split(color = rank % 2, key = -rank): sub-groups in reverse rank order. */
int ct_body_split(tp_comm_t *c, void *arg)
{
    (void)arg;
    const int me = tp_comm_rank(c), n = tp_comm_size(c);
    int fails = 0;
    tp_comm_t *sub = NULL, *none = NULL;
    if (tp_comm_split(c, me % 2, -me, &sub) != TP_OK || !sub) {
        fprintf(stderr, "    rank %d: split failed: %s\n", me, tp_comm_last_error(c));
        return 1;
    }
    int members = 0, pos = 0;
    for (int r = 0; r < n; r++)
        if (r % 2 == me % 2) members++;
    for (int r = n - 1; r >= 0; r--)
        if (r % 2 == me % 2) {
            if (r == me) break;
            pos++;
        }
    if (tp_comm_size(sub) != members || tp_comm_rank(sub) != pos) {
        fprintf(stderr, "    rank %d: sub-group rank/size %d/%d, want %d/%d\n", me, tp_comm_rank(sub),
                tp_comm_size(sub), pos, members);
        fails++;
    }
    /* all_sum of parent ranks over the sub-group */
    int64_t v = me, want = 0;
    for (int r = 0; r < n; r++)
        if (r % 2 == me % 2) want += r;
    if (tp_comm_all_sum(sub, &v, &v, 1, TP_DTYPE_I64) != TP_OK || v != want) {
        fprintf(stderr, "    rank %d: sub all_sum got %lld want %lld (%s)\n", me, (long long)v, (long long)want,
                tp_comm_last_error(sub));
        fails++;
    }
    static const size_t counts[] = {1, 1000, 20000};
    fails += ct_check_collectives(sub, counts, 3, 0);
    /* the parent still works after the sub-group's traffic */
    int32_t one = 1;
    if (tp_comm_all_sum(c, &one, &one, 1, TP_DTYPE_I32) != TP_OK || one != n) fails++;
    /* color < 0: not in any group */
    if (tp_comm_split(c, me == 0 ? -1 : 0, 0, &none) != TP_OK || (me == 0) != (none == NULL)) fails++;
    if (none && tp_comm_size(none) != n - 1) fails++;
    tp_comm_free(none);
    tp_comm_free(sub);
    return fails;
}

static void test_split_w4(void) { ct_run_ok(4, ct_body_split, NULL, 60000); }

/* Non-blocking: several requests in flight, waited in order; a blocking
 * call after starts waits for them; stats count the traffic. */
int ct_body_async(tp_comm_t *c, void *arg)
{
    (void)arg;
    const int me = tp_comm_rank(c), n = tp_comm_size(c);
    enum { K = 5, N = 4096 };
    static float in[K][N], out[K][N];
    float gathered[4 * 16];
    float mine[16];
    tp_comm_request_t *req[K + 1];
    int fails = 0;
    for (int k = 0; k < K; k++) ct_fill(in[k], TP_DTYPE_F32, N, me, k);
    for (int i = 0; i < 16; i++) mine[i] = (float)(me * 100 + i);
    for (int k = 0; k < K; k++)
        if (tp_comm_all_sum_start(c, in[k], out[k], N, TP_DTYPE_F32, &req[k]) != TP_OK) return 1;
    if (tp_comm_all_gather_start(c, mine, gathered, 16, TP_DTYPE_F32, &req[K]) != TP_OK) return 1;
    for (int k = 0; k <= K; k++)
        if (tp_comm_wait(c, req[k]) != TP_OK) {
            fprintf(stderr, "    rank %d: wait %d failed: %s\n", me, k, tp_comm_last_error(c));
            return 1;
        }
    for (int k = 0; k < K; k++) fails += ct_check_reduce(out[k], TP_DTYPE_F32, N, n, 0, k, 0, "async all_sum", me) != 0;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 16; i++)
            if (gathered[r * 16 + i] != (float)(r * 100 + i)) {
                fprintf(stderr, "    rank %d: async all_gather block %d index %d wrong\n", me, r, i);
                fails++;
                break;
            }
    /* start then a blocking call before wait: order is kept */
    ct_fill(in[0], TP_DTYPE_F32, N, me, 20);
    if (tp_comm_all_sum_start(c, in[0], out[0], N, TP_DTYPE_F32, &req[0]) != TP_OK) return 1;
    ct_fill(in[1], TP_DTYPE_F32, N, me, 21);
    if (tp_comm_all_sum(c, in[1], out[1], N, TP_DTYPE_F32) != TP_OK) return 1;
    if (tp_comm_wait(c, req[0]) != TP_OK) return 1;
    fails += ct_check_reduce(out[0], TP_DTYPE_F32, N, n, 0, 20, 0, "async+blocking", me) != 0;
    fails += ct_check_reduce(out[1], TP_DTYPE_F32, N, n, 0, 21, 0, "blocking after start", me) != 0;
    struct tp_comm_stats s;
    tp_comm_get_stats(c, &s);
    if (s.n_ops < 8 || s.bytes_sent < (uint64_t)7 * N * 4 || s.bytes_received < (uint64_t)7 * N * 4 || s.ns_in_comm == 0) {
        fprintf(stderr, "    rank %d: stats look wrong: ops %llu sent %llu recv %llu\n", me,
                (unsigned long long)s.n_ops, (unsigned long long)s.bytes_sent, (unsigned long long)s.bytes_received);
        fails++;
    }
    return fails;
}

static void test_async_w3(void) { ct_run_ok(3, ct_body_async, NULL, 30000); }

/* Coordinator bootstrap: no hostfile, rank 0 hands out the table. */
static void test_coordinator_w3(void)
{
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile(&g, 1, NULL), 0); /* just for a free port */
    char coord[64];
    snprintf(coord, sizeof coord, "127.0.0.1:%d", g.ports[0]);
    fflush(stdout);
    pid_t pids[3];
    for (int r = 0; r < 3; r++) {
        pids[r] = fork();
        CU_ASSERT_FATAL(pids[r] >= 0);
        if (pids[r] == 0) {
            struct tp_comm_config cfg = tp_comm_default_config();
            struct tp_error err = {0};
            tp_comm_t *c = NULL;
            cfg.rank = r;
            cfg.world_size = 3;
            cfg.coordinator = coord;
            cfg.cluster_token = "coord-token";
            cfg.connect_timeout_ms = 20000;
            if (tp_comm_init(&cfg, &c, &err) != TP_OK) {
                fprintf(stderr, "    rank %d: init failed: %s\n", r, err.msg);
                _exit(100);
            }
            static const size_t counts[] = {1, 1000, 40000};
            int f = ct_check_collectives(c, counts, 3, 0);
            f += ct_body_p2p(c, NULL);
            tp_comm_free(c);
            _exit(f ? 1 : 0);
        }
    }
    for (int r = 0; r < 3; r++) {
        int st = 0;
        uint64_t t0 = tp_now_ns();
        while (waitpid(pids[r], &st, WNOHANG) == 0) {
            if (tp_now_ns() - t0 > 60000000000ull) {
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &st, 0);
                break;
            }
            tp_sleep_ms(10);
        }
        CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
}

/* IPv6 addresses in the hostfile ([::1]); skipped where IPv6 is off. */
static int body_small(tp_comm_t *c, void *arg)
{
    (void)arg;
    static const size_t counts[] = {1, 1000, 300000};
    return ct_check_collectives(c, counts, 3, 0);
}

static void test_ipv6_w2(void)
{
    int probe = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a;
    memset(&a, 0, sizeof a);
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    if (probe < 0 || bind(probe, (struct sockaddr *)&a, sizeof a) != 0) {
        if (probe >= 0) close(probe);
        tp_test_skip("no IPv6 loopback (::1) on this machine");
        return;
    }
    close(probe);
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile(&g, 2, "v6"), 0);
    FILE *f = fopen(g.hostfile, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"hosts\": [{\"ips\": [\"::1\"], \"port\": %d}, {\"ips\": [\"::1\"], \"port\": %d}]}\n", g.ports[0],
            g.ports[1]);
    fclose(f);
    CU_ASSERT_EQUAL_FATAL(ct_spawn(&g, body_small, NULL, NULL, 0), 0);
    CU_ASSERT_EQUAL(ct_wait(&g, 30000), 0);
    for (int r = 0; r < 2; r++) CU_ASSERT(WIFEXITED(g.status[r]) && WEXITSTATUS(g.status[r]) == 0);
}

/* tp_comm_op_cost against the byte counters of real calls: every algorithm
 * branch (mesh, pair, ring on one and two lanes; mesh and ring all_gather;
 * broadcast and gather from root 1), odd counts so segments are uneven.
 * Oracle: tp_comm_stats.bytes_sent, counted by the transfer layer. */
static int body_cost(tp_comm_t *c, void *arg)
{
    (void)arg;
    const int n = tp_comm_size(c), me = tp_comm_rank(c);
    static const size_t counts[] = {1, 2048, 16385, 131073, 262147, 1048579};
    const size_t maxc = 1048579;
    float *a = calloc(maxc * (size_t)n, sizeof(float)), *b = calloc(maxc * (size_t)n, sizeof(float));
    int bad = 0;
    if (!a || !b) bad++;
    for (size_t i = 0; !bad && i < TP_ARRAY_LEN(counts); i++) {
        for (int op = 0; op < TP_COMM_OP_COUNT; op++) {
            const size_t cnt = counts[i];
            struct tp_comm_stats s0, s1;
            tp_comm_get_stats(c, &s0);
            enum tp_status st = op == TP_COMM_OP_ALL_SUM      ? tp_comm_all_sum(c, a, b, cnt, TP_DTYPE_F32)
                                : op == TP_COMM_OP_ALL_GATHER ? tp_comm_all_gather(c, a, b, cnt, TP_DTYPE_F32)
                                : op == TP_COMM_OP_BROADCAST  ? tp_comm_broadcast(c, a, cnt, TP_DTYPE_F32, 1)
                                                              : tp_comm_gather(c, a, b, cnt, TP_DTYPE_F32, 1);
            tp_comm_get_stats(c, &s1);
            struct tp_comm_cost k = tp_comm_op_cost((enum tp_comm_op)op, n, me, 1, cnt, TP_DTYPE_F32);
            if (st != TP_OK || s1.bytes_sent - s0.bytes_sent != k.bytes_sent || k.rounds < 1) {
                fprintf(stderr, "rank %d/%d op %d count %zu: status %d, sent %llu, cost says %llu (%d rounds)\n", me,
                        n, op, cnt, (int)st, (unsigned long long)(s1.bytes_sent - s0.bytes_sent),
                        (unsigned long long)k.bytes_sent, k.rounds);
                bad++;
            }
        }
    }
    free(a);
    free(b);
    return bad ? 1 : 0;
}

static void test_cost_w2(void) { ct_run_ok(2, body_cost, NULL, 60000); }
static void test_cost_w3(void) { ct_run_ok(3, body_cost, NULL, 60000); }
static void test_cost_w4(void) { ct_run_ok(4, body_cost, NULL, 60000); }

static const struct tp_test_case ring_cases[] = {
    {"collectives_world2", test_collectives_w2},
    {"collectives_world3", test_collectives_w3},
    {"collectives_world4", test_collectives_w4},
    {"bidir_threshold_exact_world3", test_bidir_exact_w3},
    {"bidir_threshold_exact_world4", test_bidir_exact_w4},
    {"bidir_fixed_order_world3", test_fixed_order_w3},
    {"bidir_fixed_order_world4", test_fixed_order_w4},
    {NULL, NULL},
};
TP_TEST_SUITE(ring_collectives, "multirank", 300, ring_cases)

static const struct tp_test_case ring_misc_cases[] = {
    {"p2p_every_pair_world3", test_p2p_w3},
    {"p2p_every_pair_world4", test_p2p_w4},
    {"split_world4", test_split_w4},
    {"nonblocking_world3", test_async_w3},
    {"coordinator_world3", test_coordinator_w3},
    {"ipv6_world2", test_ipv6_w2},
    {"op_cost_world2", test_cost_w2},
    {"op_cost_world3", test_cost_w3},
    {"op_cost_world4", test_cost_w4},
    {NULL, NULL},
};
TP_TEST_SUITE(ring_misc, "multirank", 240, ring_misc_cases)

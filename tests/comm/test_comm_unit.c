/*
 * tests/comm/test_comm_unit.c - single-process comm tests: names, config
 * from the environment, size-1 groups, poison/abort, reduction kernels,
 * wire frames, and every bad configuration that must be refused at init
 * with a message naming the problem.
 */
#include <glob.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "comm/comm_impl.h"
#include "comm/comm_wire.h"
#include "comm_test.h"
#include "tp_test.h"

static void test_names(void)
{
    CU_ASSERT_EQUAL(tp_dtype_size(TP_DTYPE_F32), 4);
    CU_ASSERT_EQUAL(tp_dtype_size(TP_DTYPE_BF16), 2);
    CU_ASSERT_EQUAL(tp_dtype_size(TP_DTYPE_I64), 8);
    CU_ASSERT_EQUAL(tp_dtype_size(TP_DTYPE_U8), 1);
    CU_ASSERT_EQUAL(tp_dtype_size(TP_DTYPE_COUNT), 0);
    CU_ASSERT_STRING_EQUAL(tp_dtype_name(TP_DTYPE_F16), "f16");
    enum tp_comm_backend b;
    CU_ASSERT_EQUAL(tp_comm_backend_parse("mpi", &b), TP_OK);
    CU_ASSERT_EQUAL(b, TP_COMM_BACKEND_MPI);
    CU_ASSERT_EQUAL(tp_comm_backend_parse("ring", &b), TP_OK);
    CU_ASSERT_EQUAL(b, TP_COMM_BACKEND_RING);
    CU_ASSERT_EQUAL(tp_comm_backend_parse("nccl", &b), TP_ERR_INVALID_ARG);
    CU_ASSERT_STRING_EQUAL(tp_comm_backend_name(TP_COMM_BACKEND_RDMA), "rdma");
}

static const char *k_env[] = {"TP_BACKEND", "TP_RANK", "TP_WORLD_SIZE", "TP_HOSTFILE", "TP_COORDINATOR",
                              "TP_CLUSTER_TOKEN", "TP_COMM_TIMEOUT_MS", "TP_COMM_CONNECT_TIMEOUT_MS", "TP_LISTEN_FD",
                              "TP_GROUP_ID"};

static void clear_env(void)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(k_env); i++) unsetenv(k_env[i]);
}

static void test_config_env(void)
{
    clear_env();
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    CU_ASSERT_EQUAL(cfg.rank, -1);
    CU_ASSERT_EQUAL(cfg.op_timeout_ms, 30000);
    CU_ASSERT_EQUAL(tp_comm_config_from_env(&cfg, &err), TP_OK);
    CU_ASSERT_EQUAL(cfg.rank, -1);
    setenv("TP_BACKEND", "mpi", 1);
    setenv("TP_RANK", "3", 1);
    setenv("TP_WORLD_SIZE", "4", 1);
    setenv("TP_HOSTFILE", "/x/hosts.json", 1);
    setenv("TP_CLUSTER_TOKEN", "tok", 1);
    setenv("TP_GROUP_ID", "plan-7", 1);
    setenv("TP_COMM_TIMEOUT_MS", "1500", 1);
    CU_ASSERT_EQUAL(cfg.listen_fd, -1);
    setenv("TP_LISTEN_FD", "7", 1);
    CU_ASSERT_EQUAL(tp_comm_config_from_env(&cfg, &err), TP_OK);
    CU_ASSERT_EQUAL(cfg.listen_fd, 7);
    CU_ASSERT_EQUAL(cfg.backend, TP_COMM_BACKEND_MPI);
    CU_ASSERT_EQUAL(cfg.rank, 3);
    CU_ASSERT_EQUAL(cfg.world_size, 4);
    CU_ASSERT_STRING_EQUAL(cfg.hostfile, "/x/hosts.json");
    CU_ASSERT_STRING_EQUAL(cfg.cluster_token, "tok");
    CU_ASSERT_STRING_EQUAL(cfg.group_id, "plan-7");
    CU_ASSERT_EQUAL(cfg.op_timeout_ms, 1500);
    static const char *bad[][2] = {{"TP_RANK", "abc"},           {"TP_RANK", "-1"},
                                   {"TP_WORLD_SIZE", "0"},       {"TP_COMM_TIMEOUT_MS", "10s"},
                                   {"TP_BACKEND", "nccl"},       {"TP_WORLD_SIZE", ""},
                                   {"TP_LISTEN_FD", "1"}};
    for (size_t i = 0; i < TP_ARRAY_LEN(bad); i++) {
        clear_env();
        setenv(bad[i][0], bad[i][1], 1);
        tp_error_clear(&err);
        cfg = tp_comm_default_config();
        CU_ASSERT_EQUAL(tp_comm_config_from_env(&cfg, &err), TP_ERR_INVALID_ARG);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, bad[i][0]));
    }
    clear_env();
}

/* A world of one: every op is a local copy, nothing touches the network. */
static void test_size1(void)
{
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    tp_comm_t *c = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_comm_init(&cfg, &c, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_comm_rank(c), 0);
    CU_ASSERT_EQUAL(tp_comm_size(c), 1);
    CU_ASSERT_STRING_EQUAL(tp_comm_transport(c), "none");
    CU_ASSERT_STRING_EQUAL(tp_comm_transport(NULL), "none");
    static const size_t counts[] = {0, 1, 7, 1000};
    CU_ASSERT_EQUAL(ct_check_collectives(c, counts, 4, 1), 0);
    CU_ASSERT_EQUAL(tp_comm_barrier(c), TP_OK);
    float x[3] = {1, 2, 3}, y[3];
    tp_comm_request_t *r = NULL;
    CU_ASSERT_EQUAL(tp_comm_all_sum_start(c, x, y, 3, TP_DTYPE_F32, &r), TP_OK);
    CU_ASSERT_EQUAL(tp_comm_wait(c, r), TP_OK);
    CU_ASSERT_EQUAL(y[2], 3.0f);
    tp_comm_t *sub = NULL;
    CU_ASSERT_EQUAL(tp_comm_split(c, 5, 0, &sub), TP_OK);
    CU_ASSERT_PTR_NOT_NULL(sub);
    CU_ASSERT_EQUAL(tp_comm_size(sub), 1);
    tp_comm_free(sub);
    CU_ASSERT_EQUAL(tp_comm_split(c, -1, 0, &sub), TP_OK);
    CU_ASSERT_PTR_NULL(sub);
    /* bad arguments are refused (and poison, like every failure) */
    CU_ASSERT_EQUAL(tp_comm_send(c, x, 1, TP_DTYPE_F32, 0), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_comm_last_error(c), "peer 0"));
    CU_ASSERT_EQUAL(tp_comm_all_sum(c, x, y, 1, TP_DTYPE_F32), TP_ERR_POISONED);
    tp_comm_free(c);
    tp_comm_free(NULL);

    CU_ASSERT_EQUAL_FATAL(tp_comm_init(&cfg, &c, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_comm_broadcast(c, x, 1, TP_DTYPE_F32, 1), TP_ERR_INVALID_ARG);
    tp_comm_free(c);
    CU_ASSERT_EQUAL_FATAL(tp_comm_init(&cfg, &c, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_comm_all_sum(c, x, y, 2, TP_DTYPE_COUNT), TP_ERR_INVALID_ARG);
    tp_comm_free(c);
    CU_ASSERT_EQUAL_FATAL(tp_comm_init(&cfg, &c, &err), TP_OK);
    CU_ASSERT_FALSE(tp_comm_is_poisoned(c));
    CU_ASSERT_STRING_EQUAL(tp_comm_last_error(c), "");
    tp_comm_abort(c, "operator pressed stop");
    CU_ASSERT_TRUE(tp_comm_is_poisoned(c));
    CU_ASSERT_EQUAL(tp_comm_barrier(c), TP_ERR_POISONED);
    CU_ASSERT_STRING_EQUAL(tp_comm_last_error(c), "operator pressed stop");
    tp_comm_free(c);
}

static void test_reduce_kernels(void)
{
    float a[5] = {1, -2, 3.5f, 0, 7}, b[5] = {2, 5, -1, 0, 7}, d[5];
    tp_reduce(d, a, b, 5, TP_DTYPE_F32, TP_RED_SUM);
    CU_ASSERT_EQUAL(d[0], 3.0f);
    CU_ASSERT_EQUAL(d[2], 2.5f);
    tp_reduce(d, a, b, 5, TP_DTYPE_F32, TP_RED_MAX);
    CU_ASSERT_EQUAL(d[1], 5.0f);
    tp_reduce(d, a, b, 5, TP_DTYPE_F32, TP_RED_MIN);
    CU_ASSERT_EQUAL(d[2], -1.0f);
    int32_t ia[2] = {INT32_MAX, -5}, ib[2] = {1, 3}, id[2];
    tp_reduce(id, ia, ib, 2, TP_DTYPE_I32, TP_RED_SUM); /* wraps, no UB */
    CU_ASSERT_EQUAL(id[0], INT32_MIN);
    CU_ASSERT_EQUAL(id[1], -2);
    uint8_t ua[2] = {250, 3}, ub[2] = {10, 4};
    tp_reduce(ua, ua, ub, 2, TP_DTYPE_U8, TP_RED_SUM); /* in place */
    CU_ASSERT_EQUAL(ua[0], 4);
    CU_ASSERT_EQUAL(ua[1], 7);
    /* halves: reduced in f32, rounded once: 1 + 2^-11 is not representable
     * in f16 (rounds to 1), but (1 + 2^-11) + 2^-11 computed in f32 is exact */
    uint16_t ha[1] = {tp_f32_to_fp16(1.5f)}, hb[1] = {tp_f32_to_fp16(-0.25f)}, hd[1];
    tp_reduce(hd, ha, hb, 1, TP_DTYPE_F16, TP_RED_SUM);
    CU_ASSERT_EQUAL(tp_fp16_to_f32(hd[0]), 1.25f);
    uint16_t ba[1] = {tp_f32_to_bf16(100.0f)}, bb[1] = {tp_f32_to_bf16(28.0f)}, bd[1];
    tp_reduce(bd, ba, bb, 1, TP_DTYPE_BF16, TP_RED_SUM);
    CU_ASSERT_EQUAL(tp_bf16_to_f32(bd[0]), 128.0f);
    tp_reduce(bd, ba, bb, 1, TP_DTYPE_BF16, TP_RED_MIN);
    CU_ASSERT_EQUAL(tp_bf16_to_f32(bd[0]), 28.0f);
    int64_t la[1] = {-7}, lb[1] = {3}, ld[1];
    tp_reduce(ld, la, lb, 1, TP_DTYPE_I64, TP_RED_MAX);
    CU_ASSERT_EQUAL(ld[0], 3);
}

static void test_wire(void)
{
    struct tp_wire_frame f = {.magic = TP_WIRE_MAGIC, .version = TP_WIRE_VERSION, .kind = TP_WIRE_HELLO,
                              .rank = 3, .world_size = 7, .arg = 0xdeadbeef};
    for (unsigned i = 0; i < TP_WIRE_AUTH_BYTES; i++) f.auth[i] = (uint8_t)(i * 7 + 1);
    uint8_t buf[TP_WIRE_FRAME_BYTES];
    tp_wire_encode(&f, buf);
    CU_ASSERT_EQUAL(buf[0], 'T'); /* little-endian magic spells TPCM */
    CU_ASSERT_EQUAL(buf[3], 'M');
    CU_ASSERT_EQUAL(buf[4], TP_WIRE_VERSION);
    CU_ASSERT_EQUAL(buf[8], 3);
    CU_ASSERT_EQUAL(buf[16], 1);
    CU_ASSERT_EQUAL(buf[47], (uint8_t)(31 * 7 + 1));
    CU_ASSERT_EQUAL(buf[48], 0xef);
    for (unsigned i = 52; i < TP_WIRE_FRAME_BYTES; i++) CU_ASSERT_EQUAL(buf[i], 0);
    struct tp_wire_frame g;
    tp_wire_decode(buf, &g);
    CU_ASSERT_EQUAL(g.rank, 3);
    CU_ASSERT_EQUAL(g.world_size, 7);
    CU_ASSERT_EQUAL(g.arg, 0xdeadbeefu);
    CU_ASSERT_EQUAL(memcmp(g.auth, f.auth, TP_WIRE_AUTH_BYTES), 0);
}

/* The handshake MACs: SHA-256 against the FIPS 180-2 "abc" vector, and the
 * MAC changing with every input it must cover. */
static void test_wire_mac(void)
{
    static const uint8_t sha_abc[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
                                        0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
                                        0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    uint8_t h[TP_WIRE_AUTH_BYTES];
    CU_ASSERT_EQUAL(tp_wire_group_hash("abc", h), 0);
    CU_ASSERT_EQUAL(memcmp(h, sha_abc, 32), 0);

    struct tp_wire_transcript t = {.hello_kind = TP_WIRE_HELLO, .hello_arg = 0, .world_size = 2, .rank_c = 1,
                                   .rank_a = 0};
    CU_ASSERT_EQUAL(tp_wire_random(t.nonce_c, sizeof t.nonce_c), 0);
    CU_ASSERT_EQUAL(tp_wire_random(t.nonce_a, sizeof t.nonce_a), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(t.nonce_c, t.nonce_a, sizeof t.nonce_a), 0); /* 2^-256 to fail by chance */
    CU_ASSERT_EQUAL(tp_wire_group_hash(NULL, t.group), 0);
    const struct tp_wire_key k = {(const uint8_t *)"secret", 6}, k2 = {(const uint8_t *)"secreT", 6},
                             empty = {NULL, 0};
    uint8_t base[32], m[32], again[32];
    CU_ASSERT_EQUAL(tp_wire_mac(&k, 'C', &t, base), 0);
    CU_ASSERT_EQUAL(tp_wire_mac(&k, 'C', &t, again), 0);
    CU_ASSERT(tp_wire_mac_equal(base, again));
    CU_ASSERT_EQUAL(tp_wire_mac(&k, 'A', &t, m), 0);
    CU_ASSERT(!tp_wire_mac_equal(base, m)); /* role */
    CU_ASSERT_EQUAL(tp_wire_mac(&k2, 'C', &t, m), 0);
    CU_ASSERT(!tp_wire_mac_equal(base, m)); /* key */
    CU_ASSERT_EQUAL(tp_wire_mac(&empty, 'C', &t, m), 0);
    CU_ASSERT(!tp_wire_mac_equal(base, m)); /* empty key is a key, not a skip */
    struct tp_wire_transcript u = t;
    u.nonce_a[31] ^= 1;
    CU_ASSERT_EQUAL(tp_wire_mac(&k, 'C', &u, m), 0);
    CU_ASSERT(!tp_wire_mac_equal(base, m)); /* acceptor's nonce */
    u = t;
    u.nonce_c[0] ^= 0x80;
    CU_ASSERT_EQUAL(tp_wire_mac(&k, 'C', &u, m), 0);
    CU_ASSERT(!tp_wire_mac_equal(base, m)); /* connector's nonce */
    u = t;
    u.rank_c = 2;
    CU_ASSERT_EQUAL(tp_wire_mac(&k, 'C', &u, m), 0);
    CU_ASSERT(!tp_wire_mac_equal(base, m));
    u = t;
    u.world_size = 3;
    CU_ASSERT_EQUAL(tp_wire_mac(&k, 'C', &u, m), 0);
    CU_ASSERT(!tp_wire_mac_equal(base, m));
    u = t;
    u.hello_arg = TP_WIRE_CH_LIVENESS;
    CU_ASSERT_EQUAL(tp_wire_mac(&k, 'C', &u, m), 0);
    CU_ASSERT(!tp_wire_mac_equal(base, m));
    u = t;
    CU_ASSERT_EQUAL(tp_wire_group_hash("model-a", u.group), 0);
    CU_ASSERT_EQUAL(tp_wire_mac(&k, 'C', &u, m), 0);
    CU_ASSERT(!tp_wire_mac_equal(base, m));
    /* the MAC is not the key, a digest of the key alone, or a nonce */
    CU_ASSERT(memcmp(base, "secret", 6) != 0);
    CU_ASSERT(!tp_wire_mac_equal(base, t.nonce_c));
    uint8_t tab[2] = {1, 2}, tm[32], tm2[32];
    CU_ASSERT_EQUAL(tp_wire_table_mac(&k, &t, tab, 2, tm), 0);
    tab[1] = 3;
    CU_ASSERT_EQUAL(tp_wire_table_mac(&k, &t, tab, 2, tm2), 0);
    CU_ASSERT(!tp_wire_mac_equal(tm, tm2));

    char esc[64];
    const uint8_t raw[] = {'A', 0x00, 0x1b, '\n', 0xff};
    tp_wire_escape(raw, sizeof raw, esc, sizeof esc);
    CU_ASSERT_STRING_EQUAL(esc, "\\x41\\x00\\x1b\\x0a\\xff");
    tp_wire_escape(raw, sizeof raw, esc, 10); /* room for two bytes only */
    CU_ASSERT_STRING_EQUAL(esc, "\\x41\\x00");
}

/* ---- bad configurations: refused at init with a message naming the problem */

static enum tp_status try_init(struct tp_comm_config *cfg, struct tp_error *err)
{
    tp_comm_t *c = NULL;
    tp_error_clear(err);
    enum tp_status st = tp_comm_init(cfg, &c, err);
    CU_ASSERT_PTR_NULL(c);
    tp_comm_free(c);
    return st;
}

static const char *write_tmp(const char *name, const char *text)
{
    static char path[8][512];
    static int slot;
    char *p = path[slot++ & 7];
    snprintf(p, 512, "%s/%s", tp_test_tmpdir(), name);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return p;
}

static void expect_msg(const struct tp_error *err, const char *needle)
{
    if (!strstr(err->msg, needle)) fprintf(stderr, "    message '%s' lacks '%s'\n", err->msg, needle);
    CU_ASSERT_PTR_NOT_NULL(strstr(err->msg, needle));
}

static void test_bad_hostfiles(void)
{
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    cfg.rank = 0;
    cfg.world_size = 2;
    cfg.connect_timeout_ms = 500;
    cfg.hostfile = "/nonexistent/hosts.json";
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_NOT_FOUND);
    expect_msg(&err, "cannot open hostfile '/nonexistent/hosts.json'");

    cfg.hostfile = write_tmp("bad1.json", "{\"hosts\": [ {\"ips\": [\"127.0.0.1\"], \"port\": 1 ");
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_FORMAT);
    expect_msg(&err, "not valid JSON");

    cfg.hostfile = write_tmp("bad2.json", "{\"hosts\": [{\"ips\": [\"127.0.0.1\"]}, {\"ips\": [\"127.0.0.1\"], \"port\": 2}]}");
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_FORMAT);
    expect_msg(&err, "hosts[0].port");

    cfg.hostfile = write_tmp("bad3.json", "{\"hosts\": [{\"port\": 5}, {\"ips\": [\"127.0.0.1\"], \"port\": 2}]}");
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_FORMAT);
    expect_msg(&err, "\"ips\"");

    cfg.hostfile = write_tmp("bad4.json", "{\"hosts\": []}");
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_FORMAT);
    expect_msg(&err, "at least one entry");

    cfg.hostfile = write_tmp("dup.json", "{\"hosts\": [{\"ips\": [\"127.0.0.1\"], \"port\": 4000},"
                                         " {\"ips\": [\"127.0.0.1\"], \"port\": 4000}]}");
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_INVALID_ARG);
    expect_msg(&err, "duplicate address 127.0.0.1:4000 for ranks 0 and 1");

    const char *two = write_tmp("two.json", "{\"hosts\": [{\"ips\": [\"127.0.0.1\"], \"port\": 4000},"
                                            " {\"ips\": [\"127.0.0.1\"], \"port\": 4001}]}");
    cfg.hostfile = two;
    cfg.rank = 2;
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_INVALID_ARG);
    expect_msg(&err, "rank 2 is out of range for world size 2");
    cfg.rank = 0;
    cfg.world_size = 3;
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_INVALID_ARG);
    expect_msg(&err, "lists 2 ranks but the world size is 3");
    /* no hostfile, no coordinator, world > 1 */
    cfg.world_size = 2;
    cfg.hostfile = NULL;
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_INVALID_ARG);
    expect_msg(&err, "TP_HOSTFILE");
    cfg.coordinator = "localhost";
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_INVALID_ARG);
    expect_msg(&err, "host:port");
}

static int listen_any(int *port)
{
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

static void test_port_in_use_and_unreachable(void)
{
    int port = 0;
    int fd = listen_any(&port);
    CU_ASSERT_FATAL(fd >= 0);
    char text[256];
    snprintf(text, sizeof text,
             "{\"hosts\": [{\"ips\": [\"127.0.0.1\"], \"port\": %d}, {\"ips\": [\"127.0.0.1\"], \"port\": %d}]}", port,
             port == 65535 ? port - 1 : port + 1);
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    cfg.hostfile = write_tmp("inuse.json", text);
    cfg.rank = 0;
    cfg.world_size = 2;
    cfg.connect_timeout_ms = 500;
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_IO);
    char want[64];
    snprintf(want, sizeof want, "port %d is already in use", port);
    expect_msg(&err, want);
    close(fd);

    /* rank 1 alone: rank 0 never comes up */
    struct ct_group g;
    CU_ASSERT_EQUAL_FATAL(ct_make_hostfile(&g, 2, NULL), 0);
    cfg.hostfile = g.hostfile;
    cfg.rank = 1;
    cfg.connect_timeout_ms = 700;
    uint64_t t0 = tp_now_ns();
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_TIMEOUT);
    CU_ASSERT((tp_now_ns() - t0) / 1000000u < 5000u);
    snprintf(want, sizeof want, "could not reach rank 0 at 127.0.0.1:%d", g.ports[0]);
    expect_msg(&err, want);
    /* rank 0 alone: nobody connects */
    cfg.rank = 0;
    CU_ASSERT_EQUAL(try_init(&cfg, &err), TP_ERR_TIMEOUT);
    expect_msg(&err, "rank(s) 1 to connect");
}

static void test_backend_unavailable(void)
{
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    cfg.backend = TP_COMM_BACKEND_RDMA;
    cfg.rank = 0;
    cfg.world_size = 1;
    tp_comm_t *c = NULL;
    enum tp_status st = tp_comm_init(&cfg, &c, &err);
    if (st == TP_OK) {
        tp_test_skip("this machine has a working RDMA device: the no-device path is not reachable");
        tp_comm_free(c);
        return;
    }
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT(st == TP_ERR_NOT_FOUND || st == TP_ERR_NOT_BUILT || st == TP_ERR_UNSUPPORTED);
    /* the message names what is missing and how to enable it */
    CU_ASSERT(strstr(err.msg, "rdma") != NULL);
    if (st == TP_ERR_NOT_FOUND) {
        expect_msg(&err, "no RDMA device");
#ifdef __APPLE__
        expect_msg(&err, "rdma_ctl enable");
#else
        expect_msg(&err, "rdma link add");
#endif
    }
}

/* Every example hostfile in configs/ is accepted by the real parser. */
static void test_example_hostfiles(void)
{
    glob_t g;
    memset(&g, 0, sizeof g);
    int r = glob(tp_test_repo_path("configs/hostfile*.json"), 0, NULL, &g);
    if (r != 0) {
        tp_test_skip("no configs/hostfile*.json in this checkout");
        return;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        struct tp_hostfile hf;
        struct tp_error err = {0};
        enum tp_status st = tp_hostfile_load(g.gl_pathv[i], &hf, &err);
        if (st != TP_OK) fprintf(stderr, "    %s: %s\n", g.gl_pathv[i], err.msg);
        CU_ASSERT_EQUAL(st, TP_OK);
        if (st == TP_OK) {
            CU_ASSERT(hf.n >= 1);
            CU_ASSERT(hf.hosts[0].port >= 1 && hf.hosts[0].ip[0] != '\0');
            tp_hostfile_free(&hf);
        }
    }
    globfree(&g);
    /* the documented example in configs/README.md, and a bare array */
    struct tp_hostfile hf;
    struct tp_error err = {0};
    const char *doc = write_tmp("doc.json",
                                "{\"version\": 1, \"cluster_token\": \"s\", \"_comment\": [\"x\"], \"hosts\": ["
                                "{\"host\": \"a\", \"ips\": [\"10.10.0.1\"], \"port\": 29500},"
                                "{\"host\": \"b\", \"ips\": \"10.10.0.2\", \"port\": 29500, \"rdma\": [\"rdma_en5\"]}]}");
    CU_ASSERT_EQUAL_FATAL(tp_hostfile_load(doc, &hf, &err), TP_OK);
    CU_ASSERT_EQUAL(hf.n, 2);
    CU_ASSERT_STRING_EQUAL(hf.token, "s");
    CU_ASSERT_STRING_EQUAL(hf.hosts[1].ip, "10.10.0.2");
    CU_ASSERT_STRING_EQUAL(hf.hosts[1].rdma, "rdma_en5");
    tp_hostfile_free(&hf);
    const char *arr = write_tmp("arr.json", "[{\"ips\": [\"127.0.0.1\"], \"port\": 7000}]");
    CU_ASSERT_EQUAL_FATAL(tp_hostfile_load(arr, &hf, &err), TP_OK);
    CU_ASSERT_EQUAL(hf.n, 1);
    tp_hostfile_free(&hf);
    const char *ver = write_tmp("ver.json", "{\"version\": 2, \"hosts\": [{\"ips\": [\"a\"], \"port\": 1}]}");
    CU_ASSERT_EQUAL(tp_hostfile_load(ver, &hf, &err), TP_ERR_FORMAT);
}

/* An inherited listener is adopted only when it is a TCP socket bound to the rank's port. */
static void test_adopt_listener(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CU_ASSERT_FATAL(fd >= 3);
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CU_ASSERT_EQUAL_FATAL(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    CU_ASSERT_EQUAL_FATAL(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    int port = ntohs(a.sin_port);
    CU_ASSERT_EQUAL(tp_sock_adopt_listener(fd, port == 65535 ? 1 : port + 1), -1); /* another port */
    CU_ASSERT_EQUAL(tp_sock_adopt_listener(fd, port), 0);
    /* it listens now: a connection is accepted */
    int cfd = socket(AF_INET, SOCK_STREAM, 0);
    CU_ASSERT_EQUAL(connect(cfd, (struct sockaddr *)&a, sizeof a), 0);
    close(cfd);
    close(fd);
    int p[2];
    CU_ASSERT_EQUAL_FATAL(pipe(p), 0);
    CU_ASSERT_EQUAL(tp_sock_adopt_listener(p[0], port), -1); /* not a socket */
    close(p[0]);
    close(p[1]);
    CU_ASSERT_EQUAL(tp_sock_adopt_listener(0, port), -1); /* never stdio */
    CU_ASSERT_EQUAL(tp_sock_adopt_listener(-1, port), -1);
}

static const struct tp_test_case unit_cases[] = {
    {"adopt_listener", test_adopt_listener},
    {"example_hostfiles", test_example_hostfiles},
    {"names", test_names},
    {"config_from_env", test_config_env},
    {"size1_group", test_size1},
    {"reduce_kernels", test_reduce_kernels},
    {"wire_frames", test_wire},
    {"wire_mac", test_wire_mac},
    {"bad_hostfiles", test_bad_hostfiles},
    {"port_in_use_and_unreachable", test_port_in_use_and_unreachable},
    {"backend_unavailable", test_backend_unavailable},
    {NULL, NULL},
};
TP_TEST_SUITE(unit, "unit", 60, unit_cases)

/* tests/common/test_common.c - status codes, errors, half floats, thread pool. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "tp_test.h"

static void test_status_strings(void)
{
    for (int i = 0; i < TP_STATUS_COUNT; i++) {
        const char *s = tp_status_str((enum tp_status)i);
        CU_ASSERT_PTR_NOT_NULL_FATAL(s);
        CU_ASSERT(strlen(s) > 0);
    }
    CU_ASSERT_STRING_EQUAL(tp_status_str(TP_ERR_TIMEOUT), "timeout");
    CU_ASSERT_STRING_EQUAL(tp_status_str((enum tp_status)999), "unknown status");
}

static void test_error_first_sticks(void)
{
    struct tp_error e = {0};
    CU_ASSERT_STRING_EQUAL(tp_error_msg(&e), "");
    CU_ASSERT_EQUAL(tp_error_set(&e, TP_ERR_IO, "read %s failed", "x.gguf"), TP_ERR_IO);
    CU_ASSERT_EQUAL(tp_error_set(&e, TP_ERR_FORMAT, "second"), TP_ERR_FORMAT);
    CU_ASSERT_STRING_EQUAL(e.msg, "read x.gguf failed");
    CU_ASSERT_EQUAL(e.status, TP_ERR_IO);
    tp_error_force(&e, TP_ERR_PEER, "peer %d", 3);
    CU_ASSERT_STRING_EQUAL(e.msg, "peer 3");
    tp_error_clear(&e);
    CU_ASSERT_EQUAL(e.status, TP_OK);
    CU_ASSERT_EQUAL(tp_error_set(NULL, TP_ERR_NOMEM, "ignored"), TP_ERR_NOMEM);
}

static enum tp_status fails_at(int step, int when) { return step == when ? TP_ERR_IO : TP_OK; }

static enum tp_status check_goto_chain(int when, int *reached)
{
    enum tp_status rc = TP_OK;
    *reached = 0;
    TP_CHECK_GOTO(fails_at(1, when), rc, out);
    *reached = 1;
    TP_CHECK_GOTO(fails_at(2, when), rc, out);
    *reached = 2;
out:
    return rc;
}

static void test_check_goto(void)
{
    int reached;
    CU_ASSERT_EQUAL(check_goto_chain(0, &reached), TP_OK);
    CU_ASSERT_EQUAL(reached, 2);
    CU_ASSERT_EQUAL(check_goto_chain(1, &reached), TP_ERR_IO);
    CU_ASSERT_EQUAL(reached, 0);
    CU_ASSERT_EQUAL(check_goto_chain(2, &reached), TP_ERR_IO);
    CU_ASSERT_EQUAL(reached, 1);
}

static void test_size_arith(void)
{
    size_t out;
    CU_ASSERT_EQUAL(tp_mul_size(1u << 20, 1u << 10, &out), 0);
    CU_ASSERT_EQUAL(out, (size_t)1 << 30);
    CU_ASSERT_EQUAL(tp_mul_size(SIZE_MAX / 2 + 1, 2, &out), -1);
    CU_ASSERT_EQUAL(tp_add_size(SIZE_MAX, 1, &out), -1);
    CU_ASSERT_EQUAL(tp_add_size(5, 7, &out), 0);
    CU_ASSERT_EQUAL(out, 12u);
}

static void test_aligned_alloc(void)
{
    void *p = tp_aligned_alloc(64, 1000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL((uintptr_t)p % 64, 0u);
    memset(p, 0xab, 1000);
    tp_aligned_free(p);
    CU_ASSERT_PTR_NULL(tp_aligned_alloc(48, 100)); /* not a power of two */
    CU_ASSERT_PTR_NULL(tp_aligned_alloc(64, 0));
    tp_aligned_free(NULL);
}

/* Every fp16 bit pattern round-trips exactly through f32 (NaNs stay NaN). */
static void test_fp16_exhaustive(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tp_fp16_to_f32((uint16_t)h);
        uint16_t back = tp_f32_to_fp16(f);
        int is_nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
        if (is_nan ? !isnan(f) || !isnan(tp_fp16_to_f32(back)) : back != h) {
            if (bad++ < 5) printf("\n    fp16 0x%04x -> %g -> 0x%04x", h, (double)f, back);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(tp_fp16_to_f32(0x3c00), 1.0f);
    CU_ASSERT_EQUAL(tp_fp16_to_f32(0xc000), -2.0f);
    CU_ASSERT_EQUAL(tp_fp16_to_f32(0x7bff), 65504.0f);
    CU_ASSERT_EQUAL(tp_fp16_to_f32(0x0001), ldexpf(1.0f, -24));
    CU_ASSERT_EQUAL(tp_f32_to_fp16(65520.0f), 0x7c00);       /* overflow -> inf */
    CU_ASSERT_EQUAL(tp_f32_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie to even */
    CU_ASSERT_EQUAL(tp_f32_to_fp16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
    CU_ASSERT_EQUAL(tp_f32_to_fp16(ldexpf(1.0f, -25)), 0x0000); /* half of min subnormal: tie to even 0 */
    CU_ASSERT_EQUAL(tp_f32_to_fp16(ldexpf(3.0f, -25)), 0x0002);
}

static void test_bf16(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tp_bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        if (tp_f32_to_bf16(f) != h) bad++;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(tp_bf16_to_f32(0x3f80), 1.0f);
    /* 1 + 2^-8 is a tie between 1 and 1+2^-7: rounds to even (1.0). */
    CU_ASSERT_EQUAL(tp_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);
    CU_ASSERT_EQUAL(tp_f32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3f82);
}

static void test_split_range(void)
{
    for (int64_t n = 0; n < 50; n++) {
        for (int nth = 1; nth <= 7; nth++) {
            int64_t expect_begin = 0;
            for (int i = 0; i < nth; i++) {
                int64_t b, e;
                tp_split_range(n, i, nth, &b, &e);
                CU_ASSERT_EQUAL(b, expect_begin);
                CU_ASSERT(e - b == n / nth || e - b == n / nth + 1);
                expect_begin = e;
            }
            CU_ASSERT_EQUAL(expect_begin, n);
        }
    }
}

struct pool_job {
    const int64_t *data;
    int64_t n;
    int64_t partial[16];
    _Atomic int calls;
};

static void pool_sum(void *ctx, int ith, int nth)
{
    struct pool_job *j = ctx;
    int64_t b, e, s = 0;
    tp_split_range(j->n, ith, nth, &b, &e);
    for (int64_t i = b; i < e; i++) s += j->data[i];
    j->partial[ith] = s;
    atomic_fetch_add(&j->calls, 1);
}

static void test_pool_sums(void)
{
    enum { N = 100003 };
    static int64_t data[N];
    int64_t expect = 0;
    for (int64_t i = 0; i < N; i++) {
        data[i] = (i * 7919) % 1013 - 500;
        expect += data[i];
    }
    for (int nt = 1; nt <= 4; nt++) {
        struct tp_pool_config cfg = tp_pool_default_config();
        cfg.n_threads = nt;
        cfg.spin_us = nt == 3 ? 0 : 50; /* nt == 3 exercises the sleep path every time */
        tp_pool_t *pool = NULL;
        CU_ASSERT_EQUAL_FATAL(tp_pool_init(&cfg, &pool), TP_OK);
        CU_ASSERT_EQUAL(tp_pool_size(pool), nt);
        for (int rep = 0; rep < 500; rep++) {
            struct pool_job j = {.data = data, .n = N};
            atomic_init(&j.calls, 0);
            tp_pool_run(pool, pool_sum, &j);
            int64_t got = 0;
            for (int i = 0; i < nt; i++) got += j.partial[i];
            if (got != expect || atomic_load(&j.calls) != nt) {
                printf("\n    threads=%d rep=%d expected %lld got %lld calls %d", nt, rep, (long long)expect,
                       (long long)got, atomic_load(&j.calls));
                CU_FAIL("pool sum mismatch");
                break;
            }
            if (rep % 100 == 99) tp_sleep_ms(1); /* let workers fall asleep now and then */
        }
        tp_pool_free(pool);
    }
    tp_pool_free(NULL);
}

/* tp_worksplit: every unit handed out once; a thread's own chunks run front to back; a thread that
 * does not take part leaves its share to the others. */
enum { WS_UNITS = 1000, WS_MAX_THREADS = 4 };
struct ws_job {
    tp_worksplit_t *ws;
    _Atomic int taken[WS_UNITS]; /* times each unit was handed out */
    int by[WS_UNITS];            /* the thread it went to */
    int out_of_order;            /* a thread's own chunk that did not follow its previous one */
    int absent;                  /* this thread waits until the others are done, then claims */
    _Atomic int done;            /* threads other than `absent` that found nothing left */
};

static void ws_run(void *ctx, int ith, int nth)
{
    struct ws_job *j = ctx;
    if (ith == j->absent)
        for (int i = 0; i < 5000 && atomic_load(&j->done) < nth - 1; i++) tp_sleep_ms(1);
    int64_t own_begin, own_end;
    tp_split_range(WS_UNITS, ith, nth, &own_begin, &own_end);
    uint64_t u0, u1, own_next = (uint64_t)own_begin;
    int cursor = 0;
    while (tp_worksplit_next(j->ws, ith, &cursor, &u0, &u1)) {
        if (cursor == 0) {
            if (u0 != own_next) j->out_of_order++;
            own_next = u1;
        }
        for (uint64_t u = u0; u < u1; u++) {
            atomic_fetch_add(&j->taken[u], 1);
            j->by[u] = ith;
        }
    }
    if (ith != j->absent) atomic_fetch_add(&j->done, 1);
}

static void test_worksplit(void)
{
    tp_worksplit_t *bad = NULL;
    CU_ASSERT_EQUAL(tp_worksplit_init(0, &bad), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NULL(bad);
    for (int nt = 1; nt <= WS_MAX_THREADS; nt++) {
        struct tp_pool_config cfg = tp_pool_default_config();
        cfg.n_threads = nt;
        tp_pool_t *pool = NULL;
        CU_ASSERT_EQUAL_FATAL(tp_pool_init(&cfg, &pool), TP_OK);
        static struct ws_job j;
        CU_ASSERT_EQUAL_FATAL(tp_worksplit_init(nt, &j.ws), TP_OK);
        CU_ASSERT_EQUAL(tp_worksplit_reset(j.ws, (uint64_t)TP_WORKSPLIT_MAX_UNITS + 1, 1), TP_ERR_INVALID_ARG);
        for (int absent = -1; absent < nt && (absent < 0 || nt > 1); absent++) {
            for (int rep = 0; rep < (absent < 0 ? 200 : 1); rep++) {
                for (int u = 0; u < WS_UNITS; u++) atomic_init(&j.taken[u], 0);
                j.out_of_order = 0;
                j.absent = absent;
                atomic_init(&j.done, 0);
                CU_ASSERT_EQUAL_FATAL(tp_worksplit_reset(j.ws, WS_UNITS, 3), TP_OK);
                tp_pool_run(pool, ws_run, &j);
                int once = 0, stolen_from_absent = 0, absent_units = 0;
                int64_t ab = 0, ae = 0; /* the absent thread's share */
                if (absent >= 0) tp_split_range(WS_UNITS, absent, nt, &ab, &ae);
                for (int u = 0; u < WS_UNITS; u++) {
                    once += atomic_load(&j.taken[u]) == 1;
                    if (u >= ab && u < ae) absent_units++, stolen_from_absent += j.by[u] != absent;
                }
                CU_ASSERT_EQUAL(once, WS_UNITS);
                CU_ASSERT_EQUAL(j.out_of_order, 0);
                if (absent >= 0) { /* the others emptied its share before it came */
                    CU_ASSERT(absent_units > 0);
                    CU_ASSERT_EQUAL(stolen_from_absent, absent_units);
                }
                if (once != WS_UNITS) break;
            }
        }
        tp_worksplit_free(j.ws);
        tp_pool_free(pool);
    }
    tp_worksplit_free(NULL);
}

static void test_clock_rss(void)
{
    uint64_t t0 = tp_now_ns();
    tp_sleep_ms(5);
    uint64_t dt = tp_now_ns() - t0;
    CU_ASSERT(dt >= 5000000u);
    CU_ASSERT(dt < 2000000000u);
#if defined(__linux__) || defined(__APPLE__)
    size_t before = tp_rss_bytes();
    CU_ASSERT(before > 0);
    enum { MB = 64 };
    char *p = tp_aligned_alloc(4096, (size_t)MB << 20);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    memset(p, 1, (size_t)MB << 20);
    size_t after = tp_rss_bytes();
    CU_ASSERT(after >= before + ((size_t)(MB - 8) << 20)); /* touched pages are resident */
    tp_aligned_free(p);
    CU_ASSERT(tp_rss_peak_bytes() >= ((size_t)(MB - 8) << 20)); /* kernel high-water mark lags a little */
#endif
}

static int g_log_count;
static char g_log_last[256];
static void counting_hook(enum tp_log_level level, const char *module, const char *msg, void *user)
{
    (void)level;
    (void)user;
    g_log_count++;
    snprintf(g_log_last, sizeof g_log_last, "%s|%s", module, msg);
}

static void test_log_hook(void)
{
    enum tp_log_level saved = tp_log_get_level();
    tp_log_set_hook(counting_hook, NULL);
    tp_log_set_level(TP_LOG_WARN);
    g_log_count = 0;
    tp_log(TP_LOG_INFO, "x", "dropped");
    tp_log(TP_LOG_ERROR, "comm", "peer %d lost", 2);
    CU_ASSERT_EQUAL(g_log_count, 1);
    CU_ASSERT_STRING_EQUAL(g_log_last, "comm|peer 2 lost");
    enum tp_log_level l;
    CU_ASSERT_EQUAL(tp_log_level_parse("debug", &l), TP_OK);
    CU_ASSERT_EQUAL(l, TP_LOG_DEBUG);
    CU_ASSERT_EQUAL(tp_log_level_parse("loud", &l), TP_ERR_INVALID_ARG);
    tp_log_set_hook(NULL, NULL);
    tp_log(TP_LOG_ERROR, "comm", "nowhere");
    CU_ASSERT_EQUAL(g_log_count, 1);
    tp_log_set_level(saved);
}

static const struct tp_test_case common_cases[] = {
    {"status_strings", test_status_strings},
    {"error_first_sticks", test_error_first_sticks},
    {"check_goto", test_check_goto},
    {"size_arith", test_size_arith},
    {"aligned_alloc", test_aligned_alloc},
    {"fp16_exhaustive", test_fp16_exhaustive},
    {"bf16", test_bf16},
    {"split_range", test_split_range},
    {"pool_sums", test_pool_sums},
    {"worksplit", test_worksplit},
    {"clock_rss", test_clock_rss},
    {"log_hook", test_log_hook},
    {NULL, NULL},
};

TP_TEST_SUITE(common, "unit", 60, common_cases)

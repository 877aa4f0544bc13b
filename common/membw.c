/*
 * common/membw.c - the machine's streaming-read memory bandwidth, measured
 * with a pool's threads summing a buffer far larger than the caches (32-byte
 * loads where the CPU has AVX2, as the decode kernels use; why:
 * docs/design-measurements.md).  tp_mem_read_bw_gbs owns its buffer and
 * reports the best pass (the machine's limit); tp_mem_read_bw_buf reads a
 * caller's buffer and reports the mean of its passes, threads claiming 1 MiB
 * chunks as they come free (as the decode claims rows), so a benchmark can
 * probe right next to each timed rep.
 */
#include <stdatomic.h>
#include <string.h>

#include "common/common.h"

struct bw_job {
    const uint64_t *buf;
    int64_t n_words;         /* multiple of 8 */
    int dynamic;             /* claim BW_CHUNK_LINES chunks instead of one fixed part per thread */
    _Atomic int64_t next;    /* dynamic: next unclaimed line */
    uint64_t sums[64];
};
#define BW_CHUNK_LINES 16384 /* 1 MiB */

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BW_HAVE_AVX2 1
__attribute__((target("avx2"))) static uint64_t bw_sum_avx2(const uint64_t *p, int64_t b, int64_t e)
{
    __m256i a = _mm256_setzero_si256(), c = _mm256_setzero_si256();
    for (int64_t i = b * 8; i < e * 8; i += 8) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(const void *)(p + i + 4)));
    }
    a = _mm256_xor_si256(a, c);
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)(void *)out, a);
    return out[0] + out[1] + out[2] + out[3];
}
#endif

/* Sum of lines [b, e) of buf (8 words each). */
static uint64_t bw_sum(const uint64_t *buf, int64_t b, int64_t e)
{
#ifdef BW_HAVE_AVX2
    if (__builtin_cpu_supports("avx2")) return bw_sum_avx2(buf, b, e);
#endif
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t i = b * 8; i < e * 8; i += 8) {
        s0 += buf[i] ^ buf[i + 4];
        s1 += buf[i + 1] ^ buf[i + 5];
        s2 += buf[i + 2] ^ buf[i + 6];
        s3 += buf[i + 3] ^ buf[i + 7];
    }
    return s0 + s1 + s2 + s3;
}

static void bw_read(void *ctx, int ith, int nth)
{
    struct bw_job *j = ctx;
    const int64_t lines = j->n_words / 8;
    if (!j->dynamic) {
        int64_t b, e;
        tp_split_range(lines, ith, nth, &b, &e);
        j->sums[ith & 63] = bw_sum(j->buf, b, e);
        return;
    }
    /* as the decode's rows: threads claim chunks as they come free, so a thread
     * descheduled on a shared machine does not leave its whole part behind */
    uint64_t s = 0;
    for (;;) {
        const int64_t b = atomic_fetch_add_explicit(&j->next, BW_CHUNK_LINES, memory_order_relaxed);
        if (b >= lines) break;
        s += bw_sum(j->buf, b, b + BW_CHUNK_LINES < lines ? b + BW_CHUNK_LINES : lines);
    }
    j->sums[ith & 63] = s;
}

static void bw_touch(void *ctx, int ith, int nth)
{
    struct bw_job *j = ctx;
    int64_t b, e;
    tp_split_range(j->n_words, ith, nth, &b, &e); /* first touch by the reading thread (NUMA) */
    memset((void *)(uintptr_t)(j->buf + b), 1, (size_t)(e - b) * 8);
}

double tp_mem_read_bw_buf(tp_pool_t *pool, const void *buf, size_t bytes, int passes)
{
    bytes &= ~(size_t)63;
    if (!buf || bytes == 0 || passes < 1 || ((uintptr_t)buf & 63u)) return 0.0;
    struct bw_job job = {.buf = buf, .n_words = (int64_t)(bytes / 8), .dynamic = 1};
    volatile uint64_t sink = 0;
    double t0 = tp_now_s();
    for (int p = 0; p < passes; p++) {
        atomic_store_explicit(&job.next, 0, memory_order_relaxed);
        tp_pool_run(pool, bw_read, &job);
        for (int i = 0; i < 64; i++) sink += job.sums[i];
    }
    double dt = tp_now_s() - t0;
    (void)sink;
    return dt > 0.0 ? (double)bytes * (double)passes / dt / 1e9 : 0.0;
}

double tp_mem_read_bw_gbs(tp_pool_t *pool, size_t bytes, int passes)
{
    bytes &= ~(size_t)63;
    if (bytes == 0 || passes < 1) return 0.0;
    uint64_t *buf = tp_stream_alloc(bytes);
    if (!buf) return 0.0;
    struct bw_job job = {.buf = buf, .n_words = (int64_t)(bytes / 8)};
    tp_pool_run(pool, bw_touch, &job);
    double best = 1e30;
    volatile uint64_t sink = 0;
    for (int p = 0; p < passes; p++) {
        double t0 = tp_now_s();
        tp_pool_run(pool, bw_read, &job);
        double dt = tp_now_s() - t0;
        if (dt < best) best = dt;
        for (int i = 0; i < 64; i++) sink += job.sums[i];
    }
    (void)sink;
    tp_aligned_free(buf);
    return (double)bytes / best / 1e9;
}

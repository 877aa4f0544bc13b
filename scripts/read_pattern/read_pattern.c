/*
 * scripts/read_pattern/read_pattern.c - how fast one thread reads memory in the order a one-token
 * x16 decode does, against a plain sequential read of the same buffer, in one process (run.sh
 * builds and runs it).  No tpserve code: the patterns are synthetic, so a kernel's memory order can
 * be tried apart from its arithmetic.
 *
 * A pattern S,G,D,H reads S streams side by side (S groups of --stride bytes each, as a decode pass
 * walks S 16-row groups), G bytes of each stream in turn (64-byte loads from the start of each G, so
 * a G that is not a multiple of 64 reads across its end, as the kernels' loads of a 3360-byte Q6_K
 * super-block do), and before each G bytes requests the lines D bytes ahead of them (H: 1 into L1,
 * _MM_HINT_T0; else into L2, _MM_HINT_T1; D 0: no requests).
 * Every 64-byte line read gets W independent vpdpbusd (W 0..4, the first argument), a stand-in for a
 * kernel's arithmetic per line (the K-quant decodes do two vpdpbusd and three to five other vector
 * operations per line).  The buffer is 512 MiB on 2 MiB pages (as the model's re-laid weights);
 * every pattern reads it once per rep (whole passes of S groups), reps rotate through the patterns,
 * the best of 7 is reported in GB/s and as a fraction of the sequential read's.  Needs AVX-512 VNNI.
 * Usage: read_pattern W [--stride BYTES] S,G,D,H ...
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define RP_BYTES ((size_t)512 << 20)
#define RP_REPS 7
#define RP_MAX 32

static volatile uint64_t rp_sink; /* the reads' checksum, kept so that no read is optimized away */

struct pattern {
    int S;      /* streams side by side; 0: the plain sequential read */
    size_t G;   /* bytes of a stream read in turn */
    size_t D;   /* bytes ahead requested (0: none) */
    int hint;   /* 1: into L1, else L2 */
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define RP_ISA "avx512f,avx512vnni"
#define RP_TARGET __attribute__((target(RP_ISA), noinline))

RP_TARGET static uint64_t read_seq(const char *buf, size_t n)
{
    __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a = _mm512_xor_si512(a, _mm512_load_si512((const void *)(buf + i)));
        b = _mm512_xor_si512(b, _mm512_load_si512((const void *)(buf + i + 64)));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_xor_si512(a, b));
}

/* The pattern over groups of `stride` bytes, S at a time; W vpdpbusd per line into W sums (W a constant in
 * each copy, so the sums stay in registers). */
__attribute__((target(RP_ISA), always_inline)) static inline uint64_t
read_pattern_w(const char *buf, size_t n, size_t stride, const struct pattern *p, const int W)
{
    __m512i z = _mm512_setzero_si512(), one = _mm512_set1_epi8(1), acc[8];
    for (int i = 0; i < 8; i++) acc[i] = z;
    const size_t ng = n / stride;
    for (size_t g = 0; g + (size_t)p->S <= ng; g += (size_t)p->S) {
        const char *gp = buf + g * stride;
        for (size_t o = 0; o < stride; o += p->G) {
            const size_t e = o + p->G < stride ? o + p->G : stride;
            for (int k = 0; k < p->S; k++) {
                const char *s = gp + (size_t)k * stride;
                if (p->D) /* past the group's end: the next pass's stream k (the buffer has room) */
                    for (size_t l = o + p->D; l < e + p->D; l += 64) {
                        const char *q = l < stride ? s + l : s + (size_t)p->S * stride + (l - stride);
                        if (p->hint == 1)
                            _mm_prefetch(q, _MM_HINT_T0);
                        else
                            _mm_prefetch(q, _MM_HINT_T1);
                    }
                for (size_t l = o; l < e; l += 64) { /* an unaligned G: loads cross its end, as a kernel's do */
                    const __m512i v = _mm512_loadu_si512((const void *)(s + l));
                    z = _mm512_xor_si512(z, v);
#pragma GCC unroll 4
                    for (int w = 0; w < W; w++) acc[w] = _mm512_dpbusd_epi32(acc[w], v, one);
                }
            }
        }
    }
    for (int i = 0; i < 8; i++) z = _mm512_xor_si512(z, acc[i]);
    return (uint64_t)_mm512_reduce_add_epi64(z);
}

RP_TARGET static uint64_t read_pattern(const char *buf, size_t n, size_t stride, const struct pattern *p, int W)
{
    switch (W) {
    case 0: return read_pattern_w(buf, n, stride, p, 0);
    case 1: return read_pattern_w(buf, n, stride, p, 1);
    case 2: return read_pattern_w(buf, n, stride, p, 2);
    case 3: return read_pattern_w(buf, n, stride, p, 3);
    default: return read_pattern_w(buf, n, stride, p, 4);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: read_pattern W [--stride BYTES] S,G,D,H ...  (W: 0..4 vpdpbusd per line)\n");
        return 2;
    }
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "read_pattern: this CPU has no AVX-512 VNNI, which the patterns' loops use\n");
        return 2;
    }
    char *end = NULL;
    const long Wl = strtol(argv[1], &end, 10);
    const int W = *end == '\0' && end != argv[1] && Wl >= 0 && Wl <= 4 ? (int)Wl : -1; /* -1: not 0..4 */
    size_t stride = 73920; /* a 16-row group of Q6_K rows of 5632 values */
    int a = 2;
    if (a + 1 < argc && strcmp(argv[a], "--stride") == 0) {
        stride = strtoull(argv[a + 1], &end, 10);
        if (*end != '\0') stride = 0; /* refused below */
        a += 2;
    }
    if (W < 0 || stride < 64 || stride > RP_BYTES / 64) {
        fprintf(stderr, "read_pattern: W is 0..4 and the stride 64..%zu bytes\n", RP_BYTES / 64);
        return 2;
    }
    struct pattern ps[RP_MAX] = {{0, 0, 0, 0}};
    int np = 1;
    for (; a < argc && np < RP_MAX; a++, np++) {
        struct pattern *p = &ps[np];
        if (sscanf(argv[a], "%d,%zu,%zu,%d", &p->S, &p->G, &p->D, &p->hint) != 4 || p->S < 1 || p->S > 16 ||
            p->G < 64 || p->G > stride || p->D > stride) {
            fprintf(stderr, "read_pattern: '%s' is not S,G,D,H (S 1..16, 64 <= G <= the stride, D <= the stride)\n",
                    argv[a]);
            return 2;
        }
    }
    if (a < argc) {
        fprintf(stderr, "read_pattern: at most %d patterns\n", RP_MAX - 1);
        return 2;
    }
    const size_t pad = 16 * stride + ((size_t)2 << 20); /* the requests past the last pass */
    char *buf = NULL;
    if (posix_memalign((void **)&buf, (size_t)2 << 20, RP_BYTES + pad) != 0) {
        fprintf(stderr, "read_pattern: out of memory (%zu MiB)\n", (RP_BYTES + pad) >> 20);
        return 1;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(buf, RP_BYTES + pad, MADV_HUGEPAGE);
#endif
    memset(buf, 1, RP_BYTES + pad);
    double best[RP_MAX], bytes[RP_MAX];
    for (int i = 0; i < np; i++) { /* what each reads: whole passes of S groups (sequential: whole 128-byte steps) */
        best[i] = 1e30;
        bytes[i] = ps[i].S ? (double)(RP_BYTES / stride / (size_t)ps[i].S * (size_t)ps[i].S * stride)
                           : (double)(RP_BYTES / 128 * 128);
    }
    for (int r = 0; r < RP_REPS; r++)
        for (int i = 0; i < np; i++) {
            const double t0 = now_s();
            rp_sink += ps[i].S ? read_pattern(buf, RP_BYTES, stride, &ps[i], W) : read_seq(buf, RP_BYTES);
            const double t = now_s() - t0;
            if (t < best[i]) best[i] = t;
        }
    printf("one thread, %zu MiB, stride %zu, %d vpdpbusd per line, best of %d\n", RP_BYTES >> 20, stride, W, RP_REPS);
    printf("pattern                  GB/s  of sequential\n");
    for (int i = 0; i < np; i++) {
        char name[64];
        if (ps[i].S)
            snprintf(name, sizeof name, "S%d G%zu D%zu %s", ps[i].S, ps[i].G, ps[i].D, ps[i].hint == 1 ? "L1" : "L2");
        else
            snprintf(name, sizeof name, "sequential");
        printf("%-22s %6.2f  %6.3f\n", name, bytes[i] / best[i] / 1e9, (bytes[i] / best[i]) / (bytes[0] / best[0]));
    }
    free(buf);
    return 0;
}

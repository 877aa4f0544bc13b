/*
 * scripts/decode_ab/decode_ab.c - one-token (decode) matmul speed of two kernel builds, A/B in one
 * process, against a streaming read of the same memory (run.sh builds it; see there).
 *
 * The weights are quantized and re-laid as the model does (x16 where the type has the layout) into
 * copies totalling --mb MiB on tp_stream_alloc (huge pages, as the model's re-laid weights), so a
 * pass reads them from memory.  Each rep times, in rotating order, one pass of every variant
 * (variants.h: REV's ops and the tree's) and two probes that read the same bytes with 32-byte
 * (AVX2, as common/membw.c) and 64-byte loads; the threads split the rows statically (16-row
 * groups for x16).  Reports per variant the best, 25th-percentile and median GB/s and the best
 * as a fraction of the best probe.  On a shared machine compare only figures of one invocation.
 * PF=l1,l2 in run.sh's environment adds the tree at each of those prefetch levels (kernels.h).
 * Usage: decode_ab TYPE[x16] THREADS REPS MB [rows cols]   (NTOK=k in the environment: k tokens)
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include "common/common.h"
#include "model/kernels.h"
#include "model/model.h"
#include "kernels/kernels_impl.h"

struct variant { const char *name; void (*fill)(struct tp_kern_ops *); const char *pf; }; /* pf: prefetch level, NULL default */
#include "variants.h" /* static const struct variant VARS[]; NV */

struct job {
    tp_kern_matmul_fn fn; /* NULL: probe */
    int probe512;
    const uint8_t *w; size_t wrb; int64_t rows, cols; const void *xq; float *y; int x16; size_t mat;
    int copies; int ntok; size_t xrb;
    int dyn; _Atomic long long next;
    uint64_t sink[64];
};

__attribute__((target("avx2"))) static uint64_t sum256(const uint8_t *p, size_t n)
{
    __m256i a = _mm256_setzero_si256(), c = _mm256_setzero_si256();
    for (size_t i = 0; i < n; i += 64) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 32)));
    }
    a = _mm256_xor_si256(a, c);
    return (uint64_t)_mm256_extract_epi64(a, 0);
}
__attribute__((target("avx512f"))) static uint64_t sum512(const uint8_t *p, size_t n)
{
    __m512i a = _mm512_setzero_si512(), c = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a = _mm512_xor_si512(a, _mm512_load_si512((const void *)(p + i)));
        c = _mm512_xor_si512(c, _mm512_load_si512((const void *)(p + i + 64)));
    }
    a = _mm512_xor_si512(a, c);
    return (uint64_t)_mm512_reduce_add_epi64(a);
}

static void one(struct job *j, int c, int64_t r0, int64_t r1, int ith)
{
    const uint8_t *w = j->w + (size_t)c * j->mat;
    if (!j->fn) {
        const size_t rb = j->x16 ? 16 * j->wrb : j->wrb;
        const int64_t s = j->x16 ? r0 / 16 : r0, e = j->x16 ? (r1 + 15) / 16 : r1;
        j->sink[ith] += j->probe512 ? sum512(w + s * rb, (size_t)(e - s) * rb) : sum256(w + s * rb, (size_t)(e - s) * rb);
        return;
    }
    j->fn(w, j->wrb, j->cols, j->xq, j->xrb, j->ntok, j->y, j->rows, r0, r1);
}

static void work(void *ctx, int ith, int nth)
{
    struct job *j = ctx;
    const int64_t G = j->x16 ? 16 : 1, units = (j->rows + G - 1) / G;
    for (int c = 0; c < j->copies; c++) {
        int64_t u0, u1;
        tp_split_range(units, ith, nth, &u0, &u1);
        one(j, c, u0 * G, u1 * G < j->rows ? u1 * G : j->rows, ith);
    }
}

static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

int main(int argc, char **argv)
{
    if (argc < 5) { fprintf(stderr, "usage: decode_ab TYPE[x16] THREADS REPS MB [rows cols]\n"); return 2; }
    const char *ts = argv[1];
    int th = atoi(argv[2]), reps = atoi(argv[3]), mb = atoi(argv[4]);
    int rows = argc > 5 ? atoi(argv[5]) : 2048, cols = argc > 6 ? atoi(argv[6]) : 5632;
    char base[32]; snprintf(base, sizeof base, "%s", ts);
    int x16 = 0; size_t tl = strlen(base);
    if (tl > 3 && !strcmp(base + tl - 3, "x16")) { x16 = 1; base[tl - 3] = 0; }
    enum tp_wtype t;
    if (tp_wtype_parse(base, &t) != TP_OK) return 2;
    const size_t wrb = tp_kern_row_bytes(t, cols), mat = x16 ? tp_kern_x16_bytes(rows, wrb) : wrb * (size_t)rows;
    const int copies = (int)(((size_t)mb << 20) / mat) + 1; const int nalloc = copies < 2 ? 2 : copies;
    uint8_t *wall = tp_stream_alloc(mat * nalloc);
    float *wf = malloc(cols * 4), *x = malloc(cols * 4), *y = malloc(rows * 4 * 64);
    uint64_t seed = 1;
    for (int i = 0; i < cols; i++) { seed = seed * 6364136223846793005ull + 1442695040888963407ull; x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2 - 1); }
    for (int r = 0; r < rows; r++) { for (int i = 0; i < cols; i++) wf[i] = x[(i * 7 + r) % cols]; tp_kern_quantize(t, wf, wall + (size_t)r * wrb, cols); }
    if (x16) { tp_kern_repack_x16(t, wall, wrb, rows, wall + mat, 0, (rows + 15) / 16); memcpy(wall, wall + mat, mat); }
    for (int c = 1; c < copies; c++) memcpy(wall + (size_t)c * mat, wall, mat);
    const int ntok = getenv("NTOK") ? atoi(getenv("NTOK")) : 1;
    const size_t xrb = tp_kern_act_row_bytes(t, cols);
    char *xq = malloc(xrb * ntok + 64);
    for (int k = 0; k < ntok; k++) tp_kern_prepare_act(t, x, xq + k * xrb, cols);
    struct tp_pool_config pc = tp_pool_default_config(); pc.n_threads = th;
    tp_pool_t *pool; tp_pool_init(&pc, &pool);
    int nv = NV + 2;
    double *tm = calloc((size_t)nv * reps, sizeof(double));
    struct job j = {.w = wall, .wrb = wrb, .rows = rows, .cols = cols, .xq = xq, .y = y, .x16 = x16, .mat = mat, .copies = copies, .ntok = ntok, .xrb = xrb};
    for (int r = 0; r <= reps; r++)
        for (int k = 0; k < nv; k++) {
            int v = (k + r) % nv;
            if (v < NV) {
                struct tp_kern_ops ops; memset(&ops, 0, sizeof ops); VARS[v].fill(&ops);
                j.fn = x16 ? (t == TP_WTYPE_Q4_0 ? ops.matmul_q4_0_x16 : t == TP_WTYPE_Q8_0 ? ops.matmul_q8_0_x16 : t == TP_WTYPE_MXFP4 ? ops.matmul_mxfp4_x16 : ops.matmul_kq_x16[t == TP_WTYPE_Q4_K ? 0 : t == TP_WTYPE_Q5_K ? 1 : 2]) : ops.matmul[t];
                if (!j.fn) { fprintf(stderr, "variant %s lacks type\n", VARS[v].name); return 1; }
                if (tp_kern_force_prefetch(VARS[v].pf) != TP_OK) { fprintf(stderr, "bad prefetch level %s\n", VARS[v].pf); return 1; }
            } else { j.fn = NULL; j.probe512 = v == NV + 1; }
            double t0 = tp_now_s();
            tp_pool_run(pool, work, &j);
            double dt = tp_now_s() - t0;
            if (r > 0) tm[v * reps + r - 1] = dt;
        }
    const double bytes = (double)mat * copies;
    double pbest = 1e30;
    for (int v = NV; v < nv; v++) { qsort(tm + v * reps, reps, sizeof(double), cmpd); if (tm[v * reps] < pbest) pbest = tm[v * reps]; }
    printf("%s %d thr, %.0f MB/pass: probe256 best %.2f GB/s, probe512 best %.2f GB/s\n", ts, th, bytes / 1e6, bytes / tm[NV * reps] / 1e9, bytes / tm[(NV + 1) * reps] / 1e9);
    for (int v = 0; v < nv; v++) {
        if (v < NV) qsort(tm + v * reps, reps, sizeof(double), cmpd);
        printf("  %-16s best %6.2f GB/s (%.3f of best probe)  p25 %6.2f  median %6.2f\n", v < NV ? VARS[v].name : v == NV ? "probe256" : "probe512",
               bytes / tm[v * reps] / 1e9, pbest / tm[v * reps], bytes / tm[v * reps + reps / 4] / 1e9, bytes / tm[v * reps + reps / 2] / 1e9);
    }
    return 0;
}

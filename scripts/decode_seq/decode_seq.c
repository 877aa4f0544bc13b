/*
 * scripts/decode_seq/decode_seq.c - the one-token Q4_0 x16 matmuls of a whole synthetic TinyLlama-1.1B
 * decode step (22 layers x q, k, v, o, gate, up, down, then the 32000-row output; 582 MB on huge
 * pages) on two threads, three ways, against a two-thread streaming read of the same bytes, rotated
 * per rep in one process (run.sh builds it from a Release build's objects):
 *   - no barriers: one pool run in which each thread takes its static half of every matrix in turn;
 *   - barriers, static: one pool run per matrix, static halves (a barrier after each; the model's
 *     matmuls now split this way, model/forward/forward.c's job_owned());
 *   - barriers, guided: one pool run per matrix, guided chunks as the model's matmuls were split
 *     before (forward.c's job(), which the norms and the attention keep).
 * Each rep's time is taken as a fraction of the same rep's probe, and the medians are reported apart
 * for reps whose probe read over 45 GB/s ("fast") and the others: on a VM whose memory moves between
 * two levels, the fractions of one level compare.  SHAPE (0..7) puts every matrix in one shape of the
 * table SH (rows x columns) instead of the model's mix, to tell shapes apart.
 * Usage: decode_seq [reps 5..200] [SHAPE]
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/kernels.h"
#include "model/model.h"

#define NL 22
static const int SH[8][2] = {{2048, 2048}, {256, 2048}, {256, 2048}, {2048, 2048}, {5632, 2048}, {5632, 2048}, {2048, 5632}, {32000, 2048}};
#define NM (NL * 7 + 1)

struct mat { const uint8_t *w; size_t wrb; int rows, cols; const void *xq; size_t xrb; };
static struct mat M[NM];
static float *Y;
static enum tp_wtype T = TP_WTYPE_Q4_0;

/* How a rep reads the matrices (the order of the report's rows). */
enum { DS_PROBE, DS_NO_BARRIERS, DS_STATIC, DS_GUIDED, DS_N };

struct job { int mode; int mi; _Atomic long long next; uint64_t sink[8]; };

/* Matrix i's row of SH: the model's order (q, k, v, o, gate, up, down per layer, then the output), or
 * `only` for every matrix. */
static int shape_of(int i, int only)
{
    return only >= 0 ? only : i < NL * 7 ? i % 7 : 7;
}

/* Matrix m's 16-row groups [g0, g1). */
static void mm(const struct mat *m, int64_t g0, int64_t g1)
{
    tp_kern_matmul_x16(T, m->w, m->wrb, m->cols, m->xq, m->xrb, 1, Y, m->rows, g0 * 16, TP_MIN(g1 * 16, m->rows));
}

/* Thread ith's static share of matrix m's groups. */
static void half(const struct mat *m, int ith, int nth, int64_t *g0, int64_t *g1)
{
    tp_split_range((m->rows + 15) / 16, ith, nth, g0, g1);
}

static uint64_t sum(const uint8_t *p, size_t n)
{
    uint64_t a = 0;
    const uint64_t *q = (const uint64_t *)(const void *)p;
    for (size_t i = 0; i < n / 8; i += 8) a ^= q[i] + q[i + 4];
    return a;
}

static void work(void *ctx, int ith, int nth)
{
    struct job *j = ctx;
    if (j->mode == DS_PROBE) { /* each matrix's static halves, all in one run */
        for (int i = 0; i < NM; i++) {
            int64_t g0, g1;
            half(&M[i], ith, nth, &g0, &g1);
            j->sink[ith] += sum(M[i].w + (size_t)g0 * 16 * M[i].wrb, (size_t)(g1 - g0) * 16 * M[i].wrb);
        }
        return;
    }
    if (j->mode == DS_NO_BARRIERS) { /* every matrix's static half in one run */
        for (int i = 0; i < NM; i++) {
            int64_t g0, g1;
            half(&M[i], ith, nth, &g0, &g1);
            mm(&M[i], g0, g1);
        }
        return;
    }
    const struct mat *m = &M[j->mi];
    if (j->mode == DS_STATIC) { /* one matrix, static halves */
        int64_t g0, g1;
        half(m, ith, nth, &g0, &g1);
        mm(m, g0, g1);
        return;
    }
    /* DS_GUIDED: one matrix, guided chunks as forward.c's job() */
    const int64_t G = (m->rows + 15) / 16;
    const int64_t min = TP_MAX(1, G / (nth * 32));
    long long i0 = atomic_load(&j->next);
    while (i0 < G) {
        int64_t len = (G - i0) / (2 * nth);
        if (len < min) len = min;
        const long long i1 = TP_MIN(i0 + len, G);
        if (atomic_compare_exchange_weak(&j->next, &i0, i1)) {
            mm(m, i0, i1);
            i0 = atomic_load(&j->next);
        }
    }
}

static int oom(void)
{
    fprintf(stderr, "decode_seq: out of memory (it needs ~1.3 GB)\n");
    return 1;
}

static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    const int only = argc > 2 ? atoi(argv[2]) : -1; /* every matrix of shape SH[only] */
    if (reps < 5 || reps > 200 || only < -1 || only > 7) {
        fprintf(stderr, "usage: decode_seq [reps 5..200] [SHAPE 0..7: every matrix rows x cols of that row of SH]\n");
        return 2;
    }
    size_t total = 0;
    uint8_t *proto[8];
    size_t pbytes[8], pwrb[8];
    float *x = malloc(32000 * 4);
    if (!x) return oom();
    for (int i = 0; i < 32000; i++) x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    void *xq[8];
    for (int s = 0; s < 8; s++) {
        const int rows = SH[s][0], cols = SH[s][1];
        pwrb[s] = tp_kern_row_bytes(T, cols);
        pbytes[s] = tp_kern_x16_bytes(rows, pwrb[s]);
        uint8_t *rm = malloc(pwrb[s] * rows);
        if (!rm) return oom();
        for (int r = 0; r < rows; r++) tp_kern_quantize(T, x + (r % 7), rm + (size_t)r * pwrb[s], cols);
        proto[s] = malloc(pbytes[s]);
        if (!proto[s]) return oom();
        tp_kern_repack_x16(T, rm, pwrb[s], rows, proto[s], 0, (rows + 15) / 16);
        free(rm);
        xq[s] = malloc(tp_kern_act_row_bytes(T, cols));
        if (!xq[s]) return oom();
        tp_kern_prepare_act(T, x, xq[s], cols);
    }
    for (int i = 0; i < NM; i++) total += pbytes[shape_of(i, only)];
    uint8_t *buf = tp_stream_alloc(total);
    if (!buf) return oom();
    size_t off = 0;
    for (int i = 0; i < NM; i++) {
        const int s = shape_of(i, only);
        memcpy(buf + off, proto[s], pbytes[s]);
        M[i] = (struct mat){buf + off, pwrb[s], SH[s][0], SH[s][1], xq[s], tp_kern_act_row_bytes(T, SH[s][1])};
        off += pbytes[s];
    }
    Y = malloc(32000 * 4);
    if (!Y) return oom();
    struct tp_pool_config pc = tp_pool_default_config();
    pc.n_threads = 2;
    tp_pool_t *pool;
    if (tp_pool_init(&pc, &pool) != TP_OK) return oom();
    double *tm = calloc(DS_N * (size_t)reps, sizeof(double));
    if (!tm) return oom();
    const char *names[DS_N] = {"probe", "no barriers", "barriers, static", "barriers, guided"};
    printf("%.0f MB per pass\n", total / 1e6);
    for (int r = 0; r <= reps; r++)
        for (int k = 0; k < DS_N; k++) {
            const int v = (k + r) % DS_N;
            struct job j = {.mode = v};
            const double t0 = tp_now_s();
            if (v == DS_PROBE || v == DS_NO_BARRIERS)
                tp_pool_run(pool, work, &j);
            else
                for (int i = 0; i < NM; i++) {
                    j.mi = i;
                    atomic_store(&j.next, 0);
                    tp_pool_run(pool, work, &j);
                }
            if (r > 0) tm[v * reps + r - 1] = tp_now_s() - t0;
        }
    /* per rep: fraction of that rep's probe */
    for (int v = DS_NO_BARRIERS; v < DS_N; v++) {
        double fs[200], ss[200];
        int nf = 0, ns = 0;
        for (int r = 0; r < reps; r++) {
            const double tp = tm[DS_PROBE * reps + r], pg = total / tp / 1e9, f = tp / tm[v * reps + r];
            if (pg > 45) fs[nf++] = f; else ss[ns++] = f;
        }
        qsort(fs, nf, sizeof(double), cmpd);
        qsort(ss, ns, sizeof(double), cmpd);
        char fm[16] = "-", sm[16] = "-";
        if (nf) snprintf(fm, sizeof fm, "%.3f", fs[nf / 2]);
        if (ns) snprintf(sm, sizeof sm, "%.3f", ss[ns / 2]);
        printf("%-18s fast reps %3d median %5s | slow reps %3d median %5s\n", names[v], nf, fm, ns, sm);
    }
    qsort(tm, reps, sizeof(double), cmpd);
    printf("probe best %.1f GB/s, median %.1f\n", total / tm[0] / 1e9, total / tm[reps / 2] / 1e9);
    return 0;
}

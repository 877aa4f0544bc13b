/*
 * scripts/kx16_ab/kx16_ab.c - A/B of two versions of the AVX-512 K-quant x16 kernels
 * (model/kernels/kernels_kx16_avx512.c) in one process, for a shared machine:
 * both versions run on the same repacked Q4_K and Q6_K matrices, call by call
 * alternated, timed by the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID,
 * which preemption by other jobs does not inflate), and the 20th percentile of
 * the reps is reported per token count.  The default matrix (256 x 2048) stays in
 * L2, so the figures are the kernels' compute rates; decode from memory is bound
 * by the stream instead (tpserve bench kernels).  For scale, the Q4_0 x16 kernel of
 * the tree (tp_kern_matmul_x16, the same bytes per weight as Q4_K) is timed the same way
 * on a matrix of the same shape.  Built and run by run.sh.
 * Usage: kx16_ab [rows] [cols] [reps]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels_impl.h"
#include "model/kernels.h"
#include "model/model.h"

void kx16_ab_old_ops(struct tp_kern_ops *ops); /* the other version's tp_kern_kx16_avx512_ops, renamed */

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static float rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const int rows = argc > 1 ? atoi(argv[1]) : 256, cols = argc > 2 ? atoi(argv[2]) : 2048;
    const int reps = argc > 3 ? atoi(argv[3]) : 400;
    if (rows < 16 || cols < 256 || cols % 256 || reps < 5 || reps > 100000) {
        fprintf(stderr, "usage: kx16_ab [rows >= 16] [cols, a multiple of 256] [reps 5..100000]\n");
        return 2;
    }
    struct tp_kern_ops ops[2] = {{0}, {0}};
    kx16_ab_old_ops(&ops[0]);
    tp_kern_kx16_avx512_ops(&ops[1]);
    const enum tp_wtype types[2] = {TP_WTYPE_Q4_K, TP_WTYPE_Q6_K};
    const int slot[2] = {0, 2}, toks[] = {1, 2, 4, 8, 16, 64};
    double *samp = malloc(2 * (size_t)reps * sizeof(double));
    printf("type  n_tok  old_us  new_us  new/old  new_GB/s  (%d x %d, thread CPU time, 20th percentile of %d)\n", rows,
           cols, reps);
    for (int ti = 0; ti < 2; ti++) {
        const enum tp_wtype t = types[ti];
        const size_t wrb = tp_kern_row_bytes(t, cols), xrb = tp_kern_act_row_bytes(t, cols);
        const size_t xb = tp_kern_x16_bytes(rows, wrb);
        float *wf = malloc((size_t)rows * cols * sizeof(float)), *x = malloc((size_t)cols * sizeof(float));
        float *y = malloc((size_t)rows * 64 * sizeof(float));
        void *w = malloc(wrb * (size_t)rows);
        char *w16 = tp_aligned_alloc(64, (xb + 63) / 64 * 64), *xq = malloc(xrb * 64);
        if (!wf || !x || !y || !w || !w16 || !xq || !samp) {
            fprintf(stderr, "kx16_ab: out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < (size_t)rows * cols; i++) wf[i] = rnd();
        tp_kern_quantize(t, wf, w, (int64_t)rows * cols);
        tp_kern_repack_x16(t, w, wrb, rows, w16, 0, (rows + 15) / 16);
        for (int k = 0; k < 64; k++) {
            for (int i = 0; i < cols; i++) x[i] = rnd();
            tp_kern_prepare_act(t, x, xq + (size_t)k * xrb, cols);
        }
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
            double p20[2];
            for (int r = 0; r < reps; r++)
                for (int v = 0; v < 2; v++) {
                    const double t0 = cpu_s();
                    ops[v].matmul_kq_x16[slot[ti]](w16, wrb, cols, xq, xrb, toks[k], y, rows, 0, rows);
                    samp[(size_t)v * reps + r] = cpu_s() - t0;
                }
            for (int v = 0; v < 2; v++) {
                qsort(samp + (size_t)v * reps, (size_t)reps, sizeof(double), cmp_d);
                p20[v] = samp[(size_t)v * reps + reps / 5];
            }
            printf("%-5s %5d %7.1f %7.1f %8.3f %9.1f\n", tp_wtype_name(t), toks[k], p20[0] * 1e6, p20[1] * 1e6,
                   p20[1] / p20[0], (double)(wrb * (size_t)rows) / p20[1] / 1e9);
        }
        free(wf), free(x), free(y), free(w), tp_aligned_free(w16), free(xq);
    }
    /* Q4_0 x16 for scale: 4.5 bits per weight, as Q4_K */
    const size_t wrb0 = tp_kern_row_bytes(TP_WTYPE_Q4_0, cols), xrb0 = tp_kern_act_row_bytes(TP_WTYPE_Q4_0, cols);
    float *wf = malloc((size_t)rows * cols * sizeof(float)), *x = malloc((size_t)cols * sizeof(float));
    float *y = malloc((size_t)rows * 64 * sizeof(float));
    void *w = malloc(wrb0 * (size_t)rows);
    char *w16 = tp_aligned_alloc(64, tp_kern_x16_bytes(rows, wrb0) + 64), *xq = malloc(xrb0 * 64);
    if (!wf || !x || !y || !w || !w16 || !xq) {
        fprintf(stderr, "kx16_ab: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)rows * cols; i++) wf[i] = rnd();
    tp_kern_quantize(TP_WTYPE_Q4_0, wf, w, (int64_t)rows * cols);
    tp_kern_repack_x16(TP_WTYPE_Q4_0, w, wrb0, rows, w16, 0, (rows + 15) / 16);
    for (int k = 0; k < 64; k++) {
        for (int i = 0; i < cols; i++) x[i] = rnd();
        tp_kern_prepare_act(TP_WTYPE_Q4_0, x, xq + (size_t)k * xrb0, cols);
    }
    for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
        for (int r = 0; r < reps; r++) {
            const double t0 = cpu_s();
            tp_kern_matmul_x16(TP_WTYPE_Q4_0, w16, wrb0, cols, xq, xrb0, toks[k], y, rows, 0, rows);
            samp[r] = cpu_s() - t0;
        }
        qsort(samp, (size_t)reps, sizeof(double), cmp_d);
        printf("q4_0  %5d       - %7.1f        - %9.1f  (Q4_0 x16, ISA %s)\n", toks[k], samp[reps / 5] * 1e6,
               (double)(wrb0 * (size_t)rows) / samp[reps / 5] / 1e9, tp_kern_isa());
    }
    free(wf), free(x), free(y), free(w), tp_aligned_free(w16), free(xq);
    free(samp);
    return 0;
}

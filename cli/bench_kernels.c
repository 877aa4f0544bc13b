/*
 * cli/bench_kernels.c - `tpserve bench kernels`: matrix-kernel speed.
 *
 * For 1..T threads (the persistent pool, rows split as the forward pass
 * does) it measures a plain streaming read of a buffer larger than the
 * caches, then for each weight type a rows x cols matrix:
 *   decode  n_tok = 1 over enough copies of the matrix to exceed the caches:
 *           weight GB/s and the fraction of the streaming-read figure;
 *   prefill n_tok = --tokens on one copy: multiply-add throughput (GOP/s);
 *   batch   n_tok in --batch (default 2,4,8,16: a decode step of several
 *           sequences) over the same copies, weights streamed from memory:
 *           time per matrix and its ratio to the n_tok = 1 time.
 * Best of --reps runs.  Uses the private model/kernels.h (a benchmark of
 * internals, like the kernels' unit tests).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/common.h"
#include "model/kernels.h"
#include "model/model.h"

struct bk_job {
    enum tp_wtype t;
    const uint8_t *w;
    size_t wrb;
    int64_t rows, cols;
    const void *xq;
    size_t xrb;
    int n_tok;
    int x16; /* in the 16-row layout (kernels.h) */
    float *y;
};

static void bk_matmul(void *ctx, int ith, int nth)
{
    struct bk_job *j = ctx;
    int64_t r0, r1;
    if (j->x16) { /* whole 16-row groups per thread, as the forward pass claims them */
        tp_split_range((j->rows + 15) / 16, ith, nth, &r0, &r1);
        r0 *= 16;
        r1 = TP_MIN(r1 * 16, j->rows);
        tp_kern_matmul_x16(j->t, j->w, j->wrb, j->cols, j->xq, j->xrb, j->n_tok, j->y, j->rows, r0, r1);
        return;
    }
    tp_split_range(j->rows, ith, nth, &r0, &r1);
    tp_kern_matmul(j->t, j->w, j->wrb, j->cols, j->xq, j->xrb, j->n_tok, j->y, j->rows, r0, r1);
}

int tp_bench_kernels(int argc, char **argv)
{
    const char *types = "q4_0,q4_0x16,q8_0,q8_0x16,f16,bf16,f32", *isa = NULL, *batch = "2,4,8,16";
    int rows = 2048, cols = 5632, tokens = 128, threads = 2, reps = 5, mb = 256, json = 0;
    const struct tp_opt opts[] = {
        {"type", 0, TP_OPT_LIST, &types, "LIST", "weight types (default q4_0,q4_0x16,q8_0,q8_0x16,f16,bf16,f32; TYPEx16 for q4_0, q8_0, q4_k, q5_k, q6_k: "
         "re-laid 16 rows at a time as the model does where the CPU has an x16 kernel)", 0, 0},
        {"rows", 0, TP_OPT_INT, &rows, "N", "matrix rows (default 2048)", 1, 1 << 20},
        {"cols", 0, TP_OPT_INT, &cols, "N", "matrix columns, a multiple of 256 (default 5632)", 256, 1 << 20},
        {"tokens", 'p', TP_OPT_INT, &tokens, "N", "prefill tokens (default 128; 0 skips prefill)", 0, 4096},
        {"threads", 't', TP_OPT_INT, &threads, "T", "measure 1..T threads (default 2)", 1, 256},
        {"reps", 0, TP_OPT_INT, &reps, "N", "repeats, best is reported (default 5)", 1, 1000},
        {"mb", 0, TP_OPT_INT, &mb, "MB", "bytes streamed per decode measurement (default 256)", 16, 65536},
        {"isa", 0, TP_OPT_STRING, &isa, "NAME", "kernel instruction set (default: best this CPU has)", 0, 0},
        {"batch", 0, TP_OPT_LIST, &batch, "LIST", "small-batch token counts, 2..64 (default 2,4,8,16; 0: none)", 0, 0},
        {"json", 0, TP_OPT_FLAG, &json, NULL, "one JSON object per line instead of the table", 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0, 0},
    };
    int rc = tp_cli_parse("bench kernels", "[options]", opts, argc, argv, NULL, 0, NULL, NULL, NULL);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    if (cols % 256) {
        fprintf(stderr, "tpserve bench kernels: --cols %d is not a multiple of 256\n", cols);
        return 2;
    }
    if (isa && tp_kern_force_isa(isa) != TP_OK) {
        fprintf(stderr, "tpserve bench kernels: --isa %s is not available on this CPU/build; have:", isa);
        for (int i = 0; i < tp_kern_isa_count(); i++) fprintf(stderr, " %s", tp_kern_isa_name(i));
        fprintf(stderr, "\n");
        return 2;
    }
    int blist[16], nbl = 0, max_tok = tokens;
    {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", batch);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            char *end = NULL;
            long v = strtol(tok, &end, 10);
            if (end == tok || *end || v < 0 || v > 64 || v == 1 || nbl == 16) {
                fprintf(stderr, "tpserve bench kernels: --batch '%s': want up to 16 token counts in 2..64 (or 0)\n", tok);
                return 2;
            }
            if (v == 0) continue;
            blist[nbl++] = (int)v;
            if (v > max_tok) max_tok = (int)v;
        }
    }
    enum tp_wtype tlist[16];
    int x16list[16] = {0};
    int nt = 0;
    {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", types);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            const size_t tl = strlen(tok);
            if (nt < 16 && tl > 3 && strcmp(tok + tl - 3, "x16") == 0) { /* <type>x16: the 16-row layout */
                char base[32];
                snprintf(base, sizeof base, "%.*s", (int)(tl - 3), tok);
                if (tp_wtype_parse(base, &tlist[nt]) != TP_OK || !tp_kern_x16_type(tlist[nt]) ||
                    tp_kern_act_row_bytes(tlist[nt], cols) == 0) {
                    fprintf(stderr, "tpserve bench kernels: --type '%s': only q4_0, q8_0, q4_k, q5_k and q6_k have an x16 "
                                    "layout\n", tok);
                    return 2;
                }
                x16list[nt++] = 1;
                continue;
            }
            if (nt == 16 || tp_wtype_parse(tok, &tlist[nt]) != TP_OK || !tp_wtype_supported(tlist[nt]) ||
                tp_kern_act_row_bytes(tlist[nt], cols) == 0) {
                fprintf(stderr, "tpserve bench kernels: --type '%s' is not a supported weight type\n", tok);
                return 2;
            }
            if (tp_wtype_mlx_bits(tlist[nt])) { /* three arrays per matrix: not timed here */
                fprintf(stderr, "tpserve bench kernels: --type '%s' (MLX) is not timed here; use tpserve bench gen on an "
                                "MLX directory (tpserve synth --format mlx)\n", tok);
                return 2;
            }
            nt++;
        }
    }

    int ret = 1;
    size_t stream_bytes = (size_t)mb << 20;
    uint8_t *wall = NULL;
    float *x = NULL, *y = NULL, *wf = NULL;
    void *xq = NULL;
    tp_pool_t *pool = NULL;
    x = malloc((size_t)max_tok * cols * sizeof(float) + (size_t)cols * sizeof(float));
    y = malloc(((size_t)max_tok + 1) * rows * sizeof(float));
    wf = malloc((size_t)cols * sizeof(float));
    xq = malloc(((size_t)max_tok + 1) * cols * sizeof(float));
    if (!x || !y || !wf || !xq) {
        fprintf(stderr, "tpserve bench kernels: out of memory\n");
        goto out;
    }
    uint64_t seed = 12345;
    for (int64_t i = 0; i < (int64_t)(max_tok + 1) * cols; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    if (!json) {
        printf("kernels: ISA %s, matrix %d x %d, prefill %d tokens, best of %d\n", tp_kern_isa(), rows, cols, tokens,
               reps);
        printf("%-7s %-7s %10s %12s %10s %12s %12s\n", "threads", "type", "MB/matrix", "decode GB/s", "of stream",
               "decode us", "prefill GOP/s");
    }
    for (int th = 1; th <= threads; th++) {
        struct tp_pool_config pc = tp_pool_default_config();
        pc.n_threads = th;
        tp_pool_free(pool);
        pool = NULL;
        if (tp_pool_init(&pc, &pool) != TP_OK) {
            fprintf(stderr, "tpserve bench kernels: cannot start %d threads\n", th);
            goto out;
        }
        double stream_gbs = tp_mem_read_bw_gbs(pool, stream_bytes, reps + 1);
        if (json)
            printf("{\"bench\":\"kernels\",\"threads\":%d,\"type\":\"stream\",\"gbs\":%.2f}\n", th, stream_gbs);
        else
            printf("%-7d %-7s %10.1f %12.2f %10s %12s %12s\n", th, "stream", (double)stream_bytes / 1e6, stream_gbs,
                   "1.00", "-", "-");
        for (int k = 0; k < nt; k++) {
            enum tp_wtype t = tlist[k];
            size_t wrb = tp_kern_row_bytes(t, cols), mat = x16list[k] ? tp_kern_x16_bytes(rows, wrb) : wrb * (size_t)rows;
            int copies = (int)((stream_bytes + mat - 1) / mat);
            if (copies < 2) copies = 2;
            tp_aligned_free(wall);
            wall = tp_aligned_alloc(64, mat * (size_t)copies);
            if (!wall) {
                fprintf(stderr, "tpserve bench kernels: out of memory for %d x %.0f MB\n", copies, (double)mat / 1e6);
                goto out;
            }
            for (int r = 0; r < rows; r++) {
                for (int i = 0; i < cols; i++) wf[i] = x[(size_t)(r % (tokens + 1)) * cols + (size_t)((i * 7 + r) % cols)];
                tp_kern_quantize(t, wf, wall + (size_t)r * wrb, cols);
            }
            if (x16list[k]) { /* re-lay copy 0 through copy 1's space, then back */
                tp_kern_repack_x16(t, wall, wrb, rows, wall + mat, 0, (rows + 15) / 16);
                memcpy(wall, wall + mat, mat);
            }
            for (int c = 1; c < copies; c++) memcpy(wall + (size_t)c * mat, wall, mat);
            size_t xrb = tp_kern_act_row_bytes(t, cols);
            for (int i = 0; i <= max_tok; i++) tp_kern_prepare_act(t, x + (size_t)i * cols, (char *)xq + (size_t)i * xrb, cols);
            struct bk_job job = {.t = t, .wrb = wrb, .rows = rows, .cols = cols, .xq = xq, .xrb = xrb, .y = y, .n_tok = 1,
                                 .x16 = x16list[k]};
            char tname[32];
            snprintf(tname, sizeof tname, "%s%s", tp_wtype_name(t), x16list[k] ? "x16" : "");
            double best = 1e30;
            for (int r = 0; r < reps + 1; r++) {
                double t0 = tp_now_s();
                for (int c = 0; c < copies; c++) {
                    job.w = wall + (size_t)c * mat;
                    tp_pool_run(pool, bk_matmul, &job);
                }
                double dt = (tp_now_s() - t0) / copies;
                if (r > 0 && dt < best) best = dt;
            }
            double dec_gbs = (double)mat / best / 1e9, dec_us = best * 1e6;
            double pp_gops = 0.0;
            if (tokens > 0) {
                job.w = wall;
                job.n_tok = tokens;
                double pbest = 1e30;
                for (int r = 0; r < reps; r++) {
                    double t0 = tp_now_s();
                    tp_pool_run(pool, bk_matmul, &job);
                    double dt = tp_now_s() - t0;
                    if (dt < pbest) pbest = dt;
                }
                pp_gops = 2.0 * rows * (double)cols * tokens / pbest / 1e9;
            }
            if (json)
                printf("{\"bench\":\"kernels\",\"isa\":\"%s\",\"threads\":%d,\"type\":\"%s\",\"rows\":%d,\"cols\":%d,"
                       "\"decode_gbs\":%.2f,\"stream_gbs\":%.2f,\"bw_fraction\":%.3f,\"decode_us\":%.1f,"
                       "\"pp_tokens\":%d,\"pp_gops\":%.1f}\n",
                       tp_kern_isa(), th, tname, rows, cols, dec_gbs, stream_gbs, dec_gbs / stream_gbs,
                       dec_us, tokens, pp_gops);
            else
                printf("%-7d %-7s %10.1f %12.2f %10.2f %12.1f %12.1f\n", th, tname, (double)mat / 1e6,
                       dec_gbs, dec_gbs / stream_gbs, dec_us, pp_gops);
            /* small batches: weights from memory, as one decode step of n_tok sequences */
            if (!json && nbl > 0) printf("%-7d %-7s batch (us per matrix, x the n_tok=1 time):", th, tname);
            for (int bi = 0; bi < nbl; bi++) {
                job.n_tok = blist[bi];
                double bbest = 1e30;
                for (int r = 0; r < reps + 1; r++) {
                    double t0 = tp_now_s();
                    for (int c = 0; c < copies; c++) {
                        job.w = wall + (size_t)c * mat;
                        tp_pool_run(pool, bk_matmul, &job);
                    }
                    double dt = (tp_now_s() - t0) / copies;
                    if (r > 0 && dt < bbest) bbest = dt;
                }
                double gops = 2.0 * rows * (double)cols * blist[bi] / bbest / 1e9;
                if (json)
                    printf("{\"bench\":\"kernels_batch\",\"isa\":\"%s\",\"threads\":%d,\"type\":\"%s\",\"n_tok\":%d,"
                           "\"us\":%.1f,\"x_decode\":%.2f,\"gops\":%.1f}\n",
                           tp_kern_isa(), th, tname, blist[bi], bbest * 1e6, bbest / best, gops);
                else
                    printf(" %d: %.0f (%.2fx)", blist[bi], bbest * 1e6, bbest / best);
            }
            if (!json && nbl > 0) printf("\n");
            fflush(stdout);
        }
    }
    ret = 0;
out:
    tp_pool_free(pool);
    tp_aligned_free(wall);
    free(x);
    free(y);
    free(wf);
    free(xq);
    tp_kern_force_isa(NULL);
    return ret;
}

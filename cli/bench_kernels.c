/*
 * cli/bench_kernels.c - `tpserve bench kernels`: matrix-kernel speed.
 *
 * For 1..T threads (the persistent pool, rows split as the forward pass
 * does) it measures a plain streaming read of a buffer larger than the
 * caches, then for each weight type a rows x cols matrix:
 *   decode  n_tok = 1 over enough copies of the matrix to exceed the caches:
 *           weight GB/s and the fraction of the streaming-read figure;
 *   prefill n_tok = --tokens on one copy: multiply-add throughput (GOP/s);
 *   batch   n_tok in --batch over the same copies (one decode step of
 *           several sequences): time per matrix, ratio to the n_tok = 1 time.
 * Best of --reps runs.  Uses model/kernels.h, the kernels' public header.
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

/* ------------------------------------------------------------------ parse */

struct bk_opts {
    const char *types, *isa, *prefetch, *batch;
    int rows, cols, tokens, threads, reps, mb, json;
    int blist[16], nbl;       /* --batch token counts */
    int max_tok;              /* the most activation rows any measurement uses */
    enum tp_wtype tlist[16];  /* --type */
    int x16list[16];          /* tlist[k] in the 16-row layout */
    int nt;
};

/* Bytes a run of o writes at its peak: the largest type's copies (bk_measure_type), the bandwidth probe's
 * buffer beside them, and the activation and output rows (bk_run_init). */
static uint64_t bk_peak_bytes(const struct bk_opts *o)
{
    const uint64_t stream = (uint64_t)o->mb << 20, n_x = (uint64_t)o->max_tok + 1;
    uint64_t wall = 0;
    for (int k = 0; k < o->nt; k++) {
        const uint64_t wrb = tp_kern_row_bytes(o->tlist[k], o->cols);
        const uint64_t mat = o->x16list[k] ? tp_kern_x16_bytes(o->rows, (size_t)wrb) : wrb * (uint64_t)o->rows;
        const uint64_t copies = (stream + mat - 1) / mat;
        wall = TP_MAX(wall, mat * TP_MAX(copies, 2));
    }
    return wall + stream + n_x * ((uint64_t)o->cols * 2 * sizeof(float) + (uint64_t)o->rows * sizeof(float));
}

/* Parse argv into o (and force --isa and --prefetch).  Returns what tp_cli_parse does: 0 to go on, 1 after
 * --help, 2 after printing a usage error. */
static int bk_parse(int argc, char **argv, struct bk_opts *o)
{
    *o = (struct bk_opts){.types = "q4_0,q4_0x16,q8_0,q8_0x16,f16,bf16,f32", .batch = "2,4,8,16", .rows = 2048,
                          .cols = 5632, .tokens = 128, .threads = 2, .reps = 5, .mb = 256};
    const struct tp_opt opts[] = {
        {"type", 0, TP_OPT_LIST, &o->types, "LIST",
         "weight types (default q4_0,q4_0x16,q8_0,q8_0x16,f16,bf16,f32; TYPEx16 for q4_0, q8_0, mxfp4, q4_k, q5_k, q6_k: "
         "re-laid 16 rows at a time as the model does where the CPU has an x16 kernel)", 0, 0},
        {"rows", 0, TP_OPT_INT, &o->rows, "N", "matrix rows (default 2048)", 1, 1 << 20},
        {"cols", 0, TP_OPT_INT, &o->cols, "N", "matrix columns, a multiple of 256 (default 5632)", 256, 1 << 20},
        {"tokens", 'p', TP_OPT_INT, &o->tokens, "N", "prefill tokens (default 128; 0 skips prefill)", 0, 4096},
        {"threads", 't', TP_OPT_INT, &o->threads, "T", "measure 1..T threads (default 2)", 1, 256},
        {"reps", 0, TP_OPT_INT, &o->reps, "N", "repeats, best is reported (default 5)", 1, 1000},
        {"mb", 0, TP_OPT_INT, &o->mb, "MB", "bytes streamed per decode measurement (default 256)", 16, 65536},
        {"isa", 0, TP_OPT_STRING, &o->isa, "NAME", "kernel instruction set (default: best this CPU has)", 0, 0},
        {"prefetch", 0, TP_OPT_STRING, &o->prefetch, "LEVEL",
         "cache level the decode kernels prefetch into, l1 or l2 (default: this CPU's, or TP_KERN_PREFETCH)", 0, 0},
        {"batch", 0, TP_OPT_LIST, &o->batch, "LIST", "small-batch token counts, 2..64 (default 2,4,8,16; 0: none)",
         0, 0},
        {"json", 0, TP_OPT_FLAG, &o->json, NULL, "one JSON object per line instead of the table", 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0, 0},
    };
    const char *usage = "Usage: tpserve bench kernels [--type LIST] [--rows N] [--cols N] [-p TOKENS] [-t T] [--json]\n"
                        "Matrix-kernel speed per weight type: decode GB/s against a streaming read, prefill GOP/s, "
                        "and small batches.";
    int rc = tp_cli_parse("bench kernels", usage, opts, argc, argv, NULL, 0, NULL, NULL, NULL);
    if (rc) return rc;
    if (o->cols % 256) {
        fprintf(stderr, "tpserve bench kernels: --cols %d is not a multiple of 256\n", o->cols);
        return 2;
    }
    if (o->isa && tp_kern_force_isa(o->isa) != TP_OK) {
        fprintf(stderr, "tpserve bench kernels: --isa %s is not available on this CPU/build; have:", o->isa);
        for (int i = 0; i < tp_kern_isa_count(); i++) fprintf(stderr, " %s", tp_kern_isa_name(i));
        fprintf(stderr, "\n");
        return 2;
    }
    if (o->prefetch && tp_kern_force_prefetch(o->prefetch) != TP_OK) {
        fprintf(stderr, "tpserve bench kernels: --prefetch %s is not a level; use l1 or l2\n", o->prefetch);
        return 2;
    }
    char buf[256];
    o->max_tok = o->tokens;
    snprintf(buf, sizeof buf, "%s", o->batch);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end = NULL;
        long v = strtol(tok, &end, 10);
        if (end == tok || *end || v < 0 || v > 64 || v == 1 || o->nbl == 16) {
            fprintf(stderr, "tpserve bench kernels: --batch '%s': want up to 16 token counts in 2..64 (or 0)\n", tok);
            return 2;
        }
        if (v == 0) continue;
        o->blist[o->nbl++] = (int)v;
        o->max_tok = TP_MAX(o->max_tok, (int)v);
    }
    snprintf(buf, sizeof buf, "%s", o->types);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const size_t tl = strlen(tok);
        if (o->nt < 16 && tl > 3 && strcmp(tok + tl - 3, "x16") == 0) { /* <type>x16: the 16-row layout */
            char base[32];
            snprintf(base, sizeof base, "%.*s", (int)(tl - 3), tok);
            if (tp_wtype_parse(base, &o->tlist[o->nt]) != TP_OK || !tp_kern_x16_type(o->tlist[o->nt]) ||
                tp_kern_act_row_bytes(o->tlist[o->nt], o->cols) == 0) {
                fprintf(stderr, "tpserve bench kernels: --type '%s': only q4_0, q8_0, mxfp4, q4_k, q5_k and q6_k have an x16 "
                                "layout\n", tok);
                return 2;
            }
            o->x16list[o->nt++] = 1;
            continue;
        }
        if (o->nt == 16 || tp_wtype_parse(tok, &o->tlist[o->nt]) != TP_OK || !tp_wtype_supported(o->tlist[o->nt]) ||
            tp_kern_act_row_bytes(o->tlist[o->nt], o->cols) == 0) {
            fprintf(stderr, "tpserve bench kernels: --type '%s' is not a supported weight type\n", tok);
            return 2;
        }
        if (tp_wtype_mlx_bits(o->tlist[o->nt])) { /* three arrays per matrix: not timed here */
            fprintf(stderr, "tpserve bench kernels: --type '%s' (MLX) is not timed here; use tpserve bench gen on an "
                            "MLX directory (tpserve synth --format mlx)\n", tok);
            return 2;
        }
        o->x16list[o->nt++] = 0;
    }
    char what[128];
    snprintf(what, sizeof what, "--rows %d --cols %d --mb %d with %d tokens", o->rows, o->cols, o->mb, o->max_tok);
    return tp_cli_check_memory("bench kernels", what, bk_peak_bytes(o), "use smaller --rows / --cols, --mb or -p / --batch");
}

/* ------------------------------------------------------------------ run */

/* The buffers of a run, released in bk_run_free. */
struct bk_run {
    tp_pool_t *pool;   /* the thread count being measured */
    uint8_t *wall;     /* (copies, mat) copies of the current matrix */
    float *x;          /* (max_tok + 1, cols) activations */
    float *y;          /* (max_tok + 1, rows) outputs */
    float *wf;         /* (cols) one weight row before quantization */
    void *xq;          /* (max_tok + 1) activation rows prepared for the current type */
};

static void bk_run_free(struct bk_run *R)
{
    tp_pool_free(R->pool);
    tp_aligned_free(R->wall);
    free(R->x);
    free(R->y);
    free(R->wf);
    free(R->xq);
    memset(R, 0, sizeof *R);
}

static enum tp_status bk_run_init(struct bk_run *R, const struct bk_opts *o, struct tp_error *err)
{
    memset(R, 0, sizeof *R);
    const size_t cols = (size_t)o->cols, n_x = (size_t)o->max_tok + 1;
    R->x = malloc(n_x * cols * sizeof(float));
    R->y = malloc(n_x * (size_t)o->rows * sizeof(float));
    R->wf = malloc(cols * sizeof(float));
    R->xq = malloc(n_x * cols * sizeof(float));
    if (!R->x || !R->y || !R->wf || !R->xq) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    uint64_t seed = 12345;
    for (size_t i = 0; i < n_x * cols; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        R->x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    return TP_OK;
}

/* What one weight type measured at one thread count. */
struct bk_result {
    char tname[32];
    double mat_bytes, dec_gbs, dec_us, pp_gops;
    double batch_s[16]; /* per --batch entry: seconds per matrix */
};

/* Best seconds per matrix over reps (after one warm-up) of job over all copies. */
static double bk_time_copies(struct bk_run *R, struct bk_job *job, size_t mat, int copies, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = tp_now_s();
        for (int c = 0; c < copies; c++) {
            job->w = R->wall + (size_t)c * mat;
            tp_pool_run(R->pool, bk_matmul, job);
        }
        double dt = (tp_now_s() - t0) / copies;
        if (r > 0 && dt < best) best = dt;
    }
    return best;
}

/* Weight type k of o: quantize enough copies to exceed the caches, then decode, prefill and batches. */
static enum tp_status bk_measure_type(struct bk_run *R, const struct bk_opts *o, int k, struct bk_result *res,
                                      struct tp_error *err)
{
    const enum tp_wtype t = o->tlist[k];
    const int x16 = o->x16list[k], rows = o->rows, cols = o->cols;
    const size_t stream_bytes = (size_t)o->mb << 20;
    const size_t wrb = tp_kern_row_bytes(t, cols), mat = x16 ? tp_kern_x16_bytes(rows, wrb) : wrb * (size_t)rows;
    const int copies = TP_MAX(2, (int)((stream_bytes + mat - 1) / mat));
    tp_aligned_free(R->wall);
    R->wall = tp_stream_alloc(mat * (size_t)copies) /* huge pages, as the model's re-laid weights */;
    if (!R->wall)
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory for %d x %.0f MB", copies, (double)mat / 1e6);
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < cols; i++)
            R->wf[i] = R->x[(size_t)(r % (o->tokens + 1)) * cols + (size_t)((i * 7 + r) % cols)];
        tp_kern_quantize(t, R->wf, R->wall + (size_t)r * wrb, cols);
    }
    if (x16) { /* re-lay copy 0 through copy 1's space, then back */
        tp_kern_repack_x16(t, R->wall, wrb, rows, R->wall + mat, 0, (rows + 15) / 16);
        memcpy(R->wall, R->wall + mat, mat);
    }
    for (int c = 1; c < copies; c++) memcpy(R->wall + (size_t)c * mat, R->wall, mat);
    const size_t xrb = tp_kern_act_row_bytes(t, cols);
    for (int i = 0; i <= o->max_tok; i++)
        tp_kern_prepare_act(t, R->x + (size_t)i * cols, (char *)R->xq + (size_t)i * xrb, cols);
    struct bk_job job = {.t = t, .wrb = wrb, .rows = rows, .cols = cols, .xq = R->xq, .xrb = xrb, .y = R->y,
                         .n_tok = 1, .x16 = x16};
    memset(res, 0, sizeof *res);
    snprintf(res->tname, sizeof res->tname, "%s%s", tp_wtype_name(t), x16 ? "x16" : "");
    res->mat_bytes = (double)mat;
    const double best = bk_time_copies(R, &job, mat, copies, o->reps);
    res->dec_gbs = (double)mat / best / 1e9;
    res->dec_us = best * 1e6;
    if (o->tokens > 0) {
        job.w = R->wall;
        job.n_tok = o->tokens;
        double pbest = 1e30;
        for (int r = 0; r < o->reps; r++) {
            double t0 = tp_now_s();
            tp_pool_run(R->pool, bk_matmul, &job);
            pbest = TP_MIN(pbest, tp_now_s() - t0);
        }
        res->pp_gops = 2.0 * rows * (double)cols * o->tokens / pbest / 1e9;
    }
    for (int bi = 0; bi < o->nbl; bi++) { /* weights from memory, as one decode step of n_tok sequences */
        job.n_tok = o->blist[bi];
        res->batch_s[bi] = bk_time_copies(R, &job, mat, copies, o->reps);
    }
    return TP_OK;
}

/* ------------------------------------------------------------------ report */

static void bk_report_type(const struct bk_opts *o, int th, double stream_gbs, const struct bk_result *res)
{
    const double best = res->dec_us / 1e6;
    if (o->json)
        printf("{\"bench\":\"kernels\",\"isa\":\"%s\",\"prefetch\":\"%s\",\"threads\":%d,\"type\":\"%s\",\"rows\":%d,"
               "\"cols\":%d,\"decode_gbs\":%.2f,\"stream_gbs\":%.2f,\"bw_fraction\":%.3f,\"decode_us\":%.1f,"
               "\"pp_tokens\":%d,\"pp_gops\":%.1f}\n",
               tp_kern_isa(), tp_kern_prefetch_name(tp_kern_prefetch()), th, res->tname, o->rows, o->cols, res->dec_gbs,
               stream_gbs, res->dec_gbs / stream_gbs,
               res->dec_us, o->tokens, res->pp_gops);
    else
        printf("%-7d %-7s %10.1f %12.2f %10.2f %12.1f %12.1f\n", th, res->tname, res->mat_bytes / 1e6, res->dec_gbs,
               res->dec_gbs / stream_gbs, res->dec_us, res->pp_gops);
    if (!o->json && o->nbl > 0) printf("%-7d %-7s batch (us per matrix, x the n_tok=1 time):", th, res->tname);
    for (int bi = 0; bi < o->nbl; bi++) {
        const double b = res->batch_s[bi];
        const double gops = 2.0 * o->rows * (double)o->cols * o->blist[bi] / b / 1e9;
        if (o->json)
            printf("{\"bench\":\"kernels_batch\",\"isa\":\"%s\",\"threads\":%d,\"type\":\"%s\",\"n_tok\":%d,"
                   "\"us\":%.1f,\"x_decode\":%.2f,\"gops\":%.1f}\n",
                   tp_kern_isa(), th, res->tname, o->blist[bi], b * 1e6, b / best, gops);
        else
            printf(" %d: %.0f (%.2fx)", o->blist[bi], b * 1e6, b / best);
    }
    if (!o->json && o->nbl > 0) printf("\n");
    fflush(stdout);
}

/* ------------------------------------------------------------------ command */

int tp_bench_kernels(int argc, char **argv)
{
    struct bk_opts o;
    int rc = bk_parse(argc, argv, &o);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    struct bk_run R;
    struct tp_error err = {0};
    enum tp_status st = bk_run_init(&R, &o, &err);
    if (st == TP_OK && !o.json) {
        printf("kernels: ISA %s, prefetch %s, matrix %d x %d, prefill %d tokens, best of %d\n", tp_kern_isa(),
               tp_kern_prefetch_name(tp_kern_prefetch()), o.rows, o.cols, o.tokens, o.reps);
        printf("%-7s %-7s %10s %12s %10s %12s %12s\n", "threads", "type", "MB/matrix", "decode GB/s", "of stream",
               "decode us", "prefill GOP/s");
    }
    const size_t stream_bytes = (size_t)o.mb << 20;
    for (int th = 1; th <= o.threads && st == TP_OK; th++) {
        struct tp_pool_config pc = tp_pool_default_config();
        pc.n_threads = th;
        tp_pool_free(R.pool);
        R.pool = NULL;
        if (tp_pool_init(&pc, &R.pool) != TP_OK) {
            st = tp_error_set(&err, TP_ERR_NOMEM, "cannot start %d threads", th);
            break;
        }
        const double stream_gbs = tp_mem_read_bw_gbs(R.pool, stream_bytes, o.reps + 1);
        if (o.json)
            printf("{\"bench\":\"kernels\",\"threads\":%d,\"type\":\"stream\",\"gbs\":%.2f}\n", th, stream_gbs);
        else
            printf("%-7d %-7s %10.1f %12.2f %10s %12s %12s\n", th, "stream", (double)stream_bytes / 1e6, stream_gbs,
                   "1.00", "-", "-");
        for (int k = 0; k < o.nt && st == TP_OK; k++) {
            struct bk_result res;
            st = bk_measure_type(&R, &o, k, &res, &err);
            if (st == TP_OK) bk_report_type(&o, th, stream_gbs, &res);
        }
    }
    bk_run_free(&R);
    tp_kern_force_isa(NULL);
    tp_kern_force_prefetch(NULL);
    if (st != TP_OK) return tp_cli_fail("bench kernels", "%s", err.msg);
    return 0;
}

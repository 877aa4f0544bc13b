/*
 * cli/bench_comm.c - `tpserve bench comm`: collective latency and
 * bandwidth per message size, run on every rank of a group
 * (`tpserve launch -n 2 -- tpserve bench comm`); --compare-mpi times the
 * same op through MPI in the same processes, call by call; --decode N_EMBD
 * times the collectives of one greedy decode step instead (what `tpserve plan
 * --comm-json` reads).  Output: a table on rank 0's stdout, or one JSON object
 * per size or collective (--json).  Method, the bandwidth definitions and the
 * JSON fields: docs/performance.md.
 */
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "cli.h"
#include "comm/comm.h"
#include "model/kernels.h"
#include "parallel/parallel.h"

enum bench_op { OP_ALL_SUM = 0, OP_ALL_GATHER, OP_SUM_SCATTER, OP_BROADCAST, OP_GATHER, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"all_sum", "all_gather", "sum_scatter", "broadcast", "gather"};

/* "64K", "1MiB", "4G", "512": bytes.  TP_OK or TP_ERR_INVALID_ARG. */
static enum tp_status parse_bytes(const char *s, size_t *out)
{
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || v < 0) return TP_ERR_INVALID_ARG;
    double mult = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mult = 1024.0; break;
        case 'M': mult = 1024.0 * 1024.0; break;
        case 'G': mult = 1024.0 * 1024.0 * 1024.0; break;
        default: return TP_ERR_INVALID_ARG;
        }
        end++;
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) return TP_ERR_INVALID_ARG;
    }
    *out = (size_t)(v * mult);
    return TP_OK;
}

static enum tp_status run_op(tp_comm_t *c, enum bench_op op, void *a, void *b, size_t count, enum tp_dtype dt)
{
    switch (op) {
    case OP_ALL_SUM: return tp_comm_all_sum(c, a, b, count, dt);
    case OP_ALL_GATHER: return tp_comm_all_gather(c, a, b, count, dt);
    case OP_SUM_SCATTER: return tp_comm_sum_scatter(c, a, b, count, dt);
    case OP_GATHER: return tp_comm_gather(c, a, b, count, dt, 0);
    default: return tp_comm_broadcast(c, a, count, dt, 0);
    }
}

/* *med = the median of times[0..iters), maxed over the ranks of c. */
static enum tp_status median_max(tp_comm_t *c, double *times, int iters, double *med)
{
    *med = tp_median(times, iters);
    return tp_comm_all_max(c, med, med, 1, TP_DTYPE_I64); /* positive doubles order like i64 */
}

/* --sync: sync_t[0] = the median over the calls of [the last rank's exit - the last rank's entry] (the
 * ranks' times gathered; ranks on one machine share its clock), the time a call takes once every rank is
 * in it; sync_t[1] = their mean; sync_t[2] = the mean of [the last rank's entry - the first rank's entry],
 * how long the first rank waited for the last.  t0[i], t1[i]: this rank's entry and exit ns of call i. */
static enum tp_status median_synced(tp_comm_t *c, const uint64_t *t0, const uint64_t *t1, int iters, double *sync_t)
{
    const int n = tp_comm_size(c);
    enum tp_status st = TP_ERR_NOMEM;
    uint64_t *mine = malloc(sizeof(uint64_t) * 2 * (size_t)iters);
    uint64_t *all = malloc(sizeof(uint64_t) * 2 * (size_t)iters * (size_t)n);
    double *d = malloc(sizeof(double) * (size_t)iters), skew = 0.0;
    if (mine && all && d) {
        memcpy(mine, t0, sizeof(uint64_t) * (size_t)iters);
        memcpy(mine + iters, t1, sizeof(uint64_t) * (size_t)iters);
        st = tp_comm_all_gather(c, mine, all, 2 * (size_t)iters, TP_DTYPE_I64);
    }
    for (int i = 0; st == TP_OK && i < iters; i++) {
        uint64_t in = 0, out = 0, first = UINT64_MAX;
        for (int r = 0; r < n; r++) {
            in = TP_MAX(in, all[(size_t)r * 2 * iters + (size_t)i]);
            first = TP_MIN(first, all[(size_t)r * 2 * iters + (size_t)i]);
            out = TP_MAX(out, all[(size_t)r * 2 * iters + (size_t)iters + (size_t)i]);
        }
        d[i] = out > in ? (double)(out - in) * 1e-9 : 0.0;
        skew += (double)(in - first) * 1e-9;
    }
    if (st == TP_OK) {
        double sum = 0.0;
        for (int i = 0; i < iters; i++) sum += d[i];
        sync_t[1] = sum / iters;
        sync_t[2] = skew / iters;
        sync_t[0] = tp_median(d, iters);
    }
    free(mine), free(all), free(d);
    return st;
}

/* --gap-bytes: before each all_sum and the gather of a --decode step a rank reads the next part of its own
 * buffer, as the forward pass reads the next weights between two collectives: each part once per step, so
 * a step reads the whole buffer (--layers x (attention + FFN) + output head), as a token reads the rank's
 * weights, and what it evicts from the caches is what a decode step evicts.  A plain sum of the words, or
 * with --gap-type the decode matmul kernel of that weight type over the rows of the part (N_EMBD columns;
 * re-laid x16 where the model would be), on the calling thread as `bench gen -t 1` runs it.  bytes 0:
 * none. */
struct bc_gap {
    const uint64_t *buf;     /* (bytes) the words read, or the matrix (owned) */
    size_t bytes;
    int kernel;              /* --gap-type given: run the kernel */
    enum tp_wtype wt;
    int x16;                 /* buf is re-laid x16 */
    int64_t rows, cols;
    size_t row_bytes;        /* one row in the GGUF layout */
    void *xq;                /* (1, act_row_bytes) the prepared activation row (owned) */
    size_t act_row_bytes;
    float *y;                /* (rows) the output (owned) */
};

static volatile uint64_t gap_sink; /* keeps the reads */

/* Read `bytes` of g from byte `at` (clipped to the buffer): words summed, or the kernel over the rows they
 * hold (at least one). */
static void gap_read(const struct bc_gap *g, size_t at, size_t bytes)
{
    if (!g || !g->bytes || !bytes) return;
    if (g->kernel) {
        const int64_t r0 = TP_MIN((int64_t)(at / g->row_bytes), g->rows - 1);
        const int64_t r1 = TP_MIN(r0 + TP_MAX((int64_t)(bytes / g->row_bytes), 1), g->rows);
        if (g->x16)
            tp_kern_matmul_x16(g->wt, g->buf, g->row_bytes, g->cols, g->xq, g->act_row_bytes, 1, g->y, g->rows, r0,
                               r1);
        else
            tp_kern_matmul(g->wt, g->buf, g->row_bytes, g->cols, g->xq, g->act_row_bytes, 1, g->y, g->rows, r0, r1);
        gap_sink = (uint64_t)g->y[r1 - 1];
        return;
    }
    uint64_t s = 0;
    const size_t w0 = TP_MIN(at, g->bytes) / sizeof(uint64_t), w1 = TP_MIN(at + bytes, g->bytes) / sizeof(uint64_t);
    for (size_t i = w0; i < w1; i++) s += g->buf[i];
    gap_sink = s;
}

/* *t = median seconds per call over iters timed calls, max over ranks; with a
 * second group (mpi), its calls alternate with ours one by one so both see
 * the same machine load, and *mpi_t is its median; sync_t (may be NULL):
 * the median and mean synced times (median_synced).  On failure the status of
 * the failed call, *which = 1 when it was the mpi group's. */
static enum tp_status measure(tp_comm_t *c, tp_comm_t *mpi, enum bench_op op, void *a, void *b, size_t count,
                              enum tp_dtype dt, int iters, int warmup, double *times, double *mtimes, double *t,
                              double *mpi_t, double *sync_t, int *which)
{
    enum tp_status st;
    *which = 0;
    uint64_t *ts = sync_t ? malloc(sizeof(uint64_t) * 2 * (size_t)iters) : NULL;
    if (sync_t && !ts) return TP_ERR_NOMEM;
    if ((st = tp_comm_barrier(c)) != TP_OK) goto out;
    for (int i = 0; i < warmup; i++) {
        if ((st = run_op(c, op, a, b, count, dt)) != TP_OK) goto out;
        if (mpi && (st = run_op(mpi, op, a, b, count, dt)) != TP_OK) goto out_mpi;
    }
    for (int i = 0; i < iters; i++) {
        uint64_t t0 = tp_now_ns();
        if ((st = run_op(c, op, a, b, count, dt)) != TP_OK) goto out;
        uint64_t t1 = tp_now_ns();
        times[i] = (double)(t1 - t0) * 1e-9;
        if (ts) ts[i] = t0, ts[iters + i] = t1;
        if (mpi) {
            if ((st = run_op(mpi, op, a, b, count, dt)) != TP_OK) goto out_mpi;
            mtimes[i] = (double)(tp_now_ns() - t1) * 1e-9;
        }
    }
    if (mpi && (st = median_max(mpi, mtimes, iters, mpi_t)) != TP_OK) goto out_mpi;
    st = median_max(c, times, iters, t);
    if (st == TP_OK && ts) st = median_synced(c, ts, ts + iters, iters, sync_t);
out:
    free(ts);
    return st;
out_mpi:
    *which = 1;
    free(ts);
    return st;
}

static double bus_factor(enum bench_op op, int n)
{
    if (n <= 1) return 1.0;
    switch (op) {
    case OP_ALL_SUM: return 2.0 * (n - 1) / n;
    case OP_ALL_GATHER:
    case OP_GATHER:
    case OP_SUM_SCATTER: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

static void fmt_size(size_t b, char *out, size_t cap)
{
    if (b >= (1u << 30) && b % (1u << 30) == 0) snprintf(out, cap, "%zuG", b >> 30);
    else if (b >= (1u << 20) && b % (1u << 20) == 0) snprintf(out, cap, "%zuM", b >> 20);
    else if (b >= 1024 && b % 1024 == 0) snprintf(out, cap, "%zuK", b >> 10);
    else snprintf(out, cap, "%zu", b);
}

/* Form the ring/rdma group under mpirun: rank 0 picks a free port and
 * broadcasts "host:port" over the mpi group. */
static enum tp_status ring_via_mpi(tp_comm_t *mpi, const struct tp_comm_config *env_cfg, tp_comm_t **out,
                                   struct tp_error *err)
{
    char coord[128];
    memset(coord, 0, sizeof coord);
    if (tp_comm_rank(mpi) == 0) {
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        int port = 0;
        if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &al) == 0)
            port = ntohs(a.sin_port);
        if (fd >= 0) close(fd);
        char host[64] = "127.0.0.1";
        const char *h = getenv("TP_BENCH_COORD_HOST");
        if (h && *h) snprintf(host, sizeof host, "%s", h);
        snprintf(coord, sizeof coord, "%s:%d", host, port);
    }
    if (tp_comm_broadcast(mpi, coord, sizeof coord, TP_DTYPE_U8, 0) != TP_OK)
        return tp_error_set(err, TP_ERR_PEER, "broadcast of the coordinator address failed: %s",
                            tp_comm_last_error(mpi));
    coord[sizeof coord - 1] = '\0';
    struct tp_comm_config cfg = *env_cfg; /* backend, timeouts, token, shm from the environment */
    cfg.rank = tp_comm_rank(mpi);
    cfg.world_size = tp_comm_size(mpi);
    cfg.coordinator = coord;
    cfg.hostfile = NULL;
    return tp_comm_init(&cfg, out, err);
}

/* ------------------------------------------------------------------ parse */

struct bc_opts {
    const char *backend; /* NULL: TP_BACKEND or ring */
    enum bench_op op;
    enum tp_dtype dt;
    size_t min_b, max_b;
    int iters, warmup, json, compare_mpi, sync;
    int decode_embd;                /* --decode: the model width (0: a size sweep) */
    int layers;                     /* --layers with --decode: the layers of a step (all_sums: 2 per layer) */
    size_t gap_bytes;               /* --gap-bytes with --decode: what a step reads, layers x (gap_part[0] +
                                     * gap_part[1]) + gap_part[2] */
    size_t gap_part[3];             /* bytes read before a layer's first all_sum (attention), its second (FFN)
                                     * and the argmax gather (the output head); one --gap-bytes size: all three */
    int gap_kernel;                 /* --gap-type given */
    enum tp_wtype gap_type;         /* --gap-type: the weight type whose kernel reads the gap */
    enum tp_wire_dtype wire_dtype;  /* --comm-dtype with --decode */
};

/* --gap-bytes "SIZE" or "ATTN,FFN,HEAD" into o->gap_part.  TP_OK or TP_ERR_INVALID_ARG. */
static enum tp_status bc_parse_gaps(const char *s, struct bc_opts *o)
{
    char buf[96];
    if (strlen(s) >= sizeof buf) return TP_ERR_INVALID_ARG;
    snprintf(buf, sizeof buf, "%s", s);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == 3 || parse_bytes(t, &o->gap_part[n]) != TP_OK || o->gap_part[n] > ((size_t)16 << 30))
            return TP_ERR_INVALID_ARG;
        n++;
    }
    if (n != 1 && n != 3) return TP_ERR_INVALID_ARG;
    if (n == 1) o->gap_part[1] = o->gap_part[2] = o->gap_part[0];
    return TP_OK;
}

/* --layers, --gap-bytes (gap_s) and --gap-type (gap_type) of --decode into o.  0, or 2 after printing a usage
 * error. */
static int bc_parse_decode_gaps(struct bc_opts *o, const char *gap_s, const char *gap_type)
{
    if (o->layers != 1 && !o->decode_embd) {
        fprintf(stderr, "tpserve bench comm: --layers goes with --decode\n");
        return 2;
    }
    if (gap_type && !gap_s) {
        fprintf(stderr, "tpserve bench comm: --gap-type says how the --gap-bytes are read; give --gap-bytes too\n");
        return 2;
    }
    if (gap_type) {
        if (tp_wtype_parse(gap_type, &o->gap_type) != TP_OK || !tp_wtype_supported(o->gap_type) ||
            tp_wtype_mlx_bits(o->gap_type) || tp_kern_row_bytes(o->gap_type, o->decode_embd) == 0) {
            fprintf(stderr, "tpserve bench comm: --gap-type wants a weight type this build computes with whose "
                            "blocks divide N_EMBD %d (f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k), got '%s'\n",
                    o->decode_embd, gap_type);
            return 2;
        }
        o->gap_kernel = 1;
    }
    if (gap_s && bc_parse_gaps(gap_s, o) != TP_OK) {
        fprintf(stderr, "tpserve bench comm: --gap-bytes wants a size up to 16G (e.g. 8M), or three (attention, "
                        "FFN, output head: e.g. 2M,8M,16M), got '%s'\n", gap_s);
        return 2;
    }
    o->gap_bytes = (size_t)o->layers * (o->gap_part[0] + o->gap_part[1]) + o->gap_part[2];
    if (o->gap_bytes > ((size_t)64 << 30)) {
        fprintf(stderr, "tpserve bench comm: --layers %d x --gap-bytes %s reads %zu bytes a step; at most 64G\n",
                o->layers, gap_s, o->gap_bytes);
        return 2;
    }
    return 0;
}

/* Parse argv into o.  Returns what tp_cli_parse does: 0 to go on, 1 after --help, 2 after printing a
 * usage error. */
static int bc_parse(int argc, char **argv, struct bc_opts *o)
{
    const char *opname = "all_sum", *dtname = "f32", *min_s = "1K", *max_s = "256M", *wire = "f32", *gap_s = NULL;
    const char *gap_type = NULL;
    *o = (struct bc_opts){.warmup = -1, .layers = 1};
    const struct tp_opt opts[] = {
        {"backend", 'b', TP_OPT_STRING, &o->backend, "NAME", "ring | rdma | mpi (default: TP_BACKEND or ring)", 0, 0},
        {"op", 0, TP_OPT_STRING, &opname, "OP", "all_sum (default) | all_gather | sum_scatter | broadcast | gather", 0,
         0},
        {"dtype", 0, TP_OPT_STRING, &dtname, "T", "f32 (default) | f16 | bf16 | i32 | i64 | u8", 0, 0},
        {"min-bytes", 0, TP_OPT_STRING, &min_s, "SIZE", "smallest message (default 1K; K/M/G suffixes)", 0, 0},
        {"max-bytes", 0, TP_OPT_STRING, &max_s, "SIZE", "largest message (default 256M)", 0, 0},
        {"iters", 0, TP_OPT_INT, &o->iters, "N", "timed calls per size (default: by size, 5..1000)", 1, 500000},
        {"warmup", 0, TP_OPT_INT, &o->warmup, "N", "untimed calls per size first (default: iters/10, >= 2)", 0,
         1000000},
        {"json", 0, TP_OPT_FLAG, &o->json, NULL, "one JSON object per line instead of the table", 0, 0},
        {"compare-mpi", 0, TP_OPT_FLAG, &o->compare_mpi, NULL,
         "also time the same op through MPI in the same run (needs an MPI group)", 0, 0},
        {"sync", 0, TP_OPT_FLAG, &o->sync, NULL,
         "ranks on this machine (one clock): also the median time from the last rank's entry to the last rank's "
         "exit (sync_lat_us_median and _mean: without the waits for a late rank)",
         0, 0},
        {"decode", 0, TP_OPT_INT, &o->decode_embd, "N_EMBD",
         "time the collectives of one greedy decode step of a model this wide instead of a size sweep: the step "
         "header broadcast, the all_sum of N_EMBD activations, the argmax gather (for `tpserve plan --comm-json`)",
         1, 1 << 24},
        {"gap-bytes", 0, TP_OPT_STRING, &gap_s, "SIZE[,SIZE,SIZE]",
         "with --decode: bytes each rank reads from memory before each all_sum and the gather, as the forward pass "
         "reads its weights between collectives: one size for every call (its bytes per token / (2 n_layer + 2)), "
         "or three: before a layer's attention all_sum, its FFN all_sum, and the gather (the output head; "
         "default 0: none)",
         0, 0},
        {"layers", 0, TP_OPT_INT, &o->layers, "N",
         "with --decode: a step of N layers, 2 N all_sums, as the model's decode step (default 1)", 1, 4096},
        {"gap-type", 0, TP_OPT_STRING, &gap_type, "T",
         "with --gap-bytes: read the gap with the decode matmul of weights of type T (the model's: q4_0, q8_0, "
         "q4_k, f16, ...) over a matrix of N_EMBD columns, as the forward pass computes (default: a plain read)",
         0, 0},
        {"comm-dtype", 0, TP_OPT_STRING, &wire, "T",
         "with --decode: activations on the wire, f32 (default) | f16 | bf16 | q8, as `serve --comm-dtype`", 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0, 0},
    };
    int np = 0;
    int rc = tp_cli_parse("bench comm",
                          "Usage: tpserve launch -n 2 -- tpserve bench comm [options]\n"
                          "       tpserve launch -n 2 --backend mpi -- tpserve bench comm --compare-mpi [options]\n"
                          "       mpirun -n 2 --mca btl tcp,self tpserve bench comm --compare-mpi [options]",
                          opts, argc, argv, NULL, 0, &np, NULL, NULL);
    if (rc) return rc;
    if (tp_wire_dtype_parse(wire, &o->wire_dtype) != TP_OK) {
        fprintf(stderr, "tpserve bench comm: --comm-dtype must be f32, f16, bf16 or q8, got '%s'\n", wire);
        return 2;
    }
    if (o->decode_embd && (o->compare_mpi || strcmp(opname, "all_sum") != 0 || strcmp(dtname, "f32") != 0 ||
                           strcmp(min_s, "1K") != 0 || strcmp(max_s, "256M") != 0)) {
        fprintf(stderr, "tpserve bench comm: --decode times the decode step's own collectives and sizes; leave out "
                        "--op, --dtype, --min-bytes, --max-bytes and --compare-mpi\n");
        return 2;
    }
    if (!o->decode_embd && (strcmp(wire, "f32") != 0 || gap_s || gap_type)) {
        fprintf(stderr, "tpserve bench comm: --comm-dtype, --gap-bytes and --gap-type go with --decode\n");
        return 2;
    }
    if (bc_parse_decode_gaps(o, gap_s, gap_type) != 0) return 2;
    o->op = OP_COUNT;
    for (int i = 0; i < OP_COUNT; i++)
        if (strcmp(opname, op_names[i]) == 0) o->op = (enum bench_op)i;
    if (o->op == OP_COUNT) {
        fprintf(stderr,
                "tpserve bench comm: --op must be all_sum, all_gather, sum_scatter, broadcast or gather, got '%s'\n",
                opname);
        return 2;
    }
    o->dt = TP_DTYPE_COUNT;
    for (int i = 0; i < TP_DTYPE_COUNT; i++)
        if (strcmp(dtname, tp_dtype_name((enum tp_dtype)i)) == 0) o->dt = (enum tp_dtype)i;
    if (o->dt == TP_DTYPE_COUNT) {
        fprintf(stderr, "tpserve bench comm: --dtype must be f32, f16, bf16, i32, i64 or u8, got '%s'\n", dtname);
        return 2;
    }
    if (parse_bytes(min_s, &o->min_b) != TP_OK || parse_bytes(max_s, &o->max_b) != TP_OK || o->min_b < 1 ||
        o->max_b < o->min_b || o->max_b > ((size_t)4 << 30)) {
        fprintf(stderr, "tpserve bench comm: want 1 <= --min-bytes <= --max-bytes <= 4G (e.g. 1K, 256M), got %s / %s\n",
                min_s, max_s);
        return 2;
    }
    if (o->decode_embd) { /* its own calls: buffers for the largest (f32 activations, or the 256-byte header) */
        o->op = OP_ALL_SUM;
        o->dt = TP_DTYPE_F32;
        o->min_b = o->max_b = TP_MAX((size_t)o->decode_embd * 4, (size_t)256);
    }
    enum tp_comm_backend be;
    if (o->backend && tp_comm_backend_parse(o->backend, &be) != TP_OK) {
        fprintf(stderr, "tpserve bench comm: --backend must be ring, rdma or mpi, got '%s'\n", o->backend);
        return 2;
    }
    if (o->compare_mpi && o->backend && strcmp(o->backend, "mpi") == 0) {
        fprintf(stderr, "tpserve bench comm: --compare-mpi times the ring or rdma backend against MPI; with --backend "
                        "mpi it would compare MPI with itself (leave --backend out, or give ring or rdma)\n");
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------------ run */

/* The groups and buffers of a run, released in bc_run_free. */
struct bc_run {
    tp_comm_t *c;          /* the group timed */
    tp_comm_t *mpi;        /* --compare-mpi: the MPI group of the same processes; NULL otherwise */
    unsigned char *a, *b;  /* input and output buffers of the largest size */
    double *times;         /* (2 x 500000): our call times, then the MPI group's */
    struct bc_gap gap;     /* --gap-bytes: the buffer read before each --decode call (owned) */
};

static void bc_run_free(struct bc_run *R)
{
    tp_comm_free(R->c);
    tp_comm_free(R->mpi);
    tp_aligned_free(R->a);
    tp_aligned_free(R->b);
    free(R->times);
    tp_aligned_free((void *)R->gap.buf);
    tp_aligned_free(R->gap.xq);
    free(R->gap.y);
    memset(R, 0, sizeof *R);
}

/* Form the group(s): from the environment, or with --compare-mpi an MPI group first and ours through it. */
static enum tp_status bc_groups(struct bc_run *R, const struct bc_opts *o, struct tp_error *err)
{
    struct tp_comm_config cfg = tp_comm_default_config();
    enum tp_status st = tp_comm_config_from_env(&cfg, err);
    if (st != TP_OK) return st;
    if (o->backend) (void)tp_comm_backend_parse(o->backend, &cfg.backend); /* checked by bc_parse */
    if (!o->compare_mpi) return tp_comm_init(&cfg, &R->c, err);
    struct tp_comm_config mcfg = tp_comm_default_config();
    mcfg.backend = TP_COMM_BACKEND_MPI;
    if ((st = tp_comm_init(&mcfg, &R->mpi, err)) != TP_OK) {
        char m[TP_ERROR_MSG_MAX];
        snprintf(m, sizeof m, "%s", err->msg);
        return tp_error_force(err, st, "--compare-mpi: %s", m);
    }
    if (tp_comm_size(R->mpi) < 2)
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "--compare-mpi needs an MPI group of N >= 2 (MPI reports 1 rank): run it under "
                            "`tpserve launch -n N --backend mpi --` or `mpirun -n N`");
    /* TP_BACKEND=mpi (set by launch --backend mpi) names the launcher, not what is compared */
    if (cfg.backend == TP_COMM_BACKEND_MPI) cfg.backend = TP_COMM_BACKEND_RING;
    if (cfg.hostfile || cfg.coordinator) {
        cfg.rank = tp_comm_rank(R->mpi);
        cfg.world_size = tp_comm_size(R->mpi);
        return tp_comm_init(&cfg, &R->c, err);
    }
    return ring_via_mpi(R->mpi, &cfg, &R->c, err);
}

/* --gap-type: R->gap as a matrix of that type holding a step's reads (o->gap_bytes: whole rows of N_EMBD
 * columns, at least one), rows quantized from a pseudo-random row, re-laid x16 when the chosen ISA would
 * re-lay it; an activation row prepared for it and the output. */
static enum tp_status bc_gap_matrix(struct bc_run *R, const struct bc_opts *o, struct tp_error *err)
{
    struct bc_gap *g = &R->gap;
    const int64_t cols = o->decode_embd;
    g->kernel = 1;
    g->wt = o->gap_type;
    g->cols = cols;
    g->row_bytes = tp_kern_row_bytes(g->wt, cols);
    g->rows = (int64_t)TP_MAX(o->gap_bytes / g->row_bytes, 1);
    g->x16 = tp_kern_x16_type(g->wt) && tp_kern_x16_native(g->wt);
    g->bytes = g->x16 ? tp_kern_x16_bytes(g->rows, g->row_bytes) : g->row_bytes * (size_t)g->rows;
    g->act_row_bytes = tp_kern_act_row_bytes(g->wt, cols);
    float *x = malloc(sizeof(float) * (size_t)cols);
    unsigned char *rows = tp_aligned_alloc(64, g->row_bytes * (size_t)g->rows + 64);
    unsigned char *w = g->x16 ? tp_aligned_alloc(64, g->bytes + 64) : rows;
    g->xq = tp_aligned_alloc(64, g->act_row_bytes + 64);
    g->y = malloc(sizeof(float) * (size_t)g->rows);
    if (!x || !rows || !w || !g->xq || !g->y) {
        free(x);
        tp_aligned_free(rows);
        if (w != rows) tp_aligned_free(w);
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory for a --gap-bytes %zu matrix", o->gap_bytes);
    }
    uint32_t state = 0x9E3779B9u;
    for (int64_t i = 0; i < cols; i++) {
        state = state * 1664525u + 1013904223u;
        x[i] = (float)((double)(state >> 8) / (double)(1u << 24) - 0.5);
    }
    (void)tp_kern_quantize(g->wt, x, rows, cols);
    for (int64_t r = 1; r < g->rows; r++) memcpy(rows + (size_t)r * g->row_bytes, rows, g->row_bytes);
    tp_kern_prepare_act(g->wt, x, g->xq, cols);
    free(x);
    if (g->x16) {
        tp_kern_repack_x16(g->wt, rows, g->row_bytes, g->rows, w, 0, (g->rows + 15) / 16);
        tp_aligned_free(rows);
    }
    g->buf = (const uint64_t *)w;
    return TP_OK;
}

/* The buffers for the largest message, filled with rank-dependent values. */
static enum tp_status bc_buffers(struct bc_run *R, const struct bc_opts *o, struct tp_error *err)
{
    const int me = tp_comm_rank(R->c), n = tp_comm_size(R->c);
    const size_t es = tp_dtype_size(o->dt);
    /* --decode: every call's send and receive fit n blocks of the largest one */
    const int n_blocks = o->decode_embd || o->op == OP_SUM_SCATTER || o->op == OP_ALL_GATHER || o->op == OP_GATHER;
    const size_t in_mult = o->decode_embd || o->op == OP_SUM_SCATTER ? (size_t)n : 1;
    const size_t out_mult = n_blocks && o->op != OP_SUM_SCATTER ? (size_t)n : 1;
    /* bytes = full output buffer (all_gather, gather: n blocks; sum_scatter: the input) */
    const size_t max_count = TP_MAX(o->max_b / es, 1);
    R->a = tp_aligned_alloc(64, max_count * es * in_mult + 64);
    R->b = tp_aligned_alloc(64, max_count * es * out_mult + 64);
    R->times = malloc(1000000 * sizeof *R->times);
    if (!R->a || !R->b || !R->times)
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory for %zu-byte buffers",
                            max_count * es * TP_MAX(in_mult, out_mult));
    for (size_t i = 0; i < max_count * in_mult; i++) {
        if (o->dt == TP_DTYPE_F32) ((float *)R->a)[i] = (float)((i + (size_t)me) % 7);
        else memset(R->a + i * es, 0, es);
    }
    memset(R->b, 0, max_count * es * out_mult);
    if (o->gap_bytes && o->gap_kernel) return bc_gap_matrix(R, o, err);
    if (o->gap_bytes) {
        const size_t words = (o->gap_bytes + 7) / 8;
        uint64_t *g = tp_aligned_alloc(64, words * sizeof(uint64_t));
        if (!g) return tp_error_set(err, TP_ERR_NOMEM, "out of memory for --gap-bytes %zu", o->gap_bytes);
        for (size_t i = 0; i < words; i++) g[i] = i * 0x9E3779B97F4A7C15ull; /* touched: really in memory */
        R->gap = (struct bc_gap){.buf = g, .bytes = words * sizeof(uint64_t)};
    }
    return TP_OK;
}

/* ------------------------------------------------------------------ report */

static void bc_report_header(const struct bc_run *R, const struct bc_opts *o)
{
    printf("# tpserve bench comm: backend %s, op %s, dtype %s, %d ranks%s\n",
           tp_comm_backend_name(tp_comm_backend(R->c)), op_names[o->op], tp_dtype_name(o->dt), tp_comm_size(R->c),
           R->mpi ? ", vs the same op through MPI in the same processes" : "");
    printf("%10s %7s %12s %10s %10s", "bytes", "iters", "lat_us(med)", "algbw_GB/s", "busbw_GB/s");
    if (R->mpi) printf(" %12s %10s %9s %9s", "mpi_lat_us", "mpi_busbw", "lat_ratio", "bw_ratio");
    if (o->sync) printf(" %12s", "sync_lat_us");
    printf("\n");
    fflush(stdout);
}

/* One size's line: t (and tm with --compare-mpi) seconds per call of real_bytes. */
static void bc_report_row(const struct bc_run *R, const struct bc_opts *o, size_t real_bytes, int it, double t,
                          double tm, const double *ts)
{
    const int n = tp_comm_size(R->c);
    const double bf = bus_factor(o->op, n);
    const double alg = (double)real_bytes / t / 1e9, bus = alg * bf;
    const double malg = tm > 0 ? (double)real_bytes / tm / 1e9 : 0, mbus = malg * bf;
    if (o->json) {
        printf("{\"backend\":\"%s\",\"op\":\"%s\",\"dtype\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"iters\":%d,"
               "\"lat_us_median\":%.3f,\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f",
               tp_comm_backend_name(tp_comm_backend(R->c)), op_names[o->op], tp_dtype_name(o->dt), n, real_bytes, it,
               t * 1e6, alg, bus);
        if (R->mpi)
            printf(",\"mpi_lat_us_median\":%.3f,\"mpi_busbw_gbs\":%.4f,\"lat_ratio_vs_mpi\":%.3f,"
                   "\"busbw_ratio_vs_mpi\":%.3f",
                   tm * 1e6, mbus, t / tm, bus / mbus);
        if (o->sync)
            printf(",\"sync_lat_us_median\":%.3f,\"sync_lat_us_mean\":%.3f,\"wait_us_mean\":%.3f", ts[0] * 1e6,
                   ts[1] * 1e6, ts[2] * 1e6);
        printf("}\n");
    } else {
        char sz[32];
        fmt_size(real_bytes, sz, sizeof sz);
        printf("%10s %7d %12.2f %10.3f %10.3f", sz, it, t * 1e6, alg, bus);
        if (R->mpi) printf(" %12.2f %10.3f %9.2f %9.2f", tm * 1e6, mbus, t / tm, bus / mbus);
        if (o->sync) printf(" %12.2f", ts[0] * 1e6);
        printf("\n");
    }
    fflush(stdout);
}

/* The bytes a rank reads before call k (within a step) of collective c: none before the step header, the
 * attention's and the FFN's alternately before the layer's all_sums, the output head's before the gather. */
static size_t bc_gap_before(const struct bc_opts *o, const struct tp_parallel_coll_cost *c, int k)
{
    if (c->op == TP_COMM_OP_BROADCAST) return 0;
    if (c->op == TP_COMM_OP_GATHER) return o->gap_part[2];
    return o->gap_part[k % 2];
}

/* One --decode collective's result line on rank 0. */
static void bc_decode_row(const struct bc_run *R, const struct bc_opts *o, const struct tp_parallel_coll_cost *c,
                          enum bench_op op, int it, double t, const double *ts)
{
    const int n = tp_comm_size(R->c);
    const size_t bytes = c->count * tp_dtype_size(c->dt);
    if (o->json) {
        printf("{\"backend\":\"%s\",\"op\":\"%s\",\"what\":\"%s\",\"dtype\":\"%s\",\"ranks\":%d,"
               "\"bytes\":%zu,\"gap_bytes\":%zu,\"gap_type\":\"%s\",\"iters\":%d,\"lat_us_median\":%.3f",
               tp_comm_backend_name(tp_comm_backend(R->c)), op_names[op], c->what, tp_dtype_name(c->dt), n, bytes,
               (bc_gap_before(o, c, 0) + bc_gap_before(o, c, 1)) / 2, o->gap_kernel ? tp_wtype_name(o->gap_type) : "read",
               it, t * 1e6);
        if (o->sync)
            printf(",\"sync_lat_us_median\":%.3f,\"sync_lat_us_mean\":%.3f,\"wait_us_mean\":%.3f", ts[0] * 1e6,
                   ts[1] * 1e6, ts[2] * 1e6);
        printf("}\n");
    } else {
        printf("%14s %10s %8zu %7d %12.2f", c->what, op_names[op], bytes, it, t * 1e6);
        if (o->sync) printf(" %18.2f %18.2f %14.2f", ts[0] * 1e6, ts[1] * 1e6, ts[2] * 1e6);
        printf("\n");
    }
    fflush(stdout);
}

static enum bench_op bench_op_of(enum tp_comm_op op)
{
    switch (op) {
    case TP_COMM_OP_ALL_SUM: return OP_ALL_SUM;
    case TP_COMM_OP_ALL_GATHER: return OP_ALL_GATHER;
    case TP_COMM_OP_GATHER: return OP_GATHER;
    default: return OP_BROADCAST;
    }
}

/*
 * --decode: the collectives of a greedy decode step over this group (tp_parallel_decode_cost of one
 * layer), run as the engine runs them, step after step: the step header broadcast, then each all_sum
 * and the argmax gather after the rank has read --gap-bytes (its share of the forward pass), so each call
 * meets the ranks as a decode step does (the root starts a step while the workers wait; a rank may be
 * asleep or waiting for its core).  Every call of the timed steps is timed; per collective, one line on
 * rank 0 (median per rank, and with --sync the median and mean once every rank is in it).  Returns the
 * exit code.
 */
static int bc_decode(struct bc_run *R, const struct bc_opts *o)
{
    const int me = tp_comm_rank(R->c), n = tp_comm_size(R->c);
    struct tp_parallel_decode_cost dc;
    tp_parallel_decode_cost(o->layers, o->decode_embd, o->wire_dtype, n, me, &dc);
    if (me == 0 && !o->json)
        printf("# tpserve bench comm --decode %d: backend %s, %d ranks, activations %s; bytes read (%s) before "
               "the attention all_sum %zu, the FFN all_sum %zu, the gather %zu\n%14s %10s %8s %7s %12s%s\n",
               o->decode_embd, tp_comm_backend_name(tp_comm_backend(R->c)), n, tp_wire_dtype_name(o->wire_dtype),
               o->gap_kernel ? tp_wtype_name(o->gap_type) : "plain read", o->gap_part[0], o->gap_part[1],
               o->gap_part[2], "collective", "op", "bytes", "iters", "lat_us(med)",
               o->sync ? "  sync_lat_us(med)  sync_lat_us(mean)  wait_us(mean)" : "");
    const int steps = o->iters ? o->iters : 300, wu = o->warmup >= 0 ? o->warmup : TP_MAX(2, steps / 10);
    int calls = 0; /* per step */
    for (int i = 0; i < dc.n; i++) calls += dc.c[i].times;
    /* t0, t1 of call k of step s of collective i: ts[i] + (2 x its calls per step x steps) */
    uint64_t *ts = malloc(sizeof(uint64_t) * 2 * (size_t)calls * (size_t)steps);
    if (!ts) return tp_cli_fail("bench comm", "out of memory for %d x %d call times", calls, steps);
    int exit_code = 0;
    enum tp_status st = tp_comm_barrier(R->c);
    for (int s = -wu; s < steps && st == TP_OK; s++) {
        size_t base = 0, at = 0; /* at: where in the gap buffer this step reads next */
        for (int i = 0; i < dc.n && st == TP_OK; i++) {
            const struct tp_parallel_coll_cost *c = &dc.c[i];
            const size_t per = (size_t)c->times * (size_t)steps;
            for (int k = 0; k < c->times && st == TP_OK; k++) {
                const size_t gb = bc_gap_before(o, c, k);
                gap_read(&R->gap, at, gb);
                at += gb;
                const uint64_t t0 = tp_now_ns();
                st = run_op(R->c, bench_op_of(c->op), R->a, R->b, c->count, c->dt);
                const uint64_t t1 = tp_now_ns();
                if (s >= 0) {
                    const size_t j = (size_t)s * (size_t)c->times + (size_t)k;
                    ts[2 * base + j] = t0;
                    ts[2 * base + per + j] = t1;
                }
            }
            base += per;
        }
    }
    size_t base = 0;
    for (int i = 0; i < dc.n && st == TP_OK; i++) {
        const struct tp_parallel_coll_cost *c = &dc.c[i];
        const int m = c->times * steps;
        const uint64_t *t0 = ts + 2 * base, *t1 = t0 + m;
        for (int j = 0; j < m; j++) R->times[j] = (double)(t1[j] - t0[j]) * 1e-9;
        double t = 0, sync[3] = {0, 0, 0};
        st = median_max(R->c, R->times, m, &t);
        if (st == TP_OK && o->sync) st = median_synced(R->c, t0, t1, m, sync);
        if (st == TP_OK && me == 0) bc_decode_row(R, o, c, bench_op_of(c->op), m, t, sync);
        base += (size_t)m;
    }
    if (st != TP_OK)
        exit_code = tp_cli_fail("bench comm", "rank %d: --decode failed: %s", me, tp_comm_last_error(R->c));
    free(ts);
    return exit_code;
}

/* ------------------------------------------------------------------ command */

int tp_bench_comm(int argc, char **argv)
{
    struct bc_opts o;
    int rc = bc_parse(argc, argv, &o);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    tp_cli_setup_logging(NULL);
    struct bc_run R = {0};
    struct tp_error err = {0};
    if (bc_groups(&R, &o, &err) != TP_OK || bc_buffers(&R, &o, &err) != TP_OK) {
        bc_run_free(&R);
        return tp_cli_fail("bench comm", "%s", err.msg);
    }
    if (o.decode_embd) {
        int exit_code = bc_decode(&R, &o);
        bc_run_free(&R);
        return exit_code;
    }
    const int me = tp_comm_rank(R.c), n = tp_comm_size(R.c);
    const size_t es = tp_dtype_size(o.dt);
    const size_t blocks = o.op == OP_ALL_GATHER || o.op == OP_SUM_SCATTER || o.op == OP_GATHER ? (size_t)n : 1;
    if (me == 0 && !o.json) bc_report_header(&R, &o);
    int exit_code = 0;
    for (size_t bytes = o.min_b; bytes <= o.max_b; bytes *= 2) {
        const size_t count = TP_MAX(bytes / es / blocks, 1), real_bytes = count * es * blocks;
        const int it = o.iters ? o.iters : (int)TP_MAX(5.0, TP_MIN(1000.0, 4e8 / (double)real_bytes));
        const int wu = o.warmup >= 0 ? o.warmup : TP_MAX(2, it / 10);
        double t = 0, tm = 0, ts[3] = {0, 0, 0};
        int which = 0;
        if (measure(R.c, R.mpi, o.op, R.a, R.b, count, o.dt, it, wu, R.times, R.times + 500000, &t, &tm,
                    o.sync ? ts : NULL, &which) != TP_OK) {
            exit_code = tp_cli_fail("bench comm", "rank %d: %s%s of %zu bytes failed: %s", me, which ? "MPI " : "",
                                    op_names[o.op], real_bytes, tp_comm_last_error(which ? R.mpi : R.c));
            break;
        }
        if (me == 0) bc_report_row(&R, &o, real_bytes, it, t, tm, ts);
        if (bytes > o.max_b / 2) break;
    }
    bc_run_free(&R);
    return exit_code;
}

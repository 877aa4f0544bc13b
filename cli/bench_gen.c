/*
 * cli/bench_gen.c - `tpserve bench gen`: end-to-end generation speed of one
 * model on this machine (or a `launch` / mpirun group), in llama-bench's
 * terms: pp = p / prefill time, tg = n / decode time (greedy, EOS ignored),
 * median over --reps after one warm-up pass; plus the memory bandwidth
 * probed by every rank between the decode reps, the fraction of it the
 * decode reaches, per-rank bytes read per token, and compute /
 * communication time per token.  Every forward call goes through
 * gen_forward().  Method and definitions: docs/bench-gen.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "common/common.h"
#include "model/gguf.h"
#include "model/tensor_source.h"
#include "model/kernels.h"
#include "model/model.h"
#include "parallel/parallel.h"

/* ------------------------------------------------------------------ the step */

struct gen_ctx {
    tp_model_t *m;
    tp_parallel_t *par;       /* every call goes through the distributed engine (world 1: local) */
    int reset;                /* clear sequence 0 with the next step */
    int n_vocab;
    int32_t *tok, *pos, *seq; /* (p) batch arrays */
    int8_t *want;             /* (p) logits flags */
    float *logits;            /* (n_vocab) */
};

/*
 * One forward call of n tokens starting at position pos0 of sequence 0;
 * logits of the last token into g->logits.  The single place a distributed
 * bench would replace.
 */
static enum tp_status gen_forward(struct gen_ctx *g, const int32_t *tokens, int n, int pos0)
{
    for (int i = 0; i < n; i++) {
        g->tok[i] = tokens[i];
        g->pos[i] = pos0 + i;
        g->seq[i] = 0;
        g->want[i] = i == n - 1;
    }
    struct tp_batch b = {.n_tokens = n, .token = g->tok, .pos = g->pos, .seq = g->seq, .logits = g->want};
    static const int32_t clear_seq[1] = {0}, clear_from[1] = {0};
    struct tp_step st = {b, g->reset, clear_seq, clear_from, 0, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL};
    g->reset = 0;
    return tp_parallel_step(g->par, &st, g->logits);
}

/* One decode step of token *t at position pos; *t becomes the argmax of its
 * logits, computed by the engine's distributed argmax (each rank sends only
 * its vocabulary range's best (value, id) instead of its logits rows). */
static enum tp_status gen_decode(struct gen_ctx *g, int32_t *t, int pos)
{
    g->tok[0] = *t;
    g->pos[0] = pos;
    g->seq[0] = 0;
    g->want[0] = 1;
    struct tp_batch b = {.n_tokens = 1, .token = g->tok, .pos = g->pos, .seq = g->seq, .logits = g->want};
    static const int32_t clear_seq[1] = {0}, clear_from[1] = {0};
    struct tp_step st = {b, g->reset, clear_seq, clear_from, 0, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL};
    g->reset = 0;
    return tp_parallel_step_greedy(g->par, &st, t, NULL);
}

/* Empty sequence 0's KV cache on every rank (sent with the next step). */
static void gen_reset(struct gen_ctx *g) { g->reset = 1; }

/*
 * --seqs: `steps` decode steps of k sequences at once (slots 0..k-1, one
 * token each per step, as continuous batching runs them), each sequence fed
 * its own argmax, from empty caches or (--seqs-ctx) after each sequence was
 * prefilled with ctx tokens of prompt[n_prompt] (untimed, n_batch tokens per
 * call), so the steps attend over ctx.. positions as a server's do.  ids[k]
 * hold the first tokens and get the last.  *sec = elapsed time of the steps.
 */
static enum tp_status gen_multi(struct gen_ctx *g, int k, int steps, int ctx, const int32_t *prompt, int n_prompt,
                                int n_batch, int32_t *ids, int32_t *clear, double *sec)
{
    for (int i = 0; i < k; i++) clear[i] = i;
    static const int32_t zeros[64] = {0};
    int n_clear = k; /* with the first step */
    for (int i = 0; i < k && ctx > 0; i++) {
        for (int p0 = 0; p0 < ctx; p0 += n_batch) {
            const int n = TP_MIN(n_batch, ctx - p0);
            for (int j = 0; j < n; j++) {
                g->tok[j] = prompt[(p0 + j) % n_prompt];
                g->pos[j] = p0 + j;
                g->seq[j] = i;
                g->want[j] = j == n - 1;
            }
            struct tp_batch b = {.n_tokens = n, .token = g->tok, .pos = g->pos, .seq = g->seq, .logits = g->want};
            struct tp_step st = {b, n_clear, clear, zeros, 0, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL};
            int32_t last;
            enum tp_status rc = tp_parallel_step_greedy(g->par, &st, &last, NULL);
            if (rc != TP_OK) return rc;
            n_clear = 0;
        }
    }
    double t0 = tp_now_s();
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < k; i++) {
            g->tok[i] = ids[i];
            g->pos[i] = ctx + s;
            g->seq[i] = i;
            g->want[i] = 1;
        }
        struct tp_batch b = {.n_tokens = k, .token = g->tok, .pos = g->pos, .seq = g->seq, .logits = g->want};
        struct tp_step st = {b, n_clear, clear, zeros, 0, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL};
        n_clear = 0;
        enum tp_status rc = tp_parallel_step_greedy(g->par, &st, ids, NULL);
        if (rc != TP_OK) return rc;
    }
    *sec = tp_now_s() - t0;
    return TP_OK;
}

/*
 * Prefill n tokens of prompt[] into sequence 0 from position 0 (cleared
 * first), chunk tokens per forward call, then (steps > 0) decode `steps`
 * tokens greedily from position n; *pp_sec / *tg_sec: elapsed time of each
 * part (NULL: not wanted).  --prompt-sizes and --depth.
 */
static enum tp_status gen_prefill_decode(struct gen_ctx *g, const int32_t *prompt, int n, int chunk, int steps,
                                         double *pp_sec, double *tg_sec)
{
    gen_reset(g);
    double t0 = tp_now_s();
    for (int p0 = 0; p0 < n; p0 += chunk) {
        enum tp_status rc = gen_forward(g, prompt + p0, TP_MIN(chunk, n - p0), p0);
        if (rc != TP_OK) return rc;
    }
    if (pp_sec) *pp_sec = tp_now_s() - t0;
    int32_t t = prompt[n > 0 ? n - 1 : 0];
    t0 = tp_now_s();
    for (int i = 0; i < steps; i++) {
        enum tp_status rc = gen_decode(g, &t, n + i);
        if (rc != TP_OK) return rc;
    }
    if (tg_sec) *tg_sec = tp_now_s() - t0;
    return TP_OK;
}

/* Parse "a,b,c" into out[<= max] within [lo, hi]; the count, or -1 after printing what is wrong. */
static int parse_int_list(const char *opt, const char *s, int *out, int max, int lo, int hi)
{
    char buf[256];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end = NULL;
        long v = strtol(tok, &end, 10);
        if (end == tok || *end || v < lo || v > hi || n == max) {
            fprintf(stderr, "tpserve bench gen: --%s '%s': want up to %d values in %d..%d\n", opt, tok, max, lo, hi);
            return -1;
        }
        out[n++] = (int)v;
    }
    return n;
}

/* s (NULL: "") as a JSON string literal. */
static void print_json_str(const char *s)
{
    cJSON *str = cJSON_CreateString(s ? s : "");
    char *lit = str ? cJSON_PrintUnformatted(str) : NULL;
    fputs(lit ? lit : "\"\"", stdout);
    cJSON_free(lit);
    cJSON_Delete(str);
}

/* Bytes of weights this rank reads per decoded token (see the file comment). */
static uint64_t bytes_per_token(tp_parallel_t *par)
{
    tp_model_t *m = tp_parallel_model(par);
    const char *path = tp_parallel_model_path(par);
    const struct tp_hparams *hp = tp_model_hparams(m);
    const struct tp_model_shard *sh = &tp_parallel_get_plan(par)->ranks[tp_parallel_rank(par)].shard;
    uint64_t held = tp_model_weight_bytes(m);
    tp_gguf_t *g = NULL;
    tp_st_t *st = NULL;
    struct tp_error err = {0};
    struct tp_tsrc src = {.kind = TP_TSRC_GGUF};
    if (tp_hf_is_dir(path)) { /* Hugging Face directory: the same tensor under its HF name */
        if (tp_st_open(path, &st, &err) != TP_OK) return held;
        src.kind = TP_TSRC_HF;
        src.st = st;
    } else {
        if (tp_gguf_open(path, &g, &err) != TP_OK) return held;
        src.gguf = g;
    }
    struct tp_tsrc_tensor te;
    uint64_t b = held;
    if (tp_tsrc_find(&src, "token_embd.weight", &te) && te.n_bytes < held && hp->n_vocab > 0) {
        const uint64_t row = te.n_bytes / (uint64_t)hp->n_vocab;
        const uint64_t head_rows = hp->tied_embeddings ? (uint64_t)(sh->vocab_end - sh->vocab_begin) : 0;
        b = held - te.n_bytes + row * (1 + head_rows);
    }
    tp_gguf_close(g);
    tp_st_close(st);
    return b;
}

/* What every rank's bandwidth probe needs (tp_parallel_run_hook). */
#define GEN_HOOK_PROBE 1
struct gen_probe {
    tp_pool_t *pool;
    uint64_t *buf;            /* (bytes) written once */
    size_t bytes;
    int passes;
    uint64_t bytes_read;      /* per decoded token by this rank */
    tp_model_t *m;            /* mixture of experts: its expert stats make bytes_read the active bytes */
};

/* Mixture of experts: a decoded token reads this rank's weights except its experts, plus the
 * experts the token selected; the mean over the single-token forward calls so far (measured). */
static uint64_t active_bytes(const struct gen_probe *pr)
{
    const uint64_t held = pr->m ? tp_model_expert_weight_bytes(pr->m) : 0;
    struct tp_model_stats st;
    if (!held) return pr->bytes_read;
    tp_model_get_stats(pr->m, &st);
    if (st.n_decode == 0 || pr->bytes_read < held) return pr->bytes_read;
    return pr->bytes_read - held + st.expert_bytes_decode / st.n_decode;
}

/* GEN_HOOK_PROBE: out[0] = this rank's streaming-read GB/s, out[1] = the
 * bytes it reads per decoded token. */
static enum tp_status gen_hook(void *ud, int32_t arg, double out[TP_PARALLEL_HOOK_VALUES])
{
    struct gen_probe *pr = ud;
    if (arg != GEN_HOOK_PROBE || !pr->pool || !pr->buf) return TP_ERR_INVALID_ARG;
    out[0] = tp_mem_read_bw_buf(pr->pool, pr->buf, pr->bytes, pr->passes);
    out[1] = (double)active_bytes(pr);
    return TP_OK;
}

/* All ranks probe at once; probe[r] / bytes[r] for r < world.  Rank 0 only. */
static int gen_probe_all(tp_parallel_t *par, int world, double *probe, double *bytes)
{
    double v[TP_PLAN_MAX_RANKS * TP_PARALLEL_HOOK_VALUES];
    if (tp_parallel_run_hook(par, GEN_HOOK_PROBE, v, world) != TP_OK) return -1;
    for (int r = 0; r < world; r++) {
        if (!(v[r * TP_PARALLEL_HOOK_VALUES] > 0)) return -1;
        probe[r] = v[r * TP_PARALLEL_HOOK_VALUES];
        bytes[r] = v[r * TP_PARALLEL_HOOK_VALUES + 1];
    }
    return 0;
}

/* The arrays of one run, owned together: gen_bufs_alloc allocates them all
 * (zeroed) or none, gen_bufs_free releases them all (NULL members are fine). */
struct gen_bufs {
    int32_t *tok, *pos, *seq; /* (nb) batch arrays, lent to gen_ctx */
    int8_t *want;             /* (nb) logits flags, lent to gen_ctx */
    float *logits;            /* (n_vocab), lent to gen_ctx */
    int32_t *prompt;          /* (nb) */
    double *pp_s, *tg_s;      /* (reps) seconds per rep */
    double *probe, *tmp;      /* (reps + 1, world) */
    double *frac_r;           /* (reps) */
    double *rank_bytes;       /* (world) */
    double *rank_frac;        /* (reps, world) */
    double *probe_sum;        /* (reps + 1): summed over ranks */
};

static void gen_bufs_free(struct gen_bufs *b)
{
    free(b->tok);
    free(b->pos);
    free(b->seq);
    free(b->want);
    free(b->logits);
    free(b->prompt);
    free(b->pp_s);
    free(b->tg_s);
    free(b->probe);
    free(b->tmp);
    free(b->frac_r);
    free(b->rank_bytes);
    free(b->rank_frac);
    free(b->probe_sum);
    memset(b, 0, sizeof *b);
}

static enum tp_status gen_bufs_alloc(struct gen_bufs *b, int nb, int n_vocab, int reps, int world)
{
    const size_t snb = (size_t)nb, sr = (size_t)reps, sw = (size_t)world;
    memset(b, 0, sizeof *b);
    b->tok = calloc(snb, sizeof(int32_t));
    b->pos = calloc(snb, sizeof(int32_t));
    b->seq = calloc(snb, sizeof(int32_t));
    b->want = calloc(snb, 1);
    b->logits = calloc((size_t)n_vocab, sizeof(float));
    b->prompt = calloc(snb, sizeof(int32_t));
    b->pp_s = calloc(sr, sizeof(double));
    b->tg_s = calloc(sr, sizeof(double));
    b->probe = calloc((sr + 1) * sw, sizeof(double));
    b->tmp = calloc((sr + 1) * sw, sizeof(double));
    b->frac_r = calloc(sr, sizeof(double));
    b->rank_bytes = calloc(sw, sizeof(double));
    b->rank_frac = calloc(sr * sw, sizeof(double));
    b->probe_sum = calloc(sr + 1, sizeof(double));
    if (b->tok && b->pos && b->seq && b->want && b->logits && b->prompt && b->pp_s && b->tg_s && b->probe &&
        b->tmp && b->frac_r && b->rank_bytes && b->rank_frac && b->probe_sum)
        return TP_OK;
    gen_bufs_free(b);
    return TP_ERR_NOMEM;
}

int tp_bench_gen(int argc, char **argv)
{
    const char *path = NULL;
    int p = 128, n = 64, threads = 0, reps = 3, json = 0, bw_mib = 1024, bw_passes = 4;
    const char *shard_weights = NULL, *moe_split = "auto", *comm_dtype = "f32", *kv_type = "f16", *seqs = NULL;
    int seqs_ctx = 0, chunk = 512;
    const char *psizes = NULL, *depths = NULL;
    const struct tp_opt opts[] = {
        {"model", 'm', TP_OPT_STRING, &path, "FILE", "model (GGUF)", 0, 0},
        {"prompt-tokens", 'p', TP_OPT_INT, &p, "P", "prefill length (default 128; 0 skips prefill)", 0, 65536},
        {"gen-tokens", 'n', TP_OPT_INT, &n, "N", "decoded tokens (default 64; 0 skips decode)", 0, 65536},
        {"threads", 't', TP_OPT_INT, &threads, "T", "compute threads (default: all cores)", 1, 1024},
        {"reps", 'r', TP_OPT_INT, &reps, "R", "repetitions, median reported (default 3)", 1, 100},
        {"bw-mib", 0, TP_OPT_INT, &bw_mib, "MIB", "buffer of each bandwidth probe, on every rank (default 1024)", 64, 1 << 20},
        {"bw-passes", 0, TP_OPT_INT, &bw_passes, "K", "reads of the buffer per probe, mean reported (default 4)", 1, 100},
        {"seqs", 0, TP_OPT_LIST, &seqs, "K,K,..", "also time decode steps of K sequences at once (1..64, one token each)", 0, 0},
        {"seqs-ctx", 0, TP_OPT_INT, &seqs_ctx, "C",
         "--seqs steps start after C cached tokens per sequence (prefilled untimed; default 0: empty caches)", 0, 65536},
        {"prompt-sizes", 0, TP_OPT_LIST, &psizes, "P,P,..",
         "also time prefill of P tokens each (e.g. 128,2048,8192; --batch tokens per call)", 0, 0},
        {"depth", 0, TP_OPT_LIST, &depths, "D,D,..",
         "also time -n decode steps after D cached tokens each (prefilled untimed; e.g. 0,2048,8192)", 0, 0},
        {"batch", 0, TP_OPT_INT, &chunk, "B", "prefill tokens per forward call for --prompt-sizes / --depth (default 512)",
         1, 65536},
        {"json", 0, TP_OPT_FLAG, &json, NULL, "print one JSON object", 0, 0},
        {"shard-weights", 0, TP_OPT_LIST, &shard_weights, "W,W,..", "under launch/mpirun: share per rank", 0, 0},
        {"moe-split", 0, TP_OPT_STRING, &moe_split, "S", TP_CLI_MOE_SPLIT_HELP, 0, 0},
        {"comm-dtype", 0, TP_OPT_STRING, &comm_dtype, "T", "under launch/mpirun: f32|f16|bf16|q8 on the wire", 0, 0},
        {"kv-type", 0, TP_OPT_STRING, &kv_type, "T", TP_CLI_KV_TYPE_HELP, 0, 0},
        {0},
    };
    const char *usage = "Usage: tpserve bench gen -m MODEL [-p 128] [-n 64] [--threads T] [--reps R] [--json]\n"
                        "Prefill and decode tokens/s (median of reps) and the fraction of this machine's "
                        "streaming-read bandwidth the decode reaches.\n"
                        "Bandwidth: a probe before each decode rep and after the last, on every rank at once "
                        "(--threads threads\nread a --bw-mib buffer --bw-passes times, bytes / elapsed); each "
                        "rep's fraction = the weight GB/s\nthe ranks read / the mean of their probes around it; "
                        "bw_fraction = median of those, mem_bw_gbs =\nmedian probe (summed over ranks); per rank "
                        "the same against its own probes.";
    int np = 0;
    int rc = tp_cli_parse("bench gen", usage, opts, argc, argv, NULL, 0, &np, NULL, NULL);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    if (!path) {
        fprintf(stderr, "tpserve bench gen: -m MODEL is required\n");
        return 2;
    }
    int klist[16], nk = 0, kmax = 1;
    if (seqs) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", seqs);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            char *end = NULL;
            long v = strtol(tok, &end, 10);
            if (end == tok || *end || v < 1 || v > 64 || nk == 16) {
                fprintf(stderr, "tpserve bench gen: --seqs '%s': want up to 16 sequence counts in 1..64\n", tok);
                return 2;
            }
            klist[nk++] = (int)v;
            kmax = TP_MAX(kmax, (int)v);
        }
        if (n == 0) {
            fprintf(stderr, "tpserve bench gen: --seqs needs decode steps (-n > 0)\n");
            return 2;
        }
    }
    int plist[16], np_sizes = 0, dlist[16], nd = 0, big = 0;
    if (psizes && (np_sizes = parse_int_list("prompt-sizes", psizes, plist, 16, 1, 1 << 20)) < 0) return 2;
    if (depths && (nd = parse_int_list("depth", depths, dlist, 16, 0, 1 << 20)) < 0) return 2;
    if (nd > 0 && n == 0) {
        fprintf(stderr, "tpserve bench gen: --depth needs decode steps (-n > 0)\n");
        return 2;
    }
    for (int i = 0; i < np_sizes; i++) big = TP_MAX(big, plist[i]);
    for (int i = 0; i < nd; i++) big = TP_MAX(big, dlist[i] + n);
    if (big == 0) chunk = 0; /* no --prompt-sizes / --depth: no chunked calls */
    if (p == 0 && n == 0) {
        fprintf(stderr, "tpserve bench gen: nothing to measure (-p 0 and -n 0)\n");
        return 2;
    }
    /* one rank, or a group from the environment (tpserve launch / mpirun): rank 0 measures and prints */
    struct tp_parallel_config pcfg = tp_parallel_default_config();
    int rank_hint = 0;
    const char *prefix = NULL;
    if (tp_cli_group_config("bench gen", comm_dtype, kv_type, &pcfg, &rank_hint, &prefix)) return 2;
    tp_cli_setup_logging(prefix);
    if (tp_log_get_level() < TP_LOG_WARN) tp_log_set_level(TP_LOG_WARN);
    if (threads <= 0) threads = tp_cpu_count();
    pcfg.shard_weights = shard_weights;
    {
        struct tp_error merr = {0};
        if (tp_moe_split_parse(moe_split, &pcfg.moe_split, &merr) != TP_OK)
            return tp_cli_fail("bench gen", "%s", merr.msg);
    }

    int exit_code = 1;
    tp_pool_t *pool = NULL;
    tp_model_t *m = NULL;
    struct gen_ctx g;
    memset(&g, 0, sizeof(g));
    double *pp_s = NULL, *tg_s = NULL, *probe = NULL, *frac_r = NULL, *tmp = NULL, *rank_bytes = NULL;
    double *rank_frac = NULL, *probe_sum = NULL;
    struct gen_bufs bufs = {0}; /* owns the arrays the pointers above and g's point into */
    uint64_t *bwbuf = NULL;
    size_t bw_bytes = (size_t)bw_mib << 20;
    int32_t *prompt = NULL;
    (void)rank_hint;

    /* every rank: the probe buffer and a pool of --threads to read it, kept for the whole run */
    if (n > 0) {
        struct tp_pool_config pc = tp_pool_default_config();
        pc.n_threads = threads;
        if (tp_pool_init(&pc, &pool) != TP_OK) return tp_cli_fail("bench gen", "cannot start %d threads", threads);
        bwbuf = tp_aligned_alloc(64, bw_bytes);
        if (!bwbuf) {
            tp_pool_free(pool);
            return tp_cli_fail("bench gen", "cannot allocate %d MiB for the bandwidth probes (lower --bw-mib)", bw_mib);
        }
        memset(bwbuf, 0x5a, bw_bytes);
    }

    struct tp_model_config *mc = &pcfg.model;
    mc->path = path;
    mc->n_threads = threads;
    mc->n_seq = kmax;
    mc->n_batch = TP_MAX(TP_MAX(TP_MAX(p, 1), kmax), chunk);
    mc->n_ctx = TP_MAX(TP_MAX(p, n + seqs_ctx), big) + 8;
    struct tp_error err = {0};
    double t_load = tp_now_s();
    if (tp_parallel_init(&pcfg, &g.par, &err) != TP_OK) {
        tp_pool_free(pool);
        tp_aligned_free(bwbuf);
        return tp_cli_fail("bench gen", "%s", err.msg);
    }
    t_load = tp_now_s() - t_load;
    m = tp_parallel_model(g.par);
    const int world = tp_parallel_size(g.par);
    struct gen_probe gp = {pool, bwbuf, bw_bytes, bw_passes, bytes_per_token(g.par), m};
    tp_parallel_set_hook(g.par, gen_hook, &gp);
    if (tp_parallel_rank(g.par) != 0) {
        int code = 0;
        if (tp_parallel_worker_loop(g.par) != TP_OK)
            code = tp_cli_fail("bench gen", "worker stopped: %s", tp_parallel_last_error(g.par));
        tp_parallel_free(g.par);
        tp_pool_free(pool);
        tp_aligned_free(bwbuf);
        return code;
    }
    g.m = m;
    g.n_vocab = tp_model_hparams(m)->n_vocab;
    const int nb = TP_MAX(TP_MAX(TP_MAX(p, 1), kmax), chunk);
    if (gen_bufs_alloc(&bufs, TP_MAX(nb, big), g.n_vocab, reps, world) != TP_OK) {
        tp_cli_fail("bench gen", "out of memory");
        goto out;
    }
    g.tok = bufs.tok, g.pos = bufs.pos, g.seq = bufs.seq, g.want = bufs.want, g.logits = bufs.logits;
    prompt = bufs.prompt, pp_s = bufs.pp_s, tg_s = bufs.tg_s, probe = bufs.probe, frac_r = bufs.frac_r;
    tmp = bufs.tmp, rank_bytes = bufs.rank_bytes, rank_frac = bufs.rank_frac, probe_sum = bufs.probe_sum;
    /* a fixed pseudo-random prompt over the whole vocabulary */
    uint64_t x = 0x243F6A8885A308D3ull;
    for (int i = 0; i < TP_MAX(nb, big); i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((x >> 33) % (uint64_t)g.n_vocab);
    }

    /* warm-up: pages the weights in, settles the pool */
    gen_reset(&g);
    if (gen_forward(&g, prompt, TP_MIN(nb, 16), 0) != TP_OK || gen_forward(&g, prompt, 1, TP_MIN(nb, 16)) != TP_OK) {
        tp_cli_fail("bench gen", "forward failed: %s", tp_parallel_last_error(g.par));
        goto out;
    }
    struct tp_model_stats st0, st1;
    struct tp_parallel_stats ps0, ps1;
    uint64_t tg_ns_fwd = 0, tg_ns_comm = 0, tg_ns_compute = 0, tg_ns_pcomm = 0, tg_bytes = 0, tg_count = 0;
    for (int r = 0; r < reps; r++) {
        if (p > 0) {
            gen_reset(&g);
            double t0 = tp_now_s();
            if (gen_forward(&g, prompt, p, 0) != TP_OK) {
                tp_cli_fail("bench gen", "prefill failed: %s", tp_parallel_last_error(g.par));
                goto out;
            }
            pp_s[r] = tp_now_s() - t0;
        }
        if (n > 0) {
            if (gen_probe_all(g.par, world, probe + (size_t)r * world, rank_bytes) != 0) {
                tp_cli_fail("bench gen", "bandwidth probe failed on some rank: %s", tp_parallel_last_error(g.par));
                goto out;
            }
            gen_reset(&g);
            int32_t t = prompt[0];
            tp_model_get_stats(m, &st0);
            tp_parallel_get_stats(g.par, &ps0);
            double t0 = tp_now_s();
            for (int i = 0; i < n; i++) {
                if (gen_decode(&g, &t, i) != TP_OK) {
                    tp_cli_fail("bench gen", "decode failed: %s", tp_parallel_last_error(g.par));
                    goto out;
                }
            }
            tg_s[r] = tp_now_s() - t0;
            tp_model_get_stats(m, &st1);
            tp_parallel_get_stats(g.par, &ps1);
            tg_ns_fwd += st1.ns_forward - st0.ns_forward;
            tg_ns_comm += st1.ns_all_sum - st0.ns_all_sum;
            tg_ns_compute += ps1.ns_compute - ps0.ns_compute;
            tg_ns_pcomm += ps1.ns_comm - ps0.ns_comm;
            tg_bytes += ps1.bytes_sent - ps0.bytes_sent;
            tg_count += (uint64_t)n;
        }
    }
    if (n > 0 && gen_probe_all(g.par, world, probe + (size_t)reps * world, rank_bytes) != 0) {
        tp_cli_fail("bench gen", "bandwidth probe failed on some rank: %s", tp_parallel_last_error(g.par));
        goto out;
    }
    /* --seqs: reps x (each k in turn), median step time per k */
    double k_ms[16] = {0};
    if (nk > 0) {
        double *ks = calloc((size_t)reps * 16, sizeof(double));
        int32_t ids[64], clear[64];
        if (!ks) {
            tp_cli_fail("bench gen", "out of memory");
            goto out;
        }
        for (int r = 0; r < reps; r++) {
            for (int ki = 0; ki < nk; ki++) {
                for (int i = 0; i < klist[ki]; i++) ids[i] = prompt[i % nb];
                double sec = 0.0;
                if (gen_multi(&g, klist[ki], n, seqs_ctx, prompt, nb, nb, ids, clear, &sec) != TP_OK) {
                    tp_cli_fail("bench gen", "batched decode failed: %s", tp_parallel_last_error(g.par));
                    free(ks);
                    goto out;
                }
                ks[ki * reps + r] = sec * 1e3 / n;
            }
        }
        for (int ki = 0; ki < nk; ki++) k_ms[ki] = tp_median(ks + ki * reps, reps);
        free(ks);
    }
    /* --prompt-sizes, --depth: reps x each size in turn, medians */
    double p_tps[16] = {0}, d_ms[16] = {0};
    if (np_sizes > 0 || nd > 0) {
        double *ts = calloc((size_t)reps * 32, sizeof(double));
        if (!ts) {
            tp_cli_fail("bench gen", "out of memory");
            goto out;
        }
        for (int r = 0; r < reps; r++) {
            for (int i = 0; i < np_sizes; i++)
                if (gen_prefill_decode(&g, prompt, plist[i], chunk, 0, &ts[i * reps + r], NULL) != TP_OK) {
                    tp_cli_fail("bench gen", "prefill failed: %s", tp_parallel_last_error(g.par));
                    free(ts);
                    goto out;
                }
            for (int i = 0; i < nd; i++)
                if (gen_prefill_decode(&g, prompt, dlist[i], chunk, n, NULL, &ts[(16 + i) * reps + r]) != TP_OK) {
                    tp_cli_fail("bench gen", "decode at depth %d failed: %s", dlist[i], tp_parallel_last_error(g.par));
                    free(ts);
                    goto out;
                }
        }
        for (int i = 0; i < np_sizes; i++) p_tps[i] = plist[i] / tp_median(ts + i * reps, reps);
        for (int i = 0; i < nd; i++) d_ms[i] = tp_median(ts + (16 + i) * reps, reps) * 1e3 / n;
        free(ts);
    }
    /* KV bytes all ranks read per decode step at depth D (mean over the -n steps from D) */
    double d_kv[16] = {0};
    {
        const struct tp_shard_plan *plan = tp_parallel_get_plan(g.par);
        uint64_t heads = 0;
        for (int q = 0; q < world; q++) heads += (uint64_t)(plan->ranks[q].shard.kv_head_end - plan->ranks[q].shard.kv_head_begin);
        for (int i = 0; i < nd; i++) {
            double sum = 0.0;
            for (int s = 0; s < n; s++) sum += (double)tp_model_kv_head_bytes_read(m, dlist[i] + s);
            d_kv[i] = sum / n * (double)heads;
        }
    }
    double k1_ms = 0.0;
    for (int ki = 0; ki < nk; ki++)
        if (klist[ki] == 1) k1_ms = k_ms[ki];
    /* the group's bytes per token: every rank's (rank 0's own when nothing was decoded) */
    uint64_t bpt = 0;
    for (int q = 0; q < world; q++) bpt += n > 0 ? (uint64_t)rank_bytes[q] : 0;
    if (n == 0) bpt = active_bytes(&gp);
    /* mixture of experts: what every rank holds, for comparison with the active bytes above */
    const int moe = tp_model_expert_weight_bytes(m) > 0;
    double bw = 0.0, frac = 0.0, frac_min = 0.0, frac_max = 0.0;
    if (n > 0) {
        for (int k = 0; k <= reps; k++) {
            probe_sum[k] = 0.0;
            for (int q = 0; q < world; q++) probe_sum[k] += probe[(size_t)k * world + q];
        }
        for (int r = 0; r < reps; r++) {
            double around = 0.5 * (probe_sum[r] + probe_sum[r + 1]);
            frac_r[r] = around > 0.0 ? (double)n / tg_s[r] * (double)bpt / (around * 1e9) : 0.0;
            for (int q = 0; q < world; q++) {
                double a = 0.5 * (probe[(size_t)r * world + q] + probe[(size_t)(r + 1) * world + q]);
                rank_frac[(size_t)r * world + q] = a > 0.0 ? (double)n / tg_s[r] * rank_bytes[q] / (a * 1e9) : 0.0;
            }
        }
        memcpy(tmp, probe_sum, ((size_t)reps + 1) * sizeof(double));
        bw = tp_median(tmp, reps + 1);
        memcpy(tmp, frac_r, (size_t)reps * sizeof(double));
        frac = tp_median(tmp, reps);
        frac_min = tmp[0];
        frac_max = tmp[reps - 1];
    }
    /* per rank: median of its probes and of its per-rep fractions */
    double rank_bw[TP_PLAN_MAX_RANKS] = {0}, rank_fr[TP_PLAN_MAX_RANKS] = {0}, scratch[101];
    for (int q = 0; q < world && n > 0 && q < TP_PLAN_MAX_RANKS; q++) {
        for (int k = 0; k <= reps; k++) scratch[k] = probe[(size_t)k * world + q];
        rank_bw[q] = tp_median(scratch, reps + 1);
        for (int r = 0; r < reps; r++) scratch[r] = rank_frac[(size_t)r * world + q];
        rank_fr[q] = tp_median(scratch, reps);
    }
    /* pp_s / tg_s are sorted by tp_median(): per-rep lists are printed before */
    double *tg_rep = tmp; /* reuse: decode t/s per rep, in rep order */
    for (int r = 0; r < reps && n > 0; r++) tg_rep[r] = (double)n / tg_s[r];
    double pp_tps = p > 0 ? (double)p / tp_median(pp_s, reps) : 0.0;
    double tg_tps = n > 0 ? (double)n / tp_median(tg_s, reps) : 0.0;
    double comm_frac = tg_ns_fwd ? (double)tg_ns_comm / (double)tg_ns_fwd : 0.0;
    /* rank 0's view per decoded token: compute, communication (all_sums, step broadcast,
     * logits gather), bytes it sent */
    double cpt_ms = tg_count ? (double)tg_ns_compute / 1e6 / (double)tg_count : 0.0;
    double mpt_ms = tg_count ? (double)tg_ns_pcomm / 1e6 / (double)tg_count : 0.0;
    double bpt_sent = tg_count ? (double)tg_bytes / (double)tg_count : 0.0;
    const char *type = tp_wtype_name(tp_model_weight_type(m));
    if (json) {
        printf("{\"bench\":\"gen\",\"model\":");
        print_json_str(tp_model_name(m));
        printf(",\"type\":\"%s\",\"ranks\":%d,\"threads\":%d,\"isa\":\"%s\","
               "\"pp_tokens\":%d,\"tg_tokens\":%d,\"reps\":%d,\"pp_tps\":%.2f,\"tg_tps\":%.2f,\"mem_bw_gbs\":%.2f,"
               "\"weight_bytes_per_token\":%llu,\"bw_fraction\":%.3f,\"tg_comm_frac\":%.3f,"
               "\"comm_dtype\":\"%s\",\"compute_ms_per_token\":%.3f,\"comm_ms_per_token\":%.3f,"
               "\"bytes_per_token\":%.0f,\"bw_method\":\"probe before each decode rep and after the last, "
               "%d MiB x %d passes, mean\",\"bw_fraction_min\":%.3f,\"bw_fraction_max\":%.3f",
               type, world, tp_model_n_threads(m), tp_kern_isa(), p, n, reps, pp_tps, tg_tps, bw,
               (unsigned long long)bpt, frac, comm_frac, tp_wire_dtype_name(pcfg.wire_dtype), cpt_ms, mpt_ms,
               bpt_sent, bw_mib, bw_passes, frac_min, frac_max);
        if (moe)
            printf(",\"moe\":true,\"rank0_held_bytes\":%llu,\"rank0_expert_bytes\":%llu",
                   (unsigned long long)tp_model_weight_bytes(m), (unsigned long long)tp_model_expert_weight_bytes(m));
        printf(",\"tg_tps_per_rep\":[");
        for (int r = 0; r < reps && n > 0; r++) printf("%s%.2f", r ? "," : "", tg_rep[r]);
        printf("],\"mem_bw_gbs_per_probe\":[");
        for (int r = 0; r <= reps && n > 0; r++) printf("%s%.2f", r ? "," : "", probe_sum[r]);
        printf("],\"bw_fraction_per_rep\":[");
        for (int r = 0; r < reps && n > 0; r++) printf("%s%.3f", r ? "," : "", frac_r[r]);
        printf("],\"bytes_read_per_token_per_rank\":[");
        for (int q = 0; q < world && n > 0; q++) printf("%s%.0f", q ? "," : "", rank_bytes[q]);
        printf("],\"mem_bw_gbs_per_rank\":[");
        for (int q = 0; q < world && n > 0; q++) printf("%s%.2f", q ? "," : "", rank_bw[q]);
        printf("],\"bw_fraction_per_rank\":[");
        for (int q = 0; q < world && n > 0; q++) printf("%s%.3f", q ? "," : "", rank_fr[q]);
        printf("]");
        if (nk > 0) {
            printf(",\"seq_steps\":[");
            for (int ki = 0; ki < nk; ki++)
                printf("%s{\"seqs\":%d,\"step_ms\":%.3f,\"agg_tps\":%.2f}", ki ? "," : "", klist[ki], k_ms[ki],
                       klist[ki] * 1e3 / k_ms[ki]);
            printf("]");
        }
        if (np_sizes > 0) {
            printf(",\"prefill_chunk\":%d,\"prefill\":[", chunk);
            for (int i = 0; i < np_sizes; i++)
                printf("%s{\"tokens\":%d,\"pp_tps\":%.2f,\"vs_first\":%.3f}", i ? "," : "", plist[i], p_tps[i],
                       p_tps[i] / p_tps[0]);
            printf("]");
        }
        if (nd > 0) {
            printf(",\"kv_type\":\"%s\",\"decode_depth\":[", tp_kv_type_name(tp_model_kv_type(m)));
            for (int i = 0; i < nd; i++) {
                const double bound = bw > 0.0 ? ((double)bpt + d_kv[i]) / (bw * 1e9) * 1e3 : 0.0;
                printf("%s{\"depth\":%d,\"ms_per_token\":%.3f,\"kv_bytes_per_token\":%.0f,\"bound_ms\":%.3f,"
                       "\"vs_bound\":%.3f}",
                       i ? "," : "", dlist[i], d_ms[i], d_kv[i], bound, bound > 0.0 ? d_ms[i] / bound : 0.0);
            }
            printf("]");
        }
        printf("}\n");
    } else {
        printf("model   %s (%s, %.1f MiB read per token%s), %d threads%s, %s kernels, loaded in %.1f s\n",
               tp_model_name(m), type, (double)bpt / 1048576.0, world > 1 ? " by all ranks" : "",
               tp_model_n_threads(m), world > 1 ? " per rank" : "", tp_kern_isa(), t_load);
        if (moe)
            printf("experts active bytes: attention, routers, output head and the experts the decoded tokens selected "
                   "(measured); rank 0 holds %.1f MiB of which %.1f MiB experts\n",
                   (double)tp_model_weight_bytes(m) / 1048576.0, (double)tp_model_expert_weight_bytes(m) / 1048576.0);
        if (n > 0) {
            printf("memory  streaming read, median of %d probes %.2f GB/s%s (one before each decode rep and after the "
                   "last; %d MiB x %d passes, %d threads, bytes / elapsed)\n",
                   reps + 1, bw, world > 1 ? " summed over the ranks probing at once" : "", bw_mib, bw_passes,
                   threads);
            printf("%-4s %10s %12s %12s %10s\n", "rep", "tg t/s", "weight GB/s", "probe GB/s", "of bw");
            for (int r = 0; r < reps; r++)
                printf("%-4d %10.2f %12.2f %12.2f %9.1f%%\n", r, tg_rep[r], tg_rep[r] * (double)bpt / 1e9,
                       0.5 * (probe_sum[r] + probe_sum[r + 1]), 100.0 * frac_r[r]);
        }
        printf("%-8s %10s %12s %10s\n", "test", "t/s", "GB/s", "of bw");
        if (p > 0) printf("pp%-6d %10.2f %12s %10s\n", p, pp_tps, "", "");
        if (n > 0) printf("tg%-6d %10.2f %12.2f %9.1f%%\n", n, tg_tps, tg_tps * (double)bpt / 1e9, 100.0 * frac);
        printf("(median of %d; decode from an empty cache, EOS ignored", reps);
        if (n > 0) printf("; of bw = median of the per-rep fractions, range %.1f-%.1f%%", 100.0 * frac_min, 100.0 * frac_max);
        printf(")\n");
        if (n > 0 && world > 1) {
            printf("per rank (each probed its own memory at the same moment as the others; median over reps):\n");
            printf("%-5s %14s %12s %12s %10s\n", "rank", "MiB/token", "weight GB/s", "probe GB/s", "of bw");
            for (int q = 0; q < world; q++)
                printf("%-5d %14.1f %12.2f %12.2f %9.1f%%\n", q, rank_bytes[q] / 1048576.0,
                       tg_tps * rank_bytes[q] / 1e9, rank_bw[q], 100.0 * rank_fr[q]);
        }
        if (n > 0)
            printf("per token (rank 0 of %d, comm dtype %s): compute %.3f ms, comm %.3f ms, %.0f bytes sent\n", world,
                   tp_wire_dtype_name(pcfg.wire_dtype), cpt_ms, mpt_ms, bpt_sent);
        if (np_sizes > 0) {
            printf("prefill by prompt length (%d tokens per call, median of %d):\n", chunk, reps);
            printf("%-8s %10s %10s\n", "tokens", "t/s", "x first");
            for (int i = 0; i < np_sizes; i++)
                printf("pp%-6d %10.2f %10.3f\n", plist[i], p_tps[i], p_tps[i] / p_tps[0]);
        }
        if (nd > 0) {
            printf("decode by depth (%d steps after D cached tokens, KV cache %s, median of %d; bound = (weight bytes + "
                   "KV bytes read) / %.2f GB/s):\n",
                   n, tp_kv_type_name(tp_model_kv_type(m)), reps, bw);
            printf("%-8s %10s %12s %10s %10s\n", "depth", "ms/token", "KV MiB/tok", "bound ms", "x bound");
            for (int i = 0; i < nd; i++) {
                const double bound = bw > 0.0 ? ((double)bpt + d_kv[i]) / (bw * 1e9) * 1e3 : 0.0;
                printf("%-8d %10.3f %12.2f %10.3f %10.3f\n", dlist[i], d_ms[i], d_kv[i] / 1048576.0, bound,
                       bound > 0.0 ? d_ms[i] / bound : 0.0);
            }
        }
        if (nk > 0) {
            if (seqs_ctx > 0)
                printf("decode steps of k sequences (one token each, %d steps after %d cached tokens each, median of %d):\n",
                       n, seqs_ctx, reps);
            else
                printf("decode steps of k sequences (one token each, %d steps from empty caches, median of %d):\n", n,
                       reps);
            printf("%-6s %10s %12s %12s\n", "seqs", "ms/step", "x 1 seq", "agg t/s");
            for (int ki = 0; ki < nk; ki++) {
                printf("%-6d %10.2f ", klist[ki], k_ms[ki]);
                if (k1_ms > 0.0) printf("%12.2f", k_ms[ki] / k1_ms);
                else printf("%12s", "-");
                printf(" %12.2f\n", klist[ki] * 1e3 / k_ms[ki]);
            }
        }
    }
    exit_code = 0;
out:
    gen_bufs_free(&bufs);
    tp_parallel_free(g.par);
    tp_pool_free(pool);
    tp_aligned_free(bwbuf);
    return exit_code;
}

/*
 * cli/bench_gen.c - `tpserve bench gen`: end-to-end generation speed of one
 * model on this machine (or a `launch` / mpirun group), in llama-bench's
 * terms: pp = p / prefill time, tg = n / decode time (greedy, EOS ignored),
 * median over --reps after one warm-up pass; plus the memory bandwidth
 * probed by every rank between the decode reps, the fraction of it the
 * decode reaches, per-rank bytes read per token, and compute /
 * communication time per token.  Every forward call goes through
 * gen_forward().  --verify K times the step that scores K + 1 positions of
 * one sequence against a one-token step; --spec ngram decodes greedily with
 * n-gram drafts beside the plain decode (docs/speculative.md).  Method and
 * definitions: docs/bench-gen.md.
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
#include "server/spec.h"

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
 * hold the first tokens and get the last.  *sec = elapsed time of the steps;
 * *during = what this rank's model counted over them (its stats after minus
 * before: expert_bytes, expert_runs and the ns_ phase times are the ones read).
 */
static enum tp_status gen_multi(struct gen_ctx *g, int k, int steps, int ctx, const int32_t *prompt, int n_prompt,
                                int n_batch, int32_t *ids, int32_t *clear, double *sec, struct tp_model_stats *during)
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
    struct tp_model_stats s0, s1;
    tp_model_get_stats(g->m, &s0);
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
    tp_model_get_stats(g->m, &s1);
    during->expert_bytes = s1.expert_bytes - s0.expert_bytes;
    during->expert_runs = s1.expert_runs - s0.expert_runs;
    during->ns_forward = s1.ns_forward - s0.ns_forward;
    during->ns_prep = s1.ns_prep - s0.ns_prep;
    during->ns_matmul = s1.ns_matmul - s0.ns_matmul;
    during->ns_attn = s1.ns_attn - s0.ns_attn;
    during->ns_logits = s1.ns_logits - s0.ns_logits;
    return TP_OK;
}

/* `steps` greedy decode steps of sequence 0 from position n (its first input prompt[n - 1], or prompt[0] when
 * n is 0); *tg_sec: their elapsed time (NULL: not wanted). */
static enum tp_status gen_decode_from(struct gen_ctx *g, const int32_t *prompt, int n, int steps, double *tg_sec)
{
    int32_t t = prompt[n > 0 ? n - 1 : 0];
    const double t0 = tp_now_s();
    for (int i = 0; i < steps; i++) {
        enum tp_status rc = gen_decode(g, &t, n + i);
        if (rc != TP_OK) return rc;
    }
    if (tg_sec) *tg_sec = tp_now_s() - t0;
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
    return steps > 0 ? gen_decode_from(g, prompt, n, steps, tg_sec) : TP_OK;
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

/* What every rank's bandwidth probe needs (tp_parallel_run_hook).  GEN_HOOK_OPS + k: the entry
 * and exit times of this rank's collectives k and k + 1 (--comm-sync). */
#define GEN_HOOK_PROBE 1
#define GEN_HOOK_OPS (1 << 24)
#define GEN_OP_LOG ((size_t)1 << 16) /* collectives time-stamped per rank with --comm-sync */
struct gen_probe {
    tp_pool_t *pool;
    uint64_t *buf;            /* (bytes) written once */
    size_t bytes;
    int passes;
    uint64_t bytes_read;      /* per decoded token by this rank */
    tp_model_t *m;            /* mixture of experts: its expert stats make bytes_read the active bytes */
    const tp_comm_t *comm;    /* the group's collectives, their op log (--comm-sync) */
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
 * bytes it reads per decoded token.  GEN_HOOK_OPS + k: out = the entry and exit times (ns) of
 * this rank's collectives k and k + 1, NaN past the op log. */
static enum tp_status gen_hook(void *ud, int32_t arg, double out[TP_PARALLEL_HOOK_VALUES])
{
    struct gen_probe *pr = ud;
    if (arg >= GEN_HOOK_OPS) { /* entry and exit of 2 collectives per call */
        const uint64_t *ts = NULL;
        const size_t n = tp_comm_op_times(pr->comm, &ts), k = (size_t)(arg - GEN_HOOK_OPS);
        for (size_t i = 0; i < TP_PARALLEL_HOOK_VALUES; i++) out[i] = k + i / 2 < n ? (double)ts[2 * k + i] : NAN;
        return TP_OK;
    }
    if (arg != GEN_HOOK_PROBE || !pr->pool || !pr->buf) return TP_ERR_INVALID_ARG;
    out[0] = tp_mem_read_bw_buf(pr->pool, pr->buf, pr->bytes, pr->passes);
    out[1] = (double)active_bytes(pr);
    return TP_OK;
}

/* All ranks probe at once; probe[r] / bytes[r] for r < world.  Rank 0 only.
 * TP_OK, or the hook's failure (TP_ERR_INTERNAL: a rank measured nothing). */
static enum tp_status gen_probe_all(tp_parallel_t *par, int world, double *probe, double *bytes)
{
    double v[TP_PLAN_MAX_RANKS * TP_PARALLEL_HOOK_VALUES];
    enum tp_status st = tp_parallel_run_hook(par, GEN_HOOK_PROBE, v, world);
    if (st != TP_OK) return st;
    for (int r = 0; r < world; r++) {
        if (!(v[r * TP_PARALLEL_HOOK_VALUES] > 0)) return TP_ERR_INTERNAL;
        probe[r] = v[r * TP_PARALLEL_HOOK_VALUES];
        bytes[r] = v[r * TP_PARALLEL_HOOK_VALUES + 1];
    }
    return TP_OK;
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
    size_t *tok_op;           /* (reps, n + 1): where each decoded token's collectives begin in the op log */
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
    free(b->tok_op);
    memset(b, 0, sizeof *b);
}

static enum tp_status gen_bufs_alloc(struct gen_bufs *b, int nb, int n_vocab, int reps, int world, int n_tg)
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
    b->tok_op = calloc(sr * ((size_t)n_tg + 1), sizeof(size_t));
    if (b->tok && b->pos && b->seq && b->want && b->logits && b->prompt && b->pp_s && b->tg_s && b->probe &&
        b->tmp && b->frac_r && b->rank_bytes && b->rank_frac && b->probe_sum && b->tok_op)
        return TP_OK;
    gen_bufs_free(b);
    return TP_ERR_NOMEM;
}

/* ------------------------------------------------------------------ parse */

struct gen_opts {
    const char *path;
    int p, n, threads, reps, json, bw_mib, bw_passes, seqs_ctx, comm_sync;
    const char *shard_weights, *moe_split, *comm_dtype, *kv_type, *seqs;
    int klist[16], nk, kmax; /* --seqs: the sequence counts; kmax >= 1 */
    const char *psizes, *depths;
    int chunk;               /* --batch: prefill tokens per call of --prompt-sizes / --depth (0: neither given) */
    int plist[16], np_sizes; /* --prompt-sizes */
    int dlist[16], nd;       /* --depth */
    int big;                 /* longest prompt those need (positions) */
    int verify;              /* --verify K: time a step of K + 1 positions of one sequence (0: off) */
    const char *spec;        /* --spec off|ngram */
    int spec_mode, draft_max;
    const char *text;        /* --text: the prompt of the --spec runs (default: the pseudo-random one) */
    const char *draft_model; /* --spec draft: the draft model's file */
    const char *draft_placement; /* --draft-placement auto|rank0|sharded */
    float draft_mem_bw, draft_allsum_us; /* its decision's figures (0: measured at start) */
};

/* --spec, --draft-model and the draft placement flags of o: 0, or 2 after printing a usage error. */
static int gen_check_spec(struct gen_opts *o)
{
    if ((o->spec_mode = tp_spec_mode_parse(o->spec)) < 0) {
        fprintf(stderr, "tpserve bench gen: --spec %s: want off, ngram or draft\n", o->spec);
        return 2;
    }
    if ((o->spec_mode == TP_SPEC_DRAFT) != (o->draft_model != NULL)) {
        fprintf(stderr, "tpserve bench gen: %s\n",
                o->draft_model ? "--draft-model needs --spec draft" : "--spec draft needs --draft-model FILE");
        return 2;
    }
    struct tp_error perr = {0};
    enum tp_draft_placement dp;
    if (tp_draft_placement_parse(o->draft_placement, &dp, &perr) != TP_OK) {
        fprintf(stderr, "tpserve bench gen: %s\n", perr.msg);
        return 2;
    }
    if (!(o->draft_mem_bw >= 0) || !(o->draft_allsum_us >= 0)) {
        fprintf(stderr, "tpserve bench gen: --draft-mem-bw and --draft-allsum-us take figures >= 0 (0: measured)\n");
        return 2;
    }
    return 0;
}

/* Parse argv into o.  Returns what tp_cli_parse does: 0 to go on, 1 after
 * --help, 2 after printing a usage error. */
static int gen_parse(int argc, char **argv, struct gen_opts *o)
{
    *o = (struct gen_opts){.p = 128, .n = 64, .reps = 3, .bw_mib = 1024, .bw_passes = 4, .moe_split = "auto",
                           .comm_dtype = "f32", .kv_type = "auto", .kmax = 1, .chunk = 512, .spec = "off",
                           .draft_max = 4, .draft_placement = "auto"};
    const struct tp_opt opts[] = {
        {"model", 'm', TP_OPT_STRING, &o->path, "FILE", "model (GGUF)", 0, 0},
        {"prompt-tokens", 'p', TP_OPT_INT, &o->p, "P", "prefill length (default 128; 0 skips prefill)", 0, 65536},
        {"gen-tokens", 'n', TP_OPT_INT, &o->n, "N", "decoded tokens (default 64; 0 skips decode)", 0, 65536},
        {"threads", 't', TP_OPT_INT, &o->threads, "T", "compute threads (default: all cores)", 1, 1024},
        {"reps", 'r', TP_OPT_INT, &o->reps, "R", "repetitions, median reported (default 3)", 1, 100},
        {"bw-mib", 0, TP_OPT_INT, &o->bw_mib, "MIB", "buffer of each bandwidth probe, on every rank (default 1024)",
         64, 1 << 20},
        {"bw-passes", 0, TP_OPT_INT, &o->bw_passes, "K", "reads of the buffer per probe, mean reported (default 4)",
         1, 100},
        {"seqs", 0, TP_OPT_LIST, &o->seqs, "K,K,..",
         "also time decode steps of K sequences at once (1..64, one token each)", 0, 0},
        {"seqs-ctx", 0, TP_OPT_INT, &o->seqs_ctx, "C",
         "--seqs steps start after C cached tokens per sequence (prefilled untimed; default 0: empty caches)", 0,
         65536},
        {"prompt-sizes", 0, TP_OPT_LIST, &o->psizes, "P,P,..",
         "also time prefill of P tokens each (e.g. 128,2048,8192; --batch tokens per call)", 0, 0},
        {"depth", 0, TP_OPT_LIST, &o->depths, "D,D,..",
         "also time -n decode steps after D cached tokens each (prefilled untimed; e.g. 0,2048,8192)", 0, 0},
        {"batch", 0, TP_OPT_INT, &o->chunk, "B",
         "prefill tokens per forward call for --prompt-sizes / --depth (default 512)", 1, 65536},
        {"json", 0, TP_OPT_FLAG, &o->json, NULL, "print one JSON object", 0, 0},
        {"comm-sync", 0, TP_OPT_FLAG, &o->comm_sync, NULL,
         "ranks on this machine (one clock): also report decode communication ms per token counted from the moment "
         "every rank has entered each collective, without the waits for slower ranks",
         0, 0},
        {"shard-weights", 0, TP_OPT_LIST, &o->shard_weights, "W,W,..", "under launch/mpirun: share per rank", 0, 0},
        {"moe-split", 0, TP_OPT_STRING, &o->moe_split, "S", TP_CLI_MOE_SPLIT_HELP, 0, 0},
        {"comm-dtype", 0, TP_OPT_STRING, &o->comm_dtype, "T", "under launch/mpirun: f32|f16|bf16|q8 on the wire", 0,
         0},
        {"kv-type", 0, TP_OPT_STRING, &o->kv_type, "T", TP_CLI_KV_TYPE_HELP, 0, 0},
        {"verify", 0, TP_OPT_INT, &o->verify, "K",
         "also time a step scoring K + 1 positions of one sequence (after -p cached tokens) against a one-token "
         "step: verify_step_ratio (1..16)", 0, TP_SPEC_DRAFT_MAX},
        {"spec", 0, TP_OPT_STRING, &o->spec, "MODE",
         "also decode -n tokens greedily with speculative decoding (ngram) beside the plain decode: acceptance, "
         "tokens/step, tokens/s, collectives/token", 0, 0},
        {"draft-max", 0, TP_OPT_INT, &o->draft_max, "K", "--spec: drafted tokens per step (default 4)", 1,
         TP_SPEC_DRAFT_MAX},
        {"draft-model", 0, TP_OPT_STRING, &o->draft_model, "FILE",
         "--spec draft: a smaller GGUF with the model's vocabulary (every rank gives the same)", 0, 0},
        {"draft-placement", 0, TP_OPT_STRING, &o->draft_placement, "P", TP_CLI_DRAFT_PLACEMENT_HELP, 0, 0},
        {"draft-mem-bw", 0, TP_OPT_FLOAT, &o->draft_mem_bw, "GBS", TP_CLI_DRAFT_MEM_BW_HELP, 0, 0},
        {"draft-allsum-us", 0, TP_OPT_FLOAT, &o->draft_allsum_us, "US", TP_CLI_DRAFT_ALLSUM_HELP, 0, 0},
        {"text", 0, TP_OPT_STRING, &o->text, "TEXT",
         "--spec: the prompt to continue (default: -p pseudo-random tokens)", 0, 0},
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
    if (rc) return rc;
    if (!o->path) {
        fprintf(stderr, "tpserve bench gen: -m MODEL is required\n");
        return 2;
    }
    if (o->seqs) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", o->seqs);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            char *end = NULL;
            long v = strtol(tok, &end, 10);
            if (end == tok || *end || v < 1 || v > 64 || o->nk == 16) {
                fprintf(stderr, "tpserve bench gen: --seqs '%s': want up to 16 sequence counts in 1..64\n", tok);
                return 2;
            }
            o->klist[o->nk++] = (int)v;
            o->kmax = TP_MAX(o->kmax, (int)v);
        }
        if (o->n == 0) {
            fprintf(stderr, "tpserve bench gen: --seqs needs decode steps (-n > 0)\n");
            return 2;
        }
    }
    if (gen_check_spec(o)) return 2;
    if (o->spec_mode != TP_SPEC_OFF && o->n == 0) {
        fprintf(stderr, "tpserve bench gen: --spec needs decode steps (-n > 0)\n");
        return 2;
    }
    if (o->verify > 0 && o->n == 0) {
        fprintf(stderr, "tpserve bench gen: --verify needs steps to time (-n > 0)\n");
        return 2;
    }
    if (o->psizes && (o->np_sizes = parse_int_list("prompt-sizes", o->psizes, o->plist, 16, 1, 1 << 20)) < 0)
        return 2;
    if (o->depths && (o->nd = parse_int_list("depth", o->depths, o->dlist, 16, 0, 1 << 20)) < 0) return 2;
    if (o->nd > 0 && o->n == 0) {
        fprintf(stderr, "tpserve bench gen: --depth needs decode steps (-n > 0)\n");
        return 2;
    }
    for (int i = 0; i < o->np_sizes; i++) o->big = TP_MAX(o->big, o->plist[i]);
    for (int i = 0; i < o->nd; i++) o->big = TP_MAX(o->big, o->dlist[i] + o->n);
    if (o->big == 0) o->chunk = 0; /* no --prompt-sizes / --depth: no chunked calls */
    if (o->p == 0 && o->n == 0) {
        fprintf(stderr, "tpserve bench gen: nothing to measure (-p 0 and -n 0)\n");
        return 2;
    }
    char what[32]; /* the probe's buffer is written in full, beside the model */
    snprintf(what, sizeof what, "--bw-mib %d", o->bw_mib);
    return tp_cli_check_memory("bench gen", what, (uint64_t)o->bw_mib << 20,
                               "a few times the CPU's last-level cache (the default 1024 is plenty) measures memory");
}

/* ------------------------------------------------------------------ run */

/* One greedy decode of --spec (plain or with drafts). */
struct gen_spec_stats {
    double tps;                    /* generated tokens / decode seconds (median over reps) */
    long long steps, drafted, accepted, tokens, collectives; /* summed over reps */
};

/* Everything one run owns, released in one place (gen_run_free), and rank 0's raw measurements. */
struct gen_run {
    struct tp_parallel_config pcfg;
    tp_pool_t *pool;          /* --threads threads that read the probe buffer (decode runs only) */
    uint64_t *bwbuf;          /* (bw_bytes) the probe buffer, on every rank */
    size_t bw_bytes;
    struct gen_probe gp;      /* the probe hook's state: lends pool and bwbuf */
    struct gen_ctx g;         /* g.par owned; g's arrays lent by bufs */
    struct gen_bufs bufs;
    int world, nb;            /* nb: batch arrays and prompt length */
    double t_load;            /* seconds to load this rank's slice */
    /* decode reps, rank 0's view: forward and all_sum time of its model, compute and communication time and
     * bytes sent of the engine, decoded tokens */
    uint64_t tg_ns_fwd, tg_ns_comm, tg_ns_compute, tg_ns_pcomm, tg_bytes, tg_count;
    uint64_t tg_ns_phase[4];  /* of tg_ns_fwd: norms and quantization, matmuls, attention, logits (the model's
                               * ns_prep, ns_matmul, ns_attn, ns_logits) */
    double tg_s_sum;          /* decode reps' wall time, summed */
    size_t tg_op[100][2];     /* --comm-sync: each decode rep's collectives [first, end) in the op log */
    double tg_sync_ms;        /* --comm-sync: rank 0's decode communication ms per token after all ranks entered */
    double tg_wait_ms;        /* --comm-sync: rank 0's ms per token waiting for the last rank to enter */
    double tg_sync_us[3];     /* --comm-sync: mean synced us of a step header, an all_sum, an argmax gather */
    double k_ms[16];          /* --seqs: median ms per step for klist[i] */
    double k_phase[16][5];    /* --seqs: rank 0's ms per step in its forward calls, its matmuls (the logits' too),
                               * attention, norms and quantization, and the rest of the step (mean over the reps) */
    double k_xbytes[16], k_xruns[16]; /* --seqs, mixture of experts: rank 0's expert bytes streamed and (layer,
                                       * expert) runs per step for klist[i], mean over the reps (measured) */
    double p_tps[16];         /* --prompt-sizes: median prefill t/s for plist[i] */
    double d_ms[16], d_kv[16]; /* --depth: median ms per decode step after dlist[i]; KV bytes every rank reads
                                * per step (mean over the steps) */
    double d_flop[16];        /* --depth: attention FLOPs per step, all ranks (2 per multiply-add of q.k and p.v) */
    double d_bw[16];          /* --depth: median of the bandwidth probes (summed over ranks) taken right before
                               * each rep's decode at dlist[i], after its prefill */
    double v_ms1, v_msk;      /* --verify: median ms of a one-token step and of a K + 1 token step */
    struct gen_spec_stats spec[2]; /* --spec: [0] plain, [1] speculative (medians of tokens/s over reps) */
    int spec_same;            /* --spec: the two decodes gave the same tokens */
    tp_spec_draft_t *dm;      /* --spec draft: the draft model (rank 0), owned */
    int spec_prompt;          /* --spec: prompt tokens */
};

/* --depth: GFLOP/s of the attention at dlist[i], its FLOPs over the time the step takes beyond a step at depth 0
 * (0 without a depth-0 entry, at depth 0, or when the step is not slower) */
static double depth_attn_gflops(const struct gen_run *R, const struct gen_opts *o, int i)
{
    double ms0 = -1.0;
    for (int k = 0; k < o->nd; k++)
        if (o->dlist[k] == 0) ms0 = R->d_ms[k];
    const double extra_ms = R->d_ms[i] - ms0;
    return ms0 >= 0.0 && o->dlist[i] > 0 && extra_ms > 0.0 ? R->d_flop[i] / (extra_ms * 1e6) : 0.0;
}

/* --depth: the bound of dlist[i] in ms, (weight bytes bpt + KV bytes read) / the bandwidth probed before its
 * decodes (0 without a probe) */
static double depth_bound_ms(const struct gen_run *R, uint64_t bpt, int i)
{
    return R->d_bw[i] > 0.0 ? ((double)bpt + R->d_kv[i]) / (R->d_bw[i] * 1e9) * 1e3 : 0.0;
}

static void gen_run_free(struct gen_run *R)
{
    gen_bufs_free(&R->bufs);
    tp_spec_draft_free(R->dm);
    tp_parallel_free(R->g.par);
    tp_pool_free(R->pool);
    tp_aligned_free(R->bwbuf);
    memset(R, 0, sizeof *R);
}

/* The smallest batch: one token, or a verification of up to TP_SPEC_DRAFT_MAX drafts with --verify / --spec. */
static int gen_min_batch(const struct gen_opts *o)
{
    return o->verify > 0 || o->spec_mode != TP_SPEC_OFF ? 1 + TP_SPEC_DRAFT_MAX : 1;
}

/* Every rank: the probe pool and buffer, then the model (or this rank's slice of it) and the probe hook.
 * R->pcfg is filled by the caller. */
static enum tp_status gen_start(struct gen_run *R, const struct gen_opts *o, struct tp_error *err)
{
    const int threads = o->threads > 0 ? o->threads : tp_cpu_count();
    R->bw_bytes = (size_t)o->bw_mib << 20;
    if (o->n > 0) { /* kept for the whole run */
        struct tp_pool_config pc = tp_pool_default_config();
        pc.n_threads = threads;
        if (tp_pool_init(&pc, &R->pool) != TP_OK)
            return tp_error_set(err, TP_ERR_NOMEM, "cannot start %d threads", threads);
        R->bwbuf = tp_stream_alloc(R->bw_bytes);
        if (!R->bwbuf)
            return tp_error_set(err, TP_ERR_NOMEM,
                                "cannot allocate %d MiB for the bandwidth probes (lower --bw-mib)", o->bw_mib);
        memset(R->bwbuf, 0x5a, R->bw_bytes);
    }
    struct tp_model_config *mc = &R->pcfg.model;
    mc->path = o->path;
    mc->n_threads = threads;
    mc->n_seq = o->kmax;
    mc->n_batch = TP_MAX(TP_MAX(TP_MAX(o->p, gen_min_batch(o)), o->kmax), o->chunk);
    mc->n_ctx = TP_MAX(TP_MAX(o->p, o->n + o->seqs_ctx), o->big) + 8;
    if (o->verify > 0) mc->n_ctx = TP_MAX(mc->n_ctx, o->p + o->verify + 8);
    if (o->spec_mode != TP_SPEC_OFF) mc->n_ctx = TP_MAX(mc->n_ctx, TP_MAX(o->p, 1) + o->n + TP_SPEC_DRAFT_MAX + 8);
    if (o->text) mc->n_ctx = TP_MAX(mc->n_ctx, 4096);
    mc->n_ctx = TP_MAX(mc->n_ctx, TP_MIN(mc->n_batch, 16) + 2); /* gen_prepare's warm-up */
    double t0 = tp_now_s();
    enum tp_status st = tp_parallel_init(&R->pcfg, &R->g.par, err);
    if (st != TP_OK) return st;
    R->t_load = tp_now_s() - t0;
    R->g.m = tp_parallel_model(R->g.par);
    R->world = tp_parallel_size(R->g.par);
    R->gp = (struct gen_probe){R->pool,          R->bwbuf, R->bw_bytes, o->bw_passes, bytes_per_token(R->g.par),
                               R->g.m,           tp_parallel_comm(R->g.par)};
    tp_parallel_set_hook(R->g.par, gen_hook, &R->gp);
    return TP_OK;
}

/* Rank 0: the arrays, a fixed pseudo-random prompt over the whole vocabulary and one warm-up pass. */
static enum tp_status gen_prepare(struct gen_run *R, const struct gen_opts *o, struct tp_error *err)
{
    struct gen_ctx *g = &R->g;
    g->n_vocab = tp_model_hparams(g->m)->n_vocab;
    R->nb = TP_MAX(TP_MAX(TP_MAX(o->p, gen_min_batch(o)), o->kmax), o->chunk);
    if (gen_bufs_alloc(&R->bufs, TP_MAX(R->nb, o->big), g->n_vocab, o->reps, R->world, o->n) != TP_OK)
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    g->tok = R->bufs.tok, g->pos = R->bufs.pos, g->seq = R->bufs.seq, g->want = R->bufs.want;
    g->logits = R->bufs.logits;
    uint64_t x = 0x243F6A8885A308D3ull;
    for (int i = 0; i < TP_MAX(R->nb, o->big); i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        R->bufs.prompt[i] = (int32_t)((x >> 33) % (uint64_t)g->n_vocab);
    }
    /* pages the weights in, settles the pool */
    gen_reset(g);
    const int w = TP_MIN(R->nb, 16);
    if (gen_forward(g, R->bufs.prompt, w, 0) != TP_OK || gen_forward(g, R->bufs.prompt, 1, w) != TP_OK)
        return tp_error_set(err, TP_ERR_PEER, "forward failed: %s", tp_parallel_last_error(g->par));
    return TP_OK;
}

/* Rank 0, rep r: prefill (pp_s[r]), then a probe on every rank and the decode (tg_s[r], counters). */
static enum tp_status gen_rep(struct gen_run *R, const struct gen_opts *o, int r, struct tp_error *err)
{
    struct gen_ctx *g = &R->g;
    struct gen_bufs *b = &R->bufs;
    if (o->p > 0) {
        gen_reset(g);
        double t0 = tp_now_s();
        if (gen_forward(g, b->prompt, o->p, 0) != TP_OK)
            return tp_error_set(err, TP_ERR_PEER, "prefill failed: %s", tp_parallel_last_error(g->par));
        b->pp_s[r] = tp_now_s() - t0;
    }
    if (o->n == 0) return TP_OK;
    if (gen_probe_all(g->par, R->world, b->probe + (size_t)r * R->world, b->rank_bytes) != TP_OK)
        return tp_error_set(err, TP_ERR_PEER, "bandwidth probe failed on some rank: %s",
                            tp_parallel_last_error(g->par));
    struct tp_model_stats st0, st1;
    struct tp_parallel_stats ps0, ps1;
    gen_reset(g);
    int32_t t = b->prompt[0];
    tp_model_get_stats(g->m, &st0);
    tp_parallel_get_stats(g->par, &ps0);
    R->tg_op[r][0] = tp_comm_op_times(tp_parallel_comm(g->par), NULL);
    double t0 = tp_now_s();
    size_t *tok_op = b->tok_op + (size_t)r * ((size_t)o->n + 1);
    for (int i = 0; i < o->n; i++) {
        tok_op[i] = tp_comm_op_times(tp_parallel_comm(g->par), NULL);
        if (gen_decode(g, &t, i) != TP_OK)
            return tp_error_set(err, TP_ERR_PEER, "decode failed: %s", tp_parallel_last_error(g->par));
    }
    b->tg_s[r] = tp_now_s() - t0;
    R->tg_op[r][1] = tok_op[o->n] = tp_comm_op_times(tp_parallel_comm(g->par), NULL);
    tp_model_get_stats(g->m, &st1);
    tp_parallel_get_stats(g->par, &ps1);
    R->tg_ns_fwd += st1.ns_forward - st0.ns_forward;
    R->tg_ns_comm += st1.ns_all_sum - st0.ns_all_sum;
    R->tg_ns_phase[0] += st1.ns_prep - st0.ns_prep;
    R->tg_ns_phase[1] += st1.ns_matmul - st0.ns_matmul;
    R->tg_ns_phase[2] += st1.ns_attn - st0.ns_attn;
    R->tg_ns_phase[3] += st1.ns_logits - st0.ns_logits;
    R->tg_s_sum += b->tg_s[r];
    R->tg_ns_compute += ps1.ns_compute - ps0.ns_compute;
    R->tg_ns_pcomm += ps1.ns_comm - ps0.ns_comm;
    R->tg_bytes += ps1.bytes_sent - ps0.bytes_sent;
    R->tg_count += (uint64_t)o->n;
    return TP_OK;
}

/* Rank 0, --seqs: reps x (each k in turn); k_ms[i] = median step time for klist[i]. */
static enum tp_status gen_seq_steps(struct gen_run *R, const struct gen_opts *o, struct tp_error *err)
{
    double ks[16 * 100]; /* (nk, reps) */
    int32_t ids[64], clear[64];
    memset(R->k_phase, 0, sizeof R->k_phase);
    for (int ki = 0; ki < o->nk; ki++) R->k_xbytes[ki] = R->k_xruns[ki] = 0.0;
    for (int r = 0; r < o->reps; r++) {
        for (int ki = 0; ki < o->nk; ki++) {
            for (int i = 0; i < o->klist[ki]; i++) ids[i] = R->bufs.prompt[i % R->nb];
            double sec = 0.0;
            struct tp_model_stats d;
            memset(&d, 0, sizeof d);
            if (gen_multi(&R->g, o->klist[ki], o->n, o->seqs_ctx, R->bufs.prompt, R->nb, R->nb, ids, clear, &sec,
                          &d) != TP_OK)
                return tp_error_set(err, TP_ERR_PEER, "batched decode failed: %s", tp_parallel_last_error(R->g.par));
            ks[ki * o->reps + r] = sec * 1e3 / o->n;
            R->k_xbytes[ki] += (double)d.expert_bytes / o->n / o->reps;
            R->k_xruns[ki] += (double)d.expert_runs / o->n / o->reps;
            const double per = 1e-6 / o->n / o->reps; /* ns over the steps -> ms per step, mean over the reps */
            double *ph = R->k_phase[ki];
            ph[0] += (double)d.ns_forward * per;
            ph[1] += (double)(d.ns_matmul + d.ns_logits) * per;
            ph[2] += (double)d.ns_attn * per;
            ph[3] += (double)d.ns_prep * per;
            ph[4] += (sec * 1e3 - (double)(d.ns_matmul + d.ns_logits + d.ns_attn + d.ns_prep) * 1e-6) / o->n / o->reps;
        }
    }
    for (int ki = 0; ki < o->nk; ki++) R->k_ms[ki] = tp_median(ks + ki * o->reps, o->reps);
    return TP_OK;
}

/* Rank 0, --prompt-sizes and --depth: reps x each size in turn, medians; the KV bytes read at each depth. */
static enum tp_status gen_sizes(struct gen_run *R, const struct gen_opts *o, struct tp_error *err)
{
    double ts[32 * 100]; /* (np_sizes + nd, reps) */
    double bws[16 * 100]; /* (nd, reps) probes before the decodes */
    const int32_t *prompt = R->bufs.prompt;
    for (int r = 0; r < o->reps; r++) {
        for (int i = 0; i < o->np_sizes; i++)
            if (gen_prefill_decode(&R->g, prompt, o->plist[i], o->chunk, 0, &ts[i * o->reps + r], NULL) != TP_OK)
                return tp_error_set(err, TP_ERR_PEER, "prefill of %d tokens failed: %s", o->plist[i],
                                    tp_parallel_last_error(R->g.par));
        for (int i = 0; i < o->nd; i++) {
            /* prefill, a probe on every rank, then the timed decode: each depth's bound from its own moment */
            double pr[TP_PLAN_MAX_RANKS], by[TP_PLAN_MAX_RANKS], sum = 0.0;
            if (gen_prefill_decode(&R->g, prompt, o->dlist[i], o->chunk, 0, NULL, NULL) != TP_OK ||
                gen_probe_all(R->g.par, R->world, pr, by) != TP_OK ||
                gen_decode_from(&R->g, prompt, o->dlist[i], o->n, &ts[(16 + i) * o->reps + r]) != TP_OK)
                return tp_error_set(err, TP_ERR_PEER, "decode at depth %d failed: %s", o->dlist[i],
                                    tp_parallel_last_error(R->g.par));
            for (int q = 0; q < TP_MIN(R->world, TP_PLAN_MAX_RANKS); q++) sum += pr[q];
            bws[i * o->reps + r] = sum;
        }
    }
    for (int i = 0; i < o->nd; i++) R->d_bw[i] = tp_median(bws + i * o->reps, o->reps);
    for (int i = 0; i < o->np_sizes; i++) R->p_tps[i] = o->plist[i] / tp_median(ts + i * o->reps, o->reps);
    for (int i = 0; i < o->nd; i++) R->d_ms[i] = tp_median(ts + (16 + i) * o->reps, o->reps) * 1e3 / o->n;
    /* every rank reads the K and V of its held KV heads */
    const struct tp_shard_plan *plan = tp_parallel_get_plan(R->g.par);
    uint64_t heads = 0;
    for (int q = 0; q < R->world; q++)
        heads += (uint64_t)(plan->ranks[q].shard.kv_head_end - plan->ranks[q].shard.kv_head_begin);
    for (int i = 0; i < o->nd; i++) {
        double sum = 0.0;
        for (int s = 0; s < o->n; s++) sum += (double)tp_model_kv_head_bytes_read(R->g.m, o->dlist[i] + s);
        R->d_kv[i] = sum / o->n * (double)heads;
        /* keys read per (layer, KV head) = bytes / (2 x row bytes); row bytes = bytes at position 0 / (2 x layers) */
        const struct tp_hparams *hp = tp_model_hparams(R->g.m);
        const double b0 = (double)tp_model_kv_head_bytes_read(R->g.m, 0);
        const double keys = b0 > 0.0 ? R->d_kv[i] / b0 * hp->n_layer : 0.0;
        R->d_flop[i] = keys * 4.0 * hp->head_dim * ((double)hp->n_head / (hp->n_head_kv > 0 ? hp->n_head_kv : 1));
    }
    return TP_OK;
}

/* Rank 0, --verify K: after -p cached tokens, n pairs of (a one-token step, a step of K + 1 tokens at the same
 * positions with a logits row each, as a verification feeds them), each after a clear back to -p; medians. */
static enum tp_status gen_verify(struct gen_run *R, const struct gen_opts *o, struct tp_error *err)
{
    struct gen_ctx *g = &R->g;
    const int K = o->verify, d = o->p;
    double *t1 = malloc(sizeof(double) * (size_t)o->n), *tk = malloc(sizeof(double) * (size_t)o->n);
    int32_t ids[1 + TP_SPEC_DRAFT_MAX];
    enum tp_status st = TP_OK;
    if (!t1 || !tk) {
        st = tp_error_set(err, TP_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (d > 0) {
        gen_reset(g);
        if ((st = gen_forward(g, R->bufs.prompt, d, 0)) != TP_OK) goto fail;
    }
    static const int32_t clear_seq[1] = {0};
    const int32_t clear_from[1] = {d};
    for (int i = 0; i < o->n; i++) {
        for (int pass = 0; pass < 2; pass++) {
            const int n = pass ? K + 1 : 1;
            for (int j = 0; j < n; j++) {
                g->tok[j] = R->bufs.prompt[(d + i + j) % R->nb];
                g->pos[j] = d + j;
                g->seq[j] = 0;
                g->want[j] = 1;
            }
            struct tp_batch b = {.n_tokens = n, .token = g->tok, .pos = g->pos, .seq = g->seq, .logits = g->want};
            struct tp_step sp = {b, 1, clear_seq, clear_from, 0, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL};
            double t0 = tp_now_s();
            if ((st = tp_parallel_step_greedy(g->par, &sp, ids, NULL)) != TP_OK) goto fail;
            (pass ? tk : t1)[i] = tp_now_s() - t0;
        }
    }
    R->v_ms1 = tp_median(t1, o->n) * 1e3;
    R->v_msk = tp_median(tk, o->n) * 1e3;
    goto out;
fail:
    st = tp_error_set(err, TP_ERR_PEER, "verification step failed: %s", tp_parallel_last_error(g->par));
out:
    free(t1);
    free(tk);
    return st;
}

/* Rank 0, --spec: prefill prompt[0..np) (untimed), then decode n tokens greedily into out[n]: each step feeds
 * the last token and (spec) up to draft_max n-gram drafts with a logits row each (distributed argmax), keeps
 * the drafts that match the argmax of the row before them and clears the rest.  Adds to *ss; *sec: decode
 * time.  toks: (np + n + 1) scratch for the sequence. */
static enum tp_status gen_spec_run(struct gen_run *R, const int32_t *prompt, int np, int n, int spec, int draft_max,
                                   int32_t *toks, int32_t *out, struct gen_spec_stats *ss, double *sec)
{
    struct gen_ctx *g = &R->g;
    const tp_comm_t *comm = tp_parallel_comm(g->par);
    int32_t ids[1 + TP_SPEC_DRAFT_MAX], draft[TP_SPEC_DRAFT_MAX];
    static const int32_t clear_seq[1] = {0};
    int32_t clear_from[1] = {0};
    enum tp_status st;
    gen_reset(g);
    for (int p0 = 0; p0 < np - 1; p0 += R->nb) /* all but the last prompt token: it is the first decode input */
        if ((st = gen_forward(g, prompt + p0, TP_MIN(R->nb, np - 1 - p0), p0)) != TP_OK) return st;
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)np);
    struct tp_spec_adapt ad;
    tp_spec_adapt_init(&ad, draft_max);
    struct tp_comm_stats c0 = {0}, c1 = {0};
    if (comm) tp_comm_get_stats(comm, &c0);
    int n_tok = np, base = np - 1, got = 0, clear = g->reset; /* a one-token prompt: the reset goes here */
    g->reset = 0;
    double t0 = tp_now_s();
    while (got < n) {
        int k = 0;
        const int kk = TP_MIN(tp_spec_adapt_k(&ad), n - got - 1);
        if (spec && kk > 0)
            k = R->dm ? tp_spec_draft_propose(R->dm, 0, toks, n_tok, kk, draft) : tp_spec_ngram_draft(toks, n_tok, kk, draft);
        if (k < 0) return TP_ERR_INTERNAL; /* the draft model's error: tp_model_last_error */
        g->tok[0] = toks[n_tok - 1];
        for (int j = 0; j <= k; j++) {
            if (j > 0) g->tok[j] = draft[j - 1];
            g->pos[j] = base + j;
            g->seq[j] = 0;
            g->want[j] = 1;
        }
        struct tp_batch b = {.n_tokens = k + 1, .token = g->tok, .pos = g->pos, .seq = g->seq, .logits = g->want};
        struct tp_step sp = {b, clear, clear_seq, clear_from, 0, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL};
        if ((st = tp_parallel_step_greedy(g->par, &sp, ids, NULL)) != TP_OK) return st;
        int a = 0;
        while (a < k && ids[a] == draft[a]) a++;
        for (int j = 0; j <= a && got < n; j++) out[got++] = toks[n_tok++] = ids[j];
        ss->steps++;
        ss->drafted += k;
        ss->accepted += a;
        if (k > 0) tp_spec_adapt_update(&ad, k, a);
        base += a + 1;
        clear = a < k;
        clear_from[0] = base;
    }
    *sec = tp_now_s() - t0;
    if (comm) tp_comm_get_stats(comm, &c1);
    ss->tokens += n;
    ss->collectives += (long long)(c1.n_ops - c0.n_ops);
    return TP_OK;
}

/* Rank 0, --spec: reps x (plain, speculative) decodes of -n tokens after the --text (or pseudo-random) prompt. */
static enum tp_status gen_spec(struct gen_run *R, const struct gen_opts *o, struct tp_error *err)
{
    int32_t *prompt = R->bufs.prompt;
    int np = o->p > 0 ? o->p : 1;
    tp_tokenizer_t *tok = tp_model_tokenizer(R->g.m);
    const int n_ctx = tp_model_n_ctx(R->g.m);
    int32_t *tp = NULL, *toks = NULL, *out[2] = {NULL, NULL};
    double *sec[2] = {NULL, NULL};
    enum tp_status st = TP_OK;
    if (o->text) {
        if (!(tp = malloc(sizeof(int32_t) * (size_t)n_ctx)))
            return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
        np = tp_tokenizer_encode(tok, o->text, strlen(o->text), tp_tokenizer_add_bos(tok), 1, tp, n_ctx);
        if (np < 1 || np + o->n + TP_SPEC_DRAFT_MAX + 1 > n_ctx) {
            free(tp);
            return tp_error_set(err, TP_ERR_INVALID_ARG,
                                "--text: %d tokens; with -n %d it must fit the context of %d (raise -p, which sizes "
                                "the context, or shorten it)",
                                np, o->n, n_ctx);
        }
        prompt = tp;
    }
    toks = malloc(sizeof(int32_t) * ((size_t)np + (size_t)o->n + 1));
    for (int v = 0; v < 2; v++) {
        out[v] = malloc(sizeof(int32_t) * (size_t)o->n);
        sec[v] = malloc(sizeof(double) * (size_t)o->reps);
    }
    if (!toks || !out[0] || !out[1] || !sec[0] || !sec[1]) {
        st = tp_error_set(err, TP_ERR_NOMEM, "out of memory");
        goto out;
    }
    memset(R->spec, 0, sizeof R->spec);
    for (int r = 0; r < o->reps; r++)
        for (int v = 0; v < 2; v++)
            if ((st = gen_spec_run(R, prompt, np, o->n, v, o->draft_max, toks, out[v], &R->spec[v], &sec[v][r])) !=
                TP_OK) {
                st = st == TP_ERR_INTERNAL && R->dm
                         ? tp_error_set(err, st, "the draft model failed: %s", tp_spec_draft_last_error(R->dm))
                         : tp_error_set(err, TP_ERR_PEER, "decode failed: %s", tp_parallel_last_error(R->g.par));
                goto out;
            }
    for (int v = 0; v < 2; v++) R->spec[v].tps = (double)o->n / tp_median(sec[v], o->reps);
    R->spec_same = memcmp(out[0], out[1], sizeof(int32_t) * (size_t)o->n) == 0;
    R->spec_prompt = np;
out:
    free(tp);
    free(toks);
    for (int v = 0; v < 2; v++) {
        free(out[v]);
        free(sec[v]);
    }
    return st;
}


/*
 * --comm-sync, rank 0 after the decode reps: each collective of the reps timed from the moment the
 * last rank entered it to the moment the last rank left it (the ranks' times come through the hook,
 * on the clock they share), so the waits for a rank still computing are left out;
 * R->tg_sync_ms per decoded token.  R->tg_wait_ms: rank 0's waits per token for the last rank to enter
 * (its time in collectives is the two together, as far as it leaves with the last rank).  R->tg_sync_us[]: the
 * mean synced time of one call of each collective of a greedy decode step (the step header, an all_sum,
 * the argmax gather: what `bench comm --decode` times) over the tokens that ran those 2 n_layer + 2 and
 * nothing else (not the engine's periodic stats gather, say); NaN when none did.
 */
static enum tp_status gen_comm_sync(struct gen_run *R, const struct gen_opts *o, struct tp_error *err)
{
    const size_t n_log = tp_comm_op_times(tp_parallel_comm(R->g.par), NULL);
    const int world = TP_MIN(R->world, TP_PLAN_MAX_RANKS);
    const size_t per = 2 * (size_t)tp_model_hparams(R->g.m)->n_layer + 2; /* collectives of a decode step */
    double v[TP_PLAN_MAX_RANKS * TP_PARALLEL_HOOK_VALUES], ns = 0.0, wait_ns = 0.0, kind_ns[3] = {0, 0, 0};
    size_t kind_n[3] = {0, 0, 0};
    for (int r = 0; r < o->reps; r++) {
        if (R->tg_op[r][1] > n_log || (R->tg_op[r][1] == n_log && n_log == GEN_OP_LOG))
            return tp_error_set(err, TP_ERR_INVALID_ARG, "--comm-sync: the op log of %zu collectives is full (fewer "
                                "-n or --reps)", GEN_OP_LOG);
        const size_t *tok_op = R->bufs.tok_op + (size_t)r * ((size_t)o->n + 1);
        int tok = 0; /* the token of collective k + i */
        for (size_t k = R->tg_op[r][0]; k < R->tg_op[r][1]; k += 2) {
            if (tp_parallel_run_hook(R->g.par, GEN_HOOK_OPS + (int32_t)k, v, world) != TP_OK)
                return tp_error_set(err, TP_ERR_PEER, "--comm-sync: %s", tp_parallel_last_error(R->g.par));
            for (size_t i = 0; i < 2 && k + i < R->tg_op[r][1]; i++) {
                double last_in = 0.0, last_out = 0.0;
                for (int q = 0; q < world; q++) {
                    const double *e = &v[q * TP_PARALLEL_HOOK_VALUES + 2 * (int)i];
                    if (!(e[0] > 0 && e[1] >= e[0]))
                        return tp_error_set(err, TP_ERR_PEER, "--comm-sync: rank %d has no times for collective %zu",
                                            q, k + i);
                    last_in = fmax(last_in, e[0]);
                    last_out = fmax(last_out, e[1]);
                }
                const double sync = fmax(0.0, last_out - last_in);
                ns += sync;
                wait_ns += fmax(0.0, last_in - v[2 * (int)i]);
                while (tok + 1 < o->n && tok_op[tok + 1] <= k + i) tok++;
                if (tok_op[tok + 1] - tok_op[tok] != per) continue; /* a token that ran more (a stats gather) */
                const size_t at = k + i - tok_op[tok]; /* 0: the header, per - 1: the gather */
                const int kind = at == 0 ? 0 : at == per - 1 ? 2 : 1;
                kind_ns[kind] += sync;
                kind_n[kind]++;
            }
        }
    }
    const double tokens = (double)o->n * o->reps;
    R->tg_sync_ms = tokens > 0 ? ns / 1e6 / tokens : 0.0;
    R->tg_wait_ms = tokens > 0 ? wait_ns / 1e6 / tokens : 0.0;
    for (int i = 0; i < 3; i++) R->tg_sync_us[i] = kind_n[i] ? kind_ns[i] / 1e3 / (double)kind_n[i] : NAN;
    return TP_OK;
}

/* Rank 0: warm-up, the reps, the probe after the last one, --comm-sync's figure, the --seqs steps,
 * --prompt-sizes and --depth. */
static enum tp_status gen_measure(struct gen_run *R, const struct gen_opts *o, struct tp_error *err)
{
    enum tp_status st = gen_prepare(R, o, err);
    for (int r = 0; r < o->reps && st == TP_OK; r++) st = gen_rep(R, o, r, err);
    if (st == TP_OK && o->n > 0 &&
        gen_probe_all(R->g.par, R->world, R->bufs.probe + (size_t)o->reps * R->world, R->bufs.rank_bytes) != TP_OK)
        st = tp_error_set(err, TP_ERR_PEER, "bandwidth probe failed on some rank: %s",
                          tp_parallel_last_error(R->g.par));
    if (st == TP_OK && o->comm_sync && o->n > 0) st = gen_comm_sync(R, o, err);
    if (st == TP_OK && o->nk > 0) st = gen_seq_steps(R, o, err);
    if (st == TP_OK && (o->np_sizes > 0 || o->nd > 0)) st = gen_sizes(R, o, err);
    if (st == TP_OK && o->verify > 0) st = gen_verify(R, o, err);
    if (st == TP_OK && o->spec_mode != TP_SPEC_OFF) st = gen_spec(R, o, err);
    return st;
}

/* ------------------------------------------------------------------ report */

/* The figures reported, derived from a run (gen_summarize). */
struct gen_result {
    uint64_t bpt;                     /* the group's weight bytes read per token: every rank's */
    int moe;                          /* mixture of experts: bpt counts the experts selected (measured) */
    double bw, frac, frac_min, frac_max; /* median probe summed over ranks; fraction of it reached, range */
    double rank_bw[TP_PLAN_MAX_RANKS], rank_fr[TP_PLAN_MAX_RANKS]; /* per rank: median probe, median fraction */
    double tg_rep[100];               /* decode t/s per rep, in rep order */
    double pp_tps, tg_tps;
    double comm_frac;                 /* all_sum share of rank 0's decode forward time */
    double cpt_ms, mpt_ms, bpt_sent;  /* rank 0 per decoded token: compute, communication, bytes sent */
    /* rank 0's decode step, ms per token (mean over every rep): the step, tp_model_forward, of which norms and
     * quantization, matmuls, attention, logits, all_sum; the weights' GB/s over matmuls + logits */
    double step_ms, fwd_ms, ph_ms[4], allsum_ms, mm_gbs;
    double k1_ms;                     /* --seqs step time of 1 sequence, 0 when not measured */
    double k_pred[16], k_xpl[16];     /* --seqs, mixture of experts: the step's bytes over one sequence's
                                       * (predicted ratio), distinct experts run per layer (rank 0's) */
};

/* --seqs of a mixture of experts: a step of k sequences reads rank 0's weights other than its experts once
 * (attention, routers, output head: the same for any k) plus the distinct experts its k tokens selected
 * (measured per step); res->k_pred = that over the same for one sequence (its own --seqs step, else the
 * decode reps' mean), the step-time ratio the bytes predict.  KV-cache reads are left out (a few KiB per
 * sequence at the depths --seqs runs without --seqs-ctx). */
static void gen_seq_bytes(const struct gen_run *R, const struct gen_opts *o, struct gen_result *res)
{
    const uint64_t held = tp_model_expert_weight_bytes(R->g.m);
    struct tp_model_stats st;
    tp_model_get_stats(R->g.m, &st);
    if (!held || o->nk == 0 || R->gp.bytes_read < held) return;
    const double other = (double)(R->gp.bytes_read - held);
    double x1 = st.n_decode ? (double)st.expert_bytes_decode / (double)st.n_decode : 0.0;
    for (int ki = 0; ki < o->nk; ki++)
        if (o->klist[ki] == 1) x1 = R->k_xbytes[ki];
    const int n_layer = tp_model_hparams(R->g.m)->n_layer;
    for (int ki = 0; ki < o->nk; ki++) {
        res->k_pred[ki] = other + x1 > 0.0 ? (other + R->k_xbytes[ki]) / (other + x1) : 0.0;
        res->k_xpl[ki] = n_layer > 0 ? R->k_xruns[ki] / n_layer : 0.0;
    }
}

/* Rank 0's forward time per token outside its timed parts (embedding, residual adds, routing, bookkeeping). */
static double gen_forward_rest(const struct gen_result *res)
{
    return res->fwd_ms - res->ph_ms[0] - res->ph_ms[1] - res->ph_ms[2] - res->ph_ms[3] - res->allsum_ms;
}

static void gen_summarize(struct gen_run *R, const struct gen_opts *o, struct gen_result *res)
{
    struct gen_bufs *b = &R->bufs;
    const int n = o->n, reps = o->reps, world = R->world;
    memset(res, 0, sizeof *res);
    for (int ki = 0; ki < o->nk; ki++)
        if (o->klist[ki] == 1) res->k1_ms = R->k_ms[ki];
    gen_seq_bytes(R, o, res);
    for (int q = 0; q < world && n > 0; q++) res->bpt += (uint64_t)b->rank_bytes[q];
    if (n == 0) res->bpt = active_bytes(&R->gp); /* rank 0's own when nothing was decoded */
    res->moe = tp_model_expert_weight_bytes(R->g.m) > 0;
    if (n > 0) {
        for (int k = 0; k <= reps; k++) {
            b->probe_sum[k] = 0.0;
            for (int q = 0; q < world; q++) b->probe_sum[k] += b->probe[(size_t)k * world + q];
        }
        for (int r = 0; r < reps; r++) {
            double around = 0.5 * (b->probe_sum[r] + b->probe_sum[r + 1]);
            b->frac_r[r] = around > 0.0 ? (double)n / b->tg_s[r] * (double)res->bpt / (around * 1e9) : 0.0;
            for (int q = 0; q < world; q++) {
                double a = 0.5 * (b->probe[(size_t)r * world + q] + b->probe[(size_t)(r + 1) * world + q]);
                b->rank_frac[(size_t)r * world + q] =
                    a > 0.0 ? (double)n / b->tg_s[r] * b->rank_bytes[q] / (a * 1e9) : 0.0;
            }
        }
        memcpy(b->tmp, b->probe_sum, ((size_t)reps + 1) * sizeof(double));
        res->bw = tp_median(b->tmp, reps + 1);
        memcpy(b->tmp, b->frac_r, (size_t)reps * sizeof(double));
        res->frac = tp_median(b->tmp, reps); /* sorts tmp */
        res->frac_min = b->tmp[0];
        res->frac_max = b->tmp[reps - 1];
    }
    double scratch[101];
    for (int q = 0; q < world && n > 0 && q < TP_PLAN_MAX_RANKS; q++) {
        for (int k = 0; k <= reps; k++) scratch[k] = b->probe[(size_t)k * world + q];
        res->rank_bw[q] = tp_median(scratch, reps + 1);
        for (int r = 0; r < reps; r++) scratch[r] = b->rank_frac[(size_t)r * world + q];
        res->rank_fr[q] = tp_median(scratch, reps);
    }
    for (int r = 0; r < reps && n > 0; r++) res->tg_rep[r] = (double)n / b->tg_s[r];
    /* tp_median sorts pp_s / tg_s: the per-rep figures are taken above */
    res->pp_tps = o->p > 0 ? (double)o->p / tp_median(b->pp_s, reps) : 0.0;
    res->tg_tps = n > 0 ? (double)n / tp_median(b->tg_s, reps) : 0.0;
    res->comm_frac = R->tg_ns_fwd ? (double)R->tg_ns_comm / (double)R->tg_ns_fwd : 0.0;
    if (R->tg_count) {
        res->cpt_ms = (double)R->tg_ns_compute / 1e6 / (double)R->tg_count;
        res->mpt_ms = (double)R->tg_ns_pcomm / 1e6 / (double)R->tg_count;
        res->bpt_sent = (double)R->tg_bytes / (double)R->tg_count;
        res->step_ms = R->tg_s_sum * 1e3 / (double)R->tg_count;
        res->fwd_ms = (double)R->tg_ns_fwd / 1e6 / (double)R->tg_count;
        for (int i = 0; i < 4; i++) res->ph_ms[i] = (double)R->tg_ns_phase[i] / 1e6 / (double)R->tg_count;
        res->allsum_ms = (double)R->tg_ns_comm / 1e6 / (double)R->tg_count;
        const double mm_ms = res->ph_ms[1] + res->ph_ms[3];
        res->mm_gbs = mm_ms > 0.0 ? b->rank_bytes[0] / (mm_ms * 1e6) : 0.0;
    }
}

/* How rank 0 moved the collectives' data (tp_comm_transport), "none" for one rank. */
static const char *gen_transport(const struct gen_run *R) { return tp_comm_transport(tp_parallel_comm(R->g.par)); }

static void gen_report_json(const struct gen_run *R, const struct gen_opts *o, const struct gen_result *res)
{
    const struct gen_bufs *b = &R->bufs;
    const tp_model_t *m = R->g.m;
    const int n = o->n, reps = o->reps, world = R->world;
    printf("{\"bench\":\"gen\",\"model\":");
    print_json_str(tp_model_name(m));
    printf(",\"type\":\"%s\",\"ranks\":%d,\"threads\":%d,\"isa\":\"%s\",\"prefetch\":\"%s\",\"attn_isa\":\"%s\","
           "\"pp_tokens\":%d,\"tg_tokens\":%d,\"reps\":%d,\"pp_tps\":%.2f,\"tg_tps\":%.2f,\"mem_bw_gbs\":%.2f,"
           "\"weight_bytes_per_token\":%llu,\"bw_fraction\":%.3f,\"tg_comm_frac\":%.3f,"
           "\"comm_dtype\":\"%s\",\"transport\":\"%s\",\"compute_ms_per_token\":%.3f,\"comm_ms_per_token\":%.3f,"
           "\"bytes_per_token\":%.0f,\"bw_method\":\"probe before each decode rep and after the last, "
           "%d MiB x %d passes, mean\",\"bw_fraction_min\":%.3f,\"bw_fraction_max\":%.3f",
           tp_wtype_name(tp_model_weight_type(m)), world, tp_model_n_threads(m), tp_kern_isa(),
           tp_kern_prefetch_name(tp_kern_prefetch()), tp_kern_attn_isa(), o->p, n, reps,
           res->pp_tps, res->tg_tps, res->bw, (unsigned long long)res->bpt, res->frac, res->comm_frac,
           tp_wire_dtype_name(R->pcfg.wire_dtype), gen_transport(R), res->cpt_ms,
           res->mpt_ms, res->bpt_sent, o->bw_mib,
           o->bw_passes, res->frac_min, res->frac_max);
    if (n > 0)
        printf(",\"tg_rank0_ms_per_token\":{\"step\":%.3f,\"forward\":%.3f,\"prep\":%.3f,\"matmul\":%.3f,"
               "\"attn\":%.3f,\"logits\":%.3f,\"all_sum\":%.3f,\"forward_rest\":%.3f,\"outside_forward\":%.3f},"
               "\"tg_rank0_matmul_weight_gbs\":%.2f",
               res->step_ms, res->fwd_ms, res->ph_ms[0], res->ph_ms[1], res->ph_ms[2], res->ph_ms[3], res->allsum_ms,
               gen_forward_rest(res), res->step_ms - res->fwd_ms, res->mm_gbs);
    if (o->comm_sync && n > 0) {
        printf(",\"comm_sync_ms_per_token\":%.3f,\"comm_wait_ms_per_token\":%.3f", R->tg_sync_ms, R->tg_wait_ms);
        if (!isnan(R->tg_sync_us[0]))
            printf(",\"comm_sync_us_per_call\":{\"step header\":%.3f,\"all_sum\":%.3f,\"argmax gather\":%.3f}",
                   R->tg_sync_us[0], R->tg_sync_us[1], R->tg_sync_us[2]);
    }
    if (res->moe)
        printf(",\"moe\":true,\"rank0_held_bytes\":%llu,\"rank0_expert_bytes\":%llu",
               (unsigned long long)tp_model_weight_bytes(m), (unsigned long long)tp_model_expert_weight_bytes(m));
    printf(",\"tg_tps_per_rep\":[");
    for (int r = 0; r < reps && n > 0; r++) printf("%s%.2f", r ? "," : "", res->tg_rep[r]);
    printf("],\"mem_bw_gbs_per_probe\":[");
    for (int r = 0; r <= reps && n > 0; r++) printf("%s%.2f", r ? "," : "", b->probe_sum[r]);
    printf("],\"bw_fraction_per_rep\":[");
    for (int r = 0; r < reps && n > 0; r++) printf("%s%.3f", r ? "," : "", b->frac_r[r]);
    printf("],\"bytes_read_per_token_per_rank\":[");
    for (int q = 0; q < world && n > 0; q++) printf("%s%.0f", q ? "," : "", b->rank_bytes[q]);
    printf("],\"mem_bw_gbs_per_rank\":[");
    for (int q = 0; q < world && n > 0; q++) printf("%s%.2f", q ? "," : "", res->rank_bw[q]);
    printf("],\"bw_fraction_per_rank\":[");
    for (int q = 0; q < world && n > 0; q++) printf("%s%.3f", q ? "," : "", res->rank_fr[q]);
    printf("]");
    if (o->nk > 0) {
        printf(",\"seq_steps\":[");
        for (int ki = 0; ki < o->nk; ki++) {
            const double *ph = R->k_phase[ki];
            printf("%s{\"seqs\":%d,\"step_ms\":%.3f,\"agg_tps\":%.2f,\"rank0_ms\":{\"forward\":%.3f,\"matmul\":%.3f,"
                   "\"attn\":%.3f,\"prep\":%.3f,\"rest\":%.3f}",
                   ki ? "," : "", o->klist[ki], R->k_ms[ki], o->klist[ki] * 1e3 / R->k_ms[ki], ph[0], ph[1], ph[2], ph[3],
                   ph[4]);
            if (res->moe)
                printf(",\"experts_per_layer\":%.2f,\"expert_bytes_per_step\":%.0f,\"bytes_ratio\":%.3f", res->k_xpl[ki],
                       R->k_xbytes[ki], res->k_pred[ki]);
            printf("}");
        }
        printf("]");
    }
    if (o->np_sizes > 0) {
        printf(",\"prefill_chunk\":%d,\"prefill\":[", o->chunk);
        for (int i = 0; i < o->np_sizes; i++)
            printf("%s{\"tokens\":%d,\"pp_tps\":%.2f,\"vs_first\":%.3f}", i ? "," : "", o->plist[i], R->p_tps[i],
                   R->p_tps[i] / R->p_tps[0]);
        printf("]");
    }
    if (o->verify > 0)
        printf(",\"verify_k\":%d,\"verify_depth\":%d,\"step1_ms\":%.3f,\"verify_step_ms\":%.3f,"
               "\"verify_step_ratio\":%.3f",
               o->verify, o->p, R->v_ms1, R->v_msk, R->v_ms1 > 0 ? R->v_msk / R->v_ms1 : 0.0);
    if (o->spec_mode != TP_SPEC_OFF) {
        printf(",\"spec\":{\"mode\":\"%s\",\"draft_max\":%d,\"prompt_tokens\":%d,\"identical\":%s",
               tp_spec_mode_name((enum tp_spec_mode)o->spec_mode), o->draft_max, R->spec_prompt,
               R->spec_same ? "true" : "false");
        for (int v = 0; v < 2; v++) {
            const struct gen_spec_stats *q = &R->spec[v];
            printf(",\"%s\":{\"tg_tps\":%.2f,\"tokens_per_step\":%.3f,\"acceptance\":%.3f,\"drafted\":%lld,"
                   "\"accepted\":%lld,\"collectives_per_token\":%.2f}",
                   v ? "speculative" : "plain", q->tps, q->steps ? (double)q->tokens / (double)q->steps : 0.0,
                   q->drafted ? (double)q->accepted / (double)q->drafted : 0.0, q->drafted, q->accepted,
                   q->tokens ? (double)q->collectives / (double)q->tokens : 0.0);
        }
        const struct tp_draft_place_result *dec = R->dm ? tp_parallel_draft_decision(R->g.par) : NULL;
        if (dec) {
            printf(",\"draft_placement\":\"%s\",\"draft_rank0_ms\":%.3f,\"draft_sharded_ms\":%.3f,"
                   "\"draft_allsum_us\":%.1f,\"draft_reason\":",
                   tp_spec_draft_is_sharded(R->dm) ? "sharded" : "rank0", dec->rank0_ms, dec->sharded_ms,
                   dec->allsum_us);
            print_json_str(dec->reason);
        }
        printf(",\"speedup\":%.3f}", R->spec[0].tps > 0 ? R->spec[1].tps / R->spec[0].tps : 0.0);
    }
    if (o->nd > 0) {
        printf(",\"kv_type\":\"%s\",\"decode_depth\":[", tp_kv_type_name(tp_model_kv_type(m)));
        for (int i = 0; i < o->nd; i++) {
            const double bound = depth_bound_ms(R, res->bpt, i);
            printf("%s{\"depth\":%d,\"ms_per_token\":%.3f,\"kv_bytes_per_token\":%.0f,\"mem_bw_gbs\":%.2f,"
                   "\"bound_ms\":%.3f,\"vs_bound\":%.3f,\"attn_flop_per_token\":%.0f,\"attn_gflops\":%.2f}",
                   i ? "," : "", o->dlist[i], R->d_ms[i], R->d_kv[i], R->d_bw[i], bound,
                   bound > 0.0 ? R->d_ms[i] / bound : 0.0, R->d_flop[i], depth_attn_gflops(R, o, i));
        }
        printf("]");
    }
    printf("}\n");
}

/* The --seqs table: each k's step time, its ratio to one sequence's, the aggregate rate and rank 0's split
 * of the step (and for a mixture of experts the experts each step read). */
static void gen_report_seqs(const struct gen_run *R, const struct gen_opts *o, const struct gen_result *res)
{
    const int n = o->n, reps = o->reps, world = R->world;
    if (o->seqs_ctx > 0)
        printf("decode steps of k sequences (one token each, %d steps after %d cached tokens each, median of "
               "%d):\n", n, o->seqs_ctx, reps);
    else
        printf("decode steps of k sequences (one token each, %d steps from empty caches, median of %d):\n", n,
               reps);
    if (res->moe)
        printf("(experts/layer: distinct experts the step's tokens selected%s, per layer; bytes x 1: the step's "
               "weight bytes, non-expert + those experts, over one sequence's: the step ratio the bytes "
               "predict)\n", world > 1 ? " among rank 0's" : "");
    printf("(matmuls, attention, norms and rest: rank 0's ms of a step, mean of every rep; matmuls count the "
           "logits', rest is all that is not these three, the all_sums included)\n");
    printf("%-6s %10s %12s", "seqs", "ms/step", "x 1 seq");
    if (res->moe) printf(" %14s %10s", "experts/layer", "bytes x 1");
    printf(" %12s %9s %9s %9s %9s\n", "agg t/s", "matmuls", "attention", "norms", "rest");
    for (int ki = 0; ki < o->nk; ki++) {
        const double *ph = R->k_phase[ki];
        printf("%-6d %10.2f ", o->klist[ki], R->k_ms[ki]);
        if (res->k1_ms > 0.0) printf("%12.2f", R->k_ms[ki] / res->k1_ms);
        else printf("%12s", "-");
        if (res->moe) printf(" %14.1f %10.2f", res->k_xpl[ki], res->k_pred[ki]);
        printf(" %12.2f %9.2f %9.2f %9.2f %9.2f\n", o->klist[ki] * 1e3 / R->k_ms[ki], ph[1], ph[2], ph[3], ph[4]);
    }
}

static void gen_report_text(const struct gen_run *R, const struct gen_opts *o, const struct gen_result *res)
{
    const struct gen_bufs *b = &R->bufs;
    const tp_model_t *m = R->g.m;
    const int p = o->p, n = o->n, reps = o->reps, world = R->world;
    const double bpt = (double)res->bpt;
    printf("model   %s (%s, %.1f MiB read per token%s), %d threads%s, %s kernels (prefetch %s), %s attention, loaded in "
           "%.1f s\n",
           tp_model_name(m), tp_wtype_name(tp_model_weight_type(m)), bpt / 1048576.0,
           world > 1 ? " by all ranks" : "", tp_model_n_threads(m), world > 1 ? " per rank" : "", tp_kern_isa(),
           tp_kern_prefetch_name(tp_kern_prefetch()), tp_kern_attn_isa(), R->t_load);
    if (res->moe)
        printf("experts active bytes: attention, routers, output head and the experts the decoded tokens selected "
               "(measured); rank 0 holds %.1f MiB of which %.1f MiB experts\n",
               (double)tp_model_weight_bytes(m) / 1048576.0, (double)tp_model_expert_weight_bytes(m) / 1048576.0);
    if (n > 0) {
        printf("memory  streaming read, median of %d probes %.2f GB/s%s (one before each decode rep and after the "
               "last; %d MiB x %d passes, %d threads, bytes / elapsed)\n",
               reps + 1, res->bw, world > 1 ? " summed over the ranks probing at once" : "", o->bw_mib,
               o->bw_passes, o->threads > 0 ? o->threads : tp_cpu_count());
        printf("%-4s %10s %12s %12s %10s\n", "rep", "tg t/s", "weight GB/s", "probe GB/s", "of bw");
        for (int r = 0; r < reps; r++)
            printf("%-4d %10.2f %12.2f %12.2f %9.1f%%\n", r, res->tg_rep[r], res->tg_rep[r] * bpt / 1e9,
                   0.5 * (b->probe_sum[r] + b->probe_sum[r + 1]), 100.0 * b->frac_r[r]);
    }
    printf("%-8s %10s %12s %10s\n", "test", "t/s", "GB/s", "of bw");
    if (p > 0) printf("pp%-6d %10.2f %12s %10s\n", p, res->pp_tps, "", "");
    if (n > 0) printf("tg%-6d %10.2f %12.2f %9.1f%%\n", n, res->tg_tps, res->tg_tps * bpt / 1e9, 100.0 * res->frac);
    printf("(median of %d; decode from an empty cache, EOS ignored", reps);
    if (n > 0)
        printf("; of bw = median of the per-rep fractions, range %.1f-%.1f%%", 100.0 * res->frac_min,
               100.0 * res->frac_max);
    printf(")\n");
    if (n > 0 && world > 1) {
        printf("per rank (each probed its own memory at the same moment as the others; median over reps):\n");
        printf("%-5s %14s %12s %12s %10s\n", "rank", "MiB/token", "weight GB/s", "probe GB/s", "of bw");
        for (int q = 0; q < world; q++)
            printf("%-5d %14.1f %12.2f %12.2f %9.1f%%\n", q, b->rank_bytes[q] / 1048576.0,
                   res->tg_tps * b->rank_bytes[q] / 1e9, res->rank_bw[q], 100.0 * res->rank_fr[q]);
    }
    if (n > 0)
        printf("per token (rank 0 of %d, comm dtype %s over %s): compute %.3f ms, comm %.3f ms, %.0f bytes sent\n",
               world, tp_wire_dtype_name(R->pcfg.wire_dtype), gen_transport(R), res->cpt_ms,
               res->mpt_ms, res->bpt_sent);
    if (n > 0)
        printf("decode step on rank 0, ms per token (mean of every rep): %.3f = forward %.3f [matmuls %.3f + logits "
               "%.3f (weights at %.2f GB/s), attention %.3f, norms and quantization %.3f, all_sum %.3f, rest %.3f] "
               "+ outside the forward %.3f\n",
               res->step_ms, res->fwd_ms, res->ph_ms[1], res->ph_ms[3], res->mm_gbs, res->ph_ms[2], res->ph_ms[0],
               res->allsum_ms, gen_forward_rest(res), res->step_ms - res->fwd_ms);
    if (o->comm_sync && n > 0) {
        printf("comm after every rank entered each collective (--comm-sync): %.3f ms per token; rank 0 waiting "
               "for the last rank to enter: %.3f ms per token\n", R->tg_sync_ms, R->tg_wait_ms);
        if (!isnan(R->tg_sync_us[0]))
            printf("  per call after every rank entered: step header %.1f us, all_sum %.1f us, argmax gather %.1f "
                   "us\n", R->tg_sync_us[0], R->tg_sync_us[1], R->tg_sync_us[2]);
    }
    if (o->np_sizes > 0) {
        printf("prefill by prompt length (%d tokens per call, median of %d):\n", o->chunk, reps);
        printf("%-8s %10s %10s\n", "tokens", "t/s", "x first");
        for (int i = 0; i < o->np_sizes; i++)
            printf("pp%-6d %10.2f %10.3f\n", o->plist[i], R->p_tps[i], R->p_tps[i] / R->p_tps[0]);
    }
    if (o->nd > 0) {
        printf("decode by depth (%d steps after D cached tokens, KV cache %s, median of %d; bound = (weight bytes + "
               "KV bytes read) / probe GB/s, probed after each prefill, right before the decode):\n",
               n, tp_kv_type_name(tp_model_kv_type(m)), reps);
        printf("%-8s %10s %12s %10s %10s %10s %10s %12s\n", "depth", "ms/token", "KV MiB/tok", "probe GB/s",
               "bound ms", "x bound", "attn GFLOP", "attn GFLOP/s");
        for (int i = 0; i < o->nd; i++) {
            const double bound = depth_bound_ms(R, res->bpt, i);
            printf("%-8d %10.3f %12.2f %10.2f %10.3f %10.3f %10.3f %12.1f\n", o->dlist[i], R->d_ms[i],
                   R->d_kv[i] / 1048576.0, R->d_bw[i], bound, bound > 0.0 ? R->d_ms[i] / bound : 0.0,
                   R->d_flop[i] / 1e9, depth_attn_gflops(R, o, i));
        }
        printf("attn GFLOP: 4 x head_dim x query heads x keys read, per token; attn GFLOP/s: that over the time the "
               "step takes beyond depth 0's\n");
    }
    if (o->verify > 0)
        printf("verify: a step scoring %d positions of one sequence after %d cached tokens %.3f ms, a one-token step "
               "%.3f ms: verify_step_ratio %.3f (median of %d)\n",
               o->verify + 1, o->p, R->v_msk, R->v_ms1, R->v_ms1 > 0 ? R->v_msk / R->v_ms1 : 0.0, n);
    if (o->spec_mode != TP_SPEC_OFF) {
        printf("speculative %s (draft max %d, %d prompt tokens, greedy; output %s the plain decode's):\n",
               tp_spec_mode_name((enum tp_spec_mode)o->spec_mode), o->draft_max, R->spec_prompt,
               R->spec_same ? "identical to" : "DIFFERENT from");
        printf("%-12s %10s %12s %12s %14s\n", "decode", "t/s", "tokens/step", "acceptance", "colls/token");
        for (int v = 0; v < 2; v++) {
            const struct gen_spec_stats *q = &R->spec[v];
            printf("%-12s %10.2f %12.3f %12.3f %14.2f\n", v ? "speculative" : "plain", q->tps,
                   q->steps ? (double)q->tokens / (double)q->steps : 0.0,
                   q->drafted ? (double)q->accepted / (double)q->drafted : 0.0,
                   q->tokens ? (double)q->collectives / (double)q->tokens : 0.0);
        }
    }
    if (o->nk > 0) gen_report_seqs(R, o, res);
}

/* ------------------------------------------------------------------ command */

int tp_bench_gen(int argc, char **argv)
{
    struct gen_opts o;
    int rc = gen_parse(argc, argv, &o);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    /* one rank, or a group from the environment (tpserve launch / mpirun): rank 0 measures and prints */
    struct gen_run R;
    memset(&R, 0, sizeof R);
    R.pcfg = tp_parallel_default_config();
    const char *prefix = NULL;
    if (tp_cli_group_config("bench gen", o.comm_dtype, o.kv_type, &R.pcfg, NULL, &prefix)) return 2;
    if (o.comm_sync) R.pcfg.comm.op_log = GEN_OP_LOG;
    tp_cli_setup_logging(prefix);
    if (tp_log_get_level() < TP_LOG_WARN) tp_log_set_level(TP_LOG_WARN);
    R.pcfg.shard_weights = o.shard_weights;
    R.pcfg.draft_path = o.draft_model;
    (void)tp_draft_placement_parse(o.draft_placement, &R.pcfg.draft_placement, NULL); /* checked by gen_parse */
    R.pcfg.draft_mem_bw_gbs = o.draft_mem_bw;
    R.pcfg.draft_allsum_us = o.draft_allsum_us;
    struct tp_error err = {0};
    if (tp_moe_split_parse(o.moe_split, &R.pcfg.moe_split, &err) != TP_OK)
        return tp_cli_fail("bench gen", "%s", err.msg);
    int exit_code = 1;
    if (gen_start(&R, &o, &err) != TP_OK) {
        tp_cli_fail("bench gen", "%s", err.msg);
    } else if (tp_parallel_rank(R.g.par) != 0) {
        enum tp_status st = tp_parallel_worker_loop(R.g.par);
        exit_code = 0;
        if (st != TP_OK) {
            tp_cli_fail("bench gen", "worker stopped: %s", tp_parallel_last_error(R.g.par));
            exit_code = tp_cli_exit_for(st);
        }
    } else if (o.draft_model &&
               (tp_parallel_draft_model(R.g.par)
                    ? tp_spec_draft_init_sharded(R.g.par, 1, &R.dm, &err)
                    : tp_spec_draft_init(o.draft_model, tp_model_n_ctx(R.g.m), 1, tp_model_n_threads(R.g.m),
                                         tp_model_hparams(R.g.m)->n_vocab, &R.dm, &err)) != TP_OK) {
        tp_cli_fail("bench gen", "%s", err.msg);
    } else if (gen_measure(&R, &o, &err) != TP_OK) {
        tp_cli_fail("bench gen", "%s", err.msg);
    } else {
        struct gen_result res;
        gen_summarize(&R, &o, &res);
        if (o.json) gen_report_json(&R, &o, &res);
        else gen_report_text(&R, &o, &res);
        exit_code = 0;
    }
    gen_run_free(&R);
    return exit_code;
}

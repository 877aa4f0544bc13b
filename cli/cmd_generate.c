/*
 * cli/cmd_generate.c - `tpserve generate`: load a model, tokenize a
 * prompt, prefill it in n_batch chunks, then sample and stream text token by
 * token (the streaming detokenizer never emits half a UTF-8 character), and
 * finish with prompt and generation tokens/sec on stderr.  With --spec
 * ngram each step feeds the last token plus up to --draft-max tokens drafted
 * by n-gram lookup (server/spec.h) and keeps the drafts the sampler accepts
 * (tp_sampler_sample_draft: the output is what plain decoding gives, or is
 * distributed as it), dropping the rest of the step's K/V with a clear.
 *
 * The model is driven through struct tp_gen_step (one "run this batch, give
 * me the logits" call), so a distributed driver can replace the single-rank
 * tp_model_forward without touching the generation loop.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/model.h"
#include "parallel/parallel.h"
#include "server/spec.h"

/* One forward step: sequence 0 forgets positions >= clear_from first (-1:
 * nothing), then the batch in, logits (full vocabulary, one row per flagged
 * token) out.  ctx is the driver's. */
struct tp_gen_step {
    void *ctx;
    enum tp_status (*step)(void *ctx, const struct tp_batch *b, int clear_from, float *logits);
    const char *(*last_error)(void *ctx);
};

static enum tp_status local_step(void *ctx, const struct tp_batch *b, int clear_from, float *logits)
{
    if (clear_from >= 0) tp_model_seq_truncate(ctx, 0, clear_from);
    return tp_model_forward(ctx, b, logits);
}
static const char *local_error(void *ctx) { return tp_model_last_error(ctx); }

/* Distributed driver (parallel/): rank 0 sends each step to every rank. */
static enum tp_status parallel_step(void *ctx, const struct tp_batch *b, int clear_from, float *logits)
{
    const int32_t seq0 = 0, from = clear_from;
    struct tp_step s = {*b, 0, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL};
    if (clear_from >= 0) {
        s.n_clear = 1;
        s.clear_seq = &seq0;
        s.clear_from = &from;
    }
    return tp_parallel_step(ctx, &s, logits);
}
static const char *parallel_error(void *ctx) { return tp_parallel_last_error(ctx); }

struct gen_opts {
    const char *prompt;
    int n_predict;
    struct tp_sampler_params sp;
    int quiet_stats;
    enum tp_spec_mode spec;
    int draft_max;
    const tp_comm_t *comm; /* for the collectives count (NULL: one rank) */
    tp_spec_draft_t *dm;   /* --spec draft: the draft model */
};

/* One generation's buffers (n_ctx + 1 tokens; logits: rows x n_vocab) and counters. */
struct gen {
    const struct tp_gen_step *drv;
    const struct gen_opts *o;
    tp_tokenizer_t *tok;
    int n_ctx, n_vocab;
    int32_t *ids, *pos, *seq; /* (n_ctx + 1): the prompt and the reply; a step's positions / sequences */
    int8_t *want;             /* (n_ctx + 1): logits wanted for this batch token */
    float *logits;            /* (rows, n_vocab) */
    tp_sampler_t *smp;
    tp_detok_t *dt;
    char text[1024];
    int n_prompt, n_predict;
    /* decode: the last step fed tokens at base .. base + k (its input, then k drafts) */
    int n_gen, n_tok, base, k, n_steps;
    long long n_drafted, n_accepted;
    uint64_t draft_passes0; /* the draft model's passes before the decode */
    int32_t draft[TP_SPEC_DRAFT_MAX];
    struct tp_spec_adapt adapt;
};

/* Tokenizes the prompt (BOS alone for an empty one), fits -n to the context, starts the sampler and
 * detokenizer after the prompt and echoes it.  0, or 1 after printing why. */
static int gen_prompt(struct gen *g)
{
    const struct gen_opts *o = g->o;
    tp_tokenizer_t *tok = g->tok;
    int n_prompt = tp_tokenizer_encode(tok, o->prompt, strlen(o->prompt), tp_tokenizer_add_bos(tok), 1, g->ids,
                                       g->n_ctx);
    if (n_prompt < 0) return tp_cli_fail("generate", "the prompt is not valid UTF-8 text");
    if (n_prompt > g->n_ctx - 1)
        return tp_cli_fail("generate", "the prompt is %d tokens, longer than the context (%d); raise --ctx-size",
                           n_prompt, g->n_ctx);
    if (n_prompt == 0) {
        int bos = tp_tokenizer_bos(tok);
        if (bos < 0) return tp_cli_fail("generate", "empty prompt and the model has no BOS token: give -p TEXT");
        g->ids[n_prompt++] = bos;
    }
    g->n_prompt = n_prompt;
    g->n_predict = o->n_predict;
    if (g->n_predict > g->n_ctx - n_prompt) {
        tp_log(TP_LOG_WARN, "generate", "-n %d does not fit the context of %d after a %d-token prompt; generating %d",
               g->n_predict, g->n_ctx, n_prompt, g->n_ctx - n_prompt);
        g->n_predict = g->n_ctx - n_prompt;
    }
    if (tp_sampler_init(&o->sp, g->n_vocab, &g->smp) != TP_OK || tp_detok_init(tok, &g->dt) != TP_OK)
        return tp_cli_fail("generate", "cannot create the sampler / detokenizer");
    for (int i = 0; i < n_prompt; i++) tp_sampler_accept(g->smp, g->ids[i]);
    /* Continue after the prompt: feed its last token to the detokenizer and drop
     * the text, so SentencePiece's "strip the first leading space" rule does not
     * eat the space before the first generated word. */
    if (n_prompt > 0) (void)tp_detok_push(g->dt, g->ids[n_prompt - 1], g->text, sizeof(g->text));
    fputs(o->prompt, stdout);
    fflush(stdout);
    return 0;
}

/* The prompt in chunks of at most n_batch (a model config value: 512); logits for its last token. */
static int gen_prefill(struct gen *g)
{
    const int chunk = 512;
    for (int i = 0; i < g->n_prompt; i += chunk) {
        int n = TP_MIN(chunk, g->n_prompt - i);
        for (int j = 0; j < n; j++) {
            g->pos[j] = i + j;
            g->seq[j] = 0;
            g->want[j] = (i + j == g->n_prompt - 1);
        }
        struct tp_batch b = {n, g->ids + i, g->pos, g->seq, g->want};
        if (g->drv->step(g->drv->ctx, &b, -1, g->logits) != TP_OK)
            return tp_cli_fail("generate", "forward pass failed: %s", g->drv->last_error(g->drv->ctx));
    }
    return 0;
}

/* The last step's logits rows: row j chooses the token at base + j + 1, printed as it comes.  The walk
 * stops at the first token that is not the next draft.  *done at end of generation, a stop or the
 * context's end; *accepted drafts.  0, or 1 after printing why. */
static int gen_take_rows(struct gen *g, int *done, int *accepted)
{
    *done = 0;
    *accepted = 0;
    for (int j = 0; j <= g->k; j++) {
        struct tp_sample_result res;
        int acc = 0;
        const float *row = g->logits + (size_t)j * (size_t)g->n_vocab;
        enum tp_status st = j < g->k ? tp_sampler_sample_draft(g->smp, row, g->draft[j], &res, &acc)
                                     : tp_sampler_sample(g->smp, row, &res);
        if (st != TP_OK) return tp_cli_fail("generate", "sampling failed");
        g->n_gen++;
        *accepted += acc;
        if (tp_tokenizer_is_eog(g->tok, res.id)) {
            *done = 1;
            break;
        }
        tp_sampler_accept(g->smp, res.id);
        g->ids[g->n_tok++] = res.id;
        size_t nb = tp_detok_push(g->dt, res.id, g->text, sizeof(g->text));
        if (nb) {
            fwrite(g->text, 1, nb, stdout);
            fflush(stdout);
        }
        if (g->n_gen == g->n_predict || g->base + j + 2 >= g->n_ctx) {
            *done = 1;
            break;
        }
        if (!acc) break;
    }
    return 0;
}

/* The next step after a accepted drafts: the new token at base + a + 1 (after a clear of the rejected
 * drafts' positions), with new drafts after it.  0, or 1 after printing why. */
static int gen_feed_next(struct gen *g, int a)
{
    const struct gen_opts *o = g->o;
    const int clear_from = a < g->k ? g->base + a + 1 : -1; /* the rejected drafts' positions */
    g->base += a + 1;
    int k = 0;
    if (o->spec != TP_SPEC_OFF) {
        int kk = TP_MIN(tp_spec_adapt_k(&g->adapt), g->n_predict - g->n_gen - 1);
        kk = TP_MIN(kk, g->n_ctx - 1 - g->base);
        if (kk > 0)
            k = o->spec == TP_SPEC_NGRAM ? tp_spec_ngram_draft(g->ids, g->n_tok, kk, g->draft)
                                         : tp_spec_draft_propose(o->dm, 0, g->ids, g->n_tok, kk, g->draft);
        if (k < 0) return tp_cli_fail("generate", "the draft model failed: %s", tp_spec_draft_last_error(o->dm));
    }
    g->k = k;
    int32_t btok[1 + TP_SPEC_DRAFT_MAX];
    btok[0] = g->ids[g->n_tok - 1];
    for (int j = 0; j <= k; j++) {
        if (j > 0) btok[j] = g->draft[j - 1];
        g->pos[j] = g->base + j;
        g->seq[j] = 0;
        g->want[j] = 1;
    }
    struct tp_batch b = {k + 1, btok, g->pos, g->seq, g->want};
    if (g->drv->step(g->drv->ctx, &b, clear_from, g->logits) != TP_OK)
        return tp_cli_fail("generate", "forward pass failed: %s", g->drv->last_error(g->drv->ctx));
    return 0;
}

/* Decode until end of generation, -n or the context's end. 0, or 1 after printing why. */
static int gen_decode(struct gen *g)
{
    g->n_tok = g->n_prompt;
    g->base = g->n_prompt - 1;
    tp_spec_adapt_init(&g->adapt, g->o->draft_max > 0 ? g->o->draft_max : 1);
    while (g->n_predict > 0) {
        int done, a;
        g->n_steps++;
        if (gen_take_rows(g, &done, &a) != 0) return 1;
        g->n_drafted += g->k;
        g->n_accepted += a;
        if (g->k > 0) tp_spec_adapt_update(&g->adapt, g->k, a);
        if (done) break;
        if (gen_feed_next(g, a) != 0) return 1;
    }
    return 0;
}

/* Prompt and generation tokens/s, steps, collectives per token and drafts accepted, on stderr. */
static void gen_report(const struct gen *g, double t_prompt, double t_gen, const struct tp_comm_stats *cs0,
                       const struct tp_comm_stats *cs1)
{
    const struct gen_opts *o = g->o;
    fprintf(stderr, "\nprompt: %d tokens in %.3f s (%.1f tokens/s); generation: %d tokens in %.3f s (%.1f tokens/s)",
            g->n_prompt, t_prompt, t_prompt > 0 ? g->n_prompt / t_prompt : 0.0, g->n_gen, t_gen,
            t_gen > 0 ? g->n_gen / t_gen : 0.0);
    fprintf(stderr, "; %d steps, %.2f tokens/step, %.1f collectives/token (%llu in all)", g->n_steps,
            g->n_steps ? (double)g->n_gen / g->n_steps : 0.0,
            g->n_gen ? (double)(cs1->n_ops - cs0->n_ops) / g->n_gen : 0.0,
            (unsigned long long)(cs1->n_ops - cs0->n_ops));
    if (o->spec != TP_SPEC_OFF)
        fprintf(stderr, "; speculative %s: %lld of %lld drafted tokens accepted (%.3f)", tp_spec_mode_name(o->spec),
                g->n_accepted, g->n_drafted, g->n_drafted ? (double)g->n_accepted / (double)g->n_drafted : 0.0);
    if (o->dm) /* a sharded draft's passes are steps on every rank: their collectives are in the count above */
        fprintf(stderr, "; draft model %s: %llu passes", tp_spec_draft_is_sharded(o->dm) ? "sharded" : "on rank 0",
                (unsigned long long)(tp_spec_draft_passes(o->dm) - g->draft_passes0));
    fputc('\n', stderr);
}

/* Generation loop over any step driver.  Returns the exit code. */
static int generate(const struct tp_gen_step *drv, tp_model_t *m, const struct gen_opts *o)
{
    int rc_exit = 1;
    struct gen *g = calloc(1, sizeof *g);
    if (!g) return tp_cli_fail("generate", "out of memory");
    g->drv = drv;
    g->o = o;
    g->tok = tp_model_tokenizer(m);
    g->n_ctx = tp_model_n_ctx(m);
    g->n_vocab = tp_model_hparams(m)->n_vocab;
    const int rows = 1 + (o->spec != TP_SPEC_OFF ? o->draft_max : 0);
    g->ids = calloc((size_t)g->n_ctx + 1, sizeof(int32_t));
    g->pos = calloc((size_t)g->n_ctx + 1, sizeof(int32_t));
    g->seq = calloc((size_t)g->n_ctx + 1, sizeof(int32_t));
    g->want = calloc((size_t)g->n_ctx + 1, 1);
    g->logits = malloc((size_t)rows * (size_t)g->n_vocab * sizeof(float));
    if (!g->ids || !g->pos || !g->seq || !g->want || !g->logits) {
        tp_cli_fail("generate", "out of memory");
        goto out;
    }
    if (gen_prompt(g) != 0) goto out;
    double t0 = tp_now_s();
    if (gen_prefill(g) != 0) goto out;
    double t_prompt = tp_now_s() - t0;
    struct tp_comm_stats cs0 = {0}, cs1 = {0};
    if (o->comm) tp_comm_get_stats(o->comm, &cs0);
    g->draft_passes0 = tp_spec_draft_passes(o->dm);
    double t1 = tp_now_s();
    if (gen_decode(g) != 0) goto out;
    double t_gen = tp_now_s() - t1;
    if (o->comm) tp_comm_get_stats(o->comm, &cs1);
    size_t nb = tp_detok_flush(g->dt, g->text, sizeof(g->text));
    if (nb) fwrite(g->text, 1, nb, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (!o->quiet_stats) gen_report(g, t_prompt, t_gen, &cs0, &cs1);
    rc_exit = 0;
out:
    tp_detok_free(g->dt);
    tp_sampler_free(g->smp);
    free(g->ids);
    free(g->pos);
    free(g->seq);
    free(g->want);
    free(g->logits);
    free(g);
    return rc_exit;
}

/* --spec, --draft-model and the placement flags: 0 with *mode and *place set, or 2 after a usage error. */
static int gen_check_spec(const char *spec, const char *draft_model, const char *placement, float bw, float us,
                          int *mode, enum tp_draft_placement *place)
{
    struct tp_error err = {0};
    *mode = tp_spec_mode_parse(spec);
    if (*mode < 0) {
        fprintf(stderr, "tpserve generate: --spec %s: want off, ngram or draft\n", spec);
        return 2;
    }
    if ((*mode == TP_SPEC_DRAFT) != (draft_model != NULL)) {
        fprintf(stderr, "tpserve generate: %s\n",
                draft_model ? "--draft-model needs --spec draft" : "--spec draft needs --draft-model FILE");
        return 2;
    }
    if (tp_draft_placement_parse(placement, place, &err) != TP_OK) {
        fprintf(stderr, "tpserve generate: %s\n", err.msg);
        return 2;
    }
    if (!(bw >= 0) || !(us >= 0)) {
        fprintf(stderr, "tpserve generate: --draft-mem-bw and --draft-allsum-us take figures >= 0 (0: measured)\n");
        return 2;
    }
    return 0;
}

/* Rank 0: the draft model where tp_parallel_init put it (its decision logged): sharded in par, or loaded
 * here on rank 0. */
static enum tp_status gen_draft_open(tp_parallel_t *par, const char *path, int threads, tp_spec_draft_t **dm,
                                     struct tp_error *err)
{
    const struct tp_draft_place_result *dec = tp_parallel_draft_decision(par);
    if (dec) tp_log(TP_LOG_INFO, "generate", "%s", dec->reason);
    const tp_model_t *m = tp_parallel_model(par);
    return tp_parallel_draft_model(par) ? tp_spec_draft_init_sharded(par, 1, dm, err)
                                        : tp_spec_draft_init(path, tp_model_n_ctx(m), 1, threads,
                                                             tp_model_hparams(m)->n_vocab, dm, err);
}

int tp_cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *prompt = "", *shard_weights = NULL, *moe_split = "auto", *comm_dtype = "f32", *kv_type = "auto";
    int n_predict = 128, threads = 0, ctx = 0, top_k = 40, quiet = 0, draft_max = 4;
    const char *spec = "off", *draft_model = NULL, *draft_placement = "auto";
    float draft_mem_bw = 0.0f, draft_allsum_us = 0.0f;
    float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat = 1.0f;
    uint64_t seed = 0;
    int seed_set = 0;
    const struct tp_opt opts[] = {
        {"model", 'm', TP_OPT_STRING, &model, "FILE.gguf", "model file (required)", 0, 0},
        {"prompt", 'p', TP_OPT_STRING, &prompt, "TEXT", "prompt text (default: empty, start from BOS)", 0, 0},
        {"n-predict", 'n', TP_OPT_INT, &n_predict, "N", "tokens to generate (default 128)", 0, 1 << 24},
        {"temp", 0, TP_OPT_FLOAT, &temp, "T", "temperature, 0 = greedy (default 0.8)", 0, 100},
        {"top-k", 0, TP_OPT_INT, &top_k, "K", "keep the K most likely tokens, 0 = off (default 40)", 0, 1 << 24},
        {"top-p", 0, TP_OPT_FLOAT, &top_p, "P", "nucleus sampling, 1 = off (default 0.95)", 0, 1},
        {"min-p", 0, TP_OPT_FLOAT, &min_p, "P", "drop tokens below P x the top probability (default 0.05)", 0, 1},
        {"repeat-penalty", 0, TP_OPT_FLOAT, &repeat, "R", "repetition penalty, 1 = off (default 1)", 0, 10},
        {"seed", 0, TP_OPT_U64, &seed, "S", "random seed (default: from the clock)", 0, 0},
        {"threads", 't', TP_OPT_INT, &threads, "T", "compute threads (default: all cores)", 1, 1024},
        {"ctx-size", 'c', TP_OPT_INT, &ctx, "C", "context positions (default: min(trained, 4096))", 1, 1 << 24},
        {"quiet-stats", 0, TP_OPT_FLAG, &quiet, NULL, "do not print the tokens/s line", 0, 0},
        {"shard-weights", 0, TP_OPT_LIST, &shard_weights, "W,W,..", "under launch/mpirun: share per rank (default equal)", 0, 0},
        {"moe-split", 0, TP_OPT_STRING, &moe_split, "S", TP_CLI_MOE_SPLIT_HELP, 0, 0},
        {"comm-dtype", 0, TP_OPT_STRING, &comm_dtype, "T", "under launch/mpirun: f32|f16|bf16|q8 activations on the wire", 0, 0},
        {"kv-type", 0, TP_OPT_STRING, &kv_type, "T", TP_CLI_KV_TYPE_HELP, 0, 0},
        {"spec", 0, TP_OPT_STRING, &spec, "MODE",
         "speculative decoding: off (default), ngram (draft from the prompt and output so far) or draft (a smaller "
         "model decodes the drafts: --draft-model); the drafts are verified in one step (docs/speculative.md)", 0,
         0},
        {"draft-model", 0, TP_OPT_STRING, &draft_model, "FILE",
         "--spec draft: a smaller GGUF with the model's vocabulary (every rank gives the same)", 0, 0},
        {"draft-placement", 0, TP_OPT_STRING, &draft_placement, "P", TP_CLI_DRAFT_PLACEMENT_HELP, 0, 0},
        {"draft-mem-bw", 0, TP_OPT_FLOAT, &draft_mem_bw, "GBS", TP_CLI_DRAFT_MEM_BW_HELP, 0, 0},
        {"draft-allsum-us", 0, TP_OPT_FLOAT, &draft_allsum_us, "US", TP_CLI_DRAFT_ALLSUM_HELP, 0, 0},
        {"draft-max", 0, TP_OPT_INT, &draft_max, "K", "--spec: drafted tokens per step, 1..16 (default 4)", 1,
         TP_SPEC_DRAFT_MAX},
        {NULL, 0, 0, NULL, NULL, NULL, 0, 0}};
    int np = 0;
    /* detect an explicit --seed so 0 is a valid seed */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--seed") == 0 || strncmp(argv[i], "--seed=", 7) == 0) seed_set = 1;
    int prc = tp_cli_parse("generate", "Usage: tpserve generate -m MODEL [-p PROMPT] [-n N] [options]", opts, argc, argv, NULL, 0,
                           &np, NULL, NULL);
    TP_CLI_RETURN_UNLESS_PARSED(prc);
    if (!model) {
        fprintf(stderr, "tpserve generate: -m MODEL is required\n");
        return 2;
    }
    int spec_mode;
    enum tp_draft_placement dplace;
    if (gen_check_spec(spec, draft_model, draft_placement, draft_mem_bw, draft_allsum_us, &spec_mode, &dplace))
        return 2;
    /* One rank, or a group from the environment (tpserve launch / mpirun):
     * every rank computes its slice, rank 0 samples and prints. */
    struct tp_error err = {0};
    struct tp_parallel_config pc = tp_parallel_default_config();
    const char *prefix = NULL;
    if (tp_cli_group_config("generate", comm_dtype, kv_type, &pc, NULL, &prefix)) return 2;
    tp_cli_setup_logging(prefix);
    pc.shard_weights = shard_weights;
    if (tp_moe_split_parse(moe_split, &pc.moe_split, &err) != TP_OK) return tp_cli_fail("generate", "%s", err.msg);
    struct tp_model_config *cfg = &pc.model;
    cfg->path = model;
    cfg->n_threads = threads;
    cfg->n_ctx = ctx;
    cfg->n_seq = 1;
    cfg->n_batch = 512; /* >= 1 + --draft-max */
    pc.draft_path = draft_model;
    pc.draft_placement = dplace;
    pc.draft_mem_bw_gbs = draft_mem_bw;
    pc.draft_allsum_us = draft_allsum_us;
    tp_parallel_t *par = NULL;
    if (tp_parallel_init(&pc, &par, &err) != TP_OK) return tp_cli_fail("generate", "%s", err.msg);
    if (tp_parallel_rank(par) != 0) {
        int code = 0;
        enum tp_status st = tp_parallel_worker_loop(par);
        if (st != TP_OK) {
            tp_cli_fail("generate", "worker stopped: %s", tp_parallel_last_error(par));
            code = tp_cli_exit_for(st);
        }
        tp_parallel_free(par);
        return code;
    }
    tp_model_t *m = tp_parallel_model(par);

    struct gen_opts o;
    memset(&o, 0, sizeof(o));
    o.prompt = prompt;
    o.n_predict = n_predict;
    o.quiet_stats = quiet;
    o.sp = tp_sampler_default_params();
    o.sp.temperature = temp;
    o.sp.top_k = top_k;
    o.sp.top_p = top_p;
    o.sp.min_p = min_p;
    o.sp.repetition_penalty = repeat;
    o.sp.seed = seed_set ? seed : tp_now_ns();
    o.spec = (enum tp_spec_mode)spec_mode;
    o.draft_max = draft_max;
    o.comm = tp_parallel_comm(par);
    tp_spec_draft_t *dm = NULL;
    if (spec_mode == TP_SPEC_DRAFT) {
        if (gen_draft_open(par, draft_model, threads, &dm, &err) != TP_OK) {
            tp_parallel_free(par);
            return tp_cli_fail("generate", "%s", err.msg);
        }
        o.dm = dm;
    }
    struct tp_gen_step drv = {par, parallel_step, parallel_error};
    (void)local_step;
    (void)local_error;
    int rc = generate(&drv, m, &o);
    tp_spec_draft_free(dm);
    tp_parallel_free(par);
    return rc;
}

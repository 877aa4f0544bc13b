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

/* Generation loop over any step driver.  Returns the exit code. */
static int generate(const struct tp_gen_step *drv, tp_model_t *m, const struct gen_opts *o)
{
    int rc_exit = 1;
    tp_tokenizer_t *tok = tp_model_tokenizer(m);
    const struct tp_hparams *hp = tp_model_hparams(m);
    int n_ctx = tp_model_n_ctx(m), n_vocab = hp->n_vocab;
    const int rows = 1 + (o->spec != TP_SPEC_OFF ? o->draft_max : 0);
    int32_t *ids = calloc((size_t)n_ctx + 1, sizeof(int32_t));
    int32_t *pos = calloc((size_t)n_ctx + 1, sizeof(int32_t));
    int32_t *seq = calloc((size_t)n_ctx + 1, sizeof(int32_t));
    int8_t *want = calloc((size_t)n_ctx + 1, 1);
    float *logits = malloc((size_t)rows * (size_t)n_vocab * sizeof(float));
    tp_sampler_t *smp = NULL;
    tp_detok_t *dt = NULL;
    char text[1024];
    if (!ids || !pos || !seq || !want || !logits) {
        tp_cli_fail("generate", "out of memory");
        goto out;
    }
    int n_prompt = tp_tokenizer_encode(tok, o->prompt, strlen(o->prompt), tp_tokenizer_add_bos(tok), 1, ids, n_ctx);
    if (n_prompt < 0) {
        tp_cli_fail("generate", "the prompt is not valid UTF-8 text");
        goto out;
    }
    if (n_prompt > n_ctx - 1) {
        tp_cli_fail("generate", "the prompt is %d tokens, longer than the context (%d); raise --ctx-size", n_prompt, n_ctx);
        goto out;
    }
    if (n_prompt == 0) {
        int bos = tp_tokenizer_bos(tok);
        if (bos < 0) {
            tp_cli_fail("generate", "empty prompt and the model has no BOS token: give -p TEXT");
            goto out;
        }
        ids[n_prompt++] = bos;
    }
    int n_predict = o->n_predict;
    if (n_predict > n_ctx - n_prompt) {
        tp_log(TP_LOG_WARN, "generate", "-n %d does not fit the context of %d after a %d-token prompt; generating %d",
               n_predict, n_ctx, n_prompt, n_ctx - n_prompt);
        n_predict = n_ctx - n_prompt;
    }
    if (tp_sampler_init(&o->sp, n_vocab, &smp) != TP_OK || tp_detok_init(tok, &dt) != TP_OK) {
        tp_cli_fail("generate", "cannot create the sampler / detokenizer");
        goto out;
    }
    for (int i = 0; i < n_prompt; i++) tp_sampler_accept(smp, ids[i]);
    /* Continue after the prompt: feed its last token to the detokenizer and drop
     * the text, so SentencePiece's "strip the first leading space" rule does not
     * eat the space before the first generated word. */
    if (n_prompt > 0) (void)tp_detok_push(dt, ids[n_prompt - 1], text, sizeof(text));
    fputs(o->prompt, stdout);
    fflush(stdout);

    /* prefill in chunks of at most n_batch (a model config value: 512) */
    int chunk = 512;
    double t0 = tp_now_s();
    for (int i = 0; i < n_prompt; i += chunk) {
        int n = TP_MIN(chunk, n_prompt - i);
        for (int j = 0; j < n; j++) {
            pos[j] = i + j;
            seq[j] = 0;
            want[j] = (i + j == n_prompt - 1);
        }
        struct tp_batch b = {n, ids + i, pos, seq, want};
        if (drv->step(drv->ctx, &b, -1, logits) != TP_OK) {
            tp_cli_fail("generate", "forward pass failed: %s", drv->last_error(drv->ctx));
            goto out;
        }
    }
    double t_prompt = tp_now_s() - t0;

    /* Decode.  The last step fed tokens at positions base .. base + k (its input, then k drafts) and left a
     * logits row for each: row j chooses the token at base + j + 1.  The walk stops at the first token that
     * is not the next draft; it is fed at base + a + 1 in the next step (after a clear of the rejected
     * drafts' positions) with the new drafts after it. */
    int n_gen = 0, n_tok = n_prompt, base = n_prompt - 1, k = 0, n_steps = 0;
    long long n_drafted = 0, n_accepted = 0;
    int32_t draft[TP_SPEC_DRAFT_MAX];
    struct tp_spec_adapt adapt;
    tp_spec_adapt_init(&adapt, o->draft_max > 0 ? o->draft_max : 1);
    struct tp_comm_stats cs0 = {0}, cs1 = {0};
    if (o->comm) tp_comm_get_stats(o->comm, &cs0);
    double t1 = tp_now_s();
    while (n_predict > 0) {
        int done = 0, a = 0;
        n_steps++;
        for (int j = 0; j <= k; j++) {
            struct tp_sample_result res;
            int acc = 0;
            const float *row = logits + (size_t)j * (size_t)n_vocab;
            enum tp_status st = j < k ? tp_sampler_sample_draft(smp, row, draft[j], &res, &acc)
                                      : tp_sampler_sample(smp, row, &res);
            if (st != TP_OK) {
                tp_cli_fail("generate", "sampling failed");
                goto out;
            }
            n_gen++;
            a += acc;
            if (tp_tokenizer_is_eog(tok, res.id)) {
                done = 1;
                break;
            }
            tp_sampler_accept(smp, res.id);
            ids[n_tok++] = res.id;
            size_t nb = tp_detok_push(dt, res.id, text, sizeof(text));
            if (nb) {
                fwrite(text, 1, nb, stdout);
                fflush(stdout);
            }
            if (n_gen == n_predict || base + j + 2 >= n_ctx) {
                done = 1;
                break;
            }
            if (!acc) break;
        }
        n_drafted += k;
        n_accepted += a;
        if (k > 0) tp_spec_adapt_update(&adapt, k, a);
        if (done) break;
        const int clear_from = a < k ? base + a + 1 : -1; /* the rejected drafts' positions */
        base += a + 1;
        k = 0;
        if (o->spec != TP_SPEC_OFF) {
            int kk = TP_MIN(tp_spec_adapt_k(&adapt), n_predict - n_gen - 1);
            kk = TP_MIN(kk, n_ctx - 1 - base);
            if (kk > 0)
                k = o->spec == TP_SPEC_NGRAM ? tp_spec_ngram_draft(ids, n_tok, kk, draft)
                                             : tp_spec_draft_propose(o->dm, 0, ids, n_tok, kk, draft);
            if (k < 0) {
                tp_cli_fail("generate", "the draft model failed: %s", tp_spec_draft_last_error(o->dm));
                goto out;
            }
        }
        int32_t btok[1 + TP_SPEC_DRAFT_MAX];
        btok[0] = ids[n_tok - 1];
        for (int j = 0; j <= k; j++) {
            if (j > 0) btok[j] = draft[j - 1];
            pos[j] = base + j;
            seq[j] = 0;
            want[j] = 1;
        }
        struct tp_batch b = {k + 1, btok, pos, seq, want};
        if (drv->step(drv->ctx, &b, clear_from, logits) != TP_OK) {
            tp_cli_fail("generate", "forward pass failed: %s", drv->last_error(drv->ctx));
            goto out;
        }
    }
    double t_gen = tp_now_s() - t1;
    if (o->comm) tp_comm_get_stats(o->comm, &cs1);
    size_t nb = tp_detok_flush(dt, text, sizeof(text));
    if (nb) fwrite(text, 1, nb, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (!o->quiet_stats) {
        fprintf(stderr, "\nprompt: %d tokens in %.3f s (%.1f tokens/s); generation: %d tokens in %.3f s (%.1f tokens/s)",
                n_prompt, t_prompt, t_prompt > 0 ? n_prompt / t_prompt : 0.0, n_gen, t_gen,
                t_gen > 0 ? n_gen / t_gen : 0.0);
        fprintf(stderr, "; %d steps, %.2f tokens/step, %.1f collectives/token", n_steps,
                n_steps ? (double)n_gen / n_steps : 0.0, n_gen ? (double)(cs1.n_ops - cs0.n_ops) / n_gen : 0.0);
        if (o->spec != TP_SPEC_OFF)
            fprintf(stderr, "; speculative %s: %lld of %lld drafted tokens accepted (%.3f)", tp_spec_mode_name(o->spec),
                    n_accepted, n_drafted, n_drafted ? (double)n_accepted / (double)n_drafted : 0.0);
        fputc('\n', stderr);
    }
    rc_exit = 0;
out:
    tp_detok_free(dt);
    tp_sampler_free(smp);
    free(ids);
    free(pos);
    free(seq);
    free(want);
    free(logits);
    return rc_exit;
}

int tp_cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *prompt = "", *shard_weights = NULL, *moe_split = "auto", *comm_dtype = "f32", *kv_type = "f16";
    int n_predict = 128, threads = 0, ctx = 0, top_k = 40, quiet = 0, draft_max = 4;
    const char *spec = "off", *draft_model = NULL;
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
         "--spec draft: a smaller GGUF with the model's vocabulary, run on rank 0", 0, 0},
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
    const int spec_mode = tp_spec_mode_parse(spec);
    if (spec_mode < 0) {
        fprintf(stderr, "tpserve generate: --spec %s: want off, ngram or draft\n", spec);
        return 2;
    }
    if ((spec_mode == TP_SPEC_DRAFT) != (draft_model != NULL)) {
        fprintf(stderr, "tpserve generate: %s\n",
                draft_model ? "--draft-model needs --spec draft" : "--spec draft needs --draft-model FILE");
        return 2;
    }
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
        if (tp_spec_draft_init(draft_model, tp_model_n_ctx(m), 1, threads, tp_model_hparams(m)->n_vocab, &dm, &err) !=
            TP_OK) {
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

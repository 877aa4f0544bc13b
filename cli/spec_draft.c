/*
 * cli/spec_draft.c - a draft model for speculative decoding on rank 0 (see
 * cli.h, struct tp_cli_draft): the smaller model decodes k tokens greedily
 * after the sequence, and the target model verifies them in one step
 * (cmd_generate.c, bench_gen.c).  Its cache follows the sequence by
 * comparison: whatever it holds that the sequence no longer has (rejected
 * drafts) is overwritten by the next feed.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/model.h"

void tp_cli_draft_free(struct tp_cli_draft *d)
{
    if (!d) return;
    tp_model_free(d->m);
    free(d->hist);
    free(d->tok);
    free(d->pos);
    free(d->seq);
    free(d->want);
    free(d->logits);
    memset(d, 0, sizeof *d);
}

enum tp_status tp_cli_draft_init(const char *path, int n_ctx, int threads, int n_vocab, struct tp_cli_draft *d,
                                 struct tp_error *err)
{
    memset(d, 0, sizeof *d);
    struct tp_model_config cfg = tp_model_default_config();
    cfg.path = path;
    cfg.n_threads = threads;
    cfg.n_ctx = n_ctx;
    cfg.n_seq = 1;
    cfg.n_batch = 256;
    enum tp_status st = tp_model_init(&cfg, &d->m, err);
    if (st != TP_OK) return st;
    const int dv = tp_model_hparams(d->m)->n_vocab;
    if (dv != n_vocab) {
        tp_cli_draft_free(d);
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "--draft-model %s has %d tokens in its vocabulary, the model %d: a draft model must "
                            "share the model's vocabulary (e.g. a smaller model of the same family)",
                            path, dv, n_vocab);
    }
    d->n_ctx = tp_model_n_ctx(d->m);
    d->n_batch = cfg.n_batch;
    d->n_vocab = n_vocab;
    d->hist = calloc((size_t)d->n_ctx + 1, sizeof(int32_t));
    d->tok = calloc((size_t)d->n_batch, sizeof(int32_t));
    d->pos = calloc((size_t)d->n_batch, sizeof(int32_t));
    d->seq = calloc((size_t)d->n_batch, sizeof(int32_t));
    d->want = calloc((size_t)d->n_batch, 1);
    d->logits = malloc(sizeof(float) * (size_t)n_vocab);
    if (!d->hist || !d->tok || !d->pos || !d->seq || !d->want || !d->logits) {
        tp_cli_draft_free(d);
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory for the draft model's buffers");
    }
    return TP_OK;
}

static int32_t argmax(const float *v, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Feed toks[0..n) at positions from p0, logits of the last; TP_OK or the model's error. */
static enum tp_status feed(struct tp_cli_draft *d, const int32_t *toks, int n, int p0)
{
    for (int c = 0; c < n; c += d->n_batch) {
        const int m = TP_MIN(d->n_batch, n - c);
        for (int i = 0; i < m; i++) {
            d->tok[i] = toks[c + i];
            d->pos[i] = p0 + c + i;
            d->seq[i] = 0;
            d->want[i] = c + i == n - 1;
            d->hist[p0 + c + i] = toks[c + i];
        }
        struct tp_batch b = {m, d->tok, d->pos, d->seq, d->want};
        enum tp_status st = tp_model_forward(d->m, &b, d->logits);
        d->n_forward++;
        if (st != TP_OK) return st;
    }
    d->n_hist = p0 + n;
    return TP_OK;
}

int tp_cli_draft_propose(struct tp_cli_draft *d, const int32_t *seq, int n, int k, int32_t *out)
{
    if (n < 1 || k < 1) return 0;
    k = TP_MIN(k, d->n_ctx - n); /* drafts 1..k-1 are fed at n .. n + k - 2 */
    if (k < 1) return 0;
    int l = 0;
    while (l < d->n_hist && l < n && d->hist[l] == seq[l]) l++;
    if (l == n) l = n - 1; /* the last token is fed again: it gives the logits */
    tp_model_seq_truncate(d->m, 0, l);
    if (feed(d, seq + l, n - l, l) != TP_OK) return -1;
    for (int j = 0; j < k; j++) {
        out[j] = argmax(d->logits, d->n_vocab);
        if (j + 1 < k && feed(d, &out[j], 1, n + j) != TP_OK) return -1;
    }
    return k;
}

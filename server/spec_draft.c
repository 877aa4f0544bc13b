/*
 * server/spec_draft.c - a draft model for speculative decoding on rank 0
 * (server/include/server/spec.h, tp_spec_draft_*): the smaller model decodes
 * k tokens greedily after a sequence and the target model verifies them in
 * one step (the scheduler, `generate`, `bench gen`).  Its cache follows each
 * sequence by comparison: whatever it holds that the sequence no longer has
 * (rejected drafts, a new request in the slot) is overwritten by the next
 * feed.  Buffers are allocated at init; proposing allocates nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "server/spec.h"

struct tp_spec_draft {
    tp_model_t *m;            /* owned */
    int n_ctx, n_seq, n_batch, n_vocab;
    int32_t *hist;            /* (n_seq, n_ctx) tokens its cache holds, by position */
    int *n_hist;              /* (n_seq) */
    int32_t *tok, *pos, *seq; /* (n_batch) */
    int8_t *want;             /* (n_batch) */
    float *logits;            /* (n_vocab) */
};

void tp_spec_draft_free(tp_spec_draft_t *d)
{
    if (!d) return;
    tp_model_free(d->m);
    free(d->hist);
    free(d->n_hist);
    free(d->tok);
    free(d->pos);
    free(d->seq);
    free(d->want);
    free(d->logits);
    free(d);
}

const char *tp_spec_draft_last_error(const tp_spec_draft_t *d) { return d ? tp_model_last_error(d->m) : ""; }

enum tp_status tp_spec_draft_init(const char *path, int n_ctx, int n_seq, int n_threads, int n_vocab,
                                  tp_spec_draft_t **out, struct tp_error *err)
{
    *out = NULL;
    tp_spec_draft_t *d = calloc(1, sizeof *d);
    if (!d) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    struct tp_model_config cfg = tp_model_default_config();
    cfg.path = path;
    cfg.n_threads = n_threads;
    cfg.n_ctx = n_ctx;
    cfg.n_seq = n_seq;
    cfg.n_batch = 256;
    enum tp_status st = tp_model_init(&cfg, &d->m, err);
    if (st != TP_OK) {
        tp_spec_draft_free(d);
        return st;
    }
    const int dv = tp_model_hparams(d->m)->n_vocab;
    if (dv != n_vocab) {
        tp_spec_draft_free(d);
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "draft model %s has %d tokens in its vocabulary, the model %d: a draft model must share "
                            "the model's vocabulary (e.g. a smaller model of the same family)",
                            path, dv, n_vocab);
    }
    d->n_ctx = tp_model_n_ctx(d->m);
    d->n_seq = n_seq;
    d->n_batch = cfg.n_batch;
    d->n_vocab = n_vocab;
    d->hist = calloc((size_t)n_seq * (size_t)d->n_ctx, sizeof(int32_t));
    d->n_hist = calloc((size_t)n_seq, sizeof(int));
    d->tok = calloc((size_t)d->n_batch, sizeof(int32_t));
    d->pos = calloc((size_t)d->n_batch, sizeof(int32_t));
    d->seq = calloc((size_t)d->n_batch, sizeof(int32_t));
    d->want = calloc((size_t)d->n_batch, 1);
    d->logits = malloc(sizeof(float) * (size_t)n_vocab);
    if (!d->hist || !d->n_hist || !d->tok || !d->pos || !d->seq || !d->want || !d->logits) {
        tp_spec_draft_free(d);
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory for the draft model's buffers");
    }
    *out = d;
    return TP_OK;
}

static int32_t argmax(const float *v, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Feed toks[0..n) to sequence s at positions from p0, logits of the last; TP_OK or the model's error. */
static enum tp_status feed(tp_spec_draft_t *d, int s, const int32_t *toks, int n, int p0)
{
    int32_t *h = d->hist + (size_t)s * (size_t)d->n_ctx;
    for (int c = 0; c < n; c += d->n_batch) {
        const int m = TP_MIN(d->n_batch, n - c);
        for (int i = 0; i < m; i++) {
            d->tok[i] = toks[c + i];
            d->pos[i] = p0 + c + i;
            d->seq[i] = s;
            d->want[i] = c + i == n - 1;
            h[p0 + c + i] = toks[c + i];
        }
        struct tp_batch b = {m, d->tok, d->pos, d->seq, d->want};
        enum tp_status st = tp_model_forward(d->m, &b, d->logits);
        if (st != TP_OK) {
            d->n_hist[s] = 0;
            return st;
        }
        d->n_hist[s] = p0 + c + m;
    }
    return TP_OK;
}

int tp_spec_draft_propose(tp_spec_draft_t *d, int s, const int32_t *toks, int n, int k, int32_t *out)
{
    if (!d || s < 0 || s >= d->n_seq || n < 1 || k < 1) return 0;
    k = TP_MIN(k, d->n_ctx - n); /* drafts 0..k-2 are fed at n .. n + k - 2 */
    if (k < 1) return 0;
    const int32_t *h = d->hist + (size_t)s * (size_t)d->n_ctx;
    int l = 0;
    while (l < d->n_hist[s] && l < n && h[l] == toks[l]) l++;
    if (l == n) l = n - 1; /* the last token is fed again: it gives the logits */
    tp_model_seq_truncate(d->m, s, l);
    d->n_hist[s] = l;
    if (feed(d, s, toks + l, n - l, l) != TP_OK) return -1;
    for (int j = 0; j < k; j++) {
        out[j] = argmax(d->logits, d->n_vocab);
        if (j + 1 < k && feed(d, s, &out[j], 1, n + j) != TP_OK) return -1;
    }
    return k;
}

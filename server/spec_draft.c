/*
 * server/spec_draft.c - a draft model for speculative decoding, on rank 0 or
 * sharded over the ranks (server/include/server/spec.h, tp_spec_draft_*):
 * the smaller model decodes
 * k tokens greedily after each of a set of sequences, all of them in the same
 * forward passes (the tokens each sequence gained since its last drafts, then
 * one token per sequence and pass), and the target model verifies them in one
 * step (the scheduler, `generate`, `bench gen`).  Its cache follows each
 * sequence by comparison: whatever it holds that the sequence no longer has
 * (rejected drafts, a new request in the slot) is overwritten by the next
 * feed.  Buffers are allocated at init; proposing allocates nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "server/spec.h"

#define DRAFT_ROWS_MAX 32 /* logits rows per draft-model forward pass (a round of more sequences takes several) */

struct tp_spec_draft {
    tp_model_t *m;            /* owned on rank 0 alone; sharded: rank 0's slice, owned by par */
    tp_parallel_t *par;       /* sharded: the engine whose draft steps run it (not owned); NULL on rank 0 alone */
    int32_t *ids;             /* sharded: (rows_max) a pass's argmax per logits row */
    int32_t *clear_seq, *clear_from; /* sharded: (n_seq) truncations that ride with the next pass */
    int n_clear;
    int n_ctx, n_seq, n_batch, n_vocab, rows_max;
    int32_t *hist;            /* (n_seq, n_ctx) tokens its cache holds, by position */
    int *n_hist;              /* (n_seq) */
    int32_t *tok, *pos, *seq; /* (n_batch) */
    int8_t *want;             /* (n_batch) */
    int *row_req;             /* (rows_max) the request of each logits row of a pass */
    int *from;                /* (n_seq) per request: first position fed this time (-1: no drafts) */
    float *logits;            /* (rows_max, n_vocab) */
};

void tp_spec_draft_free(tp_spec_draft_t *d)
{
    if (!d) return;
    if (!d->par) tp_model_free(d->m);
    free(d->ids);
    free(d->clear_seq);
    free(d->clear_from);
    free(d->hist);
    free(d->n_hist);
    free(d->tok);
    free(d->pos);
    free(d->seq);
    free(d->want);
    free(d->row_req);
    free(d->from);
    free(d->logits);
    free(d);
}

const char *tp_spec_draft_last_error(const tp_spec_draft_t *d)
{
    return !d ? "" : d->par ? tp_parallel_last_error(d->par) : tp_model_last_error(d->m);
}

/* The buffers for d->m (set), n_seq sequences of vocabulary n_vocab, passes of n_batch tokens. */
static enum tp_status draft_buffers(tp_spec_draft_t *d, int n_seq, int n_batch, int n_vocab, struct tp_error *err)
{
    d->n_ctx = tp_model_n_ctx(d->m);
    d->n_seq = n_seq;
    d->n_batch = n_batch;
    d->n_vocab = n_vocab;
    d->rows_max = TP_MIN(TP_MIN(n_seq, DRAFT_ROWS_MAX), d->n_batch);
    d->hist = calloc((size_t)n_seq * (size_t)d->n_ctx, sizeof(int32_t));
    d->n_hist = calloc((size_t)n_seq, sizeof(int));
    d->tok = calloc((size_t)d->n_batch, sizeof(int32_t));
    d->pos = calloc((size_t)d->n_batch, sizeof(int32_t));
    d->seq = calloc((size_t)d->n_batch, sizeof(int32_t));
    d->want = calloc((size_t)d->n_batch, 1);
    d->row_req = calloc((size_t)d->rows_max, sizeof(int));
    d->from = calloc((size_t)n_seq, sizeof(int));
    if (d->par) {
        d->ids = calloc((size_t)d->rows_max, sizeof(int32_t));
        d->clear_seq = calloc((size_t)n_seq, sizeof(int32_t));
        d->clear_from = calloc((size_t)n_seq, sizeof(int32_t));
    } else {
        d->logits = malloc(sizeof(float) * (size_t)d->rows_max * (size_t)n_vocab);
    }
    if (!d->hist || !d->n_hist || !d->tok || !d->pos || !d->seq || !d->want || !d->row_req || !d->from ||
        (d->par ? !d->ids || !d->clear_seq || !d->clear_from : !d->logits))
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory for the draft model's buffers");
    return TP_OK;
}

enum tp_status tp_spec_draft_init_sharded(tp_parallel_t *p, int n_seq, tp_spec_draft_t **out, struct tp_error *err)
{
    *out = NULL;
    tp_model_t *m = tp_parallel_draft_model(p);
    if (!m || tp_parallel_rank(p) != 0)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "no sharded draft model in this engine (rank 0, placement sharded)");
    if (n_seq < 1 || n_seq > tp_model_n_seq(m))
        return tp_error_set(err, TP_ERR_INVALID_ARG, "draft model: %d sequences, the engine has %d", n_seq,
                            tp_model_n_seq(m));
    tp_spec_draft_t *d = calloc(1, sizeof *d);
    if (!d) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    d->m = m;
    d->par = p;
    enum tp_status st = draft_buffers(d, n_seq, tp_parallel_draft_batch(p), tp_model_hparams(m)->n_vocab, err);
    if (st != TP_OK) {
        tp_spec_draft_free(d);
        return st;
    }
    *out = d;
    return TP_OK;
}

void tp_spec_draft_reset(tp_spec_draft_t *d)
{
    if (!d) return;
    for (int s = 0; s < d->n_seq; s++) d->n_hist[s] = 0;
}

int tp_spec_draft_is_sharded(const tp_spec_draft_t *d) { return d && d->par; }

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
    st = draft_buffers(d, n_seq, cfg.n_batch, n_vocab, err);
    if (st != TP_OK) {
        tp_spec_draft_free(d);
        return st;
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

/* Run the nb tokens packed in d->tok.. (nr of them want logits, for requests d->row_req[0..nr)): the
 * argmax of each wanted row goes to its request's out[n_out++]; every fed position enters its
 * sequence's history.  TP_OK or the model's error (every sequence's history then counts as empty). */
static enum tp_status flush(tp_spec_draft_t *d, struct tp_spec_draft_req *req, int nb, int nr)
{
    if (nb == 0) return TP_OK;
    struct tp_batch b = {nb, d->tok, d->pos, d->seq, d->want};
    enum tp_status st;
    if (d->par) { /* every rank: the pending truncations, then the pass; rank 0 gets each row's argmax */
        struct tp_step s;
        memset(&s, 0, sizeof s);
        s.batch = b;
        s.n_clear = d->n_clear;
        s.clear_seq = d->clear_seq;
        s.clear_from = d->clear_from;
        st = tp_parallel_draft_step(d->par, &s, d->ids);
        d->n_clear = 0; /* sent (or the engine failed: a re-formed group starts over from tp_spec_draft_reset) */
    } else {
        st = tp_model_forward(d->m, &b, d->logits);
    }
    if (st != TP_OK) {
        for (int s = 0; s < d->n_seq; s++) d->n_hist[s] = 0;
        return st;
    }
    for (int i = 0; i < nb; i++) {
        d->hist[(size_t)d->seq[i] * (size_t)d->n_ctx + (size_t)d->pos[i]] = d->tok[i];
        d->n_hist[d->seq[i]] = d->pos[i] + 1;
    }
    for (int i = 0; i < nr; i++) {
        struct tp_spec_draft_req *r = &req[d->row_req[i]];
        r->out[r->n_out++] = d->par ? d->ids[i] : argmax(d->logits + (size_t)i * (size_t)d->n_vocab, d->n_vocab);
    }
    return TP_OK;
}

enum tp_status tp_spec_draft_propose_batch(tp_spec_draft_t *d, struct tp_spec_draft_req *req, int n_req)
{
    if (!d) return TP_ERR_INVALID_ARG;
    int k_max = 0;
    for (int i = 0; i < n_req; i++) { /* the whole round is checked before anything changes */
        struct tp_spec_draft_req *r = &req[i];
        r->n_out = 0;
        if (r->seq < 0 || r->seq >= d->n_seq || r->n < 1 || !r->toks || !r->out) return TP_ERR_INVALID_ARG;
        for (int j = 0; j < i; j++)
            if (req[j].seq == r->seq) return TP_ERR_INVALID_ARG;
    }
    for (int i = 0; i < n_req; i++) {
        struct tp_spec_draft_req *r = &req[i];
        r->k = TP_MIN(r->k, d->n_ctx - r->n); /* drafts 0..k-2 are fed at n .. n + k - 2 */
        d->from[i] = -1;
        if (r->k < 1) continue;
        /* the cache keeps the longest prefix it shares with toks (as far as sliding windows allow); the
         * last token is fed again in any case: it gives the first draft's logits */
        const int32_t *h = d->hist + (size_t)r->seq * (size_t)d->n_ctx;
        int l = 0;
        while (l < d->n_hist[r->seq] && l < r->n && h[l] == r->toks[l]) l++;
        l = TP_MIN(l, r->n - 1);
        l = tp_model_seq_reusable(d->m, r->seq, l);
        if (d->par) { /* on every rank, with the first pass below (which feeds at least this sequence's last token) */
            d->clear_seq[d->n_clear] = r->seq;
            d->clear_from[d->n_clear++] = l;
        } else {
            tp_model_seq_truncate(d->m, r->seq, l);
        }
        d->n_hist[r->seq] = l;
        d->from[i] = l;
        k_max = TP_MAX(k_max, r->k);
    }
    /* catch-up: every request's new tokens, packed n_batch at a time, a logits row at each one's last */
    int nb = 0, nr = 0;
    enum tp_status st = TP_OK;
    for (int i = 0; i < n_req && st == TP_OK; i++) {
        const struct tp_spec_draft_req *r = &req[i];
        for (int p = d->from[i]; p >= 0 && p < r->n && st == TP_OK; p++) {
            const int last = p == r->n - 1;
            if (nb == d->n_batch || (last && nr == d->rows_max)) {
                st = flush(d, req, nb, nr);
                nb = nr = 0;
            }
            d->tok[nb] = r->toks[p];
            d->pos[nb] = p;
            d->seq[nb] = r->seq;
            d->want[nb] = (int8_t)last;
            if (last) d->row_req[nr++] = i;
            nb++;
        }
    }
    if (st == TP_OK) st = flush(d, req, nb, nr);
    /* then one token per sequence and pass: draft j - 1 fed at n + j - 1 gives draft j */
    for (int j = 1; j < k_max && st == TP_OK; j++) {
        nb = nr = 0;
        for (int i = 0; i < n_req && st == TP_OK; i++) {
            const struct tp_spec_draft_req *r = &req[i];
            if (d->from[i] < 0 || r->n_out != j || j >= r->k) continue;
            if (nr == d->rows_max) {
                st = flush(d, req, nb, nr);
                nb = nr = 0;
            }
            d->tok[nb] = r->out[j - 1];
            d->pos[nb] = r->n + j - 1;
            d->seq[nb] = r->seq;
            d->want[nb] = 1;
            d->row_req[nr++] = i;
            nb++;
        }
        if (st == TP_OK) st = flush(d, req, nb, nr);
    }
    if (st != TP_OK)
        for (int i = 0; i < n_req; i++) req[i].n_out = 0;
    return st;
}

int tp_spec_draft_propose(tp_spec_draft_t *d, int s, const int32_t *toks, int n, int k, int32_t *out)
{
    if (!d || s < 0 || s >= d->n_seq || n < 1 || k < 1) return 0;
    struct tp_spec_draft_req r = {.seq = s, .toks = toks, .n = n, .k = k, .out = out};
    return tp_spec_draft_propose_batch(d, &r, 1) == TP_OK ? r.n_out : -1;
}

uint64_t tp_spec_draft_passes(const tp_spec_draft_t *d)
{
    if (!d) return 0;
    struct tp_model_stats st;
    tp_model_get_stats(d->m, &st);
    return st.n_forward;
}

uint64_t tp_spec_draft_weight_bytes(const tp_spec_draft_t *d) { return d ? tp_model_weight_bytes(d->m) : 0; }

int tp_spec_draft_n_layer(const tp_spec_draft_t *d) { return d ? tp_model_hparams(d->m)->n_layer : 0; }

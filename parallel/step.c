/*
 * parallel/step.c - the step protocol, the worker loop and rank 0's keepalive.
 * Rank 0 checks a step, then broadcasts its header (the format: executor_impl.h); every rank runs the
 * forward pass on its slice and rank 0 gathers logits rows, or each rank's argmax / top-k.  Any comm
 * error poisons the engine (TP_ERR_POISONED after); a batch the model refuses on every rank alike is
 * TP_ERR_INVALID_ARG without poisoning.  The order of work in a step: docs/multi-node.md ("The step").
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "executor_impl.h"

static enum tp_status hook_gather(tp_parallel_t *p, int32_t arg, double *values, int max);

/* ------------------------------------------------------------ one step */

/* Record a failure: comm failures poison and abort the group (peers fail fast). */
static enum tp_status step_fail(tp_parallel_t *p, enum tp_status st, const char *what)
{
    if (st == TP_ERR_INVALID_ARG && (!p->comm || !tp_comm_is_poisoned(p->comm))) {
        tp_error_force(&p->err, st, "%s: %s", what,
                       tp_model_last_error(p->hdr[HDR_MODEL] && p->draft ? p->draft : p->model));
        return st;
    }
    if (!atomic_exchange(&p->poisoned, 1)) {
        const char *why = p->comm && tp_comm_last_error(p->comm)[0] ? tp_comm_last_error(p->comm)
                                                                     : tp_model_last_error(p->model);
        tp_error_force(&p->err, st, "rank %d: %s failed (%s): %s; this group is stopped",
                       p->rank, what, tp_status_str(st), why);
        if (p->comm) tp_comm_abort(p->comm, "parallel: a rank failed during a step");
        tp_log(TP_LOG_ERROR, TP_PARALLEL_MODULE, "%s", tp_error_msg(&p->err));
    }
    return st == TP_ERR_INVALID_ARG ? TP_ERR_PEER : st;
}

static enum tp_status bcast_timed(tp_parallel_t *p, void *buf, size_t n, uint64_t *ns)
{
    uint64_t t0 = tp_now_ns();
    enum tp_status st = tp_comm_broadcast(p->comm, buf, n, TP_DTYPE_I32, 0);
    *ns += tp_now_ns() - t0;
    return st;
}

/* Gather the logits rows of every rank's vocabulary range into out (rank 0). */
static enum tp_status gather_logits(tp_parallel_t *p, int n_out, float *out, uint64_t *ns_comm)
{
    const int V = p->vocab_max;
    for (int r0 = 0; r0 < n_out; r0 += p->chunk) {
        int rows = TP_MIN(p->chunk, n_out - r0);
        const float *src = p->local + (size_t)r0 * (size_t)p->vocab_local;
        if (!p->equal_vocab) {
            for (int i = 0; i < rows; i++) {
                memcpy(p->send + (size_t)i * V, src + (size_t)i * p->vocab_local, (size_t)p->vocab_local * sizeof(float));
                memset(p->send + (size_t)i * V + p->vocab_local, 0, (size_t)(V - p->vocab_local) * sizeof(float));
            }
            src = p->send;
        }
        int direct = p->equal_vocab && rows == 1 && p->rank == 0;
        float *dst = direct ? out + (size_t)r0 * (size_t)p->n_vocab : p->gath;
        uint64_t t0 = tp_now_ns();
        enum tp_status st = tp_comm_gather(p->comm, src, dst, (size_t)rows * (size_t)V, TP_DTYPE_F32, 0);
        *ns_comm += tp_now_ns() - t0;
        if (st != TP_OK) return st;
        if (p->rank != 0 || direct) continue;
        for (int r = 0; r < p->world; r++) {
            const struct tp_model_shard *s = &p->plan.ranks[r].shard;
            size_t vl = (size_t)(s->vocab_end - s->vocab_begin);
            for (int i = 0; i < rows; i++)
                memcpy(out + (size_t)(r0 + i) * (size_t)p->n_vocab + (size_t)s->vocab_begin,
                       p->gath + ((size_t)r * (size_t)rows + (size_t)i) * (size_t)V, vl * sizeof(float));
        }
    }
    return TP_OK;
}

/* Distributed greedy: each rank's (max, index) per row of rows (n_out, width: its vocabulary
 * [begin, begin + width)); rank 0 picks the best (first on ties). */
static enum tp_status gather_argmax(tp_parallel_t *p, const float *rows, int begin, int width, int n_out, int32_t *ids,
                                    float *maxv, uint64_t *ns_comm)
{
    for (int i = 0; i < n_out; i++) {
        const float *row = rows + (size_t)i * (size_t)width;
        int best = 0;
        for (int j = 1; j < width; j++)
            if (row[j] > row[best]) best = j;
        p->pairs[2 * i] = row[best];
        p->pairs[2 * i + 1] = (float)(begin + best); /* exact: n_vocab < 2^24 checked */
    }
    const float *all = p->pairs;
    if (p->world > 1) {
        uint64_t t0 = tp_now_ns();
        enum tp_status st = tp_comm_gather(p->comm, p->pairs, p->pairs_all, 2 * (size_t)n_out, TP_DTYPE_F32, 0);
        *ns_comm += tp_now_ns() - t0;
        if (st != TP_OK) return st;
        all = p->pairs_all;
    }
    if (p->rank != 0) return TP_OK;
    for (int i = 0; i < n_out; i++) {
        float bv = all[2 * i];
        int32_t bi = (int32_t)all[2 * i + 1];
        for (int r = 1; r < p->world; r++) {
            const float *q = all + (size_t)r * 2 * (size_t)n_out + 2 * (size_t)i;
            if (q[0] > bv) {
                bv = q[0];
                bi = (int32_t)q[1];
            }
        }
        if (ids) ids[i] = bi;
        if (maxv) maxv[i] = bv;
    }
    return TP_OK;
}

/* Where rank 0 wants a step's results (unused members NULL). */
struct step_out {
    float *logits;                 /* RUN_LOGITS: (n_out, n_vocab) */
    int32_t *ids;                  /* RUN_ARGMAX: (n_out) */
    float *maxv;                   /* RUN_ARGMAX: (n_out) */
    struct tp_parallel_cand *top;  /* RUN_TOPK: (n_out, k) */
    float *lse;                    /* RUN_TOPK: (n_out) */
};

/* Candidate a before b: higher logit, then lower id. */
static int cand_before(float la, int32_t ia, float lb, int32_t ib) { return la > lb || (la == lb && ia < ib); }

/*
 * Distributed top-k: each rank sends per row its k best (logit, id) (padded
 * with (-inf, -1) when it holds fewer rows) plus its max m and sum of
 * exp(x - m); rank 0 merges the candidates (exactly the global top k) and
 * combines log-sum-exp = M + log(sum_r s_r exp(m_r - M)), M = max m_r.
 */
static enum tp_status gather_topk(tp_parallel_t *p, int n_out, int k, struct tp_parallel_cand *top, float *lse,
                                  uint64_t *ns_comm)
{
    const size_t per = 2 * (size_t)k + 2;
    for (int i = 0; i < n_out; i++) {
        const float *row = p->local + (size_t)i * (size_t)p->vocab_local;
        float *o = p->pairs + (size_t)i * per;
        int have = 0;
        float m = row[0];
        for (int j = 0; j < p->vocab_local; j++) {
            float x = row[j];
            if (x > m) m = x;
            int32_t id = p->vocab_begin + j;
            if (have == k && !cand_before(x, id, o[2 * (k - 1)], (int32_t)o[2 * (k - 1) + 1])) continue;
            int at = have < k ? have++ : k - 1;
            while (at > 0 && cand_before(x, id, o[2 * (at - 1)], (int32_t)o[2 * (at - 1) + 1])) {
                o[2 * at] = o[2 * (at - 1)];
                o[2 * at + 1] = o[2 * (at - 1) + 1];
                at--;
            }
            o[2 * at] = x;
            o[2 * at + 1] = (float)id;
        }
        for (int j = have; j < k; j++) {
            o[2 * j] = -INFINITY;
            o[2 * j + 1] = -1.0f;
        }
        double sum = 0.0; /* a slice banned whole by logit_bias (m = -inf) adds nothing */
        for (int j = 0; isfinite(m) && j < p->vocab_local; j++) sum += exp((double)row[j] - (double)m);
        o[2 * k] = m;
        o[2 * k + 1] = (float)sum;
    }
    const float *all = p->pairs;
    if (p->world > 1) {
        uint64_t t0 = tp_now_ns();
        enum tp_status st = tp_comm_gather(p->comm, p->pairs, p->pairs_all, per * (size_t)n_out, TP_DTYPE_F32, 0);
        *ns_comm += tp_now_ns() - t0;
        if (st != TP_OK) return st;
        all = p->pairs_all;
    }
    if (p->rank != 0) return TP_OK;
    int pos[TP_PLAN_MAX_RANKS];
    for (int i = 0; i < n_out; i++) {
        float M = -INFINITY;
        for (int r = 0; r < p->world; r++) {
            const float *o = all + ((size_t)r * (size_t)n_out + (size_t)i) * per;
            if (o[2 * k] > M) M = o[2 * k];
            pos[r] = 0;
        }
        double S = 0.0;
        for (int r = 0; r < p->world; r++) {
            const float *o = all + ((size_t)r * (size_t)n_out + (size_t)i) * per;
            if (o[2 * k + 1] > 0.0f) S += (double)o[2 * k + 1] * exp((double)o[2 * k] - (double)M);
        }
        if (lse) lse[i] = (float)((double)M + log(S));
        /* k-way merge of the ranks' sorted lists */
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bl = -INFINITY;
            int32_t bi = -1;
            for (int r = 0; r < p->world; r++) {
                if (pos[r] >= k) continue;
                const float *o = all + ((size_t)r * (size_t)n_out + (size_t)i) * per + 2 * (size_t)pos[r];
                if ((int32_t)o[1] < 0) continue;
                if (best < 0 || cand_before(o[0], (int32_t)o[1], bl, bi)) {
                    best = r;
                    bl = o[0];
                    bi = (int32_t)o[1];
                }
            }
            if (best >= 0) pos[best]++;
            if (top) {
                top[(size_t)i * (size_t)k + (size_t)j].id = bi;
                top[(size_t)i * (size_t)k + (size_t)j].logit = bl;
            }
        }
    }
    return TP_OK;
}

/* Run a step whose header is in p->hdr and body in body (every rank). */
static enum tp_status run_step(tp_parallel_t *p, const int32_t *body, const struct step_out *out, uint64_t *ns_comm)
{
    const int kind = p->hdr[1], n = p->hdr[3], c = p->hdr[4], nc = p->hdr[HDR_N_COPY], nb = p->hdr[HDR_N_BIAS];
    const int32_t *cs = body + 4 * n, *cf = body + 4 * n + c;
    const int32_t *cd = body + 4 * n + 2 * c, *csrc = cd + nc, *cl = cd + 2 * nc;
    const int32_t *brow = cd + 3 * nc, *bid = brow + nb, *bval = brow + 2 * nb;
    const int nm = p->hdr[HDR_N_MASK];
    const int32_t *mrow = brow + 3 * nb;
    const uint32_t *mbits = (const uint32_t *)(mrow + nm);
    if (p->hdr[HDR_MODEL]) { /* the sharded draft model: its clears, its batch, the distributed argmax */
        for (int i = 0; i < c; i++) tp_model_seq_truncate(p->draft, cs[i], cf[i]);
        if (n == 0) return TP_OK;
        struct tp_batch db = {n, body, body + n, body + 2 * n, p->want};
        int n_out = 0;
        for (int i = 0; i < n; i++) n_out += p->want[i] = body[3 * n + i] != 0;
        uint64_t w0 = p->wire.ns;
        enum tp_status st = tp_model_forward(p->draft, &db, p->dlocal);
        *ns_comm += p->wire.ns - w0;
        if (st != TP_OK) return st;
        p->stats.n_tokens += (uint64_t)n;
        return gather_argmax(p, p->dlocal, p->dvocab_begin, p->dvocab_local, n_out, out->ids, out->maxv, ns_comm);
    }
    for (int i = 0; i < c; i++) tp_model_seq_truncate(p->model, cs[i], cf[i]);
    for (int i = 0; i < nc; i++) {
        enum tp_status st = tp_model_kv_copy(p->model, cd[i], csrc[i], cl[i]);
        if (st != TP_OK) return st; /* same verdict on every rank: same state, same list */
    }
    if (n == 0) return TP_OK;
    /* want_logits travels as int32; the model wants int8 flags */
    struct tp_batch b = {n, body, body + n, body + 2 * n, p->want};
    int n_out = 0;
    for (int i = 0; i < n; i++) {
        p->want[i] = body[3 * n + i] != 0;
        n_out += p->want[i];
    }
    /* one rank, full logits wanted: the model writes straight into the caller's buffer */
    const int direct = p->world == 1 && kind == STEP_RUN_LOGITS && out->logits;
    uint64_t w0 = p->wire.ns;
    enum tp_status st = tp_model_forward(p->model, &b, direct ? out->logits : p->local);
    *ns_comm += p->wire.ns - w0;
    if (st != TP_OK) return st;
    p->stats.n_tokens += (uint64_t)n;
    /* logit_bias on this rank's slice of each row (the whole row when direct) */
    float *rows = direct ? out->logits : p->local;
    const int width = direct ? p->n_vocab : p->vocab_local, begin = direct ? 0 : p->vocab_begin;
    for (int i = 0; i < nb; i++) {
        float v;
        memcpy(&v, &bval[i], sizeof v);
        tp_logit_bias_apply(rows + (size_t)brow[i] * (size_t)width, begin, width, 1, &bid[i], &v);
    }
    for (int m = 0; m < nm; m++) {
        float *row = rows + (size_t)mrow[m] * (size_t)width;
        const uint32_t *bits = mbits + (size_t)m * (size_t)p->mask_words;
        for (int j = 0; j < width;) {
            const int id = begin + j;
            const uint32_t w = bits[id >> 5];
            if ((id & 31) == 0 && j + 32 <= width && w == 0xFFFFFFFFu) { /* a whole word allowed */
                j += 32;
                continue;
            }
            if (!(w >> (id & 31) & 1u)) row[j] = -INFINITY;
            j++;
        }
    }
    if (direct) return TP_OK;
    if (kind == STEP_RUN_ARGMAX)
        return gather_argmax(p, p->local, p->vocab_begin, p->vocab_local, n_out, out->ids, out->maxv, ns_comm);
    if (kind == STEP_RUN_TOPK) return gather_topk(p, n_out, p->hdr[6], out->top, out->lse, ns_comm);
    if (p->world == 1) {
        if (out->logits) memcpy(out->logits, p->local, (size_t)n_out * (size_t)p->n_vocab * sizeof(float));
        return TP_OK;
    }
    return gather_logits(p, n_out, out->logits, ns_comm);
}

/* One KV copy entry is within bounds (rank 0 before sending, workers on receipt). */
static int copy_ok(const tp_parallel_t *p, int32_t dst, int32_t src, int32_t len)
{
    return dst >= 0 && dst < p->n_seq && src >= 0 && src < p->n_seq && dst != src && len >= 0 && len <= p->n_ctx;
}

/* Bias entries (row, id, value bits) valid for a step with n_out logits rows. */
static int bias_ok(const tp_parallel_t *p, int n_out, int32_t row, int32_t id, int32_t bits)
{
    float v;
    memcpy(&v, &bits, sizeof v);
    return row >= 0 && row < n_out && id >= 0 && id < p->n_vocab && v >= -100.0f && v <= 100.0f;
}

/* Rank 0: check a step before anything is sent (a bad step must not desync the group). */
static enum tp_status check_step(tp_parallel_t *p, const struct tp_step *s)
{
    const struct tp_batch *b = &s->batch;
    if (b->n_tokens < 0 || b->n_tokens > p->n_batch)
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step has %d tokens; the engine takes 0..%d (--batch)",
                              b->n_tokens, p->n_batch);
    if (s->n_clear < 0 || s->n_clear > p->n_seq)
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step clears %d sequences; at most %d", s->n_clear,
                              p->n_seq);
    if (b->n_tokens > 0 && (!b->token || !b->pos || !b->seq || !b->logits))
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step batch has a NULL array");
    if (s->n_clear > 0 && (!s->clear_seq || !s->clear_from))
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step clear list has a NULL array");
    for (int i = 0; i < b->n_tokens; i++) {
        if (b->token[i] < 0 || b->token[i] >= p->n_vocab || b->seq[i] < 0 || b->seq[i] >= p->n_seq ||
            b->pos[i] < 0 || b->pos[i] >= p->n_ctx)
            return tp_error_force(&p->err, TP_ERR_INVALID_ARG,
                                  "step token %d: id %d / seq %d / pos %d out of range (vocab %d, %d slots, ctx %d)",
                                  i, b->token[i], b->seq[i], b->pos[i], p->n_vocab, p->n_seq, p->n_ctx);
    }
    for (int i = 0; i < s->n_clear; i++)
        if (s->clear_seq[i] < 0 || s->clear_seq[i] >= p->n_seq || s->clear_from[i] < 0)
            return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step clears sequence %d from %d: out of range",
                                  s->clear_seq[i], s->clear_from[i]);
    if (s->n_copy < 0 || s->n_copy > p->n_seq)
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step has %d KV copies; at most %d (one per slot)",
                              s->n_copy, p->n_seq);
    if (s->n_copy > 0 && (!s->copy_dst || !s->copy_src || !s->copy_len))
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step copy list has a NULL array");
    for (int i = 0; i < s->n_copy; i++)
        if (!copy_ok(p, s->copy_dst[i], s->copy_src[i], s->copy_len[i]))
            return tp_error_force(&p->err, TP_ERR_INVALID_ARG,
                                  "step copies %d positions from sequence %d to %d: out of range (%d slots, ctx %d, "
                                  "source and destination must differ)",
                                  s->copy_len[i], s->copy_src[i], s->copy_dst[i], p->n_seq, p->n_ctx);
    if (s->n_bias < 0 || s->n_bias > p->bias_max)
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step has %d logit_bias entries; at most %d", s->n_bias,
                              p->bias_max);
    if (s->n_bias > 0 && (!s->bias_row || !s->bias_id || !s->bias_val))
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step logit_bias list has a NULL array");
    if (s->n_mask < 0 || s->n_mask > p->rows_max)
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step has %d token masks; at most %d", s->n_mask,
                              p->rows_max);
    if (s->n_mask > 0 && (!s->mask_row || !s->mask))
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step token mask list has a NULL array");
    int n_out = 0;
    for (int i = 0; i < b->n_tokens; i++) n_out += b->logits[i] != 0;
    for (int i = 0; i < s->n_bias; i++) {
        int32_t bits;
        memcpy(&bits, &s->bias_val[i], sizeof bits);
        if (!bias_ok(p, n_out, s->bias_row[i], s->bias_id[i], bits))
            return tp_error_force(&p->err, TP_ERR_INVALID_ARG,
                                  "step logit_bias entry %d: row %d / token %d / bias %g out of range (%d logits rows, "
                                  "vocab %d, bias -100..100)", i, s->bias_row[i], s->bias_id[i], (double)s->bias_val[i],
                                  n_out, p->n_vocab);
    }
    for (int m = 0; m < s->n_mask; m++) {
        if (s->mask_row[m] < 0 || s->mask_row[m] >= n_out)
            return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step token mask %d: row %d out of range (%d logits rows)",
                                  m, s->mask_row[m], n_out);
        const uint32_t *bits = s->mask + (size_t)m * (size_t)p->mask_words;
        int any = 0;
        for (int w = 0; w < p->mask_words && !any; w++) {
            uint32_t v = bits[w];
            if (w == p->mask_words - 1 && p->n_vocab % 32) v &= (1u << (p->n_vocab % 32)) - 1u;
            any = v != 0;
        }
        if (!any)
            return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step token mask %d allows no token", m);
    }
    return TP_OK;
}

/* ------------------------------------------------------------- stats */

/* Counters as STATS_WORDS int32 words: STATS_U64 little-endian u64, low word
 * first, then the host name's 32 bytes (NUL-padded) in 8 words. */
static void stats_pack(const struct tp_parallel_stats *s, int32_t *w)
{
    const uint64_t v[STATS_U64] = {s->n_steps,      s->n_tokens, s->ns_compute, s->ns_comm,        s->bytes_sent,
                                   s->weight_bytes, s->kv_bytes, s->rss_bytes,  s->mem_total_bytes,
                                   s->mem_limit_bytes};
    for (int i = 0; i < STATS_U64; i++) {
        w[2 * i] = (int32_t)(uint32_t)(v[i] & 0xffffffffu);
        w[2 * i + 1] = (int32_t)(uint32_t)(v[i] >> 32);
    }
    for (int i = 0; i < 8; i++) {
        uint32_t x = 0;
        for (int b = 0; b < 4; b++) x |= (uint32_t)(unsigned char)s->host[4 * i + b] << (8 * b);
        w[2 * STATS_U64 + i] = (int32_t)x;
    }
}

static void stats_unpack(const int32_t *w, struct tp_parallel_stats *s)
{
    uint64_t v[STATS_U64];
    for (int i = 0; i < STATS_U64; i++) v[i] = (uint64_t)(uint32_t)w[2 * i] | (uint64_t)(uint32_t)w[2 * i + 1] << 32;
    s->n_steps = v[0];
    s->n_tokens = v[1];
    s->ns_compute = v[2];
    s->ns_comm = v[3];
    s->bytes_sent = v[4];
    s->weight_bytes = v[5];
    s->kv_bytes = v[6];
    s->rss_bytes = v[7];
    s->mem_total_bytes = v[8];
    s->mem_limit_bytes = v[9];
    for (int i = 0; i < 8; i++)
        for (int b = 0; b < 4; b++) s->host[4 * i + b] = (char)(((uint32_t)w[2 * STATS_U64 + i] >> (8 * b)) & 0xff);
    s->host[sizeof s->host - 1] = '\0'; /* a peer's bytes: always a terminated string here */
}

/* Every rank, after a step whose header has hdr[HDR_STATS] set: gather each
 * rank's counters to rank 0 (rank 0 holds p->mu; workers are the only
 * writers of their own counters). */
static enum tp_status collect_stats(tp_parallel_t *p, uint64_t *ns_comm)
{
    int32_t mine[STATS_WORDS];
    p->stats.rss_bytes = tp_rss_bytes();
    stats_pack(&p->stats, mine);
    uint64_t t0 = tp_now_ns();
    enum tp_status st = tp_comm_gather(p->comm, mine, p->stats_all, STATS_WORDS, TP_DTYPE_I32, 0);
    *ns_comm += tp_now_ns() - t0;
    if (st != TP_OK || p->rank != 0) return st;
    for (int r = 1; r < p->world; r++) stats_unpack(p->stats_all + (size_t)r * STATS_WORDS, &p->rank_stats[r]);
    p->stats_ns = tp_now_ns();
    return TP_OK;
}

/* Rank 0, a step of the sharded draft model: what check_step does not see (its batch size and context;
 * no copies, bias or masks). */
static enum tp_status check_draft_step(tp_parallel_t *p, const struct tp_step *s)
{
    if (!p->draft)
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "no sharded draft model in this engine (tp_parallel_config."
                              "draft_path, placement sharded)");
    if (s->batch.n_tokens > p->d_n_batch || s->n_copy || s->n_bias || s->n_mask)
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG,
                              "draft step: %d tokens (at most %d), %d copies, %d bias entries, %d masks (none allowed)",
                              s->batch.n_tokens, p->d_n_batch, s->n_copy, s->n_bias, s->n_mask);
    for (int i = 0; i < s->batch.n_tokens; i++)
        if (s->batch.pos[i] < 0 || s->batch.pos[i] >= p->d_n_ctx)
            return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "draft step token %d: position %d beyond the draft's "
                                  "context of %d", i, s->batch.pos[i], p->d_n_ctx);
    return TP_OK;
}

/* Rank 0, mutex held: send the step to the workers and run it here too (model 1: the draft model). */
static enum tp_status drive_locked(tp_parallel_t *p, int kind, int k, const struct tp_step *s,
                                   const struct step_out *out, int model)
{
    static const struct step_out none = {NULL, NULL, NULL, NULL, NULL};
    if (!out) out = &none;
    float *logits = out->logits;
    if (kind == STEP_RUN_TOPK && (k < 1 || k > TP_PARALLEL_TOPK_MAX))
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "top-k of %d: want 1..%d", k, TP_PARALLEL_TOPK_MAX);
    if (atomic_load(&p->poisoned)) return tp_error_set(&p->err, TP_ERR_POISONED, "engine already failed");
    if (p->rank != 0)
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "only rank 0 drives steps; rank %d runs tp_parallel_worker_loop",
                              p->rank);
    if (p->shut) return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "engine was shut down");
    enum tp_status st;
    if (s && (st = check_step(p, s)) != TP_OK) return st;
    if (model && (!s || kind != STEP_RUN_ARGMAX || (st = check_draft_step(p, s)) != TP_OK))
        return s && kind == STEP_RUN_ARGMAX ? st : tp_error_force(&p->err, TP_ERR_INVALID_ARG, "draft steps are greedy");
    if (s && kind == STEP_RUN_LOGITS && !logits)
        for (int i = 0; i < s->batch.n_tokens; i++)
            if (s->batch.logits[i])
                return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "step wants logits but the logits buffer is NULL");
    uint64_t t0 = tp_now_ns(), ns_comm = 0;
    struct tp_comm_stats c0, c1;
    if (p->comm) tp_comm_get_stats(p->comm, &c0);

    const int n = s ? s->batch.n_tokens : 0, c = s ? s->n_clear : 0, nc = s ? s->n_copy : 0;
    const int nb = s && kind != STEP_PING ? s->n_bias : 0;
    const int nm = s && kind != STEP_PING ? s->n_mask : 0;
    memset(p->hdr, 0, sizeof p->hdr);
    p->hdr[0] = STEP_MAGIC;
    p->hdr[1] = kind;
    p->hdr[2] = (int32_t)++p->step_no;
    p->hdr[3] = n;
    p->hdr[4] = c;
    p->hdr[HDR_N_COPY] = nc;
    p->hdr[HDR_N_BIAS] = nb;
    p->hdr[HDR_N_MASK] = nm;
    p->hdr[HDR_MODEL] = model;
    const int words = 4 * n + 2 * c + 3 * nc + 3 * nb + nm * (1 + p->mask_words);
    int32_t *body = words <= HDR_INLINE_MAX ? p->hdr + HDR_INLINE_AT : p->body;
    p->hdr[5] = words <= HDR_INLINE_MAX;
    p->hdr[6] = k;
    p->hdr[HDR_STATS] = p->comm && (kind == STEP_PING || t0 - p->stats_ns >= STATS_EVERY_NS);
    for (int i = 0; i < n; i++) {
        body[i] = s->batch.token[i];
        body[n + i] = s->batch.pos[i];
        body[2 * n + i] = s->batch.seq[i];
        body[3 * n + i] = s->batch.logits[i] != 0;
    }
    for (int i = 0; i < c; i++) {
        body[4 * n + i] = s->clear_seq[i];
        body[4 * n + c + i] = s->clear_from[i];
    }
    for (int i = 0; i < nc; i++) {
        body[4 * n + 2 * c + i] = s->copy_dst[i];
        body[4 * n + 2 * c + nc + i] = s->copy_src[i];
        body[4 * n + 2 * c + 2 * nc + i] = s->copy_len[i];
    }
    int32_t *bb = body + 4 * n + 2 * c + 3 * nc;
    for (int i = 0; i < nb; i++) {
        bb[i] = s->bias_row[i];
        bb[nb + i] = s->bias_id[i];
        memcpy(&bb[2 * nb + i], &s->bias_val[i], sizeof(float));
    }
    int32_t *mb = bb + 3 * nb;
    for (int m = 0; m < nm; m++) mb[m] = s->mask_row[m];
    if (nm > 0) memcpy(mb + nm, s->mask, (size_t)nm * (size_t)p->mask_words * sizeof(uint32_t));
    if (p->comm) {
        if ((st = bcast_timed(p, p->hdr, HDR_WORDS, &ns_comm)) != TP_OK) return step_fail(p, st, "step broadcast");
        if (!p->hdr[5] && (st = bcast_timed(p, p->body, (size_t)words, &ns_comm)) != TP_OK)
            return step_fail(p, st, "step broadcast");
    }
    if (kind == STEP_PING) {
        if (p->comm) {
            uint64_t tb = tp_now_ns();
            st = tp_comm_barrier(p->comm);
            ns_comm += tp_now_ns() - tb;
            if (st != TP_OK) return step_fail(p, st, "ping");
        }
    } else {
        st = run_step(p, body, out, &ns_comm);
        if (st != TP_OK) return step_fail(p, st, model ? "draft model step" : "forward step");
    }
    if (p->hdr[HDR_STATS] && (st = collect_stats(p, &ns_comm)) != TP_OK) return step_fail(p, st, "collecting rank stats");
    uint64_t dt = tp_now_ns() - t0;
    p->stats.n_steps++;
    p->stats.ns_comm += ns_comm;
    p->stats.ns_compute += dt > ns_comm ? dt - ns_comm : 0;
    if (p->comm) {
        tp_comm_get_stats(p->comm, &c1);
        p->stats.bytes_sent += c1.bytes_sent - c0.bytes_sent;
    }
    p->last_ns = tp_now_ns();
    return TP_OK;
}

enum tp_status tp_parallel_step(tp_parallel_t *p, const struct tp_step *step, float *logits)
{
    if (!p || !step) return TP_ERR_INVALID_ARG;
    pthread_mutex_lock(&p->mu);
    struct step_out o = {logits, NULL, NULL, NULL, NULL};
    enum tp_status st = drive_locked(p, STEP_RUN_LOGITS, 0, step, &o, 0);
    pthread_mutex_unlock(&p->mu);
    return st;
}

enum tp_status tp_parallel_step_greedy(tp_parallel_t *p, const struct tp_step *step, int32_t *ids, float *max_logit)
{
    if (!p || !step) return TP_ERR_INVALID_ARG;
    pthread_mutex_lock(&p->mu);
    struct step_out o = {NULL, ids, max_logit, NULL, NULL};
    enum tp_status st = drive_locked(p, STEP_RUN_ARGMAX, 0, step, &o, 0);
    pthread_mutex_unlock(&p->mu);
    return st;
}

enum tp_status tp_parallel_draft_step(tp_parallel_t *p, const struct tp_step *step, int32_t *ids)
{
    if (!p || !step) return TP_ERR_INVALID_ARG;
    pthread_mutex_lock(&p->mu);
    struct step_out o = {NULL, ids, NULL, NULL, NULL};
    enum tp_status st = drive_locked(p, STEP_RUN_ARGMAX, 0, step, &o, 1);
    pthread_mutex_unlock(&p->mu);
    return st;
}

enum tp_status tp_parallel_step_topk(tp_parallel_t *p, const struct tp_step *step, int k,
                                     struct tp_parallel_cand *top, float *lse)
{
    if (!p || !step) return TP_ERR_INVALID_ARG;
    pthread_mutex_lock(&p->mu);
    struct step_out o = {NULL, NULL, NULL, top, lse};
    enum tp_status st = drive_locked(p, STEP_RUN_TOPK, k, step, &o, 0);
    pthread_mutex_unlock(&p->mu);
    return st;
}

static enum tp_status do_ping_locked(tp_parallel_t *p) { return drive_locked(p, STEP_PING, 0, NULL, NULL, 0); }

enum tp_status tp_parallel_ping(tp_parallel_t *p)
{
    if (!p) return TP_ERR_INVALID_ARG;
    pthread_mutex_lock(&p->mu);
    enum tp_status st = do_ping_locked(p);
    pthread_mutex_unlock(&p->mu);
    return st;
}

enum tp_status tp_parallel_worker_loop(tp_parallel_t *p)
{
    if (!p) return TP_ERR_INVALID_ARG;
    if (p->rank == 0)
        return tp_error_force(&p->err, TP_ERR_INVALID_ARG, "rank 0 drives steps; tp_parallel_worker_loop is for ranks > 0");
    for (;;) {
        if (atomic_load(&p->poisoned)) return tp_error_set(&p->err, TP_ERR_POISONED, "engine already failed");
        uint64_t ns_comm = 0;
        struct tp_comm_stats c0, c1;
        tp_comm_get_stats(p->comm, &c0);
        /* the wait for the next step is idle time, not communication */
        enum tp_status st = tp_comm_broadcast(p->comm, p->hdr, HDR_WORDS, TP_DTYPE_I32, 0);
        if (st != TP_OK) return step_fail(p, st, "waiting for the next step from rank 0");
        uint64_t t0 = tp_now_ns();
        const int kind = p->hdr[1], n = p->hdr[3], c = p->hdr[4], nc = p->hdr[HDR_N_COPY], nb = p->hdr[HDR_N_BIAS];
        const int nm = p->hdr[HDR_N_MASK];
        const int words = 4 * n + 2 * c + 3 * nc + 3 * nb + (nm >= 0 && nm <= p->rows_max ? nm * (1 + p->mask_words) : 0);
        if (p->hdr[0] != STEP_MAGIC || kind < STEP_RUN_LOGITS || kind > STEP_HOOK || n < 0 || n > p->n_batch ||
            c < 0 || c > p->n_seq || nc < 0 || nc > p->n_seq || nb < 0 || nb > p->bias_max || nm < 0 || nm > p->rows_max ||
            (p->hdr[5] && words > HDR_INLINE_MAX) || (p->hdr[HDR_MODEL] != 0 && p->hdr[HDR_MODEL] != 1) ||
            (p->hdr[HDR_MODEL] && (!p->draft || kind != STEP_RUN_ARGMAX || n > p->d_n_batch || nc || nb || nm)) ||
            (kind == STEP_RUN_TOPK && (p->hdr[6] < 1 || p->hdr[6] > TP_PARALLEL_TOPK_MAX))) {
            tp_error_force(&p->err, TP_ERR_PROTOCOL,
                           "rank %d: malformed step header from rank 0 (magic %08x kind %d n_tokens %d n_clear %d "
                           "n_copy %d n_bias %d); are all ranks the same tpserve version with the same "
                           "--batch/--n-seq?",
                           p->rank, (unsigned)p->hdr[0], kind, n, c, nc, nb);
            atomic_store(&p->poisoned, 1);
            tp_comm_abort(p->comm, "parallel: malformed step header");
            return TP_ERR_PROTOCOL;
        }
        if (kind == STEP_SHUTDOWN) {
            p->shut = 1;
            tp_log(TP_LOG_DEBUG, TP_PARALLEL_MODULE, "rank %d: shutdown from rank 0", p->rank);
            return TP_OK;
        }
        if (kind == STEP_HOOK) {
            if ((st = hook_gather(p, p->hdr[6], NULL, 0)) != TP_OK) return step_fail(p, st, "rank hook");
            continue;
        }
        const int32_t *body = p->hdr + HDR_INLINE_AT;
        if (!p->hdr[5]) {
            if ((st = bcast_timed(p, p->body, (size_t)words, &ns_comm)) != TP_OK)
                return step_fail(p, st, "receiving a step");
            body = p->body;
        }
        if (kind == STEP_PING) {
            uint64_t tb = tp_now_ns();
            st = tp_comm_barrier(p->comm);
            ns_comm += tp_now_ns() - tb;
            if (st != TP_OK) return step_fail(p, st, "ping");
        } else {
            for (int i = 0; i < c; i++) {
                const int32_t sq = body[4 * n + i], from = body[4 * n + c + i];
                if (sq < 0 || sq >= p->n_seq || from < 0) {
                    tp_comm_abort(p->comm, "parallel: bad clear list");
                    return step_fail(p, TP_ERR_PROTOCOL, "step clear list");
                }
            }
            for (int i = 0; i < nc; i++) {
                const int32_t *cp = body + 4 * n + 2 * c + i;
                if (!copy_ok(p, cp[0], cp[nc], cp[2 * nc])) {
                    tp_comm_abort(p->comm, "parallel: bad KV copy list");
                    return step_fail(p, TP_ERR_PROTOCOL, "step KV copy list");
                }
            }
            int n_out = 0;
            for (int i = 0; i < n; i++) n_out += body[3 * n + i] != 0;
            const int32_t *bb = body + 4 * n + 2 * c + 3 * nc;
            for (int i = 0; i < nb; i++) {
                if (!bias_ok(p, n_out, bb[i], bb[nb + i], bb[2 * nb + i])) {
                    tp_comm_abort(p->comm, "parallel: bad logit_bias list");
                    return step_fail(p, TP_ERR_PROTOCOL, "step logit_bias list");
                }
            }
            for (int m = 0; m < nm; m++) {
                if (bb[3 * nb + m] < 0 || bb[3 * nb + m] >= n_out) {
                    tp_comm_abort(p->comm, "parallel: bad token mask list");
                    return step_fail(p, TP_ERR_PROTOCOL, "step token mask list");
                }
            }
            static const struct step_out none = {NULL, NULL, NULL, NULL, NULL};
            st = run_step(p, body, &none, &ns_comm);
            if (st != TP_OK) {
                st = step_fail(p, st, "forward step");
                if (st == TP_ERR_INVALID_ARG) continue; /* rank 0 got the same verdict */
                return st;
            }
        }
        uint64_t dt = tp_now_ns() - t0;
        pthread_mutex_lock(&p->mu);
        p->stats.n_steps++;
        p->stats.ns_comm += ns_comm;
        p->stats.ns_compute += dt > ns_comm ? dt - ns_comm : 0;
        tp_comm_get_stats(p->comm, &c1);
        p->stats.bytes_sent += c1.bytes_sent - c0.bytes_sent;
        pthread_mutex_unlock(&p->mu);
        if (p->hdr[HDR_STATS]) { /* after the update, so rank 0 sees this step counted */
            uint64_t ns_stats = 0;
            if ((st = collect_stats(p, &ns_stats)) != TP_OK) return step_fail(p, st, "sending rank stats");
            pthread_mutex_lock(&p->mu);
            p->stats.ns_comm += ns_stats;
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* ------------------------------------------------------------- rank hook */

/* Every rank: run the local hook, gather its values to rank 0 (into values
 * when rank 0, for r < max). */
static enum tp_status hook_gather(tp_parallel_t *p, int32_t arg, double *values, int max)
{
    double mine[TP_PARALLEL_HOOK_VALUES], all[TP_PLAN_MAX_RANKS * TP_PARALLEL_HOOK_VALUES];
    for (int i = 0; i < TP_PARALLEL_HOOK_VALUES; i++) mine[i] = NAN;
    if (p->hook && p->hook(p->hook_ud, arg, mine) != TP_OK)
        for (int i = 0; i < TP_PARALLEL_HOOK_VALUES; i++) mine[i] = NAN;
    memcpy(all, mine, sizeof mine);
    if (p->comm) {
        enum tp_status st = tp_comm_gather(p->comm, mine, all, sizeof mine, TP_DTYPE_U8, 0);
        if (st != TP_OK) return st;
    }
    if (p->rank == 0 && values)
        memcpy(values, all, (size_t)TP_MIN(max, p->world) * sizeof mine);
    return TP_OK;
}

void tp_parallel_set_hook(tp_parallel_t *p, tp_parallel_hook_fn fn, void *ud)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->hook = fn;
    p->hook_ud = ud;
    pthread_mutex_unlock(&p->mu);
}

enum tp_status tp_parallel_run_hook(tp_parallel_t *p, int32_t arg, double *values, int max)
{
    if (!p || (max > 0 && !values)) return TP_ERR_INVALID_ARG;
    pthread_mutex_lock(&p->mu);
    enum tp_status st = TP_OK;
    if (atomic_load(&p->poisoned)) st = tp_error_set(&p->err, TP_ERR_POISONED, "engine already failed");
    else if (p->rank != 0)
        st = tp_error_force(&p->err, TP_ERR_INVALID_ARG, "only rank 0 runs the rank hook; rank %d runs the worker loop",
                            p->rank);
    else if (p->shut) st = tp_error_force(&p->err, TP_ERR_INVALID_ARG, "engine was shut down");
    if (st == TP_OK && p->comm) {
        memset(p->hdr, 0, sizeof p->hdr);
        p->hdr[0] = STEP_MAGIC;
        p->hdr[1] = STEP_HOOK;
        p->hdr[2] = (int32_t)++p->step_no;
        p->hdr[5] = 1; /* no body */
        p->hdr[6] = arg;
        if ((st = tp_comm_broadcast(p->comm, p->hdr, HDR_WORDS, TP_DTYPE_I32, 0)) != TP_OK)
            st = step_fail(p, st, "rank hook broadcast");
    }
    if (st == TP_OK && (st = hook_gather(p, arg, values, max)) != TP_OK) st = step_fail(p, st, "rank hook");
    p->last_ns = tp_now_ns();
    pthread_mutex_unlock(&p->mu);
    return st;
}

/* ------------------------------------------------------------- keepalive */

void *tp_engine_keepalive_main(void *arg)
{
    tp_parallel_t *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->keep_stop) {
        uint64_t now = tp_now_ns();
        uint64_t due = p->last_ns + (uint64_t)p->keep_ms * 1000000ull;
        if (now >= due) {
            if (!atomic_load(&p->poisoned) && !p->shut) {
                if (do_ping_locked(p) != TP_OK)
                    tp_log(TP_LOG_ERROR, TP_PARALLEL_MODULE, "keepalive ping failed: %s", tp_error_msg(&p->err));
            }
            p->last_ns = tp_now_ns(); /* next look one period later, whatever happened */
            continue;
        }
        uint64_t wait_ns = due - now;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)(wait_ns / 1000000000ull);
        ts.tv_nsec += (long)(wait_ns % 1000000000ull);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void tp_engine_send_shutdown(tp_parallel_t *p)
{
    pthread_mutex_lock(&p->mu);
    memset(p->hdr, 0, sizeof p->hdr);
    p->hdr[0] = STEP_MAGIC;
    p->hdr[1] = STEP_SHUTDOWN;
    p->hdr[2] = (int32_t)++p->step_no;
    if (tp_comm_broadcast(p->comm, p->hdr, HDR_WORDS, TP_DTYPE_I32, 0) != TP_OK)
        tp_log(TP_LOG_WARN, TP_PARALLEL_MODULE, "could not tell the workers to shut down: %s",
               tp_comm_last_error(p->comm));
    p->shut = 1;
    pthread_mutex_unlock(&p->mu);
}

/* ------------------------------------------------------------- cost */

void tp_parallel_decode_cost(int n_layer, int n_embd, enum tp_wire_dtype dt, int world, int rank,
                             struct tp_parallel_decode_cost *out)
{
    memset(out, 0, sizeof *out);
    if (world <= 1 || n_layer < 1 || n_embd < 1) return;
    enum tp_comm_op sum_op = TP_COMM_OP_ALL_SUM;
    enum tp_dtype sum_dt = TP_DTYPE_F32;
    size_t sum_count = (size_t)n_embd;
    if (dt == TP_WIRE_F16) sum_dt = TP_DTYPE_F16;
    else if (dt == TP_WIRE_BF16) sum_dt = TP_DTYPE_BF16;
    else if (dt == TP_WIRE_Q8) {
        sum_op = TP_COMM_OP_ALL_GATHER;
        sum_dt = TP_DTYPE_U8;
        sum_count = ((size_t)n_embd + TP_WIRE_Q8_BLOCK - 1) / TP_WIRE_Q8_BLOCK * TP_WIRE_Q8_BYTES;
    }
    const struct {
        const char *what;
        int times;
        enum tp_comm_op op;
        size_t count;
        enum tp_dtype dt;
    } calls[3] = {
        {"step header", 1, TP_COMM_OP_BROADCAST, HDR_WORDS, TP_DTYPE_I32},
        {"all_sum", 2 * n_layer, sum_op, sum_count, sum_dt},
        {"argmax gather", 1, TP_COMM_OP_GATHER, 2, TP_DTYPE_F32},
    };
    for (int i = 0; i < 3; i++) {
        struct tp_parallel_coll_cost *c = &out->c[out->n++];
        c->what = calls[i].what;
        c->times = calls[i].times;
        c->op = calls[i].op;
        c->count = calls[i].count;
        c->dt = calls[i].dt;
        c->cost = tp_comm_op_cost(calls[i].op, world, rank, 0, calls[i].count, calls[i].dt);
        for (int r = 0; r < world; r++) {
            uint64_t b = tp_comm_op_cost(calls[i].op, world, r, 0, calls[i].count, calls[i].dt).bytes_sent;
            if (b > c->max_bytes_sent) c->max_bytes_sent = b;
        }
        out->bytes_sent += (uint64_t)c->times * c->cost.bytes_sent;
    }
}

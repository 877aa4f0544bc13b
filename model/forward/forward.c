/*
 * model/forward/forward.c - tp_model_forward: one pass of a Llama-family decoder over
 * a batch of tokens from any mix of sequence slots (continuous batching).
 *
 * Per layer:  xb = rmsnorm(x)                                  (caller thread)
 *             q,k,v = xb Wq,Wk,Wv (+bias)                      pool job QKV,
 *             q/k norm, rope, k,v -> KV cache                  same job, per head
 *             att = softmax(q k^T / sqrt(hd)) v  per (token, head)   pool job ATTN
 *             proj = att Wo ; all_sum(proj) ; x += proj        pool job O
 *             xb = rmsnorm(x) ; hb = silu(xb Wg) * (xb Wu)     pool job FFN_UP
 *             proj = hb Wd ; all_sum(proj) ; x += proj         pool job DOWN
 * (mixture of experts: the FFN step routes each token to its experts and runs
 * each selected expert once over all its tokens, see moe_ffn; gpt-oss adds the
 * attn_output bias after its all_sum, a router bias, expert biases and the
 * clamped SwiGLU, and scales the YaRN cos/sin by the attention factor)
 * then logits = rmsnorm(x) Wout for the tokens that asked.
 * Every job hands out chunks of the rows of its matrices (or of the (token,
 * head) pairs) to the threads of the persistent pool as they come free
 * (guided: long chunks first, short ones last, see job()); the
 * small O(n) steps between jobs run on the calling thread (RMSNorm and
 * activation quantization go to the pool too when many tokens are prefilled),
 * and jobs under 64 KiB of work never wake the pool.  With a shard only the held heads / FFN columns /
 * vocab rows are computed and the two all_sum calls add the other ranks'
 * partial sums.  Nothing is allocated here.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels.h"
#include "forward/model_impl.h"

/* Rows [r0, r1) of one matrix for n_tok prepared rows; y has y_stride floats per token. */
static void mm(const struct tp_wmat *w, const uint8_t *xq, size_t xq_stride, int n_tok, float *y, int64_t y_stride,
               int64_t r0, int64_t r1)
{
    if (r1 <= r0) return;
    if (w->scales) { /* MLX affine: packed words + per-group scales / biases */
        const struct tp_kern_groups g = {w->scales, w->biases, w->sb_row_bytes, w->sb_bf16};
        tp_kern_matmul_mlx(w->type, w->data, w->row_bytes, &g, w->cols, xq, xq_stride, n_tok, y, y_stride, r0, r1);
        return;
    }
    if (w->x16) /* re-laid 16 rows at a time (repack.c) */
        tp_kern_matmul_x16(w->type, w->data, w->row_bytes, w->cols, xq, xq_stride, n_tok, y, y_stride, r0, r1);
    else
        tp_kern_matmul(w->type, w->data, w->row_bytes, w->cols, xq, xq_stride, n_tok, y, y_stride, r0, r1);
}

/* Row r of w as w->cols floats (token embedding lookup). */
static void dequant_row(const struct tp_wmat *w, int64_t r, float *dst)
{
    if (w->scales)
        tp_kern_dequant_mlx(w->type, w->data + (size_t)r * w->row_bytes, w->scales + (size_t)r * w->sb_row_bytes,
                            w->biases + (size_t)r * w->sb_row_bytes, w->sb_bf16, dst, w->cols);
    else
        tp_kern_dequant(w->type, w->data + (size_t)r * w->row_bytes, dst, w->cols);
}

/* Buffer of prepared activations for weight type t (prepared by prep_act). */
static const uint8_t *act_for(const tp_model_t *m, enum tp_wtype t)
{
    const enum tp_wtype c = tp_kern_act_class(t);
    for (int i = 0; i < 3; i++)
        if (m->act_type[i] == c) return m->act[i];
    return m->act[0];
}

static void run(tp_model_t *m, enum tp_fwd_phase ph, int64_t total, int64_t align, uint64_t work);

/* Below this many bytes of work a job runs on the calling thread: waking the
 * pool costs more than it saves (and much more when cores are oversubscribed). */
#define TP_FWD_MIN_PARALLEL_WORK (64u * 1024u)

/* Rows [t0, t1) of the current preparation job. */
static void prep_rows(tp_model_t *m, int64_t t0, int64_t t1)
{
    int64_t n = m->prep_n;
    for (int64_t t = t0; t < t1; t++) {
        const float *x = m->prep_src + (size_t)t * (size_t)n;
        if (m->prep_norm) {
            float *y = m->prep_dst + (size_t)t * (size_t)n;
            tp_op_rmsnorm(y, x, m->prep_norm, (int)n, m->hp.norm_eps);
            x = y;
        }
        for (int j = 0; j < m->prep_used; j++)
            tp_kern_prepare_act(m->act_type[j], x, m->act[j] + (size_t)t * m->act_row_max, n);
    }
}

/* Items [i0, i1) of a TP_PH_PREP_BLOCKS job: values [i0, i1) x prep_blk of every row, normed with the
 * row's prep_scale (tp_op_rms_apply, tp_op_rmsnorm's own product) and prepared block by block, so that each
 * thread quantizes the part of the row its share covers (tp_kern_prepare_act_blocks). */
static void prep_blocks(tp_model_t *m, int ith, int64_t i0, int64_t i1)
{
    const int64_t n = m->prep_n, v0 = i0 * m->prep_blk, v1 = i1 * m->prep_blk;
    uint8_t *scratch = m->prep_scratch + (size_t)ith * m->act_row_max;
    for (int t = 0; t < m->prep_rows; t++) {
        const float *x = m->prep_src + (size_t)t * (size_t)n;
        if (m->prep_norm) {
            float *y = m->prep_dst + (size_t)t * (size_t)n;
            tp_op_rms_apply(y + v0, x + v0, m->prep_norm + v0, m->prep_scale[t], (int)(v1 - v0));
            x = y;
        }
        for (int j = 0; j < m->prep_used; j++) {
            const int64_t B = tp_kern_act_block(m->act_type[j]);
            tp_kern_prepare_act_blocks(m->act_type[j], x, m->act[j] + (size_t)t * m->act_row_max, n, v0 / B, v1 / B,
                                       scratch);
        }
    }
}

/* Rows x[n_tok, n] (stride n), optionally RMS-normed with norm into dst
 * first, prepared once for each activation class among types[0..nt).  Many rows
 * (prefill) are split over the pool by rows.  Up to TP_FWD_PREP_SPLIT_ROWS rows
 * (a decode step's) of at least prep_split_min values are split by blocks in the
 * threads' owned shares (TP_PH_PREP_BLOCKS): rows the last matmul wrote in shares
 * are then mostly quantized by the thread that wrote each part, instead of each
 * row's thread reading the others' parts. */
static void prep_act(tp_model_t *m, const float *x, float *dst, const float *norm, int n_tok, int64_t n,
                     const enum tp_wtype *types, int nt)
{
    int used = 0;
    for (int i = 0; i < nt; i++) { /* one row per activation class (tp_kern_act_class) */
        const enum tp_wtype c = tp_kern_act_class(types[i]);
        int seen = 0;
        for (int j = 0; j < used; j++) seen |= m->act_type[j] == c;
        if (!seen) m->act_type[used++] = c;
    }
    for (int j = used; j < 3; j++) m->act_type[j] = TP_WTYPE_COUNT;
    m->prep_src = x;
    m->prep_dst = dst;
    m->prep_norm = norm;
    m->prep_n = n;
    m->prep_used = used;
    int64_t blk = 1; /* the widest class's block (each divides the next: 1, 32, 256) */
    for (int j = 0; j < used; j++) {
        const int64_t b = tp_kern_act_block(m->act_type[j]);
        blk = b > 0 && blk > 0 ? TP_MAX(blk, b) : 0;
    }
    if (m->n_threads > 1 && n_tok <= TP_FWD_PREP_SPLIT_ROWS && n >= m->prep_split_min && blk > 0 && n % blk == 0) {
        for (int t = 0; t < n_tok; t++)
            m->prep_scale[t] = norm ? tp_op_rms_scale(x + (size_t)t * (size_t)n, (int)n, m->hp.norm_eps) : 1.0f;
        m->prep_rows = n_tok;
        m->prep_blk = blk;
        run(m, TP_PH_PREP_BLOCKS, n / blk, 1, TP_FWD_MIN_PARALLEL_WORK); /* the pool however small */
        return;
    }
    run(m, TP_PH_PREP, n_tok, 1, (uint64_t)n_tok * (uint64_t)n * 8u);
}

/* Row 0 of (layer l, sequence s, local KV head kvh) in cache c (k_cache or v_cache). */
static uint8_t *kv_rows(const tp_model_t *m, uint8_t *c, int l, int s, int kvh)
{
    return c + m->kv_off[l] + ((size_t)s * (size_t)m->nkv + (size_t)kvh) * (size_t)m->kv_cap[l] * m->kv_row_bytes;
}

static void attn_geom(const tp_model_t *m, int l, struct tp_attn_geom *g)
{
    g->hd = m->hd;
    g->type = m->kv_type;
    g->row_bytes = m->kv_row_bytes;
    g->cap = m->kv_cap[l];
    g->window = m->layers[l].attn_window;
    g->scale = 1.0f / sqrtf((float)m->hd);
}

static void attn_rows(const tp_model_t *m, const struct tp_layer *L, int t0, int nt, int kvh, struct tp_attn_rows *r)
{
    const int h0 = m->attn_qh0[kvh];
    r->q = m->q + (size_t)t0 * m->q_dim + (size_t)h0 * m->hd;
    r->q_stride = (size_t)m->q_dim;
    r->nt = nt;
    r->ng = m->attn_nqh[kvh];
    r->pos0 = m->batch->pos[t0];
    r->sinks = L->attn_sinks ? L->attn_sinks + h0 : NULL;
}

/* One attention work item (thread ith's scratch). */
static void attn_item(tp_model_t *m, int ith, const struct tp_attn_item *it)
{
    const int l = m->cur_layer;
    const struct tp_layer *L = &m->layers[l];
    struct tp_attn_geom g;
    struct tp_attn_rows r;
    attn_geom(m, l, &g);
    attn_rows(m, L, it->t0, it->nt, it->kvh, &r);
    const int s = m->batch->seq[it->t0];
    float *o = m->att + (size_t)it->t0 * m->q_dim + (size_t)m->attn_qh0[it->kvh] * m->hd;
    float *part = it->part >= 0 ? m->attn_part + (size_t)it->part * TP_ATTN_PART_FLOATS(m->hd, m->attn_rows_max) : NULL;
    tp_attn_tile(&g, &r, kv_rows(m, m->k_cache, l, s, it->kvh), kv_rows(m, m->v_cache, l, s, it->kvh), it->k0, it->k1,
                 m->attn_scratch + (size_t)ith * m->attn_scratch_n, o, (size_t)m->q_dim, part);
}

static void attn_merge_one(tp_model_t *m, const struct tp_attn_merge *mg)
{
    const struct tp_layer *L = &m->layers[m->cur_layer];
    struct tp_attn_rows r;
    attn_rows(m, L, mg->t0, mg->nt, mg->kvh, &r);
    float *o = m->att + (size_t)mg->t0 * m->q_dim + (size_t)m->attn_qh0[mg->kvh] * m->hd;
    const size_t slot = TP_ATTN_PART_FLOATS(m->hd, m->attn_rows_max);
    tp_attn_merge(m->attn_part + (size_t)mg->part0 * slot, mg->n_parts, slot, m->hd, &r, o, (size_t)m->q_dim);
}

static int item_cost_desc(const void *a, const void *b)
{
    const struct tp_attn_item *x = a, *y = b;
    const int64_t cx = (int64_t)(x->k1 - x->k0) * x->nt, cy = (int64_t)(y->k1 - y->k0) * y->nt;
    return cx < cy ? 1 : cx > cy ? -1 : 0;
}

/*
 * The attention work list of layer l for the current batch: blocks of up to
 * attn_qb consecutive tokens of one sequence, times each KV head (its query
 * heads ride along); a block's keys are its window start to its last
 * position.  When the keys of the whole batch are few blocks' worth (decode,
 * above all one long sequence), an item longer than its share is split into
 * key ranges of about (all keys / 4 threads) each, whose partials
 * TP_PH_ATTN_MERGE combines.  Costliest items first: the pool hands out the
 * list in order, long chunks first.  Returns the work estimate in bytes.
 */
static uint64_t attn_plan(tp_model_t *m, int l)
{
    const struct tp_batch *b = m->batch;
    const int W = m->layers[l].attn_window;
    int n_items = 0, n_parts = 0, n_merge = 0;
    int64_t span_sum = 0;
    uint64_t work = 0;
    /* pass 1: blocks; pass 2: items */
    for (int pass = 0; pass < 2; pass++) {
        int64_t C = 0;
        if (pass == 1) { /* one thread: nothing to split for */
            C = m->n_threads > 1 ? span_sum / (4 * (int64_t)m->n_threads) : INT64_MAX;
            if (C < 4 * TP_ATTN_KB) C = 4 * TP_ATTN_KB;
        }
        for (int t = 0; t < m->n_tok;) {
            int nt = 1;
            while (t + nt < m->n_tok && nt < m->attn_qb && b->seq[t + nt] == b->seq[t] &&
                   b->pos[t + nt] == b->pos[t + nt - 1] + 1)
                nt++;
            const int p0 = b->pos[t], p1 = b->pos[t + nt - 1] + 1;
            const int lo = W > 0 ? TP_MAX(0, p0 - W + 1) : 0;
            const int span = p1 - lo;
            if (pass == 0) {
                span_sum += (int64_t)span * m->nkv;
            } else {
                for (int kvh = 0; kvh < m->nkv; kvh++) {
                    if (m->attn_nqh[kvh] == 0) continue;
                    work += (uint64_t)span * (uint64_t)nt * (uint64_t)m->attn_nqh[kvh] * (uint64_t)m->hd * 8u;
                    int ns = span > C ? (int)((span + C - 1) / C) : 1;
                    if (ns > 1 && n_parts + ns > m->attn_parts_max) ns = 1;
                    if (ns > 1) {
                        struct tp_attn_merge *mg = &m->attn_merge[n_merge++];
                        mg->t0 = t, mg->nt = nt, mg->kvh = kvh, mg->part0 = n_parts, mg->n_parts = ns;
                    }
                    for (int k = 0; k < ns; k++) {
                        struct tp_attn_item *it = &m->attn_items[n_items++];
                        it->t0 = t, it->nt = nt, it->kvh = kvh;
                        it->k0 = lo + (int)((int64_t)span * k / ns);
                        it->k1 = lo + (int)((int64_t)span * (k + 1) / ns);
                        it->part = ns > 1 ? n_parts++ : -1;
                    }
                }
            }
            t += nt;
        }
    }
    if (n_items > m->n_threads) qsort(m->attn_items, (size_t)n_items, sizeof *m->attn_items, item_cost_desc);
    m->n_attn_items = n_items;
    m->n_attn_merge = n_merge;
    return work;
}

/* Bias, q/k norm, RoPE and the KV-cache store for every token of the whole
 * heads among QKV rows [i0, i1) (Q heads, then K, then V; i0 and i1 on head
 * boundaries): done by the thread that computed those rows, right after. */
static void qkv_post(tp_model_t *m, const struct tp_layer *L, int64_t i0, int64_t i1)
{
    const struct tp_hparams *hp = &m->hp;
    const struct tp_batch *b = m->batch;
    const int hd = m->hd;
    const int64_t nq = m->q_dim, nk = m->kv_dim;
    for (int64_t h0 = i0; h0 < i1; h0 += hd) {
        for (int t = 0; t < m->n_tok; t++) {
            const float *cs = m->rope_cs + (size_t)t * hp->rope_dim;
            if (h0 < nq) {
                float *q = m->q + (size_t)t * m->q_dim + h0;
                if (L->bq)
                    for (int i = 0; i < hd; i++) q[i] += L->bq[h0 + i];
                if (L->q_norm) tp_op_rmsnorm(q, q, L->q_norm, hd, hp->norm_eps);
                tp_op_rope(q, cs, hp->rope_dim, hp->rope_neox);
                continue;
            }
            const int is_k = h0 < nq + nk;
            const int64_t c = is_k ? h0 - nq : h0 - nq - nk; /* column in kv_dim */
            float *kv = (is_k ? m->k : m->v) + (size_t)t * m->kv_dim + c;
            const float *bias = is_k ? L->bk : L->bv;
            if (bias)
                for (int i = 0; i < hd; i++) kv[i] += bias[c + i];
            if (is_k) {
                if (L->k_norm) tp_op_rmsnorm(kv, kv, L->k_norm, hd, hp->norm_eps);
                tp_op_rope(kv, cs, hp->rope_dim, hp->rope_neox);
            }
            const int l = m->cur_layer;
            tp_kv_store_at(m->kv_type, kv_rows(m, is_k ? m->k_cache : m->v_cache, l, b->seq[t], (int)(c / hd)), !is_k,
                           b->pos[t] % m->kv_cap[l], kv, hd);
        }
    }
}

/* Whether the dense O and DOWN jobs add their rows into the residual themselves (residual_rows): at one
 * rank, where proj needs no all_sum first. */
static int residual_in_jobs(const tp_model_t *m) { return !m->shard.all_sum; }

/* x[t, i0..i1) += proj[t, i0..i1) for every token.  Where residual_in_jobs, the O and DOWN jobs call it
 * for the rows each thread just wrote, so that no thread reads another's half of proj and the next
 * norm's blocks of x are mostly where the same thread wrote them (prep_blocks). */
static void residual_rows(tp_model_t *m, int64_t i0, int64_t i1)
{
    const size_t E = (size_t)m->hp.n_embd;
    for (int t = 0; t < m->n_tok; t++)
        for (int64_t i = i0; i < i1; i++) m->x[(size_t)t * E + (size_t)i] += m->proj[(size_t)t * E + (size_t)i];
}

/* Items [i0, i1) of the current job. */
static void job_range(tp_model_t *m, int ith, int64_t i0, int64_t i1)
{
    const struct tp_layer *L = m->cur_layer >= 0 ? &m->layers[m->cur_layer] : NULL;
    int n_tok = m->n_tok;
    size_t as = m->act_row_max;
    switch (m->phase) {
    case TP_PH_PREP: prep_rows(m, i0, i1); break;
    case TP_PH_PREP_BLOCKS: prep_blocks(m, ith, i0, i1); break;
    case TP_PH_QKV: {
        int64_t nq = L->wq.rows, nk = L->wk.rows;
        mm(&L->wq, act_for(m, L->wq.type), as, n_tok, m->q, m->q_dim, TP_MAX(i0, 0), TP_MIN(i1, nq));
        mm(&L->wk, act_for(m, L->wk.type), as, n_tok, m->k, m->kv_dim, TP_MAX(i0 - nq, 0), TP_MIN(i1 - nq, nk));
        mm(&L->wv, act_for(m, L->wv.type), as, n_tok, m->v, m->kv_dim, TP_MAX(i0 - nq - nk, 0),
           TP_MIN(i1 - nq - nk, nk));
        qkv_post(m, L, i0, i1);
        break;
    }
    case TP_PH_ATTN:
        for (int64_t i = i0; i < i1; i++) attn_item(m, ith, &m->attn_items[i]);
        break;
    case TP_PH_ATTN_MERGE:
        for (int64_t i = i0; i < i1; i++) attn_merge_one(m, &m->attn_merge[i]);
        break;
    case TP_PH_O:
        mm(&L->wo, act_for(m, L->wo.type), as, n_tok, m->proj, m->hp.n_embd, i0, i1);
        if (residual_in_jobs(m)) residual_rows(m, i0, i1);
        break;
    case TP_PH_FFN_UP:
    case TP_PH_SHEXP_UP: {
        const struct tp_wmat *g = m->phase == TP_PH_FFN_UP ? &L->wgate : &L->sgate;
        const struct tp_wmat *u = m->phase == TP_PH_FFN_UP ? &L->wup : &L->sup;
        const int64_t F = m->ff_cur;
        mm(g, act_for(m, g->type), as, n_tok, m->hb, F, i0, i1);
        mm(u, act_for(m, u->type), as, n_tok, m->hb2, F, i0, i1);
        for (int t = 0; t < n_tok; t++) {
            float *h = m->hb + (size_t)t * F;
            tp_op_swiglu(h + i0, h + i0, m->hb2 + (size_t)t * F + i0, (int)(i1 - i0));
        }
        break;
    }
    case TP_PH_DOWN:
        mm(&L->wdown, act_for(m, L->wdown.type), as, n_tok, m->proj, m->hp.n_embd, i0, i1);
        if (residual_in_jobs(m)) residual_rows(m, i0, i1);
        break;
    case TP_PH_SHEXP_DOWN:
        mm(&L->sdown, act_for(m, L->sdown.type), as, n_tok, m->proj, m->hp.n_embd, i0, i1);
        break;
    case TP_PH_LOGITS:
        mm(&m->output, act_for(m, m->output.type), as, m->n_out, m->logits_out, m->n_vocab_l, i0, i1);
        break;
    case TP_PH_ROUTER:
        mm(&L->wrouter, act_for(m, L->wrouter.type), as, n_tok, m->router_logits, m->hp.n_expert, i0, i1);
        break;
    case TP_PH_MOE_UP: { /* items: (active expert a, row r) as a * n_ff_l + r */
        const int64_t F = m->n_ff_l;
        for (int64_t a = i0 / F; a * F < i1; a++) {
            const int e = m->moe_active[a], p0 = m->moe_off[e], np = m->moe_off[e + 1] - p0;
            const int64_t r0 = TP_MAX(i0 - a * F, 0), r1 = TP_MIN(i1 - a * F, F);
            float *g = m->hb + (size_t)p0 * F, *u = m->hb2 + (size_t)p0 * F;
            mm(&L->xgate[e], act_for(m, L->xgate[e].type) + (size_t)p0 * as, as, np, g, F, r0, r1);
            mm(&L->xup[e], act_for(m, L->xup[e].type) + (size_t)p0 * as, as, np, u, F, r0, r1);
            if (L->xgate_b) { /* gpt-oss: expert biases, then the clamped SwiGLU */
                const size_t bx = (size_t)(e - m->expert0) * (size_t)F; /* held experts' rows */
                const float *bg = L->xgate_b + bx, *bu = L->xup_b + bx;
                for (int q = 0; q < np; q++)
                    for (int64_t r = r0; r < r1; r++) {
                        g[q * F + r] += bg[r];
                        u[q * F + r] += bu[r];
                    }
            }
            for (int q = 0; q < np; q++) {
                if (m->hp.swiglu_limit > 0.0f)
                    tp_op_swiglu_clamped(g + q * F + r0, g + q * F + r0, u + q * F + r0, (int)(r1 - r0),
                                         m->hp.swiglu_alpha, m->hp.swiglu_limit);
                else
                    tp_op_swiglu(g + q * F + r0, g + q * F + r0, u + q * F + r0, (int)(r1 - r0));
            }
        }
        break;
    }
    case TP_PH_MOE_DOWN: { /* items: (active expert a, output row r) as a * n_embd + r */
        const int64_t E = m->hp.n_embd;
        for (int64_t a = i0 / E; a * E < i1; a++) {
            const int e = m->moe_active[a], p0 = m->moe_off[e], np = m->moe_off[e + 1] - p0;
            const int64_t r0 = TP_MAX(i0 - a * E, 0), r1 = TP_MIN(i1 - a * E, E);
            mm(&L->xdown[e], act_for(m, L->xdown[e].type) + (size_t)p0 * as, as, np, m->moe_x + (size_t)p0 * E, E, r0,
               r1);
            if (L->xdown_b) /* gpt-oss: the expert's down bias, on the rank holding column 0 */
                for (int q = 0; q < np; q++) {
                    float *o = m->moe_x + (size_t)(p0 + q) * E;
                    for (int64_t r = r0; r < r1; r++) o[r] += L->xdown_b[(size_t)(e - m->expert0) * E + r];
                }
        }
        break;
    }
    }
}

/* Pool job of the norms and the attention: threads claim chunks of the work
 * until none is left, so a thread that is descheduled (shared cores) or slower
 * does not hold up the others.  Guided sizes: each claim takes 1/(2 nth) of
 * what is left (a multiple of chunk_align, at least chunk_size), so the first
 * chunks are long (few claims) and the last are short (the threads finish
 * within one short chunk of each other at the barrier); the attention's items
 * are sorted longest first (attn_plan). */
static void job(void *ctx, int ith, int nth)
{
    tp_model_t *m = ctx;
    const int64_t total = m->chunk_total, align = m->chunk_align, min = m->chunk_size;
    long long i0 = atomic_load_explicit(&m->chunk_next, memory_order_relaxed);
    while (i0 < total) {
        int64_t len = (total - (int64_t)i0) / (2 * (int64_t)nth);
        len = len / align * align;
        if (len < min) len = min;
        const long long i1 = (long long)TP_MIN((int64_t)i0 + len, total);
        if (atomic_compare_exchange_weak_explicit(&m->chunk_next, &i0, i1, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            job_range(m, ith, i0, i1);
            i0 = atomic_load_explicit(&m->chunk_next, memory_order_relaxed);
        }
    }
}

/* Pool job of a matmul: each thread walks its own contiguous share of the rows
 * front to back, so the weights it reads are one stream in memory order (a
 * new stream at every claim, as the guided split made, costs the hardware
 * prefetcher its start each time); a thread done with its share steals from
 * the back of the others' (tp_worksplit), so one that is descheduled or slower
 * does not hold up the rest.  Units of chunk_align rows. */
static void job_owned(void *ctx, int ith, int nth)
{
    (void)nth;
    tp_model_t *m = ctx;
    const int64_t total = m->chunk_total, align = m->chunk_align;
    uint64_t u0, u1;
    int cursor = 0;
    while (tp_worksplit_next(m->split, ith, &cursor, &u0, &u1))
        job_range(m, ith, (int64_t)u0 * align, TP_MIN((int64_t)u1 * align, total));
}

/* Bytes a matmul job streams: the weights, once per 8 tokens (tiles reuse them). */
static uint64_t mm_work(const struct tp_wmat *w, int n_tok)
{
    return (uint64_t)w->row_bytes * (uint64_t)w->rows * (uint64_t)(1 + n_tok / 8);
}

/* Run phase ph over total items in chunks of a multiple of `align` (kernels
 * like whole groups of rows), the smallest about 1/32 of a thread's share: a
 * matmul in owned shares (job_owned()), the norms and the attention in guided
 * chunks (job()).  work: approximate bytes touched, to keep tiny jobs off the
 * pool. */
static void run(tp_model_t *m, enum tp_fwd_phase ph, int64_t total, int64_t align, uint64_t work)
{
    int nth = m->n_threads;
    int64_t cs = total / ((int64_t)nth * 32);
    cs = (cs + align - 1) / align * align;
    if (cs < align) cs = align;
    m->phase = ph;
    m->chunk_total = total;
    m->chunk_align = align;
    m->chunk_size = cs;
    atomic_store_explicit(&m->chunk_next, 0, memory_order_relaxed);
    uint64_t *ns_kind = &m->stats.ns_matmul; /* the stats counter of this kind of job (-Wswitch: every phase) */
    switch (ph) {
    case TP_PH_PREP:
    case TP_PH_PREP_BLOCKS: ns_kind = &m->stats.ns_prep; break;
    case TP_PH_ATTN:
    case TP_PH_ATTN_MERGE: ns_kind = &m->stats.ns_attn; break;
    case TP_PH_LOGITS: ns_kind = &m->stats.ns_logits; break;
    case TP_PH_QKV:
    case TP_PH_O:
    case TP_PH_FFN_UP:
    case TP_PH_DOWN:
    case TP_PH_ROUTER:
    case TP_PH_MOE_UP:
    case TP_PH_MOE_DOWN:
    case TP_PH_SHEXP_UP:
    case TP_PH_SHEXP_DOWN: ns_kind = &m->stats.ns_matmul; break;
    }
    /* owned shares: the matmuls, and the split preparation (its shares the same parts of a row) */
    const int owned = ns_kind == &m->stats.ns_matmul || ns_kind == &m->stats.ns_logits || ph == TP_PH_PREP_BLOCKS;
    const uint64_t t0 = tp_now_ns();
    if (nth == 1 || work < TP_FWD_MIN_PARALLEL_WORK)
        job_range(m, 0, 0, total);
    else if (owned &&
             tp_worksplit_reset(m->split, (uint64_t)((total + align - 1) / align), (uint64_t)(cs / align)) == TP_OK)
        tp_pool_run(m->pool, job_owned, m);
    else
        tp_pool_run(m->pool, job, m);
    *ns_kind += tp_now_ns() - t0;
}

/*
 * The mixture-of-experts FFN of layer L (input: the residual m->x; output:
 * this rank's partial sum in m->proj, before the all_sum).  Every token is
 * routed (replicated router), then the (token, expert) pairs are grouped by
 * expert (counting sort, tokens in batch order within an expert) and only the
 * held experts that some token selected run, each over all of its tokens at
 * once: its weights are streamed once per call whatever the batch, and the
 * experts nobody selected are never read.  Pair p's input row is the normed
 * x of its token (gathered into moe_x), its hidden rows hb / hb2 row p, its
 * output moe_x row p; proj[t] = sum of w_p * output_p over t's pairs, in
 * expert order, added to the gated shared expert's output (Qwen2-MoE, on the
 * rank holding it).
 */
static void moe_ffn(tp_model_t *m, const struct tp_layer *L, int n_tok)
{
    const struct tp_hparams *hp = &m->hp;
    const int E = hp->n_embd, X = hp->n_expert, k = hp->n_expert_used, F = m->n_ff_l;
    const int e0 = m->expert0, e1 = m->expert0 + m->n_expert_l;
    enum tp_wtype rt = L->wrouter.type;
    prep_act(m, m->x, m->xb, L->ffn_norm, n_tok, E, &rt, 1);
    run(m, TP_PH_ROUTER, X, 16, mm_work(&L->wrouter, n_tok));
    int *off = m->moe_off, *cur = m->moe_active;
    memset(off, 0, sizeof(int) * (size_t)(X + 1));
    for (int t = 0; t < n_tok; t++) {
        int *sel = m->moe_sel + (size_t)t * k;
        float *lg = m->router_logits + (size_t)t * X;
        if (L->brouter)
            for (int e = 0; e < X; e++) lg[e] += L->brouter[e];
        if (hp->router_softmax_topk) tp_moe_route_topk_softmax(lg, X, k, sel, m->moe_wsel + (size_t)t * k);
        else tp_moe_route(lg, X, k, hp->expert_weights_norm, sel, m->moe_wsel + (size_t)t * k);
        for (int j = 0; j < k; j++)
            if (sel[j] >= e0 && sel[j] < e1) off[sel[j] + 1]++;
    }
    for (int e = 0; e < X; e++) off[e + 1] += off[e];
    memcpy(cur, off, sizeof(int) * (size_t)X);
    for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < k; j++) {
            const int e = m->moe_sel[(size_t)t * k + j];
            if (e < e0 || e >= e1) continue;
            const int p = cur[e]++;
            m->moe_pair_tok[p] = t;
            m->moe_pair_w[p] = m->moe_wsel[(size_t)t * k + j];
        }
    const int n_pairs = off[X];
    if (m->holds_shexp) { /* Qwen2-MoE: proj = sigmoid(g . xb) * shared_expert(xb), this rank's columns of it */
        const int S = m->n_shexp_l;
        enum tp_wtype st[2] = {L->sgate.type, L->sup.type};
        prep_act(m, m->xb, NULL, NULL, n_tok, E, st, 2);
        m->ff_cur = S;
        run(m, TP_PH_SHEXP_UP, S, 16, mm_work(&L->sgate, n_tok) + mm_work(&L->sup, n_tok));
        enum tp_wtype sd = L->sdown.type;
        prep_act(m, m->hb, NULL, NULL, n_tok, S, &sd, 1);
        run(m, TP_PH_SHEXP_DOWN, E, 16, mm_work(&L->sdown, n_tok));
        for (int t = 0; t < n_tok; t++) {
            const float g = 1.0f / (1.0f + expf(-tp_op_dot(m->xb + (size_t)t * E, L->sgate_inp, E)));
            float *y = m->proj + (size_t)t * E;
            for (int i = 0; i < E; i++) y[i] *= g;
        }
    } else {
        memset(m->proj, 0, sizeof(float) * (size_t)n_tok * (size_t)E);
    }
    if (n_pairs == 0) return; /* none of this rank's experts was selected: its part is the shared expert's */
    int n_active = 0;
    uint64_t up_work = 0, down_work = 0;
    for (int e = e0; e < e1; e++) {
        const int np = off[e + 1] - off[e];
        if (np == 0) continue;
        m->moe_active[n_active++] = e;
        m->stats.expert_runs++;
        up_work += mm_work(&L->xgate[e], np) + mm_work(&L->xup[e], np);
        down_work += mm_work(&L->xdown[e], np);
        m->stats.expert_bytes += (uint64_t)L->xgate[e].rows * L->xgate[e].row_bytes +
                                 (uint64_t)L->xup[e].rows * L->xup[e].row_bytes +
                                 (uint64_t)L->xdown[e].rows * L->xdown[e].row_bytes;
    }
    m->moe_n_active = n_active;
    const int ea = m->moe_active[0];
    enum tp_wtype up_types[2] = {L->xgate[ea].type, L->xup[ea].type};
    if (n_tok == 1) { /* decode: the one token's row prepared once, copied to each of its pairs */
        prep_act(m, m->xb, NULL, NULL, 1, E, up_types, 2);
        for (int j = 0; j < m->prep_used; j++) {
            const size_t rb = tp_kern_act_row_bytes(m->act_type[j], E);
            for (int p = 1; p < n_pairs; p++) memcpy(m->act[j] + (size_t)p * m->act_row_max, m->act[j], rb);
        }
    } else {
        for (int p = 0; p < n_pairs; p++)
            memcpy(m->moe_x + (size_t)p * E, m->xb + (size_t)m->moe_pair_tok[p] * E, sizeof(float) * (size_t)E);
        prep_act(m, m->moe_x, NULL, NULL, n_pairs, E, up_types, 2);
    }
    run(m, TP_PH_MOE_UP, (int64_t)n_active * F, 16, up_work);
    enum tp_wtype d_type = L->xdown[ea].type;
    prep_act(m, m->hb, NULL, NULL, n_pairs, F, &d_type, 1);
    run(m, TP_PH_MOE_DOWN, (int64_t)n_active * E, 16, down_work);
    for (int p = 0; p < n_pairs; p++)
        tp_op_axpy(m->proj + (size_t)m->moe_pair_tok[p] * E, m->moe_pair_w[p], m->moe_x + (size_t)p * E, E);
}

static enum tp_status all_sum(tp_model_t *m, float *buf, size_t count)
{
    if (!m->shard.all_sum) return TP_OK;
    uint64_t t0 = tp_now_ns();
    enum tp_status rc = m->shard.all_sum(m->shard.all_sum_ctx, buf, count);
    m->stats.ns_all_sum += tp_now_ns() - t0;
    if (rc != TP_OK) tp_error_force(&m->err, rc, "all_sum hook failed: %s", tp_status_str(rc));
    return rc;
}

/* The residual after a block's output projection: proj summed over the ranks, then added to x, unless
 * the O / DOWN job already added each thread's rows (job_added: that job ran and residual_in_jobs). */
static enum tp_status add_residual(tp_model_t *m, int n_tok, int job_added)
{
    if (job_added) return TP_OK;
    const enum tp_status rc = all_sum(m, m->proj, (size_t)n_tok * (size_t)m->hp.n_embd);
    if (rc != TP_OK) return rc;
    residual_rows(m, 0, m->hp.n_embd);
    return TP_OK;
}

/* Sliding-window rings: the lowest position ring layer l still holds for sequence s once positions
 * below hi have been written (rows are reused every kv_cap[l] positions; a copied-in prefix, base,
 * holds only its last window positions). */
static int ring_lo(const tp_model_t *m, int l, int s, int hi)
{
    const int W = m->layers[l].attn_window, base = m->seq_base[s];
    return TP_MAX(hi - m->kv_cap[l], base > W - 1 ? base - W + 1 : 0);
}

/* 1 if every ring layer still holds the window of a query at position p of sequence s, with
 * positions below hi written. */
static int ring_holds(const tp_model_t *m, int s, int p, int hi)
{
    for (int l = 0; m->n_ring > 0 && l < m->hp.n_layer; l++) {
        if (m->kv_cap[l] >= m->n_ctx) continue;
        if (TP_MAX(0, p - m->layers[l].attn_window + 1) < ring_lo(m, l, s, hi)) return 0;
    }
    return 1;
}

static enum tp_status check_batch(tp_model_t *m, const struct tp_batch *b)
{
    if (m->vocab_only) return tp_error_force(&m->err, TP_ERR_INVALID_ARG, "model was loaded vocab-only: no forward pass");
    if (!b || b->n_tokens < 1 || b->n_tokens > m->n_batch || !b->token || !b->pos || !b->seq)
        return tp_error_force(&m->err, TP_ERR_INVALID_ARG, "batch: %d tokens (want 1..n_batch %d) with token/pos/seq arrays",
                            b ? b->n_tokens : -1, m->n_batch);
    memcpy(m->seq_tmp, m->seq_len, (size_t)m->n_seq * sizeof(int));
    for (int s = 0; s < m->n_seq; s++) m->seq_last[s] = -1;
    for (int i = 0; i < b->n_tokens; i++) {
        int tok = b->token[i], s = b->seq[i], p = b->pos[i];
        if (tok < 0 || tok >= m->hp.n_vocab)
            return tp_error_force(&m->err, TP_ERR_INVALID_ARG, "batch[%d]: token id %d is out of range [0, %d)", i, tok,
                                m->hp.n_vocab);
        if (s < 0 || s >= m->n_seq)
            return tp_error_force(&m->err, TP_ERR_INVALID_ARG, "batch[%d]: sequence slot %d is out of range [0, %d)", i, s,
                                m->n_seq);
        if (p < 0 || p >= m->n_ctx)
            return tp_error_force(&m->err, TP_ERR_INVALID_ARG,
                                "batch[%d]: position %d is outside the context [0, %d); raise n_ctx or shorten the input",
                                i, p, m->n_ctx);
        if (p > m->seq_tmp[s])
            return tp_error_force(&m->err, TP_ERR_INVALID_ARG,
                                "batch[%d]: position %d of sequence %d skips ahead of its cache (%d positions)", i, p, s,
                                m->seq_tmp[s]);
        if (p <= m->seq_last[s])
            return tp_error_force(&m->err, TP_ERR_INVALID_ARG,
                                "batch[%d]: position %d of sequence %d is not after its previous token (%d) in this batch",
                                i, p, s, m->seq_last[s]);
        m->seq_last[s] = p;
        m->seq_tmp[s] = TP_MAX(m->seq_tmp[s], p + 1);
    }
    for (int i = 0; m->n_ring > 0 && i < b->n_tokens; i++) {
        const int s = b->seq[i], p = b->pos[i];
        if (!ring_holds(m, s, p, TP_MAX(m->seq_hi[s], m->seq_tmp[s])))
            return tp_error_force(&m->err, TP_ERR_INVALID_ARG,
                                  "batch[%d]: position %d of sequence %d needs keys that its sliding-window ring no longer "
                                  "holds (it was written up to position %d); clear the sequence and prefill it again "
                                  "(tp_model_seq_reusable tells how far a sequence can be reused)",
                                  i, p, s, m->seq_hi[s] - 1);
    }
    return TP_OK;
}

enum tp_status tp_model_forward(tp_model_t *m, const struct tp_batch *b, float *out)
{
    if (!m) return TP_ERR_INVALID_ARG;
    uint64_t t_start = tp_now_ns();
    const uint64_t expert_bytes0 = m->stats.expert_bytes;
    enum tp_status rc = check_batch(m, b);
    if (rc != TP_OK) return rc;
    const struct tp_hparams *hp = &m->hp;
    const int n_tok = b->n_tokens, E = hp->n_embd, hd = m->hd;
    m->batch = b;
    m->n_tok = n_tok;
    m->hidden_valid = 0;

    /* embeddings */
    for (int t = 0; t < n_tok; t++) dequant_row(&m->tok_embd, b->token[t], m->x + (size_t)t * E);
    for (int t = 0; t < n_tok; t++) tp_op_rope_cs(m->rope_cs + (size_t)t * hp->rope_dim, m->inv_freq, hp->rope_dim, b->pos[t]);
    if (hp->rope_scaling == TP_ROPE_SCALING_YARN && hp->rope_attn_factor > 0.0f && hp->rope_attn_factor != 1.0f)
        for (size_t i = 0; i < (size_t)n_tok * (size_t)hp->rope_dim; i++) m->rope_cs[i] *= hp->rope_attn_factor;

    int qkv_align = hd; /* lcm(hd, 16) */
    while (qkv_align % 16) qkv_align += hd;
    for (int l = 0; l < hp->n_layer; l++) {
        const struct tp_layer *L = &m->layers[l];
        m->cur_layer = l;
        /* attention */
        enum tp_wtype qkv_types[3] = {L->wq.type, L->wk.type, L->wv.type};
        prep_act(m, m->x, m->xb, L->attn_norm, n_tok, E, qkv_types, 3);
        /* chunks of whole heads (and of the kernels' 16-row groups): qkv_post
         * finishes each head in the thread that computed it */
        run(m, TP_PH_QKV, L->wq.rows + L->wk.rows + L->wv.rows, qkv_align,
            mm_work(&L->wq, n_tok) + mm_work(&L->wk, n_tok) + mm_work(&L->wv, n_tok));
        const uint64_t att_work = attn_plan(m, l);
        run(m, TP_PH_ATTN, m->n_attn_items, 1, att_work);
        if (m->n_attn_merge > 0)
            run(m, TP_PH_ATTN_MERGE, m->n_attn_merge, 1, (uint64_t)m->n_attn_merge * (uint64_t)m->hd * 64u);
        enum tp_wtype o_type = L->wo.type;
        prep_act(m, m->att, NULL, NULL, n_tok, m->q_dim, &o_type, 1);
        run(m, TP_PH_O, L->wo.rows, 16, mm_work(&L->wo, n_tok));
        TP_CHECK_GOTO(add_residual(m, n_tok, residual_in_jobs(m)), rc, out);
        if (L->bo) /* attn_output bias (gpt-oss): every rank, after the sum */
            for (int t = 0; t < n_tok; t++) tp_op_axpy(m->x + (size_t)t * E, 1.0f, L->bo, E);
        /* feed-forward */
        if (hp->n_expert > 0) {
            moe_ffn(m, L, n_tok);
        } else {
            enum tp_wtype ffn_types[2] = {L->wgate.type, L->wup.type};
            prep_act(m, m->x, m->xb, L->ffn_norm, n_tok, E, ffn_types, 2);
            m->ff_cur = m->n_ff_l;
            run(m, TP_PH_FFN_UP, L->wgate.rows, 16, mm_work(&L->wgate, n_tok) + mm_work(&L->wup, n_tok));
            enum tp_wtype d_type = L->wdown.type;
            prep_act(m, m->hb, NULL, NULL, n_tok, m->n_ff_l, &d_type, 1);
            run(m, TP_PH_DOWN, L->wdown.rows, 16, mm_work(&L->wdown, n_tok));
        }
        TP_CHECK_GOTO(add_residual(m, n_tok, residual_in_jobs(m) && hp->n_expert == 0), rc, out);
    }
    /* sequences now hold the new positions */
    memcpy(m->seq_len, m->seq_tmp, (size_t)m->n_seq * sizeof(int));
    m->hidden_valid = 1; /* x holds every token's final residual (tp_model_hidden) */
    for (int s = 0; s < m->n_seq; s++) m->seq_hi[s] = TP_MAX(m->seq_hi[s], m->seq_len[s]);

    /* logits for the tokens that want them */
    m->n_out = 0;
    for (int t = 0; t < n_tok; t++)
        if (!b->logits || b->logits[t]) {
            if (!b->logits && t != n_tok - 1) continue; /* no flags: last token only */
            tp_op_rmsnorm(m->xb + (size_t)m->n_out * E, m->x + (size_t)t * E, m->output_norm, E, hp->norm_eps);
            m->n_out++;
        }
    if (m->n_out > 0 && out) {
        enum tp_wtype out_type = m->output.type;
        prep_act(m, m->xb, NULL, NULL, m->n_out, E, &out_type, 1);
        m->cur_layer = -1;
        m->logits_out = out;
        run(m, TP_PH_LOGITS, m->output.rows, 16, mm_work(&m->output, m->n_out));
    }
out:
    if (b->n_tokens == 1) {
        m->stats.n_decode++;
        m->stats.expert_bytes_decode += m->stats.expert_bytes - expert_bytes0;
    }
    m->stats.n_forward++;
    m->stats.n_tokens += (uint64_t)n_tok;
    m->stats.ns_forward += tp_now_ns() - t_start;
    return rc;
}

enum tp_status tp_model_hidden(const tp_model_t *m, int t, float *out)
{
    if (!m || !out || !m->hidden_valid || t < 0 || t >= m->n_tok) return TP_ERR_INVALID_ARG;
    const int E = m->hp.n_embd;
    tp_op_rmsnorm(out, m->x + (size_t)t * E, m->output_norm, E, m->hp.norm_eps);
    return TP_OK;
}

void tp_model_seq_truncate(tp_model_t *m, int seq, int from_pos)
{
    if (!m || !m->seq_len || seq < 0 || seq >= m->n_seq || from_pos < 0) return;
    if (from_pos < m->seq_len[seq]) m->seq_len[seq] = from_pos;
    if (m->seq_len[seq] == 0) m->seq_hi[seq] = m->seq_base[seq] = 0;
}

int tp_model_seq_reusable(const tp_model_t *m, int seq, int n_pos)
{
    if (!m || !m->seq_len || seq < 0 || seq >= m->n_seq || n_pos <= 0) return 0;
    const int n = n_pos;
    if (m->n_ring == 0) return n;
    /* continuing at n writes position n; every smaller n needs keys at least as old */
    return ring_holds(m, seq, n, TP_MAX(m->seq_hi[seq], n + 1)) ? n : 0;
}

enum tp_status tp_model_kv_copy(tp_model_t *m, int dst_seq, int src_seq, int n_pos)
{
    if (!m) return TP_ERR_INVALID_ARG;
    if (!m->seq_len || !m->k_cache || !m->v_cache)
        return tp_error_force(&m->err, TP_ERR_INVALID_ARG, "KV copy: the model has no KV cache (vocab-only load)");
    if (dst_seq < 0 || dst_seq >= m->n_seq || src_seq < 0 || src_seq >= m->n_seq)
        return tp_error_force(&m->err, TP_ERR_INVALID_ARG, "KV copy from sequence %d to %d: slots are 0..%d",
                              src_seq, dst_seq, m->n_seq - 1);
    if (dst_seq == src_seq)
        return tp_error_force(&m->err, TP_ERR_INVALID_ARG, "KV copy: source and destination are both sequence %d",
                              src_seq);
    if (n_pos < 0 || n_pos > m->n_ctx)
        return tp_error_force(&m->err, TP_ERR_INVALID_ARG, "KV copy of %d positions: want 0..%d (the context size)",
                              n_pos, m->n_ctx);
    if (n_pos > m->seq_len[src_seq])
        return tp_error_force(&m->err, TP_ERR_INVALID_ARG,
                              "KV copy of %d positions from sequence %d, which holds only %d", n_pos, src_seq,
                              m->seq_len[src_seq]);
    if (n_pos > 0 && !ring_holds(m, src_seq, n_pos, TP_MAX(m->seq_hi[src_seq], n_pos + 1)))
        return tp_error_force(&m->err, TP_ERR_INVALID_ARG,
                              "KV copy of %d positions from sequence %d: its sliding-window ring no longer holds the "
                              "window before position %d (written up to %d)",
                              n_pos, src_seq, n_pos, m->seq_hi[src_seq] - 1);
    /* per layer and KV head: rows [0, n_pos) of a full layer; the last window positions of a ring */
    const size_t rb = m->kv_row_bytes;
    for (int l = 0; l < m->hp.n_layer && n_pos > 0; l++) {
        const int cap = m->kv_cap[l];
        const int p0 = cap < m->n_ctx ? TP_MAX(0, n_pos - m->layers[l].attn_window + 1) : 0;
        for (int kvh = 0; kvh < m->nkv; kvh++)
            for (int c = 0; c < 2; c++) {
                uint8_t *cache = c ? m->v_cache : m->k_cache;
                uint8_t *d = kv_rows(m, cache, l, dst_seq, kvh);
                const uint8_t *sr = kv_rows(m, cache, l, src_seq, kvh);
                for (int p = p0; p < n_pos;) { /* runs of rows up to the ring's end */
                    const int r0 = p % cap, n = TP_MIN(n_pos - p, cap - r0);
                    /* a tiled cache's rows are spread over their tiles: whole tiles (cap is whole tiles); the
                     * other rows they hold are positions outside the copy, never read before rewritten */
                    const int64_t tile = tp_kv_cap_rows(m->kv_type, 1); /* rows per tile: 1 when row-major */
                    const int64_t c0 = r0 / tile * tile, c1 = tp_kv_cap_rows(m->kv_type, r0 + n);
                    memcpy(d + (size_t)c0 * rb, sr + (size_t)c0 * rb, (size_t)(c1 - c0) * rb);
                    p += n;
                }
            }
    }
    m->seq_hi[dst_seq] = n_pos;
    m->seq_base[dst_seq] = n_pos;
    m->seq_len[dst_seq] = n_pos;
    return TP_OK;
}

void tp_model_get_stats(const tp_model_t *m, struct tp_model_stats *out)
{
    if (m && out) *out = m->stats;
}

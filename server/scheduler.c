/*
 * server/scheduler.c - the request scheduler (engine thread) on rank 0: a
 * bounded request queue, --parallel sequence slots, continuous batching with
 * chunked prefill, prefix reuse, speculative decoding, and what happens
 * when a rank is lost.  Each step admits queued requests, builds one batch
 * (a decode token per generating slot, followed by its drafted tokens when
 * it decodes speculatively, then prompt chunks up to n_batch), runs
 * tp_parallel_step and publishes each slot's tokens to its request: one, or
 * with drafts every draft its row confirms plus one (slot_verify).  The
 * token loop allocates nothing but the growing per-request text.  The step
 * and the failure behaviour in detail: docs/serving.md ("Engine"),
 * docs/speculative.md and docs/recovery.md.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server_impl.h"

_Static_assert(TP_MAX_LOGIT_BIAS <= TP_PARALLEL_BIAS_PER_ROW, "a request's logit_bias must fit one step row");

struct slot {
    struct tp_req *req;      /* NULL: free */
    tp_sampler_t *sampler;   /* per request (params differ), owned */
    tp_detok_t *detok;       /* owned, reset per request */
    struct tp_buf text;      /* all text generated so far (incl. held back) */
    size_t released;         /* bytes of text published to the request */
    int n_fed;               /* prompt tokens fed to the model */
    int n_past;              /* positions in the KV cache */
    int32_t last_tok;        /* next decode input */
    int fresh;               /* needs its KV sequence cleared (from clear_from) in the next step */
    int clear_from;          /* first position not reused from the previous request */
    int32_t *hist;           /* (n_ctx) tokens whose K/V this slot's cache holds, by position */
    int n_hist;
    uint64_t t_prev_tok_ns;
    struct tp_gstate *gst;   /* automaton state when the request has a grammar (owned, allocated once) */
    int dead_end;            /* this step's mask had no token left (logit_bias banned them all) */
    struct tp_gstate *gkey;  /* normal form of the state smask was computed for (owned) */
    int gkey_valid;
    uint32_t *smask;         /* (mask_words) the grammar mask of gkey (owned): reused while a string grows */
    int smask_maxcost;       /* the highest closing cost (tp_gstate_cost) a token of smask can leave */
    int gon;                 /* the grammar constrains this step: always for response_format and forced calls;
                              * with tool_choice "auto" only from where a call's JSON begins to where it ends */
    size_t gfrom;            /* auto: text offset from which the next call marker is looked for */
    int32_t marker_id;       /* auto: the token of the format's call marker (kept in the text), -1: none */
    /* speculative decoding (server/spec.h): the drafts fed in the step being built or run */
    struct tp_spec_adapt adapt;        /* this request's draft length from its running acceptance */
    int32_t draft[TP_SPEC_DRAFT_MAX];  /* (n_draft) fed at n_past + 1 .. n_past + n_draft */
    int n_draft;
    int pre_k;                         /* the draft model's drafts in draft[] for the step being built (-1: none) */
    struct tp_gstate *gdraft;          /* (draft_max) with a grammar: the state after draft[0..j] (owned) */
    uint32_t dead_rows;                /* bit j: draft row j (1..n_draft) has a mask that logit_bias emptied */
    int32_t hmsg_id, hstart_id; /* auto, harmony: <|message|> and <|start|> (-1: not in the vocabulary) */
};

struct tp_engine {
    struct tp_engine_config cfg;
    tp_parallel_t *p;
    tp_tokenizer_t *tok;
    struct tp_metrics *metrics;
    int n_vocab, n_ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct tp_req **queue;   /* ring (max_queue) */
    int q_head, q_len;
    struct slot *slots;      /* (n_parallel) */
    int stop, failed;
    char fail_reason[256];
    /* rank loss and recovery (mu) */
    int can_recover;          /* the group can re-form in place (ring/rdma, several ranks) */
    int recovering;           /* a rank was lost; the recovery thread re-forms the group. While set,
                                 only the recovery thread touches the group (no silent_rank()) */
    int rec_done;             /* the recovery thread finished (joinable) */
    enum tp_status rec_status;
    pthread_t rec_thread;
    int rec_thread_started;
    int lost_rank;            /* -1: not known */
    uint64_t lost_ns;         /* when it was lost */
    char lost_reason[300];
    int replanning;           /* the recovery thread re-forms the group without the lost rank */
    int replan_done;          /* the last recovery re-planned (log line) */
    char replan_note[512];    /* --on-rank-loss replan: why the survivors cannot go on without it ("": none) */
    struct tp_engine_recovery_stats rs;
    uint64_t last_ok_ns;     /* last successful step or ping */
    uint64_t last_ping_ns;   /* last idle ping started */
    uint64_t step_start_ns;  /* start of the step or ping in flight; 0: none */
    uint64_t n_generated;    /* tokens generated for requests since start */
    /* every rank's counters as the engine thread last read them (tp_parallel_get_rank_stats can wait
     * behind a step or ping stuck on a stopped rank; readers of these never do) */
    struct tp_parallel_stats *rank_stats; /* (TP_METRICS_RANKS_MAX), under mu */
    struct tp_parallel_stats *stats_tmp;  /* (TP_METRICS_RANKS_MAX), engine thread only */
    int n_ranks;                          /* world size, under mu */
    uint64_t stats_ns;                    /* engine thread: when last read */
    int stats_dirty;                      /* engine thread: a step ran since */
    /* step buffers, sized at init */
    int32_t *b_tok, *b_pos, *b_seq; /* (n_batch) */
    int8_t *b_logits;               /* (n_batch) */
    int rows_max;                   /* logits rows a step can have: min(n_batch, n_parallel x (1 + draft_max)) */
    int *row_slot;                  /* (rows_max) logits row -> slot */
    int32_t clear_seq[256], clear_from[256];
    /* KV copies decided by admit(), in admission order, sent with the next step */
    int32_t copy_dst[256], copy_src[256], copy_len[256];
    int n_copy;
    float *logits;                  /* (rows_max, n_vocab) */
    float *hidden;                  /* (n_embd) one token's final hidden state (embed_rows) */
    int32_t *ids;                   /* (rows_max) argmax per row of a greedy step */
    tp_spec_draft_t *draft;         /* --spec draft: the draft model, one sequence per slot (owned) */
    struct tp_spec_draft_req *dreq; /* (n_parallel) a draft round's requests */
    int draft_failed;               /* the draft model failed once (logged; drafting stopped) */
    /* speculative decoding and step counters (mu) */
    uint64_t spec_drafted, spec_accepted, decode_seq_steps, step_collectives;
    uint64_t spec_grammar_cuts;     /* walks ended by an accepted draft that switched the grammar */
    /* logit_bias of the step's rows, (rows_max x TP_MAX_LOGIT_BIAS) each; applied by the
     * parallel step on every rank's slice of the logits, so the sampler gets them biased */
    int32_t *bias_row, *bias_id;
    float *bias_val;
    /* constrained decoding: the vocabulary's token trie (built at the first
     * request with a grammar), one mask per logits row, end-of-generation ids */
    tp_token_trie_t *trie;
    tp_mask_ctx_t *mctx;
    int mask_words;
    uint32_t *mask;                 /* (rows_max x mask_words) */
    int32_t *mask_row;              /* (rows_max) */
    uint32_t *gscratch;             /* (mask_words) a draft row's plain grammar mask */
    int32_t *eog;                   /* (n_eog) */
    struct tp_gstate *gnorm;        /* scratch: a state's normal form */
    int n_eog;
    int trie_failed;
    char scratch[1024];
    pthread_t thread;
    int thread_started;
};

struct tp_req *tp_req_new(void)
{
    struct tp_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->refs = 2;
    pthread_cond_init(&r->cond, NULL);
    return r;
}

static void req_free(struct tp_req *r)
{
    tp_req_params_free(&r->params);
    free(r->prompt);
    free(r->toks);
    free(r->embd);
    tp_buf_free(&r->text);
    pthread_cond_destroy(&r->cond);
    free(r);
}

/* mu held */
static void req_unref(struct tp_req *r)
{
    if (--r->refs == 0) req_free(r);
}

void tp_engine_release(struct tp_engine *e, struct tp_req *r)
{
    pthread_mutex_lock(&e->mu);
    req_unref(r);
    pthread_mutex_unlock(&e->mu);
}

pthread_mutex_t *tp_engine_mutex(struct tp_engine *e) { return &e->mu; }

/* mu held: finish r (engine side) and drop the engine's reference.  With
 * TP_FINISH_ERROR, st and msg say why (r->err); otherwise they are unused. */
static void req_finish(struct tp_engine *e, struct tp_req *r, enum tp_finish f, enum tp_status st, const char *msg)
{
    (void)e;
    r->state = TP_REQ_DONE;
    r->finish = f;
    r->t_done_ns = tp_now_ns();
    if (f == TP_FINISH_ERROR)
        tp_error_force(&r->err, st != TP_OK ? st : TP_ERR_INTERNAL, "%s", msg ? msg : "internal error");
    pthread_cond_broadcast(&r->cond);
    req_unref(r);
}

#define TP_ENGINE_SILENT_MS 1000u /* heartbeats come every 200 ms */
#define TP_ENGINE_REJOIN_ATTEMPT_MS 5000u /* one attempt to re-form; bounds a shutdown during recovery */

/* mu held: a rank silent for more than TP_ENGINE_SILENT_MS: 1 with reason
 * filled.  Never while recovering (the group is being replaced). */
static int silent_rank(const struct tp_engine *e, char *reason, size_t cap)
{
    uint32_t ms = 0;
    if (e->recovering) return 0;
    /* a closed liveness link at once (an exited or killed rank), a silent one after TP_ENGINE_SILENT_MS */
    int r = tp_parallel_lost_rank(e->p, TP_ENGINE_SILENT_MS, &ms);
    if (r < 0) return 0;
    snprintf(reason, cap, "rank %d has not answered for %.1f s (stopped, hung, exited or unreachable)", r,
             ms / 1000.0);
    return 1;
}

enum tp_status tp_engine_submit(struct tp_engine *e, struct tp_req *r, struct tp_api_error *err)
{
    enum tp_status rc = TP_OK;
    char why[160];
    pthread_mutex_lock(&e->mu);
    if (silent_rank(e, why, sizeof why)) {
        rc = tp_api_err(err, TP_ERR_BUSY, NULL, "%s; retry shortly", why);
    } else if (e->failed) {
        rc = tp_api_err(err, TP_ERR_POISONED, NULL, "the engine failed (%s); restart the server", e->fail_reason);
    } else if (e->stop) {
        rc = tp_api_err(err, TP_ERR_BUSY, NULL, "the server is shutting down");
    } else if (e->q_len >= e->cfg.max_queue) {
        rc = tp_api_err(err, TP_ERR_FULL, NULL, "too many requests: %d are waiting (--max-queue); retry shortly",
                        e->q_len);
    } else {
        r->state = TP_REQ_QUEUED;
        r->t_submit_ns = tp_now_ns();
        e->queue[(e->q_head + e->q_len) % e->cfg.max_queue] = r;
        e->q_len++;
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void tp_engine_cancel(struct tp_engine *e, struct tp_req *r)
{
    pthread_mutex_lock(&e->mu);
    r->cancelled = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int tp_engine_healthy(struct tp_engine *e, char *reason, size_t cap)
{
    int ok = 1;
    pthread_mutex_lock(&e->mu);
    uint64_t now = tp_now_ns();
    if (e->failed) {
        snprintf(reason, cap, "engine failed: %s", e->fail_reason);
        ok = 0;
    } else if (e->recovering) {
        double ago = (double)(now - e->lost_ns) / 1e9;
        int phase = tp_parallel_rejoin_phase(e->p);
        char who[32] = "a rank";
        if (e->lost_rank >= 0) snprintf(who, sizeof who, "rank %d", e->lost_rank);
        if (e->replanning)
            snprintf(reason, cap,
                     "re-planning without %s (lost %.1f s ago: %s): the %d surviving rank(s) %s; %d request(s) queued",
                     who, ago, e->lost_reason, e->n_ranks - 1,
                     phase == 2 ? "are loading their new slices" : "are re-forming the group", e->q_len);
        else if (phase == 2)
            snprintf(reason, cap, "reloading: %s rejoined and is loading its slice (lost %.1f s ago: %s)", who, ago,
                     e->lost_reason);
        else if (e->replan_note[0])
            snprintf(reason, cap, "waiting for %s to rejoin (lost %.1f s ago: %s); %d request(s) queued; not "
                     "re-planning without it: %s", who, ago, e->lost_reason, e->q_len, e->replan_note);
        else
            snprintf(reason, cap, "waiting for %s to rejoin (lost %.1f s ago: %s); %d request(s) queued", who, ago,
                     e->lost_reason, e->q_len);
        ok = 0;
    } else if (silent_rank(e, reason, cap)) {
        ok = 0;
    } else if (e->step_start_ns && now - e->step_start_ns > 60000000000ull) {
        /* a step this long means a rank hangs (a dead one fails the step at once) */
        snprintf(reason, cap, "an engine step has been running for %.1f s", (double)(now - e->step_start_ns) / 1e9);
        ok = 0;
    } else if (!e->step_start_ns && now - e->last_ok_ns > 5000000000ull) {
        /* idle: the engine pings every second; no answer (or a ping stuck) for 5 s */
        snprintf(reason, cap, "the ranks have not answered for %.1f s", (double)(now - e->last_ok_ns) / 1e9);
        ok = 0;
    }
    pthread_mutex_unlock(&e->mu);
    return ok;
}

void tp_engine_gauges(struct tp_engine *e, struct tp_metrics_gauges *g)
{
    pthread_mutex_lock(&e->mu);
    g->queue_depth = e->q_len;
    g->active_seqs = 0;
    for (int i = 0; i < e->cfg.n_parallel; i++) g->active_seqs += e->slots[i].req != NULL;
    g->n_parallel = e->cfg.n_parallel;
    g->healthy = !e->failed && !e->recovering;
    g->recovery = e->rs;
    g->recovering = e->recovering;
    g->n_generated = e->n_generated;
    g->n_ranks = e->n_ranks;
    g->n_rank_stats = TP_MIN(g->n_ranks, TP_METRICS_RANKS_MAX);
    g->n_steps = e->rank_stats[0].n_steps;
    g->spec_drafted = e->spec_drafted;
    g->spec_accepted = e->spec_accepted;
    g->spec_grammar_cuts = e->spec_grammar_cuts;
    g->decode_seq_steps = e->decode_seq_steps;
    g->step_collectives = e->step_collectives;
    for (int r = 0; r < g->n_rank_stats; r++) {
        g->ns_comm[r] = e->rank_stats[r].ns_comm;
        g->ns_compute[r] = e->rank_stats[r].ns_compute;
        g->bytes_sent[r] = e->rank_stats[r].bytes_sent;
    }
    pthread_mutex_unlock(&e->mu);
}

int tp_engine_rank_stats(struct tp_engine *e, struct tp_parallel_stats *out, int max)
{
    pthread_mutex_lock(&e->mu);
    int n = TP_MIN(TP_MIN(max, e->n_ranks), TP_METRICS_RANKS_MAX);
    memcpy(out, e->rank_stats, sizeof(*out) * (size_t)n);
    int world = e->n_ranks;
    pthread_mutex_unlock(&e->mu);
    return world;
}

/* Engine thread, mu NOT held: re-read every rank's counters when `force`
 * or 250 ms passed since the last read, then publish them under mu. */
static void refresh_stats(struct tp_engine *e, int force)
{
    uint64_t now = tp_now_ns();
    if (!force && now - e->stats_ns < 250000000ull) return;
    e->stats_ns = now;
    e->stats_dirty = 0;
    int world = tp_parallel_get_rank_stats(e->p, e->stats_tmp, TP_METRICS_RANKS_MAX);
    pthread_mutex_lock(&e->mu);
    e->n_ranks = world;
    memcpy(e->rank_stats, e->stats_tmp, sizeof(*e->stats_tmp) * (size_t)TP_MIN(world, TP_METRICS_RANKS_MAX));
    pthread_mutex_unlock(&e->mu);
}

/* mu held: the engine failed; fail everything. */
static void engine_poison(struct tp_engine *e, const char *why)
{
    if (!e->failed) {
        e->failed = 1;
        snprintf(e->fail_reason, sizeof e->fail_reason, "%s", why);
        tp_log(TP_LOG_ERROR, "server", "engine failed: %s; answering 503 from now on", why);
    }
    char msg[400];
    snprintf(msg, sizeof msg, "the engine failed: %s", e->fail_reason);
    for (int i = 0; i < e->cfg.n_parallel; i++) {
        struct slot *s = &e->slots[i];
        if (!s->req) continue;
        req_finish(e, s->req, TP_FINISH_ERROR, TP_ERR_POISONED, msg);
        s->req = NULL;
    }
    while (e->q_len > 0) {
        struct tp_req *r = e->queue[e->q_head];
        e->q_head = (e->q_head + 1) % e->cfg.max_queue;
        e->q_len--;
        req_finish(e, r, TP_FINISH_ERROR, TP_ERR_POISONED, msg);
    }
}

/* mu held: release text[released..upto) of slot s to its request.  TP_OK or TP_ERR_NOMEM. */
static enum tp_status publish_text(struct slot *s, size_t upto)
{
    if (upto <= s->released) return TP_OK;
    if (tp_buf_append(&s->req->text, s->text.data + s->released, upto - s->released) != TP_OK) return TP_ERR_NOMEM;
    s->released = upto;
    return TP_OK;
}

/* Which of r's stop strings starts at text[at..len): 1 + its index (0: none). */
static int stop_which(const struct tp_req *r, const char *text, size_t len, size_t at)
{
    for (int i = 0; i < r->params.n_stop; i++)
        if (at + r->params.stop_len[i] <= len && memcmp(text + at, r->params.stop[i], r->params.stop_len[i]) == 0)
            return i + 1;
    return 0;
}

/* mu held: the slot's request is finished (not error): flush held text. */
static void slot_finish(struct tp_engine *e, struct slot *s, enum tp_finish f)
{
    struct tp_req *r = s->req;
    size_t nf = tp_detok_flush(s->detok, e->scratch, sizeof e->scratch);
    if (nf && tp_buf_append(&s->text, e->scratch, nf) != TP_OK) f = TP_FINISH_ERROR;
    if (f != TP_FINISH_ERROR) {
        int hit = 0;
        size_t rel = tp_stop_scan(s->text.data ? s->text.data : "", s->text.len, s->released, r->params.stop,
                                  r->params.stop_len, r->params.n_stop, &hit);
        if (hit) f = TP_FINISH_STOP, r->stop_idx = stop_which(r, s->text.data, s->text.len, rel);
        if (publish_text(s, hit ? rel : s->text.len) != TP_OK) f = TP_FINISH_ERROR;
        if (r->n_toks > 0) r->toks[r->n_toks - 1].text_end = r->text.len;
    }
    if (e->metrics && f != TP_FINISH_ERROR && f != TP_FINISH_CANCELLED) {
        double ttft = r->t_first_ns ? (double)(r->t_first_ns - r->t_submit_ns) / 1e9 : 0;
        double gen_s = r->n_toks > 1 ? (double)(tp_now_ns() - r->t_first_ns) / 1e9 : 0;
        tp_metrics_finished(e->metrics, r->n_prompt, r->n_toks, ttft, r->n_toks > 1 ? gen_s / (r->n_toks - 1) : -1);
        tp_metrics_prompt_cached(e->metrics, r->n_cached);
    }
    req_finish(e, r, f, TP_ERR_NOMEM, "out of memory while generating");
    s->req = NULL;
}

/* The token trie for grammar masks, built once from the tokenizer's pieces
 * (special and control tokens excluded).  TP_OK or TP_ERR_NOMEM. */
static enum tp_status engine_trie(struct tp_engine *e)
{
    if (e->trie) return TP_OK;
    if (e->trie_failed) return TP_ERR_NOMEM;
    const int n = e->n_vocab;
    const char **piece = calloc((size_t)n, sizeof *piece);
    size_t *len = calloc((size_t)n, sizeof *len);
    uint8_t *skip = calloc((size_t)n, 1);
    enum tp_status rc = TP_ERR_NOMEM;
    if (!piece || !len || !skip) goto out;
    e->n_eog = 0;
    for (int i = 0; i < n; i++) {
        piece[i] = tp_tokenizer_piece(e->tok, i, &len[i]);
        if (!piece[i]) {
            piece[i] = "";
            len[i] = 0;
        }
        if (tp_tokenizer_is_eog(e->tok, i)) {
            skip[i] = 1;
            e->eog[e->n_eog++] = i;
            continue;
        }
        if (len[i] > 0 && len[i] < 128 && !memchr(piece[i], 0, len[i])) {
            char txt[128];
            memcpy(txt, piece[i], len[i]);
            txt[len[i]] = 0;
            if (tp_tokenizer_find_special(e->tok, txt) == i) skip[i] = 1;
        }
    }
    if (tp_token_trie_init(n, piece, len, skip, &e->trie) != TP_OK) goto out;
    if (tp_mask_ctx_init(e->trie, &e->mctx) != TP_OK) goto out;
    rc = TP_OK;
out:
    free(piece);
    free(len);
    free(skip);
    if (rc != TP_OK) {
        tp_token_trie_free(e->trie);
        e->trie = NULL;
        e->trie_failed = 1;
    }
    return rc;
}

/* Slot i is the source of a KV copy that the next step makes (mu held):
 * it may not be cleared or overwritten before then. */
static int copy_source_pending(const struct tp_engine *e, int i)
{
    for (int k = 0; k < e->n_copy; k++)
        if (e->copy_src[k] == i) return 1;
    return 0;
}

/* Positions of slot c whose K/V the cache really holds and that equal
 * prompt[0..l): hist[0..n_hist) of a free slot; of a busy one only what was
 * already fed and computed (admission runs between steps, when every fed
 * position -- n_hist == n_past, n_fed while prefilling -- has been computed;
 * the min keeps that true should admission ever move).  A slot admitted
 * earlier in this round counts its kept prefix: its clear starts at that
 * length and its own copy (if any) comes earlier in the copy list. */
static int slot_prefix(const struct slot *c, const int32_t *prompt, int n_prompt)
{
    int have = c->req ? TP_MIN(c->n_hist, c->n_past) : c->n_hist;
    int l = 0, lim = TP_MIN(have, n_prompt);
    while (l < lim && c->hist[l] == prompt[l]) l++;
    return l;
}

/* mu held: the next queued request that is not cancelled (cancelled ones are finished on the way),
 * or NULL when the queue is empty. */
static struct tp_req *pop_request(struct tp_engine *e)
{
    while (e->q_len > 0) {
        struct tp_req *r = e->queue[e->q_head];
        e->q_head = (e->q_head + 1) % e->cfg.max_queue;
        e->q_len--;
        if (!r->cancelled) return r;
        req_finish(e, r, TP_FINISH_CANCELLED, TP_OK, NULL);
    }
    return NULL;
}

/* Where request r goes: the free slot *si whose KV cache holds the longest prefix of its prompt
 * (*keep positions kept), and, with prefix sharing, another slot *src (-1: none) holding *shared
 * positions, at least prefix_share_min more.  Needs a free slot. */
static void pick_slot(struct tp_engine *e, const struct tp_req *r, int *si_out, int *keep_out, int *src_out,
                      int *shared_out)
{
    /* prompt cache: the free slot whose KV cache holds the longest prefix */
    int best = -1, si = -1;
    for (int i = 0; i < e->cfg.n_parallel; i++) {
        struct slot *c = &e->slots[i];
        if (c->req || copy_source_pending(e, i)) continue;
        int l = slot_prefix(c, r->prompt, r->n_prompt);
        l = tp_model_seq_reusable(tp_parallel_model(e->p), i, TP_MIN(l, r->n_prompt - 1)); /* sliding windows */
        if (l > best) {
            best = l;
            si = i;
        }
    }
    /* at least the prompt's last token is fed again: it gives the logits */
    int keep = TP_MIN(best, r->n_prompt - 1);
    /* prefix sharing: a longer prefix in another slot's cache */
    int src = -1, shared = keep;
    if (e->cfg.prefix_share_min > 0) {
        for (int i = 0; i < e->cfg.n_parallel; i++) {
            if (i == si) continue;
            int l = TP_MIN(slot_prefix(&e->slots[i], r->prompt, r->n_prompt), r->n_prompt - 1);
            l = tp_model_seq_reusable(tp_parallel_model(e->p), i, l); /* sliding windows */
            if (l > shared) {
                shared = l;
                src = i;
            }
        }
        if (src >= 0 && shared - keep < e->cfg.prefix_share_min) src = -1;
    }
    /* mean and cls pooling need the hidden state of every prompt token / the first: all are read */
    if (r->params.embed == TP_POOL_MEAN || r->params.embed == TP_POOL_CLS) keep = 0, src = -1;
    *si_out = si;
    *keep_out = keep;
    *src_out = src;
    *shared_out = shared;
}

/* mu held: slot s's per-request state for r: sampler, grammar state, speculation, tool-call markers,
 * detokenizer.  0, or -1 when r was finished with an error (out of memory). */
static int slot_prepare(struct tp_engine *e, struct slot *s, struct tp_req *r)
{
    struct tp_sampler_params sp = tp_sampler_default_params();
    sp.temperature = r->params.temperature;
    sp.top_k = r->params.top_k;
    sp.top_p = r->params.top_p;
    sp.min_p = r->params.min_p;
    sp.repetition_penalty = r->params.repetition_penalty;
    sp.presence_penalty = r->params.presence_penalty;
    sp.frequency_penalty = r->params.frequency_penalty;
    sp.seed = r->seed;
    sp.n_logprobs = r->params.logprobs ? r->params.top_logprobs : 0;
    sp.no_logprob = !r->params.logprobs; /* saves an exp pass over the vocabulary per token */
    tp_sampler_free(s->sampler);
    s->sampler = NULL;
    /* an embedding samples nothing: no sampler (its buffers are vocabulary-sized) */
    if (!r->params.embed && tp_sampler_init(&sp, e->n_vocab, &s->sampler) != TP_OK) {
        req_finish(e, r, TP_FINISH_ERROR, TP_ERR_NOMEM, "could not create the sampler (out of memory?)");
        return -1;
    }
    if (r->params.grammar) {
        if (engine_trie(e) != TP_OK) {
            req_finish(e, r, TP_FINISH_ERROR, TP_ERR_NOMEM, "could not build the token trie for response_format (out of memory?)");
            return -1;
        }
        tp_gstate_init(r->params.grammar, s->gst);
        s->gkey_valid = 0;
    }
    s->gon = r->params.grammar && !r->params.tool_auto;
    /* speculative decoding: the request's choice, else the server's.  With tool_choice "auto" the grammar
     * switches on and off with the text: slot_verify ends a step's walk at the token that switches it (the
     * rows after it were masked for the other state) */
    r->spec = (r->params.speculative ? r->params.speculative > 0 : e->cfg.spec != TP_SPEC_OFF) && !r->params.embed;
    r->spec_mode = e->draft ? TP_SPEC_DRAFT : TP_SPEC_NGRAM;
    tp_spec_adapt_init(&s->adapt, e->cfg.draft_max);
    s->n_draft = 0;
    s->gfrom = 0;
    s->marker_id = -1;
    const char *marker = r->params.tool_auto ? tp_tool_marker_token(r->params.tool_format) : NULL;
    if (marker) s->marker_id = tp_tokenizer_find_special(e->tok, marker);
    s->hmsg_id = s->hstart_id = -1;
    if (r->params.harmony_calls) {
        s->hmsg_id = tp_tokenizer_find_special(e->tok, "<|message|>");
        s->hstart_id = tp_tokenizer_find_special(e->tok, "<|start|>");
    }
    tp_detok_reset(s->detok);
    /* The reply continues the prompt: feed the prompt's last token to the
     * detokenizer (output discarded) so SentencePiece's "drop the leading
     * space of the first piece" applies only at the start of the text. */
    (void)tp_detok_push(s->detok, r->prompt[r->n_prompt - 1], e->scratch, sizeof e->scratch);
    (void)tp_detok_flush(s->detok, e->scratch, sizeof e->scratch);
    for (int k = 0; s->sampler && k < r->n_prompt; k++) tp_sampler_accept(s->sampler, r->prompt[k]);
    return 0;
}

/* mu held: move queued requests into free slots; drop cancelled ones.
 *
 * Prompt cache: a request takes the free slot whose KV cache holds the
 * longest prefix of its prompt (multi-turn chats resend the conversation).
 * Prefix sharing: if another slot (busy or free) holds a prefix at least
 * prefix_share_min tokens longer, the next step copies those positions into
 * the chosen slot (tp_step copy list: after the clears, before the batch, on
 * every rank) and prefill starts after them.  Rules that keep the copy
 * sound: a copy's source never is the slot being cleared (a slot with a
 * pending outgoing copy is not admitted into in this round), the source
 * length never exceeds its kept prefix (which its clear leaves intact), and
 * copies run in admission order (a source admitted earlier in this round
 * already got its own copy).  Either way the prompt's last token is fed
 * again: it gives the logits. */
static void admit(struct tp_engine *e)
{
    for (int i = 0; i < e->cfg.n_parallel; i++) {
        struct slot *s = &e->slots[i];
        if (s->req && s->req->cancelled) {
            req_finish(e, s->req, TP_FINISH_CANCELLED, TP_OK, NULL);
            s->req = NULL;
        }
    }
    for (;;) {
        int n_free = 0;
        for (int i = 0; i < e->cfg.n_parallel; i++) n_free += e->slots[i].req == NULL && !copy_source_pending(e, i);
        if (n_free == 0 || e->q_len == 0) break;
        struct tp_req *r = pop_request(e);
        if (!r) break;
        int si, keep, src, shared;
        pick_slot(e, r, &si, &keep, &src, &shared);
        struct slot *s = &e->slots[si];
        if (slot_prepare(e, s, r) != 0) continue;
        if (src >= 0) {
            e->copy_dst[e->n_copy] = si;
            e->copy_src[e->n_copy] = src;
            e->copy_len[e->n_copy++] = shared;
            memcpy(s->hist, r->prompt, (size_t)shared * sizeof(int32_t));
            tp_log(TP_LOG_DEBUG, "server", "%s: slot %d reuses %d prompt tokens of its own cache, copies %d from slot %d",
                   r->id, si, keep, shared, src);
            keep = shared;
        }
        s->req = r;
        s->text.len = 0;
        s->released = 0;
        s->n_fed = keep;
        s->n_past = keep;
        s->n_hist = keep;
        s->clear_from = keep;
        s->fresh = 1;
        r->n_cached = keep;
        r->state = TP_REQ_RUNNING;
        pthread_cond_broadcast(&r->cond);
    }
}

/* mu held: how many drafts generating slot s may have in this step, at most
 * `room`: as many as its adaptive length asks, never more than the tokens
 * max_tokens leaves after this step's sure one or than the context holds. */
static int slot_draft_room(const struct tp_engine *e, const struct slot *s, int room)
{
    const struct tp_req *r = s->req;
    int k = TP_MIN(tp_spec_adapt_k(&s->adapt), room);
    k = TP_MIN(k, r->max_tokens - r->n_toks - 1);
    k = TP_MIN(k, e->n_ctx - 1 - s->n_past);
    return TP_MAX(k, 0);
}

/* mu held: the drafts of generating slot s for this step, at most `room`
 * (slot_draft_room): the n-gram lookup over its prompt and output so far
 * (server/spec.h), or what the draft model proposed for it in this round's
 * draft_round; with a grammar, cut before the first draft it refuses.
 * Returns how many (in s->draft, s->n_draft). */
static int slot_draft(struct tp_engine *e, struct slot *s, int room)
{
    const struct tp_req *r = s->req;
    int k = slot_draft_room(e, s, room);
    s->n_draft = 0;
    if (k <= 0) return 0;
    s->hist[s->n_past] = s->last_tok;
    if (e->draft) k = s->pre_k > 0 ? TP_MIN(s->pre_k, k) : 0; /* none when the draft model failed */
    else k = tp_spec_ngram_draft(s->hist, s->n_past + 1, k, s->draft);
    const tp_grammar_t *g = r->params.grammar;
    if (g && s->gon) {
        /* a grammar: drafts are cut before the first one the automaton refuses (or after one that completes the
         * value); gdraft[j] is the state after draft[0..j], the state row j + 1's mask is computed from */
        for (int j = 0; j < k; j++) {
            size_t pl = 0;
            const char *pc = tp_tokenizer_piece(e->tok, s->draft[j], &pl);
            tp_gstate_copy(&s->gdraft[j], j == 0 ? s->gst : &s->gdraft[j - 1]);
            if (!pc || pl == 0 || tp_tokenizer_is_eog(e->tok, s->draft[j]) ||
                !tp_gstate_feed_bytes(g, &s->gdraft[j], pc, pl)) {
                k = j;
                break;
            }
            if (tp_gstate_done(g, &s->gdraft[j])) {
                k = j + 1;
                break;
            }
        }
    }
    s->n_draft = k;
    return k;
}

/*
 * mu held on entry and on return: with a draft model, the drafts of every
 * generating speculative slot for the next step, in one batched round
 * (tp_spec_draft_propose_batch: about k forward passes whatever the number
 * of slots).  The round runs with mu released, so HTTP threads queue and
 * cancel meanwhile; only this thread touches the slots and the draft model.
 * Each slot asks for the room build_step will leave it (the same order and
 * budget; build_step's drafts never exceed what this round asked for).
 */
static void engine_failed(struct tp_engine *e, const char *why);

static void draft_round(struct tp_engine *e)
{
    for (int i = 0; i < e->cfg.n_parallel; i++) e->slots[i].pre_k = -1;
    if (!e->draft || e->draft_failed) return;
    int spare = e->cfg.n_batch, n = 0;
    for (int i = 0; i < e->cfg.n_parallel; i++)
        spare -= e->slots[i].req && e->slots[i].n_fed >= e->slots[i].req->n_prompt;
    for (int i = 0; i < e->cfg.n_parallel; i++) {
        struct slot *s = &e->slots[i];
        if (!s->req || s->n_fed < s->req->n_prompt || !s->req->spec || spare <= 0) continue;
        const int k = slot_draft_room(e, s, spare);
        if (k <= 0) continue;
        s->hist[s->n_past] = s->last_tok;
        e->dreq[n++] = (struct tp_spec_draft_req){.seq = i, .toks = s->hist, .n = s->n_past + 1, .k = k,
                                                  .out = s->draft};
        spare -= k;
    }
    if (n == 0) return;
    pthread_mutex_unlock(&e->mu);
    /* a sharded draft's passes are steps on every rank: their collectives count with the engine's */
    const tp_comm_t *comm = tp_spec_draft_is_sharded(e->draft) ? tp_parallel_comm(e->p) : NULL;
    struct tp_comm_stats cs0 = {0}, cs1 = {0};
    if (comm) tp_comm_get_stats(comm, &cs0);
    const enum tp_status st = tp_spec_draft_propose_batch(e->draft, e->dreq, n);
    if (comm) tp_comm_get_stats(comm, &cs1);
    if (st != TP_OK && tp_parallel_is_poisoned(e->p)) {
        /* the group failed during a sharded draft pass: a lost rank like any step's */
        char why[300];
        snprintf(why, sizeof why, "%s", tp_parallel_last_error(e->p));
        engine_failed(e, why); /* returns with mu held */
        return;
    }
    pthread_mutex_lock(&e->mu);
    e->step_collectives += cs1.n_ops - cs0.n_ops;
    if (st != TP_OK) {
        tp_log(TP_LOG_ERROR, "server", "the draft model failed (%s); decoding without drafts from now on",
               tp_spec_draft_last_error(e->draft));
        e->draft_failed = 1;
        return;
    }
    for (int j = 0; j < n; j++) e->slots[e->dreq[j].seq].pre_k = e->dreq[j].n_out;
}

/* mu held: the clears of every slot admitted since the last step (e->clear_seq/clear_from).
 * Returns how many. */
static int queue_clears(struct tp_engine *e)
{
    int n_clear = 0;
    for (int i = 0; i < e->cfg.n_parallel; i++) {
        struct slot *s = &e->slots[i];
        if (!s->fresh) continue;
        e->clear_seq[n_clear] = i;
        e->clear_from[n_clear++] = s->clear_from;
        s->fresh = 0;
    }
    return n_clear;
}

/* mu held: one batch token at e->b_*[*n] (logits row *n_rows when logits is set). */
static void put_token(struct tp_engine *e, int *n, int *n_rows, int slot, int32_t tok, int pos, int logits)
{
    e->b_tok[*n] = tok;
    e->b_pos[*n] = pos;
    e->b_seq[*n] = slot;
    e->b_logits[*n] = (int8_t)logits;
    if (logits) e->row_slot[(*n_rows)++] = slot;
    (*n)++;
}

/* mu held: decode tokens first: running streams never wait behind a prefill.  A speculative slot adds
 * its drafts after its token (consecutive positions, a logits row each) as far as the budget leaves a
 * token for every other decoding slot.  Appends at *n / *n_rows. */
static void add_decode_tokens(struct tp_engine *e, int *n, int *n_rows)
{
    int spare = e->cfg.n_batch;
    for (int i = 0; i < e->cfg.n_parallel; i++)
        spare -= e->slots[i].req && e->slots[i].n_fed >= e->slots[i].req->n_prompt;
    for (int i = 0; i < e->cfg.n_parallel; i++) {
        struct slot *s = &e->slots[i];
        s->n_draft = 0;
        if (!s->req || s->n_fed < s->req->n_prompt) continue;
        s->hist[s->n_past] = s->last_tok;
        s->n_hist = s->n_past + 1;
        put_token(e, n, n_rows, i, s->last_tok, s->n_past, 1);
        const int k = s->req->spec && spare > 0 ? slot_draft(e, s, spare) : 0;
        for (int j = 0; j < k; j++) {
            s->hist[s->n_past + 1 + j] = s->draft[j];
            put_token(e, n, n_rows, i, s->draft[j], s->n_past + 1 + j, 1);
        }
        s->n_hist = s->n_past + 1 + k;
        spare -= k;
    }
}

/* mu held: prompt tokens, at most budget, slot by slot; a prompt's last token gets a logits row
 * (not an embedding's: it only reads its prompt). Appends at *n / *n_rows. */
static void add_prefill_tokens(struct tp_engine *e, int *n, int *n_rows, int budget)
{
    for (int i = 0; i < e->cfg.n_parallel && budget > 0; i++) {
        struct slot *s = &e->slots[i];
        if (!s->req || s->n_fed >= s->req->n_prompt) continue;
        int chunk = TP_MIN(budget, s->req->n_prompt - s->n_fed);
        for (int k = 0; k < chunk; k++) {
            s->hist[s->n_fed + k] = s->req->prompt[s->n_fed + k];
            put_token(e, n, n_rows, i, s->req->prompt[s->n_fed + k], s->n_fed + k, 0);
        }
        s->n_fed += chunk;
        s->n_past = s->n_fed;
        s->n_hist = s->n_fed;
        s->req->n_prefilled = s->n_fed;
        budget -= chunk;
        if (s->n_fed == s->req->n_prompt && !s->req->params.embed) {
            e->b_logits[*n - 1] = 1;
            e->row_slot[(*n_rows)++] = i;
        }
    }
}

/* mu held: the step's batch, clear and copy lists (the copy list is consumed) and logit biases. */
static void fill_step_lists(struct tp_engine *e, struct tp_step *st, int n, int n_clear, int n_rows)
{
    st->batch.n_tokens = n;
    st->batch.token = e->b_tok;
    st->batch.pos = e->b_pos;
    st->batch.seq = e->b_seq;
    st->batch.logits = e->b_logits;
    st->n_clear = n_clear;
    st->clear_seq = e->clear_seq;
    st->clear_from = e->clear_from;
    st->n_copy = e->n_copy;
    st->copy_dst = e->copy_dst;
    st->copy_src = e->copy_src;
    st->copy_len = e->copy_len;
    e->n_copy = 0;
    int nb = 0;
    for (int row = 0; row < n_rows; row++) {
        const struct tp_req_params *p = &e->slots[e->row_slot[row]].req->params;
        for (int k = 0; k < p->n_logit_bias; k++) {
            e->bias_row[nb] = row;
            e->bias_id[nb] = p->bias_id[k];
            e->bias_val[nb++] = p->bias_val[k];
        }
    }
    st->n_bias = nb;
    st->bias_row = e->bias_row;
    st->bias_id = e->bias_id;
    st->bias_val = e->bias_val;
}

/* mu held: the grammar mask m of slot sw's row j (0: its sure token, j > 0: after draft j - 1). */
static void row_mask(struct tp_engine *e, struct slot *sw, const tp_grammar_t *g, int j, uint32_t *m)
{
    const struct tp_gstate *gs = j == 0 ? sw->gst : &sw->gdraft[j - 1];
    const uint32_t *plain = e->gscratch;
    int maxcost = 0;
    if (j == 0) {
        tp_gstate_normalize(g, gs, e->gnorm);
        if (!sw->gkey_valid || !tp_gstate_equal(e->gnorm, sw->gkey)) {
            (void)tp_grammar_mask_budget(e->mctx, g, gs, -1, sw->smask, &sw->smask_maxcost);
            tp_gstate_copy(sw->gkey, e->gnorm);
            sw->gkey_valid = 1;
        }
        plain = sw->smask;
        maxcost = sw->smask_maxcost;
        sw->dead_rows = 0;
    } else {
        (void)tp_grammar_mask_budget(e->mctx, g, gs, -1, e->gscratch, &maxcost);
    }
    /* near the end of max_tokens, when a token the plain mask allows could leave more to close than
     * tokens left, only tokens that leave the value closable in time are allowed (tp_gstate_cost);
     * when none are (a budget below the shortest value), the plain mask applies */
    const int left = sw->req->max_tokens - sw->req->n_toks - j - 1; /* tokens after this one */
    int budgeted = 0;
    if (maxcost > left) {
        const int cost = tp_gstate_cost(g, gs);
        if (cost <= left + 1)
            budgeted = tp_grammar_mask_budget(e->mctx, g, gs, left, m, NULL) > 0 ||
                       (left >= 0 && cost <= 1 && tp_gstate_accepting(g, gs));
    }
    if (!budgeted) memcpy(m, plain, (size_t)e->mask_words * sizeof *m);
    if (tp_gstate_accepting(g, gs))
        for (int k = 0; k < e->n_eog; k++) m[e->eog[k] / 32] |= 1u << (e->eog[k] % 32);
    /* tokens logit_bias bans stay banned; a mask left empty fails the request after the step */
    const struct tp_req_params *rp = &sw->req->params;
    for (int k = 0; k < rp->n_logit_bias; k++)
        if (rp->bias_val[k] <= TP_LOGIT_BAN) m[rp->bias_id[k] / 32] &= ~(1u << (rp->bias_id[k] % 32));
    int any = 0;
    for (int w = 0; w < e->mask_words && !any; w++) any = m[w] != 0;
    if (j == 0) sw->dead_end = !any;
    else if (!any) sw->dead_rows |= 1u << j;
    if (!any) m[0] |= 1u; /* keeps the step valid; the row's token is discarded */
}

/* mu held: grammar masks: the tokens that keep each constrained reply valid, plus end of generation
 * where the value is complete; a speculative slot's rows after its first are masked from the state
 * after its drafts. Fills e->mask / e->mask_row; returns how many rows are masked. */
static int add_grammar_masks(struct tp_engine *e, int n_rows)
{
    int nm = 0, j_prev = 0;
    for (int row = 0; row < n_rows; row++) {
        struct slot *sw = &e->slots[e->row_slot[row]];
        const tp_grammar_t *g = sw->req->params.grammar;
        if (!g || !sw->gon) continue;
        const int j = row > 0 && e->row_slot[row - 1] == e->row_slot[row] ? j_prev + 1 : 0;
        j_prev = j;
        row_mask(e, sw, g, j, e->mask + (size_t)nm * (size_t)e->mask_words);
        e->mask_row[nm++] = row;
    }
    return nm;
}

/* Build the step; returns the number of tokens (0: nothing to do). mu held.
 * Every slot admitted since the last step gets its clear here, and the copy
 * list admit() made goes with it, whatever the token budget: a copy must run
 * in the step right after its admission round, before its source can change. */
static int build_step(struct tp_engine *e, struct tp_step *st)
{
    int n = 0, n_rows = 0;
    const int n_clear = queue_clears(e);
    add_decode_tokens(e, &n, &n_rows);
    int budget = e->cfg.n_batch - n;
    /* while sequences are generating, prompts advance by at most
     * prefill_chunk tokens per step, so each step (and each running stream's
     * next token) stays short; with nobody generating, the whole budget */
    if (n > 0 && e->cfg.prefill_chunk > 0) budget = TP_MIN(budget, e->cfg.prefill_chunk);
    add_prefill_tokens(e, &n, &n_rows, budget);
    fill_step_lists(e, st, n, n_clear, n_rows);
    st->n_mask = add_grammar_masks(e, n_rows);
    st->mask_row = e->mask_row;
    st->mask = e->mask;
    return n;
}

/* mu held: sample the next token of slot s from logits row. */
static void slot_take(struct tp_engine *e, struct slot *s, const struct tp_sample_result *res);

static void slot_sample(struct tp_engine *e, struct slot *s, const float *row)
{
    struct tp_sample_result res;
    if (tp_sampler_sample(s->sampler, row, &res) != TP_OK) {
        req_finish(e, s->req, TP_FINISH_ERROR, TP_ERR_INTERNAL, "sampling failed");
        s->req = NULL;
        return;
    }
    slot_take(e, s, &res);
}

/* mu held, after a step: embedding requests take the final hidden states of
 * their tokens in it (every token for mean pooling, the first or the last
 * prompt token for cls / last; tp_model_hidden on rank 0, whose residual
 * stream is whole).  A request whose last prompt token was in the step is
 * finished with its vector L2-normalised; its logits row is not sampled. */
static void embed_rows(struct tp_engine *e, const struct tp_step *st)
{
    tp_model_t *m = tp_parallel_model(e->p);
    const int E = tp_parallel_hparams(e->p)->n_embd;
    for (int i = 0; i < st->batch.n_tokens; i++) {
        struct slot *s = &e->slots[st->batch.seq[i]];
        struct tp_req *r = s->req;
        if (!r || !r->params.embed || r->cancelled) continue;
        const int pos = st->batch.pos[i], mode = r->params.embed;
        if (!(mode == TP_POOL_MEAN || (mode == TP_POOL_CLS && pos == 0) || (mode == TP_POOL_LAST && pos == r->n_prompt - 1)))
            continue;
        if (tp_model_hidden(m, i, e->hidden) != TP_OK) {
            req_finish(e, r, TP_FINISH_ERROR, TP_ERR_INTERNAL, "the final hidden state is not available");
            s->req = NULL;
            continue;
        }
        for (int k = 0; k < E; k++) r->embd[k] = mode == TP_POOL_MEAN ? r->embd[k] + e->hidden[k] : e->hidden[k];
        if (pos != r->n_prompt - 1) continue;
        double ss = 0;
        for (int k = 0; k < E; k++) ss += (double)r->embd[k] * r->embd[k];
        const double scale = ss > 0 ? 1.0 / sqrt(ss) : 0; /* the mean's 1 / n cancels in the normalisation */
        for (int k = 0; k < E; k++) r->embd[k] = (float)(r->embd[k] * scale);
        if (!r->t_first_ns) r->t_first_ns = tp_now_ns();
        req_finish(e, r, TP_FINISH_STOP, TP_OK, NULL);
        s->req = NULL;
    }
}

/* Nonzero when every row of this step can be decided by the distributed
 * argmax (greedy, no penalties, no logprobs) and the group has several ranks:
 * each rank then sends (max, index) per row instead of its slice of the
 * vocabulary (8 bytes instead of 4 x n_vocab / N per row). */
static int step_is_greedy(const struct tp_engine *e, int n_rows)
{
    if (tp_parallel_size(e->p) < 2) return 0;
    for (int row = 0; row < n_rows; row++) {
        const struct tp_req *r = e->slots[e->row_slot[row]].req;
        if (!r) continue;
        const struct tp_req_params *p = &r->params;
        if (p->temperature > 0.0f || p->logprobs || p->top_logprobs > 0 || p->presence_penalty != 0.0f ||
            p->frequency_penalty != 0.0f || p->repetition_penalty != 1.0f)
            return 0;
    }
    return 1;
}

/* Where the next tool call of slot s may begin: from s->gfrom, and in a
 * reply that may reason first (params.think) only after its </think>.
 * 0: not yet (the reasoning is open, or the reply may still open it). */
static int call_search_from(const struct slot *s, size_t *from)
{
    *from = s->gfrom;
    if (!s->req->params.think) return 1;
    struct tp_think_parts tp;
    tp_think_split(s->text.data ? s->text.data : "", s->text.len, 0, &tp);
    if (tp.thinking && !tp.closed) return 0;
    if (!tp.thinking) return tp.content_e > 0; /* empty: undecided */
    if (tp.content_b > *from) *from = tp.content_b;
    return 1;
}

/* Harmony, tool_choice auto: token id just opened a message body.  When its
 * header (the text since the reply began or since the last <|start|>)
 * addresses "to=functions.NAME", start the call grammar with NAME's bytes
 * fed, so the body is NAME's arguments under its schema (gon); an unknown
 * name leaves the body free (the reply's parser reads it as it is). */
static void harmony_call_begins(struct slot *s, int32_t id)
{
    struct tp_req *r = s->req;
    if (id != s->hmsg_id || id < 0) return;
    size_t from = 0;
    for (int k = r->n_toks - 1; k >= 0; k--)
        if (r->toks[k].id == s->hstart_id) {
            from = r->toks[k].text_end;
            break;
        }
    static const char to[] = "to=functions.";
    const char *t = s->text.data ? s->text.data : "";
    const char *hit = NULL;
    for (size_t i = from; i + sizeof to - 1 <= s->text.len; i++)
        if (memcmp(t + i, to, sizeof to - 1) == 0) hit = t + i + sizeof to - 1;
    if (!hit) return;
    /* the longest tool name there ("get_weatherjson" when no space preceded <|constrain|>json) */
    const size_t avail = (size_t)(t + s->text.len - hit);
    size_t n = 0;
    const cJSON *tool;
    cJSON_ArrayForEach(tool, r->params.tools)
    {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool, "function"), "name");
        const size_t l = cJSON_IsString(nm) ? strlen(nm->valuestring) : 0;
        if (l > n && l <= avail && memcmp(hit, nm->valuestring, l) == 0) n = l;
    }
    tp_gstate_init(r->params.grammar, s->gst);
    s->gkey_valid = 0;
    s->gon = n > 0 && tp_gstate_feed_bytes(r->params.grammar, s->gst, hit, n);
}

/* The chosen token of slot s: history, text, stop strings, limits. */
static void slot_take(struct tp_engine *e, struct slot *s, const struct tp_sample_result *res)
{
    struct tp_req *r = s->req;
    struct tp_gen_tok *g = &r->toks[r->n_toks];
    uint64_t now = tp_now_ns();
    if (!r->t_first_ns) r->t_first_ns = now;
    s->t_prev_tok_ns = now;
    if (tp_tokenizer_is_eog(e->tok, res->id) && !r->params.ignore_eos) {
        slot_finish(e, s, TP_FINISH_STOP);
        return;
    }
    const tp_grammar_t *gr = r->params.grammar;
    if (gr && s->gon) {
        size_t pl = 0;
        const char *pc = tp_tokenizer_piece(e->tok, res->id, &pl);
        if (!pc || !tp_gstate_feed_bytes(gr, s->gst, pc, pl)) {
            /* only after a mask that allowed nothing (no token spells a valid continuation) */
            req_finish(e, r, TP_FINISH_ERROR, TP_ERR_INTERNAL, "no token of this vocabulary continues the response_format value");
            s->req = NULL;
            return;
        }
    }
    tp_sampler_accept(s->sampler, res->id);
    g->id = res->id;
    g->logprob = res->logprob;
    g->n_top = res->n_top;
    if (res->n_top > 0) memcpy(g->top, res->top, sizeof(struct tp_logprob) * (size_t)res->n_top);
    size_t nb = tp_detok_push(s->detok, res->id, e->scratch, sizeof e->scratch);
    if (nb == 0 && res->id == s->marker_id) { /* a control token: keep its text so the call can be read */
        const char *mk = tp_tool_marker_token(r->params.tool_format);
        nb = strlen(mk);
        memcpy(e->scratch, mk, nb);
    }
    if (nb && tp_buf_append(&s->text, e->scratch, nb) != TP_OK) {
        req_finish(e, r, TP_FINISH_ERROR, TP_ERR_NOMEM, "out of memory while generating");
        s->req = NULL;
        return;
    }
    int call_done = 0;
    if (gr && r->params.harmony_calls) {
        if (s->gon && tp_gstate_done(gr, s->gst)) s->gon = 0; /* the arguments closed: <|call|> may follow */
        else if (!s->gon) harmony_call_begins(s, res->id);
    } else if (gr && r->params.tool_auto) {
        size_t off = 0, from = 0;
        if (s->gon && tp_gstate_done(gr, s->gst)) {
            /* the call's JSON is complete: free text again (another call, or the end) */
            s->gon = 0;
            s->gfrom = s->text.len;
            call_done = 1;
        } else if (!s->gon && call_search_from(s, &from) &&
                   tp_tool_marker_find(r->params.tool_format, s->text.data, s->text.len, from, &off)) {
            /* a call begins: constrain its JSON from here (bytes already generated after the marker are fed;
             * when they cannot start a call, this one stays unconstrained) */
            tp_gstate_init(gr, s->gst);
            s->gkey_valid = 0;
            if (tp_gstate_feed_bytes(gr, s->gst, s->text.data + off, s->text.len - off)) s->gon = 1;
            s->gfrom = s->text.len;
            if (s->gon && tp_gstate_done(gr, s->gst)) {
                s->gon = 0;
                call_done = 1;
            }
        }
    }
    int hit = 0;
    size_t rel = tp_stop_scan(s->text.data ? s->text.data : "", s->text.len, s->released, r->params.stop,
                              r->params.stop_len, r->params.n_stop, &hit);
    if (publish_text(s, rel) != TP_OK) {
        req_finish(e, r, TP_FINISH_ERROR, TP_ERR_NOMEM, "out of memory while generating");
        s->req = NULL;
        return;
    }
    g->text_end = r->text.len;
    r->n_toks++;
    e->n_generated++;
    s->last_tok = res->id;
    pthread_cond_broadcast(&r->cond);
    if (hit) {
        r->stop_idx = stop_which(r, s->text.data, s->text.len, rel);
        req_finish(e, r, TP_FINISH_STOP, TP_OK, NULL);
        s->req = NULL;
    } else if (gr && !r->params.tool_auto && tp_gstate_done(gr, s->gst)) {
        slot_finish(e, s, TP_FINISH_STOP); /* the value is complete; nothing may follow it */
    } else if (call_done && !r->params.parallel_tool_calls) {
        slot_finish(e, s, TP_FINISH_STOP); /* parallel_tool_calls false: the reply ends after its call */
    } else if (r->n_toks >= r->max_tokens || s->n_past + 1 >= e->n_ctx) {
        slot_finish(e, s, TP_FINISH_LENGTH);
    }
}

/*
 * mu held, after a step: slot s fed its last token at pos0 and s->n_draft
 * drafted tokens after it, with logits rows row0 .. row0 + n_draft.  Row j
 * chooses the token after the j-th fed one exactly as plain decoding would
 * (greedy: the argmax; sampling: tp_sampler_sample_draft, which accepts a
 * draft with its target probability, else draws from the rest), and the
 * token goes through slot_take (stop strings, limits, text).  The walk ends
 * at the first token that is not the draft of its row (that token is the
 * next input), at a token that switches the grammar on or off, or when the
 * request finishes.  The K/V of the drafts after
 * the last accepted one is dropped by a clear in the next step.
 */
static void slot_verify(struct tp_engine *e, struct slot *s, int greedy, int row0, int pos0)
{
    struct tp_req *r = s->req;
    const int k = s->n_draft;
    int a = 0, j = 0;
    /* counters first: slot_take may finish (and release) the request */
    r->n_drafted += k;
    r->n_decode_steps++;
    e->spec_drafted += (uint64_t)k;
    e->decode_seq_steps++;
    for (j = 0; j <= k; j++) {
        const int row = row0 + j;
        struct tp_sample_result res;
        int acc = 0;
        if (s->dead_rows >> j & 1u) { /* as plain decoding would fail at this position */
            req_finish(e, r, TP_FINISH_ERROR, TP_ERR_INVALID_ARG,
                       "logit_bias bans every token that continues the response_format value");
            s->req = NULL;
            break;
        }
        if (greedy) {
            res.id = e->ids[row];
            res.logprob = 0.0f;
            res.n_top = 0;
            acc = j < k && res.id == s->draft[j];
        } else {
            const float *lr = e->logits + (size_t)row * (size_t)e->n_vocab;
            enum tp_status st = j < k ? tp_sampler_sample_draft(s->sampler, lr, s->draft[j], &res, &acc)
                                      : tp_sampler_sample(s->sampler, lr, &res);
            if (st != TP_OK) {
                req_finish(e, r, TP_FINISH_ERROR, TP_ERR_INTERNAL, "sampling failed");
                s->req = NULL;
                break;
            }
        }
        if (acc) {
            a++;
            r->n_accepted++;
            e->spec_accepted++;
        }
        s->n_past = pos0 + j + 1;
        const int gon = s->gon;
        slot_take(e, s, &res);
        /* a token that switched the grammar on or off (tool_choice "auto": a call began or ended) ends the walk
         * even when it was the draft: the next rows were masked for the old state.  It is fed again next step */
        if (acc && s->req && s->gon != gon) e->spec_grammar_cuts++; /* the rows after it go unverified */
        if (!acc || !s->req || s->gon != gon) break;
    }
    tp_spec_adapt_update(&s->adapt, k, a);
    /* positions pos0 .. n_past - 1 hold the reply's tokens; the rest of the step's drafts go */
    s->n_hist = s->n_past;
    if (s->n_past < pos0 + 1 + k) {
        s->fresh = 1;
        s->clear_from = s->n_past;
    }
    s->n_draft = 0;
}

/* Which rank was lost after a failed step (engine thread, before the group
 * is replaced): a link closed by a dead process shows at once, a silent one
 * after TP_ENGINE_SILENT_MS, a rank that left alive only when nothing else
 * explains the loss (tp_comm_lost_rank); give the heartbeat thread up to
 * 600 ms to see it.  Returns the rank, or -1 when none could be named. */
static int identify_lost(const struct tp_engine *e)
{
    for (int i = 0; i < 12; i++) {
        int r = tp_parallel_lost_rank(e->p, TP_ENGINE_SILENT_MS, NULL);
        if (r >= 0) return r;
        tp_sleep_ms(50);
    }
    return -1;
}

/* mu held: a rank was lost.  Requests being generated end with a 503 naming
 * it; queued ones stay; every slot's KV cache counts as empty from now on. */
static void engine_lose(struct tp_engine *e, int lost, uint64_t t_fail_ns, const char *why)
{
    e->recovering = 1;
    e->rec_done = 0;
    e->lost_rank = lost;
    e->lost_ns = t_fail_ns;
    snprintf(e->lost_reason, sizeof e->lost_reason, "%s", why);
    e->rs.n_losses++;
    char who[32] = "a rank";
    if (lost >= 0) snprintf(who, sizeof who, "rank %d", lost);
    tp_log(TP_LOG_ERROR, "server", "lost %s: %s; failing the requests in flight, keeping %d queued, re-forming the group",
           who, why, e->q_len);
    char msg[480];
    snprintf(msg, sizeof msg, "%s was lost while this request was generating (%s); the group is re-forming, retry shortly",
             who, why);
    for (int i = 0; i < e->cfg.n_parallel; i++) {
        struct slot *s = &e->slots[i];
        s->n_hist = 0; /* a replacement rank's cache is empty: no prefix reuse across the loss */
        s->fresh = 0;
        if (!s->req) continue;
        req_finish(e, s->req, TP_FINISH_ERROR, TP_ERR_PEER, msg);
        s->req = NULL;
        e->rs.n_failed_by_loss++;
    }
    e->n_copy = 0;
}

/* The recovery thread: re-form the group, attempt after attempt, until it
 * works or the engine stops. */
static void *recover_main(void *arg)
{
    struct tp_engine *e = arg;
    enum tp_status st = TP_ERR_POISONED;
    unsigned n = 0;
    int replanned = 0;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int stop = e->stop, lost = e->lost_rank;
        uint64_t gone_ns = tp_now_ns() - e->lost_ns;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        if (e->cfg.replan && lost > 0 && gone_ns >= (uint64_t)e->cfg.replan_after_ms * 1000000ull) {
            /* the rank stayed gone: go on without it if the survivors can hold the model */
            struct tp_replan_result *res = malloc(sizeof *res);
            char note[512] = "";
            int fits = 0;
            if (!res)
                snprintf(note, sizeof note, "out of memory for the re-plan");
            else if (tp_parallel_replan_query(e->p, lost, res) != TP_OK)
                snprintf(note, sizeof note, "%s", tp_parallel_last_error(e->p));
            else if (!(fits = res->fits))
                snprintf(note, sizeof note, "%s", res->reason);
            pthread_mutex_lock(&e->mu);
            if (strcmp(note, e->replan_note) != 0 && note[0])
                tp_log(TP_LOG_WARN, "server", "not re-planning without rank %d: %s; waiting for it", lost, note);
            snprintf(e->replan_note, sizeof e->replan_note, "%s", note);
            e->replanning = fits;
            pthread_mutex_unlock(&e->mu);
            if (fits) {
                tp_log(TP_LOG_WARN, "server", "rank %d has been gone %.1f s: re-planning over the survivors (%s)", lost,
                       (double)gone_ns / 1e9, res->reason);
                st = tp_parallel_replan(e->p, lost, TP_ENGINE_REJOIN_ATTEMPT_MS);
                replanned = st == TP_OK;
            }
            free(res);
            if (fits) {
                pthread_mutex_lock(&e->mu);
                e->replanning = 0;
                pthread_mutex_unlock(&e->mu);
                if (st == TP_OK || st == TP_ERR_UNSUPPORTED) break;
                if (n++ % 6 == 0)
                    tp_log(TP_LOG_WARN, "server", "the group has not re-formed without rank %d yet: %s; still trying",
                           lost, tp_parallel_last_error(e->p));
                tp_sleep_ms(100);
                continue;
            }
        }
        uint32_t attempt_ms = TP_ENGINE_REJOIN_ATTEMPT_MS;
        const uint64_t due_ns = (uint64_t)e->cfg.replan_after_ms * 1000000ull;
        if (e->cfg.replan && lost > 0 && gone_ns < due_ns) {
            /* end this attempt when the re-plan is due */
            uint64_t left_ms = (due_ns - gone_ns) / 1000000u;
            attempt_ms = (uint32_t)TP_MAX(500u, TP_MIN((uint64_t)attempt_ms, left_ms + 50u));
        }
        st = tp_parallel_rejoin(e->p, attempt_ms);
        if (st == TP_OK || st == TP_ERR_UNSUPPORTED) break;
        if (n++ % 6 == 0)
            tp_log(TP_LOG_WARN, "server", "the group has not re-formed yet: %s; still waiting", tp_parallel_last_error(e->p));
        tp_sleep_ms(100);
    }
    pthread_mutex_lock(&e->mu);
    e->rec_status = st;
    e->replan_done = replanned;
    e->rec_done = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* mu held: requests that waited longer than recover_wait_ms get a 503. */
static void expire_queue(struct tp_engine *e)
{
    uint64_t now = tp_now_ns(), wait_ns = (uint64_t)e->cfg.recover_wait_ms * 1000000ull;
    int kept = 0;
    for (int i = 0; i < e->q_len; i++) {
        struct tp_req *r = e->queue[(e->q_head + i) % e->cfg.max_queue];
        if (r->cancelled) {
            req_finish(e, r, TP_FINISH_CANCELLED, TP_OK, NULL);
        } else if (now - r->t_submit_ns > wait_ns) {
            char msg[420], who[32] = "a rank";
            if (e->lost_rank >= 0) snprintf(who, sizeof who, "rank %d", e->lost_rank);
            snprintf(msg, sizeof msg,
                     "no answer within --recover-wait %.1f s: the group is still re-forming after losing %s (%s); "
                     "retry later",
                     e->cfg.recover_wait_ms / 1000.0, who, e->lost_reason);
            req_finish(e, r, TP_FINISH_ERROR, TP_ERR_TIMEOUT, msg);
            e->rs.n_expired++;
        } else {
            e->queue[(e->q_head + kept) % e->cfg.max_queue] = r;
            kept++;
        }
    }
    e->q_len = kept;
}

/* mu held: one round of the recovering engine: start the recovery thread,
 * expire old queued requests, and once the group re-formed resume. */
static void engine_recover_round(struct tp_engine *e)
{
    if (!e->rec_thread_started) {
        if (pthread_create(&e->rec_thread, NULL, recover_main, e) != 0) {
            e->recovering = 0;
            engine_poison(e, "could not start the recovery thread");
            return;
        }
        e->rec_thread_started = 1;
    }
    expire_queue(e);
    if (!e->rec_done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        return;
    }
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->rec_thread, NULL);
    pthread_mutex_lock(&e->mu);
    e->rec_thread_started = 0;
    e->recovering = 0;
    if (e->rec_status != TP_OK) {
        if (!e->stop) engine_poison(e, tp_parallel_last_error(e->p));
        return;
    }
    double secs = (double)(tp_now_ns() - e->lost_ns) / 1e9;
    e->rs.n_recoveries++;
    e->rs.recovery_s_total += secs;
    e->rs.last_recovery_s = secs;
    e->last_ok_ns = tp_now_ns();
    e->replan_note[0] = '\0';
    tp_spec_draft_reset(e->draft); /* a sharded draft's cache is not the same on every rank any more */
    if (e->replan_done) {
        e->rs.n_replans++;
        e->n_ranks = tp_parallel_size(e->p);
        e->can_recover = e->n_ranks > 1;
        e->stats_dirty = 1;
        tp_log(TP_LOG_INFO, "server",
               "group re-planned without rank %d in epoch %u after %.2f s: serving on %d rank(s); serving %d queued "
               "request(s)",
               e->lost_rank, tp_parallel_epoch(e->p), secs, e->n_ranks, e->q_len);
    } else {
        tp_log(TP_LOG_INFO, "server", "group re-formed in epoch %u after %.2f s; serving %d queued request(s)",
               tp_parallel_epoch(e->p), secs, e->q_len);
    }
}

/* mu NOT held: a step or ping failed with why. */
static void engine_failed(struct tp_engine *e, const char *why)
{
    uint64_t t_fail = tp_now_ns();
    int lost = e->can_recover ? identify_lost(e) : -1;
    pthread_mutex_lock(&e->mu);
    if (e->can_recover && !e->stop) engine_lose(e, lost, t_fail, why);
    else engine_poison(e, why);
}

static void *engine_main(void *arg)
{
    struct tp_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        if (e->failed) {
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        if (e->recovering) {
            engine_recover_round(e);
            continue;
        }
        admit(e);
        draft_round(e); /* may release mu while the draft model runs */
        if (e->stop || e->failed || e->recovering) continue;
        struct tp_step st;
        int n = build_step(e, &st);
        if (n == 0 && st.n_clear == 0 && st.n_copy == 0) {
            if (e->stats_dirty) {
                /* going idle: publish the counters of the last steps */
                pthread_mutex_unlock(&e->mu);
                refresh_stats(e, 1);
                pthread_mutex_lock(&e->mu);
                continue;
            }
            /* idle: ping every second, or at once when a rank's liveness link closed */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            int rc = pthread_cond_timedwait(&e->cv, &e->mu, &ts);
            uint64_t now = tp_now_ns();
            int due = now - e->last_ping_ns >= 1000000000ull ||
                      (!e->recovering && tp_parallel_lost_rank(e->p, TP_ENGINE_SILENT_MS, NULL) >= 0);
            if (rc != 0 && due && !e->stop && e->q_len == 0) {
                e->last_ping_ns = now;
                pthread_mutex_unlock(&e->mu);
                enum tp_status ps = tp_parallel_ping(e->p);
                if (ps != TP_OK) {
                    engine_failed(e, tp_parallel_last_error(e->p)); /* returns with mu held */
                    continue;
                }
                refresh_stats(e, 1);
                pthread_mutex_lock(&e->mu);
                e->last_ok_ns = tp_now_ns();
            }
            continue;
        }
        int n_rows = 0;
        for (int i = 0; i < n; i++) n_rows += st.batch.logits[i] != 0;
        const int greedy = n_rows > 0 && step_is_greedy(e, n_rows); /* no rows (embeddings only): no gather */
        e->step_start_ns = tp_now_ns();
        pthread_mutex_unlock(&e->mu);
        const tp_comm_t *comm = tp_parallel_comm(e->p);
        struct tp_comm_stats cs0 = {0}, cs1 = {0};
        if (comm) tp_comm_get_stats(comm, &cs0);
        enum tp_status rc = greedy ? tp_parallel_step_greedy(e->p, &st, e->ids, NULL)
                                   : tp_parallel_step(e->p, &st, e->logits);
        if (comm) tp_comm_get_stats(comm, &cs1);
        if (rc == TP_OK) {
            e->stats_dirty = 1;
            refresh_stats(e, 0);
        }
        if (rc != TP_OK) {
            char why[300];
            snprintf(why, sizeof why, "%s (%s)", tp_parallel_last_error(e->p), tp_status_str(rc));
            engine_failed(e, why); /* returns with mu held */
            e->step_start_ns = 0;
            continue;
        }
        pthread_mutex_lock(&e->mu);
        e->step_start_ns = 0;
        e->last_ok_ns = tp_now_ns();
        e->step_collectives += cs1.n_ops - cs0.n_ops;
        embed_rows(e, &st);
        int row = 0;
        for (int i = 0; i < n; i++) {
            if (!st.batch.logits[i]) continue;
            struct slot *s = &e->slots[e->row_slot[row]];
            const float *lr = e->logits + (size_t)row * (size_t)e->n_vocab;
            const int row_i = row;
            row++;
            if (!s->req) continue;
            if (s->req->cancelled) continue; /* dropped by admit() next round */
            s->n_past = st.batch.pos[i] + 1;
            if (s->dead_end) {
                s->dead_end = 0;
                req_finish(e, s->req, TP_FINISH_ERROR, TP_ERR_INVALID_ARG,
                           "logit_bias bans every token that continues the response_format value");
                s->req = NULL;
                continue;
            }
            if (s->n_draft > 0) { /* its drafts' rows follow this one in the batch */
                const int k = s->n_draft;
                slot_verify(e, s, greedy, row_i, st.batch.pos[i]);
                i += k;
                row += k;
                continue;
            }
            s->req->n_decode_steps++;
            e->decode_seq_steps++;
            if (greedy) {
                const struct tp_sample_result res = {.id = e->ids[row - 1], .logprob = 0.0f, .n_top = 0};
                slot_take(e, s, &res);
            } else {
                slot_sample(e, s, lr);
            }
        }
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/*
 * Where the draft model runs, and why (logged at start): rank 0 alone or
 * sharded over the ranks, as tp_parallel_init decided from its cost
 * (tp_parallel_draft_placement: its bytes per rank at the memory bandwidth
 * against 2 x its layers + 2 collectives per drafted token; docs/speculative.md,
 * "Where the draft model runs"); either way the drafts of all slots go in one
 * batched pass per drafted position.  A drafted token reads about draft bytes /
 * (the bytes of rank 0's share of the model) of what a step reads.
 */
static void draft_placement_log(const struct tp_engine *e, const char *path)
{
    const uint64_t db = tp_spec_draft_weight_bytes(e->draft);
    const uint64_t tb = tp_model_weight_bytes(tp_parallel_model(e->p));
    const struct tp_draft_place_result *dec = tp_parallel_draft_decision(e->p);
    const double ratio = tb > 0 ? (double)db / (double)tb : 0.0;
    tp_log(TP_LOG_INFO, "server", "draft model %s %s (%.1f MiB on rank 0, %d layers): a drafted token reads %.3f of "
           "what a step reads on rank 0; %s",
           path, tp_spec_draft_is_sharded(e->draft) ? "sharded over the ranks" : "on rank 0", (double)db / 1048576.0,
           tp_spec_draft_n_layer(e->draft), ratio, dec ? dec->reason : "");
    if (ratio > 0.5)
        tp_log(TP_LOG_WARN, "server",
               "the draft model is %.0f%% the size of the model's share on rank 0: drafting %d tokens costs about "
               "%.1f steps, so speculation rarely pays with it (docs/speculative.md)",
               100.0 * ratio, e->cfg.draft_max, ratio * e->cfg.draft_max);
}

enum tp_status tp_engine_init(const struct tp_engine_config *cfg, tp_parallel_t *p, struct tp_metrics *metrics,
                              struct tp_engine **out, struct tp_error *err)
{
    *out = NULL;
    const struct tp_hparams *hp = tp_parallel_hparams(p);
    tp_model_t *m = tp_parallel_model(p);
    if (cfg->n_parallel < 1 || cfg->n_parallel > 256)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "--parallel %d: must be between 1 and 256", cfg->n_parallel);
    if (cfg->n_parallel > tp_model_n_seq(m))
        return tp_error_set(err, TP_ERR_INVALID_ARG, "--parallel %d exceeds the engine's %d sequence slots",
                            cfg->n_parallel, tp_model_n_seq(m));
    if (cfg->n_batch < cfg->n_parallel)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "batch size %d must be >= --parallel %d", cfg->n_batch,
                            cfg->n_parallel);
    if (cfg->draft_max < 0 || cfg->draft_max > TP_SPEC_DRAFT_MAX)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "--draft-max %d: must be between 1 and %d", cfg->draft_max,
                            TP_SPEC_DRAFT_MAX);
    if (cfg->spec < 0 || cfg->spec >= TP_SPEC_MODE_COUNT)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "unknown speculative decoding mode %d", cfg->spec);
    if ((cfg->spec == TP_SPEC_DRAFT) != (cfg->draft_model != NULL))
        return tp_error_set(err, TP_ERR_INVALID_ARG, "%s",
                            cfg->draft_model ? "--draft-model needs --spec draft"
                                             : "--spec draft needs --draft-model FILE");
    struct tp_engine *e = calloc(1, sizeof *e);
    if (!e) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    e->cfg = *cfg;
    if (e->cfg.max_queue < 1) e->cfg.max_queue = 1;
    if (e->cfg.draft_max <= 0) e->cfg.draft_max = 4;
    e->p = p;
    e->tok = tp_parallel_tokenizer(p);
    e->metrics = metrics;
    e->n_vocab = hp->n_vocab;
    e->n_ctx = tp_model_n_ctx(m);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->queue = calloc((size_t)e->cfg.max_queue, sizeof *e->queue);
    e->slots = calloc((size_t)cfg->n_parallel, sizeof *e->slots);
    e->b_tok = calloc((size_t)cfg->n_batch, sizeof(int32_t));
    e->b_pos = calloc((size_t)cfg->n_batch, sizeof(int32_t));
    e->b_seq = calloc((size_t)cfg->n_batch, sizeof(int32_t));
    e->b_logits = calloc((size_t)cfg->n_batch, 1);
    e->rows_max = TP_MIN(cfg->n_batch, cfg->n_parallel * (1 + e->cfg.draft_max));
    e->row_slot = calloc((size_t)e->rows_max, sizeof(int));
    e->logits = malloc(sizeof(float) * (size_t)e->rows_max * (size_t)e->n_vocab);
    e->ids = calloc((size_t)e->rows_max, sizeof(int32_t));
    e->dreq = calloc((size_t)cfg->n_parallel, sizeof *e->dreq);
    e->hidden = malloc(sizeof(float) * (size_t)hp->n_embd);
    e->mask_words = (e->n_vocab + 31) / 32;
    e->mask = malloc(sizeof(uint32_t) * (size_t)e->rows_max * (size_t)e->mask_words);
    e->mask_row = calloc((size_t)e->rows_max, sizeof(int32_t));
    e->gscratch = malloc(sizeof(uint32_t) * (size_t)e->mask_words);
    e->eog = calloc((size_t)e->n_vocab, sizeof(int32_t));
    e->gnorm = malloc(sizeof *e->gnorm);
    e->rank_stats = calloc(TP_METRICS_RANKS_MAX, sizeof(*e->rank_stats));
    e->stats_tmp = calloc(TP_METRICS_RANKS_MAX, sizeof(*e->stats_tmp));
    const size_t n_bias = (size_t)e->rows_max * TP_MAX_LOGIT_BIAS;
    e->bias_row = malloc(n_bias * sizeof(int32_t));
    e->bias_id = malloc(n_bias * sizeof(int32_t));
    e->bias_val = malloc(n_bias * sizeof(float));
    if (!e->queue || !e->slots || !e->b_tok || !e->b_pos || !e->b_seq || !e->b_logits || !e->row_slot || !e->logits ||
        !e->ids || !e->bias_row || !e->bias_id || !e->bias_val || !e->mask || !e->mask_row || !e->eog || !e->gnorm ||
        !e->rank_stats || !e->stats_tmp || !e->hidden || !e->gscratch || !e->dreq)
        goto nomem;
    e->n_ranks = tp_parallel_get_rank_stats(p, e->rank_stats, TP_METRICS_RANKS_MAX);
    if (cfg->draft_model) {
        enum tp_status drc = tp_parallel_draft_model(p)
                                 ? tp_spec_draft_init_sharded(p, cfg->n_parallel, &e->draft, err)
                                 : tp_spec_draft_init(cfg->draft_model, e->n_ctx, cfg->n_parallel,
                                                      tp_model_n_threads(m), e->n_vocab, &e->draft, err);
        if (drc != TP_OK) {
            tp_engine_free(e);
            return drc;
        }
        draft_placement_log(e, cfg->draft_model);
    }
    for (int i = 0; i < cfg->n_parallel; i++) {
        if (tp_detok_init(e->tok, &e->slots[i].detok) != TP_OK) goto nomem;
        if (!(e->slots[i].hist = calloc((size_t)e->n_ctx + 1, sizeof(int32_t)))) goto nomem;
        if (!(e->slots[i].gst = malloc(sizeof *e->slots[i].gst))) goto nomem;
        if (!(e->slots[i].gkey = malloc(sizeof *e->slots[i].gkey))) goto nomem;
        if (!(e->slots[i].smask = malloc(sizeof(uint32_t) * (size_t)e->mask_words))) goto nomem;
        if (!(e->slots[i].gdraft = malloc(sizeof(struct tp_gstate) * (size_t)e->cfg.draft_max))) goto nomem;
    }
    e->last_ok_ns = tp_now_ns();
    e->lost_rank = -1;
    e->can_recover = tp_parallel_size(p) > 1 && tp_comm_backend(tp_parallel_comm(p)) != TP_COMM_BACKEND_MPI;
    if (e->cfg.recover_wait_ms == 0) e->cfg.recover_wait_ms = 60000;
    if (e->cfg.replan_after_ms == 0) e->cfg.replan_after_ms = 10000;
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        tp_engine_free(e);
        return tp_error_set(err, TP_ERR_NOMEM, "could not start the engine thread");
    }
    e->thread_started = 1;
    *out = e;
    return TP_OK;
nomem:
    tp_engine_free(e);
    return tp_error_set(err, TP_ERR_NOMEM, "out of memory allocating the engine's buffers");
}

void tp_engine_stop(struct tp_engine *e)
{
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started) pthread_join(e->thread, NULL);
    e->thread_started = 0;
    if (e->rec_thread_started) pthread_join(e->rec_thread, NULL); /* at most one attempt */
    e->rec_thread_started = 0;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; e->slots && i < e->cfg.n_parallel; i++) {
        struct slot *s = &e->slots[i];
        if (s->req) req_finish(e, s->req, TP_FINISH_ERROR, TP_ERR_BUSY, "the server is shutting down");
        s->req = NULL;
    }
    while (e->queue && e->q_len > 0) {
        struct tp_req *r = e->queue[e->q_head];
        e->q_head = (e->q_head + 1) % e->cfg.max_queue;
        e->q_len--;
        req_finish(e, r, TP_FINISH_ERROR, TP_ERR_BUSY, "the server is shutting down");
    }
    pthread_mutex_unlock(&e->mu);
    e->thread_started = 0;
}

void tp_engine_free(struct tp_engine *e)
{
    if (!e) return;
    tp_engine_stop(e);
    for (int i = 0; e->slots && i < e->cfg.n_parallel; i++) {
        tp_sampler_free(e->slots[i].sampler);
        tp_detok_free(e->slots[i].detok);
        free(e->slots[i].hist);
        free(e->slots[i].gst);
        free(e->slots[i].gkey);
        free(e->slots[i].smask);
        free(e->slots[i].gdraft);
        tp_buf_free(&e->slots[i].text);
    }
    free(e->queue);
    free(e->slots);
    free(e->b_tok);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_logits);
    free(e->row_slot);
    free(e->ids);
    free(e->dreq);
    free(e->rank_stats);
    free(e->stats_tmp);
    free(e->bias_row);
    free(e->bias_id);
    free(e->bias_val);
    free(e->mask);
    free(e->mask_row);
    free(e->gscratch);
    free(e->eog);
    free(e->gnorm);
    tp_mask_ctx_free(e->mctx);
    tp_spec_draft_free(e->draft);
    tp_token_trie_free(e->trie);
    free(e->logits);
    free(e->hidden);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

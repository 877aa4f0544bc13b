/*
 * parallel/executor.c - the distributed executor's life cycle: configuration,
 * init (collective), free and accessors (see parallel/parallel.h for the
 * contract; the step protocol is in step.c).
 *
 * Init: form the group, probe the model file, compute the plan (same on
 * every rank), agree, load this rank's slice (load-sync rounds meanwhile),
 * agree again.  Each agreement all_gathers a 256-byte record per rank
 * {status, hash, message}, so a rank that cannot go on (missing file, wrong
 * shard file, impossible plan, load failure) makes EVERY rank fail with the
 * same message naming that rank, and ranks that disagree about the
 * model/plan/config (hash) fail too; nobody is left waiting.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "executor_impl.h"
struct tp_parallel_config tp_parallel_default_config(void)
{
    struct tp_parallel_config c;
    memset(&c, 0, sizeof c);
    c.model = tp_model_default_config();
    c.comm = tp_comm_default_config();
    c.shard_weights = NULL;
    c.wire_dtype = TP_WIRE_F32;
    c.moe_split = TP_MOE_SPLIT_AUTO;
    return c;
}

const char *tp_wire_dtype_name(enum tp_wire_dtype dt)
{
    switch (dt) {
    case TP_WIRE_F32: return "f32";
    case TP_WIRE_F16: return "f16";
    case TP_WIRE_BF16: return "bf16";
    case TP_WIRE_Q8: return "q8";
    default: return "unknown";
    }
}

enum tp_status tp_wire_dtype_parse(const char *s, enum tp_wire_dtype *out)
{
    for (int i = 0; i < TP_WIRE_COUNT; i++)
        if (s && strcmp(s, tp_wire_dtype_name((enum tp_wire_dtype)i)) == 0) {
            *out = (enum tp_wire_dtype)i;
            return TP_OK;
        }
    return TP_ERR_INVALID_ARG;
}

/* ------------------------------------------------------------ agreement */

struct agree_rec {
    int32_t status;
    int32_t pad;
    uint64_t hash;
    char msg[240];
};
_Static_assert(sizeof(struct agree_rec) == 256, "agreement record is 256 bytes on the wire");

/*
 * Collective: every rank contributes (st, hash, its error text); every rank
 * returns the same verdict.  On a comm failure the comm error is returned.
 */
static enum tp_status agree(tp_parallel_t *p, enum tp_status st, uint64_t hash, const char *what)
{
    if (p->world == 1) return st == TP_OK ? TP_OK : tp_error_set(&p->err, st, "%s", tp_error_msg(&p->err));
    struct agree_rec mine, *all = calloc((size_t)p->world, sizeof *all);
    if (!all) {
        tp_comm_abort(p->comm, "parallel: out of memory during start-up agreement");
        return tp_error_set(&p->err, TP_ERR_NOMEM, "out of memory during start-up agreement");
    }
    memset(&mine, 0, sizeof mine);
    mine.status = (int32_t)st;
    mine.hash = hash;
    snprintf(mine.msg, sizeof mine.msg, "%s", st == TP_OK ? "" : tp_error_msg(&p->err));
    enum tp_status cs = tp_comm_all_gather(p->comm, &mine, all, sizeof mine, TP_DTYPE_U8);
    enum tp_status rc = TP_OK;
    if (cs != TP_OK) {
        rc = tp_error_force(&p->err, cs, "rank %d: group failed while agreeing on %s: %s", p->rank, what,
                            tp_comm_last_error(p->comm));
        goto out;
    }
    for (int r = 0; r < p->world; r++) {
        if (all[r].status != TP_OK) {
            all[r].msg[sizeof all[r].msg - 1] = '\0';
            enum tp_status rs = all[r].status > 0 && all[r].status < TP_STATUS_COUNT ? (enum tp_status)all[r].status
                                                                                      : TP_ERR_PROTOCOL;
            rc = tp_error_force(&p->err, rs, "rank %d of %d failed %s: %s", r, p->world, what,
                                all[r].msg[0] ? all[r].msg : tp_status_str(rs));
            goto out;
        }
    }
    for (int r = 1; r < p->world; r++) {
        if (all[r].hash != all[0].hash) {
            rc = tp_error_force(&p->err, TP_ERR_INVALID_ARG,
                                "rank %d disagrees with rank 0 on %s (hash %016llx vs %016llx): every rank needs the "
                                "same model (or its shard files), --shard-weights, --ctx/--n-seq/--batch and "
                                "--comm-dtype",
                                r, what, (unsigned long long)all[r].hash, (unsigned long long)all[0].hash);
            goto out;
        }
    }
out:
    free(all);
    return rc;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= 1099511628211ull;
    }
    return h;
}

/* ------------------------------------------------------------------ plan */

/* What the ranks agree on: model, plan, wire dtype and sizes. */
static uint64_t plan_hash(const tp_parallel_t *p)
{
    uint64_t h = 14695981039346656037ull;
    h = mix(h, tp_probe_hash(&p->probe));
    h = mix(h, tp_shard_plan_hash(&p->plan));
    h = mix(h, (uint64_t)p->wire_dtype);
    h = mix(h, (uint64_t)(uint32_t)p->cfg_n_ctx);
    h = mix(h, (uint64_t)(uint32_t)p->cfg_n_seq);
    h = mix(h, (uint64_t)(uint32_t)p->cfg_n_batch);
    if (p->has_draft_dec && p->draft_dec.placement == TP_DRAFT_PLACEMENT_SHARDED) {
        h = mix(h, tp_probe_hash(&p->dprobe));
        h = mix(h, tp_shard_plan_hash(&p->dplan));
        h = mix(h, (uint64_t)(uint32_t)p->d_n_batch);
    }
    return h;
}

/* tmpl with "{rank}" replaced by this rank (shard files under launch/mpirun) into out (4096 bytes). */
static enum tp_status expand_into(tp_parallel_t *p, const char *tmpl, char *out, size_t cap)
{
    const char *at = strstr(tmpl, "{rank}");
    int n = at ? snprintf(out, cap, "%.*s%d%s", (int)(at - tmpl), tmpl, p->rank, at + 6) : snprintf(out, cap, "%s", tmpl);
    if (n < 0 || (size_t)n >= cap)
        return tp_error_set(&p->err, TP_ERR_INVALID_ARG, "model path is longer than %zu bytes", cap - 1);
    return TP_OK;
}
static enum tp_status expand_path(tp_parallel_t *p, const char *tmpl) { return expand_into(p, tmpl, p->path, sizeof p->path); }

static enum tp_status make_plan(tp_parallel_t *p, const struct tp_parallel_config *cfg)
{
    struct tp_model_probe *pr = &p->probe;
    const char *path = p->path;
    double w[TP_PLAN_MAX_RANKS];
    const double *wp = NULL;
    enum tp_status st;

    if ((st = tp_model_probe(path, pr, &p->err)) != TP_OK) return st;
    if (p->world > TP_PLAN_MAX_RANKS)
        return tp_error_set(&p->err, TP_ERR_UNSUPPORTED, "world size %d is above the %d ranks a plan supports",
                            p->world, TP_PLAN_MAX_RANKS);
    const char *wtext = cfg->shard_weights;
    if (pr->is_shard) {
        if (pr->shard_world != p->world)
            return tp_error_set(&p->err, TP_ERR_INVALID_ARG,
                                "%s is a shard file for a world of %d ranks, but this group has %d ranks; launch %d "
                                "ranks or cut new shards with `tpserve shard MODEL -n %d -o DIR`",
                                path, pr->shard_world, p->world, pr->shard_world, p->world);
        if (pr->shard_rank != p->rank)
            return tp_error_set(&p->err, TP_ERR_INVALID_ARG,
                                "%s holds the slice of rank %d of %d, but this process is rank %d; give each rank "
                                "its own file (rank %d needs the one with tpserve.shard.rank = %d)",
                                path, pr->shard_rank, pr->shard_world, p->rank, p->rank, p->rank);
        if (!wtext || !*wtext) wtext = pr->shard_weights;
    }
    if (wtext && *wtext) {
        if ((st = tp_parallel_parse_weights(wtext, p->world, w, &p->err)) != TP_OK) return st;
        wp = w;
        memcpy(p->weights, w, (size_t)p->world * sizeof *w);
        p->has_weights = 1;
    }
    p->moe_split = cfg->moe_split;
    if (pr->hp.n_vocab >= (1 << 24))
        return tp_error_set(&p->err, TP_ERR_UNSUPPORTED, "vocabulary of %d tokens is too large (max 2^24)",
                            pr->hp.n_vocab);
    if (pr->is_shard && pr->shard_moe_split != TP_MOE_SPLIT_AUTO) { /* MoE shard file: its split, or refuse */
        if (cfg->moe_split != TP_MOE_SPLIT_AUTO && cfg->moe_split != pr->shard_moe_split)
            return tp_error_set(&p->err, TP_ERR_INVALID_ARG,
                                "%s was cut with --moe-split %s, but --moe-split %s was asked for; drop --moe-split or "
                                "cut new shards with `tpserve shard MODEL -n %d --moe-split %s -o DIR`",
                                path, tp_moe_split_name(pr->shard_moe_split), tp_moe_split_name(cfg->moe_split),
                                p->world, tp_moe_split_name(cfg->moe_split));
        p->moe_split = pr->shard_moe_split;
    }
    if ((st = tp_parallel_plan_moe(&pr->hp, &pr->types, p->world, wp, p->moe_split, &p->plan, &p->err)) != TP_OK)
        return st;
    if (pr->is_shard) {
        int same = tp_shard_plan_hash(&p->plan) == pr->shard_plan_hash;
        for (int r = 0; same && r < p->world; r++) {
            const struct tp_model_shard *s = &p->plan.ranks[r].shard;
            const int32_t *f = pr->shard_ranges + r * 8;
            same = f[0] == s->q_head_begin && f[1] == s->q_head_end && f[2] == s->kv_head_begin &&
                   f[3] == s->kv_head_end && f[4] == s->ff_begin && f[5] == s->ff_end && f[6] == s->vocab_begin &&
                   f[7] == s->vocab_end;
            const int32_t *x = pr->shard_experts + r * 4;
            if (same && pr->shard_moe_split != TP_MOE_SPLIT_AUTO)
                same = x[0] == s->expert_begin && x[1] == s->expert_end && x[2] == s->shexp_begin &&
                       x[3] == s->shexp_end;
        }
        if (!same)
            return tp_error_set(&p->err, TP_ERR_INVALID_ARG,
                                "%s was cut with --shard-weights '%s', which does not match the plan asked for "
                                "('%s'); drop --shard-weights or cut new shards",
                                path, pr->shard_weights[0] ? pr->shard_weights : "equal",
                                cfg->shard_weights ? cfg->shard_weights : "equal");
    }
    return TP_OK;
}

/* -------------------------------------------------------------- buffers */

static enum tp_status alloc_buffers(tp_parallel_t *p)
{
    size_t nb = (size_t)p->n_batch;
    p->rows_max = (int)TP_MIN(nb, (size_t)p->n_seq * TP_PARALLEL_ROWS_PER_SEQ);
    p->bias_max = (int)TP_MIN((size_t)p->rows_max * TP_PARALLEL_BIAS_PER_ROW, (size_t)1 << 24);
    p->mask_words = (p->n_vocab + 31) / 32;
    p->body = calloc(4 * nb + 5 * (size_t)p->n_seq + 3 * (size_t)p->bias_max +
                         (size_t)p->rows_max * (1 + (size_t)p->mask_words) + 1,
                     sizeof(int32_t));
    p->local = tp_aligned_alloc(64, nb * (size_t)p->vocab_local * sizeof(float));
    const size_t per = 2 * TP_PARALLEL_TOPK_MAX + 2; /* floats per row: top-k candidates + (max, sum exp) */
    p->pairs = calloc(per * nb, sizeof(float));
    p->want = calloc(nb, 1);
    if (!p->body || !p->local || !p->pairs || !p->want) return TP_ERR_NOMEM;
    if (p->world > 1) {
        size_t per_row = (size_t)p->world * (size_t)p->vocab_max;
        size_t chunk = GATHER_MAX_FLOATS / per_row;
        p->chunk = (int)TP_MAX((size_t)1, TP_MIN(chunk, nb));
        p->send = tp_aligned_alloc(64, (size_t)p->chunk * (size_t)p->vocab_max * sizeof(float));
        if (!p->send) return TP_ERR_NOMEM;
        if (p->rank == 0) {
            p->gath = tp_aligned_alloc(64, (size_t)p->chunk * per_row * sizeof(float));
            p->pairs_all = calloc((size_t)p->world * per * nb, sizeof(float));
            p->rank_stats = calloc((size_t)p->world, sizeof(*p->rank_stats));
            p->stats_all = calloc((size_t)p->world * STATS_WORDS, sizeof(int32_t));
            if (!p->gath || !p->pairs_all || !p->rank_stats || !p->stats_all) return TP_ERR_NOMEM;
        }
        size_t max_count;
        int width = p->probe.hp.n_embd;
        if (p->has_draft_dec && p->draft_dec.placement == TP_DRAFT_PLACEMENT_SHARDED)
            width = TP_MAX(width, p->dprobe.hp.n_embd); /* the draft's all_sums go through the same hook */
        if (tp_mul_size(nb, (size_t)width, &max_count)) return TP_ERR_NOMEM;
        p->wire_max_count = max_count;
        enum tp_status st = tp_wire_init(&p->wire, p->comm, p->wire_dtype, max_count);
        if (st != TP_OK) return st;
    }
    return TP_OK;
}

/* The step buffers of alloc_buffers (a re-plan sizes them again). */
static void free_buffers(tp_parallel_t *p)
{
    free(p->body);
    tp_aligned_free(p->local);
    tp_aligned_free(p->send);
    tp_aligned_free(p->gath);
    free(p->pairs);
    free(p->want);
    free(p->pairs_all);
    pthread_mutex_lock(&p->mu);
    free(p->rank_stats);
    p->rank_stats = NULL;
    pthread_mutex_unlock(&p->mu);
    free(p->stats_all);
    p->body = NULL;
    p->local = p->send = p->gath = p->pairs = p->pairs_all = NULL;
    p->want = NULL;
    p->stats_all = NULL;
}

/* After this rank's slice loaded: its figures, the vocabulary ranges of the
 * plan, the step buffers. */
static enum tp_status after_load(tp_parallel_t *p)
{
    const struct tp_shard_rank_plan *rp = &p->plan.ranks[p->rank];
    p->stats.weight_bytes = tp_model_weight_bytes(p->model);
    p->stats.kv_bytes = tp_model_kv_bytes(p->model);
    p->stats.mem_total_bytes = tp_mem_total_bytes();
    p->stats.rss_bytes = tp_rss_bytes();
    if (gethostname(p->stats.host, sizeof p->stats.host) != 0) snprintf(p->stats.host, sizeof p->stats.host, "?");
    p->stats.host[sizeof p->stats.host - 1] = '\0';
    p->n_batch = p->cfg_n_batch;
    p->n_seq = tp_model_n_seq(p->model);
    p->n_ctx = tp_model_n_ctx(p->model);
    p->n_vocab = p->probe.hp.n_vocab;
    p->vocab_begin = rp->shard.vocab_begin;
    p->vocab_local = rp->shard.vocab_end - rp->shard.vocab_begin;
    p->vocab_max = 0;
    p->equal_vocab = 1;
    for (int r = 0; r < p->world; r++) {
        int v = p->plan.ranks[r].shard.vocab_end - p->plan.ranks[r].shard.vocab_begin;
        if (p->vocab_max && v != p->vocab_max) p->equal_vocab = 0;
        p->vocab_max = TP_MAX(p->vocab_max, v);
    }
    if (p->world == 1) {
        p->vocab_begin = 0;
        p->vocab_local = p->vocab_max = p->n_vocab;
    }
    enum tp_status st = alloc_buffers(p);
    if (st != TP_OK) tp_error_set(&p->err, st, "out of memory for the engine's step buffers");
    return st;
}

/* ------------------------------------------------------------- load sync */

/*
 * Loading a big model can take longer than the comm op timeout, and ranks
 * finish at different times.  While the main thread loads, this thread
 * (the only user of the group meanwhile) runs lockstep rounds with its
 * peers: every ~200 ms each rank all_gathers its state (0 loading, 1 done,
 * 2 failed), so nobody waits in one collective for a slow loader; the rounds
 * end in the same round on every rank, when none is still loading.
 * The verdict and the messages then go through agree().
 */
struct load_sync {
    tp_parallel_t *p;
    pthread_t thread;
    atomic_int state;
    enum tp_status comm_status;
};

static void *load_sync_main(void *arg)
{
    struct load_sync *ls = arg;
    tp_parallel_t *p = ls->p;
    int32_t *all = calloc((size_t)p->world, sizeof(int32_t));
    if (!all) {
        ls->comm_status = TP_ERR_NOMEM;
        tp_comm_abort(p->comm, "parallel: out of memory in load sync");
        return NULL;
    }
    for (;;) {
        for (int i = 0; i < 20 && atomic_load(&ls->state) == 0; i++) tp_sleep_ms(10);
        int32_t mine = atomic_load(&ls->state);
        enum tp_status st = tp_comm_all_gather(p->comm, &mine, all, 1, TP_DTYPE_I32);
        if (st != TP_OK) {
            ls->comm_status = st;
            break;
        }
        int done = 1;
        for (int r = 0; r < p->world; r++) done &= all[r] != 0;
        if (done) break; /* a failed rank waits for the others too: they cannot be interrupted mid-load */
    }
    free(all);
    return NULL;
}

/* ------------------------------------------------------------------ init */

/* Rank 0 of a group: start the thread that pings idle workers. */
static enum tp_status start_keepalive(tp_parallel_t *p)
{
    p->last_ns = tp_now_ns();
    if (p->world < 2 || p->rank != 0) return TP_OK;
    uint32_t op = p->comm_cfg.op_timeout_ms ? p->comm_cfg.op_timeout_ms : 30000;
    p->keep_ms = TP_MAX(50u, op / 4);
    p->keep_stop = 0;
    if (pthread_create(&p->keep, NULL, tp_engine_keepalive_main, p) != 0) {
        tp_comm_abort(p->comm, "parallel: rank 0 could not start its keepalive thread");
        return tp_error_set(&p->err, TP_ERR_NOMEM, "cannot start the keepalive thread");
    }
    p->keep_started = 1;
    return TP_OK;
}

static void stop_keepalive(tp_parallel_t *p)
{
    if (!p->keep_started) return;
    pthread_mutex_lock(&p->mu);
    p->keep_stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->keep, NULL);
    p->keep_started = 0;
}

/* Replace the group pointer that other threads' liveness queries read (engine thread). */
static void set_comm(tp_parallel_t *p, tp_comm_t *c)
{
    pthread_mutex_lock(&p->view_mu);
    p->comm = c;
    pthread_mutex_unlock(&p->view_mu);
}

/* The group formed completely: publish its size, epoch, backend and plan for other threads. */
static void publish_view(tp_parallel_t *p)
{
    pthread_mutex_lock(&p->view_mu);
    p->view.world = p->world;
    p->view.epoch = p->comm ? tp_comm_epoch(p->comm) : 0;
    p->view.backend = p->comm ? tp_comm_backend_name(tp_comm_backend(p->comm)) : "local";
    p->view.transport = tp_comm_transport(p->comm);
    p->view.plan = p->plan;
    pthread_mutex_unlock(&p->view_mu);
}

/* Step 1: the group (none for a world of 1). */
static enum tp_status form_group(tp_parallel_t *p, const struct tp_parallel_config *cfg)
{
    if (cfg->comm.world_size == 1) {
        p->rank = 0;
        p->world = 1;
        if (cfg->comm.rank > 0)
            return tp_error_set(&p->err, TP_ERR_INVALID_ARG, "rank %d is out of range for a world of 1",
                                cfg->comm.rank);
        return TP_OK;
    }
    enum tp_status rc = tp_comm_init(&cfg->comm, &p->comm, &p->err);
    if (rc != TP_OK) return rc;
    p->rank = tp_comm_rank(p->comm);
    p->world = tp_comm_size(p->comm);
    return TP_OK;
}

/* ----------------------------------------------------------- draft model */

/*
 * Where the draft model runs (tp_parallel_config.draft_path), decided by rank 0 for the group.  With more
 * than one rank this is a collective every rank runs at init and at every re-form (whether or not a draft
 * is configured, so a replacement rank's init and the survivors' rejoin stay in step):
 *   1. all_gather DX_WORDS int32 per rank: a draft configured, the placement asked (rank 0 at a re-form:
 *      the one decided), whether rank 0 times the all_sum, the draft's n_embd, the rank's memory
 *      bandwidth in MB/s (measured here when not configured), its status so far;
 *   2. when rank 0 times it: 3 + DX_TIMED all_sums of n_embd floats on every rank;
 *   3. rank 0 decides (tp_parallel_draft_placement) and broadcasts DX_FRAME int32: status, placement,
 *      the reason's bytes; every rank adopts it, or fails with rank 0's message.
 */
enum { DX_HAS = 0, DX_ASKED, DX_TIME, DX_N_EMBD, DX_BW_MBS, DX_STATUS, DX_WORDS = 8 };
#define DX_TIMED 10
#define DX_FRAME 130 /* int32: status, placement, then 128 words (512 bytes) of the reason */
#define DX_BW_BYTES ((size_t)64 << 20)

/* This rank's streaming-read bandwidth with the model's thread count (GB/s; 0 if it cannot be measured). */
static double measure_bw(const struct tp_parallel_config *cfg)
{
    struct tp_pool_config pc = tp_pool_default_config();
    pc.n_threads = cfg->model.n_threads > 0 ? cfg->model.n_threads : tp_cpu_count();
    tp_pool_t *pool = NULL;
    if (tp_pool_init(&pc, &pool) != TP_OK) return 0.0;
    double bw = tp_mem_read_bw_gbs(pool, DX_BW_BYTES, 2);
    tp_pool_free(pool);
    return bw;
}

/* Every rank: the all_sum timing of step 2; rank 0 gets the mean microseconds of one. */
static enum tp_status time_allsum(tp_parallel_t *p, int n_embd, double *us)
{
    float *buf = calloc((size_t)n_embd, sizeof(float));
    if (!buf) {
        tp_comm_abort(p->comm, "parallel: out of memory timing the all_sum");
        return tp_error_set(&p->err, TP_ERR_NOMEM, "out of memory timing the all_sum");
    }
    enum tp_status st = TP_OK;
    uint64_t t0 = 0;
    for (int i = 0; i < 3 + DX_TIMED && st == TP_OK; i++) {
        if (i == 3) t0 = tp_now_ns();
        st = tp_comm_all_sum(p->comm, buf, buf, (size_t)n_embd, TP_DTYPE_F32);
    }
    *us = (double)(tp_now_ns() - t0) / 1e3 / DX_TIMED;
    free(buf);
    if (st != TP_OK)
        tp_error_force(&p->err, st, "rank %d: group failed while timing the all_sum: %s", p->rank,
                       tp_comm_last_error(p->comm));
    return st;
}

/* Rank 0: the decision from the gathered records (all: world x DX_WORDS). */
static enum tp_status draft_decide(tp_parallel_t *p, const struct tp_parallel_config *cfg, const int32_t *all,
                                   double allsum_us)
{
    double bw[TP_PLAN_MAX_RANKS];
    for (int r = 0; r < p->world; r++) {
        bw[r] = all[r * DX_WORDS + DX_BW_MBS] / 1e3;
        if (!(bw[r] > 0.0)) bw[r] = all[DX_BW_MBS] > 0 ? all[DX_BW_MBS] / 1e3 : 1.0; /* not measured: rank 0's */
    }
    double w[TP_PLAN_MAX_RANKS];
    const double *wp = NULL;
    if (cfg->shard_weights && *cfg->shard_weights &&
        tp_parallel_parse_weights(cfg->shard_weights, p->world, w, NULL) == TP_OK)
        wp = w;
    struct tp_draft_place_input in = {&p->dprobe.hp, &p->dprobe.types, p->world, wp, cfg->draft_placement, bw,
                                      allsum_us};
    enum tp_status st = tp_parallel_draft_placement(&in, &p->draft_dec, &p->err);
    if (st != TP_OK || p->draft_dec.placement != TP_DRAFT_PLACEMENT_SHARDED) return st;
    for (int r = 1; r < p->world; r++)
        if (!all[r * DX_WORDS + DX_HAS])
            return tp_error_set(&p->err, TP_ERR_INVALID_ARG,
                                "the draft model is sharded (%s) but rank %d was given no --draft-model: every rank "
                                "needs the same --draft-model, or use --draft-placement rank0",
                                p->draft_dec.reason, r);
    return TP_OK;
}

/* The collective above (cfg NULL at a re-form: rank 0 sends its decision again).  st: this rank's
 * status so far (a failed rank still takes part; agree() reports it).  Returns the decision's status, the
 * same on every rank (rank 0's draft file unreadable, SHARDED impossible, a comm failure). */
static enum tp_status draft_exchange(tp_parallel_t *p, const struct tp_parallel_config *cfg, enum tp_status st_in)
{
    enum tp_status st = TP_OK;
    int has = cfg ? cfg->draft_path != NULL : p->has_draft_dec;
    int asked = cfg ? (int)cfg->draft_placement : (int)p->draft_dec.placement;
    int n_embd = 0, time_it = 0;
    if (cfg && has && p->rank == 0 && st_in == TP_OK && p->world > 1) {
        st = expand_into(p, cfg->draft_path, p->dpath, sizeof p->dpath);
        if (st == TP_OK) st = tp_model_probe(p->dpath, &p->dprobe, &p->err);
        if (st == TP_OK && p->dprobe.is_shard)
            st = tp_error_set(&p->err, TP_ERR_UNSUPPORTED,
                              "draft model %s is a shard file: give the whole draft model (it is split at load)",
                              p->dpath);
        n_embd = st == TP_OK ? p->dprobe.hp.n_embd : 0;
        time_it = cfg->draft_allsum_us <= 0 && n_embd > 0; /* also when asked: the reason gives the costs */
    }
    if (cfg && has && p->world > 1)
        p->draft_bw_gbs = cfg->draft_mem_bw_gbs > 0 ? cfg->draft_mem_bw_gbs : measure_bw(cfg);
    if (p->world == 1) {
        p->has_draft_dec = has;
        if (!has) return TP_OK;
        memset(&p->draft_dec, 0, sizeof p->draft_dec);
        p->draft_dec.placement = TP_DRAFT_PLACEMENT_RANK0;
        snprintf(p->draft_dec.reason, sizeof p->draft_dec.reason,
                 "draft on rank 0: a world of one rank%s", asked == TP_DRAFT_PLACEMENT_SHARDED ? " (nothing to shard)" : "");
        return TP_OK;
    }
    int32_t mine[DX_WORDS] = {0}, frame[DX_FRAME] = {0};
    mine[DX_HAS] = has;
    mine[DX_ASKED] = asked;
    mine[DX_TIME] = time_it;
    mine[DX_N_EMBD] = n_embd;
    mine[DX_BW_MBS] = (int32_t)TP_MIN(p->draft_bw_gbs * 1e3, 2e9);
    mine[DX_STATUS] = (int32_t)st;
    int32_t *all = calloc((size_t)p->world * DX_WORDS, sizeof(int32_t));
    if (!all) {
        tp_comm_abort(p->comm, "parallel: out of memory deciding the draft placement");
        return tp_error_set(&p->err, TP_ERR_NOMEM, "out of memory deciding the draft placement");
    }
    enum tp_status cs = tp_comm_all_gather(p->comm, mine, all, DX_WORDS, TP_DTYPE_I32);
    double us = cfg ? cfg->draft_allsum_us : p->draft_dec.allsum_us;
    if (cs == TP_OK && all[DX_TIME] && all[DX_N_EMBD] > 0 && all[DX_N_EMBD] <= (1 << 20))
        cs = time_allsum(p, all[DX_N_EMBD], &us);
    if (cs != TP_OK) {
        free(all);
        if (p->err.status != cs)
            tp_error_force(&p->err, cs, "rank %d: group failed while deciding the draft placement: %s", p->rank,
                           tp_comm_last_error(p->comm));
        return cs;
    }
    if (p->rank == 0) {
        enum tp_status ds = st;
        if (cfg && all[DX_HAS]) p->draft_dec.placement = TP_DRAFT_PLACEMENT_RANK0; /* until decided */
        if (!all[DX_HAS] || st_in != TP_OK) ds = TP_OK; /* a failed plan: agree() says so on every rank */
        else if (ds == TP_OK && cfg) ds = draft_decide(p, cfg, all, us);
        frame[0] = (int32_t)ds;
        frame[1] = all[DX_HAS] && ds == TP_OK ? (int32_t)p->draft_dec.placement : 0;
        char text[(DX_FRAME - 2) * 4];
        memset(text, 0, sizeof text); /* every byte goes on the wire */
        snprintf(text, sizeof text, "%s", ds != TP_OK ? tp_error_msg(&p->err) : all[DX_HAS] ? p->draft_dec.reason : "");
        for (int i = 0; i < DX_FRAME - 2; i++)
            frame[2 + i] = (int32_t)((uint32_t)(unsigned char)text[4 * i] |
                                     (uint32_t)(unsigned char)text[4 * i + 1] << 8 |
                                     (uint32_t)(unsigned char)text[4 * i + 2] << 16 |
                                     (uint32_t)(unsigned char)text[4 * i + 3] << 24);
    }
    const int rank0_has = all[DX_HAS];
    free(all);
    if ((cs = tp_comm_broadcast(p->comm, frame, DX_FRAME, TP_DTYPE_I32, 0)) != TP_OK)
        return tp_error_force(&p->err, cs, "rank %d: group failed while deciding the draft placement: %s", p->rank,
                              tp_comm_last_error(p->comm));
    char text[(DX_FRAME - 2) * 4];
    for (int i = 0; i < DX_FRAME - 2; i++)
        for (int b = 0; b < 4; b++) text[4 * i + b] = (char)(((uint32_t)frame[2 + i] >> (8 * b)) & 0xff);
    text[sizeof text - 1] = '\0';
    const enum tp_status ds = frame[0] > 0 && frame[0] < TP_STATUS_COUNT ? (enum tp_status)frame[0]
                              : frame[0] == 0 ? TP_OK : TP_ERR_PROTOCOL;
    if (ds != TP_OK) return tp_error_force(&p->err, ds, "%s%s", p->rank ? "rank 0: " : "", text);
    if (frame[1] != TP_DRAFT_PLACEMENT_RANK0 && frame[1] != TP_DRAFT_PLACEMENT_SHARDED && rank0_has)
        return tp_error_force(&p->err, TP_ERR_PROTOCOL, "rank 0 sent draft placement %d", frame[1]);
    if (!cfg) return TP_OK; /* a re-form: the decision stands */
    p->has_draft_dec = rank0_has;
    if (rank0_has && p->rank != 0) {
        memset(&p->draft_dec, 0, sizeof p->draft_dec);
        p->draft_dec.placement = (enum tp_draft_placement)frame[1];
        snprintf(p->draft_dec.reason, sizeof p->draft_dec.reason, "%s", text);
        p->draft_dec.allsum_us = us;
    }
    if (rank0_has && p->rank == 0) p->draft_dec.allsum_us = us;
    return TP_OK;
}

/* A sharded draft: every rank probes it (rank 0 did in draft_exchange) and plans it over the group with
 * the model's shard weights. */
static enum tp_status draft_plan(tp_parallel_t *p, const struct tp_parallel_config *cfg)
{
    p->d_n_batch = TP_MIN(256, cfg->model.n_batch > 0 ? cfg->model.n_batch : 256);
    if (!cfg->draft_path)
        return tp_error_set(&p->err, TP_ERR_INVALID_ARG,
                            "rank 0 shards its draft model over the group, but rank %d was given no --draft-model: "
                            "give every rank the same --draft-model (or --draft-placement rank0)", p->rank);
    enum tp_status st = TP_OK;
    if (p->rank != 0) {
        st = expand_into(p, cfg->draft_path, p->dpath, sizeof p->dpath);
        if (st == TP_OK) st = tp_model_probe(p->dpath, &p->dprobe, &p->err);
        if (st == TP_OK && p->dprobe.is_shard)
            st = tp_error_set(&p->err, TP_ERR_UNSUPPORTED, "draft model %s is a shard file: give the whole draft model",
                              p->dpath);
    }
    if (st == TP_OK && p->dprobe.hp.n_vocab != p->probe.hp.n_vocab)
        st = tp_error_set(&p->err, TP_ERR_INVALID_ARG,
                          "draft model %s has %d tokens in its vocabulary, the model %d: a draft model must share the "
                          "model's vocabulary (e.g. a smaller model of the same family)",
                          p->dpath, p->dprobe.hp.n_vocab, p->probe.hp.n_vocab);
    if (st == TP_OK)
        st = tp_parallel_plan(&p->dprobe.hp, &p->dprobe.types, p->world, p->has_weights ? p->weights : NULL, &p->dplan,
                              &p->err);
    return st;
}

/* After this rank's draft slice loaded (or reloaded): its vocabulary rows and logits buffer. */
static enum tp_status draft_after_load(tp_parallel_t *p)
{
    const struct tp_model_shard *s = &p->dplan.ranks[p->rank].shard;
    p->d_n_ctx = tp_model_n_ctx(p->draft);
    p->dvocab_begin = p->world > 1 ? s->vocab_begin : 0;
    p->dvocab_local = p->world > 1 ? s->vocab_end - s->vocab_begin : p->n_vocab;
    tp_aligned_free(p->dlocal);
    p->dlocal = tp_aligned_alloc(64, (size_t)p->d_n_batch * (size_t)p->dvocab_local * sizeof(float));
    if (!p->dlocal) return tp_error_set(&p->err, TP_ERR_NOMEM, "out of memory for the draft model's logits");
    return TP_OK;
}

/* This rank's draft slice (shard set from dplan), next to the model's. */
static enum tp_status draft_load(tp_parallel_t *p, const struct tp_parallel_config *cfg)
{
    struct tp_model_config dc = cfg->model;
    dc.path = p->dpath;
    dc.n_batch = p->d_n_batch;
    dc.n_ctx = p->n_ctx; /* the model's positions (resolved at its load): the draft follows every sequence */
    dc.vocab_only = 0;
    p->dshard = p->dplan.ranks[p->rank].shard;
    p->dshard.all_sum = p->world > 1 ? tp_wire_all_sum : NULL;
    p->dshard.all_sum_ctx = &p->wire;
    p->dshard.file_is_slice = 0;
    dc.shard = p->world > 1 ? &p->dshard : NULL;
    enum tp_status st = tp_model_init(&dc, &p->draft, &p->err);
    if (st == TP_OK) st = draft_after_load(p);
    if (st == TP_OK) {
        const struct tp_shard_rank_plan *rp = &p->dplan.ranks[p->rank];
        tp_log(TP_LOG_INFO, TP_PARALLEL_MODULE,
               "rank %d/%d: draft model %s sharded: q heads [%d,%d) ffn [%d,%d) vocab [%d,%d), %.1f MiB resident",
               p->rank, p->world, p->dpath, rp->shard.q_head_begin, rp->shard.q_head_end, rp->shard.ff_begin,
               rp->shard.ff_end, rp->shard.vocab_begin, rp->shard.vocab_end,
               (double)tp_model_weight_bytes(p->draft) / 1048576.0);
    }
    return st;
}

/* Step 2: probe the file and plan locally, then agree on the plan's hash with every rank. */
static enum tp_status plan_and_agree(tp_parallel_t *p, const struct tp_parallel_config *cfg)
{
    enum tp_status st = expand_path(p, cfg->model.path);
    if (st == TP_OK) st = make_plan(p, cfg);
    enum tp_status ds = draft_exchange(p, cfg, st);
    if (ds != TP_OK) return ds; /* the same on every rank: nobody goes on to agree() */
    if (st == TP_OK && p->has_draft_dec && p->draft_dec.placement == TP_DRAFT_PLACEMENT_SHARDED)
        st = draft_plan(p, cfg);
    p->cfg_n_ctx = cfg->model.n_ctx;
    p->cfg_n_seq = cfg->model.n_seq;
    p->cfg_n_batch = cfg->model.n_batch;
    p->kv_type = cfg->model.kv_f16 ? TP_KV_F16 : cfg->model.kv_type;
    uint64_t h = st == TP_OK ? plan_hash(p) : 14695981039346656037ull;
    p->plan_hash = h;
    return agree(p, st, h, "the sharding plan");
}

/* What this rank holds and what the plan says it should (after the load). */
static void log_resident(tp_parallel_t *p, const struct tp_shard_rank_plan *rp)
{
    uint64_t wb = tp_model_weight_bytes(p->model);
    size_t rss = tp_rss_bytes();
    /* KV cache: held KV heads of every layer and sequence, K and V; not part of the plan */
    double kv = (double)tp_model_kv_bytes(p->model);
    tp_log(TP_LOG_INFO, TP_PARALLEL_MODULE,
           "rank %d/%d: resident weights %.1f MiB (plan %.1f MiB) + KV cache %.1f MiB, process RSS %.1f MiB, "
           "comm dtype %s over %s",
           p->rank, p->world, (double)wb / 1048576.0, (double)(rp->sharded_bytes + rp->replicated_bytes) / 1048576.0,
           kv / 1048576.0, (double)rss / 1048576.0, tp_wire_dtype_name(p->wire_dtype),
           tp_comm_transport(p->comm));
}

/* Step 3: load this rank's slice while a load-sync thread keeps the group's collectives going, then
 * agree that every rank loaded. */
static enum tp_status load_slice(tp_parallel_t *p, const struct tp_parallel_config *cfg)
{
    enum tp_status rc = TP_OK;
    struct tp_model_config mc = cfg->model;
    mc.path = p->path;
    if (p->world > 1 || p->probe.is_shard) {
        p->shard = p->plan.ranks[p->rank].shard;
        p->shard.all_sum = p->world > 1 ? tp_wire_all_sum : NULL;
        p->shard.all_sum_ctx = &p->wire;
        p->shard.file_is_slice = p->probe.is_shard;
        mc.shard = &p->shard;
    } else {
        mc.shard = NULL;
    }
    mc.vocab_only = 0;
    const struct tp_shard_rank_plan *rp = &p->plan.ranks[p->rank];
    tp_log(TP_LOG_INFO, TP_PARALLEL_MODULE,
           "rank %d/%d: q heads [%d,%d) kv heads [%d,%d) ffn [%d,%d) vocab [%d,%d); plan %.1f MiB sharded + %.1f MiB "
           "replicated of %.1f MiB; %s",
           p->rank, p->world, rp->shard.q_head_begin, rp->shard.q_head_end, rp->shard.kv_head_begin,
           rp->shard.kv_head_end, rp->shard.ff_begin, rp->shard.ff_end, rp->shard.vocab_begin, rp->shard.vocab_end,
           (double)rp->sharded_bytes / 1048576.0, (double)rp->replicated_bytes / 1048576.0,
           (double)p->plan.total_bytes / 1048576.0, p->plan.note);
    struct load_sync ls;
    memset(&ls, 0, sizeof ls);
    ls.p = p;
    atomic_init(&ls.state, 0);
    int ls_started = p->world > 1 && pthread_create(&ls.thread, NULL, load_sync_main, &ls) == 0;
    if (p->world > 1 && !ls_started) {
        rc = tp_error_set(&p->err, TP_ERR_NOMEM, "cannot start the load-sync thread");
        tp_comm_abort(p->comm, "parallel: a rank could not start its load-sync thread");
        return rc;
    }
    enum tp_status st = tp_model_init(&mc, &p->model, &p->err);
    if (st != TP_OK && p->world > 1)
        tp_log(TP_LOG_ERROR, TP_PARALLEL_MODULE, "rank %d: %s (telling the other ranks once they have loaded)", p->rank,
               tp_error_msg(&p->err));
    p->stats.mem_limit_bytes = cfg->mem_limit_bytes;
    if (st == TP_OK) st = after_load(p);
    if (st == TP_OK && p->has_draft_dec && p->draft_dec.placement == TP_DRAFT_PLACEMENT_SHARDED) {
        st = draft_load(p, cfg);
        if (st != TP_OK && p->world > 1) tp_log(TP_LOG_ERROR, TP_PARALLEL_MODULE, "rank %d: %s", p->rank, tp_error_msg(&p->err));
    }
    if (ls_started) {
        atomic_store(&ls.state, st == TP_OK ? 1 : 2);
        pthread_join(ls.thread, NULL);
        if (ls.comm_status != TP_OK)
            return tp_error_force(&p->err, ls.comm_status, "rank %d: group failed while the ranks were loading: %s",
                                  p->rank, tp_comm_last_error(p->comm));
    }
    TP_CHECK_GOTO(agree(p, st, 0, "loading the model"), rc, out);
    log_resident(p, rp);
out:
    return rc;
}

enum tp_status tp_parallel_init(const struct tp_parallel_config *cfg, tp_parallel_t **out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    tp_parallel_t *p = NULL;
    if (!out) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_parallel_init: out is NULL");
    *out = NULL;
    if (!cfg || !cfg->model.path)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_parallel_init: no model path (give MODEL or --model)");
    if ((int)cfg->wire_dtype < 0 || cfg->wire_dtype >= TP_WIRE_COUNT)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "unknown --comm-dtype (want f32, f16, bf16 or q8)");
    p = calloc(1, sizeof *p);
    if (!p) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    atomic_init(&p->poisoned, 0);
    atomic_init(&p->rejoin_phase, 0);
    p->comm_cfg = cfg->comm;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->mu_inited = 1;
    pthread_mutex_init(&p->view_mu, NULL);
    p->view_mu_inited = 1;
    p->view.world = 1;
    p->view.backend = "local";
    p->view.transport = "none";
    p->wire_dtype = cfg->wire_dtype;

    TP_CHECK_GOTO(form_group(p, cfg), rc, fail);
    TP_CHECK_GOTO(plan_and_agree(p, cfg), rc, fail);
    TP_CHECK_GOTO(load_slice(p, cfg), rc, fail);
    /* 4. rank 0 keeps idle workers alive */
    TP_CHECK_GOTO(start_keepalive(p), rc, fail);
    publish_view(p);
    *out = p;
    return TP_OK;

fail:
    /* Every rank reached the same verdict (or the group already failed), so
     * leaving without a SHUTDOWN step is safe: tp_comm_free never hangs. */
    if (err) tp_error_set(err, rc, "%s", tp_error_msg(&p->err));
    p->shut = 1;
    tp_parallel_free(p);
    return rc;
}

/* ---------------------------------------------------------------- rejoin */

/* The load-sync rounds of tp_parallel_init from a rank that has its slice
 * already: state "done" in every round until no rank is loading. */
static enum tp_status load_sync_loaded(tp_parallel_t *p)
{
    int32_t *all = calloc((size_t)p->world, sizeof(int32_t));
    if (!all) return tp_error_set(&p->err, TP_ERR_NOMEM, "out of memory in load sync");
    enum tp_status st;
    for (;;) {
        int32_t mine = 1;
        st = tp_comm_all_gather(p->comm, &mine, all, 1, TP_DTYPE_I32);
        if (st != TP_OK) {
            tp_error_force(&p->err, st, "rank %d: group failed while a rank was loading: %s", p->rank,
                           tp_comm_last_error(p->comm));
            break;
        }
        int done = 1;
        for (int r = 0; r < p->world; r++) done &= all[r] != 0;
        if (done) break;
        atomic_store(&p->rejoin_phase, 2);
    }
    free(all);
    return st;
}

/*
 * The group formed smaller (drop > 0: the failed group's rank left out) or,
 * on rank 0 of a group of two, not at all (new_world 1): take the new place,
 * re-plan over the survivors, load the new slice (load-sync rounds
 * meanwhile), agree on both.  A failure is final (model_lost): the ranks'
 * places, plans and slices have changed.
 */
static enum tp_status reshape(tp_parallel_t *p, int drop, int new_rank, int new_world)
{
    enum tp_status st;
    const int old_world = p->world;
    p->model_lost = 1; /* from here the ranks' places and slices change: a failure is final */
    if (p->has_weights)
        memmove(&p->weights[drop], &p->weights[drop + 1], (size_t)(old_world - 1 - drop) * sizeof p->weights[0]);
    p->rank = new_rank;
    p->world = new_world;
    p->comm_cfg.rank = new_rank;
    p->comm_cfg.world_size = new_world;
    p->comm_cfg.drop_rank = 0;
    p->comm_cfg.former_world = TP_MAX(p->comm_cfg.former_world, old_world);
    if (p->comm_cfg.hostfile && *p->comm_cfg.hostfile)
        p->comm_cfg.hostfile_skip = tp_comm_skip_add(p->comm_cfg.hostfile_skip, drop);
    if (p->probe.is_shard)
        st = tp_error_set(&p->err, TP_ERR_UNSUPPORTED,
                          "%s is a shard file cut for %d ranks: it cannot be re-planned over %d (give every rank the "
                          "whole model to use --on-rank-loss replan)",
                          p->path, old_world, new_world);
    else
        st = tp_parallel_plan_moe(&p->probe.hp, &p->probe.types, new_world, p->has_weights ? p->weights : NULL,
                                  p->moe_split, &p->plan, &p->err);
    if (st == TP_OK && p->draft)
        st = tp_parallel_plan(&p->dprobe.hp, &p->dprobe.types, new_world, p->has_weights ? p->weights : NULL,
                              &p->dplan, &p->err);
    if (st == TP_OK) p->plan_hash = plan_hash(p);
    if ((st = agree(p, st, st == TP_OK ? p->plan_hash : 0, "the re-planned shards")) != TP_OK) return st;
    const struct tp_shard_rank_plan *rp = &p->plan.ranks[p->rank];
    tp_log(TP_LOG_INFO, TP_PARALLEL_MODULE,
           "rank %d/%d (re-planned without rank %d of %d): q heads [%d,%d) kv heads [%d,%d) ffn [%d,%d) vocab [%d,%d); "
           "%.1f MiB sharded + %.1f MiB replicated; loading the new slice",
           p->rank, p->world, drop, old_world, rp->shard.q_head_begin, rp->shard.q_head_end, rp->shard.kv_head_begin,
           rp->shard.kv_head_end, rp->shard.ff_begin, rp->shard.ff_end, rp->shard.vocab_begin, rp->shard.vocab_end,
           (double)rp->sharded_bytes / 1048576.0, (double)rp->replicated_bytes / 1048576.0);
    free_buffers(p);
    p->shard = rp->shard;
    p->shard.all_sum = p->world > 1 ? tp_wire_all_sum : NULL;
    p->shard.all_sum_ctx = &p->wire;
    p->shard.file_is_slice = 0;
    atomic_store(&p->rejoin_phase, 2);
    struct load_sync ls;
    memset(&ls, 0, sizeof ls);
    ls.p = p;
    atomic_init(&ls.state, 0);
    int ls_started = p->world > 1 && pthread_create(&ls.thread, NULL, load_sync_main, &ls) == 0;
    if (p->world > 1 && !ls_started) {
        tp_comm_abort(p->comm, "parallel: a rank could not start its load-sync thread");
        return tp_error_set(&p->err, TP_ERR_NOMEM, "cannot start the load-sync thread");
    }
    st = tp_model_reload(p->model, p->world > 1 ? &p->shard : NULL, &p->err);
    if (st == TP_OK) st = after_load(p);
    if (st == TP_OK && p->draft) { /* the sharded draft model: its slice over the survivors too */
        p->dshard = p->dplan.ranks[p->rank].shard;
        p->dshard.all_sum = p->world > 1 ? tp_wire_all_sum : NULL;
        p->dshard.all_sum_ctx = &p->wire;
        p->dshard.file_is_slice = 0;
        st = tp_model_reload(p->draft, p->world > 1 ? &p->dshard : NULL, &p->err);
        if (st == TP_OK) st = draft_after_load(p);
    }
    if (st != TP_OK) {
        tp_log(TP_LOG_ERROR, TP_PARALLEL_MODULE, "rank %d: %s", p->rank, tp_error_msg(&p->err));
    }
    if (ls_started) {
        atomic_store(&ls.state, st == TP_OK ? 1 : 2);
        pthread_join(ls.thread, NULL);
        if (ls.comm_status != TP_OK)
            return tp_error_force(&p->err, ls.comm_status, "rank %d: group failed while the ranks were loading: %s",
                                  p->rank, tp_comm_last_error(p->comm));
    }
    if ((st = agree(p, st, 0, "loading the re-planned slice")) != TP_OK) return st;
    p->model_lost = 0;
    return TP_OK;
}

static enum tp_status rejoin(tp_parallel_t *p, int drop, uint32_t connect_timeout_ms)
{
    if (!p) return TP_ERR_INVALID_ARG;
    if (p->world < 2 || p->comm_cfg.backend == TP_COMM_BACKEND_MPI)
        return tp_error_force(&p->err, TP_ERR_UNSUPPORTED,
                              "a group of %d rank(s) on the %s backend cannot re-form in place", p->world,
                              tp_comm_backend_name(p->comm_cfg.backend));
    if (p->model_lost) {
        char why[sizeof p->err.msg];
        snprintf(why, sizeof why, "%s", tp_error_msg(&p->err));
        return tp_error_force(&p->err, TP_ERR_UNSUPPORTED,
                              "a re-plan over fewer ranks failed on this rank (%.400s); restart the job", why);
    }
    enum tp_status rc = TP_OK;
    stop_keepalive(p);
    atomic_store(&p->poisoned, 1);
    atomic_store(&p->rejoin_phase, 1);
    tp_error_clear(&p->err); /* this attempt's error, not the failure that led here */
    const int had_group = p->comm != NULL;
    uint32_t epoch = p->comm ? tp_comm_epoch(p->comm) : 0;
    tp_wire_release(&p->wire);
    memset(&p->wire, 0, sizeof p->wire);
    tp_comm_t *old = p->comm;
    set_comm(p, NULL); /* other threads' liveness queries see no group from here */
    tp_comm_free(old);
    struct tp_comm_config cc = p->comm_cfg;
    cc.listen_fd = -1; /* an inherited socket was adopted (and closed) by the first group */
    cc.rank = p->rank;
    cc.world_size = p->world;
    if (connect_timeout_ms) cc.connect_timeout_ms = connect_timeout_ms;
    /* Rank 0 starts the next epoch after a group that had formed; an attempt
     * that formed nothing is retried in the same epoch.  Workers learn it. */
    if (p->rank == 0) {
        if (had_group) {
            uint32_t last = TP_MAX(epoch, p->comm_cfg.epoch);
            p->comm_cfg.epoch = (last ? last : 1u) + 1u;
        }
        cc.epoch = p->comm_cfg.epoch;
        if (drop > 0) {
            cc.world_size = p->world - 1;
            cc.drop_rank = drop;
            if (cc.hostfile && *cc.hostfile) cc.hostfile_skip = tp_comm_skip_add(cc.hostfile_skip, drop);
        }
    } else {
        cc.epoch = 0;
        cc.allow_shrink = p->comm_cfg.backend == TP_COMM_BACKEND_RING; /* rank 0 may have re-planned without a rank */
    }
    if (drop > 0 && p->world == 2) {
        /* rank 0 alone: no group to form */
        TP_CHECK_GOTO(reshape(p, drop, 0, 1), rc, out);
    } else {
        tp_comm_t *fresh = NULL;
        TP_CHECK_GOTO(tp_comm_init(&cc, &fresh, &p->err), rc, out);
        set_comm(p, fresh);
        /* the draft placement as at init, so a replacement rank's tp_parallel_init stays in step */
        TP_CHECK_GOTO(draft_exchange(p, NULL, TP_OK), rc, out);
        const int dropped = tp_comm_dropped_rank(p->comm);
        if (dropped > 0) {
            TP_CHECK_GOTO(reshape(p, dropped, tp_comm_rank(p->comm), tp_comm_size(p->comm)), rc, out);
        } else {
            TP_CHECK_GOTO(agree(p, TP_OK, p->plan_hash, "the sharding plan"), rc, out);
            TP_CHECK_GOTO(load_sync_loaded(p), rc, out);
            TP_CHECK_GOTO(agree(p, TP_OK, 0, "loading the model"), rc, out);
            if ((rc = tp_wire_init(&p->wire, p->comm, p->wire_dtype, p->wire_max_count)) != TP_OK) {
                tp_error_force(&p->err, rc, "out of memory for the wire buffers");
                tp_comm_abort(p->comm, "parallel: a rank could not rejoin");
                goto out;
            }
        }
    }
    p->shut = 0;
    pthread_mutex_lock(&p->mu);
    if (p->rank_stats) memset(p->rank_stats, 0, (size_t)p->world * sizeof(*p->rank_stats));
    pthread_mutex_unlock(&p->mu);
    atomic_store(&p->poisoned, 0);
    TP_CHECK_GOTO(start_keepalive(p), rc, out);
    publish_view(p);
    tp_error_clear(&p->err);
    tp_log(TP_LOG_INFO, TP_PARALLEL_MODULE, "rank %d/%d: group re-formed in epoch %u", p->rank, p->world,
           tp_comm_epoch(p->comm));
out:
    if (rc != TP_OK) atomic_store(&p->poisoned, 1);
    atomic_store(&p->rejoin_phase, 0);
    return rc;
}

enum tp_status tp_parallel_rejoin(tp_parallel_t *p, uint32_t connect_timeout_ms)
{
    return rejoin(p, 0, connect_timeout_ms);
}

enum tp_status tp_parallel_replan(tp_parallel_t *p, int drop, uint32_t connect_timeout_ms)
{
    if (!p) return TP_ERR_INVALID_ARG;
    if (p->rank != 0 || p->world < 2 || drop < 1 || drop >= p->world || p->comm_cfg.backend != TP_COMM_BACKEND_RING)
        return tp_error_force(&p->err, TP_ERR_UNSUPPORTED,
                              "only rank 0 of a ring group can re-plan without one of its ranks 1..%d (rank %d of %d, "
                              "%s backend, drop %d)",
                              p->world - 1, p->rank, p->world, tp_comm_backend_name(p->comm_cfg.backend), drop);
    return rejoin(p, drop, connect_timeout_ms);
}

enum tp_status tp_parallel_replan_query(tp_parallel_t *p, int drop, struct tp_replan_result *out)
{
    if (p->comm_cfg.backend != TP_COMM_BACKEND_RING) {
        /* rdma keeps its memory registrations and queue pairs per rank, mpi its processes: only the ring
         * bootstrap can form a smaller group in place */
        memset(out, 0, sizeof *out);
        snprintf(out->reason, sizeof out->reason,
                 "the %s backend cannot re-form the group with fewer ranks (a re-plan needs --backend ring)",
                 tp_comm_backend_name(p->comm_cfg.backend));
        return TP_OK;
    }
    struct tp_replan_input in;
    memset(&in, 0, sizeof in);
    in.hp = &p->probe.hp;
    in.types = &p->probe.types;
    in.moe_split = p->plan.moe_split != TP_MOE_SPLIT_AUTO ? p->plan.moe_split : p->moe_split;
    in.world = p->world;
    in.drop = drop;
    in.weights = p->has_weights ? p->weights : NULL;
    in.n_ctx = p->n_ctx;
    in.n_seq = p->n_seq;
    in.n_batch = p->n_batch;
    in.kv_type = p->kv_type;
    in.is_shard = p->probe.is_shard;
    pthread_mutex_lock(&p->mu);
    for (int r = 0; r < p->world && r < TP_PLAN_MAX_RANKS; r++) {
        const struct tp_parallel_stats *s = r == 0 ? &p->stats : (p->rank_stats ? &p->rank_stats[r] : NULL);
        if (!s) continue;
        in.ranks[r].mem_total_bytes = s->mem_total_bytes;
        in.ranks[r].mem_limit_bytes = s->mem_limit_bytes;
        memcpy(in.ranks[r].host, s->host, sizeof in.ranks[r].host);
    }
    pthread_mutex_unlock(&p->mu);
    return tp_parallel_replan_check(&in, out, &p->err);
}

int tp_parallel_rejoin_phase(const tp_parallel_t *p) { return p ? atomic_load(&p->rejoin_phase) : 0; }

void tp_parallel_get_view(const tp_parallel_t *p, struct tp_parallel_view *out)
{
    pthread_mutex_lock((pthread_mutex_t *)&p->view_mu);
    *out = p->view;
    pthread_mutex_unlock((pthread_mutex_t *)&p->view_mu);
}

uint32_t tp_parallel_epoch(const tp_parallel_t *p)
{
    if (!p) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&p->view_mu);
    uint32_t e = p->view.epoch;
    pthread_mutex_unlock((pthread_mutex_t *)&p->view_mu);
    return e;
}

/* A liveness query of comm/ on the current group, under the lock that a re-form swaps it with. */
static int query_group(const tp_parallel_t *p, int (*query)(const tp_comm_t *, uint32_t, uint32_t *),
                       uint32_t silent_ms, uint32_t *silent_for_ms)
{
    if (silent_for_ms) *silent_for_ms = 0;
    if (!p) return -1;
    pthread_mutex_lock((pthread_mutex_t *)&p->view_mu);
    int r = p->comm ? query(p->comm, silent_ms, silent_for_ms) : -1;
    pthread_mutex_unlock((pthread_mutex_t *)&p->view_mu);
    return r;
}

int tp_parallel_silent_rank(const tp_parallel_t *p, uint32_t silent_ms, uint32_t *silent_for_ms)
{
    return query_group(p, tp_comm_silent_rank, silent_ms, silent_for_ms);
}

int tp_parallel_lost_rank(const tp_parallel_t *p, uint32_t silent_ms, uint32_t *silent_for_ms)
{
    return query_group(p, tp_comm_lost_rank, silent_ms, silent_for_ms);
}

/* ------------------------------------------------------------------ free */

void tp_parallel_free(tp_parallel_t *p)
{
    if (!p) return;
    stop_keepalive(p);
    if (p->rank == 0 && p->comm && !p->shut && !atomic_load(&p->poisoned) && !tp_comm_is_poisoned(p->comm))
        tp_engine_send_shutdown(p);
    tp_model_free(p->model);
    tp_model_free(p->draft);
    tp_aligned_free(p->dlocal);
    tp_wire_release(&p->wire);
    tp_comm_free(p->comm);
    free(p->body);
    tp_aligned_free(p->local);
    tp_aligned_free(p->send);
    tp_aligned_free(p->gath);
    free(p->pairs);
    free(p->want);
    free(p->pairs_all);
    free(p->rank_stats);
    free(p->stats_all);
    if (p->mu_inited) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
    }
    if (p->view_mu_inited) pthread_mutex_destroy(&p->view_mu);
    free(p);
}

const char *tp_parallel_last_error(const tp_parallel_t *p) { return p ? tp_error_msg(&p->err) : ""; }
int tp_parallel_rank(const tp_parallel_t *p) { return p->rank; }
int tp_parallel_size(const tp_parallel_t *p)
{
    pthread_mutex_lock((pthread_mutex_t *)&p->view_mu);
    int n = p->view.world;
    pthread_mutex_unlock((pthread_mutex_t *)&p->view_mu);
    return n;
}
const tp_comm_t *tp_parallel_comm(const tp_parallel_t *p) { return p ? p->comm : NULL; }
tp_model_t *tp_parallel_model(const tp_parallel_t *p) { return p->model; }
tp_tokenizer_t *tp_parallel_tokenizer(const tp_parallel_t *p) { return tp_model_tokenizer(p->model); }
const struct tp_hparams *tp_parallel_hparams(const tp_parallel_t *p) { return tp_model_hparams(p->model); }
const struct tp_shard_plan *tp_parallel_get_plan(const tp_parallel_t *p) { return &p->plan; }
const char *tp_parallel_model_path(const tp_parallel_t *p) { return p->path; }
const struct tp_draft_place_result *tp_parallel_draft_decision(const tp_parallel_t *p)
{
    return p && p->has_draft_dec ? &p->draft_dec : NULL;
}
tp_model_t *tp_parallel_draft_model(const tp_parallel_t *p) { return p ? p->draft : NULL; }
int tp_parallel_draft_batch(const tp_parallel_t *p) { return p && p->draft ? p->d_n_batch : 0; }
int tp_parallel_is_poisoned(const tp_parallel_t *p) { return atomic_load(&p->poisoned); }
enum tp_wire_dtype tp_parallel_wire_dtype(const tp_parallel_t *p) { return p->wire_dtype; }
const char *tp_parallel_backend_name(const tp_parallel_t *p)
{
    pthread_mutex_lock((pthread_mutex_t *)&p->view_mu);
    const char *b = p->view.backend;
    pthread_mutex_unlock((pthread_mutex_t *)&p->view_mu);
    return b;
}

void tp_parallel_get_stats(const tp_parallel_t *p, struct tp_parallel_stats *out)
{
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    *out = p->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
}

int tp_parallel_get_rank_stats(const tp_parallel_t *p, struct tp_parallel_stats *out, int max)
{
    if (!p || !out || max < 1) return p ? p->world : 0;
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    int n = TP_MIN(max, p->world);
    for (int r = 0; r < n; r++) {
        if (r == p->rank) {
            out[r] = p->stats; /* live */
            out[r].rss_bytes = tp_rss_bytes();
        }
        else if (p->rank == 0 && p->rank_stats) out[r] = p->rank_stats[r];
        else memset(&out[r], 0, sizeof(out[r]));
    }
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return p->world;
}

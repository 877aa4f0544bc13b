/*
 * server/cluster.c - GET /v1/cluster: the group as the web page's cluster view
 * (and scripts) see it, as one JSON object (fields in docs/web.md).
 *
 * Everything comes from rank 0's own state, nothing is asked of the workers
 * here: their counters, memory figures and host names arrive with the stats
 * rank 0 already gathers with steps and pings (tp_parallel_get_rank_stats,
 * at most once a second while busy), their shares from the plan every rank
 * agreed on, their liveness from the comm heartbeats.  Building the answer
 * takes the engine's mutex only as long as /metrics does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <cjson/cJSON.h>

#include "http_impl.h"
#include "web_impl.h"

#define LOST_MS 600u           /* "lost": three heartbeats (every 200 ms) missed; /health turns 503 at 1 s */
#define RECOVER_NS 2000000000u /* "recovering": answering again, but silent within this window */

static double unix_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

/* The rank the comm heartbeats report silent for over LOST_MS, or -1 (one
 * rank, the mpi backend, which has no heartbeats, or no group formed while
 * it re-forms). */
static int silent_rank(struct tp_server *s)
{
    return tp_parallel_silent_rank(s->par, LOST_MS, NULL);
}

/* w->mu held: record n_generated at t (at most one sample a second) and
 * return the generation rate over the last few seconds. */
static double sample_rate(struct tp_web *w, double t, uint64_t n_generated)
{
    if (w->hist_len == 0 || t - w->hist[(w->hist_head + w->hist_len - 1) % TP_WEB_HISTORY].t >= 1.0) {
        int at = (w->hist_head + w->hist_len) % TP_WEB_HISTORY;
        if (w->hist_len == TP_WEB_HISTORY) w->hist_head = (w->hist_head + 1) % TP_WEB_HISTORY;
        else w->hist_len++;
        w->hist[at].t = t;
        w->hist[at].n_generated = n_generated;
    }
    /* the newest sample at least 1 s older than now, within 5 s */
    for (int i = w->hist_len - 1; i >= 0; i--) {
        const struct tp_web_sample *h = &w->hist[(w->hist_head + i) % TP_WEB_HISTORY];
        double dt = t - h->t;
        if (dt < 1.0) continue;
        if (dt > 5.0 || n_generated < h->n_generated) break;
        return (double)(n_generated - h->n_generated) / dt;
    }
    return 0.0;
}

/* w->mu held: [[t, tokens/s], ...] between consecutive samples, oldest first. */
static void add_history(cJSON *o, const struct tp_web *w)
{
    cJSON *a = cJSON_AddArrayToObject(o, "history");
    for (int i = 1; a && i < w->hist_len; i++) {
        const struct tp_web_sample *p = &w->hist[(w->hist_head + i - 1) % TP_WEB_HISTORY];
        const struct tp_web_sample *q = &w->hist[(w->hist_head + i) % TP_WEB_HISTORY];
        double dt = q->t - p->t;
        double tps = dt > 0 && q->n_generated >= p->n_generated ? (double)(q->n_generated - p->n_generated) / dt : 0;
        cJSON *pt = cJSON_CreateArray();
        cJSON_AddItemToArray(pt, cJSON_CreateNumber(round(q->t * 1000.0) / 1000.0));
        cJSON_AddItemToArray(pt, cJSON_CreateNumber(round(tps * 100.0) / 100.0));
        cJSON_AddItemToArray(a, pt);
    }
}

static void add_range(cJSON *o, const char *name, int begin, int end)
{
    cJSON *a = cJSON_AddArrayToObject(o, name);
    cJSON_AddItemToArray(a, cJSON_CreateNumber(begin));
    cJSON_AddItemToArray(a, cJSON_CreateNumber(end));
}

static cJSON *rank_object(struct tp_server *s, const struct tp_parallel_view *v, int r,
                          const struct tp_parallel_stats *st, const struct tp_parallel_stats *st0, const char *state)
{
    const struct tp_shard_plan *plan = &v->plan;
    const struct tp_hparams *hp = tp_parallel_hparams(s->par);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", r);
    cJSON_AddStringToObject(o, "host", st->host[0] ? st->host : "?");
    cJSON_AddStringToObject(o, "backend", v->backend);
    cJSON_AddStringToObject(o, "link", r == 0 ? "self" : strcmp(st->host, st0->host) == 0 ? "same-host" : "network");
    cJSON_AddStringToObject(o, "state", state);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)st->weight_bytes);
    cJSON_AddNumberToObject(o, "kv_bytes", (double)st->kv_bytes);
    cJSON_AddNumberToObject(o, "rss_bytes", (double)st->rss_bytes);
    cJSON_AddNumberToObject(o, "mem_total_bytes", (double)st->mem_total_bytes);
    cJSON *sh = cJSON_AddObjectToObject(o, "share");
    const struct tp_model_shard *d = r < plan->world_size ? &plan->ranks[r].shard : NULL;
    cJSON_AddNumberToObject(sh, "fraction", r < plan->world_size ? plan->ranks[r].weight : 1.0);
    add_range(sh, "layers", 0, hp->n_layer); /* tensor parallel: a slice of every layer */
    add_range(sh, "q_heads", d ? d->q_head_begin : 0, d ? d->q_head_end : hp->n_head);
    add_range(sh, "kv_heads", d ? d->kv_head_begin : 0, d ? d->kv_head_end : hp->n_head_kv);
    add_range(sh, "ffn", d ? d->ff_begin : 0, d ? d->ff_end : hp->n_ff);
    add_range(sh, "vocab", d ? d->vocab_begin : 0, d ? d->vocab_end : hp->n_vocab);
    cJSON_AddNullToObject(sh, "experts"); /* no mixture-of-experts model is supported yet */
    cJSON_AddNumberToObject(o, "n_steps", (double)st->n_steps);
    cJSON_AddNumberToObject(o, "n_tokens", (double)st->n_tokens);
    cJSON_AddNumberToObject(o, "compute_ns", (double)st->ns_compute);
    cJSON_AddNumberToObject(o, "comm_ns", (double)st->ns_comm);
    cJSON_AddNumberToObject(o, "bytes_sent", (double)st->bytes_sent);
    double nt = (double)(st->n_tokens ? st->n_tokens : 1);
    cJSON_AddNumberToObject(o, "compute_ms_per_token", st->n_tokens ? (double)st->ns_compute / nt / 1e6 : 0);
    cJSON_AddNumberToObject(o, "comm_ms_per_token", st->n_tokens ? (double)st->ns_comm / nt / 1e6 : 0);
    return o;
}

char *tp_cluster_json(struct tp_server *s)
{
    struct tp_web *w = s->web;
    /* the group as one consistent state (a re-plan changes its size and plan together) */
    struct tp_parallel_view *v = calloc(1, sizeof *v);
    cJSON *o = v ? cJSON_CreateObject() : NULL;
    if (!o) {
        free(v);
        return NULL;
    }
    double now = unix_now();
    cJSON_AddStringToObject(o, "object", "cluster");
    cJSON_AddNumberToObject(o, "time", round(now * 1000.0) / 1000.0);
    pthread_mutex_lock(&s->state_mu);
    enum tp_srv_state state = s->state;
    char reason[512];
    snprintf(reason, sizeof reason, "%s", s->fail_reason);
    pthread_mutex_unlock(&s->state_mu);
    struct tp_metrics_gauges g;
    memset(&g, 0, sizeof g);
    if (state == TP_SRV_READY) {
        tp_parallel_get_view(s->par, v);
        tp_engine_gauges(s->engine, &g);
        if (!tp_engine_healthy(s->engine, reason, sizeof reason) && g.healthy) g.healthy = 0;
    }
    const char *top = state == TP_SRV_LOADING ? "loading" : state == TP_SRV_FAILED ? "failed"
                      : g.healthy                ? "ready"
                                                 : "degraded";
    cJSON_AddStringToObject(o, "state", top);
    if (strcmp(top, "ready") != 0 && strcmp(top, "loading") != 0) cJSON_AddStringToObject(o, "reason", reason);
    else cJSON_AddNullToObject(o, "reason");

    cJSON *m = cJSON_AddObjectToObject(o, "model");
    cJSON_AddStringToObject(m, "id", s->model_id ? s->model_id : "");
    if (state == TP_SRV_READY) {
        const struct tp_hparams *hp = tp_parallel_hparams(s->par);
        cJSON_AddNumberToObject(m, "n_layer", hp->n_layer);
        cJSON_AddNumberToObject(m, "n_head", hp->n_head);
        cJSON_AddNumberToObject(m, "n_head_kv", hp->n_head_kv);
        cJSON_AddNumberToObject(m, "n_ff", hp->n_ff);
        cJSON_AddNumberToObject(m, "n_embd", hp->n_embd);
        cJSON_AddNumberToObject(m, "n_vocab", hp->n_vocab);
        cJSON_AddNumberToObject(m, "n_ctx", s->n_ctx);
        cJSON_AddNumberToObject(m, "weight_bytes", (double)v->plan.total_bytes);
        cJSON_AddNullToObject(m, "n_expert");
        cJSON_AddStringToObject(o, "backend", v->backend);
        cJSON_AddStringToObject(o, "transport", v->transport);
        cJSON_AddStringToObject(o, "wire_dtype", tp_wire_dtype_name(tp_parallel_wire_dtype(s->par)));
    }

    pthread_mutex_lock(&w->mu);
    cJSON *ld = cJSON_AddObjectToObject(o, "load");
    cJSON_AddNumberToObject(ld, "done_bytes", (double)w->load_done);
    cJSON_AddNumberToObject(ld, "total_bytes", (double)w->load_total);
    double tps = state == TP_SRV_READY ? sample_rate(w, now, g.n_generated) : 0.0;
    cJSON_AddNumberToObject(o, "tokens_per_s", round(tps * 100.0) / 100.0);
    cJSON_AddNumberToObject(o, "n_generated", (double)g.n_generated);
    cJSON_AddNumberToObject(o, "active_seqs", g.active_seqs);
    cJSON_AddNumberToObject(o, "queue_depth", g.queue_depth);
    cJSON_AddNumberToObject(o, "n_parallel", s->cfg.n_parallel);
    add_history(o, w);
    pthread_mutex_unlock(&w->mu);

    cJSON *ranks = cJSON_AddArrayToObject(o, "ranks");
    if (state == TP_SRV_LOADING) {
        /* the group is still forming or loading: only rank 0 is known here */
        cJSON *r0 = cJSON_CreateObject();
        cJSON_AddNumberToObject(r0, "rank", 0);
        cJSON_AddStringToObject(r0, "state", "loading");
        cJSON_AddNumberToObject(r0, "progress", w->load_total ? (double)w->load_done / (double)w->load_total : 0);
        cJSON_AddItemToArray(ranks, r0);
    } else if (state == TP_SRV_READY) {
        struct tp_parallel_stats *st = calloc(TP_PLAN_MAX_RANKS, sizeof *st);
        if (!st) {
            cJSON_Delete(o);
            free(v);
            return NULL;
        }
        /* the ranks of the view; the engine's counters only where they are of the same group (right
         * after a re-plan they can still be the larger group's, by its rank numbers, for a moment) */
        int world = v->world;
        int stats_world = tp_engine_rank_stats(s->engine, st, TP_PLAN_MAX_RANKS);
        if (stats_world != world)
            memset(&st[1], 0, (TP_PLAN_MAX_RANKS - 1) * sizeof *st);
        int n = world < TP_PLAN_MAX_RANKS ? world : TP_PLAN_MAX_RANKS;
        int silent = silent_rank(s);
        uint64_t tnow = tp_now_ns();
        pthread_mutex_lock(&w->mu);
        if (silent >= 0 && silent < TP_PLAN_MAX_RANKS) w->silent_seen_ns[silent] = tnow;
        for (int r = 0; r < n; r++) {
            const char *rs = "ready";
            if (r == silent) rs = "lost";
            else if (!g.healthy && r > 0 && silent < 0 && tp_parallel_is_poisoned(s->par)) rs = "lost";
            else if (!g.healthy && r == 0 && tp_parallel_is_poisoned(s->par)) rs = "failed";
            else if (w->silent_seen_ns[r] && tnow - w->silent_seen_ns[r] < RECOVER_NS) rs = "recovering";
            cJSON_AddItemToArray(ranks, rank_object(s, v, r, &st[r], &st[0], rs));
        }
        pthread_mutex_unlock(&w->mu);
        cJSON_AddNumberToObject(o, "n_ranks", world);
        free(st);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(v);
    return text;
}

/*
 * server/metrics.c - counters and histograms for GET /metrics, rendered in
 * the Prometheus text exposition format (0.0.4; checked with
 * `promtool check metrics` by tests/server when promtool is installed).
 *
 * Families: requests by HTTP status, prompt (and of those cached) and generated tokens, the last
 * request's decode rate, time to first token and time per output token
 * histograms, queue depth, active sequences, engine steps, and every rank's
 * communication / compute time and bytes sent (tp_parallel_get_rank_stats:
 * rank 0 live, the workers' as collected with the steps, about a second old).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server_impl.h"

static const int status_codes[] = {200, 400, 401, 404, 405, 413, 429, 499, 500, 503};
#define N_STATUS ((int)TP_ARRAY_LEN(status_codes))
static const double ttft_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double tpot_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
#define N_TTFT ((int)TP_ARRAY_LEN(ttft_bounds))
#define N_TPOT ((int)TP_ARRAY_LEN(tpot_bounds))

struct hist {
    uint64_t counts[16]; /* per bucket (non-cumulative), last = +Inf */
    uint64_t n;
    double sum;
};

struct tp_metrics {
    pthread_mutex_t mu;
    uint64_t by_status[N_STATUS + 1]; /* last: other */
    uint64_t prompt_tokens, gen_tokens, finished;
    uint64_t prompt_cached;          /* prompt tokens not prefilled (KV reuse, prefix sharing) */
    double last_tps;
    struct hist ttft, tpot;
};

struct tp_metrics *tp_metrics_new(void)
{
    struct tp_metrics *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void tp_metrics_free(struct tp_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void tp_metrics_request(struct tp_metrics *m, int status)
{
    if (!m) return;
    int k = N_STATUS;
    for (int i = 0; i < N_STATUS; i++)
        if (status_codes[i] == status) k = i;
    pthread_mutex_lock(&m->mu);
    m->by_status[k]++;
    pthread_mutex_unlock(&m->mu);
}

static void hist_add(struct hist *h, const double *bounds, int nb, double v)
{
    int k = nb;
    for (int i = 0; i < nb; i++)
        if (v <= bounds[i]) {
            k = i;
            break;
        }
    h->counts[k]++;
    h->n++;
    h->sum += v;
}

void tp_metrics_finished(struct tp_metrics *m, int n_prompt, int n_gen, double ttft_s, double tpot_s)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)(n_prompt > 0 ? n_prompt : 0);
    m->gen_tokens += (uint64_t)(n_gen > 0 ? n_gen : 0);
    m->finished++;
    if (n_gen > 0) hist_add(&m->ttft, ttft_bounds, N_TTFT, ttft_s);
    if (tpot_s >= 0) hist_add(&m->tpot, tpot_bounds, N_TPOT, tpot_s);
    pthread_mutex_unlock(&m->mu);
}

void tp_metrics_prompt_cached(struct tp_metrics *m, int n_cached)
{
    if (!m || n_cached <= 0) return;
    pthread_mutex_lock(&m->mu);
    m->prompt_cached += (uint64_t)n_cached;
    pthread_mutex_unlock(&m->mu);
}

void tp_metrics_tokens_per_s(struct tp_metrics *m, double tps)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->last_tps = tps;
    pthread_mutex_unlock(&m->mu);
}

/* Returns TP_OK or TP_ERR_NOMEM. */
static enum tp_status hist_render(struct tp_buf *o, const char *name, const char *help, const struct hist *h,
                                  const double *bounds, int nb)
{
    int rc = tp_buf_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < nb; i++) {
        cum += h->counts[i];
        rc |= tp_buf_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[nb];
    rc |= tp_buf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                        (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->n);
    return rc ? TP_ERR_NOMEM : TP_OK;
}

enum tp_status tp_metrics_render(struct tp_metrics *m, const struct tp_metrics_gauges *g, struct tp_buf *o)
{
    int rc = 0; /* nonzero once an append failed */
    pthread_mutex_lock(&m->mu);
    rc |= tp_buf_puts(o, "# HELP tpserve_requests_total HTTP requests answered, by status code.\n"
                         "# TYPE tpserve_requests_total counter\n");
    for (int i = 0; i <= N_STATUS; i++) {
        if (i < N_STATUS)
            rc |= tp_buf_printf(o, "tpserve_requests_total{status=\"%d\"} %llu\n", status_codes[i],
                                (unsigned long long)m->by_status[i]);
        else
            rc |= tp_buf_printf(o, "tpserve_requests_total{status=\"other\"} %llu\n",
                                (unsigned long long)m->by_status[i]);
    }
    rc |= tp_buf_printf(o,
                        "# HELP tpserve_prompt_tokens_total Prompt tokens processed.\n"
                        "# TYPE tpserve_prompt_tokens_total counter\ntpserve_prompt_tokens_total %llu\n"
                        "# HELP tpserve_prompt_tokens_cached_total Prompt tokens not prefilled: reused from the "
                        "slot's KV cache or copied from another slot's (prefix sharing).\n"
                        "# TYPE tpserve_prompt_tokens_cached_total counter\ntpserve_prompt_tokens_cached_total %llu\n"
                        "# HELP tpserve_generated_tokens_total Tokens generated.\n"
                        "# TYPE tpserve_generated_tokens_total counter\ntpserve_generated_tokens_total %llu\n"
                        "# HELP tpserve_completions_total Completions finished (stop or length).\n"
                        "# TYPE tpserve_completions_total counter\ntpserve_completions_total %llu\n"
                        "# HELP tpserve_generation_tokens_per_second Decode rate of the last finished request.\n"
                        "# TYPE tpserve_generation_tokens_per_second gauge\n"
                        "tpserve_generation_tokens_per_second %.3f\n",
                        (unsigned long long)m->prompt_tokens, (unsigned long long)m->prompt_cached,
                        (unsigned long long)m->gen_tokens,
                        (unsigned long long)m->finished, m->last_tps);
    rc |= hist_render(o, "tpserve_time_to_first_token_seconds", "Time from request to first generated token.",
                      &m->ttft, ttft_bounds, N_TTFT);
    rc |= hist_render(o, "tpserve_time_per_output_token_seconds", "Mean time between generated tokens per request.",
                      &m->tpot, tpot_bounds, N_TPOT);
    pthread_mutex_unlock(&m->mu);
    rc |= tp_buf_printf(o,
                        "# HELP tpserve_queue_depth Requests waiting for a sequence slot.\n"
                        "# TYPE tpserve_queue_depth gauge\ntpserve_queue_depth %d\n"
                        "# HELP tpserve_active_sequences Sequences being generated.\n"
                        "# TYPE tpserve_active_sequences gauge\ntpserve_active_sequences %d\n"
                        "# HELP tpserve_parallel_slots Sequence slots (--parallel).\n"
                        "# TYPE tpserve_parallel_slots gauge\ntpserve_parallel_slots %d\n"
                        "# HELP tpserve_healthy 1 when the engine and every rank are working.\n"
                        "# TYPE tpserve_healthy gauge\ntpserve_healthy %d\n"
                        "# HELP tpserve_ranks Ranks in the tensor-parallel group.\n"
                        "# TYPE tpserve_ranks gauge\ntpserve_ranks %d\n"
                        "# HELP tpserve_engine_steps_total Engine steps run.\n"
                        "# TYPE tpserve_engine_steps_total counter\ntpserve_engine_steps_total %llu\n",
                        g->queue_depth, g->active_seqs, g->n_parallel, g->healthy, g->n_ranks,
                        (unsigned long long)g->n_steps);
    const struct tp_engine_recovery_stats *rs = &g->recovery;
    rc |= tp_buf_printf(o,
                        "# HELP tpserve_recovering 1 while a rank is lost and the group is re-forming.\n"
                        "# TYPE tpserve_recovering gauge\ntpserve_recovering %d\n"
                        "# HELP tpserve_rank_losses_total Ranks lost (a step or ping failed; the group re-forms).\n"
                        "# TYPE tpserve_rank_losses_total counter\ntpserve_rank_losses_total %llu\n"
                        "# HELP tpserve_recoveries_total Times the group re-formed after losing a rank.\n"
                        "# TYPE tpserve_recoveries_total counter\ntpserve_recoveries_total %llu\n"
                        "# HELP tpserve_recovery_seconds_total Time from losing a rank to the group re-formed, summed.\n"
                        "# TYPE tpserve_recovery_seconds_total counter\ntpserve_recovery_seconds_total %.3f\n"
                        "# HELP tpserve_last_recovery_seconds Time the last recovery took.\n"
                        "# TYPE tpserve_last_recovery_seconds gauge\ntpserve_last_recovery_seconds %.3f\n"
                        "# HELP tpserve_requests_failed_by_rank_loss_total Requests generating when a rank was lost "
                        "(ended with 503).\n"
                        "# TYPE tpserve_requests_failed_by_rank_loss_total counter\n"
                        "tpserve_requests_failed_by_rank_loss_total %llu\n"
                        "# HELP tpserve_requests_recover_wait_expired_total Queued requests that waited out "
                        "--recover-wait during a recovery (503).\n"
                        "# TYPE tpserve_requests_recover_wait_expired_total counter\n"
                        "tpserve_requests_recover_wait_expired_total %llu\n"
                        "# HELP tpserve_replans_total Times the group re-formed without a lost rank "
                        "(--on-rank-loss replan).\n"
                        "# TYPE tpserve_replans_total counter\ntpserve_replans_total %llu\n",
                        g->recovering, (unsigned long long)rs->n_losses, (unsigned long long)rs->n_recoveries,
                        rs->recovery_s_total, rs->last_recovery_s, (unsigned long long)rs->n_failed_by_loss,
                        (unsigned long long)rs->n_expired, (unsigned long long)rs->n_replans);
    const double gen = (double)g->n_generated;
    rc |= tp_buf_printf(o,
                        "# HELP tpserve_spec_drafted_tokens_total Drafted tokens verified (speculative decoding).\n"
                        "# TYPE tpserve_spec_drafted_tokens_total counter\ntpserve_spec_drafted_tokens_total %llu\n"
                        "# HELP tpserve_spec_accepted_tokens_total Drafted tokens accepted.\n"
                        "# TYPE tpserve_spec_accepted_tokens_total counter\ntpserve_spec_accepted_tokens_total %llu\n"
                        "# HELP tpserve_spec_grammar_cuts_total Verification walks ended by an accepted draft "
                        "that switched the grammar on or off (tool_choice auto: a call began or ended; the rows "
                        "after it are verified again in the next step).\n"
                        "# TYPE tpserve_spec_grammar_cuts_total counter\ntpserve_spec_grammar_cuts_total %llu\n"
                        "# HELP tpserve_spec_acceptance_ratio Accepted over drafted tokens since start.\n"
                        "# TYPE tpserve_spec_acceptance_ratio gauge\ntpserve_spec_acceptance_ratio %.4f\n"
                        "# HELP tpserve_decode_tokens_per_step Generated tokens per (sequence, engine step) that "
                        "chose tokens, since start (1 without speculative decoding).\n"
                        "# TYPE tpserve_decode_tokens_per_step gauge\ntpserve_decode_tokens_per_step %.4f\n"
                        "# HELP tpserve_collectives_per_token Rank 0's collectives in engine steps per generated "
                        "token, since start (prefill included; 0 on one rank).\n"
                        "# TYPE tpserve_collectives_per_token gauge\ntpserve_collectives_per_token %.4f\n",
                        (unsigned long long)g->spec_drafted, (unsigned long long)g->spec_accepted,
                        (unsigned long long)g->spec_grammar_cuts, g->spec_drafted ? (double)g->spec_accepted / (double)g->spec_drafted : 0.0,
                        g->decode_seq_steps ? gen / (double)g->decode_seq_steps : 0.0,
                        gen > 0 ? (double)g->step_collectives / gen : 0.0);
    static const char *const fam[3][2] = {
        {"tpserve_comm_seconds_total", "Time spent in communication (all_sums, step broadcast, logits gather), per rank."},
        {"tpserve_compute_seconds_total", "Time spent computing the forward pass, per rank."},
        {"tpserve_comm_bytes_sent_total", "Bytes sent by each rank."}};
    for (int f = 0; f < 3; f++) {
        rc |= tp_buf_printf(o, "# HELP %s %s\n# TYPE %s counter\n", fam[f][0], fam[f][1], fam[f][0]);
        for (int r = 0; r < g->n_rank_stats; r++) {
            if (f == 2) rc |= tp_buf_printf(o, "%s{rank=\"%d\"} %llu\n", fam[f][0], r, (unsigned long long)g->bytes_sent[r]);
            else
                rc |= tp_buf_printf(o, "%s{rank=\"%d\"} %.6f\n", fam[f][0], r,
                                    (double)(f == 0 ? g->ns_comm[r] : g->ns_compute[r]) / 1e9);
        }
    }
    return rc ? TP_ERR_NOMEM : TP_OK;
}

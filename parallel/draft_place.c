/*
 * parallel/draft_place.c - where speculative decoding's draft model runs:
 * rank 0 alone or sharded over the group (tp_parallel_draft_placement, the
 * cost model in parallel/parallel.h).  Pure functions: the sharding planner
 * gives each rank's bytes, the caller the bandwidths and the all_sum time.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "parallel/parallel.h"

const char *tp_draft_placement_name(enum tp_draft_placement pl)
{
    switch (pl) {
    case TP_DRAFT_PLACEMENT_AUTO: return "auto";
    case TP_DRAFT_PLACEMENT_RANK0: return "rank0";
    case TP_DRAFT_PLACEMENT_SHARDED: return "sharded";
    default: return "unknown";
    }
}

enum tp_status tp_draft_placement_parse(const char *text, enum tp_draft_placement *out, struct tp_error *err)
{
    for (int i = 0; i < TP_DRAFT_PLACEMENT_COUNT; i++)
        if (text && strcmp(text, tp_draft_placement_name((enum tp_draft_placement)i)) == 0) {
            *out = (enum tp_draft_placement)i;
            return TP_OK;
        }
    return tp_error_set(err, TP_ERR_INVALID_ARG,
                        "--draft-placement '%s': want auto (decided from the draft's size, the memory bandwidth and "
                        "the all_sum time), rank0 (the draft on rank 0 alone) or sharded (a slice on every rank)",
                        text ? text : "");
}

/* Bytes rank r reads per decoded token of a model planned as `plan`: its slices (a mixture of experts:
 * the selected share of its experts), and of the replicated parts the norms and routers, or the whole
 * replicated part when the output head is the (replicated) embedding table.  One row of an untied
 * embedding table is not counted. */
static double read_bytes(const struct tp_hparams *hp, const struct tp_shard_plan *plan, int r)
{
    const struct tp_shard_rank_plan *rp = &plan->ranks[r];
    const double norms = (2.0 * hp->n_layer + 1.0) * hp->n_embd * sizeof(float);
    const double routers = hp->n_expert > 0 ? (double)hp->n_layer * hp->n_expert * hp->n_embd * sizeof(float) : 0.0;
    const double idle = hp->n_expert > 0 ? 1.0 - (double)hp->n_expert_used / hp->n_expert : 0.0;
    const double repl = hp->tied_embeddings ? (double)rp->replicated_bytes : norms + routers;
    return (double)rp->sharded_bytes - idle * (double)rp->expert_bytes + repl;
}

enum tp_status tp_parallel_draft_placement(const struct tp_draft_place_input *in, struct tp_draft_place_result *out,
                                           struct tp_error *err)
{
    memset(out, 0, sizeof *out);
    if (!in || !in->hp || !in->types || in->world < 1 || in->world > TP_PLAN_MAX_RANKS || !in->mem_bw_gbs)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "draft placement: no draft shape, or a world of %d ranks (want "
                            "1..%d)", in ? in->world : 0, TP_PLAN_MAX_RANKS);
    if ((int)in->asked < 0 || in->asked >= TP_DRAFT_PLACEMENT_COUNT)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "draft placement: unknown placement %d", (int)in->asked);
    if (!(in->allsum_us >= 0.0) || !isfinite(in->allsum_us))
        return tp_error_set(err, TP_ERR_INVALID_ARG, "draft placement: all_sum time %g us is not a time",
                            in->allsum_us);
    double bw_min = INFINITY;
    for (int r = 0; r < in->world; r++) {
        if (!(in->mem_bw_gbs[r] > 0.0) || !isfinite(in->mem_bw_gbs[r]))
            return tp_error_set(err, TP_ERR_INVALID_ARG,
                                "draft placement: rank %d's memory bandwidth %g GB/s is not a bandwidth (want > 0)", r,
                                in->mem_bw_gbs[r]);
        bw_min = fmin(bw_min, in->mem_bw_gbs[r]);
    }
    out->allsum_us = in->allsum_us;
    out->mem_bw_gbs_min = bw_min;
    out->collectives = 2 * in->hp->n_layer + 2;
    struct tp_shard_plan one, many;
    struct tp_error perr = {0};
    enum tp_status st = tp_parallel_plan(in->hp, in->types, 1, NULL, &one, &perr);
    if (st != TP_OK) return tp_error_set(err, st, "draft model: %s", perr.msg);
    const double r0 = read_bytes(in->hp, &one, 0);
    out->rank0_read_bytes = (uint64_t)r0;
    out->rank0_ms = r0 / (in->mem_bw_gbs[0] * 1e9) * 1e3;
    if (in->world == 1) {
        out->placement = TP_DRAFT_PLACEMENT_RANK0;
        snprintf(out->reason, sizeof out->reason,
                 "draft on rank 0: a world of one rank (%.2f ms a drafted token: %.1f MiB at %.1f GB/s)", out->rank0_ms,
                 r0 / 1048576.0, in->mem_bw_gbs[0]);
        return TP_OK;
    }
    tp_error_clear(&perr);
    st = tp_parallel_plan(in->hp, in->types, in->world, in->weights, &many, &perr);
    if (st != TP_OK) {
        if (in->asked == TP_DRAFT_PLACEMENT_SHARDED)
            return tp_error_set(err, st, "--draft-placement sharded: the draft model cannot be split over %d ranks (%s); "
                                "use --draft-placement rank0", in->world, perr.msg);
        out->placement = TP_DRAFT_PLACEMENT_RANK0;
        snprintf(out->reason, sizeof out->reason,
                 "draft on rank 0: it cannot be split over %d ranks (%.300s); %.2f ms a drafted token", in->world,
                 perr.msg, out->rank0_ms);
        return TP_OK;
    }
    double worst_ms = 0.0, worst_bytes = 0.0;
    for (int r = 0; r < in->world; r++) {
        const double b = read_bytes(in->hp, &many, r);
        worst_bytes = fmax(worst_bytes, b);
        worst_ms = fmax(worst_ms, b / (in->mem_bw_gbs[r] * 1e9) * 1e3);
    }
    out->rank_read_bytes_max = (uint64_t)worst_bytes;
    out->sharded_comm_ms = out->collectives * in->allsum_us / 1e3;
    out->sharded_ms = worst_ms + out->sharded_comm_ms;
    const int faster = out->sharded_ms <= 0.9 * out->rank0_ms;
    if (in->asked == TP_DRAFT_PLACEMENT_AUTO) out->placement = faster ? TP_DRAFT_PLACEMENT_SHARDED : TP_DRAFT_PLACEMENT_RANK0;
    else out->placement = in->asked;
    const char *why = in->asked != TP_DRAFT_PLACEMENT_AUTO ? "as asked (--draft-placement)"
                      : faster ? "sharded is at least 10% faster"
                               : "sharded is not at least 10% faster";
    snprintf(out->reason, sizeof out->reason,
             "draft %s, %s: a drafted token costs %.2f ms on rank 0 (%.1f MiB at %.1f GB/s) against %.2f ms sharded "
             "over %d ranks (%.1f MiB on the busiest rank + %d collectives x %.1f us = %.2f ms)",
             out->placement == TP_DRAFT_PLACEMENT_SHARDED ? "sharded" : "on rank 0", why, out->rank0_ms, r0 / 1048576.0,
             in->mem_bw_gbs[0], out->sharded_ms, in->world, worst_bytes / 1048576.0, out->collectives, in->allsum_us,
             out->sharded_comm_ms);
    return TP_OK;
}

/*
 * parallel/capacity.c - capacity planning: will a model fit on these nodes,
 * with which shard weights, and how fast will it decode?
 *
 * Pure functions behind `tpserve plan` (see the capacity section of
 * parallel/parallel.h for the memory and speed model).  The split itself is
 * tp_parallel_plan(), so the heads, KV groups and FFN blocks each node gets
 * here are exactly what the engine would load with the same shard weights.
 * No I/O, no allocation.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "parallel/parallel.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* ------------------------------------------------------------- profiles -- */

static const struct tp_cap_link link_profiles[] = {
    /* name      Gbit/s  one-way us: typical TCP small-message latencies */
    {"local", 100.0, 10.0},  /* loopback or one host */
    {"tb5", 40.0, 40.0},     /* TCP over a Thunderbolt 5 bridge (IP over TB) */
    {"tb4", 20.0, 50.0},     /* TCP over a Thunderbolt 4 / 3 bridge */
    {"10gbe", 10.0, 30.0},   /* 10 Gigabit Ethernet, one switch */
    {"25gbe", 25.0, 25.0},   /* 25 Gigabit Ethernet */
    {"1gbe", 1.0, 60.0},     /* Gigabit Ethernet */
    {"roce100", 100.0, 3.0}, /* RDMA over 100G Ethernet / InfiniBand (rdma backend) */
};

enum tp_status tp_capacity_link_profile(const char *name, struct tp_cap_link *out, struct tp_error *err)
{
    if (name && strcmp(name, "none") == 0) name = "local";
    for (size_t i = 0; name && i < TP_ARRAY_LEN(link_profiles); i++) {
        if (strcmp(name, link_profiles[i].name) == 0) {
            *out = link_profiles[i];
            return TP_OK;
        }
    }
    return tp_error_set(err, TP_ERR_INVALID_ARG,
                        "unknown link profile '%s' (known: local, none, tb5, tb4, 10gbe, 25gbe, 1gbe, roce100)",
                        name ? name : "(null)");
}

/* Peak memory bandwidth by machine class, GB/s (vendor figures). */
static const struct {
    const char *cls;
    double gbs;
} mem_classes[] = {
    {"m1", 68},        {"m1-pro", 200},   {"m1-max", 400},   {"m1-ultra", 800},  {"m2", 100},
    {"m2-pro", 200},   {"m2-max", 400},   {"m2-ultra", 800}, {"m3", 100},        {"m3-pro", 150},
    {"m3-max", 400},   {"m3-ultra", 819}, {"m4", 120},       {"m4-pro", 273},    {"m4-max", 546},
    {"ddr4-2ch", 45},  {"ddr5-2ch", 85},  {"ddr5-8ch", 300}, {"ddr5-12ch", 460},
};

double tp_capacity_class_bw(const char *cls)
{
    for (size_t i = 0; cls && i < TP_ARRAY_LEN(mem_classes); i++)
        if (strcasecmp(cls, mem_classes[i].cls) == 0) return mem_classes[i].gbs;
    return 0.0;
}

const char *tp_capacity_classes(void)
{
    return "m1, m1-pro, m1-max, m1-ultra, m2, m2-pro, m2-max, m2-ultra, m3, m3-pro, m3-max, m3-ultra, "
           "m4, m4-pro, m4-max, ddr4-2ch, ddr5-2ch, ddr5-8ch, ddr5-12ch";
}

/* ------------------------------------------------------------ node list -- */

/* "192G", "1.5T", "512M", "192GiB", "192GB" (binary units) -> bytes; 0 on error. */
static uint64_t parse_mem(const char *s, size_t len)
{
    char buf[32];
    if (len == 0 || len >= sizeof buf) return 0;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end = NULL;
    double v = strtod(buf, &end);
    if (end == buf || !(v > 0) || !isfinite(v)) return 0;
    double mul;
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1024.0; break;
    case 'M': mul = 1024.0 * 1024.0; break;
    case 'G': mul = GIB; break;
    case 'T': mul = GIB * 1024.0; break;
    default: return 0; /* a unit is required: "192" is ambiguous */
    }
    end++;
    if (strcasecmp(end, "") != 0 && strcasecmp(end, "B") != 0 && strcasecmp(end, "iB") != 0) return 0;
    double bytes = v * mul;
    if (bytes >= 1.8e19) return 0;
    return (uint64_t)bytes;
}

enum tp_status tp_capacity_parse_nodes(const char *text, double default_bw_gbs, struct tp_cap_node *out, int max,
                                       int *n_out, struct tp_error *err)
{
    *n_out = 0;
    if (!text || !*text)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "no nodes given (expected e.g. \"mac1:192G,mac2:128G\")");
    int n = 0;
    const char *p = text;
    while (*p) {
        const char *item_end = strchr(p, ',');
        size_t len = item_end ? (size_t)(item_end - p) : strlen(p);
        if (n >= max)
            return tp_error_set(err, TP_ERR_INVALID_ARG, "more than %d nodes given", max);
        /* split into up to three ':' fields */
        const char *f[3] = {p, NULL, NULL};
        size_t fl[3] = {0, 0, 0};
        int nf = 1;
        for (size_t i = 0; i < len; i++) {
            if (p[i] == ':') {
                if (nf == 3)
                    return tp_error_set(err, TP_ERR_INVALID_ARG,
                                        "bad node '%.*s': expected [NAME:]MEM[:BW], e.g. mac1:192G:m2-ultra",
                                        (int)len, p);
                fl[nf - 1] = (size_t)(p + i - f[nf - 1]);
                f[nf++] = p + i + 1;
            }
        }
        fl[nf - 1] = (size_t)(p + len - f[nf - 1]);
        struct tp_cap_node *nd = &out[n];
        memset(nd, 0, sizeof *nd);
        /* which field is the memory?  [NAME:]MEM[:BW]: with 1 field it is MEM; with 3 it is the
         * middle; with 2 it is the first if that parses as memory (MEM:BW), else the second. */
        int mi = 0;
        if (nf == 3) mi = 1;
        else if (nf == 2) mi = parse_mem(f[0], fl[0]) ? 0 : 1;
        nd->mem_bytes = parse_mem(f[mi], fl[mi]);
        if (!nd->mem_bytes)
            return tp_error_set(err, TP_ERR_INVALID_ARG,
                                "bad memory size in node '%.*s': expected a number with a unit, e.g. 192G or 512M",
                                (int)len, p);
        if (mi == 1) {
            if (fl[0] == 0 || fl[0] >= sizeof nd->name)
                return tp_error_set(err, TP_ERR_INVALID_ARG, "bad node name in '%.*s' (1..%zu characters)",
                                    (int)len, p, sizeof nd->name - 1);
            memcpy(nd->name, f[0], fl[0]);
        } else {
            snprintf(nd->name, sizeof nd->name, "node%d", n);
        }
        nd->mem_bw_gbs = default_bw_gbs;
        int bi = (nf == 3) ? 2 : (nf == 2 && mi == 0) ? 1 : -1;
        if (bi >= 0) {
            char bw[32];
            if (fl[bi] == 0 || fl[bi] >= sizeof bw)
                return tp_error_set(err, TP_ERR_INVALID_ARG, "bad bandwidth in node '%.*s'", (int)len, p);
            memcpy(bw, f[bi], fl[bi]);
            bw[fl[bi]] = '\0';
            char *end = NULL;
            double v = strtod(bw, &end);
            if (end != bw && *end == '\0' && v > 0 && isfinite(v)) {
                nd->mem_bw_gbs = v;
            } else if ((v = tp_capacity_class_bw(bw)) > 0) {
                nd->mem_bw_gbs = v;
            } else {
                return tp_error_set(err, TP_ERR_INVALID_ARG,
                                    "unknown bandwidth '%s' in node '%.*s': give GB/s (e.g. 800) or a class (%s)",
                                    bw, (int)len, p, tp_capacity_classes());
            }
        }
        n++;
        if (!item_end) break;
        p = item_end + 1;
        if (!*p) return tp_error_set(err, TP_ERR_INVALID_ARG, "trailing ',' in the node list '%s'", text);
    }
    *n_out = n;
    return TP_OK;
}

/* --------------------------------------------------------------- config -- */

struct tp_cap_config tp_capacity_default_config(void)
{
    struct tp_cap_config c;
    memset(&c, 0, sizeof c);
    c.wtype = TP_WTYPE_Q4_0;
    c.n_ctx = 4096;
    c.n_seq = 1;
    c.n_batch = 512;
    c.kv_type = TP_KV_AUTO;
    c.reserve_frac = 0.125;
    c.reserve_min_bytes = (uint64_t)(2 * GIB);
    c.overhead_bytes = (uint64_t)(0.5 * GIB);
    c.bw_efficiency = 0.7;
    tp_capacity_link_profile("local", &c.link, NULL);
    return c;
}

/* ------------------------------------------------------------- planning -- */

/* Smallest integer weights (sum <= 1000) within 2% of each proportion, "3,2,1". */
static void integer_weights(const double *w, int n, char *buf, size_t cap, double *iw)
{
    int best_t = 0;
    for (int t = n; t <= 1000 && !best_t; t++) {
        int ok = 1;
        for (int i = 0; i < n && ok; i++) {
            double r = floor(w[i] * t + 0.5);
            if (r < 1 || fabs(r / t - w[i]) > 0.02 * w[i]) ok = 0;
        }
        if (ok) best_t = t;
    }
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        double r = best_t ? floor(w[i] * best_t + 0.5) : fmax(1.0, floor(w[i] * 1000 + 0.5));
        iw[i] = r;
        int k = snprintf(buf + off, cap - off, "%s%.0f", i ? "," : "", r);
        if (k < 0 || (size_t)k >= cap - off) break;
        off += (size_t)k;
    }
}

static double gb(uint64_t b) { return (double)b / GIB; }

/* The collectives of a greedy decode step with the algorithm comm/ picks for
 * each (tp_parallel_decode_cost): each call costs its rounds of link latency
 * plus the busiest rank's bytes at the link rate.  A measured time replaces
 * the model for its collective (header_us: the step header broadcast,
 * allsum_us: one all_sum, gather_us: the argmax gather); a measured all_sum
 * also sets the latency of one round for the collectives not measured. */
static double comm_ms(const struct tp_hparams *hp, enum tp_wire_dtype dt, int world, const struct tp_cap_link *link,
                      double header_us, double allsum_us, double gather_us, int *rounds)
{
    if (rounds) *rounds = 0;
    if (world <= 1) return 0.0;
    const double rate = link->gbit * 1e9 / 8.0;
    double lat = link->latency_us * 1e-6;
    struct tp_parallel_decode_cost dc;
    tp_parallel_decode_cost(hp->n_layer, hp->n_embd, dt, world, 0, &dc);
    const struct tp_parallel_coll_cost *sum = NULL;
    for (int i = 0; i < dc.n; i++)
        if (strcmp(dc.c[i].what, "all_sum") == 0) sum = &dc.c[i];
    if (allsum_us > 0 && sum) lat = fmax(0.0, allsum_us * 1e-6 - (double)sum->max_bytes_sent / rate) / sum->cost.rounds;
    double t = 0;
    for (int i = 0; i < dc.n; i++) {
        const struct tp_parallel_coll_cost *c = &dc.c[i];
        double one = c->cost.rounds * lat + (double)c->max_bytes_sent / rate;
        const double measured = c == sum                                  ? allsum_us
                                : strcmp(c->what, "step header") == 0     ? header_us
                                : strcmp(c->what, "argmax gather") == 0   ? gather_us
                                                                          : 0.0;
        if (measured > 0) one = measured * 1e-6;
        t += c->times * one;
        if (rounds) *rounds += c->times * c->cost.rounds;
    }
    return t * 1e3;
}

double tp_capacity_comm_ms(const struct tp_hparams *hp, enum tp_wire_dtype dt, int world,
                           const struct tp_cap_link *link, double allsum_us, int *rounds)
{
    return comm_ms(hp, dt, world, link, 0.0, allsum_us, 0.0, rounds);
}

/* TP_ERR_INVALID_ARG naming what is wrong with cfg (nodes, model shape, context, link, node memory). */
static enum tp_status check_config(const struct tp_cap_config *cfg, struct tp_error *err)
{
    const struct tp_hparams *hp = &cfg->hp;
    const int n = cfg->n_nodes;
    if (n < 1 || n > TP_CAP_MAX_NODES)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "need between 1 and %d nodes, got %d", TP_CAP_MAX_NODES, n);
    if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_ff <= 0 ||
        hp->n_vocab <= 0 || hp->n_head % hp->n_head_kv != 0)
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "invalid model shape (layers %d, embd %d, heads %d/%d kv, ff %d, vocab %d)",
                            hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_ff, hp->n_vocab);
    const int head_dim = hp->head_dim > 0 ? hp->head_dim : hp->n_embd / hp->n_head;
    const size_t kv_row = tp_kv_row_bytes(cfg->kv_type, head_dim);
    if (cfg->n_ctx < 1 || cfg->n_seq < 1 || cfg->n_batch < 1 || kv_row == 0)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "invalid context settings (ctx %d, seq %d, batch %d, KV %s of head %d)",
                            cfg->n_ctx, cfg->n_seq, cfg->n_batch, tp_kv_type_name(cfg->kv_type), head_dim);
    if (!(cfg->link.gbit > 0) || !(cfg->link.latency_us >= 0) || !(cfg->bw_efficiency > 0 && cfg->bw_efficiency <= 1))
        return tp_error_set(err, TP_ERR_INVALID_ARG, "invalid link rate / latency / bandwidth efficiency");
    for (int i = 0; i < n; i++)
        if (!cfg->nodes[i].mem_bytes || !(cfg->nodes[i].mem_bw_gbs > 0))
            return tp_error_set(err, TP_ERR_INVALID_ARG, "node %s: memory and bandwidth must be > 0",
                                cfg->nodes[i].name);
    return TP_OK;
}

/* What the plan needs beyond the weights: the KV cache of one KV head (layer by layer, all
 * sequences) and the runtime bytes every node holds (fixed overhead + batch scratch); the replicated
 * weight bytes (from a one-rank plan) once known. */
struct cap_needs {
    double kv_per_head, overhead, repl;
};

static struct cap_needs plan_needs(const struct tp_cap_config *cfg)
{
    const struct tp_hparams *hp = &cfg->hp;
    struct cap_needs nd;
    /* K and V rows of one KV head: n_ctx positions per layer, or a sliding window's ring on the
     * windowed layers (every layer, or with swa_period p those with l % p < p - 1: gpt-oss's even ones) */
    nd.kv_per_head = /* layer by layer (tp_kv_layer_positions), all sequences */
        (double)tp_kv_head_bytes(hp, cfg->n_ctx, cfg->n_batch, cfg->kv_type) * (double)cfg->n_seq;
    const double scratch =
        (double)cfg->n_batch * (4.0 * hp->n_embd + 2.0 * hp->n_ff + (double)hp->n_vocab) * sizeof(float);
    nd.overhead = (double)cfg->overhead_bytes + scratch;
    nd.repl = 0;
    return nd;
}

/* Per node: memory, and bytes read per decoded token (its slices, the norms, the output head when
 * tied, and a KV cache half full on average) at its bandwidth: out->nodes, out->compute_ms.  Returns
 * the node short of memory by the most (-1: none), its shortfall in *worst_short. */
static int node_results(const struct tp_cap_config *cfg, const struct cap_needs *nd, const double *usable,
                        struct tp_cap_result *out, double *worst_short)
{
    const struct tp_hparams *hp = &cfg->hp;
    const struct tp_shard_plan *plan = &out->plan;
    const double norms = (2.0 * hp->n_layer + 1.0) * hp->n_embd * sizeof(float);
    /* mixture of experts: the routers (replicated, F32) every token, and about k / n_expert of the
     * rank's experts (any split: each expert is equally likely to be selected) */
    const double routers = hp->n_expert > 0 ? (double)hp->n_layer * hp->n_expert * hp->n_embd * sizeof(float) : 0.0;
    const double idle_frac = hp->n_expert > 0 ? 1.0 - (double)hp->n_expert_used / hp->n_expert : 0.0;
    const double read_repl = (hp->tied_embeddings ? nd->repl : norms + routers);
    int worst = -1;
    *worst_short = 0;
    for (int i = 0; i < cfg->n_nodes; i++) {
        const struct tp_shard_rank_plan *rp = &plan->ranks[i];
        struct tp_cap_node_result *nr = &out->nodes[i];
        nr->n_q_heads = rp->shard.q_head_end - rp->shard.q_head_begin;
        nr->n_kv_heads = rp->shard.kv_head_end - rp->shard.kv_head_begin;
        nr->n_ff = rp->shard.ff_end - rp->shard.ff_begin;
        nr->share = rp->weight;
        nr->weight_bytes = rp->sharded_bytes + rp->replicated_bytes;
        nr->kv_bytes = (uint64_t)(nd->kv_per_head * nr->n_kv_heads);
        nr->overhead_bytes = (uint64_t)nd->overhead;
        nr->need_bytes = nr->weight_bytes + nr->kv_bytes + nr->overhead_bytes;
        double kv_read = nd->kv_per_head * nr->n_kv_heads / cfg->n_seq * 0.5;
        double bytes = (double)rp->sharded_bytes - idle_frac * (double)rp->expert_bytes + read_repl + kv_read;
        nr->read_bytes_per_token = (uint64_t)bytes;
        nr->compute_ms = bytes / (cfg->nodes[i].mem_bw_gbs * 1e9 * cfg->bw_efficiency) * 1e3;
        if (nr->compute_ms > out->compute_ms) out->compute_ms = nr->compute_ms;
        if ((double)nr->need_bytes > usable[i] && (double)nr->need_bytes - usable[i] > *worst_short) {
            *worst_short = (double)nr->need_bytes - usable[i];
            worst = i;
        }
    }
    return worst;
}

/* The longest context: every node's room after weights and runtime over its KV bytes per position,
 * at most the trained context. */
static int plan_max_ctx(const struct tp_cap_config *cfg, const struct cap_needs *nd, const double *usable,
                        const struct tp_cap_result *out)
{
    const struct tp_hparams *hp = &cfg->hp;
    const int head_dim = hp->head_dim > 0 ? hp->head_dim : hp->n_embd / hp->n_head;
    const size_t kv_row = tp_kv_row_bytes(cfg->kv_type, head_dim);
    const int64_t ring = hp->sliding_window > 0 ? (int64_t)hp->sliding_window + cfg->n_batch : INT64_MAX;
    int n_win = 0;
    for (int l = 0; l < hp->n_layer; l++) n_win += tp_kv_layer_window(hp, l) > 0;
    const int n_full = hp->n_layer - n_win;
    const double trained = hp->n_ctx_train > 0 ? (double)hp->n_ctx_train : 1e9;
    double best = trained;
    for (int i = 0; i < cfg->n_nodes; i++) {
        const double free_b = usable[i] - (double)out->nodes[i].weight_bytes - nd->overhead;
        const double per_layer = (double)cfg->n_seq * 2.0 * (double)kv_row * out->nodes[i].n_kv_heads;
        const double per_pos = per_layer * hp->n_layer;
        if (free_b <= 0) best = 0;
        else if (n_full > 0 && n_win > 0) /* the windowed layers' rings, then the full layers grow */
            best = fmin(best, fmax(0.0, floor((free_b - per_layer * n_win * (double)ring) / (per_layer * n_full))));
        else if (per_pos > 0 && !(ring < INT64_MAX && per_pos * (double)ring <= free_b))
            best = fmin(best, floor(free_b / per_pos));
    }
    return (int)fmin(best, trained);
}

/* Communication per decoded token: time, rounds, and the bytes each node sends. */
static void plan_comm(const struct tp_cap_config *cfg, struct tp_cap_result *out)
{
    const struct tp_hparams *hp = &cfg->hp;
    const int n = cfg->n_nodes;
    out->comm_ms = comm_ms(hp, cfg->wire_dtype, n, &cfg->link, cfg->header_us, cfg->allsum_us, cfg->gather_us,
                           &out->comm_rounds_per_token);
    for (int i = 0; i < n; i++) {
        struct tp_parallel_decode_cost ri;
        tp_parallel_decode_cost(hp->n_layer, hp->n_embd, cfg->wire_dtype, n, i, &ri);
        out->nodes[i].wire_bytes_per_token = ri.bytes_sent;
        if (ri.bytes_sent > out->wire_bytes_per_token) out->wire_bytes_per_token = ri.bytes_sent;
    }
}

enum tp_status tp_capacity_plan(const struct tp_cap_config *cfg, struct tp_cap_result *out, struct tp_error *err)
{
    memset(out, 0, sizeof *out);
    const struct tp_hparams *hp = &cfg->hp;
    const int n = cfg->n_nodes;
    enum tp_status rc = check_config(cfg, err);
    if (rc != TP_OK) return rc;

    const struct tp_plan_types types = tp_plan_types_uniform(cfg->wtype);
    struct cap_needs nd = plan_needs(cfg);
    const double kv_total = nd.kv_per_head * hp->n_head_kv;
    const double overhead = nd.overhead;

    /* Whole-model bytes and the replicated part, from a one-rank plan. */
    struct tp_shard_plan *plan = &out->plan;
    struct tp_error perr = {0};
    if (tp_parallel_plan_moe(hp, &types, 1, NULL, cfg->moe_split, plan, &perr) != TP_OK)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "%s", perr.msg);
    const double total_w = (double)plan->total_bytes, repl = (double)plan->replicated_bytes;
    const double sharded_total = total_w - repl;
    nd.repl = repl;

    /* What each node has left for its share after the parts every node holds. */
    double usable[TP_CAP_MAX_NODES], room[TP_CAP_MAX_NODES], sum_room = 0, sum_usable = 0;
    for (int i = 0; i < n; i++) {
        double mem = (double)cfg->nodes[i].mem_bytes;
        double reserve = fmax((double)cfg->reserve_min_bytes, cfg->reserve_frac * mem);
        usable[i] = fmax(0.0, mem - reserve);
        room[i] = usable[i] - repl - overhead;
        sum_usable += usable[i];
        out->nodes[i].usable_bytes = (uint64_t)usable[i];
        out->usable_bytes += (uint64_t)usable[i];
    }
    const double need_total = sharded_total + kv_total + n * (repl + overhead);
    out->need_bytes = (uint64_t)need_total;
    memset(plan, 0, sizeof *plan);

    if (need_total > sum_usable) {
        out->short_bytes = (uint64_t)(need_total - sum_usable);
        snprintf(out->reason, sizeof out->reason,
                 "does not fit: needs %.1f GiB in all (%.1f GiB weights, %.1f GiB KV cache at ctx %d, "
                 "%.1f GiB runtime and replicated parts), the nodes have %.1f GiB usable: short by %.1f GiB "
                 "(add nodes or memory, use a smaller type or a shorter --ctx)",
                 gb((uint64_t)need_total), gb((uint64_t)total_w), gb((uint64_t)kv_total), cfg->n_ctx,
                 gb((uint64_t)(n * (repl + overhead) - repl)), gb((uint64_t)sum_usable), gb(out->short_bytes));
        return TP_OK;
    }
    for (int i = 0; i < n; i++) {
        if (room[i] <= 0) {
            out->short_bytes = (uint64_t)(-room[i]) + 1;
            snprintf(out->reason, sizeof out->reason,
                     "does not fit: node %s (%.1f GiB usable) cannot even hold the parts every node keeps "
                     "(%.1f GiB replicated weights + %.1f GiB runtime): short by %.1f GiB (leave it out)",
                     cfg->nodes[i].name, gb((uint64_t)usable[i]), gb((uint64_t)repl), gb((uint64_t)overhead),
                     gb(out->short_bytes));
            return TP_OK;
        }
        sum_room += room[i];
    }

    /* Shares proportional to room, as small integers; then the engine's own split. */
    double w[TP_CAP_MAX_NODES], iw[TP_CAP_MAX_NODES];
    for (int i = 0; i < n; i++) w[i] = room[i] / sum_room;
    integer_weights(w, n, out->shard_weights, sizeof out->shard_weights, iw);
    if (tp_parallel_plan_moe(hp, &types, n, iw, cfg->moe_split, plan, &perr) != TP_OK) {
        memset(plan, 0, sizeof *plan);
        snprintf(out->reason, sizeof out->reason, "cannot be split over %d nodes: %.440s", n, perr.msg);
        return TP_OK;
    }

    out->fits = 1;
    double worst_short = 0;
    const int worst = node_results(cfg, &nd, usable, out, &worst_short);
    out->max_ctx = plan_max_ctx(cfg, &nd, usable, out);
    if (worst >= 0) {
        out->fits = 0;
        out->short_bytes = (uint64_t)worst_short;
        snprintf(out->reason, sizeof out->reason,
                 "does not fit: with whole heads and blocks node %s needs %.1f GiB but has %.1f GiB usable "
                 "(short by %.2f GiB); give it less with --shard-weights or add memory",
                 cfg->nodes[worst].name, gb(out->nodes[worst].need_bytes), gb((uint64_t)usable[worst]),
                 gb(out->short_bytes));
    }
    if (n > 1) plan_comm(cfg, out);
    out->tg_tps = 1e3 / (out->compute_ms + out->comm_ms);
    return TP_OK;
}

/* ------------------------------------------- re-planning after a lost rank */

static double mib(uint64_t b) { return (double)b / 1048576.0; }

enum tp_status tp_parallel_replan_check(const struct tp_replan_input *in, struct tp_replan_result *out,
                                        struct tp_error *err)
{
    memset(out, 0, sizeof *out);
    if (!in || !in->hp || !in->types)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_parallel_replan_check: no model shape or weight types");
    const int world = in->world, n = world - 1;
    if (world < 2 || world > TP_PLAN_MAX_RANKS || in->drop < 1 || in->drop >= world)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "cannot drop rank %d of a group of %d (want 1..%d, 2..%d ranks)",
                            in->drop, world, world - 1, TP_PLAN_MAX_RANKS);
    const uint64_t kv_head = in->n_ctx > 0 && in->n_batch > 0 ? tp_kv_head_bytes(in->hp, in->n_ctx, in->n_batch, in->kv_type) : 0;
    if (in->n_ctx < 1 || in->n_seq < 1 || in->n_batch < 1 || kv_head == 0)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "invalid context settings (ctx %d, seq %d, batch %d, kv %s)",
                            in->n_ctx, in->n_seq, in->n_batch, tp_kv_type_name(in->kv_type));
    if (in->is_shard) {
        snprintf(out->reason, sizeof out->reason,
                 "the ranks load shard files cut for %d ranks, which cannot be re-planned (give every rank the whole "
                 "model file to allow --on-rank-loss replan)",
                 world);
        return TP_OK;
    }
    /* survivors in order: new rank i is old rank old_of[i] */
    int old_of[TP_PLAN_MAX_RANKS];
    double w[TP_PLAN_MAX_RANKS];
    for (int r = 0, i = 0; r < world; r++) {
        if (r == in->drop) continue;
        old_of[i] = r;
        w[i++] = in->weights ? in->weights[r] : 1.0;
    }
    struct tp_error perr = {0};
    if (tp_parallel_plan_moe(in->hp, in->types, n, in->weights ? w : NULL, in->moe_split, &out->plan, &perr) !=
        TP_OK) {
        memset(&out->plan, 0, sizeof out->plan);
        snprintf(out->reason, sizeof out->reason, "the model cannot be split over the %d surviving rank(s): %.400s", n,
                 perr.msg);
        return TP_OK;
    }
    for (int i = 0; i < n; i++) {
        const struct tp_shard_rank_plan *rp = &out->plan.ranks[i];
        const uint64_t kv =
            kv_head * (uint64_t)in->n_seq * (uint64_t)(rp->shard.kv_head_end - rp->shard.kv_head_begin);
        out->need_bytes[i] = rp->sharded_bytes + rp->replicated_bytes + kv;
    }
    /* each survivor's own offer */
    for (int i = 0; i < n; i++) {
        const struct tp_replan_rank *rk = &in->ranks[old_of[i]];
        uint64_t lim = rk->mem_limit_bytes;
        out->avail_bytes[i] = lim ? lim : UINT64_MAX;
        if (lim && out->need_bytes[i] > lim) {
            snprintf(out->reason, sizeof out->reason,
                     "rank %d would need %.1f MiB (weights and KV cache over %d ranks) but offers %.1f MiB "
                     "(--mem-limit): short by %.1f MiB",
                     old_of[i], mib(out->need_bytes[i]), n, mib(lim), mib(out->need_bytes[i] - lim));
            return TP_OK;
        }
    }
    /* machines: survivors with the same host name and memory share it */
    const struct tp_cap_config defaults = tp_capacity_default_config();
    for (int i = 0; i < n; i++) {
        const struct tp_replan_rank *a = &in->ranks[old_of[i]];
        if (!a->mem_total_bytes) continue;
        int first = 1, n_here = 0;
        uint64_t need = 0;
        for (int j = 0; j < n; j++) {
            const struct tp_replan_rank *b = &in->ranks[old_of[j]];
            if (b->mem_total_bytes != a->mem_total_bytes || strncmp(a->host, b->host, sizeof a->host) != 0) continue;
            if (j < i) first = 0;
            need += out->need_bytes[j];
            n_here++;
        }
        const double mem = (double)a->mem_total_bytes;
        const double usable = fmax(0.0, mem - fmax((double)defaults.reserve_min_bytes, defaults.reserve_frac * mem));
        const uint64_t share = (uint64_t)(usable / n_here);
        if (share < out->avail_bytes[i]) out->avail_bytes[i] = share;
        if (first && (double)need > usable) {
            char host[sizeof a->host + 1];
            snprintf(host, sizeof host, "%.*s", (int)sizeof a->host, a->host);
            snprintf(out->reason, sizeof out->reason,
                     "the %d surviving rank(s) on host '%s' would need %.1f MiB together but it has %.1f MiB usable "
                     "(%.1f MiB less a reserve of max(12.5%%, 2 GiB)): short by %.1f MiB",
                     n_here, host, mib(need), mib((uint64_t)usable), mib(a->mem_total_bytes),
                     mib(need - (uint64_t)usable));
            return TP_OK;
        }
    }
    out->fits = 1;
    size_t len = (size_t)snprintf(out->reason, sizeof out->reason, "%d rank(s) hold the model without rank %d:", n,
                                  in->drop);
    for (int i = 0; i < n && len < sizeof out->reason; i++)
        len += (size_t)snprintf(out->reason + len, sizeof out->reason - len, "%s rank %d -> %d needs %.1f MiB",
                                i ? "," : "", old_of[i], i, mib(out->need_bytes[i]));
    return TP_OK;
}

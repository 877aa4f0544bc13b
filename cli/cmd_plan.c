/*
 * cli/cmd_plan.c - `tpserve plan`: will this model fit on these machines,
 * with which shard weights, how much memory per node, and how fast will it
 * decode?  The arithmetic is tp_capacity_plan() (parallel/capacity.c); this
 * file gets the model shape (a GGUF file's metadata, or a named shape from
 * configs/shapes.json), parses the node list and prints the answer as a
 * table or JSON.  Exit status 0 when the plan fits, 1 when it does not (the
 * reason and the shortfall are printed), 2 for a usage error.
 */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/synth.h"
#include "parallel/parallel.h"
#include "parallel/probe.h"

static const char plan_usage[] =
    "Usage: tpserve plan (-m MODEL.gguf | --shape NAME) --nodes \"mac1:192G,mac2:128G,mac3:64G\" [options]\n"
    "\n"
    "Whether a model fits on a set of machines, the shard weights to serve it with (uneven machines get\n"
    "uneven shards, rounded to whole heads and quantization blocks exactly as `tpserve serve` splits),\n"
    "memory per node, and projected decode tokens/s.  Exit status 1 when it does not fit.\n"
    "\n"
    "Nodes: [NAME:]MEMORY[:BANDWIDTH], comma separated.  MEMORY in K/M/G/T (binary: 192G = 192 GiB).\n"
    "BANDWIDTH in GB/s or a machine class (m2-ultra, m4-max, m4-pro, ddr5-2ch, ...); default --mem-bw.\n"
    "Links (--link): local, tb5 (Thunderbolt 5 bridge), tb4, 10gbe, 25gbe, 1gbe, roce100; or a measured all_sum\n"
    "time (--comm-json from `tpserve bench comm --decode N_EMBD --json`, or --allsum-us) on the hosts themselves.\n"
    "Shapes (--shape): the names in configs/shapes.json (e.g. llama3-70b, qwen2.5-72b, tinyllama-1.1b).";

/* Text of a whole file (malloc'd, NUL-terminated) or NULL. */
static char *read_text(const char *path)
{
    char *buf = NULL;
    struct tp_error err = {0};
    return tp_read_file(path, (size_t)64 << 20, &buf, NULL, &err) == TP_OK ? buf : NULL;
}

/* A `bench comm --json` line's time per call: with --sync the mean time once every rank is in the call
 * (sync_lat_us_mean: a token pays every call, slow ones included; sync_lat_us_median from an older
 * bench comm), else the median per-rank time; 0 when it has none. */
static double line_us(const cJSON *o)
{
    static const char *const keys[] = {"sync_lat_us_mean", "sync_lat_us_median", "lat_us_median"};
    for (size_t i = 0; i < TP_ARRAY_LEN(keys); i++) {
        const cJSON *lat = cJSON_GetObjectItem(o, keys[i]);
        if (cJSON_IsNumber(lat) && lat->valuedouble > 0) return lat->valuedouble;
    }
    return 0.0;
}

/*
 * From `tpserve bench comm --json` lines for this many ranks: c->allsum_us,
 * the time of the all_sum line nearest the size of one decode all_sum (n_embd
 * values in the wire dtype; q8 sends an all_gather and has no all_sum line to
 * take), none within 2x of it being an error naming the command that measures
 * it; and, from `bench comm --decode` lines, c->header_us and c->gather_us, the
 * step header broadcast and the argmax gather ("what": "step header", "argmax
 * gather"), left 0 (the link model) when the file has none.
 */
static int comm_json_times(const char *path, struct tp_cap_config *c)
{
    char *text = read_text(path);
    if (!text) {
        fprintf(stderr, "tpserve plan: cannot read --comm-json file '%s'\n", path);
        return -1;
    }
    if (c->wire_dtype == TP_WIRE_Q8) {
        free(text);
        fprintf(stderr, "tpserve plan: --comm-json holds all_sum times; q8 activations travel by all_gather "
                        "(use --allsum-us with a measured time instead)\n");
        return -1;
    }
    const double want = (double)c->hp.n_embd * (c->wire_dtype == TP_WIRE_F32 ? 4.0 : 2.0);
    double best = 0, best_bytes = 0;
    int n_lines = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *brace = strchr(line, '{'); /* tolerate a "[rank 0] " prefix from tpserve launch */
        cJSON *o = brace ? cJSON_Parse(brace) : NULL;
        if (!o) continue;
        const cJSON *op = cJSON_GetObjectItem(o, "op"), *rk = cJSON_GetObjectItem(o, "ranks");
        const cJSON *by = cJSON_GetObjectItem(o, "bytes"), *what = cJSON_GetObjectItem(o, "what");
        const double us = line_us(o);
        const int mine = cJSON_IsNumber(rk) && rk->valueint == c->n_nodes && us > 0;
        if (mine && cJSON_IsString(what) && strcmp(what->valuestring, "step header") == 0) c->header_us = us;
        if (mine && cJSON_IsString(what) && strcmp(what->valuestring, "argmax gather") == 0) c->gather_us = us;
        if (mine && cJSON_IsString(op) && strcmp(op->valuestring, "all_sum") == 0 && cJSON_IsNumber(by)) {
            n_lines++;
            if (!best_bytes || fabs(log(by->valuedouble / want)) < fabs(log(best_bytes / want))) {
                best_bytes = by->valuedouble;
                best = us;
            }
        }
        cJSON_Delete(o);
    }
    free(text);
    if (!n_lines) {
        fprintf(stderr,
                "tpserve plan: --comm-json '%s' has no all_sum line for %d ranks (run `tpserve launch -n %d -- "
                "tpserve bench comm --decode %d --sync --json` on the same hosts)\n",
                path, c->n_nodes, c->n_nodes, c->hp.n_embd);
        return -1;
    }
    if (best_bytes > 2 * want || best_bytes < want / 2) {
        fprintf(stderr,
                "tpserve plan: --comm-json '%s': the nearest all_sum size is %.0f bytes, the decode all_sum is %.0f "
                "(measure with `bench comm --decode %d`)\n",
                path, best_bytes, want, c->hp.n_embd);
        return -1;
    }
    c->allsum_us = best;
    return 0;
}

static void hp_from_shape(const struct tp_shape *s, struct tp_hparams *hp)
{
    memset(hp, 0, sizeof *hp);
    hp->arch = s->arch;
    hp->n_vocab = s->n_vocab;
    hp->n_embd = s->n_embd;
    hp->n_layer = s->n_layer;
    hp->n_head = s->n_head;
    hp->n_head_kv = s->n_head_kv;
    hp->head_dim = s->head_dim > 0 ? s->head_dim : s->n_embd / s->n_head;
    hp->n_ff = tp_shape_ff_width(s); /* mixture of experts: the experts' width */
    hp->n_expert = s->n_expert;
    hp->n_expert_used = s->n_expert_used;
    hp->expert_weights_norm = s->n_expert > 0 && s->arch != TP_ARCH_QWEN2MOE;
    hp->n_ff_shexp = s->n_ff_shexp;
    hp->n_ctx_train = s->n_ctx;
    hp->rope_dim = hp->head_dim;
    hp->rope_theta = s->rope_theta;
    hp->norm_eps = s->norm_eps;
    hp->tied_embeddings = s->tied;
    hp->has_qkv_bias = s->qkv_bias;
    hp->has_qk_norm = s->qk_norm;
    hp->sliding_window = s->sliding_window;
    if (s->arch == TP_ARCH_GPTOSS) { /* as model_load.c reads a gpt-oss GGUF */
        hp->router_softmax_topk = 1;
        hp->expert_weights_norm = 0;
        hp->swiglu_alpha = 1.702f;
        hp->swiglu_limit = 7.0f;
        hp->swa_period = 2;
    }
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

static void print_json(const char *model, const struct tp_cap_config *c, const struct tp_cap_result *r,
                       const struct tp_draft_place_result *dr)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "type", tp_wtype_name(c->wtype));
    cJSON_AddNumberToObject(o, "n_layer", c->hp.n_layer);
    cJSON_AddNumberToObject(o, "n_embd", c->hp.n_embd);
    cJSON_AddStringToObject(o, "link", c->link.name);
    cJSON_AddNumberToObject(o, "n_ctx", c->n_ctx);
    cJSON_AddNumberToObject(o, "n_seq", c->n_seq);
    cJSON_AddBoolToObject(o, "fits", r->fits);
    cJSON_AddNumberToObject(o, "max_ctx", r->max_ctx);
    if (!r->fits) {
        cJSON_AddStringToObject(o, "reason", r->reason);
        cJSON_AddNumberToObject(o, "short_bytes", (double)r->short_bytes);
    }
    cJSON_AddNumberToObject(o, "need_bytes", (double)r->need_bytes);
    cJSON_AddNumberToObject(o, "usable_bytes", (double)r->usable_bytes);
    if (r->plan.world_size > 0) {
        cJSON_AddStringToObject(o, "shard_weights", r->shard_weights);
        cJSON_AddNumberToObject(o, "compute_ms", r->compute_ms);
        cJSON_AddNumberToObject(o, "comm_ms", r->comm_ms);
        cJSON_AddNumberToObject(o, "projected_tg_tps", r->tg_tps);
        cJSON_AddNumberToObject(o, "wire_bytes_per_token", (double)r->wire_bytes_per_token);
        cJSON_AddNumberToObject(o, "comm_rounds_per_token", r->comm_rounds_per_token);
        cJSON_AddStringToObject(o, "comm_dtype", tp_wire_dtype_name(c->wire_dtype));
        if (c->allsum_us > 0) cJSON_AddNumberToObject(o, "allsum_us_measured", c->allsum_us);
        if (c->header_us > 0) cJSON_AddNumberToObject(o, "header_us_measured", c->header_us);
        if (c->gather_us > 0) cJSON_AddNumberToObject(o, "gather_us_measured", c->gather_us);
    }
    cJSON *d = dr ? cJSON_AddObjectToObject(o, "draft") : NULL;
    if (d) {
        cJSON_AddStringToObject(d, "placement", tp_draft_placement_name(dr->placement));
        cJSON_AddNumberToObject(d, "rank0_ms", dr->rank0_ms);
        cJSON_AddNumberToObject(d, "sharded_ms", dr->sharded_ms);
        cJSON_AddNumberToObject(d, "sharded_comm_ms", dr->sharded_comm_ms);
        cJSON_AddNumberToObject(d, "collectives_per_token", dr->collectives);
        cJSON_AddNumberToObject(d, "allsum_us", dr->allsum_us);
        cJSON_AddNumberToObject(d, "rank0_read_bytes", (double)dr->rank0_read_bytes);
        cJSON_AddNumberToObject(d, "rank_read_bytes_max", (double)dr->rank_read_bytes_max);
        cJSON_AddStringToObject(d, "reason", dr->reason);
    }
    cJSON *arr = cJSON_AddArrayToObject(o, "nodes");
    for (int i = 0; i < c->n_nodes; i++) {
        const struct tp_cap_node_result *n = &r->nodes[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", c->nodes[i].name);
        cJSON_AddNumberToObject(e, "mem_bytes", (double)c->nodes[i].mem_bytes);
        cJSON_AddNumberToObject(e, "mem_bw_gbs", c->nodes[i].mem_bw_gbs);
        cJSON_AddNumberToObject(e, "usable_bytes", (double)n->usable_bytes);
        if (r->plan.world_size > 0) {
            cJSON_AddNumberToObject(e, "share", n->share);
            cJSON_AddNumberToObject(e, "q_heads", n->n_q_heads);
            cJSON_AddNumberToObject(e, "kv_heads", n->n_kv_heads);
            cJSON_AddNumberToObject(e, "ffn_cols", n->n_ff);
            cJSON_AddNumberToObject(e, "weight_bytes", (double)n->weight_bytes);
            cJSON_AddNumberToObject(e, "kv_bytes", (double)n->kv_bytes);
            cJSON_AddNumberToObject(e, "overhead_bytes", (double)n->overhead_bytes);
            cJSON_AddNumberToObject(e, "need_bytes", (double)n->need_bytes);
            cJSON_AddNumberToObject(e, "compute_ms", n->compute_ms);
            cJSON_AddNumberToObject(e, "read_bytes_per_token", (double)n->read_bytes_per_token);
            cJSON_AddNumberToObject(e, "wire_bytes_per_token", (double)n->wire_bytes_per_token);
        }
        cJSON_AddItemToArray(arr, e);
    }
    char *s = cJSON_Print(o);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
}

static void print_table(const char *model, const struct tp_cap_config *c, const struct tp_cap_result *r)
{
    printf("Plan: %s (%s) on %d node%s over %s (%.0f Gbit/s, %.0f us), context %d x %d sequence%s, %s KV cache\n",
           model, tp_wtype_name(c->wtype), c->n_nodes, c->n_nodes == 1 ? "" : "s", c->link.name, c->link.gbit,
           c->link.latency_us, c->n_ctx, c->n_seq, c->n_seq == 1 ? "" : "s", tp_kv_type_name(c->kv_type));
    printf("Needs %.1f GiB in all; the nodes have %.1f GiB usable (memory minus max(%.1f%%, %.1f GiB) for the OS)\n",
           gib(r->need_bytes), gib(r->usable_bytes), c->reserve_frac * 100, gib(c->reserve_min_bytes));
    int n_win = 0;
    int64_t win_pos = 0; /* KV counted layer by layer: a windowed layer holds its ring, not the context */
    for (int l = 0; l < c->hp.n_layer; l++)
        if (tp_kv_layer_window(&c->hp, l) > 0) {
            n_win++;
            win_pos = tp_kv_layer_positions(&c->hp, l, c->n_ctx, c->n_batch);
        }
    if (n_win > 0)
        printf("KV cache: %d sliding-window layer%s x %lld positions (window %d + batch %d) + %d full layer%s x %d "
               "positions, %.1f MiB per KV head and sequence\n",
               n_win, n_win == 1 ? "" : "s", (long long)win_pos, c->hp.sliding_window, c->n_batch, c->hp.n_layer - n_win,
               c->hp.n_layer - n_win == 1 ? "" : "s", c->n_ctx,
               (double)tp_kv_head_bytes(&c->hp, c->n_ctx, c->n_batch, c->kv_type) / 1048576.0);
    printf("\n");
    int planned = r->plan.world_size > 0;
    printf("%-12s %8s %8s %6s %7s %7s %8s %8s %7s %8s %8s %9s\n", "node", "mem GiB", "usable", "share", "q/kv",
           "ffn", "weights", "kv", "runtime", "total", "free", "ms/token");
    for (int i = 0; i < c->n_nodes; i++) {
        const struct tp_cap_node_result *n = &r->nodes[i];
        printf("%-12s %8.1f %8.1f", c->nodes[i].name, gib(c->nodes[i].mem_bytes), gib(n->usable_bytes));
        if (planned) {
            char heads[24];
            snprintf(heads, sizeof heads, "%d/%d", n->n_q_heads, n->n_kv_heads);
            double free_gib = gib(n->usable_bytes) - gib(n->need_bytes);
            printf(" %6.3f %7s %7d %8.1f %8.2f %7.2f %8.1f %8.1f %9.1f", n->share, heads, n->n_ff,
                   gib(n->weight_bytes), gib(n->kv_bytes), gib(n->overhead_bytes), gib(n->need_bytes), free_gib,
                   n->compute_ms);
        }
        printf("\n");
    }
    printf("\n");
    if (planned) {
        printf("Projected decode, one sequence: %.1f tokens/s = %.1f ms compute (slowest node) + %.1f ms "
               "communication per token\n",
               r->tg_tps, r->compute_ms, r->comm_ms);
        if (c->n_nodes > 1) {
            printf("  communication: step header + 2 x %d all_sums of %d %s values + argmax gather, %d network "
                   "rounds and %.0f bytes sent by rank 0 per token",
                   c->hp.n_layer, c->hp.n_embd, tp_wire_dtype_name(c->wire_dtype), r->comm_rounds_per_token,
                   (double)r->wire_bytes_per_token);
            if (c->allsum_us > 0) printf(" (all_sum measured: %.1f us", c->allsum_us);
            if (c->allsum_us > 0 && c->header_us > 0 && c->gather_us > 0)
                printf(", header %.1f us, gather %.1f us", c->header_us, c->gather_us);
            if (c->allsum_us > 0) printf(")");
            printf("\n");
        }
        printf("  model: bytes read per token / (bandwidth x %.2f) + the collectives comm/ runs (latency rounds "
               "and bytes on the link); measure with `tpserve bench gen` under `tpserve launch`\n",
               c->bw_efficiency);
        if (c->hp.n_expert > 0)
            printf("  mixture of experts: a token reads the routers and %d of %d experts (active bytes, not the "
                   "whole model)\n  plan: %s\n",
                   c->hp.n_expert_used, c->hp.n_expert, r->plan.note);
    }
    if (r->max_ctx > 0)
        printf("Longest context that fits: %d positions x %d sequence%s (%s KV cache; trained for %d)\n", r->max_ctx,
               c->n_seq, c->n_seq == 1 ? "" : "s", tp_kv_type_name(c->kv_type), c->hp.n_ctx_train);
    if (r->fits) {
        printf("Fits. Serve it with: --shard-weights %s  (rank i on node i, in this order)\n", r->shard_weights);
    } else {
        printf("Refused: %s\n", r->reason);
    }
}

/* The command line of `tpserve plan`. */
struct plan_opts {
    const char *model, *shape_name, *shapes_file, *nodes, *type, *link, *kv, *moe_split, *comm_dtype, *comm_json;
    const char *draft_model, *draft_shape, *draft_placement;
    int n_ctx, n_seq, json;
    float mem_bw, reserve, eff, allsum_us;
};

/* argv into o: 0 to go on, 1 after --help, 2 after a usage error (printed). */
static int plan_parse(int argc, char **argv, struct plan_opts *o)
{
    *o = (struct plan_opts){.link = "local", .kv = "auto", .moe_split = "auto", .comm_dtype = "f32", .n_seq = 1,
                            .draft_placement = "auto",
                            .mem_bw = 100.0f, .reserve = 0.125f, .eff = 0.7f};
    const struct tp_opt opts[] = {
        {"model", 'm', TP_OPT_STRING, &o->model, "FILE", "GGUF model (its metadata gives the shape and type)", 0, 0},
        {"shape", 0, TP_OPT_STRING, &o->shape_name, "NAME", "a named shape from configs/shapes.json instead", 0, 0},
        {"shapes", 0, TP_OPT_STRING, &o->shapes_file, "FILE", "shapes JSON to look NAME up in (default: built in)",
         0, 0},
        {"type", 't', TP_OPT_STRING, &o->type, "TYPE",
         "weight type: q4_0, q8_0, q4_k, mxfp4, f16, ... (default q4_0; mxfp4 for a gpt-oss shape)", 0, 0},
        {"nodes", 0, TP_OPT_LIST, &o->nodes, "LIST", "machines: [NAME:]MEM[:BW],... (required)", 0, 0},
        {"link", 0, TP_OPT_STRING, &o->link, "PROFILE", "interconnect profile (default local)", 0, 0},
        {"moe-split", 0, TP_OPT_STRING, &o->moe_split, "S", TP_CLI_MOE_SPLIT_HELP, 0, 0},
        {"ctx", 'c', TP_OPT_INT, &o->n_ctx, "N", "context per sequence (default min(trained, 4096))", 1, 1 << 24},
        {"ctx-size", 0, TP_OPT_INT, &o->n_ctx, "N", "same as --ctx (the name `tpserve serve` uses)", 1, 1 << 24},
        {"seq", 0, TP_OPT_INT, &o->n_seq, "N", "sequences held at once (default 1)", 1, 4096},
        {"kv-type", 0, TP_OPT_STRING, &o->kv, "T", "KV cache type: f16 (default), q8_0 or f32", 0, 0},
        {"mem-bw", 0, TP_OPT_FLOAT, &o->mem_bw, "GB/s", "bandwidth of nodes given without one (default 100)", 1,
         100000},
        {"reserve", 0, TP_OPT_FLOAT, &o->reserve, "FRAC", "memory left to the OS (default 0.125, at least 2 GiB)", 0,
         0.9},
        {"efficiency", 0, TP_OPT_FLOAT, &o->eff, "FRAC", "fraction of peak bandwidth decode attains (default 0.7)",
         0.01, 1},
        {"comm-dtype", 0, TP_OPT_STRING, &o->comm_dtype, "T", "activations on the wire: f32 (default), f16, bf16, q8",
         0, 0},
        {"allsum-us", 0, TP_OPT_FLOAT, &o->allsum_us, "US",
         "measured time of one decode all_sum on these hosts (replaces the link model)", 0.001f, 1e9f},
        {"comm-json", 0, TP_OPT_STRING, &o->comm_json, "FILE",
         "`tpserve bench comm --json` output from these hosts: its all_sum time at the decode size and rank count "
         "replaces the link model",
         0, 0},
        {"draft-model", 0, TP_OPT_STRING, &o->draft_model, "FILE",
         "a draft model for speculative decoding: whether it runs on rank 0 or sharded over the nodes, and why", 0, 0},
        {"draft-shape", 0, TP_OPT_STRING, &o->draft_shape, "NAME",
         "the same for a named shape as the draft (configs/shapes.json; --type's weights), e.g. llama3.1-8b", 0, 0},
        {"draft-placement", 0, TP_OPT_STRING, &o->draft_placement, "P",
         "with --draft-model: auto (default), rank0 or sharded (the costs of the one asked)", 0, 0},
        {"json", 0, TP_OPT_FLAG, &o->json, NULL, "print JSON instead of a table", 0, 0},
        {0},
    };
    int rc = tp_cli_parse("plan", plan_usage, opts, argc, argv, NULL, 0, NULL, NULL, NULL);
    if (rc) return rc;
    if (!o->model == !o->shape_name) {
        fprintf(stderr, "tpserve plan: give exactly one of -m MODEL.gguf or --shape NAME (see 'tpserve plan --help')\n");
        return 2;
    }
    if (!o->nodes) {
        fprintf(stderr, "tpserve plan: --nodes is required, e.g. --nodes \"mac1:192G,mac2:128G\"\n");
        return 2;
    }
    return 0;
}

/* The options into cfg (all but the model's shape): 0, or the exit status after an error (printed). */
static int plan_config(const struct plan_opts *o, struct tp_cap_config *cfg)
{
    *cfg = tp_capacity_default_config();
    struct tp_error err = {0};
    if (tp_moe_split_parse(o->moe_split, &cfg->moe_split, &err) != TP_OK) return tp_cli_fail("plan", "%s", err.msg);
    cfg->n_seq = o->n_seq;
    cfg->reserve_frac = o->reserve;
    cfg->bw_efficiency = o->eff;
    if (tp_kv_type_parse(o->kv, &cfg->kv_type) != TP_OK) {
        fprintf(stderr, "tpserve plan: --kv-type must be auto, f16, bf16, q8_0 or f32, got '%s'\n", o->kv);
        return 2;
    }
    if (tp_capacity_link_profile(o->link, &cfg->link, &err) != TP_OK) {
        fprintf(stderr, "tpserve plan: --link: %s\n", err.msg);
        return 2;
    }
    if (tp_capacity_parse_nodes(o->nodes, o->mem_bw, cfg->nodes, TP_CAP_MAX_NODES, &cfg->n_nodes, &err) != TP_OK) {
        fprintf(stderr, "tpserve plan: --nodes: %s\n", err.msg);
        return 2;
    }
    if (tp_wire_dtype_parse(o->comm_dtype, &cfg->wire_dtype) != TP_OK) {
        fprintf(stderr, "tpserve plan: --comm-dtype must be f32, f16, bf16 or q8, got '%s'\n", o->comm_dtype);
        return 2;
    }
    if (o->allsum_us > 0 && o->comm_json) {
        fprintf(stderr, "tpserve plan: give --allsum-us or --comm-json, not both\n");
        return 2;
    }
    cfg->allsum_us = o->allsum_us;
    if (o->type && tp_wtype_parse(o->type, &cfg->wtype) != TP_OK) {
        fprintf(stderr, "tpserve plan: unknown --type '%s' (e.g. q4_0, q8_0, q4_k, q6_k, f16, bf16, f32)\n", o->type);
        return 2;
    }
    return 0;
}

/* The shape (--shape, or the model file's metadata) and, unless --type, the weight type into cfg; the
 * model's name into label.  0, 1 after a failure or 2 after a usage error (printed). */
static int plan_model(const struct plan_opts *o, struct tp_cap_config *cfg, char *label, size_t cap)
{
    struct tp_error err = {0};
    if (o->shape_name) {
        char *text = NULL;
        if (o->shapes_file && !(text = read_text(o->shapes_file)))
            return tp_cli_fail("plan", "cannot read --shapes file '%s'", o->shapes_file);
        struct tp_shape shape;
        enum tp_status st = tp_shape_find(text, o->shape_name, &shape, &err);
        free(text);
        if (st != TP_OK) {
            fprintf(stderr, "tpserve plan: --shape: %s\n", err.msg);
            return 2;
        }
        hp_from_shape(&shape, &cfg->hp);
        if (!o->type && shape.arch == TP_ARCH_GPTOSS) cfg->wtype = TP_WTYPE_MXFP4; /* its published experts */
        snprintf(label, cap, "%s", shape.name);
        return 0;
    }
    struct tp_model_config mc = tp_model_default_config();
    mc.path = o->model;
    mc.vocab_only = 1;
    tp_model_t *m = NULL;
    if (tp_model_init(&mc, &m, &err) != TP_OK) return tp_cli_fail("plan", "%s", err.msg);
    cfg->hp = *tp_model_hparams(m);
    if (!o->type) { /* a vocab-only load does not read the tensors: the probe names their types */
        struct tp_model_probe pr;
        if (tp_model_probe(o->model, &pr, &err) != TP_OK) {
            tp_model_free(m);
            return tp_cli_fail("plan", "%s", err.msg);
        }
        cfg->wtype = pr.types.ffn_gate;
    }
    snprintf(label, cap, "%s", tp_model_name(m));
    tp_model_free(m);
    return 0;
}

/*
 * --draft-model: where the draft runs (tp_parallel_draft_placement) on these nodes, with the plan's shard
 * weights, each node's bandwidth x --efficiency and the time of one of the draft's collectives (the link
 * model or the measured all_sum, as for the model: its decode collectives' time / their number).
 * 0, or the exit status after an error (printed).
 */
static int plan_draft(const struct plan_opts *o, const struct tp_cap_config *cfg, const struct tp_cap_result *res,
                      struct tp_draft_place_result *out)
{
    struct tp_error err = {0};
    enum tp_draft_placement asked;
    if (tp_draft_placement_parse(o->draft_placement, &asked, &err) != TP_OK) {
        fprintf(stderr, "tpserve plan: %s\n", err.msg);
        return 2;
    }
    static struct tp_model_probe pr;
    memset(&pr, 0, sizeof pr);
    const char *name = o->draft_model ? o->draft_model : o->draft_shape;
    if (o->draft_shape) {
        char *text = NULL;
        if (o->shapes_file && !(text = read_text(o->shapes_file)))
            return tp_cli_fail("plan", "cannot read --shapes file '%s'", o->shapes_file);
        struct tp_shape shape;
        enum tp_status st = tp_shape_find(text, o->draft_shape, &shape, &err);
        free(text);
        if (st != TP_OK) {
            fprintf(stderr, "tpserve plan: --draft-shape: %s\n", err.msg);
            return 2;
        }
        hp_from_shape(&shape, &pr.hp);
        pr.types = tp_plan_types_uniform(cfg->wtype);
    } else if (tp_model_probe(o->draft_model, &pr, &err) != TP_OK) {
        return tp_cli_fail("plan", "--draft-model: %s", err.msg);
    }
    if (pr.hp.n_vocab != cfg->hp.n_vocab)
        return tp_cli_fail("plan", "draft %s has %d tokens in its vocabulary, the model %d: a draft model must "
                           "share the model's vocabulary", name, pr.hp.n_vocab, cfg->hp.n_vocab);
    double bw[TP_CAP_MAX_NODES], w[TP_CAP_MAX_NODES];
    for (int i = 0; i < cfg->n_nodes; i++) bw[i] = cfg->nodes[i].mem_bw_gbs * cfg->bw_efficiency;
    const double *wp = NULL;
    if (res->plan.world_size > 1 && tp_parallel_parse_weights(res->shard_weights, cfg->n_nodes, w, NULL) == TP_OK) wp = w;
    double us = 0.0;
    if (cfg->n_nodes > 1)
        us = tp_capacity_comm_ms(&pr.hp, cfg->wire_dtype, cfg->n_nodes, &cfg->link, cfg->allsum_us, NULL) * 1e3 /
             (2.0 * pr.hp.n_layer + 2.0);
    struct tp_draft_place_input in = {&pr.hp, &pr.types, cfg->n_nodes, wp, asked, bw, us};
    if (tp_parallel_draft_placement(&in, out, &err) != TP_OK) return tp_cli_fail("plan", "%s", err.msg);
    return 0;
}

int tp_cmd_plan(int argc, char **argv)
{
    struct plan_opts o;
    int rc = plan_parse(argc, argv, &o);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    static struct tp_cap_config cfg;
    static struct tp_cap_result res;
    char label[128];
    if ((rc = plan_config(&o, &cfg)) != 0 || (rc = plan_model(&o, &cfg, label, sizeof label)) != 0) return rc;
    if (o.comm_json && cfg.n_nodes > 1 && comm_json_times(o.comm_json, &cfg) != 0) return 2;
    cfg.n_ctx = o.n_ctx > 0                                            ? o.n_ctx
                : cfg.hp.n_ctx_train > 0 && cfg.hp.n_ctx_train < 4096 ? cfg.hp.n_ctx_train
                                                                      : 4096;
    struct tp_error err = {0};
    if (tp_capacity_plan(&cfg, &res, &err) != TP_OK) return tp_cli_fail("plan", "%s", err.msg);
    struct tp_draft_place_result dr;
    const char *draft = o.draft_model ? o.draft_model : o.draft_shape;
    if (o.draft_model && o.draft_shape) {
        fprintf(stderr, "tpserve plan: give --draft-model or --draft-shape, not both\n");
        return 2;
    }
    if (draft && (rc = plan_draft(&o, &cfg, &res, &dr)) != 0) return rc;
    if (o.json) print_json(label, &cfg, &res, draft ? &dr : NULL);
    else print_table(label, &cfg, &res);
    if (draft && !o.json) printf("Draft model %s: %s\n", draft, dr.reason);
    return res.fits ? 0 : 1;
}

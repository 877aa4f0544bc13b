/*
 * tests/ops/test_capacity.c - the capacity planner (parallel/capacity.c).
 *
 * Oracles are computed here independently of the planner: Q4_0 weight bytes
 * of a Llama-3-70B shape counted tensor by tensor (18 bytes per 32 weights,
 * f32 norms), the KV cache from its definition, the reserve rule, and the
 * bytes the engine's decode collectives send.  The 192G/128G/64G case must
 * fit with shard weights 3,2,1 (memory proportional) and FFN/KV splits in
 * that ratio up to whole units; the 16G/16G case must be refused with the
 * shortfall to the byte (within rounding of doubles).  The re-plan check
 * (tp_parallel_replan_check) is held to the same oracles: each of two equal
 * survivors of the 70B model needs half the split part + the replicated part
 * + its KV cache, exactly, and the machine rule flips at 7/8 of memory.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "parallel/parallel.h"
#include "tp_test.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static struct tp_hparams llama70b(void)
{
    struct tp_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.arch = TP_ARCH_LLAMA;
    hp.n_vocab = 128256;
    hp.n_embd = 8192;
    hp.n_layer = 80;
    hp.n_head = 64;
    hp.n_head_kv = 8;
    hp.head_dim = 128;
    hp.n_ff = 28672;
    hp.n_ctx_train = 8192;
    hp.rope_dim = 128;
    hp.rope_theta = 500000.0f;
    hp.norm_eps = 1e-5f;
    return hp;
}

/* Q4_0 bytes of the whole model and of the part every rank keeps (embeddings + norms). */
static void llama70b_q4_0_bytes(double *total, double *replicated)
{
    const double E = 8192, KV = 8 * 128, F = 28672, V = 128256, L = 80, q = 18.0 / 32.0;
    double layer = (E * E + E * KV + E * KV + E * E + 3 * E * F) * q + 2 * E * 4;
    double embd = V * E * q, out = V * E * q, final_norm = E * 4;
    *total = L * layer + embd + out + final_norm;
    *replicated = embd + L * 2 * E * 4 + final_norm;
}

static struct tp_cap_config cfg_for(const char *nodes, const char *link)
{
    struct tp_cap_config c = tp_capacity_default_config();
    struct tp_error err = {0};
    c.hp = llama70b();
    c.wtype = TP_WTYPE_Q4_0;
    CU_ASSERT_EQUAL_FATAL(tp_capacity_parse_nodes(nodes, 100.0, c.nodes, TP_CAP_MAX_NODES, &c.n_nodes, &err), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_capacity_link_profile(link, &c.link, &err), TP_OK);
    return c;
}

static void test_fits_uneven(void)
{
    struct tp_cap_config c = cfg_for("mac1:192G:m2-ultra,mac2:128G:m4-max,mac3:64G:m4-pro", "tb5");
    static struct tp_cap_result r;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_capacity_plan(&c, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 1);
    CU_ASSERT_STRING_EQUAL(r.shard_weights, "3,2,1");
    CU_ASSERT_EQUAL(r.plan.world_size, 3);

    double total, repl;
    llama70b_q4_0_bytes(&total, &repl);
    CU_ASSERT(fabs((double)r.plan.total_bytes - total) < 1.0);

    /* shares exactly 3:2:1; FFN split in 32-column blocks in that ratio (896 blocks -> 448, 299, 149) */
    CU_ASSERT(fabs(r.nodes[0].share - 0.5) < 1e-9);
    CU_ASSERT(fabs(r.nodes[1].share - 1.0 / 3) < 1e-9);
    CU_ASSERT(fabs(r.nodes[2].share - 1.0 / 6) < 1e-9);
    CU_ASSERT_EQUAL(r.nodes[0].n_ff, 448 * 32);
    CU_ASSERT_EQUAL(r.nodes[1].n_ff, 299 * 32);
    CU_ASSERT_EQUAL(r.nodes[2].n_ff, 149 * 32);
    /* 8 KV groups of 8 Q heads: 3:2:1 of 8 by largest remainder = 4, 3, 1 */
    CU_ASSERT_EQUAL(r.nodes[0].n_kv_heads, 4);
    CU_ASSERT_EQUAL(r.nodes[1].n_kv_heads, 3);
    CU_ASSERT_EQUAL(r.nodes[2].n_kv_heads, 1);
    CU_ASSERT_EQUAL(r.nodes[0].n_q_heads + r.nodes[1].n_q_heads + r.nodes[2].n_q_heads, 64);

    /* memory per node: weights add up to one copy + two extra replicated parts; KV by heads */
    double sum_w = 0;
    const double kv_head = 4096.0 * 80 * 2 * 128 * 2; /* ctx * layers * (k,v) * head_dim * f16 */
    for (int i = 0; i < 3; i++) {
        sum_w += (double)r.nodes[i].weight_bytes;
        CU_ASSERT(fabs((double)r.nodes[i].kv_bytes - kv_head * r.nodes[i].n_kv_heads) < 1.0);
        CU_ASSERT(r.nodes[i].need_bytes <= r.nodes[i].usable_bytes);
        CU_ASSERT_EQUAL(r.nodes[i].need_bytes,
                        r.nodes[i].weight_bytes + r.nodes[i].kv_bytes + r.nodes[i].overhead_bytes);
    }
    CU_ASSERT(fabs(sum_w - (total + 2 * repl)) < 4.0);
    /* usable = mem - max(2 GiB, 12.5%) */
    CU_ASSERT_EQUAL(r.nodes[0].usable_bytes, (uint64_t)(192 * GIB * 0.875));
    CU_ASSERT_EQUAL(r.nodes[2].usable_bytes, (uint64_t)(64 * GIB * 0.875));
    /* bigger machines hold more: weights in the order of memory, within 10% of 3:2:1 */
    double w0 = (double)r.nodes[0].weight_bytes, w1 = (double)r.nodes[1].weight_bytes,
           w2 = (double)r.nodes[2].weight_bytes;
    CU_ASSERT(w0 > w1 && w1 > w2);
    CU_ASSERT(fabs(w0 / w2 / 3.0 - 1.0) < 0.10);
    CU_ASSERT(fabs(w1 / w2 / 2.0 - 1.0) < 0.10);

    CU_ASSERT(r.compute_ms > 0 && r.comm_ms > 0);
    CU_ASSERT(fabs(r.tg_tps - 1e3 / (r.compute_ms + r.comm_ms)) < 1e-9);
}

static void test_refused_16g(void)
{
    struct tp_cap_config c = cfg_for("16G,16G", "10gbe");
    static struct tp_cap_result r;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_capacity_plan(&c, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 0);
    double total, repl;
    llama70b_q4_0_bytes(&total, &repl);
    const double kv = 4096.0 * 80 * 2 * 8 * 128 * 2;
    const double overhead = 0.5 * GIB + 512.0 * (4.0 * 8192 + 2.0 * 28672 + 128256) * 4;
    const double need = total + repl + kv + 2 * overhead; /* one extra copy of the replicated part */
    const double usable = 2 * (16 - 2) * GIB;             /* reserve max(2 GiB, 12.5% of 16 GiB) */
    CU_ASSERT(fabs((double)r.short_bytes - (need - usable)) < 16.0);
    CU_ASSERT(r.short_bytes > (uint64_t)(10 * GIB)); /* ~13.5 GiB: obviously impossible */
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "does not fit"));
    char by[64];
    snprintf(by, sizeof by, "short by %.1f GiB", (need - usable) / GIB);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, by));
}

/*
 * Communication: the bytes each node sends per decoded token, from what the
 * engine and comm/ do (documented in comm/algo.c and parallel/step.c, not
 * taken from the planner): rank 0 broadcasts the 256-byte step header to
 * each peer; every decode all_sum of 8192 f32 (32 KiB, under the mesh
 * limit) is one round in which each rank sends its buffer to every peer;
 * the argmax gather sends one (value, id) pair to rank 0.  The time check
 * against a measured run is ops.plan_measured (tests/ops/plan_measured_test.sh).
 */
static void test_comm_bytes_and_rounds(void)
{
    static struct tp_cap_result r;
    struct tp_error err = {0};
    const char *nodes[3] = {"a:64G,b:64G", "a:64G,b:64G,c:64G", "a:64G,b:64G,c:64G,d:64G"};
    for (int k = 0; k < 3; k++) {
        struct tp_cap_config c = cfg_for(nodes[k], "10gbe");
        const int n = k + 2;
        CU_ASSERT_EQUAL_FATAL(tp_capacity_plan(&c, &r, &err), TP_OK);
        const uint64_t sums = 160ull * 32768ull * (uint64_t)(n - 1);
        CU_ASSERT_EQUAL(r.nodes[0].wire_bytes_per_token, sums + 256ull * (uint64_t)(n - 1));
        for (int i = 1; i < n; i++) CU_ASSERT_EQUAL(r.nodes[i].wire_bytes_per_token, sums + 8);
        CU_ASSERT_EQUAL(r.wire_bytes_per_token, r.nodes[0].wire_bytes_per_token);
        CU_ASSERT_EQUAL(r.comm_rounds_per_token, 162); /* one per all_sum, header, gather: not 2 (N-1) */
        /* 162 rounds of 30 us latency + what rank 0 sends at 10 Gbit/s (to 0.01 ms: the gather's 8 bytes) */
        CU_ASSERT(fabs(r.comm_ms - (162 * 0.030 + (double)r.wire_bytes_per_token / 1.25e9 * 1e3)) < 0.01);
        /* f16 on the wire halves the all_sum bytes */
        c.wire_dtype = TP_WIRE_F16;
        CU_ASSERT_EQUAL_FATAL(tp_capacity_plan(&c, &r, &err), TP_OK);
        CU_ASSERT_EQUAL(r.nodes[1].wire_bytes_per_token, sums / 2 + 8);
        /* a measured all_sum time replaces the link model: 160 of them + 2 one-round calls */
        c.wire_dtype = TP_WIRE_F32;
        c.allsum_us = 50.0;
        CU_ASSERT_EQUAL_FATAL(tp_capacity_plan(&c, &r, &err), TP_OK);
        CU_ASSERT(r.comm_ms > 160 * 0.050 && r.comm_ms <= 162 * 0.050 + 1e-9);
        /* measured header broadcast and argmax gather (bench comm --decode) replace theirs too: exact sum */
        c.header_us = 7.0;
        c.gather_us = 11.0;
        CU_ASSERT_EQUAL_FATAL(tp_capacity_plan(&c, &r, &err), TP_OK);
        CU_ASSERT(fabs(r.comm_ms - (0.007 + 160 * 0.050 + 0.011)) < 1e-9);
        CU_ASSERT_EQUAL(r.comm_rounds_per_token, 162);
    }
    /* equal nodes: equal compute; bytes read = slices + norms + half the KV of one sequence */
    struct tp_cap_config c = cfg_for("a:64G,b:64G", "10gbe");
    CU_ASSERT_EQUAL_FATAL(tp_capacity_plan(&c, &r, &err), TP_OK);
    CU_ASSERT(fabs(r.nodes[0].compute_ms - r.nodes[1].compute_ms) < 1e-6 * r.nodes[0].compute_ms);
    double read0 = (double)r.plan.ranks[0].sharded_bytes + (2 * 80 + 1) * 8192 * 4.0 + (double)r.nodes[0].kv_bytes * 0.5;
    CU_ASSERT(fabs(r.nodes[0].compute_ms - read0 / (100e9 * 0.7) * 1e3) < 1e-9);

    /* one node: no communication at all */
    struct tp_cap_config one_node = cfg_for("big:192G", "10gbe");
    CU_ASSERT_EQUAL_FATAL(tp_capacity_plan(&one_node, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 1);
    CU_ASSERT_EQUAL(r.comm_ms, 0.0);
    CU_ASSERT_EQUAL(r.wire_bytes_per_token, 0);
}

static void test_uneven_rounding_refused(void)
{
    /* A node with too little memory to hold even the replicated parts is named. */
    struct tp_cap_config c = cfg_for("big:512G,tiny:2G", "10gbe");
    static struct tp_cap_result r;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_capacity_plan(&c, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "tiny"));
}

static void test_parse_nodes(void)
{
    struct tp_cap_node nd[8];
    int n = 0;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_capacity_parse_nodes("mac1:192G,mac2:128G:m2-ultra,64GiB:400,1.5T", 50.0, nd, 8, &n, &err),
                          TP_OK);
    CU_ASSERT_EQUAL(n, 4);
    CU_ASSERT_STRING_EQUAL(nd[0].name, "mac1");
    CU_ASSERT_EQUAL(nd[0].mem_bytes, (uint64_t)(192 * GIB));
    CU_ASSERT_EQUAL(nd[0].mem_bw_gbs, 50.0);
    CU_ASSERT_STRING_EQUAL(nd[1].name, "mac2");
    CU_ASSERT_EQUAL(nd[1].mem_bw_gbs, 800.0);
    CU_ASSERT_STRING_EQUAL(nd[2].name, "node2");
    CU_ASSERT_EQUAL(nd[2].mem_bytes, (uint64_t)(64 * GIB));
    CU_ASSERT_EQUAL(nd[2].mem_bw_gbs, 400.0);
    CU_ASSERT_EQUAL(nd[3].mem_bytes, (uint64_t)(1536 * GIB));

    const char *bad[] = {"", "192", "mac1:abc", "a:1G:zzz", "1G,", "a:b:c:d", "x:-4G", ",1G", "1G:0", NULL};
    for (int i = 0; bad[i]; i++) {
        struct tp_error e = {0};
        CU_ASSERT_EQUAL(tp_capacity_parse_nodes(bad[i], 50.0, nd, 8, &n, &e), TP_ERR_INVALID_ARG);
        CU_ASSERT(e.msg[0] != '\0');
    }
    struct tp_error e = {0};
    CU_ASSERT_EQUAL(tp_capacity_parse_nodes("1G,1G,1G", 50.0, nd, 2, &n, &e), TP_ERR_INVALID_ARG);

    struct tp_cap_link l;
    CU_ASSERT_EQUAL(tp_capacity_link_profile("tb5", &l, &e), TP_OK);
    CU_ASSERT_EQUAL(l.gbit, 40.0);
    memset(&e, 0, sizeof e);
    CU_ASSERT_EQUAL(tp_capacity_link_profile("carrier-pigeon", &l, &e), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "10gbe"));
}

static void test_invalid_config(void)
{
    struct tp_cap_config c = cfg_for("1G", "local");
    static struct tp_cap_result r;
    struct tp_error err = {0};
    c.hp.n_head_kv = 7; /* 64 % 7 != 0 */
    CU_ASSERT_EQUAL(tp_capacity_plan(&c, &r, &err), TP_ERR_INVALID_ARG);
    c = cfg_for("1G", "local");
    c.n_nodes = 0;
    CU_ASSERT_EQUAL(tp_capacity_plan(&c, &r, &err), TP_ERR_INVALID_ARG);
}

/* ---- re-planning over the survivors (tp_parallel_replan_check) ---- */

/* 70B Q4_0 over 3 ranks, rank `drop` lost; every rank on its own host of mem GiB unless host given. */
static struct tp_replan_input replan_in(const struct tp_hparams *hp, const struct tp_plan_types *ty, int world,
                                        int drop, double mem_gib, const char *host)
{
    struct tp_replan_input in;
    memset(&in, 0, sizeof in);
    in.hp = hp;
    in.types = ty;
    in.world = world;
    in.drop = drop;
    in.n_ctx = 4096;
    in.n_seq = 1;
    in.n_batch = 512;
    in.kv_type = TP_KV_F16;
    for (int r = 0; r < world; r++) {
        in.ranks[r].mem_total_bytes = (uint64_t)(mem_gib * GIB);
        snprintf(in.ranks[r].host, sizeof in.ranks[r].host, "%s%d", host ? host : "node", host ? 0 : r);
    }
    return in;
}

/* Oracle: weights + KV of one of two equal survivors of the 70B model (every split is exact at 2 ranks:
 * 32 of 64 heads, 4 of 8 KV heads, 14336 of 28672 FFN columns, 64128 of 128256 vocabulary rows). */
static double half_need_70b(void)
{
    double total, repl;
    llama70b_q4_0_bytes(&total, &repl);
    const double kv = 80.0 * 1 * 4096 * 4 * 128 * 2 * 2;
    return (total - repl) / 2 + repl + kv;
}

static void test_replan_fits(void)
{
    struct tp_hparams hp = llama70b();
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_Q4_0);
    struct tp_replan_input in = replan_in(&hp, &ty, 3, 1, 128, NULL);
    struct tp_replan_result r;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 1);
    CU_ASSERT_EQUAL(r.plan.world_size, 2);
    CU_ASSERT_EQUAL(r.plan.ranks[0].shard.q_head_end, 32);
    CU_ASSERT_EQUAL(r.plan.ranks[1].shard.kv_head_begin, 4);
    CU_ASSERT_EQUAL(r.plan.ranks[1].shard.ff_begin, 14336);
    CU_ASSERT_DOUBLE_EQUAL((double)r.need_bytes[0], half_need_70b(), 1.0);
    CU_ASSERT_DOUBLE_EQUAL((double)r.need_bytes[1], half_need_70b(), 1.0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "rank 2 -> 1"));
    /* the survivors keep their shard weights: 3,2,1 without rank 1 is 3:1 */
    const double w[3] = {3, 2, 1};
    in.weights = w;
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 1);
    CU_ASSERT_DOUBLE_EQUAL(r.plan.ranks[0].weight, 0.75, 1e-12);
    CU_ASSERT_EQUAL(r.plan.ranks[0].shard.q_head_end, 48);
    /* two ranks to one: rank 0 alone holds everything */
    in = replan_in(&hp, &ty, 2, 1, 128, NULL);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    double total, repl;
    llama70b_q4_0_bytes(&total, &repl);
    CU_ASSERT_EQUAL(r.fits, 1);
    CU_ASSERT_EQUAL(r.plan.world_size, 1);
    CU_ASSERT_DOUBLE_EQUAL((double)r.need_bytes[0], total + 80.0 * 4096 * 8 * 128 * 2 * 2, 1.0);
    /* the cache type's rows count: q8_0 holds 128 values in 136 bytes; bf16 whole tiles of 64 positions */
    const double weights_half = half_need_70b() - 80.0 * 4096 * 4 * 128 * 2 * 2;
    in = replan_in(&hp, &ty, 3, 1, 128, NULL);
    in.kv_type = TP_KV_Q8_0;
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_DOUBLE_EQUAL((double)r.need_bytes[1], weights_half + 80.0 * 4096 * 4 * 136 * 2, 1.0);
    in.kv_type = TP_KV_BF16;
    in.n_ctx = 4000;
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_DOUBLE_EQUAL((double)r.need_bytes[1], weights_half + 80.0 * 4032 * 4 * 128 * 2 * 2, 1.0);
    in.kv_type = TP_KV_TYPE_COUNT; /* no such type: an error, not a zero-byte cache */
    CU_ASSERT_EQUAL(tp_parallel_replan_check(&in, &r, &err), TP_ERR_INVALID_ARG);
}

/* The machine rule at its edge: usable = mem - max(2 GiB, mem / 8) against the oracle need. */
static void test_replan_memory_edge(void)
{
    struct tp_hparams hp = llama70b();
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_Q4_0);
    struct tp_replan_result r;
    struct tp_error err = {0};
    const double need = half_need_70b();
    const double mem_ok = need * 8.0 / 7.0 + 4096; /* usable = 7/8 mem (mem > 16 GiB) */
    const double mem_short = need * 8.0 / 7.0 - 4096;
    struct tp_replan_input in = replan_in(&hp, &ty, 3, 2, mem_ok / GIB, NULL);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 1);
    in = replan_in(&hp, &ty, 3, 2, mem_short / GIB, NULL);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "short by"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "host 'node0'"));
    /* the same memory is plenty on 3 machines (each holds a third) but not when the ranks share one */
    in = replan_in(&hp, &ty, 3, 1, 2.5 * mem_ok / GIB, NULL);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 1);
    in = replan_in(&hp, &ty, 3, 1, 1.5 * mem_ok / GIB, "mac");
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "2 surviving rank(s) on host 'mac0'"));
    in = replan_in(&hp, &ty, 3, 1, 2.5 * mem_ok / GIB, "mac");
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 1);
}

static void test_replan_refused(void)
{
    struct tp_hparams hp = llama70b();
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_Q4_0);
    struct tp_replan_result r;
    struct tp_error err = {0};
    /* a survivor's own offer (--mem-limit) below its need */
    struct tp_replan_input in = replan_in(&hp, &ty, 3, 1, 512, NULL);
    in.ranks[2].mem_limit_bytes = (uint64_t)(16 * GIB);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "rank 2 would need"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "--mem-limit"));
    /* the lost rank's offer does not count */
    in.ranks[2].mem_limit_bytes = 0;
    in.ranks[1].mem_limit_bytes = 1;
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 1);
    /* shard files cannot be re-planned */
    in.is_shard = 1;
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "shard files"));
    /* more survivors than KV groups... a plan that cannot be made is an answer, not an error */
    struct tp_hparams tiny = hp;
    tiny.n_head = 2;
    tiny.n_head_kv = 2;
    tiny.head_dim = 4096;
    in = replan_in(&tiny, &ty, 4, 1, 512, NULL);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_replan_check(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.fits, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "cannot be split over the 3 surviving"));
    /* malformed questions */
    in = replan_in(&hp, &ty, 3, 0, 128, NULL);
    CU_ASSERT_EQUAL(tp_parallel_replan_check(&in, &r, &err), TP_ERR_INVALID_ARG);
    in = replan_in(&hp, &ty, 3, 3, 128, NULL);
    CU_ASSERT_EQUAL(tp_parallel_replan_check(&in, &r, &err), TP_ERR_INVALID_ARG);
    in = replan_in(&hp, &ty, 1, 0, 128, NULL);
    CU_ASSERT_EQUAL(tp_parallel_replan_check(&in, &r, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(tp_parallel_replan_check(NULL, &r, &err), TP_ERR_INVALID_ARG);
}

/* KV bytes layer by layer: gpt-oss-20b's shape (24 layers, 8 KV heads of 64, sliding window 128 on the even
 * layers), f16, context 4096, batch 512: the 12 windowed layers hold rings of 128 + 512 = 640 positions,
 * the 12 full ones 4096.  Per KV head and sequence: 2 (K, V) x (12 x 640 + 12 x 4096) x 64 x 2 bytes =
 * 14,548,992; a model that kept 4096 positions in every layer would count 25,165,824.  The capacity plan
 * of one 64 GiB node with 2 sequences holds 8 heads x 2 sequences of that.  A window every layer
 * (Mistral v0.1: 4096 of a 32768 context, batch 512) is 32 x 4608 positions, and a window wider than the
 * context is capped at the context. */
static void test_windowed_kv_bytes(void)
{
    struct tp_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.arch = TP_ARCH_GPTOSS;
    hp.n_vocab = 201088;
    hp.n_embd = 2880;
    hp.n_layer = 24;
    hp.n_head = 64;
    hp.n_head_kv = 8;
    hp.head_dim = 64;
    hp.n_ff = 2880;
    hp.n_expert = 32;
    hp.n_expert_used = 4;
    hp.n_ctx_train = 131072;
    hp.sliding_window = 128;
    hp.swa_period = 2;
    hp.norm_eps = 1e-5f;
    hp.rope_theta = 150000.0f;
    CU_ASSERT_EQUAL(tp_kv_layer_window(&hp, 0), 128);
    CU_ASSERT_EQUAL(tp_kv_layer_window(&hp, 1), 0);
    CU_ASSERT_EQUAL(tp_kv_layer_window(&hp, 22), 128);
    CU_ASSERT_EQUAL(tp_kv_layer_window(&hp, 23), 0);
    CU_ASSERT_EQUAL(tp_kv_layer_window(&hp, 24), 0);
    CU_ASSERT_EQUAL(tp_kv_layer_positions(&hp, 0, 4096, 512), 640);
    CU_ASSERT_EQUAL(tp_kv_layer_positions(&hp, 1, 4096, 512), 4096);
    CU_ASSERT_EQUAL(tp_kv_layer_positions(&hp, 0, 600, 512), 600); /* the ring never exceeds the context */
    CU_ASSERT_EQUAL(tp_kv_head_bytes(&hp, 4096, 512, TP_KV_F16), 14548992ull);
    CU_ASSERT_EQUAL(tp_kv_head_bytes(&hp, 4096, 512, TP_KV_F32), 2 * 14548992ull);

    struct tp_cap_config c = tp_capacity_default_config();
    struct tp_error err = {0};
    c.hp = hp;
    c.wtype = TP_WTYPE_MXFP4;
    c.n_ctx = 4096;
    c.n_seq = 2;
    c.n_batch = 512;
    c.kv_type = TP_KV_F16;
    CU_ASSERT_EQUAL_FATAL(tp_capacity_parse_nodes("mac:64G:m4-max", 100.0, c.nodes, TP_CAP_MAX_NODES, &c.n_nodes, &err),
                          TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_capacity_link_profile("local", &c.link, &err), TP_OK);
    static struct tp_cap_result r;
    if (tp_capacity_plan(&c, &r, &err) != TP_OK) fprintf(stderr, "%s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(err.status, TP_OK);
    CU_ASSERT_EQUAL(r.nodes[0].n_kv_heads, 8);
    CU_ASSERT_EQUAL(r.nodes[0].kv_bytes, 8ull * 2 * 14548992ull);

    hp.arch = TP_ARCH_LLAMA; /* Mistral v0.1: every layer windowed */
    hp.n_layer = 32;
    hp.head_dim = 128;
    hp.sliding_window = 4096;
    hp.swa_period = 0;
    CU_ASSERT_EQUAL(tp_kv_head_bytes(&hp, 32768, 512, TP_KV_F16), 2ull * 32 * 4608 * 128 * 2);
    CU_ASSERT_EQUAL(tp_kv_head_bytes(&hp, 2048, 512, TP_KV_F16), 2ull * 32 * 2048 * 128 * 2);
    hp.sliding_window = 0; /* no window: the context in every layer */
    CU_ASSERT_EQUAL(tp_kv_head_bytes(&hp, 32768, 512, TP_KV_F16), 2ull * 32 * 32768 * 128 * 2);
}

static const struct tp_test_case capacity_cases[] = {
    {"windowed_kv_bytes", test_windowed_kv_bytes},
    {"replan_fits", test_replan_fits},
    {"replan_memory_edge", test_replan_memory_edge},
    {"replan_refused", test_replan_refused},
    {"fits_uneven_192_128_64", test_fits_uneven},
    {"refused_16g_16g", test_refused_16g},
    {"comm_bytes_and_rounds", test_comm_bytes_and_rounds},
    {"node_too_small", test_uneven_rounding_refused},
    {"parse_nodes", test_parse_nodes},
    {"invalid_config", test_invalid_config},
    {NULL, NULL},
};
TP_TEST_SUITE(capacity, "unit", 30, capacity_cases)

/*
 * tests/parallel/test_plan.c - the sharding plan as pure data (no network).
 *
 * Oracles: every plan must tile each dimension exactly (ranges contiguous,
 * covering [0, n) with no gap or overlap), KV ranges must cover the groups
 * of the rank's Q heads, row-parallel boundaries must sit on block
 * multiples, per-rank bytes must add up to the whole model counted
 * independently, and specific shapes (32 heads / 8 KV heads at 3, 5, 6, 16
 * ranks; stories260K's 8/4 heads; weighted 2,1,1) give the exact ranges
 * worked out by hand below.
 */
#include <stdio.h>
#include <string.h>

#include "parallel/parallel.h"
#include "tp_test.h"

static struct tp_hparams llama_hp(int n_embd, int n_head, int n_kv, int n_ff, int n_vocab, int n_layer)
{
    struct tp_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.arch = TP_ARCH_LLAMA;
    hp.n_vocab = n_vocab;
    hp.n_embd = n_embd;
    hp.n_layer = n_layer;
    hp.n_head = n_head;
    hp.n_head_kv = n_kv;
    hp.head_dim = n_embd / n_head;
    hp.n_ff = n_ff;
    hp.n_ctx_train = 2048;
    hp.rope_dim = hp.head_dim;
    hp.rope_theta = 10000.0f;
    hp.norm_eps = 1e-5f;
    return hp;
}

/* Invariants that hold for every valid plan. */
static void check_tiling(const struct tp_hparams *hp, const struct tp_shard_plan *p, int ff_block)
{
    int G = hp->n_head / hp->n_head_kv;
    CU_ASSERT_EQUAL(p->ranks[0].shard.q_head_begin, 0);
    CU_ASSERT_EQUAL(p->ranks[0].shard.ff_begin, 0);
    CU_ASSERT_EQUAL(p->ranks[0].shard.vocab_begin, 0);
    double wsum = 0;
    for (int r = 0; r < p->world_size; r++) {
        const struct tp_model_shard *s = &p->ranks[r].shard;
        CU_ASSERT(s->q_head_begin < s->q_head_end);
        CU_ASSERT(s->ff_begin < s->ff_end);
        CU_ASSERT(s->vocab_begin < s->vocab_end);
        CU_ASSERT(s->kv_head_begin < s->kv_head_end);
        CU_ASSERT_EQUAL(s->kv_head_begin, s->q_head_begin / G);
        CU_ASSERT_EQUAL(s->kv_head_end, (s->q_head_end - 1) / G + 1);
        CU_ASSERT(s->ff_begin % ff_block == 0);
        CU_ASSERT(s->ff_end % ff_block == 0 || s->ff_end == hp->n_ff);
        CU_ASSERT_PTR_NULL(s->all_sum);
        if (r + 1 < p->world_size) {
            const struct tp_model_shard *t = &p->ranks[r + 1].shard;
            CU_ASSERT_EQUAL(s->q_head_end, t->q_head_begin);
            CU_ASSERT_EQUAL(s->ff_end, t->ff_begin);
            CU_ASSERT_EQUAL(s->vocab_end, t->vocab_begin);
        }
        wsum += p->ranks[r].weight;
    }
    const struct tp_model_shard *last = &p->ranks[p->world_size - 1].shard;
    CU_ASSERT_EQUAL(last->q_head_end, hp->n_head);
    CU_ASSERT_EQUAL(last->kv_head_end, hp->n_head_kv);
    CU_ASSERT_EQUAL(last->ff_end, hp->n_ff);
    CU_ASSERT_EQUAL(last->vocab_end, hp->n_vocab);
    CU_ASSERT_DOUBLE_EQUAL(wsum, 1.0, 1e-12);
    CU_ASSERT(strlen(p->note) > 0);
}

static void test_stories_shapes(void)
{
    /* stories260K: n_embd 64, 8 heads, 4 KV heads, n_ff 172, vocab 512, 5 layers, F32. */
    struct tp_hparams hp = llama_hp(64, 8, 4, 172, 512, 5);
    hp.tied_embeddings = 1;
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_F32);
    struct tp_shard_plan p;
    struct tp_error e = {0};
    for (int n = 1; n <= 8; n++) {
        CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, n, NULL, &p, &e), TP_OK);
        check_tiling(&hp, &p, 1);
        CU_ASSERT_EQUAL(p.kv_replicated, n > 4);
        /* sharded bytes add up to the whole minus replicated, counted independently */
        uint64_t sum = 0;
        for (int r = 0; r < n; r++) sum += p.ranks[r].sharded_bytes;
        uint64_t per_layer = 4ull * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 172 * 64);
        uint64_t whole_sharded = 5 * per_layer; /* tied embeddings: no output head */
        if (n <= 4) CU_ASSERT_EQUAL(sum, whole_sharded);
        if (n > 4) CU_ASSERT(sum > whole_sharded); /* replicated KV heads counted on each holder */
        CU_ASSERT_EQUAL(p.total_bytes, whole_sharded + p.replicated_bytes);
    }
    /* N=3: KV groups 2,1,1 -> Q heads [0,4) [4,6) [6,8) */
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 3, NULL, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.ranks[0].shard.q_head_end, 4);
    CU_ASSERT_EQUAL(p.ranks[1].shard.q_head_end, 6);
    CU_ASSERT_EQUAL(p.ranks[0].shard.kv_head_end, 2);
    CU_ASSERT_EQUAL(p.ranks[0].shard.ff_end, 58); /* 172 = 58 + 57 + 57 */
    CU_ASSERT_EQUAL(p.ranks[1].shard.ff_end, 115);
    CU_ASSERT_EQUAL(p.ranks[0].shard.vocab_end, 171); /* 512 = 171 + 171 + 170 */
    /* N=8: one Q head each, KV head r/2 replicated on ranks 2k, 2k+1 */
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 8, NULL, &p, &e), TP_OK);
    for (int r = 0; r < 8; r++) {
        CU_ASSERT_EQUAL(p.ranks[r].shard.q_head_begin, r);
        CU_ASSERT_EQUAL(p.ranks[r].shard.kv_head_begin, r / 2);
        CU_ASSERT_EQUAL(p.ranks[r].shard.kv_head_end, r / 2 + 1);
    }
    CU_ASSERT(strstr(p.note, "replicated") != NULL);
    /* 9 ranks on 8 heads: refused with a message */
    tp_error_clear(&e);
    CU_ASSERT_EQUAL(tp_parallel_plan(&hp, &ty, 9, NULL, &p, &e), TP_ERR_UNSUPPORTED);
    CU_ASSERT(strstr(e.msg, "at most 8 ranks") != NULL);
}

static void test_llama_uneven(void)
{
    /* TinyLlama-1.1B shapes: 2048 embd, 32 heads, 4 KV heads, ff 5632, vocab 32000, 22 layers. */
    struct tp_hparams hp = llama_hp(2048, 32, 4, 5632, 32000, 22);
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_Q4_0);
    struct tp_shard_plan p;
    struct tp_error e = {0};
    for (int n = 1; n <= 32; n++) {
        CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, n, NULL, &p, &e), TP_OK);
        check_tiling(&hp, &p, 32);
        CU_ASSERT_EQUAL(p.ff_unit, 32);
    }
    /* 3 ranks: FFN 176 blocks of 32 -> 59,59,58 blocks: moved off 1877.33 */
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 3, NULL, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.ranks[0].shard.ff_end, 59 * 32);
    CU_ASSERT_EQUAL(p.ranks[1].shard.ff_end, 118 * 32);
    CU_ASSERT(p.moved);
    CU_ASSERT(strstr(p.note, "FFN split moved to 32-column block boundaries") != NULL);
    /* 4 KV heads over 3 ranks by groups of 8 Q heads: 2,1,1 groups */
    CU_ASSERT_EQUAL(p.ranks[0].shard.q_head_end, 16);
    CU_ASSERT_EQUAL(p.ranks[0].shard.kv_head_end, 2);
    CU_ASSERT_EQUAL(p.kv_replicated, 0);
    /* 2 ranks: exact halves, nothing moved */
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 2, NULL, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.moved, 0);
    CU_ASSERT_EQUAL(p.ranks[0].shard.ff_end, 2816);

    /* 32 heads / 8 KV heads at 3, 5, 6 ranks (Llama-3-8B-like) */
    struct tp_hparams h8 = llama_hp(4096, 32, 8, 14336, 128256, 2);
    ty = tp_plan_types_uniform(TP_WTYPE_Q8_0);
    const int ns[] = {3, 5, 6, 16};
    const int q0_end[] = {12, 8, 8, 2}; /* KV groups 3,3,2 / 2,2,2,1,1 / 2,2,1,1,1,1 / Q-head split */
    for (size_t i = 0; i < TP_ARRAY_LEN(ns); i++) {
        CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&h8, &ty, ns[i], NULL, &p, &e), TP_OK);
        check_tiling(&h8, &p, 32);
        CU_ASSERT_EQUAL(p.ranks[0].shard.q_head_end, q0_end[i]);
        CU_ASSERT_EQUAL(p.kv_replicated, ns[i] > 8);
    }
    /* 16 ranks: 2 Q heads each, KV head r/2 replicated */
    CU_ASSERT_EQUAL(p.ranks[5].shard.kv_head_begin, 2);
    CU_ASSERT_EQUAL(p.ranks[5].shard.kv_head_end, 3);
}

static void test_kquant_blocks(void)
{
    /* head_dim 64 with Q4_K attn_output (256-column blocks): heads move in units of 4. */
    struct tp_hparams hp = llama_hp(2048, 32, 32, 5632, 32000, 2);
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_Q4_K);
    ty.ffn_down = TP_WTYPE_Q6_K;
    struct tp_shard_plan p;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 3, NULL, &p, &e), TP_OK);
    check_tiling(&hp, &p, 256);
    CU_ASSERT_EQUAL(p.head_unit, 4);
    CU_ASSERT_EQUAL(p.ff_unit, 256);
    for (int r = 0; r < 3; r++) CU_ASSERT(p.ranks[r].shard.q_head_begin % 4 == 0);
    CU_ASSERT_EQUAL(p.ranks[0].shard.q_head_end, 12); /* 8 units: 3,3,2 */
    CU_ASSERT_EQUAL(p.ranks[0].shard.ff_end, 8 * 256); /* 22 blocks: 8,7,7 */
    CU_ASSERT(strstr(p.note, "head split moved") != NULL);
    /* 9 ranks: only 8 head units -> refused */
    CU_ASSERT_EQUAL(tp_parallel_plan(&hp, &ty, 9, NULL, &p, &e), TP_ERR_UNSUPPORTED);
    CU_ASSERT(strstr(e.msg, "units of 4") != NULL);
}

static void test_weighted(void)
{
    struct tp_hparams hp = llama_hp(2048, 32, 4, 5632, 32000, 22);
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_Q4_0);
    struct tp_shard_plan p;
    struct tp_error e = {0};
    double w[3];
    CU_ASSERT_EQUAL_FATAL(tp_parallel_parse_weights("2,1,1", 3, w, &e), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 3, w, &p, &e), TP_OK);
    check_tiling(&hp, &p, 32);
    CU_ASSERT_EQUAL(p.ranks[0].shard.q_head_end, 16);  /* 2 of 4 groups */
    CU_ASSERT_EQUAL(p.ranks[0].shard.ff_end, 88 * 32); /* 176 blocks: 88,44,44 */
    CU_ASSERT_EQUAL(p.ranks[1].shard.ff_end, 132 * 32);
    CU_ASSERT_EQUAL(p.ranks[0].shard.vocab_end, 16000);
    CU_ASSERT_DOUBLE_EQUAL(p.ranks[0].weight, 0.5, 1e-12);
    /* rank 0 holds about twice the sharded bytes of rank 1 */
    double ratio = (double)p.ranks[0].sharded_bytes / (double)p.ranks[1].sharded_bytes;
    CU_ASSERT(ratio > 1.95 && ratio < 2.05);
    /* a tiny weight that would leave a rank without heads is refused */
    double bad[3] = {100, 100, 1};
    tp_error_clear(&e);
    CU_ASSERT_EQUAL(tp_parallel_plan(&hp, &ty, 3, bad, &p, &e), TP_ERR_INVALID_ARG);
    CU_ASSERT(strstr(e.msg, "rank 2") != NULL);
    double zero[2] = {1, 0};
    tp_error_clear(&e);
    CU_ASSERT_EQUAL(tp_parallel_plan(&hp, &ty, 2, zero, &p, &e), TP_ERR_INVALID_ARG);
    CU_ASSERT(strstr(e.msg, "rank 1") != NULL);
}

static void test_parse_weights(void)
{
    double w[4];
    struct tp_error e = {0};
    CU_ASSERT_EQUAL(tp_parallel_parse_weights("1.5,0.5", 2, w, &e), TP_OK);
    CU_ASSERT_DOUBLE_EQUAL(w[0], 1.5, 0);
    CU_ASSERT_DOUBLE_EQUAL(w[1], 0.5, 0);
    const char *bad[] = {"", "1,", "1,,1", "a,1", "1,0", "1,-2", "1,2,3", "1", "1,nan", "1,inf"};
    for (size_t i = 0; i < TP_ARRAY_LEN(bad); i++) {
        tp_error_clear(&e);
        CU_ASSERT_NOT_EQUAL(tp_parallel_parse_weights(bad[i], 2, w, &e), TP_OK);
        CU_ASSERT(strlen(e.msg) > 0);
    }
}

static void test_refusals_and_hash(void)
{
    struct tp_hparams hp = llama_hp(64, 8, 4, 172, 512, 5);
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_F32);
    struct tp_shard_plan a, b;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL(tp_parallel_plan(&hp, &ty, 0, NULL, &a, &e), TP_ERR_INVALID_ARG);
    tp_error_clear(&e);
    CU_ASSERT_EQUAL(tp_parallel_plan(&hp, &ty, TP_PLAN_MAX_RANKS + 1, NULL, &a, &e), TP_ERR_INVALID_ARG);
    struct tp_hparams odd = hp;
    odd.n_head_kv = 3;
    tp_error_clear(&e);
    CU_ASSERT_EQUAL(tp_parallel_plan(&odd, &ty, 2, NULL, &a, &e), TP_ERR_FORMAT);
    /* Q4_0 attention rows need n_embd % 32 == 0; 172-column ffn_down cannot be Q4_0 */
    struct tp_plan_types q = tp_plan_types_uniform(TP_WTYPE_Q4_0);
    tp_error_clear(&e);
    CU_ASSERT_EQUAL(tp_parallel_plan(&hp, &q, 2, NULL, &a, &e), TP_ERR_FORMAT);
    CU_ASSERT(strstr(e.msg, "ffn_down") != NULL);
    struct tp_plan_types unk = ty;
    unk.attn_q = (enum tp_wtype)33;
    tp_error_clear(&e);
    CU_ASSERT_EQUAL(tp_parallel_plan(&hp, &unk, 2, NULL, &a, &e), TP_ERR_UNSUPPORTED);

    /* hash: same inputs same hash; different world/weights different hash */
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 2, NULL, &a, &e), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 2, NULL, &b, &e), TP_OK);
    CU_ASSERT_EQUAL(tp_shard_plan_hash(&a), tp_shard_plan_hash(&b));
    double w[2] = {3, 1};
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 2, w, &b, &e), TP_OK);
    CU_ASSERT_NOT_EQUAL(tp_shard_plan_hash(&a), tp_shard_plan_hash(&b));
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 3, NULL, &b, &e), TP_OK);
    CU_ASSERT_NOT_EQUAL(tp_shard_plan_hash(&a), tp_shard_plan_hash(&b));

    char buf[1024];
    size_t need = tp_shard_plan_describe(&b, buf, sizeof buf);
    CU_ASSERT_EQUAL(need, strlen(buf));
    CU_ASSERT(strstr(buf, "rank 2 (share 0.333): q heads [6,8) kv heads [3,4)") != NULL);
    char small[16];
    CU_ASSERT_EQUAL(tp_shard_plan_describe(&b, small, sizeof small), need);
    CU_ASSERT(strlen(small) < sizeof small);
}

/* ---- mixture of experts: Qwen3-30B-A3B's shape (2048 wide, 32/4 heads, 128 experts of 768 columns, top 8) */

static struct tp_hparams moe_hp(void)
{
    struct tp_hparams hp = llama_hp(2048, 32, 4, 768, 151936, 48);
    hp.arch = TP_ARCH_QWEN3MOE;
    hp.head_dim = 128;
    hp.has_qk_norm = 1;
    hp.n_expert = 128;
    hp.n_expert_used = 8;
    hp.expert_weights_norm = 1;
    return hp;
}

/* Per-rank expert bytes add up to the whole model's experts counted here independently. */
static void check_moe_bytes(const struct tp_hparams *hp, const struct tp_plan_types *ty, const struct tp_shard_plan *p,
                            uint64_t expert_row_bytes_in, uint64_t expert_row_bytes_ff)
{
    (void)ty;
    uint64_t sum = 0;
    for (int r = 0; r < p->world_size; r++) sum += p->ranks[r].sharded_bytes;
    const uint64_t experts = (uint64_t)hp->n_layer * (uint64_t)hp->n_expert *
                             (2 * (uint64_t)hp->n_ff * expert_row_bytes_in + (uint64_t)hp->n_embd * expert_row_bytes_ff);
    /* attention, output head: as for a dense model; the experts on top */
    CU_ASSERT(sum > experts);
    CU_ASSERT_EQUAL(p->total_bytes - p->replicated_bytes, sum);
    /* the routers are replicated: n_layer x (n_expert x n_embd) F32 each */
    CU_ASSERT(p->replicated_bytes >= (uint64_t)hp->n_layer * hp->n_expert * hp->n_embd * 4);
}

static void test_moe_splits(void)
{
    struct tp_hparams hp = moe_hp();
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_Q4_0);
    ty.output = TP_WTYPE_Q6_K;
    struct tp_shard_plan p;
    struct tp_error e = {0};
    /* Q4_0 (32-column blocks) at 2 ranks: 24 blocks split 12 / 12 exactly -> tensor-parallel */
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 2, NULL, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.moe_split, TP_MOE_SPLIT_TENSOR);
    check_tiling(&hp, &p, 32);
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(p.ranks[r].shard.expert_begin, 0);
        CU_ASSERT_EQUAL(p.ranks[r].shard.expert_end, 128);
    }
    CU_ASSERT_EQUAL(p.ranks[0].shard.ff_end, 384);
    CU_ASSERT_PTR_NOT_NULL(strstr(p.note, "tensor-parallel"));
    check_moe_bytes(&hp, &ty, &p, 2048 / 32 * 18, 768 / 32 * 18);
    /* the same asked for whole experts: 64 / 64, every column */
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan_moe(&hp, &ty, 2, NULL, TP_MOE_SPLIT_EXPERT, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.moe_split, TP_MOE_SPLIT_EXPERT);
    CU_ASSERT_EQUAL(p.ranks[0].shard.expert_end, 64);
    CU_ASSERT_EQUAL(p.ranks[1].shard.expert_begin, 64);
    CU_ASSERT_EQUAL(p.ranks[1].shard.expert_end, 128);
    CU_ASSERT_EQUAL(p.ranks[1].shard.ff_begin, 0);
    CU_ASSERT_EQUAL(p.ranks[1].shard.ff_end, 768);
    check_moe_bytes(&hp, &ty, &p, 2048 / 32 * 18, 768 / 32 * 18);
    char buf[1024];
    tp_shard_plan_describe(&p, buf, sizeof buf);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "experts [64,128)"));
    /* weighted 2,1,1: whole experts in proportion */
    double w[3] = {2, 1, 1};
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan_moe(&hp, &ty, 3, w, TP_MOE_SPLIT_EXPERT, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.ranks[0].shard.expert_end, 64);
    CU_ASSERT_EQUAL(p.ranks[1].shard.expert_end, 96);
    CU_ASSERT_EQUAL(p.ranks[2].shard.expert_end, 128);
    CU_ASSERT(p.ranks[0].sharded_bytes > p.ranks[1].sharded_bytes);
}

static void test_moe_block_limits(void)
{
    struct tp_hparams hp = moe_hp();
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_Q4_K);
    struct tp_shard_plan p;
    struct tp_error e = {0};
    /* 768 columns are 3 Q4_K super-blocks: no column split at 4 ranks -> whole experts, with the reason */
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 4, NULL, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.moe_split, TP_MOE_SPLIT_EXPERT);
    CU_ASSERT_PTR_NOT_NULL(strstr(p.note, "3 q4_k blocks, too few for 4 ranks"));
    for (int r = 0; r < 4; r++) CU_ASSERT_EQUAL(p.ranks[r].shard.expert_end - p.ranks[r].shard.expert_begin, 32);
    check_moe_bytes(&hp, &ty, &p, 2048 / 256 * 144, 768 / 256 * 144);
    /* asked for a column split anyway: refused up front, naming the way out */
    CU_ASSERT_EQUAL(tp_parallel_plan_moe(&hp, &ty, 4, NULL, TP_MOE_SPLIT_TENSOR, &p, &e), TP_ERR_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "--moe-split expert"));
    /* 2 ranks: 3 blocks split 2 / 1 is off the equal shares -> whole experts */
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 2, NULL, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.moe_split, TP_MOE_SPLIT_EXPERT);
    CU_ASSERT_PTR_NOT_NULL(strstr(p.note, "block boundaries"));
    /* ... but tensor-parallel on block boundaries when asked */
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan_moe(&hp, &ty, 2, NULL, TP_MOE_SPLIT_TENSOR, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.ranks[0].shard.ff_end, 512);
    CU_ASSERT_EQUAL(p.ranks[1].shard.ff_end, 768);
    /* fewer experts than ranks: whole experts refused, columns chosen */
    hp.n_expert = 2;
    hp.n_expert_used = 1;
    ty = tp_plan_types_uniform(TP_WTYPE_F32);
    struct tp_error e2 = {0}; /* a tp_error keeps its first message */
    CU_ASSERT_EQUAL(tp_parallel_plan_moe(&hp, &ty, 3, NULL, TP_MOE_SPLIT_EXPERT, &p, &e2), TP_ERR_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(e2.msg, "--moe-split tensor"));
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&hp, &ty, 3, NULL, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.moe_split, TP_MOE_SPLIT_TENSOR);
    /* the split is part of the hash: ranks disagreeing on it are caught */
    struct tp_shard_plan a, b;
    hp = moe_hp();
    ty = tp_plan_types_uniform(TP_WTYPE_F32);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan_moe(&hp, &ty, 2, NULL, TP_MOE_SPLIT_TENSOR, &a, &e), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan_moe(&hp, &ty, 2, NULL, TP_MOE_SPLIT_EXPERT, &b, &e), TP_OK);
    CU_ASSERT_NOT_EQUAL(tp_shard_plan_hash(&a), tp_shard_plan_hash(&b));
    enum tp_moe_split sp;
    CU_ASSERT_EQUAL(tp_moe_split_parse("expert", &sp, &e), TP_OK);
    CU_ASSERT_EQUAL(sp, TP_MOE_SPLIT_EXPERT);
    CU_ASSERT_EQUAL(tp_moe_split_parse("experts", &sp, &e), TP_ERR_INVALID_ARG);
}

/* Qwen1.5-MoE-A2.7B's shared expert (5632 columns = 176 Q4_0 blocks) is split like a dense FFN in
 * both expert splits: contiguous, on 32-column boundaries, in proportion to the weights, each rank's
 * bytes counting only its columns (their sum is one rank's plus the gate vector twice); with fewer blocks
 * than ranks it stays whole on rank 0. */
static void test_moe_shared_expert(void)
{
    struct tp_hparams hp = llama_hp(2048, 16, 16, 1408, 151936, 24);
    hp.arch = TP_ARCH_QWEN2MOE;
    hp.n_expert = 60;
    hp.n_expert_used = 4;
    hp.n_ff_shexp = 5632;
    struct tp_plan_types ty = tp_plan_types_uniform(TP_WTYPE_Q4_0);
    struct tp_shard_plan p, one;
    struct tp_error e = {0};
    if (tp_parallel_plan(&hp, &ty, 1, NULL, &one, &e) != TP_OK) fprintf(stderr, "plan: %s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(e.status, TP_OK);
    CU_ASSERT_EQUAL(one.ranks[0].shard.shexp_begin, 0);
    CU_ASSERT_EQUAL(one.ranks[0].shard.shexp_end, 5632);
    const double w[3] = {2, 1, 1};
    for (int split = TP_MOE_SPLIT_TENSOR; split <= TP_MOE_SPLIT_EXPERT; split++) {
        CU_ASSERT_EQUAL_FATAL(tp_parallel_plan_moe(&hp, &ty, 3, w, (enum tp_moe_split)split, &p, &e), TP_OK);
        int prev = 0;
        for (int r = 0; r < 3; r++) {
            const struct tp_model_shard *s = &p.ranks[r].shard;
            CU_ASSERT_EQUAL(s->shexp_begin, prev);
            CU_ASSERT_EQUAL(s->shexp_begin % 32, 0);
            CU_ASSERT(s->shexp_end > s->shexp_begin);
            prev = s->shexp_end;
        }
        CU_ASSERT_EQUAL(prev, 5632);
        /* 176 blocks by 2,1,1: 88, 44, 44 */
        CU_ASSERT_EQUAL(p.ranks[0].shard.shexp_end, 88 * 32);
        CU_ASSERT_EQUAL(p.ranks[1].shard.shexp_end, 132 * 32);
        /* each rank counts only its columns of the shared expert (and the gate vector): the ranks together
         * hold what one rank holds, plus the gate vector twice more */
        uint64_t sum = 0;
        for (int r = 0; r < 3; r++) sum += p.ranks[r].sharded_bytes;
        const uint64_t vec = (uint64_t)24 * 2048 * 4 * 2; /* the gate vector, on ranks 1 and 2 as well */
        CU_ASSERT_EQUAL(sum, one.ranks[0].sharded_bytes + vec);
    }
    /* 5 ranks of a 2-block shared expert: whole on rank 0, nothing elsewhere */
    hp.n_ff_shexp = 64;
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan_moe(&hp, &ty, 5, NULL, TP_MOE_SPLIT_EXPERT, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.ranks[0].shard.shexp_end, 64);
    for (int r = 1; r < 5; r++) CU_ASSERT_EQUAL(p.ranks[r].shard.shexp_end, 0);
}

/* ------------------------------------------------------ draft placement */

/* Weights a decoded token reads of a dense untied Q4_0 llama shape, counted independently of the planner:
 * every matrix (18 bytes per 32 values) and the norms (f32), not the embedding table (one row). */
static double q4_0_read_bytes(const struct tp_hparams *hp)
{
    const double e = hp->n_embd, kv = (double)hp->n_head_kv * hp->head_dim, f = hp->n_ff;
    const double per_layer = e * e * 2 + e * kv * 2 + 3 * e * f;
    return (per_layer * hp->n_layer + (double)hp->n_vocab * e) * 18.0 / 32.0 + (2.0 * hp->n_layer + 1) * e * 4;
}

/* tp_parallel_draft_placement: a small draft (llama3.2-1b's dense shape, untied here) over a slow link
 * (260 us per all_sum, a 0.26 ms TCP round trip) stays on rank 0; a big one (llama3.1-8b's shape) over a
 * fast link (15 us, RDMA) is sharded over 4 ranks; the costs are the formula's, worked out here from an
 * independent byte count; one rank, an impossible split, an explicit choice and bad figures. */
static void test_draft_placement(void)
{
    const struct tp_plan_types t = tp_plan_types_uniform(TP_WTYPE_Q4_0);
    struct tp_hparams small = llama_hp(2048, 32, 8, 8192, 128256, 16), big = llama_hp(4096, 32, 8, 14336, 128256, 32);
    const double bw[4] = {100, 100, 100, 100};
    struct tp_draft_place_result r;
    struct tp_error err = {0};
    struct tp_draft_place_input in = {&small, &t, 2, NULL, TP_DRAFT_PLACEMENT_AUTO, bw, 260.0};
    CU_ASSERT_EQUAL_FATAL(tp_parallel_draft_placement(&in, &r, &err), TP_OK);
    fprintf(stderr, "small, slow link: %s\n", r.reason);
    CU_ASSERT_EQUAL(r.placement, TP_DRAFT_PLACEMENT_RANK0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "draft on rank 0, sharded is not at least 10% faster"));
    CU_ASSERT_EQUAL(r.collectives, 2 * 16 + 2);
    CU_ASSERT_DOUBLE_EQUAL((double)r.rank0_read_bytes, q4_0_read_bytes(&small), 1.0);
    CU_ASSERT_DOUBLE_EQUAL(r.rank0_ms, q4_0_read_bytes(&small) / 100e9 * 1e3, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(r.sharded_comm_ms, 34 * 0.260, 1e-9);
    /* two even halves of the matrices, each rank with all the norms */
    const double norms = (2.0 * 16 + 1) * 2048 * 4, half = (q4_0_read_bytes(&small) - norms) / 2 + norms;
    CU_ASSERT_DOUBLE_EQUAL((double)r.rank_read_bytes_max, half, 1.0);
    CU_ASSERT_DOUBLE_EQUAL(r.sharded_ms, half / 100e9 * 1e3 + 34 * 0.260, 1e-6);
    CU_ASSERT(r.sharded_ms > 0.9 * r.rank0_ms);

    in = (struct tp_draft_place_input){&big, &t, 4, NULL, TP_DRAFT_PLACEMENT_AUTO, bw, 15.0};
    CU_ASSERT_EQUAL_FATAL(tp_parallel_draft_placement(&in, &r, &err), TP_OK);
    fprintf(stderr, "big, fast link: %s\n", r.reason);
    CU_ASSERT_EQUAL(r.placement, TP_DRAFT_PLACEMENT_SHARDED);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "draft sharded, sharded is at least 10% faster"));
    CU_ASSERT_DOUBLE_EQUAL(r.rank0_ms, q4_0_read_bytes(&big) / 100e9 * 1e3, 1e-6);
    const double quarter = (q4_0_read_bytes(&big) - (2.0 * 32 + 1) * 4096 * 4) / 4 + (2.0 * 32 + 1) * 4096 * 4;
    CU_ASSERT_DOUBLE_EQUAL(r.sharded_ms, quarter / 100e9 * 1e3 + 66 * 0.015, 1e-6);
    CU_ASSERT(r.sharded_ms < 0.3 * r.rank0_ms); /* ~11 ms against ~42 ms */
    /* the same big draft on the slow link at 2 ranks: 66 x 2.15 ms of all_sums (1 ms one-way) outweigh it */
    in.world = 2;
    in.allsum_us = 2150.0;
    CU_ASSERT_EQUAL_FATAL(tp_parallel_draft_placement(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.placement, TP_DRAFT_PLACEMENT_RANK0);
    /* asked for: kept, with the costs of both */
    in.asked = TP_DRAFT_PLACEMENT_SHARDED;
    CU_ASSERT_EQUAL_FATAL(tp_parallel_draft_placement(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.placement, TP_DRAFT_PLACEMENT_SHARDED);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "as asked"));
    /* one rank: rank 0, nothing to weigh */
    in = (struct tp_draft_place_input){&big, &t, 1, NULL, TP_DRAFT_PLACEMENT_AUTO, bw, 15.0};
    CU_ASSERT_EQUAL_FATAL(tp_parallel_draft_placement(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.placement, TP_DRAFT_PLACEMENT_RANK0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "a world of one rank"));
    /* a draft that cannot be split over the ranks (8 KV heads of 4 Q heads, 40 ranks): auto keeps it on rank 0
     * with the planner's reason; asked sharded is refused naming rank0 */
    double bw40[40];
    for (int i = 0; i < 40; i++) bw40[i] = 100;
    in = (struct tp_draft_place_input){&small, &t, 40, NULL, TP_DRAFT_PLACEMENT_AUTO, bw40, 1.0};
    CU_ASSERT_EQUAL_FATAL(tp_parallel_draft_placement(&in, &r, &err), TP_OK);
    CU_ASSERT_EQUAL(r.placement, TP_DRAFT_PLACEMENT_RANK0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.reason, "cannot be split over 40 ranks"));
    in.asked = TP_DRAFT_PLACEMENT_SHARDED;
    tp_error_clear(&err);
    CU_ASSERT_NOT_EQUAL(tp_parallel_draft_placement(&in, &r, &err), TP_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "--draft-placement rank0"));
    /* bad figures */
    const double bad[2] = {100, 0};
    in = (struct tp_draft_place_input){&small, &t, 2, NULL, TP_DRAFT_PLACEMENT_AUTO, bad, 10.0};
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_parallel_draft_placement(&in, &r, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "rank 1's memory bandwidth"));
    in.mem_bw_gbs = bw;
    in.allsum_us = -1;
    CU_ASSERT_EQUAL(tp_parallel_draft_placement(&in, &r, &err), TP_ERR_INVALID_ARG);
    enum tp_draft_placement pl;
    CU_ASSERT_EQUAL(tp_draft_placement_parse("sharded", &pl, NULL), TP_OK);
    CU_ASSERT_EQUAL(pl, TP_DRAFT_PLACEMENT_SHARDED);
    CU_ASSERT_EQUAL(tp_draft_placement_parse("rank0", &pl, NULL), TP_OK);
    CU_ASSERT_EQUAL(pl, TP_DRAFT_PLACEMENT_RANK0);
    tp_error_clear(&err);
    CU_ASSERT_EQUAL(tp_draft_placement_parse("everywhere", &pl, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "auto"));
}

static const struct tp_test_case plan_cases[] = {
    {"draft_placement", test_draft_placement},
    {"moe_splits", test_moe_splits},
    {"moe_shared_expert", test_moe_shared_expert},
    {"moe_block_limits", test_moe_block_limits},
    {"stories_shapes", test_stories_shapes},
    {"llama_uneven", test_llama_uneven},
    {"kquant_blocks", test_kquant_blocks},
    {"weighted", test_weighted},
    {"parse_weights", test_parse_weights},
    {"refusals_and_hash", test_refusals_and_hash},
    {NULL, NULL},
};
TP_TEST_SUITE(plan, "unit", 60, plan_cases)

/*
 * tests/parallel/test_kquant.c - tensor parallelism over a Q4_K_M model
 * (`synth --type q4_k_m`: Q4_K matrices, Q6_K head and attn_v / ffn_down
 * on the "more bits" layers).
 *
 * The shape is chosen so that an even split would cut 256-value
 * super-blocks at 2 and 3 ranks: 16 heads of 64 (attn_output columns move in
 * 4-head units = one 256-column block; 4 units over 3 ranks = 2,1,1 instead
 * of 6,5,5 heads) and an FFN of 1280 = 5 blocks (2,2,1 and 3,2 instead of
 * 427/853 and 640).  Oracles:
 *  - plan (from the file's own tensor types through the probe): every
 *    row-parallel boundary (attn_output and ffn_down columns) on a multiple
 *    of 256, `moved` set and the note saying so;
 *  - N = 2 and N = 3 real ranks (TCP ring on 127.0.0.1) against N = 1, 48
 *    greedy steps, free and teacher-forced, on the models of seeds 1 to 4,
 *    under the near-tie rule (mr_near_tie_violations in mr_impl.h): each
 *    rank multiplies the same whole super-blocks the single rank does, but
 *    the float order of the all_sum differs, and the Q8_K re-quantization of
 *    the summed activations turns a last-bit difference into a whole int8
 *    step now and then.  Measured: final logits of teacher-forced runs move
 *    by a normalized MSE of 1e-4 to 2.5e-4, i.e. each logit by ~1.5% of the
 *    logits' rms and a difference of two logits by ~2%; F32 models move by
 *    1e-13.  So a step whose N = 1 top-2 gap is below tau = 8% of the rms
 *    (4x that shift) is a near-tie that may flip; a difference anywhere else
 *    fails.  Teacher-forced final logits stay within a normalized MSE of 1e-3.
 *    A cut super-block, a wrong scale or a lost partial sum moves logits by
 *    a normalized MSE of order 1 and fails both checks at once.
 * The same rule holds a Qwen3-MoE as Q4_K_M and as Q8_0 to one rank, both
 * expert splits (moe_quant_seed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth.h"
#include "mr_impl.h"
#include "parallel/parallel_impl.h"
#include "tp_test.h"

static const char *kq_model(enum tp_synth_mix mix, enum tp_wtype type, uint64_t seed)
{
    struct tp_shape s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "test-kq-tp");
    s.arch = TP_ARCH_LLAMA;
    s.n_embd = 1024;
    s.n_layer = 4; /* more bits (Q6_K attn_v, ffn_down) on layers 2 and 3 */
    s.n_head = 16;
    s.n_head_kv = 4;
    s.head_dim = 64;
    s.n_ff = 1280;
    s.n_vocab = 512;
    s.n_ctx = 256;
    s.rope_theta = 10000.0f;
    s.norm_eps = 1e-5f;
    return mr_synth_shape(&s, type, mix, seed, NULL);
}

static const char *q4km_model_seed(uint64_t seed) { return kq_model(TP_SYNTH_MIX_Q4_K_M, TP_WTYPE_Q4_K, seed); }
static const char *q4km_model(void) { return q4km_model_seed(1); }

static void test_plan_q4_k_m(void)
{
    const char *m = q4km_model();
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    struct tp_model_probe pr;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL_FATAL(tp_model_probe(m, &pr, &e), TP_OK);
    /* the probe saw the mix: layer 0 is Q4_K, the head Q6_K */
    CU_ASSERT_EQUAL(pr.types.attn_o, TP_WTYPE_Q4_K);
    CU_ASSERT_EQUAL(pr.types.ffn_down, TP_WTYPE_Q4_K);
    CU_ASSERT_EQUAL(pr.types.output, TP_WTYPE_Q6_K);
    static const int want_heads[2][4] = {{0, 8, 16, -1}, {0, 8, 12, 16}};
    static const int want_ff[2][4] = {{0, 768, 1280, -1}, {0, 512, 1024, 1280}};
    for (int world = 2; world <= 3; world++) {
        struct tp_shard_plan p;
        CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&pr.hp, &pr.types, world, NULL, &p, &e), TP_OK);
        CU_ASSERT_EQUAL(p.ff_unit, 256);
        CU_ASSERT_EQUAL(p.head_unit, 4);
        for (int r = 0; r < world; r++) {
            const struct tp_model_shard *s = &p.ranks[r].shard;
            /* attn_output (row-parallel) columns = heads x 64, ffn_down columns = FFN range */
            CU_ASSERT_EQUAL((s->q_head_begin * 64) % 256, 0);
            CU_ASSERT_EQUAL((s->q_head_end * 64) % 256, 0);
            CU_ASSERT_EQUAL(s->ff_begin % 256, 0);
            CU_ASSERT(s->ff_end % 256 == 0 || s->ff_end == 1280);
            CU_ASSERT_EQUAL(s->q_head_begin, want_heads[world - 2][r]);
            CU_ASSERT_EQUAL(s->q_head_end, want_heads[world - 2][r + 1]);
            CU_ASSERT_EQUAL(s->ff_begin, want_ff[world - 2][r]);
            CU_ASSERT_EQUAL(s->ff_end, want_ff[world - 2][r + 1]);
        }
        CU_ASSERT_EQUAL(p.moved, 1);
        CU_ASSERT_PTR_NOT_NULL(strstr(p.note, "FFN split moved to 256-column block boundaries"));
        if (world == 3) CU_ASSERT_PTR_NOT_NULL(strstr(p.note, "head split moved to 4-head units"));
        fprintf(stderr, "N=%d plan: %s\n", world, p.note);
    }
}

/* Rank exit codes, with the messages of those that failed. */
static void check_ranks(const struct mr_run *r, const char *what)
{
    for (int k = 0; k < r->world; k++) {
        if (r->exit_code[k] != 0) fprintf(stderr, "%s: rank %d exit %d: %s\n", what, k, r->exit_code[k], r->msg[k]);
        CU_ASSERT_EQUAL(r->exit_code[k], 0);
    }
}

static void tp_q4_k_m_seed(uint64_t seed)
{
    enum { STEPS = 48 };
    const double tau = 0.08; /* near-tie: N = 1's top-2 gap below 8% of its logits' rms (see the top) */
    const char *m = q4km_model_seed(seed);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    struct mr_run ref, r;
    mr_init(&ref, m, 1);
    ref.n_steps = STEPS;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    check_ranks(&ref, "q4_k_m N=1");
    CU_ASSERT_EQUAL_FATAL(ref.n_tokens, STEPS + 1);
    int distinct = 0; /* a constant token would match anything */
    for (int i = 1; i < ref.n_tokens; i++) distinct += ref.tokens[i] != ref.tokens[0];
    CU_ASSERT(distinct > 0);
    /* the rule has power only on decisive steps (not near-ties): the teacher-forced runs must match
     * N = 1 on at least 16 of them, which a wrong sum (flipping most decisive steps) cannot do */
    int n_decisive = ref.n_tokens - mr_near_ties(&ref, tau);
    fprintf(stderr, "q4_k_m seed %d N=1: %d of %d steps decisive (top-2 gap >= %.2f rms)\n", (int)seed, n_decisive,
            ref.n_tokens, tau);
    CU_ASSERT(n_decisive >= 16);
    for (int world = 2; world <= 3; world++) {
        for (int forced = 0; forced <= 1; forced++) {
            char what[96];
            snprintf(what, sizeof what, "q4_k_m seed %d N=%d %s", (int)seed, world, forced ? "teacher-forced" : "free greedy");
            mr_init(&r, m, world);
            r.n_steps = STEPS;
            if (forced) r.force0 = ref.tokens;
            CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
            check_ranks(&r, what);
            CU_ASSERT_EQUAL_FATAL(r.n_tokens, ref.n_tokens);
            CU_ASSERT_EQUAL(mr_near_tie_violations(&ref, &r, tau, forced, what), 0);
            if (forced) {
                double e = mr_nmse(r.logits, ref.logits, r.n_vocab);
                fprintf(stderr, "%s: final logits nmse %.3g; %.2f s\n", what, e, r.seconds);
                CU_ASSERT(e <= 1e-3);
            }
            mr_free(&r);
        }
    }
    mr_free(&ref);
}

static void test_tp_q4_k_m(void)
{
    for (uint64_t seed = 1; seed <= 4; seed++) tp_q4_k_m_seed(seed);
}

/* ---- mixture of experts, quantized beyond Q4_0: a Qwen3-MoE (16 heads of 64, like the dense shape above)
 * of 8 experts x 512 columns (2 super-blocks),
 * top 2, as llama-quantize's Q4_K_M mix (Q4_K experts, Q6_K where it puts more bits) and as Q8_0.  At 2
 * ranks both splits (the column split cuts each expert on its 256 boundary), at 3 ranks the experts
 * (2 blocks cannot go to 3 ranks: the plan picks whole experts).  Same oracle and rule as the dense
 * Q4_K_M check above: N = 1's greedy tokens under the near-tie rule (tau = 8% of the logits' rms), at
 * least 16 decisive steps, teacher-forced final logits within a normalized MSE of 1e-3. */
static const char *moe_q_model(enum tp_synth_mix mix, enum tp_wtype type, uint64_t seed)
{
    struct tp_shape s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "test-moe-q");
    s.arch = TP_ARCH_QWEN3MOE;
    s.n_embd = 1024;
    s.n_layer = 2;
    s.n_head = 16; /* attn_output moves in 4-head units (256 columns): 4 units go to 3 ranks */
    s.n_head_kv = 4;
    s.head_dim = 64;
    s.n_ff = 512;
    s.n_ff_exp = 512;
    s.n_expert = 8;
    s.n_expert_used = 2;
    s.n_vocab = 512;
    s.n_ctx = 256;
    s.qk_norm = 1;
    s.rope_theta = 1000000.0f;
    s.norm_eps = 1e-6f;
    return mr_synth_shape(&s, type, mix, seed, NULL);
}

static void moe_quant_seed(enum tp_synth_mix mix, enum tp_wtype type, uint64_t seed, const char *name)
{
    enum { STEPS = 48 };
    const double tau = 0.08;
    const char *m = moe_q_model(mix, type, seed);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    struct mr_run ref, r;
    mr_init(&ref, m, 1);
    ref.n_steps = STEPS;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    check_ranks(&ref, name);
    CU_ASSERT_EQUAL_FATAL(ref.n_tokens, STEPS + 1);
    int n_decisive = ref.n_tokens - mr_near_ties(&ref, tau);
    fprintf(stderr, "%s seed %d N=1: %d of %d steps decisive\n", name, (int)seed, n_decisive, ref.n_tokens);
    CU_ASSERT(n_decisive >= 16);
    /* seed 1 also at 4 ranks and weighted 2,1,1 (whole experts: 2 super-blocks per expert row) */
    static const struct {
        int world;
        enum tp_moe_split split;
        const char *weights;
    } runs[] = {{2, TP_MOE_SPLIT_TENSOR, NULL},
                {2, TP_MOE_SPLIT_EXPERT, NULL},
                {3, TP_MOE_SPLIT_AUTO, NULL},
                {4, TP_MOE_SPLIT_AUTO, NULL},
                {3, TP_MOE_SPLIT_EXPERT, "2,1,1"}};
    for (size_t i = 0; i < TP_ARRAY_LEN(runs); i++) {
        if (i >= 3 && seed != 1) break;
        for (int forced = 0; forced <= 1; forced++) {
            char what[160];
            snprintf(what, sizeof what, "%s seed %d N=%d %s%s%s %s", name, (int)seed, runs[i].world,
                     tp_moe_split_name(runs[i].split), runs[i].weights ? " weights " : "",
                     runs[i].weights ? runs[i].weights : "", forced ? "teacher-forced" : "free greedy");
            mr_init(&r, m, runs[i].world);
            r.n_steps = STEPS;
            r.moe_split = runs[i].split;
            r.weights = runs[i].weights;
            if (forced) r.force0 = ref.tokens;
            CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
            check_ranks(&r, what);
            /* auto: whole experts where the 512 columns do not split evenly in blocks (3 ranks; 2 K-quant
             * super-blocks at 4), the column split where they do (Q8_0: 16 blocks over 4 ranks) */
            const int q8_even = type == TP_WTYPE_Q8_0 && runs[i].world == 4;
            CU_ASSERT_EQUAL(r.plan_split, runs[i].split != TP_MOE_SPLIT_AUTO ? (int)runs[i].split
                                          : q8_even                          ? (int)TP_MOE_SPLIT_TENSOR
                                                                             : (int)TP_MOE_SPLIT_EXPERT);
            CU_ASSERT_EQUAL_FATAL(r.n_tokens, ref.n_tokens);
            CU_ASSERT_EQUAL(mr_near_tie_violations(&ref, &r, tau, forced, what), 0);
            if (forced) {
                double e = mr_nmse(r.logits, ref.logits, r.n_vocab);
                fprintf(stderr, "%s: final logits nmse %.3g\n", what, e);
                CU_ASSERT(e <= 1e-3);
            }
            mr_free(&r);
        }
    }
    mr_free(&ref);
}

static void test_moe_q4_k_m(void)
{
    for (uint64_t seed = 1; seed <= 2; seed++) moe_quant_seed(TP_SYNTH_MIX_Q4_K_M, TP_WTYPE_Q4_K, seed, "moe q4_k_m");
}

static void test_moe_q8_0(void)
{
    for (uint64_t seed = 1; seed <= 2; seed++) moe_quant_seed(TP_SYNTH_MIX_NONE, TP_WTYPE_Q8_0, seed, "moe q8_0");
}

static const struct tp_test_case kquant_plan_cases[] = {
    {"plan_q4_k_m", test_plan_q4_k_m},
    {NULL, NULL},
};
TP_TEST_SUITE(kquant_plan, "unit", 60, kquant_plan_cases)

static const struct tp_test_case kquant_tp_cases[] = {
    {"tp_q4_k_m", test_tp_q4_k_m},
    {"moe_q4_k_m_tensor_expert", test_moe_q4_k_m},
    {"moe_q8_0_tensor_expert", test_moe_q8_0},
    {NULL, NULL},
};
TP_TEST_SUITE(kquant_tp, "multirank,model", 300, kquant_tp_cases)

/*
 * tests/parallel/test_multirank.c - N real ranks (forked processes, TCP ring
 * on 127.0.0.1) against the single-rank oracle.
 *
 * Oracle: the same engine at N = 1 (no network, whole model).  Sharded runs
 * must produce the identical greedy token sequences (two sequences decoded
 * together, one cleared and restarted halfway) and final logits within a
 * normalized MSE of 1e-10 (F32 models: only the summation order of the
 * all_sums and of the row-parallel matmuls differs, which moves logits by a
 * few ulps, far below 1e-10 relative energy).  Quantized models: identical
 * greedy tokens (block boundaries are never cut, so each rank multiplies the
 * same quantized blocks the single rank would).  Refusals must reach every
 * rank with a message, and nothing may hang (every run has a deadline after
 * which ranks are killed and the test fails).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "mr_impl.h"
#include "parallel/probe.h"
#include "tp_test.h"

static const char *cut_shards(const char *model, int world, const char *weights, char *pat, size_t cap);

/* The bundled model's path; NULL after recording a skip when the checkout lacks it. */
static const char *stories(void)
{
    const char *p = tp_test_repo_path("models/stories260K.gguf");
    FILE *f = fopen(p, "rb");
    if (!f) {
        tp_test_skip("models/stories260K.gguf not found");
        return NULL;
    }
    fclose(f);
    return p;
}

/* Run at world n and compare with the reference run ref. */
static void expect_same(const struct mr_run *ref, struct mr_run *r, double max_nmse, const char *what)
{
    CU_ASSERT_EQUAL_FATAL(mr_exec(r), 0);
    for (int k = 0; k < r->world; k++) {
        if (r->exit_code[k] != 0) fprintf(stderr, "%s: rank %d exit %d: %s\n", what, k, r->exit_code[k], r->msg[k]);
        CU_ASSERT_EQUAL(r->exit_code[k], 0);
    }
    CU_ASSERT_EQUAL_FATAL(r->n_tokens, ref->n_tokens);
    int same0 = memcmp(r->tokens, ref->tokens, sizeof(int32_t) * (size_t)r->n_tokens) == 0;
    int same1 = memcmp(r->tokens1, ref->tokens1, sizeof(int32_t) * (size_t)r->n_tokens) == 0;
    if (!same0 || !same1) {
        for (int i = 0; i < r->n_tokens; i++)
            if (r->tokens[i] != ref->tokens[i] || r->tokens1[i] != ref->tokens1[i]) {
                fprintf(stderr, "%s: first difference at step %d: seq0 %d vs %d, seq1 %d vs %d\n", what, i,
                        r->tokens[i], ref->tokens[i], r->tokens1[i], ref->tokens1[i]);
                break;
            }
    }
    CU_ASSERT(same0);
    CU_ASSERT(same1);
    double e = r->logits && ref->logits && r->n_vocab == ref->n_vocab ? mr_nmse(r->logits, ref->logits, r->n_vocab) : -1;
    fprintf(stderr, "%s: %d+%d greedy tokens %s, final logits nmse %.3g, %.2f s\n", what, r->n_tokens, r->n_tokens,
            same0 && same1 ? "identical" : "DIFFER", r->greedy_api ? 0.0 : e, r->seconds);
    if (max_nmse >= 0 && r->logits && ref->logits && !r->greedy_api) {
        CU_ASSERT_EQUAL_FATAL(r->n_vocab, ref->n_vocab);
        if (!(e <= max_nmse)) fprintf(stderr, "%s: logits nmse %.3g > %.3g\n", what, e, max_nmse);
        CU_ASSERT(e <= max_nmse);
    }
}

static void run_ref(struct mr_run *ref, const char *model, int steps)
{
    mr_init(ref, model, 1);
    ref->n_steps = steps;
    CU_ASSERT_EQUAL_FATAL(mr_exec(ref), 0);
    if (ref->exit_code[0] != 0) fprintf(stderr, "reference: %s\n", ref->msg[0]);
    CU_ASSERT_EQUAL_FATAL(ref->exit_code[0], 0);
    CU_ASSERT_EQUAL_FATAL(ref->n_tokens, steps + 1);
    /* the oracle must not be degenerate (a constant token would match anything) */
    int distinct = 0;
    for (int i = 1; i < ref->n_tokens; i++)
        distinct += ref->tokens[i] != ref->tokens[0] || ref->tokens1[i] != ref->tokens1[0];
    if (distinct == 0) fprintf(stderr, "%s: reference decodes one constant token %d\n", model, ref->tokens[0]);
    CU_ASSERT(distinct > 0);
}

/* N = 2, 3, 4 against the single rank; with apis, also weighted 2,1,1, the distributed argmax and the
 * distributed top-k at N = 3 (paths that do not depend on the model: run on one model). */
static void world_sweep(const char *model, int steps, const char *what, int apis)
{
    struct mr_run ref, r;
    run_ref(&ref, model, steps);
    for (int n = 2; n <= 4; n++) {
        char tag[128];
        snprintf(tag, sizeof tag, "%s N=%d", what, n);
        mr_init(&r, model, n);
        r.n_steps = steps;
        expect_same(&ref, &r, 1e-10, tag);
        CU_ASSERT(r.stats0.bytes_sent > 0);
        CU_ASSERT(r.stats0.ns_comm > 0);
        mr_free(&r);
    }
    if (!apis) {
        mr_free(&ref);
        return;
    }
    /* weighted 2,1,1 and the distributed argmax at N=3 */
    mr_init(&r, model, 3);
    r.n_steps = steps;
    r.weights = "2,1,1";
    char tag[128];
    snprintf(tag, sizeof tag, "%s weighted 2,1,1", what);
    expect_same(&ref, &r, 1e-10, tag);
    mr_free(&r);
    mr_init(&r, model, 3);
    r.n_steps = steps;
    r.greedy_api = 1;
    snprintf(tag, sizeof tag, "%s greedy api N=3", what);
    expect_same(&ref, &r, -1, tag);
    mr_free(&r);
    /* distributed top-k at N=3 (uneven vocabulary ranges): tokens, and the last step's top 8 and
     * log-sum-exp against the full logits of the single-rank run */
    mr_init(&r, model, 3);
    r.n_steps = steps;
    r.greedy_api = 2;
    snprintf(tag, sizeof tag, "%s top-k api N=3", what);
    expect_same(&ref, &r, -1, tag);
    double mx = ref.logits[0], sum = 0;
    for (int i = 1; i < ref.n_vocab; i++) mx = ref.logits[i] > mx ? ref.logits[i] : mx;
    for (int i = 0; i < ref.n_vocab; i++) sum += exp((double)ref.logits[i] - mx);
    CU_ASSERT_DOUBLE_EQUAL(r.lse, mx + log(sum), 1e-4 * (1.0 + fabs(mx)));
    for (int j = 0; j < 8; j++) {
        CU_ASSERT_FATAL(r.top_ids[j] >= 0 && r.top_ids[j] < ref.n_vocab);
        CU_ASSERT_DOUBLE_EQUAL(r.top_logits[j], ref.logits[r.top_ids[j]], 1e-4 * (1.0 + fabs(mx)));
        int above = 0;
        for (int i = 0; i < ref.n_vocab; i++) above += ref.logits[i] > r.top_logits[j] + 1e-4 * (1.0 + fabs(mx));
        CU_ASSERT(above <= j);
    }
    mr_free(&r);
    mr_free(&ref);
}

/* logit_bias in the step: every rank adds the entries of its vocabulary slice
 * before the gather / argmax / top-k.  Sequence 0 gets the bias (banning the
 * tokens the unbiased run decodes first, boosting one), sequence 1 none.
 * Oracles: the single-rank run teacher-forced with the biased run's tokens
 * and no bias has the same final logits except -inf at the banned ids and
 * +bias at the boosted one; every layout and step API decodes the same
 * tokens; banning all tokens but one decodes only that one. */
static void test_logit_bias(void)
{
    const char *m = stories();
    if (!m) return;
    const int steps = 12;
    struct mr_run ref, b1, forced, r;
    run_ref(&ref, m, steps);
    int32_t ids[8];
    float vals[8];
    int nb = 0;
    for (int i = 0; i < ref.n_tokens && nb < 3; i++) {
        int dup = 0;
        for (int k = 0; k < nb; k++) dup |= ids[k] == ref.tokens[i];
        if (!dup) {
            ids[nb] = ref.tokens[i];
            vals[nb++] = -100.0f;
        }
    }
    const int boost = (ids[0] + 7) % ref.n_vocab == ids[1] ? (ids[0] + 8) % ref.n_vocab : (ids[0] + 7) % ref.n_vocab;
    ids[nb] = boost;
    vals[nb++] = 4.5f;
    mr_init(&b1, m, 1);
    b1.n_steps = steps;
    b1.n_bias = nb;
    b1.bias_id = ids;
    b1.bias_val = vals;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&b1), 0);
    CU_ASSERT_EQUAL_FATAL(b1.exit_code[0], 0);
    CU_ASSERT_EQUAL_FATAL(b1.n_tokens, ref.n_tokens);
    CU_ASSERT(b1.tokens[0] != ref.tokens[0]);
    for (int i = 0; i < b1.n_tokens; i++)
        for (int k = 0; k < nb - 1; k++) CU_ASSERT(b1.tokens[i] != ids[k]);
    CU_ASSERT(memcmp(b1.tokens1, ref.tokens1, sizeof(int32_t) * (size_t)ref.n_tokens) == 0); /* unbiased row */
    mr_init(&forced, m, 1);
    forced.n_steps = steps;
    forced.force0 = b1.tokens;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&forced), 0);
    CU_ASSERT_EQUAL_FATAL(forced.exit_code[0], 0);
    int best = 0;
    float best_v = -INFINITY;
    for (int i = 0; i < ref.n_vocab; i++) {
        float want = forced.logits[i];
        for (int k = 0; k < nb; k++)
            if (ids[k] == i) want = vals[k] <= -100.0f ? -INFINITY : want + vals[k];
        if (!(b1.logits[i] == want)) fprintf(stderr, "logit_bias: token %d: %g, want %g\n", i, b1.logits[i], want);
        CU_ASSERT(b1.logits[i] == want);
        if (want > best_v) {
            best_v = want;
            best = i;
        }
    }
    CU_ASSERT_EQUAL(b1.tokens[b1.n_tokens - 1], best);
    /* the same at N = 2 and 3 through the logits gather, the distributed argmax and top-k */
    for (int world = 2; world <= 3; world++)
        for (int api = 0; api <= 2; api++) {
            char tag[96];
            snprintf(tag, sizeof tag, "logit_bias N=%d api %d", world, api);
            mr_init(&r, m, world);
            r.n_steps = steps;
            r.greedy_api = api;
            r.n_bias = nb;
            r.bias_id = ids;
            r.bias_val = vals;
            expect_same(&b1, &r, -1, tag);
            if (api == 0) { /* banned logits -inf on every layout, the rest as close as without a bias */
                double num = 0, den = 0;
                for (int i = 0; i < r.n_vocab; i++) {
                    if (isinf(b1.logits[i])) {
                        CU_ASSERT(isinf(r.logits[i]) && r.logits[i] < 0);
                        continue;
                    }
                    double d = (double)r.logits[i] - (double)b1.logits[i];
                    num += d * d;
                    den += (double)b1.logits[i] * (double)b1.logits[i];
                }
                CU_ASSERT(num <= 1e-10 * den);
            }
            if (api == 2)
                for (int j = 0; j < 8; j++)
                    for (int k = 0; k < nb - 1; k++) CU_ASSERT(r.top_ids[j] != ids[k]);
            mr_free(&r);
        }
    /* ban all but one token */
    int32_t *all = malloc(sizeof(int32_t) * (size_t)ref.n_vocab);
    float *ban = malloc(sizeof(float) * (size_t)ref.n_vocab);
    CU_ASSERT_PTR_NOT_NULL_FATAL(all);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ban);
    const int keep = 42;
    int n = 0;
    for (int i = 0; i < ref.n_vocab; i++)
        if (i != keep) {
            all[n] = i;
            ban[n++] = -100.0f;
        }
    for (int world = 1; world <= 2; world++)
        for (int api = 0; api <= 2; api++) {
            if (world == 1 && api > 0) continue;
            mr_init(&r, m, world);
            r.n_steps = 6;
            r.greedy_api = api;
            r.n_bias = n;
            r.bias_id = all;
            r.bias_val = ban;
            CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
            for (int k = 0; k < world; k++) CU_ASSERT_EQUAL(r.exit_code[k], 0);
            CU_ASSERT_EQUAL(r.n_tokens, 7);
            for (int i = 0; i < r.n_tokens; i++) CU_ASSERT_EQUAL(r.tokens[i], keep);
            if (api == 2) CU_ASSERT(isfinite(r.lse) && r.top_ids[0] == keep);
            mr_free(&r);
        }
    free(all);
    free(ban);
    mr_free(&forced);
    mr_free(&b1);
    mr_free(&ref);
}

/* The rank hook (tp_parallel_run_hook): at N = 3 rank 0 gets every rank's
 * own values (its rank, the argument, the weight bytes it holds), NaN from
 * the rank that registered none, and the steps after it decode exactly as
 * without it. */
static void test_rank_hook(void)
{
    const char *m = mr_synth_model("gqa", TP_WTYPE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    struct mr_run ref, r;
    run_ref(&ref, m, 8);
    mr_init(&r, m, 3);
    r.n_steps = 8;
    r.hook = 1;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < 3; k++) {
        if (r.exit_code[k] != 0) fprintf(stderr, "rank hook: rank %d exit %d: %s\n", k, r.exit_code[k], r.msg[k]);
        CU_ASSERT_EQUAL(r.exit_code[k], 0);
    }
    const double *v = r.hook_values;
    for (int k = 0; k < 2; k++) {
        CU_ASSERT_EQUAL(v[k * TP_PARALLEL_HOOK_VALUES + 0], (double)k);
        CU_ASSERT_EQUAL(v[k * TP_PARALLEL_HOOK_VALUES + 1], 42.0);
        CU_ASSERT_EQUAL(v[k * TP_PARALLEL_HOOK_VALUES + 2], (double)r.weight_bytes[k]);
        CU_ASSERT_EQUAL(v[k * TP_PARALLEL_HOOK_VALUES + 3], -1.0);
    }
    for (int i = 0; i < TP_PARALLEL_HOOK_VALUES; i++) CU_ASSERT(isnan(v[2 * TP_PARALLEL_HOOK_VALUES + i]));
    CU_ASSERT(r.weight_bytes[0] > 0 && r.weight_bytes[1] > 0);
    CU_ASSERT_EQUAL_FATAL(r.n_tokens, ref.n_tokens);
    CU_ASSERT_EQUAL(memcmp(r.tokens, ref.tokens, sizeof(int32_t) * (size_t)r.n_tokens), 0);
    mr_free(&r);
    mr_free(&ref);
}

/* A step with a KV copy (prefix sharing between slots, every rank copying its
 * slice): sequence 0 decodes exactly as without it, sequence 1 exactly as
 * before up to the copy and then exactly what sequence 0 decodes (it holds
 * the same positions and is fed the same tokens), at N = 1, 2 and 3. */
static void test_kv_copy(void)
{
    const char *m = mr_synth_model("gqa", TP_WTYPE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    const int steps = 32, half = steps / 2;
    struct mr_run ref, r;
    run_ref(&ref, m, steps);
    for (int n = 1; n <= 3; n++) {
        mr_init(&r, m, n);
        r.n_steps = steps;
        r.copy_restart = 1;
        CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
        for (int k = 0; k < n; k++) {
            if (r.exit_code[k] != 0) fprintf(stderr, "kv copy N=%d: rank %d exit %d: %s\n", n, k, r.exit_code[k], r.msg[k]);
            CU_ASSERT_EQUAL(r.exit_code[k], 0);
        }
        CU_ASSERT_EQUAL_FATAL(r.n_tokens, steps + 1);
        CU_ASSERT_EQUAL(memcmp(r.tokens, ref.tokens, sizeof(int32_t) * (size_t)r.n_tokens), 0);
        CU_ASSERT_EQUAL(memcmp(r.tokens1, ref.tokens1, sizeof(int32_t) * (size_t)(half + 1)), 0);
        int same = 0;
        for (int s = half + 1; s < r.n_tokens; s++) same += r.tokens1[s] == r.tokens[s];
        if (same != r.n_tokens - half - 1)
            fprintf(stderr, "kv copy N=%d: sequence 1 follows sequence 0 in %d of %d steps after the copy\n", n, same,
                    r.n_tokens - half - 1);
        CU_ASSERT_EQUAL(same, r.n_tokens - half - 1);
        /* not trivially so: without the copy sequence 1 decodes something else after the restart */
        int differ = 0;
        for (int s = half + 1; s < r.n_tokens; s++) differ += ref.tokens1[s] != ref.tokens[s];
        CU_ASSERT(differ > 0);
        mr_free(&r);
    }
    mr_free(&ref);
}

static void test_stories_worlds(void)
{
    const char *m = stories();
    if (!m) return;
    world_sweep(m, 128, "stories260K", 1);
}

static void test_synth_gqa_f32(void)
{
    const char *m = mr_synth_model("gqa", TP_WTYPE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    world_sweep(m, 64, "synthetic gqa f32", 0);
}

static void test_synth_quant(void)
{
    const enum tp_wtype types[] = {TP_WTYPE_Q8_0, TP_WTYPE_Q4_0};
    for (size_t t = 0; t < TP_ARRAY_LEN(types); t++) {
        const char *m = mr_synth_model("gqa", types[t]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(m);
        struct mr_run ref, r;
        run_ref(&ref, m, 64);
        for (int n = 2; n <= 4; n += 2) {
            char tag[128];
            snprintf(tag, sizeof tag, "synthetic %s N=%d", tp_wtype_name(types[t]), n);
            mr_init(&r, m, n);
            r.n_steps = 64;
            expect_same(&ref, &r, -1, tag);
            mr_free(&r);
        }
        mr_free(&ref);
    }
}

/* Qwen2 (QKV biases, tied head) and Qwen3 (per-head q/k RMSNorm, head_dim != n_embd/n_head):
 * sharded biases and norms, at N = 2, 3 (KV heads replicated) and 4, and from shard files. */
static void test_synth_qwen(void)
{
    const char *shapes[] = {"test-tiny-qwen2", "test-tiny-qwen3"};
    for (size_t i = 0; i < TP_ARRAY_LEN(shapes); i++) {
        const char *m = mr_synth_model(shapes[i], TP_WTYPE_F32);
        CU_ASSERT_PTR_NOT_NULL_FATAL(m);
        struct mr_run ref, r;
        run_ref(&ref, m, 48);
        for (int n = 2; n <= 4; n++) {
            char tag[128];
            snprintf(tag, sizeof tag, "%s N=%d", shapes[i], n);
            mr_init(&r, m, n);
            r.n_steps = 48;
            expect_same(&ref, &r, 1e-10, tag);
            mr_free(&r);
        }
        char pat[1024], tag[128];
        CU_ASSERT_PTR_NOT_NULL_FATAL(cut_shards(m, 3, NULL, pat, sizeof pat));
        mr_init(&r, pat, 3);
        r.shard_files = 1;
        r.n_steps = 48;
        snprintf(tag, sizeof tag, "%s shard files N=3", shapes[i]);
        expect_same(&ref, &r, 1e-10, tag);
        mr_free(&r);
        mr_free(&ref);
    }
}

static void test_refused_everywhere(void)
{
    const char *m = stories();
    if (!m) return;
    /* a split that cannot be made: rank 2's weight leaves it without heads */
    struct mr_run r;
    mr_init(&r, m, 3);
    r.weights = "100,100,1";
    r.deadline_s = 40;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < 3; k++) {
        CU_ASSERT_EQUAL(r.exit_code[k], 3);
        CU_ASSERT(strstr(r.msg[k], "rank 2") != NULL);
        CU_ASSERT(strstr(r.msg[k], "too small") != NULL);
        CU_ASSERT_STRING_EQUAL(r.msg[k], r.msg[0]);
    }
    mr_free(&r);
    /* ranks that disagree about the plan (the last one was given other weights) */
    mr_init(&r, m, 3);
    r.weights = "2,1,1";
    r.weights_last = "1,1,2";
    r.deadline_s = 40;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < 3; k++) {
        CU_ASSERT_EQUAL(r.exit_code[k], 3);
        CU_ASSERT(strstr(r.msg[k], "rank 2 disagrees with rank 0 on the sharding plan") != NULL);
    }
    mr_free(&r);
    /* a missing file on one rank only */
    char pat[512];
    snprintf(pat, sizeof pat, "%s", m);
    mr_init(&r, "/nonexistent/tp-model-%d.gguf", 2);
    r.shard_files = 1;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < 2; k++) {
        CU_ASSERT_EQUAL(r.exit_code[k], 3);
        CU_ASSERT(strstr(r.msg[k], "rank 0 of 2 failed") != NULL);
    }
    mr_free(&r);
}

static void test_dead_peer(void)
{
    const char *m = stories();
    if (!m) return;
    struct mr_run r;
    mr_init(&r, m, 3);
    r.n_steps = MR_MAX_STEPS - 1; /* still generating when the last rank dies */
    r.kill_last_rank = 1;
    r.deadline_s = 40;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    /* rank 2 dies 0.3 s after start while rank 0 is still generating (>= 1.3 s): ranks 0 and 1 must
     * both fail their step with the reason, not hang */
    CU_ASSERT_EQUAL(r.exit_code[0], 4);
    CU_ASSERT_EQUAL(r.exit_code[1], 4);
    CU_ASSERT_EQUAL(r.exit_code[2], 9);
    CU_ASSERT(strstr(r.msg[0], "failed") != NULL);
    CU_ASSERT(strstr(r.msg[1], "failed") != NULL);
    fprintf(stderr, "dead peer: rank 0 says: %s\n", r.msg[0]);
    CU_ASSERT(r.seconds < 30);
    mr_free(&r);
}

/* A rank that loads much longer than the comm op timeout (slow disk, big
 * model): the others must wait for it (load-sync rounds), and an idle
 * engine must survive several op timeouts (rank 0's keepalive pings). */
static void test_slow_loader(void)
{
    const char *m = stories();
    if (!m) return;
    struct mr_run ref, r;
    run_ref(&ref, m, 16);
    mr_init(&r, m, 3);
    r.n_steps = 16;
    r.op_timeout_ms = 800; /* short, but not so short that a loaded CI machine trips it in normal steps */
    r.slow_load_ms = 3200; /* 4 op timeouts */
    expect_same(&ref, &r, 1e-10, "stories260K N=3, one rank loading 3.2 s with a 0.8 s op timeout");
    CU_ASSERT(r.seconds >= 3.2);
    mr_free(&r);
    /* an engine idle for 4 op timeouts: rank 0's keepalive pings keep the workers waiting */
    mr_init(&r, m, 3);
    r.n_steps = 16;
    r.op_timeout_ms = 800;
    r.idle_ms = 3200;
    expect_same(&ref, &r, 1e-10, "stories260K N=3, idle 3.2 s with a 0.8 s op timeout");
    mr_free(&r);
    mr_free(&ref);
}

static void test_wire_dtypes(void)
{
    const char *m = stories();
    if (!m) return;
    struct mr_run ref, r;
    run_ref(&ref, m, 64);
    const enum tp_wire_dtype dts[] = {TP_WIRE_F16, TP_WIRE_BF16, TP_WIRE_Q8};
    /* bounds on the final logits' normalized MSE vs f32 (measured ~1e-6, 1e-4, 1e-4 on this model;
     * the bounds leave 10-100x headroom but would catch a wrong scale or a dropped rank's share) */
    const double bound[] = {1e-4, 1e-2, 1e-2};
    for (size_t i = 0; i < 2 * TP_ARRAY_LEN(dts); i++) {
        const int world = i < TP_ARRAY_LEN(dts) ? 2 : 3;
        mr_init(&r, m, world);
        r.n_steps = 64;
        r.wire = dts[i % TP_ARRAY_LEN(dts)];
        CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
        for (int k = 0; k < world; k++) CU_ASSERT_EQUAL(r.exit_code[k], 0);
        CU_ASSERT_EQUAL_FATAL(r.n_tokens, ref.n_tokens);
        int agree = 0;
        for (int k = 0; k < r.n_tokens; k++) agree += r.tokens[k] == ref.tokens[k];
        /* compare logits of the first step (same inputs): the prompt's next-token distribution */
        fprintf(stderr, "wire %s N=%d: %d/%d greedy tokens equal to f32, final logits nmse %.3g\n",
                tp_wire_dtype_name(r.wire), world, agree, r.n_tokens, r.logits ? mr_nmse(r.logits, ref.logits, r.n_vocab) : -1.0);
        CU_ASSERT(r.tokens[0] == ref.tokens[0]);
        if (agree == r.n_tokens) CU_ASSERT(mr_nmse(r.logits, ref.logits, r.n_vocab) < bound[i % TP_ARRAY_LEN(dts)]);
        mr_free(&r);
    }
    mr_free(&ref);
}

/* Cut shards into a fresh directory; returns the printf pattern of the rank files. */
static const char *cut_shards(const char *model, int world, const char *weights, char *pat, size_t cap)
{
    static int n;
    char dir[600], name[256], cmd[700];
    snprintf(dir, sizeof dir, "%s/shards%d", tp_test_tmpdir(), ++n);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0) return NULL;
    struct tp_error e = {0};
    if (tp_parallel_write_shards(model, world, weights, dir, &e) != TP_OK) {
        fprintf(stderr, "cut_shards: %s\n", e.msg);
        return NULL;
    }
    tp_parallel_shard_name(model, 0, world, name, sizeof name);
    char *r0 = strstr(name, ".rank0-");
    if (!r0) return NULL;
    *r0 = '\0';
    snprintf(pat, cap, "%s/%s.rank%%d-of-%d.gguf", dir, name, world);
    return pat;
}

static void test_shard_files(void)
{
    const char *m = stories();
    if (!m) return;
    char pat3[1024], patw[1024], pat4[1024], patq[1024];
    struct mr_run ref, r;
    run_ref(&ref, m, 64);
    /* round trip: shard files give the tokens and logits of the full file */
    CU_ASSERT_PTR_NOT_NULL_FATAL(cut_shards(m, 3, NULL, pat3, sizeof pat3));
    mr_init(&r, pat3, 3);
    r.shard_files = 1;
    r.n_steps = 64;
    expect_same(&ref, &r, 1e-10, "stories260K shard files N=3");
    /* each rank's file is smaller than the model: it holds only that rank's slices */
    char f0[1100];
    snprintf(f0, sizeof f0, pat3, 1);
    size_t full_len = 0, part_len = 0;
    free(tp_test_read_file(m, &full_len));
    free(tp_test_read_file(f0, &part_len));
    CU_ASSERT(part_len > 0 && part_len < full_len);
    mr_free(&r);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cut_shards(m, 3, "2,1,1", patw, sizeof patw));
    mr_init(&r, patw, 3);
    r.shard_files = 1;
    r.n_steps = 64;
    expect_same(&ref, &r, 1e-10, "stories260K shard files weighted 2,1,1");
    mr_free(&r);
    /* wrong combinations, refused on every rank */
    CU_ASSERT_PTR_NOT_NULL_FATAL(cut_shards(m, 4, NULL, pat4, sizeof pat4));
    mr_init(&r, pat4, 4); /* rank 1 gets rank 2's file and vice versa */
    r.shard_files = 1;
    r.file_of_rank[1] = 2;
    r.file_of_rank[2] = 1;
    r.deadline_s = 40;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < 4; k++) {
        CU_ASSERT_EQUAL(r.exit_code[k], 3);
        CU_ASSERT(strstr(r.msg[k], "holds the slice of rank 2 of 4, but this process is rank 1") != NULL);
    }
    mr_free(&r);
    mr_init(&r, pat4, 2); /* shards for 4 used by 2 */
    r.shard_files = 1;
    r.deadline_s = 40;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < 2; k++) {
        CU_ASSERT_EQUAL(r.exit_code[k], 3);
        CU_ASSERT(strstr(r.msg[k], "shard file for a world of 4 ranks, but this group has 2") != NULL);
    }
    mr_free(&r);
    mr_init(&r, patw, 3); /* cut with 2,1,1, run with 1,1,2 */
    r.shard_files = 1;
    r.weights = "1,1,2";
    r.deadline_s = 40;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < 3; k++) {
        CU_ASSERT_EQUAL(r.exit_code[k], 3);
        CU_ASSERT(strstr(r.msg[k], "was cut with --shard-weights '2,1,1'") != NULL);
    }
    mr_free(&r);
    mr_free(&ref);
    /* quantized: Q4_0 synthetic shards at N=2 */
    const char *q = mr_synth_model("gqa", TP_WTYPE_Q4_0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(q);
    run_ref(&ref, q, 32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cut_shards(q, 2, NULL, patq, sizeof patq));
    mr_init(&r, patq, 2);
    r.shard_files = 1;
    r.n_steps = 32;
    expect_same(&ref, &r, 1e-10, "synthetic q4_0 shard files N=2");
    mr_free(&r);
    mr_free(&ref);
}

/*
 * Each rank reads only its slice: the peak RSS of every rank (measured by
 * the kernel, so mapped-and-touched pages count, not just allocations) must
 * stay within 1.1 x the plan's bytes for that rank + RSS_ALLOWANCE, the
 * fixed cost of a rank that holds no weights at all: code, libc/BLAS/MPI
 * libraries, tokenizer, KV cache (2 slots x 512 positions), activations and
 * step buffers (a rank of stories260K, 1 MiB of weights, peaks at ~13 MiB;
 * 32 MiB allowed).  The model is tinyllama-1.1b's shape with 4 of its 22
 * layers in Q4_0 (166 MiB, 35 MiB of it the replicated token embedding,
 * which stays mapped and is only touched row by row), so a rank that read
 * the whole model would blow the bound at N = 4 (plan 68 MiB per rank,
 * bound 106 MiB): the test checks that it can fail.
 */
#define RSS_ALLOWANCE (32.0 * 1048576.0)
static void test_rss_per_rank(void)
{
#if defined(__SANITIZE_ADDRESS__)
    tp_test_skip("RSS bounds do not apply under AddressSanitizer (shadow memory and quarantine)");
    return;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    tp_test_skip("RSS bounds do not apply under AddressSanitizer (shadow memory and quarantine)");
    return;
#endif
#endif
    const char *m = mr_synth_model("tinyllama4", TP_WTYPE_Q4_0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    FILE *f = fopen(m, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fseek(f, 0, SEEK_END);
    long file_len = ftell(f);
    fclose(f);
    for (int n = 2; n <= 4; n += 2) {
        struct mr_run r;
        mr_init(&r, m, n);
        r.n_steps = 4;
        r.deadline_s = 120;
        CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
        for (int k = 0; k < n; k++) {
            CU_ASSERT_EQUAL(r.exit_code[k], 0);
            double bound = 1.1 * (double)r.plan_bytes[k] + RSS_ALLOWANCE;
            fprintf(stderr, "N=%d rank %d: plan %.1f MiB, weights held %.1f MiB, RSS after load %.1f MiB, peak %.1f MiB "
                            "(bound %.1f MiB)\n",
                    n, k, r.plan_bytes[k] / 1048576.0, r.weight_bytes[k] / 1048576.0, r.rss[k] / 1048576.0,
                    r.rss_peak[k] / 1048576.0, bound / 1048576.0);
            CU_ASSERT(r.rss_peak[k] > 0);
            CU_ASSERT((double)r.rss_peak[k] <= bound);
            CU_ASSERT(r.weight_bytes[k] <= r.plan_bytes[k]);
            if (n == 4) CU_ASSERT(bound < (double)file_len);
        }
        mr_free(&r);
    }
}

/* ---- mixture of experts: both splits at N = 2, 3, 4 and weighted 2,1,1 against one rank */

static void moe_sweep(const char *shape, enum tp_wtype type, int steps)
{
    /* F32: the ranks (forked from this process, which runs no attention itself) take the float32 attention,
     * where splitting changes only summation orders; the AMX-BF16 path, the default where the CPU has it,
     * also rounds each split's softmax weights to bf16 apart (~1e-10 here; greedy tokens still equal) */
    if (type == TP_WTYPE_F32) setenv("TP_ATTN_ISA", "avx512", 1);
    const char *m = mr_synth_model(shape, type);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    struct mr_run ref, r;
    run_ref(&ref, m, steps);
    const enum tp_moe_split splits[] = {TP_MOE_SPLIT_TENSOR, TP_MOE_SPLIT_EXPERT};
    for (size_t s = 0; s < TP_ARRAY_LEN(splits); s++) {
        for (int n = 2; n <= 5; n++) { /* 5: N = 3 with weights 2,1,1 */
            char tag[160];
            mr_init(&r, m, n == 5 ? 3 : n);
            r.n_steps = steps;
            r.moe_split = splits[s];
            if (n == 5) r.weights = "2,1,1";
            snprintf(tag, sizeof tag, "%s %s %s-parallel %s", shape, tp_wtype_name(type), tp_moe_split_name(splits[s]),
                     n == 5 ? "weighted 2,1,1" : (n == 2 ? "N=2" : n == 3 ? "N=3" : "N=4"));
            /* F32: only summation orders differ; quantized: the activations' Q8 rounding may move too */
            expect_same(&ref, &r, type == TP_WTYPE_F32 ? 1e-10 : -1, tag);
            CU_ASSERT_EQUAL(r.plan_split, (int)splits[s]);
            for (int k = 0; k < r.world; k++) {
                if (r.weight_bytes[k] > r.plan_bytes[k])
                    fprintf(stderr, "%s: rank %d holds %llu bytes, the plan says %llu\n", tag, k,
                            (unsigned long long)r.weight_bytes[k], (unsigned long long)r.plan_bytes[k]);
                CU_ASSERT(r.weight_bytes[k] <= r.plan_bytes[k]);
            }
            mr_free(&r);
        }
    }
    mr_free(&ref);
    if (type == TP_WTYPE_F32) unsetenv("TP_ATTN_ISA");
}

static void test_moe_qwen3moe_f32(void) { moe_sweep("test-tiny-qwen3moe", TP_WTYPE_F32, 48); }
static void test_moe_mixtral_f32(void) { moe_sweep("test-tiny-mixtral", TP_WTYPE_F32, 48); }
static void test_moe_qwen2moe_f32(void) { moe_sweep("test-tiny-qwen2moe", TP_WTYPE_F32, 48); }
/* gpt-oss (biases, sinks, windows, YaRN, clamped SwiGLU) with F32 weights: identical at every split */
static void test_moe_gptoss_f32(void) { moe_sweep("test-tiny-gptoss", TP_WTYPE_F32, 48); }

/* gpt-oss with MXFP4 experts (Q8_0 elsewhere) at N = 2 and 3, both splits: every token of the free
 * greedy and the teacher-forced runs is N = 1's argmax or within the near-tie rule (top-2 gap below
 * tau = 8% of the logits' rms, as tests/parallel/test_kquant.c), and the rule has power: at least 16
 * steps are decisive. */
static void test_moe_gptoss_mxfp4(void)
{
    enum { STEPS = 48 };
    const double tau = 0.08;
    const char *m = mr_synth_model("test-tiny-gptoss", TP_WTYPE_MXFP4);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    struct mr_run ref, r;
    mr_init(&ref, m, 1);
    ref.n_steps = STEPS;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    CU_ASSERT_EQUAL_FATAL(ref.n_tokens, STEPS + 1);
    const int n_decisive = ref.n_tokens - mr_near_ties(&ref, tau);
    fprintf(stderr, "gpt-oss mxfp4 N=1: %d of %d steps decisive (top-2 gap >= %.2f rms)\n", n_decisive, ref.n_tokens,
            tau);
    CU_ASSERT(n_decisive >= 16);
    const enum tp_moe_split splits[] = {TP_MOE_SPLIT_TENSOR, TP_MOE_SPLIT_EXPERT};
    for (size_t s = 0; s < TP_ARRAY_LEN(splits); s++)
        for (int world = 2; world <= 3; world++)
            for (int forced = 0; forced <= 1; forced++) {
                char what[128];
                snprintf(what, sizeof what, "gpt-oss mxfp4 %s-parallel N=%d %s", tp_moe_split_name(splits[s]), world,
                         forced ? "teacher-forced" : "free greedy");
                mr_init(&r, m, world);
                r.n_steps = STEPS;
                r.moe_split = splits[s];
                if (forced) r.force0 = ref.tokens;
                CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
                for (int k = 0; k < r.world; k++) {
                    if (r.exit_code[k] != 0) fprintf(stderr, "%s: rank %d exit %d: %s\n", what, k, r.exit_code[k], r.msg[k]);
                    CU_ASSERT_EQUAL(r.exit_code[k], 0);
                }
                CU_ASSERT_EQUAL_FATAL(r.n_tokens, ref.n_tokens);
                CU_ASSERT_EQUAL(r.plan_split, (int)splits[s]);
                CU_ASSERT_EQUAL(mr_near_tie_violations(&ref, &r, tau, forced, what), 0);
                if (forced) {
                    const double e = mr_nmse(r.logits, ref.logits, r.n_vocab);
                    fprintf(stderr, "%s: final logits nmse %.3g; %.2f s\n", what, e, r.seconds);
                    CU_ASSERT(e <= 1e-3);
                }
                mr_free(&r);
            }
    mr_free(&ref);
}

/* Q4_0 experts of 64 columns are 2 blocks: at 4 ranks the plan must pick whole experts by itself
 * (and refuse the column split when asked for it, on every rank, before loading anything). */
static void test_moe_block_limit(void)
{
    const char *m = mr_synth_model("test-tiny-qwen3moe", TP_WTYPE_Q4_0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    struct mr_run ref, r;
    run_ref(&ref, m, 32);
    mr_init(&r, m, 4);
    r.n_steps = 32;
    expect_same(&ref, &r, -1, "test-tiny-qwen3moe q4_0 auto N=4");
    CU_ASSERT_EQUAL(r.plan_split, (int)TP_MOE_SPLIT_EXPERT);
    mr_free(&r);
    mr_init(&r, m, 4);
    r.n_steps = 4;
    r.moe_split = TP_MOE_SPLIT_TENSOR;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < 4; k++) {
        CU_ASSERT_EQUAL(r.exit_code[k], 3);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.msg[k], "--moe-split expert"));
    }
    mr_free(&r);
    mr_free(&ref);
}

static const struct tp_test_case moe_cases[] = {
    {"qwen3moe_f32_tensor_expert", test_moe_qwen3moe_f32},
    {"mixtral_f32_tensor_expert", test_moe_mixtral_f32},
    {"qwen2moe_f32_tensor_expert", test_moe_qwen2moe_f32},
    {"gptoss_f32_tensor_expert", test_moe_gptoss_f32},
    {"gptoss_mxfp4_near_tie", test_moe_gptoss_mxfp4},
    {"q4_0_block_limit", test_moe_block_limit},
    {NULL, NULL},
};
TP_TEST_SUITE(moe_multirank, "multirank,model", 300, moe_cases)

/* ---- mixture-of-experts shard files (`tpserve shard --moe-split`) */

/* The shard file of rank `rank` holds exactly its slice: for every tensor of the source, the file's tensor
 * (or its absence) and bytes are those the plan's ranges select, recomputed here from the source file (the
 * stacked experts expert by expert and row by row); and the file's tensor bytes sum to the plan's
 * sharded + replicated bytes of that rank.  Returns the number of mismatches (printed). */
static int check_moe_shard_file(const char *src_path, const char *shard_path, const struct tp_shard_plan *plan,
                                int rank, const struct tp_hparams *hp)
{
    tp_gguf_t *src = NULL, *sh = NULL;
    struct tp_error e = {0};
    int bad = 0;
    if (tp_gguf_open(src_path, &src, &e) != TP_OK || tp_gguf_open(shard_path, &sh, &e) != TP_OK) {
        fprintf(stderr, "check_moe_shard_file: %s\n", e.msg);
        tp_gguf_close(src);
        return 1;
    }
    const struct tp_model_shard *s = &plan->ranks[rank].shard;
    const int64_t f0 = s->ff_begin, f1 = s->ff_end, x0 = s->expert_begin, x1 = s->expert_end;
    const int64_t hd = hp->head_dim;
    uint64_t held = 0;
    int n_experts_checked = 0;
    for (int i = 0; i < tp_gguf_n_tensors(src); i++) {
        const struct tp_gguf_tensor *t = tp_gguf_tensor(src, i);
        const struct tp_gguf_tensor *u = NULL;
        for (int j = 0; j < tp_gguf_n_tensors(sh); j++)
            if (strcmp(tp_gguf_tensor(sh, j)->name, t->name) == 0) u = tp_gguf_tensor(sh, j);
        const char *role = strchr(t->name + 4, '.');
        role = strncmp(t->name, "blk.", 4) == 0 && role ? role + 1 : t->name;
        const int64_t be = tp_gguf_wtype_block_elems((uint32_t)t->type);
        const size_t bb = tp_gguf_wtype_block_bytes((uint32_t)t->type), rb = (size_t)(t->ne[0] / be) * bb;
        /* the expected cut: columns [c0, c1) of dim 0, rows [r0, r1) of dim 1, matrices [m0, m1) of dim 2 */
        int64_t c0 = 0, c1 = t->ne[0], r0 = 0, r1 = t->n_dims > 1 ? t->ne[1] : 1, m0 = 0, m1 = t->n_dims > 2 ? t->ne[2] : 1;
        int absent = 0;
        if (!strcmp(role, "ffn_gate_exps.weight") || !strcmp(role, "ffn_up_exps.weight")) r0 = f0, r1 = f1, m0 = x0, m1 = x1;
        else if (!strcmp(role, "ffn_down_exps.weight")) c0 = f0, c1 = f1, m0 = x0, m1 = x1;
        else if (!strcmp(role, "ffn_gate_exps.bias") || !strcmp(role, "ffn_up_exps.bias")) c0 = f0, c1 = f1, r0 = x0, r1 = x1;
        else if (!strcmp(role, "ffn_down_exps.bias")) absent = f0 != 0, r0 = x0, r1 = x1;
        else if (!strcmp(role, "ffn_gate_shexp.weight") || !strcmp(role, "ffn_up_shexp.weight")) r0 = s->shexp_begin, r1 = s->shexp_end;
        else if (!strcmp(role, "ffn_down_shexp.weight")) c0 = s->shexp_begin, c1 = s->shexp_end;
        else if (!strcmp(role, "ffn_gate_inp_shexp.weight")) absent = s->shexp_end <= s->shexp_begin;
        else if (!strcmp(role, "attn_sinks.weight")) c0 = s->q_head_begin, c1 = s->q_head_end;
        else if (!strcmp(role, "attn_q.weight")) r0 = s->q_head_begin * hd, r1 = s->q_head_end * hd;
        else if (!strcmp(role, "attn_q.bias")) c0 = s->q_head_begin * hd, c1 = s->q_head_end * hd;
        else if (!strcmp(role, "attn_k.weight") || !strcmp(role, "attn_v.weight")) r0 = s->kv_head_begin * hd, r1 = s->kv_head_end * hd;
        else if (!strcmp(role, "attn_k.bias") || !strcmp(role, "attn_v.bias")) c0 = s->kv_head_begin * hd, c1 = s->kv_head_end * hd;
        else if (!strcmp(role, "attn_output.weight")) c0 = s->q_head_begin * hd, c1 = s->q_head_end * hd;
        else if (!strcmp(t->name, "output.weight")) r0 = s->vocab_begin, r1 = s->vocab_end;
        if (strstr(role, "_shexp.") && s->shexp_end <= s->shexp_begin) absent = 1;
        if (absent || !u) {
            if (absent != !u) fprintf(stderr, "%s: tensor %s %s\n", shard_path, t->name, absent ? "present, want absent" : "missing");
            bad += absent != !u;
            continue;
        }
        held += u->n_bytes;
        const int64_t want[3] = {c1 - c0, r1 - r0, m1 - m0};
        int shape_ok = u->type == t->type && u->n_dims == t->n_dims;
        for (int d = 0; d < 3 && d < t->n_dims; d++) shape_ok = shape_ok && u->ne[d] == want[d];
        if (!shape_ok) {
            fprintf(stderr, "%s: tensor %s has [%lld, %lld, %lld], want [%lld, %lld, %lld]\n", shard_path, t->name,
                    (long long)u->ne[0], (long long)u->ne[1], (long long)u->ne[2], (long long)want[0],
                    (long long)want[1], (long long)want[2]);
            bad++;
            continue;
        }
        const size_t len = (size_t)((c1 - c0) / be) * bb, off = (size_t)(c0 / be) * bb;
        const int64_t ne1 = t->n_dims > 1 ? t->ne[1] : 1;
        const uint8_t *a = t->data, *b = u->data;
        int same = 1;
        for (int64_t m = m0; same && m < m1; m++)
            for (int64_t r = r0; same && r < r1; r++) {
                same = memcmp(a + (size_t)(m * ne1 + r) * rb + off, b, len) == 0;
                b += len;
            }
        if (!same) fprintf(stderr, "%s: tensor %s holds other bytes than its slice of the source\n", shard_path, t->name);
        bad += !same;
        n_experts_checked += m1 - m0 > 0 && strstr(role, "_exps.weight") != NULL;
    }
    const uint64_t plan_bytes = plan->ranks[rank].sharded_bytes + plan->ranks[rank].replicated_bytes;
    fprintf(stderr, "%s: %llu tensor bytes, the plan says %llu (experts [%lld,%lld), columns [%lld,%lld))\n",
            shard_path, (unsigned long long)held, (unsigned long long)plan_bytes, (long long)x0, (long long)x1,
            (long long)f0, (long long)f1);
    bad += held != plan_bytes;
    bad += n_experts_checked != 3 * hp->n_layer;
    tp_gguf_close(sh);
    tp_gguf_close(src);
    return bad;
}

/* Cut `model` for `world` ranks with `split`, check every rank's file against the plan, serve the files
 * and compare with the whole file served at the same world and split (the same bytes on every rank:
 * identical tokens and logits, quantized or not). */
static void moe_shard_case(const char *model, int world, const char *weights, enum tp_moe_split split, int steps,
                           const char *what)
{
    char pat[1024], tag[200];
    snprintf(tag, sizeof tag, "%s shard files %s-parallel N=%d%s%s", what, tp_moe_split_name(split), world,
             weights ? " weights " : "", weights ? weights : "");
    struct tp_model_probe *pr = calloc(1, sizeof *pr);
    struct tp_shard_plan *plan = calloc(1, sizeof *plan);
    CU_ASSERT_PTR_NOT_NULL_FATAL(pr);
    CU_ASSERT_PTR_NOT_NULL_FATAL(plan);
    struct tp_error e = {0};
    CU_ASSERT_EQUAL_FATAL(tp_model_probe(model, pr, &e), TP_OK);
    double w[MR_MAX_RANKS];
    if (weights) CU_ASSERT_EQUAL_FATAL(tp_parallel_parse_weights(weights, world, w, &e), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_parallel_plan_moe(&pr->hp, &pr->types, world, weights ? w : NULL, split, plan, &e), TP_OK);
    /* cut */
    static int n_dirs;
    char dir[600], cmd[700], name[256];
    snprintf(dir, sizeof dir, "%s/moeshards%d", tp_test_tmpdir(), ++n_dirs);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
    if (tp_parallel_write_shards_moe(model, world, weights, split, dir, &e) != TP_OK) fprintf(stderr, "%s: %s\n", tag, e.msg);
    CU_ASSERT_EQUAL_FATAL(e.status, TP_OK);
    tp_parallel_shard_name(model, 0, world, name, sizeof name);
    *strstr(name, ".rank0-") = '\0';
    snprintf(pat, sizeof pat, "%s/%s.rank%%d-of-%d.gguf", dir, name, world);
    for (int k = 0; k < world; k++) {
        char f[1100];
        snprintf(f, sizeof f, pat, k);
        CU_ASSERT_EQUAL(check_moe_shard_file(model, f, plan, k, &pr->hp), 0);
    }
    /* the whole file at this world and split is the oracle */
    struct mr_run ref, r;
    mr_init(&ref, model, world);
    ref.n_steps = steps;
    ref.moe_split = split;
    ref.weights = weights;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    for (int k = 0; k < world; k++) CU_ASSERT_EQUAL_FATAL(ref.exit_code[k], 0);
    mr_init(&r, pat, world);
    r.shard_files = 1;
    r.n_steps = steps; /* no --moe-split, no --shard-weights: the files' own */
    expect_same(&ref, &r, 0.0, tag);
    CU_ASSERT_EQUAL(r.plan_split, (int)split);
    for (int k = 0; k < world; k++) {
        CU_ASSERT_EQUAL(r.plan_bytes[k], ref.plan_bytes[k]);
        CU_ASSERT(r.weight_bytes[k] <= r.plan_bytes[k]);
    }
    mr_free(&r);
    mr_free(&ref);
    /* asking the files for the other split is refused on every rank, before anything is loaded */
    const enum tp_moe_split other = split == TP_MOE_SPLIT_TENSOR ? TP_MOE_SPLIT_EXPERT : TP_MOE_SPLIT_TENSOR;
    mr_init(&r, pat, world);
    r.shard_files = 1;
    r.n_steps = 2;
    r.moe_split = other;
    r.deadline_s = 40;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    char want[64];
    snprintf(want, sizeof want, "was cut with --moe-split %s", tp_moe_split_name(split));
    for (int k = 0; k < world; k++) {
        CU_ASSERT_EQUAL(r.exit_code[k], 3);
        if (!strstr(r.msg[k], want)) fprintf(stderr, "%s: rank %d: %s\n", tag, k, r.msg[k]);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.msg[k], want));
    }
    mr_free(&r);
    free(plan);
    free(pr);
}

static void test_moe_shard_qwen3moe(void)
{
    const char *f = mr_synth_model("test-tiny-qwen3moe", TP_WTYPE_F32);
    const char *q = mr_synth_model("test-tiny-qwen3moe", TP_WTYPE_Q4_0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_PTR_NOT_NULL_FATAL(q);
    moe_shard_case(f, 2, NULL, TP_MOE_SPLIT_TENSOR, 32, "qwen3moe f32");
    moe_shard_case(f, 2, NULL, TP_MOE_SPLIT_EXPERT, 32, "qwen3moe f32");
    moe_shard_case(q, 2, NULL, TP_MOE_SPLIT_TENSOR, 32, "qwen3moe q4_0");
    moe_shard_case(q, 2, NULL, TP_MOE_SPLIT_EXPERT, 32, "qwen3moe q4_0");
    moe_shard_case(f, 3, "2,1,1", TP_MOE_SPLIT_EXPERT, 32, "qwen3moe f32");
    /* and against one rank reading the whole file: F32 identical tokens, logits within 1e-10 */
    struct mr_run ref, r;
    char pat[1024];
    run_ref(&ref, f, 32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cut_shards(f, 2, NULL, pat, sizeof pat));
    mr_init(&r, pat, 2);
    r.shard_files = 1;
    r.n_steps = 32;
    expect_same(&ref, &r, 1e-10, "qwen3moe f32 shard files (auto) N=2 vs one rank");
    mr_free(&r);
    mr_free(&ref);
}

static void test_moe_shard_qwen2moe(void)
{
    const char *f = mr_synth_model("test-tiny-qwen2moe", TP_WTYPE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    moe_shard_case(f, 2, NULL, TP_MOE_SPLIT_TENSOR, 32, "qwen2moe f32");
    moe_shard_case(f, 3, "2,1,1", TP_MOE_SPLIT_EXPERT, 32, "qwen2moe f32");
}

/* gpt-oss: MXFP4 experts (Q8_0 elsewhere), sinks, attention and expert biases, windows */
static void test_moe_shard_gptoss(void)
{
    const char *q = mr_synth_model("test-tiny-gptoss", TP_WTYPE_MXFP4);
    const char *f = mr_synth_model("test-tiny-gptoss", TP_WTYPE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(q);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    moe_shard_case(q, 2, NULL, TP_MOE_SPLIT_TENSOR, 32, "gpt-oss mxfp4");
    moe_shard_case(q, 2, NULL, TP_MOE_SPLIT_EXPERT, 32, "gpt-oss mxfp4");
    moe_shard_case(f, 2, NULL, TP_MOE_SPLIT_TENSOR, 32, "gpt-oss f32");
    /* MXFP4 shard files against one rank reading the whole file: the near-tie rule (8% of the rms) */
    struct mr_run ref, r;
    mr_init(&ref, q, 1);
    ref.n_steps = 32;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    CU_ASSERT_EQUAL_FATAL(ref.exit_code[0], 0);
    char pat[1024];
    CU_ASSERT_PTR_NOT_NULL_FATAL(cut_shards(q, 2, NULL, pat, sizeof pat));
    mr_init(&r, pat, 2);
    r.shard_files = 1;
    r.n_steps = 32;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < 2; k++) CU_ASSERT_EQUAL(r.exit_code[k], 0);
    CU_ASSERT_EQUAL(mr_near_tie_violations(&ref, &r, 0.08, 0, "gpt-oss mxfp4 shard files (auto) N=2 vs one rank"), 0);
    mr_free(&r);
    mr_free(&ref);
}

static const struct tp_test_case moe_shard_cases[] = {
    {"qwen3moe_tensor_expert", test_moe_shard_qwen3moe},
    {"qwen2moe_shared_expert", test_moe_shard_qwen2moe},
    {"gptoss_mxfp4", test_moe_shard_gptoss},
    {NULL, NULL},
};
TP_TEST_SUITE(moe_shard_files, "multirank,model", 300, moe_shard_cases)

/* The same bound for a mixture of experts, both splits at N = 2: a rank holds its column slice of
 * every expert, or its whole experts, never the rest (~115 MiB model, ~58 MiB plan per rank, bound
 * ~96 MiB: a rank that mapped every expert would exceed it). */
static void test_rss_moe(void)
{
#if defined(__SANITIZE_ADDRESS__)
    tp_test_skip("RSS bounds do not apply under AddressSanitizer (shadow memory and quarantine)");
    return;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    tp_test_skip("RSS bounds do not apply under AddressSanitizer (shadow memory and quarantine)");
    return;
#endif
#endif
    const char *m = mr_synth_model("moe-mid", TP_WTYPE_Q4_0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    const enum tp_moe_split splits[] = {TP_MOE_SPLIT_TENSOR, TP_MOE_SPLIT_EXPERT};
    for (int sp = 0; sp < 2; sp++) {
        struct mr_run r;
        mr_init(&r, m, 2);
        r.n_steps = 4;
        r.deadline_s = 120;
        r.moe_split = splits[sp];
        CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
        CU_ASSERT_EQUAL(r.plan_split, (int)splits[sp]);
        for (int k = 0; k < 2; k++) {
            CU_ASSERT_EQUAL(r.exit_code[k], 0);
            double bound = 1.1 * (double)r.plan_bytes[k] + RSS_ALLOWANCE;
            fprintf(stderr, "moe %s rank %d: plan %.1f MiB, weights held %.1f MiB, peak RSS %.1f MiB (bound %.1f MiB)\n",
                    tp_moe_split_name(splits[sp]), k, r.plan_bytes[k] / 1048576.0, r.weight_bytes[k] / 1048576.0,
                    r.rss_peak[k] / 1048576.0, bound / 1048576.0);
            CU_ASSERT(r.rss_peak[k] > 0);
            CU_ASSERT((double)r.rss_peak[k] <= bound);
            CU_ASSERT(r.weight_bytes[k] <= r.plan_bytes[k]);
        }
        mr_free(&r);
    }
}

static const struct tp_test_case rss_cases[] = {
    {"rss_per_rank", test_rss_per_rank},
    {"rss_moe_both_splits", test_rss_moe},
    {NULL, NULL},
};
TP_TEST_SUITE(rss, "multirank,slow", 300, rss_cases)

static const struct tp_test_case mr_cases[] = {
    {"shard_files", test_shard_files},
    {"stories_worlds", test_stories_worlds},
    {"synth_gqa_f32", test_synth_gqa_f32},
    {"synth_quant", test_synth_quant},
    {"synth_qwen", test_synth_qwen},
    {"refused_everywhere", test_refused_everywhere},
    {"dead_peer", test_dead_peer},
    {"slow_loader", test_slow_loader},
    {"wire_dtypes", test_wire_dtypes},
    {"kv_copy", test_kv_copy},
    {"rank_hook", test_rank_hook},
    {NULL, NULL},
};
TP_TEST_SUITE(multirank, "multirank,model", 300, mr_cases)

/* Token masks in the step (constrained decoding): sequence 0 may only pick
 * tokens whose id is a multiple of 3 or 7 (the first reference tokens
 * excluded), sequence 1 is free.  Oracles: at one rank every token of
 * sequence 0 is allowed and the final logits are -inf exactly where the mask
 * is clear; sequence 1 decodes as without a mask; 2 and 3 ranks decode the
 * same through the logits gather, the distributed argmax and the top-k. */
static void test_token_mask(void)
{
    const char *m = stories();
    if (!m) return;
    const int steps = 10;
    struct mr_run ref, m1, r;
    run_ref(&ref, m, steps);
    const int V = ref.n_vocab;
    uint32_t *mask = calloc((size_t)(V + 31) / 32, sizeof(uint32_t));
    CU_ASSERT_PTR_NOT_NULL_FATAL(mask);
    for (int i = 0; i < V; i++)
        if ((i % 3 == 0 || i % 7 == 0) && i != ref.tokens[0] && i != ref.tokens[1]) mask[i / 32] |= 1u << (i % 32);
    mr_init(&m1, m, 1);
    m1.n_steps = steps;
    m1.mask0 = mask;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&m1), 0);
    CU_ASSERT_EQUAL_FATAL(m1.exit_code[0], 0);
    CU_ASSERT_EQUAL_FATAL(m1.n_tokens, ref.n_tokens);
    for (int i = 0; i < m1.n_tokens; i++) CU_ASSERT(mask[m1.tokens[i] / 32] >> (m1.tokens[i] % 32) & 1u);
    CU_ASSERT(memcmp(m1.tokens1, ref.tokens1, sizeof(int32_t) * (size_t)ref.n_tokens) == 0); /* free row */
    for (int i = 0; i < V; i++) {
        const int allowed = (int)(mask[i / 32] >> (i % 32) & 1u);
        CU_ASSERT(allowed ? isfinite(m1.logits[i]) : (isinf(m1.logits[i]) && m1.logits[i] < 0));
    }
    for (int world = 2; world <= 3; world++)
        for (int api = 0; api <= 2; api++) {
            char tag[96];
            snprintf(tag, sizeof tag, "token mask N=%d api %d", world, api);
            mr_init(&r, m, world);
            r.n_steps = steps;
            r.greedy_api = api;
            r.mask0 = mask;
            expect_same(&m1, &r, -1, tag);
            if (api == 0)
                for (int i = 0; i < V; i++)
                    if (isinf(m1.logits[i])) CU_ASSERT(isinf(r.logits[i]) && r.logits[i] < 0);
            mr_free(&r);
        }
    mr_free(&m1);
    mr_free(&ref);
    free(mask);
}

static const struct tp_test_case bias_cases[] = {{"logit_bias", test_logit_bias}, {"token_mask", test_token_mask}, {NULL, NULL}};
TP_TEST_SUITE(logit_bias, "multirank,model", 240, bias_cases)

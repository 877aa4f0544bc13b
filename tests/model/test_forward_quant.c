/*
 * tests/model/test_forward_quant.c - the quantized forward pass is
 * deterministic across thread counts and batch shapes.
 *
 * A synthetic Q4_0 / Q8_0 model big enough that every matrix job goes to the
 * pool (256-wide, FFN 704, vocabulary 1000: row counts that are not multiples
 * of the kernels' 16-row groups) is run
 *   - with 1 and 2 threads: a 13-token prefill (the batch kernel in passes of
 *     8 + 5 tokens) and 20 greedy decode steps must give bit-identical logits
 *     (every row is computed the same way whatever the split of rows over
 *     threads, so the same tokens follow whatever the thread count);
 *   - as 8 sequences decoded together (one token each per step: the
 *     small-batch kernel) and each sequence alone (the decode kernel), fed the
 *     same tokens: logits agree to nmse <= 1e-4.  Both paths compute exact
 *     integer block dots on identical 8-bit activations and differ only in
 *     float summation order (~1e-7 relative per matmul), but such a
 *     difference occasionally moves an activation of the next matmul across
 *     an 8-bit rounding boundary (one step = 1/127 of its block's largest
 *     value): measured nmse 2e-14 .. 4e-6 with the AVX2 / AVX-512 kernels
 *     (0 with the scalar ones, whose paths are the same).  A wrong row, token
 *     or block scale gives nmse >= 1e-2 (a swapped lane pair measured 0.5).
 *   - Q4_0 / Q8_0 / Q4_K_M / Q5_K / Q6_K re-laid 16 rows at a time (x16, where the ISA
 *     has the kernel) and in the file's row layout: the same greedy run, nmse <= 1e-4
 *     (see above), and the same greedy tokens;
 *   - the same thread and batch checks for Q4_K_M (Q4_K and Q6_K matrices);
 *   - SwiGLU and softmax (a polynomial exp on AVX2) against double precision:
 *     relative error <= 4e-7 for SwiGLU (a few float ulps: 2^-23 = 1.2e-7)
 *     over [-100, 100] and the edges, the same bits for an element whatever
 *     the range it is in; softmax <= 5e-6 per element for lengths 1..70 with
 *     values spread over +-30 (exp ~2 ulp, the float sum of up to 70 terms
 *     and 1/sum add up to ~40 ulp worst case; a wrong exp is off by >= 1e-3).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels.h"
#include "model/model.h"
#include "model/forward/model_impl.h"
#include "model/synth.h"
#include "model_test_util.h"
#include "tp_test.h"

#define FQ_VOCAB 1000
#define FQ_SEQS 8

/* test-fqk: the K-quant twin (rows of 256-value super-blocks: FFN 768) */
static const char k_shape_json[] =
    "{\"shapes\":[{\"name\":\"test-fq\",\"arch\":\"llama\",\"n_embd\":256,\"n_layer\":2,\"n_head\":4,"
    "\"n_head_kv\":2,\"n_ff\":704,\"n_vocab\":1000,\"n_ctx\":256,\"rope_theta\":10000.0,\"norm_eps\":1e-5,"
    "\"tied\":false,\"source\":\"made up for tests\"},"
    "{\"name\":\"test-fqk\",\"arch\":\"llama\",\"n_embd\":256,\"n_layer\":2,\"n_head\":4,"
    "\"n_head_kv\":2,\"n_ff\":768,\"n_vocab\":1000,\"n_ctx\":256,\"rope_theta\":10000.0,\"norm_eps\":1e-5,"
    "\"tied\":false,\"source\":\"made up for tests\"}]}";

/* Write the test model of type t once per run; its path, or NULL (reported).  Q4_K is
 * llama-quantize's Q4_K_M mix (Q4_K with Q6_K for attn_v, half the ffn_down and the
 * output head), Q5_K and Q6_K plain. */
static const char *fq_model(enum tp_wtype t)
{
    static char paths[TP_WTYPE_COUNT][600];
    char *p = paths[t];
    if (p[0]) return p;
    const int kq = t == TP_WTYPE_Q4_K || t == TP_WTYPE_Q5_K || t == TP_WTYPE_Q6_K;
    struct tp_shape shape;
    struct tp_error err = {0};
    if (tp_shape_find(k_shape_json, kq ? "test-fqk" : "test-fq", &shape, &err) != TP_OK) {
        fprintf(stderr, "shape: %s\n", err.msg);
        return NULL;
    }
    snprintf(p, 600, "%s/test-fq-%s.gguf", tp_test_tmpdir(), tp_wtype_name(t));
    struct tp_synth_config sc = tp_synth_default_config();
    sc.shape = &shape;
    sc.type = t;
    if (t == TP_WTYPE_Q4_K) sc.mix = TP_SYNTH_MIX_Q4_K_M;
    sc.seed = 99;
    sc.out_path = p;
    if (tp_synth_write(&sc, &err) != TP_OK) {
        fprintf(stderr, "synth: %s\n", err.msg);
        p[0] = 0;
        return NULL;
    }
    return p;
}

/* keep_layout: tp_model_config.keep_layout (1: no x16 re-layout) */
static tp_model_t *fq_open(const char *path, int threads, int keep_layout)
{
    struct tp_model_config cfg = tp_model_default_config();
    cfg.path = path;
    cfg.n_threads = threads;
    cfg.keep_layout = keep_layout;
    cfg.n_ctx = 64;
    cfg.n_seq = FQ_SEQS;
    cfg.n_batch = 16;
    struct tp_error err = {0};
    tp_model_t *m = NULL;
    if (tp_model_init(&cfg, &m, &err) != TP_OK) fprintf(stderr, "tp_model_init: %s\n", err.msg);
    return m;
}

/* 13-token prefill in two calls of 8 and 5 tokens (batches up to TP_FWD_PREP_SPLIT_ROWS, which a decode-size
 * preparation may split by blocks), logits at every position, then 20 greedy steps of sequence 0; all logits
 * into out ((13 + 20) x vocab).  0 on success. */
static int run_forced(tp_model_t *m, float *out, const float *force);
static int run_greedy(tp_model_t *m, float *out) { return run_forced(m, out, NULL); }

/* run_greedy, but each decode step fed the argmax of force's logits (teacher forcing: two
 * models compared on the same tokens even where a near-tie picks differently). */
static int run_forced(tp_model_t *m, float *out, const float *force)
{
    int32_t tok[13], pos[13], seq[13];
    int8_t want[13];
    for (int i = 0; i < 13; i++) {
        tok[i] = (int32_t)((i * 389 + 17) % FQ_VOCAB);
        pos[i] = i;
        seq[i] = 0;
        want[i] = 1;
    }
    struct tp_batch b0 = {8, tok, pos, seq, want}, b1 = {5, tok + 8, pos + 8, seq + 8, want + 8};
    if (tp_model_forward(m, &b0, out) != TP_OK || tp_model_forward(m, &b1, out + (size_t)8 * FQ_VOCAB) != TP_OK)
        return -1;
    const float *src = force ? force : out;
    int32_t t = tm_argmax(src + 12 * FQ_VOCAB, FQ_VOCAB);
    for (int s = 0; s < 20; s++) {
        int32_t p = 13 + s, q = 0;
        int8_t w = 1;
        float *row = out + (size_t)(13 + s) * FQ_VOCAB;
        struct tp_batch d = {1, &t, &p, &q, &w};
        if (tp_model_forward(m, &d, row) != TP_OK) return -1;
        t = tm_argmax((force ? force : out) + (size_t)(13 + s) * FQ_VOCAB, FQ_VOCAB);
    }
    return 0;
}

static void check_threads(enum tp_wtype t)
{
    const char *path = fq_model(t);
    CU_ASSERT_FATAL(path != NULL);
    const size_t n = (size_t)(13 + 20) * FQ_VOCAB;
    float *one = malloc(n * sizeof(float)), *two = malloc(n * sizeof(float));
    CU_ASSERT_FATAL(one && two);
    tp_model_t *m1 = fq_open(path, 1, 0), *m2 = fq_open(path, 2, 0);
    CU_ASSERT_FATAL(m1 && m2);
    CU_ASSERT_EQUAL(tp_model_n_threads(m2), 2);
    CU_ASSERT_EQUAL_FATAL(run_greedy(m1, one), 0);
    /* 2 threads: the rows of a decode step and of the 8- and 5-token prefill calls prepared whole (this
     * model's rows are under TP_FWD_PREP_SPLIT), then split by blocks over both threads (TP_PH_PREP_BLOCKS) */
    for (int split = 0; split < 2; split++) {
        m2->prep_split_min = split ? 1 : TP_FWD_PREP_SPLIT;
        CU_ASSERT_EQUAL_FATAL(run_greedy(m2, two), 0);
        int diff = 0;
        for (size_t i = 0; i < n; i++) diff += memcmp(&one[i], &two[i], sizeof(float)) != 0;
        if (diff)
            printf("\n  %s: %d of %zu logits differ between 1 and 2 threads (%s)\n", tp_wtype_name(t), diff, n,
                   split ? "rows split by blocks" : "rows on the calling thread");
        CU_ASSERT_EQUAL(diff, 0);
        tp_model_seq_truncate(m2, 0, 0); /* the next run starts from an empty sequence 0 */
    }
    /* not a constant model: the greedy continuation visits several tokens */
    int distinct = 0;
    for (int s = 0; s < 20; s++) {
        int a = tm_argmax(one + (size_t)(13 + s) * FQ_VOCAB, FQ_VOCAB), seen = 0;
        for (int r = 0; r < s; r++) seen |= tm_argmax(one + (size_t)(13 + r) * FQ_VOCAB, FQ_VOCAB) == a;
        distinct += !seen;
    }
    CU_ASSERT(distinct >= 2);
    tp_model_free(m1);
    tp_model_free(m2);
    free(one);
    free(two);
}

/* The x16 re-layout (repack.c) of type t against the file's row layout: the same
 * model, the same greedy run; logits agree like the batch/decode pair below
 * (exact block dots, float order and then 8-bit activation roundings differ:
 * measured nmse 9e-15 on this model), and the matrices really are re-laid where the ISA
 * has an x16 kernel (the embedding never). */
static void check_layout(enum tp_wtype t)
{
    const char *path = fq_model(t);
    CU_ASSERT_FATAL(path != NULL);
    const size_t n = (size_t)(13 + 20) * FQ_VOCAB;
    float *rows = malloc(n * sizeof(float)), *x16 = malloc(n * sizeof(float));
    CU_ASSERT_FATAL(rows && x16);
    tp_model_t *mr = fq_open(path, 2, 1), *mx = fq_open(path, 2, 0);
    CU_ASSERT_FATAL(mr && mx);
    CU_ASSERT_EQUAL(mr->layers[0].wq.x16, 0);
    CU_ASSERT_EQUAL(mx->layers[1].wdown.x16, tp_kern_x16_native(mx->layers[1].wdown.type));
    CU_ASSERT_EQUAL(mx->layers[0].wq.x16, tp_kern_x16_native(mx->layers[0].wq.type));
    CU_ASSERT_EQUAL(mx->output.x16, tp_kern_x16_native(mx->output.type));
    CU_ASSERT_EQUAL(mx->tok_embd.x16, 0);
    if (t == TP_WTYPE_Q4_K) { /* the Q4_K_M mix: both K types in one model */
        CU_ASSERT_EQUAL(mx->layers[0].wq.type, TP_WTYPE_Q4_K);
        CU_ASSERT_EQUAL(mx->output.type, TP_WTYPE_Q6_K);
    }
    CU_ASSERT_EQUAL_FATAL(run_greedy(mr, rows), 0);
    CU_ASSERT_EQUAL_FATAL(run_forced(mx, x16, rows), 0); /* on the row layout's greedy tokens */
    /* each step's argmax is the same, except at a near-tie: the two logits closer than 3x the
     * rms error the nmse bound allows (sqrt(1e-4) = 1e-2 of the row's rms logit), which an
     * 8-bit activation rounding flip (see above) can reorder */
    int diff_tokens = 0;
    for (int st = 12; st < 13 + 20; st++) {
        const float *a = rows + (size_t)st * FQ_VOCAB, *b = x16 + (size_t)st * FQ_VOCAB;
        const int ia = tm_argmax(a, FQ_VOCAB), ib = tm_argmax(b, FQ_VOCAB);
        double ss = 0.0;
        for (int v = 0; v < FQ_VOCAB; v++) ss += (double)a[v] * a[v];
        const double tau = 3.0 * 1e-2 * sqrt(ss / FQ_VOCAB);
        if (ia != ib && fabs((double)a[ia] - a[ib]) > tau) diff_tokens++;
    }
    CU_ASSERT_EQUAL(diff_tokens, 0);
    const double e = tm_nmse(x16, rows, (int)n);
    printf("\n  %s x16 (%s) vs row layout: logits nmse %.3g\n", tp_wtype_name(t),
           tp_kern_x16_native(t) ? "re-laid" : "not native here", e);
    CU_ASSERT(e <= 1e-4);
    tp_model_free(mr);
    tp_model_free(mx);
    free(rows);
    free(x16);
}
static void test_layout_q4_0(void) { check_layout(TP_WTYPE_Q4_0); }
static void test_layout_q8_0(void) { check_layout(TP_WTYPE_Q8_0); }
static void test_layout_q4_k_m(void) { check_layout(TP_WTYPE_Q4_K); }
static void test_layout_q5_k(void) { check_layout(TP_WTYPE_Q5_K); }
static void test_layout_q6_k(void) { check_layout(TP_WTYPE_Q6_K); }

static void test_threads_q4_0(void) { check_threads(TP_WTYPE_Q4_0); }
static void test_threads_q8_0(void) { check_threads(TP_WTYPE_Q8_0); }
static void test_threads_q4_k_m(void) { check_threads(TP_WTYPE_Q4_K); }

/* 8 sequences, 6 steps each: together (n_tok = 8 per step) vs one at a time. */
static void check_batch(enum tp_wtype t)
{
    const char *path = fq_model(t);
    CU_ASSERT_FATAL(path != NULL);
    enum { STEPS = 6 };
    const size_t n = (size_t)STEPS * FQ_SEQS * FQ_VOCAB;
    float *bat = malloc(n * sizeof(float)), *alone = malloc(n * sizeof(float));
    int32_t toks[STEPS][FQ_SEQS];
    CU_ASSERT_FATAL(bat && alone);
    tp_model_t *m = fq_open(path, 2, 0);
    CU_ASSERT_FATAL(m != NULL);
    /* together: each sequence continues with its own argmax */
    int32_t cur[FQ_SEQS], pos[FQ_SEQS], seq[FQ_SEQS];
    int8_t want[FQ_SEQS];
    for (int i = 0; i < FQ_SEQS; i++) cur[i] = (int32_t)(i * 113 + 5), seq[i] = i, want[i] = 1;
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < FQ_SEQS; i++) pos[i] = s, toks[s][i] = cur[i];
        struct tp_batch b = {FQ_SEQS, cur, pos, seq, want};
        float *rows = bat + (size_t)s * FQ_SEQS * FQ_VOCAB;
        CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &b, rows), TP_OK);
        for (int i = 0; i < FQ_SEQS; i++) cur[i] = tm_argmax(rows + (size_t)i * FQ_VOCAB, FQ_VOCAB);
    }
    /* alone: fresh caches, the same tokens one sequence at a time */
    for (int i = 0; i < FQ_SEQS; i++) tp_model_seq_truncate(m, i, 0);
    for (int i = 0; i < FQ_SEQS; i++) {
        for (int s = 0; s < STEPS; s++) {
            int32_t p = s, q = i;
            int8_t w = 1;
            struct tp_batch b = {1, &toks[s][i], &p, &q, &w};
            CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &b, alone + ((size_t)s * FQ_SEQS + i) * FQ_VOCAB), TP_OK);
        }
    }
    double num = 0.0, den = 0.0;
    for (size_t k = 0; k < n; k++) {
        double d = (double)bat[k] - alone[k];
        num += d * d;
        den += (double)alone[k] * alone[k];
    }
    double e = den > 0 ? num / den : 1.0;
    printf("\n  %s: 8 sequences together vs alone, logits nmse %.3g;", tp_wtype_name(t), e);
    CU_ASSERT(den > 0.0);
    CU_ASSERT(e <= 1e-4);
    tp_model_free(m);
    free(bat);
    free(alone);
}

static void test_batch_q4_0(void) { check_batch(TP_WTYPE_Q4_0); }
static void test_batch_q8_0(void) { check_batch(TP_WTYPE_Q8_0); }
static void test_batch_q4_k_m(void) { check_batch(TP_WTYPE_Q4_K); }

static void test_swiglu(void)
{
    enum { N = 4001 };
    static float g[N], u[N], y[N], y2[N];
    tp_op_init();
    for (int i = 0; i < N; i++) {
        g[i] = -100.0f + 200.0f * (float)i / (N - 1);
        u[i] = 0.5f + (float)(i % 7) * 0.25f;
    }
    g[0] = -1e30f, g[1] = 1e30f, g[2] = 0.0f, g[3] = -88.0f, g[4] = 88.0f, g[5] = 1e-30f;
    tp_op_swiglu(y, g, u, N);
    double worst = 0.0;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const double gd = g[i], ref = gd / (1.0 + exp(-gd)) * u[i];
        const double err = fabs(y[i] - ref), scale = fabs(ref) > 1e-30 ? fabs(ref) : 1e-30;
        if (!isfinite(y[i])) bad++;
        else if (err / scale > worst && fabs(ref) > 1e-30) worst = err / scale;
    }
    printf("\n  swiglu worst relative error %.3g;", worst);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(worst <= 4e-7);
    CU_ASSERT(fabsf(y[0]) < 1e-6f); /* silu(-1e30) ~ 0 (exp clamped at e^88.3), not NaN */
    /* ragged ranges: element i computes the same bits whatever the call */
    for (int i0 = 0; i0 < N; i0 += 13) {
        const int len = i0 + 37 <= N ? 37 : N - i0;
        tp_op_swiglu(y2 + i0, g + i0, u + i0, len);
    }
    CU_ASSERT(memcmp(y, y2, sizeof y) == 0);
}

static void test_softmax(void)
{
    float x[70];
    double worst = 0.0;
    uint32_t r = 12345;
    for (int n = 1; n <= 70; n++) {
        double ref[70], mx = -1e300, sum = 0.0;
        for (int i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            x[i] = ((float)(r >> 8) / 16777216.0f - 0.5f) * 60.0f;
            if (x[i] > mx) mx = x[i];
        }
        for (int i = 0; i < n; i++) sum += ref[i] = exp((double)x[i] - mx);
        tp_op_softmax(x, n);
        for (int i = 0; i < n; i++) {
            const double want = ref[i] / sum, e = fabs(x[i] - want) / want;
            if (e > worst) worst = e;
        }
    }
    printf("\n  softmax worst relative error %.3g;", worst);
    CU_ASSERT(worst <= 5e-6);
}

static const struct tp_test_case fq_cases[] = {
    {"swiglu", test_swiglu},
    {"softmax", test_softmax},
    {"threads_q4_0", test_threads_q4_0},
    {"threads_q8_0", test_threads_q8_0},
    {"batch_q4_0", test_batch_q4_0},
    {"batch_q8_0", test_batch_q8_0},
    {"layout_q4_0", test_layout_q4_0},
    {"layout_q8_0", test_layout_q8_0},
    {"threads_q4_k_m", test_threads_q4_k_m},
    {"batch_q4_k_m", test_batch_q4_k_m},
    {"layout_q4_k_m", test_layout_q4_k_m},
    {"layout_q5_k", test_layout_q5_k},
    {"layout_q6_k", test_layout_q6_k},
    {NULL, NULL}};
TP_TEST_SUITE(forward_quant, "unit", 120, fq_cases)

/* tests/model/test_sampler.c - the token sampler against hand-computed oracles:
 * greedy ties, top-k/top-p/min-p cut-offs, penalties, seeding, logprobs and
 * the sampled frequencies against the softmax probabilities (chi-square). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tp_test.h"

static tp_sampler_t *mk(struct tp_sampler_params p, int n_vocab)
{
    tp_sampler_t *s = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_sampler_init(&p, n_vocab, &s), TP_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    return s;
}

static int32_t draw(tp_sampler_t *s, const float *logits)
{
    struct tp_sample_result r;
    CU_ASSERT_EQUAL_FATAL(tp_sampler_sample(s, logits, &r), TP_OK);
    return r.id;
}

/* Bitmask of ids produced over n draws (n_vocab <= 32). */
static uint32_t draw_set(tp_sampler_t *s, const float *logits, int n)
{
    uint32_t m = 0;
    for (int i = 0; i < n; i++) m |= 1u << draw(s, logits);
    return m;
}

static void test_greedy_ties(void)
{
    struct tp_sampler_params p = tp_sampler_default_params();
    p.temperature = 0.0f;
    const float l[5] = {1.0f, 3.0f, -2.0f, 3.0f, 2.9f};
    tp_sampler_t *s = mk(p, 5);
    CU_ASSERT_EQUAL(draw(s, l), 1); /* tie between 1 and 3 -> lowest id */
    tp_sampler_free(s);

    /* top_k = 1 at any temperature is greedy */
    p = tp_sampler_default_params();
    p.top_k = 1;
    p.temperature = 5.0f;
    for (uint64_t seed = 0; seed < 20; seed++) {
        p.seed = seed;
        s = mk(p, 5);
        for (int i = 0; i < 10; i++) CU_ASSERT_EQUAL(draw(s, l), 1);
        tp_sampler_free(s);
    }
}

/* probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 */
static const float dyadic[5] = {0.0f, -0.69314718f, -1.38629436f, -2.07944154f, -2.07944154f};

static void test_top_k(void)
{
    struct tp_sampler_params p = tp_sampler_default_params();
    p.top_k = 2;
    tp_sampler_t *s = mk(p, 5);
    CU_ASSERT_EQUAL(draw_set(s, dyadic, 2000), 0x3u);
    tp_sampler_free(s);
    p.top_k = 4; /* ids 3 and 4 tie: the lower id is kept */
    s = mk(p, 5);
    CU_ASSERT_EQUAL(draw_set(s, dyadic, 4000), 0xFu);
    tp_sampler_free(s);
}

static void test_top_p(void)
{
    struct tp_sampler_params p = tp_sampler_default_params();
    struct {
        float top_p;
        uint32_t set;
    } cases[] = {{0.45f, 0x1u}, {0.55f, 0x3u}, {0.74f, 0x3u}, {0.76f, 0x7u}, {0.9f, 0xFu}, {0.99f, 0x1Fu}};
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        p.top_p = cases[i].top_p;
        tp_sampler_t *s = mk(p, 5);
        uint32_t got = draw_set(s, dyadic, 4000);
        if (got != cases[i].set) fprintf(stderr, "top_p %.2f: set %#x want %#x\n", cases[i].top_p, got, cases[i].set);
        CU_ASSERT_EQUAL(got, cases[i].set);
        tp_sampler_free(s);
    }
    /* top_p 0: only the most likely token (the smallest set reaching 0) */
    p.top_p = 0.0f;
    tp_sampler_t *s0 = mk(p, 5);
    CU_ASSERT_EQUAL(draw_set(s0, dyadic, 500), 0x1u);
    tp_sampler_free(s0);
    /* top-p after top-k: k=3 renormalises to 4/7, 2/7, 1/7; p=0.8 needs 0.857 -> ids 0..1 */
    p.top_k = 3;
    p.top_p = 0.8f;
    tp_sampler_t *s = mk(p, 5);
    CU_ASSERT_EQUAL(draw_set(s, dyadic, 4000), 0x3u);
    tp_sampler_free(s);
}

/* A flat distribution forces the growing-prefix path past its first rounds. */
static void test_top_p_flat_large(void)
{
    enum { N = 5000 };
    float *l = calloc(N, sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(l);
    struct tp_sampler_params p = tp_sampler_default_params();
    p.top_p = 0.5f; /* nucleus = ids 0..2499 exactly (ties to the lower id) */
    tp_sampler_t *s = mk(p, N);
    int mx = 0;
    for (int i = 0; i < 3000; i++) {
        int id = draw(s, l);
        if (id > mx) mx = id;
    }
    CU_ASSERT(mx < 2500);
    CU_ASSERT(mx > 2300); /* 3000 uniform draws from 2500 reach the top */
    tp_sampler_free(s);
    free(l);
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* top-p on random logits against a full-sort oracle: every drawn id lies in
 * the nucleus computed here with qsort, and the draws cover most of it. */
static void test_top_p_oracle(void)
{
    enum { N = 3000, DRAWS = 6000 };
    float *l = malloc(N * sizeof(float)), *sorted = malloc(N * sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(l);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sorted);
    uint64_t x = 777;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((double)(x >> 11) / 9007199254740992.0) * 9.0f;
        sorted[i] = l[i];
    }
    qsort(sorted, N, sizeof(float), cmp_desc);
    double total = 0.0, cum = 0.0;
    for (int i = 0; i < N; i++) total += exp(sorted[i] - sorted[0]);
    float thr = sorted[N - 1];
    int n_nucleus = N;
    for (int i = 0; i < N; i++) {
        cum += exp(sorted[i] - sorted[0]);
        if (cum >= 0.6 * total) {
            thr = sorted[i];
            n_nucleus = i + 1;
            break;
        }
    }
    struct tp_sampler_params p = tp_sampler_default_params();
    p.top_p = 0.6f;
    tp_sampler_t *s = mk(p, N);
    char *seen = calloc(N, 1);
    int outside = 0, distinct = 0;
    for (int i = 0; i < DRAWS; i++) {
        int id = draw(s, l);
        outside += l[id] < thr;
        if (!seen[id]) distinct++;
        seen[id] = 1;
    }
    tp_sampler_free(s);
    CU_ASSERT_EQUAL(outside, 0);
    CU_ASSERT(n_nucleus > 100);
    CU_ASSERT(distinct > n_nucleus * 8 / 10);
    CU_ASSERT(distinct <= n_nucleus);
    free(seen);
    free(sorted);
    free(l);
}

static void test_min_p_exact(void)
{
    /* ratios to the max: 1, 0.5, 0.25, 0.125, 0.125 */
    struct {
        float min_p;
        uint32_t set;
    } cases[] = {{0.6f, 0x1u}, {0.45f, 0x3u}, {0.26f, 0x3u}, {0.24f, 0x7u}, {0.1f, 0x1Fu}};
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        struct tp_sampler_params p = tp_sampler_default_params();
        p.min_p = cases[i].min_p;
        tp_sampler_t *s = mk(p, 5);
        uint32_t got = draw_set(s, dyadic, 4000);
        if (got != cases[i].set) fprintf(stderr, "min_p %.2f: set %#x want %#x\n", cases[i].min_p, got, cases[i].set);
        CU_ASSERT_EQUAL(got, cases[i].set);
        tp_sampler_free(s);
    }
}

static void test_penalties(void)
{
    struct tp_sampler_params p = tp_sampler_default_params();
    p.temperature = 0.0f;
    tp_sampler_t *s;

    /* repetition, positive logit: 2.0 / 1.1 = 1.818 < 1.9 */
    const float a[3] = {2.0f, 1.9f, -1.0f};
    p.repetition_penalty = 1.1f;
    s = mk(p, 3);
    CU_ASSERT_EQUAL(draw(s, a), 0);
    tp_sampler_accept(s, 0);
    CU_ASSERT_EQUAL(draw(s, a), 1);
    tp_sampler_accept(s, 0); /* repetition counts a token once: 1.818 still */
    CU_ASSERT_EQUAL(draw(s, a), 1);
    tp_sampler_free(s);
    p.repetition_penalty = 1.04f; /* 2.0 / 1.04 = 1.923 > 1.9 */
    s = mk(p, 3);
    tp_sampler_accept(s, 0);
    CU_ASSERT_EQUAL(draw(s, a), 0);
    tp_sampler_free(s);

    /* repetition, negative logit: -1.0 * 1.1 = -1.1 < -1.05 */
    const float b[2] = {-1.0f, -1.05f};
    p.repetition_penalty = 1.1f;
    s = mk(p, 2);
    tp_sampler_accept(s, 0);
    CU_ASSERT_EQUAL(draw(s, b), 1);
    tp_sampler_free(s);
    p.repetition_penalty = 1.0f;

    /* presence: once per token present, 2.0 - 0.6 = 1.4 < 1.5; 2.0 - 0.4 = 1.6 > 1.5 */
    const float c[2] = {2.0f, 1.5f};
    p.presence_penalty = 0.6f;
    s = mk(p, 2);
    tp_sampler_accept(s, 0);
    CU_ASSERT_EQUAL(draw(s, c), 1);
    tp_sampler_free(s);
    p.presence_penalty = 0.4f;
    s = mk(p, 2);
    tp_sampler_accept(s, 0);
    tp_sampler_accept(s, 0);
    tp_sampler_accept(s, 0);
    CU_ASSERT_EQUAL(draw(s, c), 0); /* presence does not grow with the count */
    tp_sampler_free(s);
    p.presence_penalty = 0.0f;

    /* frequency: 3 occurrences; 2.0 - 3*0.2 = 1.4 < 1.5; 2.0 - 3*0.1 = 1.7 > 1.5 */
    p.frequency_penalty = 0.2f;
    s = mk(p, 2);
    for (int i = 0; i < 3; i++) tp_sampler_accept(s, 0);
    CU_ASSERT_EQUAL(draw(s, c), 1);
    tp_sampler_reset(s, 0); /* history forgotten */
    CU_ASSERT_EQUAL(draw(s, c), 0);
    tp_sampler_free(s);
    p.frequency_penalty = 0.1f;
    s = mk(p, 2);
    for (int i = 0; i < 3; i++) tp_sampler_accept(s, 0);
    CU_ASSERT_EQUAL(draw(s, c), 0);
    tp_sampler_accept(s, 0); /* 4 * 0.1 = 0.4 -> 1.6 still wins; 6 -> 1.4 loses */
    CU_ASSERT_EQUAL(draw(s, c), 0);
    tp_sampler_accept(s, 0);
    tp_sampler_accept(s, 0);
    CU_ASSERT_EQUAL(draw(s, c), 1);
    tp_sampler_free(s);

    /* window: last 2 tokens only; 0 slides out after two others */
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.6f;
    p.penalty_last_n = 2;
    s = mk(p, 3);
    const float d[3] = {2.0f, 1.5f, -5.0f};
    tp_sampler_accept(s, 0);
    CU_ASSERT_EQUAL(draw(s, d), 1);
    tp_sampler_accept(s, 2);
    CU_ASSERT_EQUAL(draw(s, d), 1);
    tp_sampler_accept(s, 2);
    CU_ASSERT_EQUAL(draw(s, d), 0);
    tp_sampler_free(s);

    /* penalty_last_n 0: penalties off */
    p.penalty_last_n = 0;
    s = mk(p, 3);
    tp_sampler_accept(s, 0);
    CU_ASSERT_EQUAL(draw(s, d), 0);
    tp_sampler_free(s);
}

static void test_seed(void)
{
    enum { N = 50, DRAWS = 200 };
    float l[N];
    for (int i = 0; i < N; i++) l[i] = (float)((i * 7) % 13) * 0.1f; /* fairly flat */
    struct tp_sampler_params p = tp_sampler_default_params();
    p.temperature = 0.8f;
    p.top_p = 0.95f;
    int32_t a[DRAWS], b[DRAWS], c[DRAWS];
    p.seed = 42;
    tp_sampler_t *s = mk(p, N);
    for (int i = 0; i < DRAWS; i++) a[i] = draw(s, l);
    tp_sampler_reset(s, 42); /* reset reseeds: same sequence */
    for (int i = 0; i < DRAWS; i++) b[i] = draw(s, l);
    tp_sampler_free(s);
    CU_ASSERT_EQUAL(memcmp(a, b, sizeof(a)), 0);
    p.seed = 43;
    s = mk(p, N);
    for (int i = 0; i < DRAWS; i++) c[i] = draw(s, l);
    tp_sampler_free(s);
    int differ = 0;
    for (int i = 0; i < DRAWS; i++) differ += a[i] != c[i];
    CU_ASSERT(differ > DRAWS / 2);
}

/* Pearson chi-square of DRAWS samples against softmax(l / T). */
static double chi_square(const float *l, int n, float temp, uint64_t seed)
{
    enum { DRAWS = 20000 };
    struct tp_sampler_params p = tp_sampler_default_params();
    p.temperature = temp;
    p.seed = seed;
    tp_sampler_t *s = mk(p, n);
    int count[16] = {0};
    for (int i = 0; i < DRAWS; i++) count[draw(s, l)]++;
    tp_sampler_free(s);
    double mx = -1e30, sum = 0.0, chi = 0.0;
    for (int i = 0; i < n; i++) mx = fmax(mx, l[i] / temp);
    for (int i = 0; i < n; i++) sum += exp(l[i] / temp - mx);
    for (int i = 0; i < n; i++) {
        double e = DRAWS * exp(l[i] / temp - mx) / sum;
        chi += (count[i] - e) * (count[i] - e) / e;
    }
    return chi;
}

static void test_frequencies(void)
{
    const float l[8] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.5f, -1.0f, 0.2f};
    /* 7 degrees of freedom: P(chi2 > 24.32) = 0.001.  Several seeds and two
     * temperatures; a wrong distribution (e.g. T ignored) gives chi2 in the hundreds. */
    for (uint64_t seed = 1; seed <= 3; seed++) {
        double c1 = chi_square(l, 8, 1.0f, seed), c2 = chi_square(l, 8, 2.0f, seed);
        if (c1 >= 24.32 || c2 >= 24.32) fprintf(stderr, "chi2 %.2f %.2f (seed %llu)\n", c1, c2, (unsigned long long)seed);
        CU_ASSERT(c1 < 24.32);
        CU_ASSERT(c2 < 24.32);
    }
}

/* Exact probabilities of the sampler's pipeline for temperature T and top-k over l[0..n) (no ties). */
static void pipeline_probs(const float *l, int n, float temp, int top_k, double *prob)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        int rank = 0;
        for (int j = 0; j < n; j++) rank += l[j] > l[i];
        prob[i] = top_k > 0 && rank >= top_k ? 0.0 : exp((double)l[i] / temp);
        sum += prob[i];
    }
    for (int i = 0; i < n; i++) prob[i] /= sum;
}

/* Speculative sampling (tp_sampler_sample_draft) keeps the target distribution: for drafts of high, middle,
 * low and zero probability (outside top-k), the chosen tokens' frequencies against the pipeline's exact
 * probabilities (chi-square, 4 degrees of freedom over the 5 tokens top-k keeps: P(chi2 > 18.47) = 0.001),
 * and the draft is accepted as often as its probability says (within 5 binomial standard deviations). */
static void test_spec_draft_frequencies(void)
{
    enum { DRAWS = 20000 };
    const float l[8] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.5f, -1.0f, 0.2f};
    const int drafts[4] = {4, 0, 7, 6}; /* 6 is outside the top 5 */
    double prob[8];
    pipeline_probs(l, 8, 1.3f, 5, prob);
    for (int di = 0; di < 4; di++) {
        struct tp_sampler_params p = tp_sampler_default_params();
        p.temperature = 1.3f;
        p.top_k = 5;
        p.seed = 11 + (uint64_t)di;
        tp_sampler_t *s = mk(p, 8);
        int count[8] = {0}, n_acc = 0;
        for (int i = 0; i < DRAWS; i++) {
            struct tp_sample_result r;
            int acc = -1;
            CU_ASSERT_EQUAL_FATAL(tp_sampler_sample_draft(s, l, drafts[di], &r, &acc), TP_OK);
            CU_ASSERT_EQUAL(acc, r.id == drafts[di]);
            count[r.id]++;
            n_acc += acc;
        }
        tp_sampler_free(s);
        double chi = 0.0;
        for (int i = 0; i < 8; i++) {
            if (prob[i] == 0.0) {
                CU_ASSERT_EQUAL(count[i], 0);
                continue;
            }
            const double e = DRAWS * prob[i];
            chi += (count[i] - e) * (count[i] - e) / e;
        }
        const double pd = prob[drafts[di]], sd = sqrt(DRAWS * pd * (1.0 - pd));
        fprintf(stderr, "draft %d (p %.4f): chi2 %.2f, accepted %d (expected %.0f)\n", drafts[di], pd, chi, n_acc,
                DRAWS * pd);
        CU_ASSERT(chi < 18.47);
        CU_ASSERT(fabs(n_acc - DRAWS * pd) <= 5.0 * sd + 1e-9);
    }
    /* greedy: the argmax, accepted only when it is the draft */
    struct tp_sampler_params g = tp_sampler_default_params();
    g.temperature = 0.0f;
    tp_sampler_t *s = mk(g, 8);
    struct tp_sample_result r;
    int acc = -1;
    CU_ASSERT_EQUAL_FATAL(tp_sampler_sample_draft(s, l, 4, &r, &acc), TP_OK);
    CU_ASSERT_EQUAL(r.id, 4);
    CU_ASSERT_EQUAL(acc, 1);
    CU_ASSERT_EQUAL_FATAL(tp_sampler_sample_draft(s, l, 5, &r, &acc), TP_OK);
    CU_ASSERT_EQUAL(r.id, 4);
    CU_ASSERT_EQUAL(acc, 0);
    tp_sampler_free(s);
}

/* Two positions verified in one step, as the scheduler does: a toy model whose second row depends on the
 * first token (a frequency penalty on it, applied through tp_sampler_accept), drafts (d0, d1) verified in
 * order, a rejection ending the walk (the second token then comes from the row of the token chosen, as the
 * next step would give it).  The joint frequencies of (t0, t1) against p(t0) p(t1 | t0): 36 cells, 35
 * degrees of freedom, P(chi2 > 66.62) = 0.001. */
static void toy_row2(int32_t t0, float *l2)
{
    for (int i = 0; i < 6; i++) l2[i] = 0.3f * (float)((i * 7 + t0 * 3) % 6) - 0.6f;
}

static void test_spec_two_positions(void)
{
    enum { DRAWS = 60000, V = 6 };
    const float l1[V] = {0.4f, -0.2f, 0.9f, 0.1f, -0.5f, 0.6f};
    const float freq_pen = 0.7f;
    double joint[V][V], p1[V];
    pipeline_probs(l1, V, 1.0f, 0, p1);
    for (int a = 0; a < V; a++) {
        float l2[V];
        double p2[V];
        toy_row2(a, l2);
        l2[a] -= freq_pen; /* the history holds a once */
        pipeline_probs(l2, V, 1.0f, 0, p2);
        for (int b = 0; b < V; b++) joint[a][b] = p1[a] * p2[b];
    }
    struct tp_sampler_params p = tp_sampler_default_params();
    p.frequency_penalty = freq_pen;
    p.seed = 5;
    tp_sampler_t *s = mk(p, V);
    int count[V][V];
    memset(count, 0, sizeof count);
    for (int i = 0; i < DRAWS; i++) {
        const int32_t d0 = 2, d1 = (int32_t)(i % V); /* a fixed first draft, every second draft in turn */
        tp_sampler_reset(s, 1000 + (uint64_t)i);
        struct tp_sample_result r0, r1;
        int acc = 0;
        CU_ASSERT_EQUAL_FATAL(tp_sampler_sample_draft(s, l1, d0, &r0, &acc), TP_OK);
        tp_sampler_accept(s, r0.id);
        float l2[V];
        toy_row2(r0.id, l2);
        enum tp_status st = acc ? tp_sampler_sample_draft(s, l2, d1, &r1, &acc) : tp_sampler_sample(s, l2, &r1);
        CU_ASSERT_EQUAL_FATAL(st, TP_OK);
        count[r0.id][r1.id]++;
    }
    tp_sampler_free(s);
    double chi = 0.0;
    for (int a = 0; a < V; a++)
        for (int b = 0; b < V; b++) {
            const double e = DRAWS * joint[a][b];
            chi += (count[a][b] - e) * (count[a][b] - e) / e;
        }
    fprintf(stderr, "two positions: chi2 %.2f (35 degrees of freedom)\n", chi);
    CU_ASSERT(chi < 66.62);
}

static void test_logprobs(void)
{
    const float l[6] = {1.0f, 3.0f, -2.0f, 3.0f, 2.5f, 0.0f};
    struct tp_sampler_params p = tp_sampler_default_params();
    p.temperature = 0.0f;
    p.n_logprobs = 3;
    p.repetition_penalty = 2.0f; /* penalties must not change the reported logprobs */
    tp_sampler_t *s = mk(p, 6);
    tp_sampler_accept(s, 1);
    struct tp_sample_result r;
    CU_ASSERT_EQUAL_FATAL(tp_sampler_sample(s, l, &r), TP_OK);
    double lse = 0.0;
    for (int i = 0; i < 6; i++) lse += exp((double)l[i]);
    lse = log(lse);
    CU_ASSERT_EQUAL(r.id, 3); /* 1 penalised to 1.5 */
    CU_ASSERT_DOUBLE_EQUAL(r.logprob, 3.0 - lse, 1e-5);
    CU_ASSERT_EQUAL_FATAL(r.n_top, 3);
    CU_ASSERT_EQUAL(r.top[0].id, 1);
    CU_ASSERT_EQUAL(r.top[1].id, 3);
    CU_ASSERT_EQUAL(r.top[2].id, 4);
    CU_ASSERT_DOUBLE_EQUAL(r.top[0].logprob, 3.0 - lse, 1e-5);
    CU_ASSERT_DOUBLE_EQUAL(r.top[2].logprob, 2.5 - lse, 1e-5);
    tp_sampler_free(s);
    /* no_logprob: the same choice, no log-softmax pass (0), unless top alternatives are asked for */
    p.n_logprobs = 0;
    p.no_logprob = 1;
    s = mk(p, 6);
    tp_sampler_accept(s, 1);
    CU_ASSERT_EQUAL_FATAL(tp_sampler_sample(s, l, &r), TP_OK);
    CU_ASSERT_EQUAL(r.id, 3);
    CU_ASSERT_EQUAL(r.logprob, 0.0f);
    CU_ASSERT_EQUAL(r.n_top, 0);
    tp_sampler_free(s);
    p.n_logprobs = 1;
    s = mk(p, 6);
    CU_ASSERT_EQUAL_FATAL(tp_sampler_sample(s, l, &r), TP_OK);
    CU_ASSERT_DOUBLE_EQUAL(r.logprob, 3.0 - lse, 1e-5);
    CU_ASSERT_EQUAL(r.n_top, 1);
    tp_sampler_free(s);
}

static void test_invalid(void)
{
    tp_sampler_t *s = (tp_sampler_t *)1;
    struct tp_sampler_params p = tp_sampler_default_params();
    CU_ASSERT_EQUAL(tp_sampler_init(&p, 0, &s), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NULL(s);
    p.top_p = -0.1f;
    CU_ASSERT_EQUAL(tp_sampler_init(&p, 10, &s), TP_ERR_INVALID_ARG);
    p = tp_sampler_default_params();
    p.n_logprobs = 21;
    CU_ASSERT_EQUAL(tp_sampler_init(&p, 10, &s), TP_ERR_INVALID_ARG);
    p = tp_sampler_default_params();
    p.temperature = -1.0f;
    CU_ASSERT_EQUAL(tp_sampler_init(&p, 10, &s), TP_ERR_INVALID_ARG);
    p = tp_sampler_default_params();
    p.repetition_penalty = 0.0f;
    CU_ASSERT_EQUAL(tp_sampler_init(&p, 10, &s), TP_ERR_INVALID_ARG);
    tp_sampler_free(NULL);
    /* all logits -inf: nothing to draw */
    p = tp_sampler_default_params();
    s = mk(p, 3);
    const float l[3] = {-INFINITY, -INFINITY, -INFINITY};
    struct tp_sample_result r;
    CU_ASSERT_EQUAL(tp_sampler_sample(s, l, &r), TP_ERR_INVALID_ARG);
    tp_sampler_accept(s, 99); /* out of range: ignored */
    tp_sampler_free(s);
}

/* logit_bias: -100 bans, +100 forces, other values add; logprobs of the
 * biased logits, banned tokens never listed; a slice applies only its ids. */
static void test_logit_bias(void)
{
    const float l[6] = {1.0f, 3.0f, -2.0f, 3.0f, 2.5f, 0.0f};
    struct tp_sampler_params p = tp_sampler_default_params();
    p.temperature = 0.0f;
    p.n_logprobs = 3;
    int32_t ids[5] = {1, 3, 4};
    float vals[5] = {-100.0f, -100.0f, 1.0f};
    p.n_logit_bias = 3;
    p.bias_id = ids;
    p.bias_val = vals;
    tp_sampler_t *s = mk(p, 6);
    ids[0] = 0; /* the sampler keeps its own copy */
    vals[2] = -100.0f;
    struct tp_sample_result r;
    CU_ASSERT_EQUAL_FATAL(tp_sampler_sample(s, l, &r), TP_OK);
    /* biased logits {1, -inf, -2, -inf, 3.5, 0}: 4 wins */
    double lse = log(exp(1.0) + exp(-2.0) + exp(3.5) + exp(0.0));
    CU_ASSERT_EQUAL(r.id, 4);
    CU_ASSERT_DOUBLE_EQUAL(r.logprob, 3.5 - lse, 1e-5);
    CU_ASSERT_EQUAL_FATAL(r.n_top, 3);
    CU_ASSERT_EQUAL(r.top[0].id, 4);
    CU_ASSERT_EQUAL(r.top[1].id, 0);
    CU_ASSERT_EQUAL(r.top[2].id, 5);
    CU_ASSERT_DOUBLE_EQUAL(r.top[1].logprob, 1.0 - lse, 1e-5);
    tp_sampler_free(s);
    /* banned tokens are not alternatives: 5 of 6 banned leaves one entry */
    int32_t ban5[5] = {0, 1, 2, 3, 4};
    float m100[5] = {-100.0f, -100.0f, -100.0f, -100.0f, -100.0f};
    p.n_logit_bias = 5;
    p.bias_id = ban5;
    p.bias_val = m100;
    s = mk(p, 6);
    CU_ASSERT_EQUAL_FATAL(tp_sampler_sample(s, l, &r), TP_OK);
    CU_ASSERT_EQUAL(r.id, 5);
    CU_ASSERT_DOUBLE_EQUAL(r.logprob, 0.0, 1e-6);
    CU_ASSERT_EQUAL(r.n_top, 1);
    tp_sampler_free(s);
    /* sampling at temperature 1.5 with top-p: only the allowed token is ever drawn */
    p.temperature = 1.5f;
    p.top_p = 0.9f;
    p.n_logprobs = 0;
    s = mk(p, 6);
    for (int i = 0; i < 200; i++) CU_ASSERT_EQUAL(draw(s, l), 5);
    tp_sampler_free(s);
    /* +100 forces the lowest logit at temperature 1 (exp(-105) of mass left to the others) */
    int32_t f[1] = {2};
    float plus[1] = {100.0f};
    p = tp_sampler_default_params();
    p.n_logit_bias = 1;
    p.bias_id = f;
    p.bias_val = plus;
    p.seed = 7;
    s = mk(p, 6);
    for (int i = 0; i < 500; i++) CU_ASSERT_EQUAL(draw(s, l), 2);
    tp_sampler_free(s);
    /* every token banned: nothing to choose (greedy and sampling) */
    int32_t all[6] = {0, 1, 2, 3, 4, 5};
    float m6[6] = {-100.0f, -100.0f, -100.0f, -100.0f, -100.0f, -100.0f};
    p.n_logit_bias = 6;
    p.bias_id = all;
    p.bias_val = m6;
    s = mk(p, 6);
    CU_ASSERT_EQUAL(tp_sampler_sample(s, l, &r), TP_ERR_INVALID_ARG);
    tp_sampler_free(s);
    p.temperature = 0.0f;
    s = mk(p, 6);
    CU_ASSERT_EQUAL(tp_sampler_sample(s, l, &r), TP_ERR_INVALID_ARG);
    tp_sampler_free(s);
    /* bad lists */
    p.n_logit_bias = 1;
    p.bias_id = f;
    f[0] = 6;
    CU_ASSERT_EQUAL(tp_sampler_init(&p, 6, &s), TP_ERR_INVALID_ARG);
    f[0] = -1;
    CU_ASSERT_EQUAL(tp_sampler_init(&p, 6, &s), TP_ERR_INVALID_ARG);
    p.bias_id = NULL;
    CU_ASSERT_EQUAL(tp_sampler_init(&p, 6, &s), TP_ERR_INVALID_ARG);
    /* a rank's slice [10, 20): only ids in it, at id - 10 */
    float row[10] = {0};
    const int32_t sid[4] = {5, 10, 15, 20};
    const float sval[4] = {7.0f, 2.0f, -100.0f, 9.0f};
    tp_logit_bias_apply(row, 10, 10, 4, sid, sval);
    CU_ASSERT_EQUAL(row[0], 2.0f);
    CU_ASSERT(isinf(row[5]) && row[5] < 0);
    for (int i = 0; i < 10; i++)
        if (i != 0 && i != 5) CU_ASSERT_EQUAL(row[i], 0.0f);
}

static int cmp_float_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* 128k vocabulary (Llama 3's size): every top-k draw is one of the 40 largest logits, every
 * top-p draw lies in the 0.95 nucleus, and the reported logprobs are the exact log-softmax of
 * the largest logits, largest first.  (Time per token: `tpserve bench gen`, not a unit test.) */
static void test_large_vocab(void)
{
    enum { N = 128256, DRAWS = 50 };
    float *l = malloc(N * sizeof(float)), *sorted = malloc(N * sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(l);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sorted);
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((double)(x >> 11) / 9007199254740992.0) * 12.0f; /* logits in [0, 12) */
    }
    memcpy(sorted, l, N * sizeof(float));
    qsort(sorted, N, sizeof(float), cmp_float_desc);
    double lse = 0;
    for (int i = 0; i < N; i++) lse += exp((double)sorted[i] - sorted[0]);
    lse = sorted[0] + log(lse);
    struct tp_sampler_params p = tp_sampler_default_params();
    p.temperature = 1.0f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.n_logprobs = 5;
    tp_sampler_t *s = mk(p, N);
    for (int i = 0; i < DRAWS; i++) {
        struct tp_sample_result r;
        CU_ASSERT_EQUAL_FATAL(tp_sampler_sample(s, l, &r), TP_OK);
        CU_ASSERT_FATAL(r.id >= 0 && r.id < N);
        CU_ASSERT(l[r.id] >= sorted[39]);
        CU_ASSERT_EQUAL_FATAL(r.n_top, 5);
        for (int k = 0; k < 5; k++) {
            CU_ASSERT(l[r.top[k].id] == sorted[k]);
            CU_ASSERT_DOUBLE_EQUAL(r.top[k].logprob, (double)sorted[k] - lse, 1e-4);
        }
    }
    tp_sampler_free(s);
    /* top-p alone over the whole vocabulary: the smallest set of largest logits whose
     * probability (at the sampler's temperature) reaches 0.95 */
    p.top_k = 0;
    p.n_logprobs = 0;
    double z = 0, cum = 0;
    for (int i = 0; i < N; i++) z += exp(((double)sorted[i] - sorted[0]) / p.temperature);
    int cut = 0;
    while (cut < N - 1 && (cum += exp(((double)sorted[cut] - sorted[0]) / p.temperature) / z) < 0.95) cut++;
    s = mk(p, N);
    for (int i = 0; i < DRAWS; i++) CU_ASSERT(l[draw(s, l)] >= sorted[cut] - 1e-6f);
    tp_sampler_free(s);
    free(sorted);
    free(l);
}

static const struct tp_test_case sampler_cases[] = {
    {"greedy_ties", test_greedy_ties},
    {"top_k", test_top_k},
    {"top_p", test_top_p},
    {"top_p_flat_large", test_top_p_flat_large},
    {"top_p_oracle", test_top_p_oracle},
    {"min_p_exact", test_min_p_exact},
    {"penalties", test_penalties},
    {"seed", test_seed},
    {"frequencies", test_frequencies},
    {"logprobs", test_logprobs},
    {"invalid", test_invalid},
    {"large_vocab", test_large_vocab},
    {"logit_bias", test_logit_bias},
    {"spec_draft_frequencies", test_spec_draft_frequencies},
    {"spec_two_positions", test_spec_two_positions},
    {NULL, NULL},
};
TP_TEST_SUITE(sampler, "unit", 120, sampler_cases)

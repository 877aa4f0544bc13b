/*
 * model/forward/sampler.c - choosing the next token from a row of logits, in
 * the Hugging Face / vLLM order OpenAI-style clients expect: logit_bias,
 * penalties (repetition as llama.cpp, OpenAI presence / frequency) on a copy,
 * temperature 0 -> greedy argmax (ties to the lowest id), else temperature,
 * top-k, top-p, min-p (each on the survivors of the previous), then a draw
 * with xoshiro256** seeded by splitmix64(seed).  Reported logprobs: the
 * log-softmax after logit_bias (no penalties, T = 1).  The pipeline step by
 * step: docs/api-fields.md ("Sampling").  All scratch is allocated in
 * tp_sampler_init; sampling allocates nothing and never sorts the whole
 * vocabulary unless the nucleus needs it (a bounded heap, O(n log k)).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

struct tp_sampler {
    struct tp_sampler_params p;
    int n_vocab;
    uint64_t rng[4];     /* xoshiro256** state */
    float *work;         /* (n_vocab) penalised / scaled logits, then probabilities */
    int32_t *cand;       /* (n_vocab) candidate ids */
    int32_t *heap;       /* (n_vocab) heap scratch for top-k / top-p selection */
    double hist[2048];   /* top-p: probability mass per float-bit bucket */
    int32_t *counts;     /* (n_vocab) occurrences of each id in the penalty window */
    int32_t *ring;       /* (ring_cap) last accepted ids; NULL when the window is unbounded */
    int ring_cap, ring_len, ring_head;
    int64_t n_hist;      /* distinct-or-not tokens counted (for the "any history" fast path) */
    int n_bias;          /* logit_bias entries (p.bias_id / p.bias_val point at the copies below) */
    int32_t *bias_id;    /* (n_bias) owned copy */
    float *bias_val;     /* (n_bias) owned copy */
    float *biased;       /* (n_vocab) logits after logit_bias; NULL without a bias */
};

void tp_logit_bias_apply(float *row, int vocab_begin, int n, int n_bias, const int32_t *bias_id,
                         const float *bias_val)
{
    for (int i = 0; i < n_bias; i++) {
        int64_t j = (int64_t)bias_id[i] - vocab_begin;
        if (j < 0 || j >= n) continue;
        if (bias_val[i] <= TP_LOGIT_BAN) row[j] = -INFINITY;
        else row[j] += bias_val[i];
    }
}

struct tp_sampler_params tp_sampler_default_params(void)
{
    struct tp_sampler_params p;
    memset(&p, 0, sizeof(p));
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.penalty_last_n = 64;
    p.seed = 0;
    p.n_logprobs = 0;
    return p;
}

#define TP_SAMPLER_HIST 2048

/* Bucket of a float in [0, 1]: its top 11 bits after the sign (monotonic). */
static inline int bucket_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return (int)((u >> 20) & (TP_SAMPLER_HIST - 1));
}

/* ------------------------------------------------------------------ rng */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform double in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * (1.0 / 9007199254740992.0); }

static void rng_seed(uint64_t s[4], uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s[i] = splitmix64(&x);
}

/* ------------------------------------------------------------------ init */

enum tp_status tp_sampler_init(const struct tp_sampler_params *p, int n_vocab, tp_sampler_t **out)
{
    if (!out) return TP_ERR_INVALID_ARG;
    *out = NULL;
    if (!p || n_vocab <= 0) return TP_ERR_INVALID_ARG;
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature) || p->top_k < 0 || !(p->top_p >= 0.0f) ||
        p->top_p > 1.0f || !(p->min_p >= 0.0f) || p->min_p > 1.0f || !(p->repetition_penalty > 0.0f) ||
        !isfinite(p->repetition_penalty) || !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) ||
        p->penalty_last_n < -1 || p->n_logprobs < 0 || p->n_logprobs > 20 || p->n_logit_bias < 0 ||
        (p->n_logit_bias > 0 && (!p->bias_id || !p->bias_val)))
        return TP_ERR_INVALID_ARG;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->bias_id[i] < 0 || p->bias_id[i] >= n_vocab || isnan(p->bias_val[i])) return TP_ERR_INVALID_ARG;

    tp_sampler_t *s = calloc(1, sizeof(*s));
    if (!s) return TP_ERR_NOMEM;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->work = malloc((size_t)n_vocab * sizeof(float));
    s->cand = malloc((size_t)n_vocab * sizeof(int32_t));
    s->heap = malloc((size_t)n_vocab * sizeof(int32_t));
    s->counts = calloc((size_t)n_vocab, sizeof(int32_t));
    if (p->penalty_last_n > 0) {
        s->ring_cap = p->penalty_last_n;
        s->ring = malloc((size_t)s->ring_cap * sizeof(int32_t));
    }
    if (p->n_logit_bias > 0) {
        s->n_bias = p->n_logit_bias;
        s->bias_id = malloc((size_t)s->n_bias * sizeof(int32_t));
        s->bias_val = malloc((size_t)s->n_bias * sizeof(float));
        s->biased = malloc((size_t)n_vocab * sizeof(float));
        if (s->bias_id) memcpy(s->bias_id, p->bias_id, (size_t)s->n_bias * sizeof(int32_t));
        if (s->bias_val) memcpy(s->bias_val, p->bias_val, (size_t)s->n_bias * sizeof(float));
    }
    s->p.bias_id = s->bias_id; /* never the caller's arrays */
    s->p.bias_val = s->bias_val;
    if (!s->work || !s->cand || !s->heap || !s->counts || (s->ring_cap && !s->ring) ||
        (s->n_bias && (!s->bias_id || !s->bias_val || !s->biased))) {
        tp_sampler_free(s);
        return TP_ERR_NOMEM;
    }
    rng_seed(s->rng, p->seed);
    *out = s;
    return TP_OK;
}

void tp_sampler_free(tp_sampler_t *s)
{
    if (!s) return;
    free(s->work);
    free(s->cand);
    free(s->heap);
    free(s->counts);
    free(s->ring);
    free(s->bias_id);
    free(s->bias_val);
    free(s->biased);
    free(s);
}

void tp_sampler_reset(tp_sampler_t *s, uint64_t seed)
{
    if (!s) return;
    memset(s->counts, 0, (size_t)s->n_vocab * sizeof(int32_t));
    s->ring_len = s->ring_head = 0;
    s->n_hist = 0;
    s->p.seed = seed;
    rng_seed(s->rng, seed);
}

void tp_sampler_accept(tp_sampler_t *s, int32_t id)
{
    if (!s || id < 0 || id >= s->n_vocab) return;
    if (s->p.penalty_last_n == 0) return;
    if (s->ring_cap > 0) {
        if (s->ring_len == s->ring_cap) { /* drop the oldest */
            int32_t old = s->ring[s->ring_head];
            s->counts[old]--;
            s->ring[s->ring_head] = id;
            s->ring_head = (s->ring_head + 1) % s->ring_cap;
        } else {
            s->ring[(s->ring_head + s->ring_len) % s->ring_cap] = id;
            s->ring_len++;
        }
    }
    s->counts[id]++;
    s->n_hist++;
}

/* ------------------------------------------------------------------ selection */

/* a ranks before b: larger value, ties to the lower id. */
static inline int ranks_before(const float *v, int32_t a, int32_t b)
{
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

/* Min-heap (the worst kept candidate at the root) helpers over ids keyed by v. */
static void heap_sift_down(int32_t *h, int n, int i, const float *v)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_before(v, h[m], h[l])) m = l;
        if (r < n && ranks_before(v, h[m], h[r])) m = r;
        if (m == i) return;
        int32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void heap_sift_up(int32_t *h, int i, const float *v)
{
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!ranks_before(v, h[parent], h[i])) return;
        int32_t t = h[i];
        h[i] = h[parent];
        h[parent] = t;
        i = parent;
    }
}

/*
 * Put the k best of ids[0..n) (by v, ties to the lower id) into ids[0..k),
 * sorted best first, using heap[k] as scratch (may not alias ids).  The
 * result is a permutation of the input: ids[k..n) hold the others in
 * unspecified order.  O(n log k).
 */
static void select_top(int32_t *ids, int n, int k, const float *v, int32_t *heap)
{
    if (k > n) k = n;
    if (k <= 0) return;
    int hn = 0;
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (hn < k) {
            heap[hn] = id;
            heap_sift_up(heap, hn, v);
            hn++;
        } else if (ranks_before(v, id, heap[0])) {
            heap[0] = id;
            heap_sift_down(heap, hn, 0, v);
        }
    }
    /* move the k winners to the front (a permutation: nothing is lost), then
     * overwrite that front with the winners in order, popping worst first */
    int32_t worst = heap[0];
    int j = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] == worst || ranks_before(v, ids[i], worst)) {
            int32_t t = ids[i];
            ids[i] = ids[j];
            ids[j++] = t;
        }
    }
    TP_ASSERT(j == k);
    for (int i = k - 1; i >= 0; i--) {
        ids[i] = heap[0];
        heap[0] = heap[--hn];
        heap_sift_down(heap, hn, 0, v);
    }
}

/* Argmax over v[0..n), ties to the lowest id. */
static int32_t argmax(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/*
 * Log-softmax of the raw logits: the chosen token and the top n.  Uses the
 * sampler's candidate buffer as scratch for the top-n heap (after the draw).
 */
static void fill_logprobs(tp_sampler_t *s, const float *logits, struct tp_sample_result *res)
{
    int n = s->n_vocab;
    res->logprob = 0.0f;
    res->n_top = 0;
    if (s->p.no_logprob && s->p.n_logprobs <= 0) return;
    float mx = logits[argmax(logits, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)expf(logits[i] - mx);
    double lse = (double)mx + log(sum);
    res->logprob = (float)((double)logits[res->id] - lse);
    res->n_top = 0;
    int nl = s->p.n_logprobs;
    if (nl <= 0) return;
    if (nl > n) nl = n;
    int32_t top[20], heap[20];
    int hn = 0;
    for (int32_t i = 0; i < n; i++) {
        if (hn < nl) {
            heap[hn] = i;
            heap_sift_up(heap, hn, logits);
            hn++;
        } else if (ranks_before(logits, i, heap[0])) {
            heap[0] = i;
            heap_sift_down(heap, hn, 0, logits);
        }
    }
    for (int i = nl - 1; i >= 0; i--) {
        top[i] = heap[0];
        heap[0] = heap[--hn];
        heap_sift_down(heap, hn, 0, logits);
    }
    int kept = 0;
    for (int i = 0; i < nl; i++) {
        if (!(logits[top[i]] > -INFINITY)) break; /* banned (logit_bias -100): not an alternative */
        res->top[kept].id = top[i];
        res->top[kept++].logprob = (float)((double)logits[top[i]] - lse);
    }
    res->n_top = kept;
}

/* Steps 0-1 of the pipeline: logit_bias (the biased row in s->biased; returns the row the later
 * steps read as "logits"), then the penalties into s->work. */
static const float *apply_bias_penalties(tp_sampler_t *s, const float *logits)
{
    const struct tp_sampler_params *p = &s->p;
    const int n = s->n_vocab;
    float *w = s->work;

    /* 0. logit_bias: from here on "logits" are the biased ones */
    if (s->n_bias > 0) {
        memcpy(s->biased, logits, (size_t)n * sizeof(float));
        tp_logit_bias_apply(s->biased, 0, n, s->n_bias, s->bias_id, s->bias_val);
        logits = s->biased;
    }

    /* 1. penalties */
    memcpy(w, logits, (size_t)n * sizeof(float));
    int any_penalty = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (any_penalty && s->n_hist > 0) {
        const float rp = p->repetition_penalty;
        for (int i = 0; i < n; i++) {
            int32_t c = s->counts[i];
            if (c <= 0) continue;
            float l = w[i];
            if (rp != 1.0f) l = l > 0.0f ? l / rp : l * rp;
            l -= p->presence_penalty + p->frequency_penalty * (float)c;
            w[i] = l;
        }
    }
    return logits;
}

/* Top-p over candidates c[0..nc) in no order, weights w: a histogram of the mass by the top bits of
 * the float (positive floats order like their bit patterns: 8 exponent + 3 mantissa bits = 1/8-octave
 * buckets).  The buckets above the one where the running mass crosses the target are wholly inside
 * the nucleus; only the boundary bucket needs sorting.  Reorders c; returns the nucleus size. */
static int top_p_unsorted(tp_sampler_t *s, int32_t *c, int nc, const float *w, double target)
{
    double *hist = s->hist;
    memset(hist, 0, TP_SAMPLER_HIST * sizeof(double));
    for (int i = 0; i < nc; i++) hist[bucket_of(w[c[i]])] += w[c[i]];
    double cum = 0.0;
    int bstar = 0;
    for (int bk = TP_SAMPLER_HIST - 1; bk >= 0; bk--) {
        if (hist[bk] > 0.0 && cum + hist[bk] >= target) { /* non-empty: top_p 0 keeps the best */
            bstar = bk;
            break;
        }
        cum += hist[bk];
    }
    int m = 0;
    for (int i = 0; i < nc; i++) /* bucket above the boundary: in */
        if (bucket_of(w[c[i]]) > bstar) {
            int32_t t = c[i];
            c[i] = c[m];
            c[m++] = t;
        }
    const int lo = m; /* c[lo..hi): the boundary bucket, walked in sorted order */
    for (int i = m; i < nc; i++) /* the boundary bucket next; the rest is out */
        if (bucket_of(w[c[i]]) == bstar) {
            int32_t t = c[i];
            c[i] = c[m];
            c[m++] = t;
        }
    const int hi = m;
    select_top(c + lo, hi - lo, hi - lo, w, s->heap);
    double above = 0.0;
    for (int i = 0; i < lo; i++) above += w[c[i]];
    /* walk on from the exact mass of the buckets above */
    cum = above;
    for (int i = lo; i < hi; i++) {
        cum += w[c[i]];
        if (cum >= target) return i + 1;
    }
    return hi;
}

/* Step 4b, top-p: the smallest best-first prefix of c[0..nc) holding top_p of the mass (c sorted
 * best first when sorted is set). Returns the new count. */
static int apply_top_p(tp_sampler_t *s, int32_t *c, int nc, int sorted, const float *w)
{
    double total = 0.0;
    for (int i = 0; i < nc; i++) total += w[c[i]];
    const double target = (double)s->p.top_p * total;
    if (!sorted) return top_p_unsorted(s, c, nc, w, target);
    double cum = 0.0;
    for (int i = 0; i < nc; i++) {
        cum += w[c[i]];
        if (cum >= target) return i + 1;
    }
    return nc;
}

/* Step 4c, min-p: keeps the candidates at least min_p times the best one's weight. Returns the count. */
static int apply_min_p(int32_t *c, int nc, float frac, const float *w)
{
    float best = 0.0f;
    for (int i = 0; i < nc; i++)
        if (w[c[i]] > best) best = w[c[i]];
    float thr = frac * best;
    int m = 0;
    for (int i = 0; i < nc; i++)
        if (w[c[i]] >= thr) c[m++] = c[i];
    return m;
}

/*
 * Steps 0-4 of the pipeline on one row: logit_bias (*logits then points at
 * the biased row), penalties, and either greedy (*greedy_id set, *nc 0) or
 * temperature, top-k, top-p and min-p, leaving the survivors in
 * s->cand[0..*nc) with unnormalised weights s->work[id] (*greedy_id -1).
 * TP_ERR_INVALID_ARG when no token can be chosen.
 */
static enum tp_status sampler_prepare(tp_sampler_t *s, const float **logits_io, int32_t *greedy_id, int *nc_out)
{
    const struct tp_sampler_params *p = &s->p;
    const int n = s->n_vocab;
    float *w = s->work;

    *logits_io = apply_bias_penalties(s, *logits_io);
    *nc_out = 0;
    *greedy_id = -1;

    /* 2. greedy */
    if (p->temperature <= 0.0f || p->top_k == 1) {
        const int32_t id = argmax(w, n);
        if (!(w[id] > -INFINITY)) return TP_ERR_INVALID_ARG; /* every token banned (or NaN) */
        *greedy_id = id;
        return TP_OK;
    }

    /* 3. temperature, then probabilities relative to the maximum (unnormalised) */
    const float inv_t = 1.0f / p->temperature;
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        w[i] *= inv_t;
        if (w[i] > mx) mx = w[i];
    }
    if (!isfinite(mx)) return TP_ERR_INVALID_ARG; /* all -inf or NaN/inf logits */
    int32_t *c = s->cand;
    int nc = 0;
    for (int i = 0; i < n; i++) {
        float e = expf(w[i] - mx);
        w[i] = e; /* w now holds exp(l - max): 1 for the best token */
        if (e > 0.0f) c[nc++] = i;
    }
    int sorted = 0; /* c[0..nc) sorted best first */

    /* 4a. top-k */
    if (p->top_k > 0 && p->top_k < nc) {
        select_top(c, nc, p->top_k, w, s->heap);
        nc = p->top_k;
        sorted = 1;
    }
    /* 4b. top-p */
    if (p->top_p < 1.0f && nc > 1) nc = apply_top_p(s, c, nc, sorted, w);
    /* 4c. min-p: w[best] == 1 relative to the maximum over the survivors */
    if (p->min_p > 0.0f && nc > 1) nc = apply_min_p(c, nc, p->min_p, w);

    *nc_out = nc;
    return TP_OK;
}

/* The candidate c[0..nc) (weights w[c[i]], skipping token `skip`; -1 skips none) where the running
 * sum of weights first exceeds u; the last one walked when u is not below the total. */
static int32_t draw(const float *w, const int32_t *c, int nc, int32_t skip, double u)
{
    int32_t chosen = -1;
    double cum = 0.0;
    for (int i = 0; i < nc; i++) {
        if (c[i] == skip) continue;
        chosen = c[i];
        cum += w[c[i]];
        if (u < cum) break;
    }
    return chosen;
}

enum tp_status tp_sampler_sample(tp_sampler_t *s, const float *logits, struct tp_sample_result *res)
{
    if (!s || !logits || !res) return TP_ERR_INVALID_ARG;
    int32_t gid;
    int nc;
    enum tp_status rc = sampler_prepare(s, &logits, &gid, &nc);
    if (rc != TP_OK) return rc;
    if (gid >= 0) {
        res->id = gid;
        fill_logprobs(s, logits, res);
        return TP_OK;
    }
    const float *w = s->work;
    const int32_t *c = s->cand;

    /* 5. draw */
    double total = 0.0;
    for (int i = 0; i < nc; i++) total += w[c[i]];
    res->id = draw(w, c, nc, -1, rng_uniform(s->rng) * total);
    fill_logprobs(s, logits, res);
    return TP_OK;
}

/*
 * Speculative sampling with a deterministic draft (q = 1 on the drafted
 * token d): accept d with probability p(d), else draw from p with d removed
 * (the residual max(p - q, 0), renormalised).  The token returned is
 * distributed exactly as p, whatever the draft: P(d) = p(d) and, for x != d,
 * P(x) = (1 - p(d)) p(x) / (1 - p(d)) = p(x).  Greedy: the argmax, accepted
 * when it is the draft (no random numbers used).  One uniform per call, a
 * second one on a rejection.
 */
enum tp_status tp_sampler_sample_draft(tp_sampler_t *s, const float *logits, int32_t draft,
                                       struct tp_sample_result *res, int *accepted)
{
    if (!s || !logits || !res || !accepted) return TP_ERR_INVALID_ARG;
    *accepted = 0;
    int32_t gid;
    int nc;
    enum tp_status rc = sampler_prepare(s, &logits, &gid, &nc);
    if (rc != TP_OK) return rc;
    if (gid >= 0) {
        res->id = gid;
        *accepted = gid == draft;
        fill_logprobs(s, logits, res);
        return TP_OK;
    }
    const float *w = s->work;
    const int32_t *c = s->cand;
    double total = 0.0, pd = 0.0;
    for (int i = 0; i < nc; i++) {
        total += w[c[i]];
        if (c[i] == draft) pd = w[c[i]];
    }
    const double u = rng_uniform(s->rng) * total;
    const double rest = total - pd;
    if (pd > 0.0 && (u < pd || !(rest > 0.0))) {
        res->id = draft;
        *accepted = 1;
    } else {
        /* the residual: every survivor but the draft, in the order the plain draw walks them */
        res->id = draw(w, c, nc, draft, rng_uniform(s->rng) * rest);
    }
    fill_logprobs(s, logits, res);
    return TP_OK;
}

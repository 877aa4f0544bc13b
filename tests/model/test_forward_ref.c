/*
 * tests/model/test_forward_ref.c - the forward pass of every architecture
 * against an independent naive reference, and sharding on quantized models.
 *
 *   - Synthetic F32 models of the test shapes (llama, llama3 rope scaling +
 *     tied embeddings + 4:1 GQA, qwen2 QKV bias, qwen3 q/k norm with
 *     head_dim != n_embd/n_head) are written with tp_synth_write; a
 *     straightforward double-precision implementation written here from the
 *     architecture descriptions (full recompute, no KV cache, no kernels)
 *     gives the logits at every position; tp_model_forward must agree.
 *   - Q8_0 / Q4_0 models split over 2 in-process ranks (heads, block-aligned
 *     FFN columns, vocab) equal the dense model; a split that cuts a quant
 *     block is refused with a message naming the block.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward/model_impl.h"
#include "model/gguf.h"
#include "model/kernels.h"
#include "model/model.h"
#include "model/synth.h"
#include "tp_test.h"
#include "model_test_util.h"

static const char *synth(const char *shape_name, enum tp_wtype type)
{
    return tm_synth_gguf(NULL, shape_name, type, TP_SYNTH_MIX_NONE, 7, "");
}

/* ------------------------------------------------------------ naive reference */

/* tol: allowed max |diff| relative to max(1, max |logit|): ~1e-7 is reached
 * with F32 weights; quantized weights also quantize the activations (Q8). */
static void check_type_against_reference(const char *shape_name, int expect_neox, enum tp_wtype type, double tol)
{
    enum { N = 40 };
    const char *path = synth(shape_name, type);
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    struct tm_ref r;
    memset(&r, 0, sizeof(r));
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, shape_name, &r.s, &err), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &r.g, &err), TP_OK);
    r.neox = expect_neox;
    tp_model_t *m = tm_open(path, 2, 64, N, NULL, &err);
    if (!m) fprintf(stderr, "%s: %s\n", shape_name, err.msg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    const struct tp_hparams *hp = tp_model_hparams(m);
    CU_ASSERT_EQUAL(hp->n_embd, r.s.n_embd);
    CU_ASSERT_EQUAL(hp->head_dim, r.s.head_dim);
    CU_ASSERT_EQUAL(hp->n_head_kv, r.s.n_head_kv);
    CU_ASSERT_EQUAL(hp->rope_neox, expect_neox);
    CU_ASSERT_EQUAL(hp->tied_embeddings, r.s.tied);
    CU_ASSERT_EQUAL(hp->has_qkv_bias, r.s.qkv_bias);
    CU_ASSERT_EQUAL(hp->has_qk_norm, r.s.qk_norm);
    int V = r.s.n_vocab;
    int ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 37 + 5) % V;
    double *ref = malloc(sizeof(double) * N * V);
    tm_ref_forward(&r, ids, N, ref, NULL);
    /* half prefilled in one batch, the rest one token at a time */
    float *lg = malloc(sizeof(float) * N * V);
    int32_t tok[N], pos[N], seq[N];
    int8_t want[N];
    for (int i = 0; i < N; i++) {
        tok[i] = ids[i];
        pos[i] = i;
        seq[i] = 0;
        want[i] = 1;
    }
    CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){N / 2, tok, pos, seq, want}, lg), TP_OK);
    for (int i = N / 2; i < N; i++)
        CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){1, tok + i, pos + i, seq + i, want + i}, lg + (size_t)i * V),
                        TP_OK);
    double maxd = 0, maxabs = 0;
    for (int i = 0; i < N * V; i++) {
        maxd = fmax(maxd, fabs(lg[i] - ref[i]));
        maxabs = fmax(maxabs, fabs(ref[i]));
    }
    if (maxd > tol * fmax(1.0, maxabs) || getenv("TP_TEST_VERBOSE"))
        fprintf(stderr, "%s %s: max |logit - reference| = %g (max |logit| %g)\n", shape_name, tp_wtype_name(type), maxd,
                maxabs);
    CU_ASSERT(maxabs > 1e-3); /* the comparison means something */
    CU_ASSERT(maxd <= tol * fmax(1.0, maxabs));
    free(ref);
    free(lg);
    tp_model_free(m);
    tp_gguf_close(r.g);
}

static void check_against_reference(const char *shape_name, int expect_neox)
{
    check_type_against_reference(shape_name, expect_neox, TP_WTYPE_F32, 1e-4);
}

static void test_ref_llama(void) { check_against_reference("test-tiny", 0); }
static void test_ref_llama3(void) { check_against_reference("test-tiny-llama3", 0); }
static void test_ref_qwen2(void) { check_against_reference("test-tiny-qwen2", 1); }
static void test_ref_qwen3(void) { check_against_reference("test-tiny-qwen3", 1); }
static void test_ref_quantized(void)
{
    check_type_against_reference("test-tiny-qwen3", 1, TP_WTYPE_F16, 1e-5);
    check_type_against_reference("test-tiny-qwen2", 1, TP_WTYPE_BF16, 1e-5);
    check_type_against_reference("test-tiny", 0, TP_WTYPE_Q8_0, 1.5e-2);
    check_type_against_reference("test-tiny-llama3", 0, TP_WTYPE_Q4_0, 1.5e-2);
}

/* ------------------------------------------------------------ final hidden states (embeddings) */

static double cosine(const double *a, const double *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    return ab / sqrt(aa * bb);
}

/* tp_model_hidden of every token of a batch (prefilled in two chunks) against
 * the reference's normed final state; then the embeddings built from them,
 * mean and last-token pooling, L2-normalised: cosine >= 0.9999 with the
 * reference's (F32 weights agree to ~1e-6; the bound leaves room for
 * summation order only).  An index outside the last batch is refused. */
static void test_hidden_against_reference(void)
{
    enum { N = 24 };
    const char *shape_name = "test-tiny-qwen3";
    const char *path = synth(shape_name, TP_WTYPE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    struct tm_ref r;
    memset(&r, 0, sizeof(r));
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, shape_name, &r.s, &err), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &r.g, &err), TP_OK);
    r.neox = 1;
    tp_model_t *m = tm_open(path, 2, 64, N, NULL, &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    const int V = r.s.n_vocab, E = r.s.n_embd;
    int ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 53 + 11) % V;
    double *lref = malloc(sizeof(double) * N * V), *href = malloc(sizeof(double) * N * E);
    tm_ref_forward(&r, ids, N, lref, href);
    int32_t tok[N], pos[N], seq[N];
    int8_t want[N];
    for (int i = 0; i < N; i++) tok[i] = ids[i], pos[i] = i, seq[i] = 0, want[i] = i == N - 1;
    float *h = malloc(sizeof(float) * E), *lg = malloc(sizeof(float) * V);
    double *hd = malloc(sizeof(double) * E), *mean = calloc((size_t)E, sizeof(double)), *mref = calloc((size_t)E, sizeof(double));
    double worst = 1;
    const int half = N / 2;
    for (int part = 0; part < 2; part++) {
        const int t0 = part ? half : 0, nt = part ? N - half : half;
        CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &(struct tp_batch){nt, tok + t0, pos + t0, seq + t0, want + t0}, lg),
                              TP_OK);
        for (int t = 0; t < nt; t++) {
            CU_ASSERT_EQUAL_FATAL(tp_model_hidden(m, t, h), TP_OK);
            for (int k = 0; k < E; k++) hd[k] = h[k], mean[k] += h[k], mref[k] += href[(size_t)(t0 + t) * E + k];
            worst = fmin(worst, cosine(hd, href + (size_t)(t0 + t) * E, E));
            double md = 0;
            for (int k = 0; k < E; k++) md = fmax(md, fabs(hd[k] - href[(size_t)(t0 + t) * E + k]));
            CU_ASSERT(md < 1e-4);
        }
        CU_ASSERT_EQUAL(tp_model_hidden(m, nt, h), TP_ERR_INVALID_ARG);
        CU_ASSERT_EQUAL(tp_model_hidden(m, -1, h), TP_ERR_INVALID_ARG);
    }
    if (getenv("TP_TEST_VERBOSE")) fprintf(stderr, "hidden: worst cosine %.9f\n", worst);
    CU_ASSERT(worst >= 0.9999);
    /* pooled: mean of all tokens, and the last token */
    CU_ASSERT(cosine(mean, mref, E) >= 0.9999);
    CU_ASSERT(cosine(hd, href + (size_t)(N - 1) * E, E) >= 0.9999);
    /* and the pooled vectors of different prompts differ (the check can fail) */
    CU_ASSERT(cosine(mean, href, E) < 0.999);
    free(lref), free(href), free(h), free(lg), free(hd), free(mean), free(mref);
    tp_model_free(m);
    tp_gguf_close(r.g);
}

/* ------------------------------------------------------------ 2 ranks, quantized */

static void shard_check_path(const char *path, const char *shape_name, enum tp_wtype type,
                             const struct tp_model_shard *a, const struct tp_model_shard *b)
{
    enum { N = 8 };
    struct tm_shard_run r;
    CU_ASSERT_EQUAL_FATAL(tm_shard_pair_run(path, 64, a, b, N, &r), 0);
    double maxd = 0, maxabs = 0;
    for (size_t i = 0; i < (size_t)N * r.V; i++) {
        maxd = fmax(maxd, fabs(r.sharded[i] - r.dense[i]));
        maxabs = fmax(maxabs, fabs(r.dense[i]));
    }
    /* activations are re-quantized from differently-rounded partial sums: small slack */
    if (maxd > 2e-2 * fmax(1.0, maxabs)) fprintf(stderr, "%s %s shard: max diff %g (max %g)\n", shape_name,
                                                 tp_wtype_name(type), maxd, maxabs);
    CU_ASSERT(maxabs > 1e-3);
    CU_ASSERT(maxd <= 2e-2 * fmax(1.0, maxabs));
    CU_ASSERT(r.smaller);
    tm_shard_run_free(&r);
}

static void shard_check(const char *shape_name, enum tp_wtype type, const struct tp_model_shard *a,
                        const struct tp_model_shard *b)
{
    const char *path = synth(shape_name, type);
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    shard_check_path(path, shape_name, type, a, b);
}

/* Sliding window 3 over 8 tokens at 2 ranks (one KV head each, its ring of window + batch rows) equals the
 * dense windowed model. */
static void test_shard_window(void)
{
    struct tp_shape s;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "test-tiny", &s, &err), TP_OK);
    s.sliding_window = 3;
    char path[600];
    snprintf(path, sizeof path, "%s/test-tiny-window3.gguf", tp_test_tmpdir());
    struct tp_synth_config sc = tp_synth_default_config();
    sc.shape = &s;
    sc.type = TP_WTYPE_F32;
    sc.seed = 3;
    sc.out_path = path;
    CU_ASSERT_EQUAL_FATAL(tp_synth_write(&sc, &err), TP_OK);
    struct tp_model_shard a = {0, 2, 0, 1, 0, 64, 0, 256, NULL, NULL, 0, 0, 0, 0, 0};
    struct tp_model_shard b = {2, 4, 1, 2, 64, 128, 256, 512, NULL, NULL, 0, 0, 0, 0, 0};
    shard_check_path(path, "test-tiny window 3", TP_WTYPE_F32, &a, &b);
}

static void test_shard_qwen2_q8(void)
{
    /* 4 heads (hd 16), 2 kv heads, ff 160 (blocks of 32: split at 96), vocab 512 */
    struct tp_model_shard a = {0, 2, 0, 1, 0, 96, 0, 200, NULL, NULL, 0, 0, 0, 0, 0};
    struct tp_model_shard b = {2, 4, 1, 2, 96, 160, 200, 512, NULL, NULL, 0, 0, 0, 0, 0};
    shard_check("test-tiny-qwen2", TP_WTYPE_Q8_0, &a, &b);
}
static void test_shard_qwen3_q4(void)
{
    /* head_dim 32: a rank holding 1 of 4 q heads still cuts attn_output on a block */
    struct tp_model_shard a = {0, 1, 0, 1, 0, 64, 0, 256, NULL, NULL, 0, 0, 0, 0, 0};
    struct tp_model_shard b = {1, 4, 0, 2, 64, 128, 256, 512, NULL, NULL, 0, 0, 0, 0, 0};
    shard_check("test-tiny-qwen3", TP_WTYPE_Q4_0, &a, &b);
}
static void test_shard_llama3_tied(void)
{
    /* 4 q heads share 1 kv head (replicated on both ranks); tied output sliced from token_embd */
    struct tp_model_shard a = {0, 2, 0, 1, 0, 64, 0, 100, NULL, NULL, 0, 0, 0, 0, 0};
    struct tp_model_shard b = {2, 4, 0, 1, 64, 96, 100, 384, NULL, NULL, 0, 0, 0, 0, 0};
    shard_check("test-tiny-llama3", TP_WTYPE_Q8_0, &a, &b);
}

/* The model of a window test: r->s (test-tiny with the caller's sliding window and changes) written as an F32
 * model to file in the test directory (synthetic weights of seed), opened for the reference (r->g, r->window)
 * and loaded with n_ctx positions, n_seq slots, batches of nb and a kt cache (2 threads). */
static tp_model_t *open_window_model(struct tm_ref *r, const char *file, uint64_t seed, int n_ctx, int n_seq, int nb,
                                     enum tp_kv_type kt)
{
    struct tp_error err = {0};
    char path[600];
    snprintf(path, sizeof path, "%s/%s", tp_test_tmpdir(), file);
    struct tp_synth_config sc = tp_synth_default_config();
    sc.shape = &r->s;
    sc.type = TP_WTYPE_F32;
    sc.seed = seed;
    sc.out_path = path;
    CU_ASSERT_EQUAL_FATAL(tp_synth_write(&sc, &err), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &r->g, &err), TP_OK);
    r->window = r->s.sliding_window;
    tp_model_t *m = tm_open_kv(path, 2, n_ctx, n_seq, nb, kt, &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    return m;
}

/*
 * Sliding window 6 and attention sinks on test-tiny (2 KV heads, 2 Q heads
 * each) against the naive reference: the window's KV cache is a ring of
 * window + n_batch = 11 rows (its memory does not grow with n_ctx 64);
 * prefill in chunks of 5 crosses the ring's end several times; a prefix of
 * 25 positions copied into another slot (past the window edge) continues
 * exactly like the reference; a copy or a continuation that needs positions
 * the ring no longer holds is refused with a message.
 */
static void check_window(enum tp_kv_type kt, double tol)
{
    enum { N = 40, W = 6, NB = 5 };
    struct tp_error err = {0};
    struct tm_ref r;
    memset(&r, 0, sizeof(r));
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "test-tiny", &r.s, &err), TP_OK);
    r.s.sliding_window = W;
    tp_model_t *m = open_window_model(&r, "test-tiny-window.gguf", 11, 64, 3, NB, kt);
    CU_ASSERT_EQUAL(tp_model_hparams(m)->sliding_window, W);
    /* 2 layers x 3 slots x 2 KV heads x (W + NB) rows x 16 dims, K and V */
    CU_ASSERT_EQUAL(tp_model_kv_bytes(m), 2ull * 2 * 3 * 2 * (W + NB) * tp_kv_row_bytes(kt, 16));
    /* what plan / info count for it (tp_kv_head_bytes: per KV head and sequence) is what was allocated */
    CU_ASSERT_EQUAL(tp_model_kv_bytes(m), 3 * 2 * tp_kv_head_bytes(tp_model_hparams(m), 64, NB, kt));
    static float sinks[2][4];
    for (int l = 0; l < 2; l++) {
        float *s = tp_aligned_alloc(64, 64);
        CU_ASSERT_PTR_NOT_NULL_FATAL(s);
        for (int h = 0; h < 4; h++) s[h] = sinks[l][h] = 0.7f * (float)(h - l) + 0.3f;
        m->layers[l].attn_sinks = s;
        r.sinks[l] = sinks[l];
    }
    const int V = r.s.n_vocab;
    int ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 53 + 7) % V;
    double *ref = malloc(sizeof(double) * N * V);
    float *lg = malloc(sizeof(float) * N * V);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    CU_ASSERT_PTR_NOT_NULL_FATAL(lg);
    tm_ref_forward(&r, ids, N, ref, NULL);
    int32_t tok[N], pos[N], seq[N];
    int8_t want[N];
    for (int i = 0; i < N; i++) tok[i] = ids[i], pos[i] = i, want[i] = 1;
    /* feed [from, to) of slot s in chunks of NB, logits rows into lg */
#define FEED(s, from, to)                                                                                               \
    for (int p0 = (from); p0 < (to); p0 += NB) {                                                                       \
        const int n_ = (to) - p0 < NB ? (to) - p0 : NB;                                                                \
        for (int i = 0; i < n_; i++) seq[p0 + i] = (s);                                                                \
        CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){n_, tok + p0, pos + p0, seq + p0, want + p0},          \
                                         lg + (size_t)p0 * V),                                                         \
                        TP_OK);                                                                                        \
    }
    double maxabs = 0;
    for (int i = 0; i < N * V; i++) maxabs = fmax(maxabs, fabs(ref[i]));
#define CHECK_ROWS(from, to, what)                                                                                      \
    do {                                                                                                               \
        double d_ = 0;                                                                                                 \
        for (size_t i = (size_t)(from) * V; i < (size_t)(to) * V; i++) d_ = fmax(d_, fabs(lg[i] - ref[i]));           \
        if (d_ > tol * fmax(1.0, maxabs) || getenv("TP_TEST_VERBOSE"))                                                 \
            fprintf(stderr, "window %s %s: max |logit - reference| %g (max |logit| %g)\n", tp_kv_type_name(kt), what,  \
                    d_, maxabs);                                                                                       \
        CU_ASSERT(d_ <= tol * fmax(1.0, maxabs));                                                                      \
    } while (0)
    FEED(0, 0, 30);
    CHECK_ROWS(0, 30, "prefill 0..30 in chunks");
    CU_ASSERT_EQUAL(tp_model_seq_reusable(m, 0, 25), 25);
    CU_ASSERT_EQUAL(tp_model_seq_reusable(m, 0, 30), 30);
    CU_ASSERT_EQUAL(tp_model_seq_reusable(m, 0, 0), 0);
    CU_ASSERT_EQUAL(tp_model_seq_reusable(m, 0, 15), 0); /* the ring holds 19..29: window of 15 is 10..15 */
    CU_ASSERT_EQUAL(tp_model_kv_copy(m, 2, 0, 15), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_model_last_error(m), "sliding-window"));
    CU_ASSERT_EQUAL(tp_model_kv_copy(m, 1, 0, 25), TP_OK);
    FEED(1, 25, N);
    CHECK_ROWS(25, N, "copied prefix 25, then 25..40");
    FEED(0, 30, N);
    CHECK_ROWS(30, N, "slot 0 on to 40");
    /* a copied prefix holds its last window only: slot 1 cannot go back to 20 */
    tp_model_seq_truncate(m, 1, 20);
    CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){1, tok + 20, pos + 20, seq + 20, want + 20}, lg), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_model_last_error(m), "sliding-window ring"));
    /* cleared, it starts over */
    tp_model_seq_truncate(m, 1, 0);
    FEED(1, 0, 10);
    CHECK_ROWS(0, 10, "slot 1 cleared and refilled");
#undef FEED
#undef CHECK_ROWS
    free(ref);
    free(lg);
    tp_model_free(m);
    tp_gguf_close(r.g);
}

/*
 * A bf16 cache (tiles of 64 positions, heads of 32) with sliding window 70, on the best attention path (in place
 * on avx512bf16) and on float32: its ring is window + n_batch = 75 rows rounded
 * up to 2 whole tiles (128; n_ctx 512); 300 positions in chunks of 5 wrap it twice, the tiles read in place
 * from any position (the attention path's masked edges); a 280-position prefix copied into another slot (whole
 * tiles) continues like the reference; positions the ring no longer holds are refused.
 */
static void test_window_bf16_tiles(void)
{
    enum { N = 300, W = 70, NB = 5, COPY = 280 };
    struct tp_error err = {0};
    struct tm_ref r;
    memset(&r, 0, sizeof(r));
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "test-tiny", &r.s, &err), TP_OK);
    r.s.sliding_window = W;
    r.s.n_ctx = 512;
    r.s.n_head = 2, r.s.n_head_kv = 1, r.s.head_dim = 32; /* the bf16 attention path's head size */
    tp_model_t *m = open_window_model(&r, "test-tiny-window70.gguf", 12, 512, 2, NB, TP_KV_BF16);
    /* 2 layers x 2 slots x 1 KV head x 128 rows x 32 dims x 2 bytes, K and V; as plan / info count it */
    CU_ASSERT_EQUAL(tp_model_kv_bytes(m), 2ull * 2 * 2 * 1 * 128 * 64);
    CU_ASSERT_EQUAL(tp_model_kv_bytes(m), 2 * 1 * tp_kv_head_bytes(tp_model_hparams(m), 512, NB, TP_KV_BF16));
    const int V = r.s.n_vocab;
    static int ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 53 + 7) % V;
    double *ref = malloc(sizeof(double) * N * V);
    float *lg = malloc(sizeof(float) * N * V);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    CU_ASSERT_PTR_NOT_NULL_FATAL(lg);
    tm_ref_forward(&r, ids, N, ref, NULL);
    static int32_t tok[N], pos[N], seq[N];
    static int8_t want[N];
    for (int i = 0; i < N; i++) tok[i] = ids[i], pos[i] = i, want[i] = 1;
    double maxabs = 0;
    for (int i = 0; i < N * V; i++) maxabs = fmax(maxabs, fabs(ref[i]));
    const double tol = 3e-3 * fmax(1.0, maxabs); /* bf16 keys and values: ~2^-9 relative each */
    for (int k = 0; k < 3; k++) { /* slot 0 to COPY; the copy in slot 1 on to N; slot 0 on to N */
        const int s0 = k == 1, from = k == 0 ? 0 : COPY, to = k == 0 ? COPY : N;
        if (k == 1) CU_ASSERT_EQUAL(tp_model_kv_copy(m, 1, 0, COPY), TP_OK);
        for (int p0 = from; p0 < to; p0 += NB) {
            const int n = to - p0 < NB ? to - p0 : NB;
            for (int i = 0; i < n; i++) seq[p0 + i] = s0;
            CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){n, tok + p0, pos + p0, seq + p0, want + p0},
                                             lg + (size_t)p0 * V),
                            TP_OK);
        }
        double d = 0;
        for (size_t i = (size_t)from * V; i < (size_t)to * V; i++) d = fmax(d, fabs(lg[i] - ref[i]));
        if (d > tol || getenv("TP_TEST_VERBOSE"))
            fprintf(stderr, "window bf16 tiles, positions %d..%d: max |logit - reference| %g (max |logit| %g)\n",
                    from, to, d, maxabs);
        CU_ASSERT(d <= tol);
        if (k == 0) { /* the ring holds positions 152..279: a continuation at 200 needs 131.. */
            CU_ASSERT_EQUAL(tp_model_seq_reusable(m, 0, 200), 0);
            CU_ASSERT_EQUAL(tp_model_seq_reusable(m, 0, 230), 230);
        }
    }
    free(ref);
    free(lg);
    tp_model_free(m);
    tp_gguf_close(r.g);
}

static void test_window_sinks(void)
{
    check_window(TP_KV_F32, 1e-4);
    check_window(TP_KV_F16, 3e-3);
}

static void test_shard_cuts_block(void)
{
    const char *path = synth("test-tiny", TP_WTYPE_Q8_0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    struct tp_model_shard a = {0, 2, 0, 1, 0, 48, 0, 512, NULL, NULL, 0, 0, 0, 0, 0}; /* ff 48: not a multiple of 32 */
    struct tp_error err = {0};
    tp_model_t *m = tm_open(path, 1, 64, 4, &a, &err);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_EQUAL(err.status, TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "ffn_down"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "block"));
    tp_model_free(m);
}

/* Copy src to a new file with the first occurrence of the n bytes `from` replaced by `to`. */
static const char *patched(const char *src, const char *name, const char *from, const char *to, size_t n)
{
    static char paths[4][600];
    static int slot;
    size_t len;
    char *data = tp_test_read_file(src, &len);
    if (!data) return NULL;
    char *p = NULL;
    for (size_t i = 0; i + n <= len && !p; i++)
        if (memcmp(data + i, from, n) == 0) p = data + i;
    if (!p) {
        free(data);
        return NULL;
    }
    memcpy(p, to, n);
    char *out = paths[slot++ % 4];
    snprintf(out, 600, "%s/%s", tp_test_tmpdir(), name);
    FILE *f = fopen(out, "wb");
    if (f) {
        fwrite(data, 1, len, f);
        fclose(f);
    }
    free(data);
    return f ? out : NULL;
}

static void expect_refused(const char *path, enum tp_status want, const char *needle)
{
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    struct tp_error err = {0};
    tp_model_t *m = tm_open(path, 1, 64, 4, NULL, &err);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_EQUAL(err.status, want);
    if (!strstr(err.msg, needle)) fprintf(stderr, "message lacks '%s': %s\n", needle, err.msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, needle));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, path));
    tp_model_free(m);
}

/* Valid GGUF files whose model content is wrong or unsupported. */
static void test_model_refusals(void)
{
    const char *ok = synth("test-tiny", TP_WTYPE_Q8_0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ok);
    /* the architecture value: u64 length 5 then "llama" */
    expect_refused(patched(ok, "arch.gguf", "\x05\0\0\0\0\0\0\0llama", "\x05\0\0\0\0\0\0\0gpt2x", 13),
                   TP_ERR_UNSUPPORTED, "architecture 'gpt2x'");
    expect_refused(patched(ok, "nolayers.gguf", "llama.block_count", "llama.block_coun_", 17), TP_ERR_FORMAT,
                   "'llama.block_count' is missing");
    expect_refused(patched(ok, "notensor.gguf", "blk.1.ffn_up.weight", "blk.1.ffn_uX.weight", 19), TP_ERR_FORMAT,
                   "tensor 'blk.1.ffn_up.weight' is missing");
    /* without head_count_kv the model claims 4 KV heads: attn_k's shape no longer fits */
    expect_refused(patched(ok, "nokv.gguf", "llama.attention.head_count_kv", "llama.attention.head_count_kX", 29),
                   TP_ERR_FORMAT, "'blk.0.attn_k.weight' has shape [64, 32], expected [64, 64]");
}

/* every case on the float32 attention: see TM_F32_ATTN */
TM_F32_ATTN(test_model_refusals)
/* tp_op_rmsnorm against a double-precision oracle (written here): lengths around its 8-wide
 * partial sums (tails 0..7), values over 12 orders of magnitude and in place; each output within
 * 4 float ulps-ish (2e-7 relative) of x * w / rms. */
static void test_rmsnorm_oracle(void)
{
    static const int ns[] = {1, 7, 8, 9, 15, 64, 100, 128, 2048, 2051, 5632};
    uint64_t seed = 7;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int n = ns[k];
        float *x = malloc((size_t)n * sizeof(float)), *w = malloc((size_t)n * sizeof(float));
        float *y = malloc((size_t)n * sizeof(float));
        CU_ASSERT_FATAL(x && w && y);
        for (int i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            const double u = (double)(seed >> 11) / 9007199254740992.0; /* [0, 1) */
            x[i] = (float)((u - 0.5) * pow(10.0, (double)(i % 13) - 6.0));
            w[i] = (float)(0.5 + u);
        }
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
        const double r = 1.0 / sqrt(ss / n + 1e-6);
        tp_op_rmsnorm(y, x, w, n, 1e-6f);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            const double want = (double)x[i] * r * (double)w[i];
            bad += fabs((double)y[i] - want) > 2e-7 * fabs(want) + 1e-30;
        }
        CU_ASSERT_EQUAL(bad, 0);
        tp_op_rmsnorm(x, x, w, n, 1e-6f); /* in place: the same values */
        CU_ASSERT_EQUAL(memcmp(x, y, (size_t)n * sizeof(float)), 0);
        free(x);
        free(w);
        free(y);
    }
}

TM_F32_ATTN(test_ref_llama)
TM_F32_ATTN(test_ref_llama3)
TM_F32_ATTN(test_ref_qwen2)
TM_F32_ATTN(test_ref_qwen3)
TM_F32_ATTN(test_ref_quantized)
TM_F32_ATTN(test_hidden_against_reference)
TM_F32_ATTN(test_window_sinks)
TM_F32_ATTN(test_window_bf16_tiles)
TM_F32_ATTN(test_shard_window)
TM_F32_ATTN(test_shard_qwen2_q8)
TM_F32_ATTN(test_shard_qwen3_q4)
TM_F32_ATTN(test_shard_llama3_tied)
TM_F32_ATTN(test_shard_cuts_block)

static const struct tp_test_case ref_cases[] = {
    {"model_refusals", test_model_refusals_f32_attn},
    {"rmsnorm_oracle", test_rmsnorm_oracle},
    {"ref_llama", test_ref_llama_f32_attn},
    {"ref_llama3_rope_scaling_tied", test_ref_llama3_f32_attn},
    {"ref_qwen2_bias", test_ref_qwen2_f32_attn},
    {"ref_qwen3_qk_norm", test_ref_qwen3_f32_attn},
    {"ref_f16_bf16_q8_0_q4_0", test_ref_quantized_f32_attn},
    {"hidden_states_embeddings", test_hidden_against_reference_f32_attn},
    {"ref_window_sinks", test_window_sinks_f32_attn},
    {"window_bf16_tiles", test_window_bf16_tiles},
    {"window_bf16_tiles_f32_attn", test_window_bf16_tiles_f32_attn},
    {"shard_window", test_shard_window_f32_attn},
    {"shard_qwen2_q8_0", test_shard_qwen2_q8_f32_attn},
    {"shard_qwen3_q4_0", test_shard_qwen3_q4_f32_attn},
    {"shard_llama3_tied", test_shard_llama3_tied_f32_attn},
    {"shard_cuts_block", test_shard_cuts_block_f32_attn},
    {NULL, NULL}};
TP_TEST_SUITE(forward_ref, "unit,model", 120, ref_cases)

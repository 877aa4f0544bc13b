/*
 * tests/model/test_forward.c - the forward pass against oracles:
 *   - stories260K greedy decode from BOS equals the 201 reference ids, and the
 *     logits at positions 0-2 match the float64 reference top-5 within 1e-3;
 *   - the same ids with 1 and 2 threads, prefilled in one batch, and decoded
 *     as 3 staggered sequences in one continuous batch;
 *   - a 2-rank shard (heads, FFN columns and vocab split) run in one process
 *     with an all_sum hook that adds the two partials equals the dense model;
 *   - bad batches and bad shards are refused with clear errors.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model_test_util.h"
#include "tp_test.h"

#define REF_N 201

struct ref {
    int ids[REF_N];
    int top_id[3][5];
    float top_logit[3][5];
};

static const char *model_path(void) { return tp_test_repo_path("models/stories260K.gguf"); }

static int load_ref(struct ref *r)
{
    size_t len;
    char *txt = tp_test_read_file(tp_test_repo_path("models/stories260K.reference_greedy.json"), &len);
    if (!txt) return -1;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) return -1;
    int ok = 0;
    cJSON *ids = cJSON_GetObjectItem(j, "token_ids_including_bos");
    if (cJSON_GetArraySize(ids) == REF_N) {
        for (int i = 0; i < REF_N; i++) r->ids[i] = cJSON_GetArrayItem(ids, i)->valueint;
        ok = 1;
    }
    cJSON *steps = cJSON_GetObjectItem(j, "logits_top5_first_steps");
    for (int s = 0; s < 3 && ok; s++) {
        cJSON *top = cJSON_GetObjectItem(cJSON_GetArrayItem(steps, s), "top5");
        if (cJSON_GetArraySize(top) != 5) ok = 0;
        for (int k = 0; k < 5 && ok; k++) {
            cJSON *pair = cJSON_GetArrayItem(top, k);
            r->top_id[s][k] = cJSON_GetArrayItem(pair, 0)->valueint;
            r->top_logit[s][k] = (float)cJSON_GetArrayItem(pair, 1)->valuedouble;
        }
    }
    cJSON_Delete(j);
    return ok ? 0 : -1;
}

static int g_kv_f16; /* tests of the fp16 KV cache set this around open_model */

static tp_model_t *open_model(int threads, int n_seq, int n_batch, const struct tp_model_shard *shard)
{
    struct tp_model_config cfg = tp_model_default_config();
    cfg.kv_f16 = g_kv_f16;
    cfg.path = model_path();
    cfg.n_threads = threads;
    cfg.n_ctx = 256;
    cfg.n_seq = n_seq;
    cfg.n_batch = n_batch;
    cfg.shard = shard;
    struct tp_error err = {0};
    tp_model_t *m = NULL;
    enum tp_status rc = tp_model_init(&cfg, &m, &err);
    if (rc != TP_OK) fprintf(stderr, "tp_model_init: %s\n", err.msg);
    CU_ASSERT_EQUAL(rc, TP_OK);
    return m;
}

/* Greedy decode n tokens from BOS one at a time into ids (ids[0] = BOS). */
static void greedy(tp_model_t *m, int *ids, int n, float (*logits_first)[512])
{
    float logits[512];
    ids[0] = 1;
    for (int p = 0; p < n; p++) {
        int32_t tok = ids[p], pos = p, seq = 0;
        int8_t want = 1;
        struct tp_batch b = {1, &tok, &pos, &seq, &want};
        enum tp_status rc = tp_model_forward(m, &b, logits);
        CU_ASSERT_EQUAL_FATAL(rc, TP_OK);
        if (logits_first && p < 3) memcpy(logits_first[p], logits, sizeof(logits));
        ids[p + 1] = tm_argmax(logits, 512);
    }
}

static void test_golden_greedy(void)
{
    struct ref r;
    CU_ASSERT_EQUAL_FATAL(load_ref(&r), 0);
    tp_model_t *m = open_model(1, 1, 16, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    const struct tp_hparams *hp = tp_model_hparams(m);
    CU_ASSERT_EQUAL(hp->n_vocab, 512);
    CU_ASSERT_EQUAL(hp->n_embd, 64);
    CU_ASSERT_EQUAL(hp->n_layer, 5);
    CU_ASSERT_EQUAL(hp->n_head_kv, 4);
    CU_ASSERT_EQUAL(hp->arch, TP_ARCH_LLAMA);
    int ids[REF_N];
    float first[3][512];
    greedy(m, ids, REF_N - 1, first);
    int mismatch = -1;
    for (int i = 0; i < REF_N && mismatch < 0; i++)
        if (ids[i] != r.ids[i]) mismatch = i;
    if (mismatch >= 0) fprintf(stderr, "first mismatch at %d: got %d want %d\n", mismatch, ids[mismatch], r.ids[mismatch]);
    CU_ASSERT_EQUAL(mismatch, -1);
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 5; k++) {
            float got = first[s][r.top_id[s][k]];
            if (fabsf(got - r.top_logit[s][k]) > 1e-3f)
                fprintf(stderr, "pos %d id %d: logit %.5f want %.5f\n", s, r.top_id[s][k], got, r.top_logit[s][k]);
            CU_ASSERT(fabsf(got - r.top_logit[s][k]) <= 1e-3f);
        }
    struct tp_model_stats st;
    tp_model_get_stats(m, &st);
    CU_ASSERT_EQUAL(st.n_forward, (uint64_t)(REF_N - 1));
    CU_ASSERT_EQUAL(st.n_tokens, (uint64_t)(REF_N - 1));
    CU_ASSERT_EQUAL(st.ns_all_sum, 0u);
    /* every kind of job ran, and together they fit in the forward calls' wall time */
    CU_ASSERT(st.ns_prep > 0 && st.ns_matmul > 0 && st.ns_attn > 0 && st.ns_logits > 0);
    CU_ASSERT(st.ns_prep + st.ns_matmul + st.ns_attn + st.ns_logits <= st.ns_forward);
    tp_model_free(m);
}

static void test_threads_same_tokens(void)
{
    struct ref r;
    CU_ASSERT_EQUAL_FATAL(load_ref(&r), 0);
    tp_model_t *m = open_model(2, 1, 16, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(tp_model_n_threads(m), 2);
    int ids[REF_N];
    greedy(m, ids, REF_N - 1, NULL);
    CU_ASSERT_EQUAL(memcmp(ids, r.ids, sizeof(ids)), 0);
    /* run again after clearing the slot: identical */
    tp_model_seq_truncate(m, 0, 0);
    int ids2[REF_N];
    greedy(m, ids2, REF_N - 1, NULL);
    CU_ASSERT_EQUAL(memcmp(ids2, r.ids, sizeof(ids2)), 0);
    tp_model_free(m);
}

/* Prefill the first 100 reference ids in one call: argmax after position i is ref[i+1]. */
static void test_prefill_batch(void)
{
    struct ref r;
    CU_ASSERT_EQUAL_FATAL(load_ref(&r), 0);
    enum { N = 100 };
    tp_model_t *m = open_model(2, 1, N, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    static float logits[N][512];
    int32_t tok[N], pos[N], seq[N];
    int8_t want[N];
    for (int i = 0; i < N; i++) {
        tok[i] = r.ids[i];
        pos[i] = i;
        seq[i] = 0;
        want[i] = 1;
    }
    struct tp_batch b = {N, tok, pos, seq, want};
    CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &b, &logits[0][0]), TP_OK);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += tm_argmax(logits[i], 512) != r.ids[i + 1];
    CU_ASSERT_EQUAL(bad, 0);
    for (int k = 0; k < 5; k++) CU_ASSERT(fabsf(logits[1][r.top_id[1][k]] - r.top_logit[1][k]) <= 1e-3f);
    /* continue decoding from the prefilled cache: next token matches */
    float next[512];
    int32_t t1 = r.ids[N], p1 = N, s1 = 0;
    int8_t w1 = 1;
    struct tp_batch b1 = {1, &t1, &p1, &s1, &w1};
    CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &b1, next), TP_OK);
    CU_ASSERT_EQUAL(tm_argmax(next, 512), r.ids[N + 1]);
    tp_model_free(m);
}

/* Three sequences decoded in one batch per step, started at different steps;
 * sequence 2 begins with a 20-token prefill chunk mixed into a decode batch. */
static void test_continuous_batching(void)
{
    struct ref r;
    CU_ASSERT_EQUAL_FATAL(load_ref(&r), 0);
    tp_model_t *m = open_model(2, 3, 32, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    enum { STEPS = 80 };
    int ids[3][STEPS + 40];
    int len[3] = {0, 0, 0};   /* tokens already fed */
    int start[3] = {0, 7, 15};
    static float logits[32][512];
    int32_t tok[32], pos[32], seq[32];
    int8_t want[32];
    for (int s = 0; s < 3; s++) ids[s][0] = 1;
    for (int step = 0; step < STEPS + 20; step++) {
        int n = 0;
        int which[32];
        for (int s = 0; s < 3; s++) {
            if (step < start[s] || len[s] >= STEPS) continue;
            if (s == 2 && len[s] == 0) {
                /* prefill 20 reference tokens at once */
                for (int i = 0; i < 20; i++) {
                    ids[s][i] = r.ids[i];
                    tok[n] = r.ids[i];
                    pos[n] = i;
                    seq[n] = s;
                    want[n] = i == 19;
                    which[n] = s;
                    n++;
                }
                len[s] = 20;
                continue;
            }
            tok[n] = ids[s][len[s]];
            pos[n] = len[s];
            seq[n] = s;
            want[n] = 1;
            which[n] = s;
            n++;
            len[s]++;
        }
        if (n == 0) break;
        CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &(struct tp_batch){n, tok, pos, seq, want}, &logits[0][0]), TP_OK);
        int o = 0;
        for (int i = 0; i < n; i++)
            if (want[i]) {
                int s = which[i];
                ids[s][len[s]] = tm_argmax(logits[o], 512);
                o++;
            }
    }
    for (int s = 0; s < 3; s++) {
        CU_ASSERT_EQUAL(len[s], STEPS);
        CU_ASSERT_EQUAL(memcmp(ids[s], r.ids, sizeof(int) * (STEPS + 1)), 0);
    }
    tp_model_free(m);
}

static void test_bad_batches(void)
{
    tp_model_t *m = open_model(1, 2, 4, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    float logits[512];
    int32_t tok = 1, pos = 0, seq = 0;
    int8_t want = 1;
    struct tp_batch b = {1, &tok, &pos, &seq, &want};
    tok = 512;
    CU_ASSERT_EQUAL(tp_model_forward(m, &b, logits), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_model_last_error(m), "token id 512"));
    tok = 1;
    seq = 2;
    CU_ASSERT_EQUAL(tp_model_forward(m, &b, logits), TP_ERR_INVALID_ARG);
    seq = 0;
    pos = 5; /* skips ahead of an empty cache */
    CU_ASSERT_EQUAL(tp_model_forward(m, &b, logits), TP_ERR_INVALID_ARG);
    pos = 256; /* past n_ctx */
    CU_ASSERT_EQUAL(tp_model_forward(m, &b, logits), TP_ERR_INVALID_ARG);
    b.n_tokens = 5; /* > n_batch */
    CU_ASSERT_EQUAL(tp_model_forward(m, &b, logits), TP_ERR_INVALID_ARG);
    b.n_tokens = 1;
    pos = 0;
    CU_ASSERT_EQUAL(tp_model_forward(m, &b, logits), TP_OK);
    CU_ASSERT_EQUAL(tm_argmax(logits, 512), 403);
    /* one sequence's positions out of order within a batch */
    int32_t t2[2] = {403, 407}, p2[2] = {1, 1}, s2[2] = {0, 0};
    int8_t w2[2] = {0, 1};
    CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){2, t2, p2, s2, w2}, logits), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_model_last_error(m), "not after"));
    /* a failed batch leaves the slot as it was: position 1 continues it */
    p2[0] = 1;
    p2[1] = 2;
    CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){2, t2, p2, s2, w2}, logits), TP_OK);
    CU_ASSERT_EQUAL(tm_argmax(logits, 512), 261);
    tp_model_free(m);

    /* bad config and missing file */
    struct tp_model_config cfg = tp_model_default_config();
    struct tp_error err = {0};
    tp_model_t *m2 = (tp_model_t *)1;
    cfg.path = "/nonexistent/model.gguf";
    CU_ASSERT_NOT_EQUAL(tp_model_init(&cfg, &m2, &err), TP_OK);
    CU_ASSERT_PTR_NULL(m2);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/nonexistent/model.gguf"));
    tp_model_free(NULL);
}

/* ------------------------------------------------------------ 2-rank shard */

struct rank_run {
    tp_model_t *m;
    int n_steps;
    const int *ids;      /* input ids (teacher forcing) */
    float (*logits)[256]; /* [n_steps][256] this rank's vocab rows */
    enum tp_status rc;
};

static void *rank_main(void *arg)
{
    struct rank_run *rr = arg;
    rr->rc = TP_OK;
    for (int p = 0; p < rr->n_steps && rr->rc == TP_OK; p++) {
        int32_t tok = rr->ids[p], pos = p, seq = 0;
        int8_t want = 1;
        struct tp_batch b = {1, &tok, &pos, &seq, &want};
        rr->rc = tp_model_forward(rr->m, &b, rr->logits[p]);
    }
    return NULL;
}

static void test_shard_two_ranks(void)
{
    struct ref r;
    CU_ASSERT_EQUAL_FATAL(load_ref(&r), 0);
    enum { N = 40 };
    struct tm_pair s; /* the in-process all_sum of model_test_util.c */
    tm_pair_init(&s);
    s.tmp[0] = calloc(64 * 16, sizeof(float));
    s.tmp[1] = calloc(64 * 16, sizeof(float));
    struct tm_pair_rank rc0 = {&s, 0}, rc1 = {&s, 1};
    /* rank 0: q heads 0-3 (kv 0-1), ff 0-99, vocab 0-255; rank 1 the rest */
    struct tp_model_shard sh0 = {0, 4, 0, 2, 0, 100, 0, 256, tm_pair_all_sum, &rc0, 0, 0, 0, 0, 0};
    struct tp_model_shard sh1 = {4, 8, 2, 4, 100, 172, 256, 512, tm_pair_all_sum, &rc1, 0, 0, 0, 0, 0};
    tp_model_t *m0 = open_model(1, 1, 16, &sh0);
    tp_model_t *m1 = open_model(2, 1, 16, &sh1);
    tp_model_t *dense = open_model(1, 1, 16, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dense);
    CU_ASSERT(tp_model_weight_bytes(m0) < tp_model_weight_bytes(dense));
    static float l0[N][256], l1[N][256], ld[N][512];
    struct rank_run r0 = {m0, N, r.ids, l0, TP_OK}, r1 = {m1, N, r.ids, l1, TP_OK};
    pthread_t th;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, rank_main, &r1), 0);
    rank_main(&r0);
    pthread_join(th, NULL);
    CU_ASSERT_EQUAL(r0.rc, TP_OK);
    CU_ASSERT_EQUAL(r1.rc, TP_OK);
    float maxdiff = 0.0f;
    int bad_argmax = 0;
    for (int p = 0; p < N; p++) {
        int32_t tok = r.ids[p], pos = p, seq = 0;
        int8_t want = 1;
        CU_ASSERT_EQUAL_FATAL(tp_model_forward(dense, &(struct tp_batch){1, &tok, &pos, &seq, &want}, ld[p]), TP_OK);
        float joined[512];
        memcpy(joined, l0[p], sizeof(l0[p]));
        memcpy(joined + 256, l1[p], sizeof(l1[p]));
        for (int i = 0; i < 512; i++) maxdiff = fmaxf(maxdiff, fabsf(joined[i] - ld[p][i]));
        bad_argmax += tm_argmax(joined, 512) != r.ids[p + 1];
    }
    if (maxdiff > 1e-3f) fprintf(stderr, "shard vs dense max |diff| %g\n", (double)maxdiff);
    CU_ASSERT(maxdiff <= 1e-3f);
    CU_ASSERT_EQUAL(bad_argmax, 0);
    struct tp_model_stats st;
    tp_model_get_stats(m0, &st);
    CU_ASSERT(st.ns_all_sum > 0);
    CU_ASSERT(st.ns_all_sum <= st.ns_forward);
    tp_model_free(m0);
    tp_model_free(m1);
    tp_model_free(dense);
    free(s.tmp[0]);
    free(s.tmp[1]);
    tm_pair_destroy(&s);
}

static void test_bad_shard(void)
{
    struct tp_model_config cfg = tp_model_default_config();
    cfg.path = model_path();
    cfg.n_threads = 1;
    cfg.n_ctx = 16;
    struct tp_error err = {0};
    tp_model_t *m = NULL;
    /* Q heads 0-3 need KV heads 0-1 */
    struct tp_model_shard sh = {0, 4, 2, 4, 0, 172, 0, 512, NULL, NULL, 0, 0, 0, 0, 0};
    cfg.shard = &sh;
    CU_ASSERT_EQUAL(tp_model_init(&cfg, &m, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "KV heads"));
    struct tp_model_shard sh2 = {0, 9, 0, 4, 0, 172, 0, 512, NULL, NULL, 0, 0, 0, 0, 0};
    cfg.shard = &sh2;
    memset(&err, 0, sizeof(err));
    CU_ASSERT_EQUAL(tp_model_init(&cfg, &m, &err), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "do not fit"));
}

/* fp16 KV cache: the same greedy tokens, logits close to the f32 reference;
 * continuous batching still equals decoding alone. */
static void test_kv_f16(void)
{
    struct ref r;
    CU_ASSERT_EQUAL_FATAL(load_ref(&r), 0);
    g_kv_f16 = 1;
    tp_model_t *m = open_model(2, 1, 16, NULL);
    g_kv_f16 = 0;
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    int ids[REF_N];
    float first[3][512];
    greedy(m, ids, REF_N - 1, first);
    int same = 0;
    while (same < REF_N && ids[same] == r.ids[same]) same++;
    if (same < REF_N) fprintf(stderr, "kv_f16: first %d of %d ids equal the reference\n", same, REF_N);
    CU_ASSERT_EQUAL(same, REF_N);
    float maxd = 0;
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 5; k++) maxd = fmaxf(maxd, fabsf(first[s][r.top_id[s][k]] - r.top_logit[s][k]));
    CU_ASSERT(maxd <= 1e-2f);
    tp_model_free(m);
    /* really stored in fp16: logits differ a little from the f32 cache's */
    tp_model_t *m32 = open_model(2, 1, 16, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m32);
    int ids32[4];
    float first32[3][512];
    greedy(m32, ids32, 3, first32);
    float d32 = 0;
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 512; i++) d32 = fmaxf(d32, fabsf(first32[s][i] - first[s][i]));
    CU_ASSERT(d32 > 0.0f && d32 < 1e-2f);
    tp_model_free(m32);
    g_kv_f16 = 1;
    test_continuous_batching();
    g_kv_f16 = 0;
}

struct prog {
    uint64_t done, total, calls, backwards;
};
static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
    struct prog *p = ctx;
    if (done < p->done) p->backwards++;
    p->done = done;
    p->total = total;
    p->calls++;
}

/* The progress callback ends at done == total == the bytes the rank holds. */
static void test_progress(void)
{
    struct tp_model_shard sh = {2, 6, 1, 3, 40, 120, 100, 300, NULL, NULL, 0, 0, 0, 0, 0};
    for (int i = 0; i < 2; i++) {
        struct prog p = {0, 0, 0, 0};
        struct tp_model_config cfg = tp_model_default_config();
        cfg.path = model_path();
        cfg.n_threads = 1;
        cfg.n_ctx = 16;
        cfg.shard = i ? &sh : NULL;
        cfg.progress = on_progress;
        cfg.progress_ctx = &p;
        struct tp_error err = {0};
        tp_model_t *m = NULL;
        CU_ASSERT_EQUAL_FATAL(tp_model_init(&cfg, &m, &err), TP_OK);
        CU_ASSERT(p.calls > 10);
        CU_ASSERT_EQUAL(p.backwards, 0u);
        CU_ASSERT_EQUAL(p.done, p.total);
        CU_ASSERT_EQUAL(p.total, tp_model_weight_bytes(m));
        /* whole: every tensor of the file (all f32); shard: less */
        if (i == 0) CU_ASSERT_EQUAL(p.total, 1185376u - 14176u);
        if (i == 1) CU_ASSERT(p.total < 1185376u - 14176u);
        tp_model_free(m);
    }
}

static const struct tp_test_case forward_cases[] = {
    {"progress", test_progress},
    {"kv_f16", test_kv_f16},
    {"golden_greedy", test_golden_greedy},
    {"threads_same_tokens", test_threads_same_tokens},
    {"prefill_batch", test_prefill_batch},
    {"continuous_batching", test_continuous_batching},
    {"bad_batches", test_bad_batches},
    {"shard_two_ranks", test_shard_two_ranks},
    {"bad_shard", test_bad_shard},
    {NULL, NULL}};
TP_TEST_SUITE(forward, "unit,model", 120, forward_cases)

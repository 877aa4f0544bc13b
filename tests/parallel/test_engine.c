/*
 * tests/parallel/test_engine.c - the engine in one process (world of 1, no
 * network): argument checks happen before anything is sent and do not
 * poison the engine, the distributed-argmax API agrees with a scan of the
 * full logits, clears work, ping works, and a rank-0 engine refuses the
 * worker loop.  The multi-rank behaviour is in test_multirank.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/parallel.h"
#include "tp_test.h"

static tp_parallel_t *open_stories(void)
{
    const char *m = tp_test_repo_path("models/stories260K.gguf");
    if (access(m, R_OK) != 0) return NULL;
    struct tp_parallel_config cfg = tp_parallel_default_config();
    cfg.model.path = m;
    cfg.model.n_threads = 1;
    cfg.model.n_ctx = 64;
    cfg.model.n_seq = 2;
    cfg.model.n_batch = 8;
    cfg.comm.world_size = 1;
    cfg.comm.rank = 0;
    tp_parallel_t *p = NULL;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL(tp_parallel_init(&cfg, &p, &e), TP_OK);
    if (!p) fprintf(stderr, "init: %s\n", e.msg);
    return p;
}

/* Bad inputs to a step (st: 3 tokens of seq 0, whose ids and sequences are tok and seq): refused before
 * anything runs, the engine stays usable. */
static void w1_bad_inputs(tp_parallel_t *p, struct tp_step *st, int32_t *tok, int32_t *seq, float *logits)
{
    const int V = tp_parallel_hparams(p)->n_vocab;
    tok[1] = V;
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, logits), TP_ERR_INVALID_ARG);
    CU_ASSERT(strstr(tp_parallel_last_error(p), "out of range") != NULL);
    tok[1] = 5;
    seq[2] = 2;
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, logits), TP_ERR_INVALID_ARG);
    seq[2] = 0;
    st->batch.n_tokens = 9; /* > n_batch */
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, logits), TP_ERR_INVALID_ARG);
    st->batch.n_tokens = 3;
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, NULL), TP_ERR_INVALID_ARG);
    /* logit_bias entries: row beyond the logits rows, id beyond the vocabulary, bias beyond +-100, NULL list */
    int32_t brow[1] = {1}, bid[1] = {3};
    float bval[1] = {1.0f};
    st->n_bias = 1;
    st->bias_row = brow;
    st->bias_id = bid;
    st->bias_val = bval;
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, logits), TP_ERR_INVALID_ARG); /* one logits row: row 1 is out */
    CU_ASSERT(strstr(tp_parallel_last_error(p), "logit_bias") != NULL);
    brow[0] = 0;
    bid[0] = V;
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, logits), TP_ERR_INVALID_ARG);
    bid[0] = 3;
    bval[0] = -100.5f;
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, logits), TP_ERR_INVALID_ARG);
    bval[0] = NAN;
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, logits), TP_ERR_INVALID_ARG);
    st->bias_id = NULL;
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, logits), TP_ERR_INVALID_ARG);
    st->n_bias = -1;
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, logits), TP_ERR_INVALID_ARG);
    st->n_bias = 0;
    CU_ASSERT_EQUAL(tp_parallel_is_poisoned(p), 0);
    CU_ASSERT_EQUAL(tp_parallel_worker_loop(p), TP_ERR_INVALID_ARG);

}

/* Full logits of st, then the same step again after a clear through the greedy and top-k APIs; a step that
 * only clears. */
static void w1_greedy_topk(tp_parallel_t *p, struct tp_step *st, float *logits)
{
    const int V = tp_parallel_hparams(p)->n_vocab;
    CU_ASSERT_EQUAL_FATAL(tp_parallel_step(p, st, logits), TP_OK);
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    int32_t clear_seq[1] = {0}, clear_from[1] = {0}, id = -1;
    float maxv = 0;
    struct tp_step again = {st->batch, 1, clear_seq, clear_from, 0, NULL, NULL, NULL,
                            0, NULL, NULL, NULL, 0, NULL, NULL};
    CU_ASSERT_EQUAL_FATAL(tp_parallel_step_greedy(p, &again, &id, &maxv), TP_OK);
    CU_ASSERT_EQUAL(id, best);
    CU_ASSERT_EQUAL(maxv, logits[best]);
    /* top-k: the 8 best of the full row, highest first, and its log-sum-exp */
    struct tp_parallel_cand top[8];
    float lse = 0;
    CU_ASSERT_EQUAL_FATAL(tp_parallel_step_topk(p, &again, 8, top, &lse), TP_OK);
    double mx = logits[best], sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    CU_ASSERT_DOUBLE_EQUAL(lse, mx + log(sum), 1e-4);
    CU_ASSERT_EQUAL(top[0].id, best);
    for (int j = 0; j < 8; j++) {
        CU_ASSERT_EQUAL(top[j].logit, logits[top[j].id]);
        if (j > 0) CU_ASSERT(top[j].logit <= top[j - 1].logit);
        int above = 0; /* exactly j entries of the row beat the j-th candidate */
        for (int i = 0; i < V; i++) above += logits[i] > top[j].logit;
        CU_ASSERT(above <= j);
    }
    CU_ASSERT_EQUAL(tp_parallel_step_topk(p, &again, TP_PARALLEL_TOPK_MAX + 1, top, &lse), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(tp_parallel_step_topk(p, &again, 0, top, &lse), TP_ERR_INVALID_ARG);
    /* without the clear, positions 0..2 of seq 0 are taken: the model refuses, engine not poisoned */
    enum tp_status rs = tp_parallel_step(p, st, logits);
    if (rs != TP_OK) {
        CU_ASSERT_EQUAL(rs, TP_ERR_INVALID_ARG);
        CU_ASSERT_EQUAL(tp_parallel_is_poisoned(p), 0);
    }
    /* a step that only clears */
    struct tp_step only_clear = {{0, NULL, NULL, NULL, NULL}, 1, clear_seq, clear_from, 0, NULL, NULL, NULL,
                                 0, NULL, NULL, NULL, 0, NULL, NULL};
    CU_ASSERT_EQUAL(tp_parallel_step(p, &only_clear, NULL), TP_OK);
    CU_ASSERT_EQUAL(tp_parallel_ping(p), TP_OK);

}

/* KV copy lists: out-of-range entries are refused before anything is sent; a copy of more positions than
 * the source holds is refused by the model; neither poisons; a good copy continues the source. */
static void w1_kv_copy(tp_parallel_t *p, struct tp_step *st, float *logits)
{
    const int V = tp_parallel_hparams(p)->n_vocab;
    CU_ASSERT_EQUAL(tp_parallel_step(p, st, logits), TP_OK); /* seq 0 holds 3 positions */
    int32_t cd[1] = {1}, cs[1] = {0}, cl[1] = {3};
    struct tp_step cp = {{0, NULL, NULL, NULL, NULL}, 0, NULL, NULL, 1, cd, cs, cl, 0, NULL, NULL, NULL, 0, NULL, NULL};
    const int n_ctx = tp_model_n_ctx(tp_parallel_model(p));
    struct {
        int n, d, s, l;
    } bad[] = {{1, 2, 0, 3}, {1, -1, 0, 3}, {1, 1, 2, 3}, {1, 0, 0, 3}, {1, 1, 0, -1}, {1, 1, 0, n_ctx + 1},
               {3, 1, 0, 3},  {-1, 1, 0, 3}};
    for (size_t i = 0; i < TP_ARRAY_LEN(bad); i++) {
        cp.n_copy = bad[i].n;
        cd[0] = bad[i].d;
        cs[0] = bad[i].s;
        cl[0] = bad[i].l;
        CU_ASSERT_EQUAL(tp_parallel_step(p, &cp, NULL), TP_ERR_INVALID_ARG);
        CU_ASSERT(strstr(tp_parallel_last_error(p), "cop") != NULL);
    }
    cp.n_copy = 1;
    cp.copy_len = NULL;
    CU_ASSERT_EQUAL(tp_parallel_step(p, &cp, NULL), TP_ERR_INVALID_ARG);
    CU_ASSERT(strstr(tp_parallel_last_error(p), "NULL") != NULL);
    cp.copy_len = cl;
    cd[0] = 1;
    cs[0] = 0;
    cl[0] = 4; /* seq 0 holds only 3 */
    CU_ASSERT_EQUAL(tp_parallel_step(p, &cp, NULL), TP_ERR_INVALID_ARG);
    CU_ASSERT(strstr(tp_parallel_last_error(p), "holds only 3") != NULL);
    CU_ASSERT_EQUAL(tp_parallel_is_poisoned(p), 0);
    /* a good copy with a batch continuing the copy: seq 1 then gives seq 0's logits for the same token */
    cl[0] = 3;
    int32_t t2[2] = {7, 7}, p2[2] = {3, 3}, s2[2] = {0, 1};
    int8_t w2[2] = {1, 1};
    cp.batch = (struct tp_batch){2, t2, p2, s2, w2};
    CU_ASSERT_EQUAL(tp_parallel_step(p, &cp, logits), TP_OK);
    CU_ASSERT_EQUAL(memcmp(logits, logits + V, (size_t)V * sizeof(float)), 0);
    CU_ASSERT_EQUAL(tp_parallel_ping(p), TP_OK);

}

/* One rank through the public API: refusals, logits, greedy and top-k, KV copies, the stats. */
static void test_world1_api(void)
{
    tp_parallel_t *p = open_stories();
    if (!p) {
        tp_test_skip("models/stories260K.gguf not found");
        return;
    }
    CU_ASSERT_EQUAL(tp_parallel_rank(p), 0);
    CU_ASSERT_EQUAL(tp_parallel_size(p), 1);
    CU_ASSERT_EQUAL(tp_parallel_get_plan(p)->world_size, 1);
    const int V = tp_parallel_hparams(p)->n_vocab;
    float *logits = malloc(2 * (size_t)V * sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(logits);

    int32_t tok[3] = {1, 5, 9}, pos[3] = {0, 1, 2}, seq[3] = {0, 0, 0};
    int8_t want[3] = {0, 0, 1};
    struct tp_step st = {{3, tok, pos, seq, want}, 0, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, NULL, NULL};
    w1_bad_inputs(p, &st, tok, seq, logits);
    w1_greedy_topk(p, &st, logits);
    w1_kv_copy(p, &st, logits);

    struct tp_parallel_stats s;
    tp_parallel_get_stats(p, &s);
    CU_ASSERT(s.n_steps >= 3);
    CU_ASSERT(s.n_tokens >= 6);
    CU_ASSERT(s.ns_compute > 0);
    CU_ASSERT_EQUAL(s.ns_comm, 0);
    CU_ASSERT_EQUAL(s.bytes_sent, 0);
    free(logits);
    tp_parallel_free(p);
    tp_parallel_free(NULL);
}

static void test_init_refusals(void)
{
    struct tp_parallel_config cfg = tp_parallel_default_config();
    cfg.comm.world_size = 1;
    tp_parallel_t *p = (tp_parallel_t *)1;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL(tp_parallel_init(&cfg, &p, &e), TP_ERR_INVALID_ARG); /* no path */
    CU_ASSERT_PTR_NULL(p);
    cfg.model.path = "/nonexistent/model.gguf";
    tp_error_clear(&e);
    CU_ASSERT_NOT_EQUAL(tp_parallel_init(&cfg, &p, &e), TP_OK);
    CU_ASSERT(strstr(e.msg, "/nonexistent/model.gguf") != NULL);
    cfg.model.path = tp_test_repo_path("models/stories260K.gguf");
    cfg.shard_weights = "1,2"; /* two weights for one rank */
    tp_error_clear(&e);
    CU_ASSERT_EQUAL(tp_parallel_init(&cfg, &p, &e), TP_ERR_INVALID_ARG);
    CU_ASSERT(strstr(e.msg, "one per rank") != NULL);
    cfg.shard_weights = NULL;
    cfg.wire_dtype = TP_WIRE_COUNT;
    tp_error_clear(&e);
    CU_ASSERT_EQUAL(tp_parallel_init(&cfg, &p, &e), TP_ERR_INVALID_ARG);
}

static const struct tp_test_case engine_cases[] = {
    {"world1_api", test_world1_api},
    {"init_refusals", test_init_refusals},
    {NULL, NULL},
};
TP_TEST_SUITE(engine, "unit,model", 60, engine_cases)

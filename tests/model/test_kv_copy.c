/*
 * tests/model/test_kv_copy.c - tp_model_kv_copy (prefix sharing between
 * sequence slots) on the bundled stories260K model, f32 and f16 KV caches:
 *   - slot A prefills a 48-token prompt; its first L positions are copied
 *     into slot B, which prefills the rest: B's last-token logits and its
 *     next decode step's logits equal, bit for bit, those of a slot C that
 *     prefilled the same prompt itself in the same chunks (same rows, same
 *     kernels: the copy must be exact), and A's (one 48-token chunk) within
 *     1e-5 of the largest logit;
 *   - the copy sets the destination's length exactly (a position past L is
 *     refused, also when the destination held more before), the source is
 *     left intact (the same step again gives the same rows), n_pos 0 clears;
 *   - bad arguments (seq ids, dst == src, n_pos < 0, > n_ctx, > what the
 *     source holds, NULL model) are refused with TP_ERR_INVALID_ARG and a
 *     message, and change nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "tp_test.h"

#define V 512     /* stories260K vocabulary */
#define NP 48     /* prompt length */
#define NCTX 128

static tp_model_t *open_kv(int kv_f16)
{
    if (access(tp_test_repo_path("models/stories260K.gguf"), R_OK) != 0) {
        tp_test_skip("models/stories260K.gguf missing");
        return NULL;
    }
    struct tp_model_config cfg = tp_model_default_config();
    cfg.path = tp_test_repo_path("models/stories260K.gguf");
    cfg.n_threads = 2;
    cfg.n_ctx = NCTX;
    cfg.n_seq = 4;
    cfg.n_batch = 64;
    cfg.kv_f16 = kv_f16;
    struct tp_error err = {0};
    tp_model_t *m = NULL;
    if (tp_model_init(&cfg, &m, &err) != TP_OK) fprintf(stderr, "tp_model_init: %s\n", err.msg);
    CU_ASSERT_PTR_NOT_NULL(m);
    return m;
}

/* Feed prompt[from, to) to seq (positions from..to-1); logits of the last token into out. */
static enum tp_status feed(tp_model_t *m, int seq, const int32_t *prompt, int from, int to, float *out)
{
    int32_t tok[NP], pos[NP], sq[NP];
    int8_t want[NP];
    int n = to - from;
    for (int i = 0; i < n; i++) {
        tok[i] = prompt[from + i];
        pos[i] = from + i;
        sq[i] = seq;
        want[i] = i == n - 1;
    }
    struct tp_batch b = {n, tok, pos, sq, want};
    return tp_model_forward(m, &b, out);
}

static float max_abs(const float *x, int n)
{
    float m = 0;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

static float max_diff(const float *a, const float *b, int n)
{
    float m = 0;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

static void check_copy(int kv_f16)
{
    tp_model_t *m = open_kv(kv_f16);
    if (!m) return;
    int32_t prompt[NP];
    prompt[0] = 1; /* BOS, then a spread of ordinary ids */
    for (int i = 1; i < NP; i++) prompt[i] = 3 + (i * 97 + 13) % (V - 3);
    float la[V], lb[V], lc[V], lb2[V], lc2[V], la2[V];
    const int L = 29;

    /* A = seq 0: the whole prompt in one chunk */
    CU_ASSERT_EQUAL_FATAL(feed(m, 0, prompt, 0, NP, la), TP_OK);
    /* C = seq 2: the prompt in the chunks B will use ([0, L) then [L, NP)) */
    CU_ASSERT_EQUAL_FATAL(feed(m, 2, prompt, 0, L, lc), TP_OK);
    CU_ASSERT_EQUAL_FATAL(feed(m, 2, prompt, L, NP, lc), TP_OK);
    /* B = seq 1: held something else first (a longer, different history) */
    int32_t other[NP];
    for (int i = 0; i < NP; i++) other[i] = 3 + (i * 31 + 7) % (V - 3);
    CU_ASSERT_EQUAL_FATAL(feed(m, 1, other, 0, NP, lb), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_model_kv_copy(m, 1, 0, L), TP_OK);
    /* B's length is exactly L now: position L + 1 skips ahead */
    int32_t t = prompt[L], p = L + 1, s = 1;
    int8_t w = 1;
    CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){1, &t, &p, &s, &w}, lb), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL_FATAL(feed(m, 1, prompt, L, NP, lb), TP_OK);

    float scale = fmaxf(1.0f, max_abs(la, V));
    CU_ASSERT_EQUAL(memcmp(lb, lc, sizeof lb), 0); /* same chunks: bit for bit */
    float dab = max_diff(lb, la, V);
    if (dab > 1e-5f * scale) fprintf(stderr, "kv_copy f16=%d: B vs A max diff %g (scale %g)\n", kv_f16, dab, scale);
    CU_ASSERT(dab <= 1e-5f * scale);

    /* next step: the same token at position NP in A, B and C */
    int32_t tok3[3] = {prompt[5], prompt[5], prompt[5]}, pos3[3] = {NP, NP, NP}, seq3[3] = {0, 1, 2};
    int8_t want3[3] = {1, 1, 1};
    float l3[3 * V];
    CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &(struct tp_batch){3, tok3, pos3, seq3, want3}, l3), TP_OK);
    memcpy(la2, l3, sizeof la2);
    memcpy(lb2, l3 + V, sizeof lb2);
    memcpy(lc2, l3 + 2 * V, sizeof lc2);
    CU_ASSERT_EQUAL(memcmp(lb2, lc2, sizeof lb2), 0);
    CU_ASSERT(max_diff(lb2, la2, V) <= 1e-5f * fmaxf(1.0f, max_abs(la2, V)));
    /* the logits are not trivially equal: B's history really is the prompt's (not the other one's) */
    CU_ASSERT(max_diff(lb2, lb, V) > 1e-3f);

    /* the source was left intact by the copies: the same step again (overwriting position NP) gives
     * the same rows (a batch of another size may take other kernel paths, so the same batch) */
    float l3_again[3 * V];
    CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &(struct tp_batch){3, tok3, pos3, seq3, want3}, l3_again), TP_OK);
    CU_ASSERT_EQUAL(memcmp(l3_again, l3, sizeof l3), 0);
    int32_t t1 = prompt[5], p1 = NP, s1 = 0;

    /* copy onto a longer destination: its length becomes the copied one */
    CU_ASSERT_EQUAL(tp_model_kv_copy(m, 1, 2, 10), TP_OK);
    p = 11;
    CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){1, &t, &p, &s, &w}, lb), TP_ERR_INVALID_ARG);
    p = 10;
    CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){1, &t, &p, &s, &w}, lb), TP_OK);
    /* n_pos 0 clears: position 0 is the only one accepted */
    CU_ASSERT_EQUAL(tp_model_kv_copy(m, 1, 2, 0), TP_OK);
    p = 1;
    CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){1, &t, &p, &s, &w}, lb), TP_ERR_INVALID_ARG);

    /* bad arguments: refused with a message, nothing changes */
    struct {
        int dst, src, n;
        const char *msg;
    } bad[] = {
        {4, 0, 5, "slots are 0..3"}, {-1, 0, 5, "slots are"},   {1, 4, 5, "slots are"},
        {1, -2, 5, "slots are"},     {0, 0, 5, "both"},         {1, 0, -1, "want 0..128"},
        {1, 0, NCTX + 1, "want 0..128"}, {1, 0, NP + 2, "holds only"}, {1, 3, 1, "holds only"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL(tp_model_kv_copy(m, bad[i].dst, bad[i].src, bad[i].n), TP_ERR_INVALID_ARG);
        if (!strstr(tp_model_last_error(m), bad[i].msg))
            fprintf(stderr, "kv_copy(%d, %d, %d): '%s' lacks '%s'\n", bad[i].dst, bad[i].src, bad[i].n,
                    tp_model_last_error(m), bad[i].msg);
        CU_ASSERT_PTR_NOT_NULL(strstr(tp_model_last_error(m), bad[i].msg));
    }
    CU_ASSERT_EQUAL(tp_model_kv_copy(NULL, 1, 0, 1), TP_ERR_INVALID_ARG);
    /* A still holds NP + 1 positions: NP + 1 is accepted */
    p1 = NP + 1;
    CU_ASSERT_EQUAL(tp_model_forward(m, &(struct tp_batch){1, &t1, &p1, &s1, &w}, la2), TP_OK);
    tp_model_free(m);
}

static void test_copy_f32(void) { check_copy(0); }
static void test_copy_f16(void) { check_copy(1); }

static const struct tp_test_case kv_copy_cases[] = {
    {"copy_f32", test_copy_f32},
    {"copy_f16", test_copy_f16},
    {NULL, NULL},
};
TP_TEST_SUITE(kv_copy, "unit,model", 60, kv_copy_cases)

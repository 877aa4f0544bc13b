/*
 * tests/model/test_attn_paths.c - the attention paths (plain C, AVX2,
 * AVX-512: float32; AVX512_BF16 and AMX-BF16: bf16 operands, float32 sums) in a whole
 * forward pass: a synthetic F32 model (test-tiny with 8 query heads of 64
 * over 2 KV heads, so every path takes it, the bf16 ones included: head_dim % 32 ==
 * 0), f16 cache, 2 threads, prefilled with 1536 tokens in chunks of 512
 * (tiled prefill items of 16 tokens x 4 heads) and then 24 greedy decode
 * steps (split decode: the keys of one sequence over both threads).  Each
 * path the CPU has against the plain C path:
 *   - the logits of the last prompt token and of every decode step: NMSE
 *     <= 1e-9 for the float32 paths (they differ only in the order of
 *     float32 sums), <= 1e-5 for the bf16 paths: the kernel's own error (attention
 *     output NMSE up to 1.6e-5 in model.attn) is diluted by the residual
 *     stream the attention adds to; measured 4e-7 on either (the log line), and a
 *     wrong mask or scale in one layer moves these logits by far more;
 *   - the decode is teacher-forced with the C path's greedy tokens; every
 *     choice is equal, or a near tie (the C path's top two within 2% of its
 *     logit range).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward/model_impl.h"
#include "model/model.h"
#include "model/synth.h"
#include "model_test_util.h"
#include "tp_test.h"

enum { NP = 1536, NB = 512, NG = 24 };

/* Logits of the last prompt token (row 0) and of NG decode steps fed toks (rows 1..NG); toks[g] is this
 * run's greedy choice at step g when fill, else read.  gaps (fill only): the top-two margin of each row. */
static int run_path(const char *path, int level, float *lg, int V, int32_t *toks, int fill, float *gaps)
{
    const int prev = tp_attn_isa_limit(level);
    struct tp_error err = {0};
    tp_model_t *m = tm_open_kv(path, 2, NP + NG + 8, 1, NB, TP_KV_F16, &err);
    int rc = -1;
    if (!m) {
        fprintf(stderr, "tp_model_init: %s\n", err.msg);
        goto out;
    }
    int32_t ids[NB], pos[NB], seq[NB] = {0};
    int8_t want[NB];
    for (int p0 = 0; p0 < NP; p0 += NB) {
        for (int i = 0; i < NB; i++) {
            ids[i] = (int32_t)(((unsigned)(p0 + i) * 7919u + 13u) % (unsigned)V);
            pos[i] = p0 + i;
            want[i] = p0 + i == NP - 1;
        }
        if (tp_model_forward(m, &(struct tp_batch){NB, ids, pos, seq, want}, lg) != TP_OK) goto out;
    }
    for (int g = 0; g < NG; g++) {
        const float *row = lg + (size_t)g * V;
        int best = 0, second = -1;
        float lo = row[0], hi = row[0];
        for (int v = 1; v < V; v++) {
            if (row[v] > row[best]) second = best, best = v;
            else if (second < 0 || row[v] > row[second]) second = v;
            lo = fminf(lo, row[v]), hi = fmaxf(hi, row[v]);
        }
        int32_t feed = fill ? best : toks[g], p = NP + g, sq = 0; /* teacher forcing: the reference's token */
        if (fill) {
            toks[g] = best;
            gaps[g] = (row[best] - row[second]) / (hi - lo);
        } else if (best != toks[g]) {
            toks[g] = -1 - best; /* a different choice, marked for the caller */
        }
        if (tp_model_forward(m, &(struct tp_batch){1, &feed, &p, &sq, NULL}, lg + (size_t)(g + 1) * V) != TP_OK)
            goto out;
    }
    rc = 0;
out:
    tp_model_free(m);
    tp_attn_isa_limit(prev);
    return rc;
}

static void test_paths_vs_c(void)
{
    struct tp_shape s;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "test-tiny", &s, &err), TP_OK);
    s.n_head = 8, s.n_head_kv = 2, s.head_dim = 64, s.n_ctx = 4096;
    char path[600];
    snprintf(path, sizeof path, "%s/test-tiny-hd64.gguf", tp_test_tmpdir());
    struct tp_synth_config sc = tp_synth_default_config();
    sc.shape = &s;
    sc.type = TP_WTYPE_F32;
    sc.seed = 11;
    sc.out_path = path;
    CU_ASSERT_EQUAL_FATAL(tp_synth_write(&sc, &err), TP_OK);
    const int V = s.n_vocab;
    float *ref = malloc(sizeof(float) * (size_t)(NG + 1) * V), *lg = malloc(sizeof(float) * (size_t)(NG + 1) * V);
    int32_t toks[NG], mine[NG];
    float gaps[NG];
    CU_ASSERT_FATAL(ref && lg);
    CU_ASSERT_EQUAL_FATAL(run_path(path, TP_ATTN_ISA_C, ref, V, toks, 1, gaps), 0);
    const int prev = tp_attn_isa_limit(TP_ATTN_ISA_AMX);
    const int top = tp_attn_isa_level();
    tp_attn_isa_limit(prev);
    for (int level = TP_ATTN_ISA_AVX2; level <= top; level++) {
        memcpy(mine, toks, sizeof toks);
        CU_ASSERT_EQUAL_FATAL(run_path(path, level, lg, V, mine, 0, NULL), 0);
        const double bound = level >= TP_ATTN_ISA_AVX512BF16 ? 1e-5 : 1e-9;
        double worst = 0;
        for (int g = 0; g <= NG; g++) {
            const double e = tm_nmse(lg + (size_t)g * V, ref + (size_t)g * V, V);
            worst = e > worst ? e : worst;
        }
        int flips = 0, far = 0;
        float min_gap = 1.0f;
        for (int g = 0; g < NG; g++) {
            min_gap = fminf(min_gap, gaps[g]);
            if (mine[g] < 0) flips++, far += gaps[g] > 0.02f;
        }
        fprintf(stderr, "  attention path %s vs c: worst logits NMSE %.3g (bound %.0e), %d of %d greedy choices differ "
                        "(%d beyond a near tie; smallest top-two margin %.3g of the range)\n",
                tp_attn_isa_name(level), worst, bound, flips, NG, far, (double)min_gap);
        CU_ASSERT(worst <= bound);
        CU_ASSERT_EQUAL(far, 0);
        if (level <= TP_ATTN_ISA_AVX512) CU_ASSERT_EQUAL(flips, 0);
        if (level == top) { /* the default path at the other prefetch level (model/kernels.h): the same logits */
            float *other = malloc(sizeof(float) * (size_t)(NG + 1) * V);
            CU_ASSERT_FATAL(other != NULL);
            memcpy(mine, toks, sizeof toks);
            CU_ASSERT_EQUAL(tp_kern_force_prefetch(tp_kern_prefetch() == TP_KERN_PF_L1 ? "l2" : "l1"), TP_OK);
            CU_ASSERT_EQUAL(run_path(path, level, other, V, mine, 0, NULL), 0);
            tp_kern_force_prefetch(NULL);
            CU_ASSERT(memcmp(other, lg, sizeof(float) * (size_t)(NG + 1) * V) == 0);
            free(other);
        }
    }
    free(ref), free(lg);
}

static const struct tp_test_case attn_paths_cases[] = {
    {"paths_vs_c", test_paths_vs_c},
    {NULL, NULL},
};
TP_TEST_SUITE(attn_paths, "unit,model", 300, attn_paths_cases)

/*
 * tests/model/test_moe.c - mixture of experts (Qwen3-MoE, Mixtral) against an
 * independent reference.
 *
 *   - The router (tp_moe_route) on hand-made logits: softmax, top-k, the
 *     renormalised and plain weights, ties (the lower expert index first),
 *     top-k = every expert.
 *   - Synthetic 2-layer models (tp_synth_write: llama.cpp's qwen3moe and
 *     llama-with-experts tensors) against a naive double-precision forward
 *     pass written here from the architecture description (full recompute,
 *     no KV cache, no kernels, each token's experts evaluated one by one):
 *     F32 logits at every position within a normalized MSE of 1e-9 (F32
 *     accumulation error is ~1e-7 relative, so ~1e-13 is reached; a wrong
 *     router weight or expert gives ~1e-2 and more), and 64 greedy tokens
 *     decoded by tpserve that are the reference's argmax at every step.
 *   - Router edge cases through the whole model: a model whose routers are
 *     all zero (every logit ties: every token selects experts 0..k-1 and the
 *     others are selected by none) against the reference, batched prefill
 *     equal to one token at a time; top-k = number of experts.
 *   - Quantized experts (Q8_0, Q4_0 and Q4_K_M in the x16 layouts) against the
 *     reference with the dense tests' tolerance; two in-process ranks holding
 *     half the experts each (expert parallel) or half of every expert's columns
 *     (tensor parallel; Q4_K_M on its super-block boundary) equal to one rank.
 *   - DeepSeek / GLM-MoE refused by name.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>

#include "model/forward/model_impl.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/kernels.h"
#include "model/model.h"
#include "model/synth.h"
#include "tp_test.h"
#include "model_test_util.h"

/* ------------------------------------------------------------ router */

static void test_route_basic(void)
{
    const float lg[5] = {1.0f, 3.0f, 2.0f, 0.0f, -1.0f};
    int sel[2];
    float w[2];
    double z = exp(1.0) + exp(3.0) + exp(2.0) + exp(0.0) + exp(-1.0);
    tp_moe_route(lg, 5, 2, 0, sel, w);
    CU_ASSERT_EQUAL(sel[0], 1);
    CU_ASSERT_EQUAL(sel[1], 2);
    CU_ASSERT_DOUBLE_EQUAL(w[0], exp(3.0) / z, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(w[1], exp(2.0) / z, 1e-6);
    tp_moe_route(lg, 5, 2, 1, sel, w);
    CU_ASSERT_DOUBLE_EQUAL(w[0], exp(3.0) / (exp(3.0) + exp(2.0)), 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(w[1], exp(2.0) / (exp(3.0) + exp(2.0)), 1e-6);
}

static void test_route_ties(void)
{
    const float eq[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    int sel[4];
    float w[4];
    tp_moe_route(eq, 4, 2, 1, sel, w);
    CU_ASSERT_EQUAL(sel[0], 0);
    CU_ASSERT_EQUAL(sel[1], 1);
    CU_ASSERT_DOUBLE_EQUAL(w[0], 0.5, 1e-7);
    CU_ASSERT_DOUBLE_EQUAL(w[1], 0.5, 1e-7);
    tp_moe_route(eq, 4, 2, 0, sel, w);
    CU_ASSERT_DOUBLE_EQUAL(w[0], 0.25, 1e-7);
    /* a tie below the winner: the lower index of the tied pair */
    const float lg[5] = {0.0f, 2.0f, 1.0f, 2.0f, 1.0f};
    tp_moe_route(lg, 5, 3, 1, sel, w);
    CU_ASSERT_EQUAL(sel[0], 1);
    CU_ASSERT_EQUAL(sel[1], 3);
    CU_ASSERT_EQUAL(sel[2], 2);
}

static void test_route_all(void)
{
    const float lg[4] = {-0.5f, 2.0f, 0.25f, 1.0f};
    int sel[4];
    float w[4];
    tp_moe_route(lg, 4, 4, 1, sel, w);
    const int want[4] = {1, 3, 2, 0};
    double z = 0, sum = 0;
    for (int e = 0; e < 4; e++) z += exp((double)lg[e]);
    for (int j = 0; j < 4; j++) {
        CU_ASSERT_EQUAL(sel[j], want[j]);
        CU_ASSERT_DOUBLE_EQUAL(w[j], exp((double)lg[want[j]]) / z, 1e-6); /* every expert: plain softmax */
        sum += w[j];
    }
    CU_ASSERT_DOUBLE_EQUAL(sum, 1.0, 1e-6);
}

/* ------------------------------------------------------------ model files */

/* A Qwen3-MoE shape whose every matrix is made of 256-value super-blocks (the K-quants'):
 * 6 experts of width 512, 2 used, two heads of 128 per rank at 2 ranks. */
static const char k_moe_k_json[] =
    "{\"shapes\":[{\"name\":\"test-tiny-qwen3moe-k\",\"arch\":\"qwen3moe\",\"n_embd\":256,\"n_layer\":2,"
    "\"n_head\":4,\"n_head_kv\":2,\"head_dim\":128,\"n_ff\":1024,\"n_ff_exp\":512,\"n_expert\":6,"
    "\"n_expert_used\":2,\"n_vocab\":512,\"n_ctx\":512,\"rope_theta\":1000000.0,\"norm_eps\":1e-6,"
    "\"tied\":false,\"qk_norm\":true,\"source\":\"made up for tests\"}]}";

/* A built-in shape, or the one above. */
static enum tp_status find_shape(const char *name, struct tp_shape *shape, struct tp_error *err)
{
    if (strcmp(name, "test-tiny-qwen3moe-k") == 0) return tp_shape_find(k_moe_k_json, name, shape, err);
    return tp_shape_find(NULL, name, shape, err);
}

/* Q4_K with llama-quantize's Q4_K_M mix (synth's tp_synth_type_parse "q4_k_m"), else the type everywhere. */
static const char *synth(const char *shape_name, enum tp_wtype type, const char *tag)
{
    const char *json = strcmp(shape_name, "test-tiny-qwen3moe-k") == 0 ? k_moe_k_json : NULL;
    return tm_synth_gguf(json, shape_name, type, type == TP_WTYPE_Q4_K ? TP_SYNTH_MIX_Q4_K_M : TP_SYNTH_MIX_NONE, 11,
                         tag);
}

/* Overwrite every layer's router (ffn_gate_inp, F32) with zeros: all router logits tie. */
static int zero_routers(const char *path, int n_layer) { return tm_fill_layer_f32(path, n_layer, "ffn_gate_inp.weight", 0.0f); }

/* ------------------------------------------------------------ naive reference */

/*
 * The mixture-of-experts block for one normed input xb[E] -> out[E]:
 * router logits r = Wr xb; p = softmax(r); the k largest r (equal logits:
 * the lower expert first); weights p_e, divided by their sum when norm;
 * out = sum over the selected e of w_e * Wd_e (silu(Wg_e xb) * (Wu_e xb)).
 * Stacked tensors hold expert e's matrix at element offset e * rows * cols.
 */
static void ref_moe(const struct tp_shape *s, const float *wr, const float *wg, const float *wu, const float *wd,
                    const double *xb, double *out, const float *const *shexp)
{
    const int E = s->n_embd, X = s->n_expert, k = s->n_expert_used, F = tp_shape_ff_width(s);
    double *r = calloc((size_t)X, sizeof(double)), *g = malloc(sizeof(double) * F), *u = malloc(sizeof(double) * F);
    double *o = malloc(sizeof(double) * E);
    int *taken = calloc((size_t)X, sizeof(int)), *sel = malloc(sizeof(int) * k);
    double *w = malloc(sizeof(double) * k);
    tm_matvec(r, wr, xb, X, E);
    double mx = r[0], z = 0, zs = 0;
    for (int e = 1; e < X; e++) mx = r[e] > mx ? r[e] : mx;
    for (int e = 0; e < X; e++) z += exp(r[e] - mx);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < X; e++)
            if (!taken[e] && (best < 0 || r[e] > r[best])) best = e;
        taken[best] = 1;
        sel[j] = best;
        w[j] = exp(r[best] - mx) / z;
        zs += w[j];
    }
    for (int i = 0; i < E; i++) out[i] = 0;
    for (int j = 0; j < k; j++) {
        const int e = sel[j];
        tm_matvec(g, wg + (size_t)e * F * E, xb, F, E);
        tm_matvec(u, wu + (size_t)e * F * E, xb, F, E);
        for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        tm_matvec(o, wd + (size_t)e * E * F, g, E, F);
        /* Mixtral (HF: always) and Qwen3-MoE (norm_topk_prob: true in the released configs) renormalise,
         * Qwen2-MoE (norm_topk_prob: false) does not */
        const double wj = s->arch == TP_ARCH_QWEN2MOE ? w[j] : w[j] / zs;
        for (int i = 0; i < E; i++) out[i] += wj * o[i];
    }
    if (s->n_ff_shexp > 0) { /* Qwen2-MoE: + sigmoid(gate . xb) * SwiGLU shared expert (xb) */
        const int S = s->n_ff_shexp;
        double *sg = malloc(sizeof(double) * S), *su = malloc(sizeof(double) * S), gate = 0;
        tm_matvec(&gate, shexp[0], xb, 1, E);
        gate = 1.0 / (1.0 + exp(-gate));
        tm_matvec(sg, shexp[1], xb, S, E);
        tm_matvec(su, shexp[2], xb, S, E);
        for (int i = 0; i < S; i++) sg[i] = sg[i] / (1.0 + exp(-sg[i])) * su[i];
        tm_matvec(o, shexp[3], sg, E, S);
        for (int i = 0; i < E; i++) out[i] += gate * o[i];
        free(sg), free(su);
    }
    free(r), free(g), free(u), free(o), free(taken), free(sel), free(w);
}

/* tm_ref's FFN for a mixture of experts: layer l's router, experts and shared expert, read once per layer. */
struct moe_ffn {
    const struct tm_ref *r;
    int layer;
    float *wr, *wg, *wu, *wd;
    float *shexp[4]; /* Qwen2-MoE: ffn_gate_inp_shexp, gate, up, down */
};

static void moe_ffn(void *ctx, int l, const double *xb, double *out)
{
    static const char *const shexp_names[4] = {"ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight",
                                               "ffn_up_shexp.weight", "ffn_down_shexp.weight"};
    struct moe_ffn *m = ctx;
    if (l != m->layer) {
        free(m->wr), free(m->wg), free(m->wu), free(m->wd);
        for (int i = 0; i < 4; i++) free(m->shexp[i]), m->shexp[i] = NULL;
        m->wr = m->wg = m->wu = m->wd = NULL;
        m->layer = l;
        if (l < 0) return;
        tp_gguf_t *g = m->r->g;
        m->wr = tm_deql(g, l, "ffn_gate_inp.weight");
        m->wg = tm_deql(g, l, "ffn_gate_exps.weight");
        m->wu = tm_deql(g, l, "ffn_up_exps.weight");
        m->wd = tm_deql(g, l, "ffn_down_exps.weight");
        for (int i = 0; i < 4; i++) m->shexp[i] = tm_deql(g, l, shexp_names[i]);
    }
    ref_moe(&m->r->s, m->wr, m->wg, m->wu, m->wd, xb, out, (const float *const *)m->shexp);
}

/* logits[n][n_vocab] for tokens ids[0..n) */
static void ref_forward(struct tm_ref *r, const int *ids, int n, double *logits)
{
    struct moe_ffn m = {.r = r, .layer = -1};
    r->ffn = moe_ffn;
    r->ffn_ctx = &m;
    tm_ref_forward(r, ids, n, logits, NULL);
}

static double nmse(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? num / den : (num > 0 ? 1.0 : 0.0);
}

static int argmax_d(const double *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}
/*
 * The model at path against the reference: a prompt of P tokens prefilled
 * in one batch (logits at every position), then G tokens decoded greedily
 * one at a time.  Every logit row's NMSE against the reference is at most
 * tol, and every decoded token is the reference's argmax after the tokens
 * before it (so the reference's own greedy decoding gives the same tokens).
 */
static void check_model(const char *path, const char *shape_name, int neox, double tol, int G)
{
    enum { P = 12 };
    struct tm_ref r;
    memset(&r, 0, sizeof(r));
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(find_shape(shape_name, &r.s, &err), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &r.g, &err), TP_OK);
    r.neox = neox;
    tp_model_t *m = tm_open(path, 2, 128, P, NULL, &err);
    if (!m) fprintf(stderr, "%s: %s\n", shape_name, err.msg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    const struct tp_hparams *hp = tp_model_hparams(m);
    CU_ASSERT_EQUAL(hp->n_expert, r.s.n_expert);
    CU_ASSERT_EQUAL(hp->n_expert_used, r.s.n_expert_used);
    CU_ASSERT_EQUAL(hp->n_ff, tp_shape_ff_width(&r.s));
    CU_ASSERT_EQUAL(hp->expert_weights_norm, r.s.arch != TP_ARCH_QWEN2MOE);
    CU_ASSERT_EQUAL(hp->n_ff_shexp, r.s.n_ff_shexp);
    CU_ASSERT_EQUAL(hp->rope_neox, neox);
    const int V = r.s.n_vocab, N = P + G;
    int *ids = malloc(sizeof(int) * (size_t)N);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)N), *pos = malloc(sizeof(int32_t) * (size_t)N);
    int32_t *seq = calloc((size_t)N, sizeof(int32_t));
    int8_t *want = malloc((size_t)N);
    float *lg = malloc(sizeof(float) * (size_t)N * V);
    for (int i = 0; i < N; i++) {
        ids[i] = tok[i] = (i * 37 + 5) % V;
        pos[i] = i;
        want[i] = 1;
    }
    CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &(struct tp_batch){P, tok, pos, seq, want}, lg), TP_OK);
    for (int i = P; i < N; i++) {
        tok[i] = ids[i] = tm_argmax(lg + (size_t)(i - 1) * V, V); /* greedy */
        CU_ASSERT_EQUAL_FATAL(
            tp_model_forward(m, &(struct tp_batch){1, tok + i, pos + i, seq + i, want + i}, lg + (size_t)i * V), TP_OK);
    }
    double *ref = malloc(sizeof(double) * (size_t)N * V);
    ref_forward(&r, ids, N, ref);
    double worst = 0, maxabs = 0;
    int mismatches = 0;
    for (int i = 0; i < N; i++) {
        double e = nmse(lg + (size_t)i * V, ref + (size_t)i * V, (size_t)V);
        worst = e > worst ? e : worst;
        for (int v = 0; v < V; v++) maxabs = fmax(maxabs, fabs(ref[(size_t)i * V + v]));
        if (i >= P - 1 && i + 1 < N && argmax_d(ref + (size_t)i * V, V) != ids[i + 1]) mismatches++;
    }
    if (worst > tol || mismatches || getenv("TP_TEST_VERBOSE"))
        fprintf(stderr, "%s: worst logits NMSE %.3g (bound %.1g), %d of %d greedy tokens differ from the reference\n",
                path, worst, tol, mismatches, G);
    CU_ASSERT(maxabs > 1e-3); /* the comparison means something */
    CU_ASSERT(worst <= tol);
    CU_ASSERT_EQUAL(mismatches, 0);
    free(ids), free(tok), free(pos), free(seq), free(want), free(lg), free(ref);
    tp_model_free(m);
    tp_gguf_close(r.g);
}

static void test_ref_qwen3moe(void)
{
    const char *p = synth("test-tiny-qwen3moe", TP_WTYPE_F32, "");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    check_model(p, "test-tiny-qwen3moe", 1, 1e-9, 64);
}
static void test_ref_mixtral(void)
{
    const char *p = synth("test-tiny-mixtral", TP_WTYPE_F32, "");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    check_model(p, "test-tiny-mixtral", 0, 1e-9, 64);
}
/* Qwen2-MoE: QKV bias, weights not renormalised, a shared expert behind a sigmoid gate */
static void test_ref_qwen2moe(void)
{
    const char *p = synth("test-tiny-qwen2moe", TP_WTYPE_F32, "");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    check_model(p, "test-tiny-qwen2moe", 1, 1e-9, 64);
}
/* top-k = every expert (4 of 4), tied embeddings */
static void test_ref_topk_all(void)
{
    const char *p = synth("test-tiny-moe-all", TP_WTYPE_F32, "");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    check_model(p, "test-tiny-moe-all", 1, 1e-9, 64);
}
/* zero routers: every logit ties, every token picks experts 0..k-1, the rest are never selected */
static void test_ref_router_ties(void)
{
    const char *p = synth("test-tiny-qwen3moe", TP_WTYPE_F32, "-zero");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL_FATAL(zero_routers(p, 2), 0);
    check_model(p, "test-tiny-qwen3moe", 1, 1e-9, 16);
}
static void test_ref_quantized(void)
{
    /* activations are quantized to Q8 for these types: the dense tests' tolerance class */
    const char *p = synth("test-tiny-qwen3moe", TP_WTYPE_Q8_0, "");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    check_model(p, "test-tiny-qwen3moe", 1, 1e-3, 0);
    p = synth("test-tiny-mixtral", TP_WTYPE_Q4_0, "");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    check_model(p, "test-tiny-mixtral", 0, 1e-2, 0);
    p = synth("test-tiny-qwen3moe", TP_WTYPE_BF16, "");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    check_model(p, "test-tiny-qwen3moe", 1, 1e-6, 0);
}

/* 24 greedy tokens of sequence 0 after a 6-token prompt (one prefill batch). */
static void greedy24(tp_model_t *m, int V, int32_t out[24])
{
    int32_t tok[6], pos[6], seq[6] = {0};
    int8_t want[6] = {0, 0, 0, 0, 0, 1};
    for (int i = 0; i < 6; i++) tok[i] = (i * 37 + 5) % V, pos[i] = i;
    float *lg = malloc(sizeof(float) * 6 * (size_t)V);
    CU_ASSERT_FATAL(lg != NULL);
    CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &(struct tp_batch){6, tok, pos, seq, want}, lg), TP_OK);
    int32_t t = tm_argmax(lg, V);
    for (int i = 0; i < 24; i++) {
        out[i] = t;
        int32_t p = 6 + i, q = 0;
        int8_t w = 1;
        CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &(struct tp_batch){1, &t, &p, &q, &w}, lg), TP_OK);
        t = tm_argmax(lg, V);
    }
    free(lg);
}

/* Q4_K_M experts (Q4_K gate/up, Q6_K down in some layers) in the K-quant x16 layouts where
 * the ISA has the kernels: every expert matrix re-laid; logits against the reference with
 * Q4_0's tolerance (8-bit activations, 4-bit weights: near-ties of the double-precision
 * reference may go either way, so greedy tokens are compared with the row layout's
 * instead, which must be the same 24). */
static void test_ref_kquant(void)
{
    const char *p = synth("test-tiny-qwen3moe-k", TP_WTYPE_Q4_K, "");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    struct tp_error err = {0};
    tp_model_t *m = tm_open(p, 2, 128, 8, NULL, &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    struct tp_model_config cfg = tp_model_default_config();
    cfg.path = p;
    cfg.n_threads = 2;
    cfg.n_ctx = 128;
    cfg.n_batch = 8;
    cfg.keep_layout = 1;
    tp_model_t *mr = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_model_init(&cfg, &mr, &err), TP_OK);
    int32_t a[24], b[24];
    greedy24(m, m->hp.n_vocab, a);
    greedy24(mr, m->hp.n_vocab, b);
    CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);
    int distinct = 0;
    for (int i = 0; i < 24; i++) distinct += i == 0 || a[i] != a[i - 1];
    CU_ASSERT(distinct >= 2);
    tp_model_free(mr);
    int kq = 0, relaid = 0, n = 0;
    for (int l = 0; l < m->hp.n_layer; l++)
        for (int e = 0; e < m->hp.n_expert; e++) {
            const struct tp_wmat *xs[] = {&m->layers[l].xgate[e], &m->layers[l].xup[e], &m->layers[l].xdown[e]};
            for (int i = 0; i < 3; i++) {
                n++;
                kq += xs[i]->type == TP_WTYPE_Q4_K || xs[i]->type == TP_WTYPE_Q6_K;
                relaid += xs[i]->x16 == tp_kern_x16_native(xs[i]->type);
            }
        }
    CU_ASSERT_EQUAL(kq, n);
    CU_ASSERT_EQUAL(relaid, n);
    tp_model_free(m);
    check_model(p, "test-tiny-qwen3moe-k", 1, 1e-2, 0);
}

/* Batched prefill (experts grouped over many tokens) equals one token at a time, bit for bit
 * up to the summation order of a tile: many tokens per expert, experts nobody selects. */
static void batch_vs_single(const char *path)
{
    enum { N = 24 };
    struct tp_error err = {0};
    tp_model_t *a = tm_open(path, 2, 128, N, NULL, &err), *b = tm_open(path, 1, 128, N, NULL, &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    const int V = tp_model_hparams(a)->n_vocab;
    int32_t tok[N], pos[N], seq[N] = {0};
    int8_t want[N];
    for (int i = 0; i < N; i++) {
        tok[i] = (i * 91 + 3) % V;
        pos[i] = i;
        want[i] = 1;
    }
    float *la = malloc(sizeof(float) * N * V), *lb = malloc(sizeof(float) * N * V);
    CU_ASSERT_EQUAL(tp_model_forward(a, &(struct tp_batch){N, tok, pos, seq, want}, la), TP_OK);
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(tp_model_forward(b, &(struct tp_batch){1, tok + i, pos + i, seq + i, want + i}, lb + (size_t)i * V),
                        TP_OK);
    double num = 0, den = 0;
    for (int i = 0; i < N * V; i++) {
        num += ((double)la[i] - lb[i]) * ((double)la[i] - lb[i]);
        den += (double)lb[i] * lb[i];
    }
    CU_ASSERT(den > 0);
    CU_ASSERT(num / den < 1e-10);
    free(la), free(lb);
    tp_model_free(a);
    tp_model_free(b);
}
static void test_batch_grouping(void)
{
    const char *p = synth("test-tiny-qwen3moe", TP_WTYPE_F32, "-batch");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    batch_vs_single(p);
    CU_ASSERT_EQUAL_FATAL(zero_routers(p, 2), 0); /* every token on the same experts */
    batch_vs_single(p);
}

/* ------------------------------------------------------------ 2 ranks in process */

/* Two ranks with shards a and b (vocab split at the same row in both) against one rank. */
static void shard_check(const char *path, const struct tp_model_shard *a, const struct tp_model_shard *b, double tol)
{
    enum { N = 10 };
    struct tm_shard_run r;
    CU_ASSERT_EQUAL_FATAL(tm_shard_pair_run(path, 128, a, b, N, &r), 0);
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)N * r.V; i++) {
        const double got = r.sharded[i], want = r.dense[i];
        num += (got - want) * (got - want);
        den += want * want;
    }
    if (!(num / den <= tol)) fprintf(stderr, "%s shard: NMSE %g (bound %g)\n", path, num / den, tol);
    CU_ASSERT(den > 0);
    CU_ASSERT(num / den <= tol);
    CU_ASSERT(r.smaller);
    tm_shard_run_free(&r);
}

static void test_shard_expert_parallel(void)
{
    /* test-tiny-qwen3moe: 4 heads, 2 kv heads, 8 experts of width 64, vocab 512 */
    const char *p = synth("test-tiny-qwen3moe", TP_WTYPE_F32, "-ep");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    struct tp_model_shard a = {0, 2, 0, 1, 0, 64, 0, 256, NULL, NULL, 0, 0, 3, 0, 0};
    struct tp_model_shard b = {2, 4, 1, 2, 0, 64, 256, 512, NULL, NULL, 0, 3, 8, 0, 0};
    shard_check(p, &a, &b, 1e-10);
    const char *q = synth("test-tiny-qwen3moe", TP_WTYPE_Q4_0, "-ep");
    CU_ASSERT_PTR_NOT_NULL_FATAL(q);
    shard_check(q, &a, &b, 1e-3);
}
/* Qwen2-MoE: the shared expert is computed by the rank holding expert 0 / column 0 only */
static void test_shard_qwen2moe(void)
{
    const char *p = synth("test-tiny-qwen2moe", TP_WTYPE_F32, "-ep");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    struct tp_model_shard a = {0, 2, 0, 1, 0, 32, 0, 256, NULL, NULL, 0, 0, 2, 0, 0};
    struct tp_model_shard b = {2, 4, 1, 2, 0, 32, 256, 512, NULL, NULL, 0, 2, 6, 0, 0};
    shard_check(p, &a, &b, 1e-10);
    struct tp_model_shard c = {0, 2, 0, 1, 0, 16, 0, 256, NULL, NULL, 0, 0, 0, 0, 0};
    struct tp_model_shard d = {2, 4, 1, 2, 16, 32, 256, 512, NULL, NULL, 0, 0, 0, 0, 0};
    shard_check(p, &c, &d, 1e-10);
}
static void test_shard_tensor_parallel(void)
{
    const char *p = synth("test-tiny-qwen3moe", TP_WTYPE_Q8_0, "-tp");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    /* every expert: columns [0, 32) on one rank, [32, 64) on the other (one Q8_0 block each) */
    struct tp_model_shard a = {0, 2, 0, 1, 0, 32, 0, 100, NULL, NULL, 0, 0, 0, 0, 0};
    struct tp_model_shard b = {2, 4, 1, 2, 32, 64, 100, 512, NULL, NULL, 0, 0, 0, 0, 0};
    shard_check(p, &a, &b, 1e-3);
    /* Q4_K_M experts split on their super-block boundary: columns [0, 256) and [256, 512) */
    const char *k = synth("test-tiny-qwen3moe-k", TP_WTYPE_Q4_K, "-tp");
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    struct tp_model_shard ka = {0, 2, 0, 1, 0, 256, 0, 200, NULL, NULL, 0, 0, 0, 0, 0};
    struct tp_model_shard kb = {2, 4, 1, 2, 256, 512, 200, 512, NULL, NULL, 0, 0, 0, 0, 0};
    shard_check(k, &ka, &kb, 1e-3);
    const char *f = synth("test-tiny-mixtral", TP_WTYPE_F32, "-tp");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    struct tp_model_shard c = {0, 1, 0, 1, 0, 40, 0, 300, NULL, NULL, 0, 0, 0, 0, 0};
    struct tp_model_shard d = {1, 4, 0, 2, 40, 96, 300, 512, NULL, NULL, 0, 0, 0, 0, 0};
    shard_check(f, &c, &d, 1e-10);
}

/* A shard naming experts the model does not have is refused at load. */
static void test_shard_bad_experts(void)
{
    const char *p = synth("test-tiny-qwen3moe", TP_WTYPE_F32, "-bad");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    struct tp_model_shard a = {0, 4, 0, 2, 0, 64, 0, 512, NULL, NULL, 0, 4, 9, 0, 0};
    struct tp_error err = {0};
    tp_model_t *m = tm_open(p, 1, 128, 4, &a, &err);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_EQUAL(err.status, TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "experts [4,9)"));
}

/* DeepSeek (MLA) and GLM-MoE are refused by name. */
static void refused_arch(const char *arch, const char *needle)
{
    char path[600];
    snprintf(path, sizeof path, "%s/moe-%s.gguf", tp_test_tmpdir(), arch);
    tp_gguf_writer_t *w = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_gguf_writer_open(path, 32, &w, &err), TP_OK);
    tp_gguf_kv_str(w, "general.architecture", arch);
    CU_ASSERT_EQUAL(tp_gguf_writer_finish(w), TP_OK);
    tp_gguf_writer_free(w);
    tp_model_t *m = tm_open(path, 1, 128, 4, NULL, &err);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_EQUAL(err.status, TP_ERR_UNSUPPORTED);
    if (!strstr(err.msg, needle)) fprintf(stderr, "message lacks '%s': %s\n", needle, err.msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, needle));
}
static void test_refuse_others(void)
{
    refused_arch("deepseek2", "DeepSeek");
    refused_arch("glm4moe", "GLM-MoE");
}

/* every case on the float32 attention: see TM_F32_ATTN */
TM_F32_ATTN(test_route_basic)
TM_F32_ATTN(test_route_ties)
TM_F32_ATTN(test_route_all)
TM_F32_ATTN(test_ref_qwen3moe)
TM_F32_ATTN(test_ref_mixtral)
TM_F32_ATTN(test_ref_qwen2moe)
TM_F32_ATTN(test_ref_topk_all)
TM_F32_ATTN(test_ref_router_ties)
TM_F32_ATTN(test_ref_quantized)
TM_F32_ATTN(test_ref_kquant)
TM_F32_ATTN(test_batch_grouping)
TM_F32_ATTN(test_shard_expert_parallel)
TM_F32_ATTN(test_shard_tensor_parallel)
TM_F32_ATTN(test_shard_qwen2moe)
TM_F32_ATTN(test_shard_bad_experts)
TM_F32_ATTN(test_refuse_others)

static const struct tp_test_case moe_cases[] = {
    {"route_basic", test_route_basic_f32_attn},
    {"route_ties", test_route_ties_f32_attn},
    {"route_topk_all", test_route_all_f32_attn},
    {"ref_qwen3moe_f32_greedy64", test_ref_qwen3moe_f32_attn},
    {"ref_mixtral_f32_greedy64", test_ref_mixtral_f32_attn},
    {"ref_qwen2moe_shared_expert_greedy64", test_ref_qwen2moe_f32_attn},
    {"ref_topk_all_experts", test_ref_topk_all_f32_attn},
    {"ref_router_ties_unused_experts", test_ref_router_ties_f32_attn},
    {"ref_q8_0_q4_0_bf16", test_ref_quantized_f32_attn},
    {"ref_q4_k_m_x16", test_ref_kquant_f32_attn},
    {"batch_grouping", test_batch_grouping_f32_attn},
    {"shard_expert_parallel", test_shard_expert_parallel_f32_attn},
    {"shard_tensor_parallel", test_shard_tensor_parallel_f32_attn},
    {"shard_qwen2moe_shared_expert", test_shard_qwen2moe_f32_attn},
    {"shard_bad_experts", test_shard_bad_experts_f32_attn},
    {"refuse_deepseek_glm", test_refuse_others_f32_attn},
    {NULL, NULL}};
TP_TEST_SUITE(moe, "unit,model", 120, moe_cases)

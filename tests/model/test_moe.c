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
    static char paths[8][600];
    static int slot;
    struct tp_shape shape;
    struct tp_error err = {0};
    if (find_shape(shape_name, &shape, &err) != TP_OK) {
        fprintf(stderr, "shape %s: %s\n", shape_name, err.msg);
        return NULL;
    }
    char *p = paths[slot++ % 8];
    snprintf(p, 600, "%s/moe-%s-%s%s.gguf", tp_test_tmpdir(), shape_name, tp_wtype_name(type), tag);
    struct tp_synth_config sc = tp_synth_default_config();
    sc.shape = &shape;
    sc.type = type;
    if (type == TP_WTYPE_Q4_K) sc.mix = TP_SYNTH_MIX_Q4_K_M;
    sc.seed = 11;
    sc.out_path = p;
    if (tp_synth_write(&sc, &err) != TP_OK) {
        fprintf(stderr, "synth %s: %s\n", shape_name, err.msg);
        return NULL;
    }
    return p;
}

/* Overwrite every layer's router (ffn_gate_inp, F32) with zeros: all router logits tie. */
static int zero_routers(const char *path, int n_layer)
{
    tp_gguf_t *g = NULL;
    struct tp_error err = {0};
    if (tp_gguf_open(path, &g, &err) != TP_OK) return -1;
    uint64_t off[8], nb[8];
    for (int l = 0; l < n_layer && l < 8; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
        const struct tp_gguf_tensor *t = tp_gguf_find_tensor(g, name);
        if (!t || t->type != TP_WTYPE_F32) {
            tp_gguf_close(g);
            return -1;
        }
        off[l] = t->file_offset;
        nb[l] = t->n_bytes;
    }
    tp_gguf_close(g);
    int fd = open(path, O_WRONLY);
    if (fd < 0) return -1;
    int rc = 0;
    for (int l = 0; l < n_layer && l < 8 && rc == 0; l++) {
        char *z = calloc(1, (size_t)nb[l]);
        if (!z || pwrite(fd, z, (size_t)nb[l], (off_t)off[l]) != (ssize_t)nb[l]) rc = -1;
        free(z);
    }
    close(fd);
    return rc;
}

/* ------------------------------------------------------------ naive reference */

struct refm {
    tp_gguf_t *g;
    struct tp_shape s;
    int neox;
};

/* Dequantized copy of a tensor (all its elements, ne[0] fastest), malloc'd; NULL if absent. */
static float *deq(struct refm *r, const char *name)
{
    const struct tp_gguf_tensor *t = tp_gguf_find_tensor(r->g, name);
    if (!t) return NULL;
    float *x = malloc((size_t)t->n_elems * sizeof(float));
    tp_kern_dequant(t->type, t->data, x, t->n_elems);
    return x;
}
static float *deql(struct refm *r, int l, const char *suffix)
{
    char name[96];
    snprintf(name, sizeof(name), "blk.%d.%s", l, suffix);
    return deq(r, name);
}
/* y[rows] = W[rows x cols] x[cols] */
static void matvec(double *y, const float *w, const double *x, int rows, int cols)
{
    for (int i = 0; i < rows; i++) {
        double a = 0;
        for (int j = 0; j < cols; j++) a += (double)w[(size_t)i * cols + j] * x[j];
        y[i] = a;
    }
}
static void rmsnorm(double *y, const double *x, const float *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * w[i];
}
static void rope(double *x, int hd, int pos, double theta, int neox)
{
    for (int i = 0; i < hd / 2; i++) {
        double f = pow(theta, -2.0 * i / hd);
        double c = cos(pos * f), s = sin(pos * f);
        int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
        double xa = x[a], xb = x[b];
        x[a] = xa * c - xb * s;
        x[b] = xa * s + xb * c;
    }
}

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
    matvec(r, wr, xb, X, E);
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
        matvec(g, wg + (size_t)e * F * E, xb, F, E);
        matvec(u, wu + (size_t)e * F * E, xb, F, E);
        for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        matvec(o, wd + (size_t)e * E * F, g, E, F);
        /* Mixtral (HF: always) and Qwen3-MoE (norm_topk_prob: true in the released configs) renormalise,
         * Qwen2-MoE (norm_topk_prob: false) does not */
        const double wj = s->arch == TP_ARCH_QWEN2MOE ? w[j] : w[j] / zs;
        for (int i = 0; i < E; i++) out[i] += wj * o[i];
    }
    if (s->n_ff_shexp > 0) { /* Qwen2-MoE: + sigmoid(gate . xb) * SwiGLU shared expert (xb) */
        const int S = s->n_ff_shexp;
        double *sg = malloc(sizeof(double) * S), *su = malloc(sizeof(double) * S), gate = 0;
        matvec(&gate, shexp[0], xb, 1, E);
        gate = 1.0 / (1.0 + exp(-gate));
        matvec(sg, shexp[1], xb, S, E);
        matvec(su, shexp[2], xb, S, E);
        for (int i = 0; i < S; i++) sg[i] = sg[i] / (1.0 + exp(-sg[i])) * su[i];
        matvec(o, shexp[3], sg, E, S);
        for (int i = 0; i < E; i++) out[i] += gate * o[i];
        free(sg), free(su);
    }
    free(r), free(g), free(u), free(o), free(taken), free(sel), free(w);
}

/* logits[n][n_vocab] for tokens ids[0..n) */
static void ref_forward(struct refm *r, const int *ids, int n, double *logits)
{
    const struct tp_shape *s = &r->s;
    int E = s->n_embd, H = s->n_head, KV = s->n_head_kv, hd = s->head_dim, V = s->n_vocab;
    double eps = s->norm_eps;
    float *emb = deq(r, "token_embd.weight");
    float *out = deq(r, "output.weight");
    if (!out) out = emb; /* tied */
    float *onorm = deq(r, "output_norm.weight");
    double *x = calloc((size_t)n * E, sizeof(double));
    double *K = calloc((size_t)n * KV * hd, sizeof(double)), *Vc = calloc((size_t)n * KV * hd, sizeof(double));
    double *xb = malloc(sizeof(double) * (size_t)(E > H * hd ? E : H * hd));
    double *q = malloc(sizeof(double) * H * hd), *att = malloc(sizeof(double) * H * hd);
    double *o = malloc(sizeof(double) * E), *sc = malloc(sizeof(double) * n);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++) x[(size_t)t * E + i] = emb[(size_t)ids[t] * E + i];
    for (int l = 0; l < s->n_layer; l++) {
        float *an = deql(r, l, "attn_norm.weight"), *fn = deql(r, l, "ffn_norm.weight");
        float *wq = deql(r, l, "attn_q.weight"), *wk = deql(r, l, "attn_k.weight"), *wv = deql(r, l, "attn_v.weight");
        float *wo = deql(r, l, "attn_output.weight");
        float *qn = deql(r, l, "attn_q_norm.weight"), *kn = deql(r, l, "attn_k_norm.weight");
        float *wr = deql(r, l, "ffn_gate_inp.weight"), *wg = deql(r, l, "ffn_gate_exps.weight");
        float *wu = deql(r, l, "ffn_up_exps.weight"), *wd = deql(r, l, "ffn_down_exps.weight");
        float *bq = deql(r, l, "attn_q.bias"), *bk = deql(r, l, "attn_k.bias"), *bv = deql(r, l, "attn_v.bias");
        const float *shexp[4] = {deql(r, l, "ffn_gate_inp_shexp.weight"), deql(r, l, "ffn_gate_shexp.weight"),
                                 deql(r, l, "ffn_up_shexp.weight"), deql(r, l, "ffn_down_shexp.weight")};
        for (int t = 0; t < n; t++) {
            rmsnorm(xb, x + (size_t)t * E, an, E, eps);
            double *kt = K + (size_t)t * KV * hd, *vt = Vc + (size_t)t * KV * hd;
            matvec(kt, wk, xb, KV * hd, E);
            matvec(vt, wv, xb, KV * hd, E);
            for (int i = 0; i < KV * hd; i++) {
                if (bk) kt[i] += bk[i];
                if (bv) vt[i] += bv[i];
            }
            for (int h = 0; h < KV; h++) {
                if (kn) rmsnorm(kt + h * hd, kt + h * hd, kn, hd, eps);
                rope(kt + h * hd, hd, t, s->rope_theta, r->neox);
            }
        }
        for (int t = 0; t < n; t++) {
            double *xt = x + (size_t)t * E;
            rmsnorm(xb, xt, an, E, eps);
            matvec(q, wq, xb, H * hd, E);
            for (int h = 0; h < H; h++) {
                double *qh = q + h * hd;
                if (bq)
                    for (int i = 0; i < hd; i++) qh[i] += bq[h * hd + i];
                if (qn) rmsnorm(qh, qh, qn, hd, eps);
                rope(qh, hd, t, s->rope_theta, r->neox);
                int kvh = h / (H / KV);
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += qh[i] * K[((size_t)j * KV + kvh) * hd + i];
                    sc[j] = d / sqrt((double)hd);
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int j = 0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int j = 0; j <= t; j++) a += sc[j] / sum * Vc[((size_t)j * KV + kvh) * hd + i];
                    att[h * hd + i] = a;
                }
            }
            matvec(o, wo, att, E, H * hd);
            for (int i = 0; i < E; i++) xt[i] += o[i];
            rmsnorm(xb, xt, fn, E, eps);
            ref_moe(s, wr, wg, wu, wd, xb, o, shexp);
            for (int i = 0; i < E; i++) xt[i] += o[i];
        }
        free(an), free(fn), free(wq), free(wk), free(wv), free(wo), free(qn), free(kn);
        free(wr), free(wg), free(wu), free(wd), free(bq), free(bk), free(bv);
        for (int i = 0; i < 4; i++) free((void *)shexp[i]);
    }
    for (int t = 0; t < n; t++) {
        rmsnorm(xb, x + (size_t)t * E, onorm, E, eps);
        matvec(logits + (size_t)t * V, out, xb, V, E);
    }
    if (out != emb) free(out);
    free(emb), free(onorm), free(x), free(K), free(Vc), free(xb), free(q), free(att), free(o), free(sc);
}

static tp_model_t *open_path(const char *path, int threads, int n_batch, const struct tp_model_shard *sh,
                             struct tp_error *err)
{
    struct tp_model_config cfg = tp_model_default_config();
    cfg.path = path;
    cfg.n_threads = threads;
    cfg.n_ctx = 128;
    cfg.n_batch = n_batch;
    cfg.shard = sh;
    tp_model_t *m = NULL;
    if (tp_model_init(&cfg, &m, err) != TP_OK) return NULL;
    return m;
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
static int argmax_f(const float *x, int n)
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
    struct refm r;
    memset(&r, 0, sizeof(r));
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(find_shape(shape_name, &r.s, &err), TP_OK);
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &r.g, &err), TP_OK);
    r.neox = neox;
    tp_model_t *m = open_path(path, 2, P, NULL, &err);
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
        tok[i] = ids[i] = argmax_f(lg + (size_t)(i - 1) * V, V); /* greedy */
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
    int32_t t = argmax_f(lg, V);
    for (int i = 0; i < 24; i++) {
        out[i] = t;
        int32_t p = 6 + i, q = 0;
        int8_t w = 1;
        CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &(struct tp_batch){1, &t, &p, &q, &w}, lg), TP_OK);
        t = argmax_f(lg, V);
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
    tp_model_t *m = open_path(p, 2, 8, NULL, &err);
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
    tp_model_t *a = open_path(path, 2, N, NULL, &err), *b = open_path(path, 1, N, NULL, &err);
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
    struct tm_pair s;
    tm_pair_init(&s);
    struct tm_pair_rank h0 = {&s, 0}, h1 = {&s, 1};
    struct tp_model_shard s0 = *a, s1 = *b;
    s0.all_sum = tm_pair_all_sum;
    s0.all_sum_ctx = &h0;
    s1.all_sum = tm_pair_all_sum;
    s1.all_sum_ctx = &h1;
    struct tp_error err = {0};
    tp_model_t *dense = open_path(path, 1, N, NULL, &err);
    tp_model_t *m0 = open_path(path, 1, N, &s0, &err);
    tp_model_t *m1 = open_path(path, 2, N, &s1, &err);
    if (!m0 || !m1) fprintf(stderr, "%s: %s\n", path, err.msg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dense);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m1);
    int V = tp_model_hparams(dense)->n_vocab;
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 53 + 11) % V;
    int v0 = a->vocab_end - a->vocab_begin, v1 = b->vocab_end - b->vocab_begin;
    float *ld = malloc(sizeof(float) * N * V), *l0 = malloc(sizeof(float) * N * v0), *l1 = malloc(sizeof(float) * N * v1);
    CU_ASSERT_EQUAL(tm_forward_pair(&s, dense, m0, m1, tok, N, ld, l0, l1), 0);
    double num = 0, den = 0;
    for (int t = 0; t < N; t++)
        for (int i = 0; i < V; i++) {
            double got = i < v0 ? l0[(size_t)t * v0 + i] : l1[(size_t)t * v1 + (i - v0)], want = ld[(size_t)t * V + i];
            num += (got - want) * (got - want);
            den += want * want;
        }
    if (!(num / den <= tol)) fprintf(stderr, "%s shard: NMSE %g (bound %g)\n", path, num / den, tol);
    CU_ASSERT(den > 0);
    CU_ASSERT(num / den <= tol);
    CU_ASSERT(tp_model_weight_bytes(m0) < tp_model_weight_bytes(dense));
    tp_model_free(dense);
    tp_model_free(m0);
    tp_model_free(m1);
    free(ld), free(l0), free(l1);
    tm_pair_destroy(&s);
}

static void test_shard_expert_parallel(void)
{
    /* test-tiny-qwen3moe: 4 heads, 2 kv heads, 8 experts of width 64, vocab 512 */
    const char *p = synth("test-tiny-qwen3moe", TP_WTYPE_F32, "-ep");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    struct tp_model_shard a = {0, 2, 0, 1, 0, 64, 0, 256, NULL, NULL, 0, 0, 3};
    struct tp_model_shard b = {2, 4, 1, 2, 0, 64, 256, 512, NULL, NULL, 0, 3, 8};
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
    struct tp_model_shard a = {0, 2, 0, 1, 0, 32, 0, 256, NULL, NULL, 0, 0, 2};
    struct tp_model_shard b = {2, 4, 1, 2, 0, 32, 256, 512, NULL, NULL, 0, 2, 6};
    shard_check(p, &a, &b, 1e-10);
    struct tp_model_shard c = {0, 2, 0, 1, 0, 16, 0, 256, NULL, NULL, 0, 0, 0};
    struct tp_model_shard d = {2, 4, 1, 2, 16, 32, 256, 512, NULL, NULL, 0, 0, 0};
    shard_check(p, &c, &d, 1e-10);
}
static void test_shard_tensor_parallel(void)
{
    const char *p = synth("test-tiny-qwen3moe", TP_WTYPE_Q8_0, "-tp");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    /* every expert: columns [0, 32) on one rank, [32, 64) on the other (one Q8_0 block each) */
    struct tp_model_shard a = {0, 2, 0, 1, 0, 32, 0, 100, NULL, NULL, 0, 0, 0};
    struct tp_model_shard b = {2, 4, 1, 2, 32, 64, 100, 512, NULL, NULL, 0, 0, 0};
    shard_check(p, &a, &b, 1e-3);
    /* Q4_K_M experts split on their super-block boundary: columns [0, 256) and [256, 512) */
    const char *k = synth("test-tiny-qwen3moe-k", TP_WTYPE_Q4_K, "-tp");
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    struct tp_model_shard ka = {0, 2, 0, 1, 0, 256, 0, 200, NULL, NULL, 0, 0, 0};
    struct tp_model_shard kb = {2, 4, 1, 2, 256, 512, 200, 512, NULL, NULL, 0, 0, 0};
    shard_check(k, &ka, &kb, 1e-3);
    const char *f = synth("test-tiny-mixtral", TP_WTYPE_F32, "-tp");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    struct tp_model_shard c = {0, 1, 0, 1, 0, 40, 0, 300, NULL, NULL, 0, 0, 0};
    struct tp_model_shard d = {1, 4, 0, 2, 40, 96, 300, 512, NULL, NULL, 0, 0, 0};
    shard_check(f, &c, &d, 1e-10);
}

/* A shard naming experts the model does not have is refused at load. */
static void test_shard_bad_experts(void)
{
    const char *p = synth("test-tiny-qwen3moe", TP_WTYPE_F32, "-bad");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    struct tp_model_shard a = {0, 4, 0, 2, 0, 64, 0, 512, NULL, NULL, 0, 4, 9};
    struct tp_error err = {0};
    tp_model_t *m = open_path(p, 1, 4, &a, &err);
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
    tp_model_t *m = open_path(path, 1, 4, NULL, &err);
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

static const struct tp_test_case moe_cases[] = {
    {"route_basic", test_route_basic},
    {"route_ties", test_route_ties},
    {"route_topk_all", test_route_all},
    {"ref_qwen3moe_f32_greedy64", test_ref_qwen3moe},
    {"ref_mixtral_f32_greedy64", test_ref_mixtral},
    {"ref_qwen2moe_shared_expert_greedy64", test_ref_qwen2moe},
    {"ref_topk_all_experts", test_ref_topk_all},
    {"ref_router_ties_unused_experts", test_ref_router_ties},
    {"ref_q8_0_q4_0_bf16", test_ref_quantized},
    {"ref_q4_k_m_x16", test_ref_kquant},
    {"batch_grouping", test_batch_grouping},
    {"shard_expert_parallel", test_shard_expert_parallel},
    {"shard_tensor_parallel", test_shard_tensor_parallel},
    {"shard_qwen2moe_shared_expert", test_shard_qwen2moe},
    {"shard_bad_experts", test_shard_bad_experts},
    {"refuse_deepseek_glm", test_refuse_others},
    {NULL, NULL}};
TP_TEST_SUITE(moe, "unit,model", 120, moe_cases)

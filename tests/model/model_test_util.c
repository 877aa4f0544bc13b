/*
 * tests/model/model_test_util.c - see model_test_util.h.
 */
#include "model_test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels.h"
#include "tp_test.h"

enum tp_status tm_synth(const struct tm_synth *w, const char *out, struct tp_error *err)
{
    struct tp_shape shape;
    enum tp_status rc = tp_shape_find(w->shapes_json, w->shape, &shape, err);
    if (rc == TP_OK) {
        struct tp_synth_config sc = tp_synth_default_config();
        sc.shape = &shape;
        sc.type = w->type;
        sc.mix = w->mix;
        sc.seed = w->seed;
        sc.tokenizer_json = w->tokenizer;
        sc.n_threads = w->threads > 0 ? w->threads : 1;
        sc.n_layer = w->layers;
        sc.mlx_bf16 = w->mlx_bf16;
        sc.out_path = out;
        rc = w->hf ? tp_synth_write_hf(&sc, err) : tp_synth_write(&sc, err);
    }
    if (rc != TP_OK) fprintf(stderr, "synth %s: %s\n", w->shape, tp_error_msg(err));
    return rc;
}

int tm_write_model(const char *shape, enum tp_wtype type, int hf, int mlx_bf16, uint64_t seed, const char *out)
{
    const struct tm_synth w = {.shape = shape, .type = type, .seed = seed, .hf = hf, .mlx_bf16 = mlx_bf16};
    struct tp_error e = {0};
    return tm_synth(&w, out, &e) == TP_OK ? 0 : -1;
}

const char *tm_synth_gguf(const char *shapes_json, const char *shape_name, enum tp_wtype type, enum tp_synth_mix mix,
                          uint64_t seed, const char *tag)
{
    static char paths[8][600];
    static int slot;
    char *p = paths[slot++ % 8];
    snprintf(p, 600, "%s/%s-%s-m%d-s%llu%s.gguf", tp_test_tmpdir(), shape_name, tp_wtype_name(type), (int)mix,
             (unsigned long long)seed, tag ? tag : "");
    const struct tm_synth w = {.shapes_json = shapes_json, .shape = shape_name, .type = type, .mix = mix, .seed = seed};
    struct tp_error err = {0};
    return tm_synth(&w, p, &err) == TP_OK ? p : NULL;
}

int tm_fill_layer_f32(const char *path, int n_layer, const char *suffix, float v)
{
    tp_gguf_t *g = NULL;
    struct tp_error err = {0};
    if (n_layer > 8 || tp_gguf_open(path, &g, &err) != TP_OK) return -1;
    uint64_t off[8], nb[8];
    for (int l = 0; l < n_layer; l++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
        const struct tp_gguf_tensor *t = tp_gguf_find_tensor(g, name);
        if (!t || t->type != TP_WTYPE_F32) {
            tp_gguf_close(g);
            return -1;
        }
        off[l] = t->file_offset;
        nb[l] = t->n_bytes;
    }
    tp_gguf_close(g);
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int rc = 0;
    for (int l = 0; l < n_layer && rc == 0; l++) {
        if (fseek(f, (long)off[l], SEEK_SET) != 0) rc = -1;
        for (uint64_t i = 0; rc == 0 && i < nb[l] / 4; i++)
            if (fwrite(&v, 4, 1, f) != 1) rc = -1;
    }
    if (fclose(f) != 0) rc = -1;
    return rc;
}

/* cfg (its other fields set by the caller) with path, threads, context and batch, opened */
static tp_model_t *open_cfg(struct tp_model_config *cfg, const char *path, int threads, int n_ctx, int n_batch,
                            struct tp_error *err)
{
    cfg->path = path;
    cfg->n_threads = threads;
    cfg->n_ctx = n_ctx;
    cfg->n_batch = n_batch;
    tp_model_t *m = NULL;
    if (tp_model_init(cfg, &m, err) != TP_OK) return NULL;
    return m;
}

tp_model_t *tm_open(const char *path, int threads, int n_ctx, int n_batch, const struct tp_model_shard *sh,
                    struct tp_error *err)
{
    struct tp_model_config cfg = tp_model_default_config();
    cfg.shard = sh;
    return open_cfg(&cfg, path, threads, n_ctx, n_batch, err);
}

tp_model_t *tm_open_kv(const char *path, int threads, int n_ctx, int n_seq, int n_batch, enum tp_kv_type kv,
                       struct tp_error *err)
{
    struct tp_model_config cfg = tp_model_default_config();
    cfg.n_seq = n_seq;
    cfg.kv_type = kv;
    return open_cfg(&cfg, path, threads, n_ctx, n_batch, err);
}

int tm_argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

float *tm_deq(tp_gguf_t *g, const char *name, int64_t *n_out)
{
    const struct tp_gguf_tensor *t = tp_gguf_find_tensor(g, name);
    if (!t) return NULL;
    float *x = malloc((size_t)t->n_elems * sizeof(float));
    if (!x) return NULL;
    tp_kern_dequant(t->type, t->data, x, t->n_elems);
    if (n_out) *n_out = t->n_elems;
    return x;
}

float *tm_deql(tp_gguf_t *g, int l, const char *suffix)
{
    char name[96];
    snprintf(name, sizeof(name), "blk.%d.%s", l, suffix);
    return tm_deq(g, name, NULL);
}

void tm_matvec(double *y, const float *w, const double *x, int rows, int cols)
{
    for (int i = 0; i < rows; i++) {
        double a = 0;
        for (int j = 0; j < cols; j++) a += (double)w[(size_t)i * cols + j] * x[j];
        y[i] = a;
    }
}

void tm_rmsnorm(double *y, const double *x, const float *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * w[i];
}

void tm_rope(double *x, int hd, int pos, double theta, const float *ff, int neox)
{
    for (int i = 0; i < hd / 2; i++) {
        double f = pow(theta, -2.0 * i / hd);
        if (ff) f /= ff[i];
        double c = cos(pos * f), s = sin(pos * f);
        int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
        double xa = x[a], xb = x[b];
        x[a] = xa * c - xb * s;
        x[b] = xa * s + xb * c;
    }
}

/* The dense SwiGLU FFN of layer l: xb (E) -> out (E); the weights read once per layer, l = -1 frees them. */
struct dense_ffn {
    tp_gguf_t *g;
    int layer, E, F;
    float *wg, *wu, *wd;
    double *gate, *up; /* (F) */
};

static void dense_ffn(void *ctx, int l, const double *xb, double *out)
{
    struct dense_ffn *d = ctx;
    if (l != d->layer) {
        free(d->wg), free(d->wu), free(d->wd);
        d->wg = d->wu = d->wd = NULL;
        d->layer = l;
        if (l < 0) return;
        d->wg = tm_deql(d->g, l, "ffn_gate.weight");
        d->wu = tm_deql(d->g, l, "ffn_up.weight");
        d->wd = tm_deql(d->g, l, "ffn_down.weight");
    }
    tm_matvec(d->gate, d->wg, xb, d->F, d->E);
    tm_matvec(d->up, d->wu, xb, d->F, d->E);
    for (int i = 0; i < d->F; i++) d->gate[i] = d->gate[i] / (1.0 + exp(-d->gate[i])) * d->up[i];
    tm_matvec(out, d->wd, d->gate, d->E, d->F);
}

/* Queries of token t at layer l against the keys K and values Vc (n, KV, hd) of the tokens before it
 * (the window and sinks of r) into att (H * hd).  sc: (t + 1) scratch. */
static void ref_attend(const struct tm_ref *r, int l, int t, double *q, const double *K, const double *Vc,
                       double *sc, double *att)
{
    const int H = r->s.n_head, KV = r->s.n_head_kv, hd = r->s.head_dim;
    for (int h = 0; h < H; h++) {
        const double *qh = q + h * hd;
        const int kvh = h / (H / KV);
        const int lo = r->window > 0 && t - r->window + 1 > 0 ? t - r->window + 1 : 0;
        const float *sk = l < 4 ? r->sinks[l] : NULL;
        double mx = sk ? sk[h] : -1e300, sum = 0;
        for (int j = lo; j <= t; j++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += qh[i] * K[((size_t)j * KV + kvh) * hd + i];
            sc[j] = d / sqrt((double)hd);
            mx = sc[j] > mx ? sc[j] : mx;
        }
        for (int j = lo; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
        if (sk) sum += exp(sk[h] - mx);
        for (int i = 0; i < hd; i++) {
            double a = 0;
            for (int j = lo; j <= t; j++) a += sc[j] / sum * Vc[((size_t)j * KV + kvh) * hd + i];
            att[h * hd + i] = a;
        }
    }
}

/* q / k (n_heads heads of hd) of one token: + bias, per-head norm, rope at position t. */
static void ref_qk(const struct tm_ref *r, double *x, int n_heads, const float *bias, const float *norm,
                   const float *ff, int t)
{
    const int hd = r->s.head_dim;
    for (int h = 0; h < n_heads; h++) {
        double *xh = x + h * hd;
        if (bias)
            for (int i = 0; i < hd; i++) xh[i] += bias[h * hd + i];
        if (norm) tm_rmsnorm(xh, xh, norm, hd, r->s.norm_eps);
        tm_rope(xh, hd, t, r->s.rope_theta, ff, r->neox);
    }
}

void tm_ref_forward(const struct tm_ref *r, const int *ids, int n, double *logits, double *hidden)
{
    const struct tp_shape *s = &r->s;
    const int E = s->n_embd, H = s->n_head, KV = s->n_head_kv, hd = s->head_dim, V = s->n_vocab;
    const double eps = s->norm_eps;
    float *emb = tm_deq(r->g, "token_embd.weight", NULL);
    float *out = tm_deq(r->g, "output.weight", NULL);
    if (!out) out = emb; /* tied */
    float *onorm = tm_deq(r->g, "output_norm.weight", NULL);
    float *ff = tm_deq(r->g, "rope_freqs.weight", NULL);
    double *x = calloc((size_t)n * E, sizeof(double));
    double *K = calloc((size_t)n * KV * hd, sizeof(double)), *Vc = calloc((size_t)n * KV * hd, sizeof(double));
    double *xb = malloc(sizeof(double) * (size_t)(E > H * hd ? E : H * hd));
    double *q = malloc(sizeof(double) * H * hd), *att = malloc(sizeof(double) * H * hd);
    double *o = malloc(sizeof(double) * E), *sc = malloc(sizeof(double) * n);
    const int F = s->n_ff;
    struct dense_ffn dffn = {r->g, -1, E, F, NULL, NULL, NULL, malloc(sizeof(double) * F), malloc(sizeof(double) * F)};
    void (*ffn)(void *, int, const double *, double *) = r->ffn ? r->ffn : dense_ffn;
    void *ffn_ctx = r->ffn ? r->ffn_ctx : &dffn;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++) x[(size_t)t * E + i] = emb[(size_t)ids[t] * E + i];
    for (int l = 0; l < s->n_layer; l++) {
        float *an = tm_deql(r->g, l, "attn_norm.weight"), *fn = tm_deql(r->g, l, "ffn_norm.weight");
        float *wq = tm_deql(r->g, l, "attn_q.weight"), *wk = tm_deql(r->g, l, "attn_k.weight");
        float *wv = tm_deql(r->g, l, "attn_v.weight"), *wo = tm_deql(r->g, l, "attn_output.weight");
        float *bq = tm_deql(r->g, l, "attn_q.bias"), *bk = tm_deql(r->g, l, "attn_k.bias");
        float *bv = tm_deql(r->g, l, "attn_v.bias");
        float *qn = tm_deql(r->g, l, "attn_q_norm.weight"), *kn = tm_deql(r->g, l, "attn_k_norm.weight");
        /* K, V of all positions first (causal attention reads only earlier ones) */
        for (int t = 0; t < n; t++) {
            tm_rmsnorm(xb, x + (size_t)t * E, an, E, eps);
            double *kt = K + (size_t)t * KV * hd, *vt = Vc + (size_t)t * KV * hd;
            tm_matvec(kt, wk, xb, KV * hd, E);
            tm_matvec(vt, wv, xb, KV * hd, E);
            for (int i = 0; bv && i < KV * hd; i++) vt[i] += bv[i];
            ref_qk(r, kt, KV, bk, kn, ff, t);
        }
        for (int t = 0; t < n; t++) {
            double *xt = x + (size_t)t * E;
            tm_rmsnorm(xb, xt, an, E, eps);
            tm_matvec(q, wq, xb, H * hd, E);
            ref_qk(r, q, H, bq, qn, ff, t);
            ref_attend(r, l, t, q, K, Vc, sc, att);
            tm_matvec(o, wo, att, E, H * hd);
            for (int i = 0; i < E; i++) xt[i] += o[i];
            tm_rmsnorm(xb, xt, fn, E, eps);
            ffn(ffn_ctx, l, xb, o);
            for (int i = 0; i < E; i++) xt[i] += o[i];
        }
        free(an), free(fn), free(wq), free(wk), free(wv), free(wo), free(bq), free(bk), free(bv), free(qn), free(kn);
    }
    ffn(ffn_ctx, -1, NULL, NULL);
    for (int t = 0; t < n; t++) {
        tm_rmsnorm(xb, x + (size_t)t * E, onorm, E, eps);
        if (hidden) memcpy(hidden + (size_t)t * E, xb, sizeof(double) * (size_t)E);
        tm_matvec(logits + (size_t)t * V, out, xb, V, E);
    }
    if (out != emb) free(out);
    free(emb), free(onorm), free(ff), free(x), free(K), free(Vc), free(xb), free(q), free(att), free(o), free(sc);
    free(dffn.gate), free(dffn.up);
}

tp_model_t *tm_open_model(const char *path, struct tp_error *e)
{
    memset(e, 0, sizeof(*e));
    return tm_open(path, 1, 128, tp_model_default_config().n_batch, NULL, e);
}

double tm_nmse(const float *a, const float *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? num / den : num;
}

void tm_pair_init(struct tm_pair *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
}

void tm_pair_destroy(struct tm_pair *s)
{
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

static void pair_barrier(struct tm_pair *s)
{
    pthread_mutex_lock(&s->mu);
    int g = s->gen;
    if (++s->arrived == 2) {
        s->arrived = 0;
        s->gen++;
        pthread_cond_broadcast(&s->cv);
    } else {
        while (g == s->gen) pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

enum tp_status tm_pair_all_sum(void *ctx, float *buf, size_t count)
{
    struct tm_pair_rank *h = ctx;
    h->s->buf[h->rank] = buf;
    pair_barrier(h->s);
    for (size_t i = 0; i < count; i++) h->s->tmp[h->rank][i] = h->s->buf[0][i] + h->s->buf[1][i];
    pair_barrier(h->s);
    memcpy(buf, h->s->tmp[h->rank], count * sizeof(float));
    return TP_OK;
}

struct pair_run {
    tp_model_t *m;
    const int32_t *tok;
    int n;
    float *out;
    enum tp_status rc;
};

static void *pair_run_main(void *p)
{
    struct pair_run *a = p;
    int32_t pos[16], seq[16];
    int8_t want[16];
    for (int i = 0; i < a->n; i++) {
        pos[i] = i;
        seq[i] = 0;
        want[i] = 1;
    }
    a->rc = tp_model_forward(a->m, &(struct tp_batch){a->n, a->tok, pos, seq, want}, a->out);
    return NULL;
}

int tm_forward_pair(struct tm_pair *s, tp_model_t *dense, tp_model_t *m0, tp_model_t *m1, const int32_t *tok, int n,
                    float *ld, float *l0, float *l1)
{
    if (n < 1 || n > 16) return -1;
    const int e = tp_model_hparams(dense)->n_embd;
    s->tmp[0] = calloc((size_t)n * e, sizeof(float));
    s->tmp[1] = calloc((size_t)n * e, sizeof(float));
    struct pair_run ad = {dense, tok, n, ld, TP_OK}, a0 = {m0, tok, n, l0, TP_OK}, a1 = {m1, tok, n, l1, TP_OK};
    int rc = -1;
    pthread_t th;
    if (s->tmp[0] && s->tmp[1]) {
        pair_run_main(&ad);
        if (pthread_create(&th, NULL, pair_run_main, &a1) == 0) {
            pair_run_main(&a0);
            pthread_join(th, NULL);
            rc = ad.rc == TP_OK && a0.rc == TP_OK && a1.rc == TP_OK ? 0 : -1;
            if (rc) fprintf(stderr, "tm_forward_pair: dense %s, rank 0 %s, rank 1 %s\n", tp_status_str(ad.rc),
                            tp_status_str(a0.rc), tp_status_str(a1.rc));
        }
    }
    free(s->tmp[0]);
    free(s->tmp[1]);
    s->tmp[0] = s->tmp[1] = NULL;
    return rc;
}

int tm_shard_pair_run(const char *path, int n_ctx, const struct tp_model_shard *a, const struct tp_model_shard *b, int n,
                      struct tm_shard_run *out)
{
    memset(out, 0, sizeof *out);
    struct tm_pair s;
    tm_pair_init(&s);
    struct tm_pair_rank h0 = {&s, 0}, h1 = {&s, 1};
    struct tp_model_shard s0 = *a, s1 = *b;
    s0.all_sum = tm_pair_all_sum;
    s0.all_sum_ctx = &h0;
    s1.all_sum = tm_pair_all_sum;
    s1.all_sum_ctx = &h1;
    struct tp_error err = {0};
    tp_model_t *dense = tm_open(path, 1, n_ctx, n, NULL, &err);
    tp_model_t *m0 = dense ? tm_open(path, 1, n_ctx, n, &s0, &err) : NULL;
    tp_model_t *m1 = m0 ? tm_open(path, 2, n_ctx, n, &s1, &err) : NULL;
    int rc = -1;
    const int v0 = a->vocab_end - a->vocab_begin, v1 = b->vocab_end - b->vocab_begin;
    float *l0 = malloc(sizeof(float) * (size_t)n * (size_t)v0), *l1 = malloc(sizeof(float) * (size_t)n * (size_t)v1);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    if (!m1) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        goto out;
    }
    const int V = out->V = tp_model_hparams(dense)->n_vocab;
    out->dense = malloc(sizeof(float) * (size_t)n * (size_t)V);
    out->sharded = malloc(sizeof(float) * (size_t)n * (size_t)V);
    if (!l0 || !l1 || !tok || !out->dense || !out->sharded || v0 + v1 != V) goto out;
    for (int i = 0; i < n; i++) tok[i] = (i * 53 + 11) % V;
    if (tm_forward_pair(&s, dense, m0, m1, tok, n, out->dense, l0, l1) != 0) goto out;
    for (int t = 0; t < n; t++) {
        memcpy(out->sharded + (size_t)t * V, l0 + (size_t)t * v0, sizeof(float) * (size_t)v0);
        memcpy(out->sharded + (size_t)t * V + v0, l1 + (size_t)t * v1, sizeof(float) * (size_t)v1);
    }
    out->smaller = tp_model_weight_bytes(m0) < tp_model_weight_bytes(dense);
    rc = 0;
out:
    if (rc != 0) tm_shard_run_free(out);
    tp_model_free(dense);
    tp_model_free(m0);
    tp_model_free(m1);
    free(l0), free(l1), free(tok);
    tm_pair_destroy(&s);
    return rc;
}

void tm_shard_run_free(struct tm_shard_run *r)
{
    free(r->dense);
    free(r->sharded);
    r->dense = r->sharded = NULL;
}

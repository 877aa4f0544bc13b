/*
 * tests/model/model_test_util.c - see model_test_util.h.
 */
#include "model_test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth.h"

int tm_write_model(const char *shape, enum tp_wtype type, int hf, int mlx_bf16, uint64_t seed, const char *out)
{
    struct tp_shape sh;
    struct tp_error e = {0};
    if (tp_shape_find(NULL, shape, &sh, &e) != TP_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    struct tp_synth_config sc = tp_synth_default_config();
    sc.shape = &sh;
    sc.type = type;
    sc.seed = seed;
    sc.n_threads = 1;
    sc.out_path = out;
    sc.mlx_bf16 = mlx_bf16;
    enum tp_status rc = hf ? tp_synth_write_hf(&sc, &e) : tp_synth_write(&sc, &e);
    if (rc != TP_OK) fprintf(stderr, "%s\n", e.msg);
    return rc == TP_OK ? 0 : -1;
}

tp_model_t *tm_open_model(const char *path, struct tp_error *e)
{
    struct tp_model_config mc = tp_model_default_config();
    mc.path = path;
    mc.n_threads = 1;
    mc.n_ctx = 128;
    tp_model_t *m = NULL;
    memset(e, 0, sizeof(*e));
    if (tp_model_init(&mc, &m, e) != TP_OK) return NULL;
    return m;
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

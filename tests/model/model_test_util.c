/*
 * tests/model/model_test_util.c - see model_test_util.h.
 */
#include "model_test_util.h"

#include <stdio.h>
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

/*
 * model/forward/attn_bench.c - one timing of the tiled attention kernel on
 * random data, for `tpserve bench attn` (tp_kern_attn_time in
 * model/kernels.h): the kernel's FLOP rate per path and shape, in the CPU
 * time of the calling thread, so that it reads the same on a shared machine.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "forward/model_impl.h"
#include "model/kernels.h"

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum tp_status tp_kern_attn_time(const char *path, enum tp_kv_type kv, int hd, int nt, int ng, int n_keys, int reps,
                                 int stream_mib, double *cpu_s, double *wall_s, double *flop)
{
    int level = -1;
    for (int i = 0; i < TP_ATTN_ISA_COUNT; i++)
        if (path && strcmp(path, tp_attn_isa_name(i)) == 0) level = i;
    const size_t rb = tp_kv_row_bytes(kv, hd);
    if (level < 0 || (int)kv < 0 || kv >= TP_KV_TYPE_COUNT || hd <= 0 || hd % 8 != 0 || hd > 1024 || rb == 0 ||
        nt < 1 || ng < 1 || nt * ng > 1024 || n_keys < nt || n_keys > (1 << 24) || reps < 1 || stream_mib < 0 ||
        stream_mib > (1 << 30))
        return TP_ERR_INVALID_ARG;
    const int rows = nt * ng;
    const int cap = (int)tp_kv_cap_rows(kv, n_keys); /* a bf16 cache holds whole tiles */
    const size_t one = (size_t)cap * rb; /* bytes of K (and of V) in one copy */
    const size_t want = (size_t)stream_mib << 20;
    /* size_t: a large stream_mib of a small cache is more copies than an int holds, and calloc refuses the product */
    const size_t copies = want > 2 * one ? (want + 2 * one - 1) / (2 * one) : 1;
    /* copy c's K at kc + c * one, V at vc + c * one (calloc: the pages a model's cache gets) */
    uint8_t *kc = calloc(copies, one), *vc = calloc(copies, one);
    float *q = malloc(sizeof(float) * (size_t)rows * hd), *o = malloc(sizeof(float) * (size_t)rows * hd);
    float *x = malloc(sizeof(float) * (size_t)hd);
    float *scratch = malloc(sizeof(float) * (tp_attn_scratch_floats(hd, rows) + 16));
    enum tp_status st = TP_OK;
    if (!kc || !vc || !q || !o || !x || !scratch) {
        st = TP_ERR_NOMEM;
        goto out;
    }
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int j = 0; j < 2 * n_keys; j++) {
        for (int i = 0; i < hd; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        tp_kv_store_at(kv, j < n_keys ? kc : vc, j >= n_keys, j % n_keys, x, hd);
    }
    for (size_t c = 1; c < copies; c++) {
        memcpy(kc + c * one, kc, one);
        memcpy(vc + c * one, vc, one);
    }
    for (int i = 0; i < rows * hd; i++) q[i] = (float)((i * 37 % 101) - 50) / 25.0f;
    const struct tp_attn_geom g = {hd, kv, rb, cap, 0, 1.0f / sqrtf((float)hd)};
    const struct tp_attn_rows r = {q, (size_t)ng * hd, nt, ng, n_keys - nt, NULL};
    const int prev = tp_attn_isa_limit(level);
    if (tp_attn_isa_level() != level) {
        tp_attn_isa_limit(prev);
        st = TP_ERR_UNSUPPORTED;
        goto out;
    }
    tp_attn_tile(&g, &r, kc, vc, 0, n_keys, scratch, o, (size_t)ng * hd, NULL); /* warm-up */
    for (int k = 0; k < reps; k++) {
        const size_t off = ((size_t)k + 1) % copies * one; /* the warm-up read copy 0 */
        const double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), w0 = clock_s(CLOCK_MONOTONIC);
        tp_attn_tile(&g, &r, kc + off, vc + off, 0, n_keys, scratch, o, (size_t)ng * hd, NULL);
        const double c = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0, w = clock_s(CLOCK_MONOTONIC) - w0;
        if (k == 0 || c < *cpu_s) *cpu_s = c;
        if (k == 0 || w < *wall_s) *wall_s = w;
    }
    tp_attn_isa_limit(prev);
    /* row i (position n_keys - nt + i) sees n_keys - nt + i + 1 keys: q.k and p.v, a multiply and an add each */
    const double keys = (double)nt * (n_keys - nt + 1) + (double)nt * (nt - 1) / 2.0;
    *flop = 4.0 * hd * ng * keys;
out:
    free(kc), free(vc), free(q), free(o), free(x), free(scratch);
    return st;
}

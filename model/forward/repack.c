/*
 * model/forward/repack.c - after the weights are read, re-lay Q4_0, Q8_0, Q4_K, Q5_K and
 * Q6_K matrices 16 rows at a time (the "x16" layouts of kernels.h) where the
 * CPU's kernels compute that layout natively: a block of 16 rows then needs
 * no byte gathering or transposing, which roughly halves the instructions per
 * weight byte of a decode step and makes small batches and prefill cheaper
 * still (the same idea as llama.cpp's Q4_0 -> Q4_0_8x8 and Q4_K -> Q4_K_8x8
 * repacking).  The bytes held are the
 * same (a ragged last group is padded to 16 rows); the row-major copy is
 * released: an owned buffer is freed, and mapped file pages are dropped from
 * the resident set with madvise, so a rank never holds both.  The embedding
 * (read one row at a time) and a tied output head (the embedding's rows)
 * stay row-major.  Groups are split over the model's thread pool.
 */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/common.h"
#include "model/kernels.h"
#include "forward/model_impl.h"

struct repack_job {
    const struct tp_wmat *w;
    uint8_t *dst;
};

static void repack_part(void *ctx, int ith, int nth)
{
    const struct repack_job *j = ctx;
    int64_t g0, g1;
    tp_split_range((j->w->rows + 15) / 16, ith, nth, &g0, &g1);
    tp_kern_repack_x16(j->w->type, j->w->data, j->w->row_bytes, j->w->rows, j->dst, g0, g1);
}

/* Drop the whole pages of [p, p + n) of a read-only file mapping from the resident set. */
static void drop_pages(const void *p, size_t n)
{
#if defined(MADV_DONTNEED)
    const long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~((uintptr_t)ps - 1);
    if (e > a) (void)madvise((void *)a, e - a, MADV_DONTNEED);
#else
    (void)p;
    (void)n;
#endif
}

static enum tp_status repack(tp_model_t *m, struct tp_wmat *w, const char *what)
{
    if (!tp_kern_x16_type(w->type) || !tp_kern_x16_native(w->type) || w->x16 || w->rows <= 0 || w->scales)
        return TP_OK;
    const size_t bytes = tp_kern_x16_bytes(w->rows, w->row_bytes);
    uint8_t *dst = tp_aligned_alloc(64, bytes);
    if (!dst)
        return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory re-laying %s (%zu bytes) for the kernels",
                            m->path, what, bytes);
    struct repack_job j = {w, dst};
    if (m->pool && w->rows >= 64) tp_pool_run(m->pool, repack_part, &j);
    else repack_part(&j, 0, 1);
    if (w->owned) tp_aligned_free(w->owned);
    else drop_pages(w->data, (size_t)w->rows * w->row_bytes);
    w->owned = dst;
    w->data = dst;
    w->x16 = 1;
    return TP_OK;
}

enum tp_status tp_model_repack(tp_model_t *m)
{
    if (!m->layers) return TP_OK;
    enum tp_status rc = TP_OK;
    for (int l = 0; l < m->hp.n_layer && rc == TP_OK; l++) {
        struct tp_layer *L = &m->layers[l];
        struct tp_wmat *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0] && rc == TP_OK; i++) rc = repack(m, ws[i], "a layer matrix");
        if (rc == TP_OK) rc = repack(m, &L->wrouter, "a router matrix");
        struct tp_wmat *sh[] = {&L->sgate, &L->sup, &L->sdown};
        for (size_t i = 0; i < 3 && rc == TP_OK; i++) rc = repack(m, sh[i], "a shared-expert matrix");
        /* experts one by one: a view into a stacked tensor gets its own x16 buffer, and the
         * stacked bytes it covered are released page by page as above */
        for (int e = 0; L->xgate && e < m->hp.n_expert && rc == TP_OK; e++) {
            struct tp_wmat *xs[] = {&L->xgate[e], &L->xup[e], &L->xdown[e]};
            for (size_t i = 0; i < 3 && rc == TP_OK; i++) rc = repack(m, xs[i], "an expert matrix");
        }
    }
    const uint8_t *e0 = m->tok_embd.data, *e1 = e0 + (size_t)m->tok_embd.rows * m->tok_embd.row_bytes;
    const int tied = m->output.data >= e0 && m->output.data < e1; /* the embedding's rows: stay row-major */
    if (rc == TP_OK && !tied) rc = repack(m, &m->output, "output.weight");
    return rc;
}

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
 *
 * The re-laid copies sit on transparent huge pages where the system offers
 * them on request (Linux MADV_HUGEPAGE): a decode step streams every byte
 * once, and with 4 KiB pages every 4 KiB of that stream is a TLB miss (a
 * two-level walk under a hypervisor).  Only the whole 2 MiB pages inside a
 * buffer are advised, so no page beyond the buffer's bytes becomes resident,
 * and a buffer's last partial page stays on 4 KiB pages: the layers' matrices
 * (other than the experts) and the output head therefore share one buffer,
 * one after another in layer order, with a single such tail, where a buffer
 * per matrix left every matrix's tail (and every matrix under 2 MiB) on
 * small pages.  Its pages become resident as they are written, and each
 * matrix's row-major bytes are released right after it is re-laid, so
 * loading holds no more than it did with a buffer per matrix.  A layer's
 * held experts (often under 1 MiB each) share buffers of at least
 * TP_XARENA_BYTES, consecutive experts each, every expert's three matrices a
 * view into one; the slices the experts were read into are released after
 * each buffer (malloc_trim on glibc, whose heap keeps freed blocks resident),
 * so loading holds at most one buffer beyond the weights.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
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

#define TP_XARENA_BYTES ((size_t)8 << 20) /* experts re-laid per buffer: a few huge pages */

/* A buffer of `bytes` for weights streamed every step (huge pages where granted); tp_aligned_free. */
static uint8_t *weight_alloc(size_t bytes) { return tp_stream_alloc(bytes); }

/* 1 if w is re-laid by repack(). */
static int repackable(const struct tp_wmat *w)
{
    return tp_kern_x16_type(w->type) && tp_kern_x16_native(w->type) && !w->x16 && w->rows > 0 && !w->scales;
}

/* Re-lay w into dst, a view into a buffer the caller owns (m->warena or an expert buffer) of at least
 * tp_kern_x16_bytes(w->rows, w->row_bytes) bytes, 64-byte aligned; w's row-major bytes are released. */
static void repack(tp_model_t *m, struct tp_wmat *w, uint8_t *dst)
{
    if (!repackable(w)) return;
    struct repack_job j = {w, dst};
    if (m->pool && w->rows >= 64) tp_pool_run(m->pool, repack_part, &j);
    else repack_part(&j, 0, 1);
    if (w->owned) tp_aligned_free(w->owned);
    else drop_pages(w->data, (size_t)w->rows * w->row_bytes);
    w->owned = NULL;
    w->data = dst;
    w->x16 = 1;
}

/* Bytes of w re-laid, rounded up to 64 (its share of a buffer); 0 when w is not re-laid. */
static size_t x16_share(const struct tp_wmat *w)
{
    return repackable(w) ? (tp_kern_x16_bytes(w->rows, w->row_bytes) + 63) & ~(size_t)63 : 0;
}

/* Bytes of expert e's re-laid matrices, 0 when none is re-laid. */
static size_t expert_x16_bytes(const struct tp_layer *L, int e)
{
    return x16_share(&L->xgate[e]) + x16_share(&L->xup[e]) + x16_share(&L->xdown[e]);
}

/* Layer L's held experts re-laid, expert by expert (gate, up, down), into buffers of consecutive experts
 * of at least TP_XARENA_BYTES each (the last one the rest), owned by L->xarena. */
static enum tp_status repack_experts(tp_model_t *m, struct tp_layer *L)
{
    const int X = m->hp.n_expert;
    L->xarena = calloc((size_t)X, sizeof *L->xarena);
    if (!L->xarena) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory", m->path);
    for (int e0 = 0; e0 < X;) {
        size_t total = 0;
        int e1 = e0;
        while (e1 < X && total < TP_XARENA_BYTES) total += expert_x16_bytes(L, e1++);
        if (total == 0) {
            e0 = e1;
            continue;
        }
        uint8_t *a = weight_alloc(total);
        if (!a)
            return tp_error_set(&m->err, TP_ERR_NOMEM,
                                "%s: out of memory re-laying experts (%zu bytes) for the kernels", m->path, total);
        L->xarena[L->n_xarena++] = a;
        size_t off = 0;
        for (int e = e0; e < e1; e++) {
            struct tp_wmat *xs[] = {&L->xgate[e], &L->xup[e], &L->xdown[e]};
            for (size_t i = 0; i < 3; i++) {
                const size_t b = x16_share(xs[i]);
                repack(m, xs[i], a + off);
                off += b;
            }
        }
#if defined(__GLIBC__)
        (void)malloc_trim(0); /* the freed slices back to the system before the next buffer */
#endif
        e0 = e1;
    }
    return TP_OK;
}

/* The matrices of layer L that go into the model's buffer (m->warena), in order; returns how many. */
static int layer_mats(struct tp_layer *L, struct tp_wmat *out[11])
{
    struct tp_wmat *ws[] = {&L->wq,   &L->wk,      &L->wv,    &L->wo,  &L->wgate, &L->wup,
                            &L->wdown, &L->wrouter, &L->sgate, &L->sup, &L->sdown};
    memcpy(out, ws, sizeof ws);
    return (int)(sizeof ws / sizeof ws[0]);
}

enum tp_status tp_model_repack(tp_model_t *m)
{
    if (!m->layers) return TP_OK;
    const uint8_t *e0 = m->tok_embd.data, *e1 = e0 + (size_t)m->tok_embd.rows * m->tok_embd.row_bytes;
    const int tied = m->output.data >= e0 && m->output.data < e1; /* the embedding's rows: stay row-major */
    size_t total = tied ? 0 : x16_share(&m->output);
    struct tp_wmat *ws[11];
    for (int l = 0; l < m->hp.n_layer; l++)
        for (int i = 0, n = layer_mats(&m->layers[l], ws); i < n; i++) total += x16_share(ws[i]);
    if (total > 0 && !(m->warena = weight_alloc(total)))
        return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory re-laying the weights (%zu bytes) for the kernels",
                            m->path, total);
    size_t off = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        struct tp_layer *L = &m->layers[l];
        for (int i = 0, n = layer_mats(L, ws); i < n; i++) {
            const size_t b = x16_share(ws[i]);
            if (b == 0) continue; /* not re-laid (and no buffer when nothing is) */
            repack(m, ws[i], m->warena + off);
            off += b;
        }
        /* the experts into buffers of their own: a view into a stacked tensor or an owned slice is
         * re-laid there, and the bytes it covered are released (page by page from a mapping, as above) */
        if (L->xgate) {
            enum tp_status rc = repack_experts(m, L);
            if (rc != TP_OK) return rc;
        }
    }
    if (!tied && x16_share(&m->output) > 0) repack(m, &m->output, m->warena + off);
    return TP_OK;
}

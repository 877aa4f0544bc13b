/*
 * common/worksplit.c - a pool job's units in owned shares, with stealing.
 *
 * Each thread's share is one 64-bit word, front << 32 | back, on a cache line of its own: its owner
 * moves the front, a thief moves the back, both by compare-and-swap, so a unit is handed out once.
 */
#include "common/common.h"

#include <stdatomic.h>
#include <stdlib.h>

struct tp_worksplit_share {
    _Alignas(64) _Atomic uint64_t fb;
};

struct tp_worksplit {
    int n_threads;
    uint64_t min_units;
    struct tp_worksplit_share *share; /* (n_threads) owned */
};

enum tp_status tp_worksplit_init(int n_threads, tp_worksplit_t **out)
{
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return TP_ERR_INVALID_ARG;
    tp_worksplit_t *ws = calloc(1, sizeof *ws);
    if (!ws) return TP_ERR_NOMEM;
    ws->share = tp_aligned_alloc(64, sizeof *ws->share * (size_t)n_threads);
    if (!ws->share) {
        free(ws);
        return TP_ERR_NOMEM;
    }
    ws->n_threads = n_threads;
    for (int i = 0; i < n_threads; i++) atomic_init(&ws->share[i].fb, 0);
    *out = ws;
    return TP_OK;
}

void tp_worksplit_free(tp_worksplit_t *ws)
{
    if (!ws) return;
    tp_aligned_free(ws->share);
    free(ws);
}

enum tp_status tp_worksplit_reset(tp_worksplit_t *ws, uint64_t n_units, uint64_t min_units)
{
    if (!ws || n_units > TP_WORKSPLIT_MAX_UNITS) return TP_ERR_INVALID_ARG;
    ws->min_units = min_units > 0 ? min_units : 1;
    for (int i = 0; i < ws->n_threads; i++) {
        int64_t b, e;
        tp_split_range((int64_t)n_units, i, ws->n_threads, &b, &e);
        atomic_store_explicit(&ws->share[i].fb, (uint64_t)b << 32 | (uint64_t)e, memory_order_relaxed);
    }
    return TP_OK;
}

/* A chunk of share s: its owner's from the front, a thief's from the back; half of what is left, at
 * least min units.  0 when the share is used up. */
static int claim(struct tp_worksplit_share *s, int own, uint64_t min, uint64_t *u0, uint64_t *u1)
{
    uint64_t fb = atomic_load_explicit(&s->fb, memory_order_relaxed);
    for (;;) {
        const uint64_t f = fb >> 32, b = fb & 0xffffffffu;
        if (f >= b) return 0;
        const uint64_t left = b - f;
        uint64_t c = left / 2;
        if (c < min) c = min;
        if (c > left) c = left;
        const uint64_t nf = own ? f + c : f, nb = own ? b : b - c;
        if (atomic_compare_exchange_weak_explicit(&s->fb, &fb, nf << 32 | nb, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *u0 = own ? f : b - c;
            *u1 = own ? f + c : b;
            return 1;
        }
    }
}

int tp_worksplit_next(tp_worksplit_t *ws, int ith, int *cursor, uint64_t *u0, uint64_t *u1)
{
    const int nth = ws->n_threads;
    for (; *cursor < nth; ++*cursor)
        if (claim(&ws->share[(ith + *cursor) % nth], *cursor == 0, ws->min_units, u0, u1)) return 1;
    return 0;
}

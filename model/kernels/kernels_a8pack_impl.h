/*
 * model/kernels/kernels_a8pack_impl.h - private: the activation stream of the
 * 16-rows-in-lanes batch kernels (kernels_x86_impl.h kx_qbatch and
 * kernels_x16_avx512.c).  Up to TP_A8PACK_BT tokens' prepared a8 rows
 * (kernels_impl.h) packed block by block, so a pass over a group of rows
 * reads one sequential stream at fixed offsets (8 tokens x 3 separate
 * arrays were more streams than the prefetchers follow):
 *   block i: qs[t][32] (256 bytes), s[t] (32), d[t] (32) -> TP_A8PACK_BLK bytes
 */
#ifndef TP_MODEL_KERNELS_A8PACK_IMPL_H
#define TP_MODEL_KERNELS_A8PACK_IMPL_H

#include <string.h>

#include "kernels/kernels_impl.h"

#define TP_A8PACK_BT 8                               /* tokens per packed block */
#define TP_A8PACK_BLK (TP_A8PACK_BT * (TP_QK + 8))   /* 320 bytes */
#define TP_A8PACK_S (TP_A8PACK_BT * TP_QK)           /* offset of s[] in a packed block */
#define TP_A8PACK_D (TP_A8PACK_BT * TP_QK + 32)      /* offset of d[] */

/* Blocks [b0, b0 + nbs) of the T rows at x (xrb bytes apart, n elements
 * each) into pk; tokens t >= T up to Tk repeat token T-1 (padding for a
 * wider pass, never stored by the kernels). */
static inline void tp_a8_pack(char *pk, const char *x, size_t xrb, int64_t n, int64_t b0, int nbs, int T, int Tk)
{
    const size_t soff = (size_t)n + (size_t)(n / TP_QK) * 9 * sizeof(int32_t); /* TP_A8_S */
    for (int t = 0; t < Tk; t++) {
        const char *row = x + (size_t)(t < T ? t : T - 1) * xrb;
        for (int i = 0; i < nbs; i++) {
            char *o = pk + (size_t)i * TP_A8PACK_BLK;
            const int64_t b = b0 + i;
            memcpy(o + t * TP_QK, row + b * TP_QK, TP_QK);
            memcpy(o + TP_A8PACK_S + 4 * t, row + soff + 4 * b, 4);
            memcpy(o + TP_A8PACK_D + 4 * t, row + n + 4 * b, 4);
        }
    }
}

#endif /* TP_MODEL_KERNELS_A8PACK_IMPL_H */

/*
 * scripts/arm64/count_q6k.c - the Q6_K x16 super-block step of the NEON dot-product template
 * (kernels_x16_tmpl_impl.h) as out-of-line functions, for static instruction counts
 * (docs/kernels-neon.md): xt_sb_q6 (each qh / ql chunk loaded once; 1 and 2 tokens) and the
 * generic per-sub-block xt_sb_k, each for one super-block of one 8-row half-group.
 * Compile only (aarch64-linux-gnu-gcc -c); not part of any build.
 */
#define KV_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#define KV_BT 4
#define KV_FILL count_q6k_fill
#include "kernels/kernels_x16_neon_kv_impl.h"
#include "kernels/kernels_x16_tmpl_impl.h"

void cnt_q6_once1(const char *p, const char *x, const size_t *xo, int64_t nb, int64_t i, kvf *acc);
void cnt_q6_sub1(const char *p, const char *x, const size_t *xo, int64_t nb, int64_t i, kvf *acc);
void cnt_q6_once2(const char *p, const char *x, const size_t *xo, int64_t nb, int64_t i, kvf *acc);
void cnt_q6_sub2(const char *p, const char *x, const size_t *xo, int64_t nb, int64_t i, kvf *acc);
__attribute__((noinline)) KV_ATTR void cnt_q6_once1(const char *p, const char *x, const size_t *xo, int64_t nb,
                                                    int64_t i, kvf *acc)
{
    xt_sb_q6(1, p, 0, x, xo, nb, i, acc);
}
__attribute__((noinline)) KV_ATTR void cnt_q6_sub1(const char *p, const char *x, const size_t *xo, int64_t nb,
                                                   int64_t i, kvf *acc)
{
    xt_sb_k(XT_Q6K, 1, p, 0, x, xo, nb, i, acc);
}
__attribute__((noinline)) KV_ATTR void cnt_q6_once2(const char *p, const char *x, const size_t *xo, int64_t nb,
                                                    int64_t i, kvf *acc)
{
    xt_sb_q6(2, p, 0, x, xo, nb, i, acc);
}
__attribute__((noinline)) KV_ATTR void cnt_q6_sub2(const char *p, const char *x, const size_t *xo, int64_t nb,
                                                   int64_t i, kvf *acc)
{
    xt_sb_k(XT_Q6K, 2, p, 0, x, xo, nb, i, acc);
}

/*
 * model/kernels/kernels_x16_neondot.c - arm64 NEON matmul for every x16 layout
 * (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) with the ARMv8.2 dot-product extension: the
 * template kernels_x16_tmpl_impl.h with two q-registers per 8 rows.  A lane's
 * 4-byte dot is one sdot against the activation's 4 bytes replicated (ld1r);
 * the K-quants' unsigned 4/5/6-bit weights are valid int8, and Q8_0 needs no
 * bias (sdot is signed x signed), Q4_0 starts from the a8 row's -8 * sum.
 * Chosen with the neon-dotprod ISA (docs/kernels-neon.md counts its
 * instructions per 256 weights).
 */
#if defined(__aarch64__) && (defined(__ARM_FEATURE_DOTPROD) || !defined(__clang__))
#if defined(__ARM_FEATURE_DOTPROD)
#define KV_ATTR
#elif defined(__clang__)
#define KV_ATTR __attribute__((target("dotprod")))
#else
#define KV_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define KV_BT 4
#define KV_FILL tp_kern_x16_neondot_ops
#include "kernels/kernels_x16_neon_kv_impl.h"
#include "kernels/kernels_x16_tmpl_impl.h"
#elif defined(__aarch64__)
#include "kernels/kernels_impl.h"
/* no dotprod intrinsics in this clang build (see kernels_neondot.c): no x16 kernels, row layout */
void tp_kern_x16_neondot_ops(struct tp_kern_ops *ops) { (void)ops; }
#else
typedef int tp_kernels_x16_neondot_unused; /* ISO C forbids an empty translation unit */
#endif

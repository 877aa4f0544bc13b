/*
 * model/kernels/kernels_neondot.c - arm64 NEON kernels with the ARMv8.2 dot-product
 * extension (sdot), used when the CPU reports it (HWCAP_ASIMDDP; every Apple
 * arm64 core has it); the template is kernels_neon_impl.h.
 */
#if defined(__aarch64__) && (defined(__ARM_FEATURE_DOTPROD) || !defined(__clang__))
/* the baseline may already include dotprod (Apple arm64): then no attribute */
#if defined(__ARM_FEATURE_DOTPROD)
#define KN_ATTR
#elif defined(__clang__)
#define KN_ATTR __attribute__((target("dotprod")))
#else
#define KN_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define KN_DOT 1
#include "kernels/kernels_neon_impl.h"

void tp_kern_neondot_ops(struct tp_kern_ops *ops)
{
    kn_fill_ops(ops);
    tp_kern_x16_neondot_ops(ops); /* every x16 layout: kernels_x16_neondot.c */
}
const int tp_kern_neondot_built = 1;
#elif defined(__aarch64__)
/* clang's arm_neon.h (before per-function targets) declares the dot-product
 * intrinsics only when the baseline has them (-march=armv8.2-a+dotprod, or
 * Apple arm64): without that this build has no dotprod kernels. */
#include "kernels/kernels_impl.h"
void tp_kern_neondot_ops(struct tp_kern_ops *ops) { (void)ops; }
const int tp_kern_neondot_built = 0;
#else
typedef int tp_kernels_neondot_unused; /* ISO C forbids an empty translation unit */
#endif

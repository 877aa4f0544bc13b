/*
 * model/kernels/kernels_kquant_neondot.c - arm64 NEON K-quant kernels with the
 * ARMv8.2 dot-product extension (sdot); the template is
 * kernels_kquant_neon_impl.h.
 */
#if defined(__aarch64__) && (defined(__ARM_FEATURE_DOTPROD) || !defined(__clang__))
/* the baseline may already include dotprod (Apple arm64): then no attribute */
#if defined(__ARM_FEATURE_DOTPROD)
#define KQN_ATTR
#elif defined(__clang__)
#define KQN_ATTR __attribute__((target("dotprod")))
#else
#define KQN_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define KQN_DOT 1
#define KQN_FILL tp_kern_kquant_neondot_ops
#include "kernels/kernels_kquant_neon_impl.h"
#elif defined(__aarch64__)
#include "kernels/kernels_impl.h"
/* no dotprod intrinsics in this clang build (see kernels_neondot.c): the plain NEON kernels */
void tp_kern_kquant_neondot_ops(struct tp_kern_ops *ops) { tp_kern_kquant_neon_ops(ops); }
#else
typedef int tp_kernels_kquant_neondot_unused; /* ISO C forbids an empty translation unit */
#endif

/*
 * model/kernels/kernels_mxfp4_neondot.c - arm64 NEON MXFP4 matmul with the
 * ARMv8.2 dot-product extension (sdot), offered when kernels.c offers
 * "neon-dotprod"; the template is kernels_mxfp4_neon_impl.h.  Same compiler
 * rules as kernels_kquant_neondot.c: without a way to build sdot here, the
 * plain NEON kernel stands in.
 */
#if defined(__aarch64__) && (defined(__ARM_FEATURE_DOTPROD) || !defined(__clang__))
#if defined(__ARM_FEATURE_DOTPROD)
#define MXN_ATTR
#else
#define MXN_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define MXN_DOT 1
#define MXN_FILL tp_kern_mxfp4_neondot_ops
#include "kernels/kernels_mxfp4_neon_impl.h"
#elif defined(__aarch64__)
#include "kernels/kernels_impl.h"
void tp_kern_mxfp4_neondot_ops(struct tp_kern_ops *ops) { tp_kern_mxfp4_neon_ops(ops); }
#else
typedef int tp_kernels_mxfp4_neondot_unused; /* ISO C forbids an empty translation unit */
#endif

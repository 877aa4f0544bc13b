/*
 * model/kernels/kernels_neon.c - arm64 NEON kernels without the dot-product
 * extension (ARMv8.0 baseline); the template is kernels_neon_impl.h.
 */
#if defined(__aarch64__)
#define KN_ATTR /* baseline NEON: every arm64 CPU has it */
#define KN_DOT 0
#include "kernels/kernels_neon_impl.h"

void tp_kern_neon_ops(struct tp_kern_ops *ops) { kn_fill_ops(ops); }
#else
typedef int tp_kernels_neon_unused; /* ISO C forbids an empty translation unit */
#endif

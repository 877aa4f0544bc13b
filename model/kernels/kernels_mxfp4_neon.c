/*
 * model/kernels/kernels_mxfp4_neon.c - arm64 NEON MXFP4 matmul without the
 * dot-product extension; the template is kernels_mxfp4_neon_impl.h.
 */
#if defined(__aarch64__)
#define MXN_ATTR /* baseline NEON: every arm64 CPU has it */
#define MXN_DOT 0
#define MXN_FILL tp_kern_mxfp4_neon_ops
#include "kernels/kernels_mxfp4_neon_impl.h"
#else
typedef int tp_kernels_mxfp4_neon_unused; /* ISO C forbids an empty translation unit */
#endif

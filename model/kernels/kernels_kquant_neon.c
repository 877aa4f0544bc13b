/*
 * model/kernels/kernels_kquant_neon.c - arm64 NEON K-quant kernels without the
 * dot-product extension; the template is kernels_kquant_neon_impl.h.
 */
#if defined(__aarch64__)
#define KQN_ATTR /* baseline NEON: every arm64 CPU has it */
#define KQN_DOT 0
#define KQN_FILL tp_kern_kquant_neon_ops
#include "kernels/kernels_kquant_neon_impl.h"
#else
typedef int tp_kernels_kquant_neon_unused; /* ISO C forbids an empty translation unit */
#endif

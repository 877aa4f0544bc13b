/*
 * scripts/vnni_peak/vnni_peak.c - how many zmm vpdpbusd one core retires per ns, alone and beside
 * the other instructions of the x16 batch passes (model/kernels/kernels_kx16_avx512.c).
 *
 * A batch pass of 8 tokens is arithmetic: each 64-byte weight chunk feeds 8 vpdpbusd (one per
 * token, the 4 activation bytes an embedded broadcast), and each sub-block adds per token a
 * vcvtdq2ps and a vfmadd (its scale).  This times loops of those instructions on registers and L1
 * only, 8 independent accumulator chains, so the figures are the core's issue limits: the ceiling
 * a batch pass's rate (bench kernels -p 8 on an L2-sized matrix, GOP/s / 128 = vpdpbusd per ns)
 * can be compared with.  Two rows time a whole super-block of one token as the Q4_K and Q6_K passes
 * issue it (their scale products, unpack, mins or offset and the token's sum), the ceiling of those
 * passes in particular.  The loops are inline assembly, so no compiler merges the identical chains.
 * Where the CPU has AVX512_BF16, also the zmm vdpbf16ps rate (16 lanes x 2 products: 64 FLOP each),
 * the ceiling of the AVX512_BF16 attention tile (model/forward/attn_bf16.c, bench attn's GFLOP/s).
 * x86-64 with AVX512-VNNI only.  Usage: vnni_peak [rounds]   (default 2)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512VNNI__)
static int32_t vp_act[64] __attribute__((aligned(64))); /* the broadcast "activations" */

static double vp_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* zmm0-7 the 8 chains, zmm8-9 float sums, zmm10 the vpdpwssd chain, zmm20 the "weights", zmm21 a register operand */
#define VP_ZERO                                                                                                  \
    "vpxord %%zmm0,%%zmm0,%%zmm0\n vpxord %%zmm1,%%zmm1,%%zmm1\n vpxord %%zmm2,%%zmm2,%%zmm2\n"                   \
    "vpxord %%zmm3,%%zmm3,%%zmm3\n vpxord %%zmm4,%%zmm4,%%zmm4\n vpxord %%zmm5,%%zmm5,%%zmm5\n"                   \
    "vpxord %%zmm6,%%zmm6,%%zmm6\n vpxord %%zmm7,%%zmm7,%%zmm7\n vpxord %%zmm8,%%zmm8,%%zmm8\n"                   \
    "vpxord %%zmm9,%%zmm9,%%zmm9\n vpxord %%zmm10,%%zmm10,%%zmm10\n"                                           \
    "vpternlogd $0xff,%%zmm20,%%zmm20,%%zmm20\n vpternlogd $0xff,%%zmm21,%%zmm21,%%zmm21\n"
#define VP_REG(k) "vpdpbusd %%zmm21,%%zmm20,%%zmm" #k "\n"
#define VP_BC(k, off) "vpdpbusd " #off "(%1)%{1to16%},%%zmm20,%%zmm" #k "\n"
/* 8 vpdpbusd, register operands */
#define VP_R8 VP_REG(0) VP_REG(1) VP_REG(2) VP_REG(3) VP_REG(4) VP_REG(5) VP_REG(6) VP_REG(7)
/* 8 vpdpbusd, each an embedded broadcast of its own 4 bytes (the batch passes' form) */
#define VP_B8 VP_BC(0, 0) VP_BC(1, 4) VP_BC(2, 8) VP_BC(3, 12) VP_BC(4, 16) VP_BC(5, 20) VP_BC(6, 24) VP_BC(7, 28)
/* 1 or 2 scale products (a chain converted and multiplied into a float sum): per 8 vpdpbusd,
 * a 32-value sub-block's share (Q4_0, Q4_K) or a 16-value one's (Q6_K) at 8 tokens */
#define VP_CF1 "vcvtdq2ps %%zmm0,%%zmm16\n vfmadd231ps %%zmm16,%%zmm21,%%zmm8\n"
#define VP_CF2 "vcvtdq2ps %%zmm0,%%zmm16\n vfmadd231ps %%zmm16,%%zmm21,%%zmm8\n vcvtdq2ps %%zmm4,%%zmm17\n vfmadd231ps %%zmm17,%%zmm21,%%zmm9\n"
/* 4 lane-wise ops of a 6-bit unpack (shift, and, shift, bit select) */
#define VP_AL4 "vpsrlw $2,%%zmm20,%%zmm18\n vpandd %%zmm21,%%zmm18,%%zmm18\n vpsllw $4,%%zmm18,%%zmm19\n vpternlogd $0xe4,%%zmm21,%%zmm19,%%zmm18\n"

/* A whole super-block of one token in the 8-token passes, per 64 vpdpbusd (kx_sb_q45 / kx_sb_q6 in
 * kernels_kx16_avx512.c): Q4_K's 8 sub-block scale products, then its mins (4 vpdpwssd of i16
 * pairs against broadcast pair sums, converted, times dmin, d applied by an fmsub) and the fma into
 * the token's sum; Q6_K's 16 scale products and 32 lane-wise unpack ops, then its -32 offset
 * (8 vpdpwssd, converted, an fma) and the same fma into the sum. */
#define VP_B8CF1 VP_B8 VP_CF1
#define VP_B8CF2AL VP_B8 VP_CF2 VP_AL4
#define VP_WS(off) "vpdpwssd " #off "(%1)%{1to16%},%%zmm20,%%zmm10\n"
#define VP_Q4K_TAIL                                                                                              \
    VP_WS(32) VP_WS(36) VP_WS(40) VP_WS(44) "vcvtdq2ps %%zmm10,%%zmm16\n vmulps %%zmm21,%%zmm16,%%zmm16\n"      \
    "vfmsub213ps %%zmm16,%%zmm21,%%zmm8\n vfmadd231ps %%zmm8,%%zmm21,%%zmm9\n"
#define VP_Q6K_TAIL                                                                                              \
    VP_WS(32) VP_WS(36) VP_WS(40) VP_WS(44) VP_WS(48) VP_WS(52) VP_WS(56) VP_WS(60)                              \
    "vcvtdq2ps %%zmm10,%%zmm16\n vfmadd231ps %%zmm16,%%zmm21,%%zmm8\n vfmadd231ps %%zmm8,%%zmm21,%%zmm9\n"
#define VP_X8(b) b b b b b b b b
#define VP_Q4K_SB VP_X8(VP_B8CF1) VP_Q4K_TAIL
#define VP_Q6K_SB VP_X8(VP_B8CF2AL) VP_Q6K_TAIL

/* 8 vdpbf16ps, register operands (bf16 pairs in zmm20 / zmm21 into the float chains zmm0-7) */
#define VP_BF(k) "vdpbf16ps %%zmm21,%%zmm20,%%zmm" #k "\n"
#define VP_BF8 VP_BF(0) VP_BF(1) VP_BF(2) VP_BF(3) VP_BF(4) VP_BF(5) VP_BF(6) VP_BF(7)

#define VP_ITERS 50000000L
#define VP_LOOP(body) VP_LOOPN(body, VP_ITERS)
/* iters iterations of body (VP_ITERS / 8 for the 64-vpdpbusd bodies, so each loop times as many) */
#define VP_LOOPN(body, iters)                                                                                    \
    do {                                                                                                         \
        long n_ = (iters);                                                                                       \
        const int32_t *a_ = vp_act;                                                                              \
        __asm__ volatile(VP_ZERO "1:\n" body "dec %0\n jnz 1b\n"                                                 \
                         : "+r"(n_)                                                                              \
                         : "r"(a_)                                                                               \
                         : "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9",       \
                           "zmm10", "zmm16", "zmm17", "zmm18", "zmm19", "zmm20", "zmm21", "memory", "cc");       \
    } while (0)

/* Instructions per ns: 8 per VP_ITERS iteration (the 64-instruction bodies run an eighth as many), in s seconds. */
static double vp_rate(double s) { return 8.0 * (double)VP_ITERS / s / 1e9; }

/* Times iters iterations of body and prints its row. */
#define VP_ROW(name, body, iters)                                                                                \
    do {                                                                                                         \
        const double t_ = vp_now();                                                                              \
        VP_LOOPN(body, iters);                                                                                   \
        printf("  %-52s %6.2f vpdpbusd/ns\n", name, vp_rate(vp_now() - t_));                                     \
    } while (0)

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 2;
    if (argc > 2 || rounds < 1) {
        fprintf(stderr, "usage: vnni_peak [rounds]   (rounds >= 1, default 2)\n");
        return 2;
    }
    for (int r = 0; r < rounds; r++) {
        printf("round %d (per iteration: 8 vpdpbusd zmm in 8 chains, plus what the line names)\n", r + 1);
        VP_ROW("register operands", VP_R8, VP_ITERS);
        VP_ROW("embedded broadcasts", VP_B8, VP_ITERS);
        VP_ROW("+ 1 vcvtdq2ps + 1 vfmadd (Q4_0, Q4_K)", VP_B8 VP_CF1, VP_ITERS);
        VP_ROW("+ 2 vcvtdq2ps + 2 vfmadd (Q6_K)", VP_B8 VP_CF2, VP_ITERS);
        VP_ROW("+ 2 vcvtdq2ps + 2 vfmadd + 4 lane-wise ops (Q6_K)", VP_B8 VP_CF2 VP_AL4, VP_ITERS);
        VP_ROW("Q4_K super-block x token, whole (+ mins, d, sum)", VP_Q4K_SB, VP_ITERS / 8);
        VP_ROW("Q6_K super-block x token, whole (+ offset, sum)", VP_Q6K_SB, VP_ITERS / 8);
#if defined(__AVX512BF16__)
        const double t = vp_now();
        VP_LOOP(VP_BF8);
        const double bf = vp_rate(vp_now() - t);
        printf("  %-52s %6.2f vdpbf16ps/ns (%.0f GFLOP/s)\n", "vdpbf16ps, register operands", bf, 64.0 * bf);
#endif
    }
    return 0;
}
#else
int main(void)
{
    fprintf(stderr, "vnni_peak: needs x86-64 with AVX512-VNNI (built with -march=native on such a CPU)\n");
    return 2;
}
#endif

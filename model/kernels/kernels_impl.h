/*
 * model/kernels/kernels_impl.h - private to the kernels*.c files: the exact block
 * layouts (GGUF/ggml for weights, our own for prepared activations) and the
 * table of per-ISA entry points that kernels.c fills once at run time.
 *
 * Activation rows ("a8", below) are the same for every ISA
 * (tp_kern_prepare_act dispatches, but all versions give bit-identical
 * rows), so SIMD and scalar matmuls see identical inputs.
 */
#ifndef TP_MODEL_KERNELS_IMPL_H
#define TP_MODEL_KERNELS_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "model/kernels.h"

#define TP_QK 32 /* elements per Q8_0 / Q4_0 block */

/* GGUF Q8_0: value = qs[i] * d. 34 bytes. */
typedef struct {
    uint16_t d; /* fp16 */
    int8_t qs[TP_QK];
} tp_blk_q8_0;

/* GGUF Q4_0: qs[j] low nibble = element j, high nibble = element j+16; value = (q-8)*d. 18 bytes. */
typedef struct {
    uint16_t d; /* fp16 */
    uint8_t qs[TP_QK / 2];
} tp_blk_q4_0;

/*
 * Prepared activation row for Q8_0 / Q4_0 weights ("a8"), n elements, nb = n/32:
 *   int8_t  qs[n]         x[i] ~= d[i/32] * qs[i]
 *   float   d[nb]
 *   int32_t c[nb * 8]     c[8b + j] = -K * (qs[32b+4j] + .. + qs[32b+4j+3]),
 *                         K = 8 for Q4_0 (nibble offset), 16 for MXFP4 (code
 *                         offset), 128 for Q8_0 (the +128 bias VNNI kernels use
 *                         to make weights unsigned)
 *   int32_t s[nb]         s[b] = c[8b] + .. + c[8b+7] (the whole block's correction;
 *                         written by tp_kern_prepare_act after the quantizer, for
 *                         kernels whose lanes hold whole blocks of different rows)
 * Structure-of-arrays so SIMD loads are contiguous; c lets u8 x s8 dot
 * kernels start their integer accumulators at the offset correction.
 * Rows may be unaligned (callers pad row strides freely): load with loadu/memcpy.
 */
#define TP_A8_ROW_BYTES(n) ((size_t)(n) + (size_t)((n) / TP_QK) * (sizeof(float) + 9 * sizeof(int32_t)))
#define TP_A8_QS(row) ((const int8_t *)(row))
#define TP_A8_D(row, n) ((const float *)((const char *)(row) + (n)))
#define TP_A8_C(row, n) ((const int32_t *)((const char *)(row) + (n) + (size_t)((n) / TP_QK) * sizeof(float)))
#define TP_A8_S(row, n) ((const int32_t *)((const char *)(row) + (n) + (size_t)((n) / TP_QK) * 9 * sizeof(float)))
/* K = 1 << kshift: 8 for Q4_0 (nibble offset), 16 for MXFP4 (its codes offset by 16 to be
 * unsigned in the x86 kernels), 128 for Q8_0 */
#define TP_A8_KSHIFT(wt) ((wt) == TP_WTYPE_Q4_0 ? 3 : (wt) == TP_WTYPE_MXFP4 ? 4 : 7)

/*
 * Q4_0 / Q8_0 "x16" (kernels.h): group g = rows 16g..16g+15 (a ragged last
 * group repeats its last row) at g * 16 * row_bytes; in it block b at
 * b * 16 * (block bytes), i.e. 288 (Q4_0) or 544 (Q8_0) bytes:
 *   uint16_t d[16]          fp16 scale of row L's block b
 *   uint8_t  qs[K][16][4]   qs[k][L][i] = row L's qs[4k + i]   (K = 4 for Q4_0, 8 for Q8_0)
 * A 64-byte load of qs[k] holds in 32-bit lane L row L's 4 bytes 4k..4k+3:
 * for Q4_0 masked with 0x0F its values 4k..4k+3, shifted right by 4 its
 * values 16+4k..16+4k+3; for Q8_0 its values 4k..4k+3.
 */
#define TP_X16_BLK (16 * (int)sizeof(tp_blk_q4_0))    /* Q4_0 */
#define TP_X16_BLK_Q8 (16 * (int)sizeof(tp_blk_q8_0)) /* Q8_0 */
/*
 * MXFP4 "x16": the same grouping; block b of a group at b * 272 (16 x 17):
 *   uint8_t  e[16]          E8M0 exponent of row L's block b
 *   uint8_t  qs[4][16][4]   qs[k][L][i] = row L's qs[4k + i] (at byte 16 + 64k + 4L + i)
 * A 64-byte load of qs[k] holds in lane L row L's codes 4k..4k+3 (low nibbles) and
 * 16+4k..16+4k+3 (high nibbles), as Q4_0's.  The kernels look the codes up as
 * kvalues + 16 (unsigned, 4..28) and seed each block's integer dot with the a8
 * row's s[b] (-16 x the block's sum), as the row-layout kernels do.
 */
#define TP_X16_BLK_MXFP4 (16 * (int)sizeof(tp_blk_mxfp4))
#define TP_X16_MXFP4_QS 16 /* offset of qs in an MXFP4 x16 block */

/*
 * K-quant x16 layouts (Q4_K, Q5_K, Q6_K): the same grouping (16 rows, a ragged
 * last group repeating its last row), super-block i of a group at
 * i * 16 * (block bytes), and in it every field of the 16 rows' blocks side
 * by side: a 2-byte fp16 factor as u16 [16] (lane L = row L), any other field
 * as [n/4][16][4] (4-byte chunk k of row L at 64k + 4L), so one 64-byte load
 * holds the same 4 bytes of all 16 rows.  Offsets in the 16-row super-block:
 *   Q4_K (2304 = 16 x 144): d[16] 0, dmin[16] 32, scales[3][16][4] 64, qs[32][16][4] 256
 *   Q5_K (2816 = 16 x 176): d 0, dmin 32, scales 64, then from 256 qh chunk m and qs chunk m in
 *   pairs for m = 0..7, then qs chunks 8..31 (tp_kx_q5k_qh, tp_kx_q5k_qs): the decode's read order
 *   Q6_K (3360 = 16 x 210): d 0, scales[4][16][4] 32, then from 288 its 16 qh and 32 ql chunks as
 *   16 triplets of 192 bytes in the order a one-token decode reads them (tp_kx_q6k_qh, tp_kx_q6k_ql)
 * tp_x16_fields (kernels_x16.c) lists them for every x16 type.
 */
#define TP_KX_Q4K_DMIN 32
#define TP_KX_Q4K_SC 64
#define TP_KX_Q4K_QS 256
/* Offset of qh chunk m (0..7) and of qs chunk k (0..31) in a Q5_K x16 super-block: the first eight qs
 * chunks each after the qh chunk read with it (sub-blocks 0 and 1 take bits 0 and 1 of every qh chunk),
 * so that the one-token decode reads the super-block front to back. */
static inline size_t tp_kx_q5k_qh(int m) { return 256 + 128 * (size_t)m; }
static inline size_t tp_kx_q5k_qs(int k)
{
    return k < 8 ? 256 + 128 * (size_t)k + 64 : 768 + 64 * (size_t)k;
}
#define TP_KX_Q6K_SC 32
#define TP_KX_Q6K_Q 288 /* the first qh / ql triplet */

/* Q6_K x16: half h (values 128h..), position b (the 16-value sub-blocks 8h + 2q + b) and chunk s of it:
 * qh chunk 8h + 4b + s holds the high bits of four sub-blocks (quarters q = 0..3, two bits each) and
 * ql chunks 16h + 4b + s (quarters 0 and 2) and 16h + 8 + 4b + s (quarters 1 and 3) their low nibbles.
 * The three lie together, in triplet 8h + 4b + s: the order in which the one-token decodes (AVX-512's
 * and the template's) read them, so that they stream each super-block front to back. */
static inline size_t tp_kx_q6k_trip(int h, int b, int s)
{
    return TP_KX_Q6K_Q + 192 * (size_t)(8 * h + 4 * b + s);
}
/* Offset of qh chunk k (0..15) and of ql chunk k (0..31) in a Q6_K x16 super-block. */
static inline size_t tp_kx_q6k_qh(int k) { return tp_kx_q6k_trip(k >> 3, (k >> 2) & 1, k & 3); }
static inline size_t tp_kx_q6k_ql(int k)
{
    return tp_kx_q6k_trip(k >> 4, (k >> 2) & 1, k & 3) + 64 + 64 * (size_t)((k >> 3) & 1);
}

/* A one-token x16 decode walks up to ns groups side by side (a "pass"), each group's row of
 * blocks one stream of `row` bytes.  Groups of the pass from group row g0: ns, or the rest of
 * rows [g0, r1). */
static inline int tp_x16_pass_groups(int64_t g0, int64_t r1, int ns)
{
    const int64_t n = (r1 - g0 + 15) / 16;
    return n <= 0 ? 0 : n < ns ? (int)n : ns;
}

/* Byte o of stream k of the pass at gp (groups 16 rows of wrb bytes apart, each stream row bytes),
 * or, o past the stream's end, byte o - row of stream k of the next pass (at gn, sn groups; 0 for
 * none), so prefetches run on from one pass into the next; NULL beyond both. */
static inline const char *tp_x16_ahead(const char *gp, const char *gn, int k, int sn, size_t wrb, size_t row,
                                       size_t o)
{
    if (o < row) return gp + (size_t)k * 16 * wrb + o;
    if (k < sn && o - row < row) return gn + (size_t)k * 16 * wrb + (o - row);
    return NULL;
}

_Static_assert(sizeof(tp_blk_q8_0) == 34, "Q8_0 block must be 34 bytes");
_Static_assert(sizeof(tp_blk_q4_0) == 18, "Q4_0 block must be 18 bytes");

/* ------------------------------------------------------------ K-quants */
#define TP_QK_K 256

/* GGUF Q4_K: value = d*sc_j*q - dmin*m_j, j = 32-value sub-block, 6-bit sc/m packed in scales. 144 bytes. */
typedef struct {
    uint16_t d, dmin; /* fp16 */
    uint8_t scales[12];
    uint8_t qs[TP_QK_K / 2]; /* 32 bytes per 64 values: low nibbles first 32, high nibbles next 32 */
} tp_blk_q4_k;

/* GGUF Q5_K: as Q4_K plus a 5th bit per value in qh (bit j of qh[l] for sub-block j). 176 bytes. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[TP_QK_K / 8];
    uint8_t qs[TP_QK_K / 2];
} tp_blk_q5_k;

/* GGUF Q6_K: value = d * scales[j] * (q - 32), j = 16-value sub-block. 210 bytes. */
typedef struct {
    uint8_t ql[TP_QK_K / 2];
    uint8_t qh[TP_QK_K / 4];
    int8_t scales[TP_QK_K / 16];
    uint16_t d;
} tp_blk_q6_k;

/* Q8_K activation block (as ggml's): bsums[j] = sum of qs[16j .. 16j+15]. 292 bytes. */
typedef struct {
    float d;
    int8_t qs[TP_QK_K];
    int16_t bsums[TP_QK_K / 16];
} tp_blk_q8_k;

_Static_assert(sizeof(tp_blk_q4_k) == 144, "Q4_K block must be 144 bytes");
_Static_assert(sizeof(tp_blk_q5_k) == 176, "Q5_K block must be 176 bytes");
_Static_assert(sizeof(tp_blk_q6_k) == 210, "Q6_K block must be 210 bytes");
_Static_assert(sizeof(tp_blk_q8_k) == 292, "Q8_K block must be 292 bytes");

/* ------------------------------------------------------------ MXFP4 */
struct tp_kern_ops;
/* GGUF MXFP4 (ggml type 39, OCP microscaling FP4): 32 values of 4-bit E2M1
 * sharing one E8M0 exponent byte.  qs[j] low nibble = element j, high nibble
 * = element j+16 (as Q4_0).  value = tp_mxfp4_kvalues[q] * 2^(e - 128): the
 * table holds the E2M1 values (0, .5, 1, 1.5, 2, 3, 4, 6, then negated)
 * doubled, so they are integers, and the scale is halved to match (ggml's
 * kvalues_mxfp4 and GGML_E8M0_TO_FP32_HALF).  17 bytes. */
typedef struct {
    uint8_t e;
    uint8_t qs[TP_QK / 2];
} tp_blk_mxfp4;
_Static_assert(sizeof(tp_blk_mxfp4) == 17, "MXFP4 block must be 17 bytes");
extern const int8_t tp_mxfp4_kvalues[16];
/* 2^(e - 128) as a float, exactly (e < 2: the subnormals 2^-128, 2^-127). */
static inline float tp_e8m0_half(uint8_t e)
{
    uint32_t bits = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
/* kernels_mxfp4.c: reference dequantize / quantize (ggml's quantize_row_mxfp4_ref) and the
 * per-ISA matmul table entries (activations: a8 rows as for Q8_0) */
void tp_mxfp4_dequant(const void *src, float *dst, int64_t n);
void tp_mxfp4_quantize(const float *src, void *dst, int64_t n);
void tp_kern_mxfp4_ops(const char *isa, struct tp_kern_ops *ops);
#if defined(__x86_64__) || defined(_M_X64)
void tp_kern_mxfp4_avx2_ops(struct tp_kern_ops *ops);   /* kernels_mxfp4_x86.c */
void tp_kern_mxfp4_avx512_ops(struct tp_kern_ops *ops); /* kernels_mxfp4_x86.c */
#endif
#if defined(__aarch64__)
void tp_kern_mxfp4_neon_ops(struct tp_kern_ops *ops);    /* kernels_mxfp4_neon.c */
void tp_kern_mxfp4_neondot_ops(struct tp_kern_ops *ops); /* kernels_mxfp4_neondot.c */
#endif

/*
 * Prepared activation row for K-quant weights, n elements, nb = n/256:
 *   tp_blk_q8_k blk[nb]      (the row-major kernels read only these)
 *   int16_t     pair[nb][24] written by tp_kern_prepare_act after the quantizer,
 *                            for the x16 kernels' i16-pair dots (vpdpwssd):
 *     pair[i][0..7]   a0 a2 a1 a3 a4 a6 a5 a7, a_j = bsums[2j] + bsums[2j+1]
 *                     (the 32-value sums the Q4_K / Q5_K mins multiply)
 *     pair[i][8..23]  for m = 0..3: bsums[4m], [4m+2], [4m+1], [4m+3] (Q6_K's -32 offset)
 * The order matches the even / odd bytes of a 4-byte scale chunk taken as i16 pairs.
 */
#define TP_Q8K_PAIRS 24
#define TP_Q8K_ROW_BYTES(n) ((size_t)((n) / TP_QK_K) * (sizeof(tp_blk_q8_k) + TP_Q8K_PAIRS * sizeof(int16_t)))
#define TP_Q8K_PAIR(row, n, i) \
    ((const int16_t *)((const char *)(row) + (size_t)((n) / TP_QK_K) * sizeof(tp_blk_q8_k)) + (size_t)(i) * TP_Q8K_PAIRS)

/* Unroll the next loop completely (sub-block loops whose index selects shifts and offsets). */
#if defined(__clang__)
#define KX_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define KX_UNROLL _Pragma("GCC unroll 16")
#else
#define KX_UNROLL
#endif

struct tp_kern_ops;
/* kernels_kquant.c */
void tp_kq_scales_mins(const uint8_t *scales12, uint8_t sc[8], uint8_t mn[8]);
void tp_kq_dequant(enum tp_wtype t, const void *src, float *dst, int64_t n);
void tp_kq_quantize(enum tp_wtype t, const float *src, void *dst, int64_t n);
void tp_kq_quant_q8k(const float *x, void *out, int64_t n);
void tp_kern_kquant_scalar_ops(struct tp_kern_ops *ops);
/* The K-quant pair sums of a prepared row (above) from its Q8_K blocks. */
void tp_kq_act_pairs(void *row, int64_t n);
/* Reference matmul of a K-quant x16 matrix: each super-block read back into its
 * GGUF form and computed as the row-major scalar kernel does (bit-identical to it). */
void tp_kq_matmul_x16_scalar(enum tp_wtype t, const void *w, size_t wrb, int64_t n, const void *xq, size_t xrb,
                             int n_tok, float *y, int64_t ys, int64_t r0, int64_t r1);
/* Super-block i of row r of an x16 matrix (any x16 type; row_bytes of the GGUF row) into blk. */
void tp_x16_unpack_block(enum tp_wtype t, const void *w, size_t row_bytes, int64_t r, int64_t i, void *blk);
#if defined(__x86_64__) || defined(_M_X64)
void tp_kern_kquant_avx2_ops(struct tp_kern_ops *ops);   /* kernels_kquant_avx2.c */
void tp_kern_kquant_avx512_ops(struct tp_kern_ops *ops); /* kernels_kquant_avx512.c */
#endif
#if defined(__aarch64__)
void tp_kern_kquant_neon_ops(struct tp_kern_ops *ops);    /* kernels_kquant_neon.c */
void tp_kern_kquant_neondot_ops(struct tp_kern_ops *ops); /* kernels_kquant_neondot.c */
#endif

/* One matmul implementation: same contract as tp_kern_matmul for one type. */
typedef void (*tp_kern_matmul_fn)(const void *w, size_t w_row_bytes, int64_t n_cols, const void *xq,
                                  size_t xq_row_bytes, int n_tok, float *y, int64_t y_stride, int64_t r0,
                                  int64_t r1);
/* Quantize n floats (multiple of 32) into one a8 row (see above), K = 1 << kshift. */
typedef void (*tp_kern_quant_a8_fn)(const float *x, void *out, int64_t n, int kshift);

/* One MLX affine matmul (kernels_mlx*.c): same contract as tp_kern_matmul_mlx for one variant. */
typedef void (*tp_kern_mlx_fn)(const void *w, size_t w_row_bytes, const struct tp_kern_groups *g, int64_t n_cols,
                               const void *xq, size_t xq_row_bytes, int n_tok, float *y, int64_t y_stride, int64_t r0,
                               int64_t r1);
#define TP_KERN_MLX_VARIANTS 4 /* q4 g32, q4 g64, q8 g32, q8 g64 */

struct tp_kern_ops {
    const char *name;
    tp_kern_matmul_fn matmul[TP_WTYPE_COUNT]; /* NULL: fall back to scalar */
    tp_kern_mlx_fn mlx[TP_KERN_MLX_VARIANTS]; /* NULL: fall back to scalar */
    tp_kern_matmul_fn matmul_q4_0_x16;        /* Q4_0 x16 layout; NULL: no native kernel (scalar) */
    tp_kern_matmul_fn matmul_q8_0_x16;        /* Q8_0 x16 layout; likewise */
    tp_kern_matmul_fn matmul_kq_x16[3];       /* Q4_K, Q5_K, Q6_K x16 layouts; likewise */
    tp_kern_matmul_fn matmul_mxfp4_x16;       /* MXFP4 x16 layout; likewise */
    tp_kern_quant_a8_fn quant_a8;             /* NULL: fall back to scalar */
    void (*quant_q8k)(const float *x, void *out, int64_t n); /* K-quant activations; NULL: tp_kq_quant_q8k
                                                                 (every version bit-identical to it) */
    int f32_beats_blas;                       /* 1: F32 prefill uses matmul[F32], not sgemm */
};

/* Each fills only what it implements (ops starts zeroed, name set by caller). */
void tp_kern_scalar_ops(struct tp_kern_ops *ops);
#if defined(__x86_64__) || defined(_M_X64)
void tp_kern_avx2_ops(struct tp_kern_ops *ops);
void tp_kern_avx512_ops(struct tp_kern_ops *ops);
void tp_kern_x16_avx512_ops(struct tp_kern_ops *ops); /* kernels_x16_avx512.c */
void tp_kern_kx16_avx512_ops(struct tp_kern_ops *ops); /* kernels_kx16_avx512.c */
void tp_kern_x16_avx2_ops(struct tp_kern_ops *ops);    /* kernels_x16_avx2.c */
void tp_kern_x16_avxvnni_ops(struct tp_kern_ops *ops); /* kernels_x16_avxvnni.c */
#endif
#if defined(__aarch64__)
void tp_kern_neon_ops(struct tp_kern_ops *ops);
void tp_kern_neondot_ops(struct tp_kern_ops *ops);
void tp_kern_x16_neondot_ops(struct tp_kern_ops *ops); /* kernels_x16_neondot.c (no-op without dotprod) */
void tp_kern_neoni8mm_ops(struct tp_kern_ops *ops);     /* kernels_x16_i8mm.c: neon-dotprod + smmla x16 batches */
void tp_kern_x16_i8mm_sdot_ops(struct tp_kern_ops *ops); /* the template's fill in that file (unused) */
extern const int tp_kern_i8mm_built;                    /* 0: this compiler could not build them */
extern const int tp_kern_neondot_built; /* 0: this compiler could not build them */
#endif

/* The table in use now (tp_kern_force_isa / TP_KERN_ISA) and the scalar one. kernels.c */
const struct tp_kern_ops *tp_kern_ops_current(void);
const struct tp_kern_ops *tp_kern_ops_scalar(void);

/* Scalar activation quantizer (the reference every SIMD version must match bit for bit). */
void tp_kern_quant_a8_scalar(const float *x, void *out, int64_t n, int kshift);

/* Row r of a matrix whose rows are rb bytes apart. */
#define TP_KROW(w, rb, r) ((const void *)((const char *)(w) + (size_t)(r) * (rb)))

/* The scalar reference loop shared by every weight type: y[t * ys + r] = dot(weight row r, activation
 * row t, n) for rows [r0, r1) and tokens [0, n_tok), in that order (kernels_scalar.c, kernels_mxfp4.c). */
typedef float (*tp_kern_row_dot_fn)(const void *w_row, const void *x_row, int64_t n);
/* The reference dot of one weight row of blk_bytes-byte blocks with one a8 activation row (n elements):
 * the sum over the blocks of blk_dot(weight block, its TP_QK activations, its activation scale d_x),
 * each an exact integer dot scaled in float by the block's. */
typedef float (*tp_kern_blk_dot_fn)(const void *w_blk, const int8_t *a, float d_x);
static inline float tp_kern_ref_a8_dot(tp_kern_blk_dot_fn blk_dot, size_t blk_bytes, const void *w_row,
                                       const void *x_row, int64_t n)
{
    const int8_t *xs = TP_A8_QS(x_row);
    const float *xd = TP_A8_D(x_row, n);
    float s = 0.0f;
    for (int64_t b = 0; b < n / TP_QK; b++) {
        float d;
        memcpy(&d, xd + b, sizeof d); /* rows may be unaligned */
        s += blk_dot((const char *)w_row + (size_t)b * blk_bytes, xs + b * TP_QK, d);
    }
    return s;
}

static inline void tp_kern_ref_matmul(tp_kern_row_dot_fn dot, const void *w, size_t wrb, int64_t n, const void *xq,
                                      size_t xrb, int n_tok, float *y, int64_t ys, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < n_tok; t++) y[t * ys + r] = dot(TP_KROW(w, wrb, r), TP_KROW(xq, xrb, t), n);
}

#endif /* TP_MODEL_KERNELS_IMPL_H */

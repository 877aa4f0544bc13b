/*
 * model/forward/bf16_pairs_impl.h - the helpers of the bf16 attention paths (attn_amx.c, attn_bf16.c):
 * a cache row's 32 values and a query's scaled values as 16 bf16 pairs, the 16 x 16 transpose of
 * 32-bit lanes, the pair-interleave tables and the key-range mask.  The includer defines BP_INL (the
 * function attributes: always_inline and its target) and BP_NAME(x) (its prefix), after
 * <immintrin.h> and forward/model_impl.h.
 */

/* 32 values (dims 32c .. 32c+31) of a cache row as bf16, in order: 16 pairs (2p, 2p+1) as 32-bit lanes */
BP_INL __m512i BP_NAME(row32)(enum tp_kv_type t, const uint8_t *row, int c)
{
    __m512 lo, hi;
    if (t == TP_KV_F16) {
        lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(row + 64 * c)));
        hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(row + 64 * c + 32)));
    } else if (t == TP_KV_F32) {
        lo = _mm512_loadu_ps(row + 128 * c);
        hi = _mm512_loadu_ps(row + 128 * c + 64);
    } else { /* q8_0 in blocks of 32 (hd % 32 == 0): fp16 scale, 32 int8 */
        const uint8_t *blk = row + 34 * c;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        const __m512 d = _mm512_set1_ps(tp_fp16_to_f32(dh));
        const __m128i q0 = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2));
        const __m128i q1 = _mm_loadu_si128((const __m128i *)(const void *)(blk + 18));
        lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)));
        hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)));
    }
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* r[i] (16 rows of 16 32-bit lanes) becomes its transpose */
BP_INL void BP_NAME(transpose16)(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + k], 128-bit lane i: column 4i + k of rows 4g .. 4g+3 */
    for (int g = 0; g < 4; g++) {
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int k = 0; k < 4; k++) {
        const __m512i v = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88), w = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        const __m512i w2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
        r[k] = _mm512_shuffle_i32x4(v, v2, 0x88);
        r[8 + k] = _mm512_shuffle_i32x4(v, v2, 0xDD);
        r[4 + k] = _mm512_shuffle_i32x4(w, w2, 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(w, w2, 0xDD);
    }
}

/* 16-bit lane indices that interleave a[0..15] with b[0..15] (lo) and a[16..31] with b[16..31] (hi) */
static const uint16_t BP_NAME(ilv_lo)[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
static const uint16_t BP_NAME(ilv_hi)[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                       24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

/* mask of lanes j (0..15) with a <= base + j < b */
static inline __mmask16 BP_NAME(range_mask)(int base, int a, int b)
{
    const int lo = a - base < 0 ? 0 : a - base > 16 ? 16 : a - base;
    const int hi = b - base < 0 ? 0 : b - base > 16 ? 16 : b - base;
    const unsigned full = hi >= 16 ? 0xFFFFu : (1u << hi) - 1u;
    return (__mmask16)(lo >= hi ? 0u : full & ~((1u << lo) - 1u));
}

/* x[0..31] * scale as bf16, in order: 16 pairs as 32-bit lanes (a query row's chunk, scores pre-scaled) */
BP_INL __m512i BP_NAME(scaled32)(const float *x, __m512 scale)
{
    const __m512 lo = _mm512_mul_ps(scale, _mm512_loadu_ps(x)), hi = _mm512_mul_ps(scale, _mm512_loadu_ps(x + 16));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

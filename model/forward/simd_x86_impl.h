/*
 * model/forward/simd_x86_impl.h - private: the x86 vector helpers of the forward pass, written once for
 * both widths and included once per width (ops.c: AVX2; attn.c: AVX2 and AVX-512), after <immintrin.h>.
 * Before including, define SX_W (8: __m256, 16: __m512), SX_NAME(x) (the width's name for helper x),
 * SX_TARGET (the target string of the including functions) and, for the attention helpers (which use
 * attn.c's q8_block), SX_ATTN.  Every helper is always_inline.
 *   exp(x)                    e^x per lane, x clamped to [-87.3, 88.3]: x = n ln2 + r, |r| <= ln2/2,
 *                             Cephes' degree-6 polynomial for e^r (~2 ulp), times 2^n via the exponent
 *   exp_sum(x, n, mx)         x[i] = e^(x[i] - mx) for i < n; returns their sum
 *   load_row(t, src, dst, hd) one KV-cache row (f32, f16, q8_0) as hd floats; hd % SX_W == 0
 *   dots(q, k, n, hd, s)      s[j] = q . k_j for the n rows k (hd floats each), four keys at a time
 *   scal(o, c, hd)            o[i] *= c
 *   pv(o, p, v, n, hd)        o[hd] += sum_j p[j] v[j * hd ..] for j < n, columns kept in registers over j
 */
#if SX_W == 8
#define SX_V __m256
#define VX(op) _mm256##op
#define SX_ROUND(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define SX_CAST_PS(x) _mm256_castsi256_ps(x)
#define SX_LOAD_PH(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define SX_LOAD_I8(p) _mm_loadl_epi64((const __m128i *)(const void *)(p))
#elif SX_W == 16
#define SX_V __m512
#define VX(op) _mm512##op
#define SX_ROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define SX_CAST_PS(x) _mm512_castsi512_ps(x)
#define SX_LOAD_PH(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define SX_LOAD_I8(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#else
#error "SX_W must be 8 or 16"
#endif
#define SX_FN __attribute__((always_inline, target(SX_TARGET))) static inline

SX_FN float SX_NAME(hsum)(SX_V v)
{
#if SX_W == 8
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
#else
    return _mm512_reduce_add_ps(v);
#endif
}

SX_FN SX_V SX_NAME(exp)(SX_V x)
{
    x = VX(_min_ps)(VX(_max_ps)(x, VX(_set1_ps)(-87.3f)), VX(_set1_ps)(88.3f));
    const SX_V n = SX_ROUND(VX(_mul_ps)(x, VX(_set1_ps)(1.44269504088896341f)));
    SX_V r = VX(_fnmadd_ps)(n, VX(_set1_ps)(0.693359375f), x);
    r = VX(_fnmadd_ps)(n, VX(_set1_ps)(-2.12194440e-4f), r);
    SX_V p = VX(_set1_ps)(1.9875691500e-4f);
    p = VX(_fmadd_ps)(p, r, VX(_set1_ps)(1.3981999507e-3f));
    p = VX(_fmadd_ps)(p, r, VX(_set1_ps)(8.3334519073e-3f));
    p = VX(_fmadd_ps)(p, r, VX(_set1_ps)(4.1665795894e-2f));
    p = VX(_fmadd_ps)(p, r, VX(_set1_ps)(1.6666665459e-1f));
    p = VX(_fmadd_ps)(p, r, VX(_set1_ps)(5.0000001201e-1f));
    const SX_V e = VX(_add_ps)(VX(_fmadd_ps)(p, VX(_mul_ps)(r, r), r), VX(_set1_ps)(1.0f));
    return VX(_mul_ps)(e, SX_CAST_PS(VX(_slli_epi32)(VX(_add_epi32)(VX(_cvtps_epi32)(n), VX(_set1_epi32)(127)), 23)));
}

SX_FN float SX_NAME(exp_sum)(float *x, int n, float mx)
{
    const SX_V m = VX(_set1_ps)(mx);
    SX_V acc = VX(_setzero_ps)();
    int i = 0;
    for (; i + SX_W <= n; i += SX_W) {
        const SX_V e = SX_NAME(exp)(VX(_sub_ps)(VX(_loadu_ps)(x + i), m));
        VX(_storeu_ps)(x + i, e);
        acc = VX(_add_ps)(acc, e);
    }
#if SX_W == 8 /* the ragged end through the same vector code (a padded copy) */
    float s = SX_NAME(hsum)(acc);
    if (i < n) {
        float b[8], e[8];
        for (int k = 0; k < 8; k++) b[k] = i + k < n ? x[i + k] : mx;
        _mm256_storeu_ps(e, SX_NAME(exp)(_mm256_sub_ps(_mm256_loadu_ps(b), m)));
        for (int k = 0; k < n - i; k++) x[i + k] = e[k], s += e[k];
    }
    return s;
#else /* the ragged end under a mask */
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        const __m512 e = SX_NAME(exp)(_mm512_sub_ps(_mm512_mask_loadu_ps(m, k, x + i), m));
        _mm512_mask_storeu_ps(x + i, k, e);
        acc = _mm512_mask_add_ps(acc, k, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
#endif
}

#if defined(SX_ATTN)
SX_FN void SX_NAME(load_row)(enum tp_kv_type t, const uint8_t *src, float *dst, int hd)
{
    if (t == TP_KV_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)hd);
    } else if (t == TP_KV_F16) {
        for (int i = 0; i < hd; i += SX_W) VX(_storeu_ps)(dst + i, VX(_cvtph_ps)(SX_LOAD_PH(src + 2 * i)));
    } else { /* q8_0 blocks of B = 8, 16 or 32 values, a multiple of SX_W as hd is */
        const int B = q8_block(hd);
        for (int b = 0; b < hd / B; b++) {
            const uint8_t *blk = src + (size_t)b * (size_t)(B + 2);
            uint16_t dh;
            memcpy(&dh, blk, 2);
            const SX_V d = VX(_set1_ps)(tp_fp16_to_f32(dh));
            for (int k = 0; k < B; k += SX_W) {
                const SX_V f = VX(_cvtepi32_ps)(VX(_cvtepi8_epi32)(SX_LOAD_I8(blk + 2 + k)));
                VX(_storeu_ps)(dst + b * B + k, VX(_mul_ps)(d, f));
            }
        }
    }
}

SX_FN void SX_NAME(dots)(const float *q, const float *k, int n, int hd, float *s)
{
    int j = 0;
    for (; j + 4 <= n; j += 4) { /* four FMA chains */
        const float *k0 = k + (size_t)j * hd;
        SX_V a0 = VX(_setzero_ps)(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < hd; i += SX_W) {
            const SX_V qv = VX(_loadu_ps)(q + i);
            a0 = VX(_fmadd_ps)(qv, VX(_loadu_ps)(k0 + i), a0);
            a1 = VX(_fmadd_ps)(qv, VX(_loadu_ps)(k0 + hd + i), a1);
            a2 = VX(_fmadd_ps)(qv, VX(_loadu_ps)(k0 + 2 * hd + i), a2);
            a3 = VX(_fmadd_ps)(qv, VX(_loadu_ps)(k0 + 3 * hd + i), a3);
        }
#if SX_W == 8 /* one reduction for the four */
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        _mm_storeu_ps(s + j, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
#else
        s[j] = _mm512_reduce_add_ps(a0);
        s[j + 1] = _mm512_reduce_add_ps(a1);
        s[j + 2] = _mm512_reduce_add_ps(a2);
        s[j + 3] = _mm512_reduce_add_ps(a3);
#endif
    }
    for (; j < n; j++) {
        SX_V a = VX(_setzero_ps)();
        for (int i = 0; i < hd; i += SX_W) a = VX(_fmadd_ps)(VX(_loadu_ps)(q + i), VX(_loadu_ps)(k + (size_t)j * hd + i), a);
        s[j] = SX_NAME(hsum)(a);
    }
}

SX_FN void SX_NAME(scal)(float *o, float c, int hd)
{
    const SX_V vc = VX(_set1_ps)(c);
    for (int i = 0; i < hd; i += SX_W) VX(_storeu_ps)(o + i, VX(_mul_ps)(vc, VX(_loadu_ps)(o + i)));
}

/* nr (1 to 8) registers of columns from o, v kept over all n values */
SX_FN void SX_NAME(pv_cols)(float *o, const float *p, const float *v, int n, int hd, int nr)
{
    SX_V a[8];
    for (int c = 0; c < nr; c++) a[c] = VX(_loadu_ps)(o + SX_W * c);
    for (int j = 0; j < n; j++) {
        const SX_V s = VX(_set1_ps)(p[j]);
        const float *r = v + (size_t)j * hd;
        for (int c = 0; c < nr; c++) a[c] = VX(_fmadd_ps)(s, VX(_loadu_ps)(r + SX_W * c), a[c]);
    }
    for (int c = 0; c < nr; c++) VX(_storeu_ps)(o + SX_W * c, a[c]);
}

SX_FN void SX_NAME(pv)(float *o, const float *p, const float *v, int n, int hd)
{
    int c = 0;
    for (; c + 8 * SX_W <= hd; c += 8 * SX_W) SX_NAME(pv_cols)(o + c, p, v + c, n, hd, 8);
    for (; c + 4 * SX_W <= hd; c += 4 * SX_W) SX_NAME(pv_cols)(o + c, p, v + c, n, hd, 4);
    for (; c < hd; c += SX_W) SX_NAME(pv_cols)(o + c, p, v + c, n, hd, 1);
}
#endif

#undef SX_V
#undef VX
#undef SX_ROUND
#undef SX_CAST_PS
#undef SX_LOAD_PH
#undef SX_LOAD_I8
#undef SX_FN

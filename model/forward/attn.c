/*
 * model/forward/attn.c - one query head's attention over a cached sequence:
 * scores q.k_j * scale for positions j < n, softmax, then o = sum_j p_j v_j,
 * fused so a head is one pass over K and one over V.  The AVX2 version
 * scores four positions at a time (four independent FMA chains, one
 * horizontal reduction per four), keeps up to 64 outputs in registers over
 * all of V (longer heads in 64-wide column passes), and converts f16 cache
 * rows as it loads them; compared with a dot and an axpy call per position
 * it saves the calls, the per-position reductions and the loads and stores
 * of o.  Elsewhere (and as the reference) the per-position ops.c routines.
 */
#include <pthread.h>

#include "forward/model_impl.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define TP_ATTN_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

static void attn_ref(const float *q, const void *kc, const void *vc, size_t kvs, int f16, int n, int hd, float scale,
                     float *sc, float *o)
{
    for (int i = 0; i < hd; i++) o[i] = 0.0f;
    if (f16) {
        const uint16_t *k = kc, *v = vc;
        for (int j = 0; j < n; j++) sc[j] = tp_op_dot_f16(q, k + (size_t)j * kvs, hd) * scale;
        tp_op_softmax(sc, n);
        for (int j = 0; j < n; j++) tp_op_axpy_f16(o, sc[j], v + (size_t)j * kvs, hd);
    } else {
        const float *k = kc, *v = vc;
        for (int j = 0; j < n; j++) sc[j] = tp_op_dot(q, k + (size_t)j * kvs, hd) * scale;
        tp_op_softmax(sc, n);
        for (int j = 0; j < n; j++) tp_op_axpy(o, sc[j], v + (size_t)j * kvs, hd);
    }
}

#if defined(TP_ATTN_X86)
#define AT __attribute__((always_inline, target("avx2,fma,f16c"))) static inline

/* 8 cache values at element e of row base (f16 or f32) as floats */
AT __m256 ld8(const void *base, size_t e, const int f16)
{
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + e)));
    return _mm256_loadu_ps((const float *)base + e);
}

AT float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AT void scores(const float *q, const void *kc, size_t kvs, const int f16, int n, int hd, float scale, float *sc)
{
    const __m128 vs = _mm_set1_ps(scale);
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        const size_t r = (size_t)j * kvs;
        for (int i = 0; i < hd; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, ld8(kc, r + (size_t)i, f16), a0);
            a1 = _mm256_fmadd_ps(qv, ld8(kc, r + kvs + (size_t)i, f16), a1);
            a2 = _mm256_fmadd_ps(qv, ld8(kc, r + 2 * kvs + (size_t)i, f16), a2);
            a3 = _mm256_fmadd_ps(qv, ld8(kc, r + 3 * kvs + (size_t)i, f16), a3);
        }
        /* [sum a0, sum a1, sum a2, sum a3] */
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(sc + j, _mm_mul_ps(s, vs));
    }
    for (; j < n; j++) {
        __m256 a = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ld8(kc, (size_t)j * kvs + (size_t)i, f16), a);
        sc[j] = hsum8(a) * scale;
    }
}

/* o[c0 .. c0+64) = sum_j p_j v_j[c0 .. c0+64): 8 accumulators in registers */
AT void av64(const float *p, const void *vc, size_t kvs, const int f16, int n, int c0, float *o)
{
    __m256 o0 = _mm256_setzero_ps(), o1 = _mm256_setzero_ps(), o2 = _mm256_setzero_ps(), o3 = _mm256_setzero_ps();
    __m256 o4 = _mm256_setzero_ps(), o5 = _mm256_setzero_ps(), o6 = _mm256_setzero_ps(), o7 = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        const __m256 s = _mm256_set1_ps(p[j]);
        const size_t r = (size_t)j * kvs + (size_t)c0;
        o0 = _mm256_fmadd_ps(s, ld8(vc, r, f16), o0);
        o1 = _mm256_fmadd_ps(s, ld8(vc, r + 8, f16), o1);
        o2 = _mm256_fmadd_ps(s, ld8(vc, r + 16, f16), o2);
        o3 = _mm256_fmadd_ps(s, ld8(vc, r + 24, f16), o3);
        o4 = _mm256_fmadd_ps(s, ld8(vc, r + 32, f16), o4);
        o5 = _mm256_fmadd_ps(s, ld8(vc, r + 40, f16), o5);
        o6 = _mm256_fmadd_ps(s, ld8(vc, r + 48, f16), o6);
        o7 = _mm256_fmadd_ps(s, ld8(vc, r + 56, f16), o7);
    }
    _mm256_storeu_ps(o + c0, o0);
    _mm256_storeu_ps(o + c0 + 8, o1);
    _mm256_storeu_ps(o + c0 + 16, o2);
    _mm256_storeu_ps(o + c0 + 24, o3);
    _mm256_storeu_ps(o + c0 + 32, o4);
    _mm256_storeu_ps(o + c0 + 40, o5);
    _mm256_storeu_ps(o + c0 + 48, o6);
    _mm256_storeu_ps(o + c0 + 56, o7);
}

/* the same for the last w (multiple of 8, < 64) columns from c0 */
AT void av_tail(const float *p, const void *vc, size_t kvs, const int f16, int n, int c0, int w, float *o)
{
    for (int c = c0; c < c0 + w; c += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), ld8(vc, (size_t)j * kvs + (size_t)c, f16), a);
        _mm256_storeu_ps(o + c, a);
    }
}

AT void attn_x86(const float *q, const void *kc, const void *vc, size_t kvs, const int f16, int n, int hd, float scale,
                 float *sc, float *o)
{
    scores(q, kc, kvs, f16, n, hd, scale, sc);
    tp_op_softmax(sc, n);
    int c0 = 0;
    for (; c0 + 64 <= hd; c0 += 64) av64(sc, vc, kvs, f16, n, c0, o);
    if (c0 < hd) av_tail(sc, vc, kvs, f16, n, c0, hd - c0, o);
}

__attribute__((target("avx2,fma,f16c"))) static void attn_avx2(const float *q, const void *kc, const void *vc, size_t kvs,
                                                               int f16, int n, int hd, float scale, float *sc, float *o)
{
    if (hd % 8) {
        attn_ref(q, kc, vc, kvs, f16, n, hd, scale, sc, o);
        return;
    }
    if (f16)
        attn_x86(q, kc, vc, kvs, 1, n, hd, scale, sc, o);
    else
        attn_x86(q, kc, vc, kvs, 0, n, hd, scale, sc, o);
}
#endif

static void (*attn_fn)(const float *, const void *, const void *, size_t, int, int, int, float, float *,
                       float *) = attn_ref;

static void attn_choose(void)
{
#if defined(TP_ATTN_X86)
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
        (c & (1u << 29))) /* F16C */
        attn_fn = attn_avx2;
#endif
}

static pthread_once_t attn_once = PTHREAD_ONCE_INIT;

void tp_op_attn_head(const float *q, const void *kc, const void *vc, size_t kv_stride, int f16, int n, int hd,
                     float scale, float *sc, float *o)
{
    pthread_once(&attn_once, attn_choose);
    attn_fn(q, kc, vc, kv_stride, f16, n, hd, scale, sc, o);
}

void tp_op_attn_head_ref(const float *q, const void *kc, const void *vc, size_t kv_stride, int f16, int n, int hd,
                         float scale, float *sc, float *o)
{
    attn_ref(q, kc, vc, kv_stride, f16, n, hd, scale, sc, o);
}

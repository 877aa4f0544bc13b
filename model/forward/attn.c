/*
 * model/forward/attn.c - attention over the KV cache, flash-attention style:
 * a work item is a block of query rows (consecutive positions of one
 * sequence times the query heads sharing one KV head) and a range of key
 * positions; keys and values are read TP_ATTN_KB positions at a time into
 * float tiles (converted once from the cache's f32 / fp16 / q8_0 rows and
 * shared by every row of the item), each row keeps a running max, sum and
 * weighted-value vector (online softmax), and tiles outside a row's causal or
 * sliding window are skipped.  An item over part of the keys leaves its
 * unnormalised partial for tp_attn_merge, which is how forward.c splits one
 * long sequence over every thread.  Attention sinks add e^(sink - max) to a
 * row's denominator.  The loop body (attn_tile_impl.h) is compiled for AVX2
 * and for plain C; the helpers below differ per instruction set.  Also the
 * cache rows (tp_kv_store / tp_kv_load) and the per-position reference.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "forward/model_impl.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define TP_ATTN_X86 1
#include <cpuid.h>
#include <immintrin.h>
#include "forward/exp_avx2_impl.h"
#endif

/* ------------------------------------------------------------ cache rows */

/* q8_0 rows: blocks of B int8 values after their fp16 scale, B = 32 when head_dim allows, else 16 or 8 */
static int q8_block(int hd) { return hd % 32 == 0 ? 32 : hd % 16 == 0 ? 16 : hd % 8 == 0 ? 8 : 0; }

const char *tp_kv_type_name(enum tp_kv_type t)
{
    switch (t) {
    case TP_KV_F32: return "f32";
    case TP_KV_F16: return "f16";
    case TP_KV_Q8_0: return "q8_0";
    default: return "?";
    }
}

enum tp_status tp_kv_type_parse(const char *s, enum tp_kv_type *out)
{
    for (int t = 0; s && t < TP_KV_TYPE_COUNT; t++)
        if (strcmp(s, tp_kv_type_name((enum tp_kv_type)t)) == 0) {
            *out = (enum tp_kv_type)t;
            return TP_OK;
        }
    return TP_ERR_INVALID_ARG;
}

size_t tp_kv_row_bytes(enum tp_kv_type t, int hd)
{
    if (hd <= 0) return 0;
    switch (t) {
    case TP_KV_F32: return (size_t)hd * 4;
    case TP_KV_F16: return (size_t)hd * 2;
    case TP_KV_Q8_0: return q8_block(hd) ? (size_t)hd / (size_t)q8_block(hd) * (size_t)(q8_block(hd) + 2) : 0;
    default: return 0;
    }
}

int tp_kv_layer_window(const struct tp_hparams *hp, int l)
{
    if (!hp || hp->sliding_window <= 0 || l < 0 || l >= hp->n_layer) return 0;
    return hp->swa_period <= 0 || l % hp->swa_period < hp->swa_period - 1 ? hp->sliding_window : 0;
}

int64_t tp_kv_layer_positions(const struct tp_hparams *hp, int l, int n_ctx, int n_batch)
{
    const int64_t w = tp_kv_layer_window(hp, l), ring = w + (int64_t)n_batch;
    return w > 0 && ring < n_ctx ? ring : (int64_t)n_ctx;
}

uint64_t tp_kv_head_bytes(const struct tp_hparams *hp, int n_ctx, int n_batch, enum tp_kv_type t)
{
    uint64_t pos = 0;
    for (int l = 0; hp && l < hp->n_layer; l++) pos += (uint64_t)tp_kv_layer_positions(hp, l, n_ctx, n_batch);
    return 2ull * pos * (uint64_t)tp_kv_row_bytes(t, hp ? hp->head_dim : 0);
}

void tp_kv_store(enum tp_kv_type t, uint8_t *dst, const float *x, int hd)
{
    if (t == TP_KV_F32) {
        memcpy(dst, x, sizeof(float) * (size_t)hd);
    } else if (t == TP_KV_F16) {
        tp_op_to_f16((uint16_t *)(void *)dst, x, hd);
    } else { /* q8_0: d = amax / 127 rounded to fp16, q = round(x / d) within +-127 */
        const int B = q8_block(hd);
        for (int b = 0; b < hd / B; b++) {
            const float *xb = x + b * B;
            uint8_t *blk = dst + (size_t)b * (size_t)(B + 2);
            float amax = 0.0f;
            for (int i = 0; i < B; i++) amax = fmaxf(amax, fabsf(xb[i]));
            const uint16_t dh = tp_f32_to_fp16(amax / 127.0f);
            const float d = tp_fp16_to_f32(dh), id = d > 0.0f ? 1.0f / d : 0.0f;
            memcpy(blk, &dh, 2);
            for (int i = 0; i < B; i++) {
                const long q = lrintf(xb[i] * id);
                blk[2 + i] = (uint8_t)(int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
            }
        }
    }
}

void tp_kv_load(enum tp_kv_type t, const uint8_t *src, float *dst, int hd)
{
    if (t == TP_KV_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)hd);
    } else if (t == TP_KV_F16) {
        const uint16_t *h = (const uint16_t *)(const void *)src;
        for (int i = 0; i < hd; i++) dst[i] = tp_fp16_to_f32(h[i]);
    } else {
        const int B = q8_block(hd);
        for (int b = 0; b < hd / B; b++) {
            const uint8_t *blk = src + (size_t)b * (size_t)(B + 2);
            uint16_t dh;
            memcpy(&dh, blk, 2);
            const float d = tp_fp16_to_f32(dh);
            for (int i = 0; i < B; i++) dst[b * B + i] = d * (float)(int8_t)blk[2 + i];
        }
    }
}

size_t tp_attn_scratch_floats(int hd, int rows)
{
    /* Qs, O (rows x hd), M, L (rows), K and V tiles (KB x hd), scores (rows x KB) */
    return (size_t)rows * hd * 2 + (size_t)rows * 2 + (size_t)TP_ATTN_KB * hd * 2 + (size_t)rows * TP_ATTN_KB;
}

/* ------------------------------------------------------- plain C helpers */

static inline void ref_load_row(enum tp_kv_type t, const uint8_t *src, float *dst, int hd) { tp_kv_load(t, src, dst, hd); }

static inline float ref_dot(const float *a, const float *b, int n)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* s[j] = q . k_j for the n rows k (hd floats each) */
static inline void ref_dots(const float *q, const float *k, int n, int hd, float *s)
{
    for (int j = 0; j < n; j++) s[j] = ref_dot(q, k + (size_t)j * hd, hd);
}

/* x[i] = e^(x[i] - mx), returns the sum */
static inline float ref_exp_sum(float *x, int n, float mx)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += x[i] = expf(x[i] - mx);
    return s;
}

static inline void ref_scal(float *o, float c, int hd)
{
    for (int i = 0; i < hd; i++) o[i] *= c;
}

/* o[hd] += sum_j p[j] v[j * hd ..] for j < n */
static inline void ref_pv(float *o, const float *p, const float *v, int n, int hd)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < hd; i++) o[i] += p[j] * v[(size_t)j * hd + i];
}

#define AT_FN static
#define AT_NAME(x) ref_##x
#include "forward/attn_tile_impl.h"
#undef AT_FN
#undef AT_NAME

/* ----------------------------------------------------------- AVX2 helpers */

#if defined(TP_ATTN_X86)
#define AVX __attribute__((always_inline, target("avx2,fma,f16c"))) static inline

AVX float avx_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* hd % 8 == 0 (the dispatcher checks) */
AVX void avx_load_row(enum tp_kv_type t, const uint8_t *src, float *dst, int hd)
{
    if (t == TP_KV_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)hd);
    } else if (t == TP_KV_F16) {
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i))));
    } else {
        const int B = q8_block(hd);
        for (int b = 0; b < hd / B; b++) {
            const uint8_t *blk = src + (size_t)b * (size_t)(B + 2);
            uint16_t dh;
            memcpy(&dh, blk, 2);
            const __m256 d = _mm256_set1_ps(tp_fp16_to_f32(dh));
            for (int k = 0; k < B; k += 8) {
                const __m128i q8 = _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + k));
                const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
                _mm256_storeu_ps(dst + b * B + k, _mm256_mul_ps(d, f));
            }
        }
    }
}

/* s[j] = q . k_j, four keys at a time (four FMA chains, one reduction per four) */
AVX void avx_dots(const float *q, const float *k, int n, int hd, float *s)
{
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + (size_t)j * hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + hd + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * hd + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * hd + i), a3);
        }
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        _mm_storeu_ps(s + j, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
    for (; j < n; j++) {
        __m256 a = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + (size_t)j * hd + i), a);
        s[j] = avx_hsum(a);
    }
}

AVX float avx_exp_sum(float *x, int n, float mx)
{
    const __m256 m = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = tp_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = avx_hsum(acc);
    if (i < n) {
        float b[8], e[8];
        for (int k = 0; k < 8; k++) b[k] = i + k < n ? x[i + k] : mx;
        _mm256_storeu_ps(e, tp_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(b), m)));
        for (int k = 0; k < n - i; k++) x[i + k] = e[k], s += e[k];
    }
    return s;
}

AVX void avx_scal(float *o, float c, int hd)
{
    const __m256 vc = _mm256_set1_ps(c);
    for (int i = 0; i < hd; i += 8) _mm256_storeu_ps(o + i, _mm256_mul_ps(vc, _mm256_loadu_ps(o + i)));
}

/* 64 columns from c0 kept in registers over all n values */
AVX void avx_pv64(float *o, const float *p, const float *v, int n, int hd)
{
    __m256 o0 = _mm256_loadu_ps(o), o1 = _mm256_loadu_ps(o + 8), o2 = _mm256_loadu_ps(o + 16);
    __m256 o3 = _mm256_loadu_ps(o + 24), o4 = _mm256_loadu_ps(o + 32), o5 = _mm256_loadu_ps(o + 40);
    __m256 o6 = _mm256_loadu_ps(o + 48), o7 = _mm256_loadu_ps(o + 56);
    for (int j = 0; j < n; j++) {
        const __m256 s = _mm256_set1_ps(p[j]);
        const float *r = v + (size_t)j * hd;
        o0 = _mm256_fmadd_ps(s, _mm256_loadu_ps(r), o0);
        o1 = _mm256_fmadd_ps(s, _mm256_loadu_ps(r + 8), o1);
        o2 = _mm256_fmadd_ps(s, _mm256_loadu_ps(r + 16), o2);
        o3 = _mm256_fmadd_ps(s, _mm256_loadu_ps(r + 24), o3);
        o4 = _mm256_fmadd_ps(s, _mm256_loadu_ps(r + 32), o4);
        o5 = _mm256_fmadd_ps(s, _mm256_loadu_ps(r + 40), o5);
        o6 = _mm256_fmadd_ps(s, _mm256_loadu_ps(r + 48), o6);
        o7 = _mm256_fmadd_ps(s, _mm256_loadu_ps(r + 56), o7);
    }
    _mm256_storeu_ps(o, o0);
    _mm256_storeu_ps(o + 8, o1);
    _mm256_storeu_ps(o + 16, o2);
    _mm256_storeu_ps(o + 24, o3);
    _mm256_storeu_ps(o + 32, o4);
    _mm256_storeu_ps(o + 40, o5);
    _mm256_storeu_ps(o + 48, o6);
    _mm256_storeu_ps(o + 56, o7);
}

AVX void avx_pv(float *o, const float *p, const float *v, int n, int hd)
{
    int c = 0;
    for (; c + 64 <= hd; c += 64) avx_pv64(o + c, p, v + c, n, hd);
    for (; c < hd; c += 8) {
        __m256 a = _mm256_loadu_ps(o + c);
        for (int j = 0; j < n; j++) a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + (size_t)j * hd + c), a);
        _mm256_storeu_ps(o + c, a);
    }
}

#define AT_FN __attribute__((target("avx2,fma,f16c"))) static
#define AT_NAME(x) avx_##x
#include "forward/attn_tile_impl.h"
#undef AT_FN
#undef AT_NAME

/* --------------------------------------------------------- AVX-512 helpers */

#define Z512 __attribute__((always_inline, target("avx512f,avx2,fma,f16c"))) static inline

/* e^x as tp_exp_avx2, 16 lanes */
Z512 __m512 z_exp(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    const __m512i pow2n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(e, _mm512_castsi512_ps(pow2n));
}

/* hd % 16 == 0 (the dispatcher checks), so q8_0 blocks are 16 or 32 */
Z512 void z_load_row(enum tp_kv_type t, const uint8_t *src, float *dst, int hd)
{
    if (t == TP_KV_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)hd);
    } else if (t == TP_KV_F16) {
        for (int i = 0; i < hd; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(src + 2 * i))));
    } else {
        const int B = q8_block(hd);
        for (int b = 0; b < hd / B; b++) {
            const uint8_t *blk = src + (size_t)b * (size_t)(B + 2);
            uint16_t dh;
            memcpy(&dh, blk, 2);
            const __m512 d = _mm512_set1_ps(tp_fp16_to_f32(dh));
            for (int k = 0; k < B; k += 16) {
                const __m128i q8 = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2 + k));
                _mm512_storeu_ps(dst + b * B + k, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8))));
            }
        }
    }
}

Z512 void z_dots(const float *q, const float *k, int n, int hd, float *s)
{
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + (size_t)j * hd;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        for (int i = 0; i < hd; i += 16) {
            const __m512 qv = _mm512_loadu_ps(q + i);
            a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + i), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + hd + i), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + 2 * hd + i), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + 3 * hd + i), a3);
        }
        s[j] = _mm512_reduce_add_ps(a0);
        s[j + 1] = _mm512_reduce_add_ps(a1);
        s[j + 2] = _mm512_reduce_add_ps(a2);
        s[j + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; j < n; j++) {
        __m512 a = _mm512_setzero_ps();
        for (int i = 0; i < hd; i += 16)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + (size_t)j * hd + i), a);
        s[j] = _mm512_reduce_add_ps(a);
    }
}

Z512 float z_exp_sum(float *x, int n, float mx)
{
    const __m512 m = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 e = z_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        const __m512 e = z_exp(_mm512_sub_ps(_mm512_mask_loadu_ps(m, k, x + i), m));
        _mm512_mask_storeu_ps(x + i, k, e);
        acc = _mm512_mask_add_ps(acc, k, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

Z512 void z_scal(float *o, float c, int hd)
{
    const __m512 vc = _mm512_set1_ps(c);
    for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(o + i, _mm512_mul_ps(vc, _mm512_loadu_ps(o + i)));
}

/* 128 columns kept in 8 registers over all n values */
Z512 void z_pv128(float *o, const float *p, const float *v, int n, int hd)
{
    __m512 a[8];
    for (int c = 0; c < 8; c++) a[c] = _mm512_loadu_ps(o + 16 * c);
    for (int j = 0; j < n; j++) {
        const __m512 s = _mm512_set1_ps(p[j]);
        const float *r = v + (size_t)j * hd;
        for (int c = 0; c < 8; c++) a[c] = _mm512_fmadd_ps(s, _mm512_loadu_ps(r + 16 * c), a[c]);
    }
    for (int c = 0; c < 8; c++) _mm512_storeu_ps(o + 16 * c, a[c]);
}

Z512 void z_pv(float *o, const float *p, const float *v, int n, int hd)
{
    int c = 0;
    for (; c + 128 <= hd; c += 128) z_pv128(o + c, p, v + c, n, hd);
    for (; c + 64 <= hd; c += 64) {
        __m512 a0 = _mm512_loadu_ps(o + c), a1 = _mm512_loadu_ps(o + c + 16), a2 = _mm512_loadu_ps(o + c + 32),
               a3 = _mm512_loadu_ps(o + c + 48);
        for (int j = 0; j < n; j++) {
            const __m512 s = _mm512_set1_ps(p[j]);
            const float *r = v + (size_t)j * hd + c;
            a0 = _mm512_fmadd_ps(s, _mm512_loadu_ps(r), a0);
            a1 = _mm512_fmadd_ps(s, _mm512_loadu_ps(r + 16), a1);
            a2 = _mm512_fmadd_ps(s, _mm512_loadu_ps(r + 32), a2);
            a3 = _mm512_fmadd_ps(s, _mm512_loadu_ps(r + 48), a3);
        }
        _mm512_storeu_ps(o + c, a0);
        _mm512_storeu_ps(o + c + 16, a1);
        _mm512_storeu_ps(o + c + 32, a2);
        _mm512_storeu_ps(o + c + 48, a3);
    }
    for (; c < hd; c += 16) {
        __m512 a = _mm512_loadu_ps(o + c);
        for (int j = 0; j < n; j++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_loadu_ps(v + (size_t)j * hd + c), a);
        _mm512_storeu_ps(o + c, a);
    }
}

#define AT_FN __attribute__((target("avx512f,avx2,fma,f16c"))) static
#define AT_NAME(x) z_##x
#include "forward/attn_tile_impl.h"
#undef AT_FN
#undef AT_NAME
#endif

/* -------------------------------------------------------------- dispatch */

static int attn_has_avx2, attn_has_avx512;

static void attn_choose(void)
{
#if defined(TP_ATTN_X86)
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    attn_has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
                    (c & (1u << 29)); /* F16C */
    attn_has_avx512 = attn_has_avx2 && __builtin_cpu_supports("avx512f");
#endif
}

static pthread_once_t attn_once = PTHREAD_ONCE_INIT;
static int attn_level_max = 2; /* tp_attn_isa_limit */

int tp_attn_isa_limit(int level)
{
    pthread_once(&attn_once, attn_choose);
    const int prev = attn_level_max;
    attn_level_max = level;
    return prev;
}

int tp_attn_isa_level(void)
{
    pthread_once(&attn_once, attn_choose);
    const int have = attn_has_avx512 ? 2 : attn_has_avx2 ? 1 : 0;
    return have < attn_level_max ? have : attn_level_max;
}

void tp_attn_tile(const struct tp_attn_geom *g, const struct tp_attn_rows *r, const uint8_t *kc, const uint8_t *vc,
                  int k0, int k1, float *scratch, float *o, size_t o_stride, float *part)
{
    pthread_once(&attn_once, attn_choose);
#if defined(TP_ATTN_X86)
    const int level = tp_attn_isa_level();
    if (level >= 2 && g->hd % 16 == 0) {
        z_tile(g, r, kc, vc, k0, k1, scratch, o, o_stride, part);
        return;
    }
    if (level >= 1 && g->hd % 8 == 0) {
        avx_tile(g, r, kc, vc, k0, k1, scratch, o, o_stride, part);
        return;
    }
#endif
    ref_tile(g, r, kc, vc, k0, k1, scratch, o, o_stride, part);
}

void tp_attn_merge(const float *parts, int n, size_t stride, int hd, const struct tp_attn_rows *r, float *o,
                   size_t o_stride)
{
    for (int i = 0; i < r->nt; i++)
        for (int h = 0; h < r->ng; h++) {
            const size_t row = (size_t)(i * r->ng + h) * ((size_t)hd + 2);
            float mx = -INFINITY;
            for (int k = 0; k < n; k++) mx = fmaxf(mx, parts[k * stride + row]);
            float *dst = o + (size_t)i * o_stride + (size_t)h * hd;
            for (int c = 0; c < hd; c++) dst[c] = 0.0f;
            if (mx == -INFINITY) continue;
            float den = 0.0f;
            for (int k = 0; k < n; k++) {
                const float *pr = parts + k * stride + row;
                if (pr[0] == -INFINITY) continue;
                const float w = expf(pr[0] - mx);
                den += w * pr[1];
                for (int c = 0; c < hd; c++) dst[c] += w * pr[2 + c];
            }
            if (r->sinks) den += expf(r->sinks[h] - mx);
            const float inv = den > 0.0f ? 1.0f / den : 0.0f;
            for (int c = 0; c < hd; c++) dst[c] *= inv;
        }
}

/* ------------------------------------------------- per-position reference */

void tp_op_attn_head_ref(const float *q, const void *kc, const void *vc, size_t kvs, int f16, int n, int hd,
                         float scale, float *sc, float *o)
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

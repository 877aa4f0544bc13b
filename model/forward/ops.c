/*
 * model/forward/ops.c - the small element-wise pieces of the forward pass: RMSNorm,
 * rotary position embeddings (interleaved Llama layout and NeoX halves, with
 * linear and llama3 frequency scaling), softmax and SwiGLU (AVX2: a
 * polynomial exp, ~2 ulp).  Matrix products live in the kernels
 * (model/kernels.h); these are O(n) and single-threaded.
 */
#include <math.h>
#include <pthread.h>

#include "forward/model_impl.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define TP_OPS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#define SX_W 8
#define SX_NAME(x) avx_##x
#define SX_TARGET "avx2,fma"
#include "forward/simd_x86_impl.h"
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define TP_OPS_NEON 1
#include <arm_neon.h>
#endif

/* ---- dot / axpy for attention (the caches are f32, rows of head_dim) ---- */

float tp_op_dot_ref(const float *a, const float *b, int n)
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

static void axpy_ref(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static float dot_f16_ref(const float *a, const uint16_t *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * tp_fp16_to_f32(b[i]);
    return s;
}

static void axpy_f16_ref(float *y, float a, const uint16_t *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += a * tp_fp16_to_f32(x[i]);
}

static void to_f16_ref(uint16_t *dst, const float *src, int n)
{
    for (int i = 0; i < n; i++) dst[i] = tp_f32_to_fp16(src[i]);
}

#if defined(TP_OPS_X86)
__attribute__((target("avx2,fma"))) static float dot_avx2(const float *a, const float *b, int n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float s = _mm_cvtss_f32(h);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

__attribute__((target("avx2,fma"))) static void axpy_avx2(float *y, float a, const float *x, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

__attribute__((target("avx2,fma,f16c"))) static float dot_f16_avx2(const float *a, const uint16_t *b, int n)
{
    __m256 s0 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i))), s0);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float s = _mm_cvtss_f32(h);
    for (; i < n; i++) s += a[i] * tp_fp16_to_f32(b[i]);
    return s;
}

__attribute__((target("avx2,fma,f16c"))) static void axpy_f16_avx2(float *y, float a, const uint16_t *x, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                                _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * tp_fp16_to_f32(x[i]);
}

__attribute__((target("avx2,f16c"))) static void to_f16_avx2(uint16_t *dst, const float *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = tp_f32_to_fp16(src[i]);
}
#elif defined(TP_OPS_NEON)
static float dot_f16_neon(const float *a, const uint16_t *b, int n)
{
    float32x4_t s0 = vdupq_n_f32(0);
    int i = 0;
    for (; i + 4 <= n; i += 4)
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(b + i))));
    float s = vaddvq_f32(s0);
    for (; i < n; i++) s += a[i] * tp_fp16_to_f32(b[i]);
    return s;
}
static void axpy_f16_neon(float *y, float a, const uint16_t *x, int n)
{
    int i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + i))), a));
    for (; i < n; i++) y[i] += a * tp_fp16_to_f32(x[i]);
}
static float dot_neon(const float *a, const float *b, int n)
{
    float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    }
    float s = vaddvq_f32(vaddq_f32(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
static void axpy_neon(float *y, float a, const float *x, int n)
{
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++) y[i] += a * x[i];
}
#endif

#if defined(TP_OPS_X86)
/* 8 at a time; a ragged end goes through the same vector code (padded copy),
 * so every element gets the same arithmetic wherever a thread's range starts. */
__attribute__((target("avx2,fma"))) static void swiglu_avx2(float *y, const float *g, const float *u, int n)
{
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 G = _mm256_loadu_ps(g + i);
        const __m256 s = _mm256_div_ps(G, _mm256_add_ps(one, avx_exp(_mm256_xor_ps(G, neg))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    if (i < n) {
        float gb[8] = {0}, ub[8] = {0}, yb[8];
        for (int k = 0; k < n - i; k++) gb[k] = g[i + k], ub[k] = u[i + k];
        const __m256 G = _mm256_loadu_ps(gb);
        const __m256 s = _mm256_div_ps(G, _mm256_add_ps(one, avx_exp(_mm256_xor_ps(G, neg))));
        _mm256_storeu_ps(yb, _mm256_mul_ps(s, _mm256_loadu_ps(ub)));
        for (int k = 0; k < n - i; k++) y[i + k] = yb[k];
    }
}
#endif

#if defined(TP_OPS_X86)
/* x[i] = e^(x[i] - mx) for i < n; returns their sum (8 partial sums). */
__attribute__((target("avx2,fma"))) static float exp_sub_sum_avx2(float *x, float mx, int n) { return avx_exp_sum(x, n, mx); }
#endif

static float exp_sub_sum_ref(float *x, float mx, int n)
{
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    return sum;
}

static void swiglu_ref(float *y, const float *g, const float *u, int n)
{
    for (int i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static float (*dot_fn)(const float *, const float *, int) = tp_op_dot_ref;
static void (*axpy_fn)(float *, float, const float *, int) = axpy_ref;
static float (*dot_f16_fn)(const float *, const uint16_t *, int) = dot_f16_ref;
static void (*axpy_f16_fn)(float *, float, const uint16_t *, int) = axpy_f16_ref;
static void (*to_f16_fn)(uint16_t *, const float *, int) = to_f16_ref;
static void (*swiglu_fn)(float *, const float *, const float *, int) = swiglu_ref;
static float (*exp_sub_sum_fn)(float *, float, int) = exp_sub_sum_ref;

static void op_choose(void)
{
#if defined(TP_OPS_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        dot_fn = dot_avx2;
        axpy_fn = axpy_avx2;
        swiglu_fn = swiglu_avx2; /* vector expf: libm's per element is a visible share of a decode step */
        exp_sub_sum_fn = exp_sub_sum_avx2;
        unsigned a = 0, b = 0, c = 0, d = 0;
        if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29))) { /* F16C */
            dot_f16_fn = dot_f16_avx2;
            axpy_f16_fn = axpy_f16_avx2;
            to_f16_fn = to_f16_avx2;
        }
    }
#elif defined(TP_OPS_NEON)
    dot_fn = dot_neon;
    axpy_fn = axpy_neon;
    dot_f16_fn = dot_f16_neon;
    axpy_f16_fn = axpy_f16_neon;
#endif
}

static pthread_once_t op_once = PTHREAD_ONCE_INIT;
void tp_op_init(void) { pthread_once(&op_once, op_choose); }

float tp_op_dot(const float *a, const float *b, int n) { return dot_fn(a, b, n); }
void tp_op_axpy(float *y, float a, const float *x, int n) { axpy_fn(y, a, x, n); }
float tp_op_dot_f16(const float *a, const uint16_t *b, int n) { return dot_f16_fn(a, b, n); }
void tp_op_axpy_f16(float *y, float a, const uint16_t *x, int n) { axpy_f16_fn(y, a, x, n); }
void tp_op_to_f16(uint16_t *dst, const float *src, int n) { to_f16_fn(dst, src, n); }

float tp_op_rms_scale(const float *x, int n, float eps)
{
    /* the squares summed in eight fixed partial sums (the same order on every machine and ISA), so
     * the compiler can keep them in vector registers: one chain of dependent double adds cost
     * ~2.7 us per 2048 values, about 1% of a decode step */
    double p[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}, ss = 0.0;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) p[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++) ss += (double)x[i] * x[i];
    ss += ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
    return (float)(1.0 / sqrt(ss / n + eps));
}

void tp_op_rms_apply(float *y, const float *x, const float *w, float s, int n)
{
    for (int j = 0; j < n; j++) y[j] = x[j] * s * w[j];
}

void tp_op_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    tp_op_rms_apply(y, x, w, tp_op_rms_scale(x, n, eps), n);
}

void tp_op_rope_cs(float *cs, const float *inv_freq, int rope_dim, int pos)
{
    for (int i = 0; i < rope_dim / 2; i++) {
        float a = (float)pos * inv_freq[i];
        cs[2 * i] = cosf(a);
        cs[2 * i + 1] = sinf(a);
    }
}

void tp_op_rope(float *x, const float *cs, int rope_dim, int neox)
{
    int half = rope_dim / 2;
    if (neox) {
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float a = x[i], b = x[i + half];
            x[i] = a * c - b * s;
            x[i + half] = a * s + b * c;
        }
    } else {
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float a = x[2 * i], b = x[2 * i + 1];
            x[2 * i] = a * c - b * s;
            x[2 * i + 1] = a * s + b * c;
        }
    }
}

void tp_op_softmax(float *x, int n)
{
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = exp_sub_sum_fn(x, mx, n);
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void tp_op_swiglu(float *y, const float *g, const float *u, int n) { swiglu_fn(y, g, u, n); }

void tp_op_swiglu_clamped(float *y, const float *g, const float *u, int n, float alpha, float limit)
{
    for (int i = 0; i < n; i++) {
        const float gi = fminf(g[i], limit), ui = fmaxf(fminf(u[i], limit), -limit);
        y[i] = gi / (1.0f + expf(-alpha * gi)) * (ui + 1.0f);
    }
}

void tp_op_rope_freqs(float *inv_freq, const struct tp_hparams *hp, const float *freq_factors)
{
    int half = hp->rope_dim / 2;
    const double two_pi = 6.283185307179586;
    /* YaRN (model.h): the pairs below `low` keep their frequency, those above `high` are
     * interpolated by the factor, a linear ramp in between (no rounding of low / high) */
    double y_low = 0.0, y_high = 1.0;
    if (hp->rope_scaling == TP_ROPE_SCALING_YARN) {
        const double lb = log((double)hp->rope_theta), oc = hp->rope_orig_ctx;
        y_low = half * log(oc / (hp->rope_yarn_beta_fast * two_pi)) / lb;
        y_high = half * log(oc / (hp->rope_yarn_beta_slow * two_pi)) / lb;
        if (y_high == y_low) y_high += 0.001;
    }
    for (int i = 0; i < half; i++) {
        double f = pow((double)hp->rope_theta, -2.0 * i / hp->rope_dim);
        if (freq_factors) {
            f /= freq_factors[i];
        } else if (hp->rope_scaling == TP_ROPE_SCALING_LINEAR && hp->rope_scale_factor > 0) {
            f /= hp->rope_scale_factor;
        } else if (hp->rope_scaling == TP_ROPE_SCALING_YARN && hp->rope_scale_factor > 1.0f) {
            double ramp = ((double)i - y_low) / (y_high - y_low);
            ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
            f = f / hp->rope_scale_factor * ramp + f * (1.0 - ramp);
        } else if (hp->rope_scaling == TP_ROPE_SCALING_LLAMA3 && hp->rope_scale_factor > 0) {
            /* Meta's apply_scaling (Llama 3.1) */
            double lo = hp->rope_low_freq_factor, hi = hp->rope_high_freq_factor, orig = hp->rope_orig_ctx;
            double lo_wl = orig / lo, hi_wl = orig / hi, wl = two_pi / f;
            if (wl < hi_wl) {
                /* high frequency: unchanged */
            } else if (wl > lo_wl) {
                f /= hp->rope_scale_factor;
            } else {
                double smooth = (orig / wl - lo) / (hi - lo);
                f = (1.0 - smooth) * f / hp->rope_scale_factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

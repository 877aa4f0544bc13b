/*
 * model/ops.c - the small element-wise pieces of the forward pass: RMSNorm,
 * rotary position embeddings (interleaved Llama layout and NeoX halves, with
 * linear and llama3 frequency scaling), softmax and SwiGLU.  Matrix products
 * live in the kernels (model/kernels.h); these are O(n) and single-threaded.
 */
#include <math.h>

#include "model/model_impl.h"

void tp_op_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float s = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) y[i] = x[i] * s * w[i];
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
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void tp_op_swiglu(float *y, const float *g, const float *u, int n)
{
    for (int i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void tp_op_rope_freqs(float *inv_freq, const struct tp_hparams *hp, const float *freq_factors)
{
    int half = hp->rope_dim / 2;
    const double two_pi = 6.283185307179586;
    for (int i = 0; i < half; i++) {
        double f = pow((double)hp->rope_theta, -2.0 * i / hp->rope_dim);
        if (freq_factors) {
            f /= freq_factors[i];
        } else if (hp->rope_scaling == TP_ROPE_SCALING_LINEAR && hp->rope_scale_factor > 0) {
            f /= hp->rope_scale_factor;
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

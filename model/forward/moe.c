/*
 * model/forward/moe.c - the mixture-of-experts router of one token, as
 * Mixtral, Qwen2-MoE and Qwen3-MoE define it (Hugging Face modeling code and
 * llama.cpp's build_moe_ffn with softmax gating): probabilities
 * p = softmax(logits) over all experts; the k largest are selected; their
 * weights are p, or p / sum(selected p) when the model renormalises.
 * Selection compares the logits (softmax is monotonic) with ties going to the
 * lower expert index, so equal logits select deterministically.
 */
#include <math.h>

#include "forward/model_impl.h"

void tp_moe_route(const float *logits, int n_expert, int k, int norm, int *sel, float *w)
{
    float mx = logits[0];
    for (int e = 1; e < n_expert; e++)
        if (logits[e] > mx) mx = logits[e];
    double sum = 0.0;
    for (int e = 0; e < n_expert; e++) sum += exp((double)logits[e] - (double)mx);
    double sel_sum = 0.0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++) {
            int taken = 0;
            for (int i = 0; i < j && !taken; i++) taken = sel[i] == e;
            if (taken) continue;
            if (best < 0 || logits[e] > logits[best]) best = e; /* strict: the lower index wins a tie */
        }
        sel[j] = best;
        double p = exp((double)logits[best] - (double)mx) / sum;
        w[j] = (float)p;
        sel_sum += p;
    }
    if (norm && sel_sum > 0.0)
        for (int j = 0; j < k; j++) w[j] = (float)((double)w[j] / sel_sum);
}

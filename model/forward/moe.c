/*
 * model/forward/moe.c - the mixture-of-experts router of one token, as
 * Mixtral, Qwen2-MoE and Qwen3-MoE define it (Hugging Face modeling code and
 * llama.cpp's build_moe_ffn with softmax gating): probabilities
 * p = softmax(logits) over all experts; the k largest are selected; their
 * weights are p, or p / sum(selected p) when the model renormalises.
 * Selection compares the logits (softmax is monotonic) with ties going to the
 * lower expert index, so equal logits select deterministically.  gpt-oss
 * (OpenAI's reference, HF GptOssTopKRouter) selects the same way and takes
 * the softmax over the k selected logits only.
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

void tp_moe_route_topk_softmax(const float *logits, int n_expert, int k, int *sel, float *w)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++) {
            int taken = 0;
            for (int i = 0; i < j && !taken; i++) taken = sel[i] == e;
            if (taken) continue;
            if (best < 0 || logits[e] > logits[best]) best = e; /* strict: the lower index wins a tie */
        }
        sel[j] = best;
    }
    const double mx = logits[sel[0]];
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += exp((double)logits[sel[j]] - mx);
    for (int j = 0; j < k; j++) w[j] = (float)(exp((double)logits[sel[j]] - mx) / sum);
}

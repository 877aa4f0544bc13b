/*
 * server/spec_ngram.c - the n-gram prompt-lookup draft source and the
 * adaptive draft length (server/include/server/spec.h).  The lookup needs no
 * model: text that quotes or edits its prompt (code, structured output,
 * summaries) repeats runs of tokens, and the tokens that followed the
 * current suffix last time are a cheap guess for what follows now.
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "server/spec.h"

const char *tp_spec_mode_name(enum tp_spec_mode m)
{
    switch (m) {
    case TP_SPEC_OFF: return "off";
    case TP_SPEC_NGRAM: return "ngram";
    case TP_SPEC_DRAFT: return "draft";
    default: return "?";
    }
}

int tp_spec_mode_parse(const char *text)
{
    if (!text) return -1;
    if (strcmp(text, "off") == 0) return TP_SPEC_OFF;
    if (strcmp(text, "ngram") == 0) return TP_SPEC_NGRAM;
    if (strcmp(text, "draft") == 0) return TP_SPEC_DRAFT;
    return -1;
}

int tp_spec_ngram_draft(const int32_t *toks, int n, int k, int32_t *out)
{
    if (!toks || !out || k <= 0 || n < TP_SPEC_NGRAM_MIN + 1) return 0;
    for (int g = TP_MIN(TP_SPEC_NGRAM_MAX, n - 1); g >= TP_SPEC_NGRAM_MIN; g--) {
        const int32_t *suf = toks + n - g;
        /* most recent earlier occurrence toks[i..i+g) with at least one token after it */
        for (int i = n - g - 1; i >= 0; i--) {
            if (toks[i] != suf[0] || memcmp(toks + i, suf, (size_t)g * sizeof *toks) != 0) continue;
            const int from = i + g, m = TP_MIN(k, n - from);
            memcpy(out, toks + from, (size_t)m * sizeof *toks);
            return m;
        }
    }
    return 0;
}

#define TP_SPEC_ADAPT_DECAY 0.8f  /* weight of the history per verification step */
#define TP_SPEC_ADAPT_REACH 0.2   /* smallest chance worth a drafted position */

void tp_spec_adapt_init(struct tp_spec_adapt *a, int k_max)
{
    a->k_max = TP_MAX(1, TP_MIN(k_max, TP_SPEC_DRAFT_MAX));
    a->num = 0.6f * 5.0f; /* a prior worth about five tokens */
    a->den = 5.0f;
}

float tp_spec_adapt_alpha(const struct tp_spec_adapt *a)
{
    return a->den > 0.0f ? TP_MIN(1.0f, TP_MAX(0.0f, a->num / a->den)) : 0.0f;
}

int tp_spec_adapt_k(const struct tp_spec_adapt *a)
{
    const double alpha = tp_spec_adapt_alpha(a);
    if (alpha >= 0.999) return a->k_max;
    if (alpha <= 0.0) return 1;
    const double k = floor(log(TP_SPEC_ADAPT_REACH) / log(alpha));
    return k < 1.0 ? 1 : k >= (double)a->k_max ? a->k_max : (int)k;
}

void tp_spec_adapt_update(struct tp_spec_adapt *a, int n_drafted, int n_accepted)
{
    if (n_drafted <= 0) return;
    const float tried = (float)n_accepted + (n_accepted < n_drafted ? 1.0f : 0.0f);
    a->num = a->num * TP_SPEC_ADAPT_DECAY + (float)n_accepted;
    a->den = a->den * TP_SPEC_ADAPT_DECAY + tried;
}

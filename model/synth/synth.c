/*
 * model/synth/synth.c - write a random-weight model of a real shape as GGUF v3
 * (`tpserve synth`).  Keys and tensor names follow llama.cpp exactly
 * (general.*, <arch>.* hyper-parameters, tokenizer.ggml.*, token_embd /
 * output_norm / output / blk.N.*), dims in ggml order (ne[0] = input dim).
 *
 * Types: norm weights, biases, q/k norms and rope_freqs are F32; the
 * attention / FFN matrices, the output head and the token embeddings are of
 * the chosen type (llama.cpp's own Q4_0/Q8_0 files also quantize
 * token_embd; it keeps output.weight at Q6_K), or mixed per tensor and
 * layer exactly as llama-quantize mixes Q4_K_M / Q5_K_M (enum tp_synth_mix).
 * Values: uniform with standard deviation 0.02 (matrices, embeddings,
 * biases) and 1 +- 0.05 for norm weights, drawn from a generator seeded by
 * (seed, tensor name, row): the same file whatever the thread count.
 * Llama 3 rope scaling is written as llama.cpp does it: a rope_freqs.weight
 * tensor of per-frequency divisors (no rope.scaling.* keys).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "model/gguf_write.h"
#include "model/kernels.h"
#include "synth_impl.h"

#define SYNTH_CHUNK_ELEMS (1 << 20) /* f32 values generated per chunk (4 MiB) */

struct tp_synth_config tp_synth_default_config(void)
{
    struct tp_synth_config c;
    memset(&c, 0, sizeof(c));
    c.type = TP_WTYPE_Q8_0;
    c.seed = 1;
    c.n_threads = 1;
    return c;
}

/* ------------------------------------------------------------------ rng */

static uint64_t mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* One chunk of rows, filled in parallel (rows split over threads). */
struct chunk_job {
    const struct tp_synth_tensor *t;
    const struct tp_shape *shape;
    uint64_t tensor_seed;
    int64_t row0, n_rows;
    float *f32;     /* (n_rows, ne0) scratch */
    uint8_t *out;   /* (n_rows, row_bytes) converted */
    size_t row_bytes;
};

static void rope_freqs_fill(const struct tp_shape *s, float *dst, int64_t n)
{
    /* llama.cpp convert_hf_to_gguf.py LlamaModel: factor per frequency */
    const double pi = 3.14159265358979323846;
    double low_wl = s->rope_orig_ctx / s->rope_low_freq_factor;
    double high_wl = s->rope_orig_ctx / s->rope_high_freq_factor;
    for (int64_t i = 0; i < n; i++) {
        double freq = 1.0 / pow(s->rope_theta, (double)(2 * i) / (double)s->head_dim);
        double wl = 2.0 * pi / freq;
        double f;
        if (wl < high_wl) f = 1.0;
        else if (wl > low_wl) f = s->rope_factor;
        else {
            double smooth = (s->rope_orig_ctx / wl - s->rope_low_freq_factor) /
                            (s->rope_high_freq_factor - s->rope_low_freq_factor);
            f = 1.0 / ((1.0 - smooth) / s->rope_factor + smooth);
        }
        dst[i] = (float)f;
    }
}

uint64_t tp_synth_tensor_seed(uint64_t seed, const char *name) { return mix64(seed) ^ hash_str(name); }

void tp_synth_fill_row(const struct tp_shape *shape, const struct tp_synth_tensor *t, uint64_t tensor_seed, int64_t row,
                       float *x)
{
    const int64_t ne0 = t->ne[0];
    /* uniform on [-a, a] has standard deviation a / sqrt(3) */
    const float a_w = 0.02f * 1.7320508f, a_n = 0.05f;
    if (t->fill == TP_SYNTH_FILL_ROPE_FREQS) {
        rope_freqs_fill(shape, x, ne0);
        return;
    }
    uint64_t st = mix64(tensor_seed ^ (uint64_t)row * 0xD1B54A32D192ED03ull);
    for (int64_t i = 0; i < ne0; i++) {
        st += 0x9E3779B97F4A7C15ull;
        uint64_t z = st;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; /* [-1, 1) */
        x[i] = t->fill == TP_SYNTH_FILL_NORM ? 1.0f + a_n * u : a_w * u;
    }
}

static void chunk_worker(void *ctx, int ith, int nth)
{
    struct chunk_job *j = ctx;
    const struct tp_synth_tensor *t = j->t;
    const int64_t ne0 = t->ne[0];
    int64_t b, e;
    tp_split_range(j->n_rows, ith, nth, &b, &e);
    for (int64_t r = b; r < e; r++) {
        float *x = j->f32 + r * ne0;
        tp_synth_fill_row(j->shape, t, j->tensor_seed, j->row0 + r, x);
        uint8_t *o = j->out + r * (int64_t)j->row_bytes;
        switch (t->type) {
        case TP_WTYPE_F32: memcpy(o, x, (size_t)ne0 * 4); break;
        case TP_WTYPE_F16:
            for (int64_t i = 0; i < ne0; i++) {
                uint16_t h = tp_f32_to_fp16(x[i]);
                memcpy(o + 2 * i, &h, 2);
            }
            break;
        case TP_WTYPE_BF16:
            for (int64_t i = 0; i < ne0; i++) {
                uint16_t h = tp_f32_to_bf16(x[i]);
                memcpy(o + 2 * i, &h, 2);
            }
            break;
        default: (void)tp_kern_quantize(t->type, x, o, ne0); break;
        }
    }
}

/* ------------------------------------------------------------------ plan */

static int add_plan(struct tp_synth_tensor *p, int n, const char *name, enum tp_wtype type, int64_t ne0, int64_t ne1,
                    enum tp_synth_fill fill)
{
    struct tp_synth_tensor *t = &p[n];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->type = type;
    t->n_dims = ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->ne[2] = 1;
    t->fill = fill;
    return n + 1;
}

/* A stack of ne2 matrices (ne1 rows of ne0), as llama.cpp stores experts: ne = [ne0, ne1, ne2]. */
static int add_plan3(struct tp_synth_tensor *p, int n, const char *name, enum tp_wtype type, int64_t ne0, int64_t ne1,
                     int64_t ne2)
{
    n = add_plan(p, n, name, type, ne0, ne1, TP_SYNTH_FILL_WEIGHT);
    p[n - 1].n_dims = 3;
    p[n - 1].ne[2] = ne2;
    return n;
}

/* ------------------------------------------------------------------ type mixes */

const char *tp_synth_mix_name(enum tp_synth_mix mix)
{
    switch (mix) {
    case TP_SYNTH_MIX_Q4_K_M: return "q4_k_m";
    case TP_SYNTH_MIX_Q5_K_M: return "q5_k_m";
    case TP_SYNTH_MIX_MXFP4: return "mxfp4";
    default: return NULL;
    }
}

enum tp_status tp_synth_type_parse(const char *name, enum tp_wtype *type, enum tp_synth_mix *mix)
{
    if (!name || !type || !mix) return TP_ERR_INVALID_ARG;
    for (int m = TP_SYNTH_MIX_NONE + 1; m < TP_SYNTH_MIX_COUNT; m++) {
        if (strcasecmp(name, tp_synth_mix_name((enum tp_synth_mix)m)) == 0) {
            *mix = (enum tp_synth_mix)m;
            *type = m == TP_SYNTH_MIX_Q4_K_M ? TP_WTYPE_Q4_K : m == TP_SYNTH_MIX_Q5_K_M ? TP_WTYPE_Q5_K : TP_WTYPE_Q8_0;
            return TP_OK;
        }
    }
    enum tp_wtype t;
    if (tp_wtype_parse(name, &t) != TP_OK) return TP_ERR_INVALID_ARG;
    switch (t) {
    case TP_WTYPE_F32: case TP_WTYPE_F16: case TP_WTYPE_BF16: case TP_WTYPE_Q8_0: case TP_WTYPE_Q4_0:
    case TP_WTYPE_Q4_K: case TP_WTYPE_Q5_K: case TP_WTYPE_Q6_K: break;
    default: return TP_ERR_INVALID_ARG;
    }
    *type = t;
    *mix = TP_SYNTH_MIX_NONE;
    return TP_OK;
}

/* Tensor roles the mixes treat differently. */
enum mix_role { ROLE_OTHER, ROLE_TOKEN_EMBD, ROLE_OUTPUT, ROLE_ATTN_V, ROLE_ATTN_K, ROLE_ATTN_O, ROLE_FFN_DOWN, ROLE_EXPERT };

/* llama.cpp's use_more_bits: first and last eighth of the layers, every third in between. */
static int use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* The type of one matrix (rows of ne0 values) under the mix; llama_tensor_get_type for
 * LLAMA_FTYPE_MOSTLY_Q4_K_M / Q5_K_M on Llama / Qwen models (not Falcon), experts included:
 * the router stays F32, stacked experts follow their dense role (ffn_down_exps as ffn_down),
 * and 8-expert models get attn_v / attn_k in Q8_0 and (Q4_K_M) attn_output in Q5_K. */
static enum tp_wtype mix_type(const struct tp_shape *s, int n_layer, enum tp_synth_mix mix, enum tp_wtype base,
                              enum mix_role role, int layer, int64_t ne0)
{
    if (mix == TP_SYNTH_MIX_NONE) return base;
    if (mix == TP_SYNTH_MIX_MXFP4) /* the rest Q8_0 (ggml-org's GGUF) or a float base (OpenAI's bf16) */
        return role == ROLE_EXPERT ? TP_WTYPE_MXFP4
               : base == TP_WTYPE_F32 || base == TP_WTYPE_F16 || base == TP_WTYPE_BF16 ? base
                                                                                        : TP_WTYPE_Q8_0;
    enum tp_wtype t = base;
    if (role == ROLE_OUTPUT || (role == ROLE_TOKEN_EMBD && s->tied)) {
        /* the head (or the embedding that doubles as the head) */
        t = ne0 % tp_wtype_block_elems(base) ? TP_WTYPE_Q8_0 : TP_WTYPE_Q6_K;
    } else if (role == ROLE_ATTN_V) {
        if (use_more_bits(layer, n_layer)) t = TP_WTYPE_Q6_K;
        /* LLM_TYPE_70B: 8 query heads per KV head make attn_v small, so Q4_K -> Q5_K */
        else if (s->arch == TP_ARCH_LLAMA && n_layer == 80 && s->n_head != s->n_head_kv && t == TP_WTYPE_Q4_K)
            t = TP_WTYPE_Q5_K;
        /* 8 experts (Mixtral): attn_v costs little next to the experts */
        if (s->n_expert == 8) t = TP_WTYPE_Q8_0;
    } else if (role == ROLE_ATTN_K) {
        if (s->n_expert == 8) t = TP_WTYPE_Q8_0;
    } else if (role == ROLE_ATTN_O) {
        if (s->n_expert == 8 && mix == TP_SYNTH_MIX_Q4_K_M) t = TP_WTYPE_Q5_K;
    } else if (role == ROLE_FFN_DOWN) {
        /* ffn_down, ffn_down_exps and ffn_down_shexp alike, by their layer */
        if (use_more_bits(layer, n_layer)) t = TP_WTYPE_Q6_K;
    }
    if (ne0 % tp_wtype_block_elems(t)) { /* llama.cpp's fallback for rows that are not whole super-blocks */
        t = t == TP_WTYPE_Q4_K ? TP_WTYPE_Q5_0 : t == TP_WTYPE_Q5_K ? TP_WTYPE_Q5_1 : TP_WTYPE_Q8_0;
        if (ne0 % tp_wtype_block_elems(t)) t = TP_WTYPE_F16;
    }
    return t;
}

int tp_synth_plan(const struct tp_shape *s, int n_layer, enum tp_wtype wt, enum tp_synth_mix mix,
                  struct tp_synth_tensor *p)
{
    int n = 0;
    const int64_t e = s->n_embd, q = (int64_t)s->n_head * s->head_dim, kv = (int64_t)s->n_head_kv * s->head_dim;
    char nm[64];
#define MIX(role, layer, ne0) mix_type(s, n_layer, mix, wt, role, layer, ne0)
    n = add_plan(p, n, "token_embd.weight", MIX(ROLE_TOKEN_EMBD, 0, e), e, s->n_vocab, TP_SYNTH_FILL_WEIGHT);
    n = add_plan(p, n, "output_norm.weight", TP_WTYPE_F32, e, 0, TP_SYNTH_FILL_NORM);
    if (!s->tied) n = add_plan(p, n, "output.weight", MIX(ROLE_OUTPUT, 0, e), e, s->n_vocab, TP_SYNTH_FILL_WEIGHT);
    if (s->rope_scaling == TP_ROPE_SCALING_LLAMA3)
        n = add_plan(p, n, "rope_freqs.weight", TP_WTYPE_F32, s->head_dim / 2, 0, TP_SYNTH_FILL_ROPE_FREQS);
    for (int l = 0; l < n_layer; l++) {
#define T(suffix, type, ne0, ne1, fill)                         \
    do {                                                        \
        snprintf(nm, sizeof(nm), "blk.%d.%s", l, suffix);       \
        n = add_plan(p, n, nm, type, ne0, ne1, fill);           \
    } while (0)
        T("attn_norm.weight", TP_WTYPE_F32, e, 0, TP_SYNTH_FILL_NORM);
        T("attn_q.weight", MIX(ROLE_OTHER, l, e), e, q, TP_SYNTH_FILL_WEIGHT);
        T("attn_k.weight", MIX(ROLE_ATTN_K, l, e), e, kv, TP_SYNTH_FILL_WEIGHT);
        T("attn_v.weight", MIX(ROLE_ATTN_V, l, e), e, kv, TP_SYNTH_FILL_WEIGHT);
        if (s->qkv_bias) {
            T("attn_q.bias", TP_WTYPE_F32, q, 0, TP_SYNTH_FILL_WEIGHT);
            T("attn_k.bias", TP_WTYPE_F32, kv, 0, TP_SYNTH_FILL_WEIGHT);
            T("attn_v.bias", TP_WTYPE_F32, kv, 0, TP_SYNTH_FILL_WEIGHT);
        }
        if (s->qk_norm) {
            T("attn_q_norm.weight", TP_WTYPE_F32, s->head_dim, 0, TP_SYNTH_FILL_NORM);
            T("attn_k_norm.weight", TP_WTYPE_F32, s->head_dim, 0, TP_SYNTH_FILL_NORM);
        }
        T("attn_output.weight", MIX(ROLE_ATTN_O, l, q), q, e, TP_SYNTH_FILL_WEIGHT);
        if (s->arch == TP_ARCH_GPTOSS) { /* attn_output bias, a sink logit per head; the FFN norm's name */
            T("attn_output.bias", TP_WTYPE_F32, e, 0, TP_SYNTH_FILL_WEIGHT);
            T("attn_sinks.weight", TP_WTYPE_F32, s->n_head, 0, TP_SYNTH_FILL_WEIGHT);
            T("post_attention_norm.weight", TP_WTYPE_F32, e, 0, TP_SYNTH_FILL_NORM);
        } else {
            T("ffn_norm.weight", TP_WTYPE_F32, e, 0, TP_SYNTH_FILL_NORM);
        }
        if (s->n_expert > 0) {
            /* llama-quantize keeps the router in F32; the experts follow the dense rules */
            const int64_t fx = tp_shape_ff_width(s), X = s->n_expert;
            const enum mix_role gu = mix == TP_SYNTH_MIX_MXFP4 ? ROLE_EXPERT : ROLE_OTHER;
            const enum mix_role dn = mix == TP_SYNTH_MIX_MXFP4 ? ROLE_EXPERT : ROLE_FFN_DOWN;
            T("ffn_gate_inp.weight", TP_WTYPE_F32, e, X, TP_SYNTH_FILL_WEIGHT);
            if (s->arch == TP_ARCH_GPTOSS) T("ffn_gate_inp.bias", TP_WTYPE_F32, X, 0, TP_SYNTH_FILL_WEIGHT);
            snprintf(nm, sizeof(nm), "blk.%d.ffn_gate_exps.weight", l);
            n = add_plan3(p, n, nm, MIX(gu, l, e), e, fx, X);
            snprintf(nm, sizeof(nm), "blk.%d.ffn_up_exps.weight", l);
            n = add_plan3(p, n, nm, MIX(gu, l, e), e, fx, X);
            snprintf(nm, sizeof(nm), "blk.%d.ffn_down_exps.weight", l);
            n = add_plan3(p, n, nm, MIX(dn, l, fx), fx, e, X);
            if (s->arch == TP_ARCH_GPTOSS) { /* per-expert biases, ne = [width, n_expert] */
                T("ffn_gate_exps.bias", TP_WTYPE_F32, fx, X, TP_SYNTH_FILL_WEIGHT);
                T("ffn_up_exps.bias", TP_WTYPE_F32, fx, X, TP_SYNTH_FILL_WEIGHT);
                T("ffn_down_exps.bias", TP_WTYPE_F32, e, X, TP_SYNTH_FILL_WEIGHT);
            }
            if (s->n_ff_shexp > 0) { /* Qwen2-MoE: the shared expert and its sigmoid gate */
                const int64_t S = s->n_ff_shexp;
                T("ffn_gate_inp_shexp.weight", TP_WTYPE_F32, e, 0, TP_SYNTH_FILL_WEIGHT);
                T("ffn_gate_shexp.weight", MIX(ROLE_OTHER, l, e), e, S, TP_SYNTH_FILL_WEIGHT);
                T("ffn_up_shexp.weight", MIX(ROLE_OTHER, l, e), e, S, TP_SYNTH_FILL_WEIGHT);
                T("ffn_down_shexp.weight", MIX(ROLE_FFN_DOWN, l, S), S, e, TP_SYNTH_FILL_WEIGHT);
            }
        } else {
            T("ffn_gate.weight", MIX(ROLE_OTHER, l, e), e, s->n_ff, TP_SYNTH_FILL_WEIGHT);
            T("ffn_up.weight", MIX(ROLE_OTHER, l, e), e, s->n_ff, TP_SYNTH_FILL_WEIGHT);
            T("ffn_down.weight", MIX(ROLE_FFN_DOWN, l, s->n_ff), s->n_ff, e, TP_SYNTH_FILL_WEIGHT);
        }
#undef T
    }
#undef MIX
    return n;
}

/* llama_ftype for general.file_type (a single K type: as `llama-quantize --pure` labels it) */
static uint32_t file_type_of(enum tp_wtype t, enum tp_synth_mix mix)
{
    if (mix == TP_SYNTH_MIX_Q4_K_M) return 15;
    if (mix == TP_SYNTH_MIX_Q5_K_M) return 17;
    if (mix == TP_SYNTH_MIX_MXFP4) return 38; /* LLAMA_FTYPE_MOSTLY_MXFP4_MOE */
    switch (t) {
    case TP_WTYPE_F32: return 0;
    case TP_WTYPE_F16: return 1;
    case TP_WTYPE_Q4_0: return 2;
    case TP_WTYPE_Q8_0: return 7;
    case TP_WTYPE_BF16: return 32;
    case TP_WTYPE_Q4_K: return 15; /* LLAMA_FTYPE_MOSTLY_Q4_K_M */
    case TP_WTYPE_Q5_K: return 17; /* LLAMA_FTYPE_MOSTLY_Q5_K_M */
    case TP_WTYPE_Q6_K: return 18; /* LLAMA_FTYPE_MOSTLY_Q6_K */
    default: return 0;
    }
}

static void write_kv(tp_gguf_writer_t *w, const struct tp_shape *s, int n_layer, enum tp_wtype wt,
                     enum tp_synth_mix mix, const struct tp_synth_vocab *v)
{
    const char *arch = tp_arch_name(s->arch);
    char key[128], name[160];
#define K(suffix) (snprintf(key, sizeof(key), "%s.%s", arch, suffix), key)
    tp_gguf_kv_str(w, "general.architecture", arch);
    snprintf(name, sizeof(name), "synthetic %s%s", s->name, n_layer != s->n_layer ? " (fewer layers)" : "");
    tp_gguf_kv_str(w, "general.name", name);
    tp_gguf_kv_str(w, "general.description", "random weights written by tpserve synth (for speed and scale tests)");
    tp_gguf_kv_u32(w, "general.alignment", 32);
    tp_gguf_kv_u32(w, "general.file_type", file_type_of(wt, mix));
    if (wt != TP_WTYPE_F32 && wt != TP_WTYPE_F16 && wt != TP_WTYPE_BF16)
        tp_gguf_kv_u32(w, "general.quantization_version", 2);
    tp_gguf_kv_u32(w, K("vocab_size"), (uint32_t)v->n_tokens);
    tp_gguf_kv_u32(w, K("context_length"), (uint32_t)s->n_ctx);
    tp_gguf_kv_u32(w, K("embedding_length"), (uint32_t)s->n_embd);
    tp_gguf_kv_u32(w, K("block_count"), (uint32_t)n_layer);
    tp_gguf_kv_u32(w, K("feed_forward_length"), (uint32_t)s->n_ff);
    if (s->pooling_type > 0) tp_gguf_kv_u32(w, K("pooling_type"), (uint32_t)s->pooling_type);
    if (s->sliding_window > 0) tp_gguf_kv_u32(w, K("attention.sliding_window"), (uint32_t)s->sliding_window);
    if (s->n_expert > 0) {
        tp_gguf_kv_u32(w, K("expert_count"), (uint32_t)s->n_expert);
        tp_gguf_kv_u32(w, K("expert_used_count"), (uint32_t)s->n_expert_used);
        if (s->n_ff_exp > 0) tp_gguf_kv_u32(w, K("expert_feed_forward_length"), (uint32_t)s->n_ff_exp);
        if (s->n_ff_shexp > 0)
            tp_gguf_kv_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)s->n_ff_shexp);
    }
    tp_gguf_kv_u32(w, K("attention.head_count"), (uint32_t)s->n_head);
    tp_gguf_kv_u32(w, K("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    if (s->head_dim * s->n_head != s->n_embd) {
        tp_gguf_kv_u32(w, K("attention.key_length"), (uint32_t)s->head_dim);
        tp_gguf_kv_u32(w, K("attention.value_length"), (uint32_t)s->head_dim);
    }
    tp_gguf_kv_f32(w, K("attention.layer_norm_rms_epsilon"), s->norm_eps);
    tp_gguf_kv_f32(w, K("rope.freq_base"), s->rope_theta);
    tp_gguf_kv_u32(w, K("rope.dimension_count"), (uint32_t)s->head_dim);
    if (s->rope_scaling == TP_ROPE_SCALING_LINEAR) {
        tp_gguf_kv_str(w, K("rope.scaling.type"), "linear");
        tp_gguf_kv_f32(w, K("rope.scaling.factor"), s->rope_factor);
    }
    if (s->rope_scaling == TP_ROPE_SCALING_YARN) { /* as convert_hf_to_gguf.py writes gpt-oss */
        tp_gguf_kv_str(w, K("rope.scaling.type"), "yarn");
        tp_gguf_kv_f32(w, K("rope.scaling.factor"), s->rope_factor);
        tp_gguf_kv_u32(w, K("rope.scaling.original_context_length"), (uint32_t)s->rope_orig_ctx);
    }

#undef K
    tp_gguf_kv_str(w, "tokenizer.ggml.model", v->model);
    if (v->pre) tp_gguf_kv_str(w, "tokenizer.ggml.pre", v->pre);
    tp_gguf_kv_array_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, NULL, (uint64_t)v->n_tokens);
    if (v->scores) tp_gguf_kv_array(w, "tokenizer.ggml.scores", TP_GGUF_FLOAT32, v->scores, (uint64_t)v->n_tokens);
    tp_gguf_kv_array(w, "tokenizer.ggml.token_type", TP_GGUF_INT32, v->types, (uint64_t)v->n_tokens);
    if (v->n_merges)
        tp_gguf_kv_array_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, NULL, (uint64_t)v->n_merges);
    if (v->bos >= 0) tp_gguf_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (v->eos >= 0) tp_gguf_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    if (v->unk >= 0) tp_gguf_kv_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk);
    if (v->pad >= 0) tp_gguf_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad);
    tp_gguf_kv_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    tp_gguf_kv_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos);
    if (v->chat_template) tp_gguf_kv_str(w, "tokenizer.chat_template", v->chat_template);
    /* errors are sticky in the writer: the caller's next write reports any of them */
}

/* Every planned tensor's type is computable and its rows whole blocks; *max_ne0 the widest row. */
static enum tp_status check_plan(const struct tp_synth_tensor *plan, int n_t, const struct tp_shape *shape,
                                 enum tp_synth_mix mix, int64_t *max_ne0, struct tp_error *err)
{
    *max_ne0 = 0;
    for (int i = 0; i < n_t; i++) {
        if (!tp_wtype_supported(plan[i].type)) /* a mix's fallback for rows that are not whole super-blocks */
            return tp_error_set(err, TP_ERR_UNSUPPORTED,
                                "synth: %s has rows of %lld values, not a multiple of 256, so llama.cpp's %s stores it "
                                "as %s, which tpserve cannot compute; use --type q8_0 or q4_0 for shape %s",
                                plan[i].name, (long long)plan[i].ne[0], tp_synth_mix_name(mix),
                                tp_wtype_name(plan[i].type), shape->name);
        int64_t be = tp_wtype_block_elems(plan[i].type);
        if (plan[i].ne[0] % be)
            return tp_error_set(err, TP_ERR_INVALID_ARG,
                                "synth: %s has rows of %lld elements, not a multiple of %s's block of %lld (pick "
                                "f16/bf16/f32)",
                                plan[i].name, (long long)plan[i].ne[0], tp_wtype_name(plan[i].type), (long long)be);
        if (plan[i].ne[0] > *max_ne0) *max_ne0 = plan[i].ne[0];
    }
    return TP_OK;
}

/* The tensors' data, in plan order, chunk by chunk (f32, conv: buffers of max(SYNTH_CHUNK_ELEMS, the widest
 * row) values), the rows of a chunk generated and converted by the pool's threads. */
static enum tp_status write_tensors(const struct tp_synth_config *cfg, const struct tp_shape *shape,
                                    const struct tp_synth_tensor *plan, int n_t, tp_gguf_writer_t *w, tp_pool_t *pool,
                                    float *f32, uint8_t *conv, struct tp_error *err)
{
    uint64_t total = 0, done = 0;
    for (int i = 0; i < n_t; i++) total += tp_gguf_tensor_bytes(plan[i].type, plan[i].n_dims, plan[i].ne);
    for (int i = 0; i < n_t; i++) {
        const struct tp_synth_tensor *t = &plan[i];
        const int64_t rows = t->ne[1] * t->ne[2];
        const int64_t chunk_rows = TP_MAX((int64_t)1, SYNTH_CHUNK_ELEMS / t->ne[0]);
        struct chunk_job job = {.t = t,
                                .shape = shape,
                                .tensor_seed = tp_synth_tensor_seed(cfg->seed, t->name),
                                .f32 = f32,
                                .out = conv,
                                .row_bytes = (size_t)tp_gguf_tensor_bytes(t->type, 1, t->ne)};
        for (int64_t r = 0; r < rows; r += chunk_rows) {
            job.row0 = r;
            job.n_rows = TP_MIN(chunk_rows, rows - r);
            tp_pool_run(pool, chunk_worker, &job);
            size_t nb = (size_t)job.n_rows * job.row_bytes;
            if (tp_gguf_write_data(w, conv, nb) != TP_OK)
                return tp_error_set(err, TP_ERR_IO, "synth: %s", tp_gguf_writer_error(w));
            done += nb;
            if (cfg->progress) cfg->progress(cfg->progress_ctx, done, total);
        }
    }
    return TP_OK;
}

enum tp_status tp_synth_write(const struct tp_synth_config *cfg, struct tp_error *err)
{
    if (!cfg || !cfg->shape || !cfg->out_path) return tp_error_set(err, TP_ERR_INVALID_ARG, "synth: missing shape or output path");
    const struct tp_shape *s = cfg->shape;
    const enum tp_synth_mix mix = cfg->mix;
    const enum tp_wtype wt = mix == TP_SYNTH_MIX_Q4_K_M   ? TP_WTYPE_Q4_K
                             : mix == TP_SYNTH_MIX_Q5_K_M ? TP_WTYPE_Q5_K
                             : mix == TP_SYNTH_MIX_MXFP4 && cfg->type != TP_WTYPE_F32 && cfg->type != TP_WTYPE_F16 &&
                                       cfg->type != TP_WTYPE_BF16
                                 ? TP_WTYPE_Q8_0
                                 : cfg->type;
    enum tp_status rc = TP_OK;
    struct tp_synth_vocab vocab;
    memset(&vocab, 0, sizeof(vocab));
    struct tp_synth_tensor *plan = NULL;
    tp_gguf_writer_t *w = NULL;
    tp_pool_t *pool = NULL;
    float *f32 = NULL;
    uint8_t *conv = NULL;

    if ((int)mix < 0 || mix >= TP_SYNTH_MIX_COUNT)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "synth: unknown type mix %d", (int)mix);
    if (mix == TP_SYNTH_MIX_MXFP4 && s->n_expert <= 0)
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "synth: --type mxfp4 quantizes the experts (gpt-oss); shape %s has none (pick q8_0, q4_0, ...)",
                            s->name);
    if (wt != TP_WTYPE_F32 && wt != TP_WTYPE_F16 && wt != TP_WTYPE_BF16 && wt != TP_WTYPE_Q8_0 && wt != TP_WTYPE_Q4_0 &&
        wt != TP_WTYPE_Q4_K && wt != TP_WTYPE_Q5_K && wt != TP_WTYPE_Q6_K)
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "synth: type %s not supported (f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m, "
                            "mxfp4)",
                            tp_wtype_name(wt));
    int n_layer = cfg->n_layer > 0 ? cfg->n_layer : s->n_layer;
    if (cfg->n_layer > s->n_layer)
        tp_log(TP_LOG_WARN, "synth", "%s: %d layers requested, the real model has %d", s->name, cfg->n_layer, s->n_layer);

    if (cfg->tokenizer_json) TP_CHECK_GOTO(tp_synth_vocab_json(cfg->tokenizer_json, s->n_vocab, &vocab, err), rc, out);
    else TP_CHECK_GOTO(tp_synth_vocab_spm(s->n_vocab, &vocab, err), rc, out);
    struct tp_shape shape = *s;
    if (vocab.n_tokens != shape.n_vocab) {
        tp_log(TP_LOG_INFO, "synth", "vocabulary has %d tokens (shape %s says %d): using %d", vocab.n_tokens, s->name,
               s->n_vocab, vocab.n_tokens);
        shape.n_vocab = vocab.n_tokens;
    }

    plan = calloc((size_t)n_layer * 24 + 8, sizeof(*plan));
    if (!plan) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory");
        goto out;
    }
    int n_t = tp_synth_plan(&shape, n_layer, wt, mix, plan);
    int64_t max_ne0 = 0;
    TP_CHECK_GOTO(check_plan(plan, n_t, &shape, mix, &max_ne0, err), rc, out);

    TP_CHECK_GOTO(tp_gguf_writer_open(cfg->out_path, 32, &w, err), rc, out);
    write_kv(w, &shape, n_layer, wt, mix, &vocab);
    for (int i = 0; i < n_t; i++) (void)tp_gguf_add_tensor(w, plan[i].name, plan[i].type, plan[i].n_dims, plan[i].ne);
    /* (ne[] holds three dims; tp_gguf_add_tensor reads n_dims of them) */
    if (tp_gguf_write_data(w, NULL, 0) != TP_OK) { /* header now, surfaces any metadata error */
        rc = tp_error_set(err, TP_ERR_IO, "synth: %s", tp_gguf_writer_error(w));
        goto out;
    }
    tp_synth_vocab_free(&vocab);

    /* a chunk is floor(CHUNK / ne0) rows (at least one): at most max(CHUNK, ne0) values */
    const size_t buf_elems = (size_t)TP_MAX((int64_t)SYNTH_CHUNK_ELEMS, max_ne0);
    f32 = malloc(buf_elems * sizeof(float));
    conv = malloc(buf_elems * sizeof(float)); /* no type takes more than 4 bytes per value */
    if (!f32 || !conv) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory for a %zu-value chunk", buf_elems);
        goto out;
    }
    struct tp_pool_config pc = tp_pool_default_config();
    pc.n_threads = cfg->n_threads > 0 ? cfg->n_threads : 1;
    if (tp_pool_init(&pc, &pool) != TP_OK) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "synth: cannot start %d threads", pc.n_threads);
        goto out;
    }
    TP_CHECK_GOTO(write_tensors(cfg, &shape, plan, n_t, w, pool, f32, conv, err), rc, out);
    if (tp_gguf_writer_finish(w) != TP_OK) {
        rc = tp_error_set(err, TP_ERR_IO, "synth: %s", tp_gguf_writer_error(w));
        goto out;
    }
out:
    tp_pool_free(pool);
    free(f32);
    free(conv);
    tp_gguf_writer_free(w); /* removes the partial file on failure */
    free(plan);
    tp_synth_vocab_free(&vocab);
    return rc;
}

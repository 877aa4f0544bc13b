/*
 * model/format/tsrc.c - the loader's tensor source (model/tensor_source.h): a GGUF file's
 * tensors by name, or a Hugging Face directory's safetensors tensors under
 * their GGUF canonical names, with the safetensors row-major shape turned
 * into ggml dims.
 */
#include <stdio.h>
#include <string.h>

#include "format/mlx_impl.h"
#include "model/tensor_source.h"

/* GGUF canonical name -> Hugging Face name (Llama / Mistral / Qwen2 / Qwen3 layout). */
static const struct {
    const char *gguf, *hf;
} k_global[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
static const struct {
    const char *gguf, *hf;
} k_layer[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"}, /* gpt-oss's name for it */
    {"attn_sinks.weight", "self_attn.sinks"},                          /* gpt-oss */
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

/* Mixture-of-experts names (see tensor_source.h): variant 0 Qwen-MoE, 1 Mixtral, 2 gpt-oss (its
 * router; the experts are fused MXFP4 tensors the loader reads itself). */
static int hf_moe_name(const char *gguf_name, int layer, const char *suffix, int variant, char *out, size_t cap)
{
    static const char *const part[3] = {"gate", "up", "down"};
    static const char *const mixtral[3] = {"w1", "w3", "w2"};
    int n = -1, e = -1, used = 0;
    if (variant == 2) {
        if (strcmp(suffix, "ffn_gate_inp.weight") == 0) n = snprintf(out, cap, "model.layers.%d.mlp.router.weight", layer);
        if (strcmp(suffix, "ffn_gate_inp.bias") == 0) n = snprintf(out, cap, "model.layers.%d.mlp.router.bias", layer);
        return n > 0 && (size_t)n < cap;
    }
    if (strcmp(suffix, "ffn_gate_inp.weight") == 0)
        n = snprintf(out, cap, "model.layers.%d.%s.gate.weight", layer, variant ? "block_sparse_moe" : "mlp");
    for (int i = 0; i < 3 && n < 0; i++) {
        char pat[48];
        snprintf(pat, sizeof pat, "ffn_%s_exps.%%d.weight%%n", part[i]);
        used = 0;
        if (sscanf(suffix, pat, &e, &used) == 1 && used > 0 && suffix[used] == '\0' && e >= 0)
            n = variant ? snprintf(out, cap, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", layer, e, mixtral[i])
                        : snprintf(out, cap, "model.layers.%d.mlp.experts.%d.%s_proj.weight", layer, e, part[i]);
        char st[48]; /* mlx-lm's stacked experts: one [n_expert, rows, cols] tensor, as GGUF */
        snprintf(st, sizeof st, "ffn_%s_exps.weight", part[i]);
        if (n < 0 && strcmp(suffix, st) == 0)
            n = snprintf(out, cap, "model.layers.%d.%s.switch_mlp.%s_proj.weight", layer,
                         variant ? "block_sparse_moe" : "mlp", part[i]);
        char sh[48];
        snprintf(sh, sizeof sh, "ffn_%s_shexp.weight", part[i]);
        if (n < 0 && variant == 0 && strcmp(suffix, sh) == 0)
            n = snprintf(out, cap, "model.layers.%d.mlp.shared_expert.%s_proj.weight", layer, part[i]);
    }
    if (n < 0 && variant == 0 && strcmp(suffix, "ffn_gate_inp_shexp.weight") == 0)
        n = snprintf(out, cap, "model.layers.%d.mlp.shared_expert_gate.weight", layer);
    (void)gguf_name;
    return n > 0 && (size_t)n < cap;
}

int tp_tsrc_hf_name_variant(const char *gguf_name, int variant, char *out, size_t cap)
{
    int layer = -1, used = 0;
    if (variant == 0 && tp_tsrc_hf_name(gguf_name, out, cap)) return 1;
    if (sscanf(gguf_name, "blk.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0) return 0;
    return hf_moe_name(gguf_name, layer, gguf_name + used, variant, out, cap);
}

int tp_tsrc_hf_name(const char *gguf_name, char *out, size_t cap)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(k_global); i++)
        if (strcmp(gguf_name, k_global[i].gguf) == 0) {
            int n = snprintf(out, cap, "%s", k_global[i].hf);
            return n > 0 && (size_t)n < cap;
        }
    int layer = -1, used = 0;
    if (sscanf(gguf_name, "blk.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0) return 0;
    const char *suffix = gguf_name + used;
    for (size_t i = 0; i < TP_ARRAY_LEN(k_layer); i++)
        if (strcmp(suffix, k_layer[i].gguf) == 0) {
            int n = snprintf(out, cap, "model.layers.%d.%s", layer, k_layer[i].hf);
            return n > 0 && (size_t)n < cap;
        }
    return hf_moe_name(gguf_name, layer, suffix, 0, out, cap);
}

static enum tp_wtype wtype_of(enum tp_st_dtype d)
{
    switch (d) {
    case TP_ST_F32: return TP_WTYPE_F32;
    case TP_ST_F16: return TP_WTYPE_F16;
    case TP_ST_BF16: return TP_WTYPE_BF16;
    case TP_ST_F64: return TP_WTYPE_F64;
    case TP_ST_I8: return TP_WTYPE_I8;
    case TP_ST_I16: return TP_WTYPE_I16;
    case TP_ST_I32: return TP_WTYPE_I32;
    case TP_ST_I64: return TP_WTYPE_I64;
    default: return TP_WTYPE_COUNT;
    }
}

int tp_tsrc_find(const struct tp_tsrc *s, const char *name, struct tp_tsrc_tensor *out)
{
    memset(out, 0, sizeof(*out));
    if (s->kind == TP_TSRC_GGUF) {
        const struct tp_gguf_tensor *t = s->gguf ? tp_gguf_find_tensor(s->gguf, name) : NULL;
        if (!t) return 0;
        out->name = t->name;
        out->file = tp_gguf_path(s->gguf);
        out->type = t->type;
        out->type_name = tp_wtype_name(t->type);
        out->n_dims = t->n_dims;
        for (int i = 0; i < 4; i++) out->ne[i] = t->ne[i];
        out->n_elems = t->n_elems;
        out->n_bytes = t->n_bytes;
        out->fd = tp_gguf_fd(s->gguf);
        out->file_offset = t->file_offset;
        out->data = t->data;
        if (t->type == TP_WTYPE_I32) tp_mlx_tsrc_describe_gguf(s, t, out); /* a shard's MLX words (model/mlx_quant.h) */
        return 1;
    }
    char hf[160];
    const struct tp_st_tensor *t = NULL;
    for (int v = 0; v < 3 && !t && s->st; v++)
        if (tp_tsrc_hf_name_variant(name, v, hf, sizeof(hf))) t = tp_st_find(s->st, hf);
    if (!t) return 0;
    out->name = t->name;
    out->file = tp_st_file_path(s->st, t->file);
    out->type = wtype_of(t->dtype);
    out->type_name = tp_st_dtype_name(t->dtype);
    out->n_dims = t->n_dims > 0 ? t->n_dims : 1;
    for (int i = 0; i < 4; i++) out->ne[i] = 1;
    for (int i = 0; i < t->n_dims; i++) {
        int64_t d = t->shape[t->n_dims - 1 - i];
        if (i < 4) out->ne[i] = d;
        else out->ne[3] *= d; /* more than 4 dims: never a valid weight; keeps n_elems consistent */
    }
    out->n_elems = t->n_elems;
    out->n_bytes = t->n_bytes;
    out->fd = tp_st_file_fd(s->st, t->file);
    out->file_offset = t->file_offset;
    out->data = t->data;
    out->st = t;
    out->mlx_packed = t->dtype == TP_ST_U32;
    if (t->dtype == TP_ST_U32) tp_mlx_tsrc_describe(s, t, out); /* MLX packed weights: their MLX type, unpacked ne[0] */
    return 1;
}

/*
 * parallel/probe.c - what a rank learns about its model file before it
 * loads any weight: the hyper-parameters (through the model loader in
 * vocab-only mode, so they are exactly what the forward pass will use), the
 * weight type of every tensor role (from layer 0 of the GGUF tensor table,
 * or of a Hugging Face directory's safetensors under the same canonical
 * names) and, for a tpserve shard file, the rank / world size / plan it was
 * cut for.
 */
#include <stdio.h>
#include <string.h>

#include "model/gguf.h"
#include "model/mlx_quant.h"
#include "model/tensor_source.h"
#include "parallel_impl.h"

static enum tp_status role_type(const struct tp_tsrc *src, const char *path, const char *name, int required,
                                enum tp_wtype *out, struct tp_error *err)
{
    struct tp_tsrc_tensor t;
    if (!tp_tsrc_find(src, name, &t)) {
        if (!required) return TP_OK;
        return tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%s' is missing", path, name);
    }
    *out = t.type;
    return TP_OK;
}

/* The tensor source of path: its safetensors (with the MLX bits from config.json) for a Hugging Face
 * directory, else the GGUF file (*g, with the MLX bits a shard file cut from MLX records). The caller
 * closes *st and *g. */
static enum tp_status open_source(const char *path, struct tp_tsrc *src, tp_gguf_t **g, tp_st_t **st,
                                  struct tp_error *err)
{
    enum tp_status rc;
    *src = (struct tp_tsrc){.kind = TP_TSRC_GGUF};
    if (tp_hf_is_dir(path)) {
        src->kind = TP_TSRC_HF;
        if ((rc = tp_st_open(path, st, err)) != TP_OK) return rc;
        src->st = *st;
        struct tp_mlx_quant *mq = NULL; /* MLX: config bits name the packed tensors' types */
        if ((rc = tp_mlx_read_quant(path, &mq, err)) != TP_OK) return rc;
        src->mlx_bits = mq ? mq->bits : 0;
        tp_mlx_quant_free(mq);
        return TP_OK;
    }
    if ((rc = tp_gguf_open(path, g, err)) != TP_OK) return rc;
    src->gguf = *g;
    int64_t mb = 0; /* a shard file cut from an MLX directory: its default bits name the packed words */
    if (tp_gguf_get_int(*g, TP_MLX_KEY_BITS, &mb) == TP_OK && (mb == 4 || mb == 8)) src->mlx_bits = (int)mb;
    return TP_OK;
}

/* out->types from layer 0's tensors (and out->hp.tied_embeddings when the file has no output head). */
static enum tp_status read_role_types(const struct tp_tsrc *src, const char *path, struct tp_model_probe *out,
                                      struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    struct tp_plan_types *ty = &out->types;
    TP_CHECK_GOTO(role_type(src, path, "token_embd.weight", 1, &ty->token_embd, err), rc, out);
    ty->output = ty->token_embd;
    /* no output head in the file: the head is the token embedding (tied), whatever the
     * vocab-only load could tell without looking at tensors */
    struct tp_tsrc_tensor head;
    if (!tp_tsrc_find(src, "output.weight", &head)) out->hp.tied_embeddings = 1;
    TP_CHECK_GOTO(role_type(src, path, "output.weight", 0, &ty->output, err), rc, out);
    TP_CHECK_GOTO(role_type(src, path, "blk.0.attn_q.weight", 1, &ty->attn_q, err), rc, out);
    TP_CHECK_GOTO(role_type(src, path, "blk.0.attn_k.weight", 1, &ty->attn_k, err), rc, out);
    TP_CHECK_GOTO(role_type(src, path, "blk.0.attn_v.weight", 1, &ty->attn_v, err), rc, out);
    TP_CHECK_GOTO(role_type(src, path, "blk.0.attn_output.weight", 1, &ty->attn_o, err), rc, out);
    /* mixture of experts: the FFN roles are the stacked experts' (hp.n_ff is their width) */
    /* (a Hugging Face directory keeps one tensor per expert: expert 0's type stands for all) */
    struct tp_tsrc_tensor probe_t;
    /* gpt-oss from Hugging Face: OpenAI's fused MXFP4 experts, read by the loader itself */
    if (out->hp.arch == TP_ARCH_GPTOSS && src->kind == TP_TSRC_HF) {
        ty->ffn_gate = ty->ffn_up = ty->ffn_down = TP_WTYPE_MXFP4;
    } else {
        const int moe = out->hp.n_expert > 0, per_expert = moe && !tp_tsrc_find(src, "blk.0.ffn_gate_exps.weight", &probe_t);
        TP_CHECK_GOTO(role_type(src, path, per_expert ? "blk.0.ffn_gate_exps.0.weight" : moe ? "blk.0.ffn_gate_exps.weight" : "blk.0.ffn_gate.weight", 1, &ty->ffn_gate,
                                err),
                      rc, out);
        TP_CHECK_GOTO(role_type(src, path, per_expert ? "blk.0.ffn_up_exps.0.weight" : moe ? "blk.0.ffn_up_exps.weight" : "blk.0.ffn_up.weight", 1, &ty->ffn_up, err),
                      rc, out);
        TP_CHECK_GOTO(role_type(src, path, per_expert ? "blk.0.ffn_down_exps.0.weight" : moe ? "blk.0.ffn_down_exps.weight" : "blk.0.ffn_down.weight", 1, &ty->ffn_down,
                                err),
                      rc, out);
    }
out:
    return rc;
}

/* A tpserve shard file's keys (rank, world, plan, its hash, the MoE split): out->is_shard and the
 * shard_* fields; nothing for a file without TP_SHARD_KEY_WORLD. */
static enum tp_status read_shard_keys(tp_gguf_t *g, const char *path, struct tp_model_probe *out,
                                      struct tp_error *err)
{
    int64_t v;
    if (tp_gguf_get_int(g, TP_SHARD_KEY_WORLD, &v) != TP_OK) return TP_OK;
    out->is_shard = 1;
    out->shard_world = (int)v;
    if (v < 1 || v > TP_PLAN_MAX_RANKS)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: %s = %lld is out of range", path, TP_SHARD_KEY_WORLD,
                            (long long)v);
    if (tp_gguf_get_int(g, TP_SHARD_KEY_RANK, &v) != TP_OK || v < 0 || v >= out->shard_world)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: shard file without a valid %s", path, TP_SHARD_KEY_RANK);
    out->shard_rank = (int)v;
    const char *s = NULL;
    if (tp_gguf_get_str(g, TP_SHARD_KEY_WEIGHTS, &s) == TP_OK && s)
        snprintf(out->shard_weights, sizeof out->shard_weights, "%s", s);
    int k = tp_gguf_find_key(g, TP_SHARD_KEY_PLAN);
    uint64_t n = k >= 0 ? tp_gguf_arr_len(g, k) : 0;
    if (k < 0 || n != (uint64_t)out->shard_world * 8 || tp_gguf_arr_copy_i32(g, k, out->shard_ranges, n) != TP_OK)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: shard file has no valid %s (want %d ints)", path,
                            TP_SHARD_KEY_PLAN, out->shard_world * 8);
    uint64_t h = 0;
    if (tp_gguf_get_u64(g, TP_SHARD_KEY_PLAN_HASH, &h) != TP_OK)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: shard file without %s", path, TP_SHARD_KEY_PLAN_HASH);
    out->shard_plan_hash = h;
    if (tp_gguf_get_str(g, TP_SHARD_KEY_MOE_SPLIT, &s) == TP_OK && s) {
        struct tp_error perr = {0};
        if (tp_moe_split_parse(s, &out->shard_moe_split, &perr) != TP_OK || out->shard_moe_split == TP_MOE_SPLIT_AUTO)
            return tp_error_set(err, TP_ERR_FORMAT, "%s: %s is '%s' (want tensor or expert)", path,
                                TP_SHARD_KEY_MOE_SPLIT, s);
        k = tp_gguf_find_key(g, TP_SHARD_KEY_EXPERTS);
        n = k >= 0 ? tp_gguf_arr_len(g, k) : 0;
        if (k < 0 || n != (uint64_t)out->shard_world * 4 ||
            tp_gguf_arr_copy_i32(g, k, out->shard_experts, n) != TP_OK)
            return tp_error_set(err, TP_ERR_FORMAT, "%s: shard file has no valid %s (want %d ints)", path,
                                TP_SHARD_KEY_EXPERTS, out->shard_world * 4);
    } else if (out->hp.n_expert > 0) {
        return tp_error_set(err, TP_ERR_FORMAT,
                            "%s: mixture-of-experts shard file without %s; cut it again with `tpserve shard`", path,
                            TP_SHARD_KEY_MOE_SPLIT);
    }
    return TP_OK;
}

enum tp_status tp_model_probe(const char *path, struct tp_model_probe *out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    tp_model_t *m = NULL;
    tp_gguf_t *g = NULL;
    tp_st_t *st = NULL;
    memset(out, 0, sizeof *out);
    if (!path) return tp_error_set(err, TP_ERR_INVALID_ARG, "no model path given");

    struct tp_model_config mc = tp_model_default_config();
    mc.path = path;
    mc.vocab_only = 1;
    mc.n_threads = 1;
    TP_CHECK_GOTO(tp_model_init(&mc, &m, err), rc, out);
    out->hp = *tp_model_hparams(m);
    struct tp_tsrc src;
    TP_CHECK_GOTO(open_source(path, &src, &g, &st, err), rc, out);
    TP_CHECK_GOTO(read_role_types(&src, path, out, err), rc, out);
    if (g) TP_CHECK_GOTO(read_shard_keys(g, path, out, err), rc, out);
out:
    tp_gguf_close(g);
    tp_st_close(st);
    tp_model_free(m);
    return rc;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

uint64_t tp_probe_hash(const struct tp_model_probe *pr)
{
    const struct tp_hparams *hp = &pr->hp;
    const int32_t iv[] = {(int32_t)hp->arch,   hp->n_vocab,      hp->n_embd,          hp->n_layer,
                          hp->n_head,          hp->n_head_kv,    hp->head_dim,        hp->n_ff,
                          hp->rope_dim,        hp->rope_neox,    (int32_t)hp->rope_scaling, hp->tied_embeddings,
                          hp->has_qkv_bias,    hp->has_qk_norm,  (int32_t)pr->types.attn_q, (int32_t)pr->types.attn_k,
                          (int32_t)pr->types.attn_v, (int32_t)pr->types.attn_o, (int32_t)pr->types.ffn_gate,
                          (int32_t)pr->types.ffn_up, (int32_t)pr->types.ffn_down, (int32_t)pr->types.output,
                          (int32_t)pr->types.token_embd, hp->n_expert, hp->n_expert_used,
                          hp->expert_weights_norm, hp->n_ff_shexp};
    const float fv[] = {hp->rope_theta, hp->rope_scale_factor, hp->norm_eps};
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < TP_ARRAY_LEN(iv); i++) {
        uint32_t u = (uint32_t)iv[i];
        unsigned char b[4] = {(unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                              (unsigned char)(u >> 24)};
        h = fnv(h, b, 4);
    }
    for (size_t i = 0; i < TP_ARRAY_LEN(fv); i++) {
        uint32_t u;
        memcpy(&u, &fv[i], 4);
        unsigned char b[4] = {(unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                              (unsigned char)(u >> 24)};
        h = fnv(h, b, 4);
    }
    return h;
}

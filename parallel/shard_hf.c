/*
 * parallel/shard_hf.c - `tpserve shard` of a Hugging Face (or MLX quantized)
 * directory: one tpserve GGUF shard file per rank, in the layout shard_file.c
 * writes from a GGUF model, so loading, probing and plan checks are shared.
 * Metadata from config.json, the tokenizer from tokenizer.json, each weight's
 * slices in its own dtype (MLX: still packed, never re-quantized).  Details:
 * docs/multi-node.md ("Shard files").  Mixture-of-experts directories: the
 * per-expert tensors (or mlx-lm's stacked switch_mlp triples) become the
 * stacked ffn_{gate,up,down}_exps of the rank's experts and columns, as
 * shard_file.c cuts them from a GGUF (docs/moe.md, "Shard files").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf_write.h"
#include "model/mlx_quant.h"
#include "model/synth_vocab.h"
#include "model/tensor_source.h"
#include "parallel_impl.h"

static enum tp_status write_kv(tp_gguf_writer_t *w, const char *dir, const char *name, const struct tp_hparams *hp,
                               struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    struct tp_synth_vocab v;
    memset(&v, 0, sizeof v);
    char *tmpl = NULL;
    char tj[4096];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    TP_CHECK_GOTO(tp_synth_vocab_json(tj, hp->n_vocab, &v, err), rc, out);
    if (v.n_tokens != hp->n_vocab) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: tokenizer.json gives %d tokens, config.json vocab_size is %d", dir,
                          v.n_tokens, hp->n_vocab);
        goto out;
    }
    TP_CHECK_GOTO(tp_hf_chat_template(dir, &tmpl, err), rc, out);
    const char *arch = tp_arch_name(hp->arch);
    char key[128];
#define K(suffix) (snprintf(key, sizeof(key), "%s.%s", arch, suffix), key)
    tp_gguf_kv_str(w, "general.architecture", arch);
    tp_gguf_kv_str(w, "general.name", name);
    tp_gguf_kv_u32(w, "general.alignment", 32);
    tp_gguf_kv_u32(w, K("vocab_size"), (uint32_t)hp->n_vocab);
    tp_gguf_kv_u32(w, K("context_length"), (uint32_t)hp->n_ctx_train);
    tp_gguf_kv_u32(w, K("embedding_length"), (uint32_t)hp->n_embd);
    tp_gguf_kv_u32(w, K("block_count"), (uint32_t)hp->n_layer);
    tp_gguf_kv_u32(w, K("feed_forward_length"), (uint32_t)hp->n_ff);
    tp_gguf_kv_u32(w, K("attention.head_count"), (uint32_t)hp->n_head);
    tp_gguf_kv_u32(w, K("attention.head_count_kv"), (uint32_t)hp->n_head_kv);
    tp_gguf_kv_u32(w, K("attention.key_length"), (uint32_t)hp->head_dim);
    tp_gguf_kv_u32(w, K("attention.value_length"), (uint32_t)hp->head_dim);
    tp_gguf_kv_f32(w, K("attention.layer_norm_rms_epsilon"), hp->norm_eps);
    tp_gguf_kv_f32(w, K("rope.freq_base"), hp->rope_theta);
    tp_gguf_kv_u32(w, K("rope.dimension_count"), (uint32_t)hp->rope_dim);
    if (hp->n_expert > 0) { /* the loader reads the expert width from expert_feed_forward_length */
        tp_gguf_kv_u32(w, K("expert_count"), (uint32_t)hp->n_expert);
        tp_gguf_kv_u32(w, K("expert_used_count"), (uint32_t)hp->n_expert_used);
        tp_gguf_kv_u32(w, K("expert_feed_forward_length"), (uint32_t)hp->n_ff);
        if (hp->n_ff_shexp > 0) tp_gguf_kv_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)hp->n_ff_shexp);
        tp_gguf_kv_bool(w, K("expert_weights_norm"), hp->expert_weights_norm != 0);
    }
    if (hp->rope_scaling != TP_ROPE_SCALING_NONE) {
        tp_gguf_kv_str(w, K("rope.scaling.type"), hp->rope_scaling == TP_ROPE_SCALING_LLAMA3 ? "llama3" : "linear");
        tp_gguf_kv_f32(w, K("rope.scaling.factor"), hp->rope_scale_factor);
        if (hp->rope_scaling == TP_ROPE_SCALING_LLAMA3) {
            tp_gguf_kv_f32(w, K("rope.scaling.low_freq_factor"), hp->rope_low_freq_factor);
            tp_gguf_kv_f32(w, K("rope.scaling.high_freq_factor"), hp->rope_high_freq_factor);
            tp_gguf_kv_u32(w, K("rope.scaling.original_context_length"), (uint32_t)hp->rope_orig_ctx);
        }
    }
#undef K
    tp_gguf_kv_str(w, "tokenizer.ggml.model", v.model);
    if (v.pre) tp_gguf_kv_str(w, "tokenizer.ggml.pre", v.pre);
    tp_gguf_kv_array_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tokens, NULL, (uint64_t)v.n_tokens);
    if (v.scores) tp_gguf_kv_array(w, "tokenizer.ggml.scores", TP_GGUF_FLOAT32, v.scores, (uint64_t)v.n_tokens);
    tp_gguf_kv_array(w, "tokenizer.ggml.token_type", TP_GGUF_INT32, v.types, (uint64_t)v.n_tokens);
    if (v.n_merges)
        tp_gguf_kv_array_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges, NULL, (uint64_t)v.n_merges);
    if (v.bos >= 0) tp_gguf_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v.bos);
    if (v.eos >= 0) tp_gguf_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v.eos);
    if (v.unk >= 0) tp_gguf_kv_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v.unk);
    if (v.pad >= 0) tp_gguf_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v.pad);
    tp_gguf_kv_bool(w, "tokenizer.ggml.add_bos_token", v.add_bos);
    tp_gguf_kv_bool(w, "tokenizer.ggml.add_eos_token", v.add_eos);
    if (tmpl || v.chat_template) tp_gguf_kv_str(w, "tokenizer.chat_template", tmpl ? tmpl : v.chat_template);
out:
    free(tmpl);
    tp_synth_vocab_free(&v);
    return rc;
}

/* The GGUF canonical names of the model, in file order; count. */
static int tensor_names(const struct tp_tsrc *src, int n_layer, char (*names)[64], int cap)
{
    static const char *const global[] = {"token_embd.weight", "output_norm.weight", "output.weight"};
    static const char *const layer[] = {"attn_norm.weight",  "attn_q.weight",      "attn_k.weight",
                                        "attn_v.weight",     "attn_q.bias",        "attn_k.bias",
                                        "attn_v.bias",       "attn_q_norm.weight", "attn_k_norm.weight",
                                        "attn_output.weight", "ffn_norm.weight",   "ffn_gate.weight",
                                        "ffn_up.weight",     "ffn_down.weight"};
    static const char *const moe[] = {"ffn_gate_inp.weight",   "ffn_gate_exps.weight",      "ffn_up_exps.weight",
                                      "ffn_down_exps.weight",  "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight",
                                      "ffn_up_shexp.weight",   "ffn_down_shexp.weight"};
    int n = 0;
    struct tp_tsrc_tensor t;
    for (size_t i = 0; i < TP_ARRAY_LEN(global) && n < cap; i++)
        if (tp_tsrc_find(src, global[i], &t)) snprintf(names[n++], 64, "%s", global[i]);
    for (int l = 0; l < n_layer; l++) {
        for (size_t i = 0; i < TP_ARRAY_LEN(layer) && n < cap; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s", l, layer[i]);
            if (tp_tsrc_find(src, nm, &t)) snprintf(names[n++], 64, "%s", nm);
        }
        for (size_t i = 0; i < TP_ARRAY_LEN(moe) && n < cap; i++) {
            char nm[64], e0[64]; /* stacked experts: mlx-lm's one tensor, or expert 0's of the per-expert ones */
            snprintf(nm, sizeof nm, "blk.%d.%s", l, moe[i]);
            snprintf(e0, sizeof e0, "blk.%d.%.*s.0.weight", l, (int)(strlen(moe[i]) - 7), moe[i]);
            if (tp_tsrc_find(src, nm, &t) || (strstr(moe[i], "_exps.") && tp_tsrc_find(src, e0, &t)))
                snprintf(names[n++], 64, "%s", nm);
        }
    }
    return n;
}

/* The mixture-of-experts cut of layer tensor `name` for shard s: the stacked experts (stacked = 1) keep experts
 * [e0, e1), each its rows [r0, r1) and columns [c0, c1); a shared-expert matrix its rows or columns; drop: the
 * tensor is left out (a shared expert on a rank holding none of it).  Returns 0 for the other tensors (the
 * dense rules of tp_shard_classify cut them), 1 with *c filled.  ne0 / ne1: one matrix's columns and rows. */
struct moe_cut {
    int drop, stacked;
    int64_t c0, c1, r0, r1, e0, e1;
};
static int moe_cut_of(const char *name, const struct tp_hparams *hp, const struct tp_model_shard *s, int64_t ne0,
                      int64_t ne1, struct moe_cut *c)
{
    const char *dot = strncmp(name, "blk.", 4) == 0 ? strchr(name + 4, '.') : NULL;
    const char *role = dot ? dot + 1 : "";
    if (hp->n_expert <= 0 || (!strstr(role, "_exps.") && !strstr(role, "_shexp."))) return 0;
    *c = (struct moe_cut){0, 0, 0, ne0, 0, ne1, 0, 1};
    int64_t sb = s->shexp_begin, se = s->shexp_end; /* the loader's rule for a shared expert's holder */
    if (sb == 0 && se == 0 && s->expert_begin == 0 && s->ff_begin == 0) se = hp->n_ff_shexp;
    if (!strcmp(role, "ffn_gate_exps.weight") || !strcmp(role, "ffn_up_exps.weight"))
        c->stacked = 1, c->r0 = s->ff_begin, c->r1 = s->ff_end, c->e0 = s->expert_begin, c->e1 = s->expert_end;
    else if (!strcmp(role, "ffn_down_exps.weight"))
        c->stacked = 1, c->c0 = s->ff_begin, c->c1 = s->ff_end, c->e0 = s->expert_begin, c->e1 = s->expert_end;
    else if (se <= sb)
        c->drop = 1;
    else if (!strcmp(role, "ffn_gate_shexp.weight") || !strcmp(role, "ffn_up_shexp.weight"))
        c->r0 = sb, c->r1 = se;
    else if (!strcmp(role, "ffn_down_shexp.weight"))
        c->c0 = sb, c->c1 = se;
    return 1;
}

static int is_qk(const char *name)
{
    const char *d = strrchr(name, '.');
    return d && strcmp(d, ".weight") == 0 && (strstr(name, ".attn_q.") || strstr(name, ".attn_k."));
}

/* Rows [r0, r1) of safetensors tensor t (rb_full bytes per row), nb bytes from byte col_off of each, appended
 * to w; Llama q/k rows come from their HF rotate-halves position (perm, head_dim hd).  row: scratch >= nb. */
static enum tp_status write_rows(tp_st_t *st, const struct tp_st_tensor *t, tp_gguf_writer_t *w, const char *path,
                                 size_t rb_full, size_t col_off, size_t nb, int64_t r0, int64_t r1, int perm, int64_t hd,
                                 uint8_t *row, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    const int64_t half = hd / 2;
    for (int64_t r = r0; rc == TP_OK && r < r1; r++) {
        int64_t hr = r; /* HF row holding GGUF row r */
        if (perm) {
            int64_t h = r / hd, in = r % hd, i2 = in / 2, sgn = in % 2;
            hr = h * hd + sgn * half + i2;
        }
        rc = tp_st_pread(st, t, row, nb, (uint64_t)hr * rb_full + col_off, err);
        if (rc == TP_OK && (rc = tp_gguf_write_data(w, row, nb)) != TP_OK)
            tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
    }
    return rc;
}

/* The scales and biases of MLX tensor t (HF name t->name) with n_dims 2 (a matrix: t->ne the unpacked
 * [cols, rows]) or 3 (mlx-lm's stacked experts: [cols, rows, experts]), checked: both present, shaped
 * [(experts,) rows, cols / group], one dtype, F16 or BF16.  Names the tensor and the fix otherwise. */
static enum tp_status mlx_siblings_n(tp_st_t *st, const struct tp_tsrc_tensor *t, int n_dims,
                                     const struct tp_st_tensor **sc, const struct tp_st_tensor **bi,
                                     struct tp_error *err)
{
    char sn[256], bn[256];
    const int group = tp_wtype_mlx_group(t->type);
    *sc = tp_mlx_st_sibling(st, t->name, "scales", sn, sizeof sn);
    *bi = tp_mlx_st_sibling(st, t->name, "biases", bn, sizeof bn);
    if (!*sc || !*bi)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: MLX-quantized '%s' needs '%s' and '%s' (incomplete download?)",
                            t->file, t->name, sn, bn);
    const struct tp_st_tensor *a = *sc, *b = *bi;
    int ok = a->n_dims == n_dims && b->n_dims == n_dims && a->dtype == b->dtype &&
             (a->dtype == TP_ST_F16 || a->dtype == TP_ST_BF16) && a->shape[n_dims - 1] * group == t->ne[0];
    for (int d = 0; ok && d < n_dims; d++) {
        ok = a->shape[d] == b->shape[d];
        if (ok && d < n_dims - 1) ok = a->shape[d] == t->ne[n_dims - 1 - d];
    }
    if (!ok)
        return tp_error_set(err, TP_ERR_FORMAT,
                            "%s: MLX '%s': scales / biases must both be F16 or BF16 [%s%lld, %lld] (have %s and %s)",
                            t->file, t->name, n_dims == 3 ? "experts, " : "", (long long)t->ne[1],
                            (long long)(t->ne[0] / group), tp_st_dtype_name(a->dtype), tp_st_dtype_name(b->dtype));
    return TP_OK;
}

/* MLX: the default bits / group and the "MODULE:BITS:GROUP" of the tensors that differ (mlx_impl.h). */
static enum tp_status mlx_keys(tp_gguf_writer_t *w, const struct tp_tsrc *src, char (*names)[64], int n,
                               const struct tp_mlx_quant *mlxq, const char *path, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    int n_over = 0;
    char **over = calloc((size_t)(n ? n : 1), sizeof *over);
    if (!over) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && rc == TP_OK; i++) {
        struct tp_tsrc_tensor t;
        (void)tp_tsrc_find(src, names[i], &t);
        const int bits = tp_wtype_mlx_bits(t.type), group = tp_wtype_mlx_group(t.type);
        if (!bits || (bits == mlxq->bits && group == mlxq->group)) continue;
        char e[160];
        snprintf(e, sizeof e, "%.*s:%d:%d", (int)(strlen(names[i]) - 7), names[i], bits, group);
        if (!(over[n_over++] = strdup(e))) rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    }
    if (rc == TP_OK &&
        ((rc = tp_gguf_kv_u32(w, TP_MLX_KEY_BITS, (uint32_t)mlxq->bits)) != TP_OK ||
         (rc = tp_gguf_kv_u32(w, TP_MLX_KEY_GROUP, (uint32_t)mlxq->group)) != TP_OK ||
         (n_over && (rc = tp_gguf_kv_array_str(w, TP_MLX_KEY_OVERRIDES, (const char *const *)over, NULL,
                                               (uint64_t)n_over)) != TP_OK)))
        tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
    for (int i = 0; i < n_over; i++) free(over[i]);
    free(over);
    return rc;
}

/* Declare tensor t (name) of this rank: an MLX triple (words I32 + scales + biases, sliced, never
 * repacked) or a float tensor, cut to the plan's rows or columns; *max_row grows to its widest row. */
static enum tp_status declare_one(tp_gguf_writer_t *w, tp_st_t *st, const struct tp_tsrc_tensor *tp, const char *name,
                                  const struct tp_hparams *hp, const struct tp_model_shard *s, const char *path,
                                  size_t *max_row, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    const struct tp_tsrc_tensor t = *tp;
    int64_t a = 0, b = 0;
    const int k = tp_shard_classify(name, hp, s, &a, &b);
    if (tp_wtype_mlx_bits(t.type)) {
        const int bits = tp_wtype_mlx_bits(t.type), group = tp_wtype_mlx_group(t.type);
        const struct tp_st_tensor *sc = NULL, *bi = NULL;
        if ((rc = mlx_siblings_n(st, &t, 2, &sc, &bi, err)) != TP_OK) return rc;
        int64_t r0 = 0, r1 = t.ne[1], c0 = 0, c1 = t.ne[0];
        if (k == TP_SHARD_SLICE_ROWS) r0 = a, r1 = b;
        else if (k == TP_SHARD_SLICE_COLS) c0 = a, c1 = b;
        if (r0 < 0 || r1 > t.ne[1] || r0 >= r1 || c0 < 0 || c1 > t.ne[0] || c0 >= c1 || c0 % group || c1 % group)
            return tp_error_set(err, TP_ERR_FORMAT,
                                "%s: MLX tensor '%s' [%lld, %lld] (group %d): the plan's rows [%lld,%lld) columns "
                                "[%lld,%lld) do not fit or cut a group",
                                t.file, t.name, (long long)t.ne[1], (long long)t.ne[0], group, (long long)r0,
                                (long long)r1, (long long)c0, (long long)c1);
        char sn[72], bn[72];
        snprintf(sn, sizeof sn, "%.*s.scales", (int)(strlen(name) - 7), name);
        snprintf(bn, sizeof bn, "%.*s.biases", (int)(strlen(name) - 7), name);
        const enum tp_wtype sbt = sc->dtype == TP_ST_BF16 ? TP_WTYPE_BF16 : TP_WTYPE_F16;
        const int64_t nw[2] = {(c1 - c0) * bits / 32, r1 - r0}, ns[2] = {(c1 - c0) / group, r1 - r0};
        if ((rc = tp_gguf_add_tensor(w, name, TP_WTYPE_I32, 2, nw)) != TP_OK ||
            (rc = tp_gguf_add_tensor(w, sn, sbt, 2, ns)) != TP_OK || (rc = tp_gguf_add_tensor(w, bn, sbt, 2, ns)) != TP_OK)
            return tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
        *max_row = TP_MAX(*max_row, (size_t)t.ne[0] * (size_t)bits / 8);
        return TP_OK;
    }
    if (t.type != TP_WTYPE_F32 && t.type != TP_WTYPE_F16 && t.type != TP_WTYPE_BF16)
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "%s: tensor '%s' is %s; tpserve shard cuts F32 / F16 / BF16 safetensors and MLX affine "
                            "4/8-bit triples (serve this directory whole: every rank reads only its slices anyway)",
                            t.file, t.name, t.type_name);
    if (t.n_dims > 2)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%s' has %d dims (want 1 or 2)", t.file, t.name, t.n_dims);
    int64_t ne[2] = {t.ne[0], t.ne[1]};
    int64_t extent = (t.n_dims == 1 || k == TP_SHARD_SLICE_COLS) ? t.ne[0] : t.ne[1];
    if (k != TP_SHARD_SLICE_NONE && (a < 0 || b > extent || a >= b))
        return tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%s' is smaller than the plan's range [%lld,%lld)", t.file,
                            t.name, (long long)a, (long long)b);
    if (k == TP_SHARD_SLICE_ROWS && t.n_dims == 1) ne[0] = b - a;
    else if (k == TP_SHARD_SLICE_ROWS) ne[1] = b - a;
    else if (k == TP_SHARD_SLICE_COLS) ne[0] = b - a;
    if ((rc = tp_gguf_add_tensor(w, name, t.type, t.n_dims, ne)) != TP_OK)
        return tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
    *max_row = TP_MAX(*max_row, (size_t)t.ne[0] * (t.type == TP_WTYPE_F32 ? 4 : 2));
    return TP_OK;
}

/* Tensor t's data (the slice declare_one declared) read with pread from the file that holds it; row: a
 * buffer of the widest row. */
static enum tp_status write_data_one(tp_gguf_writer_t *w, tp_st_t *st, const struct tp_tsrc_tensor *tp,
                                     const char *name, const struct tp_hparams *hp, const struct tp_model_shard *s,
                                     const char *path, uint8_t *row, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    const struct tp_tsrc_tensor t = *tp;
    int64_t a = 0, b = 0;
    int k = tp_shard_classify(name, hp, s, &a, &b);
    int64_t r0 = 0, r1 = t.n_dims == 1 ? 1 : t.ne[1], c0 = 0, c1 = t.ne[0];
    if (k == TP_SHARD_SLICE_ROWS && t.n_dims == 1) c0 = a, c1 = b;
    else if (k == TP_SHARD_SLICE_ROWS) r0 = a, r1 = b;
    else if (k == TP_SHARD_SLICE_COLS) c0 = a, c1 = b;
    const int perm = hp->arch == TP_ARCH_LLAMA && is_qk(name);
    if (tp_wtype_mlx_bits(t.type)) { /* words, then scales, then biases: the declaration order */
        const size_t bits = (size_t)tp_wtype_mlx_bits(t.type), group = (size_t)tp_wtype_mlx_group(t.type);
        const struct tp_st_tensor *sc = NULL, *bi = NULL;
        if ((rc = mlx_siblings_n(st, &t, 2, &sc, &bi, err)) != TP_OK) return rc;
        const size_t wrb = (size_t)t.ne[0] * bits / 8, srb = (size_t)t.ne[0] / group * 2;
        const size_t sc0 = (size_t)c0 / group * 2, sn = (size_t)(c1 - c0) / group * 2;
        rc = write_rows(st, t.st, w, path, wrb, (size_t)c0 * bits / 8, (size_t)(c1 - c0) * bits / 8, r0, r1, perm,
                        hp->head_dim, row, err);
        if (rc == TP_OK) rc = write_rows(st, sc, w, path, srb, sc0, sn, r0, r1, perm, hp->head_dim, row, err);
        if (rc == TP_OK) rc = write_rows(st, bi, w, path, srb, sc0, sn, r0, r1, perm, hp->head_dim, row, err);
        return rc;
    }
    const size_t es = t.type == TP_WTYPE_F32 ? 4 : 2;
    return write_rows(st, t.st, w, path, (size_t)t.ne[0] * es, (size_t)c0 * es, (size_t)(c1 - c0) * es, r0, r1, perm,
                      hp->head_dim, row, err);
}

/* The source of matrix j of mixture-of-experts tensor `name` under cut c: *t (for MLX the words of the
 * triple) and the row where the matrix starts in it (*row0: expert x rows in mlx-lm's stacked triple, else
 * 0).  Stacked experts come from mlx-lm's one stacked triple or from one safetensors tensor per expert
 * (blk.N.ffn_*_exps.E.weight), each checked here: 2-D [want_cols, want_rows] and of expert e0's type. */
static enum tp_status moe_part(const struct tp_tsrc *src, const char *name, const struct moe_cut *c, int64_t j,
                               int64_t want_cols, int64_t want_rows, struct tp_tsrc_tensor *t, int64_t *row0,
                               struct tp_error *err)
{
    *row0 = 0;
    if (tp_tsrc_find(src, name, t)) {
        if (!c->stacked) return TP_OK;
        if (!tp_wtype_mlx_bits(t->type) || t->n_dims != 3 || t->ne[0] != want_cols || t->ne[1] != want_rows ||
            t->ne[2] < c->e1)
            return tp_error_set(err, TP_ERR_FORMAT,
                                "%s: stacked experts '%s' [%lld, %lld, %lld] (%s): want MLX-quantized [%lld, %lld, "
                                "at least %lld]",
                                t->file, t->name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                                t->type_name, (long long)want_cols, (long long)want_rows, (long long)c->e1);
        *row0 = (c->e0 + j) * want_rows;
        return TP_OK;
    }
    char nm[96], first[96];
    const int base = (int)(strlen(name) - 7); /* without ".weight" */
    snprintf(nm, sizeof nm, "%.*s.%lld.weight", base, name, (long long)(c->e0 + j));
    snprintf(first, sizeof first, "%.*s.%lld.weight", base, name, (long long)c->e0);
    struct tp_tsrc_tensor t0;
    const int have0 = tp_tsrc_find(src, first, &t0), have = tp_tsrc_find(src, nm, t);
    if (!have0 || !have)
        return tp_error_set(err, TP_ERR_FORMAT,
                            "the model directory has no tensor for expert %lld of '%s' (incomplete download?)",
                            (long long)(have0 ? c->e0 + j : c->e0), name);
    if (t->n_dims != 2 || t->ne[0] != want_cols || t->ne[1] != want_rows || t->type != t0.type)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: expert tensor '%s' is %s [%lld, %lld]; want %s [%lld, %lld] like "
                            "expert %lld's",
                            t->file, t->name, t->type_name, (long long)t->ne[0], (long long)t->ne[1], t0.type_name,
                            (long long)want_cols, (long long)want_rows, (long long)c->e0);
    return TP_OK;
}

/* Columns and rows one matrix of mixture-of-experts tensor `name` must have: stacked gate/up [n_embd, n_ff],
 * down [n_ff, n_embd]; shared-expert ones from n_ff_shexp; the shared expert's gate [n_embd, 1]. */
static void moe_shape(const char *name, const struct tp_hparams *hp, int64_t *cols, int64_t *rows)
{
    const int64_t E = hp->n_embd, F = strstr(name, "_shexp.") ? hp->n_ff_shexp : hp->n_ff;
    *cols = strstr(name, "ffn_down_") ? F : E;
    *rows = strstr(name, "ffn_down_") ? E : strstr(name, "gate_inp_shexp") ? 1 : F;
}

/* Declare (write == 0) or write (write == 1) this rank's cut c of mixture-of-experts tensor `name`: one
 * matrix, or the held experts stacked ne = [c1 - c0, r1 - r0, e1 - e0]; an MLX triple as words, scales and
 * biases.  row: a buffer of the widest row (write); *max_row grows to it (declare). */
static enum tp_status moe_tensor(tp_gguf_writer_t *w, tp_st_t *st, const struct tp_tsrc *src, const char *name,
                                 const struct tp_hparams *hp, const struct moe_cut *c, int write, const char *path,
                                 uint8_t *row, size_t *max_row, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    int64_t cols, rows;
    moe_shape(name, hp, &cols, &rows);
    const int64_t nx = c->stacked ? c->e1 - c->e0 : 1;
    struct tp_tsrc_tensor t;
    int64_t row0 = 0;
    if ((rc = moe_part(src, name, c, 0, cols, rows, &t, &row0, err)) != TP_OK) return rc;
    if (!c->stacked && (t.ne[0] != cols || (t.n_dims == 2 ? t.ne[1] : 1) != rows || t.n_dims > 2))
        return tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%s' is [%lld, %lld]; want [%lld, %lld]", t.file, t.name,
                            (long long)t.ne[0], (long long)(t.n_dims == 2 ? t.ne[1] : 1), (long long)cols,
                            (long long)rows);
    const int bits = tp_wtype_mlx_bits(t.type), group = tp_wtype_mlx_group(t.type);
    if (c->c0 < 0 || c->c1 > cols || c->c0 >= c->c1 || c->r0 < 0 || c->r1 > rows || c->r0 >= c->r1 ||
        (bits && (c->c0 % group || c->c1 % group)))
        return tp_error_set(err, TP_ERR_FORMAT,
                            "%s: tensor '%s' [%lld, %lld]: the plan's rows [%lld,%lld) columns [%lld,%lld) do not fit%s",
                            t.file, name, (long long)cols, (long long)rows, (long long)c->r0, (long long)c->r1,
                            (long long)c->c0, (long long)c->c1, bits ? " or cut an MLX group" : "");
    const int64_t nc = c->c1 - c->c0, nr = c->r1 - c->r0;
    if (!bits && t.type != TP_WTYPE_F32 && t.type != TP_WTYPE_F16 && t.type != TP_WTYPE_BF16)
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "%s: tensor '%s' is %s; tpserve shard cuts F32 / F16 / BF16 safetensors and MLX affine "
                            "4/8-bit triples",
                            t.file, t.name, t.type_name);
    const struct tp_st_tensor *sc = NULL, *bi = NULL;
    if (bits && (rc = mlx_siblings_n(st, &t, c->stacked ? 3 : 2, &sc, &bi, err)) != TP_OK) return rc;
    if (!write) {
        const int nd = c->stacked ? 3 : rows == 1 ? 1 : 2; /* the shared expert's gate as llama.cpp's [n_embd] */
        if (bits) {
            char sn[72], bn[72];
            snprintf(sn, sizeof sn, "%.*s.scales", (int)(strlen(name) - 7), name);
            snprintf(bn, sizeof bn, "%.*s.biases", (int)(strlen(name) - 7), name);
            const enum tp_wtype sbt = sc->dtype == TP_ST_BF16 ? TP_WTYPE_BF16 : TP_WTYPE_F16;
            const int64_t nw[3] = {nc * bits / 32, nr, nx}, ns[3] = {nc / group, nr, nx};
            if ((rc = tp_gguf_add_tensor(w, name, TP_WTYPE_I32, nd, nw)) != TP_OK ||
                (rc = tp_gguf_add_tensor(w, sn, sbt, nd, ns)) != TP_OK ||
                (rc = tp_gguf_add_tensor(w, bn, sbt, nd, ns)) != TP_OK)
                return tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
            *max_row = TP_MAX(*max_row, (size_t)cols * (size_t)bits / 8);
            return TP_OK;
        }
        const int64_t ne[3] = {nc, nr, nx};
        if ((rc = tp_gguf_add_tensor(w, name, t.type, nd, ne)) != TP_OK)
            return tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
        *max_row = TP_MAX(*max_row, (size_t)cols * (t.type == TP_WTYPE_F32 ? 4 : 2));
        return TP_OK;
    }
    if (bits) { /* words of every matrix, then the scales, then the biases: the declaration order */
        const size_t wrb = (size_t)cols * (size_t)bits / 8, srb = (size_t)(cols / group) * 2;
        const size_t sc0 = (size_t)(c->c0 / group) * 2, sn = (size_t)(nc / group) * 2;
        for (int part = 0; part < 3 && rc == TP_OK; part++)
            for (int64_t j = 0; j < nx && rc == TP_OK; j++) {
                if ((rc = moe_part(src, name, c, j, cols, rows, &t, &row0, err)) != TP_OK) break;
                const struct tp_st_tensor *pt = part == 0 ? t.st : part == 1 ? sc : bi;
                rc = part == 0 ? write_rows(st, pt, w, path, wrb, (size_t)c->c0 * bits / 8, (size_t)nc * bits / 8,
                                            row0 + c->r0, row0 + c->r1, 0, hp->head_dim, row, err)
                               : write_rows(st, pt, w, path, srb, sc0, sn, row0 + c->r0, row0 + c->r1, 0,
                                            hp->head_dim, row, err);
            }
        return rc;
    }
    const size_t es = t.type == TP_WTYPE_F32 ? 4 : 2;
    for (int64_t j = 0; j < nx && rc == TP_OK; j++) {
        if ((rc = moe_part(src, name, c, j, cols, rows, &t, &row0, err)) != TP_OK) break;
        rc = write_rows(st, t.st, w, path, (size_t)cols * es, (size_t)c->c0 * es, (size_t)nc * es, row0 + c->r0,
                        row0 + c->r1, 0, hp->head_dim, row, err);
    }
    return rc;
}

static enum tp_status write_one(const char *dir, const char *model_name, tp_st_t *st, const struct tp_mlx_quant *mlxq,
                                const struct tp_model_probe *pr,
                                const struct tp_shard_plan *plan, int rank, const char *weights, const char *path,
                                struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    tp_gguf_writer_t *w = NULL;
    uint8_t *row = NULL;
    const struct tp_hparams *hp = &pr->hp;
    const struct tp_model_shard *s = &plan->ranks[rank].shard;
    struct tp_tsrc src = {.kind = TP_TSRC_HF, .st = st, .mlx_bits = mlxq ? mlxq->bits : 0};
    int cap = 3 + 22 * hp->n_layer;
    char(*names)[64] = calloc((size_t)cap, sizeof *names);
    if (!names) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    int n = tensor_names(&src, hp->n_layer, names, cap);
    TP_CHECK_GOTO(tp_gguf_writer_open(path, 32, &w, err), rc, out);
    TP_CHECK_GOTO(write_kv(w, dir, model_name, hp, err), rc, out);
    TP_CHECK_GOTO(tp_shard_write_keys(w, plan, rank, weights, model_name, path, err), rc, out);
    if (mlxq) TP_CHECK_GOTO(mlx_keys(w, &src, names, n, mlxq, path, err), rc, out);
    size_t max_row = 0;
    for (int i = 0; i < n; i++) {
        struct tp_tsrc_tensor t;
        struct moe_cut c;
        int64_t mc, mr;
        moe_shape(names[i], hp, &mc, &mr);
        if (moe_cut_of(names[i], hp, s, mc, mr, &c)) {
            if (!c.drop) TP_CHECK_GOTO(moe_tensor(w, st, &src, names[i], hp, &c, 0, path, NULL, &max_row, err), rc, out);
            continue;
        }
        (void)tp_tsrc_find(&src, names[i], &t);
        TP_CHECK_GOTO(declare_one(w, st, &t, names[i], hp, s, path, &max_row, err), rc, out);
    }
    row = malloc(max_row ? max_row : 1);
    if (!row) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        struct tp_tsrc_tensor t;
        struct moe_cut c;
        int64_t mc, mr;
        moe_shape(names[i], hp, &mc, &mr);
        if (moe_cut_of(names[i], hp, s, mc, mr, &c)) {
            if (!c.drop) TP_CHECK_GOTO(moe_tensor(w, st, &src, names[i], hp, &c, 1, path, row, &max_row, err), rc, out);
            continue;
        }
        (void)tp_tsrc_find(&src, names[i], &t);
        TP_CHECK_GOTO(write_data_one(w, st, &t, names[i], hp, s, path, row, err), rc, out);
    }
    if ((rc = tp_gguf_writer_finish(w)) != TP_OK) tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
out:
    free(row);
    free(names);
    tp_gguf_writer_free(w);
    return rc;
}

enum tp_status tp_shard_write_hf(const char *dir, const struct tp_model_probe *pr, const struct tp_shard_plan *plan,
                                 const char *weights, const char *out_dir, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    tp_st_t *st = NULL;
    struct tp_mlx_quant *mlxq = NULL;
    char name[256];
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t b = len;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(name, sizeof name, "%.*s", (int)(len - b), dir + b);
    TP_CHECK_GOTO(tp_st_open(dir, &st, err), rc, out);
    TP_CHECK_GOTO(tp_mlx_read_quant(dir, &mlxq, err), rc, out); /* MLX directory: NULL when not quantized */
    for (int r = 0; r < plan->world_size; r++) {
        char fname[512], path[1024];
        tp_parallel_shard_name(name, r, plan->world_size, fname, sizeof fname);
        snprintf(path, sizeof path, "%s/%s", out_dir, fname);
        TP_CHECK_GOTO(write_one(dir, name, st, mlxq, pr, plan, r, weights, path, err), rc, out);
        tp_log(TP_LOG_INFO, TP_PARALLEL_MODULE, "wrote %s (%.1f MiB of weights for rank %d of %d)", path,
               (double)(plan->ranks[r].sharded_bytes + plan->ranks[r].replicated_bytes) / 1048576.0, r,
               plan->world_size);
    }
out:
    tp_mlx_quant_free(mlxq);
    tp_st_close(st);
    return rc;
}

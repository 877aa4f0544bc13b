/*
 * cli/cmd_info.c - `tpserve info MODEL`: what a model file (or Hugging
 * Face directory) holds and what it needs.  The file readers give the
 * file-level facts, the loader in vocab-only mode the hyper-parameters and
 * tokenizer as tpserve will use them (its refusals show with its own
 * message), the sharding plan the memory per rank for 2, 4 and 8 ranks.
 * Memory needed = weights + KV cache (f16, every layer, context
 * min(train ctx, 4096), one sequence); compute scratch is not counted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/mlx_quant.h"
#include "model/tensor_source.h"
#include "parallel/parallel.h"

static double mib(uint64_t b) { return (double)b / 1048576.0; }

/* llama.cpp's llama_ftype names (general.file_type): what a quantizer called the file's mix. */
static const char *ftype_name(int64_t f)
{
    static const char *const names[] = {[0] = "F32",     [1] = "F16",     [2] = "Q4_0",    [3] = "Q4_1",
                                        [7] = "Q8_0",    [8] = "Q5_0",    [9] = "Q5_1",    [10] = "Q2_K",
                                        [11] = "Q3_K_S", [12] = "Q3_K_M", [13] = "Q3_K_L", [14] = "Q4_K_S",
                                        [15] = "Q4_K_M", [16] = "Q5_K_S", [17] = "Q5_K_M", [18] = "Q6_K",
                                        [32] = "BF16"};
    if (f >= 0 && f < (int64_t)TP_ARRAY_LEN(names) && names[f]) return names[f];
    return "other";
}

static enum tp_wtype tensor_type(const struct tp_tsrc *src, const char *name, enum tp_wtype def)
{
    struct tp_tsrc_tensor t;
    return tp_tsrc_find(src, name, &t) ? t.type : def;
}

/* Print the file-level facts of a Hugging Face directory (config.json + safetensors).
 * MLX quantized directories: packed U32 weights count as their unpacked
 * parameters, scales / biases as none, and a line gives bits and groups. */
static void hf_file_facts(const char *path, tp_st_t *st, const struct tp_mlx_quant *mq, uint64_t *weight_bytes)
{
    const int mlx_bits = mq ? mq->bits : 0;
    uint64_t bytes[TP_ST_DTYPE_COUNT] = {0}, n_params = 0, file_bytes = 0;
    int count[TP_ST_DTYPE_COUNT] = {0}, n_mlx[TP_WTYPE_COUNT] = {0}, sb_dtype = -1;
    const struct tp_tsrc msrc = {.kind = TP_TSRC_HF, .st = st, .mlx_bits = mlx_bits};
    *weight_bytes = 0;
    for (int i = 0; i < tp_st_n_files(st); i++) file_bytes += tp_st_file_size(st, i);
    printf("directory   %s (Hugging Face: config.json, %d safetensors file%s, %.1f MiB)\n", path, tp_st_n_files(st),
           tp_st_n_files(st) == 1 ? "" : "s", mib(file_bytes));
    for (int i = 0; i < tp_st_n_tensors(st); i++) {
        const struct tp_st_tensor *t = tp_st_tensor(st, i);
        count[t->dtype]++;
        bytes[t->dtype] += t->n_bytes;
        *weight_bytes += t->n_bytes;
        if (t->dtype == TP_ST_U32) {
            struct tp_tsrc_tensor d = {.type = TP_WTYPE_COUNT, .n_elems = t->n_elems};
            tp_mlx_tsrc_describe(&msrc, t, &d);
            if (d.type != TP_WTYPE_COUNT) n_mlx[d.type]++;
            n_params += (uint64_t)d.n_elems;
        } else if (mlx_bits && (tp_str_ends_with(t->name, ".scales") || tp_str_ends_with(t->name, ".biases"))) {
            sb_dtype = (int)t->dtype; /* MLX group parameters, not model parameters */
        } else {
            n_params += (uint64_t)t->n_elems;
        }
    }
    printf("tensors     %d:", tp_st_n_tensors(st));
    for (int d = 0; d < TP_ST_DTYPE_COUNT; d++)
        if (count[d]) printf(" %s x%d (%.1f MiB)", tp_st_dtype_name((enum tp_st_dtype)d), count[d], mib(bytes[d]));
    printf("\n");
    const char *fmt = tp_st_metadata(st, "format");
    if (fmt) printf("format      %s (safetensors __metadata__)\n", fmt);
    int any_mlx = 0;
    for (int t = 0; t < TP_WTYPE_COUNT; t++) any_mlx += n_mlx[t];
    if (any_mlx || mlx_bits) {
        printf("quantized   MLX affine (config.json: %d bits, group size %d%s):", mlx_bits, mq ? mq->group : 0,
               mq && mq->n_over ? ", with per-module entries" : "");
        for (int t = 0; t < TP_WTYPE_COUNT; t++)
            if (n_mlx[t])
                printf(" %d-bit group-%d x%d", tp_wtype_mlx_bits((enum tp_wtype)t), tp_wtype_mlx_group((enum tp_wtype)t),
                       n_mlx[t]);
        printf("%s%s\n", sb_dtype >= 0 ? ", scales/biases " : "",
               sb_dtype >= 0 ? tp_st_dtype_name((enum tp_st_dtype)sb_dtype) : "");
    }
    printf("weights     %.1f MiB, %.3f %s parameters\n", mib(*weight_bytes),
           n_params >= 1000000000ull ? (double)n_params / 1e9 : (double)n_params / 1e6,
           n_params >= 1000000000ull ? "B" : "M");
}

/* Printable token text: control characters escaped, at most 24 bytes. */
static void show_token(const tp_tokenizer_t *tok, int id, char *buf, size_t cap)
{
    if (id < 0) {
        snprintf(buf, cap, "none");
        return;
    }
    size_t len = 0;
    const char *p = tp_tokenizer_piece(tok, id, &len);
    size_t o = (size_t)snprintf(buf, cap, "%d '", id);
    for (size_t i = 0; p && i < len && i < 24 && o + 6 < cap; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x20 || c == 0x7F) o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    if (o + 2 < cap) {
        buf[o++] = '\'';
        buf[o] = 0;
    }
}

/* The model being described; info_close releases it. */
struct info_file {
    const char *path;
    tp_gguf_t *g;                 /* a GGUF file, or */
    tp_st_t *st;                  /* a Hugging Face directory */
    struct tp_tsrc tsrc;          /* its tensors by GGUF name */
    uint64_t weight_bytes;
    int64_t shard_rank, shard_world; /* a `tpserve shard` file: world > 0 */
    const char *arch;             /* general.architecture, "?" when unknown */
    tp_model_t *m;                /* vocab-only: hyper-parameters and tokenizer */
};

static void info_close(struct info_file *f)
{
    tp_model_free(f->m);
    tp_gguf_close(f->g);
    tp_st_close(f->st);
    memset(f, 0, sizeof *f);
}

/* Print the file-level facts of a GGUF file: version, shard, tensors by type, MLX packing, size and bits. */
static void gguf_file_facts(struct info_file *f)
{
    tp_gguf_t *g = f->g;
    const char *name = NULL;
    (void)tp_gguf_get_str(g, "general.name", &name);
    (void)tp_gguf_get_str(g, "general.architecture", &f->arch);
    printf("file        %s (GGUF v%u, %.1f MiB, alignment %u, %d keys)\n", f->path, tp_gguf_version(g),
           mib(tp_gguf_file_size(g)), tp_gguf_alignment(g), tp_gguf_n_kv(g));
    if (name) printf("name        %s\n", name);
    if (tp_gguf_get_int(g, "tpserve.shard.world_size", &f->shard_world) == TP_OK &&
        tp_gguf_get_int(g, "tpserve.shard.rank", &f->shard_rank) == TP_OK) {
        const char *src = NULL;
        (void)tp_gguf_get_str(g, "tpserve.shard.source", &src);
        printf("shard       rank %lld of %lld (cut from %s): tensors and sizes below are this rank's slices\n",
               (long long)f->shard_rank, (long long)f->shard_world, src ? src : "?");
    } else {
        f->shard_world = 0;
    }
    uint64_t type_bytes[TP_WTYPE_COUNT] = {0}, n_params = 0;
    int type_count[TP_WTYPE_COUNT] = {0}, other = 0, n_mlx[TP_WTYPE_COUNT] = {0}, any_mlx = 0;
    int64_t mlx_bits = 0, mlx_group = 0; /* a shard cut from an MLX directory (model/mlx_quant.h) */
    (void)tp_gguf_get_int(g, TP_MLX_KEY_BITS, &mlx_bits);
    (void)tp_gguf_get_int(g, TP_MLX_KEY_GROUP, &mlx_group);
    const struct tp_tsrc msrc = {.kind = TP_TSRC_GGUF, .gguf = g, .mlx_bits = (int)mlx_bits};
    const int n_t = tp_gguf_n_tensors(g);
    for (int i = 0; i < n_t; i++) {
        const struct tp_gguf_tensor *t = tp_gguf_tensor(g, i);
        f->weight_bytes += t->n_bytes;
        struct tp_tsrc_tensor d;
        if (mlx_bits && t->type == TP_WTYPE_I32 && tp_tsrc_find(&msrc, t->name, &d) && tp_wtype_mlx_bits(d.type)) {
            n_mlx[d.type]++; /* packed words: count the values they hold */
            any_mlx++;
            n_params += (uint64_t)d.n_elems;
        } else if (!(mlx_bits && (tp_str_ends_with(t->name, ".scales") || tp_str_ends_with(t->name, ".biases")))) {
            n_params += (uint64_t)t->n_elems; /* MLX group parameters are not model parameters */
        }
        if ((int)t->type >= 0 && (int)t->type < TP_WTYPE_COUNT) {
            type_count[t->type]++;
            type_bytes[t->type] += t->n_bytes;
        } else {
            other++;
        }
    }
    printf("tensors     %d:", n_t);
    for (int t = 0; t < TP_WTYPE_COUNT; t++)
        if (type_count[t])
            printf(" %s x%d (%.1f MiB)", tp_wtype_name((enum tp_wtype)t), type_count[t], mib(type_bytes[t]));
    if (other) printf(" other x%d", other);
    printf("\n");
    if (any_mlx) {
        printf("quantized   MLX affine (%s: %lld bits, group size %lld), packed words kept as i32:", TP_MLX_KEY_BITS,
               (long long)mlx_bits, (long long)mlx_group);
        for (int t = 0; t < TP_WTYPE_COUNT; t++)
            if (n_mlx[t]) printf(" %s x%d", tp_wtype_name((enum tp_wtype)t), n_mlx[t]);
        printf("\n");
    }
    int64_t ftype = -1;
    if (tp_gguf_get_int(g, "general.file_type", &ftype) == TP_OK)
        printf("file type   %s (general.file_type %lld)\n", ftype_name(ftype), (long long)ftype);
    printf("weights     %.1f MiB, %.3f %s parameters (%.2f bits per parameter)\n", mib(f->weight_bytes),
           n_params >= 1000000000ull ? (double)n_params / 1e9 : (double)n_params / 1e6,
           n_params >= 1000000000ull ? "B" : "M",
           n_params ? 8.0 * (double)f->weight_bytes / (double)n_params : 0.0);
}

/* Open the model file or directory and print its file-level facts. */
static enum tp_status info_open(struct info_file *f, struct tp_error *err)
{
    f->arch = "?";
    f->tsrc.kind = TP_TSRC_GGUF;
    if (!tp_hf_is_dir(f->path)) {
        enum tp_status st = tp_gguf_open(f->path, &f->g, err);
        if (st != TP_OK) return st;
        f->tsrc.gguf = f->g;
        gguf_file_facts(f);
        return TP_OK;
    }
    enum tp_status st = tp_st_open(f->path, &f->st, err);
    if (st != TP_OK) return st;
    f->tsrc.kind = TP_TSRC_HF;
    f->tsrc.st = f->st;
    struct tp_mlx_quant *mq = NULL;
    st = tp_mlx_read_quant(f->path, &mq, err);
    if (st != TP_OK) return st;
    f->tsrc.mlx_bits = mq ? mq->bits : 0;
    hf_file_facts(f->path, f->st, mq, &f->weight_bytes);
    tp_mlx_quant_free(mq);
    return TP_OK;
}

/* The loader's hyper-parameters (vocab-only), completed with the facts that
 * tensors carry (vocab-only loading reads none): tied output head, q/k
 * biases and norms, Llama 3 rope_freqs. */
static enum tp_status info_hparams(struct info_file *f, struct tp_hparams *hp, struct tp_error *err)
{
    struct tp_model_config mc = tp_model_default_config();
    mc.path = f->path;
    mc.vocab_only = 1;
    mc.n_threads = 1;
    enum tp_status st = tp_model_init(&mc, &f->m, err);
    if (st != TP_OK) return st;
    *hp = *tp_model_hparams(f->m);
    struct tp_tsrc_tensor t;
    if (!tp_tsrc_find(&f->tsrc, "output.weight", &t)) hp->tied_embeddings = 1;
    if (tp_tsrc_find(&f->tsrc, "blk.0.attn_q.bias", &t)) hp->has_qkv_bias = 1;
    if (tp_tsrc_find(&f->tsrc, "blk.0.attn_q_norm.weight", &t)) hp->has_qk_norm = 1;
    const struct tp_gguf_tensor *rf = tp_gguf_find_tensor(f->g, "rope_freqs.weight");
    if (rf && hp->rope_scaling == TP_ROPE_SCALING_NONE && rf->type == TP_WTYPE_F32 && rf->n_elems > 0) {
        hp->rope_scaling = TP_ROPE_SCALING_LLAMA3;
        hp->rope_scale_factor = ((const float *)rf->data)[rf->n_elems - 1]; /* lowest frequency: the full factor */
    }
    return TP_OK;
}

/* Architecture, shape, rope, experts, tokenizer and chat template. */
static void info_print_model(const struct info_file *f, const struct tp_hparams *hp)
{
    printf("arch        %s\n", tp_arch_name(hp->arch));
    printf("shape       n_embd %d, n_layer %d, n_head %d, n_head_kv %d (%d q per kv), head_dim %d, n_ff %d, "
           "n_vocab %d\n",
           hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->n_head_kv ? hp->n_head / hp->n_head_kv : 0,
           hp->head_dim, hp->n_ff, hp->n_vocab);
    static const char *const scaling[] = {"none", "linear", "llama3", "yarn"};
    printf("rope        theta %g, %d dims, %s pairs, scaling %s", hp->rope_theta, hp->rope_dim,
           hp->rope_neox ? "neox (halves)" : "interleaved", scaling[hp->rope_scaling % 4]);
    if (hp->rope_scaling != TP_ROPE_SCALING_NONE) printf(" x%g", hp->rope_scale_factor);
    if (hp->rope_scaling == TP_ROPE_SCALING_YARN)
        printf(" (original context %d, beta %g..%g, attention factor %.4f)", hp->rope_orig_ctx,
               (double)hp->rope_yarn_beta_slow, (double)hp->rope_yarn_beta_fast, (double)hp->rope_attn_factor);
    printf("\n");
    if (hp->sliding_window > 0 && hp->swa_period > 0)
        printf("attention   sliding window %d positions on %s, full attention on the others%s\n", hp->sliding_window,
               hp->swa_period == 2 ? "the even layers" : "some layers",
               hp->arch == TP_ARCH_GPTOSS ? "; a learned sink logit per head" : "");
    printf("context     %d trained\n", hp->n_ctx_train);
    printf("layers      rms eps %g, tied embeddings %s, qkv bias %s, qk norm %s\n", hp->norm_eps,
           hp->tied_embeddings ? "yes" : "no", hp->has_qkv_bias ? "yes" : "no", hp->has_qk_norm ? "yes" : "no");
    if (hp->n_expert > 0) {
        /* parameters a token does not touch: the unselected experts' gate, up and down */
        const double idle = 3.0 * (double)hp->n_embd * (double)hp->n_ff * (double)(hp->n_expert - hp->n_expert_used) *
                            (double)hp->n_layer;
        if (hp->router_softmax_topk)
            printf("experts     %d per layer of width %d, %d used per token (router: top-%d logits with bias, softmax "
                   "over those; clamped SwiGLU alpha %g limit %g, expert biases)\n",
                   hp->n_expert, hp->n_ff, hp->n_expert_used, hp->n_expert_used, (double)hp->swiglu_alpha,
                   (double)hp->swiglu_limit);
        else
            printf("experts     %d per layer of width %d, %d used per token (router: softmax, top-%d%s)\n", hp->n_expert,
                   hp->n_ff, hp->n_expert_used, hp->n_expert_used,
                   hp->expert_weights_norm ? ", renormalised" : ", not renormalised");
        printf("            about %.1f M of the %.1f M expert parameters are inactive for each token\n", idle / 1e6,
               (double)hp->n_layer * 3.0 * (double)hp->n_embd * (double)hp->n_ff * (double)hp->n_expert / 1e6);
    }
    tp_tokenizer_t *tok = tp_model_tokenizer(f->m);
    char bos[64], eos[64];
    show_token(tok, tp_tokenizer_bos(tok), bos, sizeof(bos));
    show_token(tok, tp_tokenizer_eos(tok), eos, sizeof(eos));
    const char *pre = NULL, *tmodel = "tokenizer.json";
    if (f->g) {
        tmodel = NULL;
        (void)tp_gguf_get_str(f->g, "tokenizer.ggml.model", &tmodel);
        (void)tp_gguf_get_str(f->g, "tokenizer.ggml.pre", &pre);
    }
    printf("tokenizer   %s (%s%s%s), %d tokens, bos %s, eos %s, adds bos %s\n",
           tp_tokenizer_kind(tok) == TP_TOK_SPM ? "sentencepiece" : "byte-level bpe", tmodel ? tmodel : "?",
           pre ? ", pre " : "", pre ? pre : "", tp_tokenizer_n_vocab(tok), bos, eos,
           tp_tokenizer_add_bos(tok) ? "yes" : "no");
    const char *tmpl = tp_model_chat_template(f->m);
    if (tmpl) printf("chat        template present (%zu bytes)\n", strlen(tmpl));
    else printf("chat        no template\n");
}

/* The weight types the plan needs, from the first layer's tensors. */
static struct tp_plan_types info_plan_types(const struct tp_tsrc *tsrc, const struct tp_hparams *hp)
{
    struct tp_plan_types types;
    struct tp_tsrc_tensor t;
    const enum tp_wtype wt = tensor_type(tsrc, "blk.0.attn_q.weight", TP_WTYPE_F32);
    types.attn_q = wt;
    types.attn_k = tensor_type(tsrc, "blk.0.attn_k.weight", wt);
    types.attn_v = tensor_type(tsrc, "blk.0.attn_v.weight", wt);
    types.attn_o = tensor_type(tsrc, "blk.0.attn_output.weight", wt);
    /* mixture of experts: the stacked experts (GGUF), or expert 0 (Hugging Face: one tensor per expert) */
    const int moe = hp->n_expert > 0, per_expert = moe && !tp_tsrc_find(tsrc, "blk.0.ffn_gate_exps.weight", &t);
    static const char *const ffn[3][3] = {
        {"blk.0.ffn_gate.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate_exps.0.weight"},
        {"blk.0.ffn_up.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_up_exps.0.weight"},
        {"blk.0.ffn_down.weight", "blk.0.ffn_down_exps.weight", "blk.0.ffn_down_exps.0.weight"},
    };
    const int k = per_expert ? 2 : moe ? 1 : 0;
    types.ffn_gate = tensor_type(tsrc, ffn[0][k], wt);
    types.ffn_up = tensor_type(tsrc, ffn[1][k], wt);
    types.ffn_down = tensor_type(tsrc, ffn[2][k], wt);
    types.token_embd = tensor_type(tsrc, "token_embd.weight", wt);
    types.output = tensor_type(tsrc, "output.weight", types.token_embd);
    return types;
}

/* Memory for one rank, and per rank for 2, 4 and 8 equal ranks (not for a shard). */
static void info_print_memory(const struct info_file *f, const struct tp_hparams *hp, int n_ctx,
                              enum tp_kv_type kv_type)
{
    const int ctx = n_ctx > 0 ? n_ctx : TP_MIN(hp->n_ctx_train, 4096);
    /* K and V of --kv-type (auto, the default of generate / serve / bench gen, as a model loaded on this machine
     * resolves it), layer by layer: a windowed layer keeps a ring of window + 512 (the default batch) positions,
     * the others ctx */
    const int batch = 512;
    const int hd = hp->head_dim; /* set and checked by the loader */
    const enum tp_kv_type given = kv_type;
    kv_type = tp_kv_type_resolve(kv_type, hd);
    const uint64_t kv_per_head = tp_kv_head_bytes(hp, ctx, batch, kv_type);
    if (kv_per_head == 0) {
        printf("memory      weights %.1f MiB; a %s KV cache cannot hold head_dim %d (use f16 or f32)\n",
               mib(f->weight_bytes), tp_kv_type_name(kv_type), hd);
        return;
    }
    int n_win = 0;
    int64_t win_pos = 0; /* positions a windowed layer keeps */
    for (int l = 0; l < hp->n_layer; l++)
        if (tp_kv_layer_window(hp, l) > 0) {
            n_win++;
            win_pos = tp_kv_layer_positions(hp, l, ctx, batch);
        }
    int kv_heads = hp->n_head_kv;
    if (f->shard_world > 0) { /* a shard holds the KV heads of its plan range: 8 ints per rank, kv at [2], [3] */
        int kp = tp_gguf_find_key(f->g, "tpserve.shard.plan");
        int32_t ranges[8 * 64];
        if (kp >= 0 && f->shard_world <= 64 && f->shard_rank >= 0 && f->shard_rank < f->shard_world &&
            tp_gguf_arr_len(f->g, kp) == (uint64_t)f->shard_world * 8 &&
            tp_gguf_arr_copy_i32(f->g, kp, ranges, (uint64_t)f->shard_world * 8) == TP_OK)
            kv_heads = ranges[f->shard_rank * 8 + 3] - ranges[f->shard_rank * 8 + 2];
    }
    const uint64_t kv_bytes = kv_per_head * (uint64_t)kv_heads;
    printf("memory      %.1f MiB = weights %.1f MiB + KV cache %.1f MiB (%s%s, ctx %d, 1 sequence, %d KV heads)\n",
           mib(f->weight_bytes + kv_bytes), mib(f->weight_bytes), mib(kv_bytes), tp_kv_type_name(kv_type),
           given == TP_KV_AUTO ? " by auto here" : "", ctx, kv_heads);
    if (n_win > 0)
        printf("kv cache    %d sliding-window layer%s x %lld positions (window %d + batch %d) + %d full layer%s x %d "
               "positions\n",
               n_win, n_win == 1 ? "" : "s", (long long)win_pos,
               hp->sliding_window, batch, hp->n_layer - n_win, hp->n_layer - n_win == 1 ? "" : "s", ctx);
    if (f->shard_world > 0) { /* per-rank figures need the whole model */
        printf("per rank    see 'tpserve info' of the model this shard was cut from\n");
        return;
    }
    const struct tp_plan_types types = info_plan_types(&f->tsrc, hp);
    static struct tp_shard_plan plan; /* large (64 ranks): keep it off the stack */
    static const int world[] = {2, 4, 8};
    for (size_t i = 0; i < TP_ARRAY_LEN(world); i++) {
        struct tp_error perr = {0};
        printf("%-11s ", i == 0 ? "per rank" : "");
        if (tp_parallel_plan(hp, &types, world[i], NULL, &plan, &perr) != TP_OK) {
            printf("%d ranks: not possible: %s\n", world[i], perr.msg);
            continue;
        }
        uint64_t worst = 0, best = UINT64_MAX;
        for (int r = 0; r < plan.world_size; r++) {
            const struct tp_shard_rank_plan *rp = &plan.ranks[r];
            uint64_t kv = kv_per_head * (uint64_t)(rp->shard.kv_head_end - rp->shard.kv_head_begin);
            uint64_t need = rp->sharded_bytes + rp->replicated_bytes + kv;
            if (need > worst) worst = need;
            if (need < best) best = need;
        }
        printf("%d ranks: %.1f MiB each%s (%.1f MiB replicated weights%s)\n", world[i], mib(worst),
               best != worst ? " at most" : "", mib(plan.replicated_bytes),
               plan.kv_replicated ? ", KV heads replicated" : "");
    }
}

int tp_cmd_info(int argc, char **argv)
{
    int n_ctx = 0;
    const char *kv_name = "auto";
    const struct tp_opt opts[] = {
        {"ctx-size", 'c', TP_OPT_INT, &n_ctx, "N", "context for the KV cache estimate (default min(train ctx, 4096))", 1,
         1 << 24},
        {"kv-type", 0, TP_OPT_STRING, &kv_name, "T", "KV cache type of the estimate: f16 (default), q8_0 or f32", 0, 0},
        {0},
    };
    const char *pos[1] = {NULL};
    int np = 0;
    int rc = tp_cli_parse("info", "Usage: tpserve info [--ctx-size N] [--kv-type T] MODEL.gguf|HF_DIR", opts, argc,
                          argv, pos, 1, &np, NULL, NULL);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    enum tp_kv_type kv_type;
    if (tp_kv_type_parse(kv_name, &kv_type) != TP_OK) {
        fprintf(stderr, "tpserve info: --kv-type %s: want auto, f16, bf16, q8_0 or f32\n", kv_name);
        return 2;
    }
    if (np != 1) {
        fprintf(stderr, "tpserve info: give one model file (tpserve info MODEL.gguf)\n");
        return 2;
    }
    tp_cli_setup_logging(NULL);
    tp_log_set_level(TP_LOG_WARN);
    struct info_file f = {.path = pos[0]};
    struct tp_hparams hp;
    struct tp_error err = {0};
    int exit_code = 1;
    if (info_open(&f, &err) != TP_OK) {
        tp_cli_fail("info", "%s", err.msg);
    } else if (info_hparams(&f, &hp, &err) != TP_OK) {
        printf("arch        %s\n", f.arch);
        tp_cli_fail("info", "%s", err.msg);
    } else {
        info_print_model(&f, &hp);
        info_print_memory(&f, &hp, n_ctx, kv_type);
        exit_code = 0;
    }
    info_close(&f);
    return exit_code;
}

/*
 * model/forward/model_load.c - tp_model_init: hyper-parameters from GGUF metadata
 * (or a Hugging Face directory's config.json), the tensor table checked
 * against them, this rank's slice of every weight, and the KV cache and
 * activation scratch the forward pass uses.
 *
 * Weights come through a tensor source (model/tensor_source.h) keyed by GGUF
 * canonical names: a GGUF file, or an HF directory's safetensors files
 * (model.layers.N.self_attn.q_proj.weight answers blk.N.attn_q.weight), so
 * everything below works the same for both.
 *
 * Whole model: weights are used zero-copy from the read-only mapping.
 * Shard (cfg.shard): sharded matrices are read with pread into owned aligned
 * buffers (column-parallel Q/K/V, gate/up and the output head: contiguous
 * rows; row-parallel attn_output / ffn_down: a column sub-range of every row,
 * on quantization block boundaries), so only the slice becomes resident;
 * replicated tensors (norms, token_embd) stay mapped.  A tpserve shard file
 * (shard->file_is_slice) already holds the slices: they are used whole.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/kernels.h"
#include "format/mlx_impl.h"
#include "forward/model_impl.h"
#include "model/tensor_source.h"
#include "tokenizer/tokenizer_impl.h"

#define MODULE "model"

struct tp_model_config tp_model_default_config(void)
{
    struct tp_model_config c;
    memset(&c, 0, sizeof(c));
    c.n_threads = 0;
    c.n_ctx = 0;
    c.n_seq = 1;
    c.n_batch = 512;
    return c;
}

const char *tp_arch_name(enum tp_arch a)
{
    switch (a) {
    case TP_ARCH_LLAMA: return "llama";
    case TP_ARCH_QWEN2: return "qwen2";
    case TP_ARCH_QWEN3: return "qwen3";
    case TP_ARCH_QWEN3MOE: return "qwen3moe";
    case TP_ARCH_QWEN2MOE: return "qwen2moe";
    case TP_ARCH_GPTOSS: return "gpt-oss";
    default: return "unknown";
    }
}

/* ----------------------------------------------------------- metadata */

static enum tp_status md_int(tp_model_t *m, const char *arch, const char *suffix, int required, int64_t lo, int64_t hi,
                             int *out)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int64_t v;
    enum tp_status rc = tp_gguf_get_int(m->gguf, key, &v);
    if (rc == TP_ERR_NOT_FOUND) {
        if (!required) return TP_OK;
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: metadata '%s' is missing (needed for arch %s)", m->path, key,
                            arch);
    }
    if (rc != TP_OK) return tp_error_set(&m->err, rc, "%s", tp_gguf_last_error(m->gguf));
    if (v < lo || v > hi)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: metadata '%s' = %lld is out of range [%lld, %lld]", m->path,
                            key, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return TP_OK;
}

static enum tp_status md_float(tp_model_t *m, const char *arch, const char *suffix, float *out)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    double v;
    enum tp_status rc = tp_gguf_get_float(m->gguf, key, &v);
    if (rc == TP_ERR_NOT_FOUND) return TP_OK;
    if (rc != TP_OK) return tp_error_set(&m->err, rc, "%s", tp_gguf_last_error(m->gguf));
    if (!isfinite(v))
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: metadata '%s' is not a finite number", m->path, key);
    *out = (float)v;
    return TP_OK;
}

/* The architecture named by general.architecture, into hp->arch; *arch_out is the name (owned by the
 * GGUF handle). Families tpserve cannot run are refused with what they would need. */
static enum tp_status read_arch(tp_model_t *m, struct tp_hparams *hp, const char **arch_out)
{
    const char *arch = NULL;
    enum tp_status rc = tp_gguf_get_str(m->gguf, "general.architecture", &arch);
    if (rc == TP_ERR_NOT_FOUND)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: metadata 'general.architecture' is missing", m->path);
    if (rc != TP_OK) return tp_error_set(&m->err, rc, "%s", tp_gguf_last_error(m->gguf));
    if (strcmp(arch, "llama") == 0 || strcmp(arch, "mistral") == 0) hp->arch = TP_ARCH_LLAMA;
    else if (strcmp(arch, "qwen2") == 0) hp->arch = TP_ARCH_QWEN2;
    else if (strcmp(arch, "qwen3") == 0) hp->arch = TP_ARCH_QWEN3;
    else if (strcmp(arch, "qwen3moe") == 0) hp->arch = TP_ARCH_QWEN3MOE;
    else if (strcmp(arch, "qwen2moe") == 0) hp->arch = TP_ARCH_QWEN2MOE;
    else if (strcmp(arch, "gpt-oss") == 0) hp->arch = TP_ARCH_GPTOSS;
    else if (strcmp(arch, "deepseek2") == 0 || strcmp(arch, "deepseek") == 0)
        return tp_error_set(&m->err, TP_ERR_UNSUPPORTED,
                            "%s: architecture '%s' (DeepSeek: multi-head latent attention and shared experts) is not "
                            "supported; supported mixture-of-experts models: Qwen3-MoE (qwen3moe), Qwen2-MoE (qwen2moe) "
                            "and Mixtral (llama with experts)",
                            m->path, arch);
    else if (strncmp(arch, "glm4moe", 7) == 0 || strcmp(arch, "glm4_moe") == 0)
        return tp_error_set(&m->err, TP_ERR_UNSUPPORTED,
                            "%s: architecture '%s' (GLM-MoE: sigmoid router with expert bias and shared experts) is not "
                            "supported; supported mixture-of-experts models: Qwen3-MoE (qwen3moe), Qwen2-MoE (qwen2moe) "
                            "and Mixtral (llama with experts)",
                            m->path, arch);
    else
        return tp_error_set(&m->err, TP_ERR_UNSUPPORTED,
                            "%s: architecture '%.64s' is not supported (supported: llama (incl. Mistral, TinyLlama, "
                            "SmolLM, Mixtral), qwen2, qwen3, qwen2moe, qwen3moe, gpt-oss)",
                            m->path, arch);
    *arch_out = arch;
    return TP_OK;
}

/* Widths, depth, head counts, context, pooling and sliding window. */
static enum tp_status read_shape(tp_model_t *m, const char *arch, struct tp_hparams *hp)
{
    enum tp_status rc = TP_OK;
    const int big = 1 << 24;
    TP_CHECK_GOTO(md_int(m, arch, "embedding_length", 1, 1, big, &hp->n_embd), rc, out);
    TP_CHECK_GOTO(md_int(m, arch, "block_count", 1, 1, 4096, &hp->n_layer), rc, out);
    TP_CHECK_GOTO(md_int(m, arch, "attention.head_count", 1, 1, 65536, &hp->n_head), rc, out);
    hp->n_head_kv = hp->n_head;
    TP_CHECK_GOTO(md_int(m, arch, "attention.head_count_kv", 0, 1, 65536, &hp->n_head_kv), rc, out);
    TP_CHECK_GOTO(md_int(m, arch, "feed_forward_length", 1, 1, big, &hp->n_ff), rc, out);
    hp->n_ctx_train = 2048;
    TP_CHECK_GOTO(md_int(m, arch, "context_length", 0, 1, 1 << 30, &hp->n_ctx_train), rc, out);
    hp->pooling_type = -1;
    TP_CHECK_GOTO(md_int(m, arch, "pooling_type", 0, 0, 4, &hp->pooling_type), rc, out);
    hp->sliding_window = 0; /* Mistral v0.1: every layer attends to the last 4096 positions */
    TP_CHECK_GOTO(md_int(m, arch, "attention.sliding_window", 0, 0, 1 << 30, &hp->sliding_window), rc, out);
    if (hp->sliding_window >= hp->n_ctx_train) hp->sliding_window = 0;
out:
    return rc;
}

/* Mixture of experts: expert counts and widths, the router's normalisation, gpt-oss's SwiGLU clamp. */
static enum tp_status read_experts(tp_model_t *m, const char *arch, struct tp_hparams *hp)
{
    enum tp_status rc = TP_OK;
    const int big = 1 << 24;
    TP_CHECK_GOTO(md_int(m, arch, "expert_count", 0, 0, 1 << 16, &hp->n_expert), rc, out);
    if ((hp->arch == TP_ARCH_QWEN3MOE || hp->arch == TP_ARCH_QWEN2MOE || hp->arch == TP_ARCH_GPTOSS) &&
        hp->n_expert == 0)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: metadata '%s.expert_count' is missing (needed for arch %s)",
                            m->path, arch, arch);
    if (hp->n_expert > 0) {
        if (hp->arch == TP_ARCH_QWEN2)
            return tp_error_set(&m->err, TP_ERR_UNSUPPORTED,
                                "%s: qwen2 with %d experts is not supported (mixture-of-experts: qwen3moe, llama/Mixtral)",
                                m->path, hp->n_expert);
        TP_CHECK_GOTO(md_int(m, arch, "expert_used_count", 1, 1, hp->n_expert, &hp->n_expert_used), rc, out);
        /* Qwen3-MoE: experts narrower than feed_forward_length (the dense width, unused) */
        TP_CHECK_GOTO(md_int(m, arch, "expert_feed_forward_length", 0, 1, big, &hp->n_ff), rc, out);
        /* Mixtral and Qwen3-MoE renormalise, Qwen2-MoE does not (llama.cpp: norm_w); gpt-oss's
         * softmax over the selected logits sums to 1 by itself */
        hp->expert_weights_norm = hp->arch != TP_ARCH_QWEN2MOE;
        if (hp->arch == TP_ARCH_GPTOSS) {
            hp->router_softmax_topk = 1;
            hp->expert_weights_norm = 0;
            hp->swiglu_alpha = 1.702f; /* OpenAI's gpt-oss reference: swiglu(alpha=1.702, limit=7.0) */
            hp->swiglu_limit = 7.0f;
        }
        if (hp->arch == TP_ARCH_QWEN2MOE)
            TP_CHECK_GOTO(md_int(m, arch, "expert_shared_feed_forward_length", 1, 1, big, &hp->n_ff_shexp), rc, out);
        char nk[128];
        snprintf(nk, sizeof(nk), "%s.expert_weights_norm", arch);
        int b = 0;
        enum tp_status brc = tp_gguf_get_bool(m->gguf, nk, &b);
        if (brc == TP_OK) hp->expert_weights_norm = b != 0;
        else if (brc != TP_ERR_NOT_FOUND) return tp_error_set(&m->err, brc, "%s", tp_gguf_last_error(m->gguf));
        int lead = 0;
        TP_CHECK_GOTO(md_int(m, arch, "leading_dense_block_count", 0, 0, 4096, &lead), rc, out);
        if (lead > 0)
            return tp_error_set(&m->err, TP_ERR_UNSUPPORTED,
                                "%s: %s.leading_dense_block_count = %d: dense layers before the expert layers are not "
                                "supported",
                                m->path, arch, lead);
    }
out:
    return rc;
}

/* Head dimension, rotary dimension and style, the biases and norms the architecture implies, rope
 * base and RMS epsilon. */
static enum tp_status read_heads(tp_model_t *m, const char *arch, struct tp_hparams *hp)
{
    enum tp_status rc = TP_OK;
    const int big = 1 << 24;
    if (hp->n_head % hp->n_head_kv != 0)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d", m->path,
                            hp->n_head, hp->n_head_kv);
    hp->head_dim = hp->n_embd / hp->n_head;
    int key_len = 0, val_len = 0;
    TP_CHECK_GOTO(md_int(m, arch, "attention.key_length", 0, 1, 65536, &key_len), rc, out);
    TP_CHECK_GOTO(md_int(m, arch, "attention.value_length", 0, 1, 65536, &val_len), rc, out);
    if (key_len) hp->head_dim = key_len;
    if (val_len && val_len != hp->head_dim)
        return tp_error_set(&m->err, TP_ERR_UNSUPPORTED, "%s: key_length %d != value_length %d is not supported", m->path,
                            hp->head_dim, val_len);
    if (hp->head_dim <= 0 || hp->head_dim % 2 != 0)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: head dimension %d (embedding %d / heads %d) must be even",
                            m->path, hp->head_dim, hp->n_embd, hp->n_head);
    if ((int64_t)hp->n_head * hp->head_dim > big || (int64_t)hp->n_head_kv * hp->head_dim > big)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: %d heads x head dimension %d is absurd", m->path, hp->n_head,
                            hp->head_dim);
    hp->rope_dim = hp->head_dim;
    TP_CHECK_GOTO(md_int(m, arch, "rope.dimension_count", 0, 2, hp->head_dim, &hp->rope_dim), rc, out);
    if (hp->rope_dim % 2 != 0)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: %s.rope.dimension_count %d must be even", m->path, arch,
                            hp->rope_dim);
    hp->rope_neox = hp->arch != TP_ARCH_LLAMA;
    if (hp->arch == TP_ARCH_QWEN3MOE) hp->has_qk_norm = 1;
    /* what the architecture implies (load_weights then goes by the tensors present): a
     * vocab-only load (tpserve plan, the probe) sizes the biases with it */
    if (hp->arch == TP_ARCH_QWEN2 || hp->arch == TP_ARCH_QWEN2MOE || hp->arch == TP_ARCH_GPTOSS) hp->has_qkv_bias = 1;
    hp->rope_theta = 10000.0f;
    TP_CHECK_GOTO(md_float(m, arch, "rope.freq_base", &hp->rope_theta), rc, out);
    if (!(hp->rope_theta > 1.0f))
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: %s.rope.freq_base %g must be > 1", m->path, arch,
                            (double)hp->rope_theta);
    hp->norm_eps = 1e-5f;
    TP_CHECK_GOTO(md_float(m, arch, "attention.layer_norm_rms_epsilon", &hp->norm_eps), rc, out);
    if (!(hp->norm_eps >= 0.0f && hp->norm_eps < 1.0f))
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: rms epsilon %g is out of range", m->path, (double)hp->norm_eps);
out:
    return rc;
}

/* RoPE scaling (none, linear, llama3, yarn) and its parameters. */
static enum tp_status read_rope_scaling(tp_model_t *m, const char *arch, struct tp_hparams *hp)
{
    enum tp_status rc = TP_OK;
    hp->rope_scaling = TP_ROPE_SCALING_NONE;
    hp->rope_yarn_beta_fast = 32.0f;
    hp->rope_yarn_beta_slow = 1.0f;
    hp->rope_attn_factor = 1.0f;
    hp->rope_scale_factor = 1.0f;
    hp->rope_low_freq_factor = 1.0f;
    hp->rope_high_freq_factor = 4.0f;
    hp->rope_orig_ctx = 8192;
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    const char *stype = NULL;
    rc = tp_gguf_get_str(m->gguf, key, &stype);
    if (rc != TP_OK && rc != TP_ERR_NOT_FOUND) return tp_error_set(&m->err, rc, "%s", tp_gguf_last_error(m->gguf));
    rc = TP_OK;
    float lin = 0.0f;
    TP_CHECK_GOTO(md_float(m, arch, "rope.scale_linear", &lin), rc, out);
    if (lin > 0.0f && lin != 1.0f) {
        hp->rope_scaling = TP_ROPE_SCALING_LINEAR;
        hp->rope_scale_factor = lin;
    }
    if (stype && strcmp(stype, "none") != 0) {
        if (strcmp(stype, "linear") == 0) hp->rope_scaling = TP_ROPE_SCALING_LINEAR;
        else if (strcmp(stype, "llama3") == 0) hp->rope_scaling = TP_ROPE_SCALING_LLAMA3;
        else if (strcmp(stype, "yarn") == 0) hp->rope_scaling = TP_ROPE_SCALING_YARN;
        else
            return tp_error_set(&m->err, TP_ERR_UNSUPPORTED,
                                "%s: %s = '%.32s' is not supported (supported: none, linear, llama3, yarn)", m->path, key,
                                stype);
        TP_CHECK_GOTO(md_float(m, arch, "rope.scaling.factor", &hp->rope_scale_factor), rc, out);
        TP_CHECK_GOTO(md_float(m, arch, "rope.scaling.low_freq_factor", &hp->rope_low_freq_factor), rc, out);
        TP_CHECK_GOTO(md_float(m, arch, "rope.scaling.high_freq_factor", &hp->rope_high_freq_factor), rc, out);
        TP_CHECK_GOTO(md_int(m, arch, "rope.scaling.original_context_length", 0, 1, 1 << 30, &hp->rope_orig_ctx), rc,
                      out);
        TP_CHECK_GOTO(md_float(m, arch, "rope.scaling.yarn_beta_fast", &hp->rope_yarn_beta_fast), rc, out);
        TP_CHECK_GOTO(md_float(m, arch, "rope.scaling.yarn_beta_slow", &hp->rope_yarn_beta_slow), rc, out);
        if (!(hp->rope_scale_factor > 0.0f) ||
            (hp->rope_scaling == TP_ROPE_SCALING_LLAMA3 && !(hp->rope_high_freq_factor > hp->rope_low_freq_factor)) ||
            (hp->rope_scaling == TP_ROPE_SCALING_YARN &&
             !(hp->rope_yarn_beta_fast > hp->rope_yarn_beta_slow && hp->rope_yarn_beta_slow > 0.0f)))
            return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: rope scaling parameters are inconsistent", m->path);
        if (hp->rope_scaling == TP_ROPE_SCALING_YARN && hp->rope_scale_factor > 1.0f)
            hp->rope_attn_factor = 0.1f * logf(hp->rope_scale_factor) + 1.0f;
    }
out:
    return rc;
}

/* m->hp from the GGUF metadata (m->gguf), every value range-checked. */
static enum tp_status read_hparams(tp_model_t *m)
{
    enum tp_status rc = TP_OK;
    struct tp_hparams *hp = &m->hp;
    const char *arch = NULL;
    memset(hp, 0, sizeof(*hp));
    TP_CHECK_GOTO(read_arch(m, hp, &arch), rc, out);
    TP_CHECK_GOTO(read_shape(m, arch, hp), rc, out);
    TP_CHECK_GOTO(read_experts(m, arch, hp), rc, out);
    TP_CHECK_GOTO(read_heads(m, arch, hp), rc, out);
    if (hp->arch == TP_ARCH_GPTOSS) hp->swa_period = 2; /* windows on the even layers (llama.cpp: swa pattern 2) */
    TP_CHECK_GOTO(read_rope_scaling(m, arch, hp), rc, out);
out:
    return rc;
}

/* ----------------------------------------------------------- tensors */

static struct tp_tsrc source_of(const tp_model_t *m)
{
    struct tp_tsrc s = {m->st ? TP_TSRC_HF : TP_TSRC_GGUF, m->gguf, m->st, m->mlxq ? m->mlxq->bits : 0};
    return s;
}

static int has_tensor(const tp_model_t *m, const char *name)
{
    struct tp_tsrc src = source_of(m);
    struct tp_tsrc_tensor t;
    return tp_tsrc_find(&src, name, &t);
}

/* Find tensor `name` (GGUF canonical name) in the model's source; 0 (and the
 * error text when required) when it is absent. */
static int find_tensor(tp_model_t *m, const char *name, int required, struct tp_tsrc_tensor *t)
{
    struct tp_tsrc src = source_of(m);
    if (tp_tsrc_find(&src, name, t)) return 1;
    if (required) {
        char hf[160];
        if (m->st && tp_tsrc_hf_name(name, hf, sizeof(hf)))
            tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s' is missing (arch %s)", m->path, hf,
                         tp_arch_name(m->hp.arch));
        else
            tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s' is missing (arch %s)", m->path, name,
                         tp_arch_name(m->hp.arch));
    }
    return 0;
}

static void progress(tp_model_t *m, const struct tp_model_config *cfg, uint64_t add, uint64_t total)
{
    m->weight_bytes += add;
    if (cfg->progress) cfg->progress(cfg->progress_ctx, m->weight_bytes, total);
}

static enum tp_status pread_full(tp_model_t *m, const struct tp_tsrc_tensor *t, void *dst, size_t n, uint64_t off)
{
    int fd = t->fd;
    const char *name = t->name;
    uint8_t *p = dst;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return tp_error_set(&m->err, TP_ERR_IO, "%s: reading tensor '%s' at offset %llu failed: %s", t->file, name,
                                (unsigned long long)off, r < 0 ? strerror(errno) : "unexpected end of file");
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return TP_OK;
}

/*
 * Load a 2-D weight whose full shape is (rows_full, cols_full) in ggml terms
 * (ne = [cols_full, rows_full]) and keep rows [r0, r1) x cols [c0, c1).
 * Reads from the mapping when the whole tensor is kept, else with pread.
 */
/* n_stack > 1: a 3-D tensor of n_stack matrices (the stacked experts, ne = [cols, rows_full / n_stack, n_stack])
 * seen as one (rows_full, cols_full) matrix: expert e's row r is row e * rows_full / n_stack + r. */
static enum tp_status load_mat_st(tp_model_t *m, const struct tp_model_config *cfg, const char *name, int64_t rows_full,
                                  int64_t cols_full, int64_t r0, int64_t r1, int64_t c0, int64_t c1, struct tp_wmat *w,
                                  uint64_t total, int64_t n_stack)
{
    struct tp_tsrc_tensor tt;
    const struct tp_tsrc_tensor *t = &tt;
    if (!find_tensor(m, name, 1, &tt)) return m->err.status;
    name = t->name;
    if (n_stack > 1 && (t->ne[2] != n_stack || t->ne[3] != 1 || t->ne[0] != cols_full || t->ne[1] * n_stack != rows_full))
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                            m->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                            (long long)cols_full, (long long)(rows_full / n_stack), (long long)n_stack);
    if (t->mlx_packed) { /* MLX quantized: weight + scales + biases (mlx_load.c; directory or shard file; stacked
                          * experts are one [n_stack * rows, cols] matrix) */
        uint64_t held = 0;
        enum tp_status mrc = tp_mlx_load_mat(m, t, rows_full, cols_full, r0, r1, c0, c1, w, &held);
        if (mrc == TP_OK && m->dry_run) m->weight_bytes += held;
        else if (mrc == TP_OK) progress(m, cfg, held, total);
        return mrc;
    }
    if (n_stack == 1 && (t->ne[2] != 1 || t->ne[3] != 1))
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s' has %d dims (want 2)", m->path, name, t->n_dims);
    if (!tp_wtype_supported(t->type))
        return tp_error_set(&m->err, TP_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which this build cannot compute with",
                            m->path, name, t->type_name);
    int64_t rows = r1 - r0, cols = c1 - c0;
    int slice_file = m->sharded && m->shard.file_is_slice;
    int whole = 0;
    if (t->ne[0] == cols_full && t->ne[1] * n_stack == rows_full) {
        whole = (rows == rows_full && cols == cols_full);
    } else if (slice_file && n_stack == 1 && t->ne[0] == cols && t->ne[1] == rows) {
        whole = 1;
        r0 = 0;
        c0 = 0;
        rows_full = rows;
        cols_full = cols;
    } else {
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]%s",
                            m->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)cols_full,
                            (long long)rows_full,
                            slice_file ? " (or this shard's slice)" : "");
    }
    int64_t blck = tp_wtype_block_elems(t->type);
    if (blck <= 0 || c0 % blck != 0 || cols % blck != 0)
        return tp_error_set(&m->err, TP_ERR_INVALID_ARG,
                            "%s: tensor '%s': shard columns [%lld, %lld) cut a %s block of %lld elements; choose "
                            "block-aligned FFN/head boundaries",
                            m->path, name, (long long)c0, (long long)c1, tp_wtype_name(t->type), (long long)blck);
    size_t full_row_bytes = tp_kern_row_bytes(t->type, cols_full);
    if (m->dry_run) { /* sizing pass: count, validate, touch nothing */
        m->weight_bytes += whole ? t->n_bytes : (uint64_t)tp_kern_row_bytes(t->type, cols) * (uint64_t)rows;
        return TP_OK;
    }
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = tp_kern_row_bytes(t->type, cols);
    w->owned = NULL;
    if (whole && ((uintptr_t)t->data & 31u) == 0) {
        w->data = t->data;
        progress(m, cfg, t->n_bytes, total);
        return TP_OK;
    }
    if (whole) {
        /* misaligned for the kernels (GGUF general.alignment < 32; safetensors offsets are arbitrary):
         * keep an aligned copy, read with pread so the mapping's pages never become resident too */
        w->owned = tp_aligned_alloc(64, (size_t)t->n_bytes);
        if (!w->owned)
            return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory for tensor '%s'", m->path, name);
        w->data = w->owned;
        if (t->fd >= 0) {
            enum tp_status prc = pread_full(m, t, w->owned, (size_t)t->n_bytes, t->file_offset);
            if (prc != TP_OK) return prc;
        } else {
            memcpy(w->owned, t->data, (size_t)t->n_bytes);
        }
        progress(m, cfg, t->n_bytes, total);
        return TP_OK;
    }
    if (t->fd < 0)
        return tp_error_set(&m->err, TP_ERR_INTERNAL, "%s: slice load needs a file descriptor", m->path);
    size_t bytes = 0;
    if (tp_mul_size(w->row_bytes, (size_t)rows, &bytes) != 0 || bytes == 0)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s': slice size overflows", m->path, name);
    w->owned = tp_aligned_alloc(64, bytes);
    if (!w->owned) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory for tensor '%s' (%zu bytes)", m->path, name, bytes);
    w->data = w->owned;
    size_t col_off = tp_kern_row_bytes(t->type, c0);
    enum tp_status rc = TP_OK;
    if (cols == cols_full) {
        rc = pread_full(m, t, w->owned, bytes, t->file_offset + (uint64_t)r0 * full_row_bytes);
    } else {
        for (int64_t r = 0; r < rows && rc == TP_OK; r++)
            rc = pread_full(m, t, (uint8_t *)w->owned + (size_t)r * w->row_bytes, w->row_bytes,
                            t->file_offset + (uint64_t)(r0 + r) * full_row_bytes + col_off);
    }
    if (rc == TP_OK) progress(m, cfg, bytes, total);
    return rc;
}

static enum tp_status load_mat(tp_model_t *m, const struct tp_model_config *cfg, const char *name, int64_t rows_full,
                               int64_t cols_full, int64_t r0, int64_t r1, int64_t c0, int64_t c1, struct tp_wmat *w,
                               uint64_t total)
{
    return load_mat_st(m, cfg, name, rows_full, cols_full, r0, r1, c0, c1, w, total, 1);
}

/* A 1-D tensor (norm weight or bias) of n_full elements, elements [e0, e1) kept, as owned f32. */
static enum tp_status load_vec(tp_model_t *m, const struct tp_model_config *cfg, const char *name, int64_t n_full,
                               int64_t e0, int64_t e1, float **out, uint64_t total)
{
    struct tp_tsrc_tensor tt;
    const struct tp_tsrc_tensor *t = &tt;
    if (!find_tensor(m, name, 1, &tt)) return m->err.status;
    name = t->name;
    int64_t n = e1 - e0;
    if (t->n_elems == n_full && t->ne[0] == n_full) {
        /* whole */
    } else if (m->sharded && m->shard.file_is_slice && t->ne[0] == n && t->n_elems == n) {
        e0 = 0;
    } else {
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s' has %lld elements, expected %lld", m->path, name,
                            (long long)t->n_elems, (long long)n_full);
    }
    if (t->type != TP_WTYPE_F32 && t->type != TP_WTYPE_F16 && t->type != TP_WTYPE_BF16)
        return tp_error_set(&m->err, TP_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s (want f32/f16/bf16)", m->path, name,
                            t->type_name);
    if (m->dry_run) {
        m->weight_bytes += (uint64_t)n * 4;
        return TP_OK;
    }
    float *v = tp_aligned_alloc(64, (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!v) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory", m->path);
    const uint8_t *src = t->data;
    for (int64_t i = 0; i < n; i++) {
        if (t->type == TP_WTYPE_F32) memcpy(&v[i], src + (e0 + i) * 4, 4);
        else {
            uint16_t h;
            memcpy(&h, src + (e0 + i) * 2, 2);
            v[i] = t->type == TP_WTYPE_F16 ? tp_fp16_to_f32(h) : tp_bf16_to_f32(h);
        }
    }
    *out = v;
    progress(m, cfg, (uint64_t)n * 4, total);
    return TP_OK;
}

/*
 * Of a 2-D f32/f16/bf16 tensor of ne = [ne0, ne1] (ne1 rows of ne0), rows [r0, r1) and elements [c0, c1)
 * of each, as owned f32 (r1 - r0, c1 - c0).  The gpt-oss expert biases: one row per expert, the held
 * experts' rows, the held columns.  A tpserve shard file may hold exactly that slice.
 */
static enum tp_status load_rows(tp_model_t *m, const struct tp_model_config *cfg, const char *name, int64_t ne0,
                                int64_t ne1, int64_t c0, int64_t c1, int64_t r0, int64_t r1, float **out,
                                uint64_t total)
{
    struct tp_tsrc_tensor tt;
    const struct tp_tsrc_tensor *t = &tt;
    if (!find_tensor(m, name, 1, &tt)) return m->err.status;
    name = t->name;
    const int64_t n = c1 - c0, nr = r1 - r0;
    if (t->ne[0] == ne0 && t->ne[1] == ne1 && t->n_elems == ne0 * ne1) {
        /* whole */
    } else if (m->sharded && m->shard.file_is_slice && t->ne[0] == n && t->ne[1] == nr && t->n_elems == n * nr) {
        ne0 = n;
        c0 = 0;
        r0 = 0;
    } else {
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]%s",
                            m->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)ne0, (long long)ne1,
                            m->sharded && m->shard.file_is_slice ? " (or this shard's slice)" : "");
    }
    if (t->type != TP_WTYPE_F32 && t->type != TP_WTYPE_F16 && t->type != TP_WTYPE_BF16)
        return tp_error_set(&m->err, TP_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s (want f32/f16/bf16)", m->path, name,
                            t->type_name);
    if (m->dry_run) {
        m->weight_bytes += (uint64_t)(n * nr) * 4;
        return TP_OK;
    }
    float *v = tp_aligned_alloc(64, (size_t)(n * nr > 0 ? n * nr : 1) * sizeof(float));
    if (!v) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory", m->path);
    const uint8_t *src = t->data;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t i = 0; i < n; i++) {
            const int64_t k = (r0 + r) * ne0 + c0 + i;
            if (t->type == TP_WTYPE_F32) memcpy(&v[r * n + i], src + k * 4, 4);
            else {
                uint16_t h;
                memcpy(&h, src + k * 2, 2);
                v[r * n + i] = t->type == TP_WTYPE_F16 ? tp_fp16_to_f32(h) : tp_bf16_to_f32(h);
            }
        }
    *out = v;
    progress(m, cfg, (uint64_t)(n * nr) * 4, total);
    return TP_OK;
}

static void free_mat(struct tp_wmat *w)
{
    tp_aligned_free(w->owned);
    tp_aligned_free(w->owned_sb);
}

/* ----------------------------------------------------------- shard checks */

static enum tp_status check_shard(tp_model_t *m, const struct tp_model_shard *s)
{
    const struct tp_hparams *hp = &m->hp;
    if (!s) {
        memset(&m->shard, 0, sizeof(m->shard));
        m->shard.q_head_end = hp->n_head;
        m->shard.kv_head_end = hp->n_head_kv;
        m->shard.ff_end = hp->n_ff;
        m->shard.vocab_end = hp->n_vocab;
        m->shard.expert_end = hp->n_expert;
        return TP_OK;
    }
    m->shard = *s;
    m->sharded = 1;
    if (m->shard.expert_begin == 0 && m->shard.expert_end == 0) m->shard.expert_end = hp->n_expert;
    if (s->q_head_begin < 0 || s->q_head_end > hp->n_head || s->q_head_begin >= s->q_head_end ||
        s->kv_head_begin < 0 || s->kv_head_end > hp->n_head_kv || s->kv_head_begin >= s->kv_head_end ||
        s->ff_begin < 0 || s->ff_end > hp->n_ff || s->ff_begin >= s->ff_end || s->vocab_begin < 0 ||
        s->vocab_end > hp->n_vocab || s->vocab_begin >= s->vocab_end)
        return tp_error_set(&m->err, TP_ERR_INVALID_ARG,
                            "%s: shard ranges q[%d,%d) kv[%d,%d) ff[%d,%d) vocab[%d,%d) do not fit the model (heads %d, "
                            "kv heads %d, ff %d, vocab %d)",
                            m->path, s->q_head_begin, s->q_head_end, s->kv_head_begin, s->kv_head_end, s->ff_begin,
                            s->ff_end, s->vocab_begin, s->vocab_end, hp->n_head, hp->n_head_kv, hp->n_ff, hp->n_vocab);
    if (hp->n_expert > 0 && !(s->expert_begin == 0 && s->expert_end == 0) &&
        (s->expert_begin < 0 || s->expert_end > hp->n_expert || s->expert_begin >= s->expert_end))
        return tp_error_set(&m->err, TP_ERR_INVALID_ARG, "%s: shard experts [%d,%d) do not fit the model's %d experts",
                            m->path, s->expert_begin, s->expert_end, hp->n_expert);
    int group = hp->n_head / hp->n_head_kv;
    int kv_lo = s->q_head_begin / group, kv_hi = (s->q_head_end - 1) / group;
    if (kv_lo < s->kv_head_begin || kv_hi >= s->kv_head_end)
        return tp_error_set(&m->err, TP_ERR_INVALID_ARG,
                            "%s: shard KV heads [%d,%d) do not cover the groups [%d,%d] of Q heads [%d,%d)", m->path,
                            s->kv_head_begin, s->kv_head_end, kv_lo, kv_hi, s->q_head_begin, s->q_head_end);
    return TP_OK;
}

/* ----------------------------------------------------------- init/free */

/* ------------------------------------------------------------ gpt-oss, Hugging Face layout */

/* A safetensors tensor by its HF name with the expected dtype and shape (n dims); NULL + error. */
static const struct tp_st_tensor *hf_tensor(tp_model_t *m, const char *name, int n, const int64_t *shape, int u8)
{
    const struct tp_st_tensor *t = tp_st_find(m->st, name);
    if (!t) {
        tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s' is missing (arch gpt-oss)", m->path, name);
        return NULL;
    }
    int ok = t->n_dims == n && t->data != NULL;
    for (int i = 0; ok && i < n; i++) ok = t->shape[i] == shape[i];
    if (u8) ok = ok && t->dtype == TP_ST_U8;
    else ok = ok && (t->dtype == TP_ST_F32 || t->dtype == TP_ST_BF16 || t->dtype == TP_ST_F16);
    if (!ok) {
        tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s' is %s with %d dims [%lld, %lld, ...]; expected %s [%lld, %lld, ...]",
                     m->path, name, tp_st_dtype_name(t->dtype), t->n_dims, (long long)t->shape[0],
                     (long long)(t->n_dims > 1 ? t->shape[1] : 0), u8 ? "U8" : "F32/BF16/F16", (long long)shape[0],
                     (long long)(n > 1 ? shape[1] : 0));
        return NULL;
    }
    return t;
}

static float st_f32(const struct tp_st_tensor *t, int64_t i)
{
    const uint8_t *p = t->data;
    if (t->dtype == TP_ST_F32) {
        float v;
        memcpy(&v, p + i * 4, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p + i * 2, 2);
    return t->dtype == TP_ST_BF16 ? tp_bf16_to_f32(h) : tp_fp16_to_f32(h);
}

/*
 * Expert x's MXFP4 matrix from OpenAI's layout (PREFIX_blocks U8 (X, R, C/32, 16): byte i of a
 * block holds element 2i in its low nibble and 2i+1 in its high one; PREFIX_scales U8 (X, R, C/32):
 * the E8M0 exponents), rows r0, r0 + step, ... (n of them), column blocks [cb0, cb1), re-laid as
 * GGUF MXFP4 rows (17-byte blocks: the exponent, then element j low / j+16 high) in an owned buffer.
 */
static enum tp_status hf_mxfp4(tp_model_t *m, const struct tp_model_config *cfg, const char *prefix, int64_t X,
                               int64_t R, int64_t C, int64_t x, int64_t r0, int64_t step, int64_t n, int64_t cb0,
                               int64_t cb1, struct tp_wmat *w, uint64_t total)
{
    char nb[200], ns[200];
    snprintf(nb, sizeof nb, "%s_blocks", prefix);
    snprintf(ns, sizeof ns, "%s_scales", prefix);
    const int64_t shb[4] = {X, R, C / 32, 16}, shs[3] = {X, R, C / 32};
    const struct tp_st_tensor *tb = hf_tensor(m, nb, 4, shb, 1), *ts = tb ? hf_tensor(m, ns, 3, shs, 1) : NULL;
    if (!tb || !ts) return m->err.status;
    const int64_t nblk = cb1 - cb0;
    const size_t row_bytes = (size_t)nblk * sizeof(uint8_t) * 17;
    if (m->dry_run) {
        m->weight_bytes += (uint64_t)row_bytes * (uint64_t)n;
        return TP_OK;
    }
    w->type = TP_WTYPE_MXFP4;
    w->rows = n;
    w->cols = nblk * 32;
    w->row_bytes = row_bytes;
    w->owned = tp_aligned_alloc(64, row_bytes * (size_t)(n > 0 ? n : 1));
    if (!w->owned) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory for '%s'", m->path, nb);
    w->data = w->owned;
    const uint8_t *B = tb->data, *S = ts->data;
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = r0 + i * step;
        uint8_t *dst = (uint8_t *)w->owned + (size_t)i * row_bytes;
        for (int64_t b = 0; b < nblk; b++) {
            const size_t k = (size_t)((x * R + r) * (C / 32) + cb0 + b);
            const uint8_t *src = B + k * 16;
            uint8_t *o = dst + (size_t)b * 17;
            o[0] = S[k];
            for (int j = 0; j < 16; j++) {
                /* element e's code: byte e/2, low nibble for even e */
                const uint8_t lo = (uint8_t)(j & 1 ? src[j / 2] >> 4 : src[j / 2] & 0x0F);
                const uint8_t hi = (uint8_t)((j + 16) & 1 ? src[(j + 16) / 2] >> 4 : src[(j + 16) / 2] & 0x0F);
                o[1 + j] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
    progress(m, cfg, (uint64_t)row_bytes * (uint64_t)n, total);
    return TP_OK;
}

/* gpt-oss experts of a Hugging Face directory (OpenAI's MXFP4 checkpoint layout): the fused
 * gate_up projection (rows 2f gate, 2f+1 up of output f) and down, their biases, and the router
 * (mapped by the tensor source). */
static enum tp_status load_experts_gptoss_hf(tp_model_t *m, const struct tp_model_config *cfg, int l, uint64_t total)
{
    enum tp_status rc = TP_OK;
    const struct tp_hparams *hp = &m->hp;
    const struct tp_model_shard *s = &m->shard;
    struct tp_layer *L = &m->layers[l];
    const int64_t E = hp->n_embd, F = hp->n_ff, X = hp->n_expert, f0 = s->ff_begin, f1 = s->ff_end, nf = f1 - f0;
    char gu[160], dn[160], nm[200];
    snprintf(gu, sizeof gu, "model.layers.%d.mlp.experts.gate_up_proj", l);
    snprintf(dn, sizeof dn, "model.layers.%d.mlp.experts.down_proj", l);
    if (E % 32 || F % 32 || f0 % 32 || f1 % 32)
        return tp_error_set(&m->err, TP_ERR_INVALID_ARG,
                            "%s: gpt-oss experts: hidden %lld, width %lld and the shard columns [%lld, %lld) must be "
                            "multiples of the 32-value MXFP4 block",
                            m->path, (long long)E, (long long)F, (long long)f0, (long long)f1);
    for (int64_t e = s->expert_begin; e < s->expert_end; e++) {
        TP_CHECK_GOTO(hf_mxfp4(m, cfg, gu, X, 2 * F, E, e, 2 * f0, 2, nf, 0, E / 32, &L->xgate[e], total), rc, out);
        TP_CHECK_GOTO(hf_mxfp4(m, cfg, gu, X, 2 * F, E, e, 2 * f0 + 1, 2, nf, 0, E / 32, &L->xup[e], total), rc, out);
        TP_CHECK_GOTO(hf_mxfp4(m, cfg, dn, X, E, F, e, 0, 1, E, f0 / 32, f1 / 32, &L->xdown[e], total), rc, out);
    }
    snprintf(nm, sizeof nm, "%s_bias", gu);
    const int64_t shg[2] = {X, 2 * F}, shd[2] = {X, E};
    const struct tp_st_tensor *bg = hf_tensor(m, nm, 2, shg, 0);
    if (!bg) return m->err.status;
    snprintf(nm, sizeof nm, "%s_bias", dn);
    const struct tp_st_tensor *bd = hf_tensor(m, nm, 2, shd, 0);
    if (!bd) return m->err.status;
    const int64_t x0 = s->expert_begin, nx = s->expert_end - s->expert_begin; /* the held experts' rows */
    const uint64_t bias_bytes = (uint64_t)(nx * nf * 2 + (f0 == 0 ? nx * E : 0)) * 4;
    if (m->dry_run) {
        m->weight_bytes += bias_bytes;
        return TP_OK;
    }
    L->xgate_b = tp_aligned_alloc(64, (size_t)(nx * nf) * sizeof(float));
    L->xup_b = tp_aligned_alloc(64, (size_t)(nx * nf) * sizeof(float));
    if (f0 == 0) L->xdown_b = tp_aligned_alloc(64, (size_t)(nx * E) * sizeof(float));
    if (!L->xgate_b || !L->xup_b || (f0 == 0 && !L->xdown_b))
        return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory", m->path);
    for (int64_t j = 0; j < nx; j++) {
        const int64_t x = x0 + j;
        for (int64_t i = 0; i < nf; i++) {
            L->xgate_b[j * nf + i] = st_f32(bg, x * 2 * F + 2 * (f0 + i));
            L->xup_b[j * nf + i] = st_f32(bg, x * 2 * F + 2 * (f0 + i) + 1);
        }
        for (int64_t i = 0; f0 == 0 && i < E; i++) L->xdown_b[j * E + i] = st_f32(bd, x * E + i);
    }
    progress(m, cfg, bias_bytes, total);
out:
    return rc;
}

/*
 * Layer l's mixture of experts: the router ffn_gate_inp (whole) and, of the
 * stacked ffn_{gate,up,down}_exps, the held experts' slices.  Held whole (no
 * shard of the experts) the stacked tensors are used as they are (mapped)
 * and each expert's matrices are views into them; otherwise each held
 * expert's rows [ff_begin, ff_end) of gate/up and those columns of down are
 * read into owned buffers, so only this rank's part becomes resident.
 */
static enum tp_status load_experts(tp_model_t *m, const struct tp_model_config *cfg, int l, uint64_t total)
{
    enum tp_status rc = TP_OK;
    const struct tp_hparams *hp = &m->hp;
    const struct tp_model_shard *s = &m->shard;
    struct tp_layer *L = &m->layers[l];
    const int64_t E = hp->n_embd, F = hp->n_ff, X = hp->n_expert;
    char gname[96], uname[96], dname[96], rname[96];
    snprintf(rname, sizeof(rname), "blk.%d.ffn_gate_inp.weight", l);
    snprintf(gname, sizeof(gname), "blk.%d.ffn_gate_exps.weight", l);
    snprintf(uname, sizeof(uname), "blk.%d.ffn_up_exps.weight", l);
    snprintf(dname, sizeof(dname), "blk.%d.ffn_down_exps.weight", l);
    TP_CHECK_GOTO(load_mat(m, cfg, rname, X, E, 0, X, 0, E, &L->wrouter, total), rc, out);
    if (hp->arch == TP_ARCH_GPTOSS && !L->xgate) {
        L->xgate = calloc((size_t)X, sizeof(*L->xgate));
        L->xup = calloc((size_t)X, sizeof(*L->xup));
        L->xdown = calloc((size_t)X, sizeof(*L->xdown));
        if (!L->xgate || !L->xup || !L->xdown) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory", m->path);
    }
    if (hp->arch == TP_ARCH_GPTOSS && m->st) {
        char bname[96];
        snprintf(bname, sizeof bname, "blk.%d.ffn_gate_inp.bias", l);
        TP_CHECK_GOTO(load_vec(m, cfg, bname, X, 0, X, &L->brouter, total), rc, out);
        return load_experts_gptoss_hf(m, cfg, l, total);
    }
    if (hp->arch == TP_ARCH_GPTOSS) { /* router and expert biases (the held columns; down on one rank) */
        char bname[96];
        snprintf(bname, sizeof bname, "blk.%d.ffn_gate_inp.bias", l);
        TP_CHECK_GOTO(load_vec(m, cfg, bname, X, 0, X, &L->brouter, total), rc, out);
        const int64_t x0 = s->expert_begin, x1 = s->expert_end;
        snprintf(bname, sizeof bname, "blk.%d.ffn_gate_exps.bias", l);
        TP_CHECK_GOTO(load_rows(m, cfg, bname, F, X, s->ff_begin, s->ff_end, x0, x1, &L->xgate_b, total), rc, out);
        snprintf(bname, sizeof bname, "blk.%d.ffn_up_exps.bias", l);
        TP_CHECK_GOTO(load_rows(m, cfg, bname, F, X, s->ff_begin, s->ff_end, x0, x1, &L->xup_b, total), rc, out);
        if (s->ff_begin == 0) {
            snprintf(bname, sizeof bname, "blk.%d.ffn_down_exps.bias", l);
            TP_CHECK_GOTO(load_rows(m, cfg, bname, E, X, 0, E, x0, x1, &L->xdown_b, total), rc, out);
        }
    }
    if (!L->xgate) {
        L->xgate = calloc((size_t)X, sizeof(*L->xgate));
        L->xup = calloc((size_t)X, sizeof(*L->xup));
        L->xdown = calloc((size_t)X, sizeof(*L->xdown));
        if (!L->xgate || !L->xup || !L->xdown) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory", m->path);
    }
    if (hp->n_ff_shexp > 0) {
        char name[96];
        const int64_t S = hp->n_ff_shexp;
        int64_t sb = s->shexp_begin, se = s->shexp_end;
        if (sb == 0 && se == 0 && s->expert_begin == 0 && s->ff_begin == 0) se = S; /* whole on this rank */
        if (sb < 0 || se < sb || se > S)
            return tp_error_set(&m->err, TP_ERR_INVALID_ARG, "%s: shared-expert columns [%lld,%lld) out of [0,%lld)",
                                m->path, (long long)sb, (long long)se, (long long)S);
        m->holds_shexp = se > sb;
        m->n_shexp_l = (int)(se - sb);
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", l);
        if (m->holds_shexp) {
            TP_CHECK_GOTO(load_vec(m, cfg, name, E, 0, E, &L->sgate_inp, total), rc, out);
            snprintf(name, sizeof name, "blk.%d.ffn_gate_shexp.weight", l);
            TP_CHECK_GOTO(load_mat(m, cfg, name, S, E, sb, se, 0, E, &L->sgate, total), rc, out);
            snprintf(name, sizeof name, "blk.%d.ffn_up_shexp.weight", l);
            TP_CHECK_GOTO(load_mat(m, cfg, name, S, E, sb, se, 0, E, &L->sup, total), rc, out);
            snprintf(name, sizeof name, "blk.%d.ffn_down_shexp.weight", l);
            TP_CHECK_GOTO(load_mat(m, cfg, name, E, S, 0, E, sb, se, &L->sdown, total), rc, out);
        }
    }
    const int whole = s->ff_begin == 0 && s->ff_end == F && s->expert_begin == 0 && s->expert_end == X;
    if (m->st && !has_tensor(m, gname)) { /* Hugging Face: one tensor per expert (tensor_source.h names them
                                           * blk.N.ffn_*_exps.E.weight); mlx-lm's stacked switch_mlp goes below */
        for (int64_t e = s->expert_begin; e < s->expert_end; e++) {
            char nm[96];
            snprintf(nm, sizeof nm, "blk.%d.ffn_gate_exps.%lld.weight", l, (long long)e);
            TP_CHECK_GOTO(load_mat(m, cfg, nm, F, E, s->ff_begin, s->ff_end, 0, E, &L->xgate[e], total), rc, out);
            snprintf(nm, sizeof nm, "blk.%d.ffn_up_exps.%lld.weight", l, (long long)e);
            TP_CHECK_GOTO(load_mat(m, cfg, nm, F, E, s->ff_begin, s->ff_end, 0, E, &L->xup[e], total), rc, out);
            snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.%lld.weight", l, (long long)e);
            TP_CHECK_GOTO(load_mat(m, cfg, nm, E, F, 0, E, s->ff_begin, s->ff_end, &L->xdown[e], total), rc, out);
        }
        return TP_OK;
    }
    /* A tpserve shard file holds exactly the held experts' slices, stacked like the whole tensors:
     * gate/up ne = [E, nf, nx], down ne = [nf, E, nx] (parallel/shard_file.c) */
    const int slice_file = m->sharded && m->shard.file_is_slice;
    if (whole || slice_file) {
        const int64_t x0 = s->expert_begin, nx = s->expert_end - s->expert_begin, nf = s->ff_end - s->ff_begin;
        TP_CHECK_GOTO(load_mat_st(m, cfg, gname, nx * nf, E, 0, nx * nf, 0, E, &L->xstack[0], total, nx), rc, out);
        TP_CHECK_GOTO(load_mat_st(m, cfg, uname, nx * nf, E, 0, nx * nf, 0, E, &L->xstack[1], total, nx), rc, out);
        TP_CHECK_GOTO(load_mat_st(m, cfg, dname, nx * E, nf, 0, nx * E, 0, nf, &L->xstack[2], total, nx), rc, out);
        if (m->dry_run) return TP_OK;
        for (int64_t j = 0; j < nx; j++) {
            struct tp_wmat *v[3] = {&L->xgate[x0 + j], &L->xup[x0 + j], &L->xdown[x0 + j]};
            for (int i = 0; i < 3; i++) {
                const int64_t rows = i == 2 ? E : nf;
                *v[i] = L->xstack[i];
                v[i]->owned = NULL;
                v[i]->owned_sb = NULL;
                v[i]->rows = rows;
                v[i]->data = L->xstack[i].data + (size_t)(j * rows) * L->xstack[i].row_bytes;
                if (L->xstack[i].scales) { /* MLX: the expert's rows of the scales and biases too */
                    v[i]->scales = L->xstack[i].scales + (size_t)(j * rows) * L->xstack[i].sb_row_bytes;
                    v[i]->biases = L->xstack[i].biases + (size_t)(j * rows) * L->xstack[i].sb_row_bytes;
                }
            }
        }
        return TP_OK;
    }
    const int64_t f0 = s->ff_begin, f1 = s->ff_end;
    for (int64_t e = s->expert_begin; e < s->expert_end; e++) {
        TP_CHECK_GOTO(load_mat_st(m, cfg, gname, X * F, E, e * F + f0, e * F + f1, 0, E, &L->xgate[e], total, X), rc, out);
        TP_CHECK_GOTO(load_mat_st(m, cfg, uname, X * F, E, e * F + f0, e * F + f1, 0, E, &L->xup[e], total, X), rc, out);
        TP_CHECK_GOTO(load_mat_st(m, cfg, dname, X * E, F, e * E, (e + 1) * E, f0, f1, &L->xdown[e], total, X), rc, out);
    }
out:
    return rc;
}

/* Called twice: with m->dry_run set it only validates and sums the bytes this
 * rank will hold (the progress total), then for real. */
static enum tp_status load_weights(tp_model_t *m, const struct tp_model_config *cfg, uint64_t total)
{
    enum tp_status rc = TP_OK;
    const struct tp_hparams *hp = &m->hp;
    const struct tp_model_shard *s = &m->shard;
    int64_t E = hp->n_embd, hd = hp->head_dim;
    char name[96];
    if (!m->layers) m->layers = calloc((size_t)hp->n_layer, sizeof(*m->layers));
    if (!m->layers) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory", m->path);
    TP_CHECK_GOTO(load_mat(m, cfg, "token_embd.weight", hp->n_vocab, E, 0, hp->n_vocab, 0, E, &m->tok_embd, total), rc, out);
    TP_CHECK_GOTO(load_vec(m, cfg, "output_norm.weight", E, 0, E, &m->output_norm, total), rc, out);
    if (has_tensor(m, "output.weight")) {
        TP_CHECK_GOTO(load_mat(m, cfg, "output.weight", hp->n_vocab, E, s->vocab_begin, s->vocab_end, 0, E, &m->output,
                               total),
                      rc, out);
    } else if (!m->dry_run) {
        /* tied: the output head is rows of the (replicated) embedding */
        m->hp.tied_embeddings = 1;
        m->output = m->tok_embd;
        m->output.owned = NULL;
        m->output.owned_sb = NULL;
        m->output.data = m->tok_embd.data + (size_t)s->vocab_begin * m->tok_embd.row_bytes;
        if (m->tok_embd.scales) { /* MLX: the same rows of the scales and biases */
            m->output.scales = m->tok_embd.scales + (size_t)s->vocab_begin * m->tok_embd.sb_row_bytes;
            m->output.biases = m->tok_embd.biases + (size_t)s->vocab_begin * m->tok_embd.sb_row_bytes;
        }
        m->output.rows = s->vocab_end - s->vocab_begin;
    }
    int64_t q0 = (int64_t)s->q_head_begin * hd, q1 = (int64_t)s->q_head_end * hd;
    int64_t k0 = (int64_t)s->kv_head_begin * hd, k1 = (int64_t)s->kv_head_end * hd;
    int64_t qf = (int64_t)hp->n_head * hd, kf = (int64_t)hp->n_head_kv * hd;
    m->hp.has_qkv_bias = has_tensor(m, "blk.0.attn_q.bias");
    m->hp.has_qk_norm = has_tensor(m, "blk.0.attn_q_norm.weight");
    if ((hp->arch == TP_ARCH_QWEN3 || hp->arch == TP_ARCH_QWEN3MOE) && !m->hp.has_qk_norm)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: %s model without blk.0.attn_q_norm.weight", m->path,
                            tp_arch_name(hp->arch));
    for (int l = 0; l < hp->n_layer; l++) {
        struct tp_layer *L = &m->layers[l];
#define NM(suffix) (snprintf(name, sizeof(name), "blk.%d.%s", l, suffix), name)
        TP_CHECK_GOTO(load_vec(m, cfg, NM("attn_norm.weight"), E, 0, E, &L->attn_norm, total), rc, out);
        /* gpt-oss names the norm before the FFN post_attention_norm */
        TP_CHECK_GOTO(load_vec(m, cfg, NM(hp->arch == TP_ARCH_GPTOSS ? "post_attention_norm.weight" : "ffn_norm.weight"),
                               E, 0, E, &L->ffn_norm, total),
                      rc, out);
        TP_CHECK_GOTO(load_mat(m, cfg, NM("attn_q.weight"), qf, E, q0, q1, 0, E, &L->wq, total), rc, out);
        TP_CHECK_GOTO(load_mat(m, cfg, NM("attn_k.weight"), kf, E, k0, k1, 0, E, &L->wk, total), rc, out);
        TP_CHECK_GOTO(load_mat(m, cfg, NM("attn_v.weight"), kf, E, k0, k1, 0, E, &L->wv, total), rc, out);
        TP_CHECK_GOTO(load_mat(m, cfg, NM("attn_output.weight"), E, qf, 0, E, q0, q1, &L->wo, total), rc, out);
        if (hp->n_expert > 0) {
            TP_CHECK_GOTO(load_experts(m, cfg, l, total), rc, out);
        } else {
            TP_CHECK_GOTO(load_mat(m, cfg, NM("ffn_gate.weight"), hp->n_ff, E, s->ff_begin, s->ff_end, 0, E, &L->wgate,
                                   total),
                          rc, out);
            TP_CHECK_GOTO(load_mat(m, cfg, NM("ffn_up.weight"), hp->n_ff, E, s->ff_begin, s->ff_end, 0, E, &L->wup, total),
                          rc, out);
            TP_CHECK_GOTO(load_mat(m, cfg, NM("ffn_down.weight"), E, hp->n_ff, 0, E, s->ff_begin, s->ff_end, &L->wdown,
                                   total),
                          rc, out);
        }
        if (m->hp.has_qkv_bias) {
            TP_CHECK_GOTO(load_vec(m, cfg, NM("attn_q.bias"), qf, q0, q1, &L->bq, total), rc, out);
            TP_CHECK_GOTO(load_vec(m, cfg, NM("attn_k.bias"), kf, k0, k1, &L->bk, total), rc, out);
            TP_CHECK_GOTO(load_vec(m, cfg, NM("attn_v.bias"), kf, k0, k1, &L->bv, total), rc, out);
        }
        if (m->hp.has_qk_norm) {
            TP_CHECK_GOTO(load_vec(m, cfg, NM("attn_q_norm.weight"), hd, 0, hd, &L->q_norm, total), rc, out);
            TP_CHECK_GOTO(load_vec(m, cfg, NM("attn_k_norm.weight"), hd, 0, hd, &L->k_norm, total), rc, out);
        }
        if (hp->arch == TP_ARCH_GPTOSS) {
            /* attn_output's bias (added once, after the all_sum) and one sink logit per Q head, this
             * rank's heads */
            TP_CHECK_GOTO(load_vec(m, cfg, NM("attn_output.bias"), E, 0, E, &L->bo, total), rc, out);
            TP_CHECK_GOTO(load_vec(m, cfg, NM("attn_sinks.weight"), hp->n_head, s->q_head_begin, s->q_head_end,
                                   &L->attn_sinks, total),
                          rc, out);
        }
        L->attn_window = tp_kv_layer_window(hp, l);
#undef NM
    }
    if (m->dry_run) {
        struct tp_tsrc_tensor rf;
        if (find_tensor(m, "rope_freqs.weight", 0, &rf)) m->weight_bytes += rf.n_bytes;
        return TP_OK;
    }
    m->weight_type = hp->n_expert > 0 ? m->layers[0].xgate[s->expert_begin].type : m->layers[0].wgate.type;
    /* rope frequencies (llama3 GGUFs carry rope_freqs.weight) */
    m->inv_freq = tp_aligned_alloc(64, (size_t)hp->rope_dim / 2 * sizeof(float) + 64);
    if (!m->inv_freq) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory", m->path);
    if (has_tensor(m, "rope_freqs.weight")) {
        float *ff = NULL;
        TP_CHECK_GOTO(load_vec(m, cfg, "rope_freqs.weight", hp->rope_dim / 2, 0, hp->rope_dim / 2, &ff, total), rc, out);
        for (int i = 0; i < hp->rope_dim / 2; i++)
            if (!(ff[i] > 0.0f)) {
                tp_aligned_free(ff);
                return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: rope_freqs.weight[%d] is not positive", m->path, i);
            }
        if (m->hp.rope_scaling == TP_ROPE_SCALING_NONE) m->hp.rope_scaling = TP_ROPE_SCALING_LLAMA3;
        tp_op_rope_freqs(m->inv_freq, &m->hp, ff);
        tp_aligned_free(ff);
    } else {
        tp_op_rope_freqs(m->inv_freq, &m->hp, NULL);
    }
out:
    return rc;
}

static void *zalloc(size_t n, size_t elem, int *fail)
{
    size_t bytes;
    if (tp_mul_size(n, elem, &bytes) != 0) {
        *fail = 1;
        return NULL;
    }
    void *p = tp_aligned_alloc(64, bytes ? bytes : 64);
    if (!p) *fail = 1;
    else memset(p, 0, bytes);
    return p;
}

static enum tp_status alloc_state(tp_model_t *m)
{
    const struct tp_hparams *hp = &m->hp;
    int fail = 0;
    size_t B = (size_t)m->n_batch, E = (size_t)hp->n_embd;
    /* KV cache: per layer (n_seq, nkv, cap, row); a sliding-window layer keeps a ring of window + n_batch
     * rows (a prefill chunk writes all its keys before its first token's window is read) */
    m->kv_off = zalloc((size_t)hp->n_layer, sizeof(size_t), &fail);
    m->kv_cap = zalloc((size_t)hp->n_layer, sizeof(int), &fail);
    if (fail) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory", m->path);
    size_t cache = 0;
    m->n_ring = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        struct tp_layer *L = &m->layers[l];
        if (L->attn_window == 0 && hp->sliding_window > 0 && hp->swa_period <= 0) L->attn_window = hp->sliding_window;
        const int64_t ring = (int64_t)L->attn_window + m->n_batch; /* as tp_kv_layer_positions */
        const int64_t cap = tp_kv_cap_rows(m->kv_type, L->attn_window > 0 && ring < m->n_ctx ? ring : m->n_ctx);
        if (cap > INT32_MAX) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: KV cache size overflows", m->path);
        m->kv_cap[l] = (int)cap;
        m->n_ring += m->kv_cap[l] < m->n_ctx;
        size_t layer = 0;
        m->kv_off[l] = cache;
        if (tp_mul_size((size_t)m->n_seq * (size_t)m->nkv, (size_t)m->kv_cap[l], &layer) != 0 ||
            tp_mul_size(layer, m->kv_row_bytes, &layer) != 0 || cache + layer < cache)
            return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: KV cache size overflows", m->path);
        cache += layer;
    }
    m->kv_total_bytes = cache;
    m->k_cache = zalloc(cache, 1, &fail);
    m->v_cache = zalloc(cache, 1, &fail);
    if (fail)
        return tp_error_set(&m->err, TP_ERR_NOMEM,
                            "%s: cannot allocate the KV cache (2 x %zu MiB for n_ctx %d x n_seq %d, %s); lower --ctx-size "
                            "or use a smaller --kv-type",
                            m->path, cache >> 20, m->n_ctx, m->n_seq, tp_kv_type_name(m->kv_type));
    m->seq_hi = zalloc((size_t)m->n_seq, sizeof(int), &fail);
    m->seq_base = zalloc((size_t)m->n_seq, sizeof(int), &fail);
    m->seq_len = zalloc((size_t)m->n_seq, sizeof(int), &fail);
    m->seq_tmp = zalloc((size_t)m->n_seq, sizeof(int), &fail);
    m->seq_last = zalloc((size_t)m->n_seq, sizeof(int), &fail);
    m->x = zalloc(B * E, sizeof(float), &fail);
    m->xb = zalloc(B * E, sizeof(float), &fail);
    m->proj = zalloc(B * E, sizeof(float), &fail);
    m->q = zalloc(B * (size_t)m->q_dim, sizeof(float), &fail);
    m->att = zalloc(B * (size_t)m->q_dim, sizeof(float), &fail);
    m->k = zalloc(B * (size_t)m->kv_dim, sizeof(float), &fail);
    m->v = zalloc(B * (size_t)m->kv_dim, sizeof(float), &fail);
    /* mixture of experts: one row per (token, selected expert) for the expert FFNs */
    const size_t R = B * (size_t)(hp->n_expert > 0 ? hp->n_expert_used : 1);
    m->n_rows_max = (int)R;
    if (hp->n_expert > 0) {
        m->router_logits = zalloc(B * (size_t)hp->n_expert, sizeof(float), &fail);
        m->moe_sel = zalloc(R, sizeof(int), &fail);
        m->moe_wsel = zalloc(R, sizeof(float), &fail);
        m->moe_off = zalloc((size_t)hp->n_expert + 1, sizeof(int), &fail);
        m->moe_pair_tok = zalloc(R, sizeof(int), &fail);
        m->moe_pair_w = zalloc(R, sizeof(float), &fail);
        m->moe_active = zalloc((size_t)hp->n_expert, sizeof(int), &fail);
        m->moe_x = zalloc(R * E, sizeof(float), &fail);
    }
    const size_t hbn = TP_MAX(R * (size_t)m->n_ff_l, B * (size_t)hp->n_ff_shexp);
    m->hb = zalloc(hbn, sizeof(float), &fail);
    m->hb2 = zalloc(hbn, sizeof(float), &fail);
    /* attention: query heads per KV head, work list, partials and per-thread scratch */
    {
        const int group = hp->n_head / hp->n_head_kv;
        int gmax = 1;
        m->attn_qh0 = zalloc((size_t)m->nkv, sizeof(int), &fail);
        m->attn_nqh = zalloc((size_t)m->nkv, sizeof(int), &fail);
        if (fail) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory", m->path);
        for (int kvh = 0; kvh < m->nkv; kvh++) {
            const int g0 = (m->kv_head0 + kvh) * group, g1 = g0 + group; /* global Q heads of this KV head */
            const int h0 = TP_MAX(g0, m->q_head0), h1 = TP_MIN(g1, m->q_head0 + m->nq);
            m->attn_qh0[kvh] = h1 > h0 ? h0 - m->q_head0 : 0;
            m->attn_nqh[kvh] = TP_MAX(0, h1 - h0);
            gmax = TP_MAX(gmax, m->attn_nqh[kvh]);
        }
        m->attn_qb = TP_MAX(1, 64 / gmax);
        m->attn_rows_max = m->attn_qb * gmax;
        m->attn_parts_max = 8 * m->n_threads + 8;
        m->attn_items_max = m->n_batch * m->nkv + m->attn_parts_max;
        m->attn_items = zalloc((size_t)m->attn_items_max, sizeof(struct tp_attn_item), &fail);
        m->attn_merge = zalloc((size_t)m->attn_parts_max, sizeof(struct tp_attn_merge), &fail);
        m->attn_part = zalloc((size_t)m->attn_parts_max, TP_ATTN_PART_FLOATS(m->hd, m->attn_rows_max) * sizeof(float),
                              &fail);
        m->attn_scratch_n = (tp_attn_scratch_floats(m->hd, m->attn_rows_max) + 15) & ~(size_t)15;
        m->attn_scratch = zalloc((size_t)m->n_threads, m->attn_scratch_n * sizeof(float), &fail);
    }
    m->rope_cs = zalloc(B * (size_t)hp->rope_dim, sizeof(float), &fail);
    m->out_rows = zalloc(B, sizeof(int), &fail);
    /* prepared activations: widest input is max(n_embd, q_dim, n_ff_l) for any weight type in use */
    int64_t wmax = TP_MAX(TP_MAX((int64_t)E, (int64_t)m->q_dim), TP_MAX((int64_t)m->n_ff_l, (int64_t)hp->n_ff_shexp));
    size_t amax = 0;
    for (int t = 0; t < TP_WTYPE_COUNT; t++)
        if (tp_wtype_supported((enum tp_wtype)t) && tp_wtype_block_elems((enum tp_wtype)t) > 0 &&
            wmax % tp_wtype_block_elems((enum tp_wtype)t) == 0)
            amax = TP_MAX(amax, tp_kern_act_row_bytes((enum tp_wtype)t, wmax));
    amax = (amax + 63) & ~(size_t)63;
    m->act_row_max = amax;
    for (int i = 0; i < 3; i++) m->act[i] = zalloc(R, amax, &fail);
    m->prep_scratch = zalloc((size_t)m->n_threads, amax, &fail);
    m->prep_split_min = TP_FWD_PREP_SPLIT;
    if (fail) return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory for activations (n_batch %d)", m->path, m->n_batch);
    return TP_OK;
}

/* A GGUF file: hyper-parameters, name, chat template and tokenizer from its metadata. */
static enum tp_status open_gguf(tp_model_t *m)
{
    enum tp_status rc = TP_OK;
    {
        struct tp_error gerr = {0};
        rc = tp_gguf_open(m->path, &m->gguf, &gerr);
        if (rc != TP_OK) {
            tp_error_set(&m->err, rc, "%s", gerr.msg);
            goto out;
        }
    }
    TP_CHECK_GOTO(read_hparams(m), rc, out);
    {
        struct tp_error qerr = {0};
        rc = tp_mlx_read_quant_gguf(m->gguf, &m->mlxq, &qerr); /* a shard file cut from an MLX directory */
        if (rc != TP_OK) {
            tp_error_set(&m->err, rc, "%s", qerr.msg);
            goto out;
        }
    }
    {
        const char *nm = NULL;
        if (tp_gguf_get_str(m->gguf, "general.name", &nm) == TP_OK && nm[0]) {
            m->name = strdup(nm);
        } else {
            const char *b = strrchr(m->path, '/');
            b = b ? b + 1 : m->path;
            m->name = strdup(b);
            char *dot = m->name ? strrchr(m->name, '.') : NULL;
            if (dot && dot != m->name) *dot = '\0';
        }
        const char *ct = NULL;
        if (tp_gguf_get_str(m->gguf, "tokenizer.chat_template", &ct) == TP_OK) m->chat_template = strdup(ct);
        if (!m->name || (ct && !m->chat_template)) {
            rc = tp_error_set(&m->err, TP_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    {
        struct tp_error terr = {0};
        rc = tp_tokenizer_from_gguf(m->path, &m->tok, &terr);
        if (rc != TP_OK) {
            tp_error_set(&m->err, rc, "%s", terr.msg[0] ? terr.msg : "tokenizer could not be loaded");
            goto out;
        }
    }
    if (m->vocab_only) m->hp.n_vocab = tp_tokenizer_n_vocab(m->tok);
out:
    return rc;
}

/* A Hugging Face directory: config.json, the safetensors set, tokenizer.json
 * (+ tokenizer_config.json), the chat template; the name is the directory's. */
static enum tp_status open_hf(tp_model_t *m)
{
    enum tp_status rc = TP_OK;
    char *tj = NULL, *tc = NULL;
    struct tp_error e = {0};
    struct tp_hf_config hc;
    rc = tp_hf_read_config(m->path, &hc, &e);
    if (rc != TP_OK) return tp_error_set(&m->err, rc, "%s", e.msg);
    m->hp = hc.hp;
    {
        size_t len = strlen(m->path);
        while (len > 1 && m->path[len - 1] == '/') len--;
        size_t b = len;
        while (b > 0 && m->path[b - 1] != '/') b--;
        m->name = malloc(len - b + 1);
        if (!m->name) return tp_error_set(&m->err, TP_ERR_NOMEM, "out of memory");
        memcpy(m->name, m->path + b, len - b);
        m->name[len - b] = '\0';
    }
    rc = tp_hf_chat_template(m->path, &m->chat_template, &e);
    if (rc != TP_OK) return tp_error_set(&m->err, rc, "%s", e.msg);
    size_t pl = strlen(m->path) + 32;
    tj = malloc(pl);
    tc = malloc(pl);
    if (!tj || !tc) {
        rc = tp_error_set(&m->err, TP_ERR_NOMEM, "out of memory");
        goto out;
    }
    snprintf(tj, pl, "%s/tokenizer.json", m->path);
    snprintf(tc, pl, "%s/tokenizer_config.json", m->path);
    if (access(tj, R_OK) != 0) {
        rc = tp_error_set(&m->err, TP_ERR_NOT_FOUND,
                          "%s: no tokenizer.json in this Hugging Face directory (copy it from the model's repository)",
                          m->path);
        goto out;
    }
    rc = tp_tokenizer_from_json(tj, access(tc, R_OK) == 0 ? tc : NULL, &m->tok, &e);
    if (rc != TP_OK) {
        tp_error_set(&m->err, rc, "%s", e.msg[0] ? e.msg : "tokenizer could not be loaded");
        goto out;
    }
    /* generation_config.json's eos_token_id (e.g. Llama 3.1: <|end_of_text|>, <|eom_id|>, <|eot_id|>) end
     * generation too; a file the server will refuse to read for its sampling values is its to report */
    struct tp_model_gen_defaults gd;
    struct tp_error ge = {0};
    if (tp_model_gen_defaults_read(m->path, &gd, &ge) == TP_OK)
        for (int i = 0; i < gd.n_eos; i++) tp_tokenizer_mark_eog(m->tok, gd.eos_ids[i]);
    if (tp_tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
        rc = tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tokenizer.json has %d tokens but config.json vocab_size is %d",
                          m->path, tp_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
        goto out;
    }
    rc = tp_st_open(m->path, &m->st, &e);
    if (rc != TP_OK) {
        tp_error_set(&m->err, rc, "%s", e.msg);
        goto out;
    }
    rc = tp_mlx_read_quant(m->path, &m->mlxq, &e); /* MLX quantized directories */
    if (rc != TP_OK) {
        tp_error_set(&m->err, rc, "%s", e.msg);
        goto out;
    }
    if (!has_tensor(m, "output.weight")) {
        if (!m->hp.tied_embeddings) {
            rc = tp_error_set(&m->err, TP_ERR_FORMAT,
                              "%s: no lm_head.weight and config.json tie_word_embeddings is false: the output head is "
                              "missing (incomplete download?)",
                              m->path);
            goto out;
        }
    } else {
        m->hp.tied_embeddings = 0;
    }
out:
    free(tj);
    free(tc);
    return rc;
}

/* Opens cfg->path: a Hugging Face directory, or a GGUF file (a directory without config.json, or one
 * file of a Hugging Face model, is refused naming what to give instead). */
static enum tp_status open_source(tp_model_t *m, const char *path)
{
    if (tp_hf_is_dir(path)) return open_hf(m);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return tp_error_set(&m->err, TP_ERR_NOT_FOUND,
                            "%s: a directory without config.json; give a GGUF file or a Hugging Face model directory "
                            "(config.json, model.safetensors[.index.json], tokenizer.json)",
                            path);
    size_t pl = strlen(path);
    static const char *const hf_files[] = {".safetensors", ".safetensors.index.json", "config.json"};
    for (size_t i = 0; i < TP_ARRAY_LEN(hf_files); i++) {
        size_t sl = strlen(hf_files[i]);
        if (pl >= sl && strcmp(path + pl - sl, hf_files[i]) == 0)
            return tp_error_set(&m->err, TP_ERR_INVALID_ARG,
                                "%s: a file of a Hugging Face model; give its directory (with config.json, "
                                "tokenizer.json and the safetensors) instead",
                                path);
    }
    return open_gguf(m);
}

/* hp.n_vocab from token_embd.weight's shape. */
static enum tp_status read_vocab_size(tp_model_t *m)
{
    struct tp_tsrc_tensor tte;
    const struct tp_tsrc_tensor *te = &tte;
    if (!find_tensor(m, "token_embd.weight", 1, &tte)) return m->err.status;
    /* MLX packed (U32): the unpacked width depends on the bits, which load_mat checks against config.json */
    const int mlx_packed = te->mlx_packed;
    if ((te->ne[0] != m->hp.n_embd && !mlx_packed) || te->ne[1] < 1 || te->ne[1] > INT32_MAX || te->n_dims != 2)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld] (want [%d, n_vocab])",
                            m->path, te->name, (long long)te->ne[0], (long long)te->ne[1], m->hp.n_embd);
    m->hp.n_vocab = (int)te->ne[1];
    return TP_OK;
}

/* This rank's widths from m->shard (checked by check_shard). */
static void set_shard_dims(tp_model_t *m)
{
    const struct tp_model_shard *s = &m->shard;
    m->hd = m->hp.head_dim;
    m->nq = s->q_head_end - s->q_head_begin;
    m->nkv = s->kv_head_end - s->kv_head_begin;
    m->q_head0 = s->q_head_begin;
    m->kv_head0 = s->kv_head_begin;
    m->q_dim = m->nq * m->hd;
    m->kv_dim = m->nkv * m->hd;
    m->n_ff_l = s->ff_end - s->ff_begin;
    m->n_vocab_l = s->vocab_end - s->vocab_begin;
    m->expert0 = s->expert_begin;
    m->n_expert_l = s->expert_end - s->expert_begin;
}

/* The weights in two passes: a dry run that counts the bytes, then the load. */
static enum tp_status load_all_weights(tp_model_t *m, const struct tp_model_config *cfg)
{
    m->dry_run = 1;
    enum tp_status rc = load_weights(m, cfg, 0);
    m->dry_run = 0;
    if (rc != TP_OK) return rc;
    uint64_t total = m->weight_bytes;
    m->weight_bytes = 0;
    return load_weights(m, cfg, total);
}

/* Context, batch and KV cache settings, the compute pool, the bytes of this rank's experts. */
static enum tp_status setup_runtime(tp_model_t *m, const struct tp_model_config *cfg)
{
    m->n_ctx = cfg->n_ctx > 0 ? cfg->n_ctx : TP_MIN(m->hp.n_ctx_train, 4096);
    m->n_seq = cfg->n_seq;
    m->n_batch = cfg->n_batch;
    m->keep_layout = cfg->keep_layout != 0;
    m->kv_type = cfg->kv_f16 ? TP_KV_F16 : tp_kv_type_resolve(cfg->kv_type, m->hd);
    m->kv_row_bytes = tp_kv_row_bytes(m->kv_type, m->hd);
    if (!cfg->vocab_only && m->kv_row_bytes == 0)
        return tp_error_set(&m->err, TP_ERR_INVALID_ARG,
                            "KV cache type %s cannot hold head_dim %d (q8_0 needs a multiple of 8, bf16 of 16); use "
                            "f16 or f32",
                            tp_kv_type_name(m->kv_type), m->hd);
    struct tp_pool_config pc = tp_pool_default_config();
    pc.n_threads = cfg->n_threads > 0 ? cfg->n_threads : tp_cpu_count();
    if (tp_pool_init(&pc, &m->pool) != TP_OK)
        return tp_error_set(&m->err, TP_ERR_NOMEM, "cannot start %d compute threads", pc.n_threads);
    m->n_threads = tp_pool_size(m->pool);
    if (tp_worksplit_init(m->n_threads, &m->split) != TP_OK)
        return tp_error_set(&m->err, TP_ERR_NOMEM, "out of memory for %d compute threads' work shares", m->n_threads);
    for (int l = 0; m->hp.n_expert > 0 && l < m->hp.n_layer; l++)
        for (int e = m->expert0; e < m->expert0 + m->n_expert_l; e++) {
            const struct tp_layer *L = &m->layers[l];
            m->expert_weight_bytes += (uint64_t)L->xgate[e].rows * L->xgate[e].row_bytes +
                                      (uint64_t)L->xup[e].rows * L->xup[e].row_bytes +
                                      (uint64_t)L->xdown[e].rows * L->xdown[e].row_bytes;
        }
    return TP_OK;
}

enum tp_status tp_model_init(const struct tp_model_config *cfg, tp_model_t **out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    tp_model_t *m = NULL;
    if (!out) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_model_init: out is NULL");
    *out = NULL;
    if (!cfg || !cfg->path) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_model_init: no model path given");
    if (cfg->n_threads < 0 || cfg->n_ctx < 0 || cfg->n_seq < 1 || cfg->n_batch < 1 || cfg->n_seq > 4096 ||
        cfg->n_batch > (1 << 20) || cfg->n_threads > 1024)
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "tp_model_init: bad config (n_threads %d, n_ctx %d, n_seq %d, n_batch %d)", cfg->n_threads,
                            cfg->n_ctx, cfg->n_seq, cfg->n_batch);
    m = calloc(1, sizeof(*m));
    if (!m) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", cfg->path);
    tp_op_init();
    m->path = strdup(cfg->path);
    if (!m->path) {
        rc = tp_error_set(&m->err, TP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    m->vocab_only = cfg->vocab_only;
    TP_CHECK_GOTO(open_source(m, cfg->path), rc, fail);
    if (cfg->vocab_only) {
        *out = m;
        return TP_OK;
    }
    TP_CHECK_GOTO(read_vocab_size(m), rc, fail);
    TP_CHECK_GOTO(check_shard(m, cfg->shard), rc, fail);
    set_shard_dims(m);
    TP_CHECK_GOTO(load_all_weights(m, cfg), rc, fail);
    TP_CHECK_GOTO(setup_runtime(m, cfg), rc, fail);
    if (!cfg->keep_layout) TP_CHECK_GOTO(tp_model_repack(m), rc, fail);
    TP_CHECK_GOTO(alloc_state(m), rc, fail);
    tp_log(TP_LOG_DEBUG, MODULE, "%s: %s, %d layers, embd %d, heads %d/%d, ff %d, vocab %d, %.1f MiB weights held",
           m->path, tp_arch_name(m->hp.arch), m->hp.n_layer, m->hp.n_embd, m->hp.n_head, m->hp.n_head_kv, m->hp.n_ff,
           m->hp.n_vocab, (double)m->weight_bytes / 1048576.0);
    *out = m;
    return TP_OK;
fail:
    if (err) tp_error_set(err, rc, "%s", m->err.msg[0] ? m->err.msg : tp_status_str(rc));
    tp_model_free(m);
    return rc;
}

/* Everything the model owns except the struct itself. */
static void free_contents(tp_model_t *m)
{
    tp_pool_free(m->pool);
    tp_worksplit_free(m->split);
    if (m->layers) {
        for (int l = 0; l < m->hp.n_layer; l++) {
            struct tp_layer *L = &m->layers[l];
            tp_aligned_free(L->attn_norm);
            tp_aligned_free(L->ffn_norm);
            tp_aligned_free(L->bq);
            tp_aligned_free(L->bk);
            tp_aligned_free(L->bv);
            tp_aligned_free(L->q_norm);
            tp_aligned_free(L->k_norm);
            tp_aligned_free(L->attn_sinks);
            tp_aligned_free(L->bo);
            tp_aligned_free(L->brouter);
            tp_aligned_free(L->xgate_b);
            tp_aligned_free(L->xup_b);
            tp_aligned_free(L->xdown_b);
            free_mat(&L->wq);
            free_mat(&L->wk);
            free_mat(&L->wv);
            free_mat(&L->wo);
            free_mat(&L->wgate);
            free_mat(&L->wup);
            free_mat(&L->wdown);
            free_mat(&L->wrouter);
            free_mat(&L->sgate);
            free_mat(&L->sup);
            free_mat(&L->sdown);
            tp_aligned_free(L->sgate_inp);
            for (int e = 0; L->xgate && e < m->hp.n_expert; e++) {
                free_mat(&L->xgate[e]);
                free_mat(&L->xup[e]);
                free_mat(&L->xdown[e]);
            }
            for (int i = 0; i < 3; i++) free_mat(&L->xstack[i]);
            for (int i = 0; i < L->n_xarena; i++) tp_aligned_free(L->xarena[i]);
            free(L->xarena);
            free(L->xgate);
            free(L->xup);
            free(L->xdown);
        }
        free(m->layers);
    }
    free_mat(&m->tok_embd);
    free_mat(&m->output);
    tp_aligned_free(m->warena);
    tp_aligned_free(m->output_norm);
    tp_aligned_free(m->inv_freq);
    tp_aligned_free(m->k_cache);
    tp_aligned_free(m->v_cache);
    tp_aligned_free(m->seq_len);
    tp_aligned_free(m->seq_tmp);
    tp_aligned_free(m->seq_last);
    tp_aligned_free(m->x);
    tp_aligned_free(m->xb);
    tp_aligned_free(m->proj);
    tp_aligned_free(m->q);
    tp_aligned_free(m->att);
    tp_aligned_free(m->k);
    tp_aligned_free(m->v);
    tp_aligned_free(m->hb);
    tp_aligned_free(m->hb2);
    tp_aligned_free(m->router_logits);
    tp_aligned_free(m->moe_sel);
    tp_aligned_free(m->moe_wsel);
    tp_aligned_free(m->moe_off);
    tp_aligned_free(m->moe_pair_tok);
    tp_aligned_free(m->moe_pair_w);
    tp_aligned_free(m->moe_active);
    tp_aligned_free(m->moe_x);
    for (int i = 0; i < 3; i++) tp_aligned_free(m->act[i]);
    tp_aligned_free(m->prep_scratch);
    tp_aligned_free(m->kv_off);
    tp_aligned_free(m->kv_cap);
    tp_aligned_free(m->seq_hi);
    tp_aligned_free(m->seq_base);
    tp_aligned_free(m->attn_qh0);
    tp_aligned_free(m->attn_nqh);
    tp_aligned_free(m->attn_items);
    tp_aligned_free(m->attn_merge);
    tp_aligned_free(m->attn_part);
    tp_aligned_free(m->attn_scratch);
    tp_aligned_free(m->rope_cs);
    tp_aligned_free(m->out_rows);
    tp_tokenizer_free(m->tok);
    tp_gguf_close(m->gguf);
    tp_st_close(m->st);
    tp_mlx_quant_free(m->mlxq);
    free(m->name);
    free(m->chat_template);
    free(m->path);
}

void tp_model_free(tp_model_t *m)
{
    if (!m) return;
    free_contents(m);
    free(m);
}

enum tp_status tp_model_reload(tp_model_t *m, const struct tp_model_shard *shard, struct tp_error *err)
{
    if (!m || m->vocab_only)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_model_reload: no model, or a vocabulary-only one");
    struct tp_model_config cfg = tp_model_default_config();
    cfg.n_threads = m->n_threads;
    cfg.n_ctx = m->n_ctx;
    cfg.n_seq = m->n_seq;
    cfg.n_batch = m->n_batch;
    cfg.kv_type = m->kv_type;
    cfg.keep_layout = m->keep_layout;
    cfg.shard = shard;
    /* what callers hold pointers to stays: tokenizer, strings, hparams */
    tp_tokenizer_t *tok = m->tok;
    char *name = m->name, *tmpl = m->chat_template, *path = m->path;
    struct tp_hparams hp = m->hp;
    m->tok = NULL;
    m->name = m->chat_template = m->path = NULL;
    cfg.path = path;
    /* the old slice goes first, so the peak is one slice, not two; what other threads read through
     * m while the new slice loads (tokenizer, strings, hparams) is back in m before the load */
    free_contents(m);
    memset(m, 0, sizeof *m);
    m->tok = tok;
    m->name = name;
    m->chat_template = tmpl;
    m->path = path;
    m->hp = hp;
    tp_model_t *fresh = NULL;
    enum tp_status rc = tp_model_init(&cfg, &fresh, err);
    if (rc == TP_OK) {
        /* the pool's workers take their context per run: nothing points at fresh */
        tp_tokenizer_t *ftok = fresh->tok;
        char *fname = fresh->name, *ftmpl = fresh->chat_template, *fpath = fresh->path;
        fresh->tok = tok;
        fresh->name = name;
        fresh->chat_template = tmpl;
        fresh->path = path;
        fresh->hp = hp;
        *m = *fresh;
        tp_tokenizer_free(ftok);
        free(fname);
        free(ftmpl);
        free(fpath);
        free(fresh);
    } else {
        tp_error_set(&m->err, rc, "%s", err && err->msg[0] ? err->msg : tp_status_str(rc));
    }
    return rc;
}

const char *tp_model_last_error(const tp_model_t *m) { return m ? tp_error_msg(&m->err) : ""; }
const struct tp_hparams *tp_model_hparams(const tp_model_t *m) { return &m->hp; }
tp_tokenizer_t *tp_model_tokenizer(const tp_model_t *m) { return m->tok; }
const char *tp_model_name(const tp_model_t *m) { return m->name; }
const char *tp_model_chat_template(const tp_model_t *m) { return m->chat_template; }
uint64_t tp_model_weight_bytes(const tp_model_t *m) { return m->weight_bytes; }
uint64_t tp_model_expert_weight_bytes(const tp_model_t *m) { return m->expert_weight_bytes; }
enum tp_wtype tp_model_weight_type(const tp_model_t *m) { return m->weight_type; }
int tp_model_n_ctx(const tp_model_t *m) { return m->n_ctx; }
uint64_t tp_model_kv_bytes(const tp_model_t *m)
{
    return 2ull * m->kv_total_bytes;
}
enum tp_kv_type tp_model_kv_type(const tp_model_t *m) { return m->kv_type; }
uint64_t tp_model_kv_head_bytes_read(const tp_model_t *m, int pos)
{
    uint64_t b = 0;
    for (int l = 0; m && m->layers && pos >= 0 && l < m->hp.n_layer; l++) {
        const int W = m->layers[l].attn_window;
        const int n = W > 0 && W < pos + 1 ? W : pos + 1;
        b += 2ull * (uint64_t)n * m->kv_row_bytes;
    }
    return b;
}
int tp_model_n_seq(const tp_model_t *m) { return m->n_seq; }
int tp_model_n_threads(const tp_model_t *m) { return m->n_threads; }

/*
 * model/forward/model_impl.h - private: the layout of struct tp_model shared by the
 * loader (model_load.c) and the forward pass (forward.c), and the small
 * numeric helpers of ops.c.
 *
 * Every size below is LOCAL to this rank's shard ("nq" held query heads,
 * "nkv" held KV heads, "n_ff_l" held FFN columns, "n_vocab_l" held vocab
 * rows); with no shard they equal the model's.  All buffers are allocated in
 * tp_model_init; tp_model_forward allocates nothing.
 */
#ifndef TP_MODEL_MODEL_IMPL_H
#define TP_MODEL_MODEL_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "model/gguf.h"
#include "model/kernels.h"
#include "model/model.h"
#include "model/safetensors.h"

/* A weight matrix of rows x cols (cols contiguous), in the file's type. */
struct tp_wmat {
    const uint8_t *data;  /* row r at data + r * row_bytes; into the mmap or `owned` */
    void *owned;          /* aligned buffer when read with pread (shards), else NULL */
    enum tp_wtype type;
    int64_t rows, cols;
    size_t row_bytes;
    /* MLX affine types only (tp_wtype_mlx_bits != 0), else NULL: per-group scales and
     * biases, (rows, cols / group) each, row r at scales + r * sb_row_bytes, fp16 or
     * (sb_bf16) bf16; into the mapping, or into owned_sb (shards: scales, then biases) */
    const uint8_t *scales, *biases;
    void *owned_sb;
    size_t sb_row_bytes;
    int sb_bf16;
    int x16; /* quantized, re-laid 16 rows at a time (kernels.h "x16") into owned by tp_model_repack;
              * row r is then NOT at data + r * row_bytes (tp_kern_unpack_x16_row) */
};

struct tp_layer {
    float *attn_norm;         /* (n_embd) owned */
    float *ffn_norm;          /* (n_embd) owned */
    float *bq, *bk, *bv;      /* (nq*hd), (nkv*hd), (nkv*hd) owned; NULL without QKV bias */
    float *q_norm, *k_norm;   /* (hd) owned; NULL without q/k norm */
    int32_t attn_window; /* sliding-window size in positions; 0 = full attention */
    float *attn_sinks; /* (nq) owned: learned sink logit per held Q head; NULL without sinks */
    float *bo;                /* (n_embd) owned: attn_output bias, added after the all_sum; NULL without */
    struct tp_wmat wq;        /* (nq*hd, n_embd) */
    struct tp_wmat wk, wv;    /* (nkv*hd, n_embd) */
    struct tp_wmat wo;        /* (n_embd, nq*hd) */
    struct tp_wmat wgate, wup; /* (n_ff_l, n_embd) */
    struct tp_wmat wdown;     /* (n_embd, n_ff_l) */
    /* mixture of experts (hp.n_expert > 0; the dense wgate/wup/wdown are then unused) */
    struct tp_wmat wrouter;   /* ffn_gate_inp (n_expert, n_embd), whole on every rank */
    float *brouter;           /* (n_expert) owned: router bias (gpt-oss); NULL without */
    /* gpt-oss expert biases of the held experts, owned (NULL without): gate / up (n_expert_l, n_ff_l)
     * the held columns, down (n_expert_l, n_embd) on the rank whose ff_begin is 0 (added once per
     * expert); expert e's row is e - expert0 */
    float *xgate_b, *xup_b, *xdown_b;
    struct tp_wmat *xgate, *xup; /* (n_expert) per expert (n_ff_l, n_embd); rows 0 for experts not held */
    struct tp_wmat *xdown;    /* (n_expert) per expert (n_embd, n_ff_l); rows 0 for experts not held */
    /* the stacked ffn_{gate,up,down}_exps tensors when held whole (the per-expert
     * matrices are then views into them: owned NULL); data NULL otherwise */
    struct tp_wmat xstack[3];
    /* the held experts' re-laid (x16) matrices, in n_xarena buffers of consecutive experts, owned
     * (repack.c; the per-expert matrices are views into them, owned NULL); NULL when none was re-laid */
    uint8_t **xarena;
    int n_xarena;
    /* Qwen2-MoE shared expert (on the rank holding it, else rows 0): gate/up (n_ff_shexp, n_embd),
     * down (n_embd, n_ff_shexp), and its gate vector (n_embd) owned (NULL where not held) */
    struct tp_wmat sgate, sup, sdown;
    float *sgate_inp;
};

/* Up to TP_FWD_PREP_SPLIT_ROWS activation rows of at least TP_FWD_PREP_SPLIT values are prepared split by
 * blocks over the threads (forward.c prep_act; below it a row is prepared whole, by the calling thread or
 * the pool by rows, as waking the pool for a small row costs more than it saves). */
#define TP_FWD_PREP_SPLIT 1024
#define TP_FWD_PREP_SPLIT_ROWS 8

enum tp_fwd_phase {
    TP_PH_PREP = 0, TP_PH_QKV, TP_PH_ATTN, TP_PH_O, TP_PH_FFN_UP, TP_PH_DOWN, TP_PH_LOGITS,
    TP_PH_ROUTER, TP_PH_MOE_UP, TP_PH_MOE_DOWN, TP_PH_SHEXP_UP, TP_PH_SHEXP_DOWN, TP_PH_ATTN_MERGE,
    TP_PH_PREP_BLOCKS
};

/* ---- attn.c: tiled attention over the KV cache ---- */

/* Key positions per tile of the attention kernel. */
#define TP_ATTN_KB 64

/* What the attention kernel needs to know of one layer's cache of one (sequence, KV head). */
struct tp_attn_geom {
    int hd;                /* head dim */
    enum tp_kv_type type;  /* element type of the rows */
    size_t row_bytes;      /* bytes of one position's row (tp_kv_row_bytes) */
    int cap;               /* rows held: position p is row p % cap (cap = n_ctx for full layers) */
    int window;            /* sliding window (a query at p sees keys max(0, p-window+1) .. p); 0: all keys <= p */
    float scale;           /* score scale, 1/sqrt(hd) */
};

/* The first key position a query at position p sees (its window's start; 0 without a window). */
static inline int tp_attn_first_key(const struct tp_attn_geom *g, int p)
{
    return g->window > 0 ? TP_MAX(0, p - g->window + 1) : 0;
}

/*
 * Query rows of one work item: nt consecutive positions pos0.. of one
 * sequence, times ng query heads sharing one KV head; row r = i * ng + h is
 * token i, head h, its vector at q + i * q_stride + h * hd (hd floats).
 */
struct tp_attn_rows {
    const float *q;
    size_t q_stride;
    int nt, ng, pos0;
    const float *sinks;    /* (ng) sink logit per head of the item, or NULL */
};

/*
 * Attention of rows over the keys at positions [k0, k1) (each row further
 * limited to its causal window), key tile by key tile with an online softmax
 * (no score matrix beyond one tile).  kc / vc: row 0 of this (layer,
 * sequence, KV head)'s keys / values.  part == NULL: the finished output,
 * row r at o + i * o_stride + h * hd (softmax denominator including the
 * sinks); else the unnormalised partial (row max, sum of exponentials, then
 * hd weighted values per row; tp_attn_merge finishes it).  scratch:
 * tp_attn_scratch_floats(hd, rows) floats.  Rows whose window misses [k0, k1)
 * get max -inf and sum 0.
 */
void tp_attn_tile(const struct tp_attn_geom *g, const struct tp_attn_rows *r, const uint8_t *kc, const uint8_t *vc,
                  int k0, int k1, float *scratch, float *o, size_t o_stride, float *part);
/* The attention paths, in order of preference: float32 plain C, AVX2, AVX-512; AVX512_BF16 vector products
 * and AMX-BF16 tiles (bf16 operands, float32 accumulation: attn_bf16.c, attn_amx.c; head_dim % 32 == 0, else
 * AVX-512). */
enum tp_attn_isa {
    TP_ATTN_ISA_C,
    TP_ATTN_ISA_AVX2,
    TP_ATTN_ISA_AVX512,
    TP_ATTN_ISA_AVX512BF16,
    TP_ATTN_ISA_AMX,
    TP_ATTN_ISA_COUNT
};
/* The path tp_attn_tile uses: the best this CPU has, at most the limit.  The limit starts from the
 * TP_ATTN_ISA environment variable (c, avx2, avx512, avx512bf16, amx; unset: amx, the best there is); tp_attn_isa_limit
 * sets it (tests that hold a model to a float64 reference cap it at TP_ATTN_ISA_AVX512; not while a forward
 * pass runs) and returns the previous one.  tp_attn_isa_name: "c", "avx2", ... */
int tp_attn_isa_level(void);
int tp_attn_isa_limit(int level);
/* The limit a TP_ATTN_ISA value sets: NULL or "" -> TP_ATTN_ISA_AMX (no cap), a path's name -> its level,
 * anything else -> -1 (logged and ignored). */
int tp_attn_isa_parse(const char *want);
const char *tp_attn_isa_name(int level);
/* attn_amx.c: whether the CPU has AMX-BF16 and AVX512_BF16 and the kernel granted this process the tile
 * state (asks it once: call through tp_attn_isa_level); the tile loop (tp_attn_tile's contract, hd % 32 == 0);
 * its scratch in floats. */
int tp_attn_amx_detect(void);
void tp_attn_amx_tile(const struct tp_attn_geom *g, const struct tp_attn_rows *r, const uint8_t *kc,
                      const uint8_t *vc, int k0, int k1, float *scratch, float *o, size_t o_stride, float *part);
size_t tp_attn_amx_scratch_floats(int hd, int rows);
/* attn_bf16.c: whether the CPU has AVX512_BF16 and AVX512BW (AVX-512 usable: call through tp_attn_isa_level);
 * the tile loop on VDPBF16PS products (tp_attn_tile's contract, hd % 32 == 0); its scratch in floats. */
int tp_attn_bf16_detect(void);
void tp_attn_bf16_tile(const struct tp_attn_geom *g, const struct tp_attn_rows *r, const uint8_t *kc,
                       const uint8_t *vc, int k0, int k1, float *scratch, float *o, size_t o_stride, float *part);
size_t tp_attn_bf16_scratch_floats(int hd, int rows);
/* The end of a tile loop: rows' running max M, sum L and weighted values O (r->nt * r->ng rows of hd) written
 * as tp_attn_tile's contract says: the partial into part when it is not NULL, else the finished output into o
 * (softmax denominator including the sinks). */
void tp_attn_finish(const struct tp_attn_rows *r, int hd, const float *M, const float *L, const float *O, float *o,
                    size_t o_stride, float *part);
/* Floats of scratch tp_attn_tile needs for `rows` query rows of head dim hd. */
size_t tp_attn_scratch_floats(int hd, int rows);
/* Prefetching the next tile: the cache lines of the keys and values of positions [p0, p1) (each split at the
 * ring's end: up to 4 byte ranges), requested a few at a time (tp_attn_pf_step) while the tile loops work
 * on the current tile, so that its reads from memory overlap the arithmetic instead of following it. */
struct tp_attn_pf {
    const uint8_t *a[4], *e[4]; /* next line to request and end of each range */
    int i, n;                   /* current range, ranges */
    int l2;                     /* request into L2, not L1 (the caller's tp_kern_prefetch() == TP_KERN_PF_L2) */
};
static inline void tp_attn_pf_init(struct tp_attn_pf *pf, const uint8_t *kc, const uint8_t *vc, int p0, int p1,
                                   int cap, size_t rb, int l2)
{
    pf->i = pf->n = 0;
    pf->l2 = l2;
    for (int c = 0; c < 2; c++)
        for (int p = p0; p < p1 && pf->n < 4;) {
            const int r0 = p % cap, n = p1 - p < cap - r0 ? p1 - p : cap - r0;
            const uint8_t *a = (c ? vc : kc) + (size_t)r0 * rb;
            pf->a[pf->n] = (const uint8_t *)((uintptr_t)a & ~(uintptr_t)63);
            pf->e[pf->n++] = a + (size_t)n * rb;
            p += n;
        }
}
/* Lines the cursor still holds. */
static inline size_t tp_attn_pf_lines(const struct tp_attn_pf *pf)
{
    size_t n = 0;
    for (int i = pf->i; i < pf->n; i++) n += pf->a[i] < pf->e[i] ? (size_t)(pf->e[i] - pf->a[i] + 63) / 64 : 0;
    return n;
}
/* Request up to k more lines. */
static inline void tp_attn_pf_step(struct tp_attn_pf *pf, int k)
{
    while (k > 0 && pf->i < pf->n) {
        if (pf->a[pf->i] >= pf->e[pf->i]) {
            pf->i++;
            continue;
        }
        TP_PREFETCH(pf->a[pf->i], pf->l2);
        pf->a[pf->i] += 64;
        k--;
    }
}
/* Floats of one partial (tp_attn_tile part) of `rows` rows. */
#define TP_ATTN_PART_FLOATS(hd, rows) ((size_t)(rows) * ((size_t)(hd) + 2))
/* Combine n partials of the same rows (partial k at parts + k * part_stride floats, as tp_attn_tile wrote it)
 * into the finished output o (as tp_attn_tile without part). */
void tp_attn_merge(const float *parts, int n, size_t part_stride, int hd, const struct tp_attn_rows *r, float *o,
                   size_t o_stride);
/* Store one head vector x[hd] as a cache row of type t at dst (a row-major type: not TP_KV_BF16). */
void tp_kv_store(enum tp_kv_type t, uint8_t *dst, const float *x, int hd);
/* Cache row of type t at src as hd floats (a row-major type: not TP_KV_BF16). */
void tp_kv_load(enum tp_kv_type t, const uint8_t *src, float *dst, int hd);
/* Element (row, dimension i) of a TP_KV_BF16 cache, in bf16 units from its row 0: the row's tile of TP_KV_TILE
 * rows (tile t at t * TP_KV_TILE * hd), and in it keys as 32-bit pairs of dimensions (2p, 2p+1) of the tile's
 * rows in order, (hd/2, TILE) pairs; values (is_v) as 32-bit pairs of rows (2k, 2k+1) of the dimensions in
 * order, (TILE/2, hd) pairs: the K^T and V layouts the AVX512_BF16 attention reads. */
static inline size_t tp_kv_bf16_index(int is_v, int64_t row, int i, int hd)
{
    const size_t tile = (size_t)(row / TP_KV_TILE) * TP_KV_TILE * (size_t)hd;
    const size_t j = (size_t)(row % TP_KV_TILE);
    return tile + (is_v ? ((j / 2) * (size_t)hd + (size_t)i) * 2 + j % 2
                        : ((size_t)(i / 2) * TP_KV_TILE + j) * 2 + (size_t)(i % 2));
}
/* The same for row `row` of one head's keys (is_v 0) or values (is_v 1) whose row 0 is at `rows`: any type
 * (TP_KV_BF16's rows are spread over their tile). */
void tp_kv_store_at(enum tp_kv_type t, uint8_t *rows, int is_v, int64_t row, const float *x, int hd);
void tp_kv_load_at(enum tp_kv_type t, const uint8_t *rows, int is_v, int64_t row, float *dst, int hd);

/* One attention work item of a forward call (forward.c builds the list per layer). */
struct tp_attn_item {
    int32_t t0, nt;        /* batch tokens [t0, t0+nt): one sequence, consecutive positions */
    int32_t kvh;           /* local KV head */
    int32_t k0, k1;        /* key positions */
    int32_t part;          /* partial slot, or -1: the item writes the output itself */
};
/* Items split over the keys: partial slots [part0, part0 + n_parts) hold the parts of (t0, nt, kvh). */
struct tp_attn_merge {
    int32_t t0, nt, kvh, part0, n_parts;
};

struct tp_model {
    struct tp_error err;
    char *path;
    char *name;
    char *chat_template;
    tp_gguf_t *gguf;           /* GGUF file, kept open: weights may point into its mapping (NULL for HF) */
    tp_st_t *st;               /* Hugging Face directory's safetensors, kept open likewise (NULL for GGUF) */
    struct tp_mlx_quant *mlxq; /* MLX directories: config.json's quantization block (model/mlx_quant.h), owned; else NULL */
    tp_tokenizer_t *tok;
    struct tp_hparams hp;
    struct tp_model_shard shard; /* always filled (whole model when cfg.shard is NULL) */
    int sharded;               /* cfg.shard != NULL */
    int vocab_only;
    int dry_run;               /* loader: sizing pass (validate and count bytes only) */

    /* local sizes */
    int nq, nkv, hd, q_dim, kv_dim, n_ff_l, n_vocab_l;
    int kv_head0;              /* global index of the first held KV head */
    int q_head0;               /* global index of the first held Q head */
    int n_ctx, n_seq, n_batch, n_threads;
    int keep_layout;           /* cfg.keep_layout (tp_model_reload loads the same way) */
    int n_expert_l;            /* experts held (expert_end - expert_begin); 0 for dense models */
    int expert0;               /* global index of the first held expert */

    /* weights */
    struct tp_layer *layers;   /* (n_layer) */
    struct tp_wmat tok_embd;   /* (n_vocab, n_embd): whole, replicated */
    struct tp_wmat output;     /* (n_vocab_l, n_embd): rows [vocab_begin, vocab_end) */
    /* owned: the re-laid (x16) matrices of every layer other than the experts, and the output head, one
     * after another in layer order (repack.c; those matrices are views into it, owned NULL); NULL when none */
    uint8_t *warena;
    float *output_norm;        /* (n_embd) owned */
    float *inv_freq;           /* (rope_dim/2) rotation frequency per pair, scaling applied */
    uint64_t weight_bytes;
    uint64_t expert_weight_bytes; /* of which the held experts' matrices */
    enum tp_wtype weight_type;

    /* KV cache: layer l is (n_seq, nkv, kv_cap[l], kv_row_bytes) from byte kv_off[l] of k_cache and of
     * v_cache; position p of a sequence is row p % kv_cap[l] (kv_cap = n_ctx for a full layer, a ring of
     * min(n_ctx, window + n_batch) rows for a sliding-window layer) */
    uint8_t *k_cache, *v_cache;
    enum tp_kv_type kv_type;
    size_t kv_row_bytes;       /* tp_kv_row_bytes(kv_type, hd) */
    size_t *kv_off;            /* (n_layer) */
    int *kv_cap;               /* (n_layer) */
    uint64_t kv_total_bytes;   /* of k_cache (v_cache is the same) */
    int n_ring;                /* layers whose kv_cap < n_ctx */
    int *seq_len;              /* (n_seq) valid positions per slot */
    int *seq_hi;               /* (n_seq) one past the highest position written since the slot was cleared */
    int *seq_base;             /* (n_seq) ring layers hold only positions >= base - window + 1 below base (a
                                * prefix copied in holds the last window positions only); 0 */
    int *seq_tmp;              /* (n_seq) scratch for batch validation */
    int *seq_last;             /* (n_seq) scratch: last position seen per slot in the batch */

    /* activations, (n_batch, ...) */
    float *x;                  /* (n_batch, n_embd) residual stream */
    float *xb;                 /* (n_batch, n_embd) normed input of a block */
    float *proj;               /* (n_batch, n_embd) partial output of attn_output / ffn_down */
    float *q;                  /* (n_batch, q_dim) */
    float *k, *v;              /* (n_batch, kv_dim) */
    float *att;                /* (n_batch, q_dim) attention output */
    float *hb, *hb2;           /* (n_rows_max, n_ff_l) */
    uint8_t *act[3];           /* (n_rows_max, act_row_max) prepared activations per weight type */
    int n_rows_max;            /* n_batch, or n_batch * n_expert_used for MoE (one row per (token, expert)) */
    int ff_cur;                /* hidden width of the FFN the FFN_UP / DOWN jobs run (n_ff_l, or n_ff_shexp) */
    int holds_shexp;           /* this rank computes (its columns of) the shared expert */
    int n_shexp_l;             /* its columns of the shared expert (shard.shexp_begin..end) */
    /* mixture of experts scratch: the (token, expert) pairs of a batch grouped by expert */
    float *router_logits;      /* (n_batch, n_expert) */
    int *moe_sel;              /* (n_batch, n_expert_used) selected experts per token */
    float *moe_wsel;           /* (n_batch, n_expert_used) their weights */
    int *moe_off;              /* (n_expert + 1) first pair of each expert in the grouped order */
    int *moe_pair_tok;         /* (n_rows_max) token of each grouped pair */
    float *moe_pair_w;         /* (n_rows_max) router weight of each grouped pair */
    int *moe_active;           /* (n_expert) held experts with at least one pair in this batch */
    int moe_n_active;
    float *moe_x;              /* (n_rows_max, n_embd) inputs gathered per pair, then the experts' outputs */
    enum tp_wtype act_type[3];
    size_t act_row_max;        /* bytes of one prepared row (largest type x largest width) */
    float *attn_scratch;       /* (n_threads, attn_scratch_n) tp_attn_tile scratch per thread */
    size_t attn_scratch_n;
    int attn_qb;               /* query tokens per prefill work item */
    int attn_rows_max;         /* attn_qb * largest number of held Q heads per KV head */
    struct tp_attn_item *attn_items; /* (attn_items_max) this layer's work list */
    int attn_items_max, n_attn_items;
    float *attn_part;          /* (attn_parts_max, TP_ATTN_PART_FLOATS(hd, attn_rows_max)) partials of split items */
    int attn_parts_max;
    struct tp_attn_merge *attn_merge; /* (attn_parts_max) the split items to combine after the ATTN job */
    int n_attn_merge;
    int *attn_qh0, *attn_nqh;  /* (nkv) first local Q head and number of held Q heads using each KV head */
    float *rope_cs;            /* (n_batch, rope_dim) cos/sin pairs per token */
    int *out_rows;             /* (n_batch) tokens that want logits */

    tp_pool_t *pool;

    /* per-call job description (read by pool workers) */
    enum tp_fwd_phase phase;
    atomic_llong chunk_next;   /* first unclaimed item of the current job (dynamic split over threads) */
    tp_worksplit_t *split;     /* owned: the threads' shares of a matmul job (forward.c job_owned()) */
    int64_t chunk_total;       /* work items of the current job (rows, or (token, head) pairs) */
    int64_t chunk_size;        /* fewest items per chunk (chunks shrink towards it, see forward.c job()) */
    int64_t chunk_align;       /* chunk lengths are multiples of this (kernels' row groups) */
    int cur_layer;
    int n_tok;
    int hidden_valid;          /* the last forward completed: x holds its tokens' final residuals */
    const struct tp_batch *batch;
    float *logits_out;
    int n_out;
    /* TP_PH_PREP: rows t of prep_src (prep_n wide) -> [rmsnorm with prep_norm into prep_dst] -> act[0..prep_used);
     * TP_PH_PREP_BLOCKS: the same for prep_rows rows, items the rows' runs of prep_blk values (forward.c) */
    const float *prep_src;
    float *prep_dst;
    const float *prep_norm;
    int64_t prep_n;
    int prep_used;
    int prep_rows;
    int64_t prep_blk;
    float prep_scale[TP_FWD_PREP_SPLIT_ROWS]; /* TP_PH_PREP_BLOCKS with a norm: each row's tp_op_rms_scale */
    uint8_t *prep_scratch;    /* TP_PH_PREP_BLOCKS: act_row_max bytes per thread (tp_kern_prepare_act_blocks) */
    int64_t prep_split_min;   /* a few rows of at least this many values are split by blocks (forward.c
                               * TP_FWD_PREP_SPLIT; tests lower it to reach the split with small models) */

    struct tp_model_stats stats;
};

/* ---- ops.c: small numeric kernels (single thread) ---- */
/* Choose the SIMD versions of dot/axpy for this CPU (called by tp_model_init; idempotent). */
void tp_op_init(void);
/* sum a[i] * b[i] for i < n. */
float tp_op_dot(const float *a, const float *b, int n);
/* The same in plain C (four partial sums), whatever the CPU. */
float tp_op_dot_ref(const float *a, const float *b, int n);
/* y[i] += a * x[i] for i < n. */
void tp_op_axpy(float *y, float a, const float *x, int n);
/* The same with b / x in fp16 (KV cache in half precision), and a row conversion. */
float tp_op_dot_f16(const float *a, const uint16_t *b, int n);
void tp_op_axpy_f16(float *y, float a, const uint16_t *x, int n);
void tp_op_to_f16(uint16_t *dst, const float *src, int n);
/* y = x / rms(x) * w, n elements (y may equal x). */
void tp_op_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* The factor tp_op_rmsnorm multiplies x[j] * w[j] by: 1 / sqrt(mean of x^2 + eps). */
float tp_op_rms_scale(const float *x, int n, float eps);
/* y[j] = x[j] * s * w[j], n elements: tp_op_rmsnorm's product, for a part of a row (y may equal x). */
void tp_op_rms_apply(float *y, const float *x, const float *w, float s, int n);
/* Rotate one head vector x[head_dim] in place using cs[rope_dim] = (cos,sin) pairs. */
void tp_op_rope(float *x, const float *cs, int rope_dim, int neox);
/* Fill cs[rope_dim] = (cos, sin) of pos * inv_freq[i] for i < rope_dim/2. */
void tp_op_rope_cs(float *cs, const float *inv_freq, int rope_dim, int pos);
/* In-place softmax of x[n]. */
void tp_op_softmax(float *x, int n);
/* y[i] = silu(g[i]) * u[i]. */
void tp_op_swiglu(float *y, const float *g, const float *u, int n);
/* gpt-oss: g' = min(g, limit), u' = clamp(u, -limit, limit), y = g' sigmoid(alpha g') (u' + 1)
 * (y may equal g or u). */
void tp_op_swiglu_clamped(float *y, const float *g, const float *u, int n, float alpha, float limit);
/* attn.c: the per-position reference of one query head q[hd] over n cached
 * positions (f32 or fp16 rows j at element j * kv_stride): scores, softmax,
 * weighted values, one dot / axpy per position; sc: n floats of scratch. */
void tp_op_attn_head_ref(const float *q, const void *kc, const void *vc, size_t kv_stride, int f16, int n, int hd,
                         float scale, float *sc, float *o);
/* Inverse frequencies for (theta, rope_dim) with the hparams' scaling; freq_factors
 * (rope_dim/2, may be NULL) divide them (llama.cpp rope_freqs.weight). */
void tp_op_rope_freqs(float *inv_freq, const struct tp_hparams *hp, const float *freq_factors);

/* ---- moe.c ---- */
/* The router of one token: logits[n_expert] -> the k selected experts sel[k]
 * (descending probability; ties: the lower index first) and their weights
 * w[k] (softmax probabilities over all experts, renormalised over the k when
 * norm).  1 <= k <= n_expert. */
void tp_moe_route(const float *logits, int n_expert, int k, int norm, int *sel, float *w);
/* gpt-oss's router: the k largest logits (same order and ties as tp_moe_route), their
 * weights the softmax over those k logits only. */
void tp_moe_route_topk_softmax(const float *logits, int n_expert, int k, int *sel, float *w);

/* ---- repack.c ---- */
/* Re-lay this rank's quantized matrices of an x16 type (layers, experts and an untied output head; never
 * the embedding, read by rows) in the kernels' x16 layout when the chosen
 * ISA computes it natively, with m->pool; releases the row-major bytes.
 * TP_ERR_NOMEM (message on m->err) if a matrix's new buffer cannot be had. */
enum tp_status tp_model_repack(tp_model_t *m);

#endif /* TP_MODEL_MODEL_IMPL_H */

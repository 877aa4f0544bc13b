/*
 * parallel/plan.c - sharding plans as pure data.
 *
 * tp_parallel_plan() turns (hparams, weight types, world size, weights) into
 * per-rank ranges of Q heads, KV heads, FFN columns and vocabulary rows plus
 * the bytes each rank holds.  No I/O, no allocation, no global state: every
 * rank computes the same plan independently (the engine then checks that
 * they agree by hashing it).  See the plan section of parallel/parallel.h for
 * the rules; the splitting primitive here is a weighted largest-remainder
 * split of N indivisible units (heads, KV groups, quant blocks, rows).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/parallel.h"

/* Block geometry of GGUF tensor types (elements, bytes); {0,0} = unknown.
 * Kept here (not tp_wtype_block_*) so the plan stays a leaf: pure data. */
static int plan_block(enum tp_wtype t, int64_t *elems, size_t *bytes)
{
    static const struct {
        int type;
        int elems;
        int bytes;
    } tab[] = {
        {TP_WTYPE_F32, 1, 4},    {TP_WTYPE_F16, 1, 2},    {TP_WTYPE_BF16, 1, 2},   {TP_WTYPE_Q4_0, 32, 18},
        {TP_WTYPE_Q4_1, 32, 20}, {TP_WTYPE_Q5_0, 32, 22}, {TP_WTYPE_Q5_1, 32, 24}, {TP_WTYPE_Q8_0, 32, 34},
        {TP_WTYPE_Q8_1, 32, 36}, {TP_WTYPE_Q2_K, 256, 84}, {TP_WTYPE_Q3_K, 256, 110}, {TP_WTYPE_Q4_K, 256, 144},
        {TP_WTYPE_Q5_K, 256, 176}, {TP_WTYPE_Q6_K, 256, 210}, {TP_WTYPE_Q8_K, 256, 292}, {TP_WTYPE_I8, 1, 1},
        {TP_WTYPE_I16, 1, 2},    {TP_WTYPE_I32, 1, 4},    {TP_WTYPE_I64, 1, 8},    {TP_WTYPE_F64, 1, 8},
        {TP_WTYPE_MXFP4, 32, 17},
        /* MLX affine: a block is one group; bytes = packed words + its fp16/bf16 scale and bias */
        {TP_WTYPE_MLX_Q4_G32, 32, 16 + 4}, {TP_WTYPE_MLX_Q4_G64, 64, 32 + 4},
        {TP_WTYPE_MLX_Q8_G32, 32, 32 + 4}, {TP_WTYPE_MLX_Q8_G64, 64, 64 + 4},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(tab); i++) {
        if (tab[i].type == (int)t) {
            *elems = tab[i].elems;
            *bytes = (size_t)tab[i].bytes;
            return 1;
        }
    }
    *elems = 0;
    *bytes = 0;
    return 0;
}

static const char *tp_wtype_name_plan(enum tp_wtype t)
{
    switch (t) {
    case TP_WTYPE_F32: return "f32";
    case TP_WTYPE_F16: return "f16";
    case TP_WTYPE_BF16: return "bf16";
    case TP_WTYPE_Q4_0: return "q4_0";
    case TP_WTYPE_Q4_1: return "q4_1";
    case TP_WTYPE_Q5_0: return "q5_0";
    case TP_WTYPE_Q5_1: return "q5_1";
    case TP_WTYPE_Q8_0: return "q8_0";
    case TP_WTYPE_Q2_K: return "q2_k";
    case TP_WTYPE_Q3_K: return "q3_k";
    case TP_WTYPE_Q4_K: return "q4_k";
    case TP_WTYPE_Q5_K: return "q5_k";
    case TP_WTYPE_Q6_K: return "q6_k";
    case TP_WTYPE_MXFP4: return "mxfp4";
    case TP_WTYPE_MLX_Q4_G32: return "mlx 4-bit group-32";
    case TP_WTYPE_MLX_Q4_G64: return "mlx 4-bit group-64";
    case TP_WTYPE_MLX_Q8_G32: return "mlx 8-bit group-32";
    case TP_WTYPE_MLX_Q8_G64: return "mlx 8-bit group-64";
    default: return "quantized";
    }
}

/* Bytes of `rows` rows of n elements of type t (n a block multiple, checked by the caller). */
static uint64_t rows_bytes(enum tp_wtype t, int64_t rows, int64_t n)
{
    int64_t be;
    size_t bb;
    if (!plan_block(t, &be, &bb) || rows <= 0 || n <= 0) return 0;
    return (uint64_t)rows * (uint64_t)((n + be - 1) / be) * (uint64_t)bb;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

struct tp_plan_types tp_plan_types_uniform(enum tp_wtype t)
{
    struct tp_plan_types ty = {t, t, t, t, t, t, t, t, t};
    return ty;
}

/*
 * Weighted largest-remainder split of n_units among world ranks: count[r] =
 * floor(n*w_r) plus one for the largest remainders (ties to the lower rank).
 * w sums to 1.  Returns the first rank that got nothing, or -1.
 */
static int split_units(int64_t n_units, int world, const double *w, int64_t *count)
{
    double rem[TP_PLAN_MAX_RANKS];
    int64_t given = 0;
    for (int r = 0; r < world; r++) {
        double exact = (double)n_units * w[r];
        count[r] = (int64_t)floor(exact + 1e-9);
        if (count[r] > n_units) count[r] = n_units;
        rem[r] = exact - (double)count[r];
        given += count[r];
    }
    while (given < n_units) {
        int best = 0;
        for (int r = 1; r < world; r++)
            if (rem[r] > rem[best] + 1e-12) best = r;
        count[best]++;
        rem[best] = -1.0;
        given++;
    }
    while (given > n_units) { /* rounding guard; cannot normally happen */
        int best = 0;
        for (int r = 1; r < world; r++)
            if (count[r] > count[best]) best = r;
        count[best]--;
        given--;
    }
    for (int r = 0; r < world; r++)
        if (count[r] == 0) return r;
    return -1;
}

/* Boundaries in elements: rank r gets [b[r], b[r+1]) of total, in units of unit (last clipped). */
static void unit_bounds(const int64_t *count, int world, int64_t unit, int64_t total, int64_t *b)
{
    int64_t acc = 0;
    b[0] = 0;
    for (int r = 0; r < world; r++) {
        acc += count[r];
        b[r + 1] = TP_MIN(acc * unit, total);
    }
}

/* Would a split at granularity 1 give other boundaries?  (-> "moved") */
static int bounds_moved(const int64_t *b, int world, int64_t total, const double *w)
{
    int64_t c1[TP_PLAN_MAX_RANKS], b1[TP_PLAN_MAX_RANKS + 1];
    split_units(total, world, w, c1);
    unit_bounds(c1, world, 1, total, b1);
    for (int r = 0; r <= world; r++)
        if (b1[r] != b[r]) return 1;
    return 0;
}

enum tp_status tp_parallel_parse_weights(const char *text, int n_ranks, double *out, struct tp_error *err)
{
    if (!text || !*text) return tp_error_set(err, TP_ERR_INVALID_ARG, "--shard-weights is empty: give one number per rank, e.g. 2,1,1");
    const char *p = text;
    int n = 0;
    while (*p) {
        char *end = NULL;
        double v = strtod(p, &end);
        if (end == p || (*end != ',' && *end != '\0'))
            return tp_error_set(err, TP_ERR_INVALID_ARG,
                                "--shard-weights '%s': item %d is not a number (want e.g. 2,1,1)", text, n + 1);
        if (!isfinite(v) || v <= 0.0)
            return tp_error_set(err, TP_ERR_INVALID_ARG,
                                "--shard-weights '%s': weight of rank %d is %g; every rank needs a weight > 0 "
                                "(leave a machine out of the group instead of giving it 0)",
                                text, n, v);
        if (n >= n_ranks || n >= TP_PLAN_MAX_RANKS)
            return tp_error_set(err, TP_ERR_INVALID_ARG,
                                "--shard-weights '%s' has more than %d weights; give exactly one per rank", text,
                                n_ranks);
        out[n++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && !*p)
            return tp_error_set(err, TP_ERR_INVALID_ARG, "--shard-weights '%s' ends with a comma", text);
    }
    if (n != n_ranks)
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "--shard-weights '%s' has %d weights but the world has %d ranks; give one per rank", text,
                            n, n_ranks);
    return TP_OK;
}

static enum tp_status check_type(enum tp_wtype t, const char *role, int64_t n_in, struct tp_error *err)
{
    int64_t be;
    size_t bb;
    if (!plan_block(t, &be, &bb))
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "cannot plan a split of %s: unknown block size of type %d", role,
                            (int)t);
    if (n_in % be != 0)
        return tp_error_set(err, TP_ERR_FORMAT, "%s rows of %lld elements are not whole %lld-element blocks", role,
                            (long long)n_in, (long long)be);
    return TP_OK;
}

const char *tp_moe_split_name(enum tp_moe_split s)
{
    switch (s) {
    case TP_MOE_SPLIT_AUTO: return "auto";
    case TP_MOE_SPLIT_TENSOR: return "tensor";
    case TP_MOE_SPLIT_EXPERT: return "expert";
    default: return "unknown";
    }
}

enum tp_status tp_moe_split_parse(const char *text, enum tp_moe_split *out, struct tp_error *err)
{
    for (int i = 0; i < TP_MOE_SPLIT_COUNT; i++)
        if (text && strcmp(text, tp_moe_split_name((enum tp_moe_split)i)) == 0) {
            *out = (enum tp_moe_split)i;
            return TP_OK;
        }
    return tp_error_set(err, TP_ERR_INVALID_ARG,
                        "--moe-split '%s': want auto, tensor (every rank a slice of every expert) or expert (whole "
                        "experts per rank)",
                        text ? text : "");
}

enum tp_status tp_parallel_plan(const struct tp_hparams *hp, const struct tp_plan_types *ty, int world,
                                const double *weights, struct tp_shard_plan *out, struct tp_error *err)
{
    return tp_parallel_plan_moe(hp, ty, world, weights, TP_MOE_SPLIT_AUTO, out, err);
}

/* What one plan works out step by step (tp_parallel_plan_moe): the normalised weights, the boundaries
 * of heads, FFN columns, experts, shared-expert columns and vocabulary rows per rank, and why. */
struct plan_ctx {
    const struct tp_hparams *hp;
    const struct tp_plan_types *ty;
    int world;
    double w[TP_PLAN_MAX_RANKS];
    int64_t E, hd, nh, nkv, G;
    /* attention */
    int64_t unit, g_o;
    int kv_mode, moved_attn;
    int64_t hb[TP_PLAN_MAX_RANKS + 1];
    /* FFN and experts */
    int64_t be_d;
    int moe, moved_ffn;
    int64_t fb[TP_PLAN_MAX_RANKS + 1], eb[TP_PLAN_MAX_RANKS + 1];
    enum tp_moe_split chosen;
    char why[200];
    int shexp_split;
    int64_t sb[TP_PLAN_MAX_RANKS + 1];
    /* output head */
    int64_t vb[TP_PLAN_MAX_RANKS + 1];
};

/* The shape and the weight type of every role can be planned; c->w the weights normalised to sum 1. */
static enum tp_status plan_check(struct plan_ctx *c, const double *weights, struct tp_error *err)
{
    const struct tp_hparams *hp = c->hp;
    const struct tp_plan_types *ty = c->ty;
    const int world = c->world;
    if (world < 1 || world > TP_PLAN_MAX_RANKS)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "world size %d is out of range [1, %d]", world,
                            TP_PLAN_MAX_RANKS);
    if (hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->head_dim <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0 ||
        hp->n_vocab <= 0 || hp->n_layer <= 0)
        return tp_error_set(err, TP_ERR_FORMAT, "cannot plan: model has a zero/negative dimension");
    if (hp->n_head % hp->n_head_kv != 0)
        return tp_error_set(err, TP_ERR_FORMAT, "cannot plan: %d query heads are not a multiple of %d KV heads",
                            hp->n_head, hp->n_head_kv);

    c->E = hp->n_embd, c->hd = hp->head_dim, c->nh = hp->n_head, c->nkv = hp->n_head_kv;
    c->G = c->nh / c->nkv;
    const int64_t E = c->E, nh = c->nh, hd = c->hd;
    enum tp_status st;
    if ((st = check_type(ty->attn_q, "attn_q", E, err)) || (st = check_type(ty->attn_k, "attn_k", E, err)) ||
        (st = check_type(ty->attn_v, "attn_v", E, err)) || (st = check_type(ty->attn_o, "attn_output", nh * hd, err)) ||
        (st = check_type(ty->ffn_gate, "ffn_gate", E, err)) || (st = check_type(ty->ffn_up, "ffn_up", E, err)) ||
        (st = check_type(ty->ffn_down, "ffn_down", hp->n_ff, err)) ||
        (st = check_type(ty->token_embd, "token_embd", E, err)) ||
        (!hp->tied_embeddings && (st = check_type(ty->output, "output", E, err))))
        return st;

    double wsum = 0.0;
    for (int r = 0; r < world; r++) {
        double v = weights ? weights[r] : 1.0;
        if (!isfinite(v) || v <= 0.0)
            return tp_error_set(err, TP_ERR_INVALID_ARG, "shard weight of rank %d is %g; weights must be > 0", r, v);
        c->w[r] = v;
        wsum += v;
    }
    for (int r = 0; r < world; r++) c->w[r] /= wsum;
    return TP_OK;
}

/* Attention: units of whole heads whose O columns are whole blocks (c->hb, c->unit, c->kv_mode). */
static enum tp_status plan_heads(struct plan_ctx *c, struct tp_error *err)
{
    const struct tp_plan_types *ty = c->ty;
    const int world = c->world;
    const int64_t hd = c->hd, nh = c->nh, nkv = c->nkv, G = c->G;
    int64_t be_o;
    size_t bb_o;
    plan_block(ty->attn_o, &be_o, &bb_o);
    const int64_t g_o = be_o / gcd64(be_o, hd); /* Q heads per O-block unit */
    int64_t unit = G / gcd64(G, g_o) * g_o;     /* lcm(G, g_o): whole KV groups */
    int kv_mode = 1;
    if (world > nkv || (nh + unit - 1) / unit < world) {
        kv_mode = 0;
        unit = g_o;
    }
    const int64_t n_hunits = (nh + unit - 1) / unit;
    if (n_hunits < world && unit == 1)
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "cannot split %lld attention heads over %d ranks: every rank needs at least one whole "
                            "head; use at most %lld ranks",
                            (long long)nh, world, (long long)nh);
    if (n_hunits < world)
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "cannot split %lld attention heads over %d ranks: at most %lld ranks (heads move in "
                            "units of %lld so that attn_output's %s blocks are never cut); use fewer ranks",
                            (long long)nh, world, (long long)n_hunits, (long long)unit, tp_wtype_name_plan(ty->attn_o));
    int64_t cnt[TP_PLAN_MAX_RANKS];
    int zr = split_units(n_hunits, world, c->w, cnt);
    if (zr >= 0)
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "shard weight of rank %d is too small: it would get no attention heads (%lld units of "
                            "%lld heads to share); raise its weight or use fewer ranks",
                            zr, (long long)n_hunits, (long long)unit);
    unit_bounds(cnt, world, unit, nh, c->hb);
    c->moved_attn = unit > 1 && bounds_moved(c->hb, world, nh, c->w);
    c->unit = unit;
    c->g_o = g_o;
    c->kv_mode = kv_mode;
    return TP_OK;
}

/* FFN: units of ffn_down blocks (mixture of experts: of every expert, or whole experts, as split asks or
 * as fits best): c->fb / c->eb, c->chosen and why; the Qwen2-MoE shared expert's columns (c->sb). */
static enum tp_status plan_ffn(struct plan_ctx *c, enum tp_moe_split split, struct tp_error *err)
{
    const struct tp_hparams *hp = c->hp;
    const struct tp_plan_types *ty = c->ty;
    const int world = c->world;
    const double *w = c->w;
    int64_t cnt[TP_PLAN_MAX_RANKS];
    int64_t be_d;
    size_t bb_d;
    plan_block(ty->ffn_down, &be_d, &bb_d);
    c->be_d = be_d;
    const int64_t n_funits = (hp->n_ff + be_d - 1) / be_d;
    const int moe = hp->n_expert > 0;
    c->moe = moe;
    int64_t ecnt[TP_PLAN_MAX_RANKS];
    const int tp_fits = n_funits >= world && split_units(n_funits, world, w, cnt) < 0;
    int moved_ffn = 0;
    if (tp_fits) {
        unit_bounds(cnt, world, be_d, hp->n_ff, c->fb);
        moved_ffn = be_d > 1 && bounds_moved(c->fb, world, hp->n_ff, w);
    }
    const int ep_fits = moe && hp->n_expert >= world && split_units(hp->n_expert, world, w, ecnt) < 0;
    enum tp_moe_split chosen = TP_MOE_SPLIT_AUTO;
    char *why = c->why;
    const size_t why_cap = sizeof c->why;
    why[0] = '\0';
    if (moe) {
        if (split == TP_MOE_SPLIT_TENSOR && !tp_fits)
            return tp_error_set(err, TP_ERR_UNSUPPORTED,
                                "cannot split experts of %d columns over %d ranks in %lld-column %s blocks%s; use "
                                "--moe-split expert (whole experts per rank) or fewer ranks",
                                hp->n_ff, world, (long long)be_d, tp_wtype_name_plan(ty->ffn_down),
                                n_funits >= world ? " with these shard weights" : "");
        if (split == TP_MOE_SPLIT_EXPERT && !ep_fits)
            return tp_error_set(err, TP_ERR_UNSUPPORTED,
                                "cannot give each of %d ranks whole experts: the model has %d%s; use --moe-split "
                                "tensor or fewer ranks",
                                world, hp->n_expert, hp->n_expert >= world ? " and a rank's weight is too small" : "");
        if (split == TP_MOE_SPLIT_TENSOR) {
            chosen = TP_MOE_SPLIT_TENSOR;
            snprintf(why, why_cap, "asked for");
        } else if (split == TP_MOE_SPLIT_EXPERT) {
            chosen = TP_MOE_SPLIT_EXPERT;
            snprintf(why, why_cap, "asked for");
        } else if (tp_fits && !moved_ffn) {
            chosen = TP_MOE_SPLIT_TENSOR;
            snprintf(why, why_cap,
                     "every rank computes each selected expert at its share of the width, balanced whatever the "
                     "router picks");
        } else if (ep_fits) {
            chosen = TP_MOE_SPLIT_EXPERT;
            if (!tp_fits)
                snprintf(why, why_cap, "experts of %d columns are %lld %s blocks, too few for %d ranks", hp->n_ff,
                         (long long)n_funits, tp_wtype_name_plan(ty->ffn_down), world);
            else
                snprintf(why, why_cap,
                         "a column split would move off the shard weights to %lld-column %s block boundaries",
                         (long long)be_d, tp_wtype_name_plan(ty->ffn_down));
        } else if (tp_fits) {
            chosen = TP_MOE_SPLIT_TENSOR;
            snprintf(why, why_cap, "fewer experts (%d) than ranks", hp->n_expert);
        } else {
            return tp_error_set(err, TP_ERR_UNSUPPORTED,
                                "cannot split %d experts of %d columns over %d ranks: fewer experts than ranks and "
                                "fewer %lld-column %s blocks than ranks; use fewer ranks",
                                hp->n_expert, hp->n_ff, world, (long long)be_d, tp_wtype_name_plan(ty->ffn_down));
        }
        if (chosen == TP_MOE_SPLIT_EXPERT) {
            unit_bounds(ecnt, world, 1, hp->n_expert, c->eb);
            moved_ffn = 0;
        }
    } else {
        if (n_funits < world)
            return tp_error_set(err, TP_ERR_UNSUPPORTED,
                                "cannot split an FFN of %d columns over %d ranks in %lld-column %s blocks; use fewer "
                                "ranks",
                                hp->n_ff, world, (long long)be_d, tp_wtype_name_plan(ty->ffn_down));
        if (!tp_fits)
            return tp_error_set(err, TP_ERR_INVALID_ARG,
                                "shard weight of rank %d is too small: it would get no FFN columns; raise its weight",
                                split_units(n_funits, world, w, cnt));
    }
    c->chosen = chosen;
    c->moved_ffn = moved_ffn;

    /* ---- Qwen2-MoE shared expert: split like a dense FFN (ffn_down blocks, by weight) when every rank gets
     * a block; else whole on rank 0 */
    c->shexp_split = 0;
    if (hp->n_ff_shexp > 0) {
        const int64_t n_sunits = (hp->n_ff_shexp + be_d - 1) / be_d;
        int64_t scnt[TP_PLAN_MAX_RANKS];
        if (n_sunits >= world && split_units(n_sunits, world, w, scnt) < 0) {
            unit_bounds(scnt, world, be_d, hp->n_ff_shexp, c->sb);
            c->shexp_split = 1;
        }
    }
    return TP_OK;
}

/* Vocabulary rows of the output head (c->vb). */
static enum tp_status plan_vocab(struct plan_ctx *c, struct tp_error *err)
{
    const struct tp_hparams *hp = c->hp;
    int64_t cnt[TP_PLAN_MAX_RANKS];
    if (hp->n_vocab < c->world)
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "cannot split %d vocabulary rows over %d ranks", hp->n_vocab,
                            c->world);
    int zr = split_units(hp->n_vocab, c->world, c->w, cnt);
    if (zr >= 0)
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "shard weight of rank %d is too small: it would get no vocabulary rows", zr);
    unit_bounds(cnt, c->world, 1, hp->n_vocab, c->vb);
    return TP_OK;
}

/* Each rank's shard and bytes, the replicated and total bytes (out). */
static void plan_bytes(const struct plan_ctx *c, struct tp_shard_plan *out)
{
    const struct tp_hparams *hp = c->hp;
    const struct tp_plan_types *ty = c->ty;
    const int world = c->world, moe = c->moe;
    const int64_t E = c->E, hd = c->hd, nh = c->nh, nkv = c->nkv, G = c->G;
    const int64_t *hb = c->hb, *fb = c->fb, *eb = c->eb, *sb = c->sb, *vb = c->vb;
    const int64_t L = hp->n_layer;
    uint64_t repl = (uint64_t)L * (uint64_t)(2 * E * 4) + (uint64_t)E * 4 + rows_bytes(ty->token_embd, hp->n_vocab, E);
    if (moe) repl += (uint64_t)L * (uint64_t)hp->n_expert * (uint64_t)E * 4; /* routers (F32, as llama.cpp keeps them) */
    if (hp->has_qk_norm) repl += (uint64_t)L * (uint64_t)(2 * hd * 4);
    const int gptoss = hp->arch == TP_ARCH_GPTOSS;
    const uint64_t X = (uint64_t)hp->n_expert;
    if (gptoss) repl += (uint64_t)L * ((uint64_t)E + X) * 4; /* attn_output and router biases */
    out->world_size = world;
    out->head_unit = (int)c->unit;
    out->ff_unit = (int)c->be_d;
    out->moved = c->moved_attn || c->moved_ffn;
    out->replicated_bytes = repl;
    int kv_prev_end = 0;
    for (int r = 0; r < world; r++) {
        struct tp_shard_rank_plan *rp = &out->ranks[r];
        struct tp_model_shard *s = &rp->shard;
        s->q_head_begin = (int)hb[r];
        s->q_head_end = (int)hb[r + 1];
        s->kv_head_begin = (int)(hb[r] / G);
        s->kv_head_end = (int)((hb[r + 1] - 1) / G + 1);
        const int whole_experts = c->chosen == TP_MOE_SPLIT_EXPERT; /* every column of its own experts */
        s->ff_begin = whole_experts ? 0 : (int)fb[r];
        s->ff_end = whole_experts ? hp->n_ff : (int)fb[r + 1];
        s->vocab_begin = (int)vb[r];
        s->vocab_end = (int)vb[r + 1];
        s->expert_begin = whole_experts ? (int)eb[r] : 0;
        s->expert_end = whole_experts ? (int)eb[r + 1] : hp->n_expert; /* dense: 0 */
        s->shexp_begin = c->shexp_split ? (int)sb[r] : 0;
        s->shexp_end = c->shexp_split ? (int)sb[r + 1] : (r == 0 ? hp->n_ff_shexp : 0);
        if (r > 0 && s->kv_head_begin < kv_prev_end) out->kv_replicated = 1;
        kv_prev_end = s->kv_head_end;
        rp->weight = c->w[r];
        const int64_t nq = hb[r + 1] - hb[r], nk = s->kv_head_end - s->kv_head_begin, nf = s->ff_end - s->ff_begin;
        const uint64_t n_ex = moe ? (uint64_t)(s->expert_end - s->expert_begin) : 1;
        uint64_t sh = rows_bytes(ty->attn_q, nq * hd, E) + rows_bytes(ty->attn_k, nk * hd, E) +
                      rows_bytes(ty->attn_v, nk * hd, E) + rows_bytes(ty->attn_o, E, nq * hd) +
                      n_ex * (rows_bytes(ty->ffn_gate, nf, E) + rows_bytes(ty->ffn_up, nf, E) +
                              rows_bytes(ty->ffn_down, E, nf));
        if (hp->has_qkv_bias) sh += (uint64_t)((nq + 2 * nk) * hd * 4);
        /* gpt-oss: the held heads' sinks; the held experts' gate/up bias columns; their down biases on
         * the rank holding column 0 (as model_load.c reads them) */
        if (gptoss) sh += ((uint64_t)nq + n_ex * (uint64_t)nf * 2 + (s->ff_begin == 0 ? n_ex * (uint64_t)E : 0)) * 4;
        sh *= (uint64_t)L;
        const int64_t ns = s->shexp_end - s->shexp_begin; /* Qwen2-MoE shared expert: its columns and gate vector */
        if (ns > 0)
            sh += (uint64_t)L * (rows_bytes(ty->ffn_gate, ns, E) + rows_bytes(ty->ffn_up, ns, E) +
                                 rows_bytes(ty->ffn_down, E, ns) + (uint64_t)E * 4);
        if (moe)
            rp->expert_bytes = (uint64_t)L * n_ex *
                               (rows_bytes(ty->ffn_gate, nf, E) + rows_bytes(ty->ffn_up, nf, E) +
                                rows_bytes(ty->ffn_down, E, nf));
        if (!hp->tied_embeddings) sh += rows_bytes(ty->output, vb[r + 1] - vb[r], E);
        rp->sharded_bytes = sh;
        rp->replicated_bytes = repl;
    }
    uint64_t whole = rows_bytes(ty->attn_q, nh * hd, E) + rows_bytes(ty->attn_k, nkv * hd, E) +
                     rows_bytes(ty->attn_v, nkv * hd, E) + rows_bytes(ty->attn_o, E, nh * hd) +
                     (uint64_t)(moe ? hp->n_expert : 1) *
                         (rows_bytes(ty->ffn_gate, hp->n_ff, E) + rows_bytes(ty->ffn_up, hp->n_ff, E) +
                          rows_bytes(ty->ffn_down, E, hp->n_ff));
    if (hp->has_qkv_bias) whole += (uint64_t)((nh + 2 * nkv) * hd * 4);
    if (gptoss) whole += ((uint64_t)nh + X * (uint64_t)hp->n_ff * 2 + X * (uint64_t)E) * 4;
    if (hp->n_ff_shexp > 0)
        whole += rows_bytes(ty->ffn_gate, hp->n_ff_shexp, E) + rows_bytes(ty->ffn_up, hp->n_ff_shexp, E) +
                 rows_bytes(ty->ffn_down, E, hp->n_ff_shexp) + (uint64_t)E * 4;
    whole *= (uint64_t)L;
    if (!hp->tied_embeddings) whole += rows_bytes(ty->output, hp->n_vocab, E);
    out->total_bytes = whole + repl;
}

/* out->note: how attention, the FFN and the experts were split, and what moved off the weights. */
static void plan_note(const struct plan_ctx *c, struct tp_shard_plan *out)
{
    const struct tp_hparams *hp = c->hp;
    const int64_t unit = c->unit, g_o = c->g_o;
    const int kv_mode = c->kv_mode;
    int n = snprintf(out->note, sizeof out->note, "%d rank%s; attention by %s (%lld head%s per unit)%s", c->world,
                     c->world == 1 ? "" : "s", kv_mode ? "whole KV groups" : "Q heads",
                     (long long)unit, unit == 1 ? "" : "s",
                     out->kv_replicated ? ", KV heads replicated where ranks share a group" : "");
    if (c->moved_attn && n > 0 && (size_t)n < sizeof out->note)
        n += snprintf(out->note + n, sizeof out->note - (size_t)n,
                      "; head split moved to %lld-head units (%s%s%s)", (long long)unit,
                      kv_mode ? "whole KV groups" : "", kv_mode && g_o > 1 ? " and " : "",
                      g_o > 1 ? "whole attn_output blocks" : "");
    if (c->moved_ffn && n > 0 && (size_t)n < sizeof out->note)
        n += snprintf(out->note + n, sizeof out->note - (size_t)n,
                      "; FFN split moved to %lld-column block boundaries (ffn_down %s)", (long long)c->be_d,
                      tp_wtype_name_plan(c->ty->ffn_down));
    if (c->moe && n > 0 && (size_t)n < sizeof out->note)
        n += snprintf(out->note + n, sizeof out->note - (size_t)n, "; %d experts %s (%s)", hp->n_expert,
                      c->chosen == TP_MOE_SPLIT_EXPERT ? "expert-parallel: whole experts per rank"
                                                       : "tensor-parallel: a column slice of every expert per rank",
                      c->why);
    (void)n;
}

enum tp_status tp_parallel_plan_moe(const struct tp_hparams *hp, const struct tp_plan_types *ty, int world,
                                    const double *weights, enum tp_moe_split split, struct tp_shard_plan *out,
                                    struct tp_error *err)
{
    if (!hp || !ty || !out) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_parallel_plan: NULL argument");
    if ((int)split < 0 || split >= TP_MOE_SPLIT_COUNT)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_parallel_plan: unknown expert split %d", (int)split);
    memset(out, 0, sizeof *out);
    struct plan_ctx c;
    memset(&c, 0, sizeof c);
    c.hp = hp;
    c.ty = ty;
    c.world = world;
    enum tp_status st;
    if ((st = plan_check(&c, weights, err)) != TP_OK || (st = plan_heads(&c, err)) != TP_OK ||
        (st = plan_ffn(&c, split, err)) != TP_OK)
        return st;
    out->moe_split = c.chosen;
    if ((st = plan_vocab(&c, err)) != TP_OK) return st;
    plan_bytes(&c, out);
    plan_note(&c, out);
    return TP_OK;
}

size_t tp_shard_plan_describe(const struct tp_shard_plan *plan, char *buf, size_t cap)
{
    size_t need = 0;
    char line[320];
    if (cap) buf[0] = '\0';
    for (int r = 0; r < plan->world_size; r++) {
        const struct tp_shard_rank_plan *rp = &plan->ranks[r];
        const struct tp_model_shard *s = &rp->shard;
        char ex[48] = "";
        if (plan->moe_split != TP_MOE_SPLIT_AUTO) snprintf(ex, sizeof ex, " experts [%d,%d)", s->expert_begin, s->expert_end);
        int n = snprintf(line, sizeof line,
                         "rank %d (share %.3f): q heads [%d,%d) kv heads [%d,%d) ffn [%d,%d)%s vocab [%d,%d); "
                         "%.2f MiB sharded + %.2f MiB replicated\n",
                         r, rp->weight, s->q_head_begin, s->q_head_end, s->kv_head_begin, s->kv_head_end,
                         s->ff_begin, s->ff_end, ex, s->vocab_begin, s->vocab_end,
                         (double)rp->sharded_bytes / 1048576.0, (double)rp->replicated_bytes / 1048576.0);
        if (n < 0) continue;
        if (need + (size_t)n < cap) memcpy(buf + need, line, (size_t)n + 1);
        else if (cap) buf[need < cap ? need : cap - 1] = '\0';
        need += (size_t)n;
    }
    return need;
}

static uint64_t fnv_u32(uint64_t h, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= 1099511628211ull;
    }
    return h;
}

uint64_t tp_shard_plan_hash(const struct tp_shard_plan *plan)
{
    uint64_t h = 14695981039346656037ull;
    h = fnv_u32(h, (uint32_t)plan->world_size);
    for (int r = 0; r < plan->world_size && r < TP_PLAN_MAX_RANKS; r++) {
        const struct tp_model_shard *s = &plan->ranks[r].shard;
        const int v[8] = {s->q_head_begin, s->q_head_end, s->kv_head_begin, s->kv_head_end,
                          s->ff_begin,     s->ff_end,     s->vocab_begin,   s->vocab_end};
        for (int i = 0; i < 8; i++) h = fnv_u32(h, (uint32_t)v[i]);
        if (plan->moe_split != TP_MOE_SPLIT_AUTO) { /* dense plans hash as they always have */
            h = fnv_u32(h, (uint32_t)s->expert_begin);
            h = fnv_u32(h, (uint32_t)s->expert_end);
            if (s->shexp_end) {
                h = fnv_u32(h, (uint32_t)s->shexp_begin);
                h = fnv_u32(h, (uint32_t)s->shexp_end);
            }
        }
    }
    return h;
}

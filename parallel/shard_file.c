/*
 * parallel/shard_file.c - `tpserve shard`: cut a model into one GGUF file
 * per rank, each holding only that rank's slices (so each machine stores only
 * its part) plus the plan it was cut with (tpserve.shard.* keys); the loader
 * recognises the layout through tp_model_shard.file_is_slice.  What each tensor
 * keeps: docs/multi-node.md ("Shard files").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/tensor_source.h"
#include "parallel_impl.h"

enum slice_kind { SLICE_NONE = 0, SLICE_ROWS, SLICE_COLS };

/* How tensor `name` is cut for shard s: kind and element range [*a, *b). */
static enum slice_kind classify(const char *name, const struct tp_hparams *hp, const struct tp_model_shard *s,
                                int64_t *a, int64_t *b)
{
    const int64_t hd = hp->head_dim;
    if (strcmp(name, "output.weight") == 0) {
        *a = s->vocab_begin;
        *b = s->vocab_end;
        return SLICE_ROWS;
    }
    if (strncmp(name, "blk.", 4) != 0) return SLICE_NONE;
    const char *dot = strchr(name + 4, '.');
    if (!dot) return SLICE_NONE;
    const char *role = dot + 1;
    struct {
        const char *prefix;
        enum slice_kind kind;
        int64_t a, b;
    } tab[] = {
        {"attn_q.", SLICE_ROWS, s->q_head_begin * hd, s->q_head_end * hd},
        {"attn_k.", SLICE_ROWS, s->kv_head_begin * hd, s->kv_head_end * hd},
        {"attn_v.", SLICE_ROWS, s->kv_head_begin * hd, s->kv_head_end * hd},
        {"attn_output.weight", SLICE_COLS, s->q_head_begin * hd, s->q_head_end * hd},
        {"ffn_gate.", SLICE_ROWS, s->ff_begin, s->ff_end},
        {"ffn_up.", SLICE_ROWS, s->ff_begin, s->ff_end},
        {"ffn_down.weight", SLICE_COLS, s->ff_begin, s->ff_end},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(tab); i++) {
        if (strncmp(role, tab[i].prefix, strlen(tab[i].prefix)) == 0) {
            *a = tab[i].a;
            *b = tab[i].b;
            return tab[i].kind;
        }
    }
    return SLICE_NONE;
}

/* How one tensor is cut: of its data seen as [ne0, ne1, ne2] (ne3 == 1 when cut), columns [c0, c1) of dim 0,
 * rows [r0, r1) of dim 1, stacked matrices [s0, s1) of dim 2; drop: left out of this rank's file. */
struct cut {
    int drop, whole;
    int64_t c0, c1, r0, r1, s0, s1;
};

/* The cut of tensor t for shard s (dense roles through classify, then the mixture-of-experts ones). */
static enum tp_status cut_of(const struct tp_gguf_tensor *t, const struct tp_hparams *hp,
                             const struct tp_model_shard *s, const char *path, struct cut *c, struct tp_error *err)
{
    const int64_t ne0 = t->ne[0], ne1 = t->n_dims > 1 ? t->ne[1] : 1, ne2 = t->n_dims > 2 ? t->ne[2] : 1;
    memset(c, 0, sizeof *c);
    c->c1 = ne0;
    c->r1 = ne1;
    c->s1 = ne2;
    int64_t a = 0, b = 0;
    enum slice_kind k = classify(t->name, hp, s, &a, &b);
    const char *dot = strncmp(t->name, "blk.", 4) == 0 ? strchr(t->name + 4, '.') : NULL;
    const char *role = dot ? dot + 1 : "";
    if (k == SLICE_ROWS && t->n_dims == 1) c->c0 = a, c->c1 = b;
    else if (k == SLICE_ROWS) c->r0 = a, c->r1 = b;
    else if (k == SLICE_COLS) c->c0 = a, c->c1 = b;
    else if (strcmp(role, "attn_sinks.weight") == 0) c->c0 = s->q_head_begin, c->c1 = s->q_head_end;
    else if (hp->n_expert > 0) {
        const int64_t f0 = s->ff_begin, f1 = s->ff_end, e0 = s->expert_begin, e1 = s->expert_end;
        int64_t sb = s->shexp_begin, se = s->shexp_end; /* the loader's rule for a shared expert's holder */
        if (sb == 0 && se == 0 && s->expert_begin == 0 && s->ff_begin == 0) se = hp->n_ff_shexp;
        if (!strcmp(role, "ffn_gate_exps.weight") || !strcmp(role, "ffn_up_exps.weight"))
            c->r0 = f0, c->r1 = f1, c->s0 = e0, c->s1 = e1;
        else if (!strcmp(role, "ffn_down_exps.weight"))
            c->c0 = f0, c->c1 = f1, c->s0 = e0, c->s1 = e1;
        else if (!strcmp(role, "ffn_gate_exps.bias") || !strcmp(role, "ffn_up_exps.bias"))
            c->c0 = f0, c->c1 = f1, c->r0 = e0, c->r1 = e1;
        else if (!strcmp(role, "ffn_down_exps.bias"))
            c->drop = f0 != 0, c->r0 = e0, c->r1 = e1;
        else if (strstr(role, "_shexp.") && se <= sb)
            c->drop = 1;
        else if (!strcmp(role, "ffn_gate_shexp.weight") || !strcmp(role, "ffn_up_shexp.weight"))
            c->r0 = sb, c->r1 = se;
        else if (!strcmp(role, "ffn_down_shexp.weight"))
            c->c0 = sb, c->c1 = se;
    }
    c->whole = c->c0 == 0 && c->c1 == ne0 && c->r0 == 0 && c->r1 == ne1 && c->s0 == 0 && c->s1 == ne2;
    if (c->drop || c->whole) return TP_OK;
    const int64_t be = tp_gguf_wtype_block_elems((uint32_t)t->type);
    if (t->n_dims > 3 || c->c0 < 0 || c->c1 > ne0 || c->c0 >= c->c1 || c->r0 < 0 || c->r1 > ne1 || c->r0 >= c->r1 ||
        c->s0 < 0 || c->s1 > ne2 || c->s0 >= c->s1)
        return tp_error_set(err, TP_ERR_FORMAT,
                            "%s: tensor '%s' [%lld, %lld, %lld] does not hold the plan's columns [%lld,%lld) rows "
                            "[%lld,%lld) experts [%lld,%lld)",
                            path, t->name, (long long)ne0, (long long)ne1, (long long)ne2, (long long)c->c0,
                            (long long)c->c1, (long long)c->r0, (long long)c->r1, (long long)c->s0, (long long)c->s1);
    if (be <= 0 || c->c0 % be || c->c1 % be)
        return tp_error_set(err, TP_ERR_INTERNAL, "%s: tensor '%s': the plan's columns [%lld,%lld) cut a %lld-element %s block",
                            path, t->name, (long long)c->c0, (long long)c->c1, (long long)be, tp_wtype_name(t->type));
    return TP_OK;
}

int tp_shard_classify(const char *name, const struct tp_hparams *hp, const struct tp_model_shard *s, int64_t *a,
                      int64_t *b)
{
    return (int)classify(name, hp, s, a, b);
}

/* Copy one metadata entry (any type) from g to w. */
static enum tp_status copy_kv(tp_gguf_t *g, int i, tp_gguf_writer_t *w, struct tp_error *err)
{
    const char *key = tp_gguf_key(g, i);
    enum tp_gguf_type t = tp_gguf_kv_type(g, i);
    enum tp_status st = TP_OK;
    int64_t iv = 0;
    uint64_t uv = 0;
    double dv = 0;
    switch (t) {
    case TP_GGUF_UINT8: case TP_GGUF_INT8: case TP_GGUF_UINT16: case TP_GGUF_INT16:
    case TP_GGUF_INT32: case TP_GGUF_INT64: case TP_GGUF_BOOL: {
        if ((st = tp_gguf_get_int(g, key, &iv)) != TP_OK) break;
        union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; int32_t i32; int64_t i64; } v;
        switch (t) {
        case TP_GGUF_UINT8: case TP_GGUF_BOOL: v.u8 = (uint8_t)iv; break;
        case TP_GGUF_INT8: v.i8 = (int8_t)iv; break;
        case TP_GGUF_UINT16: v.u16 = (uint16_t)iv; break;
        case TP_GGUF_INT16: v.i16 = (int16_t)iv; break;
        case TP_GGUF_INT32: v.i32 = (int32_t)iv; break;
        default: v.i64 = iv; break;
        }
        st = tp_gguf_kv_scalar(w, key, t, &v);
        break;
    }
    case TP_GGUF_UINT32: case TP_GGUF_UINT64:
        if ((st = tp_gguf_get_u64(g, key, &uv)) != TP_OK) break;
        if (t == TP_GGUF_UINT32) {
            uint32_t u = (uint32_t)uv;
            st = tp_gguf_kv_scalar(w, key, t, &u);
        } else {
            st = tp_gguf_kv_scalar(w, key, t, &uv);
        }
        break;
    case TP_GGUF_FLOAT32: case TP_GGUF_FLOAT64:
        if ((st = tp_gguf_get_float(g, key, &dv)) != TP_OK) break;
        if (t == TP_GGUF_FLOAT32) {
            float f = (float)dv;
            st = tp_gguf_kv_scalar(w, key, t, &f);
        } else {
            st = tp_gguf_kv_scalar(w, key, t, &dv);
        }
        break;
    case TP_GGUF_STRING: {
        const char *sv = NULL;
        if ((st = tp_gguf_get_str(g, key, &sv)) != TP_OK) break;
        st = tp_gguf_kv_str(w, key, sv);
        break;
    }
    case TP_GGUF_ARRAY: {
        enum tp_gguf_type et = tp_gguf_arr_type(g, i);
        uint64_t n = tp_gguf_arr_len(g, i);
        if (et == TP_GGUF_STRING) {
            const char **strs = malloc((n ? n : 1) * sizeof *strs);
            size_t *lens = malloc((n ? n : 1) * sizeof *lens);
            if (!strs || !lens) st = TP_ERR_NOMEM;
            for (uint64_t j = 0; st == TP_OK && j < n; j++) strs[j] = tp_gguf_arr_str(g, i, j, &lens[j]);
            if (st == TP_OK) st = tp_gguf_kv_array_str(w, key, strs, lens, n);
            free(strs);
            free(lens);
        } else if (et == TP_GGUF_FLOAT32) {
            float *v = malloc((n ? n : 1) * sizeof *v);
            if (!v) st = TP_ERR_NOMEM;
            else if ((st = tp_gguf_arr_copy_f32(g, i, v, n)) == TP_OK) st = tp_gguf_kv_array(w, key, et, v, n);
            free(v);
        } else if (et == TP_GGUF_INT32 || et == TP_GGUF_UINT32 || et == TP_GGUF_INT16 || et == TP_GGUF_UINT16 ||
                   et == TP_GGUF_INT8 || et == TP_GGUF_UINT8 || et == TP_GGUF_BOOL) {
            int32_t *v = malloc((n ? n : 1) * sizeof *v);
            void *packed = malloc((n ? n : 1) * 4);
            if (!v || !packed) st = TP_ERR_NOMEM;
            else if ((st = tp_gguf_arr_copy_i32(g, i, v, n)) == TP_OK) {
                for (uint64_t j = 0; j < n; j++) {
                    switch (et) {
                    case TP_GGUF_INT32: case TP_GGUF_UINT32: ((int32_t *)packed)[j] = v[j]; break;
                    case TP_GGUF_INT16: case TP_GGUF_UINT16: ((int16_t *)packed)[j] = (int16_t)v[j]; break;
                    default: ((int8_t *)packed)[j] = (int8_t)v[j]; break;
                    }
                }
                st = tp_gguf_kv_array(w, key, et, packed, n);
            }
            free(v);
            free(packed);
        } else {
            return tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: metadata '%s' is an array of %s, which shard files "
                                "cannot copy yet", tp_gguf_path(g), key, tp_gguf_type_name(et));
        }
        break;
    }
    default:
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: metadata '%s' has type %s, which shard files cannot copy",
                            tp_gguf_path(g), key, tp_gguf_type_name(t));
    }
    if (st != TP_OK)
        return tp_error_set(err, st, "copying metadata '%s' from %s: %s%s", key, tp_gguf_path(g),
                            tp_gguf_last_error(g), w ? tp_gguf_writer_error(w) : "");
    return TP_OK;
}

size_t tp_parallel_shard_name(const char *model_path, int rank, int world, char *buf, size_t cap)
{
    const char *base = strrchr(model_path, '/');
    base = base ? base + 1 : model_path;
    size_t len = strlen(base);
    if (len > 5 && strcmp(base + len - 5, ".gguf") == 0) len -= 5;
    int n = snprintf(buf, cap, "%.*s.rank%d-of-%d.gguf", (int)len, base, rank, world);
    return n < 0 ? 0 : (size_t)n;
}

enum tp_status tp_shard_write_keys(struct tp_gguf_writer *w, const struct tp_shard_plan *plan, int rank,
                                   const char *weights, const char *source, const char *path, struct tp_error *err)
{
    int32_t ranges[TP_PLAN_MAX_RANKS * 8];
    for (int r = 0; r < plan->world_size; r++) {
        const struct tp_model_shard *q = &plan->ranks[r].shard;
        const int32_t v[8] = {q->q_head_begin, q->q_head_end, q->kv_head_begin, q->kv_head_end,
                              q->ff_begin,     q->ff_end,     q->vocab_begin,   q->vocab_end};
        memcpy(ranges + r * 8, v, sizeof v);
    }
    enum tp_status rc;
    if ((rc = tp_gguf_kv_u32(w, TP_SHARD_KEY_RANK, (uint32_t)rank)) != TP_OK ||
        (rc = tp_gguf_kv_u32(w, TP_SHARD_KEY_WORLD, (uint32_t)plan->world_size)) != TP_OK ||
        (rc = tp_gguf_kv_str(w, TP_SHARD_KEY_WEIGHTS, weights ? weights : "")) != TP_OK ||
        (rc = tp_gguf_kv_array(w, TP_SHARD_KEY_PLAN, TP_GGUF_INT32, ranges, (uint64_t)plan->world_size * 8)) != TP_OK ||
        (rc = tp_gguf_kv_u64(w, TP_SHARD_KEY_PLAN_HASH, tp_shard_plan_hash(plan))) != TP_OK ||
        (rc = tp_gguf_kv_str(w, TP_SHARD_KEY_SOURCE, source)) != TP_OK)
        return tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
    if (plan->moe_split != TP_MOE_SPLIT_AUTO) { /* mixture of experts: the split and every rank's experts */
        int32_t ex[TP_PLAN_MAX_RANKS * 4];
        for (int r = 0; r < plan->world_size; r++) {
            const struct tp_model_shard *q = &plan->ranks[r].shard;
            const int32_t v[4] = {q->expert_begin, q->expert_end, q->shexp_begin, q->shexp_end};
            memcpy(ex + r * 4, v, sizeof v);
        }
        if ((rc = tp_gguf_kv_str(w, TP_SHARD_KEY_MOE_SPLIT, tp_moe_split_name(plan->moe_split))) != TP_OK ||
            (rc = tp_gguf_kv_array(w, TP_SHARD_KEY_EXPERTS, TP_GGUF_INT32, ex, (uint64_t)plan->world_size * 4)) !=
                TP_OK)
            return tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
    }
    return TP_OK;
}

static enum tp_status write_one(tp_gguf_t *g, const struct tp_model_probe *pr, const struct tp_shard_plan *plan,
                                int rank, const char *weights, const char *path, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    tp_gguf_writer_t *w = NULL;
    const struct tp_model_shard *s = &plan->ranks[rank].shard;
    TP_CHECK_GOTO(tp_gguf_writer_open(path, tp_gguf_alignment(g), &w, err), rc, out);
    for (int i = 0; i < tp_gguf_n_kv(g); i++) {
        if (strncmp(tp_gguf_key(g, i), "tpserve.shard.", 14) == 0) continue;
        TP_CHECK_GOTO(copy_kv(g, i, w, err), rc, out);
    }
    const char *src = strrchr(tp_gguf_path(g), '/');
    src = src ? src + 1 : tp_gguf_path(g);
    TP_CHECK_GOTO(tp_shard_write_keys(w, plan, rank, weights, src, path, err), rc, out);
    /* declare tensors (a dropped one is not in this rank's file) */
    for (int i = 0; i < tp_gguf_n_tensors(g); i++) {
        const struct tp_gguf_tensor *t = tp_gguf_tensor(g, i);
        struct cut c;
        TP_CHECK_GOTO(cut_of(t, &pr->hp, s, tp_gguf_path(g), &c, err), rc, out);
        if (c.drop) continue;
        int64_t ne[TP_GGUF_MAX_DIMS];
        memcpy(ne, t->ne, sizeof ne);
        ne[0] = c.c1 - c.c0;
        if (t->n_dims > 1) ne[1] = c.r1 - c.r0;
        if (t->n_dims > 2) ne[2] = c.s1 - c.s0;
        if ((rc = tp_gguf_add_tensor(w, t->name, t->type, t->n_dims, ne)) != TP_OK) {
            tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
            goto out;
        }
    }
    /* data: whole tensors at once; a cut one row by row (or a run of whole rows per stacked matrix) */
    for (int i = 0; i < tp_gguf_n_tensors(g); i++) {
        const struct tp_gguf_tensor *t = tp_gguf_tensor(g, i);
        struct cut c;
        TP_CHECK_GOTO(cut_of(t, &pr->hp, s, tp_gguf_path(g), &c, err), rc, out);
        if (c.drop) continue;
        const uint8_t *d = t->data;
        if (c.whole) {
            rc = t->n_bytes ? tp_gguf_write_data(w, d, (size_t)t->n_bytes) : TP_OK;
        } else {
            const int64_t be = tp_gguf_wtype_block_elems((uint32_t)t->type);
            const size_t bb = tp_gguf_wtype_block_bytes((uint32_t)t->type);
            const int64_t ne1 = t->n_dims > 1 ? t->ne[1] : 1;
            const size_t row_bytes = (size_t)(t->ne[0] / be) * bb, off = (size_t)(c.c0 / be) * bb,
                         len = (size_t)((c.c1 - c.c0) / be) * bb;
            for (int64_t m = c.s0; rc == TP_OK && m < c.s1; m++) {
                const uint8_t *mat = d + (size_t)(m * ne1) * row_bytes;
                if (len == row_bytes)
                    rc = tp_gguf_write_data(w, mat + (size_t)c.r0 * row_bytes, (size_t)(c.r1 - c.r0) * row_bytes);
                else
                    for (int64_t r = c.r0; rc == TP_OK && r < c.r1; r++)
                        rc = tp_gguf_write_data(w, mat + (size_t)r * row_bytes + off, len);
            }
        }
        if (rc != TP_OK) {
            tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
            goto out;
        }
    }
    if ((rc = tp_gguf_writer_finish(w)) != TP_OK) tp_error_set(err, rc, "%s: %s", path, tp_gguf_writer_error(w));
out:
    tp_gguf_writer_free(w);
    return rc;
}

enum tp_status tp_parallel_write_shards(const char *model_path, int world, const char *shard_weights,
                                        const char *out_dir, struct tp_error *err)
{
    return tp_parallel_write_shards_moe(model_path, world, shard_weights, TP_MOE_SPLIT_AUTO, out_dir, err);
}

enum tp_status tp_parallel_write_shards_moe(const char *model_path, int world, const char *shard_weights,
                                            enum tp_moe_split split, const char *out_dir, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    tp_gguf_t *g = NULL;
    struct tp_model_probe *pr = calloc(1, sizeof *pr);
    struct tp_shard_plan *plan = calloc(1, sizeof *plan);
    double w[TP_PLAN_MAX_RANKS];
    if (!pr || !plan) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (!model_path || !out_dir) {
        rc = tp_error_set(err, TP_ERR_INVALID_ARG, "tp_parallel_write_shards: model path and output directory needed");
        goto out;
    }
    TP_CHECK_GOTO(tp_model_probe(model_path, pr, err), rc, out);
    if (pr->is_shard) {
        rc = tp_error_set(err, TP_ERR_INVALID_ARG,
                          "%s is already a shard file (rank %d of %d); cut shards from the full model", model_path,
                          pr->shard_rank, pr->shard_world);
        goto out;
    }
    if (world < 1 || world > TP_PLAN_MAX_RANKS) {
        rc = tp_error_set(err, TP_ERR_INVALID_ARG, "-n %d is out of range [1, %d]", world, TP_PLAN_MAX_RANKS);
        goto out;
    }
    if (pr->hp.arch == TP_ARCH_GPTOSS && tp_hf_is_dir(model_path)) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED,
                          "%s is a Hugging Face gpt-oss directory: tpserve shard cuts its fused MXFP4 experts from "
                          "GGUF files only; shard the GGUF, or give every rank the directory (each rank reads only "
                          "its slice of the experts)",
                          model_path);
        goto out;
    }
    if (shard_weights && *shard_weights) TP_CHECK_GOTO(tp_parallel_parse_weights(shard_weights, world, w, err), rc, out);
    TP_CHECK_GOTO(tp_parallel_plan_moe(&pr->hp, &pr->types, world, shard_weights && *shard_weights ? w : NULL, split,
                                       plan, err),
                  rc, out);
    if (plan->moe_split != TP_MOE_SPLIT_AUTO) tp_log(TP_LOG_INFO, TP_PARALLEL_MODULE, "%s", plan->note);
    if (tp_hf_is_dir(model_path)) { /* Hugging Face directory: shard_hf.c */
        rc = tp_shard_write_hf(model_path, pr, plan, shard_weights, out_dir, err);
        goto out;
    }
    TP_CHECK_GOTO(tp_gguf_open(model_path, &g, err), rc, out);
    for (int r = 0; r < world; r++) {
        char name[512], path[1024];
        tp_parallel_shard_name(model_path, r, world, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", out_dir, name);
        TP_CHECK_GOTO(write_one(g, pr, plan, r, shard_weights, path, err), rc, out);
        tp_log(TP_LOG_INFO, TP_PARALLEL_MODULE, "wrote %s (%.1f MiB of weights for rank %d of %d)", path,
               (double)(plan->ranks[r].sharded_bytes + plan->ranks[r].replicated_bytes) / 1048576.0, r, world);
    }
out:
    tp_gguf_close(g);
    free(pr);
    free(plan);
    return rc;
}

/*
 * model/mlx_load.c - MLX quantized safetensors (mlx-community layout, see
 * mlx_impl.h): the quantization block of config.json, naming packed U32
 * tensors as MLX weight types for the tensor source, and loading one rank's
 * slice of a weight / scales / biases triple, validated, without repacking.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels.h"
#include "model/mlx_impl.h"

#define MAX_CONFIG_BYTES ((long)16 << 20)

/* ------------------------------------------------------------ config.json */

void tp_mlx_quant_free(struct tp_mlx_quant *q)
{
    if (!q) return;
    free(q->over);
    free(q);
}

/* bits / group_size of one quantization object; 0 when absent */
static enum tp_status bits_group(const cJSON *o, const char *path, const char *what, int *bits, int *group,
                                 struct tp_error *err)
{
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "bits");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "group_size");
    *bits = *group = 0;
    if (!b && !g) return TP_OK;
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(g) || b->valuedouble != (int)b->valuedouble ||
        g->valuedouble != (int)g->valuedouble)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: %s needs integer \"bits\" and \"group_size\"", path, what);
    *bits = (int)b->valuedouble;
    *group = (int)g->valuedouble;
    if (tp_wtype_mlx(*bits, *group) == TP_WTYPE_COUNT)
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "%s: %s: MLX quantization with %d bits and group size %d is not supported (bits 4 or 8, "
                            "group size 32 or 64; requantize with mlx_lm.convert -q --q-bits 4 --q-group-size 64)",
                            path, what, *bits, *group);
    return TP_OK;
}

static enum tp_status parse_quant(const cJSON *q, const char *path, const char *key, struct tp_mlx_quant *out,
                                  struct tp_error *err)
{
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(q, "mode"); /* newer mlx: "affine" (default), "mxfp4", ... */
    if (mode && !(cJSON_IsString(mode) && strcmp(mode->valuestring, "affine") == 0))
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "%s: \"%s\".mode %s%.32s%s is not supported (MLX affine quantization only: bits 4 or 8, "
                            "group size 32 or 64)",
                            path, key, cJSON_IsString(mode) ? "'" : "", cJSON_IsString(mode) ? mode->valuestring : "(not a string)",
                            cJSON_IsString(mode) ? "'" : "");
    enum tp_status rc = bits_group(q, path, key, &out->bits, &out->group, err);
    if (rc != TP_OK) return rc;
    if (!out->bits) return tp_error_set(err, TP_ERR_FORMAT, "%s: \"%s\" has no bits / group_size", path, key);
    int n = 0;
    for (const cJSON *c = q->child; c; c = c->next)
        if (cJSON_IsObject(c) || cJSON_IsBool(c)) n++;
    if (n == 0) return TP_OK;
    out->over = calloc((size_t)n, sizeof(*out->over));
    if (!out->over) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    for (const cJSON *c = q->child; c; c = c->next) {
        if (!cJSON_IsObject(c) && !cJSON_IsBool(c)) continue;
        struct tp_mlx_override *o = &out->over[out->n_over];
        if (strlen(c->string) >= sizeof(o->module)) continue; /* no module name is that long */
        snprintf(o->module, sizeof(o->module), "%s", c->string);
        if (cJSON_IsBool(c)) {
            o->bits = cJSON_IsTrue(c) ? out->bits : 0;
            o->group = cJSON_IsTrue(c) ? out->group : 0;
        } else {
            char what[192];
            snprintf(what, sizeof(what), "\"%s\".\"%.120s\"", key, c->string);
            if ((rc = bits_group(c, path, what, &o->bits, &o->group, err)) != TP_OK) return rc;
            if (!o->bits) o->bits = out->bits, o->group = out->group;
        }
        out->n_over++;
    }
    return TP_OK;
}

enum tp_status tp_mlx_read_quant(const char *dir, struct tp_mlx_quant **out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    char path[4096];
    char *text = NULL;
    cJSON *root = NULL;
    struct tp_mlx_quant *q = NULL;
    *out = NULL;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return tp_error_set(err, TP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    long sz = -1;
    if (fseek(f, 0, SEEK_END) == 0) sz = ftell(f);
    if (sz < 0 || sz > MAX_CONFIG_BYTES || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return tp_error_set(err, TP_ERR_FORMAT, "%s: unreadable or larger than 16 MiB", path);
    }
    text = malloc((size_t)sz + 1);
    if (!text || fread(text, 1, (size_t)sz, f) != (size_t)sz) {
        fclose(f);
        free(text);
        return tp_error_set(err, TP_ERR_IO, "%s: read failed", path);
    }
    fclose(f);
    text[sz] = '\0';
    root = cJSON_Parse(text);
    if (!cJSON_IsObject(root)) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: not a JSON object", path);
        goto done;
    }
    const char *key = "quantization";
    const cJSON *qj = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsObject(qj)) {
        key = "quantization_config";
        qj = cJSON_GetObjectItemCaseSensitive(root, key);
        const cJSON *qm = cJSON_GetObjectItemCaseSensitive(qj, "quant_method");
        if (!cJSON_IsObject(qj) || (qm && !(cJSON_IsString(qm) && strcmp(qm->valuestring, "mlx") == 0)) ||
            !cJSON_GetObjectItemCaseSensitive(qj, "bits"))
            goto done; /* not MLX-quantized (hf_config.c refuses foreign methods) */
    }
    q = calloc(1, sizeof(*q));
    if (!q) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory");
        goto done;
    }
    TP_CHECK_GOTO(parse_quant(qj, path, key, q, err), rc, done);
    *out = q;
    q = NULL;
done:
    tp_mlx_quant_free(q);
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* Expected (bits, group) of the module of HF tensor name w_name ("...X.weight"). */
static void expected_for(const struct tp_mlx_quant *q, const char *w_name, int *bits, int *group)
{
    *bits = q->bits;
    *group = q->group;
    size_t len = strlen(w_name);
    if (len > 7 && strcmp(w_name + len - 7, ".weight") == 0) len -= 7;
    for (int i = 0; i < q->n_over; i++)
        if (strlen(q->over[i].module) == len && strncmp(q->over[i].module, w_name, len) == 0) {
            *bits = q->over[i].bits;
            *group = q->over[i].group;
        }
}

/* ------------------------------------------------------------ triples */

/* The sibling "BASE.<suffix>" of "BASE.weight", or NULL. */
static const struct tp_st_tensor *sibling(tp_st_t *st, const char *w_name, const char *suffix, char *name, size_t cap)
{
    size_t len = strlen(w_name);
    if (len > 7 && strcmp(w_name + len - 7, ".weight") == 0) len -= 7;
    const size_t sl = strlen(suffix);
    if (len + sl + 2 > cap) return NULL;
    memcpy(name, w_name, len);
    name[len] = '.';
    memcpy(name + len + 1, suffix, sl + 1);
    return tp_st_find(st, name);
}

void tp_mlx_tsrc_describe(const struct tp_tsrc *s, const struct tp_st_tensor *w, struct tp_tsrc_tensor *out)
{
    char name[256];
    const struct tp_st_tensor *sc = sibling(s->st, w->name, "scales", name, sizeof(name));
    if (!sc || w->dtype != TP_ST_U32 || w->n_dims != 2 || sc->n_dims != 2 || sc->shape[0] != w->shape[0] ||
        sc->shape[1] <= 0)
        return;
    const int order[3] = {s->mlx_bits, 4, 8};
    for (int i = 0; i < 3; i++) {
        const int bits = order[i];
        if (bits != 4 && bits != 8) continue;
        const int64_t in = w->shape[1] * (32 / bits);
        if (in % sc->shape[1]) continue;
        const enum tp_wtype t = tp_wtype_mlx(bits, (int)(in / sc->shape[1]));
        if (t == TP_WTYPE_COUNT) continue;
        out->type = t;
        out->type_name = tp_wtype_name(t);
        out->ne[0] = in;
        out->n_elems = in * w->shape[0];
        return;
    }
}

static const char *sdt(enum tp_st_dtype d) { return tp_st_dtype_name(d); }

enum tp_status tp_mlx_load_mat(tp_model_t *m, const struct tp_tsrc_tensor *t, int64_t rows_full, int64_t cols_full,
                               int64_t r0, int64_t r1, int64_t c0, int64_t c1, struct tp_wmat *w, uint64_t *bytes)
{
    const struct tp_st_tensor *wt = t->st;
    const char *nm = wt->name;
    char sname[256], bname[256];
    *bytes = 0;
    if (!m->st || !wt) return tp_error_set(&m->err, TP_ERR_INTERNAL, "%s: MLX load without safetensors", m->path);
    const struct tp_st_tensor *st = sibling(m->st, nm, "scales", sname, sizeof(sname));
    const struct tp_st_tensor *bt = sibling(m->st, nm, "biases", bname, sizeof(bname));
    if (!m->mlxq)
        return tp_error_set(&m->err, TP_ERR_FORMAT,
                            "%s: tensor '%s' is packed U32 (MLX quantized) but config.json has no \"quantization\" "
                            "block with bits and group_size (restore config.json from the model's repository)",
                            m->path, nm);
    if (!st || !bt)
        return tp_error_set(&m->err, TP_ERR_FORMAT,
                            "%s: MLX-quantized '%s' needs '%s' and '%s'; %s is missing (incomplete download, or not "
                            "MLX affine quantization)",
                            m->path, nm, sname, bname, !st ? sname : bname);
    if (wt->n_dims != 2 || st->n_dims != 2 || bt->n_dims != 2)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: MLX triple '%s': weight, scales and biases must be 2-D (have %d, %d, %d dims)",
                            m->path, nm, wt->n_dims, st->n_dims, bt->n_dims);
    if (st->dtype != TP_ST_F16 && st->dtype != TP_ST_BF16)
        return tp_error_set(&m->err, TP_ERR_UNSUPPORTED, "%s: '%s' has dtype %s; MLX scales must be F16 or BF16", m->path,
                            sname, sdt(st->dtype));
    if (bt->dtype != st->dtype)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: '%s' is %s but '%s' is %s; scales and biases must share a dtype",
                            m->path, bname, sdt(bt->dtype), sname, sdt(st->dtype));
    if (wt->shape[0] != rows_full)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: '%s' has %lld rows, the model's shape needs %lld", m->path, nm,
                            (long long)wt->shape[0], (long long)rows_full);
    if (st->shape[0] != bt->shape[0] || st->shape[1] != bt->shape[1] || st->shape[0] != rows_full)
        return tp_error_set(&m->err, TP_ERR_FORMAT,
                            "%s: '%s' shape [%lld, %lld] and '%s' shape [%lld, %lld] must both be [%lld, groups]",
                            m->path, sname, (long long)st->shape[0], (long long)st->shape[1], bname,
                            (long long)bt->shape[0], (long long)bt->shape[1], (long long)rows_full);
    /* deduce bits from the packed width, group from the scales' width */
    const int64_t words = wt->shape[1], ng = st->shape[1];
    if (words <= 0 || ng <= 0 || (words * 32) % cols_full != 0 || cols_full % ng != 0)
        return tp_error_set(&m->err, TP_ERR_FORMAT,
                            "%s: '%s' packs %lld columns into %lld uint32 words per row with %lld groups: not whole "
                            "bits per value / whole groups",
                            m->path, nm, (long long)cols_full, (long long)words, (long long)ng);
    const int bits = (int)(words * 32 / cols_full), group = (int)(cols_full / ng);
    int want_bits, want_group;
    expected_for(m->mlxq, nm, &want_bits, &want_group);
    if (bits != want_bits || group != want_group)
        return tp_error_set(&m->err, TP_ERR_FORMAT,
                            "%s: '%s' is %d-bit with group size %d by its shapes ([%lld, %lld] words for %lld "
                            "columns, %lld groups) but config.json quantization says %d bits, group size %d",
                            m->path, nm, bits, group, (long long)rows_full, (long long)words, (long long)cols_full,
                            (long long)ng, want_bits, want_group);
    const enum tp_wtype type = tp_wtype_mlx(bits, group);
    if (type == TP_WTYPE_COUNT)
        return tp_error_set(&m->err, TP_ERR_UNSUPPORTED,
                            "%s: '%s' is %d-bit MLX with group size %d; supported: 4 or 8 bits, group 32 or 64", m->path,
                            nm, bits, group);
    if (c0 % group != 0 || (c1 - c0) % group != 0)
        return tp_error_set(&m->err, TP_ERR_INVALID_ARG,
                            "%s: tensor '%s': shard columns [%lld, %lld) cut an MLX group of %d; choose group-aligned "
                            "FFN/head boundaries",
                            m->path, nm, (long long)c0, (long long)c1, group);
    const int64_t rows = r1 - r0, cols = c1 - c0;
    const size_t wrb_full = (size_t)words * 4, srb_full = (size_t)ng * 2;
    const size_t wrb = (size_t)cols * (size_t)bits / 8, srb = (size_t)(cols / group) * 2;
    *bytes = (uint64_t)rows * (wrb + 2 * srb);
    if (m->dry_run) return TP_OK;
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->sb_bf16 = st->dtype == TP_ST_BF16;
    w->owned = NULL;
    w->owned_sb = NULL;
    if (rows == rows_full && cols == cols_full) { /* whole: zero-copy from the mappings (kernels load unaligned) */
        w->data = wt->data;
        w->row_bytes = wrb_full;
        w->scales = st->data;
        w->biases = bt->data;
        w->sb_row_bytes = srb_full;
        return TP_OK;
    }
    /* this rank's byte ranges only, packed words and groups as the file holds them */
    size_t wbytes = 0, sbytes = 0;
    if (tp_mul_size(wrb, (size_t)rows, &wbytes) != 0 || tp_mul_size(srb, (size_t)rows, &sbytes) != 0)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: '%s': slice size overflows", m->path, nm);
    w->owned = tp_aligned_alloc(64, wbytes ? wbytes : 64);
    w->owned_sb = tp_aligned_alloc(64, 2 * sbytes + 64);
    if (!w->owned || !w->owned_sb)
        return tp_error_set(&m->err, TP_ERR_NOMEM, "%s: out of memory for '%s' (%zu bytes)", m->path, nm,
                            wbytes + 2 * sbytes);
    uint8_t *wd = w->owned, *sd = w->owned_sb, *bd = sd + sbytes;
    w->data = wd;
    w->row_bytes = wrb;
    w->scales = sd;
    w->biases = bd;
    w->sb_row_bytes = srb;
    struct tp_error e = {0};
    enum tp_status rc = TP_OK;
    const uint64_t wcol = (uint64_t)c0 * (uint64_t)bits / 8, scol = (uint64_t)(c0 / group) * 2;
    if (cols == cols_full) { /* column-parallel: contiguous rows */
        rc = tp_st_pread(m->st, wt, wd, wbytes, (uint64_t)r0 * wrb_full, &e);
        if (rc == TP_OK) rc = tp_st_pread(m->st, st, sd, sbytes, (uint64_t)r0 * srb_full, &e);
        if (rc == TP_OK) rc = tp_st_pread(m->st, bt, bd, sbytes, (uint64_t)r0 * srb_full, &e);
    } else { /* row-parallel: a column range of every row */
        for (int64_t r = 0; r < rows && rc == TP_OK; r++) {
            const uint64_t rr = (uint64_t)(r0 + r);
            rc = tp_st_pread(m->st, wt, wd + (size_t)r * wrb, wrb, rr * wrb_full + wcol, &e);
            if (rc == TP_OK) rc = tp_st_pread(m->st, st, sd + (size_t)r * srb, srb, rr * srb_full + scol, &e);
            if (rc == TP_OK) rc = tp_st_pread(m->st, bt, bd + (size_t)r * srb, srb, rr * srb_full + scol, &e);
        }
    }
    if (rc != TP_OK) return tp_error_set(&m->err, rc, "%s", e.msg);
    return TP_OK;
}

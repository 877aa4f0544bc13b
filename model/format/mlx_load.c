/*
 * model/format/mlx_load.c - MLX quantized safetensors (mlx-community layout, see
 * model/mlx_quant.h): the quantization block of config.json, naming packed U32
 * tensors as MLX weight types for the tensor source, and loading one rank's
 * slice of a weight / scales / biases triple, validated, without repacking.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/kernels.h"
#include "format/mlx_impl.h"

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

enum tp_status tp_mlx_read_quant_gguf(tp_gguf_t *g, struct tp_mlx_quant **out, struct tp_error *err)
{
    const char *path = tp_gguf_path(g);
    int64_t bits = 0, group = 0;
    *out = NULL;
    if (tp_gguf_find_key(g, TP_MLX_KEY_BITS) < 0) return TP_OK;
    if (tp_gguf_get_int(g, TP_MLX_KEY_BITS, &bits) != TP_OK || tp_gguf_get_int(g, TP_MLX_KEY_GROUP, &group) != TP_OK ||
        tp_wtype_mlx((int)bits, (int)group) == TP_WTYPE_COUNT || bits != (int)bits || group != (int)group)
        return tp_error_set(err, TP_ERR_FORMAT,
                            "%s: %s / %s missing or not 4 / 8 bits with group size 32 / 64 (a damaged shard file: "
                            "cut it again with tpserve shard)",
                            path, TP_MLX_KEY_BITS, TP_MLX_KEY_GROUP);
    struct tp_mlx_quant *q = calloc(1, sizeof(*q));
    if (!q) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    q->bits = (int)bits;
    q->group = (int)group;
    const int k = tp_gguf_find_key(g, TP_MLX_KEY_OVERRIDES);
    const uint64_t n = k >= 0 && tp_gguf_arr_type(g, k) == TP_GGUF_STRING ? tp_gguf_arr_len(g, k) : 0;
    if (k >= 0 && (tp_gguf_arr_type(g, k) != TP_GGUF_STRING || n > 1000000)) {
        tp_mlx_quant_free(q);
        return tp_error_set(err, TP_ERR_FORMAT, "%s: %s is not an array of strings", path, TP_MLX_KEY_OVERRIDES);
    }
    if (n) {
        q->over = calloc((size_t)n, sizeof(*q->over));
        if (!q->over) {
            tp_mlx_quant_free(q);
            return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
        }
    }
    for (uint64_t j = 0; j < n; j++) {
        size_t len = 0;
        const char *e = tp_gguf_arr_str(g, k, j, &len);
        struct tp_mlx_override *o = &q->over[q->n_over];
        char buf[192];
        const char *c1 = NULL;
        if (e && len < sizeof(buf)) {
            memcpy(buf, e, len);
            buf[len] = '\0';
            c1 = strchr(buf, ':');
        }
        int ob = 0, og = 0, used = 0;
        if (!c1 || (size_t)(c1 - buf) >= sizeof(o->module) || sscanf(c1 + 1, "%d:%d%n", &ob, &og, &used) != 2 ||
            c1[1 + used] != '\0' || tp_wtype_mlx(ob, og) == TP_WTYPE_COUNT) {
            tp_mlx_quant_free(q);
            return tp_error_set(err, TP_ERR_FORMAT, "%s: %s[%llu] is not \"MODULE:BITS:GROUP\" with 4 / 8 bits, group 32 / 64",
                                path, TP_MLX_KEY_OVERRIDES, (unsigned long long)j);
        }
        memcpy(o->module, buf, (size_t)(c1 - buf));
        o->module[c1 - buf] = '\0';
        o->bits = ob;
        o->group = og;
        q->n_over++;
    }
    *out = q;
    return TP_OK;
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

/* "BASE.<suffix>" of "BASE.weight" (or of w_name itself) into name[cap]; 0 if it does not fit. */
static int sibling_name(const char *w_name, const char *suffix, char *name, size_t cap)
{
    size_t len = strlen(w_name);
    if (len > 7 && strcmp(w_name + len - 7, ".weight") == 0) len -= 7;
    const size_t sl = strlen(suffix);
    if (len + sl + 2 > cap) return 0;
    memcpy(name, w_name, len);
    name[len] = '.';
    memcpy(name + len + 1, suffix, sl + 1);
    return 1;
}

const struct tp_st_tensor *tp_mlx_st_sibling(tp_st_t *st, const char *w_name, const char *suffix, char *name, size_t cap)
{
    return sibling_name(w_name, suffix, name, cap) ? tp_st_find(st, name) : NULL;
}

/* The GGUF sibling "BASE.<suffix>" of "BASE.weight", or NULL. */
static const struct tp_gguf_tensor *gguf_sibling(const tp_gguf_t *g, const char *w_name, const char *suffix, char *name,
                                                 size_t cap)
{
    return sibling_name(w_name, suffix, name, cap) ? tp_gguf_find_tensor(g, name) : NULL;
}

/* rows x words of packed weight with sc_rows x groups scales: the MLX type (bits tried pref, 4, 8) into out */
static void describe(int pref, int64_t rows, int64_t words, int64_t sc_rows, int64_t groups, struct tp_tsrc_tensor *out)
{
    if (sc_rows != rows || groups <= 0 || words <= 0) return;
    const int order[3] = {pref, 4, 8};
    for (int i = 0; i < 3; i++) {
        const int bits = order[i];
        if (bits != 4 && bits != 8) continue;
        const int64_t in = words * (32 / bits);
        if (in % groups) continue;
        const enum tp_wtype t = tp_wtype_mlx(bits, (int)(in / groups));
        if (t == TP_WTYPE_COUNT) continue;
        out->type = t;
        out->type_name = tp_wtype_name(t);
        out->ne[0] = in;
        out->n_elems = in * rows;
        return;
    }
}

void tp_mlx_tsrc_describe(const struct tp_tsrc *s, const struct tp_st_tensor *w, struct tp_tsrc_tensor *out)
{
    char name[256];
    const struct tp_st_tensor *sc = tp_mlx_st_sibling(s->st, w->name, "scales", name, sizeof(name));
    if (!sc || w->dtype != TP_ST_U32) return;
    if (w->n_dims == 2 && sc->n_dims == 2) describe(s->mlx_bits, w->shape[0], w->shape[1], sc->shape[0], sc->shape[1], out);
    /* mlx-lm's stacked experts (SwitchLinear): [n_expert, rows, words] with [n_expert, rows, groups] scales */
    if (w->n_dims == 3 && sc->n_dims == 3 && sc->shape[0] == w->shape[0]) {
        describe(s->mlx_bits, w->shape[1], w->shape[2], sc->shape[1], sc->shape[2], out);
        out->n_elems *= w->shape[0];
    }
}

void tp_mlx_tsrc_describe_gguf(const struct tp_tsrc *s, const struct tp_gguf_tensor *w, struct tp_tsrc_tensor *out)
{
    char name[256];
    const size_t len = strlen(w->name);
    if (w->type != TP_WTYPE_I32 || (w->n_dims != 2 && w->n_dims != 3) || len < 7 ||
        strcmp(w->name + len - 7, ".weight") != 0)
        return;
    const struct tp_gguf_tensor *sc = s->gguf ? gguf_sibling(s->gguf, w->name, "scales", name, sizeof(name)) : NULL;
    /* in an MLX shard (keys present) or beside scales, only MLX words are I32 weights: tp_mlx_load_mat
     * explains a broken triple; elsewhere an I32 weight stays I32 (refused as a type nobody computes with) */
    out->mlx_packed = s->mlx_bits || sc;
    if (sc && sc->n_dims == 2 && w->n_dims == 2) describe(s->mlx_bits, w->ne[1], w->ne[0], sc->ne[1], sc->ne[0], out);
    /* a shard's stacked experts: words ne = [words, rows, experts], scales [groups, rows, experts] */
    if (sc && sc->n_dims == 3 && w->n_dims == 3 && sc->ne[2] == w->ne[2]) {
        describe(s->mlx_bits, w->ne[1], w->ne[0], sc->ne[1], sc->ne[0], out);
        out->n_elems *= w->ne[2];
    }
}

/* One tensor of a triple, from either source: row-major [rows, cols] of elements of its dtype. */
struct part {
    const char *name, *file, *dtype; /* for messages */
    int kind;                        /* 0 packed words (U32 / I32), 1 F16, 2 BF16, -1 other */
    int n_dims;
    int64_t rows, cols;
    const void *data;
    uint64_t n_bytes, file_offset;
    int fd;
};

static void part_st(const tp_st_t *st, const struct tp_st_tensor *t, struct part *p)
{
    p->name = t->name;
    p->file = tp_st_file_path(st, t->file);
    p->dtype = tp_st_dtype_name(t->dtype);
    p->kind = t->dtype == TP_ST_U32 ? 0 : t->dtype == TP_ST_F16 ? 1 : t->dtype == TP_ST_BF16 ? 2 : -1;
    p->n_dims = t->n_dims;
    p->rows = t->n_dims >= 1 ? t->shape[0] : 1;
    p->cols = t->n_dims >= 2 ? t->shape[1] : 1;
    if (t->n_dims == 3) { /* stacked experts: one [n_expert * rows, cols] matrix */
        p->n_dims = 2;
        p->rows = t->shape[0] * t->shape[1];
        p->cols = t->shape[2];
    }
    p->data = t->data;
    p->n_bytes = t->n_bytes;
    p->file_offset = t->file_offset;
    p->fd = tp_st_file_fd(st, t->file);
}

static void part_gguf(const tp_gguf_t *g, const struct tp_gguf_tensor *t, struct part *p)
{
    p->name = t->name;
    p->file = tp_gguf_path(g);
    p->dtype = tp_wtype_name(t->type);
    p->kind = t->type == TP_WTYPE_I32 ? 0 : t->type == TP_WTYPE_F16 ? 1 : t->type == TP_WTYPE_BF16 ? 2 : -1;
    p->n_dims = t->n_dims;
    p->rows = t->n_dims >= 2 ? t->ne[1] : 1;
    p->cols = t->ne[0];
    if (t->n_dims == 3) { /* a shard's stacked experts: one [experts * rows, cols] matrix */
        p->n_dims = 2;
        p->rows = t->ne[1] * t->ne[2];
    }
    p->data = t->data;
    p->n_bytes = t->n_bytes;
    p->file_offset = t->file_offset;
    p->fd = tp_gguf_fd(g);
}

/* n bytes at byte offset off inside part p (bounds checked), with pread, or from the mapping without an fd */
static enum tp_status part_read(tp_model_t *m, const struct part *p, void *dst, size_t n, uint64_t off)
{
    if (off > p->n_bytes || n > p->n_bytes - off)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: tensor '%s': bytes [%llu, +%zu) are outside its %llu bytes",
                            p->file, p->name, (unsigned long long)off, n, (unsigned long long)p->n_bytes);
    if (p->fd < 0) {
        if (n) memcpy(dst, (const uint8_t *)p->data + off, n);
        return TP_OK;
    }
    uint8_t *d = dst;
    off += p->file_offset;
    while (n > 0) {
        ssize_t r = pread(p->fd, d, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return tp_error_set(&m->err, TP_ERR_IO, "%s: reading tensor '%s' at offset %llu failed: %s", p->file, p->name,
                                (unsigned long long)off, r < 0 ? strerror(errno) : "unexpected end of file");
        d += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return TP_OK;
}

/* The MLX triple of t (X.weight packed words, X.scales, X.biases) from the model's safetensors or GGUF
 * file, checked: present, 2-D, U32 (I32 in a shard file) words, F16 / BF16 scales and biases alike.
 * p[0..2]: weight, scales, biases. */
static enum tp_status mlx_triple(tp_model_t *m, const struct tp_tsrc_tensor *t, struct part p[3])
{
    const char *nm = t->name;
    char sname[256], bname[256];
    struct part *wpp = &p[0], *spp = &p[1], *bpp = &p[2];
    int have_s = 0, have_b = 0;
    memset(p, 0, 3 * sizeof *p);
    snprintf(sname, sizeof sname, "?");
    snprintf(bname, sizeof bname, "?");
    if (t->st && m->st) {
        part_st(m->st, t->st, wpp);
        const struct tp_st_tensor *st = tp_mlx_st_sibling(m->st, nm, "scales", sname, sizeof(sname));
        const struct tp_st_tensor *bt = tp_mlx_st_sibling(m->st, nm, "biases", bname, sizeof(bname));
        if ((have_s = st != NULL)) part_st(m->st, st, spp);
        if ((have_b = bt != NULL)) part_st(m->st, bt, bpp);
    } else if (!t->st && m->gguf) {
        const struct tp_gguf_tensor *gw = tp_gguf_find_tensor(m->gguf, nm);
        if (!gw) return tp_error_set(&m->err, TP_ERR_INTERNAL, "%s: MLX tensor '%s' vanished", m->path, nm);
        part_gguf(m->gguf, gw, wpp);
        const struct tp_gguf_tensor *st = gguf_sibling(m->gguf, nm, "scales", sname, sizeof(sname));
        const struct tp_gguf_tensor *bt = gguf_sibling(m->gguf, nm, "biases", bname, sizeof(bname));
        if ((have_s = st != NULL)) part_gguf(m->gguf, st, spp);
        if ((have_b = bt != NULL)) part_gguf(m->gguf, bt, bpp);
    } else {
        return tp_error_set(&m->err, TP_ERR_INTERNAL, "%s: MLX load of '%s' without its source", m->path, nm);
    }
    if (!m->mlxq)
        return tp_error_set(&m->err, TP_ERR_FORMAT,
                            m->gguf ? "%s: tensor '%s' is packed MLX words but the file has no " TP_MLX_KEY_BITS
                                      " / " TP_MLX_KEY_GROUP " keys (a damaged shard file: cut it again with tpserve shard)"
                                    : "%s: tensor '%s' is packed U32 (MLX quantized) but config.json has no \"quantization\" "
                                      "block with bits and group_size (restore config.json from the model's repository)",
                            m->path, nm);
    if (!have_s || !have_b)
        return tp_error_set(&m->err, TP_ERR_FORMAT,
                            "%s: MLX-quantized '%s' needs '%s' and '%s'; %s is missing (%s)", m->path, nm, sname, bname,
                            !have_s ? sname : bname,
                            t->st ? "incomplete download, or not MLX affine quantization"
                                  : "a damaged shard file: cut it again with tpserve shard");
    if (wpp->n_dims != 2 || spp->n_dims != 2 || bpp->n_dims != 2)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: MLX triple '%s': weight, scales and biases must be 2-D (have %d, %d, %d dims)",
                            m->path, nm, wpp->n_dims, spp->n_dims, bpp->n_dims);
    if (wpp->kind != 0)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: '%s' has dtype %s; MLX packed words must be U32 (I32 in a shard file)",
                            m->path, nm, wpp->dtype);
    if (spp->kind != 1 && spp->kind != 2)
        return tp_error_set(&m->err, TP_ERR_UNSUPPORTED, "%s: '%s' has dtype %s; MLX scales must be F16 or BF16", m->path,
                            sname, spp->dtype);
    if (bpp->kind != spp->kind)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: '%s' is %s but '%s' is %s; scales and biases must share a dtype",
                            m->path, bname, bpp->dtype, sname, spp->dtype);
    return TP_OK;
}

/* Rows [r0, r0 + rows) x columns [c0, c0 + cols) of the triple p (bits, group; full rows of wrb_full /
 * srb_full bytes) read into buffers w owns. */
static enum tp_status mlx_read_slice(tp_model_t *m, const char *nm, const struct part p[3], int64_t r0, int64_t rows,
                                     int64_t c0, int64_t cols, int64_t cols_full, int bits, int group,
                                     size_t wrb_full, size_t srb_full, struct tp_wmat *w)
{
    const struct part wp = p[0], sp = p[1], bp = p[2];
    const size_t wrb = (size_t)cols * (size_t)bits / 8, srb = (size_t)(cols / group) * 2;
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
    enum tp_status rc = TP_OK;
    const uint64_t wcol = (uint64_t)c0 * (uint64_t)bits / 8, scol = (uint64_t)(c0 / group) * 2;
    if (cols == cols_full) { /* column-parallel: contiguous rows */
        rc = part_read(m, &wp, wd, wbytes, (uint64_t)r0 * wrb_full);
        if (rc == TP_OK) rc = part_read(m, &sp, sd, sbytes, (uint64_t)r0 * srb_full);
        if (rc == TP_OK) rc = part_read(m, &bp, bd, sbytes, (uint64_t)r0 * srb_full);
    } else { /* row-parallel: a column range of every row */
        for (int64_t r = 0; r < rows && rc == TP_OK; r++) {
            const uint64_t rr = (uint64_t)(r0 + r);
            rc = part_read(m, &wp, wd + (size_t)r * wrb, wrb, rr * wrb_full + wcol);
            if (rc == TP_OK) rc = part_read(m, &sp, sd + (size_t)r * srb, srb, rr * srb_full + scol);
            if (rc == TP_OK) rc = part_read(m, &bp, bd + (size_t)r * srb, srb, rr * srb_full + scol);
        }
    }
    return rc;
}

enum tp_status tp_mlx_load_mat(tp_model_t *m, const struct tp_tsrc_tensor *t, int64_t rows_full, int64_t cols_full,
                               int64_t r0, int64_t r1, int64_t c0, int64_t c1, struct tp_wmat *w, uint64_t *bytes)
{
    const char *nm = t->name;
    struct part p[3];
    *bytes = 0;
    enum tp_status st = mlx_triple(m, t, p);
    if (st != TP_OK) return st;
    const struct part wp = p[0], sp = p[1], bp = p[2];
    char sname[256], bname[256];
    snprintf(sname, sizeof sname, "%s", sp.name);
    snprintf(bname, sizeof bname, "%s", bp.name);
    int want_bits, want_group;
    expected_for(m->mlxq, nm, &want_bits, &want_group);
    /* a shard file cut for this rank holds exactly rows [r0, r1) x columns [c0, c1): use it whole */
    if (!t->st && m->sharded && m->shard.file_is_slice && wp.rows == r1 - r0 &&
        wp.cols * 32 == (c1 - c0) * (int64_t)want_bits &&
        !(wp.rows == rows_full && wp.cols * 32 == cols_full * (int64_t)want_bits)) {
        rows_full = r1 - r0;
        cols_full = c1 - c0;
        r0 = c0 = 0;
        r1 = rows_full;
        c1 = cols_full;
    }
    if (wp.rows != rows_full)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: '%s' has %lld rows, the model's shape needs %lld%s", m->path, nm,
                            (long long)wp.rows, (long long)rows_full,
                            m->sharded && m->shard.file_is_slice ? " (or this shard's slice)" : "");
    if (sp.rows != bp.rows || sp.cols != bp.cols || sp.rows != rows_full)
        return tp_error_set(&m->err, TP_ERR_FORMAT,
                            "%s: '%s' shape [%lld, %lld] and '%s' shape [%lld, %lld] must both be [%lld, groups]",
                            m->path, sname, (long long)sp.rows, (long long)sp.cols, bname, (long long)bp.rows,
                            (long long)bp.cols, (long long)rows_full);
    /* deduce bits from the packed width, group from the scales' width */
    const int64_t words = wp.cols, ng = sp.cols;
    if (words <= 0 || ng <= 0 || cols_full <= 0 || (words * 32) % cols_full != 0 || cols_full % ng != 0)
        return tp_error_set(&m->err, TP_ERR_FORMAT,
                            "%s: '%s' packs %lld columns into %lld uint32 words per row with %lld groups: not whole "
                            "bits per value / whole groups",
                            m->path, nm, (long long)cols_full, (long long)words, (long long)ng);
    const int bits = (int)(words * 32 / cols_full), group = (int)(cols_full / ng);
    if (bits != want_bits || group != want_group)
        return tp_error_set(&m->err, TP_ERR_FORMAT,
                            "%s: '%s' is %d-bit with group size %d by its shapes ([%lld, %lld] words for %lld "
                            "columns, %lld groups) but %s says %d bits, group size %d",
                            m->path, nm, bits, group, (long long)rows_full, (long long)words, (long long)cols_full,
                            (long long)ng, m->gguf ? "the shard's " TP_MLX_KEY_BITS " / " TP_MLX_KEY_GROUP
                                                   : "config.json quantization",
                            want_bits, want_group);
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
    if (wp.n_bytes != (uint64_t)rows_full * wrb_full || sp.n_bytes != (uint64_t)rows_full * srb_full ||
        bp.n_bytes != sp.n_bytes)
        return tp_error_set(&m->err, TP_ERR_FORMAT, "%s: MLX triple '%s': byte sizes do not match the shapes", m->path, nm);
    const size_t wrb = (size_t)cols * (size_t)bits / 8, srb = (size_t)(cols / group) * 2;
    *bytes = (uint64_t)rows * (wrb + 2 * srb);
    if (m->dry_run) return TP_OK;
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->sb_bf16 = sp.kind == 2;
    w->owned = NULL;
    w->owned_sb = NULL;
    if (rows == rows_full && cols == cols_full) { /* whole: zero-copy from the mappings (kernels load unaligned) */
        w->data = wp.data;
        w->row_bytes = wrb_full;
        w->scales = sp.data;
        w->biases = bp.data;
        w->sb_row_bytes = srb_full;
        return TP_OK;
    }
    return mlx_read_slice(m, nm, p, r0, rows, c0, cols, cols_full, bits, group, wrb_full, srb_full, w);
}

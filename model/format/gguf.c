/*
 * model/format/gguf.c - the validating GGUF reader declared in model/gguf.h.
 *
 * The whole header (metadata and tensor table) is parsed through a bounds-
 * checked cursor over the mapped bytes; every length read from the file is
 * compared with the bytes that remain before it is used and every size is
 * computed with overflow checks.  Keys and scalar strings are copied (NUL-
 * terminated); string arrays are indexed by an offset table built during
 * validation so that element access is O(1) and needs no re-check.
 */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little endian */
#define GGUF_MAX_KEY_LEN 65535u
#define GGUF_MAX_NAME_LEN 255u

struct gguf_kv {
    char *key;                /* owned, NUL-terminated */
    enum tp_gguf_type type;
    enum tp_gguf_type arr_type; /* arrays only */
    uint64_t arr_n;           /* arrays only */
    const uint8_t *val;       /* value bytes in the mapping (arrays: first element) */
    char *str;                /* owned copy of a scalar string value */
    uint64_t *str_off;        /* string arrays: offset of each element's length field from val */
};

struct tp_gguf {
    char *path;
    int fd;
    const uint8_t *base;
    size_t size;
    int mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    int n_kv;
    struct gguf_kv *kv;
    int n_tensors;
    struct tp_gguf_tensor *tensors;
    struct tp_error err;
};

/* --------------------------------------------------------------- type tables */

struct wtype_info {
    const char *name;
    int64_t blck;
    size_t bytes;
};
static const struct wtype_info wtypes[] = {
    [0] = {"f32", 1, 4},        [1] = {"f16", 1, 2},         [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},     [6] = {"q5_0", 32, 22},      [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},     [9] = {"q8_1", 32, 36},      [10] = {"q2_k", 256, 84},
    [11] = {"q3_k", 256, 110},  [12] = {"q4_k", 256, 144},   [13] = {"q5_k", 256, 176},
    [14] = {"q6_k", 256, 210},  [15] = {"q8_k", 256, 292},   [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74}, [18] = {"iq3_xxs", 256, 98}, [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},  [21] = {"iq3_s", 256, 110},  [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136}, [24] = {"i8", 1, 1},        [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},       [27] = {"i64", 1, 8},        [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},  [30] = {"bf16", 1, 2},       [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},  [39] = {"mxfp4", 32, 17},
};

const char *tp_gguf_wtype_name(uint32_t type)
{
    static const char *const unknown[] = {"type#0",  "type#1",  "type#2",  "type#3",  "type#4",  "type#5",
                                          "type#6",  "type#7",  "type#8",  "type#9",  "type#10", "type#11",
                                          "type#12", "type#13", "type#14", "type#15", "type#16", "type#17",
                                          "type#18", "type#19", "type#20", "type#21", "type#22", "type#23",
                                          "type#24", "type#25", "type#26", "type#27", "type#28", "type#29",
                                          "type#30", "type#31", "type#32", "type#33", "type#34", "type#35",
                                          "type#36", "type#37", "type#38", "type#39"};
    if (type < TP_ARRAY_LEN(wtypes) && wtypes[type].name) return wtypes[type].name;
    if (type < TP_ARRAY_LEN(unknown)) return unknown[type];
    return "unknown type";
}

int64_t tp_gguf_wtype_block_elems(uint32_t type)
{
    return type < TP_ARRAY_LEN(wtypes) ? wtypes[type].blck : 0;
}

size_t tp_gguf_wtype_block_bytes(uint32_t type)
{
    return type < TP_ARRAY_LEN(wtypes) ? wtypes[type].bytes : 0;
}

static const char *const gguf_type_names[TP_GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64"};
static const size_t gguf_type_size[TP_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *tp_gguf_type_name(enum tp_gguf_type t)
{
    if ((unsigned)t < TP_GGUF_TYPE_COUNT) return gguf_type_names[t];
    return "unknown value type";
}

/* --------------------------------------------------------------- cursor */

struct cursor {
    const uint8_t *p;
    size_t size;
    size_t pos;
    tp_gguf_t *g;
};

static enum tp_status fail(tp_gguf_t *g, enum tp_status st, const char *fmt, ...) TP_PRINTF(3, 4);
static enum tp_status fail(tp_gguf_t *g, enum tp_status st, const char *fmt, ...)
{
    char buf[TP_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return tp_error_set(&g->err, st, "%s: %s", g->path, buf);
}

static enum tp_status cur_read(struct cursor *c, void *dst, size_t n, const char *what)
{
    if (n > c->size - c->pos)
        return fail(c->g, TP_ERR_FORMAT, "%s at offset %zu: needs %zu bytes but the file ends at %zu (truncated)",
                    what, c->pos, n, c->size);
    memcpy(dst, c->p + c->pos, n);
    c->pos += n;
    return TP_OK;
}

static enum tp_status cur_u32(struct cursor *c, uint32_t *v, const char *what) { return cur_read(c, v, 4, what); }
static enum tp_status cur_u64(struct cursor *c, uint64_t *v, const char *what) { return cur_read(c, v, 8, what); }

/* A string: u64 length then bytes.  Returns a pointer into the map. */
static enum tp_status cur_str(struct cursor *c, const char **s, uint64_t *len, uint64_t max_len, const char *what)
{
    enum tp_status rc = cur_u64(c, len, what);
    if (rc != TP_OK) return rc;
    if (*len > c->size - c->pos)
        return fail(c->g, TP_ERR_FORMAT, "%s at offset %zu: string length %llu runs past the end of the file (%zu bytes left)",
                    what, c->pos - 8, (unsigned long long)*len, c->size - c->pos);
    if (*len > max_len)
        return fail(c->g, TP_ERR_FORMAT, "%s at offset %zu: string length %llu exceeds the limit %llu", what, c->pos - 8,
                    (unsigned long long)*len, (unsigned long long)max_len);
    *s = (const char *)(c->p + c->pos);
    c->pos += (size_t)*len;
    return TP_OK;
}

/* --------------------------------------------------------------- parsing */

static enum tp_status parse_kv(struct cursor *c, struct gguf_kv *kv, int idx)
{
    tp_gguf_t *g = c->g;
    enum tp_status rc;
    const char *ks = NULL;
    uint64_t klen = 0;
    char what[96];
    snprintf(what, sizeof(what), "metadata key #%d", idx);
    if ((rc = cur_str(c, &ks, &klen, GGUF_MAX_KEY_LEN, what)) != TP_OK) return rc;
    if (klen == 0) return fail(g, TP_ERR_FORMAT, "%s: empty key", what);
    if (memchr(ks, '\0', klen)) return fail(g, TP_ERR_FORMAT, "%s: key contains a NUL byte", what);
    kv->key = tp_str_dup_n(ks, (size_t)klen);
    if (!kv->key) return fail(g, TP_ERR_NOMEM, "out of memory reading %s", what);

    uint32_t t = 0;
    char what2[160];
    snprintf(what2, sizeof(what2), "metadata '%.100s' type", kv->key);
    if ((rc = cur_u32(c, &t, what2)) != TP_OK) return rc;
    if (t >= TP_GGUF_TYPE_COUNT)
        return fail(g, TP_ERR_FORMAT, "metadata '%.100s': unknown value type %u (valid 0..%d)", kv->key, t,
                    TP_GGUF_TYPE_COUNT - 1);
    kv->type = (enum tp_gguf_type)t;
    kv->arr_type = TP_GGUF_TYPE_COUNT;
    snprintf(what2, sizeof(what2), "metadata '%.100s' value", kv->key);
    if (kv->type == TP_GGUF_STRING) {
        const char *s = NULL;
        uint64_t len = 0;
        if ((rc = cur_str(c, &s, &len, UINT64_MAX, what2)) != TP_OK) return rc;
        kv->val = (const uint8_t *)s;
        kv->str = tp_str_dup_n(s, (size_t)len);
        if (!kv->str) return fail(g, TP_ERR_NOMEM, "out of memory reading %s", what2);
        return TP_OK;
    }
    if (kv->type != TP_GGUF_ARRAY) {
        size_t n = gguf_type_size[kv->type];
        if (n > c->size - c->pos)
            return fail(g, TP_ERR_FORMAT, "%s at offset %zu: needs %zu bytes, file truncated", what2, c->pos, n);
        kv->val = c->p + c->pos;
        c->pos += n;
        return TP_OK;
    }
    /* array: element type, count, elements */
    if ((rc = cur_u32(c, &t, what2)) != TP_OK) return rc;
    if (t >= TP_GGUF_TYPE_COUNT)
        return fail(g, TP_ERR_FORMAT, "metadata '%.100s': unknown array element type %u", kv->key, t);
    if (t == TP_GGUF_ARRAY)
        return fail(g, TP_ERR_UNSUPPORTED, "metadata '%.100s': nested arrays are not supported", kv->key);
    kv->arr_type = (enum tp_gguf_type)t;
    if ((rc = cur_u64(c, &kv->arr_n, what2)) != TP_OK) return rc;
    size_t left = c->size - c->pos;
    if (kv->arr_type == TP_GGUF_STRING) {
        /* each element needs at least its 8-byte length */
        if (kv->arr_n > left / 8)
            return fail(g, TP_ERR_FORMAT, "metadata '%.100s': array length %llu runs past the end of the file", kv->key,
                        (unsigned long long)kv->arr_n);
        kv->val = c->p + c->pos;
        kv->str_off = malloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof(uint64_t));
        if (!kv->str_off) return fail(g, TP_ERR_NOMEM, "out of memory indexing '%.100s'", kv->key);
        for (uint64_t j = 0; j < kv->arr_n; j++) {
            const char *s = NULL;
            uint64_t len = 0;
            kv->str_off[j] = (uint64_t)(c->pos - (size_t)(kv->val - c->p));
            snprintf(what2, sizeof(what2), "metadata '%.80s' element %llu", kv->key, (unsigned long long)j);
            if ((rc = cur_str(c, &s, &len, UINT64_MAX, what2)) != TP_OK) return rc;
        }
        return TP_OK;
    }
    size_t esz = gguf_type_size[kv->arr_type];
    if (kv->arr_n > left / esz)
        return fail(g, TP_ERR_FORMAT, "metadata '%.100s': array of %llu %s runs past the end of the file (%zu bytes left)",
                    kv->key, (unsigned long long)kv->arr_n, gguf_type_names[kv->arr_type], left);
    kv->val = c->p + c->pos;
    c->pos += (size_t)kv->arr_n * esz;
    return TP_OK;
}

static enum tp_status parse_tensor(struct cursor *c, struct tp_gguf_tensor *ti, uint64_t *rel_off, int idx)
{
    tp_gguf_t *g = c->g;
    enum tp_status rc;
    char what[64];
    snprintf(what, sizeof(what), "tensor #%d name", idx);
    const char *ns = NULL;
    uint64_t nlen = 0;
    if ((rc = cur_str(c, &ns, &nlen, GGUF_MAX_NAME_LEN, what)) != TP_OK) return rc;
    if (nlen == 0) return fail(g, TP_ERR_FORMAT, "tensor #%d: empty name", idx);
    if (memchr(ns, '\0', nlen)) return fail(g, TP_ERR_FORMAT, "tensor #%d: name contains a NUL byte", idx);
    ti->name = tp_str_dup_n(ns, (size_t)nlen);
    if (!ti->name) return fail(g, TP_ERR_NOMEM, "out of memory reading tensor #%d", idx);
    char what2[340];
    snprintf(what2, sizeof(what2), "tensor '%s' header", ti->name);
    uint32_t nd = 0;
    if ((rc = cur_u32(c, &nd, what2)) != TP_OK) return rc;
    if (nd < 1 || nd > TP_GGUF_MAX_DIMS)
        return fail(g, TP_ERR_FORMAT, "tensor '%s': n_dims %u is out of range (1..%d)", ti->name, nd, TP_GGUF_MAX_DIMS);
    ti->n_dims = (int)nd;
    int64_t total = 1;
    for (int d = 0; d < TP_GGUF_MAX_DIMS; d++) ti->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t v = 0;
        if ((rc = cur_u64(c, &v, what2)) != TP_OK) return rc;
        if (v > (uint64_t)INT64_MAX)
            return fail(g, TP_ERR_FORMAT, "tensor '%s': dim %u = %llu is absurd", ti->name, d, (unsigned long long)v);
        ti->ne[d] = (int64_t)v;
        if (v != 0 && total > INT64_MAX / (int64_t)v)
            return fail(g, TP_ERR_FORMAT, "tensor '%s': element count overflows (dim %u = %llu)", ti->name, d,
                        (unsigned long long)v);
        total *= (int64_t)v;
    }
    ti->n_elems = total;
    uint32_t t = 0;
    if ((rc = cur_u32(c, &t, what2)) != TP_OK) return rc;
    int64_t blck = tp_gguf_wtype_block_elems(t);
    size_t bbytes = tp_gguf_wtype_block_bytes(t);
    if (blck <= 0 || bbytes == 0)
        return fail(g, TP_ERR_UNSUPPORTED, "tensor '%s': unknown tensor type %u (%s); this file needs a newer reader",
                    ti->name, t, tp_gguf_wtype_name(t));
    ti->type = (enum tp_wtype)t;
    if (ti->ne[0] % blck != 0)
        return fail(g, TP_ERR_FORMAT, "tensor '%s': row length %lld is not a multiple of the %s block size %lld", ti->name,
                    (long long)ti->ne[0], tp_gguf_wtype_name(t), (long long)blck);
    /* bytes = ne0/blck * bbytes * ne1*ne2*ne3 */
    uint64_t rows = (uint64_t)ti->ne[1] * (uint64_t)ti->ne[2] * (uint64_t)ti->ne[3]; /* fits: total fits int64 */
    if (ti->ne[0] == 0) rows = 0;
    uint64_t row_bytes = (uint64_t)(ti->ne[0] / blck) * bbytes; /* ne0/blck <= 2^63, bbytes <= 292: check */
    if (ti->ne[0] / blck != 0 && row_bytes / (uint64_t)(ti->ne[0] / blck) != bbytes)
        return fail(g, TP_ERR_FORMAT, "tensor '%s': byte size overflows", ti->name);
    if (rows != 0 && row_bytes > UINT64_MAX / rows)
        return fail(g, TP_ERR_FORMAT, "tensor '%s': byte size overflows", ti->name);
    ti->n_bytes = row_bytes * rows;
    if ((rc = cur_u64(c, rel_off, what2)) != TP_OK) return rc;
    return TP_OK;
}

static struct gguf_kv *kv_by_key(const tp_gguf_t *g, const char *key)
{
    for (int i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    return NULL;
}

static enum tp_status parse(tp_gguf_t *g)
{
    enum tp_status rc;
    struct cursor c = {g->base, g->size, 0, g};
    uint32_t magic = 0;
    if (g->size < 4)
        return fail(g, TP_ERR_FORMAT, "not a GGUF file: %zu bytes, too short for the magic 'GGUF'", g->size);
    if ((rc = cur_u32(&c, &magic, "magic")) != TP_OK) return rc;
    if (magic != GGUF_MAGIC)
        return fail(g, TP_ERR_FORMAT, "not a GGUF file: bad magic %02x %02x %02x %02x (want 'GGUF')", g->base[0],
                    g->base[1], g->base[2], g->base[3]);
    if ((rc = cur_u32(&c, &g->version, "header version")) != TP_OK) return rc;
    if (g->version == 1)
        return fail(g, TP_ERR_UNSUPPORTED, "GGUF version 1 is obsolete; re-convert the model (versions 2 and 3 are read)");
    if (g->version != 2 && g->version != 3)
        return fail(g, TP_ERR_FORMAT, "header version %u is unknown (versions 2 and 3 are read)", g->version);
    uint64_t n_tensors = 0, n_kv = 0;
    if ((rc = cur_u64(&c, &n_tensors, "header tensor count")) != TP_OK) return rc;
    if ((rc = cur_u64(&c, &n_kv, "header metadata count")) != TP_OK) return rc;
    size_t left = g->size - c.pos;
    /* a key/value needs >= 8+1+4 bytes; a tensor info >= 8+1+4+8+4+8 */
    if (n_kv > left / 13 || n_kv > INT32_MAX)
        return fail(g, TP_ERR_FORMAT, "header metadata count %llu is impossible for a file of %zu bytes",
                    (unsigned long long)n_kv, g->size);
    if (n_tensors > left / 33 || n_tensors > INT32_MAX)
        return fail(g, TP_ERR_FORMAT, "header tensor count %llu is impossible for a file of %zu bytes",
                    (unsigned long long)n_tensors, g->size);
    g->kv = calloc((size_t)(n_kv ? n_kv : 1), sizeof(*g->kv));
    g->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof(*g->tensors));
    if (!g->kv || !g->tensors) return fail(g, TP_ERR_NOMEM, "out of memory for the header tables");
    for (uint64_t i = 0; i < n_kv; i++) {
        rc = parse_kv(&c, &g->kv[i], (int)i);
        g->n_kv = (int)i + 1; /* so close() frees what was allocated */
        if (rc != TP_OK) return rc;
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(g->kv[j].key, g->kv[i].key) == 0)
                return fail(g, TP_ERR_FORMAT, "metadata key '%.100s' appears twice", g->kv[i].key);
    }
    g->alignment = TP_GGUF_DEFAULT_ALIGNMENT;
    struct gguf_kv *al = kv_by_key(g, "general.alignment");
    if (al) {
        uint32_t a;
        if (al->type != TP_GGUF_UINT32)
            return fail(g, TP_ERR_FORMAT, "metadata 'general.alignment' has type %s (want uint32)",
                        gguf_type_names[al->type]);
        memcpy(&a, al->val, 4);
        if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
            return fail(g, TP_ERR_FORMAT, "metadata 'general.alignment' = %u is not a power of two (<= 2^30)", a);
        g->alignment = a;
    }
    uint64_t *rel = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof(uint64_t));
    if (!rel) return fail(g, TP_ERR_NOMEM, "out of memory for the tensor table");
    for (uint64_t i = 0; i < n_tensors; i++) {
        rc = parse_tensor(&c, &g->tensors[i], &rel[i], (int)i);
        g->n_tensors = (int)i + 1;
        if (rc != TP_OK) goto out;
    }
    /* duplicate names (quadratic only on small tables; sort-free) */
    for (int i = 0; i < g->n_tensors && g->n_tensors <= 100000; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(g->tensors[i].name, g->tensors[j].name) == 0) {
                rc = fail(g, TP_ERR_FORMAT, "tensor name '%s' appears twice", g->tensors[i].name);
                goto out;
            }
    /* data section starts at the next multiple of alignment */
    uint64_t pos = c.pos;
    uint64_t data = (pos + g->alignment - 1) / g->alignment * g->alignment;
    g->data_offset = data;
    for (int i = 0; i < g->n_tensors; i++) {
        struct tp_gguf_tensor *ti = &g->tensors[i];
        if (rel[i] % g->alignment != 0) {
            rc = fail(g, TP_ERR_FORMAT, "tensor '%s': data offset %llu is not a multiple of the alignment %u", ti->name,
                      (unsigned long long)rel[i], g->alignment);
            goto out;
        }
        if (ti->n_bytes == 0) {
            ti->file_offset = data;
            ti->data = NULL;
            continue;
        }
        if (rel[i] > UINT64_MAX - data || data + rel[i] > g->size || ti->n_bytes > g->size - (data + rel[i])) {
            rc = fail(g, TP_ERR_FORMAT,
                      "tensor '%s': data [%llu, +%llu bytes) lies past the end of the file (%zu bytes); truncated download?",
                      ti->name, (unsigned long long)(data + rel[i]), (unsigned long long)ti->n_bytes, g->size);
            goto out;
        }
        ti->file_offset = data + rel[i];
        ti->data = g->base + ti->file_offset;
    }
    rc = TP_OK;
out:
    free(rel);
    return rc;
}

/* --------------------------------------------------------------- open/close */

static enum tp_status open_common(tp_gguf_t *g, tp_gguf_t **out, struct tp_error *err)
{
    enum tp_status rc = parse(g);
    if (rc != TP_OK) {
        if (err) tp_error_set(err, rc, "%s", g->err.msg);
        tp_gguf_close(g);
        return rc;
    }
    *out = g;
    return TP_OK;
}

enum tp_status tp_gguf_open(const char *path, tp_gguf_t **out, struct tp_error *err)
{
    if (!out) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_gguf_open: out is NULL");
    *out = NULL;
    if (!path) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_gguf_open: path is NULL");
    tp_gguf_t *g = calloc(1, sizeof(*g));
    if (!g) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    g->fd = -1;
    g->path = tp_str_dup_n(path, strlen(path));
    if (!g->path) {
        free(g);
        return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    }
    g->fd = open(path, O_RDONLY);
    if (g->fd < 0) {
        enum tp_status rc = tp_error_set(err, errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot open: %s",
                                         path, strerror(errno));
        tp_gguf_close(g);
        return rc;
    }
    struct stat st;
    if (fstat(g->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        enum tp_status rc = tp_error_set(err, TP_ERR_IO, "%s: not a regular file", path);
        tp_gguf_close(g);
        return rc;
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        enum tp_status rc = tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: file too large for this address space", path);
        tp_gguf_close(g);
        return rc;
    }
    g->size = (size_t)st.st_size;
    if (g->size > 0) {
        void *p = mmap(NULL, g->size, PROT_READ, MAP_SHARED, g->fd, 0);
        if (p == MAP_FAILED) {
            enum tp_status rc = tp_error_set(err, TP_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, g->size,
                                             strerror(errno));
            tp_gguf_close(g);
            return rc;
        }
        g->base = p;
        g->mapped = 1;
    } else {
        static const uint8_t empty[1];
        g->base = empty;
    }
    return open_common(g, out, err);
}

enum tp_status tp_gguf_open_mem(const char *name, const void *buf, size_t len, tp_gguf_t **out, struct tp_error *err)
{
    if (!out) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_gguf_open_mem: out is NULL");
    *out = NULL;
    if (!buf && len) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_gguf_open_mem: buffer is NULL");
    if (!name) name = "<memory>";
    tp_gguf_t *g = calloc(1, sizeof(*g));
    if (!g) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", name);
    g->fd = -1;
    g->path = tp_str_dup_n(name, strlen(name));
    if (!g->path) {
        free(g);
        return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", name);
    }
    static const uint8_t empty[1];
    g->base = buf ? buf : empty;
    g->size = len;
    return open_common(g, out, err);
}

void tp_gguf_close(tp_gguf_t *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str);
        free(g->kv[i].str_off);
    }
    free(g->kv);
    for (int i = 0; i < g->n_tensors; i++) free((void *)g->tensors[i].name);
    free(g->tensors);
    if (g->mapped) munmap((void *)g->base, g->size);
    if (g->fd >= 0) close(g->fd);
    free(g->path);
    free(g);
}

/* --------------------------------------------------------------- accessors */

const char *tp_gguf_path(const tp_gguf_t *g) { return g->path; }
const char *tp_gguf_last_error(const tp_gguf_t *g) { return g ? tp_error_msg(&g->err) : ""; }
uint32_t tp_gguf_version(const tp_gguf_t *g) { return g->version; }
uint32_t tp_gguf_alignment(const tp_gguf_t *g) { return g->alignment; }
uint64_t tp_gguf_file_size(const tp_gguf_t *g) { return g->size; }
uint64_t tp_gguf_data_offset(const tp_gguf_t *g) { return g->data_offset; }
int tp_gguf_fd(const tp_gguf_t *g) { return g->fd; }
int tp_gguf_n_kv(const tp_gguf_t *g) { return g->n_kv; }

int tp_gguf_find_key(const tp_gguf_t *g, const char *key)
{
    if (!g || !key) return -1;
    for (int i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0) return i;
    return -1;
}

const char *tp_gguf_key(const tp_gguf_t *g, int i) { return (i >= 0 && i < g->n_kv) ? g->kv[i].key : NULL; }
enum tp_gguf_type tp_gguf_kv_type(const tp_gguf_t *g, int i)
{
    return (i >= 0 && i < g->n_kv) ? g->kv[i].type : TP_GGUF_TYPE_COUNT;
}

/* Read element j of numeric type t at p as int64 (ok=1) or report non-integer (ok=0). */
static int num_as_i64(enum tp_gguf_type t, const uint8_t *p, int64_t *v, uint64_t *uv, int *is_unsigned_big)
{
    *is_unsigned_big = 0;
    switch (t) {
    case TP_GGUF_UINT8: *v = p[0]; return 1;
    case TP_GGUF_BOOL: *v = p[0] != 0; return 1;
    case TP_GGUF_INT8: { int8_t x; memcpy(&x, p, 1); *v = x; return 1; }
    case TP_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); *v = x; return 1; }
    case TP_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); *v = x; return 1; }
    case TP_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); *v = x; return 1; }
    case TP_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); *v = x; return 1; }
    case TP_GGUF_INT64: { int64_t x; memcpy(&x, p, 8); *v = x; return 1; }
    case TP_GGUF_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        *uv = x;
        if (x > (uint64_t)INT64_MAX) { *is_unsigned_big = 1; *v = INT64_MAX; }
        else *v = (int64_t)x;
        return 1;
    }
    default: return 0;
    }
}

static int num_as_f64(enum tp_gguf_type t, const uint8_t *p, double *v)
{
    if (t == TP_GGUF_FLOAT32) { float x; memcpy(&x, p, 4); *v = x; return 1; }
    if (t == TP_GGUF_FLOAT64) { memcpy(v, p, 8); return 1; }
    int64_t i; uint64_t u = 0; int big;
    if (!num_as_i64(t, p, &i, &u, &big)) return 0;
    *v = big ? (double)u : (double)i;
    return 1;
}

static enum tp_status get_kv(tp_gguf_t *g, const char *key, struct gguf_kv **kv)
{
    if (!g || !key) return TP_ERR_INVALID_ARG;
    *kv = kv_by_key(g, key);
    return *kv ? TP_OK : TP_ERR_NOT_FOUND;
}

enum tp_status tp_gguf_get_int(tp_gguf_t *g, const char *key, int64_t *out)
{
    struct gguf_kv *kv;
    enum tp_status rc = get_kv(g, key, &kv);
    if (rc != TP_OK) return rc;
    int64_t v; uint64_t u = 0; int big;
    if (!num_as_i64(kv->type, kv->val, &v, &u, &big))
        return fail(g, TP_ERR_FORMAT, "metadata '%s' has type %s (want an integer)", key, gguf_type_names[kv->type]);
    if (big) return fail(g, TP_ERR_FORMAT, "metadata '%s' = %llu is out of range", key, (unsigned long long)u);
    *out = v;
    return TP_OK;
}

enum tp_status tp_gguf_get_u64(tp_gguf_t *g, const char *key, uint64_t *out)
{
    struct gguf_kv *kv;
    enum tp_status rc = get_kv(g, key, &kv);
    if (rc != TP_OK) return rc;
    int64_t v; uint64_t u = 0; int big;
    if (!num_as_i64(kv->type, kv->val, &v, &u, &big))
        return fail(g, TP_ERR_FORMAT, "metadata '%s' has type %s (want an integer)", key, gguf_type_names[kv->type]);
    if (big) { *out = u; return TP_OK; }
    if (v < 0) return fail(g, TP_ERR_FORMAT, "metadata '%s' = %lld is negative", key, (long long)v);
    *out = (uint64_t)v;
    return TP_OK;
}

enum tp_status tp_gguf_get_float(tp_gguf_t *g, const char *key, double *out)
{
    struct gguf_kv *kv;
    enum tp_status rc = get_kv(g, key, &kv);
    if (rc != TP_OK) return rc;
    if (!num_as_f64(kv->type, kv->val, out))
        return fail(g, TP_ERR_FORMAT, "metadata '%s' has type %s (want a number)", key, gguf_type_names[kv->type]);
    return TP_OK;
}

enum tp_status tp_gguf_get_bool(tp_gguf_t *g, const char *key, int *out)
{
    struct gguf_kv *kv;
    enum tp_status rc = get_kv(g, key, &kv);
    if (rc != TP_OK) return rc;
    int64_t v; uint64_t u = 0; int big;
    if (kv->type == TP_GGUF_FLOAT32 || kv->type == TP_GGUF_FLOAT64 || !num_as_i64(kv->type, kv->val, &v, &u, &big))
        return fail(g, TP_ERR_FORMAT, "metadata '%s' has type %s (want bool)", key, gguf_type_names[kv->type]);
    *out = (v != 0 || big);
    return TP_OK;
}

enum tp_status tp_gguf_get_str(tp_gguf_t *g, const char *key, const char **out)
{
    struct gguf_kv *kv;
    enum tp_status rc = get_kv(g, key, &kv);
    if (rc != TP_OK) return rc;
    if (kv->type != TP_GGUF_STRING)
        return fail(g, TP_ERR_FORMAT, "metadata '%s' has type %s (want string)", key, gguf_type_names[kv->type]);
    *out = kv->str;
    return TP_OK;
}

enum tp_gguf_type tp_gguf_arr_type(const tp_gguf_t *g, int i)
{
    if (!g || i < 0 || i >= g->n_kv || g->kv[i].type != TP_GGUF_ARRAY) return TP_GGUF_TYPE_COUNT;
    return g->kv[i].arr_type;
}

uint64_t tp_gguf_arr_len(const tp_gguf_t *g, int i)
{
    if (!g || i < 0 || i >= g->n_kv || g->kv[i].type != TP_GGUF_ARRAY) return 0;
    return g->kv[i].arr_n;
}

const char *tp_gguf_arr_str(const tp_gguf_t *g, int i, uint64_t j, size_t *len)
{
    if (tp_gguf_arr_type(g, i) != TP_GGUF_STRING || j >= g->kv[i].arr_n) {
        if (len) *len = 0;
        return NULL;
    }
    const uint8_t *p = g->kv[i].val + g->kv[i].str_off[j];
    uint64_t n;
    memcpy(&n, p, 8);
    if (len) *len = (size_t)n;
    return (const char *)(p + 8);
}

static enum tp_status arr_check(tp_gguf_t *g, int i, uint64_t n)
{
    if (!g || i < 0 || i >= g->n_kv) return g ? fail(g, TP_ERR_NOT_FOUND, "metadata array #%d does not exist", i) : TP_ERR_INVALID_ARG;
    struct gguf_kv *kv = &g->kv[i];
    if (kv->type != TP_GGUF_ARRAY || kv->arr_type == TP_GGUF_STRING)
        return fail(g, TP_ERR_FORMAT, "metadata '%s' is not a numeric array", kv->key);
    if (kv->arr_n < n)
        return fail(g, TP_ERR_FORMAT, "metadata '%s' has %llu elements (want %llu)", kv->key,
                    (unsigned long long)kv->arr_n, (unsigned long long)n);
    return TP_OK;
}

enum tp_status tp_gguf_arr_copy_i32(tp_gguf_t *g, int i, int32_t *out, uint64_t n)
{
    enum tp_status rc = arr_check(g, i, n);
    if (rc != TP_OK) return rc;
    struct gguf_kv *kv = &g->kv[i];
    size_t esz = gguf_type_size[kv->arr_type];
    for (uint64_t j = 0; j < n; j++) {
        int64_t v; uint64_t u = 0; int big;
        if (!num_as_i64(kv->arr_type, kv->val + j * esz, &v, &u, &big))
            return fail(g, TP_ERR_FORMAT, "metadata '%s' holds %s (want integers)", kv->key,
                        gguf_type_names[kv->arr_type]);
        if (big || v < INT32_MIN || v > INT32_MAX) {
            /* 0xFFFFFFFF-style "none" values in uint32 arrays fit only as -1 */
            if (kv->arr_type == TP_GGUF_UINT32 && v == (int64_t)UINT32_MAX) v = -1;
            else
                return fail(g, TP_ERR_FORMAT, "metadata '%s' element %llu = %lld does not fit int32", kv->key,
                            (unsigned long long)j, (long long)v);
        }
        out[j] = (int32_t)v;
    }
    return TP_OK;
}

enum tp_status tp_gguf_arr_copy_f32(tp_gguf_t *g, int i, float *out, uint64_t n)
{
    enum tp_status rc = arr_check(g, i, n);
    if (rc != TP_OK) return rc;
    struct gguf_kv *kv = &g->kv[i];
    size_t esz = gguf_type_size[kv->arr_type];
    if (kv->arr_type == TP_GGUF_FLOAT32) {
        memcpy(out, kv->val, (size_t)n * 4);
        return TP_OK;
    }
    for (uint64_t j = 0; j < n; j++) {
        double v;
        if (!num_as_f64(kv->arr_type, kv->val + j * esz, &v))
            return fail(g, TP_ERR_FORMAT, "metadata '%s' holds %s (want numbers)", kv->key, gguf_type_names[kv->arr_type]);
        out[j] = (float)v;
    }
    return TP_OK;
}

int tp_gguf_n_tensors(const tp_gguf_t *g) { return g->n_tensors; }

const struct tp_gguf_tensor *tp_gguf_tensor(const tp_gguf_t *g, int i)
{
    return (g && i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}

const struct tp_gguf_tensor *tp_gguf_find_tensor(const tp_gguf_t *g, const char *name)
{
    if (!g || !name) return NULL;
    for (int i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}

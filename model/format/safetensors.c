/*
 * model/format/safetensors.c - the safetensors reader declared in safetensors.h:
 * one file or a sharded set (model.safetensors.index.json), every header
 * validated before use (see the header for the list of checks), tensors
 * sorted by name for lookup, files mmap'd read-only with their fds kept for
 * pread of slices.
 */
#include "model/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define MAX_INDEX_BYTES ((size_t)64 << 20)
#define MAX_EXACT_INT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact doubles */

struct st_file {
    char *path;
    int fd;
    const uint8_t *base; /* mapping, or the caller's buffer */
    size_t size;
    int mapped;
    uint64_t data_off;   /* 8 + header length */
};

struct tp_st {
    char *path;
    struct st_file *files;
    int n_files;
    struct tp_st_tensor *t;
    int n_t, cap_t;
    char **meta_k, **meta_v; /* __metadata__ of the first file */
    int n_meta;
};

static const struct {
    const char *name;
    size_t size;
} k_dtypes[TP_ST_DTYPE_COUNT] = {
    [TP_ST_BOOL] = {"BOOL", 1}, [TP_ST_U8] = {"U8", 1},     [TP_ST_I8] = {"I8", 1},
    [TP_ST_F8_E4M3] = {"F8_E4M3", 1}, [TP_ST_F8_E5M2] = {"F8_E5M2", 1},
    [TP_ST_U16] = {"U16", 2},   [TP_ST_I16] = {"I16", 2},   [TP_ST_F16] = {"F16", 2},
    [TP_ST_BF16] = {"BF16", 2}, [TP_ST_U32] = {"U32", 4},   [TP_ST_I32] = {"I32", 4},
    [TP_ST_F32] = {"F32", 4},   [TP_ST_U64] = {"U64", 8},   [TP_ST_I64] = {"I64", 8},
    [TP_ST_F64] = {"F64", 8},
};

const char *tp_st_dtype_name(enum tp_st_dtype d)
{
    if ((unsigned)d < TP_ST_DTYPE_COUNT) return k_dtypes[d].name;
    return "dtype#?";
}

size_t tp_st_dtype_size(enum tp_st_dtype d) { return (unsigned)d < TP_ST_DTYPE_COUNT ? k_dtypes[d].size : 0; }

enum tp_status tp_st_dtype_parse(const char *s, enum tp_st_dtype *out)
{
    for (int i = 0; s && i < TP_ST_DTYPE_COUNT; i++)
        if (strcmp(s, k_dtypes[i].name) == 0) {
            *out = (enum tp_st_dtype)i;
            return TP_OK;
        }
    return TP_ERR_NOT_FOUND;
}

/* ------------------------------------------------------------ helpers */

static char *join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (k > 0 && p[k - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* Directory part of a path ("." when none); malloc'd. */
static char *dir_of(const char *path)
{
    const char *s = strrchr(path, '/');
    if (!s) return strdup(".");
    size_t n = (size_t)(s - path);
    if (n == 0) n = 1; /* "/file" */
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* A JSON number that is an exact non-negative integer <= 2^53. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0.0 || d > MAX_EXACT_INT || d != floor(d)) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* ------------------------------------------------------------ one file */

static enum tp_status map_file(struct st_file *f, struct tp_error *err)
{
    f->fd = open(f->path, O_RDONLY);
    if (f->fd < 0)
        return tp_error_set(err, errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot open: %s", f->path,
                            strerror(errno));
    struct stat st;
    if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return tp_error_set(err, TP_ERR_IO, "%s: not a regular file", f->path);
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX)
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: file too large for this address space", f->path);
    f->size = (size_t)st.st_size;
    if (f->size < 8)
        return tp_error_set(err, TP_ERR_FORMAT,
                            "%s: %zu bytes is too short for a safetensors file (8-byte header length + JSON header)",
                            f->path, f->size);
    void *p = mmap(NULL, f->size, PROT_READ, MAP_SHARED, f->fd, 0);
    if (p == MAP_FAILED)
        return tp_error_set(err, TP_ERR_IO, "%s: mmap of %zu bytes failed: %s", f->path, f->size, strerror(errno));
    f->base = p;
    f->mapped = 1;
    return TP_OK;
}

static enum tp_status push_tensor(tp_st_t *st, struct tp_error *err, const char *path, struct tp_st_tensor **out)
{
    if (st->n_t == st->cap_t) {
        int cap = st->cap_t ? st->cap_t * 2 : 64;
        struct tp_st_tensor *n = realloc(st->t, (size_t)cap * sizeof(*n));
        if (!n) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory for the tensor table", path);
        st->t = n;
        st->cap_t = cap;
    }
    *out = &st->t[st->n_t];
    memset(*out, 0, sizeof(**out));
    return TP_OK;
}

struct span {
    uint64_t b, e;
    const char *name;
};

static int cmp_span(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    return x->e < y->e ? -1 : x->e > y->e;
}

static enum tp_status parse_meta(tp_st_t *st, const cJSON *meta, const char *path, int keep, struct tp_error *err)
{
    if (!cJSON_IsObject(meta))
        return tp_error_set(err, TP_ERR_FORMAT, "%s: '__metadata__' must be an object of strings", path);
    for (const cJSON *c = meta->child; c; c = c->next) {
        if (!cJSON_IsString(c) || !c->string)
            return tp_error_set(err, TP_ERR_FORMAT, "%s: '__metadata__' entry '%.64s' is not a string", path,
                                c->string ? c->string : "?");
        if (!keep) continue;
        char **k = realloc(st->meta_k, (size_t)(st->n_meta + 1) * sizeof(*k));
        if (k) st->meta_k = k;
        char **v = realloc(st->meta_v, (size_t)(st->n_meta + 1) * sizeof(*v));
        if (v) st->meta_v = v;
        if (!k || !v) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
        st->meta_k[st->n_meta] = strdup(c->string);
        st->meta_v[st->n_meta] = strdup(c->valuestring);
        st->n_meta++;
        if (!st->meta_k[st->n_meta - 1] || !st->meta_v[st->n_meta - 1])
            return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    }
    return TP_OK;
}

/* The 8-byte length and the JSON object of file f's header, checked (the length against the file, the
 * object with nothing after it): *root (owned by the caller) and the data section's length. */
static enum tp_status parse_header(struct st_file *f, cJSON **root, uint64_t *data_len, struct tp_error *err)
{
    const char *path = f->path;
    *root = NULL;
    if (f->size < 8)
        return tp_error_set(err, TP_ERR_FORMAT,
                            "%s: %zu bytes is too short for a safetensors file (8-byte header length + JSON header)",
                            path, f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->base[i];
    if (hlen > TP_ST_MAX_HEADER_BYTES)
        return tp_error_set(err, TP_ERR_FORMAT,
                            "%s: header length %llu exceeds the %llu-byte limit (not a safetensors file, or corrupt)",
                            path, (unsigned long long)hlen, (unsigned long long)TP_ST_MAX_HEADER_BYTES);
    if (hlen > (uint64_t)f->size - 8)
        return tp_error_set(err, TP_ERR_FORMAT,
                            "%s: header length %llu runs past the end of the file (%zu bytes): truncated or not a "
                            "safetensors file",
                            path, (unsigned long long)hlen, f->size);
    if (hlen < 2) return tp_error_set(err, TP_ERR_FORMAT, "%s: header length %llu is too short for a JSON object", path,
                                      (unsigned long long)hlen);
    f->data_off = 8 + hlen;
    *data_len = (uint64_t)f->size - f->data_off;
    const char *json = (const char *)f->base + 8;
    if (json[0] != '{')
        return tp_error_set(err, TP_ERR_FORMAT, "%s: the JSON header does not start with '{' (not a safetensors file)",
                            path);
    if (memchr(json, '\0', (size_t)hlen))
        return tp_error_set(err, TP_ERR_FORMAT, "%s: the JSON header contains a NUL byte", path);
    const char *end = NULL;
    *root = cJSON_ParseWithLengthOpts(json, (size_t)hlen, &end, 0);
    if (!*root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        return tp_error_set(err, TP_ERR_FORMAT, "%s: the JSON header (%llu bytes) is not valid JSON (near byte %zu)",
                            path, (unsigned long long)hlen, at);
    }
    for (const char *p = end; p && p < json + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return tp_error_set(err, TP_ERR_FORMAT, "%s: trailing bytes after the JSON header object (byte %zu)", path,
                                (size_t)(p - json));
    if (!cJSON_IsObject(*root)) return tp_error_set(err, TP_ERR_FORMAT, "%s: the JSON header is not an object", path);
    return TP_OK;
}

/* Header entry c (tensor `name`, with dtype, shape and data_offsets) of file fi appended to st->t, its
 * sizes checked against each other and against the data section (data_len bytes). */
static enum tp_status parse_tensor(tp_st_t *st, int fi, const cJSON *c, const char *name, uint64_t data_len,
                                   struct tp_error *err)
{
    struct st_file *f = &st->files[fi];
    const char *path = f->path;
    enum tp_status rc = TP_OK;
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(c, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(c, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(c, "data_offsets");
    if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo)) {
        rc = tp_error_set(err, TP_ERR_FORMAT,
                          "%s: tensor '%.128s': needs \"dtype\" (string), \"shape\" (array) and \"data_offsets\" "
                          "(array)",
                          path, name);
        goto out;
    }
    struct tp_st_tensor *t = NULL;
    TP_CHECK_GOTO(push_tensor(st, err, path, &t), rc, out);
    if (tp_st_dtype_parse(jd->valuestring, &t->dtype) != TP_OK) {
        rc = tp_error_set(err, TP_ERR_FORMAT,
                          "%s: tensor '%.128s': unknown dtype '%.16s' (known: BOOL, U8, I8, F8_E4M3, F8_E5M2, U16, "
                          "I16, F16, BF16, U32, I32, F32, U64, I64, F64)",
                          path, name, jd->valuestring);
        goto out;
    }
    int nd = cJSON_GetArraySize(js);
    if (nd > TP_ST_MAX_DIMS) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%.128s': %d dimensions (at most %d supported)", path, name,
                          nd, TP_ST_MAX_DIMS);
        goto out;
    }
    t->n_dims = nd;
    for (int d = 0; d < TP_ST_MAX_DIMS; d++) t->shape[d] = 1;
    uint64_t elems = 1;
    int d = 0;
    for (const cJSON *e = js->child; e; e = e->next, d++) {
        uint64_t v;
        if (!json_uint(e, &v) || v > (uint64_t)INT64_MAX) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%.128s': shape[%d] is not a non-negative integer",
                              path, name, d);
            goto out;
        }
        t->shape[d] = (int64_t)v;
        if (v != 0 && elems > UINT64_MAX / v) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%.128s': shape product overflows", path, name);
            goto out;
        }
        elems *= v;
    }
    size_t es = tp_st_dtype_size(t->dtype);
    if (elems > (uint64_t)INT64_MAX / es) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%.128s': shape x dtype size overflows", path, name);
        goto out;
    }
    t->n_elems = (int64_t)elems;
    uint64_t nbytes = elems * es;
    uint64_t ob = 0, oe = 0;
    if (cJSON_GetArraySize(jo) != 2 || !json_uint(jo->child, &ob) || !json_uint(jo->child->next, &oe)) {
        rc = tp_error_set(err, TP_ERR_FORMAT,
                          "%s: tensor '%.128s': data_offsets must be [begin, end] of non-negative integers", path,
                          name);
        goto out;
    }
    if (oe < ob) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%.128s': data_offsets [%llu, %llu] end before they begin",
                          path, name, (unsigned long long)ob, (unsigned long long)oe);
        goto out;
    }
    if (oe - ob != nbytes) {
        char shp[96];
        size_t k = 0;
        shp[0] = '\0';
        for (int i = 0; i < nd && k < sizeof(shp) - 24; i++)
            k += (size_t)snprintf(shp + k, sizeof(shp) - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        rc = tp_error_set(err, TP_ERR_FORMAT,
                          "%s: tensor '%.128s': dtype %s x shape [%s] is %llu bytes but data_offsets [%llu, %llu] "
                          "span %llu",
                          path, name, tp_st_dtype_name(t->dtype), shp, (unsigned long long)nbytes,
                          (unsigned long long)ob, (unsigned long long)oe, (unsigned long long)(oe - ob));
        goto out;
    }
    if (oe > data_len) {
        rc = tp_error_set(err, TP_ERR_FORMAT,
                          "%s: tensor '%.128s': data_offsets [%llu, %llu] lie outside the data section (%llu bytes; "
                          "file truncated?)",
                          path, name, (unsigned long long)ob, (unsigned long long)oe, (unsigned long long)data_len);
        goto out;
    }
    t->n_bytes = nbytes;
    t->file = fi;
    t->file_offset = f->data_off + ob;
    t->data = nbytes ? (const void *)(f->base + t->file_offset) : NULL;
    t->name = strdup(name);
    if (!t->name) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    st->n_t++;
out:
    return rc;
}

/* No two tensors of file fi (st->t[first ..]) share a byte of its data section. */
static enum tp_status check_overlap(tp_st_t *st, int fi, int first, struct tp_error *err)
{
    const struct st_file *f = &st->files[fi];
    const char *path = f->path;
    const int n = st->n_t - first;
    if (n < 2) return TP_OK;
    enum tp_status rc = TP_OK;
    struct span *spans = malloc((size_t)n * sizeof(*spans));
    if (!spans) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++) {
        const struct tp_st_tensor *t = &st->t[first + i];
        spans[i].b = t->file_offset;
        spans[i].e = t->file_offset + t->n_bytes;
        spans[i].name = t->name;
    }
    qsort(spans, (size_t)n, sizeof(*spans), cmp_span);
    int prev = -1; /* the span reaching furthest so far */
    for (int i = 0; i < n; i++) {
        if (spans[i].b == spans[i].e) continue; /* empty tensors occupy nothing */
        if (prev >= 0 && spans[i].b < spans[prev].e) {
            rc = tp_error_set(err, TP_ERR_FORMAT,
                              "%s: tensors '%.100s' and '%.100s' overlap (bytes [%llu, %llu) and [%llu, %llu) of the "
                              "data section)",
                              path, spans[prev].name, spans[i].name,
                              (unsigned long long)(spans[prev].b - f->data_off),
                              (unsigned long long)(spans[prev].e - f->data_off),
                              (unsigned long long)(spans[i].b - f->data_off),
                              (unsigned long long)(spans[i].e - f->data_off));
            goto out;
        }
        if (prev < 0 || spans[i].e > spans[prev].e) prev = i;
    }
out:
    free(spans);
    return rc;
}

/* Parse and validate the header of file fi; append its tensors to st->t. */
static enum tp_status parse_file(tp_st_t *st, int fi, struct tp_error *err)
{
    const char *path = st->files[fi].path;
    cJSON *root = NULL;
    uint64_t data_len = 0;
    enum tp_status rc = parse_header(&st->files[fi], &root, &data_len, err);
    const int first = st->n_t;
    for (const cJSON *c = root && rc == TP_OK ? root->child : NULL; c && rc == TP_OK; c = c->next) {
        const char *name = c->string ? c->string : "";
        if (strcmp(name, "__metadata__") == 0)
            rc = parse_meta(st, c, path, fi == 0, err);
        else if (name[0] == '\0')
            rc = tp_error_set(err, TP_ERR_FORMAT, "%s: a tensor has an empty name", path);
        else if (!cJSON_IsObject(c))
            rc = tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%.128s': entry is not an object", path, name);
        else
            rc = parse_tensor(st, fi, c, name, data_len, err);
    }
    if (rc == TP_OK) rc = check_overlap(st, fi, first, err);
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------ the set */

static int cmp_tensor(const void *a, const void *b)
{
    const struct tp_st_tensor *x = a, *y = b;
    return strcmp(x->name, y->name);
}

/* Sort by name and refuse duplicates (within a file or across files). */
static enum tp_status finish(tp_st_t *st, struct tp_error *err)
{
    if (st->n_t > 1) qsort(st->t, (size_t)st->n_t, sizeof(*st->t), cmp_tensor);
    for (int i = 1; i < st->n_t; i++)
        if (strcmp(st->t[i - 1].name, st->t[i].name) == 0) {
            const struct tp_st_tensor *a = &st->t[i - 1], *b = &st->t[i];
            if (a->file == b->file)
                return tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%.128s' appears twice in the header",
                                    st->files[a->file].path, a->name);
            return tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%.128s' appears in both %s and %s", st->path, a->name,
                                st->files[a->file].path, st->files[b->file].path);
        }
    return TP_OK;
}

static enum tp_status add_file(tp_st_t *st, const char *path, struct tp_error *err)
{
    struct st_file *n = realloc(st->files, (size_t)(st->n_files + 1) * sizeof(*n));
    if (!n) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    st->files = n;
    struct st_file *f = &st->files[st->n_files];
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    st->n_files++;
    enum tp_status rc = map_file(f, err);
    if (rc != TP_OK) return rc;
    return parse_file(st, st->n_files - 1, err);
}

static enum tp_status read_small_file(const char *path, size_t cap, char **out, struct tp_error *err)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return tp_error_set(err, errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot open: %s", path,
                            strerror(errno));
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(fp);
        return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, cap + 1, fp);
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return tp_error_set(err, TP_ERR_IO, "%s: read failed", path);
    }
    if (n > cap) {
        free(buf);
        return tp_error_set(err, TP_ERR_FORMAT, "%s: larger than %zu bytes; not an index file", path, cap);
    }
    buf[n] = '\0';
    *out = buf;
    return TP_OK;
}

static int file_index(const tp_st_t *st, const char *path)
{
    for (int i = 0; i < st->n_files; i++)
        if (strcmp(st->files[i].path, path) == 0) return i;
    return -1;
}

/* A sharded set from its index.json. */
static enum tp_status open_index(tp_st_t *st, const char *index_path, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    char *text = NULL, *dir = NULL, *fp = NULL;
    cJSON *root = NULL;
    TP_CHECK_GOTO(read_small_file(index_path, MAX_INDEX_BYTES, &text, err), rc, out);
    root = cJSON_Parse(text);
    if (!root || !cJSON_IsObject(root)) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: not a valid JSON object", index_path);
        goto out;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: no \"weight_map\" object mapping tensor names to files", index_path);
        goto out;
    }
    dir = dir_of(index_path);
    if (!dir) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", index_path);
        goto out;
    }
    /* open every distinct file once, in order of first mention */
    for (const cJSON *c = wm->child; c; c = c->next) {
        const char *tn = c->string ? c->string : "";
        if (!cJSON_IsString(c) || !c->valuestring[0]) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "%s: weight_map entry '%.128s' is not a file name", index_path, tn);
            goto out;
        }
        const char *fn = c->valuestring;
        if (strchr(fn, '/') || strchr(fn, '\\') || fn[0] == '.') {
            rc = tp_error_set(err, TP_ERR_FORMAT,
                              "%s: weight_map entry '%.128s' names '%.128s'; files must sit beside the index (a plain "
                              "file name)",
                              index_path, tn, fn);
            goto out;
        }
        free(fp);
        fp = join_path(dir, fn);
        if (!fp) {
            rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", index_path);
            goto out;
        }
        if (file_index(st, fp) >= 0) continue;
        if (!exists(fp)) {
            rc = tp_error_set(err, TP_ERR_NOT_FOUND,
                              "%s: weight_map names file '%.128s' (for tensor '%.128s'), which does not exist in %s: "
                              "incomplete download?",
                              index_path, fn, tn, dir);
            goto out;
        }
        TP_CHECK_GOTO(add_file(st, fp, err), rc, out);
    }
    /* every listed tensor must be in the file the index names */
    TP_CHECK_GOTO(finish(st, err), rc, out);
    for (const cJSON *c = wm->child; c; c = c->next) {
        free(fp);
        fp = join_path(dir, c->valuestring);
        if (!fp) {
            rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", index_path);
            goto out;
        }
        int fi = file_index(st, fp);
        const struct tp_st_tensor *t = tp_st_find(st, c->string);
        if (!t) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "%s: tensor '%.128s' is listed in weight_map for %s but that file does not contain it",
                              index_path, c->string, fp);
            goto out;
        }
        if (t->file != fi) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "%s: weight_map puts tensor '%.128s' in %s but it is in %s", index_path,
                              c->string, fp, st->files[t->file].path);
            goto out;
        }
    }
out:
    free(fp);
    free(dir);
    cJSON_Delete(root);
    free(text);
    return rc;
}

enum tp_status tp_st_open(const char *path, tp_st_t **out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    char *p = NULL;
    if (!out) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_st_open: out is NULL");
    *out = NULL;
    if (!path) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_st_open: path is NULL");
    tp_st_t *st = calloc(1, sizeof(*st));
    if (!st) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    st->path = strdup(path);
    if (!st->path) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (is_dir(path)) {
        p = join_path(path, INDEX_NAME);
        if (p && exists(p)) {
            TP_CHECK_GOTO(open_index(st, p, err), rc, fail);
        } else {
            free(p);
            p = join_path(path, SINGLE_NAME);
            if (!p) {
                rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
                goto fail;
            }
            if (!exists(p)) {
                rc = tp_error_set(err, TP_ERR_NOT_FOUND, "%s: neither %s nor %s found in this directory", path,
                                  INDEX_NAME, SINGLE_NAME);
                goto fail;
            }
            TP_CHECK_GOTO(add_file(st, p, err), rc, fail);
            TP_CHECK_GOTO(finish(st, err), rc, fail);
        }
    } else if (tp_str_ends_with(path, ".json")) {
        TP_CHECK_GOTO(open_index(st, path, err), rc, fail);
    } else {
        TP_CHECK_GOTO(add_file(st, path, err), rc, fail);
        TP_CHECK_GOTO(finish(st, err), rc, fail);
    }
    free(p);
    *out = st;
    return TP_OK;
fail:
    free(p);
    tp_st_close(st);
    return rc;
}

enum tp_status tp_st_open_mem(const char *name, const void *buf, size_t len, tp_st_t **out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    if (!out) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_st_open_mem: out is NULL");
    *out = NULL;
    if (!buf && len) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_st_open_mem: buffer is NULL");
    if (!name) name = "<memory>";
    tp_st_t *st = calloc(1, sizeof(*st));
    if (!st) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", name);
    st->path = strdup(name);
    st->files = calloc(1, sizeof(*st->files));
    if (!st->path || !st->files) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    st->n_files = 1;
    st->files[0].fd = -1;
    st->files[0].path = strdup(name);
    if (!st->files[0].path) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    static const uint8_t empty[8];
    st->files[0].base = buf ? buf : empty;
    st->files[0].size = len;
    TP_CHECK_GOTO(parse_file(st, 0, err), rc, fail);
    TP_CHECK_GOTO(finish(st, err), rc, fail);
    *out = st;
    return TP_OK;
fail:
    tp_st_close(st);
    return rc;
}

void tp_st_close(tp_st_t *st)
{
    if (!st) return;
    for (int i = 0; i < st->n_t; i++) free((void *)st->t[i].name);
    free(st->t);
    for (int i = 0; i < st->n_files; i++) {
        struct st_file *f = &st->files[i];
        if (f->mapped) munmap((void *)f->base, f->size);
        if (f->fd >= 0) close(f->fd);
        free(f->path);
    }
    free(st->files);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta_k[i]);
        free(st->meta_v[i]);
    }
    free(st->meta_k);
    free(st->meta_v);
    free(st->path);
    free(st);
}

/* ------------------------------------------------------------ accessors */

const char *tp_st_path(const tp_st_t *st) { return st->path; }
int tp_st_n_files(const tp_st_t *st) { return st->n_files; }
const char *tp_st_file_path(const tp_st_t *st, int file)
{
    return file >= 0 && file < st->n_files ? st->files[file].path : NULL;
}
int tp_st_file_fd(const tp_st_t *st, int file) { return file >= 0 && file < st->n_files ? st->files[file].fd : -1; }
uint64_t tp_st_file_size(const tp_st_t *st, int file)
{
    return file >= 0 && file < st->n_files ? st->files[file].size : 0;
}
uint64_t tp_st_file_data_offset(const tp_st_t *st, int file)
{
    return file >= 0 && file < st->n_files ? st->files[file].data_off : 0;
}
int tp_st_n_tensors(const tp_st_t *st) { return st->n_t; }
const struct tp_st_tensor *tp_st_tensor(const tp_st_t *st, int i) { return i >= 0 && i < st->n_t ? &st->t[i] : NULL; }

const struct tp_st_tensor *tp_st_find(const tp_st_t *st, const char *name)
{
    if (!st || !name) return NULL;
    int lo = 0, hi = st->n_t - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(st->t[mid].name, name);
        if (c == 0) return &st->t[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

const char *tp_st_metadata(const tp_st_t *st, const char *key)
{
    for (int i = 0; st && key && i < st->n_meta; i++)
        if (strcmp(st->meta_k[i], key) == 0) return st->meta_v[i];
    return NULL;
}

enum tp_status tp_st_pread(const tp_st_t *st, const struct tp_st_tensor *t, void *dst, size_t n, uint64_t off,
                           struct tp_error *err)
{
    if (!st || !t || t->file < 0 || t->file >= st->n_files || (n && !dst))
        return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_st_pread: bad arguments");
    if (off > t->n_bytes || n > t->n_bytes - off)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "%s: tensor '%s': read of %zu bytes at %llu is outside its %llu bytes",
                            st->files[t->file].path, t->name, n, (unsigned long long)off,
                            (unsigned long long)t->n_bytes);
    const struct st_file *f = &st->files[t->file];
    uint64_t pos = t->file_offset + off;
    if (f->fd < 0) {
        if (n) memcpy(dst, f->base + pos, n);
        return TP_OK;
    }
    uint8_t *p = dst;
    while (n > 0) {
        ssize_t r = pread(f->fd, p, n, (off_t)pos);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return tp_error_set(err, TP_ERR_IO, "%s: reading tensor '%s' at offset %llu failed: %s", f->path, t->name,
                                (unsigned long long)pos, r < 0 ? strerror(errno) : "unexpected end of file");
        p += r;
        n -= (size_t)r;
        pos += (uint64_t)r;
    }
    return TP_OK;
}

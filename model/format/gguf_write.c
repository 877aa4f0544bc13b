/*
 * model/format/gguf_write.c - streaming GGUF v3 writer (see gguf_write.h for the
 * layout).  Metadata and tensor infos are serialised into two growable byte
 * buffers as they are declared; the first tensor-data write emits the
 * header, both buffers and the alignment padding, then tensor bytes go
 * straight to the file through stdio's buffer.  Every length and offset is
 * checked for overflow; the first error sticks.
 */
#include "model/gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct bytebuf {
    uint8_t *p;
    size_t len, cap;
};

struct tensor_rec {
    uint64_t n_bytes;
};

struct tp_gguf_writer {
    FILE *f;
    char *path;              /* final name */
    char *tmp_path;          /* path + ".partial": written, renamed to path by finish */
    uint32_t alignment;
    struct tp_error err;
    struct bytebuf kv;       /* serialised key/value pairs */
    struct bytebuf ti;       /* serialised tensor infos */
    uint64_t n_kv;
    struct tensor_rec *tensors;
    uint64_t n_tensors, cap_tensors;
    uint64_t data_bytes;     /* sum of aligned tensor sizes so far (next offset) */
    int header_done;
    uint64_t header_len;     /* bytes before the padding, remembered once written */
    uint64_t cur;            /* tensor being written */
    uint64_t cur_done;       /* bytes of it written */
    int finished;
};

static enum tp_status fail(tp_gguf_writer_t *w, enum tp_status st, const char *fmt, const char *a)
{
    return tp_error_set(&w->err, st, fmt, w->path, a ? a : "");
}

static enum tp_status buf_put(tp_gguf_writer_t *w, struct bytebuf *b, const void *src, size_t n)
{
    if (w->err.status != TP_OK) return w->err.status;
    if (n > SIZE_MAX - b->len) return fail(w, TP_ERR_NOMEM, "%s: metadata too large%s", NULL);
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) {
            if (cap > SIZE_MAX / 2) return fail(w, TP_ERR_NOMEM, "%s: metadata too large%s", NULL);
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) return fail(w, TP_ERR_NOMEM, "%s: out of memory for metadata%s", NULL);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return TP_OK;
}

/* Little-endian fixed-width writes (the host is assumed little-endian; a
 * big-endian host would need swaps here, and GGUF files are LE everywhere). */
static enum tp_status put_u32(tp_gguf_writer_t *w, struct bytebuf *b, uint32_t v) { return buf_put(w, b, &v, 4); }
static enum tp_status put_u64(tp_gguf_writer_t *w, struct bytebuf *b, uint64_t v) { return buf_put(w, b, &v, 8); }
static enum tp_status put_str(tp_gguf_writer_t *w, struct bytebuf *b, const char *s, size_t len)
{
    enum tp_status st = put_u64(w, b, (uint64_t)len);
    return st != TP_OK ? st : buf_put(w, b, s, len);
}

static size_t scalar_size(enum tp_gguf_type t)
{
    switch (t) {
    case TP_GGUF_UINT8: case TP_GGUF_INT8: case TP_GGUF_BOOL: return 1;
    case TP_GGUF_UINT16: case TP_GGUF_INT16: return 2;
    case TP_GGUF_UINT32: case TP_GGUF_INT32: case TP_GGUF_FLOAT32: return 4;
    case TP_GGUF_UINT64: case TP_GGUF_INT64: case TP_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

enum tp_status tp_gguf_writer_open(const char *path, uint32_t alignment, tp_gguf_writer_t **out,
                                   struct tp_error *err)
{
    if (!out) return TP_ERR_INVALID_ARG;
    *out = NULL;
    if (!path || !*path) return tp_error_set(err, TP_ERR_INVALID_ARG, "gguf writer: empty output path");
    if (alignment == 0) alignment = 32;
    if (alignment < 8 || (alignment & (alignment - 1)))
        return tp_error_set(err, TP_ERR_INVALID_ARG, "gguf writer: alignment %u is not a power of two >= 8",
                            alignment);
    tp_gguf_writer_t *w = calloc(1, sizeof(*w));
    if (!w) return tp_error_set(err, TP_ERR_NOMEM, "gguf writer: out of memory");
    w->path = strdup(path);
    w->tmp_path = malloc(strlen(path) + sizeof(".partial"));
    w->alignment = alignment;
    if (!w->path || !w->tmp_path) {
        free(w->path);
        free(w->tmp_path);
        free(w);
        return tp_error_set(err, TP_ERR_NOMEM, "gguf writer: out of memory");
    }
    memcpy(w->tmp_path, path, strlen(path));
    memcpy(w->tmp_path + strlen(path), ".partial", sizeof(".partial"));
    w->f = fopen(w->tmp_path, "wb");
    if (!w->f) {
        enum tp_status st = tp_error_set(err, TP_ERR_IO, "%s: cannot create: %s (check the directory exists and is writable)",
                                         path, strerror(errno));
        free(w->path);
        free(w->tmp_path);
        free(w);
        return st;
    }
    setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    *out = w;
    return TP_OK;
}

void tp_gguf_writer_free(tp_gguf_writer_t *w)
{
    if (!w) return;
    if (w->f) fclose(w->f);
    if (!w->finished) (void)unlink(w->tmp_path);
    free(w->tmp_path);
    free(w->kv.p);
    free(w->ti.p);
    free(w->tensors);
    free(w->path);
    free(w);
}

const char *tp_gguf_writer_error(const tp_gguf_writer_t *w) { return w ? tp_error_msg(&w->err) : ""; }

static enum tp_status kv_begin(tp_gguf_writer_t *w, const char *key, enum tp_gguf_type type)
{
    if (!w) return TP_ERR_INVALID_ARG;
    if (w->err.status != TP_OK) return w->err.status;
    if (!key || !*key) return fail(w, TP_ERR_INVALID_ARG, "%s: empty metadata key%s", NULL);
    if (w->header_done) return fail(w, TP_ERR_INVALID_ARG, "%s: key '%s' added after tensor data started", key);
    enum tp_status st = put_str(w, &w->kv, key, strlen(key));
    if (st == TP_OK) st = put_u32(w, &w->kv, (uint32_t)type);
    if (st == TP_OK) w->n_kv++;
    return st;
}

enum tp_status tp_gguf_kv_scalar(tp_gguf_writer_t *w, const char *key, enum tp_gguf_type type, const void *value)
{
    size_t sz = scalar_size(type);
    if (!w) return TP_ERR_INVALID_ARG;
    if (!sz || !value) return fail(w, TP_ERR_INVALID_ARG, "%s: key '%s': not a scalar type", key);
    enum tp_status st = kv_begin(w, key, type);
    if (st == TP_OK && type == TP_GGUF_BOOL) {
        uint8_t b = *(const uint8_t *)value ? 1 : 0;
        return buf_put(w, &w->kv, &b, 1);
    }
    return st != TP_OK ? st : buf_put(w, &w->kv, value, sz);
}

enum tp_status tp_gguf_kv_u32(tp_gguf_writer_t *w, const char *key, uint32_t v)
{
    return tp_gguf_kv_scalar(w, key, TP_GGUF_UINT32, &v);
}
enum tp_status tp_gguf_kv_i32(tp_gguf_writer_t *w, const char *key, int32_t v)
{
    return tp_gguf_kv_scalar(w, key, TP_GGUF_INT32, &v);
}
enum tp_status tp_gguf_kv_u64(tp_gguf_writer_t *w, const char *key, uint64_t v)
{
    return tp_gguf_kv_scalar(w, key, TP_GGUF_UINT64, &v);
}
enum tp_status tp_gguf_kv_f32(tp_gguf_writer_t *w, const char *key, float v)
{
    return tp_gguf_kv_scalar(w, key, TP_GGUF_FLOAT32, &v);
}
enum tp_status tp_gguf_kv_bool(tp_gguf_writer_t *w, const char *key, int v)
{
    uint8_t b = v ? 1 : 0;
    return tp_gguf_kv_scalar(w, key, TP_GGUF_BOOL, &b);
}

enum tp_status tp_gguf_kv_str(tp_gguf_writer_t *w, const char *key, const char *v)
{
    if (!w) return TP_ERR_INVALID_ARG;
    if (!v) return fail(w, TP_ERR_INVALID_ARG, "%s: key '%s': NULL string", key);
    enum tp_status st = kv_begin(w, key, TP_GGUF_STRING);
    return st != TP_OK ? st : put_str(w, &w->kv, v, strlen(v));
}

enum tp_status tp_gguf_kv_array(tp_gguf_writer_t *w, const char *key, enum tp_gguf_type elem_type, const void *data,
                                uint64_t n)
{
    if (!w) return TP_ERR_INVALID_ARG;
    size_t sz = scalar_size(elem_type);
    if (!sz || (n && !data)) return fail(w, TP_ERR_INVALID_ARG, "%s: key '%s': bad array element type or data", key);
    if (n > SIZE_MAX / sz) return fail(w, TP_ERR_INVALID_ARG, "%s: key '%s': array too long", key);
    enum tp_status st = kv_begin(w, key, TP_GGUF_ARRAY);
    if (st == TP_OK) st = put_u32(w, &w->kv, (uint32_t)elem_type);
    if (st == TP_OK) st = put_u64(w, &w->kv, n);
    if (st == TP_OK && n) st = buf_put(w, &w->kv, data, (size_t)n * sz);
    return st;
}

enum tp_status tp_gguf_kv_array_str(tp_gguf_writer_t *w, const char *key, const char *const *strs,
                                    const size_t *lens, uint64_t n)
{
    if (!w) return TP_ERR_INVALID_ARG;
    if (n && !strs) return fail(w, TP_ERR_INVALID_ARG, "%s: key '%s': NULL string array", key);
    enum tp_status st = kv_begin(w, key, TP_GGUF_ARRAY);
    if (st == TP_OK) st = put_u32(w, &w->kv, (uint32_t)TP_GGUF_STRING);
    if (st == TP_OK) st = put_u64(w, &w->kv, n);
    for (uint64_t i = 0; st == TP_OK && i < n; i++) {
        if (!strs[i]) return fail(w, TP_ERR_INVALID_ARG, "%s: key '%s': NULL string in array", key);
        st = put_str(w, &w->kv, strs[i], lens ? lens[i] : strlen(strs[i]));
    }
    return st;
}

uint64_t tp_gguf_tensor_bytes(enum tp_wtype type, int n_dims, const int64_t *ne)
{
    int64_t be = tp_wtype_block_elems(type);
    size_t bb = tp_wtype_block_bytes(type);
    if (be <= 0 || bb == 0 || n_dims < 1 || n_dims > 4 || !ne) return 0;
    if (ne[0] <= 0 || ne[0] % be) return 0;
    uint64_t rows = 1;
    for (int i = 1; i < n_dims; i++) {
        if (ne[i] <= 0 || (uint64_t)ne[i] > UINT64_MAX / rows) return 0;
        rows *= (uint64_t)ne[i];
    }
    uint64_t row_bytes = (uint64_t)(ne[0] / be) * bb;
    if (rows > UINT64_MAX / row_bytes) return 0;
    return rows * row_bytes;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

enum tp_status tp_gguf_add_tensor(tp_gguf_writer_t *w, const char *name, enum tp_wtype type, int n_dims,
                                  const int64_t *ne)
{
    if (!w) return TP_ERR_INVALID_ARG;
    if (w->err.status != TP_OK) return w->err.status;
    if (!name || !*name) return fail(w, TP_ERR_INVALID_ARG, "%s: empty tensor name%s", NULL);
    if (w->header_done) return fail(w, TP_ERR_INVALID_ARG, "%s: tensor '%s' added after tensor data started", name);
    if ((int)type >= TP_WTYPE_GGUF_END) /* MLX affine types: internal ids, no GGUF reader knows them */
        return fail(w, TP_ERR_INVALID_ARG, "%s: tensor '%s': MLX types have no GGUF id (GGUF holds ggml types only)", name);
    uint64_t nb = tp_gguf_tensor_bytes(type, n_dims, ne);
    if (nb == 0)
        return fail(w, TP_ERR_INVALID_ARG,
                    "%s: tensor '%s': bad type or dims (1..4 dims, ne[0] a multiple of the type's block size)", name);
    if (w->data_bytes > UINT64_MAX - nb - w->alignment) return fail(w, TP_ERR_INVALID_ARG, "%s: tensor '%s': data too large", name);
    if (w->n_tensors == w->cap_tensors) {
        uint64_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        struct tensor_rec *t = realloc(w->tensors, (size_t)cap * sizeof(*t));
        if (!t) return fail(w, TP_ERR_NOMEM, "%s: out of memory for tensor '%s'", name);
        w->tensors = t;
        w->cap_tensors = cap;
    }
    enum tp_status st = put_str(w, &w->ti, name, strlen(name));
    if (st == TP_OK) st = put_u32(w, &w->ti, (uint32_t)n_dims);
    for (int i = 0; st == TP_OK && i < n_dims; i++) st = put_u64(w, &w->ti, (uint64_t)ne[i]);
    if (st == TP_OK) st = put_u32(w, &w->ti, (uint32_t)type);
    if (st == TP_OK) st = put_u64(w, &w->ti, w->data_bytes);
    if (st != TP_OK) return st;
    w->tensors[w->n_tensors++].n_bytes = nb;
    w->data_bytes = align_up(w->data_bytes + nb, w->alignment);
    return TP_OK;
}

static enum tp_status file_write(tp_gguf_writer_t *w, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, w->f) != n)
        return fail(w, TP_ERR_IO, "%s: write failed: %s (disk full?)", strerror(errno));
    return TP_OK;
}

static enum tp_status write_zeros(tp_gguf_writer_t *w, uint64_t n)
{
    static const uint8_t zeros[256];
    enum tp_status st = TP_OK;
    while (st == TP_OK && n) {
        size_t k = n > sizeof(zeros) ? sizeof(zeros) : (size_t)n;
        st = file_write(w, zeros, k);
        n -= k;
    }
    return st;
}

static uint64_t header_bytes(const tp_gguf_writer_t *w)
{
    return w->header_done ? w->header_len : 4 + 4 + 8 + 8 + (uint64_t)w->kv.len + w->ti.len;
}

uint64_t tp_gguf_writer_file_bytes(const tp_gguf_writer_t *w)
{
    if (!w) return 0;
    return align_up(header_bytes(w), w->alignment) + w->data_bytes;
}

static enum tp_status write_header(tp_gguf_writer_t *w)
{
    const uint32_t magic = 0x46554747u; /* "GGUF" little-endian */
    const uint32_t version = 3;
    enum tp_status st = file_write(w, &magic, 4);
    if (st == TP_OK) st = file_write(w, &version, 4);
    if (st == TP_OK) st = file_write(w, &w->n_tensors, 8);
    if (st == TP_OK) st = file_write(w, &w->n_kv, 8);
    if (st == TP_OK) st = file_write(w, w->kv.p, w->kv.len);
    if (st == TP_OK) st = file_write(w, w->ti.p, w->ti.len);
    uint64_t h = header_bytes(w);
    w->header_len = h;
    if (st == TP_OK) st = write_zeros(w, align_up(h, w->alignment) - h);
    /* the metadata is on disk: release it (a 150k-token vocabulary is MBs) */
    free(w->kv.p);
    free(w->ti.p);
    memset(&w->kv, 0, sizeof(w->kv));
    memset(&w->ti, 0, sizeof(w->ti));
    w->header_done = 1;
    return st;
}

/* Skip to the next tensor that still needs bytes, padding the finished one. */
static enum tp_status finish_current(tp_gguf_writer_t *w)
{
    while (w->cur < w->n_tensors && w->cur_done == w->tensors[w->cur].n_bytes) {
        uint64_t nb = w->tensors[w->cur].n_bytes;
        enum tp_status st = write_zeros(w, align_up(nb, w->alignment) - nb);
        if (st != TP_OK) return st;
        w->cur++;
        w->cur_done = 0;
    }
    return TP_OK;
}

enum tp_status tp_gguf_write_data(tp_gguf_writer_t *w, const void *data, size_t n_bytes)
{
    if (!w) return TP_ERR_INVALID_ARG;
    if (w->err.status != TP_OK) return w->err.status;
    if (!w->header_done) {
        enum tp_status st = write_header(w);
        if (st != TP_OK) return st;
    }
    if (n_bytes == 0) return TP_OK;
    if (!data) return fail(w, TP_ERR_INVALID_ARG, "%s: NULL tensor data%s", NULL);
    if (w->cur >= w->n_tensors) return fail(w, TP_ERR_INVALID_ARG, "%s: more tensor data than declared tensors%s", NULL);
    uint64_t left = w->tensors[w->cur].n_bytes - w->cur_done;
    if ((uint64_t)n_bytes > left)
        return fail(w, TP_ERR_INVALID_ARG, "%s: tensor data chunk crosses the end of a tensor%s", NULL);
    enum tp_status st = file_write(w, data, n_bytes);
    if (st != TP_OK) return st;
    w->cur_done += n_bytes;
    return finish_current(w);
}

enum tp_status tp_gguf_writer_finish(tp_gguf_writer_t *w)
{
    if (!w) return TP_ERR_INVALID_ARG;
    if (w->err.status != TP_OK) return w->err.status;
    if (!w->header_done) {
        enum tp_status st = write_header(w);
        if (st != TP_OK) return st;
    }
    enum tp_status st = finish_current(w);
    if (st != TP_OK) return st;
    if (w->cur < w->n_tensors) {
        char what[64];
        snprintf(what, sizeof(what), "%llu of %llu", (unsigned long long)w->cur, (unsigned long long)w->n_tensors);
        return fail(w, TP_ERR_INVALID_ARG, "%s: finish before all tensor data was written (%s tensors complete)", what);
    }
    if (fflush(w->f) != 0) return fail(w, TP_ERR_IO, "%s: flush failed: %s", strerror(errno));
    int rc = fclose(w->f);
    w->f = NULL;
    if (rc != 0) return fail(w, TP_ERR_IO, "%s: close failed: %s", strerror(errno));
    if (rename(w->tmp_path, w->path) != 0) return fail(w, TP_ERR_IO, "%s: cannot rename the finished file into place: %s", strerror(errno));
    w->finished = 1;
    return TP_OK;
}

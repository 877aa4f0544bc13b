/*
 * model/include/model/gguf.h - a validating, read-only GGUF (v2/v3) reader.
 *
 * tp_gguf_open() memory-maps the file read-only and checks everything before
 * anyone uses it: magic, version, counts, every string and array length,
 * value types, tensor dims and types, general.alignment, tensor offsets
 * (aligned, extents inside the file) and all size arithmetic for overflow.
 * A bad file is refused with an error that names the file, the field and the
 * reason.  After a successful open every accessor below is safe: no pointer
 * it hands out points outside the mapping.
 *
 * Usage (metadata):
 *     tp_gguf_t *g; struct tp_error err = {0};
 *     if (tp_gguf_open(path, &g, &err) != TP_OK) { ... err.msg ... }
 *     const char *arch;  tp_gguf_get_str(g, "general.architecture", &arch);
 *     int64_t n;         tp_gguf_get_int(g, "llama.block_count", &n);
 *     int kv = tp_gguf_find_key(g, "tokenizer.ggml.tokens");
 *     uint64_t count = tp_gguf_arr_len(g, kv);              // string array
 *     size_t len; const char *tok = tp_gguf_arr_str(g, kv, i, &len); // not NUL-terminated
 *     tp_gguf_arr_copy_f32(g, tp_gguf_find_key(g, "tokenizer.ggml.scores"), scores, count);
 *     tp_gguf_close(g);
 * Getters return TP_ERR_NOT_FOUND when the key is absent (no error text set:
 * absence is often fine) and TP_ERR_FORMAT when it has the wrong type (error
 * text set on the handle, read with tp_gguf_last_error()).
 *
 * Usage (tensors): tp_gguf_find_tensor(g, "blk.0.attn_q.weight") gives the
 * type, dims (ggml order: ne[0] is the contiguous row length), byte size,
 * the absolute file offset (for pread) and a pointer into the mapping.
 *
 * Little-endian GGUF only (the only kind in use).  Not thread safe for
 * concurrent use of the error text; all reads are otherwise const.
 */
#ifndef TP_MODEL_GGUF_H
#define TP_MODEL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "model/model.h"

/* GGUF metadata value types (numbering from the spec). */
enum tp_gguf_type {
    TP_GGUF_UINT8 = 0,
    TP_GGUF_INT8 = 1,
    TP_GGUF_UINT16 = 2,
    TP_GGUF_INT16 = 3,
    TP_GGUF_UINT32 = 4,
    TP_GGUF_INT32 = 5,
    TP_GGUF_FLOAT32 = 6,
    TP_GGUF_BOOL = 7,
    TP_GGUF_STRING = 8,
    TP_GGUF_ARRAY = 9,
    TP_GGUF_UINT64 = 10,
    TP_GGUF_INT64 = 11,
    TP_GGUF_FLOAT64 = 12,
    TP_GGUF_TYPE_COUNT
};
/* "uint32", "string", ...; "type#N" text for unknown ids. Never NULL. */
const char *tp_gguf_type_name(enum tp_gguf_type t);

#define TP_GGUF_MAX_DIMS 4
#define TP_GGUF_DEFAULT_ALIGNMENT 32

/* One tensor of the file.  All fields validated at open. */
struct tp_gguf_tensor {
    const char *name;        /* NUL-terminated copy, owned by the reader */
    enum tp_wtype type;      /* ggml type id (size known; computing with it may still be unsupported) */
    int n_dims;              /* 1..4 */
    int64_t ne[TP_GGUF_MAX_DIMS]; /* elements per dim, ne[0] contiguous; unused dims are 1 */
    int64_t n_elems;         /* product of ne */
    uint64_t n_bytes;        /* bytes of data */
    uint64_t file_offset;    /* absolute offset of the data in the file (for pread) */
    const void *data;        /* pointer into the mapping (NULL when n_bytes == 0) */
};

typedef struct tp_gguf tp_gguf_t;

/* Open and validate path (mmap'd read-only; the fd stays open for pread).
 * On failure *out = NULL and err (may be NULL) names file, field and reason. */
enum tp_status tp_gguf_open(const char *path, tp_gguf_t **out, struct tp_error *err);
/* Same over a caller-owned buffer (fuzzing, tests); buf must outlive the
 * handle.  name is used in error messages. tp_gguf_fd() returns -1. */
enum tp_status tp_gguf_open_mem(const char *name, const void *buf, size_t len, tp_gguf_t **out,
                                struct tp_error *err);
void tp_gguf_close(tp_gguf_t *g); /* NULL safe */

const char *tp_gguf_path(const tp_gguf_t *g);
const char *tp_gguf_last_error(const tp_gguf_t *g);
uint32_t tp_gguf_version(const tp_gguf_t *g);
uint32_t tp_gguf_alignment(const tp_gguf_t *g);
uint64_t tp_gguf_file_size(const tp_gguf_t *g);
uint64_t tp_gguf_data_offset(const tp_gguf_t *g); /* start of the tensor data section */
int tp_gguf_fd(const tp_gguf_t *g);                /* -1 for tp_gguf_open_mem */

/* ---- metadata (key/value pairs) ---- */
int tp_gguf_n_kv(const tp_gguf_t *g);
/* Index of key, or -1. */
int tp_gguf_find_key(const tp_gguf_t *g, const char *key);
/* Key text (NUL-terminated) and type of entry i in [0, n_kv). */
const char *tp_gguf_key(const tp_gguf_t *g, int i);
enum tp_gguf_type tp_gguf_kv_type(const tp_gguf_t *g, int i);

/* Scalars by key.  Integers of any width/sign convert when the value fits
 * (else TP_ERR_FORMAT); bool reads as 0/1 via get_int and get_bool; float
 * accepts float32/float64 (and integers).  Strings are NUL-terminated copies
 * owned by the reader (valid until close). */
enum tp_status tp_gguf_get_int(tp_gguf_t *g, const char *key, int64_t *out);
enum tp_status tp_gguf_get_u64(tp_gguf_t *g, const char *key, uint64_t *out);
enum tp_status tp_gguf_get_float(tp_gguf_t *g, const char *key, double *out);
enum tp_status tp_gguf_get_bool(tp_gguf_t *g, const char *key, int *out);
enum tp_status tp_gguf_get_str(tp_gguf_t *g, const char *key, const char **out);

/* Arrays by entry index (from tp_gguf_find_key).  A non-array index gives
 * element type TP_GGUF_TYPE_COUNT and length 0. */
enum tp_gguf_type tp_gguf_arr_type(const tp_gguf_t *g, int i);
uint64_t tp_gguf_arr_len(const tp_gguf_t *g, int i);
/* Element j of a string array: pointer into the mapping, NOT NUL-terminated;
 * *len set.  NULL when i is not a string array or j is out of range. */
const char *tp_gguf_arr_str(const tp_gguf_t *g, int i, uint64_t j, size_t *len);
/* Copy n elements of a numeric (or bool) array converted to int32 / float.
 * TP_ERR_FORMAT (text on the handle) when the array is not numeric, shorter
 * than n, or an integer does not fit int32. */
enum tp_status tp_gguf_arr_copy_i32(tp_gguf_t *g, int i, int32_t *out, uint64_t n);
enum tp_status tp_gguf_arr_copy_f32(tp_gguf_t *g, int i, float *out, uint64_t n);

/* ---- tensors ---- */
int tp_gguf_n_tensors(const tp_gguf_t *g);
const struct tp_gguf_tensor *tp_gguf_tensor(const tp_gguf_t *g, int i);
/* By name, or NULL. */
const struct tp_gguf_tensor *tp_gguf_find_tensor(const tp_gguf_t *g, const char *name);

/* ggml type table used for validation: name, elements per block, bytes per
 * block.  0 / "type#N" for ids that are not ggml types. */
const char *tp_gguf_wtype_name(uint32_t type);
int64_t tp_gguf_wtype_block_elems(uint32_t type);
size_t tp_gguf_wtype_block_bytes(uint32_t type);

#endif /* TP_MODEL_GGUF_H */

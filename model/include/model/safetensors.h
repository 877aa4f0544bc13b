/*
 * model/include/model/safetensors.h - a validating, read-only reader of Hugging
 * Face safetensors files, alone or as a sharded set.
 *
 * Format of one file: an 8-byte little-endian header length N, then N bytes
 * of UTF-8 JSON (writers may pad it with spaces), then the data section.
 * The JSON is one object: `{"NAME": {"dtype": "F32", "shape": [d0, d1, ...],
 * "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v", ...}}`;
 * offsets are relative to the start of the data section, shapes are
 * row-major (the LAST dimension is contiguous, the reverse of ggml's ne[]).
 *
 * A sharded set is described by `model.safetensors.index.json`:
 * `{"metadata": {...}, "weight_map": {"NAME": "model-00001-of-00002.safetensors", ...}}`,
 * every file named there sitting in the same directory as the index.
 *
 * tp_st_open() checks everything before anyone uses a tensor: header length
 * against the file size (and a 100 MiB cap), the JSON, known dtypes, every
 * shape dimension and shape product x dtype size == data_offsets span (all
 * overflow-checked), offsets inside the data section, no two tensors
 * overlapping, no duplicate names (within a file or across the set), and for
 * an index: every file it names exists and is a valid safetensors file, and
 * every tensor it lists is present in the file it names.  Errors name the
 * file, the tensor and the reason.  After a successful open no pointer handed
 * out points outside a mapping.
 *
 * Ownership and lifetimes: the handle owns the mappings, the file
 * descriptors and every string; tensor records, names, paths and data
 * pointers stay valid until tp_st_close().  Everything is read-only after
 * open, so any number of threads may read tensors at once (tp_st_pread
 * included); the error text of tp_st_pread is returned in the caller's
 * struct tp_error, not stored on the handle.
 *
 * Usage:
 *     tp_st_t *st; struct tp_error err = {0};
 *     if (tp_st_open("/models/Llama-3.2-1B", &st, &err) != TP_OK) { ... err.msg ... }
 *     const struct tp_st_tensor *t = tp_st_find(st, "model.layers.0.self_attn.q_proj.weight");
 *     // t->dtype, t->shape[0..n_dims), t->data (mapping), or pread from
 *     // tp_st_file_fd(st, t->file) at t->file_offset (absolute), t->n_bytes long
 *     tp_st_close(st);
 */
#ifndef TP_MODEL_SAFETENSORS_H
#define TP_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* Element types of the safetensors format (its dtype strings in the comments). */
enum tp_st_dtype {
    TP_ST_BOOL = 0, /* "BOOL" (1 byte) */
    TP_ST_U8,       /* "U8" */
    TP_ST_I8,       /* "I8" */
    TP_ST_F8_E4M3,  /* "F8_E4M3" */
    TP_ST_F8_E5M2,  /* "F8_E5M2" */
    TP_ST_U16,      /* "U16" */
    TP_ST_I16,      /* "I16" */
    TP_ST_F16,      /* "F16" */
    TP_ST_BF16,     /* "BF16" */
    TP_ST_U32,      /* "U32" (MLX packed quantized weights) */
    TP_ST_I32,      /* "I32" */
    TP_ST_F32,      /* "F32" */
    TP_ST_U64,      /* "U64" */
    TP_ST_I64,      /* "I64" */
    TP_ST_F64,      /* "F64" */
    TP_ST_DTYPE_COUNT
};
/* "F32", ...; "dtype#N" for out-of-range values. Never NULL. */
const char *tp_st_dtype_name(enum tp_st_dtype d);
/* Bytes per element (0 for out-of-range values). */
size_t tp_st_dtype_size(enum tp_st_dtype d);
/* Parse a safetensors dtype string (exact, upper case); TP_ERR_NOT_FOUND if unknown. */
enum tp_status tp_st_dtype_parse(const char *s, enum tp_st_dtype *out);

#define TP_ST_MAX_DIMS 8
#define TP_ST_MAX_HEADER_BYTES ((uint64_t)100 << 20) /* as the reference implementation */

/* One tensor of the set.  All fields validated at open. */
struct tp_st_tensor {
    const char *name;          /* NUL-terminated, owned by the handle */
    enum tp_st_dtype dtype;
    int n_dims;                /* 0 (scalar) .. TP_ST_MAX_DIMS */
    int64_t shape[TP_ST_MAX_DIMS]; /* row-major: shape[n_dims-1] is contiguous; unused dims are 1 */
    int64_t n_elems;           /* product of shape (1 for a scalar) */
    uint64_t n_bytes;          /* n_elems * dtype size == data_offsets span */
    int file;                  /* index of the file that holds it, in [0, tp_st_n_files) */
    uint64_t file_offset;      /* absolute offset of the first byte in that file (for pread) */
    const void *data;          /* pointer into the file's mapping; NULL when n_bytes == 0.
                                  Not aligned in general (offsets are arbitrary bytes). */
};

typedef struct tp_st tp_st_t;

/*
 * Open path, which may be:
 *   - a directory: its model.safetensors.index.json if present, else its
 *     model.safetensors;
 *   - a *.safetensors.index.json file (sharded set);
 *   - a single .safetensors file.
 * Every file is mmap'd read-only and its fd kept open for pread.
 * On failure *out = NULL and err (may be NULL) names file, tensor and reason.
 */
enum tp_status tp_st_open(const char *path, tp_st_t **out, struct tp_error *err);
/* One safetensors file held in a caller-owned buffer (fuzzing, tests); buf
 * must outlive the handle; name is used in messages; the fd is -1. */
enum tp_status tp_st_open_mem(const char *name, const void *buf, size_t len, tp_st_t **out, struct tp_error *err);
void tp_st_close(tp_st_t *st); /* NULL safe */

/* The path given to tp_st_open (or the name given to tp_st_open_mem). */
const char *tp_st_path(const tp_st_t *st);

/* ---- files of the set (1 for a single file) ---- */
int tp_st_n_files(const tp_st_t *st);
const char *tp_st_file_path(const tp_st_t *st, int file);   /* full path */
int tp_st_file_fd(const tp_st_t *st, int file);             /* -1 for tp_st_open_mem */
uint64_t tp_st_file_size(const tp_st_t *st, int file);
uint64_t tp_st_file_data_offset(const tp_st_t *st, int file); /* 8 + header length */

/* ---- tensors (sorted by name) ---- */
int tp_st_n_tensors(const tp_st_t *st);
const struct tp_st_tensor *tp_st_tensor(const tp_st_t *st, int i); /* NULL when out of range */
/* By exact name (binary search), or NULL. */
const struct tp_st_tensor *tp_st_find(const tp_st_t *st, const char *name);

/*
 * Copy n bytes starting at byte offset `off` inside tensor t into dst,
 * with pread on the file that holds it (only those pages become resident),
 * or from the mapping for tp_st_open_mem.  TP_ERR_INVALID_ARG when
 * [off, off+n) is not inside the tensor; TP_ERR_IO when the read fails
 * (text in err naming file and tensor).  Thread safe.
 */
enum tp_status tp_st_pread(const tp_st_t *st, const struct tp_st_tensor *t, void *dst, size_t n, uint64_t off,
                           struct tp_error *err);

/* ---- metadata ---- */
/* Value of a string entry of the "__metadata__" object of the first file
 * (e.g. "format": "pt" / "mlx"), or NULL. */
const char *tp_st_metadata(const tp_st_t *st, const char *key);

#endif /* TP_MODEL_SAFETENSORS_H */

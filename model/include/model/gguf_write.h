/*
 * model/include/model/gguf_write.h - a streaming GGUF v3 writer (used by
 * `tpserve synth` and by tests that build files on the fly).
 *
 * Use: open -> any number of kv_* and add_tensor calls (metadata is kept in
 * memory; it is small next to the weights) -> write_data for each tensor, in
 * the order the tensors were added, in as many pieces as convenient ->
 * finish.  The header and metadata are written by the first write_data (or
 * by finish when there are no tensors), so tensor data never has to be held
 * whole: a multi-GB model is written with a few MB of memory.
 *
 * File layout written (all little-endian):
 *   "GGUF" u32 version=3, u64 n_tensors, u64 n_kv,
 *   n_kv x (string key, u32 type, value),   string = u64 length + bytes
 *   n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
 *   zero padding to `alignment`, then each tensor's bytes at its offset
 *   (offsets relative to the start of the data section, each a multiple of
 *   alignment).
 *
 * Errors are sticky: after a failed call every later call returns the same
 * status; the text is in tp_gguf_writer_error().  Not thread safe.
 */
#ifndef TP_MODEL_GGUF_WRITE_H
#define TP_MODEL_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h" /* enum tp_gguf_type */
#include "model/model.h"

typedef struct tp_gguf_writer tp_gguf_writer_t;

/* Create path (written as path.partial and renamed over path by a
 * successful finish, so a reader never sees a half-written model).
 * alignment: power of two >= 8 (0: 32, GGUF's default).  The writer adds no
 * keys of its own: for an alignment other than 32 the caller must also write
 * general.alignment. */
enum tp_status tp_gguf_writer_open(const char *path, uint32_t alignment, tp_gguf_writer_t **out,
                                   struct tp_error *err);
/* Close; if finish did not succeed, path.partial is removed (path untouched). NULL safe. */
void tp_gguf_writer_free(tp_gguf_writer_t *w);
const char *tp_gguf_writer_error(const tp_gguf_writer_t *w);

/* Scalars. */
enum tp_status tp_gguf_kv_u32(tp_gguf_writer_t *w, const char *key, uint32_t v);
enum tp_status tp_gguf_kv_i32(tp_gguf_writer_t *w, const char *key, int32_t v);
enum tp_status tp_gguf_kv_u64(tp_gguf_writer_t *w, const char *key, uint64_t v);
enum tp_status tp_gguf_kv_f32(tp_gguf_writer_t *w, const char *key, float v);
enum tp_status tp_gguf_kv_bool(tp_gguf_writer_t *w, const char *key, int v);
enum tp_status tp_gguf_kv_str(tp_gguf_writer_t *w, const char *key, const char *v);
/* Any scalar by type: value points to one element of that type (not STRING/ARRAY). */
enum tp_status tp_gguf_kv_scalar(tp_gguf_writer_t *w, const char *key, enum tp_gguf_type type, const void *value);
/* Array of n fixed-size elements of elem_type (not STRING/ARRAY), packed in data. */
enum tp_status tp_gguf_kv_array(tp_gguf_writer_t *w, const char *key, enum tp_gguf_type elem_type, const void *data,
                                uint64_t n);
/* Array of n strings; lens may be NULL (NUL-terminated strings). */
enum tp_status tp_gguf_kv_array_str(tp_gguf_writer_t *w, const char *key, const char *const *strs,
                                    const size_t *lens, uint64_t n);

/* Declare a tensor: ne[0] is the contiguous (input) dimension, as in ggml.
 * n_dims in [1, 4]; ne[0] must be a multiple of the type's block size. */
enum tp_status tp_gguf_add_tensor(tp_gguf_writer_t *w, const char *name, enum tp_wtype type, int n_dims,
                                  const int64_t *ne);
/* Bytes the data of a tensor with this type and shape occupies (0 if invalid). */
uint64_t tp_gguf_tensor_bytes(enum tp_wtype type, int n_dims, const int64_t *ne);

/* Append bytes to the tensor data, in declaration order; a chunk may not
 * cross a tensor boundary.  Padding between tensors is written for you. */
enum tp_status tp_gguf_write_data(tp_gguf_writer_t *w, const void *data, size_t n_bytes);
/* Check that every tensor got all its bytes, flush and close. */
enum tp_status tp_gguf_writer_finish(tp_gguf_writer_t *w);

/* Total bytes the file will have (known once all tensors are declared). */
uint64_t tp_gguf_writer_file_bytes(const tp_gguf_writer_t *w);

#endif /* TP_MODEL_GGUF_WRITE_H */

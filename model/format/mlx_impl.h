/*
 * model/format/mlx_impl.h - private to model/: loading an MLX-quantized
 * matrix (mlx_load.c) for the loader (model_load.c).  The quantization block
 * and the tensor-source hook are public in model/mlx_quant.h.
 */
#ifndef TP_MODEL_MLX_IMPL_H
#define TP_MODEL_MLX_IMPL_H

#include <stdint.h>

#include "forward/model_impl.h"
#include "model/mlx_quant.h"

/*
 * Load rows [r0, r1) x columns [c0, c1) of the MLX-quantized matrix t (full
 * shape rows_full x cols_full in ggml terms) into w: zero-copy pointers into
 * the mappings when the whole matrix is kept, else pread of exactly this
 * rank's byte ranges of the words, scales and biases into one owned buffer
 * each (columns on group boundaries: no repacking).  The triple comes from
 * the safetensors (t->st) or from a GGUF shard file (m->gguf); a shard file
 * cut for this rank (m->shard.file_is_slice) may hold exactly the slice.  Validates the triple
 * (dtypes, shapes, bits / group against config.json) with messages naming
 * the tensor and the fix.  Dry run (m->dry_run): validate only.  *bytes =
 * bytes held (words + scales + biases).
 */
enum tp_status tp_mlx_load_mat(tp_model_t *m, const struct tp_tsrc_tensor *t, int64_t rows_full, int64_t cols_full,
                               int64_t r0, int64_t r1, int64_t c0, int64_t c1, struct tp_wmat *w, uint64_t *bytes);

#endif /* TP_MODEL_MLX_IMPL_H */

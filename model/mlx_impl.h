/*
 * model/mlx_impl.h - private: MLX quantized safetensors (mlx-community
 * layout) for the loader and the tensor source.
 *
 * An MLX-quantized linear layer X is three tensors: X.weight uint32
 * [out, in * bits / 32] (packed q, element j of a word at bits
 * [j * bits, (j + 1) * bits)), X.scales and X.biases [out, in / group] in
 * F16 or BF16; w = scales * q + biases per group (kernels_mlx_impl.h).
 * config.json says {"quantization": {"group_size": G, "bits": B, and
 * optionally "model.layers.N.mlp.down_proj": {"group_size", "bits"} or false
 * per module}} (mlx-lm also copies it to "quantization_config").  Bits and
 * group of every tensor are deduced from its shapes (the loader knows `in`)
 * and checked against that block.
 */
#ifndef TP_MODEL_MLX_IMPL_H
#define TP_MODEL_MLX_IMPL_H

#include <stdint.h>

#include "model/model_impl.h"
#include "model/tsrc_impl.h"

/* One per-module entry of the quantization block. */
struct tp_mlx_override {
    char module[128]; /* HF module path, e.g. "model.layers.0.mlp.down_proj" */
    int bits, group;  /* bits 0: the module is not quantized (false) */
};

/* The quantization block of an MLX config.json. */
struct tp_mlx_quant {
    int bits, group;               /* defaults */
    int n_over;
    struct tp_mlx_override *over;  /* (n_over) owned */
};

/* Read DIR/config.json's "quantization" (else "quantization_config" when it
 * carries bits and group_size and no foreign quant_method).  *out = NULL
 * (TP_OK) when there is none; free with tp_mlx_quant_free. */
enum tp_status tp_mlx_read_quant(const char *dir, struct tp_mlx_quant **out, struct tp_error *err);
void tp_mlx_quant_free(struct tp_mlx_quant *q); /* NULL safe */

/* Tensor source hook (tsrc.c): a U32 tensor w with a sibling ".scales" is
 * described as the MLX type its shapes give (bits tried in the order
 * s->mlx_bits, then 4, then 8), with ne[0] the unpacked row length.  Left
 * as is (type TP_WTYPE_COUNT) when nothing fits; the loader then explains. */
void tp_mlx_tsrc_describe(const struct tp_tsrc *s, const struct tp_st_tensor *w, struct tp_tsrc_tensor *out);

/*
 * Load rows [r0, r1) x columns [c0, c1) of the MLX-quantized matrix t (full
 * shape rows_full x cols_full in ggml terms) into w: zero-copy pointers into
 * the mappings when the whole matrix is kept, else pread of exactly this
 * rank's byte ranges of the words, scales and biases into one owned buffer
 * each (columns on group boundaries: no repacking).  Validates the triple
 * (dtypes, shapes, bits / group against config.json) with messages naming
 * the tensor and the fix.  Dry run (m->dry_run): validate only.  *bytes =
 * bytes held (words + scales + biases).
 */
enum tp_status tp_mlx_load_mat(tp_model_t *m, const struct tp_tsrc_tensor *t, int64_t rows_full, int64_t cols_full,
                               int64_t r0, int64_t r1, int64_t c0, int64_t c1, struct tp_wmat *w, uint64_t *bytes);

#endif /* TP_MODEL_MLX_IMPL_H */

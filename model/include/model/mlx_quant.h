/*
 * model/include/model/mlx_quant.h - MLX quantized safetensors (mlx-community layout):
 * the quantization block, its GGUF shard-file keys and the tensor-source hook.
 *
 * An MLX-quantized linear layer X is three tensors: X.weight uint32
 * [out, in * bits / 32] (packed q, element j of a word at bits
 * [j * bits, (j + 1) * bits)), X.scales and X.biases [out, in / group] in
 * F16 or BF16; w = scales * q + biases per group (model/kernels/kernels_mlx_impl.h).
 * config.json says {"quantization": {"group_size": G, "bits": B, and
 * optionally "model.layers.N.mlp.down_proj": {"group_size", "bits"} or false
 * per module}} (mlx-lm also copies it to "quantization_config").  Bits and
 * group of every tensor are deduced from its shapes (the loader knows `in`)
 * and checked against that block.
 */
#ifndef TP_MODEL_MLX_QUANT_H
#define TP_MODEL_MLX_QUANT_H

#include <stdint.h>

#include "model/gguf.h"
#include "model/tensor_source.h"

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

/*
 * MLX matrices in a tpserve GGUF shard file (`tpserve shard` of an MLX
 * directory, parallel/shard_hf.c): GGUF has no MLX type ids (the reader
 * refuses 64..67 as file types), so a triple is stored as three GGUF-legal
 * tensors: "X.weight" I32 [words, rows] (the uint32 words, bit for bit),
 * "X.scales" and "X.biases" F16 or BF16 [groups, rows].  Keys: the default
 * bits and group size, and "MODULE:BITS:GROUP" strings (MODULE the GGUF name
 * without ".weight") for tensors that differ; the loader checks every triple
 * against them as it checks a directory's against config.json.
 */
#define TP_MLX_KEY_BITS "tpserve.mlx.bits"
#define TP_MLX_KEY_GROUP "tpserve.mlx.group_size"
#define TP_MLX_KEY_OVERRIDES "tpserve.mlx.overrides"

/* The quantization block of a GGUF shard file's tpserve.mlx.* keys; *out =
 * NULL (TP_OK) when it has none.  Free with tp_mlx_quant_free. */
enum tp_status tp_mlx_read_quant_gguf(tp_gguf_t *g, struct tp_mlx_quant **out, struct tp_error *err);

/* The sibling "BASE.<suffix>" of HF tensor "BASE.weight" (name receives it), or NULL. */
const struct tp_st_tensor *tp_mlx_st_sibling(tp_st_t *st, const char *w_name, const char *suffix, char *name,
                                             size_t cap);

/* Tensor source hook (tsrc.c): a U32 tensor w with a sibling ".scales" is
 * described as the MLX type its shapes give (bits tried in the order
 * s->mlx_bits, then 4, then 8), with ne[0] the unpacked row length.  Left
 * as is (type TP_WTYPE_COUNT) when nothing fits; the loader then explains. */
void tp_mlx_tsrc_describe(const struct tp_tsrc *s, const struct tp_st_tensor *w, struct tp_tsrc_tensor *out);
/* The same for a GGUF shard file: an I32 2-D "X.weight" in a file with the
 * tpserve.mlx.* keys (s->mlx_bits) or beside "X.scales" sets out->mlx_packed
 * and, with a sibling "X.scales" whose shapes fit, the MLX type. */
void tp_mlx_tsrc_describe_gguf(const struct tp_tsrc *s, const struct tp_gguf_tensor *w, struct tp_tsrc_tensor *out);

#endif /* TP_MODEL_MLX_QUANT_H */

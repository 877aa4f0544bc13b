/*
 * model/synth/synth_impl.h - private to synth*.c: the tensor plan and value
 * generator every synthetic layout shares (GGUF, Hugging Face directory: the
 * same seed gives the same values in each).  The tokenizer vocabulary a
 * synthetic model embeds is in model/synth_vocab.h.
 */
#ifndef TP_MODEL_SYNTH_IMPL_H
#define TP_MODEL_SYNTH_IMPL_H

#include <stdint.h>

#include "model/synth.h"
#include "model/synth_vocab.h"

/* One tensor of a synthetic model: GGUF name, type, ggml dims (ne[0] = row
 * length), and how its values are drawn. */
enum tp_synth_fill { TP_SYNTH_FILL_WEIGHT, TP_SYNTH_FILL_NORM, TP_SYNTH_FILL_ROPE_FREQS };
struct tp_synth_tensor {
    char name[64];
    enum tp_wtype type;
    int n_dims;
    int64_t ne[3];       /* ne[2]: stacked matrices (experts), 1 otherwise */
    enum tp_synth_fill fill;
};
/* The tensor list of the model in GGUF order; p needs room for 24 per layer + 8.
 * Rows of a tensor: ne[1] * ne[2] of ne[0] values (tp_synth_fill_row's row index). 
 * Returns the count. */
int tp_synth_plan(const struct tp_shape *s, int n_layer, enum tp_wtype wt, enum tp_synth_mix mix,
                  struct tp_synth_tensor *p);
/* Per-tensor generator seed for (model seed, GGUF tensor name). */
uint64_t tp_synth_tensor_seed(uint64_t seed, const char *name);
/* The f32 values of row `row` of tensor t (t->ne[0] of them) into x: a pure
 * function of (tensor_seed, row), so any writer and thread count agrees. */
void tp_synth_fill_row(const struct tp_shape *shape, const struct tp_synth_tensor *t, uint64_t tensor_seed, int64_t row,
                       float *x);

#endif /* TP_MODEL_SYNTH_IMPL_H */

/*
 * model/forward/wtype.c - the weight-type table: GGUF ggml_type ids, their names,
 * block geometry (elements and bytes per block) and whether this build can
 * compute with them (the kernels in kernels*.c).  Sizes follow ggml exactly,
 * because GGUF tensor extents are computed from them.  The MLX affine types
 * (ids 64..67, outside GGUF's numbering) come from safetensors directories.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "model/model.h"

struct wtype_info {
    const char *name;
    int64_t block_elems;
    size_t block_bytes;
    int supported;
};

/* Indexed by ggml_type id; entries with name == NULL are unknown ids. */
static const struct wtype_info wtypes[TP_WTYPE_COUNT] = {
    [TP_WTYPE_F32] = {"f32", 1, 4, 1},
    [TP_WTYPE_F16] = {"f16", 1, 2, 1},
    [TP_WTYPE_Q4_0] = {"q4_0", 32, 18, 1},
    [TP_WTYPE_Q4_1] = {"q4_1", 32, 20, 0},
    [TP_WTYPE_Q5_0] = {"q5_0", 32, 22, 0},
    [TP_WTYPE_Q5_1] = {"q5_1", 32, 24, 0},
    [TP_WTYPE_Q8_0] = {"q8_0", 32, 34, 1},
    [TP_WTYPE_Q8_1] = {"q8_1", 32, 36, 0},
    [TP_WTYPE_Q2_K] = {"q2_k", 256, 84, 0},
    [TP_WTYPE_Q3_K] = {"q3_k", 256, 110, 0},
    [TP_WTYPE_Q4_K] = {"q4_k", 256, 144, 1},
    [TP_WTYPE_Q5_K] = {"q5_k", 256, 176, 1},
    [TP_WTYPE_Q6_K] = {"q6_k", 256, 210, 1},
    [TP_WTYPE_Q8_K] = {"q8_k", 256, 292, 0},
    [TP_WTYPE_I8] = {"i8", 1, 1, 0},
    [TP_WTYPE_I16] = {"i16", 1, 2, 0},
    [TP_WTYPE_I32] = {"i32", 1, 4, 0},
    [TP_WTYPE_I64] = {"i64", 1, 8, 0},
    [TP_WTYPE_F64] = {"f64", 1, 8, 0},
    [TP_WTYPE_BF16] = {"bf16", 1, 2, 1},
    [TP_WTYPE_MXFP4] = {"mxfp4", 32, 17, 1},
    /* MLX affine: a block is one group; bytes = its packed words (scale and bias live beside) */
    [TP_WTYPE_MLX_Q4_G32] = {"mlx_q4_g32", 32, 16, 1},
    [TP_WTYPE_MLX_Q4_G64] = {"mlx_q4_g64", 64, 32, 1},
    [TP_WTYPE_MLX_Q8_G32] = {"mlx_q8_g32", 32, 32, 1},
    [TP_WTYPE_MLX_Q8_G64] = {"mlx_q8_g64", 64, 64, 1},
};

static const struct wtype_info *info(enum tp_wtype t)
{
    if ((int)t < 0 || (int)t >= TP_WTYPE_COUNT || !wtypes[t].name) return NULL;
    return &wtypes[t];
}

const char *tp_wtype_name(enum tp_wtype t)
{
    static const char *const unknown[TP_WTYPE_GGUF_END + 1] = {
        "type#0",  "type#1",  "type#2",  "type#3",  "type#4",  "type#5",  "type#6",  "type#7",  "type#8",
        "type#9",  "type#10", "type#11", "type#12", "type#13", "type#14", "type#15", "type#16", "type#17",
        "type#18", "type#19", "type#20", "type#21", "type#22", "type#23", "type#24", "type#25", "type#26",
        "type#27", "type#28", "type#29", "type#30", "type#31", "type#32", "type#33", "type#34", "type#35",
        "type#36", "type#37", "type#38", "type#39", "type#unknown"};
    const struct wtype_info *i = info(t);
    if (i) return i->name;
    if ((int)t >= 0 && (int)t < TP_WTYPE_GGUF_END) return unknown[t];
    return unknown[TP_WTYPE_GGUF_END];
}

enum tp_status tp_wtype_parse(const char *s, enum tp_wtype *out)
{
    if (!s || !out) return TP_ERR_INVALID_ARG;
    for (int t = 0; t < TP_WTYPE_COUNT; t++) {
        if (wtypes[t].name && strcasecmp(s, wtypes[t].name) == 0) {
            *out = (enum tp_wtype)t;
            return TP_OK;
        }
    }
    return TP_ERR_INVALID_ARG;
}

int tp_wtype_supported(enum tp_wtype t)
{
    const struct wtype_info *i = info(t);
    if (!i) return 0;
    return i->supported;
}

int64_t tp_wtype_block_elems(enum tp_wtype t)
{
    const struct wtype_info *i = info(t);
    return i ? i->block_elems : 0;
}

size_t tp_wtype_block_bytes(enum tp_wtype t)
{
    const struct wtype_info *i = info(t);
    return i ? i->block_bytes : 0;
}

int tp_wtype_mlx_bits(enum tp_wtype t)
{
    switch (t) {
    case TP_WTYPE_MLX_Q4_G32:
    case TP_WTYPE_MLX_Q4_G64: return 4;
    case TP_WTYPE_MLX_Q8_G32:
    case TP_WTYPE_MLX_Q8_G64: return 8;
    default: return 0;
    }
}

int tp_wtype_mlx_group(enum tp_wtype t) { return tp_wtype_mlx_bits(t) ? (int)tp_wtype_block_elems(t) : 0; }

enum tp_wtype tp_wtype_mlx(int bits, int group)
{
    if (group != 32 && group != 64) return TP_WTYPE_COUNT;
    if (bits == 4) return group == 32 ? TP_WTYPE_MLX_Q4_G32 : TP_WTYPE_MLX_Q4_G64;
    if (bits == 8) return group == 32 ? TP_WTYPE_MLX_Q8_G32 : TP_WTYPE_MLX_Q8_G64;
    return TP_WTYPE_COUNT;
}

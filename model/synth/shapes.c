/*
 * model/synth/shapes.c - model shapes as data: parse and validate the
 * configs/shapes.json list (built into the library at compile time by
 * cmake/tp_embed.cmake), look a shape up by name, count its parameters.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/json_field.h"
#include "model/synth.h"

extern const char tp_shapes_json_text[];

const char *tp_shapes_builtin_json(void) { return tp_shapes_json_text; }

static int get_int(const cJSON *o, const char *k, int def, int *ok)
{
    int v = def;
    enum tp_status st = tp_json_field_int(o, k, INT_MIN, INT_MAX, &v);
    if (st != TP_OK && st != TP_ERR_NOT_FOUND) *ok = 0;
    return v;
}

static float get_float(const cJSON *o, const char *k, float def, int *ok)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) return def;
    if (!cJSON_IsNumber(v)) {
        *ok = 0;
        return def;
    }
    return (float)v->valuedouble;
}

static int get_bool(const cJSON *o, const char *k, int *ok)
{
    int v = 0;
    enum tp_status st = tp_json_field_bool(o, k, &v);
    if (st != TP_OK && st != TP_ERR_NOT_FOUND) *ok = 0;
    return v;
}

static enum tp_status parse_one(const cJSON *o, int idx, struct tp_shape *s, struct tp_error *err)
{
    memset(s, 0, sizeof(*s));
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) >= sizeof(s->name))
        return tp_error_set(err, TP_ERR_FORMAT, "shapes: entry %d: missing or bad \"name\"", idx);
    snprintf(s->name, sizeof(s->name), "%s", name->valuestring);
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(o, "source");
    if (cJSON_IsString(src)) snprintf(s->source, sizeof(s->source), "%s", src->valuestring);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(o, "arch");
    if (!cJSON_IsString(arch)) return tp_error_set(err, TP_ERR_FORMAT, "shapes: %s: missing \"arch\"", s->name);
    if (strcmp(arch->valuestring, "llama") == 0) s->arch = TP_ARCH_LLAMA;
    else if (strcmp(arch->valuestring, "qwen2") == 0) s->arch = TP_ARCH_QWEN2;
    else if (strcmp(arch->valuestring, "qwen3") == 0) s->arch = TP_ARCH_QWEN3;
    else if (strcmp(arch->valuestring, "qwen3moe") == 0) s->arch = TP_ARCH_QWEN3MOE;
    else if (strcmp(arch->valuestring, "qwen2moe") == 0) s->arch = TP_ARCH_QWEN2MOE;
    else if (strcmp(arch->valuestring, "gpt-oss") == 0) s->arch = TP_ARCH_GPTOSS;
    else
        return tp_error_set(err, TP_ERR_FORMAT,
                            "shapes: %s: arch \"%s\" unknown (llama, qwen2, qwen3, qwen2moe, qwen3moe, gpt-oss)", s->name,
                            arch->valuestring);
    int ok = 1;
    s->n_embd = get_int(o, "n_embd", 0, &ok);
    s->n_layer = get_int(o, "n_layer", 0, &ok);
    s->n_head = get_int(o, "n_head", 0, &ok);
    s->n_head_kv = get_int(o, "n_head_kv", s->n_head, &ok);
    s->head_dim = get_int(o, "head_dim", s->n_head > 0 ? s->n_embd / s->n_head : 0, &ok);
    s->n_ff = get_int(o, "n_ff", 0, &ok);
    s->n_vocab = get_int(o, "n_vocab", 0, &ok);
    s->n_ctx = get_int(o, "n_ctx", 0, &ok);
    s->rope_theta = get_float(o, "rope_theta", 10000.0f, &ok);
    s->norm_eps = get_float(o, "norm_eps", 1e-5f, &ok);
    s->tied = get_bool(o, "tied", &ok);
    s->qkv_bias = get_bool(o, "qkv_bias", &ok);
    s->qk_norm = get_bool(o, "qk_norm", &ok);
    s->n_expert = get_int(o, "n_expert", 0, &ok);
    s->n_expert_used = get_int(o, "n_expert_used", 0, &ok);
    s->n_ff_exp = get_int(o, "n_ff_exp", 0, &ok);
    s->n_ff_shexp = get_int(o, "n_ff_shexp", 0, &ok);
    s->sliding_window = get_int(o, "sliding_window", 0, &ok);
    if (!ok) return tp_error_set(err, TP_ERR_FORMAT, "shapes: %s: a field has the wrong JSON type", s->name);
    const cJSON *pool = cJSON_GetObjectItemCaseSensitive(o, "pooling");
    s->pooling_type = 0;
    if (pool) {
        static const char *const names[] = {"mean", "cls", "last"};
        for (int i = 0; i < 3 && cJSON_IsString(pool); i++)
            if (strcmp(pool->valuestring, names[i]) == 0) s->pooling_type = i + 1;
        if (!s->pooling_type)
            return tp_error_set(err, TP_ERR_FORMAT, "shapes: %s: pooling must be \"mean\", \"cls\" or \"last\"",
                                s->name);
    }
    s->rope_scaling = TP_ROPE_SCALING_NONE;
    s->rope_factor = 1.0f;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (rs) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (!cJSON_IsString(t)) return tp_error_set(err, TP_ERR_FORMAT, "shapes: %s: rope_scaling.type missing", s->name);
        if (strcmp(t->valuestring, "llama3") == 0) s->rope_scaling = TP_ROPE_SCALING_LLAMA3;
        else if (strcmp(t->valuestring, "linear") == 0) s->rope_scaling = TP_ROPE_SCALING_LINEAR;
        else if (strcmp(t->valuestring, "yarn") == 0) s->rope_scaling = TP_ROPE_SCALING_YARN;
        else
            return tp_error_set(err, TP_ERR_FORMAT, "shapes: %s: rope_scaling.type \"%s\" unknown (llama3, linear, yarn)",
                                s->name, t->valuestring);
        s->rope_factor = get_float(rs, "factor", 1.0f, &ok);
        s->rope_low_freq_factor = get_float(rs, "low_freq_factor", 1.0f, &ok);
        s->rope_high_freq_factor = get_float(rs, "high_freq_factor", 4.0f, &ok);
        s->rope_orig_ctx = get_int(rs, "original_context_length", 8192, &ok);
        if (!ok || !(s->rope_factor > 0.0f) || !(s->rope_high_freq_factor > s->rope_low_freq_factor) ||
            s->rope_orig_ctx <= 0)
            return tp_error_set(err, TP_ERR_FORMAT, "shapes: %s: bad rope_scaling values", s->name);
    }
    const char *bad = NULL;
    if (s->n_embd <= 0) bad = "n_embd must be > 0";
    else if (s->n_layer <= 0) bad = "n_layer must be > 0";
    else if (s->n_head <= 0 || s->n_head_kv <= 0 || s->n_head % s->n_head_kv) bad = "n_head must be a multiple of n_head_kv > 0";
    else if (s->head_dim <= 0 || s->head_dim % 2) bad = "head_dim must be even and > 0";
    else if (s->n_ff <= 0) bad = "n_ff must be > 0";
    else if (s->n_vocab <= 0) bad = "n_vocab must be > 0";
    else if (s->n_ctx <= 0) bad = "n_ctx must be > 0";
    else if (!(s->rope_theta > 0.0f)) bad = "rope_theta must be > 0";
    else if (!(s->norm_eps > 0.0f)) bad = "norm_eps must be > 0";
    else if (s->arch != TP_ARCH_QWEN2 && s->arch != TP_ARCH_QWEN2MOE && s->arch != TP_ARCH_GPTOSS && s->qkv_bias)
        bad = "qkv_bias is a qwen2 / gpt-oss feature";
    else if (s->arch == TP_ARCH_GPTOSS && (!s->qkv_bias || s->n_expert <= 0))
        bad = "gpt-oss needs qkv_bias and n_expert";
    else if (s->arch == TP_ARCH_QWEN2MOE && (!s->qkv_bias || s->n_expert <= 0 || s->n_ff_shexp <= 0))
        bad = "qwen2moe needs qkv_bias, n_expert and n_ff_shexp";
    else if (s->arch != TP_ARCH_QWEN2MOE && s->n_ff_shexp) bad = "n_ff_shexp is a qwen2moe feature";
    else if (s->sliding_window < 0) bad = "sliding_window must be >= 0";
    else if (s->sliding_window > 0 && s->arch != TP_ARCH_LLAMA && s->arch != TP_ARCH_GPTOSS)
        bad = "sliding_window is a llama (Mistral v0.1) / gpt-oss feature";
    else if (s->arch != TP_ARCH_QWEN3 && s->arch != TP_ARCH_QWEN3MOE && s->qk_norm) bad = "qk_norm is a qwen3 feature";
    else if (s->arch == TP_ARCH_QWEN3MOE && (!s->qk_norm || s->n_expert <= 0)) bad = "qwen3moe needs qk_norm and n_expert";
    else if (s->arch == TP_ARCH_QWEN2 && s->n_expert) bad = "qwen2 has no experts (use arch qwen2moe)";
    else if (s->n_expert < 0 || s->n_ff_exp < 0 || (s->n_expert > 0 && (s->n_expert_used < 1 || s->n_expert_used > s->n_expert)))
        bad = "n_expert_used must be in [1, n_expert]";
    else if (s->n_expert == 0 && (s->n_expert_used || s->n_ff_exp)) bad = "n_expert_used / n_ff_exp without n_expert";
    if (bad) return tp_error_set(err, TP_ERR_FORMAT, "shapes: %s: %s", s->name, bad);
    return TP_OK;
}

enum tp_status tp_shapes_parse(const char *json, struct tp_shape **out, int *n, struct tp_error *err)
{
    if (!out || !n) return TP_ERR_INVALID_ARG;
    *out = NULL;
    *n = 0;
    if (!json) return tp_error_set(err, TP_ERR_INVALID_ARG, "shapes: no JSON text");
    enum tp_status rc = TP_OK;
    struct tp_shape *arr = NULL;
    cJSON *root = cJSON_Parse(json);
    if (!root) return tp_error_set(err, TP_ERR_FORMAT, "shapes: not valid JSON");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "shapes");
    int cnt = cJSON_GetArraySize(list);
    if (!cJSON_IsArray(list) || cnt <= 0) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "shapes: want {\"shapes\": [ ... ]} with at least one entry");
        goto out;
    }
    arr = calloc((size_t)cnt, sizeof(*arr));
    if (!arr) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "shapes: out of memory");
        goto out;
    }
    int i = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, list)
    {
        TP_CHECK_GOTO(parse_one(o, i, &arr[i], err), rc, out);
        for (int j = 0; j < i; j++)
            if (strcmp(arr[j].name, arr[i].name) == 0) {
                rc = tp_error_set(err, TP_ERR_FORMAT, "shapes: duplicate name %s", arr[i].name);
                goto out;
            }
        i++;
    }
    *out = arr;
    *n = cnt;
    arr = NULL;
out:
    free(arr);
    cJSON_Delete(root);
    return rc;
}

enum tp_status tp_shape_find(const char *json, const char *name, struct tp_shape *out, struct tp_error *err)
{
    struct tp_shape *arr = NULL;
    int n = 0;
    if (!name || !out) return TP_ERR_INVALID_ARG;
    enum tp_status rc = tp_shapes_parse(json ? json : tp_shapes_builtin_json(), &arr, &n, err);
    if (rc != TP_OK) return rc;
    for (int i = 0; i < n; i++)
        if (strcmp(arr[i].name, name) == 0) {
            *out = arr[i];
            free(arr);
            return TP_OK;
        }
    char names[TP_ERROR_MSG_MAX];
    size_t off = 0;
    names[0] = 0;
    for (int i = 0; i < n && off + 2 < sizeof(names); i++) {
        int w = snprintf(names + off, sizeof(names) - off, "%s%s", i ? ", " : "", arr[i].name);
        if (w < 0) break;
        off += (size_t)w;
    }
    free(arr);
    return tp_error_set(err, TP_ERR_NOT_FOUND, "unknown shape '%s' (known: %s)", name, names);
}

int tp_shape_ff_width(const struct tp_shape *s) { return s->n_expert > 0 && s->n_ff_exp > 0 ? s->n_ff_exp : s->n_ff; }

uint64_t tp_shape_n_params(const struct tp_shape *s)
{
    uint64_t e = (uint64_t)s->n_embd, q = (uint64_t)s->n_head * (uint64_t)s->head_dim,
             kv = (uint64_t)s->n_head_kv * (uint64_t)s->head_dim, ff = (uint64_t)tp_shape_ff_width(s);
    uint64_t layer = e * q * 2 + e * kv * 2 + 3 * e * ff + 2 * e;
    if (s->n_expert > 0)
        layer = e * q * 2 + e * kv * 2 + (uint64_t)s->n_expert * (3 * e * ff + e) + 2 * e +
                (s->n_ff_shexp > 0 ? 3 * e * (uint64_t)s->n_ff_shexp + e : 0);
    if (s->qkv_bias) layer += q + 2 * kv;
    if (s->arch == TP_ARCH_GPTOSS) /* attn_output bias, sinks, router bias, expert biases */
        layer += e + (uint64_t)s->n_head + (uint64_t)s->n_expert * (1 + 2 * ff + e);
    if (s->qk_norm) layer += 2 * (uint64_t)s->head_dim;
    uint64_t total = layer * (uint64_t)s->n_layer + (uint64_t)s->n_vocab * e * (s->tied ? 1 : 2) + e;
    return total;
}

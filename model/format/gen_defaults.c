/*
 * model/format/gen_defaults.c - the generation defaults a model file
 * recommends: a GGUF's general.sampling.* keys (written by llama.cpp's
 * converter from the checkpoint's generation_config.json), or a Hugging Face
 * directory's generation_config.json itself.  The server applies them to
 * requests that leave a sampling field out, below its command-line flags.
 *
 * generation_config.json fields read: temperature, top_p, top_k, min_p,
 * repetition_penalty, max_new_tokens, eos_token_id (an id or a list), and
 * do_sample: false, with which transformers decodes greedily whatever the
 * temperature says (read as temperature 0).  A value out of range is an
 * error naming the file and the field; unknown fields are ignored.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/tensor_source.h"

#define MAX_GEN_CONFIG_BYTES ((size_t)1 << 20)

/* A number field in [lo, hi] (lo_open: lo itself excluded) into *out; sets bit in d->set. */
static enum tp_status get_num(const cJSON *root, const char *path, const char *key, double lo, int lo_open, double hi,
                              unsigned bit, double *out, struct tp_model_gen_defaults *d, struct tp_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return TP_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || (lo_open && v->valuedouble == lo) ||
        v->valuedouble > hi)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: \"%s\" must be a number %s %g and %g", path, key,
                            lo_open ? "above" : "from", lo, hi);
    *out = v->valuedouble;
    d->set |= bit;
    return TP_OK;
}

static enum tp_status read_hf(const char *dir, struct tp_model_gen_defaults *d, struct tp_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    char *text = NULL;
    enum tp_status rc = tp_read_file(path, MAX_GEN_CONFIG_BYTES, &text, NULL, err);
    if (rc == TP_ERR_NOT_FOUND) {
        tp_error_clear(err);
        return TP_OK;
    }
    if (rc != TP_OK) return rc;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tp_error_set(err, TP_ERR_FORMAT, "%s: not a JSON object", path);
    }
    double t = 0, p = 0, k = 0, mp = 0, rp = 0, mn = 0;
    if ((rc = get_num(root, path, "temperature", 0, 0, 100, TP_MODEL_GEN_TEMPERATURE, &t, d, err)) ||
        (rc = get_num(root, path, "top_p", 0, 1, 1, TP_MODEL_GEN_TOP_P, &p, d, err)) ||
        (rc = get_num(root, path, "top_k", 0, 0, 1e9, TP_MODEL_GEN_TOP_K, &k, d, err)) ||
        (rc = get_num(root, path, "min_p", 0, 0, 1, TP_MODEL_GEN_MIN_P, &mp, d, err)) ||
        (rc = get_num(root, path, "repetition_penalty", 0, 1, 10, TP_MODEL_GEN_REPEAT_PENALTY, &rp, d, err)) ||
        (rc = get_num(root, path, "max_new_tokens", 1, 0, 1 << 30, TP_MODEL_GEN_MAX_NEW_TOKENS, &mn, d, err)))
        goto out;
    d->temperature = (float)t;
    d->top_p = (float)p;
    d->top_k = (int)k;
    d->min_p = (float)mp;
    d->repeat_penalty = (float)rp;
    d->max_new_tokens = (int)mn;
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
    if (cJSON_IsFalse(ds)) { /* transformers: greedy, whatever the temperature says */
        d->temperature = 0.0f;
        d->set |= TP_MODEL_GEN_TEMPERATURE;
    }
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    const cJSON *one = cJSON_IsNumber(eos) ? eos : NULL;
    const cJSON *it = cJSON_IsArray(eos) ? eos->child : one;
    for (; it; it = one ? NULL : it->next) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e9 ||
            it->valuedouble != floor(it->valuedouble)) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "%s: \"eos_token_id\" must be a token id or a list of them", path);
            goto out;
        }
        if (d->n_eos < TP_MODEL_GEN_MAX_EOS) d->eos_ids[d->n_eos++] = (int32_t)it->valuedouble;
    }
    snprintf(d->source, sizeof d->source, "generation_config.json");
out:
    cJSON_Delete(root);
    return rc;
}

/* general.sampling.KEY as a double into *out (bit set) when present and in [lo, hi]. */
static enum tp_status gguf_num(tp_gguf_t *g, const char *path, const char *key, double lo, int lo_open, double hi,
                               unsigned bit, double *out, struct tp_model_gen_defaults *d, struct tp_error *err)
{
    double v = 0;
    enum tp_status rc = tp_gguf_get_float(g, key, &v); /* integer types too */
    if (rc == TP_ERR_NOT_FOUND) return TP_OK;
    if (rc != TP_OK || !isfinite(v) || v < lo || (lo_open && v == lo) || v > hi)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: %s must be a number %s %g and %g", path, key,
                            lo_open ? "above" : "from", lo, hi);
    *out = v;
    d->set |= bit;
    return TP_OK;
}

static enum tp_status read_gguf(const char *path, struct tp_model_gen_defaults *d, struct tp_error *err)
{
    tp_gguf_t *g = NULL;
    enum tp_status rc = tp_gguf_open(path, &g, err);
    if (rc != TP_OK) return rc;
    double t = 0, p = 0, k = 0, mp = 0, rp = 0;
    if (!(rc = gguf_num(g, path, "general.sampling.temp", 0, 0, 100, TP_MODEL_GEN_TEMPERATURE, &t, d, err)) &&
        !(rc = gguf_num(g, path, "general.sampling.top_p", 0, 1, 1, TP_MODEL_GEN_TOP_P, &p, d, err)) &&
        !(rc = gguf_num(g, path, "general.sampling.top_k", -1, 0, 1e9, TP_MODEL_GEN_TOP_K, &k, d, err)) &&
        !(rc = gguf_num(g, path, "general.sampling.min_p", 0, 0, 1, TP_MODEL_GEN_MIN_P, &mp, d, err)) &&
        !(rc = gguf_num(g, path, "general.sampling.penalty_repeat", 0, 1, 10, TP_MODEL_GEN_REPEAT_PENALTY, &rp, d,
                        err))) {
        d->temperature = (float)t;
        d->top_p = (float)p;
        d->top_k = k < 0 ? 0 : (int)k; /* llama.cpp writes -1 or 0 for "off" */
        d->min_p = (float)mp;
        d->repeat_penalty = (float)rp;
        if (d->set) snprintf(d->source, sizeof d->source, "gguf general.sampling");
    }
    tp_gguf_close(g);
    return rc;
}

enum tp_status tp_model_gen_defaults_read(const char *path, struct tp_model_gen_defaults *out, struct tp_error *err)
{
    memset(out, 0, sizeof *out);
    if (!path) return TP_OK;
    return tp_hf_is_dir(path) ? read_hf(path, out, err) : read_gguf(path, out, err);
}

/*
 * model/tokenizer/tokenizer_gguf.c - tokenizer from GGUF metadata (tokenizer.ggml.*),
 * the layout llama.cpp writes:
 *   tokenizer.ggml.model        "llama" (SentencePiece) | "gpt2" (byte-level BPE)
 *   tokenizer.ggml.pre          pre-tokenizer for gpt2: "llama-bpe"/"llama3" ->
 *                               Llama 3, "qwen2" -> Qwen2, "gpt-4o" -> o200k (gpt-oss), "smollm" / "starcoder" /
 *                               "refact" -> digits apart + GPT-2, else GPT-2
 *   tokenizer.ggml.tokens       string[n]
 *   tokenizer.ggml.scores       float[n]   (SentencePiece)
 *   tokenizer.ggml.token_type   int32[n]   (enum tp_token_type)
 *   tokenizer.ggml.merges       string[m]  "left right" (BPE)
 *   tokenizer.ggml.{bos,eos,eot,unknown,padding}_token_id
 *   tokenizer.ggml.fim_{pre,suf,mid,sep,rep}_token_id (fill-in-the-middle)
 *   tokenizer.ggml.add_bos_token / add_eos_token / add_space_prefix
 * tp_tokenizer_from_gguf_handle() builds it from an open reader (the model
 * loader uses it too); tp_tokenizer_from_gguf() opens a file for it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "tokenizer/tokenizer_core_impl.h"

static int get_id(tp_gguf_t *g, const char *key, int n)
{
    int64_t v;
    if (tp_gguf_get_int(g, key, &v) != TP_OK) return -1;
    return v >= 0 && v < n ? (int)v : -1;
}

static int get_flag(tp_gguf_t *g, const char *key, int dflt)
{
    int v;
    return tp_gguf_get_bool(g, key, &v) == TP_OK ? v : dflt;
}

/* The arrays a tp_vocab_desc borrows while it is built from a GGUF file, freed together (gv_free). */
struct gguf_vocab {
    const char **toks, **merges; /* (n), (n_merges + 1): strings inside the file's mapping */
    size_t *tok_lens, *merge_lens;
    float *scores;               /* (n) SentencePiece only */
    int32_t *types;              /* (n) */
};

static void gv_free(struct gguf_vocab *v)
{
    free(v->toks);
    free(v->tok_lens);
    free(v->types);
    free(v->scores);
    free(v->merges);
    free(v->merge_lens);
}

/* tokenizer.ggml.model and .pre: d's kind and pre-tokenizer (an unknown BPE pre-tokenizer: GPT-2's). */
static enum tp_status gguf_kind(tp_gguf_t *g, const char *path, struct tp_vocab_desc *d, struct tp_error *err)
{
    const char *model = NULL, *pre = NULL;
    if (tp_gguf_get_str(g, "tokenizer.ggml.model", &model) != TP_OK)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: tokenizer.ggml.model missing or not a string (file has no tokenizer)",
                            path);
    if (tp_gguf_get_str(g, "tokenizer.ggml.pre", &pre) != TP_OK) pre = "default";
    if (strcmp(model, "llama") == 0) {
        d->kind = TP_TOK_SPM;
        d->pretok = TP_PRETOK_SPM;
        return TP_OK;
    }
    if (strcmp(model, "gpt2") != 0)
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "%s: tokenizer.ggml.model \"%s\" is not supported (supported: llama, gpt2)", path, model);
    d->kind = TP_TOK_BPE;
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "llama-v3") || !strcmp(pre, "smaug-bpe")) {
        d->pretok = TP_PRETOK_LLAMA3;
        d->ignore_merges = 1;
    } else if (!strcmp(pre, "gpt-4o") || !strcmp(pre, "o200k")) {
        d->pretok = TP_PRETOK_O200K;
    } else if (!strcmp(pre, "qwen2")) {
        d->pretok = TP_PRETOK_QWEN2;
    } else if (!strcmp(pre, "smollm") || !strcmp(pre, "starcoder") || !strcmp(pre, "refact")) {
        d->pretok = TP_PRETOK_GPT2_DIGITS;
    } else {
        if (strcmp(pre, "default") != 0 && strcmp(pre, "gpt-2") != 0 && strcmp(pre, "gpt2") != 0)
            tp_log(TP_LOG_WARN, "model", "%s: tokenizer.ggml.pre \"%s\" unknown, using the GPT-2 pre-tokenizer", path,
                   pre);
        d->pretok = TP_PRETOK_GPT2;
    }
    return TP_OK;
}

/* tokenizer.ggml.tokens, .token_type and (SentencePiece) .scores into v and d. */
static enum tp_status gguf_tokens(tp_gguf_t *g, const char *path, struct gguf_vocab *v, struct tp_vocab_desc *d,
                                  struct tp_error *err)
{
    int kt = tp_gguf_find_key(g, "tokenizer.ggml.tokens");
    if (kt < 0 || tp_gguf_arr_type(g, kt) != TP_GGUF_STRING)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: tokenizer.ggml.tokens missing or not a string array", path);
    uint64_t n = tp_gguf_arr_len(g, kt);
    if (n == 0 || n > 16u * 1024 * 1024)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries (want 1..16M)", path,
                            (unsigned long long)n);
    v->toks = malloc(n * sizeof(*v->toks));
    v->tok_lens = malloc(n * sizeof(*v->tok_lens));
    v->types = malloc(n * sizeof(*v->types));
    if (!v->toks || !v->tok_lens || !v->types)
        return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory reading %llu tokens", path, (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        v->toks[i] = tp_gguf_arr_str(g, kt, i, &v->tok_lens[i]);
        if (!v->toks[i])
            return tp_error_set(err, TP_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%llu] unreadable", path,
                                (unsigned long long)i);
    }
    int ktt = tp_gguf_find_key(g, "tokenizer.ggml.token_type");
    if (ktt >= 0) {
        if (tp_gguf_arr_len(g, ktt) != n || tp_gguf_arr_copy_i32(g, ktt, v->types, n) != TP_OK)
            return tp_error_set(err, TP_ERR_FORMAT,
                                "%s: tokenizer.ggml.token_type is not an integer array of %llu entries%s%s", path,
                                (unsigned long long)n, tp_gguf_last_error(g)[0] ? ": " : "", tp_gguf_last_error(g));
    } else {
        for (uint64_t i = 0; i < n; i++) v->types[i] = TP_TOKEN_TYPE_NORMAL;
    }
    int ks = tp_gguf_find_key(g, "tokenizer.ggml.scores");
    if (ks >= 0 && d->kind == TP_TOK_SPM) {
        v->scores = malloc(n * sizeof(*v->scores));
        if (!v->scores) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
        if (tp_gguf_arr_len(g, ks) != n || tp_gguf_arr_copy_f32(g, ks, v->scores, n) != TP_OK)
            return tp_error_set(err, TP_ERR_FORMAT, "%s: tokenizer.ggml.scores is not a float array of %llu entries",
                                path, (unsigned long long)n);
    }
    d->n_tokens = (int)n;
    d->tokens = v->toks;
    d->token_lens = v->tok_lens;
    d->scores = v->scores;
    d->token_types = v->types;
    return TP_OK;
}

/* tokenizer.ggml.merges (when present) into v and d. */
static enum tp_status gguf_merges(tp_gguf_t *g, const char *path, struct gguf_vocab *v, struct tp_vocab_desc *d,
                                  struct tp_error *err)
{
    int km = tp_gguf_find_key(g, "tokenizer.ggml.merges");
    if (km < 0) return TP_OK;
    if (tp_gguf_arr_type(g, km) != TP_GGUF_STRING)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: tokenizer.ggml.merges is not a string array", path);
    uint64_t m = tp_gguf_arr_len(g, km);
    if (m > 64u * 1024 * 1024)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: tokenizer.ggml.merges has %llu entries", path,
                            (unsigned long long)m);
    v->merges = malloc((m + 1) * sizeof(*v->merges));
    v->merge_lens = malloc((m + 1) * sizeof(*v->merge_lens));
    if (!v->merges || !v->merge_lens) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory reading merges", path);
    for (uint64_t i = 0; i < m; i++) {
        v->merges[i] = tp_gguf_arr_str(g, km, i, &v->merge_lens[i]);
        if (!v->merges[i]) v->merges[i] = "", v->merge_lens[i] = 0;
    }
    d->n_merges = (int)m;
    d->merges = v->merges;
    d->merge_lens = v->merge_lens;
    return TP_OK;
}

/* The special ids (bos, eos, eot, unk, pad, fill-in-the-middle) and flags, with llama.cpp's defaults: SPM
 * and Llama 3 add BOS (SPM a prefix space too), other BPE vocabularies only if the file asks. */
static void gguf_specials(tp_gguf_t *g, struct tp_vocab_desc *d)
{
    const int n = d->n_tokens;
    d->bos_id = get_id(g, "tokenizer.ggml.bos_token_id", n);
    d->eos_id = get_id(g, "tokenizer.ggml.eos_token_id", n);
    d->eot_id = get_id(g, "tokenizer.ggml.eot_token_id", n);
    d->unk_id = get_id(g, "tokenizer.ggml.unknown_token_id", n);
    d->pad_id = get_id(g, "tokenizer.ggml.padding_token_id", n);
    static const char *const fim_keys[TP_FIM_COUNT] = {
        "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id",
        "tokenizer.ggml.fim_sep_token_id", "tokenizer.ggml.fim_rep_token_id"};
    for (int i = 0; i < TP_FIM_COUNT; i++) d->fim_ids[i] = get_id(g, fim_keys[i], n) + 1;
    d->add_bos = get_flag(g, "tokenizer.ggml.add_bos_token", d->kind == TP_TOK_SPM || d->pretok == TP_PRETOK_LLAMA3);
    d->add_eos = get_flag(g, "tokenizer.ggml.add_eos_token", 0);
    d->add_space_prefix = d->kind == TP_TOK_SPM ? get_flag(g, "tokenizer.ggml.add_space_prefix", 1) : 0;
    d->byte_fallback = d->kind == TP_TOK_SPM;
    if (d->kind == TP_TOK_SPM && d->unk_id < 0) d->unk_id = d->token_types[0] == TP_TOKEN_TYPE_UNKNOWN ? 0 : -1;
}

enum tp_status tp_tokenizer_from_gguf_handle(tp_gguf_t *g, tp_tokenizer_t **out, struct tp_error *err)
{
    const char *path = tp_gguf_path(g);
    struct gguf_vocab v = {0};
    struct tp_vocab_desc d;
    memset(&d, 0, sizeof(d));
    *out = NULL;
    enum tp_status rc = gguf_kind(g, path, &d, err);
    if (rc == TP_OK) rc = gguf_tokens(g, path, &v, &d, err);
    if (rc == TP_OK) rc = gguf_merges(g, path, &v, &d, err);
    if (rc == TP_OK && d.kind == TP_TOK_SPM && !v.scores)
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: SentencePiece tokenizer without tokenizer.ggml.scores", path);
    if (rc == TP_OK && d.kind == TP_TOK_BPE && d.n_merges == 0)
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: BPE tokenizer without tokenizer.ggml.merges", path);
    if (rc == TP_OK) {
        gguf_specials(g, &d);
        rc = tp_tokenizer_build(&d, out, err);
        if (rc != TP_OK && err && err->status == rc && strncmp(err->msg, "tokenizer:", 10) == 0) {
            char tmp[TP_ERROR_MSG_MAX];
            memcpy(tmp, err->msg, sizeof(tmp));
            tp_error_force(err, rc, "%.100s: %.400s", path, tmp);
        }
    }
    gv_free(&v);
    return rc;
}

enum tp_status tp_tokenizer_from_gguf(const char *path, tp_tokenizer_t **out, struct tp_error *err)
{
    tp_gguf_t *g = NULL;
    *out = NULL;
    if (!path) return tp_error_set(err, TP_ERR_INVALID_ARG, "tokenizer: no GGUF path given");
    enum tp_status rc = tp_gguf_open(path, &g, err);
    if (rc != TP_OK) return rc;
    rc = tp_tokenizer_from_gguf_handle(g, out, err);
    tp_gguf_close(g);
    return rc;
}

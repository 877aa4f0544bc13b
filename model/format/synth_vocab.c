/*
 * model/format/synth_vocab.c - the vocabulary a synthetic model embeds: either a
 * generated SentencePiece-style vocabulary (so the file is self-contained),
 * or the one of a Hugging Face tokenizer.json (+ its tokenizer_config.json
 * when it sits next to it), converted to GGUF tokenizer.ggml.* terms the way
 * llama.cpp's convert_hf_to_gguf.py does (gpt2 tokens + merges + token types
 * for byte-level BPE; llama tokens + scores for byte-fallback SentencePiece
 * conversions; [PADi] UNUSED tokens up to the model's vocabulary size).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/synth_vocab.h"
#include "tokenizer/tokenizer_impl.h"

void tp_synth_vocab_free(struct tp_synth_vocab *v)
{
    if (!v) return;
    for (int i = 0; v->tokens && i < v->n_tokens; i++) free(v->tokens[i]);
    for (int i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->merges);
    free(v->scores);
    free(v->types);
    free(v->chat_template);
    memset(v, 0, sizeof(*v));
}

static enum tp_status alloc_tokens(struct tp_synth_vocab *v, int n, int with_scores, struct tp_error *err)
{
    v->n_tokens = n;
    v->tokens = calloc((size_t)n, sizeof(char *));
    v->types = calloc((size_t)n, sizeof(int32_t));
    v->scores = with_scores ? calloc((size_t)n, sizeof(float)) : NULL;
    if (!v->tokens || !v->types || (with_scores && !v->scores))
        return tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory for a %d-token vocabulary", n);
    return TP_OK;
}

/* ------------------------------------------------------ generated (SPM) */

enum tp_status tp_synth_vocab_spm(int n, struct tp_synth_vocab *v, struct tp_error *err)
{
    memset(v, 0, sizeof(*v));
    if (n < 300) return tp_error_set(err, TP_ERR_INVALID_ARG, "synth: a generated vocabulary needs >= 300 tokens, shape has %d", n);
    enum tp_status rc = alloc_tokens(v, n, 1, err);
    if (rc != TP_OK) goto fail;
    v->model = "llama";
    v->pre = NULL;
    v->bos = 1;
    v->eos = 2;
    v->unk = 0;
    v->pad = -1;
    v->add_bos = 1;
    v->add_eos = 0;
    int i = 0;
    char buf[64];
    static const char *const specials[3] = {"<unk>", "<s>", "</s>"};
    static const int32_t special_types[3] = {TP_TOKEN_TYPE_UNKNOWN, TP_TOKEN_TYPE_CONTROL, TP_TOKEN_TYPE_CONTROL};
    for (; i < 3; i++) {
        v->tokens[i] = tp_str_dup_n(specials[i], strlen(specials[i]));
        v->types[i] = special_types[i];
    }
    for (int b = 0; b < 256; b++, i++) {
        snprintf(buf, sizeof(buf), "<0x%02X>", b);
        v->tokens[i] = tp_str_dup_n(buf, strlen(buf));
        v->types[i] = TP_TOKEN_TYPE_BYTE;
    }
    /* pieces, highest score first: "▁" (U+2581, SentencePiece's space), the
     * 94 printable ASCII characters, "▁" + each of them, then every
     * lowercase word of length 2, 3, ... alone and with "▁" in front (all
     * their prefixes exist, so SPM merges can build them) */
    static const char sp[] = "\xE2\x96\x81";
    int score = 0;
#define PUSH_PIECE(str, len)                              \
    do {                                                  \
        if (i >= n) goto done;                            \
        v->tokens[i] = tp_str_dup_n((str), (len));             \
        v->types[i] = TP_TOKEN_TYPE_NORMAL;               \
        v->scores[i] = (float)(--score);                  \
        i++;                                              \
    } while (0)
    PUSH_PIECE(sp, 3);
    for (int c = 0x21; c < 0x7F; c++) {
        buf[0] = (char)c;
        PUSH_PIECE(buf, 1);
    }
    for (int c = 0x21; c < 0x7F; c++) {
        memcpy(buf, sp, 3);
        buf[3] = (char)c;
        PUSH_PIECE(buf, 4);
    }
    for (int len = 2; len <= 8; len++) {
        long long count = 1;
        for (int k = 0; k < len; k++) count *= 26;
        for (long long w = 0; w < count; w++) {
            char word[16];
            long long x = w;
            for (int k = len - 1; k >= 0; k--) {
                word[k] = (char)('a' + x % 26);
                x /= 26;
            }
            PUSH_PIECE(word, (size_t)len);
            memcpy(buf, sp, 3);
            memcpy(buf + 3, word, (size_t)len);
            PUSH_PIECE(buf, (size_t)len + 3);
        }
    }
#undef PUSH_PIECE
done:
    for (int k = 0; k < n; k++)
        if (!v->tokens[k]) {
            rc = tp_error_set(err, TP_ERR_NOMEM, "synth: out of memory for the vocabulary");
            goto fail;
        }
    return TP_OK;
fail:
    tp_synth_vocab_free(v);
    return rc;
}

/* ------------------------------------------------------ tokenizer.json */

static char *read_text(const char *path, struct tp_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        tp_error_set(err, TP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len < 0 || len > (1L << 30) || fseek(f, 0, SEEK_SET) != 0) {
        tp_error_set(err, TP_ERR_IO, "%s: cannot read (not a regular file, or over 1 GiB)", path);
        goto out;
    }
    buf = malloc((size_t)len + 1);
    if (!buf) {
        tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
        tp_error_set(err, TP_ERR_IO, "%s: short read", path);
        free(buf);
        buf = NULL;
        goto out;
    }
    buf[len] = 0;
out:
    fclose(f);
    return buf;
}

static int find_token(const struct tp_synth_vocab *v, const char *text)
{
    if (!text) return -1;
    for (int i = 0; i < v->n_tokens; i++)
        if (v->tokens[i] && strcmp(v->tokens[i], text) == 0) return i;
    return -1;
}

/* "bos_token": "<s>" or {"content": "<s>", ...} or null */
static const char *config_token(const cJSON *cfg, const char *key)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(t)) return t->valuestring;
    if (cJSON_IsObject(t)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(t, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static int is_byte_token(const char *s) /* "<0xHH>" */
{
    return strlen(s) == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>';
}

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/*
 * SentencePiece scores for a byte-fallback BPE tokenizer.json: a piece's
 * score is minus the rank of the first merge that produces it (the order
 * the BPE model builds it, which is what the SPM merge loop needs); pieces
 * no merge produces (single characters) get scores below every merge.
 * Piece lookup goes through a small open-addressing hash table.
 */
static enum tp_status spm_scores_from_merges(const char *path, const cJSON *model, struct tp_synth_vocab *v,
                                             struct tp_error *err)
{
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const int nm = cJSON_GetArraySize(merges);
    size_t cap = 1;
    while (cap < (size_t)v->n_tokens * 2) cap <<= 1;
    int32_t *slot = malloc(cap * sizeof(int32_t));
    char *buf = NULL;
    size_t buf_cap = 0;
    if (!slot) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    memset(slot, 0xff, cap * sizeof(int32_t)); /* -1: empty */
    for (int i = 0; i < v->n_tokens; i++) {
        size_t h = (size_t)fnv1a(v->tokens[i], strlen(v->tokens[i])) & (cap - 1);
        while (slot[h] >= 0) h = (h + 1) & (cap - 1);
        slot[h] = i;
    }
    int r = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, merges)
    {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            if (sp) {
                a = it->valuestring;
                la = (size_t)(sp - a);
                b = sp + 1;
                lb = strlen(b);
            }
        } else if (cJSON_IsArray(it) && cJSON_IsString(cJSON_GetArrayItem(it, 0)) && cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        }
        if (a) {
            if (la + lb + 1 > buf_cap) {
                buf_cap = (la + lb + 1) * 2;
                char *nbuf = realloc(buf, buf_cap);
                if (!nbuf) {
                    free(buf);
                    free(slot);
                    return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
                }
                buf = nbuf;
            }
            memcpy(buf, a, la);
            memcpy(buf + la, b, lb);
            buf[la + lb] = 0;
            size_t h = (size_t)fnv1a(buf, la + lb) & (cap - 1);
            for (; slot[h] >= 0; h = (h + 1) & (cap - 1)) {
                int id = slot[h];
                if (strcmp(v->tokens[id], buf) == 0) {
                    if (isnan(v->scores[id])) v->scores[id] = -(float)r;
                    break;
                }
            }
        }
        r++;
    }
    for (int i = 0; i < v->n_tokens; i++)
        if (isnan(v->scores[i])) v->scores[i] = -(float)(nm + i);
    free(buf);
    free(slot);
    return TP_OK;
}

/* The id space of model.vocab and added_tokens: the largest id + 1 (0 after an error). */
static int json_id_space(const char *path, const cJSON *vocab, const cJSON *added, struct tp_error *err)
{
    int max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (1 << 24)) {
            tp_error_set(err, TP_ERR_FORMAT, "%s: vocab entry \"%s\" has a bad id", path, it->string);
            return 0;
        }
        if (it->valueint > max_id) max_id = it->valueint;
    }
    cJSON_ArrayForEach(it, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 24) || !cJSON_IsString(content)) {
            tp_error_set(err, TP_ERR_FORMAT, "%s: an added_tokens entry lacks a valid id/content", path);
            return 0;
        }
        if (id->valueint > max_id) max_id = id->valueint;
    }
    if (max_id < 0) tp_error_set(err, TP_ERR_FORMAT, "%s: empty vocabulary", path);
    return max_id + 1;
}

/* v's n tokens from model.vocab and added_tokens, "[PAD<i>]" for the ids neither names; with spm the
 * byte, unknown and scored types (the scores come from the merges). */
static enum tp_status json_fill_tokens(const char *path, const cJSON *vocab, const cJSON *added, int spm, int n,
                                       struct tp_synth_vocab *v, struct tp_error *err)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        int id = it->valueint;
        if (v->tokens[id]) continue;
        v->tokens[id] = tp_str_dup_n(it->string, strlen(it->string));
        if (!v->tokens[id]) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
        v->types[id] = TP_TOKEN_TYPE_NORMAL;
        if (spm) {
            if (is_byte_token(it->string)) v->types[id] = TP_TOKEN_TYPE_BYTE;
            else if (strcmp(it->string, "<unk>") == 0) v->types[id] = TP_TOKEN_TYPE_UNKNOWN;
            else v->scores[id] = NAN; /* set from the merge ranks */
        }
    }
    cJSON_ArrayForEach(it, added)
    {
        int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        const char *content = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        int special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"));
        free(v->tokens[id]);
        v->tokens[id] = tp_str_dup_n(content, strlen(content));
        if (!v->tokens[id]) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
        v->types[id] = special ? TP_TOKEN_TYPE_CONTROL : TP_TOKEN_TYPE_USER_DEFINED;
        if (spm && strcmp(content, "<unk>") == 0) v->types[id] = TP_TOKEN_TYPE_UNKNOWN;
        if (spm) v->scores[id] = 0.0f;
    }
    for (int i = 0; i < n; i++)
        if (!v->tokens[i]) {
            char pad[32];
            snprintf(pad, sizeof(pad), "[PAD%d]", i);
            v->tokens[i] = tp_str_dup_n(pad, strlen(pad));
            if (!v->tokens[i]) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
            v->types[i] = TP_TOKEN_TYPE_UNUSED;
        }
    return TP_OK;
}

/* Byte-level BPE: v's merges ("a b" strings or ["a", "b"] pairs) and its pre-tokenizer, recognised by
 * its split regex. */
static enum tp_status json_bpe_merges(const char *path, const cJSON *root, const cJSON *model,
                                      struct tp_synth_vocab *v, struct tp_error *err)
{
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    int nm = cJSON_GetArraySize(merges);
    if (!cJSON_IsArray(merges) || nm <= 0)
        return tp_error_set(err, TP_ERR_FORMAT, "%s: byte-level BPE without model.merges", path);
    v->merges = calloc((size_t)nm, sizeof(char *));
    if (!v->merges) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    v->n_merges = nm;
    int k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, merges)
    {
        if (cJSON_IsString(it)) {
            v->merges[k] = tp_str_dup_n(it->valuestring, strlen(it->valuestring));
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) { /* newer ["left", "right"] form */
            const char *a = cJSON_GetArrayItem(it, 0)->valuestring, *b = cJSON_GetArrayItem(it, 1)->valuestring;
            size_t la = strlen(a), lb = strlen(b);
            v->merges[k] = malloc(la + lb + 2);
            if (v->merges[k]) {
                memcpy(v->merges[k], a, la);
                v->merges[k][la] = ' ';
                memcpy(v->merges[k] + la + 1, b, lb + 1);
            }
        } else {
            return tp_error_set(err, TP_ERR_FORMAT, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", path, k);
        }
        if (!v->merges[k]) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
        k++;
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    char *pre_text = pt ? cJSON_PrintUnformatted(pt) : NULL;
    if (pre_text && strstr(pre_text, "p{Lu}")) v->pre = "gpt-4o"; /* o200k (gpt-oss) */
    else if (pre_text && strstr(pre_text, "p{N}{1,3}")) v->pre = "llama-bpe";
    else if (pre_text && strstr(pre_text, "p{N}|")) v->pre = "qwen2";
    else if (pre_text && strstr(pre_text, "\"Digits\"") && strstr(pre_text, "\"individual_digits\":true"))
        v->pre = "smollm"; /* digits split one by one, then GPT-2 */
    else v->pre = "gpt-2"; /* llama.cpp's name for the plain GPT-2 regex */
    if (pre_text) cJSON_free(pre_text);
    return TP_OK;
}

/* bos / eos / unk / pad, add_bos / add_eos and the chat template from the tokenizer_config.json next to
 * path (when readable), else the well-known token names. */
static enum tp_status json_config(const char *path, int spm, struct tp_synth_vocab *v, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    char *cfg_text = NULL;
    cJSON *cfg = NULL;
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    char *cfg_path = malloc(dir + sizeof("tokenizer_config.json"));
    if (!cfg_path) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    memcpy(cfg_path, path, dir);
    memcpy(cfg_path + dir, "tokenizer_config.json", sizeof("tokenizer_config.json"));
    FILE *f = fopen(cfg_path, "rb");
    if (f) {
        fclose(f);
        struct tp_error cerr = {0};
        cfg_text = read_text(cfg_path, &cerr);
        cfg = cfg_text ? cJSON_Parse(cfg_text) : NULL;
        if (!cfg) tp_log(TP_LOG_WARN, "synth", "%s: ignored (unreadable or not JSON)", cfg_path);
    }
    const int llama_bpe = v->pre && strcmp(v->pre, "llama-bpe") == 0;
    if (cfg) {
        v->bos = find_token(v, config_token(cfg, "bos_token"));
        v->eos = find_token(v, config_token(cfg, "eos_token"));
        v->unk = find_token(v, config_token(cfg, "unk_token"));
        v->pad = find_token(v, config_token(cfg, "pad_token"));
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
        v->add_bos = cJSON_IsBool(ab) ? cJSON_IsTrue(ab) : (spm || llama_bpe);
        v->add_eos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token"));
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (cJSON_IsString(ct) && !(v->chat_template = tp_str_dup_n(ct->valuestring, strlen(ct->valuestring))))
            rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    }
    if (!cfg || (v->bos < 0 && v->eos < 0)) { /* well-known names */
        static const char *const bos_names[] = {"<|begin_of_text|>", "<s>"};
        static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", "<|im_end|>"};
        for (size_t i = 0; v->bos < 0 && i < TP_ARRAY_LEN(bos_names); i++) v->bos = find_token(v, bos_names[i]);
        for (size_t i = 0; v->eos < 0 && i < TP_ARRAY_LEN(eos_names); i++) v->eos = find_token(v, eos_names[i]);
        if (!cfg) v->add_bos = v->bos >= 0 && (spm || llama_bpe);
    }
    if (spm && v->unk < 0) v->unk = find_token(v, "<unk>");
    cJSON_Delete(cfg);
    free(cfg_text);
    free(cfg_path);
    return rc;
}

enum tp_status tp_synth_vocab_json(const char *path, int min_tokens, struct tp_synth_vocab *v, struct tp_error *err)
{
    memset(v, 0, sizeof(*v));
    enum tp_status rc = TP_OK;
    char *text = read_text(path, err);
    if (!text) return err ? err->status : TP_ERR_IO;
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: not valid JSON", path);
        goto out;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(model) || !cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE") != 0 ||
        !cJSON_IsObject(vocab)) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: want a BPE tokenizer.json (model.type \"BPE\" with a vocab object)",
                          path);
        goto out;
    }
    const int spm = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const int ids = json_id_space(path, vocab, added, err);
    if (ids == 0) {
        rc = err ? err->status : TP_ERR_FORMAT;
        goto out;
    }
    const int n = TP_MAX(ids, min_tokens); /* at least min_tokens */
    TP_CHECK_GOTO(alloc_tokens(v, n, spm, err), rc, out);
    v->model = spm ? "llama" : "gpt2";
    v->bos = v->eos = v->unk = v->pad = -1;
    TP_CHECK_GOTO(json_fill_tokens(path, vocab, added, spm, n, v, err), rc, out);
    if (spm) TP_CHECK_GOTO(spm_scores_from_merges(path, model, v, err), rc, out);
    else TP_CHECK_GOTO(json_bpe_merges(path, root, model, v, err), rc, out);
    rc = json_config(path, spm, v, err);
out:
    if (rc != TP_OK) tp_synth_vocab_free(v);
    cJSON_Delete(root);
    free(text);
    return rc;
}

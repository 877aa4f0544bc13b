/*
 * model/tokenizer/tokenizer_json.c - tokenizer from a Hugging Face tokenizer.json (+ optional
 * tokenizer_config.json), parsed with cJSON.  model.type "BPE" with either
 *   - a ByteLevel pipeline whose split regex is, verbatim, GPT-2's, Llama 3's, Qwen2's or o200k's
 *     (optionally after Digits(individual_digits), as SmolLM), normalizer null or NFC; or
 *   - a SentencePiece-style pipeline (Metaspace, or Llama 2's Prepend + Replace normalizer), usually
 *     with byte_fallback (Llama 2, Mistral).
 * Anything else is refused by name.  Merges as "left right" or ["left", "right"]; added_tokens become
 * control (special) or user-defined tokens; BOS / EOS from tokenizer_config.json, else from the
 * TemplateProcessing post-processor.  Not handled: the lstrip / rstrip / single_word / normalized
 * flags of added tokens.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_core_impl.h"

static const char RX_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char RX_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char RX_O200K[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RX_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define MAX_JSON_BYTES (512u * 1024 * 1024)

static enum tp_status read_json(const char *path, cJSON **out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    char *buf = NULL;
    FILE *f = fopen(path, "rb");
    *out = NULL;
    if (!f) return tp_error_set(err, TP_ERR_IO, "%s: cannot open (check the path)", path);
    if (fseek(f, 0, SEEK_END) != 0) goto io;
    long sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) goto io;
    if ((unsigned long)sz > MAX_JSON_BYTES) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: %ld bytes is too large for a tokenizer file", path, sz);
        goto out;
    }
    buf = malloc((size_t)sz + 1);
    if (!buf) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory reading %ld bytes", path, sz);
        goto out;
    }
    if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) goto io;
    buf[sz] = 0;
    *out = cJSON_ParseWithLength(buf, (size_t)sz);
    if (!*out) {
        const char *at = cJSON_GetErrorPtr();
        long pos = at && at >= buf && at <= buf + sz ? (long)(at - buf) : -1;
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: not valid JSON (near byte %ld)", path, pos);
    }
    goto out;
io:
    rc = tp_error_set(err, TP_ERR_IO, "%s: read failed", path);
out:
    free(buf);
    fclose(f);
    return rc;
}

/* "text" or {"content": "text"} -> text, else NULL. */
static const char *token_text(const cJSON *v)
{
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static const char *type_of(const cJSON *o)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : "";
}

/* Inspect the pre-tokenizer (recursively through Sequence). */
struct pipe_info {
    int metaspace, byte_level;
    int prepend; /* add_space_prefix mode (see tokenizer_impl.h) */
    const char *regex;
    int byte_level_regex; /* ByteLevel with use_regex: GPT-2 pattern */
    int digits;           /* Digits(individual_digits: true) */
    const char *unknown;  /* first pre-tokenizer type we do not implement */
};

static void scan_pretok(const cJSON *p, struct pipe_info *pi)
{
    if (!cJSON_IsObject(p)) return;
    const char *ty = type_of(p);
    if (!strcmp(ty, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        const cJSON *x;
        cJSON_ArrayForEach(x, arr) scan_pretok(x, pi);
    } else if (!strcmp(ty, "Metaspace")) {
        pi->metaspace = 1;
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(p, "prepend_scheme");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space");
        if (cJSON_IsString(ps))
            pi->prepend = !strcmp(ps->valuestring, "never") ? 0 : !strcmp(ps->valuestring, "first") ? 2 : 3;
        else /* older files: add_prefix_space */
            pi->prepend = (ap ? cJSON_IsTrue(ap) : 1) ? 3 : 0;
    } else if (!strcmp(ty, "ByteLevel")) {
        pi->byte_level = 1;
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        if (!ur || cJSON_IsTrue(ur)) pi->byte_level_regex = 1;
    } else if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        if (cJSON_IsString(rx)) pi->regex = rx->valuestring;
        else if (!pi->unknown) pi->unknown = "Split (non-regex pattern)";
    } else if (!strcmp(ty, "Digits") && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "individual_digits"))) {
        pi->digits = 1;
    } else if (!pi->unknown) {
        pi->unknown = ty[0] ? ty : "(no type)";
    }
}

/* First normalizer we do not implement, or NULL.  Implemented: NFC (Qwen2),
 * Prepend(U+2581) and Replace(' ' -> U+2581) (Llama 2's SentencePiece
 * emulation), Sequence of those. */
static const char *unsupported_normalizer(const cJSON *n)
{
    if (!n || cJSON_IsNull(n)) return NULL;
    const char *ty = type_of(n);
    if (!strcmp(ty, "NFC")) return NULL;
    if (!strcmp(ty, "Prepend")) {
        const cJSON *pp = cJSON_GetObjectItemCaseSensitive(n, "prepend");
        return cJSON_IsString(pp) && !strcmp(pp->valuestring, "\xE2\x96\x81") ? NULL : "Prepend (other than U+2581)";
    }
    if (!strcmp(ty, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(n, "content");
        return cJSON_IsString(pat) && !strcmp(pat->valuestring, " ") && cJSON_IsString(c) &&
                       !strcmp(c->valuestring, "\xE2\x96\x81")
                   ? NULL
                   : "Replace (other than ' ' -> U+2581)";
    }
    if (!strcmp(ty, "Sequence")) {
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(n, "normalizers"))
        {
            const char *u = unsupported_normalizer(x);
            if (u) return u;
        }
        return NULL;
    }
    return ty[0] ? ty : "(no type)";
}

static int prepend_normalizer(const cJSON *n)
{
    if (!cJSON_IsObject(n)) return 0;
    const char *ty = type_of(n);
    if (!strcmp(ty, "Prepend")) return 1;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) if (prepend_normalizer(x)) return 1;
    }
    return 0;
}

static int has_nfc(const cJSON *n)
{
    if (!cJSON_IsObject(n)) return 0;
    const char *ty = type_of(n);
    if (!strcmp(ty, "NFC")) return 1;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) if (has_nfc(x)) return 1;
    }
    return 0;
}

/* Does the TemplateProcessing post-processor put a special token before the
 * sequence?  Returns its text or NULL. */
static const char *template_bos(const cJSON *pp)
{
    if (!cJSON_IsObject(pp)) return NULL;
    if (!strcmp(type_of(pp), "Sequence")) {
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(pp, "processors"))
        {
            const char *b = template_bos(x);
            if (b) return b;
        }
        return NULL;
    }
    if (strcmp(type_of(pp), "TemplateProcessing") != 0) return NULL;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *first = cJSON_GetArrayItem(single, 0);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(st, "id");
    return cJSON_IsString(id) ? id->valuestring : NULL;
}

static int find_text(const char **toks, int n, const char *text)
{
    if (!text) return -1;
    for (int i = 0; i < n; i++)
        if (toks[i] && !strcmp(toks[i], text)) return i;
    return -1;
}

/* model.vocab and added_tokens into toks[n] (text, pointing into the JSON; "" for unused ids) and types[n];
 * both malloc'd, freed by the caller (also on failure). */
static enum tp_status json_vocab(const char *path, const cJSON *vocab, const cJSON *added, const char ***toks_out,
                                 int32_t **types_out, int *n_out, struct tp_error *err)
{
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, vocab)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= 16 * 1024 * 1024)
            return tp_error_set(err, TP_ERR_FORMAT, "%s: model.vocab[\"%.40s\"] is not an id in 0..16M", path,
                                x->string ? x->string : "?");
        if (x->valueint + 1 > n) n = x->valueint + 1;
    }
    cJSON_ArrayForEach(x, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(x, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= 16 * 1024 * 1024 || !token_text(x))
            return tp_error_set(err, TP_ERR_FORMAT, "%s: an added_tokens entry lacks a valid id or content", path);
        if (id->valueint + 1 > n) n = id->valueint + 1;
    }
    if (n == 0) return tp_error_set(err, TP_ERR_FORMAT, "%s: empty vocabulary", path);
    const char **toks = *toks_out = calloc((size_t)n, sizeof(*toks));
    int32_t *types = *types_out = malloc((size_t)n * sizeof(*types));
    if (!toks || !types) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++) types[i] = TP_TOKEN_TYPE_UNUSED;
    cJSON_ArrayForEach(x, vocab)
    {
        toks[x->valueint] = x->string;
        types[x->valueint] = TP_TOKEN_TYPE_NORMAL;
    }
    cJSON_ArrayForEach(x, added)
    {
        int id = cJSON_GetObjectItemCaseSensitive(x, "id")->valueint;
        toks[id] = token_text(x);
        types[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "special")) ? TP_TOKEN_TYPE_CONTROL
                                                                                  : TP_TOKEN_TYPE_USER_DEFINED;
    }
    for (int i = 0; i < n; i++)
        if (!toks[i]) toks[i] = "";
    *n_out = n;
    return TP_OK;
}

/* model.merges ("a b" strings or ["a", "b"] pairs) as "a b" strings: merges[n] and the text of the pairs in
 * *buf, both malloc'd, freed by the caller (also on failure). */
static enum tp_status json_merges(const char *path, const cJSON *jm, const char ***merges_out, char **buf_out,
                                  int *n_out, struct tp_error *err)
{
    const char **merges = *merges_out = malloc(((size_t)cJSON_GetArraySize(jm) + 1) * sizeof(*merges));
    size_t pair_bytes = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, jm) if (cJSON_IsArray(x)) for (const cJSON *y = x->child; y; y = y->next) if (cJSON_IsString(y))
        pair_bytes += strlen(y->valuestring) + 1;
    char *buf = *buf_out = malloc(pair_bytes + 1);
    if (!merges || !buf) return tp_error_set(err, TP_ERR_NOMEM, "%s: out of memory", path);
    size_t mo = 0;
    int im = 0;
    cJSON_ArrayForEach(x, jm)
    {
        if (cJSON_IsString(x)) {
            merges[im++] = x->valuestring;
        } else if (cJSON_IsArray(x) && cJSON_GetArraySize(x) == 2 && cJSON_IsString(x->child) &&
                   cJSON_IsString(x->child->next)) {
            size_t a = strlen(x->child->valuestring), b = strlen(x->child->next->valuestring);
            merges[im++] = buf + mo;
            memcpy(buf + mo, x->child->valuestring, a);
            buf[mo + a] = ' ';
            memcpy(buf + mo + a + 1, x->child->next->valuestring, b);
            buf[mo + a + 1 + b] = 0;
            mo += a + b + 2;
        } else {
            return tp_error_set(err, TP_ERR_FORMAT, "%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", path,
                                im);
        }
    }
    *n_out = im;
    return TP_OK;
}

/* The normalizer and pre-tokenizer: d's kind, pre-tokenizer and flags, or the reason they are refused. */
static enum tp_status json_pipeline(const char *path, const cJSON *root, const cJSON *model, struct tp_vocab_desc *d,
                                    struct tp_error *err)
{
    struct pipe_info pi;
    memset(&pi, 0, sizeof(pi));
    scan_pretok(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), &pi);
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const char *bad_norm = unsupported_normalizer(norm);
    if (pi.unknown || bad_norm)
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: %s \"%s\" is not supported", path,
                            pi.unknown ? "pre-tokenizer" : "normalizer", pi.unknown ? pi.unknown : bad_norm);
    d->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    d->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    if (!pi.byte_level) {
        if (!pi.metaspace && !prepend_normalizer(norm))
            return tp_error_set(err, TP_ERR_UNSUPPORTED,
                                "%s: neither a ByteLevel nor a SentencePiece (Metaspace) pipeline: not supported", path);
        d->kind = TP_TOK_SPM;
        d->pretok = TP_PRETOK_SPM;
        d->add_space_prefix = pi.metaspace ? pi.prepend : 1;
        return TP_OK;
    }
    d->kind = TP_TOK_BPE;
    if (pi.regex && !strcmp(pi.regex, RX_LLAMA3)) d->pretok = TP_PRETOK_LLAMA3;
    else if (pi.regex && !strcmp(pi.regex, RX_QWEN2)) d->pretok = TP_PRETOK_QWEN2;
    else if (pi.regex && !strcmp(pi.regex, RX_O200K)) d->pretok = TP_PRETOK_O200K;
    else if ((pi.regex && !strcmp(pi.regex, RX_GPT2)) || (!pi.regex && pi.byte_level_regex))
        d->pretok = pi.digits ? TP_PRETOK_GPT2_DIGITS : TP_PRETOK_GPT2;
    else
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "%s: pre-tokenizer regex \"%.200s\" is not supported (known: GPT-2, Llama 3, Qwen2, o200k)",
                            path, pi.regex ? pi.regex : "(none)");
    if (pi.digits && d->pretok != TP_PRETOK_GPT2_DIGITS)
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: Digits with a Split regex is not supported", path);
    if (d->pretok != TP_PRETOK_QWEN2 && has_nfc(norm))
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: NFC normalizer with a non-Qwen2 regex is not supported", path);
    if (d->pretok == TP_PRETOK_QWEN2 && !has_nfc(norm) && !cJSON_IsNull(norm) && norm)
        tp_log(TP_LOG_WARN, "model", "%s: Qwen2 regex without NFC normalizer: NFC applied anyway", path);
    return TP_OK;
}

/* BOS / EOS / EOT ids and whether BOS / EOS are added: tokenizer_config.json (cfg, may be NULL) first, then the
 * post-processor's template, then each family's usual texts. */
static void json_bos_eos(const cJSON *root, const cJSON *cfg, const char **toks, int n, struct tp_vocab_desc *d)
{
    const char *bos_text = template_bos(cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    int add_bos = bos_text != NULL, add_eos = 0;
    const char *eos_text = NULL;
    if (cfg) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(cfg, "bos_token");
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token");
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
        const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
        if (b) bos_text = token_text(b); /* null: no BOS */
        eos_text = token_text(e);
        if (cJSON_IsBool(ab)) add_bos = cJSON_IsTrue(ab);
        else if (bos_text && d->pretok == TP_PRETOK_LLAMA3) add_bos = 1; /* Llama 3 is trained with BOS */
        if (cJSON_IsBool(ae)) add_eos = cJSON_IsTrue(ae);
    }
    if (!bos_text) {
        if (d->kind == TP_TOK_SPM) bos_text = "<s>";
        else if (d->pretok == TP_PRETOK_LLAMA3) bos_text = "<|begin_of_text|>";
    }
    if (!eos_text) {
        if (d->kind == TP_TOK_SPM) eos_text = "</s>";
        else if (d->pretok == TP_PRETOK_LLAMA3) eos_text = "<|end_of_text|>";
        else eos_text = "<|endoftext|>";
    }
    if (!cfg && d->pretok == TP_PRETOK_LLAMA3) add_bos = 1;
    d->bos_id = find_text(toks, n, bos_text);
    d->eos_id = find_text(toks, n, eos_text);
    d->eot_id = find_text(toks, n, "<|eot_id|>");
    if (d->eot_id < 0) d->eot_id = find_text(toks, n, "<|im_end|>");
    d->pad_id = -1;
    d->add_bos = add_bos && d->bos_id >= 0;
    d->add_eos = add_eos && d->eos_id >= 0;
}

enum tp_status tp_tokenizer_from_json(const char *tokenizer_json, const char *tokenizer_config_json,
                                      tp_tokenizer_t **out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    cJSON *root = NULL, *cfg = NULL;
    const char **toks = NULL, **merges = NULL;
    int32_t *types = NULL;
    char *merge_buf = NULL;
    struct tp_vocab_desc d;
    memset(&d, 0, sizeof(d));
    *out = NULL;
    const char *path = tokenizer_json;
    if (!path) return tp_error_set(err, TP_ERR_INVALID_ARG, "tokenizer: no tokenizer.json path given");
    TP_CHECK_GOTO(read_json(path, &root, err), rc, out);
    if (tokenizer_config_json) TP_CHECK_GOTO(read_json(tokenizer_config_json, &cfg, err), rc, out);

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: no \"model\" object (is this a tokenizer.json?)", path);
        goto out;
    }
    const char *mtype = type_of(model);
    if (strcmp(mtype, "BPE") != 0) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED, "%s: model.type \"%s\" is not supported (only BPE)", path, mtype);
        goto out;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(jm)) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "%s: model.vocab (object) or model.merges (array) missing", path);
        goto out;
    }
    int n = 0, n_merges = 0;
    TP_CHECK_GOTO(json_vocab(path, vocab, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), &toks, &types, &n, err),
                  rc, out);
    TP_CHECK_GOTO(json_merges(path, jm, &merges, &merge_buf, &n_merges, err), rc, out);
    TP_CHECK_GOTO(json_pipeline(path, root, model, &d, err), rc, out);
    if (d.kind == TP_TOK_SPM) {
        /* byte tokens are typed as such; <unk> is the unknown token */
        for (int i = 0; i < n; i++) {
            const char *s = toks[i];
            if (types[i] == TP_TOKEN_TYPE_NORMAL && strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>')
                types[i] = TP_TOKEN_TYPE_BYTE;
        }
    }
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    d.unk_id = cJSON_IsString(unk) ? find_text(toks, n, unk->valuestring) : -1;
    if (d.unk_id >= 0) types[d.unk_id] = TP_TOKEN_TYPE_UNKNOWN;
    json_bos_eos(root, cfg, toks, n, &d);
    d.n_tokens = n;
    d.tokens = toks;
    d.token_types = types;
    d.n_merges = n_merges;
    d.merges = merges;
    rc = tp_tokenizer_build(&d, out, err);
    if (rc != TP_OK && err && err->status == rc && strncmp(err->msg, "tokenizer:", 10) == 0) {
        char tmp[TP_ERROR_MSG_MAX];
        memcpy(tmp, err->msg, sizeof(tmp));
        tp_error_force(err, rc, "%.100s: %.400s", path, tmp);
    }
out:
    free(toks);
    free(types);
    free(merges);
    free(merge_buf);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return rc;
}

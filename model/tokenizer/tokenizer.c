/*
 * model/tokenizer/tokenizer.c - the tokenizer object: building it from a vocabulary
 * descriptor (tp_tokenizer_build, filled by the GGUF and tokenizer.json
 * loaders), the lookup tables (open-addressing hashes for token text and
 * merge pairs), accessors, special-token matching and tp_tokenizer_encode.
 * The merge loop and the pre-tokenizers live in tokenizer_bpe.c, decoding
 * in detok.c.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_core_impl.h"
#include "tokenizer/unicode_impl.h"

uint64_t tp_tok_hash_bytes(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static inline uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

int32_t tp_tok_lookup(const struct tp_tokenizer *t, const char *s, size_t len)
{
    size_t i = (size_t)tp_tok_hash_bytes(s, len) & t->key_mask;
    for (;;) {
        int32_t id = t->key_hash[i];
        if (id < 0) return -1;
        const struct tp_tok_entry *e = &t->toks[id];
        if (e->key_len == len && memcmp(t->blob + e->key_off, s, len) == 0) return id;
        i = (i + 1) & t->key_mask;
    }
}

int32_t tp_tok_merge(const struct tp_tokenizer *t, int32_t left, int32_t right, int32_t *rank)
{
    if (!t->merges || left < 0 || right < 0) return -1;
    uint64_t key = ((uint64_t)(uint32_t)(left + 1) << 32) | (uint32_t)(right + 1);
    size_t i = (size_t)hash_u64(key) & t->merge_mask;
    for (;;) {
        const struct tp_merge_slot *m = &t->merges[i];
        if (m->key == 0) return -1;
        if (m->key == key) {
            *rank = m->rank;
            return m->result;
        }
        i = (i + 1) & t->merge_mask;
    }
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Token text of a descriptor entry. */
static const char *desc_tok(const struct tp_vocab_desc *d, int i, size_t *len)
{
    const char *s = d->tokens[i] ? d->tokens[i] : "";
    *len = d->token_lens ? d->token_lens[i] : strlen(s);
    return s;
}

/* "<0xNN>" -> NN, or -1. */
static int parse_byte_token(const char *s, size_t len)
{
    if (len != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Decode a GPT-2 byte-mapped text into raw bytes (out has room for len
 * bytes).  Returns the byte count, or -1 if a code point is not in the map. */
static long gpt2_decode(const int16_t *cp_to_byte, const char *s, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = tp_utf8_decode((const unsigned char *)s + i, len - i, &cp);
        if (k == 0 || cp >= 512 || cp_to_byte[cp] < 0) return -1;
        out[o++] = (char)cp_to_byte[cp];
        i += (size_t)k;
    }
    return (long)o;
}

/* Specials sort by first byte, then longest first (so the first match at a
 * position is the longest), then id. */
struct special_key {
    uint32_t first, len;
    int32_t id;
};

static int cmp_special(const void *a, const void *b)
{
    const struct special_key *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int sort_specials(struct tp_tokenizer *t)
{
    struct special_key *k = malloc((size_t)t->n_specials * sizeof(*k));
    if (!k) return -1;
    for (int i = 0; i < t->n_specials; i++) {
        const struct tp_tok_entry *e = &t->toks[t->specials[i]];
        k[i].first = (unsigned char)t->blob[e->piece_off];
        k[i].len = e->piece_len;
        k[i].id = t->specials[i];
    }
    qsort(k, (size_t)t->n_specials, sizeof(*k), cmp_special);
    for (int i = 0; i < t->n_specials; i++) t->specials[i] = k[i].id;
    free(k);
    return 0;
}

static const char *const eog_texts[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end_of_text|>",
                                        "<|endoftext|>", "<end_of_turn>", "<|end|>", "<|return|>", "<|call|>"};

/* Id of the control / user-defined token whose text is s, or -1. */
static int find_special_text(const struct tp_tokenizer *t, const char *s)
{
    size_t l = strlen(s);
    for (int i = 0; i < t->n_specials; i++) {
        const struct tp_tok_entry *e = &t->toks[t->specials[i]];
        if (e->piece_len == l && memcmp(t->blob + e->piece_off, s, l) == 0) return t->specials[i];
    }
    return -1;
}

/* What tp_tokenizer_build refuses before building anything. */
static enum tp_status check_desc(const struct tp_vocab_desc *d, struct tp_error *err)
{
    if (!d || d->n_tokens <= 0 || !d->tokens)
        return tp_error_set(err, TP_ERR_FORMAT, "tokenizer: empty vocabulary (no tokens)");
    if (d->kind != TP_TOK_SPM && d->kind != TP_TOK_BPE)
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "tokenizer: unknown kind %d", (int)d->kind);
    if ((int)d->pretok < 0 || d->pretok >= TP_PRETOK_COUNT)
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "tokenizer: unknown pre-tokenizer %d", (int)d->pretok);
    if (d->n_merges >= (1 << 24))
        return tp_error_set(err, TP_ERR_FORMAT, "tokenizer: %d merges (limit 16M)", d->n_merges);
    if (d->kind == TP_TOK_BPE && d->n_merges <= 0)
        return tp_error_set(err, TP_ERR_FORMAT, "tokenizer: BPE vocabulary without merges");
    if (d->kind == TP_TOK_SPM && !d->scores && d->n_merges <= 0)
        return tp_error_set(err, TP_ERR_FORMAT, "tokenizer: SentencePiece vocabulary with neither scores nor merges");
    return TP_OK;
}

/* The fields copied from d: kind, flags, the special ids (out of range: -1). */
static void init_from_desc(struct tp_tokenizer *t, const struct tp_vocab_desc *d)
{
    const int n = d->n_tokens;
    t->kind = d->kind;
    t->pretok = d->pretok;
    t->n_vocab = n;
    t->use_scores = d->kind == TP_TOK_SPM && d->scores != NULL;
    t->add_bos = d->add_bos;
    t->add_eos = d->add_eos;
    t->add_space_prefix = d->add_space_prefix;
    t->byte_fallback = d->byte_fallback;
    t->ignore_merges = d->ignore_merges;
    int *ids[5] = {&t->bos, &t->eos, &t->eot, &t->unk, &t->pad};
    int src[5] = {d->bos_id, d->eos_id, d->eot_id, d->unk_id, d->pad_id};
    for (int i = 0; i < 5; i++) *ids[i] = (src[i] >= 0 && src[i] < n) ? src[i] : -1;
    for (int i = 0; i < TP_FIM_COUNT; i++)
        t->fim[i] = d->fim_ids[i] > 0 && d->fim_ids[i] <= n ? d->fim_ids[i] - 1 : -1;
    if (t->add_bos && t->bos < 0) t->add_bos = 0;
    if (t->add_eos && t->eos < 0) t->add_eos = 0;
    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
}

/* One token's entry: its type, its key (the text merges and lookups use: GPT-2 bytes decoded for a
 * byte-level vocabulary) and its piece (the text it decodes to) appended to t->blob at *off. */
static void build_entry(struct tp_tokenizer *t, const struct tp_vocab_desc *d, const int16_t *cp_to_byte, int i,
                        size_t *off)
{
    const int byte_level = d->kind == TP_TOK_BPE;
    size_t l;
    const char *s = desc_tok(d, i, &l);
    struct tp_tok_entry *e = &t->toks[i];
    int type = d->token_types ? d->token_types[i] : TP_TOKEN_TYPE_NORMAL;
    if (type < TP_TOKEN_TYPE_UNDEFINED || type > TP_TOKEN_TYPE_BYTE) type = TP_TOKEN_TYPE_NORMAL;
    if (type == TP_TOKEN_TYPE_UNDEFINED) type = TP_TOKEN_TYPE_NORMAL;
    int bv = parse_byte_token(s, l);
    if (!byte_level && bv >= 0 && (type == TP_TOKEN_TYPE_BYTE || (d->byte_fallback && type == TP_TOKEN_TYPE_NORMAL)))
        type = TP_TOKEN_TYPE_BYTE;
    e->type = (uint8_t)type;
    e->score = d->scores ? d->scores[i] : 0.0f;
    e->key_off = (uint32_t)*off;
    long kl = -1;
    if (byte_level && type == TP_TOKEN_TYPE_NORMAL) kl = gpt2_decode(cp_to_byte, s, l, t->blob + *off);
    if (kl < 0) {
        memcpy(t->blob + *off, s, l);
        kl = (long)l;
    }
    e->key_len = (uint32_t)kl;
    *off += (size_t)kl;
    e->piece_off = (uint32_t)*off;
    size_t pl = 0;
    char *piece = t->blob + *off;
    if (type == TP_TOKEN_TYPE_BYTE && bv >= 0) {
        piece[0] = (char)bv;
        pl = 1;
        if (t->byte_tok[bv] < 0) t->byte_tok[bv] = i;
    } else if (byte_level || type != TP_TOKEN_TYPE_NORMAL) {
        memcpy(piece, t->blob + e->key_off, e->key_len);
        pl = e->key_len;
    } else { /* SentencePiece: U+2581 -> ' ' */
        for (size_t j = 0; j < l; j++) {
            if (j + 2 < l && (unsigned char)s[j] == 0xE2 && (unsigned char)s[j + 1] == 0x96 &&
                (unsigned char)s[j + 2] == 0x81) {
                piece[pl++] = ' ';
                j += 2;
            } else {
                piece[pl++] = s[j];
            }
        }
    }
    e->piece_len = (uint32_t)pl;
    *off += pl;
    if ((int)pl > t->max_piece_len) t->max_piece_len = (int)pl;
    e->in_key_hash = type == TP_TOKEN_TYPE_NORMAL;
    if (byte_level && type == TP_TOKEN_TYPE_NORMAL && e->key_len == 1) t->byte_tok[(unsigned char)t->blob[e->key_off]] = i;
}

static int is_special(const struct tp_tok_entry *e)
{
    return (e->type == TP_TOKEN_TYPE_CONTROL || e->type == TP_TOKEN_TYPE_USER_DEFINED ||
            e->type == TP_TOKEN_TYPE_UNKNOWN) &&
           e->piece_len > 0;
}

/* Every token's entry and the blob of their keys and pieces (sized to 2x the texts). */
static enum tp_status build_entries(struct tp_tokenizer *t, const struct tp_vocab_desc *d, const int16_t *cp_to_byte,
                                    struct tp_error *err)
{
    const int n = d->n_tokens;
    if (n <= 0) return tp_error_set(err, TP_ERR_FORMAT, "tokenizer: empty vocabulary (no tokens)");
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t l;
        desc_tok(d, i, &l);
        if (l > 0xFFFFFF)
            return tp_error_set(err, TP_ERR_FORMAT, "tokenizer: token %d is %zu bytes long (limit 16 MiB)", i, l);
        total += 2 * l;
    }
    if (total > 0xFFFFFFF0u)
        return tp_error_set(err, TP_ERR_FORMAT, "tokenizer: token texts too large (%zu bytes)", total);
    t->toks = calloc((size_t)n, sizeof(*t->toks));
    t->blob = malloc(total + 1);
    if (!t->toks || !t->blob) return TP_ERR_NOMEM;
    size_t off = 0;
    for (int i = 0; i < n; i++) build_entry(t, d, cp_to_byte, i, &off);
    t->blob_len = off;
    for (int b = 0; d->kind == TP_TOK_BPE && b < 256; b++)
        if (t->byte_tok[b] < 0)
            return tp_error_set(err, TP_ERR_FORMAT, "tokenizer: byte-level vocabulary lacks a token for byte 0x%02X",
                                b);
    return TP_OK;
}

/* The open-addressing table from a token's key to its id (duplicate texts: the first id). */
static enum tp_status build_key_hash(struct tp_tokenizer *t)
{
    t->key_mask = pow2_at_least((size_t)t->n_vocab * 2) - 1;
    t->key_hash = malloc((t->key_mask + 1) * sizeof(int32_t));
    if (!t->key_hash) return TP_ERR_NOMEM;
    memset(t->key_hash, 0xFF, (t->key_mask + 1) * sizeof(int32_t));
    for (int i = 0; i < t->n_vocab; i++) {
        struct tp_tok_entry *e = &t->toks[i];
        if (!e->in_key_hash || e->key_len == 0) continue;
        const char *k = t->blob + e->key_off;
        if (tp_tok_lookup(t, k, e->key_len) >= 0) continue; /* duplicate text: first id wins */
        size_t h = (size_t)tp_tok_hash_bytes(k, e->key_len) & t->key_mask;
        while (t->key_hash[h] >= 0) h = (h + 1) & t->key_mask;
        t->key_hash[h] = i;
    }
    return TP_OK;
}

/* The merges "left right" -> (rank, result id); merges of unknown or unrepresentable tokens never apply
 * and are left out, a repeated pair keeps its first (lowest) rank. */
static enum tp_status build_merges(struct tp_tokenizer *t, const struct tp_vocab_desc *d, const int16_t *cp_to_byte,
                                   struct tp_error *err)
{
    const int byte_level = d->kind == TP_TOK_BPE;
    t->merge_mask = pow2_at_least((size_t)d->n_merges * 4 / 3 + 1) - 1;
    t->merges = calloc(t->merge_mask + 1, sizeof(*t->merges));
    if (!t->merges) return TP_ERR_NOMEM;
    enum tp_status rc = TP_OK;
    char *mb = NULL;
    size_t mb_cap = 0;
    for (int r = 0; r < d->n_merges && rc == TP_OK; r++) {
        const char *m = d->merges[r] ? d->merges[r] : "";
        size_t ml = d->merge_lens ? d->merge_lens[r] : strlen(m);
        const char *sp = memchr(m, ' ', ml);
        if (!sp || sp == m || sp == m + ml - 1) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "tokenizer: merge %d (\"%.*s\") is not \"left right\"", r,
                              (int)TP_MIN(ml, 60), m);
            break;
        }
        if (ml + 1 > mb_cap) {
            char *nb = realloc(mb, ml + 16);
            if (!nb) {
                rc = TP_ERR_NOMEM;
                break;
            }
            mb = nb;
            mb_cap = ml + 16;
        }
        size_t ll = (size_t)(sp - m), rl = ml - ll - 1;
        long dl = ll, dr = rl;
        if (byte_level) {
            dl = gpt2_decode(cp_to_byte, m, ll, mb);
            dr = dl < 0 ? -1 : gpt2_decode(cp_to_byte, sp + 1, rl, mb + dl);
        } else {
            memcpy(mb, m, ll);
            memcpy(mb + ll, sp + 1, rl);
        }
        if (dl < 0 || dr < 0) continue; /* not representable: can never apply */
        int32_t li = tp_tok_lookup(t, mb, (size_t)dl), ri = tp_tok_lookup(t, mb + dl, (size_t)dr);
        int32_t res = tp_tok_lookup(t, mb, (size_t)(dl + dr));
        if (li < 0 || ri < 0 || res < 0) continue; /* refers to unknown tokens: never applies */
        uint64_t key = ((uint64_t)(uint32_t)(li + 1) << 32) | (uint32_t)(ri + 1);
        size_t h = (size_t)hash_u64(key) & t->merge_mask;
        while (t->merges[h].key != 0 && t->merges[h].key != key) h = (h + 1) & t->merge_mask;
        if (t->merges[h].key == key) continue; /* duplicate: the first (lowest rank) wins */
        t->merges[h].key = key;
        t->merges[h].rank = r;
        t->merges[h].result = res;
        t->n_merges++;
    }
    free(mb);
    return rc;
}

/* The special tokens (control, user-defined, unknown with text), sorted, and special_first[b]: the first
 * of them whose text starts with a byte >= b. */
static enum tp_status build_specials(struct tp_tokenizer *t)
{
    int n_special = 0;
    for (int i = 0; i < t->n_vocab; i++) n_special += is_special(&t->toks[i]);
    if (n_special > 0) {
        t->specials = malloc((size_t)n_special * sizeof(int32_t));
        if (!t->specials) return TP_ERR_NOMEM;
        for (int i = 0; i < t->n_vocab; i++)
            if (is_special(&t->toks[i])) t->specials[t->n_specials++] = i;
        if (sort_specials(t) != 0) return TP_ERR_NOMEM;
    }
    int j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < t->n_specials && (unsigned char)t->blob[t->toks[t->specials[j]].piece_off] < b) j++;
        t->special_first[b] = j;
    }
    return TP_OK;
}

/* End of generation: eos, eot and the control texts of eog_texts. */
static void mark_eog(struct tp_tokenizer *t)
{
    if (t->eos >= 0) t->toks[t->eos].eog = 1;
    if (t->eot >= 0) t->toks[t->eot].eog = 1;
    for (int i = 0; i < t->n_vocab; i++) {
        struct tp_tok_entry *e = &t->toks[i];
        if (e->type != TP_TOKEN_TYPE_CONTROL && e->type != TP_TOKEN_TYPE_USER_DEFINED) continue;
        for (size_t k = 0; k < TP_ARRAY_LEN(eog_texts); k++)
            if (e->piece_len == strlen(eog_texts[k]) && memcmp(t->blob + e->piece_off, eog_texts[k], e->piece_len) == 0)
                e->eog = 1;
    }
    /* harmony (gpt-oss): <|end|> closes every message of a reply, which goes
     * on until <|return|> or <|call|>; it ends generation only without them */
    int ret = find_special_text(t, "<|return|>"), call = find_special_text(t, "<|call|>");
    int end = find_special_text(t, "<|end|>");
    if (ret >= 0 && call >= 0 && end >= 0) t->toks[end].eog = 0;
}

void tp_tokenizer_mark_eog(tp_tokenizer_t *t, int id)
{
    if (t && id >= 0 && id < t->n_vocab) t->toks[id].eog = 1;
}

enum tp_status tp_tokenizer_build(const struct tp_vocab_desc *d, tp_tokenizer_t **out, struct tp_error *err)
{
    *out = NULL;
    enum tp_status rc = check_desc(d, err);
    if (rc != TP_OK) return rc;
    struct tp_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return tp_error_set(err, TP_ERR_NOMEM, "tokenizer: out of memory");
    init_from_desc(t, d);
    int16_t cp_to_byte[512];
    uint32_t byte_to_cp[256];
    tp_unicode_gpt2_byte_map(byte_to_cp);
    for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    rc = build_entries(t, d, cp_to_byte, err);
    if (rc == TP_OK) rc = build_key_hash(t);
    if (rc == TP_OK && d->n_merges > 0 && !t->use_scores) rc = build_merges(t, d, cp_to_byte, err);
    if (rc == TP_OK) rc = build_specials(t);
    if (rc != TP_OK) {
        if (rc == TP_ERR_NOMEM)
            tp_error_set(err, TP_ERR_NOMEM, "tokenizer: out of memory building tables for %d tokens", d->n_tokens);
        tp_tokenizer_free(t);
        return rc;
    }
    mark_eog(t);
    *out = t;
    return TP_OK;
}

void tp_tokenizer_free(tp_tokenizer_t *t)
{
    if (!t) return;
    free(t->toks);
    free(t->blob);
    free(t->key_hash);
    free(t->merges);
    free(t->specials);
    free(t);
}

int tp_tokenizer_n_vocab(const tp_tokenizer_t *t) { return t ? t->n_vocab : 0; }
enum tp_tok_kind tp_tokenizer_kind(const tp_tokenizer_t *t) { return t ? t->kind : TP_TOK_KIND_COUNT; }
int tp_tokenizer_bos(const tp_tokenizer_t *t) { return t ? t->bos : -1; }
int tp_tokenizer_eos(const tp_tokenizer_t *t) { return t ? t->eos : -1; }
int tp_tokenizer_add_bos(const tp_tokenizer_t *t) { return t ? t->add_bos : 0; }
int tp_tokenizer_add_eos(const tp_tokenizer_t *t) { return t ? t->add_eos : 0; }

int tp_tokenizer_fim(const tp_tokenizer_t *t, int ids[TP_FIM_COUNT])
{
    /* the texts of the code models' FIM tokens: Qwen2.5-Coder / CodeGemma, StarCoder / SantaCoder,
     * CodeLlama (SentencePiece: with and without the U+2581 prefix), DeepSeek-Coder */
    static const char *const names[TP_FIM_COUNT][6] = {
        {"<|fim_prefix|>", "<fim_prefix>", "<PRE>", "\xe2\x96\x81<PRE>", "<|fim\xe2\x96\x81" "begin|>", NULL},
        {"<|fim_suffix|>", "<fim_suffix>", "<SUF>", "\xe2\x96\x81<SUF>", "<|fim\xe2\x96\x81hole|>", NULL},
        {"<|fim_middle|>", "<fim_middle>", "<MID>", "\xe2\x96\x81<MID>", "<|fim\xe2\x96\x81" "end|>", NULL},
        {"<|file_sep|>", "<file_sep>", NULL},
        {"<|repo_name|>", "<reponame>", NULL},
    };
    for (int i = 0; i < TP_FIM_COUNT; i++) {
        ids[i] = t ? t->fim[i] : -1;
        for (int k = 0; t && ids[i] < 0 && names[i][k]; k++) ids[i] = tp_tokenizer_find_special(t, names[i][k]);
    }
    return ids[TP_FIM_PRE] >= 0 && ids[TP_FIM_SUF] >= 0 && ids[TP_FIM_MID] >= 0;
}

int tp_tokenizer_is_eog(const tp_tokenizer_t *t, int id)
{
    return t && id >= 0 && id < t->n_vocab && t->toks[id].eog;
}

int tp_tokenizer_find_special(const tp_tokenizer_t *t, const char *text)
{
    if (!t || !text) return -1;
    size_t len = strlen(text);
    for (int i = 0; i < t->n_specials; i++) {
        const struct tp_tok_entry *e = &t->toks[t->specials[i]];
        if (e->piece_len == len && memcmp(t->blob + e->piece_off, text, len) == 0) return t->specials[i];
    }
    return -1;
}

const char *tp_tokenizer_piece(const tp_tokenizer_t *t, int id, size_t *len)
{
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return "";
    }
    const struct tp_tok_entry *e = &t->toks[id];
    if (len) *len = e->piece_len;
    return t->blob + e->piece_off;
}

/* Longest special token starting at s[0..len), or -1.  Control / unknown
 * tokens only when parse_special; user-defined (added, non-special) ones
 * always, as Hugging Face and llama.cpp do. */
static int32_t match_special(const struct tp_tokenizer *t, const char *s, size_t len, int parse_special)
{
    unsigned char b = (unsigned char)s[0];
    for (int j = t->special_first[b]; j < t->special_first[b + 1]; j++) {
        int32_t id = t->specials[j];
        const struct tp_tok_entry *e = &t->toks[id];
        if (!parse_special && e->type != TP_TOKEN_TYPE_USER_DEFINED) continue;
        if (e->piece_len <= len && memcmp(t->blob + e->piece_off, s, e->piece_len) == 0) return id;
    }
    return -1;
}

void tp_tok_scratch_free(struct tp_tok_scratch *s)
{
    free(s->syms);
    free(s->heap);
    free(s->cps);
    free(s->cls);
    free(s->offs);
    free(s->buf);
    memset(s, 0, sizeof(*s));
}

int tp_tokenizer_encode(const tp_tokenizer_t *t, const char *text, size_t len, int add_bos, int parse_special,
                        int32_t *ids, int max_ids)
{
    if (!t || (!text && len > 0) || (max_ids > 0 && !ids)) return -1;
    if (max_ids < 0) max_ids = 0;
    if (len > (size_t)0x3FFFFFFF) return -1;
    if (!tp_utf8_valid(text, len)) return -1;
    struct tp_tok_out o = {ids, max_ids, 0};
    struct tp_tok_scratch sc = {0};
    int ok = 0;
    if (add_bos && t->add_bos) tp_tok_emit(&o, t->bos);
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        int32_t sp = t->n_specials ? match_special(t, text + i, len - i, parse_special) : -1;
        if (sp < 0) {
            i++;
            continue;
        }
        if (i > start) {
            if (tp_tok_encode_fragment(t, &sc, text + start, i - start, start == 0, &o) != 0) goto out;
        }
        tp_tok_emit(&o, sp);
        i += t->toks[sp].piece_len;
        start = i;
    }
    if (len > start && tp_tok_encode_fragment(t, &sc, text + start, len - start, start == 0, &o) != 0) goto out;
    if (add_bos && t->add_eos) tp_tok_emit(&o, t->eos);
    ok = 1;
out:
    tp_tok_scratch_free(&sc);
    return ok ? o.n : -1;
}

/*
 * model/tokenizer/tokenizer_bpe.c - the merge loop shared by both tokenizer kinds, and the
 * pre-tokenizers.  Merge loop: a word starts as one symbol per character (SentencePiece) or byte
 * (byte-level BPE) in a linked list; candidate pairs wait in a min-heap ordered by (priority, left
 * position), the priority being the merge rank or minus the merged token's score (SentencePiece, as
 * llama.cpp's llm_tokenizer_spm); a stale candidate is recognised by its combined length, so a word
 * costs O(n log n) with at most 2n heap entries.  Pre-tokenizers: the GPT-2, Llama 3, Qwen2 and o200k
 * regexes over code points (the classes of unicode_impl.h), with the regexes' exact semantics (the
 * look-ahead of \s+(?!\S) included), not llama.cpp's approximations.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_core_impl.h"
#include "tokenizer/unicode_impl.h"

struct tp_tok_sym {
    uint32_t start, len; /* bytes of the word */
    int32_t id;          /* token id of this text, -1 if not in the vocabulary */
    int32_t prev, next;  /* -1 at the ends */
};

struct tp_tok_cand {
    float prio;      /* lower first: merge rank (< 2^24, exact) or -score */
    int32_t left;    /* symbol index (= position order) */
    uint32_t size;   /* combined length when queued: stale if it changed */
    int32_t result;  /* id of the merged token */
};

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *n = realloc(*p, c * elem);
    if (!n) return -1;
    *p = n;
    *cap = c;
    return 0;
}

static inline int cand_less(const struct tp_tok_cand *a, const struct tp_tok_cand *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

static void heap_push(struct tp_tok_cand *h, size_t *n, struct tp_tok_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct tp_tok_cand heap_pop(struct tp_tok_cand *h, size_t *n)
{
    struct tp_tok_cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct tp_tok_cand *best = &last;
        if (l < *n && cand_less(&h[l], best)) {
            m = l;
            best = &h[l];
        }
        if (r < *n && cand_less(&h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* Queue the pair (left, left->next) if it can merge. */
static void try_pair(const struct tp_tokenizer *t, const char *s, struct tp_tok_sym *sy, int32_t left,
                     struct tp_tok_cand *heap, size_t *nh)
{
    if (left < 0) return;
    int32_t right = sy[left].next;
    if (right < 0) return;
    struct tp_tok_cand c;
    c.left = left;
    c.size = sy[left].len + sy[right].len;
    if (t->use_scores) {
        int32_t id = tp_tok_lookup(t, s + sy[left].start, c.size);
        if (id < 0) return;
        c.prio = -t->toks[id].score;
        c.result = id;
    } else {
        int32_t rank;
        int32_t id = tp_tok_merge(t, sy[left].id, sy[right].id, &rank);
        if (id < 0) return;
        c.prio = (float)rank;
        c.result = id;
    }
    heap_push(heap, nh, c);
}

int tp_tok_bpe_word(const struct tp_tokenizer *t, struct tp_tok_scratch *sc, const char *s, size_t len,
                    struct tp_tok_out *out)
{
    if (len == 0) return 0;
    if (t->ignore_merges) {
        int32_t id = tp_tok_lookup(t, s, len);
        if (id >= 0) {
            tp_tok_emit(out, id);
            return 0;
        }
    }
    if (grow((void **)&sc->syms, &sc->cap_syms, len, sizeof(*sc->syms)) ||
        grow((void **)&sc->heap, &sc->cap_heap, 2 * len + 4, sizeof(*sc->heap)))
        return -1;
    struct tp_tok_sym *sy = sc->syms;
    int32_t n = 0;
    int byte_level = t->kind == TP_TOK_BPE;
    for (size_t i = 0; i < len;) {
        uint32_t k = 1;
        if (!byte_level) {
            uint32_t cp;
            int kk = tp_utf8_decode((const unsigned char *)s + i, len - i, &cp);
            k = kk > 0 ? (uint32_t)kk : 1;
        }
        sy[n].start = (uint32_t)i;
        sy[n].len = k;
        sy[n].id = byte_level ? t->byte_tok[(unsigned char)s[i]] : tp_tok_lookup(t, s + i, k);
        sy[n].prev = n - 1;
        sy[n].next = -1;
        if (n > 0) sy[n - 1].next = n;
        n++;
        i += k;
    }
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < n; i++) try_pair(t, s, sy, i, sc->heap, &nh);
    while (nh > 0) {
        struct tp_tok_cand c = heap_pop(sc->heap, &nh);
        struct tp_tok_sym *l = &sy[c.left];
        if (l->len == 0 || l->next < 0) continue;
        struct tp_tok_sym *r = &sy[l->next];
        if (l->len + r->len != c.size) continue; /* stale */
        l->len += r->len;
        l->id = c.result;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = c.left;
        try_pair(t, s, sy, l->prev, sc->heap, &nh);
        try_pair(t, s, sy, c.left, sc->heap, &nh);
    }
    for (int32_t i = 0; i >= 0 && i < n; i = sy[i].next) {
        if (sy[i].id >= 0) {
            tp_tok_emit(out, sy[i].id);
            continue;
        }
        /* unknown piece: bytes, or <unk> */
        int all_bytes = 1;
        for (uint32_t j = 0; j < sy[i].len; j++)
            if (t->byte_tok[(unsigned char)s[sy[i].start + j]] < 0) all_bytes = 0;
        if (all_bytes && (t->byte_fallback || t->use_scores || byte_level)) {
            for (uint32_t j = 0; j < sy[i].len; j++) tp_tok_emit(out, t->byte_tok[(unsigned char)s[sy[i].start + j]]);
        } else if (t->unk >= 0) {
            tp_tok_emit(out, t->unk);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ pre-tokenizers */

#define CLS_L TP_UCLS_LETTER
#define CLS_N TP_UCLS_NUMBER
#define CLS_S TP_UCLS_SPACE

/* Decoded fragment: cp[i], cls[i], byte offsets off[i] (off[n] = end). */
struct frag {
    const uint32_t *cp;
    const uint8_t *cls;
    const uint32_t *off;
    size_t n;
};

static inline uint32_t cp_at(const struct frag *f, size_t i) { return i < f->n ? f->cp[i] : 0xFFFFFFFFu; }
static inline unsigned cls_at(const struct frag *f, size_t i) { return i < f->n ? f->cls[i] : 0u; }
/* [^\s\p{L}\p{N}]: any real character outside the three classes. */
static inline int is_other(const struct frag *f, size_t i) { return i < f->n && !(f->cls[i] & (CLS_L | CLS_N | CLS_S)); }
static inline uint32_t lower_ascii(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* Contraction at i ('s 't 're 've 'm 'll 'd): its length in code points, or 0. */
static size_t contraction(const struct frag *f, size_t i, int icase)
{
    if (cp_at(f, i) != '\'') return 0;
    uint32_t a = cp_at(f, i + 1), b = cp_at(f, i + 2);
    if (icase) {
        a = lower_ascii(a);
        b = lower_ascii(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* Whitespace rules shared by all three: \s*[\r\n]+ (Llama 3 / Qwen2 only),
 * \s+(?!\S), \s+.  Returns the match length at i (0 if i is not space). */
static size_t whitespace_run(const struct frag *f, size_t i, int newline_rule)
{
    size_t n = 0, last_nl = 0;
    while (cls_at(f, i + n) & CLS_S) {
        uint32_t c = f->cp[i + n];
        if (c == '\r' || c == '\n') last_nl = n + 1;
        n++;
    }
    if (n == 0) return 0;
    if (newline_rule && last_nl > 0) return last_nl;
    if (n > 1 && i + n < f->n) return n - 1; /* leave the last space to prefix the next word */
    return n;
}

/*
 * Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
 *    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 */
static size_t next_llama3(const struct frag *f, size_t i, int max_digits)
{
    size_t k = contraction(f, i, 1);
    if (k) return k;
    uint32_t c = f->cp[i];
    unsigned cl = f->cls[i];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (cl & CLS_L) {
        size_t j = i + 1;
        while (cls_at(f, j) & CLS_L) j++;
        return j - i;
    }
    if (c != '\r' && c != '\n' && !(cl & CLS_N) && (cls_at(f, i + 1) & CLS_L)) {
        size_t j = i + 2;
        while (cls_at(f, j) & CLS_L) j++;
        return j - i;
    }
    /* \p{N}{1,max} */
    if (cl & CLS_N) {
        size_t j = i + 1;
        while (j - i < (size_t)max_digits && (cls_at(f, j) & CLS_N)) j++;
        return j - i;
    }
    /* ' '?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t s0 = (c == ' ' && is_other(f, i + 1)) ? i + 1 : i;
    if (is_other(f, s0)) {
        size_t j = s0 + 1;
        while (is_other(f, j)) j++;
        while (cp_at(f, j) == '\r' || cp_at(f, j) == '\n') j++;
        return j - i;
    }
    k = whitespace_run(f, i, 1);
    return k ? k : 1;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t next_gpt2(const struct frag *f, size_t i)
{
    size_t k = contraction(f, i, 0);
    if (k) return k;
    size_t s0 = (f->cp[i] == ' ' && i + 1 < f->n) ? i + 1 : i;
    unsigned cl = f->cls[s0];
    if (s0 == i + 1 && (cl & CLS_S)) s0 = i, cl = f->cls[i];
    if (cl & CLS_L) {
        size_t j = s0 + 1;
        while (cls_at(f, j) & CLS_L) j++;
        return j - i;
    }
    if (cl & CLS_N) {
        size_t j = s0 + 1;
        while (cls_at(f, j) & CLS_N) j++;
        return j - i;
    }
    if (is_other(f, s0)) {
        size_t j = s0 + 1;
        while (is_other(f, j)) j++;
        return j - i;
    }
    k = whitespace_run(f, i, 0);
    return k ? k : 1;
}

/* Digits(individual_digits) then GPT-2: each \p{N} is a piece of its own and
 * the regex runs on the text between digits (it cannot see across them). */
static size_t next_gpt2_digits(const struct frag *f, size_t i)
{
    if (f->cls[i] & CLS_N) return 1;
    size_t end = i;
    while (end < f->n && !(f->cls[end] & CLS_N)) end++;
    struct frag sub = *f;
    sub.n = end; /* the regex sees the segment's end as the end of text */
    return next_gpt2(&sub, i);
}

#define CLS_UP TP_UCLS_UPPERISH
#define CLS_LO TP_UCLS_LOWERISH

/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ at s: its end, or 0 when it
 * cannot match.  The greedy first part gives back characters until the
 * second can match: past a maximal upper run the match either continues
 * into a lower run or ends just after the run's last lower-class character. */
static size_t o200k_upper_lower(const struct frag *f, size_t s)
{
    size_t e = s;
    while (cls_at(f, e) & CLS_UP) e++;
    if (cls_at(f, e) & CLS_LO) {
        e++;
        while (cls_at(f, e) & CLS_LO) e++;
        return e;
    }
    while (e > s && !(f->cls[e - 1] & CLS_LO)) e--;
    return e > s ? e : 0;
}

/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* at s: its end, or 0. */
static size_t o200k_upper_then_lower(const struct frag *f, size_t s)
{
    if (!(cls_at(f, s) & CLS_UP)) return 0;
    size_t e = s + 1;
    while (cls_at(f, e) & CLS_UP) e++;
    while (cls_at(f, e) & CLS_LO) e++;
    return e;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at i: its length, or 0.  Case-insensitive
 * as Unicode simple case folding has it: U+017F (long s) matches 's' too. */
static size_t o200k_contraction(const struct frag *f, size_t i)
{
    if (cp_at(f, i) == '\'' && cp_at(f, i + 1) == 0x17F) return 2;
    return contraction(f, i, 1);
}

/*
 * o200k (tiktoken's o200k_base, the gpt-oss tokenizer.json):
 *   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
 *  |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
 *  |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * Backtracking order: each of the first two alternatives tries with the
 * optional leading character, then without it (which matters when that
 * character is a mark, itself in both letter-case classes).
 */
static size_t next_o200k(const struct frag *f, size_t i)
{
    uint32_t c = f->cp[i];
    unsigned cl = f->cls[i];
    int lead = c != '\r' && c != '\n' && !(cl & (CLS_L | CLS_N));
    for (int alt = 0; alt < 2; alt++) {
        for (int with_lead = lead; with_lead >= 0; with_lead--) {
            size_t s0 = i + (size_t)with_lead;
            size_t e = alt == 0 ? o200k_upper_lower(f, s0) : o200k_upper_then_lower(f, s0);
            if (e) return e + o200k_contraction(f, e) - i;
        }
    }
    /* \p{N}{1,3} */
    if (cl & CLS_N) {
        size_t j = i + 1;
        while (j - i < 3 && (cls_at(f, j) & CLS_N)) j++;
        return j - i;
    }
    /* ' '?[^\s\p{L}\p{N}]+[\r\n/]* */
    size_t s0 = (c == ' ' && is_other(f, i + 1)) ? i + 1 : i;
    if (is_other(f, s0)) {
        size_t j = s0 + 1;
        while (is_other(f, j)) j++;
        while (cp_at(f, j) == '\r' || cp_at(f, j) == '\n' || cp_at(f, j) == '/') j++;
        return j - i;
    }
    size_t k = whitespace_run(f, i, 1);
    return k ? k : 1;
}

/* Decode s[0..len) into the scratch code point arrays (classes per the
 * tokenizer's pre-tokenizer).  Returns the fragment, n = SIZE_MAX on OOM. */
static struct frag decode_fragment(const struct tp_tokenizer *t, struct tp_tok_scratch *sc, const char *s, size_t len)
{
    struct frag f = {NULL, NULL, NULL, (size_t)-1};
    if (grow((void **)&sc->cps, &sc->cap_cps, len + 1, sizeof(uint32_t))) return f;
    /* cls and offs follow cap_cps: reallocate them to the same capacity */
    uint8_t *cls = realloc(sc->cls, sc->cap_cps);
    if (!cls) return f;
    sc->cls = cls;
    uint32_t *offs = realloc(sc->offs, (sc->cap_cps + 1) * sizeof(uint32_t));
    if (!offs) return f;
    sc->offs = offs;
    int cased = t->pretok == TP_PRETOK_O200K;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = tp_utf8_decode((const unsigned char *)s + i, len - i, &cp);
        if (k == 0) { /* cannot happen: input validated; treat the byte as other */
            cp = 0xFFFD;
            k = 1;
        }
        sc->cps[n] = cp;
        sc->cls[n] = (uint8_t)(cased ? tp_unicode_class_cased(cp) : tp_unicode_class(cp));
        sc->offs[n] = (uint32_t)i;
        n++;
        i += (size_t)k;
    }
    sc->offs[n] = (uint32_t)len;
    f.cp = sc->cps;
    f.cls = sc->cls;
    f.off = sc->offs;
    f.n = n;
    return f;
}

/* Length in code points of the pre-token at i. */
static size_t next_pretoken(const struct tp_tokenizer *t, const struct frag *f, size_t i)
{
    switch (t->pretok) {
    case TP_PRETOK_LLAMA3: return next_llama3(f, i, 3);
    case TP_PRETOK_QWEN2: return next_llama3(f, i, 1);
    case TP_PRETOK_GPT2_DIGITS: return next_gpt2_digits(f, i);
    case TP_PRETOK_O200K: return next_o200k(f, i);
    default: return next_gpt2(f, i);
    }
}

int tp_tok_pretokenize(const struct tp_tokenizer *t, struct tp_tok_scratch *sc, const char *s, size_t len,
                       uint32_t *ends, size_t max_ends, size_t *n_ends)
{
    *n_ends = 0;
    if (t->kind != TP_TOK_BPE) return -1;
    struct frag f = decode_fragment(t, sc, s, len);
    if (f.n == (size_t)-1) return -1;
    for (size_t i = 0; i < f.n;) {
        i += next_pretoken(t, &f, i);
        if (*n_ends < max_ends) ends[*n_ends] = f.off[i];
        (*n_ends)++;
    }
    return 0;
}

static int encode_byte_level(const struct tp_tokenizer *t, struct tp_tok_scratch *sc, const char *s, size_t len,
                             struct tp_tok_out *out)
{
    struct frag f = decode_fragment(t, sc, s, len);
    if (f.n == (size_t)-1) return -1;
    for (size_t i = 0; i < f.n;) {
        size_t k = next_pretoken(t, &f, i);
        if (tp_tok_bpe_word(t, sc, s + f.off[i], f.off[i + k] - f.off[i], out) != 0) return -1;
        i += k;
    }
    return 0;
}

int tp_tok_encode_fragment(const struct tp_tokenizer *t, struct tp_tok_scratch *sc, const char *s, size_t len,
                           int at_start, struct tp_tok_out *out)
{
    if (len == 0) return 0;
    if (t->kind == TP_TOK_BPE) {
        if (t->pretok == TP_PRETOK_QWEN2) {
            char *norm;
            size_t nl;
            if (tp_unicode_nfc(s, len, &norm, &nl) != 0) return -1;
            int rc = encode_byte_level(t, sc, norm, nl, out);
            free(norm);
            return rc;
        }
        return encode_byte_level(t, sc, s, len, out);
    }
    /* SentencePiece: optional prefix space, spaces -> U+2581, one word */
    if (grow((void **)&sc->buf, &sc->cap_buf, len * 3 + 4, 1)) return -1;
    size_t o = 0;
    int prefix = 0;
    switch (t->add_space_prefix) {
    case 1: prefix = 1; break;                     /* llama.cpp: input start and after specials */
    case 2: prefix = at_start && s[0] != ' '; break; /* HF Metaspace "first" */
    case 3: prefix = s[0] != ' '; break;          /* HF Metaspace "always" */
    default: break;
    }
    if (prefix) {
        memcpy(sc->buf, "\xE2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(sc->buf + o, "\xE2\x96\x81", 3);
            o += 3;
        } else {
            sc->buf[o++] = s[i];
        }
    }
    return tp_tok_bpe_word(t, sc, sc->buf, o, out);
}

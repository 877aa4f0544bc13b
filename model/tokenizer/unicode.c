/*
 * model/tokenizer/unicode.c - UTF-8, general categories, NFC and the GPT-2 byte map
 * for the tokenizers (see unicode_impl.h).  Lookups are binary searches over
 * the generated range tables with an ASCII fast path; NFC is the standard
 * decompose / canonical-order / compose algorithm with Hangul done
 * arithmetically.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/unicode_impl.h"

enum tp_ucat tp_unicode_category(uint32_t cp)
{
    if (cp >= 0x110000) return TP_UCAT_CN;
    int lo = 0, hi = tp_ucat_n - 1;
    while (lo < hi) { /* last start <= cp */
        int mid = (lo + hi + 1) / 2;
        if (tp_ucat_start[mid] <= cp) lo = mid;
        else hi = mid - 1;
    }
    return (enum tp_ucat)tp_ucat_id[lo];
}

static int is_white_space(uint32_t cp)
{
    /* Unicode White_Space property (PropList.txt); stable since Unicode 6. */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static unsigned class_of_cat(enum tp_ucat c)
{
    switch (c) {
    case TP_UCAT_LU: case TP_UCAT_LL: case TP_UCAT_LT: case TP_UCAT_LM: case TP_UCAT_LO:
        return TP_UCLS_LETTER;
    case TP_UCAT_ND: case TP_UCAT_NL: case TP_UCAT_NO:
        return TP_UCLS_NUMBER;
    case TP_UCAT_PC: case TP_UCAT_PD: case TP_UCAT_PS: case TP_UCAT_PE: case TP_UCAT_PI: case TP_UCAT_PF:
    case TP_UCAT_PO:
        return TP_UCLS_PUNCT;
    case TP_UCAT_SM: case TP_UCAT_SC: case TP_UCAT_SK: case TP_UCAT_SO:
        return TP_UCLS_SYMBOL;
    case TP_UCAT_MN: case TP_UCAT_MC: case TP_UCAT_ME:
        return TP_UCLS_MARK;
    default:
        return 0;
    }
}

/* ASCII without a table lookup (and without lazily built state). */
static unsigned ascii_class(uint32_t c)
{
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return TP_UCLS_LETTER;
    if (c >= '0' && c <= '9') return TP_UCLS_NUMBER;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return TP_UCLS_SPACE;
    if (c < 0x20 || c == 0x7F) return 0; /* Cc */
    switch (c) {
    case '$': case '+': case '<': case '=': case '>': case '^': case '`': case '|': case '~':
        return TP_UCLS_SYMBOL; /* Sc, Sm, Sk */
    default:
        return TP_UCLS_PUNCT;
    }
}

unsigned tp_unicode_class(uint32_t cp)
{
    if (cp < 128) return ascii_class(cp);
    return class_of_cat(tp_unicode_category(cp)) | (is_white_space(cp) ? TP_UCLS_SPACE : 0u);
}

unsigned tp_unicode_class_cased(uint32_t cp)
{
    if (cp < 128) {
        if (cp >= 'A' && cp <= 'Z') return TP_UCLS_LETTER | TP_UCLS_UPPERISH;
        if (cp >= 'a' && cp <= 'z') return TP_UCLS_LETTER | TP_UCLS_LOWERISH;
        return ascii_class(cp);
    }
    enum tp_ucat c = tp_unicode_category(cp);
    unsigned k = class_of_cat(c) | (is_white_space(cp) ? TP_UCLS_SPACE : 0u);
    switch (c) {
    case TP_UCAT_LU: case TP_UCAT_LT: k |= TP_UCLS_UPPERISH; break;
    case TP_UCAT_LL: k |= TP_UCLS_LOWERISH; break;
    case TP_UCAT_LM: case TP_UCAT_LO: case TP_UCAT_MN: case TP_UCAT_MC: case TP_UCAT_ME:
        k |= TP_UCLS_UPPERISH | TP_UCLS_LOWERISH;
        break;
    default: break;
    }
    return k;
}

int tp_unicode_ccc(uint32_t cp)
{
    if (cp < 0x300) return 0;
    int lo = 0, hi = tp_uccc_n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < tp_uccc[mid].start) hi = mid - 1;
        else if (cp > tp_uccc[mid].end) lo = mid + 1;
        else return tp_uccc[mid].ccc;
    }
    return 0;
}

/* ------------------------------------------------------------------ UTF-8 */

int tp_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
    if (len == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int n;
    uint32_t v;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; v = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3; v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4; v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (len < (size_t)n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    v = (v << 6) | (s[1] & 0x3F);
    for (int i = 2; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return n;
}

int tp_utf8_check_prefix(const unsigned char *s, size_t len)
{
    if (len == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) return 0;
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 1;
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= len) return -i; /* valid so far, incomplete */
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) return i; /* maximal subpart of i bytes */
    }
    return 0;
}

int tp_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int tp_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int n = tp_utf8_decode(p + i, len - i, &cp);
        if (n == 0) return 0;
        i += (size_t)n;
    }
    return 1;
}

/* ------------------------------------------------------------------ NFC */

#define HANGUL_SBASE 0xAC00u
#define HANGUL_LBASE 0x1100u
#define HANGUL_VBASE 0x1161u
#define HANGUL_TBASE 0x11A7u
#define HANGUL_LCOUNT 19u
#define HANGUL_VCOUNT 21u
#define HANGUL_TCOUNT 28u
#define HANGUL_NCOUNT (HANGUL_VCOUNT * HANGUL_TCOUNT)
#define HANGUL_SCOUNT (HANGUL_LCOUNT * HANGUL_NCOUNT)

static const struct tp_udecomp *find_decomp(uint32_t cp)
{
    int lo = 0, hi = tp_udecomp_n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (tp_udecomp[mid].cp < cp) lo = mid + 1;
        else if (tp_udecomp[mid].cp > cp) hi = mid - 1;
        else return &tp_udecomp[mid];
    }
    return NULL;
}

static uint32_t compose_pair(uint32_t a, uint32_t b)
{
    if (a >= HANGUL_LBASE && a < HANGUL_LBASE + HANGUL_LCOUNT && b >= HANGUL_VBASE &&
        b < HANGUL_VBASE + HANGUL_VCOUNT)
        return HANGUL_SBASE + ((a - HANGUL_LBASE) * HANGUL_VCOUNT + (b - HANGUL_VBASE)) * HANGUL_TCOUNT;
    if (a >= HANGUL_SBASE && a < HANGUL_SBASE + HANGUL_SCOUNT && (a - HANGUL_SBASE) % HANGUL_TCOUNT == 0 &&
        b > HANGUL_TBASE && b < HANGUL_TBASE + HANGUL_TCOUNT)
        return a + (b - HANGUL_TBASE);
    uint64_t key = ((uint64_t)a << 21) | b;
    int lo = 0, hi = tp_ucomp_n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (tp_ucomp[mid].key < key) lo = mid + 1;
        else if (tp_ucomp[mid].key > key) hi = mid - 1;
        else return tp_ucomp[mid].cp;
    }
    return 0;
}

/* Nonzero if cp may change under NFC or combine with a neighbour. */
static int nfc_unsafe(uint32_t cp)
{
    if (cp < 0x300) return 0;
    int lo = 0, hi = tp_unfc_unsafe_n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < tp_unfc_unsafe[mid][0]) hi = mid - 1;
        else if (cp > tp_unfc_unsafe[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

int tp_unicode_nfc(const char *in, size_t len, char **out, size_t *out_len)
{
    const unsigned char *p = (const unsigned char *)in;
    int stable = 1; /* quick check: no code point that NFC could touch */
    for (size_t i = 0; i < len && stable;) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = tp_utf8_decode(p + i, len - i, &cp);
        if (k == 0) return -1;
        if (nfc_unsafe(cp)) stable = 0;
        i += (size_t)k;
    }
    if (stable) {
        char *o = malloc(len + 1);
        if (!o) return -1;
        memcpy(o, in, len);
        o[len] = 0;
        *out = o;
        *out_len = len;
        return 0;
    }
    /* Decomposition expands at most 18x per code point (table max); a code
     * point takes >= 1 byte, so len * 18 code points bounds the buffer. */
    size_t cap = len * 18 + 4;
    uint32_t *cps = malloc(cap * sizeof(uint32_t));
    char *o = NULL;
    int rc = -1;
    if (!cps) goto out;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = tp_utf8_decode(p + i, len - i, &cp);
        if (k == 0) goto out;
        i += (size_t)k;
        if (cp >= HANGUL_SBASE && cp < HANGUL_SBASE + HANGUL_SCOUNT) {
            uint32_t s = cp - HANGUL_SBASE;
            cps[n++] = HANGUL_LBASE + s / HANGUL_NCOUNT;
            cps[n++] = HANGUL_VBASE + (s % HANGUL_NCOUNT) / HANGUL_TCOUNT;
            if (s % HANGUL_TCOUNT) cps[n++] = HANGUL_TBASE + s % HANGUL_TCOUNT;
            continue;
        }
        const struct tp_udecomp *d = cp >= 0xC0 ? find_decomp(cp) : NULL;
        if (d) {
            for (int j = 0; j < d->n; j++) cps[n++] = tp_udecomp_data[d->off + (uint32_t)j];
        } else {
            cps[n++] = cp;
        }
    }
    /* canonical ordering: stable insertion sort of each run of non-starters */
    for (size_t i = 1; i < n; i++) {
        int c = tp_unicode_ccc(cps[i]);
        if (c == 0) continue;
        size_t j = i;
        uint32_t v = cps[i];
        while (j > 0) {
            int pc = tp_unicode_ccc(cps[j - 1]);
            if (pc == 0 || pc <= c) break;
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = v;
    }
    /* canonical composition: a character combines with the last starter
     * unless blocked (an uncombined character between them with ccc 0 or
     * ccc >= its own); last_ccc is -1 when nothing lies between. */
    size_t w = 0;
    long starter = -1; /* output index of the last starter */
    int last_ccc = -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = cps[i];
        int c = tp_unicode_ccc(cp);
        if (starter >= 0 && last_ccc < c) {
            uint32_t comp = compose_pair(cps[starter], cp);
            if (comp) {
                cps[starter] = comp;
                continue;
            }
        }
        if (c == 0) {
            starter = (long)w;
            last_ccc = -1;
        } else {
            last_ccc = c;
        }
        cps[w++] = cp;
    }
    o = malloc(w * 4 + 1);
    if (!o) goto out;
    size_t ol = 0;
    for (size_t i = 0; i < w; i++) ol += (size_t)tp_utf8_encode(cps[i], o + ol);
    o[ol] = 0;
    *out = o;
    *out_len = ol;
    o = NULL;
    rc = 0;
out:
    free(o);
    free(cps);
    return rc;
}

void tp_unicode_gpt2_byte_map(uint32_t byte_to_cp[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

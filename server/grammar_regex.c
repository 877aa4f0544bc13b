/*
 * server/grammar_regex.c - JSON Schema `pattern` and `format` -> a DFA over
 * the characters of the generated string (grammar_regex.h).
 *
 * The pattern is parsed into a tree (ECMA-262 syntax: literals, '.',
 * classes, escapes \d \w \s \D \W \S, \t \n ..., \xHH, \uHHHH, groups
 * (...) (?:...) (?<name>...), alternation, quantifiers ? * + {m} {m,} {m,n}
 * (lazy ones match the same strings), '^' at the start and '$' at the end of
 * the pattern or of a top-level alternative), then a Thompson NFA, then a
 * DFA by subset construction.  JSON Schema patterns are not anchored: a
 * pattern matches a string that contains a match, so a side without its
 * anchor gets "any characters" added.  Refused with the construct named:
 * backreferences, lookahead / lookbehind, word boundaries, Unicode property
 * escapes, non-ASCII characters, malformed syntax.  A format is a fixed
 * pattern (the subset of each format's strings listed in
 * docs/structured-output.md).  The DFAs of pattern and format, and a
 * character counter for minLength / maxLength, are multiplied into one
 * automaton; states that cannot reach a match are dropped.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_regex.h"

#define MAX_TREE 8192   /* tree nodes of one pattern */
#define MAX_NFA 8192    /* NFA states of one pattern */
#define MAX_DFA 16384   /* DFA states (uint16 indices, TP_RX_DEAD excluded) */
#define MAX_REPEAT 1000 /* {m,n} bounds */
#define NW 5            /* 32-bit words of a set of TP_RX_SYMS symbols */

/* ------------------------------------------------------------ symbol sets */

struct cset {
    uint32_t w[NW];
};

static void cs_add(struct cset *s, int c) { s->w[c >> 5] |= 1u << (c & 31); }
static int cs_has(const struct cset *s, int c) { return (int)(s->w[c >> 5] >> (c & 31) & 1); }
static void cs_range(struct cset *s, int lo, int hi)
{
    for (int c = lo; c <= hi; c++) cs_add(s, c);
}
static void cs_or(struct cset *d, const struct cset *s)
{
    for (int i = 0; i < NW; i++) d->w[i] |= s->w[i];
}
static void cs_and(struct cset *d, const struct cset *s)
{
    for (int i = 0; i < NW; i++) d->w[i] &= s->w[i];
}
static void cs_not(struct cset *s) /* complement over the TP_RX_SYMS symbols */
{
    for (int i = 0; i < NW; i++) s->w[i] = ~s->w[i];
    s->w[NW - 1] &= 1u;
}

/* The characters a pattern string is generated from. */
static struct cset cs_generated(void)
{
    struct cset s;
    memset(&s, 0, sizeof s);
    cs_range(&s, 0x20, 0x7E);
    s.w['"' >> 5] &= ~(1u << ('"' & 31));
    s.w['\\' >> 5] &= ~(1u << ('\\' & 31));
    cs_add(&s, TP_RX_OTHER);
    return s;
}

/* \d \w \s and their complements (which hold every non-ASCII character). */
static void cs_escape_class(struct cset *s, int c)
{
    memset(s, 0, sizeof *s);
    switch (c | 0x20) {
    case 'd': cs_range(s, '0', '9'); break;
    case 'w':
        cs_range(s, '0', '9');
        cs_range(s, 'a', 'z');
        cs_range(s, 'A', 'Z');
        cs_add(s, '_');
        break;
    default: /* 's': the ASCII whitespace (the non-ASCII ones are never generated) */
        cs_range(s, 9, 13);
        cs_add(s, ' ');
        break;
    }
    if (c >= 'A' && c <= 'Z') cs_not(s);
}

/* ------------------------------------------------------------ the parser */

enum { X_SET, X_CAT, X_ALT, X_REP, X_EMPTY };

struct xnode {
    uint8_t kind;
    int a, b;         /* CAT / ALT: children; REP: a */
    int min, max;     /* REP: bounds, max -1: unbounded */
    struct cset set;  /* SET: the characters (generated ones only) */
};

struct rp {
    const char *s;
    size_t i, len;
    struct xnode *x; /* (MAX_TREE) */
    int n;
    int depth;
    struct cset gen; /* cs_generated() */
    char *err;
    size_t err_cap;
    int failed; /* -1 refused, -2 out of memory */
};

static int rfail(struct rp *r, const char *fmt, ...)
{
    if (!r->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, r->err_cap, fmt, ap);
        va_end(ap);
        r->failed = -1;
    }
    return -1;
}

static int xnew(struct rp *r, int kind, int a, int b)
{
    if (r->n >= MAX_TREE) return rfail(r, "pattern too large (more than %d parts)", MAX_TREE);
    struct xnode *x = &r->x[r->n];
    memset(x, 0, sizeof *x);
    x->kind = (uint8_t)kind;
    x->a = a;
    x->b = b;
    return r->n++;
}

static int xset(struct rp *r, const struct cset *s)
{
    int k = xnew(r, X_SET, -1, -1);
    if (k < 0) return -1;
    r->x[k].set = *s;
    cs_and(&r->x[k].set, &r->gen);
    return k;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
    return -1;
}

/* n hex digits at r->i (n 0: \u{...}); the value, or -1 (failed). */
static long parse_hex(struct rp *r, int n)
{
    long v = 0;
    int k = 0, braced = n == 0;
    if (braced) {
        if (r->i >= r->len || r->s[r->i] != '{') return rfail(r, "malformed '\\u' escape in pattern");
        r->i++;
    }
    while (r->i < r->len && (braced ? r->s[r->i] != '}' : k < n)) {
        int h = hexval((unsigned char)r->s[r->i]);
        if (h < 0 || k >= 6) return rfail(r, "malformed hex escape in pattern");
        v = v * 16 + h;
        k++;
        r->i++;
    }
    if (k == 0 || (!braced && k < n)) return rfail(r, "malformed hex escape in pattern");
    if (braced) {
        if (r->i >= r->len) return rfail(r, "malformed '\\u' escape in pattern");
        r->i++;
    }
    if (v > 0x7F) return rfail(r, "non-ASCII character U+%04lX in pattern (only ASCII characters are supported)", v);
    return v;
}

/* After a '\': a class escape (*code = -1, set filled) or one character
 * (*code, set = it).  0, or -1 (failed). */
static int parse_escape(struct rp *r, int in_class, struct cset *set, int *code)
{
    memset(set, 0, sizeof *set);
    *code = -1;
    if (r->i >= r->len) return rfail(r, "pattern ends with '\\'");
    const int c = (unsigned char)r->s[r->i++];
    long v = -1;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        cs_escape_class(set, c);
        return 0;
    case 't': v = 9; break;
    case 'n': v = 10; break;
    case 'v': v = 11; break;
    case 'f': v = 12; break;
    case 'r': v = 13; break;
    case '0':
        if (r->i < r->len && r->s[r->i] >= '0' && r->s[r->i] <= '9')
            return rfail(r, "backreference or octal escape '\\0%c' in pattern is not supported", r->s[r->i]);
        v = 0;
        break;
    case 'b':
        if (!in_class) return rfail(r, "word boundary '\\b' in pattern is not supported");
        v = 8;
        break;
    case 'B': return rfail(r, "word boundary '\\B' in pattern is not supported");
    case 'k': return rfail(r, "backreference '\\k' in pattern is not supported");
    case 'p': case 'P': return rfail(r, "Unicode property escape '\\%c' in pattern is not supported", c);
    case 'c': return rfail(r, "control escape '\\c' in pattern is not supported");
    case 'x': v = parse_hex(r, 2); break;
    case 'u':
        v = parse_hex(r, r->i < r->len && r->s[r->i] == '{' ? 0 : 4);
        break;
    default:
        if (c >= '1' && c <= '9') return rfail(r, "backreference '\\%c' in pattern is not supported", c);
        if (strchr("^$\\.*+?()[]{}|/", c) || (in_class && c == '-')) {
            v = c;
            break;
        }
        if (c >= 0x80) return rfail(r, "non-ASCII character in pattern (only ASCII characters are supported)");
        return rfail(r, "invalid escape '\\%c' in pattern", c);
    }
    if (v < 0) return -1;
    cs_add(set, (int)v);
    *code = (int)v;
    return 0;
}

/* One class member at r->i: *code the character or -1 for a class escape. */
static int class_atom(struct rp *r, struct cset *set, int *code)
{
    const int c = (unsigned char)r->s[r->i];
    if (c == '\\') {
        r->i++;
        return parse_escape(r, 1, set, code);
    }
    if (c >= 0x80) return rfail(r, "non-ASCII character in pattern (only ASCII characters are supported)");
    r->i++;
    memset(set, 0, sizeof *set);
    cs_add(set, c);
    *code = c;
    return 0;
}

static int parse_class(struct rp *r)
{
    r->i++; /* '[' */
    const int neg = r->i < r->len && r->s[r->i] == '^';
    if (neg) r->i++;
    struct cset set, a, b;
    memset(&set, 0, sizeof set);
    while (r->i < r->len && r->s[r->i] != ']') {
        int ca, cb;
        if (class_atom(r, &a, &ca) < 0) return -1;
        if (r->i + 1 < r->len && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            if (class_atom(r, &b, &cb) < 0) return -1;
            if (ca < 0 || cb < 0) return rfail(r, "class escape in a character range in pattern");
            if (ca > cb) return rfail(r, "character range out of order in pattern");
            cs_range(&set, ca, cb);
        } else {
            cs_or(&set, &a);
        }
    }
    if (r->i >= r->len) return rfail(r, "unterminated character class in pattern");
    r->i++;
    if (neg) cs_not(&set);
    return xset(r, &set);
}

static int parse_alt(struct rp *r, int top);

static int parse_group(struct rp *r)
{
    r->i++; /* '(' */
    if (r->i < r->len && r->s[r->i] == '?') {
        const char *p = r->s + r->i;
        size_t left = r->len - r->i;
        if (left >= 2 && p[1] == ':') {
            r->i += 2;
        } else if (left >= 3 && p[1] == '<' && p[2] != '=' && p[2] != '!') {
            const char *gt = memchr(p, '>', left);
            if (!gt) return rfail(r, "unterminated group name in pattern");
            r->i += (size_t)(gt - p) + 1;
        } else if (left >= 2 && (p[1] == '=' || p[1] == '!' || p[1] == '<')) {
            return rfail(r, "lookahead / lookbehind '(?%.*s' in pattern is not supported", p[1] == '<' ? 2 : 1, p + 1);
        } else {
            return rfail(r, "unsupported group '(?' in pattern");
        }
    }
    if (++r->depth > 64) return rfail(r, "pattern nested more than %d groups deep", 64);
    int k = parse_alt(r, 0);
    r->depth--;
    if (k < 0) return -1;
    if (r->i >= r->len || r->s[r->i] != ')') return rfail(r, "unterminated group in pattern");
    r->i++;
    return k;
}

static int parse_atom(struct rp *r)
{
    const int c = (unsigned char)r->s[r->i];
    struct cset set;
    int code;
    switch (c) {
    case '(': return parse_group(r);
    case '[': return parse_class(r);
    case '.':
        r->i++;
        cs_not(memset(&set, 0, sizeof set)); /* no line terminator is generated */
        return xset(r, &set);
    case '\\':
        r->i++;
        if (parse_escape(r, 0, &set, &code) < 0) return -1;
        return xset(r, &set);
    case '*': case '+': case '?': case '{':
        return rfail(r, "nothing to repeat before '%c' in pattern", c);
    case ']': case '}':
        return rfail(r, "lone '%c' in pattern", c);
    default:
        if (c >= 0x80) return rfail(r, "non-ASCII character in pattern (only ASCII characters are supported)");
        r->i++;
        memset(&set, 0, sizeof set);
        cs_add(&set, c);
        return xset(r, &set);
    }
}

static int parse_count(struct rp *r, int *v)
{
    int n = 0, k = 0;
    while (r->i < r->len && r->s[r->i] >= '0' && r->s[r->i] <= '9') {
        if (n <= MAX_REPEAT) n = n * 10 + (r->s[r->i] - '0');
        r->i++;
        k++;
    }
    *v = n;
    return k;
}

static int parse_quant(struct rp *r, int a)
{
    if (r->i >= r->len) return a;
    int mn, mx;
    switch (r->s[r->i]) {
    case '*': mn = 0, mx = -1; r->i++; break;
    case '+': mn = 1, mx = -1; r->i++; break;
    case '?': mn = 0, mx = 1; r->i++; break;
    case '{':
        r->i++;
        if (!parse_count(r, &mn)) return rfail(r, "malformed '{' quantifier in pattern");
        mx = mn;
        if (r->i < r->len && r->s[r->i] == ',') {
            r->i++;
            if (!parse_count(r, &mx)) mx = -1;
        }
        if (r->i >= r->len || r->s[r->i] != '}') return rfail(r, "malformed '{' quantifier in pattern");
        r->i++;
        break;
    default: return a;
    }
    if (mn > MAX_REPEAT || mx > MAX_REPEAT) return rfail(r, "repetition count above %d in pattern", MAX_REPEAT);
    if (mx >= 0 && mx < mn) return rfail(r, "quantifier range out of order in pattern");
    if (r->i < r->len && r->s[r->i] == '?') r->i++; /* lazy: the same strings */
    if (r->i < r->len && strchr("*+?{", r->s[r->i])) return rfail(r, "nothing to repeat before '%c' in pattern", r->s[r->i]);
    int k = xnew(r, X_REP, a, -1);
    if (k < 0) return -1;
    r->x[k].min = mn;
    r->x[k].max = mx;
    return k;
}

/* Any generated characters, any number of times (an unanchored side). */
static int any_star(struct rp *r)
{
    struct cset all;
    memset(&all, 0, sizeof all);
    cs_not(&all);
    int s = xset(r, &all);
    int k = s < 0 ? -1 : xnew(r, X_REP, s, -1);
    if (k >= 0) r->x[k].min = 0, r->x[k].max = -1;
    return k;
}

/* A sequence up to '|', ')' or the end; top: an alternative of the whole
 * pattern, where '^' may open and '$' may close it. */
static int parse_cat(struct rp *r, int top)
{
    int start = 0, end = 0;
    if (top && r->i < r->len && r->s[r->i] == '^') {
        r->i++;
        start = 1;
    }
    int k = xnew(r, X_EMPTY, -1, -1);
    while (k >= 0 && r->i < r->len && r->s[r->i] != '|' && r->s[r->i] != ')') {
        const char c = r->s[r->i];
        if (c == '$') {
            if (top && (r->i + 1 == r->len || r->s[r->i + 1] == '|')) {
                r->i++;
                end = 1;
                break;
            }
            return rfail(r, "anchor '$' before the end of the pattern or of a top-level alternative is not supported");
        }
        if (c == '^') return rfail(r, "anchor '^' after the start of the pattern or of a top-level alternative is not supported");
        int a = parse_atom(r);
        if (a >= 0) a = parse_quant(r, a);
        if (a < 0) return -1;
        k = xnew(r, X_CAT, k, a);
    }
    if (k >= 0 && top && !start) {
        int any = any_star(r);
        k = any < 0 ? -1 : xnew(r, X_CAT, any, k);
    }
    if (k >= 0 && top && !end) {
        int any = any_star(r);
        k = any < 0 ? -1 : xnew(r, X_CAT, k, any);
    }
    return k;
}

static int parse_alt(struct rp *r, int top)
{
    int k = parse_cat(r, top);
    while (k >= 0 && r->i < r->len && r->s[r->i] == '|') {
        r->i++;
        int b = parse_cat(r, top);
        k = b < 0 ? -1 : xnew(r, X_ALT, k, b);
    }
    return k;
}

/* ------------------------------------------------------------- the NFA */

struct nedge {
    int from, to;
    int x; /* tree node of the SET, -1: epsilon */
};

struct nfa {
    int n;
    struct nedge *e;
    int n_e, cap_e;
};

static int nstate(struct rp *r, struct nfa *m)
{
    if (m->n >= MAX_NFA) return rfail(r, "pattern too large (more than %d automaton states)", MAX_NFA);
    return m->n++;
}

static int nedge(struct rp *r, struct nfa *m, int from, int to, int x)
{
    if (m->n_e == m->cap_e) {
        int cap = m->cap_e ? 2 * m->cap_e : 64;
        struct nedge *e = realloc(m->e, (size_t)cap * sizeof *e);
        if (!e) {
            r->failed = -2;
            snprintf(r->err, r->err_cap, "out of memory");
            return -1;
        }
        m->e = e;
        m->cap_e = cap;
    }
    m->e[m->n_e].from = from;
    m->e[m->n_e].to = to;
    m->e[m->n_e].x = x;
    m->n_e++;
    return 0;
}

/* Thompson construction: edges for tree node x from state from; returns the
 * state where it ends (-1: failed).  Every loop goes through a fresh state. */
static int emit(struct rp *r, struct nfa *m, int x, int from)
{
    const struct xnode *n = &r->x[x];
    switch (n->kind) {
    case X_EMPTY: return from;
    case X_SET: {
        int t = nstate(r, m);
        return t < 0 || nedge(r, m, from, t, x) < 0 ? -1 : t;
    }
    case X_CAT: {
        int mid = emit(r, m, n->a, from);
        return mid < 0 ? -1 : emit(r, m, n->b, mid);
    }
    case X_ALT: {
        int t = nstate(r, m), e1 = t < 0 ? -1 : emit(r, m, n->a, from), e2 = e1 < 0 ? -1 : emit(r, m, n->b, from);
        if (e2 < 0 || nedge(r, m, e1, t, -1) < 0 || nedge(r, m, e2, t, -1) < 0) return -1;
        return t;
    }
    default: { /* X_REP */
        int cur = from;
        for (int i = 0; i < n->min && cur >= 0; i++) cur = emit(r, m, n->a, cur);
        if (cur < 0) return -1;
        if (n->max < 0) {
            int s = nstate(r, m);
            if (s < 0 || nedge(r, m, cur, s, -1) < 0) return -1;
            int e = emit(r, m, n->a, s);
            return e < 0 || nedge(r, m, e, s, -1) < 0 ? -1 : s;
        }
        for (int i = n->min; i < n->max; i++) {
            int t = nstate(r, m), e = t < 0 ? -1 : emit(r, m, n->a, cur);
            if (e < 0 || nedge(r, m, cur, t, -1) < 0 || nedge(r, m, e, t, -1) < 0) return -1;
            cur = t;
        }
        return cur;
    }
    }
}

/* ----------------------------------------------------- subset construction */

/* Symbol classes: symbols that every SET of the tree holds or lacks alike. */
static int make_classes(const struct rp *r, uint8_t *cls)
{
    int n_cls = 1;
    memset(cls, 0, TP_RX_SYMS);
    for (int x = 0; x < r->n; x++) {
        if (r->x[x].kind != X_SET) continue;
        int map[2 * TP_RX_SYMS];
        for (int i = 0; i < 2 * n_cls; i++) map[i] = -1;
        int n_new = 0;
        for (int c = 0; c < TP_RX_SYMS; c++) {
            int key = cls[c] * 2 + cs_has(&r->x[x].set, c);
            if (map[key] < 0) map[key] = n_new++;
            cls[c] = (uint8_t)map[key];
        }
        n_cls = n_new;
    }
    return n_cls;
}

struct subset {
    int words;       /* uint64 words of an NFA state set */
    uint64_t *sets;  /* (n, words) */
    int n, cap;
    int *hash;       /* (hcap): DFA state + 1, 0 empty */
    int hcap;
};

static uint64_t set_hash(const uint64_t *s, int words)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < words; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

/* The DFA state of NFA set s (added when new); -1 too many, -2 out of memory. */
static int subset_get(struct subset *d, const uint64_t *s)
{
    size_t nb = (size_t)d->words * sizeof *s;
    for (size_t h = set_hash(s, d->words) & (size_t)(d->hcap - 1);; h = (h + 1) & (size_t)(d->hcap - 1)) {
        int k = d->hash[h] - 1;
        if (k < 0) {
            if (d->n >= MAX_DFA) return -1;
            if (d->n == d->cap) {
                int cap = d->cap ? 2 * d->cap : 64;
                uint64_t *ns = realloc(d->sets, (size_t)cap * nb);
                if (!ns) return -2;
                d->sets = ns;
                d->cap = cap;
            }
            memcpy(d->sets + (size_t)d->n * (size_t)d->words, s, nb);
            d->hash[h] = d->n + 1;
            return d->n++;
        }
        if (memcmp(d->sets + (size_t)k * (size_t)d->words, s, nb) == 0) return k;
    }
}

/* Epsilon closure of s in place (stack: n_nfa ints). */
static void closure(const struct nfa *m, const int *first, const int *order, uint64_t *s, int *stack)
{
    int sp = 0;
    for (int q = 0; q < m->n; q++)
        if (s[q >> 6] >> (q & 63) & 1) stack[sp++] = q;
    while (sp > 0) {
        int q = stack[--sp];
        for (int k = first[q]; k < first[q + 1]; k++) {
            const struct nedge *e = &m->e[order[k]];
            if (e->x < 0 && !(s[e->to >> 6] >> (e->to & 63) & 1)) {
                s[e->to >> 6] |= (uint64_t)1 << (e->to & 63);
                stack[sp++] = e->to;
            }
        }
    }
}

/* The DFA of the tree rooted at root into out (no dist; dead states kept). */
static int build_dfa(struct rp *r, int root, struct tp_rx *out)
{
    struct nfa m;
    memset(&m, 0, sizeof m);
    struct subset d;
    memset(&d, 0, sizeof d);
    int *first = NULL, *order = NULL, *stack = NULL, rc = -1;
    uint64_t *cur = NULL;
    int start = nstate(r, &m), fin = start < 0 ? -1 : emit(r, &m, root, start);
    if (fin < 0) goto out;
    out->n_cls = make_classes(r, out->cls);
    int rep[TP_RX_SYMS]; /* a symbol of each class */
    for (int c = TP_RX_SYMS - 1; c >= 0; c--) rep[out->cls[c]] = c;
    first = calloc((size_t)m.n + 1, sizeof *first);
    order = malloc(((size_t)m.n_e + 1) * sizeof *order);
    stack = malloc(((size_t)m.n + 1) * sizeof *stack);
    d.words = (m.n + 63) / 64;
    d.hcap = 2 * MAX_DFA;
    d.hash = calloc((size_t)d.hcap, sizeof *d.hash);
    cur = malloc((size_t)d.words * sizeof *cur);
    if (!first || !order || !stack || !d.hash || !cur) goto nomem;
    for (int k = 0; k < m.n_e; k++) first[m.e[k].from + 1]++;
    for (int q = 0; q < m.n; q++) first[q + 1] += first[q];
    {
        int *fill = stack; /* scratch before the closures */
        memcpy(fill, first, (size_t)m.n * sizeof *fill);
        for (int k = 0; k < m.n_e; k++) order[fill[m.e[k].from]++] = k;
    }
    memset(cur, 0, (size_t)d.words * sizeof *cur);
    cur[0] = 1; /* state 0 */
    closure(&m, first, order, cur, stack);
    if (subset_get(&d, cur) < 0) goto nomem;
    size_t cap = 0;
    for (int i = 0; i < d.n; i++) {
        if ((size_t)d.n * (size_t)out->n_cls > cap) {
            cap = 2 * (size_t)(d.n > 64 ? d.n : 64) * (size_t)out->n_cls;
            uint16_t *nx = realloc(out->next, cap * sizeof *nx);
            if (!nx) goto nomem;
            out->next = nx;
        }
        for (int c = 0; c < out->n_cls; c++) {
            memset(cur, 0, (size_t)d.words * sizeof *cur);
            int any = 0;
            const uint64_t *src = d.sets + (size_t)i * (size_t)d.words;
            for (int q = 0; q < m.n; q++) {
                if (!(src[q >> 6] >> (q & 63) & 1)) continue;
                for (int k = first[q]; k < first[q + 1]; k++) {
                    const struct nedge *e = &m.e[order[k]];
                    if (e->x >= 0 && cs_has(&r->x[e->x].set, rep[c])) {
                        cur[e->to >> 6] |= (uint64_t)1 << (e->to & 63);
                        any = 1;
                    }
                }
            }
            int t = TP_RX_DEAD;
            if (any) {
                closure(&m, first, order, cur, stack);
                t = subset_get(&d, cur);
                if (t == -1) {
                    rfail(r, "pattern too complex (more than %d automaton states)", MAX_DFA);
                    goto out;
                }
                if (t < 0) goto nomem;
            }
            out->next[(size_t)i * (size_t)out->n_cls + (size_t)c] = (uint16_t)t;
        }
    }
    out->n_states = d.n;
    out->accept = malloc((size_t)(d.n > 0 ? d.n : 1));
    if (!out->accept) goto nomem;
    for (int i = 0; i < d.n; i++) out->accept[i] = (uint8_t)(d.sets[(size_t)i * (size_t)d.words + (size_t)(fin >> 6)] >> (fin & 63) & 1);
    rc = 0;
    goto out;
nomem:
    r->failed = -2;
    snprintf(r->err, r->err_cap, "out of memory");
out:
    free(m.e);
    free(d.sets);
    free(d.hash);
    free(first);
    free(order);
    free(stack);
    free(cur);
    return rc;
}

/* ------------------------------------------------- formats and the product */

#define RX_DATE                                                                                                        \
    "\\d{4}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1\\d|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
#define RX_TIME "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
#define RX_LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define RX_OCTET "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"

static const struct {
    const char *name, *pattern;
} formats[] = {
    {"date", "^" RX_DATE "$"},
    {"time", "^" RX_TIME "$"},
    {"date-time", "^" RX_DATE "T" RX_TIME "$"},
    {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
    {"email", "^[A-Za-z0-9_+-]+(?:\\.[A-Za-z0-9_+-]+)*@" RX_LABEL "(?:\\." RX_LABEL ")*\\.[A-Za-z]{2,63}$"},
    {"ipv4", "^" RX_OCTET "(?:\\." RX_OCTET "){3}$"},
    {"ipv6", "^[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){7}$"},
};

/* One pattern's DFA: 0, or -1 / -2 (r->failed, message in r->err). */
static int pattern_dfa(struct rp *r, const char *pattern, struct tp_rx *out)
{
    r->s = pattern;
    r->len = strlen(pattern);
    r->i = 0;
    r->n = 0;
    r->depth = 0;
    int root = parse_alt(r, 1);
    if (root >= 0 && r->i < r->len) root = rfail(r, "unmatched ')' in pattern");
    if (root < 0 || build_dfa(r, root, out) < 0) return r->failed ? r->failed : -1;
    return 0;
}

struct triple {
    uint16_t a, b;
    int32_t k;
};

/* A product state's index (added when new); -1 too many, -2 out of memory. */
static int triple_get(struct triple **st, int *n, int *cap, int *hash, int hcap, struct triple t)
{
    uint64_t h0 = ((uint64_t)t.a * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)t.b * 0xC2B2AE3D27D4EB4Full) ^
                  ((uint64_t)(uint32_t)t.k * 0x165667B19E3779F9ull);
    for (size_t h = (size_t)(h0 ^ (h0 >> 29)) & (size_t)(hcap - 1);; h = (h + 1) & (size_t)(hcap - 1)) {
        int k = hash[h] - 1;
        if (k < 0) {
            if (*n >= MAX_DFA) return -1;
            if (*n == *cap) {
                int nc = *cap ? 2 * *cap : 64;
                struct triple *ns = realloc(*st, (size_t)nc * sizeof *ns);
                if (!ns) return -2;
                *st = ns;
                *cap = nc;
            }
            (*st)[*n] = t;
            hash[h] = *n + 1;
            return (*n)++;
        }
        if ((*st)[k].a == t.a && (*st)[k].b == t.b && (*st)[k].k == t.k) return k;
    }
}

/* Bytes of the shortest character of class c: 1 when it holds an ASCII one. */
static int class_bytes(const struct tp_rx *d, int c)
{
    for (int s = 0; s < TP_RX_OTHER; s++)
        if (d->cls[s] == c) return 1;
    return 2;
}

/* The product automaton of product() while it is built. */
struct prod {
    const struct tp_rx *a, *b; /* b may be NULL */
    int mn, mx, counting;      /* the character counter: minimum, maximum (-1: none), whether it counts */
    int n_cls;                 /* classes of the product: a byte's (a class, b class) pair */
    int rep[TP_RX_SYMS];       /* (n_cls) a byte of each class */
    struct triple *st;         /* (n) the states: (a state, b state, characters counted) */
    int n, cap;
    uint16_t *next;            /* (n, n_cls) transitions, TP_RX_DEAD where a, b or the counter dies */
    int32_t *dist;             /* (n) bytes of the shortest completion; INT32_MAX: none */
};

/* out->cls, out->n_cls and P->rep: one class per (a class, b class) pair that some byte has.  0 or -2. */
static int prod_classes(struct prod *P, struct tp_rx *out)
{
    const struct tp_rx *a = P->a, *b = P->b;
    int *pmap = malloc((size_t)a->n_cls * (size_t)(b ? b->n_cls : 1) * sizeof *pmap);
    if (!pmap) return -2;
    for (int i = 0; i < a->n_cls * (b ? b->n_cls : 1); i++) pmap[i] = -1;
    P->n_cls = 0;
    for (int s = 0; s < TP_RX_SYMS; s++) {
        int key = a->cls[s] * (b ? b->n_cls : 1) + (b ? b->cls[s] : 0);
        if (pmap[key] < 0) {
            P->rep[P->n_cls] = s;
            pmap[key] = P->n_cls++;
        }
        out->cls[s] = (uint8_t)pmap[key];
    }
    out->n_cls = P->n_cls;
    free(pmap);
    return 0;
}

/* P->st, P->n and P->next: the product states reachable from (0, 0, 0), breadth first.  0, -1 (too many
 * states: r->err), -2 out of memory. */
static int prod_explore(struct rp *r, struct prod *P)
{
    const int n_cls = P->n_cls, mn = P->mn, mx = P->mx;
    int rc = -2;
    int *hash = calloc(2 * MAX_DFA, sizeof *hash);
    if (!hash) return -2;
    struct triple t0 = {0, 0, 0};
    if (triple_get(&P->st, &P->n, &P->cap, hash, 2 * MAX_DFA, t0) < 0) goto out;
    size_t ncap = 0;
    for (int i = 0; i < P->n; i++) {
        if ((size_t)P->n * (size_t)n_cls > ncap) {
            ncap = 2 * (size_t)(P->n > 64 ? P->n : 64) * (size_t)n_cls;
            uint16_t *nx = realloc(P->next, ncap * sizeof *nx);
            if (!nx) goto out;
            P->next = nx;
        }
        const struct triple cur = P->st[i];
        for (int c = 0; c < n_cls; c++) {
            const int s = P->rep[c];
            unsigned na = tp_rx_step(P->a, cur.a, s), nb = P->b ? tp_rx_step(P->b, cur.b, s) : 0;
            int nk = cur.k;
            if (P->counting) nk = mx >= 0 ? (cur.k < mx ? cur.k + 1 : -1) : (cur.k < mn ? cur.k + 1 : mn);
            int t = TP_RX_DEAD;
            if (na != TP_RX_DEAD && nb != TP_RX_DEAD && nk >= 0) {
                struct triple nt = {(uint16_t)na, (uint16_t)nb, nk};
                t = triple_get(&P->st, &P->n, &P->cap, hash, 2 * MAX_DFA, nt);
                if (t == -1) {
                    rc = rfail(r, "pattern with minLength / maxLength too complex (more than %d automaton states)", MAX_DFA);
                    goto out;
                }
                if (t < 0) goto out;
            }
            P->next[(size_t)i * (size_t)n_cls + (size_t)c] = (uint16_t)t;
        }
    }
    rc = 0;
out:
    free(hash);
    return rc;
}

/* Whether product state q accepts: a and b accept, and the counter has reached the minimum. */
static int prod_accepting(const struct prod *P, int q)
{
    const struct triple *t = &P->st[q];
    return P->a->accept[t->a] && (!P->b || P->b->accept[t->b]) && t->k >= P->mn;
}

/* The heap of (dist, state) pairs of prod_dist: heap[2 i], heap[2 i + 1]; *hn entries. */
static void heap_pop(int *heap, int *hn)
{
    (*hn)--;
    heap[0] = heap[2 * *hn];
    heap[1] = heap[2 * *hn + 1];
    for (int i = 0;;) {
        int l = 2 * i + 1, rr = l + 1, m = i;
        if (l < *hn && heap[2 * l] < heap[2 * m]) m = l;
        if (rr < *hn && heap[2 * rr] < heap[2 * m]) m = rr;
        if (m == i) break;
        int t0d = heap[2 * i], t0q = heap[2 * i + 1];
        heap[2 * i] = heap[2 * m], heap[2 * i + 1] = heap[2 * m + 1];
        heap[2 * m] = t0d, heap[2 * m + 1] = t0q;
        i = m;
    }
}

static void heap_push(int *heap, int *hn, int d, int q)
{
    int i = (*hn)++;
    heap[2 * i] = d, heap[2 * i + 1] = q;
    while (i > 0 && heap[2 * ((i - 1) / 2)] > heap[2 * i]) {
        int pi = (i - 1) / 2, td = heap[2 * pi], tq = heap[2 * pi + 1];
        heap[2 * pi] = heap[2 * i], heap[2 * pi + 1] = heap[2 * i + 1];
        heap[2 * i] = td, heap[2 * i + 1] = tq;
        i = pi;
    }
}

/* P->dist: the reverse edges, then the shortest completion of every state in bytes (Dijkstra from the
 * accepting states over out's classes; INT32_MAX: cannot reach one).  0 or -2. */
static int prod_dist(struct prod *P, const struct tp_rx *out)
{
    const int n = P->n, n_cls = P->n_cls;
    int rc = -2;
    int *rfirst = calloc((size_t)n + 1, sizeof *rfirst);
    int *radj = malloc(((size_t)n * (size_t)n_cls + 1) * sizeof *radj);
    int *heap = malloc(((size_t)n * (size_t)n_cls + (size_t)n + 1) * 2 * sizeof *heap);
    int *fill = malloc((size_t)n * sizeof *fill);
    P->dist = malloc((size_t)n * sizeof *P->dist);
    if (!rfirst || !radj || !P->dist || !heap || !fill) goto out;
    const uint16_t *next = P->next;
    for (size_t e = 0; e < (size_t)n * (size_t)n_cls; e++)
        if (next[e] != TP_RX_DEAD) rfirst[next[e] + 1]++;
    for (int q = 0; q < n; q++) rfirst[q + 1] += rfirst[q];
    memcpy(fill, rfirst, (size_t)n * sizeof *fill);
    for (size_t e = 0; e < (size_t)n * (size_t)n_cls; e++)
        if (next[e] != TP_RX_DEAD) radj[fill[next[e]]++] = (int)e; /* e = from * n_cls + class */
    int hn = 0;
    for (int q = 0; q < n; q++) {
        const int acc = prod_accepting(P, q);
        P->dist[q] = acc ? 0 : INT32_MAX;
        if (acc) heap_push(heap, &hn, 0, q);
    }
    int cb[TP_RX_SYMS];
    for (int c = 0; c < n_cls; c++) cb[c] = class_bytes(out, c);
    while (hn > 0) {
        int d0 = heap[0], q = heap[1];
        heap_pop(heap, &hn);
        if (d0 > P->dist[q]) continue;
        for (int k = rfirst[q]; k < rfirst[q + 1]; k++) {
            const int p = radj[k] / n_cls, c = radj[k] % n_cls, nd = d0 + cb[c];
            if (nd >= P->dist[p]) continue;
            P->dist[p] = nd;
            heap_push(heap, &hn, nd, p);
        }
    }
    rc = 0;
out:
    free(rfirst);
    free(radj);
    free(heap);
    free(fill);
    return rc;
}

/* out's states, transitions, accept and dist: the live states of P (those with a completion), numbered in
 * order (the start stays 0).  0 or -2. */
static int prod_keep_live(const struct prod *P, struct tp_rx *out)
{
    const int n = P->n, n_cls = P->n_cls;
    int *newid = malloc((size_t)n * sizeof *newid);
    if (!newid) return -2;
    int m = 0;
    for (int q = 0; q < n; q++) newid[q] = P->dist[q] == INT32_MAX ? -1 : m++;
    out->n_states = m;
    out->next = malloc((size_t)m * (size_t)n_cls * sizeof *out->next);
    out->accept = malloc((size_t)m);
    out->dist = malloc((size_t)m * sizeof *out->dist);
    if (!out->next || !out->accept || !out->dist) {
        free(newid);
        return -2;
    }
    for (int q = 0; q < n; q++) {
        if (newid[q] < 0) continue;
        const int i = newid[q];
        out->accept[i] = (uint8_t)(P->dist[q] == 0 && prod_accepting(P, q));
        out->dist[i] = P->dist[q];
        for (int c = 0; c < n_cls; c++) {
            unsigned t = P->next[(size_t)q * (size_t)n_cls + (size_t)c];
            out->next[(size_t)i * (size_t)n_cls + (size_t)c] =
                (uint16_t)(t == TP_RX_DEAD || newid[t] < 0 ? TP_RX_DEAD : (unsigned)newid[t]);
        }
    }
    free(newid);
    return 0;
}

/*
 * out = a x b (b may be NULL) x a character counter (min_chars, max_chars),
 * restricted to the states that reach an accepting one, renumbered so the
 * start is 0, with dist.  0, -1 (refused: r->err), -2 out of memory.
 */
static int product(struct rp *r, const struct tp_rx *a, const struct tp_rx *b, int mn, int mx, struct tp_rx *out)
{
    struct prod P = {.a = a, .b = b, .mn = mn, .mx = mx, .counting = mx >= 0 || mn > 0};
    int rc = prod_classes(&P, out);
    if (rc == 0) rc = prod_explore(r, &P);
    if (rc == 0) rc = prod_dist(&P, out);
    if (rc == 0 && P.dist[0] == INT32_MAX)
        rc = rfail(r, "no string the server generates matches the pattern / format%s (it writes printable ASCII "
                      "without '\"' or '\\' and some non-ASCII letters, no escapes)",
                   P.counting ? " within minLength / maxLength" : "");
    if (rc == 0) rc = prod_keep_live(&P, out);
    if (rc == -2) {
        r->failed = -2;
        snprintf(r->err, r->err_cap, "out of memory");
    }
    free(P.st);
    free(P.next);
    free(P.dist);
    return rc;
}

int tp_rx_compile(const char *pattern, const char *format, int min_chars, int max_chars, struct tp_rx *out,
                  char *err, size_t err_cap)
{
    memset(out, 0, sizeof *out);
    struct rp r;
    memset(&r, 0, sizeof r);
    r.err = err;
    r.err_cap = err_cap;
    r.gen = cs_generated();
    struct tp_rx d[2];
    memset(d, 0, sizeof d);
    int n_d = 0, rc = -2;
    r.x = malloc(MAX_TREE * sizeof *r.x);
    if (!r.x) {
        snprintf(err, err_cap, "out of memory");
        return -2;
    }
    if (format) {
        const char *fp = NULL;
        for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
            if (strcmp(format, formats[i].name) == 0) fp = formats[i].pattern;
        if (!fp) {
            snprintf(err, err_cap,
                     "unsupported format '%.60s' (supported: date, time, date-time, uuid, email, ipv4, ipv6)", format);
            rc = -1;
            goto out;
        }
        if ((rc = pattern_dfa(&r, fp, &d[n_d++])) != 0) goto out;
    }
    if (pattern && (rc = pattern_dfa(&r, pattern, &d[n_d++])) != 0) goto out;
    if (n_d == 0) { /* lengths alone: any generated characters */
        if ((rc = pattern_dfa(&r, "", &d[n_d++])) != 0) goto out;
    }
    rc = product(&r, &d[0], n_d > 1 ? &d[1] : NULL, min_chars, max_chars, out);
out:
    free(r.x);
    tp_rx_free(&d[0]);
    tp_rx_free(&d[1]);
    if (rc != 0) tp_rx_free(out);
    return rc;
}

void tp_rx_free(struct tp_rx *rx)
{
    if (!rx) return;
    free(rx->next);
    free(rx->accept);
    free(rx->dist);
    rx->next = NULL;
    rx->accept = NULL;
    rx->dist = NULL;
    rx->n_states = 0;
}

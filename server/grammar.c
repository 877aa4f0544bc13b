/*
 * server/grammar.c - JSON schema -> byte-level pushdown automaton.  The
 * schema becomes a graph of nodes ($ref targets shared, so recursive schemas
 * are finite); a state is a set of frame stacks, and an anyOf forks a stack
 * per branch.  A byte is accepted only when the value can still be completed
 * afterwards (no dead ends; numbers stop at TP_GRAMMAR_NUM_DIGITS digits,
 * whitespace between tokens is one space or a newline and at most
 * TP_GRAMMAR_WS indent bytes).  docs/structured-output.md.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "grammar_regex.h"

#define TP_GNODE_ROOT 0xFFFFu
#define MAX_NODES 4096
#define FL_KEY 1     /* frame is an object key (node = the object) */
#define FL_KEYFREE 2 /* key frame: still a valid additionalProperties key */

enum gkind { G_OBJECT, G_ARRAY, G_STRING, G_NUMBER, G_INTEGER, G_LITERALS, G_ANYOF, G_SEQ };

struct gnode {
    uint8_t kind;
    int min, max;      /* string: minLength / maxLength (chars); array: minItems / maxItems; -1: none */
    int first, count;  /* object: props; literals: lits; anyOf, seq: kids */
    int extra;         /* object: additionalProperties node (-1: false); array: items node */
    int rx;            /* string: its pattern / format automaton in g->rx (-1: none; then min / max are folded in) */
    uint64_t required; /* object: bit i = props[first + i] is required */
};

struct gstr {
    char *s; /* owned; object keys: the JSON text with quotes */
    int len;
    int node; /* object property: its value node */
};

struct tp_grammar {
    struct gnode *nodes;
    int n_nodes, cap_nodes;
    struct gstr *strs; /* property names and literal texts */
    int n_strs, cap_strs;
    int *kids;
    int n_kids, cap_kids;
    struct tp_rx *rx;  /* string pattern / format automata */
    int n_rx, cap_rx;
    int root;
    int any; /* node for "any JSON value", -1 until needed */
    int64_t *minlen; /* (n_nodes) bytes of the shortest value of each node (closing costs, see gstate_cost) */
    int64_t root_cost; /* the shortest root value, plus one when it needs end-of-generation to end */
};

/* ================================================================ build */

/* Room for one more element in *arr (n used of *cap, elem bytes each).  0, or -1 out of memory. */
static int grow(void **arr, int n, int *cap, size_t elem)
{
    if (n < *cap) return 0;
    int nc = *cap ? 2 * *cap : 32;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

static int new_node(tp_grammar_t *g, enum gkind k)
{
    if (g->n_nodes >= MAX_NODES || grow((void **)&g->nodes, g->n_nodes, &g->cap_nodes, sizeof *g->nodes)) return -1;
    struct gnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)k;
    n->min = -1;
    n->max = -1;
    n->extra = -1;
    n->rx = -1;
    return g->n_nodes++;
}

static int add_str(tp_grammar_t *g, const char *s, int len, int node)
{
    if (grow((void **)&g->strs, g->n_strs, &g->cap_strs, sizeof *g->strs)) return -1;
    char *c = malloc((size_t)len + 1);
    if (!c) return -1;
    memcpy(c, s, (size_t)len);
    c[len] = 0;
    g->strs[g->n_strs].s = c;
    g->strs[g->n_strs].len = len;
    g->strs[g->n_strs].node = node;
    return g->n_strs++;
}

static int add_kid(tp_grammar_t *g, int node)
{
    if (grow((void **)&g->kids, g->n_kids, &g->cap_kids, sizeof *g->kids)) return -1;
    g->kids[g->n_kids] = node;
    return g->n_kids++;
}

static int str_cmp(const void *a, const void *b)
{
    const struct gstr *x = a, *y = b;
    int l = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, (size_t)l);
    return c ? c : x->len - y->len;
}

/* A literal-set node over texts[0..n) (copied, sorted, duplicates dropped). */
static int literal_node(tp_grammar_t *g, const char *const *texts, int n)
{
    int nd = new_node(g, G_LITERALS);
    if (nd < 0) return -1;
    int first = g->n_strs;
    for (int i = 0; i < n; i++)
        if (add_str(g, texts[i], (int)strlen(texts[i]), -1) < 0) return -1;
    qsort(g->strs + first, (size_t)n, sizeof *g->strs, str_cmp);
    int w = first;
    for (int i = first; i < first + n; i++) {
        if (w > first && str_cmp(&g->strs[w - 1], &g->strs[i]) == 0) {
            free(g->strs[i].s);
            continue;
        }
        g->strs[w++] = g->strs[i];
    }
    g->n_strs = w;
    g->nodes[nd].first = first;
    g->nodes[nd].count = w - first;
    return nd;
}

/* The "any JSON value" node (built once). */
static int any_node(tp_grammar_t *g)
{
    if (g->any >= 0) return g->any;
    int any = new_node(g, G_ANYOF), obj = new_node(g, G_OBJECT), arr = new_node(g, G_ARRAY);
    int str = new_node(g, G_STRING), num = new_node(g, G_NUMBER);
    if (any < 0 || obj < 0 || arr < 0 || str < 0 || num < 0) return -1;
    static const char *const lits[] = {"true", "false", "null"};
    int lit = literal_node(g, lits, 3);
    if (lit < 0) return -1;
    g->nodes[obj].extra = any;
    g->nodes[arr].extra = any;
    g->nodes[arr].min = 0;
    g->nodes[any].first = g->n_kids;
    g->nodes[any].count = 5;
    if (add_kid(g, obj) < 0 || add_kid(g, arr) < 0 || add_kid(g, str) < 0 || add_kid(g, num) < 0 ||
        add_kid(g, lit) < 0)
        return -1;
    g->any = any;
    return any;
}

/* ------------------------------------------------------- schema compiler */

struct memo {
    const cJSON *schema;
    int node;
};

struct cc {
    tp_grammar_t *g;
    const cJSON *root;
    struct tp_error *err; /* the first failure's message (may be NULL) */
    int failed;
    int raw;              /* tool-call grammars: "x-raw-prefix" allowed (compile_raw_prefix) */
    struct memo memo[256];
    int n_memo;
    int depth;
};

static int fail(struct cc *c, const char *path, const char *fmt, const char *what)
{
    if (!c->failed) {
        char m[256];
        snprintf(m, sizeof m, fmt, what);
        tp_error_set(c->err, TP_ERR_INVALID_ARG, "%s at %s", m, path[0] ? path : "#");
    }
    c->failed = 1;
    return -1;
}

static int oom(struct cc *c)
{
    if (!c->failed)
        tp_error_set(c->err, TP_ERR_INVALID_ARG, "schema too large (out of memory or more than %d nodes)", MAX_NODES);
    c->failed = 1;
    return -1;
}

static const char *const annotations[] = {"title", "description", "$schema", "$id", "$comment", "default",
                                          "examples", "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions", "strict"};
static const char *const supported[] = {"type", "properties", "required", "additionalProperties", "items",
                                        "minItems", "maxItems", "enum", "const", "$ref", "anyOf", "minLength",
                                        "maxLength", "pattern", "format"};

static int in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0) return 1;
    return 0;
}
#define IN(k, l) in_list((k), (l), sizeof(l) / sizeof((l)[0]))

static int compile(struct cc *c, const cJSON *s, const char *path);

/* Non-negative integer keyword, or -1 when absent; -2 (failed) when malformed. */
static int int_kw(struct cc *c, const cJSON *s, const char *kw, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (!v) return -1;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6 || v->valuedouble != (double)(int)v->valuedouble) {
        fail(c, path, "'%s' must be an integer from 0 to 1000000", kw);
        return -2;
    }
    return (int)v->valuedouble;
}

static int compile_string(struct cc *c, const cJSON *s, const char *path)
{
    int mn = int_kw(c, s, "minLength", path), mx = int_kw(c, s, "maxLength", path);
    if (mn == -2 || mx == -2) return -1;
    if (mx >= 0 && mn > mx) return fail(c, path, "%s: minLength > maxLength, no string satisfies it", "schema");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern"), *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    if ((pat && !cJSON_IsString(pat)) || (fmt && !cJSON_IsString(fmt)))
        return fail(c, path, "'%s' must be a string", pat && !cJSON_IsString(pat) ? "pattern" : "format");
    int nd = new_node(c->g, G_STRING);
    if (nd < 0) return oom(c);
    struct gnode *n = &c->g->nodes[nd];
    n->min = mn < 0 ? 0 : mn;
    n->max = mx;
    if (!pat && !fmt) return nd;
    /* the lengths are folded into the automaton */
    tp_grammar_t *g = c->g;
    if (grow((void **)&g->rx, g->n_rx, &g->cap_rx, sizeof *g->rx)) return oom(c);
    char e[200];
    int rc = tp_rx_compile(pat ? pat->valuestring : NULL, fmt ? fmt->valuestring : NULL, n->min, n->max,
                           &g->rx[g->n_rx], e, sizeof e);
    if (rc == -2) return oom(c);
    if (rc != 0) return fail(c, path, "%s", e);
    n->rx = g->n_rx++;
    n->min = 0;
    n->max = -1;
    return nd;
}

static int compile_array(struct cc *c, const cJSON *s, const char *path)
{
    int mn = int_kw(c, s, "minItems", path), mx = int_kw(c, s, "maxItems", path);
    if (mn == -2 || mx == -2) return -1;
    if (mx >= 0 && mn > mx) return fail(c, path, "%s: minItems > maxItems, no array satisfies it", "schema");
    int nd = new_node(c->g, G_ARRAY);
    if (nd < 0) return oom(c);
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items");
    char p[512];
    snprintf(p, sizeof p, "%s/items", path);
    int item = it ? compile(c, it, p) : any_node(c->g);
    if (item < 0) return c->failed ? -1 : oom(c);
    struct gnode *n = &c->g->nodes[nd];
    n->extra = item;
    n->min = mn < 0 ? 0 : mn;
    n->max = mx;
    return nd;
}

static int compile_object(struct cc *c, const cJSON *s, const char *path)
{
    tp_grammar_t *g = c->g;
    char p[512];
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, path, "'%s' must be an object", "properties");
    if (req && !cJSON_IsArray(req)) return fail(c, path, "'%s' must be an array of strings", "required");
    int nd = new_node(g, G_OBJECT);
    if (nd < 0) return oom(c);
    int extra;
    if (!add || cJSON_IsTrue(add)) {
        extra = any_node(g);
        if (extra < 0) return oom(c);
    } else if (cJSON_IsFalse(add)) {
        extra = -1;
    } else {
        snprintf(p, sizeof p, "%s/additionalProperties", path);
        if ((extra = compile(c, add, p)) < 0) return -1;
    }
    /* properties first, then required names that only additionalProperties
     * covers; collected aside (values compile into g->strs too) and appended
     * together, sorted */
    struct gstr tmp[TP_GRAMMAR_MAX_PROPS];
    int n = 0, rc = -1;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, props)
    {
        if (n >= TP_GRAMMAR_MAX_PROPS) {
            fail(c, path, "more than %s properties in one object schema", "64");
            goto out;
        }
        if (strchr(kv->string, '\xC0')) {
            fail(c, path, "property name with %s", "U+0000");
            goto out;
        }
        snprintf(p, sizeof p, "%s/properties/%.200s", path, kv->string);
        int v = compile(c, kv, p);
        if (v < 0) goto out;
        cJSON *js = cJSON_CreateString(kv->string);
        char *txt = js ? cJSON_PrintUnformatted(js) : NULL;
        cJSON_Delete(js);
        if (!txt) {
            oom(c);
            goto out;
        }
        tmp[n].s = txt;
        tmp[n].len = (int)strlen(txt);
        tmp[n++].node = v;
    }
    const cJSON *r;
    cJSON_ArrayForEach(r, req)
    {
        if (!cJSON_IsString(r)) {
            fail(c, path, "'%s' must be an array of strings", "required");
            goto out;
        }
        cJSON *js = cJSON_CreateString(r->valuestring);
        char *txt = js ? cJSON_PrintUnformatted(js) : NULL;
        cJSON_Delete(js);
        if (!txt) {
            oom(c);
            goto out;
        }
        int found = 0;
        for (int i = 0; i < n; i++)
            if (strcmp(tmp[i].s, txt) == 0) found = 1;
        if (found) {
            free(txt);
            continue;
        }
        if (extra < 0 || n >= TP_GRAMMAR_MAX_PROPS) {
            free(txt);
            if (extra < 0)
                fail(c, path, "required property '%.100s' is not in properties and additionalProperties is false",
                     r->valuestring);
            else
                fail(c, path, "more than %s properties in one object schema", "64");
            goto out;
        }
        tmp[n].s = txt;
        tmp[n].len = (int)strlen(txt);
        tmp[n++].node = extra;
    }
    qsort(tmp, (size_t)n, sizeof *tmp, str_cmp);
    uint64_t required = 0;
    cJSON_ArrayForEach(r, req)
    {
        cJSON *js = cJSON_CreateString(r->valuestring);
        char *txt = js ? cJSON_PrintUnformatted(js) : NULL;
        cJSON_Delete(js);
        if (!txt) {
            oom(c);
            goto out;
        }
        for (int i = 0; i < n; i++)
            if (strcmp(tmp[i].s, txt) == 0) required |= (uint64_t)1 << i;
        free(txt);
    }
    int first = g->n_strs;
    for (int i = 0; i < n; i++)
        if (add_str(g, tmp[i].s, tmp[i].len, tmp[i].node) < 0) {
            oom(c);
            goto out;
        }
    struct gnode *o = &g->nodes[nd];
    o->first = first;
    o->count = n;
    o->extra = extra;
    o->required = required;
    rc = nd;
out:
    for (int i = 0; i < n; i++) free(tmp[i].s);
    return rc;
}

/* Resolve a local $ref ("#", "#/$defs/x", "#/definitions/x", deeper pointers). */
static const cJSON *resolve_ref(const cJSON *root, const char *ref)
{
    if (ref[0] != '#') return NULL;
    const cJSON *cur = root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '1') {
                tok[n++] = '/';
                p += 2;
            } else if (p[0] == '~' && p[1] == '0') {
                tok[n++] = '~';
                p += 2;
            } else {
                tok[n++] = *p++;
            }
        }
        tok[n] = 0;
        if (cJSON_IsArray(cur)) {
            char *end;
            long i = strtol(tok, &end, 10);
            cur = *end ? NULL : cJSON_GetArrayItem(cur, (int)i);
        } else {
            cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
        }
        if (!cur) return NULL;
    }
    return *p ? NULL : cur;
}

static int compile_typed(struct cc *c, const cJSON *s, const char *type, const char *path)
{
    if (strcmp(type, "object") == 0) return compile_object(c, s, path);
    if (strcmp(type, "array") == 0) return compile_array(c, s, path);
    if (strcmp(type, "string") == 0) return compile_string(c, s, path);
    if (strcmp(type, "number") == 0 || strcmp(type, "integer") == 0) {
        int nd = new_node(c->g, type[1] == 'u' ? G_NUMBER : G_INTEGER);
        return nd < 0 ? oom(c) : nd;
    }
    if (strcmp(type, "boolean") == 0) {
        static const char *const b[] = {"true", "false"};
        int nd = literal_node(c->g, b, 2);
        return nd < 0 ? oom(c) : nd;
    }
    if (strcmp(type, "null") == 0) {
        static const char *const b[] = {"null"};
        int nd = literal_node(c->g, b, 1);
        return nd < 0 ? oom(c) : nd;
    }
    return fail(c, path, "unknown type '%.60s'", type);
}

static int type_matches(const cJSON *v, const char *type)
{
    if (strcmp(type, "object") == 0) return cJSON_IsObject(v);
    if (strcmp(type, "array") == 0) return cJSON_IsArray(v);
    if (strcmp(type, "string") == 0) return cJSON_IsString(v);
    if (strcmp(type, "number") == 0) return cJSON_IsNumber(v);
    if (strcmp(type, "integer") == 0) return cJSON_IsNumber(v) && v->valuedouble == (double)(long long)v->valuedouble;
    if (strcmp(type, "boolean") == 0) return cJSON_IsBool(v);
    if (strcmp(type, "null") == 0) return cJSON_IsNull(v);
    return 0;
}

/* enum / const: the literal texts of the values that also match "type". */
static int compile_enum(struct cc *c, const cJSON *s, const char *path)
{
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (en && !cJSON_IsArray(en)) return fail(c, path, "'%s' must be an array", "enum");
    int n_in = en ? cJSON_GetArraySize(en) : 1;
    if (n_in > 1024) return fail(c, path, "'%s' has more than 1024 values", "enum");
    char **texts = calloc((size_t)n_in + 1, sizeof *texts);
    if (!texts) return oom(c);
    int n = 0, rc = -1;
    const cJSON *v = en ? en->child : cn;
    for (; v; v = en ? v->next : NULL) {
        int ok = 1;
        if (type) {
            ok = 0;
            if (cJSON_IsString(type)) ok = type_matches(v, type->valuestring);
            const cJSON *t;
            if (cJSON_IsArray(type))
                cJSON_ArrayForEach(t, type) ok |= cJSON_IsString(t) && type_matches(v, t->valuestring);
        }
        if (!ok) continue;
        if (en && cn && !cJSON_Compare(v, cn, 1)) continue;
        char *txt = cJSON_PrintUnformatted(v);
        if (!txt) goto out;
        if (strchr(txt, '\xC0')) {
            free(txt);
            fail(c, path, "%s value holding U+0000", en ? "enum" : "const");
            goto out;
        }
        texts[n++] = txt;
    }
    if (n == 0) {
        fail(c, path, "'%s' leaves no value that matches the schema", en ? "enum" : "const");
        goto out;
    }
    rc = literal_node(c->g, (const char *const *)texts, n);
    if (rc < 0) oom(c);
out:
    for (int i = 0; i < n; i++) free(texts[i]);
    free(texts);
    return c->failed ? -1 : rc;
}

/* An anyOf node over kids[0..n). */
static int anyof_node(struct cc *c, const int *kids, int n)
{
    int nd = new_node(c->g, G_ANYOF);
    if (nd < 0) return oom(c);
    c->g->nodes[nd].first = c->g->n_kids;
    c->g->nodes[nd].count = n;
    for (int i = 0; i < n; i++)
        if (add_kid(c->g, kids[i]) < 0) return oom(c);
    return nd;
}

/* $ref: an indirection node per target (memoised), so recursion is finite. */
static int compile_ref(struct cc *c, const cJSON *ref, const char *path)
{
    if (!cJSON_IsString(ref)) return fail(c, path, "'%s' must be a string", "$ref");
    const cJSON *t = resolve_ref(c->root, ref->valuestring);
    if (!t) return fail(c, path, "'$ref' %.100s does not point into this schema", ref->valuestring);
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].schema == t) return c->memo[i].node;
    if (c->n_memo >= (int)(sizeof c->memo / sizeof c->memo[0]))
        return fail(c, path, "more than %s distinct $ref targets", "256");
    /* the indirection node first, so a recursive reference finds it */
    int ind = new_node(c->g, G_ANYOF);
    int k = ind < 0 ? -1 : add_kid(c->g, -1);
    if (k < 0) return oom(c);
    c->g->nodes[ind].first = k;
    c->g->nodes[ind].count = 1;
    c->memo[c->n_memo].schema = t;
    c->memo[c->n_memo++].node = ind;
    char p[512];
    snprintf(p, sizeof p, "%.500s", ref->valuestring);
    int tn = compile(c, t, p);
    if (tn < 0) return -1;
    c->g->kids[k] = tn;
    return ind;
}

static int compile_any_of(struct cc *c, const cJSON *any_of, const char *path)
{
    int n = cJSON_GetArraySize(any_of);
    if (!cJSON_IsArray(any_of) || n == 0) return fail(c, path, "'%s' must be a non-empty array of schemas", "anyOf");
    int *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) return oom(c);
    int i = 0, rc = -1;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, any_of)
    {
        char p[512];
        snprintf(p, sizeof p, "%s/anyOf/%d", path, i);
        if ((tmp[i++] = compile(c, kv, p)) < 0) break;
    }
    if (!c->failed) rc = anyof_node(c, tmp, n);
    free(tmp);
    return rc;
}

/* "type": [...]: an anyOf of the schema compiled once per listed type. */
static int compile_type_list(struct cc *c, const cJSON *s, const cJSON *type, const char *path)
{
    int n = cJSON_GetArraySize(type), kids[8], i = 0;
    if (n > 7) return fail(c, path, "'%s' lists more than 7 types", "type");
    const cJSON *kv;
    cJSON_ArrayForEach(kv, type)
    {
        if (!cJSON_IsString(kv)) return fail(c, path, "'%s' must be a string or an array of strings", "type");
        if ((kids[i++] = compile_typed(c, s, kv->valuestring, path)) < 0) return -1;
    }
    return anyof_node(c, kids, n);
}

/* No "type": the keywords present say which kind (none: any value). */
static int compile_untyped(struct cc *c, const cJSON *s, const char *path)
{
#define HAS(k) (cJSON_GetObjectItemCaseSensitive(s, k) != NULL)
    if (HAS("properties") || HAS("required") || HAS("additionalProperties")) return compile_object(c, s, path);
    if (HAS("items") || HAS("minItems") || HAS("maxItems")) return compile_array(c, s, path);
    if (HAS("minLength") || HAS("maxLength") || HAS("pattern") || HAS("format")) return compile_string(c, s, path);
#undef HAS
    int rc = any_node(c->g);
    return rc < 0 ? oom(c) : rc;
}

/* Keywords that only siblings of their own kind may accompany: $ref and
 * anyOf stand alone; pattern / format are not combined with enum / const;
 * format needs a type that includes string.  0, or -1 (failed). */
static int check_siblings(struct cc *c, const cJSON *s, const char *path)
{
    const cJSON *kv, *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const char *alone = cJSON_GetObjectItemCaseSensitive(s, "$ref") ? "$ref"
                        : cJSON_GetObjectItemCaseSensitive(s, "anyOf") ? "anyOf" : NULL;
    cJSON_ArrayForEach(kv, s)
    {
        if (!IN(kv->string, supported) && !IN(kv->string, annotations))
            return fail(c, path, "unsupported keyword '%.60s'", kv->string);
        if (alone && !IN(kv->string, annotations) && strcmp(kv->string, alone) != 0)
            return fail(c, path, alone[0] == '$' ? "'$ref' beside the constraint '%.60s' (move it into the referenced schema)"
                                                 : "'anyOf' beside the constraint '%.60s' (move it into each branch)",
                        kv->string);
    }
    const int has_enum = cJSON_GetObjectItemCaseSensitive(s, "enum") || cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (has_enum && (fmt || cJSON_GetObjectItemCaseSensitive(s, "pattern")))
        return fail(c, path, "'%s' beside 'enum' / 'const' (list only the values that match)", fmt ? "format" : "pattern");
    if (fmt && type) {
        int str = cJSON_IsString(type) && strcmp(type->valuestring, "string") == 0;
        cJSON_ArrayForEach(kv, type) str |= cJSON_IsString(kv) && strcmp(kv->valuestring, "string") == 0;
        if (!str)
            return fail(c, path, "format '%.60s' on a schema that is not a string (formats are supported on strings only)",
                        cJSON_IsString(fmt) ? fmt->valuestring : "");
    }
    return 0;
}

/* Tool-call grammars only (c->raw): {"x-raw-prefix": "text", "x-then": schema},
 * the bytes of text and then a value of schema (Mistral's name[ARGS]{...}). */
static int compile_raw_prefix(struct cc *c, const cJSON *s, const char *path)
{
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(s, "x-raw-prefix"), *then = cJSON_GetObjectItemCaseSensitive(s, "x-then");
    if (!cJSON_IsString(pre) || !pre->valuestring[0] || !then || cJSON_GetArraySize(s) != 2)
        return fail(c, path, "malformed '%s'", "x-raw-prefix");
    const char *txt[1] = {pre->valuestring};
    int kids[2];
    if ((kids[0] = literal_node(c->g, txt, 1)) < 0) return oom(c);
    char p[512];
    snprintf(p, sizeof p, "%.500s/x-then", path);
    if ((kids[1] = compile(c, then, p)) < 0) return -1;
    int nd = anyof_node(c, kids, 2);
    if (nd >= 0) c->g->nodes[nd].kind = G_SEQ;
    return nd;
}

static int compile(struct cc *c, const cJSON *s, const char *path)
{
    if (c->failed) return -1;
    if (c->raw && cJSON_IsObject(s) && cJSON_GetObjectItemCaseSensitive(s, "x-raw-prefix")) return compile_raw_prefix(c, s, path);
    if (cJSON_IsTrue(s)) {
        int a = any_node(c->g);
        return a < 0 ? oom(c) : a;
    }
    if (cJSON_IsFalse(s)) return fail(c, path, "schema %s accepts no value", "false");
    if (!cJSON_IsObject(s)) return fail(c, path, "%s must be an object or a boolean", "a schema");
    if (++c->depth > 64) return fail(c, path, "schema nested more than %s levels", "64");
    int rc = -1;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *any_of = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (check_siblings(c, s, path) < 0) rc = -1;
    else if (ref) rc = compile_ref(c, ref, path);
    else if (any_of) rc = compile_any_of(c, any_of, path);
    else if (cJSON_GetObjectItemCaseSensitive(s, "enum") || cJSON_GetObjectItemCaseSensitive(s, "const"))
        rc = compile_enum(c, s, path);
    else if (cJSON_IsString(type)) rc = compile_typed(c, s, type->valuestring, path);
    else if (cJSON_IsArray(type) && cJSON_GetArraySize(type) > 0) rc = compile_type_list(c, s, type, path);
    else if (type) rc = fail(c, path, "'%s' must be a string or an array of strings", "type");
    else rc = compile_untyped(c, s, path);
    c->depth--;
    return c->failed ? -1 : rc;
}

static tp_grammar_t *grammar_new(void)
{
    tp_grammar_t *g = calloc(1, sizeof *g);
    if (g) g->any = -1;
    return g;
}

void tp_grammar_free(tp_grammar_t *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_strs; i++) free(g->strs[i].s);
    for (int i = 0; i < g->n_rx; i++) tp_rx_free(&g->rx[i]);
    free(g->rx);
    free(g->strs);
    free(g->nodes);
    free(g->kids);
    free(g->minlen);
    free(g);
}

/* Every node can produce some value (an anyOf cycle with no base case cannot).
 * Fixed point over "productive" nodes.  TP_OK, TP_ERR_INVALID_ARG (err set) or TP_ERR_NOMEM. */
static enum tp_status productive_check(tp_grammar_t *g, struct tp_error *err)
{
    char *ok = calloc((size_t)g->n_nodes, 1);
    if (!ok) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            if (ok[i]) continue;
            const struct gnode *n = &g->nodes[i];
            int v = 0;
            switch (n->kind) {
            case G_STRING: case G_NUMBER: case G_INTEGER: case G_LITERALS: v = 1; break;
            case G_ARRAY: v = n->min <= 0 || ok[n->extra]; break;
            case G_ANYOF:
                for (int k = 0; k < n->count && !v; k++) v = g->kids[n->first + k] >= 0 && ok[g->kids[n->first + k]];
                break;
            case G_OBJECT:
                v = 1;
                for (int k = 0; k < n->count; k++)
                    if ((n->required >> k & 1) && !ok[g->strs[n->first + k].node]) v = 0;
                break;
            case G_SEQ:
                v = 1;
                for (int k = 0; k < n->count; k++) v &= ok[g->kids[n->first + k]];
                break;
            }
            if (v) ok[i] = changed = 1;
        }
    }
    int good = ok[g->root];
    free(ok);
    if (good) return TP_OK;
    return tp_error_set(err, TP_ERR_INVALID_ARG,
                        "the schema admits no finite value (a required recursion without a base case)");
}

#define COST_INF ((int64_t)1 << 40)

static int64_t cadd(int64_t a, int64_t b) { return a >= COST_INF || b >= COST_INF ? COST_INF : TP_MIN(a + b, COST_INF); }

/* Bytes of "key":value for property k of object n at its shortest. */
static int64_t prop_cost(const tp_grammar_t *g, const struct gnode *n, int k)
{
    const struct gstr *p = &g->strs[n->first + k];
    return cadd(p->len + 1, g->minlen[p->node]);
}

/* 1 when literal i of [lo, hi] is a proper prefix of another one there (it
 * then ends only at end of generation when it is the whole reply). */
static int literal_extended(const tp_grammar_t *g, int lo, int hi, int i)
{
    for (int j = lo; j <= hi; j++)
        if (j != i && g->strs[j].len > g->strs[i].len && memcmp(g->strs[j].s, g->strs[i].s, (size_t)g->strs[i].len) == 0)
            return 1;
    return 0;
}

/* The shortest complete reply of node as the whole reply: its shortest value,
 * plus one for a number or a literal that only end-of-generation ends. */
static int64_t root_len(const tp_grammar_t *g, int node, int hops)
{
    const struct gnode *n = &g->nodes[node];
    if (n->kind == G_NUMBER || n->kind == G_INTEGER) return 2;
    if (n->kind == G_LITERALS) {
        int64_t v = COST_INF;
        for (int k = 0; k < n->count; k++)
            v = TP_MIN(v, g->strs[n->first + k].len +
                              literal_extended(g, n->first, n->first + n->count - 1, n->first + k));
        return v;
    }
    if (n->kind == G_ANYOF) {
        int64_t v = COST_INF;
        for (int k = 0; k < n->count && hops < 16; k++)
            if (g->kids[n->first + k] >= 0) v = TP_MIN(v, root_len(g, g->kids[n->first + k], hops + 1));
        return v;
    }
    return g->minlen[node];
}

/* Shortest bytes of the parts [k, count) of sequence n. */
static int64_t seq_rest(const tp_grammar_t *g, const struct gnode *n, int k)
{
    int64_t v = 0;
    for (; k < n->count; k++) v = cadd(v, g->minlen[g->kids[n->first + k]]);
    return v;
}

/* Shortest value of every node (a fixed point: recursion through $ref and
 * anyOf).  0, or -1 out of memory. */
static int cost_init(tp_grammar_t *g)
{
    g->minlen = malloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1) * sizeof *g->minlen);
    if (!g->minlen) return -1;
    for (int i = 0; i < g->n_nodes; i++) g->minlen[i] = COST_INF;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const struct gnode *n = &g->nodes[i];
            int64_t v = COST_INF;
            switch (n->kind) {
            case G_STRING: v = 2 + (n->rx >= 0 ? g->rx[n->rx].dist[0] : n->min > 0 ? n->min : 0); break;
            case G_NUMBER:
            case G_INTEGER: v = 1; break;
            case G_LITERALS:
                for (int k = 0; k < n->count; k++) v = TP_MIN(v, (int64_t)g->strs[n->first + k].len);
                break;
            case G_ARRAY: {
                int64_t m = n->min > 0 ? g->minlen[n->extra] : 0;
                v = n->min > 0 ? cadd(2 + (n->min - 1), m >= COST_INF ? COST_INF : m * n->min) : 2;
                break;
            }
            case G_OBJECT: {
                int nr = 0;
                v = 2;
                for (int k = 0; k < n->count; k++)
                    if (n->required >> k & 1) v = cadd(v, prop_cost(g, n, k)), nr++;
                if (nr > 1) v = cadd(v, nr - 1);
                break;
            }
            case G_ANYOF:
                for (int k = 0; k < n->count; k++)
                    if (g->kids[n->first + k] >= 0) v = TP_MIN(v, g->minlen[g->kids[n->first + k]]);
                break;
            case G_SEQ: v = seq_rest(g, n, 0); break;
            }
            if (v < g->minlen[i]) g->minlen[i] = v, changed = 1;
        }
    }
    g->root_cost = root_len(g, g->root, 0);
    return 0;
}

static enum tp_status from_schema(const cJSON *schema, int raw, tp_grammar_t **out, struct tp_error *err)
{
    *out = NULL;
    tp_grammar_t *g = grammar_new();
    if (!g) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    struct cc c;
    memset(&c, 0, sizeof c);
    c.g = g;
    c.root = schema;
    c.err = err;
    c.raw = raw;
    g->root = compile(&c, schema, "#");
    if (g->root < 0) {
        tp_grammar_free(g);
        return TP_ERR_INVALID_ARG;
    }
    enum tp_status st = productive_check(g, err);
    if (st != TP_OK) {
        tp_grammar_free(g);
        return st;
    }
    if (cost_init(g) != 0) {
        tp_grammar_free(g);
        return TP_ERR_NOMEM;
    }
    *out = g;
    return TP_OK;
}

enum tp_status tp_grammar_from_schema(const cJSON *schema, tp_grammar_t **out, struct tp_error *err)
{
    return from_schema(schema, 0, out, err);
}

enum tp_status tp_grammar_from_tool_schema(const cJSON *schema, tp_grammar_t **out, struct tp_error *err)
{
    return from_schema(schema, 1, out, err);
}

enum tp_status tp_grammar_json_object(tp_grammar_t **out)
{
    *out = NULL;
    tp_grammar_t *g = grammar_new();
    if (!g) return TP_ERR_NOMEM;
    int any = any_node(g);
    if (any < 0) {
        tp_grammar_free(g);
        return TP_ERR_NOMEM;
    }
    g->root = g->kids[g->nodes[any].first]; /* the object branch */
    if (cost_init(g) != 0) {
        tp_grammar_free(g);
        return TP_ERR_NOMEM;
    }
    *out = g;
    return TP_OK;
}

/* ============================================================== runtime */

enum { O_OPEN, O_FIRST, O_COLON, O_VALUE, O_AFTER, O_KEY }; /* O_OPEN 0, O_FIRST 1: container_byte */
enum { A_OPEN, A_FIRST, A_AFTER, A_NEXT };
enum { S_OPEN, S_BODY, S_ESC, S_HEX };
enum { N_START, N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

/* Whitespace between two tokens of the JSON text: nothing, one space, or a
 * newline followed by up to TP_GRAMMAR_WS spaces or tabs (indentation).
 * f->ws: 0 none yet, 1 + k after a newline and k indent bytes, 255 closed. */
static int ws_take(struct tp_gframe *f, int c)
{
    if (f->ws == 0 && c == ' ') f->ws = 255;
    else if (f->ws == 0 && c == '\n') f->ws = 1;
    else if (f->ws >= 1 && f->ws <= TP_GRAMMAR_WS && (c == ' ' || c == '\t')) f->ws++;
    else return 0;
    return 1;
}
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_hex(int c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

struct out_set {
    struct tp_gstate *st;
};

static size_t stack_bytes(const struct tp_gstack *s)
{
    return offsetof(struct tp_gstack, f) + (size_t)s->depth * sizeof(struct tp_gframe);
}

static void emit(struct tp_gstate *out, const struct tp_gstack *s)
{
    size_t nb = stack_bytes(s);
    for (int i = 0; i < out->n; i++)
        if (out->s[i].depth == s->depth && memcmp(&out->s[i], s, nb) == 0) return;
    if (out->n >= TP_GRAMMAR_STACKS) return;
    memcpy(&out->s[out->n++], s, nb);
}

static void step(const tp_grammar_t *g, struct tp_gstack *s, int c, struct tp_gstate *out);

/* Push a value frame for node and feed it its first byte c. */
static void push(const tp_grammar_t *g, struct tp_gstack *s, int node, int c, struct tp_gstate *out, int hops)
{
    const struct gnode *n = &g->nodes[node];
    if (n->kind == G_ANYOF) {
        if (hops > 16) return;
        for (int k = 0; k < n->count; k++) {
            struct tp_gstack copy;
            memcpy(&copy, s, stack_bytes(s));
            push(g, &copy, g->kids[n->first + k], c, out, hops + 1);
        }
        return;
    }
    if (s->depth >= TP_GRAMMAR_DEPTH) return;
    struct tp_gframe *f = &s->f[s->depth++];
    memset(f, 0, sizeof *f);
    f->node = (uint16_t)node;
    if (n->kind == G_LITERALS) {
        f->lo = (uint16_t)n->first;
        f->hi = (uint16_t)(n->first + n->count - 1);
    }
    step(g, s, c, out);
}

/* Object: is there a property not yet present, or may additional keys follow? */
static int more_keys(const struct gnode *n, const struct tp_gframe *f)
{
    if (n->extra >= 0) return 1;
    uint64_t all = n->count >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n->count) - 1);
    return (f->seen & all) != all;
}

static void pop_done(struct tp_gstack *s, struct tp_gstate *out)
{
    s->depth--;
    emit(out, s);
}

/* Continuation bytes after UTF-8 lead byte c (0: c leads no valid character)
 * and the range of the first of them (later ones are 80-BF). */
static int utf8_lead(int c, int *lo, int *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 1;
    if (c == 0xE0) return *lo = 0xA0, 2;
    if (c == 0xED) return *hi = 0x9F, 2;
    if (c >= 0xE1 && c <= 0xEF) return 2;
    if (c == 0xF0) return *lo = 0x90, 3;
    if (c >= 0xF1 && c <= 0xF3) return 3;
    if (c == 0xF4) return *hi = 0x8F, 3;
    return 0;
}

/* String body byte.  Returns 1 when accepted.  f->n counts characters (code
 * points, for minLength) and f->lo the characters beyond U+FFFF, so f->n +
 * f->lo is the length in UTF-16 units (for maxLength): a string within
 * maxLength by either count (JSON Schema's code points, JavaScript's
 * .length as zod checks it) is within it by both. */
static int string_byte(struct tp_gframe *f, const struct gnode *n, int c)
{
    if (f->u8) {
        if (c < f->u8lo || c > f->u8hi) return 0;
        f->u8--;
        f->u8lo = 0x80;
        f->u8hi = 0xBF;
        return 1;
    }
    const int units = c >= 0xF0 ? 2 : 1;
    if (n->max >= 0 && (int)f->n + (int)f->lo + units > n->max) return 0;
    if (c == '\\') {
        f->phase = S_ESC;
        f->n++;
        return 1;
    }
    if (c < 0x20 || c == '"') return 0;
    if (c < 0x80) {
        f->n++;
        return 1;
    }
    int lo, hi;
    const int need = utf8_lead(c, &lo, &hi);
    if (need <= 0) return 0;
    if (need == 3) f->lo++;
    f->u8 = (uint8_t)need;
    f->u8lo = (uint8_t)lo;
    f->u8hi = (uint8_t)hi;
    f->n++;
    return 1;
}

/* Body byte of a pattern / format string: printable ASCII other than '"' and
 * '\' and the non-ASCII characters of tp_rx_lead, each a step of the
 * automaton (a non-ASCII one at its lead byte); f->seen is the state.
 * Returns 1 when accepted. */
static int pattern_byte(const struct tp_rx *rx, struct tp_gframe *f, int c)
{
    if (f->u8) {
        if (c < 0x80 || c > 0xBF) return 0;
        f->u8--;
        return 1;
    }
    int sym = c, more = 0;
    if (c >= 0x80) {
        more = tp_rx_lead(c);
        if (!more) return 0;
        sym = TP_RX_OTHER;
    } else if (c < 0x20 || c == 0x7F || c == '"' || c == '\\') {
        return 0;
    }
    const unsigned q = tp_rx_step(rx, (unsigned)f->seen, sym);
    if (q == TP_RX_DEAD) return 0;
    f->seen = q;
    f->u8 = (uint8_t)more;
    return 1;
}

static void step_string(const tp_grammar_t *g, const struct gnode *n, struct tp_gstack *s, int c, struct tp_gstate *out)
{
    struct tp_gframe *f = &s->f[s->depth - 1];
    if (n->rx >= 0 && f->phase == S_BODY) {
        const struct tp_rx *rx = &g->rx[n->rx];
        if (c == '"' && !f->u8) {
            if (rx->accept[f->seen]) pop_done(s, out);
        } else if (pattern_byte(rx, f, c)) {
            emit(out, s);
        }
        return;
    }
    switch (f->phase) {
    case S_OPEN:
        if (c != '"') return;
        f->phase = S_BODY;
        emit(out, s);
        return;
    case S_BODY:
        if (c == '"' && !f->u8) {
            if ((int)f->n < n->min) return;
            pop_done(s, out);
            return;
        }
        if (string_byte(f, n, c)) emit(out, s);
        return;
    case S_ESC:
        if (c == 'u') {
            f->phase = S_HEX;
            f->pos = 0;
        } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
            f->phase = S_BODY;
        } else {
            return;
        }
        emit(out, s);
        return;
    case S_HEX:
        if (!is_hex(c)) return;
        if (f->pos == 0 && (c == 'd' || c == 'D')) return; /* no surrogate halves */
        if (++f->pos == 4) f->phase = S_BODY;
        emit(out, s);
        return;
    }
}

static void step_number(const struct gnode *n, struct tp_gstack *s, int c, struct tp_gstate *out,
                        const tp_grammar_t *g)
{
    struct tp_gframe *f = &s->f[s->depth - 1];
    const int real = n->kind == G_NUMBER;
    int next = -1;
    switch (f->phase) {
    case N_START:
        if (c == '-') next = N_SIGN;
        /* fall through */
    case N_SIGN:
        if (c == '0') next = N_ZERO;
        else if (c >= '1' && c <= '9') next = N_INT, f->n = 1;
        if (next < 0) return;
        f->phase = (uint8_t)next;
        emit(out, s);
        return;
    case N_ZERO:
    case N_INT:
        if (f->phase == N_INT && is_digit(c) && f->n < TP_GRAMMAR_NUM_DIGITS) next = N_INT, f->n++;
        else if (real && c == '.') next = N_DOT, f->n = 0;
        else if (real && (c == 'e' || c == 'E')) next = N_E;
        break;
    case N_DOT:
        if (!is_digit(c)) return;
        f->phase = N_FRAC;
        f->n = 1;
        emit(out, s);
        return;
    case N_FRAC:
        if (is_digit(c) && f->n < TP_GRAMMAR_NUM_DIGITS) next = N_FRAC, f->n++;
        else if (c == 'e' || c == 'E') next = N_E;
        break;
    case N_E:
        if (c == '+' || c == '-') next = N_ESIGN;
        /* fall through */
    case N_ESIGN:
        if (next < 0 && is_digit(c)) next = N_EXP, f->n = 1;
        if (next < 0) return;
        f->phase = (uint8_t)next;
        emit(out, s);
        return;
    case N_EXP:
        if (is_digit(c) && f->n < 2) next = N_EXP, f->n++;
        break;
    }
    if (next >= 0) {
        if (next == N_E) f->n = 0;
        f->phase = (uint8_t)next;
        emit(out, s);
        return;
    }
    /* the number is complete: the byte belongs to the parent */
    s->depth--;
    step(g, s, c, out);
}

static int number_can_end(const struct tp_gframe *f)
{
    return f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC || f->phase == N_EXP;
}

static int literal_can_end(const tp_grammar_t *g, const struct tp_gframe *f)
{
    return f->lo <= f->hi && g->strs[f->lo].len == f->pos; /* the shortest sorts first */
}

static void step_literal(const tp_grammar_t *g, struct tp_gstack *s, int c, struct tp_gstate *out)
{
    struct tp_gframe *f = &s->f[s->depth - 1];
    int lo = -1, hi = -2;
    for (int i = f->lo; i <= f->hi; i++) {
        const struct gstr *t = &g->strs[i];
        if (t->len > f->pos && (unsigned char)t->s[f->pos] == c) {
            if (lo < 0) lo = i;
            hi = i;
        }
    }
    if (lo < 0) {
        if (!literal_can_end(g, f)) return;
        s->depth--;
        step(g, s, c, out);
        return;
    }
    f->lo = (uint16_t)lo;
    f->hi = (uint16_t)hi;
    f->pos++;
    if (lo == hi && g->strs[lo].len == f->pos) {
        pop_done(s, out); /* nothing longer can follow */
        return;
    }
    emit(out, s);
}

/* Object key frame: candidates [lo, hi] among the properties (JSON texts with
 * quotes), and, with FL_KEYFREE, a free additionalProperties key (printable
 * ASCII without quote or backslash, so its text is its value). */
static void step_key(const tp_grammar_t *g, struct tp_gstack *s, int c, struct tp_gstate *out)
{
    struct tp_gframe *f = &s->f[s->depth - 1];
    struct tp_gframe *o = &s->f[s->depth - 2];
    const struct gnode *n = &g->nodes[f->node];
    int lo = -1, hi = -2, live = 0, exact = -1, dup = 0;
    for (int i = f->lo; i <= f->hi; i++) {
        const struct gstr *t = &g->strs[i];
        if (t->len <= f->pos || (unsigned char)t->s[f->pos] != c) continue;
        if (lo < 0) lo = i;
        hi = i;
        const int seen = (int)(o->seen >> (i - n->first) & 1);
        if (t->len == f->pos + 1) {
            if (seen) dup = 1;
            else exact = i;
        } else if (!seen) {
            live = 1;
        }
    }
    if (exact >= 0) { /* a property not yet present ends here */
        o->prop = (int16_t)(exact - n->first);
        o->seen |= (uint64_t)1 << o->prop;
        pop_done(s, out);
        return;
    }
    const int free_key = (f->flags & FL_KEYFREE) != 0;
    if (free_key && f->pos > 0 && c == '"') {
        /* an additional key ends here unless it names a property already present
         * (a free key has no backslash, so no property text continues after its '"') */
        if (dup) return;
        o->prop = -1;
        pop_done(s, out);
        return;
    }
    int free_ok = 0;
    if (free_key)
        free_ok = f->pos == 0 ? c == '"' : (c >= 0x20 && c < 0x7F && c != '\\' && f->pos < TP_GRAMMAR_KEY_BYTES);
    if (!live && !free_ok) return;
    if (!free_ok) f->flags &= (uint8_t)~FL_KEYFREE;
    if (lo < 0) {
        f->lo = 1;
        f->hi = 0;
    } else {
        f->lo = (uint16_t)lo;
        f->hi = (uint16_t)hi;
    }
    f->pos++;
    emit(out, s);
}

/* The bytes an object and an array handle alike: whitespace between tokens,
 * the opening bracket (phase 0 -> 1), and after an item a ',' (when more may
 * follow: phase -> next) or the closing bracket (when it may close).
 * Returns 1 when c was taken here (accepted or rejected). */
static int container_byte(struct tp_gstack *s, struct tp_gframe *f, int c, char open, struct tp_gstate *out)
{
    if (f->phase != 0 && ws_take(f, c)) {
        emit(out, s);
        return 1;
    }
    f->ws = 0;
    if (f->phase != 0) return 0;
    if (c == open) {
        f->phase = 1;
        emit(out, s);
    }
    return 1;
}

static void after_item(struct tp_gstack *s, struct tp_gframe *f, int c, char close, int more, int next, int can_close,
                       struct tp_gstate *out)
{
    if (c == ',' && more) {
        f->phase = (uint8_t)next;
        emit(out, s);
    } else if (c == close && can_close) {
        pop_done(s, out);
    }
}

static void step_object(const tp_grammar_t *g, struct tp_gstack *s, int c, struct tp_gstate *out)
{
    struct tp_gframe *f = &s->f[s->depth - 1];
    const struct gnode *n = &g->nodes[f->node];
    if (container_byte(s, f, c, '{', out)) return;
    const int req_ok = (f->seen & n->required) == n->required;
    switch (f->phase) {
    case O_FIRST:
    case O_KEY:
        if (c == '}' && f->phase == O_FIRST && req_ok) {
            pop_done(s, out);
            return;
        }
        if (c != '"' || s->depth >= TP_GRAMMAR_DEPTH) return;
        f->phase = O_COLON;
        {
            struct tp_gframe *k = &s->f[s->depth++];
            memset(k, 0, sizeof *k);
            k->node = f->node;
            k->flags = FL_KEY | (n->extra >= 0 ? FL_KEYFREE : 0);
            if (n->count > 0) {
                k->lo = (uint16_t)n->first;
                k->hi = (uint16_t)(n->first + n->count - 1);
            } else {
                k->lo = 1;
                k->hi = 0;
            }
            step_key(g, s, c, out);
        }
        return;
    case O_COLON:
        if (c != ':') return;
        f->phase = O_VALUE;
        emit(out, s);
        return;
    case O_VALUE: {
        int vn = f->prop >= 0 ? g->strs[n->first + f->prop].node : n->extra;
        f->phase = O_AFTER;
        push(g, s, vn, c, out, 0);
        return;
    }
    case O_AFTER: after_item(s, f, c, '}', more_keys(n, f), O_KEY, req_ok, out); return;
    }
}

static void step_array(const tp_grammar_t *g, struct tp_gstack *s, int c, struct tp_gstate *out)
{
    struct tp_gframe *f = &s->f[s->depth - 1];
    const struct gnode *n = &g->nodes[f->node];
    if (container_byte(s, f, c, '[', out)) return;
    switch (f->phase) {
    case A_FIRST:
        if (c == ']') {
            if (n->min <= 0) pop_done(s, out);
            return;
        }
        if (n->max == 0) return;
        /* fall through */
    case A_NEXT:
        f->phase = A_AFTER;
        f->n++;
        push(g, s, n->extra, c, out, 0);
        return;
    case A_AFTER: after_item(s, f, c, ']', n->max < 0 || (int)f->n < n->max, A_NEXT, (int)f->n >= n->min, out); return;
    }
}

/* Sequence: push its next part (the last one replaces the sequence's frame). */
static void step_seq(const tp_grammar_t *g, struct tp_gstack *s, int c, struct tp_gstate *out)
{
    struct tp_gframe *f = &s->f[s->depth - 1];
    const struct gnode *n = &g->nodes[f->node];
    const int k = f->phase;
    if (k + 1 >= n->count) s->depth--;
    else f->phase++;
    push(g, s, g->kids[n->first + k], c, out, 0);
}

/* Advance stack s (a scratch copy) by byte c; accepted results go to out. */
static void step(const tp_grammar_t *g, struct tp_gstack *s, int c, struct tp_gstate *out)
{
    if (s->depth == 0) return;
    struct tp_gframe *f = &s->f[s->depth - 1];
    if (f->node == TP_GNODE_ROOT) {
        if (f->phase != 0) return; /* nothing after the value */
        f->phase = 1;
        push(g, s, g->root, c, out, 0);
        return;
    }
    if (f->flags & FL_KEY) {
        step_key(g, s, c, out);
        return;
    }
    const struct gnode *n = &g->nodes[f->node];
    switch (n->kind) {
    case G_OBJECT: step_object(g, s, c, out); return;
    case G_ARRAY: step_array(g, s, c, out); return;
    case G_STRING: step_string(g, n, s, c, out); return;
    case G_NUMBER:
    case G_INTEGER: step_number(n, s, c, out, g); return;
    case G_LITERALS: step_literal(g, s, c, out); return;
    case G_SEQ: step_seq(g, s, c, out); return;
    default: return;
    }
}

void tp_gstate_init(const tp_grammar_t *g, struct tp_gstate *st)
{
    (void)g;
    st->n = 1;
    st->s[0].depth = 1;
    memset(&st->s[0].f[0], 0, sizeof st->s[0].f[0]);
    st->s[0].f[0].node = TP_GNODE_ROOT;
}

void tp_gstate_copy(struct tp_gstate *dst, const struct tp_gstate *src)
{
    dst->n = src->n;
    for (int i = 0; i < src->n; i++) memcpy(&dst->s[i], &src->s[i], stack_bytes(&src->s[i]));
}

void tp_gstate_normalize(const tp_grammar_t *g, const struct tp_gstate *src, struct tp_gstate *dst)
{
    tp_gstate_copy(dst, src);
    for (int i = 0; i < dst->n; i++) {
        struct tp_gstack *s = &dst->s[i];
        for (int d = 0; d < s->depth; d++) {
            struct tp_gframe *f = &s->f[d];
            if (f->node == TP_GNODE_ROOT || (f->flags & FL_KEY)) continue;
            const struct gnode *n = &g->nodes[f->node];
            if (n->kind == G_STRING && n->max < 0 && (int)f->n >= n->min) {
                f->n = (uint32_t)n->min;
                f->lo = 0;
            }
        }
    }
}

int tp_gstate_equal(const struct tp_gstate *a, const struct tp_gstate *b)
{
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (a->s[i].depth != b->s[i].depth || memcmp(&a->s[i], &b->s[i], stack_bytes(&a->s[i])) != 0) return 0;
    return 1;
}

/* Advance src by c into dst (dst != src). */
static int feed_into(const tp_grammar_t *g, const struct tp_gstate *src, struct tp_gstate *dst, int c)
{
    dst->n = 0;
    for (int i = 0; i < src->n; i++) {
        struct tp_gstack tmp;
        memcpy(&tmp, &src->s[i], stack_bytes(&src->s[i]));
        step(g, &tmp, c, dst);
    }
    return dst->n > 0;
}

int tp_gstate_feed(const tp_grammar_t *g, struct tp_gstate *st, unsigned char c)
{
    struct tp_gstate tmp;
    int ok = feed_into(g, st, &tmp, c);
    tp_gstate_copy(st, &tmp);
    return ok;
}

int tp_gstate_feed_bytes(const tp_grammar_t *g, struct tp_gstate *st, const char *b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!tp_gstate_feed(g, st, (unsigned char)b[i])) return 0;
    return 1;
}

static int stack_accepting(const tp_grammar_t *g, const struct tp_gstack *s)
{
    const struct tp_gframe *f = &s->f[s->depth - 1];
    if (s->depth == 1) return f->node == TP_GNODE_ROOT && f->phase == 1;
    if (s->depth != 2 || (f->flags & FL_KEY)) return 0;
    const struct gnode *n = &g->nodes[f->node];
    if (n->kind == G_NUMBER || n->kind == G_INTEGER) return number_can_end(f);
    if (n->kind == G_LITERALS) return literal_can_end(g, f);
    return 0;
}

int tp_gstate_accepting(const tp_grammar_t *g, const struct tp_gstate *st)
{
    for (int i = 0; i < st->n; i++)
        if (stack_accepting(g, &st->s[i])) return 1;
    return 0;
}

int tp_gstate_done(const tp_grammar_t *g, const struct tp_gstate *st)
{
    (void)g;
    if (st->n == 0) return 0;
    for (int i = 0; i < st->n; i++)
        if (st->s[i].depth != 1 || st->s[i].f[0].phase != 1) return 0;
    return 1;
}

/* ================================================================ cost */

/* Closing object n after a member, given the properties seen: each required
 * one still missing as ,"key":value, then '}'. */
static int64_t obj_rest(const tp_grammar_t *g, const struct gnode *n, uint64_t seen)
{
    int64_t v = 1;
    for (int k = 0; k < n->count; k++)
        if ((n->required >> k & 1) && !(seen >> k & 1)) v = cadd(v, 1 + prop_cost(g, n, k));
    return v;
}

/* Object n where a member must come next: the missing required ones (or the
 * shortest allowed one when none is missing and after is set: a ',' was
 * written), separators, '}'.  first: no member yet ('}' alone may close). */
static int64_t obj_members(const tp_grammar_t *g, const struct gnode *n, uint64_t seen, int after)
{
    int64_t v = 1;
    int nr = 0;
    for (int k = 0; k < n->count; k++)
        if ((n->required >> k & 1) && !(seen >> k & 1)) v = cadd(v, prop_cost(g, n, k)), nr++;
    if (nr > 1) v = cadd(v, nr - 1);
    if (nr == 0 && after) {
        int64_t best = n->extra >= 0 ? cadd(3, g->minlen[n->extra]) : COST_INF;
        for (int k = 0; k < n->count; k++)
            if (!(seen >> k & 1)) best = TP_MIN(best, prop_cost(g, n, k));
        v = cadd(v, best);
    }
    return v;
}

static int64_t rest_chars(const struct gnode *n, const struct tp_gframe *f)
{
    return n->min > (int)f->n ? n->min - (int)f->n : 0;
}

/* Bytes the shortest completion of stack s needs: each frame's remainder
 * once the frame above it is complete (a key frame and its object are
 * costed together, the key deciding the rest), plus one end-of-generation
 * token when only that can end the value. */
static int64_t stack_cost(const tp_grammar_t *g, const struct tp_gstack *s, int free_key_only)
{
    int64_t v = 0;
    for (int d = s->depth - 1; d >= 0; d--) {
        const struct tp_gframe *f = &s->f[d];
        if (f->node == TP_GNODE_ROOT) {
            if (f->phase == 0) v = cadd(v, g->root_cost);
            continue;
        }
        const int at_root = d == 1; /* the reply's value: a number or a prefix literal needs end of generation */
        const struct gnode *n = &g->nodes[f->node];
        if (f->flags & FL_KEY) {
            const struct tp_gframe *o = &s->f[d - 1];
            int64_t best = COST_INF;
            for (int i = f->lo; i <= f->hi && !free_key_only; i++) {
                const struct gstr *t = &g->strs[i];
                const int k = i - n->first;
                if (t->len <= f->pos || (o->seen >> k & 1)) continue;
                best = TP_MIN(best, cadd(t->len - f->pos + 1, cadd(g->minlen[t->node], obj_rest(g, n, o->seen | (uint64_t)1 << k))));
            }
            if (f->flags & FL_KEYFREE)
                best = TP_MIN(best, cadd((f->pos == 0 ? 2 : 1) + 1, cadd(g->minlen[n->extra], obj_rest(g, n, o->seen))));
            v = cadd(v, best);
            d--; /* the object's part is in best */
            continue;
        }
        switch (n->kind) {
        case G_OBJECT: {
            const int vn = f->prop >= 0 ? g->strs[n->first + f->prop].node : n->extra;
            switch (f->phase) {
            case O_FIRST: v = cadd(v, obj_members(g, n, f->seen, 0)); break;
            case O_KEY: v = cadd(v, obj_members(g, n, f->seen, 1)); break;
            case O_COLON: v = cadd(v, cadd(1 + (vn >= 0 ? g->minlen[vn] : 0), obj_rest(g, n, f->seen))); break;
            case O_VALUE: v = cadd(v, cadd(vn >= 0 ? g->minlen[vn] : 0, obj_rest(g, n, f->seen))); break;
            default: v = cadd(v, obj_rest(g, n, f->seen)); break;
            }
            break;
        }
        case G_ARRAY: {
            const int64_t m = g->minlen[n->extra];
            int64_t k;
            if (f->phase == A_FIRST) {
                k = n->min > 0 ? n->min : 0;
                v = cadd(v, k ? cadd(k, m >= COST_INF ? COST_INF : m * k) : 1); /* k items, k - 1 commas, ']' */
            } else if (f->phase == A_NEXT) {
                k = TP_MAX(1, (int64_t)n->min - (int64_t)f->n);
                v = cadd(v, cadd(k, m >= COST_INF ? COST_INF : m * k));
            } else {
                k = TP_MAX(0, (int64_t)n->min - (int64_t)f->n);
                v = cadd(v, cadd(1 + k, m >= COST_INF ? COST_INF : m * k));
            }
            break;
        }
        case G_STRING:
            if (n->rx >= 0) v = cadd(v, f->u8 + g->rx[n->rx].dist[f->seen] + 1);
            else if (f->phase == S_ESC) v = cadd(v, 2 + rest_chars(n, f));
            else if (f->phase == S_HEX) v = cadd(v, 4 - f->pos + 1 + rest_chars(n, f));
            else v = cadd(v, f->u8 + 1 + rest_chars(n, f));
            break;
        case G_NUMBER:
        case G_INTEGER:
            v = cadd(v, (number_can_end(f) ? 0 : 1) + at_root);
            break;
        case G_SEQ: v = cadd(v, seq_rest(g, n, f->phase)); break;
        case G_LITERALS: {
            int64_t best = COST_INF;
            for (int i = f->lo; i <= f->hi; i++)
                if (g->strs[i].len >= f->pos)
                    best = TP_MIN(best, (int64_t)(g->strs[i].len - f->pos) +
                                            (at_root ? literal_extended(g, f->lo, f->hi, i) : 0));
            v = cadd(v, best);
            break;
        }
        default: break;
        }
    }
    return v;
}

int tp_gstate_cost(const tp_grammar_t *g, const struct tp_gstate *st)
{
    int64_t best = COST_INF;
    for (int i = 0; i < st->n; i++) best = TP_MIN(best, stack_cost(g, &st->s[i], 0));
    return best >= INT32_MAX ? INT32_MAX : (int)best;
}

/* ============================================================ token trie */

struct tnode {
    uint8_t byte;
    uint8_t depth;   /* 1..max_len */
    int32_t skip;    /* index just past this node's subtree (preorder) */
    int32_t tok_first, tok_count; /* tokens ending here: ids[tok_first ..] */
};

struct trie {
    struct tnode *nodes;
    int n_nodes;
    int32_t *ids;
    int max_len;
};

#define PLAIN_MAX_BYTES 16 /* plain sets hold tokens of at most this many bytes (longer ones are walked) */

struct tp_token_trie {
    int n_vocab;
    int n_words;
    struct trie all;      /* every allowed token */
    struct trie rest;     /* the tokens not in plain */
    struct trie keyrest;  /* the tokens not in keyplain */
    struct trie restpart; /* the tokens not in plainwhole */
    uint32_t *plain;      /* (n_words) tokens valid anywhere inside a string body at a character boundary */
    uint32_t *plainwhole; /* (n_words) plain tokens that end on a character boundary */
    uint32_t *keyplain;   /* (n_words) plain tokens of printable ASCII only (valid in an additional key) */
};

/* A token for sorting by bytes (qsort has no context argument). */
struct tsort {
    const char *p;
    size_t len;
    int32_t id;
};

static int tok_cmp(const void *a, const void *b)
{
    const struct tsort *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

/* Build a preorder trie over ids[0..n) (sorted by bytes). */
static int trie_build(struct trie *t, const int32_t *ids, int n, const char *const *piece, const size_t *len)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) total += len[ids[i]];
    t->nodes = malloc((total + 1) * sizeof *t->nodes);
    t->ids = malloc(((size_t)n + 1) * sizeof *t->ids);
    if (!t->nodes || !t->ids) return -1;
    int path[256];
    int depth = 0, nn = 0, prev = -1;
    t->max_len = 0;
    for (int i = 0; i < n; i++) {
        int id = ids[i];
        size_t l = len[id];
        size_t lcp = 0;
        if (prev >= 0) {
            size_t lp = len[prev];
            while (lcp < l && lcp < lp && piece[id][lcp] == piece[prev][lcp]) lcp++;
        }
        if ((int)lcp > depth) lcp = (size_t)depth;
        while (depth > (int)lcp) t->nodes[path[--depth]].skip = nn;
        for (size_t k = lcp; k < l; k++) {
            struct tnode *x = &t->nodes[nn];
            x->byte = (uint8_t)piece[id][k];
            x->depth = (uint8_t)(k + 1);
            x->skip = -1;
            x->tok_first = 0;
            x->tok_count = 0;
            path[depth++] = nn++;
        }
        struct tnode *end = &t->nodes[path[depth - 1]];
        if (end->tok_count == 0) end->tok_first = i;
        end->tok_count++;
        t->ids[i] = id;
        if ((int)l > t->max_len) t->max_len = (int)l;
        prev = id;
    }
    while (depth > 0) t->nodes[path[--depth]].skip = nn;
    t->n_nodes = nn;
    return 0;
}

/* Token bytes valid inside a JSON string body from a character boundary
 * (may end inside a multi-byte character). */
static int plain_piece(const unsigned char *p, size_t n, int *whole)
{
    size_t i = 0;
    *whole = 1;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x20 || c == '"' || c == '\\') return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        int lo, hi;
        const int need = utf8_lead((int)c, &lo, &hi);
        if (need <= 0) return 0;
        i++;
        int k = 0;
        for (; k < need && i < n; k++, i++) {
            if (p[i] < lo || p[i] > hi) return 0;
            lo = 0x80;
            hi = 0xBF;
        }
        *whole = k == need;
    }
    return 1;
}

enum tp_status tp_token_trie_init(int n_vocab, const char *const *piece, const size_t *len, const uint8_t *skip,
                                  tp_token_trie_t **out)
{
    *out = NULL;
    tp_token_trie_t *t = calloc(1, sizeof *t);
    int32_t *ids = malloc(((size_t)n_vocab + 1) * sizeof *ids);
    int32_t *rest = malloc(((size_t)n_vocab + 1) * sizeof *rest);
    int32_t *krest = malloc(((size_t)n_vocab + 1) * sizeof *krest);
    int32_t *prest = malloc(((size_t)n_vocab + 1) * sizeof *prest);
    if (!t || !ids || !rest || !krest || !prest) goto nomem;
    t->n_vocab = n_vocab;
    t->n_words = (n_vocab + 31) / 32;
    t->plain = calloc((size_t)t->n_words, sizeof *t->plain);
    t->keyplain = calloc((size_t)t->n_words, sizeof *t->keyplain);
    t->plainwhole = calloc((size_t)t->n_words, sizeof *t->plainwhole);
    if (!t->plain || !t->keyplain || !t->plainwhole) goto nomem;
    int n = 0, nr = 0, nk = 0, np = 0;
    for (int i = 0; i < n_vocab; i++) {
        if ((skip && skip[i]) || len[i] == 0 || len[i] > 255) continue;
        ids[n++] = i;
    }
    struct tsort *srt = malloc(((size_t)n + 1) * sizeof *srt);
    if (!srt) goto nomem;
    for (int i = 0; i < n; i++) {
        srt[i].p = piece[ids[i]];
        srt[i].len = len[ids[i]];
        srt[i].id = ids[i];
    }
    qsort(srt, (size_t)n, sizeof *srt, tok_cmp);
    for (int i = 0; i < n; i++) ids[i] = srt[i].id;
    free(srt);
    for (int i = 0; i < n; i++) {
        int id = ids[i];
        const unsigned char *pc = (const unsigned char *)piece[id];
        int whole = 0;
        if (len[id] <= PLAIN_MAX_BYTES && plain_piece(pc, len[id], &whole)) {
            t->plain[id / 32] |= 1u << (id % 32);
            if (whole) t->plainwhole[id / 32] |= 1u << (id % 32);
            else prest[np++] = id;
            int ascii = 1;
            for (size_t k = 0; k < len[id]; k++) ascii &= pc[k] < 0x7F;
            if (ascii) t->keyplain[id / 32] |= 1u << (id % 32);
            else krest[nk++] = id;
        } else {
            rest[nr++] = id;
            krest[nk++] = id;
            prest[np++] = id;
        }
    }
    if (trie_build(&t->all, ids, n, piece, len) || trie_build(&t->rest, rest, nr, piece, len) ||
        trie_build(&t->keyrest, krest, nk, piece, len) || trie_build(&t->restpart, prest, np, piece, len))
        goto nomem;
    free(ids);
    free(rest);
    free(krest);
    free(prest);
    *out = t;
    return TP_OK;
nomem:
    free(ids);
    free(rest);
    free(krest);
    free(prest);
    tp_token_trie_free(t);
    return TP_ERR_NOMEM;
}

void tp_token_trie_free(tp_token_trie_t *t)
{
    if (!t) return;
    free(t->all.nodes);
    free(t->all.ids);
    free(t->rest.nodes);
    free(t->rest.ids);
    free(t->keyrest.nodes);
    free(t->keyrest.ids);
    free(t->restpart.nodes);
    free(t->restpart.ids);
    free(t->plainwhole);
    free(t->plain);
    free(t->keyplain);
    free(t);
}

int tp_token_trie_n_vocab(const tp_token_trie_t *t) { return t ? t->n_vocab : 0; }

struct tp_mask_ctx {
    const tp_token_trie_t *t;
    struct tp_gstate *st; /* (max_len + 1) states, one per trie depth */
    int budget;           /* tokens are kept only when the cost after them is at most this; -1: no limit */
    int track;            /* record maxcost */
    int64_t maxcost;      /* the highest cost after an allowed token (a bound for the plain sets) */
};

enum tp_status tp_mask_ctx_init(const tp_token_trie_t *t, tp_mask_ctx_t **out)
{
    *out = NULL;
    tp_mask_ctx_t *c = calloc(1, sizeof *c);
    if (!c) return TP_ERR_NOMEM;
    c->t = t;
    c->st = malloc(((size_t)t->all.max_len + 1) * sizeof *c->st);
    if (!c->st) {
        free(c);
        return TP_ERR_NOMEM;
    }
    *out = c;
    return TP_OK;
}

void tp_mask_ctx_free(tp_mask_ctx_t *c)
{
    if (!c) return;
    free(c->st);
    free(c);
}

static int walk(tp_mask_ctx_t *c, const struct trie *t, const tp_grammar_t *g, uint32_t *mask)
{
    int allowed = 0;
    for (int i = 0; i < t->n_nodes;) {
        const struct tnode *x = &t->nodes[i];
        if (!feed_into(g, &c->st[x->depth - 1], &c->st[x->depth], x->byte)) {
            i = x->skip;
            continue;
        }
        if (x->tok_count > 0 && (c->budget >= 0 || c->track)) {
            const int64_t cost = tp_gstate_cost(g, &c->st[x->depth]);
            if (c->budget >= 0 && cost > c->budget) {
                i++; /* too far from closing for the tokens left; a longer token may close more */
                continue;
            }
            c->maxcost = TP_MAX(c->maxcost, cost);
        }
        for (int k = 0; k < x->tok_count; k++) {
            int id = t->ids[x->tok_first + k];
            mask[id / 32] |= 1u << (id % 32);
        }
        allowed += x->tok_count;
        i++;
    }
    return allowed;
}

/* mask = set | what the walk of trie adds; returns the number of tokens allowed. */
static int set_and_walk(tp_mask_ctx_t *c, const uint32_t *set, const struct trie *trie, const tp_grammar_t *g,
                        uint32_t *mask)
{
    const int nw = c->t->n_words;
    int allowed = 0;
    if (!set) {
        memset(mask, 0, (size_t)nw * sizeof *mask);
        return walk(c, trie, g, mask);
    }
    memcpy(mask, set, (size_t)nw * sizeof *mask);
    for (int w = 0; w < nw; w++) allowed += __builtin_popcount(mask[w]);
    return allowed + walk(c, trie, g, mask);
}

int tp_grammar_mask(tp_mask_ctx_t *c, const tp_grammar_t *g, const struct tp_gstate *st, uint32_t *mask)
{
    return tp_grammar_mask_budget(c, g, st, -1, mask, NULL);
}

static int mask_budget(tp_mask_ctx_t *c, const tp_grammar_t *g, const struct tp_gstate *st, int budget, uint32_t *mask)
{
    const tp_token_trie_t *t = c->t;
    const int costs = budget >= 0 || c->track;
    const int64_t cost0 = costs ? tp_gstate_cost(g, st) : 0;
    if (st->n == 1) {
        const struct tp_gstack *s = &st->s[0];
        const struct tp_gframe *f = &s->f[s->depth - 1];
        /* a string body at a character boundary with room for PLAIN_MAX_BYTES
         * more characters: every plain token is accepted, walk the others.  A
         * plain token raises the cost by at most the 3 continuation bytes of a
         * character it leaves unfinished. */
        if (f->node != TP_GNODE_ROOT && !(f->flags & FL_KEY) && g->nodes[f->node].kind == G_STRING &&
            g->nodes[f->node].rx < 0 && f->phase == S_BODY && f->u8 == 0) {
            const struct gnode *n = &g->nodes[f->node];
            const int room = n->max < 0 || (int64_t)n->max - (int64_t)f->n - (int64_t)f->lo >= PLAIN_MAX_BYTES;
            if (room && (budget < 0 || cost0 + 3 <= budget)) {
                c->maxcost = cost0 + 3;
                return set_and_walk(c, t->plain, &t->rest, g, mask);
            }
            /* the closing stretch, minLength reached: a plain token that ends on a character boundary
             * leaves the cost as it is, one that ends inside a character adds the bytes still missing;
             * only the other tokens (walked, with their costs) can lower it */
            if (room && rest_chars(n, f) == 0) {
                c->maxcost = cost0 + 3;
                return set_and_walk(c, cost0 <= budget ? t->plainwhole : NULL, &t->restpart, g, mask);
            }
        }
        /* an additionalProperties key with room for PLAIN_MAX_BYTES more
         * bytes: every printable-ASCII plain token is accepted.  One may leave
         * a cheaper property name behind: the cost after it is at most that of
         * ending the key as an additional one. */
        if ((f->flags & FL_KEY) && (f->flags & FL_KEYFREE) && f->pos >= 1 &&
            TP_GRAMMAR_KEY_BYTES - (int)f->pos >= PLAIN_MAX_BYTES) {
            const int64_t free_cost = costs ? stack_cost(g, s, 1) : 0;
            if (budget < 0 || free_cost <= budget) {
                c->maxcost = free_cost;
                return set_and_walk(c, t->keyplain, &t->keyrest, g, mask);
            }
        }
    }
    memset(mask, 0, (size_t)t->n_words * sizeof *mask);
    return walk(c, &t->all, g, mask);
}

int tp_grammar_mask_budget(tp_mask_ctx_t *c, const tp_grammar_t *g, const struct tp_gstate *st, int budget,
                           uint32_t *mask, int *max_cost)
{
    tp_gstate_copy(&c->st[0], st);
    c->budget = budget;
    c->track = max_cost != NULL;
    c->maxcost = 0;
    int n = mask_budget(c, g, st, budget, mask);
    if (max_cost) *max_cost = c->maxcost >= INT32_MAX ? INT32_MAX : (int)c->maxcost;
    return n;
}

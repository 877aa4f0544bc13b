/*
 * tests/server/test_grammar.c - the JSON-schema automaton and the token mask.
 *
 * Automaton: hand-written accept / reject strings per supported keyword
 * (a string is accepted when every byte is and the end state is accepting).
 * Mask: against an independent oracle, a byte-by-byte replay of each token
 * from a fresh copy of the state, over a small vocabulary with every single
 * byte plus multi-byte tokens; and random walks that always pick an allowed
 * token reach an accepting state whose text cJSON parses.
 */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/grammar.h"
#include "tp_test.h"

static tp_grammar_t *compile(const char *schema_json, char *err, size_t cap)
{
    cJSON *s = cJSON_Parse(schema_json);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    tp_grammar_t *g = NULL;
    struct tp_error e = {0};
    enum tp_status st = tp_grammar_from_schema(s, &g, &e);
    if (cap) snprintf(err, cap, "%s", tp_error_msg(&e));
    cJSON_Delete(s);
    return st == TP_OK ? g : NULL;
}

/* 1 when text is a complete value of g. */
static int accepts(const tp_grammar_t *g, const char *text)
{
    struct tp_gstate st;
    tp_gstate_init(g, &st);
    if (!tp_gstate_feed_bytes(g, &st, text, strlen(text))) return 0;
    return tp_gstate_accepting(g, &st);
}

struct ar {
    const char *schema;
    const char *yes[6];
    const char *no[8];
};

static const struct ar cases[] = {
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"],"
     "\"additionalProperties\":false}",
     {"{\"a\":1}", "{\"a\":-12,\"b\":\"x\"}", "{\"b\":\"\",\"a\":0}", "{ \"a\" : 5 }", NULL},
     {"{}", "{\"b\":\"x\"}", "{\"a\":1.5}", "{\"a\":1,\"a\":2}", "{\"a\":1,\"c\":2}", "{\"a\":01}", "{\"a\":1} ", NULL}},
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},\"additionalProperties\":{\"type\":\"boolean\"}}",
     {"{}", "{\"name\":\"n\",\"x\":true}", "{\"nam\":false,\"names\":true}", NULL},
     {"{\"x\":1}", "{\"name\":true}", "{\"name\":\"a\",\"name\":\"b\"}", NULL}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2,\"maxItems\":3}",
     {"[1,2]", "[1.5e3,-0.25,7]", "[ 1 , 2 ]", NULL},
     {"[]", "[1]", "[1,2,3,4]", "[1,]", "[1.,2]", NULL}},
    {"{\"enum\":[\"red\",\"green\",12,null,{\"k\":[1]}]}",
     {"\"red\"", "\"green\"", "12", "null", "{\"k\":[1]}", NULL},
     {"\"blue\"", "1", "123", "\"re\"", "{\"k\":[2]}", NULL}},
    {"{\"const\":\"only\"}", {"\"only\"", NULL}, {"\"onl\"", "\"only \"", NULL}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
     {"\"ab\"", "\"abc\"", "\"\\u00e9\\n\"", "\"\xc3\xa9\xc3\xa9\"", NULL},
     {"\"a\"", "\"abcd\"", "\"\\x\"", "\"\\ud800x\"", "\"\x80\x80\"", "\"\xc0\xaf\"", NULL}},
    {"{\"type\":[\"string\",\"null\"]}", {"\"x\"", "null", NULL}, {"1", "nul", NULL}},
    /* maxLength in UTF-16 units (a character beyond U+FFFF is 2), minLength in code points */
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":2}", {"\"ab\"", "\"\xc3\xa9\xc3\xa9\"", NULL},
     {"\"\xf0\x9f\x98\x80\"", "\"a\xf0\x9f\x98\x80\"", NULL}},
    {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],"
     "\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"boolean\"}},"
     "\"required\":[\"b\"],\"additionalProperties\":false}]}",
     {"{\"a\":1}", "{\"b\":true}", NULL},
     {"{\"a\":true}", "{\"b\":1}", "{}", "{\"a\":1,\"b\":true}", NULL}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":"
     "\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},"
     "\"$ref\":\"#/$defs/node\"}",
     {"{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}", NULL},
     {"{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2}}", NULL}},
    {"{\"type\":\"boolean\"}", {"true", "false", NULL}, {"True", "1", NULL}},
    {"{\"type\":\"integer\"}", {"0", "-7", "123456789012345", NULL}, {"1.0", "1e3", "-", "1234567890123456", NULL}},
    {"{\"type\":\"number\"}", {"0.5", "-1e+10", "3E2", "12", NULL}, {".5", "1.", "1e", "+1", NULL}},
    {"{\"type\":\"object\",\"properties\":{\"q\\\"uote\":{\"type\":\"null\"}},\"required\":[\"q\\\"uote\"],"
     "\"additionalProperties\":false}",
     {"{\"q\\\"uote\":null}", NULL}, {"{\"q\":null}", NULL}},
    {"{\"type\":\"object\"}", {"{}", "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}", NULL}, {"[]", "{\"a\"}", NULL}},
    {"true", {"1", "\"s\"", "[]", "{}", NULL}, {"", "[", NULL}},
    /* pattern: anchored, quantifiers; no escapes are generated */
    {"{\"type\":\"string\",\"pattern\":\"^[a-c]{2,3}x?$\"}", {"\"ab\"", "\"abc\"", "\"abcx\"", "\"aax\"", NULL},
     {"\"a\"", "\"abcd\"", "\"xab\"", "\"abxx\"", "\"a\\u0062\"", NULL}},
    /* unanchored: a string that contains a match */
    {"{\"type\":\"string\",\"pattern\":\"\\\\d\\\\d\"}", {"\"12\"", "\"a12b\"", "\"x99\"", NULL},
     {"\"1a2\"", "\"\"", "\"ab\"", NULL}},
    /* anchors per top-level alternative; no type: a string */
    {"{\"pattern\":\"^ab|cd$\"}", {"\"ab\"", "\"abzz\"", "\"zzcd\"", "\"cd\"", NULL},
     {"\"zab\"", "\"cdz\"", "\"\"", "1", NULL}},
    {"{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-28\"", "\"1999-12-31\"", "\"2023-04-30\"", NULL},
     {"\"2024-02-30\"", "\"2024-13-01\"", "\"2024-04-31\"", "\"24-01-01\"", "\"2024-1-01\"", NULL}},
    {"{\"type\":\"string\",\"format\":\"ipv4\"}", {"\"192.168.0.1\"", "\"0.0.0.0\"", "\"255.255.255.255\"", NULL},
     {"\"256.1.1.1\"", "\"01.2.3.4\"", "\"1.2.3\"", NULL}},
    /* pattern and lengths together */
    {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":2,\"maxLength\":3}", {"\"ab\"", "\"abc\"", NULL},
     {"\"a\"", "\"abcd\"", "\"a1\"", NULL}},
    /* non-ASCII characters of the generated set; no astral ones, no NBSP */
    {"{\"type\":\"string\",\"pattern\":\"^.{2}$\"}", {"\"\xc3\xa9x\"", "\"ab\"", "\"\xe4\xb8\x80\xc3\xa9\"", NULL},
     {"\"abc\"", "\"\xf0\x9f\x98\x80x\"", "\"\xc2\xa0x\"", "\"\xc3\"", NULL}},
    {"{\"type\":[\"string\",\"null\"],\"format\":\"date-time\"}",
     {"\"2024-01-02T03:04:05Z\"", "\"2024-01-02T23:59:59.123+05:30\"", "null", NULL},
     {"\"2024-01-02 03:04:05Z\"", "\"2024-01-02T24:00:00Z\"", "\"2024-01-02T03:04:05\"", NULL}},
    {"{\"type\":\"string\",\"format\":\"email\"}", {"\"a.b+c@ex-ample.com\"", "\"x@y.io\"", NULL},
     {"\"a@b\"", "\"a@-b.com\"", "\"@b.com\"", "\"a..b@c.com\"", NULL}},
    {"{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\"", NULL},
     {"\"123e4567-e89b-12d3-a456-42661417400\"", "\"123e4567e89b12d3a456426614174000\"", NULL}},
    {"{\"type\":\"string\",\"format\":\"ipv6\"}", {"\"2001:db8:0:0:0:ff00:42:8329\"", NULL},
     {"\"2001:db8::1\"", "\"2001:db8:0:0:0:ff00:42\"", "\"12345:0:0:0:0:0:0:0\"", NULL}},
    {"{\"type\":\"string\",\"format\":\"time\"}", {"\"23:59:59Z\"", "\"00:00:00.5-01:30\"", NULL},
     {"\"24:00:00Z\"", "\"12:60:00Z\"", "\"12:00:00\"", NULL}},
    /* classes, escapes, groups */
    {"{\"type\":\"string\",\"pattern\":\"^[^a-z\\\\s]\\\\w\\\\.(?:x|y)+\\\\/$\"}", {"\"A1.x/\"", "\"#_.xyx/\"", NULL},
     {"\"a1.x/\"", "\" 1.x/\"", "\"A1.z/\"", "\"A1x.x/\"", NULL}},
};

static void test_accept_reject(void)
{
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tp_grammar_t *g = compile(cases[i].schema, err, sizeof err);
        if (!g) fprintf(stderr, "schema %zu: %s\n", i, err);
        CU_ASSERT_PTR_NOT_NULL_FATAL(g);
        for (int k = 0; cases[i].yes[k]; k++) {
            if (!accepts(g, cases[i].yes[k])) fprintf(stderr, "schema %zu should accept %s\n", i, cases[i].yes[k]);
            CU_ASSERT(accepts(g, cases[i].yes[k]));
        }
        for (int k = 0; cases[i].no[k]; k++) {
            if (accepts(g, cases[i].no[k])) fprintf(stderr, "schema %zu should reject %s\n", i, cases[i].no[k]);
            CU_ASSERT(!accepts(g, cases[i].no[k]));
        }
        tp_grammar_free(g);
    }
}

static void test_refused(void)
{
    static const struct {
        const char *schema, *want;
    } bad[] = {
        {"{\"type\":\"integer\",\"minimum\":3}", "'minimum'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"uri\"}}}", "#/properties/a"},
        {"{\"type\":\"string\",\"format\":\"uri\"}", "unsupported format 'uri'"},
        {"{\"type\":\"integer\",\"format\":\"int32\"}", "not a string"},
        {"{\"oneOf\":[{\"type\":\"string\"}]}", "'oneOf'"},
        {"{\"type\":\"string\",\"pattern\":\"^(a)\\\\1$\"}", "backreference"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", "lookahead"},
        {"{\"type\":\"string\",\"pattern\":\"(?<!a)b\"}", "lookbehind"},
        {"{\"type\":\"string\",\"pattern\":\"\\\\bword\"}", "word boundary"},
        {"{\"type\":\"string\",\"pattern\":\"\\\\p{L}\"}", "Unicode property"},
        {"{\"type\":\"string\",\"pattern\":\"^[\xc3\xa9]$\"}", "non-ASCII"},
        {"{\"type\":\"string\",\"pattern\":\"a^b\"}", "anchor '^'"},
        {"{\"type\":\"string\",\"pattern\":\"a{2,1}\"}", "out of order"},
        {"{\"type\":\"string\",\"pattern\":\"(abc\"}", "unterminated group"},
        {"{\"type\":\"string\",\"pattern\":\"*a\"}", "nothing to repeat"},
        {"{\"type\":\"string\",\"pattern\":\"^\\\"$\"}", "no string the server generates"},
        {"{\"type\":\"string\",\"pattern\":\"^a{3}$\",\"maxLength\":2}", "within minLength"},
        {"{\"enum\":[\"a\"],\"pattern\":\"a\"}", "beside 'enum'"},
        {"{\"type\":\"string\",\"pattern\":5}", "'pattern' must be a string"},
        {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "minLength > maxLength"},
        {"{\"type\":\"array\",\"minItems\":-1}", "minItems"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not point"},
        {"{\"enum\":[1,2],\"type\":\"string\"}", "no value"},
        {"{\"type\":\"object\",\"required\":[\"x\"],\"additionalProperties\":false}", "'x'"},
        {"{\"$defs\":{\"a\":{\"type\":\"object\",\"properties\":{\"s\":{\"$ref\":\"#/$defs/a\"}},\"required\":[\"s\"]}},"
         "\"$ref\":\"#/$defs/a\"}",
         "no finite value"},
        {"{\"type\":\"uuid\"}", "unknown type"},
        {"false", "accepts no value"},
        {NULL, "more than 1024 values"}, /* filled below: a 1025-value enum */
    };
    char err[256];
    static char big[16384];
    size_t bl = (size_t)snprintf(big, sizeof big, "{\"enum\":[0");
    for (int k = 1; k <= 1024; k++) bl += (size_t)snprintf(big + bl, sizeof big - bl, ",%d", k);
    snprintf(big + bl, sizeof big - bl, "]}");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tp_grammar_t *g = compile(bad[i].schema ? bad[i].schema : big, err, sizeof err);
        CU_ASSERT_PTR_NULL(g);
        tp_grammar_free(g);
        if (!strstr(err, bad[i].want)) fprintf(stderr, "case %zu: error '%s' lacks '%s'\n", i, err, bad[i].want);
        CU_ASSERT(strstr(err, bad[i].want) != NULL);
    }
}

/* Vocabulary: the 256 single bytes + multi-byte pieces like a BPE tokenizer's. */
static const char *const multi[] = {"{\"", "\":", "\",", "\"}", "true", "false", "null", "na", "name", "\":\"",
                                    "12", "3.", "e+", "]}", "[{", "  ", "\n", "\xc3\xa9", "\xe2\x82", "\xac\"",
                                    "},{\"", "ab", "\\n", "\\u00", "red", "\"red\"", "}", "\"a\":1,", "ok\"", "\"\""};
#define N_MULTI (int)(sizeof multi / sizeof multi[0])

struct vocab {
    int n;
    char *piece[256 + N_MULTI + 1];
    size_t len[256 + N_MULTI + 1];
    uint8_t skip[256 + N_MULTI + 1];
};

static void vocab_make(struct vocab *v)
{
    memset(v, 0, sizeof *v);
    for (int i = 0; i < 256; i++) {
        v->piece[i] = malloc(1);
        v->piece[i][0] = (char)i;
        v->len[i] = 1;
    }
    for (int i = 0; i < N_MULTI; i++) {
        v->piece[256 + i] = strdup(multi[i]);
        v->len[256 + i] = strlen(multi[i]);
    }
    v->piece[256 + N_MULTI] = strdup("<eos>"); /* a special token: never in a mask */
    v->len[256 + N_MULTI] = 5;
    v->skip[256 + N_MULTI] = 1;
    v->n = 256 + N_MULTI + 1;
}

static void vocab_free(struct vocab *v)
{
    for (int i = 0; i < v->n; i++) free(v->piece[i]);
}

/* Oracle: token i allowed from st when every byte feeds. */
static int oracle(const tp_grammar_t *g, const struct tp_gstate *st, const struct vocab *v, int i)
{
    if (v->skip[i]) return 0;
    static struct tp_gstate tmp;
    tp_gstate_copy(&tmp, st);
    return tp_gstate_feed_bytes(g, &tmp, v->piece[i], v->len[i]);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void mask_walks(const char *schema, int json_object)
{
    struct vocab v;
    vocab_make(&v);
    tp_token_trie_t *t = NULL;
    CU_ASSERT_FATAL(tp_token_trie_init(v.n, (const char *const *)v.piece, v.len, v.skip, &t) == TP_OK);
    tp_mask_ctx_t *mc = NULL;
    CU_ASSERT_FATAL(tp_mask_ctx_init(t, &mc) == TP_OK);
    char err[256];
    tp_grammar_t *g = NULL;
    if (json_object) CU_ASSERT_FATAL(tp_grammar_json_object(&g) == TP_OK);
    if (!json_object) g = compile(schema, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(g);
    static struct tp_gstate st;
    uint32_t mask[(256 + N_MULTI + 1 + 31) / 32];
    int n_done = 0;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        uint64_t rs = seed * 0x9E3779B97F4A7C15ull;
        tp_gstate_init(g, &st);
        char text[4096];
        size_t tl = 0;
        for (int step = 0; step < 600 && !tp_gstate_done(g, &st); step++) {
            int n_allowed = tp_grammar_mask(mc, g, &st, mask);
            int count = 0, mismatch = 0;
            for (int i = 0; i < v.n; i++) {
                int bit = (int)(mask[i / 32] >> (i % 32) & 1);
                count += bit;
                if (bit != oracle(g, &st, &v, i)) mismatch++;
            }
            CU_ASSERT_EQUAL(mismatch, 0);
            CU_ASSERT_EQUAL(count, n_allowed);
            CU_ASSERT_FATAL(n_allowed > 0); /* no dead end */
            /* prefer closing tokens now and then so walks finish */
            int pick = -1, want = (int)(rng_next(&rs) % (uint64_t)n_allowed);
            if (step > 40 && tp_gstate_accepting(g, &st)) break;
            if (step > 40) {
                const char *pref = step % 2 ? "\"}]0:" : "s\"}]0:";
                for (const char *p = pref; *p && pick < 0; p++)
                    if (mask[(unsigned char)*p / 32] >> ((unsigned char)*p % 32) & 1) pick = (unsigned char)*p;
            }
            for (int i = 0; i < v.n && pick < 0; i++)
                if ((mask[i / 32] >> (i % 32) & 1) && want-- == 0) pick = i;
            CU_ASSERT_FATAL(pick >= 0);
            CU_ASSERT_FATAL(tp_gstate_feed_bytes(g, &st, v.piece[pick], v.len[pick]));
            if (tl + v.len[pick] < sizeof text) {
                memcpy(text + tl, v.piece[pick], v.len[pick]);
                tl += v.len[pick];
            }
        }
        if (tp_gstate_accepting(g, &st)) {
            n_done++;
            text[tl] = 0;
            cJSON *j = cJSON_ParseWithLength(text, tl);
            if (!j) fprintf(stderr, "not JSON: %s\n", text);
            CU_ASSERT_PTR_NOT_NULL(j);
            if (json_object) CU_ASSERT(cJSON_IsObject(j));
            cJSON_Delete(j);
        }
    }
    if (n_done < 20) fprintf(stderr, "only %d of 40 walks finished\n", n_done);
    CU_ASSERT(n_done >= 20);
    tp_grammar_free(g);
    tp_mask_ctx_free(mc);
    tp_token_trie_free(t);
    vocab_free(&v);
}

static void test_mask_oracle(void)
{
    mask_walks("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"n\":{\"type\":"
               "\"number\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"na\",true]},\"maxItems\":3}},"
               "\"required\":[\"name\",\"n\"],\"additionalProperties\":false}",
               0);
    mask_walks("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"}},\"required\":[\"s\"],"
               "\"additionalProperties\":{\"type\":[\"integer\",\"null\"]}}",
               0);
    mask_walks(NULL, 1);
    mask_walks("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"p\":{\"type\":"
               "\"string\",\"pattern\":\"^[a-c]+x{2}$\",\"maxLength\":6},\"u\":{\"type\":\"string\",\"pattern\":\"z.{1,3}\","
               "\"maxLength\":8}},\"required\":[\"d\",\"p\",\"u\"],\"additionalProperties\":false}",
               0);
}

/* Patterns against an independent oracle, POSIX extended regular
 * expressions (regcomp; the patterns use the syntax both share): every
 * string over a small alphabet up to 6 characters is a complete value of
 * the grammar exactly when regexec finds a match in it. */
static void test_pattern_vs_posix(void)
{
    static const char *const pats[] = {"^(ab|a)*c?$", "b{2,3}", "^[a-c]+$", "a|^b", "^(a|b)*a(a|b)$", "c$",
                                       "^a{0,2}b+$", "^(x|ab{1,2})+c{2,}", "[^ab]x", "^(a?){2}b?$"};
    static const char alpha[] = "abcx";
    char err[256];
    for (size_t pi = 0; pi < TP_ARRAY_LEN(pats); pi++) {
        char schema[256];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"pattern\":\"%s\"}", pats[pi]);
        tp_grammar_t *g = compile(schema, err, sizeof err);
        if (!g) fprintf(stderr, "pattern %s: %s\n", pats[pi], err);
        CU_ASSERT_PTR_NOT_NULL_FATAL(g);
        regex_t re;
        CU_ASSERT_FATAL(regcomp(&re, pats[pi], REG_EXTENDED | REG_NOSUB) == 0);
        int n_match = 0, n_total = 0;
        for (int len = 0; len <= 6; len++) {
            int idx[6] = {0};
            for (;;) {
                char str[8], json[12];
                for (int k = 0; k < len; k++) str[k] = alpha[idx[k]];
                str[len] = 0;
                snprintf(json, sizeof json, "\"%s\"", str);
                const int want = regexec(&re, str, 0, NULL, 0) == 0, got = accepts(g, json);
                if (want != got) fprintf(stderr, "pattern %s on '%s': posix %d grammar %d\n", pats[pi], str, want, got);
                CU_ASSERT_EQUAL(got, want);
                n_match += want;
                n_total++;
                int k = len - 1;
                while (k >= 0 && ++idx[k] == 4) idx[k--] = 0;
                if (k < 0) break;
            }
        }
        CU_ASSERT(n_match > 0 && n_match < n_total); /* the pattern tells strings apart */
        regfree(&re);
        tp_grammar_free(g);
    }
}

/* The schemas of the cost and budget checks: every kind of frame, required
 * and optional members, additional keys, nesting, anyOf, enums, bounds. */
static const char *const cost_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":6},\"n\":{\"type\":"
    "\"number\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"na\",true]},\"minItems\":2,\"maxItems\":3}},"
    "\"required\":[\"name\",\"n\",\"tags\"],\"additionalProperties\":false}",
    "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},\"opt\":{\"type\":\"object\",\"properties\":{\"deep\":"
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1}},\"required\":[\"deep\"]}},\"required\":[\"s\"],"
    "\"additionalProperties\":{\"type\":[\"integer\",\"null\"]}}",
    "{\"anyOf\":[{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2}},{\"type\":\"object\",\"properties\":"
    "{\"a\":{\"$ref\":\"#/$defs/node\"}},\"required\":[\"a\"]}],\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":"
    "{\"v\":{\"type\":\"number\"},\"next\":{\"$ref\":\"#/$defs/node\"}},\"required\":[\"v\"]}}}",
    "{\"type\":\"number\"}",
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"p\":{\"type\":\"string\","
    "\"pattern\":\"^[a-c]+x{2}$\",\"maxLength\":6},\"e\":{\"type\":\"string\",\"format\":\"email\"},\"u\":{\"type\":"
    "\"string\",\"pattern\":\"z.{1,3}\",\"minLength\":4}},\"required\":[\"d\",\"p\",\"e\",\"u\"],"
    "\"additionalProperties\":false}",
};

/* Random walks of single bytes (a random accepted byte, or now and then the
 * one that lowers the cost most): at every state the cost never drops by
 * more than one per byte, some byte lowers it by exactly one, and it is 0
 * exactly when the value is done (1 with only end-of-generation left).  By
 * induction the cost is the length of the shortest completion.  Following
 * the lowering bytes from any state closes the value in exactly that many
 * bytes, as parseable JSON. */
static void test_cost_exact(void)
{
    char err[256];
    static struct tp_gstate st, nx, walk;
    for (size_t si = 0; si < TP_ARRAY_LEN(cost_schemas); si++) {
        tp_grammar_t *g = compile(cost_schemas[si], err, sizeof err);
        if (!g) fprintf(stderr, "schema %zu: %s\n", si, err);
        CU_ASSERT_PTR_NOT_NULL_FATAL(g);
        for (uint64_t seed = 1; seed <= 30; seed++) {
            uint64_t rs = seed * 0x9E3779B97F4A7C15ull;
            tp_gstate_init(g, &st);
            char text[512];
            size_t tl = 0;
            for (int step = 0; step < 120 && !tp_gstate_done(g, &st); step++) {
                const int c0 = tp_gstate_cost(g, &st);
                int down = -1, n_ok = 0, ok[256];
                for (int b = 0; b < 256; b++) {
                    tp_gstate_copy(&nx, &st);
                    if (!tp_gstate_feed(g, &nx, (unsigned char)b)) continue;
                    const int c1 = tp_gstate_cost(g, &nx);
                    if (c1 < c0 - 1) fprintf(stderr, "schema %zu '%.*s' + '%c': cost %d -> %d\n", si, (int)tl, text, b, c0, c1);
                    CU_ASSERT(c1 >= c0 - 1);
                    if (c1 == c0 - 1 && down < 0) down = b;
                    ok[n_ok++] = b;
                }
                if (tp_gstate_accepting(g, &st)) {
                    CU_ASSERT(c0 == 1); /* end of generation is the one step left */
                } else {
                    if (down < 0) fprintf(stderr, "schema %zu '%.*s': no byte lowers cost %d\n", si, (int)tl, text, c0);
                    CU_ASSERT_FATAL(down >= 0);
                }
                /* from here, the lowering bytes close the value in c0 bytes */
                if (step % 7 == 0) {
                    tp_gstate_copy(&walk, &st);
                    char close[512];
                    size_t cl = tl;
                    memcpy(close, text, tl);
                    int n = 0;
                    while (!tp_gstate_done(g, &walk) && !tp_gstate_accepting(g, &walk) && n < c0) {
                        const int cw = tp_gstate_cost(g, &walk);
                        int b = 0;
                        for (; b < 256; b++) {
                            tp_gstate_copy(&nx, &walk);
                            if (tp_gstate_feed(g, &nx, (unsigned char)b) && tp_gstate_cost(g, &nx) == cw - 1) break;
                        }
                        CU_ASSERT_FATAL(b < 256);
                        tp_gstate_feed(g, &walk, (unsigned char)b);
                        close[cl++] = (char)b;
                        n++;
                    }
                    CU_ASSERT_EQUAL(n + (tp_gstate_done(g, &walk) ? 0 : 1), c0);
                    cJSON *j = cJSON_ParseWithLength(close, cl);
                    if (!j) fprintf(stderr, "closed text is not JSON: %.*s\n", (int)cl, close);
                    CU_ASSERT_PTR_NOT_NULL(j);
                    cJSON_Delete(j);
                }
                if (tp_gstate_accepting(g, &st) && (step > 30 || n_ok == 0)) break; /* end of generation */
                CU_ASSERT_FATAL(n_ok > 0);
                int b = (rng_next(&rs) % 4 == 0 && down >= 0) ? down : ok[rng_next(&rs) % (uint64_t)n_ok];
                CU_ASSERT_FATAL(tp_gstate_feed(g, &st, (unsigned char)b));
                if (tl + 1 < sizeof text) text[tl++] = (char)b;
            }
            if (tp_gstate_done(g, &st)) CU_ASSERT_EQUAL(tp_gstate_cost(g, &st), 0);
        }
        tp_grammar_free(g);
    }
}

/* Generation under a token budget: random tokens from the byte + multi-byte
 * vocabulary, masked with tp_grammar_mask_budget(tokens left after this
 * one); every walk ends complete within its max_tokens, whatever max_tokens
 * is (from the initial cost up).  The plain mask's max_cost bounds the cost
 * after each token it allows (the scheduler reuses a plain mask while that
 * bound is within the tokens left). */
static void test_budget_closes(void)
{
    struct vocab v;
    vocab_make(&v);
    tp_token_trie_t *t = NULL;
    CU_ASSERT_FATAL(tp_token_trie_init(v.n, (const char *const *)v.piece, v.len, v.skip, &t) == TP_OK);
    tp_mask_ctx_t *mc = NULL;
    CU_ASSERT_FATAL(tp_mask_ctx_init(t, &mc) == TP_OK);
    uint32_t mask[(256 + N_MULTI + 1 + 31) / 32];
    static struct tp_gstate st;
    char err[256];
    int n_walks = 0;
    for (size_t si = 0; si < TP_ARRAY_LEN(cost_schemas); si++) {
        tp_grammar_t *g = compile(cost_schemas[si], err, sizeof err);
        CU_ASSERT_PTR_NOT_NULL_FATAL(g);
        tp_gstate_init(g, &st);
        const int c_init = tp_gstate_cost(g, &st);
        for (int extra = 0; extra <= 40; extra += 4) {
            for (uint64_t seed = 1; seed <= 6; seed++) {
                uint64_t rs = seed * 0x2545F4914F6CDD1Dull + (uint64_t)extra;
                const int max_tokens = c_init + extra;
                tp_gstate_init(g, &st);
                int done = 0;
                for (int k = 0; k < max_tokens && !done; k++) {
                    const int left = max_tokens - k - 1;
                    /* the plain mask's bound on the cost after its tokens holds for each of them */
                    int max_cost = -1;
                    (void)tp_grammar_mask_budget(mc, g, &st, -1, mask, &max_cost);
                    for (int i = 0; i < v.n; i++)
                        if (mask[i / 32] >> (i % 32) & 1) {
                            static struct tp_gstate nx;
                            tp_gstate_copy(&nx, &st);
                            CU_ASSERT_FATAL(tp_gstate_feed_bytes(g, &nx, v.piece[i], v.len[i]));
                            CU_ASSERT(tp_gstate_cost(g, &nx) <= max_cost);
                        }
                    int n_allowed = tp_grammar_mask_budget(mc, g, &st, left, mask, NULL);
                    for (int i = 0; i < v.n; i++) /* every allowed token keeps the value closable */
                        if (mask[i / 32] >> (i % 32) & 1) {
                            static struct tp_gstate nx;
                            tp_gstate_copy(&nx, &st);
                            CU_ASSERT_FATAL(tp_gstate_feed_bytes(g, &nx, v.piece[i], v.len[i]));
                            if (tp_gstate_cost(g, &nx) > left)
                                fprintf(stderr, "schema %zu: token '%.*s' leaves cost %d with %d tokens left (cost before %d)\n",
                                        si, (int)v.len[i], v.piece[i], tp_gstate_cost(g, &nx), left, tp_gstate_cost(g, &st));
                            CU_ASSERT(tp_gstate_cost(g, &nx) <= left);
                        }
                    if (tp_gstate_accepting(g, &st) && (n_allowed == 0 || rng_next(&rs) % 8 == 0)) {
                        done = 1; /* end of generation */
                        break;
                    }
                    CU_ASSERT_FATAL(n_allowed > 0);
                    int want = (int)(rng_next(&rs) % (uint64_t)n_allowed), pick = -1;
                    for (int i = 0; i < v.n && pick < 0; i++)
                        if ((mask[i / 32] >> (i % 32) & 1) && want-- == 0) pick = i;
                    CU_ASSERT_FATAL(tp_gstate_feed_bytes(g, &st, v.piece[pick], v.len[pick]));
                    done = tp_gstate_done(g, &st);
                }
                if (!done) fprintf(stderr, "schema %zu max_tokens %d seed %d: not closed\n", si, max_tokens, (int)seed);
                CU_ASSERT(done);
                n_walks++;
            }
        }
        tp_grammar_free(g);
    }
    CU_ASSERT(n_walks > 200);
    tp_mask_ctx_free(mc);
    tp_token_trie_free(t);
    vocab_free(&v);
}

/* Tool-call grammars: {"x-raw-prefix", "x-then"} is the prefix's bytes and
 * then the value (Mistral's name[ARGS]{...}); plain schemas refuse it.
 * Along every accepted string the cost drops by at most one per byte, some
 * byte lowers it by one, and it is 0 at the end. */
static void test_raw_prefix(void)
{
    static const char schema[] =
        "{\"anyOf\":[{\"x-raw-prefix\":\"get\",\"x-then\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
        "\"integer\"}},\"required\":[\"a\"],\"additionalProperties\":false}},{\"x-raw-prefix\":\"get_weather\","
        "\"x-then\":{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}}]}";
    cJSON *sj = cJSON_Parse(schema);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sj);
    tp_grammar_t *g = NULL;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL(tp_grammar_from_schema(sj, &g, &e), TP_ERR_INVALID_ARG);
    CU_ASSERT(strstr(tp_error_msg(&e), "'x-raw-prefix'") != NULL);
    CU_ASSERT_EQUAL_FATAL(tp_grammar_from_tool_schema(sj, &g, &e), TP_OK);
    cJSON_Delete(sj);
    static const char *const yes[] = {"get{\"a\":1}", "get_weather{}", "get{ \"a\" : -5 }"};
    static const char *const no[] = {"got{}", "get{}", "get_weather{\"a\":1}", "{\"a\":1}", "get {\"a\":1}", "get_weather{"};
    for (size_t i = 0; i < TP_ARRAY_LEN(yes); i++) {
        CU_ASSERT(accepts(g, yes[i]));
        static struct tp_gstate st, nx;
        tp_gstate_init(g, &st);
        for (const char *p = yes[i]; *p; p++) {
            const int c0 = tp_gstate_cost(g, &st);
            int down = 0;
            for (int b = 0; b < 256; b++) {
                tp_gstate_copy(&nx, &st);
                if (!tp_gstate_feed(g, &nx, (unsigned char)b)) continue;
                const int c1 = tp_gstate_cost(g, &nx);
                CU_ASSERT(c1 >= c0 - 1);
                down |= c1 == c0 - 1;
            }
            CU_ASSERT(down);
            CU_ASSERT_FATAL(tp_gstate_feed(g, &st, (unsigned char)*p));
        }
        CU_ASSERT(tp_gstate_done(g, &st));
        CU_ASSERT_EQUAL(tp_gstate_cost(g, &st), 0);
    }
    for (size_t i = 0; i < TP_ARRAY_LEN(no); i++) {
        if (accepts(g, no[i])) fprintf(stderr, "raw prefix grammar should reject %s\n", no[i]);
        CU_ASSERT(!accepts(g, no[i]));
    }
    tp_grammar_free(g);
}

static const struct tp_test_case grammar_cases[] = {
    {"accept_reject", test_accept_reject},
    {"refused_keywords", test_refused},
    {"mask_vs_oracle", test_mask_oracle},
    {"pattern_vs_posix", test_pattern_vs_posix},
    {"cost_exact", test_cost_exact},
    {"budget_closes", test_budget_closes},
    {"raw_prefix", test_raw_prefix},
    {NULL, NULL},
};
TP_TEST_SUITE(grammar, "unit", 120, grammar_cases)

/*
 * tests/server/test_tool_parse.c - tool calls in the native formats
 * (server/tool_parse.c).
 *
 * Each case is a reply text with the content and the calls (name, raw
 * arguments) written out by hand.  Besides the final scan, every prefix of
 * the text is scanned as a stream would see it: the content released so far
 * must be a prefix of the final content (never a byte of a marker), a name
 * appears only whole and equal to the final one, and the argument bytes seen
 * so far are a prefix of the final arguments (so streamed fragments
 * concatenate to the non-streamed value).
 */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "server/tool_parse.h"
#include "tp_test.h"

struct tcase {
    enum tp_tool_format f;
    const char *text;
    const char *content;   /* final content */
    int n_calls;           /* complete calls */
    const char *name[3];
    const char *args[3];
};

static const struct tcase cases[] = {
    {TP_TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "",
     1, {"get_weather"}, {"{\"city\": \"Paris\"}"}},
    {TP_TOOL_FORMAT_HERMES,
     "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, {\"y\": \"}\\\"{\"}]}}\n</tool_call>\n"
     "<tool_call>\n{\"arguments\": {}, \"name\": \"b_2\"}\n</tool_call>",
     "Let me check.\n", 2, {"a", "b_2"}, {"{\"x\": [1, {\"y\": \"}\\\"{\"}]}", "{}"}},
    {TP_TOOL_FORMAT_HERMES, "no call here, <tool_ only a prefix", "no call here, <tool_ only a prefix", 0, {0}, {0}},
    {TP_TOOL_FORMAT_HERMES, "text <tool_call>\nnot json</tool_call>", "text <tool_call>\nnot json</tool_call>", 0, {0}, {0}},
    {TP_TOOL_FORMAT_HERMES, "<tool_call>{\"name\": \"\\u00e9t\\u00e9\", \"arguments\": {\"n\": -1.5e3}}", "", 1,
     {"\xC3\xA9t\xC3\xA9"}, {"{\"n\": -1.5e3}"}},
    {TP_TOOL_FORMAT_LLAMA3, "{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}", "", 1, {"get_time"},
     {"{\"tz\": \"UTC\"}"}},
    {TP_TOOL_FORMAT_LLAMA3, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {\"a\": true}}",
     "", 2, {"f", "g"}, {"{}", "{\"a\": true}"}},
    {TP_TOOL_FORMAT_LLAMA3, "  The answer is {1}.", "  The answer is {1}.", 0, {0}, {0}},
    {TP_TOOL_FORMAT_LLAMA3, "{\"name\": \"f\", \"arguments\": {}}", "{\"name\": \"f\", \"arguments\": {}}", 0, {0}, {0}},
    {TP_TOOL_FORMAT_MISTRAL,
     "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}, \"id\": \"abcDEF123\"}, {\"name\": \"g\", \"arguments\": {}}]",
     "", 2, {"f", "g"}, {"{\"q\": \"x\"}", "{}"}},
    {TP_TOOL_FORMAT_MISTRAL, "Sure.[TOOL_CALLS] [ {\"name\":\"h\",\"arguments\":{\"k\":null}} ]", "Sure.", 1, {"h"},
     {"{\"k\":null}"}},
    {TP_TOOL_FORMAT_MISTRAL, "[TOOL_CALLS]{\"name\": \"f\"}", "[TOOL_CALLS]{\"name\": \"f\"}", 0, {0}, {0}},
    {TP_TOOL_FORMAT_JSON, "{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}", "", 1, {"f"}, {"{\"a\": [1, 2]}"}},
    {TP_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", "", 1, {"get_weather"},
     {"{\"city\": \"Paris\"}"}},
    {TP_TOOL_FORMAT_MISTRAL_ARGS, "Checking.[TOOL_CALLS]a.b-c[ARGS]{\"x\": [1, \"}\"]}[TOOL_CALLS]g{}", "Checking.", 2,
     {"a.b-c", "g"}, {"{\"x\": [1, \"}\"]}", "{}"}},
    {TP_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]bad name{}", "[TOOL_CALLS]bad name{}", 0, {0}, {0}},
    {TP_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]f[ARG{}", "[TOOL_CALLS]f[ARG{}", 0, {0}, {0}},
    {TP_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]f[ARGS]{\"a\": 1} trailing", "", 1, {"f"}, {"{\"a\": 1}"}},
    {TP_TOOL_FORMAT_NAME_ARGS, "get_weather{\"city\":\"Paris\",\"days\":2}", "", 1, {"get_weather"},
     {"{\"city\":\"Paris\",\"days\":2}"}},
    {TP_TOOL_FORMAT_NAME_ARGS, "get_weather", "get_weather", 0, {0}, {0}},
    {TP_TOOL_FORMAT_NONE, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
     "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", 0, {0}, {0}},
};

static void check_case(const struct tcase *c)
{
    size_t n = strlen(c->text);
    struct tp_tool_scan fin;
    tp_tool_scan(c->f, c->text, n, 1, &fin);
    int nc = 0;
    for (int k = 0; k < fin.n_calls; k++) nc += fin.calls[k].complete;
    if (fin.content_end != strlen(c->content) || nc != c->n_calls)
        fprintf(stderr, "case '%s': content_end %zu calls %d\n", c->text, fin.content_end, nc);
    CU_ASSERT_EQUAL(fin.content_end, strlen(c->content));
    CU_ASSERT_EQUAL(memcmp(c->text, c->content, fin.content_end), 0);
    CU_ASSERT_EQUAL(nc, c->n_calls);
    for (int k = 0; k < c->n_calls && k < fin.n_calls; k++) {
        const struct tp_tool_call_view *v = &fin.calls[k];
        CU_ASSERT_STRING_EQUAL(v->name, c->name[k]);
        CU_ASSERT_EQUAL(v->args_len, strlen(c->args[k]));
        CU_ASSERT_EQUAL(memcmp(c->text + v->args_off, c->args[k], v->args_len), 0);
        CU_ASSERT(v->args_done);
    }
    /* every prefix, as a stream sees it */
    size_t prev_content = 0;
    for (size_t len = 0; len <= n; len++) {
        struct tp_tool_scan s;
        tp_tool_scan(c->f, c->text, len, 0, &s);
        if (!s.malformed) {
            CU_ASSERT(s.content_end >= prev_content);
            prev_content = s.content_end;
        }
        if (c->n_calls > 0) {
            CU_ASSERT(s.content_end <= fin.content_end);
            for (int k = 0; k < s.n_calls && k < fin.n_calls; k++) {
                const struct tp_tool_call_view *v = &s.calls[k];
                if (v->name[0]) CU_ASSERT_STRING_EQUAL(v->name, fin.calls[k].name);
                if (v->args_len) {
                    CU_ASSERT_EQUAL(v->args_off, fin.calls[k].args_off);
                    CU_ASSERT(v->args_len <= fin.calls[k].args_len);
                }
            }
        }
    }
}

static void test_formats(void)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) check_case(&cases[i]);
}

static void test_markers(void)
{
    size_t off = 99;
    const char *h = "ok <tool_call>\n{\"name\"";
    CU_ASSERT_EQUAL(tp_tool_marker_find(TP_TOOL_FORMAT_HERMES, h, strlen(h), 0, &off), 1);
    CU_ASSERT_EQUAL(off, 15u);
    CU_ASSERT_EQUAL(tp_tool_marker_find(TP_TOOL_FORMAT_HERMES, h, strlen(h), 4, &off), 0);
    CU_ASSERT_EQUAL(tp_tool_marker_find(TP_TOOL_FORMAT_HERMES, "<tool_call>\n", 12, 0, &off), 1); /* JSON still to come */
    CU_ASSERT_EQUAL(off, 12u);
    CU_ASSERT_EQUAL(tp_tool_marker_find(TP_TOOL_FORMAT_LLAMA3, "<|python_tag|>", 14, 0, &off), 1);
    CU_ASSERT_EQUAL(off, 14u);
    const char *l = " <|python_tag|>{";
    CU_ASSERT_EQUAL(tp_tool_marker_find(TP_TOOL_FORMAT_LLAMA3, l, strlen(l), 0, &off), 1);
    CU_ASSERT_EQUAL(off, strlen(l) - 1);
    CU_ASSERT_EQUAL(tp_tool_marker_find(TP_TOOL_FORMAT_LLAMA3, "Hi {", 4, 0, &off), 0);
    const char *m = "x[TOOL_CALLS][";
    CU_ASSERT_EQUAL(tp_tool_marker_find(TP_TOOL_FORMAT_MISTRAL, m, strlen(m), 0, &off), 1);
    CU_ASSERT_EQUAL(off, strlen(m) - 1);
    CU_ASSERT_STRING_EQUAL(tp_tool_marker_token(TP_TOOL_FORMAT_HERMES), "<tool_call>");
    CU_ASSERT_PTR_NULL(tp_tool_marker_token(TP_TOOL_FORMAT_JSON));
    /* a partial marker is held back while streaming, released at the end */
    struct tp_tool_scan s;
    tp_tool_scan(TP_TOOL_FORMAT_HERMES, "Hello <tool", 11, 0, &s);
    CU_ASSERT_EQUAL(s.content_end, 6u);
    tp_tool_scan(TP_TOOL_FORMAT_HERMES, "Hello <tool", 11, 1, &s);
    CU_ASSERT_EQUAL(s.content_end, 11u);
    /* a call cut short: its arguments so far, not complete; final: malformed, all content */
    const char *cut = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"xy";
    tp_tool_scan(TP_TOOL_FORMAT_HERMES, cut, strlen(cut), 0, &s);
    CU_ASSERT_EQUAL(s.n_calls, 1);
    CU_ASSERT_STRING_EQUAL(s.calls[0].name, "f");
    CU_ASSERT_EQUAL(s.calls[0].args_len, strlen("{\"a\": \"xy"));
    CU_ASSERT_EQUAL(s.calls[0].complete, 0);
    tp_tool_scan(TP_TOOL_FORMAT_HERMES, cut, strlen(cut), 1, &s);
    CU_ASSERT_EQUAL(s.malformed, 1);
    CU_ASSERT_EQUAL(s.content_end, strlen(cut));
}

static const struct tp_test_case tool_parse_cases[] = {
    {"formats", test_formats},
    {"markers", test_markers},
    {NULL, NULL},
};
TP_TEST_SUITE(tool_parse, "unit", 60, tool_parse_cases)

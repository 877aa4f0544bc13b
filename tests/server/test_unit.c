/*
 * tests/server/test_unit.c - server pieces that need no model: request
 * validation, the stop-string matcher, SSE framing, OpenAI error bodies,
 * UTF-8 validation, Prometheus metrics text, and the chat templates against
 * the outputs of the reference Jinja engine (tests/server/chat_expected.json,
 * written by tests/node/render_templates.mjs with @huggingface/jinja).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/server_impl.h"
#include "tp_test.h"

/* ------------------------------------------------------------ validation */

static enum tp_status parse(const char *body, int chat, struct tp_req_params *p, struct tp_api_error *e)
{
    return tp_req_parse(body, strlen(body), chat, 512, 256, p, e);
}

static void expect_bad(const char *body, int chat, const char *param)
{
    struct tp_req_params p;
    struct tp_api_error e;
    memset(&e, 0, sizeof e);
    enum tp_status rc = parse(body, chat, &p, &e);
    if (rc == TP_OK) {
        fprintf(stderr, "accepted but should be refused: %s\n", body);
        tp_req_params_free(&p);
    }
    CU_ASSERT_NOT_EQUAL(rc, TP_OK);
    CU_ASSERT_EQUAL(e.status, rc);
    CU_ASSERT(rc == TP_ERR_INVALID_ARG || rc == TP_ERR_FORMAT || rc == TP_ERR_UNSUPPORTED);
    CU_ASSERT_EQUAL(tp_http_error_kind(rc).http_status, 400);
    if (param) {
        if (strcmp(e.param, param) != 0) fprintf(stderr, "%s: param '%s', want '%s'\n", body, e.param, param);
        CU_ASSERT_STRING_EQUAL(e.param, param);
    }
    CU_ASSERT(strlen(e.message) > 10);
}

static void test_validate_good(void)
{
    struct tp_req_params p;
    struct tp_api_error e;
    CU_ASSERT_EQUAL_FATAL(parse("{\"prompt\":\"hi\",\"max_tokens\":5,\"temperature\":0,\"top_p\":0.5,\"top_k\":3,"
                                "\"min_p\":0.1,\"seed\":-7,\"stop\":[\"a\",\"bc\"],\"stream\":true,"
                                "\"stream_options\":{\"include_usage\":true},\"logprobs\":2,\"unknown\":[1,{}],"
                                "\"user\":\"u\",\"n\":1,\"presence_penalty\":null}",
                                0, &p, &e),
                          0);
    CU_ASSERT_STRING_EQUAL(p.prompt, "hi");
    CU_ASSERT_EQUAL(p.max_tokens, 5);
    CU_ASSERT_EQUAL(p.temperature, 0.0f);
    CU_ASSERT_EQUAL(p.top_k, 3);
    CU_ASSERT_EQUAL(p.has_seed, 1);
    CU_ASSERT_EQUAL((int64_t)p.seed, -7);
    CU_ASSERT_EQUAL(p.n_stop, 2);
    CU_ASSERT_STRING_EQUAL(p.stop[1], "bc");
    CU_ASSERT_EQUAL(p.stream, 1);
    CU_ASSERT_EQUAL(p.include_usage, 1);
    CU_ASSERT_EQUAL(p.logprobs, 1);
    CU_ASSERT_EQUAL(p.top_logprobs, 2);
    CU_ASSERT_EQUAL(p.presence_penalty, 0.0f);
    tp_req_params_free(&p);

    CU_ASSERT_EQUAL_FATAL(parse("{\"prompt\":[1,2,3]}", 0, &p, &e), 0);
    CU_ASSERT_EQUAL(p.n_prompt_ids, 3);
    CU_ASSERT_EQUAL(p.prompt_ids[2], 3);
    CU_ASSERT_EQUAL(p.max_tokens, -1);
    CU_ASSERT_EQUAL(p.temperature, 1.0f);
    tp_req_params_free(&p);

    CU_ASSERT_EQUAL_FATAL(parse("{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":"
                                "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                                "{\"role\":\"assistant\",\"content\":null}],\"max_completion_tokens\":7,"
                                "\"logprobs\":true,\"top_logprobs\":3}",
                                1, &p, &e),
                          0);
    CU_ASSERT_EQUAL(p.n_msgs, 3);
    CU_ASSERT_STRING_EQUAL(p.msgs[1].content, "a\nb"); /* text parts joined as llama-server joins them */
    CU_ASSERT_STRING_EQUAL(p.msgs[2].content, "");
    CU_ASSERT_STRING_EQUAL(p.msgs[2].role, "assistant");
    CU_ASSERT_EQUAL(p.max_tokens, 7);
    CU_ASSERT_EQUAL(p.top_logprobs, 3);
    tp_req_params_free(&p);
}

static void test_validate_bad(void)
{
    expect_bad("", 0, NULL);
    expect_bad("{", 0, NULL);
    expect_bad("[]", 0, NULL);
    expect_bad("{\"prompt\":\"a\"} x", 0, NULL);
    expect_bad("{\"prompt\":\"\xff\"}", 0, NULL);
    expect_bad("{}", 0, "prompt");
    expect_bad("{\"prompt\":5}", 0, "prompt");
    expect_bad("{\"prompt\":[]}", 0, "prompt");
    expect_bad("{\"prompt\":[\"a\",\"b\"]}", 0, "prompt");
    expect_bad("{\"prompt\":[1,600]}", 0, "prompt");
    expect_bad("{\"prompt\":[1,-1]}", 0, "prompt");
    expect_bad("{\"prompt\":[1.5]}", 0, "prompt");
    expect_bad("{\"prompt\":\"a\",\"max_tokens\":-1}", 0, "max_tokens");
    expect_bad("{\"prompt\":\"a\",\"max_tokens\":0}", 0, "max_tokens");
    expect_bad("{\"prompt\":\"a\",\"max_tokens\":1e12}", 0, "max_tokens");
    expect_bad("{\"prompt\":\"a\",\"max_tokens\":257}", 0, "max_tokens");
    expect_bad("{\"prompt\":\"a\",\"max_tokens\":\"5\"}", 0, "max_tokens");
    expect_bad("{\"prompt\":\"a\",\"max_tokens\":2.5}", 0, "max_tokens");
    expect_bad("{\"prompt\":\"a\",\"temperature\":-0.1}", 0, "temperature");
    expect_bad("{\"prompt\":\"a\",\"temperature\":2.5}", 0, "temperature");
    expect_bad("{\"prompt\":\"a\",\"temperature\":\"hot\"}", 0, "temperature");
    expect_bad("{\"prompt\":\"a\",\"top_p\":0}", 0, "top_p");
    expect_bad("{\"prompt\":\"a\",\"top_p\":1.1}", 0, "top_p");
    expect_bad("{\"prompt\":\"a\",\"top_k\":-2}", 0, "top_k");
    expect_bad("{\"prompt\":\"a\",\"min_p\":2}", 0, "min_p");
    expect_bad("{\"prompt\":\"a\",\"presence_penalty\":3}", 0, "presence_penalty");
    expect_bad("{\"prompt\":\"a\",\"frequency_penalty\":-3}", 0, "frequency_penalty");
    expect_bad("{\"prompt\":\"a\",\"repetition_penalty\":0}", 0, "repetition_penalty");
    expect_bad("{\"prompt\":\"a\",\"seed\":\"x\"}", 0, "seed");
    expect_bad("{\"prompt\":\"a\",\"seed\":1.5}", 0, "seed");
    expect_bad("{\"prompt\":\"a\",\"n\":2}", 0, "n");
    expect_bad("{\"prompt\":\"a\",\"stop\":5}", 0, "stop");
    expect_bad("{\"prompt\":\"a\",\"stop\":[\"\"]}", 0, "stop");
    expect_bad("{\"prompt\":\"a\",\"stop\":[1]}", 0, "stop");
    expect_bad("{\"prompt\":\"a\",\"stream\":\"yes\"}", 0, "stream");
    expect_bad("{\"prompt\":\"a\",\"stream_options\":1}", 0, "stream_options");
    expect_bad("{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":1}}", 0, "stream_options.include_usage");
    expect_bad("{\"prompt\":\"a\",\"logprobs\":21}", 0, "logprobs");
    expect_bad("{\"prompt\":\"a\",\"model\":5}", 0, "model");
    expect_bad("{\"prompt\":\"a\",\"user\":5}", 0, "user");
    expect_bad("{\"messages\":[]}", 1, "messages");
    expect_bad("{\"messages\":{}}", 1, "messages");
    expect_bad("{}", 1, "messages");
    expect_bad("{\"messages\":[1]}", 1, "messages[0]");
    expect_bad("{\"messages\":[{\"content\":\"x\"}]}", 1, "messages[0].role");
    expect_bad("{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 1, "messages[0].role");
    expect_bad("{\"messages\":[{\"role\":\"user\"}]}", 1, "messages[0].content");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 1, "messages[0].content");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 1, "messages[0].content[0]");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":1}", 1, "logprobs");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":2}", 1, "top_logprobs");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_completion_tokens\":0}", 1,
               "max_completion_tokens");
}

/* ------------------------------------------------------------ stop strings */

/* Lengths of C-string stop strings. */
static const size_t *lens_of(char *const *stops, int n)
{
    static size_t l[TP_MAX_STOP];
    for (int i = 0; i < n; i++) l[i] = strlen(stops[i]);
    return l;
}

/* Feed text piece by piece as tokens would arrive; returns what the client sees. */
static void stream_stops(const char *const *pieces, int n, char *const *stops, int n_stop, char *seen, int *stopped)
{
    char text[512] = "";
    size_t released = 0;
    seen[0] = '\0';
    *stopped = 0;
    for (int i = 0; i < n; i++) {
        strcat(text, pieces[i]);
        int hit = 0;
        size_t rel = tp_stop_scan(text, strlen(text), released, stops, lens_of(stops, n_stop), n_stop, &hit);
        CU_ASSERT(rel >= released);
        strncat(seen, text + released, rel - released);
        released = rel;
        if (hit) {
            *stopped = 1;
            return;
        }
    }
    strcat(seen, text + released); /* end of generation flushes the held tail */
}

static void test_stop_strings(void)
{
    char *stops[] = {"END", "\n\n", "xyz"};
    char seen[512];
    int stopped;
    const char *a[] = {"Hello", " E", "N", "D", " more"};
    stream_stops(a, 5, stops, 3, seen, &stopped);
    CU_ASSERT_STRING_EQUAL(seen, "Hello ");
    CU_ASSERT_EQUAL(stopped, 1);
    const char *b[] = {"Hello", " EN", "Z", " ok"};
    stream_stops(b, 4, stops, 3, seen, &stopped);
    CU_ASSERT_STRING_EQUAL(seen, "Hello ENZ ok");
    CU_ASSERT_EQUAL(stopped, 0);
    const char *c[] = {"a\n", "\nb"};
    stream_stops(c, 2, stops, 3, seen, &stopped);
    CU_ASSERT_STRING_EQUAL(seen, "a");
    CU_ASSERT_EQUAL(stopped, 1);
    const char *d[] = {"xyEND"};
    stream_stops(d, 1, stops, 3, seen, &stopped);
    CU_ASSERT_STRING_EQUAL(seen, "xy");
    const char *e[] = {"trailing E"};
    stream_stops(e, 1, stops, 3, seen, &stopped);
    CU_ASSERT_STRING_EQUAL(seen, "trailing E");
    CU_ASSERT_EQUAL(stopped, 0);
    /* the held-back part is exactly the longest stop prefix */
    int hit;
    CU_ASSERT_EQUAL(tp_stop_scan("abcxy", 5, 0, stops, lens_of(stops, 3), 3, &hit), 3);
    CU_ASSERT_EQUAL(hit, 0);
    CU_ASSERT_EQUAL(tp_stop_scan("abc", 3, 0, NULL, NULL, 0, &hit), 3);
    /* earliest occurrence wins across stop strings */
    char *s2[] = {"cd", "b"};
    CU_ASSERT_EQUAL(tp_stop_scan("abcd", 4, 0, s2, lens_of(s2, 2), 2, &hit), 1);
    CU_ASSERT_EQUAL(hit, 1);
    /* NUL is an ordinary byte: "the\0zzz" does not match "the dog", holds
     * back a tail "the\0z" that may still grow into it, matches the full bytes */
    char nulstop[] = "the\0zzz";
    char *s3[] = {nulstop};
    const size_t l3[] = {7};
    CU_ASSERT_EQUAL(tp_stop_scan("the dog", 7, 0, s3, l3, 1, &hit), 7);
    CU_ASSERT_EQUAL(hit, 0);
    CU_ASSERT_EQUAL(tp_stop_scan("the", 3, 0, s3, l3, 1, &hit), 0); /* "the" is held back, not a match */
    CU_ASSERT_EQUAL(hit, 0);
    CU_ASSERT_EQUAL(tp_stop_scan("xthe\0z", 6, 0, s3, l3, 1, &hit), 1);
    CU_ASSERT_EQUAL(hit, 0);
    CU_ASSERT_EQUAL(tp_stop_scan("xthe\0zzz!", 9, 0, s3, l3, 1, &hit), 1);
    CU_ASSERT_EQUAL(hit, 1);
    CU_ASSERT_EQUAL(tp_stop_scan("xthe\0zzy", 8, 0, s3, l3, 1, &hit), 8);
    CU_ASSERT_EQUAL(hit, 0);
}

/* ------------------------------------------------------------ NUL in JSON */

static void test_nul_strings(void)
{
    struct tp_req_params p;
    struct tp_api_error e;
    /* prompt: \u0000 is a NUL byte with the length kept; \\u0000 is a backslash + "u0000" */
    CU_ASSERT_EQUAL_FATAL(parse("{\"prompt\":\"a\\u0000b\\\\u0000\",\"stop\":[\"the\\u0000zzz\",\"\\u0000\"]}", 0,
                                &p, &e), 0);
    CU_ASSERT_EQUAL(p.prompt_len, 9);
    CU_ASSERT(memcmp(p.prompt, "a\0b\\u0000", 9) == 0);
    CU_ASSERT_EQUAL(p.n_stop, 2);
    CU_ASSERT_EQUAL(p.stop_len[0], 7);
    CU_ASSERT(memcmp(p.stop[0], "the\0zzz", 7) == 0);
    CU_ASSERT_EQUAL(p.stop_len[1], 1);
    CU_ASSERT_EQUAL(p.stop[1][0], '\0');
    tp_req_params_free(&p);
    /* prompt given as a one-string list */
    CU_ASSERT_EQUAL_FATAL(parse("{\"prompt\":[\"\\u0000x\"]}", 0, &p, &e), 0);
    CU_ASSERT_EQUAL(p.prompt_len, 2);
    CU_ASSERT(p.prompt[0] == '\0' && p.prompt[1] == 'x');
    tp_req_params_free(&p);
    /* chat content keeps NUL in tree form through the template, decoded after rendering */
    CU_ASSERT_EQUAL_FATAL(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"},{\"role\":\"assistant\","
                                "\"content\":[{\"type\":\"text\",\"text\":\"\\u0000\"}]}]}", 1, &p, &e), 0);
    struct tp_buf out = {0};
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_chat_render(TP_CHAT_PLAIN, p.msgs, p.n_msgs, 1, "", "", NULL, &out, &err), TP_OK);
    size_t n = tp_json_decode_nul(out.data, out.len);
    const char want[] = "user: a\0b\nassistant: \0\nassistant:";
    CU_ASSERT_EQUAL(n, sizeof want - 1);
    CU_ASSERT(n == sizeof want - 1 && memcmp(out.data, want, n) == 0);
    tp_buf_free(&out);
    tp_req_params_free(&p);
    /* fields that cannot hold NUL: 400 naming them */
    expect_bad("{\"messages\":[{\"role\":\"user\\u0000\",\"content\":\"a\"}]}", 1, "messages[0].role");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"\\u0000assistant\",\"content\":\"b\"}]}",
               1, "messages[1].role");
    expect_bad("{\"prompt\":\"a\",\"model\":\"m\\u0000\"}", 0, "model");
    /* a raw NUL byte in the body, and the C0 80 sentinel written raw (invalid UTF-8) */
    static const char raw[] = "{\"prompt\":\"a\0b\"}";
    CU_ASSERT_EQUAL(tp_req_parse(raw, sizeof raw - 1, 0, 512, 256, &p, &e), TP_ERR_FORMAT);
    CU_ASSERT_EQUAL(e.status, TP_ERR_FORMAT);
    CU_ASSERT_EQUAL(tp_http_error_kind(e.status).http_status, 400);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "NUL"));
    expect_bad("{\"prompt\":\"a\xC0\x80\"}", 0, NULL);
    /* a high surrogate followed by \u0000 is not a pair */
    expect_bad("{\"prompt\":\"\\ud800\\u0000\"}", 0, NULL);
    /* the error offset counts the original \u0000 escapes */
    expect_bad("{\"prompt\":\"\\u0000\" x}", 0, NULL);
    CU_ASSERT_EQUAL(tp_req_parse("{\"prompt\":\"\\u0000\" x}", 21, 0, 512, 256, &p, &e), TP_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "byte 19"));

    /* output: NUL bytes printed as \u0000, invalid UTF-8 as U+FFFD, keys too */
    cJSON *o = cJSON_CreateObject();
    CU_ASSERT_EQUAL(tp_json_add_bytes(o, "t", "a\0b\xff\n", 5), TP_OK);
    struct tp_buf key = {0};
    CU_ASSERT_EQUAL(tp_json_encode_bytes("\0", 1, &key), TP_OK);
    cJSON_AddNumberToObject(o, key.data, 1);
    tp_buf_free(&key);
    char *js = tp_json_print(o);
    CU_ASSERT_STRING_EQUAL(js, "{\"t\":\"a\\u0000b\xEF\xBF\xBD\\n\",\"\\u0000\":1}");
    /* and it parses back to the same bytes */
    cJSON *back = tp_json_parse(js, strlen(js), &e);
    CU_ASSERT_PTR_NOT_NULL_FATAL(back);
    char *b = NULL;
    size_t bl = 0;
    CU_ASSERT_EQUAL(tp_json_bytes(cJSON_GetObjectItemCaseSensitive(back, "t"), &b, &bl), TP_OK);
    CU_ASSERT(bl == 7 && memcmp(b, "a\0b\xEF\xBF\xBD\n", 7) == 0);
    free(b);
    cJSON_Delete(back);
    free(js);
    cJSON_Delete(o);
    /* an error message quoting a NUL-holding value stays valid JSON */
    tp_api_err(&e, TP_ERR_INVALID_ARG, "x", "bad '%s'", "a\xC0\x80");
    js = tp_api_error_json(&e);
    CU_ASSERT_PTR_NOT_NULL(strstr(js, "bad 'a\\u0000'"));
    CU_ASSERT(tp_srv_utf8_valid(js, strlen(js)));
    free(js);
}

/* ------------------------------------------------------------ seed, refused fields, logit_bias */

static uint64_t seed_of(const char *body)
{
    struct tp_req_params p;
    struct tp_api_error e;
    enum tp_status rc = parse(body, 0, &p, &e);
    CU_ASSERT_EQUAL(rc, TP_OK);
    if (rc != TP_OK) {
        fprintf(stderr, "%s: %s\n", body, e.message);
        return 0;
    }
    CU_ASSERT_EQUAL(p.has_seed, 1);
    uint64_t s = p.seed;
    tp_req_params_free(&p);
    return s;
}

static void test_seed_range(void)
{
    CU_ASSERT_EQUAL(seed_of("{\"prompt\":\"a\",\"seed\":9223372036854775808}"), 1ull << 63);
    CU_ASSERT_EQUAL(seed_of("{\"prompt\":\"a\",\"seed\":9223372036854775809}"), (1ull << 63) + 1);
    CU_ASSERT_EQUAL(seed_of("{\"prompt\":\"a\",\"seed\":18446744073709551615}"), UINT64_MAX);
    CU_ASSERT_EQUAL(seed_of("{\"prompt\":\"a\",\"seed\":-9223372036854775808}"), 1ull << 63);
    CU_ASSERT_EQUAL(seed_of("{\"prompt\":\"a\",\"seed\":-1}"), UINT64_MAX);
    CU_ASSERT_EQUAL(seed_of("{\"prompt\":\"a\",\"seed\":0}"), 0);
    CU_ASSERT_EQUAL(seed_of("{\"prompt\":\"a\",\"seed\":1e3}"), 1000);
    /* the top-level member, not a nested one; an escaped name; the first of duplicates (as cJSON) */
    CU_ASSERT_EQUAL(seed_of("{\"x\":{\"seed\":1,\"s\":\"}\\\"\"},\"prompt\":\"a\",\"seed\" : 18446744073709551614 }"),
                    UINT64_MAX - 1);
    CU_ASSERT_EQUAL(seed_of("{\"prompt\":\"a\",\"s\\u0065ed\":12345678901234567891}"), 12345678901234567891ull);
    CU_ASSERT_EQUAL(seed_of("{\"prompt\":\"a\",\"seed\":7,\"seed\":8}"), 7);
    expect_bad("{\"prompt\":\"a\",\"seed\":18446744073709551616}", 0, "seed");
    expect_bad("{\"prompt\":\"a\",\"seed\":-9223372036854775809}", 0, "seed");
    expect_bad("{\"prompt\":\"a\",\"seed\":1e30}", 0, "seed");
    expect_bad("{\"prompt\":\"a\",\"seed\":true}", 0, "seed");
}

static void test_refused_fields(void)
{
    static const char *const bad[][2] = {
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"integer\",\"minimum\":1}}}", "response_format.json_schema.schema"},
        {"\"response_format\":{\"type\":\"json_schema\"}", "response_format.json_schema"},
        {"\"response_format\":\"text\"", "response_format"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bad name\"}}],\"tool_choice\":\"required\"", "tools"},
        {"\"tool_choice\":\"required\"", "tool_choice"},
        {"\"tool_choice\":{\"type\":\"function\"}", "tool_choice"},
        {"\"functions\":[{\"name\":\"f\"}]", "functions"},
        {"\"function_call\":{\"name\":\"f\"}", "function_call"},
        {"\"echo\":true", "echo"},
        {"\"echo\":1", "echo"},
        {"\"best_of\":2", "best_of"},
        {"\"best_of\":0", "best_of"},
        {"\"suffix\":\"end\"", "suffix"},
        {"\"n\":2", "n"},
        {"\"n\":0", "n"},
        {"\"modalities\":[\"text\",\"audio\"]", "modalities"},
        {"\"audio\":{\"voice\":\"x\"}", "audio"},
        {"\"web_search_options\":{}", "web_search_options"},
        {"\"reasoning_effort\":\"maximal\"", "reasoning_effort"},
    };
    char body[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"a\",%s}", bad[i][0]);
        expect_bad(body, 0, bad[i][1]);
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],%s}", bad[i][0]);
        expect_bad(body, 1, bad[i][1]);
    }
    /* values that ask for the default behaviour, null, and fields that do not change the output */
    struct tp_req_params p;
    struct tp_api_error e;
    CU_ASSERT_EQUAL(parse("{\"prompt\":\"a\",\"echo\":false,\"best_of\":1,\"n\":1,\"suffix\":\"\",\"tools\":[],"
                          "\"functions\":[],\"tool_choice\":\"none\",\"function_call\":\"auto\","
                          "\"response_format\":{\"type\":\"text\"},\"modalities\":[\"text\"],\"audio\":null,"
                          "\"user\":\"u\",\"metadata\":{\"k\":\"v\"},\"store\":false,\"service_tier\":\"auto\","
                          "\"parallel_tool_calls\":true}", 0, &p, &e), 0);
    tp_req_params_free(&p);
}

static void test_logit_bias_parse(void)
{
    struct tp_req_params p;
    struct tp_api_error e;
    CU_ASSERT_EQUAL_FATAL(parse("{\"prompt\":\"a\",\"logit_bias\":{\"300\":5,\"7\":-100,\"0\":100,\"511\":-0.5}}", 0,
                                &p, &e), 0);
    CU_ASSERT_EQUAL_FATAL(p.n_logit_bias, 4);
    const int32_t ids[] = {0, 7, 300, 511};
    const float vals[] = {100.0f, -100.0f, 5.0f, -0.5f};
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(p.bias_id[i], ids[i]);
        CU_ASSERT_EQUAL(p.bias_val[i], vals[i]);
    }
    tp_req_params_free(&p);
    CU_ASSERT_EQUAL_FATAL(parse("{\"prompt\":\"a\",\"logit_bias\":{}}", 0, &p, &e), 0);
    CU_ASSERT_EQUAL(p.n_logit_bias, 0);
    tp_req_params_free(&p);
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":[1]}", 0, "logit_bias");
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":{\"abc\":1}}", 0, "logit_bias");
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":{\"512\":1}}", 0, "logit_bias");
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":{\"-1\":1}}", 0, "logit_bias");
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":{\"\":1}}", 0, "logit_bias");
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":{\"1\\u0000\":1}}", 0, "logit_bias");
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":{\"99999999999\":1}}", 0, "logit_bias");
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":{\"5\":100.5}}", 0, "logit_bias");
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":{\"5\":-101}}", 0, "logit_bias");
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":{\"5\":\"1\"}}", 0, "logit_bias");
    expect_bad("{\"prompt\":\"a\",\"logit_bias\":{\"5\":1,\"5\":2}}", 0, "logit_bias");
    /* every token banned; more entries than TP_MAX_LOGIT_BIAS (vocabulary 2048 here) */
    struct tp_buf b = {0};
    tp_buf_puts(&b, "{\"prompt\":\"a\",\"logit_bias\":{");
    for (int i = 0; i < 512; i++) tp_buf_printf(&b, "%s\"%d\":-100", i ? "," : "", i);
    tp_buf_puts(&b, "}}");
    CU_ASSERT_EQUAL(tp_req_parse(b.data, b.len, 0, 512, 256, &p, &e), TP_ERR_INVALID_ARG);
    CU_ASSERT_STRING_EQUAL(e.param, "logit_bias");
    CU_ASSERT_EQUAL(tp_req_parse(b.data, b.len, 0, 513, 256, &p, &e), TP_OK); /* one token left */
    CU_ASSERT_EQUAL(p.n_logit_bias, 512);
    tp_req_params_free(&p);
    b.len = 0;
    tp_buf_puts(&b, "{\"prompt\":\"a\",\"logit_bias\":{");
    for (int i = 0; i <= TP_MAX_LOGIT_BIAS; i++) tp_buf_printf(&b, "%s\"%d\":1", i ? "," : "", i);
    tp_buf_puts(&b, "}}");
    CU_ASSERT_EQUAL(tp_req_parse(b.data, b.len, 0, 2048, 256, &p, &e), TP_ERR_INVALID_ARG);
    CU_ASSERT_STRING_EQUAL(e.param, "logit_bias");
    tp_buf_free(&b);
}

/* ------------------------------------------------------------ framing, errors */

static void test_sse_and_errors(void)
{
    struct tp_buf b = {0};
    CU_ASSERT_EQUAL(tp_sse_data(&b, "{\"a\":1}"), TP_OK);
    CU_ASSERT_EQUAL(tp_sse_comment(&b, "keep-alive"), TP_OK);
    CU_ASSERT_EQUAL(tp_sse_done(&b), TP_OK);
    CU_ASSERT_STRING_EQUAL(b.data, "data: {\"a\":1}\n\n: keep-alive\n\ndata: [DONE]\n\n");
    tp_buf_free(&b);

    struct tp_api_error e;
    CU_ASSERT_EQUAL(tp_api_err(&e, TP_ERR_FULL, NULL, "busy %d", 3), TP_ERR_FULL);
    char *j = tp_api_error_json(&e);
    CU_ASSERT_STRING_EQUAL(j, "{\"error\":{\"message\":\"busy 3\",\"type\":\"rate_limit_error\",\"param\":null,"
                              "\"code\":\"rate_limit_exceeded\"}}");
    free(j);
    tp_api_err(&e, TP_ERR_INVALID_ARG, "max_tokens", "bad \"quote\"");
    j = tp_api_error_json(&e);
    CU_ASSERT_STRING_EQUAL(j, "{\"error\":{\"message\":\"bad \\\"quote\\\"\",\"type\":\"invalid_request_error\","
                              "\"param\":\"max_tokens\",\"code\":null}}");
    free(j);

    /* the one status -> HTTP mapping of the edge (docs/http.md lists it) */
    static const struct {
        enum tp_status st;
        int http;
        const char *type, *header;
    } map[] = {
        {TP_ERR_INVALID_ARG, 400, "invalid_request_error", NULL}, {TP_ERR_FORMAT, 400, "invalid_request_error", NULL},
        {TP_ERR_UNSUPPORTED, 400, "invalid_request_error", NULL}, {TP_ERR_DENIED, 401, "invalid_request_error", "WWW-Authenticate"},
        {TP_ERR_NOT_FOUND, 404, "invalid_request_error", NULL},   {TP_ERR_NOT_ALLOWED, 405, "invalid_request_error", "Allow"},
        {TP_ERR_TOO_LARGE, 413, "invalid_request_error", NULL},   {TP_ERR_FULL, 429, "rate_limit_error", "Retry-After"},
        {TP_ERR_PROTOCOL, 431, "invalid_request_error", NULL},    {TP_ERR_CANCELLED, 499, "invalid_request_error", NULL},
        {TP_ERR_NOMEM, 500, "server_error", NULL},                {TP_ERR_INTERNAL, 500, "server_error", NULL},
        {TP_ERR_IO, 500, "server_error", NULL},                   {TP_ERR_BUSY, 503, "server_error", "Retry-After"},
        {TP_ERR_PEER, 503, "server_error", "Retry-After"},        {TP_ERR_TIMEOUT, 503, "server_error", "Retry-After"},
        {TP_ERR_POISONED, 503, "server_error", "Retry-After"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(map); i++) {
        struct tp_http_error_kind k = tp_http_error_kind(map[i].st);
        CU_ASSERT_EQUAL(k.http_status, map[i].http);
        CU_ASSERT_STRING_EQUAL(k.type, map[i].type);
        if (map[i].header) {
            CU_ASSERT(k.header_name && strcmp(k.header_name, map[i].header) == 0);
        } else {
            CU_ASSERT_PTR_NULL(k.header_name);
        }
    }
    /* a request-specific code overrides the status's default */
    tp_api_err(&e, TP_ERR_NOT_FOUND, "model", "no model");
    e.code = "model_not_found";
    j = tp_api_error_json(&e);
    CU_ASSERT_PTR_NOT_NULL(strstr(j, "\"code\":\"model_not_found\""));
    free(j);

    CU_ASSERT(tp_srv_utf8_valid("h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x98\x80", 15));
    CU_ASSERT(!tp_srv_utf8_valid("\xc3", 1));
    CU_ASSERT(!tp_srv_utf8_valid("\xc0\xaf", 2));         /* overlong */
    CU_ASSERT(!tp_srv_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    CU_ASSERT(!tp_srv_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    CU_ASSERT(!tp_srv_utf8_valid("\x80", 1));
}

/* ------------------------------------------------------------ metrics */

static void test_metrics_text(void)
{
    struct tp_metrics *m = tp_metrics_new();
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    tp_metrics_request(m, 200);
    tp_metrics_request(m, 200);
    tp_metrics_request(m, 429);
    tp_metrics_request(m, 418);
    tp_metrics_finished(m, 10, 5, 0.03, 0.004);
    tp_metrics_finished(m, 7, 1, 20.0, -1);
    struct tp_metrics_gauges g = {.queue_depth = 3, .active_seqs = 2, .n_parallel = 8, .healthy = 1, .n_ranks = 2,
                                  .n_steps = 9, .n_rank_stats = 2, .ns_comm = {1500000000ull, 2250000000ull},
                                  .ns_compute = {0, 4000000ull}, .bytes_sent = {123, 456}};
    struct tp_buf b = {0};
    CU_ASSERT_EQUAL_FATAL(tp_metrics_render(m, &g, &b), 0);
    const char *want[] = {
        "tpserve_requests_total{status=\"200\"} 2\n",
        "tpserve_requests_total{status=\"429\"} 1\n",
        "tpserve_requests_total{status=\"other\"} 1\n",
        "tpserve_prompt_tokens_total 17\n",
        "tpserve_generated_tokens_total 6\n",
        "tpserve_time_to_first_token_seconds_bucket{le=\"0.025\"} 0\n",
        "tpserve_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n",
        "tpserve_time_to_first_token_seconds_bucket{le=\"30\"} 2\n",
        "tpserve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n",
        "tpserve_time_to_first_token_seconds_count 2\n",
        "tpserve_time_per_output_token_seconds_bucket{le=\"0.005\"} 1\n",
        "tpserve_time_per_output_token_seconds_count 1\n",
        "tpserve_queue_depth 3\n",
        "tpserve_active_sequences 2\n",
        "tpserve_comm_seconds_total{rank=\"0\"} 1.500000\n",
        "tpserve_comm_seconds_total{rank=\"1\"} 2.250000\n",
        "tpserve_compute_seconds_total{rank=\"1\"} 0.004000\n",
        "tpserve_comm_bytes_sent_total{rank=\"0\"} 123\n",
        "tpserve_comm_bytes_sent_total{rank=\"1\"} 456\n",
        "# TYPE tpserve_time_to_first_token_seconds histogram\n",
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(want); i++) {
        if (!strstr(b.data, want[i])) fprintf(stderr, "missing: %s", want[i]);
        CU_ASSERT_PTR_NOT_NULL(strstr(b.data, want[i]));
    }
    /* every sample line belongs to a family announced by # TYPE before it */
    char *copy = strdup(b.data);
    char family[128] = "";
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "# TYPE ", 7) == 0) {
            sscanf(line + 7, "%127s", family);
        } else if (line[0] != '#') {
            CU_ASSERT(family[0] && strncmp(line, family, strlen(family)) == 0);
        }
    }
    free(copy);
    tp_buf_free(&b);
    tp_metrics_free(m);
}

static void test_metrics_promtool(void)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        tp_test_skip("promtool not installed (Debian package 'prometheus')");
        return;
    }
    struct tp_metrics *m = tp_metrics_new();
    tp_metrics_request(m, 200);
    tp_metrics_finished(m, 10, 5, 0.03, 0.004);
    struct tp_metrics_gauges g = {.n_parallel = 8, .healthy = 1, .n_ranks = 1};
    struct tp_buf b = {0};
    CU_ASSERT_EQUAL_FATAL(tp_metrics_render(m, &g, &b), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.txt", tp_test_tmpdir());
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fwrite(b.data, 1, b.len, f);
    fclose(f);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
    CU_ASSERT_EQUAL(system(cmd), 0);
    tp_buf_free(&b);
    tp_metrics_free(m);
}

/* ------------------------------------------------------------ chat templates */

static void test_chat_templates_vs_jinja(void)
{
    const char *path = tp_test_repo_path("tests/server/chat_expected.json");
    char *text = tp_test_read_file(path, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    cJSON *cases = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(cJSON_IsArray(cases));
    int n = 0, n_err = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        const char *fam = cJSON_GetObjectItem(c, "family")->valuestring;
        const cJSON *rj = cJSON_GetObjectItem(c, "render");
        const char *render = cJSON_IsString(rj) ? rj->valuestring : fam;
        /* qwen2 / qwen2.5: the default system message read from the template */
        char dsys[256] = "";
        const char *default_system = NULL;
        enum tp_chat_family f = tp_chat_family_parse(render);
        if (strcmp(fam, "qwen2") == 0 || strcmp(fam, "qwen2.5") == 0) {
            char rel[64];
            snprintf(rel, sizeof rel, "tests/node/templates/%s.jinja", fam);
            char *t = tp_test_read_file(tp_test_repo_path(rel), NULL);
            CU_ASSERT_PTR_NOT_NULL_FATAL(t);
            CU_ASSERT_EQUAL(tp_chat_detect(t), fam[5] ? TP_CHAT_QWEN25 : TP_CHAT_CHATML);
            CU_ASSERT_EQUAL(tp_chat_default_system(t, dsys, sizeof dsys), 1);
            CU_ASSERT_STRING_EQUAL(dsys, fam[5] ? "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                                                : "You are a helpful assistant.");
            free(t);
            if (!fam[5]) f = TP_CHAT_CHATML;
            default_system = dsys;
        }
        CU_ASSERT_NOT_EQUAL(f, TP_CHAT_UNKNOWN);
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages");
        struct tp_chat_msg m[16];
        struct tp_chat_call calls[16];
        memset(m, 0, sizeof m);
        int nm = 0, ncall = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, msgs)
        {
            CU_ASSERT_FATAL(nm < 16);
            m[nm].role = cJSON_GetObjectItem(x, "role")->valuestring;
            m[nm].content = cJSON_GetObjectItem(x, "content")->valuestring;
            const cJSON *rc = cJSON_GetObjectItem(x, "reasoning_content");
            m[nm].reasoning = cJSON_IsString(rc) ? rc->valuestring : NULL;
            const cJSON *id = cJSON_GetObjectItem(x, "tool_call_id");
            m[nm].tool_call_id = cJSON_IsString(id) ? id->valuestring : "";
            const cJSON *tc, *tcs = cJSON_GetObjectItem(x, "tool_calls");
            m[nm].calls = calls + ncall;
            cJSON_ArrayForEach(tc, tcs)
            {
                CU_ASSERT_FATAL(ncall < 16);
                const cJSON *fn = cJSON_GetObjectItem(tc, "function");
                calls[ncall].id = cJSON_GetObjectItem(tc, "id")->valuestring;
                calls[ncall].name = cJSON_GetObjectItem(fn, "name")->valuestring;
                calls[ncall].arguments = cJSON_GetObjectItem(fn, "arguments");
                ncall++;
                m[nm].n_calls++;
            }
            nm++;
        }
        int add_gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        struct tp_buf out = {0};
        struct tp_error terr = {0};
        const cJSON *date = cJSON_GetObjectItem(c, "date");
        struct tp_chat_opts opts = {.add_generation_prompt = add_gen, .bos = cJSON_GetObjectItem(c, "bos")->valuestring,
                                    .eos = cJSON_GetObjectItem(c, "eos")->valuestring, .default_system = default_system,
                                    .tools = cJSON_GetObjectItem(c, "tools"),
                                    .date = cJSON_IsString(date) ? date->valuestring : NULL};
        enum tp_status rc = tp_chat_render_opts(f, m, nm, &opts, &out, &terr);
        const char *err = tp_error_msg(&terr);
        const cJSON *exp = cJSON_GetObjectItem(c, "expected");
        if (exp) {
            const char *got = out.data ? out.data : "";
            if (rc != TP_OK || strcmp(got, exp->valuestring) != 0)
                fprintf(stderr, "%s case %d: got rc %d '%s'\n  want '%s'\n", fam, n, rc, got, exp->valuestring);
            CU_ASSERT_EQUAL(rc, TP_OK);
            CU_ASSERT_STRING_EQUAL(got, exp->valuestring);
        } else {
            const char *want = cJSON_GetObjectItem(c, "error")->valuestring;
            if (rc != TP_ERR_INVALID_ARG || !strstr(want, err)) fprintf(stderr, "%s case %d: rc %d err '%s', want error '%s'\n", fam, n, rc, err, want);
            CU_ASSERT_EQUAL(rc, TP_ERR_INVALID_ARG);
            CU_ASSERT_PTR_NOT_NULL(strstr(want, err));
            n_err++;
        }
        tp_buf_free(&out);
        n++;
    }
    CU_ASSERT(n >= 400);
    CU_ASSERT(n_err > 0);
    cJSON_Delete(cases);
}

/* The families of the real Llama 3 and Qwen3 templates from ../shared. */
static void test_chat_detect_real(void)
{
    const char *files[][2] = {{"models/tokenizers/llama3/tokenizer_config.json", "llama3"},
                              {"models/tokenizers/qwen3/tokenizer_config.json", "qwen3"}};
    for (size_t i = 0; i < TP_ARRAY_LEN(files); i++) {
        const char *p = tp_test_shared_path(files[i][0]);
        if (!p) continue; /* ../shared data absent: recorded as a skip */
        char *t = tp_test_read_file(p, NULL);
        cJSON *cfg = cJSON_Parse(t);
        free(t);
        const cJSON *ct = cJSON_GetObjectItem(cfg, "chat_template");
        CU_ASSERT_FATAL(cJSON_IsString(ct));
        CU_ASSERT_STRING_EQUAL(tp_chat_family_name(tp_chat_detect(ct->valuestring)), files[i][1]);
        cJSON_Delete(cfg);
    }
}

static void test_chat_detect(void)
{
    const char *names[][2] = {{"llama2", "llama2"},     {"mistral", "mistral"},   {"chatml", "chatml"},
                              {"zephyr", "zephyr"},     {"llama3.1", "llama3.1"}, {"llama3.2", "llama3.2"},
                              {"llama3.3", "llama3.1"}, {"qwen2.5", "qwen2.5"},   {"qwen3", "qwen3"},
                              {"mistral-nemo", "mistral-nemo"}, {"qwen2", "chatml"},
                              {"mistral-small-3.2", "mistral-small-3.2"}, {"devstral", "devstral"}};
    for (size_t i = 0; i < TP_ARRAY_LEN(names); i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tests/node/templates/%s.jinja", names[i][0]);
        char *t = tp_test_read_file(tp_test_repo_path(rel), NULL);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        CU_ASSERT_STRING_EQUAL(tp_chat_family_name(tp_chat_detect(t)), names[i][1]);
        free(t);
    }
    /* tools on a family without a tools block: refused, not dropped */
    struct tp_chat_msg um = {.role = "user", .content = "hi", .tool_call_id = ""};
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]");
    struct tp_buf out = {0};
    struct tp_error terr = {0};
    struct tp_chat_opts opts = {.add_generation_prompt = 1, .tools = tools};
    CU_ASSERT_EQUAL(tp_chat_render_opts(TP_CHAT_LLAMA3, &um, 1, &opts, &out, &terr), TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_error_msg(&terr), "no tool format"));
    CU_ASSERT_EQUAL(tp_chat_render_opts(TP_CHAT_QWEN3, &um, 1, &opts, &out, &terr), TP_OK);
    tp_buf_free(&out);
    cJSON_Delete(tools);
    char dsys[128];
    CU_ASSERT_EQUAL(tp_chat_default_system("{{'<|im_start|>' + m + '<|im_end|>'}}", dsys, sizeof dsys), 0);
    CU_ASSERT_EQUAL(tp_chat_default_system("{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
                                           "{{ '<|im_start|>system\\nYou are Qwen.\\nBe nice.<|im_end|>\\n' }}",
                                           dsys, sizeof dsys),
                    1);
    CU_ASSERT_STRING_EQUAL(dsys, "You are Qwen.\nBe nice.");
    CU_ASSERT_EQUAL(tp_chat_detect(NULL), TP_CHAT_CHATML); /* llama-server's fallback */
    CU_ASSERT_EQUAL(tp_chat_detect(""), TP_CHAT_CHATML);
    CU_ASSERT_EQUAL(tp_chat_detect("{{ messages }}"), TP_CHAT_UNKNOWN);
    CU_ASSERT_EQUAL(tp_chat_family_parse("nope"), TP_CHAT_UNKNOWN);
}

/* The call grammars of the name-then-arguments formats: Mistral Small 3.2 /
 * Devstral with tool_choice auto (after [TOOL_CALLS]) and gpt-oss forced
 * calls (after the prompt's "to=functions."): each accepts a listed name
 * followed directly by arguments valid under that tool's schema (and, named,
 * only that tool), and tool_parse reads the call back. */
static void test_name_args_grammar(void)
{
    static const char tools[] =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]+$\"}},\"required\":[\"city\"],"
        "\"additionalProperties\":false}}},{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    char body[1024];
    for (int mode = 0; mode < 3; mode++) { /* auto (mistral-args), required, named (name-args) */
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s%s}", tools,
                 mode == 0   ? ""
                 : mode == 1 ? ",\"tool_choice\":\"required\""
                             : ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"now\"}}");
        struct tp_req_params p;
        struct tp_api_error e;
        CU_ASSERT_EQUAL_FATAL(tp_req_parse(body, strlen(body), 1, 512, 256, &p, &e), TP_OK);
        if (mode == 0) {
            CU_ASSERT_EQUAL_FATAL(tp_req_tools_grammar(&p, TP_TOOL_FORMAT_MISTRAL_ARGS, "mistral-small-3.2", &e), TP_OK);
        } else {
            CU_ASSERT_EQUAL_FATAL(tp_req_forced_name_args(&p, &e), TP_OK);
            CU_ASSERT_EQUAL(p.tool_format, TP_TOOL_FORMAT_NAME_ARGS);
        }
        static const char *const calls[] = {"get_weather{\"city\":\"Paris\"}", "now{}", "get_weather{\"city\":\"paris\"}",
                                            "now {}", "get_weather[ARGS]{\"city\":\"Paris\"}", "{\"name\":\"now\"}"};
        const int want[3][6] = {{1, 1, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0}, {0, 1, 0, 0, 0, 0}};
        for (int k = 0; k < 6; k++) {
            struct tp_gstate st;
            tp_gstate_init(p.grammar, &st);
            const int ok = tp_gstate_feed_bytes(p.grammar, &st, calls[k], strlen(calls[k])) && tp_gstate_done(p.grammar, &st);
            if (ok != want[mode][k]) fprintf(stderr, "mode %d '%s': %d\n", mode, calls[k], ok);
            CU_ASSERT_EQUAL(ok, want[mode][k]);
        }
        char text[128];
        snprintf(text, sizeof text, "%s%s", mode == 0 ? "Let me see.[TOOL_CALLS]" : "", calls[mode == 2]);
        struct tp_tool_scan sc;
        tp_tool_scan(p.tool_format, text, strlen(text), 1, &sc);
        CU_ASSERT_EQUAL(sc.n_calls, 1);
        CU_ASSERT_STRING_EQUAL(sc.calls[0].name, mode == 2 ? "now" : "get_weather");
        CU_ASSERT(sc.calls[0].complete);
        CU_ASSERT_EQUAL(sc.content_end, mode == 0 ? strlen("Let me see.") : 0);
        tp_req_params_free(&p);
    }
}

/* Random mutations of valid bodies (flip, insert, delete, truncate bytes):
 * the validator must accept or refuse each with a 400/500 and a message,
 * never crash or leak (run under ASan in CI).  Fixed seed: reproducible. */
static void test_validate_fuzz(void)
{
    static const char *seeds[] = {
        "{\"prompt\":\"hi\",\"max_tokens\":5,\"stop\":[\"a\",\"b\"],\"temperature\":0.5,\"logprobs\":2}",
        "{\"prompt\":[1,2,3],\"stream\":true,\"stream_options\":{\"include_usage\":true},\"seed\":42}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\\u0000\"}]},{\"role\":\"assistant\","
        "\"content\":null}],\"logprobs\":true,\"top_logprobs\":3,\"max_completion_tokens\":9,\"logit_bias\":{\"3\":-100}}",
    };
    uint64_t x = 0x9E3779B97F4A7C15ull;
    char buf[512];
    int n_ok = 0, n_bad = 0;
    for (int it = 0; it < 30000; it++) {
        const char *sd = seeds[it % 3];
        size_t len = strlen(sd);
        memcpy(buf, sd, len);
        int muts = 1 + (int)((x >> 60) & 3);
        for (int m = 0; m < muts; m++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t pos = (size_t)(x % (len ? len : 1));
            switch ((x >> 32) % 4) {
            case 0: buf[pos] = (char)(x >> 40); break;                       /* replace */
            case 1: if (len < sizeof buf - 1) { memmove(buf + pos + 1, buf + pos, len - pos); buf[pos] = (char)(x >> 48); len++; } break;
            case 2: if (len > 1) { memmove(buf + pos, buf + pos + 1, len - pos - 1); len--; } break;
            default: len = pos; break;                                        /* truncate */
            }
        }
        struct tp_req_params p;
        struct tp_api_error e;
        int chat = (it % 3) == 2;
        enum tp_status rc = tp_req_parse(buf, len, chat, 512, 256, &p, &e);
        if (rc == TP_OK) {
            n_ok++;
            tp_req_params_free(&p);
        } else {
            n_bad++;
            int http = tp_http_error_kind(e.status).http_status;
            CU_ASSERT(e.status == rc && (http == 400 || http == 500));
            CU_ASSERT(e.message[0] != '\0');
        }
    }
    CU_ASSERT(n_ok > 0 && n_bad > 0);
}

/* Text parts: a newline before each part once the text is not empty (llama-server's
 * common_chat_msgs_to_json_oaicompat); other part types refused naming the type. */
static void test_content_parts(void)
{
    static const char *const cases[][2] = {
        {"[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"},{\"type\":\"text\",\"text\":\"c\"}]", "a\nb\nc"},
        {"[{\"type\":\"text\",\"text\":\"\"},{\"type\":\"text\",\"text\":\"b\"}]", "b"},
        {"[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"\"},{\"type\":\"text\",\"text\":\"b\"}]", "a\n\nb"},
        {"[{\"type\":\"text\",\"text\":\"a\\n\"},{\"type\":\"text\",\"text\":\"b\"}]", "a\n\nb"},
        {"[]", ""},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":%s}]}", cases[i][0]);
        struct tp_req_params p;
        struct tp_api_error e;
        CU_ASSERT_EQUAL_FATAL(parse(body, 1, &p, &e), TP_OK);
        CU_ASSERT_STRING_EQUAL(p.msgs[0].content, cases[i][1]);
        tp_req_params_free(&p);
    }
    struct tp_req_params p;
    struct tp_api_error e;
    CU_ASSERT_EQUAL(parse("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                          "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:,\"}}]}]}", 1, &p, &e),
                    TP_ERR_INVALID_ARG);
    CU_ASSERT_STRING_EQUAL(e.param, "messages[0].content[1]");
    CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "'image_url'"));
    CU_ASSERT_EQUAL(parse("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\"}]}]}", 1, &p, &e),
                    TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.message, "'input_audio'"));
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}", 1, "messages[0].content[0]");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":5}]}]}", 1,
               "messages[0].content[0]");
}

/* tp_req_apply_defaults: a given server default fills a field the request left out and never one it set;
 * n_predict leaves max_tokens "not set by the request" (the context check clamps it). */
static void test_gen_defaults(void)
{
    const struct tp_gen_defaults d = {.set = TP_GEN_TEMPERATURE | TP_GEN_TOP_K | TP_GEN_SEED | TP_GEN_N_PREDICT |
                                             TP_GEN_REPEAT_PENALTY,
                                      .temperature = 0.25f, .top_k = 7, .seed = 42, .n_predict = 9,
                                      .repeat_penalty = 1.5f, .top_p = 0.5f, .min_p = 0.5f};
    struct tp_req_params p;
    struct tp_api_error e;
    CU_ASSERT_EQUAL_FATAL(parse("{\"prompt\":\"x\"}", 0, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.set, 0u);
    tp_req_apply_defaults(&p, &d);
    CU_ASSERT_EQUAL(p.temperature, 0.25f);
    CU_ASSERT_EQUAL(p.top_k, 7);
    CU_ASSERT_EQUAL(p.top_p, 1.0f); /* not in d.set: the engine's */
    CU_ASSERT_EQUAL(p.min_p, 0.0f);
    CU_ASSERT_EQUAL(p.repetition_penalty, 1.5f);
    CU_ASSERT(p.has_seed && p.seed == 42);
    CU_ASSERT_EQUAL(p.max_tokens, 9);
    CU_ASSERT_EQUAL(p.set & TP_GEN_N_PREDICT, 0u);
    tp_req_params_free(&p);
    CU_ASSERT_EQUAL_FATAL(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1.5,"
                                "\"top_k\":3,\"seed\":5,\"max_completion_tokens\":4,\"repetition_penalty\":1.0}",
                                1, &p, &e), TP_OK);
    CU_ASSERT_EQUAL(p.set, TP_GEN_TEMPERATURE | TP_GEN_TOP_K | TP_GEN_SEED | TP_GEN_N_PREDICT | TP_GEN_REPEAT_PENALTY);
    tp_req_apply_defaults(&p, &d);
    CU_ASSERT_EQUAL(p.temperature, 1.5f);
    CU_ASSERT_EQUAL(p.top_k, 3);
    CU_ASSERT(p.has_seed && p.seed == 5);
    CU_ASSERT_EQUAL(p.max_tokens, 4);
    CU_ASSERT_EQUAL(p.repetition_penalty, 1.0f);
    tp_req_params_free(&p);
    /* -1: no limit */
    const struct tp_gen_defaults unl = {.set = TP_GEN_N_PREDICT, .n_predict = -1};
    CU_ASSERT_EQUAL_FATAL(parse("{\"prompt\":\"x\"}", 0, &p, &e), TP_OK);
    tp_req_apply_defaults(&p, &unl);
    CU_ASSERT_EQUAL(p.max_tokens, -1);
    tp_req_params_free(&p);
}

static const struct tp_test_case unit_cases[] = {
    {"name_args_grammar", test_name_args_grammar},
    {"validate_fuzz", test_validate_fuzz},
    {"validate_good", test_validate_good},
    {"validate_bad", test_validate_bad},
    {"content_parts", test_content_parts},
    {"gen_defaults", test_gen_defaults},
    {"stop_strings", test_stop_strings},
    {"nul_strings", test_nul_strings},
    {"seed_range", test_seed_range},
    {"refused_fields", test_refused_fields},
    {"logit_bias_parse", test_logit_bias_parse},
    {"sse_and_errors", test_sse_and_errors},
    {"metrics_text", test_metrics_text},
    {"chat_templates_vs_jinja", test_chat_templates_vs_jinja},
    {"chat_detect", test_chat_detect},
    {NULL, NULL},
};
TP_TEST_SUITE(unit, "unit", 60, unit_cases)
static const struct tp_test_case unit_shared_cases[] = {{"chat_detect_real", test_chat_detect_real}, {NULL, NULL}};
TP_TEST_SUITE(unit_shared, "unit", 60, unit_shared_cases)

static const struct tp_test_case promtool_cases[] = {{"promtool_check_metrics", test_metrics_promtool}, {NULL, NULL}};
TP_TEST_SUITE(promtool, "unit", 60, promtool_cases)

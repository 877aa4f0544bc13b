/*
 * tests/server/test_harmony.c - the harmony format of gpt-oss (server/harmony.c).
 *
 *   render   every request of tests/server/harmony_expected.json (written by
 *            tests/node/render_harmony.mjs: the real gpt-oss template run by
 *            @huggingface/jinja) goes through the request validator and the
 *            renderer; the prompt is byte-identical to the template's output, and
 *            the requests the template refuses are refused.  Plus the refusals
 *            of our own (a second system message, bad reasoning_effort).
 *   parse    scripted token streams split into reasoning / content / tool-call
 *            bodies: analysis then final, a tool call with the recipient in the
 *            channel part or the role part and <|constrain|>, a reply cut in a
 *            body (stream), a reply that ignores the format; the stream deltas
 *            fed token by token (reasoning_content / content pieces that add up
 *            to the bodies, a call announced once with its id and name, then its
 *            arguments) and the final message (content null beside tool_calls).
 *   think    <think> replies (qwen3 family) split into reasoning and content; every
 *            prefix of a reply splits into prefixes of the final parts (streaming).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_impl.h"
#include "tp_test.h"

/* Validate a chat request body and render it: the renderer's status, or -1 when the validator
 * refused it; the prompt in out, the reason in err. */
static int render_body(const char *body, int add_gen, const char *date, struct tp_buf *out, char *err, size_t cap)
{
    struct tp_req_params p;
    struct tp_api_error e;
    if (tp_req_parse(body, strlen(body), 1, 1 << 20, 1 << 20, &p, &e) != TP_OK) {
        snprintf(err, cap, "%s", e.message);
        return -1;
    }
    struct tp_harmony_opts o = {p.reasoning_effort, date, p.tools, add_gen};
    struct tp_error te = {0};
    enum tp_status rc = tp_harmony_render(p.msgs, p.n_msgs, &o, out, &te);
    snprintf(err, cap, "%s", rc == TP_OK ? "" : tp_error_msg(&te));
    tp_req_params_free(&p);
    return (int)rc;
}

static void test_render_oracle(void)
{
    char *json = tp_test_read_file(tp_test_repo_path("tests/server/harmony_expected.json"), NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(json);
    cJSON *cases = cJSON_Parse(json);
    free(json);
    CU_ASSERT_FATAL(cJSON_IsArray(cases) && cJSON_GetArraySize(cases) >= 50);
    int i = 0, n_err = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        char *body = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "request"));
        const char *date = cJSON_GetObjectItem(c, "date")->valuestring;
        int add_gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        const cJSON *want = cJSON_GetObjectItem(c, "expected");
        struct tp_buf out = {0};
        char err[512] = "";
        int rc = render_body(body, add_gen, date, &out, err, sizeof err);
        if (want) {
            int same = rc == TP_OK && out.data && strcmp(out.data, want->valuestring) == 0;
            if (!same)
                fprintf(stderr, "case %d (rc %d %s):\n got  %s\n want %s\n", i, rc, err, out.data ? out.data : "",
                        want->valuestring);
            CU_ASSERT(same);
        } else {
            /* the template raises: refused with its message */
            const char *msg = cJSON_GetObjectItem(c, "error")->valuestring;
            if (rc != TP_ERR_INVALID_ARG || strstr(msg, err) == NULL)
                fprintf(stderr, "case %d: rc %d err '%s', want the template's error '%s'\n", i, rc, err, msg);
            CU_ASSERT_EQUAL(rc, TP_ERR_INVALID_ARG);
            CU_ASSERT_PTR_NOT_NULL(strstr(msg, err));
            n_err++;
        }
        tp_buf_free(&out);
        free(body);
        i++;
    }
    CU_ASSERT(n_err >= 4);
    cJSON_Delete(cases);
}

static void test_render_refusals(void)
{
    struct tp_buf out = {0};
    char err[512];
    /* a system message after the first: the template would drop it */
    CU_ASSERT_EQUAL(render_body("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"b\"}]}",
                                1, "2025-01-01", &out, err, sizeof err),
                    TP_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "messages[1]"));
    tp_buf_free(&out);
    memset(&out, 0, sizeof out);
    CU_ASSERT_EQUAL(render_body("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"reasoning_effort\":\"max\"}", 1,
                                "2025-01-01", &out, err, sizeof err),
                    -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "reasoning_effort"));
    CU_ASSERT_EQUAL(render_body("{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\","
                                "\"function\":{\"name\":\"f\",\"arguments\":\"{not json\"}}]}]}",
                                1, "2025-01-01", &out, err, sizeof err),
                    -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "arguments"));
    CU_ASSERT_EQUAL(render_body("{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"reasoning_content\":\"r\"}]}", 1,
                                "2025-01-01", &out, err, sizeof err),
                    -1);
    /* several calls in one assistant turn: each its own commentary message; results by tool_call_id */
    CU_ASSERT_EQUAL(render_body("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"tool_calls\":["
                                "{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}},"
                                "{\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"[]\"}}]},"
                                "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"ra\"},"
                                "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"rb\"}]}",
                                0, "2025-01-01", &out, err, sizeof err),
                    TP_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(out.data, "<|start|>user<|message|>u<|end|>"
                                            "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{\"x\": 1}<|call|>"
                                            "<|start|>assistant to=functions.g<|channel|>commentary json<|message|>[]<|call|>"
                                            "<|start|>functions.f to=assistant<|channel|>commentary<|message|>\"ra\"<|end|>"
                                            "<|start|>functions.g to=assistant<|channel|>commentary<|message|>\"rb\"<|end|>"));
    tp_buf_free(&out);
}

/* ------------------------------------------------------------------ parse */

enum { T_START = 1000, T_END, T_MESSAGE, T_CHANNEL, T_CONSTRAIN, T_RETURN, T_CALL };
static const struct tp_harmony_ids ids = {T_START, T_END, T_MESSAGE, T_CHANNEL, T_CONSTRAIN, T_RETURN, T_CALL};

/* A scripted reply: items are control token ids or text pieces (one token each). */
struct script {
    struct tp_gen_tok toks[64];
    int n;
    char text[1024];
    size_t len;
};
static void tok(struct script *s, int id)
{
    memset(&s->toks[s->n], 0, sizeof s->toks[0]);
    s->toks[s->n].id = id;
    s->toks[s->n++].text_end = s->len;
}
static void txt(struct script *s, const char *t)
{
    size_t l = strlen(t);
    memcpy(s->text + s->len, t, l);
    s->len += l;
    tok(s, 1);
}

/* Append the pieces to s: "<|start|>", "<|channel|>" ... as their control tokens, anything else as text. */
static void play(struct script *s, const char *const *parts)
{
    static const struct {
        const char *name;
        int id;
    } ctl[] = {{"<|start|>", T_START},     {"<|end|>", T_END},     {"<|message|>", T_MESSAGE},
               {"<|channel|>", T_CHANNEL}, {"<|constrain|>", T_CONSTRAIN}, {"<|return|>", T_RETURN},
               {"<|call|>", T_CALL}};
    for (; *parts; parts++) {
        int id = 0;
        for (size_t i = 0; i < sizeof ctl / sizeof ctl[0]; i++)
            if (strcmp(*parts, ctl[i].name) == 0) id = ctl[i].id;
        if (id)
            tok(s, id);
        else
            txt(s, *parts);
    }
}
#define PLAY(s, ...) play(s, (const char *const[]){__VA_ARGS__, NULL})
static int seg_is(const struct script *s, const struct tp_harmony_seg *g, enum tp_harmony_kind k, const char *body)
{
    return g->kind == k && g->e - g->b == strlen(body) && memcmp(s->text + g->b, body, g->e - g->b) == 0;
}

static void test_parse_channels(void)
{
    struct script s = {0};
    struct tp_harmony_seg g[8];
    /* <|channel|>analysis<|message|>Think...<|end|><|start|>assistant<|channel|>final<|message|>Answer<|return|> */
    PLAY(&s, "<|channel|>", "analysis", "<|message|>", "Think", " hard.", "<|end|>", "<|start|>", "assistant",
         "<|channel|>", "final", "<|message|>", "The answer", " is 4.");
    /* streamed before the end: the final body is open */
    int n = tp_harmony_scan(&ids, s.toks, s.n, s.text, s.len, 0, g, 8);
    CU_ASSERT_EQUAL_FATAL(n, 2);
    CU_ASSERT(seg_is(&s, &g[0], TP_HARMONY_REASONING, "Think hard.") && g[0].closed);
    CU_ASSERT(seg_is(&s, &g[1], TP_HARMONY_CONTENT, "The answer is 4.") && !g[1].closed);
    PLAY(&s, "<|return|>");
    n = tp_harmony_scan(&ids, s.toks, s.n, s.text, s.len, 1, g, 8);
    CU_ASSERT_EQUAL(n, 2);
    CU_ASSERT(g[1].closed);
    /* a prefix: only the analysis header so far -> nothing yet */
    CU_ASSERT_EQUAL(tp_harmony_scan(&ids, s.toks, 2, s.text, s.toks[1].text_end, 0, g, 8), 0);
    /* max_segs bounds the writes, not the count */
    CU_ASSERT_EQUAL(tp_harmony_scan(&ids, s.toks, s.n, s.text, s.len, 1, g, 1), 2);
}

static void test_parse_tool_call(void)
{
    struct tp_harmony_seg g[8];
    /* recipient in the channel part, with <|constrain|> */
    struct script s = {0};
    PLAY(&s, "<|channel|>", "analysis", "<|message|>", "Need weather.", "<|end|>", "<|start|>", "assistant",
         "<|channel|>", "commentary to=functions.get_weather ", "<|constrain|>", "json", "<|message|>",
         "{\"city\":", "\"Paris\"}", "<|call|>");
    int n = tp_harmony_scan(&ids, s.toks, s.n, s.text, s.len, 1, g, 8);
    CU_ASSERT_EQUAL_FATAL(n, 2);
    CU_ASSERT(seg_is(&s, &g[0], TP_HARMONY_REASONING, "Need weather."));
    CU_ASSERT(seg_is(&s, &g[1], TP_HARMONY_CALL, "{\"city\":\"Paris\"}") && g[1].closed);
    CU_ASSERT_EQUAL(g[1].name_e - g[1].name_b, strlen("get_weather"));
    CU_ASSERT(memcmp(s.text + g[1].name_b, "get_weather", 11) == 0);

    /* recipient in the role part (the rendered history's form) */
    struct script t = {0};
    PLAY(&t, " to=functions.lookup", "<|channel|>", "commentary json", "<|message|>", "{}", "<|call|>");
    n = tp_harmony_scan(&ids, t.toks, t.n, t.text, t.len, 1, g, 8);
    CU_ASSERT_EQUAL_FATAL(n, 1);
    CU_ASSERT(seg_is(&t, &g[0], TP_HARMONY_CALL, "{}"));
    CU_ASSERT(g[0].name_e - g[0].name_b == 6 && memcmp(t.text + g[0].name_b, "lookup", 6) == 0);

    /* commentary without a recipient is a preamble for the user: content; a built-in
     * tool recipient (not offered) stays out of the answer */
    struct script u = {0};
    PLAY(&u, "<|channel|>", "commentary", "<|message|>", "Checking...", "<|end|>", "<|start|>",
         "assistant to=browser.search", "<|channel|>", "analysis", "<|message|>", "{\"q\":1}", "<|call|>");
    n = tp_harmony_scan(&ids, u.toks, u.n, u.text, u.len, 1, g, 8);
    CU_ASSERT_EQUAL_FATAL(n, 2);
    CU_ASSERT(seg_is(&u, &g[0], TP_HARMONY_CONTENT, "Checking..."));
    CU_ASSERT(seg_is(&u, &g[1], TP_HARMONY_REASONING, "{\"q\":1}"));
}

static void test_parse_unformatted(void)
{
    struct tp_harmony_seg g[4];
    struct script s = {0};
    PLAY(&s, "plain text", " reply");
    /* while streaming it may still be a header: nothing; once done: content */
    CU_ASSERT_EQUAL(tp_harmony_scan(&ids, s.toks, s.n, s.text, s.len, 0, g, 4), 0);
    CU_ASSERT_EQUAL_FATAL(tp_harmony_scan(&ids, s.toks, s.n, s.text, s.len, 1, g, 4), 1);
    CU_ASSERT(seg_is(&s, &g[0], TP_HARMONY_CONTENT, "plain text reply"));
    /* empty reply */
    CU_ASSERT_EQUAL(tp_harmony_scan(&ids, s.toks, 0, s.text, 0, 1, g, 4), 0);
}

/* Deltas streamed token by token, concatenated per kind. */
struct collected {
    struct tp_buf reasoning, content, args;
    int n_announce, n_deltas;
    char name[64], id[96];
};
static void collect(const struct script *s, struct collected *c)
{
    memset(c, 0, sizeof *c);
    struct tp_harmony_cursor cur = {0};
    for (int k = 1; k <= s->n + 1; k++) {
        int n = k <= s->n ? k : s->n, done = k > s->n;
        size_t len = n > 0 ? s->toks[n - 1].text_end : 0;
        cJSON *d = cJSON_CreateArray();
        CU_ASSERT_EQUAL(tp_harmony_deltas(&ids, s->toks, n, s->text, len, done, "req1", &cur, d), TP_OK);
        const cJSON *x;
        cJSON_ArrayForEach(x, d)
        {
            c->n_deltas++;
            const cJSON *r = cJSON_GetObjectItem(x, "reasoning_content"), *t = cJSON_GetObjectItem(x, "content");
            const cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(x, "tool_calls"), 0);
            CU_ASSERT_EQUAL(cJSON_GetArraySize(x), 1); /* one kind per delta */
            if (r) tp_buf_puts(&c->reasoning, r->valuestring);
            if (t) tp_buf_puts(&c->content, t->valuestring);
            if (tc) {
                CU_ASSERT_EQUAL(cJSON_GetObjectItem(tc, "index")->valueint, 0);
                const cJSON *fn = cJSON_GetObjectItem(tc, "function");
                if (cJSON_GetObjectItem(tc, "id")) {
                    c->n_announce++;
                    snprintf(c->id, sizeof c->id, "%s", cJSON_GetObjectItem(tc, "id")->valuestring);
                    snprintf(c->name, sizeof c->name, "%s", cJSON_GetObjectItem(fn, "name")->valuestring);
                    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(tc, "type")->valuestring, "function");
                }
                tp_buf_puts(&c->args, cJSON_GetObjectItem(fn, "arguments")->valuestring);
            }
        }
        cJSON_Delete(d);
    }
}
static void collected_free(struct collected *c)
{
    tp_buf_free(&c->reasoning);
    tp_buf_free(&c->content);
    tp_buf_free(&c->args);
}

static void test_stream_and_message(void)
{
    struct script s = {0};
    PLAY(&s, "<|channel|>", "analysis", "<|message|>", "The user", " wants \"weather\".", "<|end|>", "<|start|>",
         "assistant", "<|channel|>", "commentary to=functions.get_weather ", "<|constrain|>", "json",
         "<|message|>", "{\"city\"", ": \"Paris\"}", "<|call|>");
    struct collected c;
    collect(&s, &c);
    CU_ASSERT_STRING_EQUAL(c.reasoning.data, "The user wants \"weather\".");
    CU_ASSERT_PTR_NULL(c.content.data);
    CU_ASSERT_EQUAL(c.n_announce, 1);
    CU_ASSERT_STRING_EQUAL(c.name, "get_weather");
    CU_ASSERT_STRING_EQUAL(c.id, "call_req1_0");
    CU_ASSERT_STRING_EQUAL(c.args.data, "{\"city\": \"Paris\"}");
    CU_ASSERT_EQUAL(c.n_deltas, 2 + 1 + 2); /* two reasoning pieces, the announcement, two argument pieces */
    collected_free(&c);

    cJSON *msg = cJSON_CreateObject();
    int n_calls = -1;
    CU_ASSERT_EQUAL(tp_harmony_message(&ids, s.toks, s.n, s.text, s.len, "req1", msg, &n_calls), TP_OK);
    CU_ASSERT_EQUAL(n_calls, 1);
    CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")));
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(msg, "reasoning_content")->valuestring, "The user wants \"weather\".");
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(call, "id")->valuestring, "call_req1_0");
    CU_ASSERT_PTR_NULL(cJSON_GetObjectItem(call, "index"));
    const cJSON *fn = cJSON_GetObjectItem(call, "function");
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(fn, "name")->valuestring, "get_weather");
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"city\": \"Paris\"}");
    cJSON_Delete(msg);

    /* analysis then final: reasoning and content; an unformatted reply: content once done */
    struct script f = {0};
    PLAY(&f, "<|channel|>", "analysis", "<|message|>", "2+2", "<|end|>", "<|start|>", "assistant", "<|channel|>",
         "final", "<|message|>", "It is", " 4.", "<|return|>");
    collect(&f, &c);
    CU_ASSERT_STRING_EQUAL(c.reasoning.data, "2+2");
    CU_ASSERT_STRING_EQUAL(c.content.data, "It is 4.");
    CU_ASSERT_EQUAL(c.n_announce, 0);
    collected_free(&c);
    msg = cJSON_CreateObject();
    CU_ASSERT_EQUAL(tp_harmony_message(&ids, f.toks, f.n, f.text, f.len, "r", msg, &n_calls), TP_OK);
    CU_ASSERT_EQUAL(n_calls, 0);
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(msg, "content")->valuestring, "It is 4.");
    CU_ASSERT_PTR_NULL(cJSON_GetObjectItem(msg, "tool_calls"));
    cJSON_Delete(msg);

    struct script u = {0};
    PLAY(&u, "no", " format");
    collect(&u, &c);
    CU_ASSERT_STRING_EQUAL(c.content.data, "no format");
    CU_ASSERT_PTR_NULL(c.reasoning.data);
    collected_free(&c);
}

/* ------------------------------------------------------------------ think */

static int part_is(const char *t, size_t b, size_t e, const char *want)
{
    return e - b == strlen(want) && memcmp(t + b, want, e - b) == 0;
}

/* Every prefix of text splits into parts that are prefixes of the final parts: a stream
 * sending each part's new bytes adds up to the finished reply. */
static void check_think_stream(const char *text, const char *reasoning, const char *content, int thinking)
{
    size_t len = strlen(text);
    struct tp_think_parts fin, p;
    tp_think_split(text, len, 1, &fin);
    CU_ASSERT_EQUAL(fin.thinking, thinking);
    CU_ASSERT(part_is(text, fin.reasoning_b, fin.reasoning_e, reasoning));
    CU_ASSERT(part_is(text, fin.content_b, fin.content_e, content));
    size_t sent_r = 0, sent_c = 0;
    for (size_t k = 0; k <= len; k++) {
        tp_think_split(text, k, k == len, &p);
        size_t rl = p.reasoning_e - p.reasoning_b, cl = p.content_e - p.content_b;
        CU_ASSERT(rl >= sent_r && cl >= sent_c);
        CU_ASSERT(rl <= strlen(reasoning) && memcmp(text + p.reasoning_b, reasoning, rl) == 0);
        CU_ASSERT(cl <= strlen(content) && memcmp(text + p.content_b, content, cl) == 0);
        sent_r = rl;
        sent_c = cl;
    }
    CU_ASSERT_EQUAL(sent_r, strlen(reasoning));
    CU_ASSERT_EQUAL(sent_c, strlen(content));
}

static void test_think_split(void)
{
    check_think_stream("<think>\nThe user asks 2+2.\n</think>\n\nIt is 4.", "The user asks 2+2.\n", "It is 4.", 1);
    check_think_stream("\n<think>\n\nshort</think>answer</think> kept", "short", "answer</think> kept", 1);
    check_think_stream("<think>\n\n</think>\n\nNo reasoning.", "", "No reasoning.", 1);
    check_think_stream("<think>cut short by max_tokens </thi", "cut short by max_tokens </thi", "", 1);
    check_think_stream("Plain answer with <think> inside.", "", "Plain answer with <think> inside.", 0);
    check_think_stream("<thi", "", "<thi", 0);
    check_think_stream("", "", "", 0);
    /* undecided while streaming: nothing released */
    struct tp_think_parts p;
    tp_think_split("  <thin", 7, 0, &p);
    CU_ASSERT(p.content_e == p.content_b && p.reasoning_e == p.reasoning_b);
}

static const struct tp_test_case think_cases[] = {
    {"split", test_think_split},
    {NULL, NULL},
};
TP_TEST_SUITE(think, "unit", 60, think_cases)

static const struct tp_test_case harmony_cases[] = {
    {"stream_and_message", test_stream_and_message},
    {"render_oracle", test_render_oracle},
    {"render_refusals", test_render_refusals},
    {"parse_channels", test_parse_channels},
    {"parse_tool_call", test_parse_tool_call},
    {"parse_unformatted", test_parse_unformatted},
    {NULL, NULL},
};
TP_TEST_SUITE(harmony, "unit", 60, harmony_cases)

/*
 * server/chat_template.c - chat templates rendered in C, one function per
 * family, each reproducing the family's reference Jinja template as Hugging
 * Face renders it (oracle: tests/node/render_templates.mjs ->
 * tests/server/chat_expected.json).  This file: family names and detection
 * (tp_chat_detect, by markers a template must contain), the shared string
 * helpers, the dispatch and the small families; the families with tools live in
 * chat_llama3.c, chat_qwen.c, chat_mistral.c, harmony in harmony.c.  The
 * families and the template each reproduces: docs/serving.md ("Chat templates").
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "chat_impl.h"

static const char *const family_names[TP_CHAT_FAMILY_COUNT] = {
    "unknown", "llama2", "llama3", "chatml", "qwen3", "mistral", "zephyr", "plain", "llama3.1", "qwen2.5", "mistral-nemo",
    "llama3.2", "harmony", "mistral-small-3.2", "devstral"};

const char *tp_server_chat_template_names(void)
{
    return "llama2, llama3, llama3.1, llama3.2, chatml, qwen2.5, qwen3, mistral, mistral-nemo, mistral-small-3.2, "
           "devstral, zephyr, plain, harmony";
}

enum tp_tool_format tp_chat_tool_format(enum tp_chat_family f)
{
    switch (f) {
    case TP_CHAT_LLAMA31:
    case TP_CHAT_LLAMA32: return TP_TOOL_FORMAT_LLAMA3;
    case TP_CHAT_QWEN3:
    case TP_CHAT_QWEN25: return TP_TOOL_FORMAT_HERMES;
    case TP_CHAT_MISTRAL_NEMO: return TP_TOOL_FORMAT_MISTRAL;
    case TP_CHAT_MISTRAL_SMALL32:
    case TP_CHAT_DEVSTRAL: return TP_TOOL_FORMAT_MISTRAL_ARGS;
    default: return TP_TOOL_FORMAT_NONE;
    }
}

int tp_chat_has_tools(enum tp_chat_family f)
{
    /* harmony's calls are read from the reply's channel tokens (harmony.c), not in a tool_parse.c format */
    return f == TP_CHAT_HARMONY || tp_chat_tool_format(f) != TP_TOOL_FORMAT_NONE;
}

const char *tp_chat_family_name(enum tp_chat_family f)
{
    return (unsigned)f < TP_CHAT_FAMILY_COUNT ? family_names[f] : "unknown";
}

enum tp_chat_family tp_chat_family_parse(const char *name)
{
    for (int i = 1; i < TP_CHAT_FAMILY_COUNT; i++)
        if (strcmp(name, family_names[i]) == 0) return (enum tp_chat_family)i;
    return TP_CHAT_UNKNOWN;
}

enum tp_chat_family tp_chat_detect(const char *t)
{
    if (!t || !t[0]) return TP_CHAT_CHATML; /* no template: ChatML, as llama-server falls back */
    if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>"))
        return !strstr(t, "Environment: ipython") ? TP_CHAT_LLAMA3
               : strstr(t, "strftime_now")        ? TP_CHAT_LLAMA32
                                                  : TP_CHAT_LLAMA31;
    if (strstr(t, "<|channel|>") && strstr(t, "<|message|>")) return TP_CHAT_HARMONY; /* gpt-oss: harmony.c */
    if (strstr(t, "<|im_start|>")) {
        if (strstr(t, "</think>")) return TP_CHAT_QWEN3;
        if (strstr(t, "<tool_call>") && strstr(t, "You are Qwen, created by Alibaba Cloud")) return TP_CHAT_QWEN25;
        return TP_CHAT_CHATML;
    }
    if (strstr(t, "<<SYS>>") && strstr(t, "[INST]")) return TP_CHAT_LLAMA2;
    if (strstr(t, "[SYSTEM_PROMPT]") && strstr(t, "[TOOL_CALLS]") && strstr(t, "[ARGS]"))
        return strstr(t, "[CALL_ID]") ? TP_CHAT_MISTRAL_SMALL32 : TP_CHAT_DEVSTRAL;
    if (strstr(t, "[AVAILABLE_TOOLS]") && strstr(t, "[TOOL_CALLS]") && !strstr(t, "[SYSTEM_PROMPT]"))
        return TP_CHAT_MISTRAL_NEMO;
    if (strstr(t, "[INST]")) return TP_CHAT_MISTRAL;
    if (strstr(t, "<|user|>") && strstr(t, "<|assistant|>")) return TP_CHAT_ZEPHYR;
    return TP_CHAT_UNKNOWN;
}

/* ---------------------------------------------------------- string ops */

/* Length of the Unicode whitespace character at s (JS String.prototype.trim's
 * set, which @huggingface/jinja uses for trim / strip()), or 0. */
static size_t ws_at(const unsigned char *s, size_t n)
{
    if (n >= 1 && (s[0] == ' ' || (s[0] >= 0x09 && s[0] <= 0x0D))) return 1;
    if (n >= 2 && s[0] == 0xC2 && s[1] == 0xA0) return 2;
    if (n >= 3) {
        uint32_t cp = 0;
        if ((s[0] & 0xF0) == 0xE0) cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
            cp == 0x205F || cp == 0x3000 || cp == 0xFEFF)
            return 3;
    }
    return 0;
}

/* Whitespace-trim [*b, *e). */
static void trim_ws(const char **b, const char **e)
{
    size_t k;
    while (*b < *e && (k = ws_at((const unsigned char *)*b, (size_t)(*e - *b))) > 0) *b += k;
    for (;;) {
        const char *p = *e;
        int found = 0;
        for (size_t back = 1; back <= 3 && p - back >= *b; back++) {
            k = ws_at((const unsigned char *)(p - back), back);
            if (k == back) {
                *e = p - back;
                found = 1;
                break;
            }
        }
        if (!found) break;
    }
}

enum tp_status tp_chat_put(struct tp_buf *o, const char *s) { return tp_buf_puts(o, s); }
enum tp_status tp_chat_putn(struct tp_buf *o, const char *b, const char *e)
{
    return tp_buf_append(o, b, (size_t)(e - b));
}
enum tp_status tp_chat_put_trim(struct tp_buf *o, const char *s)
{
    const char *b = s, *e = s + strlen(s);
    trim_ws(&b, &e);
    return tp_chat_putn(o, b, e);
}

#define put tp_chat_put
#define put_trim tp_chat_put_trim
#define P TP_CHAT_P

enum tp_status tp_chat_raise(struct tp_error *err, const char *msg)
{
    return tp_error_set(err, TP_ERR_INVALID_ARG, "%s", msg);
}

/* ---------------------------------------------------------- families */

static enum tp_status render_llama2(const struct tp_chat_msg *m, int n, const char *bos, const char *eos,
                                   struct tp_buf *o, struct tp_error *err)
{
    const char *sys = NULL;
    if (n > 0 && strcmp(m[0].role, "system") == 0) {
        sys = m[0].content;
        m++;
        n--;
    }
    for (int i = 0; i < n; i++) {
        int is_user = strcmp(m[i].role, "user") == 0;
        if (is_user != (i % 2 == 0))
            return tp_chat_raise(err, "Conversation roles must alternate user/assistant/user/assistant/...");
        struct tp_buf c = {0};
        if (i == 0 && sys) {
            if (put(&c, "<<SYS>>\n") || put(&c, sys) || put(&c, "\n<</SYS>>\n\n")) goto nomem;
        }
        if (put(&c, m[i].content)) goto nomem;
        if (is_user) {
            if (put(o, bos) || put(o, "[INST] ") || put_trim(o, c.data) || put(o, " [/INST]")) goto nomem;
        } else if (strcmp(m[i].role, "assistant") == 0) {
            if (put(o, " ") || put_trim(o, c.data) || put(o, " ") || put(o, eos)) goto nomem;
        }
        tp_buf_free(&c);
        continue;
    nomem:
        tp_buf_free(&c);
        return -2;
    }
    return 0;
}

int tp_chat_default_system(const char *t, char *out, size_t cap)
{
    static const char open[] = "<|im_start|>system\\n"; /* as written inside a Jinja string literal */
    for (const char *p = t ? strstr(t, open) : NULL; p; p = strstr(p + 1, open)) {
        const char *b = p + strlen(open), *e = strstr(b, "<|im_end|>");
        if (!e || e == b) continue;
        size_t k = 0;
        int literal = 1;
        for (const char *q = b; q < e && literal; q++) {
            if (*q == '\'' || *q == '"' || *q == '{' || *q == '}' || *q == '+') literal = 0;
            else if (k + 1 >= cap) literal = 0;
            else if (q[0] == '\\' && q + 1 < e && q[1] == 'n') out[k++] = '\n', q++;
            else out[k++] = *q;
        }
        if (literal) {
            out[k] = '\0';
            return 1;
        }
    }
    return 0;
}

static enum tp_status render_zephyr(const struct tp_chat_msg *m, int n, int add_gen, const char *eos, struct tp_buf *o)
{
    for (int i = 0; i < n; i++) {
        P(put(o, "<|"));
        P(put(o, m[i].role));
        P(put(o, "|>\n"));
        P(put(o, m[i].content));
        P(put(o, eos));
        P(put(o, "\n"));
        if (i == n - 1 && add_gen) P(put(o, "<|assistant|>\n"));
    }
    return 0;
}

static enum tp_status render_plain(const struct tp_chat_msg *m, int n, int add_gen, struct tp_buf *o)
{
    for (int i = 0; i < n; i++) {
        P(put(o, m[i].role));
        P(put(o, ": "));
        P(put(o, m[i].content));
        P(put(o, "\n"));
    }
    if (add_gen) P(put(o, "assistant:"));
    return 0;
}

enum tp_status tp_chat_render(enum tp_chat_family f, const struct tp_chat_msg *msgs, int n_msgs, int add_gen,
                              const char *bos, const char *eos, const char *default_system, struct tp_buf *out,
                              struct tp_error *err)
{
    struct tp_chat_opts o = {.add_generation_prompt = add_gen, .bos = bos, .eos = eos, .default_system = default_system};
    return tp_chat_render_opts(f, msgs, n_msgs, &o, out, err);
}

enum tp_status tp_chat_render_opts(enum tp_chat_family f, const struct tp_chat_msg *msgs, int n_msgs,
                                   const struct tp_chat_opts *o, struct tp_buf *out, struct tp_error *err)
{
    const char *bos = o->bos ? o->bos : "", *eos = o->eos ? o->eos : "";
    const int add_gen = o->add_generation_prompt;
    const cJSON *tools = o->tools;
    struct tp_chat_ctx c = {.m = msgs, .n = n_msgs, .add_gen = add_gen, .bos = bos, .eos = eos,
                            .default_system = o->default_system, .tools = tools, .err = err};
    if (o->date) {
        snprintf(c.date, sizeof c.date, "%s", o->date);
    } else {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(c.date, sizeof c.date, f == TP_CHAT_MISTRAL_SMALL32 ? "%Y-%m-%d" : "%d %b %Y", &tm);
    }
    if (!tp_chat_has_tools(f)) {
        /* these templates have no place for tools: refuse rather than drop them silently */
        const char *what = NULL;
        if (tools && cJSON_GetArraySize(tools) > 0) what = "tools";
        for (int i = 0; i < n_msgs && !what; i++)
            if (msgs[i].n_calls > 0) what = "tool calls in the history";
            else if (strcmp(msgs[i].role, "tool") == 0) what = "tool messages";
        if (what)
            return tp_error_set(err, TP_ERR_INVALID_ARG, "the %s chat template has no tool format, so %s cannot be "
                                "rendered", tp_chat_family_name(f), what);
    }
    switch (f) {
    case TP_CHAT_LLAMA3: return tp_chat_render_llama3(&c, out);
    case TP_CHAT_LLAMA31:
    case TP_CHAT_LLAMA32: return tp_chat_render_llama31(&c, f == TP_CHAT_LLAMA32 ? c.date : NULL, out);
    case TP_CHAT_LLAMA2: return render_llama2(msgs, n_msgs, c.bos, c.eos, out, err);
    case TP_CHAT_MISTRAL: return tp_chat_render_mistral(&c, out);
    case TP_CHAT_MISTRAL_NEMO: return tp_chat_render_mistral_nemo(&c, out);
    case TP_CHAT_MISTRAL_SMALL32: return tp_chat_render_mistral_small32(&c, out);
    case TP_CHAT_DEVSTRAL: return tp_chat_render_devstral(&c, out);
    case TP_CHAT_CHATML: return tp_chat_render_chatml(&c, out);
    case TP_CHAT_QWEN3: return tp_chat_render_qwen3(&c, out);
    case TP_CHAT_QWEN25: return tp_chat_render_qwen25(&c, out);
    case TP_CHAT_ZEPHYR: return render_zephyr(msgs, n_msgs, add_gen, c.eos, out);
    case TP_CHAT_PLAIN: return render_plain(msgs, n_msgs, add_gen, out);
    case TP_CHAT_HARMONY: {
        struct tp_harmony_opts ho = {o->reasoning_effort, NULL, tools, add_gen};
        return tp_harmony_render(msgs, n_msgs, &ho, out, err);
    }
    default: return tp_chat_raise(err, "unknown chat template family");
    }
}

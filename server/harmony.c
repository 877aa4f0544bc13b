/*
 * server/harmony.c - the harmony chat format of gpt-oss: the prompt rendered
 * byte for byte as openai-gpt-oss-120b.jinja renders it under @huggingface/jinja
 * (oracle: tests/node/render_harmony.mjs), refusing what the template would
 * silently drop; and the reply's token ids split into channels (analysis:
 * reasoning, final: content, to=functions.NAME: a tool call).  What is rendered
 * and how each channel maps onto the response: docs/harmony.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "server_impl.h"

/* Append, or return TP_ERR_NOMEM. */
#define P(x)                                   \
    do {                                       \
        if ((x) != TP_OK) return TP_ERR_NOMEM; \
    } while (0)

/* ------------------------------------------------ JavaScript JSON.stringify */

/* Number -> string as JavaScript's Number.prototype.toString: the shortest
 * digits that round-trip, in fixed notation for exponents -7 < e < 21. */
static enum tp_status js_number(double v, struct tp_buf *o)
{
    if (isnan(v) || isinf(v)) return tp_buf_puts(o, "null"); /* JSON.stringify */
    if (v == 0) return tp_buf_puts(o, "0");
    char digits[40], tmp[48];
    int exp10 = 0;
    if (v < 0) {
        P(tp_buf_puts(o, "-"));
        v = -v;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v || prec == 17) break;
    }
    /* tmp: d[.ddd]e[+-]xx */
    size_t k = 0;
    const char *q = tmp;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[k++] = *q;
    digits[k] = 0;
    exp10 = atoi(q + 1);
    while (k > 1 && digits[k - 1] == '0') digits[--k] = 0;
    int n = exp10 + 1; /* decimal point after n digits */
    if ((int)k <= n && n <= 21) {
        P(tp_buf_puts(o, digits));
        for (int i = (int)k; i < n; i++) P(tp_buf_puts(o, "0"));
    } else if (0 < n && n <= 21) {
        P(tp_buf_append(o, digits, (size_t)n));
        P(tp_buf_puts(o, "."));
        P(tp_buf_puts(o, digits + n));
    } else if (-6 < n && n <= 0) {
        P(tp_buf_puts(o, "0."));
        for (int i = 0; i < -n; i++) P(tp_buf_puts(o, "0"));
        P(tp_buf_puts(o, digits));
    } else {
        P(tp_buf_append(o, digits, 1));
        if (k > 1) {
            P(tp_buf_puts(o, "."));
            P(tp_buf_puts(o, digits + 1));
        }
        P(tp_buf_printf(o, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1)));
    }
    return TP_OK;
}

/* A string (tree form: C0 80 is NUL) as JSON.stringify writes it. */
static enum tp_status js_string(const char *s, struct tp_buf *o)
{
    P(tp_buf_puts(o, "\""));
    const unsigned char *p = (const unsigned char *)s;
    const unsigned char *run = p;
    for (;; p++) {
        const char *esc = NULL;
        char u[8];
        unsigned c = *p;
        if (c == 0) break;
        if (c == 0xC0 && p[1] == 0x80) {
            esc = "\\u0000";
        } else if (c == '"') {
            esc = "\\\"";
        } else if (c == '\\') {
            esc = "\\\\";
        } else if (c < 0x20) {
            switch (c) {
            case '\b': esc = "\\b"; break;
            case '\f': esc = "\\f"; break;
            case '\n': esc = "\\n"; break;
            case '\r': esc = "\\r"; break;
            case '\t': esc = "\\t"; break;
            default:
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (!esc) continue;
        P(tp_buf_append(o, (const char *)run, (size_t)(p - run)));
        P(tp_buf_puts(o, esc));
        if (c == 0xC0) p++;
        run = p + 1;
    }
    P(tp_buf_append(o, (const char *)run, (size_t)(p - run)));
    return tp_buf_puts(o, "\"");
}

/* Jinja's tojson as @huggingface/jinja writes it (", " and ": " separators). */
static enum tp_status js_json(const cJSON *v, struct tp_buf *o)
{
    if (!v || cJSON_IsNull(v)) return tp_buf_puts(o, "null");
    if (cJSON_IsTrue(v)) return tp_buf_puts(o, "true");
    if (cJSON_IsFalse(v)) return tp_buf_puts(o, "false");
    if (cJSON_IsNumber(v)) return js_number(v->valuedouble, o);
    if (cJSON_IsString(v)) return js_string(v->valuestring, o);
    int obj = cJSON_IsObject(v);
    P(tp_buf_puts(o, obj ? "{" : "["));
    for (const cJSON *c = v->child; c; c = c->next) {
        if (c != v->child) P(tp_buf_puts(o, ", "));
        if (obj) {
            P(js_string(c->string ? c->string : "", o));
            P(tp_buf_puts(o, ": "));
        }
        P(js_json(c, o));
    }
    return tp_buf_puts(o, obj ? "}" : "]");
}

/* String concatenation ("..." + value) as @huggingface/jinja does it. */
static enum tp_status js_concat(const cJSON *v, struct tp_buf *o)
{
    if (cJSON_IsString(v)) return tp_buf_puts(o, v->valuestring);
    return js_json(v, o);
}

/* ------------------------------------------------- the template's helpers */

static const cJSON *get(const cJSON *o, const char *k)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

/* Jinja truthiness of a value (absent and null are false). */
static int truthy(const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsString(v)) return v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return 1;
}

static int str_is(const cJSON *v, const char *s) { return cJSON_IsString(v) && strcmp(v->valuestring, s) == 0; }

/* name in (required or []): a list holds it, or a string contains it. */
static int is_required(const cJSON *required, const char *name)
{
    if (cJSON_IsString(required)) return strstr(required->valuestring, name) != NULL;
    if (!cJSON_IsArray(required)) return 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, required) if (str_is(r, name)) return 1;
    return 0;
}

/* Length of UTF-8 text in UTF-16 code units (JavaScript's string length, the template's |length). */
static size_t js_length(const char *s)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p & 0xC0) != 0x80) n++;
        if (*p >= 0xF0) n++; /* a surrogate pair */
    }
    return n;
}

/* The template's indentation where an expression tag starts a line. */
#define IND_PROP "\n                "   /* object property types */
#define IND_DEFAULT "                    " /* oneOf variant defaults */

/* render_typescript_type(spec) */
static enum tp_status ts_type(const cJSON *spec, struct tp_buf *o, int depth)
{
    if (depth > 32) return tp_buf_puts(o, "any");
    const cJSON *type = get(spec, "type");
    if (str_is(type, "array")) {
        const cJSON *items = get(spec, "items");
        if (truthy(items)) {
            const cJSON *it = get(items, "type");
            if (str_is(it, "string")) P(tp_buf_puts(o, "string[]"));
            else if (str_is(it, "number") || str_is(it, "integer")) P(tp_buf_puts(o, "number[]"));
            else if (str_is(it, "boolean")) P(tp_buf_puts(o, "boolean[]"));
            else {
                struct tp_buf in = {0};
                if (ts_type(items, &in, depth + 1) != TP_OK) {
                    tp_buf_free(&in);
                    return TP_ERR_NOMEM;
                }
                const char *s = in.data ? in.data : "";
                int any = strcmp(s, "object | object") == 0 || js_length(s) > 50;
                enum tp_status rc = any ? tp_buf_puts(o, "any[]") : tp_buf_puts(o, s);
                if (rc == TP_OK && !any) rc = tp_buf_puts(o, "[]");
                tp_buf_free(&in);
                P(rc);
            }
        } else {
            P(tp_buf_puts(o, "any[]"));
        }
        if (truthy(get(spec, "nullable"))) P(tp_buf_puts(o, " | null"));
        return TP_OK;
    }
    if (cJSON_IsArray(type) && type->child) {
        for (const cJSON *t = type->child; t; t = t->next) {
            if (t != type->child) P(tp_buf_puts(o, " | "));
            P(js_concat(t, o));
        }
        return TP_OK;
    }
    const cJSON *one_of = get(spec, "oneOf");
    if (truthy(one_of)) {
        /* the template's has_object_variants is set inside the loop's scope only: never seen */
        for (const cJSON *v = one_of->child; v; v = v->next) {
            P(ts_type(v, o, depth + 1));
            const cJSON *d = get(v, "description");
            if (truthy(d)) {
                P(tp_buf_puts(o, "// "));
                P(js_concat(d, o));
            }
            const cJSON *def = get(v, "default");
            if (def) {
                P(tp_buf_puts(o, IND_DEFAULT "// default: "));
                P(js_json(def, o));
            }
            if (v->next) P(tp_buf_puts(o, " | \n"));
        }
        return TP_OK;
    }
    if (str_is(type, "string")) {
        const cJSON *en = get(spec, "enum");
        if (truthy(en)) {
            P(tp_buf_puts(o, "\""));
            for (const cJSON *e = cJSON_IsArray(en) ? en->child : NULL; e; e = e->next) {
                if (e != en->child) P(tp_buf_puts(o, "\" | \""));
                P(js_concat(e, o));
            }
            return tp_buf_puts(o, "\"");
        }
        P(tp_buf_puts(o, "string"));
        if (truthy(get(spec, "nullable"))) P(tp_buf_puts(o, " | null"));
        return TP_OK;
    }
    if (str_is(type, "number") || str_is(type, "integer")) return tp_buf_puts(o, "number");
    if (str_is(type, "boolean")) return tp_buf_puts(o, "boolean");
    if (str_is(type, "object")) {
        const cJSON *props = get(spec, "properties");
        if (!truthy(props) || !cJSON_IsObject(props)) return tp_buf_puts(o, "object");
        const cJSON *req = get(spec, "required");
        P(tp_buf_puts(o, "{\n"));
        for (const cJSON *pr = props->child; pr; pr = pr->next) {
            P(tp_buf_puts(o, pr->string));
            if (!is_required(req, pr->string)) P(tp_buf_puts(o, "?"));
            P(tp_buf_puts(o, ": " IND_PROP));
            P(ts_type(pr, o, depth + 1));
            if (pr->next) P(tp_buf_puts(o, ", "));
        }
        return tp_buf_puts(o, "}");
    }
    return tp_buf_puts(o, "any");
}

/* render_tool_namespace("functions", tools) */
static enum tp_status tool_namespace(const cJSON *tools, struct tp_buf *o)
{
    P(tp_buf_puts(o, "## functions\n\nnamespace functions {\n\n"));
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *fn = get(t, "function");
        const cJSON *desc = get(fn, "description");
        P(tp_buf_puts(o, "// "));
        if (desc) P(js_concat(desc, o)); /* absent: rendered as an empty description */
        P(tp_buf_puts(o, "\ntype "));
        P(js_concat(get(fn, "name"), o));
        P(tp_buf_puts(o, " = "));
        const cJSON *params = get(fn, "parameters");
        const cJSON *props = get(params, "properties");
        if (truthy(params) && truthy(props) && cJSON_IsObject(props)) {
            const cJSON *req = get(params, "required");
            P(tp_buf_puts(o, "(_: {\n"));
            for (const cJSON *pr = props->child; pr; pr = pr->next) {
                const cJSON *d = get(pr, "description");
                if (truthy(d)) {
                    P(tp_buf_puts(o, "// "));
                    P(js_concat(d, o));
                    P(tp_buf_puts(o, "\n"));
                }
                P(tp_buf_puts(o, pr->string));
                if (!is_required(req, pr->string)) P(tp_buf_puts(o, "?"));
                P(tp_buf_puts(o, ": "));
                P(ts_type(pr, o, 0));
                const cJSON *def = get(pr, "default");
                if (def) {
                    if (truthy(get(pr, "enum"))) {
                        P(tp_buf_puts(o, ", // default: "));
                        P(js_concat(def, o));
                    } else if (truthy(get(pr, "oneOf"))) {
                        P(tp_buf_puts(o, "// default: "));
                        P(js_concat(def, o));
                    } else {
                        P(tp_buf_puts(o, ", // default: "));
                        P(js_json(def, o));
                    }
                }
                P(tp_buf_puts(o, ",\n"));
            }
            P(tp_buf_puts(o, "}) => any;\n\n"));
        } else {
            P(tp_buf_puts(o, "() => any;\n\n"));
        }
    }
    return tp_buf_puts(o, "} // namespace functions");
}

/* ---------------------------------------------------------------- render */

int tp_harmony_effort_valid(const char *e)
{
    return e && (strcmp(e, "low") == 0 || strcmp(e, "medium") == 0 || strcmp(e, "high") == 0);
}

#define CHANNEL_TAGS_ERR                                                                                             \
    "You have passed a message containing <|channel|> tags in the %s field. Instead of doing this, you should pass " \
    "analysis messages (the string between '<|message|>' and '<|end|>') in the 'thinking' field, and final messages " \
    "(the string between '<|message|>' and '<|end|>') in the 'content' field."

static int has_channel_tags(const char *s)
{
    return s && (strstr(s, "<|channel|>analysis<|message|>") || strstr(s, "<|channel|>final<|message|>"));
}


static enum tp_status render_call(const struct tp_chat_call *c, struct tp_buf *o)
{
    P(tp_buf_puts(o, "<|start|>assistant to=functions."));
    P(tp_buf_puts(o, c->name));
    P(tp_buf_puts(o, "<|channel|>commentary json<|message|>"));
    P(js_json(c->arguments, o));
    return tp_buf_puts(o, "<|call|>");
}

/* "<|start|>assistant<|channel|>CHANNEL<|message|>TEXT" + end. */
static enum tp_status message(struct tp_buf *o, const char *channel, const char *text, const char *end)
{
    P(tp_buf_puts(o, "<|start|>assistant<|channel|>"));
    P(tp_buf_puts(o, channel));
    P(tp_buf_puts(o, "<|message|>"));
    P(tp_buf_puts(o, text));
    return tp_buf_puts(o, end);
}

/* One assistant message with tool calls (msgs[i].n_calls > 0). */
static enum tp_status render_calls(const struct tp_chat_msg *msgs, int n, int i, struct tp_buf *o, struct tp_error *err)
{
    const struct tp_chat_msg *m = &msgs[i];
    const char *content = m->content ? m->content : "", *thinking = m->reasoning ? m->reasoning : "";
    int future_final = 0;
    for (int j = i + 1; j < n; j++)
        if (strcmp(msgs[j].role, "assistant") == 0 && msgs[j].n_calls == 0) future_final = 1;
    if (content[0] && thinking[0])
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "Cannot pass both content and thinking in an assistant message with tool calls! Put the "
                            "analysis message in one or the other, but not both.");
    const char *analysis = content[0] ? content : thinking;
    if (analysis[0] && !future_final) P(message(o, "analysis", analysis, "<|end|>"));
    for (int k = 0; k < m->n_calls; k++) P(render_call(&m->calls[k], o));
    return TP_OK;
}

enum tp_status tp_harmony_render(const struct tp_chat_msg *msgs, int n, const struct tp_harmony_opts *opt,
                                 struct tp_buf *o, struct tp_error *err)
{
    const char *effort = opt && opt->reasoning_effort ? opt->reasoning_effort : "medium";
    const cJSON *tools = opt ? opt->tools : NULL;
    int add_gen = opt ? opt->add_generation_prompt : 1;
    char today[32];
    const char *date = opt ? opt->date : NULL;
    if (!date) {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(today, sizeof today, "%Y-%m-%d", &tm);
        date = today;
    }
    int with_tools = truthy(tools);

    /* system message */
    P(tp_buf_puts(o, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                     "Knowledge cutoff: 2024-06\nCurrent date: "));
    P(tp_buf_puts(o, date));
    P(tp_buf_puts(o, "\n\nReasoning: "));
    P(tp_buf_puts(o, effort));
    P(tp_buf_puts(o, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message."));
    if (with_tools) P(tp_buf_puts(o, "\nCalls to these tools must go to the commentary channel: 'functions'."));
    P(tp_buf_puts(o, "<|end|>"));

    /* developer message: the first system / developer message and the tools */
    const char *dev = "";
    int first = 0;
    if (n > 0 && strcmp(msgs[0].role, "system") == 0) {
        dev = msgs[0].content ? msgs[0].content : "";
        first = 1;
    }
    for (int i = first; i < n; i++)
        if (strcmp(msgs[i].role, "system") == 0)
            return tp_error_set(err, TP_ERR_INVALID_ARG,
                                "messages[%d]: a system or developer message after the first one is not part of the "
                                "gpt-oss format (its chat template drops it); merge it into the first message",
                                i);
    if (dev[0] || with_tools) {
        P(tp_buf_puts(o, "<|start|>developer<|message|>"));
        if (dev[0]) {
            P(tp_buf_puts(o, "# Instructions\n\n"));
            P(tp_buf_puts(o, dev));
            P(tp_buf_puts(o, "\n\n"));
        }
        if (with_tools) {
            P(tp_buf_puts(o, "# Tools\n\n"));
            P(tool_namespace(tools, o));
        }
        P(tp_buf_puts(o, "<|end|>"));
    }

    /* the conversation */
    const struct tp_chat_msg *last_calls = NULL; /* the latest assistant tool-call message */
    const char *last_call = NULL;                 /* name of its last call; NULL after a final message */
    enum tp_status rc = TP_OK;
    for (int i = first; i < n && rc == TP_OK; i++) {
        const struct tp_chat_msg *m = &msgs[i];
        const char *content = m->content ? m->content : "";
        if (strcmp(m->role, "assistant") == 0) {
            if (has_channel_tags(content) || has_channel_tags(m->reasoning)) {
                rc = tp_error_set(err, TP_ERR_INVALID_ARG, CHANNEL_TAGS_ERR,
                                  has_channel_tags(content) ? "content" : "thinking");
                break;
            }
            if (m->n_calls > 0) {
                rc = render_calls(msgs, n, i, o, err);
                last_calls = m;
                last_call = m->calls[m->n_calls - 1].name;
            } else if (i == n - 1 && !add_gen) {
                if (m->reasoning) rc = message(o, "analysis", m->reasoning, "<|end|>");
                if (rc == TP_OK) rc = message(o, "final", content, "<|return|>");
            } else {
                rc = message(o, "final", content, "<|end|>");
                last_call = NULL;
            }
        } else if (strcmp(m->role, "tool") == 0) {
            if (!last_call) {
                rc = tp_error_set(err, TP_ERR_INVALID_ARG, "%s",
                                  "Message has tool role, but there was no previous assistant message with a tool "
                                  "call!");
                break;
            }
            const char *name = last_call;
            if (m->tool_call_id && m->tool_call_id[0])
                for (int k = 0; k < last_calls->n_calls; k++)
                    if (strcmp(last_calls->calls[k].id, m->tool_call_id) == 0) name = last_calls->calls[k].name;
            if ((rc = tp_buf_puts(o, "<|start|>functions.")) == TP_OK && (rc = tp_buf_puts(o, name)) == TP_OK &&
                (rc = tp_buf_puts(o, " to=assistant<|channel|>commentary<|message|>")) == TP_OK &&
                (rc = js_string(content, o)) == TP_OK)
                rc = tp_buf_puts(o, "<|end|>");
        } else if (strcmp(m->role, "user") == 0) {
            if ((rc = tp_buf_puts(o, "<|start|>user<|message|>")) == TP_OK && (rc = tp_buf_puts(o, content)) == TP_OK)
                rc = tp_buf_puts(o, "<|end|>");
        }
    }
    if (rc != TP_OK) return rc;
    if (add_gen) P(tp_buf_puts(o, "<|start|>assistant"));
    return TP_OK;
}

/* ----------------------------------------------------------------- parse */

int tp_harmony_ids_init(const tp_tokenizer_t *t, struct tp_harmony_ids *h)
{
    h->start = tp_tokenizer_find_special(t, "<|start|>");
    h->end = tp_tokenizer_find_special(t, "<|end|>");
    h->message = tp_tokenizer_find_special(t, "<|message|>");
    h->channel = tp_tokenizer_find_special(t, "<|channel|>");
    h->constrain = tp_tokenizer_find_special(t, "<|constrain|>");
    h->ret = tp_tokenizer_find_special(t, "<|return|>");
    h->call = tp_tokenizer_find_special(t, "<|call|>");
    return h->start >= 0 && h->end >= 0 && h->message >= 0 && h->channel >= 0 && h->ret >= 0 && h->call >= 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The header text[hb, he) of a message (role, "to=RECIPIENT", channel name,
 * content type; control tokens add no text): what its body is. */
static enum tp_harmony_kind header_kind(const char *text, size_t hb, size_t he, size_t channel_at,
                                        size_t constrain_at, struct tp_harmony_seg *seg)
{
    /* recipient: "to=NAME" anywhere in the header, up to a space or a control token */
    for (size_t i = hb; i + 3 <= he; i++) {
        if (memcmp(text + i, "to=", 3) != 0 || (i > hb && !is_space(text[i - 1]))) continue;
        size_t b = i + 3, e = b;
        while (e < he && !is_space(text[e]) && (e == b || (e != channel_at && e != constrain_at))) e++;
        if (e - b > 10 && memcmp(text + b, "functions.", 10) == 0) {
            seg->name_b = b + 10;
            seg->name_e = e;
            return TP_HARMONY_CALL;
        }
        return TP_HARMONY_REASONING; /* a built-in tool (browser, python): not offered, kept out of the answer */
    }
    if (channel_at != (size_t)-1) {
        size_t b = channel_at;
        while (b < he && is_space(text[b])) b++;
        size_t e = b;
        while (e < he && !is_space(text[e])) e++;
        if (e - b == 8 && memcmp(text + b, "analysis", 8) == 0) return TP_HARMONY_REASONING;
    }
    return TP_HARMONY_CONTENT; /* final, commentary without a recipient, or no channel */
}

int tp_harmony_scan(const struct tp_harmony_ids *h, const struct tp_gen_tok *toks, int n, const char *text,
                    size_t text_len, int done, struct tp_harmony_seg *segs, int max_segs)
{
    enum { HEADER, BODY } state = HEADER;
    size_t at = 0, header_b = 0, channel_at = (size_t)-1, constrain_at = (size_t)-1;
    int ns = 0;
    struct tp_harmony_seg cur;
    memset(&cur, 0, sizeof cur);
    for (int k = 0; k < n; k++) {
        int32_t id = toks[k].id;
        size_t end = toks[k].text_end;
        if (end > text_len) end = text_len;
        if (end < at) end = at;
        if (id == h->message && state == HEADER) {
            memset(&cur, 0, sizeof cur);
            cur.kind = header_kind(text, header_b, at, channel_at, constrain_at, &cur);
            cur.b = cur.e = at;
            state = BODY;
        } else if ((id == h->end || id == h->ret || id == h->call) && state == BODY) {
            cur.closed = 1;
            if (ns < max_segs) segs[ns] = cur;
            ns++;
            state = HEADER;
            header_b = at;
            channel_at = constrain_at = (size_t)-1;
        } else if (id == h->start || (id == h->channel && state == BODY)) {
            /* a new header (a body cut short by <|channel|> is closed as it stands) */
            if (state == BODY) {
                cur.closed = 1;
                if (ns < max_segs) segs[ns] = cur;
                ns++;
            }
            state = HEADER;
            header_b = at;
            channel_at = id == h->channel ? at : (size_t)-1;
            constrain_at = (size_t)-1;
        } else if (id == h->channel) {
            channel_at = at;
        } else if (id == h->constrain && state == HEADER) {
            constrain_at = at;
        }
        at = end;
        if (state == BODY) cur.e = at;
    }
    if (state == BODY) {
        if (ns < max_segs) segs[ns] = cur;
        ns++;
    } else if (done && ns == 0 && at > header_b) {
        memset(&cur, 0, sizeof cur);
        cur.kind = TP_HARMONY_CONTENT;
        cur.b = header_b;
        cur.e = at;
        cur.closed = 1;
        if (ns < max_segs) segs[ns] = cur;
        ns++;
    }
    return ns;
}

/* ------------------------------------------------------- OpenAI messages */

/* {index?, id, type, function: {name, arguments}} of the k-th call. */
static cJSON *call_json(const char *text, const struct tp_harmony_seg *g, const char *req_id, int k, int with_index,
                        const char *args, size_t args_len)
{
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    if (with_index) cJSON_AddNumberToObject(c, "index", k);
    char id[96];
    snprintf(id, sizeof id, "call_%s_%d", req_id, k);
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(c, "function");
    tp_json_add_bytes(fn, "name", text + g->name_b, g->name_e - g->name_b);
    tp_json_add_bytes(fn, "arguments", args, args_len);
    return c;
}

static int scan_all(const struct tp_harmony_ids *h, const struct tp_gen_tok *toks, int n, const char *text, size_t len,
                    int done, struct tp_harmony_seg **segs)
{
    int cap = n + 2;
    *segs = malloc((size_t)cap * sizeof **segs);
    if (!*segs) return -1;
    int ns = tp_harmony_scan(h, toks, n, text, len, done, *segs, cap);
    return ns < cap ? ns : cap;
}

enum tp_status tp_harmony_message(const struct tp_harmony_ids *h, const struct tp_gen_tok *toks, int n,
                                  const char *text, size_t len, const char *req_id, struct cJSON *msg, int *n_calls)
{
    struct tp_harmony_seg *g = NULL;
    int ns = scan_all(h, toks, n, text, len, 1, &g);
    *n_calls = 0;
    if (ns < 0) return TP_ERR_NOMEM;
    struct tp_buf content = {0}, reasoning = {0};
    cJSON *calls = cJSON_CreateArray();
    enum tp_status rc = calls ? TP_OK : TP_ERR_NOMEM;
    for (int i = 0; i < ns && rc == TP_OK; i++) {
        const char *b = text + g[i].b;
        size_t l = g[i].e - g[i].b;
        if (g[i].kind == TP_HARMONY_CONTENT) {
            rc = tp_buf_append(&content, b, l);
        } else if (g[i].kind == TP_HARMONY_REASONING) {
            rc = tp_buf_append(&reasoning, b, l);
        } else {
            while (l > 0 && is_space(*b)) b++, l--;
            while (l > 0 && is_space(b[l - 1])) l--;
            cJSON *c = call_json(text, &g[i], req_id, (*n_calls)++, 0, b, l);
            if (!c) rc = TP_ERR_NOMEM;
            else cJSON_AddItemToArray(calls, c);
        }
    }
    if (rc == TP_OK) {
        cJSON_AddStringToObject(msg, "role", "assistant");
        if (content.len == 0 && *n_calls > 0) cJSON_AddNullToObject(msg, "content");
        else tp_json_add_bytes(msg, "content", content.data ? content.data : "", content.len);
        if (reasoning.len > 0) tp_json_add_bytes(msg, "reasoning_content", reasoning.data, reasoning.len);
        if (*n_calls > 0) {
            cJSON_AddItemToObject(msg, "tool_calls", calls);
            calls = NULL;
        }
    }
    cJSON_Delete(calls);
    tp_buf_free(&content);
    tp_buf_free(&reasoning);
    free(g);
    return rc;
}

/* Append {"tool_calls": [c]} (c owned) to deltas. */
static enum tp_status push_call_delta(cJSON *deltas, cJSON *c)
{
    cJSON *d = c ? cJSON_CreateObject() : NULL;
    cJSON *arr = d ? cJSON_AddArrayToObject(d, "tool_calls") : NULL;
    if (!arr) {
        cJSON_Delete(c);
        cJSON_Delete(d);
        return TP_ERR_NOMEM;
    }
    cJSON_AddItemToArray(arr, c);
    cJSON_AddItemToArray(deltas, d);
    return TP_OK;
}

enum tp_status tp_harmony_deltas(const struct tp_harmony_ids *h, const struct tp_gen_tok *toks, int n,
                                 const char *text, size_t len, int done, const char *req_id,
                                 struct tp_harmony_cursor *cur, struct cJSON *deltas)
{
    struct tp_harmony_seg *g = NULL;
    int ns = scan_all(h, toks, n, text, len, done, &g);
    if (ns < 0) return TP_ERR_NOMEM;
    enum tp_status rc = TP_OK;
    while (cur->seg < ns && rc == TP_OK) {
        const struct tp_harmony_seg *x = &g[cur->seg];
        size_t from = x->b + cur->pos, to = x->e;
        if (x->kind == TP_HARMONY_CALL) {
            if (!cur->announced) {
                rc = push_call_delta(deltas, call_json(text, x, req_id, cur->calls, 1, "", 0));
                cur->announced = rc == TP_OK;
            }
            if (rc == TP_OK && to > from) {
                cJSON *c = cJSON_CreateObject();
                cJSON *fn = c ? cJSON_AddObjectToObject(c, "function") : NULL;
                if (fn) {
                    cJSON_AddNumberToObject(c, "index", cur->calls);
                    tp_json_add_bytes(fn, "arguments", text + from, to - from);
                }
                rc = push_call_delta(deltas, fn ? c : (cJSON_Delete(c), NULL));
            }
        } else if (to > from) {
            cJSON *d = cJSON_CreateObject();
            if (!d) {
                rc = TP_ERR_NOMEM;
                break;
            }
            tp_json_add_bytes(d, x->kind == TP_HARMONY_REASONING ? "reasoning_content" : "content", text + from,
                              to - from);
            cJSON_AddItemToArray(deltas, d);
        }
        if (rc != TP_OK) break;
        cur->pos = to - x->b;
        if (!x->closed) break;
        if (x->kind == TP_HARMONY_CALL) cur->calls++;
        cur->seg++;
        cur->pos = 0;
        cur->announced = 0;
    }
    free(g);
    return rc;
}

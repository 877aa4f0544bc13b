/*
 * server/chat_template.c - chat templates rendered in C, one function per
 * family (llama3, qwen3, llama2, mistral, chatml, zephyr, plain), each
 * reproducing its reference Jinja template as Hugging Face renders it
 * (trim_blocks + lstrip_blocks); tests/server/chat_expected.json holds
 * @huggingface/jinja's output for each case.  harmony (gpt-oss) is rendered
 * by harmony.c.  A template is recognised by markers it must contain
 * (tp_chat_detect).  docs/serving.md ("Chat templates").
 */
#include <stdio.h>
#include <string.h>

#include "server_impl.h"

static const char *const family_names[TP_CHAT_FAMILY_COUNT] = {"unknown", "llama2", "llama3", "chatml", "qwen3",
                                                                "mistral", "zephyr", "plain",  "harmony"};

const char *tp_server_chat_template_names(void)
{
    return "llama2, llama3, chatml, qwen3, mistral, zephyr, plain, harmony";
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
    if (!t || !t[0]) return TP_CHAT_PLAIN;
    if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>")) return TP_CHAT_LLAMA3;
    if (strstr(t, "<|channel|>") && strstr(t, "<|message|>")) return TP_CHAT_HARMONY; /* gpt-oss: harmony.c */
    if (strstr(t, "<|im_start|>")) return strstr(t, "</think>") ? TP_CHAT_QWEN3 : TP_CHAT_CHATML;
    if (strstr(t, "<<SYS>>") && strstr(t, "[INST]")) return TP_CHAT_LLAMA2;
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

static enum tp_status put(struct tp_buf *o, const char *s) { return tp_buf_puts(o, s); }
static enum tp_status putn(struct tp_buf *o, const char *b, const char *e)
{
    return tp_buf_append(o, b, (size_t)(e - b));
}
static enum tp_status put_trim(struct tp_buf *o, const char *s)
{
    const char *b = s, *e = s + strlen(s);
    trim_ws(&b, &e);
    return putn(o, b, e);
}

/* Append, or return TP_ERR_NOMEM. */
#define P(x)                                     \
    do {                                         \
        if ((x) != TP_OK) return TP_ERR_NOMEM;   \
    } while (0)

/* What the reference template's raise_exception would say. */
static enum tp_status raise(struct tp_error *err, const char *msg)
{
    return tp_error_set(err, TP_ERR_INVALID_ARG, "%s", msg);
}

/* ---------------------------------------------------------- families */

static enum tp_status render_llama3(const struct tp_chat_msg *m, int n, const char *bos, struct tp_buf *o)
{
    for (int i = 0; i < n; i++) {
        if (i == 0) P(put(o, bos));
        P(put(o, "<|start_header_id|>"));
        P(put(o, m[i].role));
        P(put(o, "<|end_header_id|>\n\n"));
        P(put_trim(o, m[i].content));
        P(put(o, "<|eot_id|>"));
    }
    P(put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    return TP_OK;
}

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
            return raise(err, "Conversation roles must alternate user/assistant/user/assistant/...");
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
        return TP_ERR_NOMEM;
    }
    return TP_OK;
}

static enum tp_status render_mistral(const struct tp_chat_msg *m, int n, const char *bos, const char *eos,
                                    struct tp_buf *o, struct tp_error *err)
{
    P(put(o, bos));
    for (int i = 0; i < n; i++) {
        int is_user = strcmp(m[i].role, "user") == 0;
        if (is_user != (i % 2 == 0))
            return raise(err, "Conversation roles must alternate user/assistant/user/assistant/...");
        if (is_user) {
            P(put(o, "[INST] "));
            P(put(o, m[i].content));
            P(put(o, " [/INST]"));
        } else if (strcmp(m[i].role, "assistant") == 0) {
            P(put(o, m[i].content));
            P(put(o, eos));
        } else {
            return raise(err, "Only user and assistant roles are supported!");
        }
    }
    return TP_OK;
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

static enum tp_status render_chatml(const struct tp_chat_msg *m, int n, int add_gen, const char *default_system,
                                   struct tp_buf *o)
{
    if (default_system && n > 0 && strcmp(m[0].role, "system") != 0) {
        P(put(o, "<|im_start|>system\n"));
        P(put(o, default_system));
        P(put(o, "<|im_end|>\n"));
    }
    for (int i = 0; i < n; i++) {
        P(put(o, "<|im_start|>"));
        P(put(o, m[i].role));
        P(put(o, "\n"));
        P(put(o, m[i].content));
        P(put(o, "<|im_end|>\n"));
    }
    if (add_gen) P(put(o, "<|im_start|>assistant\n"));
    return TP_OK;
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
    return TP_OK;
}

static enum tp_status render_qwen3(const struct tp_chat_msg *m, int n, int add_gen, struct tp_buf *o)
{
    if (n > 0 && strcmp(m[0].role, "system") == 0) {
        P(put(o, "<|im_start|>system\n"));
        P(put(o, m[0].content));
        P(put(o, "<|im_end|>\n"));
    }
    int multi_step_tool = 1, last_query = n - 1;
    for (int idx = n - 1; idx >= 0; idx--) {
        if (multi_step_tool && strcmp(m[idx].role, "user") == 0 &&
            !(tp_str_starts_with(m[idx].content, "<tool_response>") && tp_str_ends_with(m[idx].content, "</tool_response>"))) {
            multi_step_tool = 0;
            last_query = idx;
        }
    }
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (strcmp(role, "user") == 0 || (strcmp(role, "system") == 0 && i != 0)) {
            P(put(o, "<|im_start|>"));
            P(put(o, role));
            P(put(o, "\n"));
            P(put(o, m[i].content));
            P(put(o, "<|im_end|>\n"));
        } else if (strcmp(role, "assistant") == 0) {
            const char *c = m[i].content, *ce = c + strlen(c);
            const char *rb = "", *re = rb; /* reasoning_content */
            const char *close = m[i].reasoning ? NULL : strstr(c, "</think>");
            if (m[i].reasoning) {
                rb = m[i].reasoning;
                re = rb + strlen(rb);
            } else if (close) {
                /* content = c.split('</think>')[-1].lstrip('\n') */
                const char *last = close, *q;
                while ((q = strstr(last + 8, "</think>")) != NULL) last = q;
                const char *cb = last + 8;
                while (cb < ce && *cb == '\n') cb++;
                /* reasoning = c.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                const char *r0b = c, *r0e = close;
                while (r0e > r0b && r0e[-1] == '\n') r0e--;
                const char *open = NULL;
                for (const char *s = r0b; s + 7 <= r0e; s++)
                    if (memcmp(s, "<think>", 7) == 0) open = s;
                if (open) r0b = open + 7;
                while (r0b < r0e && *r0b == '\n') r0b++;
                rb = r0b;
                re = r0e;
                c = cb;
            }
            P(put(o, "<|im_start|>assistant\n"));
            if (i > last_query && (i == n - 1 || re > rb)) {
                /* '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') */
                while (rb < re && *rb == '\n') rb++;
                while (re > rb && re[-1] == '\n') re--;
                P(put(o, "<think>\n"));
                P(putn(o, rb, re));
                P(put(o, "\n</think>\n\n"));
                while (c < ce && *c == '\n') c++;
            }
            P(putn(o, c, ce));
            P(put(o, "<|im_end|>\n"));
        }
    }
    if (add_gen) P(put(o, "<|im_start|>assistant\n"));
    return TP_OK;
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
    return TP_OK;
}

enum tp_status tp_chat_render(enum tp_chat_family f, const struct tp_chat_msg *msgs, int n_msgs, int add_gen,
                              const char *bos, const char *eos, const char *default_system, struct tp_buf *out,
                              struct tp_error *err)
{
    if (!bos) bos = "";
    if (!eos) eos = "";
    switch (f) {
    case TP_CHAT_LLAMA3: return render_llama3(msgs, n_msgs, bos, out);
    case TP_CHAT_LLAMA2: return render_llama2(msgs, n_msgs, bos, eos, out, err);
    case TP_CHAT_MISTRAL: return render_mistral(msgs, n_msgs, bos, eos, out, err);
    case TP_CHAT_CHATML: return render_chatml(msgs, n_msgs, add_gen, default_system, out);
    case TP_CHAT_QWEN3: return render_qwen3(msgs, n_msgs, add_gen, out);
    case TP_CHAT_ZEPHYR: return render_zephyr(msgs, n_msgs, add_gen, eos, out);
    case TP_CHAT_PLAIN: return render_plain(msgs, n_msgs, add_gen, out);
    case TP_CHAT_HARMONY: {
        struct tp_harmony_opts o = {NULL, NULL, NULL, add_gen};
        return tp_harmony_render(msgs, n_msgs, &o, out, err);
    }
    default: return raise(err, "unknown chat template family");
    }
}

/*
 * server/chat_qwen.c - the ChatML chat templates: plain ChatML (and Qwen2's,
 * with its default system message), Qwen2.5 and Qwen3.
 *
 * Qwen2.5 and Qwen3 render tools the Hermes way: a "# Tools" system block
 * listing each tool as one-line JSON inside <tools></tools>, each assistant
 * call as <tool_call>\n{"name": .., "arguments": ..}\n</tool_call>, and the
 * results of consecutive tool messages inside one user turn as
 * <tool_response> blocks.  Qwen2.5 opens with its default system message
 * when the conversation has none ("You are Qwen, created by Alibaba Cloud.
 * You are a helpful assistant."); Qwen3 has none, and shows the reasoning
 * (<think>) of assistant turns after the last user query.
 */
#include <string.h>

#include <cjson/cJSON.h>

#include "chat_impl.h"

#define put tp_chat_put
#define putn tp_chat_putn
#define P TP_CHAT_P

/* The "# Tools" block that ends the system turn (Qwen2.5 and Qwen3 write it alike). */
static enum tp_status put_tools(struct tp_buf *o, const cJSON *tools)
{
    P(put(o, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
             "function signatures within <tools></tools> XML tags:\n<tools>"));
    for (const cJSON *t = tools->child; t; t = t->next) {
        P(put(o, "\n"));
        P(tp_chat_tojson(t, 0, o));
    }
    P(put(o, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
             "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
             "<args-json-object>}\n</tool_call><|im_end|>\n"));
    return TP_OK;
}

static enum tp_status put_call(struct tp_buf *o, const struct tp_chat_call *call)
{
    P(put(o, "<tool_call>\n{\"name\": \""));
    P(put(o, call->name));
    P(put(o, "\", \"arguments\": "));
    P(tp_chat_tojson(call->arguments, 0, o));
    P(put(o, "}\n</tool_call>"));
    return TP_OK;
}

/* Tool message i: consecutive ones share one user turn. */
static enum tp_status put_tool_result(struct tp_buf *o, const struct tp_chat_msg *m, int n, int i)
{
    if (i == 0 || strcmp(m[i - 1].role, "tool") != 0) P(put(o, "<|im_start|>user"));
    P(put(o, "\n<tool_response>\n"));
    P(put(o, m[i].content));
    P(put(o, "\n</tool_response>"));
    if (i == n - 1 || strcmp(m[i + 1].role, "tool") != 0) P(put(o, "<|im_end|>\n"));
    return TP_OK;
}

enum tp_status tp_chat_render_chatml(const struct tp_chat_ctx *cx, struct tp_buf *o)
{
    const struct tp_chat_msg *m = cx->m;
    const int n = cx->n;
    if (cx->default_system && n > 0 && strcmp(m[0].role, "system") != 0) {
        P(put(o, "<|im_start|>system\n"));
        P(put(o, cx->default_system));
        P(put(o, "<|im_end|>\n"));
    }
    for (int i = 0; i < n; i++) {
        P(put(o, "<|im_start|>"));
        P(put(o, m[i].role));
        P(put(o, "\n"));
        P(put(o, m[i].content));
        P(put(o, "<|im_end|>\n"));
    }
    if (cx->add_gen) P(put(o, "<|im_start|>assistant\n"));
    return TP_OK;
}

enum tp_status tp_chat_render_qwen3(const struct tp_chat_ctx *cx, struct tp_buf *o)
{
    const struct tp_chat_msg *m = cx->m;
    const int n = cx->n;
    const cJSON *tools = cx->tools && cJSON_GetArraySize(cx->tools) > 0 ? cx->tools : NULL;
    if (tools) {
        P(put(o, "<|im_start|>system\n"));
        if (n > 0 && strcmp(m[0].role, "system") == 0) {
            P(put(o, m[0].content));
            P(put(o, "\n\n"));
        }
        P(put_tools(o, tools));
    } else if (n > 0 && strcmp(m[0].role, "system") == 0) {
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
            size_t content_len; /* the template's `content` (after the </think> split, before its lstrip) */
            const char *rb = "", *re = rb; /* reasoning_content */
            const char *close = m[i].reasoning ? NULL : strstr(c, "</think>");
            if (m[i].reasoning) { /* reasoning_content is a string: content is kept whole */
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
            content_len = (size_t)(ce - c);
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
            for (int k = 0; k < m[i].n_calls; k++) {
                if ((k == 0 && content_len > 0) || k > 0) P(put(o, "\n"));
                P(put_call(o, &m[i].calls[k]));
            }
            P(put(o, "<|im_end|>\n"));
        } else if (strcmp(role, "tool") == 0) {
            P(put_tool_result(o, m, n, i));
        }
    }
    if (cx->add_gen) P(put(o, "<|im_start|>assistant\n"));
    return TP_OK;
}

enum tp_status tp_chat_render_qwen25(const struct tp_chat_ctx *cx, struct tp_buf *o)
{
    const struct tp_chat_msg *m = cx->m;
    const int n = cx->n;
    const cJSON *tools = cx->tools && cJSON_GetArraySize(cx->tools) > 0 ? cx->tools : NULL;
    const char *dsys = cx->default_system ? cx->default_system : "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    int first_sys = n > 0 && strcmp(m[0].role, "system") == 0;
    P(put(o, "<|im_start|>system\n"));
    P(put(o, first_sys ? m[0].content : dsys));
    if (tools) {
        P(put(o, "\n\n"));
        P(put_tools(o, tools));
    } else {
        P(put(o, "<|im_end|>\n"));
    }
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (strcmp(role, "user") == 0 || (strcmp(role, "system") == 0 && i != 0) ||
            (strcmp(role, "assistant") == 0 && m[i].n_calls == 0)) {
            P(put(o, "<|im_start|>"));
            P(put(o, role));
            P(put(o, "\n"));
            P(put(o, m[i].content));
            P(put(o, "<|im_end|>\n"));
        } else if (strcmp(role, "assistant") == 0) {
            P(put(o, "<|im_start|>assistant"));
            if (m[i].content[0]) {
                P(put(o, "\n"));
                P(put(o, m[i].content));
            }
            for (int k = 0; k < m[i].n_calls; k++) {
                P(put(o, "\n"));
                P(put_call(o, &m[i].calls[k]));
            }
            P(put(o, "<|im_end|>\n"));
        } else if (strcmp(role, "tool") == 0) {
            P(put_tool_result(o, m, n, i));
        }
    }
    if (cx->add_gen) P(put(o, "<|im_start|>assistant\n"));
    return TP_OK;
}

/*
 * server/chat_llama3.c - the Llama 3 chat templates.
 *
 *   llama3    Meta-Llama-3-8B-Instruct: header, trimmed content, <|eot_id|>.
 *   llama3.1  Llama 3.1 / 3.3 Instruct (and 3.2, whose template differs only
 *             in printing today's date; builtin_tools are not used): a system header with
 *             "Environment: ipython" when tools are given, the knowledge and
 *             date lines, the tools as indented JSON in the first user
 *             message, an assistant call as {"name": .., "parameters": ..},
 *             and a tool result as the ipython role with its content printed
 *             by tojson (a string is iterable to the template, so it is
 *             quoted).
 */
#include <string.h>

#include <cjson/cJSON.h>

#include "chat_impl.h"

#define put tp_chat_put
#define put_trim tp_chat_put_trim
#define P TP_CHAT_P

enum tp_status tp_chat_render_llama3(const struct tp_chat_ctx *c, struct tp_buf *o)
{
    for (int i = 0; i < c->n; i++) {
        if (i == 0) P(put(o, c->bos));
        P(put(o, "<|start_header_id|>"));
        P(put(o, c->m[i].role));
        P(put(o, "<|end_header_id|>\n\n"));
        P(put_trim(o, c->m[i].content));
        P(put(o, "<|eot_id|>"));
    }
    P(put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    return TP_OK;
}

/* tojson of a string (the template's `message.content | tojson`). */
static enum tp_status put_json_string(struct tp_buf *o, const char *s)
{
    cJSON *v = cJSON_CreateString(s);
    if (!v) return -1;
    int rc = tp_chat_tojson(v, 0, o);
    cJSON_Delete(v);
    return rc;
}

enum tp_status tp_chat_render_llama31(const struct tp_chat_ctx *c, const char *date, struct tp_buf *o)
{
    const struct tp_chat_msg *m = c->m;
    int n = c->n;
    const cJSON *tools = c->tools && cJSON_GetArraySize(c->tools) > 0 ? c->tools : NULL;
    P(put(o, c->bos));
    const char *sys = "";
    if (n > 0 && strcmp(m[0].role, "system") == 0) {
        sys = m[0].content;
        m++;
        n--;
    }
    P(put(o, "<|start_header_id|>system<|end_header_id|>\n\n"));
    if (tools) P(put(o, "Environment: ipython\n"));
    P(put(o, "Cutting Knowledge Date: December 2023\nToday Date: "));
    P(put(o, date ? date : "26 Jul 2024"));
    P(put(o, "\n\n"));
    P(put_trim(o, sys));
    P(put(o, "<|eot_id|>"));
    if (tools) {
        if (n == 0)
            return tp_chat_raise(c->err,
                                 "Cannot put tools in the first user message when there's no first user message!");
        P(put(o, "<|start_header_id|>user<|end_header_id|>\n\n"
                 "Given the following functions, please respond with a JSON for a function call with its proper "
                 "arguments that best answers the given prompt.\n\n"
                 "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
                 "value}.Do not use variables.\n\n"));
        for (const cJSON *t = tools->child; t; t = t->next) {
            P(tp_chat_tojson(t, 4, o));
            P(put(o, "\n\n"));
        }
        P(put_trim(o, m[0].content));
        P(put(o, "<|eot_id|>"));
        m++;
        n--;
    }
    for (int i = 0; i < n; i++) {
        int is_tool = strcmp(m[i].role, "tool") == 0;
        if (!is_tool && m[i].n_calls == 0) {
            P(put(o, "<|start_header_id|>"));
            P(put(o, m[i].role));
            P(put(o, "<|end_header_id|>\n\n"));
            P(put_trim(o, m[i].content));
            P(put(o, "<|eot_id|>"));
        } else if (m[i].n_calls > 0) {
            if (m[i].n_calls != 1)
                return tp_chat_raise(c->err, "This model only supports single tool-calls at once!");
            P(put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \""));
            P(put(o, m[i].calls[0].name));
            P(put(o, "\", \"parameters\": "));
            P(tp_chat_tojson(m[i].calls[0].arguments, 0, o));
            P(put(o, "}<|eot_id|>"));
        } else {
            P(put(o, "<|start_header_id|>ipython<|end_header_id|>\n\n"));
            P(put_json_string(o, m[i].content));
            P(put(o, "<|eot_id|>"));
        }
    }
    if (c->add_gen) P(put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    return TP_OK;
}

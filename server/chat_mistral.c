/*
 * server/chat_mistral.c - the Mistral chat templates.
 *
 *   mistral       Mistral-7B-Instruct-v0.1: [INST] user [/INST] answer</s>, roles
 *                 must alternate, no system role, no tools.
 *   mistral-nemo  Mistral-Nemo-Instruct-2407: the system message is put in
 *                 front of the last user message; the tools are listed as
 *                 [AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS] before the last user
 *                 message (string fields printed raw, the others by tojson);
 *                 calls as [TOOL_CALLS][{"name": .., "arguments": .., "id": ..}]
 *                 and results as [TOOL_RESULTS]{"content": .., "call_id": ..}
 *                 [/TOOL_RESULTS]; call ids must be 9 characters long.
 */
#include <string.h>

#include <cjson/cJSON.h>

#include "chat_impl.h"

#define put tp_chat_put
#define P TP_CHAT_P

enum tp_status tp_chat_render_mistral(const struct tp_chat_ctx *c, struct tp_buf *o)
{
    const struct tp_chat_msg *m = c->m;
    const int n = c->n;
    const char *bos = c->bos, *eos = c->eos;
    P(put(o, bos));
    for (int i = 0; i < n; i++) {
        int is_user = strcmp(m[i].role, "user") == 0;
        if (is_user != (i % 2 == 0))
            return tp_chat_raise(c->err, "Conversation roles must alternate user/assistant/user/assistant/...");
        if (is_user) {
            P(put(o, "[INST] "));
            P(put(o, m[i].content));
            P(put(o, " [/INST]"));
        } else if (strcmp(m[i].role, "assistant") == 0) {
            P(put(o, m[i].content));
            P(put(o, eos));
        } else {
            return tp_chat_raise(c->err, "Only user and assistant roles are supported!");
        }
    }
    return TP_OK;
}

/* Characters (code points) of UTF-8 s. */
static size_t n_chars(const char *s)
{
    size_t k = 0;
    for (; *s; s++) k += ((unsigned char)*s & 0xC0) != 0x80;
    return k;
}

static enum tp_status put_available_tools(struct tp_buf *o, const cJSON *tools)
{
    P(put(o, "[AVAILABLE_TOOLS]["));
    for (const cJSON *t = tools->child; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        P(put(o, "{\"type\": \"function\", \"function\": {"));
        int first = 1;
        for (const cJSON *kv = fn ? fn->child : NULL; kv; kv = kv->next) {
            if (strcmp(kv->string, "return") == 0) continue;
            if (!first) P(put(o, ", "));
            first = 0;
            P(put(o, "\""));
            P(put(o, kv->string));
            if (cJSON_IsString(kv)) {
                P(put(o, "\": \""));
                P(put(o, kv->valuestring));
                P(put(o, "\""));
            } else {
                P(put(o, "\": "));
                P(tp_chat_tojson(kv, 0, o));
            }
        }
        P(put(o, "}}"));
        P(put(o, t->next ? ", " : "]"));
    }
    P(put(o, "[/AVAILABLE_TOOLS]"));
    return TP_OK;
}

enum tp_status tp_chat_render_mistral_nemo(const struct tp_chat_ctx *c, struct tp_buf *o)
{
    static const char bad_id[] = "Tool call IDs should be alphanumeric strings with length 9!";
    const struct tp_chat_msg *m = c->m;
    int n = c->n;
    const cJSON *tools = c->tools && cJSON_GetArraySize(c->tools) > 0 ? c->tools : NULL;
    const char *sys = NULL;
    if (n > 0 && strcmp(m[0].role, "system") == 0) {
        sys = m[0].content;
        m++;
        n--;
    }
    int last_user = -1, idx = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(m[i].role, "user") == 0) last_user = i;
        if (strcmp(m[i].role, "tool") == 0 || m[i].n_calls > 0) continue;
        if ((strcmp(m[i].role, "user") == 0) != (idx % 2 == 0))
            return tp_chat_raise(c->err, "After the optional system message, conversation roles must "
                                                     "alternate user/assistant/user/assistant/...");
        idx++;
    }
    P(put(o, c->bos));
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (strcmp(role, "user") == 0) {
            if (tools && i == last_user) P(put_available_tools(o, tools));
            P(put(o, "[INST]"));
            if (i == n - 1 && sys) {
                P(put(o, sys));
                P(put(o, "\n\n"));
            }
            P(put(o, m[i].content));
            P(put(o, "[/INST]"));
        } else if (m[i].n_calls > 0) {
            P(put(o, "[TOOL_CALLS]["));
            for (int k = 0; k < m[i].n_calls; k++) {
                const struct tp_chat_call *call = &m[i].calls[k];
                cJSON *name = cJSON_CreateString(call->name);
                if (!name) return TP_ERR_NOMEM;
                int rc = put(o, "{\"name\": ") || tp_chat_tojson(name, 0, o) || put(o, ", \"arguments\": ") ||
                         tp_chat_tojson(call->arguments, 0, o);
                cJSON_Delete(name);
                if (rc) return TP_ERR_NOMEM;
                if (n_chars(call->id) != 9) return tp_chat_raise(c->err, bad_id);
                P(put(o, ", \"id\": \""));
                P(put(o, call->id));
                P(put(o, "\"}"));
                if (k + 1 < m[i].n_calls) {
                    P(put(o, ", "));
                } else {
                    P(put(o, "]"));
                    P(put(o, c->eos));
                }
            }
        } else if (strcmp(role, "assistant") == 0) {
            P(put(o, m[i].content));
            P(put(o, c->eos));
        } else if (strcmp(role, "tool") == 0) {
            P(put(o, "[TOOL_RESULTS]{\"content\": "));
            P(put(o, m[i].content));
            P(put(o, ", "));
            if (n_chars(m[i].tool_call_id) != 9) return tp_chat_raise(c->err, bad_id);
            P(put(o, "\"call_id\": \""));
            P(put(o, m[i].tool_call_id));
            P(put(o, "\"}[/TOOL_RESULTS]"));
        } else {
            return tp_chat_raise(c->err, "Only user and assistant roles are supported, with the exception "
                                                     "of an initial optional system message!");
        }
    }
    return TP_OK;
}

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
 *   mistral-small-3.2  Mistral-Small-3.2-24B-Instruct-2506: a [SYSTEM_PROMPT]
 *                 (the template's long default with today's date when the
 *                 request has none), tools as [AVAILABLE_TOOLS]<tojson>
 *                 before the last user message, calls as
 *                 [TOOL_CALLS]name[CALL_ID]id[ARGS]<arguments tojson>, results
 *                 as [TOOL_RESULTS]id[TOOL_CONTENT]content[/TOOL_RESULTS];
 *                 call ids must be 9 characters long.
 *   devstral      unsloth's Devstral-Small-2507 template: [SYSTEM_PROMPT] (its
 *                 own OpenHands default), tools once after it, calls as
 *                 [TOOL_CALLS]name[ARGS]<arguments>, results as
 *                 [TOOL_RESULTS]content[/TOOL_RESULTS].
 * Neither renders a generation prompt: the reply follows [/INST] or
 * [/TOOL_RESULTS].
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

/* After the optional system message, m[0..n) must alternate user / assistant
 * (tool results and assistant tool-call turns aside), as the Nemo and Small
 * 3.2 templates check; *last_user: the last user message (-1: none).  TP_OK,
 * or the templates' error. */
static enum tp_status alternation(const struct tp_chat_ctx *c, const struct tp_chat_msg *m, int n, int *last_user)
{
    int idx = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(m[i].role, "user") == 0) *last_user = i;
        if (strcmp(m[i].role, "tool") == 0 || m[i].n_calls > 0) continue;
        if ((strcmp(m[i].role, "user") == 0) != (idx % 2 == 0))
            return tp_chat_raise(c->err, "After the optional system message, conversation roles must alternate "
                                         "user/assistant/user/assistant/...");
        idx++;
    }
    return TP_OK;
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
    int last_user = -1;
    if (alternation(c, m, n, &last_user) != TP_OK) return TP_ERR_INVALID_ARG;
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

/* ------------------------------------------- Mistral Small 3.2 and Devstral */

/* Devstral's default system message (two literals: ISO C bounds one at 4095 bytes). */
static const char devstral_system_1[] =
    "You are Devstral, a helpful agentic model trained by Mistral AI and using the OpenHands scaffold. Yo"
    "u can interact with a computer to solve tasks.\n"
    "\n"
    "<ROLE>\n"
    "Your primary role is to assist users by executing commands, modifying code, and solving technical pr"
    "oblems effectively. You should be thorough, methodical, and prioritize quality over speed.\n"
    "* If the user asks a question, like \"why is X happening\", don't try to fix the problem. Just give "
    "an answer to the question.\n"
    "</ROLE>\n"
    "\n"
    "<EFFICIENCY>\n"
    "* Each action you take is somewhat expensive. Wherever possible, combine multiple actions into a sin"
    "gle action, e.g. combine multiple bash commands into one, using sed and grep to edit/view multiple f"
    "iles at once.\n"
    "* When exploring the codebase, use efficient tools like find, grep, and git commands with appropriat"
    "e filters to minimize unnecessary operations.\n"
    "</EFFICIENCY>\n"
    "\n"
    "<FILE_SYSTEM_GUIDELINES>\n"
    "* When a user provides a file path, do NOT assume it's relative to the current working directory. Fi"
    "rst explore the file system to locate the file before working on it.\n"
    "* If asked to edit a file, edit the file directly, rather than creating a new file with a different "
    "filename.\n"
    "* For global search-and-replace operations, consider using `sed` instead of opening file editors mul"
    "tiple times.\n"
    "</FILE_SYSTEM_GUIDELINES>\n"
    "\n"
    "<CODE_QUALITY>\n"
    "* Write clean, efficient code with minimal comments. Avoid redundancy in comments: Do not repeat inf"
    "ormation that can be easily inferred from the code itself.\n"
    "* When implementing solutions, focus on making the minimal changes needed to solve the problem.\n"
    "* Before implementing any changes, first thoroughly understand the codebase through exploration.\n"
    "* If you are adding a lot of code to a function or file, consider splitting the function or file int"
    "o smaller pieces when appropriate.\n"
    "</CODE_QUALITY>\n"
    "\n"
    "<VERSION_CONTROL>\n"
    "* When configuring git credentials, use \"openhands\" as the user.name and \"openhands@all-hands.dev"
    "\" as the user.email by default, unless explicitly instructed otherwise.\n"
    "* Exercise caution with git operations. Do NOT make potentially dangerous changes (e.g., pushing to "
    "main, deleting repositories) unless explicitly asked to do so.\n"
    "* When committing changes, use `git status` to see all modified files, and stage all files necessary"
    " for the commit. Use `git commit -a` whenever possible.\n"
    "* Do NOT commit files that typically shouldn't go into version control (e.g., node_modules/, .env fi"
    "les, build directories, cache files, large binaries) unless explicitly instructed by the user.\n"
    "* If unsure about committing certain files, check for the presence of .gitignore files or ask the us"
    "er for clarification.\n"
    "</VERSION_CONTROL>\n"
    "\n"
    "<PULL_REQUESTS>\n"
    "* When creating pull requests, create only ONE per session/issue unless explicitly instructed otherw"
    "ise.\n"
    "* When working with an existing PR, update it with new commits rather than creating additional PRs f"
    "or the same issue.\n";
static const char devstral_system_2[] =
    "* When updating a PR, preserve the original PR title and purpose, updating description only when nec"
    "essary.\n"
    "</PULL_REQUESTS>\n"
    "\n"
    "<PROBLEM_SOLVING_WORKFLOW>\n"
    "1. EXPLORATION: Thoroughly explore relevant files and understand the context before proposing soluti"
    "ons\n"
    "2. ANALYSIS: Consider multiple approaches and select the most promising one\n"
    "3. TESTING:\n"
    "   * For bug fixes: Create tests to verify issues before implementing fixes\n"
    "   * For new features: Consider test-driven development when appropriate\n"
    "   * If the repository lacks testing infrastructure and implementing tests would require extensive s"
    "etup, consult with the user before investing time in building testing infrastructure\n"
    "   * If the environment is not set up to run tests, consult with the user first before investing tim"
    "e to install all dependencies\n"
    "4. IMPLEMENTATION: Make focused, minimal changes to address the problem\n"
    "5. VERIFICATION: If the environment is set up to run tests, test your implementation thoroughly, inc"
    "luding edge cases. If the environment is not set up to run tests, consult with the user first before"
    " investing time to run tests.\n"
    "</PROBLEM_SOLVING_WORKFLOW>\n"
    "\n"
    "<SECURITY>\n"
    "* Only use GITHUB_TOKEN and other credentials in ways the user has explicitly requested and would ex"
    "pect.\n"
    "* Use APIs to work with GitHub or other platforms, unless the user asks otherwise or your task requi"
    "res browsing.\n"
    "</SECURITY>\n"
    "\n"
    "<ENVIRONMENT_SETUP>\n"
    "* When user asks you to run an application, don't stop if the application is not installed. Instead,"
    " please install the application and run the command again.\n"
    "* If you encounter missing dependencies:\n"
    "  1. First, look around in the repository for existing dependency files (requirements.txt, pyproject"
    ".toml, package.json, Gemfile, etc.)\n"
    "  2. If dependency files exist, use them to install all dependencies at once (e.g., `pip install -r "
    "requirements.txt`, `npm install`, etc.)\n"
    "  3. Only install individual packages directly if no dependency files are found or if only specific "
    "packages are needed\n"
    "* Similarly, if you encounter missing dependencies for essential tools requested by the user, instal"
    "l them when possible.\n"
    "</ENVIRONMENT_SETUP>\n"
    "\n"
    "<TROUBLESHOOTING>\n"
    "* If you've made repeated attempts to solve a problem but tests still fail or the user reports it's "
    "still broken:\n"
    "  1. Step back and reflect on 5-7 different possible sources of the problem\n"
    "  2. Assess the likelihood of each possible cause\n"
    "  3. Methodically address the most likely causes, starting with the highest probability\n"
    "  4. Document your reasoning process\n"
    "* When you run into any major issue while executing a plan from the user, please don't try to direct"
    "ly work around it. Instead, propose a new plan and confirm with the user before proceeding.\n"
    "</TROUBLESHOOTING>";

/* Mistral Small 3.2's default system message, today's date between the two parts. */
static const char small32_system_head[] =
    "You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French startup headqu"
    "artered in Paris.\n"
    "Your knowledge base was last updated on 2023-10-01. The current date is ";
static const char small32_system_tail[] =
    ".\n"
    "\n"
    "When you're not sure about some information or when the user's request requires up-to-date or specif"
    "ic data, you must use the available tools to fetch the information. Do not hesitate to use tools whe"
    "never they can provide a more accurate or complete response. If no relevant tools are available, the"
    "n clearly state that you don't have the information and avoid making up anything.\n"
    "\n"
    "If the user's question is not clear, ambiguous, or does not provide enough context for you to accura"
    "tely answer the question, you do not try to answer it right away and you rather ask the user to clar"
    "ify their request (e.g. \"What are some good restaurants around me?\" => \"Where are you?\" or \"Whe"
    "n is the next flight to Tokyo\" => \"Where do you travel from?\").\n"
    "You are always very attentive to dates, and when asked about information at specific dates, you disc"
    "ard information that is at another date.\n"
    "You follow these instructions in all languages, and always respond to the user in the language they "
    "use or request.\n"
    "Next sections describe the capabilities that you have.\n"
    "\n"
    "# WEB BROWSING INSTRUCTIONS\n"
    "\n"
    "You cannot perform any web search or access internet to open URLs, links etc. If it seems like the u"
    "ser is expecting you to do so, you clarify the situation and ask the user to copy paste the text dir"
    "ectly in the chat.\n"
    "\n"
    "# MULTI-MODAL INSTRUCTIONS\n"
    "\n"
    "You have the ability to read images, but you cannot generate images. You also cannot transcribe audi"
    "o files or videos.\n"
    "You cannot read nor transcribe audio files or videos.\n"
    "\n"
    "# TOOL CALLING INSTRUCTIONS\n"
    "\n"
    "You may have access to tools that you can use to fetch information or perform actions. You must use "
    "these tools in the following situations:\n"
    "\n"
    "1. When the request requires up-to-date information.\n"
    "2. When the request requires specific data that you do not have in your knowledge base.\n"
    "3. When the request involves actions that you cannot perform without tools.\n"
    "\n"
    "Always prioritize using tools to provide the most accurate and helpful response. If tools are not av"
    "ailable, inform the user that you cannot perform the requested action at the moment.";

static enum tp_status put_system_prompt(struct tp_buf *o, const char *a, const char *b, const char *c)
{
    P(put(o, "[SYSTEM_PROMPT]"));
    P(put(o, a));
    if (b) P(put(o, b));
    if (c) P(put(o, c));
    P(put(o, "[/SYSTEM_PROMPT]"));
    return TP_OK;
}

static enum tp_status put_tools_json(struct tp_buf *o, const cJSON *tools)
{
    P(put(o, "[AVAILABLE_TOOLS]"));
    P(tp_chat_tojson(tools, 0, o));
    P(put(o, "[/AVAILABLE_TOOLS]"));
    return TP_OK;
}

enum tp_status tp_chat_render_mistral_small32(const struct tp_chat_ctx *c, struct tp_buf *o)
{
    static const char bad_id[] = "Tool call IDs should be alphanumeric strings with length 9!";
    const struct tp_chat_msg *m = c->m;
    int n = c->n;
    P(put(o, c->bos));
    const char *sys = NULL;
    if (n > 0 && strcmp(m[0].role, "system") == 0) {
        sys = m[0].content;
        m++;
        n--;
    }
    int last_user = -1;
    if (alternation(c, m, n, &last_user) != TP_OK) return TP_ERR_INVALID_ARG;
    if (sys) P(put_system_prompt(o, sys, NULL, NULL));
    else P(put_system_prompt(o, small32_system_head, c->date, small32_system_tail));
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (strcmp(role, "system") == 0) {
            P(put_system_prompt(o, m[i].content, NULL, NULL));
        } else if (strcmp(role, "user") == 0) {
            if (c->tools && i == last_user) P(put_tools_json(o, c->tools));
            P(put(o, "[INST]"));
            P(put(o, m[i].content));
            P(put(o, "[/INST]"));
        } else if (strcmp(role, "assistant") == 0) {
            for (int k = 0; k < m[i].n_calls; k++) {
                const struct tp_chat_call *call = &m[i].calls[k];
                P(put(o, "[TOOL_CALLS]"));
                P(put(o, call->name));
                if (n_chars(call->id) != 9) return tp_chat_raise(c->err, bad_id);
                P(put(o, "[CALL_ID]"));
                P(put(o, call->id));
                P(put(o, "[ARGS]"));
                P(tp_chat_tojson(call->arguments, 0, o));
            }
            if (m[i].n_calls == 0) P(put(o, m[i].content));
            P(put(o, c->eos));
        } else if (strcmp(role, "tool") == 0) {
            if (n_chars(m[i].tool_call_id) != 9) return tp_chat_raise(c->err, bad_id);
            P(put(o, "[TOOL_RESULTS]"));
            P(put(o, m[i].tool_call_id));
            P(put(o, "[TOOL_CONTENT]"));
            P(put(o, m[i].content));
            P(put(o, "[/TOOL_RESULTS]"));
        } else {
            return tp_chat_raise(c->err, "Only system, user, assistant, and tool roles are supported!");
        }
    }
    return TP_OK;
}

enum tp_status tp_chat_render_devstral(const struct tp_chat_ctx *c, struct tp_buf *o)
{
    const struct tp_chat_msg *m = c->m;
    int n = c->n;
    P(put(o, c->bos));
    if (n > 0 && strcmp(m[0].role, "system") == 0) {
        P(put_system_prompt(o, m[0].content, NULL, NULL));
        m++;
        n--;
    } else {
        P(put_system_prompt(o, devstral_system_1, devstral_system_2, NULL));
    }
    if (c->tools && cJSON_GetArraySize(c->tools) > 0) P(put_tools_json(o, c->tools));
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (strcmp(role, "user") == 0) {
            P(put(o, "[INST]"));
            P(put(o, m[i].content));
            P(put(o, "[/INST]"));
        } else if (strcmp(role, "system") == 0) {
            P(put_system_prompt(o, m[i].content, NULL, NULL));
        } else if (strcmp(role, "assistant") == 0) {
            P(put(o, m[i].content));
            for (int k = 0; k < m[i].n_calls; k++) {
                const struct tp_chat_call *call = &m[i].calls[k];
                P(put(o, "[TOOL_CALLS]"));
                P(put(o, call->name));
                P(put(o, "[ARGS]"));
                if (cJSON_IsString(call->arguments)) P(put(o, call->arguments->valuestring));
                else P(tp_chat_tojson(call->arguments, 0, o));
            }
            P(put(o, c->eos));
        } else if (strcmp(role, "tool") == 0) {
            P(put(o, "[TOOL_RESULTS]"));
            P(put(o, m[i].content));
            P(put(o, "[/TOOL_RESULTS]"));
        } else {
            return tp_chat_raise(c->err, "Only user, systemm assistant and tool roles are supported in the custom "
                                         "template made by Unsloth!");
        }
    }
    return TP_OK;
}

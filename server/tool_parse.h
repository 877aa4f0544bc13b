/*
 * server/tool_parse.h - private: tool calls in a model's native output format.
 *
 * A chat family that can call tools writes its calls in one format
 * (tp_chat_tool_format in server_impl.h).  tp_tool_scan reads the reply generated so far and
 * says which part is plain content and which calls have begun, with their
 * names and the raw JSON bytes of their arguments.  It keeps no state: call
 * it again on the longer text after every token (a reply is small; the scan
 * is linear).  The same scan serves the non-streaming answer (final = 1), the
 * streamed deltas (final = 0: name when complete, then argument fragments as
 * they grow) and the scheduler, which switches the tool's grammar on where a
 * call's JSON begins (tp_tool_marker_find).
 *
 * Formats (what the model writes; the parser accepts whitespace between the
 * parts):
 *   JSON     tpserve's forced-call reply, the whole reply is one call:
 *            {"name": "f", "arguments": {...}}
 *   LLAMA3   Llama 3.1 / 3.2 / 3.3 custom tools: the reply starts with the
 *            call, optionally after <|python_tag|>:
 *            {"name": "f", "parameters": {...}}   (calls separated by ';')
 *   HERMES   Qwen2.5 / Qwen3 (Hermes style), after any content:
 *            <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>  (repeated)
 *   MISTRAL  Mistral Nemo, after any content:
 *            [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "..."}, ...]
 *   MISTRAL_ARGS  Mistral Small 3.2, Devstral, after any content:
 *            [TOOL_CALLS]f[ARGS]{...}  (repeated; [ARGS] may be missing where the
 *            detokenizer dropped it as a control token; the function name is
 *            a-z A-Z 0-9 _ - .)
 *   NAME_ARGS  tpserve's forced call for gpt-oss (harmony), generated after the
 *            prompt's "<|channel|>commentary to=functions.": the whole reply is
 *            one call, f{...}
 * The arguments value is returned as the model wrote it (valid JSON when the
 * call completed; the streamed fragments concatenate to exactly these bytes).
 *
 * Thread safety: pure functions over caller-owned memory.
 */
#ifndef TP_SERVER_TOOL_PARSE_H
#define TP_SERVER_TOOL_PARSE_H

#include <stddef.h>

enum tp_tool_format {
    TP_TOOL_FORMAT_NONE = 0, /* the family has no tool-call format */
    TP_TOOL_FORMAT_JSON,
    TP_TOOL_FORMAT_LLAMA3,
    TP_TOOL_FORMAT_HERMES,
    TP_TOOL_FORMAT_MISTRAL,
    TP_TOOL_FORMAT_MISTRAL_ARGS,
    TP_TOOL_FORMAT_NAME_ARGS,
    TP_TOOL_FORMAT_COUNT
};
const char *tp_tool_format_name(enum tp_tool_format f); /* "hermes", ... */

#define TP_TOOL_MAX_CALLS 16 /* calls in one reply; later ones are left in the content */
#define TP_TOOL_NAME_BYTES 65

struct tp_tool_call_view {
    char name[TP_TOOL_NAME_BYTES]; /* decoded name; "" until its closing quote was generated */
    size_t call_off;               /* text[call_off] is the call object's '{' */
    size_t args_off, args_len;     /* text[args_off, args_off + args_len): the arguments value so far (raw) */
    int args_done;                 /* the arguments value is complete */
    int complete;                  /* the call object closed, with a name and arguments */
};

struct tp_tool_scan {
    size_t content_end;  /* text[0, content_end) is content: before the first call marker, without a tail that
                          * could still grow into one (final: the whole text when no call was found) */
    int started;         /* a call marker was seen */
    int n_calls;         /* calls begun (complete or not) */
    struct tp_tool_call_view calls[TP_TOOL_MAX_CALLS];
    int malformed;       /* the text after the marker is not calls in this format; final: every call is
                          * discarded and the whole text is content */
};

/*
 * Scan text[0, len) (the reply so far) in format f.  final: generation has
 * ended (nothing is held back, an unfinished call makes the scan malformed).
 * f == NONE: everything is content.  Never fails.
 */
void tp_tool_scan(enum tp_tool_format f, const char *text, size_t len, int final, struct tp_tool_scan *out);

/*
 * Where the next call begins at or after byte from: returns 1 when a complete
 * marker is in text[from, len) and sets *json_off to the offset of the call's
 * JSON (after the marker and any whitespace; it may equal len when the JSON
 * is still to come).  JSON, NAME_ARGS: always at 0; LLAMA3: only at the start of the
 * reply, a '{' or <|python_tag|>; HERMES / MISTRAL: <tool_call> / [TOOL_CALLS].
 * Else 0.  The scheduler constrains the bytes from *json_off with the tools'
 * grammar.
 */
int tp_tool_marker_find(enum tp_tool_format f, const char *text, size_t len, size_t from, size_t *json_off);

/* The marker text generated as a special token in format f ("<|python_tag|>",
 * "<tool_call>", "[TOOL_CALLS]"), or NULL: the scheduler keeps that token's text
 * in the reply (a detokenizer drops control tokens) so the scan can see it. */
const char *tp_tool_marker_token(enum tp_tool_format f);

#endif /* TP_SERVER_TOOL_PARSE_H */
